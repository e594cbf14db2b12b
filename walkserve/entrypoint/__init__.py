"""The in-process Python API: start a model on a placement, submit requests, iterate outputs."""
