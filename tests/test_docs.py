"""docs/structure.md and docs/runtime.md say what the code does: each check reads a claim in the doc and tests the
behaviour it states (what core loads, where a tcp rank listens, the order of a worker's beats and their thread)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

from walkserve.engines.base import Engine

ROOT = Path(__file__).resolve().parents[1]
STRUCTURE = (ROOT / "docs" / "structure.md").read_text()
RUNTIME = (ROOT / "docs" / "runtime.md").read_text()


def row(folder: str) -> str:
    """The table row of ``folder`` in docs/structure.md."""
    [line] = [line for line in STRUCTURE.splitlines() if line.startswith(f"| `{folder}")]
    return line


def test_core_loads_only_the_packages_its_row_names():
    """docs/structure.md: core is "the standard library and msgspec only (and `setproctitle`, when installed)".
    Importing every core module in a fresh interpreter loads no other third-party package."""
    modules = sorted(f"walkserve.core.{p.stem}" for p in (ROOT / "walkserve" / "core").glob("*.py") if p.stem != "__init__")
    third_party = "sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names))"
    script = (f"import sys, msgspec; base = {third_party}; import {', '.join(modules)}; "
              f"print(' '.join(sorted(set({third_party}) - set(base))))")
    loaded = set(subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.split()) - {"walkserve"}
    assert "msgspec" in row("walkserve/core/")
    assert {p for p in loaded if p not in row("walkserve/core/")} == set()  # beyond msgspec and what it loads


def test_the_worker_row_names_every_worker_module():
    modules = {p.name for p in (ROOT / "walkserve" / "worker").glob("*.py")} - {"__init__.py"}
    assert {m for m in modules if f"`{m}`" not in row("walkserve/worker/")} == set()


def test_every_package_has_its_test_folder_or_says_where_it_is_tested():
    packages = {p.name for p in (ROOT / "walkserve").iterdir() if (p / "__init__.py").is_file()}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir()}
    elsewhere = {"client": "tests/api/test_client.py", "placements": "tests/models/orpheus/test_orpheus_placements.py"}
    assert packages - folders == set(elsewhere)
    for package, where in elsewhere.items():
        assert f"`{where}`" in row("tests/") and (ROOT / where).is_file(), package


def test_a_tcp_rank_binds_where_the_doc_says(tmp_path):
    """The doc's address for a local ``transport: tcp`` rank is where its inbox really listens. (A Ray rank binds
    its node's IP: ``tests/ray/test_ray_cluster.py`` reads every worker's address on a three-node cluster.)"""
    import zmq

    from walkserve.protocol.run import RunSpec
    from walkserve.transport.ipc import Inbox
    from walkserve.worker.main import local_site

    claim = re.search(r"`transport: tcp` binds a port on ([0-9.]+)", RUNTIME)
    assert claim, "docs/runtime.md no longer says where a tcp rank binds"
    place = {"ranks": [{"id": 0, "device": "cpu"}, {"id": 1, "device": "cpu", "transport": "tcp"}],
             "nodes": [{"nodes": ["lm"], "ranks": [0]}]}
    spec = RunSpec("run", "token", str(tmp_path), "fixture-lm", None, {}, place, "<test>")
    ctx = zmq.Context()
    try:
        tcp, ipc = Inbox(ctx, local_site(spec, 1).inbox, "token"), Inbox(ctx, local_site(spec, 0).inbox, "token")
        host, port = tcp.address.removeprefix("tcp://").rsplit(":", 1)
        assert host == claim.group(1) and int(port) > 0  # bound: a real port, on the doc's address
        assert ipc.address.startswith(f"ipc://{tmp_path}/")
        tcp.socket.close(), ipc.socket.close()
    finally:
        ctx.term()


class Answering(Engine):
    """fixture-lm's ``lm`` as an engine: one int per output, noting the thread of every call."""

    component = "lm"

    def __init__(self) -> None:
        self.threads: set[int] = set()

    def run_groups(self, groups: list, may_yield: bool = False) -> list:
        import torch

        self.threads.add(threading.get_ident())
        return [[{out: torch.tensor([1]) for out in g.outputs} for _ in g.request_ids] for g in groups]

    def release(self, request_id: str) -> None:
        pass

    def close(self) -> None:
        pass


def test_the_heartbeat_beats_as_the_doc_says_on_one_thread(tmp_path):
    """docs/runtime.md: a worker runs one thread of work, and `Worker.run` is `receive → advance → send →
    housekeeping`. A worker serving a request records the order of its beats and the thread of every engine
    call: the doc's order, repeated, and the engine on the heartbeat's own thread (no compute thread)."""
    import zmq

    from walkserve.core.array import ArrayData
    from walkserve.core.sampling import SamplingParams
    from walkserve.placement.plan import parse_placement
    from walkserve.protocol import messages as m
    from walkserve.protocol.arrays import wire_value
    from walkserve.protocol.run import RankSite, RunSpec
    from walkserve.testing.fixtures.base import FixtureParams
    from walkserve.testing.fixtures.lm import build_graph
    from walkserve.transport.ipc import Outbox
    from walkserve.worker.worker import Worker

    beats = [b.strip() for b in re.search(r"`Worker.run` is `([^`]+)`", RUNTIME).group(1).split("→")]
    calls: list[tuple[str, int]] = []

    class Recorded(Worker):
        pass

    depth = [0]  # a beat's own calls (housekeeping sends its stats) are not beats
    for name in beats:
        def record(self, _name=name, _method=getattr(Worker, name)):
            if not depth[0]:
                calls.append((_name, threading.get_ident()))
            depth[0] += 1
            try:
                return _method(self)
            finally:
                depth[0] -= 1
        setattr(Recorded, name, record)

    engine = Answering()
    spec = RunSpec("r0docs", "token", str(tmp_path), "fixture-lm", None, {}, {}, "<test>")
    placement = parse_placement({"ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": ["lm"], "ranks": [0]}]},
                                "<test>")
    worker = Recorded(spec, 0, build_graph(), {"lm": engine}, RankSite(spec.address("rank0"), spec.conductor_address,
                                                                        "local"), placement)
    thread = threading.Thread(target=worker.run, daemon=True)
    before = set(threading.enumerate())
    thread.start()
    ctx = zmq.Context()
    out = Outbox(ctx, spec.token)
    out.connect("rank", spec.address("rank0"))
    prompt = wire_value(ArrayData.from_list([3, 4]))
    out.send_now("rank", m.StartWalk("r1", "prefill", {"lm": 0}, {"prompt": prompt}, FixtureParams(), SamplingParams()))
    for _ in range(200):
        if engine.threads:
            break
        threading.Event().wait(0.02)
    workers_threads = set(threading.enumerate()) - before
    out.send_now("rank", m.Stop())
    thread.join(10)
    out.close()
    ctx.term()
    assert not thread.is_alive() and engine.threads, "the worker never ran its engine"
    names = [name for name, _ in calls]
    assert len(names) >= 2 * len(beats) and names[: len(names) // len(beats) * len(beats)] == beats * (len(names) // len(beats))
    assert {t for _, t in calls} == engine.threads == {thread.ident}
    assert workers_threads == {thread}  # the worker started no thread of its own
