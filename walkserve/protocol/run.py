"""RunSpec: everything a conductor or worker process needs to join a run (handed over at process start).

A worker on this host reads the spec from the run's private directory; a rank
started through Ray gets a ``RankLaunch`` as msgpack bytes on its stdin
instead (no file crosses hosts), which adds the ``RankSite``: where it binds,
where the conductor listens, and which node it is on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

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
    stateful: tuple[str, ...] = ()  # components whose per-request state moves with the request's walks

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


class RankSite(msgspec.Struct, frozen=True):
    """Where one worker sits in the run; filled by whoever starts it (the supervisor, or its Ray actor).

    ``inbox``: the address it binds (an IPC path, or ``tcp://<its node's IP>:0``);
    ``conductor``: the conductor's inbox; ``node``: its node's identity (ranks
    with the same node exchange tensors through shared memory, others inline
    in their frames); ``host``: its node's IP as the cluster reports it;
    ``device``: overrides the placement's device (under Ray a CUDA rank uses
    the one GPU Ray gave it, ``cuda``); ``shm_id``: the run id its shared-memory
    segments carry (on another node: one whose leading pid is alive there for
    as long as the rank is, so a sweep on that node keeps them).
    """

    inbox: str
    conductor: str
    node: str
    host: str = ""
    device: str = ""
    shm_id: str = ""


class RankLaunch(msgspec.Struct, frozen=True):
    """What a rank started through a cluster launcher reads from its stdin (msgpack)."""

    spec: RunSpec
    rank: int
    site: RankSite


def encode_run_spec(spec: RunSpec) -> bytes:
    return msgspec.msgpack.encode(spec)


def decode_run_spec(data: bytes) -> RunSpec:
    return msgspec.msgpack.decode(data, type=RunSpec)


def save_run_spec(spec: RunSpec, path: str) -> None:
    """Write the spec for child processes (msgpack; the file sits in the run's 0700 directory)."""
    import os

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(encode_run_spec(spec))


def load_run_spec(path: str) -> RunSpec:
    with open(path, "rb") as f:
        return decode_run_spec(f.read())
