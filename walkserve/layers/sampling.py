"""Batched token sampling from logits, one SamplingParams per row.

Each row is sampled over its candidates only (``walkserve/layers/candidates.py``):
a row with allowed ranges over the logits of those ids, gathered into a compact
[G, K] tensor shared by the rows with the same candidate count; any other row over
the whole vocabulary (K = V). Order of operations (vectorised over a group's rows):

    logits [N, V] (any float dtype)
      -> candidates           (gather the allowed ids of constrained rows: x [G, K] float32)
      -> repetition penalty   (HF: divide positive / multiply negative logits of tokens in prompt+output)
      -> presence, frequency  (OpenAI: minus presence * [count > 0] + frequency * count over output tokens)
      -> logit_bias           (OpenAI: the request's bias added to the logits of its listed ids)
      -> min_tokens           (stop ids masked to -inf while fewer than min_tokens were generated)
      => logprobs are taken here (log_softmax of the penalised logits, before temperature)
      -> greedy rows: argmax  (candidate ids ascend, so ties go to the lowest id, as over the vocabulary)
      -> rows with 0 < top_k < K: narrowed to their top_k candidates (topk, no sort of all K)
      -> temperature, top-k, top-p, min-p, softmax
      -> draw: argmax(probs / E) with E ~ Exp(1) (the exponential race; equals a categorical draw)

Penalties touch only the columns of tokens in a row's history (O(history), never
a [rows, V] count table); ids outside a row's candidates are -inf in the full
view anyway, so restricting them to the candidates changes nothing.

A seeded row draws E for its own columns (all K, or its top_k narrowed ones in
rank order) from a generator seeded by (seed, step), where ``step`` counts the
tokens already generated for it, so its draws do not depend on what else shares
the batch (or on preemption and recompute). Unseeded rows share batched draws
from the sampler's own generator.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from walkserve.core.sampling import SamplingParams
from walkserve.layers.candidates import (
    CandidateGroup,
    CandidateIds,
    candidate_groups,
    merged_ranges,
)

_MASK64 = (1 << 64) - 1


@dataclass
class SampleRow:
    """What the sampler needs to know about one row besides its logits."""

    params: SamplingParams
    prompt_and_output: list[int]  # every token of the sequence so far (repetition penalty)
    output: list[int]  # the tokens generated so far (presence/frequency penalty, min_tokens, seed step)
    allowed: list[tuple[int, int]] | None = None  # only ids in these [lo, hi) ranges may be drawn (None: any)


@dataclass
class SamplerOutput:
    """token_ids [N] int64; with logprobs requested: logprob of each drawn token [N] and the top-k [N, K]."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None


