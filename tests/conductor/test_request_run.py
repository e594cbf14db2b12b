"""RequestRun: the conductor's bookkeeping of one request's walks, on the fixture LM's graph."""

from __future__ import annotations

import pytest

from walkserve.conductor.request_run import RequestRun, safe_advance
from walkserve.core.array import ArrayData
from walkserve.core.errors import GraphError
from walkserve.core.finish import FinishReason
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.graph import FunctionStateMachine, WalkGraph
from walkserve.models.orpheus.graph import build_graph as orpheus_graph
from walkserve.protocol.arrays import plain_value, wire_value
from walkserve.testing.fixtures.base import FixtureParams
from walkserve.testing.fixtures.lm import build_graph

GRAPH = build_graph()


def run_of(prompt: list[int], rank: int = 0, **params) -> RequestRun:
    spec = RequestSpec({"prompt_ids": ArrayData.from_list(prompt)}, sampling=SamplingParams(max_tokens=5),
                       params=FixtureParams(**params),
                       id="r1")
    return RequestRun(spec, GRAPH, lambda plan, node, sticky: rank)


def test_begin_sends_the_first_walk_with_the_inputs_its_ranks_read():
    run = run_of([5, 6, 7], rank=1, eos_at=3)
    [(rank, start)] = run.begin()
    assert rank == 1 and (start.request_id, start.walk, start.ranks) == ("r1", "prefill", {"lm": 1})
    assert plain_value(start.inputs["prompt"]).tolist() == [5, 6]
    assert run.walk == "prefill" and run.pending == {"lm"} and run.involved_ranks() == {1}
    # the model's typed params travel as they are, the sampling beside them (not merged into them)
    assert start.params == FixtureParams(eos_at=3) and start.sampling == SamplingParams(max_tokens=5)


def test_a_walk_completes_when_every_node_reported_and_every_output_arrived():
    run = run_of([5, 6, 7])
    run.begin()
    assert not run.node_done("prefill", ["lm"], firings=1, hit_bound=False)  # output "state" still missing
    assert run.walk_output("prefill", "state", wire_value(ArrayData.from_list([42])))
    [(_, start)] = run.advance()
    assert start.walk == "decode" and plain_value(start.inputs["last"]).tolist() == [7]
    assert plain_value(start.inputs["state"]).tolist() == [42]
    assert not run.node_done("prefill", ["lm"], 1, False)  # a late report of an earlier walk changes nothing
    assert run.firings == 1 and run.walks_run == ["prefill", "decode"]


@pytest.mark.parametrize("hit_bound, reason", [(False, FinishReason.STOP), (True, FinishReason.LENGTH)])
def test_the_last_walk_finishes_with_stop_or_length(hit_bound, reason):
    run = run_of([9])  # one token: straight to decode
    [(_, start)] = run.begin()
    assert start.walk == "decode"
    assert run.node_done("decode", ["lm"], firings=5, hit_bound=hit_bound)
    assert run.advance() == [] and run.finished == reason


def test_a_walk_whole_on_one_rank_carries_the_request_so_that_rank_may_go_on_by_itself():
    run = run_of([5, 6, 7], rank=1)
    [(_, start)] = run.begin()
    assert start.spec is run.spec and start.sticky == {}
    assert run.walk_started("prefill", 1, "decode", {"lm": 1})  # the rank started decode itself
    assert run.walk == "decode" and run.pending == {"lm"} and run.walks_run == ["prefill", "decode"]
    assert not run.walk_started("prefill", 1, "decode", {"lm": 1})  # a stale report changes nothing
    assert run.node_done("decode", ["lm"], 4, False) and run.advance() == [] and run.firings == 5
    alone = RequestRun(run.spec, GRAPH, lambda plan, node, sticky: 1, local_walks=False)
    assert alone.begin()[0][1].spec is None


def test_outputs_are_numbered_per_modality_and_output():
    run = run_of([9])
    assert [run.next_index(("text", "token")) for _ in range(3)] == [0, 1, 2]
    assert run.next_index(("text", "logprob")) == 0 and run.first_output_at is not None


def test_a_failing_state_machine_fails_the_request_not_the_conductor():
    def broken(req, finished=None, outputs=None):
        raise KeyError("prompt_ids")

    graph = WalkGraph("broken", list(GRAPH.walks.values()), FunctionStateMachine(broken, broken))
    run = RequestRun(RequestSpec({}, id="r2"), graph, lambda plan, node, sticky: 0)
    messages, error = safe_advance(run, run.begin)
    assert messages == [] and error.startswith("the model's state machine failed: KeyError")

    def bad_walk():
        raise GraphError("walk 'nope' is not in the graph")

    assert safe_advance(run, bad_walk) == ([], "walk 'nope' is not in the graph")


def test_a_walk_input_handed_on_as_a_walk_output_is_there_from_the_start():
    """``input.step -> output.step``: the state machine gets the value back when the walk ends (which
    occurrence of a repeated walk finished); the worker is not sent it, unless it may start the next walk
    itself (then it keeps the value as the walk's output)."""
    from walkserve.graph import DROP, GraphEdge, GraphNode, Walk, WalkStart

    node = GraphNode("lm", inputs=["tokens"], outputs=["token"])
    walk = Walk("piece", node, edges=[GraphEdge("input.tokens", "lm.tokens"), GraphEdge("lm.token", DROP),
                                      GraphEdge("input.step", "output.step")], inputs=["tokens", "step"], outputs=["step"])
    seen = []

    def next_walk(request, finished, outputs):
        seen.append(outputs["step"])
        return WalkStart("piece", {"tokens": ArrayData.from_list([1]), "step": outputs["step"] + 1}) if len(seen) < 3 else None

    graph = WalkGraph("pieces", [walk], FunctionStateMachine(
        lambda r: WalkStart("piece", {"tokens": ArrayData.from_list([1]), "step": 0}), next_walk))
    whole = RequestRun(RequestSpec({}, id="r4"), graph, lambda plan, node, sticky: 0)
    assert set(whole.begin()[0][1].inputs) == {"tokens", "step"}
    run = RequestRun(RequestSpec({}, id="r3"), graph, lambda plan, node, sticky: 0, local_walks=False)
    [(_, start)] = run.begin()
    assert set(start.inputs) == {"tokens"}
    for _ in range(3):
        assert run.node_done("piece", ["lm"], 1, False)  # complete: its one output was filled at the start
        run.advance()
    assert seen == [0, 1, 2] and run.finished == FinishReason.STOP


def test_a_request_for_audio_from_a_streamed_model_is_marked_streamed_from_its_first_walk():
    speech = RequestSpec({"prompt_token_ids": ArrayData.from_list([1, 2, 3])}, modalities=("audio",), id="s1")
    [(_, start)] = RequestRun(speech, orpheus_graph(), lambda plan, node, sticky: 0).begin()
    assert start.walk == "prefill" and start.stream is True
    [(_, text)] = run_of([5, 6, 7]).begin()  # the fixture LM declares no playback
    assert text.stream is False
