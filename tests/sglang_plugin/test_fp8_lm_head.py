"""The online FP8 lm_head and the draft sharing, on sglang 0.5.23's own code where it runs on CPU.

sglang.srt's layer modules cannot be imported without a GPU stack (tvm_ffi, CUDA kernels), so
ParallelLMHead itself cannot be built here. Instead the tests run the installed source of the
pieces the plugin interacts with, exec'd from the package files:
  - UnquantizedEmbeddingMethod.create_weights / apply (how the head's weight is made and used),
  - logits_processor.should_apply_lm_head_quant_method (whether SGLang calls our apply()),
  - BailingMoeV3ForCausalLM.get_embed_and_head and BailingMoeForCausalLMNextN.set_embed_and_head
    (what the NEXTN worker hands the draft),
and check the attribute structure the plugin relies on against the same source.
"""

from __future__ import annotations

import ast
import json
import types
from typing import Optional

import pytest

from _sglang_source import (
    bind_method,
    exec_functions,
    find_class,
    find_function,
    method_source,
    module_ast,
    module_path,
)
from _shared import near_tie_states

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

UNQUANT = "sglang.srt.layers.quantization.unquant"
LOGITS = "sglang.srt.layers.logits_processor"
NEXTN = "sglang.srt.models.bailing_moe_nextn"
V3 = "sglang.srt.models.bailing_moe_v3"
VOCAB = "sglang.srt.layers.vocab_parallel_embedding"


def _set_weight_attrs(weight, attrs):
    for k, v in (attrs or {}).items():
        setattr(weight, k, v)


def _sglang_namespace():
    return {"torch": torch, "F": torch.nn.functional, "Parameter": torch.nn.Parameter,
            "List": list, "Optional": Optional, "set_weight_attrs": _set_weight_attrs,
            "nn": torch.nn}


def _unquantized_embedding_method_class():
    """sglang's UnquantizedEmbeddingMethod, its methods exec'd from the installed source."""
    ns = _sglang_namespace()
    methods = {m: bind_method(UNQUANT, "UnquantizedEmbeddingMethod", m, ns)
               for m in ("create_weights", "apply", "embedding")}
    return type("UnquantizedEmbeddingMethod", (), methods)


UnquantizedEmbeddingMethod = _unquantized_embedding_method_class()


class LmHeadShard(torch.nn.Module):
    """A ParallelLMHead as the plugin sees it: `quant_method`, and a `weight` [shard rows, hidden]
    registered by the quant method's create_weights (VocabParallelEmbedding.__init__ does that)."""

    def __init__(self, rows, hidden, dtype=torch.bfloat16):
        super().__init__()
        self.quant_method = UnquantizedEmbeddingMethod()
        self.quant_method.create_weights(self, hidden, [rows], hidden, rows, params_dtype=dtype)
        self.num_embeddings_per_partition = rows


class Embedding(torch.nn.Module):
    def __init__(self, rows, hidden):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(rows, hidden).to(torch.bfloat16), requires_grad=False)


def _model_class(name, module, methods):
    ns = _sglang_namespace()
    ns["torch"] = types.SimpleNamespace(  # the real set_embed_and_head frees CUDA cache
        cuda=types.SimpleNamespace(empty_cache=lambda: None, synchronize=lambda: None))
    bound = {m: bind_method(module, name, m, ns) for m in methods}
    return type(name, (torch.nn.Module,), bound)


TargetBase = _model_class("BailingMoeV3ForCausalLM", V3, ["get_embed_and_head", "set_embed_and_head"])
DraftBase = _model_class("BailingMoeForCausalLMNextN", NEXTN, ["set_embed_and_head"])


def _make_models(rows=512, hidden=64, seed=0):
    torch.manual_seed(seed)
    target = TargetBase()
    target.model = torch.nn.Module()
    target.model.word_embeddings = Embedding(rows, hidden)
    target.lm_head = LmHeadShard(rows, hidden)
    with torch.no_grad():
        w = torch.randn(rows, hidden) * torch.exp(0.3 * torch.randn(rows, 1))
        target.lm_head.weight.copy_(w.to(torch.bfloat16))
    target.config = types.SimpleNamespace(tie_word_embeddings=False)
    draft = DraftBase()
    draft.model = torch.nn.Module()
    draft.model.word_embeddings = Embedding(rows, hidden)
    draft.lm_head = LmHeadShard(rows, hidden)
    draft.config = types.SimpleNamespace(tie_word_embeddings=False)
    return target, draft


