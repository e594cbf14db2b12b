"""Plan: costs (cached or profiled), candidates, the winner for the objective under the SLO, and why it wins."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from walkserve.core.errors import ConfigError, PlacementError
from walkserve.models.base import Model
from walkserve.planner.costs import CostTable, cache_key, cache_path
from walkserve.planner.devices import Device
from walkserve.planner.profile import Progress, profile
from walkserve.planner.score import Cores
from walkserve.planner.search import (
    Candidate,
    Checker,
    enumerate_candidates,
    score_placement,
    smallest_fit,
)
from walkserve.planner.simulate import Load
from walkserve.planner.workload import Workload

OBJECTIVES = ("throughput", "ttfa")


@dataclass(frozen=True)
class Slo:
    ttfa_s: float | None = None  # the predicted TTFA must not exceed this
    throughput: float | None = None  # requests/s the placement must at least carry

    def allows(self, c: Candidate) -> bool:
        s = c.score
        if s is None:
            return True
        return (self.ttfa_s is None or s.ttfa_s <= self.ttfa_s) and (self.throughput is None or s.throughput >= self.throughput)


def parse_slo(values: list[str] | None) -> Slo:
    """``--slo ttfa=0.5`` (seconds), ``--slo throughput=2`` (requests/s); repeatable."""
    out: dict[str, float] = {}
    for v in values or []:
        name, _, num = v.partition("=")
        name = name.strip().lower()
        if name not in ("ttfa", "throughput"):
            raise ConfigError(f"--slo {v}: name ttfa=SECONDS or throughput=REQUESTS_PER_S")
        try:
            out[name] = float(num.strip().removesuffix("s"))
        except ValueError:
            raise ConfigError(f"--slo {v}: {num!r} is not a number") from None
    return Slo(out.get("ttfa"), out.get("throughput"))


@dataclass
class PlanResult:
    ranked: list[Candidate]  # those within the SLO, best first
    why: str
    considered: int
    rejected: list[str] = field(default_factory=list)  # candidates that did not fit, with the check's reason

    @property
    def winner(self) -> Candidate:
        return self.ranked[0]


def costs_for(model: Model, workload: Workload, device_kind: str, dtype: str | None, cache_dir: Path | None = None,
              allow_profile: bool = True, progress: Progress | None = None, repeats: int = 2) -> CostTable:
    """The model's cost table from the cache, or profiled now (and cached) when ``allow_profile``."""
    key = cache_key(model.ref.family, model.ref.path, device_kind, dtype or "model", dict(model.ref.options), workload.name)
    path = cache_path(key, cache_dir)
    if path.is_file():
        return CostTable.load(path)
    if not allow_profile:
        raise ConfigError(f"no profile of {model.ref.family} on {device_kind} ({path} is missing): run "
                          f"walkserve profile {model.ref.family} --model-path DIR first")
    device = "cpu" if device_kind == "cpu" else "cuda:0"
    table = profile(model, workload, key, device, dtype, repeats=repeats, progress=progress)
    table.save(path)
    return table


def rank_candidates(cands: list[Candidate], objective: str, slo: Slo) -> list[Candidate]:
    if objective not in OBJECTIVES:
        raise ConfigError(f"--objective {objective}: choose throughput or ttfa")
    ok = [c for c in cands if slo.allows(c)]
    if objective == "throughput":
        return sorted(ok, key=lambda c: (-c.score.throughput, c.score.ttfa_s, c.name))
    return sorted(ok, key=lambda c: (c.score.ttfa_s, -c.score.throughput, c.name))


def plan(model: Model, devices: list[Device], table: CostTable, workload: Workload, objective: str = "throughput",
         slo: Slo | None = None, scorer: str = "simulate", progress: Progress | None = None, jobs: int = 1) -> PlanResult:
    """The best placement of ``model`` on ``devices``; PlacementError naming the smallest device set when none fits.
    ``jobs``: processes that score a long search's candidates."""
    rejected: list[str] = []
    cands = enumerate_candidates(model, devices, table, workload.load, rejected, scorer=scorer, progress=progress,
                                 jobs=jobs)
    if not cands:
        raise _no_fit(model, devices, rejected)
    ranked = rank_candidates(cands, objective, slo or Slo())
    if not ranked:
        raise PlacementError(f"no placement of {model.ref.family} meets the SLO {slo}; the best for {objective}: "
                             f"{summary(rank_candidates(cands, objective, Slo())[0])}")
    return PlanResult(ranked, why_wins(ranked[0], cands), len(cands), rejected)


def _no_fit(model: Model, devices: list[Device], rejected: list[str]) -> PlacementError:
    need = smallest_fit(model, devices)
    given = f"{len(devices)} device(s) ({', '.join(d.device for d in devices)})"
    hint = f"the smallest device set that holds it: {need}" if need else "no set of up to 8 more such devices holds it"
    first = f"; e.g. {rejected[0]}" if rejected else ""
    return PlacementError(f"{model.ref.family} does not fit on {given}: {hint}{first}")


