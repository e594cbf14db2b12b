"""Checkpoint loading, the .bin -> safetensors conversion, the tiny writer, and their error messages."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from walkserve.core.errors import ConfigError
from walkserve.models.snac.config import PRESETS, SnacConfig
from walkserve.models.snac.convert import convert_snac, main
from walkserve.models.snac.tiny import random_state_dict, write_snac
from walkserve.models.snac.weights import fold_weight_norm, load_snac

torch.set_num_threads(1)


def decode(path, codes, seed=3):
    return load_snac(path).decode(codes, [torch.Generator().manual_seed(seed)])


def make_bin_checkpoint(src, dst):
    """A released-style directory: config.json + pytorch_model.bin with the same tensors as ``src``."""
    dst.mkdir()
    shutil.copyfile(src / "config.json", dst / "config.json")
    torch.save(load_file(str(src / "model.safetensors")), dst / "pytorch_model.bin")
    return dst


def test_conversion_round_trip(tiny_snac_dir, tmp_path, oracle):
    released = make_bin_checkpoint(tiny_snac_dir, tmp_path / "released")
    out = convert_snac(released, tmp_path / "converted")
    assert out == tmp_path / "converted" / "model.safetensors"
    original, converted = load_file(str(tiny_snac_dir / "model.safetensors")), load_file(str(out))
    assert converted.keys() == original.keys()
    assert all(torch.equal(converted[k], original[k]) for k in original)
    codes = oracle.codes(2, seed=4)
    assert torch.equal(decode(tmp_path / "converted", codes), decode(tiny_snac_dir, codes))
    oracle.load(tmp_path / "converted")  # still a complete state dict for the snac package


def test_conversion_in_place_and_cli(tiny_snac_dir, tmp_path, capsys):
    released = make_bin_checkpoint(tiny_snac_dir, tmp_path / "released")
    with pytest.raises(
        ConfigError, match=r"model\.safetensors does not exist; convert pytorch_model\.bin once"
    ):
        load_snac(released)
    assert main([str(released), str(released)]) == 0
    assert "model.safetensors" in capsys.readouterr().out
    load_snac(released)
    assert main([str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 1
    assert "config.json does not exist" in capsys.readouterr().err


def test_conversion_rejects_a_pickle_that_is_not_a_state_dict(tiny_snac_dir, tmp_path):
    src = make_bin_checkpoint(tiny_snac_dir, tmp_path / "released")
    torch.save({"step": 3, "weights": [1, 2]}, src / "pytorch_model.bin")
    with pytest.raises(ConfigError, match=r"non-tensor entries \['step', 'weights'\]"):
        convert_snac(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_legacy_weight_g_weight_v_names_load_the_same(tiny_snac_dir, tmp_path, oracle):
    tensors = load_file(str(tiny_snac_dir / "model.safetensors"))
    renamed = {
        k.replace(".parametrizations.weight.original0", ".weight_g").replace(
            ".parametrizations.weight.original1", ".weight_v"
        ): v
        for k, v in tensors.items()
    }
    assert any(k.endswith(".weight_g") for k in renamed)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    shutil.copyfile(tiny_snac_dir / "config.json", legacy / "config.json")
    save_file(renamed, str(legacy / "model.safetensors"))
    codes = oracle.codes(1, seed=8)
    assert torch.equal(decode(legacy, codes), decode(tiny_snac_dir, codes))


def test_fold_matches_torch_weight_norm():
    conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.ConvTranspose1d(6, 4, 8, stride=4))
    with torch.no_grad():
        conv.parametrizations.weight.original0.uniform_(0.5, 2.0)
    g, v = conv.parametrizations.weight.original0, conv.parametrizations.weight.original1
    torch.testing.assert_close(fold_weight_norm(g, v), conv.weight.detach())


def rewrite(src, dst, edit):
    dst.mkdir()
    shutil.copyfile(src / "config.json", dst / "config.json")
    tensors = load_file(str(src / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_missing_tensor_is_named(tiny_snac_dir, tmp_path):
    name = "decoder.model.3.block.1.parametrizations.weight.original1"
    path = rewrite(tiny_snac_dir, tmp_path / "m", lambda t: t.pop(name))
    with pytest.raises(ConfigError, match=f"missing tensors {name}"):
        load_snac(path)
    bias = "quantizer.quantizers.2.out_proj.bias"
    path = rewrite(tiny_snac_dir, tmp_path / "b", lambda t: t.pop(bias))
    with pytest.raises(ConfigError, match=f"missing tensors {bias}"):
        load_snac(path)


def test_misshaped_tensor_is_named(tiny_snac_dir, tmp_path):
    name = "decoder.model.6.alpha"

    def shrink(t):
        t[name] = t[name][:, :-1]

    with pytest.raises(
        ConfigError, match=rf"tensor {name} has shape \[1, 3, 1\], expected \[1, 4, 1\]"
    ):
        load_snac(rewrite(tiny_snac_dir, tmp_path / "a", shrink))
    codebook = "quantizer.quantizers.0.codebook.weight"

    def widen(t):
        t[codebook] = torch.zeros(4096, 9)

    with pytest.raises(
        ConfigError, match=rf"tensor {codebook} has shape \[4096, 9\], expected \[4096, 8\]"
    ):
        convert_snac(
            make_bin_checkpoint(rewrite(tiny_snac_dir, tmp_path / "c", widen), tmp_path / "r"),
            tmp_path / "o",
        )


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="is not a directory"):
        load_snac(tmp_path / "absent")
    (tmp_path / "config.json").write_text(json.dumps({**PRESETS["tiny"].to_dict(), "hop": 3}))
    with pytest.raises(ConfigError, match=r"unknown SNAC config keys \['hop'\]"):
        load_snac(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({**PRESETS["tiny"].to_dict(), "decoder_rates": [8, 0]})
    )
    with pytest.raises(ConfigError, match="decoder_rates must be positive integers"):
        load_snac(tmp_path)
    (tmp_path / "config.json").write_text("{nope")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        load_snac(tmp_path)
    with pytest.raises(ConfigError, match="multiple of 64"):
        SnacConfig(decoder_dim=48, attn_window_size=4)


def test_official_config_round_trips():
    official = {
        "sampling_rate": 24000, "encoder_dim": 48, "encoder_rates": [2, 4, 8, 8], "decoder_dim": 1024,
        "decoder_rates": [8, 8, 4, 2], "attn_window_size": None, "codebook_size": 4096, "codebook_dim": 8,
        "vq_strides": [4, 2, 1], "noise": True, "depthwise": True,
    }  # fmt: skip
    cfg = SnacConfig.from_dict(official)
    assert cfg == PRESETS["full"]
    assert cfg.to_dict() == official
    assert (cfg.latent, cfg.hop_length, cfg.frame_samples) == (768, 512, 2048)
    assert PRESETS["tiny"].frame_samples == 2048


def test_writer_is_deterministic_in_its_seed(tmp_path):
    a, b, c = (random_state_dict(PRESETS["tiny"], s) for s in (0, 0, 1))
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(
        a["quantizer.quantizers.0.codebook.weight"], c["quantizer.quantizers.0.codebook.weight"]
    )
    with pytest.raises(ConfigError, match="unknown SNAC preset 'huge'"):
        write_snac(tmp_path, "huge")