def _should_apply():
    ns = exec_functions(LOGITS, ["_UNQUANTIZED_LM_HEAD_METHODS", "_has_lm_head_runtime_attrs",
                                 "should_apply_lm_head_quant_method"], {"torch": torch, "Tuple": tuple})
    return ns["should_apply_lm_head_quant_method"]


def _sglang_logits(head, hidden_states):
    """LogitsProcessor._compute_lm_head's dispatch: quant_method.apply when SGLang's rule says so,
    else the plain matmul with lm_head.weight (which is what a BF16 draft head does)."""
    qm = getattr(head, "quant_method", None)
    if _should_apply()(head, qm):
        return qm.apply(head, hidden_states, None)
    return torch.matmul(hidden_states, head.weight.T)


# --- the source structure the plugin relies on ---------------------------------------------


def test_logits_processor_calls_the_heads_quant_method_apply():
    src = method_source(LOGITS, "LogitsProcessor", "_compute_lm_head")
    assert "should_apply_lm_head_quant_method(lm_head, quant_method)" in src
    assert "quant_method.apply(lm_head, hidden_states, embedding_bias)" in src


def test_nextn_draft_has_no_set_lm_head_from_target_so_stock_sglang_shares_only_tensors():
    cls = find_class(module_ast(NEXTN), "BailingMoeForCausalLMNextN")
    assert find_function(cls.body, "set_lm_head_from_target") is None
    assert "self.lm_head = ParallelLMHead(" in method_source(NEXTN, "BailingMoeForCausalLMNextN", "__init__")
    share = method_source("sglang.srt.speculative.eagle_worker_v2", "EagleDraftWorker", "init_lm_head")
    assert 'hasattr(self.draft_runner.model, "set_lm_head_from_target")' in share
    assert "self.draft_runner.model.set_embed_and_head(embed, head)" in share


def test_vocab_parallel_embedding_creates_weight_through_its_quant_method():
    src = method_source(VOCAB, "VocabParallelEmbedding", "__init__")
    assert "self.quant_method: QuantizeMethodBase = quant_method" in src
    assert "self.quant_method.create_weights(" in src
    assert 'layer.register_parameter("weight", weight)' in method_source(
        UNQUANT, "UnquantizedEmbeddingMethod", "create_weights")


# --- conversion ------------------------------------------------------------------------------


def test_conversion_makes_an_fp8_head_that_sglang_routes_through_our_apply():
    from sparkit.engines.sglang.fp8_lm_head import QUANT_METHOD_NAME, convert_lm_head_to_fp8

    target, _ = _make_models()
    head = target.lm_head
    x = torch.randn(5, 64).to(torch.bfloat16)
    bf16_logits = _sglang_logits(head, x).float()
    assert not _should_apply()(head, head.quant_method)  # stock: plain matmul

    info = convert_lm_head_to_fp8(head)
    assert info["rows"] == 512 and info["hidden"] == 64 and info["replaced"] == "UnquantizedEmbeddingMethod"
    assert head.weight.dtype == torch.float8_e4m3fn and head.weight.shape == (512, 64)
    assert head.weight_scale.shape == (512,)
    assert type(head.quant_method).__name__ == QUANT_METHOD_NAME
    assert _should_apply()(head, head.quant_method)  # SGLang's own rule now calls apply()

    fp8_logits = _sglang_logits(head, x).float()
    exact = x.float() @ (head.weight.float() * head.weight_scale[:, None]).T
    assert torch.allclose(fp8_logits, exact.to(torch.bfloat16).float(), rtol=1e-2, atol=1e-2)
    rel = ((fp8_logits - bf16_logits).norm() / bf16_logits.norm()).item()
    assert rel < 0.05  # e4m3 per-row rounding, not garbage
    assert convert_lm_head_to_fp8(head) == info  # idempotent


