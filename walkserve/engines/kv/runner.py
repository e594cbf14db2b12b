"""Runs one planned step: per model, its chunks' inputs, the paged attention context, the forward, the outputs.

The runner reads contexts and block tables but changes neither; the engine
books the step afterwards. A step's chunks are cut into forward groups that
one model call can take together (the same component, position axes and
extra token inputs); usually that is one group. Outputs: see ``outputs``.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from walkserve.engines.kv.block_manager import BlockManager
from walkserve.engines.kv.kv_pool import KVPool
from walkserve.engines.kv.outputs import OUTPUTS, Outputs
from walkserve.engines.kv.scheduler import ScheduledChunk
from walkserve.engines.kv.sequence import Segment
from walkserve.layers.paged_attention import PagedAttentionBackend, PagedBatch
from walkserve.layers.paged_backends import TorchPagedBackend
from walkserve.layers.sampling import Sampler

__all__ = ["OUTPUTS", "ModelRunner"]


class ModelRunner:
    """Turns a list of scheduled chunks into model calls and the answered firings' outputs."""

    def __init__(self, models: Mapping[str, nn.Module] | nn.Module, pool: KVPool, block_manager: BlockManager,
                 backend: PagedAttentionBackend, sampler: Sampler):
        if isinstance(models, nn.Module):
            models = {"": models}
        self.models = dict(models)
        self.pool, self.bm, self.backend = pool, block_manager, backend
        self.fallback = backend if isinstance(backend, TorchPagedBackend) else TorchPagedBackend()
        self.device = pool.device
        self.outputs = {name: Outputs(model, sampler) for name, model in self.models.items()}
        self.graphs = None  # a cuda_graphs.DecodeGraphs when the engine turns CUDA-graph decode on
        self.takes_capture = {name: "capture" in inspect.signature(m.forward).parameters for name, m in self.models.items()}
        # per model: [forward calls, chunks, rows, seconds] (how many firings each call batched, and the time of
        # its forward and outputs, as the host sees it: the engine's stats)
        self.forwards: dict[str, list[float]] = {name: [0, 0, 0, 0.0] for name in self.models}

    @torch.inference_mode()
    def execute(self, chunks: list[ScheduledChunk]) -> list[dict[str, Any] | None]:
        """Run the chunks; returns, per chunk, the outputs of the firing it completes (or None)."""
        self.pool.copy_blocks(self.bm.take_copies())
        results: list[dict[str, Any] | None] = [None] * len(chunks)
        for rows in _forward_groups(chunks):
            part = [chunks[i] for i in rows]
            for i, out in zip(rows, self._run(part)):
                results[i] = out
        return results

    def _model(self, chunk: ScheduledChunk) -> str:
        name = chunk.component
        return name if name in self.models else next(iter(self.models))

    def _run(self, chunks: list[ScheduledChunk]) -> list[dict[str, Any] | None]:
        t0 = time.perf_counter()
        name = self._model(chunks[0])
        model = self.models[name]
        input_ids, positions = _inputs(chunks, self.device)  # [T], [T] or [A, T]
        batch = self._batch(chunks)
        kwargs: dict[str, Any] = _token_inputs(chunks, self.device)
        capture = {k: None for k in _capture_layers(chunks)}
        embeds = _embeds(model, chunks, input_ids)
        hidden = None
        if self.graphs is not None and graphable(chunks, capture, kwargs, embeds):
            hidden = self.graphs.run(name, model, batch, input_ids, positions)  # [T, D] or None: eager
        if hidden is None:
            backend = self.backend if self.backend.supports(batch) else self.fallback
            attn = backend.context(self.pool.k, self.pool.v, batch)
            if capture:
                kwargs["capture"] = capture
            hidden = model(input_ids, positions, attn, inputs_embeds=embeds, **kwargs)  # [T, D]
        outputs = self.outputs[name](chunks, hidden, capture)
        counts = self.forwards[name]
        counts[0], counts[1], counts[2] = counts[0] + 1, counts[1] + len(chunks), counts[2] + input_ids.shape[0]
        counts[3] += time.perf_counter() - t0
        return outputs

    def _batch(self, chunks: list[ScheduledChunk]) -> PagedBatch:
        q_lens, kv_lens, tables, masks, frames, reads = [], [], [], [], [], []
        for c in chunks:
            q_lens.append(c.num_tokens)
            if c.query is None:
                seg = c.segment
                kv_lens.append(c.end)
                tables.append(self.bm.table(c.context.key))
                masks.append(seg.mask)
                frames.append(seg.frame)
                reads.append(None)
                continue
            op = c.query.pending.op
            read = [(self.bm.table(ctx.key) if ctx.length else [], ctx.length) for ctx in c.query.reads]
            kv_lens.append(sum(n for _, n in read))
            tables.append([])
            masks.append(op.mask)
            frames.append(op.frame)
            reads.append(read)
        plain = all(m == "causal" for m in masks)
        queries = any(r is not None for r in reads)
        return PagedBatch(q_lens, kv_lens, tables, self.bm.block_size, None if plain else masks,
                          None if plain else frames, reads if queries else None)


def graphable(chunks: list[ScheduledChunk], capture: dict, token_inputs: dict, embeds: torch.Tensor | None) -> bool:
    """Whether a forward group is a plain decode step a CUDA graph can replay (one causal token row per context)."""
    if capture or token_inputs or embeds is not None:
        return False
    return all(c.query is None and c.num_tokens == 1 and c.segment.mask == "causal" and c.segment.embeds is None
               for c in chunks)


