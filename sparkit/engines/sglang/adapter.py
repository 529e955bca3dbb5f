"""SGLang adapter: compile a recipe to an exact `sglang.launch_server` command and
check it against the *installed* sglang (its own argparse parser and its env registry).

Importing sglang's parser costs ~10 s (it pulls torch), so its answers are remembered per sglang
install (sparkit.engines.sglang.parser_facts) and it is imported only for a question the record
cannot answer, at most once per process.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

from sparkit.contract.checks import CheckResult, Status
from sparkit.contract.engine import EngineInfo, EngineLaunch
from sparkit.contract.plan import Provision
from sparkit.contract.reading import DTYPE_BYTES, ReadRules
from sparkit.contract.rules import Rule
from sparkit.engines.base import (
    flag_value, hub_model_path, local_model_provisions, package_version, packages_check,
)
from sparkit.engines.builtin_models import plan_builtin_model, prepare_builds
from sparkit.engines.sglang import compat
from sparkit.engines.sglang.log import SGLangLogAdapter
from sparkit.engines.sglang.parser_facts import OptionFact, ParserFacts, ParserRejected, load_facts
from sparkit.engines.sglang.plugin import (
    ENABLE_ENV, EXACT_TOP_K_ENV, FP8_ENV, HUMMING_KEYWORDS_ENV, PLUGIN_ENTRY_POINT, PLUGIN_NAME, PLUGINS_ENV,
    SHARE_ENV, truthy,
)
from sparkit.engines.sglang.rules import SGLANG_RULES

# The Ling patch's own FP8 head switch (in the registry of a patched sglang, absent from 0.5.23).
FP8_LM_HEAD_ENV = "SGLANG_ENABLE_FP8_LM_HEAD"
SECRETS_FILE = "secrets.yaml"

# Resolved-args names sparkit sets from recipe keys: a pass-through flag with the same
# destination would fight the recipe, so it is an error naming the key to use instead.
MANAGED_DESTS = {
    "model_path": "model.path",
    "served_model_name": "model.served_name",
    "trust_remote_code": "model.trust_remote_code",
    "context_length": "model.context_length",
    "dtype": "model.dtype",
    "json_model_override_args": "model.overrides",
    "quantization": "stack.quantization",
    "moe_runner_backend": "stack.moe_backend",
    "enable_fp32_lm_head": "stack.lm_head",
    "speculative_algorithm": "stack.speculative.method",
    "speculative_num_steps": "stack.speculative.num_steps",
    "speculative_eagle_topk": "stack.speculative.eagle_topk",
    "speculative_num_draft_tokens": "stack.speculative.num_draft_tokens",
    "speculative_draft_model_path": "stack.speculative.draft_model",
    "revision": "model.path",
    "speculative_draft_model_revision": "stack.speculative.draft_model",
    "attention_backend": "stack.attention_backend",
    "tp_size": "stack.tp",
    "ep_size": "stack.ep",
    "host": "server.host",
    "port": "server.port",
    "api_key": "server.api_key_env",
    "mem_fraction_static": "server.mem_fraction_static",
    "max_running_requests": "server.max_running_requests",
    "cuda_graph_max_bs_decode": "server.cuda_graph.max_bs_decode",
    "cuda_graph_max_bs_prefill": "server.cuda_graph.max_bs_prefill",
    "enable_metrics": "server.enable_metrics",
}


# How to get the validation on a machine without a GPU (sglang-facts.md §1).
PARSER_INSTALL_HINT = ("pip install --no-deps sglang==0.5.23 plus its parser's pure-Python imports "
                       "(torch numpy orjson psutil pybase64 requests packaging pillow starlette msgspec "
                       "pydantic pyzmq tqdm IPython aiohttp triton), or plan on the machine that serves")
# A plan's own port is any free one (tune and verify pick a new one each time); the parser's
# verdict does not depend on which (an int), so the verdicts are remembered for this one.
_PORT_FOR_VERDICTS = "30000"


@functools.cache
def parser_facts() -> ParserFacts:
    """The installed sglang's parser (sparkit.engines.sglang.parser_facts: remembered per install)."""
    return load_facts()


