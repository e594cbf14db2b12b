"""RuntimeConfig.worker_spin: the OpenMP spin count every worker process is started with."""

from __future__ import annotations

import pytest

from walkserve.core.config import RuntimeConfig
from walkserve.core.errors import ConfigError


def test_workers_get_the_configured_spin_count():
    assert RuntimeConfig(worker_spin=250).worker_environ({}) == {"GOMP_SPINCOUNT": "250"}
    assert RuntimeConfig(worker_spin=0).worker_environ({"PATH": "/bin"}) == {"GOMP_SPINCOUNT": "0"}


def test_the_default_is_a_short_spin_and_the_environment_variable_sets_it(monkeypatch):
    monkeypatch.delenv("WALKSERVE_WORKER_SPIN", raising=False)
    assert RuntimeConfig().worker_environ({}) == {"GOMP_SPINCOUNT": "100"}
    monkeypatch.setenv("WALKSERVE_WORKER_SPIN", "7")
    assert RuntimeConfig().worker_spin == 7


@pytest.mark.parametrize("base", [{"GOMP_SPINCOUNT": "300000"}, {"OMP_WAIT_POLICY": "ACTIVE"}])
def test_an_openmp_setting_already_in_the_environment_wins(base):
    assert RuntimeConfig(worker_spin=100).worker_environ(base) == {}


def test_minus_one_leaves_openmp_its_default_and_below_is_refused():
    assert RuntimeConfig(worker_spin=-1).worker_environ({}) == {}
    with pytest.raises(ConfigError, match="worker_spin must be >= -1"):
        RuntimeConfig(worker_spin=-2)
