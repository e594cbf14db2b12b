"""Media content keys are 128 bits wide: two media inputs whose digests agree in 64 bits still get other keys.

A 63- or 64-bit media digest collides after about 2**32 tries (birthday), so a client could build two inputs with
one key and have the prefix cache (or an encoder's feature cache) hand whoever sends the second the first one's
answer. ``collide_in_64_bits`` stands for such a pair: every BLAKE2b digest made while it is on has the same first 8 bytes,
so a key of 64 bits or fewer is equal for every input; the keys must still differ, and nothing may be shared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tests.models.common.colliding import collide_in_64_bits
from walkserve.engines.kv.block_manager import BlockManager
from walkserve.engines.kv.ops import bind
from walkserve.engines.kv.scheduler import Scheduler, SchedulerConfig
from walkserve.graph.kv import append, kv_params
from walkserve.models.pi0.image_cache import ImageFeatureCache
from walkserve.models.pi0.request import PreparedRequest, walk_inputs
from walkserve.models.qwen3_omni.thinker.content_keys import audio_window_keys

P = 4  # rows per image


@dataclass
class FakeFiring:
    name: str
    outputs: tuple[str, ...] = ()


def _image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)


def _pi0_inputs(image: np.ndarray) -> dict[str, torch.Tensor]:
    """pi0's prefix walk inputs for one camera and a 3-token prompt, as the lm's bind takes them."""
    inputs = walk_inputs(PreparedRequest([5, 6, 7], ("base_0_rgb",), (image,), None, None), P)
    return {"tokens": torch.from_numpy(inputs["tokens"]), "embed_rows": torch.from_numpy(inputs["embed_rows"]),
            "content": torch.from_numpy(inputs["content"]), "embeds": torch.zeros(P, 2)}


def _prefix_hits(params: dict, *requests: dict[str, torch.Tensor]) -> int:
    """Rows taken from the prefix cache when the requests' appends run one after another on one engine."""
    s = Scheduler(BlockManager(64, 4), SchedulerConfig(200, 8))
    for i, inputs in enumerate(requests):
        (op,) = bind("lm", params, inputs)
        s.context((f"r{i}", op.context)).append(FakeFiring(f"r{i}"), op.token_ids.tolist(), op)
        s.finish(s.schedule())
    return s.prefix_hit_tokens


PI0_PREFIX = kv_params(append("prefix", mask="full", content="content"))


def test_pi0_images_equal_in_64_bits_share_no_prefix(monkeypatch):
    collide_in_64_bits(monkeypatch)
    a, b = _pi0_inputs(_image(0)), _pi0_inputs(_image(1))
    assert _prefix_hits(PI0_PREFIX, a, b) == 0
    assert not torch.equal(a["content"][:P], b["content"][:P])
    assert _prefix_hits(PI0_PREFIX, a, _pi0_inputs(_image(0))) == 4  # the same image still hits (all but the last rows)
    assert ImageFeatureCache.key(torch.from_numpy(_image(0))) != ImageFeatureCache.key(torch.from_numpy(_image(1)))


def _audio_inputs(mel: np.ndarray, window: int) -> dict[str, torch.Tensor]:
    """A causal keyed append: 2 text rows, the clip's rows (one per window, its window's key, as ``content_keys``
    lays them out), 7 text rows, at running positions."""
    keys = np.asarray(audio_window_keys(mel, window), np.int64)
    text = np.zeros((1, *keys.shape[1:]), np.int64)
    content = np.concatenate([text, text, keys, *[text] * 7])
    n, m = len(content), len(keys)
    return {"tokens": torch.tensor([1, 2] + [9] * m + [3] * 7), "positions": torch.arange(n).expand(3, n),
            "embeds": torch.zeros(m, 2), "embed_rows": torch.arange(2, 2 + m), "content": torch.from_numpy(content)}


def test_audio_windows_equal_in_64_bits_share_no_prefix(monkeypatch):
    """Clips that differ in their last window only, of one row (the shortest part a clip has): the blocks before
    it are shared, those from it on are not."""
    collide_in_64_bits(monkeypatch)
    mel = np.random.default_rng(0).standard_normal((4, 12)).astype(np.float32)
    other = mel.copy()
    other[:, 8:] += 1  # the third window (frames 8..11): prompt row 4
    params = kv_params(append("main", content="content"))
    a, b = _audio_inputs(mel, 4), _audio_inputs(other, 4)  # 12 rows: blocks [0, 4) [4, 8) [8, 12)
    assert _prefix_hits(params, a, b) == 4  # block 0 only: block 1 holds the differing window's row
    assert _prefix_hits(params, a, a) == 8  # all but the last block (its last row is computed)
    assert audio_window_keys(mel, 4)[:2] == audio_window_keys(other, 4)[:2]
    assert audio_window_keys(mel, 4)[2] != audio_window_keys(other, 4)[2]
