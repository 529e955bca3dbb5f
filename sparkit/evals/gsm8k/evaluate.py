"""The GSM8K runner: every selected question not yet answered is asked of the server, and each
finished answer is appended to the results file at once, so a crash or Ctrl-C loses nothing."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkit.errors import EngineError, SparkitError, StateError, UsageError
from sparkit.evals.gsm8k.answers import extract_flexible, extract_strict, same_number
from sparkit.evals.gsm8k.data import Question
from sparkit.evals.gsm8k.eval_settings import EvalSettings, sampling_params
from sparkit.evals.gsm8k.prompts import COMPLETION_STOPS, prompt_for, prompt_sha, request_seed
from sparkit.evals.gsm8k.results_file import Correct, HeaderRow, ResultRow, read_results
from sparkit.evals.gsm8k.summary import summarize, summary_path_for, write_summary
from sparkit.paths import disk_full


@dataclass
class Progress:
    done: int  # results in the file for the selected questions (resumed ones included)
    total: int
    correct_flexible: int
    correct_strict: int
    new_this_session: int


@dataclass
class EvalRequest:
    """One `sparkit eval gsm8k` invocation, resolved."""

    url: str
    settings: EvalSettings
    questions: list[Question]  # the selected test questions (after --limit)
    exemplars: list[Question]
    out: Path
    concurrency: int = 1
    resume: bool = False
    api_key: str | None = None
    recipe: str | None = None
    run_id: str | None = None
    data_path: str | None = None
    timeout_s: float = 3600.0


def _result_record(
    question: Question, prompt: Any, generation: Any, session: str, concurrency: int, wall_start: float, wall_end: float
) -> dict[str, Any]:
    strict = extract_strict(generation.text)
    flexible = extract_flexible(generation.text)
    return ResultRow(
        type="result",
        id=question.id,
        prompt_sha=prompt_sha(prompt),
        output=generation.text,
        strict=strict,
        flexible=flexible,
        gold=question.gold,
        correct=Correct(strict=same_number(strict, question.gold), flexible=same_number(flexible, question.gold)),
        prompt_tokens=generation.prompt_tokens,
        completion_tokens=generation.completion_tokens,
        finish_reason=_finish_type(generation.finish_reason),
        latency_s=generation.latency,
        accept_length=generation.accept_length,
        spec_verify_ct=generation.spec_verify_ct,
        session=session,
        concurrency=concurrency,
        started_at=wall_start,
        finished_at=wall_end,
    ).model_dump()


def _finish_type(reason: Any) -> str | None:
    if isinstance(reason, dict):
        reason = reason.get("type")
    return None if reason is None else str(reason)


async def _ask(client: Any, request: EvalRequest, question: Question, prompt: Any, model: str) -> Any:
    settings = request.settings
    if settings.format == "chat":
        extra: dict[str, Any] = {}
        if not settings.greedy:
            extra["seed"] = request_seed(settings.seed, question.id)
        final = None
        async for item in client.stream_chat(
            prompt,
            model=model,
            temperature=settings.temperature,
            top_p=None if settings.greedy else settings.top_p,
            top_k=None if settings.greedy else settings.top_k,
            max_tokens=settings.max_tokens,
            extra=extra or None,
        ):
            final = item
        return final
    params = sampling_params(settings, question.id)
    params["stop"] = COMPLETION_STOPS
    return await client.generate(prompt, sampling_params=params)


async def run_eval(request: EvalRequest, on_progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    """Answer every selected question not yet in the results file, appending one line per
    finished question, then return the summary (also written beside the results file)."""
    from sparkit.client import EngineClient
    from sparkit.paths import open_output

    out = Path(request.out)
    done = _resumed_results(request, out)
    selected_ids = {q.id for q in request.questions}
    done = {qid: r for qid, r in done.items() if qid in selected_ids}
    todo = [q for q in request.questions if q.id not in done]
    session = uuid.uuid4().hex[:12]

    async with EngineClient(request.url, api_key=request.api_key, timeout=request.timeout_s) as client:
        server_info = await _server_info(client)
        model = await _served_model(client)
        header = HeaderRow(
            type="header", settings=request.settings.as_dict(), settings_hash=request.settings.hash(), session=session,
            started_at=time.time(), url=request.url, recipe=request.recipe, run_id=request.run_id,
            data_path=request.data_path, model=str(model), concurrency=request.concurrency, server_args=server_info,
        ).model_dump()
        with _writing(out, done, request), open_output(out, "ab", buffering=0) as fh:
            _append(fh, header)
            progress = Progress(
                done=len(done),
                total=len(request.questions),
                correct_flexible=sum(r["correct"]["flexible"] for r in done.values()),
                correct_strict=sum(r["correct"]["strict"] for r in done.values()),
                new_this_session=0,
            )
            if on_progress:
                on_progress(progress)
            session_run = _Session(client, request, model, session, fh, done, progress, on_progress)
            await session_run.answer_all(todo, out)
    return _summarise_into_file(request, out)


def _resumed_results(request: EvalRequest, out: Path) -> dict[int, dict[str, Any]]:
    """The results already in `out` (with --resume, after checking that the file was made with
    the same settings and dropping a torn last line); {} for a new file."""
    settings = request.settings
    if not (out.exists() and out.stat().st_size > 0):
        out.parent.mkdir(parents=True, exist_ok=True)
        return {}
    if not request.resume:
        raise UsageError(f"results file {out} already exists", hint="pass --resume to continue it, or --out another file")
    existing = read_results(out)
    old_settings = existing.header["settings"]
    if existing.header.get("settings_hash") != settings.hash():
        diff = "; ".join(_settings_diff(old_settings, settings.as_dict())) or "prompt/exemplars"
        raise UsageError(
            f"cannot resume {out}: it was made with different settings ({diff})",
            hint="rerun with the same flags as the first run, or start a new file with --out",
        )
    if existing.valid_bytes < out.stat().st_size:  # drop a torn last line before appending
        with open(out, "r+b") as fh:
            fh.truncate(existing.valid_bytes)
    return existing.results


async def _served_model(client: Any) -> str:
    """The served name: it goes in the record, and chat requests must name it."""
    try:
        models = await client.models()
    except EngineError:
        return "default"
    return models[0] if models else "default"


@dataclass
class _Session:
    """This session's questions, asked `request.concurrency` at a time; each answer is appended to
    the results file (`fh`) and counted in `progress` as it finishes."""

    client: Any
    request: EvalRequest
    model: str
    session: str
    fh: Any
    done: dict[int, dict[str, Any]]
    progress: Progress
    on_progress: Callable[[Progress], None] | None

    async def answer_all(self, todo: list[Question], out: Path) -> None:
        queue: asyncio.Queue[Question] = asyncio.Queue()
        for q in todo:
            queue.put_nowait(q)
        count = max(1, min(self.request.concurrency, len(todo) or 1))
        workers = [asyncio.create_task(self._worker(queue)) for _ in range(count)]
        # (a write error in a worker ends them all: _writing names the file and how to resume)
        progress = self.progress
        try:
            await asyncio.gather(*workers)
        except EngineError as exc:
            saved = f"finished questions are saved; continue with the same flags plus --resume --out {out}"
            raise EngineError(
                f"{exc.message} ({progress.done} of {progress.total} questions done)",
                hint=(exc.hint if not progress.done else f"{exc.hint}; {saved}") if exc.hint else saved,
            ) from exc
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _worker(self, queue: asyncio.Queue[Question]) -> None:
        while True:
            try:
                question = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await self._answer(question)

    async def _answer(self, question: Question) -> None:
        request, settings, progress = self.request, self.request.settings, self.progress
        prompt = prompt_for(question, request.exemplars, settings.format)
        wall_start = time.time()
        try:
            generation = await _ask(self.client, request, question, prompt, self.model)
        except EngineError as exc:
            hint = exc.hint
            if "context length" in exc.message:
                # SGLang's wording for a prompt (+ max tokens) over the model's context.
                hint = (
                    f"the {settings.shots}-shot prompt plus --max-tokens {settings.max_tokens} must fit the "
                    "model's context: pass fewer --shots or a smaller --max-tokens (tiny-ling's "
                    "2048-token context fits --shots 1 --max-tokens 256)"
                )
            raise EngineError(f"question {question.id}: {exc.message}", hint=hint) from exc
        record = _result_record(question, prompt, generation, self.session, request.concurrency, wall_start, time.time())
        _append(self.fh, record)
        self.done[question.id] = record
        progress.done += 1
        progress.new_this_session += 1
        progress.correct_flexible += record["correct"]["flexible"]
        progress.correct_strict += record["correct"]["strict"]
        if self.on_progress:
            self.on_progress(progress)


def _summarise_into_file(request: EvalRequest, out: Path) -> dict[str, Any]:
    """The summary of the whole results file, written beside it and returned."""
    summary = summarize(read_results(out), request.questions)
    path = summary_path_for(out)
    try:
        write_summary(summary, path)
    except OSError as exc:
        error = StateError if disk_full(exc) else SparkitError  # a full disk: exit 10, as every command's
        raise error(f"cannot write the summary {path}: {exc.strerror or exc}",
                    hint=f"every answer is saved in {out}; once it can be written, the same command with "
                         f"--resume --out {out} writes the summary") from None
    return summary

def _settings_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    keys = sorted(set(old) | set(new))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


class _writing:
    """A write error (a full disk, a quota, a vanished mount) while appending to the results
    file becomes one message naming the file, what is saved and how to go on."""

    def __init__(self, out: Path, done: dict[int, Any], request: EvalRequest) -> None:
        self.out, self.done, self.request = out, done, request

    def __enter__(self) -> _writing:
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        if not isinstance(exc, OSError):
            return False
        saved = sum(1 for q in self.request.questions if q.id in self.done)
        error = StateError if disk_full(exc) else SparkitError  # a full disk: exit 10, as every command's
        raise error(
            f"cannot write {self.out}: {exc.strerror or exc} ({saved} of {len(self.request.questions)} questions saved)",
            hint=f"free space (or fix the file system), then run the same command with --resume --out {self.out}: "
                 "saved answers are kept and a half-written last line is dropped",
        ) from None


def _append(fh: Any, row: dict[str, Any]) -> None:
    # One unbuffered write per line: a killed process leaves whole lines (at most one torn line,
    # which read_results ignores), and a failed write raises here, not later at close.
    data = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
    view = memoryview(data)
    while view:
        written = fh.write(view)
        view = view[written:]


async def _server_info(client: Any) -> dict[str, Any]:
    try:
        info = await client.server_info()
    except EngineError:
        return {}
    if not isinstance(info, dict):
        return {}
    # Per-rank live counters change every second; they are not "the server's args".
    return {k: v for k, v in info.items() if k != "internal_states"}
