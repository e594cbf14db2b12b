"""``./dev bench lm``: served (d) against the bare loop (c) per thread count, from back-to-back pairs.

Each pair is a (c) run and the (d) run right after it, so both saw nearly the
same machine; a pair's ratio is (d)'s tokens/s over (c)'s, and the figure is
the median over the pairs (the range says how much the machine moved between
runs). Beside it, per engine step and as medians over the pairs: the CPU time
of the bare loop's process and of the served worker (equal when serving adds
no work to the worker), the time their threads were runnable while no core
was free (the machine's other load), and the CPU the conductor and the client
used on the same cores (what serving adds outside the worker).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from benchmarks.common import table
from benchmarks.lm_cases import CaseResult

TARGET = 0.9  # served / bare at 2 threads (issue 30)


@dataclass(frozen=True)
class Pairs:
    """The (c), (d) runs of one dtype and thread count, in the order they ran."""

    dtype: str
    threads: int
    pairs: tuple[tuple[CaseResult, CaseResult], ...]

    def ratios(self) -> list[float]:
        return [d.tokens_per_s() / c.tokens_per_s() for c, d in self.pairs]

    def medians(self, per_step) -> tuple[float, float]:
        """(bare, served) medians of ``per_step`` over the pairs."""
        return (statistics.median(per_step(c) for c, _ in self.pairs),
                statistics.median(per_step(d) for _, d in self.pairs))


def _ms(r: CaseResult, seconds: float) -> float:
    return seconds / max(r.extra["steps"], 1) * 1e3


def _runtime_cpu(r: CaseResult) -> float:
    c = r.extra.get("cpu_s")
    return _ms(r, c["conductor"] + c["client"]) if c else float("nan")


def row(p: Pairs) -> tuple:
    ratios = p.ratios()
    wall = p.medians(lambda r: _ms(r, r.seconds))
    cpu = p.medians(lambda r: _ms(r, r.extra["process_cpu_s"]))
    wait = p.medians(lambda r: _ms(r, r.extra["wait_s"]))
    loads = [r.extra["load"] for pair in p.pairs for r in pair]
    return (p.dtype, p.threads, len(ratios), statistics.median(ratios), f"{min(ratios):.2f}-{max(ratios):.2f}",
            wall[0], wall[1], f"{cpu[0]:.1f} / {cpu[1]:.1f}", f"{wait[0]:.1f} / {wait[1]:.1f}",
            statistics.median(_runtime_cpu(d) for _, d in p.pairs), f"{min(loads):.2f}-{max(loads):.2f}")


def limits(p: Pairs) -> str:
    """One line: the median ratio against the target, and what the per-step figures say limits it."""
    ratio = statistics.median(p.ratios())
    cpu = p.medians(lambda r: _ms(r, r.extra["process_cpu_s"]))
    wait = p.medians(lambda r: _ms(r, r.extra["wait_s"]))
    runtime = statistics.median(_runtime_cpu(d) for _, d in p.pairs)
    verdict = f" (target >= {TARGET} at 2 threads: {'met' if ratio >= TARGET else 'MISSED'})" if p.threads == 2 else ""
    return (f"- {p.dtype}, {p.threads} thread{'s' if p.threads > 1 else ''}: served/bare = {ratio:.2f}, median of "
            f"{len(p.pairs)} pairs{verdict}; the worker's CPU per step is {cpu[1] / cpu[0]:.2f}x the bare loop's "
            f"(1 = serving adds no work to the step); runnable without a core: {wait[0]:.1f} ms per step bare, "
            f"{wait[1]:.1f} served (the machine's other load); conductor + client CPU {runtime:.1f} ms per step, "
            "taken from the cores the worker's threads run on")


def report(settings: list[Pairs]) -> list[str]:
    settings = [p for p in settings if p.pairs]
    if not settings:
        return []
    head = ["dtype", "threads", "pairs", "served/bare (median)", "range", "bare ms/step", "served ms/step",
            "CPU ms/step bare / worker", "no-core ms/step bare / worker", "conductor + client CPU ms/step", "load"]
    return ["", "Served (d) against the bare loop (c), each (d) run paired with the (c) run before it; ms per "
            "engine step, medians over the pairs:", "", table(head, [row(p) for p in settings]), "",
            *[limits(p) for p in settings]]
