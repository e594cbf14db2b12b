"""Worker processes: one per rank, one thread: the heartbeat, the batched executor, the engines."""
