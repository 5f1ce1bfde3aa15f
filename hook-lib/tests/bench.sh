#!/usr/bin/env bash
# Benchmark of libfgpu.so (figures for the note, not a test): ns per cuLaunchKernel, per
# cuMemAlloc_v2 + cuMemFree_v2 pair and per cuCtxSynchronize (nothing queued), for the bare fake driver, the shim without a
# quota, the shim with a memory quota and the shim with a core quota (50 %, launches
# that take no GPU time, so the limiter admits them all: the figure is its cost), in
# one run; ratios are to the bare driver.
# Two routes: `proc` (dlopen + cuGetProcAddress_v2, as libcudart) and `direct` (linked
# against libcuda.so.1: the shim's exported symbols are always called).
# FGPU_BENCH_BASELINE=<another libfgpu.so> (e.g. an older commit's) adds its rows to the
# same run, interleaved with the others, for a before/after comparison.
set -euo pipefail
HOOK_DIR=${HOOK_DIR:?set HOOK_DIR to \$CARGO_TARGET_DIR/release}
BIN=$HOOK_DIR/fgpu-hook-test
export LD_LIBRARY_PATH=$HOOK_DIR/fake-cuda FAKE_CUDA_GPUS=1 FAKE_CUDA_MEMORY=80Gi
export HT_BENCH_N=${HT_BENCH_N:-1000000}
unset FGPU_MEMORY_LIMIT FGPU_LIMITS_FILE CUDA_DEVICE_MEMORY_LIMIT LD_PRELOAD
state=$(mktemp -d /tmp/fgpu-bench.XXXXXX)
mkdir -p "$state/base"
trap 'rm -rf "$state"' EXIT

# Each configuration runs ROUNDS times, interleaved with the others, and keeps its best
# (the machine may be shared: the minimum is the least disturbed figure).
ROUNDS=${ROUNDS:-5}
BASE=${FGPU_BENCH_BASELINE:-}
CONFIGS="bare noq withq core"
[ -n "$BASE" ] && CONFIGS="$CONFIGS b-noq b-withq b-core"
num() { sed "s/.*$1=\([0-9.]*\).*/\1/"; }
min() { awk -v a="$1" -v b="$2" 'BEGIN { print (a == "" || b < a) ? b : a }'; }
printf '%-8s %-16s %10s %6s %14s %6s %8s %6s\n' route config launch_ns ratio alloc_free_ns ratio sync_ns ratio
for route in proc direct; do
  bin=$BIN/hooktest; [ $route = direct ] && bin=$BIN/hooktest-direct
  declare -A L=() A=() S=()
  for _ in $(seq "$ROUNDS"); do
    for cfg in $CONFIGS; do
      case $cfg in
        bare) out=$(HT_LOADER=$route "$bin" bench) ;;
        noq) out=$(LD_PRELOAD=$HOOK_DIR/libfgpu.so HT_LOADER=$route "$bin" bench) ;;
        withq) out=$(LD_PRELOAD=$HOOK_DIR/libfgpu.so FGPU_MEMORY_LIMIT=40Gi FGPU_STATE_DIR=$state HT_LOADER=$route "$bin" bench) ;;
        core) out=$(LD_PRELOAD=$HOOK_DIR/libfgpu.so FGPU_CORE_LIMIT=50 FGPU_STATE_DIR=$state HT_LOADER=$route "$bin" bench) ;;
        b-noq) out=$(LD_PRELOAD=$BASE HT_LOADER=$route "$bin" bench) ;;
        b-withq) out=$(LD_PRELOAD=$BASE FGPU_MEMORY_LIMIT=40Gi FGPU_STATE_DIR=$state/base HT_LOADER=$route "$bin" bench) ;;
        b-core) out=$(LD_PRELOAD=$BASE FGPU_CORE_LIMIT=50 FGPU_STATE_DIR=$state/base HT_LOADER=$route "$bin" bench) ;;
      esac
      L[$cfg]=$(min "${L[$cfg]:-}" "$(echo "$out" | num launch_ns)")
      A[$cfg]=$(min "${A[$cfg]:-}" "$(echo "$out" | num alloc_free_ns)")
      S[$cfg]=$(min "${S[$cfg]:-}" "$(echo "$out" | num sync_ns)")
    done
  done
  for cfg in $CONFIGS; do
    name=$cfg; [ $cfg = noq ] && name="shim, no quota"; [ $cfg = withq ] && name="shim + mem quota"
    [ $cfg = core ] && name="shim + core 50%"
    [ $cfg = b-noq ] && name="base, no quota"; [ $cfg = b-withq ] && name="base + mem quota"
    [ $cfg = b-core ] && name="base + core 50%"
    awk -v r=$route -v n="$name" -v l="${L[$cfg]}" -v a="${A[$cfg]}" -v s="${S[$cfg]}" -v bl="${L[bare]}" \
      -v ba="${A[bare]}" -v bs="${S[bare]}" 'BEGIN {
      printf "%-8s %-16s %10.1f %6.2f %14.1f %6.2f %8.1f %6.2f   (%+.1f, %+.1f, %+.1f ns)\n", r, n, l, l/bl, a, a/ba, s, s/bs, l-bl, a-ba, s-bs }'
  done
done

# Start-up of processes that never use CUDA: median wall time of 31 interleaved runs.
once() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null 2>&1; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000 )); }
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo
printf '%-28s %10s %14s %18s\n' "process start-up (us)" bare "shim" "shim + quota"
for cmd in /bin/true "python3 -c pass"; do
  : >"$state/b"; : >"$state/s"; : >"$state/q"
  for _ in $(seq 31); do
    once env $cmd >>"$state/b"
    once env LD_PRELOAD=$HOOK_DIR/libfgpu.so $cmd >>"$state/s"
    once env LD_PRELOAD=$HOOK_DIR/libfgpu.so FGPU_MEMORY_LIMIT=1Gi $cmd >>"$state/q"
  done
  printf '%-28s %10s %14s %18s\n' "$cmd" "$(median <"$state/b")" "$(median <"$state/s")" "$(median <"$state/q")"
done
