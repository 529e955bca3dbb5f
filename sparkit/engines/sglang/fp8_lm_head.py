"""Online FP8 lm_head for stock SGLang, shared with the NEXTN draft (what the Ling patch does).

SGLang 0.5.23 keeps Ling's lm_head in BF16, and its NEXTN draft receives only the target's weight
*tensors* (get_embed_and_head / set_embed_and_head): a quantised target head would be read by the
draft through its BF16 method (accept length 1.00). sparkit fixes both after the weights load:

* convert_lm_head_to_fp8(lm_head): quantise this rank's vocab shard to e4m3 with per-row scales,
  re-lay it for the Triton kernel on CUDA, and give the module a quant method whose apply() computes
  the logits through the FP8-weight path. SGLang's LogitsProcessor._compute_lm_head calls
  `quant_method.apply(lm_head, hidden_states, embedding_bias)` for any method whose class name is
  not in its _UNQUANTIZED_LM_HEAD_METHODS set (checked against the installed source by the tests).
* share_lm_head_with_draft(target_model, draft_model): the draft's `lm_head` attribute becomes the
  target's module object (what `set_lm_head_from_target` does), so both read the same FP8 bytes
  through the same method, on every TP rank (each rank shares its own shard).

Torch is imported lazily; nothing here imports sglang.
"""

from __future__ import annotations

import logging

from sparkit.kernels.fp8_linear import exact_description, fp8_linear, prepare_fp8_weight, quantize_fp8_per_row

logger = logging.getLogger("sparkit.sglang")

QUANT_METHOD_NAME = "SparkitFp8LmHeadMethod"
# Rows quantised at a time: bounds the fp32 temporary to ~170 MB for K=2560 while converting.
_QUANT_CHUNK_ROWS = 16384


class SparkitFp8LmHeadMethod:
    """lm_head quant method: logits = x @ (e4m3 weight * per-row scale).T, fp32 accumulation.

    Reads the packed weight (`layer.sparkit_packed`) when the Triton kernel prepared one, else the
    row-major e4m3 `layer.weight` with `layer.weight_scale` (the torch reference path on CPU).
    """

    def create_weights(self, *args, **kwargs):  # the weights already exist when it is attached
        raise RuntimeError(f"{QUANT_METHOD_NAME} is attached after loading; it creates no weights")

    def process_weights_after_loading(self, layer) -> None:
        return None

    def apply(self, layer, x, bias=None):
        packed = getattr(layer, "sparkit_packed", None)
        if packed is not None:  # carries its own exact weight and re-scoring depth
            out = fp8_linear(x, packed, None, out_dtype=x.dtype)
        else:
            out = fp8_linear(x, layer.weight, layer.weight_scale, out_dtype=x.dtype,
                             exact_weight=getattr(layer, "sparkit_exact_weight", None),
                             exact_top_k=getattr(layer, "sparkit_exact_top_k", 0))
        if bias is not None:
            out = out + bias
        return out

    def embedding(self, layer, input_):
        raise RuntimeError("an FP8 lm_head cannot be used as an input embedding (tied weights)")


def is_fp8_lm_head(module) -> bool:
    return type(getattr(module, "quant_method", None)).__name__ == QUANT_METHOD_NAME


def _quantize_rows(weight):
    import torch

    n = weight.shape[0]
    q = torch.empty(weight.shape, dtype=torch.float8_e4m3fn, device=weight.device)
    scale = torch.empty((n,), dtype=torch.float32, device=weight.device)
    for start in range(0, n, _QUANT_CHUNK_ROWS):
        stop = min(n, start + _QUANT_CHUNK_ROWS)
        q[start:stop], scale[start:stop] = quantize_fp8_per_row(weight[start:stop])
    return q, scale


def convert_lm_head_to_fp8(lm_head, exact_top_k: int = 0) -> dict:
    """Quantise an lm_head module in place (idempotent). Returns a description for the log line.

    Works on SGLang's ParallelLMHead (a VocabParallelEmbedding: `weight` [rows of this rank's vocab
    shard, hidden], `quant_method`) and on any module with that structure. exact_top_k > 0 keeps
    the loaded weight (`sparkit_exact_weight`) and re-scores each row's best FP8 candidates exactly
    from it (sparkit.kernels.fp8_linear); with TP each rank re-scores within its own vocab shard,
    so the global best token, which lives on one rank, is re-scored there.
    """
    import torch

    if is_fp8_lm_head(lm_head):
        return dict(lm_head.sparkit_fp8_info)
    weight = lm_head.weight
    if weight.dim() != 2 or not weight.dtype.is_floating_point or weight.dtype == torch.float8_e4m3fn:
        raise ValueError(f"cannot quantise an lm_head weight of shape {tuple(weight.shape)} "
                         f"and dtype {weight.dtype}")
    rows, hidden = weight.shape
    previous = type(getattr(lm_head, "quant_method", None)).__name__
    with torch.no_grad():
        q, scale = _quantize_rows(weight.data)
    exact = weight.data if exact_top_k > 0 else None
    packed = None
    if q.is_cuda:
        # Tuned here, at load: SGLang captures its CUDA graphs after the weights are loaded, and
        # the captured calls replay the configs chosen now.
        packed = prepare_fp8_weight(q, scale, exact_weight=exact, exact_top_k=exact_top_k,
                                    log=lambda line: logger.info("sparkit: %s", line))
    # Replace the parameter (without exact re-scoring the BF16 storage is freed); with a packed
    # weight the parameter is the packed bytes (tile-major, rows padded to the kernel's tile) seen
    # as [padded rows, hidden].
    if packed is not None:
        data = packed.data.view(-1, hidden)
        lm_head.weight = torch.nn.Parameter(data, requires_grad=False)
        lm_head.weight_scale = torch.nn.Parameter(packed.scale, requires_grad=False)
        lm_head.sparkit_packed = packed
        kernel = "triton (tile-packed)"
        tuning = packed.tuning.summary() if packed.tuning is not None else "not tuned"
    else:
        lm_head.weight = torch.nn.Parameter(q, requires_grad=False)
        lm_head.weight_scale = torch.nn.Parameter(scale, requires_grad=False)
        lm_head.sparkit_packed = None
        kernel = "torch reference" if not q.is_cuda else "triton"
        tuning = "not tuned"
    lm_head.sparkit_exact_weight = exact
    lm_head.sparkit_exact_top_k = int(exact_top_k) if exact is not None else 0
    del q, weight
    lm_head.quant_method = SparkitFp8LmHeadMethod()

    info = {"rows": rows, "hidden": hidden, "format": "e4m3, per-row scales",
            "kernel": kernel, "replaced": previous, "exact_top_k": lm_head.sparkit_exact_top_k,
            "exact": exact_description(lm_head.sparkit_exact_top_k), "tuning": tuning}
    lm_head.sparkit_fp8_info = info
    return dict(info)


def share_lm_head_with_draft(target_model, draft_model) -> bool:
    """Give the draft the target's lm_head module (both read the same FP8 bytes and method).

    Returns True when the draft's head is the target's afterwards. Models that tie the lm_head
    to their input embedding are left alone (their head is the embedding).
    """
    target_head = getattr(target_model, "lm_head", None)
    if target_head is None or not hasattr(draft_model, "lm_head"):
        return False
    config = getattr(draft_model, "config", None)
    if getattr(config, "tie_word_embeddings", False):
        return draft_model.lm_head is target_head
    if draft_model.lm_head is not target_head:
        draft_model.lm_head = target_head
    return True
