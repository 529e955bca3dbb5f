"""How fast is the `sparkit eval gsm8k` harness itself?

Starts a loopback HTTP server (in a child process, stdlib only) that answers every request at
once, speaking SGLang's /v1/chat/completions (streamed, with usage) and /generate, then times
`sparkit eval gsm8k` over all 1319 test questions at --concurrency 16 in both formats. What is
measured is the client: prompt building, HTTP, extraction, the per-question JSONL append and the
summary. A real engine is thousands of times slower per question, so this must be seconds.

    python benchmarks/eval_harness_speed.py [--data ../shared/data/gsm8k/test.jsonl] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
REPLY = "Half of 48 is 24, and 48 + 24 = 72.\nThe answer is 72."
REPLY_TOKENS = 20


class InstantHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real server

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path in ("/server_info", "/get_server_info"):
            self._send(json.dumps({"model_path": "instant", "served_model_name": "instant", "tp_size": 1}).encode())
        elif self.path == "/v1/models":
            self._send(json.dumps({"data": [{"id": "instant"}]}).encode())
        elif self.path == "/health":
            self._send(b"{}")
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))  # drained: the reply is the same for any request
        meta = {"prompt_tokens": 500, "completion_tokens": REPLY_TOKENS, "finish_reason": {"type": "stop"}}
        if self.path == "/generate":
            self._send(json.dumps({"text": REPLY, "meta_info": meta}).encode())
        elif self.path == "/v1/chat/completions":
            events = [
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": REPLY}, "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                {"choices": [], "usage": {"prompt_tokens": 500, "completion_tokens": REPLY_TOKENS}},
            ]
            stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            self._send(stream.encode(), "text/event-stream")
        else:
            self.send_error(404)


def serve(port: int) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", port), InstantHandler)
    server.daemon_threads = True
    server.serve_forever()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"instant server did not come up on port {port}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return

    port = _free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)], start_new_session=True)
    try:
        _wait_up(port)
        with tempfile.TemporaryDirectory(prefix="sparkit-eval-bench-") as tmp:
            env = {**os.environ, "SPARKIT_HOME": tmp}
            for fmt in ("chat", "completion"):
                out = Path(tmp) / f"{fmt}.jsonl"
                cmd = [sys.executable, "-m", "sparkit", "eval", "gsm8k", "--url", f"http://127.0.0.1:{port}",
                       "--data", str(args.data), "--format", fmt, "--concurrency", str(args.concurrency),
                       "--out", str(out), "--json"]
                t0 = time.perf_counter()
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, start_new_session=True)
                wall = time.perf_counter() - t0
                if done.returncode != 0:
                    raise SystemExit(f"sparkit eval failed ({done.returncode}):\n{done.stderr[-3000:]}")
                summary = json.loads(done.stdout)
                print(
                    f"{fmt:10s} {summary['n']} questions at --concurrency {args.concurrency}: "
                    f"{wall:.2f} s end to end (process start included), {summary['wall_s']:.2f} s in the request loop, "
                    f"{summary['n'] / summary['wall_s']:.0f} questions/s; accuracy {100 * summary['accuracy']['flexible']['value']:.2f}% "
                    f"(the instant server always says 72)"
                )
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
