"""The planner's discrete-event simulation on Null-engine graphs whose right answer is known on paper.

GPU ranks (no core sharing) and free messages unless a test says otherwise, so
every figure below is exact arithmetic over the node costs the test sets.
"""

import pytest

from walkserve.engines.spec import ComponentSpec
from walkserve.graph import (
    LAST,
    Client,
    FixedChunk,
    FunctionStateMachine,
    GraphEdge,
    GraphNode,
    Loop,
    Parallel,
    Sequential,
    SlidingWindow,
    StreamingGraphEdge,
    Walk,
    WalkGraph,
    WalkStart,
)
from walkserve.models.base import Model, ModelRef
from walkserve.placement.plan import parse_placement
from walkserve.planner.costs import CostTable, NodeCost, RequestItems
from walkserve.planner.devices import parse_devices
from walkserve.planner.flow import build_flow
from walkserve.planner.score import score
from walkserve.planner.search import enumerate_candidates
from walkserve.planner.simulate import Load, Simulation, simulate

STEPS = 10  # outer iterations of every graph below
INNER = 15


def _start(req):
    return WalkStart("w", {})


def null(*names, max_batch=64):
    return {n: ComponentSpec(n, "null", lambda ctx: None, options={"max_batch": max_batch}) for n in names}


def cost(fixed: float, per_item: float = 0.0) -> NodeCost:
    """A node whose step costs ``fixed + per_item * batch`` seconds (samples at batches 1 and 4)."""
    c = NodeCost()
    for b in (1, 4):
        c.add(1, b, float(b), fixed + per_item * b)
    return c


def costs(nodes: dict[str, NodeCost], items: dict[str, float], hop_latency_s: float = 0.0) -> CostTable:
    t = CostTable("test", nodes, items, {}, 0.0)
    t.hop_latency_s = hop_latency_s
    return t


def placement(blocks: list[tuple[list[str], list[int]]]) -> object:
    ranks = sorted({r for _, rs in blocks for r in rs})
    return parse_placement({"ranks": [{"id": r, "device": f"cuda:{r}"} for r in ranks],
                            "nodes": [{"nodes": ns, "ranks": rs} for ns, rs in blocks]}, "<test>")


def pipeline() -> WalkGraph:
    """Loop(STEPS)[ a ] ~> FixedChunk(1) ~> b -> client: every item of a is one item of b."""
    loop = Loop(GraphNode("a", ["x"], ["x"]), iterations=STEPS, carry={"a.x": "a.x"}, name="gen")
    edges = [GraphEdge("input.x", "a.x"), StreamingGraphEdge("a.x", "b.x", FixedChunk(1)),
             GraphEdge("b.y", Client("audio"))]
    return WalkGraph("pipe", [Walk("w", Parallel(loop, GraphNode("b", ["x"], ["y"])), edges, ["x"])],
                     FunctionStateMachine(_start))


def nested() -> WalkGraph:
    """Loop(STEPS)[ talker -> Loop(INNER)[ predictor ] -> frame ]: the inner loop's last output makes the frame,
    the talker's next input (Qwen3-Omni's talker and code predictor)."""
    inner = Loop(GraphNode("predictor", ["x", "c"], ["c"]), iterations=INNER, carry={"predictor.c": "predictor.c"},
                 outputs={"predictor.c": LAST}, name="depth")
    outer = Loop(Sequential(GraphNode("talker", ["x"], ["x"]), inner, GraphNode("frame", ["c"], ["x"])),
                 iterations=STEPS, carry={"frame.x": "talker.x"}, outputs={"talker.x": LAST}, name="talk")
    edges = [GraphEdge("input.x", "talker.x"), GraphEdge("talker.x", "predictor.x"), GraphEdge("input.c", "predictor.c"),
             GraphEdge("predictor.c", "frame.c"), GraphEdge("talker.x", Client("audio"))]
    return WalkGraph("nested", [Walk("w", outer, edges, ["x", "c"])], FunctionStateMachine(_start))


