"""Where a decode step's time goes, from a torch.profiler trace (Chrome trace JSON, gzipped or not).

SGLang's `/start_profile` (and the embedded engine's, which speaks the same request) writes
`{profile_id}-TP-{rank}.trace.json.gz` with torch.profiler's export_chrome_trace. Each forward
pass is a CPU span named `step[DECODE bs=1]` (`step[EXTEND ...]`, `step[VERIFY ...]`, `step[DRAFT ...]`;
sglang/srt/utils/profile_utils.py build_step_span_name). The device's work is its kernels (`cat`
"kernel", memcpy, memset); each carries the `correlation` id of the CPU call that launched it
(a cudaLaunchKernel, or one cudaGraphLaunch for all the kernels of a CUDA-graph replay), and that
call sits inside a step span, or between two (sampling runs after the forward, outside its span).
A CPU-only trace (the embedded engine on a CPU) has no kernels: its top-level CPU ops are the work.

Per decode step (the time from one step's first kernel to the next one's): kernel time by
category, the device's busy time and the gaps between kernels (where the GPU waits for the host).
A kernel's category comes from, in order: a user annotation around it naming a category (the
embedded engine marks `lm_head` and `sampling`), its name (KDA, MLA, MoE, the FP8 head, norms,
sampling, GEMM, element-wise), and for a generic kernel (a GEMM, a norm, a copy) its place in the
forward: the block it sits in between two residual norms (an attention block holds KDA or MLA
kernels, a MoE block MoE kernels, a dense MLP block an activation), and after the last layer the
lm_head (the largest GEMM) and logits processing. Work launched outside the forward's span is
"outside the forward" unless its name says more (argmax: sampling). The per-kernel table comes
with the summary so that a wrong guess can be seen.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sparkit.errors import DataError

# Categories, in display order, with their labels.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("kda_attention", "KDA attention (linear)"),
    ("mla_attention", "MLA attention"),
    ("attention", "attention (other)"),
    ("moe", "MoE (router, experts)"),
    ("dense_mlp", "dense MLP"),
    ("lm_head", "lm_head"),
    ("logits", "logits processing"),
    ("sampling", "sampling"),
    ("draft", "NextN draft steps"),
    ("norm", "norms"),
    ("outside_forward", "outside the forward (other)"),
    ("other", "other kernels"),
    ("gaps", "gaps between kernels"),
)
LABELS = dict(CATEGORIES)
_ANNOTATION_CATEGORIES = {"lm_head": "lm_head", "logits": "logits", "sampling": "sampling", "attention": "attention",
                          "kda": "kda_attention", "mla": "mla_attention", "moe": "moe", "dense_mlp": "dense_mlp"}
# Kernel names that say what they are (matched lower-case, first match wins).
_NAMED: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("lm_head", re.compile(r"fp8_(?:dot|cc|tma|packed|ccr|stream)_kernel|_rescore_kernel|prescale_rows|split_rows_fp8|row_exponent|"
                         r"fold_tile_keys|lm_head")),
    ("kda_attention", re.compile(r"kda|(?<![a-z])gla|delta_rule|fused_recurrent|causal_conv1d|conv1d_update|short_conv|"
                                 r"chunk_(?:fwd|bwd|local|scaled)|l2norm|mamba|ssm|gated_delta")),
    ("mla_attention", re.compile(r"mla|_fwd_grouped_kernel|_fwd_kernel_stage|decode_attention")),
    ("moe", re.compile(r"moe|expert|grouped_topk|biased_grouped|topk_softmax|align_block|count_and_sort|"
                       r"router|gate_matvec|routing")),
    # before attention: flashinfer's FusedAddRMSNorm is a norm (the blocks' separator), not attention
    ("norm", re.compile(r"rms_?norm|layer_?norm|norm_kernel")),
    ("attention", re.compile(r"attention|flash_?attn|flashinfer|rotary|rope|sdpa")),
    ("sampling", re.compile(r"argmax|argmin|multinomial|top_?k_top_?p|top_p|sampl|softmax|cumsum|radix_sort|"
                            r"sort_kernel|exponential")),
)
_ACTIVATION = re.compile(r"silu|gelu|act_and_mul|swiglu|_and_mul")
_GEMM = re.compile(r"gemm|gemv|nvjet|cutlass|xmma|cublas|matmul|splitk|sm\d\d_|ampere|hopper|wgmma|addmm|aten::mm|"
                   r"aten::linear|aten::addmm|aten::bmm")
_GATED_NORM = re.compile(r"gate|gated")  # KDA's output norm sits inside its attention block
_STEP = re.compile(r"^step\[(?P<stage>[A-Z_]+)(?: bs=(?P<bs>\d+))?")
_DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


@dataclass
class Kernel:
    name: str
    ts: float  # us
    dur: float
    correlation: int | None
    category: str = "other"
    step: int | None = None  # index of the step whose span launched it
    outside: bool = False  # launched outside any step span


@dataclass
class StepBreakdown:
    stage: str
    batch_size: int | None
    steps: int  # how many steps were summarised
    step_us: dict[str, float]  # median, mean, min, max of the step's period
    busy_us: float  # median time the device was busy in a step
    gaps_us: float  # median time it was idle
    categories: dict[str, dict[str, float]]  # category -> us_per_step, share of the step
    kernels: list[dict[str, Any]]  # top kernels: name, category, per_step, us_per_step, mean_us
    kernels_per_step: float
    source: str  # "gpu kernels" | "cpu ops (no device events in the trace)"
    left_out: int = 0  # steps over 3x the median period, not summarised (the profiler starting, a stall)
    trace: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_trace(path: str | Path) -> dict[str, Any]:
    """A Chrome trace JSON file (gzipped or not), as torch.profiler writes it. DataError when not."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read the trace ({exc.strerror or exc})") from None
    try:
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw.decode("utf-8"))
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: not a Chrome trace JSON file ({exc})") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise DataError(f"{path}: no traceEvents list (not a torch.profiler trace)")
    return doc


