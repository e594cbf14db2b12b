"""ZeroMQ endpoints: each process binds one PULL inbox and pushes to its peers' inboxes.

Addresses are IPC paths in the run's 0700 directory, or TCP ports on
127.0.0.1 (ranks configured to use TCP) or on a node's IP (ranks started
through Ray; the conductor then listens on its node's IP too). Every frame is a codec Batch carrying the
run token; frames with another token or that do not decode are dropped and
counted, never executed. Between the workers of one node, frames may go
through a ``direct`` datagram socket instead (``walkserve.transport.direct``):
the Inbox then polls and drains both, and the Outbox sends every frame for such
a peer through its link, so a peer's frames keep their order.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

import zmq

from walkserve.protocol.codec import encode
from walkserve.protocol.messages import Message
from walkserve.transport.direct import DirectInbox, DirectLink, decode_into

log = logging.getLogger(__name__)


class Inbox:
    """The PULL socket a process receives everything on."""

    def __init__(self, ctx: zmq.Context, address: str, token: str):
        self.token = token
        self.socket = ctx.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.address = self.bind(address)
        self.direct: DirectInbox | None = None
        self._bad = 0
        self.poller = zmq.Poller()
        self.poller.register(self.socket, zmq.POLLIN)
        self._ready: tuple[bool, bool] | None = None  # what the last poll found (ZeroMQ, datagrams); None: not polled

    @property
    def bad_frames(self) -> int:
        return self._bad + (self.direct.bad_frames if self.direct is not None else 0)

    def listen_direct(self, path: str) -> None:
        """Receive frames on a datagram socket at ``path`` too (from workers of this node)."""
        self.direct = DirectInbox(path, self.token)
        self.poller.register(self.direct.fileno(), zmq.POLLIN)

    def bind(self, address: str) -> str:
        """Listen on ``address`` too (``tcp://HOST:0`` picks a free port); returns the bound address."""
        self.socket.bind(address)
        if address.startswith("tcp://") and address.endswith(":0"):
            return self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        return address

    def poll(self, timeout_ms: float) -> bool:
        """Wait up to ``timeout_ms`` for a frame; True when one is waiting. The next ``receive`` reads only the
        sockets this found a frame on: after a wait for a peer's datagram, no ZeroMQ read that finds nothing."""
        if self.direct is None:
            return bool(self.socket.poll(timeout_ms))
        ready = dict(self.poller.poll(timeout_ms))
        self._ready = (self.socket in ready, self.direct.fileno() in ready) if ready else None
        return bool(ready)

    def receive(self, limit: int = 256) -> list[Message]:
        """Every message waiting now (up to ``limit`` frames), without blocking: on the sockets the last ``poll`` found
        a frame on, or on both when there was no poll since the last ``receive`` (a frame that came after the poll
        waits for the next one, which finds it at once)."""
        from_zmq, from_direct = self._ready or (True, True)
        self._ready = None
        out: list[Message] = []
        if from_zmq:
            self._receive_zmq(out, limit)
        if self.direct is not None and from_direct:
            out.extend(self.direct.receive(limit))
        return out

    def _receive_zmq(self, out: list[Message], limit: int) -> None:
        for _ in range(limit):
            try:
                frame = self.socket.recv(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            if not decode_into(out, frame, self.token):
                self._bad += 1

    def close(self) -> None:
        self.socket.close(0)
        if self.direct is not None:
            self.direct.close()


class Outbox:
    """PUSH sockets to named peers; messages queue per peer and leave together on ``flush``."""

    def __init__(self, ctx: zmq.Context, token: str):
        self.ctx = ctx
        self.token = token
        self.addresses: dict[object, str] = {}
        self.sockets: dict[object, zmq.Socket] = {}
        self.pending: dict[object, list[Message]] = defaultdict(list)
        self.links: dict[object, DirectLink] = {}  # peers reached through a datagram socket instead
        self.send_s: dict[object, float] = defaultdict(float)  # per peer: time spent encoding and sending (metrics)
        self.frames: dict[object, int] = defaultdict(int)  # per peer: frames sent
        self.direct_frames: dict[object, int] = defaultdict(int)  # per peer: of those, through its link

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

    def link(self, peer: object, path: str, sender: int) -> None:
        """From now on, frames for ``peer`` go through a datagram socket to ``path`` (``sender``: our rank). A link
        to that path stays as it is, its backlog too (a peer restarted at the same path is reconnected on send)."""
        old = self.links.get(peer)
        if old is not None and old.path == path:
            return
        self.unlink(peer)
        self.links[peer] = DirectLink(path, sender)

    def unlink(self, peer: object) -> None:
        """Frames for ``peer`` go through ZeroMQ again."""
        old = self.links.pop(peer, None)
        if old is not None:
            old.close()

    @property
    def backlog(self) -> bool:
        """Frames wait for a peer whose queue was full: ``flush`` again soon."""
        return any(link.backlog for link in self.links.values())

    def put(self, peer: object, message: Message) -> None:
        self.pending[peer].append(message)

    def flush(self) -> None:
        for peer, messages in self.pending.items():
            if messages:
                link, sock = self.links.get(peer), self.sockets.get(peer)
                t0 = time.perf_counter()
                if link is not None:
                    link.send(encode(self.token, messages))
                    self.direct_frames[peer] += 1
                elif sock is None:
                    log.warning("dropping %d message(s) for unknown peer %r", len(messages), peer)
                    continue
                else:
                    sock.send(encode(self.token, messages), copy=False)
                self.frames[peer] += 1
                self.send_s[peer] += time.perf_counter() - t0
        self.pending.clear()
        for link in self.links.values():
            if link.backlog:
                link.flush()

    def send_now(self, peer: object, message: Message) -> None:
        self.put(peer, message)
        self.flush()

    def close(self, linger_ms: int = 0) -> None:
        """Close every socket; ``linger_ms`` > 0 first lets queued messages go out for up to that long."""
        for sock in self.sockets.values():
            sock.close(linger_ms)
        self.sockets.clear()
        for link in self.links.values():
            link.close()
        self.links.clear()
