"""Process plumbing shared by every walkserve process: names, parent-death handling, logging."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the OS has one (a container or ``taskset`` may
    allow fewer than the machine has), else the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def set_title(title: str) -> None:
    """Name the process so ``ps`` shows its role (``walkserve: worker rank 0``)."""
    try:
        import setproctitle

        setproctitle.setproctitle(title)
    except ImportError:  # pragma: no cover - optional
        pass


def name_thread(name: str) -> None:
    """Name the calling thread for the OS (``/proc/PID/task/TID/comm``; Linux keeps 15 bytes)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
        except OSError:
            pass


def die_with_parent(parent_pid: int, use_pdeathsig: bool = True, interval_s: float = 0.2) -> None:
    """Exit as soon as the parent process is gone: PDEATHSIG where Linux has it, and a watcher thread."""
    if use_pdeathsig and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(2)
                os._exit(1)
            time.sleep(interval_s)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def setup_logging(role: str) -> None:
    from walkserve.core import env

    logging.basicConfig(
        level=getattr(logging, env.WALKSERVE_LOG_LEVEL.get().upper(), logging.INFO),
        format=f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by signal {-exitcode} ({signal.Signals(-exitcode).name})"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"
