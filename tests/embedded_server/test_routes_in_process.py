"""The embedded server's routes served in this process through the client's transport seam
(httpx.ASGITransport): the same app, engine and worker thread a real server runs, without a
port or a process (tests/e2e keeps the ones that start real servers)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from sparkit.client import EngineClient
from sparkit.engines.embedded.routes import create_app
from sparkit.engines.embedded.server import build_server
from sparkit.errors import EngineError


@pytest.fixture(scope="module")
def in_process(tiny_model_dir, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("SPARKIT_REPORT_DIR", str(tmp_path_factory.mktemp("reports")))
    state = build_server(["--model-path", str(tiny_model_dir), "--device", "cpu", "--torch-threads", "1",
                          "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                          "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
                          "--lm-head-dtype", "fp8"])
    state.worker.start()
    for _ in range(6000):  # loads and warms up in its thread; bounded by steps, not by a clock
        if state.worker.state in ("ready", "failed"):
            break
        time.sleep(0.05)
    assert state.worker.state == "ready"

    async def never_gone() -> bool:
        return False

    # the grammar pool's forkserver imports xgrammar (and torch) once: here, not in the first test that
    # compiles a grammar (a server pays it at its first grammar request)
    asyncio.run(state.grammar_pool().compile("regex", "warm", never_gone))
    yield state, create_app(state)
    state.close_grammar_pool()
    state.worker.stop()
    state.worker.thread.join(timeout=10)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def client(app) -> EngineClient:
    return EngineClient("http://in-process", transport=httpx.ASGITransport(app=app))


def test_generate_and_server_info_through_the_transport_seam(in_process):
    state, app = in_process

    async def go():
        async with client(app) as c:
            assert await c.health()
            info = await c.server_info()
            out = await c.generate("count: one two", sampling_params={"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True})
            metrics = await c.metrics()
            return info, out, metrics

    info, out, metrics = asyncio.run(go())
    assert info["speculative_algorithm"] == "NEXTN" and info["speculative_num_draft_tokens"] == 4
    assert info["lm_head_dtype"] == "fp8" and info["moe_runner_backend"] == "embedded-torch"
    assert out.completion_tokens == 8 and out.text
    assert out.accept_length is not None and out.accept_length >= 1.0
    assert metrics["sglang:generation_tokens_total"] >= 8


def test_an_unknown_model_is_the_openai_shaped_404(in_process):
    _, app = in_process

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://in-process") as http:
            return await http.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]})

    response = asyncio.run(go())
    assert response.status_code == 404
    body = response.json()  # SGLang's flat ErrorResponse
    assert body["object"] == "error" and body["param"] == "model" and "tiny-ling" in body["message"] and body["code"] == 404


def test_the_client_reports_an_engine_error_as_such(in_process):
    _, app = in_process

    async def go():
        async with client(app) as c:
            await c.generate("x" * 5000, sampling_params={"max_new_tokens": 1})

    with pytest.raises(EngineError) as info:
        asyncio.run(go())
    assert "context length" in str(info.value)


# -- SGLang's surface: batches, n, sampling fields, constraints, shapes and routes (issue 28) -------------


def call(app, method: str, path: str, body=None, **kw) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://in-process", timeout=300) as http:
            return await http.request(method, path, json=body, **kw)

    return asyncio.run(go())


def sse(response: httpx.Response) -> list:
    import json

    return [json.loads(line[5:]) for line in response.text.splitlines()
            if line.startswith("data:") and line.strip() != "data: [DONE]"]


GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


def test_a_generate_batch_is_answered_in_order_with_each_prompts_own_meta_info(in_process):
    _, app = in_process
    texts = ["count: one two", "Once upon a time", "The cat"]
    singles = [call(app, "POST", "/generate", {"text": t, "sampling_params": GREEDY}).json() for t in texts]
    batch = call(app, "POST", "/generate", {"text": texts, "sampling_params": GREEDY, "rid": "b"})
    assert batch.status_code == 200, batch.text
    out = batch.json()
    assert isinstance(out, list) and [o["text"] for o in out] == [s["text"] for s in singles]
    assert [o["meta_info"]["id"] for o in out] == ["b_0", "b_1", "b_2"]  # SGLang: a rid string becomes rid_i
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [s["meta_info"]["prompt_tokens"] for s in singles]
    assert all(o["meta_info"]["spec_verify_ct"] >= 1 for o in out)  # each item decoded under NEXTN
    one = call(app, "POST", "/generate", {"input_ids": [list(b"The cat")], "sampling_params": GREEDY}).json()
    assert isinstance(one, list) and one[0]["text"] == singles[2]["text"]  # a one-item batch is still a list, as SGLang's


def test_per_item_sampling_params_and_logprob_fields(in_process):
    _, app = in_process
    body = {"text": ["ab", "cd"], "sampling_params": [{**GREEDY, "max_new_tokens": 3}, {**GREEDY, "max_new_tokens": 5}],
            "return_logprob": [True, False], "logprob_start_len": [0, -1]}
    out = call(app, "POST", "/generate", body).json()
    assert [o["meta_info"]["completion_tokens"] for o in out] == [3, 5]
    assert len(out[0]["meta_info"]["input_token_logprobs"]) == 2 and "input_token_logprobs" not in out[1]["meta_info"]


def test_n_samples_of_a_prompt_differ_and_a_seed_reproduces_them(in_process):
    _, app = in_process
    body = {"text": "Once upon a time", "sampling_params": {"n": 3, "temperature": 1.0, "max_new_tokens": 16,
                                                             "ignore_eos": True, "sampling_seed": 11}}
    first = call(app, "POST", "/generate", body).json()
    assert isinstance(first, list) and len(first) == 3
    texts = [o["text"] for o in first]
    assert len(set(texts)) > 1  # n samples, not n copies of one
    assert [o["text"] for o in call(app, "POST", "/generate", body).json()] == texts
    assert len({o["meta_info"]["id"] for o in first}) == 3


def test_a_streamed_batch_indexes_its_chunks_and_ends_each_item(in_process):
    _, app = in_process
    response = call(app, "POST", "/generate", {"text": ["count: one", "The cat"], "stream": True, "sampling_params": GREEDY})
    chunks = sse(response)
    assert {c["index"] for c in chunks} == {0, 1}
    finals = [c for c in chunks if c["meta_info"]["finish_reason"] is not None]
    assert [c["index"] for c in finals] == [0, 1] and all(c["meta_info"]["completion_tokens"] == 12 for c in finals)
    whole = call(app, "POST", "/generate", {"text": ["count: one", "The cat"], "sampling_params": GREEDY}).json()
    assert [c["text"] for c in finals] == [w["text"] for w in whole]


def test_a_matched_stop_token_is_trimmed_from_the_text_unless_no_stop_trim(in_process):
    state, app = in_process
    decode = lambda ids: state.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    full = call(app, "POST", "/generate", {"text": "Once upon a time", "sampling_params": {**GREEDY, "max_new_tokens": 30}}).json()
    stop_id = next(t for t in full["output_ids"][3:] if t < 256)  # a byte token: it shows in the text
    cut = call(app, "POST", "/generate", {"text": "Once upon a time", "sampling_params": {**GREEDY, "max_new_tokens": 30,
                                                                                          "stop_token_ids": [stop_id]}}).json()
    n = cut["meta_info"]["completion_tokens"]
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id} and cut["output_ids"][-1] == stop_id
    assert cut["text"] == decode(cut["output_ids"][:-1]) != decode(cut["output_ids"])  # SGLang's trim_matched_stop
    kept = call(app, "POST", "/generate", {"text": "Once upon a time", "sampling_params": {
        **GREEDY, "max_new_tokens": 30, "stop_token_ids": [stop_id], "no_stop_trim": True}}).json()
    assert kept["text"] == decode(kept["output_ids"]) and kept["meta_info"]["completion_tokens"] == n


def test_chat_n_gives_n_choices_and_counts_the_prompt_once(in_process):
    _, app = in_process
    body = {"messages": [{"role": "user", "content": "Hello"}], "n": 2, "temperature": 1.0, "max_tokens": 10, "seed": 3}
    out = call(app, "POST", "/v1/chat/completions", body).json()
    assert [c["index"] for c in out["choices"]] == [0, 1]
    single = call(app, "POST", "/v1/chat/completions", {**body, "n": 1}).json()
    assert out["usage"]["prompt_tokens"] == single["usage"]["prompt_tokens"]
    assert out["usage"]["completion_tokens"] == sum(len(c["message"]["content"].encode()) + (c["finish_reason"] == "stop")
                                                    for c in out["choices"])
    streamed = sse(call(app, "POST", "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}))
    text = {0: "", 1: ""}
    for chunk in streamed:
        for choice in chunk["choices"]:
            text[choice["index"]] += choice["delta"].get("content") or ""
    assert [text[0], text[1]] == [c["message"]["content"] for c in out["choices"]]
    finishes = [c for c in streamed if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["index"] for c in finishes] == [0, 1] and streamed.index(finishes[0]) > len(streamed) - 4
    assert streamed[-1]["usage"] == out["usage"]


def test_a_completions_batch_with_echo_and_logprobs_as_lm_eval_sends_it(in_process):
    state, app = in_process
    prompts = [list(b"The cat sat"), list(b"Once upon")]
    out = call(app, "POST", "/v1/completions", {"prompt": prompts, "max_tokens": 1, "logprobs": 1, "echo": True,
                                                "temperature": 0}).json()
    assert [c["index"] for c in out["choices"]] == [0, 1]
    for choice, ids in zip(out["choices"], prompts):
        assert choice["text"].startswith(bytes(ids).decode())
        assert len(choice["logprobs"]["token_logprobs"]) == len(ids) + 1 and choice["logprobs"]["token_logprobs"][0] is None
    assert out["usage"]["prompt_tokens"] == sum(map(len, prompts))


def test_grammar_fields_constrain_and_a_bad_grammar_is_a_400_before_any_work(in_process):
    import json
    import re

    _, app = in_process
    out = call(app, "POST", "/generate", {"text": "Answer:", "sampling_params": {"temperature": 1.0, "max_new_tokens": 16,
                                                                                  "regex": "(yes|no)!", "n": 4}}).json()
    assert all(re.fullmatch("(yes|no)!", o["text"]) for o in out)
    chat = call(app, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Pick"}], "max_tokens": 20,
                                                      "response_format": {"type": "json_schema", "json_schema": {
                                                          "name": "p", "schema": {"enum": ["calm", "wild"]}}}}).json()
    assert json.loads(chat["choices"][0]["message"]["content"]) in ("calm", "wild")
    streamed = sse(call(app, "POST", "/generate", {"text": "Answer:", "stream": True, "sampling_params": {
        "temperature": 1.0, "max_new_tokens": 16, "regex": "(yes|no)!", "n": 4, "sampling_seed": 2}}))
    whole = call(app, "POST", "/generate", {"text": "Answer:", "sampling_params": {
        "temperature": 1.0, "max_new_tokens": 16, "regex": "(yes|no)!", "n": 4, "sampling_seed": 2}}).json()
    assert [c["text"] for c in streamed if c["meta_info"]["finish_reason"]] == [o["text"] for o in whole]
    bad = call(app, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "regex": "(oops"})
    assert bad.status_code == 400 and bad.json()["object"] == "error"
    assert bad.json()["message"].startswith("Failed to compile regex grammar") and bad.json()["param"] == "regex"
    nested = call(app, "POST", "/generate", {"text": "x", "sampling_params": {"json_schema": "{nope"}})
    assert nested.status_code == 400 and "Failed to compile json grammar" in nested.json()["error"]["message"]


def test_the_small_sglang_routes(in_process):
    _, app = in_process
    assert call(app, "GET", "/").json() == "SGLang is running"
    assert call(app, "HEAD", "/").status_code == 200
    assert call(app, "GET", "/ping").status_code == 200
    refused = call(app, "POST", "/v1/embeddings", {"input": "hi", "model": "tiny-ling"})
    assert refused.status_code == 400 and "does not appear to be an embedding model" in refused.json()["message"]
    metrics = call(app, "GET", "/metrics").text
    assert 'sglang:num_running_reqs{model_name="tiny-ling-s0",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"}' in metrics
    assert 'sglang:num_requests_total{model_name="tiny-ling-s0",engine_type="unified",is_streaming="false"}' in metrics


def test_ollama_routes_as_sglang_serves_them(in_process):
    import json

    _, app = in_process
    tags = call(app, "GET", "/api/tags").json()
    assert tags["models"][0]["name"] == "tiny-ling-s0" and tags["models"][0]["details"]["format"] == "sglang"
    show = call(app, "POST", "/api/show", {"model": "tiny-ling-s0"}).json()
    assert show["model_info"]["tiny-ling-s0.context_length"] == 2048 and show["capabilities"] == ["completion"]
    reply = call(app, "POST", "/api/generate", {"model": "tiny-ling-s0", "prompt": "Once upon a time", "stream": False,
                                                "options": {"num_predict": 8, "temperature": 0, "num_ctx": 4096}})
    same = call(app, "POST", "/generate", {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}).json()
    assert reply.status_code == 200 and reply.json()["done"] and reply.json()["response"] == same["text"]
    assert reply.json()["eval_count"] == same["meta_info"]["completion_tokens"] <= 8
    assert reply.headers["x-sparkit-ignored-fields"] == "options.num_ctx"  # SGLang ignores options it does not map
    lines = [json.loads(x) for x in call(app, "POST", "/api/chat", {"model": "tiny-ling-s0:latest", "messages": [
        {"role": "user", "content": "Hello"}], "options": {"num_predict": 12, "temperature": 0}}).text.splitlines()]
    assert lines[-1]["done"] and all(not x["done"] for x in lines[:-1])
    whole = call(app, "POST", "/api/chat", {"model": "tiny-ling-s0", "messages": [{"role": "user", "content": "Hello"}],
                                            "stream": False, "options": {"num_predict": 12, "temperature": 0}}).json()
    assert "".join(x["message"]["content"] for x in lines) == whole["message"]["content"]
    default = call(app, "POST", "/api/generate", {"model": "tiny-ling-s0", "prompt": "hi", "stream": False})
    assert default.status_code == 400 and "options.num_predict" in default.json()["message"]  # SGLang's 2048 > the context
    empty = call(app, "POST", "/api/generate", {"model": "tiny-ling-s0", "prompt": "", "stream": False}).json()
    assert empty["done"] and empty["response"] == ""


def test_ollama_as_ollama_answers(in_process):
    """Issue 37, item 4: what SGLang's Ollama routes got wrong, as Ollama answers it."""
    import json

    _, app = in_process
    chat = {"messages": [{"role": "user", "content": "Hello"}], "options": {"num_predict": 5, "temperature": 0}}
    # an unknown model is Ollama's 404 (SGLang answered any name with the served model)
    for path, body in (("/api/chat", {"model": "llama3", **chat}), ("/api/generate", {"model": "llama3", "prompt": "hi"}),
                       ("/api/show", {"model": "llama3"})):
        missing = call(app, "POST", path, body)
        assert missing.status_code == 404 and missing.json() == {"error": 'model "llama3" not found, try pulling it first '
                                                                  '(this server serves "tiny-ling-s0")'}, path
    # cut by num_predict: done_reason "length", and the stream's last line has the counts and durations
    lines = [json.loads(x) for x in call(app, "POST", "/api/chat", {"model": "tiny-ling-s0", **chat}).text.splitlines()]
    last = lines[-1]
    assert last["done"] and last["done_reason"] == "length"
    assert last["eval_count"] == 5 and last["prompt_eval_count"] > 0
    assert last["eval_duration"] > 0 and last["prompt_eval_duration"] > 0
    assert last["total_duration"] >= last["eval_duration"] + last["prompt_eval_duration"]
    whole = call(app, "POST", "/api/chat", {"model": "tiny-ling-s0", "stream": False, **chat}).json()
    assert whole["done_reason"] == "length" and whole["eval_count"] == 5 and whole["eval_duration"] > 0
    ended = call(app, "POST", "/api/generate", {"model": "tiny-ling-s0", "prompt": "Answer yes or no:", "stream": False,
                                                "format": {"enum": ["yes", "no"]}, "options": {"num_predict": 20}}).json()
    assert ended["done_reason"] == "stop" and json.loads(ended["response"]) in ("yes", "no")  # format: the grammar
    # options.seed is honoured: the same seed the same sample, another seed another one
    def sample(seed: int) -> str:
        return call(app, "POST", "/api/generate", {"model": "tiny-ling-s0", "prompt": "Once upon a time", "stream": False,
                                                   "options": {"num_predict": 24, "temperature": 1.0, "seed": seed}}).json()["response"]

    assert sample(1) == sample(1) and len({sample(1), sample(2), sample(3)}) > 1
    assert call(app, "GET", "/api/version").json()["version"]
    running = call(app, "GET", "/api/ps").json()["models"]
    assert [m["name"] for m in running] == ["tiny-ling-s0"] and running[0]["context_length"] == 2048
    bad = call(app, "POST", "/api/generate", {"model": "tiny-ling-s0", "prompt": "hi", "format": "yaml"})
    assert bad.status_code == 400 and bad.json()["param"] == "format"


