"""ZeroMQ endpoints: each process binds one PULL inbox and pushes to its peers' inboxes.

Addresses are IPC paths in the run's 0700 directory, or TCP ports on
127.0.0.1 (ranks configured to use TCP) or on a node's IP (ranks started
through Ray; the conductor then listens on its node's IP too). Every frame is a codec Batch carrying the
run token; frames with another token or that do not decode are dropped and
counted, never executed.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

import zmq

from walkserve.protocol.codec import BadMessage, decode, encode
from walkserve.protocol.messages import Message

log = logging.getLogger(__name__)


class Inbox:
    """The PULL socket a process receives everything on."""

    def __init__(self, ctx: zmq.Context, address: str, token: str):
        self.token = token
        self.socket = ctx.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.address = self.bind(address)
        self.bad_frames = 0

    def bind(self, address: str) -> str:
        """Listen on ``address`` too (``tcp://HOST:0`` picks a free port); returns the bound address."""
        self.socket.bind(address)
        if address.startswith("tcp://") and address.endswith(":0"):
            return self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        return address

    def poll(self, timeout_ms: float) -> bool:
        return bool(self.socket.poll(timeout_ms))

    def receive(self, limit: int = 256) -> list[Message]:
        """Every message waiting now (up to ``limit`` frames), without blocking."""
        out: list[Message] = []
        for _ in range(limit):
            try:
                frame = self.socket.recv(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
            try:
                out.extend(decode(frame, self.token))
            except BadMessage as e:
                self.bad_frames += 1
                log.warning("dropped a frame: %s", e)
        return out

    def close(self) -> None:
        self.socket.close(0)


class Outbox:
    """PUSH sockets to named peers; messages queue per peer and leave together on ``flush``."""

    def __init__(self, ctx: zmq.Context, token: str):
        self.ctx = ctx
        self.token = token
        self.addresses: dict[object, str] = {}
        self.sockets: dict[object, zmq.Socket] = {}
        self.pending: dict[object, list[Message]] = defaultdict(list)
        self.send_s: dict[object, float] = defaultdict(float)  # per peer: time spent encoding and sending (metrics)

    def connect(self, peer: object, address: str) -> None:
        old = self.sockets.pop(peer, None)
        if old is not None:
            old.close(0)
        self.addresses[peer] = address
        sock = self.ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 2000)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.connect(address)
        self.sockets[peer] = sock

    def put(self, peer: object, message: Message) -> None:
        self.pending[peer].append(message)

    def flush(self) -> None:
        for peer, messages in self.pending.items():
            if messages:
                sock = self.sockets.get(peer)
                if sock is None:
                    log.warning("dropping %d message(s) for unknown peer %r", len(messages), peer)
                else:
                    t0 = time.perf_counter()
                    sock.send(encode(self.token, messages), copy=False)
                    self.send_s[peer] += time.perf_counter() - t0
        self.pending.clear()

    def send_now(self, peer: object, message: Message) -> None:
        self.put(peer, message)
        self.flush()

    def close(self, linger_ms: int = 0) -> None:
        """Close every socket; ``linger_ms`` > 0 first lets queued messages go out for up to that long."""
        for sock in self.sockets.values():
            sock.close(linger_ms)
        self.sockets.clear()
