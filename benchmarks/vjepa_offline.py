"""V-JEPA 2-AC rollout cost against the horizon, offline: the released loop vs KV reuse, side by side in one run.

    ./dev bench vjepa-offline [--preset bench] [--horizons 4,15,30] [--repeat 3] [--threads 1]

Both loops run the same random-weight AC predictor (``walkserve tiny
vjepa2-ac --preset bench``: width 256, 8 blocks, 64 tokens per frame unless
``--preset tiny``) over ``DenseAttention`` from one context frame, batch 1:

- official: every step re-runs the predictor on the whole history (the released notebook's loop);
- cached:   the context is prefilled once, then each step appends 2 + F tokens and attends to the cache.

``batched_rollout`` is the cached loop for B rollouts stepping together (B x (2 + F) rows a forward, dense
per-rollout caches, no paging, no serving): the model-level bound of B concurrent served rollouts, which
``./dev bench vjepa`` reports beside them.

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
import torch.nn.functional as F

from benchmarks.common import conditions, table
from walkserve.layers.attention import AttentionContext
from walkserve.models.vjepa2.rollout import (
    cached_rollout,
    normalize_features,
    official_rollout,
    rollout_states,
)
from walkserve.models.vjepa2.step_tokens import step_kinds, step_positions, step_rows
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


class _BatchedKV(AttentionContext):
    """B rollouts' K/V in dense per-layer caches [B, capacity, H, Dh]; one call appends ``n`` rows to each (the
    rows of rollout b are rows b*n .. b*n + n - 1) and attends them to their rollout's keys, unmasked (one whole
    step after whole steps: block-causal allows every key)."""

    def __init__(self, caches: list[tuple[torch.Tensor, torch.Tensor]], length: int):
        self.caches, self.length = caches, length

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        kc, vc = self.caches[layer]
        b = kc.shape[0]
        n, end = q.shape[0] // b, self.length + q.shape[0] // b
        kc[:, self.length : end] = k.view(b, n, *k.shape[1:])
        vc[:, self.length : end] = v.view(b, n, *v.shape[1:])
        out = F.scaled_dot_product_attention(q.view(b, n, *q.shape[1:]).transpose(1, 2), kc[:, :end].transpose(1, 2),
                                             vc[:, :end].transpose(1, 2), scale=scale)  # [B, Hq, n, Dh]
        return out.transpose(1, 2).reshape(q.shape)


def batched_rollout(model, frames: torch.Tensor, actions: torch.Tensor, states: torch.Tensor,
                    horizon: int) -> torch.Tensor:
    """B rollouts of ``horizon`` from one context frame each, stepping together: frames [B, F, E], actions
    [B, >= H, 7], states [B, 1, 7] -> [B, H, F, E] (each rollout as ``cached_rollout`` gives it)."""
    cfg = model.config
    b, per_step, f = frames.shape[0], cfg.tokens_per_step, cfg.frame_tokens
    heads, device = cfg.vit.num_attention_heads, frames.device
    states = torch.stack([rollout_states(states[i], actions[i], horizon) for i in range(b)])  # [B, H, 7]
    caches = [tuple(frames.new_empty(b, horizon * per_step, heads, cfg.head_dim) for _ in range(2))
              for _ in range(cfg.num_hidden_layers)]
    kinds = step_kinds(1, f, device).repeat(b)
    frame, out = frames, []
    for t in range(horizon):
        rows = torch.cat([step_rows(frame[i : i + 1], actions[i, t : t + 1], states[i, t : t + 1]) for i in range(b)])
        hidden = model(None, step_positions(t, 1, cfg.grid_size, device).repeat(1, b), _BatchedKV(caches, t * per_step),
                       inputs_embeds=rows, token_kind=kinds)  # [B * (2 + F), D]
        frame = normalize_features(model.compute_logits(hidden.view(b, per_step, -1)[:, -f:]))  # [B, F, E]
        out.append(frame)
    return torch.stack(out, dim=1)


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
