"""What a request is, as the conductor and the workers see it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from walkserve.core.array import ArrayData
from walkserve.core.ids import RequestId, new_request_id
from walkserve.core.params import AnyParams, Params, RequestParams
from walkserve.core.sampling import SamplingParams

# A value that can cross the conductor: an array, or a small msgpack-able scalar/list/str.
Value = ArrayData | int | float | str | bool | list | None


@dataclass
class RequestSpec:
    """One request to a model.

    ``inputs`` holds the request's named inputs (token ids, pixels, audio, a
    voice name ...) that the model's state machine turns into walk inputs.
    ``task`` and ``modalities`` let the state machine choose the first walk.
    ``params`` holds the model's typed settings (horizon, steps, voice ...): an
    instance of the family's ``Params`` struct, which crosses processes as it is.
    ``sampling`` is how every node samples unless ``node_sampling`` names the
    node (Qwen3-Omni's thinker, talker and code predictor each sample their
    own way); the processor fills both, the conductor refuses unknown nodes.
    ``audio_rate`` is the sample rate of the request's audio output (0: none
    or unknown) and ``realtime`` says the client plays that audio as it
    arrives (a streamed speech answer): such a request is admitted by the
    runtime's real-time capacity and its chunks have playback deadlines
    (docs/streaming-capacity.md). The API fills both.
    """

    inputs: dict[str, Value]
    task: str = "generate"
    modalities: tuple[str, ...] = ("text",)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    params: AnyParams = field(default_factory=Params)
    node_sampling: dict[str, SamplingParams] = field(default_factory=dict)
    id: RequestId = field(default_factory=new_request_id)
    arrival_time: float = field(default_factory=time.time)
    audio_rate: int = 0
    realtime: bool = False

    @property
    def request_params(self) -> RequestParams:
        """What the request's stop rules and iteration counts read."""
        return RequestParams(self.params, self.sampling)
