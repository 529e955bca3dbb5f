"""Per-reply and per-session speed figures for the chat.

Timestamps are the client's arrival times (time.perf_counter() taken by the
reader as each chunk arrives, before any rendering), so the figures do not
depend on how fast the screen redraws. Definitions follow docs/protocols.md:
TTFT is request start to the first non-empty chunk; decode tok/s excludes TTFT:
(tokens - 1) / (t_last - t_first).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ReplyMetrics:
    """Speed of one reply, updated live as chunks arrive and settled at the end."""

    t_start: float
    t_first: float | None = None
    t_last: float | None = None
    output_tokens: int = 0
    accept_length: float | None = None  # tokens per verify step; None when the server does not speculate
    exact: bool = False  # True once the server's usage count replaced the live chunk count
    live_counts_exact: bool = True  # False when a chunk's token count was not reported (counted as 1)
    status: str = "streaming"  # streaming | done | stopped | error

    def on_chunk(self, t: float, new_tokens: int, *, counted_exactly: bool = True) -> None:
        if new_tokens <= 0:
            return
        if not counted_exactly:
            self.live_counts_exact = False
        if self.t_first is None:
            self.t_first = t
        self.t_last = t
        self.output_tokens += new_tokens

    def settle(self, *, completion_tokens: int | None, accept_length: float | None, status: str) -> None:
        """Final figures: the server's token count (chat chunks may carry several tokens
        each under speculative decoding) and the per-reply accept length."""
        if completion_tokens is not None and completion_tokens > 0:
            self.output_tokens = completion_tokens
            self.exact = True
        if accept_length is not None:
            self.accept_length = accept_length
        self.status = status

    @property
    def ttft(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_start

    @property
    def decode_tok_s(self) -> float | None:
        if self.t_first is None or self.t_last is None or self.output_tokens < 2:
            return None
        span = self.t_last - self.t_first
        return (self.output_tokens - 1) / span if span > 0 else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ttft"] = self.ttft
        data["decode_tok_s"] = self.decode_tok_s
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplyMetrics:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass
class SessionMetrics:
    """Figures across the replies of one chat session (what the sparkline plots)."""

    replies: list[ReplyMetrics] = field(default_factory=list)
    counted_messages: set[int] = field(default_factory=set)  # stored message ids already in `replies`

    def add(self, reply: ReplyMetrics, *, message_id: int | None = None) -> bool:
        """Count a reply once: a stored message already counted (its chat reopened) is skipped.
        Returns whether it was added."""
        if message_id is not None:
            if message_id in self.counted_messages:
                return False
            self.counted_messages.add(message_id)
        self.replies.append(reply)
        return True

    @property
    def tok_s_series(self) -> list[float]:
        return [r.decode_tok_s for r in self.replies if r.decode_tok_s is not None]

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.replies)

    @property
    def mean_tok_s(self) -> float | None:
        """Token-weighted decode speed: total decode tokens over total decode time."""
        tokens = 0
        seconds = 0.0
        for r in self.replies:
            if r.decode_tok_s is None or r.t_first is None or r.t_last is None:
                continue
            tokens += r.output_tokens - 1
            seconds += r.t_last - r.t_first
        return tokens / seconds if seconds > 0 else None

    @property
    def mean_accept_length(self) -> float | None:
        values = [r.accept_length for r in self.replies if r.accept_length is not None]
        return sum(values) / len(values) if values else None


def format_reply(reply: ReplyMetrics | None, *, with_status: bool = True) -> str:
    """One line for the metrics bar, e.g. '312.4 tok/s · TTFT 41 ms · 128 tok · accept 2.71'."""
    if reply is None:
        return "no reply yet"
    # While streaming without per-chunk usage, a chunk counts as one token: a lower bound.
    bound = "≥" if reply.status == "streaming" and not reply.live_counts_exact else ""
    speed = f"{bound}{reply.decode_tok_s:.1f} tok/s" if reply.decode_tok_s is not None else "– tok/s"
    ttft = f"TTFT {reply.ttft * 1000:.0f} ms" if reply.ttft is not None else "TTFT –"
    tokens = f"{bound}{reply.output_tokens} tok"
    parts = [speed, ttft, tokens]
    if reply.status != "streaming":  # the accept length is known when the reply ends
        parts.append(f"accept {reply.accept_length:.2f}" if reply.accept_length is not None else "accept n/a")
    if not with_status:
        pass
    elif reply.status == "streaming":
        parts.append("streaming…")
    elif reply.status in ("stopped", "error"):
        parts.append(reply.status)
    return " · ".join(parts)
