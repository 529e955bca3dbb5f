"""SGLang's log, read: the evidence lines the startup checks use, the startup phase shown while a
server starts (`detect_phase`, `phase_timeline`) and the diagnosis of a failed start
(`diagnose_failure`). The wording is SGLang 0.5.23's (docs/sglang-facts.md §5; the
patterns below quote what real servers wrote on an H200: tests/fixtures/sglang-0.5.23-h200); the
embedded engine writes the same lines, so one reader serves both adapters. What it returns
(LogEvidence, Diagnosis) is the contract's (sparkit.contract.log); the failures every engine shows
alike, and the driver that tries these patterns in order, are sparkit.engines.startup_log's.
Pure text -> data.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkit.contract.engine import STARTUP_PHASES as PHASES  # the seam's vocabulary of phases
from sparkit.contract.log import DecodeStat, Diagnosis, LogEvidence, WeightLoad
from sparkit.engines.startup_log import (
    BROKEN_CHECKPOINT,
    MISSING_MODEL,
    NOT_INSTALLED,
    OUT_OF_MEMORY,
    PORT_IN_USE,
    UNKNOWN_FLAG,
    DiagnosisPattern,
    diagnose,
)

# -- log line patterns (SGLang's wording; lines carry a "[time TPn] " prefix we ignore) --
_SERVER_ARGS = re.compile(r"server_args=(.*)$")
_LOAD_BEGIN = re.compile(r"Load weight begin\b")
_LOAD_END = re.compile(r"Load weight end\.\s*(?P<rest>.*)$")
_KV = re.compile(r"(?P<key>[A-Za-z_][\w ]*?)=(?P<value>[^,]*)")
_MIXED_MXFP4 = re.compile(r"Detected mixed checkpoint layout: routed experts are MXFP4")
_BAILING_MOE = re.compile(r"Bailing V3 mixed FP8/MXFP4 checkpoint: moe_runner_backend=(?P<backend>\w+)")
_HUMMING_GEMM = re.compile(r"Using (?P<gemm>\w+) gemm for humming moe")
_FP8_LM_HEAD = re.compile(r"Online FP8 quantization enabled for lm_head")
_GRAPH_BEGIN = re.compile(r"Capture (?P<what>.*?)(?:CUDA|cuda|CPU|cpu) graph begin", re.IGNORECASE)
_GRAPH_END = re.compile(r"Capture (?P<what>.*?)(?:CUDA|cuda|CPU|cpu) graph end", re.IGNORECASE)
_GRAPH_FAILED = re.compile(r"Capture (?:\w+ )?(?:cuda|CUDA|CPU|cpu) graph failed:?\s*(?P<why>.*)$")
_DECODE = re.compile(r"Decode batch\b.*?accept len: (?P<accept>[\d.]+)(?:, accept rate: (?P<rate>[\d.]+))?")
_DECODE_ANY = re.compile(r"Decode batch\b")
_GEN_TPUT = re.compile(r"gen throughput \(token/s\): (?P<tput>[\d.]+)")
_GRAPH_FLAG = re.compile(r"(?:cuda graph|cpu graph): (?P<flag>True|False)")
_READY = re.compile(r"The server is fired up and ready to roll")
_WARMUP = re.compile(r"Uvicorn running on|Application startup complete|Start(?:ing)? (?:the )?warm ?up\b", re.IGNORECASE)
_DRAFT_TOKENS_WARN = re.compile(r"speculative_num_draft_tokens.*(?:adjusted|changed|forced|overrid|set to)", re.IGNORECASE)
_OVERRIDING = re.compile(r"\boverriding\b|\bis changed to\b|\bhas been set to\b|\bforce(?:d|-disabled)\b", re.IGNORECASE)
# Settings SGLang rewrites and says so at INFO level, e.g. (0.5.23, speculative decoding on):
# "Max running requests is reset to 48 for speculative decoding. You can override this by ..."
_RESET = re.compile(r"\b(?:is|are) reset to\b", re.IGNORECASE)
# "Engine startup timings (s): load_weight=0.14, kv_cache_allocation=2.43, scheduler_e2e=84.40,
#  cuda_graph={prefill=56.11, decode=0.00, ...}, tokenizer_e2e=113.78" (SGLang 0.5.23)
_STARTUP_TIMINGS = re.compile(r"Engine startup timings \(s\):\s*(?P<rest>.*)$")
_TIMING_ITEM = re.compile(r"(?P<key>\w+)=(?:\{(?P<group>[^}]*)\}|(?P<value>[-\d.]+))")
# SGLang 0.5.23's memory lines (sizes in "GB" = GiB); sparkit.memory.sglang_pool predicts each figure.
_AVAIL = re.compile(r"avail mem=(?P<avail>-?[\d.]+) GB")
_MEM_USAGE = re.compile(r"mem usage=(?P<usage>-?[\d.]+) GB")
_MAMBA_ALLOC = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (?P<size>\d+), conv_state size: "
                          r"(?P<conv>[\d.]+)GB, ssm_state size: (?P<ssm>[\d.]+)GB(?: intermediate_ssm_state_cache size: "
                          r"(?P<issm>[\d.]+)GB intermediate_conv_window_cache size: (?P<iconv>[\d.]+)GB)?")
_KV_ALLOC = re.compile(r"KV Cache is allocated\. dtype: (?P<dtype>[\w.]+), #tokens: (?P<tokens>\d+), "
                       r"(?:KV size: (?P<kv>[\d.]+) GB|K size: (?P<k>[\d.]+) GB, V size: (?P<v>[\d.]+) GB)")
_POOL_END = re.compile(r"Memory pool end\. avail mem=(?P<avail>-?[\d.]+) GB")
_POOL_SUMMARY = re.compile(r"max_total_num_tokens=(?P<tokens>\d+), chunked_prefill_size=(?P<chunk>-?\d+), .*?"
                           r"max_running_requests=(?P<reqs>\d+), context_len=(?P<ctx>\d+), available_gpu_mem=(?P<avail>[\d.]+) GB")
_STATE_ERROR = re.compile(r"Not enough GPU memory for hybrid \(mamba/linear-attention\) state cache\. Computed "
                          r"max_mamba_cache_size=(?P<size>-?\d+) \(total_rest_memory=(?P<rest>-?[\d.]+) GB, "
                          r"mamba_cache_per_req=(?P<per>[\d.]+) MB\)")
_NO_KV_ERROR = re.compile(r"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=(?P<f>[\d.]+)")
_TIMESTAMP = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)")


@dataclass
class MemoryFigures:
    """What SGLang logged about its memory at start (GiB, as its "GB"), in the order it happened."""

    load_begin_avail_gb: list[float] = field(default_factory=list)  # one per model, "Load weight begin"
    loads: list[dict[str, Any]] = field(default_factory=list)  # model_class, avail_gb, mem_usage_gb
    mamba: dict[str, Any] | None = None  # max_mamba_cache_size, conv_gb, ssm_gb, intermediate_*_gb
    kv: list[dict[str, Any]] = field(default_factory=list)  # dtype, tokens, kv_gb (K + V for MHA)
    pool_end_avail_gb: list[float] = field(default_factory=list)
    summary: dict[str, Any] | None = None  # max_total_num_tokens, max_running_requests, context_len, available_gpu_mem_gb
    state_error: dict[str, Any] | None = None  # "Not enough GPU memory for hybrid ... state cache"
    no_kv_error: dict[str, Any] | None = None  # "Loaded weights leave no GPU memory for the KV cache"
    lines: list[str] = field(default_factory=list)

    @property
    def pre_model_load_gb(self) -> float | None:
        """The first "Load weight begin. avail mem": what SGLang measured before any weight (its
        pre_model_load_memory is taken just before, with nothing allocated in between)."""
        return self.load_begin_avail_gb[0] if self.load_begin_avail_gb else None

    @property
    def weights_gb(self) -> float:
        return round(sum(load["mem_usage_gb"] or 0.0 for load in self.loads), 2)

    @property
    def available_after_weights_gb(self) -> float | None:
        return self.loads[-1]["avail_gb"] if self.loads else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(pre_model_load_gb=self.pre_model_load_gb, weights_gb=self.weights_gb,
                   available_after_weights_gb=self.available_after_weights_gb)
        return out


def parse_memory(text: str) -> MemoryFigures:
    """SGLang's memory lines of a server log (sparkit.memory.sglang_pool predicts each figure)."""
    mem = MemoryFigures()
    for raw in text.splitlines():
        line = raw.strip()
        if "Load weight begin" in line and (m := _AVAIL.search(line)):
            mem.load_begin_avail_gb.append(float(m.group("avail")))
            mem.lines.append(line)
        elif m := _LOAD_END.search(line):
            load = parse_load_end(m.group("rest"), line)
            avail, usage = _AVAIL.search(line), _MEM_USAGE.search(line)
            mem.loads.append({"model_class": load.model_class, "avail_gb": float(avail.group("avail")) if avail else None,
                              "mem_usage_gb": float(usage.group("usage")) if usage else None})
            mem.lines.append(line)
        elif m := _MAMBA_ALLOC.search(line):
            mem.mamba = {"max_mamba_cache_size": int(m.group("size")), "conv_state_gb": float(m.group("conv")),
                         "ssm_state_gb": float(m.group("ssm")),
                         "intermediate_ssm_state_cache_gb": float(m.group("issm")) if m.group("issm") else None,
                         "intermediate_conv_window_cache_gb": float(m.group("iconv")) if m.group("iconv") else None}
            mem.lines.append(line)
        elif m := _KV_ALLOC.search(line):
            size = float(m.group("kv")) if m.group("kv") else float(m.group("k")) + float(m.group("v"))
            mem.kv.append({"dtype": m.group("dtype"), "tokens": int(m.group("tokens")), "kv_gb": round(size, 2)})
            mem.lines.append(line)
        elif m := _POOL_END.search(line):
            mem.pool_end_avail_gb.append(float(m.group("avail")))
            mem.lines.append(line)
        elif m := _POOL_SUMMARY.search(line):
            mem.summary = {"max_total_num_tokens": int(m.group("tokens")), "max_running_requests": int(m.group("reqs")),
                           "context_len": int(m.group("ctx")), "available_gpu_mem_gb": float(m.group("avail"))}
            mem.lines.append(line)
        elif m := _STATE_ERROR.search(line):
            mem.state_error = {"max_mamba_cache_size": int(m.group("size")), "total_rest_memory_gb": float(m.group("rest")),
                               "mamba_cache_per_req_mb": float(m.group("per"))}
            mem.lines.append(line)
        elif m := _NO_KV_ERROR.search(line):
            mem.no_kv_error = {"mem_fraction_static": float(m.group("f"))}
            mem.lines.append(line)
    return mem


