"""Faults and lifecycle: a failing component, a killed worker, aborts, admission limits, released state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import msgspec
import pytest

from tests.polling import alive
from tests.runtime.conftest import placement, start, wait_until
from walkserve.core.finish import FinishReason
from walkserve.testing.fixtures.requests import fixture_request


@pytest.fixture(scope="module")
def tts():
    engine = start("fixture-tts", placement(2, {"lm": 0, "codec": 1}), max_running=4, max_waiting=4)
    yield engine
    engine.close(drain_s=0)


def test_component_exception_fails_only_its_request(tts):
    good = [fixture_request("fixture-tts", i) for i in (1, 2, 3)]
    bad = fixture_request("fixture-tts", 7)
    bad.params = msgspec.structs.replace(bad.params, fail_node="lm", fail_at=3)
    results = tts.run([*good, bad])
    assert [r.finished.reason for r in results[:3]] == [FinishReason.STOP] * 3
    failed = results[3].finished
    assert failed.reason == FinishReason.ERROR
    assert "injected failure in lm at iteration 3" in failed.error
    assert "Traceback" not in failed.error
    assert wait_until(lambda: tts.stats().requests_with_state == 0)


def test_admission_queue_then_rejection(tts):
    slow = [fixture_request("fixture-tts", i) for i in range(10)]
    for r in slow:
        r.params = msgspec.structs.replace(r.params, sleep_ms=20)
    results = tts.run(slow)
    rejected = [r for r in results if r.rejected]
    assert len(rejected) == 2  # 4 running + 4 waiting admitted; the last two rejected
    assert all("queue is full" in r.rejected for r in rejected)
    assert all(r.finished.reason in (FinishReason.STOP, FinishReason.LENGTH) for r in results if not r.rejected)


def test_a_batch_that_repeats_a_request_id_is_refused_before_anything_runs(tts):
    from walkserve.core.errors import InvalidRequest

    req = fixture_request("fixture-tts", 21)
    before = tts.stats().finished
    with pytest.raises(InvalidRequest, match="already running"):
        tts.run([req, req])
    assert tts.stats().finished == before and tts.stats().running == 0
    assert tts.run([req])[0].finished.reason in (FinishReason.STOP, FinishReason.LENGTH)


def test_abort_releases_state(tts):
    req = fixture_request("fixture-tts", 3)
    req.sampling = type(req.sampling)(max_tokens=400, stop_token_ids=(0,))
    req.params = msgspec.structs.replace(req.params, eos_at=1000, sleep_ms=5)
    for seen, _out in enumerate(tts.stream(req), start=1):
        if seen == 2:
            break  # leaving the loop aborts the request
    stats = wait_until(lambda: (s := tts.stats()).running == 0 and s.requests_with_state == 0 and s)
    assert stats and stats.aborted >= 1


def test_loop_cohort_members_fail_alone_and_their_state_is_released():
    """fixture-lm's decode loop runs as a cohort: a failing member, an aborted one and finished ones leave nothing behind."""
    with start("fixture-lm", placement(1, {"lm": 0})) as engine:
        good = [fixture_request("fixture-lm", i) for i in range(4)]
        bad = fixture_request("fixture-lm", 9)
        bad.sampling = type(bad.sampling)(max_tokens=50, stop_token_ids=(0,))
        bad.params = msgspec.structs.replace(bad.params, fail_node="lm", fail_at=2, eos_at=1000)
        results = engine.run([*good, bad])
        assert all(r.finished.reason in (FinishReason.STOP, FinishReason.LENGTH) for r in results[:4])
        assert results[4].finished.reason == FinishReason.ERROR
        assert "injected failure in lm at iteration 2" in results[4].finished.error
        assert [e.iteration for e in results[4].events] == [(0,), (1,)]  # the iterations before the failure
        long = fixture_request("fixture-lm", 11)
        long.sampling = type(long.sampling)(max_tokens=5000, stop_token_ids=(0,))
        long.params = msgspec.structs.replace(long.params, eos_at=10_000, sleep_ms=2)
        for seen, _out in enumerate(engine.stream(long), start=1):
            if seen == 3:
                break  # leaving the loop aborts the request mid-cohort
        stats = wait_until(lambda: (s := engine.stats()).running == 0 and s.requests_with_state == 0 and s)
        assert stats and stats.aborted >= 1 and stats.failed >= 1
        worker = engine.status.stats.workers[0]
        assert worker.cohort_members == 0 and worker.counters["firings"] > 0


def test_killed_worker_fails_its_requests_fast_and_comes_back():
    engine = start("fixture-tts", placement(2, {"lm": 0, "codec": 1}))
    try:
        pids = engine.status.stats.pids
        long = [fixture_request("fixture-tts", i) for i in range(3)]
        for r in long:
            r.sampling = type(r.sampling)(max_tokens=300, stop_token_ids=(0,))
            r.params = msgspec.structs.replace(r.params, eos_at=1000, sleep_ms=10)
        import threading

        box = {}
        runner = threading.Thread(target=lambda: box.update(results=engine.run(long)))
        runner.start()
        time.sleep(1.0)
        killed_at = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        runner.join(timeout=10)
        elapsed = time.monotonic() - killed_at
        results = box["results"]
        assert elapsed < 2.0
        for r in results:
            assert r.finished.reason == FinishReason.ERROR
            assert "worker rank 1 died" in r.finished.error and "SIGKILL" in r.finished.error
        assert wait_until(lambda: engine.health().ok, timeout=30)
        again = engine.run([fixture_request("fixture-tts", 9)])[0]
        assert again.finished.reason == FinishReason.STOP and again.events
        assert engine.status.stats.restarts == {1: 1, 0: 0}
    finally:
        engine.close(drain_s=0)


def test_killing_the_parent_leaves_no_orphans(tmp_path):
    script = tmp_path / "serve.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, sys, time
            from walkserve.entrypoint.sync import Engine
            e = Engine.start("fixture-lm", placement={"ranks": [{"id": 0, "device": "cpu"}, {"id": 1, "device": "cpu"}],
                                                      "nodes": [{"nodes": ["lm"], "ranks": [0, 1]}]})
            s = e.status.stats
            pids = [*s.pids.values(), s.zygote_pid]
            print(json.dumps(pids), flush=True)
            time.sleep(600)
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        import json

        children = json.loads(line)
        conductor = [int(p) for p in subprocess.check_output(["pgrep", "-P", str(proc.pid)]).split()]
        every = children + conductor
        assert all(alive(p) for p in every)
    finally:
        proc.kill()
        proc.wait()
    assert wait_until(lambda: not any(alive(p) for p in every), timeout=5), [p for p in every if alive(p)]
