"""ArrayData: a tensor as plain bytes, so torch-free layers can hold and forward one.

Workers turn it into a torch tensor without copying (``torch.frombuffer``);
the API layer reads it with numpy; the conductor only looks at small ones.
"""

from __future__ import annotations

import array
import math
from dataclasses import dataclass

# dtype name -> (array module typecode, item size)
_DTYPES: dict[str, tuple[str | None, int]] = {
    "bool": ("b", 1),
    "uint8": ("B", 1),
    "int8": ("b", 1),
    "int16": ("h", 2),
    "int32": ("i", 4),
    "int64": ("q", 8),
    "float16": (None, 2),
    "bfloat16": (None, 2),
    "float32": ("f", 4),
    "float64": ("d", 8),
}


def itemsize(dtype: str) -> int:
    try:
        return _DTYPES[dtype][1]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}; known: {', '.join(_DTYPES)}") from None


@dataclass(frozen=True, slots=True)
class ArrayData:
    """An n-dimensional array: dtype name, shape and C-contiguous bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes

    def __post_init__(self) -> None:
        want = math.prod(self.shape) * itemsize(self.dtype)
        if len(self.data) != want:
            raise ValueError(
                f"ArrayData {self.dtype}{list(self.shape)} needs {want} bytes, got {len(self.data)}"
            )

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return len(self.data)

    @classmethod
    def rows(cls, dtype: str, shape: tuple[int, ...], data: bytes) -> list[ArrayData]:
        """The rows (dim 0) of an array given as its bytes, each an ArrayData; checked once for all."""
        whole = cls(dtype, shape, data)
        n, row_shape = shape[0], tuple(shape[1:])
        step = len(whole.data) // n if n else 0
        new, put = object.__new__, object.__setattr__
        out = []
        for i in range(n):
            row = new(cls)  # each row is valid because the whole was: skip the per-row check
            put(row, "dtype", dtype)
            put(row, "shape", row_shape)
            put(row, "data", data[i * step : (i + 1) * step])
            out.append(row)
        return out

    @classmethod
    def from_list(cls, values: list[int] | list[float], dtype: str = "int64") -> ArrayData:
        code = _DTYPES[dtype][0]
        if code is None:
            raise ValueError(f"from_list does not build {dtype}; use numpy")
        return cls(dtype, (len(values),), array.array(code, values).tobytes())

    def tolist(self) -> list:
        """Flat list of the values (not for float16/bfloat16)."""
        code = _DTYPES[self.dtype][0]
        if code is None:
            raise ValueError(f"tolist does not read {self.dtype}; use numpy")
        out = array.array(code)
        out.frombytes(self.data)
        return out.tolist()

    def item(self):
        if self.numel != 1:
            raise ValueError(f"item() of an array with {self.numel} elements")
        return self.tolist()[0]

    def __repr__(self) -> str:
        return f"ArrayData({self.dtype}{list(self.shape)}, {self.nbytes} bytes)"
