#!/usr/bin/env bash
# Device side of the real-SGLang session: sparkit's whole SGLang path on one H200, end to end.
# Prepared on the CPU machine by prepare.sh (which prints the `run` calls); here, from the
# repository root, in the call that carries the last piece:
#
#     OUT=/some/dir bash benchmarks/sglang_h200/session.sh
#     OUT=/some/dir STEPS=setup,main,ab,traps bash benchmarks/sglang_h200/session.sh   (a subset)
#
# Steps (STEPS, comma-separated; default all, in this order):
#   setup   unpack the kit (torch 2.14.1 + sglang 0.5.23) and the sparkit wheels the device lacks;
#           `sparkit doctor`; `sparkit model export-hf` (the shipped tiny-ling as BailingMoeV2)
#   launch  every server below at once, in the background, through `sparkit up --port auto`:
#           main     tiny/tiny-sglang (FP8 lm_head via the plugin, NEXTN 3/1/4, decode CUDA graphs)
#           ab       four variants of it: bf16 head, no MTP, bf16 + no MTP, no CUDA graphs
#           traps    tiny/tiny-sglang-unshared-head and -wrong-draft: their checks must fail (exit 6)
#           verify   `sparkit verify` NEXTN against plain decoding, both with the FP8 head
#           v3       a tiny BailingMoeV3 (Ling-3.0's KDA + MLA layout, dummy weights) + NEXTN + plugin
#           humming  tiny/tiny-sglang-humming (online MXFP4 experts through humming)
#           quant    tiny/tiny-sglang-fp8 (block-128 FP8 export, Triton MoE), tiny/tiny-sglang-mxfp4
#                    (MXFP4 export, humming pre-quantised) and tiny/tiny-sglang-damaged-scale (its known
#                    answer must fail: exit 6); each exports its checkpoint first (seconds)
#   tp      (not in the default: only on a machine of 2 or 4 GPUs, with the real NCCL carried; run
#           as STEPS=setup,tp) TP2: `sparkit verify tiny/tiny-sglang-tp2 --against tiny/tiny-sglang`
#           (greedy outputs TP2 vs TP1), up/check/bench/down of the TP2 recipe, both ranks' reports;
#           with 4 GPUs also ling-3.0-flash/tp4-nextn-h200 on a tiny BailingMoeV3 (dummy weights)
#           at TP1/TP2/TP4, and SGLang's own error for FP8 block-128 experts of width 768 split TP4
#   main    on the main server: status, logs, check, a logprob capture for the cross-engine
#           comparison, bench, eval gsm8k, sglang.bench_serving (SGLang's own client, same shape as
#           bench), a Pilot chat session, /metrics, the API-shape capture (benchmarks/api_shapes_capture.py),
#           down (then: no process left)
#   ab      the five main-stack variants decoded interleaved, request by request
#   quant   the quantised exports: each run's checks.json, known-answer perplexity against the bf16
#           export's (the main server's), accept length, start-up time, decode tok/s of bf16 / fp8 /
#           mxfp4 interleaved (benchmarks/decode_interleaved.py), the export headers, the server logs;
#           one table (benchmarks/sglang_h200/quant_table.py) in summary.txt and quant-table.json
#   ladder  (not in the default; add it: STEPS=setup,ladder or STEPS=setup,ladder,launch,main,...)
#           `sparkit ladder tiny-sglang` in the background from right after setup to the end of the
#           call: bf16/triton -> + Humming online MXFP4 (the plugin's keyword fix) -> + FP8 head ->
#           + NEXTN, one server at a time, each with its startup checks, decode tok/s on one workload,
#           accept length, known answer and 10 GSM8K questions (McNemar against step 1); the
#           document $W/ladder.json is rewritten after every step and its table lands in summary.txt.
#           Budget LADDER_BUDGET (default 560 s from the start of the call; then SIGINT: the ladder
#           saves its finished steps and stops its server); LADDER_ARGS adds flags (e.g. --set ...);
#           LADDER_RESUME=DIR (a carried copy of an earlier call's ladder*.json files) continues it.
#           About 70-100 s a step on the H200 (start with decode graphs, checks, bench, GSM8K; the
#           first Humming step also JIT-compiles its kernels): ~6-7 minutes, so alone with setup
#           (STEPS=setup,ladder) it fits one call; beside other servers it may not finish, and keeps
#           the steps it did.
#   v3trained (not in the default: run as STEPS=setup,v3trained, alone in its call; ~6-8 minutes, the
#           first V3 start JIT-compiles the KDA kernels) the shipped, trained tiny-ling-v3 through its
#           BailingMoeV3 export, ONE SERVER AT A TIME: tiny/tiny-v3-sglang-baseline (bf16 head, no
#           MTP: SGLang's own numbers) then tiny/tiny-v3-sglang (FP8 head via the plugin, NEXTN
#           3/1/4); for each: its startup checks (known answer, accept length), `sparkit check`, the
#           cross-engine capture (benchmarks/cross_engine_capture.py: greedy outputs, logprobs and
#           the known answer as the check computes it) into $W/v3-capture-{baseline,nextn}.json, a
#           short bench, down. Copy the two captures to tests/fixtures/sglang-0.5.23-h200/ and run
#           benchmarks/cross_engine_agreement.py on each against sparkit/models/tiny_ling_v3/checkpoints/tiny-ling-v3-s0.
#           V3_VARIANTS="label:recipe ..." picks the servers, in order (session 13, two calls:
#           baseline, nextn | dspark:tiny/tiny-v3-sglang-dspark, baseline2:tiny/tiny-v3-sglang-baseline,
#           trap:tiny/tiny-v3-sglang-dspark-random-draft; ~75-180 s a server on an H100, the first
#           compiles), V3_ARGS more `up`/`plan` arguments for all of them; `down --all` after each.
#   ling    (not in the default: run as STEPS=setup,ling, alone in its call) Ling-3.0-flash at its own
#           widths, dummy weights (issue 25): benchmarks/ling_width.py, ~7 min in LING_BUDGET_S=450 s:
#           the memory fit against SGLang's log, decode vs the roofline at 6 and 12 layers (bf16 vs FP8
#           head, plain vs NEXTN), /start_profile step breakdowns, the preflight refusing a server that
#           two starting ones leave no room for. LING_PHASES=extra in a second call (~3 min + setup):
#           bf16 head + NEXTN, FP8 block experts at 6 and 12 layers. Results under ling/ in the tarball.
#   hostgap (not in the default: run as STEPS=setup,hostgap or STEPS=hostgap in a later call of the
#           same warm machine) the host gap at batch 1 (issue 38): benchmarks/host_gap.py, SGLang
#           0.5.23's host-side switches (docs/host-gap.md) at Ling widths, ONE SERVER AT A TIME in
#           A/B/A order, each through `sparkit up --detach` and `sparkit down`: decode tok/s, TTFT,
#           accept length, the GPU-busy fraction from /start_profile. Knobs: HOSTGAP_BUDGET_S (420;
#           a bracket that cannot fit is not started, and said), HOSTGAP_PHASES (plain6,l12,nextn6),
#           HOSTGAP_SWITCHES (default: every switch that applies), HOSTGAP_RESUME=DIR (a carried
#           copy of an earlier call's hostgap/results.json: continues it; on the same warm machine
#           $W/hostgap is kept and continued anyway). Results under hostgap/ in the tarball and
#           $OUT/hostgap-results.json; the table in summary.txt. Exact calls and their seconds:
#           benchmarks/sglang_h200/README-hostgap.md.
#
# Batch-1 figures are sound only one server at a time (issue 38: with several servers up the FP8
# head's +15% read as "within noise"). `hostgap` and `ladder` start one server at a time. The older
# steps still measure side by side, and their figures say so: `ab` decodes five variants
# interleaved while all five are up (with main's server, traps, verify and quant starting beside
# them), `quant` decodes the bf16/fp8/mxfp4 exports interleaved while up together, and `ling`'s
# phases start two or three servers together on purpose (the memory fit of servers that start
# together is what issue 25 tested). Their speeds compare the variants under the same shared load
# (request by request, so drift hits all alike), not each one alone; use `hostgap` (or `sparkit
# ladder`) for figures that compare stacks.
# The recipes cap the KV pool (--max-total-tokens), so the servers can start together: SGLang sizes
# its pool from the memory free when it starts, and a tiny model needs a small pool anyway.
# REHEARSE=1 runs the same control flow on a machine without a GPU: the embedded engine's tiny
# recipes stand in for the SGLang ones, and setup, v3 and humming are skipped.
# Everything lands in $OUT/session.tgz (work files + the run directories: server logs, /server_info,
# activation reports, checks.json), rewritten after every step so that a call cut short by its
# limit still brings back what ran, and $OUT/summary.txt (the `run` tool returns few files).
set -u
OUT=${OUT:-/tmp/sglang-session}
STEPS=${STEPS:-setup,launch,main,ab,traps,verify,v3,humming,quant}
REPO=$(pwd)
# the work files and sparkit's home, packed into $OUT/session.tgz ($OUT itself holds two files);
# SESSION_W / SESSION_HOME move them (a rehearsal beside another on the same machine)
W=${SESSION_W:-/tmp/sglang-session-w}
SK_HOME=${SESSION_HOME:-/tmp/sparkit-home}
mkdir -p "$W" "$OUT"
T0=$(date +%s)
stamp() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
has() { [[ ",$STEPS," == *",$1,"* ]]; }
save() {  # atomic: a call cut short mid-write keeps the previous tarball
  cp "$OUT/summary.txt" "$W/" 2>/dev/null
  tar -czf "$OUT/.session.tgz.$$" -C "$(dirname "$W")" "$(basename "$W")" -C "$(dirname "$SK_HOME")" "$(basename "$SK_HOME")/runs" 2>/dev/null
  mv -f "$OUT/.session.tgz.$$" "$OUT/session.tgz" 2>/dev/null
}
sk() { python3 -m sparkit.cli.main "$@"; }
REHEARSE=${REHEARSE:-0}
recipe() {  # the recipe to run (under REHEARSE, the embedded engine's counterpart)
  if [ "$REHEARSE" = 1 ]; then echo "$1" | sed -e 's#tiny/tiny-sglang-unshared-head#tiny/tiny-unshared-head#' \
    -e 's#tiny/tiny-sglang-wrong-draft#tiny/tiny-wrong-draft#' -e 's#tiny/tiny-sglang$#tiny#' \
    -e 's#tiny/tiny-sglang-\(fp8\|mxfp4\|damaged-scale\)$#tiny#'; else echo "$1"; fi
}
# The quantised-export recipes as (label recipe); under REHEARSE the embedded engine serves the
# same exports (`tiny` with the model path and weights the SGLang recipe names).
QUANT="fp8:tiny/tiny-sglang-fp8 mxfp4:tiny/tiny-sglang-mxfp4 damaged:tiny/tiny-sglang-damaged-scale"
quant_sets() {  # RECIPE: the --set arguments that make `tiny` serve that recipe's export (REHEARSE only)
  [ "$REHEARSE" = 1 ] || return 0
  case "$1" in
    tiny/tiny-sglang-fp8) echo "--set model.path=sparkit:tiny-ling@fp8 --set stack.weights=fp8" ;;
    tiny/tiny-sglang-mxfp4) echo "--set model.path=sparkit:tiny-ling@mxfp4 --set stack.weights=mxfp4" ;;
    tiny/tiny-sglang-damaged-scale) echo "--set model.path=sparkit:tiny-ling@fp8+damaged-scale --set stack.weights=fp8" ;;
  esac
}
[ "$REHEARSE" = 1 ] && STEPS=$(echo ",$STEPS," | sed -e 's/,setup,/,/; s/,v3,/,/; s/,humming,/,/')
LING_BUDGET_S=${LING_BUDGET_S:-450}
HOSTGAP_BUDGET_S=${HOSTGAP_BUDGET_S:-420}
json_field() { python3 -c "import json,sys;print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2" 2>/dev/null; }

