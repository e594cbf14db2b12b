"""A numeric oracle that did not run is not a pass: a test marked ``parity`` that is skipped fails,
unless it was skipped for want of a GPU (its reason names CUDA or a GPU).

Loaded by ``tests/conftest.py``. A skip at collection (a module-level ``importorskip``) of a module
marked ``parity`` fails the same way.
"""

from __future__ import annotations

import re

import pytest

GPU_REASON = re.compile(r"\b(CUDA|GPU|flashinfer)\b", re.IGNORECASE)


def _reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _refuse(report, where: str) -> None:
    reason = _reason(report)
    if GPU_REASON.search(reason):
        return
    report.outcome = "failed"
    report.longrepr = (f"{where} is marked parity but was skipped ({reason}); a parity oracle must run on the CPU "
                       f"(only a GPU-only test may skip)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and item.get_closest_marker("parity") is not None:
        _refuse(report, item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    path = getattr(collector, "path", None)
    if report.skipped and isinstance(collector, pytest.Module) and path is not None and "mark.parity" in path.read_text():
        _refuse(report, collector.nodeid)
