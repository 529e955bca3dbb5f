"""Sampling settings the chat sends with every request, and their validation."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ChatSettings:
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20  # -1 = off
    max_tokens: int = 1024


def parse_settings(values: dict[str, str]) -> ChatSettings:
    """Settings from the panel's text fields. Raises ValueError naming the field and the allowed range."""

    def number(name: str, kind: type) -> float | int:
        raw = (values.get(name) or "").strip()
        try:
            return kind(raw)
        except ValueError:
            raise ValueError(f"{name}: {raw!r} is not {'an integer' if kind is int else 'a number'}") from None

    settings = ChatSettings(
        temperature=float(number("temperature", float)),
        top_p=float(number("top_p", float)),
        top_k=int(number("top_k", int)),
        max_tokens=int(number("max_tokens", int)),
    )
    if not 0.0 <= settings.temperature <= 2.0:
        raise ValueError("temperature: must be between 0 (greedy) and 2")
    if not 0.0 < settings.top_p <= 1.0:
        raise ValueError("top_p: must be in (0, 1]")
    if settings.top_k != -1 and settings.top_k < 1:
        raise ValueError("top_k: must be -1 (off) or at least 1")
    if settings.max_tokens < 1:
        raise ValueError("max_tokens: must be at least 1")
    return settings
