"""``./dev bench tts``: Orpheus text-to-speech streaming on the CPU, walkserve against a naive baseline.

    walkserve   AsyncEngine on a shipped placement (default orpheus-split: LM on rank 0, SNAC on rank 1),
                N concurrent requests (N = 1, 4, 16)
    baseline    the same checkpoint, one request at a time: transformers ``generate`` with a streamer
                that decodes each SNAC window inline with the ``snac`` package (the official streaming
                decoder's loop: 28-token windows every 7 tokens), ``benchmarks/tts_baseline.py``

Model: an Orpheus-shaped LM (``walkserve tiny orpheus --preset bench``: Llama, hidden 192, 6 layers,
Orpheus's 156,940-id vocabulary, ~33M parameters) and the full-size SNAC 24 kHz decoder (19.8M),
both random weights. Random weights do not emit END_OF_SPEECH on purpose (only by chance: it is one of
the 4,097 ids allowed per step), so every request asks for the same ``max_tokens`` = frames x 7.

Metrics, per request (times from submission): time to first audio (TTFA); RTF = finish time / audio
duration; audio seconds per wall second over the round; streaming viability = share of chunks that
arrive before the audio already delivered has finished playing (chunk k by TTFA + duration of 0..k-1).

Then the offered-load sweep (``benchmarks/tts_load.py``): real-time streams arriving open-loop (Poisson
levels and a burst) against ``--admission capacity`` and ``--admission count``, side by side; its SVG goes
to ``--plot`` (default docs/streaming-capacity.svg). ``--only load`` runs just the sweep (with
``--quick``: about 2 minutes), ``--only concurrency`` just the part above; ``--quick`` alone is the
smoke run of the part above only.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import conditions, pct, table
from benchmarks.tts_load import BASELINE, NEW, modes_arg
from benchmarks.tts_trace import StreamTrace

WORDS = ["the", "morning", "light", "fell", "softly", "across", "quiet", "hills", "while", "small", "birds", "sang", "near", "an", "old", "stone", "bridge", "people", "walked", "slowly", "toward", "the", "market", "carrying", "bread", "fresh", "fruit", "and", "warm", "coffee", "for", "friends", "a", "gentle", "wind", "moved", "through", "tall", "green", "trees", "and", "children", "laughed", "beside", "the", "river", "under", "clear", "skies"]


@dataclass(frozen=True)
class Setup:
    """Model presets and workload of one benchmark size."""

    lm: str
    snac: str
    concurrency: tuple[int, ...]
    frames: int  # audio frames per request (2048 samples = 85.3 ms each)
    words: int
    rounds_c1: int  # sequential single requests at concurrency 1 (for percentiles)
    baseline_requests: int

    @property
    def max_tokens(self) -> int:
        return 7 * self.frames


FULL = Setup("bench", "full", (1, 4, 16), frames=24, words=40, rounds_c1=3, baseline_requests=3)
QUICK = Setup("tiny", "tiny", (1, 3), frames=6, words=12, rounds_c1=1, baseline_requests=1)


class Requests:
    """Distinct texts of ``words`` words (no prefix-cache reuse between requests), fixed length, seeded."""

    def __init__(self, processor, setup: Setup, greedy: bool):
        self.processor, self.setup, self.greedy, self.count = processor, setup, greedy, 0

    def text(self, i: int) -> str:
        rng = random.Random(i)
        words = [rng.choice(WORDS) for _ in range(self.setup.words)]
        return " ".join(words).capitalize() + "."

    def make(self, n: int, max_tokens: int | None = None):
        specs = []
        for _ in range(n):
            i, self.count = self.count, self.count + 1
            over = {"temperature": 0.0} if self.greedy else {}
            sampling = self.processor.sampling(max_tokens=max_tokens or self.setup.max_tokens, seed=1000 + i, **over)
            voice = self.processor.voices[i % len(self.processor.voices)]
            specs.append(self.processor.build_request("speech", {"input": self.text(i), "voice": voice}, sampling, self.processor.check_params({})))
        return specs


@dataclass
class Row:
    system: str
    concurrency: int
    traces: list[StreamTrace]
    wall_s: float
    codec_batch: float = float("nan")

    def throughput(self) -> float:
        return sum(t.audio_s for t in self.traces) / self.wall_s

    def viability(self) -> float:
        ok, n = map(sum, zip(*(t.viable() for t in self.traces)))
        return ok / n if n else float("nan")


def baseline_rows(traces: list[StreamTrace], concurrency: tuple[int, ...]) -> list[Row]:
    """A one-at-a-time server at concurrency c: c requests queued at once, FIFO, each a measured trace."""
    rows = []
    for c in concurrency:
        if c == 1:  # every measured request, one after another (as walkserve's concurrency-1 rounds)
            rows.append(Row("baseline", 1, list(traces), sum(t.finished_s for t in traces)))
            continue
        queue, wait = [], 0.0
        for i in range(c):
            t = traces[i % len(traces)]
            queue.append(t.shifted(wait))
            wait += t.finished_s
        rows.append(Row("baseline", c, queue, wait))
    return rows


def served_rows(rounds, concurrency: tuple[int, ...], system: str = "walkserve") -> list[Row]:
    rows = []
    for c in concurrency:
        mine = [r for r in rounds if r.concurrency == c]
        batches = sum(r.codec.get("batches", 0) for r in mine)
        items = sum(r.codec.get("items", 0) for r in mine)
        rows.append(Row(system, c, [t for r in mine for t in r.traces], sum(r.wall_s for r in mine) / len(mine),
                        items / batches if batches else float("nan")))
        if c == 1:  # sequential single requests: throughput of one at a time
            rows[-1].wall_s = sum(r.wall_s for r in mine)
    return rows


def codec_probe(model_dir: Path, batches: tuple[int, ...], threads: int) -> list[tuple[int, str, float]]:
    """(batch, what, ms per row) for a 4-frame window of walkserve's SNAC decoder in this process:
    decoded whole, and only the one frame a regular streaming window emits (what the codec computes)."""
    import torch

    from walkserve.models.snac.weights import load_snac

    torch.set_num_threads(threads)
    dec = load_snac(model_dir / "snac")
    out = []
    for b in batches:
        codes = [torch.randint(0, 4096, (b, 4 * m)) for m in (1, 2, 4)]
        for what, keep in (("whole window", None), ("1 emitted frame", (2048, 4096))):
            times = []
            for _ in range(4):
                gens = [torch.Generator().manual_seed(i) for i in range(b)]
                t = time.perf_counter()
                dec.decode(codes, gens, keep=keep)
                times.append(time.perf_counter() - t)
            out.append((b, what, min(times[1:]) / b * 1e3))
    return out


def result_rows(rows: list[Row], base: dict[int, Row]) -> list[tuple]:
    out = []
    for r in rows:
        ttfa = [t.ttfa_s * 1e3 for t in r.traces]
        b = base.get(r.concurrency)
        ratio = r.throughput() / b.throughput() if b else float("nan")
        early = sum(t.reason == "stop" for t in r.traces)
        out.append((r.system, r.concurrency, len(r.traces), pct(ttfa, 0.5), pct(ttfa, 0.95),
                    pct([t.rtf for t in r.traces], 0.5), r.throughput(), ratio, f"{100 * r.viability():.1f}%",
                    r.codec_batch, early))
    return out


def verdicts(served: list[Row], base: dict[int, Row], baseline: list[StreamTrace]) -> list[str]:
    lines = []
    top = max(served, key=lambda r: r.concurrency)
    ratio = top.throughput() / base[top.concurrency].throughput()
    ok = ratio >= 4 and top.viability() >= 0.99
    lines.append(f"- concurrency {top.concurrency}: {ratio:.2f}x the baseline's audio throughput (target >= 4x), "
                 f"viability {100 * top.viability():.1f}% (target >= 99%): {'met' if ok else 'MISSED'}")
    one = next((r for r in served if r.concurrency == 1), None)
    if one is not None:
        window_tokens = pct([t.extra["t_window_tokens_s"] for t in baseline if "t_window_tokens_s" in t.extra], 0.5)
        window = pct([t.extra["t_first_window_decode_s"] for t in baseline if "t_first_window_decode_s" in t.extra], 0.5)
        target = (window_tokens + window) * 1e3
        got = pct([t.ttfa_s * 1e3 for t in one.traces], 0.5)
        lines.append(f"- concurrency 1: TTFA p50 {got:.0f} ms vs target {target:.0f} ms = time to 4 frames "
                     f"({window_tokens * 1e3:.0f} ms: prompt + 28 tokens, transformers) + one SNAC window "
                     f"({window * 1e3:.0f} ms, snac package): {'met' if got <= target else 'MISSED'}")
    return lines


def report(setup: Setup, args, served: list[Row], base_rows: list[Row], baseline: list[StreamTrace],
           probe: list[tuple[int, str, float]], load: tuple[float, float]) -> str:
    base = {r.concurrency: r for r in base_rows}
    lm = {"bench": "Orpheus-shaped Llama, hidden 192, 6 layers, GQA 6/2, ~33M params",
          "gpu": "Orpheus-shaped Llama, hidden 512, 8 layers, GQA 8/2 x 64, ~105M params",
          "tiny": "tiny Llama, hidden 64, 2 layers, ~10M params"}[setup.lm] + f", {args.dtype}"
    sampling = "greedy" if args.greedy else "temperature 0.6, top_p 0.8, repetition penalty 1.3 (the card's)"
    lines = [
        f"## TTS (Orpheus) streaming on {'the CPU' if args.device == 'cpu' else 'the GPU (' + args.device + ')'} "
        f"(`./dev bench tts{' --quick' if args.quick else ''}{'' if args.device == 'cpu' else ' --device ' + args.device}`)", "",
        f"- model: {lm} (vocab 156,940) + SNAC 24 kHz {setup.snac} decoder; random weights",
        f"- workload: {setup.words}-word texts, {setup.max_tokens} audio tokens each = {setup.frames} frames = "
        f"{setup.frames * 2048 / 24000:.2f} s of audio; sampling {sampling}, seeded",
        f"- walkserve: placement {args.placement}{'' if args.device == 'cpu' else ' (every rank on ' + args.device + ')'}, "
        f"CUDA graphs {bool(args.cuda_graphs and args.device != 'cpu')}, {args.threads} torch thread(s) per worker; concurrency 1 = "
        f"{setup.rounds_c1} requests one after another; wall time per round",
        f"- baseline: transformers generate + snac, SNAC window decoded inline every 7 tokens (per window, as the "
        f"official streaming decoder), {args.baseline_threads} threads; {len(baseline)} requests measured; at "
        f"concurrency c the c requests queue FIFO behind each other (measured traces, shifted by the wait)",
        f"- machine: {conditions(args.device)}; load average {load[0]:.2f} before, {load[1]:.2f} after", "",
        table(["system", "conc.", "requests", "TTFA p50 ms", "TTFA p95 ms", "RTF p50", "audio s / wall s",
               "x baseline", "viability", "codec batch", "stopped early"],
              result_rows(served, base) + result_rows(base_rows, {})),
        "",
    ]
    if probe:
        lines += ["walkserve's SNAC decoder alone (this process, best of 3), ms per row for a 4-frame window: " +
                  ", ".join(f"batch {b} {what} {ms:.0f}" for b, what, ms in probe), ""]
    lines += verdicts([r for r in served if r.system == served[0].system], base, baseline)  # the first placement's
    return "\n".join(lines)


def system_label(names: list[str], i: int) -> str:
    """The rows' system of the ``i``-th of the placements ``names``: plain ``walkserve`` when it is the only one."""
    name = names[i]
    return "walkserve" if len(names) == 1 else f"walkserve {name}" + (f" #{i + 1}" if names.count(name) > 1 else "")


