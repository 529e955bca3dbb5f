"""Embedded-engine adapter: compile a recipe to `python -m sparkit.engines.embedded ...`.

Built-in models (`sparkit:tiny-ling[:seed=N][:steps=S]`) are planned, not built: the plan
lists them in `model_builds` and the launcher builds them before starting (the default build
ships with sparkit, so only other seeds or step counts train).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from sparkit.engines.base import EngineInfo, package_version

BUILTIN_PREFIX = "sparkit:"
_BUILTIN = re.compile(r"^sparkit:(?P<name>[a-z0-9][a-z0-9-]*)(?::seed=(?P<seed>\d+))?(?::steps=(?P<steps>[1-9]\d{0,6}))?$")
BUILTIN_MODELS = ("tiny-ling",)


def embedded_arg_parser() -> argparse.ArgumentParser:
    """The embedded server's own parser (importable without torch), raising ValueError on errors."""
    from sparkit.engines.embedded.server import build_arg_parser

    parser = build_arg_parser()

    def error(message: str):
        raise ValueError(message)

    parser.error = error  # type: ignore[method-assign]
    return parser


def parse_builtin(path: str) -> tuple[str, int, int | None] | None:
    """('tiny-ling', seed, steps or None) for `sparkit:tiny-ling[:seed=N][:steps=S]`; None for
    paths that are not of that form."""
    m = _BUILTIN.match(path)
    if not m:
        return None
    return m.group("name"), int(m.group("seed") or 0), int(m.group("steps")) if m.group("steps") else None


def plan_builtin_model(loaded, key: str, path: str, builds: list[dict[str, Any]], export_dtype: str | None = None) -> str | None:
    """For `sparkit:tiny-ling[:seed=N]`: record the build (and, for engines that load Hugging Face
    checkpoints, its HF export) in `builds` and return the directory the engine will load. None
    for a path that is not a built-in model."""
    if not path.startswith(BUILTIN_PREFIX):
        return None
    from sparkit.engines.embedded.builder import builtin_model_dir

    parsed = parse_builtin(path)
    if parsed is None or parsed[0] not in BUILTIN_MODELS:
        raise loaded.error(key, f"unknown built-in model {path!r}",
                           hint="built-in models: sparkit:tiny-ling, with :seed=N and :steps=S to build another")
    name, seed, steps = parsed
    build: dict[str, Any] = {"name": name, "seed": seed}
    if steps is not None:
        build["steps"] = steps
        build["dir"] = str(builtin_model_dir(name, seed, steps))
    else:
        build["dir"] = str(builtin_model_dir(name, seed))
    if export_dtype is not None:
        from sparkit.engines.embedded.checkpoint import hf_export_dir

        build["export_hf"] = {"dtype": export_dtype, "dir": str(hf_export_dir(build["dir"], export_dtype))}
    if build not in builds:
        builds.append(build)
    return build["export_hf"]["dir"] if export_dtype is not None else build["dir"]


