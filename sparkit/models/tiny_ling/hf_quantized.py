"""tiny-ling's export in the quantised layouts of the published Ling checkpoints, and back.

`quantize_hf_state` turns the bf16 export's tensors (sparkit.models.tiny_ling.hf_checkpoint's
names) into a variant of sparkit.weight_formats.LAYOUTS: each tensor's role comes from
sparkit.roofline.layout.classify_tensor (the classification the roofline and the memory fit
read checkpoints with), its format from the layout, its stored tensors from
weight_formats.linear_tensors. `dequantize_hf_state` is the inverse the embedded engine loads
with: each quantised weight decoded to float32 with its `weight_scale_inv`, the scales dropped.

`damage_scale` writes one expert's scale wrong on purpose (`sparkit model export-hf
--debug-damage-scale`, the `+damaged-scale` built-in models): the checkpoint loads everywhere and
the server serves fluent text, and only the numbers are wrong (the known-answer check's target).
"""

from __future__ import annotations

from sparkit.errors import DataError
from sparkit.weight_formats import E8M0_BIAS, FP8_BLOCK, LAYOUTS, SCALE_NAME, linear_tensors, tiling_problem

# torch dtype name -> safetensors code, for the tensors the layouts write
_CODES = {"bfloat16": "BF16", "float32": "F32", "float16": "F16", "float8_e4m3fn": "F8_E4M3",
          "float8_e8m0fnu": "F8_E8M0", "uint8": "U8"}

# The deliberately damaged scale: every scale of one routed expert's down projection in the first
# layer, multiplied by 2^DAMAGE_EXPONENT (an e8m0 code off by DAMAGE_EXPONENT, a float32 scale off
# by the same power of two: what a wrong exponent bias does). The expert is the last one (13% of
# layer 0's routing on the reference text). Scaling that expert's output x16 moved tiny-ling's
# reference perplexity +10% (the check's default tolerance), x64 +50% (both on the 192-wide
# build). x64 it is; on the shipped build (widths 128) the -fp8 export scores 1.4602 and its
# damaged copy 2.796 (+91%), the -fp4 1.4624 and 2.834 (embedded engine, float32).
DAMAGE_LAYER = 0
DAMAGE_PROJ = "down_proj"
DAMAGE_EXPONENT = 6


def safetensors_code(tensor) -> str:
    return _CODES.get(str(tensor.dtype).replace("torch.", ""), str(tensor.dtype))


def _expert_width(name: str, rows: int, cols: int) -> int:
    return cols if ".down_proj." in name else rows


# The one linear weight that may end in a ragged block of rows (tiling_problem says why).
RAGGED_ROW_LINEAR = ".kv_a_proj_with_mqa.weight"


def layout_problems(inventory: dict[str, tuple[str, tuple[int, ...]]], n_layers: int, weights: str) -> list[str]:
    """Every linear weight of a (bf16) tensor inventory that the layout `weights` cannot tile,
    as 'NAME [rows, cols]: why' (empty: the layout holds them all)."""
    from sparkit.roofline.layout import classify_tensor

    layout = LAYOUTS[weights]
    problems = []
    for name, (_, shape) in inventory.items():
        fmt = layout.format_of(classify_tensor(name, n_layers).role) if name.endswith(".weight") else None
        if fmt in (None, "bf16") or len(shape) != 2:
            continue
        rows, cols = shape
        is_expert = classify_tensor(name, n_layers).role == "routed_experts"
        why = tiling_problem(rows, cols, fmt, expert_width=_expert_width(name, rows, cols) if is_expert else None,
                             ragged_rows=name.endswith(RAGGED_ROW_LINEAR))
        if why:
            problems.append(f"{name} [{rows}, {cols}]: {why}")
    return problems


LAYOUT_HINT = (f"a quantised export needs every linear weight (expert, shared-expert and attention widths) a whole "
               f"number of FP8 blocks of {FP8_BLOCK} (the shipped builds have them); or export --weights bf16")


