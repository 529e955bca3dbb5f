"""The host gap at batch 1 (issue 38, items 2-3): SGLang 0.5.23's host-side switches, one server at
a time, in A/B/A order, at Ling-3.0-flash's widths on one H200.

    python3 benchmarks/host_gap.py --out DIR --tokenizer-from TOKDIR [--phases plain6,l12,nextn6]
        [--switches glue,delay,...] [--budget-s 420] [--max-servers N] [--resume DIR] [--rehearse]

The model: Ling-3.0-flash's widths with 6 (and 12) layers, FP8 block-128 experts (the layout of
issue 25's 1.867 ms fit), sparse safetensors headers written by scripts/make_sparse_ling.py and
served with `--load-format dummy` (random weights: a NEXTN draft accepts ~1 token, so NEXTN shows
the machinery's cost, not its gain), FP8 lm_head through sparkit's plugin, decode CUDA graphs
(batch 1 captured only). The switches are docs/host-gap.md's "applies here" table (SWITCHES below).

Phases, each a chain of servers started one after another through `sparkit up --detach` (every
startup check must pass; `engine_switches` proves each switch is what the engine runs), measured,
then `sparkit down`:

  plain6  6 layers, no MTP: base, glue, base, delay, base, fill, base, recv, base, affinity, base,
          then the best combination (the switches that beat the noise band, with their companions)
          and a closing base
  nextn6  the same with NEXTN 3/1/4: glue, kda (fused KDA verify), plan (overlap plan stream), fill,
          recv, affinity, best
  l12     12 layers, no MTP: base, and plain6's best: the line through 6 and 12 layers re-fits the
          roofline's fixed host term (sparkit/roofline/published.py H200_HOST_STEP)

Each server: decode tok/s (1 / median TPOT of 3 greedy requests of 256 tokens, twice), TTFT, accept
length, and the GPU-busy fraction of a decode step (VERIFY with NEXTN) from SGLang's own
/start_profile trace, read by `sparkit bench steps`' summariser. A switch is judged against the two
bases around it (the same machine): faster or slower when it beats both by more than the phase's
noise band (the largest relative spread between consecutive bases), else within noise.

Budget (--budget-s, from the script's start): a switch starts only when it and the base that
closes its bracket fit (estimates from the H200 runs, replaced by what this machine measured); a
phase that cannot fit its next bracket is stopped and said. results.json is rewritten after every
server and summary.txt appended; a later call continues where the last stopped, from --out (the
same warm machine keeps /tmp) or from --resume DIR (a carried results.json); on a new machine a
fresh base opens the next bracket. --rehearse runs the same control flow on a CPU with the
embedded engine's tiny-ling standing in (SGLang's flags left out); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ling_width as lw  # noqa: E402  (its Session, sparkit up/finish, /start_profile and line fit)

REPO = lw.REPO
GB10_GB_S = lw.GB10_GB_S
SPARK_RECIPE = "ling-3.0-flash/spark-humming-fp8head"  # the Spark stack without MTP (43.94 tok/s published)
MIN_BAND = 0.01  # a noise band is never taken below 1%


@dataclass(frozen=True)
class Switch:
    label: str
    env: dict[str, str] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    modes: tuple[str, ...] = ("plain", "nextn")  # where it applies (docs/host-gap.md)
    companions: dict[str, str] = field(default_factory=dict)  # added when it joins the best combination
    what: str = ""


SWITCHES: dict[str, Switch] = {s.label: s for s in (
    Switch("glue", {"SGLANG_ENABLE_METADATA_GLUE_GRAPH": "1"},
           companions={"SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW": "1"}, what="metadata prep in a CUDA graph"),
    Switch("delay", {"SGLANG_ENABLE_DELAY_SAMPLE": "1"}, modes=("plain",), what="sampling overlapped with the next step"),
    Switch("fill", {"SGLANG_OPT_CUDA_GRAPH_FILL_FAST_PATH": "1"}, what="one foreach copy into the graph inputs"),
    Switch("recv", flags=("--scheduler-recv-interval", "8"), what="poll for requests every 8 steps"),
    Switch("affinity", {"SGLANG_SET_CPU_AFFINITY": "1"}, what="scheduler pinned to the GPU's cores"),
    Switch("kda", {"SGLANG_OPT_FUSED_KDA_VERIFY": "1"}, modes=("nextn",), what="fused KDA verify kernel"),
    Switch("plan", {"SGLANG_ENABLE_OVERLAP_PLAN_STREAM": "1"}, modes=("nextn",), what="verify prep on a side stream"),
    # not in the default lists (docs/host-gap.md: changes what a streaming client sees)
    Switch("stream8", flags=("--stream-interval", "8"), what="stream every 8 tokens"),
)}
DEFAULT_SINGLES = {"plain": ("glue", "delay", "fill", "recv", "affinity"),
                   "nextn": ("glue", "kda", "plan", "fill", "recv", "affinity")}


@dataclass(frozen=True)
class Phase:
    name: str
    layers: int
    speculative: bool
    stage: str  # the profiled step: DECODE, or VERIFY with NEXTN

    @property
    def mode(self) -> str:
        return "nextn" if self.speculative else "plain"


PHASES = {p.name: p for p in (Phase("plain6", 6, False, "DECODE"), Phase("nextn6", 6, True, "VERIFY"),
                               Phase("l12", 12, False, "DECODE"))}
# Seconds a server takes on the H200 from `sparkit up` to `sparkit down`, its decode and profile
# included (~10 s and ~20 s of them): session 7's E (12 layers, warm Triton cache, alone) was ready
# in 74 s; its first server (A, kernels compiled cold, two others starting beside it) in 212 s,
# session 8's H in 185 s. Every plain server at 6 or 12 layers runs the same Triton kernels (the
# widths are the same; the switches add none), so only the machine's first server compiles them;
# NEXTN adds its verify and draft kernels (and the fused KDA verify its own), compiled by the first
# NEXTN server. Replaced by what this machine measured, per kind, as soon as one ran.
ESTIMATE_S = {"cold": 185, "plain": 95, "l12": 105, "nextn-first": 155, "nextn": 110, "nextn-cold": 240}
REHEARSE_ESTIMATE_S = {key: 40 for key in ESTIMATE_S}
# The FP8 head's kernel is not tuned at each start (17.6 s on a cold start): the untuned default,
# pk16p:n128k256w4s3, is what session 8's tuner picked for the 1.867 ms fit anyway.
FIXED_ENV = {"SPARKIT_FP8_TUNE": "0"}


@dataclass
class Variant:
    """One server of the study (ling_width's start/finish read name, label, fraction, auto_pools)."""

    name: str  # the key in results.json, e.g. "plain6.glue", "plain6.base.glue"
    phase: str
    layers: int
    speculative: bool
    role: str  # base | switch | best
    switches: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    experts: str = "fp8"
    head: str = "fp8"
    fraction: float = 0.85
    auto_pools: bool = False
    expect_refusal: bool = False

    @property
    def label(self) -> str:
        what = "+".join(self.switches) if self.switches else "defaults"
        return f"L{self.layers}-{'nextn' if self.speculative else 'plain'}-{what}"

    @property
    def kind(self) -> str:
        return "l12" if self.layers != 6 else ("nextn" if self.speculative else "plain")


def machine_id() -> str:
    """This machine's boot id: servers of one boot share its Triton cache and its load."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def variant(phase: Phase, role: str, switches: tuple[str, ...] = (), after: str = "") -> Variant:
    env: dict[str, str] = dict(FIXED_ENV)
    flags: list[str] = []
    for label in switches:
        env.update(SWITCHES[label].env)
        flags += SWITCHES[label].flags
    if role == "best":
        for label in switches:
            env.update(SWITCHES[label].companions)
    name = (f"{phase.name}.base.{after or 'start'}" if role == "base"
            else f"{phase.name}.best" if role == "best" else f"{phase.name}.{switches[0]}")
    return Variant(name, phase.name, phase.layers, phase.speculative, role, tuple(switches), env, tuple(flags))


# ------------------------------------------------------------------------------ recipes

def recipe_text(v: Variant, model: Path, rehearse: bool) -> str:
    spec = "{method: nextn, num_steps: 3, eagle_topk: 1, num_draft_tokens: 4}" if v.speculative else "none"
    env = "".join(f"    {k}: {json.dumps(val)}\n" for k, val in sorted(v.env.items()))
    env_block = f"  env:\n{env}" if env else ""
    if rehearse:  # the embedded engine's tiny-ling stands in; SGLang's flags are left out
        # SGLang's switches are no setting of the embedded engine (its env allowlist refuses them):
        # named in allow_code_env they still travel, so the rehearsal passes them as the device run does
        sglang_only = sorted(k for k in v.env if k.startswith("SGLANG_"))
        allow = f"  allow_code_env: {json.dumps(sglang_only)}\n" if sglang_only else ""
        return (f"description: rehearsal stand-in for {v.label} (benchmarks/host_gap.py)\nextends: tiny\n"
                f"stack:\n  lm_head: {v.head}\n  speculative: {spec}\n"
                f"checks:\n  min_accept_length: 1.0\nserver:\n{env_block or '  env: {}'}\n{allow}")
    extra = ["--load-format", "dummy", "--max-total-tokens", "16384", "--chunked-prefill-size", "2048",
             "--max-mamba-cache-size", "64", *v.flags]
    return "\n".join([
        f"description: Ling-3.0-flash widths, {v.layers} layers, {v.experts} experts (dummy weights), {v.head} head, "
        f"{'NEXTN 3/1/4' if v.speculative else 'no MTP'}, {v.label} (benchmarks/host_gap.py, issue 38)",
        "extends: tiny/tiny-sglang",
        "model:",
        f"  path: {model}",
        f"  served_name: hostgap-{v.name.replace('.', '-')}",
        "  trust_remote_code: true",
        "  context_length: 8192",
        "stack:",
        f"  weights: {v.experts}",
        f"  lm_head: {v.head}",
        f"  speculative: {spec}",
        "checks:",
        "  reference_perplexity: null",
        "  min_accept_length: 1.0",
        "server:",
        f"  mem_fraction_static: {v.fraction}",
        "  cuda_graph:",
        "    max_bs_decode: 1",  # batch 1 is what is measured: one graph to capture
        "    prefill: false",
        f"  extra_args: {json.dumps(extra)}",
        env_block.rstrip("\n"),
        "",
    ])


def make_models(session: lw.Session, models: Path, tokenizer_from: Path | None, rehearse: bool) -> dict[int, Path]:
    if rehearse:
        return {6: Path("sparkit:tiny-ling"), 12: Path("sparkit:tiny-ling")}
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_sparse_ling", REPO / "scripts" / "make_sparse_ling.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    made = {}
    for layers in (6, 12):
        directory = models / f"ling-fp8-L{layers}"
        generator.write_checkpoint(directory, "fp8", layers=layers, tokenizer_from=tokenizer_from)
        made[layers] = directory
        session.say(f"model {directory}: FP8 block experts, {layers} layers + NextN (headers over holes)")
    return made


# ------------------------------------------------------------------------------ one server

def decode(session: lw.Session, v: Variant, rehearse: bool) -> dict[str, Any] | None:
    """A few greedy requests of 256 tokens (rehearsal: 32) at batch 1, this server alone."""
    from sparkit.bench.runner import BenchConfig, BenchTarget, run_interleaved

    url = session.results["variants"][v.name]["up"]["url"]
    shape = dict(input_len=64, output_len=32, num_prompts=2, repeats=1) if rehearse else \
        dict(input_len=lw.INPUT_LEN, output_len=lw.OUTPUT_LEN, num_prompts=3, repeats=2)
    config = BenchConfig(**shape, warmup=1)
    (doc,) = asyncio.run(run_interleaved([BenchTarget(url=url)], config))
    fig = doc["summary"]["figures"]
    tpot = fig.get("tpot_median_ms")
    row = {"tpot_median_ms": tpot, "decode_tok_s": 1000.0 / tpot if tpot else None,
           "accept_length": fig.get("accept_length_mean"), "ttft_median_ms": fig.get("ttft_median_ms"),
           "shape": shape, "side_by_side": doc.get("side_by_side"),
           "tpot_per_request_ms": [r.get("tpot_ms") for rep in doc.get("repeats", []) for r in rep.get("requests", [])
                                   if r.get("tpot_ms")]}
    session.results["variants"][v.name]["decode"] = row
    (session.out / "decode").mkdir(exist_ok=True)
    (session.out / "decode" / f"{v.name}.json").write_text(json.dumps(doc, indent=1, default=str))
    if tpot:
        accept = f", accept {row['accept_length']:.2f}" if row["accept_length"] else ""
        session.say(f"  {v.name}: {row['decode_tok_s']:.1f} tok/s (median TPOT {tpot:.3f} ms, TTFT "
                    f"{row['ttft_median_ms']:.1f} ms{accept})")
    session.save()
    return row


def checks_of(run_id: str | None) -> dict[str, Any]:
    directory = lw.run_dir(run_id)
    path = directory / "checks.json" if directory else None
    if not path or not path.exists():
        return {}
    results = json.loads(path.read_text()).get("results", [])
    return {r["name"]: {"status": r["status"], "detail": r.get("detail", "")} for r in results}


def usable(v: Variant, record: dict[str, Any]) -> tuple[bool, str]:
    """Whether a server's figures count: every startup check passed; with NEXTN on random weights
    the acceptance check alone may fail (accept ~1.0, expected and said)."""
    failed = sorted(n for n, c in record.get("checks", {}).items() if c["status"] == "fail")
    if record["up"]["rc"] == 0:
        return True, "checks pass"
    if record["up"]["rc"] == 6 and failed == ["acceptance"] and v.speculative:
        return True, "checks pass but acceptance (random weights: accept ~1.0, expected)"
    return False, f"not measured: sparkit up exit {record['up']['rc']}" + (f", failed {', '.join(failed)}" if failed else "")


def flags_in_effect(session: lw.Session, v: Variant, url: str) -> dict[str, Any]:
    """A flag switch's value as the server resolved it (/server_info), beside what was passed: the
    resolved-args check covers the recipe keys, not pass-through flags."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/server_info", timeout=30) as response:
            info = json.loads(response.read())
    except (OSError, ValueError) as exc:
        return {"error": str(exc)}
    seen = {}
    for flag, value in zip(v.flags[::2], v.flags[1::2]):
        key = flag.lstrip("-").replace("-", "_")
        seen[key] = {"passed": value, "server_info": info.get(key)}
        same = str(info.get(key)) == value
        session.say(f"  {v.name}: {flag} {value} -> /server_info {key}={info.get(key)!r}"
                    + ("" if same else "  (NOT what was passed)"))
    return seen