def test_flow_reads_edges_streams_and_carries():
    t = costs({"talker": cost(1), "predictor": cost(1), "frame": cost(1)}, {"talker": 10, "predictor": 150, "frame": 10})
    flow = build_flow(t, nested(), {})
    talker, predictor, frame = (flow.units[flow.index[n]] for n in ("talker", "predictor", "frame"))
    assert talker.client and not predictor.client
    (carry,), (fwd,), (made,) = talker.inputs, predictor.inputs, frame.inputs
    assert (carry.kind, fwd.kind, made.kind) == ("carry", "forward", "forward")
    assert [fwd.needs(k, 10, 150) for k in (1, 15, 16)] == [1, 1, 2]  # an inner step waits for its frame's talker step
    assert [made.needs(k, 150, 10) for k in (1, 2)] == [15, 30]  # a frame waits for its fifteen inner steps
    assert [carry.needs(k, 10, 10) for k in (1, 2)] == [0, 1]  # the next talker step waits for the last frame
    window = build_flow(costs({"lm": cost(1), "codec": cost(1)}, {"lm": 64, "codec": 7}), _windowed(), {})
    (edge,) = window.units[window.index["codec"]].inputs
    assert [edge.needs(k, 64, 7) for k in (1, 2, 7)] == [28, 35, 64]  # first window at 28, then every 7, flushed


def _windowed() -> WalkGraph:
    loop = Loop(GraphNode("lm", ["x"], ["x"]), iterations=64, carry={"lm.x": "lm.x"}, name="gen")
    edges = [GraphEdge("input.x", "lm.x"), StreamingGraphEdge("lm.x", "codec.x", SlidingWindow(28, 7)),
             GraphEdge("codec.y", Client("audio"))]
    return WalkGraph("win", [Walk("w", Parallel(loop, GraphNode("codec", ["x"], ["y"])), edges, ["x"])],
                     FunctionStateMachine(_start))


def test_a_replica_of_the_bottleneck_stage_doubles_throughput():
    # b costs 4 ms an item and gains nothing from batching: on its own rank it carries 1 / (10 x 4 ms) = 25 req/s,
    # on two replicas 50; a (1 ms a step at any batch) is never the bottleneck
    g, comps = pipeline(), null("a", "b")
    t = costs({"a": cost(0.001), "b": cost(0.0, 0.004)}, {"a": STEPS, "b": STEPS})
    load = Load(8, requests=64)
    split = simulate(t, g, placement([(["a"], [0]), (["b"], [1])]), load, comps)
    twice = simulate(t, g, placement([(["a"], [0]), (["b"], [1, 2])]), load, comps)
    together = simulate(t, g, placement([(["a", "b"], [0])]), load, comps)
    assert split.throughput == pytest.approx(25, rel=0.05)
    assert twice.throughput == pytest.approx(50, rel=0.08)
    assert together.throughput < split.throughput < twice.throughput
    assert split.bottleneck == 1 and split.rank_busy[1] == pytest.approx(0.040, rel=1e-6)
    assert twice.rank_busy[1] == pytest.approx(0.020, rel=0.1)  # each replica takes half of the requests


def test_splitting_a_nested_loop_adds_two_hops_to_every_frame():
    # one request at a time: its latency is STEPS x (talker + INNER predictor steps + frame), plus, split over two
    # ranks, two hops per frame (talker -> predictor, predictor -> frame); throughput is 1 / latency
    g, comps = nested(), null("talker", "predictor", "frame")
    t = costs({"talker": cost(0.002), "predictor": cost(0.001), "frame": cost(0.0005)},
              {"talker": STEPS, "predictor": STEPS * INNER, "frame": STEPS}, hop_latency_s=0.003)
    one = simulate(t, g, placement([(["talker", "predictor", "frame"], [0])]), Load(1, requests=4), comps)
    two = simulate(t, g, placement([(["talker", "frame"], [0]), (["predictor"], [1])]), Load(1, requests=4), comps)
    frame = 0.002 + INNER * 0.001 + 0.0005
    assert 1 / one.throughput == pytest.approx(STEPS * frame, rel=1e-6)
    assert one.latency_s == pytest.approx(STEPS * frame, rel=1e-6)  # alone: a request's latency is its chain
    assert 1 / two.throughput == pytest.approx(STEPS * (frame + 2 * 0.003), rel=1e-6)
    assert two.latency_bound  # both ranks mostly wait on the other
    # TTFA: the talker's first output, after its first step; the split does not change that
    assert one.ttfa_s == pytest.approx(0.002) and two.ttfa_s == pytest.approx(0.002)


