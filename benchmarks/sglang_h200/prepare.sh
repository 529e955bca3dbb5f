#!/usr/bin/env bash
# CPU side of the real-SGLang session on the lent H200 (device side: session.sh beside this file).
#
#     bash benchmarks/sglang_h200/prepare.sh          (from the repository root; PyPI reachable)
#
# 1. The kit in ../shared/gpu/sglang-h200 (prepare_cpu.sh) downloads, trims and packs torch 2.14.1,
#    sglang 0.5.23 and what the H200 image lacks (659 MB), plus a wheel of this checkout (sparkit's
#    `sglang.srt.plugins` entry point). Pieces of PIECE bytes: a `run` call carries at most 64 MiB,
#    and this tree (18 MiB in session 8: tiny-ling, GSM8K, the results) travels with every call.
# 2. Wheels sparkit needs on the device that neither the image nor the kit provides (typer, rich,
#    textual, httpx, platformdirs, ...; session.sh installs only those the device cannot import),
#    and humming-kernels' own dependencies (cuda-bindings, the CUDA C++ headers for NVRTC, tabulate).
# 3. A GSM8K subset (the first 40 test and 20 train questions of ../shared/data/gsm8k).
# 4. With NCCL=1 (for the TP2/TP4 sessions, STEPS=setup,tp): the real NCCL 2.30.7 that torch
#    2.14.1 pins (nvidia-nccl-cu13 2.30.7's libnccl.so.2, 252 MB; xz -6 makes it smaller), split
#    into pieces n00, n01, ... carried like the kit's; session.sh preloads it instead of the stub.
# Everything lands in .sglang-h200/ (git-ignored). It prints the `run` calls to make, in order.
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT=${KIT:-../shared/gpu/sglang-h200}
SHARED=${SPARKIT_SHARED_DIR:-../shared}
# A `run` call refuses a working tree over 64 MiB (tracked + untracked-not-ignored files + what it
# carries): the pieces are sized from this tree, with 2 MiB to spare (the tree grew from 9 to 18 MiB
# in session 8, and 48 MB pieces were refused). PIECE=N overrides; one that cannot fit is an error.
TREE_BYTES=$(git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
LIMIT_BYTES=$(( 64 * 1048576 ))
export PIECE=${PIECE:-$(( LIMIT_BYTES - TREE_BYTES - 2 * 1048576 ))}
if ! [[ "$PIECE" =~ ^[0-9]+$ ]]; then
  echo "prepare.sh: PIECE=$PIECE is not a number of bytes" >&2
  exit 2
fi
if [ $(( PIECE + TREE_BYTES )) -ge "$LIMIT_BYTES" ] || [ "$PIECE" -le 0 ]; then
  echo "prepare.sh: PIECE=$PIECE bytes + this tree's $TREE_BYTES bytes do not fit a run call's 64 MiB;" \
       "set PIECE smaller, or make the tree smaller" >&2
  exit 2
fi
REBUILD_SPARKIT=1 bash "$KIT/prepare_cpu.sh"

DEPS=.sglang-h200/deps
rm -rf "$DEPS" && mkdir -p "$DEPS"
PLAT="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 --platform any"
# With their dependencies (typer 0.29 needs annotated-doc, textual mdit-py-plugins, ...): session.sh
# installs only the wheels whose top-level modules the device cannot import already.
# shellcheck disable=SC2086
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp $PLAT -d "$DEPS" \
  typer click rich httpx platformdirs textual psutil nvidia-ml-py pyyaml \
  cuda-bindings tabulate jinja2 nvidia-cuda-cccl 2>&1 | grep -v "^WARNING: Location" || true
# what the kit's payload already holds (prepare_cpu.sh's DEPS): not carried twice
rm -f "$DEPS"/pydantic-*.whl "$DEPS"/pydantic_core-*.whl "$DEPS"/annotated_types-*.whl "$DEPS"/typing_inspection-*.whl

mkdir -p .sglang-h200/gsm8k
head -n 40 "$SHARED/data/gsm8k/test.jsonl" > .sglang-h200/gsm8k/test.jsonl
head -n 20 "$SHARED/data/gsm8k/train.jsonl" > .sglang-h200/gsm8k/train.jsonl

if [ "${NCCL:-0}" = 1 ]; then
  WHEEL=$(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_18_x86_64 -d .sglang-h200/nccl-wheel nvidia-nccl-cu13==2.30.7 2>/dev/null; ls .sglang-h200/nccl-wheel/*.whl)
  rm -rf .sglang-h200/n?? && mkdir -p .sglang-h200/nccl
  unzip -o -q -j "$WHEEL" nvidia/nccl/lib/libnccl.so.2 -d .sglang-h200/nccl
  xz -T0 -6 -f .sglang-h200/nccl/libnccl.so.2
  (cd .sglang-h200 && split -b "$PIECE" -d -a 2 nccl/libnccl.so.2.xz nccl-part. && for f in nccl-part.*; do
     n=n${f#nccl-part.}; mkdir -p "$n" && mv "$f" "$n/"; done)
fi

if [ "${BENCH_SERVING:-0}" = 1 ]; then
  # `python -m sglang.bench_serving` on the device imports `datasets` (sglang.benchmark.datasets),
  # which the kit lacks: datasets and what of its dependencies the H200 image has no module for.
  # pyarrow (55 MB) travels alone as piece b00; the rest (14 MB) with the last call (b01).
  rm -rf .sglang-h200/b00 .sglang-h200/b01 && mkdir -p .sglang-h200/b00 .sglang-h200/b01
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT \
    -d .sglang-h200/b01 datasets pyarrow pandas dill multiprocess xxhash fsspec tzdata 2>&1 | grep -v "^WARNING: Location" || true
  mv .sglang-h200/b01/pyarrow-*.whl .sglang-h200/b00/
fi

pieces=$(ls -d .sglang-h200/p?? .sglang-h200/n?? .sglang-h200/b00 2>/dev/null | sort || true)  # (n?? and b00 only with NCCL=1 / BENCH_SERVING=1)
last=$(echo "$pieces" | tail -n 1)
echo
echo "run() calls, back to back in ONE tool-call block (the machine forgets /tmp ~30 s after a call):"
for p in $(echo "$pieces" | head -n -1); do
  dest=/tmp/acc; [ "${p##*/}" = b00 ] && dest=/tmp/acc/bdeps
  echo "  run(command=\"mkdir -p $dest && cp $p/* $dest/\", carry=[\"$p\"])"
done
b01=""; bcopy=""
[ -d .sglang-h200/b01 ] && { b01=", \".sglang-h200/b01\""; bcopy="mkdir -p /tmp/acc/bdeps && cp .sglang-h200/b01/* /tmp/acc/bdeps/ && "; }
echo "  run(command=\"mkdir -p /tmp/acc && cp $last/* /tmp/acc/ && cp -r .sglang-h200/deps /tmp/acc/ && $bcopy{ ls /tmp/acc/nccl-part.* >/dev/null 2>&1 && cat /tmp/acc/nccl-part.* > /tmp/acc/libnccl.so.2.xz; true; } && OUT=\$OUT bash benchmarks/sglang_h200/session.sh\","
echo "      carry=[\"$last\", \".sglang-h200/scripts\", \".sglang-h200/deps\", \".sglang-h200/gsm8k\"$b01], timeout_s=600)"
tree=$(git ls-files -co --exclude-standard -z | xargs -0 stat -c %s | awk '{s+=$1} END {print s}')
for p in $pieces; do
  size=$(du -sb "$p" | cut -f1)
  [ "$p" = "$last" ] && size=$(( size + $(du -sb .sglang-h200/deps .sglang-h200/scripts .sglang-h200/gsm8k $([ -d .sglang-h200/b01 ] && echo .sglang-h200/b01) | awk '{s+=$1} END {print s}') ))
  printf '  %s: %.1f MiB with the tree\n' "$p" "$(echo "($size + $tree) / 1048576" | bc -l)"
  [ $(( size + tree )) -ge $(( 64 * 1048576 )) ] && echo "  ^ over the 64 MiB a run call takes: set PIECE smaller" >&2
done
echo "Later calls in the same warm session (STEPS=ling, ...) carry what session.sh reads again:"
echo "  carry=[\".sglang-h200/scripts\", \".sglang-h200/gsm8k\"] (an ignored path a call does not name is gone there)"

