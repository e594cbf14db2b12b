"""Which tokens of which contexts run in the next step (plain ints, no tensors).

Each step fills a token budget:
  1. contexts that hold blocks and have work: decodes first, then prefill
     chunks, each in admission order; a context short of blocks preempts
     idle contexts (holding blocks without work, latest first), then later-
     admitted contexts not yet in this step (latest first), then shrinks
     its chunk to what fits, and preempts itself when nothing fits;
  2. waiting contexts (work, no blocks) in admission order: attach their
     cached prefix, then take a chunk of what the budget and pool allow; a
     waiting context preempts idle ones only when nothing else runs this step,
     so progress is guaranteed without thrashing running work.
Preemption frees a context's blocks (its full blocks stay in the prefix cache)
and recomputes it later from its token history. A chunk never runs past the
end of the context's oldest pending firing, whose result is due there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from walkserve.engines.kv.block_manager import BlockManager, ContextKey
from walkserve.engines.kv.sequence import Context, PendingFiring


@dataclass(frozen=True)
class SchedulerConfig:
    """Per-step limits: tokens computed in one forward, contexts in one batch."""

    max_batch_tokens: int = 2048
    max_running: int = 64

    def __post_init__(self) -> None:
        if self.max_batch_tokens < 1 or self.max_running < 1:
            raise ValueError(f"max_batch_tokens and max_running must be >= 1, got {self}")


@dataclass
class ScheduledChunk:
    """Compute tokens ``[start, start + num_tokens)`` of ``context`` in this step."""

    context: Context
    start: int
    num_tokens: int

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def completes(self) -> PendingFiring | None:
        """The pending firing this chunk finishes, if it does."""
        return self.context.pending[0] if self.end == self.context.target else None


@dataclass
class StepPlan:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[ContextKey] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    def scheduled(self) -> set[ContextKey]:
        return {c.context.key for c in self.chunks}


class Scheduler:
    """Owns the contexts and the block manager; plans steps and books their completion."""

    def __init__(self, block_manager: BlockManager, config: SchedulerConfig):
        self.bm = block_manager
        self.config = config
        self.contexts: dict[ContextKey, Context] = {}
        self.preemptions = 0
        self.prefix_hit_tokens = 0
        self._next_order = 0

    # ---- contexts ------------------------------------------------------
    def context(self, key: ContextKey) -> Context:
        """The context of ``key``, created empty on first use."""
        if key not in self.contexts:
            self.contexts[key] = Context(key, self._next_order)
            self._next_order += 1
        return self.contexts[key]

    def drop(self, key: ContextKey) -> Context | None:
        self.bm.free(key)
        return self.contexts.pop(key, None)

    def drop_request(self, request_id: str) -> list[Context]:
        return [self.drop(k) for k in [k for k in self.contexts if k[0] == request_id]]

    def num_running(self) -> int:
        return sum(1 for c in self.contexts.values() if c.has_work and self.bm.has(c.key))

    def num_waiting(self) -> int:
        return sum(1 for c in self.contexts.values() if c.has_work and not self.bm.has(c.key))

    # ---- planning ------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Plan one step and reserve its slots. Call ``finish(plan)`` once the step ran."""
        plan = StepPlan()
        budget = self.config.max_batch_tokens
        held = [c for c in self.contexts.values() if c.has_work and self.bm.has(c.key)]
        for ctx in sorted(held, key=lambda c: (c.remaining > 1, c.order)):
            if budget == 0 or len(plan.chunks) == self.config.max_running:
                return plan
            if self.bm.has(ctx.key):  # not preempted earlier in this loop
                budget -= self._add(plan, ctx, self._reserve_running(ctx, min(ctx.remaining, budget), plan))
        waiting = [c for c in self.contexts.values() if c.has_work and not self.bm.has(c.key)]
        for ctx in sorted(waiting, key=lambda c: c.order):
            if budget == 0 or len(plan.chunks) == self.config.max_running:
                break
            if ctx.key in plan.preempted:
                continue
            n = self._admit(ctx, budget, plan)
            if n == 0:
                break
            budget -= self._add(plan, ctx, n)
        return plan

    def finish(self, plan: StepPlan) -> list[tuple[Context, PendingFiring]]:
        """Book a step that ran: advance contexts, register full blocks, pop the answered firings."""
        done = []
        for chunk in plan.chunks:
            ctx = chunk.context
            ctx.num_computed = chunk.end
            self.bm.commit(ctx.key, ctx.token_ids, min(ctx.num_computed, ctx.cacheable))
            if ctx.num_computed == ctx.target:
                done.append((ctx, ctx.pending.popleft()))
        return done

    # ---- internals -----------------------------------------------------
    @staticmethod
    def _add(plan: StepPlan, ctx: Context, n: int) -> int:
        if n:
            plan.chunks.append(ScheduledChunk(ctx, ctx.num_computed, n))
        return n

    def _reserve_running(self, ctx: Context, n: int, plan: StepPlan) -> int:
        protected: set[ContextKey] | None = None  # built only when a victim is needed (rare)
        while not self.bm.can_append(ctx.key, n):
            protected = protected or plan.scheduled() | {ctx.key}
            victim = self._victim(ctx, protected, running_too=True)
            if victim is None:
                break
            self._preempt(victim, plan)
        n = min(n, self.bm.max_appendable(ctx.key))
        if n == 0:
            self._preempt(ctx, plan)
            return 0
        self._append(ctx, n)
        return n

    def _admit(self, ctx: Context, budget: int, plan: StepPlan) -> int:
        hits = self.bm.attach_prefix(ctx.key, ctx.token_ids, min(ctx.cacheable, ctx.target - 1))
        ctx.num_computed = hits
        n = min(ctx.remaining, budget)
        protected = {ctx.key}  # the loop runs only while nothing else is scheduled
        while not plan.chunks and not self.bm.can_append(ctx.key, n):
            victim = self._victim(ctx, protected, running_too=False)
            if victim is None:
                break
            self._preempt(victim, plan)
        n = min(n, self.bm.max_appendable(ctx.key))
        if n == 0:
            self.bm.free(ctx.key)
            ctx.num_computed = 0
            return 0
        self._append(ctx, n)
        self.prefix_hit_tokens += hits
        return n

    def _append(self, ctx: Context, n: int) -> None:
        """Reserve ``n`` slots that ``max_appendable`` said fit (a statement, so ``python -O`` keeps it)."""
        if not self.bm.append_slots(ctx.key, n):
            raise RuntimeError(f"context {ctx.key}: {n} slots did not fit although the pool said they would")

    def _victim(self, ctx: Context, protected: set[ContextKey], running_too: bool) -> Context | None:
        """Idle holders first, then (if allowed) later-admitted running ones; latest admitted first."""
        holders = [c for c in self.contexts.values() if self.bm.has(c.key) and c.key not in protected]
        idle = [c for c in holders if not c.has_work]
        if idle:
            return max(idle, key=lambda c: c.order)
        later = [c for c in holders if running_too and c.order > ctx.order]
        return max(later, key=lambda c: c.order) if later else None

    def _preempt(self, ctx: Context, plan: StepPlan) -> None:
        self.bm.free(ctx.key)
        ctx.num_computed = 0
        plan.preempted.append(ctx.key)
        self.preemptions += 1
