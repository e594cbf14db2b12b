"""FlashInfer's step metadata (CSR page lists, masks, row sets) and the backend's passes, on the CPU.

The backend runs here over ``fake_flashinfer`` (FlashInfer's documented
semantics in plain torch) and must equal the PyTorch paged path on random
batches that mix decodes, prefill chunks with a cached prefix, every mask kind
and queries over several contexts; the static decode contexts a CUDA graph
captures must equal it too, across re-plans of the same buffers.
"""

from __future__ import annotations

import random

import pytest
import torch

from tests.layers import fake_flashinfer
from walkserve.layers.flashinfer_attention import FlashInferBackend
from walkserve.layers.flashinfer_plan import plan_step
from walkserve.layers.graph_attention import TorchGraphDecode
from walkserve.layers.paged_attention import PagedBatch, chunk_mask
from walkserve.layers.paged_backends import TorchPagedBackend

HQ, HKV, DH, BS, BLOCKS, LAYERS = 4, 2, 8, 4, 64, 2
SCALE = DH**-0.5


def _backend() -> FlashInferBackend:
    return FlashInferBackend(torch.device("cpu"), module=fake_flashinfer)


def test_appends_become_one_csr_pass():
    batch = PagedBatch([1, 5], [6, 9], [[3, 7], [1, 2, 5, 11]], BS)
    p = plan_step(batch)
    a = p.appends
    assert p.cached is None and p.own is None
    assert (a.qo_indptr, a.kv_indptr, a.kv_indices, a.last_page_len) == ([0, 1, 6], [0, 2, 5], [3, 7, 1, 2, 5], [2, 1])
    assert a.causal and a.mask is None and not a.decode and a.kv_lens(BS) == [6, 9]
    decode = plan_step(PagedBatch([1, 1], [4, 5], [[9], [2, 8]], BS)).appends
    assert decode.decode and decode.last_page_len == [4, 1]


def test_mask_kinds_choose_the_flag_or_a_flat_custom_mask():
    full = plan_step(PagedBatch([3, 2], [7, 2], [[0, 1], [2]], BS, ["full", "full"], [0, 0])).appends
    assert not full.causal and full.mask is None
    mixed = PagedBatch([4, 2], [10, 3], [[0, 1, 2], [3]], BS, ["block_causal", "causal"], [2, 0])
    a = plan_step(mixed).appends
    want = []
    for i in range(2):
        n, kv = mixed.query_lens[i], mixed.kv_lens[i]
        inner = chunk_mask(mixed.mask(i), n, mixed.frames[i], torch.device("cpu"))
        want.append(torch.cat([torch.ones(n, kv - n, dtype=torch.bool), inner], 1).reshape(-1))
    assert not a.causal and torch.equal(a.mask, torch.cat(want))
    rows = a.mask[: 4 * 10].view(4, 10)
    assert rows[0].tolist() == [True] * 8 + [False, False] and rows[2].tolist() == [True] * 10  # frames of 2


def test_a_query_reads_several_contexts_and_hides_the_padding_between_them():
    reads = [([4, 8], 5), ([9], 3)]
    batch = PagedBatch([1, 2], [3, 8], [[6], []], BS, ["causal", "full"], [0, 0], [None, reads])
    p = plan_step(batch)
    assert p.appends.rows == [0] and p.appends.decode
    c = p.cached
    assert (c.kv_indptr, c.kv_indices, c.last_page_len, c.rows) == ([0, 3], [4, 8, 9], [3], [1, 2])
    assert c.mask.view(2, 11)[0].tolist() == [True] * 5 + [False] * 3 + [True] * 3  # slots 5..7 of block 8 unused
    assert p.own.indptr == [0, 2] and not p.own.causal and p.own.mask is None and p.merge == [0, 1]
    empty = plan_step(PagedBatch([2], [0], [[]], BS, ["causal"], [0], [[([], 0)]]))
    assert empty.cached is None and empty.merge == [] and empty.own.causal