def test_ttfa_waits_for_every_output_stream_a_request_makes():
    # the LM streams its tokens to the client and the codec its audio: a spoken answer's TTFA is its first audio,
    # the codec's first window after 28 LM steps (1 ms each) and one codec step (2 ms), not the first token
    loop = Loop(GraphNode("lm", ["x"], ["x"]), iterations=64, carry={"lm.x": "lm.x"}, name="gen")
    edges = [GraphEdge("input.x", "lm.x"), StreamingGraphEdge("lm.x", "codec.x", SlidingWindow(28, 7)),
             GraphEdge("lm.x", Client("text")), GraphEdge("codec.y", Client("audio"))]
    g = WalkGraph("spoken", [Walk("w", Parallel(loop, GraphNode("codec", ["x"], ["y"])), edges, ["x"])],
                  FunctionStateMachine(_start))
    t = costs({"lm": cost(0.001), "codec": cost(0.002)}, {"lm": 64, "codec": 6})
    alone = simulate(t, g, placement([(["lm", "codec"], [0])]), Load(1, requests=2), null("lm", "codec"))
    assert alone.ttfa_s == pytest.approx(28 * 0.001 + 0.002, rel=0.05)


def test_batching_under_load_and_ttfa_grow_with_concurrency():
    # a costs 10 ms a step whatever the batch: 8 requests at once share each step, so throughput is 8x one at a time
    g, comps = pipeline(), null("a", "b")
    t = costs({"a": cost(0.010), "b": cost(0.0, 1e-6)}, {"a": STEPS, "b": STEPS})
    p = placement([(["a", "b"], [0])])
    alone = simulate(t, g, p, Load(1, requests=8), comps)
    crowd = simulate(t, g, p, Load(8, requests=32), comps)
    assert crowd.throughput / alone.throughput == pytest.approx(8, rel=0.05)
    # a step's bound caps the batch: at most 2 at once, so 8 in flight run 4 steps for every 1 alone
    capped = simulate(t, g, p, Load(8, requests=32), null("a", "b", max_batch=2))
    assert capped.throughput / alone.throughput == pytest.approx(2, rel=0.05)
    assert capped.ttfa_s > crowd.ttfa_s


def test_open_loop_rate_below_capacity_is_carried():
    g, comps = pipeline(), null("a", "b")
    t = costs({"a": cost(0.001), "b": cost(0.0, 0.004)}, {"a": STEPS, "b": STEPS})
    p = placement([(["a"], [0]), (["b"], [1])])
    light = simulate(t, g, p, Load(rate=5.0, requests=40), comps)
    assert light.throughput == pytest.approx(5.0, rel=0.35)  # Poisson arrivals: the run's rate, not exactly 5
    assert light.ttfa_s == pytest.approx(0.001 + 0.004, rel=0.5)  # mostly alone: one a step, one b step
    heavy = simulate(t, g, p, Load(rate=100.0, requests=40), comps)
    assert heavy.throughput < 30 and heavy.ttfa_s > 5 * light.ttfa_s  # beyond 25 req/s the queue grows


