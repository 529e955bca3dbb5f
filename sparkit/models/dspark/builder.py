"""Builds a DSpark draft for a target (regenerate the target's own text, train, gate, save).

A build is defined by a DraftSpec (the draft's name, which names its target; a seed; the
optimiser steps), the builder's code (BUILDER_VERSION), the target build it drafts for and torch's
version, never by wall-clock time or the machine's load: it runs in a child process under
tiny-ling's PORTABLE_NUMERICS (sparkit.models.builder: ATen's baseline kernels, MKL's
COMPATIBLE branch, one thread), so the same spec gives the same bits on any x86-64 CPU. The
data: the target's greedy continuations (GENERATED_TOKENS each, EOS ignored, as the startup probe
asks) of prompts from the target's corpus, one sequence per prompt in a fixed order; the first
steps read only the first sequences, so `stop_after` rebuilds a build's first steps bit for bit
(what the reproducibility test compares with the shipped marker's trajectory).

`steps: 0` is a draft that never trained (its initialisation, seeded): what a random draft
accepts, and what the startup checks must refuse (recipes/tiny/tiny-dspark-random-draft.yaml).

The default build (tiny-ling-dspark, seed 0) ships under `checkpoints/`; others build into the
user cache on first use, in a temporary sibling directory renamed into place under a file lock
(the same scheme and clean-up as tiny-ling's builds). A full-length build must pass a quality gate
(its greedy DSpark accept length, and NEXTN's on the same prompts) before it is kept.

Module top-level stays light: torch is imported inside the functions.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from sparkit.errors import LaunchError, UsageError
from sparkit.models.builder import (
    PORTABLE_NUMERICS,
    WeakModelError,
    current_numerics,
    parameter_hash,
    remove_dead_builds,
)
from sparkit.models.catalog import BUILTIN_DRAFTS, family  # noqa: F401  (BUILTIN_DRAFTS: the drafts' names, by the other built-ins')
from sparkit.models.dspark.checkpoint import MARKER, WEIGHTS, read_marker, save_draft
from sparkit.paths import ensure_dir, make_private_tree, open_output

# Bump when the draft's code, its data or its training changes what a spec builds
# (tests/models/test_dspark_builder.py fails when the shipped draft was not rebuilt).
BUILDER_VERSION = 1
DEFAULT_TRAIN_STEPS = 800
SEQUENCES = 1200  # regenerated training sequences (prompts of the target's corpus)
GENERATED_TOKENS = 80  # the target's continuation of each prompt
PROMPT_SEED = 30_000  # + the spec's seed: prompts no gate or test draws
BATCH, ANCHORS = 16, 16  # sequences per step, blocks per sequence
TRAJECTORY_STEPS = (4, 100)
SHIPPED_DIR = Path(__file__).resolve().parent / "checkpoints"

Progress = Callable[[float, str], None]
# What measures a saved draft for the gate: (draft directory, target directory) -> figures
# (accept_length, nextn_accept_length, probe). The engine that serves it measures it
# (sparkit.engines.embedded.quality.measure_draft_quality); whoever asks for a gated build hands it in.
Measure = Callable[[Path, Path], dict]


@dataclass(frozen=True)
class DraftSpec:
    """What defines a draft build (with BUILDER_VERSION and the target build)."""

    name: str = "tiny-ling-dspark"
    seed: int = 0
    steps: int = DEFAULT_TRAIN_STEPS

    def __post_init__(self) -> None:
        if self.name not in BUILTIN_DRAFTS:
            raise UsageError(f"unknown built-in draft {self.name!r}", hint=f"available: {', '.join(BUILTIN_DRAFTS)}")
        if self.steps < 0:
            raise UsageError(f"a draft build takes 0 (untrained) or more training steps, not {self.steps}")

    @property
    def target(self) -> str:
        return BUILTIN_DRAFTS[self.name]

    @property
    def dir_name(self) -> str:
        suffix = "" if self.steps == DEFAULT_TRAIN_STEPS else f"-n{self.steps}"
        return f"{self.name}-s{self.seed}{suffix}"

    @property
    def gated(self) -> bool:
        """Full-length builds must pass the quality gate; shorter ones (tests, the untrained draft)
        are weak on purpose."""
        return self.steps >= DEFAULT_TRAIN_STEPS

    def key(self) -> dict:
        return {"builder_version": BUILDER_VERSION, **asdict(self)}


@dataclass(frozen=True)
class QualityGate:
    """What a full-length draft must reach (greedy, on held-out prompts of the target's corpus)."""

    min_accept_length: float = 3.0  # issue 35's goal
    at_least_nextn: bool = True  # and no less than the target's own NEXTN 3/1/4 on the same prompts


DEFAULT_GATE = QualityGate()


def target_key(target_dir: Path) -> dict:
    """Which target build a draft was trained against (its builder's marker, else its path)."""
    from sparkit.models.checkpoint import read_marker as read_target_marker

    marker = read_target_marker(target_dir) or {}
    keys = ("name", "seed", "steps", "builder_version")
    return {k: marker.get(k) for k in keys} if marker else {"path": str(target_dir)}


def builtin_draft_dir(name: str = "tiny-ling-dspark", seed: int = 0, steps: int = DEFAULT_TRAIN_STEPS) -> Path:
    """Where the draft build of (name, seed, steps) lives: the shipped one, else the user cache."""
    spec = DraftSpec(name, seed, steps)
    shipped = SHIPPED_DIR / spec.dir_name
    if is_complete(shipped, spec):
        return shipped
    from sparkit.paths import cache_dir

    return cache_dir() / "models" / spec.dir_name


def is_complete(directory: str | Path, spec: DraftSpec | None = None) -> bool:
    marker = read_marker(directory)
    if marker is None or marker.get("builder_version") != BUILDER_VERSION:
        return False
    if spec is not None and any(marker.get(k) != v for k, v in spec.key().items()):
        return False
    if spec is not None and (marker.get("target") or {}).get("builder_version") != family(spec.target).builder_version:
        # trained against a target its builder no longer makes: its drafts would be for another model
        return False
    return (Path(directory) / WEIGHTS).is_file()


def ensure_draft(name: str = "tiny-ling-dspark", seed: int = 0, directory: str | Path | None = None,
                 progress: Progress | None = None, steps: int | None = None, gate: QualityGate | bool = True,
                 measure: Measure | None = None) -> Path:
    """The directory of a complete draft build, building it first if needed (the shipped build
    is copied when it is the one asked for). `gate`: True gates full-length builds, False never,
    a QualityGate always; a gated build is measured with `measure`."""
    import fcntl

    spec = DraftSpec(name, seed, DEFAULT_TRAIN_STEPS if steps is None else int(steps))
    target = Path(directory) if directory is not None else builtin_draft_dir(spec.name, spec.seed, spec.steps)
    report = progress or (lambda fraction, message: None)
    if is_complete(target, spec):
        report(1.0, f"using existing build at {target}")
        return target
    ensure_dir(target.parent)
    with open_output(target.parent / f".{target.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        remove_dead_builds(target.parent, holding=target.name)
        if is_complete(target, spec):
            report(1.0, f"using existing build at {target}")
            return target
        if target.exists() and any(target.iterdir()) and read_marker(target) is None and not (target / WEIGHTS).exists():
            raise UsageError(f"{target} exists and is not a DSpark draft build; refusing to overwrite it",
                             hint="choose an empty or new directory")
        tmp = target.parent / f".{target.name}.building-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            shipped = SHIPPED_DIR / spec.dir_name
            if is_complete(shipped, spec):
                shutil.copytree(shipped, tmp)
            else:
                tmp.mkdir(parents=True)
                chosen = gate if isinstance(gate, QualityGate) else (DEFAULT_GATE if gate and spec.gated else None)
                build_draft(tmp, spec, progress=report, gate=chosen, measure=measure)
            make_private_tree(tmp)
            if target.exists():
                shutil.rmtree(target)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    report(1.0, f"built {name} at {target}")
    return target


def build_draft(directory: Path, spec: DraftSpec | None = None, progress: Progress | None = None,
                gate: QualityGate | None = None, stop_after: int | None = None, measure: Measure | None = None,
                target_dir: Path | None = None) -> dict:
    """Train the draft of `spec` in a PORTABLE_NUMERICS child and save it into `directory`;
    returns the marker. With `gate`, the saved draft is measured with `measure` and
    WeakModelError raised when it falls short (the caller discards the directory)."""
    from sparkit.models.dspark.target import TARGETS

    if gate is not None and measure is None:
        raise TypeError("a gated draft build needs a measure (sparkit.engines.embedded.quality.measure_draft_quality)")
    spec = spec or DraftSpec()
    report = progress or (lambda fraction, message: None)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target_dir = Path(target_dir) if target_dir is not None else TARGETS[spec.target].checkpoint()
    report(0.0, f"training {spec.name} for {spec.target} ({spec.steps} steps, seed {spec.seed})")
    stats = _train_in_child(directory, spec, target_dir, stop_after, lambda f, m: report(0.9 * f, m))
    marker = {**spec.key(), "target": {"name": spec.target, **target_key(target_dir)}, **stats}
    if gate is not None:
        assert measure is not None
        report(0.93, "quality gate: greedy DSpark and NEXTN accept lengths on held-out prompts")
        figures = measure(directory, target_dir)
        marker["quality"] = figures
        problems = []
        if figures["accept_length"] < gate.min_accept_length:
            problems.append(f"DSpark accept length {figures['accept_length']:.2f} < {gate.min_accept_length}")
        if gate.at_least_nextn and figures["accept_length"] < figures["nextn_accept_length"]:
            problems.append(f"DSpark accept length {figures['accept_length']:.2f} < NEXTN's "
                            f"{figures['nextn_accept_length']:.2f} on the same prompts")
        if problems:
            raise WeakModelError(f"the trained {spec.name} is too weak to use: " + "; ".join(problems) + " (not cached)",
                                 hint="the builder, its data or the target changed without retuning "
                                      "DEFAULT_TRAIN_STEPS; rebuild with more steps (`sparkit model make-dspark --steps N`)")
    (directory / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return marker


def _train_in_child(directory: Path, spec: DraftSpec, target_dir: Path, stop_after: int | None, progress: Progress) -> dict:
    """_child_main in a fresh interpreter under PORTABLE_NUMERICS; its progress relayed; its
    figures returned. The child dies with this process (PR_SET_PDEATHSIG)."""
    from sparkit.runs.processes import die_with_parent

    request = {"directory": str(directory), "spec": asdict(spec), "target_dir": str(target_dir), "stop_after": stop_after}
    env = {**os.environ, **PORTABLE_NUMERICS}
    child = subprocess.Popen([sys.executable, "-m", "sparkit.models.dspark.builder", json.dumps(request)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             preexec_fn=die_with_parent(signal.SIGKILL))
    stats = None
    try:
        assert child.stdout is not None
        for line in child.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if "stats" in event:
                stats = event["stats"]
            elif "progress" in event:
                progress(float(event["progress"]), str(event["message"]))
        errors = child.stderr.read() if child.stderr is not None else ""
        code = child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if code != 0 or stats is None:
        tail = "\n".join(errors.strip().splitlines()[-12:])
        raise LaunchError(f"training {spec.name} failed (trainer exit status {code})" + (f":\n{tail}" if tail else ""),
                          hint="run `sparkit model make-dspark DIR` to see the whole output")
    return stats


def _child_main(raw: str) -> int:
    """The training child: regenerate, capture, train, save; JSON lines on stdout (progress, then
    the training figures)."""
    request = json.loads(raw)
    import torch

    from sparkit.models.dspark import training
    from sparkit.models.dspark.model import LingDSparkModel
    from sparkit.models.dspark.target import TARGETS

    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":
        print(f"torch runs with CPU capability {torch.backends.cpu.get_cpu_capability()}, not DEFAULT "
              "(ATEN_CPU_CAPABILITY)", file=sys.stderr)
        return 3
    torch.set_num_threads(1)
    spec, stop_after = DraftSpec(**request["spec"]), request["stop_after"]
    directory, target_dir = Path(request["directory"]), Path(request["target_dir"])

    def emit(event: dict) -> None:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    kind = TARGETS[spec.target]
    target = kind.load(target_dir)
    for parameter in target.model.parameters():  # frozen: the draft trains against them, never into them
        parameter.requires_grad_(False)
    config = kind.draft_config(target_dir)
    torch.manual_seed(spec.seed)
    draft = LingDSparkModel(config)
    draft.attach_shared(target.embed_tokens, target.lm_head)
    stats: dict = {"train_steps": 0, "parameters": sum(p.numel() for p in draft.parameters()), "trajectory": {}}
    if spec.steps > 0:
        # the steps that run read only the first sequences of the first pass (training.train)
        count = min(SEQUENCES, (stop_after or spec.steps) * BATCH)
        prompts = kind.prompts(target_dir, count, PROMPT_SEED + spec.seed)
        texts = training.regenerate(target, prompts, GENERATED_TOKENS,
                                    lambda f, m: emit({"progress": 0.3 * f, "message": m}))
        data = training.capture(target, texts, tuple(config.target_layer_ids))
        trajectory: dict[str, str] = {}

        def on_step(done: int) -> None:
            if done in TRAJECTORY_STEPS:
                trajectory[str(done)] = parameter_hash(draft)

        stats = training.train(draft, data, spec.steps, spec.seed,
                               lambda f, m: emit({"progress": 0.3 + 0.7 * f, "message": m}),
                               batch=BATCH, anchors=ANCHORS, stop_after=stop_after, on_step=on_step)
        stats["trajectory"] = trajectory
        stats["sequences"] = len(texts)
    stats["numerics"] = current_numerics(1)
    config.sparkit = {**spec.key(), "target": {"name": spec.target, **target_key(target_dir)}}
    save_draft(draft, directory, tokenizer_from=target_dir)
    emit({"stats": stats})
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1]))
