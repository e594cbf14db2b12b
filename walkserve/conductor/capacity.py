"""StreamCapacity: how many audio streams the graph keeps ahead of real time, from measured step costs.

The one idea: b streams playing at once need, from every node n on every
rank r, ``k[n, r]`` steps per wall second (the node's items per second of
audio: 7 LM tokens per 85 ms Orpheus frame is ~82 per second; each step
advances every stream of its batch by one item), and a step at batch b takes
``t[n, r](b)``. So rank r is busy

    u_r(b) = sum over nodes n on r of  k[n, r] * t[n, r](b)      seconds per wall second,

and b streams stay real-time while every ``u_r(b) <= headroom`` (a rank
busy past 1 falls behind the playback clock; headroom < 1 keeps spare time
for jitter). Capacity is the largest such b.

Both factors are learned online from the ranks' cumulative step counters per
node and batch-size bucket (``RankStats.step_counts``: steps, members, busy
seconds for batches 1, 2, 3-4, 5-8 ...) and the audio seconds the conductor
saw leave: each report gives, per node, one (mean batch, mean step time)
point per bucket that ran since the last, fitted as ``t(b) = a + c * b`` by
least squares (weighted by steps) with exponential forgetting. Points per
bucket, not one mean per report: a report's mean batch mixes streams at every
phase (a prompt's prefill at batch 1 beside decode steps at batch 8), so its
means barely move and say nothing of how a step's time grows with its batch.
The fitted line is trusted up to twice the largest batch measured
(``EXTRAPOLATE``); past that a step costs proportionally more
(``t(b) = t(2 b_seen) * b / (2 b_seen)``): capacity grows as load shows
that larger batches are cheap, a doubling at most per exploration (the
conductor's playback clocks catch an estimate that went too far).

With one batch size seen, a step's cost has no line, only the proportional
prior (every member costs the same, no fixed cost), which is the most a
batch can cost, not what it does: an estimate at the batch measured would
keep admission there and the fit would never see a larger one. So while a
node is priced by that prior and the estimate does not pass the batch it
measured, one stream more is admitted if the prior keeps every rank within
``EXPLORE_LOAD`` (a little past real time: the prior is the worst case, and
the next report, half a second later, prices the batch as it ran); its
steps give the line.

A rank's engine calls are not all its time: between them it routes outputs,
evaluates stop rules, builds the next step and packs tensors, work that
grows with its steps (on a small model as much as the calls themselves). So
each rank's sum is scaled by its measured ``active / engine`` time
(``RankStats.active_s``: its loop's time not spent waiting for a message),
at least 1.
Bookkeeping only: floats, no clocks, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

DECAY = 0.97  # weight kept by older observations per report (a few hundred reports of memory)
MIN_AUDIO_S = 0.25  # audio seconds seen before the costs per audio second are trusted
MAX_STREAMS = 4096  # where the capacity search stops
EXTRAPOLATE = 2.0  # the fitted step time is trusted up to this many times the largest batch measured
# a rank's load, priced by the proportional prior, within which one stream past the batch measured runs: the prior
# is the worst case (a step with no fixed cost), so it may go a little past real time; the next report prices it
EXPLORE_LOAD = 1.25


@dataclass
class StepFit:
    """Step time of one node on one rank as a function of its batch size (weighted least squares)."""

    w: float = 0.0
    wb: float = 0.0
    wt: float = 0.0
    wbb: float = 0.0
    wbt: float = 0.0
    b_seen: float = 0.0  # the largest mean batch measured

    def add(self, points: list[tuple[float, float, float]]) -> None:
        """One report's (batch, step seconds, weight) points: older ones fade by DECAY, these join at full weight."""
        self.w, self.wb, self.wt, self.wbb, self.wbt = (DECAY * x for x in (self.w, self.wb, self.wt, self.wbb, self.wbt))
        for batch, step_s, weight in points:
            self.w, self.wb, self.wt = self.w + weight, self.wb + weight * batch, self.wt + weight * step_s
            self.wbb, self.wbt = self.wbb + weight * batch * batch, self.wbt + weight * batch * step_s
            self.b_seen = max(self.b_seen, batch)

    def _fitted(self) -> tuple[float, float] | None:
        """(intercept, slope) of the weighted least squares line; None with one batch size seen, or a fit that
        says a step costs less than nothing at batch 0."""
        mean_b, mean_t = self.wb / self.w, self.wt / self.w
        var = self.wbb / self.w - mean_b * mean_b
        if var > 0.05 * mean_b * mean_b:
            slope = (self.wbt / self.w - mean_b * mean_t) / var
            intercept = mean_t - slope * mean_b
            if slope >= 0 and intercept >= 0:
                return intercept, slope
        return None

    def _line(self) -> tuple[float, float]:
        """(intercept, slope): the fitted line, else the proportional prior (no fixed cost, every item the same)."""
        line = self._fitted()
        return line if line is not None else (0.0, self.wt / self.wb)

    @property
    def prior(self) -> bool:
        """True while the step cost is the proportional prior, not a fitted line."""
        return self._fitted() is None

    def step_s(self, batch: float) -> float:
        """Seconds per step at ``batch``: the fitted line up to EXTRAPOLATE x the largest batch measured,
        never cheaper per item past that."""
        a, c = self._line()
        trusted = EXTRAPOLATE * self.b_seen
        if batch <= trusted:
            return a + c * batch
        return (a + c * trusted) * batch / trusted


