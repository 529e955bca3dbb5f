"""SGLang's and OpenAI's own clients, unmodified, against a real embedded server process (NEXTN,
FP8 head): the sgl frontend (select, gen(choices=), gen(regex=), gen(dtype=int)), lm-eval with
--batch_size 4 on a local multiple-choice task and a local generate task, the openai client (n=2,
penalties, logit_bias, response_format), LangChain's with_structured_output, and the `ollama`
package. tiny-ling's answers are nonsense: the tests check protocol behaviour and constraints, and
compare what the clients got with what single requests (or a direct forward pass) give."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

import httpx
import openai
import pytest

pytestmark = pytest.mark.e2e

torch = pytest.importorskip("torch")

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    from _engine_fixtures import launch_embedded_server

    # compact constrained JSON (SGLang's flag): tiny-ling would pad a JSON answer with whitespace
    running = launch_embedded_server(tmp_path_factory.mktemp("clients"), model_path=tiny_model_dir,
                                     speculative_algorithm="NEXTN", speculative_num_steps=3, speculative_eagle_topk=1,
                                     speculative_num_draft_tokens=4, lm_head_dtype="fp8",
                                     constrained_json_disable_any_whitespace=True)
    yield running
    running.stop()


def _name(server) -> str:
    return httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]


def _openai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def _post(server, path: str, body) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=300)


# -- the sgl frontend --------------------------------------------------------------------------------


def test_the_sgl_frontend_select_choices_regex_and_int(server):
    sgl = pytest.importorskip("sglang")
    from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

    @sgl.function
    def quiz(s):
        s += "Q: Is the cat red? A: " + sgl.select("answer", choices=["yes", "no", "maybe"])
        s += "\nColour: " + sgl.gen("colour", choices=["red", "green", "blue"])
        s += "\nPet: " + sgl.gen("pet", regex=r"(cat|dog|bird)s?", max_tokens=8)
        s += "\nCount: " + sgl.gen("count", dtype=int, max_tokens=8)

    state = quiz.run(backend=RuntimeEndpoint(server.url))
    assert state.error() is None
    assert state["answer"] in ("yes", "no", "maybe") and state["colour"] in ("red", "green", "blue")
    assert re.fullmatch(r"(cat|dog|bird)s?", state["pet"]), state["pet"]
    assert re.fullmatch(r"[-+]?[0-9]+", state["count"].strip()), state["count"]
    # select scored every choice in one batched /generate: the pick is the best normalised
    # logprob, and each choice's logprobs are what a request of its own gets
    meta = state.get_meta_info("answer")
    scores = meta["normalized_prompt_logprobs"]
    assert state["answer"] == ["yes", "no", "maybe"][scores.index(max(scores))]
    prefix = "Q: Is the cat red? A: "
    prompt_len = _post(server, "/generate", {"text": prefix, "sampling_params": {"max_new_tokens": 0}}).json()["meta_info"]["prompt_tokens"]
    for choice, got in zip(["yes", "no", "maybe"], meta["input_token_logprobs"]):
        alone = _post(server, "/generate", {"text": prefix + choice, "return_logprob": True, "logprob_start_len": prompt_len - 2,
                                            "sampling_params": {"max_new_tokens": 0, "temperature": 0}}).json()
        expected = [lp for lp, _, _ in alone["meta_info"]["input_token_logprobs"]][-len(got):]
        assert [lp for lp, _, _ in got] == pytest.approx(expected, abs=TOLERANCE)


# -- lm-eval -------------------------------------------------------------------------------------------

MC_DOCS = [
    {"question": "The cat sat on the", "choices": [" mat", " sky", " river"], "answer": 0},
    {"question": "Once upon a", "choices": [" time", " tree", " box"], "answer": 0},
    {"question": "count: one two", "choices": [" three", " seven", " cat"], "answer": 0},
    {"question": "Tell me a", "choices": [" joke", " river", " four"], "answer": 0},
    {"question": "The king watches a", "choices": [" red box", " blue sky", " tree"], "answer": 0},
    {"question": "1 + 2 =", "choices": [" 3", " 5", " 9"], "answer": 0},
]
GEN_DOCS = [{"question": q, "answer": "x"} for q in ("Once upon a time", "The cat", "count: one two", "Hello", "1 + 1 =", "A bird")]


def _write_tasks(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in MC_DOCS))
    (directory / "gen.jsonl").write_text("".join(json.dumps(d) + "\n" for d in GEN_DOCS))
    (directory / "sparkit_tiny_mc.yaml").write_text(f"""task: sparkit_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {directory / 'mc.jsonl'}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
