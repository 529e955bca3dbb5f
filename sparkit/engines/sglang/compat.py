"""Can the installed SGLang stack run a recipe? Judged from the installed code, not version numbers.

A recipe on SGLang needs pairs of packages to agree: sglang and its kernels (sglang-kernel,
imported as sgl_kernel), humming-kernels for Humming MoE and its online quantization, flashinfer
for its attention, MoE and sampling kernels, the torch sgl_kernel was compiled against, and the
triton sparkit's FP8 lm_head kernel is written for. Each pair a recipe needs (NEEDS) is judged by
reading both sides' installed source (sparkit.installed_source: nothing is imported):

* every name the consumer's modules on that path import from the provider must exist in the
  provider's source (re-exports followed; imports for other platforms are not this path);
* every call of such a name must pass only keywords its definition takes;
* sgl_kernel's compiled ops must load under the installed torch: its declared torch, and, where
  asked (`probe`: preflight on the serving host, `sparkit doctor`), an import in a child process.

Each finding says how it is fixed: by sparkit's plugin (a renamed keyword the plugin adapts:
plugin.RENAMED_KEYWORDS; the launch then enables the plugin and says so in its provisions), by a
version to install (the consumer's own pin, from its metadata), or by a recipe change. A finding
that fails makes the preflight fail (exit 4) naming the pair.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from sparkit.engines.sglang import plugin
from sparkit.installed_source import (
    CONDITIONAL,
    OPTIONAL,
    OTHER_PLATFORM,
    REQUIRED,
    Package,
    accepted_values,
    attributes_of,
    calls_of,
    imports_from,
    locate,
    method,
    module_files,
    resolve,
)

# (distribution, import name) of every package the judgement reads.
PACKAGES = (
    ("sglang", "sglang"),
    ("sglang-kernel", "sgl_kernel"),
    ("humming-kernels", "humming"),
    ("flashinfer-python", "flashinfer"),
    ("torch", "torch"),
    ("triton", "triton"),
    ("sparkit", "sparkit"),
)
DISTRIBUTION = dict((module, dist) for dist, module in PACKAGES)

OK, PLUGIN, WARN, FAIL, UNKNOWN = "ok", "plugin", "warn", "fail", "unknown"
# The needs on whose path sparkit's plugin adapts calls (plugin.RENAMED_KEYWORDS: sglang's online
# humming quantization calls humming.utils.weight.quantize_weight).
PLUGIN_ADAPTED = ("humming-online",)


@dataclass(frozen=True)
class Need:
    """A pair of packages a recipe feature needs, and the consumer modules on that path."""

    name: str
    feature: str  # what of the recipe needs it, in words, with its key
    consumer: str  # import name
    provider: str  # import name
    modules: tuple[str, ...]  # consumer modules (or packages) whose imports of the provider are judged
    required: bool = True  # False: the feature works without the provider, in part (a warning)
    recipe_fix: str = ""  # the recipe change that avoids the path, when nothing else helps
    without: str = ""  # what happens without the provider (when not required)


SGLANG_CORE = ("sglang.srt.layers.layernorm", "sglang.srt.layers.activation", "sglang.srt.layers.sampler",
               "sglang.srt.layers.rotary_embedding", "sglang.srt.layers.moe.topk",
               "sglang.srt.layers.logits_processor", "sglang.srt.layers.vocab_parallel_embedding",
               "sglang.srt.models.bailing_moe", "sglang.srt.models.bailing_moe_nextn", "sglang.srt.models.bailing_moe_v3")
HUMMING_ONLINE = ("sglang.srt.layers.quantization.humming", "sglang.srt.layers.moe.moe_runner.humming")
HUMMING_MOE = ("sglang.srt.layers.moe.moe_runner.humming", "sglang.srt.layers.quantization.mxfp4_humming_moe",
               "sglang.srt.layers.quantization.humming_utils")
FLASHINFER_MOE = {
    "flashinfer_mxfp4": ("sglang.srt.layers.quantization.mxfp4", "sglang.srt.layers.quantization.mxfp4_flashinfer_cutlass_moe",
                         "sglang.srt.layers.quantization.mxfp4_flashinfer_trtllm_moe"),
    "flashinfer_trtllm": ("sglang.srt.layers.moe.moe_runner.flashinfer_trtllm",),
    "flashinfer_cutlass": ("sglang.srt.layers.moe.moe_runner.flashinfer_cutlass",),
    "flashinfer_cutedsl": ("sglang.srt.layers.moe.moe_runner.flashinfer_cutedsl",),
}
SPARKIT_FP8_KERNEL = ("sparkit.kernels.fp8_gemv_triton", "sparkit.kernels.fp8_tune")
# Every SGLang recipe on CUDA needs these two (the Triton MoE kernels are also what the other MoE
# paths fall back to for shapes they do not cover).
SGL_KERNEL = Need("sgl-kernel", "every SGLang model on CUDA (norms, activations, rotary, top-k routing, "
                  "sampling, the Triton MoE kernels)", "sglang", "sgl_kernel",
                  SGLANG_CORE + ("sglang.srt.layers.moe.fused_moe_triton",))
TORCH_ABI = Need("torch-abi", "sgl_kernel's compiled ops, loaded by torch", "sgl_kernel", "torch", ())


def needs_for(recipe: dict[str, Any]) -> list[Need]:
    """The pairs a recipe (its resolved dict: `recipe.model_dump()` or a plan's `recipe`) needs."""
    stack = recipe.get("stack") or {}
    spec = stack.get("speculative") or {}
    moe = stack.get("moe_backend") or "auto"
    attention = stack.get("attention_backend")
    out = [SGL_KERNEL, TORCH_ABI]
    if stack.get("quantization") == "humming":
        out.append(Need("humming-online", "Humming's online quantization of bf16 weights (stack.quantization: humming)",
                        "sglang", "humming", HUMMING_ONLINE,
                        recipe_fix="serve a pre-quantized checkpoint without stack.quantization, or stack.moe_backend: triton"))
    if moe == "humming":
        out.append(Need("humming-moe", "Humming MoE kernels (stack.moe_backend: humming)", "sglang", "humming",
                        HUMMING_MOE, recipe_fix="stack.moe_backend: auto (flashinfer_mxfp4) or triton"))
    if moe in FLASHINFER_MOE:
        out.append(_flashinfer_moe(moe))
    if attention == "flashinfer":
        out.append(Need("flashinfer-attention", "FlashInfer attention (stack.attention_backend: flashinfer)", "sglang",
                        "flashinfer", ("sglang.srt.layers.attention.flashinfer_backend",),
                        recipe_fix="stack.attention_backend: triton"))
    if (spec.get("method") or "none") != "none":
        out.append(Need("flashinfer-sampling", f"sampled requests under speculative decoding ({spec.get('method')})",
                        "sglang", "flashinfer", ("sglang.kernels.ops.sampling.renorm", "sglang.srt.layers.sampler"),
                        required=False,
                        without="the first request with temperature > 0 crashes the server (its verify step "
                                "imports flashinfer's sampling kernels); greedy requests work",
                        recipe_fix="send only greedy requests (temperature 0; `sparkit verify --greedy-only`)"))
    if stack.get("lm_head") == "fp8":
        out.append(Need("triton-fp8-head", "sparkit's FP8 lm_head kernel (stack.lm_head: fp8, through the plugin)",
                        "sparkit", "triton", SPARKIT_FP8_KERNEL, recipe_fix="stack.lm_head: bf16"))
    return out


def all_needs() -> list[Need]:
    """Every pair any recipe can need (what `sparkit doctor` judges); needs_for() returns a subset
    of these, equal by name."""
    recipe = {"stack": {"quantization": "humming", "moe_backend": "humming", "attention_backend": "flashinfer",
                        "lm_head": "fp8", "speculative": {"method": "nextn"}}}
    return needs_for(recipe) + [_flashinfer_moe(backend) for backend in FLASHINFER_MOE]


def _flashinfer_moe(backend: str) -> Need:
    return Need(f"flashinfer-moe-{backend}", f"FlashInfer MoE kernels (stack.moe_backend: {backend})", "sglang",
                "flashinfer", FLASHINFER_MOE[backend], recipe_fix="stack.moe_backend: triton (or humming)")


# ------------------------------------------------------------------ what is installed


@dataclass(frozen=True)
class Installed:
    distribution: str
    module: str
    version: str | None
    package: Package | None  # where its source is (None: not installed, or no Python source)

    @property
    def label(self) -> str:
        if self.version:
            return f"{self.distribution} {self.version}"
        # a source tree on sys.path with no install metadata (`python -m sparkit` in a bare checkout)
        return f"{self.distribution} (source, no install metadata)" if self.package else f"{self.distribution} not installed"


@dataclass
class Stack:
    """The installed packages of PACKAGES, found on `search_path` (default sys.path)."""

    packages: dict[str, Installed]
    search_path: list[str] | None = None

    @classmethod
    def detect(cls, search_path: list[str] | None = None) -> Stack:
        out = {}
        for dist, module in PACKAGES:
            package = locate(module, search_path)
            version = _version(dist, search_path) if package is not None else None
            out[module] = Installed(dist, module, version, package)
        return cls(out, search_path)

    def __getitem__(self, module: str) -> Installed:
        return self.packages[module]

    def requirement(self, consumer: str, provider: str) -> str | None:
        """The consumer's declared requirement on the provider (`==0.1.12`), from its metadata."""
        dist = _distribution(DISTRIBUTION[consumer], self.search_path)
        if dist is None:
            return None
        wanted = _normal(DISTRIBUTION[provider])
        for line in dist.requires or []:
            match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*)(?:;(.*))?$", line)
            if not match or _normal(match.group(1)) != wanted:
                continue
            marker = match.group(3) or ""
            if "extra ==" in marker or "extra==" in marker:
                continue
            return match.group(2).strip() or None
        return None

    def to_dict(self) -> dict[str, Any]:
        return {i.distribution: {"module": i.module, "version": i.version,
                                 "source": str(i.package.root) if i.package else None}
                for i in self.packages.values()}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distribution(name: str, search_path: list[str] | None):
    return _distributions(tuple(search_path or sys.path)).get(_normal(name))


