"""Greedy decoding through the full runtime equals transformers' generate, request by request.

Concurrent requests of different lengths join while others decode, several share a prompt
prefix, and the KV pool is so small that the engine must preempt and recompute.
"""

from __future__ import annotations

import pytest
import torch

from tests.runtime.conftest import wait_until
from walkserve.core.array import ArrayData
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from walkserve.models.llama.tiny import write_tiny

    path = tmp_path_factory.mktemp("llama")
    write_tiny("llama", path, vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, seed=3)
    return path


def prompts() -> list[list[int]]:
    shared = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28]
    out = [shared + [30 + i] for i in range(4)]  # a shared 18-token prefix (one full block and more)
    out += [[5 + i * 7 + k for k in range(3 + 5 * i)] for i in range(6)]  # 3 ... 28 tokens
    return out


def spec(ids: list[int], max_tokens: int, **sampling) -> RequestSpec:
    return RequestSpec(
        {"prompt_token_ids": ArrayData.from_list(ids)},
        sampling=SamplingParams(max_tokens=max_tokens, temperature=sampling.pop("temperature", 0.0), ignore_eos=True, **sampling),
    )


def hf_greedy(path, ids: list[int], n: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = hf_greedy.cache.get(str(path))
    if model is None:
        model = hf_greedy.cache[str(path)] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


hf_greedy.cache = {}


def tokens(result) -> list[int]:
    return [int(e.data.item()) for e in result.modality("text")]


def test_greedy_matches_transformers_with_preemption(tiny_llama):
    lengths = [4, 9, 6, 12, 3, 8, 10, 5, 9, 7]
    requests = [spec(p, n) for p, n in zip(prompts(), lengths, strict=True)]
    # 10 blocks of 4 tokens: far less than the ~230 tokens these requests hold at once
    kv = {"kv": {"num_blocks": 10, "block_size": 4, "max_batch_tokens": 16}}
    place = {"ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": ["lm"], "ranks": [0]}]}
    from walkserve.core.config import RuntimeConfig
    from walkserve.entrypoint.sync import Engine

    with Engine.start("llama", placement=place, config=RuntimeConfig(engine_options=kv), model_path=str(tiny_llama)) as engine:
        import threading
        import time

        box = {}
        early = threading.Thread(target=lambda: box.update(first=engine.run(requests[:4])))
        early.start()
        time.sleep(0.3)  # the rest join while the first ones decode
        rest = engine.run(requests[4:])
        early.join()
        results = box["first"] + rest
        for req, res, n in zip(requests, results, lengths, strict=True):
            assert res.finished.error is None, res.finished
            assert tokens(res) == hf_greedy(tiny_llama, req.inputs["prompt_token_ids"].tolist(), n)
        stats = engine.stats()
        assert stats.preemptions > 0, "the pool was meant to force preemption"
        assert wait_until(lambda: engine.stats().requests_with_state == 0 and engine.stats().kv_blocks_used == 0)


@pytest.fixture(scope="module")
def engine(tiny_llama):
    """The tiny Llama on one rank with the default runtime config, for the tests here that need nothing else."""
    from walkserve.core.config import RuntimeConfig
    from walkserve.entrypoint.sync import Engine

    place = {"ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": ["lm"], "ranks": [0]}]}
    with Engine.start("llama", placement=place, config=RuntimeConfig(), model_path=str(tiny_llama)) as engine:
        yield engine


def test_concurrent_joins_and_seeded_sampling(tiny_llama, engine):
    greedy = [spec(p, 3 + i) for i, p in enumerate(prompts())]
    results = engine.run(greedy)  # all at once: they join and leave the batch at different steps
    for req, res in zip(greedy, results, strict=True):
        assert tokens(res) == hf_greedy(tiny_llama, req.inputs["prompt_token_ids"].tolist(), req.sampling.max_tokens)
    seeded = spec(prompts()[4], 10, temperature=0.9, seed=1234)
    alone = tokens(engine.run([seeded])[0])
    crowd = [spec(p, 10, temperature=0.9, seed=1234 if i == 4 else 77 + i) for i, p in enumerate(prompts())]
    in_batch = tokens(engine.run(crowd)[4])
    assert alone == in_batch
    other_seed = tokens(engine.run([spec(prompts()[4], 10, temperature=0.9, seed=4321)])[0])
    assert other_seed != alone