def require_fit(model: Model, devices: list[Device]) -> None:
    """PlacementError naming the smallest device set that holds the model, when no placement fits ``devices``:
    checked from the memory alone, before any profile runs."""
    rejected: list[str] = []
    if not enumerate_candidates(model, devices, None, 1, rejected, limit=1):
        raise _no_fit(model, devices, rejected)


def explain(model: Model, data: dict, source: str, table: CostTable, load: int | Load,
            scorer: str = "simulate", cores: Cores = None) -> Candidate:
    """Score a hand-written placement the way the planner scores its own (after the same start-up checks);
    ``cores``: the hosts' CPU cores where a devices file gives them."""
    devices = [Device(r["device"], _memory(r), r.get("host")) for r in data.get("ranks") or [] if isinstance(r, dict)]
    checker = Checker(model, devices)
    parsed = checker.check(data, source)
    sc = score_placement(model.for_placement(data), table, parsed, load, scorer, cores=cores)
    sc.memory = checker.memory(parsed)
    return Candidate(Path(source).name, data, parsed, sc)


def _memory(entry: dict) -> int | None:
    from walkserve.placement.plan import parse_bytes

    return parse_bytes(entry["memory"], "ranks") if entry.get("memory") is not None else None


def summary(c: Candidate) -> str:
    s = c.score
    mem = ", ".join(f"rank {r} {b / 2**30:.2f} GiB" for r, b in sorted(s.memory.items()))
    bound = ", bound by the host's cores" if s.host_bound else ", bound by each request's chain of steps" if s.latency_bound else ""
    return (f"{c.name}: {s.throughput:.2f} req/s{bound}, TTFA {_duration(s.ttfa_s)}{_latency(s)}, busiest rank {s.bottleneck} "
            f"({s.rank_busy[s.bottleneck] * 1000:.1f} ms/request, mostly {s.bottleneck_unit()}); memory {mem}")


def _duration(seconds: float) -> str:
    """``667 ms`` below a second, ``1.85 s`` and ``72.4 s`` from there."""
    return f"{seconds * 1000:.3g} ms" if seconds < 0.9995 else f"{seconds:.3g} s"


def _latency(s) -> str:
    return f", latency p50 {s.latency_s:.3g} s" if s.latency_s is not None else ""


def why_wins(winner: Candidate, cands: list[Candidate]) -> str:
    """The bottleneck the winner removes, against the one-rank placement (or the runner-up when it is that)."""
    base = min(cands, key=lambda c: (len(c.placement.ranks), -c.score.throughput))
    if base is winner:
        others = [c for c in cands if c is not winner]
        if not others:
            return "the only placement that fits"
        best = max(others, key=lambda c: c.score.throughput)
        return (f"{winner.name} keeps everything on one rank: splitting or replicating adds messages and divides "
                f"the cores without removing work from the busiest rank (next best: {best.name}, "
                f"{best.score.throughput:.2f} req/s)")
    b, w = base.score, winner.score
    return (f"on {base.name} rank {b.bottleneck} is the bottleneck ({b.rank_busy[b.bottleneck] * 1000:.1f} ms/request, "
            f"mostly {b.bottleneck_unit()}); {winner.name} spreads that work so its busiest rank {w.bottleneck} takes "
            f"{w.rank_busy[w.bottleneck] * 1000:.1f} ms/request ({w.bottleneck_unit()}): "
            f"{w.throughput / b.throughput:.2f}x the throughput")


def placement_yaml(c: Candidate, header: list[str]) -> str:
    """The winner as a placement file, with its predicted figures in a comment."""
    lines = [f"# {h}" for h in header]
    lines.append(f"# predicted (cost model, not measured): {summary(c)}")
    return "\n".join(lines) + "\n" + yaml.safe_dump(c.data, sort_keys=False)


def auto_devices() -> str:
    """``--placement auto`` without ``--devices``: every visible GPU, else two CPU ranks on a host with cores for two."""
    import os

    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        gpus = 0
    if gpus:
        return f"cuda:0-{gpus - 1}"
    return "cpu:0,cpu:1" if (os.cpu_count() or 1) >= 2 else "cpu:0"


def auto_placement(model: Model, devices_spec: str | None, dtype: str | None, out_dir: Path,
                   progress: Progress | None = None, cache_dir: Path | None = None) -> Path:
    """Plan at start-up (``walkserve serve --placement auto``): the cached profile, or a quick one now; the winner
    is written under ``out_dir`` and its path returned."""
    from walkserve.planner.devices import parse_devices
    from walkserve.planner.workload import default_workload

    spec = devices_spec or auto_devices()
    devices = parse_devices(spec)
    workload = default_workload(model.ref.family, model.processor())
    require_fit(model, devices)
    table = costs_for(model, workload, min(d.kind for d in devices), dtype, cache_dir, True, progress, repeats=1)
    result = plan(model, devices, table, workload, progress=progress)
    if progress:
        progress(f"placement auto on {spec}: {summary(result.winner)}")
        progress(f"why: {result.why}")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{table.key}-{len(devices)}.yaml"
    path.write_text(placement_yaml(result.winner, [f"walkserve serve --placement auto (devices {spec})"]))
    return path
