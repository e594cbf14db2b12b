"""Prompt logprobs on /v1/completions (echo + logprobs, OpenAI's legacy format) and lm-evaluation-harness against them.

One server per module: a tiny random-weight Llama on the real runtime. The
prompt's log-probabilities are checked against transformers' log_softmax on
the same checkpoint; lm-eval's ``local-completions`` model then scores a
loglikelihood task and a generate_until task defined here from local files.
"""

from __future__ import annotations

import json
import textwrap

import httpx
import pytest
import torch

from tests.api.real_server import in_thread_server
from walkserve.core.config import RuntimeConfig
from walkserve.models.llama.tiny import write_tiny

pytestmark = pytest.mark.slow
PROMPT = "The river flows past the old mill"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny("llama", tmp_path_factory.mktemp("plp") / "tiny-llama", seed=5, init_std=0.1)


@pytest.fixture(scope="module")
def server(checkpoint):
    with in_thread_server("llama", checkpoint, RuntimeConfig(max_running=8)) as s:
        yield s


@pytest.fixture(scope="module")
def oracle(checkpoint):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    return model, tokenizer


def _completion(server, **body) -> dict:
    body = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 3, "temperature": 0, **body}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_echo_with_logprobs_returns_the_prompt_logprobs_of_transformers(server, oracle):
    model, tokenizer = oracle
    ids = tokenizer(PROMPT).input_ids
    with torch.no_grad():
        want = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)  # [N, V]
    choice = _completion(server, echo=True, logprobs=2)["choices"][0]
    lp = choice["logprobs"]
    n = len(ids)
    assert choice["text"].startswith(PROMPT)
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n + 3
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing precedes the first token
    for i in range(1, n):
        assert abs(lp["token_logprobs"][i] - float(want[i - 1, ids[i]])) <= 1e-4, i
        top = sorted(lp["top_logprobs"][i].values(), reverse=True)
        torch.testing.assert_close(torch.tensor(top), want[i - 1].topk(2).values, atol=1e-4, rtol=1e-4)
    assert lp["text_offset"][0] == 0 and lp["text_offset"][n] == len(PROMPT)
    greedy = int(want[-1].argmax())  # the first generated token continues from the prompt's last row
    assert lp["token_logprobs"][n] == pytest.approx(float(want[-1, greedy]), abs=1e-4)


def test_streamed_echo_logprobs_equal_the_collected_ones(server):
    whole = _completion(server, echo=True, logprobs=1)["choices"][0]["logprobs"]
    body = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 1,
            "stream": True}
    tokens, values = [], []
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                lp = json.loads(line[6:])["choices"][0]["logprobs"] if json.loads(line[6:])["choices"] else None
                if lp:
                    tokens += lp["tokens"]
                    values += lp["token_logprobs"]
    assert tokens == whole["tokens"]
    assert values[0] is None and values[1:] == pytest.approx(whole["token_logprobs"][1:], abs=1e-6)


def test_text_offsets_point_into_the_text_past_special_tokens(server, oracle):
    """A special token the text does not show (the prompt's BOS; generated ones, with skip_special_tokens) takes
    no room: every text_offset is where its token's text starts in the choice's text, streamed or not."""
    _, tokenizer = oracle
    header = "<|start_header_id|>"
    body = {"echo": True, "logprobs": 0, "max_tokens": 3, "ignore_eos": True,
            "logit_bias": {str(tokenizer.convert_tokens_to_ids(header)): 100}}
    choice = _completion(server, **body)["choices"][0]
    lp = choice["logprobs"]
    assert lp["tokens"][0] == tokenizer.bos_token and lp["tokens"][-3:] == [header] * 3
    assert choice["text"] == PROMPT  # neither shows in the text
    assert [choice["text"][o:].startswith(t) for t, o in zip(lp["tokens"][1:-3], lp["text_offset"][1:-3])] == [True] * (
        len(lp["tokens"]) - 4)
    assert lp["text_offset"][0] == 0 and lp["text_offset"][-3:] == [len(PROMPT)] * 3
    offsets = []
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                      json={"model": "tiny-llama", "prompt": PROMPT, "temperature": 0, "stream": True, **body}) as r:
        for line in r.iter_lines():
            chunk = json.loads(line[6:]) if line.startswith("data: {") else None
            if chunk and chunk["choices"] and chunk["choices"][0]["logprobs"]:
                offsets += chunk["choices"][0]["logprobs"]["text_offset"]
    assert offsets == lp["text_offset"]


