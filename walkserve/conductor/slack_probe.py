"""SlackProbe: admit streams past the model's estimate while the streams running show they stay ahead.

The capacity model prices a *sustained* stream and keeps ``headroom`` spare;
a calm machine carries more. The streams that run say how much: one with a
pace ``p`` (wall seconds per audio second of its latest chunks), a lead of
``lead`` seconds at its latest chunk (audio sent, not yet played) and ``r``
audio seconds still to make, in chunks of ``c``, keeps until its end a least
lead (``least_lead``) of

    L(p) = lead - c * p                   when p <= 1  (its next chunk is the tightest)
    L(p) = lead + r * (1 - p) - c         when p > 1   (its last chunk is the tightest)

A stream *keeps up* while ``p <= 1`` (its lead never shrinks) or ``L >=
MARGIN_S`` (it has lead to spare for the rest of it); it *falls behind* when
``p > 1`` and ``L < LOWER_S``.

At the bound ``b`` (as many streams run as are admitted at once), when every
running stream with a pace, and one more starting behind the buffer its
TTFA gives it (the stand-in for the streams too new to have a pace), would
keep up even were every step ``(b + n) / b`` times slower (n more streams and
no batching gain: a step costs at most in proportion to its batch), at every
look for ``RAISE_S``, the bound rises by ``n`` (at most doubling at once, as
the model's fit is trusted to twice the batch it measured). As soon as one of them falls behind at today's pace the bound drops
by one, again every ``LOWER_EVERY_S`` while that lasts; a stream that runs
out of audio drops it whole (``StreamAdmission.tick``). The model's estimate
is its floor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

MARGIN_S = 0.25  # lead a stream slower than real time must keep to its end, by projection, for the bound to rise
LOWER_S = 0.1  # a stream slower than real time projected to keep less lead than this lowers the bound
LOWER_EVERY_S = 0.5  # ... and again this often while one does
RAISE_S = 1.0  # looks at the bound that all found room, this long, before it rises


@dataclass(frozen=True)
class Ahead:
    """A stream's pace (wall seconds per audio second) and the least lead its listener keeps to its end."""

    pace: float
    lead: float

    def keeps_up(self) -> bool:
        return self.pace <= 1 or self.lead >= MARGIN_S

    def behind(self) -> bool:
        return self.pace > 1 and self.lead < LOWER_S


AheadAt = Callable[[float], list[Ahead]]  # slower -> the running streams and one more (empty: no pace yet)


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
        """One look: ``running`` streams run; ``ahead(slower)`` says how they and one more would fare were every
        step ``slower`` times longer. The bound rises after RAISE_S in which every look at it (as many streams
        running as it admits) found room; below it nothing is learned."""
        if self.bound is not None and self.bound <= estimate:
            self.bound = None
        today = ahead(1.0)
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
            streams = ahead((bound + more) / bound)
            return bool(streams) and all(a.keeps_up() for a in streams)

        ok, bad = 0, bound + 1
        while bad - ok > 1:
            mid = (ok + bad) // 2
            ok, bad = (mid, bad) if bears(mid) else (ok, mid)
        return ok
