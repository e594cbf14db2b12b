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

Both factors are learned online from the ranks' cumulative node counters
(``RankStats.nodes``: batches, items, busy seconds) and the audio seconds the
conductor saw leave: each report gives one (mean batch, mean step time)
point per node, fitted as ``t(b) = a + c * b`` by least squares with
exponential forgetting. The fitted line is trusted up to twice the largest
batch measured (``EXTRAPOLATE``); past that a step costs proportionally more
(``t(b) = t(2 b_seen) * b / (2 b_seen)``): capacity grows as load shows
that larger batches are cheap, a doubling at most per exploration (the
conductor's playback clocks catch an estimate that went too far).
Bookkeeping only: floats, no clocks, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

DECAY = 0.97  # weight kept by older observations per report (a few hundred reports of memory)
MIN_AUDIO_S = 0.25  # audio seconds seen before the costs per audio second are trusted
MAX_STREAMS = 4096  # where the capacity search stops
EXTRAPOLATE = 2.0  # the fitted step time is trusted up to this many times the largest batch measured


@dataclass
class StepFit:
    """Step time of one node on one rank as a function of its batch size (weighted least squares)."""

    w: float = 0.0
    wb: float = 0.0
    wt: float = 0.0
    wbb: float = 0.0
    wbt: float = 0.0
    b_seen: float = 0.0  # the largest mean batch measured

    def add(self, batch: float, step_s: float, weight: float) -> None:
        self.w, self.wb, self.wt = DECAY * self.w + weight, DECAY * self.wb + weight * batch, DECAY * self.wt + weight * step_s
        self.wbb, self.wbt = DECAY * self.wbb + weight * batch * batch, DECAY * self.wbt + weight * batch * step_s
        self.b_seen = max(self.b_seen, batch)

    def _line(self) -> tuple[float, float]:
        """(intercept, slope); with one batch size seen (or a fit that says a step costs less than nothing
        at batch 0), the proportional prior: no fixed cost, every item the same."""
        mean_b, mean_t = self.wb / self.w, self.wt / self.w
        var = self.wbb / self.w - mean_b * mean_b
        if var > 0.05 * mean_b * mean_b:
            slope = (self.wbt / self.w - mean_b * mean_t) / var
            intercept = mean_t - slope * mean_b
            if slope >= 0 and intercept >= 0:
                return intercept, slope
        return 0.0, mean_t / mean_b

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


class StreamCapacity:
    """The capacity model of one run: fed each rank's cumulative node counters and the audio seen so far."""

    def __init__(self, headroom: float):
        self.headroom = headroom
        self.costs: dict[tuple[str, int], NodeCost] = {}
        self._last: dict[int, tuple[dict[str, dict[str, float]], float]] = {}  # rank -> (its counters, audio_s then)
        self.audio_s = 0.0  # audio seconds produced, all requests (the conductor adds them as outputs leave)

    def add_audio(self, seconds: float) -> None:
        self.audio_s += seconds

    def observe(self, rank: int, nodes: dict[str, dict[str, float]]) -> None:
        """A rank's report: cumulative ``{node: {"batches", "items", "busy_s"}}``. The differences since its
        previous report are one observation (a restarted worker counts from zero again: the baseline resets)."""
        previous, audio_then = self._last.get(rank, ({}, 0.0))  # both count from the start
        self._last[rank] = ({n: dict(v) for n, v in nodes.items()}, self.audio_s)
        audio = self.audio_s - audio_then
        for node, now in nodes.items():
            before = previous.get(node, {})
            batches = now.get("batches", 0.0) - before.get("batches", 0.0)
            items = now.get("items", 0.0) - before.get("items", 0.0)
            busy = now.get("busy_s", 0.0) - before.get("busy_s", 0.0)
            if batches <= 0 or items <= 0 or busy < 0:
                continue
            cost = self.costs.setdefault((node, rank), NodeCost(StepFit()))
            cost.fit.add(items / batches, busy / batches, batches)
            cost.items, cost.audio_s = DECAY * cost.items + items, DECAY * cost.audio_s + audio

    @property
    def known(self) -> bool:
        """True once some audio was produced and a measured node has a cost per audio second."""
        return self.audio_s >= MIN_AUDIO_S and any(c.audio_s > 0 for c in self.costs.values())

    def load(self, streams: int) -> float:
        """The busiest rank's time per wall second that ``streams`` real-time streams need (u_max(b))."""
        ranks: dict[int, float] = {}
        for (_, rank), cost in self.costs.items():
            ranks[rank] = ranks.get(rank, 0.0) + cost.busy(streams)
        return max(ranks.values(), default=0.0)

    def capacity(self) -> int | None:
        """The most streams that stay real-time within the headroom (at least 1: one stream always runs);
        None while the costs are unknown."""
        if not self.known:
            return None
        if self.load(1) > self.headroom:
            return 1
        ok, bad = 1, 2
        while self.load(bad) <= self.headroom:
            if bad >= MAX_STREAMS:
                return MAX_STREAMS
            ok, bad = bad, min(2 * bad, MAX_STREAMS)
        return self._bisect(ok, bad)

    def _bisect(self, ok: int, bad: int) -> int:
        """The largest b in [ok, bad) with load(b) within the headroom (load grows with b)."""
        while bad - ok > 1:
            mid = (ok + bad) // 2
            ok, bad = (mid, bad) if self.load(mid) <= self.headroom else (ok, mid)
        return ok
