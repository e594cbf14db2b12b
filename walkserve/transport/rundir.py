"""A run's private directory for IPC sockets (mode 0700), removed at shutdown."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from walkserve.core import env


def make_run_dir(run_id: str) -> Path:
    parent = env.WALKSERVE_RUNTIME_DIR.get() or Path(tempfile.gettempdir())
    path = Path(tempfile.mkdtemp(prefix=f"walkserve-{run_id}-", dir=parent))
    os.chmod(path, 0o700)
    return path


def remove_run_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
