"""Audio output encoding: which formats this installation can write, whole files and streams."""
