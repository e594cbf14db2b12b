"""ExpertRoute: which tokens of a ragged batch take BAGEL's understanding expert and which its generation expert.

    expert [T]:  0 = understanding (text, ViT and marker tokens)   1 = generation (VAE-latent tokens)

A batch of one kind runs each projection once over all rows; a mixed batch
gathers each kind's rows, applies its expert's weights, and scatters the
results back in place, so the token order (and the shared attention) is
unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

EXPERT_UND = 0
EXPERT_GEN = 1


class ExpertRoute:
    """The split of one forward's rows between the two experts (built once, used by every layer)."""

    def __init__(self, expert: torch.Tensor | None, num_tokens: int):
        self.kind = "und"
        self.und_rows = self.gen_rows = None
        if expert is None:
            return
        if expert.shape != (num_tokens,):
            raise ValueError(f"expert must be [T] = [{num_tokens}], got {tuple(expert.shape)}")
        gen = expert.to(torch.bool)  # [T]
        n_gen = int(gen.sum())
        if n_gen == num_tokens:
            self.kind = "gen"
        elif n_gen:
            self.kind = "mixed"
            self.und_rows = (~gen).nonzero().squeeze(1)  # [T_und]
            self.gen_rows = gen.nonzero().squeeze(1)  # [T_gen]

    def map(self, x: torch.Tensor, und: Callable[[torch.Tensor], torch.Tensor],
            gen: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``und`` on understanding rows and ``gen`` on generation rows of x [T, ...], in place order."""
        if self.kind == "und":
            return und(x)
        if self.kind == "gen":
            return gen(x)
        a, b = und(x[self.und_rows]), gen(x[self.gen_rows])  # [T_und, ...], [T_gen, ...]
        out = a.new_empty((x.shape[0], *a.shape[1:]))  # [T, ...]
        out[self.und_rows] = a
        out[self.gen_rows] = b
        return out