def run(setup: Setup, args) -> str:
    import walkserve.models.builtin  # noqa: F401
    from walkserve.models.base import ModelRef
    from walkserve.models.orpheus.tiny import write_tiny_orpheus
    from walkserve.models.registry import load_model
    from walkserve.placements import path as placement_path

    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="walkserve-bench-tts-") as tmp:
        model_dir = write_tiny_orpheus(Path(tmp) / "orpheus", lm=setup.lm, snac=setup.snac, seed=0)
        processor = load_model(ModelRef("orpheus", str(model_dir))).processor()
        reqs = Requests(processor, setup, args.greedy)
        rounds = [reqs.make(1) for _ in range(setup.rounds_c1)] if 1 in setup.concurrency else []
        rounds += [reqs.make(c) for c in setup.concurrency if c != 1]
        from benchmarks.tts_served import served_rounds

        kv = {"cuda_graphs": True} if args.cuda_graphs and args.device != "cpu" else None
        names, served = args.placement.split(","), []
        for i, name in enumerate(names):  # several placements: one after another, the same requests each
            print(f"walkserve: {len(rounds)} rounds on {name} ({args.device}) ...", flush=True)
            placement = _placement(str(placement_path(name)), args.device)
            done = served_rounds(model_dir, placement, args.threads, reqs.make(1, 35)[0], rounds, args.dtype, kv)
            served += served_rows(done, setup.concurrency, system_label(names, i))
        from benchmarks.tts_baseline import Baseline

        print(f"baseline: {setup.baseline_requests} requests one at a time ...", flush=True)
        baseline = Baseline(model_dir, args.baseline_threads, args.device)
        baseline.speak(reqs.make(1, 35)[0])  # warm-up
        traces = [baseline.speak(s) for s in reqs.make(setup.baseline_requests)]
        probe = [] if args.quick or args.device != "cpu" else codec_probe(model_dir, (1, max(setup.concurrency)),
                                                                            args.threads)
    base_rows = baseline_rows(traces, setup.concurrency)
    return report(setup, args, served, base_rows, traces, probe, (load0, os.getloadavg()[0]))


