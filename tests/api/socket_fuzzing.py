"""Fuzzing openpi's websocket route: hypothesis draws frames (malformed msgpack, wrong kinds, observation-shaped
maps with bad arrays, text frames); each must get an error frame in the envelope, or actions, and never a close."""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.sync.client import ClientConnection, connect

from tests.api.fuzzing import EXAMPLES, hypothesis_settings
from walkserve.api.config import WS_SLACK_BYTES
from walkserve.api.openpi.codec import decode, encode

REPLY_TIMEOUT_S = 30.0
LEAKS = ("Traceback", "File \"", "site-packages", " object at 0x")

scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20) | \
    st.binary(max_size=40)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=12) | st.binary(max_size=12), inner, max_size=4), max_leaves=12)
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                           max_leaves=12)
DTYPES = ["<f4", "|u1", "<i8", "|b1", "<U3", "|O", "|V8", "<c8", ">f2", "bogus", "[('a', '<f4')]", "<M8[s]"]


@st.composite
def fake_arrays(draw) -> dict:
    """A map that claims to be a numpy array: any dtype name, shape and byte count."""
    shape = draw(st.lists(st.integers(-2, 40), max_size=4) | values)
    return {b"__ndarray__": True, b"data": draw(st.binary(max_size=64) | values), b"dtype": draw(st.sampled_from(DTYPES)),
            b"shape": shape}


def observations(keys: list[str]):
    """Observation-shaped maps: the policy's own keys (and openpi's layouts') holding anything, arrays included."""
    anything = values | fake_arrays() | st.builds(lambda n: {b"__npgeneric__": True, b"data": n, b"dtype": "<f4"}, values)
    return st.dictionaries(st.sampled_from(keys), anything, max_size=len(keys))


def frames(keys: list[str]):
    """Raw bytes, msgpack of anything, an observation-shaped map (binary frames), or a text frame (a str)."""
    pack = msgspec.msgpack.encode
    return st.one_of(st.binary(max_size=200), values.map(pack), observations(keys).map(pack), st.text(max_size=200),
                     json_values.map(json.dumps))


def error_of(reply: str | bytes) -> dict[str, Any]:
    """The error envelope of a text reply (no traceback, not a server error)."""
    assert isinstance(reply, str), reply[:200]
    error = json.loads(reply)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["type"] != "server_error", error
    assert not any(leak in error["message"] for leak in LEAKS), error
    return error


def open_policy(url: str, path: str = "/v1/openpi") -> tuple[ClientConnection, dict]:
    ws = connect(url.replace("http://", "ws://") + path, max_size=None, open_timeout=30)
    return ws, decode(ws.recv(timeout=REPLY_TIMEOUT_S))


def exchange(ws: ClientConnection, payload: str | bytes) -> str | bytes:
    ws.send(payload)  # a str goes as a text frame, bytes as a binary one
    return ws.recv(timeout=REPLY_TIMEOUT_S)


def fuzz_frames(url: str, keys: list[str], examples: int = EXAMPLES * 8) -> dict[str, int]:
    """Drawn frames over one connection: each answered (an error frame, or actions for a frame that happens to be
    a valid observation) and the connection kept open. Returns how many answers of each kind came back."""
    ws, _ = open_policy(url)
    answers = {"error": 0, "actions": 0}

    @given(frame=frames(keys))
    @hypothesis_settings(examples)
    def run(frame) -> None:
        reply = exchange(ws, frame)
        if isinstance(reply, bytes):
            assert decode(reply)["actions"].ndim == 2
            answers["actions"] += 1
        else:
            error_of(reply)
            answers["error"] += 1

    with ws:
        run()
    return answers


def valid_observation(metadata: dict) -> dict:
    rng = np.random.default_rng(1)
    cameras = {cam: rng.integers(0, 256, (28, 28, 3), dtype=np.uint8) for cam in metadata["cameras"][:1]}
    return cameras | {"state": np.zeros(metadata["state_dim"], np.float32), "prompt": "pick up the cup"}


def infer(url: str, path: str = "/v1/openpi") -> np.ndarray:
    """One ordinary observation on a fresh connection -> its actions."""
    ws, metadata = open_policy(url, path)
    with ws:
        return decode(exchange(ws, encode(valid_observation(metadata))))["actions"]


def check_wrong_kinds_and_sizes(url: str, limit: int) -> None:
    """Text where binary is expected, msgpack that is no map, a frame just over ``limit`` (an error frame each, the
    connection kept), then one far over it (closed with 1009, message too big)."""
    ws, metadata = open_policy(url)
    with ws:
        assert error_of(exchange(ws, json.dumps(valid_observation(metadata), default=str)))["param"] == "frame"
        assert error_of(exchange(ws, msgspec.msgpack.encode([1, 2, 3])))["param"] == "observation"
        assert error_of(exchange(ws, b"\xc1"))["code"] == "invalid_frame"  # 0xc1: never used in msgpack
        over = error_of(exchange(ws, b"\x00" * (limit + 1)))
        assert (over["code"], over["param"]) == ("frame_too_large", "frame"), over
        assert decode(exchange(ws, encode(valid_observation(metadata))))["actions"].ndim == 2
        ws.send(b"\x00" * (limit + WS_SLACK_BYTES + 1))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=REPLY_TIMEOUT_S)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == CloseCode.MESSAGE_TOO_BIG


def close_abruptly(url: str) -> None:
    """Clients that go away: before reading the metadata, right after sending an observation (mid-request), and by
    dropping the TCP connection with a frame half sent."""
    connect(url.replace("http://", "ws://") + "/v1/openpi", open_timeout=30).close()
    ws, metadata = open_policy(url)
    ws.send(encode(valid_observation(metadata)))
    ws.close()
    ws, metadata = open_policy(url)
    ws.send(encode(valid_observation(metadata)))
    raw = ws.socket
    raw.sendall(b"\x82\xfe\x10\x00" + b"mask" + b"\x00" * 100)  # a masked binary frame of 4096 bytes; 100 sent
    with contextlib.suppress(OSError):
        raw.shutdown(socket.SHUT_RDWR)
    raw.close()
    with contextlib.suppress(Exception):
        ws.close()
