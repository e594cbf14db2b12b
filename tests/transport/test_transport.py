"""Transport pieces: the private socket directory, the codec's token check, tensors through shared memory, sweeping."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
import torch
import zmq

from walkserve.protocol import messages as m
from walkserve.protocol.codec import BadMessage, decode, encode
from walkserve.transport import rundir, shm
from walkserve.transport.ipc import Inbox, Outbox
from walkserve.transport.tensors import TensorCodec, stack_rows, unpack


def test_run_dir_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("WALKSERVE_RUNTIME_DIR", str(tmp_path))
    path = rundir.make_run_dir("abc123456789")
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
        assert path.parent == tmp_path
    finally:
        rundir.remove_run_dir(path)
    assert not path.exists()


def test_codec_rejects_wrong_token_and_garbage():
    frame = encode("secret", [m.Abort("r1")])
    assert decode(frame, "secret") == [m.Abort("r1")]
    with pytest.raises(BadMessage, match="wrong run token"):
        decode(frame, "other")
    with pytest.raises(BadMessage, match="undecodable"):
        decode(b"\x93not msgpack of a batch", "secret")


def test_inbox_drops_foreign_frames(tmp_path):
    ctx = zmq.Context()
    inbox = Inbox(ctx, f"ipc://{tmp_path}/in.sock", "tok")
    good, bad = Outbox(ctx, "tok"), Outbox(ctx, "not-the-token")
    try:
        for box in (good, bad):
            box.connect("x", inbox.address)
        bad.send_now("x", m.Abort("evil"))
        good.send_now("x", m.Abort("ok"))
        got = []
        # two connections: ZeroMQ does not order frames across them, so wait for both outcomes
        for _ in range(50):
            inbox.poll(100)
            got += inbox.receive()
            if got and inbox.bad_frames:
                break
        assert got == [m.Abort("ok")] and inbox.bad_frames == 1
    finally:
        for box in (good, bad):
            box.close()
        inbox.close()
        ctx.term()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool])
def test_tensors_round_trip_inline_and_through_shared_memory(dtype):
    codec = TensorCodec(f"{os.getpid():x}abcdef", "t", inline_bytes=64)
    small = (torch.arange(4) % 2).to(dtype)
    big = (torch.arange(10_000).reshape(100, 100) % 7).to(dtype)
    for t in (small, big, torch.empty(0, 3, dtype=dtype)):
        msg = codec.pack(t)
        assert (msg.shm is not None) == (t.numel() * t.element_size() > 64)
        back = unpack(msg)
        assert back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t)
    assert not shm.segments(f"{os.getpid():x}abcdef")  # the reader unlinked every segment


def test_sweep_removes_segments_of_dead_runs_and_keeps_live_ones():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    dead_run, live_run = f"{dead_pid:x}aaaaaa", f"{os.getpid():x}bbbbbb"
    shm.write_segment(f"ws-{dead_run}-r0-0", memoryview(b"x"))
    shm.write_segment(f"ws-{live_run}-r0-0", memoryview(b"y"))
    try:
        shm.sweep()
        assert not shm.segments(dead_run)
        assert shm.segments(live_run) == [f"ws-{live_run}-r0-0"]
        shm.sweep(live_run)
        assert not shm.segments(live_run)
    finally:
        for name in (f"ws-{dead_run}-r0-0", f"ws-{live_run}-r0-0"):
            if (shm.SHM_DIR / name).exists():
                (shm.SHM_DIR / name).unlink()


def test_stack_rows_stacks_only_tensors_of_one_dtype_and_shape():
    rows = [torch.tensor([i, i + 1]) for i in range(5)]
    assert torch.equal(stack_rows(rows), torch.tensor([[i, i + 1] for i in range(5)]))
    assert stack_rows([torch.tensor([1]), torch.tensor([2.5])]) is None  # torch.stack would promote to float
    assert stack_rows([torch.tensor([1.5]), torch.tensor([2], dtype=torch.int32)]) is None
    assert stack_rows([torch.tensor([1]), torch.tensor([1, 2])]) is None
    assert stack_rows([torch.tensor([1]), 2]) is None
    assert stack_rows([3, torch.tensor([1])]) is None
