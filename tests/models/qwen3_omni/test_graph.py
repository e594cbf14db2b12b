"""The thinker's walks and state machine: the user turn cut at its media, one walk per piece, then decode."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.qwen3_omni.conftest import IDS, rgb, wave
from walkserve.core.array import ArrayData
from walkserve.core.errors import PlacementError
from walkserve.core.sampling import SamplingParams
from walkserve.graph import ACCUMULATE, DROP, DynamicLoop, GraphEdge
from walkserve.models.qwen3_omni import graph as g
from walkserve.models.qwen3_omni.processor import OmniParams, Qwen3OmniProcessor


@pytest.fixture(scope="module")
def processor(ours_dir) -> Qwen3OmniProcessor:
    return Qwen3OmniProcessor(ours_dir)


def _array(x: np.ndarray) -> ArrayData:
    return ArrayData(str(x.dtype), x.shape, np.ascontiguousarray(x).tobytes())


def _values(a: ArrayData) -> np.ndarray:
    return np.frombuffer(a.data, dtype=np.dtype(a.dtype)).reshape(a.shape)


def mixed_messages() -> list[dict]:
    w = wave(1.2)
    return [{"role": "system", "content": "Be brief"},
            {"role": "user", "content": [{"type": "audio", "audio": _array(w), "sample_rate": 16000},
                                         {"type": "text", "text": "and"},
                                         {"type": "image", "image": _array(rgb(40, 60))},
                                         {"type": "video", "frames": [_array(rgb(32, 32, s)) for s in range(3)], "fps": 1.5},
                                         {"type": "text", "text": "?"}]}]


def test_walk_names_and_the_captioner_graph():
    pieces = ["prefill_text", "prefill_audio", "prefill_vision"]
    firsts = [g.first_walk(p, lp) for p in [*pieces, "prefill_media"] for lp in (False, True)]
    assert firsts[-2:] == ["prefill_media_first", "prefill_media_first_logprobs"]
    assert list(g.build_graph().walks) == [*pieces, *firsts, "thinker_decode", "thinker_decode_logprobs"]
    captioner = g.build_graph(vision=False).walks  # -Captioner: no vision encoder
    assert not any("vision" in w or "media" in w for w in captioner)
    first = g.build_graph().walks["prefill_media_first_logprobs"]
    loop = first.body.children()[2]  # the two encoders, then the thinker in its one-iteration loop
    assert isinstance(loop, DynamicLoop) and loop.bound == 1 and not loop.stop.include_stopping
    assert loop.outputs == {"thinker.token": ACCUMULATE} and first.outputs == ("step", "first")
    assert set(loop.body.outputs) == {"token", "logprob", "top_logprobs", "top_logprob_ids"}
    taps = g.build_graph(taps=g.thinker_taps(3), tap_edge=lambda ep: GraphEdge(ep, DROP))
    node = taps.walks["prefill_vision"].body.children()[1]
    assert set(node.outputs) == {"embed", "accept_hidden"}
    [op] = node.params["kv"]
    assert op.capture == {"embed": 0, "accept_hidden": 3} and op.rows.kind == "all" and op.token_inputs == ("deepstack",)


def test_slot_names_are_the_encoders():
    from walkserve.models.qwen3_omni.thinker import audio_encoder, vision_encoder

    assert (g.MEL, g.AUDIO_EMBEDS) == (audio_encoder.INPUT_SLOT, audio_encoder.OUTPUT_NAME)
    assert (g.PIXELS, g.GRID, g.IMAGE_EMBEDS, g.DEEPSTACK) == (
        vision_encoder.PIXELS_SLOT, vision_encoder.GRID_SLOT, vision_encoder.OUTPUT_NAME, vision_encoder.DEEPSTACK_NAME)


PIECES = {
    True: ["prefill_audio", "prefill_vision", "prefill_vision"],  # a text answer: one thinker pass per item
    False: ["prefill_text", "prefill_audio", "prefill_text", "prefill_vision", "prefill_text", "prefill_vision",
            "prefill_text"],  # a spoken answer: the talker takes text and media pieces apart
}


@pytest.mark.parametrize("merge", [True, False])
def test_pieces_cover_the_prompt(processor, merge):
    """A text answer's pieces take the whole prompt; a spoken answer's all but its last token (``last``)."""
    from walkserve.models.qwen3_omni.thinker.prompt_pieces import request_inputs

    request, _ = processor.thinker_request("chat", {"messages": mixed_messages()}, OmniParams())
    inputs = request_inputs(request, processor.config.tokens, merge=merge)
    walks = inputs["walks"]
    assert walks == PIECES[merge]
    tokens = [_values(inputs[g.step_key(k, "tokens")]) for k in range(len(walks))]
    positions = [_values(inputs[g.step_key(k, "positions")]) for k in range(len(walks))]
    end = len(request.input_ids) - (0 if merge else 1)
    np.testing.assert_array_equal(np.concatenate(tokens), request.input_ids[:end])
    np.testing.assert_array_equal(np.concatenate(positions, axis=1), request.positions.positions[:, :end])
    assert positions[0].dtype == np.float32  # the video's group time is fractional (2 / 1.5 s x 13)
    if merge:
        assert "last" not in inputs
    else:
        assert _values(inputs["last"]).tolist() == request.input_ids[-1:]
    pads = {IDS["audio_pad"], IDS["image_pad"], IDS["video_pad"]}
    for k, (walk, ids) in enumerate(zip(walks, tokens, strict=True)):
        if walk == "prefill_text":
            assert not pads & set(ids.tolist())
            continue
        rows = _values(inputs[g.step_key(k, "embed_rows")])
        assert set(ids[rows].tolist()) < pads and len(set(ids[rows].tolist())) == 1  # one item's pad rows
        assert not pads & set(np.delete(ids, rows).tolist())  # the rest is text (merged) or nothing
        assert len(rows) < len(ids) if merge else rows.tolist() == list(range(len(ids)))
        if walk == "prefill_vision":
            np.testing.assert_array_equal(np.flatnonzero(_values(inputs[g.step_key(k, "visual_rows")])), rows)
    assert _values(inputs[g.step_key(walks.index("prefill_audio"), "mel")]).shape == (128, 120)
    video = max(k for k, w in enumerate(walks) if w == "prefill_vision")
    assert _values(inputs[g.step_key(video, "grid_thw")]).tolist()[0] == 2  # 3 frames padded to 4: 2 groups


def test_one_clip_and_one_image_are_one_pass(processor):
    """prefill_media: the whole prompt, the clip's rows in embed_rows, the image's in visual_rows."""
    from walkserve.models.qwen3_omni.thinker.prompt_pieces import request_inputs

    messages = [{"role": "user", "content": [{"type": "image", "image": _array(rgb(40, 60))},
                                             {"type": "text", "text": "and"},
                                             {"type": "audio", "audio": _array(wave(1.2)), "sample_rate": 16000}]}]
    request, _ = processor.thinker_request("chat", {"messages": messages}, OmniParams())
    inputs = request_inputs(request, processor.config.tokens)
    assert inputs["walks"] == ["prefill_media"]
    ids = _values(inputs[g.step_key(0, "tokens")])
    np.testing.assert_array_equal(ids, request.input_ids)
    assert set(g.WALK_INPUTS["prefill_media"]) <= {key.split(".", 1)[1] for key in inputs if key.startswith("step0.")}
    audio, visual = _values(inputs[g.step_key(0, "embed_rows")]), _values(inputs[g.step_key(0, "visual_rows")])
    np.testing.assert_array_equal(audio, np.flatnonzero(ids == IDS["audio_pad"]))
    np.testing.assert_array_equal(np.flatnonzero(visual), np.flatnonzero(ids == IDS["image_pad"]))
    assert len(audio) and visual.any()


def test_text_answers_merge_and_spoken_answers_do_not(ours_dir):
    from walkserve.models.qwen3_omni.model import speech_config

    processor, sampling = Qwen3OmniProcessor(ours_dir, speech=speech_config(ours_dir)), SamplingParams(max_tokens=4)
    text = processor.build_request("chat", {"messages": mixed_messages()}, sampling, processor.check_params({}))
    assert text.inputs["walks"] == PIECES[True]
    spoken = processor.build_request("chat", {"messages": mixed_messages(), "modalities": ["text", "audio"]},
                                     sampling, processor.check_params({}))
    assert spoken.inputs["walks"] == PIECES[False]


def test_the_state_machine_walks_the_pieces_then_decodes(processor):
    """The last piece samples token 0 (its ``_first`` form); decode follows unless token 0 was a stop token
    (``first`` empty) or max_tokens is 1."""
    machine, graph = g.ThinkerTurns(), g.build_graph()
    token = ArrayData.from_list([7], "int64")
    empty = ArrayData("float32", (0,), b"")  # an accumulation of no iteration
    for logprobs, max_tokens, first, decode in ((None, 4, token, ["thinker_decode"]),
                                                (2, 4, token, ["thinker_decode_logprobs"]),
                                                (None, 4, empty, []), (None, 1, token, [])):
        spec = processor.build_request("chat", {"messages": mixed_messages()},
                                       SamplingParams(max_tokens=max_tokens, logprobs=logprobs), processor.check_params({}))
        start, seen = machine.first(spec), []
        while start is not None:
            seen.append(start.walk)
            assert set(start.inputs) == set(graph.walk(start.walk).inputs)
            outputs = {"step": start.inputs["step"]} if "step" in start.inputs else {}
            if start.walk.endswith(("_first", "_first_logprobs")):
                outputs["first"] = first
            start = machine.next(spec, start.walk, outputs)
        *pieces, last = spec.inputs["walks"]
        assert seen == [*pieces, g.first_walk(last, logprobs is not None), *decode]
    text = processor.build_request("completion", {"prompt": "Hello there"}, SamplingParams(max_tokens=4), processor.check_params({}))
    assert text.inputs["walks"] == ["prefill_text"]  # a text-only request runs only the thinker


SPEECH_NODES = ("talker", "talker_in", "predictor_in", "code_predictor", "code_predictor_step", "frame", "code2wav")
PLACED = {
    "qwen3-omni": {"thinker": 0, "audio_encoder": 0, "vision_encoder": 0, **dict.fromkeys(SPEECH_NODES, 0)},
    "qwen3-omni-encoders-split": {"thinker": 0, "audio_encoder": 1, "vision_encoder": 1,
                                  **dict.fromkeys(SPEECH_NODES, 0)},
    "qwen3-omni-split": {"thinker": 0, "audio_encoder": 0, "vision_encoder": 0, **dict.fromkeys(SPEECH_NODES, 1)},
    "qwen3-omni-3way": {"thinker": 0, "audio_encoder": 0, "vision_encoder": 0, **dict.fromkeys(SPEECH_NODES, 1),
                        "code2wav": 2},
}


def speech_graph():
    from walkserve.models.qwen3_omni.speech.graph import DepthRanges, build_speech_graph

    return build_speech_graph([(0, 128), (230, 231)], DepthRanges(128), 16, 3)


@pytest.mark.parametrize("name", sorted(PLACED))
def test_shipped_placements_cover_the_walks(name):
    import walkserve.placements
    from walkserve.placement.plan import load_placement
    from walkserve.placement.resolve import check_placement, walk_nodes

    place, graph = load_placement(walkserve.placements.path(name)), speech_graph()
    ranks = {n: (r,) for n, r in PLACED[name].items()}
    for walk, nodes in walk_nodes(graph).items():
        assert {n: place.ranks_for(walk, n) for n in nodes} == {n: ranks[n] for n in nodes}
    components = {n: 1 for n in graph.components()}
    check_placement(place, graph, {"thinker", "talker", "code_predictor"}, components, dict.fromkeys(components, 0))
    with pytest.raises(PlacementError, match="unknown node"):  # a thinker-only checkpoint: drop the speech nodes
        check_placement(place, g.build_graph(vision=False), {"thinker"}, components, dict.fromkeys(components, 0))


def test_media_rows_carry_a_128_bit_key(processor, monkeypatch):
    """Two images (and two clips) whose digests agree in their first 64 bits still give their rows other content:
    a 64-bit key would let a client build an image that takes another's prefix-cache blocks."""
    from tests.models.common.colliding import collide_in_64_bits
    from walkserve.models.qwen3_omni.thinker.content_keys import content_keys

    def request(seed: int):
        messages = [{"role": "user", "content": [{"type": "image", "image": _array(rgb(40, 60, seed))},
                                                 {"type": "audio", "audio": _array(wave(1.2, seed)),
                                                  "sample_rate": 16000}]}]
        return processor.thinker_request("chat", {"messages": messages}, OmniParams())[0]

    a, b = request(0), request(1)
    collide_in_64_bits(monkeypatch)
    keys_a, keys_b = content_keys(a, processor.config.tokens), content_keys(b, processor.config.tokens)
    ids = np.asarray(a.input_ids)
    for pad in (IDS["image_pad"], IDS["audio_pad"]):
        rows = np.flatnonzero(ids == pad)
        assert len(rows) and not (keys_a[rows] == keys_b[rows]).all(-1).any()  # every row differs
    text = ~np.isin(ids, [IDS["image_pad"], IDS["audio_pad"]])
    assert keys_a.shape == (len(ids), 2) and text.any() and not keys_a[text].any()  # text rows: (0, 0)
