"""The spoken answer's walks (torch-free): the talker fed piece by piece, then three partitions streamed together.

A request with ``modalities`` ("text", "audio") walks, after each thinker prefill piece, a talker prefill of the
same piece's user-turn rows, then the thinker's first step, the 6-position prefix tail, and the streamed decode:

    prefill_text / prefill_audio_speech / prefill_vision_speech     (thinker; a media piece also hands out
        the input of layer accept_hidden_layer at its rows: output.accept)
    talker_prefill        input.tokens/text/codes/positions -> talker                (appends to "talker")
    talker_prefill_media  the same, and input.media (the accept states) -> talker.media
    thinker_first         input.last -> Loop 1 x [ thinker -> token 0 ] -> client:text, output.first (a stop token: none)
    talker_last_prefill   tts_pad x4, tts_bos, token 0 (+ nothink .. codec_bos) -> talker -> code 0, hidden
    talker_decode         Parallel(
      thinker:  DynamicLoop[ thinker(tokens) -> token ]  from token 0, at most max_tokens - 1 more
                thinker.token -> client:text;  thinker.token ~> talker_in.text   FixedChunk(1, continue after end)
      talker:   DynamicLoop "talk" (at most talker_max_frames), per frame i:
                  predictor_in(code0_i, hidden_i) -> code_predictor [fresh "cp" context: hidden, embed(code 0)]
                    -> code 1 -> Loop 14 x [ code_predictor_step ] -> codes 2..15 (accumulated)
                  frame(code0, code 1, codes 2..15) -> frame i [1, 16]
                  talker_in(frame i, thinker chunk i)   stop when code 0 is codec EOS (frame i not exposed)
                    -> talker(frame i's 16 embeddings + text part: token i + 1, tts_eos once, then tts_pad)
                    -> code0_{i+1}, hidden_{i+1}   (carried)
                frame.frame ~> code2wav.codes   LeftContext(25, 25)
      code2wav: per chunk -> client:audio;  frame.frame -> client:latent (the 16 codes of each frame))

Text-only requests walk the thinker's graph unchanged (``graph.py``). The
talker's inputs are rows of (tokens = code-0 ids for its sampling history,
text = thinker ids whose projected embedding is the text part, codes = the
codec ids summed as the codec part, -1 for none; media = accept states);
``speech_nodes.TalkerLM`` turns them into embeddings.
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
    Client,
    DynamicLoop,
    FixedChunk,
    GraphEdge,
    GraphNode,
    LeftContext,
    Loop,
    Parallel,
    Playback,
    Sequential,
    StopWhen,
    StreamingGraphEdge,
    Walk,
    WalkGraph,
    WalkStart,
)
from walkserve.graph.kv import append, drop, kv_params
from walkserve.graph.stop import scalar
from walkserve.models.qwen3_omni.graph import (
    ACCEPT_TAP,
    CONTEXT,
    DECODE,
    DECODE_LOGPROBS,
    FIRST,
    LAST_INPUT,
    PREFILL_AUDIO,
    PREFILL_TEXT,
    PREFILL_VISION,
    STEP,
    THINKER,
    WALK_INPUTS,
    WALKS_INPUT,
    AfterFirst,
    ThinkerStop,
    ThinkerTurns,
    _count,
    _scalar,
    build_graph,
    first_token_loop,
    prefill_audio_walk,
    prefill_vision_walk,
    step_key,
)

TALKER, PREDICTOR, PREDICTOR_STEP, CODE2WAV = "talker", "code_predictor", "code_predictor_step", "code2wav"
GLUE = "talker_glue"  # the stateless component of the three small nodes below
TALKER_IN, PREDICTOR_IN, FRAME = "talker_in", "predictor_in", "frame"
TALKER_CONTEXT, PREDICTOR_CONTEXT = "talker", "cp"
TALKER_PREFILL, TALKER_PREFILL_MEDIA = "talker_prefill", "talker_prefill_media"
THINKER_FIRST, TALKER_LAST_PREFILL, TALKER_DECODE = "thinker_first", "talker_last_prefill", "talker_decode"
PREFILL_AUDIO_SPEECH, PREFILL_VISION_SPEECH = "prefill_audio_speech", "prefill_vision_speech"
SPEECH_PIECE = {PREFILL_TEXT: PREFILL_TEXT, PREFILL_AUDIO: PREFILL_AUDIO_SPEECH, PREFILL_VISION: PREFILL_VISION_SPEECH}
TALKER_SLOTS = ("tokens", "text", "codes", "positions")
ACCEPT_OUTPUT, CODE0, HIDDEN = "accept", "code0", "hidden"
TAIL = "tail"  # RequestSpec.inputs tail.tokens / tail.text / tail.codes: the 6 tail rows, token 0 left as -1
THINKER_LOOP, TALK_LOOP, DEPTH_LOOP = "thinker_loop", "talk", "depth"
CHUNK_FRAMES, CONTEXT_FRAMES = 25, 25
RELEASE_FRAME_S = 1920 / 24000  # the release's Code2Wav: 1920 samples per frame at 24 kHz (12.5 frames a second)


def talk_key(k: int, slot: str) -> str:
    """The RequestSpec.inputs key of the talker rows of prefill piece ``k``."""
    return f"talk{k}.{slot}"


def _talker_node(code0_ranges: list[tuple[int, int]], media: bool = False, prefill: bool = False) -> GraphNode:
    inputs = ["tokens", "text", "codes", *(["media"] if media else []), *(["positions"] if prefill else [])]
    names = ("text", "codes", "media") if media else ("text", "codes")
    op = append(TALKER_CONTEXT, token_inputs=names)
    outputs = [] if prefill else ["token", "hidden"]
    return GraphNode(TALKER, inputs=inputs, outputs=outputs, params=kv_params(op, token_ranges=code0_ranges))


def talker_prefill_walk(code0_ranges: list[tuple[int, int]], media: bool = False) -> Walk:
    """The user-turn rows of one prefill piece into the talker's context, at the talker's own positions."""
    node = _talker_node(code0_ranges, media=media, prefill=True)
    slots = [*TALKER_SLOTS, *(["media"] if media else [])]
    edges = [GraphEdge(f"input.{s}", f"{TALKER}.{s}") for s in slots]
    return Walk(TALKER_PREFILL_MEDIA if media else TALKER_PREFILL, node,
                edges=[*edges, GraphEdge(f"input.{STEP}", f"output.{STEP}")], inputs=[*slots, STEP], outputs=[STEP])


def thinker_first_walk() -> Walk:
    """The thinker's first answer token (the talker's prefix tail needs it), in the text answer's one-iteration
    loop: a stop token first ends it unexposed (not streamed, not counted; ``first`` empty, nothing to speak)."""
    node = first_token_loop(GraphNode(THINKER, inputs=["tokens"], outputs=["token"], params=kv_params(append(CONTEXT))))
    edges = [GraphEdge(f"input.{LAST_INPUT}", f"{THINKER}.tokens"), GraphEdge(f"{THINKER}.token", Client("text")),
             GraphEdge(f"{THINKER}.token", f"output.{FIRST}")]
    return Walk(THINKER_FIRST, node, edges=edges, inputs=[LAST_INPUT], outputs=[FIRST])


def talker_last_prefill_walk(code0_ranges: list[tuple[int, int]]) -> Walk:
    """The 6 tail positions of the assistant prefix; the last one samples code 0 of frame 0."""
    node = _talker_node(code0_ranges)
    edges = [GraphEdge(f"input.{s}", f"{TALKER}.{s}") for s in ("tokens", "text", "codes")]
    edges += [GraphEdge(f"{TALKER}.token", f"output.{CODE0}"), GraphEdge(f"{TALKER}.hidden", f"output.{HIDDEN}"),
              GraphEdge(f"input.{FIRST}", f"output.{FIRST}")]
    return Walk(TALKER_LAST_PREFILL, node, edges=edges, inputs=["tokens", "text", "codes", FIRST],
                outputs=[CODE0, HIDDEN, FIRST])


def _stop_flag(value: Any, params: RequestParams, iteration: int) -> bool:
    return bool(scalar(value))


def talker_frames(params: RequestParams) -> int:
    """The talk loop's bound: the request's ``max_audio_frames`` (its processor fills it)."""
    return params.model.max_audio_frames  # OmniParams


def _thinker_loop() -> DynamicLoop:
    node = GraphNode(THINKER, inputs=["tokens"], outputs=["token"], params=kv_params(append(CONTEXT)))
    stop = StopWhen(f"{THINKER}.token", ThinkerStop(), include_stopping=False, label="stop_token_ids after min_tokens")
    return DynamicLoop(node, stop=stop, max_iterations=AfterFirst(), carry={f"{THINKER}.token": f"{THINKER}.tokens"},
                       name=THINKER_LOOP)


def _talk_loop(code0_ranges: list[tuple[int, int]], depth_ranges: Any, groups: int) -> DynamicLoop:
    predictor_in = GraphNode(PREDICTOR_IN, inputs=[CODE0, HIDDEN], outputs=["tokens", "embeds"], component=GLUE,
                             op=PREDICTOR_IN)
    first = GraphNode(PREDICTOR, inputs=["tokens", "embeds"], outputs=["token"], params=kv_params(
        drop(PREDICTOR_CONTEXT), append(PREDICTOR_CONTEXT), token_ranges=depth_ranges))
    step = GraphNode(PREDICTOR_STEP, inputs=["tokens"], outputs=["token"], component=PREDICTOR,
                     params=kv_params(append(PREDICTOR_CONTEXT), token_ranges=depth_ranges))
    depth = Loop(step, groups - 2, carry={f"{PREDICTOR_STEP}.token": f"{PREDICTOR_STEP}.tokens"},
                 outputs={f"{PREDICTOR_STEP}.token": ACCUMULATE}, name=DEPTH_LOOP)
    frame = GraphNode(FRAME, inputs=[CODE0, "first", "rest"], outputs=["frame"], component=GLUE, op=FRAME)
    talker_in = GraphNode(TALKER_IN, inputs=["text", "frame"], outputs=["tokens", "text", "codes", "stop"],
                          component=GLUE, op=TALKER_IN)
    body = Sequential(predictor_in, first, depth, frame, talker_in, _talker_node(code0_ranges))
    stop = StopWhen(f"{TALKER_IN}.stop", _stop_flag, include_stopping=False, label="code 0 is codec EOS")
    carry = {f"{TALKER}.token": [f"{PREDICTOR_IN}.{CODE0}", f"{FRAME}.{CODE0}"],
             f"{TALKER}.hidden": f"{PREDICTOR_IN}.{HIDDEN}"}
    return DynamicLoop(body, stop=stop, max_iterations=talker_frames, carry=carry, name=TALK_LOOP,
                       speculate=False)


def talker_decode_walk(code0_ranges: list[tuple[int, int]], depth_ranges: Any, groups: int,
                       frame_s: float = RELEASE_FRAME_S) -> Walk:
    """The thinker's remaining tokens stream into the talker, whose frames stream into Code2Wav (``frame_s``
    seconds of audio per frame; its playback: a talker step is a frame, Code2Wav's chunks 25 frames each)."""
    code2wav = GraphNode(CODE2WAV, inputs=["codes"], outputs=["audio"])
    body = Parallel(_thinker_loop(), _talk_loop(code0_ranges, depth_ranges, groups), code2wav)
    edges = [
        GraphEdge(f"input.{FIRST}", f"{THINKER}.tokens"),
        GraphEdge(f"{THINKER}.token", Client("text")),
        StreamingGraphEdge(f"{THINKER}.token", f"{TALKER_IN}.text", FixedChunk(1, continue_after_end=True)),
        GraphEdge(f"input.{CODE0}", f"{PREDICTOR_IN}.{CODE0}"),
        GraphEdge(f"input.{CODE0}", f"{FRAME}.{CODE0}"),
        GraphEdge(f"input.{HIDDEN}", f"{PREDICTOR_IN}.{HIDDEN}"),
        GraphEdge(f"{PREDICTOR_IN}.tokens", f"{PREDICTOR}.tokens"),
        GraphEdge(f"{PREDICTOR_IN}.embeds", f"{PREDICTOR}.embeds"),
        GraphEdge(f"{PREDICTOR}.token", f"{PREDICTOR_STEP}.tokens"),
        GraphEdge(f"{PREDICTOR}.token", f"{FRAME}.first"),
        GraphEdge(f"{PREDICTOR_STEP}.token", f"{FRAME}.rest"),
        GraphEdge(f"{FRAME}.frame", f"{TALKER_IN}.frame"),
        *[GraphEdge(f"{TALKER_IN}.{s}", f"{TALKER}.{s}") for s in ("tokens", "text", "codes")],
        GraphEdge(f"{TALKER_IN}.stop", DROP),
        StreamingGraphEdge(f"{FRAME}.frame", f"{CODE2WAV}.codes", LeftContext(CHUNK_FRAMES, CONTEXT_FRAMES)),
        GraphEdge(f"{CODE2WAV}.audio", Client("audio")),
        GraphEdge(f"{FRAME}.frame", Client("latent")),  # the codec frames, for clients that ask
    ]
    playback = {TALKER: Playback(frame_s, every=CHUNK_FRAMES), CODE2WAV: Playback(CHUNK_FRAMES * frame_s)}
    return Walk(TALKER_DECODE, body, edges=edges, inputs=[FIRST, CODE0, HIDDEN], playback=playback)


