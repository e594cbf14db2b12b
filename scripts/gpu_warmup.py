"""FlashInfer's cold start, timed: import, then the first and second run of every pass walkserve uses, per head dim.

    python3 scripts/gpu_warmup.py --head-dims 64 [--report FILE] [--self-check]

The first run of a pass compiles its kernels (JIT, with the machine's nvcc) or
loads them from the cache (~/.cache/flashinfer); the second shows the warm cost.
Each head dim is one JIT module (bf16, FA2) for decode, prefill with every mask,
ragged queries and the CUDA-graph decode; ``merge_state`` is one more. One JSON
line per measurement goes to ``--report``. ``--self-check`` runs the same
sequence on the CPU over the stand-in (``tests/layers/fake_flashinfer.py``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from walkserve.layers.flashinfer_attention import FlashInferBackend
from walkserve.layers.paged_attention import PagedBatch

BS, HQ, HKV = 16, 8, 2


def _passes(head_dim: int) -> dict[str, PagedBatch]:
    return {
        "decode": PagedBatch([1, 1], [5, 20], [[0], [1, 2]], BS),
        "prefill causal": PagedBatch([9, 1], [9, 18], [[3], [4, 5]], BS),
        "prefill block_causal mask": PagedBatch([8], [24], [[6, 7]], BS, ["block_causal"], [4]),
        "query + merge_state": PagedBatch([3], [21], [[]], BS, ["full"], [0], [[([8, 9], 21)]]),
    }


def _time(fn, device: torch.device) -> float:
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def warm(head_dim: int, device: torch.device, module, dtype: torch.dtype, out: list[dict]) -> None:
    backend = FlashInferBackend(device, module=module)
    k_cache, v_cache = (torch.randn(1, 16, BS, HKV, head_dim, device=device).to(dtype) for _ in range(2))
    for name, batch in _passes(head_dim).items():
        q, k, v = (torch.randn(batch.num_tokens, h, head_dim, device=device).to(dtype) for h in (HQ, HKV, HKV))
        for attempt in ("first", "second"):
            ctx = backend.context(k_cache, v_cache, batch)
            s = _time(lambda ctx=ctx, q=q, k=k, v=v: ctx.forward(0, q, k, v, head_dim**-0.5), device)
            out.append({"kind": "flashinfer_warmup", "head_dim": head_dim, "pass": name, "run": attempt, "s": s})
            print(f"  head dim {head_dim:4d}  {name:28s} {attempt:6s} {s:8.3f} s", flush=True)
    graph = backend.graph_decode(k_cache, v_cache, 2, 4)
    graph.prepare(_passes(head_dim)["decode"])
    q, k, v = (torch.randn(2, h, head_dim, device=device).to(dtype) for h in (HQ, HKV, HKV))
    s = _time(lambda: graph.forward(0, q, k, v, head_dim**-0.5), device)
    out.append({"kind": "flashinfer_warmup", "head_dim": head_dim, "pass": "graph decode plan", "run": "first", "s": s})
    print(f"  head dim {head_dim:4d}  {'graph decode plan':28s} first  {s:8.3f} s", flush=True)


def _aot_dir(module) -> list[str] | None:
    """The module names in FlashInfer's AOT folder (``scripts/gpu_aot.sh``), or None."""
    path = Path(getattr(module, "__file__", "") or ".").parent / "data" / "aot"
    names = sorted(p.name[:40] for p in path.iterdir()) if path.is_dir() else []
    return names or None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--head-dims", default="64")
    p.add_argument("--report", default=None)
    p.add_argument("--self-check", action="store_true")
    args = p.parse_args()
    out: list[dict] = []
    t0 = time.perf_counter()
    if args.self_check:
        module, device, dtype = importlib.import_module("tests.layers.fake_flashinfer"), torch.device("cpu"), torch.float32
    else:
        module, device, dtype = importlib.import_module("flashinfer"), torch.device("cuda"), torch.bfloat16
    out.append({"kind": "flashinfer_warmup", "pass": "import", "s": time.perf_counter() - t0,
                "version": getattr(module, "__version__", "stand-in")})
    print(f"import flashinfer {out[-1]['version']}: {out[-1]['s']:.2f} s", flush=True)
    aot = _aot_dir(module)
    if aot is not None:
        out.append({"kind": "flashinfer_warmup", "pass": "aot modules", "s": 0.0, "version": " ".join(aot)})
        print(f"kernels built ahead of time: {aot}", flush=True)
    status = 0
    for head_dim in (int(h) for h in args.head_dims.split(",")):
        for attempt in ("aot", "jit") if aot else ("jit",):
            try:
                warm(head_dim, device, module, dtype, out)
                break
            except Exception as err:  # one head dim failing to build must not hide the others
                out.append({"kind": "flashinfer_warmup", "head_dim": head_dim, "error": f"{attempt}: {err!r}"[:2000]})
                print(f"  head dim {head_dim} ({attempt}): FAILED {err!r}", flush=True)
                if attempt == "aot":  # modules built elsewhere that do not load here: compile them here instead
                    shutil.rmtree(Path(module.__file__).parent / "data" / "aot", ignore_errors=True)
                else:
                    status = 1
    out.append({"kind": "flashinfer_warmup", "pass": "total", "s": time.perf_counter() - t0})
    print(f"total {out[-1]['s']:.1f} s", flush=True)
    if args.report:
        with open(args.report, "a") as f:
            f.writelines(json.dumps(o) + "\n" for o in out)
    return status


if __name__ == "__main__":
    sys.exit(main())
