"""KVCacheEngine: a causal LM over a paged KV pool, driven by firings.

A firing appends ``inputs["tokens"]`` (int64 [T], T >= 1) to the context
``(firing.request_id, firing.node_params.get("context", "main"))`` and is
answered once every token of that context up to and including its own has
its KV in the pool, with the outputs it names (see ``runner.OUTPUTS``; an
empty ``outputs`` just fills the KV). Optional ``inputs["embeds"]`` (float
[T, D]) replaces those tokens' embeddings (image or audio features); such
positions are kept out of the prefix cache. Sampling uses
``firing.sampling`` (greedy when None) over the context's whole history;
``node_params["token_ranges"]``, a list of ``[lo, hi)`` id ranges or a
function of the number of tokens sampled so far for the context returning
one, restricts which ids may be drawn (constrained decoding).

    step():  plan = scheduler.schedule()      which chunks of which contexts
             outs = runner.execute(chunks)     one forward + sampling
             done = scheduler.finish(plan)     advance, cache full blocks, answer
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from walkserve.core.context import context_fits
from walkserve.engines.base import Engine, Firing, FiringResult
from walkserve.engines.kv.block_manager import BlockManager, ContextKey
from walkserve.engines.kv.kv_pool import KVPool, KVPoolShape, pool_blocks
from walkserve.engines.kv.runner import OUTPUTS, ModelRunner
from walkserve.engines.kv.scheduler import Scheduler, SchedulerConfig
from walkserve.layers.attention import make_paged_backend
from walkserve.layers.sampling import Sampler

log = logging.getLogger(__name__)


class KVCacheEngine(Engine):
    """Continuous batching, chunked prefill, prefix reuse and preemption for one causal LM.

    ``model`` follows the CausalLM interface: ``forward(input_ids [T],
    positions [T], attn, inputs_embeds=None) -> hidden [T, D]``,
    ``compute_logits(hidden [N, D]) -> [N, V]``, and ``config`` with
    num_hidden_layers, num_key_value_heads, head_dim, hidden_size,
    vocab_size; firings with embeds also need ``embed(input_ids [T]) -> [T, D]``
    (or ``get_input_embeddings()``).
    The pool holds ``num_blocks`` blocks of ``block_size`` tokens, or as
    many as ``kv_bytes`` allows, or a device default. The pool holds
    ``dtype`` (a torch dtype or its name); None or "" takes the model's own.
    """

    def __init__(
        self,
        component: str,
        model: nn.Module,
        device: torch.device | str,
        dtype: torch.dtype | str | None,
        block_size: int = 16,
        num_blocks: int | None = None,
        kv_bytes: int | None = None,
        max_batch_tokens: int = 2048,
        max_running: int = 64,
        attention: str = "auto",
        prefix_caching: bool = True,
        seed: int | None = None,
    ):
        self.component = component
        self.model = model
        self.device = torch.device(device)
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        dtype = _pool_dtype(model, dtype)
        shape = KVPoolShape(cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim, block_size, dtype)
        self.pool = KVPool(shape, pool_blocks(shape, self.device, num_blocks, kv_bytes), self.device)
        self.block_manager = BlockManager(self.pool.num_blocks, block_size, prefix_caching)
        self.scheduler = Scheduler(self.block_manager, SchedulerConfig(max_batch_tokens, max_running))
        backend = make_paged_backend(attention, self.device, dtype)
        self.runner = ModelRunner(model, self.pool, self.block_manager, backend, Sampler(seed))
        self.vocab_size = cfg.vocab_size
        self.hidden_size = cfg.hidden_size
        self._ready: list[FiringResult] = []

    # ---- Engine contract -------------------------------------------------
    def submit(self, firing: Firing) -> None:
        try:
            tokens, embeds = self._parse(firing)
        except (ValueError, TypeError, RuntimeError, AttributeError) as err:  # a bad request, never a crash
            self._ready.append(FiringResult(firing, error=f"{self.component}: {err}"))
            return
        ctx = self.scheduler.context(_key(firing))
        ctx.append(firing, tokens, embeds)
        capacity = self.pool.num_blocks * self.block_manager.block_size
        if not context_fits(len(ctx.token_ids), capacity):  # the frontend's policy, against the pool
            self._fail_context(
                ctx.key,
                f"context {ctx.key} needs {len(ctx.token_ids)} tokens of KV cache but the pool of "
                f"{self.component} holds only {capacity} tokens ({self.pool.num_blocks} blocks of "
                f"{self.block_manager.block_size})",
            )

    def step(self) -> list[FiringResult]:
        results, self._ready = self._ready, []
        plan = self.scheduler.schedule()
        if not plan.chunks:
            return results
        try:
            outputs = self.runner.execute(plan.chunks)
        except Exception as err:  # a failing batch fails its requests, never the worker loop
            log.exception("%s: step failed", self.component)
            for chunk in plan.chunks:
                self._fail_context(chunk.context.key, f"{self.component}: step failed: {err!r}")
            return results + self._take_ready()
        by_firing = {id(c.completes): out for c, out in zip(plan.chunks, outputs) if c.completes is not None}
        for ctx, pending in self.scheduler.finish(plan):
            out = by_firing.get(id(pending)) or {}
            if "token" in out:
                ctx.sampled.append(int(out["token"][0]))
            results.append(FiringResult(pending.firing, outputs=out))
        return results

    def has_work(self) -> bool:
        return bool(self._ready) or any(c.has_work for c in self.scheduler.contexts.values())

    def release(self, request_id: str) -> None:
        self.scheduler.drop_request(request_id)
        self._ready = [r for r in self._ready if r.firing.request_id != request_id]

    def stats(self) -> dict[str, float]:
        bm = self.block_manager
        return {
            "kv_blocks_used": bm.num_used,
            "kv_blocks_total": bm.num_blocks,
            "kv_blocks_cached": bm.num_evictable,
            "preemptions": self.scheduler.preemptions,
            "prefix_hit_tokens": self.scheduler.prefix_hit_tokens,
            "running": self.scheduler.num_running(),
            "waiting": self.scheduler.num_waiting(),
        }

    def state_count(self) -> int:
        """Requests with any context here (token history, and KV blocks unless preempted)."""
        return len({key[0] for key in self.scheduler.contexts})

    def close(self) -> None:
        for ctx in list(self.scheduler.contexts.values()):
            self.scheduler.drop(ctx.key)
        self.pool.k = self.pool.v = torch.empty(0)

    # ---- helpers -----------------------------------------------------------
    def _parse(self, firing: Firing) -> tuple[list[int], torch.Tensor | None]:
        unknown = set(firing.outputs) - set(OUTPUTS)
        if unknown:
            raise ValueError(f"node {firing.node!r} asks for unknown outputs {sorted(unknown)}; known: {OUTPUTS}")
        raw = firing.inputs.get("tokens")
        if raw is None:
            raise ValueError(f"node {firing.node!r} fired without input 'tokens'")
        tokens_t = torch.as_tensor(raw)
        if tokens_t.is_floating_point() or tokens_t.is_complex() or tokens_t.dtype == torch.bool:
            raise ValueError(f"input 'tokens' of node {firing.node!r} must be integer ids, got {tokens_t.dtype}")
        tokens = tokens_t.reshape(-1).tolist()
        if not tokens:
            raise ValueError(f"input 'tokens' of node {firing.node!r} is empty")
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} of node {firing.node!r} are outside the vocabulary [0, {self.vocab_size})")
        embeds = firing.inputs.get("embeds")
        if embeds is not None and tuple(embeds.shape) != (len(tokens), self.hidden_size):
            raise ValueError(
                f"input 'embeds' of node {firing.node!r} has shape {tuple(embeds.shape)}, "
                f"expected {(len(tokens), self.hidden_size)}"
            )
        return tokens, embeds

    def _fail_context(self, key: ContextKey, message: str) -> None:
        ctx = self.scheduler.drop(key)
        for pending in ctx.pending if ctx else ():
            self._ready.append(FiringResult(pending.firing, error=message))

    def _take_ready(self) -> list[FiringResult]:
        ready, self._ready = self._ready, []
        return ready


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


def _key(firing: Firing) -> ContextKey:
    return (firing.request_id, str(firing.node_params.get("context", "main")))
