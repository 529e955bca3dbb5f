"""Embedded-engine adapter: a recipe -> `python -m sparkit.engines.embedded ...` and what it needs.

Built-in models (`sparkit:tiny-ling[:seed=N][:steps=S]`, `sparkit:tiny-ling-v3...`) are planned through
sparkit.engines.builtin_models and built before the launch. The engine writes SGLang's startup
lines, so its log reads as SGLang's (SGLangLogAdapter).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from sparkit._version import __version__
from sparkit.contract.checks import CheckResult, Status
from sparkit.contract.engine import EngineInfo, EngineLaunch
from sparkit.contract.environment import (
    CUDA_ENV,
    HUGGING_FACE_ENV,
    SPARKIT_ENV,
    TORCH_ENV,
    TRITON_ENV,
    EngineEnvironment,
)
from sparkit.contract.flag_table import command_line, flag_provisions, passed
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
from sparkit.engines.embedded.settings import (
    API_KEY_ENV,
    SETTINGS,
    Planned,
    build_arg_parser,
    flag_name,
    server_args,
    validate_args,
)
from sparkit.engines.embedded.tool_calls import TOOL_CALL_PARSERS
from sparkit.engines.sglang.log import SGLangLogAdapter
from sparkit.errors import SparkitError
from sparkit.hub.refs import model_hub_ref
from sparkit.hub.remote import remote_checkpoint
from sparkit.models.formats import recognise, recognise_config


def embedded_arg_parser() -> argparse.ArgumentParser:
    """The embedded server's own parser (importable without torch), raising ValueError on errors."""
    parser = build_arg_parser()

    def error(message: str):
        raise ValueError(message)

    parser.error = error  # type: ignore[method-assign]
    return parser


def _moe_backend_rule(loaded):
    r = loaded.recipe
    if r.stack.moe_backend not in ("auto", "embedded-torch"):
        return [("error", "stack.moe_backend",
                 f"moe_backend {r.stack.moe_backend!r} is not available on the embedded engine (auto or embedded-torch)")]
    return []


def _limits_rule(loaded):
    r = loaded.recipe
    out = []
    if r.stack.tp != 1 or r.stack.ep != 1:
        out.append(("error", "stack.tp" if r.stack.tp != 1 else "stack.ep", "the embedded engine runs on one device (tp 1, ep 1)"))
    if r.target not in ("cpu", "auto"):
        out.append(("warning", "target", f"the embedded engine is a reference engine: target {r.target} only "
                    "selects --device cuda, and no published figure applies"))
    return out


def _kv_cache_rule(loaded):
    dtype = loaded.recipe.stack.kv_cache_dtype
    if dtype != "auto":
        return [("error", "stack.kv_cache_dtype", f"kv_cache_dtype {dtype!r} is not available on the embedded engine, "
                 "which keeps its KV cache in the compute dtype (auto only)")]
    return []


def _tool_call_parser_rule(loaded):
    parser = loaded.recipe.server.tool_call_parser
    if parser is not None and parser not in TOOL_CALL_PARSERS:
        return [("error", "server.tool_call_parser", f"{parser!r}: the embedded engine parses tool calls in "
                 f"{', '.join(TOOL_CALL_PARSERS)} only (tiny-ling's chat template writes ling3)")]
    return []


RULES = [
    Rule("embedded-moe-backend", "the embedded engine has one MoE implementation (PyTorch); sglang's kernels do not exist there",
         "use stack.moe_backend: auto (or embedded-torch) with engine: embedded", _moe_backend_rule),
    Rule("embedded-one-device", "the embedded engine runs on one device (no tensor or expert parallelism)",
         "use tp 1 and ep 1 with engine: embedded", _limits_rule),
    Rule("embedded-kv-cache-compute-dtype", "the embedded engine keeps its KV cache in the compute dtype",
         "use stack.kv_cache_dtype: auto with engine: embedded (SGLang serves an FP8 KV cache)", _kv_cache_rule),
    Rule("embedded-tool-call-parser", "the embedded engine reads one tool-call format, the one its chat template writes",
         f"use server.tool_call_parser: {TOOL_CALL_PARSERS[0]} (or leave it unset) with engine: embedded",
         _tool_call_parser_rule),
]


