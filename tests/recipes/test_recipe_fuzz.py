"""Seeded fuzzing of the shipped recipes: every mutation is a valid plan or a located error.

A few hundred mutations (line edits, YAML features a recipe never needs: aliases, merge keys, tags,
deep nesting, alias bombs; control characters, invalid UTF-8, truncation; wrong value types and
misspelt keys), each loaded and compiled as `sparkit plan` does. Deterministic (one seed, the
shipped recipes in name order); bounded by steps (a fixed number of mutations, each capped by the
loader's own limits); the per-mutation alarm only catches a hang, at many times the normal cost.

What must hold: no exception other than sparkit's own errors, every RecipeError names the file
(the mutated one or a shipped base), a --set error names --set, and through the CLI no traceback
and no "internal error". `pytest tests/recipes/test_recipe_fuzz.py -s` prints the tally.
"""

from __future__ import annotations

import random
import signal
from collections import Counter
from pathlib import Path

import pytest

from sparkit.errors import RecipeError, SparkitError, UsageError
from sparkit.recipes.compile import compile_plan
from sparkit.recipes.load import display_path, load_recipe, shipped_recipes

SEED = 20261201
MUTATIONS = 360
SET_MUTATIONS = 40  # of the MUTATIONS, fuzzed --set values on an unmutated recipe
CLI_EVERY = 12  # every so many mutations also go through the CLI entry point (in-process)
HANG_S = 20  # a mutation normally takes milliseconds; this only tells a hang from slowness

SNIPPETS = [
    "<<: *base",
    "base: &base {port: 30001}",
    "x: &a [*a]",
    "x: *undefined",
    "description: !!python/object:os.system x",
    "description: !custom thing",
    "description: !!binary aGVsbG8=",
    "description: 2020-01-01",
    "description: 2020-13-45",
    "? [a, b]\n: c",
    "? {a: 1}\n: c",
    "port: .nan",
    "port: 1e999",
    "port: -1",
    "port: 0x7530",
    "port: " + "9" * 5000,
    "---\nextends: tiny",
    "...",
    "%YAML 1.1",
    "\tdescription: tab",
    "description: " + "x" * 20000,
    "description: |\n  block\n   text",
    "env: {SPARKIT_API_KEY: k}",
    "server: {env: {HF_TOKEN: t}}",
    "extends: " + "../" * 40 + "etc/passwd",
    "extends: /dev/zero",
    "extends: .",
    "extends: [tiny]",
    "extends: nowhere",
    "stack: {speculative: {method: nextn, num_steps: 3}}",
    "stack: {tp: 0}",
    "model: {path: 'sparkit:tiny-ling:seed=1:steps=0'}",
    "model: {path: 'sparkit:nope'}",
]
BAD_CHARS = ["\x00", "\x01", "\x1b", "\x7f", "\ufeff", "\u2028", "\x85", ":", "-", "[", "]", "{", "}", "&", "*", "!",
             "|", ">", "%", "@", "`", '"', "'", "#", "\t", " ", "\n", "é", "\U0001f600"]
VALUES = ["0", "-1", "3.5", "1e308", "true", "null", "~", "[]", "{}", "[1, [2, [3]]]", "{a: {b: {c: d}}}", '""',
          "'x'", "!!str 3", "&v 1", "*v", "<<: {}", "tiny", "fp8", "nextn", "9" * 400]


def _nested(rng: random.Random) -> str:
    depth = rng.choice([10, 63, 65, 200, 1000])
    return "description: " + "[" * depth + "]" * depth


def _bomb(rng: random.Random) -> str:
    width, levels = rng.choice([(9, 7), (10, 5), (4, 12)])
    lines = ["checks: {}", f"a0: &a0 [{', '.join(['x'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines)


def mutate(rng: random.Random, text: str) -> tuple[str, bytes]:
    """One mutation of a recipe's text: (operator name, the bytes to write)."""
    lines = text.splitlines()
    op = rng.choice(["delete-line", "duplicate-line", "swap-lines", "char", "snippet", "indent", "value",
                     "rename-key", "truncate", "bytes", "nested", "bomb", "many"])
    if op == "delete-line" and lines:
        del lines[rng.randrange(len(lines))]
    elif op == "duplicate-line" and lines:
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
    elif op == "swap-lines" and len(lines) > 1:
        i, j = rng.sample(range(len(lines)), 2)
        lines[i], lines[j] = lines[j], lines[i]
    elif op == "char":
        pos = rng.randrange(len(text) + 1)
        text = text[:pos] + rng.choice(BAD_CHARS) + text[pos + rng.choice([0, 1]):]
        return op, text.encode("utf-8")
    elif op == "snippet":
        snippet = rng.choice(SNIPPETS)
        indent = rng.choice(["", "", "  ", "    "])
        lines.insert(rng.randrange(len(lines) + 1), "\n".join(indent + s for s in snippet.split("\n")))
    elif op == "indent" and lines:
        i = rng.randrange(len(lines))
        lines[i] = rng.choice([" ", "  ", "\t", ""]) + (lines[i][rng.choice([0, 1, 2]):])
    elif op == "value":
        candidates = [i for i, line in enumerate(lines) if ":" in line and not line.lstrip().startswith("#")]
        if candidates:
            i = rng.choice(candidates)
            key = lines[i].split(":", 1)[0]
            lines[i] = f"{key}: {rng.choice(VALUES)}"
    elif op == "rename-key":
        candidates = [i for i, line in enumerate(lines) if ":" in line and line.strip()[:1].isalpha()]
        if candidates:
            i = rng.choice(candidates)
            key, _, rest = lines[i].partition(":")
            stripped = key.strip()
            typo = stripped[:-1] + rng.choice("xz_") if len(stripped) > 1 else "q"
            lines[i] = key.replace(stripped, typo) + ":" + rest
    elif op == "truncate":
        return op, text.encode("utf-8")[: rng.randrange(len(text) + 1)]
    elif op == "bytes":
        raw = bytearray(text.encode("utf-8"))
        for _ in range(rng.randint(1, 4)):
            raw.insert(rng.randrange(len(raw) + 1), rng.randrange(256))
        return op, bytes(raw)
    elif op == "nested":
        lines.insert(rng.randrange(len(lines) + 1), _nested(rng))
    elif op == "bomb":
        lines.append(_bomb(rng))
    elif op == "many":
        for _ in range(rng.randint(2, 6)):
            sub, data = mutate(rng, "\n".join(lines) + "\n")
            lines = data.decode("utf-8", "replace").splitlines()
    return op, ("\n".join(lines) + "\n").encode("utf-8")


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"no answer within {HANG_S} s")


