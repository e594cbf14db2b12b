"""Request inputs: every bad input is refused naming its field; openpi's DROID and LIBERO observations map
onto the checkpoint's cameras and state; images are resized with padding like lerobot's."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from walkserve.core.array import ArrayData
from walkserve.core.errors import InvalidRequest
from walkserve.models.pi0.images import camera_pixels, resize_with_pad
from walkserve.models.pi0.inputs import InputSpec, validate_inputs
from walkserve.models.pi0.observations import map_observation, observation_layout
from walkserve.models.pi0.request import prepare_request

CAMERAS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
SPEC = InputSpec(CAMERAS, ("base_0_rgb",), 8, (10, 32), max_pixels=64 * 64)


def _image(h=28, w=28, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def _good(**changes):
    raw = {"base_0_rgb": _image(), "left_wrist_0_rgb": _image(seed=1), "state": np.zeros(8), "prompt": "go"}
    raw.update(changes)
    return {k: v for k, v in raw.items() if v is not None}


def _png(image) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def test_valid_inputs_in_every_image_form():
    img = _image(20, 30)
    chw = img.transpose(2, 0, 1).copy()
    forms = [img, chw, img.astype(np.float32) / 255.0, _png(img),
             ArrayData("uint8", img.shape, img.tobytes()), img.tolist()]
    for form in forms:
        got = validate_inputs(SPEC, _good(base_0_rgb=form, noise=np.zeros((10, 32))))
        base = got.images["base_0_rgb"]
        assert base.shape == (20, 30, 3)
        np.testing.assert_allclose(base.astype(np.float32) / (1 if base.dtype == np.float32 else 255), img / 255.0,
                                   atol=1e-6)
        assert set(got.images) == {"base_0_rgb", "left_wrist_0_rgb"} and got.state.dtype == np.float32


@pytest.mark.parametrize("changes, param, code", [
    ({"base_0_rgb": None}, "inputs.base_0_rgb", "missing_input"),
    ({"state": None}, "inputs.state", "missing_input"),
    ({"state": np.zeros(7)}, "inputs.state", "invalid_shape"),
    ({"state": np.zeros((8, 1))}, "inputs.state", "invalid_shape"),
    ({"state": [0.0] * 7 + [float("nan")]}, "inputs.state", "invalid_input"),
    ({"state": "zeros"}, "inputs.state", "invalid_input"),
    ({"prompt": None}, "inputs.prompt", "missing_input"),
    ({"prompt": "  "}, "inputs.prompt", "invalid_input"),
    ({"noise": np.zeros((10, 8))}, "inputs.noise", "invalid_shape"),
    ({"left_wrist_0_rgb": np.zeros((28, 28), dtype=np.uint8)}, "inputs.left_wrist_0_rgb", "invalid_image"),
    ({"left_wrist_0_rgb": np.full((28, 28, 3), 256)}, "inputs.left_wrist_0_rgb", "invalid_image"),
    ({"left_wrist_0_rgb": np.zeros((28, 28, 3), dtype=bool)}, "inputs.left_wrist_0_rgb", "invalid_image"),
    ({"left_wrist_0_rgb": np.full((28, 28, 3), 2.0)}, "inputs.left_wrist_0_rgb", "invalid_image"),
    ({"left_wrist_0_rgb": _image(65, 64)}, "inputs.left_wrist_0_rgb", "image_too_large"),
    ({"left_wrist_0_rgb": _png(_image(70, 70))}, "inputs.left_wrist_0_rgb", "image_too_large"),
    ({"left_wrist_0_rgb": b"not an image"}, "inputs.left_wrist_0_rgb", "invalid_image"),
    ({"top_camera": _image()}, "inputs.top_camera", None),
])
def test_bad_inputs_name_the_field(changes, param, code):
    with pytest.raises(InvalidRequest) as e:
        validate_inputs(SPEC, _good(**changes))
    assert e.value.param == param
    if code:
        assert e.value.code == code


def test_a_png_past_pillows_bomb_threshold_is_too_large_not_undecodable():
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("1", (12000, 9000)).save(buffer, format="PNG")  # 108 M pixels (Pillow refuses 89 M), a small file
    with pytest.raises(InvalidRequest) as e:
        validate_inputs(SPEC, _good(left_wrist_0_rgb=buffer.getvalue()))
    assert (e.value.param, e.value.code) == ("inputs.left_wrist_0_rgb", "image_too_large")


def test_an_encoded_camera_image_is_read_upright_by_its_exif_orientation():
    """The API's image decoder (``models.common.images``): a camera frame stored sideways with EXIF orientation 6 reaches
    the policy as viewers show it."""
    from PIL import Image

    pixels = _image(4, 6)
    exif = Image.Exif()
    exif[0x0112] = 6  # turn 90 degrees clockwise to view
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", exif=exif)
    inputs = validate_inputs(SPEC, _good(left_wrist_0_rgb=buffer.getvalue()))
    assert np.array_equal(inputs.images["left_wrist_0_rgb"], np.rot90(pixels, k=-1))
    plain = validate_inputs(SPEC, _good(left_wrist_0_rgb=_png(pixels)))
    assert np.array_equal(plain.images["left_wrist_0_rgb"], pixels)


def test_prompt_over_the_token_limit_names_the_prompt(tiny_pi05):
    spec = InputSpec.from_config(tiny_pi05.policy.config)
    inputs = validate_inputs(spec, _good(prompt="pick up the red cube and put it in the bowl " * 4))
    with pytest.raises(InvalidRequest) as e:
        prepare_request(tiny_pi05.files, inputs)
    assert e.value.param == "prompt"


def droid_example(rng):
    """openpi's make_droid_example (examples/droid/main.py sends these keys)."""
    return {"observation/exterior_image_1_left": rng.integers(256, size=(224, 224, 3), dtype=np.uint8),
            "observation/wrist_image_left": rng.integers(256, size=(224, 224, 3), dtype=np.uint8),
            "observation/joint_position": rng.random(7), "observation/gripper_position": rng.random(1),
            "prompt": "do something"}


