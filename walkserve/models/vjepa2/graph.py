"""The walks of V-JEPA 2 and V-JEPA 2-AC (torch-free): encode, predict, rollout and CEM planning.

Components: ``encoder`` (stateless; node op "video", "tokens" or "ac_frames"), ``masked_predictor`` (an
HF checkpoint's JEPA predictor, stateless), ``predictor`` (the AC predictor on the KV engine), ``stepper``
and ``planner`` (stateless bookkeeping: ``stepper.py``, ``planner.py``).
P = 2 + F tokens per step (F frame tokens: 256 for the released model).

    encode:   Loop "clips" (params.clips): encoder[video](video, clip = iteration) -> features -> client:latent

    predict:  clip_encoder[tokens](video) -> features [N, E] (float32, the whole clip)
              masked_predictor(features, context_ids, target_ids) -> predicted [Nt, E] -> client:latent

    rollout:  frame_encoder[ac_frames](frames) -> start(features, actions, states)
              DynamicLoop "rollout" (stop at params.horizon):
                  predictor(embeds, positions, token_kind)      append "main": iteration 0 the C context
                      -> logits (the last F rows)               steps (block-causal by step), then P rows a step
                  step(logits, pose, actions, states) -> frame -> client:latent
                      carry: the next step's embeds, positions, token_kind -> predictor; pose -> step

    plan_history (C >= 2 context frames, before plan): frame_encoder(frames[:C-1]) -> start
                  -> history: append the C-1 steps that no candidate changes to context "prefix"
    plan (plan_features also streams the best candidate's predicted frames):
              frame_encoder(frames[C-1]), goal_encoder(goal), cem_start(states) -> dist, rng
              Loop "cem" (params.iterations): carry refit.dist -> sample.dist, sample.rng -> sample.rng
                  sample(dist, rng, features, states) -> candidates [K, H, 7], the first fanned chunk
                  Loop "horizon" (params.horizon):
                      candidates(embeds, positions, token_kind, k, reset)
                          fork "prefix" into cand[0..K-1] (K = reset: only at step 0), then append one step
                          to every cand[k] in one batch -> logits [K*F, E]
                      roll(logits, candidates, poses, goal) -> frames, costs; the next fanned chunk (carry)
                  refit(costs, candidates, dist) -> dist; cost (best, top-k mean) -> client:latent,
                      first_action -> client:action (, features -> client:latent)

The state machine picks the walk from the request's task (``encode``, ``predict``, ``rollout``, ``plan``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from walkserve.core.array import ArrayData
from walkserve.core.params import RequestParams
from walkserve.core.request import RequestSpec, Value
from walkserve.graph import (
    ACCUMULATE,
    DROP,
    LAST,
    Client,
    DynamicLoop,
    GraphEdge,
    GraphNode,
    Loop,
    Parallel,
    Sequential,
    StateMachine,
    StopWhen,
    Walk,
    WalkGraph,
    WalkStart,
)
from walkserve.graph.kv import Rows, append, fork, kv_params

ENCODE, ROLLOUT, PLAN, PLAN_FEATURES, PLAN_HISTORY = "encode", "rollout", "plan", "plan_features", "plan_history"
PREDICT = "predict"
TASKS = (ENCODE, PREDICT, ROLLOUT, PLAN)
PREDICT_INPUTS = ("video", "context_ids", "target_ids")
CHUNK = ("embeds", "positions", "token_kind")
FAN = ("k", "reset")


def encode_walk() -> Walk:
    node = GraphNode("encoder", ["video"], ["features"], op="video")
    loop = Loop(node, iterations="clips", name="clips")
    return Walk(ENCODE, loop, edges=[GraphEdge("input.video", "encoder.video"),
                                     GraphEdge("encoder.features", Client("latent"))], inputs=["video"])


def predict_walk() -> Walk:
    """The masked predictor over one clip: the encoder's tokens at context_ids -> features at target_ids."""
    encoder = GraphNode("clip_encoder", ["video"], ["features"], component="encoder", op="tokens")
    predictor = GraphNode("masked_predictor", ["features", "context_ids", "target_ids"], ["predicted"])
    edges = [GraphEdge("input.video", "clip_encoder.video"), GraphEdge("clip_encoder.features", "masked_predictor.features"),
             GraphEdge("input.context_ids", "masked_predictor.context_ids"),
             GraphEdge("input.target_ids", "masked_predictor.target_ids"),
             GraphEdge("masked_predictor.predicted", Client("latent"))]
    return Walk(PREDICT, Sequential(encoder, predictor), edges=edges, inputs=list(PREDICT_INPUTS))


