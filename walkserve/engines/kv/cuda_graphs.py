"""CUDA-graph decode: a step of one-row causal appends replays a captured graph instead of launching every kernel.

A decode step of B contexts on a small model is launch-bound: hundreds of
small kernels whose launch costs more than their work. The runner captures the
model's forward once per batch-size bucket and replays it:

    bucket      the smallest captured size >= B (``sizes``, e.g. 1 2 4 8 16 32 64);
                B above the largest size runs eagerly
    static      input ids [S], positions [S] or [A, S], the attention's buffers
                (slots, block tables / FlashInfer's index buffers), hidden [S, D]
    padding     rows B..S decode token 0 at position 0 into the pool's spare
                block (never handed out), so real blocks are never touched
    replay      copy the step's ids, positions and tables into the static
                buffers, re-plan the attention, replay, read hidden[:B]

A graph is keyed by (component, position axes, bucket). It is captured on first
use (one eager warm-up run, then capture) and kept until the pool's storage
changes (graphs hold its addresses: ``close`` or a new pool drops them all).
A step that is not all plain decodes (a prefill chunk, a query, embeddings,
extra token inputs, a captured layer), or whose contexts outgrow
``max_blocks``, runs eagerly. Sampling and the other outputs run after the
replay on hidden[:B], as for an eager step.

``graphs`` makes and replays the graphs: ``CudaGraphs`` on a GPU; the tests
pass a stand-in whose replay re-runs the captured function, which reads only
the static buffers, as a real replay does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from walkserve.layers.graph_attention import GraphDecodeAttention
from walkserve.layers.paged_attention import PagedAttentionBackend, PagedBatch

DEFAULT_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64)


class CudaGraphs:
    """Captures with ``torch.cuda.CUDAGraph`` into one memory pool shared by every bucket."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Warm ``fn`` up on a side stream, capture it, and return the graph's replay."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            fn()
        return graph.replay


@dataclass
class Captured:
    """One bucket's graph and the buffers it reads and writes."""

    size: int
    ids: torch.Tensor  # [S]
    positions: torch.Tensor  # [S] or [A, S]
    attn: GraphDecodeAttention
    hidden: torch.Tensor | None = None  # [S, D], written by the graph
    replay: Callable[[], None] | None = None


class DecodeGraphs:
    """Per-bucket decode graphs of the models on one pool (see the module docstring)."""

    def __init__(self, backend: PagedAttentionBackend, pool, sizes: tuple[int, ...] | None = None,
                 max_blocks: int | None = None, graphs=None):
        self.backend, self.pool = backend, pool
        self.sizes = tuple(sorted(set(sizes or DEFAULT_SIZES)))
        if not self.sizes or self.sizes[0] < 1:
            raise ValueError(f"cuda graph sizes must be positive, got {sizes}")
        self.max_blocks = min(max_blocks or pool.num_blocks, pool.num_blocks)
        self.graphs = graphs if graphs is not None else CudaGraphs(pool.device)
        self.captured: dict[tuple, Captured] = {}
        self.stats = {"replays": 0, "captures": 0, "eager": 0, "invalidations": 0}
        self._pool_key = self._key_of_pool()

    def _key_of_pool(self) -> tuple:
        k, v = self.pool.k, self.pool.v
        return (k.data_ptr(), v.data_ptr(), tuple(k.shape), k.dtype)

    def bucket(self, n: int) -> int | None:
        """The smallest size that holds ``n`` rows, or None (eager)."""
        return next((s for s in self.sizes if s >= n), None)

    def invalidate(self) -> None:
        """Drop every graph (their addresses point into storage that changed)."""
        if self.captured:
            self.stats["invalidations"] += 1
        self.captured.clear()
        self._pool_key = self._key_of_pool()

    def padded(self, batch: PagedBatch, size: int) -> PagedBatch:
        """``batch`` padded to ``size`` rows that write to and read from the spare block."""
        pad = size - len(batch.query_lens)
        sink = [self.pool.sink]
        return PagedBatch(batch.query_lens + [1] * pad, batch.kv_lens + [1] * pad, batch.block_tables + [sink] * pad,
                          batch.block_size)

    def run(self, key: str, model: nn.Module, batch: PagedBatch, input_ids: torch.Tensor,
            positions: torch.Tensor) -> torch.Tensor | None:
        """hidden [B, D] of a decode step through its bucket's graph, or None when it must run eagerly."""
        n = len(batch.query_lens)
        size = self.bucket(n)
        blocks = max(-(-kv // batch.block_size) for kv in batch.kv_lens)
        if size is None or blocks > self.max_blocks or self.pool.sink is None:
            self.stats["eager"] += 1
            return None
        if self._key_of_pool() != self._pool_key:
            self.invalidate()
        axes = positions.shape[0] if positions.dim() == 2 else 1
        graph_key = (key, axes, size)
        entry = self.captured.get(graph_key)
        if entry is None:
            entry = self.captured[graph_key] = self._buffers(size, axes, positions.dtype)
        entry.ids[:n].copy_(input_ids)
        entry.ids[n:].zero_()
        entry.positions[..., :n].copy_(positions)
        entry.positions[..., n:].zero_()
        entry.attn.prepare(self.padded(batch, size))
        if entry.replay is None:
            self._capture(entry, model)
        entry.replay()
        self.stats["replays"] += 1
        return entry.hidden[:n]

    def _buffers(self, size: int, axes: int, pos_dtype: torch.dtype) -> Captured:
        device = self.pool.device
        positions = torch.zeros((size,) if axes == 1 else (axes, size), dtype=pos_dtype, device=device)
        attn = self.backend.graph_decode(self.pool.k, self.pool.v, size, self.max_blocks)
        return Captured(size, torch.zeros(size, dtype=torch.long, device=device), positions, attn)

    def _capture(self, entry: Captured, model: nn.Module) -> None:
        def forward() -> None:
            hidden = model(entry.ids, entry.positions, entry.attn)  # [S, D]
            if entry.hidden is None:
                entry.hidden = torch.empty_like(hidden)
            entry.hidden.copy_(hidden)

        for module in model.modules():  # rope tables whole: a lookup must not look at positions while capturing
            if hasattr(module, "reserve_all"):
                module.reserve_all(self.pool.device)
        forward()  # eager warm-up: allocates the output buffer, plans the attention, loads lazy kernels
        entry.replay = self.graphs.capture(forward)
        self.stats["captures"] += 1
