"""The memory fit against sizes computed here, independently: on a sparse checkpoint with
Ling-3.0-flash's real header layout (scripts/make_sparse_ling.py: shapes and dtypes, no weights)
through the shipped recipes with `--set model.path=DIR`, and on the shipped tiny-ling, whose terms
must equal the bytes of the tensors the embedded engine's own code builds from it."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from sparkit.host import Gpu, Host
from sparkit.memory.fit import MemoryBasis, compute_fit, memory_basis
from sparkit.planning.compile import compile_plan
from sparkit.recipes.load import load_recipe

from _shared import REPO_DIR

GIB, MIB = 1024**3, 1024**2

# Ling-3.0-flash, as published (docs/sglang-facts.md section 6) plus the generator's stated assumptions.
VOCAB, HIDDEN, EXPERTS, INTER, HEADS, HEAD_DIM = 157184, 2560, 512, 768, 32, 128
MOE_LAYERS, MLA_LAYERS, KDA_LAYERS, CONTEXT = 40, 7, 35, 262144


def _generator():
    spec = importlib.util.spec_from_file_location("make_sparse_ling", REPO_DIR / "scripts" / "make_sparse_ling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ling_fp4(tmp_path_factory):
    return _generator().write_checkpoint(tmp_path_factory.mktemp("ling-fp4"), "fp4")


@pytest.fixture(scope="module")
def ling_bf16(tmp_path_factory):
    return _generator().write_checkpoint(tmp_path_factory.mktemp("ling-bf16"), "bf16")


def spark(capacity=128 * 10**9, in_use=6 * GIB) -> MemoryBasis:
    return MemoryBasis("unified", capacity, capacity - in_use, "test", measured=True)


def fit_of(recipe, path, *sets, basis=None):
    plan = compile_plan(load_recipe(recipe, [f"model.path={path}", *sets]))
    return compute_fit(plan, basis)


def term(fit, name):
    found = [t for t in fit.terms if t.name == name]
    assert len(found) == 1, [t.name for t in fit.terms]
    return found[0].bytes


# MXFP4: two e2m1 values a byte + one e8m0 scale per 32 values.
MXFP4_EXPERT = 3 * (INTER * HIDDEN // 2 + INTER * HIDDEN // 32)
LM_HEAD = VOCAB * HIDDEN * 2
MLA_KV_PER_TOKEN = (512 + 64) * 2
KDA_STATE = (4 - 1) * 3 * HEADS * HEAD_DIM * 2 + HEADS * HEAD_DIM * HEAD_DIM * 4  # conv bf16 + fp32 state, a layer


@pytest.mark.slow
def test_spark_optimized_terms_on_the_ling_fp4_headers(ling_fp4):
    fit = fit_of("ling-3.0-flash/spark-optimized", ling_fp4, basis=spark())
    assert fit.checkpoint == str(ling_fp4)
    assert term(fit, "routed experts") == MOE_LAYERS * EXPERTS * MXFP4_EXPERT
    assert term(fit, "lm_head (checkpoint)") == LM_HEAD
    assert term(fit, "FP8 lm_head copy (sparkit plugin)") == VOCAB * HIDDEN + VOCAB * 4
    nextn_experts = EXPERTS * MXFP4_EXPERT
    assert nextn_experts < term(fit, "NextN draft layer") < nextn_experts * 1.05
    assert term(fit, "KV cache (7 MLA layers)") == MLA_LAYERS * MLA_KV_PER_TOKEN * CONTEXT
    assert term(fit, "draft KV cache") == MLA_KV_PER_TOKEN * CONTEXT
    # 3 state slots per request with the radix cache, + 1 padding slot; NEXTN 4 draft tokens x (1 + 1).
    assert term(fit, "linear-attention state (35 KDA layers)") == KDA_LAYERS * KDA_STATE * 4
    assert term(fit, "speculative state snapshots") == KDA_LAYERS * KDA_STATE * 2 * 4
    # The target's weights as SGLang loads them on a DGX Spark: "Load weight end ... mem usage=64.88 GB".
    target = sum(term(fit, name) for name in ("routed experts", "attention, dense layers, embeddings, norms",
                                              "lm_head (checkpoint)"))
    assert target / GIB == pytest.approx(64.88, rel=0.02)
    # SGLang's runtime estimate: 512 MiB + 1.5 MiB x 8192 tokens + tp/8 GiB, graphs 2 MiB x 256 + 1.5 GiB (MLA).
    assert term(fit, "activations (SGLang's estimate)") == int((512 + 8192 * 1.5 + 128) * MIB)
    assert term(fit, "CUDA graphs (SGLang's estimate)") == (256 * 2 + 1536) * MIB
    assert term(fit, "OS floor") == int(128 * 10**9 * 0.05)


@pytest.mark.slow
def test_the_shipped_spark_fraction_is_checked_not_trusted(ling_fp4):
    fit = fit_of("ling-3.0-flash/spark-optimized", ling_fp4, basis=spark())
    from sparkit.memory.fit import CUDA_CONTEXT_BYTES, SGLANG_PROCESSES_BYTES

    p = spark().available_bytes - CUDA_CONTEXT_BYTES - SGLANG_PROCESSES_BYTES  # what the engine holds first
    static = fit.weights_bytes + fit.kv_bytes
    slack = fit.total("runtime") + fit.total("reserve")
    assert fit.min_fraction == math.ceil(static / p * 1000) / 1000
    assert fit.max_fraction == math.floor((1 - slack / p) * 1000) / 1000
    assert fit.verdict == "fits" and fit.min_fraction < 0.68 < fit.max_fraction
    greedy = fit_of("ling-3.0-flash/spark-optimized", ling_fp4, "server.mem_fraction_static=0.9", basis=spark())
    assert greedy.verdict == "fits-with" and greedy.suggested_fraction == fit.max_fraction
    assert f"mem_fraction_static <= {fit.max_fraction}" in greedy.summary
    starved = fit_of("ling-3.0-flash/spark-optimized", ling_fp4, "server.mem_fraction_static=0.5", basis=spark())
    assert starved.verdict == "fits-with" and starved.suggested_fraction == fit.min_fraction
    small = fit_of("ling-3.0-flash/spark-optimized", ling_fp4, basis=spark(capacity=64 * 10**9))
    assert small.verdict == "does-not-fit" and small.min_fraction > small.max_fraction


@pytest.mark.slow
def test_what_the_stack_adds_or_frees(ling_fp4):
    optimized = fit_of("ling-3.0-flash/spark-optimized", ling_fp4, basis=spark())
    freed = fit_of("ling-3.0-flash/spark-optimized", ling_fp4, "stack.lm_head_exact_top_k=0", basis=spark())
    assert term(freed, "bf16 lm_head freed (lm_head_exact_top_k 0)") == -LM_HEAD
    assert optimized.weights_bytes - freed.weights_bytes == LM_HEAD
    baseline = fit_of("ling-3.0-flash/spark-baseline", ling_fp4, basis=spark())
    names = {t.name for t in baseline.terms}
    assert "NextN draft layer" not in names and "draft KV cache" not in names
    assert any("NextN layer" in n and "not loaded" in n for n in baseline.notes)
    assert term(baseline, "fp32 lm_head working copy") == VOCAB * HIDDEN * 4
    longer = fit_of("ling-3.0-flash/spark-baseline", ling_fp4, "server.max_running_requests=4",
                    "model.context_length=32768", basis=spark())
    assert term(longer, "KV cache (7 MLA layers)") == MLA_LAYERS * MLA_KV_PER_TOKEN * 32768 * 4
    assert term(longer, "linear-attention state (35 KDA layers)") == KDA_LAYERS * KDA_STATE * (3 * 4 + 1)


@pytest.mark.slow
def test_tp4_bf16_is_per_gpu_and_without_a_gpu_here_a_requirement(ling_bf16):
    fit = fit_of("ling-3.0-flash/tp4-nextn", ling_bf16)
    assert fit.verdict == "unknown" and fit.required_available_bytes and "per GPU" in fit.summary
    experts_bf16 = MOE_LAYERS * EXPERTS * 3 * INTER * HIDDEN * 2
    assert term(fit, "routed experts") == experts_bf16 // 4
    # The TP4 study: ~63 GB of bf16 weights per rank.
    assert 60e9 < fit.weights_bytes < 66e9
    b200 = [Gpu(i, "NVIDIA B200", (10, 0), 180 * GIB, memory_free_bytes=178 * GIB) for i in range(4)]
    host = Host(gpus=b200, nvml_status="ok", ram_total_bytes=1024 * GIB, ram_available_bytes=1000 * GIB)
    plan = compile_plan(load_recipe("ling-3.0-flash/tp4-nextn", [f"model.path={ling_bf16}"]))
    basis = memory_basis(plan, host)
    assert basis.kind == "gpu" and basis.available_bytes == 178 * GIB and basis.measured
    on_b200 = compute_fit(plan, basis)
    assert not any(t.group == "reserve" for t in on_b200.terms)  # a discrete GPU runs no OS
    # 180 GiB: SGLang's own estimate takes chunked prefill 16384 (25 GiB of activations), more than
    # the recipe's 0.85 leaves; 0.8 fits.
    assert term(on_b200, "activations (SGLang's estimate)") == int((512 + 16384 * 1.5 + 512) * MIB)
    assert on_b200.verdict == "fits-with" and on_b200.suggested_fraction < 0.85
    plan80 = compile_plan(load_recipe("ling-3.0-flash/tp4-nextn", [f"model.path={ling_bf16}", "server.mem_fraction_static=0.8"]))
    assert compute_fit(plan80, memory_basis(plan80, host)).verdict == "fits"
    small = [Gpu(i, "NVIDIA RTX PRO", (12, 0), 48 * GIB, memory_free_bytes=47 * GIB) for i in range(4)]
    assert compute_fit(plan, memory_basis(plan, Host(gpus=small, nvml_status="ok"))).verdict == "does-not-fit"


@pytest.mark.slow
def test_a_hub_id_is_read_from_the_hugging_face_cache_else_its_declared_profile_else_unreadable(ling_fp4, tmp_path,
                                                                                                monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub's headers (tests/hub/test_pull_fit.py) cannot be read
    plan = compile_plan(load_recipe("ling-3.0-flash/spark-optimized"))
    fit = compute_fit(plan, spark())
    assert fit.verdict == "fits" and fit.checkpoint_note.startswith("sparkit's declared profile of Ling-3.0-flash-fp4")
    assert "offline (HF_HUB_OFFLINE=1)" in fit.checkpoint_note
    unknown = compute_fit(compile_plan(load_recipe("ling-3.0-flash/spark-optimized", ["model.path=someorg/other-model"])),
                          spark())
    assert unknown.verdict == "unknown" and "cannot read the checkpoint someorg/other-model" in unknown.summary
    assert "`sparkit pull someorg/other-model`" in unknown.need and "--set model.path=DIR" in unknown.need
    repo = tmp_path / "hub" / "models--inclusionAI--Ling-3.0-flash-fp4"
    snapshot = repo / "snapshots" / ("abc123" * 7)[:40]  # a commit hash, as huggingface_hub names it
    snapshot.mkdir(parents=True)
    for f in ling_fp4.iterdir():  # as huggingface_hub lays it out: snapshot files link to blobs
        (snapshot / f.name).symlink_to(f)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snapshot.name)
    fit = compute_fit(plan, spark())
    assert fit.verdict == "fits" and fit.checkpoint == str(snapshot)


def test_an_incomplete_download_is_unreadable_not_wrong(ling_fp4, tmp_path):
    partial = tmp_path / "partial"
    partial.mkdir()
    shards = sorted(f.name for f in ling_fp4.glob("model-*.safetensors"))
    missing = shards[2]
    for f in ling_fp4.iterdir():
        if f.name != missing:
            (partial / f.name).symlink_to(f)
    fit = fit_of("ling-3.0-flash/spark-optimized", partial, basis=spark())
    assert fit.verdict == "unknown" and missing in fit.summary and fit.need


# ------------------------------------------------------------------------------------------ tiny-ling

def test_tiny_ling_on_the_embedded_engine_matches_the_engine_s_own_tensors(tiny_model_dir):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    from sparkit.models.tiny_ling.model import KVCache, TinyLingConfig
    from sparkit.models.tiny_ling.quant import make_expert_weights, make_lm_head

    plan = compile_plan(load_recipe("tiny", [f"model.path={tiny_model_dir}"]))
    fit = compute_fit(plan, MemoryBasis("host", 24 * GIB, 20 * GIB, "test", measured=True))
    assert fit.verdict == "fits"
    weights = load_file(str(tiny_model_dir / "model.safetensors"))
    experts = [w for n, w in weights.items() if n.endswith(("w_gate_up", "w_down"))]
    stored = sum(sum(t.numel() * t.element_size() for t in make_expert_weights(w, "fp8", torch.float32).tensors().values())
                 for w in experts)
    assert term(fit, "experts: fp8 form") == stored
    assert term(fit, "experts: decoded copy") == sum(w.numel() for w in experts) * 4
    head = make_lm_head(weights["lm_head.weight"], "fp8", exact_top_k=4)
    assert term(fit, "FP8 lm_head") == head.weight.numel() * 1 + head.weight_scale.numel() * 4
    assert term(fit, "bf16 lm_head kept for exact re-scoring") == head.exact_weight.numel() * 2
    config = TinyLingConfig.load(tiny_model_dir)
    target = KVCache(config.num_hidden_layers, config.num_attention_heads, config.head_dim,
                     config.max_position_embeddings, torch.float32, "cpu")
    draft = KVCache(1, config.num_attention_heads, config.head_dim, config.max_position_embeddings, torch.float32, "cpu")
    assert term(fit, "KV cache") == target.kv.numel() * 4
    assert term(fit, "draft KV cache") == draft.kv.numel() * 4
    others = sum(w.numel() for n, w in weights.items() if n not in ("lm_head.weight",) and not n.endswith(("w_gate_up", "w_down")))
    assert term(fit, "dense weights, embeddings, norms") == others * 4
    # Everything it holds must fit above the floor: a host with less free than that does not fit.
    need = fit.engine_bytes + fit.total("reserve")
    assert fit.required_available_bytes == need
    tight = compute_fit(plan, MemoryBasis("host", 24 * GIB, need - 1, "test", measured=True))
    assert tight.verdict == "does-not-fit"
    assert compute_fit(plan, MemoryBasis("host", 24 * GIB, need, "test", measured=True)).verdict == "fits"


def test_tiny_ling_on_sglang_counts_the_checkpoint_and_the_capped_pool(tiny_model_dir):
    from safetensors.torch import load_file

    plan = compile_plan(load_recipe("tiny/tiny-sglang"))
    fit = compute_fit(plan, None)
    weights = load_file(str(tiny_model_dir / "model.safetensors"))
    on_disk = sum(w.numel() * w.element_size() for w in weights.values())
    own = "NextN draft's own embedding and lm_head (until shared)"
    loaded = sum(t.bytes for t in fit.terms if t.group == "weights" and "FP8" not in t.name and t.name != own)
    assert loaded == on_disk  # every tensor, NextN layer included (the recipe speculates)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    # SGLang's NextN model builds its own embedding and head (bf16) and drops them after sizing the pools
    assert term(fit, own) == 2 * config["vocab_size"] * config["hidden_size"] * 2
    per_token = 2 * config["num_attention_heads"] * config["head_dim"] * 2  # K and V, bf16
    assert term(fit, "KV cache (4 MHA layers)") == config["num_hidden_layers"] * per_token * 65536  # --max-total-tokens
    assert fit.verdict == "unknown" and fit.required_available_bytes > 0  # no GPU here: a requirement


def test_a_dspark_draft_on_the_embedded_engine_is_counted_from_its_own_tensors(tiny_model_dir, dspark_draft_dir):
    """The draft's weights in float32 (what the engine holds: its own tensors, the embedding and the
    head are the target's) and its context K/V over the whole context (sparkit.models.dspark.model's
    DraftCache)."""
    torch = pytest.importorskip("torch")
    from sparkit.models.dspark.checkpoint import load_draft
    from sparkit.models.dspark.model import DraftCache

    plan = compile_plan(load_recipe("tiny/tiny-dspark", [f"model.path={tiny_model_dir}"]))
    fit = compute_fit(plan, MemoryBasis("host", 24 * GIB, 20 * GIB, "test", measured=True))
    cfg, draft = load_draft(dspark_draft_dir)
    name = "DSpark draft model (its layers, Markov and confidence heads; the embedding and lm_head are the target's)"
    assert term(fit, name) == sum(p.numel() for p in draft.parameters()) * 4
    cache = DraftCache(cfg, 2048, torch.float32, "cpu")
    assert term(fit, "DSpark draft's context K/V") == (cache.k.numel() + cache.v.numel()) * 4
    assert "draft KV cache" not in [t.name for t in fit.terms]  # NEXTN's, not DSpark's
    assert fit.verdict == "fits"


@pytest.mark.slow
def test_a_dspark_verify_window_is_the_block_and_its_anchor_in_a_hybrid_targets_snapshots(ling_fp4):
    """SGLang keeps one linear-attention state snapshot per verified token: DSpark verifies block + 1
    (the published draft's block of 8 when its config is read here; 16 + 1, the study's, when not)."""
    spec = ["stack.speculative={method: dspark, draft_model: inclusionAI/Ling-3.0-flash-dspark, block_size: 8}"]
    fit = fit_of("ling-3.0-flash/tp4-dspark", ling_fp4, *spec, "server.max_running_requests=1")
    snapshots = next(t for t in fit.terms if t.name == "speculative state snapshots")
    assert snapshots.bytes == KDA_LAYERS * KDA_STATE // 4 * (1 + 1) * 9  # TP4: heads split four ways
    assert "x 9 verified tokens" in snapshots.detail
