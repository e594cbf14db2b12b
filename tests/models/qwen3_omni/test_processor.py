"""The Qwen3-Omni processor: messages as given, the checkpoint's tokenizer files, bad input named, family detection."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest

from tests.models.qwen3_omni.conftest import IDS, rgb, wave
from walkserve.core.array import ArrayData
from walkserve.core.errors import InvalidRequest
from walkserve.core.sampling import SamplingParams
from walkserve.models.base import ModelRef
from walkserve.models.qwen3_omni.model import Qwen3OmniThinker
from walkserve.models.qwen3_omni.processor import Qwen3OmniProcessor
from walkserve.models.qwen3_omni.thinker.image_processor import VisionPreprocess
from walkserve.models.qwen3_omni.thinker.media_inputs import MediaSettings, convert_messages
from walkserve.models.qwen3_omni.tiny_tokenizer import ROLE_IDS

SAMPLING = SamplingParams(max_tokens=4)


def _array(x: np.ndarray) -> ArrayData:
    return ArrayData(str(x.dtype), x.shape, np.ascontiguousarray(x).tobytes())


@pytest.fixture(scope="module")
def processor(ours_dir) -> Qwen3OmniProcessor:
    return Qwen3OmniProcessor(ours_dir)


def _error(processor, task: str, payload: dict, sampling: SamplingParams = SAMPLING) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as e:
        processor.build_request(task, payload, sampling, processor.check_params({}))
    return e.value


def test_messages_are_used_as_given(processor):
    """No system prompt of ours: the template renders exactly the messages sent."""
    spec = processor.build_request("chat", {"messages": [{"role": "user", "content": "Hi"}]}, SAMPLING, processor.check_params({}))
    ids = spec.inputs["prompt_token_ids"].tolist()
    assert ids[:3] == [IDS["im_start"], ROLE_IDS["user"], 10] and ROLE_IDS["system"] not in ids
    card = processor.card()
    assert {"chat", "completions", "generate", "logprobs", "image_in", "audio_in", "video_in"} <= card.capabilities
    assert "audio_out" not in card.capabilities and card.family == "qwen3-omni"


@pytest.mark.parametrize(("task", "payload", "param"), [
    ("chat", {"messages": [{"role": "user", "content": "Hi"}], "modalities": ["text", "audio"]}, "modalities"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "image", "image": _array(rgb(2, 900))}]}]},
     "messages[0].content[0]"),  # aspect ratio over 200
    ("chat", {"messages": [{"role": "user", "content": [{"type": "audio", "audio": _array(np.zeros(10, np.float32)),
                                                         "sample_rate": 16000}]}]}, "messages[0].content[0]"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "video", "video": b"not a video"}]}]},
     "messages[0].content[0]"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "file"}]}]}, "messages[0].content[0]"),
    ("generate", {"inputs": {"prompt": "Hi", "volume": 3}}, "inputs.volume"),
    ("generate", {"inputs": {"prompt_token_ids": [1, 99999]}}, "inputs.prompt_token_ids"),
    ("completion", {"prompt": "x" * 5000}, "prompt"),
])
def test_bad_input_names_the_field(processor, task, payload, param):
    assert _error(processor, task, payload).param == param


def test_a_prompt_too_long_for_the_context_is_refused_untokenized(processor, monkeypatch):
    monkeypatch.setattr(processor.tokenizer, "encode", lambda *a, **k: pytest.fail("tokenized"))
    text = "The river flows. " * 200_000
    for task, payload, param in (("completion", {"prompt": text}, "prompt"),
                                 ("chat", {"messages": [{"role": "user", "content": text}]}, "messages"),
                                 ("generate", {"inputs": {"prompt": text}}, "inputs")):
        error = _error(processor, task, payload)
        assert (error.param, error.code) == (param, "context_length_exceeded")
        assert str(error).startswith("the prompt has at least")


def test_context_and_prompt_logprobs(processor):
    assert _error(processor, "completion", {"prompt": "Hi there"}, SamplingParams(max_tokens=5000)).param == "max_tokens"
    assert _error(processor, "completion", {"prompt": "Hi there"}, SamplingParams(prompt_logprobs=1)).param == "echo"


def test_generate_takes_media_inputs_and_token_ids(processor):
    audio = _array(wave(0.6))
    spec = processor.build_request("generate", {"inputs": {"audio": audio, "audio_sample_rate": 16000,
                                                           "image": _array(rgb(32, 32)), "prompt": "What?"}},
                                   SAMPLING, processor.check_params({}))
    assert spec.inputs["walks"] == ["prefill_media"]  # one clip, one image and the text: one thinker pass
    spec = processor.build_request("generate", {"inputs": {"prompt_token_ids": [5, 6, 7]}}, SAMPLING, processor.check_params({}))
    assert spec.inputs["prompt_token_ids"].tolist() == [5, 6, 7] and spec.inputs["walks"] == ["prefill_text"]


def test_a_checkpoint_without_vision_refuses_images(ours_dir, tmp_path):
    """-Captioner style: no vision_config, so no image_in / video_in and an image part is a 400 naming it."""
    captioner = tmp_path / "captioner"
    shutil.copytree(ours_dir, captioner, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((captioner / "config.json").read_text())
    del config["thinker_config"]["vision_config"]
    (captioner / "config.json").write_text(json.dumps(config))
    p = Qwen3OmniProcessor(captioner)
    assert "image_in" not in p.card().capabilities and "audio_in" in p.card().capabilities
    messages = [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image", "image": _array(rgb(32, 32))}]}]
    e = _error(p, "chat", {"messages": messages})
    assert e.param == "messages[0].content[1]" and "no vision encoder" in str(e)
    from walkserve.models.base import ModelRef
    from walkserve.models.qwen3_omni.model import Qwen3OmniThinker

    assert "prefill_vision" not in Qwen3OmniThinker(ModelRef("qwen3-omni", str(captioner))).graph().walks


def test_a_video_longer_than_the_cap_is_refused():
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=4)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for i in range(12):  # 3 s
            container.mux(stream.encode(av.VideoFrame.from_ndarray(rgb(32, 32, i), format="rgb24")))
        container.mux(stream.encode())
    settings = MediaSettings(VisionPreprocess(), VisionPreprocess(min_pixels=32 * 32, max_pixels=64 * 64),
                             max_video_seconds=2.0)
    messages = [{"role": "user", "content": [{"type": "video", "video": buffer.getvalue()}]}]
    with pytest.raises(InvalidRequest, match="longer than 2 s") as e:
        convert_messages(messages, settings)
    assert e.value.param == "messages[0].content[0]"
    ok = convert_messages(messages, MediaSettings(VisionPreprocess(), settings.video))
    assert ok.videos[0].vision.grid_thw[0] == 3  # 3 s at 2 fps: 6 frames, 3 temporal groups


def test_vocab_and_merges_give_the_tokenizer_json_ids(ours_dir, tmp_path):
    """A release ships vocab.json + merges.txt (+ added tokens in tokenizer_config.json): the same ids."""
    from walkserve.models.qwen3_omni.tokenizer_files import load_tokenizer

    legacy = tmp_path / "legacy"
    legacy.mkdir()
    spec = json.loads((ours_dir / "tokenizer.json").read_text())
    (legacy / "vocab.json").write_text(json.dumps(spec["model"]["vocab"]))
    merges = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
    (legacy / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    config = json.loads((ours_dir / "tokenizer_config.json").read_text())
    template = config.pop("chat_template")
    config["added_tokens_decoder"] = {str(t["id"]): {"content": t["content"], "special": t["special"]}
                                      for t in spec["added_tokens"]}
    (legacy / "tokenizer_config.json").write_text(json.dumps(config))
    (legacy / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    ours, theirs = load_tokenizer(ours_dir), load_tokenizer(legacy)
    text = "<|im_start|>user\nHello wörld, 12 cats!<|im_end|>\n<|audio_start|><|audio_pad|><|audio_end|>"
    assert theirs.encode(text, add_special_tokens=False) == ours.encode(text, add_special_tokens=False)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    assert theirs.apply_chat_template(messages) == ours.apply_chat_template(messages)


def test_serve_detects_the_family_and_tiny_is_servable(ours_dir, tmp_path, capsys):
    from walkserve.cli.main import main
    from walkserve.cli.serve_target import resolve_target

    target = resolve_target(None, str(ours_dir), None)
    assert target.family == "qwen3-omni" and target.detected
    assert main(["tiny", "qwen3-omni", str(tmp_path / "omni")]) == 0
    assert f"walkserve serve qwen3-omni --model-path {tmp_path / 'omni'}" in capsys.readouterr().out


def test_a_placement_without_the_talker_serves_text_only(ours_dir):
    """A speech checkpoint: the full graph; under a thinker-only placement, the thinker's graph and card."""
    model = Qwen3OmniThinker(ModelRef("qwen3-omni", str(ours_dir)))
    assert "talker_decode" in model.graph().walks and "audio_out" in model.processor().card().capabilities
    thinker_only = {"ranks": [{"id": 0, "device": "cpu"}],
                    "nodes": [{"nodes": ["thinker", "audio_encoder", "vision_encoder"], "ranks": [0]}]}
    text = model.for_placement(thinker_only)
    assert "talker_decode" not in text.graph().walks and "talker" not in text.components()
    assert "audio_out" not in text.processor().card().capabilities
    assert model.for_placement(model.default_placement()) is model