def parser_unavailable() -> str | None:
    """None when sglang's own argument parser answers here, else why not (one line)."""
    return parser_facts().unavailable


def server_arg_parser():
    """sglang's own server-args parser (imports sglang), raising ParserRejected instead of exiting."""
    return parser_facts().real_parser()


def env_registry() -> frozenset[str]:
    """Names of the environment variables the installed sglang reads (sglang.srt.environ.envs)."""
    return parser_facts().env


@functools.cache
def installed_version() -> str | None:
    return package_version("sglang")


def check_args(args: list[str]) -> None:
    """Raise ParserRejected (sglang's own message) when its parser refuses `args`."""
    parser_facts().check(args)


def choices_for(dest: str) -> list[str] | None:
    return parser_facts().choices.get(dest)


def _action_for(flag: str) -> OptionFact | None:
    return parser_facts().exact_option(flag)


def _moe_backend_rule(loaded):
    if loaded.recipe.stack.moe_backend == "embedded-torch":
        return [("error", "stack.moe_backend", "moe_backend 'embedded-torch' exists only on engine: embedded")]
    return []


RULES = [
    Rule("sglang-moe-backend", "embedded-torch is the embedded engine's PyTorch MoE; sglang runs its own kernels",
         "use stack.moe_backend: auto (or one of sglang's --moe-runner-backend choices) with engine: sglang",
         _moe_backend_rule),
]


