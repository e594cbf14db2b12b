"""transformers' ``PI0ForConditionalGeneration`` on a lerobot-layout pi0 checkpoint: the benchmark's reference.

Imported only by benchmarks and tests (it imports transformers, which walkserve
never does at run time). transformers reads the checkpoint itself (its pi0
conversion renames lerobot's tensor names); this module only builds its config
from ours and lays one prepared request out as its inputs: every camera slot
(an absent one as a -1 image, masked), the image placeholder ids of the present
cameras, then the prompt, and ``sample_actions`` runs the prefix once and the
flow steps over its cache, one request at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from walkserve.models.pi0.config import PolicyConfig
from walkserve.models.pi0.images import camera_pixels
from walkserve.models.pi0.request import PreparedRequest


@dataclass
class ReferenceInputs:
    input_ids: torch.Tensor  # [1, T]
    attention_mask: torch.Tensor  # [1, T]
    pixel_values: torch.Tensor  # [1, cameras, 3, R, R]
    pixel_attention_mask: torch.Tensor  # [1, cameras] bool
    state: torch.Tensor  # [1, 32]
    noise: torch.Tensor  # [1, H, 32]


def load_reference(path: str | Path, device: str = "cpu"):
    """The checkpoint at ``path`` in transformers' PI0ForConditionalGeneration (eval mode, float32, on ``device``)."""
    from transformers import (
        GemmaConfig,
        PaliGemmaConfig,
        PI0Config,
        PI0ForConditionalGeneration,
        SiglipVisionConfig,
    )

    c = PolicyConfig.from_file(path)
    pg, ex, vi = c.paligemma, c.expert, c.vision
    text = GemmaConfig(hidden_size=pg.hidden_size, num_hidden_layers=pg.num_hidden_layers,
                       intermediate_size=pg.intermediate_size, num_attention_heads=pg.num_attention_heads,
                       num_key_value_heads=pg.num_key_value_heads, head_dim=pg.head_dim, vocab_size=c.vocab_size)
    vision = SiglipVisionConfig(hidden_size=vi.hidden_size, intermediate_size=vi.intermediate_size,
                                num_hidden_layers=vi.num_hidden_layers, num_attention_heads=vi.num_attention_heads,
                                image_size=vi.image_size, patch_size=vi.patch_size, vision_use_head=False)
    vlm = PaliGemmaConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=pg.hidden_size,
                          image_token_id=c.vocab_size)
    dit = GemmaConfig(hidden_size=ex.hidden_size, num_hidden_layers=ex.num_hidden_layers,
                      intermediate_size=ex.intermediate_size, num_attention_heads=ex.num_attention_heads,
                      num_key_value_heads=ex.num_key_value_heads, head_dim=ex.head_dim)
    config = PI0Config(vlm_config=vlm.to_dict(), dit_config=dit.to_dict(), chunk_size=c.chunk_size,
                       max_state_dim=c.max_state_dim, max_action_dim=c.max_action_dim,
                       num_inference_steps=c.num_inference_steps)
    model, info = PI0ForConditionalGeneration.from_pretrained(path, config=config, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        raise ValueError(f"{path}: transformers' PI0 did not load the checkpoint cleanly: {bad}")
    return model.eval().to(device)


def reference_inputs(config: PolicyConfig, request: PreparedRequest, pad_to: int | None = None,
                     device: str = "cpu") -> ReferenceInputs:
    """One request as PI0ForConditionalGeneration's batch of one (the prompt right-padded to ``pad_to`` ids)."""
    assert request.state is not None and request.noise is not None, "a pi0 request with explicit noise"
    n, res = len(request.cameras), config.image_resolution[0]
    ids = [config.vocab_size] * (n * config.image_tokens) + request.token_ids
    length = len(ids) + max(0, (pad_to or len(request.token_ids)) - len(request.token_ids))
    slots = torch.full((len(config.cameras), 3, res, res), -1.0)
    present = torch.tensor([cam in request.cameras for cam in config.cameras])
    slots[present] = torch.stack([camera_pixels(image, res) for image in request.images])
    tensors = (torch.tensor([ids + [0] * (length - len(ids))]), torch.tensor([[1] * len(ids) + [0] * (length - len(ids))]),
               slots[None], present[None], torch.from_numpy(request.state)[None], torch.from_numpy(request.noise)[None])
    return ReferenceInputs(*(t.to(device) for t in tensors))


@torch.inference_mode()
def sample_actions(model, x: ReferenceInputs) -> torch.Tensor:
    """The chunk [1, H, 32]: the prefix once, then the flow over its cache (transformers' own loop); on a GPU
    it returns once the device has finished."""
    chunk = model.sample_actions(state=x.state, input_ids=x.input_ids, pixel_values=x.pixel_values, noise=x.noise,
                                 attention_mask=x.attention_mask, pixel_attention_mask=x.pixel_attention_mask)
    _sync(chunk.device)
    return chunk


@torch.inference_mode()
def prefix_only(model, x: ReferenceInputs) -> None:
    """Just the prefix part of ``sample_actions`` (embeddings and the VLM pass that fills the cache)."""
    embeds = model.model.embed_prefix(x.input_ids, x.pixel_values, x.pixel_attention_mask)
    model.model.vlm(inputs_embeds=embeds, attention_mask=x.attention_mask, position_ids=x.attention_mask.cumsum(-1) - 1,
                    token_type_ids=torch.zeros_like(x.attention_mask), use_cache=True)
    _sync(embeds.device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
