"""Prefix reuse of content-keyed appends (explicit positions, media rows): keys, exact plans and block ids."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch

from tests.engines.kv.kv_driver import firing
from walkserve.core.options import KVOptions
from walkserve.engines.kv.block_manager import BlockManager
from walkserve.engines.kv.engine import KVCacheEngine
from walkserve.engines.kv.ops import ContextOp, bind
from walkserve.engines.kv.scheduler import Scheduler, SchedulerConfig
from walkserve.graph.kv import append, kv_params

D = 7  # a media item's digest


@dataclass
class FakeFiring:
    name: str
    outputs: tuple[str, ...] = ("token",)


def _sched(num_blocks=32, block_size=4, max_batch_tokens=100) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, block_size), SchedulerConfig(max_batch_tokens, 8))


def _op(ids: list[int], content: list[int], positions: list[int] | None = None, axes: int = 3) -> ContextOp:
    """A keyed append: rows whose content is nonzero have embeddings; positions on ``axes`` equal axes."""
    t = len(ids)
    pos = torch.tensor(positions if positions is not None else list(range(t))).expand(axes, t)
    rows = torch.tensor([i for i, c in enumerate(content) if c], dtype=torch.long)
    return ContextOp("append", "main", token_ids=torch.tensor(ids), positions=pos, num_tokens=t,
                     embeds=torch.zeros(len(rows), 2) if len(rows) else None, embed_rows=rows if len(rows) else None,
                     content=torch.tensor(content))


def _submit(s: Scheduler, req: str, op: ContextOp | None, ids: list[int] | None = None) -> None:
    ctx = s.context((req, "main"))
    ids = op.token_ids.tolist() if op is not None else ids
    ctx.append(FakeFiring(f"{req}:{ctx.length + len(ids)}"), ids, op)


def _run(s: Scheduler) -> list[tuple[str, int, int]]:
    plan = s.schedule()
    chunks = [(c.context.key[0], c.start, c.num_tokens) for c in plan.chunks]
    s.finish(plan)
    s.bm.check()
    return chunks


PROMPT = [1, 2, 3, 9, 9, 9, 9, 9, 4, 5, 6, 7]  # text, 5 audio rows (9 = the placeholder), text
MEDIA = [0, 0, 0, D, D, D, D, D, 0, 0, 0, 0]


def test_a_keyed_prompt_is_reused_by_the_same_content_at_the_same_positions():
    s = _sched()
    _submit(s, "a", _op(PROMPT, MEDIA))
    assert _run(s) == [("a", 0, 12)]
    _submit(s, "b", _op(PROMPT + [8], MEDIA + [0]))
    assert _run(s) == [("b", 12, 1)]
    assert s.bm.table(("b", "main"))[:3] == s.bm.table(("a", "main"))
    assert s.prefix_hit_tokens == 12


def test_other_media_content_shares_only_the_blocks_before_it():
    s = _sched()
    _submit(s, "a", _op(PROMPT, MEDIA))
    _run(s)
    other = [D + 1 if c else 0 for c in MEDIA]  # the same placeholder tokens, another clip
    _submit(s, "b", _op(PROMPT + [8], other + [0]))
    assert _run(s) == [("b", 0, 13)]  # block 0 holds the clip's first row: nothing is shared
    late = [1, 2, 3, 4, 9, 9, 9, 9, 5, 6, 7, 8]  # a clip that starts in block 1
    _submit(s, "c", _op(late, [0, 0, 0, 0, D, D, D, D, 0, 0, 0, 0]))
    _run(s)
    _submit(s, "d", _op(late + [8], [0, 0, 0, 0, D + 1, D + 1, D + 1, D + 1, 0, 0, 0, 0, 0]))
    assert _run(s) == [("d", 4, 9)]  # block 0 (text only) shared, the clip's blocks and those after it not
    assert s.prefix_hit_tokens == 4


def test_the_same_tokens_at_other_positions_are_not_shared():
    s = _sched()
    _submit(s, "a", _op(PROMPT, MEDIA))
    _run(s)
    shifted = list(range(4)) + [p + 2 for p in range(4, 13)]  # rows 4.. two positions later (a wider image)
    _submit(s, "b", _op(PROMPT + [8], MEDIA + [0], positions=shifted))
    assert _run(s) == [("b", 4, 9)]
    assert s.prefix_hit_tokens == 4


def test_a_multi_axis_position_is_part_of_the_key():
    s = _sched()
    a = _op(PROMPT, MEDIA)
    _submit(s, "a", a)
    _run(s)
    b = _op(PROMPT + [8], MEDIA + [0])
    b.positions = b.positions.clone()
    b.positions[1, 5] += 1  # one vision row's height position differs
    _submit(s, "b", b)
    assert _run(s) == [("b", 4, 9)]


def test_decoded_rows_are_shared_with_the_same_tokens_given_back_at_explicit_positions():
    """A follow-up turn holds the answer decoded before (plain appends at running positions) as text rows at
    explicit positions: the same key when the positions agree."""
    s = _sched()
    _submit(s, "a", _op(PROMPT, MEDIA))
    _run(s)
    for token in (20, 21, 22, 23, 24):  # decode steps, running positions 12..16
        _submit(s, "a", None, [token])
        _run(s)
    turn = PROMPT + [20, 21, 22, 23, 24, 30, 31]
    _submit(s, "b", _op(turn, MEDIA + [0] * 7))
    assert _run(s) == [("b", 16, 3)]
    assert s.bm.table(("b", "main"))[:4] == s.bm.table(("a", "main"))[:4]


def test_a_later_firing_of_a_running_context_attaches_cached_blocks():
    """Piece 2 of a prompt (another firing) reuses the blocks a first request cached: the chunk stops at the
    block boundary, then the cached blocks are attached."""
    s = _sched()
    whole = PROMPT + [10, 11, 12, 13, 14, 15]  # 18 rows
    _submit(s, "a", _op(whole, MEDIA + [0] * 6))
    _run(s)
    _submit(s, "b", _op(whole[:6], MEDIA[:6]))
    assert _run(s) == [("b", 4, 2)]  # block 0 attached, the piece's last row computed
    second = _op(whole[6:] + [16], MEDIA[6:] + [0] * 7, positions=list(range(6, 19)))
    _submit(s, "b", second)
    assert _run(s) == [("b", 6, 2)]  # up to the boundary of block 1
    assert _run(s) == [("b", 16, 3)]  # blocks 2 and 3 attached
    assert s.bm.table(("b", "main"))[2:4] == s.bm.table(("a", "main"))[2:4]
    assert s.prefix_hit_tokens == 4 + 8
    assert s.prefill_tokens == 18 + 2 + 2 + 3


def test_an_unkeyed_append_is_still_never_shared():
    s = _sched()
    op = _op(PROMPT, MEDIA)
    op.content = None
    _submit(s, "a", op)
    _run(s)
    _submit(s, "b", _op(PROMPT + [8], MEDIA + [0]))
    assert _run(s) == [("b", 0, 13)]


def test_a_decode_step_counts_as_no_prefill():
    s = _sched()
    _submit(s, "a", None, [1, 2, 3])
    _run(s)
    _submit(s, "a", None, [4])
    _run(s)
    assert s.prefill_tokens == 3


def test_bind_takes_content_keys_and_refuses_an_embedded_row_without_one():
    """A media row's key is K >= 2 ints (a 128-bit digest); a row is keyed on all of them. Rows without embeddings
    may give one int a row."""
    params = kv_params(append("main", content="content"))
    inputs = {"tokens": torch.tensor([1, 9, 2]), "embeds": torch.zeros(1, 4), "embed_rows": torch.tensor([1]),
              "positions": torch.arange(3).expand(3, 3), "content": torch.tensor([[0, 0], [0, D], [0, 0]])}
    [op] = bind("thinker", params, inputs)
    assert op.keyed and op.content.tolist() == [[0, 0], [0, D], [0, 0]]
    with pytest.raises(ValueError, match="nonzero on every embedded row"):
        bind("thinker", params, {**inputs, "content": torch.zeros(3, 2, dtype=torch.long)})
    for bad in (torch.zeros(3, 0, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 2, 1)):
        with pytest.raises(ValueError, match="3 content keys"):
            bind("thinker", params, {**inputs, "content": bad.long()})
    with pytest.raises(ValueError, match="128-bit digest"):  # one int: 64 bits, a key a client could collide
        bind("thinker", params, {**inputs, "content": torch.tensor([0, D, 0])})
    [op] = bind("thinker", params, {k: v for k, v in inputs.items() if "embed" not in k} | {"content": torch.tensor([0, D, 0])})
    assert op.keyed and op.content.tolist() == [0, D, 0]


def test_keys_that_differ_in_their_second_int_share_only_the_blocks_before_them():
    s = _sched()
    wide = [(c, 5) if c else (0, 0) for c in MEDIA]
    _submit(s, "a", dataclasses.replace(_op(PROMPT, MEDIA), content=torch.tensor(wide)))
    _run(s)
    other = [(c, 6) if c else (0, 0) for c in MEDIA]  # the same first int on every row
    _submit(s, "b", dataclasses.replace(_op(PROMPT + [8], MEDIA + [0]), content=torch.tensor(other + [(0, 0)])))
    assert _run(s) == [("b", 0, 13)]
    assert s.context(("a", "main")).row_keys()[3] == (9, D, 5, (3, 3, 3))


def _lazy(request_id: str, tokens: list[int], outputs=()):
    return dataclasses.replace(firing(request_id, tokens, outputs=outputs),
                               node_params=kv_params(append("main", lazy=True)))


def test_lazy_pieces_are_answered_at_once_and_share_blocks_across_their_cut(tiny_lm, hf_lm):
    """A prompt in two pieces, the first lazy and naming no output: it is answered before any forward, its rows run
    with the second; a second request of the same pieces then reuses every full block, the one across the cut too."""
    engine = KVCacheEngine("lm", tiny_lm, "cpu", torch.float32, KVOptions(block_size=4, num_blocks=32, seed=0))
    first, second = list(range(10, 16)), list(range(30, 37))
    for rid in ("a", "b"):
        engine.submit(_lazy(rid, first))
        (filled,) = engine.step()
        assert filled.error is None and filled.outputs == {}
        engine.submit(_lazy(rid, second, outputs=("logits",)))
        results = []
        while not results:
            results = engine.step()
        torch.testing.assert_close(results[0].outputs["logits"], _hf_logits(hf_lm, first + second), atol=1e-4, rtol=1e-4)
    stats = engine.stats()
    assert stats["prefix_hit_tokens"] == 12  # b: rows 0..11, blocks 0-2 (block 1 spans the cut); its last row runs
    assert stats["prefill_tokens"] == 13 + 1


def _hf_logits(hf_lm, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_lm(torch.tensor([tokens])).logits[0, -1]


def test_content_keys_and_laziness_are_declared_on_causal_or_full_appends_only():
    from walkserve.core.errors import GraphError
    from walkserve.graph.kv import query

    with pytest.raises(GraphError, match="causal or full appends"):
        append("main", mask="block_causal", frame=4, content="content")
    with pytest.raises(GraphError, match="causal or full appends"):
        query("main", content="content")
    with pytest.raises(GraphError, match="only an append may be lazy"):
        query("main", lazy=True)
    assert not append("main", lazy=True).tokens_only and not append("main", content="content").tokens_only


def test_a_moved_keyed_context_is_not_shared_on_the_target(tiny_lm):
    """The moved history carries no row keys: its keyed rows stay out of the target's prefix cache."""
    source = KVCacheEngine("lm", tiny_lm, "cpu", torch.float32, KVOptions(block_size=4, num_blocks=32))
    keyed = dataclasses.replace(
        firing("r", list(range(10, 19)), positions=torch.arange(9), content=torch.tensor([0, 0, D, D, D, 0, 0, 0, 0])),
        node_params=kv_params(append("main", content="content")))
    source.submit(keyed)
    while not source.step():
        pass
    [state] = source.export_contexts("r", ["main"])
    assert state.cache_limit == 0 and state.k.shape[1] == 9


