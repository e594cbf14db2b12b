"""Streams between loops: items pushed at the producer, buffered at the consumer, ended, paused.

An exposed iteration k of a producer instance (outer path p) pushes item k of
the stream's instance p; the consumer's instance with the same outer path
reads chunk i of it when the chunk policy can form one. A consumer on
another rank gets the items of a step in one StreamItems message; a full
buffer pauses its producer (Flows) until the consumer caught up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from walkserve.graph.plan import StreamInfo
from walkserve.streaming.buffer import StreamOverflow
from walkserve.worker.rows import FlowRow

if TYPE_CHECKING:
    from walkserve.worker.effects import Effects
    from walkserve.worker.state import WalkRun

Path = tuple[int, ...]


def item(fx: Effects, run: WalkRun, stream: int, prefix: Path, index: int, value: Any) -> None:
    """The producer side: item ``index`` of one stream instance leaves for its consumer."""
    info = run.program.streams[stream]
    rank = run.ranks[info.consumer]
    if rank == fx.rank:
        push(fx, run, stream, prefix, index, value)
    else:
        fx.out.item(rank, run.walk, stream, run.request.id, prefix, index, value)


def push(fx: Effects, run: WalkRun, stream: int, prefix: Path, index: int, value: Any) -> None:
    """The consumer side: an item arrives (in order or not)."""
    s = run.stream_in(stream, prefix)
    try:
        s.push(index, value)
    except StreamOverflow as e:
        fx.fail(run, str(e))
        return
    info = run.program.streams[stream]
    if s.buffer.full and s.ask_pause(True):
        flow(fx, run, info, prefix, True)
    _wake_consumer(fx, run, info, prefix)


def end(fx: Effects, run: WalkRun, info: StreamInfo, prefix: Path, n_items: int) -> None:
    """The producer instance ended with ``n_items`` items."""
    rank = run.ranks[info.consumer]
    if rank != fx.rank:
        fx.out.stream_end(rank, run.walk, info.index, run.request.id, prefix, n_items)
        return
    ended(fx, run, info.index, prefix, n_items)


def ended(fx: Effects, run: WalkRun, stream: int, prefix: Path, n_items: int) -> None:
    s = run.stream_in(stream, prefix)
    if s.buffer.n_items != n_items or s.early:
        fx.fail(run, f"stream {stream} ended with {n_items} items but {s.buffer.n_items} arrived in order")
        return
    s.buffer.end()
    _wake_consumer(fx, run, run.program.streams[stream], prefix)


def consumed(fx: Effects, run: WalkRun, stream: int, prefix: Path, k: int) -> None:
    """The consumer ran chunk ``k``: release what later chunks no longer need, resume a paused producer."""
    s = run.stream_in(stream, prefix)
    s.buffer.consumed(k)
    if s.pausing and not s.buffer.full and s.ask_pause(False):
        flow(fx, run, run.program.streams[stream], prefix, False)


def flow(fx: Effects, run: WalkRun, info: StreamInfo, prefix: Path, pause: bool) -> None:
    rank = run.ranks[info.producer]
    if rank != fx.rank:
        fx.out.flow(rank, run.walk, info.index, run.request.id, prefix, pause)
        return
    paused(fx, run, info.index, prefix, pause)


def paused(fx: Effects, run: WalkRun, stream: int, prefix: Path, pause: bool) -> None:
    info = run.program.streams[stream]
    m = run.members.get((info.producer_scope, prefix))
    if m is None:
        fx.stash(run, (info.producer_scope, prefix), FlowRow(stream, prefix, pause))
        return
    m.pause(pause)
    if not pause:
        fx.touch(m.cohort)


def _wake_consumer(fx: Effects, run: WalkRun, info: StreamInfo, prefix: Path) -> None:
    m = run.members.get((info.consumer_scope, prefix))
    if m is not None:
        fx.touch(m.cohort)
