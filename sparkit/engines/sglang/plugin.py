"""sparkit's SGLang general plugin (entry point group `sglang.srt.plugins`, name `sparkit`).

SGLang calls register() early in every one of its processes. It does nothing unless sparkit's
launcher enabled it (SPARKIT_SGLANG_PLUGIN=1, set by the plan for `lm_head: fp8` on an SGLang
without SGLANG_ENABLE_FP8_LM_HEAD), so plain sglang use on the same machine is untouched.

Enabled, it registers AFTER hooks on (dotted paths checked against sglang 0.5.23 by the tests):
* ModelRunner.load_model: on the target runner, quantise the lm_head online to FP8 (e4m3,
  per-row scales; this rank's vocab shard) and compute logits through the FP8-weight kernel;
  then write this rank's activation report.
* EagleDraftWorker.init_lm_head and MultiLayerEagleDraftWorker.init_lm_head (NEXTN/EAGLE): after
  SGLang hands the draft the target's weight tensors, give the draft the target's lm_head *module*
  (SGLang only does that for drafts with set_lm_head_from_target, which Ling's NextN lacks), log
  it, and rewrite the report with the draft.
* DSparkDraftMixin.attach_shared_modules (DSPARK): SGLang itself gives a DSpark draft the target's
  embedding and lm_head *modules* (the FP8 head included, once converted); the hook rewrites the
  report with the draft, its shared modules and its block size.
SPARKIT_FP8_LM_HEAD=0 keeps the report and sharing hooks but leaves the lm_head as loaded;
SPARKIT_FP8_LM_HEAD_EXACT_TOP_K sets the exact re-scoring (sparkit.kernels.fp8_linear; 0 = off);
SPARKIT_SHARE_LM_HEAD=0 converts the head but leaves the draft as stock SGLang leaves it (with the
target's weight *tensor* only): the seed's trap, reproduced on the real engine for the checks to
catch (recipes/tiny/tiny-sglang-unshared-head.yaml).

Every report also carries the SGLANG_* switches of the engine process's environment, each with
the value SGLang reads from it (`sglang.srt.environ.envs`), so that the startup checks can prove
a recipe's `server.env` switches took effect (sparkit.checks.activation.check_engine_switches).
The plan enables the plugin for that alone (SPARKIT_FP8_LM_HEAD=0) when a recipe sets one.

With SPARKIT_HUMMING_KEYWORDS=1 (set by the plan when sparkit.engines.sglang.compat finds the
installed sglang passing humming a keyword it renamed), an AROUND hook on
humming.utils.weight.quantize_weight renames the keywords of RENAMED_KEYWORDS: sglang 0.5.23's
online-quant loaders pass `has_global_scale`, which humming-kernels 0.1.12 (sglang's own pin)
replaced with `weight_scale_2_type`. The hook patches humming's module attribute, not sglang's:
sglang binds the function lazily (`_lazy_import_humming` runs `from humming.utils.weight import
quantize_weight` at the first humming layer, long after the hooks are applied), so that import
picks up the adapted function; the module global `sglang.srt.layers.quantization.humming.
quantize_weight` is still None when hooks are applied and would be overwritten by that import.

Why not SGLang's own `set_lm_head_from_target()` for the head: the EAGLE worker calls it only for
drafts whose class has the method, and the hook registry can only wrap attributes that exist
(it getattr()s the target), so the plugin would have to add the method to
BailingMoeForCausalLMNextN by hand at import time (a class REPLACE does not reach the model
registry, which holds the class in the module's EntryClass list); MultiLayerEagleDraftWorker's
init_lm_head never calls it; and the activation report and the SPARKIT_SHARE_LM_HEAD=0 trap need
the init_lm_head hook anyway. The AFTER hook does the same assignment on both workers.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from dataclasses import dataclass

from sparkit.env_switch import truthy
from sparkit.kernels.rescoring import DEFAULT_EXACT_TOP_K

# Imported inside functions: the FP8 head and the activation report, in the hooks that use them
# (inside their `try`, which logs rather than raises: a hook must never stop SGLang). This module
# loads in every SGLang process, enabled or not, and needs neither until a hook runs.

# How SGLang finds this plugin: the entry point pyproject.toml registers under this name in the
# group `sglang.srt.plugins`, selected by SGLANG_PLUGINS (comma-separated names).
PLUGIN_NAME = "sparkit"
PLUGIN_ENTRY_POINT = "sparkit.engines.sglang.plugin:register"
PLUGINS_ENV = "SGLANG_PLUGINS"
ENABLE_ENV = "SPARKIT_SGLANG_PLUGIN"
FP8_ENV = "SPARKIT_FP8_LM_HEAD"
# Candidates per row the FP8 head re-scores exactly from the kept bf16 weight (recipe key
# stack.lm_head_exact_top_k; unset = sparkit.kernels.rescoring.DEFAULT_EXACT_TOP_K; 0 = off).
EXACT_TOP_K_ENV = "SPARKIT_FP8_LM_HEAD_EXACT_TOP_K"
SHARE_ENV = "SPARKIT_SHARE_LM_HEAD"
HUMMING_KEYWORDS_ENV = "SPARKIT_HUMMING_KEYWORDS"

LOAD_MODEL_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"
EAGLE_INIT_LM_HEAD_TARGET = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.init_lm_head"
MULTI_LAYER_INIT_LM_HEAD_TARGET = (
    "sglang.srt.speculative.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker.init_lm_head"
)

DSPARK_ATTACH_TARGET = "sglang.srt.models.dspark.DSparkDraftMixin.attach_shared_modules"

HUMMING_QUANTIZE_TARGET = "humming.utils.weight.quantize_weight"


@dataclass(frozen=True)
class KeywordRename:
    """A keyword a provider renamed: the old name a caller passes, the new one, and the new value
    for each old value (None: leave the new keyword out, i.e. its default)."""

    old: str
    new: str
    values: tuple[tuple[object, object], ...]
    since: str  # the provider release that renamed it

    def translate(self, value: object) -> object:
        for old_value, new_value in self.values:
            if bool(value) == bool(old_value):
                return new_value
        raise ValueError(f"{self.old}={value!r} has no {self.new} equivalent")


# What the plugin renames, per provider function (dotted path of its definition). humming 0.1.11's
# has_global_scale branches are 0.1.12's `weight_scale_2_type == "tensor"` ones, line for line
# (humming/utils/weight.py); False is the default, weight_scale_2_type=None ("none").
RENAMED_KEYWORDS: dict[str, tuple[KeywordRename, ...]] = {
    HUMMING_QUANTIZE_TARGET: (
        KeywordRename("has_global_scale", "weight_scale_2_type", ((True, "tensor"), (False, None)),
                      since="humming-kernels 0.1.12"),
    ),
}

logger = logging.getLogger("sparkit.sglang")

# What this process has seen: the target runner (one per TP-rank process) and the draft models.
_STATE: dict = {"target_runner": None, "drafts": [], "notes": []}


def enabled() -> bool:
    return truthy(os.environ.get(ENABLE_ENV))


def fp8_enabled() -> bool:
    return truthy(os.environ.get(FP8_ENV), default=True)


def sharing_enabled() -> bool:
    return truthy(os.environ.get(SHARE_ENV), default=True)


def exact_top_k() -> int:
    """The re-scoring depth from the environment; a bad value falls back to the default (logged)."""
    raw = os.environ.get(EXACT_TOP_K_ENV, "").strip()
    if not raw:
        return DEFAULT_EXACT_TOP_K
    try:
        value = int(raw)
        if value < 0:
            raise ValueError
    except ValueError:
        logger.warning("sparkit: %s=%r is not an integer >= 0; using %d", EXACT_TOP_K_ENV, raw, DEFAULT_EXACT_TOP_K)
        return DEFAULT_EXACT_TOP_K
    return value


def humming_keywords_enabled() -> bool:
    return truthy(os.environ.get(HUMMING_KEYWORDS_ENV))


def hook_targets() -> list[tuple[str, str]]:
    """(dotted path, hook type name) of every hook register() installs in this environment."""
    targets = [
        (LOAD_MODEL_TARGET, "AFTER"),
        (EAGLE_INIT_LM_HEAD_TARGET, "AFTER"),
        (MULTI_LAYER_INIT_LM_HEAD_TARGET, "AFTER"),
        (DSPARK_ATTACH_TARGET, "AFTER"),
    ]
    if humming_keywords_enabled():
        targets.append((HUMMING_QUANTIZE_TARGET, "AROUND"))
    return targets


def register() -> None:
    """Entry point. Registers hooks only when sparkit's launcher set SPARKIT_SGLANG_PLUGIN=1."""
    if not enabled():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    hooks = {
        LOAD_MODEL_TARGET: after_load_model,
        EAGLE_INIT_LM_HEAD_TARGET: after_init_lm_head,
        MULTI_LAYER_INIT_LM_HEAD_TARGET: after_init_lm_head,
        DSPARK_ATTACH_TARGET: after_attach_shared_modules,
        HUMMING_QUANTIZE_TARGET: around_quantize_weight,
    }
    for target, hook_type in hook_targets():
        HookRegistry.register(target, hooks[target], getattr(HookType, hook_type))