def _oracle_logprobs(oracle, text: str) -> tuple[list[int], torch.Tensor]:
    model, tokenizer = oracle
    ids = tokenizer(text).input_ids
    with torch.no_grad():
        return ids, torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)  # [N, V]


def test_prompt_logprobs_cover_every_prompt_token_when_the_prefix_is_cached(server, oracle):
    context = "Once upon a time in a quiet village by the sea there lived an old fisherman who"
    first, second = context + " sang every morning", context + " counted the boats at dusk"
    _completion(server, prompt=first, max_tokens=1)  # caches the shared context's full blocks
    for text in (first, second):
        ids, want = _oracle_logprobs(oracle, text)
        assert len(ids) > 32  # more than two KV blocks: the shared context fills at least one
        lp = _completion(server, prompt=text, max_tokens=1, echo=True, logprobs=1)["choices"][0]["logprobs"]
        assert len(lp["token_logprobs"]) == len(ids) + 1, text  # every prompt token, then the generated one
        assert lp["token_logprobs"][0] is None
        got = torch.tensor(lp["token_logprobs"][1 : len(ids)])
        torch.testing.assert_close(got, want[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0], atol=1e-4, rtol=0)

MULTIPLE_CHOICE = """
    task: {name}
    dataset_path: json
    dataset_kwargs:
      data_files:
        test: {{data}}
    test_split: test
    output_type: multiple_choice
    doc_to_text: "{{{{{{{{question}}}}}}}}"
    doc_to_choice: choices
    doc_to_target: label
    metric_list:
      - metric: acc
"""
TASKS = {
    "tiny_ll": MULTIPLE_CHOICE.format(name="tiny_ll"),
    "tiny_gen": """
        task: tiny_gen
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {data}
        test_split: test
        output_type: generate_until
        doc_to_text: "{{{{question}}}}"
        doc_to_target: "{{{{answer}}}}"
        generation_kwargs:
          until: ["\\n"]
          max_gen_toks: 4
          do_sample: false
        metric_list:
          - metric: exact_match
    """,
    "tiny_mc": MULTIPLE_CHOICE.format(name="tiny_mc"),
}
STORY = ("In the old harbour town the fishermen woke before the sun, mended their nets by lamplight and argued "
         "about the weather while the gulls circled over the quiet grey water. The question is:")
DOCS = {
    "tiny_mc": [{"question": STORY + " what did the fishermen mend?", "choices": [" nets", " boats", " roofs"], "label": 0},
                {"question": STORY + " what circled over the water?", "choices": [" gulls", " clouds"], "label": 0},
                {"question": STORY + " when did they wake?", "choices": [" at noon", " before the sun", " late"],
                 "label": 1}],
    "tiny_ll": [{"question": "Water is", "choices": [" wet", " dry"], "label": 0},
                {"question": "The sky is", "choices": [" blue", " green", " loud"], "label": 0},
                {"question": "Fire is", "choices": [" cold", " hot"], "label": 1}],
    "tiny_gen": [{"question": "One two", "answer": " three"}, {"question": "A B", "answer": " C"}],
}


def test_lm_eval_harness_scores_a_loglikelihood_and_a_generate_until_task(server, checkpoint, tmp_path, monkeypatch):
    import lm_eval
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _write_tasks(tmp_path, ["tiny_ll", "tiny_gen"])
    model_args = (f"base_url={server.url}/v1/completions,model=tiny-llama,tokenizer={checkpoint},"
                  "tokenizer_backend=huggingface,tokenized_requests=True,max_retries=1,num_concurrent=2")
    out = lm_eval.simple_evaluate(model="local-completions", model_args=model_args, tasks=["tiny_ll", "tiny_gen"],
                                  task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
                                  cache_requests=False,
                                  log_samples=False, verbosity="WARNING")
    results = out["results"]
    acc, match = results["tiny_ll"]["acc,none"], results["tiny_gen"]["exact_match,none"]
    assert 0.0 <= acc <= 1.0 and 0.0 <= match <= 1.0  # the harness parsed a score from each kind of request
    samples = out.get("n-samples", {})
    assert samples.get("tiny_ll", {}).get("effective", 3) == 3


