"""KV contexts against a dense, uncached reference (float32, <= 1e-5): every op and mask, in batches that mix them."""

from __future__ import annotations

import pytest
import torch

from tests.engines.kv.contexts_ref import RefContexts, Seg, dense, firing, run
from walkserve.core.options import KVOptions
from walkserve.engines.kv.engine import KVCacheEngine
from walkserve.graph.kv import ALL, Rows, append, drop, fork, kv_params, query, truncate

TOL = {"atol": 1e-5, "rtol": 1e-5}


def _engine(model, **kw) -> KVCacheEngine:
    kw = {"block_size": 4, "num_blocks": 96, "max_batch_tokens": 12, "seed": 0, **kw}
    return KVCacheEngine("lm", model, "cpu", torch.float32, KVOptions(**kw))


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed))


def _embeds(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


class Scenario:
    """Applies the same ops to the engine and to the reference; checks every answered firing."""

    def __init__(self, model, engine: KVCacheEngine):
        self.model, self.engine = model, engine
        self.ref: dict[str, RefContexts] = {}
        self.checks: list = []

    def ctx(self, rid: str) -> RefContexts:
        return self.ref.setdefault(rid, RefContexts())

    def running(self, rid: str, name: str) -> int:
        segs = self.ctx(rid).contexts.get(name, [])
        return max((int(s.positions.max()) + 1 for s in segs), default=0)

    def append(self, rid: str, name: str, n: int, seed: int, *, mask="causal", frame=0, ids=True, embed_rows=None,
               positions=None, rows=ALL, capture=None, pre=()):
        d = self.model.config.hidden_size
        for op, args in pre:
            getattr(self.ctx(rid), op)(*args)
        inputs = {}
        token_ids = _ids(n, seed) if ids else torch.zeros(n, dtype=torch.long)
        if ids:
            inputs["tokens"] = token_ids
        embeds = None
        if embed_rows is not None or not ids:
            rows_t = None if embed_rows is None else torch.tensor(embed_rows)
            embeds = _embeds(n if rows_t is None else len(embed_rows), d, seed + 1)
            inputs["embeds"] = embeds
            if rows_t is not None:
                inputs["embed_rows"] = rows_t
        pos = torch.arange(self.running(rid, name), self.running(rid, name) + n) if positions is None else positions
        if positions is not None:
            inputs["positions"] = positions
        spec = append(name, mask=mask, frame=frame, rows=rows, capture=capture or {})
        outputs = ("hidden", *(capture or {}))
        pre_specs = [fork(*a) if op == "fork" else truncate(*a) for op, a in pre]
        f = firing(rid, kv_params(*pre_specs, spec), inputs, outputs)
        seg = Seg(token_ids, pos, mask, frame, embeds, None if embed_rows is None else torch.tensor(embed_rows))
        self.ctx(rid).append(name, seg)
        groups = [list(self.ctx(rid).contexts[name])]
        self.checks.append((f, groups, None, rows, capture or {}, n))
        return f

    def query(self, rid: str, reads: tuple[str, ...], n: int, seed: int, *, mask="full", positions=None, rows=ALL):
        inputs = {"tokens": _ids(n, seed)}
        pos = torch.arange(self.running(rid, reads[0]), self.running(rid, reads[0]) + n) if positions is None else positions
        if positions is not None:
            inputs["positions"] = positions
        f = firing(rid, kv_params(query(*reads, mask=mask, rows=rows)), inputs)
        groups = [list(self.ctx(rid).contexts.get(r, [])) for r in reads]
        self.checks.append((f, groups, Seg(inputs["tokens"], pos, mask), rows, {}, n))
        return f

    def bookkeeping(self, rid: str, *specs):
        for spec in specs:
            if spec.op == "fork":
                self.ctx(rid).fork(spec.source, spec.context)
            elif spec.op == "truncate":
                self.ctx(rid).truncate(spec.context, spec.length)
            else:
                self.ctx(rid).contexts.pop(spec.context, None)
        return firing(rid, kv_params(*specs), {}, ())

    def run(self, firings) -> None:
        results = run(self.engine, firings)
        for f, groups, q, rows, capture, n in self.checks:
            out = results[f.id]
            hidden, cap = dense(self.model, groups, q, tuple(capture.values()))
            sel = _rows(rows, n) + hidden.shape[0] - n
            torch.testing.assert_close(out["hidden"], hidden[sel], **TOL)
            for name, layer in capture.items():
                torch.testing.assert_close(out[name], cap[layer][sel], **TOL)
        self.checks = []
        self.engine.block_manager.check()


def _rows(rows: Rows, n: int) -> torch.Tensor:
    if rows.kind == "all":
        return torch.arange(n)
    if rows.kind == "range":
        return torch.arange(rows.start, min(n, rows.stop or n))
    return torch.tensor([n - 1])


def test_every_op_and_mask_in_batches_that_mix_contexts_and_requests(tiny_lm):
    s = Scenario(tiny_lm, _engine(tiny_lm))
    s.run([
        s.append("r0", "a", 10, 1, capture={"l1": 1}),
        s.append("r0", "b", 7, 2, mask="full", embed_rows=[1, 2, 3], positions=torch.full((7,), 5)),
        s.append("r1", "a", 12, 3, mask="block_causal", frame=4, ids=False),
        s.append("r1", "b", 5, 4, rows=Rows.range(1, 4)),
    ])
    s.run([
        s.append("r0", "c", 2, 5, pre=[("fork", ("a", "c"))]),  # fork + append in one firing (copy-on-write)
        s.append("r0", "a", 3, 6, capture={"l0": 0}),
        s.query("r1", ("a",), 5, 7, positions=torch.full((5,), 100)),
        s.query("r0", ("a", "b"), 3, 8, mask="causal", rows=Rows.range(1, 3)),
        s.append("r1", "b", 16, 9, mask="full"),  # longer than the budget: runs alone, whole
    ])
    s.run([s.bookkeeping("r0", truncate("a", 6), drop("b"))])
    assert ("r0", "b") not in s.engine.scheduler.contexts
    s.run([
        s.append("r0", "a", 4, 10),
        s.append("r1", "a", 8, 11, mask="block_causal", frame=4, ids=False),
        s.query("r0", ("c", "a"), 2, 12, mask="causal"),
    ])
    for rid in ("r0", "r1"):
        s.engine.release(rid)
    assert s.engine.block_manager.num_used == 0 and s.engine.state_count() == 0


def test_cfg_three_contexts_a_fork_and_49_queries_leave_the_pool_unchanged(tiny_lm):
    """BAGEL-shaped: gen = text + image block (one shared position) + text; cfg_text = gen before the last text;
    cfg_img = the texts only; then 49 steps of three query passes (latents at one position, full mask)."""
    d = tiny_lm.config.hidden_size
    s = Scenario(tiny_lm, _engine(tiny_lm, max_batch_tokens=64))
    s.run([s.append("img", "gen", 6, 1), s.append("img", "cfg_img", 6, 1)])
    s.run([s.append("img", "gen", 8, 2, mask="full", ids=False, positions=torch.full((8,), s.running("img", "gen")))])
    s.run([s.append("img", "gen", 5, 3, pre=[("fork", ("gen", "cfg_text"))]), s.append("img", "cfg_img", 5, 3)])
    engine, bm = s.engine, s.engine.block_manager
    used, tables = bm.num_used, {k: list(bm.table(k)) for k in list(bm.keys())}
    k_before, v_before = engine.pool.k.clone(), engine.pool.v.clone()
    latents = _embeds(6, d, 99)
    for _ in range(49):
        firings, refs = [], []
        for name in ("gen", "cfg_text", "cfg_img"):
            position = torch.full((6,), s.running("img", name))
            inputs = {"embeds": latents, "positions": position}
            f = firing("img", kv_params(query(name, mask="full", rows=ALL)), inputs)
            firings.append(f)
            refs.append((f, [list(s.ctx("img").contexts[name])], Seg(torch.zeros(6, dtype=torch.long), position, "full", 0, latents)))
        results = run(engine, firings)
        assert len(engine.scheduler.queries) == 0
        for f, groups, q in refs:
            want, _ = dense(tiny_lm, groups, q)
            torch.testing.assert_close(results[f.id]["hidden"], want[-6:], **TOL)
        latents = latents - 0.02 * sum(results[f.id]["hidden"] for f in firings)  # the next step's input
        assert bm.num_used == used  # a query allocates nothing
    assert {k: list(bm.table(k)) for k in list(bm.keys())} == tables
    assert torch.equal(engine.pool.k, k_before) and torch.equal(engine.pool.v, v_before)


def test_a_query_over_an_empty_context_attends_to_itself_only(tiny_lm):
    """BAGEL's cfg_text of a text-to-image request is a fork of the still empty gen: its query sees only its
    own rows, in the same step as a query over a filled context."""
    s = Scenario(tiny_lm, _engine(tiny_lm, max_batch_tokens=64))
    s.run([s.append("t2i", "gen", 6, 1)])
    s.run([s.bookkeeping("t2i", fork("never", "cfg_text"))])
    s.run([s.query("t2i", ("cfg_text",), 5, 2, positions=torch.zeros(5, dtype=torch.long)),
           s.query("t2i", ("gen",), 5, 2, positions=torch.full((5,), 6))])


def test_vjepa_block_causal_appends_equal_full_recomputation_at_every_step(tiny_lm):
    """258-token steps in miniature: frames of 6 rows (2 conditioning + 4 frame tokens), embeddings only."""
    d, frame = tiny_lm.config.hidden_size, 6
    engine = _engine(tiny_lm, max_batch_tokens=12)
    history = _embeds(2 * frame, d, 5)  # the context: two frames in one prefill (split into whole frames)
    chunk = history
    for step in range(5):
        f = firing("v", kv_params(append("rollout", mask="block_causal", frame=frame, rows=ALL)), {"embeds": chunk})
        out = run(engine, [f])[f.id]["hidden"]
        frames = history.shape[0] // frame
        full = Seg(torch.zeros(history.shape[0], dtype=torch.long), torch.arange(history.shape[0]), "block_causal",
                   frame, history)
        want, _ = dense(tiny_lm, [[full]])  # the official loop: recompute the whole history, no cache
        torch.testing.assert_close(out, want[-chunk.shape[0] :], **TOL)
        assert frames == 2 + step
        chunk = torch.cat([_embeds(2, d, 50 + step), out[-4:]])  # action, state, then the predicted frame
        history = torch.cat([history, chunk])


def test_truncate_and_refork_keep_block_accounting_exact(tiny_lm):
    s = Scenario(tiny_lm, _engine(tiny_lm))
    s.run([s.append("r", "gen", 9, 1)])
    s.run([s.append("r", "snap", 3, 2, pre=[("fork", ("gen", "snap"))])])
    s.run([s.append("r", "snap", 2, 3, pre=[("fork", ("gen", "snap"))])])  # refreshed: the old snapshot goes
    s.run([s.append("r", "gen", 3, 4, pre=[("truncate", ("gen", 5))])])
    bm = s.engine.block_manager
    assert bm.num_reserved(("r", "gen")) == 8 and bm.num_reserved(("r", "snap")) == 11
    s.engine.release("r")
    assert bm.num_used == 0


def test_cut_through_a_full_block_is_refused(tiny_lm):
    engine = _engine(tiny_lm)
    run(engine, [firing("r", kv_params(append("a", mask="full")), {"tokens": _ids(6, 1)})])
    engine.submit(firing("r", kv_params(truncate("a", 3)), {}, ()))
    (result,) = engine.step()
    assert "cuts a full block" in result.error


@pytest.mark.parametrize("bad, message", [
    ({"tokens": torch.tensor([1.5])}, "integer ids"),
    ({"tokens": torch.tensor([1, 2]), "positions": torch.tensor([0])}, "positions"),
    ({"embeds": torch.zeros(2, 3)}, "width 3"),
    ({"tokens": torch.tensor([1, 2]), "embeds": torch.zeros(1, 64), "embed_rows": torch.tensor([5])}, "rows in"),
])
def test_bad_inputs_are_answered_with_an_error(tiny_lm, bad, message):
    engine = _engine(tiny_lm)
    engine.submit(firing("r", kv_params(append("a")), bad))
    (result,) = engine.step()
    assert message in result.error and engine.state_count() == 0
