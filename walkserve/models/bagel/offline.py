"""The offline loops: one request at a time over dense caches, as the release's inferencer runs BAGEL.

    generate:    prefill (layout.plan_generation_prefill) -> [think: decode a plan on a copy of gen, prefill it
                 into gen] -> 49 flow steps, each up to three separate LLM queries (gen, cfg_text, cfg_img)
                 over the cached contexts, CFG + renorm, Euler -> final latent tokens [N, 64]
    understand:  ViT blocks and the text into gen, then greedy decode from <|im_start|> until <|im_end|>

They are the oracle of the served walks and the baseline of the benchmark
(three CFG forwards per step, no batching across requests or contexts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch

from walkserve.models.bagel.dense_contexts import DenseContexts
from walkserve.models.bagel.flow import Guidance, euler_step, timesteps
from walkserve.models.bagel.layout import (
    CFG_IMG,
    CFG_TEXT,
    GEN,
    THINK,
    ImageInput,
    SequenceLayout,
    SpecialTokens,
    TextInput,
    decode_start,
    plan_denoise_step,
    plan_generation_prefill,
    plan_think_end,
    plan_think_start,
    plan_understanding_prefill,
)
from walkserve.models.bagel.weights import BagelParts


@dataclass(frozen=True)
class EditImage:
    """An input image of an edit, already resized: ``vae_pixels`` [3, H, W] (stride 16), ``vit_pixels``
    [3, h, w] (stride 14), both in [-1, 1]; the posterior sample uses ``eps`` if given, else ``seed``."""

    vae_pixels: torch.Tensor
    vit_pixels: torch.Tensor
    seed: int = 0
    eps: torch.Tensor | None = None


class OfflineBagel:
    def __init__(self, parts: BagelParts, tokens: SpecialTokens,
                 retokenize: Callable[[list[int]], list[int]] | None = None):
        """``retokenize`` turns a decoded think plan back into prompt ids (the release decodes it to text and
        encodes that again); without it the decoded ids are used as they are."""
        self.parts, self.tokens, self.retokenize = parts, tokens, retokenize
        self.patch_px = parts.config.latent_downsample

    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[int], noise: torch.Tensor, size: tuple[int, int] | None = None,
                 image: EditImage | None = None, guidance: Guidance | None = None, num_timesteps: int = 50,
                 shift: float = 3.0, think_system_ids: Sequence[int] | None = None,
                 max_think_tokens: int = 1024) -> torch.Tensor:
        """Final latent tokens [N, 64] from ``noise`` [N, 64] (N = (H/16)(W/16)).

        Text-to-image: ``size`` (H, W). Edit: ``image``; the output has its VAE size.
        """
        guidance = guidance or Guidance()
        height, width = image.vae_pixels.shape[1:] if image is not None else size
        grid = (height // self.patch_px, width // self.patch_px)
        if tuple(noise.shape) != (grid[0] * grid[1], self.parts.config.latent_dim):
            raise ValueError(f"noise must be [{grid[0] * grid[1]}, {self.parts.config.latent_dim}], got {list(noise.shape)}")
        layout, contexts = SequenceLayout(self.tokens), DenseContexts(self.parts.lm)
        inputs, rows = [], []
        if image is not None:
            vae_rows, vit_rows = self._image_rows(image)
            inputs.append(ImageInput(vae_rows.shape[0], vit_rows.shape[0]))
            rows += [vae_rows, vit_rows]
        inputs.append(TextInput(tuple(prompt_ids)))
        self._run(contexts, plan_generation_prefill(layout, inputs, think_system_ids), rows)
        if think_system_ids is not None:
            self.think(layout, contexts, max_think_tokens)
        return self.denoise(layout, contexts, noise, grid, guidance, num_timesteps, shift)

    def denoise(self, layout: SequenceLayout, contexts: DenseContexts, noise: torch.Tensor, grid: tuple[int, int],
                guidance: Guidance, num_timesteps: int, shift: float) -> torch.Tensor:
        """The flow loop over prefilled contexts: x from t = 1 (noise) to t = 0."""
        latents = self.parts.latents
        positions = latents.position_ids(*grid)
        x = noise.to(latents.vae2llm.weight.device).float()  # [N, 64]
        ts = timesteps(num_timesteps, shift).tolist()
        for t, t_next in pairwise(ts):
            rows = latents.embed(x, t, positions)  # [N, D]
            queries = plan_denoise_step(layout, x.shape[0], *guidance.passes_at(t))
            v = {q.context: latents.velocity(contexts.run(q, rows)[1:-1]) for q in queries}  # [N, 64] each
            combined = guidance.combine(t, v[GEN], v.get(CFG_TEXT), v.get(CFG_IMG))
            x = euler_step(x, combined, t, t_next)
        return x

    def think(self, layout: SequenceLayout, contexts: DenseContexts, max_tokens: int) -> list[int]:
        """Decode a plan on a copy of gen, then prefill it into gen as a text segment; returns the plan's ids."""
        self._run(contexts, plan_think_start(layout), [])
        plan = self.decode(layout, contexts, THINK, max_tokens)
        ids = self.retokenize(plan) if self.retokenize is not None else plan
        self._run(contexts, plan_think_end(layout, ids), [])
        return plan

    @torch.no_grad()
    def understand(self, prompt_ids: Sequence[int], vit_pixels: Sequence[torch.Tensor] = (),
                   max_new_tokens: int = 512, system_ids: Sequence[int] | None = None,
                   ignore_end: bool = False) -> list[int]:
        """Greedy answer ids (without <|im_end|>) about the images (ViT-resized pixels, each [3, h, w]);
        ``ignore_end``: exactly ``max_new_tokens`` of them, <|im_end|> or not."""
        layout, contexts = SequenceLayout(self.tokens), DenseContexts(self.parts.lm)
        rows = [self.parts.vit.forward_items([{"pixels": p}])[0]["embeds"] for p in vit_pixels]
        inputs = [ImageInput(0, r.shape[0]) for r in rows] + [TextInput(tuple(prompt_ids))]
        self._run(contexts, plan_understanding_prefill(layout, inputs, system_ids), rows)
        return self.decode(layout, contexts, GEN, max_new_tokens, ignore_end)

    def decode(self, layout: SequenceLayout, contexts: DenseContexts, context: str, max_tokens: int,
               ignore_end: bool = False) -> list[int]:
        """Greedy decode on ``context`` from <|im_start|>: every token but the final <|im_end|> is written."""
        lm, out = self.parts.lm, []
        hidden = contexts.run(decode_start(layout, context))
        while True:
            token = int(lm.compute_logits(hidden[-1:]).argmax(-1))
            if (token == self.tokens.im_end and not ignore_end) or len(out) == max_tokens:
                return out
            out.append(token)
            hidden = contexts.run(layout.tokens_append(context, [token]))

    def decode_image(self, latents: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """Final latent tokens -> uint8 [H, W, 3]."""
        grid = torch.tensor([size[0] // self.patch_px, size[1] // self.patch_px])
        return self.parts.vae_decoder.forward_items([{"latents": latents, "grid": grid}])[0]["image"]

    def _image_rows(self, image: EditImage) -> tuple[torch.Tensor, torch.Tensor]:
        """LLM rows of an edit image: clean latent embeddings (t = 0) and ViT rows."""
        item = {"image": image.vae_pixels}
        item.update({"eps": image.eps} if image.eps is not None else {"seed": torch.tensor(image.seed)})
        tokens = self.parts.vae_encoder.forward_items([item])[0]["latents"]  # [N, 64]
        h, w = (s // self.patch_px for s in image.vae_pixels.shape[1:])
        vae_rows = self.parts.latents.embed(tokens, 0.0, self.parts.latents.position_ids(h, w))
        vit_rows = self.parts.vit.forward_items([{"pixels": image.vit_pixels}])[0]["embeds"]
        return vae_rows, vit_rows

    @staticmethod
    def _run(contexts: DenseContexts, ops: list, rows: list[torch.Tensor]) -> None:
        """Run prefill ops; image segments take the next of ``rows`` in order."""
        pending = list(rows)
        for op in ops:
            needs = getattr(getattr(op, "segment", None), "image_tokens", 0)
            contexts.run(op, pending.pop(0) if needs else None)
