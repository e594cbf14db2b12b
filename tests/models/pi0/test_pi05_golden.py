"""pi0.5 end to end against goldens made once by lerobot 0.6.1's PI05Policy (see goldens/make_pi05_goldens.py).

Same tiny checkpoint (the tensor hash proves it), same raw inputs (uint8
images of odd sizes, a raw state, an uncleaned prompt, explicit noise):
the normalised state, the prompt text, its ids, the prefix K/V, every flow
step's velocity, the chunk and the unnormalised actions must agree.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from walkserve.models.pi0.inputs import InputSpec, validate_inputs
from walkserve.models.pi0.predict import predict_actions
from walkserve.models.pi0.prompt import pi05_prompt, state_bins

pytestmark = pytest.mark.parity
GOLDENS = Path(__file__).parent / "goldens"
META = json.loads((GOLDENS / "pi05_goldens.json").read_text())
TENSORS = load_file(str(GOLDENS / "pi05_goldens.safetensors"))


def _tensor_hash(path: Path) -> str:
    import hashlib

    tensors = load_file(str(path))
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].tobytes())
    return h.hexdigest()


def test_goldens_were_made_from_this_tiny_checkpoint(tiny_pi05):
    assert _tensor_hash(tiny_pi05.path / "model.safetensors") == META["checkpoint_tensor_hash"], (
        "write_tiny_policy changed: regenerate the goldens with tests/models/pi0/goldens/make_pi05_goldens.py")


@pytest.mark.parametrize("case", META["cases"], ids=[c["name"] for c in META["cases"]])
def test_pi05_matches_lerobot_goldens(tiny_pi05, case):
    g = {k.split(".", 1)[1]: v for k, v in TENSORS.items() if k.startswith(case["name"] + ".")}
    spec = InputSpec.from_config(tiny_pi05.policy.config)
    raw = {cam: g[f"image.{cam}"] for cam in case["cameras"]}
    raw |= {"state": g["state"], "prompt": case["prompt"], "noise": g["noise"]}
    normalized = tiny_pi05.files.normalizer.state.normalize(g["state"])
    np.testing.assert_allclose(normalized, g["normalized_state"], atol=1e-6)
    assert pi05_prompt(case["prompt"], state_bins(normalized)) == case["full_prompt"]

    ours = predict_actions(tiny_pi05.policy, tiny_pi05.files, validate_inputs(spec, raw))
    assert ours.request.token_ids == g["token_ids"].tolist()
    for layer in range(tiny_pi05.policy.config.paligemma.num_hidden_layers):
        k, v = ours.context.kv[layer]  # [n, Hkv, Dh]
        assert np.abs(k.transpose(0, 1).numpy() - g[f"prefix_k.{layer}"]).max() < 1e-5
        assert np.abs(v.transpose(0, 1).numpy() - g[f"prefix_v.{layer}"]).max() < 1e-5
    assert np.abs(torch.stack(ours.velocities).numpy() - g["velocities"]).max() < 1e-4
    assert np.abs(ours.chunk.numpy() - g["chunk"]).max() < 1e-4
    assert ours.actions.shape == g["actions"].shape == (10, 7)
    assert np.abs(ours.actions - g["actions"]).max() < 1e-4
