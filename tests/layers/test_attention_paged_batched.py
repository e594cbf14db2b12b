"""Paged attention (PyTorch path): multi-row appends of equal shape run as one batched SDPA call.

A CEM step appends one step (P rows, mask full) to each of K candidate contexts forked from one prefix;
equal prefills do the same. Those run batched, with their blocks read as a view of the pool when a
table is consecutive ids. Each must equal its sequence attended alone (prefix visible, the chunk under
its mask), whatever the grouping.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from walkserve.layers.paged_attention import PagedBatch, chunk_mask
from walkserve.layers.paged_backends import TorchPagedBackend

HQ, HKV, DH, BS, NUM_BLOCKS, LAYERS = 4, 2, 8, 6, 64, 2
SCALE = DH**-0.5


def _reference(q, k, v, prefix: int, mask: str, frame: int) -> torch.Tensor:
    """q [n, Hq, Dh] over k, v [prefix + n, Hkv, Dh]: the prefix visible, the chunk under ``mask``."""
    n = q.shape[0]
    inner = chunk_mask(mask, n, frame, q.device)
    allowed = torch.ones(n, prefix + n, dtype=torch.bool)
    if inner is not None:
        allowed[:, prefix:] = inner
    g = HQ // HKV
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.repeat_interleave(g, 1).transpose(0, 1),
                                         v.repeat_interleave(g, 1).transpose(0, 1), attn_mask=allowed, scale=SCALE)
    return out.transpose(0, 1)  # [n, Hq, Dh]


def _tables(rng: random.Random, lengths: list[int], consecutive: bool) -> list[list[int]]:
    ids = list(range(NUM_BLOCKS))
    if not consecutive:
        rng.shuffle(ids)
    out = []
    for length in lengths:
        out.append(ids[: -(-length // BS)])
        ids = ids[-(-length // BS):]
    return out


def _run(seqs: list[tuple[int, int, str, int]], seed: int, consecutive: bool) -> tuple[int, int]:
    """Sequences (prefix, rows, mask, frame) in one batch against each alone; returns (batched calls, singles)."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    shape = (LAYERS, NUM_BLOCKS, BS, HKV, DH)
    k_cache, v_cache = torch.zeros(shape), torch.zeros(shape)
    tables = _tables(rng, [p + n for p, n, _, _ in seqs], consecutive)
    full = [[torch.randn(p + n, h, DH, generator=gen) for h in (HQ, HKV, HKV)] for p, n, _, _ in seqs]
    for layer in range(LAYERS):
        for (prefix, *_), table, (_, k, v) in zip(seqs, tables, full):
            for pos in range(prefix):
                slot = table[pos // BS] * BS + pos % BS
                k_cache[layer].view(-1, HKV, DH)[slot] = k[pos] * (layer + 1)
                v_cache[layer].view(-1, HKV, DH)[slot] = v[pos] * (layer + 1)
    batch = PagedBatch([n for _, n, _, _ in seqs], [p + n for p, n, _, _ in seqs], tables, BS,
                       [m for *_, m, _ in seqs], [f for *_, f in seqs])
    attn = TorchPagedBackend().context(k_cache, v_cache, batch)
    for layer in range(LAYERS):
        scaled = [[t * (layer + 1) for t in qkv] for qkv in full]
        q, k, v = (torch.cat([s[i][p:] for (p, *_), s in zip(seqs, scaled)]) for i in range(3))
        out = attn.forward(layer, q, k, v, SCALE)
        row = 0
        for (prefix, n, mask, frame), (fq, fk, fv) in zip(seqs, scaled):
            want = _reference(fq[prefix:], fk, fv, prefix, mask, frame)
            torch.testing.assert_close(out[row : row + n], want, atol=1e-5, rtol=1e-5)
            row += n
    return len(attn.batched), len(attn.others)


@pytest.mark.parametrize("consecutive", [True, False])
def test_candidate_steps_of_one_prefix_run_batched(consecutive):
    """K candidates, each one full-mask step of P = BS rows after a 2-step prefix (whole blocks: no mask)."""
    calls, singles = _run([(2 * BS, BS, "full", 0)] * 5, seed=1, consecutive=consecutive)
    assert (calls, singles) == (1, 0)


def test_block_causal_prefills_and_padded_prefixes_run_batched():
    """Equal block-causal prefills (masked), appends whose prefixes differ within one block count, and
    a lone causal chunk beside them: grouped by shape, each equal to its sequence alone."""
    seqs = [(0, 3 * BS, "block_causal", BS)] * 3 + [(BS, 4, "full", 0), (BS + 1, 4, "full", 0)]
    seqs += [(3, 5, "causal", 0)]
    calls, singles = _run(seqs, seed=2, consecutive=False)
    assert (calls, singles) == (2, 1)


def test_flashinfer_serves_a_cem_step_over_shared_prefix_blocks():
    """K candidates forked from one prefix read the same prefix blocks and append to their own: the FlashInfer
    backend (over the CPU stand-in with FlashInfer's semantics) equals the PyTorch path, which batches them."""
    from tests.layers import fake_flashinfer
    from walkserve.layers.flashinfer_attention import FlashInferBackend

    gen = torch.Generator().manual_seed(7)
    prefix = [10, 11]  # two whole steps, shared
    tables = [prefix + [20 + k] for k in range(5)]
    batch = PagedBatch([BS] * 5, [3 * BS] * 5, tables, BS, ["full"] * 5, [0] * 5)
    base = torch.randn(2, LAYERS, NUM_BLOCKS, BS, HKV, DH, generator=gen)
    torch_pool, fi_pool = (base[0].clone(), base[1].clone()), (base[0].clone(), base[1].clone())
    ours = TorchPagedBackend().context(*torch_pool, batch)
    assert len(ours.batched) == 1 and not ours.others
    theirs = FlashInferBackend(torch.device("cpu"), module=fake_flashinfer).context(*fi_pool, batch)
    for layer in range(LAYERS):
        q, k, v = (torch.randn(5 * BS, h, DH, generator=gen) for h in (HQ, HKV, HKV))
        torch.testing.assert_close(theirs.forward(layer, q, k, v, SCALE), ours.forward(layer, q, k, v, SCALE),
                                   atol=1e-5, rtol=1e-5)
    assert torch.equal(torch_pool[0], fi_pool[0]) and torch.equal(torch_pool[1], fi_pool[1])
