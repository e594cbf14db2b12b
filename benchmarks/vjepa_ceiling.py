"""The batch-1 ceiling of ``./dev bench vjepa``: how far official / served can go on this machine.

The FLOP ratio (``vjepa_offline.rollout_flops``) is what official / served tends to when every predictor
forward is compute-bound. At batch 1 on a CPU each forward also pays a fixed cost f that does not grow with
its tokens (every block's weights read once, oneDNN reordering them, the dispatch of some 300 small ops),
and both loops make H forwards (the released one over 1, 2, …, H steps, the served one a step each), so

    official = E + H·f + F_o / R          served >= E + H·f + F_c / R

with E the encoding of the context frame, F_o and F_c the loops' matmul FLOPs and R the FLOP rate. f and
R are fitted from bare predictor forwards over one and two whole steps, timed in the same run; the ceiling
takes R from the measured official time (the served steps assumed as FLOP-efficient as the released
loop's larger ones) and is official / that floor. It tends to the FLOP ratio as f / (step time) -> 0 (large
models, an accelerator with CUDA graphs) and is what a KV-reusing batch-1 rollout can reach here; batching
concurrent rollouts amortises f (the throughput table).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from benchmarks.vjepa_offline import forward_flops, rollout_flops


@dataclass(frozen=True)
class ForwardCost:
    """A predictor forward over n tokens costs ``fixed_s`` + its matmul FLOPs / ``flops_per_s``."""

    fixed_s: float
    flops_per_s: float
    weight_bytes: int = 0  # the predictor's weights, read once a forward (what most of ``fixed_s`` is)

    def describe(self) -> str:
        return (f"{1e3 * self.fixed_s:.1f} ms a forward + {self.flops_per_s / 1e9:.3g} GFLOP/s; "
                f"the predictor's weights are {self.weight_bytes / 1e6:.1f} MB, read once a forward")


def fit(cfg, one_step_s: float, two_steps_s: float) -> ForwardCost:
    """f and R from the times of bare forwards over one and two whole steps (f clamped to >= 0)."""
    p, frame = cfg.tokens_per_step, cfg.frame_tokens
    f1, f2 = forward_flops(cfg, p, p, frame), forward_flops(cfg, 2 * p, 2 * p, 2 * frame)
    if two_steps_s <= one_step_s:  # noise swamped the slope: no fixed part can be told apart
        return ForwardCost(0.0, f1 / one_step_s)
    rate = (f2 - f1) / (two_steps_s - one_step_s)
    fixed = max(0.0, one_step_s - f1 / rate)
    return ForwardCost(fixed, f1 / (one_step_s - fixed))


def ceiling(cfg, horizon: int, official_s: float, encode_s: float, cost: ForwardCost) -> float:
    """official / (E + H·f + F_c / R), R the official loop's own rate once E and H·f are taken out."""
    fixed = encode_s + horizon * cost.fixed_s
    compute = max(official_s - fixed, 1e-9)  # the released loop's FLOP-bound part, F_o / R
    flops = rollout_flops(cfg, horizon, cached=True) / rollout_flops(cfg, horizon, cached=False)
    return official_s / (fixed + compute * flops)


@torch.inference_mode()
def measure_forward_cost(model, rounds: int) -> ForwardCost:
    """Median wall times of bare forwards over one and two steps (interleaved ``rounds`` times), fitted."""
    from walkserve.models.vjepa2.rollout import full_forward, normalize_features

    cfg = model.config
    g = torch.Generator().manual_seed(0)
    frames = normalize_features(torch.randn(2, cfg.frame_tokens, cfg.input_size, generator=g))
    actions, states = 0.05 * torch.randn(2, cfg.action_dim, generator=g), torch.rand(2, cfg.action_dim, generator=g)
    cases = {s: (frames[:s], actions[:s], states[:s]) for s in (1, 2)}
    for s in cases:
        full_forward(model, *cases[s])  # warm-up
    times: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(rounds):
        for s, args in cases.items():
            t0 = time.perf_counter()
            full_forward(model, *args)
            times[s].append(time.perf_counter() - t0)
    cost = fit(cfg, statistics.median(times[1]), statistics.median(times[2]))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return ForwardCost(cost.fixed_s, cost.flops_per_s, weights)