def hf_logprobs(path, ids: list[int], generated: list[int]) -> torch.Tensor:
    """log_softmax of transformers' logits at each generated position: [len(generated), vocab]."""
    from transformers import AutoModelForCausalLM

    model = hf_greedy.cache.get(str(path))
    if model is None:
        model = hf_greedy.cache[str(path)] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids + generated])).logits[0, len(ids) - 1 : len(ids) + len(generated) - 1]
    return torch.log_softmax(logits.float(), dim=-1)


def test_logprobs_of_each_token_match_transformers(tiny_llama, engine):
    """A request asking for logprobs decodes through ``decode_logprobs``: each token's logprob and top-k."""
    k = 4
    asked = [spec(p, 6, logprobs=k) for p in prompts()[:3]] + [spec(prompts()[3], 5, logprobs=0)]
    plain = spec(prompts()[4], 6)
    results = engine.run([*asked, plain])
    assert not results[-1].modality("logprobs") and {e.walk for e in results[-1].events} == {"decode"}
    for req, res in zip(asked, results, strict=False):
        assert {e.walk for e in res.events} == {"decode_logprobs"}
        got = tokens(res)
        parts = {}
        for e in res.modality("logprobs"):
            parts.setdefault(e.output, []).append(e)
        assert sorted(parts) == ["logprob", "top_logprob_ids", "top_logprobs"]
        assert [e.iteration for e in parts["logprob"]] == [e.iteration for e in res.modality("text")]
        usage = res.finished.usage  # counted per modality, over the outputs that carry it
        assert (usage["text_outputs"], usage["logprobs_outputs"]) == (len(got), 3 * len(got))
        want = hf_logprobs(tiny_llama, req.inputs["prompt_token_ids"].tolist(), got)
        for i, tok in enumerate(got):
            assert abs(float(parts["logprob"][i].data.tolist()[0]) - float(want[i, tok])) < 1e-4
            n = req.sampling.logprobs
            top_ids = parts["top_logprob_ids"][i].data.tolist()
            top_lps = parts["top_logprobs"][i].data.tolist()
            assert len(top_ids) == len(top_lps) == n
            if n:
                values, ids = want[i].topk(n)
                assert top_ids == ids.tolist()
                assert max(abs(a - b) for a, b in zip(top_lps, values.tolist(), strict=True)) < 1e-4
                assert top_ids[0] == tok  # greedy: the drawn token is the most likely one


def test_an_odd_shape_served_end_to_end_matches_transformers(tmp_path):
    """Qwen3 with one KV head, a head_dim unrelated to hidden/heads, a tied head over a vocabulary larger than its
    tokenizer (and odd), one layer, an odd MLP width and a 64-token context that the request fills to the end."""
    from walkserve.core.config import RuntimeConfig
    from walkserve.entrypoint.sync import Engine
    from walkserve.models.llama.tiny import write_tiny

    path = write_tiny("qwen3", tmp_path / "odd", vocab_size=1001, hidden_size=40, num_attention_heads=3,
                      num_key_value_heads=1, head_dim=24, intermediate_size=97, num_hidden_layers=1,
                      tie_word_embeddings=True, max_position_embeddings=64, rope="llama3", seed=5)
    prompt = [(37 * i + 11) % 1001 for i in range(56)]  # ids past the tokenizer's (about 830) included
    place = {"ranks": [{"id": 0, "device": "cpu"}], "nodes": [{"nodes": ["lm"], "ranks": [0]}]}
    with Engine.start("qwen3", placement=place, config=RuntimeConfig(), model_path=str(path)) as engine:
        [result] = engine.run([spec(prompt, 8)])
    assert result.finished.error is None, result.finished
    assert tokens(result) == hf_greedy(path, prompt, 8)