class EmbeddedAdapter(SGLangLogAdapter):
    name = "embedded"
    needs_gpu = False
    packages = ("torch", "safetensors", "transformers")
    install_hint = "pip install 'sparkit[embedded]'"
    validation_hint = ""  # its parser ships with sparkit: a plan is always validated
    settings = SETTINGS
    memory_model = "host_process"  # holds what it loads, in host memory (sparkit.memory.fit)
    exact_speculative = True  # its verify pass replays one-token decoding's arithmetic (tests/bench/test_verify_e2e.py)
    secret_files = ()
    key_env = (API_KEY_ENV,)

    def probe(self) -> EngineInfo:
        missing = [m for m in ("torch", "safetensors", "transformers", "starlette", "uvicorn")
                   if importlib.util.find_spec(m) is None]
        extras = {pkg: package_version(pkg) for pkg in ("torch", "safetensors", "transformers", "uvicorn")}
        detail = "" if not missing else "missing " + ", ".join(missing) + ": pip install 'sparkit[embedded]'"
        return EngineInfo("embedded", not missing, __version__, detail, extras)

    def environment(self) -> EngineEnvironment:
        """The embedded engine is PyTorch (and Triton for its CUDA FP8 head) under sparkit's switches."""
        return EngineEnvironment((TORCH_ENV, CUDA_ENV, TRITON_ENV, HUGGING_FACE_ENV, SPARKIT_ENV),
                                 source="the embedded engine's: PyTorch, CUDA, Triton, sparkit")

    def rules(self) -> list[Rule]:
        return RULES

    def read_rules(self, recipe, layout, device: str):
        """How this engine reads a checkpoint's bytes per step (sparkit.roofline): every weight
        decoded once at load and read in the compute dtype, experts included."""
        stack = recipe.stack
        compute = DTYPE_BYTES.get(recipe.model.dtype) or (4 if device == "cpu" else 2)
        name = {4: "float32", 2: "bfloat16"}[compute]
        explained = [f"embedded engine on {device}: weights decoded once at load and read in {name} "
                     f"({compute} bytes per weight), experts included"]
        head = stack.lm_head
        if head == "fp8" and device == "cpu":
            explained.append("FP8 lm_head on CPU: read through its dequantised float32 copy")
        return ReadRules("embedded", device, compute, False, head, stack.lm_head_exact_top_k, compute, compute,
                         compute, compute, 1, explained, head_bytes={"fp32": 4, "bf16": 2}.get(head),
                         fp8_head_dequantised=device == "cpu")

    def preflight(self, plan) -> list:
        return [packages_check(self)]

    def model_check(self, plan, pulled=None):
        """The preflight's model check for this engine: it serves tiny-ling (sparkit's builds and
        their Hugging Face exports) and downloads nothing, so another model's checkpoint fails
        here, saying which engine and recipe would serve it, rather than later as an unreadable
        checkpoint. A hub model is judged by what the engine would load: its pulled snapshot
        (`pulled`, the preflight's verdict on the plan's pulls, then stands), or, not here, the
        config.json the memory fit read from the hub: a tiny-ling export gets the exact
        `sparkit pull`, another model the engine that serves it."""
        model, title = plan.model, "model"
        if parse_builtin(model) is not None:
            builds = ", ".join(b["dir"] for b in plan.model_builds)
            return CheckResult("model", title, Status.PASS, f"built-in {model}, built before launch if missing",
                               evidence=[builds] if builds else [])
        target = next((p for p in plan.model_pulls or [] if p.get("role") == "target"), None)
        if target is not None and not target.get("local"):
            found = _hub_recognised(target["ref"])
            if found is not None and found.servable:
                return pulled  # the pull command (a tiny-ling export: this engine serves it once here)
            if found is None:
                return CheckResult("model", title, Status.FAIL, f"{model}: {not_servable_reason(model)}",
                                   fix=serve_elsewhere_hint(model) + f"; a tiny-ling export on the hub: "
                                   f"`sparkit pull {target['ref']}` first")
            return CheckResult("model", title, Status.FAIL, f"{model} (on the hub) holds {found.what}, and the embedded "
                               f"engine {SERVES.removeprefix('it ')}",
                               evidence=[f"architectures: {', '.join(found.architectures) or 'none'}"],
                               fix=serve_elsewhere_hint(model))
        path = Path(target["local"] if target is not None else model).expanduser()
        named = f"{model} ({path})" if target is not None else model
        if not path.exists():
            return CheckResult("model", title, Status.FAIL, f"{model}: {not_servable_reason(model)}",
                               fix=serve_elsewhere_hint(model))
        if not path.is_dir() or not (path / "config.json").is_file():
            return CheckResult("model", title, Status.FAIL, f"{named} is not a checkpoint directory (no config.json)",
                               fix="point model.path at a tiny-ling checkpoint (`sparkit model make-tiny DIR` builds one)")
        found = recognise(path)
        if found.servable is False:
            return CheckResult("model", title, Status.FAIL, f"{named} holds {found.what}, and the embedded engine {SERVES.removeprefix('it ')}",
                               evidence=[f"architectures: {', '.join(found.architectures) or 'none'}"],
                               fix=serve_elsewhere_hint(model))
        if pulled is not None and (not pulled.ok or found.servable):
            # the pulls' verdict stands (a draft not here, a snapshot sparkit has not verified), saying what it holds
            return replace(pulled, detail=f"{pulled.detail}: {found.what}") if pulled.ok else pulled
        if found.servable is None:
            return CheckResult("model", title, Status.WARN, f"{named}: {found.what}", evidence=[f"the embedded engine: {SERVES}"])
        return CheckResult("model", title, Status.PASS, f"local checkpoint {model}: {found.what}")

    def prepare(self, plan, progress) -> None:
        prepare_builds(plan.model_builds, progress)

    def deliver_secret(self, secret: str, run_dir: Path) -> tuple[dict[str, str], list[str]]:
        return {API_KEY_ENV: secret}, []

    def _model_dir(self, loaded, key: str, role: str, path: str, builds: list[dict[str, Any]],
                   pulls: list[dict[str, Any]]) -> str:
        if path.startswith("sparkit:"):
            return plan_builtin_model(loaded, key, path, builds)
        if model_hub_ref(path) is not None:  # its local snapshot (`sparkit pull`), else the id: refused at launch
            return hub_model_path(key, role, path, pulls)[0]
        return str(Path(path).expanduser())

    def launch(self, loaded, *, port: int) -> EngineLaunch:
        r = loaded.recipe
        stack, server, spec = r.stack, r.server, r.stack.speculative
        builds: list[dict[str, Any]] = []
        pulls: list[dict[str, Any]] = []
        model_dir = self._model_dir(loaded, "model.path", "target", r.model.path, builds, pulls)
        parsed = parse_builtin(r.model.path)
        served = r.model.served_name or (parsed[0] if parsed else pulls[0]["repo"] if pulls else Path(model_dir).name)
        draft_dir = None
        if spec.enabled and spec.draft_model:
            draft_dir = self._model_dir(loaded, "stack.speculative.draft_model", "draft", spec.draft_model, builds, pulls)
        planned = Planned(r, port, model_dir, served, draft_dir,
                          draft_block_size(spec.draft_model, draft_dir) if spec.method == "dspark" else None)
        args = command_line(SETTINGS, planned)

        parser = embedded_arg_parser()
        for i, item in enumerate(server.extra_args):
            if item.startswith("--") and item.split("=")[0] in args:
                raise loaded.error(f"server.extra_args.{i}", f"{item.split('=')[0]} is set from the recipe",
                                   hint="set the matching recipe key instead of passing the flag")
        try:
            parser.parse_args(["--model-path", "x", *server.extra_args])
        except (ValueError, SystemExit) as exc:
            raise loaded.error("server.extra_args", f"the embedded engine rejects the pass-through flags: {exc}",
                               hint="`python -m sparkit.engines.embedded --help` lists the flags") from None
        args += list(server.extra_args)
        _check_with_engine(loaded, parser, args)
        if model_dir and model_dir.startswith("-"):
            raise loaded.error("model.path", "a model path cannot start with '-'")

        warnings: list[str] = []
        if parse_builtin(r.model.path) is None and not Path(model_dir).exists():
            warnings.append(f"model.path {r.model.path}: {not_servable_reason(r.model.path)}; `sparkit up` refuses it. "
                            + serve_elsewhere_hint(r.model.path))
        sharing = flag_value(server.extra_args, flag_name("draft_lm_head_sharing"))
        if sharing == "tensor" and spec.method == "nextn" and stack.lm_head == "fp8":
            warnings.append("server.extra_args: --draft-lm-head-sharing tensor with an FP8 lm_head reproduces the "
                            "shared-head trap (the draft reads FP8 bytes as bf16: accept length ~1.0); the "
                            "draft_lm_head check is expected to fail")
        if flag_name("debug_corrupt_expert_dequant") in server.extra_args:
            warnings.append("server.extra_args: --debug-corrupt-expert-dequant deliberately computes wrong expert "
                            "weights; the known-answer check is expected to fail")
        env = dict(server.env)
        hub_provisions = local_model_provisions(pulls, env)

        # The recipe asks for a shared head and the check verifies it (and catches
        # --draft-lm-head-sharing tensor).
        expectations: dict[str, Any] = {"server_args": server_args(planned)}
        if draft_dir:
            expectations["draft_model"] = draft_dir
        if spec.method == "dspark":
            expectations["draft_block_size"] = planned.draft_block_size

        provisions = _provisions(planned, sharing) + hub_provisions

        # -P (3.11's safe path): `-m` would put the working directory first on sys.path, and a
        # `sparkit/` folder there (a checkout, a project named so) would be imported instead of the
        # installed sparkit; PYTHONPATH still applies.
        return EngineLaunch(
            argv=[sys.executable, "-P", "-m", "sparkit.engines.embedded", *args], env=env, served_model_name=served,
            provisions=provisions, warnings=warnings, expectations=expectations, model_builds=builds,
            model_pulls=pulls, validated_by="the embedded server's own argument parser and flag rules",
        )


