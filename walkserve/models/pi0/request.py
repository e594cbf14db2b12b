"""From validated policy inputs to what the components consume, and back to robot actions (torch-free).

    PolicyInputs (inputs.py) --prepare_request--> PreparedRequest --components--> chunk [H, 32]
                                                               --finish_actions--> actions [H, action_dim]

``prepare_request`` is the frontend's part of a request: normalise the state,
build and tokenise the prompt (pi0.5 bins the state into it), order the
cameras as the checkpoint lists them, pad pi0's state to 32 for its state
token. ``finish_actions`` slices the model's 32 action dims to the robot's
and unnormalises them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from walkserve.models.pi0.config import PolicyConfig
from walkserve.models.pi0.files import PolicyFiles
from walkserve.models.pi0.inputs import PolicyInputs
from walkserve.models.pi0.prompt import prompt_tokens


@dataclass(frozen=True)
class PreparedRequest:
    token_ids: list[int]  # BOS + prompt (+ state bins), unpadded
    cameras: tuple[str, ...]  # the request's cameras in the checkpoint's order (the prefix's order)
    images: tuple[np.ndarray, ...]  # uint8 [H, W, 3] per camera, same order
    state: np.ndarray | None  # pi0: the normalised state zero-padded to max_state_dim; pi0.5: None
    noise: np.ndarray | None  # float32 [H, max_action_dim] or None (the server draws it)

    def prefix_length(self, tokens_per_image: int) -> int:
        return len(self.cameras) * tokens_per_image + len(self.token_ids)


def prepare_request(files: PolicyFiles, inputs: PolicyInputs) -> PreparedRequest:
    config = files.config
    normalized = files.normalizer.state.normalize(inputs.state)  # [state_dim] float32
    ids = prompt_tokens(files.tokenizer, inputs.prompt, normalized if config.state_in_prompt else None,
                        config.tokenizer_max_length)
    cameras = tuple(c for c in config.cameras if c in inputs.images)
    state = None
    if not config.pi05:
        state = np.zeros(config.max_state_dim, dtype=np.float32)
        state[: config.state_dim] = normalized
    return PreparedRequest(ids, cameras, tuple(inputs.images[c] for c in cameras), state, inputs.noise)


def finish_actions(files: PolicyFiles, chunk: np.ndarray) -> np.ndarray:
    """The sampled chunk [H, 32] -> the robot's actions [H, action_dim], unnormalised."""
    config: PolicyConfig = files.config
    return files.normalizer.action.unnormalize(np.asarray(chunk, dtype=np.float32)[:, : config.action_dim])
