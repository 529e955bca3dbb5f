"""Continuous batching on the embedded engine: 8 concurrent requests against the same 8 sequential.

    python3 benchmarks/embedded_batching.py [--requests 8] [--tokens 64] [--rounds 3]
                                            [--max-running-requests N] [--json FILE]

Starts one real embedded server per stack (the default recipe's: fp8 experts and an FP8 lm_head,
with and without NEXTN 3/1/4) and sends the same 8 greedy /generate requests (different prompts,
`max_new_tokens` 64, `ignore_eos`) first one after another, then all at once, in alternating order
over the rounds (so a drift of the machine's load falls on both). Printed side by side, per stack:
aggregate tok/s (completion tokens of all 8 / wall time from the first send to the last reply),
per-request latency (median and max), the speedup of concurrent over sequential, and whether each
request's text was the same in both modes (greedy: it must be). The load average is printed with
the figures: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROMPTS = [
    "Once upon a time, there was a little",
    "count: one two three",
    "The capital of France is",
    "def add(a, b):",
    "Q: What is 12 + 7? A:",
    "hello, how are you today?",
    "Write a short poem about the sea.",
    "The quick brown fox",
    "List three colours:",
    "In the morning, the baker",
    "user: tell me a joke",
    "1, 2, 3, 4,",
]

STACKS = {
    "plain": [],
    "nextn": ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
              "--speculative-num-draft-tokens", "4"],
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: Path, stack: str, log_dir: Path, extra: list[str]):
    import httpx

    port = free_port()
    argv = [sys.executable, "-m", "sparkit.engines.embedded", "--model-path", str(model), "--port", str(port),
            "--device", "cpu", "--expert-weights", "fp8", "--lm-head-dtype", "fp8", *STACKS[stack], *extra]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    log = open(log_dir / f"server-{stack}.log", "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the {stack} server exited; see {log_dir}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"the {stack} server did not become healthy; see {log_dir}")


def one_request(client, url: str, prompt: str, tokens: int) -> tuple[float, int, str]:
    started = time.perf_counter()
    response = client.post(url + "/generate", json={
        "text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": tokens, "ignore_eos": True}})
    response.raise_for_status()
    body = response.json()
    return time.perf_counter() - started, body["meta_info"]["completion_tokens"], body["text"]


def run_round(url: str, prompts: list[str], tokens: int, concurrent: bool) -> dict:
    import httpx

    results: list[tuple[float, int, str] | None] = [None] * len(prompts)
    with httpx.Client(timeout=600, limits=httpx.Limits(max_connections=len(prompts))) as client:
        started = time.perf_counter()
        if concurrent:
            def send(i: int) -> None:
                results[i] = one_request(client, url, prompts[i], tokens)

            threads = [threading.Thread(target=send, args=(i,)) for i in range(len(prompts))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        else:
            for i, prompt in enumerate(prompts):
                results[i] = one_request(client, url, prompt, tokens)
        wall = time.perf_counter() - started
    done = [r for r in results if r is not None]
    if len(done) != len(prompts):
        raise SystemExit("a request failed")
    total = sum(r[1] for r in done)
    return {"wall_s": wall, "tokens": total, "tok_s": total / wall, "latencies_s": [r[0] for r in done],
            "texts": [r[2] for r in done], "load": os.getloadavg()[0]}


def main() -> int:
    from sparkit.models.builder import builtin_model_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stacks", default="plain,nextn")
    parser.add_argument("--max-running-requests", type=int, default=None,
                        help="passed to the servers (default: the engine's own default)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    model = builtin_model_dir()
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]
    extra = ["--max-running-requests", str(args.max_running_requests)] if args.max_running_requests else []
    log_dir = Path(tempfile.mkdtemp(prefix="batching-"))
    stacks = args.stacks.split(",")
    report: dict = {"requests": args.requests, "tokens": args.tokens, "rounds": args.rounds, "cpus": os.cpu_count(),
                    "load_before": os.getloadavg()[0], "stacks": {}}
    print(f"{args.requests} greedy /generate requests of {args.tokens} tokens, sequential vs concurrent, "
          f"{args.rounds} rounds; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")
    for stack in stacks:
        proc, url = start_server(model, stack, log_dir, extra)
        try:
            one_request(__import__("httpx").Client(timeout=600), url, prompts[0], 8)  # warm-up
            rounds: dict[str, list[dict]] = {"sequential": [], "concurrent": []}
            for r in range(args.rounds):
                order = ("sequential", "concurrent") if r % 2 == 0 else ("concurrent", "sequential")
                for mode in order:
                    rounds[mode].append(run_round(url, prompts, args.tokens, mode == "concurrent"))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        report["stacks"][stack] = rounds
    report["load_after"] = os.getloadavg()[0]
    print(f"\n{'stack':<7} {'mode':<11} {'aggregate tok/s':>16} {'latency p50 s':>14} {'latency max s':>14} "
          f"{'load':>6} {'speedup':>8} {'same text':>10}")
    summary = {}
    for stack, rounds in report["stacks"].items():
        cells = {}
        for mode in ("sequential", "concurrent"):
            runs = rounds[mode]
            cells[mode] = {
                "tok_s": statistics.median(run["tok_s"] for run in runs),
                "p50": statistics.median(statistics.median(run["latencies_s"]) for run in runs),
                "max": statistics.median(max(run["latencies_s"]) for run in runs),
                "load": statistics.mean(run["load"] for run in runs),
            }
        same = all(run["texts"] == rounds["sequential"][0]["texts"] for mode in rounds for run in rounds[mode])
        speedup = cells["concurrent"]["tok_s"] / cells["sequential"]["tok_s"]
        for mode in ("sequential", "concurrent"):
            c = cells[mode]
            tail = f"{speedup:>7.2f}x {str(same):>10}" if mode == "concurrent" else ""
            print(f"{stack:<7} {mode:<11} {c['tok_s']:>16.1f} {c['p50']:>14.3f} {c['max']:>14.3f} {c['load']:>6.1f} {tail}")
        summary[stack] = {**cells, "speedup": speedup, "same_text": same}
    report["summary"] = summary
    print(f"\nmedians over {args.rounds} rounds; load average at the end {report['load_after']:.1f} "
          f"(the machine is shared: other jobs' load falls on both modes alike); server logs in {log_dir}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
