"""SamplingParams: validation at construction, and every field crosses the wire."""

from __future__ import annotations

import dataclasses

import pytest

from walkserve.core.errors import InvalidRequest
from walkserve.core.sampling import SamplingParams

EVERY_FIELD = SamplingParams(
    temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5,
    frequency_penalty=-0.5, max_tokens=33, min_tokens=2, seed=7, stop_token_ids=(3, 4), stop=("\n",),
    ignore_eos=True, logprobs=2, prompt_logprobs=1, logit_bias=((9, -1.5),),
)


def over_the_wire(sampling: SamplingParams) -> tuple[SamplingParams, SamplingParams]:
    """``sampling`` as a worker gets it: the request's and a node's own, in a StartWalk through the codec."""
    from walkserve.core.params import Params
    from walkserve.protocol import messages as m
    from walkserve.protocol.codec import decode, encode

    [got] = decode(encode("t", [m.StartWalk("r", "w", {}, {}, Params(), sampling, {"lm": sampling})]), "t")
    return got.sampling, got.node_sampling["lm"]


def test_every_field_crosses_to_the_workers():
    names = {f.name for f in dataclasses.fields(SamplingParams)}
    request, node = over_the_wire(EVERY_FIELD)
    assert request == EVERY_FIELD and node == EVERY_FIELD  # nothing dropped on the way to the workers
    assert type(request.stop_token_ids) is tuple and type(request.logit_bias[0]) is tuple
    assert all(getattr(EVERY_FIELD, n) != getattr(SamplingParams(), n) for n in names)  # each one checked


@pytest.mark.parametrize("field, value", [("temperature", -1.0), ("top_p", 0.0), ("top_k", -1), ("max_tokens", 0),
                                          ("seed", -1), ("logprobs", 21), ("prompt_logprobs", 21), ("stop_token_ids", (-1,)),
                                          ("logit_bias", ((1, 200.0),)), ("logit_bias", ((1, 1.0), (1, 2.0)))])
def test_invalid_values_name_their_field(field, value):
    with pytest.raises(InvalidRequest) as err:
        SamplingParams(**{field: value})
    assert err.value.param == field