def _number(text: str) -> float | None:
    match = re.search(r"-?\d+(?:\.\d+)?", text)
    return float(match.group()) if match else None


def parse_server_args_payload(payload: str) -> dict[str, Any] | None:
    """The text after "server_args=": a Python dict repr (SGLang 0.5.23 logs
    `resolved_dict()`), JSON, or a `ServerArgs(k=v, ...)` repr (older versions)."""
    payload = payload.strip()
    try:
        value = json.loads(payload)
        return value if isinstance(value, dict) else None
    except ValueError:
        pass
    try:
        value = ast.literal_eval(payload)
        return value if isinstance(value, dict) else None
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        tree = ast.parse(payload, mode="eval")
    except SyntaxError:
        return None
    node = tree.body
    result: dict[str, Any] = {}
    if isinstance(node, ast.Call):
        for kw in node.keywords:
            if kw.arg is None:
                continue
            try:
                result[kw.arg] = ast.literal_eval(kw.value)
            except ValueError:  # an object repr: keep its source text
                result[kw.arg] = ast.get_source_segment(payload, kw.value)
    elif isinstance(node, ast.Dict):
        for key, val in zip(node.keys, node.values):
            try:
                k = ast.literal_eval(key) if key is not None else None
            except ValueError:
                continue
            if not isinstance(k, str):
                continue
            try:
                result[k] = ast.literal_eval(val)
            except ValueError:
                result[k] = ast.get_source_segment(payload, val)
    return result or None


