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
# Everything lands in .sglang-h200/ (git-ignored). It prints the `run` calls to make, in order,
# each with its size as the `run` tool counts it (this tree + the paths it carries), and exits 2
# when one would not fit: what it prints is exactly what to paste.
#
#     PRINT_ONLY=1 bash benchmarks/sglang_h200/prepare.sh    the calls for what .sglang-h200/ holds, nothing built
#     SESSION_ENV="STEPS=setup,hostgap HOSTGAP_BUDGET_S=420" bash benchmarks/sglang_h200/prepare.sh
#                                                             (the last call runs session.sh with these set)
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT=${KIT:-../shared/gpu/sglang-h200}
SHARED=${SPARKIT_SHARED_DIR:-../shared}
SESSION_ENV=${SESSION_ENV:-}
# A `run` call refuses a working tree over 64 MiB: tracked + untracked-not-ignored files + the
# ignored paths it carries. Every call carries this tree (18 MiB in session 8, 19 in session 11),
# so a piece is the limit less the tree, less what the piece's call carries beside it (the last
# piece's: the device scripts and the GSM8K subset, ~80 KB), less MARGIN (1 MiB: a file a call
# writes into the tree meanwhile). The deps (17 MB) have their own call: riding with the last piece
# they made it 68 MiB (the lead's session 11 printout). PIECE=N overrides; one that cannot fit is
# an error.
LIMIT_BYTES=$(( 64 * 1048576 ))
MARGIN_BYTES=$(( 1048576 ))
tree_bytes() { git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}'; }
TREE_BYTES=$(tree_bytes)
LAST_EXTRA_BYTES=$(( $( (cat "$KIT"/*.py "$KIT"/*.sh 2>/dev/null || true) | wc -c) + 64 * 1024 ))

# The calls for what .sglang-h200/ holds now, in order, each checked against the limit.
print_calls() {
  local tree pieces last p dest size total=0 over=0 n=0
  tree=$(tree_bytes)
  pieces=$(ls -d .sglang-h200/p?? .sglang-h200/n?? .sglang-h200/b00 2>/dev/null | sort || true)  # (n?? and b00 only with NCCL=1 / BENCH_SERVING=1)
  if [ -z "$pieces" ]; then
    echo "prepare.sh: no pieces under .sglang-h200/ (run without PRINT_ONLY=1 first)" >&2
    return 2
  fi
  last=$(echo "$pieces" | tail -n 1)
  bytes_of() { du -sb "$@" | awk '{s+=$1} END {print s+0}'; }
  check() {  # NAME BYTES: one line of the size table; counts calls over the limit
    local mib
    mib=$(awk -v b="$(( $2 + tree ))" 'BEGIN {printf "%.1f", b / 1048576}')
    if [ $(( $2 + tree + MARGIN_BYTES )) -gt "$LIMIT_BYTES" ]; then
      echo "  $1: $mib MiB with the tree: OVER the 64 MiB a run call takes (less the 1 MiB margin)" >&2
      over=$(( over + 1 ))
    else
      echo "  $1: $mib MiB with the tree"
    fi
    total=$(( total + $2 + tree )); n=$(( n + 1 ))
  }
  local extra_carry="" extra_copy=""
  [ -d .sglang-h200/b01 ] && { extra_carry=', ".sglang-h200/b01"'; extra_copy=' && mkdir -p /tmp/acc/bdeps && cp .sglang-h200/b01/* /tmp/acc/bdeps/'; }
  echo
  echo "run() calls, back to back in ONE tool-call block (the machine forgets /tmp ~30 s after a call):"
  for p in $(echo "$pieces" | head -n -1); do
    dest=/tmp/acc; [ "${p##*/}" = b00 ] && dest=/tmp/acc/bdeps
    echo "  run(command=\"mkdir -p $dest && cp $p/* $dest/\", carry=[\"$p\"])"
  done
  echo "  run(command=\"mkdir -p /tmp/acc && cp -r .sglang-h200/deps /tmp/acc/$extra_copy\", carry=[\".sglang-h200/deps\"$extra_carry])"
  echo "  run(command=\"mkdir -p /tmp/acc && cp $last/* /tmp/acc/ && { ls /tmp/acc/nccl-part.* >/dev/null 2>&1 && cat /tmp/acc/nccl-part.* > /tmp/acc/libnccl.so.2.xz; true; } && ${SESSION_ENV:+$SESSION_ENV }OUT=\$OUT bash benchmarks/sglang_h200/session.sh\","
  echo "      carry=[\"$last\", \".sglang-h200/scripts\", \".sglang-h200/gsm8k\"], timeout_s=600)"
  echo "sizes, as the run tool counts them (this tree of $(awk -v b="$tree" 'BEGIN {printf "%.1f", b / 1048576}') MiB + what each call carries):"
  for p in $(echo "$pieces" | head -n -1); do check "$p" "$(bytes_of "$p")"; done
  check "deps call" "$(bytes_of .sglang-h200/deps $([ -d .sglang-h200/b01 ] && echo .sglang-h200/b01))"
  check "$last + scripts + gsm8k" "$(bytes_of "$last" .sglang-h200/scripts .sglang-h200/gsm8k)"
  echo "  $n calls, $(awk -v b="$total" 'BEGIN {printf "%.0f", b / 1048576}') MiB carried in all"
  echo "(sizes of this tree now: after changing it, PRINT_ONLY=1 bash $0 checks the calls again)"
  echo "Later calls in the same warm session (STEPS=ling, STEPS=hostgap, ...) carry what session.sh reads again:"
  echo "  carry=[\".sglang-h200/scripts\", \".sglang-h200/gsm8k\"] (an ignored path a call does not name is gone there)"
  if [ "$over" -gt 0 ]; then
    echo "prepare.sh: $over call(s) would be refused: set PIECE smaller (now $(du -b "$(echo "$pieces" | head -n 1)"/* | awk 'NR == 1 {print $1}') bytes a piece) or make the tree smaller" >&2
    return 2
  fi
}
if [ "${PRINT_ONLY:-0}" = 1 ]; then
  print_calls
  exit $?
fi

export PIECE=${PIECE:-$(( LIMIT_BYTES - TREE_BYTES - LAST_EXTRA_BYTES - MARGIN_BYTES ))}
if ! [[ "$PIECE" =~ ^[0-9]+$ ]]; then
  echo "prepare.sh: PIECE=$PIECE is not a number of bytes" >&2
  exit 2
fi
if [ $(( PIECE + TREE_BYTES + LAST_EXTRA_BYTES + MARGIN_BYTES )) -gt "$LIMIT_BYTES" ] || [ "$PIECE" -le 0 ]; then
  echo "prepare.sh: PIECE=$PIECE bytes + this tree's $TREE_BYTES bytes + the last call's $LAST_EXTRA_BYTES bytes of" \
       "scripts and GSM8K + 1 MiB of margin do not fit a run call's 64 MiB; set PIECE smaller, or make the tree smaller" >&2
  exit 2
fi
if [ -f .git ]; then
  # A git worktree: .git is a file, and the kit appends to .git/info/exclude. It runs in a scratch
  # directory with a .git/info of its own, packing this tree (its argument), and its pieces move here;
  # the worktree shares the main checkout's exclude, which must ignore /.sglang-h200/.
  if ! git check-ignore -q .sglang-h200/p00; then
    echo "prepare.sh: .sglang-h200/ is not ignored in this worktree: add /.sglang-h200/ to $(git rev-parse --git-common-dir)/info/exclude" >&2
    exit 2
  fi
  KIT=$(cd "$KIT" && pwd)
  STAGE=$(mktemp -d)
  mkdir -p "$STAGE/.git/info"
  (cd "$STAGE" && REBUILD_SPARKIT=1 bash "$KIT/prepare_cpu.sh" "$OLDPWD")
  rm -rf .sglang-h200/p?? .sglang-h200/scripts && mkdir -p .sglang-h200
  mv "$STAGE"/.sglang-h200/* .sglang-h200/ && rm -rf "$STAGE"
else
  REBUILD_SPARKIT=1 bash "$KIT/prepare_cpu.sh"
fi

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

print_calls
