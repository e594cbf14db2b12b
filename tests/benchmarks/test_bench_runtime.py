"""The runtime benchmark's Null-engine measurement: every output arrives, and CPU is split by process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.runtime import (
    cpu_bound,
    cpu_seconds,
    null_overhead,
    overhead_on,
    pair_rounds,
    start,
)
from benchmarks.runtime_floor import (
    core_pairs,
    round_trip,
    step_frames,
    transport_rows,
    wire_floor,
    wire_opcode_sites,
    wire_opcodes,
)
from walkserve.protocol import codec
from walkserve.protocol import messages as m
from walkserve.testing.wire_sim import TOKEN


@pytest.fixture(scope="module")
def null_one():
    """The Null loop's two nodes on one worker, for every test here that measures that placement."""
    with start("fixture-bench-null", 1, threads=1) as engine:
        yield engine


@pytest.fixture(scope="module")
def stream_one():
    with start("fixture-bench-stream", 1, threads=1) as engine:
        yield engine


def test_null_overhead_measures_wall_and_cpu_per_process():
    runs, cpu = null_overhead(batch=4, workers=2, steps=100, threads=1, repeat=2)
    assert len(runs) == 2 and all(r > 0 for r in runs)
    if sys.platform != "linux":
        pytest.skip("CPU by process is read from /proc")
    assert set(cpu) == {"workers", "conductor", "frontend"}
    # 2 runs x 4 requests x 100 steps x 2 nodes: 1,600 firings went through the workers: they cannot have used no CPU at all
    assert cpu["workers"] > 0 and all(v >= 0 for v in cpu.values())


def test_null_overhead_through_per_request_streams_counts_every_output(null_one):
    runs, _ = overhead_on(null_one, "fixture-bench-null", batch=3, steps=40, repeat=1, streams=True)
    assert len(runs) == 1 and runs[0] > 0  # null_overhead asserts every request got all 40 outputs


def test_cpu_seconds_of_a_process_that_is_gone_is_none():
    assert cpu_seconds(2**22 + 12345) is None


def test_the_streamed_fixture_runs_through_the_runtime(stream_one):
    from benchmarks.runtime import windows

    assert [windows(n) for n in (5, 28, 34, 35, 36)] == [1, 1, 2, 2, 3]  # SlidingWindow(28, 7), tail flushed
    runs, _ = overhead_on(stream_one, "fixture-bench-stream", batch=3, steps=40, repeat=1)
    assert len(runs) == 1 and runs[0] > 0  # every request got all its windows (checked inside)


def test_the_nested_fixture_runs_as_the_reference_says_on_a_virtual_cluster():
    """The bench's nested loop (1 + 15 calls per outer step), with a 0 ms component, on two simulated ranks."""
    from walkserve.core.request import RequestSpec
    from walkserve.engines.spec import BuildContext
    from walkserve.models.base import ModelRef
    from walkserve.models.registry import load_model
    from walkserve.testing.fixtures.base import FixtureParams
    from walkserve.testing.reference import ReferenceExecutor
    from walkserve.testing.simulator import Simulator

    model = load_model(ModelRef("fixture-bench-nested", options={"ms": 0.0}))
    comps = {n: s.build(BuildContext(0, "cpu")) for n, s in model.components().items()}
    graph, ref = model.graph(), ReferenceExecutor(model.graph(), comps)
    sim = Simulator(graph, comps, lambda w, n: {"talker": 0, "predictor": 1}[n], seed=3)
    requests = [RequestSpec({}, params=FixtureParams(steps=2 + i)) for i in range(3)]
    for r in requests:
        sim.submit(r)
    got = sim.run()
    for r in requests:
        want = ref.run(r)
        assert [o.value.tolist() for o in got[r.id].outputs] == [o.value.tolist() for o in want.outputs]
        assert len(want.outputs) == r.params.steps and want.walk_outputs[0]["codes"].shape == (15 * r.params.steps,)