def _complete(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))
            and isinstance(e.get("dur"), (int, float))]


def _named_category(name: str) -> str | None:
    low = name.lower()
    for category, pattern in _NAMED:
        if pattern.search(low):
            return category
    return None


def _is_generic(k: Kernel) -> bool:
    return k.category in ("other", "norm")


_ATTENTION_KINDS = ("kda_attention", "mla_attention", "attention")


def _assign_blocks(kernels: list[Kernel]) -> None:
    """Within one forward, give generic kernels the category of their block (see the module
    docstring). Blocks are delimited by the norms that are not a gated (KDA output) norm. A block
    of generic kernels only (a GEMM after MLA's kv_a_layernorm or KDA's output norm, the projections
    before an attention) belongs to the attention after it when it follows an MLP, else to the block
    before it; after the final norm come the lm_head (the largest GEMM) and logits processing."""
    separators = {i for i, k in enumerate(kernels) if k.category == "norm" and not _GATED_NORM.search(k.name.lower())}
    bounds = [0, *sorted(separators), len(kernels)]
    blocks = []
    for j in range(len(bounds) - 1):
        lo, hi = bounds[j], bounds[j + 1]
        if hi <= lo:
            continue
        body = kernels[lo + 1:hi] if lo in separators else kernels[lo:hi]
        named = [k.category for k in body if not _is_generic(k)]
        specific = [c for c in named if c != "attention"] or named  # rope, flash kernels: the block's kind
        kind = max(set(specific), key=specific.count) if specific else None
        if kind is None and any(_ACTIVATION.search(k.name.lower()) for k in body):
            kind = "dense_mlp"
        blocks.append([body, kind])
    if len(blocks) > 1 and blocks[-1][1] is None:  # after the final norm: the head's GEMM, then logits
        gemms = [k for k in blocks[-1][0] if _GEMM.search(k.name.lower())]
        if gemms:
            max(gemms, key=lambda k: k.dur).category = "lm_head"
            blocks[-1][1] = "lm_head"
    for n, block in enumerate(blocks):
        if block[1] is not None:
            continue
        before = next((b[1] for b in reversed(blocks[:n]) if b[1] is not None), None)
        after = next((b[1] for b in blocks[n + 1:] if b[1] is not None), None)
        if after in _ATTENTION_KINDS and before not in _ATTENTION_KINDS:
            block[1] = after
        else:
            block[1] = before or after or "other"
    for body, kind in blocks:
        if kind == "lm_head" or any(k.category == "lm_head" for k in body):
            first = next((i for i, k in enumerate(body) if k.category == "lm_head"), len(body))
            for i, k in enumerate(body):
                if _is_generic(k):
                    k.category = "logits" if i > first else (kind if kind != "lm_head" else "logits")
            continue
        for k in body:
            if _is_generic(k) or (k.category == "attention" and kind in ("kda_attention", "mla_attention")):
                k.category = kind


