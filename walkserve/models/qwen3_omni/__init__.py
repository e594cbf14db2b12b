"""Qwen3-Omni (``Qwen/Qwen3-Omni-30B-A3B-Instruct`` and the thinker-only ``-Thinking`` / ``-Captioner``).

Two stages, one folder each, and what serves them at the top:

    thinker/             the thinker: its MoE decoder, the audio and vision encoders, their inputs (media, prompt,
                         positions), its loaders and offline oracle (docs/models/qwen3-omni.md)
    speech/              the speech half: talker, code predictor, Code2Wav, their config, walks, rules, request
                         inputs, loaders and offline oracle (docs/models/qwen3-omni-speech.md)

    config.py            Qwen3OmniConfig (thinker text / audio / vision; talker and Code2Wav kept raw)
    graph.py             the thinker's walks (prefill_text / prefill_audio / prefill_vision, their _first forms,
                         thinker_decode), ThinkerTurns; ``speech/graph.py`` adds the spoken answer's
    model.py             Qwen3OmniThinker: the ``qwen3-omni`` family (components, processor, memory report)
    processor.py         HTTP payloads -> RequestSpec (tokenizer_files.py: the checkpoint's tokenizer)
    memory.py            sizes from the shards' headers, KV per token, the pool, per-rank report and refusal
    tiny.py              tiny random checkpoints of all three parts (tiny_layout.py, tiny_tokenizer.py)

The stages import the top-level modules and the speech stage imports the
thinker's; the thinker never imports the speech stage. Shared loaders, config
reading and KV sizing come from ``models/common``; the dense decoder the code
predictor and the attention layers build on is ``common/decoder.py``.

Nothing here is imported by the package itself: import the module you need.
"""
