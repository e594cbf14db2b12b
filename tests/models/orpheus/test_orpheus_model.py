"""The served Orpheus model: graph, components, paths, the processor, the tiny writer (no LM run here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import walkserve.models.builtin  # noqa: F401  (registers the families)
from walkserve.core.errors import ConfigError, InvalidRequest
from walkserve.core.params import RequestParams
from walkserve.core.sampling import SamplingParams
from walkserve.graph.plan import FromStream
from walkserve.models.base import ModelRef
from walkserve.models.orpheus import codec as codec_module
from walkserve.models.orpheus.graph import INPUT_SLOT, OUTPUT_NAME
from walkserve.models.orpheus.model import OrpheusTTS, resolve_dirs
from walkserve.models.orpheus.processor import DEFAULT_MAX_TOKENS, OrpheusProcessor, SpeechParams
from walkserve.models.orpheus.tiny import LM_PRESETS, VOCAB_SIZE
from walkserve.models.orpheus.tokens import (
    AUDIO_CODE_BASE,
    END_OF_SPEECH,
    VOICES,
    allowed_ranges,
    build_prompt_ids,
    code_token,
    token_code,
)
from walkserve.models.registry import load_model
from walkserve.streaming.policy import SlidingWindow


@pytest.fixture(scope="module")
def model(tiny_orpheus_dir) -> OrpheusTTS:
    return load_model(ModelRef("orpheus", str(tiny_orpheus_dir)))


@pytest.fixture(scope="module")
def processor(model) -> OrpheusProcessor:
    return model.processor()


# ---- graph and components -----------------------------------------------------------------------


def test_graph_shape(model):
    graph = model.graph()
    assert list(graph.walks) == ["prefill", "decode"]
    assert graph.components() == {"lm": ["lm"], "codec": ["codec"]}
    decode = graph.plans["decode"]
    source = decode.sources[("codec", INPUT_SLOT)]
    assert isinstance(source, FromStream)
    policy = decode.streams[source.stream].policy
    assert isinstance(policy, SlidingWindow) and (policy.window, policy.stride) == (28, 7)
    lm = decode.nodes["lm"]
    assert lm.params["token_ranges"] is allowed_ranges
    assert (INPUT_SLOT, OUTPUT_NAME) == (codec_module.INPUT_SLOT, codec_module.OUTPUT_NAME)
    assert graph.plans["prefill"].nodes["lm"].outputs == ()


def test_stop_rule_never_exposes_end_of_speech(model):
    loop = model.graph().walk("decode").body.branches[0]
    rule = loop.stop
    assert rule.include_stopping is False and rule.output == "lm.token"
    params = RequestParams(SpeechParams(), SamplingParams(stop_token_ids=(END_OF_SPEECH, 128009), min_tokens=3))
    assert rule.should_stop([END_OF_SPEECH], params, 0)  # always, even before min_tokens
    assert not rule.should_stop([128009], params, 2) and rule.should_stop([128009], params, 3)
    assert not rule.should_stop([AUDIO_CODE_BASE], params, 10)


def test_graph_cli_renders_with_a_model_path(tiny_orpheus_dir):
    out = subprocess.run(
        [sys.executable, "-m", "walkserve.cli.main", "graph", "orpheus", "--model-path", str(tiny_orpheus_dir)],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    assert "SlidingWindow(28, 7" in out and "client: audio" in out and "decode_codec" in out


def test_components(model, tiny_orpheus_dir):
    comps = model.components()
    lm, codec = comps["lm"], comps["codec"]
    assert (lm.engine, lm.stateful, codec.engine, codec.stateful) == ("kv", True, "stateless", False)
    assert lm.weight_bytes > 4 * VOCAB_SIZE * 64  # tied embedding, float32
    assert codec.weight_bytes == (tiny_orpheus_dir / "snac" / "model.safetensors").stat().st_size
    assert model.default_placement()["nodes"] == [{"nodes": ["lm", "codec"], "ranks": [0]}]


def test_paths_official_layout_and_errors(tiny_orpheus_dir, tmp_path):
    lm, snac = tiny_orpheus_dir / "lm", tiny_orpheus_dir / "snac"
    assert resolve_dirs(ModelRef("orpheus", str(tiny_orpheus_dir))) == (lm, snac)
    assert resolve_dirs(ModelRef("orpheus", str(lm), {"snac_path": str(snac)})) == (lm, snac)
    with pytest.raises(ConfigError, match="snac_path"):
        OrpheusTTS(ModelRef("orpheus", str(lm)))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match="walkserve convert snac"):
        OrpheusTTS(ModelRef("orpheus", str(lm), {"snac_path": str(tmp_path)}))
    bare = OrpheusTTS(ModelRef("orpheus"))
    assert list(bare.graph().walks) == ["prefill", "decode"]
    with pytest.raises(ConfigError, match="--model-path"):
        bare.components()


# ---- tokens --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 6, 7, 13, 700])
def test_allowed_ranges(n):
    (lo, hi), eos = allowed_ranges(n)
    assert eos == (END_OF_SPEECH, END_OF_SPEECH + 1) and hi - lo == 4096
    assert token_code(lo, n) == 0 and token_code(hi - 1, n) == 4095
    assert code_token(17, n) in range(lo, hi) and code_token(17, n + 1) not in range(lo, hi)


# ---- processor -----------------------------------------------------------------------------------


def test_card(processor, tiny_orpheus_dir):
    card = processor.card()
    assert card.capabilities == {"speech", "audio_out", "generate"}
    assert card.voices == VOICES and card.default_voice == "tara"
    assert (card.sample_rate, card.random_weights, card.family) == (24000, True, "orpheus")
    assert card.id == tiny_orpheus_dir.name and card.max_context == 8192
    assert card.default_sampling == {"temperature": 0.6, "top_p": 0.8, "repetition_penalty": 1.3,
                                     "max_tokens": DEFAULT_MAX_TOKENS}
    assert (DEFAULT_MAX_TOKENS - 1) // 7 * 2048 >= 30 * 24000  # ~30 s of whole frames


def test_speech_request(processor):
    spec = processor.build_request("speech", {"input": "Hello there.", "voice": "leo"}, processor.sampling(), processor.check_params({}))
    ids = spec.inputs["prompt_token_ids"].tolist()
    assert ids == build_prompt_ids(processor.tokenize, "leo", "Hello there.")
    assert ids[:2] == [128259, 128000] and ids[-4:] == [128009, 128260, 128261, 128257]
    assert all(t < 1000 for t in ids[2:-4])  # the tiny tokenizer's text ids
    assert spec.modalities == ("audio",) and spec.task == "speech" and spec.params.voice == "leo"
    s = spec.sampling
    assert (s.temperature, s.top_p, s.repetition_penalty, s.max_tokens) == (0.6, 0.8, 1.3, DEFAULT_MAX_TOKENS)
    assert s.stop_token_ids == (END_OF_SPEECH, 128009)


def test_client_sampling_and_voice_from_params(processor):
    sampling = SamplingParams(temperature=0.0, max_tokens=50, stop_token_ids=(5,), seed=9)
    spec = processor.build_request("speech", {"input": "Hi"}, sampling, processor.check_params({"voice": "zoe"}))
    assert spec.params.voice == "zoe"
    assert spec.sampling.stop_token_ids == (5, END_OF_SPEECH, 128009)
    assert (spec.sampling.temperature, spec.sampling.max_tokens, spec.sampling.seed) == (0.0, 50, 9)
    default = processor.build_request("speech", {"input": "Hi"}, sampling, processor.check_params({}))
    assert default.params.voice == "tara"
    no_eos = processor.build_request("speech", {"input": "Hi"}, SamplingParams(ignore_eos=True), processor.check_params({}))
    assert no_eos.sampling.stop_token_ids == (END_OF_SPEECH,)


def test_generate_task_and_context_room(processor):
    """No max_tokens: the room left in the context; an explicit one that does not fit is refused, not shrunk."""
    payload = {"inputs": {"text": "Good morning", "voice": "mia"}, "modalities": ["audio"]}
    spec = processor.build_request("generate", payload, processor.sampling(max_tokens=None), processor.check_params({}))
    n_prompt = len(spec.inputs["prompt_token_ids"].tolist())
    assert spec.params.voice == "mia" and spec.sampling.max_tokens == 8192 - n_prompt
    assert processor.build_request("generate", payload, processor.sampling(), processor.check_params({})).sampling.max_tokens == 2465
    with pytest.raises(InvalidRequest) as err:
        processor.build_request("generate", payload, processor.sampling(max_tokens=100_000), processor.check_params({}))
    assert (err.value.param, err.value.code) == ("max_tokens", "context_length_exceeded")


def test_a_generate_text_too_long_for_the_context_is_refused_untokenized(processor, monkeypatch):
    monkeypatch.setattr(processor.tokenizer, "encode", lambda *a, **k: pytest.fail("tokenized"))
    payload = {"inputs": {"text": "Good morning. " * 200_000, "voice": "mia"}, "modalities": ["audio"]}
    with pytest.raises(InvalidRequest, match="the prompt has at least") as err:
        processor.build_request("generate", payload, processor.sampling(), processor.check_params({}))
    assert (err.value.param, err.value.code) == ("input", "context_length_exceeded")


@pytest.mark.parametrize(
    ("task", "payload", "params", "param"),
    [
        ("speech", {"input": "hi", "voice": "bob"}, {}, "voice"),
        ("speech", {"input": "hi"}, {"voice": "alice"}, "voice"),
        ("speech", {"input": "  "}, {}, "input"),
        ("speech", {"input": 3}, {}, "input"),
        ("speech", {"input": "hi", "speed": 1.5}, {}, "speed"),
        ("speech", {"input": "hi"}, {"instructions": "whisper"}, "instructions"),
        ("chat", {"messages": []}, {}, "task"),
        ("completion", {"prompt": "hi"}, {}, "task"),
        ("generate", {"inputs": {"text": "hi"}, "modalities": ["text"]}, {}, "modalities"),
        ("generate", {"inputs": "hi"}, {}, "inputs"),
        ("generate", {"inputs": {"voice": "tara"}}, {}, "input"),
    ],
)
def test_invalid_requests_name_the_parameter(processor, task, payload, params, param):
    with pytest.raises(InvalidRequest) as err:
        processor.build_request(task, payload, processor.sampling(), processor.check_params(params))
    assert err.value.param == param


def test_custom_voices(tiny_orpheus_dir):
    model = load_model(ModelRef("orpheus", str(tiny_orpheus_dir), {"voices": ["anna"], "model_id": "orpheus-ft"}))
    proc = model.processor()
    assert proc.card().voices == ("anna",) and proc.card().default_voice == "anna" and proc.card().id == "orpheus-ft"
    assert proc.build_request("speech", {"input": "Hi"}, proc.sampling(), proc.check_params({})).params.voice == "anna"


# ---- tiny writer ---------------------------------------------------------------------------------


def test_tiny_layout_matches_orpheus(tiny_orpheus_dir):
    lm = tiny_orpheus_dir / "lm"
    config = json.loads((lm / "config.json").read_text())
    assert config["vocab_size"] == 156940 and config["tie_word_embeddings"] is True
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (128000, 128009, 128004)
    assert config["rope_parameters"]["rope_type"] == "llama3" and config["rope_parameters"]["factor"] == 32.0
    assert config["walkserve_random_weights"] is True
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(lm / "tokenizer.json"))
    assert tok.token_to_id("<|begin_of_text|>") == 128000 and tok.token_to_id("<|eot_id|>") == 128009
    assert tok.token_to_id("<custom_token_2>") == END_OF_SPEECH
    assert tok.encode("tara: hi").ids[0] == 128000
    assert json.loads((tiny_orpheus_dir / "snac" / "config.json").read_text())["codebook_size"] == 4096


def test_transformers_reads_the_tiny_lm(tiny_orpheus_dir):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(tiny_orpheus_dir / "lm")
    assert tok("zoe: hello").input_ids[0] == 128000
    config = transformers.AutoConfig.from_pretrained(tiny_orpheus_dir / "lm")
    assert config.vocab_size == 156940 and config.tie_word_embeddings


def test_bench_preset_size():
    p = LM_PRESETS["bench"]
    embed = p["vocab_size"] * p["hidden_size"]
    q, kv = p["num_attention_heads"] * p["head_dim"], p["num_key_value_heads"] * p["head_dim"]
    layer = p["hidden_size"] * (2 * q + 2 * kv) + 3 * p["hidden_size"] * p["intermediate_size"]
    assert 20e6 <= embed + p["num_hidden_layers"] * layer <= 50e6
    assert p["num_attention_heads"] // p["num_key_value_heads"] == 3  # Orpheus: 24 / 8
    assert p["num_attention_heads"] * p["head_dim"] == p["hidden_size"]


def test_frontend_side_never_imports_torch(tiny_orpheus_dir):
    """The API/entry process builds the model for its graph, processor and weight sizes: no torch there."""
    code = (
        "import sys, walkserve.models.builtin\n"
        "from walkserve.models.registry import load_model\n"
        "from walkserve.models.base import ModelRef\n"
        f"m = load_model(ModelRef('orpheus', {str(tiny_orpheus_dir)!r}))\n"
        "m.graph(); m.processor().build_request('speech', {'input': 'hi'}, m.processor().sampling(), m.processor().check_params({}))\n"
        "assert m.components()['lm'].weight_bytes > 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
