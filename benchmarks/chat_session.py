"""A scripted `sparkit chat` session (Textual's Pilot) against a live server; prints what the
screen showed and the reply figures, and saves an SVG screenshot.

    python3 benchmarks/chat_session.py URL OUT_PREFIX [--message TEXT ...] [--max-tokens N]

For each message: type it, send it, wait for the reply to finish, record the app's own figures
(decode tok/s, TTFT, output tokens, accept length, whether the count is the server's exact usage)
next to what the server itself reported (SGLang: the response's usage and `sglext` details).
Writes OUT_PREFIX.json and OUT_PREFIX.svg.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


async def session(url: str, messages: list[str], max_tokens: int, out_prefix: str, timeout: float) -> dict:
    from sparkit.tui.app import create_app
    from sparkit.tui.settings import ChatSettings

    store = Path(tempfile.mkdtemp(prefix="chat-session-")) / "chat.sqlite3"
    app = create_app(url, store_path=store, settings=ChatSettings(temperature=0.0, max_tokens=max_tokens))
    replies = []
    async with app.run_test(size=(130, 40)) as pilot:
        deadline = time.monotonic() + timeout
        while app.connection_state != "online":
            if time.monotonic() > deadline:
                raise SystemExit(f"chat never connected to {url}")
            await pilot.pause(0.05)
        for text in messages:
            app.reply_finished.clear()
            app.query_one("#prompt").focus()
            await pilot.press(*text)
            await pilot.press("enter")
            deadline = time.monotonic() + timeout
            while not app.reply_finished.is_set():
                if time.monotonic() > deadline:
                    raise SystemExit(f"no reply to {text!r} within {timeout:.0f} s")
                await pilot.pause(0.05)
            reply = app.finished_replies[-1]
            view = app.message_views()[-1]
            replies.append({
                "message": text, "reply": view.content, "status": view.status,
                "decode_tok_s": reply.decode_tok_s, "ttft_s": reply.ttft, "output_tokens": reply.output_tokens,
                "accept_length": reply.accept_length, "exact_count": reply.exact,
            })
        await pilot.pause(0.2)
        svg = app.export_screenshot()
        metrics_bar = str(app.query_one("#reply-metrics").render())
        panel = str(app.query_one("#server-text").render())
    Path(out_prefix + ".svg").write_text(svg)
    result = {"url": url, "replies": replies, "metrics_bar": metrics_bar, "server_panel": panel}
    Path(out_prefix + ".json").write_text(json.dumps(result, indent=1, default=str))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("out_prefix")
    parser.add_argument("--message", action="append", default=None)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    messages = args.message or ["Hello", "What is 12 plus 30?", "count: one two three"]
    result = asyncio.run(session(args.url, messages, args.max_tokens, args.out_prefix, args.timeout))
    for r in result["replies"]:
        accept = f"{r['accept_length']:.2f}" if r["accept_length"] else "-"
        print(f"{r['message']!r} -> {r['reply']!r}  [{r['status']}; {r['decode_tok_s']:.1f} tok/s, "
              f"TTFT {1000 * (r['ttft_s'] or 0):.0f} ms, {r['output_tokens']} tok (exact: {r['exact_count']}), accept {accept}]")
    print("metrics bar:", result["metrics_bar"])
    print("server panel:", result["server_panel"].replace("\n", " | ")[:600])
    return 0


if __name__ == "__main__":
    sys.exit(main())