def _steps(events: list[dict[str, Any]]) -> list[tuple[float, float, str, int | None]]:
    spans = []
    for e in events:
        if e.get("cat") == "user_annotation" and (m := _STEP.match(str(e.get("name", "")))):
            spans.append((float(e["ts"]), float(e["ts"] + e["dur"]), m.group("stage"),
                          int(m.group("bs")) if m.group("bs") else None))
    return sorted(spans)


def summarise(doc: dict[str, Any], *, stage: str | None = None, top: int = 15, trace: str = "") -> StepBreakdown:
    """The breakdown of the trace's `stage` steps (DECODE: plain decoding; VERIFY with NEXTN; None:
    DECODE, or VERIFY for a trace of a server that decodes speculatively and so has no DECODE step)."""
    events = _complete(doc["traceEvents"])
    spans = _steps(events)
    if not spans:
        raise DataError(f"{trace or 'the trace'}: no step spans (`step[DECODE bs=1]`): not a trace of an engine's "
                        "forward passes (profile while requests decode)")
    step_of = _step_locator(spans)
    notes: list[str] = []
    if any(e.get("cat") in _DEVICE_CATS for e in events):
        source = "gpu kernels"
        kernels, annotations = _device_kernels(events, step_of)
    else:
        source = "cpu ops (no device events in the trace)"
        kernels, annotations = _cpu_kernels(events, step_of)
    _categorise(kernels, annotations)

    if stage is None:
        have_stages = {s[2] for s in spans}
        stage = "VERIFY" if "DECODE" not in have_stages and "VERIFY" in have_stages else "DECODE"
    wanted = [i for i, s in enumerate(spans) if s[2] == stage]
    if not wanted:
        have = sorted({s[2] for s in spans})
        raise DataError(f"{trace or 'the trace'}: no {stage} steps (it has {', '.join(have)})")
    cycles = _cycles(kernels, spans, wanted, stage)
    if not cycles.periods:
        raise DataError(f"{trace or 'the trace'}: {len(wanted)} {stage} step(s) but none followed by another step: "
                        "profile more steps")
    median_period = statistics.median(cycles.periods)
    left_out = cycles.drop_outliers(kernels, wanted, 3 * median_period)
    if left_out:
        notes.append(f"{left_out} step(s) over 3x the median left out (the profiler starting, a "
                     "prefill's tail)")
    periods, n = cycles.periods, len(cycles.periods)
    categories = {}
    for key, _label in CATEGORIES:
        values = [c.get(key, 0.0) for c in cycles.per_cat]
        total = sum(values) / n
        if total > 0:
            categories[key] = {"us_per_step": round(total, 2), "share": round(total / statistics.mean(periods), 4)}
    rows = []
    for (name, category), durs in cycles.kernel_time.items():
        rows.append({"name": name, "category": category, "per_step": round(len(durs) / n, 2),
                     "us_per_step": round(sum(durs) / n, 2), "mean_us": round(sum(durs) / len(durs), 2)})
    rows.sort(key=lambda r: -r["us_per_step"])
    batch = next((spans[i][3] for i in wanted), None)
    if source.startswith("cpu"):
        notes.append("a CPU trace: the ops' own time, one thread; `gaps` is time outside the top-level ops")
    return StepBreakdown(
        stage=stage, batch_size=batch, steps=n,
        step_us={"median": round(median_period, 2), "mean": round(statistics.mean(periods), 2),
                 "min": round(min(periods), 2), "max": round(max(periods), 2)},
        busy_us=round(statistics.median(cycles.busy), 2),
        gaps_us=round(statistics.median(p - b for p, b in zip(periods, cycles.busy)), 2),
        categories=categories, kernels=rows[:top], kernels_per_step=round(sum(cycles.count) / n, 1), source=source,
        left_out=left_out, trace=trace, notes=notes,
    )


_Spans = list[tuple[float, float, str, int | None]]


def _step_locator(spans: _Spans) -> Callable[[float], tuple[int | None, bool]]:
    """ts -> (the index of the last step span starting at or before it, whether ts is past its end)."""
    starts = [s[0] for s in spans]

    def step_of(ts: float) -> tuple[int | None, bool]:
        i = bisect_right(starts, ts) - 1
        if i < 0:
            return None, True
        return i, ts > spans[i][1]

    return step_of


