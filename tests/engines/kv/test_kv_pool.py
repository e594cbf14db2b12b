"""KVPool geometry, sizing and block copies."""

from __future__ import annotations

import pytest
import torch

from walkserve.engines.kv.kv_pool import KVPool, KVPoolShape, pool_blocks
from walkserve.placement.memory import DEFAULT_CPU_KV_BYTES

SHAPE = KVPoolShape(num_layers=2, num_kv_heads=3, head_dim=4, block_size=5, dtype=torch.bfloat16)


def test_geometry_and_sizing():
    assert SHAPE.bytes_per_block == 2 * 2 * 5 * 3 * 4 * 2
    assert pool_blocks(SHAPE, torch.device("cpu"), num_blocks=7, kv_bytes=10**9) == 7  # an explicit count wins
    assert pool_blocks(SHAPE, torch.device("cpu"), None, kv_bytes=3 * SHAPE.bytes_per_block + 1) == 3
    assert pool_blocks(SHAPE, torch.device("cpu"), None, None) == DEFAULT_CPU_KV_BYTES // SHAPE.bytes_per_block
    pool = KVPool(SHAPE, 6, "cpu")
    assert pool.k.shape == pool.v.shape == (2, 6, 5, 3, 4) and pool.k.dtype == torch.bfloat16
    assert pool.nbytes == 6 * SHAPE.bytes_per_block


def test_copy_blocks_copies_every_layer_of_k_and_v():
    pool = KVPool(SHAPE, 6, "cpu")
    pool.k.copy_(torch.randn(pool.k.shape))
    pool.v.copy_(torch.randn(pool.v.shape))
    k0, v0 = pool.k.clone(), pool.v.clone()
    pool.copy_blocks([(1, 4), (2, 0)])
    assert torch.equal(pool.k[:, 4], k0[:, 1]) and torch.equal(pool.v[:, 0], v0[:, 2])
    untouched = [1, 2, 3, 5]
    assert torch.equal(pool.k[:, untouched], k0[:, untouched])
    pool.copy_blocks([])


def test_a_pool_without_blocks_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one block"):
        KVPool(SHAPE, 0, "cpu")


def test_on_cuda_the_pool_takes_the_placement_checks_figure(monkeypatch):
    """The engine sizes its pool with the function the memory check counts with (free memory injected)."""
    from walkserve.placement.memory import default_kv_bytes

    free = 37 * 2**30 + 12345
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * 2**30))
    blocks = pool_blocks(SHAPE, torch.device("cuda:0"), None, None)
    assert blocks == default_kv_bytes("cuda:0", free) // SHAPE.bytes_per_block
