"""The GSM8K results file (JSONL, one header per session and one result per answered question):
its two kinds of line declared once, and the reader that checks a file line by line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from sparkit.errors import DataError

#
# The two kinds of line, declared once: the runner writes them through these models and a resumed
# or compared file is read back through them, so a hand-edited or foreign line is refused with its
# file:line and field instead of surfacing later as a KeyError (or, for "id": 5.0, silently
# replacing question 5).


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Correct(_Row):
    strict: StrictBool
    flexible: StrictBool


class ResultRow(_Row):
    """One answered question."""

    type: Literal["result"]
    id: StrictInt = Field(ge=0)  # the question's index in the test split
    prompt_sha: StrictStr | None = None
    output: StrictStr | None = None
    strict: StrictStr | None
    flexible: StrictStr | None
    gold: StrictStr | None
    correct: Correct
    prompt_tokens: StrictInt | None = Field(default=None, ge=0)
    completion_tokens: StrictInt | None = Field(default=None, ge=0)
    finish_reason: StrictStr | None = None
    latency_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    accept_length: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    spec_verify_ct: StrictInt | None = Field(default=None, ge=0)
    session: StrictStr = ""
    concurrency: StrictInt | None = Field(default=None, ge=1)
    started_at: float = Field(default=0.0, allow_inf_nan=False)
    finished_at: float = Field(default=0.0, allow_inf_nan=False)


class HeaderRow(_Row):
    """What one session (the first run, each --resume) ran with."""

    type: Literal["header"]
    settings: dict[str, Any]
    settings_hash: StrictStr
    session: StrictStr = ""
    started_at: float = Field(default=0.0, allow_inf_nan=False)
    url: StrictStr | None = None
    recipe: StrictStr | None = None
    run_id: StrictStr | None = None
    data_path: StrictStr | None = None
    model: StrictStr | None = None
    concurrency: StrictInt | None = Field(default=None, ge=1)
    server_args: dict[str, Any] = Field(default_factory=dict)


_RESULTS_HINT = ("every line of a results file is a header or a result that `sparkit eval gsm8k` wrote; fix or "
                 "delete that line and run again, or start a new file with --out")


def _row_error(path: Path, number: int, exc: ValidationError) -> DataError:
    err = exc.errors(include_url=False)[0]
    field_name = ".".join(str(p) for p in err["loc"]) or "line"
    more = len(exc.errors()) - 1
    return DataError(f"{path}:{number}: {field_name}: {err['msg']}" + (f" (and {more} more)" if more else ""),
                     hint=_RESULTS_HINT)


@dataclass
class ResultsFile:
    """What a results JSONL holds: its first header, every header, and results by question id."""

    path: Path
    header: dict[str, Any] | None
    headers: list[dict[str, Any]]
    results: dict[int, dict[str, Any]]
    valid_bytes: int  # length of the file up to the last complete line


def read_results(path: Path) -> ResultsFile:
    """Parse and check a results file, ignoring a torn last line (the process died mid-write).
    Raises DataError naming file:line and the field of the first line that is not a header or
    result row as sparkit writes them (or that answers a question a second time)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"results file not found: {path}")
    raw = path.read_bytes()
    valid = raw.rfind(b"\n") + 1
    headers: list[dict[str, Any]] = []
    results: dict[int, dict[str, Any]] = {}
    seen_on: dict[int, int] = {}
    for number, line in enumerate(raw[:valid].decode("utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            raise DataError(f"{path}:{number}: not valid JSON ({reason})", hint="is this a `sparkit eval gsm8k` results file?") from None
        kind = row.get("type") if isinstance(row, dict) else None
        model = {"header": HeaderRow, "result": ResultRow}.get(kind) if isinstance(kind, str) else None
        if not headers and model is not HeaderRow:
            raise DataError(f"{path}:{number}: not a `sparkit eval gsm8k` results file (its first line is not a header)",
                            hint="pass a results file that `sparkit eval gsm8k --out FILE` wrote")
        if model is None:
            raise DataError(f"{path}:{number}: type: expected 'header' or 'result', got {kind!r}", hint=_RESULTS_HINT)
        try:
            checked = model.model_validate(row)
        except ValidationError as exc:
            raise _row_error(path, number, exc) from None
        if isinstance(checked, HeaderRow):
            headers.append(checked.model_dump())
            continue
        if checked.id in seen_on:
            raise DataError(f"{path}:{number}: id: question {checked.id} is already answered on line {seen_on[checked.id]}",
                            hint="delete one of the two lines and run again")
        seen_on[checked.id] = number
        results[checked.id] = checked.model_dump()
    if not headers:
        raise DataError(f"{path} is not a `sparkit eval gsm8k` results file (no header line)")
    return ResultsFile(path=path, header=headers[0], headers=headers, results=results, valid_bytes=valid)
