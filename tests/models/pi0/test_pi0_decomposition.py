"""pi0.5 (and pi0) by decomposition: adaRMS against its formula, and the expert over a frozen prefix KV
against a joint [prefix; suffix] pass under openpi's mask, written here from the papers' equations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from walkserve.models.pi0.flow import append_state, compute_prefix, velocity
from walkserve.models.pi0.norms import AdaRMSNorm, Condition
from walkserve.models.pi0.prefix import compact_prefix, openpi_mask, padded_prefix

NEG = -2.3819763e38  # openpi's mask value (finite: fully masked rows stay finite)


def test_adarms_matches_its_formula():
    gen = torch.Generator().manual_seed(0)
    norm = AdaRMSNorm(16, 8, eps=1e-6)
    with torch.no_grad():
        norm.dense.weight.normal_(generator=gen)
        norm.dense.bias.normal_(generator=gen)
    x = torch.randn(5, 16, generator=gen)
    rows = torch.randn(2, 8, generator=gen)
    index = torch.tensor([0, 0, 1, 0, 1])
    y, gate = norm(x, Condition(rows, index))
    cond = rows[index]  # [5, 8]
    scale, shift, g = (cond @ norm.dense.weight.T + norm.dense.bias).chunk(3, dim=-1)
    want = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * (1 + scale) + shift
    torch.testing.assert_close(y, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gate, g, atol=1e-6, rtol=1e-6)


def test_condition_is_computed_once_per_distinct_time(tiny_pi05):
    expert = tiny_pi05.policy.expert
    time = torch.tensor([0.9, 0.9, 0.3, 0.9, 1.0, 0.3])
    with torch.no_grad():
        cond = expert.condition(time)
        one_by_one = torch.cat([expert.condition(t[None]).rows for t in time])
    assert cond.rows.shape[0] == 3
    torch.testing.assert_close(cond.rows[cond.index], one_by_one)


def _attend(q, k, v, mask, scale):
    """Plain softmax attention: q [T, Hq, Dh], k, v [T, Hkv, Dh], mask [T, T] bool."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(~mask, NEG).softmax(-1), v)


def _qkv(layer, h, positions, rotary):
    from walkserve.layers.rope import apply_rotary

    a = layer.self_attn
    q, k, v = a.qkv_proj.split(a.qkv_proj(h))
    cos, sin = rotary.cos_sin(positions)
    t = h.shape[0]
    return (apply_rotary(q.view(t, a.num_heads, a.head_dim), cos, sin),
            apply_rotary(k.view(t, a.num_kv_heads, a.head_dim), cos, sin), v.view(t, a.num_kv_heads, a.head_dim))


def _residual(x, y, gate):
    return x + y if gate is None else x + y * gate


def joint_pass(lm, expert, prefix, suffix_embeds, suffix_positions, cond, mask):
    """openpi's training-time pass: both stacks layer by layer, one attention over [prefix; suffix]."""
    xp, xs, n = prefix.embeds, suffix_embeds, prefix.embeds.shape[0]
    for lp, ls in zip(lm.layers, expert.layers):
        hp, gp = lp.input_layernorm(xp, None)
        hs, gs = ls.input_layernorm(xs, cond)
        qp, kp, vp = _qkv(lp, hp, prefix.positions, lm.rotary)
        qs, ks, vs = _qkv(ls, hs, suffix_positions, expert.rotary)
        out = _attend(torch.cat([qp, qs]), torch.cat([kp, ks]), torch.cat([vp, vs]), mask, lp.self_attn.scale)
        xp = _residual(xp, lp.self_attn.o_proj(out[:n].flatten(1)), gp)
        xs = _residual(xs, ls.self_attn.o_proj(out[n:].flatten(1)), gs)
        hp, gp = lp.post_attention_layernorm(xp, None)
        hs, gs = ls.post_attention_layernorm(xs, cond)
        xp, xs = _residual(xp, lp.mlp(hp), gp), _residual(xs, ls.mlp(hs), gs)
    return expert.norm(xs, cond)[0]


