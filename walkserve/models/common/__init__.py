"""What every model family builds on, so no family borrows another's modules.

    checkpoint.py         safetensors checkpoints: names, shapes, loading into a module (torch)
    safetensors_files.py  checkpoint files and headers, read without torch (sizes for the memory check)
    dtypes.py             weight dtype names and the one resolution rule (torch)
    config_files.py       ``read_config_json`` with its errors, ``checkpoint_dir``, the tiny-checkpoint marker
    lm_config.py          ``LMConfig``: a dense decoder LM's config.json (Llama, Qwen2, Qwen3 and the LMs inside
                          other families: BAGEL's, Orpheus's, Qwen3-Omni's talker)
    decoder.py            the dense decoder: attention, MLP, layers, ``CausalLM`` (torch)
    text_walk.py          pieces of a causal LM's walks: the node name, the prompt key, the stop rule
    kv_sizing.py          KV bytes per token and the pool-size rule from the typed ``KVOptions``
    memory_report.py      components per rank and rank budgets for ``Model.memory_report``
    tiny_tokenizer.py     the tiny byte-level BPE tokenizer writer of the tiny checkpoints
    images.py             client images (PNG, JPEG, ...) decoded to RGB pixels, capped before decoding: the
                          API's media and the policies' encoded camera frames

The rule (checked by ``tests/models/test_family_imports.py``): a family imports
``models/common``, the shared towers (``snac``, ``siglip``) and the model API
(``models/base.py`` and siblings), never another family's modules, except a
family built on another's architecture by design (Orpheus on Llama).
See ``docs/adding-a-model.md``.
"""
