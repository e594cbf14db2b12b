"""Our SnacDecoder against the snac package on the same random weights and the same noise seeds."""

from __future__ import annotations

import pytest
import torch

from walkserve.models.snac import decoder as decoder_module
from walkserve.models.snac.spans import plan_spans
from walkserve.models.snac.tiny import write_snac
from walkserve.models.snac.weights import load_snac

torch.set_num_threads(1)
pytestmark = pytest.mark.parity


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    assert ref.abs().max() > 0.1  # a real waveform, not an all-zero match
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize(("n0", "seed"), [(1, 0), (3, 7), (4, 123)])
def test_tiny_matches_reference(tiny_snac_dir, oracle, n0, seed):
    ours, ref = load_snac(tiny_snac_dir), oracle.load(tiny_snac_dir)
    codes = oracle.codes(n0, seed=seed)
    audio = ours.decode(codes, [gen(seed)])
    assert audio.shape == (1, 1, n0 * 2048) and audio.dtype == torch.float32
    assert_close(audio, oracle.decode(ref, codes, seed))


def test_batched_rows_each_match_their_own_reference(tiny_snac_dir, oracle):
    ours, ref = load_snac(tiny_snac_dir), oracle.load(tiny_snac_dir)
    codes = oracle.codes(2, batch=3, seed=5)
    seeds = [11, 12, 13]
    audio = ours.decode(codes, [gen(s) for s in seeds])
    assert audio.shape == (3, 1, 4096)
    for row, seed in enumerate(seeds):
        row_codes = [c[row : row + 1] for c in codes]
        assert_close(audio[row : row + 1], oracle.decode(ref, row_codes, seed))
        alone = ours.decode(row_codes, [gen(seed)])
        assert torch.equal(audio[row : row + 1], alone)  # batch-invariant kernels: bit for bit


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("cache_elements", [decoder_module.CACHE_ELEMENTS, 2048])
def test_rows_decode_bit_identically_whatever_the_batch_and_threads(
    tiny_snac_dir, oracle, monkeypatch, threads, cache_elements
):
    """A row's samples do not depend on its batch neighbours, the thread count or row pieces."""
    ours = load_snac(tiny_snac_dir)
    codes = oracle.codes(4, batch=5, seed=8)
    alone = [ours.decode([c[r : r + 1] for c in codes], [gen(40 + r)]) for r in range(5)]
    monkeypatch.setattr(decoder_module, "CACHE_ELEMENTS", cache_elements)
    first, rows = ours._tail_plan(5, plan_spans(ours.cfg.decoder_rates, 16, (0, 4 * 2048)))
    # 2048: block 0's weights outweigh its activations (whole batch), then 1-row pieces
    assert (first, rows) == ((4, 5) if cache_elements > 2048 else (1, 1))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        batch = ours.decode(codes, [gen(40 + r) for r in range(5)])
    finally:
        torch.set_num_threads(before)
    for r in range(5):
        assert torch.equal(batch[r : r + 1], alone[r]), r


def test_noise_follows_the_generator(tiny_snac_dir, oracle):
    ours = load_snac(tiny_snac_dir)
    codes = oracle.codes(2, seed=3)
    a, b, c = (ours.decode(codes, [gen(s)]) for s in (1, 1, 2))
    assert torch.equal(a, b)
    assert (a - c).abs().max() > 1e-3


@pytest.mark.parametrize(
    "overrides",
    [
        {
            "attn_window_size": 4,
            "decoder_dim": 128,
        },  # local attention (2 heads of 64) at the bottleneck
        {"noise": False, "depthwise": False},  # plain convolutions, no noise blocks
    ],
)
def test_variants_match_reference(tmp_path, oracle, overrides):
    path = write_snac(tmp_path, "tiny", seed=3, overrides=overrides)
    ours, ref = load_snac(path), oracle.load(path)
    codes = oracle.codes(2, seed=9)
    gens = [gen(4)] if overrides.get("noise", True) else None
    assert_close(ours.decode(codes, gens), oracle.decode(ref, codes, 4))


