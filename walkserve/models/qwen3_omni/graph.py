"""The walks of the Qwen3-Omni thinker (torch-free): the user turn split at its media, one walk per piece, then decode.

    prefill_text:    input.tokens, input.positions [3, n] -> thinker                  (appends to "main")
                     (every prefill walk also gives the thinker input.content [n, 2], the rows' content keys:
                     the prefix cache keys a block on its rows' tokens, content and positions)
    prefill_audio:   input.mel -> audio_encoder -> audio_embeds [m, D] ─> thinker.embeds
                     input.tokens (text rows and the clip's <|audio_pad|> rows), input.positions,
                     input.embed_rows (the pad rows) -> thinker
    prefill_vision:  input.pixel_values, input.grid_thw, input.visual_rows (bool [n]) -> vision_encoder
                       image_embeds [m, D] ─> thinker.embeds;  deepstack [n, 3, D] (zero off the pad rows)
                       ─> thinker.deepstack (a token input)
                     input.tokens (text rows and the image's or video's pad rows), input.positions,
                     input.embed_rows -> thinker
    prefill_media:   (a text answer's prompt of one clip and one image or video; always walked as
                     prefill_media_first, below) both encoders, then
                     one thinker pass: audio_embeds ─> thinker.embeds at input.embed_rows; the vision
                     encoder's visual_embeds [n, D] and deepstack [n, 3, D] (zero off input.visual_rows)
                     ─> thinker token inputs, with input.visual_rows
    <piece>_first:   (the last piece of a text answer's prompt, its last token included) the same walk, its
                     thinker node in DynamicLoop "first_token" [ thinker -> token ]  at most 1 iteration:
                     token 0 sampled from the prompt's last row (the request's sampling, seeded draw 0)
                       -> client:text, and output.first (accumulated: [token 0], or [] when it is a stop token
                       and min_tokens is 0; never streamed then)
    <piece>_first_logprobs: the same, and token 0's logprob and top-k -> client:logprobs
    thinker_decode:  input.first ─> DynamicLoop[ thinker(tokens) -> token ]   carry thinker.token -> thinker.tokens
                       positions: the context's running position (max + 1 on all three axes, + i)
                       iteration i samples token i + 1; stop: stop_token_ids (<|im_end|> ...) once min_tokens
                       were generated, never streamed; at most max_tokens - 1
                     thinker.token -> client:text
    thinker_decode_logprobs: the same, and each token's logprob and top-k -> client:logprobs

Every prefill walk hands its input ``step`` on as its output ``step``, so the
state machine knows which piece of the prompt finished. The prompt is cut at
its media (``prompt_pieces.py``): for a text answer one media walk per item, in
prompt order, each also appending the text before it (the last one the text
after it too), so the prompt costs one thinker pass per item, and a prompt of
one clip and one image or video is one ``prefill_media`` walk; for a spoken
answer a media walk appends exactly the placeholder rows of one item and text
walks the text between them (walks repeat: text, media, text, ..., text). A
text answer's last piece runs as its ``_first`` walk: it appends the prompt's
last token too and samples token 0 there, as transformers samples it from the
prefill's last row (no one-token thinker step, which reads every MoE expert
again, before the first token); ``thinker_decode`` starts from token 0, and
does not run when token 0 stopped the request or max_tokens is 1 (finish
reason "length": the first-token loop hit its bound). A spoken answer leaves
the last prompt token to ``thinker_first`` (``speech_graph.py``). The processor
(``processor.py``) precomputes each piece's inputs under ``step<k>.<slot>``
and lists the walks in ``RequestSpec.inputs["walks"]``.

Speech out (the talker) reads, per thinker position, the input embedding and
the input of layer ``accept_hidden_layer``: ``build_graph(taps=thinker_taps(24),
tap_edge=...)`` adds them to every thinker node as captured outputs (``embed`` =
the input of layer 0, ``accept_hidden``), at every row of the prefill pieces and
at each decode step's row; ``tap_edge(endpoint)`` says where each goes (a
streaming edge to the talker). Text-only requests use the graph without taps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from walkserve.core.array import ArrayData
from walkserve.core.params import RequestParams
from walkserve.core.request import RequestSpec, Value
from walkserve.graph import (
    ACCUMULATE,
    Client,
    DynamicLoop,
    GraphEdge,
    GraphNode,
    Sequential,
    StateMachine,
    StopWhen,
    Walk,
    WalkGraph,
    WalkStart,
)
from walkserve.graph.kv import ALL, LAST, append, kv_params
from walkserve.graph.stop import scalar
from walkserve.models.common.text_walk import LOGPROB_OUTPUTS, StopTokens

THINKER, AUDIO_ENCODER, VISION_ENCODER = "thinker", "audio_encoder", "vision_encoder"
CONTEXT = "main"
PREFILL_TEXT, PREFILL_AUDIO, PREFILL_VISION = "prefill_text", "prefill_audio", "prefill_vision"
PREFILL_MEDIA = "prefill_media"  # a text answer's prompt of one clip and one image or video: one thinker pass
DECODE, DECODE_LOGPROBS = "thinker_decode", "thinker_decode_logprobs"
LOOP = "thinker_loop"
FIRST_LOOP = "first_token"  # the last prefill piece's one-iteration loop: sample, stop on a stop token
FIRST = "first"  # the last piece's output (the first generated token; none when it was a stop token), decode's input
# the encoders' slots (audio_encoder.py / vision_encoder.py import torch; this module must not)
MEL, AUDIO_EMBEDS = "mel", "audio_embeds"
PIXELS, GRID, IMAGE_EMBEDS, DEEPSTACK = "pixel_values", "grid_thw", "image_embeds", "deepstack"
VISUAL_ROWS = "visual_rows"  # bool [n]: the rows of a vision piece the item's tokens fill (its deepstack rows)
EMBED_ROWS = "embed_rows"  # int64 [m]: the rows of a media piece whose embeddings the encoder's m tokens replace
VISUAL_EMBEDS = "visual_embeds"  # [n, D]: the vision tokens at visual_rows, zero elsewhere (prefill_media)
STEP = "step"  # every prefill walk: input.step -> output.step
CONTENT = "content"  # int64 [n, 2]: each row's content key ((0, 0): text; a media item's 128-bit digest: content_keys.py)
WALKS_INPUT, LAST_INPUT = "walks", "last"  # RequestSpec.inputs keys: the prefill walks in order; the last prompt
# token (spoken answers only: their prefill leaves it to ``thinker_first``)
EMBED_TAP, ACCEPT_TAP = "embed", "accept_hidden"
# what each prefill walk takes besides ``step``, in RequestSpec.inputs under step_key(k, slot)
WALK_INPUTS: dict[str, tuple[str, ...]] = {
    PREFILL_TEXT: ("tokens", "positions", CONTENT),
    PREFILL_AUDIO: ("tokens", "positions", CONTENT, EMBED_ROWS, MEL),
    PREFILL_VISION: ("tokens", "positions", CONTENT, EMBED_ROWS, PIXELS, GRID, VISUAL_ROWS),
    PREFILL_MEDIA: ("tokens", "positions", CONTENT, EMBED_ROWS, MEL, PIXELS, GRID, VISUAL_ROWS),
}
TapEdge = Callable[[str], GraphEdge]


def step_key(k: int, slot: str) -> str:
    """The RequestSpec.inputs key of prefill piece ``k``'s input ``slot``."""
    return f"step{k}.{slot}"


