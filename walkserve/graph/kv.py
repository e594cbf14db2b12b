"""What a KV-cache node does to its request's KV contexts, declared in the graph (torch-free).

A model declares, per node, an ordered list of context operations in the
node's params (``GraphNode(..., params=kv_params(...))``); the worker binds
each declaration to the firing's input tensors (``engines.kv.ops.bind``) and
the KV engine carries it out.

    gen       ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━  append("gen", ...)   writes, attends to its prefix + itself
    cfg_text  ┗━ fork("gen", into="cfg_text")   shares gen's blocks; copies a block only on its next write
    query     ░░░  query("gen")                  attends to gen (+ itself), writes nothing, allocates nothing

Operations (``op``):
  append    write the chunk's K/V into ``context`` (created empty on first use),
            attending to its cached prefix plus the chunk under ``mask``;
  query     attend to ``reads`` (default: ``context``), concatenated in order, plus
            the chunk under ``mask``; nothing is written;
  fork      ``context`` becomes a copy-on-write snapshot of ``source`` (an existing
            ``context`` is dropped first);
  truncate  roll ``context`` back to ``length`` tokens (an int, or an input slot);
  drop      free ``context``.

Fans: an operation declared with ``fan="slot"`` applies to K contexts at once, ``context[0]`` …
``context[K-1]`` (``fan_context``), K read from that input slot (an int; 0 is allowed for a fork,
truncate or drop, which then does nothing: a node may reset its members only on some firings). An append's or query's
chunk is then K member chunks of T / K rows each, side by side (tokens, embeddings, the last axis of
positions, targets, row masks and token inputs split in K equal parts); each member runs as its own
chunk in the same batch, and the firing is answered once all have run, with each output the
members' concatenated along dim 0 (a last-row ``logits`` [V] stacked to [K, V]). A fork fans one
source out to K contexts; a truncate or drop applies to each. (V-JEPA 2-AC's CEM: K candidate
rollouts of one request, batched, each forked from one shared prefix.)

    kv_params(fork("prefix", into="cand", fan="k"))                 cand[0..K-1] = snapshots of prefix
    kv_params(append("cand", fan="k", mask="full", rows=Rows.tail(F)))   one step of every candidate

Masks, per chunk (the cached prefix is always visible in full):
  causal        row i sees the chunk's rows 0..i
  full          every row sees the whole chunk (image blocks, pi0's prefix and suffix)
  block_causal  frames of ``frame`` rows: a row sees its own and earlier frames (V-JEPA 2-AC)

Inputs, by slot name (``tokens``/``embeds``/``embed_rows``/``positions``/``targets``):
  tokens      int ids [T]; optional when ``embeds`` covers every row
  embeds      float [N, D] replacing the embeddings of rows ``embed_rows`` (int [N]) or, without
              ``embed_rows``, of every row (N == T)
  positions   int [T] or [A, T] (multi-axis rope); absent = the context's running position
              (one past the largest position appended so far) + 0..T-1
  targets     int [T]: the next token of each row, for ``prompt_logprobs``
  token_inputs  the named slots are passed to the model's forward as extra per-token tensors [T, ...]
  content     (declared with ``content="slot"``) int [T] or [T, K]: what each row's embedding and token inputs
              depend on besides its token id: 0 (all K) for a row that is its token id, else a digest of the
              content that fills it (a media item's encoder input: 128 bits, K = 2, so no client can build a
              second input with the same key; ``models/common/content_key.py``; bind refuses fewer on an
              embedded row). It makes an append with embeddings, explicit positions or token
              inputs shareable through the prefix cache, keyed on (token id, content, position) per row; in a
              ``full`` append (rows that see each other both ways) every row's key also covers the whole
              append, so its blocks are shared only with an append equal in every row (pi0's prefix)
  lazy        (an append) a firing that names no output is answered once its rows are in the context's
              history; they run with the context's next firing that computes, so a prompt cut in pieces
              loses no prefix-cache block at the cuts (a block may then span two pieces); one whose outputs
              are all captured rows (``rows=ALL``) is answered the same way when an equal piece ran after the
              same history (the engine's capture cache, ``engines/kv/capture_cache.py``)

Outputs (the node's declared outputs the engine fills):
  token, logprob, top_logprobs, top_logprob_ids   sampled from the chunk's last row
  logits, hidden        the chosen ``rows`` (last: logits [V], hidden [1, D]; otherwise [N, V], [N, D])
  <name> in capture     the *input* of layer k at the chosen rows ([1, D] or [N, D])
  prompt_logprobs, prompt_top_logprobs, prompt_top_logprob_ids   log p(targets[i] | rows ..i) at the chosen rows
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from walkserve.core.errors import GraphError

OPS = ("append", "query", "fork", "truncate", "drop")
MASKS = ("causal", "full", "block_causal")
ROW_KINDS = ("last", "all", "range", "tail", "where")
KV_PARAM = "kv"  # GraphNode.params key holding the node's tuple of ContextOpSpec
DEFAULT_CONTEXT = "main"


@dataclass(frozen=True)
class Rows:
    """Which rows of a chunk come out: the last, all, ``[start, stop)`` (chunk-relative), the last ``start``
    rows (``tail``), or where slot ``slot`` (bool [T]) is true."""

    kind: str = "last"
    start: int = 0
    stop: int | None = None
    slot: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ROW_KINDS:
            raise GraphError(f"rows kind {self.kind!r} is not one of {', '.join(ROW_KINDS)}")
        if self.kind == "where" and not self.slot:
            raise GraphError("rows 'where' needs the input slot holding the bool row mask")
        if self.kind == "range" and (self.start < 0 or (self.stop is not None and self.stop <= self.start)):
            raise GraphError(f"rows range [{self.start}, {self.stop}) is empty or negative")
        if self.kind == "tail" and (self.start < 1 or self.stop is not None):
            raise GraphError(f"rows tail needs a count >= 1, got {self.start}")

    @staticmethod
    def range(start: int, stop: int | None = None) -> Rows:
        return Rows("range", start, stop)

    @staticmethod
    def tail(n: int) -> Rows:
        """The last ``n`` rows of the chunk (a V-JEPA step's frame tokens, whatever the steps before them)."""
        return Rows("tail", n)

    @staticmethod
    def where(slot: str) -> Rows:
        """The rows a per-token bool input marks (a modality's positions)."""
        return Rows("where", slot=slot)


LAST, ALL = Rows("last"), Rows("all")


@dataclass(frozen=True)
class ContextOpSpec:
    """One declared context operation (see the module docstring). Filled by model graph code; validated here."""

    op: str
    context: str = DEFAULT_CONTEXT
    reads: tuple[str, ...] = ()
    source: str = ""
    length: int | str | None = None
    mask: str = "causal"
    frame: int = 0
    rows: Rows = LAST
    capture: Mapping[str, int] = field(default_factory=dict)
    token_inputs: tuple[str, ...] = ()
    tokens: str = "tokens"
    embeds: str = "embeds"
    embed_rows: str = "embed_rows"
    positions: str = "positions"
    targets: str = "targets"
    fan: str = ""
    content: str = ""
    lazy: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "reads", tuple(self.reads))
        object.__setattr__(self, "token_inputs", tuple(self.token_inputs))
        object.__setattr__(self, "capture", dict(self.capture))
        if self.op not in OPS:
            raise GraphError(f"context op {self.op!r} is not one of {', '.join(OPS)}")
        if self.mask not in MASKS:
            raise GraphError(f"mask {self.mask!r} is not one of {', '.join(MASKS)}")
        if (self.mask == "block_causal") != (self.frame > 0):
            raise GraphError("mask 'block_causal' needs frame > 0 (tokens per frame), and only it takes a frame")
        if self.op == "fork" and not self.source:
            raise GraphError(f"fork into {self.context!r} needs a source context")
        if self.op == "truncate" and self.length is None:
            raise GraphError(f"truncate of {self.context!r} needs a length (an int or an input slot)")
        if self.reads and self.op != "query":
            raise GraphError("only a query reads other contexts (reads=...)")
        if any(not isinstance(k, int) or k < 0 for k in self.capture.values()):
            raise GraphError(f"capture maps output names to layer indices >= 0, got {self.capture}")
        if self.lazy and self.op != "append":
            raise GraphError("only an append may be lazy")
        if self.content and (self.op != "append" or self.mask not in ("causal", "full")):
            raise GraphError(f"content keys ({self.content!r}) are for causal or full appends (what the prefix cache "
                             "shares)")
        simple = self.op == "append" and self.mask == "causal" and self.rows == LAST and not self.fan and not self.content \
            and not self.lazy
        object.__setattr__(self, "_tokens_only", simple and not self.capture and not self.token_inputs)

    @property
    def tokens_only(self) -> bool:
        """A causal append of ids, last row out: what a decode step declares (bound on a fast path)."""
        return self._tokens_only

    @property
    def computes(self) -> bool:
        """True for append and query (a forward runs); fork, truncate and drop are bookkeeping."""
        return self.op in ("append", "query")

    @property
    def read_contexts(self) -> tuple[str, ...]:
        return self.reads or (self.context,)


