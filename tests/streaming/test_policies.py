"""Chunk policies and the stream buffer: for any stream length and arrival pattern, the chunks are
exactly those the policy defines, nothing is lost or duplicated, and memory stays bounded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from walkserve.streaming import (
    EXHAUSTED,
    FixedChunk,
    LeftContext,
    SlidingWindow,
    StreamBuffer,
    StreamOverflow,
)


def drain(policy, n: int, pattern: list[int], consume_lag: int = 0, capacity: int = 10_000):
    """Push n items (0..n-1) in bursts given by ``pattern``, pulling chunks as they form; return chunks."""
    buf = StreamBuffer(policy, capacity=capacity)
    chunks, pushed, i, max_held = [], 0, 0, 0
    bursts = iter(pattern * (n + 1))
    while pushed < n:
        for _ in range(min(next(bursts, 1) or 1, n - pushed)):
            buf.push(pushed)
            pushed += 1
        while True:
            c = buf.chunk(i)
            if c is None:
                break
            chunks.append(c)
            if i - consume_lag >= 0:
                buf.consumed(i - consume_lag)
            i += 1
        max_held = max(max_held, buf.held)
    buf.end()
    while True:
        c = buf.chunk(i)
        if c is EXHAUSTED or c is None or (c.empty and policy.continue_after_end):
            break
        chunks.append(c)
        buf.consumed(i)
        i += 1
    return chunks, max_held


lengths = st.integers(min_value=0, max_value=120)
patterns = st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(n=lengths, pattern=patterns, size=st.integers(1, 12), end=st.sampled_from(["flush", "drop", "pad"]))
def test_fixed_chunk(n, pattern, size, end):
    chunks, max_held = drain(FixedChunk(size, end=end), n, pattern)
    full = n // size
    assert [c.items for c in chunks[:full]] == [tuple(range(k * size, (k + 1) * size)) for k in range(full)]
    tail = n % size
    if tail and end != "drop":
        assert len(chunks) == full + 1
        assert chunks[-1].items == tuple(range(full * size, n)) and chunks[-1].span.final
        assert chunks[-1].span.n_pad == (size - tail if end == "pad" else 0)
    else:
        assert len(chunks) == full
    if end != "drop":
        assert [x for c in chunks for x in c.new_items] == list(range(n))
    assert all(c.span.n_context == 0 for c in chunks)
    assert max_held <= size + max(pattern)


@settings(max_examples=150, deadline=None)
@given(n=lengths, pattern=patterns, window=st.integers(1, 30), stride=st.integers(1, 10), end=st.sampled_from(["flush", "drop"]))
def test_sliding_window(n, pattern, window, stride, end):
    policy = SlidingWindow(window, stride, end=end)
    chunks, max_held = drain(policy, n, pattern)
    expected_windows = 0 if n < window else 1 + (n - window) // stride
    regular = [c for c in chunks if not c.span.final]
    assert len(regular) == expected_windows == policy.n_windows(n)
    for k, c in enumerate(regular):
        assert c.items == tuple(range(k * stride, k * stride + window))
        assert c.span.n_context == (0 if k == 0 else max(0, window - stride))
    finals = [c for c in chunks if c.span.final]
    if end == "flush" and n > 0:
        assert len(finals) == 1 and chunks[-1] is finals[0]
        start = 0 if expected_windows == 0 else (expected_windows - 1) * stride
        assert finals[0].items == tuple(range(start, n))
        if stride <= window:  # no gaps between windows: the new parts are the whole stream
            assert [x for c in chunks for x in c.new_items] == list(range(n))
    else:
        assert not finals
    assert max_held <= window + stride + max(pattern)


@settings(max_examples=150, deadline=None)
@given(n=lengths, pattern=patterns, size=st.integers(1, 30), context=st.integers(0, 30), end=st.sampled_from(["flush", "drop"]))
def test_left_context(n, pattern, size, context, end):
    chunks, max_held = drain(LeftContext(size, context, end=end), n, pattern)
    if chunks:
        assert chunks[0].span.n_context == 0
    for k, c in enumerate(chunks):
        assert c.span.n_context <= context
        assert c.span.n_context == min(context, k * size)
        assert c.new_items == tuple(range(k * size, min((k + 1) * size, n)))
        assert c.items[: c.span.n_context] == tuple(range(k * size - c.span.n_context, k * size))
    covered = [x for c in chunks for x in c.new_items]
    if end == "flush":
        assert covered == list(range(n))
    else:
        assert covered == list(range(n - n % size))
    assert max_held <= size + context + max(pattern)


def test_continue_after_end_gives_empty_chunks_forever():
    buf = StreamBuffer(FixedChunk(1, continue_after_end=True), capacity=8)
    for x in range(3):
        buf.push(x)
    assert [buf.chunk(i).items for i in range(3)] == [(0,), (1,), (2,)]
    assert buf.chunk(3) is None  # not ended yet: wait
    buf.end()
    for i in range(3, 10):
        c = buf.chunk(i)
        assert c.empty and c.span.index == i


def test_buffer_keeps_only_what_future_chunks_need():
    buf = StreamBuffer(SlidingWindow(28, 7), capacity=64)
    i = 0
    for x in range(500):
        buf.push(x)
        while buf.chunk(i) is not None:
            buf.consumed(i)
            i += 1
        assert buf.held <= 28 + 7
    buf.end()
    final = buf.chunk(i)
    assert final.span.final and final.items[0] == (i - 1) * 7


def test_backpressure_and_overflow():
    buf = StreamBuffer(FixedChunk(4), capacity=8, hard_limit=12)
    for x in range(8):
        buf.push(x)
    assert buf.full
    for x in range(4):
        buf.push(x)
    with pytest.raises(StreamOverflow, match="not keeping up"):
        buf.push(99)
    buf.chunk(0)
    buf.consumed(0)
    assert buf.held == 8 and buf.full  # one chunk consumed frees its items
    buf.chunk(1)
    buf.consumed(1)
    assert not buf.full


def test_capacity_below_policy_need_is_refused():
    with pytest.raises(ValueError, match="needs"):
        StreamBuffer(SlidingWindow(28, 7), capacity=20)
