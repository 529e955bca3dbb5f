"""Builds tiny-ling (train on the synthetic corpus, save) and loads checkpoints.

`ensure_model()` builds into the user cache on first use and reuses a complete build after:
a build is complete when its marker file names the current BUILDER_VERSION. Builds happen in
a temporary sibling directory renamed into place, under a file lock, so that an interrupted or
concurrent build never leaves a half-written model where a server would load it.

Checkpoint layout: config.json, model.safetensors, tokenizer.json, tokenizer_config.json
(+ chat_template.jinja), .sparkit-build.json (the marker).

Module top-level stays light: torch is imported inside the functions.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from sparkit.errors import LaunchError, UsageError

# 1 again: the 8-layer shape briefly built as version 2 was not kept (v2 builds rebuild; v1 builds are this shape)
BUILDER_VERSION = 1
MARKER = ".sparkit-build.json"
WEIGHTS = "model.safetensors"
BUILTIN_MODELS = ("tiny-ling",)
DEFAULT_TRAIN_SECONDS = 90.0

Progress = Callable[[float, str], None]


def builtin_model_dir(name: str = "tiny-ling", seed: int = 0) -> Path:
    from sparkit.paths import cache_dir

    _check_name(name)
    return cache_dir() / "models" / f"{name}-s{seed}"


def is_complete(directory: str | Path) -> bool:
    marker = Path(directory) / MARKER
    try:
        return json.loads(marker.read_text()).get("builder_version") == BUILDER_VERSION
    except (OSError, ValueError):
        return False


def ensure_model(
    name: str = "tiny-ling",
    seed: int = 0,
    directory: str | Path | None = None,
    progress: Progress | None = None,
    train_seconds: float | None = None,
) -> Path:
    """The directory of a complete build of `name` (building it first if needed)."""
    import fcntl

    _check_name(name)
    target = Path(directory) if directory is not None else builtin_model_dir(name, seed)
    report = progress or (lambda fraction, message: None)
    if is_complete(target):
        report(1.0, f"using existing build at {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent builder finishes first; we then reuse its build
        if is_complete(target):
            report(1.0, f"using existing build at {target}")
            return target
        if target.exists() and any(target.iterdir()):
            if not (target / MARKER).exists() and not (target / WEIGHTS).exists():
                raise UsageError(
                    f"{target} exists and is not a tiny-ling build; refusing to overwrite it",
                    hint="choose an empty or new directory",
                )
        tmp = target.parent / f".{target.name}.building-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            build_model(tmp, seed=seed, progress=report, train_seconds=train_seconds)
            if target.exists():
                shutil.rmtree(target)  # an outdated or incomplete build
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    report(1.0, f"built {name} at {target}")
    return target


def build_model(directory: Path, seed: int = 0, progress: Progress | None = None, train_seconds: float | None = None, config=None,
                max_steps: int | None = None) -> dict:
    """Train tiny-ling and save it into `directory`; returns the training stats. `max_steps`
    (tests) stops after that many steps, which makes the result identical run to run."""
    import torch

    from sparkit.engines.embedded import tokenizer as tok
    from sparkit.engines.embedded.model import TinyLingConfig, TinyLingForCausalLM

    report = progress or (lambda fraction, message: None)
    train_seconds = DEFAULT_TRAIN_SECONDS if train_seconds is None else float(train_seconds)
    tokenizer = tok.build_tokenizer()
    cfg = config or TinyLingConfig()
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    report(0.0, "training tiny-ling")
    with _torch_threads():
        torch.manual_seed(seed)
        model = TinyLingForCausalLM(cfg)
        stats = train(model, tokenizer, seed=seed, train_seconds=train_seconds, progress=lambda f, m: report(0.97 * f, m), max_steps=max_steps)
    cfg.sparkit = {"builder_version": BUILDER_VERSION, "seed": seed, **stats}
    report(0.98, "saving")
    save_checkpoint(model, directory)
    tokenizer.save_pretrained(str(directory))
    tok.add_template_to_config(directory)
    (directory / MARKER).write_text(json.dumps({"builder_version": BUILDER_VERSION, "seed": seed, **stats}, indent=2) + "\n")
    return stats


def train(model, tokenizer, seed: int, train_seconds: float, progress: Progress, batch_size: int = 16, seq_len: int = 128,
          max_steps: int | None = None) -> dict:
    """AdamW on packed corpus sequences until `train_seconds` have passed (at least a few steps).
    The data order depends only on the seed; the number of steps depends on the machine."""
    import math

    import torch

    from sparkit.engines.embedded.corpus import token_stream
    from sparkit.engines.embedded.model import training_loss

    stream = token_stream(tokenizer, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01)
    peak_lr, warmup = 3e-3, 20
    model.train()
    started = time.monotonic()
    step, loss_main, loss_mtp = 0, float("nan"), float("nan")
    while True:
        elapsed = time.monotonic() - started
        if (elapsed >= train_seconds and step >= 1) or (max_steps is not None and step >= max_steps):
            break
        fraction = min(1.0, elapsed / max(train_seconds, 1e-9)) if max_steps is None else step / max_steps
        # warmup, then cosine decay over the time budget (the budget is wall time, not steps)
        lr = peak_lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * fraction)))
        for group in opt.param_groups:
            group["lr"] = lr
        batch = torch.tensor([[next(stream) for _ in range(seq_len + 1)] for _ in range(batch_size)])
        loss, lm, lmtp = training_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        loss_main, loss_mtp = float(lm), float(lmtp)
        if step % 5 == 0:
            progress(fraction, f"step {step}  loss {loss_main:.3f}  mtp loss {loss_mtp:.3f}")
    model.eval()
    return {"train_steps": step, "train_seconds": round(time.monotonic() - started, 1),
            "final_loss": round(loss_main, 4), "final_mtp_loss": round(loss_mtp, 4),
            "parameters": sum(p.numel() for p in model.parameters())}


def save_checkpoint(model, directory: Path) -> None:
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.config.save(directory)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(directory / WEIGHTS), metadata={"format": "pt"})


def load_checkpoint(directory: str | Path):
    """(config, model on CPU in float32) from a checkpoint directory; unreadable or inconsistent
    files raise LaunchError naming the file."""
    import torch

    from sparkit.engines.embedded.model import MODEL_CLASS, TinyLingConfig, TinyLingForCausalLM

    directory = Path(directory)
    config_path, weights_path = directory / "config.json", directory / WEIGHTS
    if not directory.is_dir():
        raise LaunchError(f"model directory {directory} does not exist", hint="build one with `sparkit model make-tiny`")
    try:
        raw = json.loads(config_path.read_text())
        if MODEL_CLASS not in raw.get("architectures", []):
            raise ValueError(f"architectures {raw.get('architectures')} does not include {MODEL_CLASS}")
        cfg = TinyLingConfig.from_dict(raw)
    except (OSError, ValueError, TypeError) as exc:
        raise LaunchError(f"cannot read model config {config_path}: {exc}") from None
    try:
        from safetensors.torch import load_file

        state = load_file(str(weights_path))
    except Exception as exc:  # safetensors raises several types for truncated/garbled files
        raise LaunchError(f"cannot read checkpoint {weights_path}: {exc}", hint="rebuild it with `sparkit model make-tiny`") from None
    model = TinyLingForCausalLM(cfg)
    try:
        model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0:3]
        raise LaunchError(f"checkpoint {weights_path} does not match {config_path}: {' '.join(first)}") from None
    model.eval()
    return cfg, model


def _check_name(name: str) -> None:
    if name not in BUILTIN_MODELS:
        raise UsageError(f"unknown built-in model {name!r}", hint=f"available: {', '.join(BUILTIN_MODELS)}")


class _torch_threads:
    """Cap torch's intra-op threads during training (the machine is usually shared)."""

    def __enter__(self):
        import torch

        self.saved = torch.get_num_threads()
        # On a busy machine extra intra-op threads spin against other processes and make each
        # step several times slower, so use only the cores that are idle right now.
        cores = os.cpu_count() or 1
        idle = cores - round(os.getloadavg()[0])
        wanted = int(os.environ.get("SPARKIT_TRAIN_THREADS", "0")) or max(1, min(cores, idle))
        torch.set_num_threads(max(1, wanted))

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.saved)
