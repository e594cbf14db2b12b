"""The split loop's floors, for ``./dev bench runtime``: what a split step would cost with nothing but the executors, or
nothing but the transport.

1. In one process (``wire_floor``, ``wire_opcodes``): both ranks' executors stepped in
   lockstep by a ``WireSimulator``, every frame through the real wire path: the
   split's Python before any process, socket or wake-up.
2. On the wire alone (``round_trip``): the frames a split step sends each way, as
   the executors encode them (``step_frames``), handed back and forth between two
   processes through the workers' inboxes: the least a step handed over and back
   adds to the colocated step on this machine.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time
from collections import defaultdict

from benchmarks.runtime import _requests


def _wire_sim_run(batch: int, steps: int, ranks: dict[str, int], measure, sim_type: type | None = None):
    """Run the Null loop for ``batch`` requests of ``steps`` steps in a ``WireSimulator`` (or ``sim_type``) with
    ``ranks``; returns what ``measure(run)`` returns, ``run`` being the simulation's ``run`` (every request's
    outputs are checked)."""
    import gc

    from walkserve.engines.registry import build_engines
    from walkserve.engines.spec import BuildContext
    from walkserve.models.base import ModelRef
    from walkserve.models.registry import load_model
    from walkserve.testing.wire_sim import WireSimulator

    model = load_model(ModelRef("fixture-bench-null", None, {}))
    specs = [model.components()[c] for c in ("a", "b")]

    def engines(rank: int) -> dict:
        return build_engines(specs, BuildContext(rank=rank, device="cpu", dtype=""))

    sim = (sim_type or WireSimulator)(model.graph(), ranks, engines)
    for rank in set(ranks.values()):
        sim.executor(rank)
    for request in _requests(batch, steps):
        sim.submit(request)
    gc.collect()
    out, results = measure(sim.run)
    assert [len(r.outputs) for r in results.values()] == [steps] * batch, "a request lost outputs"
    return out


_PLACES = ({"a": 0, "b": 0}, {"a": 0, "b": 1})  # colocated, split


def wire_floor(batch: int, steps: int, rounds: int) -> tuple[float, float, float]:
    """(colocated, split CPU µs per step, split / colocated) of the loop with both ranks in one process.

    The executors stepped in lockstep, every frame between them through the real wire path
    (``WireSimulator``): what the split costs before any process, socket or wake-up. Thread CPU
    time, so the machine's load does not enter; the minimum over ``rounds`` alternating runs.
    """
    def cpu(run) -> tuple[float, dict]:
        t0 = time.thread_time()
        results = run()
        return (time.thread_time() - t0) / steps * 1e6, results

    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for ranks, runs in zip(_PLACES, times):
            runs.append(_wire_sim_run(batch, steps, ranks, cpu))
    colocated, split = min(times[0]), min(times[1])
    return colocated, split, split / colocated


def wire_opcodes(batch: int, steps: int) -> tuple[float, float, float]:
    """(colocated, split Python opcodes per step, split / colocated) of the same in-process loop.

    Counted with ``sys.settrace`` opcode events over a run of ``steps`` and one of ``3 * steps``, and
    differenced, so the requests' start and end drop out: a count that neither the machine's load nor
    its noise moves (on a shared machine, what to compare two trees by). Bytecode only: what torch,
    msgspec and the sockets do in C is not counted.
    """
    colocated, split = (sum(_opcodes_per_step(batch, steps, ranks).values()) for ranks in _PLACES)
    return colocated, split, split / colocated


def wire_opcode_sites(batch: int, steps: int, most: int) -> list[tuple[str, float, float, float]]:
    """Where the split's extra opcodes go: (function, colocated, split opcodes per step, split - colocated) of the
    ``most`` functions whose count the split raises most, counted as ``wire_opcodes`` counts."""
    colocated, split = (_opcodes_per_step(batch, steps, ranks) for ranks in _PLACES)
    rows = [(site, colocated.get(site, 0.0), n, n - colocated.get(site, 0.0)) for site, n in split.items()]
    return sorted(rows, key=lambda row: -row[3])[:most]


def _opcodes_per_step(batch: int, steps: int, ranks: dict[str, int]) -> dict[str, float]:
    """Opcodes per loop step by function ("module.py:line name"), a run of ``steps`` subtracted from one of 3x."""
    def opcodes(run) -> tuple[dict, dict]:
        counts: dict = defaultdict(int)

        def trace(frame, event, arg):
            frame.f_trace_opcodes = True
            if event == "opcode":
                counts[frame.f_code] += 1
            return trace
        sys.settrace(trace)
        try:
            results = run()
        finally:
            sys.settrace(None)
        return counts, results

    short, long = (_wire_sim_run(batch, n, ranks, opcodes) for n in (steps, 3 * steps))
    per_site: dict[str, float] = defaultdict(float)  # two functions may share a file name and a line
    for code, n in long.items():
        per_site[f"{os.path.basename(code.co_filename)}:{code.co_firstlineno} {code.co_name}"] += (
            (n - short.get(code, 0)) / (2 * steps))
    return dict(per_site)


def step_frames(batch: int, steps: int = 12) -> tuple[bytes, bytes]:
    """The frames of one mid-run step of the split loop at ``batch``: rank 0's to rank 1 (a's output), and rank 1's
    back (b's carry and the stop rule's decisions), encoded as the workers encode them."""
    from walkserve.testing.wire_sim import WireSimulator

    class Recorder(WireSimulator):
        def _deliver(self, key, msg):
            if isinstance(msg, bytes):
                frames[key[0][1], key[1][1]].append(msg)
            super()._deliver(key, msg)

    frames: dict[tuple[int, int], list[bytes]] = defaultdict(list)
    _wire_sim_run(batch, steps, _PLACES[1], lambda run: (None, run()), Recorder)
    there, back = frames[0, 1], frames[1, 0]
    return there[len(there) // 2], back[len(back) // 2]


def round_trip(frames: tuple[bytes, bytes], trips: int, rounds: int, cores: tuple[int, int] | None = None) -> float:
    """Wall µs for ``frames[0]`` to go from this process to another and ``frames[1]`` to come back, the minimum over
    ``rounds`` runs of ``trips`` (each run's mean, after a warm-up); ``cores``: this side's core and the other's
    (the same core twice: the two take turns on it), else wherever the scheduler puts them.

    Each side receives as a worker does (``walkserve.transport.ipc.Inbox``: its datagram socket waited for in
    the inbox's poll, the frame decoded on arrival) and sends with a ``DirectLink``, the workers' link between
    ranks of one node. Frames from ``step_frames``, already encoded: what moving a step there and back costs,
    without the executors that build and apply it.
    """
    context = multiprocessing.get_context("fork")
    mask = os.sched_getaffinity(0) if cores is not None else None
    with tempfile.TemporaryDirectory(prefix="ws-trip-") as run_dir:
        paths = [os.path.join(run_dir, f"{side}.dgram") for side in "ab"]
        ready, child = context.Pipe()
        echo = context.Process(target=_echo, daemon=True,
                               args=(run_dir, paths, frames[1], trips * (rounds + 1), None if cores is None else cores[1], child))
        if cores is not None:
            os.sched_setaffinity(0, {cores[0]})
        inbox, link, ctx = _side(run_dir, paths, 0)
        echo.start()
        try:
            if not ready.poll(30):
                raise RuntimeError("the echo process did not start")
            ready.recv()
            means = []
            for i in range(rounds + 1):  # the first run warms up
                t0 = time.perf_counter()
                for _ in range(trips):
                    link.send(frames[0])
                    _wait(inbox)
                if i:
                    means.append((time.perf_counter() - t0) / trips * 1e6)
            echo.join(30)
        finally:
            if echo.is_alive():
                echo.kill()
            inbox.close()
            link.close()
            ctx.term()
            if mask is not None:
                os.sched_setaffinity(0, mask)
    return min(means)


def _side(run_dir: str, paths: list[str], me: int):
    """This side's inbox (ZeroMQ and datagrams, as a worker's) and its link to the other side."""
    import zmq

    from walkserve.testing.wire_sim import TOKEN
    from walkserve.transport.direct import DirectLink
    from walkserve.transport.ipc import Inbox

    ctx = zmq.Context()
    inbox = Inbox(ctx, f"ipc://{run_dir}/{me}.sock", TOKEN)
    inbox.listen_direct(paths[me])
    return inbox, DirectLink(paths[1 - me], me), ctx


def _wait(inbox, timeout_s: float = 30.0) -> None:
    """Wait in the inbox's poll for the next frame, and decode it (an error when none comes: the other side died)."""
    deadline = time.monotonic() + timeout_s
    while not (inbox.poll(1000) and inbox.receive()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no frame came back in {timeout_s:g} s")


def _echo(run_dir: str, paths: list[str], frame: bytes, trips: int, core: int | None, ready) -> None:
    """The other side of ``round_trip``: answer each frame that arrives with ``frame``."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    inbox, link, ctx = _side(run_dir, paths, 1)
    ready.send(True)
    for _ in range(trips):
        _wait(inbox)
        link.send(frame)
    inbox.close()
    link.close()
    ctx.term()


def core_pairs() -> list[tuple[int, int] | None]:
    """Where ``round_trip`` puts its two sides: on one core, then on two (this process's first allowed cores);
    [None] (wherever the scheduler puts them) where affinity cannot be set or one core is all there is."""
    if not hasattr(os, "sched_setaffinity"):
        return [None]
    allowed = sorted(os.sched_getaffinity(0))
    return [(allowed[0], allowed[0]), (allowed[0], allowed[1])] if len(allowed) > 1 else [None]


def transport_rows(split: dict[int, tuple[float, float]], trips: int, rounds: int) -> list[tuple]:
    """Per batch of ``split`` (batch -> the same run's colocated µs per step and split / colocated): the step's
    frame sizes, the round trip for each of ``core_pairs``, and the colocated step plus the last of them over
    the colocated step, beside the measured split / colocated."""
    rows = []
    for b, (colocated, measured) in sorted(split.items()):
        frames = step_frames(b)
        trips_us = [round_trip(frames, trips, rounds, cores) for cores in core_pairs()]
        rows.append((b, len(frames[0]), len(frames[1]), *trips_us, colocated, (colocated + trips_us[-1]) / colocated,
                     measured))
    return rows