def _provisions(planned: Planned, sharing: str | None) -> list[Provision]:
    """Which path provides each optimisation (all of them: the embedded engine itself)."""
    stack, spec = planned.recipe.stack, planned.spec
    provisions = [
        Provision(f"weights={stack.weights}", "embedded", f"{passed(SETTINGS, 'expert_weights', planned)} (quantised at load)"),
        Provision(f"moe_backend={stack.moe_backend}", "embedded", "PyTorch MoE of the embedded engine"),
        *flag_provisions(SETTINGS, planned, "embedded"),  # the lm_head and its exact re-scoring
    ]
    if spec.method == "nextn":
        provisions.append(Provision("speculative=nextn", "embedded", passed(SETTINGS, "speculative_algorithm", planned)))
        if stack.lm_head == "fp8":
            provisions.append(Provision("draft_lm_head=shared", "embedded", f"--draft-lm-head-sharing {sharing or 'module'}"))
    elif spec.method == "dspark":
        provisions.append(Provision("speculative=dspark", "embedded",
                                    f"{passed(SETTINGS, 'speculative_algorithm', planned)}, block "
                                    f"{planned.block_size or 'of the draft config'}, draft {spec.draft_model}"))
        provisions.append(Provision("draft_lm_head=shared", "embedded",
                                    "the draft computes with the target's embedding and lm_head modules"))
    return provisions