def _forward_groups(chunks: list[ScheduledChunk]) -> list[list[int]]:
    """Chunk indices per model call: one call per (component, position axes, token input names)."""
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(chunks):
        groups.setdefault((c.component, _axes(c), _token_input_names(c)), []).append(i)
    return list(groups.values())


def _axes(c: ScheduledChunk) -> int:
    if c.query is None:
        return c.segment.axes
    op = c.query.pending.op
    return op.positions.shape[0] if op.positions is not None and op.positions.dim() == 2 else c.query.reads[0].axes


def _token_input_names(c: ScheduledChunk) -> tuple[str, ...]:
    names = c.segment.token_inputs if c.query is None else c.query.pending.op.token_inputs
    return tuple(sorted(names)) if names else ()


def _inputs(chunks: list[ScheduledChunk], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids [T] and positions [T] (or [A, T]) of the chunks, in order."""
    as_long = {"dtype": torch.long, "device": device}
    segs = [c.segment for c in chunks]
    if all(s is not None and type(s.pos_base) is int and s.axes == 1 for s in segs):  # the common case: ints only
        ids: list[int] = []
        pos: list[int] = []
        for c, s in zip(chunks, segs):
            ids.extend(c.context.token_ids[c.start : c.end])
            base = s.pos_base + c.start - s.start
            pos.extend(range(base, base + c.num_tokens))
        return torch.tensor(ids, **as_long), torch.tensor(pos, **as_long)
    axes = _axes(chunks[0])
    id_parts, pos_parts = [], []
    for c, s in zip(chunks, segs):
        if s is not None:
            id_parts.append(torch.tensor(c.context.token_ids[c.start : c.end], **as_long))
            pos_parts.append(_segment_positions(s, c.start - s.start, c.num_tokens, axes, device))
            continue
        op = c.query.pending.op
        n = c.num_tokens
        id_parts.append(op.token_ids.to(device) if op.token_ids is not None else torch.zeros(n, **as_long))
        if op.positions is not None:
            pos_parts.append(op.positions.to(device))
        else:
            pos_parts.append(_running(c.query.reads[0].next_position, n, axes, device))
    return torch.cat(id_parts), torch.cat(pos_parts, dim=-1)


def _running(base: int | float, n: int, axes: int, device: torch.device) -> torch.Tensor:
    dtype = torch.long if isinstance(base, int) else torch.float32  # a running position after float ones is float
    pos = torch.arange(n, dtype=dtype, device=device) + base  # [n]
    return pos if axes == 1 else pos.expand(axes, n)


def _segment_positions(seg: Segment, lo: int, n: int, axes: int, device: torch.device) -> torch.Tensor:
    if seg.pos_base is not None:
        return _running(seg.pos_base + lo, n, axes, device)
    return seg.positions[..., lo : lo + n].to(device)


def _embeds(model: nn.Module, chunks: list[ScheduledChunk], input_ids: torch.Tensor) -> torch.Tensor | None:
    """Token embeddings with the chunks' input embeddings spliced in; None when no chunk carries any."""
    spans = []  # (batch rows [n], embeddings [n, D])
    row = 0
    for c in chunks:
        if c.query is not None:
            op = c.query.pending.op
            if op.embeds is not None:
                rows = torch.arange(c.num_tokens) if op.embed_rows is None else op.embed_rows
                spans.append((rows + row, op.embeds))
        else:
            seg = c.segment
            if seg.embeds is not None:
                spans.append(_segment_embeds(seg, c.start - seg.start, c.num_tokens, row))
        row += c.num_tokens
    if not spans:
        return None
    embed = getattr(model, "embed", None) or model.get_input_embeddings()
    embeds = embed(input_ids)  # [T, D]
    for rows, part in spans:
        if rows.numel():
            embeds[rows.to(embeds.device)] = part.to(embeds.device, embeds.dtype)
    return embeds


def _segment_embeds(seg: Segment, lo: int, n: int, row: int) -> tuple[torch.Tensor, torch.Tensor]:
    if seg.embed_rows is None:
        return torch.arange(n) + row, seg.embeds[lo : lo + n]
    keep = (seg.embed_rows >= lo) & (seg.embed_rows < lo + n)
    return seg.embed_rows[keep] - lo + row, seg.embeds[keep]


def _token_inputs(chunks: list[ScheduledChunk], device: torch.device) -> dict[str, torch.Tensor]:
    """The extra per-token inputs of a forward group, concatenated in batch order ([T, ...] each)."""
    names = _token_input_names(chunks[0])
    if not names:
        return {}
    parts: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    for c in chunks:
        if c.query is not None:
            source, lo = c.query.pending.op.token_inputs, 0
        else:
            seg = c.segment
            source, lo = seg.token_inputs, c.start - seg.start
        for name in names:
            parts[name].append(source[name][lo : lo + c.num_tokens].to(device))
    return {name: torch.cat(p) for name, p in parts.items()}


def _capture_layers(chunks: list[ScheduledChunk]) -> list[int]:
    layers: set[int] = set()
    for c in chunks:
        p = c.pending
        if p is not None and p.op is not None and p.op.capture:
            layers.update(k for name, k in p.op.capture.items() if name in p.firing.outputs)
    return sorted(layers)