def test_cpu_ranks_share_the_hosts_cores():
    # two CPU ranks of one thread each on a one-core host: each step runs at half speed while the other runs
    g, comps = pipeline(), null("a", "b")
    t = costs({"a": cost(0.0, 0.004), "b": cost(0.0, 0.004)}, {"a": STEPS, "b": STEPS})
    data = {"ranks": [{"id": 0, "device": "cpu"}, {"id": 1, "device": "cpu"}],
            "nodes": [{"nodes": ["a", "b"], "ranks": [0, 1]}]}
    two_cores = simulate(t, g, parse_placement(data, "<t>"), Load(8, requests=32), comps, cores=2)
    one_core = simulate(t, g, parse_placement(data, "<t>"), Load(8, requests=32), comps, cores=1)
    assert one_core.host_bound and not two_cores.host_bound
    assert two_cores.throughput / one_core.throughput == pytest.approx(2, rel=0.05)


class NullModel(Model):
    """A graph of Null-engine nodes, weightless: every placement fits."""

    def __init__(self, graph: WalkGraph, comps: dict[str, ComponentSpec]):
        self.ref = ModelRef(graph.name, None)
        self._graph, self._comps = graph, comps

    def graph(self) -> WalkGraph:
        return self._graph

    def components(self) -> dict[str, ComponentSpec]:
        return self._comps


def test_planner_replicates_the_bottleneck_stage():
    model = NullModel(pipeline(), null("a", "b"))
    t = costs({"a": cost(0.001), "b": cost(0.0, 0.004)}, {"a": STEPS, "b": STEPS})
    ranked = {c.name: c.score.throughput for c in enumerate_candidates(model, parse_devices("cuda:0-1"), t, Load(8))}
    assert max(ranked, key=ranked.get) in ("[a, b] x2", "[a] | [b]")
    assert ranked["[a, b] x2"] > 1.5 * ranked["[a, b]"]  # b's work halves; a's is small beside it
    three = enumerate_candidates(model, parse_devices("cuda:0-2"), t, Load(8))
    assert "x" in three[0].name  # the winner replicates b, alone or with a
    assert three[0].score.throughput > 1.5 * next(c.score.throughput for c in three if c.name == "[a] | [b]")


def test_planner_keeps_a_latency_bound_nested_loop_together():
    model = NullModel(nested(), null("talker", "predictor", "frame"))
    t = costs({"talker": cost(0.002), "predictor": cost(0.001), "frame": cost(0.0005)},
              {"talker": STEPS, "predictor": STEPS * INNER, "frame": STEPS}, hop_latency_s=0.003)
    cands = enumerate_candidates(model, parse_devices("cuda:0-1"), t, Load(1, requests=4))
    together = next(c for c in cands if c.name == "[talker, predictor, frame]")
    assert cands[0].score.throughput == pytest.approx(together.score.throughput)
    split = [c for c in cands if " | " in c.name]
    assert split and all(c.score.throughput < 0.8 * together.score.throughput for c in split)


def speech(tokens: int = 64, window: int = 16) -> WalkGraph:
    """Loop(tokens)[ lm ] ~> FixedChunk(window) ~> codec -> client (Orpheus: an LM and its codec's windows)."""
    loop = Loop(GraphNode("lm", ["x"], ["x"]), iterations=tokens, carry={"lm.x": "lm.x"}, name="gen")
    edges = [GraphEdge("input.x", "lm.x"), StreamingGraphEdge("lm.x", "codec.x", FixedChunk(window)),
             GraphEdge("codec.y", Client("audio"))]
    return WalkGraph("speech", [Walk("w", Parallel(loop, GraphNode("codec", ["x"], ["y"])), edges, ["x"])],
                     FunctionStateMachine(_start))


