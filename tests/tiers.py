"""Two tiers, marked mechanically: a test that starts a process (a runtime, a server, a benchmark, a
subprocess) is ``slow``; everything else (unit tests and in-process servers) is the quick tier
(``./dev test quick`` runs ``-m "not slow"``).

Loaded by ``tests/conftest.py``. At collection a test is marked ``slow`` when its directory is one where
every test starts a runtime (``SLOW_DIRS``), or when its own code, the fixtures it uses, or the helpers
from ``tests/`` or ``benchmarks/`` they call (followed a few calls deep) name a way to start a process (``STARTS``).
While it runs, every process start in the pytest process is counted: a test that is not marked ``slow``
and started one fails, so the quick tier cannot grow a process tree unnoticed.
"""

from __future__ import annotations

import ast
import inspect
import multiprocessing.process
import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# Helpers are followed inside the tests and the benchmarks (the benchmark smoke tests call their runners).
FOLLOWED = (TESTS, TESTS.parent / "benchmarks")
SLOW_DIRS = ("runtime", "ray")
STARTS = re.compile(r"\bsubprocess\.|\bPopen\b|Engine\.start\(|\bmultiprocessing\b|\bos\.fork\(|"
                    r"runpytest_subprocess|\bray\.init\(|\bwebdriver\.")
DEPTH = 3
# What the standard library runs to describe the machine (platform.uname, ctypes.util.find_library): a
# client library that asks for the platform is not a test that starts a process.
PROBES = {"uname", "lsb_release", "ldconfig"}


def _source(obj) -> str:
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        return ""


def _followed(obj) -> bool:
    try:
        return any(Path(inspect.getfile(obj)).resolve().is_relative_to(root) for root in FOLLOWED)
    except (OSError, TypeError):
        return False


def _starts_a_process(func, seen: set, depth: int = DEPTH) -> bool:
    """Whether ``func``'s code, or a function it calls by name from a followed folder, names a process start."""
    func = inspect.unwrap(func)
    if func in seen or not _followed(func):
        return False
    seen.add(func)
    text = _source(func)
    if STARTS.search(text):
        return True
    if depth == 0 or not text:
        return False
    names = {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)}
    scope = getattr(inspect.getmodule(func), "__dict__", {})
    return any(callable(scope.get(n)) and _starts_a_process(scope[n], seen, depth - 1) for n in names)


def starts_a_process(item: pytest.Function) -> bool:
    """The collection-time judgement for one test (see the module docstring)."""
    path = Path(item.path).resolve()
    if path.is_relative_to(TESTS) and path.relative_to(TESTS).parts[0] in SLOW_DIRS:
        return True
    seen: set = set()
    funcs = [item.function] + [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]
    return any(_starts_a_process(f, seen) for f in funcs)


def pytest_collection_modifyitems(items):
    for item in items:
        if isinstance(item, pytest.Function) and item.get_closest_marker("slow") is None and starts_a_process(item):
            item.add_marker(pytest.mark.slow)


# Process starts seen in this pytest process since the current test began its set-up.
_started: list[str] = []


def _counting(original, what: str):
    def start(*args, **kwargs):
        program = args[1] if what == "subprocess.Popen" and len(args) > 1 else None  # (self, args, executable, ...)
        if isinstance(program, (list, tuple)):
            program = program[0] if program else None
        name = os.path.basename(str(program)) if program is not None else None
        if name not in PROBES:
            _started.append(f"{what} {name}" if name else what)
        return original(*args, **kwargs)

    return start


_PATCHED = ((subprocess.Popen, "_execute_child", "subprocess.Popen"),
            (multiprocessing.process.BaseProcess, "start", "multiprocessing"), (os, "fork", "os.fork"))
_originals: list = []


def pytest_configure(config):
    for owner, name, what in _PATCHED:
        _originals.append((owner, name, getattr(owner, name)))
        setattr(owner, name, _counting(getattr(owner, name), what))


def pytest_unconfigure(config):
    while _originals:
        owner, name, original = _originals.pop()
        setattr(owner, name, original)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _started.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when == "call" and report.passed and _started and item.get_closest_marker("slow") is None:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} started a process ({', '.join(sorted(set(_started)))}) but is not in the slow "
                           f"tier: mark it @pytest.mark.slow (see tests/tiers.py)")
