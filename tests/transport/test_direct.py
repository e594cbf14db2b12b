"""Datagram links between the workers of one node: frames whole and in order, big ones in pieces, never blocking."""

from __future__ import annotations

import socket

import pytest
import zmq

from walkserve.protocol import messages as m
from walkserve.protocol.codec import decode, encode
from walkserve.transport import direct
from walkserve.transport.direct import DirectInbox, DirectLink, datagrams
from walkserve.transport.ipc import Inbox, Outbox


def _drain(inbox, want: int) -> list:
    got = []
    for _ in range(100):
        got += inbox.receive()
        if len(got) >= want:
            break
    return got


def test_a_frame_longer_than_a_fragment_arrives_whole_between_frames_of_another_sender(tmp_path):
    inbox = DirectInbox(str(tmp_path / "r0.dgram"), "tok")
    one, two = DirectLink(inbox.path, 1), DirectLink(inbox.path, 2)
    big = m.Abort("x" * (3 * direct.FRAGMENT))
    try:
        pieces = datagrams(1, encode("tok", [big]))
        assert len(pieces) == 4 and all(len(p) <= direct.FRAGMENT + 5 for p in pieces)
        # the pieces of sender 1's frame interleave with sender 2's frames: joined per sender
        for piece, small in zip(pieces, ["a", "b", "c", "d"], strict=True):
            one.backlog.append(piece)
            assert one.flush()
            two.send(encode("tok", [m.Abort(small)]))
        got = _drain(inbox, 5)
        assert got == [m.Abort("a"), m.Abort("b"), m.Abort("c"), big, m.Abort("d")]  # whole at its last piece
        assert inbox.bad_frames == 0
    finally:
        for x in (one, two, inbox):
            x.close()


def test_a_full_receiver_queue_holds_frames_in_the_backlog_in_order(tmp_path):
    inbox = DirectInbox(str(tmp_path / "r0.dgram"), "tok")
    link = DirectLink(inbox.path, 1)
    try:
        n = 200  # far more than the kernel queues for one socket (net.unix.max_dgram_qlen)
        for i in range(n):
            link.send(encode("tok", [m.Abort(str(i))]))  # never blocks, never raises
        assert link.backlog, "the receiver's queue filled: the rest waits"
        got = []
        for _ in range(1000):
            got += inbox.receive()
            link.flush()
            if len(got) == n:
                break
        assert [g.request_id for g in got] == [str(i) for i in range(n)]
        assert not link.backlog
    finally:
        link.close()
        inbox.close()


def test_frames_wait_for_a_receiver_that_is_not_there_yet_and_for_one_that_restarted(tmp_path):
    path = str(tmp_path / "r0.dgram")
    link = DirectLink(path, 1)
    link.send(encode("tok", [m.Abort("early")]))
    assert link.backlog  # nobody listens at the path yet
    inbox = DirectInbox(path, "tok")
    try:
        assert link.flush() and _drain(inbox, 1) == [m.Abort("early")]
        inbox.close()
        inbox = DirectInbox(path, "tok")  # a restarted rank: a new socket at the same path
        link.send(encode("tok", [m.Abort("after")]))
        assert not link.backlog and _drain(inbox, 1) == [m.Abort("after")]
    finally:
        link.close()
        inbox.close()


def test_foreign_and_truncated_datagrams_are_dropped_and_counted(tmp_path):
    inbox = DirectInbox(str(tmp_path / "r0.dgram"), "tok")
    link = DirectLink(inbox.path, 1)
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        link.send(encode("not-the-token", [m.Abort("evil")]))
        raw.sendto(b"\x01", inbox.path)  # shorter than the header
        link.send(encode("tok", [m.Abort("ok")]))
        assert _drain(inbox, 1) == [m.Abort("ok")]
        assert inbox.bad_frames == 2
    finally:
        raw.close()
        link.close()
        inbox.close()


