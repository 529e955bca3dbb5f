"""Can `sparkit chat` keep up with a fast server, and does it report speed honestly?

Starts a synthetic SSE server (a real HTTP server in a child process, loopback
only) that streams an OpenAI chat completion at a fixed token rate, drives the
chat app headless (App.run_test) against it, and prints for each reply:

- the stream rate the server achieved (its own send timestamps),
- the decode tok/s the app shows (arrival timestamps in the client) and the ratio,
- the time from the last token's arrival to the final text painted on screen.

    python benchmarks/chat_stream.py --rate 1500 --tokens 3000 --replies 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = "the quick brown fox jumps over a lazy dog while speculative decoding commits several tokens".split()


def synthetic_tokens(n: int, list_every: int = 12) -> list[str]:
    """Markdown-shaped text: paragraphs, a list and a fenced code block, one token per word.
    list_every: a list item every N tokens in the list sections (0: no lists, prose and code only)."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        section = (i // 120) % 4
        word = WORDS[i % len(WORDS)]
        if section == 2 and i % 120 == 0:
            out.append("\n\n```python\n")
        elif section == 2:
            out.append(f"x_{i} = {i}\n" if i % 6 == 0 else f"{word} ")
        elif section == 3 and i % 120 == 0:
            out.append("\n```\n\n")
        elif section == 1 and list_every and i % list_every == 0:
            out.append(f"\n- item {i}: ")
        elif i % 60 == 0:
            out.append("\n\n")
        else:
            out.append(f"{word} ")
        i += 1
    return out[:n]


# ---------------------------------------------------------------------------- the server
async def _serve(port: int, rate: float, tokens_per_chunk: int, list_every: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request_line = await reader.readline()
                if not request_line:
                    return
                method, path, _ = request_line.decode().split(" ", 2)
                length = 0
                while True:
                    header = await reader.readline()
                    if header in (b"\r\n", b"\n", b""):
                        break
                    name, _, value = header.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value.strip())
                body = json.loads(await reader.readexactly(length)) if length else {}
                if path.startswith("/v1/chat/completions"):
                    await stream(writer, body)
                    return
                payload = {"/health": {}, "/server_info": {
                    "served_model_name": "synthetic", "model_path": "synthetic-sse",
                    "speculative_algorithm": "EAGLE", "speculative_num_steps": 3}}.get(path)
                status = "200 OK" if payload is not None else "404 Not Found"
                data = json.dumps(payload or {}).encode()
                writer.write(f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n".encode() + data)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def stream(writer: asyncio.StreamWriter, body: dict) -> None:
        n = int(body.get("max_tokens") or 1000)
        continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        pieces = synthetic_tokens(n, list_every)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n")
        await asyncio.sleep(0.02)  # a fixed "prefill"
        t0 = time.perf_counter()
        sent_first = sent_last = None
        i = 0
        while i < n:
            due = int((time.perf_counter() - t0) * rate) + 1  # tokens due by now (absolute schedule)
            while i < min(due, n):
                text = "".join(pieces[i:i + tokens_per_chunk])
                i += tokens_per_chunk
                chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
                if continuous:  # what SGLang sends with stream_options.continuous_usage_stats
                    chunk["usage"] = {"prompt_tokens": 10, "completion_tokens": min(i, n), "total_tokens": 10 + min(i, n)}
                writer.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                now = time.perf_counter()
                sent_first = sent_first or now
                sent_last = now
            await writer.drain()
            next_due = t0 + (i / rate)
            await asyncio.sleep(max(0.0, next_due - time.perf_counter()))
        steps = -(-n // tokens_per_chunk)
        final = {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": n + 10},
            "sglext": {"spec_tokens_details": {"spec_verify_ct": steps}},
            "synthetic": {"first_sent": sent_first, "last_sent": sent_last, "tokens": n},
        }
        writer.write(b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n")
        await writer.drain()
        with open(os.environ["SYNTHETIC_LOG"], "a") as log:
            log.write(json.dumps(final["synthetic"]) + "\n")

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(rate: float, tokens_per_chunk: int, log: Path, list_every: int = 12) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, SYNTHETIC_LOG=str(log))
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--rate", str(rate), "--tokens-per-chunk", str(tokens_per_chunk),
         "--list-every", str(list_every)],
        env=env, start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("synthetic server did not start")


# ---------------------------------------------------------------------------- the app, headless
async def drive(url: str, tokens: int, replies: int) -> list:
    from sparkit.tui.app import create_app
    from sparkit.tui.settings import ChatSettings

    home = Path(tempfile.mkdtemp(prefix="chat-bench-"))
    app = create_app(url, store_path=home / "chat.sqlite3", settings=ChatSettings(max_tokens=tokens), health_interval=None)
    async with app.run_test(size=(140, 45)) as pilot:
        for k in range(replies):
            app.reply_finished.clear()
            await app.send(f"reply {k}: stream {tokens} tokens")
            await asyncio.wait_for(app.reply_finished.wait(), timeout=120)
            await pilot.pause()
            view = app.message_views()[-1]
            assert view.markdown.source == view.content, "final text not on screen"
        return list(zip(app.finished_replies, app.display_latencies))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=1500.0, help="tokens per second the server sends")
    parser.add_argument("--tokens", type=int, default=3000, help="tokens per reply")
    parser.add_argument("--replies", type=int, default=3)
    parser.add_argument("--tokens-per-chunk", type=int, default=1, help="tokens per SSE event (>1 mimics speculative chunks)")
    parser.add_argument("--list-every", type=int, default=12,
                        help="a list item every N tokens in list sections (0: prose and code only); lists cost Textual most")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve, args.rate, args.tokens_per_chunk, args.list_every))
        return
    os.environ.setdefault("SPARKIT_HOME", tempfile.mkdtemp(prefix="chat-bench-home-"))
    log = Path(tempfile.mkdtemp(prefix="chat-bench-log-")) / "sent.jsonl"
    proc, url = start_server(args.rate, args.tokens_per_chunk, log, args.list_every)
    try:
        results = asyncio.run(drive(url, args.tokens, args.replies))
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=10)
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    load = os.getloadavg()[0]
    print(f"synthetic SSE server: target {args.rate:.0f} tok/s, {args.tokens} tokens/reply, "
          f"{args.tokens_per_chunk} token(s)/event, list item every {args.list_every or 'never'} tokens, "
          f"{args.replies} replies; {os.cpu_count()} CPUs, load average {load:.1f} at the end")
    print(f"{'reply':>5} {'server sent tok/s':>18} {'app shows tok/s':>16} {'shown/true':>11} {'tokens shown':>13} {'last token -> final text on screen':>34}")
    ratios, latencies = [], []
    for k, ((reply, latency), s) in enumerate(zip(results, sent)):
        true_rate = (s["tokens"] - 1) / (s["last_sent"] - s["first_sent"])
        shown = reply.decode_tok_s or 0.0
        ratios.append(shown / true_rate)
        latencies.append(latency * 1000)
        print(f"{k:>5} {true_rate:>18.1f} {shown:>16.1f} {shown / true_rate:>11.4f} {reply.output_tokens:>13} {latency * 1000:>31.1f} ms")
    print(f"median shown/true {statistics.median(ratios):.4f}; worst last-token->screen {max(latencies):.1f} ms "
          f"(target < 100 ms)")


if __name__ == "__main__":
    main()
