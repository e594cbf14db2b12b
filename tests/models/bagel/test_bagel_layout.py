"""The torch-free bookkeeping: sequence layout and contexts per flow, resize rules, request parameters."""

from __future__ import annotations

import pytest

from walkserve.core.errors import InvalidRequest
from walkserve.models.bagel.layout import (
    CFG_IMG,
    CFG_TEXT,
    GEN,
    THINK,
    Append,
    Drop,
    Fork,
    ImageInput,
    SequenceLayout,
    SpecialTokens,
    TextInput,
    decode_start,
    plan_denoise_step,
    plan_generation_prefill,
    plan_think_end,
    plan_think_start,
    plan_understanding_prefill,
)
from walkserve.models.bagel.params import (
    EDIT,
    GENERATE,
    BagelImageParams,
    ImageLimits,
    parse_image_params,
)
from walkserve.models.bagel.sizes import VAE_RESIZE, VIT_RESIZE, ResizeRule

T = SpecialTokens(im_start=1, im_end=2, vision_start=3, vision_end=4)


def _cursors(layout):
    return {name: (c.kv_len, c.position) for name, c in layout.cursors.items()}


def test_text_segments_are_causal_and_advance_by_their_length():
    layout = SequenceLayout(T)
    op = layout.text(GEN, [10, 11, 12])
    assert op.segment.token_ids() == [1, 10, 11, 12, 2] and op.mask == "causal"
    assert op.positions() == [0, 1, 2, 3, 4] and op.kv_start == 0
    assert op.segment.expert() == [0] * 5
    assert _cursors(layout) == {GEN: (5, 5)}


def test_image_blocks_share_one_position_and_advance_it_by_one():
    layout = SequenceLayout(T)
    layout.text(GEN, [10])
    vae = layout.image(GEN, "vae", 4)
    assert vae.positions() == [3] * 6 and vae.mask == "full" and vae.kv_start == 3
    assert vae.segment.token_ids() == [3, 3, 3, 3, 3, 4]  # encoder rows are filled with embeddings
    assert vae.segment.expert() == [0, 1, 1, 1, 1, 0]  # latents take the generation expert, markers not
    vit = layout.image(GEN, "vit", 2)
    assert vit.positions() == [4] * 4 and vit.segment.expert() == [0] * 4
    assert _cursors(layout) == {GEN: (3 + 6 + 4, 5)}
    with pytest.raises(ValueError):
        layout.image(GEN, "latents", 3)


def test_denoise_queries_sit_at_each_contexts_position_and_write_nothing():
    layout = SequenceLayout(T)
    plan_generation_prefill(layout, [TextInput((7, 8, 9))])
    before = _cursors(layout)
    queries = plan_denoise_step(layout, 12, cfg_text=True, cfg_img=True)
    assert [(q.context, q.kv_len, q.position, q.segment.num_tokens) for q in queries] == [
        (GEN, 5, 5, 14), (CFG_TEXT, 0, 0, 14), (CFG_IMG, 5, 5, 14)]
    assert queries[0].positions() == [5] * 14 and queries[0].mask == "full"
    assert queries[0].segment.expert() == [0] + [1] * 12 + [0]
    assert _cursors(layout) == before
    assert [q.context for q in plan_denoise_step(layout, 12, cfg_text=True, cfg_img=False)] == [GEN, CFG_TEXT]


def test_text_to_image_contexts():
    layout = SequenceLayout(T)
    ops = plan_generation_prefill(layout, [TextInput((7, 8, 9))])
    assert [type(op).__name__ for op in ops] == ["Fork", "Append", "Append"]
    assert ops[0] == Fork(GEN, CFG_TEXT) and ops[1].context == GEN and ops[2].context == CFG_IMG
    assert _cursors(layout) == {GEN: (5, 5), CFG_TEXT: (0, 0), CFG_IMG: (5, 5)}


def test_edit_contexts_vae_then_vit_then_snapshot_then_text():
    layout = SequenceLayout(T)
    ops = plan_generation_prefill(layout, [ImageInput(vae_tokens=12, vit_tokens=9), TextInput((7, 8))])
    kinds = [(type(op).__name__, getattr(op, "context", None), getattr(getattr(op, "segment", None), "kind", None))
             for op in ops]
    assert kinds == [("Append", GEN, "vae"), ("Append", GEN, "vit"), ("Fork", None, None), ("Fork", None, None),
                     ("Append", GEN, "text"), ("Append", CFG_IMG, "text")]
    assert ops[1].kv_start == 14 and ops[1].position == 1 and ops[4].position == 2
    assert _cursors(layout) == {GEN: (14 + 11 + 4, 6), CFG_TEXT: (25, 2), CFG_IMG: (4, 4)}


