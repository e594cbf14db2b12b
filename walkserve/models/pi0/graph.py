"""The walks of pi0 and pi0.5 (torch-free): a prefix context written once, then a flow loop that only reads it.

    prefix:  input.images, input.image_shapes -> vision -> image_embeds ─┐
             input.tokens, input.embed_rows, input.content ──────────────┴> lm        append "prefix" (full mask,
                                                                                      content-keyed)
             pi0 only:  input.state, lm.hidden (order) -> state_embed -> state_token  expert appends its state
                                                                                      token to "prefix" (causal)
    act:     input.noise -> flow_start -> (x, embeds, time at t = 1)
             Loop "flow" x num_inference_steps:
                 expert(embeds, time) -> hidden     query "prefix" (full mask, every row out; writes nothing)
                 flow_step(hidden, x) -> x, embeds, time      x <- x - v / K, the tokens of the next step
                 carry flow_step.{x, embeds, time} -> flow_step.x, expert.{embeds, time}
             flow_step.x (last) -> actions -> client:action   sliced to the robot's dims, unnormalised

The state machine runs ``prefix`` then ``act``; the request's ``prefix``
context lives from the first walk to the end of the request. The flow loop
is flat, on one rank and streams nothing, so a worker runs every request's
loop as one cohort: each step is one expert call (and one flow-head call)
for all of them, requests at different flow times included (the time is a
per-token input; pi0.5's adaRMS condition is computed per distinct time).
Positions: the prefix takes 0..n-1 (only valid tokens are appended), pi0's
state token n, and the action tokens the running position after them.

The prefix append is content-keyed (``content``: each image row carries its
camera image's 128-bit digest, a prompt row its token id): a request whose cameras
and prompt (pi0.5: with the state bins) equal an earlier one's attaches that
request's prefix blocks from the KV engine's prefix cache, all but the last
rows; a full append shares only with one equal in every row, so any changed
pixel or token recomputes all of it. pi0's state token is not keyed: it is
computed for every request.
"""

from __future__ import annotations

from collections.abc import Mapping

from walkserve.core.request import RequestSpec, Value
from walkserve.graph import (
    LAST,
    Client,
    GraphEdge,
    GraphNode,
    Loop,
    Sequential,
    StateMachine,
    Walk,
    WalkGraph,
    WalkStart,
)
from walkserve.graph.kv import ALL, append, kv_params, query

CONTEXT = "prefix"
VISION, LM, EXPERT, FLOW_HEAD = "vision", "lm", "expert", "flow_head"  # components
STATE_EMBED, STATE_TOKEN, FLOW_START, FLOW_STEP, ACTIONS = "state_embed", "state_token", "flow_start", "flow_step", "actions"
PREFIX_WALK, ACT_WALK, FLOW_LOOP = "prefix", "act", "flow"
PREFIX_INPUTS = ("images", "image_shapes", "tokens", "embed_rows", "content")
NOISE = "noise"


def prefix_walk(pi0_state: bool) -> Walk:
    """Cameras and prompt into the ``prefix`` context; pi0 (``pi0_state``) then appends its state token."""
    vision = GraphNode(VISION, inputs=["images", "image_shapes"], outputs=["image_embeds"])
    lm = GraphNode(LM, inputs=["tokens", "embeds", "embed_rows", "content"], outputs=["hidden"] if pi0_state else [],
                   params=kv_params(append(CONTEXT, mask="full", content="content")))
    edges = [GraphEdge("input.images", "vision.images"), GraphEdge("input.image_shapes", "vision.image_shapes"),
             GraphEdge("vision.image_embeds", "lm.embeds"), GraphEdge("input.tokens", "lm.tokens"),
             GraphEdge("input.embed_rows", "lm.embed_rows"), GraphEdge("input.content", "lm.content")]
    if not pi0_state:
        return Walk(PREFIX_WALK, Sequential(vision, lm), edges=edges, inputs=list(PREFIX_INPUTS))
    state_embed = GraphNode(STATE_EMBED, inputs=["state", "after"], outputs=["embeds"], component=FLOW_HEAD, op="state")
    state_token = GraphNode(STATE_TOKEN, inputs=["embeds"], component=EXPERT, params=kv_params(append(CONTEXT)))
    edges += [GraphEdge("input.state", f"{STATE_EMBED}.state"), GraphEdge("lm.hidden", f"{STATE_EMBED}.after"),
              GraphEdge(f"{STATE_EMBED}.embeds", f"{STATE_TOKEN}.embeds")]
    return Walk(PREFIX_WALK, Sequential(vision, lm, state_embed, state_token), edges=edges,
                inputs=[*PREFIX_INPUTS, "state"])


