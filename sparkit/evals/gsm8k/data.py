"""GSM8K's data: the split files (shipped, --data or the hub's copy), read and checked line by line."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from sparkit.errors import DataError, UsageError
from sparkit.evals.gsm8k.answers import gold_answer
from sparkit.evals.hub import DATASET, SPLIT_SIZES, DownloadProgressFn, download_gsm8k
from sparkit.paths import cache_dir

# The hub's openai/gsm8k "main" config, fetched as JSON through its dataset viewer (evals/hub.py).
EXPECTED_SIZES = SPLIT_SIZES


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
# GSM8K as shipped with sparkit (openai/grade-school-math, MIT: data/gsm8k/NOTICE.txt and LICENSE),
# so the check runs offline; `--from-hub` downloads the same bytes instead (evals/hub.py).
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "gsm8k"


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
    return DATASET


def _cached_paths() -> tuple[Path, Path]:
    root = cache_dir() / "gsm8k"
    return root / "test.jsonl", root / "train.jsonl"


def ensure_downloaded(
    rows_url: str | None = None, timeout: float = 30.0, on_progress: DownloadProgressFn | None = None
) -> tuple[Path, Path]:
    """Download GSM8K once from the Hugging Face hub into the cache; a clear DataError offline."""
    test_path, train_path = _cached_paths()
    download_gsm8k({"test": test_path, "train": train_path}, base_url=rows_url, timeout=timeout,
                   on_progress=on_progress, check=load_split)
    return test_path, train_path

