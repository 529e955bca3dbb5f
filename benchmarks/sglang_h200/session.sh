#!/usr/bin/env bash
# Device side of the real-SGLang session: sparkit's whole SGLang path on one H200, end to end.
# Prepared on the CPU machine by prepare.sh (which prints the `run` calls); here, from the
# repository root:
#
#     OUT=/some/dir PART=1 bash benchmarks/sglang_h200/session.sh    (setup, checks, clients, V3)
#     OUT=/some/dir PART=2 bash benchmarks/sglang_h200/session.sh    (interleaved A/B)
#     OUT=/some/dir PART=3 bash benchmarks/sglang_h200/session.sh    (the trap, a wrong draft, humming, verify)
#
# PART 1: unpack the kit (torch 2.14.1 + sglang 0.5.23) and sparkit's missing wheels; `sparkit
#   doctor`; the tiny-ling HF export; in the background, a tiny BailingMoeV3 (Ling-3.0 layout,
#   dummy weights) through `sparkit up`; then `sparkit up tiny/tiny-sglang` (FP8 lm_head via the
#   plugin, NEXTN 3/1/4, CUDA graphs) with status / logs / check / bench / eval gsm8k / a Pilot chat
#   session / a logprob capture for the cross-engine comparison / down.
# PART 2: five variants up at once (FP8 or bf16 head x NEXTN or plain, and NEXTN without CUDA
#   graphs), decode interleaved request by request.
# PART 3: the trap (tiny-sglang-unshared-head) and a wrong draft (tiny-sglang-wrong-draft), each of
#   which must fail its checks (exit 6); humming MXFP4 experts (online W4A16) through `sparkit up`;
#   `sparkit verify` (NEXTN greedy == plain greedy on real SGLang, FP8 head on both).
# Every step runs under a timeout and a failure does not stop the next. Everything a step writes
# is under $OUT (summary.txt first); the run directories (server logs, /server_info, activation
# reports, checks.json) are packed into $OUT/runs-partN.tgz.
set -u
OUT=${OUT:-/tmp/sglang-session}
PART=${PART:-1}
REPO=$(pwd)
mkdir -p "$OUT"
T0=$(date +%s)
BUDGET=${BUDGET:-585}
stamp() { echo "[part $PART +$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }

if [ "$PART" = 1 ]; then
  stamp "setup: the kit (torch 2.14.1, sglang 0.5.23)"
  bash .sglang-h200/scripts/dev_setup.sh > "$OUT/setup.log" 2>&1
  stamp "setup rc=$? ($(grep -c . "$OUT/setup.log") lines; tail:)"; tail -n 12 "$OUT/setup.log" | tee -a "$OUT/summary.txt"
fi
if [ ! -f /tmp/sglenv.sh ]; then stamp "no /tmp/sglenv.sh: this machine was not set up (PART=1 first, within ~30 s)"; exit 3; fi
# shellcheck disable=SC1091
source /tmp/sglenv.sh
export PYTHONPATH=$REPO:/tmp/site:/tmp/sparkit-deps
export SPARKIT_HOME=/tmp/sparkit-home PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
pools() { grep -l "Memory pool end" "$SPARKIT_HOME"/runs/*/server.log 2>/dev/null | wc -l; }
# `sparkit up ARGS` in the background (OUT/NAME.json, NAME.err), returning once its engine has sized
# its memory pools: SGLang sizes its KV pool from the memory free at its own start, so a second
# server must not start while the first is still allocating.
up_bg() {
  local name=$1; shift
  local before; before=$(pools)
  (timeout 420 python3 -m sparkit.cli.main up "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"; echo "$name up rc=$?" >> "$OUT/$name.err") &
  local pid=$!
  for _ in $(seq 1 150); do
    sleep 1
    [ "$(pools)" -gt "$before" ] && { sleep 4; break; }
    kill -0 $pid 2>/dev/null || break
  done
  BG="$BG $pid"
}
BG=""
# the run directories (server logs, /server_info, reports, checks) into $OUT after every step, so
# that a call cut short by its time limit still brings back what ran
save_runs() { tar -czf "$OUT/runs-part$PART.tgz" -C /tmp sparkit-home/runs 2>/dev/null; }

if [ "$PART" = 1 ]; then
  # sparkit's own dependencies: only the wheels whose top-level modules this python cannot import
  # (never shadow what the image or the kit provides to sglang); the CUDA C++ headers always
  wheels=$(python3 - <<'PY'
import importlib.util, pathlib, zipfile
out = []
for wheel in sorted(pathlib.Path("/tmp/acc/deps").glob("*.whl")):
    names = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    tops = {n.removesuffix(".py") for n in names if not n.endswith((".dist-info", ".data")) and not n.endswith(".pth")}
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
  stamp "installing: $(for w in $wheels; do basename $w | cut -d- -f1; done | tr '\n' ' ')"
  # shellcheck disable=SC2086
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sparkit-deps $wheels > "$OUT/deps.log" 2>&1
  stamp "deps installed rc=$?"
  python3 -c "import sparkit, sparkit.cli.main, sglang, torch; print('sparkit', sparkit.__file__, 'sglang', sglang.__version__, 'torch', torch.__version__)" 2>&1 | tail -n 3 | tee -a "$OUT/summary.txt"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"

  stamp "doctor"
  timeout 60 python3 -m sparkit.cli.main doctor --json > "$OUT/doctor.json" 2> "$OUT/doctor.err"; stamp "doctor rc=$?"

  stamp "tiny-ling HF export (the shipped build -> BailingMoeV2 for SGLang)"
  timeout 120 python3 -m sparkit.cli.main model export-hf --json > "$OUT/export.json" 2> "$OUT/export.err"
  stamp "export rc=$? $(python3 -c "import json;d=json.load(open('$OUT/export.json'));print(d['path'], d['tensors'], 'tensors')" 2>&1)"
  cp -r "$(python3 -c "import json;print(json.load(open('$OUT/export.json'))['path'])")" "$OUT/tiny-ling-hf" 2>/dev/null
  rm -f "$OUT/tiny-ling-hf/model.safetensors"  # the weights are in the repository; keep config + tokenizer

  stamp "background: tiny BailingMoeV3 (dummy weights) + NEXTN + plugin + CUDA graphs through sparkit up"
  # the kit's generators: make_tiny.py writes the byte-level tokenizer make_tiny_v3.py copies
  (cd /tmp && python3 "$REPO/.sglang-h200/scripts/make_tiny.py" /tmp/models > "$OUT/v3-make.log" 2>&1 \
     && python3 "$REPO/.sglang-h200/scripts/make_tiny_v3.py" /tmp/models >> "$OUT/v3-make.log" 2>&1)
  stamp "V3 config: $(tail -n 1 "$OUT/v3-make.log" | cut -c1-120)"
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
  extra_args: ["--load-format", "dummy"]
EOF
  up_bg v3-up /tmp/tiny-v3.yaml --port auto --detach --timeout 400 --json
  stamp "V3 run sized its memory pools (or gave up): $(pools) pool(s) so far"

  stamp "main: sparkit up tiny/tiny-sglang"
  timeout 300 python3 -m sparkit.cli.main up tiny/tiny-sglang --port auto --detach --keep-on-fail --timeout 280 --json \
    > "$OUT/main-up.json" 2> "$OUT/main-up.err"
  stamp "main up rc=$?"; save_runs
  URL=$(python3 -c "import json;print(json.load(open('$OUT/main-up.json'))['url'])" 2>/dev/null)
  RUN=$(python3 -c "import json;print(json.load(open('$OUT/main-up.json'))['run'])" 2>/dev/null)
  stamp "main url=$URL run=$RUN"
  if [ -n "$URL" ]; then
    timeout 30 python3 -m sparkit.cli.main status --json > "$OUT/main-status.json" 2>&1; stamp "status rc=$?"
    timeout 30 python3 -m sparkit.cli.main status > "$OUT/main-status.txt" 2>&1
    timeout 30 python3 -m sparkit.cli.main logs "$RUN" --lines 40 > "$OUT/main-logs.txt" 2>&1; stamp "logs rc=$?"
    curl -s "$URL/server_info" > "$OUT/main-server_info.json"; curl -s "$URL/model_info" > "$OUT/main-model_info.json"
    timeout 60 python3 benchmarks/cross_engine_capture.py "$URL" "$OUT/tiny-ling-hf" "$OUT/capture-fp8-nextn.json" 2>&1 | tail -n 2 | tee -a "$OUT/summary.txt"
    timeout 120 python3 -m sparkit.cli.main check "$RUN" --json > "$OUT/main-check.json" 2> "$OUT/main-check.err"; stamp "check rc=$?"
    timeout 150 python3 -m sparkit.cli.main bench "$RUN" --input-len 256 --output-len 256 --num-prompts 6 --json \
      --out "$OUT/main-bench-result.json" > "$OUT/main-bench.json" 2> "$OUT/main-bench.err"; stamp "bench rc=$?"
    timeout 150 python3 -m sparkit.cli.main eval gsm8k "$RUN" --data "$REPO/.sglang-h200/gsm8k/test.jsonl" --limit 20 \
      --greedy --shots 1 --max-tokens 128 --out "$OUT/main-gsm8k.jsonl" --json > "$OUT/main-eval.json" 2> "$OUT/main-eval.err"
    stamp "eval rc=$?"; save_runs
    timeout 120 python3 benchmarks/chat_session.py "$URL" "$OUT/main-chat" > "$OUT/main-chat.txt" 2>&1; stamp "chat rc=$?"
    curl -s "$URL/server_info" > "$OUT/main-server_info-after.json"
    curl -s "$URL/metrics" > "$OUT/main-metrics.txt"
    timeout 60 python3 -m sparkit.cli.main down "$RUN" --json > "$OUT/main-down.json" 2>&1; stamp "down rc=$?"; save_runs
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/main-after-down-gpu.txt" 2>&1
  fi

  stamp "waiting for the background runs"
  # shellcheck disable=SC2086
  wait $BG
  stamp "$(tail -n 1 "$OUT/v3-up.err")"
  timeout 60 python3 -m sparkit.cli.main down --all --json > "$OUT/part1-down.json" 2>&1
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/part1-end-gpu.txt" 2>&1
  ps -eo pid,ppid,cmd | grep -E "sglang|sparkit" | grep -v grep > "$OUT/part1-end-ps.txt"
fi

if [ "$PART" = 2 ]; then
  stamp "A/B: five variants up at once"
  variants="fp8-nextn:tiny/tiny-sglang bf16-nextn:tiny/tiny-sglang:stack.lm_head=bf16 fp8-plain:tiny/tiny-sglang:stack.speculative=none bf16-plain:tiny/tiny-sglang-baseline fp8-nextn-nographs:tiny/tiny-sglang:server.cuda_graph.enabled=false"
  for v in $variants; do
    label=${v%%:*}; rest=${v#*:}; recipe=${rest%%:*}; set_arg=""
    [ "$rest" != "$recipe" ] && set_arg="--set ${rest#*:}"
    # shellcheck disable=SC2086
    up_bg "ab-$label-up" "$recipe" $set_arg --set server.mem_fraction_static=0.15 --port auto --detach --timeout 300 --json
    stamp "ab $label launched ($(pools) pools)"
  done
  # shellcheck disable=SC2086
  wait $BG
  urls=""
  for v in $variants; do
    label=${v%%:*}
    url=$(python3 -c "import json;print(json.load(open('$OUT/ab-$label-up.json'))['url'])" 2>/dev/null)
    stamp "ab $label: $(tail -n 1 "$OUT/ab-$label-up.err") url=$url"
    [ -n "$url" ] && urls="$urls $label=$url"
  done
  stamp "interleaved decode over:$urls"
  # shellcheck disable=SC2086
  timeout 240 python3 benchmarks/decode_interleaved.py $urls --input-len 256 --output-len 256 --num-prompts 6 --repeats 2 \
    --json "$OUT/ab-decode.json" > "$OUT/ab-decode.txt" 2>&1
  stamp "interleaved rc=$?"; cat "$OUT/ab-decode.txt" | tee -a "$OUT/summary.txt"; save_runs
  timeout 60 python3 -m sparkit.cli.main status --json > "$OUT/ab-status.json" 2>&1
  timeout 90 python3 -m sparkit.cli.main down --all --json > "$OUT/ab-down.json" 2>&1; stamp "ab down rc=$?"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/ab-after-down-gpu.txt" 2>&1

  timeout 30 python3 -m sparkit.cli.main down --all --json > /dev/null 2>&1
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/part2-end-gpu.txt" 2>&1
fi

if [ "$PART" = 3 ]; then
  stamp "humming: MXFP4 routed experts (online W4A16) through sparkit up, in the background"
  up_bg humming-up tiny/tiny-sglang-humming --port auto --detach --timeout 400 --json
  for variant in unshared-head wrong-draft; do
    stamp "trap: sparkit up tiny/tiny-sglang-$variant (its checks must fail: exit 6)"
    up_bg "$variant-up" "tiny/tiny-sglang-$variant" --port auto --detach --timeout 300 --json
  done
  stamp "background runs launched ($(pools) pools)"
  stamp "verify: NEXTN + FP8 head against plain decoding with the same head, on real SGLang"
  timeout 420 python3 -m sparkit.cli.main verify tiny/tiny-sglang --against tiny/tiny-sglang \
    --against-set stack.speculative=none --json > "$OUT/verify.json" 2> "$OUT/verify.err"
  stamp "verify rc=$?"; save_runs
  # shellcheck disable=SC2086
  wait $BG
  for f in humming-up unshared-head-up wrong-draft-up; do stamp "$(tail -n 1 "$OUT/$f.err")"; done
  timeout 30 python3 -m sparkit.cli.main down --all --json > /dev/null 2>&1
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/part3-end-gpu.txt" 2>&1
fi

save_runs
[ -d /tmp/sparkit-home/data ] && tar -czf "$OUT/data-part$PART.tgz" -C /tmp sparkit-home/data 2>/dev/null
stamp "part $PART done"