@pytest.mark.slow
def test_quick_runtime_benchmark_prints_every_target_row():
    """``./dev bench runtime --quick``: the split loop, the streamed loop and the nested loop side by side."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "runtime", "--quick"], cwd=root,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "conditions: " in out and "load" in out, out
    number = r"[\d.,]+"
    for fixture, workers in (("loop", 2), ("streamed loop", 1)):  # at the largest quick batch, 16
        assert re.search(rf"^\| {fixture} \| {workers} \| 16 \| \w+ \| {number} \|", out, re.MULTILINE), out
    for fixture, workers, client in (("loop", 1, "run"), ("loop", 2, "run"), ("loop", 1, "streams")):
        for batch in (1, 16) if client == "run" else (16,):
            assert re.search(rf"^\| {fixture} \| {workers} \| {batch} \| {client} \| {number} \|", out, re.MULTILINE), out
    split_table = out[out.index("## Split over two workers"):out.index("## The same loop with both ranks")]
    split = re.findall(rf"^\| ([a-zA-Z ,]+) \| (\d+) \| {number} \| {number} \| ({number}) \|$", split_table, re.MULTILINE)
    assert [(what, int(b)) for what, b, _ in split] == [("loop", 1), ("loop", 16), ("loop, in halves", 16),
                                                        ("loop, over ZeroMQ", 16), ("streamed loop", 16)], out
    assert all(float(ratio.replace(",", "")) > 0 for _, _, ratio in split), out
    if sys.platform == "linux":  # CPU by process, read from /proc
        cpu_table = out[out.index("## Where the split's step goes"):out.index("## The same loop with both ranks")]
        cpu = re.findall(rf"^\| ([a-zA-Z ,]+) \| (\d+)((?: \| {number}){{9}}) \|$", cpu_table, re.MULTILINE)
        assert [(what, int(b)) for what, b, _ in cpu] == [(what, int(b)) for what, b, _ in split], out
        for _, _, cols in cpu:
            figures = [float(x.replace(",", "")) for x in cols.split(" | ")[1:]]
            split_cpu, bound = figures[3:7], figures[7]
            assert min(figures) >= 0 and bound >= 0.99 * max(split_cpu), out  # never below the busiest process
    wire_table = out[out.index("## The split's floor on the wire"):out.index("## The same loop with both ranks")]
    wire = re.findall(rf"^\| (\d+)((?: \| {number}){{{5 + len(core_pairs())}}}) \|$", wire_table, re.MULTILINE)
    assert [int(b) for b, _ in wire] == [1, 16], out  # the loop's batches
    for b, cols in wire:
        *_, trip, colocated, floor, measured = [float(x.replace(",", "")) for x in cols.split(" | ")[1:]]
        assert floor == pytest.approx((colocated + trip) / colocated, rel=0.02), out
        loop_ratio = next(float(r.replace(",", "")) for what, bb, r in split if what == "loop" and bb == b)
        assert measured == pytest.approx(loop_ratio, rel=0.01), out  # the split table's ratio beside it
    floor_table = out[out.index("## The same loop with both ranks in one process"):out.index("## Where the split's extra")]
    sites_table = out[out.index("## Where the split's extra"):out.index("## Busy component")]
    sites = re.findall(rf"^\| ([\w.]+:\d+ [<>\w]+) \| {number} \| {number} \| {number} \|$", sites_table, re.MULTILINE)
    assert len(sites) == 12 and any(site.endswith(" put_rows") for site in sites), out
    floor = re.findall(rf"^\| (\d+) \| {number} \| {number} \| {number} \| ({number}) \| ({number}) \| {number} \|$",
                       floor_table, re.MULTILINE)
    assert [b for b, _, _ in floor] == ["1", "16"], out
    # opcodes per step: the split runs more Python than colocated at every batch
    assert all(0 < float(c.replace(",", "")) < float(s.replace(",", "")) for _, c, s in floor), out
    for loop in ("flat loop", r"nested loop \(1 \+ 15 calls per step\)"):
        assert re.search(rf"^\| {loop} \| \d+ \| {number} \| {number} \| {number} \|$", out, re.MULTILINE), out


@pytest.mark.slow
def test_split_pair_runs_both_placements_in_alternating_rounds(null_one, stream_one):
    # split_steps 2: the split runtime sends each step of the 4 requests in two halves; every output still
    # arrives (pair_rounds asserts each request's count in every round)
    with start("fixture-bench-null", 2, threads=1, split_steps=2) as split:
        pair = pair_rounds((null_one, split), "fixture-bench-null", batch=4, steps=100, rounds=2)
    assert pair.colocated > 0 and pair.split > 0 and pair.ratio > 0
    if sys.platform == "linux":  # CPU by process, read from /proc, for each runtime's own rounds
        assert set(pair.colocated_cpu) == {"rank 0", "conductor", "frontend"}
        assert set(pair.split_cpu) == {"rank 0", "rank 1", "conductor", "frontend"}
        # 2 rounds x 100 steps x 4 requests went through four processes: not without any CPU at all
        assert min(pair.split_cpu.values()) >= 0 and sum(pair.split_cpu.values()) > 0
    with start("fixture-bench-stream", 2, threads=1) as split:
        assert pair_rounds((stream_one, split), "fixture-bench-stream", batch=2, steps=30, rounds=1).ratio > 0


def test_the_cpu_bound_is_the_cores_share_or_the_busiest_process():
    assert cpu_bound({"rank 0": 300.0, "rank 1": 100.0}, cores=2) == 300.0  # one process cannot use two cores
    assert cpu_bound({"rank 0": 300.0, "rank 1": 300.0, "conductor": 300.0}, cores=2) == 450.0
    assert cpu_bound({"rank 0": 300.0, "rank 1": 300.0, "conductor": 300.0}, cores=4) == 300.0


def test_the_wire_floor_runs_the_loop_on_one_rank_and_on_two_in_one_process():
    colocated, split, ratio = wire_floor(batch=4, steps=10, rounds=1)  # every request's outputs checked inside
    assert colocated > 0 and split > 0 and ratio == split / colocated


def test_the_wire_opcodes_count_more_python_for_the_split_than_for_colocated():
    colocated, split, ratio = wire_opcodes(batch=4, steps=3)
    # the split packs, sends, unpacks and applies the rows of two messages a step that colocated never makes
    assert 0 < colocated < split and ratio == split / colocated
    again = wire_opcodes(batch=4, steps=3)  # a count, not a timing: within 1% run to run (a small spread, not traced)
    assert again[0] == pytest.approx(colocated, rel=0.01) and again[1] == pytest.approx(split, rel=0.01)


def test_the_opcode_sites_say_which_functions_the_split_runs_more():
    sites = wire_opcode_sites(batch=4, steps=3, most=40)
    raised = [extra for *_, extra in sites]
    assert raised == sorted(raised, reverse=True) and len(sites) == 40
    assert all(extra == pytest.approx(split - colocated) for _, colocated, split, extra in sites)
    by_name = {site.split(" ")[1]: (colocated, split) for site, colocated, split, _ in sites}
    colocated, split = by_name["put_rows"]  # rows that came from another rank: only the split has them
    assert colocated == 0 < split


def test_a_split_step_hands_a_s_rows_over_and_b_s_carry_and_decisions_back():
    there, back = step_frames(batch=4)
    to_b, to_a = codec.decode(there, TOKEN), codec.decode(back, TOKEN)
    assert {type(msg) for msg in to_b} == {m.Values}  # a's output for b, the step's 4 rows in one message
    assert sum(len(msg.request_ids) for msg in to_b) == 4
    # the carry for a's next step, and the stop rule's decision for each member
    assert {type(msg) for msg in to_a} == {m.Values, m.LoopEvents}
    assert sum(len(msg.request_ids) for msg in to_a if isinstance(msg, m.Values)) == 4
    assert len(step_frames(batch=16)[0]) > len(there)  # rows per member: a larger batch, a larger frame


@pytest.mark.slow  # forks the other side
def test_a_round_trip_moves_both_frames_and_takes_time():
    frames = step_frames(batch=2)
    for cores in core_pairs():
        assert 0 < round_trip(frames, trips=20, rounds=2, cores=cores) < 1e6
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    round_trip(frames, trips=5, rounds=1, cores=core_pairs()[-1])
    if before is not None:
        assert os.sched_getaffinity(0) == before  # this process's cores given back


@pytest.mark.slow  # forks the other side
def test_the_transport_rows_put_the_round_trip_on_the_colocated_step():
    rows = transport_rows({2: (300.0, 2.5)}, trips=10, rounds=1)
    (b, there, back, *trips, colocated, floor, measured), = rows
    assert (b, colocated, measured) == (2, 300.0, 2.5) and there > 0 and back > 0
    assert len(trips) == len(core_pairs()) and min(trips) > 0
    assert floor == pytest.approx((300.0 + trips[-1]) / 300.0)
