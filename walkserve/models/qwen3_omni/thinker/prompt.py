"""The thinker's prompt: the checkpoint's chat template, then one placeholder per media item expanded (torch-free).

The template renders each media part of a message as a single placeholder
between markers, e.g. ``<|audio_start|><|audio_pad|><|audio_end|>`` or
``<|vision_start|><|image_pad|><|vision_end|>``; the processor then repeats
each placeholder once per encoder token of its item (``media_tokens``), in
order of appearance, as the reference processor does before tokenizing.

    messages -> render_chat (template) -> encode -> expand_placeholders(ids, counts) -> rope_index
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from walkserve.models.qwen3_omni.config import OmniTokenIds
from walkserve.models.tokenizer import Tokenizer

# OpenAI / vLLM content-part types -> the part types chat templates know
PART_TYPES = {"text": "text", "image_url": "image", "image": "image", "input_audio": "audio", "audio_url": "audio",
              "audio": "audio", "video_url": "video", "video": "video"}


@dataclass(frozen=True)
class MediaSpan:
    """The placeholder rows ``start .. end`` (exclusive) of one media item; ``index`` counts items of its kind."""

    kind: str  # "audio" | "image" | "video"
    index: int
    start: int
    end: int


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages with every content part typed as chat templates expect (image / audio / video / text).

    String contents are kept; a part of an unknown type raises ValueError.
    """
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) or content is None:
            out.append(dict(message))
            continue
        parts = []
        for part in content:
            kind = PART_TYPES.get(part.get("type"))
            if kind is None:
                raise ValueError(f"unsupported content part type {part.get('type')!r}")
            parts.append({"type": "text", "text": part.get("text", "")} if kind == "text" else {"type": kind})
        out.append({**message, "content": parts})
    return out


def render_chat(tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                **variables: Any) -> str:
    """The prompt text by the checkpoint's own chat template (no system prompt is added here)."""
    return tokenizer.apply_chat_template(template_messages(messages), add_generation_prompt=add_generation_prompt,
                                         **variables)


def expand_placeholders(
    ids: Sequence[int],
    tokens: OmniTokenIds,
    audio: Sequence[int] = (),
    images: Sequence[int] = (),
    videos: Sequence[int] = (),
) -> list[int]:
    """Repeat the k-th audio / image / video placeholder ``audio[k]`` / ``images[k]`` / ``videos[k]`` times.

    Raises ValueError when the prompt holds a different number of placeholders
    of a kind than counts given.
    """
    counts = {tokens.audio_token_id: list(audio), tokens.image_token_id: list(images),
              tokens.video_token_id: list(videos)}
    used = dict.fromkeys(counts, 0)
    out: list[int] = []
    for token in ids:
        if token not in counts:
            out.append(int(token))
            continue
        k = used[token]
        if k >= len(counts[token]):
            raise ValueError(f"the prompt has more {_kind(token, tokens)} placeholders than the "
                             f"{len(counts[token])} item(s) given")
        out.extend([int(token)] * int(counts[token][k]))
        used[token] = k + 1
    for token, n in used.items():
        if n != len(counts[token]):
            raise ValueError(f"the prompt has {n} {_kind(token, tokens)} placeholder(s), {len(counts[token])} "
                             f"item(s) were given")
    return out


def media_spans(ids: Sequence[int], tokens: OmniTokenIds) -> list[MediaSpan]:
    """The runs of placeholder rows of an expanded prompt, in order (where the encoders' outputs go)."""
    kinds = {tokens.audio_token_id: "audio", tokens.image_token_id: "image", tokens.video_token_id: "video"}
    spans: list[MediaSpan] = []
    seen = dict.fromkeys(kinds.values(), 0)
    i = 0
    while i < len(ids):
        kind = kinds.get(int(ids[i]))
        if kind is None:
            i += 1
            continue
        j = i
        while j < len(ids) and ids[j] == ids[i]:
            j += 1
        spans.append(MediaSpan(kind, seen[kind], i, j))
        seen[kind] += 1
        i = j
    return spans


def _kind(token: int, tokens: OmniTokenIds) -> str:
    return {tokens.audio_token_id: "audio", tokens.image_token_id: "image"}.get(token, "video")
