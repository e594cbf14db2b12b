"""Shared fixtures for the BAGEL tests: one tiny checkpoint, our loaded parts, and the independent oracles
(transformers' Qwen3 and SigLIP, diffusers' AutoencoderKL and flow scheduler) built on the same weights."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from walkserve.models.bagel.config import BagelConfig
from walkserve.models.bagel.layout import SpecialTokens
from walkserve.models.bagel.tiny import write_tiny_bagel
from walkserve.models.bagel.weights import load_bagel
from walkserve.models.tokenizer import Tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return write_tiny_bagel(tmp_path_factory.mktemp("bagel") / "tiny", seed=1)


@pytest.fixture(scope="session")
def parts(tiny_dir):
    return load_bagel(tiny_dir)


@pytest.fixture(scope="session")
def tokenizer(tiny_dir) -> Tokenizer:
    return Tokenizer.from_dir(tiny_dir)


@pytest.fixture(scope="session")
def tokens(tokenizer) -> SpecialTokens:
    return SpecialTokens.from_tokenizer(tokenizer)


@pytest.fixture(scope="session")
def ema(tiny_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(tiny_dir / "ema.safetensors"))


@pytest.fixture(scope="session")
def oracle(tiny_dir, ema):
    return Oracle(tiny_dir, ema)


class Oracle:
    """The references, built lazily on the tiny checkpoint's tensors (never through our modules)."""

    def __init__(self, path: Path, ema: dict[str, torch.Tensor]):
        self.path, self.ema = path, ema
        self.config = BagelConfig.from_dir(path)
        self._cache: dict[str, object] = {}

    @staticmethod
    def packing_mask(segments: list[tuple[str, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The release's packing: (allowed [T, T], positions [T]) for segments ("text" causal | "image" full)."""
        seg, full, positions, pos = [], [], [], 0
        for i, (kind, n) in enumerate(segments):
            seg += [i] * n
            full += [kind != "text"] * n
            positions += list(range(pos, pos + n)) if kind == "text" else [pos] * n
            pos += n if kind == "text" else 1
        seg, full = torch.tensor(seg), torch.tensor(full)
        idx = torch.arange(len(seg))
        same = seg[:, None] == seg[None, :]
        allowed = (seg[None, :] < seg[:, None]) | (same & (full[:, None] | (idx[None, :] <= idx[:, None])))
        return allowed, torch.tensor(positions)

    # --- the LLM: transformers Qwen3 with q/k/v bias and no o bias, one model per expert ---------------
    def qwen3(self, expert: str):
        if expert not in self._cache:
            from transformers import Qwen3Config, Qwen3ForCausalLM

            c = self.config.llm
            cfg = Qwen3Config(
                vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, attention_bias=True,
                rms_norm_eps=c.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": c.rope.theta},
                max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=False,
                use_sliding_window=False, hidden_act="silu", attention_dropout=0.0)
            model = Qwen3ForCausalLM(cfg).eval()
            for layer in model.model.layers:
                layer.self_attn.o_proj.bias = None
            model.load_state_dict(self._expert_state(expert), strict=True)
            self._cache[expert] = model
        return self._cache[expert]

    def _expert_state(self, expert: str) -> dict[str, torch.Tensor]:
        out = {}
        for name, tensor in self.ema.items():
            if not name.startswith("language_model."):
                continue
            name = name[len("language_model."):]
            is_gen = "_moe_gen" in name
            shared = "embed_tokens" in name or "lm_head" in name
            if (expert == "und" and not is_gen) or (expert == "gen" and (is_gen or shared)):
                out[name.replace("_moe_gen", "")] = tensor
        return out

    @torch.no_grad()
    def two_expert_hidden(self, embeds, is_gen, positions, allowed):
        """Final hidden [T, D] of a mixed sequence: each op of each layer taken from the und or the gen
        oracle per token, attention dense over all tokens under ``allowed`` [T, T] (True = may attend)."""
        und, gen = self.qwen3("und"), self.qwen3("gen")
        x = embeds.float()
        cos, sin = und.model.rotary_emb(x[None], positions[None])
        bias = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
        for lu, lg in zip(und.model.layers, gen.model.layers):
            x = self._two_expert_layer(lu, lg, x, is_gen, cos, sin, bias)
        return _pick(is_gen, und.model.norm, gen.model.norm, x)

    def _two_expert_layer(self, lu, lg, x, is_gen, cos, sin, bias):
        from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb, repeat_kv

        c = self.config.llm
        t, hd, groups = x.shape[0], c.head_dim, c.num_attention_heads // c.num_key_value_heads
        au, ag = lu.self_attn, lg.self_attn
        h = _pick(is_gen, lu.input_layernorm, lg.input_layernorm, x)
        q = _pick(is_gen, _heads(au.q_proj, au.q_norm, hd), _heads(ag.q_proj, ag.q_norm, hd), h)  # [T, Hq, Dh]
        k = _pick(is_gen, _heads(au.k_proj, au.k_norm, hd), _heads(ag.k_proj, ag.k_norm, hd), h)
        v = _pick(is_gen, _heads(au.v_proj, None, hd), _heads(ag.v_proj, None, hd), h)
        q, k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
        k, v = repeat_kv(k, groups), repeat_kv(v.transpose(0, 1)[None], groups)
        w = (q @ k.transpose(-1, -2)) * hd**-0.5 + bias
        out = (w.softmax(-1) @ v)[0].transpose(0, 1).reshape(t, -1)  # [T, Hq Dh]
        x = x + _pick(is_gen, au.o_proj, ag.o_proj, out)
        mlp_u = lambda z: lu.mlp(lu.post_attention_layernorm(z))  # noqa: E731
        mlp_g = lambda z: lg.mlp(lg.post_attention_layernorm(z))  # noqa: E731
        return x + _pick(is_gen, mlp_u, mlp_g, x)

    # --- latent embeddings, written out from the formulas on the stored tensors ---------------------
    def latent_rows(self, x, t, grid):
        e, side = self.ema, self.config.max_latent_size
        half = self.config.timestep_freq_dim // 2
        freqs = torch.exp(-torch.log(torch.tensor(10000.0)) * torch.arange(half) / half)
        args = torch.full((x.shape[0],), float(t))[:, None] * freqs[None]
        sinusoid = torch.cat([args.cos(), args.sin()], -1)
        time = F.linear(F.silu(F.linear(sinusoid, e["time_embedder.mlp.0.weight"], e["time_embedder.mlp.0.bias"])),
                        e["time_embedder.mlp.2.weight"], e["time_embedder.mlp.2.bias"])
        ids = torch.tensor([r * side + col for r in range(grid[0]) for col in range(grid[1])])
        return F.linear(x, e["vae2llm.weight"], e["vae2llm.bias"]) + time + e["latent_pos_embed.pos_embed"][ids]

    def velocity(self, hidden):
        return F.linear(hidden, self.ema["llm2vae.weight"], self.ema["llm2vae.bias"])

    # --- the ViT: transformers SiglipVisionModel with the stored Linear patch embedding -------------
    def siglip(self):
        if "siglip" not in self._cache:
            from transformers import SiglipVisionConfig, SiglipVisionModel

            v = json.loads((self.path / "vit_config.json").read_text())
            cfg = SiglipVisionConfig(**{**v, "num_hidden_layers": v["num_hidden_layers"] - 1}, vision_use_head=False)
            model = SiglipVisionModel(cfg).eval()
            prefix, p, d = "vit_model.vision_model.", cfg.patch_size, cfg.hidden_size
            state = {k[len(prefix):]: t for k, t in self.ema.items() if k.startswith(prefix)}
            key = "embeddings.patch_embedding.weight"
            state[key] = state[key].view(d, p, p, 3).permute(0, 3, 1, 2)
            model.load_state_dict(state, strict=True)
            self._cache["siglip"] = model
        return self._cache["siglip"]

    @torch.no_grad()
    def vit_rows(self, images):
        """LLM rows [sum h*w, D] of ViT images [3, H, W]: our-style packed embeddings through HF's encoder
        with a block-diagonal mask, then the connector and vit_pos_embed from the stored tensors."""
        m, e = self.siglip(), self.ema
        p, side = m.config.patch_size, self.config.vit_max_num_patch_per_side
        embeds, ids, seg = [], [], []
        for i, img in enumerate(images):
            c, hh, ww = img.shape
            patches = torch.einsum("chpwq->hwpqc", img.reshape(c, hh // p, p, ww // p, p)).reshape(-1, p * p * c)
            pid = torch.tensor([r * side + col for r in range(hh // p) for col in range(ww // p)])
            w_lin, b = e["vit_model.vision_model.embeddings.patch_embedding.weight"], e["vit_model.vision_model.embeddings.patch_embedding.bias"]
            embeds.append(F.linear(patches, w_lin, b) + m.embeddings.position_embedding.weight[pid])
            ids.append(pid)
            seg.append(torch.full((len(pid),), i))
        seg = torch.cat(seg)
        mask = torch.zeros(len(seg), len(seg)).masked_fill(seg[:, None] != seg[None, :], float("-inf"))[None, None]
        out = m.post_layernorm(m.encoder(inputs_embeds=torch.cat(embeds)[None], attention_mask=mask).last_hidden_state)[0]
        h = F.gelu(F.linear(out, e["connector.fc1.weight"], e["connector.fc1.bias"]), approximate="tanh")
        return F.linear(h, e["connector.fc2.weight"], e["connector.fc2.bias"]) + e["vit_pos_embed.pos_embed"][torch.cat(ids)]

    # --- the VAE: diffusers AutoencoderKL reading ae.safetensors's FLUX names itself ----------------
    def vae(self, tmp: Path | None = None):
        if "vae" not in self._cache:
            from diffusers import AutoencoderKL

            a = self.config.vae
            cfg_dir = self.path.parent / "diffusers_vae"
            (cfg_dir / "vae").mkdir(parents=True, exist_ok=True)
            cfg = {"_class_name": "AutoencoderKL", "in_channels": 3, "out_channels": 3, "latent_channels": a.z_channels,
                   "down_block_types": ["DownEncoderBlock2D"] * len(a.ch_mult),
                   "up_block_types": ["UpDecoderBlock2D"] * len(a.ch_mult),
                   "block_out_channels": [a.ch * m for m in a.ch_mult], "layers_per_block": a.num_res_blocks,
                   "norm_num_groups": 32, "act_fn": "silu", "sample_size": 64, "scaling_factor": 0.3611,
                   "shift_factor": 0.1159, "use_quant_conv": False, "use_post_quant_conv": False,
                   "mid_block_add_attention": True, "force_upcast": True}
            (cfg_dir / "vae" / "config.json").write_text(json.dumps(cfg))
            self._cache["vae"] = AutoencoderKL.from_single_file(
                str(self.path / "ae.safetensors"), config=str(cfg_dir), subfolder="vae").eval()
        return self._cache["vae"]

    @torch.no_grad()
    def vae_tokens(self, image, eps):
        """Scaled, shifted posterior sample of image [3, H, W] with noise eps, as 64-value tokens."""
        vae = self.vae()
        post = vae.encode(image[None]).latent_dist
        z = (post.mean + torch.exp(0.5 * post.logvar) * eps.view(post.mean.shape) - 0.1159) * 0.3611
        c, hh, ww = z.shape[1:]
        z = z[0].reshape(c, hh // 2, 2, ww // 2, 2)
        return torch.einsum("chpwq->hwpqc", z).reshape(-1, 4 * c)

    @staticmethod
    def scheduler(num_timesteps: int = 50, shift: float = 3.0):
        import numpy as np
        from diffusers import FlowMatchEulerDiscreteScheduler

        sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
        sched.set_timesteps(sigmas=np.linspace(1, 0, num_timesteps)[:-1].tolist())
        return sched


def _pick(is_gen, und, gen, x):
    """Per row: ``gen(x)`` where is_gen, else ``und(x)`` (both computed densely)."""
    a, b = und(x), gen(x)
    return torch.where(is_gen.view(-1, *[1] * (a.dim() - 1)), b, a)


def _heads(proj, norm, head_dim):
    def apply(x):
        h = proj(x).view(x.shape[0], -1, head_dim)
        return h if norm is None else norm(h)

    return apply
