"""KVCacheEngine driven by firings against transformers on the same tiny random Llama."""

from __future__ import annotations

import pytest
import torch

from tests.engines.kv.kv_driver import Generation, drive, firing, hf_greedy
from walkserve.core.options import KVOptions
from walkserve.core.sampling import SamplingParams
from walkserve.engines.kv.engine import KVCacheEngine
from walkserve.layers.attention import DenseCausalAttention
from walkserve.layers.paged_backends import flashinfer_available

pytestmark = pytest.mark.parity


def _engine(model, **kw) -> KVCacheEngine:
    kw = {"block_size": 4, "num_blocks": 64, "max_batch_tokens": 64, "seed": 0, **kw}
    return KVCacheEngine("lm", model, "cpu", torch.float32, KVOptions(**kw))


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _hf_last(hf_lm, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        out = hf_lm(torch.tensor([tokens]), output_hidden_states=True)
    return out.logits[0, -1], out.hidden_states[-1][0, -1]


def test_greedy_parity_with_joins_shared_prefixes_chunking_and_preemption(tiny_lm, hf_lm):
    shared = _prompt(20, 1)
    gens = [
        Generation("r0", shared + _prompt(3, 2), 12, join_step=0),
        Generation("r1", _prompt(7, 3), 12, join_step=0),
        Generation("r2", shared + _prompt(21, 4), 12, join_step=2),
        Generation("r3", list(shared), 12, join_step=5),
        Generation("r4", _prompt(33, 5), 12, join_step=9),
        Generation("r5", _prompt(7, 3), 12, join_step=30),  # r1's prompt again, after r1 is done
    ]
    engine = _engine(tiny_lm, num_blocks=24, max_batch_tokens=16, max_running=8)  # 96 tokens of KV
    drive(engine, gens)
    for g in gens:
        assert g.tokens == hf_greedy(hf_lm, g.prompt, g.max_new), g.request_id
    stats = engine.stats()
    assert stats["preemptions"] > 0
    assert stats["prefix_hit_tokens"] >= 16 + 4  # r2/r3 reuse the shared prefix, r5 reuses r1's blocks
    assert engine.state_count() == 0 and stats["kv_blocks_used"] == 0
    assert stats["running"] == stats["waiting"] == 0 and not engine.has_work()


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(tiny_lm):
    params = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, repetition_penalty=1.2, seed=7)

    def mine() -> Generation:
        return Generation("x", _prompt(11, 9), 10, sampling=params, join_step=3)

    alone = mine()
    drive(_engine(tiny_lm, seed=1), [alone])
    crowded = mine()
    others = [
        Generation("o1", _prompt(30, 10), 10, sampling=SamplingParams(temperature=1.0), join_step=0),
        Generation("o2", _prompt(5, 11), 10, sampling=SamplingParams(temperature=0.7, seed=99), join_step=4),
        Generation("o3", _prompt(17, 12), 10, join_step=6),
    ]
    engine = _engine(tiny_lm, seed=2, num_blocks=16, max_batch_tokens=12)
    drive(engine, [crowded, *others])
    assert crowded.tokens == alone.tokens
    assert engine.stats()["preemptions"] > 0  # the draws survive recomputation too
    reseeded = Generation("x", _prompt(11, 9), 10, sampling=SamplingParams(temperature=0.9, seed=8))
    drive(_engine(tiny_lm), [reseeded])
    assert reseeded.tokens != alone.tokens


def test_long_prompt_is_answered_after_its_last_chunk(tiny_lm, hf_lm):
    prompt = _prompt(40, 13)
    engine = _engine(tiny_lm, max_batch_tokens=16)
    engine.submit(firing("a", prompt, outputs=("logits", "hidden", "token")))
    assert engine.step() == [] and engine.step() == []
    assert engine.stats()["running"] == 1
    (result,) = engine.step()
    logits, hidden = _hf_last(hf_lm, prompt)
    assert result.error is None and set(result.outputs) == {"logits", "hidden", "token"}
    torch.testing.assert_close(result.outputs["logits"], logits, atol=1e-4, rtol=1e-4)
    assert result.outputs["hidden"].shape == (1, tiny_lm.config.hidden_size)
    assert result.outputs["hidden"].dtype == torch.float32
    torch.testing.assert_close(result.outputs["hidden"][0], hidden, atol=1e-4, rtol=1e-4)
    assert result.outputs["token"].tolist() == [int(logits.argmax())]
    stats = engine.stats()  # three forward calls of one chunk each: 16 + 16 + 8 rows, and their time
    assert (stats["forwards.lm"], stats["forward_chunks.lm"], stats["forward_rows.lm"]) == (3, 3, 40)
    assert stats["forward_s.lm"] > 0


