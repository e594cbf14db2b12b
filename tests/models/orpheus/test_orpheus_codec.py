"""The SNAC stream consumer: emission rule, noise seeding, batching, against the snac package offline."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from walkserve.core.errors import ConfigError
from walkserve.core.sampling import SamplingParams
from walkserve.engines.base import Firing
from walkserve.engines.stateless import component_batch
from walkserve.models.orpheus.codec import OrpheusCodec
from walkserve.models.orpheus.emission import POLICY, plan_window, request_seed, window_seed
from walkserve.models.orpheus.tokens import AudioTokenError, frames_to_codes
from walkserve.models.snac.tiny import write_snac
from walkserve.streaming.policy import SlidingWindow, Span

torch.set_num_threads(1)
N_TOKENS = [0, 6, 7, 27, 28, 29, 34, 35, 70, 71]


def audio_ids(n: int, seed: int) -> torch.Tensor:
    """``n`` audio token ids as the LM writes them: <custom_token_N>, N = code + 10 + (i mod 7) * 4096."""
    codes = torch.randint(0, 4096, (n,), generator=torch.Generator().manual_seed(seed))
    return 128256 + 10 + codes + (torch.arange(n) % 7) * 4096


def stream_spans(n: int) -> list[Span]:
    """Every chunk of an ended stream of ``n`` tokens under the codec's policy, in order."""
    spans, i = [], 0
    while (span := POLICY.span(i, n, ended=True)) is not None:
        spans.append(span)
        i += 1
    return spans


def firings(request_id: str, ids: torch.Tensor, seed: int | None) -> list[Firing]:
    sampling = SamplingParams(seed=seed) if seed is not None else None
    return [
        Firing(
            id=k,
            request_id=request_id,
            walk="snac_chunk",
            node="snac",
            component="snac",
            op="decode",
            path=(s.index,),
            inputs={"codes": ids[s.start : s.end]},
            outputs=("audio",),
            sampling=sampling,
            spans={"codes": s},
        )
        for k, s in enumerate(stream_spans(len(ids)))
    ]


def stream_audio(codec: OrpheusCodec, fs: list[Firing]) -> torch.Tensor:
    """Fire chunk by chunk as a stream would, concatenating what each emits."""
    outs = [codec.forward_batch(component_batch([f]))[0]["audio"] for f in fs]
    assert all(o.dtype == torch.float32 and o.dim() == 1 for o in outs)
    return torch.cat(outs) if outs else torch.zeros(0)


@pytest.fixture(scope="module")
def codec(tiny_snac_dir) -> OrpheusCodec:
    return OrpheusCodec.from_dir(tiny_snac_dir, device="cpu")


@pytest.fixture(scope="module")
def reference(tiny_snac_dir):
    snac = pytest.importorskip("snac")
    model = snac.SNAC(**json.loads((tiny_snac_dir / "config.json").read_text()))
    model.load_state_dict(load_file(str(tiny_snac_dir / "model.safetensors")), strict=True)
    return model.eval()


def reference_audio(model, ids: torch.Tensor, base_seed: int) -> torch.Tensor:
    """Frame f comes from the window of 4 frames starting at min(max(f - 1, 0), W - 1), decoded by the snac
    package with its RNG seeded for that window; with no full window, all F frames are decoded together."""
    n_frames, n_windows = len(ids) // 7, POLICY.n_windows(len(ids))
    cache: dict[int, torch.Tensor] = {}

    def window(first: int, count: int) -> torch.Tensor:
        if first not in cache:
            tok = ids[7 * first : 7 * (first + count)]
            codes = (tok - 128266 - (torch.arange(len(tok)) % 7) * 4096).view(count, 7)
            levels = [codes[:, [0]], codes[:, [1, 4]], codes[:, [2, 3, 5, 6]]]
            torch.manual_seed(window_seed(base_seed, 7 * first))
            with torch.inference_mode():
                cache[first] = model.decode([lv.reshape(1, -1) for lv in levels])[0, 0]
        return cache[first]

    frames = []
    for f in range(n_frames):
        first = min(max(f - 1, 0), n_windows - 1) if n_windows else 0
        wave = window(first, 4 if n_windows else n_frames)
        frames.append(wave[(f - first) * 2048 : (f - first + 1) * 2048])
    return torch.cat(frames) if frames else torch.zeros(0)


