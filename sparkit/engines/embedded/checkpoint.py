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

from sparkit.engines.embedded.formats import BUILD_MARKER
from sparkit.errors import LaunchError

MARKER = BUILD_MARKER
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


def checkpoint_weights(directory: str | Path) -> str:
    """The weights layout of a checkpoint (sparkit.weight_formats.LAYOUTS: bf16, fp8, mxfp4), from
    its config.json's quantization_config (bf16 when it has none or cannot be read: load_checkpoint
    names what is wrong)."""
    from sparkit.weight_formats import weights_of_quantization_config

    try:
        raw = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return "bf16"
    if not isinstance(raw, dict):
        return "bf16"
    return weights_of_quantization_config(raw.get("quantization_config")) or "bf16"


def load_checkpoint(directory: str | Path):
    """(config, model on CPU in float32) from a checkpoint directory: sparkit's own layout, or a
    Hugging Face BailingMoeV2 export of it (sparkit.engines.embedded.hf_checkpoint), bf16 or in a
    quantised layout (its weights decoded with their scales: the values the checkpoint holds).
    Unreadable or inconsistent files raise LaunchError naming the file."""
    import torch

    from sparkit.engines.embedded import hf_checkpoint
    from sparkit.engines.embedded.model import MODEL_CLASS, TinyLingConfig, TinyLingForCausalLM
    from sparkit.weight_formats import weights_of_quantization_config

    directory = Path(directory)
    config_path = directory / "config.json"
    if not directory.is_dir():
        raise LaunchError(f"model directory {directory} does not exist", hint="build one with `sparkit model make-tiny`")
    weights = "bf16"
    try:
        raw = json.loads(config_path.read_text())
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        architectures = raw.get("architectures") or []
        is_hf = hf_checkpoint.HF_ARCHITECTURE in architectures
        if not is_hf and MODEL_CLASS not in architectures:
            raise ValueError(f"architectures {architectures} includes neither {MODEL_CLASS} nor {hf_checkpoint.HF_ARCHITECTURE}")
        cfg = hf_checkpoint.tiny_config_from_hf(raw) if is_hf else TinyLingConfig.from_dict(raw)
        if is_hf and raw.get("quantization_config"):
            weights = weights_of_quantization_config(raw["quantization_config"])
            if weights is None:
                raise ValueError(f"quantization_config {raw['quantization_config']} is none of the layouts sparkit "
                                 "reads (block-128 FP8, MXFP4 routed experts with block-128 FP8 elsewhere)")
    except (OSError, ValueError, TypeError) as exc:
        raise LaunchError(f"cannot read model config {config_path}: {exc}") from None
    try:
        from safetensors.torch import load_file

        from sparkit.checkpoint_headers import safetensors_files

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
    if weights != "bf16":
        state = _decode_quantised(state, cfg, weights, raw, weights_files[0], config_path)
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


def _decode_quantised(state: dict, cfg, weights: str, raw: dict, weights_file: Path, config_path: Path) -> dict:
    """A quantised export's tensors, checked against the layout its config declares (every name,
    dtype and shape: what SGLang's loader would refuse, this loader refuses too), then decoded."""
    from sparkit.engines.embedded import hf_checkpoint, hf_quantized
    from sparkit.errors import DataError

    plain = {"float32": "F32"}.get(str(raw.get("torch_dtype")), "BF16")
    declared = hf_checkpoint.hf_tensor_inventory(cfg, weights, plain)
    held = {name: (hf_quantized.safetensors_code(t), tuple(t.shape)) for name, t in state.items()}
    for name in sorted(set(declared) | set(held)):
        if declared.get(name) != held.get(name):
            got = f"{held[name][0]} {list(held[name][1])}" if name in held else "no such tensor"
            want = f"{declared[name][0]} {list(declared[name][1])}" if name in declared else "no such tensor"
            raise LaunchError(f"checkpoint {weights_file}: {name} is {got}, the {weights} layout that {config_path} "
                              f"declares (quantization_config) has {want}")
    try:
        decoded, _ = hf_quantized.dequantize_hf_state(state, source=str(weights_file))
    except DataError as exc:
        raise LaunchError(str(exc)) from None
    return decoded


