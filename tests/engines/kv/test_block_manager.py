"""BlockManager: exact block ids through allocate / append / fork / free / evict, prefix sharing, preemption."""

from __future__ import annotations

import random

import pytest

from walkserve.engines.kv.block_manager import BlockManager

A, B, C, D = ("r1", "main"), ("r2", "main"), ("r3", "main"), ("r4", "main")
P = list(range(1, 11))  # 10 tokens: two full blocks of 4 and a partial one


def test_append_and_free_hand_out_exact_ids():
    bm = BlockManager(num_blocks=8, block_size=4)
    assert bm.append_slots(A, 6)
    assert bm.table(A) == [0, 1] and bm.num_reserved(A) == 6
    assert bm.append_slots(B, 4)
    assert bm.table(B) == [2]
    assert bm.append_slots(A, 2) and bm.table(A) == [0, 1]  # fills block 1 exactly
    assert bm.append_slots(A, 1) and bm.table(A) == [0, 1, 3]
    assert (bm.num_used, bm.num_free) == (4, 4)
    assert bm.slot(A, 0) == 0 and bm.slot(A, 5) == 5 and bm.slot(A, 8) == 12 and bm.slot(B, 3) == 11
    bm.free(A)  # never committed: blocks go back to the free list, tail first
    bm.check()
    assert bm.append_slots(C, 20)
    assert bm.table(C) == [4, 5, 6, 7, 3]
    assert not bm.append_slots(D, 12)  # 3 blocks needed, 2 free: all or nothing
    assert not bm.has(D) and bm.num_free == 2
    assert bm.max_appendable(D) == 8 and bm.max_appendable(C) == 8  # C's last block is full
    assert bm.append_slots(D, 8) and bm.table(D) == [1, 0]
    bm.check()


def test_prefix_blocks_are_shared_by_refcount_and_evicted_lru():
    bm = BlockManager(num_blocks=8, block_size=4)
    assert bm.attach_prefix(A, P, max_tokens=9) == 0  # empty cache
    assert bm.append_slots(A, 10) and bm.table(A) == [0, 1, 2]
    bm.commit(A, P, 10)  # blocks 0 and 1 are full: registered; block 2 is partial: not
    prompt_b = [*P, 11, 12]
    assert bm.attach_prefix(B, prompt_b, max_tokens=11) == 8
    assert bm.table(B) == [0, 1] and bm.num_reserved(B) == 8
    assert bm.ref_count(0) == bm.ref_count(1) == 2
    assert bm.append_slots(B, 4) and bm.table(B) == [0, 1, 3]
    bm.commit(B, prompt_b, 12)  # block 3 = (9, 10, 11, 12) after the shared prefix
    bm.free(A)
    assert (bm.ref_count(0), bm.ref_count(1), bm.ref_count(2)) == (1, 1, 0)
    bm.free(B)  # all registered blocks stay cached, evictable tail first: 3, 1, 0
    bm.check()
    assert bm.num_used == 0 and bm.num_evictable == 3 and bm.num_free == 8
    assert bm.attach_prefix(C, P, max_tokens=9) == 8 and bm.table(C) == [0, 1]
    assert bm.append_slots(D, 24)  # free list 4 5 6 7 2 first, then the oldest evictable: block 3
    assert bm.table(D) == [4, 5, 6, 7, 2, 3]
    assert bm.attach_prefix(("r5", "main"), prompt_b, max_tokens=12) == 8  # (9..12) was evicted
    bm.check()


def test_attach_is_capped_and_matches_whole_blocks_only():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.append_slots(A, 10)
    bm.commit(A, P, 10)
    assert bm.attach_prefix(B, P, max_tokens=7) == 4  # 7 tokens allowed -> one whole block
    assert bm.attach_prefix(C, [1, 2, 3, 4, 9, 9, 9, 9], max_tokens=8) == 4  # diverges in block 1
    assert bm.attach_prefix(D, [9, *P[1:]], max_tokens=9) == 0  # diverges in block 0: chain broken
    no_cache = BlockManager(num_blocks=8, block_size=4, prefix_caching=False)
    no_cache.append_slots(A, 10)
    no_cache.commit(A, P, 10)
    assert no_cache.attach_prefix(B, P, max_tokens=9) == 0


def test_same_block_tokens_after_different_prefixes_are_distinct():
    bm = BlockManager(num_blocks=8, block_size=2)
    first, second = [1, 2, 5, 6], [3, 4, 5, 6]
    bm.append_slots(A, 4)
    bm.commit(A, first, 4)
    bm.append_slots(B, 4)
    bm.commit(B, second, 4)
    assert bm.attach_prefix(C, [*second, 7], max_tokens=4) == 4
    assert bm.table(C) == bm.table(B) == [2, 3]


