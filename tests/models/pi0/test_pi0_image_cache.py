"""The vision component's feature cache: an image seen before, byte for byte, is not encoded again."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from walkserve.engines.spec import Batch
from walkserve.models.pi0.components import build_component
from walkserve.models.pi0.request import pack_images


def _images(seed: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (28, 24 + 2 * i, 3), dtype=np.uint8) for i in range(n)]


def _item(images: list[np.ndarray]) -> dict:
    flat, shapes = pack_images(tuple(images))
    return {"images": flat, "image_shapes": shapes}


@pytest.fixture
def encoder(tiny_pi05):
    """The tiny vision component with a 3-image cache; ``encoder.encoded`` counts the images the tower ran on."""
    vision = build_component("vision", tiny_pi05.path, "cpu", None, image_cache=3)
    vision.encoded = []
    tower = vision.forward
    vision.forward = lambda pixels: (vision.encoded.append(pixels.shape[0]), tower(pixels))[1]
    return vision


def _run(encoder, *items: list[np.ndarray]) -> list[torch.Tensor]:
    return [out["image_embeds"] for out in encoder.forward_batch(Batch.of([_item(i) for i in items]))]


def test_seen_images_are_looked_up_and_give_the_same_features(encoder, tiny_pi05):
    a, b = _images(0, 2), _images(1, 1)
    first = _run(encoder, a, b)
    assert encoder.encoded == [3]
    changed = [a[0].copy(), a[1]]
    changed[0][2, 3, 0] ^= 1  # one pixel of the first camera
    again = _run(encoder, a, changed)
    assert encoder.encoded == [3, 1]  # only the changed camera runs
    torch.testing.assert_close(again[0], first[0], rtol=0, atol=0)
    per_image = again[1].shape[0] // 2
    torch.testing.assert_close(again[1][per_image:], first[0][per_image:], rtol=0, atol=0)  # a[1] from the cache
    uncached = build_component("vision", tiny_pi05.path, "cpu", None)
    want = uncached.forward_batch(Batch.of([_item(changed)]))[0]["image_embeds"]
    torch.testing.assert_close(again[1], want, rtol=1e-5, atol=1e-5)


def test_the_least_recently_used_image_goes_first(encoder):
    a, b, c, d = (_images(s, 1) for s in range(4))
    _run(encoder, a, b, c)
    _run(encoder, a)  # a is the most recent now; b the least
    _run(encoder, d)  # evicts b
    assert len(encoder.cache) == 3
    encoder.encoded.clear()
    _run(encoder, a, c, d)
    assert encoder.encoded == []
    _run(encoder, b)
    assert encoder.encoded == [1]


def test_no_cache_encodes_every_time(tiny_pi05):
    vision = build_component("vision", tiny_pi05.path, "cpu", None)
    a = _images(0, 2)
    first, again = (vision.forward_batch(Batch.of([_item(a)]))[0]["image_embeds"] for _ in range(2))
    assert len(vision.cache) == 0
    torch.testing.assert_close(first, again)
