"""SlackProbe: admit streams past the model's estimate while the streams running show they stay ahead.

The capacity model prices a stream from fitted step costs; the streams that
run measure the same thing end to end. A stream's pace ``p`` (wall seconds
per audio second of its latest chunks, while ``m`` streams ran on average)
is the machine's time per audio second at that load, every overhead and
every other tenant included. With ``b`` streams running each step costs at
most ``b / m`` times as much (a step costs at most in proportion to its
batch), so its pace would be ``p * b / m``. At the bound (as many streams run
as are admitted at once), ``n`` more streams are admitted when every running
stream, and one more (the stand-in for a new stream and for those too new to
have a pace), would still run at a pace of at most ``PACE_MAX`` with ``bound +
n`` running (at 0.9 a stream gains 0.1 s of lead per second of audio, spare
for a stalled step), at every look for ``RAISE_S``; the bound rises by ``n``,
at most doubling at once, as the model's fit is trusted to twice the batch
it measured.

A stream *falls behind* when ``p > 1`` and its least lead ahead
(``least_lead``: the least audio its listener will hold when a chunk arrives,
from now to its end, were the rest made at ``p``)

    L(p) = lead - c * p                   when p <= 1  (its next chunk is the tightest)
    L(p) = lead + r * (1 - p) - c         when p > 1   (its last chunk is the tightest)

is under ``LOWER_S`` (``lead``: audio sent, not yet played, at its latest
chunk; ``r``: audio still to come; ``c``: its mean chunk). As soon as one
does, the bound drops by one, again every ``LOWER_EVERY_S`` while that
lasts; a stream that runs out of audio drops it whole
(``StreamAdmission.tick``). The model's estimate is its floor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

PACE_MAX = 0.9  # the bound rises while every stream would run at most this many wall s per audio s
LOWER_S = 0.1  # a stream slower than real time projected to keep less lead than this lowers the bound
LOWER_EVERY_S = 0.5  # ... and again this often while one does
RAISE_S = 1.0  # looks at the bound that all found room, this long, before it rises


@dataclass(frozen=True)
class Ahead:
    """A stream's pace (wall seconds per audio second) and the least lead its listener keeps to its end."""

    pace: float
    lead: float

    def keeps_up(self) -> bool:
        return self.pace <= PACE_MAX

    def behind(self) -> bool:
        return self.pace > 1 and self.lead < LOWER_S


AheadAt = Callable[[int], list[Ahead]]  # streams -> the running streams and one more (empty: no pace yet)


def least_lead(lead: float, left: float, chunk: float, pace: float) -> float:
    """The least lead a listener holding ``lead`` seconds of a stream (at its latest chunk) will hold when a
    later chunk arrives, were the ``left`` audio seconds still to come made in chunks of ``chunk`` at
    ``pace`` wall seconds per audio second: its next chunk is the tightest at a pace up to 1, its last one
    past 1."""
    if left <= 0:
        return lead
    chunk = min(chunk, left)
    return lead - chunk * pace if pace <= 1 else lead + left * (1 - pace) - chunk


@dataclass
class SlackProbe:
    bound: int | None = None  # streams admitted at once on measured slack (None: the model's estimate rules)
    _calm_since: float | None = None
    _lowered_at: float = float("-inf")

    def admits(self, estimate: int) -> int:
        """Streams admitted at once: the estimate, or the probed bound above it."""
        return estimate if self.bound is None else max(estimate, self.bound)

    def above(self, estimate: int) -> int:
        """Streams admitted past the estimate on measured slack (0: none)."""
        return self.admits(estimate) - estimate

    def reset(self) -> None:
        """A stream ran out of audio: the model's estimate (and the cap after a gap) rule again."""
        self.bound, self._calm_since = None, None

    def tick(self, now: float, estimate: int, running: int, ahead: AheadAt) -> None:
        """One look: ``running`` streams run; ``ahead(b)`` says how they and one more would fare with ``b``
        streams running. The bound rises after RAISE_S in which every look at it (as many streams
        running as it admits) found room; below it nothing is learned."""
        if self.bound is not None and self.bound <= estimate:
            self.bound = None
        today = ahead(running)
        if not today:  # no stream has a pace yet: no evidence either way
            return
        if any(a.behind() for a in today):
            self._calm_since = None
            if self.bound is not None and now - self._lowered_at >= LOWER_EVERY_S:
                self.bound, self._lowered_at = self.bound - 1, now
                self.bound = None if self.bound <= estimate else self.bound
            return
        bound = self.admits(estimate)
        if running < bound:  # below the bound: no evidence either way (none either while no stream has a pace)
            return
        more = self._room(bound, ahead)
        if more == 0:
            self._calm_since = None
        elif self._calm_since is None:
            self._calm_since = now
        elif now - self._calm_since >= RAISE_S:
            self.bound, self._calm_since = bound + more, now

    @staticmethod
    def _room(bound: int, ahead: AheadAt) -> int:
        """How many more streams would leave every stream keeping up (at most ``bound``: a doubling). Keeping
        up only gets harder as steps slow, so the answer is bisected."""

        def bears(more: int) -> bool:
            streams = ahead(bound + more)
            return bool(streams) and all(a.keeps_up() for a in streams)

        ok, bad = 0, bound + 1
        while bad - ok > 1:
            mid = (ok + bad) // 2
            ok, bad = (mid, bad) if bears(mid) else (ok, mid)
        return ok
