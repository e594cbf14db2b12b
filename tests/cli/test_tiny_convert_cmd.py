"""``walkserve tiny`` and ``walkserve convert snac``."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from walkserve.cli.main import main
from walkserve.models.snac.tiny import write_snac


def test_tiny_text_checkpoint(tmp_path, capsys):
    assert main(["tiny", "qwen3", str(tmp_path / "q"), "--seed", "4"]) == 0
    assert "walkserve serve qwen3 --model-path" in capsys.readouterr().out
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["walkserve_random_weights"] is True
    assert (tmp_path / "q" / "tokenizer.json").is_file() and (tmp_path / "q" / "model.safetensors").is_file()


def test_tiny_is_deterministic_per_seed(tmp_path):
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        assert main(["tiny", "llama", str(tmp_path / name), "--seed", str(seed)]) == 0
    a, b, c = (load_file(str(tmp_path / n / "model.safetensors")) for n in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_tiny_orpheus_layout(tmp_path, capsys):
    assert main(["tiny", "orpheus", str(tmp_path / "o")]) == 0
    assert "walkserve serve orpheus" in capsys.readouterr().out
    assert (tmp_path / "o" / "lm" / "config.json").is_file()
    assert (tmp_path / "o" / "snac" / "model.safetensors").is_file()


def test_tiny_unknown_preset(tmp_path, capsys):
    assert main(["tiny", "llama", str(tmp_path / "x"), "--preset", "bench"]) == 1
    assert "presets tiny, not 'bench'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_convert_snac(tmp_path, capsys):
    src = write_snac(tmp_path / "src", "tiny", seed=6)
    state = load_file(str(src / "model.safetensors"))
    torch.save(state, src / "pytorch_model.bin")  # the released layout: a pickle
    (src / "model.safetensors").unlink()
    assert main(["convert", "snac", str(src), str(tmp_path / "dst")]) == 0
    assert "model.safetensors" in capsys.readouterr().out
    converted = load_file(str(tmp_path / "dst" / "model.safetensors"))
    assert converted.keys() == state.keys() and all(torch.equal(converted[k], state[k]) for k in state)
    assert (tmp_path / "dst" / "config.json").read_text() == (src / "config.json").read_text()


def test_convert_snac_missing_source(tmp_path, capsys):
    assert main(["convert", "snac", str(tmp_path / "nope"), str(tmp_path / "dst")]) == 1
    assert "walkserve: error:" in capsys.readouterr().err
