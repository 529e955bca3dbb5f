"""Issue 40, items 2, 4, 9 and 11, and issue 37, item 4's Content-Type: the embedded server against
a hostile or unusual client, each attack performed for real on a real server process over real
sockets.

2. A grammar that takes most of an hour to compile (a 1.1 MB alternation regex, a 20,000-property
   schema) held a thread of the default executor each, past the client's leaving: eight of them
   left every later chat timing out while /health said OK.
9. One n=20 request held the engine for as long as it took; a rid prefix aborted other clients'
   requests on a keyless server.
11. A field name holding CR LF or NUL dropped the connection (it went into a header).
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import psutil
import pytest

pytestmark = pytest.mark.e2e

HUGE_REGEX = "|".join(f"word{i}x" for i in range(110_000))  # 1.2 MB: most of an hour of xgrammar here
WIDE_SCHEMA = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20_000)}}
CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0}


def port_of(server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def compile_children(server) -> list[psutil.Process]:
    """The server's grammar-compile processes: the children of its multiprocessing forkserver."""
    out = []
    for proc in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            if "multiprocessing.forkserver" in " ".join(proc.cmdline()):
                out += proc.children()
        except psutil.NoSuchProcess:
            pass
    return out


def wait_for(condition, what: str, timeout: float = 120):
    """Poll `condition` until it holds (a bound that only tells a hang from progress)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def test_grammars_too_large_to_compile_are_refused_at_once_and_chats_go_on(start_embedded_server):
    server = start_embedded_server()
    bodies = [{**CHAT, "regex": HUGE_REGEX}, {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "wide", "schema": WIDE_SCHEMA}}}] * 4
    answers: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda b=b: answers.append(
        httpx.post(server.url + "/v1/chat/completions", json=b, timeout=300))) for b in bodies]
    for thread in threads:
        thread.start()
    chat = httpx.post(server.url + "/v1/chat/completions", json=CHAT, timeout=300)
    for thread in threads:
        thread.join(300)
    assert chat.status_code == 200 and chat.json()["choices"][0]["finish_reason"] == "length"
    assert sorted(a.status_code for a in answers) == [400] * 8
    params = sorted({a.json()["param"] for a in answers})
    assert params == ["regex", "response_format"], params
    messages = {a.json()["message"] for a in answers}
    assert any("1208889 characters; this server compiles grammars of at most 65536" in m for m in messages), messages
    assert any("json_schema: 588924 characters" in m for m in messages), messages  # the size comes first
    assert compile_children(server) == []  # nothing was compiled at all


def test_a_compile_past_its_time_is_killed_and_neither_chats_nor_health_wait_for_it(start_embedded_server):
    """The size cap lifted: eight 1.2 MB regexes (two distinct ones) really compile. Each gets
    SGLang's timeout error after 5 s, its process killed (the repeats the remembered error at
    once); the chat sent meanwhile is answered before they end, /health says 200, and a grammar
    that compiles still works after."""
    server = start_embedded_server(grammar_max_chars=2_000_000, grammar_compile_timeout=5, grammar_compile_workers=1)
    answers: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda i=i: answers.append(httpx.post(
        server.url + "/v1/chat/completions", json={**CHAT, "regex": HUGE_REGEX + f"|v{i % 2}"}, timeout=300)))
        for i in range(8)]
    for thread in threads:
        thread.start()
    wait_for(lambda: compile_children(server), "a compile to start")
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
    chat = httpx.post(server.url + "/v1/chat/completions", json=CHAT, timeout=300)
    assert chat.status_code == 200
    assert any(t.is_alive() for t in threads), "the compiles ended before the chat: the test proved nothing"
    for thread in threads:
        thread.join(300)
    assert [a.status_code for a in answers] == [400] * 8
    assert all("Grammar preprocessing timed out" in a.json()["message"] for a in answers)
    assert all(a.json()["param"] == "regex" for a in answers)
    log = server.log()
    assert log.count("killed compiles that ran past --grammar-compile-timeout 5 s") == 1  # one line per cause
    assert "Traceback" not in log
    ok = httpx.post(server.url + "/v1/chat/completions", json={**CHAT, "regex": "(yes|no)"}, timeout=300)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] in ("yes", "no")
    helpers = psutil.Process(server.proc.pid).children(recursive=True)  # the forkserver, its compile child
    assert compile_children(server)
    server.stop()  # SIGTERM, as `sparkit down` sends it: no compile process outlives the server
    _, alive = psutil.wait_procs(helpers, timeout=60)
    assert not alive, alive


def test_a_client_that_leaves_has_its_compile_killed(start_embedded_server):
    server = start_embedded_server(grammar_max_chars=2_000_000, grammar_compile_workers=1)  # 30 s limit
    body = json.dumps({**CHAT, "regex": HUGE_REGEX}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port_of(server)}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=60) as sock:
        sock.sendall(head + body)
        child = wait_for(lambda: compile_children(server), "the compile to start")[0]
    # the client is gone; the compile that would have run 30 s (and the regex most of an hour) stops
    wait_for(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, "the compile to be killed", 25)
    wait_for(lambda: "abandoned compiles whose client left" in server.log(), "the log line")
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200


def test_one_request_cannot_hold_the_engine_past_its_running_timeout(start_embedded_server):
    """At >= 50 ms a step, 400 tokens are >= 20 s and n=20 x 100 tokens (16 decoded together, then 4)
    >= 10 s of work;
    --request-running-timeout 3 ends each (SGLang's 503 and message: the stream's error event,
    the whole reply's status), and a chat sent behind the n=20 is served."""
    server = start_embedded_server(debug_step_delay_ms=50, request_running_timeout=3)
    long = {"text": "count: one", "stream": True, "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
    with httpx.stream("POST", server.url + "/generate", json=long, timeout=300) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert events[-1]["error"]["code"] == 503 and "Request running timeout reached." in events[-1]["error"]["message"]
    assert 0 < events[-2]["meta_info"]["completion_tokens"] < 400  # cut while it generated
    big: dict = {}
    hog = threading.Thread(target=lambda: big.update(response=httpx.post(server.url + "/v1/chat/completions", json={
        **CHAT, "n": 20, "max_tokens": 100, "ignore_eos": True, "temperature": 1.0}, timeout=300)))
    hog.start()
    wait_for(lambda: httpx.get(server.url + "/server_info", timeout=30).json()["internal_states"][0]["#running-req"] >= 1,
             "the n=20 request to run")
    behind = httpx.post(server.url + "/v1/chat/completions", json=CHAT, timeout=300)
    hog.join(300)
    assert big["response"].status_code == 503 and "Request running timeout reached." in big["response"].json()["message"]
    assert behind.status_code == 200 and behind.json()["choices"][0]["finish_reason"] == "length"


def _chat_stream(server, out: dict, started: threading.Event) -> None:
    body = {**CHAT, "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                out.setdefault("id", chunk["id"])
                started.set()
                for choice in chunk["choices"]:
                    out["finish"] = choice["finish_reason"] or out.get("finish")


def test_a_rid_prefix_aborts_nobody_elses_request_on_a_keyless_server(start_embedded_server):
    server = start_embedded_server(debug_step_delay_ms=50)  # the stream runs >= 10 s unless aborted
    out: dict = {}
    started = threading.Event()
    client = threading.Thread(target=_chat_stream, args=(server, out, started))
    client.start()
    assert started.wait(120)
    for prefix in ("chatcmpl-", out["id"][:-1], "c"):
        assert httpx.post(server.url + "/abort_request", json={"rid": prefix}, timeout=30).status_code == 200
    if not client.is_alive():
        client.join()
        assert out.get("finish") != "abort", "another client's rid prefix aborted the stream"
        pytest.fail("the stream ended before the prefix aborts: the test proved nothing")
    own = httpx.post(server.url + "/abort_request", json={"rid": out["id"]}, timeout=30)  # the rid it was given
    client.join(300)
    assert own.status_code == 200 and out["finish"] == "abort"
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    assert "sglang:num_aborted_requests_total" in metrics


def test_the_key_holder_aborts_by_prefix_as_in_sglang(start_embedded_server):
    server = start_embedded_server(debug_step_delay_ms=50, env={"SPARKIT_API_KEY": "k1"})
    auth = {"Authorization": "Bearer k1"}
    body = {"text": "count: one", "rid": "job-7", "stream": True,
            "sampling_params": {"max_new_tokens": 300, "ignore_eos": True, "temperature": 0}}
    with httpx.stream("POST", server.url + "/generate", json=body, headers=auth, timeout=300) as response:
        lines = (line for line in response.iter_lines() if line.startswith("data: {"))
        next(lines)
        assert httpx.post(server.url + "/abort_request", json={"rid": "job-"}, headers=auth, timeout=30).status_code == 200
        last = json.loads(list(lines)[-1][6:])
    assert last["meta_info"]["finish_reason"]["type"] == "abort"


@pytest.mark.parametrize(("name", "shown"), [("a\r\nb", "a\\u000d\\u000ab"), ("a\x00b", "a\\u0000b"),
                                             ("é一", "\\u00e9\\u4e00"), ("x" * 100_000, "x" * 100 + "...")])
def test_any_field_name_gets_an_answer_with_a_safe_header(embedded_server, name, shown):
    body = json.dumps({**CHAT, "max_tokens": 1, name: 1})
    response = httpx.post(embedded_server.url + "/v1/chat/completions", content=body, timeout=120,
                          headers={"content-type": "application/json"})
    assert response.status_code == 200
    assert response.headers["x-sparkit-ignored-fields"] == shown


def test_state_changing_routes_refuse_get(embedded_server):
    """A web page's <img src=http://127.0.0.1:30000/start_profile> sends a GET with no Origin."""
    for path in ("/start_profile", "/stop_profile", "/flush_cache"):
        response = httpx.get(embedded_server.url + path, timeout=30)
        assert response.status_code == 405, path


def test_a_body_without_content_type_is_served_when_no_browser_sent_it(embedded_server):
    """litellm's ollama/ and ollama_chat/ providers post JSON with no Content-Type (real Ollama and
    SGLang's /api/* take it); a browser always sends an Origin with a POST, and is still refused."""
    body = json.dumps({"model": _name(embedded_server), "messages": [{"role": "user", "content": "Hello"}],
                       "stream": False, "options": {"num_predict": 4}})
    plain = httpx.post(embedded_server.url + "/api/chat", content=body, timeout=120)
    assert "content-type" not in plain.request.headers
    assert plain.status_code == 200 and plain.json()["done"]
    page = httpx.post(embedded_server.url + "/api/chat", content=body, timeout=120, headers={"Origin": "http://evil.example"})
    assert page.status_code == 403
    fetched = httpx.post(embedded_server.url + "/api/chat", content=body, timeout=120, headers={"Sec-Fetch-Mode": "no-cors"})
    assert fetched.status_code == 415


def _name(server) -> str:
    return httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