class Sampler:
    """Draws one token per row. Stateless except for the generator of unseeded rows (and a cache of id tensors)."""

    def __init__(self, seed: int | None = None):
        self._seed = seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        self._generators: dict[torch.device, torch.Generator] = {}
        self._candidate_ids = CandidateIds()

    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> SamplerOutput:
        """logits: [N, V] (any float dtype); returns one token per row."""
        if all(_plain_greedy(r) for r in rows):  # the common decode batch: one argmax, no copy
            return SamplerOutput(token_ids=logits.argmax(dim=-1))
        vocab = logits.shape[1]
        want = max((r.params.logprobs for r in rows if r.params.logprobs is not None), default=None)
        out = _empty_output(len(rows), want, logits.device)
        allowed = [None if r.allowed is None else merged_ranges(r.allowed, vocab) for r in rows]
        need = [r.params.logprobs or 0 for r in rows]
        for group in candidate_groups(logits, allowed, need, self._candidate_ids):
            self._sample_group(group, [rows[i] for i in group.rows], out, want)
        return out

    def _sample_group(
        self, group: CandidateGroup, rows: list[SampleRow], out: SamplerOutput, want: int | None
    ) -> None:
        penalise(group, rows)
        add_logit_bias(group, rows)
        mask_min_tokens(group, rows)
        x = group.x  # [G, K]
        logprobs = torch.log_softmax(x, dim=-1) if want is not None else None  # [G, K]
        columns = torch.empty(len(rows), dtype=torch.long, device=x.device)  # [G]
        greedy = [g for g, r in enumerate(rows) if r.params.greedy]
        sampled = [g for g, r in enumerate(rows) if not r.params.greedy]
        if greedy:
            columns[greedy] = _rows(x, greedy).argmax(dim=-1)
        if sampled:
            columns[sampled] = self._draw(_rows(x, sampled), [rows[g] for g in sampled])
        at = torch.tensor(group.rows, device=x.device)  # [G]: the group's rows in the batch
        everyone = torch.arange(len(rows), device=x.device)
        out.token_ids[at] = group.vocab_ids(everyone, columns)
        if logprobs is not None:
            _fill_logprobs(out, at, group, logprobs, columns)

    def _draw(self, x: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """Columns drawn from penalised logits x [M, K]; rows with 0 < top_k < K race over their top_k only."""
        width = x.shape[1]
        params = [r.params for r in rows]
        narrow = [m for m, p in enumerate(params) if 0 < p.top_k < width]
        wide = [m for m, p in enumerate(params) if not 0 < p.top_k < width]
        columns = torch.empty(len(rows), dtype=torch.long, device=x.device)  # [M]
        if wide:
            probs = filtered_probs(_rows(x, wide), [params[m] for m in wide])  # [W, K]
            columns[wide] = self._race(probs, [rows[m] for m in wide], [width] * len(wide))
        if narrow:
            top, order = _rows(x, narrow).topk(max(params[m].top_k for m in narrow), dim=-1)  # [Q, k]: best first
            probs = filtered_probs(top, [params[m] for m in narrow])  # [Q, k]: each row's top_k by rank
            ranks = self._race(probs, [rows[m] for m in narrow], [params[m].top_k for m in narrow])
            columns[narrow] = order.gather(1, ranks[:, None]).squeeze(1)
        return columns

    def _race(self, probs: torch.Tensor, rows: list[SampleRow], widths: list[int]) -> torch.Tensor:
        """argmax(probs / E), E ~ Exp(1): a seeded row draws E for its first ``widths[i]`` columns only."""
        uniform = torch.ones_like(probs)  # [M, W]: 1 -> E = 0 where no row draws (its probabilities are 0 there)
        unseeded = [i for i, r in enumerate(rows) if r.params.seed is None]
        if unseeded:
            uniform[unseeded] = torch.empty(
                len(unseeded), probs.shape[1], device=probs.device
            ).uniform_(generator=self._generator(probs.device))
        for i, row in enumerate(rows):
            if row.params.seed is not None:
                gen = torch.Generator(device=probs.device).manual_seed(step_seed(row.params.seed, len(row.output)))
                uniform[i, : widths[i]].uniform_(generator=gen)
        noise = uniform.log_().neg_().clamp_min_(1e-20)  # E = -log U ~ Exp(1); 4x cheaper than exponential_ on CPU
        return (probs / noise).argmax(dim=-1)

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self._seed)
        return self._generators[device]


def _plain_greedy(row: SampleRow) -> bool:
    """Greedy with nothing that changes the logits (penalties, active min_tokens, allowed ranges) and no logprobs."""
    p = row.params
    return (
        p.greedy
        and p.logprobs is None
        and row.allowed is None
        and p.repetition_penalty == 1.0
        and not p.presence_penalty
        and not p.frequency_penalty
        and not p.logit_bias
        and (not p.stop_token_ids or len(row.output) >= p.min_tokens)
    )


