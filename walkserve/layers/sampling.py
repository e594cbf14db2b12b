"""Batched token sampling from logits, one SamplingParams per row.

Order of operations (every step vectorised over the batch):

    logits [N, V] float32
      -> repetition penalty   (HF: divide positive / multiply negative logits of tokens in prompt+output)
      -> presence, frequency  (OpenAI: minus presence * [count > 0] + frequency * count over output tokens)
      -> min_tokens           (stop ids masked to -inf while fewer than min_tokens were generated)
      -> allowed ranges       (constrained decoding: ids outside a row's [lo, hi) ranges masked to -inf)
      => logprobs are taken here (log_softmax of the penalised logits, before temperature)
      -> greedy rows: argmax
      -> temperature, top-k, top-p, min-p, softmax
      -> draw: argmax(probs / E) with E ~ Exp(1) (the exponential race; equals a categorical draw)

A seeded row draws its E from a generator seeded by (seed, step), where
``step`` counts the tokens already generated for it, so its draws do not
depend on what else shares the batch (or on preemption and recompute).
Unseeded rows share one batched draw from the sampler's own generator.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from walkserve.core.sampling import SamplingParams

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
    """Draws one token per row. Stateless except for the generator of unseeded rows."""

    def __init__(self, seed: int | None = None):
        self._seed = seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        self._generators: dict[torch.device, torch.Generator] = {}

    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> SamplerOutput:
        """logits: [N, V] (any float dtype); returns one token per row."""
        if all(_plain_greedy(r) for r in rows):  # the common decode batch: one argmax, no copy
            return SamplerOutput(token_ids=logits.argmax(dim=-1))
        logits = logits.float().clone()  # [N, V]
        apply_penalties(logits, rows)
        mask_min_tokens(logits, rows)
        mask_disallowed(logits, rows)
        out = SamplerOutput(token_ids=torch.empty(len(rows), dtype=torch.long, device=logits.device))
        want = max((r.params.logprobs for r in rows if r.params.logprobs is not None), default=None)
        logprobs = torch.log_softmax(logits, dim=-1) if want is not None else None  # [N, V]
        greedy = [i for i, r in enumerate(rows) if r.params.greedy]
        sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
        if greedy:
            out.token_ids[greedy] = logits[greedy].argmax(dim=-1)
        if sampled:
            probs = filtered_probs(logits[sampled], [rows[i].params for i in sampled])  # [M, V]
            out.token_ids[sampled] = self._draw(probs, [rows[i] for i in sampled])
        if logprobs is not None:
            _fill_logprobs(out, logprobs, want)
        return out

    def _draw(self, probs: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        noise = torch.empty_like(probs)  # [M, V]
        unseeded = [i for i, r in enumerate(rows) if r.params.seed is None]
        if unseeded:
            noise[unseeded] = torch.empty(
                len(unseeded), probs.shape[1], device=probs.device
            ).exponential_(generator=self._generator(probs.device))
        for i, row in enumerate(rows):
            if row.params.seed is not None:
                gen = torch.Generator(device=probs.device).manual_seed(step_seed(row.params.seed, len(row.output)))
                noise[i].exponential_(generator=gen)
        return (probs / noise.clamp_min_(1e-20)).argmax(dim=-1)

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
        and (not p.stop_token_ids or len(row.output) >= p.min_tokens)
    )


def step_seed(seed: int, step: int) -> int:
    """A well-mixed 63-bit seed for draw ``step`` of a request seeded with ``seed`` (splitmix64)."""
    z = (seed + (step + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """Repetition (prompt+output), presence and frequency (output) penalties, in place on [N, V]."""
    device, vocab = logits.device, logits.shape[1]
    rep = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
    if rep:
        seen = _token_counts([rows[i].prompt_and_output for i in rep], vocab, device) > 0  # [R, V]
        penalty = torch.tensor([rows[i].params.repetition_penalty for i in rep], device=device)[:, None]
        sub = logits[rep]  # [R, V]
        scaled = torch.where(sub > 0, sub / penalty, sub * penalty)
        logits[rep] = torch.where(seen, scaled, sub)
    pen = [i for i, r in enumerate(rows) if r.params.presence_penalty or r.params.frequency_penalty]
    if pen:
        counts = _token_counts([rows[i].output for i in pen], vocab, device)  # [P, V]
        presence = torch.tensor([rows[i].params.presence_penalty for i in pen], device=device)[:, None]
        frequency = torch.tensor([rows[i].params.frequency_penalty for i in pen], device=device)[:, None]
        logits[pen] -= presence * (counts > 0) + frequency * counts


def mask_min_tokens(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """Forbid every stop token id of rows that generated fewer than ``min_tokens`` tokens."""
    for i, row in enumerate(rows):
        stops = [t for t in row.params.stop_token_ids if t < logits.shape[1]]
        if stops and len(row.output) < row.params.min_tokens:
            logits[i, stops] = float("-inf")


def mask_disallowed(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """Rows with ``allowed`` ranges: every id outside them becomes -inf, in place on [N, V]."""
    for i, row in enumerate(rows):
        if row.allowed is None:
            continue
        keep = torch.zeros(logits.shape[1], dtype=torch.bool, device=logits.device)  # [V]
        for lo, hi in row.allowed:
            keep[max(lo, 0) : max(min(hi, logits.shape[1]), 0)] = True
        logits[i].masked_fill_(~keep, float("-inf"))


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
    ordered, order = logits.sort(dim=-1, descending=True)  # [M, V]
    rank = torch.arange(logits.shape[1], device=logits.device)[None, :]  # [1, V]
    ordered = ordered.masked_fill(rank >= top_k[:, None], float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # [M, V] probability of the strictly better tokens
    ordered = ordered.masked_fill((mass_before >= top_p[:, None]) & (rank > 0), float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, ordered)


def _token_counts(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """How often each vocabulary id occurs in each list: [R, V] float32."""
    counts = torch.zeros(len(token_lists), vocab, device=device)
    lengths = torch.tensor([len(t) for t in token_lists])
    ids = torch.tensor([t for tokens in token_lists for t in tokens], dtype=torch.long)
    if ids.numel():
        rows = torch.repeat_interleave(torch.arange(len(token_lists)), lengths)
        keep = ids < vocab
        counts.index_put_(
            (rows[keep].to(device), ids[keep].to(device)), torch.ones(int(keep.sum()), device=device), accumulate=True
        )
    return counts


def _fill_logprobs(out: SamplerOutput, logprobs: torch.Tensor, k: int) -> None:
    out.logprobs = logprobs.gather(1, out.token_ids[:, None]).squeeze(1)  # [N]
    if k > 0:
        out.top_logprobs, out.top_ids = logprobs.topk(k, dim=-1)  # [N, K]
