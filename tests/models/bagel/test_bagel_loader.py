"""Loading the released layout: config assembly, the stored tables, the tiny writer and its CLI, load errors."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from walkserve.cli.main import main
from walkserve.core.errors import ConfigError
from walkserve.models.bagel.config import BagelConfig, FluxAEConfig
from walkserve.models.bagel.latents import sincos_table
from walkserve.models.bagel.weights import load_bagel, load_vit


def test_config_forces_qk_norm_untied_and_drops_the_last_vit_layer(tiny_dir):
    llm = json.loads((tiny_dir / "llm_config.json").read_text())
    vit = json.loads((tiny_dir / "vit_config.json").read_text())
    assert "qk_norm" not in llm and llm["architectures"] == ["Qwen2ForCausalLM"]
    c = BagelConfig.from_dir(tiny_dir)
    assert c.llm.qk_norm and not c.llm.tie_word_embeddings and c.llm.qkv_bias and not c.llm.o_bias
    assert c.vit.num_hidden_layers == vit["num_hidden_layers"] - 1
    assert (c.max_latent_size, c.vit_max_num_patch_per_side) == (8, 8)  # read from the stored tables
    assert (c.latent_dim, c.latent_downsample, c.max_image_side) == (64, 16, 128)
    assert c.vae == FluxAEConfig(ch=32, ch_mult=(1, 1, 2, 2), num_res_blocks=1, z_channels=16)


def test_release_shapes_give_the_release_config():
    """FluxAEConfig.from_shapes on FLUX.1's ae shapes; the real tables are 64² and 70² rows."""
    from walkserve.models.bagel.flux_ae import FluxDecoder, FluxEncoder
    from walkserve.models.common.checkpoint import expected_shapes

    real = FluxAEConfig()
    with torch.device("meta"):
        shapes = {**expected_shapes(FluxEncoder(real), "encoder."), **expected_shapes(FluxDecoder(real), "decoder.")}
    assert FluxAEConfig.from_shapes(shapes) == real and real.downsample == 8


def test_position_tables_are_the_fixed_two_d_sincos_tables(ema):
    side, dim = 8, ema["latent_pos_embed.pos_embed"].shape[1]
    torch.testing.assert_close(ema["latent_pos_embed.pos_embed"], sincos_table(side, dim))
    q = dim // 4
    row, col = 5, 3
    want = []
    for pos in (col, row):  # the column's half first, as the release's meshgrid orders them
        angles = [pos / 10000 ** (i / q) for i in range(q)]
        want += [math.sin(a) for a in angles] + [math.cos(a) for a in angles]
    torch.testing.assert_close(sincos_table(side, dim)[row * side + col], torch.tensor(want), rtol=1e-5, atol=1e-6)


def test_tiny_cli_writes_the_released_layout(tmp_path):
    out = tmp_path / "b"
    assert main(["tiny", "bagel", str(out), "--seed", "2"]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"ema.safetensors", "ae.safetensors", "llm_config.json", "vit_config.json", "config.json",
            "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"} <= names
    ema = load_file(str(out / "ema.safetensors"))
    assert ema["vit_model.vision_model.embeddings.patch_embedding.weight"].shape == (32, 14 * 14 * 3)
    assert any(k.endswith("q_proj_moe_gen.weight") for k in ema) and "language_model.lm_head.weight" in ema
    ae = load_file(str(out / "ae.safetensors"))
    assert "encoder.down.0.block.0.conv1.weight" in ae and "decoder.up.3.upsample.conv.weight" in ae
    norms = ema["language_model.model.layers.0.input_layernorm_moe_gen.weight"]
    assert not torch.equal(norms, torch.ones_like(norms))  # perturbed, not the identity init


def test_a_stored_extra_vit_layer_is_not_read(tiny_dir, tmp_path, parts):
    """The release's vit_config names 27 layers and the app uses 26: a checkpoint holding layer 26 still loads."""
    path = tmp_path / "extra"
    shutil.copytree(tiny_dir, path)
    ema = load_file(str(path / "ema.safetensors"))
    layers = parts.config.vit.num_hidden_layers
    prefix = f"vit_model.vision_model.encoder.layers.{layers - 1}."
    ema.update({k.replace(f".{layers - 1}.", f".{layers}."): v.clone() for k, v in ema.items() if k.startswith(prefix)})
    save_file(ema, str(path / "ema.safetensors"))
    vit = load_vit(path, BagelConfig.from_dir(path))
    assert len(vit.vit_model.encoder.layers) == layers


def test_missing_and_mismatched_tensors_name_them(tiny_dir, tmp_path):
    path = tmp_path / "broken"
    shutil.copytree(tiny_dir, path)
    ema = load_file(str(path / "ema.safetensors"))
    del ema["language_model.model.layers.1.mlp_moe_gen.down_proj.weight"]
    save_file(ema, str(path / "ema.safetensors"))
    with pytest.raises(ConfigError, match="mlp_moe_gen.down_proj.weight"):
        load_bagel(path)
    (path / "vit_config.json").unlink()
    with pytest.raises(ConfigError, match="vit_config.json"):
        BagelConfig.from_dir(path)