def parse_load_end(rest: str, line: str) -> WeightLoad:
    values = {m.group("key").strip(): m.group("value").strip() for m in _KV.finditer(rest)}
    elapsed = values.get("elapsed")
    return WeightLoad(
        model_class=values.get("type"),
        quant=values.get("quant"),
        elapsed_s=_number(elapsed) if elapsed else None,
        line=line.strip(),
    )


def parse_log(text: str) -> LogEvidence:
    """Read every evidence line of a server log (SGLang's or the embedded engine's)."""
    ev = LogEvidence()
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line:
            continue
        if (m := _SERVER_ARGS.search(line)) and ev.server_args is None:
            ev.server_args = parse_server_args_payload(m.group(1))
            continue
        if m := _LOAD_END.search(line):
            ev.weight_loads.append(parse_load_end(m.group("rest"), line))
            continue
        if _MIXED_MXFP4.search(line):
            ev.mixed_mxfp4_experts = True
            ev.lines["mixed_mxfp4"] = line.strip()
        if m := _BAILING_MOE.search(line):
            ev.moe_backend_override = m.group("backend")
            ev.lines["moe_backend_override"] = line.strip()
        if m := _HUMMING_GEMM.search(line):
            ev.humming_gemm = m.group("gemm")
            ev.lines["humming_gemm"] = line.strip()
        if _FP8_LM_HEAD.search(line):
            ev.fp8_lm_head = True
            ev.lines["fp8_lm_head"] = line.strip()
        if m := _GRAPH_FAILED.search(line):
            ev.graph_capture_failed = m.group("why").strip() or line.strip()
            ev.lines["graph_capture_failed"] = line.strip()
        elif _GRAPH_END.search(line):
            ev.graph_captures += 1
        if _DECODE_ANY.search(line):
            m = _DECODE.search(line)
            tput = _GEN_TPUT.search(line)
            flag = _GRAPH_FLAG.search(line)
            ev.decode_stats.append(
                DecodeStat(
                    accept_length=float(m.group("accept")) if m else None,
                    accept_rate=float(m.group("rate")) if m and m.group("rate") else None,
                    gen_throughput=float(tput.group("tput")) if tput else None,
                    graph=(flag.group("flag") == "True") if flag else None,
                    line=line.strip(),
                )
            )
        if _READY.search(line):
            ev.ready = True
        if m := _STARTUP_TIMINGS.search(line):
            ev.startup_timings = parse_startup_timings(m.group("rest"))
            ev.lines["startup_timings"] = line.strip()
        if _DRAFT_TOKENS_WARN.search(line) or _RESET.search(line) or (_OVERRIDING.search(line) and "WARN" in line.upper()):
            ev.rewrites.append(line.strip())
    return ev


