"""Orpheus TTS: a Llama-3.2-3B LM that writes SNAC audio tokens, decoded to 24 kHz speech while it streams.

tokens.py     special ids, voices, prompt format, audio token -> SNAC code mapping
emission.py   which frames each SNAC window firing decodes and emits (pure arithmetic)
codec.py      OrpheusCodec: the SNAC stream-consumer component (stateless engine)
"""
