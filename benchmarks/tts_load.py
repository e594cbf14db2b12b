"""Offered-load sweep of real-time speech streams: admission by capacity against admission by count.

Modes: ``capacity+deadline`` (the default: ``--admission capacity``,
``--stream-scheduling deadline``), the baseline ``count+fifo`` (both off: as
before); ``--sweep-modes`` adds capacity+fifo (admission alone) or count+deadline (scheduling alone).
Each mode runs its own server (AsyncEngine on the placement), warmed by the
same streams. Then, per level, streams arrive open-loop: Poisson arrivals at
``load x capacity / audio length`` streams per second for ``seconds`` (so the
offered concurrency, were every stream served at real time, is ``load x
capacity``), and one burst of ``burst x capacity`` streams at once. Capacity
is what the capacity-mode server estimated after its warm-up; both modes get
the same arrival schedules (seeded).

Per level: fraction admitted, viability of the admitted streams (no gap after
a start-up buffer of min(TTFA, 1 s), ``StreamTrace.gap_free``), TTFA p50/p99
of the admitted, and goodput: audio seconds of viable streams per wall second
(first arrival to last finish).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import pct
from benchmarks.http_rejections import Rejections, http_rejections
from benchmarks.tts_trace import SAMPLE_RATE, StreamTrace


@dataclass(frozen=True)
class Sweep:
    frames: int  # audio frames per stream
    seconds: float  # arrival window of a Poisson level
    loads: tuple[float, ...]  # offered concurrency, in multiples of the estimated capacity
    burst: float  # a burst of this many x capacity streams at once
    frame_samples: int = 2048  # samples per frame: Orpheus's SNAC 2048 (85.3 ms), Qwen3-Omni's Code2Wav 1920 (80 ms)

    @property
    def audio_s(self) -> float:
        return self.frames * self.frame_samples / SAMPLE_RATE


QUICK = Sweep(frames=24, seconds=5.0, loads=(0.5, 1.0, 2.0, 4.0), burst=4.0)
FULL = Sweep(frames=36, seconds=10.0, loads=(0.25, 0.5, 1.0, 2.0, 4.0), burst=4.0)
NEW, BASELINE = "capacity+deadline", "count+fifo"


@dataclass
class Level:
    mode: str
    name: str  # "0.5x", ..., "burst 4x"
    load: float
    offered: int
    traces: list[StreamTrace] = field(default_factory=list)
    rejected_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def admitted(self) -> float:
        return len(self.traces) / self.offered if self.offered else float("nan")

    def viable(self) -> list[StreamTrace]:
        return [t for t in self.traces if t.gap_free()]

    def viability(self) -> float:
        return len(self.viable()) / len(self.traces) if self.traces else float("nan")

    def goodput(self) -> float:
        return sum(t.audio_s for t in self.viable()) / self.wall_s if self.wall_s else 0.0

    def row(self) -> tuple:
        ttfa = [t.ttfa_s * 1e3 for t in self.traces]
        return (self.mode, self.name, self.offered, f"{100 * self.admitted():.0f}%", f"{100 * self.viability():.0f}%",
                pct(ttfa, 0.5), pct(ttfa, 0.99), self.goodput(), pct(self.rejected_ms, 0.5), pct(self.rejected_ms, 0.99))


async def _stream(engine, spec, t0: float, level: Level) -> None:
    from walkserve.core.errors import AdmissionRejected
    from walkserve.core.outputs import RequestFinished

    trace, sent = StreamTrace(spec.id), time.perf_counter()
    try:
        async for out in engine.generate(spec):
            now = time.perf_counter() - sent
            if isinstance(out, RequestFinished):
                trace.finished_s, trace.reason = now, out.reason.value
            elif out.modality == "audio":
                trace.add(now, out.data.numel)
    except AdmissionRejected:
        level.rejected_ms.append((time.perf_counter() - sent) * 1e3)
        return
    level.traces.append(trace)
    level.wall_s = max(level.wall_s, time.perf_counter() - t0)


async def _level(engine, specs, arrivals: list[float], level: Level) -> Level:
    t0 = time.perf_counter()

    async def later(spec, at: float) -> None:
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
        await _stream(engine, spec, t0, level)

    await asyncio.gather(*(later(s, at) for s, at in zip(specs, arrivals)))
    return level


def schedules(sweep: Sweep, capacity: int, seed: int = 0) -> list[tuple[str, float, list[float]]]:
    """(name, load, arrival times) per level: Poisson levels, then the burst."""
    rng, out = random.Random(seed), []
    for load in sweep.loads:
        rate = load * capacity / sweep.audio_s
        times, t = [], rng.expovariate(rate)
        while t < sweep.seconds:
            times.append(t)
            t += rng.expovariate(rate)
        out.append((f"{load:g}x", load, times or [0.0]))
    out.append((f"burst {sweep.burst:g}x", sweep.burst, [0.0] * max(1, round(sweep.burst * capacity))))
    return out


async def _mode(family: str, mode: str, model_dir: Path, placement, threads: int, make, sweep: Sweep,
                capacity: int | None, http: tuple[str, dict] | None = None) -> tuple[int, list[Level], Rejections | None]:
    from walkserve.core.config import RuntimeConfig
    from walkserve.core.scheduling import StreamScheduling
    from walkserve.entrypoint.engine import AsyncEngine

    admission, scheduling = mode.split("+")
    config = RuntimeConfig(worker_threads=threads, status_interval_s=0.1, admission=admission,
                           stream_scheduling=StreamScheduling(scheduling))
    engine = await AsyncEngine.start(family, placement=placement, config=config, model_path=str(model_dir))
    try:
        for n in (1, 1, 2, 4):  # the same warm-up for both modes: the capacity model's first measurements
            await _level(engine, make(n, 12), [0.0] * n, Level(mode, "warm-up", 0, n))
        await engine.refresh_status()
        if capacity is None:
            capacity = int(engine.stats().streams.get("capacity", 1))
        levels = []
        for name, load, arrivals in schedules(sweep, capacity):
            print(f"  {mode}: {name}, {len(arrivals)} streams ...", flush=True)
            levels.append(await _level(engine, make(len(arrivals), sweep.frames), arrivals,
                                       Level(mode, name, load, len(arrivals))))
        rejections = None
        if http is not None and admission == "capacity":
            await engine.refresh_status()
            streams = int(engine.stats().streams.get("capacity", 1))
            print(f"  {mode}: 429s over HTTP while {streams} streams play ...", flush=True)
            rejections = await http_rejections(engine, make, streams, *http)
        return capacity, levels, rejections
    finally:
        await engine.shutdown(drain_s=0)


def sweep_modes(model_dir: Path, placement, threads: int, make, sweep: Sweep, modes: tuple[str, ...] = (NEW, BASELINE),
                family: str = "orpheus", http: tuple[str, dict] | None = None) -> tuple[int, list[Level], Rejections | None]:
    """Each ``admission+scheduling`` mode: the first (capacity admission: its estimate sets the levels), then
    the others on the same schedules. ``make(n, frames)``: n fresh real-time speech specs of ``frames`` frames.
    ``http``: (route, body) of one stream over capacity: the first mode then also times 429s over HTTP."""
    capacity, levels, rejections = asyncio.run(_mode(family, modes[0], model_dir, placement, threads, make, sweep,
                                                     None, http))
    for mode in modes[1:]:
        levels += asyncio.run(_mode(family, mode, model_dir, placement, threads, make, sweep, capacity))[1]
    return capacity, levels, rejections


def modes_arg(text: str) -> str:
    """``--sweep-modes``: ADMISSION+SCHEDULING,... the first with capacity admission (it sets the levels)."""
    import argparse

    modes = text.split(",")
    ok = {f"{a}+{s}" for a in ("capacity", "count") for s in ("deadline", "fifo")}
    if not modes or any(m not in ok for m in modes) or not modes[0].startswith("capacity+"):
        raise argparse.ArgumentTypeError(f"modes from {sorted(ok)}, the first with capacity admission")
    return text


def load_report(title: str, model: str, sweep: Sweep, capacity: int, levels: list[Level],
                load: tuple[float, float], plot: str, caption: str, rejections: Rejections | None = None) -> str:
    """The sweep's Markdown section (conditions, one table, a line per level), and its SVG at ``plot``."""
    from benchmarks.common import conditions, table
    from benchmarks.tts_plot import sweep_svg

    by = {(lv.mode, lv.name): lv for lv in levels}
    lines = [
        f"## Real-time streams under offered load (`{title}`)", "", f"- model: {model}",
        f"- streams: {sweep.frames} frames = {sweep.audio_s:.2f} s of audio each, realtime; Poisson levels over "
        f"{sweep.seconds:g} s at offered concurrency load x capacity, then a burst; capacity = {capacity} streams "
        f"(the capacity-mode server's estimate after warm-up, headroom 0.8), TTFA budget 1 s",
        "- modes: ADMISSION+SCHEDULING = `--admission ADMISSION --stream-scheduling SCHEDULING`; capacity+deadline "
        "are the defaults, count+fifo the baseline (both off, as before)",
        "- viable: no gap after a start-up buffer of min(TTFA, 1 s); goodput: audio seconds of viable streams per "
        "wall second; TTFA of admitted streams; 429: time to the rejection (AdmissionRejected; a stream that waited "
        "within its TTFA budget and could not start is rejected when the budget ends)",
        f"- machine: {conditions('cpu')}; load average {load[0]:.2f} before, {load[1]:.2f} after "
        "(a shared machine: figures move with its load)", "",
        table(["admission+scheduling", "level", "streams", "admitted", "viable", "TTFA p50 ms", "TTFA p99 ms",
               "viable audio s / wall s", "429 p50 ms", "429 p99 ms"], [lv.row() for lv in levels]), "",
    ]
    for name in dict.fromkeys(lv.name for lv in levels):
        new, base = by.get((NEW, name)), by.get((BASELINE, name))
        if new and base:
            lines.append(f"- {name}: viable {100 * new.viability():.0f}% vs {100 * base.viability():.0f}%, goodput "
                         f"{new.goodput():.2f} vs {base.goodput():.2f} audio s / s ({NEW} vs {BASELINE})")
    if rejections is not None:
        lines.append(rejections.line())
    if plot:
        Path(plot).write_text(sweep_svg(levels, f"{caption}; load average {load[0]:.1f}-{load[1]:.1f}"))
        lines.append(f"\nplot: {plot}")
    return "\n".join(lines)