def _padded(policy, seed, present=(True, False, True), prompt_len=9, pad=5):
    """A padded prefix: random image tokens for the present camera slots, a right-padded prompt."""
    gen = torch.Generator().manual_seed(seed)
    c = policy.config
    images = [torch.randn(c.image_tokens, c.paligemma.hidden_size, generator=gen) if p else None for p in present]
    ids = torch.randint(4, c.vocab_size, (prompt_len + pad,), generator=gen)
    valid = torch.tensor([True] * prompt_len + [False] * pad)
    return padded_prefix(policy.lm, images, c.image_tokens, ids, valid), images, ids[:prompt_len]


@pytest.mark.parametrize("kind", ["pi05", "pi0"])
def test_expert_over_frozen_prefix_equals_joint_pass(kind, tiny_pi05, tiny_pi0):
    tiny = tiny_pi05 if kind == "pi05" else tiny_pi0
    policy = tiny.policy
    lm, expert, c = policy.lm, policy.expert, policy.config
    prefix, _, _ = _padded(policy, seed=3)
    gen = torch.Generator().manual_seed(4)
    x, t, h = torch.randn(c.chunk_size, 32, generator=gen), 0.7, c.chunk_size
    state = torch.randn(32, generator=gen)
    with torch.no_grad():
        ctx = compute_prefix(lm, prefix)
        tokens = expert.embed_actions(x, torch.full((h,), t))
        ar = [1] + [0] * (h - 1)
        if kind == "pi0":  # the state token opens its own block before the actions'
            ctx = append_state(expert, ctx, state)
            tokens, ar = torch.cat([expert.embed_state(state[None]), tokens]), [1, *ar]
        ours = velocity(expert, ctx, x, t)  # [H, 32]
        s = tokens.shape[0]
        valid = torch.cat([prefix.valid, torch.ones(s, dtype=torch.bool)])
        mask = openpi_mask(valid, torch.tensor([0] * prefix.valid.shape[0] + ar))
        positions = prefix.num_valid + torch.arange(s)
        cond = expert.condition(torch.full((s,), t)) if kind == "pi05" else None
        joint = expert.compute_velocity(joint_pass(lm, expert, prefix, tokens, positions, cond, mask))[-h:]
    assert (ours - joint).abs().max() < 1e-4
    assert ours.abs().max() > 0.1  # not a degenerate comparison


def test_compact_prefix_equals_padded(tiny_pi05):
    policy = tiny_pi05.policy
    padded, images, ids = _padded(policy, seed=5)
    with torch.no_grad():
        compact = compact_prefix(policy.lm, torch.cat([i for i in images if i is not None]), ids)
        a, b = compute_prefix(policy.lm, padded), compute_prefix(policy.lm, compact)
    assert a.next_position == b.next_position == compact.embeds.shape[0] and b.key_valid is None
    for layer in a.kv:
        for x, y in zip(a.kv[layer], b.kv[layer]):
            assert (x[padded.valid] - y).abs().max() < 1e-5
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(policy.config.chunk_size, 32, generator=gen)
    with torch.no_grad():
        assert (velocity(policy.expert, a, x, 0.4) - velocity(policy.expert, b, x, 0.4)).abs().max() < 1e-5


