"""The outputs of a forward: per answered firing, only those named in ``firing.outputs``.

    token            int64 [1]      sampled id at the firing's last row (CPU)
    logprob          float32 [1]    its log-probability (CPU)
    top_logprobs     float32 [K]    the K = sampling.logprobs best log-probabilities (CPU)
    top_logprob_ids  int64 [K]      their ids (CPU)
    logits           float32 [V] at the last row, or [N, V] at the chosen rows (model device)
    hidden           float32 [1, D] at the last row, or [N, D] at the chosen rows, final-normed
    <capture name>   float32 [1, D] or [N, D]: the input of the declared layer at those rows
    prompt_logprobs  float32 [N]    log p(targets[r] | rows ..r), raw (no penalties, no temperature)
    prompt_top_logprobs, prompt_top_logprob_ids   [N, K], K = sampling.prompt_logprobs

Rows are the firing's declared ``rows`` (default: its last row). A firing whose
rows span several chunks (a long prompt in pieces) collects them chunk by
chunk and gets them all, in order, with its answer.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from walkserve.core.sampling import SamplingParams
from walkserve.engines.kv.scheduler import ScheduledChunk
from walkserve.engines.kv.sequence import PendingFiring
from walkserve.layers.sampling import Sampler, SamplerOutput, SampleRow

SAMPLED = ("token", "logprob", "top_logprobs", "top_logprob_ids")
PROMPT = ("prompt_logprobs", "prompt_top_logprobs", "prompt_top_logprob_ids")
OUTPUTS = (*SAMPLED, "logits", "hidden", *PROMPT)
_NEED_LOGITS = {"token", "logits", "logprob", "top_logprobs", "top_logprob_ids"}
_NEED_SAMPLE = set(SAMPLED)
GREEDY = SamplingParams(temperature=0.0)


class Outputs:
    """Computes the outputs of one model's chunks from their hidden states."""

    def __init__(self, model: nn.Module, sampler: Sampler):
        self.model, self.sampler = model, sampler
        self._row_ranges = "allowed" in inspect.signature(model.compute_logits).parameters

    def __call__(self, chunks: list[ScheduledChunk], hidden: torch.Tensor, capture: dict) -> list[dict[str, Any] | None]:
        offsets = [0]
        for c in chunks:
            offsets.append(offsets[-1] + c.num_tokens)
        for i, c in enumerate(chunks):
            p = c.pending
            op = p.op if p is not None else None
            if op is not None and op.row_outputs and p.firing.outputs:
                rows = chunk_rows(c, p)
                if rows is not None:
                    self._row_outputs(p, rows, offsets[i], hidden, capture, c.start - p.start)
        results: list[dict[str, Any] | None] = [None] * len(chunks)
        done = [i for i, c in enumerate(chunks) if c.completes is not None and c.completes.firing.outputs]
        if not done:
            return results
        last = hidden[torch.tensor([offsets[i + 1] - 1 for i in done], device=hidden.device)]  # [N, D]
        names = [_last_names(chunks[i].completes) for i in done]
        outs = [{"hidden": last[j : j + 1].to(torch.float32, copy=True)} if "hidden" in n else {} for j, n in enumerate(names)]
        need = [j for j, n in enumerate(names) if n & _NEED_LOGITS]
        if need:
            self._logit_outputs([chunks[done[j]] for j in need], [names[j] for j in need], last[need], [outs[j] for j in need])
        for i, out in zip(done, outs):
            p = chunks[i].completes
            out.update({name: torch.cat(parts) for name, parts in p.rows.items()})
            results[i] = out
        return results

    def _row_outputs(self, p: PendingFiring, rows: torch.Tensor, offset: int, hidden: torch.Tensor, capture: dict,
                     to_firing: int) -> None:
        """Row-wise outputs of ``p`` at chunk rows ``rows`` (batch row ``offset`` + r; firing row r + ``to_firing``)."""
        names, op = set(p.firing.outputs), p.op
        at = (rows + offset).to(hidden.device)
        last_kind = op is None or op.rows.kind == "last"
        parts: dict[str, torch.Tensor] = {}
        if not last_kind and "hidden" in names:
            parts["hidden"] = hidden[at].float()
        for name, layer in (op.capture.items() if op is not None else ()):
            if name in names:
                parts[name] = capture[layer][at].float()
        want_prompt = names & set(PROMPT)
        if (not last_kind and "logits" in names) or want_prompt:
            logits = self.model.compute_logits(hidden[at]).float()  # [n, V]
            if not last_kind and "logits" in names:
                parts["logits"] = logits
            if want_prompt:
                parts.update(_prompt_logprobs(logits, op.targets, rows + to_firing, p.firing.sampling))
        for name, value in parts.items():
            p.rows.setdefault(name, []).append(value)

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


