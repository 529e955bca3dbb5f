"""The roofline of a built-in model's quantised export (`sparkit:tiny-ling@fp8` / `@mxfp4`): before
the export is written, from the tensors the exporter will write (hf_checkpoint.hf_tensor_inventory);
after, from its headers; the two agree byte for byte."""

from __future__ import annotations

import pytest

from sparkit.roofline.estimate import resolve_layout
from sparkit.weight_formats import format_of_dtypes


def _bytes_by_role(layout) -> dict:
    out = {"embedding": layout.embedding.stored_bytes, "lm_head": layout.lm_head.stored_bytes}
    for layer in layout.layers:
        for role, w in layer.weights.items():
            out[(layer.index, role)] = w.stored_bytes
        if layer.experts:
            out[(layer.index, "experts")] = (layer.experts.num_experts, layer.experts.per_expert.stored_bytes,
                                             format_of_dtypes(layer.experts.per_expert.dtypes))
    return out


@pytest.mark.parametrize("weights", ["fp8", "mxfp4"])
def test_the_declared_export_layout_is_what_the_export_holds(sparkit_home, tiny_model_dir, weights):
    from sparkit.models.checkpoint import ensure_hf_export, hf_export_dir

    declared = resolve_layout(f"sparkit:tiny-ling@{weights}", weights)
    assert declared.source == "declared export" and "not written yet" in declared.source_detail
    expert = declared.layers[0].experts.per_expert
    assert format_of_dtypes(expert.dtypes) == weights
    # one expert: gate, up [128, 128] and down [128, 128] with their scales
    values = 3 * 128 * 128
    assert expert.stored_bytes == {"fp8": values + 3 * 4, "mxfp4": values // 2 + 3 * 128 * 4}[weights]
    ensure_hf_export(tiny_model_dir, hf_export_dir(tiny_model_dir, "bfloat16", weights), "bfloat16", weights)
    written = resolve_layout(f"sparkit:tiny-ling@{weights}", weights)
    assert written.source == "checkpoint"
    assert _bytes_by_role(written) == _bytes_by_role(declared)
    bf16 = resolve_layout("sparkit:tiny-ling", "bf16")
    assert bf16.layers[0].experts.per_expert.stored_bytes == 2 * values  # the bf16 build, for scale
