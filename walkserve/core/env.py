"""Every environment variable walkserve reads, declared once and typed.

Read a knob as ``env.WALKSERVE_CACHE_DIR.get()``. ``walkserve env`` (and
docs/configuration.md) list them all with their defaults.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")

_REGISTRY: dict[str, _Knob] = {}


@dataclass(frozen=True)
class _Knob(Generic[T]):
    name: str
    default: T
    kind: type
    help: str

    def get(self) -> T:
        raw = os.environ.get(self.name)
        if raw is None or raw == "":
            return self.default
        try:
            if self.kind is bool:
                return raw.strip().lower() in ("1", "true", "yes", "on")  # type: ignore[return-value]
            if self.kind is Path:
                return Path(raw).expanduser()  # type: ignore[return-value]
            return self.kind(raw)
        except ValueError:
            raise ValueError(f"environment variable {self.name}={raw!r} is not a valid {self.kind.__name__}") from None


def _knob(name: str, default, kind: type, help: str) -> _Knob:
    knob = _Knob(name, default, kind, help)
    _REGISTRY[name] = knob
    return knob


def all_knobs() -> list[_Knob]:
    return sorted(_REGISTRY.values(), key=lambda k: k.name)


WALKSERVE_CACHE_DIR = _knob(
    "WALKSERVE_CACHE_DIR",
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "walkserve",
    Path,
    "Where generated tiny checkpoints (the embedded demo model) are written.",
)
WALKSERVE_RUNTIME_DIR = _knob(
    "WALKSERVE_RUNTIME_DIR",
    None,
    Path,
    "Parent of the private 0700 directory that holds a run's IPC sockets (default: the system temp dir).",
)
WALKSERVE_SHM_INLINE_BYTES = _knob(
    "WALKSERVE_SHM_INLINE_BYTES",
    256 * 1024,
    int,
    "Tensors up to this size travel inside the control message; larger ones through shared memory.",
)
WALKSERVE_WORKER_THREADS = _knob(
    "WALKSERVE_WORKER_THREADS",
    0,
    int,
    "torch intra-op threads per CPU worker process (0 = share the machine's cores among the workers).",
)
WALKSERVE_WORKER_SPIN = _knob(
    "WALKSERVE_WORKER_SPIN",
    100,
    int,
    "OpenMP spin count of a worker's torch threads (GOMP_SPINCOUNT: busy-wait iterations after a parallel region "
    "before a thread sleeps); -1 leaves libgomp's default (300,000, ~6 ms, or 100 when a process's OpenMP threads "
    "outnumber its cores).",
)
WALKSERVE_START_TIMEOUT_S = _knob(
    "WALKSERVE_START_TIMEOUT_S",
    300.0,
    float,
    "How long the runtime waits for its worker processes to load their components.",
)
WALKSERVE_PLACEMENT_TIMEOUT_S = _knob(
    "WALKSERVE_PLACEMENT_TIMEOUT_S",
    30.0,
    float,
    "How long a Ray placement waits for the cluster to reserve every rank's resources before it fails, naming what is missing.",
)
WALKSERVE_CPU_LINEAR = _knob(
    "WALKSERVE_CPU_LINEAR",
    "onednn",
    str,
    "float32 linears on the CPU: onednn (default), packed (oneDNN on pre-packed copies: faster, each float32 "
    "linear weight held twice) or mkl (F.linear, the previous path).",
)
WALKSERVE_LOG_LEVEL = _knob("WALKSERVE_LOG_LEVEL", "INFO", str, "Log level of every walkserve process.")
WALKSERVE_ZYGOTE = _knob(
    "WALKSERVE_ZYGOTE",
    True,
    bool,
    "Fork workers from one warm interpreter (fast start and restart); 0 starts each worker as its own interpreter.",
)
WALKSERVE_API_KEY = _knob(
    "WALKSERVE_API_KEY",
    None,
    str,
    "Bearer key that `walkserve serve` (and `python -m walkserve.api`) requires on /v1/* when --api-key is not given.",
)
# OpenTelemetry's own variables (docs/operability.md#tracing): these decide whether tracing is on; the SDK
# reads the rest itself (OTEL_EXPORTER_OTLP_HEADERS, OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_*, ...).
OTEL_SDK_DISABLED = _knob("OTEL_SDK_DISABLED", False, bool, "true: no tracing, whatever else is set.")
OTEL_TRACES_EXPORTER = _knob(
    "OTEL_TRACES_EXPORTER",
    None,
    str,
    "otlp (OTLP/HTTP; the default once an endpoint is set), console, or none; needs the `otel` extra.",
)
OTEL_EXPORTER_OTLP_ENDPOINT = _knob(
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    None,
    str,
    "OTLP/HTTP collector base URL (traces go to <it>/v1/traces); setting it turns tracing on.",
)
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = _knob(
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None, str, "The full OTLP/HTTP traces URL; setting it turns tracing on."
)
OTEL_SERVICE_NAME = _knob("OTEL_SERVICE_NAME", "walkserve", str, "service.name of every span walkserve exports.")