def thinker_taps(accept_hidden_layer: int) -> dict[str, int]:
    """What the talker reads from the thinker: the input embedding (layer 0's input) and layer k's input."""
    return {EMBED_TAP: 0, ACCEPT_TAP: accept_hidden_layer}


def first_walk(piece: str, logprobs: bool = False) -> str:
    """The name of prefill walk ``piece`` as the last piece of a text answer's prompt (it samples token 0)."""
    return f"{piece}_first_logprobs" if logprobs else f"{piece}_first"


def _thinker(inputs: list[str], taps: Mapping[str, int] | None, sampled: tuple[str, ...] = ()) -> GraphNode:
    taps = taps or {}
    token_inputs = tuple(name for name in (DEEPSTACK, VISUAL_EMBEDS, VISUAL_ROWS) if name in inputs)
    op = append(CONTEXT, rows=ALL if taps else LAST, capture=dict(taps), token_inputs=token_inputs, content=CONTENT,
                lazy=True)
    return GraphNode(THINKER, inputs=[*inputs, CONTENT], outputs=[*sampled, *taps], params=kv_params(op))


class AfterFirst:
    """The decode loop's bound once token 0 came from the prefill: max_tokens - 1."""

    def __call__(self, params: RequestParams) -> int:
        return params.sampling.max_tokens - 1  # the processor fills max_tokens

    def __repr__(self) -> str:
        return "max_tokens - 1"


