"""FeatureCache: encoder outputs of recent inputs, keyed by a digest of the input's content.

An encoder whose output for an input depends on that input alone (a camera image through SigLIP, one
attention window of an audio clip) can take it from here instead of computing it again. The key is a
content key the caller computes (a 128-bit digest of dtype, shape and bytes, ``content_key.py``: a colliding
input would be handed another's features): any changed value misses. Least recently
used entries go first; ``capacity`` 0 disables it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import torch


class FeatureCache:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, torch.Tensor] = OrderedDict()

    def get(self, key: Hashable) -> torch.Tensor | None:
        features = self._entries.get(key)
        if features is not None:
            self._entries.move_to_end(key)
        return features

    def put(self, key: Hashable, features: torch.Tensor) -> None:
        if self.capacity <= 0:
            return
        self._entries[key] = features
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