# What the embedded engine serves, in the words every message about it uses.
SERVES = ("it serves tiny-ling only: sparkit's builds (`sparkit:tiny-ling`, `sparkit model make-tiny DIR`) "
          "and their Hugging Face exports (`sparkit model export-hf DIR`)")


def _hub_recognised(ref: str):
    """What a hub model not here is, from its config.json (read for the memory fit in the same
    preflight, so kept; no weights are read): None when the hub cannot tell."""
    hub_ref = model_hub_ref(ref)
    if hub_ref is None:
        return None
    try:
        return recognise_config(remote_checkpoint(hub_ref).config)
    except SparkitError:
        return None


def not_servable_reason(model: str) -> str:
    return f"not a local directory, and the embedded engine downloads nothing: {SERVES}"


def sglang_recipe(model: str) -> tuple[str, str]:
    """(file name, YAML) of the smallest recipe that serves `model` on SGLang as it is: sglang is
    the schema's default engine, and every other key its default (weights as stored, no
    speculative decoding)."""
    import json

    stem = "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(model.rstrip("/")).name.lower()) or "model"
    return f"{stem}.yaml", f"model: {{path: {json.dumps(model)}}}"


def serve_elsewhere_hint(model: str) -> str:
    """Which engine and recipe would serve a model the embedded engine cannot."""
    name, text = sglang_recipe(model)
    return (f"SGLang serves it (engine: sglang, on a host with a GPU and sglang): write {text} to {name} and run "
            f"`sparkit up {name}`; a Ling-3.0-flash checkpoint has shipped recipes: "
            f"`sparkit up ling-3.0-flash/spark-optimized --set model.path=...`")


def _check_with_engine(loaded, parser: argparse.ArgumentParser, args: list[str]) -> None:
    """The whole command through the engine's parser and its cross-flag validation."""
    try:
        namespace = parser.parse_args(args)
    except (ValueError, SystemExit) as exc:
        raise loaded.error("stack", f"the embedded engine rejects the compiled command: {exc}") from None
    problems = validate_args(namespace)
    if problems:
        raise loaded.error("stack", "the embedded engine rejects the compiled command: " + "; ".join(problems))

