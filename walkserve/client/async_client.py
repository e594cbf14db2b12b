"""AsyncClient: the asyncio SDK (same methods as Client, awaited; streams are async iterators)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import httpx

from walkserve.client import protocol as p
from walkserve.client.errors import APIError


class AsyncClient:
    def __init__(self, base_url: str = p.DEFAULT_BASE_URL, api_key: str | None = None,
                 model: str | None = None, timeout: float = p.DEFAULT_TIMEOUT_S):
        self.model = model
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=p.headers(api_key), timeout=timeout)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- plumbing ---------------------------------------------------------------------------------
    async def _post(self, path: str, payload: dict[str, Any]) -> httpx.Response:
        response = await self._http.post(path, json=p.with_model(payload, self.model))
        if response.status_code >= 400:
            raise APIError.from_response(response.status_code, response.content, response.headers)
        return response

    async def _lines(self, path: str, payload: dict[str, Any]) -> AsyncIterator[str]:
        async with self._http.stream("POST", path, json=p.with_model(payload, self.model)) as response:
            if response.status_code >= 400:
                raise APIError.from_response(response.status_code, await response.aread(), response.headers)
            async for line in response.aiter_lines():
                yield line

    async def _sse(self, path: str, payload: dict[str, Any]) -> AsyncIterator[Any]:
        parser = p.SSEParser()
        async for line in self._lines(path, payload):
            for event in parser.feed(line):
                yield event
            if parser.done:
                return
        for event in parser.close():
            yield event

    # -- routes -----------------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        response = await self._http.get("/health")
        return {**response.json(), "http_status": response.status_code}

    async def models(self) -> list[dict[str, Any]]:
        response = await self._http.get("/v1/models")
        if response.status_code >= 400:
            raise APIError.from_response(response.status_code, response.content, response.headers)
        return response.json()["data"]

    async def completions(self, prompt: str | list[int], **params: Any) -> dict[str, Any]:
        return (await self._post("/v1/completions", {"prompt": prompt, "stream": False, **params})).json()

    def completions_stream(self, prompt: str | list[int], **params: Any) -> AsyncIterator[dict[str, Any]]:
        return self._sse("/v1/completions", {"prompt": prompt, "stream": True, **params})

    async def chat(self, messages: str | Iterable[dict[str, Any]], **params: Any) -> dict[str, Any]:
        payload = {"messages": p.text_messages(messages), "stream": False, **params}
        return (await self._post("/v1/chat/completions", payload)).json()

    def chat_stream(self, messages: str | Iterable[dict[str, Any]], **params: Any) -> AsyncIterator[dict[str, Any]]:
        return self._sse("/v1/chat/completions", {"messages": p.text_messages(messages), "stream": True, **params})

    async def speech(self, input: str, *, voice: str | None = None, response_format: str = "wav", speed: float = 1.0, **params: Any) -> bytes:
        return (await self._post("/v1/audio/speech", p.speech_payload(input, voice, response_format, speed, None, params))).content

    async def speech_to_file(self, path: str | Path, input: str, **kwargs: Any) -> Path:
        target = Path(path)
        target.write_bytes(await self.speech(input, **kwargs))
        return target

    async def speech_stream(self, input: str, *, voice: str | None = None, response_format: str = "pcm", speed: float = 1.0,
                            stream_format: str = "audio", **params: Any) -> AsyncIterator[bytes]:
        payload = p.speech_payload(input, voice, response_format, speed, stream_format, params)
        if stream_format == "sse":
            async for event in self._sse("/v1/audio/speech", payload):
                if (data := p.speech_delta(event)) is not None:
                    yield data
            return
        async with self._http.stream("POST", "/v1/audio/speech", json=p.with_model(payload, self.model)) as response:
            if response.status_code >= 400:
                raise APIError.from_response(response.status_code, await response.aread(), response.headers)
            async for chunk in response.aiter_bytes():
                yield chunk

    async def images(self, prompt: str, *, n: int = 1, size: str | None = None, output_format: str = "png", **params: Any) -> list[bytes]:
        payload = {"prompt": prompt, "n": n, "size": size, "output_format": output_format, **params}
        return p.image_bytes((await self._post("/v1/images/generations", payload)).json())

    async def image_edit(self, image: bytes, prompt: str, *, mask: bytes | None = None, n: int = 1, size: str | None = None,
                         output_format: str = "png") -> list[bytes]:
        files = {"image": ("image.png", image, "image/png")}
        if mask is not None:
            files["mask"] = ("mask.png", mask, "image/png")
        response = await self._http.post("/v1/images/edits", data=p.image_form(prompt, n, size, output_format, self.model), files=files)
        if response.status_code >= 400:
            raise APIError.from_response(response.status_code, response.content, response.headers)
        return p.image_bytes(response.json())

    async def generate(self, inputs: dict[str, Any], *, task: str = "generate", modalities: list[str] | None = None,
                       sampling: dict[str, Any] | None = None, params: dict[str, Any] | None = None, **extra: Any) -> AsyncIterator[dict[str, Any]]:
        payload = {"inputs": inputs, "task": task, "modalities": modalities, "sampling": sampling,
                   "params": params or {}, "stream": True, **extra}
        async for line in self._lines("/v1/generate", payload):
            if (event := p.parse_ndjson_line(line)) is not None:
                yield event
