"""Client: the synchronous SDK."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx

from walkserve.client import protocol as p
from walkserve.client.errors import APIError


class Client:
    """A walkserve server. ``model`` None lets the server use the model it serves.

    Streaming methods return iterators that hold the connection; leave the
    loop early (or ``close()`` the iterator) to cancel the request on the server.
    """

    def __init__(self, base_url: str = p.DEFAULT_BASE_URL, api_key: str | None = None,
                 model: str | None = None, timeout: float = p.DEFAULT_TIMEOUT_S):
        self.model = model
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=p.headers(api_key), timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------------
    def _post(self, path: str, payload: dict[str, Any]) -> httpx.Response:
        response = self._http.post(path, json=p.with_model(payload, self.model))
        if response.status_code >= 400:
            raise APIError.from_response(response.status_code, response.content, response.headers)
        return response

    def _lines(self, path: str, payload: dict[str, Any]) -> Iterator[str]:
        with self._http.stream("POST", path, json=p.with_model(payload, self.model)) as response:
            if response.status_code >= 400:
                raise APIError.from_response(response.status_code, response.read(), response.headers)
            yield from response.iter_lines()

    def _sse(self, path: str, payload: dict[str, Any]) -> Iterator[Any]:
        parser = p.SSEParser()
        for line in self._lines(path, payload):
            yield from parser.feed(line)
            if parser.done:
                return
        yield from parser.close()

    # -- routes -----------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """The health report (``ok`` false while starting or draining); never raises for 503."""
        response = self._http.get("/health")
        return {**response.json(), "http_status": response.status_code}

    def models(self) -> list[dict[str, Any]]:
        response = self._http.get("/v1/models")
        if response.status_code >= 400:
            raise APIError.from_response(response.status_code, response.content, response.headers)
        return response.json()["data"]

    def completions(self, prompt: str | list[int], **params: Any) -> dict[str, Any]:
        return self._post("/v1/completions", {"prompt": prompt, "stream": False, **params}).json()

    def completions_stream(self, prompt: str | list[int], **params: Any) -> Iterator[dict[str, Any]]:
        """OpenAI ``text_completion`` chunks (the usage chunk too, with stream_options)."""
        return self._sse("/v1/completions", {"prompt": prompt, "stream": True, **params})

    def chat(self, messages: str | Iterable[dict[str, Any]], **params: Any) -> dict[str, Any]:
        payload = {"messages": p.text_messages(messages), "stream": False, **params}
        return self._post("/v1/chat/completions", payload).json()

    def chat_stream(self, messages: str | Iterable[dict[str, Any]], **params: Any) -> Iterator[dict[str, Any]]:
        """OpenAI ``chat.completion.chunk`` dicts."""
        return self._sse("/v1/chat/completions", {"messages": p.text_messages(messages), "stream": True, **params})

    def speech(self, input: str, *, voice: str | None = None, response_format: str = "wav", speed: float = 1.0, **params: Any) -> bytes:
        return self._post("/v1/audio/speech", p.speech_payload(input, voice, response_format, speed, None, params)).content

    def speech_to_file(self, path: str | Path, input: str, **kwargs: Any) -> Path:
        target = Path(path)
        target.write_bytes(self.speech(input, **kwargs))
        return target

    def speech_stream(self, input: str, *, voice: str | None = None, response_format: str = "pcm", speed: float = 1.0,
                      stream_format: str = "audio", **params: Any) -> Iterator[bytes]:
        """Encoded audio chunks as the server produces them (``stream_format`` "audio" or "sse")."""
        payload = p.speech_payload(input, voice, response_format, speed, stream_format, params)
        if stream_format == "sse":
            for event in self._sse("/v1/audio/speech", payload):
                if (data := p.speech_delta(event)) is not None:
                    yield data
            return
        with self._http.stream("POST", "/v1/audio/speech", json=p.with_model(payload, self.model)) as response:
            if response.status_code >= 400:
                raise APIError.from_response(response.status_code, response.read(), response.headers)
            yield from response.iter_bytes()

    def images(self, prompt: str, *, n: int = 1, size: str | None = None, output_format: str = "png", **params: Any) -> list[bytes]:
        payload = {"prompt": prompt, "n": n, "size": size, "output_format": output_format, **params}
        return p.image_bytes(self._post("/v1/images/generations", payload).json())

    def image_edit(self, image: bytes, prompt: str, *, mask: bytes | None = None, n: int = 1, size: str | None = None,
                   output_format: str = "png") -> list[bytes]:
        files = {"image": ("image.png", image, "image/png")}
        if mask is not None:
            files["mask"] = ("mask.png", mask, "image/png")
        data = p.image_form(prompt, n, size, output_format, self.model)
        response = self._http.post("/v1/images/edits", data=data, files=files)
        if response.status_code >= 400:
            raise APIError.from_response(response.status_code, response.content, response.headers)
        return p.image_bytes(response.json())

    def generate(self, inputs: dict[str, Any], *, task: str = "generate", modalities: list[str] | None = None,
                 sampling: dict[str, Any] | None = None, params: dict[str, Any] | None = None, **extra: Any) -> Iterator[dict[str, Any]]:
        """NDJSON events of /v1/generate: ``output`` events, then one ``finished`` event."""
        payload = {"inputs": inputs, "task": task, "modalities": modalities, "sampling": sampling,
                   "params": params or {}, "stream": True, **extra}
        for line in self._lines("/v1/generate", payload):
            if (event := p.parse_ndjson_line(line)) is not None:
                yield event