@functools.lru_cache(maxsize=8)
def _distributions(path: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dist in metadata.distributions(path=list(path)):
        out.setdefault(_normal(dist.metadata["Name"] or ""), dist)  # the first on the path wins, as for imports
    return out


def _version(name: str, search_path: list[str] | None) -> str | None:
    dist = _distribution(name, search_path)
    return dist.version if dist is not None else None


# ------------------------------------------------------------------ findings


@dataclass
class Finding:
    """One pair judged for one need."""

    need: str
    pair: str  # "sglang 0.5.23 -> humming-kernels 0.1.12"
    feature: str
    status: str  # OK | PLUGIN | WARN | FAIL | UNKNOWN
    detail: str
    evidence: list[str] = field(default_factory=list)
    fix: str | None = None
    fix_kind: str | None = None  # "plugin" | "install" | "recipe"
    plugin_env: dict[str, str] = field(default_factory=dict)  # what the launch sets to apply a plugin fix

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Judgement:
    stack: Stack
    findings: list[Finding]

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.status == FAIL]

    @property
    def plugin_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for f in self.findings:
            if f.status == PLUGIN:
                env.update(f.plugin_env)
        return env

    def to_dict(self) -> dict[str, Any]:
        return {"installed": self.stack.to_dict(), "findings": [f.to_dict() for f in self.findings]}


