"""Loading lerobot's released layout: both tensor-name forms, clear errors, the config's horizons and
normalisation, and ``walkserve tiny pi0|pi05``."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from walkserve.cli.main import main as cli_main
from walkserve.core.errors import ConfigError
from walkserve.models.pi0.config import PolicyConfig
from walkserve.models.pi0.files import load_policy_files
from walkserve.models.pi0.inputs import InputSpec, validate_inputs
from walkserve.models.pi0.normalizer import FeatureNorm
from walkserve.models.pi0.policy import EMBEDDING, TIED_HEAD
from walkserve.models.pi0.predict import predict_actions
from walkserve.models.pi0.tiny import tiny_config, write_tiny_policy
from walkserve.models.pi0.weights import load_policy


def _copy(src, dst, edit):
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    save_file(edit(tensors), str(dst / "model.safetensors"))
    return dst


def test_hub_form_without_prefix_and_with_only_the_tied_head(tiny_pi05, tmp_path):
    def hub(tensors):
        out = {k.removeprefix("model."): v for k, v in tensors.items()}
        del out[EMBEDDING]
        return out

    path = _copy(tiny_pi05.path, tmp_path / "hub", hub)
    loaded = load_policy(path, progress=False)
    for (name, a), (_, b) in zip(loaded.state_dict().items(), tiny_pi05.policy.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("edit, message", [
    (lambda t: {k: v for k, v in t.items() if "layers.1.mlp.down_proj" not in k}, "missing"),
    (lambda t: {**t, "model.extra.weight": torch.zeros(2)}, "unexpected"),
    (lambda t: {**t, "model.action_in_proj.weight": torch.zeros(32, 31)}, "shape"),
])
def test_bad_checkpoints_name_the_tensor(tiny_pi05, tmp_path, edit, message):
    path = _copy(tiny_pi05.path, tmp_path / "bad", edit)
    with pytest.raises(ConfigError, match=message):
        load_policy(path, progress=False)


def test_real_config_names_variants(tiny_pi05):
    raw = json.loads((tiny_pi05.path / "config.json").read_text())
    del raw["walkserve_sizes"]
    raw |= {"chunk_size": 50, "image_resolution": [224, 224], "tokenizer_max_length": 200}
    config = PolicyConfig.from_dict(raw)
    assert (config.paligemma.hidden_size, config.paligemma.intermediate_size, config.expert.hidden_size) == (
        2048, 16384, 1024)
    assert config.vocab_size == 257152 and config.vision.num_hidden_layers == 27
    assert config.image_tokens == 256 and config.max_prefix_tokens == 3 * 256 + 200
    with pytest.raises(ConfigError, match="type"):
        PolicyConfig.from_dict({**raw, "type": "act"})


def test_bench_preset_keeps_the_released_token_counts(tmp_path):
    """``--preset bench`` (./dev bench pi): released widths / 8, 6 layers, but 224 px cameras and horizon 50."""
    config = PolicyConfig.from_dict(tiny_config("pi0", preset="bench", chunk_size=50))
    assert (config.paligemma.hidden_size, config.paligemma.intermediate_size, config.paligemma.head_dim) == (256, 2048, 32)
    assert (config.expert.hidden_size, config.expert.num_hidden_layers, config.vision.num_hidden_layers) == (128, 6, 4)
    assert config.image_tokens == 256 and config.chunk_size == 50 and config.num_inference_steps == 10
    with pytest.raises(ConfigError, match="presets tiny, bench"):
        write_tiny_policy("pi0", tmp_path / "x", preset="huge")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("kind, chunk, action_dim", [("pi05", 15, 8), ("pi0", 10, 7)], ids=["droid", "libero"])
def test_horizon_and_action_dims_come_from_the_config(tmp_path, kind, chunk, action_dim):
    path = write_tiny_policy(kind, tmp_path / kind, seed=2, chunk_size=chunk, action_dim=action_dim)
    policy, files = load_policy(path, progress=False), load_policy_files(path)
    spec = InputSpec.from_config(policy.config)
    rng = np.random.default_rng(0)
    inputs = validate_inputs(spec, {"base_0_rgb": rng.integers(0, 256, (32, 40, 3), dtype=np.uint8),
                                    "state": rng.standard_normal(8), "prompt": "go"})
    actions = predict_actions(policy, files, inputs, generator=torch.Generator().manual_seed(0)).actions
    assert actions.shape == (chunk, action_dim) and np.isfinite(actions).all()


def test_normalisation_formulas():
    lo, hi = np.array([-1.0, 0.0, 2.0], np.float32), np.array([1.0, 4.0, 2.0], np.float32)
    q = FeatureNorm("QUANTILES", lo, hi)
    x = np.array([0.5, 1.0, 2.0], np.float32)
    np.testing.assert_allclose(q.normalize(x), [0.5, -0.5, -1.0])  # 2 (x - q01) / (q99 - q01) - 1, eps if equal
    np.testing.assert_allclose(q.unnormalize(q.normalize(x)), x, atol=1e-6)
    m = FeatureNorm("MEAN_STD", np.array([1.0], np.float32), np.array([2.0], np.float32))
    np.testing.assert_allclose(m.normalize(np.array([5.0])), [2.0], rtol=1e-6)
    np.testing.assert_allclose(m.unnormalize(np.array([2.0])), [5.0])


def test_processor_files_are_read(tiny_pi05, tiny_pi0):
    assert tiny_pi05.files.normalizer.state.mode == tiny_pi05.files.normalizer.action.mode == "QUANTILES"
    assert tiny_pi0.files.normalizer.state.mode == "MEAN_STD" and tiny_pi0.files.normalizer.state.a.shape == (8,)


def test_missing_tokenizer_points_at_the_flag(tiny_pi05, tmp_path):
    path = shutil.copytree(tiny_pi05.path, tmp_path / "no_tok")
    (path / "tokenizer.model").unlink()
    with pytest.raises(ConfigError, match="--tokenizer-path"):
        load_policy_files(path)
    assert load_policy_files(path, tokenizer_path=tiny_pi05.path / "tokenizer.model").tokenizer.bos_id == 2


@pytest.mark.parametrize("family", ["pi0", "pi05"])
def test_tiny_cli_writes_a_loadable_checkpoint(tmp_path, family, capsys):
    assert cli_main(["tiny", family, str(tmp_path / family)]) == 0
    assert "random-weight" in capsys.readouterr().out
    config = PolicyConfig.from_file(tmp_path / family)
    assert config.kind == family and config.random_weights
    assert load_policy(tmp_path / family, progress=False).config == config
    assert TIED_HEAD in {k.removeprefix("model.") for k in load_file(str(tmp_path / family / "model.safetensors"))}