def _located(exc: SparkitError, allowed_files: set[str]) -> bool:
    if isinstance(exc, RecipeError):
        return bool(exc.file) and exc.file in allowed_files and str(exc).startswith(exc.file)
    return False


@pytest.fixture(scope="module")
def recipes():
    return [(name, path, path.read_text()) for name, path in shipped_recipes()]


def test_mutated_recipes_are_plans_or_located_errors(recipes, tmp_path, capsys):
    rng = random.Random(SEED)
    shipped_files = {display_path(path) for _, path, _ in recipes}
    tally: Counter[str] = Counter()
    problems: list[str] = []
    cli_checked = 0
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i in range(MUTATIONS):
            name, source, text = recipes[i % len(recipes)]
            overrides: list[str] = []
            if i % (MUTATIONS // SET_MUTATIONS) == 0:
                op = "--set"
                path = source
                key = rng.choice(["server.port", "stack.speculative", "server.env", "model.path", "checks",
                                  "description", "stack.tp", "server.extra_args"])
                value = rng.choice(VALUES + SNIPPETS[:6] + [_nested(rng).split(": ", 1)[1], "&a [*a]", "a\x00b"])
                overrides = [f"{key}={value}"]
            else:
                op, data = mutate(rng, text)
                path = tmp_path / f"mut-{i:03d}-{source.stem}.yaml"
                path.write_bytes(data)
            allowed = shipped_files | {display_path(path)}
            signal.setitimer(signal.ITIMER_REAL, HANG_S)
            try:
                compile_plan(load_recipe(path, overrides))
                tally["valid plan"] += 1
            except UsageError as exc:
                if overrides and "--set" in str(exc):
                    tally["rejected: --set error naming --set"] += 1
                else:
                    problems.append(f"#{i} {op} {name}: usage error not naming its origin: {exc}")
            except SparkitError as exc:
                if _located(exc, allowed) or (overrides and isinstance(exc, RecipeError) and exc.file == "--set"):
                    tally[f"rejected: {type(exc).__name__} located at its file"] += 1
                else:
                    problems.append(f"#{i} {op} {name}: error without its file: {type(exc).__name__}: {exc}")
            except Hang as exc:
                problems.append(f"#{i} {op} {name}: hang: {exc}")
            except BaseException as exc:  # noqa: BLE001 - that is the finding
                problems.append(f"#{i} {op} {name}: internal error: {type(exc).__name__}: {exc}"[:300])
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if i % CLI_EVERY == 0:
                cli_checked += 1
                problems += _through_the_cli(i, op, name, path, overrides, capsys)
    finally:
        signal.signal(signal.SIGALRM, old)
    with capsys.disabled():
        print(f"\nfuzz: seed {SEED}, {MUTATIONS} mutations of {len(recipes)} shipped recipes "
              f"({SET_MUTATIONS} of them --set values), {cli_checked} also through the CLI")
        for outcome, count in sorted(tally.items()):
            print(f"  {count:4d}  {outcome}")
        print(f"  {len(problems):4d}  internal errors, hangs or unlocated errors")
    assert problems == [], "\n".join(problems[:20])
    assert sum(tally.values()) == MUTATIONS
    assert tally["valid plan"] and sum(v for k, v in tally.items() if k.startswith("rejected")) > MUTATIONS // 2


def _through_the_cli(i: int, op: str, name: str, path: Path, overrides: list[str], capsys) -> list[str]:
    """`sparkit plan FILE --json` through the CLI's entry point: a documented exit code, no
    traceback, no "internal error"."""
    from sparkit.cli.main import main

    argv = ["plan", str(path), "--json"] + [a for o in overrides for a in ("--set", o)]
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        with pytest.raises(SystemExit) as info:
            main(argv)
    except Hang as exc:
        return [f"#{i} {op} {name}: CLI hang: {exc}"]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    err = capsys.readouterr().err
    code = info.value.code
    if code not in (0, 2, 3) or "Traceback" in err or "internal error" in err:
        return [f"#{i} {op} {name}: CLI exit {code}: {err[-300:]}"]
    return []