def test_every_sglang_route_is_served_or_listed_with_why_not():
    """The installed sglang's routes (its http_server.py decorators, read from source): each is served
    here or in SGLANG_ROUTES_NOT_SERVED, and that table names no route SGLang does not have."""
    import ast
    from pathlib import Path

    sglang = pytest.importorskip("sglang")
    from sparkit.engines.embedded.routes import ROUTES, SGLANG_ROUTES_NOT_SERVED

    tree = ast.parse((Path(sglang.__file__).parent / "srt" / "entrypoints" / "http_server.py").read_text())
    theirs = set()
    for node in ast.walk(tree):
        for decorator in getattr(node, "decorator_list", []):
            func = getattr(decorator, "func", None)
            if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "app"):
                continue
            arg = decorator.args[0] if decorator.args else None
            if isinstance(arg, ast.Constant):
                theirs.add(arg.value)
            elif isinstance(arg, ast.Call) and len(arg.args) > 1 and isinstance(arg.args[1], ast.Constant):
                theirs.add(arg.args[1].value)  # os.environ.get("SGLANG_OLLAMA_CHAT_ROUTE", "/api/chat")
    ours = {route.path for route in ROUTES}
    assert {"/generate", "/api/chat", "/v1/completions"} <= theirs  # the reading found them
    unaccounted = sorted(theirs - ours - set(SGLANG_ROUTES_NOT_SERVED))
    assert not unaccounted, f"SGLang serves {unaccounted}: serve them or say why not in SGLANG_ROUTES_NOT_SERVED"
    assert not sorted(set(SGLANG_ROUTES_NOT_SERVED) - theirs), "SGLANG_ROUTES_NOT_SERVED lists routes SGLang does not have"
    assert not ours & set(SGLANG_ROUTES_NOT_SERVED)