def _device_kernels(events: list[dict[str, Any]], step_of: Callable[[float], tuple[int | None, bool]]
                    ) -> tuple[list[Kernel], list[dict[str, Any]]]:
    """A GPU trace's kernels, each in the step its launch falls in and named by its kernel's name or
    else the CPU op that launched it; and the trace's GPU annotations."""
    launches: dict[int, float] = {}
    launch_op: dict[int, str] = {}
    cpu_ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver", "runtime"):
            corr = (e.get("args") or {}).get("correlation")
            if isinstance(corr, int):
                launches[corr] = float(e["ts"])
    op_starts = [float(e["ts"]) for e in cpu_ops]
    for corr, ts in launches.items():
        i = bisect_right(op_starts, ts) - 1
        while i >= 0 and cpu_ops[i]["ts"] + cpu_ops[i]["dur"] < ts:
            i -= 1
        if i >= 0:
            launch_op[corr] = str(cpu_ops[i].get("name", ""))
    kernels: list[Kernel] = []
    for e in sorted((e for e in events if e.get("cat") in _DEVICE_CATS), key=lambda e: e["ts"]):
        corr = (e.get("args") or {}).get("correlation")
        k = Kernel(str(e.get("name", "")), float(e["ts"]), float(e["dur"]), corr if isinstance(corr, int) else None)
        launched = launches.get(k.correlation) if k.correlation is not None else None
        if launched is None:
            k.step, k.outside = step_of(k.ts)  # no launch event: place it by its own time
        else:
            k.step, k.outside = step_of(launched)
        launcher = launch_op.get(k.correlation, "") if k.correlation is not None else ""
        k.category = _named_category(k.name) or _named_category(launcher) or "other"
        kernels.append(k)
    annotations = [e for e in events if e.get("cat") == "gpu_user_annotation"
                   and str(e.get("name", "")).lower() in _ANNOTATION_CATEGORIES]
    return kernels, annotations


def _cpu_kernels(events: list[dict[str, Any]], step_of: Callable[[float], tuple[int | None, bool]]
                 ) -> tuple[list[Kernel], list[dict[str, Any]]]:
    """A CPU trace's top-level ops on the threads that run steps (a child's time is in its
    parent's); and the trace's annotations."""
    kernels: list[Kernel] = []
    threads = {(e.get("pid"), e.get("tid")) for e in events
               if e.get("cat") == "user_annotation" and _STEP.match(str(e.get("name", "")))}
    ops = sorted((e for e in events if e.get("cat") == "cpu_op" and (e.get("pid"), e.get("tid")) in threads),
                 key=lambda e: (e["ts"], -e["dur"]))
    end = -1.0
    for e in ops:  # top-level ops only: a child's time is in its parent's
        if e["ts"] >= end:
            k = Kernel(str(e.get("name", "")), float(e["ts"]), float(e["dur"]), None)
            k.step, k.outside = step_of(k.ts)
            k.category = _named_category(k.name) or "other"
            kernels.append(k)
            end = e["ts"] + e["dur"]
    annotations = [e for e in events if e.get("cat") == "user_annotation"
                   and str(e.get("name", "")).lower() in _ANNOTATION_CATEGORIES]
    return kernels, annotations


def _categorise(kernels: list[Kernel], annotations: list[dict[str, Any]]) -> None:
    """Explicit annotations win; then the block rules within each forward; outside it, what names
    do not say is "outside the forward"."""
    for a in annotations:
        category = _ANNOTATION_CATEGORIES[str(a["name"]).lower()]
        lo, hi = float(a["ts"]), float(a["ts"] + a["dur"])
        for k in kernels:
            if lo <= k.ts < hi:
                k.category = category
                k.outside = False if category not in ("sampling",) else k.outside
    by_step: dict[int, list[Kernel]] = {}
    for k in kernels:
        if k.step is not None and not k.outside:
            by_step.setdefault(k.step, []).append(k)
    for members in by_step.values():
        _assign_blocks(members)
    for k in kernels:
        if k.outside and k.category in ("other", "norm"):
            k.category = "outside_forward"


@dataclass
class _Cycles:
    """One entry per measured cycle of the wanted stage: its period, busy time, time per category,
    kernel count and step index; and each (kernel, category)'s durations over the cycles."""

    periods: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    per_cat: list[dict[str, float]] = field(default_factory=list)
    count: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    kernel_time: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def drop_outliers(self, kernels: list[Kernel], wanted: list[int], bound: float) -> int:
        """Leave out the cycles longer than `bound`; how many were left out."""
        keep = [j for j, period in enumerate(self.periods) if period <= bound]
        left_out = len(self.periods) - len(keep)
        if not left_out:
            return 0
        self.periods = [self.periods[j] for j in keep]
        self.busy = [self.busy[j] for j in keep]
        self.per_cat = [self.per_cat[j] for j in keep]
        self.count = [self.count[j] for j in keep]
        self.steps = [self.steps[j] for j in keep]
        self.kernel_time = {}
        for i in self.steps:
            following = wanted[wanted.index(i) + 1]
            for k in kernels:
                if k.step is not None and i <= k.step < following:
                    self.kernel_time.setdefault((k.name, k.category), []).append(k.dur)
        return left_out


