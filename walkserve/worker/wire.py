"""A worker's messages on the wire: tensor values packed for their destination, unpacked on arrival.

The executor builds messages with raw values; the heartbeat packs them:
a step's values of one node output become the rows of one stacked tensor
when they share dtype and shape (one shared-memory segment, or one inline
buffer, for the whole step), else one TensorMsg each. Values for the
conductor and for TCP ranks always travel inline.
"""

from __future__ import annotations

from typing import Any

import torch

from walkserve.protocol import messages as m
from walkserve.transport.tensors import TensorCodec, stack_rows, unpack

_ROWS = (m.ClientOuts, m.Values, m.StreamItems)


def pack(msg: Any, codec: TensorCodec, inline: bool) -> Any:
    """``msg`` (built by the executor, raw values) ready to encode."""
    if isinstance(msg, _ROWS):
        values = msg.values
        stack = stack_rows(values) if values else None
        if stack is not None:
            msg.stacked, msg.values = codec.pack(stack, allow_shm=not inline), []
        else:
            msg.values = [_wire(v, codec, inline) for v in values]
    elif isinstance(msg, m.WalkOut):
        msg.value = _wire(msg.value, codec, True)
    elif isinstance(msg, m.Contexts):
        for st in msg.contexts:
            _map_state(st, lambda v: _wire(v, codec, inline))
    return msg


def unpack_message(msg: Any) -> Any:
    """A received message with its tensors as torch tensors (rows of a stacked tensor as views)."""
    if isinstance(msg, (m.Values, m.StreamItems)):
        if msg.stacked is not None:
            msg.values, msg.stacked = list(unpack(msg.stacked).unbind(0)), None
        else:
            msg.values = [_value(v) for v in msg.values]
    elif isinstance(msg, m.StartWalk):
        msg.inputs = {k: _value(v) for k, v in msg.inputs.items()}
    elif isinstance(msg, m.Contexts):
        for st in msg.contexts:
            _map_state(st, _value)
    return msg


def _map_state(st: m.ContextState, f: Any) -> None:
    """Apply ``f`` to every tensor field of a moving context (K/V, and its segments' positions and inputs)."""
    st.k, st.v = f(st.k), f(st.v)
    for g in st.segments:
        g.positions, g.embeds, g.embed_rows = f(g.positions), f(g.embeds), f(g.embed_rows)
        g.token_inputs = {k: f(v) for k, v in g.token_inputs.items()}


def _wire(value: Any, codec: TensorCodec, inline: bool) -> Any:
    if isinstance(value, torch.Tensor):
        return codec.pack(value, allow_shm=not inline)
    return value


def _value(value: Any) -> Any:
    return unpack(value) if isinstance(value, m.TensorMsg) else value
