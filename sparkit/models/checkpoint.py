"""The built-in models' checkpoints on disk (every family of sparkit.models.catalog): the layout,
and reading and writing it (the engine, the builder and the exporter all go through here).

Layout of a build: config.json, model.safetensors (bf16 weights), tokenizer.json,
tokenizer_config.json (+ chat_template.jinja), and the builder's marker .sparkit-build.json. A
Hugging Face export (the family's hf_checkpoint module: tiny-ling as a BailingMoeV2,
tiny-ling-v3 as a BailingMoeV3) has the same tokenizer files, its own config.json and
configuration class, and the marker .sparkit-export.json; load_checkpoint reads either, the
family told by config.json's architectures.

Module top-level stays light: torch is imported inside the functions.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from sparkit.errors import LaunchError
from sparkit.models.formats import BUILD_MARKER, EXPORT_MARKER

MARKER = BUILD_MARKER
WEIGHTS = "model.safetensors"
EXPORT_VERSION = 2  # 2: the export marker records the weights layout (and a deliberately damaged scale)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
DTYPES = ("bfloat16", "float32")  # of an export's unquantised tensors


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


def _family_of(raw: dict):
    """(family, is the HF export) of a config.json; ValueError naming what it is instead."""
    from sparkit.models.catalog import FAMILIES, family_of_architectures

    architectures = raw.get("architectures") or []
    found = family_of_architectures(architectures)
    if found is None:
        known = ", ".join(n for f in FAMILIES.values() for n in (f.model_class, f.hf_architecture))
        raise ValueError(f"architectures {architectures} includes none of {known}")
    return found


def load_checkpoint(directory: str | Path):
    """(config, model on CPU in float32) from a checkpoint directory: sparkit's own layout, or a
    Hugging Face export of it (the family's hf_checkpoint), bf16 or in a quantised layout (its
    weights decoded with their scales: the values the checkpoint holds). Unreadable or
    inconsistent files raise LaunchError naming the file."""
    import torch

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
        fam, is_hf = _family_of(raw)
        hf_checkpoint = fam.hf_format()
        cfg = hf_checkpoint.config_from_hf(raw) if is_hf else fam.config_from_dict(raw)
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
        state = _decode_quantised(state, cfg, weights, raw, weights_files[0], config_path, hf_checkpoint)
    if is_hf:
        try:
            state = hf_checkpoint.state_dict_from_hf(state, cfg)
        except KeyError as exc:
            raise LaunchError(f"checkpoint {directory} lacks the tensor {exc.args[0]} that {config_path} implies") from None
    model = fam.new_model_of_config(cfg)
    try:
        model.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0:3]
        raise LaunchError(f"checkpoint {weights_files[0]} does not match {config_path}: {' '.join(first)}") from None
    model.eval()
    return cfg, model


def _decode_quantised(state: dict, cfg, weights: str, raw: dict, weights_file: Path, config_path: Path,
                      hf_checkpoint) -> dict:
    """A quantised export's tensors, checked against the layout its config declares (every name,
    dtype and shape: what SGLang's loader would refuse, this loader refuses too), then decoded."""
    from sparkit.errors import DataError
    from sparkit.models.tiny_ling import hf_quantized

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
    """Write the build at `source` (sparkit's layout) as its family's HF checkpoint (tiny-ling: a
    BailingMoeV2, tiny-ling-v3: a BailingMoeV3) into `destination` (created; must be empty or a
    previous export), its linear weights in the layout
    `weights` (sparkit.weight_formats.LAYOUTS) with the quantization_config SGLang reads;
    `damaged_scale` writes one expert's scale wrong on purpose (hf_quantized.damage_scale).
    Written into a temporary sibling directory and renamed into place, so a killed export leaves
    nothing that looks complete. Returns the export marker."""
    import torch
    from safetensors.torch import save_file

    from sparkit.errors import UsageError
    from sparkit.models.tiny_ling import hf_quantized
    from sparkit.weight_formats import LAYOUTS, WEIGHT_FORMATS, sglang_quantization_config

    hf = _export_format(source)
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if weights not in WEIGHT_FORMATS:
        raise UsageError(f"--weights {weights!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    if damaged_scale and not LAYOUTS[weights].quantised:
        raise UsageError("--debug-damage-scale damages a quantisation scale: it needs --weights fp8 or mxfp4")
    source, destination = Path(source), Path(destination)
    if destination.resolve() == source.resolve():
        raise UsageError(f"the export directory {destination} is the source checkpoint", hint="choose another directory")
    if destination.exists() and any(destination.iterdir()) and not (destination / EXPORT_MARKER).exists():
        raise UsageError(f"{destination} exists and is not a sparkit export; refusing to overwrite it",
                         hint="choose an empty or new directory")
    cfg, model = load_checkpoint(source)
    problem = hf.layout_error(cfg, weights)
    if problem is not None:
        from sparkit.errors import DataError

        raise DataError(f"{source}: {problem}", hint=hf_quantized.LAYOUT_HINT)
    target_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    state = {k: v.detach().to(target_dtype).contiguous() for k, v in model.state_dict().items()}
    hf_state = {k: v.contiguous() for k, v in hf.state_dict_to_hf(state, cfg).items()}
    hf_state = hf_quantized.quantize_hf_state(hf_state, cfg.num_hidden_layers, weights, hf.unquantised_linears(cfg))
    damage = None
    if damaged_scale:
        damage = hf_quantized.damage_scale(hf_state, hf.damage_target(cfg))
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
        config["sparkit"] = {"exported_from": source_key(source_marker)}
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / f"{hf.CONFIG_MODULE}.py").write_text(hf.CONFIG_SOURCE)
        generation = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, tmp / name)
        marker = {"export_version": EXPORT_VERSION, "dtype": dtype, "weights": weights,
                  "layout": LAYOUTS[weights].title, "damaged_scale": damage, "architecture": hf.HF_ARCHITECTURE,
                  "source": source_key(source_marker), "source_path": str(source), "tensors": len(hf_state)}
        (tmp / EXPORT_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        from sparkit.paths import make_private_tree

        make_private_tree(tmp)
        if destination.exists():
            shutil.rmtree(destination)
        tmp.rename(destination)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return marker


def _export_format(source: str | Path):
    """The HF format module of the family of the build at `source` (its config.json)."""
    try:
        raw = json.loads((Path(source) / "config.json").read_text())
        fam, _ = _family_of(raw if isinstance(raw, dict) else {})
    except (OSError, ValueError) as exc:
        raise LaunchError(f"cannot read model config {Path(source) / 'config.json'}: {exc}") from None
    return fam.hf_format()


def hf_export_dir(native_dir: str | Path, dtype: str = "bfloat16", weights: str = "bf16", damaged_scale: bool = False) -> Path:
    """Where the cached HF export of a built-in build lives (next to the builds in the cache)."""
    from sparkit.paths import cache_dir

    return cache_dir() / "models" / export_dir_name(Path(native_dir).name, dtype, weights, damaged_scale)


def ensure_hf_export(source: str | Path, destination: str | Path, dtype: str = "bfloat16", weights: str = "bf16",
                     damaged_scale: bool = False) -> Path:
    """An HF export of the build at `source` in `destination`, made once (under a file lock) and
    reused while the source build, the dtype and the weights layout are the same (a source
    without a build marker cannot be told from another: it is exported every time)."""
    import fcntl

    source, destination = Path(source), Path(destination)
    marker = read_marker(source)
    if marker is None:
        export_hf(source, destination, dtype, weights, damaged_scale)
        return destination
    if is_export(destination, marker, dtype, weights, damaged_scale):
        return destination
    from sparkit.paths import ensure_dir, open_output

    ensure_dir(destination.parent)
    with open_output(destination.parent / f".{destination.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_export(destination, marker, dtype, weights, damaged_scale):
            export_hf(source, destination, dtype, weights, damaged_scale)
    return destination


def export_dir_name(build_name: str, dtype: str = "bfloat16", weights: str = "bf16", damaged_scale: bool = False) -> str:
    """The cache directory name of an export: `<build>-hf-bfloat16` (the bf16 layout, as before
    the quantised ones), `<build>-hf-fp8`, `<build>-hf-mxfp4` (+ `-float32` for float32
    unquantised tensors, `-damaged-scale` for the deliberately broken one)."""
    if weights == "bf16":
        return f"{build_name}-hf-{dtype}"
    name = f"{build_name}-hf-{weights}" + ("" if dtype == "bfloat16" else f"-{dtype}")
    return name + ("-damaged-scale" if damaged_scale else "")


def is_export(directory: str | Path, source_marker: dict | None = None, dtype: str | None = None,
              weights: str | None = None, damaged_scale: bool | None = None) -> bool:
    """A finished export (of the build whose marker is `source_marker`, in `dtype`, in the weights
    layout `weights`, with or without the deliberately damaged scale, when given)."""
    try:
        marker = json.loads((Path(directory) / EXPORT_MARKER).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("export_version") != EXPORT_VERSION:
        return False
    if source_marker is not None and marker.get("source") != source_key(source_marker):
        return False
    if weights is not None and marker.get("weights") != weights:
        return False
    if damaged_scale is not None and bool(marker.get("damaged_scale")) != damaged_scale:
        return False
    return dtype is None or marker.get("dtype") == dtype


def source_key(marker: dict) -> dict:
    return {k: marker.get(k) for k in ("builder_version", "name", "seed", "steps", "trajectory")}