def test_fork_shares_blocks_and_copies_the_partial_block_on_write():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.append_slots(A, 6)
    bm.fork(A, B)
    assert bm.table(B) == [0, 1] and bm.ref_count(0) == bm.ref_count(1) == 2
    assert bm.blocks_needed(B, 1) == 1 and bm.blocks_needed(B, 3) == 2  # copy + one more block
    assert bm.max_appendable(B) == 2 + 5 * 4  # the copy takes one of the 6 free blocks
    assert bm.append_slots(B, 1)
    assert bm.table(B) == [0, 2] and bm.ref_count(1) == 1
    assert bm.take_copies() == [(1, 2)] and bm.take_copies() == []
    assert bm.append_slots(A, 1) and bm.table(A) == [0, 1]  # A owns block 1 alone now: in place
    assert bm.take_copies() == []
    bm.free(A)
    assert bm.ref_count(0) == 1 and bm.table(B) == [0, 2]
    bm.check()


def test_fork_of_a_full_last_block_needs_no_copy():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.append_slots(A, 8)
    bm.fork(A, B)
    assert bm.append_slots(B, 1) and bm.table(B) == [0, 1, 2]
    assert bm.take_copies() == []


def test_copy_on_write_without_a_free_block_fails_cleanly():
    bm = BlockManager(num_blocks=2, block_size=4)
    bm.append_slots(A, 6)
    bm.fork(A, B)
    assert bm.num_free == 0 and bm.max_appendable(B) == 0
    assert not bm.append_slots(B, 1)
    assert bm.table(B) == [0, 1] and bm.take_copies() == []


def test_preempt_then_resume_reuses_cached_blocks():
    bm = BlockManager(num_blocks=6, block_size=4)
    bm.append_slots(A, 10)  # [0, 1, 2]
    bm.commit(A, P, 10)
    bm.append_slots(B, 8)  # [3, 4]
    bm.free(A)  # preempted: 2 -> free list; 1, 0 -> evictable
    assert bm.num_free == 4 and bm.num_evictable == 2
    assert bm.attach_prefix(A, [*P, 11], max_tokens=10) == 8
    assert bm.table(A) == [0, 1]
    assert bm.append_slots(A, 3) and bm.table(A) == [0, 1, 5]  # free list: 5, then 2
    bm.check()


def test_free_request_frees_every_context_of_the_request():
    bm = BlockManager(num_blocks=8, block_size=4)
    for tag in ("cond", "uncond", "img"):
        bm.append_slots(("r1", tag), 5)
    bm.append_slots(("r2", "main"), 5)
    assert sorted(bm.free_request("r1")) == [("r1", "cond"), ("r1", "img"), ("r1", "uncond")]
    assert bm.keys() == [("r2", "main")] and bm.num_used == 2
    bm.free("missing")  # type: ignore[arg-type]  # freeing an unknown key is a no-op
    bm.check()


def test_random_operations_keep_the_invariants():
    rng = random.Random(0)
    bm = BlockManager(num_blocks=12, block_size=3)
    tokens: dict[tuple[str, str], list[int]] = {}
    seen: set[tuple[str, str]] = set()
    for step in range(400):
        forks = [k for k in tokens if k[1] != "main"]
        key = rng.choice(forks) if forks and rng.random() < 0.3 else (f"r{rng.randrange(5)}", "main")
        op = rng.random()
        if op < 0.5:
            n = rng.randrange(1, 7)
            if key not in tokens:
                tokens[key] = [rng.randrange(3) for _ in range(n + 6)]
                bm.attach_prefix(key, tokens[key], max_tokens=len(tokens[key]) - 1)
            else:
                tokens[key].extend(rng.randrange(3) for _ in range(n))
            if bm.append_slots(key, min(n, len(tokens[key]) - bm.num_reserved(key))):
                bm.commit(key, tokens[key], bm.num_reserved(key))
        elif op < 0.6 and key in tokens and bm.has(key):
            dst = (key[0], f"fork{step}")
            bm.fork(key, dst)
            tokens[dst] = list(tokens[key][: bm.num_reserved(key)])
        else:
            bm.free(key)
            tokens.pop(key, None)
        seen.update(tokens)
        bm.take_copies()
        bm.check()
        assert bm.num_used + bm.num_free == bm.num_blocks
    assert sum(k[1] != "main" for k in seen) > 10, "the walk forked too rarely to test anything"


@pytest.mark.parametrize("bad", [(0, 4), (4, 0)])
def test_rejects_an_empty_geometry(bad):
    with pytest.raises(ValueError):
        BlockManager(*bad)


def test_histories_whose_python_hashes_collide_share_no_block():
    """1 and 2**61 hash alike in Python (so do tuples of them), as a client could make any two histories do: a key
    chained on ``hash()`` would attach A's later blocks after B's first. The digest chain keeps them apart."""
    assert hash((0, (1, 9))) == hash((0, (2**61, 9)))
    bm = BlockManager(num_blocks=12, block_size=2)
    bm.append_slots(A, 6)
    bm.commit(A, [1, 9, 5, 6, 3, 4], 6)  # blocks 0 1 2
    bm.append_slots(B, 4)
    bm.commit(B, [2**61, 9, 7, 8], 4)  # blocks 3 4
    prompt = [2**61, 9, 5, 6, 3, 4, 0]
    assert bm.attach_prefix(C, prompt, max_tokens=6) == 2 and bm.table(C) == [3]  # B's first block only
    assert bm.append_slots(D, 3)
    bm.commit(D, prompt, 3)
    assert not bm.cached_after_partial(D, prompt, max_tokens=6)  # A's (3, 4) follows another history
    bm.check()