class SGLangAdapter(SGLangLogAdapter):
    name = "sglang"
    needs_gpu = True
    packages = ("sglang",)
    install_hint = "pip install sglang"
    validation_hint = PARSER_INSTALL_HINT
    memory_model = "mem_fraction_static"  # a static pool sized at start (sparkit.memory.fit)
    # The target verifies num_draft_tokens positions in one forward, whose kernels round differently
    # from one-token decode: NEXTN vs plain greedy on the H200 gave 4/8 byte-identical 256-token
    # outputs, 85.9% prefix agreement (benchmarks/results/h200-sglang-session.md).
    exact_speculative = False
    secret_files = (SECRETS_FILE,)
    key_env = ()  # its key comes by --api-key, which sparkit hands it in a private --config file

    def probe(self) -> EngineInfo:
        import importlib.util

        version = installed_version()
        importable = importlib.util.find_spec("sglang") is not None
        extras = {pkg: package_version(pkg) for pkg in ("humming-kernels", "flashinfer-python", "sgl-kernel", "torch")}
        detail = "" if importable else "pip install sglang (GPU machine) to serve real models"
        return EngineInfo("sglang", importable, version, detail, extras)

    def rules(self) -> list[Rule]:
        return SGLANG_RULES + RULES

    def read_rules(self, recipe, layout, device: str):
        """How SGLang reads a checkpoint's bytes per step (sparkit.roofline): weights in their
        stored dtypes, the router and KV cache and linear-attention state as its flags set them."""
        stack = recipe.stack
        args = list(recipe.server.extra_args)
        kv = 1 if (flag_value(args, "--kv-cache-dtype") or "auto").startswith("fp8") else 2
        state = DTYPE_BYTES.get(flag_value(args, "--mamba-ssm-dtype") or "float32", 4)
        router_dtype = layout.config.get("router_dtype")
        router = 2 if router_dtype in ("bf16", "bfloat16") else 4
        online = (stack.quantization or "") == "fp8"
        explained = ["SGLang: weights read in their stored dtypes"
                     + (" (linear weights quantised online to FP8: 1 byte each)" if online else ""),
                     f"router read in {'bf16' if router == 2 else 'fp32'} (router_dtype "
                     f"{router_dtype or 'unset: fp32'}); KV cache {'fp8' if kv == 1 else 'bf16'}"]
        if stack.lm_head == "fp32":
            explained.append("fp32 lm_head: SGLang 0.5.23 multiplies the bf16 weight with fp32 output (bf16 bytes)")
        return ReadRules("sglang", device, None, online, stack.lm_head, stack.lm_head_exact_top_k, router, kv, state,
                         2, max(stack.tp, 1), explained)

    def preflight(self, plan) -> list:
        """sglang importable, then every package pair the recipe needs, judged from the installed
        code (sparkit.engines.sglang.compat; sgl_kernel imported in a child process)."""
        result = packages_check(self)
        if result.status is not Status.PASS:
            return [result]
        judgement = compat.judge(plan.recipe, probe=True)
        return [result] + [compat_check(f, plan.env) for f in judgement.findings]

    def compatibility(self, recipes: list[tuple[str, dict]], probe: bool = True) -> dict:
        """Every package pair SGLang recipes can need, judged on the installed code, and for each
        recipe whether the installed stack can run it (the pairs it needs that fail, the fixes the
        plugin applies)."""
        judgement = compat.judge(None, probe=probe)
        by_need = {f.need: f for f in judgement.findings}
        verdicts = []
        for name, recipe in recipes:
            findings = [by_need[n.name] for n in compat.needs_for(recipe) if n.name in by_need]
            failed = [f.pair for f in findings if f.status == compat.FAIL]
            verdicts.append({"recipe": name, "runs": not failed, "failed": failed,
                             "plugin": [f.pair for f in findings if f.status == compat.PLUGIN],
                             "warnings": [f.pair + ": " + f.detail for f in findings if f.status == compat.WARN]})
        return {**judgement.to_dict(), "recipes": verdicts}

    def prepare(self, plan, progress) -> None:
        prepare_builds(plan.model_builds, progress)

    def deliver_secret(self, secret: str, run_dir: Path) -> tuple[dict[str, str], list[str]]:
        """SGLang reads no environment variable for its key: a 0600 YAML file passed with --config
        (SGLang merges it into its arguments; the run removes it once the server is up)."""
        path = run_dir / SECRETS_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(f"api-key: {json.dumps(secret)}\n")
        return {}, ["--config", str(path)]

    def launch(self, loaded, *, port: int) -> EngineLaunch:
        try:
            return self._launch(loaded, port=port)
        finally:
            parser_facts().save()  # what sglang's parser answered is kept, for the next plan

    def _launch(self, loaded, *, port: int) -> EngineLaunch:
        r = loaded.recipe
        stack, server, spec = r.stack, r.server, r.stack.speculative
        warnings: list[str] = []
        unavailable = parser_unavailable()
        if unavailable is None:
            self._check_choices(loaded)

        # sparkit's built-in tiny-ling reaches SGLang as its Hugging Face BailingMoeV2 export, whose
        # configuration class travels with it (hence --trust-remote-code).
        builds: list[dict[str, Any]] = []
        # A hub model is loaded from its local snapshot (`sparkit pull`): SGLang never downloads
        # inside a launch. One that is not here keeps its id (and --revision) for the plan to show;
        # the launch is refused until it is pulled.
        pulls: list[dict[str, Any]] = []
        model_path, model_revision = (
            (plan_builtin_model(loaded, "model.path", r.model.path, builds, export_dtype="bfloat16"), None)
            if r.model.path.startswith("sparkit:") else hub_model_path("model.path", "target", r.model.path, pulls))
        draft_path, draft_revision = spec.draft_model, None
        if draft_path:
            draft_path, draft_revision = (
                (plan_builtin_model(loaded, "stack.speculative.draft_model", draft_path, builds, export_dtype="bfloat16"), None)
                if draft_path.startswith("sparkit:") else
                hub_model_path("stack.speculative.draft_model", "draft", draft_path, pulls))
        args: list[str] = ["--model-path", model_path]
        if model_revision:
            args += ["--revision", model_revision]
        served_name = r.model.served_name
        if served_name is None and any(p["role"] == "target" and p["local"] for p in pulls):
            served_name = next(p["repo"] for p in pulls if p["role"] == "target")  # its name, had SGLang downloaded it
        if served_name:
            args += ["--served-model-name", served_name]
        if r.model.trust_remote_code or builds:
            args.append("--trust-remote-code")
        if r.model.context_length:
            args += ["--context-length", str(r.model.context_length)]
        if r.model.dtype != "auto":
            args += ["--dtype", r.model.dtype]
        if r.model.overrides:
            args += ["--json-model-override-args", json.dumps(r.model.overrides, separators=(",", ":"))]
        if stack.quantization:
            args += ["--quantization", stack.quantization]
        if stack.moe_backend != "auto":
            args += ["--moe-runner-backend", stack.moe_backend]
        if stack.lm_head == "fp32":
            args.append("--enable-fp32-lm-head")
        if spec.method == "nextn":
            args += ["--speculative-algorithm", "NEXTN"]
            if spec.num_steps is not None:
                args += ["--speculative-num-steps", str(spec.num_steps), "--speculative-eagle-topk", str(spec.eagle_topk),
                         "--speculative-num-draft-tokens", str(spec.num_draft_tokens)]
            if draft_path:
                args += ["--speculative-draft-model-path", draft_path]
        elif spec.method == "dspark":
            args += ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", draft_path]
        if draft_path and draft_revision:
            args += ["--speculative-draft-model-revision", draft_revision]
        if stack.attention_backend:
            args += ["--attention-backend", stack.attention_backend]
        if stack.tp != 1:
            args += ["--tp-size", str(stack.tp)]
        if stack.ep != 1:
            args += ["--ep-size", str(stack.ep)]
        if server.mem_fraction_static is not None:
            args += ["--mem-fraction-static", str(server.mem_fraction_static)]
        if server.max_running_requests is not None:
            args += ["--max-running-requests", str(server.max_running_requests)]
        if not server.cuda_graph.enabled:
            args += ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
        elif not server.cuda_graph.prefill:
            args.append("--disable-prefill-cuda-graph")
        if server.cuda_graph.max_bs_decode:
            args += ["--cuda-graph-max-bs-decode", str(server.cuda_graph.max_bs_decode)]
        if server.cuda_graph.max_bs_prefill:
            args += ["--cuda-graph-max-bs-prefill", str(server.cuda_graph.max_bs_prefill)]
        if server.enable_metrics:
            args.append("--enable-metrics")
        args += ["--host", server.host, "--port", str(port)]

        if unavailable is None:
            warnings += self._check_passthrough(loaded)
        else:
            self._check_passthrough_without_parser(loaded)
        args += list(server.extra_args)
        if unavailable is None:
            try:
                check_args(_with_port(args, _PORT_FOR_VERDICTS))
            except ParserRejected as exc:  # a recipe value sglang refuses that no rule above caught
                raise loaded.error("stack", f"sglang {installed_version()} rejects the compiled command: {exc}") from None

        if unavailable is None:
            warnings += self._check_env(loaded)
        if (spec.method == "nextn" and stack.lm_head == "fp8" and SHARE_ENV in server.env
                and not truthy(server.env[SHARE_ENV], default=True)):
            warnings.append(f"server.env.{SHARE_ENV}={server.env[SHARE_ENV]} leaves the NEXTN draft with the target's FP8 head "
                            "*tensor* only (stock sglang 0.5.23): the shared-head trap; the draft_lm_head and "
                            "acceptance checks are expected to fail")
        registry = env_registry() if unavailable is None else frozenset()
        provisions, head_env = self._provisions(loaded, registry)
        fix_provisions, fix_env = self._plugin_fixes(loaded, head_env)
        provisions += fix_provisions
        if HUMMING_KEYWORDS_ENV in fix_env and HUMMING_KEYWORDS_ENV in server.env:
            # the recipe's own value wins (to reproduce the failure, say); the preflight then names the pair
            fix_env.pop(HUMMING_KEYWORDS_ENV)
            if not truthy(server.env[HUMMING_KEYWORDS_ENV]):
                warnings.append(f"server.env.{HUMMING_KEYWORDS_ENV}={server.env[HUMMING_KEYWORDS_ENV]} turns off the "
                                "plugin's fix for the keyword sglang passes and the installed humming renamed: the "
                                "preflight fails on that pair")
        env = {**server.env, **head_env, **fix_env}
        provisions += local_model_provisions(pulls, env)

        expectations: dict[str, Any] = {}
        if stack.lm_head == "fp8" and FP8_LM_HEAD_ENV in head_env:
            # SGLang's own FP8 head (the Ling patch) keeps no bf16 copy and writes no report.
            expectations["lm_head_exact_top_k"] = None
            if stack.lm_head_exact_top_k:
                warnings.append(f"stack.lm_head_exact_top_k: {stack.lm_head_exact_top_k} is not applied: this sglang's "
                                f"own FP8 lm_head ({FP8_LM_HEAD_ENV}) has no exact re-scoring, so near-ties may "
                                "pick a different token than the bf16 head")
        reported = {"nextn": "EAGLE", "dspark": "DSPARK"}.get(spec.method)
        expectations["speculative_algorithm_reported"] = reported
        sa: dict[str, Any] = {"tp_size": stack.tp, "ep_size": stack.ep,
                              "enable_fp32_lm_head": stack.lm_head == "fp32"}
        if stack.moe_backend != "auto":
            sa["moe_runner_backend"] = stack.moe_backend
        if spec.enabled:
            sa["speculative_algorithm"] = reported
            for k in ("num_steps", "eagle_topk", "num_draft_tokens"):
                if getattr(spec, k) is not None:
                    sa[f"speculative_{k}"] = getattr(spec, k)
            if draft_path:
                sa["speculative_draft_model_path"] = draft_path
                expectations["draft_model"] = draft_path
        if stack.attention_backend:
            sa["attention_backend"] = stack.attention_backend
        if server.mem_fraction_static is not None:
            sa["mem_fraction_static"] = server.mem_fraction_static
        if served_name:
            sa["served_model_name"] = served_name
        expectations["server_args"] = sa

        launch = EngineLaunch(
            argv=[sys.executable, "-m", "sglang.launch_server", *args], env=env,
            served_model_name=served_name or model_path, provisions=provisions, warnings=warnings,
            expectations=expectations, model_builds=builds, model_pulls=pulls,
        )
        if unavailable is None:
            launch.validated_by = f"sglang {installed_version()}'s own argument parser and environment registry"
            if parser_facts().answered_from_record:
                launch.validated_by += " (answers remembered from an earlier run, per sglang install)"
        else:
            launch.validation_note = (f"not validated by SGLang's own argument parser: it does not import here "
                                      f"({unavailable}); the flags and environment variables are unchecked "
                                      f"against the engine version that will run them, and the FP8 lm_head is "
                                      f"planned through sparkit's plugin as for stock sglang 0.5.23")
        return launch

    def _plugin_fixes(self, loaded, head_env: dict[str, str]) -> tuple[list[Provision], dict[str, str]]:
        """What sparkit's plugin adapts for this recipe on the installed stack: the pairs on whose
        path it renames keywords (compat.PLUGIN_ADAPTED), judged from the installed source
        (sparkit.engines.sglang.compat). Where this machine cannot tell (the
        provider is not installed here), the adapter is enabled too: it renames only a keyword
        the function it wraps does not take, so it is a no-op where none was renamed."""
        needs = [n for n in compat.needs_for(loaded.recipe.model_dump(mode="json")) if n.name in compat.PLUGIN_ADAPTED]
        if not needs:
            return [], {}
        out, env = [], {}
        for finding in compat.judge(needs=needs).findings:
            if finding.status == compat.PLUGIN:
                env.update(finding.plugin_env)
                out.append(Provision("humming_keywords=adapted", "sparkit-plugin",
                                     f"{finding.pair}: {finding.detail} ({HUMMING_KEYWORDS_ENV}=1)"))
            elif finding.status != compat.OK:
                env.update({ENABLE_ENV: "1", HUMMING_KEYWORDS_ENV: "1"})
                out.append(Provision("humming_keywords=adapted", "sparkit-plugin",
                                     f"{finding.pair}: cannot be judged here ({finding.detail}); the adapter is "
                                     f"enabled in case ({HUMMING_KEYWORDS_ENV}=1: a no-op where humming takes "
                                     "sglang's keywords)"))
        if env.get(ENABLE_ENV) == "1":
            plugins = [p for p in loaded.recipe.server.env.get(PLUGINS_ENV, "").split(",") if p]
            env[PLUGINS_ENV] = ",".join(plugins + ([PLUGIN_NAME] if PLUGIN_NAME not in plugins else []))
            if ENABLE_ENV not in head_env:  # the plugin only for this fix: it leaves the lm_head as loaded
                env[FP8_ENV] = "0"
        return out, env

    # ------------------------------------------------------------ feature detection

    def _check_choices(self, loaded) -> None:
        r = loaded.recipe
        for key, dest, value in (
            ("stack.moe_backend", "moe_runner_backend", r.stack.moe_backend),
            ("stack.attention_backend", "attention_backend", r.stack.attention_backend),
            ("stack.quantization", "quantization", r.stack.quantization),
        ):
            if value is None:
                continue
            allowed = choices_for(dest)
            if allowed is not None and value not in allowed:
                raise loaded.error(key, f"{value!r} is not one of {', '.join(allowed)} (sglang {installed_version()})")

    def _check_passthrough(self, loaded) -> list[str]:
        """Each pass-through flag must exist in the installed sglang and not fight a recipe key."""
        extra = list(loaded.recipe.server.extra_args)
        warnings = []
        is_value = False  # the item after a flag that takes one is its value (it may start with '-')
        for i, item in enumerate(extra):
            if is_value or not item.startswith("-"):
                is_value = False
                continue
            is_value = _takes_value(item)
            key = f"server.extra_args.{i}"
            try:
                check_args(["--model-path", "x", *(extra[i:i + 2] if _takes_value(item) else [item])])
            except ParserRejected as exc:
                raise loaded.error(key, f"sglang {installed_version()} rejects {item!r}: {exc}",
                                   hint="flags change between sglang versions: check `python -m sglang.launch_server --help`") from None
            action = _action_for(item)
            if action is None:  # argparse accepted an abbreviation; name the real flag
                action = _abbreviated(item)
            if action is None:
                continue
            if action.dest in MANAGED_DESTS and not (action.dest == "enable_fp32_lm_head" and loaded.recipe.stack.lm_head == "fp8"):
                raise loaded.error(key, f"{item.split('=')[0]} is set from the recipe key {MANAGED_DESTS[action.dest]}",
                                   hint=f"set {MANAGED_DESTS[action.dest]} instead of passing the flag")
            if action.deprecated:
                new = action.new_flag or "see sglang --help"
                warnings.append(f"{key}: {item} is deprecated in sglang {installed_version()} (use {new})")
        try:
            check_args(["--model-path", "x", *extra])
        except ParserRejected as exc:
            raise loaded.error("server.extra_args", f"sglang {installed_version()} rejects the pass-through flags: {exc}") from None
        return warnings

    def _check_passthrough_without_parser(self, loaded) -> None:
        """Without sglang's parser only the flags sparkit sets from recipe keys can be recognised
        (by their spelled-out names)."""
        flags = {"--" + dest.replace("_", "-"): key for dest, key in MANAGED_DESTS.items()}
        for i, item in enumerate(loaded.recipe.server.extra_args):
            name = item.split("=", 1)[0]
            if name in flags and not (name == "--enable-fp32-lm-head" and loaded.recipe.stack.lm_head == "fp8"):
                raise loaded.error(f"server.extra_args.{i}", f"{name} is set from the recipe key {flags[name]}",
                                   hint=f"set {flags[name]} instead of passing the flag")

    def _check_env(self, loaded) -> list[str]:
        known = env_registry()
        out = []
        for name in loaded.recipe.server.env:
            if name.startswith("SGLANG_") and name not in known:
                out.append(f"server.env.{name}: the installed sglang {installed_version()} ignores {name} "
                           "(not in sglang.srt.environ.envs); it is passed but has no effect")
        return out

    def _provisions(self, loaded, registry: frozenset[str]) -> tuple[list[Provision], dict[str, str]]:
        """Which path provides each optimisation, and the environment that selects an FP8 head's
        path (this sglang's own variable when its registry has it, else sparkit's plugin)."""
        r = loaded.recipe
        stack, spec = r.stack, r.stack.speculative
        env: dict[str, str] = {}
        out = [Provision(f"weights={stack.weights}", "checkpoint", r.model.path)]
        if stack.moe_backend == "auto":
            out.append(Provision("moe_backend=auto", "sglang-default",
                                 "sglang picks (flashinfer_mxfp4 for Ling V3 FP8/MXFP4 on SM90/100/120)"))
        else:
            out.append(Provision(f"moe_backend={stack.moe_backend}", "sglang-flag", f"--moe-runner-backend {stack.moe_backend}"))
        if stack.lm_head == "fp32":
            out.append(Provision("lm_head=fp32", "sglang-flag", "--enable-fp32-lm-head"))
        elif stack.lm_head == "bf16":
            out.append(Provision("lm_head=bf16", "checkpoint", "the checkpoint's lm_head as is"))
        else:
            if FP8_LM_HEAD_ENV in registry:
                env[FP8_LM_HEAD_ENV] = "1"
                out.append(Provision("lm_head=fp8", "sglang-env", f"{FP8_LM_HEAD_ENV}=1 (in this sglang's registry)"))
                provider, detail = "sglang-env", "the patched sglang shares the quantised module (set_lm_head_from_target)"
            else:
                env[ENABLE_ENV] = "1"
                env[EXACT_TOP_K_ENV] = str(stack.lm_head_exact_top_k)
                plugins = [p for p in r.server.env.get(PLUGINS_ENV, "").split(",") if p]
                env[PLUGINS_ENV] = ",".join(plugins + ([PLUGIN_NAME] if PLUGIN_NAME not in plugins else []))
                out.append(Provision("lm_head=fp8", "sparkit-plugin",
                                     f"{PLUGIN_ENTRY_POINT} (sglang {installed_version() or '0.5.23, assumed'} has no {FP8_LM_HEAD_ENV})"))
                out.append(Provision(f"lm_head_exact_top_k={stack.lm_head_exact_top_k}", "sparkit-plugin",
                                     f"{EXACT_TOP_K_ENV}={stack.lm_head_exact_top_k}"))
                provider, detail = "sparkit-plugin", f"{PLUGIN_ENTRY_POINT} gives the NextN draft the target's FP8 lm_head module"
            if spec.method == "nextn":
                out.append(Provision("draft_lm_head=shared", provider, detail))
        if spec.method == "nextn":
            out.append(Provision("speculative=nextn", "sglang-flag",
                                 "--speculative-algorithm NEXTN (an alias of EAGLE; /server_info reports EAGLE)"))
        elif spec.method == "dspark":
            out.append(Provision("speculative=dspark", "sglang-flag", f"--speculative-algorithm DSPARK, draft {spec.draft_model}"))
        return out, env


