"""CfgStep: the stateless combination node of one flow step (CFG + renorm + Euler) for a batch of requests.

Per item (one request's step; scalars as 0-d tensors):

    x [N, 64]            the latent at t                     v [N, 64]           velocity over gen
    v_cfg_text [N, 64]   over cfg_text (when its pass ran)   v_cfg_img [N, 64]   over cfg_img (when it ran)
    t, t_next            this step's time and the next's
    cfg_text_scale, cfg_img_scale, cfg_interval [2], cfg_renorm_min      the request's guidance
    cfg_renorm_type      int64 index into flow.RENORM_TYPES

Output: ``{"x": x - v' (t - t_next)}``. Items are combined one by one: a
``global`` renorm takes norms over one request's tensor, never the batch's.
"""

from __future__ import annotations

import torch

from walkserve.models.bagel.flow import RENORM_TYPES, Guidance, euler_step


def guidance_of(item: dict[str, torch.Tensor]) -> Guidance:
    lo, hi = (float(v) for v in item["cfg_interval"])
    return Guidance(float(item["cfg_text_scale"]), float(item["cfg_img_scale"]), (lo, hi),
                    RENORM_TYPES[int(item["cfg_renorm_type"])], float(item["cfg_renorm_min"]))


class CfgStep:
    @staticmethod
    def step(item: dict[str, torch.Tensor], guidance: Guidance, t: float, t_next: float) -> torch.Tensor:
        """One request's x at t_next: the guided velocity of its passes, one Euler step."""
        v = guidance.combine(t, item["v"].float(), _opt(item, "v_cfg_text"), _opt(item, "v_cfg_img"))
        return euler_step(item["x"].float(), v, t, t_next)

    def forward_items(self, inputs: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        return [{"x": self.step(item, guidance_of(item), float(item["t"]), float(item["t_next"]))} for item in inputs]


def _opt(item: dict[str, torch.Tensor], key: str) -> torch.Tensor | None:
    value = item.get(key)
    return None if value is None else value.float()
