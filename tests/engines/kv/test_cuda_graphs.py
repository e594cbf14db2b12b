"""CUDA-graph decode bookkeeping on the CPU: buckets, padding, static buffers, eager fallback, invalidation.

``FakeGraphs`` stands in for ``CudaGraphs``: capture records the function
without running it (as CUDA capture records kernels) and a replay re-runs it,
so a replay reads only what is in the static buffers: a step whose inputs were
not copied in, or whose attention was not re-planned, comes out wrong here too.
"""

from __future__ import annotations

import pytest
import torch

from tests.engines.kv.kv_driver import Generation, drive, firing
from tests.layers import fake_flashinfer
from walkserve.core.errors import ConfigError
from walkserve.core.options import KVOptions, engine_options
from walkserve.engines.kv.cuda_graphs import DecodeGraphs
from walkserve.engines.kv.engine import KVCacheEngine
from walkserve.layers.flashinfer_attention import FlashInferBackend


class FakeGraphs:
    def __init__(self):
        self.captures = 0
        self.replays = 0

    def capture(self, fn):
        self.captures += 1

        def replay():
            self.replays += 1
            fn()

        return replay


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _engine(model, fake=None, **kw):
    return KVCacheEngine("lm", model, "cpu", torch.float32,
                         KVOptions(block_size=4, num_blocks=96, max_batch_tokens=64, cuda_graphs=fake is not None,
                                   **kw),
                         graph_capture=fake)


def _greedy_run(engine, prompts, steps):
    """Prefill each prompt (joining one step apart), then greedy decodes until ``steps`` tokens each; the tokens."""
    gens = [Generation(f"r{i}", p, steps, join_step=i) for i, p in enumerate(prompts)]
    drive(engine, gens)
    return [g.tokens for g in gens]


def test_graph_decodes_equal_eager_decodes_and_reuse_their_buckets(tiny_lm):
    prompts = [_prompt(n, 10 + n) for n in (3, 9, 14)]
    eager = _greedy_run(_engine(tiny_lm), prompts, 6)
    fake = FakeGraphs()
    engine = _engine(tiny_lm, fake, cuda_graph_sizes=[1, 2, 4])
    assert _greedy_run(engine, prompts, 6) == eager
    graphs = engine.runner.graphs
    assert set(graphs.captured) <= {("lm", 1, 1), ("lm", 1, 2), ("lm", 1, 4)}
    assert fake.captures == len(graphs.captured) == graphs.stats["captures"]
    assert graphs.stats["replays"] == fake.replays > fake.captures  # buckets replayed, not re-captured
    assert engine.stats()["cuda_graph_replays"] == fake.replays


def test_static_buffers_are_reused_and_padding_touches_only_the_spare_block(tiny_lm):
    fake = FakeGraphs()
    engine = _engine(tiny_lm, fake, cuda_graph_sizes=[4])
    gens = [Generation(f"r{i}", _prompt(5 + i, i), 3) for i in range(3)]  # 3 rows in a bucket of 4
    drive(engine, gens)
    graphs = engine.runner.graphs
    (entry,) = graphs.captured.values()
    ptrs = (entry.ids.data_ptr(), entry.positions.data_ptr(), entry.hidden.data_ptr(), entry.attn.slots.data_ptr())
    pool = engine.pool
    assert pool.sink == pool.num_blocks and pool.k.shape[1] == pool.num_blocks + 1
    pool.k[:, pool.sink] = 123.0  # what padded rows of earlier steps wrote there gets overwritten again
    before = pool.k.clone()
    engine.submit(firing("r0", [7]))
    engine.submit(firing("r1", [8]))
    engine.step()  # 2 rows padded to 4
    changed = (pool.k != before).flatten(2).any(-1).any(0).nonzero().flatten().tolist()  # blocks written
    owners = {engine.block_manager.table(("r0", "main"))[-1], engine.block_manager.table(("r1", "main"))[-1]}
    assert set(changed) <= owners | {pool.sink} and pool.sink in changed
    assert ptrs == (entry.ids.data_ptr(), entry.positions.data_ptr(), entry.hidden.data_ptr(),
                    entry.attn.slots.data_ptr())
    assert fake.captures == 1


def test_steps_a_graph_cannot_take_run_eagerly(tiny_lm):
    fake = FakeGraphs()
    engine = _engine(tiny_lm, fake, cuda_graph_sizes=[1, 2])
    engine.submit(firing("a", _prompt(6, 1)))  # a prefill chunk: eager
    engine.step()
    assert fake.captures == 0 and engine.runner.graphs.stats["replays"] == 0
    for i in range(3):  # three decodes > the largest bucket: eager
        engine.submit(firing(f"b{i}", _prompt(3, i)))
    engine.step()
    for i in range(3):
        engine.submit(firing(f"b{i}", [5]))
    engine.step()
    assert fake.captures == 0 and engine.runner.graphs.stats["eager"] >= 1
    graphs = DecodeGraphs(engine.runner.backend, engine.pool, (1, 2), max_blocks=1, graphs=fake)
    engine.runner.graphs = graphs
    engine.submit(firing("b0", [6]))  # its context spans 2 blocks > max_blocks 1: eager
    engine.step()
    assert graphs.stats == {"replays": 0, "captures": 0, "eager": 1, "invalidations": 0}


