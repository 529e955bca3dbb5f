"""The embedded engine as tools written for SGLang and OpenAI use it, against real server processes:
logprobs equal to a direct forward pass of the model (under NEXTN too), token-id prompts, the
endpoints SGLang serves, and the requests that used to stall or break the server (issue 15)."""

from __future__ import annotations

import json
import socket

import httpx
import openai
import pytest

pytestmark = pytest.mark.e2e

torch = pytest.importorskip("torch")

TOLERANCE = 1e-4  # float32 on both sides; the served path and the module path round differently
PROMPT = "The cat sees a tree. The teacher meets a tree."


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """The target model the shared server runs (bf16 experts, FP8 head), its module path without
    KV cache, fast path or draft: a direct forward pass."""
    from sparkit.engines.embedded.engine import EmbeddedEngine
    from sparkit.engines.embedded.settings import EngineConfig

    torch.set_num_threads(1)
    engine = EmbeddedEngine(EngineConfig(model_path=str(tiny_model_dir), device="cpu", lm_head_dtype="fp8"))

    class Reference:
        tokenizer = engine.tokenizer

        @staticmethod
        def logprobs(ids: list[int], temperature: float | None = None):
            """[len(ids), V]: row i is the distribution of the token after ids[:i+1]."""
            with torch.inference_mode():
                hidden = engine.model.forward_hidden(torch.tensor([ids]))
                logits = engine.model.logits(hidden)[0, :, : engine.vocab_limit].float()
            return (logits / temperature if temperature else logits).log_softmax(-1)

        @staticmethod
        def encode(text: str) -> list[int]:
            return engine.tokenizer.encode(text, add_special_tokens=False)

    return Reference


def _openai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _name(server) -> str:
    return httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]


def _post(server, path: str, body, **kw) -> httpx.Response:
    if isinstance(body, (bytes, str)):
        return httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=120, **kw)
    return httpx.post(server.url + path, json=body, timeout=120, **kw)


# -- logprobs --------------------------------------------------------------------------------------


def test_loglikelihood_as_an_eval_harness_asks_equals_a_direct_forward_pass(embedded_server, reference):
    """lm-eval's loglikelihood request: /v1/completions, echo, logprobs 1, max_tokens 0."""
    out = _openai(embedded_server).completions.create(model=_name(embedded_server), prompt=PROMPT, echo=True,
                                                       logprobs=1, max_tokens=0)
    choice = out.choices[0]
    assert choice.text == PROMPT and out.usage.completion_tokens == 0
    ids = reference.encode(PROMPT)
    rows = reference.logprobs(ids)
    lp = choice.logprobs
    assert len(lp.token_logprobs) == len(ids) and "".join(lp.tokens) == PROMPT
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for i in range(1, len(ids)):
        assert lp.token_logprobs[i] == pytest.approx(float(rows[i - 1, ids[i]]), abs=TOLERANCE)
        (best_text, best), = lp.top_logprobs[i].items()
        assert best == pytest.approx(float(rows[i - 1].max()), abs=TOLERANCE)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(ids))]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_generate_logprobs_under_nextn_are_the_targets(embedded_server, reference, temperature):
    """SGLang's /generate logprobs, from a speculating server: every output token's logprob is the
    target's at that position (log_softmax of logits / temperature when sampling), not the draft's."""
    body = {"text": PROMPT, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3,
            "sampling_params": {"temperature": temperature, "max_new_tokens": 32, "ignore_eos": True, "sampling_seed": 7}}
    response = _post(embedded_server, "/generate", body)
    assert response.status_code == 200, response.text
    data = response.json()
    meta, output = data["meta_info"], data["output_ids"]
    assert meta["spec_verify_ct"] < len(output)  # drafts were accepted: tokens came from verify steps
    prompt = reference.encode(PROMPT)
    raw = reference.logprobs(prompt + output)
    scaled = raw if temperature == 0 else reference.logprobs(prompt + output, temperature)
    inputs, outputs = meta["input_token_logprobs"], meta["output_token_logprobs"]
    assert [e[1] for e in inputs] == prompt and inputs[0] == [None, prompt[0], None]
    assert meta["input_top_logprobs"][0] is None
    for i in range(1, len(prompt)):
        assert inputs[i][0] == pytest.approx(float(raw[i - 1, prompt[i]]), abs=TOLERANCE)  # raw logits, as SGLang
    assert [e[1] for e in outputs] == output and meta["output_token_logprobs_length"] == len(output)
    for j, (entry, top) in enumerate(zip(outputs, meta["output_top_logprobs"])):
        row = scaled[len(prompt) - 1 + j]
        assert entry[0] == pytest.approx(float(row[output[j]]), abs=TOLERANCE) and entry[2] is None
        values, _ = row.topk(3)
        assert [t[0] for t in top] == pytest.approx(values.tolist(), abs=TOLERANCE)
        if temperature == 0:
            assert top[0][1] == output[j]  # greedy: the chosen token is the best one


