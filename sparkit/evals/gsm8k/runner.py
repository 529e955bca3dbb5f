"""GSM8K accuracy check: data, few-shot prompts, answer extraction, a resumable runner, summary.

The protocol (../docs/protocols.md) is NVIDIA's published Spark check: all 1319 test questions,
5-shot chain of thought, temperature 0.6 / top_p 0.95 / top_k 29, through the chat template. It
fixes what common scripts get wrong: exemplars come from the *train* split and never from the
questions being evaluated; extraction keeps negatives and decimals; both a strict and a flexible
extraction are reported.

Results file (JSONL, appended as each question finishes, so a crash or Ctrl-C loses nothing):

    {"type": "header", "settings": {...}, "settings_hash": "...", "session": "...", "server": {...}, ...}
    {"type": "result", "id": 17, "prompt_sha": "...", "output": "...", "strict": "18", "flexible": "18",
     "gold": "18", "correct": {"strict": true, "flexible": true}, "completion_tokens": 212, ...}

A header line is written by every session (the first run and each --resume); resuming checks
that the settings hash matches the first header, so a file never mixes two protocols.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from sparkit.errors import DataError, EngineError, SparkitError, UsageError
from sparkit.evals.hub import SPLIT_SIZES, DownloadProgressFn
from sparkit.evals.stats import proportion

# The hub's openai/gsm8k "main" config, fetched as JSON through its dataset viewer (evals/hub.py).
EXPECTED_SIZES = SPLIT_SIZES

# Exemplars are a fixed draw from train so that every run (and every --seed) sees the same
# prompt prefix: runs stay comparable and the server's prefix cache does its job.
EXEMPLAR_SEED = 1234
# Bump when prompt wording changes so that old results files refuse to be resumed into.
PROMPT_VERSION = 1

COMPLETION_STOPS = ["Question:", "</s>", "<|im_end|>"]
INSTRUCTION = 'Solve the problem step by step, then finish with "The answer is N." where N is the final number.'


# -- data ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    id: int  # 0-based line index in its split file
    question: str
    answer: str  # the reference solution, ending "#### N"
    gold: str  # N normalised (commas removed, canonical decimal)


def load_split(path: Path) -> list[Question]:
    """Read a GSM8K JSONL file; every problem is reported with file:line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(
            f"GSM8K data file not found: {path}",
            hint="pass --data with the test.jsonl of openai/grade-school-math (train.jsonl beside it), "
                 "or leave --data out for the copy shipped with sparkit",
        )
    questions: list[Question] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read GSM8K data file {path}: {exc}") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc.msg})", hint="each line must be one JSON object") from exc
        if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not isinstance(row.get("answer"), str):
            raise DataError(f'{where}: expected {{"question": str, "answer": str}}')
        gold = gold_answer(row["answer"])
        if gold is None:
            raise DataError(f"{where}: answer has no '#### N' final line", hint="is this a GSM8K file?")
        questions.append(Question(id=len(questions), question=row["question"], answer=row["answer"], gold=gold))
    if not questions:
        raise DataError(f"GSM8K data file is empty: {path}")
    return questions


# GSM8K as shipped with sparkit (openai/grade-school-math, MIT: data/gsm8k/NOTICE.txt and LICENSE),
# so the check runs offline; `--from-hub` downloads the same bytes instead (evals/hub.py).
SHIPPED_DIR = Path(__file__).resolve().parent / "data" / "gsm8k"


