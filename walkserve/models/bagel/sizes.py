"""Image sizes as BAGEL's release resizes them (torch-free): long side at most ``max_size``, short side at
least ``min_size``, both multiples of ``stride``, at most ``max_pixels``.

    VAE  (generation and edit inputs): long <= 1024, short >= 512, stride 16
    ViT  (understanding and edit):     long <= 980,  short >= 224, stride 14

An edited image is first VAE-resized; its ViT input is that image resized
again by the ViT rule, and the output keeps the VAE-resized size.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_PIXELS = 14 * 14 * 9 * 1024


@dataclass(frozen=True)
class ResizeRule:
    max_size: int
    min_size: int
    stride: int
    max_pixels: int = MAX_PIXELS

    def fit(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after the release's resize (Python ``round``, as it uses)."""
        scale = min(self.max_size / max(width, height), 1.0)
        scale = max(scale, self.min_size / min(width, height))
        w, h = self._scaled(width, height, scale)
        if w * h > self.max_pixels:
            w, h = self._scaled(w, h, self.max_pixels / (w * h))
        if max(w, h) > self.max_size:
            w, h = self._scaled(w, h, self.max_size / max(w, h))
        return w, h

    def _scaled(self, width: int, height: int, scale: float) -> tuple[int, int]:
        return self._divisible(round(width * scale)), self._divisible(round(height * scale))

    def _divisible(self, value: float) -> int:
        return max(self.stride, int(round(value / self.stride) * self.stride))


VAE_RESIZE = ResizeRule(1024, 512, 16)
VIT_RESIZE = ResizeRule(980, 224, 14)
