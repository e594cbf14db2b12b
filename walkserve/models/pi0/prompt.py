"""The prompt tokens of pi0 and pi0.5, as openpi's PaligemmaTokenizer builds them (torch-free).

    clean(p)   = p.strip() with "_" and "\\n" replaced by spaces (case kept)
    pi0.5      BOS + tokens("Task: {clean(p)}, State: {b_1 b_2 ... b_n};\\nAction: ")
               b_i = bin of the i-th native (unpadded) state dim after normalisation
    pi0        BOS + tokens(clean(p)) + tokens("\\n")     (also pi0.5 without discrete state input)

bin(x) = digitize(x, linspace(-1, 1, 257)[:-1]) - 1, i.e. floor((x + 1) * 128)
capped at 255, and -1 below -1 (x = 0.5 -> 192). A prompt longer than the
checkpoint's ``tokenizer_max_length`` is refused (openpi truncates it).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from walkserve.core.errors import InvalidRequest

BIN_EDGES = np.linspace(-1.0, 1.0, 256 + 1)[:-1]


class Encoder(Protocol):
    def encode(self, text: str, add_bos: bool = False) -> list[int]: ...


def clean_prompt(prompt: str) -> str:
    return prompt.strip().replace("_", " ").replace("\n", " ")


def state_bins(normalized_state: np.ndarray) -> list[int]:
    """One bin in -1..255 per state dim (the state normalised to [-1, 1], float32 as the model sees it)."""
    return [int(b) for b in np.digitize(np.asarray(normalized_state, dtype=np.float32), BIN_EDGES) - 1]


def pi05_prompt(prompt: str, bins: list[int]) -> str:
    return f"Task: {clean_prompt(prompt)}, State: {' '.join(map(str, bins))};\nAction: "


def prompt_tokens(tokenizer: Encoder, prompt: str, normalized_state: np.ndarray | None, max_tokens: int) -> list[int]:
    """The prompt's ids (BOS first, unpadded); ``normalized_state`` given = the pi0.5 discrete-state format.

    Raises InvalidRequest (param "prompt") past ``max_tokens``.
    """
    if normalized_state is not None:
        ids = tokenizer.encode(pi05_prompt(prompt, state_bins(normalized_state)), add_bos=True)
    else:
        ids = tokenizer.encode(clean_prompt(prompt), add_bos=True) + tokenizer.encode("\n")
    if len(ids) > max_tokens:
        raise InvalidRequest(
            f"the prompt takes {len(ids)} tokens (with the state and the template); this checkpoint reads at most "
            f"{max_tokens}", param="prompt", code="prompt_too_long")
    return ids
