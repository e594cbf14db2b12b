"""The capture cache: a lazy piece whose outputs are captured rows (Qwen3-Omni's media pieces, whose layer inputs feed
the talker) is answered at submission when an equal piece ran after the same history, and its rows become history
that the prefix cache serves; so a follow-up turn computes only its new rows. Exact plans, counters and values."""

from __future__ import annotations

import dataclasses

import torch

from tests.engines.kv.kv_driver import firing
from walkserve.core.options import KVOptions
from walkserve.engines.kv.capture_cache import _run_keys
from walkserve.engines.kv.engine import KVCacheEngine
from walkserve.graph.kv import ALL, append, kv_params

BS, LAYER = 4, 1
TEXT1, MEDIA1 = list(range(10, 17)), list(range(30, 39))  # turn 1: text, a 9-row "media" piece (rows 7..15)
TEXT2, MEDIA2 = list(range(50, 55)), list(range(60, 66))  # turn 2 adds these after turn 1's pieces and answer
LAST = [70]


def _engine(lm, **options) -> KVCacheEngine:
    return KVCacheEngine("lm", lm, "cpu", torch.float32, KVOptions(block_size=BS, num_blocks=64, seed=0, **options))


def _text(rid: str, tokens: list[int]):
    return dataclasses.replace(firing(rid, tokens, outputs=()), node_params=kv_params(append("main", lazy=True)))


def _media(rid: str, tokens: list[int]):
    spec = append("main", rows=ALL, capture={"accept": LAYER}, lazy=True)
    return dataclasses.replace(firing(rid, tokens, outputs=("accept",)), node_params=kv_params(spec))


def _answer(engine: KVCacheEngine, f) -> dict:
    engine.submit(f)
    for _ in range(100):
        done = [r for r in engine.step() if r.firing.id == f.id]
        if done:
            assert done[0].error is None, done[0].error
            return done[0].outputs
    raise AssertionError("not answered")


def _turn(engine: KVCacheEngine, rid: str, pieces: list) -> list[dict]:
    """Each piece in order (text, media, ..., the last token), as a spoken answer's prefill walks them."""
    outs = [_answer(engine, kind(rid, tokens)) for kind, tokens in pieces]
    engine.release(rid)
    return outs


TURN1 = [(_text, TEXT1), (_media, MEDIA1), (_text, LAST)]
TURN2 = [(_text, TEXT1), (_media, MEDIA1), (_text, LAST + TEXT2), (_media, MEDIA2), (_text, LAST)]


def _last(rid: str, tokens: list[int]):
    return firing(rid, tokens, outputs=("token",))


