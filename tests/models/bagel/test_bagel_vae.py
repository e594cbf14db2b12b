"""The FLUX VAE against diffusers' AutoencoderKL, which reads ae.safetensors's FLUX names itself."""

from __future__ import annotations

import pytest
import torch

from walkserve.models.bagel.latents import latent_image, latent_tokens
from walkserve.models.bagel.vae import posterior_noise, to_uint8

pytestmark = pytest.mark.parity
GEN = torch.Generator().manual_seed(13)


def _rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@torch.no_grad()
def test_encoder_samples_the_posterior_like_diffusers(parts, oracle):
    image = torch.rand(3, 48, 64, generator=GEN) * 2 - 1  # H 48, W 64: a 3 x 4 token grid
    eps = torch.randn(16, 6, 8, generator=GEN)
    want = oracle.vae_tokens(image, eps)
    got = parts.vae_encoder.forward_items([{"image": image, "eps": eps}])[0]["latents"]
    assert got.shape == (12, 64) and _rel(got, want) < 1e-4
    # seeded: the same noise as diffusers' latent_dist.sample(generator) with that seed
    post = oracle.vae().encode(image[None]).latent_dist
    sample = post.sample(generator=torch.Generator().manual_seed(42))
    seeded = parts.vae_encoder.forward_items([{"image": image, "seed": torch.tensor(42)}])[0]["latents"]
    torch.testing.assert_close(seeded, latent_tokens((sample[0] - 0.1159) * 0.3611, 2), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(posterior_noise((16, 6, 8), 42), torch.randn(1, 16, 6, 8, generator=torch.Generator().manual_seed(42))[0])


@torch.no_grad()
def test_batched_items_keep_their_own_noise(parts):
    images = [torch.rand(3, 32, 32, generator=GEN) * 2 - 1 for _ in range(2)]
    batch = parts.vae_encoder.forward_items([{"image": images[0], "seed": torch.tensor(1)},
                                             {"image": images[1], "seed": torch.tensor(2)}])
    alone = parts.vae_encoder.forward_items([{"image": images[1], "seed": torch.tensor(2)}])
    torch.testing.assert_close(batch[1]["latents"], alone[0]["latents"], rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_decoder_matches_diffusers(parts, oracle):
    tokens = torch.randn(12, 64, generator=GEN)
    z = latent_image(tokens, 3, 4, 2)  # [16, 6, 8]
    want = oracle.vae().decode(z[None] / 0.3611 + 0.1159).sample  # [1, 3, 48, 64]
    got = parts.vae_decoder.decode(z[None])
    assert _rel(got, want) < 1e-4
    image = parts.vae_decoder.forward_items([{"latents": tokens, "grid": torch.tensor([3, 4])}])[0]["image"]
    assert image.dtype == torch.uint8 and image.shape == (48, 64, 3)
    torch.testing.assert_close(image, to_uint8(want)[0], rtol=0, atol=1)


def test_latent_tokens_are_row_col_channel_patches():
    z = torch.arange(2 * 4 * 6, dtype=torch.float32).reshape(2, 4, 6)  # C 2, H 4, W 6
    tokens = latent_tokens(z, 2)
    assert tokens.shape == (6, 8)
    # token (row 1, col 2) holds z[c, 2 + p, 4 + q] in (p, q, c) order
    want = [z[c, 2 + p, 4 + q].item() for p in range(2) for q in range(2) for c in range(2)]
    assert tokens[1 * 3 + 2].tolist() == want
    torch.testing.assert_close(latent_image(tokens, 2, 3, 2), z, rtol=0, atol=0)


def test_uint8_conversion_truncates_like_the_release():
    x = torch.tensor([-1.5, -1.0, 0.0, 0.999, 2.0]).view(1, 1, 1, 5).expand(1, 3, 1, 5)
    assert to_uint8(x)[0, 0, :, 0].tolist() == [0, 0, 127, 254, 255]
