"""Bytes per decode step for a recipe, and the decode speed the memory bandwidth allows.

A plain step (one token) reads every weight of the target's layers except the routed experts,
k of the E routed experts per MoE layer, the whole lm_head, one embedding row, the KV cache up to
the context (full-attention layers) and the recurrent state (linear-attention layers, read and
written back). The bound is bytes / bandwidth; batch-1 decoding cannot beat it.

Speculative decoding (NEXTN / MTP, SGLang's EAGLE worker and the embedded engine alike), per cycle:
- verify: one target forward over n = num_draft_tokens positions. Its weights are read once, but
  the routed experts the n tokens touch together: E * (1 - (1 - k/E)^n) distinct experts in
  expectation when routing is independent between tokens (31.2 for top-8 of 512 at n = 4: the
  Spark study's "up to 32 experts instead of 8"); SGLang's KDA verify writes every position's
  state to an intermediate buffer, then commits one (n + 3 state-sized transfers instead of 2);
- draft: num_steps - 1 chained forwards of the NextN layer (the first draft comes from the
  previous cycle) plus one "extend" forward over the tokens just committed, each reading the
  NextN layer and the (shared) lm_head.
It commits `accept` tokens on average, so tok/s(accept) = accept * bandwidth / cycle bytes, and
MTP pays when accept > cycle bytes / step bytes (the break-even accept length). Consecutive
tokens of real text often pick the same experts, so a verify may read fewer than the independent
expectation: the bound is then a little conservative.

What is read is what the engine reads: SGLang reads the stored dtypes (an MXFP4 expert with its
e8m0 scales, FP8 with its block scales), the router in its router_dtype (fp32 unless the config
says otherwise), an FP8 lm_head as e4m3 plus per-row scales plus the exact re-scoring rows, an
fp32 lm_head as the bf16 weight (0.5.23 multiplies it with fp32 output); the embedded engine
decodes every weight once at load into its compute dtype (float32 on CPU), so that is what it
reads. With TP, each GPU reads its shard of the sharded weights and all of the replicated ones
(routers, norms, MLA's single-latent KV cache).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sparkit.checkpoint_headers
import sparkit.roofline.layout
import sparkit.roofline.profiles
from sparkit._version import __version__
from sparkit.checkpoint_headers import read_safetensors_index, safetensors_files
from sparkit.contract.flag_table import SPECULATIVE_DEFAULTS, chain_draft_tokens
from sparkit.contract.reading import ReadRules
from sparkit.engines.base import get_adapter
from sparkit.engines.builtin_models import parse_builtin_ref
from sparkit.errors import HubError, SparkitError
from sparkit.host import detect_host
from sparkit.hub.remote import remote_checkpoint
from sparkit.memory.checkpoint_location import locate
from sparkit.models.builder import builtin_model_dir
from sparkit.models.catalog import BUILTIN_DRAFTS, family
from sparkit.models.checkpoint import hf_export_dir, is_export
from sparkit.models.dspark.builder import builtin_draft_dir
from sparkit.models.dspark.checkpoint import load_config
from sparkit.models.dspark.config import UNKNOWN_DRAFT_BLOCK_SIZE
from sparkit.paths import cache_dir, ensure_dir, write_atomic
from sparkit.roofline.bandwidth import Bandwidth, resolve_bandwidth
from sparkit.roofline.layout import (
    LayerReads,
    ModelLayout,
    Weights,
    layout_from_checkpoint,
    layout_from_dict,
    layout_from_tensors,
    layout_to_dict,
)
from sparkit.roofline.profiles import PROFILES, config_only_layout, declared_layout, find_profile, tensor_infos
from sparkit.roofline.published import H200_HOST_STEP, HOST_TERM_PREFIX
from sparkit.weight_formats import LAYOUTS, sglang_quantization_config

DEFAULT_CONTEXT = 8192  # sparkit bench's default prompt length
TOKENS_PER_STRETCH = 2  # the FP8 head re-scores two tokens per candidate stretch (sparkit.kernels.fp8_linear)

# Components of a step, in display order, with the label users see.
COMPONENTS: tuple[tuple[str, str], ...] = (
    ("attention", "attention weights"),
    ("dense_mlp", "dense MLP layers"),
    ("shared_expert", "shared experts"),
    ("routed_experts", "routed experts"),
    ("router", "routers"),
    ("norm", "norms"),
    ("mtp_proj", "NextN eh_proj"),
    ("other", "other tensors"),
    ("embedding", "embedding rows"),
    ("lm_head", "lm_head"),
    ("lm_head_rescore", "lm_head exact re-scoring"),
    ("kv_cache", "KV cache"),
    ("linear_state", "linear-attention state"),
)
_REPLICATED = {"router", "norm"}


def expected_distinct_experts(tokens: float, num_experts: int, top_k: int) -> float:
    """Expected number of distinct experts `tokens` tokens route to, each choosing `top_k` of
    `num_experts` uniformly and independently of the others: E * (1 - (1 - k/E)^n)."""
    if tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def read_rules(recipe: Any, layout: ModelLayout, device: str) -> ReadRules:
    """The reading rules of `recipe` (a sparkit.recipes.schema.Recipe) on `device`: its engine's
    (the adapter's `read_rules`; each engine reads weights its own way)."""
    adapter = get_adapter(recipe.engine)
    if not hasattr(adapter, "read_rules"):  # an engine a plugin added may not say how it reads
        raise NoLayout(f"engine {recipe.engine!r} does not state how it reads a checkpoint (read_rules)")
    return adapter.read_rules(recipe, layout, device)


def _weights_bytes(w: Weights, role: str, rules: ReadRules) -> float:
    if role == "router" and rules.router_bytes is not None:
        return w.bytes_at(rules.router_bytes)
    if rules.online_fp8 and role in ("attention", "dense_mlp", "shared_expert", "mtp_proj"):
        return w.bytes_at(1)
    return w.bytes_at(rules.float_bytes)


def _per_device(role: str, value: float, rules: ReadRules) -> float:
    return value if role in _REPLICATED else value / rules.tp


def lm_head_bytes(layout: ModelLayout, rules: ReadRules, rows: int) -> tuple[float, float]:
    """(head bytes, re-scoring bytes) of one lm_head call over `rows` positions, per device."""
    head = layout.lm_head
    vocab = layout.vocab_size or (head.float_numel // max(layout.hidden_size, 1))
    if rules.lm_head == "fp8":
        cpu_copy = rules.fp8_head_dequantised
        main = head.float_numel * (rules.float_bytes if cpu_copy else 1) + (0 if cpu_copy else vocab * 4)
        k = rules.lm_head_exact_top_k
        rescore = rows * k * TOKENS_PER_STRETCH * layout.hidden_size * 2 if k > 0 else 0.0
        return main / rules.tp, rescore / rules.tp
    if rules.head_bytes is not None:
        return head.float_numel * rules.head_bytes / rules.tp, 0.0
    return head.bytes_at(rules.float_bytes) / rules.tp, 0.0


def forward_bytes(layout: ModelLayout, rules: ReadRules, layers: list[LayerReads], tokens: float, context: int,
                  *, verify: bool = False, with_embedding: bool = True, with_final: bool = True) -> dict[str, float]:
    """Bytes one device reads (and writes, for caches) in one forward of `layers` over `tokens`
    positions at `context` tokens of context, by component."""
    out = {key: 0.0 for key, _ in COMPONENTS}
    for layer in layers:
        for role, weights in layer.weights.items():
            out[role if role in out else "other"] += _per_device(role, _weights_bytes(weights, role, rules), rules)
        if layer.experts is not None:
            e = layer.experts
            distinct = expected_distinct_experts(tokens, e.num_experts, e.top_k)
            per = e.per_expert.bytes_at(1 if rules.online_fp8 and e.per_expert.float_numel else rules.float_bytes)
            out["routed_experts"] += distinct * per / rules.tp
        if layer.attention == "linear":
            state = layer.state_elements * rules.state_bytes + layer.conv_elements * rules.conv_bytes
            transfers = (tokens + 3) if verify else 2  # read + write back; verify: per-position states + commit
            out["linear_state"] += state * transfers / rules.tp
        elif layer.kv_elements_per_token:
            row = layer.kv_elements_per_token * rules.kv_bytes
            kv = row * (context + tokens)  # read the cache, write the new rows
            out["kv_cache"] += kv / (rules.tp if layer.kv_sharded else 1)
    if with_embedding:
        row_bytes = layout.embedding.bytes_at(rules.float_bytes) / max(layout.vocab_size, 1)
        out["embedding"] += tokens * row_bytes
    if with_final:
        out["norm"] += layout.final_norm.bytes_at(rules.float_bytes)
        out["other"] += layout.other.bytes_at(rules.float_bytes) / rules.tp
    head, rescore = lm_head_bytes(layout, rules, math.ceil(tokens))
    out["lm_head"] += head
    out["lm_head_rescore"] += rescore
    return out


@dataclass
class SpecModel:
    """A speculative cycle's bytes as a function of the accept length."""

    method: str  # nextn | dspark
    label: str  # "NEXTN 3/1/4"
    verify_tokens: int  # positions one verify scores (the most a cycle can commit)
    verify: dict[str, float]  # the verify forward, bytes per device by component
    chained: dict[str, float] | None  # one chained draft forward (None: the draft is not counted)
    chained_forwards: int  # how many per cycle
    extend: Callable[[float], dict[str, float]] | None = None  # the draft's extend over `accept` tokens
    notes: list[str] = field(default_factory=list)

    @property
    def draft_counted(self) -> bool:
        return self.chained is not None

    def draft_bytes(self, accept: float) -> float:
        if self.chained is None:
            return 0.0
        extend = sum(self.extend(accept).values()) if self.extend else 0.0
        return self.chained_forwards * sum(self.chained.values()) + extend

    def cycle_bytes(self, accept: float) -> float:
        return sum(self.verify.values()) + self.draft_bytes(accept)


@dataclass
class Roofline:
    """The bandwidth bound of one recipe at one context length."""

    recipe_name: str
    model: str
    layout_name: str
    layout_source: str
    layout_detail: str
    engine: str
    device: str
    context: int
    tp: int
    step: dict[str, float]  # a plain decode step, bytes per device by component
    spec: SpecModel | None
    bandwidth: Bandwidth
    rules: list[str]
    moe: dict[str, Any] | None = None  # routed experts: E, k, MoE layers
    notes: list[str] = field(default_factory=list)

    @property
    def step_bytes(self) -> float:
        return sum(self.step.values())

    def tok_s(self, accept: float | None = None) -> float | None:
        """The bound in tok/s: plain decoding (accept None), or speculative at `accept`."""
        if self.bandwidth.gb_s is None:
            return None
        bandwidth = self.bandwidth.gb_s * 1e9
        if accept is None or self.spec is None:
            return bandwidth / self.step_bytes
        return accept * bandwidth / self.spec.cycle_bytes(accept)

    def step_time_ms(self, accept: float | None = None) -> float | None:
        """The bound on one step (a speculative cycle when `accept` is given), in ms."""
        if self.bandwidth.gb_s is None:
            return None
        nbytes = self.spec.cycle_bytes(accept) if accept is not None and self.spec else self.step_bytes
        return nbytes / (self.bandwidth.gb_s * 1e9) * 1e3

    def cycle_ratio(self, accept: float) -> float | None:
        """A speculative cycle's bytes over a plain step's."""
        return self.spec.cycle_bytes(accept) / self.step_bytes if self.spec else None

    def break_even_accept(self) -> float | None:
        """The accept length above which speculative decoding beats plain decoding (None when it
        cannot: even with every draft accepted the cycle costs more)."""
        if self.spec is None:
            return None
        accept = 1.0
        for _ in range(50):  # fixed point of accept = cycle(accept) / step; the cycle grows slowly with accept
            nxt = self.spec.cycle_bytes(accept) / self.step_bytes
            if abs(nxt - accept) < 1e-9:
                break
            accept = nxt
        return accept if accept <= self.spec.verify_tokens else None

    def to_dict(self, accepts: list[float] | None = None) -> dict[str, Any]:
        bandwidth = self.bandwidth.to_dict()
        doc: dict[str, Any] = {
            "recipe": self.recipe_name, "model": self.model,
            "layout": {"name": self.layout_name, "source": self.layout_source, "detail": self.layout_detail},
            "engine": self.engine, "device": self.device, "context_tokens": self.context, "tp": self.tp,
            "read_rules": self.rules,
            "step_bytes": self.step_bytes, "step_bytes_by_component": _labelled(self.step),
            "bandwidth": bandwidth,
            "limit_tok_s": self.tok_s(), "step_time_ms_at_limit": self.step_time_ms(),
            "routed_experts": self.moe,
            "speculative": None, "notes": self.notes,
        }
        if self.spec is not None:
            grid = accepts or accept_grid(self.spec.verify_tokens)
            doc["speculative"] = {
                "method": self.spec.method, "label": self.spec.label, "verify_tokens": self.spec.verify_tokens,
                "draft_forwards_per_cycle": (self.spec.chained_forwards + (1 if self.spec.extend else 0)
                                             if self.spec.draft_counted else 0),
                "verify_bytes": sum(self.spec.verify.values()), "verify_bytes_by_component": _labelled(self.spec.verify),
                "draft_forward_bytes": sum(self.spec.chained.values()) if self.spec.chained else None,
                "draft_counted": self.spec.draft_counted,
                "break_even_accept_length": self.break_even_accept(),
                "verify_distinct_experts_per_layer": (
                    expected_distinct_experts(self.spec.verify_tokens, self.moe["num_experts"], self.moe["top_k"])
                    if self.moe else None),
                "by_accept_length": [
                    {"accept_length": a, "cycle_bytes": self.spec.cycle_bytes(a), "cycle_over_step": self.cycle_ratio(a),
                     "limit_tok_s": self.tok_s(a)} for a in grid],
                "notes": self.spec.notes,
            }
        return doc


def accept_grid(verify_tokens: int) -> list[float]:
    top = float(verify_tokens)
    grid, a = [], 1.0
    while a < top:
        grid.append(round(a, 2))
        a += 0.5
    return grid + [top]


def _labelled(parts: dict[str, float]) -> dict[str, float]:
    labels = dict(COMPONENTS)
    return {labels[k]: v for k, v in parts.items() if v}


# ---------------------------------------------------------------- from a recipe


class NoLayout(Exception):
    """No checkpoint and no declared profile: the reason, for the user."""


def resolve_layout(model_path: str, weights: str) -> ModelLayout:
    """The layout for a recipe's model: a local checkpoint's headers (a directory, sparkit's
    built-in tiny-ling, a hub model complete in the Hugging Face cache), else for a hub model its
    headers read from the hub by range requests (sparkit.hub.remote), else a declared profile."""
    if model_path.startswith("sparkit:"):
        parsed = parse_builtin_ref(model_path)
        if parsed is None:
            raise NoLayout(f"{model_path!r} is not a built-in model")
        shipped = builtin_model_dir(parsed.name, 0)
        if parsed.weights not in (None, "bf16"):
            return _export_layout(shipped, parsed, model_path)
        layout = layout_from_checkpoint(shipped, name=parsed.name)
        if model_path != f"sparkit:{parsed.name}":
            layout.notes.append(f"{model_path}: the shipped {parsed.name} build's headers (another build has the same shapes)")
        return layout
    location = locate(model_path)
    if location.readable:
        local = Path(location.directory)
        if (local / "config.json").is_file() and not safetensors_files(local):  # what --load-format dummy serves

            return config_only_layout(local)
        return layout_from_checkpoint(local, name=location.hub.repo if location.hub else None)
    hub_problem = ""
    if location.hub is not None:
        try:
            remote = remote_checkpoint(location.hub)
        except HubError as exc:
            hub_problem = f" (its headers cannot be read from the hub: {exc.message})"
        else:
            return layout_from_tensors({t.name: t for t in remote.tensors}, remote.config, name=location.hub.repo,
                                       source="checkpoint", source_detail=remote.source)
    profile = find_profile(model_path)
    if profile is not None:
        return _cached_declared(profile.family, weights)
    raise NoLayout(f"{model_path}: not a local checkpoint, not in the Hugging Face cache{hub_problem}, and sparkit "
                   "declares no profile for it")


def _export_layout(shipped: Path, parsed: Any, model_path: str) -> ModelLayout:
    """A built-in model's quantised export: its headers once written, else the tensors the
    exporter will write (its family's hf_tensor_inventory of the shipped build's config)."""
    import json
    import types

    name = f"{parsed.name}@{parsed.weights} ({LAYOUTS[parsed.weights].title})"
    export = hf_export_dir(shipped, "bfloat16", parsed.weights, parsed.damaged_scale)
    if is_export(export, weights=parsed.weights):
        return layout_from_checkpoint(export, name=name)
    try:
        hf_format = family(parsed.name).hf_format()
        cfg = types.SimpleNamespace(**json.loads((shipped / "config.json").read_text()))
        tensors = hf_format.hf_tensor_inventory(cfg, parsed.weights)
        config = {**hf_format.hf_config(cfg), "quantization_config": sglang_quantization_config(parsed.weights)}
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as exc:
        raise NoLayout(f"{model_path}: cannot read the shipped build's config.json ({exc})") from None
    layout = layout_from_tensors(tensor_infos(tensors), config, name=name, source="declared export",
                                 source_detail=f"the tensors `sparkit model export-hf --weights {parsed.weights}` writes "
                                               f"from {shipped} (not written yet: {export})")
    if model_path != f"sparkit:{parsed.name}@{parsed.weights}":
        layout.notes.append(f"{model_path}: the shipped {parsed.name} build's shapes (another build has the same)")
    return layout


_DECLARED: dict[tuple[str, str], ModelLayout] = {}


def _cached_declared(family: str, weights: str) -> ModelLayout:
    """A declared profile's layout: built once (Ling-3.0-flash declares ~128k tensors, seconds of
    grouping) and kept in the cache directory, keyed on the code that builds it."""
    key = (family, weights)
    if key not in _DECLARED:
        path = _declared_cache_path(family, weights)
        layout = _read_layout(path)
        if layout is None:
            profile = next(p for p in PROFILES if p.family == family)
            layout = declared_layout(profile, weights)
            _write_layout(path, layout)
        _DECLARED[key] = layout
    return _DECLARED[key]


def _declared_cache_path(family: str, weights: str) -> Path:
    """Where a declared layout is kept: its name holds the hash of the modules that compute it, so
    a change of the profile or of the grouping is a new file, never a stale answer."""
    import hashlib

    digest = hashlib.sha256(f"{__version__}\0{family}\0{weights}".encode())
    for module in (sparkit.roofline.profiles, sparkit.roofline.layout, sparkit.checkpoint_headers):
        digest.update(Path(module.__file__).read_bytes())
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in f"{family}-{weights}")
    return cache_dir() / "roofline" / f"{safe}-{digest.hexdigest()[:16]}.json"


def _read_layout(path: Path) -> ModelLayout | None:
    import json

    try:
        return layout_from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not kept yet, or unreadable: build it


def _write_layout(path: Path, layout: ModelLayout) -> None:
    import json

    try:
        ensure_dir(path.parent)
        write_atomic(path, json.dumps(layout_to_dict(layout)))
    except OSError:
        pass  # a read-only cache costs speed, not the answer


def plan_device(recipe: Any, host: Any) -> str:
    """Where the recipe's engine computes: an engine that needs a GPU on GPUs; another on CPU for
    target cpu, on the GPU for a GPU target, and for `auto` on whatever this host has."""
    if get_adapter(recipe.engine).needs_gpu:
        return "gpu"
    if recipe.target == "cpu":
        return "cpu"
    if recipe.target == "auto":
        return "gpu" if host.gpus else "cpu"
    return "gpu"


def default_context(layout: ModelLayout, recipe: Any) -> int:
    limits = [v for v in (layout.max_context, recipe.model.context_length) if v]
    return min([DEFAULT_CONTEXT, *limits])


def estimate(recipe: Any, *, recipe_name: str = "", context: int | None = None, host: Any | None = None,
             bandwidth: Bandwidth | None = None, layout: ModelLayout | None = None) -> Roofline:
    """The roofline of `recipe` (a validated sparkit.recipes.schema.Recipe). Raises NoLayout when
    nothing describes the model; DataError for an unreadable checkpoint."""
    host = host if host is not None else detect_host()
    layout = layout or resolve_layout(recipe.model.path, recipe.stack.weights)
    device = plan_device(recipe, host)
    rules = read_rules(recipe, layout, device)
    ctx = context if context is not None else default_context(layout, recipe)
    step = forward_bytes(layout, rules, layout.target_layers, 1, ctx)
    notes = list(layout.notes)
    spec = _spec_model(recipe, layout, rules, ctx, notes)
    bw = bandwidth or resolve_bandwidth(recipe.target, device, rules.tp, host, recipe.target_gpu)
    moe_layers = [layer.experts for layer in layout.target_layers if layer.experts is not None]
    moe = ({"num_experts": moe_layers[0].num_experts, "top_k": moe_layers[0].top_k, "moe_layers": len(moe_layers)}
           if moe_layers else None)
    if recipe.engine == "sglang" and device == "gpu" and bw.gb_s:
        notes.append(_host_term_note(sum(step.values()), bw.gb_s))
    return Roofline(
        recipe_name=recipe_name, model=recipe.model.path, layout_name=layout.name, layout_source=layout.source,
        layout_detail=layout.source_detail, engine=recipe.engine, device=device, context=ctx, tp=rules.tp,
        step=step, spec=spec, bandwidth=bw, rules=rules.explained, moe=moe, notes=notes,
    )


def _host_term_note(step_bytes: float, gb_s: float) -> str:
    """What the bound leaves out: SGLang's fixed per-step host cost (measured, not modelled)."""
    host = H200_HOST_STEP
    share = host.share_of_step(step_bytes, gb_s)
    with_host = 1000.0 / (step_bytes / (gb_s * 1e9) * 1000.0 + host.fixed_ms)
    return (f"{HOST_TERM_PREFIX} SGLang's fixed host cost a decode step, {host.fixed_ms:.2f} ms measured on an H200 at "
            f"Ling-3.0-flash's widths ({host.source}); added to this step's reads it is {share:.1%} of the step: "
            f"{with_host:.1f} tok/s plain")


def _spec_model(recipe: Any, layout: ModelLayout, rules: ReadRules, ctx: int, notes: list[str]) -> SpecModel | None:
    spec = recipe.stack.speculative
    if not spec.enabled:
        return None
    if spec.method == "nextn":
        steps = spec.num_steps or SPECULATIVE_DEFAULTS["num_steps"]  # SGLang's default for Bailing when none is given
        n = spec.num_draft_tokens or chain_draft_tokens(steps)
        label = f"NEXTN {steps}/{spec.eagle_topk or 1}/{n}"
        verify = forward_bytes(layout, rules, layout.target_layers, n, ctx, verify=True)
        mtp = layout.mtp_layers
        draft_notes = []
        if spec.draft_model and not spec.draft_model.startswith("sparkit:"):
            try:
                draft_layout = resolve_layout(spec.draft_model, recipe.stack.weights)
                mtp = draft_layout.mtp_layers
            except Exception as exc:  # noqa: BLE001 - a draft we cannot read is a note, not a failure
                mtp = []
                draft_notes.append(f"draft model {spec.draft_model}: {exc}")
        if not mtp:
            return SpecModel("nextn", label, n, verify, None, 0,
                             notes=draft_notes + ["no NextN layer found: the draft's reads are not counted"])

        def draft(tokens: float) -> dict[str, float]:
            return forward_bytes(layout, rules, mtp, tokens, ctx, with_final=False)

        return SpecModel("nextn", label, n, verify, draft(1), steps - 1, extend=draft, notes=draft_notes)
    return _dspark_model(recipe, layout, rules, ctx)


def _draft_dir(draft_model: str) -> Path | None:
    """The directory a DSpark draft is read from here: a built-in draft's build (the shipped one when
    its own is not built: the same layout), a local directory; None otherwise."""
    if draft_model.startswith("sparkit:"):
        name = draft_model.split(":")[1]
        if name not in BUILTIN_DRAFTS:
            return None
        built = builtin_draft_dir(name)
        return built if (built / "config.json").is_file() else None
    path = Path(draft_model).expanduser()
    return path if (path / "config.json").is_file() else None


def _dspark_draft_reads(draft_dir: Path, rules: ReadRules, ctx: int) -> tuple[dict[str, float], int | None, str]:
    """(a DSpark cycle's draft reads by component, the draft's block size, a note): every draft weight
    once (one forward drafts the whole block), its context K/V at `ctx`, and the target's lm_head
    once more for the block's base logits (the draft shares it)."""
    config = load_config(draft_dir)
    tensors = read_safetensors_index(draft_dir).tensors.values()
    weights = sum(t.numel * rules.float_bytes if rules.float_bytes else t.nbytes for t in tensors)
    kv = config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * rules.kv_bytes * ctx
    note = (f"draft {draft_dir.name}: {weights / 1e6:.2f} MB of weights and its context K/V "
            f"({config.num_hidden_layers} layers at {ctx} tokens) once per cycle, plus the shared lm_head once")
    return {"other": weights / rules.tp, "kv_cache": kv / rules.tp}, config.block_size, note


def _dspark_model(recipe: Any, layout: ModelLayout, rules: ReadRules, ctx: int) -> SpecModel:
    """DSpark: a block draft (one forward per cycle) verified in one target forward over the anchor
    and its block_size drafts."""
    spec = recipe.stack.speculative
    notes_spec: list[str] = []
    block, chained = None, None
    draft_dir = _draft_dir(spec.draft_model or "")
    if draft_dir is None:
        try:
            draft_layout = resolve_layout(spec.draft_model or "", "bf16")
            block = draft_layout.config.get("block_size")
            chained = {"other": draft_layout.total_stored_bytes / rules.tp}
            notes_spec.append(f"draft {spec.draft_model}: all of its weights counted once per cycle")
        except Exception:  # noqa: BLE001 - a draft we cannot read is a note, not a failure
            notes_spec.append(f"draft {spec.draft_model}: not local, its reads are not counted (the bound is optimistic)")
    else:
        chained, block, note = _dspark_draft_reads(draft_dir, rules, ctx)
        head, rescore = lm_head_bytes(layout, rules, spec.block_size or block or 1)
        chained["lm_head"] = head
        chained["lm_head_rescore"] = rescore
        notes_spec.append(note)
    block = spec.block_size or block
    if not isinstance(block, int):
        block = UNKNOWN_DRAFT_BLOCK_SIZE
        notes_spec.append(f"blocks of {block} tokens (the TP4 study's measured DSpark draft; the published "
                          "checkpoint uses block_size 8)")
    verify = forward_bytes(layout, rules, layout.target_layers, block + 1, ctx, verify=True)
    return SpecModel("dspark", f"DSpark block {block} (verify {block + 1})", block + 1, verify, chained, 1,
                     notes=notes_spec)


def roofline_document(recipe: Any, *, recipe_name: str = "", context: int | None = None,
                      accepts: list[float] | None = None, host: Any | None = None) -> dict[str, Any]:
    """estimate(...).to_dict(), or {"error": why} when the model cannot be described: a plan or a
    bench never fails over its roofline."""
    try:
        return estimate(recipe, recipe_name=recipe_name, context=context, host=host).to_dict(accepts)
    except NoLayout as exc:
        return {"error": str(exc)}
    except SparkitError as exc:
        return {"error": exc.message}
    except (ValueError, KeyError, TypeError) as exc:
        return {"error": f"cannot describe the model's decode step ({type(exc).__name__}: {exc})"}


__all__ = ["Roofline", "SpecModel", "ReadRules", "estimate", "roofline_document", "resolve_layout",
           "expected_distinct_experts", "forward_bytes", "read_rules", "NoLayout", "DEFAULT_CONTEXT", "COMPONENTS",
           "accept_grid"]
