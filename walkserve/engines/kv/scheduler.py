"""Which rows of which contexts run in the next step, and which queries (plain ints, no tensors).

Each step fills a token budget:
  1. contexts that hold blocks and have work: decodes first, then prefill
     chunks, each in urgency order (``urge``: the order the rank's scheduler
     offered their requests last, least playback slack first; else admission
     order); a context short of blocks preempts
     idle contexts (holding blocks without work and read by no waiting
     query, latest first), then later-admitted contexts not yet in this step
     (latest first), then shrinks its chunk to what fits, and preempts itself
     when nothing fits;
  2. queries whose contexts are all in the pool and idle, whole (a query is
     never split: its rows attend to each other and are kept nowhere);
  3. waiting contexts (work, no blocks) in urgency order: attach their
     cached prefix, then take a chunk of what the budget and pool allow; a
     waiting context preempts idle ones only when nothing else runs this step,
     so progress is guaranteed without thrashing running work, or (a *hog's*)
     idle contexts of another request that holds blocks for more than
     ``share`` contexts;
  4. the contexts of 1. and 3. past their request's first ``share``
     (``SchedulerConfig.share``, half of ``max_running``), in the same order:
     a request with many contexts at work (a fan's K members) fills what the
     others left, never the whole step ahead of them.
A chunk lies inside one segment and never runs past the end of the context's
oldest pending firing; a ``full`` segment runs whole and a ``block_causal``
one in whole frames. A unit larger than the budget runs alone in a step.
Preemption frees a context's blocks (its full blocks stay in the prefix cache)
and recomputes it later from its segments.
The prefix cache also serves a running context's later firings (the next piece
of a prompt, a follow-up turn): a chunk stops at a block boundary when the
block after it is cached, and a context on a boundary attaches the cached
blocks that continue it before its next chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from walkserve.engines.kv.block_manager import BlockManager, ContextKey
from walkserve.engines.kv.sequence import Context, PendingFiring, Segment


@dataclass(frozen=True)
class SchedulerConfig:
    """Per-step limits: tokens computed in one forward, contexts in one batch."""

    max_batch_tokens: int = 2048
    max_running: int = 64

    def __post_init__(self) -> None:
        if self.max_batch_tokens < 1 or self.max_running < 1:
            raise ValueError(f"max_batch_tokens and max_running must be >= 1, got {self}")

    @property
    def share(self) -> int:
        """Chunks one request's contexts take in a step before the other requests' contexts have had theirs."""
        return max(1, self.max_running // 2)


@dataclass
class Query:
    """A submitted query: ``pending.op`` attends to ``reads`` (in order) and writes nothing."""

    reads: tuple[Context, ...]
    pending: PendingFiring
    component: str = ""

    @property
    def num_tokens(self) -> int:
        return self.pending.end


@dataclass
class ScheduledChunk:
    """Compute rows ``[start, start + num_tokens)`` of ``context`` (an append) or all of ``query``'s rows.

    ``pending``: the firing these rows belong to while it is unanswered (None for
    a recomputed past); ``completes``: the firing this chunk finishes, if it does.
    Both are fixed when the chunk is planned.
    """

    context: Context | None
    start: int
    num_tokens: int
    query: Query | None = None
    segment: Segment | None = None  # an append's segment (the chunk lies inside it)
    pending: PendingFiring | None = None
    completes: PendingFiring | None = None

    @staticmethod
    def of_context(ctx: Context, n: int) -> ScheduledChunk:
        start, head = ctx.num_computed, ctx.pending[0]
        end, live = start + n, head.firing is not None
        return ScheduledChunk(ctx, start, n, None, ctx.segment_at(start), head if live and end > head.start else None,
                              head if live and end == head.end else None)

    @staticmethod
    def of_query(query: Query) -> ScheduledChunk:
        return ScheduledChunk(None, 0, query.num_tokens, query, None, query.pending, query.pending)

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def component(self) -> str:
        """The model that computes the chunk: the query's, or the segment's writer (else the context's)."""
        if self.query is not None:
            return self.query.component
        return (self.segment.component if self.segment is not None else "") or self.context.component


@dataclass
class StepPlan:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[ContextKey] = field(default_factory=list)
    reading: set[ContextKey] = field(default_factory=set)  # contexts this step's queries read

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    def scheduled(self) -> set[ContextKey]:
        return {c.context.key for c in self.chunks if c.context is not None} | self.reading


class Scheduler:
    """Owns the contexts, the queries and the block manager; plans steps and books their completion."""

    def __init__(self, block_manager: BlockManager, config: SchedulerConfig):
        self.bm = block_manager
        self.config = config
        self.contexts: dict[ContextKey, Context] = {}
        self.queries: list[Query] = []
        self.preemptions = 0
        self.prefix_hit_tokens = 0
        self.prefill_tokens = 0  # rows computed for firings of more than one row (prompts), recomputation included
        self._next_order = 0
        self.urgency: dict[str, int] = {}  # request -> when it was last offered (``urge``); lower runs first

    # ---- contexts ------------------------------------------------------
    def context(self, key: ContextKey, component: str = "") -> Context:
        """The context of ``key``, created empty on first use."""
        if key not in self.contexts:
            self.contexts[key] = Context(key, self._take_order(), component)
        return self.contexts[key]

    def _take_order(self) -> int:
        self._next_order += 1
        return self._next_order - 1

    def drop(self, key: ContextKey) -> Context | None:
        self.bm.free(key)
        return self.contexts.pop(key, None)

    def urge(self, request_id: str) -> None:
        """The request was offered now (call in the order the caller ranks them, most urgent first): when a
        step cannot take every context with work, its contexts go after those offered before it and before
        those offered after it. Preemption keeps admission order."""
        self.urgency[request_id] = self._take_order()

    def _urgency(self, ctx: Context) -> int:
        return self.urgency.get(ctx.request_id, ctx.order)

    def drop_request(self, request_id: str) -> list[Context]:
        self.urgency.pop(request_id, None)
        self.queries = [q for q in self.queries if q.reads[0].request_id != request_id]
        return [self.drop(k) for k in [k for k in self.contexts if k[0] == request_id]]

    def fork(self, src: ContextKey, dst: ContextKey) -> Context:
        """``dst`` becomes a snapshot of ``src`` (idle), sharing its blocks when it holds any."""
        source = self.contexts[src]
        assert not source.has_work, f"fork of busy context {src}"
        self.drop(dst)
        copy = source.snapshot(dst, self._take_order())
        self.contexts[dst] = copy
        if self.bm.has(src):
            self.bm.fork(src, dst)
        else:
            copy.num_computed = 0
        return copy

    def truncate(self, key: ContextKey, length: int) -> None:
        ctx = self.contexts[key]
        assert not ctx.has_work, f"truncate of busy context {key}"
        ctx.truncate(length)
        if self.bm.has(key):
            self.bm.truncate(key, ctx.length)

    def add_query(self, query: Query) -> None:
        for ctx in query.reads:
            ctx.readers += 1
        self.queries.append(query)

    def num_running(self) -> int:
        held = sum(1 for c in self.contexts.values() if c.has_work and self.bm.has(c.key))
        return held + len(self.queries)

    def num_waiting(self) -> int:
        return sum(1 for c in self.contexts.values() if c.has_work and not self.bm.has(c.key))

    # ---- planning ------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Plan one step and reserve its slots. Call ``finish(plan)`` once the step ran.

        A request's contexts take at most ``config.share`` chunks until every other request's (held, queries,
        waiting) had its turn; its other contexts then fill what the step has left. So a fan of thousands of
        member contexts (a CEM plan's candidates) leaves room in every step for the other requests' chunks."""
        plan = StepPlan()
        budget = self.config.max_batch_tokens
        held = [c for c in self.contexts.values() if c.has_work and self.bm.has(c.key)]
        held, held_rest = self._share(sorted(held, key=lambda c: (c.remaining > 1, self._urgency(c), c.order)))
        budget = self._schedule_held(plan, held, budget)
        if budget is None:  # full before every held context had its turn
            return plan
        budget = self._schedule_queries(plan, budget)
        waiting = [c for c in self.contexts.values() if c.has_work and not self.bm.has(c.key)]
        waiting, waiting_rest = self._share(sorted(waiting, key=lambda c: (self._urgency(c), c.order)))
        budget, admitting = self._schedule_waiting(plan, waiting, budget)
        budget = self._schedule_held(plan, held_rest, budget)
        if budget is not None and admitting:
            self._schedule_waiting(plan, waiting_rest, budget)
        return plan

    def _share(self, contexts: list[Context]) -> tuple[list[Context], list[Context]]:
        """``contexts`` (in order) split into each request's first ``config.share`` and the rest."""
        first: list[Context] = []
        rest: list[Context] = []
        taken: dict[str, int] = {}
        for ctx in contexts:
            n = taken.get(ctx.request_id, 0)
            (first if n < self.config.share else rest).append(ctx)
            taken[ctx.request_id] = n + 1
        return first, rest

    def _full(self, plan: StepPlan, budget: int) -> bool:
        return budget <= 0 or len(plan.chunks) == self.config.max_running

    def _schedule_held(self, plan: StepPlan, held: list[Context], budget: int) -> int | None:
        """The budget left after ``held``'s chunks; None when the step filled up before the last had its turn."""
        for ctx in held:
            if self._full(plan, budget):
                return None
            if self.bm.has(ctx.key):  # not preempted earlier in this step
                budget -= self._add(plan, ctx, self._reserve_running(ctx, self._running_chunk(ctx, budget, plan), plan))
        return budget

    def _schedule_waiting(self, plan: StepPlan, waiting: list[Context], budget: int) -> tuple[int, bool]:
        """The budget left after admitting ``waiting`` in turn, and False once one could not be (no more this step)."""
        for ctx in waiting:
            if self._full(plan, budget):
                return budget, False
            if ctx.key in plan.preempted:
                continue
            n = self._admit(ctx, budget, plan)
            if n == 0:
                return budget, False
            budget -= self._add(plan, ctx, n)
        return budget, True

    def _schedule_queries(self, plan: StepPlan, budget: int) -> int:
        for query in self.queries:
            if len(plan.chunks) == self.config.max_running:
                break
            if query.num_tokens > budget and plan.chunks:
                continue
            ready = True
            for ctx in query.reads:
                if ctx.length and (not self.bm.has(ctx.key) or ctx.num_computed < ctx.length):
                    ctx.restore()  # recompute it first (it was preempted)
                    ready = False
            if ready and not any(c.has_work for c in query.reads):
                plan.chunks.append(ScheduledChunk.of_query(query))
                plan.reading.update(c.key for c in query.reads)
                budget -= query.num_tokens
        return budget

    def finish(self, plan: StepPlan) -> list[tuple[Context | None, PendingFiring]]:
        """Book a step that ran: advance contexts, register full blocks, pop the answered firings."""
        done: list[tuple[Context | None, PendingFiring]] = []
        for chunk in plan.chunks:
            if chunk.query is not None:
                self._end_query(chunk.query)
                done.append((None, chunk.query.pending))
                continue
            ctx = chunk.context
            ctx.num_computed = chunk.end
            if chunk.num_tokens > 1 or ctx.pending[0].end - ctx.pending[0].start > 1:
                self.prefill_tokens += chunk.num_tokens
            self.bm.commit(ctx.key, ctx.row_keys(), min(ctx.num_computed, ctx.cacheable))
            if ctx.num_computed == ctx.target:
                pending = ctx.pending.popleft()
                if pending.firing is not None:
                    done.append((ctx, pending))
        return done

    def _end_query(self, query: Query) -> None:
        self.queries.remove(query)
        for ctx in query.reads:
            ctx.readers -= 1

    # ---- internals -----------------------------------------------------
    def _chunk(self, ctx: Context, budget: int, plan: StepPlan) -> int:
        """The chunk's length: inside its segment, whole units, within ``budget`` unless it runs alone."""
        seg = ctx.segment_at(ctx.num_computed)
        n = min(ctx.target, seg.end) - ctx.num_computed
        unit = seg.unit()
        if n <= budget or unit == 1:
            return min(n, budget)
        fit = budget // unit * unit
        return fit if fit else (unit if not plan.chunks else 0)

    def _running_chunk(self, ctx: Context, budget: int, plan: StepPlan) -> int:
        """``_chunk`` for a context holding blocks, after attaching cached blocks that continue it; a chunk
        that would fill a partial block with a cached block after it stops at the boundary instead."""
        if ctx.remaining > 1 and self.bm.prefix_caching and ctx.num_computed == self.bm.num_reserved(ctx.key):
            hits = self.bm.extend_prefix(ctx.key, ctx.row_keys(), self._cache_limit(ctx))
            ctx.num_computed += hits
            self.prefix_hit_tokens += hits
        n = self._chunk(ctx, budget, plan)
        bs = self.bm.block_size
        to_boundary = bs - ctx.num_computed % bs
        if n > to_boundary and self._unit(ctx) == 1 \
                and self.bm.cached_after_partial(ctx.key, ctx.row_keys(), self._cache_limit(ctx)):
            return to_boundary
        return n

    @staticmethod
    def _unit(ctx: Context) -> int:
        return ctx.segment_at(ctx.num_computed).unit()

    @staticmethod
    def _add(plan: StepPlan, ctx: Context, n: int) -> int:
        if n:
            plan.chunks.append(ScheduledChunk.of_context(ctx, n))
        return n

    def _fit(self, ctx: Context, n: int) -> int:
        """``n`` cut to the slots the pool can give now, in whole units."""
        room = min(n, self.bm.max_appendable(ctx.key))
        if room == n:
            return n
        unit = self._unit(ctx)
        return room if unit == 1 else room // unit * unit

    def _reserve_running(self, ctx: Context, n: int, plan: StepPlan) -> int:
        if n == 0:
            return 0
        protected: set[ContextKey] | None = None  # built only when a victim is needed (rare)
        while not self.bm.can_append(ctx.key, n):
            protected = protected or plan.scheduled() | {ctx.key}
            victim = self._victim(ctx, protected, running_too=True)
            if victim is None:
                break
            self._preempt(victim, plan)
        n = self._fit(ctx, n)
        if n == 0:
            self._preempt(ctx, plan)
            return 0
        self._append(ctx, n)
        return n

    def _admit(self, ctx: Context, budget: int, plan: StepPlan) -> int:
        hits = self.bm.attach_prefix(ctx.key, ctx.row_keys(), self._attachable(ctx))
        ctx.num_computed = hits
        n = self._chunk(ctx, budget, plan)
        protected = plan.scheduled() | {ctx.key}
        while n and not self.bm.can_append(ctx.key, n):  # with other chunks in the step: only a hog's idle contexts
            victim = self._victim(ctx, protected, running_too=False) if not plan.chunks else self._hog_victim(ctx, protected)
            if victim is None:
                break
            self._preempt(victim, plan)
        n = self._fit(ctx, n) if n else 0
        if n == 0:
            self.bm.free(ctx.key)
            ctx.num_computed = 0
            return 0
        self._append(ctx, n)
        self.prefix_hit_tokens += hits
        return n

    @staticmethod
    def _cache_limit(ctx: Context) -> int:
        """How many leading rows the prefix cache may supply: never the last one (its output is due), nor any
        row of a firing whose rows come out (prompt logprobs, hidden states)."""
        limit = min(ctx.cacheable, ctx.target - 1)
        head = ctx.pending[0]
        return min(limit, head.start) if head.op is not None and head.op.row_outputs else limit

    def _attachable(self, ctx: Context) -> int:
        """``_cache_limit`` at admission: a firing whose rows come out restarts whole."""
        head = ctx.pending[0]
        if head.op is not None and head.op.row_outputs:
            head.rows.clear()  # rows an earlier admission collected (before a preemption) are computed again
        return self._cache_limit(ctx)

    def _append(self, ctx: Context, n: int) -> None:
        """Reserve ``n`` slots that ``max_appendable`` said fit (a statement, so ``python -O`` keeps it)."""
        if not self.bm.append_slots(ctx.key, n):
            raise RuntimeError(f"context {ctx.key}: {n} slots did not fit although the pool said they would")

    def _victim(self, ctx: Context, protected: set[ContextKey], running_too: bool) -> Context | None:
        """Idle holders no waiting query reads first, then (if allowed) later-admitted running ones; latest first."""
        holders = [c for c in self.contexts.values() if self.bm.has(c.key) and c.key not in protected and not c.readers]
        idle = [c for c in holders if not c.has_work]
        if idle:
            return max(idle, key=lambda c: c.order)
        later = [c for c in holders if running_too and c.order > ctx.order]
        return max(later, key=lambda c: c.order) if later else None

    def _hog_victim(self, ctx: Context, protected: set[ContextKey]) -> Context | None:
        """An idle holder (no work, no waiting reader) of another request that holds blocks for more than
        ``config.share`` contexts (a fan's members between their steps), latest first: so a request that fills the
        pool with idle members does not keep a new request out until its fan ends."""
        holding: dict[str, int] = {}
        idle = []
        for c in self.contexts.values():
            if self.bm.has(c.key):
                holding[c.request_id] = holding.get(c.request_id, 0) + 1
                if not c.has_work and not c.readers and c.key not in protected and c.request_id != ctx.request_id:
                    idle.append(c)
        idle = [c for c in idle if holding[c.request_id] > self.config.share]
        return max(idle, key=lambda c: c.order) if idle else None

    def _preempt(self, ctx: Context, plan: StepPlan) -> None:
        self.bm.free(ctx.key)
        ctx.num_computed = 0
        plan.preempted.append(ctx.key)
        self.preemptions += 1


def describe(plan: StepPlan) -> list[tuple[Any, int, int]]:
    """The plan as (context key or "query", start, n), for logs and tests."""
    return [(c.context.key if c.context is not None else "query", c.start, c.num_tokens) for c in plan.chunks]
