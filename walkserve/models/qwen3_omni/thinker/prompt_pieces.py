"""A thinker prompt cut at its media into the prefill walks' inputs (torch-free; the processor's last step).

Text answers (``merge=True``): a prompt of one clip and one image or video (in either order) is one
``prefill_media`` piece, the whole prompt in one thinker pass. Otherwise one pass per media item, each
taking the text before it, the last one the text after it too (a text-only prompt is one
``prefill_text`` piece):

    ids    |<|im_start|>system ... user\\n<|audio_start|>|pad x 31|<|audio_end|><|vision_start|>|pad x 6|<|vision_end|>What? ... assistant\\n|
    walks   prefill_audio (0)                                              prefill_vision (1), walked as prefill_vision_first
                                embed_rows: the pad rows                                 embed_rows, visual_rows: the pad rows

The last piece of a text answer takes the whole rest of the prompt, its last token included, and samples
the first answer token from that row (``graph.py``: the ``_first`` walks), as transformers samples it from
the prefill's last row.

Spoken answers (``merge=False``; the talker is fed piece by piece, ``speech_graph.py``): text and media
pieces alternate, a media piece holding exactly its placeholder rows:

    walks   prefill_text (0)  prefill_audio (1)  prefill_text (2)  prefill_vision (3)  prefill_text (4)   (last token -> thinker_first)

Every pass over the prompt reads all the MoE experts of every layer, so fewer, longer pieces cost less
than many short ones (five pieces ran ~1.4x one pass on the benchmark's model).

Each piece carries its token ids, its [3, n] positions (``rope_index``) and its rows' content keys
(``content_keys.py``, int64 [n, 2]: (0, 0) on text rows, a 128-bit digest of the item's encoder input on media rows); a media piece also its
encoder input and ``embed_rows`` (int64 [m], the piece's rows the encoder's m tokens replace); a vision
piece ``visual_rows`` (bool [n], the same rows: where the deepstack features go); a ``prefill_media``
piece both encoders' inputs, ``embed_rows`` the clip's rows and ``visual_rows`` the image's. ``RequestSpec.inputs``
then holds ``walks`` (the walk names in order), ``step<k>.<slot>`` per piece, for a spoken answer ``last``
(the last prompt token, ``thinker_first``'s input) and ``prompt_token_ids`` (the whole expanded prompt, for usage).
"""

from __future__ import annotations

import numpy as np

from walkserve.core.array import ArrayData
from walkserve.core.request import Value
from walkserve.models.common.text_walk import PROMPT_INPUT
from walkserve.models.qwen3_omni.config import OmniTokenIds
from walkserve.models.qwen3_omni.graph import (
    CONTENT,
    EMBED_ROWS,
    GRID,
    LAST_INPUT,
    MEL,
    PIXELS,
    PREFILL_AUDIO,
    PREFILL_MEDIA,
    PREFILL_TEXT,
    PREFILL_VISION,
    VISUAL_ROWS,
    WALKS_INPUT,
    step_key,
)
from walkserve.models.qwen3_omni.thinker.content_keys import content_keys
from walkserve.models.qwen3_omni.thinker.prompt import MediaSpan, media_spans
from walkserve.models.qwen3_omni.thinker.request import ThinkerRequest


def array(x: np.ndarray) -> ArrayData:
    x = np.ascontiguousarray(x)
    return ArrayData(str(x.dtype), tuple(x.shape), x.tobytes())


def request_inputs(request: ThinkerRequest, tokens: OmniTokenIds, merge: bool = True) -> dict[str, Value]:
    """The RequestSpec inputs of one prompt: its pieces in order (and, spoken, the last token), the whole prompt.

    ``merge`` (a text answer): text runs join the media piece after them (the last media piece also takes the
    trailing text), so the prompt is one thinker pass per media item, or one ``prefill_media`` pass for one clip
    and one image or video, the last token included; otherwise (a spoken answer) every text run is its own
    piece and the last token is left out (``last``).
    """
    ids = np.asarray(request.input_ids, dtype=np.int64)
    out: dict[str, Value] = {PROMPT_INPUT: array(ids)}
    end = len(ids)  # a text answer's last piece takes the last token too and samples token 0 from it
    if not merge:  # a spoken answer leaves the last token to thinker_first
        end -= 1
        out[LAST_INPUT] = array(ids[end:])
    spans = media_spans(request.input_ids, tokens)
    keys = content_keys(request, tokens)
    walks: list[str] = []
    for walk, lo, hi, items in _cuts(spans, end, merge):
        k = len(walks)
        walks.append(walk)
        out[step_key(k, "tokens")] = array(ids[lo:hi])
        out[step_key(k, "positions")] = array(request.positions.positions[:, lo:hi])
        out[step_key(k, CONTENT)] = array(keys[lo:hi])
        for span in items:
            media = _media_inputs(request, span, lo, hi, alone=len(items) == 1)
            out.update({step_key(k, slot): value for slot, value in media.items()})
    out[WALKS_INPUT] = walks
    return out


def _one_pass(spans: list[MediaSpan]) -> bool:
    """One clip and one image or video: what ``prefill_media`` takes in one thinker pass."""
    return sorted(s.kind == "audio" for s in spans) == [False, True]


def _cuts(spans: list[MediaSpan], end: int, merge: bool) -> list[tuple[str, int, int, list[MediaSpan]]]:
    """(walk, lo, hi, its media spans) for each piece of rows [0, end), in order."""
    if merge and _one_pass(spans) and spans[-1].end <= end:
        return [(PREFILL_MEDIA, 0, end, spans)]
    cuts: list[tuple[str, int, int, list[MediaSpan]]] = []
    at = 0
    for span in spans:
        if span.start > at and not merge:
            cuts.append((PREFILL_TEXT, at, span.start, []))
            at = span.start
        cuts.append((PREFILL_AUDIO if span.kind == "audio" else PREFILL_VISION, at, span.end, [span]))
        at = span.end
    if end > at:
        if merge and cuts:
            walk, lo, _, items = cuts[-1]
            cuts[-1] = (walk, lo, end, items)
        else:
            cuts.append((PREFILL_TEXT, at, end, []))
    return cuts


def _media_inputs(request: ThinkerRequest, span: MediaSpan, lo: int, hi: int, alone: bool) -> dict[str, ArrayData]:
    """The encoder's input of one media item in piece [lo, hi), and which of its rows the encoder's tokens fill
    (``alone``: the piece's only item)."""
    rows = np.arange(span.start - lo, span.end - lo, dtype=np.int64)
    if span.kind == "audio":
        return {MEL: array(request.audio[span.index].astype(np.float32)), EMBED_ROWS: array(rows)}
    vision = request.images[span.index] if span.kind == "image" else request.videos[span.index].vision
    visual = np.zeros(hi - lo, dtype=np.bool_)
    visual[rows] = True
    out = {PIXELS: array(vision.pixel_values.astype(np.float32)), GRID: array(np.asarray(vision.grid_thw, np.int64)),
           VISUAL_ROWS: array(visual)}
    if alone:  # in prefill_media, embed_rows are the clip's
        out[EMBED_ROWS] = array(rows)
    return out