def run_sweep(args) -> str:
    import walkserve.models.builtin  # noqa: F401
    from benchmarks.tts_load import FULL as SWEEP_FULL
    from benchmarks.tts_load import QUICK as SWEEP_QUICK
    from benchmarks.tts_load import load_report, sweep_modes
    from walkserve.models.base import ModelRef
    from walkserve.models.orpheus.tiny import write_tiny_orpheus
    from walkserve.models.registry import load_model
    from walkserve.placements import path as placement_path

    sweep = SWEEP_QUICK if args.quick else SWEEP_FULL
    name = args.placement.split(",")[0]  # the sweep runs on the first placement
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="walkserve-bench-tts-load-") as tmp:
        model_dir = write_tiny_orpheus(Path(tmp) / "orpheus", lm=args.sweep_lm, snac=args.sweep_snac, seed=0)
        processor = load_model(ModelRef("orpheus", str(model_dir))).processor()
        reqs = Requests(processor, Setup(args.sweep_lm, args.sweep_snac, (1,), sweep.frames, 12, 1, 1), args.greedy)

        def make(n: int, frames: int):
            specs = reqs.make(n, 7 * frames)
            for spec in specs:
                spec.audio_rate, spec.realtime = 24000, True
            return specs

        print("load sweep: capacity+deadline, then the baselines ...", flush=True)
        modes = tuple(args.sweep_modes.split(","))
        over = {"input": "One stream too many.", "voice": "tara", "response_format": "pcm", "max_tokens": 71}
        capacity, levels, rejections = sweep_modes(model_dir, _placement(str(placement_path(name)), "cpu"),
                                                   args.threads, make, sweep, modes, http=("/v1/audio/speech", over))
    model = (f"tiny Orpheus (LM preset {args.sweep_lm}, SNAC {args.sweep_snac}), random weights, placement "
             f"{name}, {args.threads} torch thread(s) per worker, CPU")
    title = f"./dev bench tts --only load{' --quick' if args.quick else ''} --sweep-modes {args.sweep_modes}"
    return load_report(title, model, sweep, capacity, levels, (load0, os.getloadavg()[0]), args.plot,
                       f"tiny Orpheus, {name}, capacity {capacity}", rejections)