def test_a_lazy_piece_run_with_the_next_firing_yields_between_chunks(tiny_lm, hf_lm):
    """With may_yield, the rows a lazy piece left run as prefill chunks of the firing after it: each call that ran a
    chunk short of that firing answers LATER (other cohorts step in between), and no row runs twice."""
    from walkserve.engines.base import LATER, Group

    def group(tokens: list[int], outputs: tuple[str, ...]) -> Group:
        return Group("w", "lm", "lm", "forward", outputs, kv_params(append("main", lazy=True)), ["r"], [()],
                     [{"tokens": torch.tensor(tokens)}], [{}], [None])

    engine = KVCacheEngine("lm", tiny_lm, "cpu", torch.float32,
                           KVOptions(block_size=4, num_blocks=32, max_batch_tokens=16, seed=0))
    first, second = list(range(10, 30)), list(range(40, 45))
    assert engine.run_groups([group(first, ())], may_yield=True) == [[{}]]
    assert engine.stats()["forward_steps"] == 0  # answered before any forward
    (answer,) = engine.run_groups([group(second, ("logits",))], may_yield=True)
    assert answer == [LATER]  # rows 0..15 ran: the piece's rows are the next firing's prefill
    (last,) = engine.run_groups([group(second, ("logits",))], may_yield=True)  # rows 16..24 (plain rows merge)
    torch.testing.assert_close(last[0]["logits"], _hf_logits(hf_lm, first + second), atol=1e-4, rtol=1e-4)
    assert engine.stats()["forward_rows.lm"] == 25


def test_truncating_a_keyed_context_forgets_the_keys_of_the_rows_it_drops():
    s = _sched()
    _submit(s, "a", _op(PROMPT, MEDIA))
    _run(s)
    s.truncate(("a", "main"), 3)  # back to the text before the clip
    assert s.contexts[("a", "main")].row_keys() == [1, 2, 3]
    _submit(s, "a", None, [40, 41, 42, 43, 44, 45])  # plain rows where the clip was
    _run(s)
    _submit(s, "b", None, [1, 2, 3, 40, 41, 42, 43, 44, 45, 46])
    assert _run(s) == [("b", 8, 2)]  # a's new blocks are keyed by their ids alone


def test_a_fork_keeps_the_keys_of_its_source():
    s = _sched()
    _submit(s, "a", _op(PROMPT, MEDIA))
    _run(s)
    s.fork(("a", "main"), ("a", "copy"))
    assert s.contexts[("a", "copy")].row_keys()[:12] == s.contexts[("a", "main")].row_keys()[:12]
    assert s.contexts[("a", "copy")].row_keys()[4] == (9, D, (4, 4, 4))
