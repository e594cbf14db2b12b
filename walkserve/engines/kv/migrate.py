"""A request's KV contexts leaving one engine and entering another (prefill on one rank, decode on another).

    export  (source rank)   the request's named contexts, idle: their history (token ids,
                            segments with their writers, sampled ids, the running position) and the K/V of
                            its computed rows, gathered from its blocks; then dropped here
    import  (target rank)   the history, and the K/V written into freshly reserved blocks,
                            so the next firing continues where the source stopped

What moves is ``protocol.messages.ContextState`` (tensors in its fields; the
worker packs them for the wire: shared memory on one host, inline over TCP).
If the target pool has no room for the K/V, the context arrives without it
and is recomputed from its segments when next used, as after a preemption:
slower, never wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from walkserve.engines.kv.block_manager import BlockManager
from walkserve.engines.kv.kv_pool import KVPool
from walkserve.engines.kv.scheduler import Scheduler
from walkserve.engines.kv.sequence import Context, Segment
from walkserve.protocol.messages import ContextState, SegmentState


@dataclass(frozen=True)
class ContextMigration:
    """Moves contexts out of and into one KV engine's scheduler, block manager and pool (the engine owns one)."""

    component: str
    scheduler: Scheduler
    block_manager: BlockManager
    pool: KVPool

    def export_contexts(self, request_id: str, names: list[str]) -> list[ContextState]:
        """The request's contexts ``names`` (each with its fanned members ``name[i]``) as they move, removed from
        the engine; ValueError if one is still busy."""
        s, bm, pool = self.scheduler, self.block_manager, self.pool
        members = tuple(f"{n}[" for n in names)
        keys = [k for k in s.contexts if k[0] == request_id and (k[1] in names or k[1].startswith(members))]
        busy = [k[1] for k in keys if s.contexts[k].has_work or s.contexts[k].readers]
        if busy:
            raise ValueError(f"{self.component}: contexts {busy} of {request_id} still have work; they cannot move")
        out = []
        for key in keys:
            ctx = s.contexts[key]
            n = ctx.num_computed if bm.has(key) else 0
            k = v = None
            if n:
                slots = torch.tensor([bm.slot(key, p) for p in range(n)], device=pool.device)
                shape = pool.k.shape
                k = pool.k.view(shape[0], -1, *shape[3:])[:, slots].cpu()  # k: [L, n, Hkv, Dh]
                v = pool.v.view(shape[0], -1, *shape[3:])[:, slots].cpu()  # v: [L, n, Hkv, Dh]
            out.append(ContextState(
                key[1], ctx.component, list(ctx.token_ids), list(ctx.sampled), [_segment_state(g) for g in ctx.segments],
                _cache_limit(ctx), ctx.next_position, ctx.axes, k, v,
            ))
            s.drop(key)
        return out

    def import_contexts(self, request_id: str, states: list[ContextState]) -> None:
        """The moved contexts of ``request_id`` in the engine, their K/V in the pool where it fits."""
        s, bm, pool = self.scheduler, self.block_manager, self.pool
        for st in states:
            key = (request_id, st.name)
            s.drop(key)
            ctx = s.context(key, st.component)
            ctx.token_ids, ctx.sampled = list(st.token_ids), list(st.sampled)
            ctx.segments = [_segment(g) for g in st.segments]
            ctx.cache_limit, ctx.next_position, ctx.axes = st.cache_limit, st.next_position, st.axes
            n = st.k.shape[1] if st.k is not None else 0
            if not n or not bm.append_slots(key, n):
                ctx.num_computed = 0  # no room (or nothing computed): recomputed from the segments when used
                continue
            slots = torch.tensor([bm.slot(key, p) for p in range(n)], device=pool.device)
            shape = pool.k.shape
            pool.k.view(shape[0], -1, *shape[3:])[:, slots] = st.k.to(pool.device, pool.k.dtype)
            pool.v.view(shape[0], -1, *shape[3:])[:, slots] = st.v.to(pool.device, pool.v.dtype)
            ctx.num_computed = n
            bm.commit(key, ctx.token_ids, min(n, ctx.cacheable))


def _cache_limit(ctx: Context) -> int | None:
    """The moved history's cache limit: content-keyed rows do not move their keys, so they stay unshared there."""
    keyed = [g.start for g in ctx.segments if g.keyed]
    return ctx.cache_limit if not keyed else min([keyed[0], *([ctx.cache_limit] if ctx.cache_limit is not None else [])])


def _segment_state(g: Segment) -> SegmentState:
    return SegmentState(g.start, g.n, g.mask, g.frame, g.pos_base, g.positions, g.embeds, g.embed_rows,
                        dict(g.token_inputs), g.axes, g.component)


def _segment(g: SegmentState) -> Segment:
    return Segment(g.start, g.n, g.mask, g.frame, g.pos_base, g.positions, g.embeds, g.embed_rows,
                   dict(g.token_inputs), g.axes, g.component)