def test_exact_rescoring_keeps_the_loaded_weight_and_restores_the_bf16_argmax():
    """With exact_top_k the head keeps the loaded bf16 tensor (no copy) and SGLang's dispatch, through
    our apply(), picks the bf16 head's token at near-ties, where the FP8 head alone does not."""
    from sparkit.engines.sglang.fp8_lm_head import convert_lm_head_to_fp8
    from sparkit.engines.sglang.report import lm_head_report

    plain_target, _ = _make_models()
    exact_target, _ = _make_models()
    x = near_tie_states(exact_target.lm_head.weight.data, 256, seed=1)
    bf16_top1 = _sglang_logits(exact_target.lm_head, x).float().argmax(1)
    loaded = exact_target.lm_head.weight.data
    info = convert_lm_head_to_fp8(exact_target.lm_head, exact_top_k=4)
    plain = convert_lm_head_to_fp8(plain_target.lm_head)
    assert info["exact_top_k"] == 4 and "top-4 candidates re-scored exactly" in info["exact"]
    assert plain["exact_top_k"] == 0 and plain_target.lm_head.sparkit_exact_weight is None
    assert exact_target.lm_head.sparkit_exact_weight.data_ptr() == loaded.data_ptr()  # kept, not copied
    assert lm_head_report(exact_target.lm_head).exact_top_k == 4 and lm_head_report(plain_target.lm_head).exact_top_k == 0
    fp8_top1 = _sglang_logits(plain_target.lm_head, x).float().argmax(1)
    exact_top1 = _sglang_logits(exact_target.lm_head, x).float().argmax(1)
    assert (fp8_top1 != bf16_top1).sum() >= 3  # the FP8 head alone flips some of these near-ties
    assert torch.equal(exact_top1, bf16_top1)


def test_exact_top_k_comes_from_the_environment(monkeypatch, caplog):
    from sparkit.engines.sglang import plugin
    from sparkit.kernels.fp8_linear import DEFAULT_EXACT_TOP_K

    monkeypatch.delenv(plugin.EXACT_TOP_K_ENV, raising=False)
    assert plugin.exact_top_k() == DEFAULT_EXACT_TOP_K
    monkeypatch.setenv(plugin.EXACT_TOP_K_ENV, "0")
    assert plugin.exact_top_k() == 0
    monkeypatch.setenv(plugin.EXACT_TOP_K_ENV, "lots")
    with caplog.at_level("WARNING", logger="sparkit.sglang"):
        assert plugin.exact_top_k() == DEFAULT_EXACT_TOP_K
    assert "is not an integer" in caplog.text


def test_a_bf16_head_reading_fp8_bytes_is_garbage_which_is_why_sharing_matters():
    """The trap the sharing prevents: the draft's own (BF16) method over the target's FP8 tensor."""
    from sparkit.engines.sglang.fp8_lm_head import convert_lm_head_to_fp8

    target, draft = _make_models()
    x = torch.randn(4, 64).to(torch.bfloat16)
    want = _sglang_logits(target.lm_head, x).float().argmax(1)
    convert_lm_head_to_fp8(target.lm_head)
    embed, head = target.get_embed_and_head()  # installed source
    draft.set_embed_and_head(embed, head)  # installed source: tensors only
    assert draft.lm_head is not target.lm_head
    assert type(draft.lm_head.quant_method).__name__ == "UnquantizedEmbeddingMethod"
    with pytest.raises(RuntimeError):  # torch refuses bf16 x fp8 matmul; on GPU kernels may not
        _sglang_logits(draft.lm_head, x)
    scale_free = torch.matmul(x.float(), draft.lm_head.weight.float().T)  # fp8 bytes, no scales
    assert not torch.equal(scale_free.argmax(1), want) or scale_free.abs().max() > 10 * _sglang_logits(
        target.lm_head, x).float().abs().max()


def test_tp_shards_convert_independently_and_match_the_whole_head():
    from sparkit.engines.sglang.fp8_lm_head import convert_lm_head_to_fp8

    target, _ = _make_models(rows=512)
    full = target.lm_head
    shards = [LmHeadShard(256, 64) for _ in range(2)]
    with torch.no_grad():
        for rank, shard in enumerate(shards):
            shard.weight.copy_(full.weight[rank * 256:(rank + 1) * 256])
    x = torch.randn(3, 64).to(torch.bfloat16)
    convert_lm_head_to_fp8(full)
    for shard in shards:
        convert_lm_head_to_fp8(shard)
    per_rank = torch.cat([_sglang_logits(s, x) for s in shards], dim=1)
    assert torch.equal(per_rank, _sglang_logits(full, x))  # per-row scales: shard-independent


def test_conversion_refuses_a_head_that_is_already_fp8_bytes():
    from sparkit.engines.sglang.fp8_lm_head import convert_lm_head_to_fp8

    head = LmHeadShard(16, 64)
    head.weight = torch.nn.Parameter(torch.zeros(16, 64).to(torch.float8_e4m3fn), requires_grad=False)
    with pytest.raises(ValueError, match="float8"):
        convert_lm_head_to_fp8(head)


