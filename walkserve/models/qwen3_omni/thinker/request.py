"""Messages + decoded media -> everything the thinker needs for one prompt (torch-free; the processor's job).

    build_thinker_request(tokenizer, config, messages, audio=[16 kHz waves], images=[RGB], videos=[VideoInput])
      = chat template -> token ids -> mel features (each clip on its own) and image patches
        -> placeholders expanded to each item's token count -> positions (rope_index)

Media are matched to the message's media parts in order of appearance, per kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from walkserve.models.qwen3_omni.config import Qwen3OmniConfig
from walkserve.models.qwen3_omni.thinker.audio_features import log_mel_clip
from walkserve.models.qwen3_omni.thinker.image_processor import (
    VisionInput,
    VisionPreprocess,
    preprocess_image,
)
from walkserve.models.qwen3_omni.thinker.media_tokens import audio_token_count
from walkserve.models.qwen3_omni.thinker.prompt import expand_placeholders, render_chat
from walkserve.models.qwen3_omni.thinker.rope_index import MediaGrids, RopeIndex, rope_index
from walkserve.models.qwen3_omni.thinker.video import VideoInput
from walkserve.models.tokenizer import Tokenizer


@dataclass(frozen=True)
class ThinkerRequest:
    """One prompt: expanded ids, its positions, and each media item's encoder input (in prompt order)."""

    input_ids: list[int]
    positions: RopeIndex
    audio: list[np.ndarray] = field(default_factory=list)  # mel float32 [n_mels, frames] per clip
    images: list[VisionInput] = field(default_factory=list)
    videos: list[VideoInput] = field(default_factory=list)
    audio_window: int = 800  # mel frames per attention window of the audio encoder (its n_window_infer)
    audio_window_tokens: int = 104  # the thinker rows of one full window


def build_thinker_request(
    tokenizer: Tokenizer,
    config: Qwen3OmniConfig,
    messages: Sequence[Mapping[str, Any]],
    audio: Sequence[np.ndarray] = (),
    images: Sequence[np.ndarray] = (),
    videos: Sequence[VideoInput] = (),
    image_settings: VisionPreprocess | None = None,
    add_generation_prompt: bool = True,
) -> ThinkerRequest:
    """``audio``: mono float32 waves at 16 kHz; ``images``: RGB uint8 [H, W, 3]; ``videos``: preprocessed."""
    text = render_chat(tokenizer, messages, add_generation_prompt=add_generation_prompt)
    ids = tokenizer.encode(text)
    mels = [log_mel_clip(a, config.audio.num_mel_bins if config.audio else 128) for a in audio]
    settings = image_settings or VisionPreprocess()
    vision = [preprocess_image(np.asarray(img), settings) for img in images]
    return thinker_request(ids, config, mels, vision, list(videos))


def thinker_request(ids: Sequence[int], config: Qwen3OmniConfig, audio: Sequence[np.ndarray] = (),
                    images: Sequence[VisionInput] = (), videos: Sequence[VideoInput] = ()) -> ThinkerRequest:
    """From token ids with one placeholder per media item (already tokenized prompt)."""
    n_window = config.audio.n_window if config.audio else 50
    merge = config.vision.spatial_merge_size if config.vision else 2
    expanded = expand_placeholders(
        ids, config.tokens,
        audio=[audio_token_count(m.shape[1], n_window) for m in audio],
        images=[v.token_count(merge) for v in images],
        videos=[v.vision.token_count(merge) for v in videos],
    )
    media = MediaGrids(
        image_grids=[v.grid_thw for v in images],
        video_grids=[v.vision.grid_thw for v in videos],
        video_seconds_per_grid=[v.second_per_grid for v in videos],
        audio_frames=[m.shape[1] for m in audio],
    )
    positions = rope_index(expanded, media, config.tokens, merge, n_window, config.position_id_per_seconds)
    window = config.audio.n_window_infer if config.audio else 800
    return ThinkerRequest(expanded, positions, list(audio), list(images), list(videos), window,
                          audio_token_count(window, n_window))
