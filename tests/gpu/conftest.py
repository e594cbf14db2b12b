"""GPU parity tests: the CUDA path against the CPU path on the same tiny weights (``pytest -m gpu``).

Every test here is marked ``gpu`` and compares a device under test with the
CPU. The device is CUDA; ``WALKSERVE_GPU_TEST_DEVICE=cpu`` runs the same tests
CPU against CPU (with ``tests/layers/fake_flashinfer.py`` standing in for
FlashInfer), which checks their logic on a machine without a GPU
(``scripts/gpu_check.sh --dry-run``). Without CUDA and without that variable
they skip.

``parity`` records each comparison (what, dtype, largest absolute difference,
relative error ``||a - b|| / ||b||``, limit) as a JSON line in
``$WALKSERVE_GPU_REPORT`` when set, so a run reports its numbers even where a
limit is missed. Limits (the GPU issue's): logits within 1e-3 in bf16 and 1e-4
in fp32, as the largest absolute difference; greedy tokens identical in fp32.
bf16 rounds every element to 8 significant bits, so logits of size 1-4 (the
tiny checkpoints') move by up to ~8e-3 from rounding alone (measured on the CPU:
bf16 against fp32 arithmetic on the same bf16 weights, 1.1e-2 largest, 6e-3
relative): the bf16 difference is recorded against 1e-3, and what is asserted
is ``parity_bf16``'s (CUDA bf16 as close to fp32 as CPU bf16 is).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

LIMITS = {torch.float32: 1e-4, torch.bfloat16: 1e-3}


def device_under_test() -> torch.device | None:
    """The device under test: cuda when there is one, cpu in self-check mode, else None (skip)."""
    name = os.environ.get("WALKSERVE_GPU_TEST_DEVICE")
    if name:
        return torch.device(name)
    return torch.device("cuda") if torch.cuda.is_available() else None


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    skip = pytest.mark.skip(reason="needs a CUDA device (or WALKSERVE_GPU_TEST_DEVICE=cpu to check the tests)")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if device_under_test() is None:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def device() -> torch.device:
    d = device_under_test()
    if d is None:
        pytest.skip("needs a CUDA device")
    if d.type == "cuda":
        torch.set_float32_matmul_precision("highest")  # fp32 parity means fp32 arithmetic, not TF32
        setattr(torch.backends.cudnn, "allow_tf32", False)  # convolutions too (cuDNN's default is TF32)  # noqa: B010
    torch.manual_seed(0)
    return d


def errors(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(largest absolute difference, relative error) of ``got`` against ``want`` (-inf entries must agree)."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert got.shape == want.shape, f"{tuple(got.shape)} != {tuple(want.shape)}"
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got)), "non-finite values differ"
    got, want = got[finite], want[finite]
    diff = (got - want).abs()
    return float(diff.max()) if diff.numel() else 0.0, float(diff.norm() / want.norm().clamp_min(1e-30))


@pytest.fixture
def parity(request):
    """``parity(what, got, want, dtype[, limit])``: assert max |got - want| <= LIMITS[dtype] (or ``limit``); record it."""
    path = os.environ.get("WALKSERVE_GPU_REPORT")

    def check(what: str, got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, limit: float | None = None,
              asserted: bool = True):
        err, rel = errors(got, want)
        limit = LIMITS[dtype] if limit is None else limit
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"test": request.node.nodeid, "what": what, "dtype": str(dtype).removeprefix("torch."),
                                    "max_abs": err, "rel": rel, "scale": float(want.detach().abs().max()),
                                    "limit": limit, "ok": err <= limit, "asserted": asserted}) + "\n")
        assert err <= limit or not asserted, f"{what}: largest difference {err:.3g} > {limit:g} ({dtype}; relative {rel:.3g})"
        return err

    return check


@pytest.fixture
def parity_bf16(request, parity):
    """``parity_bf16(what, cuda16, cpu16, ref32)``: bf16 on CUDA is as accurate as bf16 on the CPU.

    Both bf16 results are compared with the fp32 CPU result: the CUDA one's relative error may exceed the CPU
    one's by at most half, plus 1e-3. The direct bf16-to-bf16 difference is recorded against the issue's 1e-3
    (not asserted: bf16 rounding of logits of size 1-4 alone moves them by up to ~8e-3).
    """
    path = os.environ.get("WALKSERVE_GPU_REPORT")

    def check(what: str, cuda16: torch.Tensor, cpu16: torch.Tensor, ref32: torch.Tensor):
        parity(f"{what} (bf16 CUDA vs bf16 CPU)", cuda16, cpu16, torch.bfloat16, asserted=False)
        cuda_rel, cpu_rel = errors(cuda16, ref32)[1], errors(cpu16, ref32)[1]
        limit = 1.5 * cpu_rel + 1e-3
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"test": request.node.nodeid, "kind": "bf16_accuracy", "what": what,
                                    "cuda_rel_to_fp32": cuda_rel, "cpu_rel_to_fp32": cpu_rel, "limit": limit,
                                    "ok": cuda_rel <= limit}) + "\n")
        assert cuda_rel <= limit, f"{what}: bf16 on CUDA {cuda_rel:.3g} from fp32, bf16 on the CPU {cpu_rel:.3g}"

    return check


@pytest.fixture
def record(request):
    """``record(**fields)``: one JSON line of measurements (speed-ups, timings) in $WALKSERVE_GPU_REPORT."""
    path = os.environ.get("WALKSERVE_GPU_REPORT")

    def write(**fields):
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"test": request.node.nodeid, **fields}) + "\n")

    return write


@pytest.fixture(scope="session")
def flashinfer_module(device):
    """The flashinfer module on CUDA (skip when absent); the CPU stand-in in self-check mode."""
    if device.type == "cpu":
        from tests.layers import fake_flashinfer

        return fake_flashinfer
    flashinfer = pytest.importorskip("flashinfer", reason="needs flashinfer on the GPU machine")
    return flashinfer
