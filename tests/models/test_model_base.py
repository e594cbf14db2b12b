"""What every family inherits from ``models.base.Model``: the KV options rule, the params type, the processor."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from walkserve.core.params import Params, parse_params
from walkserve.models.base import Model, ModelRef


class Plain(Model):
    def __init__(self, ref: ModelRef):
        self.ref = ref

    def graph(self):
        raise NotImplementedError

    def components(self):
        return {}


class Paged(Plain):
    def kv_defaults(self) -> Mapping[str, Any]:
        return {"block_size": 16, "max_batch_tokens": 64}


class Horizon(Params, frozen=True, tag="test.horizon"):
    horizon: int = 2


class WithParams(Plain):
    params_type = Horizon


def test_kv_options_lay_the_kv_model_option_over_the_family_defaults():
    assert Paged(ModelRef("p")).kv_options() == {"block_size": 16, "max_batch_tokens": 64}
    given = Paged(ModelRef("p", options={"kv": {"block_size": 8, "num_blocks": 100}, "other": 1}))
    assert given.kv_options() == {"block_size": 8, "max_batch_tokens": 64, "num_blocks": 100}
    assert Plain(ModelRef("q", options={"kv": {"num_blocks": 3}})).kv_options() == {"num_blocks": 3}
    assert Plain(ModelRef("q")).kv_options() == {}


def test_the_default_processor_checks_the_models_params_type():
    processor = WithParams(ModelRef("w")).processor()
    assert processor.check_params({"horizon": 5}) == Horizon(horizon=5)
    assert type(Plain(ModelRef("q")).processor().check_params({})) is Params
    assert parse_params(Plain.params_type, {}) == Params()