def libero_example(rng):
    """openpi's make_libero_example (examples/libero/main.py sends these keys)."""
    return {"observation/state": rng.random(8), "observation/image": rng.integers(256, size=(224, 224, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(256, size=(224, 224, 3), dtype=np.uint8), "prompt": "do something"}


def test_droid_and_libero_observations_map_to_inputs():
    rng = np.random.default_rng(0)
    spec = InputSpec(CAMERAS, ("base_0_rgb",), 8, (15, 32), max_pixels=224 * 224)
    droid = droid_example(rng)
    assert observation_layout(droid) == "droid"
    got = validate_inputs(spec, map_observation(droid, CAMERAS))
    np.testing.assert_array_equal(got.images["base_0_rgb"], droid["observation/exterior_image_1_left"])
    np.testing.assert_array_equal(got.images["left_wrist_0_rgb"], droid["observation/wrist_image_left"])
    assert "right_wrist_0_rgb" not in got.images  # masked, as openpi's DroidInputs does
    np.testing.assert_allclose(got.state, np.concatenate([droid["observation/joint_position"],
                                                          droid["observation/gripper_position"]]), rtol=1e-6)
    scalar_gripper = {**droid, "observation/gripper_position": 0.5}
    assert validate_inputs(spec, map_observation(scalar_gripper, CAMERAS)).state[-1] == 0.5
    libero = libero_example(rng)
    assert observation_layout(libero) == "libero"
    got = validate_inputs(spec, map_observation(libero, CAMERAS))
    np.testing.assert_array_equal(got.images["left_wrist_0_rgb"], libero["observation/wrist_image"])
    np.testing.assert_allclose(got.state, libero["observation/state"], rtol=1e-6)
    assert got.prompt == "do something"


def test_droid_observation_without_joints_names_the_key():
    obs = droid_example(np.random.default_rng(1))
    del obs["observation/joint_position"]
    with pytest.raises(InvalidRequest) as e:
        map_observation(obs, CAMERAS)
    assert e.value.param == "observation/joint_position"


def test_resize_with_pad_keeps_aspect_and_centres():
    image = torch.rand(3, 10, 20)
    out = resize_with_pad(image, 28)  # 20 wide -> 28 x 14, 7 black rows above and below
    assert out.shape == (3, 28, 28)
    assert out[:, :7].abs().max() == 0 and out[:, 21:].abs().max() == 0 and out[:, 7:21].abs().min() > 0
    pixels = camera_pixels(np.zeros((28, 28, 3), dtype=np.uint8), 28)
    assert pixels.shape == (3, 28, 28) and float(pixels.max()) == -1.0