def test_text_in_logprobs_and_no_logprobs_unless_asked(embedded_server):
    plain = _post(embedded_server, "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}).json()
    assert "input_token_logprobs" not in plain["meta_info"]
    texts = _post(embedded_server, "/generate", {"text": "Hello", "return_logprob": True, "return_text_in_logprobs": True,
                                                 "sampling_params": {"max_new_tokens": 4, "temperature": 0}}).json()
    meta = texts["meta_info"]
    assert meta["input_token_logprobs"] == []  # logprob_start_len -1 (SGLang's default): no prompt positions
    assert "".join(e[2] for e in meta["output_token_logprobs"]) == texts["text"]
    far = _post(embedded_server, "/generate", {"text": "Hello", "return_logprob": True, "logprob_start_len": 99})
    assert far.status_code == 400 and "logprob_start_len=99 is higher than the number of input tokens (5)" in far.text


def test_chat_logprobs_through_the_openai_client_streamed_and_not(embedded_server, reference):
    client = _openai(embedded_server)
    messages = [{"role": "user", "content": "Hello"}]
    whole = client.chat.completions.create(model=_name(embedded_server), messages=messages, max_tokens=12,
                                           temperature=0, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    content = whole.choices[0].logprobs.content
    assert "".join(t.token for t in content) == whole.choices[0].message.content
    assert all(bytes(t.bytes).decode() == t.token and len(t.top_logprobs) == 2 for t in content)
    prompt = reference.tokenizer.encode(reference.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                                        add_special_tokens=False)
    output = reference.encode(whole.choices[0].message.content)
    rows = reference.logprobs(prompt + output)
    for j, token in enumerate(content):
        assert token.logprob == pytest.approx(float(rows[len(prompt) - 1 + j, output[j]]), abs=TOLERANCE)
        assert token.top_logprobs[0].token == token.token
    streamed = []
    for chunk in client.chat.completions.create(model=_name(embedded_server), messages=messages, max_tokens=12,
                                                temperature=0, logprobs=True, top_logprobs=2, stream=True,
                                                extra_body={"ignore_eos": True}):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]


# -- prompts and fields ------------------------------------------------------------------------------


def test_token_id_prompts_of_one_request_in_every_shape(embedded_server, reference):
    ids = reference.encode("Once upon a time")
    client = _openai(embedded_server)
    name = _name(embedded_server)
    texts = {client.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0).choices[0].text
             for prompt in ("Once upon a time", ["Once upon a time"], ids, [ids])}
    assert len(texts) == 1
    expected = texts.pop()
    one = _post(embedded_server, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    assert one.status_code == 200 and one.json()["text"] == expected
    listed = _post(embedded_server, "/generate", {"input_ids": [ids], "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    assert listed.status_code == 200 and [o["text"] for o in listed.json()] == [expected]  # a batch of one: a list, as SGLang
    two = client.completions.create(model=name, prompt=[ids, ids], max_tokens=8, temperature=0)
    assert [c.text for c in two.choices] == [expected, expected] and [c.index for c in two.choices] == [0, 1]


def test_openai_fields_at_neutral_values_are_accepted_and_others_named(embedded_server):
    client = _openai(embedded_server)
    name = _name(embedded_server)
    reply = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Hello"}], max_tokens=4, temperature=0,
        parallel_tool_calls=True, metadata={"team": "evals"}, store=False, logit_bias={}, n=1,
        response_format={"type": "text"}, tool_choice="none", presence_penalty=0, frequency_penalty=0,
        extra_body={"stop_regex": None, "custom_params": None},
    )
    assert reply.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match=r'modalities=\["text", "audio"\] is not supported by the embedded engine'):
        client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hello"}], max_tokens=2,
                                       modalities=["text", "audio"])
    stored = client.chat.completions.with_raw_response.create(  # SGLang takes it; it means nothing here: named
        model=name, messages=[{"role": "user", "content": "Hello"}], max_tokens=2, store=True, reasoning_effort="low")
    assert stored.headers["x-sparkit-ignored-fields"] == "reasoning_effort,store"
    ignored = _post(embedded_server, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}, "a_future_field": 1})
    assert ignored.status_code == 200 and ignored.headers["x-sparkit-ignored-fields"] == "a_future_field"
    typo = _post(embedded_server, "/generate", {"text": "Hi", "sampling_params": {"max_new_token": 2}})
    assert typo.status_code == 400 and "sampling_params.max_new_token: unknown field" in typo.text