def test_a_slow_repeat_in_the_profile_does_not_favour_replicas():
    # tiny Orpheus's LM step barely grows with the batch (2.0 ms at 1, 2.3 ms at 4). A profile whose repeats at
    # the larger batches were slowed by other work on the host (1.5x) fitted a steeper line: two full replicas
    # (the LM at half the batch, beside its codec) then ranked above the LM alone on a rank, which batches all
    # requests, as the bench measured the other way round (docs/placement.md, issue 31)
    def profiled(fixed: float, per_item: float, slow: float) -> NodeCost:
        c = NodeCost()
        for threads in (1, 2):  # a tiny model's step is no faster at two threads
            for conc in (1, 2, 4, 8):
                c.add(threads, conc, float(conc), fixed + per_item * conc)
                c.add(threads, conc, float(conc), (fixed + per_item * conc) * (slow if conc >= 4 else 1.0))
        return c

    model, devices = NullModel(speech(), null("lm", "codec")), parse_devices("cpu:0-1")
    ranked = {}
    for slow in (1.0, 1.5):
        t = costs({"lm": profiled(0.0019, 0.0001, slow), "codec": profiled(0.0036, 0.0015, 1.0)}, {"lm": 64, "codec": 4})
        t.cores = 2
        ranked[slow] = [c.name for c in enumerate_candidates(model, devices, t, Load(4))]
    assert ranked[1.0][0] == "[lm] | [codec]"
    assert ranked[1.5] == ranked[1.0]


def test_walks_that_feed_each_other_do_not_deadlock():
    # walk w: a prefill (a, outside any loop) feeds a loop of b; walk w2: b feeds a. Read naively, a waits for b
    # and b for a: the edge that closes the cycle is read as a carry, a setup edge needs only a first item
    loop = Loop(GraphNode("b", ["x"], ["x"]), iterations=STEPS, carry={"b.x": "b.x"}, outputs={"b.x": LAST}, name="l")
    w = Walk("w", Sequential(GraphNode("a", ["x"], ["x"]), loop),
             [GraphEdge("input.x", "a.x"), GraphEdge("a.x", "b.x"), GraphEdge("b.x", Client("text"))], ["x"])
    w2 = Walk("w2", Sequential(GraphNode("b", ["x"], ["x"]), GraphNode("a", ["x"], ["x"])),
              [GraphEdge("input.x", "b.x"), GraphEdge("b.x", "a.x"), GraphEdge("a.x", Client("text"))], ["x"])
    g = WalkGraph("cyc", [w, w2], FunctionStateMachine(_start))
    t = costs({"a": cost(0.002), "b": cost(0.001)}, {"a": 1, "b": STEPS})
    flow = build_flow(t, g, {})
    kinds = sorted(e.kind for u in flow.units for e in u.inputs)
    assert kinds == ["carry", "setup"]
    sim = Simulation(t, flow, g, placement([(["a", "b"], [0])]), Load(1, requests=2))
    sc = sim.run()
    assert sim.forced == 0
    assert 1 / sc.throughput == pytest.approx(0.002 + STEPS * 0.001, rel=1e-6)


def test_a_ranks_loop_time_outside_its_steps_is_paid_every_step():
    # one request at a time on one rank: 10 steps of a (1 ms) and 10 of b (4 ms), each with 0.5 ms of the worker's
    # loop around it: 10 x 5 ms + 20 x 0.5 ms = 60 ms a request; two replicas of [a, b] at 2 requests each pay the
    # loop once per step of two, so their half-batch steps cost 5 ms + 1 ms a pair of items on each of two ranks
    g, comps = pipeline(), null("a", "b")
    t = costs({"a": cost(0.001), "b": cost(0.004)}, {"a": STEPS, "b": STEPS})
    t.loop = cost(0.0005)
    alone = simulate(t, g, placement([(["a", "b"], [0])]), Load(1, requests=4), comps)
    assert 1 / alone.throughput == pytest.approx(STEPS * 0.005 + 2 * STEPS * 0.0005, rel=1e-6)
    assert alone.rank_busy[0] == pytest.approx(0.060, rel=1e-6)
    assert score(t, g, placement([(["a", "b"], [0])]), 1).rank_busy[0] == pytest.approx(0.060, rel=1e-6)  # the bound too
    twice = simulate(t, g, placement([(["a", "b"], [0, 1])]), Load(4, requests=16), comps)
    assert twice.rank_busy[0] == pytest.approx(STEPS * (0.005 + 2 * 0.0005) / 4, rel=0.05)  # 2 of 4 requests a step


