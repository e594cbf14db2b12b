"""KVCacheEngine: transformer components over one paged KV pool, driven by firings that say what they do to which context.

A firing carries its context operations (``Firing.kv``: ContextOps, see
``ops.py`` and ``walkserve.graph.kv``): append rows to a named context, query
contexts without writing, fork, truncate or drop one. Contexts are named
(request, name) and live in the one pool; every component of a KV share
group (models with the same KV geometry, e.g. pi0's VLM and action expert)
runs in this engine and reads the same contexts. Firings of one request start
in submission order; an operation waits until the contexts it reads or
changes are idle (an append may queue behind appends to its own context).

A firing is answered once its chunk has run, with the outputs it names
(``outputs.OUTPUTS`` plus its capture names; an empty ``outputs`` only fills
the KV). A *lazy* append (``ContextOp.lazy``) that names no output is answered
as soon as its rows are in the context's history: they are computed with the
context's next firing that computes (or a query's restore), so the prefix
cache may stand in for a block that spans two prompt pieces. A lazy append
whose outputs are all captured rows is answered so too when an equal piece
ran after the same history (``capture_cache.py`` keeps those rows by content).
Sampling uses ``firing.sampling`` (greedy when None);
``node_params["token_ranges"]`` (a list of ``[lo, hi)`` id ranges, or a
function of the number of tokens sampled so far returning one) restricts
which ids may be drawn. ``run_groups`` runs a cohort's step as one call (``submit``/``step`` are
the engine's own, used by it and by tests that drive it by hand).

    step():  plan = scheduler.schedule()      which chunks of which contexts, which queries
             outs = runner.execute(chunks)     one forward per model + sampling
             done = scheduler.finish(plan)     advance, cache full blocks, answer
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict, deque
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from walkserve.core.context import context_fits
from walkserve.core.errors import ConfigError
from walkserve.core.options import KVOptions
from walkserve.engines.base import LATER, Engine, Firing, FiringResult, Group, Result
from walkserve.engines.kv.block_manager import BlockManager, ContextKey
from walkserve.engines.kv.capture_cache import CaptureCache, servable
from walkserve.engines.kv.kv_pool import KVPool, KVPoolShape, pool_blocks
from walkserve.engines.kv.migrate import ContextMigration
from walkserve.engines.kv.ops import ContextOp, bind
from walkserve.engines.kv.outputs import OUTPUTS
from walkserve.engines.kv.runner import ModelRunner
from walkserve.engines.kv.scheduler import Query, Scheduler, SchedulerConfig
from walkserve.engines.kv.sequence import PendingFiring
from walkserve.layers.paged_backends import make_paged_backend
from walkserve.layers.sampling import Sampler

log = logging.getLogger(__name__)

_group_ids = itertools.count(-1, -1)
_KNOWN = frozenset(OUTPUTS)


class KVCacheEngine(Engine):
    """Continuous batching, chunked prefill, prefix reuse, preemption and KV contexts for one or more models.

    ``model`` (and every model in ``shared``, components that share this
    pool) follows the KV-cache component interface: ``forward(input_ids [T],
    positions [T] or [A, T], attn, inputs_embeds=None, **token_inputs)`` ->
    hidden [T, D] (``capture`` too, for firings that capture a layer's
    input), ``compute_logits(hidden [N, D]) -> [N, V]``, ``embed(ids) -> [T, D]``
    for embeddings in, and ``config`` with num_hidden_layers,
    num_key_value_heads, head_dim, hidden_size (and vocab_size). ``options``
    (``KVOptions``, default: its defaults): the pool holds ``num_blocks`` blocks
    of ``block_size`` tokens, or as many as ``kv_bytes`` allows, or a device
    default, in ``dtype`` (None: the model's). ``cuda_graphs`` replays decode steps from per-batch-size CUDA graphs
    (``cuda_graphs.py``; buckets ``cuda_graph_sizes``); ``graph_capture``
    replaces the CUDA capturer (tests pass a stand-in that runs on the CPU).
    """

    kv_contexts = True
    migrates = True

    def __init__(
        self,
        component: str,
        model: nn.Module,
        device: torch.device | str,
        dtype: torch.dtype | str | None,
        options: KVOptions | None = None,
        shared: Mapping[str, nn.Module] | None = None,
        graph_capture: Any = None,
    ):
        o = options or KVOptions()
        block_size, cuda_graphs, max_running = o.block_size, o.cuda_graphs, o.max_running
        self.component = component
        self.models = {component: model, **dict(shared or {})}
        self.model = model
        self.device = torch.device(device)
        dtype = _pool_dtype(model, dtype)
        shape = kv_geometry(self.models, block_size, dtype)
        if cuda_graphs and self.device.type != "cuda" and graph_capture is None:
            raise ConfigError(f"component {component!r}: cuda_graphs needs a CUDA device, not {self.device}")
        self.pool = KVPool(shape, pool_blocks(shape, self.device, o.num_blocks, o.kv_bytes), self.device, spare=cuda_graphs)
        self.block_manager = BlockManager(self.pool.num_blocks, block_size, o.prefix_caching)
        self.scheduler = Scheduler(self.block_manager, SchedulerConfig(o.max_batch_tokens, max_running))
        self.migration = ContextMigration(component, self.scheduler, self.block_manager, self.pool)
        self.captures = CaptureCache(o.capture_cache_bytes) if o.prefix_caching and o.capture_cache_bytes else None
        backend = make_paged_backend(o.attention, self.device, dtype, shape.head_dim)
        self.runner = ModelRunner(self.models, self.pool, self.block_manager, backend, Sampler(o.seed))
        if cuda_graphs:
            # lazy: only engines that capture CUDA graphs import it
            from walkserve.engines.kv.cuda_graphs import DEFAULT_SIZES, DecodeGraphs

            sizes = tuple(s for s in (o.cuda_graph_sizes or DEFAULT_SIZES) if s <= max_running) or (max_running,)
            self.runner.graphs = DecodeGraphs(backend, self.pool, sizes, graph_blocks(self.models, block_size),
                                              graph_capture)
        self._ready: list[FiringResult] = []
        self.forwards = 0  # steps that ran the models (each one batch over every scheduled chunk)
        self._queues: dict[str, deque[list]] = defaultdict(deque)  # request -> [[firing, ops, next op index]]
        self._fans: dict[int, FanJoin] = {}  # id(firing) -> the member outputs of a fanned forward so far
        self._inflight: dict[tuple[str, str, tuple[int, ...]], int] = {}  # a group member (request, node, path) -> its firing
        self._owners: dict[int, tuple[str, str, tuple[int, ...]]] = {}  # and back
        self._answers: dict[int, Any] = {}  # a group member's answer, until the worker takes it
        # id(pending) -> (it, its piece's start, the captured rows of the piece's first rows, from the capture cache)
        self._kept: dict[int, tuple[PendingFiring, int, dict[str, torch.Tensor]]] = {}
        self._partial = False  # the last step ran a chunk that did not finish its firing (a prefill, a fan goes on)

    # ---- Engine contract -------------------------------------------------
    def submit(self, firing: Firing) -> None:
        try:
            ops = firing.kv if firing.kv is not None else bind(firing.node, firing.node_params, firing.inputs)
            self._check(firing, ops)
        except (ValueError, TypeError, RuntimeError, AttributeError, KeyError) as err:  # a bad request, never a crash
            self._ready.append(FiringResult(firing, error=f"{self.component}: {err}"))
            return
        rid = firing.request_id
        members = [op for op in ops if op.computes]
        if len(members) > 1:  # a fanned forward: answered once every member chunk has run
            self._fans[id(firing)] = FanJoin(firing, members)
        if rid not in self._queues and len(ops) == 1 and ops[0].kind == "append":  # a decode step: no queue
            ctx = self.scheduler.contexts.get((rid, ops[0].context))
            if ctx is None or not ctx.readers:
                try:
                    self._apply(firing, ops[0])
                except ValueError as err:
                    self._ready.append(FiringResult(firing, error=f"{self.component}: {err}"))
                return
        self._queues[rid].append([firing, ops, 0])
        self._start(rid)

    def step(self) -> list[FiringResult]:
        results, self._ready = self._ready, []
        plan = self.scheduler.schedule()
        self._partial = any(c.completes is None and c.context is not None and _head_waits(c.context)
                            for c in plan.chunks)
        if not plan.chunks:
            return results
        self.forwards += 1
        try:
            outputs = self.runner.execute(plan.chunks)
        except Exception as err:  # a failing batch fails its requests, never the worker loop
            log.exception("%s: step failed", self.component)
            for chunk in plan.chunks:
                self._fail_request(chunk.query.reads[0].request_id if chunk.query else chunk.context.request_id,
                                   f"{self.component}: step failed: {err!r}")
            return results + self._take_ready()
        by_firing = {id(c.completes): out for c, out in zip(plan.chunks, outputs) if c.completes is not None}
        for ctx, pending in self.scheduler.finish(plan):
            out = by_firing.get(id(pending)) or {}
            if ctx is not None and "token" in out:
                ctx.sampled.append(int(out["token"][0]))
            fan = self._fans.get(id(pending.firing))
            held, start, kept = self._kept.pop(id(pending), (None, pending.start, None))
            if held is pending:  # the piece's first rows came from the capture cache
                out = {**out, **{name: torch.cat([rows.to(out[name].device), out[name]]) for name, rows in kept.items()}}
            if self.captures is not None and fan is None and ctx is not None and servable(pending):
                self.captures.store(ctx, pending, self._model_name(pending.firing), out, start)
            if fan is not None:
                out = fan.put(pending.op, out)
                if out is None:
                    continue
                del self._fans[id(pending.firing)]
            results.append(FiringResult(pending.firing, outputs=out))
        # a fanned firing with members still to run goes on too: yield between its steps, as between prefill chunks
        self._partial = self._partial or any(c.pending is not None and id(c.pending.firing) in self._fans
                                             for c in plan.chunks)
        for rid in [rid for rid, queue in self._queues.items() if queue]:  # operations waiting for idle contexts
            self._start(rid)
        return results + self._take_ready()

    def run_groups(self, groups: list[Group], may_yield: bool = False) -> list[list[Result]]:
        """Every member of every group submitted first, then stepped until all are answered: the queries of
        several nodes (a CFG step's passes) and of every member share the steps' forwards.

        With ``may_yield`` it returns (``LATER`` for the members not answered yet) after a step that ran a
        prefill chunk short of its firing's end, or some of a fanned firing's member chunks with more to run:
        those members stay in flight here, and the worker offers them again in a later pass, which goes on from
        there (``_inflight``); a long prefill runs one chunk per pass, a fan wider than a step one step of its
        members per pass, and the other cohorts' steps run between."""
        for group in groups:  # the members come in the rank's order (least slack first): the steps keep it
            for rid in group.request_ids:
                self.scheduler.urge(rid)
        ids = [[self._firing_for(group, i) for i in range(len(group.request_ids))] for group in groups]
        wanted = {fid for part in ids for fid in part}
        answers, others = self._answers, []
        while not wanted <= answers.keys():
            stepped = self.step()
            for r in stepped:
                if r.firing.id in self._owners:
                    answers[r.firing.id] = r.answer()
                else:
                    others.append(r)
            if (not stepped and not self.has_work()) or (may_yield and self._partial):
                break
        self._ready = others + self._ready
        later = may_yield and not wanted <= answers.keys()
        return [[self._answer(fid, later) for fid in part] for part in ids]

    def _firing_for(self, group: Group, i: int) -> int:
        """The id of member ``i``'s firing: the one in flight for it, else a new one, submitted."""
        rid, path = group.request_ids[i], group.paths[i]
        key = (rid, group.node, path)
        fid = self._inflight.get(key)
        if fid is not None:
            return fid
        firing = Firing(next(_group_ids), rid, group.walk, group.node, group.component, group.op, path,
                        group.inputs[i], group.outputs, group.params[i], group.sampling[i], group.node_params,
                        kv=group.kv[i] if group.kv else None)
        self._inflight[key] = firing.id
        self._owners[firing.id] = key
        self.submit(firing)
        return firing.id

    def _answer(self, fid: int, later: bool) -> Result:
        answer = self._answers.pop(fid, None)
        if answer is None:
            if later:
                return LATER
            answer = f"{self.component}: the firing was never answered"
        del self._inflight[self._owners.pop(fid)]
        return answer

    def export_contexts(self, request_id: str, names: list[str]) -> list[Any]:
        return self.migration.export_contexts(request_id, names)

    def import_contexts(self, request_id: str, contexts: list[Any]) -> None:
        self.migration.import_contexts(request_id, contexts)

    def has_work(self) -> bool:
        return (bool(self._ready) or bool(self.scheduler.queries)
                or any(c.has_work for c in self.scheduler.contexts.values()))

    def step_capacity(self) -> int | None:
        return self.scheduler.config.max_running

    def release(self, request_id: str) -> None:
        for key in [k for k in self._inflight if k[0] == request_id]:
            fid = self._inflight.pop(key)
            del self._owners[fid]
            self._answers.pop(fid, None)
        self._queues.pop(request_id, None)
        self._fans = {k: j for k, j in self._fans.items() if j.firing.request_id != request_id}
        self._drop_kept(request_id)
        self.scheduler.drop_request(request_id)
        self._ready = [r for r in self._ready if r.firing.request_id != request_id]

    def stats(self) -> dict[str, float]:
        bm = self.block_manager
        graphs = self.runner.graphs
        extra = {} if graphs is None else {f"cuda_graph_{k}": v for k, v in graphs.stats.items()}
        forwards = {f"{what}.{name}": counts[i] for name, counts in self.runner.forwards.items()
                    for i, what in enumerate(("forwards", "forward_chunks", "forward_rows", "forward_s"))}
        return extra | forwards | {
            "kv_blocks_used": bm.num_used,
            "kv_blocks_total": bm.num_blocks,
            "kv_tokens_total": bm.num_blocks * bm.block_size,  # what one context may grow to (the API's bound)
            "kv_blocks_cached": bm.num_evictable,
            "kv_contexts": len(self.scheduler.contexts),
            "forward_steps": self.forwards,
            "preemptions": self.scheduler.preemptions,
            "prefix_hit_tokens": self.scheduler.prefix_hit_tokens,
            "capture_cache_hits": self.captures.hits if self.captures is not None else 0,
            "capture_cache_partial_hits": self.captures.partial_hits if self.captures is not None else 0,
            "capture_cache_bytes": self.captures.bytes if self.captures is not None else 0,
            "prefill_tokens": self.scheduler.prefill_tokens,
            "running": self.scheduler.num_running(),
            "waiting": self.scheduler.num_waiting(),
        }

    def state_count(self) -> int:
        """Requests with any context here (token history, and KV blocks unless preempted)."""
        return len({key[0] for key in self.scheduler.contexts} | {rid for rid, q in self._queues.items() if q})

    def close(self) -> None:
        for key in list(self.scheduler.contexts):
            self.scheduler.drop(key)
        if self.runner.graphs is not None:
            self.runner.graphs.captured.clear()
        self.pool.k = self.pool.v = torch.empty(0)

    # ---- operations ------------------------------------------------------
    def _start(self, rid: str) -> None:
        """Apply the request's queued operations in order, as far as their contexts allow."""
        queue = self._queues.get(rid)
        while queue:
            entry = queue[0]
            firing, ops, i = entry
            while i < len(ops) and self._ready_for(rid, ops[i]):
                try:
                    self._apply(firing, ops[i])
                except ValueError as err:
                    if id(firing) in self._fans:  # members already queued would answer it later: end the request
                        self._fail_request(rid, f"{self.component}: {err}")
                        return
                    self._ready.append(FiringResult(firing, error=f"{self.component}: {err}"))
                    i = len(ops) + 1
                    break
                i += 1
            entry[2] = i
            if i < len(ops):
                return
            queue.popleft()
            if i == len(ops) and not any(op.computes for op in ops):
                self._ready.append(FiringResult(firing, outputs={}))
        self._queues.pop(rid, None)

    def _idle(self, rid: str, name: str, readers_ok: bool = False) -> bool:
        c = self.scheduler.contexts.get((rid, name))
        return c is None or (not c.has_work and (readers_ok or not c.readers))

    def _ready_for(self, rid: str, op: ContextOp) -> bool:
        """Whether ``op`` may start: the contexts it reads or changes are idle (an append only needs no readers)."""
        if op.kind == "query":
            return all(self._idle(rid, name, readers_ok=True) for name in op.reads)
        if op.kind == "append":
            c = self.scheduler.contexts.get((rid, op.context))
            return c is None or not c.readers
        if op.kind == "fork":
            return self._idle(rid, op.source, readers_ok=True) and self._idle(rid, op.context)
        return self._idle(rid, op.context)

    def _apply(self, firing: Firing, op: ContextOp) -> None:
        rid, key = firing.request_id, (firing.request_id, op.context)
        s = self.scheduler
        if op.kind == "append":
            ctx = s.context(key, firing.component)
            ids = op.token_ids.tolist() if op.token_ids is not None else [0] * op.num_tokens
            if ctx.axes != 1 and op.positions is not None and op.positions.dim() == 1 and ctx.length:
                raise ValueError(f"context {op.context!r} holds {ctx.axes}-axis positions; got 1-D positions")
            pending = ctx.append(firing, ids, op, firing.component)
            self._check_capacity(ctx.key, ctx.length)
            if op.lazy and not firing.outputs and not op.row_outputs and id(firing) not in self._fans:
                ctx.pending.remove(pending)  # fills only: its rows are computed with the next firing that needs them
                self._ready.append(FiringResult(firing, outputs={}))
            elif op.lazy and self.captures is not None and id(firing) not in self._fans and s.contexts.get(key) is ctx:
                found = self.captures.lookup(ctx, pending, self._model_name(firing))
                if found is not None and found[0] == pending.end - pending.start:
                    ctx.pending.remove(pending)  # an equal piece ran after the same history: its rows become history
                    self._ready.append(FiringResult(firing, outputs=found[1]))
                elif found is not None:  # its first rows did: only the rest are computed, those kept go ahead
                    self._kept[id(pending)] = (pending, pending.start, found[1])
                    pending.start += found[0]
        elif op.kind == "query":
            reads = tuple(s.context((rid, name), firing.component) for name in op.reads)
            blocks = sum(-(-c.length // self.block_manager.block_size) for c in {id(c): c for c in reads}.values())
            if blocks > self.pool.num_blocks:
                raise ValueError(f"the contexts {list(op.reads)} a query reads need {blocks} blocks together; "
                                 f"the pool of {self.component} holds {self.pool.num_blocks}")
            s.add_query(Query(reads, PendingFiring(firing, op.num_tokens, 0, op), firing.component))
        elif op.kind == "fork":
            s.context((rid, op.source), firing.component)
            s.fork((rid, op.source), key)
        elif op.kind == "truncate":
            ctx = s.context(key, firing.component)
            if op.length < ctx.length:
                seg = ctx.segment_at(op.length)
                if (op.length - seg.start) % seg.unit():
                    raise ValueError(f"truncate of {op.context!r} to {op.length} cuts a {seg.mask} block")
            s.truncate(key, op.length)
        else:
            s.drop(key)

    def _model_name(self, firing: Firing) -> str:
        return firing.component if firing.component in self.models else self.component

    def _check_capacity(self, key: ContextKey, length: int) -> None:
        capacity = self.pool.num_blocks * self.block_manager.block_size
        if not context_fits(length, capacity):  # the frontend's policy, against the pool
            self._fail_request(key[0], f"context {key} needs {length} tokens of KV cache but the pool of "
                               f"{self.component} holds only {capacity} tokens ({self.pool.num_blocks} blocks of "
                               f"{self.block_manager.block_size})")

    def _check(self, firing: Firing, ops: tuple[ContextOp, ...]) -> None:
        model = self.models.get(firing.component) or self.model
        unknown = [o for o in firing.outputs if o not in _KNOWN and not any(o in op.capture for op in ops)]
        if unknown:
            raise ValueError(f"node {firing.node!r} asks for unknown outputs {sorted(unknown)}; known: {OUTPUTS}")
        cfg = model.config
        vocab = getattr(cfg, "vocab_size", None)
        for op in ops:
            if op.token_ids is not None and vocab is not None and op.token_ids.numel():
                if op.token_ids.numel() <= 64:  # a decode: a list is far cheaper than two reductions
                    ids = op.token_ids.tolist()
                    lo, hi = min(ids), max(ids)
                else:
                    lo, hi = int(op.token_ids.min()), int(op.token_ids.max())
                if lo < 0 or hi >= vocab:
                    bad = [t for t in op.token_ids.tolist() if not 0 <= t < vocab]
                    raise ValueError(f"token ids {bad[:5]} of node {firing.node!r} are outside the vocabulary [0, {vocab})")
            width = getattr(cfg, "embed_size", None) or cfg.hidden_size
            if op.embeds is not None and op.embeds.shape[1] != width:
                raise ValueError(f"embeddings of node {firing.node!r} have width {op.embeds.shape[1]}, the model {width}")
            if not op.capture:
                continue
            if not self.runner.takes_capture.get(firing.component, self.runner.takes_capture[self.component]):
                raise ValueError(f"node {firing.node!r} captures layer inputs, but {type(model).__name__}.forward takes no capture")
            if any(k >= cfg.num_hidden_layers for k in op.capture.values()):
                raise ValueError(f"node {firing.node!r} captures a layer past the model's {cfg.num_hidden_layers}")

    def _fail_request(self, rid: str, message: str) -> None:
        failed = [q.pending.firing for q in self.scheduler.queries if q.reads[0].request_id == rid]
        failed += [p.firing for c in self.scheduler.drop_request(rid) if c for p in c.pending if p.firing is not None]
        failed += [entry[0] for entry in self._queues.pop(rid, ())]
        for firing in {id(f): f for f in failed}.values():
            self._fans.pop(id(firing), None)
            self._ready.append(FiringResult(firing, error=message))
        self._drop_kept(rid)

    def _drop_kept(self, rid: str) -> None:
        self._kept = {k: v for k, v in self._kept.items() if v[0].firing.request_id != rid}

    def _take_ready(self) -> list[FiringResult]:
        ready, self._ready = self._ready, []
        return ready


class FanJoin:
    """The outputs of a fanned forward's member chunks, joined in member order once all have run."""

    def __init__(self, firing: Firing, members: list[ContextOp]):
        self.firing = firing
        self.index = {id(op): i for i, op in enumerate(members)}
        self.outputs: list[dict[str, Any] | None] = [None] * len(members)
        self.missing = len(members)

    def put(self, op: ContextOp, outputs: dict[str, Any]) -> dict[str, Any] | None:
        """Record one member's outputs; the joined outputs once every member has answered, else None."""
        i = self.index[id(op)]
        if self.outputs[i] is None:
            self.missing -= 1
        self.outputs[i] = outputs
        if self.missing:
            return None
        joined = {}
        for name in self.outputs[0]:
            parts = [out[name] for out in self.outputs]
            joined[name] = torch.stack(parts) if name == "logits" and parts[0].dim() == 1 else torch.cat(parts)
        return joined


def kv_geometry(models: Mapping[str, nn.Module], block_size: int, dtype: torch.dtype) -> KVPoolShape:
    """The pool shape the models share; ValueError naming two whose layers, KV heads or head dim differ."""
    shapes = {}
    for name, model in models.items():
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        shapes[name] = (cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim)
    first, geometry = next(iter(shapes.items()))
    for name, other in shapes.items():
        if other != geometry:
            raise ValueError(f"components {first!r} and {name!r} cannot share a KV pool: (layers, KV heads, head dim) "
                             f"{geometry} != {other}")
    return KVPoolShape(*geometry, block_size, dtype)


def graph_blocks(models: Mapping[str, nn.Module], block_size: int) -> int | None:
    """Blocks per context a decode graph covers: the models' shortest ``max_position_embeddings`` (None: the pool)."""
    lengths = [getattr(m.config, "max_position_embeddings", None) for m in models.values()]
    lengths = [n for n in lengths if n]
    return -(-min(lengths) // block_size) if lengths else None


def _pool_dtype(model: nn.Module, dtype: torch.dtype | str | None) -> torch.dtype:
    """The KV pool's dtype: ``dtype`` if given (name or dtype), else the model's parameter dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype:
        resolved = getattr(torch, dtype, None)
        if not isinstance(resolved, torch.dtype):
            raise ValueError(f"unknown KV pool dtype {dtype!r}")
        return resolved
    param = next(model.parameters(), None)
    return param.dtype if param is not None else torch.float32


def _head_waits(ctx: Any) -> bool:
    """Whether a firing waits on ``ctx``'s rows: a chunk that does not finish it is a prefill that goes on (its own
    rows, or rows before it: a lazy piece's, or a preempted history's)."""
    return bool(ctx.pending) and ctx.pending[0].firing is not None
