"""The walks of the Qwen3-Omni thinker (torch-free): the user turn split at its media, one walk per piece, then decode.

    prefill_text:    input.tokens, input.positions [3, n] -> thinker                  (appends to "main")
    prefill_audio:   input.mel -> audio_encoder -> audio_embeds [m, D] ─> thinker.embeds
                     input.tokens (text rows and the clip's <|audio_pad|> rows), input.positions,
                     input.embed_rows (the pad rows) -> thinker
    prefill_vision:  input.pixel_values, input.grid_thw, input.visual_rows (bool [n]) -> vision_encoder
                       image_embeds [m, D] ─> thinker.embeds;  deepstack [n, 3, D] (zero off the pad rows)
                       ─> thinker.deepstack (a token input)
                     input.tokens (text rows and the image's or video's pad rows), input.positions,
                     input.embed_rows -> thinker
    prefill_media:   (a text answer's prompt of one clip and one image or video) both encoders, then
                     one thinker pass: audio_embeds ─> thinker.embeds at input.embed_rows; the vision
                     encoder's visual_embeds [n, D] and deepstack [n, 3, D] (zero off input.visual_rows)
                     ─> thinker token inputs, with input.visual_rows
    thinker_decode:  input.last ─> DynamicLoop[ thinker(tokens) -> token ]   carry thinker.token -> thinker.tokens
                       positions: the context's running position (max + 1 on all three axes, + i)
                       stop: stop_token_ids (<|im_end|> ...) after min_tokens, never streamed; at most max_tokens
                     thinker.token -> client:text
    thinker_decode_logprobs: the same, and each token's logprob and top-k -> client:logprobs

Every prefill walk hands its input ``step`` on as its output ``step``, so the
state machine knows which piece of the prompt finished. The prompt is cut at
its media (``prompt_pieces.py``): for a text answer one media walk per item, in
prompt order, each also appending the text before it (the last one the text
after it too), so the prompt costs one thinker pass per item, and a prompt of
one clip and one image or video is one ``prefill_media`` walk; for a spoken
answer a media walk appends exactly the placeholder rows of one item and text
walks the text between them (walks repeat: text, media, text, ..., text). The
last prompt token is left to ``thinker_decode``'s first step. The processor
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
from walkserve.core.request import RequestSpec, Value
from walkserve.graph import (
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
from walkserve.models.llama.graph import LOGPROB_OUTPUTS, StopTokens

THINKER, AUDIO_ENCODER, VISION_ENCODER = "thinker", "audio_encoder", "vision_encoder"
CONTEXT = "main"
PREFILL_TEXT, PREFILL_AUDIO, PREFILL_VISION = "prefill_text", "prefill_audio", "prefill_vision"
PREFILL_MEDIA = "prefill_media"  # a text answer's prompt of one clip and one image or video: one thinker pass
DECODE, DECODE_LOGPROBS = "thinker_decode", "thinker_decode_logprobs"
LOOP = "thinker_loop"
# the encoders' slots (audio_encoder.py / vision_encoder.py import torch; this module must not)
MEL, AUDIO_EMBEDS = "mel", "audio_embeds"
PIXELS, GRID, IMAGE_EMBEDS, DEEPSTACK = "pixel_values", "grid_thw", "image_embeds", "deepstack"
VISUAL_ROWS = "visual_rows"  # bool [n]: the rows of a vision piece the item's tokens fill (its deepstack rows)
EMBED_ROWS = "embed_rows"  # int64 [m]: the rows of a media piece whose embeddings the encoder's m tokens replace
VISUAL_EMBEDS = "visual_embeds"  # [n, D]: the vision tokens at visual_rows, zero elsewhere (prefill_media)
STEP = "step"  # every prefill walk: input.step -> output.step
WALKS_INPUT, LAST_INPUT = "walks", "last"  # RequestSpec.inputs keys: the prefill walks in order; the last prompt token
EMBED_TAP, ACCEPT_TAP = "embed", "accept_hidden"
# what each prefill walk takes besides ``step``, in RequestSpec.inputs under step_key(k, slot)
WALK_INPUTS: dict[str, tuple[str, ...]] = {
    PREFILL_TEXT: ("tokens", "positions"),
    PREFILL_AUDIO: ("tokens", "positions", EMBED_ROWS, MEL),
    PREFILL_VISION: ("tokens", "positions", EMBED_ROWS, PIXELS, GRID, VISUAL_ROWS),
    PREFILL_MEDIA: ("tokens", "positions", EMBED_ROWS, MEL, PIXELS, GRID, VISUAL_ROWS),
}
TapEdge = Callable[[str], GraphEdge]


def step_key(k: int, slot: str) -> str:
    """The RequestSpec.inputs key of prefill piece ``k``'s input ``slot``."""
    return f"step{k}.{slot}"