def test_the_frontend_takes_its_cpu_from_the_hosts_cores():
    # the frontend (conductor and client) spends 20 ms per request in 10 pieces, one per client output of b. Beside
    # a GPU rank it has the host's core to itself and keeps up: a request takes its 50 ms of steps plus the last
    # 2 ms piece. Beside a CPU rank on a one-core host the two share the core, never idle: 50 + 20 = 70 ms
    g, comps = pipeline(), null("a", "b")
    t = costs({"a": cost(0.001), "b": cost(0.004)}, {"a": STEPS, "b": STEPS})
    t.frontend_s = 0.020
    gpu = simulate(t, g, placement([(["a", "b"], [0])]), Load(1, requests=4), comps, cores=1)
    assert 1 / gpu.throughput == pytest.approx(0.050 + 0.002, rel=1e-6)
    data = {"ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": ["a", "b"], "ranks": [0]}]}
    cpu = simulate(t, g, parse_placement(data, "<t>"), Load(1, requests=4), comps, cores=1)
    assert 1 / cpu.throughput == pytest.approx(0.070, rel=1e-6)
    assert set(cpu.rank_busy) == {0}  # the frontend is not a rank of the placement
    # the bound: 50 ms of the rank and 20 ms of the frontend, core-seconds per request against one core
    assert 1 / score(t, g, parse_placement(data, "<t>"), 1, cores=1).throughput == pytest.approx(0.070, rel=1e-6)



def spoken_or_text() -> WalkGraph:
    """The nested loop of ``nested()`` (a spoken answer) beside a walk of 32 ``lm`` steps (a text answer)."""
    say = Loop(GraphNode("lm", ["x"], ["x"]), iterations=32, carry={"lm.x": "lm.x"}, outputs={"lm.x": LAST}, name="say")
    text = Walk("say", say, [GraphEdge("input.x", "lm.x"), GraphEdge("lm.x", Client("text"))], ["x"])
    return WalkGraph("mix", [*nested().walks.values(), text], FunctionStateMachine(_start))


def per_request_table(reqs: list[RequestItems]):
    """One-millisecond steps for every node, each request making its own items (the mix's mean beside them)."""
    mean = {n: sum(r.items.get(n, 0) for r in reqs) / len(reqs) for n in ("talker", "predictor", "frame", "lm")}
    t = costs({n: cost(0.001) for n in mean}, mean)
    t.requests = reqs
    return t


def test_each_request_makes_the_items_its_profiled_request_made():
    # 3 spoken answers (10, 7 and 10 frames: per frame a talker step, 15 predictor steps and a frame step) and a text
    # answer (32 lm steps, on another rank) at once, every step 1 ms at any batch. The spoken ones step together:
    # 10 frames of 17 ms, 170 ms for the lot, while the text one takes 32 ms on its own rank: 4 requests in 170 ms.
    # The mix's mean (6.75 frames, 101.25 predictor steps) made every request a fraction of a spoken one: 101 or 102
    # predictor steps over 6 or 7 frames, which the loop cannot close (a frame waits for the 16th predictor step,
    # which waits for the next frame), so requests were released one item at a time and never stepped together
    g = spoken_or_text()
    spoken = [{"talker": f, "predictor": f * INNER, "frame": f} for f in (STEPS, 7, STEPS)]
    reqs = [RequestItems("spoken", spoken[0]), RequestItems("text", {"lm": 32}), RequestItems("spoken", spoken[1]),
            RequestItems("spoken", spoken[2])]
    t = per_request_table(reqs)
    sim = Simulation(t, build_flow(t, g, {}), g, placement([(["talker", "predictor", "frame"], [0]), (["lm"], [1])]),
                     Load(4, requests=4))
    sc = sim.run()
    assert sim.forced == 0
    assert [sum(n) for n in sim.n] == [STEPS * (INNER + 2), 32, 7 * (INNER + 2), STEPS * (INNER + 2)]
    assert sc.throughput == pytest.approx(4 / (STEPS * (INNER + 2) * 0.001), rel=1e-6)
    assert sc.rank_busy[0] == pytest.approx(STEPS * (INNER + 2) * 0.001 / 4, rel=1e-6)