def _random_batch(rng: random.Random) -> tuple[PagedBatch, int]:
    """Appends (any prefix, any mask) and queries over 1-3 disjoint contexts; returns (batch, appended rows)."""
    ids = list(range(BLOCKS))
    rng.shuffle(ids)
    take = lambda n: [ids.pop() for _ in range(-(-n // BS))]  # noqa: E731
    q_lens, kv_lens, tables, masks, frames, reads = [], [], [], [], [], []
    for _ in range(rng.randrange(1, 6)):
        kind = rng.choice(["causal", "causal", "full", "block_causal"])
        frame = rng.choice([1, 2, 3])
        n = frame * rng.randrange(1, 4) if kind == "block_causal" else rng.choice([1, 1, rng.randrange(1, 9)])
        if rng.random() < 0.3:  # a query
            ctx = [rng.randrange(0, 11) for _ in range(rng.randrange(1, 4))]
            read = [(take(m), m) for m in ctx]
            q_lens.append(n), kv_lens.append(sum(ctx)), tables.append([]), reads.append(read)
        else:
            prefix = rng.choice([0, rng.randrange(1, 14)])
            q_lens.append(n), kv_lens.append(prefix + n), tables.append(take(prefix + n)), reads.append(None)
        masks.append(kind), frames.append(frame if kind == "block_causal" else 0)
    queries = any(r is not None for r in reads)
    return PagedBatch(q_lens, kv_lens, tables, BS, masks, frames, reads if queries else None), sum(q_lens)


@pytest.mark.parametrize("seed", range(10))
def test_flashinfer_passes_equal_the_torch_path_on_random_mixes(seed):
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    batch, rows = _random_batch(rng)
    base = torch.randn(2, LAYERS, BLOCKS, BS, HKV, DH, generator=gen)
    pools = {name: (base[0].clone(), base[1].clone()) for name in ("torch", "flashinfer")}
    contexts = {"torch": TorchPagedBackend().context(*pools["torch"], batch),
                "flashinfer": _backend().context(*pools["flashinfer"], batch)}
    for layer in range(LAYERS):
        q, k, v = (torch.randn(rows, h, DH, generator=gen) for h in (HQ, HKV, HKV))
        want = contexts["torch"].forward(layer, q, k, v, SCALE)
        got = contexts["flashinfer"].forward(layer, q, k, v, SCALE)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(pools["torch"], pools["flashinfer"]):  # the same slots were written
        assert torch.equal(a, b)


def test_each_role_is_planned_once_per_step_and_run_once_per_layer():
    backend = _backend()
    reads = [([4, 8], 5)]
    batch = PagedBatch([2, 3], [6, 5], [[1, 2], []], BS, ["full", "causal"], [0, 0], [None, reads])
    k_cache, v_cache = torch.randn(2, LAYERS, BLOCKS, BS, HKV, DH)
    ctx = backend.context(k_cache, v_cache, batch)
    for layer in range(LAYERS):
        ctx.forward(layer, torch.randn(5, HQ, DH), torch.randn(5, HKV, DH), torch.randn(5, HKV, DH), SCALE)
    calls = {name: w.calls for name, w in backend._wrappers.items()}
    assert calls == {name: {"plan": 1, "run": LAYERS} for name in ("prefill", "cached", "ragged")}


@pytest.mark.parametrize("graph", ["torch", "flashinfer"])
def test_static_decode_contexts_equal_eager_decodes_across_replans(graph):
    """One static context, prepared for two different batches in turn (buffer reuse), equals a fresh eager one."""
    gen = torch.Generator().manual_seed(5)
    base = torch.randn(2, LAYERS, BLOCKS, BS, HKV, DH, generator=gen)
    eager_pool, graph_pool = (base[0].clone(), base[1].clone()), (base[0].clone(), base[1].clone())
    make = TorchGraphDecode if graph == "torch" else (lambda k, v, s, m: _backend().graph_decode(k, v, s, m))
    static = make(*graph_pool, 3, 6)
    for batch in (PagedBatch([1, 1, 1], [5, 1, 17], [[3, 9], [11], [20, 21, 22, 23, 24]], BS),
                  PagedBatch([1, 1, 1], [2, 24, 8], [[30], [1, 2, 4, 5, 6, 7], [40, 41]], BS)):
        static.prepare(batch)
        eager = TorchPagedBackend().context(*eager_pool, batch)
        for layer in range(LAYERS):
            q, k, v = (torch.randn(3, h, DH, generator=gen) for h in (HQ, HKV, HKV))
            torch.testing.assert_close(static.forward(layer, q, k, v, SCALE), eager.forward(layer, q, k, v, SCALE),
                                       atol=1e-5, rtol=1e-5)
    assert torch.equal(eager_pool[0], graph_pool[0]) and torch.equal(eager_pool[1], graph_pool[1])


def test_static_decode_refuses_what_it_was_not_sized_for():
    static = TorchGraphDecode(*torch.zeros(2, LAYERS, BLOCKS, BS, HKV, DH), 2, 2)
    with pytest.raises(AssertionError):
        static.prepare(PagedBatch([1], [3], [[1]], BS))  # one row for a graph of two
    with pytest.raises(AssertionError):
        static.prepare(PagedBatch([1, 1], [3, 9], [[1], [2, 3, 4]], BS))  # 3 blocks > 2
