"""Whole flows of the offline loop against a loop composed here from the oracles, with an explicit noise.

The reference recomputes every context's whole packed sequence at every step
(no cache) with the two-expert oracle, embeds with the stored tensors,
steps with diffusers' scheduler and combines CFG by the formulas; the three
contexts are written out here as the release's inferencer fills them.
"""

from __future__ import annotations

import pytest
import torch

from walkserve.models.bagel.flow import Guidance
from walkserve.models.bagel.offline import EditImage, OfflineBagel

pytestmark = pytest.mark.parity
GEN = torch.Generator().manual_seed(23)
GRID = (3, 4)  # 48 x 64 pixels


def _rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


class Reference:
    def __init__(self, oracle, tokens):
        self.o, self.tok = oracle, tokens
        self.embed = oracle.qwen3("und").model.embed_tokens

    def sequence(self, segments):
        """segments of ("text", ids) | ("vae" | "vit" | "query", rows) -> embeds, is_gen, packing."""
        embeds, is_gen, packing = [], [], []
        for kind, value in segments:
            if kind == "text":
                ids = torch.tensor([self.tok.im_start, *value, self.tok.im_end])
                rows, gen = self.embed(ids), [False] * len(ids)
            else:
                marks = self.embed(torch.tensor([self.tok.vision_start, self.tok.vision_end]))
                rows = torch.cat([marks[:1], value, marks[1:]])
                gen = [False] + [kind != "vit"] * len(value) + [False]
            embeds.append(rows)
            is_gen += gen
            packing.append(("text" if kind == "text" else "image", len(rows)))
        return torch.cat(embeds), torch.tensor(is_gen), packing

    def hidden(self, segments):
        embeds, is_gen, packing = self.sequence(segments)
        allowed, positions = self.o.packing_mask(packing)
        return self.o.two_expert_hidden(embeds, is_gen, positions, allowed)

    @torch.no_grad()
    def generate(self, contexts, noise, g: Guidance, num_timesteps=50, shift=3.0):
        sched = self.o.scheduler(num_timesteps, shift)
        x = noise.clone()
        for i in range(num_timesteps - 1):
            t = sched.sigmas[i].item()
            s_text, s_img = (g.text_scale, g.img_scale) if g.interval[0] < t <= g.interval[1] else (1.0, 1.0)
            query = [("query", self.o.latent_rows(x, t, GRID))]
            v = {name: self.o.velocity(self.hidden(segs + query)[-x.shape[0] - 1:-1])
                 for name, segs in contexts.items() if name == "gen" or s_text > 1}
            x = sched.step(self.guide(v, s_text, s_img, g), sched.timesteps[i], x).prev_sample
        return x

    @staticmethod
    def guide(v, s_text, s_img, g):
        if s_text <= 1:
            return v["gen"]
        text = v["cfg_text"] + s_text * (v["gen"] - v["cfg_text"])
        norm = (lambda a: a.norm(dim=-1, keepdim=True)) if g.renorm_type != "global" else (lambda a: a.norm())
        if g.renorm_type == "text_channel":
            text = text * (norm(v["gen"]) / (norm(text) + 1e-8)).clamp(g.renorm_min, 1.0)
            return v["cfg_img"] + s_img * (text - v["cfg_img"]) if s_img > 1 else text
        out = v["cfg_img"] + s_img * (text - v["cfg_img"]) if s_img > 1 else text
        return out * (norm(v["gen"]) / (norm(out) + 1e-8)).clamp(g.renorm_min, 1.0)

    @torch.no_grad()
    def decode(self, segments, steps):
        """Greedy decode from <|im_start|> with full recomputation (all understanding)."""
        und, out = self.o.qwen3("und"), []
        embeds, _, packing = self.sequence(segments)
        for _ in range(steps):
            ids = torch.tensor([self.tok.im_start, *out])
            x = torch.cat([embeds, self.embed(ids)])
            allowed, positions = self.o.packing_mask(packing + [("text", len(ids))])
            mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]
            logits = und(inputs_embeds=x[None], position_ids=positions[None], attention_mask=mask).logits[0, -1]
            token = int(logits.argmax())
            if token == self.tok.im_end:
                break
            out.append(token)
        return out


@pytest.fixture(scope="module")
def ref(oracle, tokens):
    return Reference(oracle, tokens)


@pytest.fixture(scope="module")
def offline(parts, tokens):
    return OfflineBagel(parts, tokens)


@pytest.fixture(scope="module")
def prompt(tokenizer):
    return tokenizer.encode("a red cube on a wooden table", add_special_tokens=False)


def test_text_to_image_final_latent_matches_the_composed_loop(offline, ref, prompt):
    g = Guidance(4.0, 1.5, (0.4, 1.0), "global", 0.0)
    noise = torch.randn(12, 64, generator=GEN)
    got = offline.generate(prompt, noise, size=(48, 64), guidance=g)
    contexts = {"gen": [("text", prompt)], "cfg_text": [], "cfg_img": [("text", prompt)]}
    want = ref.generate(contexts, noise, g)
    assert _rel(got, want) < 1e-4
    assert _rel(got, noise) > 0.1  # the flow moved the latent
    assert offline.decode_image(got, (48, 64)).shape == (48, 64, 3)


def test_edit_final_latent_matches_the_composed_loop(offline, ref, oracle, prompt):
    g = Guidance(4.0, 2.0, (0.0, 1.0), "text_channel", 0.0)
    vae_px, vit_px = torch.rand(3, 48, 64, generator=GEN) * 2 - 1, torch.rand(3, 42, 56, generator=GEN) * 2 - 1
    eps, noise = torch.randn(16, 6, 8, generator=GEN), torch.randn(12, 64, generator=GEN)
    got = offline.generate(prompt, noise, image=EditImage(vae_px, vit_px, eps=eps), guidance=g)
    vae_rows = oracle.latent_rows(oracle.vae_tokens(vae_px, eps), 0.0, GRID)
    vit_rows = oracle.vit_rows([vit_px])
    image = [("vae", vae_rows), ("vit", vit_rows)]
    contexts = {"gen": image + [("text", prompt)], "cfg_text": image, "cfg_img": [("text", prompt)]}
    want = ref.generate(contexts, noise, g)
    assert _rel(got, want) < 1e-4


def test_think_mode_decodes_on_a_copy_and_prefills_the_plan_into_gen_only(offline, ref, prompt):
    system, g = prompt[:5], Guidance(4.0, 1.5, (0.0, 1.0), "channel", 0.0)
    noise = torch.randn(12, 64, generator=GEN)
    got = offline.generate(prompt, noise, size=(48, 64), guidance=g, num_timesteps=6, think_system_ids=system,
                           max_think_tokens=6)
    plan = ref.decode([("text", system), ("text", prompt)], 6)
    contexts = {"gen": [("text", system), ("text", prompt), ("text", plan)], "cfg_text": [("text", system)],
                "cfg_img": [("text", system), ("text", prompt)]}
    assert _rel(got, ref.generate(contexts, noise, g, num_timesteps=6)) < 1e-4


def test_understanding_greedy_tokens_match_the_oracle(offline, ref, prompt):
    vit_px = torch.rand(3, 56, 42, generator=GEN) * 2 - 1
    got = offline.understand(prompt, [vit_px], max_new_tokens=8)
    want = ref.decode([("vit", ref.o.vit_rows([vit_px])), ("text", prompt)], 8)
    assert got == want and len(got) > 0
