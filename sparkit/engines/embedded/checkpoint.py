"""tiny-ling's checkpoints on disk: the layout, and reading and writing it (the engine, the builder
and the exporter all go through here).

Layout of a build: config.json, model.safetensors (bf16 weights), tokenizer.json,
tokenizer_config.json (+ chat_template.jinja), and the builder's marker .sparkit-build.json. A
Hugging Face BailingMoeV2 export (sparkit.engines.embedded.hf_checkpoint's format) has the same
tokenizer files, its own config.json and configuration class, and the marker .sparkit-export.json;
load_checkpoint reads either.

Module top-level stays light: torch is imported inside the functions.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from sparkit.errors import LaunchError

MARKER = ".sparkit-build.json"
WEIGHTS = "model.safetensors"


def read_marker(directory: str | Path) -> dict | None:
    try:
        data = json.loads((Path(directory) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def save_checkpoint(model, directory: Path, dtype: str = "bfloat16") -> None:
    import torch
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.config.torch_dtype = dtype
    model.config.save(directory)
    target = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    state = {k: v.detach().to(target).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(directory / WEIGHTS), metadata={"format": "pt"})


def load_checkpoint(directory: str | Path):
    """(config, model on CPU in float32) from a checkpoint directory: sparkit's own layout, or a
    Hugging Face BailingMoeV2 export of it (sparkit.engines.embedded.hf_checkpoint). Unreadable
    or inconsistent files raise LaunchError naming the file."""
    import torch

    from sparkit.engines.embedded import hf_checkpoint
    from sparkit.engines.embedded.model import MODEL_CLASS, TinyLingConfig, TinyLingForCausalLM

    directory = Path(directory)
    config_path = directory / "config.json"
    if not directory.is_dir():
        raise LaunchError(f"model directory {directory} does not exist", hint="build one with `sparkit model make-tiny`")
    try:
        raw = json.loads(config_path.read_text())
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        architectures = raw.get("architectures") or []
        is_hf = hf_checkpoint.HF_ARCHITECTURE in architectures
        if not is_hf and MODEL_CLASS not in architectures:
            raise ValueError(f"architectures {architectures} includes neither {MODEL_CLASS} nor {hf_checkpoint.HF_ARCHITECTURE}")
        cfg = hf_checkpoint.tiny_config_from_hf(raw) if is_hf else TinyLingConfig.from_dict(raw)
    except (OSError, ValueError, TypeError) as exc:
        raise LaunchError(f"cannot read model config {config_path}: {exc}") from None
    try:
        from safetensors.torch import load_file

        from sparkit.checkpoint import safetensors_files

        # An HF checkpoint: the shards its index names (SGLang's rule: a stale shard beside them is
        # not loaded), else model.safetensors, else every *.safetensors.
        weights_files = safetensors_files(directory) if is_hf else [directory / WEIGHTS]
        if not weights_files:
            raise FileNotFoundError(f"no *.safetensors file in {directory}")
        state = {}
        for path in weights_files:
            weights_path = path
            state.update(load_file(str(path)))
    except Exception as exc:  # safetensors raises several types for truncated/garbled files
        where = weights_path if "weights_path" in locals() else directory
        raise LaunchError(f"cannot read checkpoint {where}: {exc}", hint="rebuild it with `sparkit model make-tiny`") from None
    if is_hf:
        try:
            state = hf_checkpoint.state_dict_from_hf(state, cfg)
        except KeyError as exc:
            raise LaunchError(f"checkpoint {directory} lacks the tensor {exc.args[0]} that {config_path} implies") from None
    model = TinyLingForCausalLM(cfg)
    try:
        model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0:3]
        raise LaunchError(f"checkpoint {weights_files[0]} does not match {config_path}: {' '.join(first)}") from None
    model.eval()
    return cfg, model


def export_hf(source: str | Path, destination: str | Path, dtype: str = "bfloat16") -> dict:
    """Write tiny-ling at `source` (sparkit's layout) as an HF BailingMoeV2 checkpoint into
    `destination` (created; must be empty or a previous export). Returns the export marker."""
    import torch
    from safetensors.torch import save_file

    from sparkit.engines.embedded import hf_checkpoint as hf
    from sparkit.errors import UsageError

    if dtype not in hf.DTYPES:
        raise UsageError(f"--dtype {dtype!r} is not one of {', '.join(hf.DTYPES)}")
    source, destination = Path(source), Path(destination)
    if destination.resolve() == source.resolve():
        raise UsageError(f"the export directory {destination} is the source checkpoint", hint="choose another directory")
    if destination.exists() and any(destination.iterdir()) and not (destination / hf.EXPORT_MARKER).exists():
        raise UsageError(f"{destination} exists and is not a sparkit export; refusing to overwrite it",
                         hint="choose an empty or new directory")
    cfg, model = load_checkpoint(source)
    target_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    state = {k: v.detach().to(target_dtype).contiguous() for k, v in model.state_dict().items()}
    hf_state = {k: v.contiguous() for k, v in hf.state_dict_to_hf(state, cfg).items()}
    tmp = destination.with_name(f".{destination.name}.exporting")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_file(hf_state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = hf.hf_config(cfg)
        config["torch_dtype"] = dtype
        source_marker = read_marker(source) or {}
        config["sparkit"] = {"exported_from": hf._source_key(source_marker)}
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / f"{hf.CONFIG_MODULE}.py").write_text(hf.CONFIG_SOURCE)
        generation = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        for name in hf.TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, tmp / name)
        marker = {"export_version": hf.EXPORT_VERSION, "dtype": dtype, "architecture": hf.HF_ARCHITECTURE,
                  "source": hf._source_key(source_marker), "source_path": str(source), "tensors": len(hf_state)}
        (tmp / hf.EXPORT_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        from sparkit.paths import make_private_tree

        make_private_tree(tmp)
        if destination.exists():
            shutil.rmtree(destination)
        tmp.rename(destination)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return marker


def hf_export_dir(native_dir: str | Path, dtype: str = "bfloat16") -> Path:
    """Where the cached HF export of a built-in build lives (next to the builds in the cache)."""
    from sparkit.paths import cache_dir

    return cache_dir() / "models" / f"{Path(native_dir).name}-hf-{dtype}"


def ensure_hf_export(source: str | Path, destination: str | Path, dtype: str = "bfloat16") -> Path:
    """An HF export of the build at `source` in `destination`, made once (under a file lock) and
    reused while the source build is the same."""
    import fcntl

    from sparkit.engines.embedded import hf_checkpoint as hf

    source, destination = Path(source), Path(destination)
    marker = read_marker(source) or {}
    if hf.is_export(destination, marker, dtype):
        return destination
    from sparkit.paths import ensure_dir, open_output

    ensure_dir(destination.parent)
    with open_output(destination.parent / f".{destination.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not hf.is_export(destination, marker, dtype):
            export_hf(source, destination, dtype)
    return destination
