"""Typed request parameters and engine options: an unknown or out-of-range one is refused, naming it."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest

from walkserve.core.errors import ConfigError, InvalidRequest
from walkserve.core.options import KVOptions, engine_options
from walkserve.core.params import AnyParams, Params, decode_params, parse_params


class RolloutParams(Params, frozen=True):
    horizon: Annotated[int, msgspec.Meta(ge=1, le=32)] = 4
    stream: bool = False


def test_a_model_params_struct_fills_defaults_and_checks_values():
    assert parse_params(RolloutParams, {"horizon": 8}) == RolloutParams(horizon=8)
    assert parse_params(RolloutParams, None) == RolloutParams()
    with pytest.raises(InvalidRequest) as e:
        parse_params(RolloutParams, {"horizon": 99})
    assert e.value.param == "horizon" and "<= 32" in str(e.value)
    with pytest.raises(InvalidRequest) as e:
        parse_params(RolloutParams, {"horizn": 2})
    assert e.value.param == "horizn" and "unknown parameter 'horizn' (known: horizon, stream)" in str(e.value)
    with pytest.raises(InvalidRequest) as e:
        parse_params(RolloutParams, {"stream": "yes"})
    assert e.value.param == "stream"


def _declare(name: str, tag: str, module: str = __name__) -> type[Params]:
    return msgspec.defstruct(name, [("steps", int, 1)], bases=(Params,), frozen=True, tag=tag, module=module)


def test_decoding_picks_the_one_class_with_the_tag_and_refuses_two_different_ones():
    first, again = _declare("Twice", "test.twice"), _declare("Twice", "test.twice")  # one module imported twice
    got = decode_params(AnyParams, {"family": "test.twice", "steps": 3})
    assert type(got) in (first, again) and got.steps == 3
    _declare("Clash", "test.clash"), _declare("Clash", "test.clash", module="elsewhere")
    with pytest.raises(msgspec.ValidationError, match="several params class with the tag 'test.clash'"):
        decode_params(AnyParams, {"family": "test.clash"})
    with pytest.raises(NotImplementedError):
        decode_params(dict, {})


def test_the_processors_declare_their_params():
    from walkserve.models.llama.processor import TextParams
    from walkserve.models.orpheus.processor import SpeechParams

    assert parse_params(TextParams, {}).add_generation_prompt is True
    with pytest.raises(InvalidRequest, match="speed"):
        parse_params(SpeechParams, {"speed": 9.0})


def test_engine_options_are_typed_and_name_the_bad_one():
    assert engine_options("kv", "lm", {"block_size": 16}, {"num_blocks": 8}) == KVOptions(num_blocks=8)
    with pytest.raises(ConfigError, match=r"component 'lm': kv engine option 'block_size'"):
        engine_options("kv", "lm", {"block_size": 0})
    with pytest.raises(ConfigError, match=r"unknown kv engine option 'blocks'"):
        engine_options("kv", "lm", {"blocks": 4})
    with pytest.raises(ConfigError, match="attention"):
        engine_options("kv", "lm", {"attention": "cuda-magic"})
    with pytest.raises(ConfigError, match="unknown engine kind"):
        engine_options("gpu", "lm", {})