def quantize_hf_state(state: dict, n_layers: int, weights: str, keep: frozenset[str] | set[str] = frozenset()) -> dict:
    """The export's tensors (HF names, unquantised) in the layout `weights`, but for the linear
    weights named in `keep` (the family's unquantised_linears). DataError naming the tensors the
    layout cannot tile, and their widths."""
    import torch

    from sparkit.models.tiny_ling.quant import quantize_fp8_block, quantize_mxfp4
    from sparkit.roofline.layout import classify_tensor

    layout = LAYOUTS[weights]
    if not layout.quantised:
        return dict(state)
    inventory = {name: (safetensors_code(t), tuple(t.shape)) for name, t in state.items() if name not in keep}
    problems = layout_problems(inventory, n_layers, weights)
    if problems:
        more = f" (and {len(problems) - 1} more tensors)" if len(problems) > 1 else ""
        raise DataError(f"the {weights} layout ({layout.title}) cannot hold this checkpoint: {problems[0]}{more}",
                        hint=LAYOUT_HINT)
    out: dict = {}
    for name, tensor in state.items():
        fmt = layout.format_of(classify_tensor(name, n_layers).role) if name.endswith(".weight") else None
        if fmt in (None, "bf16") or tensor.dim() != 2 or name in keep:
            out[name] = tensor
            continue
        base = name[: -len(".weight")]
        if fmt == "fp8":
            q, scale = quantize_fp8_block(tensor)
            stored = {f"{base}.weight": q, f"{base}.{SCALE_NAME}": scale}
        else:
            packed, codes = quantize_mxfp4(tensor)
            stored = {f"{base}.weight": packed, f"{base}.{SCALE_NAME}": codes.view(torch.float8_e8m0fnu)}
        declared = linear_tensors(base, tensor.shape[0], tensor.shape[1], fmt)
        got = {n: (safetensors_code(t), tuple(t.shape)) for n, t in stored.items()}
        if got != declared:  # the declaration in weight_formats is what the roofline and the tests read
            raise AssertionError(f"{base}: wrote {got}, sparkit.weight_formats declares {declared}")
        out.update({n: t.contiguous() for n, t in stored.items()})
    return out


def dequantize_hf_state(state: dict, source: str = "the checkpoint") -> tuple[dict, dict[str, int]]:
    """(every quantised weight of `state` decoded to float32, its scale tensors dropped; how many
    weights of each format were decoded). A weight without its scale, a scale without its
    weight, or a scale of the wrong shape is a DataError naming the tensor."""
    import torch

    from sparkit.models.tiny_ling.quant import dequantize_fp8_block, dequantize_mxfp4

    out = dict(state)
    counts: dict[str, int] = {}
    for name in [n for n in state if n.endswith(f".{SCALE_NAME}")]:
        base = name[: -len(f".{SCALE_NAME}")]
        weight, scale = state.get(f"{base}.weight"), state[name]
        if weight is None:
            raise DataError(f"{source}: {name} has no {base}.weight beside it")
        if weight.dtype == torch.float8_e4m3fn:
            fmt = "fp8"
        elif weight.dtype == torch.uint8 and scale.dtype in (torch.float8_e8m0fnu, torch.uint8):
            fmt = "mxfp4"
        else:
            raise DataError(f"{source}: {base}.weight is {weight.dtype} with a {scale.dtype} {SCALE_NAME}: "
                            "neither block FP8 (float8_e4m3fn) nor MXFP4 (uint8 + e8m0)")
        rows = weight.shape[0]
        cols = weight.shape[1] * (2 if fmt == "mxfp4" else 1)
        want = linear_tensors(base, rows, cols, fmt)[name][1]
        if tuple(scale.shape) != want:
            raise DataError(f"{source}: {name} has shape {list(scale.shape)}; {base}.weight {list(weight.shape)} "
                            f"in {fmt} needs {list(want)}")
        if fmt == "fp8":
            out[f"{base}.weight"] = dequantize_fp8_block(weight, scale)
        else:
            out[f"{base}.weight"] = dequantize_mxfp4(weight, scale.view(torch.uint8))
        del out[name]
        counts[fmt] = counts.get(fmt, 0) + 1
    leftover = [n for n, t in out.items() if t.dtype in (torch.float8_e4m3fn, torch.uint8)]
    if leftover:
        raise DataError(f"{source}: {leftover[0]} is {out[leftover[0]].dtype} without a {SCALE_NAME} beside it")
    return out, counts


def damage_target(n_layers: int, num_experts: int, expert: int | None = None) -> str:
    """The scale damage_scale changes: the first layer's down projection of `expert` (default:
    the last expert)."""
    e = num_experts - 1 if expert is None else expert
    return f"model.layers.{DAMAGE_LAYER}.mlp.experts.{e}.{DAMAGE_PROJ}.{SCALE_NAME}"


def damage_scale(state: dict, target: str) -> dict:
    """Multiply every scale of `target` by 2^DAMAGE_EXPONENT (in place; returns what it did, for
    the export marker). The expert's output grows by that factor for the tokens routed to it in
    that layer: the text stays fluent while the model's numbers are wrong."""
    import torch

    scale = state.get(target)
    if scale is None:
        raise DataError(f"no tensor {target} to damage (a quantised export has one per expert projection)")
    if scale.dtype == torch.float8_e8m0fnu:
        codes = scale.view(torch.uint8).to(torch.int32) + DAMAGE_EXPONENT
        state[target] = codes.clamp(0, 2 * E8M0_BIAS).to(torch.uint8).view(torch.float8_e8m0fnu)
    else:
        state[target] = (scale * 2.0**DAMAGE_EXPONENT).contiguous()
    return {"tensor": target, "factor": 2**DAMAGE_EXPONENT}


__all__ = ["quantize_hf_state", "dequantize_hf_state", "layout_problems", "damage_scale", "damage_target",
           "safetensors_code"]
