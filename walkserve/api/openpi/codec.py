"""openpi's msgpack-numpy frames, read and written with msgspec (no pickle, no ``msgpack`` package).

openpi's client (``openpi_client.msgpack_numpy``) packs every numpy value as a map with bytes keys:

    ndarray   {b"__ndarray__": True, b"data": <raw bytes>, b"dtype": "<f4", b"shape": [H, W, 3]}
    scalar    {b"__npgeneric__": True, b"data": <the value>, b"dtype": "<f4"}

and everything else (str, int, float, lists, nested dicts) as plain msgpack.
Decoding is strict where openpi's is not: only numeric, bool and fixed-width
string dtypes are read (an object or void dtype would make numpy interpret
the bytes as something else), the byte count must match the shape, and the
nesting is bounded. A bad frame raises ``FrameError`` naming where it is.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np

NDARRAY, NPGENERIC = b"__ndarray__", b"__npgeneric__"
DATA, DTYPE, SHAPE = b"data", b"dtype", b"shape"
KINDS = "biufU"  # bool, ints, floats, fixed-width unicode
MAX_DEPTH = 8
MAX_DIMS = 8


class FrameError(ValueError):
    """A frame that is not openpi's msgpack-numpy; ``where`` names the key ("" for the frame itself)."""

    def __init__(self, message: str, where: str = ""):
        super().__init__(message)
        self.where = where


def decode(frame: bytes) -> Any:
    """A binary frame -> Python values with numpy arrays (read-only views of the frame's bytes)."""
    try:
        value = msgspec.msgpack.decode(frame)
    except msgspec.DecodeError as e:
        raise FrameError(f"not a msgpack frame ({e})") from None
    return _unpack(value, "", 0)


def encode(value: Any) -> bytes:
    """Python values with numpy arrays and scalars -> one frame openpi's ``unpackb`` reads."""
    return msgspec.msgpack.encode(value, enc_hook=_pack)


def _pack(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in KINDS:
            raise TypeError(f"arrays of dtype {obj.dtype} are not sent")
        array = np.ascontiguousarray(obj)
        return {NDARRAY: True, DATA: array.tobytes(), DTYPE: array.dtype.str, SHAPE: list(array.shape)}
    if isinstance(obj, np.generic):
        return {NPGENERIC: True, DATA: obj.item(), DTYPE: obj.dtype.str}
    raise TypeError(f"cannot send a {type(obj).__name__}")


def _unpack(value: Any, where: str, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise FrameError(f"nested deeper than {MAX_DEPTH} levels", where)
    if isinstance(value, dict):
        if NDARRAY in value:
            return _array(value, where)
        if NPGENERIC in value:
            return _scalar(value, where)
        out = {}
        for key, item in value.items():
            name = key.decode("utf-8", errors="replace") if isinstance(key, bytes) else str(key)
            out[name] = _unpack(item, f"{where}.{name}" if where else name, depth + 1)
        return out
    if isinstance(value, list):
        return [_unpack(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
    return value


def _dtype(value: dict, where: str) -> np.dtype:
    name = value.get(DTYPE)
    try:
        dtype = np.dtype(name.decode() if isinstance(name, bytes) else name) if isinstance(name, (str, bytes)) else None
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise FrameError(f"dtype {name!r} is not one this server reads (bool, integers, floats, strings)", where)
    return dtype


def _array(value: dict, where: str) -> np.ndarray:
    dtype = _dtype(value, where)
    shape, data = value.get(SHAPE), value.get(DATA)
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or \
            not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise FrameError(f"an array's shape must be a list of at most {MAX_DIMS} sizes >= 0", where)
    if not isinstance(data, bytes) or len(data) != math.prod(shape) * dtype.itemsize:
        size = len(data) if isinstance(data, bytes) else "no"
        raise FrameError(f"an array {dtype.str}{shape} needs {math.prod(shape) * dtype.itemsize} bytes, got {size}", where)
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _scalar(value: dict, where: str) -> np.generic:
    dtype = _dtype(value, where)
    data = value.get(DATA)
    if isinstance(data, (dict, list, bytes)) or data is None:
        raise FrameError(f"a {dtype.str} scalar must hold a number or a string", where)
    try:
        return dtype.type(data)
    except (TypeError, ValueError, OverflowError):
        raise FrameError(f"{data!r} is not a {dtype.str} value", where) from None