# --- sharing + the hooks + the report ------------------------------------------------------


def _runner(model, draft=False):
    return types.SimpleNamespace(model=model, is_draft_worker=draft, device="cpu", gpu_id=0,
                                 tp_rank=0, tp_size=1,
                                 server_args=types.SimpleNamespace(
                                     speculative_algorithm="EAGLE", speculative_num_steps=3,
                                     speculative_eagle_topk=1, speculative_num_draft_tokens=4,
                                     speculative_draft_model_path=None))


def _stock_init_lm_head(worker):
    """What EagleDraftWorker.init_lm_head does for NEXTN (no token map): tensors, then the
    conditional module share, which Ling's NextN class skips."""
    target = worker.target_worker.model_runner.model
    embed, head = target.get_embed_and_head()
    worker.draft_runner.model.set_embed_and_head(embed, head)
    if hasattr(worker.draft_runner.model, "set_lm_head_from_target"):
        worker.draft_runner.model.set_lm_head_from_target(target.lm_head)


@pytest.fixture
def plugin_state(monkeypatch, tmp_path):
    from sparkit.engines.sglang import plugin

    monkeypatch.setenv("SPARKIT_REPORT_DIR", str(tmp_path))
    monkeypatch.setattr(plugin, "_STATE", {"target_runner": None, "drafts": [], "notes": []})
    return plugin, tmp_path


def _read(tmp_path):
    from sparkit.engines.activation_report import load_reports

    reports = load_reports(tmp_path)
    assert len(reports) == 1
    return reports[0]


def test_hooks_convert_share_and_report_like_the_ling_patch(plugin_state, caplog):
    plugin, tmp_path = plugin_state
    target, draft = _make_models()
    x = torch.randn(6, 64).to(torch.bfloat16)
    target_runner, draft_runner = _runner(target), _runner(draft, draft=True)

    with caplog.at_level("INFO", logger="sparkit.sglang"):
        plugin.after_load_model(None, target_runner)
        rep = _read(tmp_path)
        assert rep.engine == "sglang" and set(rep.models) == {"target"}
        assert rep.target.lm_head.weight_dtype == "float8_e4m3fn"
        assert rep.target.lm_head.quant_method == "SparkitFp8LmHeadMethod"
        assert rep.speculative.algorithm == "EAGLE" and rep.speculative.num_draft_tokens == 4

        plugin.after_load_model(None, draft_runner)
        worker = types.SimpleNamespace(target_worker=types.SimpleNamespace(model_runner=target_runner),
                                       draft_runner=draft_runner)
        _stock_init_lm_head(worker)
        plugin.after_init_lm_head(None, worker)

    assert draft.lm_head is target.lm_head
    assert torch.equal(_sglang_logits(draft.lm_head, x), _sglang_logits(target.lm_head, x))
    rep = _read(tmp_path)
    assert rep.draft.lm_head.shared_with_target is True
    assert rep.draft.lm_head.module_id == rep.target.lm_head.module_id
    assert rep.draft.lm_head.storage_ptr == rep.target.lm_head.storage_ptr != 0
    assert rep.draft.lm_head.quant_method == "SparkitFp8LmHeadMethod"
    assert rep.draft.model_class == "BailingMoeForCausalLMNextN"
    assert any("Online FP8 quantization enabled for lm_head" in n for n in rep.notes)
    lines = [r.getMessage() for r in caplog.records]
    assert any(ln.startswith("sparkit: Online FP8 quantization enabled for lm_head.") for ln in lines)
    assert any("online FP8 lm_head enabled" in ln and "draft shares the target lm_head module" in ln
               for ln in lines)
    on_disk = json.loads((tmp_path / "activation-tp0.json").read_text())
    assert on_disk["schema"] == "sparkit.activation/2"


def test_report_shows_the_trap_when_the_draft_only_got_tensors(plugin_state):
    """Without the sharing hook (stock SGLang behaviour) the report says so: what the check fails on."""
    from sparkit.engines.sglang import report

    plugin, tmp_path = plugin_state
    target, draft = _make_models()
    plugin.after_load_model(None, _runner(target))
    worker = types.SimpleNamespace(target_worker=types.SimpleNamespace(model_runner=_runner(target)),
                                   draft_runner=_runner(draft, draft=True))
    _stock_init_lm_head(worker)
    rep = report.build_report(target, draft)
    assert rep.draft.lm_head.shared_with_target is False
    assert rep.draft.lm_head.weight_dtype == "float8_e4m3fn"  # FP8 bytes...
    assert rep.draft.lm_head.quant_method == "UnquantizedEmbeddingMethod"  # ...read as BF16
    assert rep.draft.lm_head.storage_ptr == rep.target.lm_head.storage_ptr
    assert rep.draft.lm_head.module_id != rep.target.lm_head.module_id


