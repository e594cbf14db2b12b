"""Prefill on one rank, decode on another: the LM's KV context moves between the walks (IPC or TCP).

A real tiny Llama served with a per-walk placement decodes exactly what transformers
generates; the placement check accepts it and the memory check counts the KV pool on
both ranks.
"""

from __future__ import annotations

import pytest

from tests.runtime.conftest import wait_until
from tests.runtime.test_text_parity import hf_greedy, prompts, spec, tokens
from walkserve.core.config import RuntimeConfig
from walkserve.core.errors import PlacementError
from walkserve.entrypoint.sync import Engine


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from walkserve.models.llama.tiny import write_tiny

    path = tmp_path_factory.mktemp("llama")
    write_tiny("llama", path, vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, seed=5)
    return path


def disaggregated(transport: str = "ipc", memory: str | None = None) -> dict:
    decode = {"id": 1, "device": "cpu", "transport": transport, **({"memory": memory} if memory else {})}
    return {
        "ranks": [{"id": 0, "device": "cpu"}, decode],
        "nodes": [
            {"nodes": ["lm"], "ranks": [0], "walks": ["prefill", "prefill_logprobs"]},
            {"nodes": ["lm"], "ranks": [1], "walks": ["decode", "decode_logprobs"]},
        ],
    }


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_prefill_on_rank_0_decode_on_rank_1_matches_transformers(tiny_llama, transport):
    requests = [spec(p, n) for p, n in zip(prompts()[:6], [5, 3, 8, 4, 6, 2], strict=True)]
    kv = {"kv": {"num_blocks": 64, "block_size": 4}}
    config = RuntimeConfig(engine_options=kv)
    with Engine.start("llama", placement=disaggregated(transport), config=config, model_path=str(tiny_llama)) as engine:
        results = engine.run(requests)
        for req, res in zip(requests, results, strict=True):
            ids = req.inputs["prompt_token_ids"].tolist()
            assert tokens(res) == hf_greedy(tiny_llama, ids, req.sampling.max_tokens), ids

        def counters(rank: int) -> dict:
            engine.stats()
            worker = engine.status.stats.workers.get(rank)
            return worker.counters if worker else {}

        assert wait_until(lambda: counters(1).get("contexts_moved_in") == len(requests))
        assert counters(0)["contexts_moved_out"] == len(requests)
        assert wait_until(lambda: engine.stats().requests_with_state == 0)  # both sides released


def test_the_memory_check_counts_the_kv_pool_on_both_ranks(tiny_llama):
    with pytest.raises(PlacementError, match=r"rank 1 \(cpu\) needs .*state of lm"):
        Engine.start("llama", placement=disaggregated(memory="1MiB"), model_path=str(tiny_llama))