@dataclass
class Dataset:
    test: list[Question]
    train: list[Question]
    test_path: Path
    train_path: Path | None
    sha256: str  # of the test file: part of the settings hash
    source: str = ""  # where the files came from, in words


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_dataset(
    data: Path | None, *, need_train: bool = True, from_hub: bool = False, download: bool = True,
    on_download: DownloadProgressFn | None = None,
) -> Dataset:
    """--data PATH (a test.jsonl, or a directory holding test.jsonl) with train.jsonl beside it;
    without PATH, the copy shipped with sparkit, or with `from_hub` the hub's copy in the cache
    (downloaded on first use unless `download` is off)."""
    if data is not None and from_hub:
        raise UsageError("--data and --from-hub name two sources: give one")
    if data is not None:
        data = Path(data).expanduser()
        test_path = data / "test.jsonl" if data.is_dir() else data
        train_path = test_path.with_name("train.jsonl")
        source = f"--data {data}"
    elif from_hub:
        test_path, train_path = ensure_downloaded(on_progress=on_download) if download else _cached_paths()
        source = f"{hub_dataset_name()} from the Hugging Face hub, cached in {test_path.parent}"
    else:
        test_path, train_path = SHIPPED_DIR / "test.jsonl", SHIPPED_DIR / "train.jsonl"
        source = "shipped with sparkit (openai/grade-school-math, MIT)"
    test = load_split(test_path)
    train: list[Question] = []
    if need_train:
        if not train_path.is_file():
            raise DataError(
                f"few-shot exemplars come from the train split, but {train_path} does not exist",
                hint="put GSM8K's train.jsonl beside the test file, or pass --shots 0",
            )
        train = load_split(train_path)
    return Dataset(test=test, train=train, test_path=test_path, train_path=train_path if need_train else None,
                   sha256=_sha256_file(test_path), source=source)


def hub_dataset_name() -> str:
    from sparkit.evals.hub import DATASET

    return DATASET


def _cached_paths() -> tuple[Path, Path]:
    from sparkit.paths import cache_dir

    root = cache_dir() / "gsm8k"
    return root / "test.jsonl", root / "train.jsonl"


def ensure_downloaded(
    rows_url: str | None = None, timeout: float = 30.0, on_progress: DownloadProgressFn | None = None
) -> tuple[Path, Path]:
    """Download GSM8K once from the Hugging Face hub into the cache; a clear DataError offline."""
    from sparkit.evals.hub import download_gsm8k

    test_path, train_path = _cached_paths()
    download_gsm8k({"test": test_path, "train": train_path}, base_url=rows_url, timeout=timeout,
                   on_progress=on_progress, check=load_split)
    return test_path, train_path


# -- answers ---------------------------------------------------------------------------

# A number as models and GSM8K write them: optional sign, optional $, thousands separators, decimals.
# The sign only counts when it is not a hyphen between words/numbers ("3-4", "twenty-5").
_NUMBER = r"(?:(?<![\w.])-\s?)?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?:(?<![\w.])-)?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_STRICT_RE = re.compile(
    r"(?:####|\b(?:the\s+)?(?:final\s+)?answer\s+is)\s*:?\s*\**\s*(" + _NUMBER + r")",
    re.IGNORECASE,
)
_CALCULATOR_RE = re.compile(r"<<[^<>]*>>")


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


# -- prompts ---------------------------------------------------------------------------


def exemplar_solution(answer: str) -> str:
    """A train answer as chain of thought: calculator annotations dropped, '#### N' spelled out."""
    reasoning, final = answer.rsplit("####", 1)
    reasoning = _CALCULATOR_RE.sub("", reasoning).strip()
    return f"{reasoning}\nThe answer is {final.strip()}."


def choose_exemplars(train: list[Question], shots: int, exclude: list[Question], seed: int = EXEMPLAR_SEED) -> list[Question]:
    """`shots` train questions, never one whose text is among the evaluated questions
    (which matters when someone evaluates the train split itself)."""
    if shots <= 0:
        return []
    banned = {q.question.strip() for q in exclude}
    pool = [q for q in train if q.question.strip() not in banned]
    if len(pool) < shots:
        raise DataError(f"need {shots} exemplars from the train split but only {len(pool)} questions are usable")
    return random.Random(seed).sample(pool, shots)


def build_chat_messages(question: str, exemplars: list[Question]) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = []
    for ex in exemplars:
        messages.append({"role": "user", "content": f"{INSTRUCTION}\n\nQuestion: {ex.question}"})
        messages.append({"role": "assistant", "content": exemplar_solution(ex.answer)})
    messages.append({"role": "user", "content": f"{INSTRUCTION}\n\nQuestion: {question}"})
    return messages


def build_completion_prompt(question: str, exemplars: list[Question]) -> str:
    parts = [f"Question: {ex.question}\nAnswer: {exemplar_solution(ex.answer)}\n\n" for ex in exemplars]
    parts.append(f"Question: {question}\nAnswer:")
    return "".join(parts)


def prompt_for(question: Question, exemplars: list[Question], fmt: str) -> str | list[dict[str, str]]:
    if fmt == "chat":
        return build_chat_messages(question.question, exemplars)
    return build_completion_prompt(question.question, exemplars)


