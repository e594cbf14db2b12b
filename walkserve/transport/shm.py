"""Shared-memory segments for tensors between processes of one host.

Each segment is a file in /dev/shm named ``ws-<run id>-<sender>-<n>``; the
run id starts with the creating process's pid in hex. The receiver maps and
unlinks it at once (the mapping lives on until the tensor is freed), so a
segment outlives its transfer only if a process dies between write and read;
``sweep`` removes a run's leftovers at start and stop, and segments of runs
whose creator is gone.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "ws-"


def available() -> bool:
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)


def write_segment(name: str, data: memoryview) -> None:
    """Create segment ``name`` holding ``data`` (fails if it exists)."""
    fd = os.open(SHM_DIR / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, max(len(data), 1))
        with mmap.mmap(fd, max(len(data), 1)) as m:
            m[: len(data)] = data
    finally:
        os.close(fd)


def read_segment(name: str, nbytes: int) -> mmap.mmap:
    """Map segment ``name`` read-write (private copy-on-write) and unlink it."""
    if "/" in name or not name.startswith(PREFIX):
        raise ValueError(f"not a walkserve segment name: {name!r}")
    path = SHM_DIR / name
    fd = os.open(path, os.O_RDONLY)
    try:
        m = mmap.mmap(fd, max(nbytes, 1), flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return m


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(run_id: str | None = None) -> int:
    """Remove this run's segments (``run_id``), and any whose creating process is gone. Returns the count."""
    if not SHM_DIR.is_dir():
        return 0
    removed = 0
    for path in SHM_DIR.glob(f"{PREFIX}*"):
        parts = path.name.split("-")
        if len(parts) < 3:
            continue
        rid = parts[1]
        try:
            pid = int(rid[:-6], 16)  # run ids are <pid hex><6 hex chars>
        except ValueError:
            continue
        if rid == run_id or not _pid_alive(pid):
            try:
                path.unlink()
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def segments(run_id: str | None = None) -> list[str]:
    if not SHM_DIR.is_dir():
        return []
    pattern = f"{PREFIX}{run_id}-*" if run_id else f"{PREFIX}*"
    return sorted(p.name for p in SHM_DIR.glob(pattern))