def test_fill_only_firing_then_decode_reuses_the_kv(tiny_lm, hf_lm):
    prompt = _prompt(9, 14)
    engine = _engine(tiny_lm)
    engine.submit(firing("a", prompt, outputs=()))
    (filled,) = engine.step()
    assert filled.error is None and filled.outputs == {}
    engine.submit(firing("a", [42], outputs=("logits",)))
    plan_tokens = engine.scheduler.schedule()
    assert [c.num_tokens for c in plan_tokens.chunks] == [1]  # only the new token runs
    outputs = engine.runner.execute(plan_tokens.chunks)
    engine.scheduler.finish(plan_tokens)
    torch.testing.assert_close(outputs[0]["logits"], _hf_last(hf_lm, [*prompt, 42])[0], atol=1e-4, rtol=1e-4)


def test_contexts_of_one_request_are_separate_and_released_together(tiny_lm, hf_lm):
    cond, uncond = _prompt(12, 15), _prompt(6, 16)
    engine = _engine(tiny_lm)
    engine.submit(firing("img", cond, outputs=("logits",), context="cond"))
    engine.submit(firing("img", uncond, outputs=("logits",), context="uncond"))
    engine.submit(firing("other", cond, outputs=("logits",)))
    results = {(r.firing.request_id, r.firing.node_params["context"]): r for r in engine.step()}
    assert len(results) == 3
    for key, prompt in [(("img", "cond"), cond), (("img", "uncond"), uncond), (("other", "main"), cond)]:
        torch.testing.assert_close(results[key].outputs["logits"], _hf_last(hf_lm, prompt)[0], atol=1e-4, rtol=1e-4)
    assert engine.state_count() == 2
    engine.release("img")
    engine.release("img")  # idempotent
    assert engine.state_count() == 1
    engine.release("other")
    assert engine.state_count() == 0 and engine.stats()["kv_blocks_used"] == 0


def test_a_context_larger_than_the_pool_is_answered_with_an_error(tiny_lm, hf_lm):
    engine = _engine(tiny_lm, num_blocks=8)  # 32 tokens
    engine.submit(firing("big", _prompt(40, 17)))
    ok = Generation("ok", _prompt(10, 18), 3)
    engine.submit(ok.first())
    results = engine.step()
    errors = [r for r in results if r.error]
    assert len(errors) == 1 and errors[0].firing.request_id == "big"
    assert "40 tokens" in errors[0].error and "32 tokens" in errors[0].error
    ok_result = [r for r in results if r.firing.request_id == "ok"]
    assert ok_result and ok_result[0].outputs["token"].tolist() == hf_greedy(hf_lm, ok.prompt, 1)
    engine.release("big")
    engine.release("ok")
    assert engine.state_count() == 0


@pytest.mark.parametrize(
    ("inputs", "outputs", "message"),
    [
        ({"tokens": torch.tensor([1.0, 2.0])}, ("token",), "integer ids"),
        ({"tokens": torch.tensor([1, 512])}, ("token",), "outside the vocabulary"),
        ({"tokens": torch.tensor([], dtype=torch.long)}, ("token",), "empty"),
        ({"tokens": torch.tensor([1, 2])}, ("token", "pixels"), "unknown outputs"),
        ({}, ("token",), "without input 'tokens'"),
        ({"tokens": torch.tensor([1, 2]), "embeds": torch.zeros(3, 4)}, ("token",), "'embeds'"),
    ],
)
def test_bad_firings_become_error_results(tiny_lm, inputs, outputs, message):
    engine = _engine(tiny_lm)
    bad = firing("bad", [1], outputs=outputs)
    bad.inputs = inputs
    engine.submit(bad)
    assert engine.has_work()
    (result,) = engine.step()
    assert result.outputs is None and message in result.error
    assert not engine.has_work() and engine.state_count() == 0


