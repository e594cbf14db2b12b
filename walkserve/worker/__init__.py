"""Worker processes: one per rank; dataflow, compute thread, engines."""