def serve(session: lw.Session, v: Variant, recipes: Path, models: dict[int, Path], args) -> dict[str, Any]:
    """Up, measure, down: one server of the chain, recorded in results.json whatever happens."""
    path = recipes / f"{v.name}.yaml"
    path.write_text(recipe_text(v, models[v.layers], args.rehearse))
    t0 = time.monotonic()
    wall0 = time.time()
    record = session.results["variants"].setdefault(v.name, {})
    record["compiled"] = compiles(session, v)  # its start compiles kernels: not a warm figure
    record.update(label=v.label, phase=v.phase, role=v.role, switches=list(v.switches), env=v.env, flags=list(v.flags),
                  layers=v.layers, speculative=v.speculative, machine=machine_id(), started_at=wall0,
                  seq=len(session.results["order"]))
    proc = lw.start(session, v, path, args.server_timeout_s)
    up = lw.finish(session, v, proc, args.server_timeout_s + 60)
    record["up_s"] = round(time.monotonic() - t0, 1)
    record["checks"] = checks_of(up.get("run"))
    ok, why = usable(v, record)
    record["verdict_up"] = why
    if ok and up.get("url") and v.flags and not args.rehearse:
        record["flags_seen"] = flags_in_effect(session, v, up["url"])
    if ok and up.get("url"):
        try:
            decode(session, v, args.rehearse)
        except Exception as exc:  # noqa: BLE001 - a server that fails its decode is recorded, the study goes on
            record["verdict_up"] = f"not measured: its decode failed ({type(exc).__name__}: {str(exc)[:200]})"
            session.say(f"{v.name}: {record['verdict_up']}")
        else:
            lw.profile(session, v.name, PHASES[v.phase].stage)
    else:
        session.say(f"{v.name}: {why}")
    if up.get("run"):
        subprocess.run(lw.sk("down", up["run"], "--json"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=120, cwd=REPO)
    record["total_s"] = round(time.monotonic() - t0, 1)
    record["done"] = True
    session.results["order"].append(v.name)
    session.save()
    return record


# ------------------------------------------------------------------------------ budget

def estimate_s(session: lw.Session, v: Variant, rehearse: bool, before: tuple[Variant, ...] = ()) -> float:
    """What `v` should take here, started after `before` (servers not run yet): the most one of its
    kind took on this machine when it did not compile kernels, else the H200 estimate for the
    first of its kind (on a machine that compiled its kernels already, or a cold one)."""
    here = machine_id()
    ran = [r for r in session.results["variants"].values() if r.get("done") and r.get("machine") == here
           and r.get("total_s")]
    seen = [r["total_s"] for r in ran if kind_of(r) == v.kind and not r.get("compiled")]
    table = REHEARSE_ESTIMATE_S if rehearse else ESTIMATE_S
    if seen:
        return max(seen)
    warm = not compiles(session, v) or any(b.speculative or not v.speculative for b in before)
    if warm:
        return table["nextn" if v.kind == "nextn" else v.kind]
    if not ran and not before:
        return table["nextn-cold" if v.kind == "nextn" else "cold"]
    return table["nextn-first" if v.kind == "nextn" else v.kind]


def compiles(session: lw.Session, v: Variant) -> bool:
    """Whether `v` is the first server on this machine to need its kernels (Triton's cache cold)."""
    here = machine_id()
    ran = [r for r in session.results["variants"].values() if r.get("done") and r.get("machine") == here]
    return not ran or (v.speculative and not any(r.get("speculative") for r in ran))


def kind_of(record: dict[str, Any]) -> str:
    return "l12" if record.get("layers") != 6 else ("nextn" if record.get("speculative") else "plain")


def fits(session: lw.Session, chain: list[Variant], args, margin_s: float = 15.0) -> tuple[bool, str]:
    """Whether `chain` (a switch and the base that closes its bracket, say) fits what is left of the
    budget (and of --max-servers); else why not, in words."""
    call = session.results["calls"][-1]
    ran = len(session.results["order"]) - call.get("order_at_start", 0)
    if args.max_servers is not None and ran + len(chain) > args.max_servers:
        return False, f"--max-servers {args.max_servers}: this call ran {ran}, this needs {len(chain)} more"
    need = sum(estimate_s(session, v, args.rehearse, tuple(chain[:i])) for i, v in enumerate(chain)) + margin_s
    if session.left() >= need:
        return True, ""
    return False, f"{session.left():.0f} s of the budget left, {len(chain)} server(s) need ~{need:.0f} s"


# ------------------------------------------------------------------------------ judging

def tok_s(session: lw.Session, name: str) -> float | None:
    record = session.results["variants"].get(name) or {}
    return ((record.get("decode") or {}).get("decode_tok_s")) if record.get("verdict_up", "").startswith("checks pass") else None


def busy(session: lw.Session, name: str) -> float | None:
    prof = ((session.results["variants"].get(name) or {}).get("profile") or {}).get("breakdown")
    if not prof or not prof.get("step_us", {}).get("median"):
        return None
    return prof["busy_us"] / prof["step_us"]["median"]


def brackets(session: lw.Session, phase: str) -> list[dict[str, Any]]:
    """Each switch server of `phase` with the bases run just before and after it on the same machine."""
    order = [n for n in session.results["order"] if session.results["variants"][n]["phase"] == phase]
    rows = []
    for name in order:
        rec = session.results["variants"][name]
        if rec["role"] == "base":
            continue
        same = [n for n in order if session.results["variants"][n]["machine"] == rec["machine"]]
        j = same.index(name)
        before = next((n for n in reversed(same[:j]) if session.results["variants"][n]["role"] == "base"), None)
        after = next((n for n in same[j + 1:] if session.results["variants"][n]["role"] == "base"), None)
        rows.append({"name": name, "role": rec["role"], "switches": rec["switches"], "before": before, "after": after})
    return rows


def noise_band(session: lw.Session, phase: str) -> float | None:
    """The largest relative spread between consecutive bases of the phase on one machine."""
    order = [n for n in session.results["order"] if session.results["variants"][n]["phase"] == phase
             and session.results["variants"][n]["role"] == "base" and tok_s(session, n)]
    spreads = []
    for a, b in zip(order, order[1:]):
        if session.results["variants"][a]["machine"] == session.results["variants"][b]["machine"]:
            ta, tb = tok_s(session, a), tok_s(session, b)
            spreads.append(abs(ta - tb) / ((ta + tb) / 2))
    return max(max(spreads), MIN_BAND) if spreads else None


def judge(session: lw.Session, row: dict[str, Any], band: float | None) -> dict[str, Any]:
    b = tok_s(session, row["name"])
    bases = [t for t in (tok_s(session, row["before"]) if row["before"] else None,
                         tok_s(session, row["after"]) if row["after"] else None) if t]
    out = {**row, "tok_s": b, "bases_tok_s": bases, "band": band}
    rec = session.results["variants"][row["name"]]
    if b is None:
        out["verdict"] = f"rejected: {rec.get('verdict_up', 'not run')}"
        return out
    if len(bases) < 2 or band is None:
        out["verdict"] = "open bracket: a base on one side is missing" if len(bases) < 2 else "no noise band yet"
        out["delta"] = b / statistics.mean(bases) - 1 if bases else None
        return out
    delta = b / statistics.mean(bases) - 1
    out["delta"] = delta
    if b > max(bases) and delta > band:
        out["verdict"] = f"faster {delta:+.1%} (band ±{band:.1%})"
    elif b < min(bases) and -delta > band:
        out["verdict"] = f"slower {delta:+.1%} (band ±{band:.1%})"
    else:
        out["verdict"] = f"within noise {delta:+.1%} (band ±{band:.1%})"
    return out


def winners(session: lw.Session, phase: str) -> tuple[str, ...]:
    band = noise_band(session, phase)
    return tuple(r["switches"][0] for r in (judge(session, x, band) for x in brackets(session, phase))
                 if r["role"] == "switch" and r["verdict"].startswith("faster"))


# ------------------------------------------------------------------------------ the chains

def last_base_here(session: lw.Session, phase: str) -> str | None:
    """The last base of `phase` that ran on this machine and counts (its figures usable)."""
    here = machine_id()
    for name in reversed(session.results["order"]):
        rec = session.results["variants"][name]
        if rec["phase"] == phase and rec["role"] == "base" and rec["machine"] == here and tok_s(session, name):
            return name
    return None


def last_switch_here(session: lw.Session, phase: str) -> str | None:
    """The phase's last server on this machine when it is not a base (its bracket is open)."""
    here = machine_id()
    mine = [n for n in session.results["order"] if session.results["variants"][n]["phase"] == phase
            and session.results["variants"][n]["machine"] == here]
    return mine[-1] if mine and session.results["variants"][mine[-1]]["role"] != "base" else None


def fresh_base(session: lw.Session, phase: Phase, tag: str) -> Variant:
    """A base of `phase`; named after what it closes, or a numbered restart when that name is taken."""
    v = variant(phase, "base", after=tag)
    n = 2
    while v.name in session.results["variants"]:
        v = variant(phase, "base", after=f"{tag}-{n}")
        n += 1
    return v


def run_chain(session: lw.Session, phase: Phase, singles: tuple[str, ...], recipes: Path, models, args) -> str:
    """base, s1, base, s2, base, ..., best, base; what is already done (a resumed run) is skipped;
    a switch starts only when it and its closing base fit the budget. Returns how the phase ended."""
    done = {n for n, r in session.results["variants"].items() if r.get("done")}
    if last_base_here(session, phase.name) is None:
        v = fresh_base(session, phase, "start" if f"{phase.name}.base.start" not in done else "restart")
        ok, why = fits(session, [v, variant(phase, "switch", (singles or ("glue",))[:1])], args)
        if not ok:
            return f"skipped: {why} (its first bracket)"
        serve(session, v, recipes, models, args)
    left_open = last_switch_here(session, phase.name)
    if left_open is not None:  # an earlier call ended between a switch and its closing base
        closing = fresh_base(session, phase, left_open.split(".", 1)[1])
        ok, why = fits(session, [closing], args)
        if not ok:
            return f"stopped: {why} (the base that closes {left_open})"
        serve(session, closing, recipes, models, args)
    for label in singles:
        v = variant(phase, "switch", (label,))
        if v.name in done:
            continue
        closing = fresh_base(session, phase, label)
        ok, why = fits(session, [v, closing], args)
        if not ok:
            return f"stopped before {label}: {why}"
        serve(session, v, recipes, models, args)
        serve(session, closing, recipes, models, args)
    return run_best(session, phase, recipes, models, args)


def run_best(session: lw.Session, phase: Phase, recipes: Path, models, args) -> str:
    best = winners(session, phase.name)
    if not best:
        return "done: no switch beat the noise band, so there is no combination to run"
    v = variant(phase, "best", best)
    if len(best) == 1 and not SWITCHES[best[0]].companions:
        return f"done: the best combination is {best[0]} alone (measured)"
    if v.name in session.results["variants"] and session.results["variants"][v.name].get("done"):
        return f"done: best {'+'.join(best)} measured"
    closing = fresh_base(session, phase, "best")
    ok, why = fits(session, [v, closing], args)
    if not ok:
        return f"stopped before the best combination {'+'.join(best)}: {why}"
    serve(session, v, recipes, models, args)
    serve(session, closing, recipes, models, args)
    return f"done: best {'+'.join(best)} measured"


def run_l12(session: lw.Session, recipes: Path, models, args) -> str:
    """12 layers: the defaults and plain6's best, for the line through 6 and 12 layers."""
    phase = PHASES["l12"]
    best = winners(session, "plain6")
    chain = [variant(phase, "base", after="start")] + ([variant(phase, "best", best)] if best else [])
    chain = [v for v in chain if not session.results["variants"].get(v.name, {}).get("done")]
    if not chain:
        return "done"
    ok, why = fits(session, chain[:1], args)
    if not ok:
        return f"skipped: {why}"
    for v in chain:
        ok, why = fits(session, [v], args)
        if not ok:
            return f"stopped before {v.name}: {why}"
        serve(session, v, recipes, models, args)
    return "done" if best else "done: plain6 has no best combination yet (only the defaults at 12 layers)"


# ------------------------------------------------------------------------------ the report

def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def table(session: lw.Session) -> list[str]:
    """switch | tok/s A/B/A | busy fraction A/B/A | TTFT ms | accept | verdict, per phase."""
    lines = []
    for phase in PHASES:
        rows = [judge(session, r, noise_band(session, phase)) for r in brackets(session, phase)]
        bases = [n for n in session.results["order"] if session.results["variants"][n]["phase"] == phase
                 and session.results["variants"][n]["role"] == "base"]
        if not rows and not bases:
            continue
        band = noise_band(session, phase)
        said = (f"noise band ±{band * 100:.1f}% (the largest spread between consecutive bases" if band is not None
                else "no noise band yet (it needs two bases on one machine")
        lines.append(f"{phase}: {said}; {len(bases)} base server(s): "
                     f"{', '.join(fmt(tok_s(session, b)) for b in bases)} tok/s)")
        if not rows:
            continue
        lines.append(f"  {'switch':<22} {'tok/s A / B / A':<24} {'busy A / B / A':<20} {'TTFT ms':>8} {'accept':>6}  verdict")
        for r in rows:
            a1, a2 = r["before"], r["after"]
            speeds = " / ".join(fmt(tok_s(session, n)) if n else "-" for n in (a1, r["name"], a2))
            busies = " / ".join(fmt(busy(session, n), ".0%") if n and busy(session, n) is not None else "-"
                                for n in (a1, r["name"], a2))
            dec = session.results["variants"][r["name"]].get("decode") or {}
            name = "+".join(r["switches"]) + (" (best)" if r["role"] == "best" else "")
            lines.append(f"  {name:<22} {speeds:<24} {busies:<20} {fmt(dec.get('ttft_median_ms')):>8} "
                         f"{fmt(dec.get('accept_length'), '.2f'):>6}  {r['verdict']}")
    return lines


def goal(session: lw.Session) -> list[str]:
    """Issue 38's goal at 6 layers: GPU busy >= 50% of the step and decode >= 1.5x the defaults."""
    out = []
    for phase in ("plain6", "nextn6"):
        bases = [n for n in session.results["order"] if session.results["variants"][n]["phase"] == phase
                 and session.results["variants"][n]["role"] == "base" and tok_s(session, n)]
        tried = [n for n in session.results["order"] if session.results["variants"][n]["phase"] == phase
                 and session.results["variants"][n]["role"] != "base" and tok_s(session, n)]
        if not bases or not tried:
            continue
        base_tok = statistics.mean(tok_s(session, n) for n in bases)
        top = max(tried, key=lambda n: tok_s(session, n))
        speedup = tok_s(session, top) / base_tok
        frac = busy(session, top)
        met = speedup >= 1.5 and frac is not None and frac >= 0.5
        out.append(f"goal {phase}: fastest {top} {tok_s(session, top):.1f} tok/s = {speedup:.2f}x the defaults' "
                   f"{base_tok:.1f} (>= 1.5x: {'yes' if speedup >= 1.5 else 'no'}), GPU busy {fmt(frac and frac * 100)}% "
                   f"of its step (>= 50%: {'yes' if frac is not None and frac >= 0.5 else 'no'}): "
                   f"{'met' if met else 'not met'}")
    return out


def step_ms(session: lw.Session, names: list[str]) -> float | None:
    values = [session.results["variants"][n]["decode"]["tpot_median_ms"] for n in names
              if tok_s(session, n) and not session.results["variants"][n]["speculative"]]
    return statistics.mean(values) if values else None


def host_term(session: lw.Session) -> list[str]:
    """The roofline's fixed per-step host term re-fitted: the line through the 6- and 12-layer step
    times (median TPOT, no MTP), for the defaults and for the best combination, beside the declared
    one and as a share of a DGX Spark step (the Spark stack's bytes at 273 GB/s plus the fixed cost)."""
    from sparkit.recipes.load import load_recipe
    from sparkit.roofline.bandwidth import Bandwidth
    from sparkit.roofline.estimate import estimate
    from sparkit.roofline.published import H200_HOST_STEP, PUBLISHED, HostStepCost

    study = next(f for f in PUBLISHED if f.recipe == SPARK_RECIPE)  # its workload: 32K in / 2K out
    spark = estimate(load_recipe(SPARK_RECIPE).recipe, context=study.context,
                     bandwidth=Bandwidth(GB10_GB_S, 1, "spec", "GB10 spec sheet"))
    read_ms = spark.step_bytes / (GB10_GB_S * 1e9) * 1000.0
    lines = [f"declared: {H200_HOST_STEP.fixed_ms:.3f} ms fixed + {H200_HOST_STEP.per_layer_ms * 1000:.1f} us a layer "
             f"({H200_HOST_STEP.source}): {H200_HOST_STEP.share_of_step(spark.step_bytes, GB10_GB_S):.1%} of a Spark "
             f"step ({SPARK_RECIPE} at the study's {study.context:,}-token context: {spark.step_bytes / 1e9:.2f} GB, "
             f"{read_ms:.1f} ms at {GB10_GB_S:.0f} GB/s)"]
    fits_out = []
    for label, six, twelve in (("defaults", ("plain6", "base"), ("l12", "base")), ("best", ("plain6", "best"), ("l12", "best"))):
        n6 = [n for n in session.results["order"] if (session.results["variants"][n]["phase"],
                                                      session.results["variants"][n]["role"]) == six]
        n12 = [n for n in session.results["order"] if (session.results["variants"][n]["phase"],
                                                       session.results["variants"][n]["role"]) == twelve]
        s6, s12 = step_ms(session, n6), step_ms(session, n12)
        if s6 is None or s12 is None:
            lines.append(f"re-fit {label}: needs a 6- and a 12-layer server ({len(n6)} and {len(n12)} measured)")
            continue
        fitted = lw.line_fit([(6, s6), (12, s12)])
        term = HostStepCost(fitted[0], fitted[1], "this run", label)
        share = term.share_of_step(spark.step_bytes, GB10_GB_S)
        fits_out.append({"label": label, "fixed_ms": term.fixed_ms, "per_layer_ms": term.per_layer_ms,
                         "step6_ms": s6, "step12_ms": s12, "spark_share": share, "spark_read_ms": read_ms})
        lines.append(f"re-fit {label}: step = {term.fixed_ms:.3f} ms + {term.per_layer_ms * 1000:.1f} us x layers "
                     f"(6 layers {s6:.3f} ms, 12 layers {s12:.3f} ms): {share:.1%} of a Spark step "
                     f"({read_ms:.1f} ms of reads + {term.fixed_ms:.2f} ms)")
    session.results["host_term"] = {"declared": {"fixed_ms": H200_HOST_STEP.fixed_ms, "source": H200_HOST_STEP.source,
                                                 "spark_share": H200_HOST_STEP.share_of_step(spark.step_bytes, GB10_GB_S)},
                                    "fits": fits_out, "spark_step_bytes": spark.step_bytes}
    return lines


def report(session: lw.Session) -> None:
    session.say("the table (A = the bases around each switch, B = the switch; tok/s = 1 / median TPOT):")
    lines = table(session) + goal(session)
    try:
        lines += host_term(session)
    except Exception as exc:  # noqa: BLE001 - the report of what was measured must still be written
        lines.append(f"host term: not computed ({type(exc).__name__}: {exc})")
    for line in lines:
        session.say(line)
    (session.out / "table.txt").write_text("\n".join(lines) + "\n")
    session.save()


# ------------------------------------------------------------------------------ main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer-from", type=Path, default=None,
                        help="a tokenizer directory (the kit's make_tiny_v3.py output); padded to Ling's vocabulary")
    parser.add_argument("--models", type=Path, default=Path("/tmp/host-gap-models"))
    parser.add_argument("--phases", default=os.environ.get("HOSTGAP_PHASES", "plain6,l12,nextn6"))
    parser.add_argument("--switches", default=os.environ.get("HOSTGAP_SWITCHES", ""),
                        help="comma-separated switch labels to measure alone (default: every one that applies)")
    parser.add_argument("--budget-s", type=float, default=float(os.environ.get("HOSTGAP_BUDGET_S", 420)))
    parser.add_argument("--server-timeout-s", type=float, default=360)
    parser.add_argument("--max-servers", type=int, default=None,
                        help="start at most this many servers in this call (brackets are never left open by it)")
    parser.add_argument("--resume", type=Path, default=None, help="a directory holding an earlier call's results.json")
    parser.add_argument("--rehearse", action="store_true", help="the embedded engine stands in (no GPU needed)")
    args = parser.parse_args(argv)
    args.phase_list = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in args.phase_list if p not in PHASES]
    if unknown:
        parser.error(f"--phases: unknown {', '.join(unknown)} (known: {', '.join(PHASES)})")
    args.switch_list = [s.strip() for s in args.switches.split(",") if s.strip()]
    bad = [s for s in args.switch_list if s not in SWITCHES]
    if bad:
        parser.error(f"--switches: unknown {', '.join(bad)} (known: {', '.join(SWITCHES)})")
    if not args.rehearse and args.tokenizer_from is None:
        parser.error("--tokenizer-from DIR is needed to serve the Ling-width models (the kit's make_tiny_v3.py output)")
    return args