def test_release_mid_prefill_drops_the_firing_and_frees_the_blocks(tiny_lm):
    engine = _engine(tiny_lm, max_batch_tokens=16)
    engine.submit(firing("a", _prompt(40, 19)))
    assert engine.step() == []
    assert engine.stats()["kv_blocks_used"] == 4
    engine.release("a")
    assert not engine.has_work() and engine.step() == []
    assert engine.state_count() == 0 and engine.stats()["kv_blocks_used"] == 0


def test_embeds_replace_token_embeddings_and_stay_out_of_the_prefix_cache(tiny_lm):
    prompt = _prompt(10, 20)
    ids = torch.tensor(prompt)
    features = torch.randn(4, tiny_lm.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        embeds = tiny_lm.embed(ids).clone()
        embeds[3:7] = features  # four "image" positions
        want = tiny_lm.compute_logits(tiny_lm(ids, torch.arange(10), DenseCausalAttention(), inputs_embeds=embeds))
    engine = _engine(tiny_lm)
    engine.submit(firing("mm", prompt[:3], outputs=()))
    engine.submit(firing("mm", prompt[3:7], outputs=(), embeds=features))
    engine.submit(firing("mm", prompt[7:], outputs=("logits",)))
    results = [r for _ in range(3) for r in engine.step()]
    assert [r.outputs for r in results[:2]] == [{}, {}]
    torch.testing.assert_close(results[2].outputs["logits"], want[-1], atol=1e-4, rtol=1e-4)
    engine.submit(firing("text", prompt, outputs=("logits",)))
    (text,) = engine.step()
    assert engine.stats()["prefix_hit_tokens"] == 0  # the same ids, but not the same inputs
    assert not torch.allclose(text.outputs["logits"], want[-1], atol=1e-3)


def test_logprob_outputs(tiny_lm, hf_lm):
    prompt = _prompt(8, 21)
    engine = _engine(tiny_lm)
    sampling = SamplingParams(temperature=0.0, logprobs=3)
    engine.submit(firing("a", prompt, outputs=("token", "logprob", "top_logprobs", "top_logprob_ids"), sampling=sampling))
    (result,) = engine.step()
    ref = torch.log_softmax(_hf_last(hf_lm, prompt)[0], -1)
    top = ref.topk(3)
    assert result.outputs["top_logprob_ids"].tolist() == top.indices.tolist()
    assert result.outputs["token"].tolist() == [int(top.indices[0])]
    torch.testing.assert_close(result.outputs["top_logprobs"], top.values, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(result.outputs["logprob"], top.values[:1], atol=1e-4, rtol=1e-4)


def test_kv_bytes_sizes_the_pool_and_bfloat16_runs(tiny_llama_dir, tiny_lm):
    from walkserve.models.llama.weights import load_causal_lm

    cfg = tiny_lm.config
    per_block = 2 * cfg.num_hidden_layers * 16 * cfg.num_key_value_heads * cfg.head_dim * 2  # bf16
    bf16 = load_causal_lm(tiny_llama_dir, dtype="bfloat16", progress=False)
    engine = KVCacheEngine("lm", bf16, "cpu", "bfloat16", KVOptions(kv_bytes=10 * per_block + 5))
    assert engine.stats()["kv_blocks_total"] == 10 and engine.pool.k.dtype == torch.bfloat16
    prompt = _prompt(20, 22)
    engine.submit(firing("a", prompt, outputs=("logits",)))
    (result,) = engine.step()
    with torch.no_grad():
        want = tiny_lm.compute_logits(tiny_lm(torch.tensor(prompt), torch.arange(20), DenseCausalAttention()))[-1]
    torch.testing.assert_close(result.outputs["logits"], want, atol=0.1, rtol=0.05)


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(tiny_lm, hf_lm, monkeypatch):
    engine = _engine(tiny_lm)
    engine.submit(firing("a", _prompt(5, 23)))
    real = engine.runner.execute
    monkeypatch.setattr(engine.runner, "execute", lambda chunks: (_ for _ in ()).throw(RuntimeError("boom")))
    (result,) = engine.step()
    assert result.outputs is None and "boom" in result.error
    assert not engine.has_work() and engine.state_count() == 0 and engine.stats()["kv_blocks_used"] == 0
    monkeypatch.setattr(engine.runner, "execute", real)
    ok = Generation("b", _prompt(6, 24), 4)
    drive(engine, [ok])
    assert ok.tokens == hf_greedy(hf_lm, ok.prompt, 4)


def test_malformed_inputs_never_raise_from_submit(tiny_lm):
    engine = _engine(tiny_lm)
    for inputs in ({"tokens": "abc"}, {"tokens": [1, 2], "embeds": "not a tensor"}, {"tokens": object()}):
        bad = firing("bad", [1])
        bad.inputs = inputs
        engine.submit(bad)
    results = engine.step()
    assert len(results) == 3 and all(r.error for r in results)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_engine_matches_the_cpu_engine(tiny_llama_dir, tiny_lm):
    """float32 on CUDA takes the PyTorch paged path (FlashInfer has no fp32 KV); tokens equal the CPU run's."""
    from walkserve.models.llama.weights import load_causal_lm

    gpu_lm = load_causal_lm(tiny_llama_dir, device="cuda", progress=False)
    prompts = [_prompt(n, 30 + n) for n in (5, 19, 33)]
    cpu = [Generation(f"r{i}", p, 8, join_step=i) for i, p in enumerate(prompts)]
    gpu = [Generation(f"r{i}", p, 8, join_step=i) for i, p in enumerate(prompts)]
    drive(_engine(tiny_lm, max_batch_tokens=16), cpu)
    drive(KVCacheEngine("lm", gpu_lm, "cuda", torch.float32,
                        KVOptions(block_size=16, num_blocks=32, max_batch_tokens=16)), gpu)
    assert [g.tokens for g in gpu] == [g.tokens for g in cpu]


@pytest.mark.gpu
@pytest.mark.skipif(not flashinfer_available(torch.device("cuda"), torch.bfloat16), reason="needs CUDA and flashinfer")
def test_flashinfer_engine_logits_match_the_torch_backend(tmp_path):
    from walkserve.models.llama.tiny import write_tiny
    from walkserve.models.llama.weights import load_causal_lm

    path = write_tiny("llama", tmp_path / "hd64", init_std=0.1, head_dim=64)  # FlashInfer's head dims: multiples of 64
    lm = load_causal_lm(path, device="cuda", dtype="bfloat16", progress=False)
    logits = {}
    for backend in ("flashinfer", "torch"):
        engine = KVCacheEngine("lm", lm, "cuda", "bfloat16",
                               KVOptions(num_blocks=32, max_batch_tokens=16, attention=backend))
        for i, n in enumerate((5, 19, 33)):
            engine.submit(firing(f"r{i}", _prompt(n, 40 + n), outputs=("logits",)))
        got = {}
        while engine.has_work():
            for r in engine.step():
                got[r.firing.request_id] = r.outputs["logits"].float().cpu()
        for i in range(3):  # then one decode each, batched
            engine.submit(firing(f"r{i}", [7], outputs=("logits",)))
        for r in engine.step():
            got[r.firing.request_id + "+1"] = r.outputs["logits"].float().cpu()
        logits[backend] = got
    assert logits["flashinfer"].keys() == logits["torch"].keys() and len(logits["torch"]) == 6
    for key, want in logits["torch"].items():
        torch.testing.assert_close(logits["flashinfer"][key], want, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_greedy_parity_on_qwen(arch, tmp_path):
    transformers = pytest.importorskip("transformers")
    from walkserve.models.llama.tiny import write_tiny
    from walkserve.models.llama.weights import load_causal_lm

    path = write_tiny(arch, tmp_path / arch, init_std=0.1)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    hf.generation_config.eos_token_id = None
    shared = _prompt(9, 50)
    gens = [
        Generation("a", shared + _prompt(4, 51), 8),
        Generation("b", shared + _prompt(13, 52), 8, join_step=2),
        Generation("c", _prompt(6, 53), 8, join_step=3),
    ]
    engine = _engine(load_causal_lm(path, progress=False), num_blocks=12, max_batch_tokens=8)
    drive(engine, gens)
    for g in gens:
        assert g.tokens == hf_greedy(hf, g.prompt, g.max_new), g.request_id
    assert engine.stats()["preemptions"] > 0 and engine.stats()["prefix_hit_tokens"] > 0


def test_prompt_logprobs_are_one_prefill_and_match_transformers(tiny_lm, hf_lm):
    """rows=all + targets: the log-probability of each next prompt token, computed in the prefill's chunks."""
    from walkserve.graph.kv import ALL, append, kv_params

    prompt = _prompt(23, 21)
    engine = _engine(tiny_lm, max_batch_tokens=8)  # the prefill runs as chunks 8 + 8 + 6
    sampling = SamplingParams(temperature=0.0, prompt_logprobs=3)
    f = firing("p", prompt[:-1], outputs=("prompt_logprobs", "prompt_top_logprobs", "prompt_top_logprob_ids"),
               sampling=sampling, targets=torch.tensor(prompt[1:]))
    f.node_params = kv_params(append(rows=ALL))
    steps, results = 0, []
    engine.submit(f)
    while not results:
        results = engine.step()
        steps += 1
    assert steps == 3  # one prefill: as many steps as chunks, not one per token
    out = results[0].outputs
    with torch.no_grad():
        want = torch.log_softmax(hf_lm(torch.tensor([prompt])).logits[0, :-1].float(), -1)  # [N - 1, V]
    targets = torch.tensor(prompt[1:])
    torch.testing.assert_close(out["prompt_logprobs"], want.gather(1, targets[:, None])[:, 0], atol=1e-4, rtol=1e-4)
    top = want.topk(3, dim=-1)
    torch.testing.assert_close(out["prompt_top_logprobs"], top.values, atol=1e-4, rtol=1e-4)
    assert torch.equal(out["prompt_top_logprob_ids"], top.indices)


def test_run_groups_steps_a_cohort_in_one_call_and_equals_transformers(tiny_lm, hf_lm):
    from walkserve.engines.base import Group

    prompts = [_prompt(5 + 3 * i, 30 + i) for i in range(3)]
    engine = _engine(tiny_lm)
    for i, p in enumerate(prompts):  # prefills as ordinary firings
        engine.submit(firing(f"g{i}", p[:-1], outputs=()))
    while engine.has_work():
        engine.step()
    last = [p[-1:] for p in prompts]
    tokens: list[list[int]] = [[] for _ in prompts]
    for k in range(6):
        group = Group("decode", "lm", "lm", "forward", ("token",), {}, [f"g{i}" for i in range(3)],
                      [(k,)] * 3, [{"tokens": torch.tensor(t)} for t in last], [{}] * 3, [GREEDY_ROW] * 3)
        (outs,) = engine.run_groups([group])
        assert all(isinstance(o, dict) for o in outs), outs
        last = [o["token"].tolist() for o in outs]
        for i, t in enumerate(last):
            tokens[i] += t
    for p, got in zip(prompts, tokens):
        assert got == hf_greedy(hf_lm, p, 6)


GREEDY_ROW = SamplingParams(temperature=0.0)


def _prompt_logprob_firing(request_id: str, prompt: list[int]):
    from walkserve.graph.kv import ALL, append, kv_params

    f = firing(request_id, prompt[:-1], outputs=("prompt_logprobs",), sampling=SamplingParams(prompt_logprobs=0),
               targets=torch.tensor(prompt[1:]))
    f.node_params = kv_params(append(rows=ALL))
    return f


def _hf_prompt_logprobs(hf_lm, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        want = torch.log_softmax(hf_lm(torch.tensor([prompt])).logits[0, :-1].float(), -1)  # [N - 1, V]
    return want.gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]


def test_prompt_logprobs_cover_a_prefix_the_cache_holds(tiny_lm, hf_lm):
    """A firing whose rows come out computes them all: the cached prefix blocks are not attached for it."""
    shared = _prompt(16, 22)
    engine = _engine(tiny_lm, max_batch_tokens=8)
    drive(engine, [Generation("warm", shared + _prompt(3, 23), 1)])  # commits the shared prefix's 4 blocks
    prompt = shared + _prompt(7, 24)
    engine.submit(_prompt_logprob_firing("p", prompt))
    results = []
    while not results:
        results = engine.step()
    assert results[0].error is None, results[0].error
    torch.testing.assert_close(results[0].outputs["prompt_logprobs"], _hf_prompt_logprobs(hf_lm, prompt),
                               atol=1e-4, rtol=1e-4)
    assert engine.stats()["prefix_hit_tokens"] == 0
    drive(engine, [Generation("again", shared + _prompt(2, 25), 1)])
    assert engine.stats()["prefix_hit_tokens"] == 16  # a plain prompt still reuses the cached prefix


def test_prompt_logprobs_survive_a_preemption_in_the_middle_of_their_prefill(tiny_lm, hf_lm):
    """Preempted between chunks, the firing restarts whole: its rows come out once each, equal to transformers'."""
    engine = _engine(tiny_lm, num_blocks=6, max_batch_tokens=8, max_running=4)  # 24 tokens of KV
    first = Generation("first", _prompt(15, 26), 8)  # its 16th token needs the block "p" took
    engine.submit(first.first())
    while not first.tokens:
        for result in engine.step():
            engine.submit(first.on_result(result))
    prompt = _prompt(25, 27)
    engine.submit(_prompt_logprob_firing("p", prompt))
    out = None
    for _ in range(400):
        for result in engine.step():
            if result.firing.request_id == "p":
                assert result.error is None, result.error
                out = result.outputs
            else:
                follow = first.on_result(result)
                engine.submit(follow) if follow is not None else engine.release("first")
        if out is not None:
            break
    assert engine.stats()["preemptions"] > 0  # "first" decoded into the blocks "p" held
    assert out is not None
    torch.testing.assert_close(out["prompt_logprobs"], _hf_prompt_logprobs(hf_lm, prompt), atol=1e-4, rtol=1e-4)


def _group(rid: str, tokens: list[int], path: tuple[int, ...] = ()):
    from walkserve.engines.base import Group

    return Group("w", "lm", "lm", "forward", ("token",), {}, [rid], [path], [{"tokens": torch.tensor(tokens)}], [{}],
                 [GREEDY_ROW])


def test_a_long_prefill_yields_between_its_chunks_and_others_step_in_between(tiny_lm, hf_lm):
    """With may_yield, a prefill longer than a step's token budget answers LATER after each chunk; offered again,
    it goes on (it is not submitted twice) and a decode of another request runs in its own call between chunks."""
    from walkserve.engines.base import LATER

    engine = _engine(tiny_lm, max_batch_tokens=16)
    short = _prompt(6, 40)
    (first,) = engine.run_groups([_group("short", short)], may_yield=True)
    assert isinstance(first[0], dict)
    long, answers, decodes = _prompt(50, 41), [], []
    token = first[0]["token"].tolist()
    for k in range(8):
        (answer,) = engine.run_groups([_group("long", long)], may_yield=True)
        answers.append(answer[0])
        if answer[0] is not LATER:
            break
        (decode,) = engine.run_groups([_group("short", token, (k,))], may_yield=True)
        assert isinstance(decode[0], dict)  # another request's decode is answered in one call, between the chunks
        token = decode[0]["token"].tolist()
        decodes += token
    # 50 tokens at most 16 a step: the first call answers LATER; the decodes' steps carry on chunks of it too
    assert answers[0] is LATER and set(answers[:-1]) == {LATER} and isinstance(answers[-1], dict)
    assert answers[-1]["token"].tolist() == hf_greedy(hf_lm, long, 1)
    assert first[0]["token"].tolist() + decodes == hf_greedy(hf_lm, short, 1 + len(decodes))
    stats = engine.stats()
    assert stats["forward_rows.lm"] == len(short) + len(long) + len(decodes)  # no row ran twice
    assert stats["forward_steps"] == 1 + 2 * len(decodes)  # one step per call that had work


def test_without_may_yield_a_long_prefill_is_answered_in_one_call(tiny_lm, hf_lm):
    engine = _engine(tiny_lm, max_batch_tokens=16)
    long = _prompt(50, 41)
    (answer,) = engine.run_groups([_group("long", long)])
    assert answer[0]["token"].tolist() == hf_greedy(hf_lm, long, 1) and engine.stats()["forward_steps"] == 4


def test_run_groups_ranks_the_requests_in_the_order_their_members_came(tiny_lm):
    """The worker orders a group's members least slack first: the engine's steps follow that order, not the
    order the contexts were first made in."""
    from walkserve.engines.base import Group

    engine = _engine(tiny_lm)
    engine.run_groups([_group("a", _prompt(4, 1))])
    engine.run_groups([_group("b", _prompt(4, 2))])
    tokens = [{"tokens": torch.tensor([7])}] * 2
    engine.run_groups([Group("w", "lm", "lm", "forward", ("token",), {}, ["b", "a"], [(1,), (1,)], tokens, [{}, {}],
                             [GREEDY_ROW, GREEDY_ROW])])
    urgency = engine.scheduler.urgency
    assert urgency["b"] < urgency["a"]
    assert engine.scheduler.contexts[("a", "main")].order < engine.scheduler.contexts[("b", "main")].order
    engine.release("b")
    assert "b" not in urgency
