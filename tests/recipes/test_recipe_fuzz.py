"""Seeded fuzzing of the shipped recipes: every mutation is a valid plan or a located error.

A few hundred mutations (line edits, YAML features a recipe never needs: aliases, merge keys, tags,
deep nesting, alias bombs; control characters, invalid UTF-8, truncation; wrong value types and
misspelt keys), each loaded and compiled as `sparkit plan` does. Deterministic (one seed, the
shipped recipes in name order); bounded by steps (a fixed number of mutations, each capped by the
loader's own limits); the per-mutation alarm only catches a hang, at many times the normal cost.

Every SHAPE_EVERY-th mutation is instead one of issue 29's shapes, in turn: a long extends chain
(up to 990 files), 8000 + 8000 server.env keys merged through extends, huge and non-finite
numbers, lone UTF-16 surrogates, file names at and past NAME_MAX, a recipe read from a pipe
(/dev/fd/N), a named FIFO, and issue 40's environment keys: names outside the engine's settings
(OPENSSL_CONF, PATH, LD_PRELOAD, ...), the engine's own, names no environment can hold, values with
a NUL, each allowed by `server.allow_code_env` or not, in the file or by --set.

What must hold: no exception other than sparkit's own errors, every variable of a valid plan's
environment that is not one of its engine's settings named by server.allow_code_env and shown in
plan.code_env, every RecipeError names the file
(the mutated one, a file of its chain or a shipped base), a --set error names --set, through the
CLI no traceback and no "internal error", and no case costs more than MAX_CPU_S of this process's
CPU time (user + system, all threads: what the machine's load does not change). `pytest
tests/recipes/test_recipe_fuzz.py -s` prints the tally and the costliest cases.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
from collections import Counter
from pathlib import Path

import pytest

from sparkit.engines.base import engine_environment
from sparkit.errors import RecipeError, SparkitError, UsageError
from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import display_path, load_recipe, shipped_recipes

SEED = 20261201
MUTATIONS = 360
SET_MUTATIONS = 40  # of the MUTATIONS, fuzzed --set values on an unmutated recipe
CLI_EVERY = 12  # every so many mutations also go through the CLI entry point (in-process)
HANG_S = 20  # a mutation normally takes milliseconds; this only tells a hang from slowness
MAX_CPU_S = 5.0  # the most CPU time one run of a case may cost (load and compile; or `sparkit plan --json`):
# 2 s until `plan` computed a hub model's memory fit from its declared profile; the widest case
# (16,000 server.env keys over ling-3.0-flash/tp4-nextn) now takes 2.5 s of it, 3.2 s beside another
# test worker (shared caches); a bomb takes minutes
SHAPE_EVERY = 5  # every so many mutations, one of SHAPES instead (in turn)
SHAPES = ["chain", "huge-number", "surrogate", "long-name", "pipe", "wide", "fifo", "env", "env"]
CHAIN_LENGTHS = [2, 30, 31, 32, 33, 100, 990]
HUGE_NUMBERS = ["1e309", "1.0e+309", "-1.0e+309", ".inf", "-.inf", ".nan", "9" * 4000, "9" * 4301, "1" + "0" * 400,
                "0x" + "f" * 500, "1.0e-400", "-0.0", "18446744073709551617", "2147483648", "1.0e+300"]
NUMERIC_KEYS = ["server.port", "server.memory_guard.floor_gib", "model.context_length", "server.mem_fraction_static",
                "checks.min_accept_length", "checks.reference_perplexity", "stack.tp", "stack.speculative.num_steps",
                "server.cuda_graph.max_bs_decode", "checks.min_decode_tok_s"]
SURROGATES = ['description: "\\ud800"', '"\\udc00": 1', 'model: {path: "a\\udfffb"}', 'server: {env: {X: "\\ud800"}}',
              'description: "\\ud83d\\ude00"']  # the last one is a valid pair
# Environment keys (issue 40, item 3): outside every engine's settings, inside one of them, path-like
# inside a family, and names or values no environment can hold.
ENV_NAMES = ["OPENSSL_CONF", "OPENSSL_MODULES", "CUDA_INJECTION64_PATH", "PATH", "HOME", "HF_HOME", "TMPDIR",
             "TRITON_HOME", "XDG_CACHE_HOME", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP",
             "NCCL_NET_PLUGIN", "TRITON_CACHE_MANAGER", "SGLANG_HTTP_SERVER_APP_PATH", "SGLANG_EXTERNAL_MODEL_PACKAGE",
             "NCCL_DEBUG", "CUDA_VISIBLE_DEVICES", "TORCH_LOGS", "OMP_NUM_THREADS", "SGLANG_ENABLE_METADATA_GLUE_GRAPH",
             "SGLANG_NOT_A_SETTING", "SPARKIT_FP8_TUNE", "HF_HUB_OFFLINE", "FLASHINFER_JIT_DIR", "HUMMING_COMPILER",
             "LANG", "lower_case", "_", "A=B", "1X", "", "X Y", "é", "K" * 5000, "SGLANG_" + "X" * 300]
ENV_VALUES = ["/tmp/attacker", "", "1", "provider.so", '"a\\0b"', "'x y'", "9" * 400, "~", "[a]"]

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


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def shape_case(kind: str, rng: random.Random, work: Path, source: Path, text: str) -> tuple[str, list[str], set[str], list]:
    """One of issue 29's shapes around a shipped recipe: (what to load, --set overrides, files an
    error may name besides the shipped ones, things to close after)."""
    work.mkdir()
    if kind == "chain":
        n = rng.choice(CHAIN_LENGTHS)
        (work / "c0.yaml").write_text(f"extends: {source}\n")
        for k in range(1, n):
            (work / f"c{k}.yaml").write_text(f"extends: c{k - 1}.yaml\n")
        return str(work / f"c{n - 1}.yaml"), [], {display_path(work / f"c{k}.yaml") for k in range(n)}, []
    if kind == "wide":  # sparkit's own switches: names every engine's allowlist takes, so that the plan compiles
        (work / "base.yaml").write_text(f"extends: {source}\nserver:\n  env:\n" + "".join(f"    SPARKIT_K{i}: v\n" for i in range(8000)))
        (work / "child.yaml").write_text("extends: base.yaml\nserver:\n  env:\n" + "".join(f"    SPARKIT_J{i}: v\n" for i in range(8000)))
        return str(work / "child.yaml"), [], {display_path(work / "base.yaml"), display_path(work / "child.yaml")}, []
    if kind == "env":
        return env_case(rng, work, source)
    if kind == "huge-number":
        value = rng.choice(HUGE_NUMBERS)
        if rng.random() < 0.5:
            return str(source), [f"{rng.choice(NUMERIC_KEYS)}={value}"], set(), []
        key = rng.choice(NUMERIC_KEYS).split(".")
        nested = "".join(f"{'  ' * d}{k}:\n" for d, k in enumerate(key[:-1])) + f"{'  ' * (len(key) - 1)}{key[-1]}: {value}\n"
        (work / "r.yaml").write_text(f"extends: {source}\n{nested}")
        return str(work / "r.yaml"), [], {display_path(work / "r.yaml")}, []
    if kind == "surrogate":
        snippet = rng.choice(SURROGATES)
        if rng.random() < 0.3:
            return str(source), [rng.choice(['model.path="\\ud800"', 'server.env={"K": "\\udfff"}', 'description="\\udc80x"'])], set(), []
        (work / "r.yaml").write_text(f"extends: {source}\n{snippet}\n")
        return str(work / "r.yaml"), [], {display_path(work / "r.yaml")}, []
    if kind == "long-name":
        length = rng.choice([200, 250, 255, 256, 300, 5000])
        name = ("n" * length)[: length - 5] + ".yaml"
        target = work / name
        if length <= 255:
            target.write_text(text)
        if rng.random() < 0.5:
            (work / "r.yaml").write_text(f"extends: {name}\n")
            return str(work / "r.yaml"), [], {display_path(work / "r.yaml"), display_path(target), str(target)}, []
        return str(target), [], {display_path(target), str(target), name}, []
    if kind == "pipe":
        read_end, write_end = os.pipe()
        data = mutate(rng, text)[1][:60000]  # under a pipe's buffer: written whole before the read
        os.write(write_end, data)
        os.close(write_end)
        return f"/dev/fd/{read_end}", [], {f"/dev/fd/{read_end}"}, [read_end]
    if kind == "fifo":
        fifo = work / "fifo.yaml"
        os.mkfifo(fifo)
        if rng.random() < 0.5:
            (work / "r.yaml").write_text("extends: fifo.yaml\n")
            return str(work / "r.yaml"), [], {display_path(work / "r.yaml")}, []
        return str(fifo), [], {display_path(fifo), str(fifo)}, []
    raise ValueError(kind)


def env_case(rng: random.Random, work: Path, source: Path) -> tuple[str, list[str], set[str], list]:
    """A few environment keys over a shipped recipe, some of them allowed by server.allow_code_env
    (and a name or two there that the recipe does not set), in the recipe file or by --set."""
    names = rng.sample(ENV_NAMES, rng.randint(1, 4))
    values = {name: rng.choice(ENV_VALUES) for name in names}
    allowed = [n for n in names if rng.random() < 0.5] + rng.sample(ENV_NAMES, rng.choice([0, 0, 1, 2]))
    if rng.random() < 0.4:
        env = "{" + ", ".join(f"{json.dumps(n)}: {v}" for n, v in values.items()) + "}"
        return str(source), [f"server.env={env}", f"server.allow_code_env={json.dumps(allowed)}"], set(), []
    text = (f"extends: {source}\nserver:\n  allow_code_env: {json.dumps(allowed)}\n  env:\n"
            + "".join(f"    {json.dumps(n)}: {v}\n" for n, v in values.items()))
    (work / "r.yaml").write_text(text)
    return str(work / "r.yaml"), [], {display_path(work / "r.yaml")}, []


def env_breaches(plan) -> list[str]:
    """Variables of a valid plan's environment that are not its engine's settings and are not both
    allowed by the recipe's server.allow_code_env and shown in plan.code_env."""
    environment = engine_environment(plan.engine)
    allowed = set(plan.recipe["server"]["allow_code_env"])
    return [name for name in plan.env
            if environment.needs_opt_in(name) and (name not in allowed or name not in plan.code_env)]


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