def _where(path: Path, line: int, stack: Stack) -> str:
    for installed in stack.packages.values():
        root = installed.package.root if installed.package else None
        if root is not None and root.is_dir():
            try:
                return f"{path.relative_to(root.parent)}:{line}"
            except ValueError:
                continue
    return f"{path}:{line}"


def judge(recipe: dict[str, Any] | None = None, *, stack: Stack | None = None, probe: bool = False,
          needs: list[Need] | None = None) -> Judgement:
    """Every pair the recipe needs (every pair there is, without a recipe), judged on `stack`
    (default: what is installed here). `probe` imports sgl_kernel in a child process."""
    stack = stack or Stack.detect()
    chosen = needs if needs is not None else (needs_for(recipe) if recipe is not None else all_needs())
    findings = []
    for need in chosen:
        if need.name == "torch-abi":
            findings.append(_judge_torch_abi(need, stack, probe))
        else:
            findings.append(_judge_imports(need, stack))
    return Judgement(stack, findings)


def _pair(need: Need, stack: Stack) -> str:
    return f"{stack[need.consumer].label} -> {stack[need.provider].label}"


def _scan_uses(need: Need, stack: Stack) -> tuple[list[tuple[str, str]], list[tuple[Any, Any, str]], int]:
    """Every import, module attribute and keyword of a call the consumer's modules of `need` make of
    the provider, resolved in the installed provider: the ones missing (guard, evidence), the
    keywords its definitions do not take (call, definition, keyword), and how many uses were judged."""
    consumer, provider = stack[need.consumer], stack[need.provider]
    missing: list[tuple[str, str]] = []  # (guard, evidence)
    keyword_problems: list[tuple[Any, Any, str]] = []  # (call, definition, keyword)
    judged = 0
    for module in need.modules:
        for path, dotted in module_files(consumer.package, module):
            uses = [u for u in imports_from(path, dotted, need.provider) if u.guard != OTHER_PLATFORM]
            modules_bound = {}
            for use in uses:
                judged += 1
                found = resolve(provider.package, use.module, use.name) if use.name else resolve(provider.package, use.module)
                if found is None:
                    what = f"{use.module}.{use.name}" if use.name else use.module
                    missing.append((use.guard, f"{_where(path, use.line, stack)} imports {what} ({use.guard}): "
                                               f"not in {provider.label}"))
                elif found.kind == "module":
                    modules_bound[use.bound_as] = (use, found.symbol)
            # `import triton.language as tl` then `tl.program_id`: each attribute must exist too
            for attribute in attributes_of(path, [u for u, _ in modules_bound.values()]):
                use, module_name = modules_bound[attribute.imported.bound_as]
                judged += 1
                if resolve(provider.package, module_name, attribute.attribute) is None:
                    missing.append((use.guard, f"{_where(path, attribute.line, stack)} uses "
                                               f"{module_name}.{attribute.attribute} ({use.guard}): not in {provider.label}"))
            for call in calls_of(path, uses):
                definition = resolve(provider.package, call.imported.module, call.imported.name)
                if definition is not None and call.attribute:
                    definition = method(provider.package, definition, call.attribute)
                if definition is None or definition.parameters is None:
                    continue
                for keyword in call.keywords:
                    if keyword not in definition.parameters:
                        keyword_problems.append((call, definition, keyword))
    return missing, keyword_problems, judged