""")
    (directory / "sparkit_tiny_gen.yaml").write_text(f"""task: sparkit_tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {directory / 'gen.jsonl'}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: answer
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 12
  do_sample: false
metric_list:
  - metric: exact_match
""")


def _samples(out: Path, task: str) -> list[dict]:
    files = sorted(out.rglob(f"samples_{task}_*.jsonl"))
    assert files, f"lm-eval wrote no samples for {task} under {out}"
    return sorted((json.loads(line) for line in files[-1].read_text().splitlines() if line.strip()), key=lambda s: s["doc_id"])


def _arguments(sample: dict) -> list[list]:
    """A logged sample's request arguments: lm-eval writes {"gen_args_0": {"arg_0": ..., ...}, ...}."""
    args = sample["arguments"]
    if isinstance(args, dict):
        return [[group[k] for k in sorted(group)] for _, group in sorted(args.items(), key=lambda kv: int(kv[0].rsplit("_", 1)[1]))]
    return [list(a) for a in args]


def test_lm_eval_with_batch_size_4_on_local_tasks(server, tiny_model_dir, tmp_path):
    pytest.importorskip("lm_eval")
    tasks = tmp_path / "tasks"
    _write_tasks(tasks)
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    argv = [sys.executable, "-m", "lm_eval", "--model", "local-completions",
            "--model_args", f"base_url={server.url}/v1/completions,model={_name(server)},tokenizer={tiny_model_dir},"
                            "tokenizer_backend=huggingface,num_concurrent=1,max_retries=1",
            "--tasks", "sparkit_tiny_mc,sparkit_tiny_gen", "--include_path", str(tasks), "--batch_size", "4",
            "--output_path", str(out), "--log_samples"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, f"lm-eval failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    results = json.loads(sorted(out.rglob("results_*.json"))[-1].read_text())["results"]
    assert 0.0 <= results["sparkit_tiny_mc"]["acc,none"] <= 1.0
    # every loglikelihood lm-eval got back from its batches is the one a request of its own gets: the
    # batch answered each prompt, in order
    client = _openai(server)
    name = _name(server)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    mc = _samples(out, "sparkit_tiny_mc")
    assert len(mc) == len(MC_DOCS)
    for sample in mc:
        for args, resp in zip(_arguments(sample), sample["resps"]):
            context, continuation = args[0], args[1]  # as lm-eval built them (its target delimiter included)
            whole = tok.encode(context + continuation)
            ctxlen = len(tok.encode(context))
            alone = client.completions.create(model=name, prompt=whole, max_tokens=1, logprobs=1, echo=True, temperature=0)
            expected = sum(alone.choices[0].logprobs.token_logprobs[ctxlen:-1])
            assert float(resp[0][0]) == pytest.approx(expected, abs=TOLERANCE), (sample["doc_id"], continuation)
    gen = _samples(out, "sparkit_tiny_gen")
    assert len(gen) == len(GEN_DOCS)
    for sample in gen:
        context = _arguments(sample)[0][0]
        alone = client.completions.create(model=name, prompt=context, max_tokens=12, temperature=0, stop=["\n"])
        assert sample["resps"][0][0] == alone.choices[0].text, sample["doc_id"]


# -- the openai client -------------------------------------------------------------------------------


def test_openai_n_2_on_chat_and_completions_streamed_and_not(server):
    client = _openai(server)
    name = _name(server)
    messages = [{"role": "user", "content": "Tell me a sentence."}]
    chat = client.chat.completions.create(model=name, messages=messages, n=2, temperature=1.0, max_tokens=16, seed=4)
    assert [c.index for c in chat.choices] == [0, 1] and chat.choices[0].message.content != chat.choices[1].message.content
    streamed = {0: "", 1: ""}
    for chunk in client.chat.completions.create(model=name, messages=messages, n=2, temperature=1.0, max_tokens=16, seed=4,
                                                stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert [streamed[0], streamed[1]] == [c.message.content for c in chat.choices]
    completion = client.completions.create(model=name, prompt=["Once upon a time", "The cat"], n=2, max_tokens=8,
                                           temperature=0)
    texts = [c.text for c in completion.choices]
    assert len(texts) == 4 and texts[0] == texts[1] and texts[2] == texts[3]  # greedy: each prompt's two samples agree
    assert texts[0] == client.completions.create(model=name, prompt="Once upon a time", max_tokens=8, temperature=0).choices[0].text


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """The target the server runs (FP8 head), as a direct forward pass (no KV cache, no draft)."""
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig

    torch.set_num_threads(1)
    return EmbeddedEngine(EngineConfig(model_path=str(tiny_model_dir), device="cpu", lm_head_dtype="fp8"))


def _penalised_greedy(engine, ids: list[int], steps: int, frequency: float, presence: float, bias: dict[int, float]) -> list[int]:
    out: list[int] = []
    for _ in range(steps):
        with torch.inference_mode():
            logits = engine.model.logits(engine.model.forward_hidden(torch.tensor([ids + out])))[0, -1, : engine.vocab_limit].float()
        counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=logits.shape[0]).float() if out else torch.zeros_like(logits)
        logits = logits - frequency * counts - presence * (counts > 0).float()
        for token, value in bias.items():
            logits[token] += value
        out.append(int(logits.argmax()))
    return out


def test_openai_penalties_and_logit_bias_equal_a_direct_computation(server, reference):
    client = _openai(server)
    prompt = "count: one two three"
    bias = {ord("o"): -100.0}
    got = client.completions.create(model=_name(server), prompt=prompt, max_tokens=24, temperature=0, frequency_penalty=0.6,
                                    presence_penalty=0.4, logit_bias={str(k): v for k, v in bias.items()},
                                    extra_body={"ignore_eos": True})
    ids = reference.tokenizer.encode(prompt, add_special_tokens=False)
    expected = _penalised_greedy(reference, ids, 24, 0.6, 0.4, bias)
    assert got.choices[0].text == reference.tokenizer.decode(expected, skip_special_tokens=True) and "o" not in got.choices[0].text
    plain = client.completions.create(model=_name(server), prompt=prompt, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    assert plain.choices[0].text != got.choices[0].text


def test_openai_response_format_json_schema_and_json_object(server):
    client = _openai(server)
    schema = {"type": "object", "properties": {"mood": {"enum": ["calm", "wild"]}, "size": {"enum": ["big", "small"]}},
              "required": ["mood", "size"], "additionalProperties": False}
    for seed in range(4):
        reply = client.chat.completions.create(model=_name(server), messages=[{"role": "user", "content": "Describe it."}],
                                               temperature=1.0, seed=seed, max_tokens=60,
                                               response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}})
        value = json.loads(reply.choices[0].message.content)
        assert reply.choices[0].finish_reason == "stop" and set(value) == {"mood", "size"}
        assert value["mood"] in ("calm", "wild") and value["size"] in ("big", "small")
    loose = client.chat.completions.create(model=_name(server), messages=[{"role": "user", "content": "JSON please"}],
                                           temperature=0, max_tokens=80, response_format={"type": "json_object"})
    text = loose.choices[0].message.content
    assert text.startswith("{")
    if loose.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    with pytest.raises(openai.BadRequestError, match="Failed to compile json grammar"):
        client.chat.completions.create(model=_name(server), messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                       response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "nope"}}})


