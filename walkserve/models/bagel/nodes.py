"""BAGEL's stateless components as the stateless engine runs them: a ``Batch`` in, one outputs dict per item.

    vit          {"image" uint8 [h, w, 3]}                  -> {"embeds" [h/14 w/14, D]}
    vae_encoder  {"image" uint8 [H, W, 3], "seed" [1]}      -> {"latents" [(H/16)(W/16), 64]}
    latents      op embed:    {"latents", "grid" [2]}       -> {"embeds" [N, D]}     clean latents, t = 0
                 op init:     {"noise" [N, 64] | [0], "seed", "grid"} -> {"x", "embeds"}   at t_0
                 op velocity: {"hidden" [N + 2, D]}          -> {"velocity" [N, 64]}   llm2vae of the latent rows
                 op step:     {"x", "v", "v_cfg_text", "v_cfg_img", "grid"} -> {"x", "embeds"}
                              CFG + renorm + Euler from t_k to t_k+1 (k = the firing's iteration), and the
                              next step's LLM rows at t_k+1; the guidance comes from the request's parameters
    vae_decoder  {"latents" [N, 64], "grid" [2]}             -> {"image" uint8 [16h, 16w, 3]}

Images arrive as the processor resized them (uint8 HWC) and become [-1, 1]
pixels here. The initial noise, when not given, is ``torch.randn([N, 64])``
from a CPU generator seeded with the request's seed, so every device draws
the same latent.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from walkserve.engines.spec import Batch, Item
from walkserve.models.bagel.cfg_step import CfgStep
from walkserve.models.bagel.flow import Guidance, timesteps
from walkserve.models.bagel.latents import LatentEmbedder
from walkserve.models.bagel.params import BagelRun
from walkserve.models.bagel.vae import VaeDecoder, VaeEncoder
from walkserve.models.bagel.vit import BagelViT

Outputs = list[dict[str, torch.Tensor]]


def pixels(image: torch.Tensor) -> torch.Tensor:
    """uint8 [H, W, 3] -> float32 [3, H, W] in [-1, 1] ((x / 255 - 0.5) / 0.5, as the release's transform)."""
    return ((image.to(torch.float32) / 255.0 - 0.5) / 0.5).permute(2, 0, 1).contiguous()


def _grid(item: Item) -> tuple[int, int]:
    h, w = (int(v) for v in item.inputs["grid"].reshape(-1))
    return h, w


def _seed(item: Item, key: str = "seed") -> int:
    return int(item.inputs[key].reshape(-1)[0])


class VitNode:
    def __init__(self, vit: BagelViT):
        self.vit = vit

    def forward_batch(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        return self.vit.forward_items([{"pixels": pixels(f.inputs["image"])} for f in batch])


class VaeEncoderNode:
    def __init__(self, encoder: VaeEncoder):
        self.encoder = encoder

    def forward_batch(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        return self.encoder.forward_items([{"image": pixels(f.inputs["image"]), "seed": torch.tensor(_seed(f))}
                                           for f in batch])


class VaeDecoderNode:
    def __init__(self, decoder: VaeDecoder):
        self.decoder = decoder

    def forward_batch(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        return self.decoder.forward_items([{"latents": f.inputs["latents"], "grid": torch.tensor(_grid(f))}
                                           for f in batch])


@lru_cache(maxsize=64)
def _schedule(num_timesteps: int, shift: float) -> tuple[float, ...]:
    return tuple(timesteps(num_timesteps, shift).tolist())


def request_guidance(params: BagelRun) -> Guidance:
    lo, hi = params.cfg_interval
    return Guidance(params.cfg_text_scale, params.cfg_img_scale, (lo, hi), params.cfg_renorm_type,
                    params.cfg_renorm_min)


class LatentNode:
    """The latent side of the flow: embeddings in, velocities out, and the CFG step between them."""

    def __init__(self, latents: LatentEmbedder):
        self.latents = latents
        self.device = latents.vae2llm.weight.device

    def forward_batch(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        op = batch.op
        if op == "velocity":
            return self._velocity(list(batch))
        run = {"embed": self._embed, "init": self._init, "step": self._step}[op]
        return [run(f) for f in batch]

    def _rows(self, x: torch.Tensor, t: float, grid: tuple[int, int]) -> torch.Tensor:
        return self.latents.embed(x, t, self.latents.position_ids(*grid))  # [N, D]

    def _embed(self, f: Item) -> dict[str, torch.Tensor]:
        return {"embeds": self._rows(f.inputs["latents"].to(self.device), 0.0, _grid(f))}

    def _init(self, f: Item) -> dict[str, torch.Tensor]:
        h, w = _grid(f)
        noise = f.inputs["noise"]
        if noise.numel() == 0:
            gen = torch.Generator().manual_seed(_seed(f))
            noise = torch.randn((h * w, self.latents.vae2llm.in_features), generator=gen)
        x = noise.to(self.device, torch.float32)  # [N, 64]
        t0 = _schedule(f.params.num_timesteps, f.params.timestep_shift)[0]  # BagelRun
        return {"x": x, "embeds": self._rows(x, t0, (h, w))}

    def _velocity(self, items: list[Item]) -> Outputs:
        rows = [f.inputs["hidden"][1:-1] for f in items]  # the latent rows, without the two markers
        v = self.latents.velocity(torch.cat(rows).to(self.device))  # [sum N, 64] float32
        return [{"velocity": part} for part in v.split([r.shape[0] for r in rows])]

    def _step(self, f: Item) -> dict[str, torch.Tensor]:
        ts = _schedule(f.params.num_timesteps, f.params.timestep_shift)  # BagelRun
        k = f.iteration
        t, t_next = ts[k], ts[k + 1]
        item = {"x": f.inputs["x"], "v": f.inputs["v"], "v_cfg_text": f.inputs["v_cfg_text"],
                "v_cfg_img": f.inputs["v_cfg_img"]}
        x = CfgStep.step(item, request_guidance(f.params), t, t_next)  # [N, 64]
        return {"x": x, "embeds": self._rows(x, t_next, _grid(f))}
