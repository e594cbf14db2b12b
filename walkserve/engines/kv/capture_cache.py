"""CaptureCache: the captured layer inputs of finished prompt pieces, so the same piece after the same history is
answered without running again.

A firing whose outputs are all captured rows (``rows=ALL``, e.g. Qwen3-Omni's media pieces, whose layer-24 inputs
feed the talker) cannot take its rows from the prefix cache: the rows must come out. This cache keeps those rows
run by run (a run: rows of equal row key; an audio clip's encoder window, whose chained key stands for every window
before it, or an image), keyed on what determines them, the context's content up to the run's end:

    key = (model, lo, hi, digest(row keys [0, lo)), row keys [lo, hi))

with the row keys the prefix cache uses (``sequence.Context.row_keys``: token ids, media digests, explicit
positions), so a hit is exact wherever a prefix-cache hit is (the history by a BLAKE2b digest of its row keys,
``row_digest.digests``, never Python's ``hash``; the run's own rows compared in full). Attention is causal, so a row's
captured input depends on nothing after it.
Only pieces whose rows all lie within the context's shareable part (``Context.cacheable``) are kept or served.
A lazy piece (``ContextOp.lazy``) whose every run is found here is answered at submission and its rows become
history, computed or taken from the prefix cache with the context's next computing firing, like a lazy piece that
names no output: so a follow-up turn re-runs none of an earlier turn's media. A piece whose first k rows are found
(a clip that extends one run before by windows: audio prefilled while it arrives, then committed longer) computes
only its rows from k on, its first k rows' KV coming from the prefix cache, and takes the kept rows ahead of them.

The entries stand on their own (no KV block needs to stay cached for one to be right) and are bounded by
``max_bytes``, least recently used piece first out (its runs with it); a run not found runs as usual, with every
run after it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

import torch

from walkserve.engines.kv import row_digest
from walkserve.engines.kv.sequence import Context, PendingFiring


class CaptureCache:
    """Captured rows of finished pieces by content key, found run by run (module docstring); ``hits`` counts pieces
    answered here whole, ``partial_hits`` pieces whose first runs came from here."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.partial_hits = 0
        self._entries: OrderedDict[tuple, dict[str, torch.Tensor]] = OrderedDict()  # a piece's, by layer name: [n, D]
        self._runs: dict[tuple, tuple[tuple, int, int]] = {}  # run key -> (its piece's entry key, rows [lo, hi) of it)

    def lookup(self, ctx: Context, pending: PendingFiring, model: str) -> tuple[int, dict[str, torch.Tensor]] | None:
        """``(k, outputs)``: the outputs of the first ``k`` rows of ``pending`` (just appended to ``ctx``), its
        leading runs found here after the same history; None when not even its first run is."""
        if not servable(pending) or pending.end > ctx.cacheable:
            return None
        found = []
        for run in _run_keys(ctx.row_keys(), pending.start, pending.end, model):
            if run not in self._runs:
                break
            found.append(self._runs[run])
        if not found:
            return None
        for key in dict.fromkeys(key for key, _, _ in found):
            self._entries.move_to_end(key)
        k = sum(hi - lo for _, lo, hi in found)
        if k == pending.end - pending.start:
            self.hits += 1
        else:
            self.partial_hits += 1
        layers = {name: layer_key(pending.op.capture[name]) for name in pending.firing.outputs}
        return k, {name: torch.cat([self._entries[key][layer][lo:hi] for key, lo, hi in found])
                   for name, layer in layers.items()}

    def store(self, ctx: Context, pending: PendingFiring, model: str, outputs: Mapping[str, Any], start: int) -> None:
        """Keep the captured rows of ``pending`` (its piece: rows ``[start, pending.end)``), which ``outputs`` answered."""
        if not servable(pending) or pending.end > ctx.cacheable:
            return
        runs = _run_keys(ctx.row_keys(), start, pending.end, model)
        key = (model, start, pending.end, runs[-1][3], runs[-1][4], runs[0][3])
        if key in self._entries:
            return
        capture = pending.op.capture
        entry = {layer_key(capture[name]): outputs[name].detach().clone() for name in pending.firing.outputs}
        size = sum(t.numel() * t.element_size() for t in entry.values())
        if size > self.max_bytes:
            return
        while self.bytes + size > self.max_bytes:
            old_key, old = self._entries.popitem(last=False)
            self.bytes -= sum(t.numel() * t.element_size() for t in old.values())
            self._runs = {run: at for run, at in self._runs.items() if at[0] != old_key}
        self._entries[key] = entry
        self.bytes += size
        for run in runs:
            self._runs[run] = (key, run[1] - start, run[2] - start)

    def __len__(self) -> int:
        return len(self._entries)


def _run_keys(keys: Any, start: int, end: int, model: str) -> list[tuple]:
    """The entry key of each run of equal row keys in rows ``[start, end)`` (an audio clip: one run per encoder
    window, whose chained key stands for every window before it), in order."""
    cuts = [start, *(i for i in range(start + 1, end) if keys[i] != keys[i - 1]), end]
    history = row_digest.digests(keys, cuts[:-1])
    return [(model, lo, hi, before, tuple(keys[lo:hi])) for (lo, hi), before in zip(pairwise(cuts), history)]


def servable(pending: PendingFiring) -> bool:
    """Whether ``pending``'s answer is its captured rows only, every row of its chunk (what this cache holds)."""
    op, firing = pending.op, pending.firing
    if op is None or firing is None or op.kind != "append" or not op.capture or op.rows.kind != "all":
        return False
    return op.targets is None and bool(firing.outputs) and all(name in op.capture for name in firing.outputs)


def layer_key(layer: int) -> str:
    return f"layer{layer}"
