"""ServeRun: one ``walkserve serve`` run inside the event loop: load, start the runtime, serve, stop."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import time
from pathlib import Path

from walkserve.api.config import ServerConfig
from walkserve.api.server import serve_async
from walkserve.cli.serve_banner import base_url, ready_banner, say
from walkserve.cli.serve_target import ServeTarget
from walkserve.core.config import RuntimeConfig
from walkserve.models.base import Model

PROGRESS_EVERY_S = 10.0
INTERRUPTED = 130


class ServeRun:
    """Loads ``target``, starts its runtime on ``placement``, serves it on ``sock`` until a stop signal.

    A stop signal while the runtime starts cancels the start (its processes
    are stopped) and ``main`` returns 130; once serving, the server drains
    and then the runtime shuts down, and ``main`` returns 0.
    """

    def __init__(self, target: ServeTarget, placement: Path | None, runtime: RuntimeConfig,
                 config: ServerConfig, sock: socket.socket):
        self.target, self.placement, self.runtime = target, placement, runtime
        self.config, self.sock = config, sock
        self.t0 = time.monotonic()

    async def main(self) -> int:
        model = self.load()
        try:
            with self._sigterm_cancels():
                engine = await self.start(model)
        except asyncio.CancelledError:
            say("interrupted while starting; the runtime was stopped")
            return INTERRUPTED
        url = base_url(self.config.host, self.sock.getsockname()[1])

        def on_started() -> None:
            print(ready_banner(engine.card, url, bool(self.config.api_key), time.monotonic() - self.t0), flush=True)

        await serve_async(engine, self.config, [self.sock], on_started)
        say("stopped: requests drained, runtime shut down")
        return 0

    def load(self) -> Model:
        """Read the model's description and check its files (weights load later, in the workers)."""
        from walkserve.models.registry import load_model

        say(f"loading model: {describe(self.target)} …")
        t = time.monotonic()
        model = load_model(self.target.ref())
        model.components()  # checks that the weight files exist and are readable
        card = model.processor().card()
        say(f"loaded {card.id!r}: {card.description or card.family} ({time.monotonic() - t:.1f} s)")
        if card.random_weights:
            say("note: RANDOM WEIGHTS (an untrained checkpoint): the output is noise; /v1/models says random_weights")
        return model

    async def start(self, model: Model):
        from walkserve.entrypoint.engine import AsyncEngine, device_total_bytes, resolve_placement
        from walkserve.placement.plan import parse_placement

        data, source = resolve_placement(model, str(self.placement) if self.placement else None)
        for line in model.memory_report(parse_placement(data, source), device_total_bytes):
            say(f"memory: {line}")
        ranks = ", ".join(f"rank {r['id']} on {r['device']}" for r in data["ranks"])
        say(f"starting workers ({source}: {ranks}); they load the weights …")
        t = time.monotonic()
        ticker = asyncio.ensure_future(_tick(t))
        try:
            engine = await AsyncEngine.start(model, str(self.placement) if self.placement else None, self.runtime)
        finally:
            ticker.cancel()
        say(f"runtime ready in {time.monotonic() - t:.1f} s")
        return engine

    @contextlib.contextmanager
    def _sigterm_cancels(self):
        """While starting, SIGTERM cancels like Ctrl-C (asyncio.run already maps SIGINT to a cancel)."""
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        try:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        except (NotImplementedError, RuntimeError):  # not the main thread
            yield
            return
        try:
            yield
        finally:
            loop.remove_signal_handler(signal.SIGTERM)


async def _tick(t0: float) -> None:
    while True:
        await asyncio.sleep(PROGRESS_EVERY_S)
        say(f"… still starting ({time.monotonic() - t0:.0f} s)")


def describe(target: ServeTarget) -> str:
    how = " (family read from the checkpoint)" if target.detected else ""
    snac = target.options.get("snac_path")
    return f"{target.family}{how} from {target.path}" + (f", SNAC from {snac}" if snac else "")
