"""The thinker end to end, offline, over DenseAttention: the oracle for the served walks.

    encode media (the encoders' forward_batch) -> splice features into the embeddings at their
    placeholder rows, deepstack rows alongside -> prefill -> greedy decode (positions next_position + i)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from walkserve.engines.spec import Batch
from walkserve.layers.attention import DenseAttention
from walkserve.models.qwen3_omni.thinker import audio_encoder, vision_encoder
from walkserve.models.qwen3_omni.thinker.prompt import media_spans
from walkserve.models.qwen3_omni.thinker.request import ThinkerRequest
from walkserve.models.qwen3_omni.thinker.weights import ThinkerComponents


def encode_media(components: ThinkerComponents, request: ThinkerRequest) -> dict[str, list]:
    """Encoder outputs per kind, in prompt order: audio [n, D]; image / video (tokens [n, D], deepstack [n, L, D])."""
    out: dict[str, list] = {"audio": [], "image": [], "video": []}
    if request.audio:
        if components.audio is None:
            raise ValueError("the prompt has audio but the checkpoint has no audio encoder")
        items = [{audio_encoder.INPUT_SLOT: torch.from_numpy(np.asarray(m))} for m in request.audio]
        out["audio"] = [o[audio_encoder.OUTPUT_NAME] for o in components.audio.forward_batch(Batch.of(items))]
    for kind, vis in (("image", request.images), ("video", [v.vision for v in request.videos])):
        if not vis:
            continue
        if components.vision is None:
            raise ValueError(f"the prompt has an {kind} but the checkpoint has no vision encoder")
        items = [{vision_encoder.PIXELS_SLOT: torch.from_numpy(v.pixel_values),
                  vision_encoder.GRID_SLOT: torch.tensor(v.grid_thw)} for v in vis]
        out[kind] = [(o[vision_encoder.OUTPUT_NAME], o[vision_encoder.DEEPSTACK_NAME])
                     for o in components.vision.forward_batch(Batch.of(items))]
    return out


def thinker_inputs(components: ThinkerComponents, request: ThinkerRequest,
                   encoded: dict[str, list] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """inputs_embeds [T, D] with media features at their placeholder rows; deepstack [T, L, D] or None."""
    lm = components.lm
    device, dtype = lm.lm_head.weight.device, lm.lm_head.weight.dtype
    encoded = encoded if encoded is not None else encode_media(components, request)
    ids = torch.tensor(request.input_ids, device=device)
    embeds = lm.embed(ids).clone()  # [T, D]
    deepstack = None
    for span in media_spans(request.input_ids, components.config.tokens):
        feature = encoded[span.kind][span.index]
        tokens, deep = (feature, None) if span.kind == "audio" else feature
        if tokens.shape[0] != span.end - span.start:
            raise ValueError(f"{span.kind} {span.index}: {tokens.shape[0]} features for {span.end - span.start} rows")
        embeds[span.start : span.end] = tokens.to(device, dtype)
        if deep is not None and deep.shape[1]:
            if deepstack is None:
                deepstack = embeds.new_zeros(len(ids), deep.shape[1], embeds.shape[1])  # [T, L, D]
            deepstack[span.start : span.end] = deep.to(device, dtype)
    return embeds, deepstack


def positions_tensor(request: ThinkerRequest, device: torch.device | str = "cpu") -> torch.Tensor:
    """[3, T]: int64, or float32 when a video time is fractional."""
    return torch.from_numpy(np.ascontiguousarray(request.positions.positions)).to(device)


@torch.inference_mode()
def prefill_logits(components: ThinkerComponents, request: ThinkerRequest) -> torch.Tensor:
    """Logits of every prompt position, float32 [T, V] (what tests compare with the reference's forward)."""
    lm = components.lm
    embeds, deepstack = thinker_inputs(components, request)
    ids = torch.tensor(request.input_ids, device=embeds.device)
    hidden = lm(ids, positions_tensor(request, embeds.device), DenseAttention("causal"), inputs_embeds=embeds,
                deepstack=deepstack)
    return lm.compute_logits(hidden)


@torch.inference_mode()
def greedy_generate(components: ThinkerComponents, request: ThinkerRequest, max_new_tokens: int,
                    stop_ids: Sequence[int] = ()) -> list[int]:
    """Greedy tokens after the prompt (the stop token included when one is produced)."""
    lm = components.lm
    embeds, deepstack = thinker_inputs(components, request)
    device = embeds.device
    ids = torch.tensor(request.input_ids, device=device)
    attn = DenseAttention("causal", keep=True)
    hidden = lm(ids, positions_tensor(request, device), attn, inputs_embeds=embeds, deepstack=deepstack)
    out: list[int] = []
    token = int(lm.compute_logits(hidden[-1:]).argmax(-1))
    start = request.positions.next_position
    while True:
        out.append(token)
        if token in stop_ids or len(out) >= max_new_tokens:
            return out
        position = torch.full((3, 1), start + len(out) - 1, device=device,
                              dtype=torch.long if isinstance(start, int) else torch.float32)
        attn = DenseAttention("causal", past=attn.kv, keep=True)
        hidden = lm(torch.tensor([token], device=device), position, attn)  # [1, D]
        token = int(lm.compute_logits(hidden).argmax(-1))
