"""What FlashInfer's batch wrappers are told about one step: CSR page lists, masks and row sets (plain torch, no CUDA).

A ``PagedBatch`` (``paged_attention``) becomes at most three wrapper calls:

    appends   one paged pass over every append (the decode wrapper when all are
              one-row causal appends, else the prefill wrapper): the rows were
              written to the pool first, so each row sees its cached prefix and
              the chunk under its mask;
    cached    one paged pass of the queries over the contexts they read (every
              cached key visible; padding inside the pages of a non-final read
              hidden by a custom mask), returning the log-sum-exp;
    own       one ragged pass of the queries over their own rows (their k/v are
              never written), under the chunk mask, returning the log-sum-exp.

The two query passes are merged per row (``merge_state``) where a query has
cached keys. FlashInfer's CSR form of a paged pass (one entry per sequence):

    qo_indptr      [S+1]  row offsets of each sequence in the pass's q
    kv_indptr      [S+1]  offsets of each sequence's pages in kv_indices
    kv_indices     [P]    page (block) ids, concatenated
    last_page_len  [S]    tokens used in each sequence's last page (1..block_size)

so sequence i holds kv_len = (pages - 1) * block_size + last_page_len keys, and
a causal mask is aligned to the end of them (row r sees keys up to
kv_len - q_len + r). A custom mask is one flat bool per pass: each sequence's
[q_len, kv_len] matrix, row-major, concatenated (True = may attend).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from walkserve.layers.paged_attention import PagedBatch, chunk_mask


@dataclass(frozen=True)
class PagedPass:
    """One paged wrapper call over sequences ``seqs`` of the batch (their rows, in batch order)."""

    seqs: list[int]
    rows: list[int]
    qo_indptr: list[int]
    kv_indptr: list[int]
    kv_indices: list[int]
    last_page_len: list[int]
    causal: bool
    mask: torch.Tensor | None  # flat bool, sum(q_len * kv_len); None: ``causal`` says it all

    @property
    def decode(self) -> bool:
        """One row per sequence, causal, no custom mask: the decode wrapper can run it."""
        return self.mask is None and self.causal and len(self.rows) == len(self.seqs)

    def kv_lens(self, block_size: int) -> list[int]:
        return [(b - a - 1) * block_size + last
                for a, b, last in zip(self.kv_indptr, self.kv_indptr[1:], self.last_page_len)]


@dataclass(frozen=True)
class RaggedPass:
    """The queries' own rows attending to each other (qo and kv share one indptr)."""

    seqs: list[int]
    rows: list[int]
    indptr: list[int]
    causal: bool
    mask: torch.Tensor | None


@dataclass(frozen=True)
class StepPlan:
    """The passes of one step; ``merge``: positions in ``own.rows`` of the rows that ``cached`` also computed."""

    appends: PagedPass | None
    cached: PagedPass | None
    own: RaggedPass | None
    merge: list[int]


def offsets(sizes: list[int]) -> list[int]:
    out = [0]
    for size in sizes:
        out.append(out[-1] + size)
    return out


def plan_step(batch: PagedBatch) -> StepPlan:
    """Split ``batch`` into FlashInfer passes (see the module docstring)."""
    starts = offsets(batch.query_lens)
    rows_of = [list(range(starts[i], starts[i + 1])) for i in range(len(batch.query_lens))]
    appends = [i for i in range(len(batch.query_lens)) if not batch.is_query(i)]
    queries = [i for i in range(len(batch.query_lens)) if batch.is_query(i)]
    append_pass = _append_pass(batch, appends, rows_of) if appends else None
    if not queries:
        return StepPlan(append_pass, None, None, [])
    cached = [i for i in queries if batch.kv_lens[i] > 0]
    cached_pass = _cached_pass(batch, cached, rows_of) if cached else None
    own = _own_pass(batch, queries, rows_of)
    position = {row: j for j, row in enumerate(own.rows)}
    merge = [position[row] for i in cached for row in rows_of[i]]
    return StepPlan(append_pass, cached_pass, own, merge)


def _chunk_allowed(batch: PagedBatch, i: int) -> torch.Tensor:
    """bool [n, n] among sequence i's own rows."""
    n = batch.query_lens[i]
    inner = chunk_mask(batch.mask(i), n, batch.frames[i] if batch.frames else 0, torch.device("cpu"))
    return torch.ones(n, n, dtype=torch.bool) if inner is None else inner


def _masking(batch: PagedBatch, seqs: list[int]) -> tuple[bool, bool]:
    """(causal flag, whether a custom mask is needed) for a pass over ``seqs`` by their mask kinds."""
    kinds = {batch.mask(i) for i in seqs}
    if kinds == {"causal"}:
        return True, False
    if kinds == {"full"}:
        return False, False
    return False, True


def _append_pass(batch: PagedBatch, seqs: list[int], rows_of: list[list[int]]) -> PagedPass:
    bs = batch.block_size
    pages = [-(-batch.kv_lens[i] // bs) for i in seqs]
    indices = [b for i, n in zip(seqs, pages) for b in batch.block_tables[i][:n]]
    last = [batch.kv_lens[i] - (n - 1) * bs for i, n in zip(seqs, pages)]
    causal, custom = _masking(batch, seqs)
    mask = None
    if custom:
        parts = []
        for i in seqs:
            n, prefix = batch.query_lens[i], batch.kv_lens[i] - batch.query_lens[i]
            parts.append(torch.cat([torch.ones(n, prefix, dtype=torch.bool), _chunk_allowed(batch, i)], 1).reshape(-1))
        mask = torch.cat(parts)
    return PagedPass(seqs, [r for i in seqs for r in rows_of[i]], offsets([batch.query_lens[i] for i in seqs]),
                     offsets(pages), indices, last, causal, mask)


def _cached_pass(batch: PagedBatch, seqs: list[int], rows_of: list[list[int]]) -> PagedPass:
    """Queries over their reads: every cached key visible, the padding of a non-final read's last page hidden."""
    bs = batch.block_size
    counts, indices, last, masks, padded = [], [], [], [], False
    for i in seqs:
        reads = [(table, n) for table, n in batch.reads[i] if n > 0]
        valid = []
        for j, (table, n) in enumerate(reads):
            pages = -(-n // bs)
            indices += table[:pages]
            final = j == len(reads) - 1
            valid += [True] * n + ([] if final else [False] * (pages * bs - n))
            padded |= not final and n % bs != 0
        counts.append(sum(-(-n // bs) for _, n in reads))
        last.append(reads[-1][1] - (-(-reads[-1][1] // bs) - 1) * bs)
        masks.append(torch.tensor(valid)[None, :].expand(batch.query_lens[i], -1).reshape(-1))
    return PagedPass(seqs, [r for i in seqs for r in rows_of[i]], offsets([batch.query_lens[i] for i in seqs]),
                     offsets(counts), indices, last, False, torch.cat(masks) if padded else None)


def _own_pass(batch: PagedBatch, seqs: list[int], rows_of: list[list[int]]) -> RaggedPass:
    causal, custom = _masking(batch, seqs)
    mask = torch.cat([_chunk_allowed(batch, i).reshape(-1) for i in seqs]) if custom else None
    return RaggedPass(seqs, [r for i in seqs for r in rows_of[i]], offsets([batch.query_lens[i] for i in seqs]),
                      causal, mask)