def test_think_mode_system_prompt_and_plan():
    layout = SequenceLayout(T)
    ops = plan_generation_prefill(layout, [TextInput((7,))], system_ids=(5, 6))
    assert [(getattr(o, "context", None)) for o in ops[:2]] == [GEN, CFG_IMG]
    assert _cursors(layout) == {GEN: (7, 7), CFG_IMG: (7, 7), CFG_TEXT: (4, 4)}
    assert plan_think_start(layout) == [Fork(GEN, THINK)]
    first = decode_start(layout, THINK)
    assert first.segment.token_ids() == [1] and first.positions() == [7] and first.kv_start == 7
    layout.tokens_append(THINK, [42])
    end = plan_think_end(layout, [42])
    assert end[0] == Drop(THINK) and isinstance(end[1], Append) and end[1].context == GEN
    assert end[1].positions() == [7, 8, 9] and THINK not in layout.cursors
    assert _cursors(layout)[CFG_TEXT] == (4, 4) and _cursors(layout)[CFG_IMG] == (7, 7)


def test_understanding_uses_vit_blocks_only():
    layout = SequenceLayout(T)
    ops = plan_understanding_prefill(layout, [ImageInput(vae_tokens=0, vit_tokens=6), TextInput((7, 8))])
    assert [op.segment.kind for op in ops] == ["vit", "text"] and all(op.context == GEN for op in ops)
    assert _cursors(layout) == {GEN: (8 + 4, 5)}


def test_resize_rules_follow_the_release():
    assert VAE_RESIZE.fit(1024, 1024) == (1024, 1024)
    assert VAE_RESIZE.fit(4000, 3000) == (1024, 768)
    assert VAE_RESIZE.fit(300, 200) == (768, 512)  # short side raised to 512, long side follows
    assert VIT_RESIZE.fit(1024, 768) == (980, 728)
    assert VIT_RESIZE.fit(100, 100) == (224, 224)
    assert ResizeRule(64, 32, 16).fit(64, 48) == (64, 48)
    w, h = VAE_RESIZE.fit(5000, 1000)
    assert w <= 1024 and w % 16 == 0 and h % 16 == 0


def test_parameters_take_each_tasks_defaults():
    gen = BagelImageParams().resolve(GENERATE)
    assert (gen.num_timesteps, gen.cfg_text_scale, gen.cfg_img_scale, gen.cfg_interval, gen.cfg_renorm_type,
            gen.cfg_renorm_min, gen.timestep_shift, gen.size) == (50, 4.0, 1.5, (0.4, 1.0), "global", 0.0, 3.0, (1024, 1024))
    edit = BagelImageParams().resolve(EDIT)
    assert (edit.cfg_img_scale, edit.cfg_interval, edit.cfg_renorm_type, edit.size) == (2.0, (0.0, 1.0), "text_channel", None)
    custom = parse_image_params({"cfg_text_scale": 6, "cfg_interval": [0.2, 0.9], "size": "768x1024",
                                 "think": True}).resolve(GENERATE)
    assert (custom.cfg_text_scale, custom.cfg_interval, custom.size, custom.think) == (6.0, (0.2, 0.9), (768, 1024), True)


@pytest.mark.parametrize(("data", "task", "field"), [
    ({"size": "1000x1024"}, GENERATE, "size"),
    ({"size": "2048x1024"}, GENERATE, "size"),
    ({"size": "big"}, GENERATE, "size"),
    ({"size": "512x512"}, EDIT, "size"),
    ({"n": 2}, GENERATE, "n"),  # one image per request: the image routes' n makes n requests
    ({"cfg_text_scale": -1}, GENERATE, "cfg_text_scale"),
    ({"cfg_img_scale": 100}, EDIT, "cfg_img_scale"),
    ({"cfg_interval": [0.8, 0.2]}, GENERATE, "cfg_interval"),
    ({"cfg_interval": [0.1]}, GENERATE, "cfg_interval"),
    ({"cfg_renorm_type": "none"}, GENERATE, "cfg_renorm_type"),
    ({"cfg_renorm_min": 1.5}, GENERATE, "cfg_renorm_min"),
    ({"timestep_shift": 0}, GENERATE, "timestep_shift"),
    ({"num_timesteps": 1}, GENERATE, "num_timesteps"),
    ({"num_timesteps": "fifty"}, GENERATE, "num_timesteps"),
    ({"think": "yes"}, GENERATE, "think"),
    ({"guidance": 3}, GENERATE, "guidance"),
])
def test_bad_parameters_name_their_field(data, task, field):
    with pytest.raises(InvalidRequest) as e:
        parse_image_params(data).resolve(task, ImageLimits(max_side=1024))
    assert e.value.param == field