def thinker_taps(accept_hidden_layer: int) -> dict[str, int]:
    """What the talker reads from the thinker: the input embedding (layer 0's input) and layer k's input."""
    return {EMBED_TAP: 0, ACCEPT_TAP: accept_hidden_layer}


def _thinker(inputs: list[str], taps: Mapping[str, int] | None) -> GraphNode:
    taps = taps or {}
    token_inputs = tuple(name for name in (DEEPSTACK, VISUAL_EMBEDS, VISUAL_ROWS) if name in inputs)
    op = append(CONTEXT, rows=ALL if taps else LAST, capture=dict(taps), token_inputs=token_inputs)
    return GraphNode(THINKER, inputs=inputs, outputs=list(taps), params=kv_params(op))


def _tap_edges(taps: Mapping[str, int] | None, tap_edge: TapEdge | None) -> list[GraphEdge]:
    taps = taps or {}
    if taps and tap_edge is None:
        raise ValueError("thinker taps need tap_edge: where each captured output goes")
    return [tap_edge(f"{THINKER}.{name}") for name in taps]


def _prefill(name: str, body: Any, media: list[GraphEdge], taps: Mapping[str, int] | None,
             tap_edge: TapEdge | None) -> Walk:
    slots = WALK_INPUTS[name]
    edges = [GraphEdge(f"input.{slot}", f"{THINKER}.{slot}") for slot in ("tokens", "positions", EMBED_ROWS)
             if slot in slots]
    edges = [*edges, *media, GraphEdge(f"input.{STEP}", f"output.{STEP}"), *_tap_edges(taps, tap_edge)]
    return Walk(name, body, edges=edges, inputs=[*slots, STEP], outputs=[STEP])


def prefill_text_walk(taps: Mapping[str, int] | None = None, tap_edge: TapEdge | None = None) -> Walk:
    """A run of text tokens (markers included) into the thinker's context, at their 3-axis positions."""
    return _prefill(PREFILL_TEXT, _thinker(["tokens", "positions"], taps), [], taps, tap_edge)


def prefill_audio_walk(taps: Mapping[str, int] | None = None, tap_edge: TapEdge | None = None) -> Walk:
    """One audio clip: the encoder's tokens replace the embeddings of the clip's placeholder rows (``embed_rows``)."""
    encoder = GraphNode(AUDIO_ENCODER, inputs=[MEL], outputs=[AUDIO_EMBEDS])
    thinker = _thinker(["tokens", "embeds", EMBED_ROWS, "positions"], taps)
    edges = [GraphEdge(f"input.{MEL}", f"{AUDIO_ENCODER}.{MEL}"),
             GraphEdge(f"{AUDIO_ENCODER}.{AUDIO_EMBEDS}", f"{THINKER}.embeds")]
    return _prefill(PREFILL_AUDIO, Sequential(encoder, thinker), edges, taps, tap_edge)


def prefill_vision_walk(taps: Mapping[str, int] | None = None, tap_edge: TapEdge | None = None) -> Walk:
    """One image or video: merged ViT tokens as embeddings at ``embed_rows``, deepstack features (at
    ``visual_rows``, zero elsewhere) added after layers 0..2."""
    encoder = GraphNode(VISION_ENCODER, inputs=[PIXELS, GRID, VISUAL_ROWS], outputs=[IMAGE_EMBEDS, DEEPSTACK])
    thinker = _thinker(["tokens", "embeds", EMBED_ROWS, "positions", DEEPSTACK], taps)
    edges = [GraphEdge(f"input.{slot}", f"{VISION_ENCODER}.{slot}") for slot in (PIXELS, GRID, VISUAL_ROWS)]
    edges += [GraphEdge(f"{VISION_ENCODER}.{IMAGE_EMBEDS}", f"{THINKER}.embeds"),
              GraphEdge(f"{VISION_ENCODER}.{DEEPSTACK}", f"{THINKER}.{DEEPSTACK}")]
    return _prefill(PREFILL_VISION, Sequential(encoder, thinker), edges, taps, tap_edge)