def _keyword_fixes(keyword_problems: list[tuple[Any, Any, str]], stack: Stack) -> tuple[list[tuple[str, Any, Any]], list[str]]:
    """The keyword problems sparkit's plugin adapts (line, rename, definition), and the evidence of
    those it does not."""
    plugin_fixed, unfixed = [], []
    for call, definition, keyword in keyword_problems:
        line = (f"{_where(call.consumer_file, call.line, stack)} passes {keyword}= to {definition.symbol}, which "
                f"takes ({', '.join(definition.parameters)}) [{_where(definition.file, definition.line, stack)}]")
        rename = next((r for r in plugin.RENAMED_KEYWORDS.get(definition.symbol, ()) if r.old == keyword), None)
        allowed = accepted_values(definition, rename.new) if rename is not None else None
        refused = sorted(repr(new) for _, new in (rename.values if rename else ()) if new is not None
                         and allowed is not None and new not in allowed)
        if rename is not None and rename.new in definition.parameters and not refused:
            plugin_fixed.append((line, rename, definition))
        elif refused:
            unfixed.append(f"{line}; the plugin would pass {rename.new}={', '.join(refused)}, which it does not "
                           f"admit ({sorted(map(repr, allowed))})")
        else:
            unfixed.append(line)
    return plugin_fixed, unfixed


