"""``./dev bench bagel``: BAGEL's text-to-image and understanding, side by side in one run.

    (ref)  the offline loop (walkserve.models.bagel.offline), one request at a time: dense caches and
           three separate CFG forwards per flow step, as the release's inferencer runs them
    (1)    walkserve, placement bagel (one rank; a step's three passes, for every request in the loop,
           in one KV forward): generation at concurrency 1 and 4, understanding at concurrency 16

Generation: text-to-image with the app's defaults (50 timesteps = 49 Euler steps, cfg_text 4.0,
cfg_img 1.5 on [0.4, 1], global renorm), an explicit initial noise per request so both sides make the
same image (checked: pixels within 1), then the VAE decode. Latency per request from submission to
its image. Understanding: one 64x64 image and a question, greedy, exactly ``--tokens`` tokens.
Targets (issue 16): generation >= 1.2x (ref) images/min at concurrency 1 and >= 2x at 4;
understanding >= 3x (ref) tokens/s at concurrency 16. The model is a random-weight BAGEL small
enough for a CPU, with the release's structure (two-expert MoT, NaViT ViT, FLUX-layout AE).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.bagel_cases import RunResult, Workload, offline, served
from benchmarks.common import conditions, pct, table

# overrides of the tiny writer (walkserve.models.bagel.tiny); the shared keys size the LLM and the ViT alike
BENCH = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_latent_size=16)
QUICK: dict = {}  # the tiny writer's own sizes
PLACEMENT = "bagel"


def describe(path: Path) -> str:
    from walkserve.models.bagel.config import BagelConfig
    from walkserve.models.bagel.memory import parameter_counts

    c = BagelConfig.from_dir(path)
    total, active = parameter_counts(path)
    llm = c.llm
    return (f"{total / 1e6:.1f}M parameters ({active / 1e6:.1f}M active per LLM token): MoT LLM hidden "
            f"{llm.hidden_size}, {llm.num_hidden_layers} layers x 2 experts, {llm.num_attention_heads} heads / "
            f"{llm.num_key_value_heads} KV x {llm.head_dim}; ViT hidden {c.vit.hidden_size}, "
            f"{c.vit.num_hidden_layers} layers; FLUX-layout AE; random weights, float32")


def _check_images(ref: RunResult, run: RunResult) -> str:
    n = min(len(ref.outputs), len(run.outputs))
    same = sum(int(np.abs(ref.outputs[i].astype(int) - run.outputs[i].astype(int)).max()) <= 1 for i in range(n))
    return f"{same}/{n} images as (ref)"


def _check_tokens(ref: RunResult, run: RunResult) -> str:
    n = min(len(ref.outputs), len(run.outputs))
    same = sum(ref.outputs[i] == run.outputs[i] for i in range(n))
    return f"{same}/{n} answers as (ref)"


def generation_rows(ref: RunResult, runs: dict[int, RunResult]) -> list[tuple]:
    out = [("(ref) offline loop, 1 at a time", 1, len(ref.outputs), pct(ref.latency_s, 0.5), pct(ref.latency_s, 0.95),
            ref.per_minute(), 1.0, "")]
    for c, r in runs.items():
        out.append((f"walkserve {PLACEMENT}", c, len(r.outputs), pct(r.latency_s, 0.5), pct(r.latency_s, 0.95),
                    r.per_minute(), r.per_minute() / ref.per_minute(), _check_images(ref, r)))
    return out


def understanding_rows(ref: RunResult, runs: dict[int, RunResult]) -> list[tuple]:
    out = [("(ref) offline loop, 1 at a time", 1, len(ref.outputs), ref.tokens_per_s(), 1.0, "")]
    for c, r in runs.items():
        out.append((f"walkserve {PLACEMENT}", c, len(r.outputs), r.tokens_per_s(), r.tokens_per_s() / ref.tokens_per_s(),
                    _check_tokens(ref, r)))
    return out


def verdict(gen_ref: RunResult, gen: dict[int, RunResult], und_ref: RunResult, und: dict[int, RunResult]) -> list[str]:
    lines = []
    for c, r in gen.items():
        target = 2.0 if c >= 4 else 1.2
        ratio = r.per_minute() / gen_ref.per_minute()
        lines.append(f"- generation: images/min at concurrency {c} = {ratio:.2f} x (ref) (target >= {target:g}: "
                     f"{'met' if ratio >= target else 'MISSED'})")
    for c, r in und.items():
        ratio = r.tokens_per_s() / und_ref.tokens_per_s()
        lines.append(f"- understanding: tokens/s at concurrency {c} = {ratio:.2f} x (ref) (target >= 3: "
                     f"{'met' if ratio >= 3 else 'MISSED'})")
    return lines


def report(path: Path, work: Workload, refs: tuple[RunResult, RunResult], runs: dict, load: tuple) -> str:
    gen_ref, und_ref = refs
    lines = ["## BAGEL: text-to-image and understanding (`./dev bench bagel`)", "",
             f"- model: {describe(path)}",
             f"- generation: {work.size}x{work.size} images ({(work.size // 16) ** 2} latent tokens), "
             f"{work.num_timesteps} timesteps ({work.num_timesteps - 1} steps x 3 CFG passes), the app's defaults, "
             f"explicit noise; (ref) makes {work.gen_requests} images one after another, walkserve "
             f"max({work.gen_requests}, concurrency) at each concurrency",
             f"- understanding: a 64x64 image and a question, {work.new_tokens} tokens greedy; (ref) "
             f"{work.und_requests} requests one after another, walkserve max({work.und_requests}, concurrency)",
             f"- machine: {conditions()}; torch threads per case / per worker: {work.threads}; load average "
             f"{load[0]:.2f} before, {load[1]:.2f} after",
             "- after a warm-up; loading and start-up excluded; latency from submission to the image (s)", ""]
    lines.append(table(["case", "concurrency", "images", "p50 s", "p95 s", "images/min", "x (ref)", "check"],
                       generation_rows(gen_ref, runs["generation"])))
    lines.append("")
    lines.append(table(["case", "concurrency", "requests", "tokens/s", "x (ref)", "check"],
                       understanding_rows(und_ref, runs["understanding"])))
    return "\n".join([*lines, "", *verdict(gen_ref, runs["generation"], und_ref, runs["understanding"])])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="./dev bench bagel", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the tiny checkpoint, 32x32 images, 4 timesteps, "
                   "concurrency 1/2 and 2 (a smoke run)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for (ref) and each worker (default 1)")
    p.add_argument("--size", type=int, default=None, help="image side in pixels, a multiple of 16 (default 128)")
    p.add_argument("--timesteps", type=int, default=None, help="num_timesteps (default 50: 49 steps)")
    p.add_argument("--tokens", type=int, default=None, help="understanding tokens per request (default 32)")
    args = p.parse_args(argv)
    from walkserve.models.bagel.tiny import write_tiny_bagel

    gen_levels, und_levels = ([1, 2], [2]) if args.quick else ([1, 4], [16])
    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="walkserve-bench-bagel-") as tmp:
        path = write_tiny_bagel(Path(tmp) / "bagel-bench", seed=3, **(QUICK if args.quick else BENCH))
        work = Workload(path, args.size or (32 if args.quick else 128), args.timesteps or (4 if args.quick else 50),
                        gen_requests=2 if args.quick else 3, und_requests=2 if args.quick else 4,
                        new_tokens=args.tokens or (4 if args.quick else 32), threads=args.threads)
        print(f"offline loop: {work.gen_requests} images, {work.und_requests} answers ...", flush=True)
        refs = offline(work)
        print(f"walkserve {PLACEMENT}: generation at {gen_levels}, understanding at {und_levels} ...", flush=True)
        runs = served(work, PLACEMENT, gen_levels, und_levels)
        print()
        print(report(path, work, refs, runs, (before, os.getloadavg()[0])))
    return 0