class ThinkerStop:
    """Stop rule of a thinker loop that starts after token 0: iteration k samples token k + 1."""

    def __call__(self, value: Any, params: RequestParams, iteration: int) -> bool:
        return scalar(value) in params.sampling.stop_token_ids and iteration + 1 >= params.sampling.min_tokens


def _tap_edges(taps: Mapping[str, int] | None, tap_edge: TapEdge | None) -> list[GraphEdge]:
    taps = taps or {}
    if taps and tap_edge is None:
        raise ValueError("thinker taps need tap_edge: where each captured output goes")
    return [tap_edge(f"{THINKER}.{name}") for name in taps]


def _prefill(name: str, encoders: list[GraphNode], thinker_inputs: list[str], media: list[GraphEdge],
             taps: Mapping[str, int] | None, tap_edge: TapEdge | None, first: bool | None = None) -> Walk:
    """Prefill piece ``name``; ``first`` False / True: the last piece of a text answer, which also samples
    token 0 (with its logprobs when True) in a one-iteration loop (``first_token_loop``)."""
    slots = WALK_INPUTS[name]
    edges = [GraphEdge(f"input.{slot}", f"{THINKER}.{slot}") for slot in ("tokens", "positions", CONTENT, EMBED_ROWS)
             if slot in slots]
    edges = [*edges, *media, GraphEdge(f"input.{STEP}", f"output.{STEP}"), *_tap_edges(taps, tap_edge)]
    if first is None:
        body = Sequential(*encoders, _thinker(thinker_inputs, taps)) if encoders else _thinker(thinker_inputs, taps)
        return Walk(name, body, edges=edges, inputs=[*slots, STEP], outputs=[STEP])
    extra = LOGPROB_OUTPUTS if first else ()
    loop = first_token_loop(_thinker(thinker_inputs, taps, ("token", *extra)))
    edges += [GraphEdge(f"{THINKER}.token", Client("text")), GraphEdge(f"{THINKER}.token", f"output.{FIRST}")]
    edges += [GraphEdge(f"{THINKER}.{out}", Client("logprobs")) for out in extra]
    return Walk(first_walk(name, first), Sequential(*encoders, loop) if encoders else loop, edges=edges,
                inputs=[*slots, STEP], outputs=[STEP, FIRST])


def first_token_loop(node: GraphNode) -> DynamicLoop:
    """One iteration: the node samples token 0 from the prompt's last row; a stop token (from min_tokens = 0)
    ends it unexposed (not streamed, ``first`` empty), otherwise the bound is hit (max_tokens 1: "length")."""
    stop = StopWhen(f"{THINKER}.token", StopTokens(), include_stopping=False, label="stop_token_ids after min_tokens")
    return DynamicLoop(node, stop=stop, max_iterations=1, outputs={f"{THINKER}.token": ACCUMULATE}, name=FIRST_LOOP)


def prefill_text_walk(taps: Mapping[str, int] | None = None, tap_edge: TapEdge | None = None,
                      first: bool | None = None) -> Walk:
    """A run of text tokens (markers included) into the thinker's context, at their 3-axis positions."""
    return _prefill(PREFILL_TEXT, [], ["tokens", "positions"], [], taps, tap_edge, first)


