"""StreamEncoder: float32 samples in, encoded bytes out, as the audio is produced."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class StreamEncoder(ABC):
    """``push`` returns whatever bytes became final; ``finish`` the rest. One encoder per response."""

    @abstractmethod
    def push(self, samples: np.ndarray) -> bytes: ...

    @abstractmethod
    def finish(self) -> bytes: ...


class BufferedEncoder(StreamEncoder):
    """For containers that need the whole signal (headers rewritten at close): all bytes at finish."""

    def __init__(self, encode, sample_rate: int):
        self._encode = encode
        self._rate = sample_rate
        self._parts: list[np.ndarray] = []

    def push(self, samples: np.ndarray) -> bytes:
        self._parts.append(samples)
        return b""

    def finish(self) -> bytes:
        samples = np.concatenate(self._parts) if self._parts else np.zeros(0, np.float32)
        return self._encode(samples, self._rate)
