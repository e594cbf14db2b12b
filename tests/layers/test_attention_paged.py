"""Paged attention (PyTorch path) against dense causal attention, on random block tables and mixed batches."""

from __future__ import annotations

import random

import pytest
import torch

from walkserve.core.errors import ConfigError
from walkserve.layers.attention import DenseCausalAttention
from walkserve.layers.paged_attention import PagedBatch
from walkserve.layers.paged_backends import (
    TorchPagedBackend,
    flashinfer_available,
    make_paged_backend,
)

HQ, HKV, DH, BS, NUM_BLOCKS, LAYERS = 4, 2, 8, 4, 40, 2
SCALE = DH**-0.5


def _pool(dtype=torch.float32, device="cpu"):
    shape = (LAYERS, NUM_BLOCKS, BS, HKV, DH)
    return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)


def _random_tables(rng: random.Random, lengths: list[int]) -> list[list[int]]:
    """Disjoint random block tables (any order), with a spare block or two at the end of some."""
    ids = list(range(NUM_BLOCKS))
    rng.shuffle(ids)
    tables = []
    for length in lengths:
        n = -(-length // BS) + rng.randrange(2)
        tables.append([ids.pop() for _ in range(n)])
    return tables


def _slot(table: list[int], position: int) -> int:
    return table[position // BS] * BS + position % BS


def _dense(q, k, v):
    return DenseCausalAttention().forward(0, q, k, v, SCALE)


def _check_batch(seqs: list[tuple[int, int]], seed: int, dtype=torch.float32, device="cpu", backend=None):
    """Sequences (cached prefix, new tokens): prefix KV written straight into the pool, new ones by the context."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    k_cache, v_cache = _pool(dtype, device)
    tables = _random_tables(rng, [p + n for p, n in seqs])
    full = [[torch.randn(p + n, h, DH, generator=gen) for h in (HQ, HKV, HKV)] for p, n in seqs]
    for layer in range(LAYERS):
        for (prefix, _), table, (_, k, v) in zip(seqs, tables, full):
            for pos in range(prefix):
                s = _slot(table, pos)
                k_cache[layer].view(-1, HKV, DH)[s] = (k[pos] * (layer + 1)).to(dtype)
                v_cache[layer].view(-1, HKV, DH)[s] = (v[pos] * (layer + 1)).to(dtype)
    batch = PagedBatch([n for _, n in seqs], [p + n for p, n in seqs], tables, BS)
    attn = (backend or TorchPagedBackend()).context(k_cache, v_cache, batch)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for layer in range(LAYERS):  # each layer reads its own slice of the pool
        new = [[t[p:] * (layer + 1) for t in qkv] for (p, _), qkv in zip(seqs, full)]
        q, k, v = (torch.cat([s[i] for s in new]).to(device, dtype) for i in range(3))
        out = attn.forward(layer, q, k, v, SCALE).float().cpu()
        row = 0
        for (prefix, n), (fq, fk, fv) in zip(seqs, full):
            want = _dense(fq * (layer + 1), fk * (layer + 1), fv * (layer + 1))[prefix:]
            torch.testing.assert_close(out[row : row + n], want, atol=tol, rtol=tol)
            row += n
    for (prefix, n), table, (_, k, _) in zip(seqs, tables, full):  # the new k landed in its slots
        for pos in range(prefix, prefix + n):
            got = k_cache[LAYERS - 1].view(-1, HKV, DH)[_slot(table, pos)].float().cpu()
            torch.testing.assert_close(got, k[pos] * LAYERS, atol=tol, rtol=tol)


def test_mixed_batch_of_prefills_chunks_and_decodes():
    _check_batch([(0, 5), (7, 1), (3, 1), (12, 6), (0, 1), (9, 3), (4, 4)], seed=0)


@pytest.mark.parametrize("seed", range(6))
def test_random_mixes_match_dense(seed):
    rng = random.Random(100 + seed)
    seqs = [(rng.choice([0, rng.randrange(1, 20)]), rng.choice([1, 1, rng.randrange(1, 12)])) for _ in range(6)]
    _check_batch(seqs, seed=seed)


def test_decode_only_batch_with_very_different_lengths():
    _check_batch([(0, 1), (30, 1), (15, 1), (3, 1)], seed=7)


def test_prefill_only_batch_without_cached_prefix():
    _check_batch([(0, 9), (0, 2), (0, 13)], seed=8)


def test_bfloat16_pool():
    _check_batch([(6, 1), (0, 7), (5, 4)], seed=9, dtype=torch.bfloat16)


def test_chunked_prefill_through_the_context_equals_one_dense_pass():
    """A 19-token sequence computed as chunks 8 + 8 + 3 through the pool equals dense attention."""
    gen = torch.Generator().manual_seed(3)
    k_cache, v_cache = _pool()
    table = [11, 2, 30, 7, 19]
    q, k, v = (torch.randn(19, h, DH, generator=gen) for h in (HQ, HKV, HKV))
    outs = []
    for start, end in [(0, 8), (8, 16), (16, 19)]:
        ctx = TorchPagedBackend().context(k_cache, v_cache, PagedBatch([end - start], [end], [table], BS))
        outs.append(ctx.forward(0, q[start:end], k[start:end], v[start:end], SCALE))
    torch.testing.assert_close(torch.cat(outs), _dense(q, k, v), atol=1e-5, rtol=1e-5)


def test_batch_rejects_inconsistent_lengths():
    with pytest.raises(AssertionError):
        PagedBatch([3], [2], [[0]], BS)  # more new tokens than the sequence holds
    with pytest.raises(AssertionError):
        PagedBatch([1], [9], [[0, 1]], BS)  # 9 tokens need 3 blocks of 4


def test_backend_registry():
    assert isinstance(make_paged_backend("torch", "cpu"), TorchPagedBackend)
    assert isinstance(make_paged_backend("auto", "cpu"), TorchPagedBackend)
    assert not flashinfer_available(torch.device("cpu"))
    assert not flashinfer_available(torch.device("cuda"), torch.float32)  # FlashInfer has no fp32 KV
    assert not flashinfer_available(torch.device("cuda"), torch.bfloat16, head_dim=32)  # FA2 tiles: multiples of 64
    with pytest.raises(ConfigError, match="flashinfer"):
        make_paged_backend("flashinfer", "cpu")
    with pytest.raises(ConfigError, match="unknown attention backend"):
        make_paged_backend("nope", "cpu")


# FlashInfer against this path, per operation and mask (head dim 64): tests/gpu/test_gpu_attention.py.