def test_new_pool_storage_drops_every_graph(tiny_lm):
    fake = FakeGraphs()
    engine = _engine(tiny_lm, fake, cuda_graph_sizes=[1])
    drive(engine, [Generation("r", _prompt(4, 3), 2)])
    assert fake.captures == 1
    engine.pool.k, engine.pool.v = engine.pool.k.clone(), engine.pool.v.clone()  # storage moved
    drive(engine, [Generation("s", _prompt(4, 4), 2)])
    graphs = engine.runner.graphs
    assert graphs.stats["invalidations"] == 1 and fake.captures == 2
    assert graphs.captured[("lm", 1, 1)].attn.k_cache.data_ptr() == engine.pool.k.data_ptr()


def test_flashinfer_graph_decodes_equal_torch_eager(tiny_lm):
    """The FlashInfer static decode (over the stand-in) inside fake graphs gives the eager PyTorch tokens."""
    prompts = [_prompt(n, 30 + n) for n in (2, 7, 11, 4, 9)]
    eager = _greedy_run(_engine(tiny_lm), prompts, 5)
    engine = _engine(tiny_lm, FakeGraphs(), cuda_graph_sizes=[2, 8])
    backend = FlashInferBackend(torch.device("cpu"), module=fake_flashinfer)
    engine.runner.backend = backend
    engine.runner.graphs = DecodeGraphs(backend, engine.pool, (2, 8), graphs=FakeGraphs())
    assert _greedy_run(engine, prompts, 5) == eager
    assert engine.runner.graphs.stats["replays"] > 0


def test_the_option_is_checked_and_needs_cuda(tiny_lm):
    opts = engine_options("kv", "lm", {"cuda_graphs": True, "cuda_graph_sizes": [1, 8]})
    assert opts.cuda_graphs and opts.cuda_graph_sizes == [1, 8]
    with pytest.raises(ConfigError, match="cuda_graph_sizes"):
        engine_options("kv", "lm", {"cuda_graph_sizes": [0]})
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        KVCacheEngine("lm", tiny_lm, "cpu", torch.float32, KVOptions(num_blocks=8, cuda_graphs=True))
    graphs = _engine(tiny_lm, FakeGraphs(), max_running=4).runner.graphs
    assert graphs.sizes == (1, 2, 4) and graphs.bucket(3) == 4 and graphs.bucket(5) is None


class _AxesModel(torch.nn.Module):
    """A one-layer stand-in whose output depends on ids, every position axis and the attention over the pool."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 8)

    def forward(self, ids, positions, attn):
        x = self.embed(ids)  # [T, 8]
        pos = positions.float() if positions.dim() == 1 else positions.float().sum(0) + positions[1].float()
        q = (x + pos[:, None]).view(-1, 2, 4)  # [T, Hq 2, Dh 4]
        return attn.forward(0, q, q[:, :1], q[:, 1:], 0.5).reshape(-1, 8) + pos[:, None]  # [T, 8]


@torch.no_grad()
def test_each_position_layout_gets_its_own_graph_and_replays_what_eager_computes():
    from walkserve.engines.kv.kv_pool import KVPool, KVPoolShape
    from walkserve.layers.paged_attention import PagedBatch
    from walkserve.layers.paged_backends import TorchPagedBackend

    model, fake = _AxesModel(), FakeGraphs()
    pool = KVPool(KVPoolShape(1, 1, 4, 4, torch.float32), 16, "cpu", spare=True)
    graphs = DecodeGraphs(TorchPagedBackend(), pool, (2, 4), graphs=fake)
    batch = PagedBatch([1, 1, 1], [3, 6, 1], [[0], [1, 2], [3]], 4)
    ids = torch.tensor([5, 9, 11])
    for positions in (torch.tensor([2, 5, 0]), torch.tensor([[2, 5, 0], [1, 1, 0], [0, 3, 0]])):
        eager_pool = (pool.k.clone(), pool.v.clone())
        want = model(ids, positions, TorchPagedBackend().context(*eager_pool, batch))
        got = graphs.run("m", model, batch, ids, positions)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert sorted(graphs.captured) == [("m", 1, 4), ("m", 3, 4)] and fake.captures == 2
    assert graphs.captured[("m", 3, 4)].positions.shape == (3, 4)
