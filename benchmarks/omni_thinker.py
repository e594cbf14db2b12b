"""``./dev bench omni-thinker``: Qwen3-Omni's thinker on image + 5 s audio requests, side by side in one run.

    (ref)  transformers Qwen3OmniMoe thinker.generate, one request at a time
    (1)    walkserve, placement qwen3-omni (one rank), at concurrency 1 / 4 / 16
    (2)    walkserve, placement qwen3-omni-encoders-split (encoders on their own rank), the same

Each request: an image (224 x 224 -> 49 merged tokens), a 5 s clip (65 audio tokens) and a question,
64 new tokens, greedy, EOS ignored. The model is a random-weight Qwen3-Omni small enough for a CPU but
with the release's structure (MoE thinker with top-k routing and deepstack, windowed audio encoder,
vision encoder with a merger). The reference runs before walkserve and again after (the machine's
load drifts); its better run counts. Targets: >= 3x the reference's tokens/s at concurrency 16, TTFT at
concurrency 1 no worse than the reference's. The encoders' share of TTFT is the encoders' busy time per
request over the mean TTFT (on the split placement their work overlaps the thinker's decode of others).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from benchmarks.common import conditions, mean, pct, table
from benchmarks.omni_cases import RunResult, Workload, reference, served

# thinker / audio / vision overrides of the tiny writer's config (walkserve.models.qwen3_omni.tiny)
BENCH = dict(
    thinker=dict(vocab_size=4096, hidden_size=512, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
                 head_dim=64, moe_intermediate_size=256, num_experts=32, num_experts_per_tok=4, intermediate_size=512,
                 rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [12, 10, 10],
                                  "interleaved": True}),
    audio=dict(d_model=256, encoder_layers=4, encoder_attention_heads=4, encoder_ffn_dim=1024,
               downsample_hidden_size=64, output_dim=512, n_window_infer=800),
    vision=dict(depth=4, hidden_size=256, intermediate_size=1024, num_heads=4, out_hidden_size=512,
                deepstack_visual_indexes=[1, 2, 3]))
QUICK = dict(thinker={}, audio={}, vision={})  # the tiny writer's own sizes
PLACEMENTS = ("qwen3-omni", "qwen3-omni-encoders-split")


def describe(path: Path) -> str:
    from walkserve.models.qwen3_omni.config import Qwen3OmniConfig
    from walkserve.models.qwen3_omni.memory import stored_bytes

    c = Qwen3OmniConfig.from_file(path)
    t, a, v = c.text, c.audio, c.vision
    sizes = {k: b / 4 / 1e6 for k, b in stored_bytes(path).items()}  # float32 parameters, millions
    return (f"thinker {sizes['thinker']:.1f}M params (hidden {t.hidden_size}, {t.num_hidden_layers} MoE layers, "
            f"{t.num_experts} experts top-{t.num_experts_per_tok} x {t.moe_intermediate_size}, {t.num_attention_heads} "
            f"heads / {t.num_key_value_heads} KV x {t.head_dim}, vocab {t.vocab_size}); audio encoder "
            f"{sizes['audio_encoder']:.1f}M (d {a.d_model}, {a.encoder_layers} layers); vision encoder "
            f"{sizes['vision_encoder']:.1f}M (d {v.hidden_size}, {v.depth} blocks, deepstack {list(v.deepstack_visual_indexes)});"
            f" random weights, {c.dtype}")


def _same(r: RunResult, ref: RunResult) -> str:
    n = min(len(ref.tokens), len(r.tokens))
    same = sum(r.tokens[i] == ref.tokens[i] for i in range(n))
    return f"{same}/{n} same tokens as (ref)"


def rows(ref: RunResult, runs: dict[str, dict[int, RunResult]]) -> list[tuple]:
    out = [("(ref) transformers, 1 at a time", 1, ref.tokens_per_s(), 1.0, pct(ref.ttft_s, 0.5) * 1e3,
            mean(ref.ttft_s) * 1e3, "", len(ref.tokens), "")]
    for name, levels in runs.items():
        for c, r in levels.items():
            share = r.extra["encoder_s_per_request"] / mean(r.ttft_s)
            out.append((f"walkserve {name}", c, r.tokens_per_s(), r.tokens_per_s() / ref.tokens_per_s(),
                        pct(r.ttft_s, 0.5) * 1e3, mean(r.ttft_s) * 1e3, f"{share:.0%}", r.extra["requests"],
                        _same(r, ref)))
    return out


def verdict(ref: RunResult, runs: dict[str, dict[int, RunResult]]) -> list[str]:
    lines = []
    for name, levels in runs.items():
        top = max(levels)
        ratio = levels[top].tokens_per_s() / ref.tokens_per_s()
        ttft = mean(levels[min(levels)].ttft_s) / mean(ref.ttft_s)
        lines.append(f"- {name}: tokens/s at concurrency {top} = {ratio:.2f} x (ref) (target >= 3: "
                     f"{'met' if ratio >= 3 else 'MISSED'}); TTFT at concurrency {min(levels)} = {ttft:.2f} x (ref) "
                     f"(target <= 1: {'met' if ttft <= 1 else 'MISSED'})")
    return lines


def report(path: Path, work: Workload, ref: RunResult, runs: dict[str, dict[int, RunResult]], load: tuple) -> str:
    lines = ["## Qwen3-Omni thinker: image + audio in, text out (`./dev bench omni-thinker`)", "",
             f"- model: {describe(path)}",
             f"- workload: per request one {work.image_size[0]}x{work.image_size[1]} image, one {work.audio_seconds:g} s "
             f"clip, a question; {work.new_tokens} new tokens, greedy, EOS ignored; (ref) runs {work.requests} requests "
             f"one after another, walkserve max({work.requests}, concurrency) requests at each concurrency",
             f"- machine: {conditions()}; torch threads per case / per worker: {work.threads}; load average "
             f"{load[0]:.2f} before, {load[1]:.2f} after",
             "- tokens/s = all new tokens / wall time (after a warm-up; loading and start-up excluded); TTFT from the "
             "request's preprocessing (mel, image resize) to its first token; encoders' share = encoder busy seconds "
             "per request / mean TTFT",
             "- (ref) ran " + " and ".join(f"{t:.2f} tokens/s, TTFT {f * 1e3:.0f} ms" for t, f in ref.extra["runs"])
             + ("; the table keeps its best tokens/s and its best TTFT" if len(ref.extra["runs"]) > 1 else ""), ""]
    lines.append(table(["case", "concurrency", "tokens/s", "x (ref)", "TTFT p50 ms", "TTFT mean ms",
                        "encoders' share of TTFT", "requests", "check"], rows(ref, runs)))
    return "\n".join([*lines, "", *verdict(ref, runs)])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="./dev bench omni-thinker", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the tiny checkpoint, 2 requests x 8 tokens at concurrency 2 "
                   "(a smoke run)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the reference and each worker (default 1)")
    p.add_argument("--requests", type=int, default=None, help="requests of (ref) and at concurrency 1 (default 4)")
    p.add_argument("--placements", default=",".join(PLACEMENTS), help="comma-separated shipped placements")
    args = p.parse_args(argv)
    from walkserve.models.qwen3_omni.tiny import write_tiny_qwen3_omni

    shape = QUICK if args.quick else BENCH
    concurrency = [2] if args.quick else [1, 4, 16]
    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="walkserve-bench-omni-") as tmp:
        path = write_tiny_qwen3_omni(Path(tmp) / "qwen3-omni-bench", seed=5, shards=2,
                                     audio=shape["audio"], vision=shape["vision"], **shape["thinker"])
        work = Workload(path, args.requests or (2 if args.quick else 4), 8 if args.quick else 64, 5.0,
                        (64, 64) if args.quick else (224, 224), args.threads)
        print(f"reference: {work.requests} requests ...", flush=True)
        refs = [reference(work)]
        runs = {}
        for name in args.placements.split(","):
            print(f"walkserve {name}: concurrency {concurrency} ...", flush=True)
            runs[name] = served(work, name, concurrency)
        if not args.quick:  # the machine's load drifts: the reference again, and it keeps its better run
            print("reference again ...", flush=True)
            refs.append(reference(work))
        ref = max(refs, key=lambda r: r.tokens_per_s())
        ref.extra["runs"] = [(r.tokens_per_s(), mean(r.ttft_s)) for r in refs]
        ref.ttft_s = min((r.ttft_s for r in refs), key=mean)
        print()
        print(report(path, work, ref, runs, (before, os.getloadavg()[0])))
    return 0
