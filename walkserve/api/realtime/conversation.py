"""Conversation: the session's items in order, and the chat messages they make for each response.

An item is a message (system, user or assistant) with parts. User audio is held as pcm16 at 24 kHz and
handed to the processor as float32 with its rate, exactly as ``/v1/chat/completions`` hands a decoded
``input_audio`` part (the processor resamples it to the audio encoder's rate). An assistant message enters
the prompt as its text (the transcript of a spoken answer): what the thinker said, never its audio.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from walkserve.api.errors import ApiError
from walkserve.api.realtime.events import invalid, new_id
from walkserve.api.realtime.session_config import RATE
from walkserve.core.array import ArrayData

ROLES = {"system": ("input_text",), "user": ("input_text", "input_audio"), "assistant": ("output_text", "output_audio")}


@dataclass
class Part:
    type: str  # input_text | input_audio | output_text | output_audio
    text: str | None = None  # input_text / output_text; the transcript of output_audio
    pcm: bytes = b""  # input_audio: pcm16 mono 24 kHz
    samples: int = 0  # output_audio: samples sent to the client (24 kHz), as truncated

    def describe(self) -> dict[str, Any]:
        if self.type in ("input_text", "output_text"):
            return {"type": self.type, "text": self.text}
        return {"type": self.type, "transcript": self.text}

    def payload(self) -> dict[str, Any]:
        """The processor's content part (text, or float32 audio with its rate)."""
        if self.type == "input_audio":
            samples = np.frombuffer(self.pcm, "<i2").astype(np.float32) / 32768.0
            return {"type": "audio", "audio": ArrayData("float32", (len(samples),), samples.tobytes()),
                    "sample_rate": RATE, "format": "pcm16"}
        return {"type": "text", "text": self.text or ""}


@dataclass
class Item:
    role: str
    parts: list[Part]
    status: str = "completed"
    id: str = field(default_factory=lambda: new_id("item"))

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "object": "realtime.item", "type": "message", "role": self.role, "status": self.status,
                "content": [p.describe() for p in self.parts]}


class Conversation:
    def __init__(self) -> None:
        self.items: list[Item] = []

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert after ``previous_item_id`` (None: at the end; "root": first); returns the id before it."""
        if previous_item_id is None:
            index = len(self.items)
        elif previous_item_id == "root":
            index = 0
        else:
            index = self._index(previous_item_id, "previous_item_id") + 1
        self.items.insert(index, item)
        return self.items[index - 1].id if index else None

    def delete(self, item_id: str) -> None:
        del self.items[self._index(item_id, "item_id")]

    def get(self, item_id: str) -> Item:
        return self.items[self._index(item_id, "item_id")]

    def messages(self, instructions: str) -> list[dict[str, Any]]:
        """The chat messages of the conversation so far, the session's instructions as the system message."""
        out = [{"role": "system", "content": [{"type": "text", "text": instructions}]}] if instructions else []
        return out + [{"role": i.role, "content": [p.payload() for p in i.parts]} for i in self.items]

    def _index(self, item_id: str, param: str) -> int:
        for i, item in enumerate(self.items):
            if item.id == item_id:
                return i
        raise ApiError(400, f"no item {item_id!r} in this conversation", param, "item_not_found")


def item_from_client(value: Any, max_pcm_bytes: int) -> Item:
    """A ``conversation.item.create``'s item: a message whose parts its role allows."""
    if not isinstance(value, dict) or value.get("type", "message") != "message":
        raise ApiError(400, "only message items are supported here (no function calls or MCP items)", "item.type",
                       "unsupported_parameter")
    role, content = value.get("role"), value.get("content")
    if not isinstance(role, str) or role not in ROLES:
        raise invalid("item.role must be system, user or assistant", "item.role")
    if not isinstance(content, list) or not content:
        raise invalid("item.content must be a non-empty list of parts", "item.content")
    parts = [_part(p, role, f"item.content[{i}]", max_pcm_bytes) for i, p in enumerate(content)]
    item = Item(role, parts)
    if isinstance(value.get("id"), str) and value["id"]:
        item.id = value["id"][:64]
    return item


def _part(value: Any, role: str, param: str, max_pcm_bytes: int) -> Part:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ROLES[role]:
        raise ApiError(400, f"a {role} message takes parts of type {', '.join(ROLES[role])}", f"{param}.type",
                       "unsupported_parameter")
    if kind == "input_audio":
        pcm = decode_pcm(value.get("audio"), f"{param}.audio", max_pcm_bytes)
        if not pcm:  # as the chat route's: no model answers an empty clip, so every later response would fail
            raise ApiError(400, "the audio is empty", f"{param}.audio", "invalid_audio")
        return Part(kind, pcm=pcm)
    text = value.get("transcript") if kind == "output_audio" else value.get("text")
    if not isinstance(text, str):
        raise invalid(f"{param} needs its text as a string", param)
    return Part(kind, text=text)


def decode_pcm(data: Any, param: str, max_bytes: int) -> bytes:
    """Base64 pcm16 (24 kHz mono) -> its bytes: whole samples, within ``max_bytes``."""
    if not isinstance(data, str):
        raise invalid(f"{param} must be base64 pcm16 audio", param)
    if len(data) > 4 * max_bytes // 3 + 4:
        raise ApiError(400, f"{param} holds more audio than this session buffers", param, "audio_too_long")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"{param} is not valid base64", param, "invalid_base64") from None
    if len(raw) % 2:
        raise ApiError(400, f"{param} is not pcm16: an odd number of bytes", param, "invalid_audio_format")
    return raw
