"""The thinker against transformers' Qwen3OmniMoe on the same tiny weights (float32): logits, positions, greedy.

Every case feeds both sides the same encoder inputs (our mel features and
patches) with an attention mask, so the reference builds its 3-D positions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.qwen3_omni.conftest import (
    IDS,
    audio_block,
    chat_ids,
    hf_inputs,
    image_block,
    rgb,
    video_block,
    wave,
)
from walkserve.engines.spec import Batch
from walkserve.models.qwen3_omni.thinker.audio_features import log_mel_batch
from walkserve.models.qwen3_omni.thinker.generate import greedy_generate, prefill_logits
from walkserve.models.qwen3_omni.thinker.image_processor import VisionPreprocess, preprocess_image
from walkserve.models.qwen3_omni.thinker.request import thinker_request
from walkserve.models.qwen3_omni.thinker.video import video_from_frames

SETTINGS = VisionPreprocess(min_pixels=32 * 32, max_pixels=128 * 128)


def _case(name: str):
    """(ids with one placeholder per item, mel clips, images, videos) of a named prompt."""
    mel = log_mel_batch([wave(2.37)]).clip(0)  # 237 frames: 2 full chunks + 37, crosses a 26-token window
    image = preprocess_image(rgb(70, 100), SETTINGS)  # smart-resized to 64 x 96
    frames = [rgb(64, 64, seed=s) for s in range(5)]  # 5 frames -> padded to 6 -> 3 temporal groups
    video = video_from_frames(frames, fps=1.5, settings=SETTINGS)  # 2 / 1.5 s per group: fractional times
    text = [104, 105, 106]
    cases = {
        "text": (chat_ids(text), [], [], []),
        "audio": (chat_ids(audio_block() + text), [mel], [], []),
        "image": (chat_ids(image_block() + text), [], [image], []),
        "video": (chat_ids(video_block() + text), [], [], [video]),
        "mixed": (chat_ids(audio_block() + text[:1] + image_block() + text[1:]), [mel], [image], []),
    }
    return cases[name]


@pytest.fixture(scope="module")
def requests(components):
    out = {}
    for name in ("text", "audio", "image", "video", "mixed"):
        ids, audio, images, videos = _case(name)
        out[name] = thinker_request(ids, components.config, audio, images, videos)
    return out


@pytest.mark.parity
@pytest.mark.parametrize("name", ["text", "audio", "image", "video", "mixed"])
def test_logits_match_reference(name, requests, components, hf_model):
    request = requests[name]
    with torch.no_grad():
        want = hf_model.thinker(**hf_inputs(request)).logits[0]
    got = prefill_logits(components, request)
    assert want.abs().max() > 1.0  # the tiny model's logits are far from zero
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


@pytest.mark.parity
@pytest.mark.parametrize("name", ["text", "audio", "image", "video", "mixed"])
def test_positions_equal_get_rope_index(name, requests, hf_model):
    request = requests[name]
    kw = hf_inputs(request)
    audio_lengths = kw["feature_attention_mask"].sum(-1) if request.audio else None
    want, delta = hf_model.thinker.model.get_rope_index(
        kw["input_ids"], kw.get("image_grid_thw"), kw.get("video_grid_thw"), kw["attention_mask"], False,
        audio_lengths, kw.get("video_second_per_grid"))
    got = request.positions.positions
    np.testing.assert_array_equal(got.astype(np.float32), want[:, 0].numpy())
    assert request.positions.next_position == pytest.approx(float(delta.flatten()[0]) + len(request.input_ids))
    if name == "video":
        assert got.dtype == np.float32 and not np.all(got == np.round(got))  # 2 / 1.5 s x 13 per group
    if name == "image":
        block = np.asarray(request.input_ids) == IDS["image_pad"]  # a 4 x 6 patch grid: 2 x 3 merged tokens
        assert len(set(got[0, block])) == 1 and len(set(got[1, block])) == 2 and len(set(got[2, block])) == 3


@pytest.mark.parity
@pytest.mark.parametrize("name", ["text", "mixed", "video"])
def test_greedy_tokens_equal_reference_generate(name, requests, components, hf_model):
    request = requests[name]
    with torch.no_grad():
        ref = hf_model.thinker.generate(**hf_inputs(request), max_new_tokens=8, do_sample=False,
                                        eos_token_id=IDS["im_end"], pad_token_id=IDS["im_end"])
    want = ref[0, len(request.input_ids):].tolist()
    assert greedy_generate(components, request, max_new_tokens=8, stop_ids=[IDS["im_end"]]) == want


def test_capture_and_deepstack_rows(requests, components):
    """capture[k] is the true input of layer k; deepstack only moves the visual rows' hidden states."""
    from walkserve.layers.attention import DenseAttention
    from walkserve.models.qwen3_omni.thinker.generate import positions_tensor, thinker_inputs

    request, lm = requests["image"], components.lm
    embeds, deepstack = thinker_inputs(components, request)
    ids, pos = torch.tensor(request.input_ids), positions_tensor(request)
    visual = torch.tensor(request.input_ids) == IDS["image_pad"]
    with torch.no_grad():
        capture = {0: None, 1: None, 3: None, lm.config.num_hidden_layers: None}
        lm(ids, pos, DenseAttention("causal"), inputs_embeds=embeds, deepstack=deepstack, capture=capture)
        torch.testing.assert_close(capture[0], embeds)
        layer0 = lm.model.layers[0]
        cos, sin = lm.model.rotary.cos_sin(pos)
        after0 = layer0(embeds, cos, sin, DenseAttention("causal")) + deepstack[:, 0]
        torch.testing.assert_close(capture[1], after0)
        plain = {1: None}
        lm(ids, pos, DenseAttention("causal"), inputs_embeds=embeds, capture=plain)
    moved = (capture[1] - plain[1]).abs().amax(-1)
    assert bool((moved[visual] > 1e-3).all()) and bool((moved[~visual] == 0).all())
    assert deepstack.shape == (len(ids), 3, lm.config.hidden_size)


