"""ContextOp: one context operation of a firing, bound to its input tensors (the worker -> KV engine contract).

A node's graph params declare its operations (``walkserve.graph.kv``); ``bind``
turns each declaration plus the firing's resolved inputs into a ContextOp.
A worker's cohort binds each member of a Group in its pass, on the heartbeat's
thread, right before it submits the Group; the engine binds a firing that arrives
without (``Firing.kv is None``). Binding checks shapes and dtypes and raises
ValueError naming the node's slot; the engine then answers the firing with
that error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from walkserve.graph.kv import LAST, ContextOpSpec, Rows, declared_ops, fan_context


class _Empty(Mapping):
    """An immutable empty mapping (a shared default, so binding a decode step allocates no dicts)."""

    def __getitem__(self, key: Any) -> Any:
        raise KeyError(key)

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def __hash__(self) -> int:
        return 0


_NONE: Mapping[str, Any] = _Empty()


@dataclass(slots=True)
class ContextOp:
    """What one firing does to one context of its request, with its tensors. Read-only for the engine.

    Filled by ``bind`` (worker side). Invariants:
      - ``kind`` is append | query | fork | truncate | drop; ``context`` names the
        context (per request; shared by every component of a KV share group);
      - append/query: ``num_tokens`` T >= 1; ``token_ids`` int64 [T] or None
        (then ``embeds`` covers every row); ``embeds`` [N, D] replaces rows
        ``embed_rows`` (int64 [N], chunk-relative, distinct) or all rows (N == T);
        ``positions`` int64 (or float: fractional video times) [T] or [A, T], or
        None for the running position;
        ``row_mask`` bool [T] when ``rows.kind == "where"``; ``targets`` int64 [T]
        when prompt logprobs are asked; every ``token_inputs`` tensor has first dim T;
        ``content`` int64 [T] or [T, K] (or None): per-row content keys (a row's
        K values), nonzero at least on every ``embed_rows`` row; with ``embeds``,
        [T, K >= 2] (a 128-bit digest a media row); ``lazy``: a firing of it naming no output is answered
        before its rows run (both: see ``walkserve.graph.kv``);
      - query: ``reads`` lists the contexts attended, in order (never written);
      - fork: ``source`` is forked into ``context``; truncate: ``length`` >= 0.
    """

    kind: str
    context: str
    reads: tuple[str, ...] = ()
    source: str = ""
    length: int | None = None
    token_ids: torch.Tensor | None = None
    embeds: torch.Tensor | None = None
    embed_rows: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    targets: torch.Tensor | None = None
    mask: str = "causal"
    frame: int = 0
    rows: Rows = LAST
    row_mask: torch.Tensor | None = None
    capture: Mapping[str, int] = _NONE
    token_inputs: Mapping[str, torch.Tensor] = _NONE
    num_tokens: int = 0
    content: torch.Tensor | None = None
    lazy: bool = False

    @property
    def computes(self) -> bool:
        return self.kind in ("append", "query")

    @property
    def row_outputs(self) -> bool:
        """Whether rows besides the chunk's last come out (all or chosen rows, captured layers, prompt logprobs):
        those rows must be computed, so the prefix cache never stands in for them."""
        return self.rows.kind != "last" or bool(self.capture) or self.targets is not None

    @property
    def plain(self) -> bool:
        """Token ids only, causal, running positions, no extra inputs: the prefix cache may share it."""
        return (self.embeds is None and self.positions is None and self.mask == "causal"
                and not self.token_inputs and self.token_ids is not None)

    @property
    def keyed(self) -> bool:
        """Not plain, but its rows are keyed on content (token ids, content keys, positions): shareable too."""
        return self.content is not None and self.mask in ("causal", "full") and self.token_ids is not None


def bind(node: str, node_params: Mapping[str, Any], inputs: Mapping[str, Any]) -> tuple[ContextOp, ...]:
    """The node's declared operations bound to ``inputs`` (ValueError naming the slot on a bad input)."""
    specs = declared_ops(node_params)
    if len(specs) == 1 and specs[0].tokens_only and len(inputs) == 1:  # a decode step: ids in, nothing else
        ids = inputs.get(specs[0].tokens)
        if type(ids) is torch.Tensor and ids.dtype == torch.long and ids.dim() == 1 and ids.numel():
            return (ContextOp("append", specs[0].context, token_ids=ids, num_tokens=ids.numel()),)
    ops: list[ContextOp] = []
    for spec in specs:
        op = _bind_one(node, spec, inputs)
        ops.extend(_fan_out(node, spec, op, inputs) if spec.fan else (op,))
    return tuple(ops)


