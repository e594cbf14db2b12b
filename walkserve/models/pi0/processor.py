"""PolicyProcessor: a robot's observation -> the request the pi0 walks run, and the policy's metadata (torch-free).

Two ways in, one request out:

    POST /v1/generate  task "act", ``inputs``: camera images keyed by camera name (image parts or arrays),
                       ``state`` (an array), ``prompt``, optional ``noise`` [H, 32]
    openpi websocket   an observation dict in openpi's DROID or LIBERO layout (or in ours), mapped by
                       ``observations.map_observation``; errors then name the observation's own keys

Both are validated (``inputs.validate_inputs``: every error an InvalidRequest
naming its field), prepared (state normalised, prompt built and tokenised,
pi0.5's state bins), and laid out as the walks' inputs
(``request.walk_inputs``). Without explicit noise the flow's initial noise is
drawn here, from ``params.seed`` when given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np

from walkserve.core.array import ArrayData
from walkserve.core.errors import InvalidRequest
from walkserve.core.params import Params
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.models.pi0.files import load_policy_files
from walkserve.models.pi0.graph import NOISE
from walkserve.models.pi0.inputs import InputSpec, validate_inputs
from walkserve.models.pi0.observations import (
    DROID_GRIPPER,
    DROID_IMAGES,
    DROID_JOINTS,
    LIBERO_IMAGES,
    LIBERO_STATE,
    map_observation,
    observation_layout,
)
from walkserve.models.pi0.request import prepare_request, walk_inputs
from walkserve.models.processor import ModelCard, Processor

TASK = "act"
OBSERVATION = "observation"  # the payload key of an openpi observation (the websocket route)
_SOURCES = {  # layout -> our input name -> the observation key(s) it came from
    "droid": {**{ours: theirs for theirs, ours in DROID_IMAGES.items()}, "state": f"{DROID_JOINTS} + {DROID_GRIPPER}"},
    "libero": {**{ours: theirs for theirs, ours in LIBERO_IMAGES.items()}, "state": LIBERO_STATE},
    "native": {},
}


class PolicyParams(Params, frozen=True, tag="pi0"):
    """pi0's request parameters: the seed of the server-drawn noise (ignored when the inputs carry ``noise``)."""

    seed: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] | None = None


class PolicyProcessor(Processor):
    params_type = PolicyParams

    def __init__(self, path: str | Path, tokenizer_path: str | Path | None = None, model_id: str | None = None,
                 max_image_pixels: int | None = None):
        self.files = load_policy_files(path, tokenizer_path)
        config = self.files.config
        self.config = config
        self.spec = (InputSpec.from_config(config) if max_image_pixels is None
                     else InputSpec.from_config(config, max_pixels=max_image_pixels))
        self._card = ModelCard(
            id=model_id or Path(path).name, family=config.kind, capabilities=frozenset({TASK, "image_in"}),
            max_context=config.max_prefix_tokens, random_weights=config.random_weights,
            description=f"{config.kind} robot policy: {len(config.cameras)} cameras, state {config.state_dim}, "
                        f"chunks of {config.chunk_size} x {config.action_dim} actions")

    def card(self) -> ModelCard:
        return self._card

    def policy_metadata(self) -> dict[str, Any]:
        """What openpi's websocket server sends first: this policy's shape of observations and actions."""
        c = self.config
        return {"model": self._card.id, "family": c.kind, "cameras": list(c.cameras), "state_dim": c.state_dim,
                "action_horizon": c.chunk_size, "action_dim": c.action_dim, "random_weights": c.random_weights}

    def build_request(self, task: str, payload: dict[str, Any], sampling: SamplingParams,
                      params: PolicyParams) -> RequestSpec:
        if task != TASK:
            raise InvalidRequest(f"this robot policy takes task {TASK!r}, not {task!r}", param="task")
        if OBSERVATION in payload:
            inputs = self._from_observation(payload[OBSERVATION])
        else:
            raw = payload.get("inputs")
            if not isinstance(raw, Mapping) or not raw:
                raise InvalidRequest("inputs must be a non-empty object (cameras, state, prompt)", param="inputs")
            inputs = self._validated(raw)
        return self._spec(inputs, sampling, params)

    def _from_observation(self, observation: Any) -> Any:
        if not isinstance(observation, Mapping):
            raise InvalidRequest("an observation must be a dict", param="observation")
        layout = observation_layout(observation)
        try:
            return self._validated(map_observation(observation, self.config.cameras))
        except InvalidRequest as e:
            name = (e.param or "").removeprefix("inputs.")
            source = _SOURCES[layout].get(name, name)
            raise InvalidRequest(str(e), param=source, code=e.code) from None

    def _validated(self, raw: Mapping[str, Any]) -> Any:
        inputs = validate_inputs(self.spec, raw)
        try:
            return prepare_request(self.files, inputs)
        except InvalidRequest as e:
            raise InvalidRequest(str(e), param=f"inputs.{e.param}" if e.param else "inputs", code=e.code) from None

    def _spec(self, prepared: Any, sampling: SamplingParams, params: PolicyParams) -> RequestSpec:
        c = self.config
        noise = prepared.noise
        if noise is None:  # params.seed, else the request's sampling seed (what /v1/generate's "sampling" sets)
            seed = params.seed if params.seed is not None else sampling.seed
            noise = np.random.default_rng(seed).standard_normal((c.chunk_size, c.max_action_dim), dtype=np.float32)
        arrays = {**walk_inputs(prepared, c.image_tokens), NOISE: np.asarray(noise, dtype=np.float32)}
        inputs = {name: array_data(a) for name, a in arrays.items()}
        sampling = dataclasses.replace(sampling, max_tokens=1)  # nothing is sampled; it only has to be a number
        return RequestSpec(inputs, task=TASK, modalities=("action",), sampling=sampling, params=params)


def array_data(array: np.ndarray) -> ArrayData:
    array = np.ascontiguousarray(array)
    return ArrayData(str(array.dtype), tuple(array.shape), array.tobytes())
