"""Orpheus TTS as a plain offline loop over the reference libraries: transformers generate + the snac package.

Imported only by tests and benchmarks (it imports transformers and snac,
which walkserve never does at run time). It is the independent oracle of the
served pipeline (``models/orpheus``): the same checkpoint directories, the
same prompt ids, the same audio-token constraint, the same documented
emission rule and noise seeds, but none of walkserve's model, engine or codec
code:

  1. ``generate_audio_tokens``: ``LlamaForCausalLM.generate`` with a
     LogitsProcessor that allows only the 4096 ids valid for the next stream
     position (and END_OF_SPEECH); the stop token is dropped.
  2. ``decode_stream``: the official streaming decoder's loop (once 28
     tokens exist and every 7 more, decode the last 28 and keep frame 1 of
     them), extended as docs/models/orpheus.md says: the first window also
     keeps frame 0, the end re-decodes the last window for its frames 2 and 3
     (or, with no full window, decodes every complete frame at once). SNAC's
     noise comes from the global RNG seeded per window with
     ``window_seed(base_seed, first_token)``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

from walkserve.models.orpheus.emission import window_seed

END_OF_SPEECH = 128258
AUDIO_BASE = 128266  # <custom_token_10>: code 0 at frame position 0
CODES = 4096
FRAME = 7
WINDOW = 28
FRAME_SAMPLES = 2048


class AudioPositionMask(LogitsProcessor):
    """Masks every id but the audio ids of the next stream position and END_OF_SPEECH."""

    def __init__(self, prompt_len: int):
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        position = (input_ids.shape[1] - self.prompt_len) % FRAME
        keep = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
        keep[AUDIO_BASE + position * CODES : AUDIO_BASE + (position + 1) * CODES] = True
        keep[END_OF_SPEECH] = True
        return scores.masked_fill(~keep, float("-inf"))


@dataclass
class OfflineSpeech:
    tokens: list[int]  # audio tokens, the stop token excluded
    stopped: bool  # a stop id ended generation (else max_new_tokens did)
    audio: torch.Tensor  # float32 [samples]


def load_lm(lm_dir: str | Path):
    return AutoModelForCausalLM.from_pretrained(lm_dir, dtype=torch.float32).eval()


def load_snac(snac_dir: str | Path):
    import snac

    snac_dir = Path(snac_dir)
    model = snac.SNAC(**json.loads((snac_dir / "config.json").read_text()))
    model.load_state_dict(load_file(str(snac_dir / "model.safetensors")), strict=True)
    return model.eval()


@torch.no_grad()
def generate_audio_tokens(
    lm, prompt: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int], repetition_penalty: float = 1.0
) -> tuple[list[int], bool]:
    """Greedy constrained generation; returns (tokens without the stop token, whether a stop id ended it)."""
    out = lm.generate(
        torch.tensor([list(prompt)]),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=list(stop_ids),
        pad_token_id=0,
        repetition_penalty=repetition_penalty,
        logits_processor=LogitsProcessorList([AudioPositionMask(len(prompt))]),
    )[0, len(prompt) :].tolist()
    if out and out[-1] in stop_ids:
        return out[:-1], True
    return out, False


@torch.inference_mode()
def decode_window(snac_model, tokens: Sequence[int], first_frame: int, base_seed: int) -> torch.Tensor:
    """SNAC-decode whole frames starting at frame ``first_frame``; returns float32 [frames * 2048]."""
    ids = torch.tensor(list(tokens), dtype=torch.int64)
    codes = ids - AUDIO_BASE - (torch.arange(len(ids)) % FRAME) * CODES  # frames start at multiples of 7
    assert bool(((codes >= 0) & (codes < CODES)).all()), f"invalid audio tokens in window at frame {first_frame}"
    frames = codes.view(-1, FRAME)  # [F, 7]
    levels = [frames[:, [0]], frames[:, [1, 4]], frames[:, [2, 3, 5, 6]]]
    torch.manual_seed(window_seed(base_seed, FRAME * first_frame))
    return snac_model.decode([lv.reshape(1, -1) for lv in levels])[0, 0].float()


def decode_stream(snac_model, tokens: Sequence[int], base_seed: int) -> torch.Tensor:
    """Audio of a whole token stream, decoded the way a streaming client receives it."""
    pieces, windows = [], 0
    for n in range(WINDOW, len(tokens) + 1):
        if (n - WINDOW) % FRAME:
            continue
        first = n // FRAME - WINDOW // FRAME
        wave = decode_window(snac_model, tokens[FRAME * first : n], first, base_seed)
        pieces.append(wave[: 2 * FRAME_SAMPLES] if first == 0 else wave[FRAME_SAMPLES : 2 * FRAME_SAMPLES])
        windows += 1
    complete = len(tokens) // FRAME
    if windows:
        first = windows - 1
        wave = decode_window(snac_model, tokens[FRAME * first : FRAME * first + WINDOW], first, base_seed)
        pieces.append(wave[2 * FRAME_SAMPLES : 4 * FRAME_SAMPLES])
    elif complete:
        pieces.append(decode_window(snac_model, tokens[: FRAME * complete], 0, base_seed))
    return torch.cat(pieces) if pieces else torch.zeros(0)


def offline_speech(
    lm,
    snac_model,
    prompt: Sequence[int],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    base_seed: int,
    repetition_penalty: float = 1.0,
) -> OfflineSpeech:
    """Generate, then decode: the whole Orpheus request offline."""
    tokens, stopped = generate_audio_tokens(lm, prompt, max_new_tokens, stop_ids, repetition_penalty)
    return OfflineSpeech(tokens, stopped, decode_stream(snac_model, tokens, base_seed))