def prompt_sha(prompt: str | list[dict[str, str]]) -> str:
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def request_seed(seed: int, question_id: int) -> int:
    """Per-request sampling seed from --seed and the question id: reproducible whatever the
    order requests finish in (where the engine honours seeds)."""
    digest = hashlib.sha256(f"gsm8k:{seed}:{question_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


# -- settings --------------------------------------------------------------------------


@dataclass
class EvalSettings:
    """Everything that changes which answer a question gets. Hashed: --resume refuses a file
    made with different settings. --limit and --concurrency are left out on purpose: extending
    a --limit 100 run to all questions, or resuming at another concurrency, is legitimate."""

    data_sha256: str
    shots: int = 5
    format: str = "chat"
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 29
    max_tokens: int = 4096
    seed: int = 0
    exemplar_ids: list[int] = field(default_factory=list)
    prompt_version: int = PROMPT_VERSION

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:16]


def sampling_params(settings: EvalSettings, question_id: int) -> dict[str, Any]:
    """SGLang native sampling params for /generate."""
    params: dict[str, Any] = {"max_new_tokens": settings.max_tokens, "temperature": settings.temperature}
    if not settings.greedy:
        params.update(top_p=settings.top_p, top_k=settings.top_k, sampling_seed=request_seed(settings.seed, question_id))
    return params


# -- results file ----------------------------------------------------------------------
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


def _settings_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    keys = sorted(set(old) | set(new))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def summary_path_for(results_path: Path) -> Path:
    return Path(results_path).with_suffix(".summary.json")


# -- runner ----------------------------------------------------------------------------


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

    settings = request.settings
    out = Path(request.out)
    done: dict[int, dict[str, Any]] = {}
    if out.exists() and out.stat().st_size > 0:
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
        done = existing.results
    else:
        out.parent.mkdir(parents=True, exist_ok=True)

    selected_ids = {q.id for q in request.questions}
    done = {qid: r for qid, r in done.items() if qid in selected_ids}
    todo = [q for q in request.questions if q.id not in done]
    session = uuid.uuid4().hex[:12]

    async with EngineClient(request.url, api_key=request.api_key, timeout=request.timeout_s) as client:
        server_info = await _server_info(client)
        model = "default"
        try:  # the served name goes in the record, and chat requests must name it
            models = await client.models()
            model = models[0] if models else "default"
        except EngineError:
            pass
        header = HeaderRow(
            type="header", settings=settings.as_dict(), settings_hash=settings.hash(), session=session,
            started_at=time.time(), url=request.url, recipe=request.recipe, run_id=request.run_id,
            data_path=request.data_path, model=str(model), concurrency=request.concurrency, server_args=server_info,
        ).model_dump()
        from sparkit.paths import open_output

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
            queue: asyncio.Queue[Question] = asyncio.Queue()
            for q in todo:
                queue.put_nowait(q)

            async def worker() -> None:
                while True:
                    try:
                        question = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        return
                    prompt = prompt_for(question, request.exemplars, settings.format)
                    wall_start = time.time()
                    try:
                        generation = await _ask(client, request, question, prompt, model)
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
                    record = _result_record(
                        question, prompt, generation, session, request.concurrency, wall_start, time.time()
                    )
                    _append(fh, record)
                    done[question.id] = record
                    progress.done += 1
                    progress.new_this_session += 1
                    progress.correct_flexible += record["correct"]["flexible"]
                    progress.correct_strict += record["correct"]["strict"]
                    if on_progress:
                        on_progress(progress)

            workers = [asyncio.create_task(worker()) for _ in range(max(1, min(request.concurrency, len(todo) or 1)))]
            # (a write error in a worker ends them all: _writing names the file and how to resume)
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

    summary = summarize(read_results(out), request.questions)
    path = summary_path_for(out)
    try:
        write_summary(summary, path)
    except OSError as exc:
        raise SparkitError(f"cannot write the summary {path}: {exc.strerror or exc}",
                           hint=f"every answer is saved in {out}; once it can be written, the same command with "
                                f"--resume --out {out} writes the summary") from None
    return summary