def _placement(path: str, device: str):
    """The shipped placement as given on the CPU; on a GPU, the same ranks all on ``device`` (one GPU)."""
    if device == "cpu":
        return path
    import yaml

    with open(path) as f:
        placement = yaml.safe_load(f)
    for rank in placement["ranks"]:
        rank["device"] = device if ":" in device else f"{device}:0"
    return placement


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="./dev bench tts", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny LM + tiny SNAC, concurrency 1 and 3, 6 frames (smoke run)")
    p.add_argument("--concurrency", default=None, help="comma-separated levels (default 1,4,16)")
    p.add_argument("--frames", type=int, default=None, help="audio frames per request (default 24 = 2.05 s)")
    p.add_argument("--placement", default="orpheus-split",
                   help="shipped placement name or YAML path; several, comma-separated (e.g. orpheus-split,orpheus-colocated"
                   "), run one after another on the same requests, a row each (the verdicts are the first's)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per walkserve worker (default 1)")
    p.add_argument("--baseline-threads", type=int, default=1,
                   help="torch threads for the baseline (default 1: on a busy shared machine more threads stall)")
    p.add_argument("--baseline-requests", type=int, default=None, help="requests the baseline runs (default 3)")
    p.add_argument("--greedy", action="store_true", help="greedy decoding instead of the card's sampling")
    p.add_argument("--device", default="cpu", help="cpu or cuda: every rank of the placement and the baseline there "
                   "(on cuda the LM is the 'gpu' preset, head dim 64, in bfloat16)")
    p.add_argument("--cuda-graphs", action="store_true", help="the LM decodes through CUDA graphs (on cuda)")
    p.add_argument("--dtype", default=None, help="the LM's dtype (default: float32 on cpu, bfloat16 on cuda)")
    p.add_argument("--only", choices=["concurrency", "load"], default=None,
                   help="run only the concurrency comparison or only the offered-load sweep (default: both)")
    p.add_argument("--sweep-lm", default="tiny", help="LM preset of the load sweep (default: tiny)")
    p.add_argument("--sweep-snac", default="tiny", help="SNAC preset of the load sweep (default: tiny)")
    p.add_argument("--sweep-modes", default=f"{NEW},{BASELINE}", type=modes_arg,
                   help="ADMISSION+SCHEDULING modes of the load sweep, the first with capacity admission (it sets the "
                   "levels), e.g. capacity+deadline,count+fifo,capacity+fifo,count+deadline (default: %(default)s)")
    p.add_argument("--plot", default="docs/streaming-capacity.svg", help="where the load sweep's SVG goes ('' = none)")
    args = p.parse_args(argv)
    if args.only == "load":
        print(run_sweep(args))
        return 0
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    setup = QUICK if args.quick else FULL
    if args.device != "cpu" and not args.quick:
        setup = Setup(**{**setup.__dict__, "lm": "gpu"})
    changes = {}
    if args.concurrency:
        changes["concurrency"] = tuple(int(c) for c in args.concurrency.split(","))
    if args.frames:
        changes["frames"] = args.frames
    if args.baseline_requests:
        changes["baseline_requests"] = args.baseline_requests
    if changes:
        setup = Setup(**{**setup.__dict__, **changes})
    print(run(setup, args))
    if args.only is None and args.device == "cpu" and not args.quick:  # --quick: a smoke run of the part above
        print()
        print(run_sweep(args))
    return 0
