"""A choice with logprobs: each token is released with its logprob parts, in order, and cut at a stop string."""

from __future__ import annotations

import pytest

from walkserve.api.openai.choices import ChoiceTracker, LogprobJoiner
from walkserve.api.text_stream import TextStream
from walkserve.core.array import ArrayData
from walkserve.core.finish import FinishReason
from walkserve.core.outputs import OutputEvent, RequestFinished
from walkserve.models.processor import Detokenizer

LETTERS = "abcdefghij"


class Letters(Detokenizer):
    """Token i is the letter LETTERS[i]."""

    def push(self, token_ids: list[int]) -> str:
        return "".join(LETTERS[t] for t in token_ids)

    def flush(self) -> str:
        return ""


def parts(k: int, token: int, logprob: float, top: list[tuple[int, float]]) -> dict[str, OutputEvent]:
    """The four events of decode iteration ``k``."""

    def event(modality: str, output: str, data: ArrayData) -> OutputEvent:
        return OutputEvent("r", modality, "decode_logprobs", "lm", (k,), data, k, output)

    return {
        "text": event("text", "token", ArrayData.from_list([token], "int64")),
        "logprob": event("logprobs", "logprob", ArrayData.from_list([logprob], "float32")),
        "top_logprobs": event("logprobs", "top_logprobs", ArrayData.from_list([v for _, v in top], "float32")),
        "top_logprob_ids": event("logprobs", "top_logprob_ids", ArrayData.from_list([t for t, _ in top], "int64")),
    }


def tracker(stops: tuple[str, ...] = ()) -> ChoiceTracker:
    return ChoiceTracker(0, TextStream(Letters(), stops), 3, logprobs=LogprobJoiner(lambda t: LETTERS[t].encode()))


def feed(t: ChoiceTracker, events: list[OutputEvent], finish: FinishReason = FinishReason.LENGTH):
    updates = [u for u in (t.on_event(e) for e in events) if u is not None]
    if t.finish_reason is None:
        updates.append(t.on_event(RequestFinished("r", finish, None, {}, {})))
    return updates


def test_a_token_waits_for_its_logprobs_whatever_the_order_of_its_parts():
    it0, it1 = parts(0, 1, -0.5, [(1, -0.5), (2, -1.5)]), parts(1, 3, -0.25, [(3, -0.25), (0, -2.0)])
    order = [it0["logprob"], it0["text"], it0["top_logprob_ids"], it0["top_logprobs"],
             it1["top_logprobs"], it1["text"], it1["logprob"], it1["top_logprob_ids"]]
    t = tracker()
    first = [t.on_event(e) for e in order[:3]]
    assert first == [None, None, None]  # iteration 0 is not complete yet
    updates = feed(t, order[3:])
    assert "".join(u.text for u in updates) == "bd"
    entries = [e for u in updates for e in (u.logprobs or [])]
    assert [(e.token, e.logprob) for e in entries] == [("b", -0.5), ("d", -0.25)]
    assert [e.top for e in entries] == [[(1, "b", b"b", -0.5), (2, "c", b"c", pytest.approx(-1.5))],
                                        [(3, "d", b"d", -0.25), (0, "a", b"a", -2.0)]]
    assert updates[-1].finish_reason == "length" and t.completion_tokens == 2


def test_logprobs_stop_with_the_text_at_a_stop_string():
    events = [e for k, tok in enumerate([0, 1, 2, 3]) for e in parts(k, tok, -1.0 - k, [(tok, -1.0 - k)]).values()]
    t = tracker(stops=("bc",))
    updates = feed(t, events)
    assert "".join(u.text for u in updates) == "a"
    assert [e.token for u in updates for e in (u.logprobs or [])] == ["a", "b", "c"]  # up to the token that completed "bc"
    assert t.finish_reason == "stop" and t.completion_tokens == 3
    assert [u.finish_reason for u in updates] == [None, None, "stop"]  # one finish, nothing after it


def test_a_token_that_is_part_of_a_character_is_named_by_its_bytes():
    pieces = {0: "\u4f60".encode()[:2], 1: "\u4f60".encode()[2:], 2: b"ok"}
    joiner = LogprobJoiner(pieces.__getitem__)
    for k, tok in enumerate([0, 1, 2]):
        for event in parts(k, tok, -1.0, [(tok, -1.0)]).values():
            ready = joiner.push(event)
        [(_, [entry])] = ready
        assert entry.bytes == pieces[tok] and entry.top[0][2] == pieces[tok]
        want = {0: "bytes:\\xe4\\xbd", 1: "bytes:\\xa0", 2: "ok"}[tok]
        assert entry.token == want
