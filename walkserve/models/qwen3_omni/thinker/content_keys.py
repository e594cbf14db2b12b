"""Per-row content keys of a thinker prompt: what the prefix cache keys its media rows on (torch-free).

A text row is its token id (key 0). A media placeholder row's embedding is the encoder's output for
its item, so its key is a digest of exactly what the encoder takes (the clip's log-mel features, the
image's or video's patches and grid): two prompts share a block only when every row's token, content
and position agree, never on the placeholder tokens alone.

    ids      |<|im_start|> user \\n <|audio_start|>|pad pad ... pad|<|audio_end|> What ? ...|
    content  |     0        0   0       0        | d   d  ...  d |     0        0   0 ...|   d = digest(mel)

A clip's features depend on the longest clip of its request (the checkpoint's processor pads every
clip to it), so an earlier turn's clip keeps its key only while no later clip is longer.
"""

from __future__ import annotations

import hashlib

import numpy as np

from walkserve.models.qwen3_omni.config import OmniTokenIds
from walkserve.models.qwen3_omni.thinker.prompt import media_spans
from walkserve.models.qwen3_omni.thinker.request import ThinkerRequest

_MASK = (1 << 63) - 1  # keys are int64 and nonzero


def digest(kind: str, *arrays: np.ndarray) -> int:
    """A nonzero 63-bit key of ``kind`` and the arrays' dtypes, shapes and bytes."""
    h = hashlib.blake2b(kind.encode(), digest_size=8)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"|{a.dtype}{a.shape}|".encode())
        h.update(a.data)
    return int.from_bytes(h.digest(), "little") & _MASK or 1


def content_keys(request: ThinkerRequest, tokens: OmniTokenIds) -> np.ndarray:
    """int64 [n]: 0 on text rows, the digest of its item's encoder input on each media row."""
    keys = np.zeros(len(request.input_ids), dtype=np.int64)
    for span in media_spans(request.input_ids, tokens):
        keys[span.start : span.end] = _item_key(request, span.kind, span.index)
    return keys


def _item_key(request: ThinkerRequest, kind: str, index: int) -> int:
    if kind == "audio":
        return digest("audio", request.audio[index].astype(np.float32))
    vision = request.images[index] if kind == "image" else request.videos[index].vision
    return digest(kind, vision.pixel_values.astype(np.float32), np.asarray(vision.grid_thw, np.int64))