def export_hf(source: str | Path, destination: str | Path, dtype: str = "bfloat16", weights: str = "bf16",
              damaged_scale: bool = False) -> dict:
    """Write tiny-ling at `source` (sparkit's layout) as an HF BailingMoeV2 checkpoint into
    `destination` (created; must be empty or a previous export), its linear weights in the layout
    `weights` (sparkit.weight_formats.LAYOUTS) with the quantization_config SGLang reads;
    `damaged_scale` writes one expert's scale wrong on purpose (hf_quantized.damage_scale).
    Written into a temporary sibling directory and renamed into place, so a killed export leaves
    nothing that looks complete. Returns the export marker."""
    import torch
    from safetensors.torch import save_file

    from sparkit.engines.embedded import hf_checkpoint as hf
    from sparkit.engines.embedded import hf_quantized
    from sparkit.errors import UsageError
    from sparkit.weight_formats import LAYOUTS, WEIGHT_FORMATS, sglang_quantization_config

    if dtype not in hf.DTYPES:
        raise UsageError(f"--dtype {dtype!r} is not one of {', '.join(hf.DTYPES)}")
    if weights not in WEIGHT_FORMATS:
        raise UsageError(f"--weights {weights!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    if damaged_scale and not LAYOUTS[weights].quantised:
        raise UsageError("--debug-damage-scale damages a quantisation scale: it needs --weights fp8 or mxfp4")
    source, destination = Path(source), Path(destination)
    if destination.resolve() == source.resolve():
        raise UsageError(f"the export directory {destination} is the source checkpoint", hint="choose another directory")
    if destination.exists() and any(destination.iterdir()) and not (destination / hf.EXPORT_MARKER).exists():
        raise UsageError(f"{destination} exists and is not a sparkit export; refusing to overwrite it",
                         hint="choose an empty or new directory")
    cfg, model = load_checkpoint(source)
    problem = hf_quantized.layout_error(cfg, weights)
    if problem is not None:
        from sparkit.errors import DataError

        raise DataError(f"{source}: {problem}", hint=hf_quantized.LAYOUT_HINT)
    target_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    state = {k: v.detach().to(target_dtype).contiguous() for k, v in model.state_dict().items()}
    hf_state = {k: v.contiguous() for k, v in hf.state_dict_to_hf(state, cfg).items()}
    hf_state = hf_quantized.quantize_hf_state(hf_state, cfg.num_hidden_layers, weights)
    damage = None
    if damaged_scale:
        damage = hf_quantized.damage_scale(hf_state, hf_quantized.damage_target(cfg.num_hidden_layers, cfg.num_experts))
    declared = hf.hf_tensor_inventory(cfg, weights, {"bfloat16": "BF16", "float32": "F32"}[dtype])
    written = {name: (hf_quantized.safetensors_code(t), tuple(t.shape)) for name, t in hf_state.items()}
    if written != declared:  # the inventory is what plans and the loader read before the files exist
        odd = sorted(set(written.items()) ^ set(declared.items()))[:3]
        raise AssertionError(f"the export differs from hf_tensor_inventory: {odd}")
    tmp = destination.with_name(f".{destination.name}.exporting")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_file(hf_state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = hf.hf_config(cfg)
        config["torch_dtype"] = dtype
        quantization = sglang_quantization_config(weights)
        if quantization is not None:
            config["quantization_config"] = quantization
        source_marker = read_marker(source) or {}
        config["sparkit"] = {"exported_from": hf._source_key(source_marker)}
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / f"{hf.CONFIG_MODULE}.py").write_text(hf.CONFIG_SOURCE)
        generation = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        for name in hf.TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, tmp / name)
        marker = {"export_version": hf.EXPORT_VERSION, "dtype": dtype, "weights": weights,
                  "layout": LAYOUTS[weights].title, "damaged_scale": damage, "architecture": hf.HF_ARCHITECTURE,
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


def hf_export_dir(native_dir: str | Path, dtype: str = "bfloat16", weights: str = "bf16", damaged_scale: bool = False) -> Path:
    """Where the cached HF export of a built-in build lives (next to the builds in the cache)."""
    from sparkit.engines.embedded.hf_checkpoint import export_dir_name
    from sparkit.paths import cache_dir

    return cache_dir() / "models" / export_dir_name(Path(native_dir).name, dtype, weights, damaged_scale)


def ensure_hf_export(source: str | Path, destination: str | Path, dtype: str = "bfloat16", weights: str = "bf16",
                     damaged_scale: bool = False) -> Path:
    """An HF export of the build at `source` in `destination`, made once (under a file lock) and
    reused while the source build, the dtype and the weights layout are the same (a source
    without a build marker cannot be told from another: it is exported every time)."""
    import fcntl

    from sparkit.engines.embedded import hf_checkpoint as hf

    source, destination = Path(source), Path(destination)
    marker = read_marker(source)
    if marker is None:
        export_hf(source, destination, dtype, weights, damaged_scale)
        return destination
    if hf.is_export(destination, marker, dtype, weights, damaged_scale):
        return destination
    from sparkit.paths import ensure_dir, open_output

    ensure_dir(destination.parent)
    with open_output(destination.parent / f".{destination.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not hf.is_export(destination, marker, dtype, weights, damaged_scale):
            export_hf(source, destination, dtype, weights, damaged_scale)
    return destination
