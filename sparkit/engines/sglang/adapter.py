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
from sparkit.contract.environment import (
    CUDA_ENV,
    HUGGING_FACE_ENV,
    NCCL_ENV,
    SPARKIT_ENV,
    TORCH_ENV,
    TRITON_ENV,
    EngineEnvironment,
    EnvFamily,
)
from sparkit.contract.flag_table import ALIASES, DEFAULT_PORT, command_line, flag_provisions, passed, recipe_value
from sparkit.contract.plan import Provision
from sparkit.contract.reading import DTYPE_BYTES, ReadRules
from sparkit.contract.rules import Rule
from sparkit.engines.base import (
    flag_value,
    hub_model_path,
    local_model_provisions,
    package_version,
    packages_check,
)
from sparkit.engines.builtin_models import draft_block_size, parse_builtin, plan_builtin_model, prepare_builds
from sparkit.engines.sglang import compat
from sparkit.engines.sglang.flags import FP8_LM_HEAD_ENV, MANAGED_DESTS, MANAGED_FLAGS, SETTINGS, Planned, server_args
from sparkit.engines.sglang.log import SGLangLogAdapter
from sparkit.engines.sglang.parser_facts import OptionFact, ParserFacts, ParserRejected, load_facts
from sparkit.engines.sglang.plugin import (
    ENABLE_ENV,
    EXACT_TOP_K_ENV,
    FP8_ENV,
    HUMMING_KEYWORDS_ENV,
    PLUGIN_ENTRY_POINT,
    PLUGIN_NAME,
    PLUGINS_ENV,
    SHARE_ENV,
)
from sparkit.engines.sglang.report import SWITCH_PREFIX
from sparkit.engines.sglang.rules import SGLANG_RULES
from sparkit.env_switch import truthy
from sparkit.models.formats import ARCHITECTURES

SECRETS_FILE = "secrets.yaml"

# The names sglang 0.5.23's registry (sglang.srt.environ.envs) holds beside its SGLANG_* ones: its
# allowlist where sglang does not import (tests/recipes/test_engine_environment.py keeps it equal to
# the installed registry's).
REGISTRY_OTHER_NAMES = frozenset({
    "ASCEND_NPU_PHY_ID", "DEEP_NORMAL_MODE_USE_INT8_QUANT", "DISABLE_OPENAPI_DOC", "ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE",
    "EXA_API_KEY", "FLASHINFER_NVFP4_4OVER6", "FLASHINFER_NVFP4_4OVER6_E4M3_USE_256", "HF_HUB_DISABLE_XET", "IS_H200",
    "MOONCAKE_CHECK_SERVER", "MOONCAKE_CLIENT", "MOONCAKE_DEVICE", "MOONCAKE_ENABLE_SSD_OFFLOAD",
    "MOONCAKE_GLOBAL_SEGMENT_SIZE", "MOONCAKE_LOCAL_HOSTNAME", "MOONCAKE_MASTER", "MOONCAKE_MASTER_METRICS_PORT",
    "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "MOONCAKE_PROTOCOL", "MOONCAKE_STANDALONE_STORAGE", "MOONCAKE_TENANT_ID",
    "MOONCAKE_TE_META_DATA_SERVER", "USE_ROCM_AITER_ROPE_BACKEND", "USE_TRITON_W8A8_FP8_KERNEL",
})
# Settings of SGLang's registry through which it imports code.
SGLANG_CODE_ENV = {
    "SGLANG_HTTP_SERVER_APP_PATH": "SGLang imports this module:attribute as its HTTP app",
    "SGLANG_EXTERNAL_MODEL_PACKAGE": "SGLang imports this package's model classes",
    "SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE": "SGLang imports this package's multimodal processors",
    "SGLANG_TEST_SCRIPTED_RUNTIME_SYS_PATH_ENTRY": "SGLang's scripted test runtime imports from this directory",
}
# The kernel libraries SGLang runs beside torch's.
FLASHINFER_ENV = EnvFamily("FlashInfer", ("FLASHINFER_",))
HUMMING_ENV = EnvFamily("Humming", ("HUMMING_",))



def _environment(registry: frozenset[str], source: str) -> EngineEnvironment:
    sglang = EnvFamily("SGLang", ("SGLANG_",), frozenset(registry))
    families = (sglang, TORCH_ENV, CUDA_ENV, NCCL_ENV, TRITON_ENV, FLASHINFER_ENV, HUMMING_ENV, HUGGING_FACE_ENV,
                SPARKIT_ENV)
    return EngineEnvironment(families, code=SGLANG_CODE_ENV, source=source)


