"""KV contexts on CUDA: the PyTorch path on the GPU equals the CPU engine; FlashInfer runs every operation as it does."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.engines.kv.contexts_ref import firing, run
from walkserve.core.options import KVOptions
from walkserve.engines.kv.engine import KVCacheEngine
from walkserve.graph.kv import ALL, append, fork, kv_params, query
from walkserve.layers.paged_backends import flashinfer_available

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _cfg_outputs(model, device: str, attention: str = "torch", dtype=torch.float32) -> list[torch.Tensor]:
    """Text, an image block at one position, a fork, then query passes over both contexts."""
    gen = torch.Generator().manual_seed(0)
    d = model.config.hidden_size
    engine = KVCacheEngine("lm", model, device, dtype,
                           KVOptions(block_size=4, num_blocks=64, attention=attention, seed=0))
    outs = []
    steps = [
        [firing("r", kv_params(append("gen", rows=ALL)), {"tokens": torch.randint(3, 500, (7,), generator=gen)})],
        [firing("r", kv_params(fork("gen", "cfg"), append("gen", mask="full", rows=ALL)),
                {"embeds": torch.randn(6, d, generator=gen), "positions": torch.full((6,), 7)})],
    ]
    for _ in range(3):
        latents = torch.randn(5, d, generator=gen)
        steps.append([firing("r", kv_params(query(name, mask="full", rows=ALL)),
                             {"embeds": latents, "positions": torch.full((5,), 8)}) for name in ("gen", "cfg")])
    for fs in steps:
        results = run(engine, fs)
        outs += [results[f.id]["hidden"].float().cpu() for f in fs]
    return outs


def test_cuda_torch_path_equals_the_cpu_engine(tiny_lm):
    cpu = _cfg_outputs(tiny_lm, "cpu")
    gpu = _cfg_outputs(copy.deepcopy(tiny_lm).cuda(), "cuda")
    for a, b in zip(cpu, gpu):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not flashinfer_available(torch.device("cuda"), torch.bfloat16), reason="needs flashinfer")
def test_flashinfer_engine_runs_queries_and_full_masks_as_the_torch_path(tmp_path):
    from walkserve.models.llama.tiny import write_tiny
    from walkserve.models.llama.weights import load_causal_lm

    path = write_tiny("llama", tmp_path / "hd64", init_std=0.1, head_dim=64)  # FlashInfer's head dims: multiples of 64
    model = load_causal_lm(path, device="cuda", dtype="bfloat16", progress=False)
    torch_path = _cfg_outputs(model, "cuda", "torch", torch.bfloat16)
    flashinfer = _cfg_outputs(model, "cuda", "flashinfer", torch.bfloat16)
    for a, b in zip(torch_path, flashinfer):
        torch.testing.assert_close(b, a, atol=3e-2, rtol=3e-2)
