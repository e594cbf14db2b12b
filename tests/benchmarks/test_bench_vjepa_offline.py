"""The offline V-JEPA 2-AC rollout benchmark: both loops run and the token counts follow the horizon."""

from __future__ import annotations

import torch

from benchmarks.vjepa_offline import batched_rollout, forward_flops, measure, rollout_flops
from walkserve.models.vjepa2.rollout import cached_rollout, normalize_features
from walkserve.models.vjepa2.tiny import AC_PRESETS, write_tiny_vjepa2_ac
from walkserve.models.vjepa2.weights import load_ac_predictor


def test_measure_reports_both_loops_per_horizon():
    rows = measure("tiny", horizons=(1, 3), repeat=1)
    assert [r["horizon"] for r in rows] == [1, 3]
    assert [(r["official_tokens"], r["cached_tokens"]) for r in rows] == [(18, 18), (108, 54)]
    assert all(r["official_s"] > 0 and r["cached_s"] > 0 and r["ratio"] > 0 for r in rows)
    assert rows[0]["flop_ratio"] == 1.0 and rows[1]["flop_ratio"] > 1.5


def test_flop_model():
    cfg = AC_PRESETS["bench"].predictor  # width 256, 8 blocks, 66 tokens per step
    one = forward_flops(cfg, 66, 66, 64)
    assert one == 66 * 2 * (4 * 256**2 + 2 * 256 * 1024) * 8 + 4 * 66 * 66 * 256 * 8 + 2 * 256 * 128 * (66 + 64)
    assert rollout_flops(cfg, 1, cached=True) == rollout_flops(cfg, 1, cached=False) == one
    assert 2.5 < rollout_flops(cfg, 4, cached=False) / rollout_flops(cfg, 4, cached=True) < 2.6


def test_batched_rollout_gives_each_cached_rollout(tmp_path):
    """Rollouts stepping together (the model-level bound of concurrent served ones) predict what each gives alone."""
    model = load_ac_predictor(write_tiny_vjepa2_ac(tmp_path / "ac", preset="tiny"))
    cfg, g = model.config, torch.Generator().manual_seed(0)
    frames = normalize_features(torch.randn(3, cfg.frame_tokens, cfg.input_size, generator=g))
    actions = 0.05 * torch.randn(3, 4, cfg.action_dim, generator=g)
    states = torch.rand(3, 1, cfg.action_dim, generator=g)
    with torch.inference_mode():
        together = batched_rollout(model, frames, actions, states, 4)  # [3, 4, F, E]
        for i in range(3):
            alone = cached_rollout(model, frames[i : i + 1], actions[i], states[i], 4)
            torch.testing.assert_close(together[i], alone, rtol=1e-4, atol=1e-4)
