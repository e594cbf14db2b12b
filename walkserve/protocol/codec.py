"""The one codec: msgpack via msgspec, schema-checked on decode, never pickle.

A request's typed params (``AnyParams``) decode through ``decode_params``: to the imported ``Params``
class whose tag they carry, checked against its schema like every other field.
"""

from __future__ import annotations

import msgspec

from walkserve.core.params import decode_params
from walkserve.protocol.messages import Batch, Message

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Batch, dec_hook=decode_params)


class BadMessage(Exception):
    """A frame that is not a valid Batch, or carries the wrong run token."""


def encode(token: str, messages: list[Message]) -> bytes:
    return _encoder.encode(Batch(token, messages))


def decode(frame: bytes, token: str) -> list[Message]:
    try:
        batch = _decoder.decode(frame)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise BadMessage(f"undecodable message: {e}") from None
    if batch.token != token:
        raise BadMessage("message with a wrong run token")
    return batch.messages
