"""What the sync and async clients share: routes, payloads, and the SSE / NDJSON line parsers."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

from walkserve.client.errors import APIError

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT_S = 600.0


def headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def with_model(payload: dict[str, Any], model: str | None) -> dict[str, Any]:
    if model is not None and "model" not in payload:
        payload["model"] = model
    return {k: v for k, v in payload.items() if v is not None}


class SSEParser:
    """Feeds text lines; ``events`` yields each ``data:`` JSON payload; [DONE] ends the stream.
    An event with an ``error`` key raises APIError."""

    def __init__(self) -> None:
        self.done = False
        self._data: list[str] = []

    def feed(self, line: str) -> list[Any]:
        out = []
        if line == "":
            if self._data:
                out.extend(self._flush())
        elif line.startswith("data:"):
            self._data.append(line[5:].lstrip())
        return out

    def close(self) -> list[Any]:
        return self._flush() if self._data else []

    def _flush(self) -> list[Any]:
        data, self._data = "\n".join(self._data), []
        if data == "[DONE]":
            self.done = True
            return []
        event = json.loads(data)
        if isinstance(event, dict) and "error" in event:
            raise APIError.from_envelope(200, event)
        return [event]


def parse_ndjson_line(line: str) -> dict[str, Any] | None:
    if not line.strip():
        return None
    event = json.loads(line)
    if event.get("type") == "error":
        raise APIError.from_envelope(200, event)
    return event


def speech_payload(input: str, voice: str | None, response_format: str, speed: float, stream_format: str | None, extra: dict) -> dict[str, Any]:
    return {"input": input, "voice": voice, "response_format": response_format, "speed": speed,
            "stream_format": stream_format, **extra}


def image_form(prompt: str, n: int, size: str | None, output_format: str, model: str | None) -> dict[str, str]:
    form = {"prompt": prompt, "n": str(n), "output_format": output_format}
    if size:
        form["size"] = size
    if model:
        form["model"] = model
    return form


def image_bytes(response: dict[str, Any]) -> list[bytes]:
    return [base64.b64decode(item["b64_json"]) for item in response.get("data", [])]


def speech_delta(event: dict[str, Any]) -> bytes | None:
    """Audio bytes of a ``speech.audio.delta`` event; None for other events."""
    if event.get("type") == "speech.audio.delta":
        return base64.b64decode(event["audio"])
    return None


def text_messages(messages: str | Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """A plain string is one user message."""
    return [{"role": "user", "content": messages}] if isinstance(messages, str) else list(messages)