def test_a_request_joins_a_loop_at_its_iteration_boundary():
    # the worker's cohort starts a member's iteration only with the others: request 0 (a spoken answer of 10 frames,
    # 17 one-millisecond steps a frame) is 2 ms into its first frame when request 2 arrives (after request 1's two
    # lm steps on another rank), so request 2 waits for that frame's end (17 ms) and then steps every unit with
    # request 0: request 0 ends at 170 ms, request 2 one frame later, at 187 ms
    g = spoken_or_text()
    spoken = {"talker": STEPS, "predictor": STEPS * INNER, "frame": STEPS}
    reqs = [RequestItems("spoken", spoken), RequestItems("text", {"lm": 2}), RequestItems("spoken", spoken)]
    t = per_request_table(reqs)
    sim = Simulation(t, build_flow(t, g, {}), g, placement([(["talker", "predictor", "frame"], [0]), (["lm"], [1])]),
                     Load(2, requests=3))
    sc = sim.run()
    assert sim.done_at[0] == pytest.approx(0.170) and sim.started[2] == pytest.approx(0.002)
    assert sim.done_at[2] == pytest.approx(0.187)
    assert sc.rank_busy[0] == pytest.approx(0.187 / 3, rel=1e-6)  # every step of rank 0 after 17 ms is for both


class _Recounted(Simulation):
    """At every join, the kept count of requests inside each loop iteration per rank must equal a fresh scan."""

    joins = 0

    def joining_waits(self, r: int, head: int, k: int) -> bool:
        for h in self.flow.heads:
            scan = [self.inside(r2, h) for r2 in range(len(self.n))]
            assert [w.get(h) for w in self.where] == scan
            assert {x: c for x, c in self.inside_at[h].items() if c} == {x: scan.count(x) for x in scan if x is not None}
        self.joins += 1
        return super().joining_waits(r, head, k)


@pytest.mark.parametrize("seed", range(12))
def test_the_kept_count_of_requests_inside_a_loop_equals_a_scan(seed):
    import random

    rng = random.Random(seed)
    g = spoken_or_text()
    reqs = []
    for _ in range(rng.randint(2, 6)):
        f = rng.randint(1, 12)
        reqs.append(RequestItems("spoken", {"talker": f, "predictor": f * INNER, "frame": f}) if rng.random() < 0.7
                    else RequestItems("text", {"lm": rng.randint(1, 40)}))
    mean = {n: sum(r.items.get(n, 0) for r in reqs) / len(reqs) or 1.0 for n in ("talker", "predictor", "frame", "lm")}
    t = costs({n: cost(rng.uniform(0.0005, 0.002), rng.uniform(0, 0.001)) for n in mean}, mean,
              hop_latency_s=rng.choice([0.0, 0.0003]))
    t.requests = reqs
    blocks = rng.choice([[(["talker", "predictor", "frame", "lm"], [0])],
                         [(["talker", "predictor", "frame"], [0, 1]), (["lm"], [2])],
                         [(["talker", "frame"], [0]), (["predictor"], [1, 2]), (["lm"], [3])]])
    load = rng.choice([Load(rng.randint(1, 6), requests=16), Load(rate=rng.uniform(5, 50), requests=16)])
    sim = _Recounted(t, build_flow(t, g, {}), g, placement(blocks), load)
    sim.run()
    assert sim.joins > 0 and len(sim.finished) == 16
