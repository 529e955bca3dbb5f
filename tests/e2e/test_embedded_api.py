"""The embedded server's HTTP API, against real server processes.

Driven by the official `openai` client (chat + completions, streamed and not) and by
httpx for SGLang's native /generate, as sparkit's own commands and users' scripts do.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import time

import httpx
import openai
import pytest

from sparkit.client import EngineClient, parse_prometheus

pytestmark = pytest.mark.e2e

PROMPTS = [
    "The cat sat on the",
    "1 + 2 =",
    "Once upon a time",
    "count: one two three",
]


def _openai(server, api_key="unused"):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=120)


def _generate(server, body, **kw):
    return httpx.post(server.url + "/generate", json=body, timeout=120, **kw)


def _metrics(server) -> dict[str, float]:
    return parse_prometheus(httpx.get(server.url + "/metrics", timeout=30).text)


def _sse_payloads(response: httpx.Response) -> list:
    payloads = []
    for line in response.iter_lines():
        if line.startswith("data:"):
            payloads.append(line[5:].strip())
    return payloads


def _served_name(server) -> str:
    return httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]


# -- start-up ---------------------------------------------------------------------------------


def test_startup_logs_activation_report_and_info(embedded_server):
    log = embedded_server.log()
    assert "server_args=" in log
    assert "Load weight end." in log and "type=TinyLingForCausalLM," in log
    assert "type=TinyLingForCausalLMNextN" in log
    assert "The server is fired up and ready to roll!" in log
    assert "Online FP8 quantization enabled for lm_head." in log

    from sparkit.engines.sglang.log import parse_log

    evidence = parse_log(log)  # sparkit's own reader of SGLang's log lines reads these too
    assert [w.model_class for w in evidence.weight_loads] == ["TinyLingForCausalLM", "TinyLingForCausalLMNextN"]
    assert evidence.fp8_lm_head and evidence.ready
    assert evidence.server_args["speculative_algorithm"] == "NEXTN"
    report = json.loads((embedded_server.report_dir / "activation-tp0.json").read_text())
    assert report["engine"] == "embedded"
    assert report["models"]["target"]["lm_head"]["weight_dtype"] == "float8_e4m3fn"
    assert report["models"]["draft"]["lm_head"]["shared_with_target"] is True

    info = httpx.get(embedded_server.url + "/server_info", timeout=30).json()
    assert info["speculative_algorithm"] == "NEXTN"
    assert info["speculative_num_steps"] == 3 and info["speculative_num_draft_tokens"] == 4
    assert info["lm_head_dtype"] == "fp8"
    assert "sparkit.engines.embedded" in info["launch_command"]
    assert "version" in info and isinstance(info["internal_states"], list)
    assert httpx.get(embedded_server.url + "/get_server_info", timeout=30).json()["speculative_algorithm"] == "NEXTN"
    model_info = httpx.get(embedded_server.url + "/model_info", timeout=30).json()
    assert model_info["architectures"] == ["TinyLingForCausalLM"]
    assert httpx.get(embedded_server.url + "/get_model_info", timeout=30).status_code == 200
    assert httpx.get(embedded_server.url + "/health_generate", timeout=60).status_code == 200
    assert httpx.get(embedded_server.url + "/ready", timeout=30).status_code == 200


# -- OpenAI API -------------------------------------------------------------------------------------


def test_openai_chat_streamed_equals_non_streamed(embedded_server):
    client = _openai(embedded_server)
    name = _served_name(embedded_server)
    messages = [{"role": "user", "content": "Once upon a time"}]
    whole = client.chat.completions.create(model=name, messages=messages, temperature=0, max_tokens=40)
    assert whole.choices[0].message.role == "assistant"
    text = whole.choices[0].message.content
    assert text and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens > 0 and whole.usage.prompt_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

    stream = client.chat.completions.create(
        model=name, messages=messages, temperature=0, max_tokens=40, stream=True,
        stream_options={"include_usage": True}, extra_body={"return_spec_tokens_details": True},
    )
    parts, usage, finish, sglext = [], None, None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        if getattr(chunk, "sglext", None):
            sglext = chunk.sglext
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(parts) == text
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens
    details = sglext["spec_tokens_details"]
    assert details["spec_verify_ct"] >= 1
    assert details["spec_accept_length"] == pytest.approx(usage.completion_tokens / details["spec_verify_ct"])


def test_continuous_usage_counts_every_token_of_speculative_chunks(embedded_server):
    """With stream_options.continuous_usage_stats each chunk carries the cumulative usage, so a
    client (sparkit chat) counts all the tokens of a multi-token speculative chunk, live."""
    client = _openai(embedded_server)
    stream = client.chat.completions.create(
        model=_served_name(embedded_server), messages=[{"role": "user", "content": "count: one two three"}],
        temperature=0, max_tokens=48, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    cumulative, final = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            assert chunk.usage is not None, "a content chunk without usage"
            cumulative.append(chunk.usage.completion_tokens)
        elif not chunk.choices and chunk.usage:
            final = chunk.usage.completion_tokens
    assert cumulative == sorted(cumulative) and cumulative[-1] <= final
    # NEXTN commits several tokens per verify step: some chunk must carry more than one.
    steps = [b - a for a, b in zip([0] + cumulative, cumulative)]
    assert max(steps) > 1


def test_openai_completions_streamed_and_not(embedded_server):
    client = _openai(embedded_server)
    name = _served_name(embedded_server)
    whole = client.completions.create(model=name, prompt="The cat sat on the", temperature=0, max_tokens=24)
    assert whole.object == "text_completion" and whole.choices[0].text
    assert whole.usage.completion_tokens <= 24
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=name, prompt="The cat sat on the", temperature=0, max_tokens=24, stream=True) if c.choices)
    assert streamed == whole.choices[0].text


def test_models_lists_the_served_model(embedded_server, tiny_model_dir):
    models = _openai(embedded_server).models.list()
    assert [m.id for m in models.data] == [tiny_model_dir.name]  # default: the directory name


def test_spec_details_in_non_streamed_chat(embedded_server):
    response = httpx.post(embedded_server.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "count: one two three"}], "temperature": 0, "max_tokens": 30,
        "return_spec_tokens_details": True,
    }, timeout=120)
    body = response.json()
    details = body["sglext"]["spec_tokens_details"]
    assert details["spec_accept_length"] == pytest.approx(body["usage"]["completion_tokens"] / details["spec_verify_ct"])


# -- native /generate -------------------------------------------------------------------------------


def test_generate_meta_info_and_stream_are_consistent(embedded_server):
    body = {"text": "Once upon a time", "sampling_params": {"temperature": 0, "max_new_tokens": 48}}
    whole = _generate(embedded_server, body).json()
    meta = whole["meta_info"]
    for key in ("id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency",
                "spec_verify_ct", "spec_accept_length", "spec_accept_rate", "spec_num_correct_drafts", "spec_num_proposed_drafts"):
        assert key in meta, key
    assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / meta["spec_verify_ct"])
    assert len(whole["output_ids"]) == meta["completion_tokens"]

    with httpx.stream("POST", embedded_server.url + "/generate", json={**body, "stream": True}, timeout=120) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = _sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    texts = [c["text"] for c in chunks]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), "text must be cumulative"
    assert counts == sorted(counts) and counts[-1] == meta["completion_tokens"]
    assert texts[-1] == whole["text"]
    assert chunks[-1]["meta_info"]["finish_reason"] == meta["finish_reason"]
    assert chunks[-1]["output_ids"] == whole["output_ids"]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_generate_accepts_input_ids_and_honours_length_and_stops(embedded_server):
    tok_ids = _generate(embedded_server, {"text": "count: one two", "sampling_params": {"max_new_tokens": 0}}).json()
    assert tok_ids["meta_info"]["completion_tokens"] == 0
    prompt_tokens = tok_ids["meta_info"]["prompt_tokens"]
    by_ids = _generate(embedded_server, {"input_ids": list(b"count: one two"), "sampling_params": {"temperature": 0, "max_new_tokens": 20}}).json()
    by_text = _generate(embedded_server, {"text": "count: one two", "sampling_params": {"temperature": 0, "max_new_tokens": 20}}).json()
    assert prompt_tokens == len(b"count: one two")
    assert by_ids["text"] == by_text["text"]

    exact = _generate(embedded_server, {"text": "Once", "sampling_params": {"temperature": 0, "max_new_tokens": 17, "ignore_eos": True}}).json()
    assert exact["meta_info"]["completion_tokens"] == 17
    assert exact["meta_info"]["finish_reason"] == {"type": "length", "length": 17}

    # a stop string taken from the greedy output itself: the reply ends right before it
    full = _generate(embedded_server, {"text": "Once upon a time", "sampling_params": {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}}).json()["text"]
    stop = full[5:8]
    assert stop and stop in full
    stopped = _generate(embedded_server, {"text": "Once upon a time", "sampling_params": {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True, "stop": [stop]}}).json()
    assert stopped["text"] == full[: full.index(stop)]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    # stop_token_ids: the first generated token id stops at once
    first = full.encode()[0]
    by_id = _generate(embedded_server, {"text": "Once upon a time", "sampling_params": {"temperature": 0, "max_new_tokens": 40, "stop_token_ids": [first]}}).json()
    assert by_id["meta_info"]["completion_tokens"] == 1
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": first}


def test_sampling_with_a_seed_is_reproducible(embedded_server):
    body = {"text": "Once upon a time", "sampling_params": {"temperature": 0.9, "top_p": 0.95, "top_k": 20, "max_new_tokens": 30, "sampling_seed": 7}}
    assert _generate(embedded_server, body).json()["text"] == _generate(embedded_server, body).json()["text"]


# -- bad input ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "content", "status", "needle"),
    [
        ("/generate", b"{oops", 400, "malformed JSON"),
        ("/generate", json.dumps({"text": "a", "sampling_params": {"max_new_token": 5}}).encode(), 400, "unknown field"),
        ("/generate", json.dumps({"text": "a", "sampling_params": {"max_new_tokens": -1}}).encode(), 400, "max_new_tokens"),
        # an unknown top-level field is ignored as SGLang does (tests/e2e/test_api_fidelity.py)
        ("/generate", json.dumps({"input_ids": [1, 99999]}).encode(), 400, "input_ids"),
        ("/v1/chat/completions", b"not json", 400, "malformed JSON"),
        ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": -5}).encode(), 400, "max_tokens"),
        ("/nowhere", b"{}", 404, "Not Found"),
    ],
)
def test_bad_requests_get_sglang_shaped_errors(embedded_server, path, content, status, needle):
    response = httpx.post(embedded_server.url + path, content=content, headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code == status
    body = response.json()
    # SGLang: /generate answers {"error": {...}}, every other route its flat ErrorResponse
    error = body["error"] if path == "/generate" else body
    assert path == "/generate" or error["object"] == "error"
    assert needle in error["message"]
    assert {"message", "type", "code"} <= set(error)


def test_a_misspelt_top_level_field_is_ignored_as_sglang_does_and_named(embedded_server):
    """SGLang's OpenAI request models ignore unknown keys (a client from a newer API keeps
    working); sparkit follows, and names what it ignored in a header so a typo can be found."""
    body = {"messages": [{"role": "user", "content": "x"}], "temprature": 0, "max_tokens": 2}
    response = httpx.post(embedded_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200
    assert response.headers["x-sparkit-ignored-fields"] == "temprature"


def test_prompt_longer_than_context_and_unknown_model_then_still_serving(embedded_server):
    context = httpx.get(embedded_server.url + "/model_info", timeout=30).json()["context_length"]
    too_long = _generate(embedded_server, {"text": "a" * (context + 5), "sampling_params": {"max_new_tokens": 1}})
    assert too_long.status_code == 400 and "context length" in too_long.json()["error"]["message"]
    over_budget = _generate(embedded_server, {"text": "abc", "sampling_params": {"max_new_tokens": context}})
    assert over_budget.status_code == 400 and "context length" in over_budget.json()["error"]["message"]

    client = _openai(embedded_server)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-17", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert "gpt-17" in str(info.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=_served_name(embedded_server), messages=[{"role": "user", "content": "hi"}], max_tokens=-1)
    ok = _generate(embedded_server, {"text": "1 + 2 =", "sampling_params": {"temperature": 0, "max_new_tokens": 4}})
    assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] >= 1


# -- queueing, isolation, cancellation ----------------------------------------------------------------


def test_concurrent_clients_get_their_own_greedy_outputs(embedded_server):
    def body(prompt):
        return {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 32}}

    sequential = [_generate(embedded_server, body(p)).json()["text"] for p in PROMPTS]

    async def one(client, prompt, stream):
        if not stream:
            return (await client.post("/generate", json=body(prompt))).json()["text"]
        last = None
        async with client.stream("POST", "/generate", json={**body(prompt), "stream": True}) as response:
            async for line in response.aiter_lines():
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    last = json.loads(line[5:])["text"]
        return last

    async def all_at_once():
        async with httpx.AsyncClient(base_url=embedded_server.url, timeout=300) as client:
            return await asyncio.gather(*(one(client, p, i % 2 == 0) for i, p in enumerate(PROMPTS * 2)))

    concurrent = asyncio.run(all_at_once())
    assert concurrent == sequential * 2


def test_client_disconnect_frees_the_slot(start_embedded_server):
    # At most ~4 tokens per 10 ms step: the long request needs several seconds however idle the
    # machine, so a client that leaves after one second must leave most of its budget unspent.
    embedded_server = start_embedded_server(speculative_algorithm="NEXTN", speculative_num_steps=3,
                                            speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                                            lm_head_dtype="fp8", debug_step_delay_ms=10)
    context = httpx.get(embedded_server.url + "/model_info", timeout=30).json()["context_length"]
    long_budget = context - 20
    before = _metrics(embedded_server)
    with httpx.stream("POST", embedded_server.url + "/generate", timeout=120, json={
        "text": "Once", "stream": True, "sampling_params": {"temperature": 0, "max_new_tokens": long_budget, "ignore_eos": True},
    }) as response:
        lines = response.iter_lines()
        seen = 0
        for line in lines:
            if line.startswith("data:"):
                seen += 1
                if seen == 2:
                    break  # leave mid-stream: closing the response drops the connection
    follow = _generate(embedded_server, {"text": "1 + 2 =", "sampling_params": {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}})
    assert follow.status_code == 200 and follow.json()["meta_info"]["completion_tokens"] == 4
    after = _metrics(embedded_server)
    assert after["sglang:num_aborted_requests_total"] == before["sglang:num_aborted_requests_total"] + 1
    generated = after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"]
    # the abandoned request stopped far short of its budget instead of running to the end first
    assert 4 < generated < long_budget / 2
    assert after["sglang:num_running_reqs"] == 0 and after["sglang:num_queue_reqs"] == 0

    # a non-streamed request whose client gives up is aborted too
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(embedded_server.url + "/generate", timeout=httpx.Timeout(1.0, connect=10.0), json={
            "text": "Once", "sampling_params": {"temperature": 0, "max_new_tokens": long_budget, "ignore_eos": True},
        })
    follow = _generate(embedded_server, {"text": "1 + 2 =", "sampling_params": {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}})
    assert follow.json()["meta_info"]["completion_tokens"] == 4
    # batched, the follow-up can finish beside the abandoned request before the server has seen the
    # client go: wait for that event (the running count back to 0), not for a time
    for _ in range(600):
        final = _metrics(embedded_server)
        if final["sglang:num_running_reqs"] == 0 and final["sglang:num_queue_reqs"] == 0:
            break
        time.sleep(0.1)
    assert final["sglang:num_aborted_requests_total"] == after["sglang:num_aborted_requests_total"] + 1
    assert final["sglang:generation_tokens_total"] - after["sglang:generation_tokens_total"] < long_budget / 2


def test_metrics_and_server_info_counters_match_what_clients_received(embedded_server):
    before = _metrics(embedded_server)
    info_before = httpx.get(embedded_server.url + "/server_info", timeout=30).json()
    completion = prompt = verify = 0

    async def run():
        nonlocal completion, prompt, verify
        async with EngineClient(embedded_server.url) as client:
            for i, p in enumerate(PROMPTS):
                if i % 2:
                    gen = await client.generate(p, sampling_params={"temperature": 0, "max_new_tokens": 25})
                else:
                    gen = None
                    async for item in client.stream_generate(p, sampling_params={"temperature": 0.7, "max_new_tokens": 25, "sampling_seed": i}):
                        gen = item
                completion += gen.completion_tokens
                prompt += gen.prompt_tokens
                verify += gen.spec_verify_ct
            chat = None
            async for item in client.stream_chat([{"role": "user", "content": "hello"}], temperature=0, max_tokens=20):
                chat = item
            completion += chat.completion_tokens
            prompt += chat.prompt_tokens
            verify += chat.spec_verify_ct

    asyncio.run(run())
    after = _metrics(embedded_server)
    assert after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"] == completion
    assert after["sglang:prompt_tokens_total"] - before["sglang:prompt_tokens_total"] == prompt
    assert after["sglang:num_requests_total"] - before["sglang:num_requests_total"] == len(PROMPTS) + 1
    assert after["sglang:spec_verify_calls_total"] - before["sglang:spec_verify_calls_total"] == verify
    assert after["sglang:time_to_first_token_seconds_count"] - before["sglang:time_to_first_token_seconds_count"] == len(PROMPTS) + 1
    info = httpx.get(embedded_server.url + "/server_info", timeout=30).json()["internal_states"][0]
    assert info["spec_verify_ct_total"] - info_before["internal_states"][0]["spec_verify_ct_total"] == verify
    assert info["avg_spec_accept_length"] > 1.0
    for name in ("sglang:gen_throughput", "sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:num_running_reqs",
                 "sglang:num_queue_reqs", "sglang:e2e_request_latency_seconds_count"):
        assert name in after, name


def test_decode_log_lines_and_gauges(embedded_server):
    body = {"text": "Once upon a time", "sampling_params": {"temperature": 0, "max_new_tokens": 400, "ignore_eos": True}}
    assert _generate(embedded_server, body).json()["meta_info"]["completion_tokens"] == 400
    lines = [line for line in embedded_server.log().splitlines() if line.startswith("Decode batch.")]
    assert lines, "a 'Decode batch.' line every 40 decode steps"
    match = re.search(r"#running-req: 1, #token: \d+, accept len: ([\d.]+), accept rate: [\d.]+, gen throughput \(token/s\): ([\d.]+)", lines[-1])
    assert match, lines[-1]
    accept, throughput = float(match.group(1)), float(match.group(2))
    assert 1.0 <= accept <= 4.0 and throughput > 0
    metrics = _metrics(embedded_server)
    assert metrics["sglang:gen_throughput"] > 0
    assert 1.0 <= metrics["sglang:spec_accept_length"] <= 4.0
    assert 0.0 <= metrics["sglang:spec_accept_rate"] <= 1.0


# -- separate servers ---------------------------------------------------------------------------------------


def test_api_key_guards_everything_but_health(start_embedded_server):
    server = start_embedded_server(env={"SPARKIT_API_KEY": "sesame"})
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    for path in ("/v1/models", "/server_info", "/metrics"):
        response = httpx.get(server.url + path, timeout=30)
        assert response.status_code == 401, path
        assert "API key" in response.json()["error"]["message"]
    with pytest.raises(openai.AuthenticationError):
        _openai(server, api_key="wrong").models.list()
    reply = _openai(server, api_key="sesame").chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert reply.usage.completion_tokens >= 1
    assert "sesame" not in httpx.get(server.url + "/server_info", headers={"Authorization": "Bearer sesame"}, timeout=30).text
    assert server.stop() == 0  # SIGTERM: clean shutdown, exit 0
    assert "Shutdown complete." in server.log()
    with pytest.raises(ProcessLookupError):
        os.killpg(server.proc.pid, 0)  # nothing of its process group is left


def test_corrupt_checkpoint_fails_the_start_naming_the_file(start_embedded_server, tiny_model_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    server = start_embedded_server(model_path=broken, wait=False)
    assert server.proc.wait(timeout=120) != 0
    assert str(weights) in server.log()
    assert "Traceback" not in server.log()

    garbled = tmp_path / "garbled"
    shutil.copytree(tiny_model_dir, garbled)
    (garbled / "config.json").write_text("{ not json")
    server = start_embedded_server(model_path=garbled, wait=False)
    assert server.proc.wait(timeout=120) != 0
    assert str(garbled / "config.json") in server.log()

    # readable files that do not fit together: the engine's own load fails; the server exits 1
    mismatched = tmp_path / "mismatched"
    shutil.copytree(tiny_model_dir, mismatched)
    config = json.loads((mismatched / "config.json").read_text())
    config["moe_intermediate_size"] += 8
    (mismatched / "config.json").write_text(json.dumps(config))
    server = start_embedded_server(model_path=mismatched, wait=False)
    assert server.proc.wait(timeout=120) == 1
    assert str(mismatched / "model.safetensors") in server.log()
    assert "Traceback" not in server.log()


def test_plain_decoding_server_without_speculation(start_embedded_server, embedded_server):
    server = start_embedded_server(lm_head_dtype="fp8", max_queued_requests=1, max_running_requests=2, wait=False)
    # the port opens before the model loads: /health and requests answer 503 until warm
    seen_503 = generate_503 = False
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and server.proc.poll() is None:
        try:
            status = httpx.get(server.url + "/health", timeout=5).status_code
        except httpx.TransportError:
            time.sleep(0.02)
            continue
        if status == 200:
            break
        assert status == 503
        if not seen_503:
            seen_503 = True
            early = _generate(server, {"text": "hi"})
            generate_503 = early.status_code == 503 and "error" in early.json()
        time.sleep(0.02)
    assert seen_503 and generate_503
    server.wait_healthy()

    # --max-running-requests 2, --max-queued-requests 1: two running, one queued, the next is refused with 503
    long_body = {"text": "Once", "stream": True, "sampling_params": {"temperature": 0, "max_new_tokens": 1500, "ignore_eos": True}}
    with httpx.Client(base_url=server.url, timeout=120) as client, httpx.Client(base_url=server.url, timeout=120) as second:
        with client.stream("POST", "/generate", json=long_body) as running, second.stream("POST", "/generate", json=long_body) as beside:
            running_lines, beside_lines = running.iter_lines(), beside.iter_lines()  # kept: closing one would drop its connection
            for lines in (running_lines, beside_lines):
                for line in lines:
                    if line.startswith("data:"):
                        break
            with httpx.Client(base_url=server.url, timeout=120) as other, other.stream("POST", "/generate", json=long_body) as queued:
                deadline = time.monotonic() + 60
                while _metrics(server)["sglang:num_queue_reqs"] < 1 and time.monotonic() < deadline:
                    time.sleep(0.05)
                refused = httpx.post(server.url + "/generate", json={"text": "hi"}, timeout=60)
                assert refused.status_code == 503
                assert "queue is full" in refused.json()["error"]["message"]
                assert queued.status_code == 200
                assert _metrics(server)["sglang:num_aborted_requests_total"] == 0
    body = {"text": "The cat sat on the", "sampling_params": {"temperature": 0, "max_new_tokens": 32}}
    plain = _generate(server, body).json()
    assert "spec_verify_ct" not in plain["meta_info"]
    # greedy speculative decoding gives the same tokens as plain greedy decoding
    assert _generate(embedded_server, body).json()["output_ids"] == plain["output_ids"]
    info = httpx.get(server.url + "/server_info", timeout=30).json()
    assert info["speculative_algorithm"] is None and "avg_spec_accept_length" not in info["internal_states"][0]
    assert server.stop() == 0


def test_wrong_draft_shows_in_accept_length(start_embedded_server, wrong_draft_model_dir, embedded_server):
    server = start_embedded_server(speculative_algorithm="NEXTN", speculative_num_steps=3, speculative_eagle_topk=1,
                                   speculative_num_draft_tokens=4, speculative_draft_model_path=wrong_draft_model_dir)

    def accept_length(target) -> float:
        completion = verify = 0
        for prompt in PROMPTS:
            meta = _generate(target, {"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 64}}).json()["meta_info"]
            completion += meta["completion_tokens"]
            verify += meta["spec_verify_ct"]
        return completion / verify

    wrong, right = accept_length(server), accept_length(embedded_server)
    assert wrong < 1.4 < 1.5 < right
    info = httpx.get(server.url + "/server_info", timeout=30).json()
    assert info["speculative_draft_model_path"] == str(wrong_draft_model_dir)
    assert info["internal_states"][0]["avg_spec_accept_length"] == pytest.approx(wrong)
    os.killpg(server.proc.pid, signal.SIGINT)  # Ctrl-C in a foreground `sparkit up`
    assert server.proc.wait(timeout=30) == 0