def test_a_follow_up_turn_computes_only_its_new_rows_and_gets_the_same_rows(tiny_lm):
    engine, fresh = _engine(tiny_lm), _engine(tiny_lm, capture_cache_bytes=0)
    pieces1 = [*TURN1[:2], (_last, LAST)]
    pieces2 = [*TURN2[:4], (_last, LAST)]
    first = _turn(engine, "a", pieces1)
    steps, before = engine.forwards, engine.stats()
    second = _turn(engine, "b", pieces2)
    after = engine.stats()
    n1, n2 = len(TEXT1 + MEDIA1 + LAST), len(TEXT1 + MEDIA1 + LAST + TEXT2 + MEDIA2 + LAST)
    assert after["capture_cache_hits"] == 1  # turn 1's media piece, answered at submission
    reused = after["prefix_hit_tokens"] - before["prefix_hit_tokens"]
    prefilled = after["prefill_tokens"] - before["prefill_tokens"]
    assert reused == (n1 - 1) // BS * BS == 16  # every full block of turn 1 (its last row sampled the answer)
    # the new rows and the rest of one block; the last row, a one-row firing, is not a prefill
    assert prefilled + reused == n2 - 1 and prefilled < n2 - n1 + BS
    assert engine.forwards - steps <= 3
    torch.testing.assert_close(second[1]["accept"], first[1]["accept"], rtol=0, atol=0)  # the kept rows themselves
    want = _turn(fresh, "b", pieces2)  # no capture cache: every row computed
    assert fresh.stats()["capture_cache_hits"] == 0
    torch.testing.assert_close(second[1]["accept"], want[1]["accept"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(second[3]["accept"], want[3]["accept"], atol=1e-5, rtol=1e-5)
    assert second[4]["token"].tolist() == want[4]["token"].tolist()


def test_another_history_or_another_piece_is_not_served(tiny_lm):
    engine = _engine(tiny_lm)
    _turn(engine, "a", [*TURN1[:2], (_last, LAST)])
    other_history = _turn(engine, "b", [(_text, [11, *TEXT1[1:]]), (_media, MEDIA1), (_last, LAST)])
    other_piece = _turn(engine, "c", [(_text, TEXT1), (_media, [31, *MEDIA1[1:]]), (_last, LAST)])
    assert engine.stats()["capture_cache_hits"] == 0
    want = _turn(_engine(tiny_lm, capture_cache_bytes=0), "b", [(_text, [11, *TEXT1[1:]]), (_media, MEDIA1),
                                                                 (_last, LAST)])
    torch.testing.assert_close(other_history[1]["accept"], want[1]["accept"], atol=1e-5, rtol=1e-5)
    assert other_piece[1]["accept"].shape == (len(MEDIA1), tiny_lm.config.hidden_size)


def test_a_history_whose_python_hash_collides_keys_its_runs_apart():
    """The history before a run is keyed on a digest of its row keys, not ``hash()``: 1 and 2**61 hash alike in
    Python, as a client could make two histories do, and would serve one's captured rows after the other."""
    a, b = [1, 1, 5, 5, 6], [2**61, 2**61, 5, 5, 6]
    assert hash(tuple(a[:2])) == hash(tuple(b[:2]))
    runs_a, runs_b = _run_keys(a, 2, 5, "lm"), _run_keys(b, 2, 5, "lm")
    assert [r[:3] for r in runs_a] == [r[:3] for r in runs_b] == [("lm", 2, 4), ("lm", 4, 5)]
    assert all(ra[3] != rb[3] for ra, rb in zip(runs_a, runs_b, strict=True))
    assert _run_keys(a, 2, 5, "lm") == runs_a and _run_keys(list(a), 4, 5, "lm")[0] == runs_a[1]  # split-invariant


def test_the_cache_is_bounded_in_bytes_least_recently_used_first_out(tiny_lm):
    row = tiny_lm.config.hidden_size * 4  # float32 rows
    engine = _engine(tiny_lm, capture_cache_bytes=len(MEDIA1) * row + 1)  # one piece of 9 rows fits, not two
    _turn(engine, "a", [*TURN1[:2], (_last, LAST)])
    assert engine.stats()["capture_cache_bytes"] == len(MEDIA1) * row
    _turn(engine, "b", [(_text, TEXT1), (_media, MEDIA2), (_last, LAST)])  # another piece pushes the first out
    assert engine.stats()["capture_cache_bytes"] == len(MEDIA2) * row
    _turn(engine, "c", [*TURN1[:2], (_last, LAST)])
    assert engine.stats()["capture_cache_hits"] == 0  # computed again, and kept again
    _turn(engine, "d", [*TURN1[:2], (_last, LAST)])
    assert engine.stats()["capture_cache_hits"] == 1


def test_a_piece_that_extends_a_kept_one_computes_only_its_new_rows(tiny_lm):
    """A clip prefilled while it arrives, then committed longer: the committed piece's first rows (those whose keys
    the shorter piece shared; its last row differs, as an incomplete window's would) come from the capture cache
    and their KV from the prefix cache; only the rest is computed, and every row equals a cold run."""
    engine, cold = _engine(tiny_lm), _engine(tiny_lm, capture_cache_bytes=0)
    short = [*MEDIA1[:6], 99]
    first = _turn(engine, "a", [(_text, TEXT1), (_media, short), (_last, LAST)])
    before = engine.stats()
    second = _turn(engine, "b", [(_text, TEXT1), (_media, MEDIA1), (_last, LAST)])
    after = engine.stats()
    assert after["capture_cache_partial_hits"] == 1 and after["capture_cache_hits"] == 0
    reused = after["prefix_hit_tokens"] - before["prefix_hit_tokens"]
    prefilled = after["prefill_tokens"] - before["prefill_tokens"]
    n = len(TEXT1 + MEDIA1 + LAST)
    assert reused == (len(TEXT1) + 6) // BS * BS == 12  # the full blocks of the shared 13 rows, not just the text's
    assert prefilled == n - 1 - reused == 4  # the kept piece's 13th row (mid-block) and the 3 new rows
    torch.testing.assert_close(second[1]["accept"][:6], first[1]["accept"][:6], rtol=0, atol=0)  # the kept rows
    want = _turn(cold, "b", [(_text, TEXT1), (_media, MEDIA1), (_last, LAST)])
    assert second[1]["accept"].shape == want[1]["accept"].shape == (len(MEDIA1), tiny_lm.config.hidden_size)
    torch.testing.assert_close(second[1]["accept"], want[1]["accept"], atol=1e-5, rtol=1e-5)
    assert second[2]["token"].tolist() == want[2]["token"].tolist()
    third = _turn(engine, "c", [(_text, TEXT1), (_media, MEDIA1), (_last, LAST)])  # now kept whole
    assert engine.stats()["capture_cache_hits"] == 1
    torch.testing.assert_close(third[1]["accept"], second[1]["accept"], rtol=0, atol=0)