def _judge_imports(need: Need, stack: Stack) -> Finding:
    consumer, provider = stack[need.consumer], stack[need.provider]
    pair = _pair(need, stack)
    pin = stack.requirement(need.consumer, need.provider)
    install = (f"pip install '{provider.distribution}{pin}' ({consumer.label}'s own requirement)" if pin
               else f"pip install {provider.distribution}")
    if consumer.package is None:
        return Finding(need.name, pair, need.feature, UNKNOWN, f"{consumer.distribution} is not installed here")
    if provider.package is None:
        status = FAIL if need.required else WARN
        detail = f"{provider.distribution} is not installed" + (f": {need.without}" if need.without else "")
        return Finding(need.name, pair, need.feature, status, detail, fix=install if need.required else
                       f"{install}, or {need.recipe_fix}", fix_kind="install")
    absent = [m for m in need.modules if not module_files(consumer.package, m)]
    missing, keyword_problems, judged = _scan_uses(need, stack)
    if absent and len(absent) == len(need.modules):
        return Finding(need.name, pair, need.feature, UNKNOWN,
                       f"none of the modules this judgement reads is in {consumer.label} ({', '.join(absent)}): "
                       "its map of this path is for another version", evidence=absent)
    absent_note = [f"not in {consumer.label}, not judged: {m}" for m in absent]
    plugin_fixed, unfixed = _keyword_fixes(keyword_problems, stack)
    required_missing = [e for g, e in missing if g == REQUIRED]
    soft_missing = [e for g, e in missing if g in (CONDITIONAL, OPTIONAL)]
    if required_missing or unfixed:
        problems = len(required_missing) + len(unfixed)
        pinned_here = bool(pin and pin.startswith("==") and pin[2:] == provider.version)
        if pin and not pinned_here:
            fix, kind = install, "install"
        elif need.recipe_fix:
            fix, kind = (f"{need.recipe_fix} ({consumer.label}'s own pin, {provider.distribution}{pin}, is what is "
                         "installed)" if pin else need.recipe_fix), "recipe"
        else:
            fix, kind = (f"reinstall {provider.distribution}{pin or ''}: the installed files lack what "
                         f"{consumer.distribution} imports"), "install"
        return Finding(need.name, pair, need.feature, FAIL,
                       f"{problems} use(s) of {provider.distribution} that the installed version does not accept",
                       evidence=required_missing + unfixed + soft_missing, fix=fix, fix_kind=kind)
    if plugin_fixed:
        renames = sorted({f"{r.old} -> {r.new}" for _, r, _ in plugin_fixed})
        targets = sorted({d.symbol for _, _, d in plugin_fixed})
        env = {plugin.ENABLE_ENV: "1", plugin.HUMMING_KEYWORDS_ENV: "1"}
        return Finding(need.name, pair, need.feature, PLUGIN,
                       f"{consumer.distribution} passes keyword(s) {provider.distribution} {provider.version} renamed "
                       f"({', '.join(renames)}); sparkit's plugin adapts the call ({', '.join(targets)})",
                       evidence=[line for line, _, _ in plugin_fixed] + soft_missing,
                       fix=f"applied by sparkit's plugin ({plugin.HUMMING_KEYWORDS_ENV}=1: an AROUND hook on "
                           f"{', '.join(targets)})", fix_kind="plugin", plugin_env=env)
    if soft_missing:
        return Finding(need.name, pair, need.feature, WARN,
                       f"{len(soft_missing)} conditional or optional import(s) the installed {provider.distribution} "
                       "lacks (the path may not take them)", evidence=soft_missing, fix=install, fix_kind="install")
    return Finding(need.name, pair, need.feature, OK,
                   f"{judged} import(s) of {provider.distribution} found in its source, every call's keywords accepted",
                   evidence=absent_note)


PROBE_TIMEOUT_S = 120.0