def test_outbox_sends_a_linked_peers_frames_through_the_datagram_socket(tmp_path):
    """One frame per peer and flush, through the link once there is one (the ZeroMQ socket sees none)."""
    ctx = zmq.Context()
    inbox = Inbox(ctx, f"ipc://{tmp_path}/r0.sock", "tok")
    inbox.listen_direct(str(tmp_path / "r0.dgram"))
    box = Outbox(ctx, "tok")
    try:
        box.connect(("rank", 0), inbox.address)
        box.link(("rank", 0), str(tmp_path / "r0.dgram"), 1)
        box.put(("rank", 0), m.Abort("a"))
        box.put(("rank", 0), m.Abort("b"))
        box.flush()
        assert inbox.poll(1000)
        datagram = inbox.direct.socket.recv(1 << 16)
        assert decode(datagram[5:], "tok") == [m.Abort("a"), m.Abort("b")]  # one datagram held the flush
        with pytest.raises(BlockingIOError):
            inbox.direct.socket.recv(1 << 16)
        assert not inbox.socket.poll(0)  # nothing went through ZeroMQ
        box.unlink(("rank", 0))
        box.send_now(("rank", 0), m.Abort("c"))
        assert inbox.poll(1000) and _drain(inbox, 1) == [m.Abort("c")]
    finally:
        box.close()
        inbox.close()
        ctx.term()


def test_linking_a_peer_again_at_the_same_path_keeps_its_backlog(tmp_path):
    """Peers comes again whenever a rank restarts: the links to the others stay, with what waits in them."""
    ctx = zmq.Context()
    box = Outbox(ctx, "tok")
    path = str(tmp_path / "r1.dgram")
    try:
        box.link(("rank", 1), path, 0)
        link = box.links[("rank", 1)]
        box.send_now(("rank", 1), m.Abort("waits"))  # nobody listens yet
        assert box.backlog
        box.link(("rank", 1), path, 0)
        assert box.links[("rank", 1)] is link and box.backlog
        inbox = DirectInbox(path, "tok")
        box.flush()
        assert not box.backlog and _drain(inbox, 1) == [m.Abort("waits")]
        inbox.close()
        box.link(("rank", 1), str(tmp_path / "elsewhere.dgram"), 0)
        assert box.links[("rank", 1)] is not link
    finally:
        box.close()
        ctx.term()


def test_after_a_poll_the_inbox_reads_the_sockets_it_found_frames_on_and_loses_no_later_frame(tmp_path):
    """A worker that waited for a peer's datagram does not read its empty ZeroMQ socket; a ZeroMQ frame that comes
    after that poll is read by the next receive (without a poll, as a busy worker's) or found by the next poll."""
    ctx = zmq.Context()
    inbox = Inbox(ctx, f"ipc://{tmp_path}/r0.sock", "tok")
    inbox.listen_direct(str(tmp_path / "r0.dgram"))
    peer, conductor = Outbox(ctx, "tok"), Outbox(ctx, "tok")
    try:
        peer.link(("rank", 0), str(tmp_path / "r0.dgram"), 1)
        conductor.connect(("rank", 0), inbox.address)
        peer.send_now(("rank", 0), m.Abort("peer"))
        assert inbox.poll(1000) and inbox._ready == (False, True)
        conductor.send_now(("rank", 0), m.Abort("conductor"))
        assert inbox.socket.poll(1000)  # it is there, after the poll
        assert inbox.receive() == [m.Abort("peer")]
        assert inbox.receive() == [m.Abort("conductor")]  # no poll between: both sockets read
        conductor.send_now(("rank", 0), m.Abort("later"))
        peer.send_now(("rank", 0), m.Abort("peer again"))
        assert inbox.socket.poll(1000)
        assert inbox.poll(0) and inbox._ready == (True, True)
        assert inbox.receive() == [m.Abort("later"), m.Abort("peer again")]
        assert not inbox.poll(0) and inbox._ready is None
    finally:
        peer.close()
        conductor.close()
        inbox.close()
        ctx.term()
