"""Request checks for the V-JEPA 2 tasks: each refusal names its field; the module is torch-free."""

from __future__ import annotations

import subprocess
import sys

import pytest

from walkserve.core.array import ArrayData
from walkserve.core.errors import InvalidRequest
from walkserve.models.vjepa2.validate import (
    MAX_SAMPLES,
    array_spec,
    check_frame_count,
    check_frames,
    check_horizon,
    check_plan,
    check_rollout,
    check_square,
    check_vectors,
)


def _refused(want: str, check, *args, **kwargs) -> str:
    with pytest.raises(InvalidRequest) as e:
        check(*args, **kwargs)
    assert e.value.param == want and want in str(e.value)
    return str(e.value)


def test_array_specs():
    assert array_spec(ArrayData("float32", (2, 7), bytes(56)), "actions") == ("float32", (2, 7))
    assert array_spec({"dtype": "float16", "shape": [3, 7], "data": ""}, "states") == ("float16", (3, 7))
    assert array_spec([[0.0] * 7, [1] * 7], "actions") == ("float64", (2, 7))
    _refused("actions", array_spec, [[0.0] * 7, [1.0] * 6], "actions")
    _refused("actions", array_spec, {"shape": [1, 7]}, "actions")
    _refused("goal", array_spec, "abc", "goal")


def test_vectors_horizon_frames_square():
    assert check_vectors("actions", "float32", (4, 7), rows=4) == 4
    assert "[T, 7]" in _refused("actions", check_vectors, "actions", "float32", (4, 6))
    assert "float" in _refused("states", check_vectors, "states", "int64", (1, 7))
    _refused("actions", check_vectors, "actions", "float32", (3, 7), rows=4)
    assert check_horizon(32) == 32 and check_horizon(30, context_frames=3) == 30
    assert "32" in _refused("horizon", check_horizon, 31, context_frames=3)
    _refused("horizon", check_horizon, 0)
    _refused("horizon", check_horizon, True)
    assert check_frame_count(1) == 1 and check_frame_count(8) == 8
    assert "tubelet" in _refused("inputs.frames", check_frame_count, 3, field="inputs.frames")
    _refused("frames", check_frame_count, 1, allow_image=False)
    check_square(256, 256, crop=256)
    _refused("goal", check_square, 256, 320, field="goal")
    _refused("frames", check_square, 384, 384, crop=256)
    assert check_frames("frames", "uint8", (2, 64, 80, 3)) == (2, 64, 80)
    _refused("frames", check_frames, "frames", "uint8", (2, 64, 80))
    _refused("frames", check_frames, "frames", "int32", (2, 64, 80, 3))


def test_rollout_and_plan_parameters():
    check_rollout(1, 4, ("float32", (4, 7)), ("float32", (1, 7)))
    check_rollout(2, 4, ("float32", (5, 7)), ("float64", (5, 7)))  # every step's states given
    assert "5 rows" in _refused("actions", check_rollout, 2, 4, ("float32", (4, 7)), ("float32", (2, 7)))
    _refused("states", check_rollout, 2, 4, ("float32", (5, 7)), ("float32", (3, 7)))
    _refused("horizon", check_rollout, 1, 33, ("float32", (32, 7)), ("float32", (1, 7)))
    check_plan(400, 10, 10, 2)
    _refused("topk", check_plan, 400, 1, 10, 2)
    _refused("topk", check_plan, 8, 10, 10, 2)
    _refused("samples", check_plan, 0, 10, 10, 2)
    check_plan(MAX_SAMPLES, 10, 10, 2)
    assert str(MAX_SAMPLES) in _refused("samples", check_plan, 10**9, 10, 10, 2)  # not a 500 from its allocation
    _refused("iterations", check_plan, 10, 2, 1.5, 2)
    _refused("horizon", check_plan, 10, 2, 2, 40)


def test_validate_imports_no_torch():
    code = "import sys, walkserve.models.vjepa2.validate; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
