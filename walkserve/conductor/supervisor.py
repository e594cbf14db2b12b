"""Starts, watches and restarts the worker processes (one per rank).

Workers are forked from a zygote (``python -m walkserve.worker.zygote``), a
fresh interpreter that imported torch and the model code once, so N workers
cost one import, not N; nothing of the conductor's state or of a user's
``__main__`` leaks into them, and the conductor itself never loads torch.
Without a zygote (``WALKSERVE_ZYGOTE=0``) each worker is its own
interpreter. Each worker is watched through a pidfd that becomes readable
the moment it exits.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import time

from walkserve.core import env
from walkserve.core.proc import describe_exit
from walkserve.protocol import zygote as pipe

log = logging.getLogger(__name__)


class Child:
    """A child process with a pidfd for the poller."""

    def __init__(self, argv: list[str], environ: dict[str, str] | None = None):
        self.popen = subprocess.Popen(argv, env={**os.environ, **(environ or {})}, close_fds=True)
        self.pid = self.popen.pid
        try:
            self.pidfd: int | None = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self.pidfd = None

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float) -> None:
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class Forked:
    """A worker forked by the zygote: watched by pidfd, its exit code reported by the zygote."""

    def __init__(self, zygote: Zygote, rank: int):
        self.zygote = zygote
        self.pid = zygote.fork(rank)
        self.pidfd: int | None = os.pidfd_open(self.pid)

    @property
    def exitcode(self) -> int | None:
        self.zygote.read_exits()
        if self.pid in self.zygote.exits:
            return self.zygote.exits[self.pid]
        if self.pidfd is not None and select.select([self.pidfd], [], [], 0)[0]:
            self.zygote.read_exits(wait_s=0.5)
            return self.zygote.exits.get(self.pid, -signal.SIGKILL)
        return None

    def kill(self) -> None:
        if self.exitcode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.02)

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class Zygote:
    def __init__(self, spec_path: str, timeout_s: float, environ: dict[str, str]):
        argv = [sys.executable, "-m", "walkserve.worker.zygote", spec_path, str(os.getpid())]
        self.popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      env={**os.environ, **environ}, close_fds=True)
        self.exits: dict[int, int] = {}
        self._buf = b""
        line = self._line(timeout_s)
        if not isinstance(pipe.decode_line(line or ""), pipe.Ready):
            raise RuntimeError(f"the worker zygote did not start ({describe_exit(self.popen.poll())})")

    def _line(self, timeout_s: float) -> str | None:
        deadline = time.monotonic() + timeout_s
        fd = self.popen.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode().strip()

    def read_exits(self, wait_s: float = 0.0) -> None:
        while True:
            line = self._line(wait_s) if (wait_s or b"\n" in self._buf or self._readable()) else None
            if line is None:
                return
            msg = pipe.decode_line(line)
            if isinstance(msg, pipe.Exited):
                self.exits[msg.pid] = msg.returncode
            wait_s = 0.0

    def _readable(self) -> bool:
        return bool(select.select([self.popen.stdout.fileno()], [], [], 0)[0])

    def fork(self, rank: int) -> int:
        self.popen.stdin.write(pipe.encode_line(pipe.Fork(rank)))
        self.popen.stdin.flush()
        while True:
            line = self._line(30.0)
            if line is None:
                raise RuntimeError("the worker zygote stopped answering")
            msg = pipe.decode_line(line)
            if isinstance(msg, pipe.Forked) and msg.rank == rank:
                return msg.pid
            if isinstance(msg, pipe.Exited):
                self.exits[msg.pid] = msg.returncode

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.stdin.close()
            try:
                self.popen.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=3)


class Supervisor:
    """``environ``: set in every worker's environment (and the zygote's) on top of this process's."""

    def __init__(self, spec_path: str, ranks: list[int], start_timeout_s: float = 300.0,
                 environ: dict[str, str] | None = None):
        self.spec_path = spec_path
        self.environ = environ or {}
        self.ranks = ranks
        self.procs: dict[int, Child | Forked] = {}
        self.restarts: dict[int, int] = {r: 0 for r in ranks}
        self.start_timeout_s = start_timeout_s
        self.zygote: Zygote | None = None

    def _zygote(self) -> Zygote | None:
        if not env.WALKSERVE_ZYGOTE.get() or not hasattr(os, "pidfd_open"):
            return None
        if self.zygote is None or not self.zygote.alive():
            try:
                self.zygote = Zygote(self.spec_path, self.start_timeout_s, self.environ)
            except (RuntimeError, OSError) as e:
                log.warning("starting workers without a zygote: %s", e)
                self.zygote = None
        return self.zygote

    def start(self, rank: int) -> None:
        zygote = self._zygote()
        if zygote is not None:
            self.procs[rank] = child = Forked(zygote, rank)
        else:
            argv = [sys.executable, "-m", "walkserve.worker.main", self.spec_path, str(rank), str(os.getpid())]
            self.procs[rank] = child = Child(argv, self.environ)
        log.info("started worker rank %d (pid %d)", rank, child.pid)

    def start_all(self) -> None:
        for rank in self.ranks:
            self.start(rank)

    def sentinels(self) -> list[int]:
        """pidfds of running workers, for the conductor's poller (readable when one exits)."""
        return [c.pidfd for c in self.procs.values() if c.pidfd is not None and c.exitcode is None]

    def dead(self) -> list[tuple[int, str]]:
        return [(r, f"pid {c.pid} {describe_exit(c.exitcode)}") for r, c in self.procs.items() if c.exitcode is not None]

    def lost(self) -> list[tuple[int, str]]:
        """Ranks that could not be restarted where they belong (never, on this host)."""
        return []

    def pids(self) -> dict[int, int]:
        return {r: c.pid for r, c in self.procs.items()}

    def describe(self) -> dict:
        return {}

    def restart(self, rank: int) -> None:
        self.forget(rank)
        self.restarts[rank] += 1
        self.start(rank)

    def forget(self, rank: int) -> None:
        child = self.procs.pop(rank, None)
        if child is not None:
            child.wait(1)
            child.close()

    def stop_all(self, grace_s: float = 3.0) -> None:
        deadline = time.monotonic() + grace_s
        for child in self.procs.values():
            child.wait(max(0.0, deadline - time.monotonic()))
        for child in self.procs.values():
            child.kill()
            child.wait(5)
            child.close()
        self.procs.clear()
        if self.zygote is not None:
            self.zygote.stop()
            self.zygote = None