def test_fp8_off_keeps_the_head_and_reports_bf16(plugin_state, monkeypatch):
    plugin, tmp_path = plugin_state
    monkeypatch.setenv("SPARKIT_FP8_LM_HEAD", "0")
    target, draft = _make_models()
    plugin.after_load_model(None, _runner(target))
    worker = types.SimpleNamespace(target_worker=types.SimpleNamespace(model_runner=_runner(target)),
                                   draft_runner=_runner(draft, draft=True))
    _stock_init_lm_head(worker)
    plugin.after_init_lm_head(None, worker)
    rep = _read(tmp_path)
    assert rep.target.lm_head.weight_dtype == "bfloat16"
    assert rep.draft.lm_head.shared_with_target is False  # nothing to share: stock behaviour


def test_multi_layer_drafts_all_share(plugin_state):
    plugin, tmp_path = plugin_state
    target, d0 = _make_models()
    _, d1 = _make_models(seed=1)
    plugin.after_load_model(None, _runner(target))
    worker = types.SimpleNamespace(target_worker=types.SimpleNamespace(model_runner=_runner(target)),
                                   draft_runner_list=[_runner(d0, True), _runner(d1, True)])
    plugin.after_init_lm_head(None, worker)
    assert d0.lm_head is target.lm_head and d1.lm_head is target.lm_head


def test_tied_embeddings_are_not_replaced():
    from sparkit.engines.sglang.fp8_lm_head import share_lm_head_with_draft

    target, draft = _make_models()
    draft.config.tie_word_embeddings = True
    own = draft.lm_head
    assert share_lm_head_with_draft(target, draft) is False
    assert draft.lm_head is own


def test_hook_failures_never_raise_into_the_engine(plugin_state, caplog):
    plugin, _ = plugin_state
    broken = types.SimpleNamespace(model=types.SimpleNamespace(lm_head=types.SimpleNamespace(
        weight=torch.zeros(3))), is_draft_worker=False)
    assert plugin.after_load_model(None, broken) is None
    assert any("failed" in r.getMessage() for r in caplog.records)
    assert plugin.after_init_lm_head(None, object()) is None


def test_moe_report_names_the_quant_method_and_runner():
    from sparkit.engines.sglang import report

    Mxfp4HummingMoEMethod = type("Mxfp4HummingMoEMethod", (), {})
    FusedMoE = type("FusedMoE", (torch.nn.Module,), {})
    model = torch.nn.Module()
    for i in range(3):
        layer = FusedMoE()
        layer.quant_method = Mxfp4HummingMoEMethod()
        layer.moe_runner_config = types.SimpleNamespace(runner_backend=types.SimpleNamespace(value="humming"))
        model.add_module(f"experts{i}", layer)
    moe = report.moe_report(model)
    assert (moe.quant_method, moe.runner, moe.expert_weight_format) == ("Mxfp4HummingMoEMethod", "humming", "mxfp4")
    assert report.moe_report(torch.nn.Linear(2, 2)) is None


def test_fused_moe_exposes_what_the_moe_report_reads():
    src = method_source("sglang.srt.layers.moe.fused_moe_triton.layer", "FusedMoE", "__init__")
    assert "self.moe_runner_config = MoeRunnerConfig(" in src
    assert "self.quant_method = quant_method" in src
    assert find_class(module_ast("sglang.srt.layers.quantization.mxfp4_humming_moe"), "Mxfp4HummingMoEMethod")


def test_humming_method_without_a_runner_field_reports_humming():
    from sparkit.engines.sglang import report

    FusedMoE = type("FusedMoE", (torch.nn.Module,), {})
    layer = FusedMoE()
    layer.quant_method = type("Mxfp4HummingMoEMethod", (), {})()
    layer.moe_runner_config = types.SimpleNamespace(runner_backend=None)
    assert report.moe_report(layer, runner_backend="auto").runner == "humming"
    layer.quant_method = type("Fp8MoEMethod", (), {})()
    moe = report.moe_report(layer, runner_backend="flashinfer_mxfp4")
    assert (moe.runner, moe.expert_weight_format) == ("flashinfer_mxfp4", "fp8")