def act_walk(num_steps: int) -> Walk:
    """Noise -> ``num_steps`` Euler steps of the expert over the prefix -> the robot's actions."""
    start = GraphNode(FLOW_START, inputs=[NOISE], outputs=["x", "embeds", "time"], component=FLOW_HEAD, op="start")
    expert = GraphNode(EXPERT, inputs=["embeds", "time"], outputs=["hidden"],
                       params=kv_params(query(CONTEXT, mask="full", rows=ALL, token_inputs=("time",))))
    step = GraphNode(FLOW_STEP, inputs=["hidden", "x"], outputs=["x", "embeds", "time"], component=FLOW_HEAD, op="step")
    loop = Loop(Sequential(expert, step), iterations=num_steps, name=FLOW_LOOP,
                carry={f"{FLOW_STEP}.x": f"{FLOW_STEP}.x", f"{FLOW_STEP}.embeds": f"{EXPERT}.embeds",
                       f"{FLOW_STEP}.time": f"{EXPERT}.time"},
                outputs={f"{FLOW_STEP}.x": LAST})
    actions = GraphNode(ACTIONS, inputs=["x"], outputs=["actions"], component=FLOW_HEAD, op="finish")
    edges = [GraphEdge(f"input.{NOISE}", f"{FLOW_START}.{NOISE}"),
             GraphEdge(f"{FLOW_START}.x", f"{FLOW_STEP}.x"), GraphEdge(f"{FLOW_START}.embeds", f"{EXPERT}.embeds"),
             GraphEdge(f"{FLOW_START}.time", f"{EXPERT}.time"), GraphEdge(f"{EXPERT}.hidden", f"{FLOW_STEP}.hidden"),
             GraphEdge(f"{FLOW_STEP}.x", f"{ACTIONS}.x"), GraphEdge(f"{ACTIONS}.actions", Client("action"))]
    return Walk(ACT_WALK, Sequential(start, loop, actions), edges=edges, inputs=[NOISE])


class PrefixThenAct(StateMachine):
    """``prefix`` with the request's cameras, prompt (and pi0's state), then ``act`` with its noise, then done."""

    def __init__(self, pi0_state: bool):
        self.inputs = (*PREFIX_INPUTS, "state") if pi0_state else PREFIX_INPUTS

    def first(self, request: RequestSpec) -> WalkStart:
        missing = [k for k in (*self.inputs, NOISE) if k not in request.inputs]
        if missing:
            raise ValueError(f"request {request.id}: inputs {missing} are missing (the pi0 processor builds them)")
        return WalkStart(PREFIX_WALK, {k: request.inputs[k] for k in self.inputs})

    def next(self, request: RequestSpec, finished: str, outputs: Mapping[str, Value]) -> WalkStart | None:
        if finished == PREFIX_WALK:
            return WalkStart(ACT_WALK, {NOISE: request.inputs[NOISE]})
        return None


def build_graph(kind: str, num_steps: int) -> WalkGraph:
    """``kind`` "pi0" (continuous state token) or "pi05" (the state in the prompt)."""
    pi0_state = kind == "pi0"
    return WalkGraph(kind, [prefix_walk(pi0_state), act_walk(num_steps)], PrefixThenAct(pi0_state))
