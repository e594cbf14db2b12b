"""Request checks for the V-JEPA 2 tasks, torch-free (the API's processor calls them before anything runs).

Each raises ``InvalidRequest(message, param=field)``, which the HTTP layer
turns into a 400 naming the field. Arrays are described by ``(dtype, shape)``
(``array_spec`` reads that from an ``ArrayData``, a ``{"dtype", "shape"}``
mapping or nested lists), so the checks never touch the data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from walkserve.core.errors import InvalidRequest
from walkserve.models.vjepa2.config import ACTION_DIM

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
IMAGE_DTYPES = ("uint8",)
INT_DTYPES = ("int64", "int32")
MAX_STEPS = 32  # the released AC predictor's mask is prebuilt for 32 steps
# CEM candidates per iteration: ten times the released planner's 400, a power of two. A plan holds K predicted
# frames (K x 256 x 1408 float32: 5.9 GB at 4096) and K x H predictor steps of KV; a larger K failed its
# allocation inside the runtime (a 500) or thrashed the pool.
MAX_SAMPLES = 4096


def array_spec(value: Any, field: str) -> tuple[str, tuple[int, ...]]:
    """(dtype, shape) of an ArrayData-like object, a ``{"dtype", "shape"}`` mapping, or nested lists of numbers."""
    if isinstance(value, Mapping):
        if "dtype" not in value or "shape" not in value:
            raise InvalidRequest(f"{field} must be an array with 'dtype' and 'shape'", param=field)
        dtype, shape = value["dtype"], value["shape"]
    elif hasattr(value, "dtype") and hasattr(value, "shape"):
        dtype, shape = value.dtype, value.shape
    elif isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return "float64", _list_shape(value, field)
    else:
        raise InvalidRequest(f"{field} must be an array, got {type(value).__name__}", param=field)
    try:
        return str(dtype).removeprefix("torch."), tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        raise InvalidRequest(f"{field}: shape must be a list of integers, got {shape!r}", param=field) from None


def _list_shape(value: Sequence, field: str) -> tuple[int, ...]:
    if not value or not isinstance(value[0], Sequence):
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
            raise InvalidRequest(f"{field} must hold numbers", param=field)
        return (len(value),)
    inner = [_list_shape(v, field) if isinstance(v, Sequence) else None for v in value]
    if any(s != inner[0] for s in inner):
        raise InvalidRequest(f"{field} is ragged: its rows differ in shape", param=field)
    return (len(value), *inner[0])


def check_vectors(field: str, dtype: str, shape: Sequence[int], rows: int | None = None,
                  dim: int = ACTION_DIM) -> int:
    """A float array [T, dim] (actions or states), with exactly ``rows`` rows when given. Returns T."""
    if dtype not in FLOAT_DTYPES:
        raise InvalidRequest(f"{field} must be a float array ({', '.join(FLOAT_DTYPES)}), got {dtype}", param=field)
    if len(shape) != 2 or shape[1] != dim or shape[0] < 1:
        raise InvalidRequest(f"{field} must have shape [T, {dim}] with T >= 1, got {list(shape)}", param=field)
    if rows is not None and shape[0] != rows:
        raise InvalidRequest(f"{field} must have {rows} rows, got {shape[0]}", param=field)
    return int(shape[0])


def check_horizon(horizon: Any, context_frames: int = 1, max_steps: int = MAX_STEPS,
                  field: str = "horizon") -> int:
    """1 <= horizon and context_frames + horizon - 1 <= max_steps (the steps the predictor reads)."""
    if not isinstance(horizon, int) or isinstance(horizon, bool) or horizon < 1:
        raise InvalidRequest(f"{field} must be a positive integer, got {horizon!r}", param=field)
    if context_frames + horizon - 1 > max_steps:
        raise InvalidRequest(
            f"{field} {horizon} with {context_frames} context frame(s) needs {context_frames + horizon - 1} "
            f"predictor steps; the model's mask is built for {max_steps}", param=field)
    return horizon


def check_frame_count(frames: int, tubelet: int = 2, field: str = "frames", allow_image: bool = True) -> int:
    """A video's frame count must be a multiple of the tubelet (a single image is repeated when allowed)."""
    if frames < 1 or (frames % tubelet and not (allow_image and frames == 1)):
        raise InvalidRequest(f"{field}: {frames} frames is not a multiple of the tubelet size {tubelet}"
                             + (" (or a single image)" if allow_image else ""), param=field)
    return frames


