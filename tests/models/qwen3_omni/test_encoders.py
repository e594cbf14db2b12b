"""Audio and vision encoders, log-mel features and image preprocessing against the transformers reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.qwen3_omni.conftest import rgb, wave
from walkserve.engines.spec import Batch
from walkserve.models.qwen3_omni.thinker.audio_encoder import AudioEncoder
from walkserve.models.qwen3_omni.thinker.audio_features import log_mel_batch, log_mel_clip
from walkserve.models.qwen3_omni.thinker.content_keys import audio_window_keys
from walkserve.models.qwen3_omni.thinker.image_processor import (
    VisionPreprocess,
    preprocess_image,
    preprocess_video,
)
from walkserve.models.qwen3_omni.thinker.media_tokens import audio_token_count


@pytest.fixture(scope="module")
def whisper():
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, n_fft=400)


@pytest.mark.parity
@pytest.mark.parametrize("seconds", [[2.37], [0.83], [4.51, 1.2, 0.5]])
def test_log_mel_equals_whisper_feature_extractor(seconds, whisper, monkeypatch):
    """The processor's padding: to the longest clip of the request (not 30 s), mask from the sample mask.

    The extractor has two backends: numpy (float64 STFT, what ours computes) and, when torch is installed,
    a float32 torch.stft. They differ from each other by up to ~1.4e-5 on quiet bins; ours is within 1e-5
    of the numpy one and 2e-5 of the torch one.
    """
    from transformers.models.whisper import feature_extraction_whisper

    clips = [wave(s, seed=i) for i, s in enumerate(seconds)]
    kw = dict(sampling_rate=16000, padding=True, truncation=False, return_attention_mask=True, return_tensors="np")
    with_torch = whisper(clips, **kw)
    monkeypatch.setattr(feature_extraction_whisper, "is_torch_available", lambda: False)
    numpy_only = whisper(clips, **kw)
    got = log_mel_batch(clips)
    assert got.features.shape == numpy_only["input_features"].shape
    np.testing.assert_allclose(got.features, numpy_only["input_features"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(got.features, with_torch["input_features"], rtol=0, atol=2e-5)
    assert list(got.frames) == numpy_only["attention_mask"].sum(-1).tolist()


@pytest.mark.parity
def test_each_clip_of_a_request_gets_its_features_alone(whisper, monkeypatch):
    """The serving path computes a clip's features as the processor computes that clip given alone, so an
    earlier clip's features (and content keys) stay the same when a later, longer clip joins the request."""
    from transformers.models.whisper import feature_extraction_whisper

    from walkserve.models.qwen3_omni.thinker.media_inputs import mel_features

    monkeypatch.setattr(feature_extraction_whisper, "is_torch_available", lambda: False)
    short, long = wave(1.23, seed=1), wave(3.1, seed=2)
    kw = dict(sampling_rate=16000, padding=True, truncation=False, return_tensors="np")
    got = mel_features([short, long], 128)
    for clip, ours in zip((short, long), got, strict=True):
        alone = whisper([clip], **kw)["input_features"][0]
        assert ours.shape == alone.shape
        np.testing.assert_allclose(ours, alone, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(got[0], mel_features([short], 128)[0])
    # padded to the longest (the batch call), the short clip's frames would differ: what this avoids
    assert not np.array_equal(log_mel_batch([short, long]).clip(0), got[0])


def test_a_clip_resent_longer_filters_only_its_new_frames_to_the_same_bits(monkeypatch):
    from walkserve.models.qwen3_omni.thinker import audio_features, mel_cache
    from walkserve.models.qwen3_omni.thinker.mel_cache import MelCache

    x, cache, reused = wave(4.3, seed=4), MelCache(), []
    real = audio_features.mel_power
    monkeypatch.setattr(mel_cache, "mel_power", lambda w, n, done=None: reused.append(
        0 if done is None else done.shape[1]) or real(w, n, done))
    for n in (5000, 21000, 21050, 52000, len(x)):
        np.testing.assert_array_equal(cache.features(x[:n], 128), log_mel_clip(x[:n]))
    assert reused == [0, 0, 100, 100, 300]  # whole blocks of 100 frames that read no sample past the cut
    other = wave(4.3, seed=5)
    np.testing.assert_array_equal(cache.features(other, 128), log_mel_clip(other))
    assert reused[-1] == 0


def test_encoded_windows_are_reused_when_a_clip_grows(components):
    """A clip encoded while it arrived, then longer: the windows whose features are the same (26 tokens of
    200 frames each here) come from the cache; the output equals encoding the long clip with no cache (to
    float rounding: the cached windows were computed in another packed batch, as any batching changes)."""
    audio = components.audio
    fresh = AudioEncoder(audio.config, window_cache=0)
    fresh.load_state_dict(audio.state_dict())
    mel = log_mel_clip(wave(5.3, seed=7))  # 530 frames: windows of 200, 200, 130
    grown, partial = mel, np.ascontiguousarray(mel[:, :437])  # the first two windows complete, same frames
    encoded = []
    real = AudioEncoder._encode
    audio.window_cache = type(audio.window_cache)(8)
    try:
        audio._encode = lambda windows: encoded.append([m.shape[1] for m, _ in windows]) or real(audio, windows)
        audio.forward_batch(Batch.of([{"mel": torch.from_numpy(partial)}]))
        got = audio.forward_batch(Batch.of([{"mel": torch.from_numpy(grown)}]))[0]["audio_embeds"]
    finally:
        del audio._encode
    assert encoded == [[200, 200, 37], [130]]  # only the last window of the grown clip is encoded
    want = fresh.forward_batch(Batch.of([{"mel": torch.from_numpy(grown)}]))[0]["audio_embeds"]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert audio_window_keys(partial, 200)[:2] == audio_window_keys(grown, 200)[:2]
    assert audio_window_keys(partial, 200)[2] != audio_window_keys(grown, 200)[2]


@pytest.mark.parity
def test_audio_encoder_matches_reference(components, hf_model):
    """One call with three clips: 4.51 s (crosses 26-token windows), 1.2 s, and a 0.5 s clip alone."""
    audio = components.audio
    batch = log_mel_batch([wave(4.51, 1), wave(1.2, 2)])
    short = log_mel_batch([wave(0.5, 3)]).clip(0)
    clips = [batch.clip(0), batch.clip(1), short]
    got = [o["audio_embeds"] for o in audio.forward_batch(Batch.of([{"mel": torch.from_numpy(c)} for c in clips]))]
    for clip, ours in zip(clips, got):
        feats = torch.from_numpy(clip)[None]  # [1, 128, F]
        mask = torch.ones(1, clip.shape[1], dtype=torch.long)
        with torch.no_grad():
            want = hf_model.thinker.model.get_audio_features(feats, mask).last_hidden_state
        assert ours.shape == (audio_token_count(clip.shape[1]), 64) == want.shape
        torch.testing.assert_close(ours, want, rtol=0, atol=1e-4)
    assert got[0].shape[0] > 2 * 26  # three attention windows of 26 tokens (n_window_infer 200)


def _hf_vision(hf_model, items):
    pixels = torch.from_numpy(np.concatenate([v.pixel_values for v in items]))
    grids = torch.tensor([v.grid_thw for v in items])
    with torch.no_grad():
        out = hf_model.thinker.model.get_image_features(pixels, grids)
    return out.pooler_output, out.deepstack_features


@pytest.mark.parity
def test_vision_encoder_matches_reference(components, hf_model):
    """An image and a 3-frame video (padded to 4) in one batch: merged tokens and all three deepstack levels."""
    settings = VisionPreprocess(min_pixels=32 * 32, max_pixels=128 * 128)
    image = preprocess_image(rgb(70, 100), settings)
    video = preprocess_video([rgb(64, 96, seed=s) for s in range(3)], settings)
    got = components.vision.forward_batch(Batch.of([{"pixel_values": torch.from_numpy(v.pixel_values),
                                            "grid_thw": torch.tensor(v.grid_thw)} for v in (image, video)]))
    for item, ours in zip((image, video), got):
        tokens, deepstack = _hf_vision(hf_model, [item])
        torch.testing.assert_close(ours["image_embeds"], tokens[0], rtol=0, atol=1e-4)
        assert ours["deepstack"].shape[1] == 3
        for level, want in enumerate(deepstack):
            torch.testing.assert_close(ours["deepstack"][:, level], want[0], rtol=0, atol=1e-4)
    assert video.grid_thw == (2, 4, 6)


@pytest.mark.parity
@pytest.mark.parametrize("size", [(70, 100), (300, 200), (33, 47)])
def test_image_preprocessing_equals_the_pil_processor(size):
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    ref = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3,
                                   image_std=[0.5] * 3, size={"shortest_edge": 32 * 32, "longest_edge": 128 * 128})
    image = rgb(*size, seed=size[0])
    want = ref(images=[Image.fromarray(image)], return_tensors="np")
    got = preprocess_image(image, VisionPreprocess(min_pixels=32 * 32, max_pixels=128 * 128))
    assert list(got.grid_thw) == want["image_grid_thw"][0].tolist()
    np.testing.assert_allclose(got.pixel_values, want["pixel_values"], rtol=0, atol=1e-6)
