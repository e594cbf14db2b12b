"""Audio decoding and resampling to 16 kHz, video decoding and frame sampling (torch-free paths)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from walkserve.models.qwen3_omni.thinker.audio_load import (
    AudioDecodeError,
    ResampleCache,
    final_outputs,
    load_audio,
    resample,
)
from walkserve.models.qwen3_omni.thinker.image_processor import VisionPreprocess
from walkserve.models.qwen3_omni.thinker.video import (
    VideoDecodeError,
    decode_video,
    sample_indices,
    video_from_frames,
)


def _tone(rate: int, seconds: float = 0.5, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t) + 0.2 * np.sin(2 * np.pi * 3100 * t)).astype(np.float32)


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_resample_is_band_limited_and_exact_in_band(rate):
    x = _tone(rate)
    y = resample(x, rate, 16000)
    assert len(y) == -(-len(x) * 16000 // rate) and y.dtype == np.float32
    want = _tone(16000)[: len(y)]
    inner = slice(200, len(y) - 200)  # away from the zero-padded edges
    assert np.abs(y[inner] - want[inner]).max() < 2e-3
    alias = resample(_tone(rate, hz=min(rate / 2 - 500, 11000)), rate, 16000)  # above 8 kHz: removed
    assert rate < 16000 or np.abs(alias[inner]).max() < 0.25
    np.testing.assert_array_equal(resample(x, 16000, 16000), x)


@pytest.mark.parametrize("fmt,subtype", [("WAV", "PCM_16"), ("FLAC", "PCM_16"), ("OGG", "VORBIS"), ("MP3", None)])
def test_audio_files_decode_to_mono_16k(fmt, subtype):
    stereo = np.stack([_tone(44100), _tone(44100)], axis=1)  # [N, 2]
    buffer = io.BytesIO()
    sf.write(buffer, stereo, 44100, format=fmt, subtype=subtype)
    y = load_audio(buffer.getvalue())
    want = _tone(16000)
    n = min(len(y), len(want))
    assert abs(len(y) - len(want)) < 1200  # lossy codecs pad the start/end a little
    corr = max(np.corrcoef(y[i : i + n - 2000], want[1000 : n - 1000])[0, 1] for i in range(0, 1200, 8))
    assert corr > 0.98


def test_undecodable_audio_is_a_typed_error():
    from walkserve.api.audio.pyav import encode_aac, pyav_available

    with pytest.raises(AudioDecodeError, match="libsndfile"):
        load_audio(b"RIFF not really a wave file")
    if pyav_available():  # AAC (what m4a holds) is not a libsndfile format
        with pytest.raises(AudioDecodeError):
            load_audio(encode_aac(_tone(16000), 16000))
    with pytest.raises(AudioDecodeError, match="longer than"):
        buffer = io.BytesIO()
        sf.write(buffer, _tone(16000, seconds=2.0), 16000, format="WAV")
        load_audio(buffer.getvalue(), max_seconds=1.0)


def test_frame_sampling_follows_fps_in_multiples_of_two():
    assert sample_indices(120, 30.0).tolist() == [0, 17, 34, 51, 68, 85, 102, 119]  # 4 s at 2 fps
    assert len(sample_indices(30, 30.0)) == 4  # 1 s: 2 frames, raised to the minimum of 4
    assert len(sample_indices(300, 30.0)) == 20  # 10 s at 2 fps
    assert len(sample_indices(3, 30.0)) == 2  # fewer frames than the minimum: as many as exist, even
    assert len(sample_indices(10_000, 30.0, max_frames=16)) == 16


def test_video_file_decodes_and_samples(tmp_path):
    av = pytest.importorskip("av")
    y, x = np.mgrid[0:64, 0:64]
    frames = [np.stack([128 + 90 * np.sin(x / 9 + s) * np.cos(y / 11 - c) for c in range(3)], -1).astype(np.uint8)
              for s in range(12)]  # smooth frames that differ from one another: mpeg4 keeps them well
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=6)
        stream.width = stream.height = 64
        stream.pix_fmt = "yuv420p"
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    settings = VisionPreprocess(min_pixels=32 * 32, max_pixels=64 * 64)
    video = decode_video(buffer.getvalue(), settings, fps=2.0)  # 2 s at 6 fps -> 4 frames at 2 fps
    assert video.vision.grid_thw == (2, 4, 4) and video.second_per_grid == pytest.approx(1.0)
    def distance(picked):
        direct = video_from_frames([frames[i] for i in picked], fps=2.0, settings=settings)
        return np.abs(video.vision.pixel_values - direct.vision.pixel_values).mean()

    assert distance((0, 4, 7, 11)) < 0.05 < distance((1, 5, 8, 10))  # the evenly spaced frames were kept
    with pytest.raises(VideoDecodeError):
        decode_video(b"\x00\x01 not a video", settings)


@pytest.mark.parametrize("rate", [24000, 44100, 8000])
def test_audio_resent_longer_is_resampled_only_where_new_and_to_the_same_bits(rate, monkeypatch):
    """Audio growing as it arrives (each request the audio so far): the cache computes the outputs that read
    new samples only, and every result is bitwise the whole resampling's."""
    from walkserve.models.qwen3_omni.thinker import audio_load

    x = np.random.default_rng(3).normal(0, 0.2, int(rate * 2.5)).astype(np.float32)
    cache, computed = ResampleCache(), []
    real = audio_load.resample
    monkeypatch.setattr(audio_load, "resample", lambda a, s, d, done=None: computed.append(
        len(done) if done is not None else 0) or real(a, s, d, done))
    for n in (rate // 3, rate, rate + 7, int(rate * 2.5)):
        got = cache.resample(x[:n], rate, 16000)
        np.testing.assert_array_equal(got, real(x[:n], rate, 16000))
    assert computed[0] == 0 and computed[1:] == [final_outputs(n, rate) for n in (rate // 3, rate, rate + 7)]
    assert computed[1] > 0.9 * rate // 3 * 16000 / rate  # all but the outputs near the cut came from the cache
    np.testing.assert_array_equal(cache.resample(x[: rate // 2][::-1].copy(), rate, 16000),
                                  real(x[: rate // 2][::-1].copy(), rate, 16000))  # another input: no prefix
