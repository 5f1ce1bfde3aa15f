#!/usr/bin/env bash
# Integration tests of libfgpu.so against the fake CUDA driver. Run by `make hook-test`
# (which builds everything first). HOOK_DIR = the cargo profile directory.
set -uo pipefail

HOOK_DIR=${HOOK_DIR:?set HOOK_DIR to \$CARGO_TARGET_DIR/debug}
# FGPU_SHIM (or FGPU_TEST_SHIM): run the suite against another build of the shim (e.g. an
# older commit's).
SHIM=${FGPU_SHIM:-${FGPU_TEST_SHIM:-$HOOK_DIR/libfgpu.so}}
FAKE=$HOOK_DIR/fake-cuda
BIN=$HOOK_DIR/fgpu-hook-test
WORK=$(mktemp -d /tmp/fgpu-hook-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

export LD_LIBRARY_PATH=$FAKE${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export FAKE_CUDA_GPUS=2 FAKE_CUDA_MEMORY=80Gi
# Nothing from the caller's environment may set a quota.
unset FGPU_MEMORY_LIMIT FGPU_STATE_DIR FGPU_LIMITS_FILE FGPU_LOG CUDA_DEVICE_MEMORY_LIMIT \
  CUDA_DEVICE_MEMORY_SHARED_CACHE CUDA_VISIBLE_DEVICES
for i in $(seq 0 15); do unset FGPU_MEMORY_LIMIT_$i CUDA_DEVICE_MEMORY_LIMIT_$i; done

Q=$((64 << 20)) Q1=$((32 << 20))
pass=0 failed=0
ok() { echo "PASS  $1"; pass=$((pass + 1)); }
ko() { echo "FAIL  $1"; failed=$((failed + 1)); }

# run NAME CMD...: passes when CMD exits 0 and writes nothing to stderr.
run() {
  local name=$1; shift
  if "$@" >"$WORK/out" 2>"$WORK/err" && [ ! -s "$WORK/err" ]; then
    ok "$name: $(tail -n1 "$WORK/out")"
  else
    ko "$name"; sed 's/^/      /' "$WORK/out" "$WORK/err"
  fi
}
# must_fail NAME CMD...: the check itself must be able to fail.
must_fail() {
  local name=$1; shift
  if "$@" >"$WORK/out" 2>"$WORK/err"; then
    ko "$name (expected a failure)"
  else
    ok "$name: $(head -n1 "$WORK/err")"
  fi
}
shim() { env LD_PRELOAD="$SHIM" "$@"; }
# A fresh claim directory (the kubelet plugin creates it; the shim never does).
quota() {
  local dir="$WORK/state-$RANDOM$RANDOM"
  mkdir -p "$dir"
  env LD_PRELOAD="$SHIM" FGPU_MEMORY_LIMIT=64Mi FGPU_MEMORY_LIMIT_1=32Mi \
    FGPU_STATE_DIR="$dir" HT_QUOTA=$Q HT_QUOTA1=$Q1 "$@"
}

echo "== every allocation path, every way of reaching the driver"
for l in proc proc1 dlsym; do
  run "quota on all paths via $l" quota HT_LOADER=$l "$BIN/hooktest" paths
done
run "quota on all paths via direct linking" quota "$BIN/hooktest-direct" paths
run "quota on all paths, driver with private entry points" \
  quota FAKE_CUDA_PROC_INTERNAL=1 HT_LOADER=proc "$BIN/hooktest" paths
run "quota on all paths, driver re-entering its own API (counted once, no deadlock)" \
  quota FAKE_CUDA_REENTER=1 HT_LOADER=proc timeout 60 "$BIN/hooktest" paths
must_fail "without the shim the same checks fail" env HT_QUOTA=$Q "$BIN/hooktest" paths
run "quota without a state dir (process-local account)" \
  env LD_PRELOAD="$SHIM" FGPU_MEMORY_LIMIT=64Mi HT_QUOTA=$Q "$BIN/hooktest" paths
# A configured account that cannot be used refuses (a private account would multiply
# the quota by the number of processes).
must_fail "state dir missing: every allocation refused, never a private account" \
  env LD_PRELOAD="$SHIM" FGPU_MEMORY_LIMIT=64Mi FGPU_STATE_DIR=/nonexistent/fgpu HT_QUOTA=$Q "$BIN/hooktest" paths

echo "== what the process is told"
for l in proc dlsym; do
  run "cuMemGetInfo, cuDeviceTotalMem, NVML via $l" quota HT_LOADER=$l "$BIN/hooktest" meminfo
done
run "meminfo via direct linking" quota "$BIN/hooktest-direct" meminfo
must_fail "without the shim the whole GPU is reported" env HT_QUOTA=$Q "$BIN/hooktest" meminfo
# NVML devices map to the process's CUDA ordinals through CUDA_VISIBLE_DEVICES.
run "NVML: CUDA_VISIBLE_DEVICES=1 puts GPU 1 under FGPU_MEMORY_LIMIT_0" \
  shim CUDA_VISIBLE_DEVICES=1 FGPU_MEMORY_LIMIT_0=16Mi "$BIN/hooktest" nvml-total 1 $((16 << 20))
run "NVML: a GPU not visible to CUDA is not limited" \
  shim CUDA_VISIBLE_DEVICES=1 FGPU_MEMORY_LIMIT_0=16Mi "$BIN/hooktest" nvml-total 0 $((80 << 30))
run "NVML: CUDA_VISIBLE_DEVICES by UUID prefix" \
  shim CUDA_VISIBLE_DEVICES=GPU-fa4ec0da-0000-0000-8000-000000000001 FGPU_MEMORY_LIMIT_0=16Mi \
  "$BIN/hooktest" nvml-total 1 $((16 << 20))
run "no quota: pure pass-through (80 GiB seen)" shim "$BIN/hooktest" quota-is $((80 << 30))

echo "== launches, cuGetProcAddress semantics, dlsym"
for l in proc proc1 dlsym; do
  run "launch + entry points via $l" quota HT_EXPECT_SHIM=1 HT_LOADER=$l "$BIN/hooktest" launch
done
run "launch + RTLD_NEXT via direct linking" quota HT_EXPECT_SHIM=1 "$BIN/hooktest-direct" launch
run "launch, driver with private entry points" \
  quota FAKE_CUDA_PROC_INTERNAL=1 HT_EXPECT_SHIM=1 "$BIN/hooktest" launch

echo "== threads"
run "16 threads x 10000 random alloc/free" quota "$BIN/hooktest" threads

echo "== processes sharing one quota"
run "8 processes, one SIGKILLed holding memory" quota "$BIN/hooktest" share 8

# A process killed from outside (not a fork child): its memory returns to the next one.
state="$WORK/state-kill"
mkdir -p "$state"
LD_PRELOAD="$SHIM" FGPU_MEMORY_LIMIT=64Mi FGPU_STATE_DIR="$state" "$BIN/hooktest" hold $((48 << 20)) >"$WORK/hold" 2>&1 &
holder=$!
for _ in $(seq 100); do grep -q holding "$WORK/hold" && break; sleep 0.05; done
must_fail "a second process cannot take what the first holds" \
  env LD_PRELOAD="$SHIM" FGPU_MEMORY_LIMIT=64Mi FGPU_STATE_DIR="$state" "$BIN/hooktest" alloc $((32 << 20))
run "... but can take the rest" \
  env LD_PRELOAD="$SHIM" FGPU_MEMORY_LIMIT=64Mi FGPU_STATE_DIR="$state" "$BIN/hooktest" alloc $((16 << 20))
kill -KILL $holder; wait $holder 2>/dev/null
sleep 1.1
# A small allocation (no shortage) by another process reclaims the dead slot: ≤ 1 s.
env LD_PRELOAD="$SHIM" FGPU_MEMORY_LIMIT=64Mi FGPU_STATE_DIR="$state" "$BIN/hooktest" alloc 4096 >/dev/null
used=$(FGPU_STATE_DIR="$state" "$BIN/hooktest" account-used)
if [ "$used" = 0 ]; then ok "SIGKILLed process's 48 MiB reclaimed by the next allocation after 1 s"; else ko "account still holds $used after SIGKILL"; fi
run "after SIGKILL the whole quota is back" \
  env LD_PRELOAD="$SHIM" FGPU_MEMORY_LIMIT=64Mi FGPU_STATE_DIR="$state" "$BIN/hooktest" quota-is $Q

echo "== memory without a cuMemAlloc: pools after each synchronisation, contexts, cuCtxSetLimit, dlvsym"
# A pool keeps freed memory until a synchronisation gives what is above its release
# threshold back to the device; after each kind, through every lookup route, the
# account must match the driver and another process of the claim must get what is free.
for route in "HT_LOADER=dlsym" "HT_LOADER=dlsym HT_PTSZ=1" \
  "HT_LOADER=proc1 HT_FLAGS=0" "HT_LOADER=proc1 HT_FLAGS=1" "HT_LOADER=proc1 HT_FLAGS=2" \
  "HT_LOADER=proc HT_FLAGS=0" "HT_LOADER=proc HT_FLAGS=1" "HT_LOADER=proc HT_FLAGS=2" \
  "HT_LOADER=proc HT_FLAGS=2 FAKE_CUDA_PROC_INTERNAL=1" direct; do
  bin=$BIN/memtest; env=$route
  [ "$route" = direct ] && { bin=$BIN/memtest-direct; env=HT_LOADER=direct; }
  kinds="ctx ctx2 stream event trim threshold"
  case $route in *proc1*) kinds=${kinds/ctx2 /} ;; esac # cuCtxSynchronize_v2 is CUDA 12.9+
  for kind in $kinds; do
    # shellcheck disable=SC2086 # $env is a list of assignments
    run "pool after $kind synchronisation ($route)" quota $env "$bin" poolsync $kind
  done
done
for l in dlsym proc; do
  run "8 threads: pool allocations, frees and synchronisations, never past the quota (via $l)" \
    quota HT_LOADER=$l "$BIN/memtest" poolthreads
done
for l in dlsym proc; do
  run "device 1's pool used from device 0 is charged to device 1 (via $l)" quota HT_LOADER=$l "$BIN/memtest" otherdev
done
run "device 1's pool (direct linking)" quota "$BIN/memtest-direct" otherdev
ctxq() { quota FGPU_CONTEXT_OVERHEAD=8Mi FAKE_CUDA_CONTEXT_MEMORY=8Mi HT_CONTEXT=$((8 << 20)) "$@"; }
for l in dlsym proc1 proc; do
  run "8 MiB per context: 8 contexts fit in 64 MiB, the 9th is refused (cuCtxCreate via $l)" \
    ctxq HT_LOADER=$l "$BIN/memtest" contexts
done
run "8 MiB per context (direct linking)" ctxq "$BIN/memtest-direct" contexts
must_fail "without the shim the contexts pass the quota" \
  env FAKE_CUDA_CONTEXT_MEMORY=8Mi HT_CONTEXT=$((8 << 20)) HT_QUOTA=$Q "$BIN/memtest" contexts
for l in dlsym proc; do
  run "cuCtxSetLimit heap and stack charged, refused past the quota (via $l)" quota HT_LOADER=$l "$BIN/memtest" setlimit
done
run "cuCtxSetLimit (direct linking)" quota "$BIN/memtest-direct" setlimit
run "dlvsym and dlsym(libc) cannot reach the unwrapped driver" quota HT_LOADER=dlsym "$BIN/memtest" dlvsym
run "dlvsym (direct linking)" quota "$BIN/memtest-direct" dlvsym
must_fail "without the shim dlvsym reaches an unlimited cuMemAlloc_v2" env HT_QUOTA=$Q HT_LOADER=dlsym "$BIN/memtest" dlvsym

echo "== precedence: limits file > FGPU env > HAMi env"
printf '# written by the kubelet plugin\nFGPU_MEMORY_LIMIT=32Mi\n' >"$WORK/limits"
chmod 0444 "$WORK/limits"
hami="CUDA_DEVICE_MEMORY_SHARED_CACHE=$WORK/hami-default.cache"
run "HAMi names alone" shim $hami CUDA_DEVICE_MEMORY_LIMIT=48m "$BIN/hooktest" quota-is $((48 << 20))
run "HAMi per-device name" shim $hami CUDA_DEVICE_MEMORY_LIMIT_0=0x2000000 "$BIN/hooktest" quota-is $((32 << 20))
run "FGPU env over HAMi" shim CUDA_DEVICE_MEMORY_LIMIT=48m FGPU_MEMORY_LIMIT=40Mi \
  "$BIN/hooktest" quota-is $((40 << 20))
run "limits file over FGPU env and HAMi" shim CUDA_DEVICE_MEMORY_LIMIT=48m FGPU_MEMORY_LIMIT=40Mi \
  FGPU_LIMITS_FILE="$WORK/limits" "$BIN/hooktest" quota-is $((32 << 20))
run "the environment cannot raise the file's quota" shim FGPU_MEMORY_LIMIT_0=1Gi \
  FGPU_LIMITS_FILE="$WORK/limits" "$BIN/hooktest" quota-is $((32 << 20))
run "an unreadable limits file falls back to the environment" shim FGPU_MEMORY_LIMIT=40Mi \
  FGPU_LIMITS_FILE="$WORK/no-such-file" "$BIN/hooktest" quota-is $((40 << 20))
run "decimal and binary suffixes" shim FGPU_MEMORY_LIMIT=50M "$BIN/hooktest" quota-is 50000000
run "HAMi shared cache path is honoured" shim CUDA_DEVICE_MEMORY_LIMIT=48m \
  CUDA_DEVICE_MEMORY_SHARED_CACHE="$WORK/hami.cache" "$BIN/hooktest" quota-is $((48 << 20))
if [ -f "$WORK/hami.cache.fgpu" ]; then ok "account created at \$CUDA_DEVICE_MEMORY_SHARED_CACHE.fgpu"; else ko "no account at hami.cache.fgpu"; fi

echo "== never break the host"
run "/bin/true with the shim" shim /bin/true
run "/bin/true with the shim and a quota" shim FGPU_MEMORY_LIMIT=1Gi /bin/true
run "python start-up with the shim" shim FGPU_MEMORY_LIMIT=1Gi python3 -c 'import sys, ctypes; print("py ok")'
run "bash with the shim" shim FGPU_MEMORY_LIMIT=1Gi bash -c 'echo $((6*7))'
env LD_PRELOAD="$SHIM" FGPU_LOG=debug FGPU_MEMORY_LIMIT=64Mi "$BIN/hooktest" quota-is $Q >/dev/null 2>"$WORK/log"
if grep -q '^fgpu\[.*refused' "$WORK/log"; then
  ok "FGPU_LOG=debug logs to stderr (silent otherwise: checked by every run above)"
else
  ko "FGPU_LOG=debug wrote nothing"
fi

echo "== core quota and priority (fake GPU timeline; all scenarios run at once, one GPU each)"
# Kernels of 40 blocks x 10 us, graphs of 3 ms; shares are GPU time on the fake's
# timeline over a 5-second window after 2 s of warm-up.
# (Always run in the background: `exec` makes $! the test program's own pid.)
core_env() {
  exec env FAKE_CUDA_GPUS=13 FAKE_CUDA_STATE="$WORK/fake-gpu" FAKE_CUDA_BLOCK_NS=10000 \
    FAKE_CUDA_GRAPH_NS=3000000 LD_PRELOAD="$SHIM" "$@"
}
claim() { local d="$WORK/claim-$1"; mkdir -p "$d"; echo "$d"; }
for q in 10 30 50 70; do
  dev=$((q / 20))  # 10->0 30->1 50->2 70->3
  core_env FGPU_CORE_LIMIT=$q FGPU_STATE_DIR="$(claim alone$q)" HT_DEV=$dev \
    "$BIN/hooktest" work 7 2 >"$WORK/core-$q" 2>&1 &
done
core_env FGPU_CORE_LIMIT=30 FGPU_STATE_DIR="$(claim a)" HT_DEV=4 "$BIN/hooktest" work 7 2 >"$WORK/core-a30" 2>&1 &
core_env FGPU_CORE_LIMIT=70 FGPU_STATE_DIR="$(claim b)" HT_DEV=4 "$BIN/hooktest" work 7 2 >"$WORK/core-b70" 2>&1 &
core_env FGPU_CORE_LIMIT=30 FGPU_CORE_POLICY=share FGPU_STATE_DIR="$(claim share)" HT_DEV=5 \
  "$BIN/hooktest" work 7 2 >"$WORK/core-share" 2>&1 &
# share beside another claim: alone first, then a claim at 70 % arrives (t = 1 s).
core_env FGPU_CORE_LIMIT=30 FGPU_CORE_POLICY=share FGPU_STATE_DIR="$(claim share2)" HT_DEV=9 \
  "$BIN/hooktest" work 8 3 >"$WORK/core-share2" 2>&1 &
(sleep 1; core_env FGPU_CORE_LIMIT=70 FGPU_STATE_DIR="$(claim beside)" HT_DEV=9 \
  "$BIN/hooktest" work 7 2 >"$WORK/core-beside" 2>&1) &
# Where the quota comes from: the limits file over the environment; HAMi's name alone.
printf 'FGPU_CORE_LIMIT=20\n' >"$WORK/core-limits"
core_env FGPU_LIMITS_FILE="$WORK/core-limits" FGPU_CORE_LIMIT=90 FGPU_STATE_DIR="$(claim file)" HT_DEV=10 \
  "$BIN/hooktest" work 7 2 >"$WORK/core-file" 2>&1 &
core_env CUDA_DEVICE_SM_LIMIT=40 CUDA_DEVICE_MEMORY_SHARED_CACHE="$WORK/hami-core.cache" HT_DEV=11 \
  "$BIN/hooktest" work 7 2 >"$WORK/core-hami" 2>&1 &
# One claim of three processes at 50 %; one is SIGKILLed in the middle of its burst.
kdir=$(claim kill)
for i in 1 2; do
  core_env FGPU_CORE_LIMIT=50 FGPU_STATE_DIR="$kdir" HT_DEV=6 "$BIN/hooktest" work 7 2 >"$WORK/core-k$i" 2>&1 &
done
# (In a subshell whose stderr is dropped: no "Killed" job notice in the output.)
(
  core_env FGPU_CORE_LIMIT=50 FGPU_STATE_DIR="$kdir" HT_DEV=6 "$BIN/hooktest" work 7 2 >"$WORK/core-k3" 2>&1 &
  victim=$!
  sleep 1.5
  kill -KILL "$victim"
  wait "$victim"
) 2>/dev/null &
# Priority on GPU 7: a low-priority claim, and a high-priority one active from 1 s to 2 s.
gpudir="$WORK/gpu-dir"; mkdir -p "$gpudir"
core_env FGPU_PRIORITY=low FGPU_GPU_DIR="$gpudir" FGPU_STATE_DIR="$(claim low)" HT_DEV=7 \
  "$BIN/hooktest" prio-low 3 "$WORK/high-times" >"$WORK/prio-low" 2>&1 &
core_env FGPU_PRIORITY=high FGPU_GPU_DIR="$gpudir" FGPU_STATE_DIR="$(claim high)" HT_DEV=7 \
  "$BIN/hooktest" prio-high 1 1 "$WORK/high-times" >"$WORK/prio-high" 2>&1 &
# 30 + 70 again, each claim's process PID 1 of its own PID namespace (as in two
# containers): NVML must still tell the two apart (a real node's NVML reports host PIDs,
# unique), or the 30 % claim counts the other's work as its own and starves.
for q in 30 70; do
  core_env unshare -p -f --mount-proc env FGPU_CORE_LIMIT=$q FGPU_STATE_DIR="$(claim ns$q)" HT_DEV=12 \
    "$BIN/hooktest" work 7 2 >"$WORK/core-ns$q" 2>&1 &
done
# The same workload without the shim takes the whole GPU (the checks can fail).
core_env LD_PRELOAD= HT_DEV=8 "$BIN/hooktest" work 7 2 >"$WORK/core-bare" 2>&1 &
wait
share_of() { sed -n 's/.*share=\([0-9.]*\).*/\1/p' "$1"; }
within() { awk -v g="$1" -v q="$2" -v t="$3" 'BEGIN { d = g - q; if (d < 0) d = -d; exit !(g != "" && d <= t) }'; }
for q in 10 30 50 70; do
  g=$(share_of "$WORK/core-$q")
  if within "$g" $q 3; then ok "core quota $q % alone: $g % of GPU time (kernels, Ex, cooperative, graphs)"; else ko "core quota $q % alone: got '${g}'"; sed 's/^/      /' "$WORK/core-$q"; fi
done
ga=$(share_of "$WORK/core-a30"); gb=$(share_of "$WORK/core-b70")
if within "$ga" 30 3 && within "$gb" 70 3; then ok "core quotas 30 + 70 competing: $ga % + $gb %"; else ko "30 + 70 competing: '$ga' + '$gb'"; cat "$WORK/core-a30" "$WORK/core-b70"; fi
ga=$(share_of "$WORK/core-ns30"); gb=$(share_of "$WORK/core-ns70")
if within "$ga" 30 3 && within "$gb" 70 3; then ok "core quotas 30 + 70 competing, each PID 1 of its own PID namespace: $ga % + $gb %"; else ko "30 + 70 in two PID namespaces: '$ga' + '$gb'"; cat "$WORK/core-ns30" "$WORK/core-ns70"; fi
gs=$(share_of "$WORK/core-share")
if awk -v g="$gs" 'BEGIN { exit !(g != "" && g >= 90) }'; then ok "FGPU_CORE_POLICY=share alone uses idle time: $gs % at quota 30"; else ko "share policy: '$gs'"; cat "$WORK/core-share"; fi
g2=$(share_of "$WORK/core-share2"); g3=$(share_of "$WORK/core-beside")
if within "$g2" 30 3 && within "$g3" 70 3; then ok "share policy yields when another claim arrives: $g2 % (quota 30) beside $g3 % (quota 70)"; else ko "share beside another: '$g2' + '$g3'"; cat "$WORK/core-share2" "$WORK/core-beside"; fi
gf=$(share_of "$WORK/core-file"); gh=$(share_of "$WORK/core-hami")
if within "$gf" 20 3; then ok "limits file's FGPU_CORE_LIMIT=20 wins over the environment's 90: $gf %"; else ko "core quota from the limits file: '$gf'"; fi
if within "$gh" 40 3; then ok "HAMi's CUDA_DEVICE_SM_LIMIT=40: $gh %"; else ko "CUDA_DEVICE_SM_LIMIT: '$gh'"; fi
gk=$(cat "$WORK/core-k1" "$WORK/core-k2" | sed -n 's/.*share=\([0-9.]*\).*/\1/p' | awk '{ s += $1 } END { if (NR == 2) print s }')
if within "$gk" 50 3 && ! grep -q share= "$WORK/core-k3"; then ok "a process SIGKILLed mid-burst wedges nobody: the other two keep the claim at $gk % of 50"; else ko "kill mid-burst: '$gk'"; cat "$WORK/core-k1" "$WORK/core-k2"; fi
gn=$(share_of "$WORK/core-bare")
if awk -v g="$gn" 'BEGIN { exit !(g != "" && g > 90) }'; then ok "without the shim the same workload takes $gn % of the GPU"; else ko "bare workload: '$gn'"; fi
if grep -q stalled "$WORK/prio-low" && [ ! -s "$WORK/prio-high" ]; then ok "priority: low $(cat "$WORK/prio-low")"; else ko "priority"; sed 's/^/      /' "$WORK/prio-low" "$WORK/prio-high"; fi

# What the node's metrics read back from the accounts (docs/shim-contract.md): the time
# the claim's launches waited, in its core account (entry 0, throttled_ns at +224).
u64_at() { od -An -t u8 -j "$2" -N 8 "$1" 2>/dev/null | tr -d ' '; }
t30=$(u64_at "$WORK/claim-alone30/fgpu-core.state" $((64 + 224)))
tsh=$(u64_at "$WORK/claim-share/fgpu-core.state" $((64 + 224)))
# (share waits only until its first control period finds it alone.)
if [ -n "$t30" ] && [ -n "$tsh" ] && [ "$t30" -gt 3000000000 ] && [ "$tsh" -lt $((t30 / 10)) ]; then
  ok "core account: a 30 % claim's launches waited $((t30 / 1000000)) ms in 7 s; share alone $((tsh / 1000000)) ms"
else
  ko "core account throttled_ns: 30 % '$t30', share alone '$tsh'"
fi

# More processes in one claim than its account has PID slots (32): those left without a
# slot must count as unidentified (their work is the claim's), never as another claim's.
# The claim's share is read over one window for all 40 (device 6 is theirs alone): summing
# each worker's share over its own window counts the start-up stagger as extra share.
many=$(claim many)
for i in $(seq 1 40); do
  core_env FGPU_CORE_LIMIT=30 FGPU_STATE_DIR="$many" HT_DEV=6 "$BIN/hooktest" work 10 2 >"$WORK/core-many$i" 2>&1 &
done
core_env LD_PRELOAD= "$BIN/hooktest" devshare 6 3 5 >"$WORK/core-many-all" 2>&1 &
wait
gm=$(share_of "$WORK/core-many-all")
nm=$(cat "$WORK"/core-many[0-9]* | grep -c share=)
if [ "$nm" = 40 ] && within "$gm" 30 3; then ok "40 processes in one claim (32 PID slots): the claim keeps its 30 %: $gm %"; else ko "40 processes in one claim: '$gm' ($nm of 40 workers finished)"; cat "$WORK/core-many-all"; fi

# Refusals past the quota, counted in the memory account (device 0, refusals at +40).
mkdir -p "$WORK/refusals"
for _ in 1 2 3; do
  env LD_PRELOAD="$SHIM" FGPU_MEMORY_LIMIT=64Mi FGPU_STATE_DIR="$WORK/refusals" \
    "$BIN/hooktest" alloc $((512 << 20)) >/dev/null 2>&1 || true
done
env LD_PRELOAD="$SHIM" FGPU_MEMORY_LIMIT=64Mi FGPU_STATE_DIR="$WORK/refusals" \
  "$BIN/hooktest" alloc $((16 << 20)) >/dev/null 2>&1 || true
nref=$(u64_at "$WORK/refusals/fgpu-memory.state" $((64 + 40)))
if [ "$nref" = 3 ]; then ok "memory account: 3 allocations past the quota counted as refusals, the one within not"; else ko "memory account refusals: '$nref' (want 3)"; fi

echo "== a shim-free program (fgpu-bypass) and what a host-side NVML reader sees"
# fgpu-bypass links the fake driver in: nothing the shim can interpose. With the shim
# preloaded and a 64 MiB quota it still takes 512 MiB, which the fake NVML (host view)
# lists under its PID: what the node monitor's backstop has to catch.
bstate="$WORK/bypass-gpu"
if ! syms=$(readelf --dyn-syms -W "$HOOK_DIR/fgpu-bypass" 2>&1); then
  ko "readelf --dyn-syms fgpu-bypass: $syms"
elif grep -Eq ' (cu|nvml)[A-Z][A-Za-z_0-9]*$|dlopen|dlsym' <<<"$syms"; then
  ko "fgpu-bypass has dynamic CUDA/NVML or dlopen/dlsym symbols"; grep -E ' (cu|nvml)[A-Z]|dlopen|dlsym' <<<"$syms"
else
  ok "fgpu-bypass: no dynamic cu*/nvml* symbol, no dlopen/dlsym ($(wc -l <<<"$syms") dynamic symbols)"
fi
must_fail "the same quota refuses 512 MiB through libcuda.so.1" \
  quota FAKE_CUDA_STATE="$bstate" "$BIN/hooktest" alloc $((512 << 20))
mkdir -p "$WORK/state-bypass"
# (A plain command in the background: $! is the program's own pid.)
env LD_PRELOAD="$SHIM" FGPU_MEMORY_LIMIT=64Mi FGPU_STATE_DIR="$WORK/state-bypass" FAKE_CUDA_STATE="$bstate" \
  "$HOOK_DIR/fgpu-bypass" --gpu GPU-fa4ec0da-0000-0000-8000-000000000001 --alloc-mib 512 --hold-s 30 \
  >"$WORK/bypass" 2>&1 &
bypass=$!
for _ in $(seq 100); do grep -q bypass_allocated_mib "$WORK/bypass" && break; sleep 0.05; done
if grep -qx bypass_allocated_mib=512 "$WORK/bypass" && grep -q libfgpu.so "/proc/$bypass/maps"; then
  ok "fgpu-bypass with the shim loaded and a 64 MiB quota: $(head -n1 "$WORK/bypass")"
else
  ko "fgpu-bypass under the shim"; sed 's/^/      /' "$WORK/bypass"
fi
FAKE_CUDA_STATE="$bstate" FAKE_CUDA_NVML_HOST=1 "$HOOK_DIR/fgpu-fake-smi" >"$WORK/smi" 2>&1
if grep -qx "gpu=1 uuid=GPU-fa4ec0da-0000-0000-8000-000000000001 pid=$bypass used_mib=512" "$WORK/smi"; then
  ok "host-mode NVML lists fgpu-bypass (pid $bypass) with its 512 MiB on GPU 1"
else
  ko "host-mode NVML view of fgpu-bypass (pid $bypass)"; sed 's/^/      /' "$WORK/smi"
fi
kill -KILL "$bypass"; wait "$bypass" 2>/dev/null
FAKE_CUDA_STATE="$bstate" FAKE_CUDA_NVML_HOST=1 "$HOOK_DIR/fgpu-fake-smi" >"$WORK/smi" 2>&1
if [ -z "$(grep "pid=$bypass " "$WORK/smi")" ]; then ok "... and not once it is dead"; else ko "dead fgpu-bypass still listed"; cat "$WORK/smi"; fi

# shellcheck source=hook-lib/tests/hostile.sh
. "$(dirname "$0")/hostile.sh"

echo "== $pass passed, $failed failed"
[ "$failed" -eq 0 ]
