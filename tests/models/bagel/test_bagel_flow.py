"""The flow schedule against diffusers' FlowMatchEulerDiscreteScheduler; CFG and renorm by their formulas."""

from __future__ import annotations

import pytest
import torch

from walkserve.models.bagel.flow import Guidance, cfg_combine, euler_step, timesteps

GEN = torch.Generator().manual_seed(17)


def test_schedule_is_the_schedulers_with_bagel_sigmas(oracle):
    sched = oracle.scheduler(50, 3.0)
    ours = timesteps(50, 3.0)
    assert ours.shape == (50,) and ours[0] == 1.0 and ours[-1] == 0.0
    assert sched.sigmas.shape == (50,)  # 49 steps + the terminal 0
    torch.testing.assert_close(ours, sched.sigmas.float(), rtol=0, atol=1e-6)
    assert ours[1].item() == pytest.approx(0.993103, abs=1e-6) and ours[-2].item() == pytest.approx(0.058824, abs=1e-6)


def test_euler_loop_matches_scheduler_steps(oracle):
    sched = oracle.scheduler(50, 3.0)
    x0 = torch.randn(6, 64, generator=GEN)
    field = lambda x, t: 0.5 * x + t  # noqa: E731  (smooth, so float noise does not grow)
    ours, ref = x0.clone(), x0.clone()
    ts = timesteps(50, 3.0).tolist()
    for i in range(49):
        ours = euler_step(ours, field(ours, ts[i]), ts[i], ts[i + 1])
        ref = sched.step(field(ref, sched.sigmas[i].item()), sched.timesteps[i], ref).prev_sample
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def _vs(n=5):
    return [torch.randn(n, 64, generator=GEN) for _ in range(3)]


def test_combination_without_renorm_effect():
    v, vt, vi = _vs()
    got = cfg_combine(v, vt, vi, 4.0, 1.5, "global", 1.0)  # renorm_min 1: the scale is clamped to exactly 1
    torch.testing.assert_close(got, vi + 1.5 * (vt + 4.0 * (v - vt) - vi))


def test_global_and_channel_renorm():
    v, vt, vi = _vs()
    guided = vi + 2.0 * (vt + 3.0 * (v - vt) - vi)
    glob = cfg_combine(v, vt, vi, 3.0, 2.0, "global", 0.0)
    torch.testing.assert_close(glob, guided * min(1.0, (v.norm() / guided.norm()).item()))
    chan = cfg_combine(v, vt, vi, 3.0, 2.0, "channel", 0.0)
    ratio = (v.norm(dim=1, keepdim=True) / guided.norm(dim=1, keepdim=True)).clamp(max=1.0)
    torch.testing.assert_close(chan, guided * ratio)
    floor = cfg_combine(v, vt, vi, 3.0, 2.0, "channel", 0.9)
    torch.testing.assert_close(floor, guided * ratio.clamp(min=0.9))


def test_text_channel_renorms_the_text_step_only():
    v, vt, vi = _vs()
    text = vt + 4.0 * (v - vt)
    text = text * (v.norm(dim=1, keepdim=True) / text.norm(dim=1, keepdim=True)).clamp(max=1.0)
    got = cfg_combine(v, vt, vi, 4.0, 2.0, "text_channel", 0.0)
    torch.testing.assert_close(got, vi + 2.0 * (text - vi))
    torch.testing.assert_close(cfg_combine(v, vt, vi, 4.0, 1.0, "text_channel", 0.0), text)


def test_branches_with_scale_at_most_one_are_skipped():
    v, vt, _ = _vs()
    assert cfg_combine(v, None, None, 1.0, 2.0, "global", 0.0) is v  # no text guidance: no guidance at all
    no_img = cfg_combine(v, vt, None, 4.0, 1.0, "global", 1.0)
    torch.testing.assert_close(no_img, vt + 4.0 * (v - vt))


def test_interval_and_passes():
    g = Guidance(4.0, 1.5, (0.4, 1.0), "global", 0.0)
    assert g.scales_at(1.0) == (4.0, 1.5) and g.scales_at(0.4) == (1.0, 1.0) and g.scales_at(0.41) == (4.0, 1.5)
    assert g.passes_at(0.9) == (True, True) and g.passes_at(0.2) == (False, False)
    assert Guidance(4.0, 1.0).passes_at(0.9) == (True, False)
    assert Guidance(1.0, 2.0).passes_at(0.9) == (False, False)
    ts = timesteps(50, 3.0).tolist()[:-1]
    assert sum(g.passes_at(t)[0] for t in ts) == 41  # t > 0.4 on 41 of the 49 steps
    with pytest.raises(ValueError, match="renorm_type"):
        Guidance(renorm_type="none")


def test_cfg_step_node_combines_each_request_alone():
    from walkserve.models.bagel.cfg_step import CfgStep
    from walkserve.models.bagel.flow import RENORM_TYPES

    def item(n, renorm):
        v, vt, vi = _vs(n)
        x = torch.randn(n, 64, generator=GEN)
        return {"x": x, "v": v, "v_cfg_text": vt, "v_cfg_img": vi, "t": torch.tensor(0.9), "t_next": torch.tensor(0.8),
                "cfg_text_scale": torch.tensor(4.0), "cfg_img_scale": torch.tensor(1.5),
                "cfg_interval": torch.tensor([0.4, 1.0]), "cfg_renorm_min": torch.tensor(0.0),
                "cfg_renorm_type": torch.tensor(RENORM_TYPES.index(renorm))}

    items = [item(5, "global"), item(3, "text_channel")]
    out = CfgStep().forward_items(items)
    for it, o, renorm in zip(items, out, ("global", "text_channel")):
        v = cfg_combine(it["v"], it["v_cfg_text"], it["v_cfg_img"], 4.0, 1.5, renorm, 0.0)
        torch.testing.assert_close(o["x"], it["x"] - v * (0.9 - 0.8))
    alone = CfgStep().forward_items([items[0]])[0]["x"]
    torch.testing.assert_close(alone, out[0]["x"], rtol=0, atol=0)
