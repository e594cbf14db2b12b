"""StreamResponse: an async iterator of byte chunks as a chunked HTTP response.

The status line waits for the first chunk, so an error raised before any
output (a full queue, a bad input found late) is still an ordinary HTTP
error. A client disconnect cancels the iterator, which closes it and so
aborts the request(s) behind it. An error after the first chunk becomes one
in-stream error chunk (``error_chunk``) and the body ends normally; a stream
with no way to carry an error (raw audio) is cut off instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from walkserve.api.asgi_reply import send_error
from walkserve.api.disconnect import wait_disconnect
from walkserve.api.errors import ApiError, to_api_error

log = logging.getLogger(__name__)


class StreamResponse(Response):
    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        media_type: str,
        headers: dict[str, str] | None = None,
        error_chunk: Callable[[ApiError], bytes] | None = None,
    ):
        self.chunks = chunks
        self.status_code = 200
        self.media_type = media_type
        self.error_chunk = error_chunk
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = asyncio.ensure_future(self._pump(send))
        watcher = asyncio.ensure_future(wait_disconnect(receive))
        try:
            await asyncio.wait({pump, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not pump.done():
                pump.cancel()  # the client went away: closing the iterator aborts the work
            await asyncio.gather(pump, watcher, return_exceptions=True)
        if not pump.cancelled() and pump.exception() is not None:
            raise pump.exception()

    async def _pump(self, send: Send) -> None:
        started = False
        try:
            async with contextlib.aclosing(self.chunks) as chunks:
                async for chunk in chunks:
                    if not started:
                        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                        started = True
                    if chunk:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except asyncio.CancelledError:
            raise
        except Exception as e:
            error = to_api_error(e)
            if not started:
                await send_error(send, error)
                return
            if self.error_chunk is None:
                raise  # no in-band error for this media type: cut the body off
            await send({"type": "http.response.body", "body": self.error_chunk(error), "more_body": True})
        if not started:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
