"""``./dev bench moe``: one sparse-MoE layer against the dense matmul with the same active FLOPs.

Shapes default to a Qwen3-Omni thinker layer (hidden 2048, 128 experts of
768, top-8). For T tokens three things run on the same input:

- ``moe``: ``SparseMoE`` (router, sort, two grouped matmuls, put-back);
- ``dense``: a SwiGLU of width top_k x expert width (6144), the FLOPs one
  MoE token costs, computed densely: the floor a MoE layer can reach;
- ``loop``: the same experts one at a time over the tokens routed to each
  (a Python loop with a host sync per layer: the previous implementation).

Weights are random; only times are reported, side by side in one run.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from benchmarks.common import conditions, table
from walkserve.layers.mlp import SwiGLU
from walkserve.layers.moe import SparseMoE

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def loop_experts(moe: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    """The per-expert loop: bincount on the host, one pair of matmuls per expert that got rows."""
    weights, ids = moe.route(x)
    k = ids.shape[1]
    order = ids.reshape(-1).argsort(stable=True)
    rows = x[order // k]
    counts = torch.bincount(ids.reshape(-1), minlength=moe.experts.num_experts).tolist()
    out, start = torch.empty_like(rows), 0
    for e, n in enumerate(counts):
        if n:
            gate, up = F.linear(rows[start : start + n], moe.experts.gate_up[e]).chunk(2, dim=-1)
            out[start : start + n] = F.linear(F.silu(gate) * up, moe.experts.down[e])
            start += n
    out = out * weights.reshape(-1)[order, None]
    return torch.zeros_like(x).index_add_(0, order // k, out)


def timed(fn, x: torch.Tensor, repeats: int) -> float:
    """Median milliseconds of ``fn(x)`` after one warm-up call (the device synchronised around each call)."""
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    fn(x)
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn(x)
        sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    return sorted(samples)[len(samples) // 2]


def build(hidden: int, inner: int, experts: int, top_k: int, dtype: torch.dtype) -> tuple[SparseMoE, SwiGLU]:
    gen = torch.Generator().manual_seed(0)
    moe = SparseMoE(hidden, inner, experts, top_k, True)
    dense = SwiGLU(hidden, top_k * inner)
    with torch.no_grad():
        for module in (moe, dense):
            for p in module.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return moe.to(dtype).eval(), dense.to(dtype).eval()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="./dev bench moe", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="1,8,64,512", help="comma-separated token counts")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="tiny shapes (a smoke run)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    args = p.parse_args(argv)
    shape = (64, 32, 8, 2) if args.quick else (2048, 768, 128, 8)
    hidden, inner, experts, top_k = shape
    moe, dense = (m.to(args.device) for m in build(*shape, DTYPES[args.dtype]))
    rows = []
    with torch.inference_mode():
        for t in (int(v) for v in args.tokens.split(",")):
            x = torch.randn(t, hidden, generator=torch.Generator().manual_seed(t)).to(args.device, DTYPES[args.dtype])
            ms = {name: timed(fn, x, args.repeats) for name, fn in
                  (("moe", moe), ("dense", dense), ("loop", lambda v: loop_experts(moe, v)))}
            used = len(torch.unique(moe.route(x)[1]))
            rows.append([t, used, ms["moe"], ms["dense"], ms["loop"], ms["moe"] / ms["dense"]])
    print(f"MoE layer: hidden {hidden}, {experts} experts of {inner}, top-{top_k}, {args.dtype}, {args.device}; "
          f"{conditions(args.device)}")
    print(table(["tokens", "experts used", "moe ms", "dense-equivalent ms", "per-expert loop ms", "moe / dense"],
                rows))
    return 0
