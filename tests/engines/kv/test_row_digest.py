"""row_digest: the prefix cache's and capture cache's keys are BLAKE2b digests of a canonical encoding of row keys,
so keys of different structure never meet and Python's ``hash()`` (equal for 1 and 2**61) decides nothing."""

from __future__ import annotations

import hashlib

import pytest

from walkserve.engines.kv.row_digest import DIGEST_SIZE, ROOT, chain, digests, encode

DIGEST = b"\x07" * DIGEST_SIZE

# pairs of row-key runs that differ, each built to look alike to a careless encoding or to hash()
DIFFERENT = [
    ([1], [2**61]),  # equal Python hashes
    ([-1], [-2]),  # equal Python hashes
    ([1, 2], [(1, 2)]),
    ([(1, 2), 3], [(1, (2, 3))]),
    ([(1, (2, 3))], [(1, 2, 3)]),
    ([((1, 2), 3)], [(1, (2, 3))]),
    ([(5, 7, (3,))], [(5, 7, 3)]),
    ([(5, DIGEST)], [(5, int.from_bytes(DIGEST, "little"))]),
    ([2**31 - 1], [2**31]),
    ([2**63 - 1], [2**63]),
    ([2**64], [(2**64).to_bytes(9, "little")]),
    ([], [0]),
    ([b"ab", b"c"], [b"a", b"bc"]),
    (["ab"], [b"ab"]),
]


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_different_keys_get_different_encodings_and_digests(a, b):
    assert encode(a) != encode(b)
    assert chain(ROOT, a) != chain(ROOT, b)
    assert digests(a, [len(a)]) != digests(b, [len(b)])


def test_equal_keys_get_equal_digests_whatever_objects_hold_them():
    """No back-references: a key repeated by identity encodes as an equal key built anew does."""
    big = 2**62 + 5
    shared = (151_655, big, (3, 4))
    fresh = [(151_655, int(str(big)), (3, 4)) for _ in range(3)]
    assert encode([shared] * 3) == encode(fresh) == encode(tuple(fresh))
    assert chain(ROOT, [shared] * 3) == chain(ROOT, fresh)


def test_the_parent_is_part_of_the_digest():
    assert chain(ROOT, [1, 2]) != chain(chain(ROOT, [0]), [1, 2])


def test_the_encoding_is_marshal_version_2():
    """The module docstring's bytes, the same on any host (digests may cross ranks)."""
    assert encode([3, (7,)]) == b"[\x02\x00\x00\x00i\x03\x00\x00\x00(\x01\x00\x00\x00i\x07\x00\x00\x00"
    want = hashlib.blake2b(ROOT + encode([3, (7,)]), digest_size=32, person=b"walkserve-chain").digest()
    assert chain(ROOT, [3, (7,)]) == want


def test_a_key_marshal_cannot_write_is_refused():
    with pytest.raises(ValueError):
        encode([(1, object())])


def test_history_digests_do_not_depend_on_the_other_ends():
    rows = [*range(100), *((i, 9, (i,)) for i in range(100))]
    ends = [0, 5, 64, 65, 128, 199, 200]
    together = digests(rows, ends)
    assert together == [digests(rows, [n])[0] for n in ends]
    assert digests(rows, [3, *ends[1:]])[1:] == together[1:]  # another cut before them
    assert len(set(together)) == len(ends)
    assert digests(rows, [5]) != digests([*rows[:4], 2**61 + 3, *rows[5:]], [5])  # hash(2**61 + 3) == hash(4)