def append(context: str = DEFAULT_CONTEXT, **fields: Any) -> ContextOpSpec:
    """Write the chunk into ``context`` (mask, rows, capture, token_inputs, slot names: see ContextOpSpec)."""
    return ContextOpSpec("append", context, **fields)


def query(*reads: str, **fields: Any) -> ContextOpSpec:
    """Attend to ``reads`` (in order) plus the chunk, writing nothing."""
    reads = reads or (DEFAULT_CONTEXT,)
    return ContextOpSpec("query", reads[0], reads=reads, **fields)


def fork(source: str, into: str, fan: str = "") -> ContextOpSpec:
    """``into`` becomes a copy-on-write snapshot of ``source`` (with ``fan``: each of ``into[0..K-1]``)."""
    return ContextOpSpec("fork", into, source=source, fan=fan)


def truncate(context: str, length: int | str, fan: str = "") -> ContextOpSpec:
    """Roll ``context`` back to ``length`` tokens (an int, or the input slot holding it)."""
    return ContextOpSpec("truncate", context, length=length, fan=fan)


def drop(context: str, fan: str = "") -> ContextOpSpec:
    return ContextOpSpec("drop", context, fan=fan)


def fan_context(context: str, member: int) -> str:
    """The name of member ``member`` of a fanned context: ``"cand"``, 3 -> ``"cand[3]"``."""
    return f"{context}[{member}]"


def kv_params(*ops: ContextOpSpec, **other: Any) -> dict[str, Any]:
    """GraphNode params declaring the node's context operations, in order (at most one append or query;
    a fanned one runs one forward chunk per member)."""
    if not ops:
        raise GraphError("kv_params needs at least one context operation")
    if sum(op.computes for op in ops) > 1:
        raise GraphError("a firing runs at most one forward: give at most one append or query")
    return {**other, KV_PARAM: tuple(ops)}


_DEFAULTS: dict[str, tuple[ContextOpSpec, ...]] = {}


def declared_ops(node_params: Mapping[str, Any]) -> tuple[ContextOpSpec, ...]:
    """A node's declared operations; undeclared nodes append ``tokens`` to ``params["context"]`` (default "main")."""
    ops = node_params.get(KV_PARAM)
    if ops is not None:
        return ops
    name = str(node_params.get("context", DEFAULT_CONTEXT))
    default = _DEFAULTS.get(name)
    if default is None:
        default = _DEFAULTS[name] = (ContextOpSpec("append", name),)
    return default
