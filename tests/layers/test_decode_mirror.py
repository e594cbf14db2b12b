"""The decode mirror (CPU decode batches read their keys from a dense copy carried across steps) against the
gathered path, over many steps: joins, leaves, reorders, mixed steps, and pool writes the mirror did not make."""

from __future__ import annotations

import random

import torch

from walkserve.layers.paged_attention import PagedBatch, use_decode
from walkserve.layers.paged_backends import TorchPagedBackend

HQ, HKV, DH, BS, NUM_BLOCKS, LAYERS = 4, 2, 8, 4, 64, 3
SCALE = DH**-0.5


class _Twin:
    """Two pools and backends fed the same steps: one reads decodes from the mirror, one gathers."""

    def __init__(self, seed: int):
        shape = (LAYERS, NUM_BLOCKS, BS, HKV, DH)
        self.pools = {m: (torch.zeros(shape), torch.zeros(shape)) for m in ("mirror", "gather")}
        self.backends = {m: TorchPagedBackend() for m in self.pools}
        self.gen = torch.Generator().manual_seed(seed)
        self.free = list(range(NUM_BLOCKS))
        random.Random(seed).shuffle(self.free)
        self.seqs: dict[str, tuple[list[int], int]] = {}  # name -> (block table, tokens in the pool)

    def add(self, name: str, prompt: int) -> None:
        self.seqs[name] = ([], 0)
        self.step([(name, prompt)])

    def step(self, rows: list[tuple[str, int]]) -> None:
        """Append ``n`` new tokens to each named sequence in one call; checks the two paths agree."""
        for name, n in rows:
            table, length = self.seqs[name]
            while len(table) * BS < length + n:
                table.append(self.free.pop())
            self.seqs[name] = (table, length + n)
        q_lens = [n for _, n in rows]
        batch = PagedBatch(q_lens, [self.seqs[name][1] for name, _ in rows], [list(self.seqs[name][0]) for name, _ in rows], BS)
        t = sum(q_lens)
        contexts = {}
        for mode, (k_cache, v_cache) in self.pools.items():
            with use_decode(mode):
                contexts[mode] = self.backends[mode].context(k_cache, v_cache, batch)
        for layer in range(LAYERS):
            q, k, v = (torch.randn(t, h, DH, generator=self.gen) for h in (HQ, HKV, HKV))
            outs = {mode: ctx.forward(layer, q, k, v, SCALE) for mode, ctx in contexts.items()}
            torch.testing.assert_close(outs["mirror"], outs["gather"], rtol=1e-5, atol=1e-5)

    def overwrite(self, name: str) -> None:
        """Write new values into a sequence's first block behind the attention's back (as a migration would)."""
        block = self.seqs[name][0][0]
        noise = torch.randn(LAYERS, BS, HKV, DH, generator=self.gen)
        for k_cache, v_cache in self.pools.values():
            k_cache[:, block] = noise
            v_cache[:, block] = -noise

    def drop(self, name: str) -> None:
        self.free.extend(self.seqs.pop(name)[0])


def test_steady_decodes_copy_each_sequence_once():
    twin = _Twin(0)
    for i, prompt in enumerate([5, 9, 14]):
        twin.add(f"s{i}", prompt)
    twin.step([(name, 1) for name in twin.seqs])
    mirror = twin.backends["mirror"].mirror
    for row, (_, length) in enumerate(twin.seqs.values()):  # keys past a row's own are masked, but multiplied:
        assert not mirror.k[:, row, length:].any() and not mirror.v[:, row, length:].any()  # zeros, never garbage
    for _ in range(12):
        twin.step([(name, 1) for name in twin.seqs])
    assert mirror.rebuilds == 3  # only the first decode step read the pool


def test_joins_leaves_reorders_and_mixed_steps():
    twin = _Twin(1)
    for i, prompt in enumerate([3, 8, 4]):
        twin.add(f"s{i}", prompt)
    twin.step([("s0", 1), ("s1", 1), ("s2", 1)])
    twin.step([("s2", 1), ("s0", 1), ("s1", 1)])  # reordered: rows move within the mirror
    twin.add("s3", 6)  # a prefill between decode steps
    twin.step([("s0", 1), ("s1", 1), ("s2", 1), ("s3", 1)])
    twin.drop("s1")
    twin.step([("s0", 1), ("s2", 1), ("s3", 1)])
    twin.step([("s3", 2), ("s0", 1)])  # a two-token append makes a mixed step
    for _ in range(6):
        twin.step([("s2", 1), ("s0", 1), ("s3", 1)])
    twin.add("s1", 4)  # s1's blocks go to a new sequence of the same name
    twin.step([("s1", 1), ("s2", 1)])


def test_a_pool_write_the_mirror_did_not_make_is_seen():
    twin = _Twin(2)
    twin.add("a", 7)
    twin.add("b", 5)
    twin.step([("a", 1), ("b", 1)])
    twin.overwrite("a")
    twin.step([("a", 1), ("b", 1)])  # would read a's old keys from the mirror if it missed the write


def test_rows_outgrow_the_capacity(monkeypatch):
    from walkserve.layers import decode_mirror

    monkeypatch.setattr(decode_mirror, "MARGIN", 2)
    twin = _Twin(3)
    twin.add("a", 3)
    twin.add("b", 6)
    for _ in range(10):
        twin.step([("a", 1), ("b", 1)])
    assert twin.backends["mirror"].mirror.k.shape[2] >= 16  # 12 at first (9 tokens + 2, in blocks of 4)


def test_a_mirror_too_large_falls_back_to_the_gather(monkeypatch):
    from walkserve.layers import decode_mirror

    monkeypatch.setattr(decode_mirror, "MAX_BYTES", 0)
    twin = _Twin(4)
    twin.add("a", 5)
    twin.step([("a", 1)])
    assert twin.backends["mirror"].mirror.k is None
