"""Dense decoder-only text LMs: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM.

    config.py      LMConfig (torch-free)            modules.py     CausalLM (ragged batch, AttentionContext)
    checkpoint.py  safetensors -> module (generic)  weights.py     load_causal_lm, estimate_weight_bytes
    processor.py   TextLMProcessor (torch-free)     tiny.py        write_tiny (random checkpoints + tokenizer)

Nothing is imported here, so the torch-free parts stay importable without torch.
"""