def _cycles(kernels: list[Kernel], spans: _Spans, wanted: list[int], stage: str) -> _Cycles:
    """A step's period runs from its first kernel to the next step of the same stage's first kernel
    (a NEXTN cycle: a verify step and the draft steps after it); the last has no successor and is
    left out; the kernels of other stages' steps in between count as "draft"."""
    first_of: dict[int, float] = {}
    for k in kernels:
        if k.step is not None:
            first_of[k.step] = min(first_of.get(k.step, k.ts), k.ts)
    for k in kernels:
        if k.step is not None and spans[k.step][2] != stage:
            k.category = "draft" if spans[k.step][2] == "DRAFT" else k.category
    cycles = _Cycles()
    for n_, i in enumerate(wanted):
        following = wanted[n_ + 1] if n_ + 1 < len(wanted) else None
        if i not in first_of or following is None or following not in first_of:
            continue
        if any(spans[j][2] not in (stage, "DRAFT") for j in range(i + 1, following)):
            continue  # a prefill or another request's step in between: not one cycle
        cycles.steps.append(i)
        lo, hi = first_of[i], first_of[following]
        members = [k for k in kernels if k.step is not None and i <= k.step < following]
        period = hi - lo
        intervals = sorted((max(k.ts, lo), min(k.ts + k.dur, hi)) for k in members if k.ts < hi)
        covered, cursor = 0.0, lo
        for a, b in intervals:
            if b <= cursor:
                continue
            covered += b - max(a, cursor)
            cursor = b
        cycles.periods.append(period)
        cycles.busy.append(covered)
        cats: dict[str, float] = {}
        for k in members:
            cats[k.category] = cats.get(k.category, 0.0) + k.dur
            cycles.kernel_time.setdefault((k.name, k.category), []).append(k.dur)
        cats["gaps"] = max(0.0, period - covered)
        cycles.per_cat.append(cats)
        cycles.count.append(len(members))
    return cycles


def summarise_file(path: str | Path, *, stage: str | None = None, top: int = 15) -> StepBreakdown:
    return summarise(load_trace(path), stage=stage, top=top, trace=str(path))


def compare(a: StepBreakdown, b: StepBreakdown) -> list[dict[str, Any]]:
    """Category by category, b - a in us per step (what one variant spends beyond the other)."""
    out = []
    for key, label in CATEGORIES:
        ua = a.categories.get(key, {}).get("us_per_step", 0.0)
        ub = b.categories.get(key, {}).get("us_per_step", 0.0)
        if ua or ub:
            out.append({"category": key, "label": label, "a_us": ua, "b_us": ub, "delta_us": round(ub - ua, 2)})
    out.append({"category": "step", "label": "step (median period)", "a_us": a.step_us["median"],
                "b_us": b.step_us["median"], "delta_us": round(b.step_us["median"] - a.step_us["median"], 2)})
    return out


def table(b: StepBreakdown) -> list[str]:
    """The breakdown as text lines (the CLI and the benchmark scripts print these)."""
    lines = [f"{b.stage} bs={b.batch_size}: {b.steps} steps from {b.source}; step {b.step_us['median']:.1f} us median "
             f"({b.step_us['min']:.1f}-{b.step_us['max']:.1f}), device busy {b.busy_us:.1f} us, gaps {b.gaps_us:.1f} us, "
             f"{b.kernels_per_step:g} kernels a step",
             f"  {'category':<30} {'us/step':>9} {'share':>7}"]
    for key, label in CATEGORIES:
        if key in b.categories:
            c = b.categories[key]
            lines.append(f"  {label:<30} {c['us_per_step']:>9.1f} {c['share']:>7.1%}")
    lines.append(f"  top kernels: {'us/step':>9} {'per step':>8}  category  name")
    for r in b.kernels:
        lines.append(f"  {'':<12} {r['us_per_step']:>9.1f} {r['per_step']:>8g}  {r['category']:<9} {r['name'][:90]}")
    lines.extend(f"  note: {n}" for n in b.notes)
    return lines


__all__ = ["StepBreakdown", "load_trace", "summarise", "summarise_file", "compare", "table", "CATEGORIES", "LABELS"]
