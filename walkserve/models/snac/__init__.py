"""SNAC neural audio codec, decoder side: codes -> 24 kHz waveform (our implementation; ``snac`` is a test oracle only).

config.py     SnacConfig (config.json) and the "full" / "tiny" presets
decoder.py    SnacDecoder (quantizer lookup + decoder stack), batched decode with per-row noise generators
layers.py     Snake, residual units, noise injection, upsampling blocks (parameters in conv layouts)
kernels.py    the operations on time-major [B, T, C] activations (GEMMs, shifted multiply-adds)
spans.py      which steps each block computes when only part of the output is kept
layout.py     our module names <-> the official state-dict names
weights.py    load_snac(dir): safetensors -> SnacDecoder, weight norm folded
convert.py    one-time pytorch_model.bin -> model.safetensors conversion (CLI)
tiny.py       write_snac(dir, preset, seed): random weights in the official layout
"""
