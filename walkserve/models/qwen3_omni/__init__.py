"""Qwen3-Omni (``Qwen/Qwen3-Omni-30B-A3B-Instruct`` and the thinker-only ``-Thinking`` / ``-Captioner``).

The thinker half, one file per object:

    config.py            Qwen3OmniConfig (thinker text / audio / vision; talker and Code2Wav kept raw)
    thinker.py           ThinkerLM: the MoE decoder as a KV-cache component (MRoPE, deepstack, capture)
    audio_encoder.py     AudioEncoder: log-mel chunks -> thinker-width tokens (stateless component)
    vision_encoder.py    VisionEncoder: patches -> merged tokens + deepstack features (stateless component)
    audio_features.py    Whisper log-mel (numpy)          audio_load.py   decode + resample to 16 kHz
    image_processor.py   smart resize, normalise, patchify  video.py      frames / PyAV decoding, sampling
    prompt.py            chat template, placeholder expansion, media spans
    rope_index.py        3-axis positions (the reference's get_rope_index)
    thinker_request.py   messages + media -> ThinkerRequest (the processor's output)
    weights.py           loaders for the release layout      generate.py   offline greedy loop (oracle)
    tiny.py              tiny random checkpoints of all three parts (tiny_layout.py, tiny_tokenizer.py)

Serving (text out; docs/models/qwen3-omni.md):

    graph.py             the walks (prefill_text / prefill_audio / prefill_vision, their _first forms, thinker_decode), ThinkerTurns
    model.py             Qwen3OmniThinker: the ``qwen3-omni`` family (components, processor, memory report)
    processor.py         HTTP payloads -> RequestSpec (media_inputs.py, prompt_pieces.py, tokenizer_files.py)
    memory.py            sizes from the shards' headers, KV per token, the pool, per-rank report and refusal

The speech half (talker, code predictor, Code2Wav) lives beside it: ``talker*.py``,
``code_predictor.py``, ``code2wav*.py``, ``speech_*.py``.

Nothing here is imported by the package itself: import the module you need.
"""
