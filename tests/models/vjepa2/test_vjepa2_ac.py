"""The V-JEPA 2-AC predictor against the released code (cc-vjepa2), and the KV-reusing rollout against the
uncached forward at every step."""

from __future__ import annotations

import pytest
import torch

from walkserve.layers.attention import DenseAttention, block_causal_mask
from walkserve.models.vjepa2.rollout import (
    KVRollout,
    cached_rollout,
    full_forward,
    official_rollout,
    rollout_states,
)
from walkserve.models.vjepa2.step_tokens import (
    ACTION,
    FRAME,
    STATE,
    step_kinds,
    step_mask,
    step_positions,
    step_rows,
)
from walkserve.testing.vjepa2_upstream import upstream_ac_forward

TOL = 1e-4


@pytest.mark.parametrize("steps", [1, 4])
def test_full_forward_matches_released_code(released, ac_inputs, steps):
    frames, actions, states = (x[:steps] for x in ac_inputs)
    with torch.inference_mode():
        want = upstream_ac_forward(released.upstream_predictor, frames, actions, states)  # [T, F, E], pre-layer-norm
        model = released.predictor
        cfg = model.config
        hidden = model(None, step_positions(0, steps, cfg.grid_size), DenseAttention(step_mask(0, steps, 18)),
                       inputs_embeds=step_rows(frames, actions, states))  # token_kind defaults to whole steps
        got = model.compute_logits(hidden.view(steps, cfg.tokens_per_step, -1)[:, 2:])
    assert got.shape == want.shape == (steps, 16, 128)
    assert (got - want).abs().max() <= TOL and want.std() > 0.5


def test_step_layout():
    assert step_kinds(2, 3).tolist() == [ACTION, STATE, FRAME, FRAME, FRAME] * 2
    pos = step_positions(5, 2, 2)  # grid 2x2: [a, s, (0,0), (0,1), (1,0), (1,1)] at t = 5, 6
    assert pos.tolist() == [[5] * 6 + [6] * 6, [0, 0, 0, 0, 1, 1] * 2, [0, 0, 0, 1, 0, 1] * 2]
    rows = step_rows(torch.ones(1, 4, 8), torch.full((1, 7), 2.0), torch.full((1, 7), 3.0))
    assert rows.shape == (6, 8) and rows[0, :7].eq(2).all() and rows[1, :7].eq(3).all() and rows[:2, 7].eq(0).all()
    assert step_mask(3, 1, 6) is None  # one appended step sees everything
    assert torch.equal(step_mask(1, 2, 6), block_causal_mask(3, 6)[6:])


def test_kv_component_seam(released, ac_inputs):
    model = released.predictor
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size) == (2, 2, 32, 64)
    assert model.embed(torch.zeros(5, dtype=torch.long)).eq(0).all()  # no vocabulary: rows come as inputs_embeds
    with pytest.raises(ValueError, match="inputs_embeds"):
        model(torch.zeros(18, dtype=torch.long), step_positions(0, 1, 4), DenseAttention(None))
    frames, actions, states = ac_inputs
    rows = step_rows(frames[:1], actions[:1], states[:1])
    with pytest.raises(ValueError, match="whole steps"):
        model(None, step_positions(0, 1, 4)[:, :10], DenseAttention(None), inputs_embeds=rows[:10])
    with torch.inference_mode():  # an explicit token_kind lets a chunk end mid-step
        kinds = step_kinds(1, 16)
        a = model(None, step_positions(0, 1, 4), DenseAttention(None), inputs_embeds=rows, token_kind=kinds)
        b = model(None, step_positions(0, 1, 4), DenseAttention(None), inputs_embeds=rows)
    assert torch.equal(a, b)


def test_block_causal_by_step(released, ac_inputs):
    frames, actions, states = (x[:4] for x in ac_inputs)
    changed = actions.clone()
    changed[3] += 0.5
    with torch.inference_mode():
        a = full_forward(released.predictor, frames, actions, states)
        b = full_forward(released.predictor, frames, changed, states)
    assert torch.equal(a[:3], b[:3]) and (a[3] - b[3]).abs().max() > 1e-2


@pytest.mark.parametrize("horizon", [1, 4, 15, 30])
def test_every_cached_step_equals_the_uncached_forward(released, ac_inputs, horizon):
    """Step h of the KV-reusing rollout = the full forward over the same history (context + ẑ_1 … ẑ_h)."""
    frames, actions, states = ac_inputs
    model = released.predictor
    with torch.inference_mode():
        streamed = []
        rolled = cached_rollout(model, frames[:1], actions, states[:1], horizon,
                                on_step=lambda h, f: streamed.append((h, f)))
        history = torch.cat([frames[:1], rolled[:-1]])  # the frames each step read
        full = full_forward(model, history, actions[:horizon], rollout_states(states[:1], actions, horizon))
    assert rolled.shape == (horizon, 16, 128)
    assert (rolled - full).abs().max() <= TOL
    assert [h for h, _ in streamed] == list(range(horizon)) and torch.equal(streamed[-1][1], rolled[-1])


def test_cached_rollout_equals_the_released_loop_from_several_context_frames(released, ac_inputs):
    frames, actions, states = ac_inputs
    with torch.inference_mode():
        for given in (states[:3], states[:8]):  # context states only (poses integrated) or every step's
            a = cached_rollout(released.predictor, frames[:3], actions, given, 6)
            b = official_rollout(released.predictor, frames[:3], actions, given, 6)
            assert (a - b).abs().max() <= TOL
    assert (a - cached_rollout(released.predictor, frames[:3], actions, states[:3], 6)).abs().max() > 1e-3


def test_fork_shares_the_prefix_and_leaves_it_unchanged(released, ac_inputs):
    frames, actions, states = ac_inputs
    with torch.inference_mode():
        base = KVRollout(released.predictor)
        base.append(frames[:2], actions[:2], states[:2])
        before = {k: (v[0].clone(), v[1].clone()) for k, v in base.kv.items()}
        one, two = base.fork(), base.fork()
        x = one.append(frames[2:3], actions[2:3], states[2:3])
        y = two.append(frames[2:3], actions[2:3] + 0.3, states[2:3])
        again = base.fork().append(frames[2:3], actions[2:3], states[2:3])
    assert all(torch.equal(base.kv[k][0], before[k][0]) and torch.equal(base.kv[k][1], before[k][1]) for k in before)
    assert torch.equal(x, again) and (x - y).abs().max() > 1e-3 and one.steps == two.steps == 3


def test_horizon_beyond_the_mask_is_refused(released, ac_inputs):
    frames, actions, states = ac_inputs
    with pytest.raises(ValueError, match="32"):
        cached_rollout(released.predictor, frames[:3], torch.cat([actions, actions]), states[:3], 31)
