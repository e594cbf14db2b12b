"""``--devices``: the ranks a user has.

    cpu:0,cpu:1            two CPU ranks on this host (they share its cores)
    cuda:0-7               eight GPUs
    cuda:0-2@141GiB        three GPUs with a memory budget each
    FILE.yaml              a list of {device, memory, host, cores}: per-device memory and kind, hosts for
                           multi-host, and a host's CPU cores (its CPU ranks share them; default: the
                           profile's count, taken on the profiling host)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from walkserve.core.errors import ConfigError, PlacementError
from walkserve.placement.plan import parse_bytes

_ITEM = re.compile(r"^(cpu|cuda)(?::(\d+)(?:-(\d+))?)?(?:@(\S+))?$")


@dataclass(frozen=True)
class Device:
    device: str  # cpu | cuda:N
    memory: int | None = None  # bytes, the budget the memory check counts against
    host: str | None = None
    cores: int | None = None  # the host's CPU cores, where the devices file gives them

    @property
    def kind(self) -> str:
        return "cpu" if self.device == "cpu" else "cuda"

    def rank_entry(self, rank: int) -> dict:
        out: dict = {"id": rank, "device": self.device}
        if self.memory is not None:
            out["memory"] = self.memory
        if self.host is not None:
            out["host"] = self.host
        return out


def parse_devices(spec: str) -> list[Device]:
    """The devices ``--devices SPEC`` names, in rank order."""
    path = Path(spec)
    if path.is_file():
        return _from_file(path)
    out: list[Device] = []
    for item in (s.strip() for s in spec.split(",")):
        m = _ITEM.match(item)
        if not m:
            raise ConfigError(f"--devices {spec}: {item!r} is not cpu:N, cuda:N, cuda:A-B (optionally @MEMORY) or a file")
        kind, lo, hi, mem = m.groups()
        first = int(lo) if lo is not None else 0
        last = int(hi) if hi is not None else first
        if last < first:
            raise ConfigError(f"--devices {spec}: range {item!r} runs backwards")
        memory = _bytes(mem, spec) if mem else None
        for i in range(first, last + 1):
            out.append(Device("cpu" if kind == "cpu" else f"cuda:{i}", memory))
    if not out:
        raise ConfigError(f"--devices {spec}: no devices")
    return out


def host_cores(devices: list[Device]) -> dict[str | None, int]:
    """host -> its CPU cores, for the hosts whose devices give a count (one count per host)."""
    out: dict[str | None, int] = {}
    for d in devices:
        if d.cores is not None:
            if out.setdefault(d.host, d.cores) != d.cores:
                raise ConfigError(f"--devices: host {d.host or 'local'} is given {out[d.host]} and {d.cores} cores")
    return out


def _bytes(value: str, where: str) -> int:
    try:
        return parse_bytes(value, f"--devices {where}")
    except PlacementError as e:
        raise ConfigError(str(e)) from None


def _from_file(path: Path) -> list[Device]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if isinstance(data, dict):
        data = data.get("devices")
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{path}: a device file is a list (or 'devices:' list) of {{device, memory, host, cores}}")
    out = []
    for i, e in enumerate(data):
        if not isinstance(e, dict) or not isinstance(e.get("device"), str):
            raise ConfigError(f"{path}: devices[{i}] must be a mapping with a device (cpu or cuda:N)")
        unknown = set(e) - {"device", "memory", "host", "cores"}
        if unknown:
            raise ConfigError(f"{path}: devices[{i}]: unknown field(s) {sorted(unknown)}")
        cores = e.get("cores")
        if cores is not None and (not isinstance(cores, int) or isinstance(cores, bool) or cores < 1):
            raise ConfigError(f"{path}: devices[{i}]: cores must be a positive whole number, not {cores!r}")
        found = parse_devices(e["device"])
        memory = _bytes(str(e["memory"]), str(path)) if e.get("memory") is not None else None
        out.extend(Device(d.device, memory if memory is not None else d.memory, e.get("host"), cores) for d in found)
    host_cores(out)  # one count per host
    return out

