"""The Qwen3-Omni thinker stage, one file per object:

    lm.py                ThinkerLM: the MoE decoder as a KV-cache component (MRoPE, deepstack, capture)
    audio_encoder.py     AudioEncoder: log-mel chunks -> thinker-width tokens (stateless component)
    vision_encoder.py    VisionEncoder: patches -> merged tokens + deepstack features (stateless component)
    windows.py           attention restricted to windows of a packed sequence (both encoders)
    audio_features.py    Whisper log-mel (numpy)          audio_load.py   decode + resample to 16 kHz (and its cache)
    mel_cache.py         the mel frames of recent clips, for a clip resent longer
    content_keys.py      each prompt row's prefix-cache key (audio: chained per encoder window)
    image_processor.py   smart resize, normalise, patchify  video.py      frames / PyAV decoding, sampling
    media_inputs.py      decoded media parts -> the processor's inputs; media_tokens.py: tokens per item
    prompt.py            chat template, placeholder expansion, media spans
    prompt_pieces.py     a prompt cut at its media into the prefill walks' inputs
    rope_index.py        3-axis positions (the reference's get_rope_index)
    request.py           messages + media -> ThinkerRequest (the processor's output)
    weights.py           loaders for the release layout      generate.py   offline greedy loop (oracle)
"""
