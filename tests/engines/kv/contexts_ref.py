"""A dense, uncached reference for KV contexts, and helpers that drive KVCacheEngine with declared context ops.

A reference context is a list of segments (what each append added). Its rows
attend to every row of earlier segments and to their own segment's rows under
the segment's mask. A query's rows attend to every row of the contexts it
reads, concatenated, and to each other under the query's mask. ``dense`` runs
one DenseAttention forward over that joint layout (no cache, no paging).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from walkserve.engines.base import Firing
from walkserve.engines.kv.engine import KVCacheEngine
from walkserve.layers.attention import DenseAttention, block_causal_mask

_ids = itertools.count()


@dataclass
class Seg:
    """One chunk: ids [n] (0 where embeds stand in), embeds [n, D] rows or None, positions [n] or [A, n], mask."""

    ids: torch.Tensor
    positions: torch.Tensor
    mask: str = "causal"
    frame: int = 0
    embeds: torch.Tensor | None = None  # [n, D] (rows without embeddings are ignored where embed_rows says so)
    embed_rows: torch.Tensor | None = None

    @property
    def n(self) -> int:
        return self.ids.numel()


@dataclass
class RefContexts:
    """The reference state: context name -> segments."""

    contexts: dict[str, list[Seg]] = field(default_factory=dict)

    def append(self, name: str, seg: Seg) -> None:
        self.contexts.setdefault(name, []).append(seg)

    def fork(self, src: str, dst: str) -> None:
        self.contexts[dst] = list(self.contexts.get(src, []))

    def truncate(self, name: str, n: int) -> None:
        kept, total = [], 0
        for seg in self.contexts.get(name, []):
            if total >= n:
                break
            take = min(seg.n, n - total)
            if take < seg.n:
                rows = seg.embed_rows
                keep = None if rows is None else rows < take
                seg = Seg(seg.ids[:take], seg.positions[..., :take], seg.mask, seg.frame,
                          None if seg.embeds is None else (seg.embeds[:take] if rows is None else seg.embeds[keep]),
                          None if rows is None else rows[keep])
            kept.append(seg)
            total += take
        self.contexts[name] = kept

    def length(self, name: str) -> int:
        return sum(s.n for s in self.contexts.get(name, []))


def chunk_mask(kind: str, n: int, frame: int, device) -> torch.Tensor:
    """The reference's own mask among one chunk's rows (independent of the engine's)."""
    if kind == "full":
        return torch.ones(n, n, dtype=torch.bool, device=device)
    if kind == "block_causal":
        return block_causal_mask(n // frame, frame, device)
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def _within(segs: list[Seg], device) -> torch.Tensor:
    """bool [N, N] of one context: earlier segments in full, the own segment under its mask."""
    n = sum(s.n for s in segs)
    allowed = torch.zeros(n, n, dtype=torch.bool, device=device)
    start = 0
    for s in segs:
        allowed[start : start + s.n, :start] = True
        inner = chunk_mask(s.mask, s.n, s.frame, device)
        allowed[start : start + s.n, start : start + s.n] = inner
        start += s.n
    return allowed


def dense(model, groups: list[list[Seg]], query: Seg | None = None, capture: tuple[int, ...] = ()):
    """Hidden [N, D] (and captured layer inputs) of the joint layout: each group a context, then the query's rows."""
    segs = [s for g in groups for s in g] + ([query] if query is not None else [])
    ids = torch.cat([s.ids for s in segs])
    positions = torch.cat([s.positions for s in segs], dim=-1)
    x = model.embed(ids)
    row = 0
    for s in segs:
        if s.embeds is not None:
            rows = torch.arange(s.n) if s.embed_rows is None else s.embed_rows
            x[row + rows] = s.embeds
        row += s.n
    n = ids.numel()
    allowed = torch.zeros(n, n, dtype=torch.bool)
    start = 0
    for g in groups:
        m = sum(s.n for s in g)
        allowed[start : start + m, start : start + m] = _within(g, "cpu")
        start += m
    if query is not None:
        allowed[start:, :start] = True
        inner = chunk_mask(query.mask, query.n, query.frame, "cpu")
        allowed[start:, start:] = inner
    cap = {k: None for k in capture}
    with torch.no_grad():
        hidden = model(ids, positions, DenseAttention(allowed), inputs_embeds=x, capture=cap or None)
    return hidden, cap


def firing(rid: str, node_params: dict, inputs: dict, outputs=("hidden",), sampling=None, node="lm",
           component="lm") -> Firing:
    return Firing(next(_ids), rid, "w", node, component, "forward", (), dict(inputs), tuple(outputs),
                  sampling=sampling, node_params=node_params)


def run(engine: KVCacheEngine, firings: list[Firing], max_steps: int = 500) -> dict[int, dict]:
    """Submit the firings together and step until each is answered; results by firing id (errors raise)."""
    for f in firings:
        engine.submit(f)
    want = {f.id for f in firings}
    got: dict[int, dict] = {}
    for _ in range(max_steps):
        for r in engine.step():
            assert r.error is None, r.error
            got[r.firing.id] = r.outputs
        if want <= set(got):
            return got
    raise AssertionError(f"firings {sorted(want - set(got))} were never answered")
