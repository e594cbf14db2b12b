"""A worker process starts with the OpenMP spin count its RuntimeConfig asks for (RuntimeConfig.worker_spin)."""

from __future__ import annotations

import pytest

from tests.runtime.conftest import placement, start


@pytest.mark.parametrize("zygote", ["1", "0"])
def test_worker_processes_start_with_the_configured_spin_count(monkeypatch, capfd, zygote):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv("WALKSERVE_ZYGOTE", zygote)  # forked from the zygote, or a fresh interpreter
    monkeypatch.setenv("WALKSERVE_LOG_LEVEL", "INFO")
    with start("fixture-lm", placement(1, {"lm": 0}), worker_spin=123, worker_threads=2):
        pass
    err = capfd.readouterr().err
    # the worker reports what torch and OpenMP run with, read in the worker process itself
    assert "rank 0 on cpu: 2 torch threads, OpenMP wait GOMP_SPINCOUNT=123" in err, err[-3000:]
