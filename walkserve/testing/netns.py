"""Network namespaces for the Ray tests and benchmark: nothing Ray starts can reach an address off the machine.

``private_netns()`` makes a namespace with only ``lo`` (the loopback aliases
127.0.0.2-4 work in it as on the host); ``inside(path)`` moves the calling
thread into a namespace, so every process and thread it starts from then on
lives there, and moves it back afterwards. Both need root; callers fall back
to the host's namespace (still only loopback addresses) otherwise.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from collections.abc import Iterator

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def is_root() -> bool:
    return os.geteuid() == 0


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=10)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def inside(path: str | None) -> Iterator[None]:
    """This thread (and what it starts meanwhile) in the network namespace at ``path``; None: stay."""
    if path is None:
        yield
        return
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(path, os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


@contextlib.contextmanager
def private_netns(name: str) -> Iterator[str]:
    """A named namespace with only ``lo`` up; deleted afterwards. Yields its path."""
    ip("netns", "add", name)
    try:
        ip("-n", name, "link", "set", "lo", "up")
        yield f"/run/netns/{name}"
    finally:
        ip("netns", "del", name, check=False)
