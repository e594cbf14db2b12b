"""Our SnacDecoder against the snac package on the same random weights and the same noise seeds."""

from __future__ import annotations

import pytest
import torch

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
        torch.testing.assert_close(
            audio[row : row + 1], alone, rtol=1e-4, atol=1e-5
        )  # batch-size reductions


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
