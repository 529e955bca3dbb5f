#!/usr/bin/env python3
"""Write a Ling-3.0-flash checkpoint without weights: config.json and safetensors shards whose
headers hold every tensor's name, dtype and shape over data regions that are holes (no disk used).
sparkit's memory fit and roofline read only headers, so a recipe pointed at this directory
(`--set model.path=DIR`) shows the real arithmetic on a machine without the 65-250 GB download,
and SGLang serves the same directory with `--load-format dummy` (random weights).

    scripts/make_sparse_ling.py DIR [--weights bf16|fp8|mxfp4] [--layers N] [--no-nextn]
        [--config-only] [--tokenizer-from DIR] [--json]

Everything derives from sparkit's one declaration of Ling-3.0-flash
(sparkit/roofline/profiles.py, LING3_FLASH_SHAPES: each value with the published figure that
settles it). `--weights` names what the experts hold, as a recipe's `stack.weights` does: bf16,
fp8 (the -fp8 layout: block-128 e4m3 linear weights with float32 scales) or mxfp4 (the -fp4
layout: MXFP4 routed experts, FP8 elsewhere); `fp4` is accepted for mxfp4. `--layers N` keeps
Ling's widths with N layers (the first two dense, every 6th MLA: 6 and 12 layers have 1 and 2 MLA
layers), the model served on an H200 in benchmarks/ling_width.py. `--config-only` writes no
shards (the fit then sizes the weights from config.json, and says so). `--tokenizer-from DIR`
copies a tokenizer (and a remote-code config class) from DIR, keeps DIR's token ids, and pads its
vocabulary to 157184 entries so every id the model samples decodes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkit.checkpoint_headers import DTYPE_BITS, write_sparse_checkpoint  # noqa: E402
from sparkit.roofline.profiles import VARIANTS, ling3_flash_config, ling3_flash_tensors  # noqa: E402

ALIASES = {"fp4": "mxfp4", "mxfp4": "mxfp4", "fp8": "fp8", "bf16": "bf16"}
# Keys of the tokenizer source's config.json that belong to its tokenizer and loader, not to the model.
TOKENIZER_KEYS = ("auto_map", "eos_token_id", "pad_token_id", "bos_token_id")


def weights_name(name: str) -> str:
    try:
        return ALIASES[name]
    except KeyError:
        raise SystemExit(f"--weights {name!r}: one of {', '.join(ALIASES)}") from None


def config(weights: str = "mxfp4", layers: int | None = None, nextn: bool = True) -> dict:
    """config.json of the checkpoint (sparkit.roofline.profiles.ling3_flash_config)."""
    return ling3_flash_config(weights_name(weights), layers, nextn=nextn)


def tensors(weights: str = "mxfp4", layers: int | None = None, nextn: bool = True) -> dict:
    """{name: (safetensors dtype, shape)} of every tensor, in checkpoint order."""
    return ling3_flash_tensors(weights_name(weights), config(weights, layers, nextn))


def pad_tokenizer(tokenizer_json: Path, vocab_size: int) -> int:
    """Give every id below vocab_size a token (`<xN>`) in a tokenizers JSON file; returns how many
    were added."""
    tok = json.loads(tokenizer_json.read_text())
    vocab = tok["model"]["vocab"]
    used = set(vocab.values()) | {t["id"] for t in tok.get("added_tokens", [])}
    added = 0
    for i in range(vocab_size):
        if i not in used:
            vocab[f"<x{i}>"] = i
            added += 1
    tokenizer_json.write_text(json.dumps(tok))
    return added


def write_checkpoint(directory: Path, weights: str = "mxfp4", *, layers: int | None = None, nextn: bool = True,
                     headers: bool = True, tokenizer_from: Path | None = None) -> Path:
    """Write the checkpoint into `directory`; returns it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = config(weights, layers, nextn)
    if tokenizer_from is not None:
        source = Path(tokenizer_from)
        for item in sorted(source.iterdir()):
            if item.is_file() and item.name != "config.json" and not item.name.endswith((".safetensors", ".bin")) \
                    and item.name != "model.safetensors.index.json":
                shutil.copy(item, directory / item.name)
        source_cfg = json.loads((source / "config.json").read_text()) if (source / "config.json").is_file() else {}
        cfg.update({k: source_cfg[k] for k in TOKENIZER_KEYS if k in source_cfg})
        if (directory / "tokenizer.json").is_file():
            pad_tokenizer(directory / "tokenizer.json", cfg["vocab_size"])
    if headers:
        write_sparse_checkpoint(directory, tensors(weights, layers, nextn), cfg)
    else:
        (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    return directory


def summary(weights: str, layers: int | None, nextn: bool) -> dict:
    by_dtype: dict[str, int] = {}
    items = tensors(weights, layers, nextn)
    for dtype, shape in items.values():
        n = 1
        for d in shape:
            n *= d
        by_dtype[dtype] = by_dtype.get(dtype, 0) + -(-n * DTYPE_BITS[dtype] // 8)
    cfg = config(weights, layers, nextn)
    return {"weights": weights_name(weights), "layout": VARIANTS[weights_name(weights)][1],
            "layers": cfg["num_hidden_layers"], "nextn_layers": cfg["num_nextn_predict_layers"],
            "tensors": len(items), "bytes": sum(by_dtype.values()), "bytes_by_dtype": by_dtype}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--weights", "--variant", dest="weights", default="mxfp4",
                        help="what the experts hold: bf16, fp8 or mxfp4 (fp4); default mxfp4 (the -fp4 checkpoint)")
    parser.add_argument("--layers", type=int, default=None, help="layers at Ling's widths (default 42)")
    parser.add_argument("--no-nextn", action="store_true", help="without the NextN (MTP) layer")
    parser.add_argument("--config-only", action="store_true", help="config.json only, no safetensors shards")
    parser.add_argument("--tokenizer-from", type=Path, default=None, help="copy (and pad) this directory's tokenizer")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args()
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers {args.layers}: at least 1")
    if args.tokenizer_from is not None and not (args.tokenizer_from / "tokenizer.json").is_file():
        parser.error(f"--tokenizer-from {args.tokenizer_from}: no tokenizer.json there")
    write_checkpoint(args.directory, args.weights, layers=args.layers, nextn=not args.no_nextn,
                     headers=not args.config_only, tokenizer_from=args.tokenizer_from)
    info = {"directory": str(args.directory), "headers": not args.config_only,
            **summary(args.weights, args.layers, not args.no_nextn)}
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        what = "headers over holes" if info["headers"] else "config.json only"
        print(f"wrote {args.directory}: {info['layout']}, {info['layers']} layers + {info['nextn_layers']} NextN, "
              f"{info['tensors']} tensors, {info['bytes'] / 1e9:.2f} GB ({what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