# -- LangChain ---------------------------------------------------------------------------------------------


def test_langchain_with_structured_output(server):
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel

    class Verdict(BaseModel):
        answer: Literal["yes", "no"]
        confidence: Literal["low", "high"]

    llm = ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model=_name(server), temperature=0, max_tokens=60,
                     max_retries=0)
    verdict = llm.with_structured_output(Verdict).invoke("Is the sky green?")
    assert isinstance(verdict, Verdict) and verdict.answer in ("yes", "no") and verdict.confidence in ("low", "high")
    raw = llm.with_structured_output(Verdict, include_raw=True).invoke("Is the cat red?")
    assert raw["parsing_error"] is None and isinstance(raw["parsed"], Verdict)


# -- Ollama ------------------------------------------------------------------------------------------------


def test_the_ollama_package(server):
    ollama = pytest.importorskip("ollama")
    client = ollama.Client(host=server.url)
    name = _name(server)
    assert [m.model for m in client.list().models] == [name]
    show = client.show(name)
    assert show.modelinfo[f"{name}.context_length"] == 2048 and "completion" in show.capabilities
    options = {"num_predict": 12, "temperature": 0}
    whole = client.generate(model=name, prompt="Once upon a time", options=options)
    same = _post(server, "/generate", {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 12, "temperature": 0}}).json()
    assert whole.done and whole.response == same["text"] and whole.eval_count == same["meta_info"]["completion_tokens"]
    messages = [{"role": "user", "content": "Hello"}]
    reply = client.chat(model=name, messages=messages, options=options)
    parts = list(client.chat(model=name, messages=messages, options=options, stream=True))
    assert parts[-1].done and "".join(p.message.content for p in parts) == reply.message.content
    with pytest.raises(ollama.ResponseError) as info:
        client.generate(model=name, prompt="hi")  # SGLang's num_predict default (2048) does not fit the context
    assert info.value.status_code == 400 and "options.num_predict" in str(info.value)


