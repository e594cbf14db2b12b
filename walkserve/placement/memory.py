"""What a KV pool takes when no size is given, per device kind: the engine sizes its pool with this,
and the placement's memory check counts with it (torch-free)."""

from __future__ import annotations

DEFAULT_CPU_KV_BYTES = 256 << 20
DEFAULT_GPU_MEMORY_FRACTION = 0.5  # of the device memory free once the rank's weights are loaded


def default_kv_bytes(device: str, free_bytes: int | None) -> int:
    """The default pool size on ``device`` (``cpu``, ``cuda``, ``cuda:N``).

    On a CPU a fixed 256 MiB; on CUDA a share of ``free_bytes``, the device
    memory free once the weights are loaded (what the engine reads when it
    allocates its pool).
    """
    if device.startswith("cuda"):
        if free_bytes is None:
            raise ValueError(f"the KV pool on {device} takes a share of its free memory, which is unknown here")
        return int(free_bytes * DEFAULT_GPU_MEMORY_FRACTION)
    return DEFAULT_CPU_KV_BYTES