def test_online_humming_experts_report_the_format_their_weight_schema_names():
    """--quantization humming quantises bf16 experts online (SGLANG_HUMMING_ONLINE_QUANT_CONFIG):
    the method's class (HummingMoEMethod) says nothing of the format, its layer config's weight
    schema does (humming.schema.humming.HummingWeightSchema.b_dtype)."""
    from sparkit.engines.sglang import report

    src = method_source("sglang.srt.layers.quantization.humming", "HummingMoEMethod", "__init__")
    assert "self.quant_config = quant_config" in src  # what the report reads, in the installed sglang
    assert "weight_schema" in method_source("sglang.srt.layers.quantization.humming", "HummingLayerQuantizationConfig", "__init__")
    FusedMoE = type("FusedMoE", (torch.nn.Module,), {})
    layer = FusedMoE()
    schema = types.SimpleNamespace(b_dtype="float4e2m1", bs_dtype="float8e8m0", weight_scale_group_size=32)
    layer.quant_method = type("HummingMoEMethod", (), {})()
    layer.quant_method.quant_config = types.SimpleNamespace(weight_schema=schema)
    layer.moe_runner_config = types.SimpleNamespace(runner_backend=types.SimpleNamespace(value="humming"))
    moe = report.moe_report(layer)
    assert (moe.quant_method, moe.runner, moe.expert_weight_format) == ("HummingMoEMethod", "humming", "mxfp4")
    schema.b_dtype = "float8e4m3"
    assert report.moe_report(layer).expert_weight_format == "fp8"


DSPARK = "sglang.srt.models.dspark"
# LingDSparkModel with SGLang's own attach_shared_modules (models/dspark.py DSparkDraftMixin): what
# DSparkWorkerV2.__init__ calls with the target's embedding and lm_head modules.
LingDSparkBase = type("LingDSparkModel", (torch.nn.Module,), {
    "attach_shared_modules": bind_method(DSPARK, "DSparkDraftMixin", "attach_shared_modules", _sglang_namespace()),
    "supports_vocab_parallel_draft_logits": False, "is_nemotron_35_draft": False, "gamma": 8})


def test_the_dspark_hook_reports_the_draft_on_the_targets_fp8_head_and_embedding(plugin_state):
    """SGLang gives a DSpark draft the target's modules itself; after the plugin converted the head
    to FP8, the draft holds that same FP8 module, and the report says so with the block size
    SGLang's DSpark worker drafts (speculative_num_draft_tokens - 1)."""
    plugin, tmp_path = plugin_state
    target, _ = _make_models()
    target_runner = _runner(target)
    target_runner.server_args = types.SimpleNamespace(
        speculative_algorithm="DSPARK", speculative_num_steps=1, speculative_eagle_topk=1,
        speculative_num_draft_tokens=9, speculative_draft_model_path="/d")
    plugin.after_load_model(None, target_runner)
    draft = LingDSparkBase()
    plugin.after_load_model(None, _runner(draft, draft=True))  # the draft runner loads it first
    draft.attach_shared_modules(embed_tokens=target.model.word_embeddings, lm_head=target.lm_head)
    plugin.after_attach_shared_modules(None, draft)
    rep = _read(tmp_path)
    assert rep.draft.model_class == "LingDSparkModel"
    assert rep.draft.lm_head.shared_with_target and rep.draft.lm_head.weight_dtype == "float8_e4m3fn"
    assert rep.draft.embed_tokens.shared_with_target is True
    assert (rep.speculative.algorithm, rep.speculative.block_size) == ("DSPARK", 8)


def test_dspark_hook_target_is_the_method_the_dspark_worker_calls():
    from sparkit.engines.sglang import plugin

    assert plugin.DSPARK_ATTACH_TARGET in [t for t, _ in plugin.hook_targets()]
    worker = find_class(module_ast("sglang.srt.speculative.dspark_components.dspark_worker_v2"), "DSparkWorkerV2")
    init = ast.get_source_segment(module_path("sglang.srt.speculative.dspark_components.dspark_worker_v2").read_text(),
                                  find_function(worker.body, "__init__"))
    assert "self.draft_model.attach_shared_modules(" in init and "lm_head=lm_head" in init
