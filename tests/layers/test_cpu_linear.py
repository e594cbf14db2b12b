"""``linear``: the oneDNN, chunked float32 and upcast bf16 CPU paths equal F.linear up to summation order."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from walkserve.layers import cpu_linear
from walkserve.layers.cpu_linear import CHUNK_ELEMS, linear
from walkserve.layers.linear import Linear

K = 512
N = 2 * CHUNK_ELEMS // K + 300  # large enough to be chunked, with a partial last chunk


def _case(dtype: torch.dtype, rows: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, K, generator=gen).to(dtype)
    w = (torch.randn(N, K, generator=gen) * 0.05).to(dtype)
    b = torch.randn(N, generator=gen).to(dtype)
    return x, w, b


@pytest.mark.parametrize("kernel", cpu_linear.KERNELS)
@pytest.mark.parametrize("rows", [1, 3, 4, 16, 64, 65])
def test_float32_matches_f_linear(rows, kernel):
    x, w, b = _case(torch.float32, rows)
    w = nn.Parameter(w, requires_grad=False)  # "packed" packs parameters only
    with cpu_linear.use_kernel(kernel):
        got = linear(x, w, b)
    assert got.dtype == torch.float32 and got.shape == (rows, N)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_packed_copy_is_rebuilt_when_the_weight_changes():
    x, w, b = _case(torch.float32, 16)
    w = nn.Parameter(w, requires_grad=False)
    with cpu_linear.use_kernel("packed"):
        first = linear(x, w, b)
        packed = cpu_linear._packed(w)
        assert cpu_linear._packed(w) is packed  # reused while the weight is unchanged
        with torch.no_grad():
            w.mul_(2)  # a loader writing new values in place
        second = linear(x, w, b)
        assert cpu_linear._packed(w) is not packed
    torch.testing.assert_close(second - b, 2 * (first - b), rtol=1e-5, atol=1e-4)
    key = id(w)
    del w
    assert key not in cpu_linear._PACKED  # dropped with its weight
    with torch.inference_mode():
        w = nn.Parameter(_case(torch.float32, 1)[1], requires_grad=False)  # no version counter: never cached
        with cpu_linear.use_kernel("packed"):
            torch.testing.assert_close(linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
    assert id(w) not in cpu_linear._PACKED


def test_use_kernel_selects_and_restores(monkeypatch):
    x, w, _ = _case(torch.float32, 3)  # below the chunked path: "mkl" is plain F.linear
    real, calls = F.linear, []
    monkeypatch.setattr(F, "linear", lambda *a: calls.append(1) or real(*a))
    before = cpu_linear.KERNEL
    with cpu_linear.use_kernel("mkl"):
        assert cpu_linear.KERNEL == "mkl" and not cpu_linear._onednn(x, w)
        linear(x, w)
    assert before == cpu_linear.KERNEL and calls == [1]
    if cpu_linear._HAVE_ONEDNN:
        with cpu_linear.use_kernel("onednn"):
            linear(x, w)
        assert calls == [1]  # oneDNN, not F.linear


@pytest.mark.parametrize("rows", [1, 4, 16, 200])
def test_bfloat16_is_as_accurate_as_the_native_kernel(rows):
    x, w, b = _case(torch.bfloat16, rows, seed=1)
    exact = F.linear(x.double(), w.double(), b.double())  # [M, N]
    got, native = linear(x, w, b), F.linear(x, w, b)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, N)
    # both round an fp32-accumulated result to bf16: the same error bound (half a bf16 ulp plus summation order)
    bound = (native.double() - exact).abs().max().item()
    assert (got.double() - exact).abs().max().item() <= 1.05 * bound
    assert (got.double() - native.double()).abs().max().item() <= 2 * bound


def test_leading_dims_and_no_bias():
    x, w, _ = _case(torch.bfloat16, 12, seed=2)
    x3 = x.view(3, 4, K)
    torch.testing.assert_close(linear(x3, w), linear(x, w).view(3, 4, N), rtol=0, atol=0)


def test_which_path(monkeypatch):
    mode = cpu_linear._chunk_mode
    f32, b16 = _case(torch.float32, 16), _case(torch.bfloat16, 16)
    assert mode(f32[0], f32[1]) == "chunk"
    assert mode(f32[0][:3], f32[1]) is None  # a gemv: the plain kernel
    assert mode(torch.randn(65, K), f32[1]) is None  # prefill-sized float32: plain
    assert mode(f32[0], f32[1][:100]) is None  # a small weight: plain
    expected = None if cpu_linear.native_low_precision(torch.bfloat16) else "upcast"
    assert mode(b16[0], b16[1]) == expected
    monkeypatch.setattr(cpu_linear, "native_low_precision", lambda dtype: True)
    assert mode(b16[0], b16[1]) is None  # CPUs with bf16 instructions keep the native kernel


def test_autograd_falls_back_to_f_linear():
    x, w, b = _case(torch.float32, 16)
    w.requires_grad_(True)
    linear(x, w, b).sum().backward()
    assert w.grad is not None and w.grad.shape == w.shape


def test_linear_module_loads_like_nn_linear():
    ref = nn.Linear(K, 7)
    ours = Linear(K, 7)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(5, K)
    with torch.no_grad(), cpu_linear.use_kernel("mkl"):
        torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=0)
    with torch.no_grad():  # oneDNN (the default): the same up to summation order
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)


def test_scratch_buffer_survives_switching_inference_mode():
    """A buffer made under inference_mode cannot be written outside it; the upcast path keeps one per mode."""
    w = torch.randn(512, 2048).to(torch.bfloat16)
    x = torch.randn(8, 2048).to(torch.bfloat16)
    with torch.inference_mode():
        inside = linear(x, w)
    outside = linear(x, w)
    assert torch.equal(inside, outside)
