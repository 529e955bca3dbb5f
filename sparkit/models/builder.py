"""Builds sparkit's built-in models (train on the synthetic corpus, gate, save): tiny-ling and
tiny-ling-v3, each a family of sparkit.models.catalog (its model, its builder version, its default
steps, its training shape and quality gate).

A build is defined by a BuildSpec (model name, seed, number of optimiser steps), its family's
builder version and torch's version: never by wall-clock time, the machine's load or its
CPU. Training runs on one thread in a child process whose numerics are the same on every x86-64
CPU (PORTABLE_NUMERICS: ATen's baseline kernels instead of the AVX2/AVX-512 ones the CPU would
pick, and MKL's conditional-numerical-reproducibility branch COMPATIBLE), so the same spec gives
the same bits on an idle laptop, a loaded CI machine, an AMD or an Intel CPU; the data order, the
corpus's token ids and the learning-rate schedule depend only on the spec (the corpus is encoded
by sparkit's own byte-level encoder, not by whatever tokenizers/transformers are installed). The
marker records the numerics a build ran under (`numerics`), so that a comparison across torch
versions or CPU architectures (aarch64 has no MKL) says why it cannot hold instead of failing.

The default build of each family (seed 0, its default steps) ships with the package under the
family's `checkpoints/`, written by this builder (`sparkit model make-tiny --steps ...`);
`ensure_model()` returns it without training. Other specs build into the user cache on first use, in a
temporary sibling directory renamed into place under a file lock, so an interrupted or
concurrent build never leaves a half-written model where a server would load it (and a build
directory left by a killed builder is removed by the next one).

A full-length build must pass a quality gate before it is cached (held-out loss and the greedy
NEXTN accept length of the saved checkpoint): a weak model is refused with the figures, instead
of being cached and failing every later startup check.

The checkpoint's layout and its reading and writing are sparkit.models.checkpoint's;
the builder adds the marker (.sparkit-build.json: the spec, the training figures, the gate's
figures, the trajectory hashes).

Module top-level stays light: torch is imported inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from sparkit.errors import LaunchError, UsageError
from sparkit.models.catalog import family
from sparkit.models.checkpoint import MARKER, WEIGHTS, read_marker, save_checkpoint
from sparkit.models.families import ModelFamily, QualityGate
from sparkit.paths import ensure_dir, make_private_tree, open_output

# One thread: deterministic, and a 3M-parameter model gains little from a second core while
# losing a lot when another process competes for it.
TRAIN_THREADS = 1
TRAIN_THREADS_ENV = "SPARKIT_TRAIN_THREADS"
# The environment of the training child: ATen's baseline (non-vectorised-ISA) kernels and MKL's
# COMPATIBLE branch give the same float32 results on any x86-64 CPU. Measured on this project's
# CI machine (AMD EPYC, AVX2), ten steps of the default build: 4848ceb1 with the CPU's own
# paths, 400fbc82 with ATen's baseline alone, 905364cb with MKL's COMPATIBLE alone, 7b222662
# with both; the first shipped build (BUILDER_VERSION 4, made on an AVX-512 machine) recorded
# f0231663, which no AVX2 machine can reproduce. Both must be set before torch starts, hence the
# child process. Costs about 2x in training time (a full build: ~50 minutes on one core).
PORTABLE_NUMERICS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                     "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# Optimiser steps after which the parameters' hash is recorded in the marker (the builder's
# reproducibility is tested against the shipped checkpoint's record at the first of them).
TRAJECTORY_STEPS = (10, 100)
Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class BuildSpec:
    """What defines a build (with its family's builder version). `steps` None: the family's default."""

    name: str = "tiny-ling"
    seed: int = 0
    steps: int = None  # type: ignore[assignment]  (resolved to the family's default)

    def __post_init__(self) -> None:
        fam = family(self.name)
        if self.steps is None:
            object.__setattr__(self, "steps", fam.default_steps)
        if self.steps < 1:
            raise UsageError(f"a build needs at least one training step, not {self.steps}")

    @property
    def family(self) -> ModelFamily:
        return family(self.name)

    @property
    def dir_name(self) -> str:
        suffix = "" if self.steps == self.family.default_steps else f"-n{self.steps}"
        return f"{self.name}-s{self.seed}{suffix}"

    @property
    def gated(self) -> bool:
        """Full-length builds must pass the quality gate; short ones (tests, the deliberately
        wrong draft) are weak on purpose."""
        return self.steps >= self.family.default_steps

    def key(self) -> dict:
        return {"builder_version": self.family.builder_version, **asdict(self)}


# What measures a saved build for the gate: (directory, seed) -> its figures (heldout_loss,
# accept_length, greetings, unanswered_greetings, probe). The engine that will serve the build
# measures it (sparkit.engines.embedded.quality.measure_quality); the builder sits below the
# engines, so whoever asks for a gated build hands it the measure.
Measure = Callable[[Path, int], dict]


class WeakModelError(LaunchError):
    """A build finished but did not pass the quality gate; nothing was cached."""


def builtin_model_dir(name: str = "tiny-ling", seed: int = 0, steps: int | None = None) -> Path:
    """Where the build of (name, seed, steps) lives: the shipped checkpoint when the package has
    it, else the user cache."""
    spec = BuildSpec(name, seed, steps)
    shipped = spec.family.shipped_dir / spec.dir_name
    if is_complete(shipped, spec):
        return shipped
    from sparkit.paths import cache_dir

    return cache_dir() / "models" / spec.dir_name


def is_complete(directory: str | Path, spec: BuildSpec | None = None) -> bool:
    """A finished build of this builder version (and of `spec`, when given)."""
    marker = read_marker(directory)
    if marker is None or marker.get("builder_version") != _builder_version(marker):
        return False
    if spec is not None and any(marker.get(k) != v for k, v in spec.key().items()):
        return False
    return (Path(directory) / WEIGHTS).is_file()


def _builder_version(marker: dict) -> int | None:
    """The current builder version of the family a marker names (None: no such family)."""
    from sparkit.models.catalog import FAMILIES

    fam = FAMILIES.get(marker.get("name", "tiny-ling"))
    return fam.builder_version if fam is not None else None


def ensure_model(
    name: str = "tiny-ling",
    seed: int = 0,
    directory: str | Path | None = None,
    progress: Progress | None = None,
    steps: int | None = None,
    gate: QualityGate | bool = True,
    measure: Measure | None = None,
) -> Path:
    """The directory of a complete build of (name, seed, steps), building it first if needed.

    `directory` None: the shipped checkpoint or the user cache. A given directory gets a copy of
    the shipped build when there is one for this spec, else a fresh build. `gate`: True gates
    full-length builds with the family's gate, False never gates, a QualityGate always applies; a
    build that is gated is measured with `measure` (see Measure)."""
    import fcntl

    spec = BuildSpec(name, seed, None if steps is None else int(steps))
    target = Path(directory) if directory is not None else builtin_model_dir(spec.name, spec.seed, spec.steps)
    report = progress or (lambda fraction, message: None)
    if is_complete(target, spec):
        remove_dead_builds(target.parent)
        report(1.0, f"using existing build at {target}")
        return target
    ensure_dir(target.parent)
    lock_path = target.parent / f".{target.name}.lock"
    with open_output(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent builder finishes first; we then reuse its build
        remove_dead_builds(target.parent, holding=target.name)
        if is_complete(target, spec):
            report(1.0, f"using existing build at {target}")
            return target
        if target.exists() and any(target.iterdir()):
            if read_marker(target) is None and not (target / WEIGHTS).exists():
                raise UsageError(
                    f"{target} exists and is not a {spec.name} build; refusing to overwrite it",
                    hint="choose an empty or new directory",
                )
        tmp = target.parent / f".{target.name}.building-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            shipped = spec.family.shipped_dir / spec.dir_name
            if is_complete(shipped, spec):
                shutil.copytree(shipped, tmp)
                report(0.97, f"copied the shipped build from {shipped}")
            else:
                tmp.mkdir(parents=True)
                chosen = gate if isinstance(gate, QualityGate) else (spec.family.gate if gate and spec.gated else None)
                build_model(tmp, spec, progress=report, gate=chosen, measure=measure)
            make_private_tree(tmp)  # torch and the tokenizer wrote under the umask
            if target.exists():
                shutil.rmtree(target)  # an outdated or incomplete build
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    report(1.0, f"built {name} at {target}")
    return target


_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?:building-\d+|exporting)$")


def remove_dead_builds(parent: Path, holding: str | None = None) -> list[Path]:
    """Remove the temporary directories (`.NAME.building-PID`, `.NAME.exporting`) that a builder
    or exporter killed mid-way (SIGKILL, a power cut) left in `parent`; returns them.

    Whether one is dead is told by its lock, not by its pid (pids are reused): a builder holds
    `.NAME.lock` from before it creates its directory until after it renames it, so a lock
    nobody holds means nobody will finish that directory. `holding` is the NAME whose lock the
    caller holds (its leftovers are dead too)."""
    import fcntl

    removed = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for leftover in entries:
        match = _LEFTOVER.match(leftover.name)
        if not match or not leftover.is_dir() or leftover.name.endswith(f".building-{os.getpid()}"):
            continue
        name = match.group("name")
        if name != holding:
            try:
                fd = os.open(parent / f".{name}.lock", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:
                fd = None  # no lock was ever taken for it: no builder of this sparkit made it
            except OSError:
                continue
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    continue  # its builder is at work
                try:
                    shutil.rmtree(leftover, ignore_errors=True)
                finally:
                    os.close(fd)  # closing releases the lock
                removed.append(leftover)
                continue
        shutil.rmtree(leftover, ignore_errors=True)
        removed.append(leftover)
    return removed


def build_model(directory: Path, spec: BuildSpec | None = None, progress: Progress | None = None,
                gate: QualityGate | None = None, config=None, stop_after: int | None = None,
                measure: Measure | None = None) -> dict:
    """Train the model of `spec` for spec.steps steps and save it into `directory`; returns the marker.

    Training runs in a child process under PORTABLE_NUMERICS (see the module docstring); this
    process then measures the saved weights. `stop_after` ends training early with the full
    schedule (the first steps of a longer build, bit for bit: what the reproducibility test
    compares). With `gate`, the saved checkpoint is measured with `measure` and WeakModelError
    raised when it falls short (the caller discards the directory)."""
    if gate is not None and measure is None:  # said before the training, not after it
        raise TypeError("a gated build needs a measure (sparkit.engines.embedded.quality.measure_quality)")
    spec = spec or BuildSpec()
    report = progress or (lambda fraction, message: None)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    report(0.0, f"training {spec.name} ({spec.steps} steps, seed {spec.seed})")
    stats = _train_in_child(directory, spec, config, stop_after, lambda f, m: report(0.9 * f, m))
    report(0.91, "saved")
    marker = {**spec.key(), **stats}
    if gate is not None:
        report(0.93, "quality gate: held-out loss and NEXTN accept length of the saved weights")
        assert measure is not None
        figures = measure(directory, spec.seed)
        marker["quality"] = figures
        problems = []
        if figures["heldout_loss"] > gate.max_heldout_loss:
            problems.append(f"held-out loss {figures['heldout_loss']:.3f} nats/token > {gate.max_heldout_loss}")
        if figures["accept_length"] < gate.min_accept_length:
            problems.append(f"NEXTN accept length {figures['accept_length']:.2f} < {gate.min_accept_length}")
        if gate.greetings_answered and figures["unanswered_greetings"]:
            problems.append(f"no reply to {', '.join(map(repr, figures['unanswered_greetings']))}")
        if problems:
            raise WeakModelError(
                f"the trained {spec.name} is too weak to use: " + "; ".join(problems) + " (not cached)",
                hint="the builder or the corpus changed without retuning the family's default steps; "
                     "rebuild with more steps (`sparkit model make-tiny --steps N`)",
            )
    (directory / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return marker


def numerics_key(numerics: dict | None) -> tuple:
    """What must be equal for two builds of one spec to be equal bit for bit (the recorded
    `numerics` of a marker, or current_numerics()): torch's version, the CPU architecture, the
    BLAS and its reproducibility branch, the thread count. The CPU model is not among them:
    that is what PORTABLE_NUMERICS removes."""
    numerics = numerics or {}
    return tuple(numerics.get(k) for k in ("torch", "machine", "blas", "mkl_cbwr", "threads"))


def current_numerics(threads: int | None = None) -> dict:
    """The numerics a training child on this machine runs under (what the marker records)."""
    import torch

    blas = "mkl" if torch.backends.mkl.is_available() else "other"
    return {"torch": torch.__version__, "machine": platform.machine(), "blas": blas,
            "mkl_cbwr": PORTABLE_NUMERICS["MKL_CBWR"] if blas == "mkl" else None,
            "cpu_capability": PORTABLE_NUMERICS["ATEN_CPU_CAPABILITY"].upper(),
            "threads": threads or _train_threads()}


def _train_threads() -> int:
    raw = os.environ.get(TRAIN_THREADS_ENV, "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else TRAIN_THREADS


def _train_in_child(directory: Path, spec: BuildSpec, config, stop_after: int | None, progress: Progress) -> dict:
    """Run _child_main in a fresh interpreter with PORTABLE_NUMERICS; relay its progress; return
    its training figures. The child dies with this process (PR_SET_PDEATHSIG), so a builder
    killed mid-way leaves no trainer running."""
    from sparkit.runs.processes import die_with_parent

    threads = _train_threads()
    request = {"directory": str(directory), "spec": asdict(spec), "stop_after": stop_after,
               "config": config.to_dict() if config is not None else None, "threads": threads}
    env = {**os.environ, **PORTABLE_NUMERICS, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    child = subprocess.Popen([sys.executable, "-m", "sparkit.models.builder", json.dumps(request)],
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
                          hint="run `sparkit model make-tiny DIR` to see the whole output")
    return stats


def _child_main(raw: str) -> int:
    """The training child: build under PORTABLE_NUMERICS, save, print JSON lines (progress, then
    the training figures)."""
    request = json.loads(raw)
    import torch

    from sparkit.models.tiny_ling import tokenizer as tok

    capability = torch.backends.cpu.get_cpu_capability()
    if capability != "DEFAULT":  # the environment did not reach torch: the build would not be portable
        print(f"torch runs with CPU capability {capability}, not DEFAULT (ATEN_CPU_CAPABILITY)", file=sys.stderr)
        return 3
    threads = int(request["threads"])
    torch.set_num_threads(threads)
    spec = BuildSpec(**request["spec"])
    directory = Path(request["directory"])
    tokenizer = tok.build_tokenizer()

    def emit(event: dict) -> None:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    fam = spec.family
    torch.manual_seed(spec.seed)
    model = fam.new_model(request["config"], tokenizer)
    training = fam.training
    stats = train(model, seed=spec.seed, steps=spec.steps, stop_after=request["stop_after"],
                  progress=lambda f, m: emit({"progress": f, "message": m}), batch_size=training.batch_size,
                  seq_len=training.seq_len, loss_fn=fam.training_loss, after_step=fam.after_step,
                  peak_lr=training.peak_lr, warmup=training.warmup)
    stats["numerics"] = current_numerics(threads)
    cfg = model.config
    cfg.torch_dtype = "bfloat16"
    cfg.sparkit = {**spec.key(), **stats}
    save_checkpoint(model, directory)
    tokenizer.save_pretrained(str(directory))
    tok.add_template_to_config(directory)
    emit({"stats": stats})
    return 0


def train(model, seed: int, steps: int, progress: Progress, batch_size: int = 16, seq_len: int = 128,
          stop_after: int | None = None, loss_fn: Callable | None = None, after_step: Callable | None = None,
          peak_lr: float = 3e-3, warmup: int = 20) -> dict:
    """AdamW on packed corpus sequences for `steps` steps (warm-up, then cosine decay over the
    steps). Everything depends on (seed, steps) only, so the result is the same on any load."""
    import math
    import time

    import torch

    from sparkit.models.tiny_ling.corpus import token_stream

    if loss_fn is None:
        from sparkit.models.tiny_ling.model import training_loss as loss_fn
    stream = token_stream(seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.01)
    end = steps if stop_after is None else min(steps, stop_after)
    model.train()
    started = time.monotonic()
    loss_main = loss_mtp = float("nan")
    trajectory: dict[str, str] = {}
    for step in range(end):
        fraction = step / steps
        lr = peak_lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * fraction)))
        for group in opt.param_groups:
            group["lr"] = lr
        batch = torch.tensor([[next(stream) for _ in range(seq_len + 1)] for _ in range(batch_size)])
        loss, lm, lmtp = loss_fn(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if after_step is not None:
            after_step(model)
        loss_main, loss_mtp = float(lm), float(lmtp)
        done = step + 1
        if done in TRAJECTORY_STEPS:
            trajectory[str(done)] = parameter_hash(model)
        if done % 5 == 0 or done == end:
            progress(done / steps, f"step {done}/{steps}  loss {loss_main:.3f}  mtp loss {loss_mtp:.3f}")
    model.eval()
    return {"train_steps": end, "train_seconds": round(time.monotonic() - started, 1),
            "final_loss": round(loss_main, 4), "final_mtp_loss": round(loss_mtp, 4),
            "parameters": sum(p.numel() for p in model.parameters()), "trajectory": trajectory}


def parameter_hash(model) -> str:
    """sha256 of every parameter's float32 bytes in state-dict order (first 16 hex digits)."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1]))
