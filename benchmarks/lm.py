"""``./dev bench lm``: greedy decode throughput of a small Llama on the CPU, four ways side by side.

    (a) transformers generate, one request at a time   (a server without batching)
    (b) transformers generate, the batch left-padded
    (c) our model on KVCacheEngine in a bare loop       (the roofline: no processes, no graph)
    (d) walkserve: AsyncEngine, one CPU worker, one concurrent generate per request

The model is written by ``walkserve.models.llama.tiny.write_tiny`` (random
weights) and every case makes the same number of tokens per request (EOS
ignored). Targets: (d) >= 0.9 x (c) at 2 threads and (d) >= 6 x (a). With
``--threads 1,2`` every case runs at each thread count, and a table gives
served/bare per thread count from (c), (d) pairs run back to back
(``benchmarks/lm_ratio.py``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import conditions, pct, table
from benchmarks.lm_cases import CaseResult, Workload, bare_engine, hf_batched, hf_sequential, served
from benchmarks.lm_ratio import Pairs
from benchmarks.lm_ratio import report as ratio_report

CASES = {"a": "transformers generate, one request at a time", "b": "transformers generate, batched (left padding)",
         "c": "our model on KVCacheEngine, bare loop", "d": "walkserve AsyncEngine, 1 worker",
         "e": "(c) with CUDA-graph decode"}
KV_OPTIONS = {"block_size": 16}  # the served model's defaults; (c) and (d) get the same


@dataclass(frozen=True)
class Shape:
    """Model shape (write_tiny overrides) and workload of one benchmark size."""

    model: dict[str, Any]
    requests: int
    new_tokens: int
    prompt_min: int
    prompt_step: int

    def prompt_lengths(self) -> list[int]:
        return [self.prompt_min + self.prompt_step * i for i in range(self.requests)]

    def params(self) -> int:
        m = self.model
        d, f, dh = m["hidden_size"], m["intermediate_size"], m["head_dim"]
        attn = d * dh * (2 * m["num_attention_heads"] + 2 * m["num_key_value_heads"])
        layer = attn + 3 * d * f + 2 * d
        heads = 1 if m["tie_word_embeddings"] else 2
        return m["num_hidden_layers"] * layer + heads * m["vocab_size"] * d + d

    def describe(self) -> str:
        m = self.model
        return (f"Llama {self.params() / 1e6:.1f}M params (hidden {m['hidden_size']}, {m['num_hidden_layers']} layers, "
                f"{m['num_attention_heads']} heads / {m['num_key_value_heads']} KV heads x {m['head_dim']}, "
                f"intermediate {m['intermediate_size']}, vocab {m['vocab_size']}, tied embeddings), random weights")


FULL = Shape(dict(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=64, tie_word_embeddings=True, max_position_embeddings=2048),
             requests=16, new_tokens=128, prompt_min=32, prompt_step=14)
GPU = Shape(dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                 num_attention_heads=16, num_key_value_heads=4, head_dim=64, tie_word_embeddings=True,
                 max_position_embeddings=2048),
            requests=16, new_tokens=128, prompt_min=32, prompt_step=14)
QUICK = Shape(dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, tie_word_embeddings=True, max_position_embeddings=512),
              requests=4, new_tokens=16, prompt_min=8, prompt_step=8)


def _prompts(shape: Shape) -> tuple[tuple[int, ...], ...]:
    import torch

    gen = torch.Generator().manual_seed(1234)
    vocab = shape.model["vocab_size"]
    return tuple(tuple(torch.randint(10, vocab, (n,), generator=gen).tolist()) for n in shape.prompt_lengths())


def run_dtype(path: Path, shape: Shape, dtype: str, threads: int,
              args: argparse.Namespace) -> tuple[dict[str, CaseResult], Pairs]:
    """Every selected case on one dtype; (c) and (d) alternate ``repeat`` times: their best run, and every
    (c), (d) pair in the order they ran."""
    work = Workload(path, dtype, _prompts(shape), shape.new_tokens, threads, args.device)
    cases, repeat = "".join(k for k in "abcde" if k in args.cases), max(1, args.repeat)
    graphs = {**KV_OPTIONS, "cuda_graphs": True}
    served_options = graphs if args.cuda_graphs and args.device != "cpu" else KV_OPTIONS
    runners = {"a": lambda: hf_sequential(work, args.a_requests or shape.requests), "b": lambda: hf_batched(work),
               "c": lambda: bare_engine(work, KV_OPTIONS), "d": lambda: served(work, served_options),
               "e": lambda: bare_engine(work, graphs)}
    results: dict[str, CaseResult] = {}
    runs: dict[str, list[CaseResult]] = {"c": [], "d": []}
    for attempt in range(repeat):
        for key in cases:
            if key in "ab" and attempt > 0:
                continue
            result = runners[key]()
            print(f"  [{dtype}, {threads} threads] ({key}) {result.tokens_per_s():8.1f} tokens/s  "
                  f"({result.seconds:.2f} s)", flush=True)
            runs.setdefault(key, []).append(result)
            if key not in results or result.tokens_per_s() > results[key].tokens_per_s():
                results[key] = result
    return results, Pairs(dtype, threads, tuple(zip(runs["c"], runs["d"])))


def _agree(r: CaseResult, ref: CaseResult | None) -> str:
    """How many requests got exactly the tokens (c) generated for them."""
    if ref is None or r is ref:
        return ""
    indices = r.extra.get("indices", range(len(r.tokens)))
    same = sum(tokens == ref.tokens[i] for tokens, i in zip(r.tokens, indices))
    return f"{same}/{len(r.tokens)} requests: same tokens as (c)"


def throughput_rows(dtype: str, res: dict[str, CaseResult]) -> list[tuple]:
    rows = []
    a, c = res.get("a"), res.get("c")
    for key, r in res.items():
        tps = r.tokens_per_s()
        rows.append((dtype, f"({key}) {CASES[key]}", tps, tps / a.tokens_per_s() if a else float("nan"),
                     tps / c.tokens_per_s() if c else float("nan"), r.seconds, _agree(r, c)))
    return rows


def latency_rows(dtype: str, res: dict[str, CaseResult]) -> list[tuple]:
    rows = []
    for key in ("c", "d", "e"):
        r = res.get(key)
        if r is None:
            continue
        ttft, gaps = [t * 1e3 for t in r.ttfts()], [g * 1e3 for g in r.gaps()]
        kv = f"{r.extra['kv_blocks_peak']} / {r.extra['kv_blocks_total']}"
        steps, busy = r.extra["steps"], r.extra["busy_s"]
        rows.append((dtype, f"({key})", pct(ttft, 0.5), pct(ttft, 0.95), pct(gaps, 0.5), pct(gaps, 0.95), kv,
                     r.extra["preemptions"], steps, busy / r.seconds, busy / max(steps, 1) * 1e3,
                     r.extra["step_cpu_s"] / max(steps, 1) * 1e3))
    return rows


def verdict(res: dict[str, CaseResult], device: str = "cpu") -> str:
    parts = []
    if device != "cpu":  # on a GPU: walkserve against transformers' batched generate, same GPU, same run
        for key in ("c", "e", "d"):
            if res.get(key) and res.get("b"):
                ratio = res[key].tokens_per_s() / res["b"].tokens_per_s()
                parts.append(f"{key}/b = {ratio:.2f} (target >= 3: {'met' if ratio >= 3 else 'MISSED'})")
        if res.get("e") and res.get("c"):
            parts.append(f"CUDA graphs e/c = {res['e'].tokens_per_s() / res['c'].tokens_per_s():.2f}")
        return "; ".join(parts)
    d = res.get("d")
    for key, target in (("c", 0.9), ("a", 6.0)):
        other = res.get(key)
        if d and other:
            ratio = d.tokens_per_s() / other.tokens_per_s()
            parts.append(f"d/{key} = {ratio:.2f} (target >= {target}: {'met' if ratio >= target else 'MISSED'})")
    return "; ".join(parts)


def report(shape: Shape, args: argparse.Namespace, by_dtype: dict[str, dict[str, CaseResult]], load: tuple,
           pairs: list[Pairs] = ()) -> str:
    lens, threads, repeat = shape.prompt_lengths(), ",".join(map(str, args.threads)), max(1, args.repeat)
    a_count = min(args.a_requests or shape.requests, shape.requests)
    where = "the CPU" if args.device == "cpu" else f"the GPU ({args.device})"
    lines = [
        f"## LM decode on {where} (`./dev bench lm{'' if args.device == 'cpu' else ' --device ' + args.device}`)", "",
        f"- model: {shape.describe()}",
        f"- workload: {shape.requests} concurrent requests x {shape.new_tokens} new tokens, greedy, EOS ignored; "
        f"prompt lengths {lens[0]}-{lens[-1]} (step {shape.prompt_step}, mean {sum(lens) / len(lens):.0f})",
        f"- machine: {conditions(args.device)}; torch threads per case / worker: {threads}; "
        f"load average {load[0]:.2f} before, {load[1]:.2f} after; OpenMP wait: {_spin()}",
        f"- KV engine: block size {KV_OPTIONS['block_size']}, default pool (256 MiB on CPU, half the free memory on "
        f"CUDA), attention auto (FlashInfer for bf16 on CUDA when installed); (d) with CUDA graphs: "
        f"{bool(args.cuda_graphs)}; (c), (d), (e): best of {repeat}; "
        f"(a) runs {a_count} of the {shape.requests} prompts (evenly spread), one after another",
        "- tokens/s = all new tokens / wall time of the timed part (after a warm-up; model loading and "
        "runtime start-up excluded)", "",
    ]
    rows = [row for dtype, res in by_dtype.items() for row in throughput_rows(dtype, res)]
    lines.append(table(["dtype", "case", "tokens/s", "x (a)", "x (c)", "wall s", "check"], rows))
    lat = [row for dtype, res in by_dtype.items() for row in latency_rows(dtype, res)]
    if lat:
        lines += ["", table(["dtype", "case", "TTFT p50 ms", "TTFT p95 ms", "ITL p50 ms", "ITL p95 ms",
                             "KV blocks peak / pool", "preemptions", "engine steps", "busy", "ms / step",
                             "CPU ms / step"], lat)]
    cpu = [(dtype, *(_cpu_row(res["d"]))) for dtype, res in by_dtype.items() if "d" in res]
    if cpu:
        lines += ["", "CPU seconds used during the timed part of (d), and per engine step:", "",
                  table(["dtype", "worker thread", "worker's other threads", "conductor", "client (asyncio)",
                         "wall", "conductor + client ms / step"], cpu)]
    lines += ratio_report(list(pairs))
    lines.append("")
    lines += [f"- {dtype}: {verdict(res, args.device)}" for dtype, res in by_dtype.items() if verdict(res, args.device)]
    graphs = [(dtype, r.extra) for dtype, res in by_dtype.items() for k, r in res.items() if k == "e"]
    lines += [f"- {dtype} (e): CUDA graph replays {x.get('cuda_graph_replays', 0)}, captures "
              f"{x.get('cuda_graph_captures', 0)}, eager decode steps {x.get('cuda_graph_eager', 0)}" for dtype, x in graphs]
    return "\n".join(lines)


def _spin() -> str:
    """The OpenMP wait settings every case ran with (benchmarks/__main__.py gives this process the workers')."""
    set_ = [f"{k}={os.environ[k]}" for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY") if k in os.environ]
    return ", ".join(set_) or "OpenMP's default"


def _cpu_row(r: CaseResult) -> tuple:
    c = r.extra["cpu_s"]
    per_step = (c["conductor"] + c["client"]) / max(r.extra["steps"], 1) * 1e3
    return (c["worker.main"], c["worker.others"], c["conductor"], c["client"], r.seconds, per_step)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="./dev bench lm", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a tiny model, 4 requests x 16 tokens, float32 (smoke run)")
    p.add_argument("--dtypes", default=None, help="comma-separated (default float32,bfloat16; --quick: float32)")
    p.add_argument("--cases", default="abcd", help="which of a, b, c, d, e to run (default abcd; on cuda abcde)")
    p.add_argument("--threads", type=_counts, default=[1], help="torch threads for every case and the worker, or "
                   "several (1,2: every case at each, served/bare per thread count); default 1: with more, a busy "
                   "shared machine stalls OpenMP barriers")
    p.add_argument("--a-requests", type=int, default=None, help="prompts (a) runs (default 4; --quick: all)")
    p.add_argument("--repeat", type=int, default=1, help="run (c) and (d) this many times, alternating; keep the best")
    p.add_argument("--device", default="cpu", help="cpu or cuda (every case on that device; default cpu)")
    p.add_argument("--cuda-graphs", action="store_true", help="(d) serves with CUDA-graph decode (on cuda; ignored on cpu)")
    args = p.parse_args(argv)
    gpu = args.device != "cpu"
    shape = QUICK if args.quick else GPU if gpu else FULL
    dtypes = (args.dtypes or ("float32" if args.quick else "bfloat16" if gpu else "float32,bfloat16")).split(",")
    if not gpu:
        args.cases = args.cases.replace("e", "")  # CUDA graphs need a GPU
    elif args.cases == "abcd":
        args.cases = "abcde"
    if args.a_requests is None and not args.quick:
        args.a_requests = 4
    from walkserve.models.llama.tiny import write_tiny

    before = os.getloadavg()[0]
    by_dtype, pairs = {}, []
    with tempfile.TemporaryDirectory(prefix="walkserve-bench-lm-") as tmp:
        path = write_tiny("llama", Path(tmp) / "model", **shape.model)
        for threads in args.threads:
            for dtype in dtypes:
                label = dtype if len(args.threads) == 1 else f"{dtype}, {threads} threads"
                by_dtype[label], pair = run_dtype(path, shape, dtype, threads, args)
                pairs.append(pair)
    print()
    print(report(shape, args, by_dtype, (before, os.getloadavg()[0]), pairs))
    return 0


def _counts(text: str) -> list[int]:
    counts = [int(x) for x in text.split(",") if x.strip()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"thread counts must be >= 1, got {text!r}")
    return counts
