"""Continuous batching on the embedded engine, against real server processes (issue 37, item 1).

Concurrent requests decode together, with and without NEXTN, and each gets byte for byte (its
logprobs to the last bit) what it gets served alone; seeded sampling too. --max-running-requests
caps the batch (the server's own "Decode batch." lines, one per step here, count it), and a long
prompt is prefilled a chunk at a time, each chunk followed by a step of the running stream.
Everything is asserted from what the server logs and answers, counted in steps, never timed.
"""

from __future__ import annotations

import re
import threading

import httpx
import pytest

from _engine_fixtures import launch_embedded_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STACK = {"expert_weights": "fp8", "lm_head_dtype": "fp8", "decode_log_interval": 1}
NEXTN = {"speculative_algorithm": "NEXTN", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
         "speculative_num_draft_tokens": 4}
LONG_PROMPT = ("The report said that the river had risen again in the night, and the people of the town went out "
               "to look at it in the morning. ") * 3  # longer than the default 256-token prefill chunk

# prompts of different lengths, each with its own stop rules and length (SGLang's sampling params)
REQUESTS = [
    ("Once upon a time, there was a little", {"max_new_tokens": 48}),
    ("count: one two three", {"max_new_tokens": 64, "ignore_eos": True}),
    ("The capital of France is", {"max_new_tokens": 17, "stop": [".", "\n"]}),
    ("def add(a, b):", {"max_new_tokens": 40, "stop": ["return"], "no_stop_trim": True}),
    ("Q: What is 12 + 7? A:", {"max_new_tokens": 5}),
    ("hello, how are you today?", {"max_new_tokens": 30, "stop_token_ids": [10]}),
    ("user: tell me a joke", {"max_new_tokens": 64, "ignore_eos": True}),
    ("1, 2, 3, 4,", {"max_new_tokens": 24, "ignore_eos": True}),
    ("In the morning, the baker", {"max_new_tokens": 1}),
    (LONG_PROMPT, {"max_new_tokens": 20, "ignore_eos": True}),
]


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("batching-servers")
    started = {}
    try:
        started["plain"] = launch_embedded_server(log_dir, model_path=tiny_model_dir, **STACK)
        started["nextn"] = launch_embedded_server(log_dir, model_path=tiny_model_dir, **STACK, **NEXTN)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield started
    for server in started.values():
        server.stop()


def _body(prompt: str, sampling: dict, **extra) -> dict:
    return {"text": prompt, "sampling_params": {"temperature": 0.0, **sampling}, "return_logprob": True,
            "top_logprobs_num": 2, **extra}