def compat_check(finding, plan_env: dict[str, str] | None = None):
    """A compatibility finding as a preflight check: its title names the pair. A plugin fix is a
    pass when the plan enables it, a failure when the plan does not (a plan made elsewhere)."""
    status = {compat.OK: Status.PASS, compat.PLUGIN: Status.PASS, compat.WARN: Status.WARN,
              compat.FAIL: Status.FAIL, compat.UNKNOWN: Status.SKIP}[finding.status]
    detail, fix = finding.detail, finding.fix
    if finding.status == compat.PLUGIN:
        missing = {k: v for k, v in finding.plugin_env.items() if (plan_env or {}).get(k) != v}
        if missing:
            status = Status.FAIL
            detail += "; but this plan does not enable the fix"
            fix = "re-plan on this machine (`sparkit up` compiles the plan here), or set " + " ".join(
                f"server.env.{k}={v}" for k, v in missing.items())
        else:
            detail += " (enabled by this plan)"
    return CheckResult(f"compat:{finding.need}", finding.pair, status, f"{finding.feature}: {detail}",
                       evidence=list(finding.evidence), fix=fix if status is not Status.PASS else None,
                       cause=None if status is Status.PASS else "the installed packages disagree on this path",
                       data=finding.to_dict())


def _takes_value(flag: str) -> bool:
    if "=" in flag:
        return False
    action = parser_facts().option(flag)
    return action is not None and action.takes_value


def _abbreviated(flag: str) -> OptionFact | None:
    """The option an abbreviation names (argparse accepts a unique prefix), or None."""
    return parser_facts().option(flag)


def _with_port(args: list[str], port: str) -> list[str]:
    out = list(args)
    for i, item in enumerate(out[:-1]):
        if item == "--port":
            out[i + 1] = port
    return out