# -- hostile and unusual clients (issue 40, items 4 and 11; issue 37, item 5) ------------------------------


def test_top_logprobs_under_a_grammar_leave_out_what_it_forbids(in_process):
    """They listed forbidden tokens at -3.4e38 (float32's lowest) to fill top_logprobs."""
    state, app = in_process
    body = {"messages": [{"role": "user", "content": "Yes or no?"}], "regex": "(yes|no)", "logprobs": True,
            "top_logprobs": 20, "max_tokens": 8, "temperature": 0}
    reply = call(app, "POST", "/v1/chat/completions", body).json()
    content = reply["choices"][0]["logprobs"]["content"]
    text = reply["choices"][0]["message"]["content"]
    assert text in ("yes", "no")
    so_far = ""
    for entry in content:
        alternatives = entry["top_logprobs"]
        assert 0 < len(alternatives) < 20  # far fewer than 20 tokens can continue "yes" or "no"
        assert all(a["logprob"] > -1e30 for a in alternatives)
        assert all(("yes".startswith(so_far + a["token"]) or "no".startswith(so_far + a["token"])
                    or (so_far in ("yes", "no") and a["token"] == state.tokenizer.eos_token))  # the grammar's end
                   for a in alternatives), (so_far, alternatives)
        so_far += entry["token"]
    native = call(app, "POST", "/generate", {"text": "Yes or no?", "return_logprob": True, "top_logprobs_num": 20,
                                             "sampling_params": {"regex": "(yes|no)", "max_new_tokens": 8, "temperature": 0}})
    rows = native.json()["meta_info"]["output_top_logprobs"]
    assert rows and all(0 < len(row) < 20 and all(lp > -1e30 for lp, _, _ in row) for row in rows[:-1])


