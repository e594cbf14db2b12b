"""ImageFeatureCache: SigLIP features of recent camera images, keyed by the image's content.

A robot whose camera has not changed between two chunks (a fixed exterior view
of a still scene, the same observation asked again) sends the same pixels;
each image goes through SigLIP on its own (no attention across images), so its
features can be taken from here instead of computed. The key is a 128-bit digest
of the image's dtype, shape and bytes (``request.image_digest``): any changed
pixel misses. Least recently used entries go first; ``capacity`` 0 disables it.
"""

from __future__ import annotations

import torch

from walkserve.models.common.feature_cache import FeatureCache
from walkserve.models.pi0.request import image_digest


class ImageFeatureCache(FeatureCache):
    @staticmethod
    def key(image: torch.Tensor) -> tuple[int, int]:
        """The content key of a camera image [H, W, 3] (on the CPU, as the request brought it)."""
        return image_digest(image.numpy())