class _writing:
    """A write error (a full disk, a quota, a vanished mount) while appending to the results
    file becomes one message naming the file, what is saved and how to go on."""

    def __init__(self, out: Path, done: dict[int, Any], request: "EvalRequest") -> None:
        self.out, self.done, self.request = out, done, request

    def __enter__(self) -> "_writing":
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        if not isinstance(exc, OSError):
            return False
        saved = sum(1 for q in self.request.questions if q.id in self.done)
        raise SparkitError(
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


def write_summary(summary: dict[str, Any], path: Path) -> None:
    from sparkit.paths import write_atomic

    write_atomic(path, json.dumps(summary, indent=2, default=str))


# -- summary ---------------------------------------------------------------------------

SERVER_ARG_KEYS = (
    "model_path",
    "served_model_name",
    "dtype",
    "quantization",
    "moe_runner_backend",
    "tp_size",
    "ep_size",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_draft_model_path",
    "enable_fp32_lm_head",
    "lm_head_dtype",
    "expert_weights",
    "device",
)


def summarize(results: ResultsFile, questions: list[Question] | None = None) -> dict[str, Any]:
    """The summary of a results file, over the selected questions (all in the file by default).

    Throughput is total output tokens over wall time, where wall time sums each session's span
    (first request start to last finish), so time between a crash and --resume is not counted.
    """
    header = results.header or {}
    last_header = results.headers[-1] if results.headers else header
    if questions is not None:
        ids = [q.id for q in questions]
        rows = [results.results[i] for i in ids if i in results.results]
        total = len(ids)
    else:
        rows = [results.results[i] for i in sorted(results.results)]
        total = len(rows)
    n = len(rows)
    strict_ok = sum(bool(r["correct"]["strict"]) for r in rows)
    flex_ok = sum(bool(r["correct"]["flexible"]) for r in rows)
    strict_invalid = sum(r["strict"] is None for r in rows)
    flex_invalid = sum(r["flexible"] is None for r in rows)
    truncated = sum(r.get("finish_reason") == "length" for r in rows)
    tokens = sum(int(r.get("completion_tokens") or 0) for r in rows)
    latencies = [float(r["latency_s"]) for r in rows if r.get("latency_s") is not None]

    spans: dict[str, tuple[float, float]] = {}
    concurrencies: set[int] = set()
    for r in rows:
        s = r.get("session", "")
        start, end = float(r.get("started_at", 0)), float(r.get("finished_at", 0))
        lo, hi = spans.get(s, (start, end))
        spans[s] = (min(lo, start), max(hi, end))
        if r.get("concurrency") is not None:
            concurrencies.add(int(r["concurrency"]))
    wall = sum(hi - lo for lo, hi in spans.values())

    verify_rows = [r for r in rows if r.get("spec_verify_ct")]
    if verify_rows:
        accept = sum(int(r["completion_tokens"]) for r in verify_rows) / sum(int(r["spec_verify_ct"]) for r in verify_rows)
    else:
        values = [float(r["accept_length"]) for r in rows if r.get("accept_length") is not None]
        accept = sum(values) / len(values) if values else None

    server_args = last_header.get("server_args") or {}
    return {
        "results_file": str(results.path),
        "n": n,
        "total": total,
        "complete": n == total,
        "accuracy": {
            "strict": proportion(strict_ok, n).as_dict(),
            "flexible": proportion(flex_ok, n).as_dict(),
        },
        "invalid_rate": {"strict": strict_invalid / n if n else 0.0, "flexible": flex_invalid / n if n else 0.0},
        "truncated": truncated,
        "mean_latency_s": sum(latencies) / len(latencies) if latencies else None,
        "output_tokens": tokens,
        "wall_s": wall,
        "output_throughput_tok_s": tokens / wall if wall > 0 else None,
        "concurrency": sorted(concurrencies)[0] if len(concurrencies) == 1 else sorted(concurrencies),
        "mean_accept_length": accept,
        "sessions": len(results.headers),
        "settings": header.get("settings"),
        "settings_hash": header.get("settings_hash"),
        "recipe": last_header.get("recipe"),
        "run_id": last_header.get("run_id"),
        "url": last_header.get("url"),
        "model": last_header.get("model"),
        "server_args": {k: server_args[k] for k in SERVER_ARG_KEYS if k in server_args},
        "server_args_full": server_args,
    }
