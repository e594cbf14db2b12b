"""BAGEL's rectified-flow sampling as small pure functions: the schedule, the CFG combination, the Euler step.

    x_t = (1 - t) x_0 + t eps; the model predicts v ~ eps - x_0; start from x ~ N(0, 1) at t = 1.
    t_i = linspace(1, 0, n); t_i <- s t_i / (1 + (s - 1) t_i)            (n = 50, s = 3: 49 steps)
    x <- x - v'(x, t_i) (t_i - t_{i+1})                                   for i = 0 .. n - 2

Classifier-free guidance, only while cfg_interval[0] < t_i <= cfg_interval[1]:

    v_t = v_ct + s_text (v - v_ct)         v: the full context (gen); v_ct: without the last text (cfg_text)
    v'  = v_ci + s_img (v_t - v_ci)        v_ci: without images (cfg_img)

A branch whose scale is <= 1 is skipped; with s_text <= 1 there is no
guidance at all (the release ignores the image branch then). Renorm rescales
by clamp(|v| / |v'|, renorm_min, 1): ``global`` over the whole request,
``channel`` per token, ``text_channel`` per token on v_t only (the image step
is then not renormalised).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

RENORM_TYPES = ("global", "channel", "text_channel")
NORM_EPS = 1e-8


def timesteps(num_timesteps: int, shift: float) -> torch.Tensor:
    """The shifted grid [num_timesteps] from 1 to 0 (float32, as the release computes it)."""
    t = torch.linspace(1, 0, num_timesteps)
    return shift * t / (1 + (shift - 1) * t)


def euler_step(x: torch.Tensor, v: torch.Tensor, t: float, t_next: float) -> torch.Tensor:
    """One step from t to t_next (< t): x - v (t - t_next)."""
    return x - v * (t - t_next)


@dataclass(frozen=True)
class Guidance:
    """CFG settings of one request."""

    text_scale: float = 4.0
    img_scale: float = 1.5
    interval: tuple[float, float] = (0.4, 1.0)
    renorm_type: str = "global"
    renorm_min: float = 0.0

    def __post_init__(self) -> None:
        if self.renorm_type not in RENORM_TYPES:
            raise ValueError(f"renorm_type must be one of {', '.join(RENORM_TYPES)}, got {self.renorm_type!r}")

    def scales_at(self, t: float) -> tuple[float, float]:
        """(s_text, s_img) at time t: the request's inside the interval, 1 (no guidance) outside."""
        lo, hi = self.interval
        return (self.text_scale, self.img_scale) if lo < t <= hi else (1.0, 1.0)

    def passes_at(self, t: float) -> tuple[bool, bool]:
        """Which extra LLM passes step t needs: (cfg_text, cfg_img). Passes whose result is unused are skipped."""
        s_text, s_img = self.scales_at(t)
        return s_text > 1.0, s_text > 1.0 and s_img > 1.0

    def combine(self, t: float, v: torch.Tensor, v_text: torch.Tensor | None,
                v_img: torch.Tensor | None) -> torch.Tensor:
        """The guided velocity at time t from v, v_ct, v_ci [N, 64] (v_text / v_img may be None when unused)."""
        s_text, s_img = self.scales_at(t)
        return cfg_combine(v, v_text, v_img, s_text, s_img, self.renorm_type, self.renorm_min)


def cfg_combine(v: torch.Tensor, v_text: torch.Tensor | None, v_img: torch.Tensor | None, s_text: float,
                s_img: float, renorm_type: str, renorm_min: float) -> torch.Tensor:
    """v' from the three velocities [N, 64] of one request (see the module docstring)."""
    if s_text <= 1.0:
        return v
    guided = v_text + s_text * (v - v_text)  # v_t: [N, 64]
    use_img = s_img > 1.0
    if renorm_type == "text_channel":
        guided = guided * _renorm(v, guided, renorm_min, per_token=True)
        return v_img + s_img * (guided - v_img) if use_img else guided
    if use_img:
        guided = v_img + s_img * (guided - v_img)
    return guided * _renorm(v, guided, renorm_min, per_token=renorm_type == "channel")


def _renorm(v: torch.Tensor, guided: torch.Tensor, renorm_min: float, per_token: bool) -> torch.Tensor:
    if per_token:
        ratio = v.norm(dim=-1, keepdim=True) / (guided.norm(dim=-1, keepdim=True) + NORM_EPS)  # [N, 1]
    else:
        ratio = v.norm() / (guided.norm() + NORM_EPS)  # []
    return ratio.clamp(min=renorm_min, max=1.0)