class EmbeddedAdapter:
    name = "embedded"

    def probe(self) -> EngineInfo:
        import importlib.util

        missing = [m for m in ("torch", "safetensors", "transformers", "starlette", "uvicorn")
                   if importlib.util.find_spec(m) is None]
        extras = {pkg: package_version(pkg) for pkg in ("torch", "safetensors", "transformers", "uvicorn")}
        detail = "" if not missing else "missing " + ", ".join(missing) + ": pip install 'sparkit[embedded]'"
        from sparkit import __version__

        return EngineInfo("embedded", not missing, __version__, detail, extras)

    def _model_dir(self, loaded, key: str, path: str, builds: list[dict[str, Any]]) -> str:
        return plan_builtin_model(loaded, key, path, builds) or str(Path(path).expanduser())

    def compile(self, loaded, *, port: int | None = None):
        from sparkit.recipes.compile import base_expectations, build_plan
        from sparkit.recipes.plan import Provision

        r = loaded.recipe
        stack, server, spec = r.stack, r.server, r.stack.speculative
        builds: list[dict[str, Any]] = []
        model_dir = self._model_dir(loaded, "model.path", r.model.path, builds)
        parsed = parse_builtin(r.model.path)
        served = r.model.served_name or (parsed[0] if parsed else Path(model_dir).name)
        port = port if port is not None else server.port
        device = {"cpu": "cpu", "auto": "auto"}.get(r.target, "cuda")

        args = ["--model-path", model_dir, "--served-model-name", served, "--host", server.host, "--port", str(port),
                "--device", device, "--expert-weights", stack.weights, "--lm-head-dtype", stack.lm_head]
        if stack.lm_head == "fp8":
            args += ["--lm-head-exact-top-k", str(stack.lm_head_exact_top_k)]
        if r.model.dtype in ("bfloat16", "float32"):
            args += ["--dtype", r.model.dtype]
        draft_dir = None
        if spec.method == "nextn":
            args += ["--speculative-algorithm", "NEXTN"]
            if spec.num_steps is not None:
                args += ["--speculative-num-steps", str(spec.num_steps), "--speculative-eagle-topk", str(spec.eagle_topk),
                         "--speculative-num-draft-tokens", str(spec.num_draft_tokens)]
            if spec.draft_model:
                draft_dir = self._model_dir(loaded, "stack.speculative.draft_model", spec.draft_model, builds)
                args += ["--speculative-draft-model-path", draft_dir]
        if r.model.context_length:
            args += ["--context-length", str(r.model.context_length)]
        if server.enable_metrics:
            args.append("--enable-metrics")

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
        sharing = _flag_value(server.extra_args, "--draft-lm-head-sharing")
        if sharing == "tensor" and spec.method == "nextn" and stack.lm_head == "fp8":
            warnings.append("server.extra_args: --draft-lm-head-sharing tensor with an FP8 lm_head reproduces the "
                            "shared-head trap (the draft reads FP8 bytes as bf16: accept length ~1.0); the "
                            "draft_lm_head check is expected to fail")
        env = dict(server.env)

        expectations = base_expectations(r)
        expectations.speculative_algorithm_reported = "NEXTN" if spec.method == "nextn" else None
        if spec.method == "nextn" and stack.lm_head == "fp8":
            # The recipe asks for a shared head; the check verifies it (and catches "tensor").
            expectations.draft_shares_lm_head = True
        if draft_dir:
            expectations.draft_model = draft_dir
        sa: dict[str, Any] = {"tp_size": 1, "ep_size": 1}
        if spec.method == "nextn":
            sa["speculative_algorithm"] = "NEXTN"
            for k in ("num_steps", "eagle_topk", "num_draft_tokens"):
                if getattr(spec, k) is not None:
                    sa[f"speculative_{k}"] = getattr(spec, k)
        expectations.server_args = sa

        provisions = [
            Provision(f"weights={stack.weights}", "embedded", f"--expert-weights {stack.weights} (quantised at load)"),
            Provision(f"moe_backend={stack.moe_backend}", "embedded", "PyTorch MoE of the embedded engine"),
            Provision(f"lm_head={stack.lm_head}", "embedded", f"--lm-head-dtype {stack.lm_head}"),
        ]
        if stack.lm_head == "fp8":
            provisions.append(Provision(f"lm_head_exact_top_k={stack.lm_head_exact_top_k}", "embedded",
                                        f"--lm-head-exact-top-k {stack.lm_head_exact_top_k}"))
        if spec.method == "nextn":
            provisions.append(Provision("speculative=nextn", "embedded", "--speculative-algorithm NEXTN"))
            if stack.lm_head == "fp8":
                provisions.append(Provision("draft_lm_head=shared", "embedded",
                                            f"--draft-lm-head-sharing {sharing or 'module'}"))

        argv = [sys.executable, "-m", "sparkit.engines.embedded", *args]
        plan = build_plan(loaded, engine="embedded", argv=argv, env=env, port=port, expectations=expectations,
                          provisions=provisions, warnings=warnings, served_model_name=served)
        plan.model_builds = builds
        plan.validated_by = "the embedded server's own argument parser and flag rules"
        return plan


def _check_with_engine(loaded, parser: argparse.ArgumentParser, args: list[str]) -> None:
    """The whole command through the engine's parser and its cross-flag validation."""
    try:
        namespace = parser.parse_args(args)
    except (ValueError, SystemExit) as exc:
        raise loaded.error("stack", f"the embedded engine rejects the compiled command: {exc}") from None
    from sparkit.engines.embedded.server import validate_args

    problems = validate_args(namespace)
    if problems:
        raise loaded.error("stack", "the embedded engine rejects the compiled command: " + "; ".join(problems))


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, item in enumerate(args):
        if item == flag and i + 1 < len(args):
            return args[i + 1]
        if item.startswith(flag + "="):
            return item.split("=", 1)[1]
    return None
