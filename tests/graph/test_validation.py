"""Each construction-time validation error, raised for a minimal malformed graph, names the culprit."""

from __future__ import annotations

import pytest

from walkserve.core.errors import GraphError
from walkserve.graph import (
    DROP,
    LAST,
    Client,
    DynamicLoop,
    FixedChunk,
    FunctionStateMachine,
    GraphEdge,
    GraphNode,
    Loop,
    Parallel,
    Sequential,
    StopOnValue,
    StreamingGraphEdge,
    Walk,
    WalkGraph,
    WalkStart,
)

SM = FunctionStateMachine(lambda r: WalkStart("w"))


def graph(body, edges, inputs=("x",), outputs=()):
    return WalkGraph("m", [Walk("w", body, edges, inputs, outputs)], SM)


def node(name, inputs=("a",), outputs=("b",), **kw):
    return GraphNode(name, inputs, outputs, **kw)


def test_a_valid_minimal_graph_builds():
    g = graph(node("n"), [GraphEdge("input.x", "n.a"), GraphEdge("n.b", Client("text"))])
    assert g.node_names() == ["n"]


@pytest.mark.parametrize(
    ("body", "edges", "match"),
    [
        (node("n"), [GraphEdge("input.x", "m.a"), GraphEdge("n.b", DROP)], "unknown node 'm'"),
        (node("n"), [GraphEdge("input.x", "n.zz"), GraphEdge("n.b", DROP)], "node 'n' has no input 'zz'"),
        (node("n"), [GraphEdge("input.x", "n.a"), GraphEdge("n.q", DROP)], "node 'n' has no output 'q'"),
        (node("n"), [GraphEdge("input.y", "n.a"), GraphEdge("n.b", DROP)], "unknown walk input 'y'"),
        (node("n"), [GraphEdge("input.x", "n.a")], "output n.b goes nowhere"),
        (node("n", inputs=("a", "c")), [GraphEdge("input.x", "n.a"), GraphEdge("n.b", DROP)], "input n.c is filled by nothing"),
        (node("n"), [GraphEdge("input.x", "n.a"), GraphEdge("input.x", "n.a"), GraphEdge("n.b", DROP)], "input n.a is filled twice"),
        (node("n"), [GraphEdge("input.x", "n.a"), GraphEdge("n.b", "nonsense")], "not of the form 'node.slot'"),
        (Sequential(node("n"), node("n")), [GraphEdge("input.x", "n.a"), GraphEdge("n.b", DROP)], "node 'n' appears twice"),
    ],
)
def test_edge_and_node_errors(body, edges, match):
    with pytest.raises(GraphError, match=match):
        graph(body, edges)


def test_unused_walk_input_and_unfilled_output():
    edges = [GraphEdge("input.x", "n.a"), GraphEdge("n.b", DROP)]
    with pytest.raises(GraphError, match="walk input 'z' is never used"):
        graph(node("n"), edges, inputs=("x", "z"))
    with pytest.raises(GraphError, match="walk output 'o' is filled 0 times"):
        graph(node("n"), edges, outputs=("o",))


def test_cycle_outside_a_loop():
    body = Parallel(node("p", ("a", "c")), node("q"))
    edges = [GraphEdge("input.x", "p.a"), GraphEdge("p.b", "q.a"), GraphEdge("q.b", "p.c")]
    with pytest.raises(GraphError, match=r"cycle outside a loop in the walk's top level: .*p.*q"):
        graph(body, edges)


def test_backwards_edge_in_sequential():
    body = Sequential(node("p"), node("q", ("a", "c")))
    edges = [GraphEdge("input.x", "p.a"), GraphEdge("input.x", "q.c"), GraphEdge("q.b", "p.a")]
    with pytest.raises(GraphError):
        graph(body, edges)
    body = Sequential(node("p", ("a", "c")), node("q"))
    edges = [GraphEdge("input.x", "p.a"), GraphEdge("p.b", "q.a"), GraphEdge("q.b", "p.c")]
    with pytest.raises(GraphError, match="goes backwards in a Sequential|cycle outside a loop"):
        graph(body, edges)


def loop_graph(carry, edges_extra=(), outputs=None, body=None, **loop_kw):
    body = body or node("n", ("a",), ("b",))
    loop = Loop(body, iterations=3, carry=carry, outputs=outputs, name="L", **loop_kw)
    return graph(loop, [GraphEdge("input.x", "n.a"), *edges_extra] if not edges_extra else list(edges_extra))