def probe_import(module: str, search_path: list[str] | None = None, timeout: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """Import `module` in a child process (its compiled extensions load there, not here):
    (imported, the last line of its error). Once per process and path."""
    return _probe_import(module, tuple(search_path or ()), timeout)


@functools.lru_cache(maxsize=8)
def _probe_import(module: str, search_path: tuple[str, ...], timeout: float) -> tuple[bool, str]:
    env = dict(os.environ)
    # the child imports from the path this judgement read (this process's, by default)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (search_path or sys.path) if p)
    try:
        done = subprocess.run([sys.executable, "-c", f"import {module}"], env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"import {module} did not finish in {timeout:.0f} s"
    if done.returncode == 0:
        return True, ""
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
    return False, lines[-1] if lines else f"exit status {done.returncode}"


def _judge_torch_abi(need: Need, stack: Stack, probe: bool) -> Finding:
    kernel, torch = stack["sgl_kernel"], stack["torch"]
    pair = f"{kernel.label} -> {torch.label}"
    if kernel.package is None:  # the sglang -> sglang-kernel pair says so, with its fix
        return Finding(need.name, pair, need.feature, UNKNOWN, "sglang-kernel is not installed: nothing to load")
    built_for = stack.requirement("sgl_kernel", "torch")
    evidence = [f"sglang-kernel {kernel.version} declares torch{built_for}" if built_for else
                f"sglang-kernel {kernel.version} declares no torch version"]
    declared_mismatch = bool(built_for and built_for.startswith("==") and torch.version
                             and torch.version.split("+")[0] != built_for[2:])
    install_torch = f"pip install 'torch{built_for}' (the torch sglang-kernel {kernel.version} was built for)"
    if probe:
        imported, error = probe_import("sgl_kernel", stack.search_path)
        evidence.append("import sgl_kernel in a child process: " + ("ok" if imported else error))
        if imported:
            return Finding(need.name, pair, need.feature, OK, "sgl_kernel's compiled ops load under this torch",
                           evidence=evidence)
        abi = "undefined symbol" in error
        return Finding(need.name, pair, need.feature, FAIL,
                       "sgl_kernel does not load under this torch" + (" (a C++ ABI mismatch: undefined symbol)" if abi else
                                                                      f": {error}"),
                       evidence=evidence, fix=install_torch if (abi or declared_mismatch) else
                       "see the import error; reinstall sglang-kernel for this CUDA and torch", fix_kind="install")
    if declared_mismatch:
        return Finding(need.name, pair, need.feature, WARN,
                       f"sglang-kernel {kernel.version} was built for torch{built_for}, torch {torch.version} is "
                       "installed: its compiled ops may not load (`sparkit doctor` imports it to tell)",
                       evidence=evidence, fix=install_torch, fix_kind="install")
    return Finding(need.name, pair, need.feature, OK, "declared torch matches (not imported here)", evidence=evidence)


# ------------------------------------------------------------------ DSpark's attention backends

# sgl_kernel's compiled FA3 (sgl_kernel/flash_attn.py loads it): the SGLang H200 kit's trimmed
# sgl_kernel drops it (1.1 GB), and SGLang 0.5.23's DSpark draft runner then dies importing FA3
# unless its backend is named (seen on the H200: `--attention-backend triton
# --speculative-draft-attention-backend triton` serves, decode CUDA graphs on).
FA3_EXTENSION = "flash_ops"


@dataclass(frozen=True)
class AttentionPick:
    """The attention backends a DSpark launch passes (None: SGLang's own choice) and why."""

    target: str | None
    draft: str | None
    reason: str
    runs: bool = True  # False: the installed kernels can run no DSpark draft (reason says why)


def dspark_attention_backends(stack: Stack | None = None, recipe_backend: str | None = None) -> AttentionPick:
    """What the installed sgl_kernel can run for a DSpark target and its draft: its FA3 when it
    has one (SGLang's defaults), else triton for both (Triton kernels ship with sglang); the
    recipe's own stack.attention_backend is kept for the target."""
    stack = stack or Stack.detect()
    kernel, triton = stack["sgl_kernel"], stack["triton"]
    if kernel.package is not None and kernel.package.root.is_dir() and any(kernel.package.root.glob(f"{FA3_EXTENSION}*.so")):
        return AttentionPick(recipe_backend, None, f"the installed sgl_kernel {kernel.version} has FA3 "
                             f"({FA3_EXTENSION}): SGLang picks the draft's backend")
    if kernel.package is None:
        return AttentionPick(recipe_backend, None, "sgl_kernel is not installed here, so whether it has FA3 cannot be "
                             "told: SGLang's own choice is planned (where FA3 is missing, its DSpark draft runner dies "
                             "importing it: plan on the serving host, which passes triton then)")
    why = (f"the installed sgl_kernel {kernel.version} has no FA3 ({FA3_EXTENSION}*.so absent in "
           f"{kernel.package.root}): SGLang's DSpark draft runner would die importing it")
    if triton.package is None:
        return AttentionPick(None, None, why + "; and triton is not installed either: no attention backend the "
                             "installed kernels provide can run the draft (pip install triton, or an sgl_kernel with FA3)",
                             runs=False)
    return AttentionPick(recipe_backend or "triton", "triton", why)


@functools.lru_cache(maxsize=4)
def dspark_capture_architectures(search_path: tuple[str, ...] = ()) -> frozenset[str] | None:
    """The model classes of the installed sglang that define set_dspark_layers_to_capture (the
    targets its DSpark worker can take hidden states from: BailingMoeV3ForCausalLM, ...), read from
    its source; None when sglang is not installed."""
    import ast

    package = locate("sglang", list(search_path) or None)
    models = package.root / "srt" / "models" if package is not None else None
    if models is None or not models.is_dir():
        return None
    found = set()
    for path in sorted(models.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(isinstance(f, ast.FunctionDef) and f.name == "set_dspark_layers_to_capture"
                                                      for f in node.body):
                found.add(node.name)
    return frozenset(found)
