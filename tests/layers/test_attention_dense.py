"""DenseAttention: the uncached reference every cached or paged path is compared with."""

import torch
import torch.nn.functional as F

from walkserve.layers.attention import (
    DenseAttention,
    DenseCausalAttention,
    block_causal_mask,
    block_diagonal_mask,
)

SCALE = 0.3


def _qkv(t: int, hq: int = 4, hkv: int = 2, dh: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(t, hq, dh, generator=g), torch.randn(t, hkv, dh, generator=g), torch.randn(t, hkv, dh, generator=g))


def _naive(q, k, v, allowed):
    """Softmax attention written out, GQA by repeating K/V heads; rows with no key give zeros."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * SCALE
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    weights = torch.nan_to_num(torch.softmax(scores, -1))
    return torch.einsum("hqk,khd->qhd", weights, v)


def test_causal_equals_the_written_out_softmax():
    q, k, v = _qkv(7)
    want = _naive(q, k, v, torch.ones(7, 7, dtype=torch.bool).tril())
    torch.testing.assert_close(DenseCausalAttention().forward(0, q, k, v, SCALE), want, atol=1e-5, rtol=0)


def test_a_kept_past_continues_the_same_causal_sequence():
    q, k, v = _qkv(9)
    whole = DenseCausalAttention().forward(3, q, k, v, SCALE)
    first = DenseAttention("causal", keep=True)
    head = first.forward(3, q[:5], k[:5], v[:5], SCALE)
    tail = DenseAttention("causal", past={3: first.kv[3]}).forward(3, q[5:], k[5:], v[5:], SCALE)
    torch.testing.assert_close(torch.cat([head, tail]), whole, atol=1e-6, rtol=0)


def test_full_and_explicit_masks():
    q, k, v = _qkv(6)
    full = DenseAttention(None).forward(0, q, k, v, SCALE)
    torch.testing.assert_close(full, _naive(q, k, v, torch.ones(6, 6, dtype=torch.bool)), atol=1e-5, rtol=0)
    mask = block_causal_mask(3, 2)
    torch.testing.assert_close(DenseAttention(mask).forward(0, q, k, v, SCALE), _naive(q, k, v, mask), atol=1e-5, rtol=0)


def test_block_diagonal_packing_equals_separate_sequences():
    q, k, v = _qkv(5)
    packed = DenseAttention(block_diagonal_mask([2, 3])).forward(0, q, k, v, SCALE)
    alone = [DenseAttention(None).forward(0, q[a:b], k[a:b], v[a:b], SCALE) for a, b in ((0, 2), (2, 5))]
    torch.testing.assert_close(packed, torch.cat(alone), atol=1e-6, rtol=0)


def test_a_row_that_sees_nothing_is_zero_not_nan():
    q, k, v = _qkv(4)
    mask = torch.zeros(4, 4, dtype=torch.bool)
    mask[1:, 0] = True
    out = DenseAttention(mask).forward(0, q, k, v, SCALE)
    assert not torch.isnan(out).any()
    assert out[0].abs().max() == 0
    want = F.scaled_dot_product_attention(q[1:2].transpose(0, 1), k[:1].repeat_interleave(2, 1).transpose(0, 1),
                                          v[:1].repeat_interleave(2, 1).transpose(0, 1), scale=SCALE).transpose(0, 1)
    torch.testing.assert_close(out[1:2], want, atol=1e-6, rtol=0)
