"""A request's KV contexts move between engines (prefill on one rank, decode on another) and decoding goes on exactly."""

from __future__ import annotations

import torch

from tests.engines.kv.kv_driver import firing
from walkserve.core.options import KVOptions
from walkserve.engines.kv.engine import KVCacheEngine
from walkserve.protocol import messages as m
from walkserve.protocol.codec import decode, encode
from walkserve.transport.tensors import TensorCodec
from walkserve.worker.wire import pack, unpack_message


def _engine(model, num_blocks: int = 64) -> KVCacheEngine:
    return KVCacheEngine("lm", model, "cpu", torch.float32,
                         KVOptions(block_size=4, num_blocks=num_blocks, max_batch_tokens=64))


def _run(engine: KVCacheEngine, f) -> int:
    engine.submit(f)
    while True:
        for r in engine.step():
            assert r.error is None, r.error
            if r.firing.id == f.id:
                return int(r.outputs["token"][0])


def _decode(engine: KVCacheEngine, first: int, n: int) -> list[int]:
    out = [first]
    for _ in range(n):
        out.append(_run(engine, firing("r", [out[-1]])))
    return out


def _moved(states: list) -> list:
    """The contexts as the receiving worker gets them: packed, encoded, decoded, unpacked."""
    msg = pack(m.Contexts("r", 0, states), TensorCodec("t", "x", use_shm=False), inline=True)
    [back] = decode(encode("tok", [msg]), "tok")
    return unpack_message(back).contexts


def test_decode_after_a_move_is_the_decode_without_one(tiny_lm):
    prompt = torch.randint(3, 500, (13,), generator=torch.Generator().manual_seed(3)).tolist()
    stay = _engine(tiny_lm)
    want = _decode(stay, _run(stay, firing("r", prompt)), 8)
    source, target = _engine(tiny_lm), _engine(tiny_lm)
    first = _run(source, firing("r", prompt))
    states = source.export_contexts("r", ["main"])
    assert source.state_count() == 0 and source.block_manager.num_used == 0  # it left the source
    [state] = _moved(states)
    assert state.name == "main" and state.k.shape[1] == len(prompt) and state.token_ids == prompt
    target.import_contexts("r", [state])
    assert target.scheduler.contexts[("r", "main")].num_computed == len(prompt)
    assert _decode(target, first, 8) == want
    assert target.stats()["prefix_hit_tokens"] == 0  # nothing recomputed: the K/V came along


def test_a_target_without_room_recomputes_the_context_and_still_decodes_the_same(tiny_lm):
    prompt = torch.randint(3, 500, (13,), generator=torch.Generator().manual_seed(4)).tolist()
    stay = _engine(tiny_lm)
    want = _decode(stay, _run(stay, firing("r", prompt)), 4)
    source, target = _engine(tiny_lm), _engine(tiny_lm, num_blocks=6)
    first = _run(source, firing("r", prompt))
    target.block_manager.append_slots(("other", "main"), 16)  # 4 of its 6 blocks taken
    target.import_contexts("r", _moved(source.export_contexts("r", ["main"])))
    assert target.scheduler.contexts[("r", "main")].num_computed == 0  # no room: the rows come back from their segments
    target.scheduler.drop(("other", "main"))
    assert _decode(target, first, 4) == want


def test_a_busy_context_does_not_move(tiny_lm):
    engine = _engine(tiny_lm)
    engine.submit(firing("r", [5, 6, 7]))
    try:
        engine.export_contexts("r", ["main"])
    except ValueError as e:
        assert "still have work" in str(e)
    else:
        raise AssertionError("a busy context moved")


def test_only_the_named_contexts_move_with_their_fanned_members(tiny_lm):
    source = _engine(tiny_lm)
    _run(source, firing("r", [5, 6, 7]))
    for name in ("cand[0]", "cand[1]", "candidate", "other"):
        source.scheduler.context(("r", name), "lm")
    source.scheduler.contexts[("r", "main")].segments[0].component = "expert"  # written by another of its share group
    moved = _moved(source.export_contexts("r", ["cand", "main"]))
    assert sorted(st.name for st in moved) == ["cand[0]", "cand[1]", "main"]
    target = _engine(tiny_lm)
    target.import_contexts("r", [st for st in moved if st.name == "main"])
    assert [g.component for g in target.scheduler.contexts[("r", "main")].segments] == ["expert"]  # its writer kept
    assert sorted(k[1] for k in source.scheduler.contexts) == ["candidate", "other"]  # stay where they were used
