"""Issue 29, items 3-5: the embedded server against other local clients, each attack performed for
real on a real server process over real sockets.

3. Half-sent requests held forever (fds exhausted, a traceback per connection): a header and a
   body deadline, a connection limit, one log line per cause.
4. Work before validation: 100k one-character messages, 10^5 stop strings: refused by their
   counts before any work, at a cost in the server's CPU time that does not grow with them.
5. Other local clients: abort_all only for the key holder; a JSON content type required; a Host
   header the server does not listen on, and a browser Origin not allowed, refused; the
   server's own names and allowed origins (with CORS) served.
"""

from __future__ import annotations

import json
import resource
import socket
import threading
import time

import httpx
import psutil
import pytest

pytestmark = pytest.mark.e2e


def port_of(server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def raw(server, data: bytes, *, read: bool = True, timeout: float = 60) -> bytes:
    """Send bytes on a fresh connection; return what the server answered before closing."""
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=timeout) as sock:
        sock.sendall(data)
        if not read:
            return b""
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def wait_closed(sock: socket.socket, timeout: float) -> bytes | None:
    """What the server sent before closing `sock`, or None when it is still open after `timeout`
    (a bound that only tells a hang from a close: the header timeout under test is 2 s)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        return data


def cpu_seconds(server) -> float:
    times = psutil.Process(server.proc.pid).cpu_times()
    return times.user + times.system


# -- 3. half-sent requests ------------------------------------------------------------------------------------


def test_half_sent_requests_are_closed_and_the_connection_limit_holds(start_embedded_server):
    """96 half-sent requests against a limit of 32: the server stays within its limit, still answers
    a client that asks (`sparkit status` said `down`), and closes every half-sent one."""
    server = start_embedded_server(max_connections=32, header_timeout=30)
    partial = f"POST /generate HTTP/1.1\r\nHost: 127.0.0.1:{port_of(server)}\r\nContent-Type: application".encode()
    socks = []
    try:
        for _ in range(96):
            sock = socket.create_connection(("127.0.0.1", port_of(server)), timeout=60)
            sock.sendall(partial)
            socks.append(sock)
        health = httpx.get(server.url + "/health", timeout=30)  # during the flood, before any header deadline
        assert health.status_code == 200
        assert len(psutil.Process(server.proc.pid).net_connections("tcp")) <= 32 + 2  # the listener, the probe
        answers = [wait_closed(sock, 120) for sock in socks]
        assert None not in answers, "a half-sent request was held open"
        made_room = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        timed_out = [a for a in answers if a.startswith(b"HTTP/1.1 408")]
        assert len(made_room) >= 96 - 32 and len(made_room) + len(timed_out) == 96
        assert b"connection limit (32)" in made_room[0]
    finally:
        for sock in socks:
            sock.close()
    log = server.log()
    assert log.count("past --max-connections 32, closed the connections that waited longest") == 1  # one line per cause
    assert log.count("request headers did not arrive within 30 s") == 1
    assert "Traceback" not in log


def test_past_the_limit_with_every_connection_busy_a_new_one_is_refused(start_embedded_server):
    server = start_embedded_server(max_connections=2, debug_step_delay_ms=50, max_running_requests=1)
    # One request at a time (--max-running-requests 1): the first stream runs (its first chunk read),
    # the second waits in the queue (the server's own "Decode batch." line, every 40 steps, counts
    # it), and only then does the third connection come; the first runs >= 10 s after that line.
    started = threading.Event()
    busy = [threading.Thread(target=_stream_generate, args=(server, "busy0", {}),
                             kwargs={"max_new_tokens": 280, "started": started}),
            threading.Thread(target=_stream_generate, args=(server, "busy1", {}))]
    busy[0].start()
    assert started.wait(120)
    log_start = len(server.log())
    busy[1].start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "#queue-req: 1" not in server.log()[log_start:]:
        time.sleep(0.05)
    answer = raw(server, f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port_of(server)}\r\n\r\n".encode())
    for thread in busy:
        thread.join(300)
    assert answer.startswith(b"HTTP/1.1 503") and b"--max-connections" in answer
    assert server.log().count("every one of them busy with a request") == 1


def test_a_body_that_never_completes_gets_a_408(start_embedded_server):
    server = start_embedded_server(body_timeout=2)
    head = (f"POST /generate HTTP/1.1\r\nHost: 127.0.0.1:{port_of(server)}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n{\"text\": ").encode()
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=60) as sock:
        sock.sendall(head)
        answer = wait_closed(sock, 60)
    assert answer is not None and answer.startswith(b"HTTP/1.1 408")
    assert b"did not arrive within 2 s" in answer
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200


def test_at_the_file_limit_the_server_says_so_once_and_recovers(start_embedded_server):
    """The server's open-file limit lowered under it (as when the limit is reached): idle clients
    past it were 15,774 tracebacks; now one line, and the server answers once they are closed."""
    server = start_embedded_server(header_timeout=2)
    resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, (128, 128))
    socks = []
    try:
        for _ in range(300):
            try:
                sock = socket.create_connection(("127.0.0.1", port_of(server)), timeout=5)
            except OSError:
                break
            sock.sendall(b"GET /health HTTP/1.1\r\n")  # never finished
            socks.append(sock)
    finally:
        time.sleep(0.5)
        for sock in socks:
            sock.close()
    deadline = time.monotonic() + 120
    status = None
    while time.monotonic() < deadline:
        try:
            status = httpx.get(server.url + "/health", timeout=10).status_code
            if status == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    assert status == 200
    log = server.log()
    lines = [line for line in log.splitlines() if "Too many open files" in line]
    assert len(lines) == 1 and lines[0].startswith("server: socket.accept() out of system resource"), lines
    assert "Traceback" not in log


# -- 4. work before validation ------------------------------------------------------------------------------


def test_a_hundred_thousand_messages_are_refused_by_their_count_first(start_embedded_server):
    server = start_embedded_server()
    body = json.dumps({"messages": [{"role": "user", "content": "x"}] * 100_000, "max_tokens": 1})
    assert len(body) > 3_000_000
    before = cpu_seconds(server)
    response = httpx.post(server.url + "/v1/chat/completions", content=body, timeout=300,
                          headers={"content-type": "application/json"})
    spent = cpu_seconds(server) - before
    assert response.status_code == 400
    error = response.json()["error"]
    assert "messages: 100000 messages; this server takes at most" in error["message"] and error["param"] == "messages"
    assert spent < 3, f"{spent:.1f} s of the server's CPU for a refused request"


def test_a_hundred_thousand_stop_strings_are_refused_by_their_count_first(start_embedded_server):
    server = start_embedded_server()
    before = cpu_seconds(server)
    for path, body in (("/generate", {"text": "count: one two", "sampling_params": {"stop": [f"s{i}" for i in range(100_000)]}}),
                       ("/v1/completions", {"prompt": "count: one two", "stop": [f"s{i}" for i in range(100_000)]}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                 "stop": ["x" * 20_000]})):
        response = httpx.post(server.url + path, json=body, timeout=300)
        assert response.status_code == 400, response.text
        assert "stop" in response.json()["error"]["param"]
    assert cpu_seconds(server) - before < 3
    ok = httpx.post(server.url + "/generate", json={"text": "count: one two", "sampling_params": {
        "stop": [f"zz{i}" for i in range(64)], "max_new_tokens": 8, "temperature": 0}}, timeout=120)
    assert ok.status_code == 200  # 64 is allowed


# -- 5. other local clients --------------------------------------------------------------------------------


def _stream_generate(server, rid: str, out: dict, headers: dict | None = None, max_new_tokens: int = 40,
                     started: threading.Event | None = None) -> None:
    """One streamed /generate; out["finish"]: its finish reason. started is set at its first chunk,
    so that a test acts while the request runs, however long the loaded machine took to start it."""
    chunks = []
    with httpx.stream("POST", server.url + "/generate", json={"text": "count: one two three", "rid": rid, "stream": True,
                      "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0}},
                      headers=headers or {}, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks.append(line)
                if started is not None:
                    started.set()
    out["finish"] = json.loads(chunks[-1][6:])["meta_info"]["finish_reason"]


def test_abort_all_from_another_client_aborts_nothing_without_the_key(start_embedded_server):
    server = start_embedded_server(debug_step_delay_ms=50)
    out: dict = {}
    # a request of >= 6 s, under way before the abort is sent and still running once it is refused
    started = threading.Event()
    client = threading.Thread(target=_stream_generate, args=(server, "mine", out),
                              kwargs={"max_new_tokens": 120, "started": started})
    client.start()
    assert started.wait(120)
    other = httpx.post(server.url + "/abort_request", json={"abort_all": True}, timeout=30)
    assert client.is_alive(), "the stream ended before the abort was refused: the test proved nothing"
    client.join(300)
    assert other.status_code == 403 and "API key" in other.json()["message"]  # SGLang's flat error shape, as every route but /generate
    assert out["finish"]["type"] == "length"  # not aborted
    assert httpx.post(server.url + "/abort_request", json={"rid": "nobody-runs-this"}).status_code == 200


def test_the_key_holder_may_abort_all(start_embedded_server):
    server = start_embedded_server(debug_step_delay_ms=50, env={"SPARKIT_API_KEY": "k1"})
    auth = {"Authorization": "Bearer k1"}
    out: dict = {}
    # a request that runs >= 50 s unless aborted, and is under way before the aborts are sent
    started = threading.Event()
    client = threading.Thread(target=_stream_generate, args=(server, "mine", out, auth),
                              kwargs={"max_new_tokens": 1000, "started": started})
    client.start()
    assert started.wait(120)
    assert httpx.post(server.url + "/abort_request", json={"abort_all": True}, timeout=30).status_code == 401
    assert httpx.post(server.url + "/abort_request", json={"abort_all": True}, headers=auth, timeout=30).status_code == 200
    client.join(300)
    assert out["finish"]["type"] == "abort"


@pytest.fixture(scope="module")
def gated(tiny_model_dir, tmp_path_factory):
    from _engine_fixtures import launch_embedded_server

    server = launch_embedded_server(tmp_path_factory.mktemp("gated"), model_path=tiny_model_dir,
                                    allowed_origins="http://localhost:3000,chrome-extension://*")
    yield server
    server.stop()


GENERATE = {"text": "count: one two", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None])
def test_a_body_that_is_not_declared_json_is_refused(gated, content_type):
    """The simple requests a web page can send cross-origin without asking (text/plain, a form, a
    typeless Blob, whose fetch says Sec-Fetch-*) were parsed as JSON."""
    headers = {"content-type": content_type} if content_type else {"sec-fetch-mode": "no-cors", "sec-fetch-site": "cross-site"}
    response = httpx.post(gated.url + "/generate", content=json.dumps(GENERATE), headers=headers, timeout=60)
    assert response.status_code == 415
    assert "Content-Type: application/json" in response.json()["error"]["message"]
    assert httpx.post(gated.url + "/generate", json=GENERATE, timeout=60).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1:1", "attacker.localhost.evil:{port}"])
def test_a_host_the_server_does_not_listen_on_is_refused(gated, host):
    """DNS rebinding: a page at evil.example whose name now resolves to 127.0.0.1 sends Host: evil.example."""
    answer = raw(gated, f"GET /v1/models HTTP/1.1\r\nHost: {host.format(port=port_of(gated))}\r\nConnection: close\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 403") and b"is not an address this server listens on" in answer


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "LOCALHOST", "127.0.0.1"])
def test_the_servers_own_names_are_served(gated, host):
    answer = raw(gated, f"GET /v1/models HTTP/1.1\r\nHost: {host.format(port=port_of(gated))}\r\nConnection: close\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_a_browser_origin_is_refused_unless_allowed(gated):
    port = port_of(gated)
    evil = httpx.post(gated.url + "/generate", json=GENERATE, headers={"Origin": "http://evil.example"}, timeout=60)
    assert evil.status_code == 403 and "--allowed-origins" in evil.json()["error"]["message"]
    assert "access-control-allow-origin" not in evil.headers
    simple = httpx.post(gated.url + "/generate", content=json.dumps(GENERATE), timeout=60,
                        headers={"Origin": "http://evil.example", "content-type": "text/plain"})
    assert simple.status_code == 403
    for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}", "http://localhost:3000", "chrome-extension://abc"):
        ok = httpx.post(gated.url + "/generate", json=GENERATE, headers={"Origin": origin}, timeout=60)
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == origin, origin
    preflight = httpx.options(gated.url + "/v1/chat/completions", timeout=60, headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert httpx.options(gated.url + "/v1/chat/completions", timeout=60, headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}).status_code == 403
    assert httpx.post(gated.url + "/generate", json=GENERATE, headers={"Origin": "http://localhost:3001"}, timeout=60).status_code == 403


def test_origins_from_the_environment_are_allowed_like_ollama_origins(start_embedded_server):
    server = start_embedded_server(env={"SPARKIT_ALLOWED_ORIGINS": "https://app.example"})
    assert httpx.get(server.url + "/v1/models", headers={"Origin": "https://app.example"}, timeout=60).status_code == 200
    assert httpx.get(server.url + "/v1/models", headers={"Origin": "https://other.example"}, timeout=60).status_code == 403


def test_the_openai_client_reaches_the_server_by_each_loopback_name(gated):
    openai = pytest.importorskip("openai")
    port = port_of(gated)
    for base in (f"http://127.0.0.1:{port}/v1", f"http://localhost:{port}/v1"):
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
        reply = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert reply.choices[0].message.content is not None
