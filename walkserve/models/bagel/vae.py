"""BAGEL's VAE as two stateless components: ``VaeEncoder`` (image -> latent tokens) and ``VaeDecoder``.

    encode:  image [3, H, W] in [-1, 1] -> moments -> z = mean + exp(logvar / 2) * eps     (the posterior
             is *sampled*: eps ~ N(0, 1) from the item's seed, or given)
             -> z' = (z - shift) * scale -> latent tokens [(H/16)(W/16), 64]
    decode:  tokens -> z' [16, H/8, W/8] -> z'/scale + shift -> decoder -> x in [-1, 1]
             -> uint8 [H, W, 3] = floor(clamp(x/2 + 1/2, 0, 1) * 255)

Items of one size run as one batch; each item's noise comes from its own
generator (drawn on the CPU, so every device samples the same latents).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from walkserve.models.bagel.config import FluxAEConfig
from walkserve.models.bagel.flux_ae import FluxDecoder, FluxEncoder
from walkserve.models.bagel.latents import latent_image, latent_tokens


def posterior_noise(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """eps [*shape] of one image's posterior sample, from a CPU generator seeded with ``seed``."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(int(seed)))


class VaeEncoder:
    """Inputs per item: ``image`` float [3, H, W] in [-1, 1] (H, W multiples of 16) and ``seed`` int64 [],
    or ``eps`` [16, H/8, W/8] instead of the seed. Output: ``latents`` [(H/16)(W/16), 64]."""

    def __init__(self, encoder: FluxEncoder, config: FluxAEConfig, latent_patch: int = 2):
        self.encoder, self.config, self.patch = encoder, config, latent_patch

    @torch.no_grad()
    def encode(self, images: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """images [B, 3, H, W], eps [B, z, H/8, W/8] -> scaled, shifted latents z' [B, z, H/8, W/8]."""
        weight = self.encoder.conv_in.weight
        moments = self.encoder(images.to(weight.device, weight.dtype)).float()  # [B, 2z, h, w]
        mean, logvar = moments.chunk(2, dim=1)
        z = mean + torch.exp(0.5 * logvar) * eps.to(mean.device, mean.dtype)  # [B, z, h, w]
        return (z - self.config.shift_factor) * self.config.scale_factor

    def forward_items(self, inputs: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        out: list[dict[str, torch.Tensor]] = [{} for _ in inputs]
        for rows in _by_shape(inputs, "image").values():
            images = torch.stack([inputs[i]["image"] for i in rows])  # [B, 3, H, W]
            eps = torch.stack([self._eps(inputs[i], images.shape[2:]) for i in rows])  # [B, z, h, w]
            z = self.encode(images, eps)
            for row, i in enumerate(rows):
                out[i] = {"latents": latent_tokens(z[row], self.patch)}  # [h*w/4, 64]
        return out

    def _eps(self, item: dict[str, torch.Tensor], size: torch.Size) -> torch.Tensor:
        d = self.config.downsample
        shape = (self.config.z_channels, size[0] // d, size[1] // d)
        if "eps" in item:
            return item["eps"].reshape(shape)
        return posterior_noise(shape, int(item["seed"]))


class VaeDecoder:
    """Inputs per item: ``latents`` [h*w, 64] and ``grid`` int64 [2] = (h, w) tokens.
    Output: ``image`` uint8 [16h, 16w, 3]."""

    def __init__(self, decoder: FluxDecoder, config: FluxAEConfig, latent_patch: int = 2):
        self.decoder, self.config, self.patch = decoder, config, latent_patch

    @torch.no_grad()
    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Scaled latents z' [B, z, h, w] -> x [B, 3, 8h, 8w] (float32, nominally [-1, 1])."""
        weight = self.decoder.conv_in.weight
        z = z.float() / self.config.scale_factor + self.config.shift_factor
        return self.decoder(z.to(weight.device, weight.dtype)).float()

    def forward_items(self, inputs: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        out: list[dict[str, torch.Tensor]] = [{} for _ in inputs]
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i, item in enumerate(inputs):
            groups[tuple(int(v) for v in item["grid"])].append(i)
        for (h, w), rows in groups.items():
            z = torch.stack([latent_image(inputs[i]["latents"], h, w, self.patch) for i in rows])  # [B, z, 2h, 2w]
            pixels = to_uint8(self.decode(z))  # [B, H, W, 3]
            for row, i in enumerate(rows):
                out[i] = {"image": pixels[row]}
        return out


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    """x [B, 3, H, W] in [-1, 1] -> uint8 [B, H, W, 3] as the release converts (truncating)."""
    return ((x * 0.5 + 0.5).clamp(0, 1) * 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def _by_shape(inputs: list[dict[str, torch.Tensor]], key: str) -> dict[tuple[int, ...], list[int]]:
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, item in enumerate(inputs):
        groups[tuple(item[key].shape)].append(i)
    return groups
