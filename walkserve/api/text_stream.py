"""Token ids -> text deltas, with OpenAI ``stop`` strings matched on the decoded text."""

from __future__ import annotations

from walkserve.models.processor import Detokenizer


class StopMatcher:
    """Holds back the last ``len(longest stop) - 1`` characters so a stop split across deltas is seen."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self._pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        """(text safe to emit, whether a stop string was hit: then the text ends before it)."""
        buffer = self._pending + text
        hits = [i for i in (buffer.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._pending = ""
            return buffer[: min(hits)], True
        cut = max(0, len(buffer) - self.hold)
        self._pending = buffer[cut:]
        return buffer[:cut], False

    def flush(self) -> str:
        text, self._pending = self._pending, ""
        return text


class TextStream:
    """One choice's text: detokenize, then cut at the first stop string."""

    def __init__(self, detokenizer: Detokenizer, stops: tuple[str, ...]):
        self._detok = detokenizer
        self._stops = StopMatcher(stops)
        self.stopped = False

    def push(self, token_ids: list[int]) -> str:
        if self.stopped:
            return ""
        text, self.stopped = self._stops.push(self._detok.push(token_ids))
        return text

    def flush(self) -> str:
        if self.stopped:
            return ""
        text, self.stopped = self._stops.push(self._detok.flush())
        return text + ("" if self.stopped else self._stops.flush())