def test_the_ignored_fields_header_is_escaped_and_bounded(in_process):
    _, app = in_process
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            **{f"unknown_field_{i:03d}": i for i in range(200)}, "é一": 1, "comma,name": 2}
    response = call(app, "POST", "/v1/chat/completions", body)
    assert response.status_code == 200
    header = response.headers["x-sparkit-ignored-fields"]
    assert header.isascii() and len(header) <= 1000 + len("...200 more")
    names = header.split(",")
    assert names[0] == "comma\\u002cname" and names[-1].startswith("...") and names[-1].endswith(" more")
    shown = len(names) - 1
    assert names[-1] == f"...{202 - shown} more"


ODD_VALUES = [None, True, False, 0, -0.0, 1, -1, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30, 1e308, -1e308, 3.5e38,
              1e-308, 5e-324, 0.5, "", "é一", "\x00", "a\r\nb", "x" * 5000, [], [None], [1e308], [[]], [2**64], {},
              {"": None}, {"é一": 1e308}, {"0": 3.5e38}, {"5": -1e308}, {"1": 1e-308}, "$$ANY$$", "(yes|no)"]


def _fuzzed(rng, base: dict, names: list[str], nested: tuple[str, list[str]] | None) -> dict:
    body = json.loads(json.dumps(base))
    for _ in range(rng.randint(1, 3)):
        value = rng.choice(ODD_VALUES)
        if nested is not None and rng.random() < 0.5:
            key, inner = nested
            if not isinstance(body.get(key), dict):
                body[key] = {}
            body[key][rng.choice(inner)] = value
        else:
            body[rng.choice(names)] = value
    return body