# -- endpoints ------------------------------------------------------------------------------------


def test_model_tokenize_detokenize_and_version_endpoints(embedded_server, reference):
    client = _openai(embedded_server)
    name = _name(embedded_server)
    card = client.models.retrieve(name)
    assert card.id == name and card.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    tokens = _post(embedded_server, "/tokenize", {"prompt": "Hello"}).json()
    assert tokens == {"tokens": reference.encode("Hello"), "count": 5, "max_model_len": 2048}
    chat = _post(embedded_server, "/v1/tokenize", {"messages": [{"role": "user", "content": "Hi"}]}).json()
    assert chat["tokens"][0] == reference.tokenizer.bos_token_id and chat["count"] == len(chat["tokens"])
    assert _post(embedded_server, "/detokenize", {"tokens": tokens["tokens"]}).json() == {"text": "Hello"}
    assert _post(embedded_server, "/v1/detokenize", {"tokens": [tokens["tokens"], [72]]}).json() == {"text": ["Hello", "H"]}
    from sparkit._version import __version__

    assert httpx.get(embedded_server.url + "/version", timeout=30).json() == {"version": __version__}


def test_abort_request_stops_a_running_generation(start_embedded_server):
    server = start_embedded_server(debug_step_delay_ms=20)  # >= 20 ms a step: 2000 tokens take >= 40 s
    body = {"text": "count:", "rid": "abort-me", "stream": True, "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}
    last = None
    with httpx.stream("POST", server.url + "/generate", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            last = json.loads(line[5:])
            if last["meta_info"]["completion_tokens"] >= 1 and last["meta_info"]["finish_reason"] is None:
                assert _post(server, "/abort_request", {"rid": "abort-me"}).status_code == 200
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] < 2000
    assert _post(server, "/abort_request", {"rid": "not-running"}).status_code == 200  # as SGLang: nothing to do


# -- bad input, for real (issue 15) ------------------------------------------------------------------


def _raw_http(server, request: bytes, close_after_send: bool = False) -> bytes:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(request)
        if close_after_send:
            return b""
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def _new_log(server, since: int) -> str:
    return server.log()[since:]


def test_oversized_bodies_are_413_before_anything_is_parsed(embedded_server):
    since = len(embedded_server.log())
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 5_000_000}]}).encode()
    host = embedded_server.url.split("//", 1)[1]  # a Host the server listens on (any other is a 403 first)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    answer = _raw_http(embedded_server, head + body[:1024])  # the server answers on the declared length
    assert answer.startswith(b"HTTP/1.1 413") and b"exceeds the server's limit of 4194304 bytes" in answer
    under = json.dumps({"messages": [{"role": "user", "content": "x" * 3_000_000}]})
    refused = _post(embedded_server, "/v1/chat/completions", under)  # under the limit, but cannot fit the context
    assert refused.status_code == 400 and "cannot fit in the model's context" in refused.text
    assert httpx.get(embedded_server.url + "/health", timeout=30).status_code == 200
    assert "Traceback" not in _new_log(embedded_server, since)