@functools.lru_cache(maxsize=16)
def _accepted_keywords(fn) -> frozenset[str] | None:
    """The keywords `fn` takes (through functools.wraps layers); None when it takes **kwargs."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def adapt_keywords(fn, target: str, kwargs: dict) -> tuple[dict, list[str]]:
    """The call's keywords with every RENAMED_KEYWORDS entry of `target` that `fn` no longer
    takes translated to its new name; and what changed, in words. A keyword `fn` still takes,
    or whose new name it does not take either, is left as is (the call then fails as it would)."""
    accepted = _accepted_keywords(fn)
    if accepted is None:
        return kwargs, []
    out, changes = dict(kwargs), []
    for rename in RENAMED_KEYWORDS.get(target, ()):
        if rename.old not in out or rename.old in accepted or rename.new not in accepted:
            continue
        value = out.pop(rename.old)
        new_value = rename.translate(value)
        if new_value is None or rename.new in out:
            changes.append(f"{rename.old}={value!r} left out, {rename.new} keeps its default "
                           f"({rename.since} renamed the keyword)")
        else:
            out[rename.new] = new_value
            changes.append(f"{rename.old}={value!r} passed as {rename.new}={new_value!r} "
                           f"({rename.since} renamed the keyword)")
    return out, changes


def around_quantize_weight(original, *args, **kwargs):
    """AROUND hook on humming.utils.weight.quantize_weight (sglang's online humming quantization)."""
    adapted, changes = adapt_keywords(original, HUMMING_QUANTIZE_TARGET, kwargs)
    for change in changes:
        note = f"humming quantize_weight: {change}; adapted by the sparkit plugin"
        if note not in _STATE["notes"]:  # once per kind of call, not once per expert
            _STATE["notes"].append(note)
            logger.info("sparkit: %s", note)
    return original(*args, **adapted)


def _runner_device(runner) -> str:
    device = getattr(runner, "device", None) or "unknown"
    gpu = getattr(runner, "gpu_id", None)
    return f"{device}:{gpu}" if device == "cuda" and gpu is not None else str(device)


def write_current_report() -> None:
    from sparkit.engines.sglang import report as rep

    runner = _STATE["target_runner"]
    if runner is None:
        return
    drafts = _STATE["drafts"]
    tp_rank, tp_size = rep.tp_rank_and_size(runner)
    built = rep.build_report(
        runner.model, drafts[0] if drafts else None, tp_rank=tp_rank, tp_size=tp_size,
        device=_runner_device(runner),
        speculative=rep.speculative_report(getattr(runner, "server_args", None)),
        runner_backend=rep.moe_runner_backend(), notes=_STATE["notes"], engine_env=rep.engine_switches(),
    )
    if len(drafts) > 1:  # multi-layer drafts: each step's model must share too
        unshared = [i for i, d in enumerate(drafts) if getattr(d, "lm_head", None) is not runner.model.lm_head]
        built.notes.append(f"{len(drafts)} draft step models; not sharing the target lm_head: {unshared or 'none'}")
    rep.write_report(built)


def after_load_model(result, runner, *args, **kwargs):
    """AFTER hook on ModelRunner.load_model: convert the target's lm_head, write the report."""
    try:
        model = getattr(runner, "model", None)
        if model is None:
            return None
        if getattr(runner, "is_draft_worker", False):
            _STATE["drafts"].append(model)
            return None
        _STATE["target_runner"] = runner
        _STATE["drafts"] = []
        head = getattr(model, "lm_head", None)
        if fp8_enabled() and head is not None and hasattr(head, "weight"):
            from sparkit.engines.sglang.fp8_lm_head import convert_lm_head_to_fp8
            from sparkit.engines.sglang.report import tp_rank_and_size

            info = convert_lm_head_to_fp8(head, exact_top_k=exact_top_k())
            rank, size = tp_rank_and_size(runner)
            line = (f"sparkit: Online FP8 quantization enabled for lm_head. ({info['format']}, "
                    f"tp rank {rank}/{size}, shard {info['rows']}x{info['hidden']}, {info['kernel']}, "
                    f"{info['exact']}, kernel config {info['tuning']}, "
                    f"was {info['replaced']})")
            logger.info(line)
            _STATE["notes"].append("Online FP8 quantization enabled for lm_head (sparkit plugin).")
        write_current_report()
    except Exception:
        # The engine must still start; the missing report / bf16 head is what the checks flag.
        logger.exception("sparkit: the FP8 lm_head conversion or the activation report failed")
    return None


def _draft_models(worker) -> list:
    runners = getattr(worker, "draft_runner_list", None)
    if runners:
        return [r.model for r in runners]
    runner = getattr(worker, "draft_runner", None)
    return [runner.model] if runner is not None else []


def after_init_lm_head(result, worker, *args, **kwargs):
    """AFTER hook on the draft workers' init_lm_head: share the target's lm_head module."""
    try:
        from sparkit.engines.sglang.fp8_lm_head import is_fp8_lm_head, share_lm_head_with_draft
        from sparkit.engines.sglang.report import tp_rank_and_size

        target_runner = worker.target_worker.model_runner
        target = target_runner.model
        drafts = _draft_models(worker)
        shared = []
        if is_fp8_lm_head(getattr(target, "lm_head", None)) and not sharing_enabled():
            rank, size = tp_rank_and_size(target_runner)
            logger.warning("sparkit: online FP8 lm_head enabled (tp rank %d/%d); %s=0: the draft keeps the "
                           "target's weight tensor only, as stock SGLang leaves it", rank, size, SHARE_ENV)
            _STATE["notes"].append(f"{SHARE_ENV}=0: the draft lm_head is not shared (stock SGLang behaviour).")
        elif is_fp8_lm_head(getattr(target, "lm_head", None)):
            shared = [share_lm_head_with_draft(target, d) for d in drafts]
            rank, size = tp_rank_and_size(target_runner)
            if drafts and all(shared):
                logger.info("sparkit: online FP8 lm_head enabled (e4m3, per-row scales, tp rank %d/%d); "
                            "draft shares the target lm_head module", rank, size)
            else:
                logger.warning("sparkit: online FP8 lm_head enabled (tp rank %d/%d) but the draft could "
                               "not share the target lm_head module", rank, size)
        _STATE["target_runner"] = target_runner
        _STATE["drafts"] = drafts
        write_current_report()
    except Exception:
        logger.exception("sparkit: sharing the lm_head with the draft failed")
    return None


def after_attach_shared_modules(result, draft, *args, **kwargs):
    """AFTER hook on DSparkDraftMixin.attach_shared_modules: the DSpark draft now holds the target's
    embedding and lm_head modules; write the report with it."""
    try:
        _STATE["drafts"] = [draft]
        write_current_report()
    except Exception:
        logger.exception("sparkit: the activation report of the DSpark draft failed")
    return None
