"""V-JEPA 2-AC rollout cost against the horizon, offline: the released loop vs KV reuse, side by side in one run.

    ./dev bench vjepa-offline [--preset bench] [--horizons 4,15,30] [--repeat 3] [--threads 1]

Both loops run the same random-weight AC predictor (``walkserve tiny
vjepa2-ac --preset bench``: width 256, 8 blocks, 64 tokens per frame unless
``--preset tiny``) over ``DenseAttention`` from one context frame, batch 1:

- official: every step re-runs the predictor on the whole history (the released notebook's loop);
- cached:   the context is prefilled once, then each step appends 2 + F tokens and attends to the cache.

Reported: the median wall time of each loop per horizon and their ratio
(official / cached), the tokens each loop pushes through the predictor, and
the ratio of their matmul FLOPs (what the wall-time ratio tends to when the
machine is compute-bound, i.e. large models on an accelerator). This is the model-level loop only; the served benchmark (walks,
batching, the paged engine) is ``./dev bench vjepa``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from functools import partial

import torch

from benchmarks.common import conditions, table
from walkserve.models.vjepa2.rollout import cached_rollout, normalize_features, official_rollout
from walkserve.models.vjepa2.tiny import write_tiny_vjepa2_ac
from walkserve.models.vjepa2.weights import load_ac_predictor


def _inputs(model, horizon: int, device: str):
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    frames = normalize_features(torch.randn(1, cfg.frame_tokens, cfg.input_size, generator=g))
    actions = 0.05 * torch.randn(horizon, cfg.action_dim, generator=g)
    states = torch.rand(1, cfg.action_dim, generator=g)
    return frames.to(device), actions.to(device), states.to(device)


def forward_flops(cfg, new: int, keys: int, projected: int) -> int:
    """Matmul FLOPs of one predictor call: ``new`` tokens over ``keys`` keys, ``projected`` rows through the head."""
    d, layers = cfg.hidden_size, cfg.num_hidden_layers
    blocks = new * 2 * (4 * d * d + 2 * d * cfg.intermediate_size) * layers  # qkv, proj, fc1, fc2
    attention = 4 * new * keys * d * layers  # q k^T and p v
    return blocks + attention + 2 * d * cfg.input_size * (new + projected)  # input projection and head


def rollout_flops(cfg, horizon: int, cached: bool) -> int:
    """Matmul FLOPs of a rollout of ``horizon`` from one context frame (``official_rollout`` / ``cached_rollout``)."""
    p, f = cfg.tokens_per_step, cfg.frame_tokens
    if cached:
        return sum(forward_flops(cfg, p, (h + 1) * p, f) for h in range(horizon))
    return sum(forward_flops(cfg, (h + 1) * p, (h + 1) * p, (h + 1) * f) for h in range(horizon))


def _time(fn, device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(preset: str = "bench", horizons: tuple[int, ...] = (4, 15, 30), repeat: int = 3,
            device: str = "cpu") -> list[dict[str, float]]:
    """Per horizon: median seconds of the official and cached loops (interleaved repeats), ratio, tokens."""
    with tempfile.TemporaryDirectory() as tmp:
        model = load_ac_predictor(write_tiny_vjepa2_ac(tmp, preset=preset), device=device)
    per_step = model.config.tokens_per_step
    rows = []
    with torch.inference_mode():
        for h in horizons:
            frames, actions, states = _inputs(model, h, device)
            cached_rollout(model, frames, actions, states, h)  # warm-up
            official_rollout(model, frames, actions, states, min(h, 2))
            times: dict[str, list[float]] = {"official": [], "cached": []}
            for _ in range(repeat):
                times["official"].append(_time(partial(official_rollout, model, frames, actions, states, h), device))
                times["cached"].append(_time(partial(cached_rollout, model, frames, actions, states, h), device))
            official, cached = (statistics.median(times[k]) for k in ("official", "cached"))
            flops = rollout_flops(model.config, h, cached=False) / rollout_flops(model.config, h, cached=True)
            rows.append({"horizon": h, "official_s": official, "cached_s": cached, "ratio": official / cached,
                         "official_tokens": per_step * h * (h + 1) // 2, "cached_tokens": per_step * h,
                         "flop_ratio": flops})
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="./dev bench vjepa-offline", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="bench", choices=["tiny", "bench"])
    p.add_argument("--horizons", default="4,15,30", help="comma-separated horizons (<= 32)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = measure(args.preset, tuple(int(h) for h in args.horizons.split(",")), args.repeat, args.device)
    print(f"V-JEPA 2-AC offline rollout, preset {args.preset}, batch 1, 1 context frame, {args.device}; {conditions(args.device)}")
    print(table(["H", "official ms", "cached ms", "official / cached", "FLOP ratio", "tokens official", "cached"],
                [[r["horizon"], 1e3 * r["official_s"], 1e3 * r["cached_s"], r["ratio"], r["flop_ratio"],
                  r["official_tokens"], r["cached_tokens"]] for r in rows]))
    return 0