def test_attention_contributes(tmp_path, oracle):
    path = write_snac(
        tmp_path, "tiny", seed=3, overrides={"attn_window_size": 4, "decoder_dim": 128}
    )
    ours = load_snac(path)
    codes = oracle.codes(2, seed=9)
    before = ours.decode(codes, [gen(4)])
    ours.attn.to_out.weight.zero_()  # attention branch now adds nothing
    assert (ours.decode(codes, [gen(4)]) - before).abs().max() > 1e-3


@pytest.mark.slow
def test_full_preset_matches_reference(tmp_path, oracle):
    path = write_snac(tmp_path, "full", seed=0)
    ours, ref = load_snac(path), oracle.load(path)
    assert sum(p.numel() for p in ref.parameters()) == pytest.approx(19.8e6, rel=0.01)
    codes = oracle.codes(2, seed=1)
    audio = ours.decode(codes, [gen(99)])
    assert audio.shape == (1, 1, 4096)
    assert_close(audio, oracle.decode(ref, codes, 99))


def test_decode_input_errors(tiny_snac_dir, oracle):
    ours = load_snac(tiny_snac_dir)
    codes = oracle.codes(2, batch=2)
    with pytest.raises(ValueError, match="2 rows need 2 generators, got 1"):
        ours.decode(codes, [gen(0)])
    with pytest.raises(ValueError, match="level 2 codes must have shape"):
        ours.decode([codes[0], codes[1], codes[2][:, :-1]], [gen(0), gen(1)])
    bad = codes[1].clone()
    bad[0, 0] = 4096
    with pytest.raises(ValueError, match="level 1 has a code outside 0..4095"):
        ours.decode([codes[0], bad, codes[2]], [gen(0), gen(1)])
    with pytest.raises(ValueError, match="expected 3 code levels"):
        ours.decode(codes[:2], [gen(0), gen(1)])


def test_zero_frames_decode_to_empty_audio(tiny_snac_dir):
    ours = load_snac(tiny_snac_dir)
    empty = [torch.zeros(2, 0, dtype=torch.long)] * 3
    assert ours.decode(empty, [gen(0), gen(1)]).shape == (2, 1, 0)


def test_bfloat16_load_runs_close_to_float32(tiny_snac_dir, oracle):
    codes = oracle.codes(1, seed=2)
    f32 = load_snac(tiny_snac_dir).decode(codes, [gen(0)])
    bf16 = load_snac(tiny_snac_dir, dtype="bfloat16").decode(codes, [gen(0)])
    assert bf16.dtype == torch.bfloat16
    assert (bf16.float() - f32).abs().mean() < 0.05


@pytest.mark.parametrize("keep", [(2048, 4096), (0, 4096), (4096, 8192), (0, 8192), (1, 2), (8000, 8192), (3000, 5000)])
def test_keep_decodes_exactly_the_slice(tiny_snac_dir, oracle, keep):
    """Computing only what ``keep`` depends on gives the whole decode's samples, bit for bit."""
    ours = load_snac(tiny_snac_dir)
    codes = oracle.codes(4, batch=3, seed=12)
    whole = ours.decode(codes, [gen(60 + r) for r in range(3)])
    part = ours.decode(codes, [gen(60 + r) for r in range(3)], keep=keep)
    assert part.shape == (3, 1, keep[1] - keep[0])
    assert torch.equal(part, whole[..., keep[0] : keep[1]])


def test_keep_skips_most_of_a_window_and_is_checked(tiny_snac_dir, oracle):
    spans = plan_spans((8, 8, 4, 2), 16, (2048, 4096))  # a streaming window's one kept frame
    assert [s.length for s in spans] == [128, 1024, 4096, 8192]
    assert spans[-1].kept == (2045, 4099) and spans[-1].upsampled == (2006, 4138)
    assert spans[-1].inputs == spans[-2].kept and spans[0].inputs[0] >= 0
    computed = sum(s.upsampled[1] - s.upsampled[0] for s in spans[1:])
    assert computed < 0.45 * (1024 + 4096 + 8192)  # the high-resolution blocks do well under half the work
    ours = load_snac(tiny_snac_dir)
    with pytest.raises(ValueError, match=r"keep \[4096, 9000\] is not a non-empty part of \[0, 8192\)"):
        ours.decode(oracle.codes(4, seed=1), [gen(0)], keep=(4096, 9000))