def parse_startup_timings(rest: str) -> dict[str, float]:
    """`load_weight=0.14, ..., cuda_graph={prefill=56.11, decode=0.00}` -> a flat dict
    ({"load_weight": 0.14, "cuda_graph.prefill": 56.11, ...})."""
    out: dict[str, float] = {}
    for m in _TIMING_ITEM.finditer(rest):
        if m.group("group") is not None:
            for inner in _TIMING_ITEM.finditer(m.group("group")):
                if inner.group("value") is not None:
                    out[f"{m.group('key')}.{inner.group('key')}"] = float(inner.group("value"))
        elif m.group("value") is not None:
            out[m.group("key")] = float(m.group("value"))
    return out


# Where each startup phase begins, by the first log line that shows it (SGLang's wording; the
# embedded engine writes the same lines).
_PHASE_MARKS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("loading weights", re.compile(r"Load weight begin\b")),
    ("allocating the KV cache", re.compile(r"KV Cache is allocated|Memory pool end")),
    ("capturing CUDA graphs", re.compile(r"Capture .*graph begin", re.IGNORECASE)),
    ("HTTP server up, warming up", re.compile(r"Uvicorn running on|Embedded engine HTTP server listening")),
    ("ready", _READY),
)


def phase_timeline(text: str) -> list[tuple[str, float]]:
    """(phase, seconds from the log's first timestamped line) for each startup phase the log
    reached, in order: what a start spent its time on. Needs SGLang's `[YYYY-mm-dd HH:MM:SS]`
    line prefix; a log without it gives []."""
    from datetime import datetime

    first: datetime | None = None
    marks: list[tuple[str, float]] = []
    seen: set[str] = set()
    for line in text.splitlines():
        ts = _TIMESTAMP.match(line)
        if not ts:
            continue
        when = datetime.fromisoformat(ts.group("ts"))
        if first is None:
            first = when
        if _SERVER_ARGS.search(line):
            continue
        for phase, pattern in _PHASE_MARKS:
            if phase not in seen and pattern.search(line):
                seen.add(phase)
                marks.append((phase, (when - first).total_seconds()))
    return marks


# -- startup phase -----------------------------------------------------------------------------


def detect_phase(text: str) -> str:
    """The furthest startup phase the log has reached (one of PHASES)."""
    phase = 0
    for line in text.splitlines():
        if _SERVER_ARGS.search(line):  # the args dump names warmup and graph settings
            continue
        if _READY.search(line):
            phase = max(phase, 4)
        elif _GRAPH_BEGIN.search(line) or _GRAPH_END.search(line):
            phase = max(phase, 2)
        elif _LOAD_BEGIN.search(line) or _LOAD_END.search(line) or "Loading safetensors" in line:
            phase = max(phase, 1)
        elif _WARMUP.search(line):
            phase = max(phase, 3)
    return PHASES[phase]