def _fan_out(node: str, spec: ContextOpSpec, op: ContextOp, inputs: Mapping[str, Any]) -> list[ContextOp]:
    """A fanned operation as one ContextOp per member context (a chunk split into K equal member chunks)."""
    k = _fan_size(node, spec, inputs, op.computes)
    members = [replace(op, context=fan_context(spec.context, i)) for i in range(k)]
    if op.kind == "query":
        for i, m in enumerate(members):
            m.reads = tuple(fan_context(r, i) for r in op.reads)
    if not op.computes:
        return members
    if op.num_tokens % k:
        raise ValueError(f"node {node!r}: {op.num_tokens} rows do not split into {k} equal member chunks ({spec.fan!r})")
    if op.embed_rows is not None:
        raise ValueError(f"node {node!r}: a fanned chunk takes embeddings for every row, not {spec.embed_rows!r}")
    t = op.num_tokens // k
    if op.mask == "block_causal" and t % op.frame:
        raise ValueError(f"node {node!r}: member chunks of {t} rows are not whole frames of {op.frame}")
    for i, m in enumerate(members):
        rows = slice(i * t, (i + 1) * t)
        m.num_tokens = t
        m.token_ids = None if op.token_ids is None else op.token_ids[rows]
        m.embeds = None if op.embeds is None else op.embeds[rows]
        m.positions = None if op.positions is None else op.positions[..., rows]
        m.targets = None if op.targets is None else op.targets[rows]
        m.row_mask = None if op.row_mask is None else op.row_mask[rows]
        m.token_inputs = {name: v[rows] for name, v in op.token_inputs.items()} if op.token_inputs else _NONE
        m.content = None if op.content is None else op.content[rows]
    return members


def _fan_size(node: str, spec: ContextOpSpec, inputs: Mapping[str, Any], computes: bool) -> int:
    """K from the fan slot: >= 1 for an append or query, >= 0 otherwise (a fork of no members does nothing)."""
    value = inputs.get(spec.fan)
    if value is None:
        raise ValueError(f"node {node!r} fans {spec.context!r} out by input {spec.fan!r}, which it did not get")
    flat = torch.as_tensor(value).reshape(-1)
    least = 1 if computes else 0
    if flat.numel() != 1 or flat.is_floating_point() or int(flat[0]) < least:
        raise ValueError(f"input {spec.fan!r} of node {node!r} must be one integer >= {least} (the member count)")
    return int(flat[0])


def _bind_one(node: str, spec: ContextOpSpec, inputs: Mapping[str, Any]) -> ContextOp:
    op = ContextOp(spec.op, spec.context, spec.read_contexts if spec.op == "query" else (), spec.source,
                   mask=spec.mask, frame=spec.frame, rows=spec.rows, capture=spec.capture or _NONE, lazy=spec.lazy)
    if spec.op == "truncate":
        op.length = _length(node, spec, inputs)
    if spec.computes:
        _bind_chunk(node, spec, inputs, op)
    return op


def _length(node: str, spec: ContextOpSpec, inputs: Mapping[str, Any]) -> int:
    value = spec.length
    if isinstance(value, str):
        if value not in inputs:
            raise ValueError(f"node {node!r} truncates to input {value!r}, which it did not get")
        value = int(torch.as_tensor(inputs[value]).reshape(-1)[0])
    if value < 0:
        raise ValueError(f"node {node!r}: truncate length {value} is negative")
    return int(value)