def prefill_audio_walk(taps: Mapping[str, int] | None = None, tap_edge: TapEdge | None = None,
                       first: bool | None = None) -> Walk:
    """One audio clip: the encoder's tokens replace the embeddings of the clip's placeholder rows (``embed_rows``)."""
    encoder = GraphNode(AUDIO_ENCODER, inputs=[MEL], outputs=[AUDIO_EMBEDS])
    edges = [GraphEdge(f"input.{MEL}", f"{AUDIO_ENCODER}.{MEL}"),
             GraphEdge(f"{AUDIO_ENCODER}.{AUDIO_EMBEDS}", f"{THINKER}.embeds")]
    return _prefill(PREFILL_AUDIO, [encoder], ["tokens", "embeds", EMBED_ROWS, "positions"], edges, taps, tap_edge,
                    first)


def prefill_vision_walk(taps: Mapping[str, int] | None = None, tap_edge: TapEdge | None = None,
                        first: bool | None = None) -> Walk:
    """One image or video: merged ViT tokens as embeddings at ``embed_rows``, deepstack features (at
    ``visual_rows``, zero elsewhere) added after layers 0..2."""
    encoder = GraphNode(VISION_ENCODER, inputs=[PIXELS, GRID, VISUAL_ROWS], outputs=[IMAGE_EMBEDS, DEEPSTACK])
    edges = [GraphEdge(f"input.{slot}", f"{VISION_ENCODER}.{slot}") for slot in (PIXELS, GRID, VISUAL_ROWS)]
    edges += [GraphEdge(f"{VISION_ENCODER}.{IMAGE_EMBEDS}", f"{THINKER}.embeds"),
              GraphEdge(f"{VISION_ENCODER}.{DEEPSTACK}", f"{THINKER}.{DEEPSTACK}")]
    return _prefill(PREFILL_VISION, [encoder], ["tokens", "embeds", EMBED_ROWS, "positions", DEEPSTACK], edges, taps,
                    tap_edge, first)


def prefill_media_walk(taps: Mapping[str, int] | None = None, tap_edge: TapEdge | None = None,
                       first: bool = False) -> Walk:
    """One clip and one image or video, and the text around them, in one thinker pass: the clip's tokens
    replace the embeddings at ``embed_rows``, the vision tokens those at ``visual_rows`` (a token input, as
    the deepstack features). Always a text answer's whole prompt, so it always samples token 0."""
    audio = GraphNode(AUDIO_ENCODER, inputs=[MEL], outputs=[AUDIO_EMBEDS])
    vision = GraphNode(VISION_ENCODER, inputs=[PIXELS, GRID, VISUAL_ROWS], outputs=[VISUAL_EMBEDS, DEEPSTACK])
    edges = [GraphEdge(f"input.{MEL}", f"{AUDIO_ENCODER}.{MEL}"),
             GraphEdge(f"{AUDIO_ENCODER}.{AUDIO_EMBEDS}", f"{THINKER}.embeds"),
             *[GraphEdge(f"input.{slot}", f"{VISION_ENCODER}.{slot}") for slot in (PIXELS, GRID, VISUAL_ROWS)],
             GraphEdge(f"input.{VISUAL_ROWS}", f"{THINKER}.{VISUAL_ROWS}"),
             *[GraphEdge(f"{VISION_ENCODER}.{out}", f"{THINKER}.{out}") for out in (VISUAL_EMBEDS, DEEPSTACK)]]
    inputs = ["tokens", "embeds", EMBED_ROWS, "positions", DEEPSTACK, VISUAL_EMBEDS, VISUAL_ROWS]
    return _prefill(PREFILL_MEDIA, [audio, vision], inputs, edges, taps, tap_edge, first)