def _write_tasks(tmp_path, names):
    for name in names:
        data = tmp_path / f"{name}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in DOCS[name]))
        (tmp_path / f"{name}.yaml").write_text(textwrap.dedent(TASKS[name]).format(data=data))


def test_lm_eval_multiple_choice_scores_each_choice_from_every_prompt_logprob(server, checkpoint, oracle, tmp_path,
                                                                            monkeypatch):
    """Every choice repeats its document's long context, so from the second choice on the context's blocks are
    cached: each choice's loglikelihood (and so the accuracy) must still be transformers' sum over its tokens."""
    import lm_eval
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _write_tasks(tmp_path, ["tiny_mc"])
    lm = get_model("local-completions").create_from_arg_string(
        f"base_url={server.url}/v1/completions,model=tiny-llama,tokenizer={checkpoint},"
        "tokenizer_backend=huggingface,tokenized_requests=True,max_retries=1,num_concurrent=1")
    out = lm_eval.simple_evaluate(model=lm, tasks=["tiny_mc"], cache_requests=False, log_samples=True,
                                  task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
                                  verbosity="WARNING")
    model = oracle[0]
    hits = []
    for sample in out["samples"]["tiny_mc"]:
        doc, got = sample["doc"], [r[0][0] for r in sample["resps"]]
        want = []
        for context_text, continuation_text in sample["arguments"]:  # (the document, delimiter + one choice)
            context, continuation = lm._encode_pair(context_text, continuation_text)
            with torch.no_grad():
                logits = model(torch.tensor([context + continuation])).logits[0].float()
            lp = torch.log_softmax(logits, -1)[len(context) - 1 : -1]  # [len(continuation), V]
            want.append(float(lp.gather(1, torch.tensor(continuation)[:, None]).sum()))
            assert len(context) > 32  # the context fills whole KV blocks the next choice finds cached
        assert got == pytest.approx(want, abs=1e-3), doc["question"]
        hits.append(max(range(len(want)), key=want.__getitem__) == doc["label"])
    assert out["results"]["tiny_mc"]["acc,none"] == pytest.approx(sum(hits) / len(hits))


def test_an_unknown_or_bad_request_parameter_is_a_400_naming_it(server):
    body = {"inputs": {"prompt": PROMPT}, "modalities": ["text"], "params": {"bogus": 1}}
    r = httpx.post(f"{server.url}/v1/generate", json=body, timeout=60)
    assert r.status_code == 400 and "bogus" in r.text, r.text
    body["params"] = {"add_generation_prompt": "maybe"}
    r = httpx.post(f"{server.url}/v1/generate", json=body, timeout=60)
    assert r.status_code == 400 and "add_generation_prompt" in r.text, r.text


def test_node_sampling_applies_per_node_and_an_unknown_node_is_refused(server):
    from walkserve.core.errors import InvalidRequest
    from walkserve.core.sampling import SamplingParams

    processor = server.engine.processor
    base = SamplingParams(temperature=1.0, max_tokens=6, seed=3, ignore_eos=True)

    def tokens(spec):
        events, finished = server.run_direct(spec)
        assert finished.error is None
        return [t for e in events if e.modality == "text" for t in (e.data.tolist() if hasattr(e.data, "tolist") else e.data)]

    spec = processor.build_request("completion", {"prompt": PROMPT}, base, processor.check_params({}))
    sampled = tokens(spec)
    spec = processor.build_request("completion", {"prompt": PROMPT}, base, processor.check_params({}))
    spec.node_sampling = {"lm": SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)}
    greedy = tokens(spec)
    spec = processor.build_request("completion", {"prompt": PROMPT}, SamplingParams(temperature=0.0, max_tokens=6,
                                                                                    ignore_eos=True), processor.check_params({}))
    assert greedy == tokens(spec) != sampled  # the lm node sampled with its own (greedy) params
    spec.node_sampling = {"talker": SamplingParams()}
    with pytest.raises(InvalidRequest, match="talker"):
        server.run_direct(spec)
