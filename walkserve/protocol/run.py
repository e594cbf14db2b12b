"""RunSpec: everything a conductor or worker process needs to join a run (handed over at process start)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from walkserve.core.config import RuntimeConfig


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    token: str
    run_dir: str
    model_family: str
    model_path: str | None
    model_options: dict[str, Any]
    placement: dict[str, Any]  # the placement mapping (same schema as the YAML file)
    placement_source: str
    config: RuntimeConfig = field(default_factory=RuntimeConfig)

    def address(self, name: str) -> str:
        return f"ipc://{self.run_dir}/{name}.sock"

    def address_path(self, name: str) -> str:
        """A file in the run directory."""
        return f"{self.run_dir}/{name}"

    @property
    def frontend_address(self) -> str:
        return self.address("frontend")

    @property
    def conductor_address(self) -> str:
        return self.address("conductor")


def save_run_spec(spec: RunSpec, path: str) -> None:
    """Write the spec for child processes (msgpack; the file sits in the run's 0700 directory)."""
    import os

    import msgspec

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(msgspec.msgpack.encode(spec))


def load_run_spec(path: str) -> RunSpec:
    import msgspec

    with open(path, "rb") as f:
        return msgspec.msgpack.decode(f.read(), type=RunSpec)
