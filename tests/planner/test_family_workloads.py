"""Every family plans without a workload file: its default mix builds through the checkpoint's own processor, and a
workload file may carry arrays and images in the HTTP routes' JSON forms."""

import base64
import io

import numpy as np
import pytest

from walkserve.core.array import ArrayData
from walkserve.core.errors import ConfigError
from walkserve.models.base import ModelRef
from walkserve.models.registry import load_model
from walkserve.planner.workload import default_workload, load_workload


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from walkserve.models.bagel.tiny import write_tiny_bagel
    from walkserve.models.pi0.tiny import write_tiny_policy
    from walkserve.models.vjepa2.tiny import write_tiny_vjepa2, write_tiny_vjepa2_ac

    root = tmp_path_factory.mktemp("family_workloads")
    return {
        "bagel": ("bagel", write_tiny_bagel(root / "bagel")),
        "pi0": ("pi0", write_tiny_policy("pi0", root / "pi0")),
        "pi05": ("pi05", write_tiny_policy("pi05", root / "pi05")),
        "vjepa2-ac": ("vjepa2", write_tiny_vjepa2_ac(root / "ac")),
        "vjepa2": ("vjepa2", write_tiny_vjepa2(root / "encoder")),
    }


@pytest.mark.parametrize(("name", "kinds", "tasks"), [
    ("bagel", ["generate", "understand", "edit"], {"image", "chat"}),
    ("pi0", ["act"], {"act"}),
    ("pi05", ["act"], {"act"}),
    ("vjepa2-ac", ["rollout", "encode"], {"rollout", "encode"}),
    ("vjepa2", ["encode"], {"encode"}),  # no action-conditioned predictor: its rollouts are left out
])
def test_each_family_default_builds_requests_for_its_checkpoint(checkpoints, name, kinds, tasks):
    family, path = checkpoints[name]
    processor = load_model(ModelRef(family, str(path))).processor()
    workload = default_workload(family, processor)
    assert [k.name for k in workload.kinds] == kinds
    specs = workload.specs(processor, 8)
    assert len(specs) == 8 and {s.task for s in specs} == tasks


def test_a_default_the_checkpoint_cannot_take_at_all_says_so(checkpoints):
    family, path = checkpoints["pi0"]
    processor = load_model(ModelRef(family, str(path))).processor()
    with pytest.raises(ConfigError, match=r"the bagel default workload does not fit this checkpoint .*--workload FILE"):
        default_workload("bagel", processor)


def _png(rgb: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def test_a_workload_file_carries_arrays_and_images(tmp_path):
    rgb = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    (tmp_path / "cam.png").write_bytes(_png(rgb))
    url = "data:image/png;base64," + base64.b64encode(_png(rgb)).decode()
    state = np.linspace(0, 1, 5, dtype=np.float32)
    (tmp_path / "w.yaml").write_text(f"""
kinds:
  - task: act
    payload:
      inputs:
        base_0_rgb: {{type: image, url: cam.png}}
        wrist: {{type: image, url: "{url}"}}
        state: {{type: array, dtype: float32, shape: [5], data: "{base64.b64encode(state.tobytes()).decode()}"}}
        prompt: pick {{i}}
  - task: chat
    payload: {{messages: [{{role: user, content: [{{type: image_url, image_url: {{url: "{url}"}}}}, {{type: text, text: hi}}]}}]}}
""")
    act, chat = load_workload(tmp_path / "w.yaml").kinds
    inputs = act.payload["inputs"]
    assert inputs["base_0_rgb"] == inputs["wrist"] == ArrayData("uint8", (4, 6, 3), rgb.tobytes())
    assert np.array_equal(np.frombuffer(inputs["state"].data, np.float32), state) and inputs["prompt"] == "pick {i}"
    part = chat.payload["messages"][0]["content"][0]
    assert part == {"type": "image", "image": ArrayData("uint8", (4, 6, 3), rgb.tobytes())}


@pytest.mark.parametrize(("value", "message"), [
    ("{type: array, dtype: float32, shape: [3], data: AAAA}", r"kinds\[0\].payload.x: ArrayData float32\[3\] needs 12 bytes"),
    ("{type: array, dtype: float32, shape: [1], data: '%%%'}", r"kinds\[0\].payload.x: "),
    ("{type: image, url: missing.png}", r"kinds\[0\].payload.x: cannot read .*missing.png"),
    ("{type: image, url: 'data:image/png;base64,bm90IGEgcG5n'}", r"kinds\[0\].payload.x: is not an image"),
])
def test_bad_media_in_a_workload_file_name_the_field(tmp_path, value, message):
    (tmp_path / "w.yaml").write_text(f"kinds:\n  - task: act\n    payload: {{x: {value}}}\n")
    with pytest.raises(ConfigError, match=message):
        load_workload(tmp_path / "w.yaml")
