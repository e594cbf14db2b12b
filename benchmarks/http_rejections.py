"""429s at the HTTP layer: how fast a stream over capacity is answered while the admitted streams play.

The load sweep measures rejections in the engine (``AdmissionRejected`` from
``generate``); a client sees them through the HTTP server, so this fills the
capacity with long streams, serves the same engine over HTTP (uvicorn on a
socket bound as ``walkserve serve`` binds it) and sends ``n`` streams over
capacity one at a time, each followed by ``/health``: the time from sending
to the whole answer, per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

FILL_FRAMES = 400  # long enough to still play while the probes run
FIRST_AUDIO_S = 60.0  # the fill streams must all have started by then


@dataclass
class Rejections:
    streams: int  # streams playing while the probes ran
    statuses: list[int] = field(default_factory=list)
    reject_ms: list[float] = field(default_factory=list)  # answers that were 429
    health_ms: list[float] = field(default_factory=list)

    def line(self) -> str:
        from benchmarks.common import pct

        other = [s for s in self.statuses if s != 429]
        return (f"- 429 at the HTTP layer ({len(self.statuses)} streams over capacity sent one at a time while "
                f"{self.streams} streams played): p50 {pct(self.reject_ms, 0.5):.1f} ms, p99 "
                f"{pct(self.reject_ms, 0.99):.1f} ms; /health between them p50 {pct(self.health_ms, 0.5):.1f} ms, "
                f"p99 {pct(self.health_ms, 0.99):.1f} ms" + (f"; not 429: {other}" if other else ""))


async def http_rejections(engine, make, streams: int, route: str, body: dict, n: int = 30) -> Rejections:
    """``make(n, frames)``: real-time specs to fill ``streams`` slots; ``body``: one over-capacity request."""
    import httpx
    import uvicorn

    from walkserve.api import ServerConfig, build_app
    from walkserve.cli.serve_cmd import bind

    started = [asyncio.Event() for _ in range(streams)]
    fill = [asyncio.create_task(_play(engine, spec, ev)) for spec, ev in zip(make(streams, FILL_FRAMES), started)]
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(build_app(engine, ServerConfig()), log_level="warning", access_log=False))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    out = Rejections(streams)
    try:
        await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in started)), FIRST_AUDIO_S)
        while not server.started:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}", timeout=30) as client:
            for _ in range(n):
                status, ms = await _timed(client.post(route, json=body))
                out.statuses.append(status)
                if status == 429:
                    out.reject_ms.append(ms)
                out.health_ms.append((await _timed(client.get("/health")))[1])
    finally:
        for task in fill:
            task.cancel()
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.gather(*fill, serving, return_exceptions=True)
    return out


async def _play(engine, spec, started: asyncio.Event) -> None:
    async for out in engine.generate(spec):
        if getattr(out, "modality", "") == "audio":
            started.set()


async def _timed(request) -> tuple[int, float]:
    t0 = time.perf_counter()
    response = await request
    return response.status_code, (time.perf_counter() - t0) * 1e3
