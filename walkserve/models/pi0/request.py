"""From validated policy inputs to what the components consume, and back to robot actions (torch-free).

    PolicyInputs (inputs.py) --prepare_request--> PreparedRequest --components--> chunk [H, 32]
                                                               --finish_actions--> actions [H, action_dim]

``prepare_request`` is the frontend's part of a request: normalise the state,
build and tokenise the prompt (pi0.5 bins the state into it), order the
cameras as the checkpoint lists them, pad pi0's state to 32 for its state
token. ``finish_actions`` slices the model's 32 action dims to the robot's
and unnormalises them. ``walk_inputs`` lays a prepared request out for the
served walks:

    images        every camera's pixels, flattened and concatenated (uint8, or float32 in [0, 1])
    image_shapes  int64 [n, 2]: each camera's [H, W] (resized with padding on the worker)
    tokens        int64 [n * P + L]: 0 for the image rows, then the prompt ids
    embed_rows    int64 [n * P]: the rows the image features replace
    content       int64 [n * P + L, 2]: each image row its camera image's 128-bit key (nonzero), (0, 0) for the
                  prompt rows (the prefix cache's content keys: ``graph.py``, ``common/content_key.py``)
    state         float32 [32] (pi0 only): the normalised, zero-padded state
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from walkserve.models.common.content_key import KEY_COLUMNS, content_key, text_keys
from walkserve.models.pi0.config import PolicyConfig
from walkserve.models.pi0.files import PolicyFiles
from walkserve.models.pi0.inputs import PolicyInputs
from walkserve.models.pi0.prompt import prompt_tokens

IMAGES, IMAGE_SHAPES, TOKENS, EMBED_ROWS, STATE = "images", "image_shapes", "tokens", "embed_rows", "state"
CONTENT = "content"


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


def pack_images(images: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Images [H_i, W_i, 3] -> (their pixels flattened and concatenated, int64 [n, 2] shapes).

    uint8 when every image is uint8; otherwise float32 in [0, 1] (uint8 ones divided by 255, as the
    vision encoder would).
    """
    as_uint8 = all(image.dtype == np.uint8 for image in images)
    parts = [image if as_uint8 or image.dtype != np.uint8 else image.astype(np.float32) / np.float32(255.0)
             for image in images]
    flat = np.concatenate([np.asarray(p, dtype=np.uint8 if as_uint8 else np.float32).reshape(-1) for p in parts])
    shapes = np.array([image.shape[:2] for image in images], dtype=np.int64).reshape(-1, 2)
    return flat, shapes


def image_digest(image: np.ndarray) -> tuple[int, int]:
    """A nonzero 128-bit key (two int64) of an image's dtype, shape and pixels."""
    return content_key("image", image)


def walk_inputs(request: PreparedRequest, tokens_per_image: int) -> dict[str, np.ndarray]:
    """The prefix walk's inputs (module docstring): images, their shapes, the prefix's ids, image rows and content
    keys (+ state)."""
    images, shapes = pack_images(request.images)
    image_rows = len(request.cameras) * tokens_per_image
    digests = np.repeat(np.array([image_digest(i) for i in request.images], dtype=np.int64).reshape(-1, KEY_COLUMNS),
                        tokens_per_image, axis=0)
    out = {IMAGES: images, IMAGE_SHAPES: shapes,
           TOKENS: np.concatenate([np.zeros(image_rows, dtype=np.int64), np.asarray(request.token_ids, dtype=np.int64)]),
           EMBED_ROWS: np.arange(image_rows, dtype=np.int64),
           CONTENT: np.concatenate([digests, text_keys(len(request.token_ids))])}
    if request.state is not None:
        out[STATE] = request.state
    return out