def speech_walks(code0_ranges: list[tuple[int, int]], depth_ranges: Any, groups: int, accept_layer: int,
                 audio: bool, vision: bool, frame_s: float = RELEASE_FRAME_S) -> list[Walk]:
    """The walks a spoken answer adds to the thinker's graph."""
    taps = {ACCEPT_TAP: accept_layer}
    to_output = lambda endpoint: GraphEdge(endpoint, f"output.{ACCEPT_OUTPUT}")  # noqa: E731
    walks = [talker_prefill_walk(code0_ranges), talker_prefill_walk(code0_ranges, media=True), thinker_first_walk(),
             talker_last_prefill_walk(code0_ranges), talker_decode_walk(code0_ranges, depth_ranges, groups, frame_s)]
    if audio:
        walks.append(_renamed(prefill_audio_walk(taps, to_output), PREFILL_AUDIO_SPEECH))
    if vision:
        walks.append(_renamed(prefill_vision_walk(taps, to_output), PREFILL_VISION_SPEECH))
    return walks


def _renamed(walk: Walk, name: str) -> Walk:
    return Walk(name, walk.body, walk.edges, walk.inputs, (*walk.outputs, ACCEPT_OUTPUT))


class SpeechTurns(ThinkerTurns):
    """Text-only requests: the thinker's walks. Spoken answers: each piece then its talker rows, then the
    first token, the prefix tail and the streamed decode (module docstring).

    Pure in (request, finished walk, its outputs), as ThinkerTurns.
    """

    def first(self, request: RequestSpec) -> WalkStart:
        return self._speech_piece(request, 0) if _speaks(request) else super().first(request)

    def next(self, request: RequestSpec, finished: str, outputs: Mapping[str, Value]) -> WalkStart | None:
        if not _speaks(request):
            return super().next(request, finished, outputs)
        if finished in (TALKER_DECODE, DECODE, DECODE_LOGPROBS):
            return None
        if finished == THINKER_FIRST:
            return self._tail(request, outputs[FIRST])
        if finished == TALKER_LAST_PREFILL:
            return WalkStart(TALKER_DECODE, {k: outputs[k] for k in (FIRST, CODE0, HIDDEN)})
        k = int(_scalar(outputs[STEP]))
        if finished in (TALKER_PREFILL, TALKER_PREFILL_MEDIA):
            return self._speech_piece(request, k + 1)
        return self._talker_piece(request, k, outputs.get(ACCEPT_OUTPUT))

    def _speech_piece(self, request: RequestSpec, k: int) -> WalkStart:
        walks = request.inputs.get(WALKS_INPUT) or []
        if k >= len(walks):
            return WalkStart(THINKER_FIRST, {LAST_INPUT: request.inputs[LAST_INPUT]})
        name = str(walks[k])
        inputs: dict[str, Value] = {slot: request.inputs[step_key(k, slot)] for slot in WALK_INPUTS[name]}
        return WalkStart(SPEECH_PIECE[name], {**inputs, STEP: k})

    def _talker_piece(self, request: RequestSpec, k: int, accept: Value | None) -> WalkStart:
        if talk_key(k, "tokens") not in request.inputs:  # no user-turn rows in this piece
            return self._speech_piece(request, k + 1)
        inputs: dict[str, Value] = {s: request.inputs[talk_key(k, s)] for s in TALKER_SLOTS}
        if accept is None:
            return WalkStart(TALKER_PREFILL, {**inputs, STEP: k})
        return WalkStart(TALKER_PREFILL_MEDIA, {**inputs, "media": accept, STEP: k})

    def _tail(self, request: RequestSpec, first: Value) -> WalkStart | None:
        if not _count(first):
            return None  # token 0 was a stop token: nothing to say, nothing to speak
        token = int(_scalar(first))
        text = request.inputs[f"{TAIL}.text"]
        text_ids = [t if t >= 0 else token for t in text.tolist()]  # type: ignore[union-attr]
        return WalkStart(TALKER_LAST_PREFILL, {"tokens": request.inputs[f"{TAIL}.tokens"],
                                               "text": ArrayData.from_list(text_ids),
                                               "codes": request.inputs[f"{TAIL}.codes"], FIRST: first})


def _speaks(request: RequestSpec) -> bool:
    return "audio" in request.modalities


def build_speech_graph(code0_ranges: list[tuple[int, int]], depth_ranges: Any, groups: int, accept_layer: int,
                       name: str = "qwen3-omni", audio: bool = True, vision: bool = True,
                       frame_s: float = RELEASE_FRAME_S) -> WalkGraph:
    """The thinker's graph (text-only requests) plus the spoken answer's walks, under SpeechTurns."""
    thinker = build_graph(name, audio=audio, vision=vision)
    walks = [*thinker.walks.values(),
             *speech_walks(code0_ranges, depth_ranges, groups, accept_layer, audio, vision, frame_s)]
    return WalkGraph(name, walks, SpeechTurns())


class DepthRanges:
    """The code predictor's token_ranges: at depth n (codes drawn so far in the frame's fresh context) block n."""

    def __init__(self, codebook_size: int):
        self.book = codebook_size

    def __call__(self, n_sampled: int) -> list[tuple[int, int]]:
        return [(n_sampled * self.book, (n_sampled + 1) * self.book)]
