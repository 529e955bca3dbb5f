"""Activation checks: proof, from a live server, that each optimisation of the plan is active.

Each check is a plain function `(plan, evidence) -> CheckResult`. The evidence
(sparkit.checks.evidence: resolved args from /server_info, the parsed log, the activation
reports written from inside the engine, and a short greedy probe) is gathered by
sparkit.checks.runner; the same checks serve SGLang and the embedded engine,
because both expose the same evidence.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkit.checks.evidence import ServerEvidence
from sparkit.checks.known_answer import DEFAULT_TOLERANCE, PASSAGE_MAX_BYTES, REFERENCE_TEXT
from sparkit.contract.checks import CheckResult, Status
from sparkit.contract.flag_table import ALIASES, chain_draft_tokens
from sparkit.contract.plan import LaunchPlan
from sparkit.engines.activation_report import SECRET_VALUE, MoeLayerReport
from sparkit.engines.sglang.flags import FP8_LM_HEAD_ENV

# -- helpers -----------------------------------------------------------------------------------
_DTYPE_NAMES = {
    "float8_e4m3fn": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2": "fp8",
    "fp8": "fp8",
    "e4m3": "fp8",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float32": "fp32",
    "fp32": "fp32",
    "float16": "fp16",
    "fp16": "fp16",
}


def normalise_dtype(name: str | None) -> str | None:
    if name is None:
        return None
    short = str(name).rsplit(".", 1)[-1].lower()  # "torch.float8_e4m3fn" -> "float8_e4m3fn"
    return _DTYPE_NAMES.get(short, short)


def _result(name: str, title: str, status: Status, detail: str, **kw: Any) -> CheckResult:
    return CheckResult(name=name, title=title, status=status, detail=detail, **kw)


def expected_server_args(plan: LaunchPlan) -> dict[str, Any]:
    """The resolved args the server must report, as the plan states them."""
    return dict(plan.expectations.server_args or {})


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return abs(float(a) - float(b)) <= 1e-6 * max(1.0, abs(float(a)))
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().lower() == b.strip().lower()
    return a == b


@dataclass
class ArgDifference:
    key: str
    wanted: Any
    got: Any
    kind: str  # "alias" | "resolved" | "rewritten" | "mismatch" | "missing"
    note: str


def compare_args(plan: LaunchPlan, args: dict[str, Any]) -> list[ArgDifference]:
    """Every difference between what the plan asked for and what the server resolved, named."""
    diffs: list[ArgDifference] = []
    wanted = expected_server_args(plan)
    for key, want in wanted.items():
        if key not in args:
            diffs.append(ArgDifference(key, want, None, "missing", f"{key} is not reported by the server"))
            continue
        got = args[key]
        if _same(want, got):
            continue
        if key == "speculative_algorithm" and ALIASES.get(str(want).upper()) == str(got).upper():
            diffs.append(ArgDifference(key, want, got, "alias", f"{str(want).upper()} is an alias of {str(got).upper()}; "
                                       f"SGLang reports {str(got).upper()}"))
        elif key == "moe_runner_backend" and str(want).lower() == "auto":
            diffs.append(ArgDifference(key, want, got, "resolved", f"the auto MoE backend resolved to {got}"))
        elif key == "tool_call_parser" and str(want).lower() == "auto" and got:
            diffs.append(ArgDifference(key, want, got, "resolved", f"the auto tool-call parser resolved to {got}"))
        elif (
            key == "speculative_num_draft_tokens"
            and args.get("speculative_eagle_topk") == 1
            and isinstance(args.get("speculative_num_steps"), int)
            and got == chain_draft_tokens(args["speculative_num_steps"])
        ):
            diffs.append(
                ArgDifference(
                    key, want, got, "rewritten",
                    f"with eagle_topk 1 the engine forces draft tokens to num_steps+1 = {got} (asked {want})",
                )
            )
        elif want is None and got is not None and key.endswith("_path"):
            continue
        else:
            diffs.append(ArgDifference(key, want, got, "mismatch", f"{key}: asked {want!r}, server runs {got!r}"))
    return diffs


# -- the checks --------------------------------------------------------------------------------
def check_resolved_args(plan: LaunchPlan, ev: ServerEvidence) -> CheckResult:
    name, title = "resolved_args", "resolved args"
    args = ev.args
    if args is None:
        return _result(
            name, title, Status.WARN,
            "the server's resolved arguments could not be read",
            evidence=[ev.server_info_error or "no /server_info and no server_args= log line"],
            fix="make sure /server_info is reachable (API key?) or that the log is in the run directory",
        )
    diffs = compare_args(plan, args)
    source = "/server_info" if ev.server_info is not None else "log server_args="
    evidence = [f"{d.key}: asked {d.wanted!r} -> {d.got!r} ({d.note})" for d in diffs]
    bad = [d for d in diffs if d.kind == "mismatch"]
    missing = [d for d in diffs if d.kind == "missing"]
    data = {"differences": [vars(d) for d in diffs], "source": source}
    if bad:
        return _result(
            name, title, Status.FAIL,
            f"{len(bad)} setting(s) differ from the recipe: " + "; ".join(d.note for d in bad),
            evidence=evidence + [f"source: {source}"],
            fix="check the recipe against the installed engine (`sparkit plan RECIPE` shows the argv); a flag may be ignored or overridden by a model-specific default",
            cause="the server is not running the configuration the recipe describes",
            data=data,
        )
    if missing:
        return _result(
            name, title, Status.WARN,
            "the server does not report: " + ", ".join(d.key for d in missing),
            evidence=evidence + [f"source: {source}"],
            fix="these settings cannot be verified from /server_info on this engine version",
            data=data,
        )
    n = len(expected_server_args(plan))
    detail = f"all {n} requested settings are in effect"
    if diffs:
        detail += " (" + "; ".join(d.note for d in diffs) + ")"
    return _result(name, title, Status.PASS, detail, evidence=evidence + [f"source: {source}"], data=data)


# -- MoE layers: what each one really runs -----------------------------------------------------


@dataclass
class _MoeLayer:
    """One MoE layer of one model (target / draft) on one TP rank, as its activation report says."""

    model: str  # "target" | "draft"
    rank: int
    layer: MoeLayerReport

    @property
    def key(self) -> tuple[str, str, str, str | None]:
        return self.layer.quant_method, self.layer.expert_weight_format, self.layer.runner, self.layer.weight_schema


def moe_layers(ev: ServerEvidence) -> list[_MoeLayer]:
    """Every MoE layer of every model on every rank that wrote a report (a schema /1 report counts
    as one entry for all of its model's layers)."""
    out = []
    for rep in ev.reports:
        for role, model in rep.models.items():
            if model.moe is not None:
                out.extend(_MoeLayer(role, rep.tp_rank, layer) for layer in model.moe.per_layer())
    return out


def _layer_names(layers: list[_MoeLayer], ranks: int) -> str:
    """'target model.layers.0.mlp.experts, ... (4 layers); draft model.decoder.mlp.experts' (ranks
    named when there are several)."""
    parts = []
    for model in ("target", "draft"):
        names = list(dict.fromkeys(f.layer.name for f in layers if f.model == model))
        if not names:
            continue
        shown = ", ".join(names[:3]) + (f", ... ({len(names)} layers)" if len(names) > 3 else "")
        on = sorted({f.rank for f in layers if f.model == model})
        parts.append(f"{model} {shown}" + (f" on TP rank(s) {on}" if ranks > 1 else ""))
    return "; ".join(parts)


def _groups(layers: list[_MoeLayer]) -> list[tuple[tuple, list[_MoeLayer]]]:
    groups: dict[tuple, list[_MoeLayer]] = {}
    for entry in layers:
        groups.setdefault(entry.key, []).append(entry)
    return sorted(groups.items(), key=lambda kv: -len(kv[1]))


def _group_text(key: tuple, layers: list[_MoeLayer], ranks: int) -> str:
    method, fmt, runner, schema = key
    return (f"{_layer_names(layers, ranks)}: {method}, {fmt} experts, runner {runner}"
            + (f" (humming weight schema {schema})" if schema else ""))


def _layer_evidence(layers: list[_MoeLayer], ranks: int) -> list[str]:
    return [f"activation report: {_group_text(key, group, ranks)}" for key, group in _groups(layers)]


def _why_this_runner(want: str, key: tuple, args: dict[str, Any]) -> tuple[str, str]:
    """(why layers of this (method, format, runner) do not run `want`, the fix)."""
    method, fmt, runner, _ = key
    resolved = args.get("moe_runner_backend")
    if want.lower() == "humming":
        if method.startswith("Unquantized"):
            return ("their experts are unquantised (UnquantizedFusedMoEMethod): SGLang 0.5.23 runs humming only through "
                    "a humming quant method, for MXFP4 experts of a pre-quantised checkpoint (Mxfp4HummingMoEMethod: "
                    "quantization_config routed_experts_quant_method mxfp4) or online (--quantization humming: "
                    f"HummingMoEMethod); unquantised experts run {runner} whatever --moe-runner-backend says",
                    "serve the MXFP4 export (model.path: sparkit:tiny-ling@mxfp4 with stack.weights: mxfp4), or quantise "
                    "online with stack.quantization: humming")
        if fmt == "fp8":
            return ("their experts are block FP8 (" + method + "): SGLang 0.5.23's Fp8Config hands humming only MXFP4 "
                    "experts (a checkpoint whose quantization_config says routed_experts_quant_method: mxfp4); FP8 "
                    f"experts keep the {runner} runner",
                    "serve an MXFP4 checkpoint (sparkit:tiny-ling@mxfp4) for humming, or ask for stack.moe_backend: "
                    "triton with FP8 experts")
        if fmt == "mxfp4":
            return (f"their MXFP4 experts got {method}, which runs {runner}: the resolved moe_runner_backend is "
                    f"{resolved!r}, and only 'humming' makes SGLang wrap them in Mxfp4HummingMoEMethod",
                    "set stack.moe_backend: humming (--moe-runner-backend humming) and check the resolved args")
    return (f"{method} picked the {runner} runner for {fmt} experts (a quant method chooses its runner from the "
            f"checkpoint's format and --moe-runner-backend, resolved {resolved!r})",
            f"check that the installed sglang runs {fmt} experts on {want} (its quant method for them), or set "
            f"stack.moe_backend: {runner}")


def check_weights(plan: LaunchPlan, ev: ServerEvidence) -> CheckResult:
    """Every MoE layer's experts hold the weights the recipe says (stack.weights)."""
    name, title = "weights", "expert weights"
    want = normalise_dtype(plan.expectations.weights)
    if not want:
        return _result(name, title, Status.SKIP, "the recipe does not say what the experts hold")
    layers = moe_layers(ev)
    ranks = len(ev.reports)
    args = ev.args or {}
    evidence = _layer_evidence(layers, ranks)
    data: dict[str, Any] = {"requested": want, "layers": len(layers),
                            "formats": sorted({normalise_dtype(f.layer.expert_weight_format) or "" for f in layers})}
    if not layers:
        # No report (SGLang without sparkit's plugin): the quantization SGLang resolved, and its own
        # line for a checkpoint whose routed experts are MXFP4.
        quant = args.get("quantization")
        mxfp4 = bool(ev.log and ev.log.mixed_mxfp4_experts)
        if ev.log is not None and "mixed_mxfp4" in ev.log.lines:
            evidence.append(f"log: {ev.log.lines['mixed_mxfp4']}")
        if not args:
            return _result(name, title, Status.WARN, "no evidence of what the experts hold",
                           evidence=evidence or ["no activation report, no resolved args"], data=data,
                           fix="install the sparkit SGLang plugin (it writes the activation report, one entry per MoE layer)")
        evidence.append(f"resolved quantization={quant!r}")
        got = "mxfp4" if mxfp4 else ("bf16" if quant is None else "fp8" if str(quant).startswith("fp8") else None)
        data["in_use"] = got
        if got == want:
            return _result(name, title, Status.PASS, f"{want} experts (from the resolved args and the log; no "
                           "activation report, so not judged layer by layer)", evidence=evidence, data=data)
        return _result(name, title, Status.WARN, f"the recipe says {want} experts; without an activation report the "
                       f"resolved quantization {quant!r} does not prove it", evidence=evidence, data=data,
                       fix="install the sparkit SGLang plugin (it writes the activation report, one entry per MoE layer)")
    wrong = [f for f in layers if normalise_dtype(f.layer.expert_weight_format) != want]
    if not wrong:
        return _result(name, title, Status.PASS, f"all {len(layers)} MoE layer(s) hold {want} experts"
                       + _ranks_note(ev), evidence=evidence, data=data)
    groups = _groups(wrong)
    detail = "; ".join(_group_text(key, group, ranks) for key, group in groups)
    quant = args.get("quantization")
    cause = (f"these layers' experts are not {want}: the checkpoint at {plan.model} stores them so "
             f"(config.json quantization_config; SGLang resolved quantization={quant!r})")
    if plan.expectations.weights and want != "bf16" and all(normalise_dtype(f.layer.expert_weight_format) == "bf16" for f in wrong):
        cause += ", and nothing quantises them online"
    return _result(
        name, title, Status.FAIL,
        f"{len(wrong)} of {len(layers)} MoE layer(s) do not hold {want} experts: {detail}",
        evidence=evidence, data=data, cause=cause,
        fix=f"point model.path at a checkpoint whose experts are {want} (the built-in exports: "
            f"sparkit:tiny-ling@{want}), quantise online (stack.quantization), or set stack.weights to what the "
            "checkpoint holds",
    )


def check_moe_runner(plan: LaunchPlan, ev: ServerEvidence) -> CheckResult:
    name, title = "moe_runner", "MoE runner"
    want = plan.expectations.moe_backend
    if not want:
        return _result(name, title, Status.SKIP, "the recipe does not ask for a MoE backend")
    layers = moe_layers(ev)
    ranks = len(ev.reports)
    evidence = _layer_evidence(layers, ranks)
    args = ev.args or {}
    resolved = args.get("moe_runner_backend")
    if resolved is not None:
        evidence.append(f"resolved moe_runner_backend={resolved}")
    log = ev.log
    if log is not None:
        for key in ("humming_gemm", "moe_backend_override", "mixed_mxfp4"):
            if key in log.lines:
                evidence.append(f"log: {log.lines[key]}")
        if log.target_load and log.target_load.quant:
            evidence.append(f"log: weights quant={log.target_load.quant} ({log.target_load.model_class})")
    runners = sorted({f.layer.runner for f in layers})
    data: dict[str, Any] = {"requested": want, "resolved": resolved, "layers": len(layers), "runners": runners}
    if layers:
        # What every layer's quant method runs (the report from inside the engine) decides.
        data["in_use"] = runners[0] if len(runners) == 1 else runners
        if want.lower() == "auto":
            return _result(name, title, Status.PASS, f"auto resolved to {', '.join(runners)} on all {len(layers)} MoE "
                           "layer(s)", evidence=evidence, data=data)
        wrong = [f for f in layers if f.layer.runner.lower() != want.lower()]
        if not wrong:
            return _result(name, title, Status.PASS, f"{want} is in use on all {len(layers)} MoE layer(s)"
                           + _ranks_note(ev), evidence=evidence, data=data)
        groups = _groups(wrong)
        causes, fixes = zip(*(_why_this_runner(want, key, args) for key, _ in groups))
        detail = "; ".join(_group_text(key, group, ranks) for key, group in groups)
        return _result(
            name, title, Status.FAIL,
            f"requested {want}, but {len(wrong)} of {len(layers)} MoE layer(s) run another runner: {detail}",
            evidence=evidence, data=data, cause="; ".join(dict.fromkeys(causes)), fix="; ".join(dict.fromkeys(fixes)),
        )
    # No report: log lines, then the resolved args.
    actual = None
    if log is not None:
        if log.humming_gemm:
            actual = "humming"
        elif log.moe_backend_override:
            actual = log.moe_backend_override
    if actual is None and resolved not in (None, "auto"):
        actual = str(resolved)
    data["in_use"] = actual
    if actual is None:
        if want.lower() == "humming":  # only SGLang has it (the embedded engine's rules refuse it)
            return _result(
                name, title, Status.WARN,
                "humming requested, but no log line proves it ran",
                evidence=evidence + ['expected log line: "Using indexed gemm for humming moe"'],
                fix="send a request and re-run `sparkit check`: humming logs its GEMM type on first use; or install the sparkit SGLang plugin for an activation report",
                data=data,
            )
        return _result(
            name, title, Status.WARN,
            "no evidence of which MoE runner is in use",
            evidence=evidence or ["no activation report, no MoE log line, no resolved args"],
            fix="install the sparkit SGLang plugin (it writes the activation report)",
            data=data,
        )
    if want.lower() == "auto":
        return _result(name, title, Status.PASS, f"auto resolved to {actual}", evidence=evidence, data=data)
    if actual.lower() != want.lower():
        return _result(
            name, title, Status.FAIL,
            f"requested {want}, but {actual} is in use",
            evidence=evidence, data=data,
            fix=f"set the MoE backend explicitly (--moe-runner-backend {want}) and check the engine supports it for this checkpoint",
            cause="a model-specific default or an unsupported combination replaced the requested MoE backend",
        )
    return _result(name, title, Status.PASS, f"{actual} is in use (no activation report: from the "
                   f"{'log' if log is not None and (log.humming_gemm or log.moe_backend_override) else 'resolved args'})",
                   evidence=evidence, data=data)


def check_lm_head_dtype(plan: LaunchPlan, ev: ServerEvidence) -> CheckResult:
    name, title = "lm_head_dtype", "lm_head dtype"
    want = normalise_dtype(plan.expectations.lm_head)
    if not want:
        return _result(name, title, Status.SKIP, "the recipe does not ask for an lm_head dtype")
    evidence: list[str] = []
    rep = ev.report
    actual: str | None = None
    draft_dtype: str | None = None
    if rep and rep.target:
        actual = normalise_dtype(rep.target.lm_head.weight_dtype)
        evidence.append(f"activation report: target lm_head {rep.target.lm_head.weight_dtype} via {rep.target.lm_head.quant_method}"
                        + _ranks_note(ev))
        if rep.draft:
            draft_dtype = normalise_dtype(rep.draft.lm_head.weight_dtype)
            evidence.append(f"activation report: draft lm_head {rep.draft.lm_head.weight_dtype} via {rep.draft.lm_head.quant_method}")
        # With TP every rank holds its own vocabulary shard of the head: each must be converted.
        odd = [r for r in ev.reports[1:] if r.target and normalise_dtype(r.target.lm_head.weight_dtype) != actual]
        if odd:
            ranks = ", ".join(f"rank {r.tp_rank}: {r.target.lm_head.weight_dtype}" for r in odd)
            return _result(
                name, title, Status.FAIL, f"the lm_head shards differ between TP ranks (rank 0: {actual}; {ranks})",
                evidence=evidence, data={"requested": want, "in_use": actual},
                cause="part of the vocabulary is computed in another precision than the rest",
                fix="every rank must run the same lm_head conversion: check the plugin's log line on each rank",
            )
    args = ev.args or {}
    log = ev.log
    if log is not None and log.fp8_lm_head:
        evidence.append(f"log: {log.lines['fp8_lm_head']}")
    if actual is None:
        # No report (SGLang without the plugin): the log line and resolved args are the evidence.
        if log is not None and log.fp8_lm_head:
            actual = "fp8"
        elif args.get("enable_fp32_lm_head"):
            actual = "fp32"
            evidence.append("resolved enable_fp32_lm_head=True")
        elif log is not None and log.weight_loads:
            actual = "bf16"
            evidence.append("log: no 'Online FP8 quantization enabled for lm_head.' line and no fp32 lm_head flag")
    data = {"requested": want, "in_use": actual, "draft": draft_dtype}
    if actual is None:
        return _result(
            name, title, Status.WARN, "no evidence of the lm_head dtype",
            evidence=evidence or ["no activation report and no log"],
            fix="install the sparkit SGLang plugin, or keep the server log in the run directory",
            data=data,
        )
    if actual != want:
        cause = "the FP8 lm_head is not active, so every token still reads the full-precision head"
        fix = f"on SGLang 0.5.23 upstream ignores {FP8_LM_HEAD_ENV}: install the sparkit plugin (pip install sparkit) or the Ling patch"
        if want != "fp8":
            cause, fix = "the lm_head runs in another precision than requested", "check lm_head in the recipe and the engine flags it compiled to"
        return _result(
            name, title, Status.FAIL, f"requested {want}, the lm_head runs in {actual}",
            evidence=evidence, data=data, fix=fix, cause=cause,
        )
    want_k = plan.expectations.lm_head_exact_top_k
    have_k = rep.target.lm_head.exact_top_k if rep and rep.target else None
    if want == "fp8" and want_k is not None:
        data["exact_top_k"] = {"requested": want_k, "in_use": have_k}
        if have_k is not None:
            evidence.append(f"activation report: exact re-scoring of the top {have_k} candidates"
                            if have_k else "activation report: no exact re-scoring")
        if have_k is not None and have_k != want_k:
            cause = ("without exact re-scoring the FP8 head picks a different token than the bf16 head at "
                     "near-ties (about 5% of positions on a Ling-shaped head)" if not have_k else
                     "the engine re-scores a different number of candidates than the recipe asks")
            return _result(
                name, title, Status.FAIL,
                f"lm_head runs in fp8, but its exact re-scoring is top-{have_k}, the recipe asks for top-{want_k}",
                evidence=evidence, data=data, cause=cause,
                fix="launch through sparkit (it passes stack.lm_head_exact_top_k to the engine), or set "
                    "stack.lm_head_exact_top_k to what the engine runs",
            )
        if want_k and have_k:
            return _result(name, title, Status.PASS,
                           f"lm_head runs in fp8, its top {have_k} candidates re-scored exactly from bf16",
                           evidence=evidence, data=data)
    return _result(name, title, Status.PASS, f"lm_head runs in {actual}", evidence=evidence, data=data)


def check_shared_lm_head(plan: LaunchPlan, ev: ServerEvidence) -> CheckResult:
    name, title = "shared_lm_head", "draft shares lm_head"
    exp = plan.expectations
    if not exp.speculative or exp.draft_shares_lm_head is None:
        return _result(name, title, Status.SKIP, "no draft model, or sharing is not asserted by the recipe")
    rep = ev.report
    if rep is None or rep.target is None:
        return _result(
            name, title, Status.WARN, "no activation report: sharing cannot be proven",
            evidence=["no activation-tp*.json in the run directory"],
            fix="install the sparkit SGLang plugin (it reports the draft's lm_head module)",
        )
    if rep.draft is None:
        return _result(
            name, title, Status.FAIL, "the activation report has no draft model",
            evidence=[f"report models: {sorted(rep.models)}"],
            fix="check the speculative settings: the engine did not load a draft",
            cause="speculative decoding is not active",
        )
    target, draft = rep.target.lm_head, rep.draft.lm_head
    same_module = draft.module_id == target.module_id
    rank0_shared = bool(draft.shared_with_target) or same_module
    evidence = [
        f"target lm_head module_id={target.module_id} storage={target.storage_ptr} dtype={target.weight_dtype}",
        f"draft lm_head module_id={draft.module_id} storage={draft.storage_ptr} dtype={draft.weight_dtype} shared_with_target={draft.shared_with_target}",
    ]
    # With TP each rank's draft must share that rank's head shard (module ids are per process).
    unshared_ranks = []
    for other in ev.reports[1:]:
        if other.target is None or other.draft is None:
            unshared_ranks.append(other.tp_rank)
            continue
        ot, od = other.target.lm_head, other.draft.lm_head
        if not (od.shared_with_target or od.module_id == ot.module_id):
            unshared_ranks.append(other.tp_rank)
        evidence.append(f"rank {other.tp_rank}: draft shares the target's lm_head: {bool(od.shared_with_target or od.module_id == ot.module_id)}")
    missing = ev.missing_ranks()
    if missing:
        evidence.append(f"no activation report from TP rank(s) {missing}")
    shared = rank0_shared and not unshared_ranks
    if rank0_shared and unshared_ranks:
        evidence.append(f"not shared on TP rank(s) {unshared_ranks}")
    data = {"shared": shared, "same_module": same_module, "same_storage": draft.storage_ptr == target.storage_ptr,
            "ranks": len(ev.reports), "unshared_ranks": unshared_ranks, "missing_ranks": missing}
    if shared == exp.draft_shares_lm_head and missing and exp.draft_shares_lm_head:
        return _result(
            name, title, Status.WARN, f"the draft shares the lm_head on the ranks that reported; TP rank(s) {missing} wrote no report",
            evidence=evidence, data=data, fix="read those ranks' log lines (`sparkit logs RUN`): the plugin writes one report per rank",
        )
    if shared == exp.draft_shares_lm_head:
        detail = "the draft uses the target's lm_head module" if shared else "the draft has its own lm_head, as the recipe says"
        if len(ev.reports) > 1:
            detail += f" (on all {len(ev.reports)} TP ranks)"
        return _result(name, title, Status.PASS, detail, evidence=evidence, data=data)
    if exp.draft_shares_lm_head:
        cause = "the draft reads its own copy of the head"
        unquantised_method = draft.quant_method.startswith("Unquantized") and not target.quant_method.startswith("Unquantized")
        if normalise_dtype(target.weight_dtype) == "fp8" and (normalise_dtype(draft.weight_dtype) != "fp8" or unquantised_method):
            # Embedded engine: a BF16 copy of the FP8 bytes. Real SGLang 0.5.23: the same FP8
            # storage under the draft's UnquantizedEmbeddingMethod (a crash at the first draft
            # matmul or graph capture, seen on an H200; the Ling patch's variant decodes garbage).
            cause = ("the target's head was quantised to FP8 but the draft still reads it through a BF16 method "
                     f"({draft.quant_method}): its drafts are garbage (accept length ~1.0) or the engine fails on them")
        where = f" on TP rank(s) {unshared_ranks}" if rank0_shared else ""
        return _result(
            name, title, Status.FAIL, "the draft does not use the target's lm_head module" + where,
            evidence=evidence, data=data, cause=cause,
            fix="use an engine that shares the quantised lm_head module with the draft (sparkit plugin / set_lm_head_from_target), or turn the FP8 lm_head off",
        )
    return _result(
        name, title, Status.FAIL, "the draft shares the target's lm_head, the recipe says it should not",
        evidence=evidence, data=data, fix="check expectations.draft_shares_lm_head in the recipe",
    )


def check_shared_embedding(plan: LaunchPlan, ev: ServerEvidence) -> CheckResult:
    """DSpark: the draft embeds its block (anchor and mask tokens) with the target's own module."""
    name, title = "shared_embedding", "draft shares embedding"
    exp = plan.expectations
    if not exp.speculative or exp.draft_shares_embedding is None:
        return _result(name, title, Status.SKIP, "the recipe does not assert that the draft shares the embedding")
    rep = ev.report
    if rep is None or rep.target is None or rep.draft is None:
        what = "no activation report" if rep is None or rep.target is None else "the activation report has no draft model"
        return _result(name, title, Status.WARN if rep is None else Status.FAIL, f"{what}: sharing cannot be proven",
                       evidence=[f"report models: {sorted(rep.models) if rep else []}"],
                       fix="install the sparkit SGLang plugin (it reports the draft's modules), and check that the "
                           "engine loaded the draft")
    embedding = rep.draft.embed_tokens
    if embedding is None:
        return _result(name, title, Status.WARN, "the activation report does not say which embedding the draft uses",
                       evidence=[f"draft {rep.draft.model_class}: no embed_tokens entry"],
                       fix="upgrade the engine's reporter (sparkit's plugin writes embed_tokens for a DSpark draft)")
    unshared = [r.tp_rank for r in ev.reports if r.draft is None or r.draft.embed_tokens is None
                or not r.draft.embed_tokens.shared_with_target]
    evidence = [f"rank {r.tp_rank}: draft embed_tokens module_id={r.draft.embed_tokens.module_id} "
                f"shared_with_target={r.draft.embed_tokens.shared_with_target}"
                for r in ev.reports if r.draft is not None and r.draft.embed_tokens is not None]
    data = {"shared": not unshared, "unshared_ranks": unshared, "ranks": len(ev.reports)}
    if unshared:
        return _result(name, title, Status.FAIL, f"the draft does not embed with the target's module (TP rank(s) {unshared})",
                       evidence=evidence, data=data,
                       cause="the draft reads an embedding of its own: its block starts from vectors it was not trained on",
                       fix="load the draft through an engine that attaches the target's embedding (SGLang's "
                           "attach_shared_modules; the embedded engine does)")
    return _result(name, title, Status.PASS, "the draft embeds with the target's embedding module"
                   + (f" (on all {len(ev.reports)} TP ranks)" if len(ev.reports) > 1 else ""), evidence=evidence, data=data)


def block_size_in_use(ev: ServerEvidence) -> tuple[int | None, str]:
    """The DSpark block size the server drafts with, and where that was read."""
    rep = ev.report
    if rep is not None and rep.speculative.block_size:
        return int(rep.speculative.block_size), "activation report"
    args = ev.args or {}
    if isinstance(args.get("speculative_num_draft_tokens"), int) and str(args.get("speculative_algorithm")).upper() == "DSPARK":
        return int(args["speculative_num_draft_tokens"]) - 1, "resolved speculative_num_draft_tokens - 1"
    return None, "neither the activation report nor the resolved args"


def check_block_size(plan: LaunchPlan, ev: ServerEvidence) -> CheckResult:
    """DSpark: the block in use is the recipe's (when it states one) and the draft config's."""
    name, title = "block_size", "DSpark block size"
    exp = plan.expectations
    if exp.speculative != "dspark":
        return _result(name, title, Status.SKIP, "no DSpark draft in this recipe")
    in_use, source = block_size_in_use(ev)
    wanted = {"the recipe's speculative.block_size": exp.block_size, "the draft config's block_size": exp.draft_block_size}
    evidence = [f"in use: {in_use} ({source})"] + [f"{k}: {v}" for k, v in wanted.items() if v is not None]
    data = {"in_use": in_use, "recipe": exp.block_size, "draft_config": exp.draft_block_size, "source": source}
    if in_use is None:
        return _result(name, title, Status.WARN, "the block size in use could not be read", evidence=evidence, data=data,
                       fix="check that speculative decoding is DSpark (/server_info speculative_algorithm)")
    off = [f"{k} is {v}" for k, v in wanted.items() if v is not None and v != in_use]
    if off:
        return _result(name, title, Status.FAIL, f"the server drafts blocks of {in_use}, but " + " and ".join(off),
                       evidence=evidence, data=data,
                       cause="a draft trained for one block size drafts worse at another (its mask rows and confidence "
                             "head were trained for that many positions), and the verify window is not the one planned",
                       fix="leave speculative.block_size unset (the draft's), or use a draft trained for that block")
    if not any(v is not None for v in wanted.values()):
        return _result(name, title, Status.WARN, f"blocks of {in_use}; neither the recipe nor the draft config could be "
                       "read to compare", evidence=evidence, data=data)
    return _result(name, title, Status.PASS, f"blocks of {in_use} tokens (verify window {in_use + 1}), as "
                   + " and ".join(k for k, v in wanted.items() if v is not None), evidence=evidence, data=data)


# The accept length of a draft that is never accepted: every verify step commits its bonus token
# only. A plan that states no minimum (compile always states one for a speculative recipe:
# sparkit.contract.flag_table.DEFAULT_MIN_ACCEPT_LENGTH) must clear this much.
NO_DRAFT_ACCEPTED = 1.0


def check_acceptance(plan: LaunchPlan, ev: ServerEvidence) -> CheckResult:
    name, title = "acceptance", "accept length"
    exp = plan.expectations
    if not exp.speculative:
        return _result(name, title, Status.SKIP, "no speculative decoding in this recipe")
    floor = exp.min_accept_length if exp.min_accept_length is not None else NO_DRAFT_ACCEPTED
    probe = ev.probe
    accept: float | None = probe.accept_length if probe else None
    evidence: list[str] = []
    if probe and probe.requests:
        evidence.append(
            f"probe: {len(probe.requests)} greedy requests, {probe.completion_tokens} tokens / {probe.spec_verify_ct} verify steps"
        )
    source = "probe"
    if accept is None and ev.server_info and ev.server_info.avg_spec_accept_length is not None:
        accept, source = ev.server_info.avg_spec_accept_length, "/server_info avg_spec_accept_length"
        evidence.append(f"{source}={accept:.2f}")
    if accept is None and ev.log and ev.log.last_accept_length is not None:
        accept, source = ev.log.last_accept_length, "log accept len"
        evidence.append(f"log: {ev.log.decode_stats[-1].line}")
    data = {"accept_length": accept, "min_accept_length": floor, "source": source}
    if accept is None:
        return _result(
            name, title, Status.WARN if not (probe and probe.error) else Status.FAIL,
            "accept length could not be measured" + (f": {probe.error}" if probe and probe.error else ""),
            evidence=evidence or ["the probe got no spec_verify_ct in meta_info"],
            fix="check that speculative decoding is on (/server_info speculative_algorithm) and re-run `sparkit check`",
            data=data,
        )
    if accept > floor:
        return _result(name, title, Status.PASS, f"accept length {accept:.2f} > {floor:.2f}", evidence=evidence, data=data)
    causes = []
    if accept < 1.15:
        rep = ev.report
        loaded_draft = None
        if rep and rep.draft and rep.target:
            if not (rep.draft.lm_head.shared_with_target or rep.draft.lm_head.module_id == rep.target.lm_head.module_id):
                causes.append("the draft does not share the target's lm_head (with an FP8 head it decodes garbage drafts)")
            loaded_draft = rep.speculative.draft_model_path
        # One sentence for a wrong draft: the one the engine reports it loaded, else the one the
        # recipe asks for (both name the same suspect; only a different one is worth naming too).
        draft = loaded_draft or exp.draft_model
        if draft:
            differs = exp.draft_model and loaded_draft and os.path.normpath(exp.draft_model) != os.path.normpath(loaded_draft)
            asked = f" (the recipe asks for {exp.draft_model})" if differs else ""
            if exp.speculative == "dspark":
                causes.append(f"the DSpark draft {draft}{asked} is untrained (random weights) or was trained for "
                              "another target")
            else:
                causes.append(f"the draft model {draft}{asked} may not belong to this target (wrong draft)")
        if not causes:
            causes = ["an unshared FP8 lm_head (the draft reads FP8 bytes through a BF16 method)", "a wrong draft model"]
        detail = f"accept length {accept:.2f} is ~1: the draft is useless, every verify step commits only the bonus token"
    elif exp.speculative == "dspark":
        causes.append(f"the DSpark draft {exp.draft_model or ''} is untrained or was trained for another target: a "
                      "random block draft still commits a few tokens on repetitive text, far fewer than a trained one")
        detail = f"accept length {accept:.2f} <= {floor:.2f} (the recipe's minimum)"
    else:
        causes.append("drafts are accepted less often than the recipe expects: a weaker draft, a sampling mismatch or a quantisation change")
        detail = f"accept length {accept:.2f} <= {floor:.2f} (the recipe's minimum)"
    return _result(
        name, title, Status.FAIL, detail, evidence=evidence, data=data,
        cause="likely: " + "; ".join(causes),
        fix="check the draft model path and the shared-head check above; run without the FP8 lm_head to confirm",
    )


def check_decode_speed(plan: LaunchPlan, ev: ServerEvidence) -> CheckResult:
    name, title = "decode_speed", "decode speed"
    floor = plan.expectations.min_decode_tok_s
    probe = ev.probe
    tok_s = probe.decode_tok_s if probe else None
    evidence = []
    if probe and probe.requests:
        evidence.append("probe per-request tok/s: " + ", ".join(f"{r.decode_tok_s:.1f}" for r in probe.requests if r.decode_tok_s))
    data = {"decode_tok_s": tok_s, "min_decode_tok_s": floor}
    if tok_s is None:
        status = Status.FAIL if (floor is not None and probe and probe.error) else Status.WARN
        return _result(
            name, title, status, "decode speed could not be measured" + (f": {probe.error}" if probe and probe.error else ""),
            evidence=evidence, data=data, fix="re-run `sparkit check` once the server answers /generate",
        )
    if floor is not None and tok_s < floor:
        return _result(
            name, title, Status.FAIL, f"{tok_s:.1f} tok/s is below the recipe's floor of {floor:.1f} tok/s",
            evidence=evidence, data=data,
            cause="an optimisation is not active, or the machine is busy",
            fix="look at the other checks first; `sparkit bench` measures it properly",
        )
    detail = f"{tok_s:.1f} tok/s (batch 1, short greedy probe)"
    if floor is not None:
        detail += f" >= floor {floor:.1f}"
    return _result(name, title, Status.PASS, detail, evidence=evidence, data=data)


def check_known_answer(plan: LaunchPlan, ev: ServerEvidence) -> CheckResult:
    """The server's perplexity on the shipped reference text against the recipe's stated value."""
    name, title = "known_answer", "known answer"
    exp = plan.expectations
    want = exp.reference_perplexity
    if want is None:
        return _result(name, title, Status.SKIP, "the recipe states no reference perplexity (checks.reference_perplexity)")
    tolerance = exp.reference_perplexity_tolerance or DEFAULT_TOLERANCE
    score = ev.known_answer
    data: dict[str, Any] = {"expected": want, "tolerance": tolerance,
                            **(score.to_dict() if score is not None else {"perplexity": None})}
    if score is None or score.perplexity is None:
        reason = score.unavailable if score is not None and score.unavailable else "the reference text was not scored"
        return _result(
            name, title, Status.WARN, f"the known-answer check could not run: {reason}",
            evidence=[f"reference: {REFERENCE_TEXT.name}"], data=data,
            fix="the check needs prompt logprobs from /generate (return_logprob, logprob_start_len 0): "
                "SGLang and sparkit's embedded engine give them; re-run `sparkit check` once the server answers",
        )
    got = score.perplexity
    gap = got / want - 1.0
    evidence = [
        f"{score.passages} passages of {REFERENCE_TEXT.name} (<= {PASSAGE_MAX_BYTES} bytes each, from the sequence "
        f"start), {score.tokens} tokens scored",
        "per passage: " + ", ".join(f"{p:.3f}" for p in score.per_passage),
    ]
    data["gap"] = gap
    if abs(gap) > tolerance:
        return _result(
            name, title, Status.FAIL,
            f"perplexity {got:.3f} on the reference text, the recipe expects {want:.3f} ({gap:+.0%}, beyond ±{tolerance:.0%})",
            evidence=evidence, data=data,
            cause="the model computes wrong numbers: a kernel, a quantisation or a checkpoint problem "
                  "(the server can be fluent, fast and well accepted and still be wrong)"
                  + (f"; or another model: {exp.reference_model_note}" if exp.reference_model_note else ""),
            fix="compare with a run of the same checkpoint without the suspect optimisation (e.g. bf16 experts or "
                "lm_head, another MoE backend); check the checkpoint's files; if the change is intended, update "
                "checks.reference_perplexity",
        )
    return _result(name, title, Status.PASS,
                   f"perplexity {got:.3f} on the reference text, expected {want:.3f} ±{tolerance:.0%} ({gap:+.1%})",
                   evidence=evidence, data=data)


def _ranks_note(ev: ServerEvidence) -> str:
    return f" (rank 0 of {len(ev.reports)} reports)" if len(ev.reports) > 1 else ""


_ENV_NAME = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b")


def check_ignored_settings(plan: LaunchPlan, ev: ServerEvidence) -> CheckResult:
    """Env vars the installed engine does not know (plan.warnings) and flags it rewrote.

    A rewrite or unknown variable is a warning; it fails when an optimisation the
    plan relies on is provided by exactly such an ignored variable.
    """
    name, title = "ignored_settings", "ignored settings"
    evidence = [f"plan: {w}" for w in plan.warnings]
    if ev.args is not None:
        for d in compare_args(plan, ev.args):
            if d.kind == "rewritten":
                evidence.append(f"engine rewrote {d.key}: {d.note}")
    # A rewrite counts when it touches a setting the plan passed; SGLang also resets defaults the
    # recipe never set (0.5.23: "Max running requests is reset to 48 for speculative decoding"),
    # which is recorded but is not the recipe's setting being ignored.
    notes = []
    if ev.log is not None:
        for line in ev.log.rewrites:
            (evidence if _mentions_a_planned_flag(plan, line) else notes).append(f"log: {line}")
    ignored_vars = {v for w in plan.warnings for v in _ENV_NAME.findall(w)}
    relied = [p for p in plan.provisions if p.provider == "sglang-env" and any(v in p.detail for v in ignored_vars)]
    data = {"ignored_env": sorted(ignored_vars), "count": len(evidence), "engine_defaults_rewritten": notes}
    if relied:
        return _result(
            name, title, Status.FAIL,
            "the recipe relies on settings the engine ignores: " + ", ".join(f"{p.optimisation} via {p.detail}" for p in relied),
            evidence=evidence, data=data,
            cause="unknown SGLANG_* variables are silently ignored, so the optimisation is not active",
            fix="use the sparkit plugin provider for it, or an SGLang build that knows the variable",
        )
    if evidence:
        return _result(
            name, title, Status.WARN, f"{len(evidence)} warning(s): settings the engine ignores or rewrote, or recipe warnings",
            evidence=evidence, data=data,
            fix="remove them from the recipe, or pin the engine version that knows them",
        )
    detail = "the engine took every setting as given"
    if notes:
        detail += f" (it reset {len(notes)} default(s) the recipe does not set)"
    return _result(name, title, Status.PASS, detail, evidence=notes, data=data)


# The engines' switch variables the recipe's `server.env` may set and the engine reports back.
SWITCH_PREFIXES = {"sglang": "SGLANG_"}
# Set by sparkit itself (the plugin's selection), not a switch of the recipe's.
_NOT_SWITCHES = {"SGLANG_PLUGINS"}


def _planned_switches(plan: LaunchPlan) -> dict[str, str]:
    """The recipe's own engine switches, with the value the launch passed for each."""
    prefix = SWITCH_PREFIXES.get(plan.engine)
    recipe_env = ((plan.recipe or {}).get("server") or {}).get("env") or {}
    if prefix is None:
        return {}
    return {name: str(plan.env.get(name, value)) for name, value in sorted(recipe_env.items())
            if name.startswith(prefix) and name not in _NOT_SWITCHES}


def _seen_switches(ev: ServerEvidence) -> tuple[dict[str, Any] | None, str]:
    """(what the engine process saw of each switch, where that comes from): the activation report
    (value, effective value, default; rank 0), else /server_info's `env_vars` (the scheduler's
    strings, with SGLANG_EXPOSE_OWN_ENV_VARS=1), else None."""
    rep = next((r for r in ev.reports if r.engine_env), None)
    if rep is not None:
        return {n: vars(s) for n, s in rep.engine_env.items()}, f"the activation report (TP rank {rep.tp_rank})"
    if ev.server_info is not None:
        for state in ev.server_info.raw.get("internal_states") or []:
            if isinstance(state, dict) and isinstance(state.get("env_vars"), dict):
                return ({n: {"value": str(v), "effective": None, "known": True, "invalid": None}
                         for n, v in state["env_vars"].items()}, "/server_info env_vars")
    return None, ""


def _switch_problem(name: str, want: str, seen: dict[str, Any] | None) -> tuple[str, str] | None:
    """(what is wrong, its status) for one switch, or None when the engine runs what was asked."""
    if seen is None:
        return f"{name}={want}: the engine's environment has no {name}", "fail"
    if seen.get("value") not in (want, SECRET_VALUE):
        return f"{name}: the recipe passes {want!r}, the engine process has {seen.get('value')!r}", "fail"
    if not seen.get("known", True):
        return f"{name}={want}: the installed engine has no such variable (not in its registry): no effect", "warn"
    if seen.get("invalid"):
        return (f"{name}={want}: the engine cannot read it ({seen['invalid']}) and runs its default "
                f"{seen.get('default')!r}"), "fail"
    return None


def _switch_line(name: str, seen: dict[str, Any]) -> str:
    effective = seen.get("effective")
    default = seen.get("default")
    tail = "" if effective is None else f" -> {effective!r} (default {default!r})"
    return f"{name}={seen.get('value')}{tail}"


def _mentions_a_planned_flag(plan: LaunchPlan, line: str) -> bool:
    """Does a log line name a setting the launch passed ("Max running requests" ~ --max-running-requests)?"""
    words = "_".join(re.findall(r"[a-z0-9]+", line.lower()))
    flags = {a[2:].replace("-", "_") for a in plan.argv if a.startswith("--")}
    return any(flag in words for flag in flags if len(flag) > 3)


def passed_flags(args: list[str]) -> list[tuple[str, str | None]]:
    """(flag, its value or None for a bare switch) of each flag in a pass-through argv."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        item = args[i]
        if item.startswith("--") and "=" in item:
            flag, _, value = item.partition("=")
            out.append((flag, value))
        elif item.startswith("--"):
            takes = i + 1 < len(args) and not args[i + 1].startswith("--")
            out.append((item, args[i + 1] if takes else None))
            i += takes
        i += 1
    return out


def _switch_value_is(want: str | None, got: Any) -> bool | None:
    """Does the server's resolved value say what was passed? None: it cannot tell (a list, a table)."""
    if isinstance(got, (list, dict)):
        return None
    if want is None:
        return got is True
    if isinstance(got, bool):
        return want.lower() in ({"true", "1", "yes", "on"} if got else {"false", "0", "no", "off"})
    try:
        return float(want) == float(got)
    except (TypeError, ValueError):
        return str(got) == want


def _env_reached(plan: LaunchPlan, environ: dict[str, str] | None) -> tuple[list[str], list[str]]:
    """(evidence, what did not arrive) for the variables the plan sets, against the engine's environment."""
    if not plan.env:
        return [], []
    if environ is None:
        return ["environment: not read (no run directory, or its engine is not the process sparkit started)"], []
    evidence, wrong = [], []
    for key, value in plan.env.items():
        got = environ.get(key)
        if got == value:
            evidence.append(f"env {key}={value}: in the engine's environment")
        else:
            wrong.append(f"env {key}: the plan sets {value!r}, the engine runs with "
                         + ("it unset" if got is None else repr(got)))
    return evidence, wrong


def _switch_semantics(plan: LaunchPlan, ev: ServerEvidence) -> tuple[list[str], list[tuple[str, str]], list[str], str]:
    """What the engine made of the recipe's own switches (server.env SGLANG_*), from its own account
    (the plugin's report or /server_info's env_vars): (evidence, problems with their status, switches
    set outside the recipe, the source; '' when nothing reports it)."""
    wanted = _planned_switches(plan)
    if not wanted:
        return [], [], [], ""
    seen, source = _seen_switches(ev)
    if seen is None:
        return [], [], [], ""
    problems = [p for p in (_switch_problem(n, v, seen.get(n)) for n, v in wanted.items()) if p]
    evidence = [f"{source}: {_switch_line(n, seen[n])}" for n in wanted if n in seen]
    prefix = SWITCH_PREFIXES[plan.engine]
    others = [n for n, st in sorted(seen.items()) if n not in wanted and n not in plan.env and n.startswith(prefix)
              and st.get("effective") != st.get("default")]
    evidence += [f"also in the engine's environment, not from the recipe: {_switch_line(n, seen[n])}" for n in others]
    return evidence, problems, others, source


def check_engine_switches(plan: LaunchPlan, ev: ServerEvidence) -> CheckResult:
    """The engine switches reached the engine and mean there what the recipe says: every variable the
    plan sets is in the engine process's environment as the OS reports it; each of the recipe's
    SGLANG_* switches is known to the installed engine and read as the value given (the plugin's
    report: a value SGLang cannot read, `on` for a boolean, runs its default silently); every
    pass-through flag whose resolved value the server reports is at the value passed."""
    name, title = "engine_switches", "engine switches"
    flags = passed_flags(list(((plan.recipe or {}).get("server") or {}).get("extra_args") or []))
    if not plan.env and not flags:
        return _result(name, title, Status.SKIP, "the plan sets no environment variable and passes no engine flag")
    evidence, wrong = _env_reached(plan, ev.engine_environ)
    verified = len(plan.env) - len(wrong) if ev.engine_environ is not None else 0
    meant, problems, others, source = _switch_semantics(plan, ev)
    evidence += meant
    verified += bool(source) and len(_planned_switches(plan)) - len(problems)
    differ = []
    args = ev.args or {}
    for flag, value in flags:
        dest, shown = flag[2:].replace("-", "_"), flag + ("" if value is None else f" {value}")
        same = _switch_value_is(value, args[dest]) if dest in args else None
        verified += bool(same)
        if same is False:
            differ.append(f"flag {shown}: the server reports {dest}={args[dest]!r}")
        else:
            evidence.append(f"flag {shown}: " + (f"the server reports {dest}={args[dest]!r}" if same else
                                                 "passed (the server reports no value for it)"))
    data = {"env": dict(plan.env), "flags": [list(f) for f in flags], "environment_read": ev.engine_environ is not None,
            "requested": _planned_switches(plan), "source": source, "problems": [p[0] for p in problems],
            "not_from_recipe": others}
    wanted = _planned_switches(plan)
    misread = [p for p, status in problems if status == "fail"]
    failed = wrong + ([f"{len(misread)} of {len(wanted)} switch(es) are not what the recipe asks: " + "; ".join(misread)]
                      if misread else [])
    if failed:
        return _result(name, title, Status.FAIL, "; ".join(failed), evidence=evidence, data=data,
                       cause="the engine does not run the configuration the recipe describes (a variable that did not "
                             "arrive, or a value it cannot read, runs its default silently)",
                       fix="start it through `sparkit up`, and write each switch as the engine reads it "
                           "(booleans: 1/0, true/false)")
    warned = ([f"the engine resolved flags otherwise: {'; '.join(differ)}"] if differ else []) + \
        [p for p, _status in problems] + ([f"set outside the recipe: {', '.join(others)}"] if others else [])
    if warned:
        return _result(name, title, Status.WARN, "; ".join(warned), evidence=evidence, data=data,
                       fix="the engine may override a flag for this model or GPU (see its log); remove a switch the "
                           "engine does not know; unset switches inherited from the shell (they change what is measured)")
    if wanted and not source and ev.engine_environ is None:
        return _result(
            name, title, Status.WARN, f"cannot prove the engine runs {', '.join(wanted)}: nothing reports its environment",
            evidence=evidence + ["no engine environment read, no activation report with it, no /server_info env_vars"],
            data=data,
            fix="sparkit's SGLang plugin reports them (the plan enables it when server.env sets an SGLANG_* switch): "
                "check that `sparkit plan` shows engine_switches=reported and that the run directory has "
                "activation-tp0.json; or start the engine with SGLANG_EXPOSE_OWN_ENV_VARS=1")
    if not verified:
        return _result(name, title, Status.SKIP, "nothing here shows the engine's switches: its environment was not "
                       "read and neither it nor the server reports them", evidence=evidence, data=data)
    return _result(name, title, Status.PASS, f"{verified} switch(es) shown in effect by the engine itself",
                   evidence=evidence, data=data)


def check_tool_calls(plan: LaunchPlan, ev: ServerEvidence) -> CheckResult:
    """Whether the server reads the model's tool calls into `tool_calls`: SGLang does only with a
    --tool-call-parser (without one an agent's `tools` request gets the call as text, and
    tool_choice "required" a JSON array as content), on either engine."""
    name, title = "tool_calls", "tool calls"
    want = expected_server_args(plan).get("tool_call_parser")
    if ev.args is None:
        return _result(name, title, Status.WARN if want else Status.SKIP,
                       "whether the server parses tool calls could not be read (no resolved arguments)",
                       evidence=[ev.server_info_error or "no /server_info"], data={"asked": want, "parser": None})
    got = ev.args.get("tool_call_parser")
    data = {"asked": want, "parser": got}
    evidence = [f"tool_call_parser: {got!r} (/server_info)", f"recipe: server.tool_call_parser = {want!r}"]
    if want and (not got or (str(want).lower() != "auto" and not _same(want, got))):
        return _result(name, title, Status.FAIL, f"the recipe asks for the {want} tool-call parser, the server runs "
                       f"{got or 'none'}", evidence=evidence, data=data,
                       cause="the engine ignored or rewrote --tool-call-parser (an older engine, or auto found no parser "
                             "for this model)",
                       fix="name the parser the model's format needs (ling3 for Ling 3.0) in server.tool_call_parser")
    if not got:
        return _result(name, title, Status.SKIP, "off: no --tool-call-parser, so a `tools` request gets the model's "
                       "calls as text in content (set server.tool_call_parser to turn parsing on)",
                       evidence=evidence, data=data)
    return _result(name, title, Status.PASS, f"on: the {got} parser reads the model's calls into tool_calls; "
                   "tool_choice required or a named function is written under a JSON-array grammar",
                   evidence=evidence, data=data)


ACTIVATION_CHECKS: list[Callable[[LaunchPlan, ServerEvidence], CheckResult]] = [
    check_resolved_args,
    check_weights,
    check_moe_runner,
    check_lm_head_dtype,
    check_shared_lm_head,
    check_shared_embedding,
    check_block_size,
    check_acceptance,
    check_decode_speed,
    check_known_answer,
    check_ignored_settings,
    check_engine_switches,
    check_tool_calls,
]


def evaluate(plan: LaunchPlan, ev: ServerEvidence) -> list[CheckResult]:
    """Run every activation check on gathered evidence. A check that crashes is reported, not raised."""
    results = []
    for check in ACTIVATION_CHECKS:
        try:
            results.append(check(plan, ev))
        except Exception as exc:  # a bug in one check must not hide the others
            name = check.__name__.removeprefix("check_")
            results.append(CheckResult(name=name, title=name.replace("_", " "), status=Status.WARN,
                                       detail=f"the check itself failed: {type(exc).__name__}: {exc}"))
    return results
