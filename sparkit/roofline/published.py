"""Measured figures to check the roofline against: the two studies' (../seeds/) and sparkit's own
H200 session (benchmarks/results/h200-sglang-session.md). docs/roofline.md is generated from
these by scripts/gen_roofline_table.py.

`context` is the mean context a decode step saw: prompt plus half the output (32K in / 2K out
-> 33,792; 8192 in / 1024 out -> 8,704). `tpot_ms`, where a study gives it, is the decode-only
figure the bound compares with (TTFT excluded); `tok_s` is what the study printed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SPARK_STUDY = "NVIDIA, Ling-3.0-flash on one DGX Spark (seeds/ling3-flash-dgx-spark.txt)"
TP4_STUDY = "LMSYS / Ant Ling, Ling-3.0-flash batch-1 on 4 Blackwell GPUs (seeds/ling3-flash-batch1-blackwell-tp4.txt)"
H200_SESSION = "sparkit on real SGLang 0.5.23, one H200 (benchmarks/results/h200-sglang-session.md)"

# What the studies say a step's time is made of, beyond reading weights.
SPARK_GAP = ("reading weights dominates; the MoE kernels and the LM head stand out; MXFP4 MoE through FlashInfer "
             "reaches less of the bandwidth than Humming (+9.3%)")
SPARK_FP32_HEAD = "the baseline's fp32 LM-head path"
SPARK_MTP_GAP = ("verify costs 2.26x a decode step, mostly MoE (up to 32 experts instead of 8), plus three NextN "
                 "draft steps")
TP4_GAP = ("host: run-ahead reset every step (485 us resolve_seq_lens_cpu sync), GPU busy ~2/3 of a step; "
           "launch latency of hundreds of 1.5-6 us kernels; fp32 router and lm_head")
TP4_TUNED_GAP = ("after the fixes a 5.34 ms NEXTN step: MoE grouped GEMM 1215 us + dense GEMM 918 us (~2.1 ms, "
                 "weight bandwidth), router/activation/glue kernels 1127 us, all-reduce 951 us, KDA 488 us, "
                 "MLA 244 us, idle 400 us")
TP4_DSPARK_GAP = ("first DSpark trace 47% GPU idle (blocking D2H in FlashInfer plan(), fixed); block-16 draft "
                  "model's own reads; the published draft checkpoint uses block 8")


@dataclass(frozen=True)
class MeasuredFigure:
    recipe: str  # the shipped recipe that reproduces the configuration
    source: str
    workload: str
    context: int
    tok_s: float
    accept: float | None = None  # measured accept length (speculative recipes)
    tpot_ms: float | None = None  # mean TPOT (decode only), when given
    gap: str = ""  # what the source says the time beyond the weight reads is made of
    notes: tuple[str, ...] = field(default_factory=tuple)
    overrides: tuple[str, ...] = ()  # --set assignments on the recipe, when it is not the shipped one as is

    @property
    def decode_tok_s(self) -> float:
        """Decode-only speed: 1 / TPOT where the source gives TPOT, else its tok/s."""
        return 1000.0 / self.tpot_ms if self.tpot_ms else self.tok_s


GSM8K_CONTEXT = 1_300  # assumed: 5-shot chain-of-thought prompts (~1,100 tokens) + half a 310-token answer

PUBLISHED: tuple[MeasuredFigure, ...] = (
    MeasuredFigure("ling-3.0-flash/spark-baseline", SPARK_STUDY, "synthetic 32K in / 2K out", 33_792, 36.09,
                   tpot_ms=27.71, gap=f"{SPARK_GAP}; {SPARK_FP32_HEAD}"),
    MeasuredFigure("ling-3.0-flash/spark-humming", SPARK_STUDY, "synthetic 32K in / 2K out", 33_792, 39.45,
                   gap=f"Humming MoE (+9.3%); {SPARK_FP32_HEAD}"),
    MeasuredFigure("ling-3.0-flash/spark-humming-fp8head", SPARK_STUDY, "synthetic 32K in / 2K out", 33_792, 43.94,
                   gap="FP8 head halves the head's reads (+11.4% over Humming alone)"),
    MeasuredFigure("ling-3.0-flash/spark-optimized", SPARK_STUDY, "synthetic 32K in / 2K out, greedy", 33_792,
                   102.88, accept=3.90, gap=SPARK_MTP_GAP),
    MeasuredFigure("ling-3.0-flash/spark-baseline", SPARK_STUDY, "GSM8K 5-shot CoT, temp 0.6", GSM8K_CONTEXT, 37.81,
                   tpot_ms=26.45, gap=f"{SPARK_GAP}; {SPARK_FP32_HEAD}",
                   notes=("context assumed (the study gives no prompt length)",)),
    MeasuredFigure("ling-3.0-flash/spark-optimized", SPARK_STUDY, "GSM8K 5-shot CoT, temp 0.6", GSM8K_CONTEXT, 53.89,
                   accept=2.68, tpot_ms=18.56,
                   gap=f"{SPARK_MTP_GAP}; sampled (temp 0.6), shorter answers",
                   notes=("context assumed (the study gives no prompt length)",)),
    MeasuredFigure("ling-3.0-flash/tp4-baseline", TP4_STUDY, "random 8192 in / 1024 out, greedy", 8_704, 288.0,
                   accept=3.14, tpot_ms=3.33, gap=TP4_GAP),
    MeasuredFigure("ling-3.0-flash/tp4-nextn", TP4_STUDY, "random 8192 in / 1024 out, greedy", 8_704, 606.0,
                   accept=3.25, tpot_ms=1.53, gap=TP4_TUNED_GAP),
    MeasuredFigure("ling-3.0-flash/tp4-dspark", TP4_STUDY, "random 8192 in / 1024 out, greedy", 8_704, 1120.0,
                   accept=9.95, tpot_ms=0.78, gap=TP4_DSPARK_GAP),
)

# sparkit's own H200 session: tiny-ling's BailingMoeV2 export on stock SGLang 0.5.23 (CUDA graphs).
H200_TINY: tuple[MeasuredFigure, ...] = (
    MeasuredFigure("tiny/tiny-sglang", H200_SESSION, "random 256 in / 256 out, interleaved", 384, 331.0,
                   accept=1.50, tpot_ms=3.021, gap="launch-bound: a few hundred kernels per step, weights ~3 MB",
                   notes=("TPOT is the median",)),
    MeasuredFigure("tiny/tiny-sglang", H200_SESSION, "startup probe, natural text, 3 x 48 tokens", 40, 849.5,
                   accept=3.60, gap="launch-bound"),
    MeasuredFigure("tiny/tiny-sglang", H200_SESSION, "random 256 in / 256 out, interleaved", 384, 537.7,
                   tpot_ms=1.860, gap="launch-bound", notes=("TPOT is the median",),
                   overrides=("stack.speculative=none",)),
    MeasuredFigure("tiny/tiny-sglang-baseline", H200_SESSION, "random 256 in / 256 out, interleaved", 384, 461.4,
                   tpot_ms=2.167, gap="launch-bound", notes=("TPOT is the median",)),
)


@dataclass(frozen=True)
class HostStepCost:
    """The part of a batch-1 decode step that is not reading memory: a line through the step times
    of the same widths at two layer counts, step = fixed + per_layer x layers. The fixed part is
    the host's time between CUDA-graph replays (scheduler, metadata prep, sampling readback), which
    a slower memory does not shrink."""

    fixed_ms: float
    per_layer_ms: float
    source: str
    stack: str  # what ran: engine, GPU, experts, head, switches

    def share_of_step(self, step_bytes: float, gb_s: float) -> float:
        """Its share of a step that reads `step_bytes` at `gb_s`, plus this fixed cost."""
        read_ms = step_bytes / (gb_s * 1e9) * 1000.0
        return self.fixed_ms / (read_ms + self.fixed_ms)


# Issue 38's re-fit (benchmarks/results/h200-session-12.md, call 1, benchmarks/host_gap.py): FP8
# block experts, FP8 head, decode CUDA graphs, SGLang 0.5.23's defaults on one H200, ONE SERVER AT A
# TIME (the rule for batch-1 figures): 2.363 ms a step at 6 layers, 2.742 ms at 12. Issue 25's fit
# from session 8 had three servers up together: 1.867 ms + 62.8 us a layer.
H200_HOST_STEP = HostStepCost(
    fixed_ms=1.984, per_layer_ms=0.0631,
    source="benchmarks/results/h200-session-12.md (call 1: 6 and 12 layers, defaults, one server at a time)",
    stack="SGLang 0.5.23, one H200, Ling-3.0-flash widths, FP8 block experts, FP8 head, decode CUDA graphs, defaults",
)
# How the plan's roofline note on this cost begins (sparkit.cli.roofline_view shows it beside the bound).
HOST_TERM_PREFIX = "not in the bound:"
