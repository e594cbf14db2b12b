"""Runs one planned step on the model: inputs, paged attention context, forward, outputs.

The runner reads contexts and block tables but changes neither; the engine
books the step afterwards. Outputs per completed firing (only those named in
``firing.outputs``):

    token          int64 [1]     sampled id (CPU)
    logits         float32 [V]   last position (model device)
    hidden         float32 [1, D] last position, final-normed (model device)
    logprob        float32 [1]   log-probability of the sampled token (CPU)
    top_logprobs   float32 [K]   the K = sampling.logprobs best log-probabilities (CPU)
    top_logprob_ids int64 [K]    their ids (CPU)
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from walkserve.core.sampling import SamplingParams
from walkserve.engines.kv.block_manager import BlockManager
from walkserve.engines.kv.kv_pool import KVPool
from walkserve.engines.kv.scheduler import ScheduledChunk
from walkserve.layers.attention import PagedAttentionBackend, PagedBatch
from walkserve.layers.sampling import Sampler, SamplerOutput, SampleRow

OUTPUTS = ("token", "logits", "hidden", "logprob", "top_logprobs", "top_logprob_ids")
_NEED_LOGITS = {"token", "logits", "logprob", "top_logprobs", "top_logprob_ids"}
_NEED_SAMPLE = {"token", "logprob", "top_logprobs", "top_logprob_ids"}
GREEDY = SamplingParams(temperature=0.0)


class ModelRunner:
    """Turns a list of scheduled chunks into one model call and the completed firings' outputs."""

    def __init__(
        self, model: nn.Module, pool: KVPool, block_manager: BlockManager, backend: PagedAttentionBackend, sampler: Sampler
    ):
        self.model, self.pool, self.bm, self.backend, self.sampler = model, pool, block_manager, backend, sampler
        self.device = pool.device
        # models whose compute_logits takes per-row allowed ranges compute only those (CausalLM does)
        self._row_ranges = "allowed" in inspect.signature(model.compute_logits).parameters

    @torch.inference_mode()
    def execute(self, chunks: list[ScheduledChunk]) -> list[dict[str, Any] | None]:
        """Run the chunks as one forward; returns, per chunk, the outputs of the firing it completes (or None)."""
        self.pool.copy_blocks(self.bm.take_copies())
        input_ids, positions = self._inputs(chunks)  # [T], [T]
        batch = PagedBatch(
            query_lens=[c.num_tokens for c in chunks],
            kv_lens=[c.end for c in chunks],
            block_tables=[self.bm.table(c.context.key) for c in chunks],
            block_size=self.bm.block_size,
        )
        attn = self.backend.context(self.pool.k, self.pool.v, batch)
        hidden = self.model(input_ids, positions, attn, inputs_embeds=self._embeds(chunks, input_ids))  # [T, D]
        return self._outputs(chunks, hidden)

    def _inputs(self, chunks: list[ScheduledChunk]) -> tuple[torch.Tensor, torch.Tensor]:
        ids: list[int] = []
        pos: list[int] = []
        for c in chunks:
            ids.extend(c.context.token_ids[c.start : c.end])
            pos.extend(range(c.start, c.end))
        as_long = {"dtype": torch.long, "device": self.device}
        return torch.tensor(ids, **as_long), torch.tensor(pos, **as_long)

    def _embeds(self, chunks: list[ScheduledChunk], input_ids: torch.Tensor) -> torch.Tensor | None:
        """Token embeddings with the firings' ``embeds`` spliced in; None when no chunk carries any."""
        spans = []
        row = 0
        for c in chunks:
            for start, part in c.context.embeds.items():
                lo, hi = max(start, c.start), min(start + part.shape[0], c.end)
                if lo < hi:
                    spans.append((row + lo - c.start, part[lo - start : hi - start]))
            row += c.num_tokens
        if not spans:
            return None
        embed = getattr(self.model, "embed", None) or self.model.get_input_embeddings()
        embeds = embed(input_ids)  # [T, D]
        for at, part in spans:
            embeds[at : at + part.shape[0]] = part.to(embeds.device, embeds.dtype)
        return embeds

    def _outputs(self, chunks: list[ScheduledChunk], hidden: torch.Tensor) -> list[dict[str, Any] | None]:
        results: list[dict[str, Any] | None] = [None] * len(chunks)
        done = [i for i, c in enumerate(chunks) if c.completes is not None and c.completes.firing.outputs]
        if not done:
            return results
        ends = torch.cumsum(torch.tensor([c.num_tokens for c in chunks]), 0) - 1
        last = hidden[ends[done].to(hidden.device)]  # [N, D]: the last position of each completing chunk
        names = [set(chunks[i].completes.firing.outputs) for i in done]
        outs = [{"hidden": last[j : j + 1].to(torch.float32, copy=True)} if "hidden" in n else {} for j, n in enumerate(names)]
        need = [j for j, n in enumerate(names) if n & _NEED_LOGITS]
        if need:
            self._logit_outputs([chunks[done[j]] for j in need], [names[j] for j in need], last[need], [outs[j] for j in need])
        for i, out in zip(done, outs):
            results[i] = out
        return results

    def _logit_outputs(self, chunks: list[ScheduledChunk], names: list[set[str]], last: torch.Tensor, outs: list[dict]):
        """Fill logits and sampled outputs of chunks whose last hidden states are ``last`` [M, D]."""
        sample = [m for m, n in enumerate(names) if n & _NEED_SAMPLE]
        rows = [_sample_row(chunks[m], names[m]) for m in sample]
        logits = self._logits(last, names, sample, rows)  # [M, V]
        for m, out in enumerate(outs):
            if "logits" in names[m]:
                out["logits"] = logits[m].clone()
        if not sample:
            return
        drawn = _on_cpu(self.sampler(logits if len(sample) == len(names) else logits[sample], rows))
        for r, m in enumerate(sample):
            outs[m].update(_sampled(drawn, r, rows[r].params, names[m]))

    def _logits(self, last: torch.Tensor, names: list[set[str]], sample: list[int], rows: list[SampleRow]) -> torch.Tensor:
        """float32 [M, V]; a sampled row with allowed ranges (and no ``logits`` output) gets only those computed."""
        allowed: list[list[tuple[int, int]] | None] = [None] * len(names)
        for m, row in zip(sample, rows):
            if row.allowed is not None and "logits" not in names[m]:
                allowed[m] = row.allowed
        if self._row_ranges and any(a is not None for a in allowed):
            return self.model.compute_logits(last, allowed=allowed).float()
        return self.model.compute_logits(last).float()


