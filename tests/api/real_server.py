"""Helpers for tests against the real runtime: an in-thread server over AsyncEngine, a `walkserve serve`
subprocess, metric scraping, and process / shared-memory bookkeeping."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from tests.polling import alive, wait_for  # noqa: F401  (re-exported for the API tests)
from walkserve.api import ServerConfig, build_app
from walkserve.cli.serve_cmd import bind
from walkserve.core.config import RuntimeConfig
from walkserve.core.outputs import OutputEvent, RequestFinished
from walkserve.core.request import RequestSpec
from walkserve.entrypoint.engine import AsyncEngine
from walkserve.transport import shm


@dataclass
class InThreadServer:
    """A live HTTP server over a real AsyncEngine; ``call`` runs a coroutine on the server's loop."""

    url: str
    engine: AsyncEngine
    loop: asyncio.AbstractEventLoop

    def call(self, coro, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def run_direct(self, spec: RequestSpec) -> tuple[list[OutputEvent], RequestFinished | None]:
        """The request straight through the engine (no HTTP): its events and its finish."""

        async def collect():
            events, finished = [], None
            async for out in self.engine.generate(spec):
                if isinstance(out, RequestFinished):
                    finished = out
                else:
                    events.append(out)
            return events, finished

        return self.call(collect())


@contextlib.contextmanager
def in_thread_server(family: str, model_path: Path, runtime: RuntimeConfig | None = None, placement: Any = None,
                     **config) -> Iterator[InThreadServer]:
    """Start the runtime for ``family`` (on ``placement``: a mapping or YAML path; default: the model's) and
    serve it with uvicorn on a loop in a background thread."""
    sock = bind("127.0.0.1", 0)  # as `walkserve serve` binds it
    port = sock.getsockname()[1]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="real-server-loop", daemon=True)
    thread.start()
    engine = None
    try:
        start = AsyncEngine.start(family, placement, model_path=str(model_path), config=runtime or RuntimeConfig())
        engine = asyncio.run_coroutine_threadsafe(start, loop).result(180)
        server_config = ServerConfig(port=port, **config)
        app = build_app(engine, server_config)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2,
                                               ws_max_size=server_config.ws_max_size))
        serving = asyncio.run_coroutine_threadsafe(server.serve(sockets=[sock]), loop)
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline and not serving.done(), "uvicorn did not start"
            time.sleep(0.01)
        try:
            yield InThreadServer(f"http://127.0.0.1:{port}", engine, loop)
        finally:
            server.should_exit = True
            serving.result(20)
    finally:
        if engine is not None:
            asyncio.run_coroutine_threadsafe(engine.shutdown(drain_s=0), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        sock.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """``walkserve serve ARGS`` as a subprocess (stdout and stderr merged, line-buffered text)."""
    command = [sys.executable, "-m", "walkserve.cli.main", "serve", *args]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env, text=True)


class OutputReader:
    """Collects a subprocess's output lines in a thread (so its pipe never fills)."""

    def __init__(self, process: subprocess.Popen):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def join(self, timeout: float = 10) -> None:
        self._thread.join(timeout)


def wait_healthy(url: str, process: subprocess.Popen, output: OutputReader, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"server exited with {process.returncode}:\n{output.text()}"
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"server did not become healthy:\n{output.text()}")


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics: (name, sorted labels) -> value."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def segments_of(pid: int) -> list[str]:
    """Shared-memory segments of runs started by process ``pid`` (run ids begin with its pid in hex)."""
    prefix = f"{pid:x}"
    return [name for name in shm.segments() if name.split("-")[1][:-6] == prefix]
