"""``./dev bench lm-step``: one decode step at batch 16, transformers' forward against our engine's step.

Both hold the same 16 prompts of ``./dev bench lm`` (ragged, 32-242 tokens) in
their caches: transformers left-padded in a ``DynamicCache``, ours in the
paged pool. Then, step after step, each generates one greedy token per row:

    transformers   model(ids [16, 1], attention_mask, position_ids, past_key_values) + argmax
    engine ...     KVCacheEngine.step() over 16 decode firings (forward, LM head, sampling,
                   booking), once per engine variant (kernels selected per step, see VARIANTS)

The variants take turns within every step (so the machine's load hits them
alike), each on an engine of its own (so the decode mirror of one is not
invalidated by another's pool writes); all contexts grow by one token a step.
The report gives the median per-step wall time of each and its ratio to
transformers'; the target is engine step <= transformers forward.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.common import conditions, table
from benchmarks.lm import FULL, QUICK, Shape, _prompts


def _variants() -> dict[str, Callable[[], contextlib.AbstractContextManager]]:
    from walkserve.layers import cpu_linear, paged_attention

    def both(linear: str, attention: str):
        stack = contextlib.ExitStack()
        stack.enter_context(cpu_linear.use_kernel(linear))
        stack.enter_context(paged_attention.use_decode(attention))
        return stack

    return {
        "engine, previous kernels (MKL linears, gathered decode attention)": lambda: both("mkl", "gather"),
        "engine, default (oneDNN linears, decode attention over the mirror)": lambda: both("onednn", "mirror"),
        "engine, WALKSERVE_CPU_LINEAR=packed": lambda: both("packed", "mirror"),
    }


class _Transformers:
    """The prompts left-padded in one DynamicCache; ``step`` makes one greedy token per row."""

    def __init__(self, path: Path, prompts: tuple[tuple[int, ...], ...]):
        from transformers import AutoModelForCausalLM, DynamicCache

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)  # [B, Lmax]
        self.mask = torch.zeros_like(ids)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt) :] = torch.tensor(prompt)
            self.mask[i, width - len(prompt) :] = 1
        self.cache = DynamicCache(config=self.model.config)
        self.next = self._forward(ids)  # [B, 1]
        self.tokens = [[t] for t in self.next[:, 0].tolist()]

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = (self.mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1] :]
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=positions, past_key_values=self.cache,
                         use_cache=True)
        return out.logits[:, -1].argmax(-1, keepdim=True)  # [B, 1]

    def step(self) -> None:
        self.mask = torch.cat([self.mask, torch.ones(self.mask.shape[0], 1, dtype=torch.long)], 1)
        self.next = self._forward(self.next)
        for row, t in zip(self.tokens, self.next[:, 0].tolist()):
            row.append(t)


class _Engine:
    """Our model on a KVCacheEngine with the prompts prefilled; ``step`` is one engine step of 16 decodes."""

    def __init__(self, path: Path, prompts: tuple[tuple[int, ...], ...]):
        from walkserve.core.options import KVOptions
        from walkserve.engines.kv.engine import KVCacheEngine
        from walkserve.models.llama.weights import load_causal_lm

        model = load_causal_lm(path, device="cpu", dtype="float32", progress=False)
        self.engine = KVCacheEngine("lm", model, "cpu", "float32", KVOptions(block_size=16))
        self.tokens: list[list[int]] = [[] for _ in prompts]
        for i, prompt in enumerate(prompts):
            if len(prompt) > 1:
                self.engine.submit(self._firing(i, list(prompt[:-1]), ()))
            self.engine.submit(self._firing(i, list(prompt[-1:]), ("token",)))
        while sum(map(len, self.tokens)) < len(prompts):
            self.step()

    def _firing(self, i: int, tokens: list[int], outputs: tuple[str, ...]):
        from walkserve.core.sampling import SamplingParams
        from walkserve.engines.base import Firing

        greedy = SamplingParams(temperature=0.0, max_tokens=1 << 20, ignore_eos=True)
        return Firing(len(self.tokens[i]), f"req{i}", "decode" if outputs else "prefill", "lm", "lm", "forward",
                      (len(self.tokens[i]),), {"tokens": torch.tensor(tokens, dtype=torch.long)}, outputs,
                      sampling=greedy)

    def step(self) -> int:
        made = 0
        for result in self.engine.step():
            assert result.error is None, result.error
            if "token" in (result.outputs or {}):
                i, token = int(result.firing.request_id[3:]), int(result.outputs["token"][0])
                self.tokens[i].append(token)
                self.engine.submit(self._firing(i, [token], ("token",)))
                made += 1
        return made


def measure(path: Path, prompts: tuple[tuple[int, ...], ...], steps: int,
            threads: int) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Per-step wall seconds of transformers and of each engine variant, taking turns within every step; and per
    variant, the rows whose tokens equal transformers'."""
    torch.set_num_threads(threads)
    variants = _variants()
    times: dict[str, list[float]] = {"transformers forward (DynamicCache, left-padded)": []}
    times.update({name: [] for name in variants})
    engines = {}
    for name, enter in variants.items():  # loaded outside inference mode, as a worker loads them
        with enter():
            engines[name] = _Engine(path, prompts)
    with torch.inference_mode():
        hf = _Transformers(path, prompts)
        for _ in range(steps):
            t0 = time.perf_counter()
            hf.step()
            times["transformers forward (DynamicCache, left-padded)"].append(time.perf_counter() - t0)
            for name, enter in variants.items():
                with enter():
                    t0 = time.perf_counter()
                    made = engines[name].step()
                    times[name].append(time.perf_counter() - t0)
                assert made == len(prompts), f"{name}: {made} decodes in a step, not {len(prompts)}"
    agree = {name: sum(e[:len(h)] == h for e, h in zip(ours.tokens, hf.tokens)) for name, ours in engines.items()}
    return times, agree


