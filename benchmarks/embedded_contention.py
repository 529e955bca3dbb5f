"""tiny-ling's build, and the embedded engine's decode speed idle vs beside busy processes.

    python3 benchmarks/embedded_contention.py [--rounds 3] [--tokens 128] [--threads 1,2] [--busy 0,1,2]

Prints the shipped build's figures (steps, loss, quality gate), then starts one real embedded
server per thread setting (the default recipe's stack: fp8 experts, FP8 lm_head, NEXTN 3/1/4)
and measures batch-1 greedy decode tok/s (completion tokens / (latency - TTFT), streamed
/generate) with 0, 1 and 2 CPU-bound processes (`while True: pass`) running beside them. Cells
are interleaved: every round visits every (busy, threads) cell, servers in rotating order, so a
drift of the machine's own load falls on all of them. Printed: the median per cell and its ratio
to the same server idle. `--torch-threads` auto picks 1 for tiny-ling
(sparkit.engines.embedded.loading.auto_torch_threads); 2 is what torch chooses on a 2-core machine.
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: Path, threads: int, log_dir: Path):
    import httpx

    port = free_port()
    argv = [sys.executable, "-m", "sparkit.engines.embedded", "--model-path", str(model), "--port", str(port),
            "--device", "cpu", "--expert-weights", "fp8", "--lm-head-dtype", "fp8", "--speculative-algorithm", "NEXTN",
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
            "--torch-threads", str(threads)]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = str(REPO)
    log = open(log_dir / f"server-{threads}.log", "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server (threads {threads}) exited; see {log_dir}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"server (threads {threads}) did not become healthy")


def decode_tok_s(url: str, tokens: int) -> float:
    import httpx

    first = None
    count = 0
    with httpx.stream("POST", url + "/generate", timeout=300, json={
        "text": "Count: 1 2 3", "stream": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": tokens, "ignore_eos": True},
    }) as response:
        for line in response.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            if first is None:
                first = time.perf_counter()
            count = json.loads(line[5:])["meta_info"]["completion_tokens"]
    end = time.perf_counter()
    return (count - 1) / (end - first) if first and end > first and count > 1 else float("nan")


def main() -> int:
    from sparkit.models.builder import builtin_model_dir
    from sparkit.models.checkpoint import read_marker

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--busy", default="0,1,2")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    model = builtin_model_dir()
    marker = read_marker(model) or {}
    quality = marker.get("quality", {})
    print(f"tiny-ling build: {marker.get('steps')} steps, seed {marker.get('seed')}, builder v{marker.get('builder_version')}, "
          f"final train loss {marker.get('final_loss')}, held-out loss {quality.get('heldout_loss')}, "
          f"NEXTN 3/1/4 accept length {quality.get('accept_length')}, greetings answered "
          f"{quality.get('greetings', 0) - len(quality.get('unanswered_greetings', []))}/{quality.get('greetings')}, "
          f"built in {marker.get('train_seconds')} s ({model})")
    threads = [int(t) for t in args.threads.split(",")]
    busy_levels = [int(b) for b in args.busy.split(",")]
    log_dir = Path(tempfile.mkdtemp(prefix="contention-"))
    servers = {t: start_server(model, t, log_dir) for t in threads}
    samples: dict[tuple[int, int], list[float]] = {(b, t): [] for b in busy_levels for t in threads}
    try:
        for url in (u for _, u in servers.values()):
            decode_tok_s(url, 16)  # warm-up
        for round_index in range(args.rounds):
            for b in busy_levels:
                hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(b)]
                try:
                    time.sleep(0.5)
                    order = threads[round_index % len(threads):] + threads[: round_index % len(threads)]
                    for t in order:
                        samples[(b, t)].append(decode_tok_s(servers[t][1], args.tokens))
                finally:
                    for hog in hogs:
                        hog.kill()
                        hog.wait()
    finally:
        for proc, _ in servers.values():
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    print(f"\ndecode tok/s (median of {args.rounds}; {args.tokens} tokens, greedy, NEXTN 3/1/4, FP8 head + experts; "
          f"{os.cpu_count()} CPUs)")
    print(f"{'torch threads':>14} " + " ".join(f"{f'+{b} busy':>16}" for b in busy_levels))
    table = {}
    for t in threads:
        idle = statistics.median(samples[(busy_levels[0], t)])
        cells = []
        for b in busy_levels:
            med = statistics.median(samples[(b, t)])
            table[f"threads={t},busy={b}"] = {"median_tok_s": med, "samples": samples[(b, t)], "ratio_to_idle": med / idle}
            cells.append(f"{med:7.1f} ({med / idle:4.2f}x)")
        print(f"{t:>14} " + " ".join(f"{c:>16}" for c in cells))
    if args.json:
        Path(args.json).write_text(json.dumps({"build": marker, "cells": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