def _bind_chunk(node: str, spec: ContextOpSpec, inputs: Mapping[str, Any], op: ContextOp) -> None:
    op.token_ids = _ints(node, spec.tokens, inputs.get(spec.tokens), 1)
    op.embeds = inputs.get(spec.embeds)
    if op.embeds is not None and (not isinstance(op.embeds, torch.Tensor) or op.embeds.dim() != 2):
        raise ValueError(f"input {spec.embeds!r} of node {node!r} must be a float tensor [N, D]")
    op.embed_rows = _ints(node, spec.embed_rows, inputs.get(spec.embed_rows), 1) if op.embeds is not None else None
    t = _num_tokens(node, spec, op)
    op.num_tokens = t
    if op.embed_rows is not None:
        rows = op.embed_rows
        if rows.numel() != op.embeds.shape[0] or (rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= t)):
            raise ValueError(f"input {spec.embed_rows!r} of node {node!r} must hold {op.embeds.shape[0]} rows in [0, {t})")
    op.positions = _positions(node, spec.positions, inputs.get(spec.positions))
    if op.positions is not None and (op.positions.dim() not in (1, 2) or op.positions.shape[-1] != t):
        raise ValueError(f"input {spec.positions!r} of node {node!r} must be [{t}] or [A, {t}], got {list(op.positions.shape)}")
    if spec.mask == "block_causal" and t % spec.frame:
        raise ValueError(f"node {node!r}: {t} tokens are not whole frames of {spec.frame}")
    op.targets = _ints(node, spec.targets, inputs.get(spec.targets), 1)
    if op.targets is not None and op.targets.numel() != t:
        raise ValueError(f"input {spec.targets!r} of node {node!r} must hold {t} ids")
    if spec.rows.kind == "where":
        mask = inputs.get(spec.rows.slot)
        if mask is None or torch.as_tensor(mask).reshape(-1).numel() != t:
            raise ValueError(f"node {node!r} selects rows by input {spec.rows.slot!r}: a bool [{t}] is needed")
        op.row_mask = torch.as_tensor(mask).reshape(-1).to(torch.bool)
    if spec.content:
        _bind_content(node, spec, inputs, op)
    if spec.token_inputs:
        op.token_inputs = {}
    for name in spec.token_inputs:
        value = inputs.get(name)
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != t:
            raise ValueError(f"token input {name!r} of node {node!r} must be a tensor whose first dim is {t}")
        op.token_inputs[name] = value


MEDIA_KEY_INTS = 2  # an embedded row's content: 128 bits, so that no client can build two inputs with one key


def _bind_content(node: str, spec: ContextOpSpec, inputs: Mapping[str, Any], op: ContextOp) -> None:
    """Content keys: one per row ([T], or [T, K]: K ints a row), nonzero on every row an embedding replaces (else
    its key would be its placeholder token alone) and at least 128 bits wide there (``MEDIA_KEY_INTS``)."""
    op.content = _ints(node, spec.content, inputs.get(spec.content), None)
    if op.content is None:
        return
    if op.content.dim() not in (1, 2) or op.content.shape[0] != op.num_tokens or not op.content[0].numel():
        raise ValueError(f"input {spec.content!r} of node {node!r} must hold {op.num_tokens} content keys "
                         f"([{op.num_tokens}] or [{op.num_tokens}, K]), got {list(op.content.shape)}")
    if op.embeds is not None:
        if op.content.dim() != 2 or op.content.shape[1] < MEDIA_KEY_INTS:
            raise ValueError(f"input {spec.content!r} of node {node!r} must be [{op.num_tokens}, {MEDIA_KEY_INTS}] "
                             f"or wider: an embedded row's key is a 128-bit digest")
        keys = op.content if op.embed_rows is None else op.content[op.embed_rows]
        if bool((keys.reshape(keys.shape[0], -1) == 0).all(1).any()):
            raise ValueError(f"input {spec.content!r} of node {node!r} must be nonzero on every embedded row")


def _num_tokens(node: str, spec: ContextOpSpec, op: ContextOp) -> int:
    if op.token_ids is not None:
        t = op.token_ids.numel()
        if op.embeds is not None and op.embed_rows is None and op.embeds.shape[0] != t:
            raise ValueError(f"input {spec.embeds!r} of node {node!r} has {op.embeds.shape[0]} rows for {t} tokens "
                             f"(give {spec.embed_rows!r} to replace only some)")
    elif op.embeds is not None and op.embed_rows is None:
        t = op.embeds.shape[0]
    else:
        raise ValueError(f"node {node!r} fired without input {spec.tokens!r} (or {spec.embeds!r} for every row)")
    if t == 0:
        raise ValueError(f"node {node!r} fired with an empty chunk")
    return t


def _positions(node: str, slot: str, value: Any) -> torch.Tensor | None:
    """int64 positions, or float ones as given (Qwen3-Omni's fractional video times)."""
    if value is not None and torch.as_tensor(value).is_floating_point():
        return torch.as_tensor(value)
    return _ints(node, slot, value, None)


def _ints(node: str, slot: str, value: Any, dims: int | None) -> torch.Tensor | None:
    if value is None:
        return None
    if type(value) is torch.Tensor and value.dtype == torch.long and (dims is None or value.dim() == dims):
        return value  # the common case (a decode step's token): nothing to convert
    t = torch.as_tensor(value)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"input {slot!r} of node {node!r} must be integer ids, got {t.dtype}")
    t = t.to(torch.long)
    return t.reshape(-1) if dims == 1 else t