@dataclass
class NodeCost:
    """One node on one rank: its step-time fit and its items per second of audio."""

    fit: StepFit
    items: float = 0.0  # decayed items and audio seconds: items per audio second = items / audio_s
    audio_s: float = 0.0

    def busy(self, batch: int) -> float:
        """Seconds of this rank's time per wall second that ``batch`` real-time streams need from this node
        (none from a node that has only run while no audio was made: it serves other requests)."""
        return self.items / self.audio_s * self.fit.step_s(batch) if self.audio_s > 0 else 0.0


@dataclass
class RankTime:
    """How much of a rank's loop time its engine calls are: the rest (routing, stop rules, building steps,
    packing tensors) grows with the steps too, so engine time is scaled up by ``active / busy`` (at least 1)."""

    active: float = 0.0  # decayed seconds: the loop not waiting for a message, and the engine calls within it
    busy: float = 0.0
    last: float | None = None  # the cumulative active seconds of the previous report (None: none yet)

    def add(self, active_s: float, busy_s: float) -> None:
        before, self.last = self.last, active_s
        if before is None or active_s < before or busy_s <= 0:  # the first report, or a restarted worker: a baseline
            return
        self.active, self.busy = DECAY * self.active + active_s - before, DECAY * self.busy + busy_s

    @property
    def factor(self) -> float:
        return max(1.0, self.active / self.busy) if self.busy > 0 else 1.0


class StreamCapacity:
    """The capacity model of one run: fed each rank's cumulative step counters (per node and batch bucket),
    its loop's active time, and the audio seen so far."""

    def __init__(self, headroom: float):
        self.headroom = headroom
        self.costs: dict[tuple[str, int], NodeCost] = {}
        self.ranks: dict[int, RankTime] = {}
        self._last: dict[int, tuple[dict[str, dict[int, list[float]]], float]] = {}  # rank -> (its counters, audio_s then)
        self.audio_s = 0.0  # audio seconds produced, all requests (the conductor adds them as outputs leave)

    def add_audio(self, seconds: float) -> None:
        self.audio_s += seconds

    def observe(self, rank: int, counts: dict[str, dict[int, list[float]]], active_s: float | None = None) -> None:
        """A rank's report: cumulative ``{node: {bucket: [steps, members, busy_s]}}`` and its loop's active seconds
        (None: not measured, engine time is all). The differences since its previous report are one observation
        (a restarted worker counts from zero again: the baseline resets)."""
        previous, audio_then = self._last.get(rank, ({}, 0.0))  # both count from the start
        self._last[rank] = ({n: {b: list(c) for b, c in v.items()} for n, v in counts.items()}, self.audio_s)
        audio, engine_s = self.audio_s - audio_then, 0.0
        for node, buckets in counts.items():
            before, items = previous.get(node, {}), 0.0
            points = []
            for b, now in buckets.items():
                steps, members, busy = (x - y for x, y in zip(now, before.get(b, (0.0, 0.0, 0.0))))
                if steps > 0 and members > 0 and busy >= 0:
                    points.append((members / steps, busy / steps, steps))
                    items += members
                    engine_s += busy
            if not points:
                continue
            cost = self.costs.setdefault((node, rank), NodeCost(StepFit()))
            cost.fit.add(points)
            cost.items, cost.audio_s = DECAY * cost.items + items, DECAY * cost.audio_s + audio
        if active_s is not None:
            self.ranks.setdefault(rank, RankTime()).add(active_s, engine_s)

    @property
    def known(self) -> bool:
        """True once some audio was produced and a measured node has a cost per audio second."""
        return self.audio_s >= MIN_AUDIO_S and any(c.audio_s > 0 for c in self.costs.values())

    def load(self, streams: int) -> float:
        """The busiest rank's time per wall second that ``streams`` real-time streams need (u_max(b))."""
        ranks: dict[int, float] = {}
        for (_, rank), cost in self.costs.items():
            ranks[rank] = ranks.get(rank, 0.0) + cost.busy(streams)
        return max((u * self.overhead(rank) for rank, u in ranks.items()), default=0.0)

    def overhead(self, rank: int) -> float:
        """The rank's loop time per second of its engine calls (1 until measured)."""
        time = self.ranks.get(rank)
        return time.factor if time is not None else 1.0

    def capacity(self) -> int | None:
        """The most streams that stay real-time within the headroom (at least 1: one stream always runs);
        None while the costs are unknown."""
        if not self.known:
            return None
        if self.load(1) > self.headroom:
            return self._explore(1)
        ok, bad = 1, 2
        while self.load(bad) <= self.headroom:
            if bad >= MAX_STREAMS:
                return MAX_STREAMS
            ok, bad = bad, min(2 * bad, MAX_STREAMS)
        return self._explore(self._bisect(ok, bad))

    def _explore(self, streams: int) -> int:
        """``streams``, or one more while a node priced by the proportional prior measured no batch past it and
        the prior keeps every rank within real time."""
        priors = [c.fit.b_seen for c in self.costs.values() if c.audio_s > 0 and c.fit.prior]
        if priors and streams <= max(priors) and self.load(streams + 1) <= EXPLORE_LOAD:
            return streams + 1
        return streams

    def _bisect(self, ok: int, bad: int) -> int:
        """The largest b in [ok, bad) with load(b) within the headroom (load grows with b)."""
        while bad - ok > 1:
            mid = (ok + bad) // 2
            ok, bad = (mid, bad) if self.load(mid) <= self.headroom else (ok, mid)
        return ok
