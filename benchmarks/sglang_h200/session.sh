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
# The recipes cap the KV pool (--max-total-tokens), so the servers can start together: SGLang sizes
# its pool from the memory free when it starts, and a tiny model needs a small pool anyway.
# REHEARSE=1 runs the same control flow on a machine without a GPU: the embedded engine's tiny
# recipes stand in for the SGLang ones, and setup, v3 and humming are skipped.
# Everything lands in $OUT/session.tgz (work files + the run directories: server logs, /server_info,
# activation reports, checks.json), rewritten after every step so that a call cut short by its
# limit still brings back what ran, and $OUT/summary.txt (the `run` tool returns few files).
set -u
OUT=${OUT:-/tmp/sglang-session}
STEPS=${STEPS:-setup,launch,main,ab,traps,verify,v3,humming}
REPO=$(pwd)
W=/tmp/sglang-session-w  # packed into $OUT/session.tgz: $OUT itself holds two files
mkdir -p "$W" "$OUT"
T0=$(date +%s)
stamp() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }
has() { [[ ",$STEPS," == *",$1,"* ]]; }
save() { cp "$OUT/summary.txt" "$W/" 2>/dev/null; tar -czf "$OUT/session.tgz" -C /tmp sglang-session-w sparkit-home/runs 2>/dev/null; }
sk() { python3 -m sparkit.cli.main "$@"; }
REHEARSE=${REHEARSE:-0}
recipe() {  # the recipe to run (under REHEARSE, the embedded engine's counterpart)
  if [ "$REHEARSE" = 1 ]; then echo "$1" | sed -e 's#tiny/tiny-sglang-unshared-head#tiny/tiny-unshared-head#' \
    -e 's#tiny/tiny-sglang-wrong-draft#tiny/tiny-wrong-draft#' -e 's#tiny/tiny-sglang$#tiny#'; else echo "$1"; fi
}
[ "$REHEARSE" = 1 ] && STEPS=$(echo ",$STEPS," | sed -e 's/,setup,/,/; s/,v3,/,/; s/,humming,/,/')
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
export SPARKIT_HOME=/tmp/sparkit-home PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0

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
  timeout 120 python3 -m sparkit.cli.main model export-hf --json > "$W/export.json" 2> "$W/export.err"
  stamp "export rc=$? $(json_field "$W/export.json" path)"
  mkdir -p "$W/tiny-ling-hf" && cp "$(json_field "$W/export.json" path)"/*.json "$W/tiny-ling-hf/" 2>/dev/null
  save
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
    tok_dir=$(json_field "$W/export.json" path); [ -d "$tok_dir" ] || tok_dir=$REPO/sparkit/engines/embedded/checkpoints/tiny-ling-s0
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
      ls /tmp/sparkit-home/runs/"$RUN2"/activation-tp*.json 2>&1 | tee -a "$OUT/summary.txt"
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

if has main && [ -n "${RUN:-}" ]; then
  timeout 60 python3 -m sparkit.cli.main down "$RUN" --json > "$W/main-down.json" 2>&1; stamp "main down rc=$?"
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