def check_square(height: int, width: int, field: str = "frames", crop: int | None = None) -> None:
    """Square frames (of exactly ``crop`` pixels when given), for the tasks whose positions assume the crop grid."""
    if height != width or (crop is not None and height != crop):
        want = f"{crop}x{crop}" if crop is not None else "square"
        raise InvalidRequest(f"{field} must be {want} here, got {height}x{width}", param=field)


def check_frames(field: str, dtype: str, shape: Sequence[int], tubelet: int = 2,
                 allow_image: bool = True) -> tuple[int, int, int]:
    """Frames as uint8 [T, H, W, 3] (or float 0…255); returns (T, H, W)."""
    if dtype not in IMAGE_DTYPES + FLOAT_DTYPES:
        raise InvalidRequest(f"{field} must be uint8 or float pixels, got {dtype}", param=field)
    if len(shape) != 4 or shape[3] != 3 or min(shape) < 1:
        raise InvalidRequest(f"{field} must have shape [T, H, W, 3], got {list(shape)}", param=field)
    check_frame_count(shape[0], tubelet, field, allow_image)
    return int(shape[0]), int(shape[1]), int(shape[2])


def check_rollout(context_frames: int, horizon: Any, actions: tuple[str, Sequence[int]],
                  states: tuple[str, Sequence[int]], max_steps: int = MAX_STEPS) -> None:
    """A rollout: C context frames need C + H - 1 actions and C states (or all C + H - 1 of them)."""
    h = check_horizon(horizon, context_frames, max_steps)
    need = context_frames + h - 1
    check_vectors("actions", *actions, rows=need)
    n_states = check_vectors("states", *states)
    if n_states not in (context_frames, need):
        raise InvalidRequest(f"states must have {context_frames} rows (the context frames') or {need} "
                             f"(every step's), got {n_states}", param="states")


def check_plan(samples: Any, topk: Any, iterations: Any, horizon: Any, context_frames: int = 1,
               max_steps: int = MAX_STEPS) -> None:
    """CEM parameters: positive counts, samples <= MAX_SAMPLES, 2 <= topk <= samples, the horizon within the mask."""
    for field, value in (("samples", samples), ("iterations", iterations), ("topk", topk)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidRequest(f"{field} must be a positive integer, got {value!r}", param=field)
    if samples > MAX_SAMPLES:
        raise InvalidRequest(f"samples must be at most {MAX_SAMPLES}, got {samples}", param="samples")
    if not 2 <= topk <= samples:
        raise InvalidRequest(f"topk must be in [2, samples={samples}], got {topk}", param="topk")
    check_horizon(horizon, context_frames, max_steps)


def check_token_ids(field: str, dtype: str, values: Sequence[int], shape: Sequence[int], tokens: int) -> list[int]:
    """Token indices for the masked predictor: a non-empty 1-D integer array of distinct raster indices in
    [0, tokens) (tokens = (frames / tubelet) x grid², the encoder's output at crop_size²). Returns them."""
    if dtype not in INT_DTYPES:
        raise InvalidRequest(f"{field} must be integer token indices ({', '.join(INT_DTYPES)}), got {dtype}",
                             param=field)
    if len(shape) != 1 or shape[0] < 1:
        raise InvalidRequest(f"{field} must be a non-empty list of token indices [N], got shape {list(shape)}",
                             param=field)
    bad = [i for i in values if not 0 <= i < tokens]
    if bad:
        raise InvalidRequest(f"{field}: index {bad[0]} is outside [0, {tokens}) (the clip has {tokens} tokens)",
                             param=field)
    if len(set(values)) != len(values):
        raise InvalidRequest(f"{field} repeats a token index", param=field)
    return list(values)
