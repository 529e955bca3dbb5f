"""Loading the engine: the checkpoint checked before torch is imported (a message naming the
file), the engine built from the launch settings, SGLang's "Load weight" lines."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from sparkit.engines.embedded.settings import engine_config
from sparkit.engines.embedded.worker import log

# -- engine loading ------------------------------------------------------------------------------------


class CheckpointError(Exception):
    """The checkpoint cannot be used; str() names the file."""


def check_checkpoint(model_path: Path) -> dict:
    """Fail fast, naming the file, before torch is even imported."""
    if not model_path.is_dir():
        raise CheckpointError(f"--model-path {model_path}: not a directory (build one with `sparkit model make-tiny {model_path}`)")
    from sparkit.checkpoint_headers import read_config, read_safetensors_header, safetensors_files
    from sparkit.errors import DataError

    try:
        config = read_config(model_path)
        weights = safetensors_files(model_path)  # what the index names (each must be there), else model.safetensors
    except DataError as exc:  # names config.json or the index and what is wrong with it
        raise CheckpointError(str(exc)) from None
    if not weights:
        raise CheckpointError(f"{model_path / 'model.safetensors'}: missing")
    try:
        for path in weights:
            read_safetensors_header(path)  # checked against the file's size, tensor by tensor
    except DataError as exc:
        raise CheckpointError(f"unreadable or corrupt safetensors file: {exc}") from None
    return config


def checkpoint_parameters(model_path: Path) -> int:
    """Parameter count from the safetensors headers (0 when unreadable: check_checkpoint names why)."""
    from sparkit.checkpoint_headers import read_safetensors_index
    from sparkit.errors import DataError

    try:
        return sum(t.numel for t in read_safetensors_index(Path(model_path)).tensors.values())
    except DataError:
        return 0


# Parameters per intra-op thread under --torch-threads auto. A small model's decode step is
# bound by the number of ops, not by arithmetic: extra threads add synchronisation, and when
# another process holds a core they spin against it (measured on tiny-ling, 2 cores, one busy
# process beside the server: 2 threads decode ~4x slower than 1; benchmarks/embedded_contention.py).
PARAMETERS_PER_THREAD = 20_000_000


def auto_torch_threads(parameters: int, cpus: int | None = None) -> int:
    cpus = cpus or os.cpu_count() or 1
    return max(1, min(cpus, -(-int(parameters) // PARAMETERS_PER_THREAD)))


def load_engine(args: argparse.Namespace, served_name: str, parameters: int = 0) -> Any:
    import torch

    from sparkit.engines.embedded.engine import EmbeddedEngine

    config = engine_config(args, served_name)
    log(f"Load weight begin. model_path={args.model_path}, device={args.device}, expert_weights={args.expert_weights}, lm_head_dtype={args.lm_head_dtype}")
    threads = args.torch_threads or auto_torch_threads(parameters)
    # in the worker thread, which runs every forward; before the engine loads, whose batching
    # check measures the kernels with the threads they will run with
    torch.set_num_threads(threads)
    engine = EmbeddedEngine(config)
    log(f"torch intra-op threads: {threads} ({'--torch-threads' if args.torch_threads else 'auto'}, "
        f"{parameters / 1e6:.1f}M parameters, {os.cpu_count()} CPUs)")
    for line in load_weight_end_lines(engine):
        log(line)
    for note in engine.activation_report().notes:  # e.g. "Online FP8 quantization enabled for lm_head."
        log(note)
    return engine


def load_weight_end_lines(engine: Any) -> list[str]:
    """SGLang's 'Load weight end.' line, one per model (target, then the NextN draft)."""
    report = engine.activation_report()
    seconds = getattr(engine, "load_seconds", {}) or {}
    lines = []
    for role in ("target", "draft"):
        model = report.models.get(role)
        if model is None:
            continue
        moe = model.moe
        quant = moe.expert_weight_format if moe else "none"
        parts = [
            f"elapsed={seconds.get(role, 0.0):.2f} s",
            f"type={model.model_class}",
            f"quant={quant}",
            f"lm_head={model.lm_head.weight_dtype}/{model.lm_head.quant_method}",
        ]
        if moe:
            parts.append(f"moe_runner={moe.runner}/{moe.quant_method}")
        if role == "draft":
            parts.append(f"lm_head_shared_with_target={model.lm_head.shared_with_target}")
        lines.append("Load weight end. " + ", ".join(parts))
    return lines