@pytest.mark.slow
def test_no_value_a_json_body_can_carry_is_a_5xx(in_process, monkeypatch):
    """Issue 40, item 11: logit_bias 3.5e38, repetition_penalty 1e-308 and odd field names were 500s.
    A seeded fuzz over the main routes: each field the route declares (and a few it does not),
    set to values at JSON's edges; every answer must be the client's error or a reply, never the
    server's (streams included: an error inside one carries its code)."""
    import random

    from sparkit.engines.embedded import requests as api

    state, app = in_process
    # whatever the fuzz asks for, a generation stays short
    monkeypatch.setattr(state, "max_new_tokens_limit", 2, raising=False)
    weird = ["é一", "a\x00b", "a\r\nb", "x" * 1000]
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    routes = [
        ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}}, api.GenerateRequest,
         ("sampling_params", sorted(api.GenerateSamplingParams.model_fields) + weird)),
        ("/v1/chat/completions", chat, api.ChatCompletionRequest, None),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}, api.CompletionRequest, None),
        ("/api/chat", {"model": "tiny-ling-s0", **chat, "options": {"num_predict": 2}}, api.OllamaChatRequest,
         ("options", sorted(api.OLLAMA_OPTIONS) + ["num_ctx", *weird])),
        ("/api/generate", {"model": "tiny-ling-s0", "prompt": "hi", "options": {"num_predict": 2}},
         api.OllamaGenerateRequest, ("options", sorted(api.OLLAMA_OPTIONS) + ["num_ctx"])),
        ("/tokenize", {"prompt": "hi"}, api.TokenizeRequest, None),
        ("/detokenize", {"tokens": [1, 2]}, api.DetokenizeRequest, None),
        ("/abort_request", {"rid": "nobody"}, api.AbortRequest, None),
    ]
    rng = random.Random(40)
    failures = []
    for path, base, model, nested in routes:
        names = sorted(set(model.model_fields) | set(getattr(model, "NEUTRAL", {}))) + weird
        for _ in range(30):
            body = _fuzzed(rng, base, names, nested)
            response = call(app, "POST", path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
            if response.status_code >= 500 or '"code": 500' in response.text or '"code":500' in response.text:
                failures.append((path, json.dumps(body)[:300], response.status_code, response.text[:300]))
    assert not failures, failures


def test_a_profile_is_written_where_the_server_says_never_where_the_request_says(in_process, tmp_path):
    """Issue 40, item 4: output_dir, profile_prefix and profile_id chose the path (created, and a
    planted link followed). The trace goes in the run directory's profiles/, its name reduced to
    safe characters; output_dir is ignored and named so."""
    import os

    state, app = in_process
    victim = tmp_path / "victim"
    started = call(app, "POST", "/start_profile", {"output_dir": str(victim), "profile_id": "../../evil",
                                                   "profile_prefix": "/etc/x", "num_steps": 2, "activities": ["CPU"]})
    assert started.status_code == 200 and started.text == "Start profiling.\n"
    assert started.headers["x-sparkit-ignored-fields"] == "output_dir"
    where = started.headers["x-sparkit-profile-dir"]
    assert where == os.path.join(os.environ["SPARKIT_REPORT_DIR"], "profiles")
    assert call(app, "POST", "/generate", {"text": "count: one two", "sampling_params": GREEDY}).status_code == 200
    state.worker.profile.done.wait(120)
    assert state.worker.profile.error is None
    assert [p.name for p in os.scandir(where) if not p.name.startswith(".")] == ["_etc_x-_.._evil-TP-0.trace.json.gz"]
    assert not victim.exists()
    assert os.stat(where).st_mode & 0o777 == 0o700
    assert os.stat(os.path.join(where, "_etc_x-_.._evil-TP-0.trace.json.gz")).st_mode & 0o777 == 0o600


def test_the_profile_directory_header_names_a_long_unusual_run_directory_whole(in_process, tmp_path, monkeypatch):
    """A run directory past a header's shortening (pytest's own tmp paths are ~110 characters)
    with a space, a comma and a non-ASCII name: the client reads back the directory the server
    writes in, byte for byte (shortened, `sparkit bench steps` waited 90 s on a path that is not there)."""
    import asyncio

    from sparkit.engines.embedded.profiling import PROFILES_SUBDIR

    state, app = in_process
    run_dir = tmp_path / ("r" * 120) / "a run, été"
    run_dir.mkdir(parents=True)
    monkeypatch.setenv("SPARKIT_REPORT_DIR", str(run_dir))

    async def start() -> str | None:
        async with EngineClient("http://in-process", transport=httpx.ASGITransport(app=app)) as client:
            return await client.start_profile({"num_steps": 1, "activities": ["CPU"]})

    assert asyncio.run(start()) == str(run_dir / PROFILES_SUBDIR)
    assert call(app, "POST", "/generate", {"text": "count: one", "sampling_params": GREEDY}).status_code == 200
    assert state.worker.profile.done.wait(120) and state.worker.profile.error is None


def test_profile_files_are_new_files_in_a_private_directory(tmp_path):
    import os

    from sparkit.engines.embedded.profiling import private_dir, safe_name, write_new

    assert safe_name("../../a b") == "_.._a_b" and safe_name("...") is None and len(safe_name("x" * 500)) == 100
    source = tmp_path / "raw.json"
    source.write_text("{}")
    target = tmp_path / "out.gz"
    other = tmp_path / "someone-elses"
    other.write_text("keep")
    target.symlink_to(other)
    with pytest.raises(FileExistsError):  # a link planted at the name is not followed
        write_new(target, source)
    assert other.read_text() == "keep"
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    os.chmod(open_dir, 0o777)
    with pytest.raises(OSError, match="not a private directory"):
        private_dir(open_dir)
    linked = tmp_path / "linked"
    linked.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(OSError, match="not a private directory"):
        private_dir(linked)
    assert private_dir(tmp_path / "fresh").stat().st_mode & 0o777 == 0o700


def test_health_is_503_while_the_executor_that_tokenises_requests_is_stuck(in_process, monkeypatch):
    """Issue 40, item 2: with that executor held (then by grammar compiles), every chat timed out
    and /health said OK."""
    import threading

    from sparkit.engines.embedded import routes

    monkeypatch.setattr(routes, "HEALTH_EXECUTOR_TIMEOUT_S", 0.5, raising=False)
    _, app = in_process

    async def go():
        loop = asyncio.get_running_loop()
        release = threading.Event()
        held = [loop.run_in_executor(None, release.wait) for _ in range(64)]  # more than its threads
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://in-process") as http:
            stuck = (await http.get("/health")).status_code
            release.set()
            await asyncio.gather(*held)
            free = (await http.get("/health")).status_code
        return stuck, free

    assert asyncio.run(go()) == (503, 200)


def test_max_new_tokens_limit_caps_every_generation(in_process, monkeypatch):
    """--max-new-tokens-limit (SGLang's SGLANG_MAX_NEW_TOKENS_LIMIT): a larger ask is capped, and
    ends with finish_reason length, on every route; Ollama's 2048-token default then fits."""
    state, app = in_process
    monkeypatch.setattr(state, "max_new_tokens_limit", 8, raising=False)
    chat = call(app, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000,
                                                      "ignore_eos": True}).json()
    assert chat["usage"]["completion_tokens"] == 8 and chat["choices"][0]["finish_reason"] == "length"
    native = call(app, "POST", "/generate", {"text": "hi", "sampling_params": {"ignore_eos": True}}).json()
    assert native["meta_info"]["completion_tokens"] == 8
    ollama = call(app, "POST", "/api/generate", {"model": "tiny-ling-s0", "prompt": "hi", "stream": False})
    assert ollama.status_code == 200 and ollama.json()["eval_count"] <= 8
