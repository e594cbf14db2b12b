"""FlashInfer against the PyTorch paged path on the GPU, one test per operation and mask, on the same tiny data;
CUDA-graph decode against eager through the engine.

Head dim 64, block size 16, bf16: the shapes the LM benchmark uses, so one
FlashInfer JIT module serves the tests and the benchmark.
"""

from __future__ import annotations

import copy
import time

import pytest
import torch

from walkserve.core.options import KVOptions
from walkserve.engines.kv.engine import KVCacheEngine
from walkserve.layers.flashinfer_attention import FlashInferBackend
from walkserve.layers.paged_attention import PagedBatch
from walkserve.layers.paged_backends import TorchPagedBackend

HQ, HKV, DH, BS, BLOCKS, LAYERS = 8, 2, 64, 16, 48, 2
SCALE = DH**-0.5
ATTN_LIMIT = 2e-2  # bf16 outputs of size ~1: both sides round to 8 significant bits

CASES = {  # name -> (query_lens, kv_lens, tables, masks, frames, reads)
    "decode": ([1, 1, 1], [1, 17, 40], [[0], [1, 2], [3, 4, 5]], None, None, None),
    "prefill_causal": ([7, 20, 1], [7, 33, 18], [[6], [7, 8, 9], [10, 11]], None, None, None),
    "prefill_full": ([6, 9], [6, 25], [[12], [13, 14]], ["full", "full"], [0, 0], None),
    "prefill_block_causal": ([8, 12], [8, 28], [[15], [16, 17]], ["block_causal"] * 2, [4, 3], None),
    "mixed_masks": ([1, 5, 8], [9, 21, 8], [[18], [19, 20], [21]], ["causal", "full", "block_causal"], [0, 0, 2],
                    None),
    "query_one_read": ([5], [19], [[]], ["full"], [0], [[([22, 23], 19)]]),
    "query_reads_padded": ([4, 3], [43, 5], [[], []], ["causal", "full"], [0, 0],
                           [[([24, 25], 21), ([26], 5), ([27, 28], 17)], [([29], 5)]]),
    "appends_and_queries": ([1, 6, 4], [30, 6, 26], [[30, 31], [32], []], ["causal", "full", "full"], [0, 0, 0],
                            [None, None, [([33, 34], 26)]]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_flashinfer_equals_the_torch_path(case, device, flashinfer_module, parity):
    q_lens, kv_lens, tables, masks, frames, reads = CASES[case]
    batch = PagedBatch(q_lens, kv_lens, tables, BS, masks, frames, reads)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(len(case))
    base = torch.randn(2, LAYERS, BLOCKS, BS, HKV, DH, generator=gen).to(device, dtype)
    pools = [(base[0].clone(), base[1].clone()) for _ in range(2)]
    ref = TorchPagedBackend().context(*pools[0], batch)
    fi = FlashInferBackend(device, module=flashinfer_module).context(*pools[1], batch)
    for layer in range(LAYERS):
        q, k, v = (torch.randn(batch.num_tokens, h, DH, generator=gen).to(device, dtype) for h in (HQ, HKV, HKV))
        want = ref.forward(layer, q, k, v, SCALE)
        got = fi.forward(layer, q, k, v, SCALE)
        parity(f"attention {case} layer {layer}", got, want, dtype, ATTN_LIMIT)
    assert torch.equal(pools[0][0], pools[1][0]) and torch.equal(pools[0][1], pools[1][1])  # same slots written


def _decode_engine(model, device, dtype, attention, graphs: bool, capture=None):
    return KVCacheEngine("lm", model, device, dtype,
                         KVOptions(block_size=BS, num_blocks=256, max_batch_tokens=512, attention=attention,
                                   cuda_graphs=graphs, cuda_graph_sizes=[1, 2, 4, 8, 16]),
                         graph_capture=capture)


def _decode_logits(engine, batch: int, steps: int, seed: int = 0):
    """Prefill ``batch`` prompts, then ``steps`` decode steps of all of them; logits of every decode, and step times."""
    from tests.engines.kv.kv_driver import firing

    gen = torch.Generator().manual_seed(seed)
    for i in range(batch):
        engine.submit(firing(f"r{i}", torch.randint(3, 400, (5 + 3 * i,), generator=gen).tolist(), ("token",)))
    while engine.has_work():
        engine.step()
    logits, times = [], []
    token = torch.randint(3, 400, (batch,), generator=gen).tolist()
    for _ in range(steps):
        for i in range(batch):
            engine.submit(firing(f"r{i}", [token[i]], ("logits",)))
        t0 = time.perf_counter()
        results = sorted(engine.step(), key=lambda r: int(r.firing.request_id[1:]))
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        assert len(results) == batch
        logits.append(torch.stack([r.outputs["logits"].float().cpu() for r in results]))
        token = [int(x.argmax()) for x in logits[-1]]
    return torch.stack(logits), times


@pytest.mark.parametrize("attention,dtype", [("torch", torch.float32), ("flashinfer", torch.bfloat16)])
def test_cuda_graph_decode_equals_eager_and_reports_its_speed_up(attention, dtype, device, gpu_lm, parity, record,
                                                                  request):
    from tests.engines.kv.test_cuda_graphs import FakeGraphs

    flashinfer_module = request.getfixturevalue("flashinfer_module") if attention == "flashinfer" else None

    capture = FakeGraphs() if device.type == "cpu" else None
    if device.type == "cpu":
        dtype = torch.float32
    model = copy.deepcopy(gpu_lm).to(device, dtype)
    for batch in (1, 4, 16):
        eager_engine = _decode_engine(model, device, dtype, "torch", False)
        graph_engine = _decode_engine(model, device, dtype, "torch", True, capture)
        if attention == "flashinfer":
            for e in (eager_engine, graph_engine):
                e.runner.backend = FlashInferBackend(device, module=flashinfer_module)
            graph_engine.runner.graphs.backend = graph_engine.runner.backend
        eager, t_eager = _decode_logits(eager_engine, batch, 12)
        graphed, t_graph = _decode_logits(graph_engine, batch, 12)
        assert graph_engine.runner.graphs.stats["replays"] == 12
        parity(f"graph vs eager decode logits, {attention}, batch {batch}", graphed, eager, dtype,
               1e-4 if dtype == torch.float32 else 1e-2)
        assert torch.equal(graphed.argmax(-1), eager.argmax(-1)) or dtype != torch.float32
        e_ms, g_ms = sorted(t_eager[2:])[len(t_eager[2:]) // 2] * 1e3, sorted(t_graph[2:])[len(t_graph[2:]) // 2] * 1e3
        record(kind="cuda_graph_speedup", attention=attention, dtype=str(dtype), batch=batch,
               eager_step_ms=e_ms, graph_step_ms=g_ms, speedup=e_ms / g_ms)


@pytest.fixture(scope="module")
def gpu_lm(tmp_path_factory):
    """A small Llama (head dim 64, GQA 8/2): one step is launch-bound, as decode on a GPU is."""
    from walkserve.models.llama.tiny import write_tiny
    from walkserve.models.llama.weights import load_causal_lm

    path = write_tiny("llama", tmp_path_factory.mktemp("gpu_lm"), init_std=0.05, vocab_size=512, hidden_size=256,
                      intermediate_size=512, num_hidden_layers=4, num_attention_heads=HQ, num_key_value_heads=HKV,
                      head_dim=DH, max_position_embeddings=1024)
    return load_causal_lm(path, progress=False)