@pytest.mark.slow
def test_mutated_recipes_are_plans_or_located_errors(recipes, tmp_path, capsys):
    rng = random.Random(SEED)
    shipped_files = {display_path(path) for _, path, _ in recipes}
    tally: Counter[str] = Counter()
    problems: list[str] = []
    costs: list[tuple[float, str]] = []
    cli_checked = 0
    # Imports happen once per process (an engine's parser on first use: sglang's takes seconds), and
    # a declared profile's tensors are built once per variant (127k for Ling-3.0-flash, ~1.5 s: what
    # `plan`'s memory fit of a hub model not here reads); paid here, so that a case's CPU time is its own.
    from sparkit.memory.fit import compute_fit

    for _, source, _ in recipes:
        compute_fit(compile_plan(load_recipe(source)), None)
    _through_the_cli(-1, "warm-up", "tiny", Path(recipes[0][1]), [], capsys)
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i in range(MUTATIONS):
            name, source, text = recipes[i % len(recipes)]
            overrides: list[str] = []
            extra_files: set[str] = set()
            to_close: list = []
            if i % SHAPE_EVERY == SHAPE_EVERY - 1:
                op = SHAPES[(i // SHAPE_EVERY) % len(SHAPES)]
                ref, overrides, extra_files, to_close = shape_case(op, rng, tmp_path / f"shape-{i:03d}", source, text)
                path = Path(ref)
            elif i % (MUTATIONS // SET_MUTATIONS) == 0:
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
            allowed = shipped_files | extra_files | ({display_path(path)} if not to_close else set())
            started = cpu_seconds()
            signal.setitimer(signal.ITIMER_REAL, HANG_S)
            try:
                plan = compile_plan(load_recipe(str(path) if to_close else path, overrides))
                tally["valid plan"] += 1
                problems += [f"#{i} {op} {name}: {variable} reaches the engine unannounced" for variable in env_breaches(plan)]
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
                for fd in to_close:
                    os.close(fd)
            runs = [("library", cpu_seconds() - started)]
            if i % CLI_EVERY == 0 and not to_close:
                cli_checked += 1
                started = cpu_seconds()
                problems += _through_the_cli(i, op, name, path, overrides, capsys)
                runs.append(("CLI", cpu_seconds() - started))
            for how, spent in runs:  # each run of the case, through the library and through `sparkit plan`
                costs.append((spent, f"#{i} {op} {name} ({how})"))
                if spent > MAX_CPU_S:
                    problems.append(f"#{i} {op} {name} ({how}): {spent:.2f} s of CPU (more than {MAX_CPU_S} s)")
    finally:
        signal.signal(signal.SIGALRM, old)
    with capsys.disabled():
        print(f"\nfuzz: seed {SEED}, {MUTATIONS} mutations of {len(recipes)} shipped recipes "
              f"({SET_MUTATIONS} of them --set values, one in {SHAPE_EVERY} one of {', '.join(SHAPES)}), "
              f"{cli_checked} also through the CLI")
        for outcome, count in sorted(tally.items()):
            print(f"  {count:4d}  {outcome}")
        print(f"  {len(problems):4d}  internal errors, hangs, unlocated errors or cases over {MAX_CPU_S} s of CPU")
        print("  costliest cases (CPU s): " + ", ".join(f"{c:.2f} {what}" for c, what in sorted(costs, reverse=True)[:5]))
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