def test_carry_mismatches():
    with pytest.raises(GraphError, match="carry n.zz .* is not an output"):
        loop_graph({"n.zz": "n.a"}, [GraphEdge("input.x", "n.a"), GraphEdge("n.b", DROP)])
    with pytest.raises(GraphError, match="carry n.b .*node 'n' has no input 'q'"):
        loop_graph({"n.b": "n.q"}, [GraphEdge("input.x", "n.a"), GraphEdge("n.b", DROP)])
    with pytest.raises(GraphError, match="has no initial value"):
        graph(
            Loop(node("n", ("a", "s")), 3, carry={"n.b": "n.s"}, name="L"),
            [GraphEdge("input.x", "n.a"), GraphEdge("n.b", DROP)],
        )
    outer = Sequential(node("m"), Loop(node("n"), 3, carry={"m.b": "n.a"}, name="L"))
    with pytest.raises(GraphError, match="'m' is not directly in the loop's body"):
        graph(outer, [GraphEdge("input.x", "m.a"), GraphEdge("m.b", "n.a"), GraphEdge("n.b", DROP)])


def test_output_leaving_a_loop_needs_a_declared_mode():
    body = Sequential(Loop(node("n"), 3, name="L"), node("after"))
    edges = [GraphEdge("input.x", "n.a"), GraphEdge("n.b", "after.a"), GraphEdge("after.b", DROP)]
    with pytest.raises(GraphError, match="output n.b leaves loop 'L', which does not declare it"):
        graph(body, edges)
    ok = Sequential(Loop(node("n"), 3, outputs={"n.b": LAST}, name="L"), node("after"))
    graph(ok, edges)
    with pytest.raises(GraphError, match="mode 'sum'"):
        Loop(node("n"), 3, outputs={"n.b": "sum"})


def test_streaming_edge_errors():
    def body():
        return Parallel(Loop(node("p"), 4, name="L"), node("c"))

    base = [GraphEdge("input.x", "p.a"), GraphEdge("c.b", DROP)]
    with pytest.raises(GraphError, match="has no chunk policy"):
        graph(body(), [*base, StreamingGraphEdge("p.b", "c.a")])
    with pytest.raises(GraphError, match="producer 'c' is not inside a loop"):
        graph(
            Parallel(Loop(node("p"), 4, name="L"), node("c"), node("d")),
            [*base, GraphEdge("p.b", DROP), GraphEdge("input.x", "c.a"), StreamingGraphEdge("c.b", "d.a", FixedChunk(2)), GraphEdge("d.b", DROP)],
        )
    with pytest.raises(GraphError, match="capacity 3 is below"):
        graph(body(), [*base, StreamingGraphEdge("p.b", "c.a", FixedChunk(4), capacity=3)])
    graph(body(), [*base, StreamingGraphEdge("p.b", "c.a", FixedChunk(4))])
    in_static_loop = Parallel(Loop(node("p"), 4, name="L"), Loop(node("c"), 4, name="M"))
    with pytest.raises(GraphError, match="consumer 'c' sits in loop 'M', so it must be that DynamicLoop's stop node"):
        graph(in_static_loop, [*base, StreamingGraphEdge("p.b", "c.a", FixedChunk(1))])


def test_dynamic_loop_stop_rule_must_read_a_body_output():
    with pytest.raises(GraphError, match="stop rule of loop 'D' reads 'n.zz'"):
        graph(
            DynamicLoop(node("n"), StopOnValue("n.zz", (0,)), 5, name="D"),
            [GraphEdge("input.x", "n.a"), GraphEdge("n.b", DROP)],
        )


def test_duplicate_names():
    edges = [GraphEdge("input.x", "n.a"), GraphEdge("n.b", DROP)]
    w = Walk("w", node("n"), edges, ["x"])
    with pytest.raises(GraphError, match="duplicate walk name 'w'"):
        WalkGraph("m", [w, w], SM)
    with pytest.raises(GraphError, match="duplicate input name"):
        GraphNode("n", ["a", "a"], ["b"])
    with pytest.raises(GraphError, match="duplicate loop name 'L'"):
        graph(
            Sequential(Loop(node("n"), 2, name="L", outputs={"n.b": LAST}), Loop(node("m"), 2, name="L")),
            [GraphEdge("input.x", "n.a"), GraphEdge("n.b", "m.a"), GraphEdge("m.b", DROP)],
        )
    with pytest.raises(GraphError, match="reserved"):
        GraphNode("input", ["a"], ["b"])


def test_node_means_one_component_across_walks():
    w1 = Walk("w1", GraphNode("n", ["a"], ["b"], component="x"), [GraphEdge("input.x", "n.a"), GraphEdge("n.b", DROP)], ["x"])
    w2 = Walk("w2", GraphNode("n", ["a"], ["b"], component="y"), [GraphEdge("input.x", "n.a"), GraphEdge("n.b", DROP)], ["x"])
    with pytest.raises(GraphError, match="node 'n' runs component 'x' in walk 'w1' but 'y' in walk 'w2'"):
        WalkGraph("m", [w1, w2], SM)


def test_state_machine_choice_is_checked():
    g = graph(node("n"), [GraphEdge("input.x", "n.a"), GraphEdge("n.b", DROP)])
    with pytest.raises(GraphError, match="no walk 'zz'"):
        g.check_start(WalkStart("zz"))
    with pytest.raises(GraphError, match="missing \\['x'\\]"):
        g.check_start(WalkStart("w", {}))
