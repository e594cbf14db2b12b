"""Datagram sockets between the workers of one node: a frame from one rank to another without ZeroMQ's threads.

A ZeroMQ send wakes the sender's I/O thread, which writes to the socket and
wakes the receiver's I/O thread, which wakes the receiving thread: three
wake-ups per hop, and on a loaded machine each one waits for a core. A loop
split over two ranks makes two hops per step, one after the other. A Unix
datagram goes from the sending thread's syscall to the receiving thread's
poll: one wake-up.

    datagram = [sender rank: u32][more: u8] + up to FRAGMENT bytes of one frame

A frame longer than FRAGMENT goes in pieces (``more`` = 1 on all but the last)
that the receiver joins per sender: datagrams between two sockets keep their
order. The frames are the codec's (``walkserve.protocol.codec``), run token
included, and the socket files sit in the run's 0700 directory, as ZeroMQ's
IPC sockets do.

A send never blocks: when the receiver's queue is full (Linux queues
``net.unix.max_dgram_qlen`` datagrams, 10 by default, per receiving socket)
or the receiver is restarting, the pieces wait in the link's backlog, in
order, and later frames queue behind them; ``flush`` retries (ZeroMQ's PUSH
socket queues the same way, without a bound).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import struct
from collections import deque

from walkserve.protocol.codec import BadMessage, decode
from walkserve.protocol.messages import Message

log = logging.getLogger(__name__)

FRAGMENT = 128 * 1024  # fits the default socket send buffer (net.core.wmem_default, 208 KiB) with room
_HEADER = struct.Struct("<IB")
SEND_BUFFER = 1 << 20  # asked for; the kernel caps it at net.core.wmem_max
_GONE = (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTCONN, errno.EDESTADDRREQ)


def datagrams(sender: int, frame: bytes, fragment: int = FRAGMENT) -> list[bytes]:
    """``frame`` as the datagrams that carry it (one unless it is longer than ``fragment``)."""
    if len(frame) <= fragment:
        return [_HEADER.pack(sender, 0) + frame]
    view = memoryview(frame)
    starts = range(0, len(frame), fragment)
    return [_HEADER.pack(sender, int(i + fragment < len(frame))) + view[i:i + fragment] for i in starts]



def decode_into(out: list[Message], frame: bytes, token: str) -> bool:
    """Append a frame's messages to ``out``; False (logged, nothing appended) for a frame that does not decode."""
    try:
        out.extend(decode(frame, token))
    except BadMessage as e:
        log.warning("dropped a frame: %s", e)
        return False
    return True

class DirectInbox:
    """The datagram socket a worker receives other ranks' frames on (beside its ZeroMQ inbox)."""

    def __init__(self, path: str, token: str):
        self.path, self.token = path, token
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a stale socket of a rank that died
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind(path)
        self.socket.setblocking(False)
        self.parts: dict[int, list[bytes]] = {}  # sender -> pieces of a frame still arriving
        self.bad_frames = 0

    def fileno(self) -> int:
        return self.socket.fileno()

    def receive(self, limit: int = 256) -> list[Message]:
        """Every message whose frame is complete now (up to ``limit`` datagrams), without blocking."""
        out: list[Message] = []
        for _ in range(limit):
            try:
                data = self.socket.recv(FRAGMENT + _HEADER.size)
            except BlockingIOError:
                break
            frame = self._join(data)
            if frame is None:
                continue
            if not decode_into(out, frame, self.token):
                self.bad_frames += 1
        return out

    def _join(self, data: bytes) -> bytes | None:
        if len(data) < _HEADER.size:
            self.bad_frames += 1
            return None
        sender, more = _HEADER.unpack_from(data)
        parts = self.parts.get(sender)
        if more:
            self.parts.setdefault(sender, []).append(data[_HEADER.size:])
            return None
        if parts is None:
            return data[_HEADER.size:]
        del self.parts[sender]
        parts.append(data[_HEADER.size:])
        return b"".join(parts)

    def close(self) -> None:
        self.socket.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class DirectLink:
    """This worker's datagram socket to one other rank's ``DirectInbox``."""

    def __init__(self, path: str, sender: int):
        self.path, self.sender = path, sender
        self.backlog: deque[bytes] = deque()
        self.socket: socket.socket | None = None
        self._connect()

    def _connect(self) -> bool:
        if self.socket is not None:
            self.socket.close()
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.setblocking(False)
        with contextlib.suppress(OSError):
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        try:
            self.socket.connect(self.path)
        except OSError:  # the receiver is not there (yet, or any more): its frames wait in the backlog
            return False
        return True

    def send(self, frame: bytes) -> None:
        """Sends the frame now, or queues it behind the backlog (in order)."""
        self.backlog.extend(datagrams(self.sender, frame))
        self.flush()

    def flush(self) -> bool:
        """Sends what the backlog holds, in order, until the receiver's queue is full; True when it is empty."""
        backlog, reconnected = self.backlog, False
        while backlog:
            try:
                self.socket.send(backlog[0])
            except BlockingIOError:
                return False
            except OSError as e:
                if e.errno in _GONE and not reconnected:  # the receiver restarted: a new socket at its path
                    reconnected = True
                    if self._connect():
                        continue
                if e.errno in _GONE:  # not there now: the frames wait, as ZeroMQ's would
                    return False
                log.error("dropped a datagram for %s: %s", self.path, e)
            backlog.popleft()
        return True

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close()