def prefill_media_walk(taps: Mapping[str, int] | None = None, tap_edge: TapEdge | None = None) -> Walk:
    """One clip and one image or video, and the text around them, in one thinker pass: the clip's tokens
    replace the embeddings at ``embed_rows``, the vision tokens those at ``visual_rows`` (a token input, as
    the deepstack features)."""
    audio = GraphNode(AUDIO_ENCODER, inputs=[MEL], outputs=[AUDIO_EMBEDS])
    vision = GraphNode(VISION_ENCODER, inputs=[PIXELS, GRID, VISUAL_ROWS], outputs=[VISUAL_EMBEDS, DEEPSTACK])
    thinker = _thinker(["tokens", "embeds", EMBED_ROWS, "positions", DEEPSTACK, VISUAL_EMBEDS, VISUAL_ROWS], taps)
    edges = [GraphEdge(f"input.{MEL}", f"{AUDIO_ENCODER}.{MEL}"),
             GraphEdge(f"{AUDIO_ENCODER}.{AUDIO_EMBEDS}", f"{THINKER}.embeds"),
             *[GraphEdge(f"input.{slot}", f"{VISION_ENCODER}.{slot}") for slot in (PIXELS, GRID, VISUAL_ROWS)],
             GraphEdge(f"input.{VISUAL_ROWS}", f"{THINKER}.{VISUAL_ROWS}"),
             *[GraphEdge(f"{VISION_ENCODER}.{out}", f"{THINKER}.{out}") for out in (VISUAL_EMBEDS, DEEPSTACK)]]
    return _prefill(PREFILL_MEDIA, Sequential(audio, vision, thinker), edges, taps, tap_edge)


def decode_walk(logprobs: bool = False, taps: Mapping[str, int] | None = None, tap_edge: TapEdge | None = None) -> Walk:
    """The sampling loop from the last prompt token; each token to the client as text (and its logprobs)."""
    extra, taps = (LOGPROB_OUTPUTS if logprobs else ()), taps or {}
    node = GraphNode(THINKER, inputs=["tokens"], outputs=["token", *extra, *taps],
                     params=kv_params(append(CONTEXT, capture=dict(taps))))
    stop = StopWhen(f"{THINKER}.token", StopTokens(), include_stopping=False, label="stop_token_ids after min_tokens")
    loop = DynamicLoop(node, stop=stop, max_iterations="max_tokens", carry={f"{THINKER}.token": f"{THINKER}.tokens"},
                       name=LOOP)
    edges = [GraphEdge(f"input.{LAST_INPUT}", f"{THINKER}.tokens"), GraphEdge(f"{THINKER}.token", Client("text"))]
    edges += [GraphEdge(f"{THINKER}.{out}", Client("logprobs")) for out in extra]
    return Walk(DECODE_LOGPROBS if logprobs else DECODE, loop, edges=edges + _tap_edges(taps, tap_edge),
                inputs=[LAST_INPUT])


class ThinkerTurns(StateMachine):
    """The prefill pieces in prompt order (``inputs["walks"]``), then ``thinker_decode``, then done.

    Pure in (request, finished walk, its outputs): the finished piece's index
    comes back as its ``step`` output, so the worker and the conductor, asking
    the same question, get the same walk. A request whose sampling asks for
    logprobs decodes through ``thinker_decode_logprobs``.
    """

    def first(self, request: RequestSpec) -> WalkStart:
        return self._piece(request, 0)

    def next(self, request: RequestSpec, finished: str, outputs: Mapping[str, Value]) -> WalkStart | None:
        if finished in (DECODE, DECODE_LOGPROBS):
            return None
        return self._piece(request, int(_scalar(outputs[STEP])) + 1)

    def _piece(self, request: RequestSpec, k: int) -> WalkStart:
        walks = request.inputs.get(WALKS_INPUT) or []
        if k < len(walks):
            name = str(walks[k])
            inputs: dict[str, Value] = {slot: request.inputs[step_key(k, slot)] for slot in WALK_INPUTS[name]}
            return WalkStart(name, {**inputs, STEP: k})
        decode = DECODE_LOGPROBS if request.sampling.logprobs is not None else DECODE
        return WalkStart(decode, {LAST_INPUT: request.inputs[LAST_INPUT]})


def _scalar(value: Value) -> int | float:
    return value.item() if isinstance(value, ArrayData) else value  # an int; an array after some transports


def build_graph(name: str = "qwen3-omni", audio: bool = True, vision: bool = True,
                taps: Mapping[str, int] | None = None, tap_edge: TapEdge | None = None) -> WalkGraph:
    """The thinker's walk graph (text out); ``audio`` / ``vision``: the checkpoint has that encoder (-Captioner: no
    vision). ``taps`` / ``tap_edge``: the talker's feed (see the module docstring)."""
    walks = [prefill_text_walk(taps, tap_edge)]
    walks += [prefill_audio_walk(taps, tap_edge)] if audio else []
    walks += [prefill_vision_walk(taps, tap_edge)] if vision else []
    walks += [prefill_media_walk(taps, tap_edge)] if audio and vision else []
    walks += [decode_walk(False, taps, tap_edge), decode_walk(True, taps, tap_edge)]
    return WalkGraph(name, walks, ThinkerTurns())