@pytest.mark.parametrize(("path", "body", "needle"), [
    ("/generate", b"[" * 1000, "nested more than 32 levels"),
    ("/generate", b'{"text": ' + b"[" * 1000 + b"]" * 1000 + b"}", "nested more than 32 levels"),
    ("/generate", '{"text": "\\ud800abc"}', r"text: contains the unpaired UTF-16 surrogate \ud800"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800abc"}]}', "messages.0.content: contains the unpaired"),
    ("/v1/chat/completions", '{"stream": true, "messages": [{"role": "user", "content": "\\ud800abc"}]}', "unpaired UTF-16 surrogate"),
    ("/v1/completions", '{"prompt": "\\udfff"}', "prompt: contains the unpaired"),
    ("/generate", '{"text": "a", "sampling_params": {"temperature": Infinity}}', "Infinity is not a JSON number"),
    ("/generate", '{"text": "a", "sampling_params": {"temperature": 1e308}}', "sampling_params.temperature: Input should be less than or equal to 100"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a"}], "temperature": 1e999}', "temperature: inf is out of range"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": {"chat_template": "{% for i in range(99999) %}{% for j in range(99999) %}x{% endfor %}{% endfor %}"}}',
     "this server runs only the model's own chat template"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": {"tokenize": true}}',
     "chat_template_kwargs.tokenize: an argument of the templating call"),
])
def test_hostile_bodies_are_400s_naming_the_field_and_log_no_traceback(embedded_server, path, body, needle):
    since = len(embedded_server.log())
    response = _post(embedded_server, path, body)
    assert response.status_code == 400, response.text
    body = response.json()
    assert needle in (body["error"]["message"] if path == "/generate" else body["message"])
    assert httpx.get(embedded_server.url + "/health", timeout=30).status_code == 200
    assert "Traceback" not in _new_log(embedded_server, since)


def test_a_tiny_top_p_samples_the_best_token_instead_of_failing(embedded_server):
    response = _post(embedded_server, "/generate", {"text": "The cat", "sampling_params": {"top_p": 1e-300, "temperature": 0.9,
                                                                                           "max_new_tokens": 16, "ignore_eos": True}})
    assert response.status_code == 200, response.text
    greedy = _post(embedded_server, "/generate", {"text": "The cat", "sampling_params": {"temperature": 0, "max_new_tokens": 16,
                                                                                         "ignore_eos": True}})
    assert response.json()["output_ids"] == greedy.json()["output_ids"]  # only the best token survives top-p


def test_a_client_gone_mid_body_leaves_no_traceback(embedded_server):
    since = len(embedded_server.log())
    host = embedded_server.url.split("//", 1)[1]
    head = f"POST /generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n".encode()
    _raw_http(embedded_server, head + b'{"text": "' + b"a" * 1000, close_after_send=True)
    for _ in range(3):  # the server goes on serving; its handling of the closed socket is done by then
        assert _post(embedded_server, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
    log = _new_log(embedded_server, since)
    assert "Traceback" not in log and "ClientDisconnect" not in log


def test_a_request_template_runs_only_when_the_server_allows_it(start_embedded_server):
    server = start_embedded_server(allow_request_chat_template=True)
    body = {"messages": [{"role": "user", "content": "ignored"}], "max_tokens": 1, "temperature": 0,
            "chat_template_kwargs": {"chat_template": "{{ bos_token }}Q{{ '<|assistant|>' }}"}}
    response = _post(server, "/v1/chat/completions", body)
    assert response.status_code == 200 and response.json()["usage"]["prompt_tokens"] == 3
    broken = {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"chat_template": "{{ nothing() }}"}}
    for path in ("/v1/chat/completions", "/tokenize"):  # the same rendering for both: a failing template is a 400
        failed = _post(server, path, broken)
        assert failed.status_code == 400 and "messages: the chat template failed" in failed.text, (path, failed.text)


# -- the engine imports the installed sparkit, whatever the working directory ------------------------------


def test_up_from_a_directory_holding_a_sparkit_folder(sparkit_home, tmp_path, monkeypatch):
    """`python -m` puts the working directory first on sys.path: a `sparkit/` there used to be what
    the engine imported (/server_info answered 500). The adapter launches it with -P."""
    import sparkit
    from sparkit.runs import free_port

    fake = tmp_path / "project"
    (fake / "sparkit" / "engines").mkdir(parents=True)
    (fake / "sparkit" / "__init__.py").write_text("raise ImportError('the fake sparkit was imported')\n")
    (fake / "sparkit" / "engines" / "__init__.py").write_text("")
    monkeypatch.chdir(fake)
    plan = sparkit.compile_plan(sparkit.load_recipe("tiny/tiny-baseline"), port=free_port())
    assert plan.argv[1:4] == ["-P", "-m", "sparkit.engines.embedded"]
    with sparkit.transient_server(plan) as started:
        info = httpx.get(started.server.url + "/server_info", timeout=30)
        assert info.status_code == 200 and info.json()["version"] == sparkit.__version__