# The table's rows whose recipe values are checked against the installed parser's choices, in order.
CHOICE_ROWS = tuple(next(row for row in SETTINGS if row.dest == dest)
                    for dest in ("moe_runner_backend", "attention_backend", "quantization", "kv_cache_dtype",
                                 "tool_call_parser"))
# How to get the validation on a machine without a GPU (docs/sglang-facts.md §1).
PARSER_INSTALL_HINT = ("pip install --no-deps sglang==0.5.23 plus its parser's pure-Python imports "
                       "(torch numpy orjson psutil pybase64 requests packaging pillow starlette msgspec "
                       "pydantic pyzmq tqdm IPython aiohttp triton), or plan on the machine that serves")
# A plan's own port is any free one (tune and verify pick a new one each time); the parser's
# verdict does not depend on which (an int), so the verdicts are remembered for this one.
_PORT_FOR_VERDICTS = str(DEFAULT_PORT)


@functools.cache
def parser_facts() -> ParserFacts:
    """The installed sglang's parser (sparkit.engines.sglang.parser_facts: remembered per install)."""
    return load_facts()


def parser_unavailable() -> str | None:
    """None when sglang's own argument parser answers here, else why not (one line)."""
    return parser_facts().unavailable


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
    settings = SETTINGS
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

    def environment(self) -> EngineEnvironment:
        """SGLang's settings (`SGLANG_*` and the other names of its registry: the installed one's,
        else 0.5.23's as sparkit knows them), and those of the libraries it runs."""
        if parser_unavailable() is not None:
            return self.static_environment()
        registry = env_registry()
        return _environment(registry, f"sglang {installed_version()}'s registry (sglang.srt.environ.envs, "
                                      f"{len(registry)} names)")

    @staticmethod
    def static_environment() -> EngineEnvironment:
        """The allowlist where sglang does not import: 0.5.23's registry as sparkit knows it."""
        return _environment(REGISTRY_OTHER_NAMES, "sglang 0.5.23's registry as sparkit knows it (sglang does not "
                                                  "import here)")

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
        """The table's command line (sparkit.engines.sglang.flags) for what the recipe resolves to,
        checked by the installed sglang's parser; the environment and provisions that select each
        optimisation's path; what the live server must then report."""
        unavailable = parser_unavailable()
        if unavailable is None:
            self._check_choices(loaded)
        planned = self._planned(loaded, port)
        args = command_line(SETTINGS, planned)
        warnings = self._checked(loaded, unavailable)
        args += list(loaded.recipe.server.extra_args)
        if unavailable is None:
            try:
                check_args(_with_port(args, _PORT_FOR_VERDICTS))
            except ParserRejected as exc:  # a recipe value sglang refuses that no rule above caught
                raise loaded.error("stack", f"sglang {installed_version()} rejects the compiled command: {exc}") from None
            warnings += self._check_env(loaded)
        warnings += self._switch_warnings(loaded)
        warnings += self._dspark_warnings(loaded, planned)
        env, provisions, head_env = self._environment(loaded, planned, unavailable, warnings)
        launch = EngineLaunch(
            argv=[sys.executable, "-m", "sglang.launch_server", *args], env=env,
            served_model_name=planned.served_name or planned.model_path, provisions=provisions, warnings=warnings,
            expectations=self._expectations(loaded, planned, head_env, warnings), model_builds=planned.builds,
            model_pulls=planned.pulls,
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

    def _planned(self, loaded, port: int) -> Planned:
        """Where the target and the draft are read from, and the name served. A built-in model is
        its Hugging Face export (built before the launch); a hub model its local snapshot (`sparkit
        pull`): SGLang never downloads inside a launch. One that is not here keeps its id (and
        --revision) for the plan to show; the launch is refused until it is pulled."""
        r = loaded.recipe
        planned = Planned(r, port, model_path="")
        planned.model_path, planned.model_revision = (
            (plan_builtin_model(loaded, "model.path", r.model.path, planned.builds, export_dtype="bfloat16"), None)
            if r.model.path.startswith("sparkit:") else hub_model_path("model.path", "target", r.model.path, planned.pulls))
        draft = r.stack.speculative.draft_model
        if draft:
            key = "stack.speculative.draft_model"
            planned.draft_path, planned.draft_revision = (
                (plan_builtin_model(loaded, key, draft, planned.builds, export_dtype="bfloat16"), None)
                if draft.startswith("sparkit:") else hub_model_path(key, "draft", draft, planned.pulls))
        if r.stack.speculative.method == "dspark":
            self._plan_dspark(loaded, planned)
        planned.served_name = r.model.served_name
        if planned.served_name is None and any(p["role"] == "target" and p["local"] for p in planned.pulls):
            # its name, had SGLang downloaded it
            planned.served_name = next(p["repo"] for p in planned.pulls if p["role"] == "target")
        return planned

    def _plan_dspark(self, loaded, planned: Planned) -> None:
        """A DSpark launch: the draft's block size (its config.json, where it is here) and the
        attention backends the installed kernels run for the target and the draft, unless the
        recipe passes --speculative-draft-attention-backend itself."""
        r = loaded.recipe
        planned.draft_block_size = draft_block_size(r.stack.speculative.draft_model, planned.draft_path)
        if flag_value(list(r.server.extra_args), "--speculative-draft-attention-backend") is not None:
            return
        pick = compat.dspark_attention_backends(recipe_backend=r.stack.attention_backend)
        planned.attention_backend, planned.draft_attention_backend = pick.target, pick.draft
        planned.attention_note = pick.reason

    def _dspark_warnings(self, loaded, planned: Planned) -> list[str]:
        """A DSpark target SGLang cannot take hidden states from: its DSpark worker needs the target
        class to define set_dspark_layers_to_capture (read from the installed source)."""
        if not planned.dspark:
            return []
        capable = compat.dspark_capture_architectures()
        architecture = target_architecture(loaded.recipe.model.path, planned.model_path)
        if capable is None or architecture is None or architecture in capable:
            return []
        return [f"stack.speculative.method: dspark on {architecture}: sglang {installed_version() or ''} captures a "
                f"target's layers for a DSpark draft only in {', '.join(sorted(capable))} "
                "(set_dspark_layers_to_capture), so this launch will fail; a Ling-3.0-shaped target "
                "(BailingMoeV3ForCausalLM) is what DSpark needs"]

    def _checked(self, loaded, unavailable: str | None) -> list[str]:
        """The pass-through flags checked against the installed sglang (or, without its parser,
        against the flags sparkit sets): the warnings."""
        if unavailable is None:
            return self._check_passthrough(loaded)
        self._check_passthrough_without_parser(loaded)
        return []

    def _switch_warnings(self, loaded) -> list[str]:
        """The plugin switches a recipe sets that reproduce the shared-head trap."""
        r = loaded.recipe
        env = r.server.env
        if (r.stack.speculative.method == "nextn" and r.stack.lm_head == "fp8" and SHARE_ENV in env
                and not truthy(env[SHARE_ENV], default=True)):
            return [f"server.env.{SHARE_ENV}={env[SHARE_ENV]} leaves the NEXTN draft with the target's FP8 head "
                    "*tensor* only (stock sglang 0.5.23): the shared-head trap; the draft_lm_head and "
                    "acceptance checks are expected to fail"]
        return []

    def _environment(self, loaded, planned: Planned, unavailable: str | None,
                     warnings: list[str]) -> tuple[dict[str, str], list[Provision], dict[str, str]]:
        """(the launch's environment, which path provides each optimisation, the variables that
        select the FP8 head's path)."""
        server = loaded.recipe.server
        registry = env_registry() if unavailable is None else frozenset()
        provisions, head_env = self._provisions(loaded, planned, registry)
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
        provisions += self._switch_report(loaded, env)
        provisions += local_model_provisions(planned.pulls, env)
        return env, provisions, head_env

    def _switch_report(self, loaded, env: dict[str, str]) -> list[Provision]:
        """The recipe's own SGLANG_* switches are reported by sparkit's plugin from inside the
        engine, as SGLang reads them, for the startup checks (check_engine_switches): the plugin is
        enabled for that alone (the lm_head left as loaded) when nothing else enables it. `env` is
        completed in place."""
        switches = sorted(n for n in loaded.recipe.server.env if n.startswith(SWITCH_PREFIX) and n != PLUGINS_ENV)
        if not switches:
            return []
        if env.get(ENABLE_ENV) != "1":
            env[ENABLE_ENV] = "1"
            env[FP8_ENV] = "0"
        plugins = [p for p in env.get(PLUGINS_ENV, "").split(",") if p]
        env[PLUGINS_ENV] = ",".join(plugins + ([PLUGIN_NAME] if PLUGIN_NAME not in plugins else []))
        return [Provision("engine_switches=reported", "sparkit-plugin",
                          f"{PLUGIN_ENTRY_POINT} reports {', '.join(switches)} as the engine reads them")]

    def _expectations(self, loaded, planned: Planned, head_env: dict[str, str], warnings: list[str]) -> dict[str, Any]:
        """What only SGLang can state of the live server: the resolved args (the table's: the
        algorithm /server_info reports among them), the draft it loads, and no exact re-scoring from
        SGLang's own FP8 head (the Ling patch's keeps no bf16 copy and writes no report)."""
        stack = loaded.recipe.stack
        expectations: dict[str, Any] = {}
        if stack.lm_head == "fp8" and FP8_LM_HEAD_ENV in head_env:
            expectations["lm_head_exact_top_k"] = None
            if stack.lm_head_exact_top_k:
                warnings.append(f"stack.lm_head_exact_top_k: {stack.lm_head_exact_top_k} is not applied: this sglang's "
                                f"own FP8 lm_head ({FP8_LM_HEAD_ENV}) has no exact re-scoring, so near-ties may "
                                "pick a different token than the bf16 head")
        expected = server_args(planned)
        if "speculative_draft_model_path" in expected:
            expectations["draft_model"] = expected["speculative_draft_model_path"]
        if planned.dspark:
            expectations["draft_block_size"] = planned.draft_block_size
        expectations["server_args"] = expected
        return expectations

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
        """The recipe values sglang's parser takes only from a list of choices, against the list."""
        for row in CHOICE_ROWS:
            value = recipe_value(loaded.recipe, row.key)
            if value is None:
                continue
            allowed = choices_for(row.dest)
            if allowed is not None and value not in allowed:
                raise loaded.error(row.key, f"{value!r} is not one of {', '.join(allowed)} (sglang {installed_version()})")

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
        flags = MANAGED_FLAGS
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

    def _provisions(self, loaded, planned: Planned, registry: frozenset[str]) -> tuple[list[Provision], dict[str, str]]:
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
            out.append(Provision(f"moe_backend={stack.moe_backend}", "sglang-flag", passed(SETTINGS, "moe_runner_backend", planned)))
        if stack.lm_head == "fp32":
            out.append(Provision("lm_head=fp32", "sglang-flag", passed(SETTINGS, "enable_fp32_lm_head", planned)))
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
                                 f"{passed(SETTINGS, 'speculative_algorithm', planned)} (an alias of {ALIASES['NEXTN']}; "
                                 f"/server_info reports {ALIASES['NEXTN']})"))
        elif spec.method == "dspark":
            block = planned.block_size or "of the draft config"
            out.append(Provision("speculative=dspark", "sglang-flag", f"{passed(SETTINGS, 'speculative_algorithm', planned)}, "
                                 f"block {block}, draft {spec.draft_model}"))
            out.append(Provision("draft_lm_head=shared", "sglang", "the DSpark worker attaches the target's embedding and "
                                 "lm_head modules to the draft (attach_shared_modules)"))
            if planned.draft_attention_backend:
                out.append(Provision(f"draft_attention={planned.draft_attention_backend}", "sglang-flag",
                                     f"{passed(SETTINGS, 'speculative_draft_attention_backend', planned)}: "
                                     f"{planned.attention_note}"))
            elif planned.attention_note:
                out.append(Provision("draft_attention=sglang-default", "sglang-default", planned.attention_note))
        return out + flag_provisions(SETTINGS, planned, "sglang-flag"), env


def target_architecture(model: str, model_path: str) -> str | None:
    """The architecture SGLang will load for the target: its config.json's (where it is here), a
    built-in model's export's (tiny-ling: BailingMoeV2ForCausalLM, tiny-ling-v3: BailingMoeV3ForCausalLM);
    None when unknown."""
    try:
        names = json.loads((Path(model_path) / "config.json").read_text()).get("architectures") or []
        if names:
            return str(names[0])
    except (OSError, ValueError, AttributeError):
        pass
    parsed = parse_builtin(model)
    return ARCHITECTURES[parsed[0]][1] if parsed is not None and parsed[0] in ARCHITECTURES else None


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