# -- failed start ------------------------------------------------------------------------------
# In the order they are tried: the first that matches one of the last lines names the cause (the
# general ones are sparkit.engines.startup_log's; the FP8 one comes before the capture failure,
# whose line it also matches).
_DIAGNOSES: list[DiagnosisPattern] = [
    NOT_INSTALLED,
    UNKNOWN_FLAG,
    PORT_IN_USE,
    (
        # A BF16 kernel handed an FP8 tensor. Seen on the H200 (SGLang 0.5.23 + sparkit's FP8 head
        # with SPARKIT_SHARE_LM_HEAD=0): the NEXTN draft, given only the target head's weight
        # tensor, computes with it through UnquantizedEmbeddingMethod, and the draft's CUDA-graph
        # capture stops with 'Capture cuda graph failed: "addmm_cuda" not implemented for
        # 'Float8_e4m3fn''. Before the capture-failure pattern below: that line matches both.
        re.compile(r"not implemented for 'Float8_e4m3fn'|not implemented for 'Float8_e5m2'"),
        "FP8 weight read by a BF16 kernel",
        "a module holds FP8 weights but computes with an unquantised (BF16) method; with an FP8 "
        "lm_head and NEXTN this is the draft reading the target head's FP8 tensor: the shared-head trap",
        "let the draft share the target's lm_head module (sparkit's plugin does, unless "
        "SPARKIT_SHARE_LM_HEAD=0), or set stack.lm_head: bf16",
    ),
    (
        re.compile(r"Capture (?:\w+ )?(?:cuda|CUDA) graph failed"),
        "CUDA graph capture failed",
        "capturing CUDA graphs failed",
        "lower --cuda-graph-max-bs-decode or mem_fraction_static, or disable CUDA graphs to confirm",
    ),
    (
        re.compile(r"Not enough GPU memory for hybrid \(mamba/linear-attention\) state cache"
                   r"|Loaded weights leave no GPU memory for the KV cache"),
        "no memory left for the pools",
        "SGLang's memory profile found no room for its state or KV pool after the weights: what was free when it "
        "started (P x (1 - mem_fraction_static) is kept free) was taken since, often by another server starting "
        "at the same time",
        "start servers one after another, or size their pools explicitly (--max-total-tokens, --max-mamba-cache-size) "
        "with a mem_fraction_static that leaves P x (1 - f) free; `sparkit plan` shows the arithmetic",
    ),
    OUT_OF_MEMORY,
    MISSING_MODEL,
    BROKEN_CHECKPOINT,
    (
        re.compile(r"Unknown speculative algorithm name"),
        "unknown speculative algorithm",
        "the engine does not know the speculative algorithm",
        "use NEXTN (MTP), EAGLE, DSPARK, ... ; MTP is not a valid name in SGLang 0.5.23",
    ),
]


# What provides a module an engine imports only on some paths (seen on the H200 with SGLang 0.5.23).
_MODULE_FIXES = {
    "flash_mla": "pip install sgl-flash-mla (SGLang's NEXTN/EAGLE draft imports it to capture CUDA graphs), "
                 "or set server.cuda_graph.enabled: false",
    "humming": "pip install humming-kernels (the humming MoE backend and quantization)",
    "cuda": "pip install cuda-bindings (humming compiles its kernels through NVRTC)",
    "flashinfer": "pip install flashinfer-python: SGLang 0.5.23's speculative verify imports its sampling "
                  "kernels for any request with temperature > 0 (greedy requests do not need it)",
    "cutlass": "pip install nvidia-cutlass-dsl (SGLang's CuTe DSL kernels)",
}


def diagnose_failure(log_text: str, returncode: int | None = None) -> Diagnosis:
    """Name the most likely cause of a failed start from the log's last lines."""
    return diagnose(log_text, returncode, _DIAGNOSES, _MODULE_FIXES)


class SGLangLogAdapter:
    """Shared by engines that write SGLang's startup lines (SGLang, and the embedded engine that
    writes the same on purpose): their phases and failures read the same way."""

    def startup_phase(self, line: str) -> str:
        return detect_phase(line)

    def read_log(self, log_text: str) -> LogEvidence:
        return parse_log(log_text)

    def diagnose(self, log_text: str, returncode: int | None) -> Diagnosis:
        return diagnose_failure(log_text, returncode)
