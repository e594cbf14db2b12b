"""Input images as the release prepares them, and the component builders."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from walkserve.engines.spec import BuildContext
from walkserve.models.bagel.components import build_latents, build_lm, build_vae_encoder, build_vit
from walkserve.models.bagel.preprocess import image_inputs, pixels, to_rgb
from walkserve.models.bagel.sizes import ResizeRule


def test_edit_inputs_are_vae_resized_then_vit_resized_from_that():
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 500, 3), dtype=np.uint8))
    vae, vit = image_inputs(image, ResizeRule(128, 64, 16), ResizeRule(112, 28, 14))
    assert vae.shape == (3, 80, 128) and vit.shape == (3, 70, 112)
    assert vae.dtype == torch.float32 and vae.min() >= -1.0 and vae.max() <= 1.0
    resized = image.resize((128, 80), Image.BICUBIC)
    torch.testing.assert_close(vae, torch.from_numpy(np.asarray(resized, np.float32) / 127.5 - 1).permute(2, 0, 1))


def test_transparency_goes_on_white():
    rgba = Image.new("RGBA", (4, 4), (10, 20, 30, 0))
    assert to_rgb(rgba).getpixel((0, 0)) == (255, 255, 255)
    assert pixels(to_rgb(rgba))[:, 0, 0].tolist() == [1.0, 1.0, 1.0]


def test_builders_load_their_own_part(tiny_dir, parts):
    ctx = BuildContext(rank=0, device="cpu", dtype="float32")
    lm = build_lm(ctx, tiny_dir)
    assert torch.equal(lm.lm_head.weight, parts.lm.lm_head.weight)
    vit = build_vit(ctx, tiny_dir, side_dtype="float32").vit
    assert torch.equal(vit.connector.fc1.weight, parts.vit.connector.fc1.weight)
    assert build_vae_encoder(ctx, tiny_dir, side_dtype="float32").encoder.config == parts.config.vae
    latents = build_latents(ctx, tiny_dir, side_dtype="bfloat16")
    assert hasattr(latents, "forward_batch") and latents.latents.vae2llm.weight.dtype == torch.bfloat16
    bf16 = build_lm(BuildContext(rank=0, device="cpu", dtype="bfloat16"), tiny_dir)
    assert bf16.lm_head.weight.dtype == torch.bfloat16
