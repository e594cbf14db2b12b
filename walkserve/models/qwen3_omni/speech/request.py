"""A spoken answer's request inputs (torch-free): the talker's rows per prefill piece, its prefix tail, sampling.

    piece k of the thinker's prompt  ->  talk<k>.tokens  codec_pad x n      (the talker's sampling history)
                                         talk<k>.text    thinker ids of the piece's user-turn rows
                                         talk<k>.codes   -1 [n, 16]        (no codec part)
                                         talk<k>.positions [3, n]          the talker's own rope index
    the last text piece also carries the assistant header (<|im_start|> assistant \\n, prefix positions 0..2)
    tail.tokens/text/codes           prefix positions 3..8; text token 0 is -1 until the thinker's first step

The talker's positions are ``rope_index`` over ``talker_prompt_ids`` (the
user-turn ids, then tts_pad x 9) with the prompt's media grids: the thinker's
rule on the talker's own sequence, as transformers does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from walkserve.core.errors import InvalidRequest
from walkserve.core.request import Value
from walkserve.core.sampling import SamplingParams
from walkserve.models.qwen3_omni.config import Qwen3OmniConfig
from walkserve.models.qwen3_omni.graph import WALKS_INPUT, step_key
from walkserve.models.qwen3_omni.speech.config import SpeechConfig
from walkserve.models.qwen3_omni.speech.graph import (
    PREDICTOR,
    PREDICTOR_STEP,
    TAIL,
    TALKER,
    talk_key,
)
from walkserve.models.qwen3_omni.speech.rules import (
    ASSISTANT_PREFIX,
    PREDICTOR_SAMPLING,
    TALKER_SAMPLING,
    assistant_start,
    node_sampling,
    speaker_id,
    user_positions,
)
from walkserve.models.qwen3_omni.thinker.prompt_pieces import array
from walkserve.models.qwen3_omni.thinker.request import ThinkerRequest
from walkserve.models.qwen3_omni.thinker.rope_index import MediaGrids, rope_index

DEFAULT_MAX_FRAMES = 4096  # transformers' talker_max_new_tokens default (327 s of audio)
NODE_KEYS = ("thinker", "talker", "code_predictor")


def speech_inputs(request: ThinkerRequest, inputs: Mapping[str, Value], config: Qwen3OmniConfig,
                  speech: SpeechConfig, voice: str | None) -> dict[str, Value]:
    """The talker's request inputs (module docstring), added to the thinker's ``inputs``."""
    t = speech.tokens
    ids = list(request.input_ids)
    users = user_positions(ids, t.im_start, t.user)
    a0 = assistant_start(ids, t.im_start, t.assistant)
    if a0 + 3 != len(ids):
        raise InvalidRequest("a spoken answer needs the prompt to end with the assistant's turn opening "
                             "(<|im_start|>assistant\\n)", param="messages")
    positions = _talker_positions(ids, users, request, config, speech)  # [3, U + 9]
    talker_row = {row: j for j, row in enumerate(users)} | {a0 + i: len(users) + i for i in range(3)}
    out: dict[str, Value] = {}
    lo, walks = 0, list(inputs[WALKS_INPUT])  # type: ignore[arg-type]
    for k in range(len(walks)):
        hi = lo + inputs[step_key(k, "tokens")].shape[0]  # type: ignore[union-attr]
        rows = [r for r in range(lo, hi) if r in talker_row]
        if k == len(walks) - 1:
            rows += [r for r in (a0, a0 + 1, a0 + 2) if r >= hi]
        if rows:
            out.update(_piece(k, rows, ids, [talker_row[r] for r in rows], positions, t.codec_pad))
        lo = hi
    out.update(_tail(speech, speaker_id(speech.speakers, voice)))
    return out


def _piece(k: int, rows: list[int], ids: list[int], talker_rows: list[int], positions: np.ndarray,
           codec_pad: int) -> dict[str, Value]:
    n = len(rows)
    return {talk_key(k, "tokens"): array(np.full(n, codec_pad, np.int64)),
            talk_key(k, "text"): array(np.asarray([ids[r] for r in rows], np.int64)),
            talk_key(k, "codes"): array(np.full((n, 16), -1, np.int64)),
            talk_key(k, "positions"): array(positions[:, talker_rows])}


def _tail(speech: SpeechConfig, speaker: int) -> dict[str, Value]:
    t, groups = speech.tokens, speech.num_code_groups
    codec = np.asarray([t.codec_nothink, t.codec_think_bos, t.codec_think_eos, speaker, t.codec_pad, t.codec_bos],
                       np.int64)
    codes = np.full((len(codec), groups), -1, np.int64)
    codes[:, 0] = codec
    text = np.asarray([t.tts_pad] * 4 + [t.tts_bos, -1], np.int64)
    return {f"{TAIL}.tokens": array(codec), f"{TAIL}.text": array(text), f"{TAIL}.codes": array(codes)}


def _talker_positions(ids: Sequence[int], users: list[int], request: ThinkerRequest, config: Qwen3OmniConfig,
                      speech: SpeechConfig) -> np.ndarray:
    talker_ids = [ids[i] for i in users] + [speech.tokens.tts_pad] * ASSISTANT_PREFIX
    media = MediaGrids(image_grids=[v.grid_thw for v in request.images],
                       video_grids=[v.vision.grid_thw for v in request.videos],
                       video_seconds_per_grid=[v.second_per_grid for v in request.videos],
                       audio_frames=[m.shape[1] for m in request.audio])
    n_window = config.audio.n_window if config.audio else 50
    merge = config.vision.spatial_merge_size if config.vision else 2
    return rope_index(talker_ids, media, config.tokens, merge, n_window, config.position_id_per_seconds).positions


def speech_sampling(request: SamplingParams, overrides: Mapping[str, Any] | None) -> dict[str, SamplingParams]:
    """Per-node sampling: the card's talker and predictor defaults, greedy when the request is (temperature 0),
    each replaced field by field by ``overrides[node]`` (``node_sampling`` in the request's params)."""
    overrides = dict(overrides or {})
    unknown = [k for k in overrides if k not in NODE_KEYS]
    if unknown:
        raise InvalidRequest(f"node_sampling: unknown node {unknown[0]!r} (nodes: {', '.join(NODE_KEYS)})",
                             param="node_sampling")
    seeded = lambda p: p if request.seed is None else dataclasses.replace(p, seed=request.seed)  # noqa: E731
    talker = seeded(node_sampling(request, TALKER_SAMPLING, overrides.get("talker")))
    predictor = seeded(node_sampling(request, PREDICTOR_SAMPLING, overrides.get("code_predictor")))
    out = {TALKER: talker, PREDICTOR: predictor, PREDICTOR_STEP: predictor}
    if overrides.get("thinker"):
        out["thinker"] = node_sampling(request, request, overrides["thinker"])
    return out


def max_frames(requested: int | None) -> int:
    """The talker loop's bound: ``max_audio_frames`` (default 4096 frames, 12.5 per second)."""
    n = requested or DEFAULT_MAX_FRAMES
    if not isinstance(n, int) or n < 1:
        raise InvalidRequest(f"max_audio_frames must be a positive integer, got {n!r}", param="max_audio_frames")
    return n