def _frame_encoder() -> GraphNode:
    return GraphNode("frame_encoder", ["video"], ["features"], component="encoder", op="ac_frames")


def _start() -> GraphNode:
    return GraphNode("start", ["features", "actions", "states"], [*CHUNK, "pose"], component="stepper", op="start")


def _step_kv(frame_tokens: int) -> dict[str, Any]:
    """The rollout predictor's operation: one append to "main", block-causal by step, the last frame out."""
    return kv_params(append("main", mask="block_causal", frame=frame_tokens + 2, rows=Rows.tail(frame_tokens),
                            token_inputs=("token_kind",)))


def horizon_reached(value: Any, params: RequestParams, iteration: int) -> bool:
    return iteration + 1 >= params.model.horizon  # VJEPA2Run


def rollout_walk(frame_tokens: int) -> Walk:
    predictor = GraphNode("predictor", list(CHUNK), ["logits"], params=_step_kv(frame_tokens))
    step = GraphNode("step", ["logits", "pose", "actions", "states"], ["frame", *CHUNK, "pose"], component="stepper",
                     op="step")
    loop = DynamicLoop(
        Sequential(predictor, step),
        stop=StopWhen("step.frame", horizon_reached, include_stopping=True, label="horizon"),
        max_iterations="horizon",
        carry={**{f"step.{n}": f"predictor.{n}" for n in CHUNK}, "step.pose": "step.pose"},
        name="rollout",
    )
    edges = [GraphEdge("input.frames", "frame_encoder.video"), GraphEdge("frame_encoder.features", "start.features")]
    edges += [GraphEdge(f"input.{n}", f"{node}.{n}") for n in ("actions", "states") for node in ("start", "step")]
    edges += [GraphEdge(f"start.{n}", f"predictor.{n}") for n in CHUNK]
    edges += [GraphEdge("start.pose", "step.pose"), GraphEdge("predictor.logits", "step.logits"),
              GraphEdge("step.frame", Client("latent"))]
    return Walk(ROLLOUT, Sequential(_frame_encoder(), _start(), loop), edges=edges,
                inputs=["frames", "actions", "states"])


def history_walk(frame_tokens: int) -> Walk:
    """The steps before the last context frame, appended once to "prefix" (every candidate forks it)."""
    history = GraphNode("history", list(CHUNK), [], component="predictor", params=kv_params(
        append("prefix", mask="block_causal", frame=frame_tokens + 2, token_inputs=("token_kind",))))
    edges = [GraphEdge("input.frames", "frame_encoder.video"), GraphEdge("frame_encoder.features", "start.features"),
             GraphEdge("input.actions", "start.actions"), GraphEdge("input.states", "start.states"),
             GraphEdge("start.pose", DROP)]
    edges += [GraphEdge(f"start.{n}", f"history.{n}") for n in CHUNK]
    return Walk(PLAN_HISTORY, Sequential(_frame_encoder(), _start(), history), edges=edges,
                inputs=["frames", "actions", "states"])


def _horizon_loop(frame_tokens: int) -> Loop:
    candidates = GraphNode("candidates", [*CHUNK, *FAN], ["logits"], component="predictor", params=kv_params(
        fork("prefix", into="cand", fan="reset"),
        append("cand", fan="k", mask="full", rows=Rows.tail(frame_tokens), token_inputs=("token_kind",))))
    roll = GraphNode("roll", ["logits", "candidates", "poses", "goal"], ["frames", "costs", *CHUNK, *FAN, "poses"],
                     component="planner", op="roll")
    return Loop(Sequential(candidates, roll), iterations="horizon", name="horizon",
                carry={**{f"roll.{n}": f"candidates.{n}" for n in (*CHUNK, *FAN)}, "roll.poses": "roll.poses"},
                outputs={"roll.costs": LAST, "roll.frames": ACCUMULATE})