def _answer(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    body = response.json()
    meta = body["meta_info"]
    return {"text": body["text"], "ids": body["output_ids"], "finish": meta["finish_reason"],
            "logprobs": meta["output_token_logprobs"], "top": meta["output_top_logprobs"]}


def _alone_then_together(server, bodies: list[dict]) -> tuple[list[dict], list[dict], str]:
    """Each body alone (one after another), then all at once; and the log of the second part."""
    with httpx.Client(base_url=server.url, timeout=600) as client:
        alone = [_answer(client.post("/generate", json=body)) for body in bodies]
    start = len(server.log())
    together: list[dict | None] = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def send(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=600) as client:
            barrier.wait()
            together[i] = _answer(client.post("/generate", json=bodies[i]))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert None not in together
    return alone, together, server.log()[start:]


def _running(log: str) -> list[int]:
    return [int(n) for n in re.findall(r"^Decode batch\. #running-req: (\d+)", log, re.M)]


@pytest.mark.parametrize("stack", ["plain", "nextn"])
def test_concurrent_greedy_requests_decode_together_and_get_what_they_get_alone(servers, stack):
    server = servers[stack]
    bodies = [_body(prompt, sampling) for prompt, sampling in REQUESTS]
    alone, together, log = _alone_then_together(server, bodies)
    assert max(_running(log)) >= 5, "the requests were not decoded together"
    for i, (one, batched) in enumerate(zip(alone, together)):
        assert batched == one, f"request {i} ({REQUESTS[i][0][:30]!r}) differs when batched"
    finishes = {one["finish"]["type"] for one in alone}
    assert finishes >= {"length", "stop"}  # stop strings and max_tokens both ended requests
    if stack == "nextn":
        assert "accept len:" in log


@pytest.mark.parametrize("stack", ["plain", "nextn"])
def test_seeded_sampling_gives_the_same_tokens_alone_and_batched(servers, stack):
    server = servers[stack]
    bodies = [_body(prompt, {"temperature": 0.9, "top_p": 0.95, "max_new_tokens": 32, "ignore_eos": True,
                             "sampling_seed": 100 + i})
              for i, (prompt, _) in enumerate(REQUESTS[:8])]
    alone, together, log = _alone_then_together(server, bodies)
    assert max(_running(log)) >= 4
    assert together == alone
    assert len({tuple(one["ids"]) for one in alone}) == len(alone)  # sampled, and each its own


def test_max_running_requests_caps_the_batch_and_the_rest_wait_their_turn(tiny_model_dir, tmp_path):
    server = launch_embedded_server(tmp_path, model_path=tiny_model_dir, max_running_requests=3, **STACK)
    try:
        for route in ("/server_info", "/get_server_info"):
            info = httpx.get(server.url + route, timeout=30).json()
            assert info["max_running_requests"] == 3 and info["internal_states"][0]["effective_max_running_requests_per_dp"] == 3
            assert info["chunked_prefill_size"] == 256 and info["schedule_policy"] == "fcfs"
        bodies = [_body(prompt, {"max_new_tokens": 24, "ignore_eos": True}) for prompt, _ in REQUESTS[:7]]
        alone, together, log = _alone_then_together(server, bodies)
    finally:
        server.stop()
    running = _running(log)
    assert max(running) == 3, f"at most 3 running, the server logged {sorted(set(running))}"
    queued = [int(n) for n in re.findall(r"^Decode batch\..*#queue-req: (\d+)", log, re.M)]
    assert max(queued) >= 1  # the others waited
    assert together == alone and all(len(one["ids"]) == 24 for one in together)


def test_a_long_prompt_is_prefilled_a_chunk_per_step_of_the_running_stream(tiny_model_dir, tmp_path):
    """A stream runs; a 600-token prompt arrives. Between two of its 32-token chunks the stream
    takes exactly one decode step: it never waits behind more than one chunk."""
    server = launch_embedded_server(tmp_path, model_path=tiny_model_dir, chunked_prefill_size=32, **STACK)
    streamed = threading.Event()
    try:
        def stream() -> None:
            body = {"text": "count: one", "stream": True, "sampling_params": {"temperature": 0.0, "max_new_tokens": 300,
                                                                             "ignore_eos": True}}
            with httpx.stream("POST", server.url + "/generate", json=body, timeout=600) as response:
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        streamed.set()

        runner = threading.Thread(target=stream)
        runner.start()
        assert streamed.wait(300)
        start = len(server.log())
        long_ids = httpx.post(server.url + "/tokenize", json={"prompt": "x" * 600}, timeout=60).json()["tokens"]
        long = httpx.post(server.url + "/generate", json={"input_ids": long_ids, "sampling_params": {"max_new_tokens": 1}},
                          timeout=600)
        assert long.status_code == 200
        runner.join(600)
    finally:
        server.stop()
    lines = [line for line in server.log()[start:].splitlines() if line.startswith(("Prefill batch.", "Decode batch."))]
    prefills = [i for i, line in enumerate(lines) if line.startswith("Prefill batch.")]
    chunks = [int(re.search(r"#new-token: (\d+)", lines[i]).group(1)) for i in prefills]
    assert sum(chunks) == len(long_ids) and max(chunks) == 32 and len(chunks) == -(-len(long_ids) // 32)
    for here, there in zip(prefills, prefills[1:]):
        between = lines[here + 1 : there]
        assert between == [b for b in between if b.startswith("Decode batch. #running-req: 1,")] and len(between) == 1, \
            f"the stream took {len(between)} steps between two chunks"