def report(shape: Shape, args: argparse.Namespace, times: dict[str, list[float]], agree: dict[str, int],
           load: tuple[float, float]) -> str:
    skip = min(2, args.steps - 1)  # the first steps warm caches and allocators
    medians = {name: statistics.median(t[skip:]) * 1e3 for name, t in times.items()}
    base = next(iter(medians.values()))
    rows = [(name, medians[name], min(t[skip:]) * 1e3, max(t[skip:]) * 1e3, medians[name] / base,
             f"{agree[name]}/{args.batch}" if name in agree else "") for name, t in times.items()]
    lens = shape.prompt_lengths()[: args.batch]
    lines = [
        f"## One decode step at batch {len(lens)} (`./dev bench lm-step`)", "",
        f"- model: {shape.describe()}, float32",
        f"- batch: {len(lens)} rows, prompts of {lens[0]}-{lens[-1]} tokens; {args.steps} steps of each variant, "
        f"taking turns within every step (medians over the last {args.steps - skip})",
        f"- machine: {conditions()}; load average {load[0]:.2f} before, {load[1]:.2f} after",
        "",
        table(["what", "ms per step (median)", "min", "max", "x transformers", "rows with transformers' tokens"],
              rows),
    ]
    ours = [v for k, v in medians.items() if "default" in k]
    if ours:
        ratio = ours[0] / base
        lines += ["", f"- engine step / transformers forward = {ratio:.2f} (target <= 1: {'met' if ratio <= 1 else 'MISSED'})"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="./dev bench lm-step", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the tiny model of `bench lm --quick`, 4 rows, 4 steps")
    p.add_argument("--steps", type=int, default=None, help="decode steps of each variant (default 24; --quick: 4)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = p.parse_args(argv)
    shape = QUICK if args.quick else FULL
    args.batch = shape.requests
    args.steps = args.steps or (4 if args.quick else 24)
    from walkserve.models.llama.tiny import write_tiny

    torch.set_num_threads(args.threads)  # here too, so the report's conditions say it
    before = os.getloadavg()[0]
    box: list = []
    with tempfile.TemporaryDirectory(prefix="walkserve-bench-lm-step-") as tmp:
        path = write_tiny("llama", Path(tmp) / "model", **shape.model)
        # on a thread of its own, as a worker's heartbeat runs (OpenMP from the main thread stalls here)
        thread = threading.Thread(target=lambda: box.append(measure(path, _prompts(shape), args.steps, args.threads)))
        thread.start()
        thread.join()
    if not box:
        return 1
    print(report(shape, args, *box[0], (before, os.getloadavg()[0])))
    return 0
