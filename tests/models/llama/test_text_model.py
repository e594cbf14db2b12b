"""The served text LM: its walks through the ReferenceExecutor on a real KVCacheEngine, against transformers."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import walkserve.models.builtin  # noqa: F401  (registers the families)
from walkserve.core.errors import ConfigError
from walkserve.core.finish import FinishReason
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.engines.kv.engine import KVCacheEngine
from walkserve.engines.registry import build_engine
from walkserve.engines.spec import BuildContext
from walkserve.graph.render import to_mermaid
from walkserve.models.base import ModelRef
from walkserve.models.llama.model import DEFAULT_KV_OPTIONS, TextLM
from walkserve.models.registry import load_model
from walkserve.testing.reference import ReferenceExecutor

torch.set_num_threads(1)
CPU = BuildContext(rank=0, device="cpu", dtype="float32")
PROMPTS = [[5, 17, 300, 41, 9, 77, 120], [88, 3, 250], [401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411]]


class Served:
    """One family's model, its KV engine and the transformers oracle on the same checkpoint."""

    def __init__(self, arch: str, path, oracle):
        self.model = load_model(ModelRef(arch, str(path)))
        self.engine = build_engine(self.model.components()["lm"], CPU, {"num_blocks": 64})
        self.executor = ReferenceExecutor(self.model.graph(), {"lm": self.engine})
        self.processor = self.model.processor()
        self.hf = oracle.hf_model(path)

    def request(self, prompt: list[int], **sampling) -> RequestSpec:
        params = SamplingParams(temperature=0.0, **sampling)
        return self.processor.build_request("completion", {"prompt_token_ids": prompt}, params, self.processor.check_params({}))

    def run(self, spec: RequestSpec) -> tuple[list[int], object]:
        result = self.executor.run(spec)
        assert result.error is None, result.error
        self.engine.release(spec.id)
        return [int(v.reshape(-1)[0]) for v in result.stream("text")], result

    @torch.no_grad()
    def expected(self, spec: RequestSpec) -> list[int]:
        """transformers greedy generate with the request's stop ids, max_tokens and min_tokens."""
        prompt = spec.inputs["prompt_token_ids"].tolist()
        s = spec.sampling
        out = self.hf.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=s.max_tokens, min_new_tokens=s.min_tokens,
            eos_token_id=list(s.stop_token_ids), pad_token_id=0,
        )[0, len(prompt):].tolist()
        return out[:-1] if out and out[-1] in s.stop_token_ids else out


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def served(request, tiny_dirs, oracle) -> Served:
    return Served(request.param, tiny_dirs[request.param], oracle)


def test_greedy_tokens_match_transformers(served):
    for prompt in PROMPTS:
        spec = served.request(prompt, max_tokens=12)
        tokens, result = served.run(spec)
        assert tokens == served.expected(spec)
        assert result.walks == ["prefill", "decode"]
        assert result.finish == (FinishReason.LENGTH if len(tokens) == 12 else FinishReason.STOP)
    assert served.engine.state_count() == 0


def test_max_tokens_bounds_the_loop(served):
    for n in (1, 5):
        tokens, result = served.run(served.request(PROMPTS[0], max_tokens=n, ignore_eos=True))
        assert len(tokens) == n and result.finish == FinishReason.LENGTH


def test_stop_token_ends_without_being_streamed(served):
    free = served.request(PROMPTS[1], max_tokens=16, ignore_eos=True)
    reference = served.expected(free)
    stop_at = next(i for i in range(3, 16) if reference[i] not in reference[:i])
    stop = reference[stop_at]
    spec = served.request(PROMPTS[1], max_tokens=16, ignore_eos=True, stop_token_ids=(stop,))
    tokens, result = served.run(spec)
    assert tokens == reference[:stop_at]
    assert result.finish == FinishReason.STOP


def test_min_tokens_defers_the_stop(served):
    free = served.request(PROMPTS[1], max_tokens=16, ignore_eos=True)
    reference = served.expected(free)
    stop = reference[2]  # would stop after two tokens
    spec = served.request(PROMPTS[1], max_tokens=16, ignore_eos=True, stop_token_ids=(stop,), min_tokens=6)
    tokens, _ = served.run(spec)
    assert len(tokens) >= 6 and stop not in tokens[:6]
    assert tokens == served.expected(spec)


def test_one_token_prompt_goes_straight_to_decode(served):
    spec = served.request([42], max_tokens=8)
    tokens, result = served.run(spec)
    assert result.walks == ["decode"]
    assert tokens == served.expected(spec)


def test_component_spec(tiny_dirs):
    path = tiny_dirs["qwen2"]
    model = load_model(ModelRef("qwen2", str(path), {"kv": {"block_size": 8}}))
    spec = model.components()["lm"]
    assert (spec.engine, spec.stateful, spec.options["block_size"]) == ("kv", True, 8)
    assert spec.options == model.kv_options() == {**DEFAULT_KV_OPTIONS, "block_size": 8}
    assert spec.weight_bytes == (path / "model.safetensors").stat().st_size - _header_bytes(path)
    engine = build_engine(spec, CPU, {"num_blocks": 8})
    assert isinstance(engine, KVCacheEngine) and engine.block_manager.block_size == 8
    card = model.processor().card()
    assert card.random_weights and card.family == "qwen2" and card.capabilities == {"completions", "chat", "generate", "logprobs"}


def _header_bytes(path) -> int:
    with open(path / "model.safetensors", "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def test_graph_builds_without_a_checkpoint_and_renders():
    model = load_model(ModelRef("llama"))
    graph = model.graph()
    assert list(graph.walks) == ["prefill", "prefill_logprobs", "decode", "decode_logprobs"]
    assert graph.node_names() == ["lm"]
    assert "client: text" in to_mermaid(graph)
    assert model.default_placement()["nodes"] == [{"nodes": ["lm"], "ranks": [0]}]
    with pytest.raises(ConfigError, match="needs a checkpoint directory"):
        model.components()


def test_bad_checkpoint_path(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        TextLM(ModelRef("llama", str(tmp_path)))


def test_request_without_prompt_fails_cleanly(served):
    spec = dataclasses.replace(served.request([1, 2], max_tokens=2), inputs={})
    result = served.executor.run(spec)
    assert result.finish == FinishReason.ERROR and "prompt_token_ids" in result.error
