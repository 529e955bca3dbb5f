"""A DSpark draft's checkpoint on disk. One layout serves both engines: config.json in SGLang's
keys and model.safetensors in SGLang's tensor names (sparkit.models.dspark.config), bf16, the
target's tokenizer files beside them (SGLang's draft worker reads the target's, a copy keeps the
directory self-describing), and the builder's marker. So a build is already what SGLang's
`--speculative-draft-model-path` loads; `export` writes a copy elsewhere (a fresh directory, no
marker of the build, an export marker instead).

Module top-level stays light: torch is imported inside the functions.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from sparkit.errors import LaunchError, UsageError
from sparkit.models.dspark.config import ARCHITECTURE, DSparkConfig, is_dspark_config, tensor_names

WEIGHTS = "model.safetensors"
MARKER = ".sparkit-build.json"
EXPORT_MARKER = ".sparkit-export.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def read_marker(directory: str | Path) -> dict | None:
    try:
        data = json.loads((Path(directory) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def save_draft(draft, directory: Path, tokenizer_from: Path | None = None) -> None:
    """Write the draft's config and weights (bf16), and the target's tokenizer files."""
    import torch
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    draft.config.save(directory)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in draft.state_dict().items()}
    if sorted(state) != sorted(tensor_names(draft.config)):  # the names SGLang's loader expects, exactly
        raise AssertionError(f"draft tensors {sorted(set(state) ^ set(tensor_names(draft.config)))[:4]} differ from SGLang's")
    save_file(state, str(directory / WEIGHTS), metadata={"format": "pt"})
    if tokenizer_from is not None:
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_from) / name).is_file():
                shutil.copy2(Path(tokenizer_from) / name, directory / name)


def load_config(directory: str | Path) -> DSparkConfig:
    """The draft's configuration; LaunchError naming config.json when it is not a DSpark draft's."""
    path = Path(directory) / "config.json"
    try:
        data = json.loads(path.read_text())
        if not is_dspark_config(data):
            raise ValueError(f"architectures {data.get('architectures') if isinstance(data, dict) else None} "
                             f"does not include {ARCHITECTURE}")
        config = DSparkConfig.from_hf_dict(data)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise LaunchError(f"cannot read the DSpark draft config {path}: {exc}") from None
    problems = config.problems()
    if problems:
        raise LaunchError(f"{path}: " + "; ".join(problems))
    return config


def load_draft(directory: str | Path):
    """(config, LingDSparkModel on CPU in float32, no shared modules attached yet). Unreadable or
    inconsistent files raise LaunchError naming the file."""
    import torch
    from safetensors.torch import load_file

    from sparkit.models.dspark.model import LingDSparkModel

    directory = Path(directory)
    if not directory.is_dir():
        raise LaunchError(f"DSpark draft directory {directory} does not exist",
                          hint="build one with `sparkit model make-dspark`")
    config = load_config(directory)
    weights = directory / WEIGHTS
    try:
        state = load_file(str(weights))
    except Exception as exc:  # safetensors raises several types for truncated or garbled files
        raise LaunchError(f"cannot read the DSpark draft weights {weights}: {exc}",
                          hint="rebuild it with `sparkit model make-dspark`") from None
    expected = set(tensor_names(config))
    missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or extra:
        raise LaunchError(f"{weights} does not match {directory / 'config.json'}: "
                          + "; ".join(filter(None, (f"missing {', '.join(missing[:4])}" if missing else "",
                                                    f"unexpected {', '.join(extra[:4])}" if extra else ""))))
    draft = LingDSparkModel(config)
    try:
        draft.load_state_dict({k: v.to(torch.float32) for k, v in state.items()}, strict=True)
    except RuntimeError as exc:
        first = " ".join(str(exc).strip().splitlines()[0:3])
        raise LaunchError(f"{weights} does not match {directory / 'config.json'}: {first}") from None
    draft.eval()
    return config, draft


def export(source: str | Path, destination: str | Path) -> dict:
    """Copy the draft at `source` to `destination` as SGLang loads it (config, weights, tokenizer
    files, an export marker): written into a temporary sibling directory and renamed into place.
    Returns the export marker."""
    from sparkit.paths import make_private_tree

    source, destination = Path(source), Path(destination)
    config = load_config(source)
    load_draft(source)  # every tensor SGLang's loader will ask for is there, with its shape
    if destination.resolve() == source.resolve():
        raise UsageError(f"the export directory {destination} is the draft itself", hint="choose another directory")
    if destination.exists() and any(destination.iterdir()) and not (destination / EXPORT_MARKER).exists():
        raise UsageError(f"{destination} exists and is not a sparkit export; refusing to overwrite it",
                         hint="choose an empty or new directory")
    tmp = destination.with_name(f".{destination.name}.exporting")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for name in ("config.json", WEIGHTS, *TOKENIZER_FILES):
            if (source / name).is_file():
                shutil.copy2(source / name, tmp / name)
        built = read_marker(source) or {}
        marker = {"architecture": ARCHITECTURE, "block_size": config.block_size,
                  "target": built.get("target"), "source": {k: built.get(k) for k in ("name", "seed", "steps", "builder_version")},
                  "source_path": str(source), "tensors": len(tensor_names(config))}
        (tmp / EXPORT_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        make_private_tree(tmp)
        if destination.exists():
            shutil.rmtree(destination)
        tmp.rename(destination)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return marker