@pytest.mark.parametrize("n", N_TOKENS)
def test_emission_plan_covers_each_frame_once(n):
    emitted = []
    for span in stream_spans(n):
        plan = plan_window(span)
        emitted += range(plan.first_frame + plan.emit_start, plan.first_frame + plan.emit_end)
        assert span.start + plan.n_tokens <= span.end
    assert emitted == list(range(n // 7))


@pytest.mark.parametrize("n", N_TOKENS)
def test_stream_matches_offline_reference(codec, reference, n):
    ids = audio_ids(n, seed=n)
    audio = stream_audio(codec, firings("req-a", ids, seed=1234))
    assert audio.shape == ((n // 7) * 2048,)
    expected = reference_audio(reference, ids, request_seed("req-a", 1234))
    assert expected.shape == audio.shape
    if n >= 7:
        assert expected.abs().max() > 0.1
    torch.testing.assert_close(audio, expected, rtol=1e-4, atol=2e-5)


def test_batching_across_requests_does_not_change_audio(codec):
    requests = {"r1": (29, 5), "r2": (71, None), "r3": (20, 9), "r4": (34, 5)}
    streams = {
        rid: firings(rid, audio_ids(n, seed=len(rid) + n), seed)
        for rid, (n, seed) in requests.items()
    }
    alone = {rid: stream_audio(codec, fs) for rid, fs in streams.items()}
    everything = [f for fs in streams.values() for f in fs]
    order = torch.randperm(len(everything), generator=torch.Generator().manual_seed(0)).tolist()
    batch = [everything[k] for k in order]
    outs = codec.forward_batch(component_batch(batch))  # windows of 4 frames and a 2-frame final share one call
    assert len(outs) == len(batch)
    for rid, fs in streams.items():
        got = torch.cat([outs[batch.index(f)]["audio"] for f in fs])
        torch.testing.assert_close(got, alone[rid], rtol=1e-4, atol=1e-5)


def test_noise_seed_comes_from_the_request(codec):
    ids = audio_ids(35, seed=1)
    same = [stream_audio(codec, firings("req-x", ids, seed=None)) for _ in range(2)]
    assert torch.equal(same[0], same[1])
    other_id = stream_audio(codec, firings("req-y", ids, seed=None))
    other_seed = stream_audio(codec, firings("req-x", ids, seed=7))
    assert (other_id - same[0]).abs().max() > 1e-3 and (other_seed - same[0]).abs().max() > 1e-3
    assert request_seed("req-x", 7) == 7 and request_seed("req-x", None) == request_seed(
        "req-x", None
    )
    assert window_seed(7, 0) != window_seed(7, 7)


def test_final_chunk_redecodes_the_last_window_identically(codec):
    ids = audio_ids(35, seed=3)
    regular, final = firings("req-f", ids, seed=11)[1:]
    assert (regular.spans["codes"].start, final.spans["codes"].start) == (7, 7)
    levels = [c.unsqueeze(0) for c in frames_to_codes(ids[7:35], 7)]
    gen = torch.Generator().manual_seed(window_seed(request_seed("req-f", 11), 7))
    window = codec.decoder.decode(levels, [gen])[0, 0]  # frames 1..4, decoded directly
    assert torch.equal(codec.forward_batch(component_batch([regular]))[0]["audio"], window[2048:4096])
    assert torch.equal(codec.forward_batch(component_batch([final]))[0]["audio"], window[4096:8192])


def test_bad_token_names_the_request(codec):
    ids = audio_ids(28, seed=4)
    ids[9] = 128258  # END_OF_SPEECH inside the stream
    with pytest.raises(
        AudioTokenError, match=r"request req-bad: Orpheus audio token 9 \(frame position 2\)"
    ):
        codec.forward_batch(component_batch(firings("req-bad", ids, seed=1)[:1]))


def test_plan_rejects_spans_of_another_policy():
    with pytest.raises(ValueError, match="expected a 28-token window"):
        plan_window(SlidingWindow(14, 7).span(0, 20, ended=False))
    with pytest.raises(ValueError, match="not on a frame"):
        plan_window(Span(1, 3, 31, 25))


def test_codec_needs_an_orpheus_shaped_snac(tmp_path):
    path = write_snac(tmp_path, "tiny", overrides={"vq_strides": [8, 4, 2, 1]})
    with pytest.raises(ConfigError, match="Orpheus needs a SNAC codec with vq_strides"):
        OrpheusCodec.from_dir(path)
