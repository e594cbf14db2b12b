"""A SentencePiece ``.model`` file: its pieces and the settings encoding needs (torch-free, no protobuf).

The file is a serialized ``ModelProto`` (sentencepiece_model.proto). Only
the fields an encoder reads are decoded; everything else is skipped:

    ModelProto      1 pieces (repeated SentencePiece)   2 trainer_spec   3 normalizer_spec
    SentencePiece   1 piece (string)   2 score (float)   3 type (NORMAL 1, UNKNOWN 2, CONTROL 3,
                                                              USER_DEFINED 4, UNUSED 5, BYTE 6)
    TrainerSpec     3 model_type (UNIGRAM 1, BPE 2)   24 treat_whitespace_as_suffix   35 byte_fallback
                    40 unk_id   41 bos_id   42 eos_id   43 pad_id
    NormalizerSpec  1 name   2 precompiled_charsmap   3 add_dummy_prefix   4 remove_extra_whitespaces
                    5 escape_whitespaces

``write_model`` serializes the same subset, for tiny test tokenizers that the
sentencepiece library itself can load.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from walkserve.core.errors import ConfigError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNIGRAM, BPE = 1, 2


@dataclass(frozen=True)
class SpmModel:
    """The pieces (text, score, type) in id order and the encoder settings of one model."""

    pieces: tuple[tuple[str, float, int], ...]
    model_type: int = BPE
    byte_fallback: bool = False
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = -1
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True
    treat_whitespace_as_suffix: bool = False
    normalizer_name: str = ""
    has_charsmap: bool = False

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)


def read_model(path: str | Path) -> SpmModel:
    """Parse a SentencePiece model file; ConfigError if it is not one."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the SentencePiece model ({e})") from None
    try:
        return parse_model(data)
    except (ValueError, IndexError, struct.error, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a SentencePiece model file ({e})") from None


def parse_model(data: bytes) -> SpmModel:
    pieces: list[tuple[str, float, int]] = []
    trainer: dict[int, object] = {}
    normalizer: dict[int, object] = {}
    for field, value in _fields(data):
        if field == 1:
            p = dict(_fields(value))
            score = struct.unpack("<f", p.get(2, b"\0\0\0\0"))[0]
            pieces.append((p.get(1, b"").decode("utf-8"), score, int(p.get(3, NORMAL))))
        elif field == 2:
            trainer = dict(_fields(value))
        elif field == 3:
            normalizer = dict(_fields(value))
    if not pieces:
        raise ValueError("no pieces")
    return SpmModel(
        pieces=tuple(pieces),
        model_type=int(trainer.get(3, UNIGRAM)),
        byte_fallback=bool(trainer.get(35, 0)),
        unk_id=_int32(trainer.get(40, 0)),
        bos_id=_int32(trainer.get(41, 1)),
        eos_id=_int32(trainer.get(42, 2)),
        pad_id=_int32(trainer.get(43, -1)),
        treat_whitespace_as_suffix=bool(trainer.get(24, 0)),
        add_dummy_prefix=bool(normalizer.get(3, 1)),
        remove_extra_whitespaces=bool(normalizer.get(4, 1)),
        escape_whitespaces=bool(normalizer.get(5, 1)),
        normalizer_name=bytes(normalizer.get(1, b"")).decode("utf-8"),
        has_charsmap=bool(normalizer.get(2, b"")),
    )


def write_model(model: SpmModel, path: str | Path) -> Path:
    """Serialize ``model`` (the fields listed in the module docstring) to ``path``."""
    out = bytearray()
    for piece, score, kind in model.pieces:
        body = _string(1, piece.encode("utf-8")) + _tag(2, 5) + struct.pack("<f", score) + _varint_field(3, kind)
        out += _string(1, body)
    trainer = (
        _varint_field(3, model.model_type) + _varint_field(4, model.vocab_size)
        + _varint_field(24, int(model.treat_whitespace_as_suffix)) + _varint_field(35, int(model.byte_fallback))
        + _varint_field(40, model.unk_id) + _varint_field(41, model.bos_id) + _varint_field(42, model.eos_id)
        + _varint_field(43, model.pad_id)
    )
    normalizer = (
        _string(1, (model.normalizer_name or "identity").encode()) + _varint_field(3, int(model.add_dummy_prefix))
        + _varint_field(4, int(model.remove_extra_whitespaces)) + _varint_field(5, int(model.escape_whitespaces))
    )
    out += _string(2, trainer) + _string(3, normalizer)
    path = Path(path)
    path.write_bytes(bytes(out))
    return path


# --- protobuf wire format ---------------------------------------------------------------------


def _fields(data: bytes):
    """Yield (field number, value): varints as int, length-delimited as bytes, fixed32/64 as bytes."""
    i, n = 0, len(data)
    while i < n:
        key, i = _varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            size, i = _varint(data, i)
            if i + size > n:
                raise ValueError("truncated field")
            value, i = data[i : i + size], i + size
        elif wire == 5:
            value, i = data[i : i + 4], i + 4
        elif wire == 1:
            value, i = data[i : i + 8], i + 8
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield field, value


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _int32(value) -> int:
    """A varint-encoded int32 (negative values are written as 64-bit two's complement)."""
    value = int(value)
    return value - (1 << 64) if value >= 1 << 63 else value


def _encode_varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _encode_varint(field << 3 | wire)


def _varint_field(field: int, value: int) -> bytes:
    return _tag(field, 0) + _encode_varint(value)


def _string(field: int, value: bytes) -> bytes:
    return _tag(field, 2) + _encode_varint(len(value)) + value