def _last_names(p: PendingFiring) -> set[str]:
    """The outputs taken from the last row when the firing is answered (hidden/logits only for rows 'last')."""
    names = set(p.firing.outputs) & (_NEED_LOGITS | {"hidden"})
    if p.op is not None and p.op.rows.kind != "last":
        names -= {"hidden", "logits"}
    return names


def chunk_rows(c: ScheduledChunk, p: PendingFiring) -> torch.Tensor | None:
    """The chunk-relative rows of ``c`` whose row-wise outputs firing ``p`` wants (None: none in this chunk)."""
    op = p.op
    kind = "last" if op is None else op.rows.kind
    first = max(c.start, p.start) - p.start  # firing-relative rows in this chunk: [first, stop)
    stop = c.end - p.start
    shift = p.start - c.start  # firing-relative -> chunk-relative
    if kind == "last":
        wants = op is not None and (op.capture or (set(p.firing.outputs) & set(PROMPT)))
        return torch.tensor([stop - 1 + shift]) if wants and c.completes is p else None
    if kind == "all":
        return torch.arange(first, stop) + shift
    if kind == "tail":
        lo = max(first, p.end - p.start - op.rows.start)
        return torch.arange(lo, max(lo, stop)) + shift
    if kind == "range":
        lo, hi = max(first, op.rows.start), min(stop, op.rows.stop if op.rows.stop is not None else stop)
        return torch.arange(lo, max(lo, hi)) + shift
    return op.row_mask[first:stop].nonzero().reshape(-1) + first + shift


def _prompt_logprobs(logits: torch.Tensor, targets: torch.Tensor | None, firing_rows: torch.Tensor,
                     sampling: SamplingParams | None) -> dict[str, torch.Tensor]:
    if targets is None:
        raise ValueError("prompt_logprobs needs the input 'targets' (the next token of each row)")
    logprobs = torch.log_softmax(logits, dim=-1)  # [n, V]
    want = targets[firing_rows].to(logprobs.device)  # [n]
    out = {"prompt_logprobs": logprobs.gather(1, want[:, None])[:, 0].cpu()}
    k = (sampling.prompt_logprobs if sampling is not None else None) or 0
    top = torch.topk(logprobs, k, dim=-1)
    out["prompt_top_logprobs"], out["prompt_top_logprob_ids"] = top.values.cpu(), top.indices.cpu()
    return out


def _sample_row(chunk: ScheduledChunk, names: set[str]) -> SampleRow:
    ctx = chunk.context
    firing = chunk.completes.firing
    params = firing.sampling or GREEDY
    if params.logprobs is None and names & {"logprob", "top_logprobs", "top_logprob_ids"}:
        params = replace(params, logprobs=0)
    sampled = ctx.sampled if ctx is not None else []
    history = ctx.token_ids[: chunk.end] + sampled if ctx is not None and params.repetition_penalty != 1.0 else []
    ranges = firing.node_params.get("token_ranges")  # constrained decoding (e.g. Orpheus)
    allowed = list(ranges(len(sampled)) if callable(ranges) else ranges) if ranges is not None else None
    return SampleRow(params=params, prompt_and_output=history, output=sampled, allowed=allowed)


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
