"""Code2Wav, whole and streamed: against transformers, against itself at every chunk boundary, and its receptive field."""

from __future__ import annotations

import pytest
import torch

from tests.models.qwen3_omni.speech_oracle import CODEBOOK, GROUPS, reference
from walkserve.engines.base import Firing
from walkserve.engines.stateless import component_batch
from walkserve.models.qwen3_omni.speech.code2wav_geometry import Code2WavGeometry, plan_chunk
from walkserve.models.qwen3_omni.speech.code2wav_stream import POLICY, Code2WavStream
from walkserve.models.qwen3_omni.speech.weights import load_code2wav
from walkserve.streaming.policy import LeftContext, Span

pytestmark = pytest.mark.parity
torch.set_num_threads(1)
RELEASE = Code2WavGeometry((2, 2), (8, 5, 4, 3), sliding_window=72, num_layers=8)


@pytest.fixture(scope="module")
def vocoder():
    return load_code2wav(reference().path, progress=False)


@pytest.fixture(scope="module")
def frames() -> torch.Tensor:
    return torch.randint(0, CODEBOOK, (61, GROUPS), generator=torch.Generator().manual_seed(3))  # [F, 16]


@pytest.fixture(scope="module")
def whole(vocoder, frames) -> torch.Tensor:
    with torch.no_grad():
        return vocoder(frames.T[None])[0, 0]  # [1920 F - 555]


def firing(i: int, frames: torch.Tensor, span: Span, request: str = "r") -> Firing:
    return Firing(i, request, "talker_decode", "code2wav", "code2wav", "forward", (i,),
                  {"codes": frames[span.start : span.end]}, ("audio",), spans={"codes": span})


def streamed(stream: Code2WavStream, frames: torch.Tensor, policy: LeftContext) -> list[torch.Tensor]:
    """Each chunk's audio, in order, as the stream delivers the chunks (the last one flushed at end of stream)."""
    out, i = [], 0
    while (span := policy.span(i, frames.shape[0], ended=True)) is not None:
        out.append(stream.forward_batch(component_batch([firing(i, frames, span)]))[0]["audio"])
        i += 1
    return out


def test_geometry_of_the_release():
    assert RELEASE.frame_samples == 1920 and RELEASE.lookahead_samples == 8 * 60 + 5 * 12 + 4 * 3 + 3 == 555
    assert RELEASE.decoded_samples(25) == 47445  # what transformers' code2wav returns for 25 frames
    assert RELEASE.conv_reach(25) == 10 and RELEASE.attention_reach == 8 * 71
    assert RELEASE.exact_context() == 578  # LeftContext(25, 25) is an approximation for the release
    assert RELEASE.emitted(0, 25) == (0, 47445) and RELEASE.emitted(25, 50) == (47445, 95445)
    plan = plan_chunk(Span(2, 25, 75, 25), RELEASE)  # new frames 50..74 after 25 of context
    assert (plan.first_frame, plan.n_frames, plan.keep_lo, plan.keep_hi) == (25, 50, 47445, 95445)


def test_whole_decode_matches_transformers(vocoder, frames, whole):
    with torch.no_grad():
        want = reference().model.code2wav(frames.T[None])[0, 0]
    assert whole.shape == want.shape == (1920 * 61 - 555,)
    assert float(want.std()) > 0.1  # the perturbed vocoder is audible, not ~5e-7
    assert float((whole - want).abs().max()) <= 2e-3 * float(want.abs().max())


@pytest.mark.parametrize("policy", [POLICY, LeftContext(7, 24), LeftContext(13, 30), LeftContext(61, 25)],
                         ids=str)
