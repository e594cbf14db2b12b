"""The processor's side: chat template, placeholder expansion and features against the transformers processor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.qwen3_omni.conftest import IDS, rgb, wave
from walkserve.models.qwen3_omni.config import Qwen3OmniConfig
from walkserve.models.qwen3_omni.thinker.image_processor import VisionPreprocess
from walkserve.models.qwen3_omni.thinker.prompt import (
    expand_placeholders,
    media_spans,
    template_messages,
)
from walkserve.models.qwen3_omni.thinker.request import build_thinker_request
from walkserve.models.tokenizer import Tokenizer

MESSAGES = [
    {"role": "system", "content": "You are Qwen."},
    {"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "and"}, {"type": "image"},
                                 {"type": "text", "text": "What is this?"}, {"type": "audio"}]},
]


@pytest.fixture(scope="module")
def hf_processor(ours_dir):
    from transformers import AutoTokenizer, Qwen3OmniMoeProcessor, WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class NoVideoProcessor(Qwen3OmniMoeProcessor):  # the video processor needs torchvision
        def check_argument_for_proper_class(self, name, arg):
            return None if name == "video_processor" and arg is None else super().check_argument_for_proper_class(name, arg)

    tok = AutoTokenizer.from_pretrained(ours_dir)
    fe = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, n_fft=400)
    ip = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3,
                                  image_std=[0.5] * 3, size={"shortest_edge": 32 * 32, "longest_edge": 256 * 256})
    return NoVideoProcessor(image_processor=ip, video_processor=None, feature_extractor=fe, tokenizer=tok,
                            chat_template=tok.chat_template)


@pytest.mark.parity
def test_request_equals_the_reference_processor(ours_dir, hf_processor, hf_model):
    """Audio + image + text + audio in one message: ids, features, patches and positions as the processor's."""
    from PIL import Image

    clips, image = [wave(1.73, 1), wave(0.91, 2)], rgb(70, 100)
    tokenizer, config = Tokenizer.from_dir(ours_dir), Qwen3OmniConfig.from_file(ours_dir)
    settings = VisionPreprocess.from_checkpoint(ours_dir)
    ours = build_thinker_request(tokenizer, config, MESSAGES, audio=clips, images=[image], image_settings=settings)
    text = hf_processor.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text == tokenizer.apply_chat_template(template_messages(MESSAGES))
    ref = hf_processor(text=[text], audio=clips, images=[Image.fromarray(image)], return_tensors="pt")
    assert ours.input_ids == ref["input_ids"][0].tolist()  # the clips are whole 10 ms frames: the same counts
    assert [m.shape[1] for m in ours.audio] == ref["feature_attention_mask"].sum(-1).tolist()
    # each clip's features are the processor's for that clip alone (the joint call pads the 0.91 s clip with
    # zeros to the 1.73 s one, which changes its last frame: serving keeps a clip independent of the others)
    for clip, mel in zip(clips, ours.audio, strict=True):
        alone = hf_processor.feature_extractor([clip], sampling_rate=16000, padding=True, truncation=False,
                                               return_attention_mask=True, return_tensors="pt")
        assert mel.shape[1] == int(alone["attention_mask"].sum())
        want = alone["input_features"][0, :, : mel.shape[1]].numpy()
        np.testing.assert_allclose(mel, want, rtol=0, atol=2e-5)  # the float32 torch.stft backend, see test_encoders
    np.testing.assert_allclose(ours.audio[0], ref["input_features"][0].numpy(), rtol=0, atol=2e-5)  # the longest
    np.testing.assert_allclose(ours.images[0].pixel_values, ref["pixel_values"].numpy(), rtol=0, atol=1e-6)
    assert list(ours.images[0].grid_thw) == ref["image_grid_thw"][0].tolist()
    want, _ = hf_model.thinker.model.get_rope_index(ref["input_ids"], ref["image_grid_thw"], None,
                                                   ref["attention_mask"], False, ref["feature_attention_mask"].sum(-1))
    np.testing.assert_array_equal(ours.positions.positions, want[:, 0].numpy())


def test_placeholders_expand_in_order_and_spans_follow():
    from walkserve.models.qwen3_omni.config import OmniTokenIds

    t = OmniTokenIds(audio_token_id=7, image_token_id=8, video_token_id=9)
    ids = [1, 7, 2, 8, 3, 7, 4, 9]
    out = expand_placeholders(ids, t, audio=[2, 3], images=[4], videos=[1])
    assert out == [1, 7, 7, 2, 8, 8, 8, 8, 3, 7, 7, 7, 4, 9]
    spans = [(s.kind, s.index, s.start, s.end) for s in media_spans(out, t)]
    assert spans == [("audio", 0, 1, 3), ("image", 0, 4, 8), ("audio", 1, 9, 12), ("video", 0, 13, 14)]
    with pytest.raises(ValueError, match="more audio placeholders than the 1"):
        expand_placeholders(ids, t, audio=[2], images=[4], videos=[1])
    with pytest.raises(ValueError, match="has 1 image placeholder"):
        expand_placeholders(ids, t, audio=[2, 3], images=[4, 4], videos=[1])
    with pytest.raises(ValueError, match="unsupported content part"):
        template_messages([{"role": "user", "content": [{"type": "file"}]}])
    parts = template_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}},
                                                            {"type": "input_audio"}, {"type": "video_url"}]}])
    assert [p["type"] for p in parts[0]["content"]] == ["image", "audio", "video"]


def test_rope_index_rejects_mismatched_media(components):
    from walkserve.models.qwen3_omni.thinker.rope_index import MediaGrids, rope_index

    tokens = components.config.tokens
    ids = [1, IDS["vision_start"], IDS["image_pad"], IDS["image_pad"], IDS["vision_end"], 2]
    with pytest.raises(ValueError, match="placeholder tokens"):
        rope_index(ids, MediaGrids(image_grids=[(1, 4, 4)]), tokens)
    with pytest.raises(ValueError, match="more image blocks"):
        rope_index(ids + ids, MediaGrids(image_grids=[(1, 2, 4)]), tokens)
    got = rope_index(ids, MediaGrids(image_grids=[(1, 2, 4)]), tokens)
    assert got.positions.tolist() == [[0, 1, 2, 2, 4, 5], [0, 1, 2, 2, 4, 5], [0, 1, 2, 3, 4, 5]]
    assert got.next_position == 6 and torch.tensor(got.positions).dtype == torch.int64


def test_processor_side_modules_do_not_import_torch():
    """What the frontend runs (template, features, patches, positions, decoding) stays torch-free."""
    import subprocess
    import sys

    modules = ["thinker.request", "thinker.audio_load", "thinker.audio_features", "thinker.image_processor",
               "thinker.video", "thinker.prompt", "thinker.rope_index", "thinker.media_tokens", "config", "tiny_layout"]
    code = ("import sys\n" + "".join(f"import walkserve.models.qwen3_omni.{m}\n" for m in modules)
            + "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
