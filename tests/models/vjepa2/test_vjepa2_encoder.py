"""The V-JEPA 2 encoder and masked predictor against transformers' VJEPA2Model (at crop_size²) and the released
code (cc-vjepa2) at other sizes; the 3-D RoPE layout; preprocessing; the stateless component."""

from __future__ import annotations

import pytest
import torch

from walkserve.engines.spec import Batch
from walkserve.models.vjepa2.encoder_component import EncoderComponent
from walkserve.models.vjepa2.preprocess import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ac_frame_pixels,
    video_pixels,
)
from walkserve.models.vjepa2.rollout import normalize_features
from walkserve.models.vjepa2.rope3d import Rope3D, part_dim
from walkserve.models.vjepa2.weights import load_encoder, load_masked_predictor

TOL = 1e-4


@pytest.fixture(scope="module")
def hf(hf_dir):
    from transformers import VJEPA2Model

    return VJEPA2Model.from_pretrained(hf_dir, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def ours(hf_dir):
    return load_encoder(hf_dir), load_masked_predictor(hf_dir)


def test_encoder_matches_transformers_at_crop_size(hf, ours):
    x = torch.randn(2, 4, 3, 64, 64, generator=torch.Generator().manual_seed(0))  # HF layout [B, T, C, H, W]
    with torch.inference_mode():
        want = hf(x, skip_predictor=True).last_hidden_state  # [2, 32, 128]
        got = ours[0](x.permute(0, 2, 1, 3, 4))
    assert got.shape == want.shape == (2, 32, 128)
    assert (got - want).abs().max() <= TOL and want.std() > 0.5


def test_masked_predictor_matches_transformers(hf, ours):
    x = torch.randn(1, 4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    ctx = torch.tensor([[0, 3, 5, 7, 9, 11, 13, 20, 25, 30]])  # unsorted mixtures, both frames
    tgt = torch.tensor([[31, 1, 2, 4, 6, 8, 17, 18, 19]])
    with torch.inference_mode():
        want = hf(x, context_mask=[ctx], target_mask=[tgt]).predictor_output.last_hidden_state  # [1, 9, 128]
        features = ours[0](x.permute(0, 2, 1, 3, 4))
        got = ours[1](features[:, ctx[0]], ctx, tgt)
    assert got.shape == want.shape == (1, 9, 128)
    assert (got - want).abs().max() <= TOL and want.std() > 0.3


@pytest.mark.parametrize("size", [(64, 96), (96, 96), (48, 64)])
def test_encoder_matches_released_code_off_the_crop_grid(released, size):
    x = torch.randn(1, 3, 4, *size, generator=torch.Generator().manual_seed(2))  # [B, C, T, H, W]
    with torch.inference_mode():
        want = released.upstream_encoder(x)
        got = released.encoder(x)
    assert got.shape == want.shape
    assert (got - want).abs().max() <= TOL and want.std() > 0.5


def test_rope_parts_and_tiled_layout():
    assert (part_dim(64), part_dim(80), part_dim(32)) == (20, 26, 10)
    rope = Rope3D(64)
    cos, sin = rope.cos_sin(torch.tensor([[3], [5], [7]]))  # one token at (t=3, row=5, col=7)
    freqs = 1.0 / 10000 ** (torch.arange(10) / 10)
    for part, pos in enumerate((3, 5, 7)):
        block = slice(20 * part, 20 * (part + 1))
        assert torch.allclose(cos[0, block], torch.cat([pos * freqs, pos * freqs]).cos())  # tiled, not per pair
    assert torch.equal(cos[0, 60:], torch.ones(4)) and torch.equal(sin[0, 60:], torch.zeros(4))  # unrotated tail


def test_video_preprocessing_resizes_short_side_and_crops_center():
    frames = torch.zeros(2, 80, 120, 3, dtype=torch.uint8)
    frames[:, :, 60:] = 255  # right half white
    pixels = video_pixels(frames, crop=64)  # short side 80 -> 73, long 120 -> 109, crop 64 in the middle
    assert pixels.shape == (3, 2, 64, 64)
    red = pixels[0, 0]
    black, white = -IMAGENET_MEAN[0] / IMAGENET_STD[0], (1 - IMAGENET_MEAN[0]) / IMAGENET_STD[0]
    assert torch.allclose(red[:, 0], torch.full((64,), black), atol=1e-5)
    assert torch.allclose(red[:, -1], torch.full((64,), white), atol=1e-5)
    assert abs(int((red > 0).sum(1)[0]) - 32) <= 1  # the edge sits in the middle of the crop


def test_ac_frames_take_the_whole_square_frame():
    g = torch.Generator().manual_seed(3)
    frames = torch.randint(0, 256, (3, 64, 64, 3), generator=g, dtype=torch.uint8)
    pixels = ac_frame_pixels(frames, crop=64)  # same size: only the normalisation
    mean, std = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    assert torch.allclose(pixels, (frames.permute(0, 3, 1, 2) / 255.0 - mean) / std, atol=1e-5)
    wide = torch.cat([frames, frames[:, :, :32]], dim=2)  # 64 x 96: the released fallback is the central square
    assert torch.allclose(ac_frame_pixels(wide, crop=64), ac_frame_pixels(wide[:, :, 16:80], crop=64), atol=1e-5)


def test_encoder_component_batches_and_matches_direct_calls(released):
    g = torch.Generator().manual_seed(4)
    video = torch.randint(0, 256, (4, 64, 80, 3), generator=g, dtype=torch.uint8)
    image = torch.randint(0, 256, (1, 64, 64, 3), generator=g, dtype=torch.uint8)
    enc = released.encoder
    component = EncoderComponent(enc, "video")
    out = component.forward_batch(Batch.of([{"video": video}, {"video": image}, {"video": video}]))
    with torch.inference_mode():
        direct = enc(video_pixels(video, 64)[None])[0]
        single = enc(video_pixels(image, 64).expand(-1, 2, -1, -1)[None])[0]
    assert out[0]["features"].shape == (32, 128) and out[1]["features"].shape == (16, 128)
    assert torch.allclose(out[0]["features"], direct, atol=1e-5) and torch.equal(out[0]["features"], out[2]["features"])
    assert torch.allclose(out[1]["features"], single, atol=1e-5)
    frames = EncoderComponent(enc, "ac_frames").forward_batch(Batch.of([{"video": video}]))[0]["features"]
    with torch.inference_mode():  # the released rollout's encode(): each frame alone, repeated to a tubelet
        clips = ac_frame_pixels(video, 64)[:, :, None].repeat(1, 1, 2, 1, 1)  # [T, 3, 2, 64, 64]
        want = normalize_features(released.upstream_encoder(clips))  # [T, 16, 128]
    assert frames.shape == (4, 16, 128) and (frames - want).abs().max() <= TOL
    with pytest.raises(ValueError, match="multiple of the tubelet"):
        component.forward_batch(Batch.of([{"video": video[:3]}]))