if has setup; then
  stamp "setup: the kit (torch 2.14.1, sglang 0.5.23)"
  bash .sglang-h200/scripts/dev_setup.sh > "$W/setup.log" 2>&1
  stamp "setup rc=$?"; tail -n 12 "$W/setup.log" | tee -a "$OUT/summary.txt"
fi
if has setup && [ -f /tmp/acc/libnccl.so.2.xz ] && [ -f /tmp/sglenv.sh ]; then
  # The real NCCL 2.30.7 that torch 2.14.1 pins (prepare.sh NCCL=1) instead of the single-GPU stub.
  mkdir -p /tmp/nccl && xz -d -c /tmp/acc/libnccl.so.2.xz > /tmp/nccl/libnccl.so.2
  sed -i 's#^export LD_PRELOAD=.*#export LD_PRELOAD=/tmp/nccl/libnccl.so.2#' /tmp/sglenv.sh
  stamp "real NCCL: $(strings /tmp/nccl/libnccl.so.2 | grep -m1 -o 'NCCL version [0-9.]*')"
fi
if [ "$REHEARSE" != 1 ]; then
  if [ ! -f /tmp/sglenv.sh ]; then stamp "no /tmp/sglenv.sh: this machine was not set up"; save; exit 3; fi
  # shellcheck disable=SC1091
  source /tmp/sglenv.sh