def step_seed(seed: int, step: int) -> int:
    """A well-mixed 63-bit seed for draw ``step`` of a request seeded with ``seed`` (splitmix64)."""
    z = (seed + (step + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """Repetition (prompt+output), presence and frequency (output) penalties, in place on full logits [N, V]."""
    penalise(CandidateGroup(list(range(len(rows))), logits, None, logits.shape[1]), rows)


def penalise(group: CandidateGroup, rows: list[SampleRow]) -> None:
    """The penalties on a candidate group's logits, in place; touches only the columns of history tokens."""
    x, width = group.x, group.x.shape[1]  # x: [G, K]
    rep = [g for g, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
    if rep:
        g, c = group.columns(rep, [rows[i].prompt_and_output for i in rep])  # one pair per occurrence
        penalty = _per_row(rows, "repetition_penalty", x.device)[g]
        seen = x[g, c]  # duplicates read and write the same value
        x[g, c] = torch.where(seen > 0, seen / penalty, seen * penalty)
    pen = [g for g, r in enumerate(rows) if r.params.presence_penalty or r.params.frequency_penalty]
    if pen:
        g, c = group.columns(pen, [rows[i].output for i in pen])
        cell, count = torch.unique(g * width + c, return_counts=True)  # each (row, column) once, with its count
        g, c = cell // width, cell % width
        presence = _per_row(rows, "presence_penalty", x.device)[g]
        frequency = _per_row(rows, "frequency_penalty", x.device)[g]
        x[g, c] -= presence + frequency * count


def add_logit_bias(group: CandidateGroup, rows: list[SampleRow]) -> None:
    """Each row's ``logit_bias`` added to the logits of its ids that are candidates (others stay excluded)."""
    biased = [g for g, r in enumerate(rows) if r.params.logit_bias]
    if not biased:
        return
    x = group.x
    for g in biased:  # a few hundred entries at most per row
        ids = [t for t, _ in rows[g].params.logit_bias]
        _, c = group.columns([g], [ids])  # candidate columns, in the order of ``ids`` (others dropped)
        if not len(c):
            continue
        kept = group.vocab_ids(torch.full_like(c, g), c).tolist()
        bias = dict(rows[g].params.logit_bias)
        x[g, c] += torch.tensor([bias[t] for t in kept], dtype=x.dtype, device=x.device)


def mask_min_tokens(group: CandidateGroup, rows: list[SampleRow]) -> None:
    """Forbid every stop token id of rows that generated fewer than ``min_tokens`` tokens."""
    short = [g for g, r in enumerate(rows) if r.params.stop_token_ids and len(r.output) < r.params.min_tokens]
    if short:
        g, c = group.columns(short, [list(rows[i].params.stop_token_ids) for i in short])
        group.x[g, c] = float("-inf")


def _rows(x: torch.Tensor, which: list[int]) -> torch.Tensor:
    """x[which] for reading; x itself when ``which`` is every row in order (no copy)."""
    return x if len(which) == x.shape[0] else x[which]


def _per_row(rows: list[SampleRow], name: str, device: torch.device) -> torch.Tensor:
    return torch.tensor([getattr(r.params, name) for r in rows], device=device)  # [G] float32


def filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p filtering; returns probabilities [M, V]."""
    device = logits.device
    temperature = torch.tensor([p.temperature for p in params], device=device)[:, None]
    logits = logits / temperature  # [M, V]
    top_k = torch.tensor([p.top_k if p.top_k > 0 else logits.shape[1] for p in params], device=device)
    top_p = torch.tensor([p.top_p for p in params], device=device)
    if (top_k < logits.shape[1]).any() or (top_p < 1.0).any():
        logits = _top_k_top_p(logits, top_k.clamp(max=logits.shape[1]), top_p)
    probs = torch.softmax(logits, dim=-1)  # [M, V]
    min_p = torch.tensor([p.min_p for p in params], device=device)[:, None]
    if (min_p > 0).any():
        probs = probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
    return probs


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep each row's ``top_k`` largest logits, then its smallest head whose probability reaches ``top_p``."""
    order = _descending_order(logits)  # [M, V]
    ordered = logits.gather(1, order)
    rank = torch.arange(logits.shape[1], device=logits.device)[None, :]  # [1, V]
    ordered = ordered.masked_fill(rank >= top_k[:, None], float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # [M, V] probability of the strictly better tokens
    ordered = ordered.masked_fill((mass_before >= top_p[:, None]) & (rank > 0), float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, ordered)


def _descending_order(logits: torch.Tensor) -> torch.Tensor:
    """Column order of each row, largest first, [M, V] int64 (ties in any order).

    On the CPU numpy's argsort (vectorised) is 2-3x faster than torch.sort at
    4k-157k columns; elsewhere torch.sort.
    """
    if logits.device.type != "cpu":
        return logits.sort(dim=-1, descending=True).indices
    return torch.from_numpy(np.argsort(np.negative(logits.numpy()), axis=-1))


def _empty_output(n: int, want: int | None, device: torch.device) -> SamplerOutput:
    out = SamplerOutput(token_ids=torch.empty(n, dtype=torch.long, device=device))
    if want is not None:
        out.logprobs = torch.empty(n, device=device)
    if want:
        out.top_ids = torch.zeros(n, want, dtype=torch.long, device=device)
        out.top_logprobs = torch.full((n, want), float("-inf"), device=device)
    return out


def _fill_logprobs(
    out: SamplerOutput, at: torch.Tensor, group: CandidateGroup, logprobs: torch.Tensor, columns: torch.Tensor
) -> None:
    """Log-probabilities [G, K] of a group -> its rows ``at`` of ``out``; a row asks for at most K top entries."""
    out.logprobs[at] = logprobs.gather(1, columns[:, None]).squeeze(1)  # [G]
    if out.top_ids is None:
        return
    k = min(out.top_ids.shape[1], logprobs.shape[1])
    values, top = logprobs.topk(k, dim=-1)  # [G, k]
    out.top_logprobs[at, :k] = values
    out.top_ids[at, :k] = group.vocab_ids(torch.arange(len(at), device=at.device), top)