def decode_walk(logprobs: bool = False, taps: Mapping[str, int] | None = None, tap_edge: TapEdge | None = None) -> Walk:
    """The sampling loop from token 0 (the prefill's), at most max_tokens - 1 more; each to the client as text
    (and its logprobs)."""
    extra, taps = (LOGPROB_OUTPUTS if logprobs else ()), taps or {}
    node = GraphNode(THINKER, inputs=["tokens"], outputs=["token", *extra, *taps],
                     params=kv_params(append(CONTEXT, capture=dict(taps))))
    stop = StopWhen(f"{THINKER}.token", ThinkerStop(), include_stopping=False, label="stop_token_ids after min_tokens")
    loop = DynamicLoop(node, stop=stop, max_iterations=AfterFirst(), carry={f"{THINKER}.token": f"{THINKER}.tokens"},
                       name=LOOP)
    edges = [GraphEdge(f"input.{FIRST}", f"{THINKER}.tokens"), GraphEdge(f"{THINKER}.token", Client("text"))]
    edges += [GraphEdge(f"{THINKER}.{out}", Client("logprobs")) for out in extra]
    return Walk(DECODE_LOGPROBS if logprobs else DECODE, loop, edges=edges + _tap_edges(taps, tap_edge),
                inputs=[FIRST])


class ThinkerTurns(StateMachine):
    """The prefill pieces in prompt order (``inputs["walks"]``), the last one as its ``_first`` walk (it samples
    token 0), then ``thinker_decode`` from that token, then done.

    Pure in (request, finished walk, its outputs): the finished piece's index
    comes back as its ``step`` output, so the worker and the conductor, asking
    the same question, get the same walk. No decode follows when token 0 was a
    stop token (``first`` is empty: "stop") or max_tokens is 1 (the first
    token's loop hit its bound: "length"). A request whose sampling asks for
    logprobs walks the ``_logprobs`` forms (token 0's logprobs come from the prefill).
    """

    def first(self, request: RequestSpec) -> WalkStart:
        return self._piece(request, 0)

    def next(self, request: RequestSpec, finished: str, outputs: Mapping[str, Value]) -> WalkStart | None:
        if finished in (DECODE, DECODE_LOGPROBS):
            return None
        if FIRST in outputs:
            first = outputs[FIRST]
            if not _count(first) or int(request.sampling.max_tokens or 1) <= 1:
                return None
            return WalkStart(DECODE_LOGPROBS if _logprobs(request) else DECODE, {FIRST: first})
        return self._piece(request, int(_scalar(outputs[STEP])) + 1)

    def _piece(self, request: RequestSpec, k: int) -> WalkStart:
        walks = request.inputs.get(WALKS_INPUT) or []
        name = str(walks[k])
        inputs: dict[str, Value] = {slot: request.inputs[step_key(k, slot)] for slot in WALK_INPUTS[name]}
        if k == len(walks) - 1:
            name = first_walk(name, _logprobs(request))
        return WalkStart(name, {**inputs, STEP: k})


def _logprobs(request: RequestSpec) -> bool:
    return request.sampling.logprobs is not None


def _count(value: Value) -> int:
    """How many ids a walk output holds (an empty accumulation is a float array of shape (0,))."""
    if isinstance(value, ArrayData):
        return int(value.shape[0]) if value.shape else 1
    return len(value) if isinstance(value, (list, tuple)) else 1


def _scalar(value: Value) -> int | float:
    return value.item() if isinstance(value, ArrayData) else value  # an int; an array after some transports


def build_graph(name: str = "qwen3-omni", audio: bool = True, vision: bool = True,
                taps: Mapping[str, int] | None = None, tap_edge: TapEdge | None = None) -> WalkGraph:
    """The thinker's walk graph (text out); ``audio`` / ``vision``: the checkpoint has that encoder (-Captioner: no
    vision). ``taps`` / ``tap_edge``: the talker's feed (see the module docstring)."""
    pieces = [prefill_text_walk]
    pieces += [prefill_audio_walk] if audio else []
    pieces += [prefill_vision_walk] if vision else []
    walks = [piece(taps, tap_edge) for piece in pieces]
    pieces += [prefill_media_walk] if audio and vision else []
    walks += [piece(taps, tap_edge, first=logprobs) for piece in pieces for logprobs in (False, True)]
    walks += [decode_walk(False, taps, tap_edge), decode_walk(True, taps, tap_edge)]
    return WalkGraph(name, walks, ThinkerTurns())
