"""Every cross-process message (msgspec structs, and the zygote pipe's lines) and the one codec. Torch-free."""
