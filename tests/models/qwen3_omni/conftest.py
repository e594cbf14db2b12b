"""Shared fixtures for the Qwen3-Omni thinker tests: one transformers reference per session, two checkpoints.

``hf_dir``: written by transformers' own ``save_pretrained`` (sharded, perturbed weights);
``ours_dir``: written by ``walkserve tiny qwen3-omni``'s writer. Our components load from ``hf_dir``.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from walkserve.models.qwen3_omni.thinker.weights import load_thinker_components
from walkserve.models.qwen3_omni.tiny import tiny_hf_config, write_tiny_qwen3_omni
from walkserve.models.qwen3_omni.tiny_tokenizer import ROLE_IDS, TOKEN_IDS

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)

IDS = {k: TOKEN_IDS[t] for k, t in (("im_start", "<|im_start|>"), ("im_end", "<|im_end|>"),
                                    ("audio_start", "<|audio_start|>"), ("audio_end", "<|audio_end|>"),
                                    ("audio_pad", "<|audio_pad|>"), ("vision_start", "<|vision_start|>"),
                                    ("vision_end", "<|vision_end|>"), ("image_pad", "<|image_pad|>"),
                                    ("video_pad", "<|video_pad|>"))}
NL = 10  # "\n" in the byte-level vocabulary


@torch.no_grad()
def perturb(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Make every part numerically visible: the default init leaves audio attention and Code2Wav near zero."""
    g = torch.Generator().manual_seed(seed)
    embeddings = {n + ".weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding)}
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "gamma" or name.endswith("layer_scale.scale"):
            p.copy_(0.1 + 0.4 * torch.rand(p.shape, generator=g))
        elif leaf in ("alpha", "beta"):
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
        elif name in embeddings:
            p.copy_(torch.randn(p.shape, generator=g))
        elif p.ndim == 1:
            base = 1.0 if ("norm" in name or "ln_" in name) and leaf == "weight" else 0.0
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
        else:  # Linear / Conv [out, in, ...]; fused experts [E, out, in]
            fan_in = p.shape[-1] if (p.ndim == 3 and "experts" in name) else p[0].numel()
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
    return model


@pytest.fixture(scope="session")
def hf_model():
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    torch.manual_seed(0)
    config = Qwen3OmniMoeConfig.from_dict(tiny_hf_config())
    return perturb(Qwen3OmniMoeForConditionalGeneration(config).eval())


@pytest.fixture(scope="session")
def hf_dir(hf_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("omni_hf")
    hf_model.save_pretrained(out, max_shard_size="200KB")  # several shards + model.safetensors.index.json
    return out


@pytest.fixture(scope="session")
def ours_dir(tmp_path_factory):
    return write_tiny_qwen3_omni(tmp_path_factory.mktemp("omni_ours"), seed=3)


@pytest.fixture(scope="session")
def components(hf_dir):
    return load_thinker_components(hf_dir, progress=False)


def chat_ids(user: list[int], system: list[int] = (65, 66)) -> list[int]:
    """ChatML ids around ``user`` content ids, ending with the assistant prompt."""
    i = IDS
    return ([i["im_start"], ROLE_IDS["system"], NL, *system, i["im_end"], NL, i["im_start"], ROLE_IDS["user"], NL,
             *user, i["im_end"], NL, i["im_start"], ROLE_IDS["assistant"], NL])


def audio_block() -> list[int]:
    return [IDS["audio_start"], IDS["audio_pad"], IDS["audio_end"]]


def image_block() -> list[int]:
    return [IDS["vision_start"], IDS["image_pad"], IDS["vision_end"]]


def video_block() -> list[int]:
    return [IDS["vision_start"], IDS["video_pad"], IDS["vision_end"]]


def wave(seconds: float, seed: int = 0) -> np.ndarray:
    """A noisy chirp at 16 kHz (structure in time and frequency)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.3 * np.sin(2 * np.pi * (200 + 900 * t) * t) + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)


def rgb(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth colour image with noise, uint8 [h, w, 3]."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([128 + 100 * np.sin(x / 7 + c) * np.cos(y / 9 - c) for c in range(3)], axis=-1)
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


def hf_inputs(request) -> dict:
    """The reference thinker's inputs for one ThinkerRequest (attention_mask included: without it the
    reference silently falls back to 1-D positions)."""
    ids = torch.tensor([request.input_ids])
    kw = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if request.audio:
        frames = max(m.shape[1] for m in request.audio)
        feats = np.zeros((len(request.audio), request.audio[0].shape[0], frames), np.float32)
        mask = np.zeros((len(request.audio), frames), np.int64)
        for b, m in enumerate(request.audio):
            feats[b, :, : m.shape[1]], mask[b, : m.shape[1]] = m, 1
        kw["input_features"], kw["feature_attention_mask"] = torch.from_numpy(feats), torch.from_numpy(mask)
    if request.images:
        kw["pixel_values"] = torch.from_numpy(np.concatenate([v.pixel_values for v in request.images]))
        kw["image_grid_thw"] = torch.tensor([v.grid_thw for v in request.images])
    if request.videos:
        kw["pixel_values_videos"] = torch.from_numpy(np.concatenate([v.vision.pixel_values for v in request.videos]))
        kw["video_grid_thw"] = torch.tensor([v.vision.grid_thw for v in request.videos])
        kw["video_second_per_grid"] = torch.tensor([v.second_per_grid for v in request.videos])
    return kw
