"""Loading and converting V-JEPA 2 checkpoints: the released AC pickle -> our safetensors + config.json, the CLI,
tiny checkpoints, and the refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from walkserve.cli.main import main
from walkserve.core.errors import ConfigError
from walkserve.models.common.safetensors_files import INDEX_FILE
from walkserve.models.vjepa2.ac_predictor import ACPredictor
from walkserve.models.vjepa2.config import VJEPA2ACConfig, read_config
from walkserve.models.vjepa2.convert import convert_vjepa2_ac, map_encoder, map_predictor
from walkserve.models.vjepa2.weights import load_ac_predictor, load_encoder, load_masked_predictor


def test_converted_names_split_qkv_and_keep_every_tensor(released):
    original = torch.load(released.pickle, weights_only=True)
    converted = load_file(str(released.out / "model.safetensors"))
    qkv = original["predictor"]["module.backbone.predictor_blocks.1.attn.qkv.weight"]
    q, k, v = (converted[f"predictor.layer.1.attention.{n}.weight"] for n in ("query", "key", "value"))
    assert torch.equal(torch.cat([q, k, v]), qkv)
    assert torch.equal(converted["encoder.layernorm.bias"], original["encoder"]["module.backbone.norm.bias"])
    assert "predictor.extrinsics_encoder.weight" in converted  # kept (unused), nothing dropped silently
    n_fused = sum(k.endswith(("qkv.weight", "qkv.bias")) for part in ("encoder", "predictor") for k in original[part])
    assert len(converted) == sum(len(original[p]) for p in ("encoder", "predictor")) + 2 * n_fused
    config = read_config(released.out)
    assert isinstance(config, VJEPA2ACConfig) and config.source == released.pickle.name
    assert json.loads((released.out / "config.json").read_text())["predictor"]["max_steps"] == 32


def test_shards_and_index(released, tmp_path):
    out, others = convert_vjepa2_ac(released.pickle, tmp_path / "sharded", crop_size=64, encoder_heads=2,
                                    predictor_heads=2, shard_bytes=200_000)
    assert others == ["epoch"] and (out / INDEX_FILE).is_file() and len(list(out.glob("model-*.safetensors"))) > 2
    x = torch.randn(1, 3, 2, 64, 64)
    with torch.inference_mode():
        assert torch.equal(load_encoder(out)(x), released.encoder(x))
    assert all(torch.equal(a, b) for a, b in zip(load_ac_predictor(out).state_dict().values(),
                                                 released.predictor.state_dict().values()))


def test_cli_convert_and_tiny(released, tmp_path, capsys):
    assert main(["convert", "vjepa2-ac", str(released.pickle), str(tmp_path / "c"), "--crop-size", "64",
                 "--encoder-heads", "2", "--predictor-heads", "2"]) == 0
    assert "not converted (not weights of the model): epoch" in capsys.readouterr().out
    assert main(["convert", "vjepa2-ac", str(released.pickle), str(tmp_path / "d"), "--crop-size", "64"]) == 1
    assert "pass its heads" in capsys.readouterr().err  # width 128 is no released encoder
    for family, preset in (("vjepa2", "tiny"), ("vjepa2-ac", "tiny"), ("vjepa2-ac", "bench")):
        assert main(["tiny", family, str(tmp_path / f"{family}-{preset}"), "--preset", preset, "--seed", "1"]) == 0
    assert json.loads((tmp_path / "vjepa2-tiny" / "config.json").read_text())["walkserve_random_weights"] is True
    bench = load_ac_predictor(tmp_path / "vjepa2-ac-bench")
    assert (bench.config.hidden_size, bench.config.num_hidden_layers, bench.config.frame_tokens) == (256, 8, 64)
    load_masked_predictor(tmp_path / "vjepa2-tiny")
    assert main(["tiny", "vjepa2", str(tmp_path / "x"), "--preset", "bench"]) == 1


def test_tiny_is_deterministic_per_seed(tmp_path):
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        assert main(["tiny", "vjepa2-ac", str(tmp_path / name), "--seed", str(seed)]) == 0
    a, b, c = (load_file(str(tmp_path / n / "model.safetensors")) for n in "abc")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["predictor.action_encoder.weight"], c["predictor.action_encoder.weight"])


def test_refusals(released, tmp_path):
    with pytest.raises(ConfigError, match="unexpected predictor tensor"):
        map_predictor({"module.mask_token": torch.zeros(1)})
    with pytest.raises(ConfigError, match="unexpected encoder tensor"):
        map_encoder({"backbone.cls_token": torch.zeros(1)})
    assert map_encoder({"module.backbone.pos_embed": torch.zeros(1)}) == {}  # the spare sin-cos table
    torch.save({"encoder": {}, "predictor": {"w": torch.nn.Linear(1, 1)}}, tmp_path / "code.pt")
    with pytest.raises(ConfigError, match="weights-only"):  # a pickled module is code, refused by weights_only
        convert_vjepa2_ac(tmp_path / "code.pt", tmp_path / "out")
    torch.save({"model": {}}, tmp_path / "other.pt")
    with pytest.raises(ConfigError, match="'encoder' and 'predictor'"):
        convert_vjepa2_ac(tmp_path / "other.pt", tmp_path / "out")
    with pytest.raises(ConfigError, match="masked predictor"):
        load_masked_predictor(released.out)


def test_released_shapes_on_the_meta_device():
    from walkserve.models.common.checkpoint import expected_shapes
    from walkserve.models.vjepa2.config import AC_PREDICTOR, VJEPA2Config, released
    from walkserve.models.vjepa2.encoder import VisionEncoder
    from walkserve.models.vjepa2.rope3d import part_dim

    counts = {}
    for name in ("vitl", "vith", "vitg"):
        with torch.device("meta"):
            shapes = expected_shapes(VisionEncoder(released(name).encoder))
        counts[name] = sum(torch.Size(s).numel() for s in shapes.values())
    assert [round(counts[n] / 1e6) for n in ("vitl", "vith", "vitg")] == [304, 632, 1012]
    assert shapes["layer.39.mlp.fc1.weight"] == (6144, 1408) and part_dim(released("vith").encoder.vit.head_dim) == 26
    hf_vitg = VJEPA2Config.from_hf({"hidden_size": 1408, "num_hidden_layers": 40, "num_attention_heads": 22,
                                    "mlp_ratio": 48 / 11, "crop_size": 384})  # as its config.json writes it
    assert hf_vitg.encoder.vit.intermediate_size == 6144 and hf_vitg.encoder.grid_size == 24
    with torch.device("meta"):
        ac = expected_shapes(ACPredictor(AC_PREDICTOR))
    assert ac["layer.23.attention.query.weight"] == (1024, 1024) and ac["predictor_embed.weight"] == (1024, 1408)
    assert AC_PREDICTOR.tokens_per_step == 258 and AC_PREDICTOR.max_steps * 258 == 8256
