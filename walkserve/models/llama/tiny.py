"""Tiny random-weight checkpoints in the official HF layout, for tests and the embedded demo.

``write_tiny("llama" | "qwen2" | "qwen3", out_dir, **overrides)`` writes:

    config.json                  HF format (transformers-5 ``rope_parameters`` + ``dtype``,
                                 or ``rope_form="legacy"``: ``rope_theta`` + ``rope_scaling`` + ``torch_dtype``),
                                 marked ``"walkserve_random_weights": true``
    generation_config.json
    model.safetensors            or ``shards=N``: model-0000i-of-0000N.safetensors + model.safetensors.index.json
    tokenizer.json, tokenizer_config.json   a small trained byte-level BPE with a chat template

The weights are random (deterministic for a ``seed``): whoever serves them
must label them so (``ModelCard.random_weights``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from walkserve.core.errors import ConfigError
from walkserve.layers.rope_config import RopeConfig
from walkserve.models.common.checkpoint import INDEX_FILE, SINGLE_FILE, expected_shapes, on_meta
from walkserve.models.common.decoder import CausalLM
from walkserve.models.common.dtypes import TORCH_DTYPES
from walkserve.models.common.lm_config import RANDOM_WEIGHTS_KEY, LMConfig
from walkserve.models.common.tiny_tokenizer import TinyTokenIds, write_tokenizer

ARCHS = {
    "llama": ("LlamaForCausalLM", "llama", "llama3"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", "chatml"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", "chatml"),
}
_SHAPE = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
}
_OPTIONS = {"rope": "default", "rope_theta": 10000.0, "rope_form": "parameters", "dtype": "float32", "shards": 1,
            "seed": 0, "init_std": 0.05}
ROPE_PRESETS = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
}


def write_tiny(arch: str, out_dir: str | Path, **overrides: Any) -> Path:
    """Write a tiny random checkpoint for ``arch``; returns ``out_dir``.

    Overrides: any of vocab_size, hidden_size, intermediate_size,
    num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
    max_position_embeddings, rms_norm_eps, tie_word_embeddings,
    attention_bias, mlp_bias (llama only); rope ("default" | "linear" |
    "llama3" | an HF rope dict), rope_theta, rope_form ("parameters" |
    "legacy"), dtype ("float32" | "bfloat16" | "float16"), shards, seed, init_std.
    """
    if arch not in ARCHS:
        raise ConfigError(f"unknown tiny architecture {arch!r} (known: {', '.join(ARCHS)})")
    unknown = set(overrides) - set(_SHAPE) - set(_OPTIONS)
    if unknown:
        raise ConfigError(f"write_tiny: unknown override(s) {', '.join(sorted(unknown))}")
    opts = {**_SHAPE, **_OPTIONS, **overrides}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(out, ARCHS[arch][2], opts["vocab_size"], opts["max_position_embeddings"])
    hf_config = _hf_config(arch, opts, ids)
    (out / "config.json").write_text(json.dumps(hf_config, indent=2))
    (out / "generation_config.json").write_text(json.dumps(_generation_config(ids), indent=2))
    tensors = _random_tensors(LMConfig.from_hf(hf_config), opts)
    _save(out, tensors, int(opts["shards"]))
    return out


def _hf_config(arch: str, o: dict[str, Any], ids: TinyTokenIds) -> dict[str, Any]:
    architecture, model_type, _ = ARCHS[arch]
    config: dict[str, Any] = {"architectures": [architecture], "model_type": model_type, "hidden_act": "silu"}
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
                "tie_word_embeddings"):
        config[key] = o[key]
    if arch != "qwen2":
        config["attention_bias"] = o["attention_bias"]
    if arch == "llama":
        config["mlp_bias"] = o["mlp_bias"]
    config.update(bos_token_id=ids.bos_token_id, eos_token_id=list(ids.eos_token_ids), pad_token_id=ids.pad_token_id)
    config[RANDOM_WEIGHTS_KEY] = True
    rope = dict(ROPE_PRESETS[o["rope"]] if isinstance(o["rope"], str) else o["rope"])
    rope["rope_theta"] = o["rope_theta"]
    RopeConfig.from_hf({"rope_parameters": rope})  # validate before writing
    if o["rope_form"] == "parameters":
        config.update(rope_parameters=rope, dtype=o["dtype"])
    elif o["rope_form"] == "legacy":
        theta = rope.pop("rope_theta")
        if rope["rope_type"] == "linear":  # the oldest spelling used "type"
            rope["type"] = rope.pop("rope_type")
        config.update(rope_theta=theta, rope_scaling=None if rope.get("rope_type") == "default" else rope,
                      torch_dtype=o["dtype"])
    else:
        raise ConfigError(f"rope_form must be 'parameters' or 'legacy', got {o['rope_form']!r}")
    return config


def _generation_config(ids: TinyTokenIds) -> dict[str, Any]:
    out: dict[str, Any] = {"eos_token_id": list(ids.eos_token_ids), "pad_token_id": ids.pad_token_id}
    if ids.bos_token_id is not None:
        out["bos_token_id"] = ids.bos_token_id
    return out


def _random_tensors(config: LMConfig, o: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Checkpoint name -> random tensor; norms near 1, everything else N(0, init_std), by sorted name."""
    if o["dtype"] not in TORCH_DTYPES:
        raise ConfigError(f"unsupported dtype {o['dtype']!r}")
    with on_meta():
        shapes = expected_shapes(CausalLM(config))
    gen = torch.Generator().manual_seed(int(o["seed"]))
    tensors = {}
    for name in sorted(shapes):
        noise = torch.randn(shapes[name], generator=gen)
        value = 1.0 + 0.1 * noise if name.endswith("norm.weight") else o["init_std"] * noise
        tensors[name] = value.to(TORCH_DTYPES[o["dtype"]]).contiguous()
    return tensors


def _save(out: Path, tensors: dict[str, torch.Tensor], shards: int) -> None:
    from safetensors.torch import save_file

    names = sorted(tensors)
    if shards < 1 or shards > len(names):
        raise ConfigError(f"shards must be in [1, {len(names)}], got {shards}")
    if shards == 1:
        save_file(tensors, str(out / SINGLE_FILE), metadata={"format": "pt"})
        return
    weight_map = {}
    for i in range(shards):
        group = names[i * len(names) // shards : (i + 1) * len(names) // shards]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in group}, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(group, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2))