def test_served_lm_writes_the_same_kv_without_the_last_layers_tail(tiny_pi05):
    """The served PaliGemma (``kv_only``, as ``build_component`` makes it) skips the last layer's o_proj and
    MLP: every layer's K/V are those of the full pass, and what it returns is the last layer's input."""
    from walkserve.layers.attention import DenseAttention
    from walkserve.models.pi0.components import build_component

    policy = tiny_pi05.policy
    served = build_component("lm", tiny_pi05.path, "cpu", None)
    assert served.kv_only and not policy.lm.kv_only
    _, images, ids = _padded(policy, seed=7)
    prefix = compact_prefix(policy.lm, torch.cat([i for i in images if i is not None]), ids)
    zeros = torch.zeros(prefix.embeds.shape[0], dtype=torch.long)
    with torch.no_grad():
        full, kv_only = DenseAttention(None, keep=True), DenseAttention(None, keep=True)
        hidden = policy.lm(zeros, prefix.positions, full, inputs_embeds=prefix.embeds)
        rows = served(zeros, prefix.positions, kv_only, inputs_embeds=prefix.embeds)
        inner = DenseAttention(None)
        x = prefix.embeds
        cos, sin = policy.lm.rotary.cos_sin(prefix.positions)
        for layer in policy.lm.layers[:-1]:
            x = layer(x, cos, sin, inner, None)
    assert sorted(kv_only.kv) == sorted(full.kv) == list(range(policy.lm.config.num_hidden_layers))
    for layer in full.kv:
        for a, b in zip(full.kv[layer], kv_only.kv[layer]):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(rows, x, atol=1e-6, rtol=1e-6)
    assert (rows - hidden).abs().max() > 1e-3  # not the hidden states: the last layer's tail did not run


def test_openpi_mask_blocks():
    valid = torch.tensor([True, True, False, True, True, True])
    ar = torch.tensor([0, 0, 0, 1, 1, 0])  # prefix (one padded), state block, action block
    m = openpi_mask(valid, ar).int().numpy()
    want = np.array([[1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0] * 6,
                     [1, 1, 0, 1, 0, 0], [1, 1, 0, 1, 1, 1], [1, 1, 0, 1, 1, 1]])
    np.testing.assert_array_equal(m, want)


class _PerRequestAttention:
    """Test stand-in for the engine's query over several requests' contexts: each segment of the ragged
    batch attends to its own request's kept prefix K/V and to itself."""

    def __init__(self, segments):
        self.segments = segments  # [(tokens, PrefixKV)]

    def forward(self, layer, q, k, v, scale):
        from walkserve.layers.attention import DenseAttention

        out, start = [], 0
        for n, ctx in self.segments:
            part = slice(start, start + n)
            out.append(DenseAttention(ctx.key_mask(n), past=ctx.kv).forward(layer, q[part], k[part], v[part], scale))
            start += n
        return torch.cat(out)


@pytest.mark.parametrize("kind", ["pi05", "pi0"])
def test_requests_at_different_flow_times_batch_in_one_expert_call(kind, tiny_pi05, tiny_pi0):
    policy = (tiny_pi05 if kind == "pi05" else tiny_pi0).policy
    lm, expert, h = policy.lm, policy.expert, policy.config.chunk_size
    gen = torch.Generator().manual_seed(8)
    contexts, xs, times = [], [], [0.9, 0.3]
    with torch.no_grad():
        for seed, prompt_len in ((9, 5), (10, 11)):
            prefix, _, _ = _padded(policy, seed=seed, present=(True, True, False), prompt_len=prompt_len, pad=0)
            ctx = compute_prefix(lm, prefix)
            if kind == "pi0":
                ctx = append_state(expert, ctx, torch.randn(32, generator=gen))
            contexts.append(ctx)
            xs.append(torch.randn(h, 32, generator=gen))
        alone = [velocity(expert, ctx, x, t) for ctx, x, t in zip(contexts, xs, times)]
        time = torch.cat([torch.full((h,), t) for t in times])  # the token input: each token's request's t
        embeds = expert.embed_actions(torch.cat(xs), time)
        positions = torch.cat([ctx.next_position + torch.arange(h) for ctx in contexts])
        attn = _PerRequestAttention([(h, ctx) for ctx in contexts])
        batched = expert.compute_velocity(expert(torch.zeros(2 * h, dtype=torch.long), positions, attn, embeds,
                                                 time=time))
    assert (batched - torch.cat(alone)).abs().max() < 1e-5
