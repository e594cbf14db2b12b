"""BAGEL's NaViT ViT against transformers' SiglipVisionModel on the same (converted) weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from walkserve.models.bagel.vit import conv_to_linear_patch_weight, linear_to_conv_patch_weight

pytestmark = pytest.mark.parity
GEN = torch.Generator().manual_seed(11)


def _rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@torch.no_grad()
def test_square_full_grid_matches_siglip_vision_model(parts, oracle):
    """At the full square grid HF's position ids 0..N-1 are BAGEL's row * side + col."""
    m = oracle.siglip()
    size = m.config.image_size
    pixels = torch.rand(1, 3, size, size, generator=GEN) * 2 - 1
    want = m(pixel_values=pixels).last_hidden_state[0]  # [side², D_vit]
    patches, ids = parts.vit.patches(pixels[0])
    got = parts.vit.vit_model(patches, ids, [ids.numel()])
    assert _rel(got, want) < 1e-4


@torch.no_grad()
def test_packed_non_square_images_match_block_diagonal_reference(parts, oracle):
    """Two native-aspect images in one call (varlen), through the connector and vit_pos_embed."""
    p = parts.config.vit.patch_size
    images = [torch.rand(3, 3 * p, 5 * p, generator=GEN) * 2 - 1, torch.rand(3, 6 * p, 2 * p, generator=GEN) * 2 - 1]
    want = oracle.vit_rows(images)
    got = parts.vit.forward_items([{"pixels": img} for img in images])
    assert [g["embeds"].shape[0] for g in got] == [15, 12]
    assert _rel(torch.cat([g["embeds"] for g in got]), want) < 1e-4
    alone = parts.vit.forward_items([{"pixels": images[1]}])[0]["embeds"]
    torch.testing.assert_close(alone, got[1]["embeds"], rtol=1e-5, atol=1e-5)


def test_position_ids_index_rows_of_seventy_not_of_the_image_width(parts):
    side = parts.config.vit_max_num_patch_per_side
    p = parts.config.vit.patch_size
    _, ids = parts.vit.patches(torch.zeros(3, 2 * p, 3 * p))
    assert ids.tolist() == [0, 1, 2, side, side + 1, side + 2]
    with pytest.raises(ValueError, match="patches a side"):
        parts.vit.patches(torch.zeros(3, (side + 1) * p, p))


def test_released_linear_patch_embedding_converts_to_the_tower_layout(parts, ema):
    """The Linear [D, P*P*C] over (row, col, channel) patches equals the tower's conv weight over (c, row, col)."""
    stored = ema["vit_model.vision_model.embeddings.patch_embedding.weight"]
    p = parts.config.vit.patch_size
    conv = parts.vit.vit_model.embeddings.patch_embedding.weight
    torch.testing.assert_close(conv, linear_to_conv_patch_weight(stored, 3, p), rtol=0, atol=0)
    torch.testing.assert_close(conv_to_linear_patch_weight(conv), stored, rtol=0, atol=0)
    img = torch.rand(3, p, p, generator=GEN)
    released = F.linear(img.permute(1, 2, 0).reshape(1, -1), stored)  # BAGEL's (row, col, channel) patchify
    ours = F.conv2d(img[None], conv)[:, :, 0, 0]
    torch.testing.assert_close(ours, released, rtol=1e-5, atol=1e-5)
