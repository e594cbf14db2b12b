"""Every fixture model, served by real worker processes, gives the reference executor's outputs.

Placements: one worker; two and four workers with nodes split and co-located;
per-walk placements (prefill on one rank, decode on another). On one worker
both loop paths run: loop cohorts (the default) and one firing per iteration.
"""

from __future__ import annotations

import time

import pytest

from tests.runtime.conftest import (
    comparable_events,
    comparable_reference,
    placement,
    reference,
    start,
    wait_until,
)
from walkserve.core.finish import FinishReason
from walkserve.testing.fixtures import FIXTURES
from walkserve.testing.fixtures.requests import fixture_request

N_REQUESTS = 16

ONE = {family: placement(1, {}) for family in FIXTURES}
SPLIT = {
    "fixture-omni": placement(2, {"thinker": 0, "talker": 1, "code2wav": 1}),
    "fixture-tts": placement(2, {"lm": 0, "codec": 1}),
    "fixture-image": placement(2, {"encode": 0, "cond_text": 1, "cond_image": 0, "uncond": 1, "combine": 0, "vae": 1}),
    "fixture-rollout": placement(2, {"encoder": 1, "predictor": 0}),
}
FOUR = {
    "fixture-omni": placement(4, {"thinker": 0, "talker": 1, "code2wav": 3}),
    "fixture-image": placement(4, {"encode": 3, "cond_text": 0, "cond_image": 1, "uncond": 2, "combine": 3, "vae": 0}),
    "fixture-nested": placement(4, {"a": 0, "b": 1, "c": 2}),
    "fixture-multimodal": placement(4, {"vision": 2, "audio_enc": 3, "lm": 0}),
}
PER_WALK = {
    "fixture-lm": placement(2, {"lm": 0}, {("decode", "lm"): 1}),
    "fixture-tts": placement(2, {"lm": 0, "codec": 0}, {("decode", "lm"): 1}),
    "fixture-multimodal": placement(3, {"vision": 1, "audio_enc": 1, "lm": 0}, {("decode", "lm"): 2}),
}


def _fill(place: dict, family: str) -> dict:
    """Place every node the mapping does not name on rank 0."""
    from walkserve.models.base import ModelRef
    from walkserve.models.registry import load_model

    named = {n for entry in place["nodes"] for n in entry["nodes"]}
    rest = [n for n in load_model(ModelRef(family)).graph().node_names() if n not in named]
    if rest:
        place = {**place, "nodes": [*place["nodes"], {"nodes": rest, "ranks": [0]}]}
    return place


CASES = (
    [(f, "one worker", p) for f, p in ONE.items()]
    + [(f, "one worker, no cohorts", p) for f, p in ONE.items()]
    + [(f, "two workers", p) for f, p in SPLIT.items()]
    + [(f, "four workers", p) for f, p in FOUR.items()]
    + [(f, "per-walk", p) for f, p in PER_WALK.items()]
)


@pytest.mark.parametrize(("family", "kind", "place"), CASES, ids=[f"{f}-{k}" for f, k, _ in CASES])
def test_runtime_matches_reference(family, kind, place):
    ref = reference(family)
    requests = [fixture_request(family, 100 + i) for i in range(N_REQUESTS)]
    with start(family, _fill(place, family), cohorts="no cohorts" not in kind) as engine:
        results = engine.run(requests)
        for req, res in zip(requests, results, strict=True):
            want = ref.run(req)
            assert res.finished is not None and res.finished.error == want.error, (req.id, res.finished)
            assert res.finished.reason == want.finish
            assert comparable_events(res.events) == comparable_reference(want), req.id
            for modality in {e.modality for e in res.events}:
                assert [e.index for e in res.modality(modality)] == list(range(len(res.modality(modality))))
        assert all(r.finished.reason in (FinishReason.STOP, FinishReason.LENGTH) for r in results)


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_transports_carry_tensors(transport, monkeypatch):
    """Every tensor above 0 bytes goes through shared memory between IPC ranks; a TCP rank (as a
    rank on another host would be) gets tensors inside its frames instead. Both match the reference."""
    monkeypatch.setenv("WALKSERVE_SHM_INLINE_BYTES", "0")
    family = "fixture-image"
    place = placement(2, {"encode": 0, "cond_text": 1, "cond_image": 0, "uncond": 1, "combine": 0, "vae": 1})
    place["ranks"][1]["transport"] = transport
    ref = reference(family)
    requests = [fixture_request(family, 300 + i) for i in range(8)]
    with start(family, place) as engine:
        results = engine.run(requests)
        for req, res in zip(requests, results, strict=True):
            assert comparable_events(res.events) == comparable_reference(ref.run(req))
        def sent():
            engine.stats()
            return sum(w.shm_sent for w in engine.status.stats.workers.values())

        if transport == "ipc":
            assert wait_until(lambda: sent() > 0)
        else:
            time.sleep(0.6)  # one more worker report
            assert sent() == 0


def test_no_two_cases_start_the_same_process_tree():
    """A runtime serves one model on one placement with one config, so cases share a process tree only
    when all three match; none do, and a case added with a tree another case already starts is refused
    here (it would add nothing but start-up time)."""
    import json

    trees = [(f, json.dumps(_fill(p, f), sort_keys=True), "no cohorts" not in k) for f, k, p in CASES]
    assert len(set(trees)) == len(trees)