def test_stream_equals_the_whole_decode_at_every_boundary(vocoder, frames, whole, policy):
    stream = Code2WavStream(vocoder)
    chunks = streamed(stream, frames, policy)
    n_new = [min(policy.size, 61 - i * policy.size) for i in range(len(chunks))]
    assert [c.shape[0] for c in chunks] == [1920 * n - (555 if i == 0 else 0) for i, n in enumerate(n_new)]
    got = torch.cat(chunks)
    assert got.shape == whole.shape  # nothing lost or doubled at a boundary
    assert float((got - whole).abs().max()) <= 2e-3 * float(whole.abs().max())


def test_the_receptive_field_is_exact(vocoder, frames, whole):
    """Frame j reaches sample t of a whole decode iff j is inside the geometry's reach: bitwise, both sides."""
    geometry = vocoder.geometry
    assert geometry.exact_context() == 24 <= POLICY.context  # tiny: window 8, 2 layers
    a = 40  # a chunk whose new frames start at 40 first emits sample e
    e = geometry.emitted(a, a + 1)[0]
    first_needed = a - geometry.exact_context()
    last = geometry.decoded_samples(a)  # frames [0, a) finalise samples [0, last); sample `last` needs frame a
    changed = {}
    for j in (first_needed - 1, first_needed, a):
        other = frames.clone()
        other[j] = (other[j] + 1) % CODEBOOK
        with torch.no_grad():
            changed[j] = vocoder(other.T[None])[0, 0] != whole
    assert not changed[first_needed - 1][e] and changed[first_needed][e]  # the left reach is tight
    assert not changed[a][:last].any() and changed[a][last]  # one frame of look-ahead, 555 samples


def test_batched_firings_equal_single_ones(vocoder, frames):
    """Rows never mix; batched convolutions round differently (~2e-4 of peak here), inside the audio tolerance."""
    stream = Code2WavStream(vocoder)
    spans = [POLICY.span(1, 50, False), POLICY.span(1, 50, False), POLICY.span(0, 50, False)]
    inputs = [frames[:50], frames[5:55], frames[:25]]  # two 50-frame chunks batched, one first chunk alone
    batch = [Firing(k, f"r{k}", "w", "code2wav", "code2wav", "forward", (1,), {"codes": x}, ("audio",),
                    spans={"codes": s}) for k, (x, s) in enumerate(zip(inputs, spans))]
    together = stream.forward_batch(component_batch(batch))
    for f, out in zip(batch, together):
        alone = stream.forward_batch(component_batch([f]))[0]["audio"]
        assert out["audio"].shape == alone.shape
        assert float((out["audio"] - alone).abs().max()) <= 2e-3 * float(alone.abs().max())


def test_a_chunk_that_does_not_match_its_span_is_refused(vocoder, frames):
    stream = Code2WavStream(vocoder)
    span = POLICY.span(0, 30, False)
    with pytest.raises(ValueError, match="holds 24 frames but its span covers 25"):
        stream.forward_batch(component_batch([Firing(0, "r", "w", "c", "c", "f", (0,), {"codes": frames[:24]}, ("audio",),
                                     spans={"codes": span})]))
    bad = frames[:25].clone()
    bad[3, 2] = CODEBOOK
    with pytest.raises(ValueError, match="outside"):
        stream.forward_batch(component_batch([Firing(0, "r", "w", "c", "c", "f", (0,), {"codes": bad}, ("audio",),
                                     spans={"codes": span})]))


def test_transformers_chunked_decode_loses_555_samples_per_boundary(vocoder, frames, whole):
    """What we do not copy: each of its chunks drops its last 555 samples, which the next chunk never emits."""
    with torch.no_grad():
        theirs = reference().model.code2wav.chunked_decode(frames.T[None], chunk_size=25, left_context_size=25)[0, 0]
    assert theirs.shape[0] == whole.shape[0] - 2 * 555  # 61 frames: 3 chunks, 2 boundaries
    tol = 2e-3 * float(whole.abs().max())
    assert float((theirs[:47445] - whole[:47445]).abs().max()) <= tol
    assert float((theirs[47445:94890] - whole[48000:95445]).abs().max()) <= tol  # samples 47445..47999 are gone
