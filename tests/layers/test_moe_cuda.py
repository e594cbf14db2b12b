"""The MoE's CUDA path (torch grouped_mm, bf16): same function as the CPU path, and capturable in a CUDA graph.

Runs only where a CUDA device is present (skipped on the CPU machines).
"""

from __future__ import annotations

import pytest
import torch

from walkserve.layers.moe import SparseMoE, _grouped_mm_supported

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
D, INTER, E, K = 256, 128, 32, 4


def _layer() -> SparseMoE:
    moe = SparseMoE(D, INTER, E, K, True)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return moe


def test_cuda_grouped_path_matches_the_cpu_function():
    cpu = _layer()
    gpu = _layer().to("cuda", torch.bfloat16)
    assert _grouped_mm_supported(torch.empty(1, D, device="cuda", dtype=torch.bfloat16), gpu.experts.gate_up)
    x = torch.randn(37, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = cpu(x)
        got = gpu(x.to("cuda", torch.bfloat16)).float().cpu()
    assert float((got - want).abs().max() / want.abs().max()) < 3e-2


def test_moe_replays_from_a_cuda_graph():
    moe = _layer().to("cuda", torch.bfloat16)
    static = torch.randn(8, D, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            moe(static)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moe(static)
        fresh = torch.randn(8, D, device="cuda", dtype=torch.bfloat16)
        static.copy_(fresh)
        graph.replay()
        torch.testing.assert_close(out, moe(fresh), rtol=0, atol=0)
