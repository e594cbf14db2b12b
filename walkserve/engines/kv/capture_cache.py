"""CaptureCache: the captured layer inputs of finished prompt pieces, so the same piece after the same history is
answered without running again.

A firing whose outputs are all captured rows (``rows=ALL``, e.g. Qwen3-Omni's media pieces, whose layer-24 inputs
feed the talker) cannot take its rows from the prefix cache: the rows must come out. This cache keeps those rows,
keyed on what determines them, the context's content up to the piece's end:

    key = (model, start, end, hash(row keys [0, start)), row keys [start, end))

with the row keys the prefix cache uses (``sequence.Context.row_keys``: token ids, media digests, explicit
positions), so a hit is exact wherever a prefix-cache hit is (the history by its hash, as the block chain keys it;
the piece's own rows compared in full). Only pieces whose rows all lie within the context's shareable part
(``Context.cacheable``) are kept or served. A lazy piece (``ContextOp.lazy``) found here is answered at submission
and its rows become history, computed or taken from the prefix cache with the context's next computing firing,
like a lazy piece that names no output: so a follow-up turn re-runs none of an earlier turn's media.

The entries stand on their own (no KV block needs to stay cached for one to be right) and are bounded by
``max_bytes``, least recently used first out; a piece not found runs as usual.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

from walkserve.engines.kv.sequence import Context, PendingFiring


class CaptureCache:
    """Captured rows of finished pieces by content key (module docstring); ``hits`` counts pieces answered here."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self._entries: OrderedDict[tuple, dict[str, torch.Tensor]] = OrderedDict()  # by layer name: [n, D]

    def lookup(self, ctx: Context, pending: PendingFiring, model: str) -> dict[str, torch.Tensor] | None:
        """The outputs of ``pending`` (just appended to ``ctx``) when an equal piece ran before, else None."""
        key = self._key(ctx, pending, model)
        entry = self._entries.get(key) if key is not None else None
        if entry is None:
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        capture = pending.op.capture
        return {name: entry[layer_key(capture[name])].clone() for name in pending.firing.outputs}

    def store(self, ctx: Context, pending: PendingFiring, model: str, outputs: Mapping[str, Any]) -> None:
        """Keep the captured rows of ``pending``, which ``outputs`` answered."""
        key = self._key(ctx, pending, model)
        if key is None or key in self._entries:
            return
        capture = pending.op.capture
        entry = {layer_key(capture[name]): outputs[name].detach().clone() for name in pending.firing.outputs}
        size = sum(t.numel() * t.element_size() for t in entry.values())
        if size > self.max_bytes:
            return
        while self.bytes + size > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes -= sum(t.numel() * t.element_size() for t in old.values())
        self._entries[key] = entry
        self.bytes += size

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _key(ctx: Context, pending: PendingFiring, model: str) -> tuple | None:
        if not servable(pending) or pending.end > ctx.cacheable:
            return None
        keys = ctx.row_keys()
        start, end = pending.start, pending.end
        return model, start, end, hash(tuple(keys[:start])), tuple(keys[start:end])


def servable(pending: PendingFiring) -> bool:
    """Whether ``pending``'s answer is its captured rows only, every row of its chunk (what this cache holds)."""
    op, firing = pending.op, pending.firing
    if op is None or firing is None or op.kind != "append" or not op.capture or op.rows.kind != "all":
        return False
    return op.targets is None and bool(firing.outputs) and all(name in op.capture for name in firing.outputs)


def layer_key(layer: int) -> str:
    return f"layer{layer}"