def _sample_row(chunk: ScheduledChunk, names: set[str]) -> SampleRow:
    ctx = chunk.context
    params = chunk.completes.firing.sampling or GREEDY
    if params.logprobs is None and names & {"logprob", "top_logprobs", "top_logprob_ids"}:
        params = replace(params, logprobs=0)
    history = ctx.token_ids[: chunk.end] + ctx.sampled if params.repetition_penalty != 1.0 else []
    ranges = chunk.completes.firing.node_params.get("token_ranges")  # constrained decoding (e.g. Orpheus)
    allowed = list(ranges(len(ctx.sampled)) if callable(ranges) else ranges) if ranges is not None else None
    return SampleRow(params=params, prompt_and_output=history, output=ctx.sampled, allowed=allowed)


def _on_cpu(out: SamplerOutput) -> SamplerOutput:
    move = lambda t: None if t is None else t.cpu()  # noqa: E731
    return SamplerOutput(move(out.token_ids), move(out.logprobs), move(out.top_ids), move(out.top_logprobs))


def _sampled(drawn: SamplerOutput, r: int, params: SamplingParams, names: set[str]) -> dict[str, torch.Tensor]:
    out = {}
    if "token" in names:
        out["token"] = drawn.token_ids[r : r + 1].clone()
    if drawn.logprobs is not None and "logprob" in names:
        out["logprob"] = drawn.logprobs[r : r + 1].clone()
    k = params.logprobs or 0
    if drawn.top_logprobs is not None and "top_logprobs" in names:
        out["top_logprobs"] = drawn.top_logprobs[r, :k].clone()
    if drawn.top_ids is not None and "top_logprob_ids" in names:
        out["top_logprob_ids"] = drawn.top_ids[r, :k].clone()
    return out
