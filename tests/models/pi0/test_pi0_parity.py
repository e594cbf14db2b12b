"""pi0 against transformers' PI0ForConditionalGeneration on the same tiny weights and noise.

transformers reads the tiny lerobot-layout checkpoint itself (its "pi0"
conversion mapping renames lerobot's names), so this also checks the layout
``write_tiny_policy`` writes. Compared: the prefix K/V, each flow step's
velocity and the final chunk, all within 1e-4.

One deliberate difference: transformers computes the flow time's sinusoid in
float32, openpi's PyTorch model and lerobot (which we follow, see the pi0.5
goldens) in float64. At t = 0.9 the two differ by 1e-4 in the features
(angles reach 2 pi / 0.004 rad), which is the whole tolerance; the tight
comparison therefore gives transformers' time embedding the float64
arithmetic, and a looser one checks the unpatched model too.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from walkserve.models.pi0.inputs import InputSpec, validate_inputs
from walkserve.models.pi0.predict import camera_batch, predict_actions
from walkserve.models.pi0.request import prepare_request

pytestmark = pytest.mark.parity
TOL = 1e-4


def _float64_sinusoid(self, time):
    """PI0TimestepEmbeddings.forward with openpi's float64 arithmetic."""
    c = self.config
    fraction = torch.linspace(0.0, 1.0, c.dit_config.hidden_size // 2, dtype=torch.float64)
    angle = (2 * math.pi / (c.min_period * (c.max_period / c.min_period) ** fraction))[None] * time.double()[:, None]
    return torch.cat([angle.sin(), angle.cos()], dim=1).float()


@pytest.fixture
def float64_time(monkeypatch):
    from transformers.models.pi0 import modeling_pi0

    monkeypatch.setattr(modeling_pi0.PI0TimestepEmbeddings, "forward", _float64_sinusoid)


@pytest.fixture(scope="module")
def hf_pi0(tiny_pi0):
    from walkserve.testing.pi0_reference import load_reference

    return load_reference(tiny_pi0.path)  # refuses a checkpoint it does not load cleanly


def _request(tiny, cameras, seed):
    rng = np.random.default_rng(seed)
    spec = InputSpec.from_config(tiny.policy.config)
    raw = {cam: rng.integers(0, 256, size=(28, 28, 3), dtype=np.uint8) for cam in cameras}
    raw |= {"state": rng.uniform(-1.5, 1.5, 8), "prompt": "pick up the red cube",
            "noise": rng.standard_normal((10, 32)).astype(np.float32)}
    return validate_inputs(spec, raw)


def _hf_inputs(tiny, request, pad_to=24):
    """transformers' PI0 inputs: image tokens of the present cameras, the prompt right-padded, every camera slot."""
    c = tiny.policy.config
    n = len(request.cameras)
    ids = [c.vocab_size] * (n * c.image_tokens) + request.token_ids
    length = len(ids) + pad_to - len(request.token_ids)
    input_ids = torch.tensor([ids + [0] * (length - len(ids))])
    attention_mask = torch.tensor([[1] * len(ids) + [0] * (length - len(ids))])
    slots = torch.full((len(c.cameras), 3, 28, 28), -1.0)
    present = torch.tensor([cam in request.cameras for cam in c.cameras])
    slots[present] = camera_batch(request, 28, torch.device("cpu"))
    return input_ids, attention_mask, slots[None], present[None]


@pytest.mark.parametrize("cameras", [("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"),
                                     ("base_0_rgb", "right_wrist_0_rgb")], ids=["three", "one_absent"])
def test_pi0_matches_transformers(tiny_pi0, hf_pi0, float64_time, cameras):
    inputs = _request(tiny_pi0, cameras, seed=len(cameras))
    ours = predict_actions(tiny_pi0.policy, tiny_pi0.files, inputs)
    request = prepare_request(tiny_pi0.files, inputs)
    input_ids, mask, pixels, pixel_mask = _hf_inputs(tiny_pi0, request)
    state = torch.from_numpy(request.state)[None]
    noise = torch.from_numpy(inputs.noise)[None]
    with torch.no_grad():
        embeds = hf_pi0.model.embed_prefix(input_ids, pixels, pixel_mask)
        cache = hf_pi0.model.vlm(inputs_embeds=embeds, attention_mask=mask, position_ids=mask.cumsum(-1) - 1,
                                 token_type_ids=torch.zeros_like(mask), use_cache=True).past_key_values
        valid = mask[0].bool()
        n_prefix = int(valid.sum())
        for layer in range(tiny_pi0.policy.config.paligemma.num_hidden_layers):
            for ours_kv, theirs in zip(ours.context.kv[layer], (cache.layers[layer].keys, cache.layers[layer].values)):
                want = theirs[0][:, valid].transpose(0, 1)  # [n, Hkv, Dh]
                assert (ours_kv[:n_prefix] - want).abs().max() < TOL
        x, dt, length = noise.clone(), -0.1, cache.get_seq_length()
        for step in range(10):
            t = torch.full((1,), 1.0 + step * dt)
            v = hf_pi0(state=state, noise=x, timestep=t, attention_mask=mask, pixel_attention_mask=pixel_mask,
                       past_key_values=cache).logits
            cache.crop(length - cache.get_seq_length())  # the prefix only: steps never see each other
            assert (ours.velocities[step] - v[0]).abs().max() < TOL, f"step {step}"
            x = x + dt * v
        final = hf_pi0.sample_actions(state=state, input_ids=input_ids, pixel_values=pixels, noise=noise,
                                      attention_mask=mask, pixel_attention_mask=pixel_mask)
    assert (ours.chunk - final[0]).abs().max() < TOL
    assert (ours.chunk - x[0]).abs().max() < TOL
    assert ours.actions.shape == (10, 7)


def test_pi0_close_to_unpatched_transformers(tiny_pi0, hf_pi0):
    """With transformers' own float32 time embedding the chunk still agrees to 1e-3."""
    inputs = _request(tiny_pi0, ("base_0_rgb", "left_wrist_0_rgb"), seed=9)
    ours = predict_actions(tiny_pi0.policy, tiny_pi0.files, inputs)
    request = prepare_request(tiny_pi0.files, inputs)
    input_ids, mask, pixels, pixel_mask = _hf_inputs(tiny_pi0, request)
    with torch.no_grad():
        final = hf_pi0.sample_actions(state=torch.from_numpy(request.state)[None], input_ids=input_ids,
                                      pixel_values=pixels, noise=torch.from_numpy(inputs.noise)[None],
                                      attention_mask=mask, pixel_attention_mask=pixel_mask)
    assert (ours.chunk - final[0]).abs().max() < 1e-3
