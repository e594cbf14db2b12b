"""TextLMProcessor: completion/chat payloads -> RequestSpec, validation, default stop ids."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from walkserve.core.array import ArrayData
from walkserve.core.errors import InvalidRequest
from walkserve.core.sampling import SamplingParams
from walkserve.models.common.lm_config import LMConfig
from walkserve.models.llama.processor import TextLMProcessor, TextParams
from walkserve.models.llama.tiny import write_tiny


@pytest.fixture(scope="module")
def llama(tiny_dirs):
    return TextLMProcessor(tiny_dirs["llama"], model_id="tiny-llama", random_weights=True)


@pytest.fixture(scope="module")
def qwen(tiny_dirs):
    return TextLMProcessor(tiny_dirs["qwen3"], family="qwen3")


def test_card(llama, qwen, tiny_dirs):
    card = llama.card()
    assert card.id == "tiny-llama" and card.family == "llama" and card.random_weights
    assert card.capabilities == frozenset({"completions", "chat", "generate", "logprobs"})
    assert card.max_context == 1024 == llama.config.max_position_embeddings
    assert qwen.card().id == "qwen3" and qwen.card().random_weights  # from the tiny writer's config marker
    config = json.loads((tiny_dirs["qwen3"] / "config.json").read_text())
    assert config.pop("walkserve_random_weights") is True
    assert not LMConfig.from_hf(config).random_weights  # a real checkpoint has no marker
    assert TextLMProcessor(tiny_dirs["qwen2"]).card().family == "qwen2"  # from config.json by default


def test_completion_prompt(llama):
    spec = llama.build_request("completion", {"prompt": "The river"}, SamplingParams(max_tokens=5), llama.check_params({"add_generation_prompt": False}))
    ids = spec.inputs["prompt_token_ids"]
    assert ids.dtype == "int64" and ids.tolist() == llama.tokenize("The river")
    assert ids.tolist()[0] == llama.tokenizer.bos_token_id
    assert (spec.task, spec.modalities, spec.params) == ("completion", ("text",), TextParams(add_generation_prompt=False))
    assert llama.decode(ids.tolist()) == "The river"


def test_completion_token_ids_and_stop_ids(llama, tiny_dirs):
    sampling = SamplingParams(max_tokens=3, stop_token_ids=(7,))
    spec = llama.build_request("completion", {"prompt_token_ids": [1, 2, 3]}, sampling, llama.check_params({}))
    assert spec.inputs["prompt_token_ids"].tolist() == [1, 2, 3]
    as_prompt = llama.build_request("completion", {"prompt": [4, 5]}, sampling, llama.check_params({}))
    assert as_prompt.inputs["prompt_token_ids"].tolist() == [4, 5]
    eos = llama.config.eos_token_ids
    assert spec.sampling.stop_token_ids == (7, *eos) and len(eos) == 2
    assert spec.sampling.max_tokens == 3
    kept = llama.build_request("completion", {"prompt_token_ids": [1]},
                               SamplingParams(stop_token_ids=(7,), ignore_eos=True), llama.check_params({}))
    assert kept.sampling.stop_token_ids == (7,)


def test_chat_renders_template_and_flattens_parts(qwen):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]}]
    spec = qwen.build_request("chat", {"messages": messages}, SamplingParams(), qwen.check_params({}))
    text = qwen.decode(spec.inputs["prompt_token_ids"].tolist(), skip_special_tokens=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello\nworld<|im_end|>\n" \
                   "<|im_start|>assistant\n"
    im_end = qwen.tokenizer.token_id("<|im_end|>")
    assert im_end in spec.sampling.stop_token_ids
    assert spec.inputs["prompt_token_ids"].tolist().count(im_end) == 2  # special tokens parsed as single ids


@pytest.mark.parametrize("task,payload,sampling,param", [
    ("completion", {"prompt": ""}, {}, "prompt"),
    ("completion", {}, {}, "prompt"),
    ("completion", {"prompt": "a", "prompt_token_ids": [1]}, {}, "prompt"),
    ("completion", {"prompt_token_ids": []}, {}, "prompt_token_ids"),
    ("completion", {"prompt_token_ids": [1, 512]}, {}, "prompt_token_ids"),
    ("completion", {"prompt": [1, -1]}, {}, "prompt_token_ids"),
    ("completion", {"prompt": 5}, {}, "prompt"),
    ("completion", {"prompt_token_ids": [1] * 1000}, {"max_tokens": 25}, "max_tokens"),
    ("completion", {"prompt_token_ids": [1] * 1024}, {"max_tokens": 1}, "prompt"),
    ("chat", {"messages": []}, {}, "messages"),
    ("chat", {"messages": [{"content": "hi"}]}, {}, "messages"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}, {}, "messages"),
    ("chat", {"messages": [{"role": "robot", "content": "hi"}]}, {}, "messages"),  # template's raise_exception
    ("speech", {"input": "hi"}, {}, "task"),
    ("generate", {"inputs": {"prompt": "hi"}, "modalities": ["audio"]}, {}, "modalities"),
    ("generate", {"inputs": "hi"}, {}, "inputs"),
    ("generate", {"inputs": {"text": "hi"}}, {}, "inputs.text"),
    ("generate", {"inputs": {"prompt_token_ids": ArrayData.from_list([1.0], "float32")}}, {}, "inputs.prompt_token_ids"),
    ("generate", {"inputs": {"prompt_token_ids": [1, 512]}}, {}, "prompt_token_ids"),
])
def test_invalid_requests(llama, task, payload, sampling, param):
    with pytest.raises(InvalidRequest) as e:
        llama.build_request(task, payload, SamplingParams(**sampling), llama.check_params({}))
    assert e.value.param == param


def test_generate_task_takes_a_prompt_or_token_ids(llama):
    """The native route's task: the same prompt ids as a completion, from a string, a list or an int array."""
    sampling = SamplingParams(max_tokens=4)
    want = llama.build_request("completion", {"prompt": "The river"}, sampling, llama.check_params({}))
    ids = want.inputs["prompt_token_ids"].tolist()
    payloads = [
        {"inputs": {"prompt": "The river"}, "modalities": ["text"]},
        {"inputs": {"prompt_token_ids": ids}},
        {"inputs": {"prompt_token_ids": ArrayData.from_list(ids, "int32")}, "modalities": ["text"]},
    ]
    for payload in payloads:
        spec = llama.build_request("generate", payload, sampling, llama.check_params({"add_generation_prompt": False}))
        assert spec.inputs["prompt_token_ids"].tolist() == ids
        assert (spec.task, spec.modalities, spec.params) == ("generate", ("text",), TextParams(add_generation_prompt=False))
        assert spec.sampling == want.sampling  # the model's stop ids merged in the same way


def test_chat_without_template_is_invalid(tmp_path):
    import json

    path = write_tiny("qwen2", tmp_path / "m")
    config = json.loads((path / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidRequest, match="no chat template") as e:
        TextLMProcessor(path).build_request("chat", {"messages": [{"role": "user", "content": "x"}]},
                                            SamplingParams(), TextParams())
    assert e.value.param == "messages"


def test_processor_is_torch_free():
    code = ("import sys; from walkserve.models.llama.processor import TextLMProcessor; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_max_tokens_a_request_gets_the_room_left_in_the_context(llama):
    """What most OpenAI clients send (no max_tokens): the request runs to a stop or to the end of the context."""
    messages = [{"role": "user", "content": "hi"}]
    spec = llama.build_request("chat", {"messages": messages}, SamplingParams(max_tokens=None), llama.check_params({}))
    assert spec.sampling.max_tokens == 1024 - len(spec.inputs["prompt_token_ids"].tolist())
    spec = llama.build_request("completion", {"prompt_token_ids": [1] * 1000}, SamplingParams(max_tokens=None), llama.check_params({}))
    assert spec.sampling.max_tokens == 24