def test_bfloat16_components_run_close_to_float32(requests, hf_dir, components):
    """The serving dtype: every component in bf16 (grouped MoE, encoders, deepstack) stays near float32.

    A few rows move more (a bf16 rounding can flip a top-2 choice of the random router), so rows are
    compared by their median error.
    """
    from walkserve.models.qwen3_omni.thinker.weights import load_thinker_components

    half = load_thinker_components(hf_dir, dtype="bfloat16", progress=False)
    request = requests["mixed"]
    want = prefill_logits(components, request)
    got = prefill_logits(half, request)
    assert got.dtype == torch.float32
    row_error = (got - want).abs().amax(-1) / want.abs().max()
    assert float(row_error.median()) < 0.03
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.8


def _walk_pieces(components, request, merge: bool) -> torch.Tensor:
    """As the prefill walks run the prompt (``prompt_pieces``): each piece's encoder on its slots, the thinker
    over the cached keys of the pieces before it; logits of every row the pieces take ([T, V] merged: a text
    answer's pieces take the last token too; [T - 1, V] piecewise)."""
    from walkserve.layers.attention import DenseAttention
    from walkserve.models.qwen3_omni import graph as g
    from walkserve.models.qwen3_omni.thinker.prompt_pieces import request_inputs

    inputs = request_inputs(request, components.config.tokens, merge=merge)
    lm, past, parts = components.lm, {}, []
    value = lambda k, slot: torch.from_numpy(np.frombuffer(  # noqa: E731
        inputs[g.step_key(k, slot)].data, dtype=inputs[g.step_key(k, slot)].dtype).reshape(inputs[g.step_key(k, slot)].shape).copy())
    for k, walk in enumerate(inputs["walks"]):
        ids, slots, kw = value(k, "tokens"), g.WALK_INPUTS[walk], {}
        embeds = lm.embed(ids).clone()  # [n, D]
        if g.MEL in slots:
            [audio] = components.audio.forward_batch(Batch.of([{g.MEL: value(k, g.MEL)}]))
            embeds[value(k, g.EMBED_ROWS)] = audio[g.AUDIO_EMBEDS]
        if g.PIXELS in slots:
            [vision] = components.vision.forward_batch(Batch.of([{s: value(k, s) for s in (g.PIXELS, g.GRID, g.VISUAL_ROWS)}]))
            kw["deepstack"] = vision[g.DEEPSTACK]  # [n, L, D], zero off the visual rows
            if walk == g.PREFILL_MEDIA:  # the clip's tokens are in embeds: the image's come as token inputs
                kw.update(visual_embeds=vision[g.VISUAL_EMBEDS], visual_rows=value(k, g.VISUAL_ROWS))
            else:
                embeds[value(k, g.EMBED_ROWS)] = vision[g.IMAGE_EMBEDS]
        attn = DenseAttention("causal", past=past, keep=True)
        hidden = lm(ids, value(k, "positions"), attn, inputs_embeds=embeds, **kw)
        parts.append(lm.compute_logits(hidden))
        past = attn.kv
    return torch.cat(parts)


@pytest.mark.parity
@pytest.mark.parametrize("name", ["mixed", "video"])
def test_merged_prefill_equals_piecewise_and_reference(name, requests, components, hf_model):
    """A text answer's prompt runs in one thinker pass (one clip and one image: prefill_media, the image's
    tokens and deepstack as token inputs; one video with its text: prefill_vision, deepstack at the visual
    rows of a longer chunk); a spoken answer's as text and media pieces apart. All give transformers' logits."""
    from walkserve.models.qwen3_omni.thinker.prompt_pieces import request_inputs

    request = requests[name]
    tokens = components.config.tokens
    merged = {"mixed": ["prefill_media"], "video": ["prefill_vision"]}[name]  # audio + text + image; video + text
    assert request_inputs(request, tokens, merge=True)["walks"] == merged
    assert len(request_inputs(request, tokens, merge=False)["walks"]) == {"mixed": 5, "video": 3}[name]
    with torch.inference_mode():
        want = hf_model.thinker(**hf_inputs(request)).logits[0]
        merged, piecewise = _walk_pieces(components, request, True), _walk_pieces(components, request, False)
    torch.testing.assert_close(merged, want, rtol=0, atol=1e-4)  # the last row: token 0's logits
    torch.testing.assert_close(piecewise, want[:-1], rtol=0, atol=1e-4)
    torch.testing.assert_close(merged[:-1], piecewise, rtol=0, atol=1e-4)
