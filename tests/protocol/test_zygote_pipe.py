"""The zygote pipe's lines: each message round-trips; anything else is ignored, never misread."""

from __future__ import annotations

import pytest

from walkserve.protocol.zygote import Exited, Fork, Forked, Ready, decode_line, encode_line


@pytest.mark.parametrize("msg, line", [(Fork(3), b"fork 3\n"), (Ready(), b"ready\n"), (Forked(3, 4242), b"forked 3 4242\n"),
                                       (Exited(4242, -9), b"exit 4242 -9\n")])
def test_each_message_is_one_line(msg, line):
    assert encode_line(msg) == line
    assert decode_line(line) == msg and decode_line(line.decode().strip()) == msg


@pytest.mark.parametrize("line", ["", "hello", "fork", "fork x", "forked 1", "exit 1 2 3", "ready now"])
def test_other_lines_are_not_messages(line):
    assert decode_line(line) is None