def test_the_ollama_package_sees_what_ollama_would_say(server):
    """Issue 37, item 4: what an Ollama front-end reads, through the `ollama` client itself."""
    ollama = pytest.importorskip("ollama")
    client = ollama.Client(host=server.url)
    name = _name(server)
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="llama3.2", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2})
    assert info.value.status_code == 404 and 'model "llama3.2" not found' in info.value.error
    parts = list(client.chat(model=name, messages=[{"role": "user", "content": "Hello"}], stream=True,
                             options={"num_predict": 6, "temperature": 0}))
    last = parts[-1]
    assert last.done and last.done_reason == "length" and last.eval_count == 6  # num_predict cut it
    assert last.eval_duration > 0 and last.prompt_eval_count > 0 and last.prompt_eval_duration > 0
    assert last.eval_count / (last.eval_duration / 1e9) > 0  # the tok/s a front-end shows
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}
    shaped = client.generate(model=name, prompt="Answer:", format=schema, options={"num_predict": 40, "temperature": 0})
    assert shaped.done_reason == "stop" and json.loads(shaped.response)["answer"] in ("yes", "no")
    seeded = [client.generate(model=name, prompt="Once upon a time", options={"num_predict": 16, "temperature": 1.0,
                                                                              "seed": seed}).response for seed in (5, 5, 6)]
    assert seeded[0] == seeded[1] and len(seeded[0]) > 0
    assert [m.model for m in client.ps().models] == [name]
    assert httpx.get(server.url + "/api/version", timeout=30).json()["version"]


# -- a batch's prompts run side by side up to --max-running-requests; the server goes on answering ---------


def test_health_answers_while_a_batch_runs_and_a_batch_is_aborted_or_cancelled_whole(start_embedded_server):
    from sparkit.client import parse_prometheus

    # >= 20 ms a step: each prompt takes >= 8 s; two decode together, two wait
    server = start_embedded_server(debug_step_delay_ms=20, max_running_requests=2)
    metrics = lambda: parse_prometheus(httpx.get(server.url + "/metrics", timeout=30).text)  # noqa: E731
    before = metrics()
    body = {"text": ["one", "two", "three", "four"], "stream": True, "rid": "hold",
            "sampling_params": {"max_new_tokens": 400, "ignore_eos": True, "temperature": 0}}
    with httpx.stream("POST", server.url + "/generate", json=body, timeout=120) as response:
        chunks = (json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:") and "[DONE]" not in line)
        first = next(chunks)
        assert first["index"] == 0 and first["meta_info"]["finish_reason"] is None
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200
        assert httpx.get(server.url + "/ping", timeout=30).status_code == 200
        during = metrics()
        assert during["sglang:num_running_reqs"] == 2 and during["sglang:num_queue_reqs"] == 2  # the rest wait their turn
        assert httpx.post(server.url + "/abort_request", json={"rid": "hold"}, timeout=30).status_code == 200
        finals = [c for c in chunks if c["meta_info"]["finish_reason"] is not None]
    assert [c["index"] for c in finals] == [0, 1, 2, 3]  # a batch's rid aborts its items: hold_0 .. hold_3
    assert all(c["meta_info"]["finish_reason"]["type"] == "abort" for c in finals)
    # a client that leaves a streamed batch cancels all of it
    with httpx.stream("POST", server.url + "/generate", json={**body, "rid": "gone"}, timeout=120) as response:
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        lines.close()
    deadline = time.monotonic() + 120
    while (metrics()["sglang:num_queue_reqs"], metrics()["sglang:num_running_reqs"]) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    after = metrics()
    assert after["sglang:num_aborted_requests_total"] - before["sglang:num_aborted_requests_total"] == 8
    assert after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"] < 400