def open_session(args) -> lw.Session:
    """The session in --out; an earlier call's results from --out itself or --resume carried in."""
    session = lw.Session(args.out, args.budget_s)
    kept = args.out / "results.json"
    source = kept if kept.exists() else (args.resume / "results.json" if args.resume else None)
    if source is not None and source.exists():
        session.results = json.loads(source.read_text())
        session.results.setdefault("calls", [])
        if source != kept:
            for name in ("summary.txt", "table.txt"):
                if (args.resume / name).exists() and not (args.out / name).exists():
                    shutil.copy(args.resume / name, args.out / name)
        session.say(f"resuming from {source}: {len(session.results['order'])} server(s) already measured")
    else:
        session.results = {"issue": 38, "variants": {}, "order": [], "phases": {}, "calls": [], "notes": [
            "dummy (random) weights: a NEXTN draft accepts about one token; NEXTN figures show the machinery's "
            "cost, not its gain", "one server at a time: every server is stopped before the next starts"]}
        if args.rehearse:
            session.results["notes"].append("REHEARSAL: the embedded engine's tiny-ling stands in for every server "
                                            "(SGLang's flags left out); the figures are this CPU's and mean nothing")
    session.results["calls"].append({"machine": machine_id(), "budget_s": args.budget_s, "phases": args.phase_list,
                                     "order_at_start": len(session.results["order"]), "max_servers": args.max_servers,
                                     "switches": args.switch_list or "default", "rehearsal": args.rehearse,
                                     "started_at": time.time()})
    session.save()
    return session


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    session = open_session(args)
    models = make_models(session, args.models, args.tokenizer_from, args.rehearse)
    recipes = args.out / "recipes"
    recipes.mkdir(parents=True, exist_ok=True)
    try:
        for name in args.phase_list:
            phase = PHASES[name]
            session.say(f"{name}: begins ({session.left():.0f} s of the budget left)")
            if name == "l12":
                how = run_l12(session, recipes, models, args)
            else:
                singles = tuple(s for s in (args.switch_list or DEFAULT_SINGLES[phase.mode])
                                if phase.mode in SWITCHES[s].modes)
                how = run_chain(session, phase, singles, recipes, models, args)
            session.results["phases"][name] = how
            session.say(f"{name}: {how}")
            session.save()
    finally:
        lw.down_all(session)
        report(session)
        session.say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
