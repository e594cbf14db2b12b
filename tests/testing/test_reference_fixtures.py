"""The reference executor runs every fixture model to the outputs a plain-Python restatement predicts."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch

import walkserve.testing.fixtures as fixtures
from walkserve.core.finish import FinishReason
from walkserve.models.base import ModelRef
from walkserve.models.registry import load_model
from walkserve.testing.fixtures import image, lm, omni, tts
from walkserve.testing.fixtures.base import mix
from walkserve.testing.fixtures.requests import fixture_request
from walkserve.testing.reference import ReferenceExecutor


def executor(family):
    return ReferenceExecutor.for_model(load_model(ModelRef(family)))


def array(a):
    return np.frombuffer(a.data, dtype=a.dtype).reshape(a.shape)


@pytest.mark.parametrize("i", range(8))
def test_lm(i):
    req = fixture_request("fixture-lm", i)
    res = executor("fixture-lm").run(req)
    ids = req.inputs["prompt_ids"].tolist()
    state = sum(ids[:-1]) % 1000 if len(ids) > 1 else 0
    token, want = ids[-1], []
    for k in range(req.sampling.max_tokens):
        token = lm.EOS if k == req.params.eos_at else 1 + mix(token, state, k) % (lm.VOCAB - 1)
        if token == lm.EOS:
            break
        want.append(token)
    assert [int(t) for t in res.stream("text")] == want
    assert res.walks == (["prefill", "decode"] if len(ids) > 1 else ["decode"])
    assert res.finish == (FinishReason.STOP if len(want) < req.sampling.max_tokens else FinishReason.LENGTH)


@pytest.mark.parametrize("i", range(4))
def test_image(i):
    req = fixture_request("fixture-image", i)
    res = executor("fixture-image").run(req)
    prompt = torch.tensor(req.inputs["prompt_ids"].tolist())

    class F:  # the minimal firing the fixture functions read
        def __init__(self, inputs, iteration=0, context=None):
            self.inputs, self.iteration, self.node_params = inputs, iteration, {"context": context}

    cond = image.encode_fn(F({"prompt": prompt}))["cond"]
    latent = torch.from_numpy(array(req.inputs["noise"]).copy())
    for k in range(req.params.steps):
        v = {c: image.llm_fn(F({"latent": latent, "cond": cond}, k, c))["v"] for c in ("text", "image")}
        vu = image.llm_fn(F({"latent": latent}, k, "none"))["v"]
        latent = image.combine_fn(F({"v_text": v["text"], "v_image": v["image"], "v_uncond": vu, "latent_in": latent}))["latent"]
    want = image.vae_fn(F({"latent": latent}))["image"]
    (got,) = res.stream("image")
    assert torch.equal(got, want)


@pytest.mark.parametrize("i", range(6))
def test_omni(i):
    req = fixture_request("fixture-omni", i)
    res = executor("fixture-omni").run(req)
    salt = sum(req.inputs["prompt_ids"].tolist())
    token, texts, hiddens = 1, [], []
    for k in range(req.sampling.max_tokens):
        token = omni.EOS if k == req.params.text_len else 1 + mix(token, salt, k) % 50
        if token == omni.EOS:
            break
        texts.append(token)
        hiddens.append(torch.tensor([[token * 0.5, k * 1.0, salt % 7]]))
    code, frames = 1, []
    for k in range(64):
        h = int(hiddens[k].sum().item() * 10) if k < len(hiddens) else 0
        code = omni.CODEC_EOS if k == req.params.audio_len else 1 + mix(code, h, k) % 200
        if code == omni.CODEC_EOS:
            break
        c, frame = code, [code]
        for j in range(omni.CODEBOOKS - 1):  # the nested code predictor
            c = 1 + mix(c, code, j) % 200
            frame.append(c)
        frames.append(frame)
    codes = frames
    assert [int(t) for t in res.stream("text")] == texts
    sums = torch.tensor([sum(f) for f in frames], dtype=torch.float32)
    wave = torch.sin(sums.cumsum(0) * 0.01).repeat_interleave(4) * 0.5
    audio = torch.cat(res.stream("audio")) if codes else torch.empty(0)
    assert torch.allclose(audio, wave, atol=1e-5)
    assert len(res.stream("audio")) == -(-len(codes) // 25)  # one chunk per 25 new frames, tail flushed


@pytest.mark.parametrize("i", range(8))
def test_tts_window_emission_covers_every_frame_once(i):
    req = fixture_request("fixture-tts", i)
    res = executor("fixture-tts").run(req)
    ids = req.inputs["prompt_ids"].tolist()
    state = sum(ids[:-1]) % 1000
    token, toks = ids[-1], []
    for k in range(req.sampling.max_tokens):
        token = lm.EOS if k == req.params.eos_at else 1 + mix(token, state, k) % (lm.VOCAB - 1)
        if token == lm.EOS:
            break
        toks.append(token)
    frames = len(toks) // 7
    audio = torch.cat(res.stream("audio")) if res.stream("audio") else torch.empty(0)
    assert audio.numel() == frames * tts.FRAME
    t = torch.tensor(toks, dtype=torch.int64)
    if frames < 4:
        want = [tts.decode_frames(t[: frames * 7])]
    else:
        windows = [tts.decode_frames(t[7 * w : 7 * w + 28]) for w in range(frames - 3)]
        want = [windows[0][0:2]] + [w[1:2] for w in windows[1:]] + [windows[-1][2:4]]
    assert torch.allclose(audio, torch.cat(want).reshape(-1), atol=1e-6)


@pytest.mark.parametrize("family", sorted(fixtures.FIXTURES))
def test_every_fixture_runs_clean(family):
    for i in range(5):
        res = executor(family).run(fixture_request(family, i))
        assert res.error is None, (family, i, res.error)
        assert res.walks


def test_rollout_runs_to_each_horizon():
    ex = executor("fixture-rollout")
    for i in range(7):
        req = fixture_request("fixture-rollout", i)
        res = ex.run(req)
        assert [o.path for o in res.outputs] == [(k,) for k in range(req.params.horizon)]
        assert np.allclose(array(res.walk_outputs[0]["final"]) * 2, res.outputs[-1].value.numpy())


def test_multimodal_walk_choice():
    ex = executor("fixture-multimodal")
    got = [ex.run(fixture_request("fixture-multimodal", i)).walks for i in range(3)]
    assert got == [["prefill", "decode"], ["encode_image", "prefill", "decode"], ["encode_audio", "prefill", "decode"]]


def test_component_failure_becomes_the_request_error():
    req = fixture_request("fixture-lm", 3)
    req.params = msgspec.structs.replace(req.params, fail_node="lm", fail_at=1)
    res = executor("fixture-lm").run(req)
    assert res.finish == FinishReason.ERROR and "injected failure in lm at iteration 1" in res.error
