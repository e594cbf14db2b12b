"""The batch-1 ceiling of ``./dev bench vjepa``: the fit of a forward's fixed cost and the bound it implies."""

from __future__ import annotations

import pytest

from benchmarks.vjepa_ceiling import ForwardCost, ceiling, fit
from benchmarks.vjepa_offline import forward_flops, rollout_flops
from walkserve.models.vjepa2.tiny import AC_PRESETS

CFG = AC_PRESETS["bench"].predictor  # width 256, 8 blocks, 66 tokens per step


def _forward_s(steps: int, cost: ForwardCost) -> float:
    p, f = CFG.tokens_per_step, CFG.frame_tokens
    return cost.fixed_s + forward_flops(CFG, steps * p, steps * p, steps * f) / cost.flops_per_s


def test_fit_recovers_the_fixed_cost_and_rate_of_a_linear_cost_model():
    truth = ForwardCost(0.004, 60e9)
    got = fit(CFG, _forward_s(1, truth), _forward_s(2, truth))
    assert got.fixed_s == pytest.approx(0.004, rel=1e-9) and got.flops_per_s == pytest.approx(60e9, rel=1e-9)


def test_fit_without_a_measurable_slope_has_no_fixed_part():
    got = fit(CFG, 0.020, 0.019)  # two steps timed faster than one: noise
    assert got.fixed_s == 0.0 and got.flops_per_s == pytest.approx(forward_flops(CFG, 66, 66, 64) / 0.020)


@pytest.mark.parametrize("h", [4, 8, 15, 30])
def test_ceiling_is_the_flop_ratio_without_fixed_costs_and_below_it_with_them(h):
    flops = rollout_flops(CFG, h, cached=False) / rollout_flops(CFG, h, cached=True)
    rate = 80e9
    official = rollout_flops(CFG, h, cached=False) / rate
    assert ceiling(CFG, h, official, 0.0, ForwardCost(0.0, rate)) == pytest.approx(flops, rel=1e-9)
    cost, encode = ForwardCost(0.005, rate), 0.002
    official = encode + h * cost.fixed_s + rollout_flops(CFG, h, cached=False) / rate
    served = encode + h * cost.fixed_s + rollout_flops(CFG, h, cached=True) / rate
    got = ceiling(CFG, h, official, encode, cost)
    assert got == pytest.approx(official / served, rel=1e-9) and 1.0 < got < flops
