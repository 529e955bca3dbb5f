#!/usr/bin/env bash
# The whole GPU session for issue 8, in one command on a CUDA machine (an H200 here), so that its
# figures can be reproduced. Run from the repository root:
#
#     OUT=/some/dir bash benchmarks/gpu_session.sh      (STEPS=bench,engine,tests ROUNDS=15 VARIANTS=...)
#
# The issue-8 closing table came from the third run (the VARIANTS default below; 15 rounds).
# Needs on that machine: python3 with torch + triton + transformers/tokenizers/safetensors (the
# CUDA image has them); wheels for what it lacks in .whl/ (pydantic, pydantic-core, annotated-types,
# typing-inspection, typing-extensions, starlette, uvicorn, platformdirs, anyio), installed into
# /tmp/site; the trained tiny-ling checkpoint in .device/tiny-ling-s0 (a copy of
# ~/.cache/sparkit-tests/tiny-ling-s0, git-ignored through .git/info/exclude).
#
# Steps (each guarded: a failure or timeout in one does not stop the rest):
#   1. benchmarks/fp8_lm_head.py: bf16 F.linear, torch._scaled_mm, the shipped kernel and the
#      variants below, interleaved in the same rounds, M = 1..8, 12, 16; agreement reweighted by
#      tiny-ling's real margin distribution (benchmarks/data/tiny_ling_margins.json).
#   2. The embedded engine on CUDA with the FP8 head: sparkit up (tiny recipe, target auto),
#      the startup checks' JSON, sparkit status --json, the activation report, sparkit down --all.
#   3. The GPU kernel tests.
# Files in $OUT: bench.log, bench.json, real_states.{log,json}, up.json, engine.log, pytest.log, summary.txt.
set +e
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
VARIANTS=${VARIANTS:-}  # fourth run (exact re-scoring): none; EXACT below
# third run: VARIANTS=pk16t:n256k128w8s3,pk16p:n128k256w8s3,pk16p:n128k128w8s4,pk16t:n128k256w4s3
EXACT=${EXACT:-4}
# second run: VARIANTS=pk16t:n256k128w8s3,pk16p:n128k128w8s4,pk16t:n128k256w8s3,pk16p:n128k256w8s4,pk16p:n128k256w4s3
# first run: VARIANTS=pk16t:n256k128w8s3,pk16p:n256k128w8s3,pk16p:n256k128w8s4,pk16p:n128k128w8s4,pk16p:n128k256w8s3,pk16x:n256k128w8s3
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/summary.txt"; }

if [ -z "$NO_WHEELS" ] && ls .whl/*.whl >/dev/null 2>&1; then  # NO_WHEELS=1: a rehearsal here
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && stamp "wheels installed into /tmp/site" || stamp "wheel install FAILED"
fi
export PYTHONPATH=$PWD:$PWD/tests:/tmp/site  # tests/: the GPU tests run with --noconftest and import _shared
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/summary.txt"

STEPS=${STEPS:-bench,real,engine,tests}  # e.g. STEPS=engine to repeat one step
has() { [[ ",$STEPS," == *",$1,"* ]]; }

if has bench; then
stamp "step 1: benchmark"
timeout 300 python3 benchmarks/fp8_lm_head.py --rounds ${ROUNDS:-15} --variants "$VARIANTS" \
  --exact-top-k "$EXACT" --exact-breakdown \
  --margins-from benchmarks/data/tiny_ling_margins.json --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
stamp "benchmark rc=$?"
fi

if has real; then
stamp "step 1b: tiny-ling's real hidden states through the CUDA kernels"
timeout 120 python3 benchmarks/fp8_head_real_states.py --model "$PWD/.device/tiny-ling-s0" --device cuda \
  --json "$OUT/real_states.json" > "$OUT/real_states.log" 2>&1
stamp "real states rc=$?"
fi

if has engine; then
stamp "step 2: embedded engine on CUDA, FP8 head"
export SPARKIT_HOME=/tmp/sparkit-home
rm -rf "$SPARKIT_HOME"
{
  timeout 120 python3 -m sparkit.cli.main up recipes/tiny/tiny.yaml --set model.path="$PWD/.device/tiny-ling-s0" \
    --port auto --detach --timeout 100 --json > "$OUT/up.json"
  echo "up rc=$?"
  echo "== status"; timeout 20 python3 -m sparkit.cli.main status --json
  echo "== activation report"; cat "$SPARKIT_HOME"/runs/*/activation-tp0.json
  echo; echo "== server log"; cat "$SPARKIT_HOME"/runs/*/server.log
  echo "== down"; timeout 20 python3 -m sparkit.cli.main down --all --json; echo "down rc=$?"
} > "$OUT/engine.log" 2>&1
stamp "engine step done: $(grep -m1 '^up rc=' "$OUT/engine.log")"
fi

if has tests; then
stamp "step 3: GPU kernel tests"
timeout 150 python3 -m pytest tests/kernels/test_fp8_gemv_gpu.py tests/sglang_plugin/test_fp8_lm_head_gpu.py \
  --noconftest -q -p no:cacheprovider > "$OUT/pytest.log" 2>&1
stamp "pytest rc=$?"
fi

{
  echo "== benchmark table"; touch "$OUT/bench.log" "$OUT/pytest.log" "$OUT/real_states.log"; grep -E '^(M \||[0-9]+ \||  v |  exact|expected top-1)|agreement by' "$OUT/bench.log"
  tail -3 "$OUT/bench.log" | grep -iE 'error|Traceback' && tail -15 "$OUT/bench.log"
  echo "== tiny-ling real states on CUDA"; head -4 "$OUT/real_states.log"
  echo "== startup checks on CUDA"
  python3 - "$OUT/up.json" <<'EOF'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception as exc:
    print("no up.json:", exc); sys.exit()
for c in doc.get("checks", []):
    print(f"{c.get('name')}: {c.get('status')} - {c.get('detail')}")
EOF
  grep -E 'FP8 lm_head path|Load weight end|^up rc|^down rc' "$OUT/engine.log" | head -8
  grep -o '"device": "[^"]*"' "$OUT/engine.log" | sort | uniq -c
  echo "== pytest"; tail -4 "$OUT/pytest.log"
} >> "$OUT/summary.txt" 2>&1
stamp "done"
cat "$OUT/summary.txt"