def plan_walk(frame_tokens: int, features: bool = False) -> Walk:
    """CEM: each iteration samples K candidates, rolls them out as K fanned contexts, refits to the top-k."""
    sample = GraphNode("sample", ["dist", "rng", "features", "states"],
                       ["candidates", *CHUNK, *FAN, "poses", "rng", "dist"], component="planner", op="sample")
    refit = GraphNode("refit", ["costs", "candidates", "dist", *(["frames"] if features else [])],
                      ["dist", "cost", "first_action", *(["features"] if features else [])], component="planner",
                      op="refit")
    cem = Loop(Sequential(sample, _horizon_loop(frame_tokens), refit), iterations="iterations", name="cem",
               carry={"refit.dist": "sample.dist", "sample.rng": "sample.rng"})
    cem_start = GraphNode("cem_start", ["states"], ["dist", "rng"], component="planner", op="start")
    goal = GraphNode("goal_encoder", ["video"], ["features"], component="encoder", op="ac_frames")
    edges = [GraphEdge("input.frames", "frame_encoder.video"), GraphEdge("input.goal", "goal_encoder.video"),
             GraphEdge("input.states", "cem_start.states"), GraphEdge("input.states", "sample.states"),
             GraphEdge("frame_encoder.features", "sample.features"), GraphEdge("goal_encoder.features", "roll.goal"),
             GraphEdge("cem_start.dist", "sample.dist"), GraphEdge("cem_start.rng", "sample.rng"),
             GraphEdge("sample.dist", "refit.dist"), GraphEdge("sample.candidates", "roll.candidates"),
             GraphEdge("sample.candidates", "refit.candidates"), GraphEdge("sample.poses", "roll.poses"),
             GraphEdge("candidates.logits", "roll.logits"), GraphEdge("roll.costs", "refit.costs"),
             GraphEdge("refit.cost", Client("latent")), GraphEdge("refit.first_action", Client("action"))]
    edges += [GraphEdge(f"sample.{n}", f"candidates.{n}") for n in (*CHUNK, *FAN)]
    if features:
        edges += [GraphEdge("roll.frames", "refit.frames"), GraphEdge("refit.features", Client("latent"))]
    else:
        edges.append(GraphEdge("roll.frames", DROP))
    body = Sequential(Parallel(_frame_encoder(), goal, cem_start), cem)
    return Walk(PLAN_FEATURES if features else PLAN, body, edges=edges, inputs=["frames", "goal", "states"])


def rows_of(value: Value, start: int, stop: int | None = None) -> ArrayData:
    """Rows ``[start, stop)`` (dim 0) of an array, without touching anything but its bytes."""
    assert isinstance(value, ArrayData), f"expected an array, got {type(value).__name__}"
    n = value.shape[0]
    stop = n if stop is None else stop
    row = len(value.data) // n if n else 0
    return ArrayData(value.dtype, (stop - start, *value.shape[1:]), value.data[start * row : stop * row])


class TaskStateMachine(StateMachine):
    """encode | predict | rollout | plan (plan_history first when the plan starts from C >= 2 frames)."""

    def first(self, request: RequestSpec) -> WalkStart:
        x, task = request.inputs, request.task
        if task == ENCODE:
            return WalkStart(ENCODE, {"video": x["video"]})
        if task == PREDICT:
            return WalkStart(PREDICT, {n: x[n] for n in PREDICT_INPUTS})
        if task == ROLLOUT:
            return WalkStart(ROLLOUT, {n: x[n] for n in ("frames", "actions", "states")})
        if task != PLAN:
            raise ValueError(f"request {request.id}: V-JEPA 2 has tasks {', '.join(TASKS)}, not {task!r}")
        c = request.params.context_frames  # VJEPA2Run
        if c == 1:
            return self._plan(request)
        return WalkStart(PLAN_HISTORY, {"frames": rows_of(x["frames"], 0, c - 1), "actions": rows_of(x["actions"], 0, c - 1),
                                        "states": rows_of(x["states"], 0, c - 1)})

    def next(self, request: RequestSpec, finished: str, outputs: Mapping[str, Value]) -> WalkStart | None:
        return self._plan(request) if finished == PLAN_HISTORY else None

    @staticmethod
    def _plan(request: RequestSpec) -> WalkStart:
        params = request.params
        x, c = request.inputs, params.context_frames  # VJEPA2Run
        walk = PLAN_FEATURES if params.return_features else PLAN
        return WalkStart(walk, {"frames": rows_of(x["frames"], c - 1), "goal": x["goal"], "states": x["states"]})


def build_graph(frame_tokens: int | None, name: str = "vjepa2", predict: bool = False) -> WalkGraph:
    """The walks a checkpoint serves: encode always; predict with a masked predictor (an HF checkpoint's);
    rollout and plan with an AC predictor (``frame_tokens`` F)."""
    walks = [encode_walk(), *([predict_walk()] if predict else [])]
    if frame_tokens is not None:
        walks += [rollout_walk(frame_tokens), history_walk(frame_tokens), plan_walk(frame_tokens),
                  plan_walk(frame_tokens, features=True)]
    return WalkGraph(name, walks, TaskStateMachine())
