"""GSM8K answer extraction: the gold number of a reference answer, and a model's answer read
strictly ("The answer is N", "#### N") and flexibly (the last number); negatives and decimals kept."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# A number as models and GSM8K write them: optional sign, optional $, thousands separators, decimals.
# The sign only counts when it is not a hyphen between words/numbers ("3-4", "twenty-5").
_NUMBER = r"(?:(?<![\w.])-\s?)?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?:(?<![\w.])-)?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_STRICT_RE = re.compile(
    r"(?:####|\b(?:the\s+)?(?:final\s+)?answer\s+is)\s*:?\s*\**\s*(" + _NUMBER + r")",
    re.IGNORECASE,
)



def normalize_number(text: str) -> str | None:
    """'$1,234.50' -> '1234.5', '- 7' -> '-7', '3.0' -> '3'; None when not a number."""
    cleaned = text.replace(",", "").replace("$", "").replace(" ", "").strip()
    if cleaned.endswith("."):
        cleaned = cleaned[:-1]
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def gold_answer(answer: str) -> str | None:
    """The number after '####' in a GSM8K reference answer."""
    if "####" not in answer:
        return None
    return normalize_number(answer.rsplit("####", 1)[1].strip())


def _answer_region(output: str) -> str:
    # A reasoning model's answer follows its thinking; a base model may run on into a new
    # "Question:" of its own, whose numbers are not its answer.
    if "</think>" in output:
        tail = output.rsplit("</think>", 1)[1]
        if _NUMBER_RE.search(tail):
            output = tail
    return output.split("Question:", 1)[0]


def extract_strict(output: str) -> str | None:
    """The number after the last '####' or 'The answer is'; None when the model did not say it."""
    matches = _STRICT_RE.findall(_answer_region(output))
    return normalize_number(matches[-1]) if matches else None


def extract_flexible(output: str) -> str | None:
    """The last number in the reply (negatives and decimals kept; commas and $ removed)."""
    matches = _NUMBER_RE.findall(_answer_region(output))
    return normalize_number(matches[-1]) if matches else None


def same_number(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    return Decimal(a) == Decimal(b)

