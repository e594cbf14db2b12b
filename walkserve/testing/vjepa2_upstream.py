"""The released V-JEPA 2 code as a test oracle (the MIT ``cc-vjepa2`` 0.0.3 package, installed ``--no-deps``).

Its ``ac_predictor.py`` equals Meta's official file and its encoder runs
non-square inputs on their own grid (``handle_nonsquare_inputs``). It imports
``timm`` for one function (``drop_path``, a no-op at inference); real timm
would pull a torchvision that is broken beside this torch, so a stub stands in.

``write_released_pickle`` builds both upstream modules at a config's shape with
perturbed random weights and saves them the way Meta ships
``vjepa2-ac-vitg.pt`` (``{"encoder", "predictor"}`` state dicts with
``module.``/``backbone.`` prefixes and fused ``attn.qkv``), so the converter
and our modules can be checked against the modules that wrote the file.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from walkserve.models.vjepa2.config import ACPredictorConfig, EncoderConfig, VJEPA2ACConfig
from walkserve.models.vjepa2.tiny import random_tensors


@contextmanager
def timm_stub() -> Iterator[None]:
    """``from timm.models.layers import drop_path`` resolves (inference only: identity) while the upstream modules
    import, and the stub leaves ``sys.modules`` afterwards: a module without ``__spec__`` left behind makes
    ``importlib.util.find_spec("timm")`` raise in every later importer (diffusers asks it)."""
    if "timm" in sys.modules:
        yield
        return

    def drop_path(x, drop_prob=0.0, training=False, scale_by_keep=True):
        assert drop_prob == 0.0 or not training, "the timm stub supports inference only"
        return x

    names = ("timm", "timm.models", "timm.models.layers")
    timm, models, layers = (types.ModuleType(n) for n in names)
    layers.drop_path, models.layers, timm.models = drop_path, layers, models
    sys.modules.update(dict(zip(names, (timm, models, layers))))
    try:
        yield
    finally:
        for name in names:
            sys.modules.pop(name, None)


def upstream_encoder(config: EncoderConfig) -> nn.Module:
    with timm_stub():
        from vjepa2.models.vision_transformer import VisionTransformer

    v = config.vit
    return VisionTransformer(
        img_size=(config.crop_size, config.crop_size), patch_size=config.patch_size, num_frames=config.frames_per_clip,
        tubelet_size=config.tubelet_size, in_chans=config.in_chans, embed_dim=v.hidden_size, depth=v.num_hidden_layers,
        num_heads=v.num_attention_heads, mlp_ratio=v.intermediate_size / v.hidden_size, qkv_bias=v.qkv_bias,
        norm_layer=partial(nn.LayerNorm, eps=v.layer_norm_eps), use_rope=True, use_sdpa=True,
        handle_nonsquare_inputs=True,
    ).eval()


def upstream_ac_predictor(config: ACPredictorConfig, encoder: EncoderConfig) -> nn.Module:
    with timm_stub():
        from vjepa2.models.ac_predictor import vit_ac_predictor

    return vit_ac_predictor(
        img_size=(encoder.crop_size, encoder.crop_size), patch_size=encoder.patch_size,
        num_frames=config.max_steps * encoder.tubelet_size, tubelet_size=encoder.tubelet_size,
        embed_dim=config.input_size, predictor_embed_dim=config.hidden_size, depth=config.num_hidden_layers,
        num_heads=config.num_attention_heads, action_embed_dim=config.action_dim, use_extrinsics=False,
        is_frame_causal=True, use_rope=True, use_silu=False, wide_silu=True, drop_path_rate=0.0,
    ).eval()


def _randomize(module: nn.Module, seed: int) -> nn.Module:
    state = random_tensors({k: tuple(v.shape) for k, v in module.state_dict().items()}, seed)
    module.load_state_dict(state, strict=True)
    return module


def write_released_pickle(path: str | Path, config: VJEPA2ACConfig, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """Save random upstream modules in the released ``.pt`` layout; returns (encoder, predictor) modules."""
    encoder = _randomize(upstream_encoder(config.encoder), seed)
    predictor = _randomize(upstream_ac_predictor(config.predictor, config.encoder), seed + 1)
    released: dict[str, Any] = {
        "encoder": {"module.backbone." + k: v for k, v in encoder.state_dict().items()},
        "predictor": {"module.backbone." + k: v for k, v in predictor.state_dict().items()},
        "epoch": 315,  # the released files carry training state too; the converter lists and skips it
    }
    torch.save(released, path)
    return encoder, predictor


def upstream_ac_forward(predictor: nn.Module, frames: torch.Tensor, actions: torch.Tensor,
                        states: torch.Tensor) -> torch.Tensor:
    """The released AC forward on one sequence: frames [T, F, E], actions/states [T, 7] -> [T, F, E]."""
    t, f, e = frames.shape
    out = predictor(frames.reshape(1, t * f, e), actions[None], states[None])  # [1, T * F, E]
    return out.view(t, f, e)
