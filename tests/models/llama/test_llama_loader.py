"""Checkpoint loading: errors name the offending tensor/architecture; byte estimates; config parsing."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from walkserve.core.errors import ConfigError
from walkserve.models.common.lm_config import LMConfig
from walkserve.models.llama.tiny import write_tiny
from walkserve.models.llama.weights import estimate_weight_bytes, load_causal_lm


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _rewrite(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_missing_tensor_is_named(tiny_dirs, tmp_path):
    path = _copy(tiny_dirs["llama"], tmp_path / "m")
    _rewrite(path, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(ConfigError, match=r"missing tensor.*model\.layers\.1\.self_attn\.k_proj\.weight"):
        load_causal_lm(path, progress=False)


def test_wrong_shape_names_tensor_and_both_shapes(tiny_dirs, tmp_path):
    path = _copy(tiny_dirs["qwen2"], tmp_path / "m")
    _rewrite(path, lambda t: t.__setitem__("model.layers.0.mlp.up_proj.weight", torch.zeros(100, 64)))
    with pytest.raises(ConfigError, match=r"model\.layers\.0\.mlp\.up_proj\.weight.*\[100, 64\].*\[128, 64\]"):
        load_causal_lm(path, progress=False)


def test_unexpected_tensor_is_named(tiny_dirs, tmp_path):
    path = _copy(tiny_dirs["qwen3"], tmp_path / "m")
    _rewrite(path, lambda t: t.__setitem__("model.layers.0.self_attn.extra.weight", torch.zeros(2)))
    with pytest.raises(ConfigError, match=r"unexpected tensor.*model\.layers\.0\.self_attn\.extra\.weight"):
        load_causal_lm(path, progress=False)


def test_unknown_architecture_is_named(tiny_dirs, tmp_path):
    path = _copy(tiny_dirs["llama"], tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["MistralForCausalLM"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="MistralForCausalLM"):
        load_causal_lm(path, progress=False)


def test_sharded_index_missing_tensor(tmp_path):
    path = write_tiny("qwen3", tmp_path / "m", shards=3)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.norm.weight"]
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=r"missing tensor.*'model\.norm\.weight'"):
        load_causal_lm(path, progress=False)


def test_no_weights_file(tmp_path):
    path = write_tiny("llama", tmp_path / "m")
    (path / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="no model.safetensors"):
        load_causal_lm(path, progress=False)


def test_tied_checkpoint_with_a_stray_lm_head_loads(tiny_dirs, tmp_path):
    path = write_tiny("qwen2", tmp_path / "m", tie_word_embeddings=True)
    _rewrite(path, lambda t: t.__setitem__("lm_head.weight", t["model.embed_tokens.weight"].clone()))
    model = load_causal_lm(path, progress=False)
    assert model.lm_head is None


@pytest.mark.parity
def test_tied_checkpoint_with_a_different_lm_head_uses_it_as_transformers_does(tmp_path, oracle):
    """transformers 5 keeps a stored head that differs from the embedding even where the config says tied."""
    path = write_tiny("qwen2", tmp_path / "m", tie_word_embeddings=True, vocab_size=301)
    _rewrite(path, lambda t: t.__setitem__("lm_head.weight", torch.randn_like(t["model.embed_tokens.weight"])))
    model = load_causal_lm(path, progress=False)
    assert model.lm_head is not None
    ids = torch.arange(3, 27)
    with torch.no_grad():
        want = oracle.hf_model(path)(ids[None]).logits[0]
    assert oracle.rel_err(oracle.our_logits(model, ids), want) < 1e-4


@pytest.mark.parametrize("dtype,itemsize", [(None, 4), ("bfloat16", 2), ("float32", 4)])
def test_weight_bytes_estimate_matches_loaded_model(tiny_dirs, dtype, itemsize):
    path = tiny_dirs["qwen3"]
    model = load_causal_lm(path, dtype=dtype, progress=False)
    loaded = sum(p.numel() * p.element_size() for p in model.parameters())
    assert estimate_weight_bytes(path, dtype) == loaded
    assert loaded == sum(p.numel() for p in model.parameters()) * itemsize


def test_write_tiny_is_deterministic(tmp_path):
    a = write_tiny("qwen3", tmp_path / "a", seed=3)
    b = write_tiny("qwen3", tmp_path / "b", seed=3)
    c = write_tiny("qwen3", tmp_path / "c", seed=4)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_write_tiny_rejects_unknown_override(tmp_path):
    with pytest.raises(ConfigError, match="num_layers"):
        write_tiny("llama", tmp_path / "m", num_layers=3)
    with pytest.raises(ConfigError, match="mistral"):
        write_tiny("mistral", tmp_path / "m")


@pytest.mark.parametrize("rope", ["default", "linear", "llama3"])
def test_both_config_spellings_parse_alike(tmp_path, rope):
    new = LMConfig.from_file(write_tiny("llama", tmp_path / "new", rope=rope, rope_form="parameters"))
    old_dir = write_tiny("llama", tmp_path / "old", rope=rope, rope_form="legacy")
    old = LMConfig.from_file(old_dir)
    assert new == old
    assert new.rope.rope_type == rope
    raw = json.loads((old_dir / "config.json").read_text())
    assert "rope_parameters" not in raw and "torch_dtype" in raw and "rope_theta" in raw


def test_config_fields():
    base = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, "eos_token_id": 7,
            "torch_dtype": "bfloat16", "rope_theta": 1e6}
    c = LMConfig.from_hf(base)
    assert (c.head_dim, c.num_key_value_heads, c.eos_token_ids, c.dtype) == (16, 4, (7,), "bfloat16")
    assert (c.qkv_bias, c.o_bias, c.qk_norm, c.rope.theta) == (True, False, False, 1e6)
    q3 = LMConfig.from_hf({**base, "architectures": ["Qwen3ForCausalLM"], "attention_bias": True, "head_dim": 24})
    assert (q3.qkv_bias, q3.o_bias, q3.qk_norm, q3.head_dim) == (True, True, True, 24)
    assert LMConfig.from_hf({**base, "eos_token_id": [1, 2]}).eos_token_ids == (1, 2)
    with pytest.raises(ConfigError, match="sliding-window"):  # layers 1.. slide, as transformers builds them
        LMConfig.from_hf({**base, "use_sliding_window": True, "max_window_layers": 1})
    with pytest.raises(ConfigError, match="sliding-window"):
        LMConfig.from_hf({**base, "layer_types": ["full_attention", "sliding_attention"]})
    # no layer slides: the window starts past the last layer (28 by default), or there is no window
    for full in ({"use_sliding_window": True}, {"use_sliding_window": True, "max_window_layers": 2},
                 {"use_sliding_window": True, "sliding_window": None, "max_window_layers": 0},
                 {"use_sliding_window": False, "max_window_layers": 0},
                 {"layer_types": ["full_attention", "full_attention"]}):
        assert LMConfig.from_hf({**base, **full}).num_hidden_layers == 2, full
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        LMConfig.from_hf({**base, "num_key_value_heads": 3})
    with pytest.raises(ConfigError, match="yarn"):
        LMConfig.from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ConfigError, match="intermediate_size"):
        LMConfig.from_hf({k: v for k, v in base.items() if k != "intermediate_size"})


_QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
          "num_attention_heads": 4, "vocab_size": 100}


@pytest.mark.parametrize("field, extra", [
    # transformers rotates whole heads in these families, whatever partial_rotary_factor says
    ("partial_rotary_factor", {"partial_rotary_factor": 0.5}),
    ("partial_rotary_factor", {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25}}),
    ("head_dim", {"head_dim": 0}),
    ("head_dim", {"hidden_size": 2}),
    ("num_attention_heads", {"num_attention_heads": 0}),
    ("rms_norm_eps", {"rms_norm_eps": None}),
    ("rms_norm_eps", {"rms_norm_eps": "1e-6"}),
    ("rope_scaling", {"rope_scaling": "linear"}),
    ("rope_theta", {"rope_theta": "1e6"}),
    ("factor", {"rope_scaling": {"type": "linear", "factor": "4"}}),
    ("factor", {"rope_scaling": {"type": "linear"}}),
    ("original_max_position_embeddings", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                           "original_max_position_embeddings": "8k"}}),
    ("tie_word_embeddings", {"tie_word_embeddings": "false"}),  # a string is not read as true
    ("attention_bias", {"attention_bias": 1}),
    ("mlp_bias", {"architectures": ["LlamaForCausalLM"], "mlp_bias": "no"}),
])
def test_bad_fields_are_config_errors_naming_the_field(field, extra):
    with pytest.raises(ConfigError, match=field):
        LMConfig.from_hf({**_QWEN2, **extra})


def test_absent_fields_default_as_in_transformers():
    """Qwen3's config class defaults head_dim to 128; Llama and Qwen2 derive it from hidden_size / heads."""
    assert LMConfig.from_hf({**_QWEN2, "architectures": ["Qwen3ForCausalLM"]}).head_dim == 128
    assert LMConfig.from_hf({**_QWEN2, "architectures": ["LlamaForCausalLM"]}).head_dim == 16
    assert LMConfig.from_hf({**_QWEN2, "head_dim": None}).head_dim == 16
    assert LMConfig.from_hf({**_QWEN2, "tie_word_embeddings": None}).tie_word_embeddings is False
    assert LMConfig.from_hf({**_QWEN2, "tie_word_embeddings": True}).tie_word_embeddings is True
    # llama3 rope without original_max_position_embeddings: the context length, the family default where absent
    llama3 = {**_QWEN2, "architectures": ["LlamaForCausalLM"], "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    assert LMConfig.from_hf(llama3).rope.original_max_position_embeddings == 2048
    assert LMConfig.from_hf({**llama3, "max_position_embeddings": 96}).rope.original_max_position_embeddings == 96
