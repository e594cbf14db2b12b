"""Every cross-process message (msgspec structs) and the one codec that carries them. Torch-free."""
