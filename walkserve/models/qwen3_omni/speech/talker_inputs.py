"""What the talker reads at each position: sums of a text part and a codec part (transformers 5.23's rule).

    user turn(s), U positions   text part: text_projection(thinker input embedding)   at text positions
                                           hidden_projection(thinker state entering layer accept_hidden_layer)
                                                                                       at audio/image/video pads
                                codec part: none
    assistant prefix, 9 positions:
        #          0..2                      3..6       7          8
        text:      proj(<|im_start|> assistant \\n)   tts_pad x4  tts_bos    proj(text token 0)
        codec:     0 x3                      nothink, think_bos, think_eos, speaker   codec_pad  codec_bos
    decode step i (writes frame i + 1):
        text:      trailing text i (speech_rules.trailing_text: token i + 1, then tts_eos once, then tts_pad)
        codec:     sum of the 16 code embeddings of frame i (code 0: talker.embed; code g: predictor E[g-1])

"proj" is ``text_projection`` of the thinker's input embedding, and
tts_pad/bos/eos are projected the same way (``TextSpecials``). The first 3
prefix positions need only the prompt (the ``talker_prefill`` walk can run
them with the user turn); positions 3..8 need text token 0 (``talker_last_prefill``,
whose last output samples code 0 of frame 0).

Positions: text-only prompts count 0, 1, 2, ... on all three rope axes; with
media, the talker's prefill positions are ``get_rope_index`` over
``talker_prompt_ids`` (user ids then tts_pad x 9: the thinker's rule on the
talker's own sequence). Decode step i is at ``max(prefill positions) + 1 + i``
on every axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from walkserve.models.qwen3_omni.speech.code_predictor import CodePredictor
from walkserve.models.qwen3_omni.speech.config import SpeechTokens
from walkserve.models.qwen3_omni.speech.rules import ASSISTANT_PREFIX, user_positions
from walkserve.models.qwen3_omni.speech.talker import Talker


@dataclass(frozen=True)
class TextSpecials:
    """text_projection of the thinker embeddings of tts_bos, tts_eos, tts_pad: [D] each (constants of a model)."""

    bos: torch.Tensor
    eos: torch.Tensor
    pad: torch.Tensor

    @classmethod
    def project(cls, talker: Talker, thinker_rows: torch.Tensor) -> TextSpecials:
        """``thinker_rows`` [3, Dt]: the thinker's embedding rows of (tts_bos, tts_eos, tts_pad), in that order."""
        bos, eos, pad = talker.project_text(thinker_rows)  # [3, D]
        return cls(bos, eos, pad)


def media_mask(ids: torch.Tensor, tokens: SpeechTokens) -> torch.Tensor:
    """bool [T]: positions whose talker input is the projected accept-layer state."""
    return torch.isin(ids, torch.tensor(tokens.media_pads, device=ids.device))


def user_inputs(talker: Talker, ids: torch.Tensor, embeds: torch.Tensor, accept: torch.Tensor,
                tokens: SpeechTokens) -> torch.Tensor:
    """Talker inputs [U, D] for the user-turn positions among prompt ``ids`` [L] (thinker ``embeds``, ``accept`` [L, Dt]).

    ``accept`` is the thinker's state entering layer ``accept_hidden_layer``
    (capture its *input*; transformers' ``hidden_states[k]`` is the same tensor
    for k > the deepstack layers); only its media rows are read.
    """
    rows = torch.tensor(user_positions(ids.tolist(), tokens.im_start, tokens.user), dtype=torch.long,
                        device=ids.device)  # [U]
    media = media_mask(ids[rows], tokens)  # [U]
    out = talker.project_text(embeds[rows])  # [U, D]
    if bool(media.any()):
        out[media] = talker.project_hidden(accept[rows[media]])
    return out


def assistant_head(talker: Talker, header_embeds: torch.Tensor) -> torch.Tensor:
    """Prefix positions 0..2 [3, D]: proj(<|im_start|>, assistant, \\n), codec part zero."""
    return talker.project_text(header_embeds)  # [3, D]


def assistant_tail(talker: Talker, first_text: torch.Tensor, speaker: int, specials: TextSpecials,
                   tokens: SpeechTokens) -> torch.Tensor:
    """Prefix positions 3..8 [6, D] from the thinker embedding [Dt] of text token 0 and the speaker's codec id."""
    codec = torch.tensor([tokens.codec_nothink, tokens.codec_think_bos, tokens.codec_think_eos, speaker,
                          tokens.codec_pad, tokens.codec_bos], device=first_text.device)
    text = torch.stack([specials.pad] * 4 + [specials.bos, talker.project_text(first_text[None])[0]])  # [6, D]
    return text + talker.embed(codec)  # [6, D]


def frame_embedding(talker: Talker, predictor: CodePredictor, codes: torch.Tensor) -> torch.Tensor:
    """Sum of a frame's 16 code embeddings: codes [N, 16] -> [N, D] (the codec part of the next decode step)."""
    groups = codes.shape[1]
    out = talker.embed(codes[:, 0])  # [N, D]
    for g in range(1, groups):
        out = out + predictor.embed(predictor.stacked_id(g, codes[:, g]))
    return out


def decode_input(frame_embeds: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """A decode step's input [N, D]: the previous frame's embedding sum plus its trailing text part."""
    return frame_embeds + text


def talker_prompt_ids(ids: Sequence[int], tokens: SpeechTokens) -> list[int]:
    """The talker's own prompt ids for rope positions: the user-turn ids, then tts_pad for the 9 prefix positions."""
    user = [ids[i] for i in user_positions(ids, tokens.im_start, tokens.user)]
    return user + [tokens.tts_pad] * ASSISTANT_PREFIX


def text_positions(n: int, start: int = 0, device: torch.device | str | None = None) -> torch.Tensor:
    """3-axis positions [3, n] of ``n`` text-like positions from ``start`` (all axes equal)."""
    return torch.arange(start, start + n, device=device).expand(3, -1)

