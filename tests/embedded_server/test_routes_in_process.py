"""The embedded server's routes served in this process through the client's transport seam
(httpx.ASGITransport): the same app, engine and worker thread a real server runs, without a
port or a process (tests/e2e keeps the ones that start real servers)."""

from __future__ import annotations

import asyncio
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
    yield state, create_app(state)
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
    reply = call(app, "POST", "/api/generate", {"model": "x", "prompt": "Once upon a time", "stream": False,
                                                "options": {"num_predict": 8, "temperature": 0, "num_ctx": 4096}})
    same = call(app, "POST", "/generate", {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}).json()
    assert reply.status_code == 200 and reply.json()["done"] and reply.json()["response"] == same["text"]
    assert reply.json()["eval_count"] == same["meta_info"]["completion_tokens"] <= 8
    assert reply.headers["x-sparkit-ignored-fields"] == "options.num_ctx"  # SGLang ignores options it does not map
    lines = [json.loads(x) for x in call(app, "POST", "/api/chat", {"model": "x", "messages": [{"role": "user", "content": "Hello"}],
                                                                     "options": {"num_predict": 12, "temperature": 0}}).text.splitlines()]
    assert lines[-1]["done"] and lines[-1]["done_reason"] == "stop" and all(not x["done"] for x in lines[:-1])
    whole = call(app, "POST", "/api/chat", {"model": "x", "messages": [{"role": "user", "content": "Hello"}], "stream": False,
                                            "options": {"num_predict": 12, "temperature": 0}}).json()
    assert "".join(x["message"]["content"] for x in lines) == whole["message"]["content"]
    default = call(app, "POST", "/api/generate", {"model": "x", "prompt": "hi", "stream": False})
    assert default.status_code == 400 and "options.num_predict" in default.json()["message"]  # SGLang's 2048 > the context
    seeded = call(app, "POST", "/api/generate", {"model": "x", "prompt": "hi", "options": {"seed": 1, "num_predict": 2}})
    assert seeded.status_code == 400 and seeded.json()["param"] == "options.seed"
    empty = call(app, "POST", "/api/generate", {"model": "x", "prompt": "", "stream": False}).json()
    assert empty["done"] and empty["response"] == ""


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