fi
export PYTHONPATH=$REPO:/tmp/site:/tmp/sparkit-deps
export SPARKIT_HOME=$SK_HOME PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0

if has setup; then
  # sparkit's own dependencies: only the wheels whose top-level modules this python cannot import
  # (never shadow what the image or the kit gives sglang); the CUDA C++ headers for humming always
  wheels=$(python3 - <<'PY'
import importlib.util, pathlib, zipfile
out = []
# /tmp/acc/bdeps: what sglang.bench_serving needs (prepare.sh BENCH_SERVING=1), when carried
for wheel in sorted([*pathlib.Path("/tmp/acc/deps").glob("*.whl"), *pathlib.Path("/tmp/acc/bdeps").glob("*.whl")]):
    names = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    tops = {n.removesuffix(".py") for n in names if not n.endswith((".dist-info", ".data", ".pth"))}
    def importable(name):
        try:
            return importlib.util.find_spec(name) is not None
        except Exception:
            return False
    if wheel.name.startswith("nvidia_cuda_cccl") or not all(importable(t) for t in tops if t.isidentifier()):
        out.append(str(wheel))
print(" ".join(out))
PY
)
  stamp "installing: $(for w in $wheels; do basename "$w" | cut -d- -f1; done | tr '\n' ' ')"
  # shellcheck disable=SC2086
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sparkit-deps $wheels > "$W/deps.log" 2>&1
  stamp "deps installed rc=$?"
  python3 -c "import sparkit, sparkit.cli.main, sglang, torch; print('sparkit', sparkit.__file__, 'sglang', sglang.__version__, 'torch', torch.__version__)" 2>&1 | tail -n 3 | tee -a "$OUT/summary.txt"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
  timeout 60 python3 -m sparkit.cli.main doctor --json > "$W/doctor.json" 2> "$W/doctor.err"; stamp "doctor rc=$?"
  # The GPU's and the CPU's bandwidth in 5 rounds each (the best kept), with the load they were taken at
  # (~15 s; REHEARSE measures the CPU only).
  timeout 120 python3 -m sparkit.cli.main doctor --bandwidth --json > "$W/bandwidth.json" 2> "$W/bandwidth.err"
  stamp "doctor --bandwidth rc=$? $(python3 -c "import json,sys;print([(m['device'],round(m['read_gb_s']),m['busy']) for m in json.load(open(sys.argv[1]))['bandwidth']['measured_now']])" "$W/bandwidth.json" 2>/dev/null)"
  timeout 120 python3 -m sparkit.cli.main model export-hf --json > "$W/export.json" 2> "$W/export.err"
  stamp "export rc=$? $(json_field "$W/export.json" path)"
  mkdir -p "$W/tiny-ling-hf" && cp "$(json_field "$W/export.json" path)"/*.json "$W/tiny-ling-hf/" 2>/dev/null
  save
fi

# ---- ladder (issue 24, item 4) ------------------------------------------------------------------
# Started before the launch step so that its four servers, one after another, overlap everything
# else; collected before the final `down --all`. Kept apart from the other steps on purpose.
if has ladder; then
  LADDER=${LADDER:-tiny-sglang}; [ "$REHEARSE" = 1 ] && LADDER=tiny
  ladder_gsm8k=$REPO/.sglang-h200/gsm8k/test.jsonl
  [ -f "$ladder_gsm8k" ] || ladder_gsm8k=${SPARKIT_SHARED_DIR:-$REPO/../shared}/data/gsm8k/test.jsonl
  ladder_budget=$(( ${LADDER_BUDGET:-560} - ($(date +%s) - T0) ))
  ladder_resume=""
  if [ -n "${LADDER_RESUME:-}" ] && [ -f "$LADDER_RESUME/ladder.json" ]; then
    cp "$LADDER_RESUME"/ladder*.json* "$W/" 2>/dev/null; ladder_resume=--resume
  fi
  stamp "ladder: sparkit ladder $LADDER in the background (budget ${ladder_budget}s${ladder_resume:+, resuming})"
  # shellcheck disable=SC2086
  (timeout -s INT -k 30 "$ladder_budget" python3 -m sparkit.cli.main ladder "$LADDER" --gsm8k 10 \
     --gsm8k-data "$ladder_gsm8k" --out "$W/ladder.json" $ladder_resume --json ${LADDER_ARGS:-} > "$W/ladder-out.json" 2> "$W/ladder.err"
   echo "ladder rc=$?" >> "$W/ladder.err") &
  LADDER_PID=$!
fi

BG=""
up_bg() {  # NAME RECIPE ARGS...: `sparkit up --port auto --detach` in the background
  local name=$1; shift
  local what=$1; shift
  (timeout 480 python3 -m sparkit.cli.main up "$(recipe "$what")" "$@" --port auto --detach --timeout 420 --json \
     > "$W/$name-up.json" 2> "$W/$name-up.err"; echo "$name up rc=$?" >> "$W/$name-up.err") &
  BG="$BG $!"
}
VARIANTS="bf16-nextn:stack.lm_head=bf16 fp8-plain:stack.speculative=none bf16-plain:stack.lm_head=bf16,stack.speculative=none fp8-nextn-nographs:server.cuda_graph.enabled=false"
if has launch; then
  stamp "launch: every server at once"
  has main && up_bg main tiny/tiny-sglang --keep-on-fail
  if has ab; then
    for v in $VARIANTS; do
      label=${v%%:*}; sets=${v#*:}; args=""
      for s in ${sets//,/ }; do args="$args --set $s"; done
      # shellcheck disable=SC2086
      up_bg "ab-$label" tiny/tiny-sglang $args
    done
  fi
  if has traps; then up_bg unshared-head tiny/tiny-sglang-unshared-head; up_bg wrong-draft tiny/tiny-sglang-wrong-draft; fi
  if has verify; then
    # --greedy-only: the kit has no flashinfer, and SGLang's NEXTN verify step dies on the first sampled
    # request without it (seen in the first two sessions: exit 7); the greedy gate still runs.
    (timeout 480 python3 -m sparkit.cli.main verify "$(recipe tiny/tiny-sglang)" --against "$(recipe tiny/tiny-sglang)" \
       --against-set stack.speculative=none --greedy-only --json > "$W/verify.json" 2> "$W/verify.err"; echo "verify rc=$?" >> "$W/verify.err") &
    BG="$BG $!"
  fi
  if has humming; then up_bg humming tiny/tiny-sglang-humming; fi
  if has quant; then
    for q in $QUANT; do
      # the damaged one must fail its known answer and be stopped (exit 6); the others stay up for the decode
      keep=--keep-on-fail; [ "${q%%:*}" = damaged ] && keep=""
      # shellcheck disable=SC2046
      up_bg "quant-${q%%:*}" "${q#*:}" $keep $(quant_sets "${q#*:}")
    done
  fi
  if has v3; then
    (cd /tmp && python3 "$REPO/.sglang-h200/scripts/make_tiny.py" /tmp/models > "$W/v3-make.log" 2>&1 \
       && python3 "$REPO/.sglang-h200/scripts/make_tiny_v3.py" /tmp/models >> "$W/v3-make.log" 2>&1)
    cat > /tmp/tiny-v3.yaml <<EOF
description: tiny BailingMoeV3 (Ling-3.0 layout, KDA + MLA), dummy weights, NEXTN 2/1/3, FP8 lm_head via the plugin
extends: tiny/tiny-sglang
model:
  path: /tmp/models/tiny-bailing-v3-mtp
  served_name: tiny-v3
  trust_remote_code: true
stack:
  speculative: {method: nextn, num_steps: 2, eagle_topk: 1, num_draft_tokens: 3}
server:
  extra_args: ["--load-format", "dummy", "--max-total-tokens", "65536"]
EOF
    up_bg v3 /tmp/tiny-v3.yaml
  fi
fi

if has main; then
  stamp "main: waiting for sparkit up tiny/tiny-sglang"
  while [ ! -s "$W/main-up.json" ] && ! grep -q "up rc=" "$W/main-up.err" 2>/dev/null; do sleep 2; done
  sleep 1
  stamp "$(tail -n 1 "$W/main-up.err")"
  URL=$(json_field "$W/main-up.json" url); RUN=$(json_field "$W/main-up.json" run)
  stamp "main url=$URL run=$RUN"; save
  if [ -n "$URL" ]; then
    timeout 30 python3 -m sparkit.cli.main status --json > "$W/main-status.json" 2>&1; stamp "status rc=$?"
    timeout 30 python3 -m sparkit.cli.main status > "$W/main-status.txt" 2>&1
    timeout 30 python3 -m sparkit.cli.main logs "$RUN" --lines 40 > "$W/main-logs.txt" 2>&1; stamp "logs rc=$?"
    curl -s "$URL/server_info" > "$W/main-server_info.json"; curl -s "$URL/model_info" > "$W/main-model_info.json"
    # the tokenizer of the checkpoint the server loaded (the export; the shipped build when rehearsing)
    tok_dir=$(json_field "$W/export.json" path); [ -d "$tok_dir" ] || tok_dir=$REPO/sparkit/models/tiny_ling/checkpoints/tiny-ling-s0
    timeout 90 python3 benchmarks/cross_engine_capture.py "$URL" "$tok_dir" "$W/capture-fp8-nextn.json" 2>&1 | tail -n 2 | tee -a "$OUT/summary.txt"
    timeout 120 python3 -m sparkit.cli.main check "$RUN" --json > "$W/main-check.json" 2> "$W/main-check.err"; stamp "check rc=$?"
    timeout 150 python3 -m sparkit.cli.main bench "$RUN" --input-len 256 --output-len 256 --num-prompts 6 --json \
      --out "$W/main-bench-result.json" > "$W/main-bench.json" 2> "$W/main-bench.err"; stamp "bench rc=$?"
    timeout 150 python3 -m sparkit.cli.main eval gsm8k "$RUN" --data "$REPO/.sglang-h200/gsm8k/test.jsonl" --limit 20 \
      --greedy --shots 1 --max-tokens 128 --out "$W/main-gsm8k.jsonl" --json > "$W/main-eval.json" 2> "$W/main-eval.err"
    stamp "eval rc=$?"
    # SGLang's own benchmark client, unmodified, at the same shape as `sparkit bench` above: the two
    # clients' figures side by side (and the same client the embedded engine is tested with in CI).
    HF_HUB_OFFLINE=1 timeout 150 python3 -m sglang.bench_serving --backend sglang --base-url "$URL" \
      --dataset-name random-ids --random-input-len 256 --random-output-len 256 --random-range-ratio 1 \
      --num-prompts 6 --tokenizer "$tok_dir" --request-rate inf --max-concurrency 1 --disable-tqdm \
      --output-file "$W/main-bench-serving.jsonl" > "$W/main-bench-serving.txt" 2>&1
    stamp "sglang.bench_serving rc=$? $(grep -E "Output token throughput|Mean TPOT|Accept length" "$W/main-bench-serving.txt" | tr -s ' ' | tr '\n' ';')"
    timeout 120 python3 benchmarks/chat_session.py "$URL" "$W/main-chat" > "$W/main-chat.txt" 2>&1; stamp "chat rc=$?"
    curl -s "$URL/server_info" > "$W/main-server_info-after.json"
    curl -s "$URL/metrics" > "$W/main-metrics.txt"
    # issue 28: how this server answers batches, n, sampling fields, grammars, errors, Ollama and the
    # small routes; compared with the embedded engine's answers to the same requests (~30 s)
    timeout 180 python3 benchmarks/api_shapes_capture.py capture "$URL" "$W/main-api-shapes.json" 2>&1 | tail -n 1 | tee -a "$OUT/summary.txt"
    save
  fi
fi

if has ab; then
  stamp "ab: waiting for the variants"
  urls=""
  [ -n "${URL:-}" ] && urls="fp8-nextn=$URL"
  for v in $VARIANTS; do
    label=${v%%:*}
    while [ ! -s "$W/ab-$label-up.json" ] && ! grep -q "up rc=" "$W/ab-$label-up.err" 2>/dev/null; do sleep 2; done
    sleep 1
    url=$(json_field "$W/ab-$label-up.json" url)
    stamp "ab $label: $(tail -n 1 "$W/ab-$label-up.err") url=$url"
    [ -n "$url" ] && urls="$urls $label=$url"
  done
  stamp "interleaved decode over: $urls"
  # shellcheck disable=SC2086
  timeout 240 python3 benchmarks/decode_interleaved.py $urls --input-len 256 --output-len 256 --num-prompts 6 --repeats 2 \
    --json "$W/ab-decode.json" > "$W/ab-decode.txt" 2>&1
  stamp "interleaved rc=$?"; tee -a "$OUT/summary.txt" < "$W/ab-decode.txt"; save
fi

if has quant; then
  stamp "quant: waiting for the quantised-export servers"
  qurls=""
  # the main server (the bf16 export, the same stack), while it still runs: the main step stops it
  # when it is done (session 7 interleaved nothing because of that)
  [ -n "${URL:-}" ] && python3 -c "import sys,urllib.request; urllib.request.urlopen(sys.argv[1] + '/health', timeout=5)" \
    "$URL" 2>/dev/null && qurls="bf16=$URL"
  for q in $QUANT; do
    label=${q%%:*}
    # `up --detach` writes its JSON, then exits: its exit code is the last line of its .err
    while ! grep -q "up rc=" "$W/quant-$label-up.err" 2>/dev/null; do sleep 2; done
    url=$(json_field "$W/quant-$label-up.json" url)
    stamp "quant $label: $(tail -n 1 "$W/quant-$label-up.err") url=$url"
    [ "$label" != damaged ] && [ -n "$url" ] && qurls="$qurls $label=$url"
  done
  # the exports as SGLang read them: config.json (quantization_config) and every tensor's header
  for x in "$SK_HOME"/cache/models/tiny-ling-s0-hf-*; do
    [ -d "$x" ] || continue
    mkdir -p "$W/exports/${x##*/}" && cp "$x"/*.json "$W/exports/${x##*/}/" 2>/dev/null
    python3 -c "import sys; from sparkit.checkpoint_headers import read_safetensors_index as r; \
print('\n'.join(f'{t.name} {t.dtype} {list(t.shape)}' for t in sorted(r(sys.argv[1]).tensors.values(), key=lambda t: t.name)))" \
      "$x" > "$W/exports/${x##*/}/headers.txt" 2>&1
  done
  if [ "$(echo "$qurls" | wc -w)" -ge 2 ]; then
    stamp "quant: interleaved decode over: $qurls"
    # shellcheck disable=SC2086
    shape="--input-len 256 --output-len 256 --num-prompts 4 --repeats 2"
    [ "$REHEARSE" = 1 ] && shape="--input-len 64 --output-len 32 --num-prompts 2 --repeats 1"  # CPU decodes ~30 tok/s
    # shellcheck disable=SC2086
    timeout 150 python3 benchmarks/decode_interleaved.py $qurls $shape --json "$W/quant-decode.json" > "$W/quant-decode.txt" 2>&1
    stamp "quant interleaved rc=$?"; tee -a "$OUT/summary.txt" < "$W/quant-decode.txt"
  fi
  timeout 60 python3 benchmarks/sglang_h200/quant_table.py "$W" "$SK_HOME/runs" --json "$W/quant-table.json" \
    2>&1 | tee -a "$OUT/summary.txt"
  for q in $QUANT; do
    r=$(json_field "$W/quant-${q%%:*}-up.json" run)
    [ -n "$r" ] && timeout 60 python3 -m sparkit.cli.main down "$r" > /dev/null 2>&1
  done
  save
fi

if has ling; then
  # Ling-3.0-flash widths on the real engine (issue 25). The tokenizer comes from the kit's tiny
  # models (make_tiny.py, make_tiny_v3.py); benchmarks/ling_width.py pads it to Ling's vocabulary.
  stamp "ling: Ling-3.0-flash at its widths, dummy weights (budget ${LING_BUDGET_S} s)"
  LING_ARGS="--tokenizer-from /tmp/models/tiny-bailing-v3-mtp"
  if [ "$REHEARSE" = 1 ]; then
    LING_ARGS="--rehearse"
  else
    (cd /tmp && python3 "$REPO/.sglang-h200/scripts/make_tiny.py" /tmp/models > "$W/ling-make.log" 2>&1 \
       && python3 "$REPO/.sglang-h200/scripts/make_tiny_v3.py" /tmp/models >> "$W/ling-make.log" 2>&1)
  fi
  # the tarball is rewritten every 40 s meanwhile: a call cut short by its limit still brings back
  # what was measured (results.json and summary.txt are written as the script goes)
  ( while sleep 40; do save; done ) &
  SAVER=$!
  # shellcheck disable=SC2086
  timeout $((LING_BUDGET_S + 70)) python3 benchmarks/ling_width.py --out "$W/ling" --budget-s "$LING_BUDGET_S" \
    --phases "${LING_PHASES:-base,l12}" $LING_ARGS \
    > "$W/ling.txt" 2>&1
  stamp "ling rc=$?"
  kill "$SAVER" 2>/dev/null; wait "$SAVER" 2>/dev/null; grep -E "^\[\+ *[0-9]+s\] (model|[A-I] L|  [A-I] |memory|  state|  KV|line|profile|  |step|bandwidth|base|l12|extra|config)" \
    "$W/ling/summary.txt" 2>/dev/null | cut -c1-220 | tail -n 90 >> "$OUT/summary.txt"
  save
fi

if has hostgap; then
  # SGLang's host-side switches at Ling widths, one server at a time (issue 38). The tokenizer comes
  # from the kit's tiny models, as for `ling`.
  stamp "hostgap: the host gap at batch 1, one server at a time (budget ${HOSTGAP_BUDGET_S} s)"
  HG_ARGS="--tokenizer-from /tmp/models/tiny-bailing-v3-mtp"
  if [ "$REHEARSE" = 1 ]; then
    HG_ARGS="--rehearse"
  elif [ ! -d /tmp/models/tiny-bailing-v3-mtp ]; then
    (cd /tmp && python3 "$REPO/.sglang-h200/scripts/make_tiny.py" /tmp/models > "$W/hostgap-make.log" 2>&1 \
       && python3 "$REPO/.sglang-h200/scripts/make_tiny_v3.py" /tmp/models >> "$W/hostgap-make.log" 2>&1)
  fi
  [ -n "${HOSTGAP_RESUME:-}" ] && HG_ARGS="$HG_ARGS --resume $HOSTGAP_RESUME"
  ( while sleep 40; do save; cp "$W/hostgap/results.json" "$OUT/hostgap-results.json" 2>/dev/null; done ) &
  SAVER=$!
  # shellcheck disable=SC2086
  timeout -s INT -k 60 $((HOSTGAP_BUDGET_S + 90)) python3 benchmarks/host_gap.py --out "$W/hostgap" --budget-s "$HOSTGAP_BUDGET_S" \
    --phases "${HOSTGAP_PHASES:-plain6,l12,nextn6}" ${HOSTGAP_SWITCHES:+--switches "$HOSTGAP_SWITCHES"} $HG_ARGS \
    > "$W/hostgap.txt" 2>&1
  stamp "hostgap rc=$?"
  kill "$SAVER" 2>/dev/null; wait "$SAVER" 2>/dev/null
  cp "$W/hostgap/results.json" "$OUT/hostgap-results.json" 2>/dev/null
  grep -E "^\[\+ *[0-9]+s\] (plain6|nextn6|l12|  |goal|declared|re-fit|the table|resuming)" "$W/hostgap/summary.txt" 2>/dev/null \
    | grep -v -E "^\[\+ *[0-9]+s\]     " | cut -c1-220 | tail -n 80 >> "$OUT/summary.txt"
  save
fi

if has tp; then
  NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
  stamp "tp: $NGPU GPU(s); LD_PRELOAD=${LD_PRELOAD:-}"
  if [ "$NGPU" -ge 2 ]; then
    timeout 900 python3 -m sparkit.cli.main verify tiny/tiny-sglang-tp2 --against tiny/tiny-sglang --greedy-only --json \
      > "$W/tp2-verify.json" 2> "$W/tp2-verify.err"; stamp "tp2 verify (TP2 vs TP1 greedy) rc=$?"
    timeout 480 python3 -m sparkit.cli.main up tiny/tiny-sglang-tp2 --port auto --detach --timeout 420 --json \
      > "$W/tp2-up.json" 2> "$W/tp2-up.err"; stamp "tp2 up rc=$?"
    RUN2=$(json_field "$W/tp2-up.json" run)
    if [ -n "$RUN2" ]; then
      timeout 120 python3 -m sparkit.cli.main check "$RUN2" --json > "$W/tp2-check.json" 2>&1; stamp "tp2 check rc=$?"
      timeout 300 python3 -m sparkit.cli.main bench "$RUN2" --input-len 128 --output-len 128 --num-prompts 8 --json \
        --out "$W/tp2-bench.json" > /dev/null 2> "$W/tp2-bench.err"; stamp "tp2 bench rc=$?"
      ls "$SK_HOME"/runs/"$RUN2"/activation-tp*.json 2>&1 | tee -a "$OUT/summary.txt"
      timeout 60 python3 -m sparkit.cli.main down "$RUN2" --json > "$W/tp2-down.json" 2>&1; stamp "tp2 down rc=$?"
      nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | wc -l | xargs -I{} stamp "GPU processes after tp2 down: {}"
    fi
    save
  fi
  if [ "$NGPU" -ge 4 ]; then
    (cd /tmp && python3 "$REPO/.sglang-h200/scripts/make_tiny.py" /tmp/models > "$W/v3-make.log" 2>&1 \
       && python3 "$REPO/.sglang-h200/scripts/make_tiny_v3.py" /tmp/models >> "$W/v3-make.log" 2>&1)
    V3=/tmp/models/tiny-bailing-v3-mtp
    for tp in 1 2 4; do
      timeout 600 python3 -m sparkit.cli.main up ling-3.0-flash/tp4-nextn-h200 --set model.path=$V3 --set stack.tp=$tp \
        --set server.mem_fraction_static=0.5 --set 'server.extra_args=[--flashinfer-allreduce-fusion-backend, trtllm, --load-format, dummy, --max-total-tokens, "65536"]' \
        --port auto --detach --timeout 540 --json > "$W/tp4h-$tp-up.json" 2> "$W/tp4h-$tp-up.err"; stamp "tp4-nextn-h200 tp=$tp up rc=$?"
      R=$(json_field "$W/tp4h-$tp-up.json" run)
      if [ -n "$R" ]; then
        curl -s "$(json_field "$W/tp4h-$tp-up.json" url)/server_info" > "$W/tp4h-$tp-server_info.json"
        timeout 300 python3 -m sparkit.cli.main bench "$R" --input-len 128 --output-len 128 --num-prompts 8 --json \
          --out "$W/tp4h-$tp-bench.json" > /dev/null 2> "$W/tp4h-$tp-bench.err"; stamp "tp=$tp bench rc=$?"
        timeout 60 python3 -m sparkit.cli.main down "$R" > /dev/null 2>&1
      fi
      save
    done
    # The rule fp8-block-quant-tp-split against SGLang's own error: FP8 block-128 experts of width 768, TP4.
    python3 - "$V3" /tmp/models/tiny-v3-fp8-768 <<'PY'
import json, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
shutil.copytree(src, dst, dirs_exist_ok=True)
c = json.load(open(f"{dst}/config.json"))
c["moe_intermediate_size"] = c["moe_shared_expert_intermediate_size"] = 768
c["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
json.dump(c, open(f"{dst}/config.json", "w"), indent=1)
PY
    timeout 400 python3 -m sglang.launch_server --model-path /tmp/models/tiny-v3-fp8-768 --trust-remote-code --load-format dummy \
      --tp-size 4 --port 31999 --max-total-tokens 65536 > "$W/fp8-block-tp4.log" 2>&1 &
    FP8PID=$!; sleep 240; kill -TERM $FP8PID 2>/dev/null; wait $FP8PID 2>/dev/null
    stamp "SGLang's own fp8 block/TP4 error: $(grep -m1 -E "not divisible|divisible by|block" "$W/fp8-block-tp4.log" | cut -c1-200)"
    python3 -m sparkit.cli.main plan ling-3.0-flash/tp4-nextn-h200 --set model.path=/tmp/models/tiny-v3-fp8-768 \
      --set stack.weights=fp8 > "$W/fp8-block-tp4-plan.txt" 2>&1; stamp "sparkit plan of the same: rc=$?"
    save
  fi
fi

if has v3trained; then
  # one server at a time: a second server beside it would share the GPU and distort its figures
  # V3_ARGS: more `up`/`plan` arguments for every variant (e.g. --set model.path=... for a build
  # carried beside the tree); word-split on purpose
  read -r -a v3_args <<< "${V3_ARGS:-}"
  for v in ${V3_VARIANTS:-baseline:tiny/tiny-v3-sglang-baseline nextn:tiny/tiny-v3-sglang}; do
    label=${v%%:*}; name=v3-$label
    stamp "v3trained: sparkit up ${v#*:} ${v3_args[*]}"
    timeout 560 python3 -m sparkit.cli.main up "${v#*:}" "${v3_args[@]}" --port auto --detach --keep-on-fail --timeout 500 --json \
      > "$W/$name-up.json" 2> "$W/$name-up.err"
    stamp "$name up rc=$? $(tail -n 1 "$W/$name-up.err" | cut -c1-160)"
    URL=$(json_field "$W/$name-up.json" url); V3RUN=$(json_field "$W/$name-up.json" run)
    if [ -n "$URL" ]; then
      export_dir=$(python3 -m sparkit.cli.main plan "${v#*:}" "${v3_args[@]}" --json 2>/dev/null | python3 -c \
        'import json,sys; print(json.load(sys.stdin)["model_builds"][0]["export_hf"]["dir"])')
      timeout 120 python3 benchmarks/cross_engine_capture.py "$URL" "$export_dir" "$W/v3-capture-$label.json" 2>&1 \
        | tail -n 2 | tee -a "$OUT/summary.txt"
      timeout 120 python3 -m sparkit.cli.main check "$V3RUN" --json > "$W/$name-check.json" 2> "$W/$name-check.err"
      stamp "$name check rc=$?"
      timeout 150 python3 -m sparkit.cli.main bench "$V3RUN" --input-len 256 --output-len 256 --num-prompts 4 --json \
        > "$W/$name-bench.json" 2> "$W/$name-bench.err"; stamp "$name bench rc=$?"
      timeout 60 python3 -m sparkit.cli.main down "$V3RUN" --json > "$W/$name-down.json" 2>&1; stamp "$name down rc=$?"
    fi
    # one server at a time: whatever a failed start kept is gone before the next variant starts
    timeout 60 python3 -m sparkit.cli.main down --all --json > "$W/$name-down-all.json" 2>&1
    cp "$(json_field "$W/$name-up.json" run 2>/dev/null)/server.log" "$W/$name-server.log" 2>/dev/null || true
    save
  done
fi

if has main && [ -n "${RUN:-}" ]; then
  timeout 60 python3 -m sparkit.cli.main down "$RUN" --json > "$W/main-down.json" 2>&1; stamp "main down rc=$?"
fi
if has ladder; then
  stamp "ladder: waiting for its last step"
  wait "$LADDER_PID"
  stamp "$(tail -n 1 "$W/ladder.err")"
  grep -E "^\[[0-9]+/[0-9]+\]" "$W/ladder.err" | tee -a "$OUT/summary.txt"
  COLUMNS=200 python3 -m sparkit.cli.main ladder --show "$W/ladder.json" 2>&1 | tee -a "$OUT/summary.txt"
  save
fi
stamp "waiting for the background runs"
# shellcheck disable=SC2086
wait $BG
for f in "$W"/*-up.err "$W"/verify.err; do [ -f "$f" ] && stamp "$(tail -n 1 "$f")"; done
timeout 90 python3 -m sparkit.cli.main status --all --json > "$W/status-all.json" 2>&1
timeout 90 python3 -m sparkit.cli.main down --all --json > "$W/down-all.json" 2>&1; stamp "down --all rc=$?"
sleep 2
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$W/end-gpu.txt" 2>&1
ps -eo pid,ppid,cmd | grep -E "sglang|sparkit" | grep -v -E "grep|sglang_h200/session.sh" > "$W/end-ps.txt"
stamp "GPU processes left: $(($(wc -l < "$W/end-gpu.txt") - 1)); sglang/sparkit processes left: $(wc -l < "$W/end-ps.txt")"
save
stamp "done"
save
