#!/usr/bin/env bash
# Real-GPU check of libfgpu.so (prepared for the lead; run on the GPU machine):
#   1. the driver-API program bare, under the shim without a quota, and under the shim
#      with a 4 GiB quota (reported total, refusal past it, pass-through cost);
#   2. nvidia-smi under the shim with the quota;
#   3. PyTorch, if importable: mem_get_info, a tensor within and one past the quota.
#   4. memcheck.c bare and under the shim: what contexts, pools at each synchronisation
#      and cuCtxSetLimit take on the real driver (the fake's model and the shim's charges).
# Plain-text output on stdout (and in $OUT/gpu-check.txt when $OUT is set).
#
# libfgpu.so: $FGPU_SO, else hook-lib/gpu-check/libfgpu.so, else target/release, else
# built here with `cargo build --release -p fgpu-hook` if cargo exists.
set -u
cd "$(dirname "$0")/../.."
HERE=hook-lib/gpu-check
WORK=$(mktemp -d /tmp/fgpu-gpu-check.XXXXXX)
LOG=${OUT:+$OUT/gpu-check.txt}
exec > >(tee ${LOG:-/dev/null}) 2>&1

SO=${FGPU_SO:-}
for c in "$HERE/libfgpu.so" "${CARGO_TARGET_DIR:-target}/release/libfgpu.so" target/release/libfgpu.so; do
  [ -z "$SO" ] && [ -f "$c" ] && SO=$c
done
if [ -z "$SO" ] && command -v cargo >/dev/null; then
  echo "== building libfgpu.so"
  CARGO_TARGET_DIR=$WORK/target cargo build -q --release -p fgpu-hook && SO=$WORK/target/release/libfgpu.so
fi
[ -n "$SO" ] || { echo "no libfgpu.so (set FGPU_SO)"; exit 2; }
SO=$(readlink -f "$SO")
echo "== libfgpu.so: $SO"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null

cc -O2 -Wall -o "$WORK/gpucheck" "$HERE/gpucheck.c" -ldl || { echo "cc failed"; exit 2; }
QUOTA=$((4 << 30))
mkdir -p "$WORK/claim"
rc=0

echo; echo "== 1a. bare driver"
"$WORK/gpucheck"
echo; echo "== 1b. shim, no quota (pass-through)"
LD_PRELOAD=$SO "$WORK/gpucheck"
echo; echo "== 1c. shim, FGPU_MEMORY_LIMIT=4Gi"
LD_PRELOAD=$SO FGPU_MEMORY_LIMIT=4Gi FGPU_STATE_DIR=$WORK/claim "$WORK/gpucheck" $QUOTA || rc=1

echo; echo "== 2. nvidia-smi under the shim with the quota (expect total 4096 MiB)"
if command -v nvidia-smi >/dev/null; then
  LD_PRELOAD=$SO FGPU_MEMORY_LIMIT=4Gi FGPU_STATE_DIR=$WORK/claim \
    nvidia-smi --query-gpu=index,memory.total,memory.used,memory.free --format=csv
fi

echo; echo "== 3. PyTorch"
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  for conf in "" "expandable_segments:True"; do
    echo "-- PYTORCH_CUDA_ALLOC_CONF=$conf"
    PYTORCH_CUDA_ALLOC_CONF=$conf LD_PRELOAD=$SO FGPU_MEMORY_LIMIT=4Gi FGPU_STATE_DIR=$WORK/claim python3 - <<'EOF' || rc=1
import torch
free, total = torch.cuda.mem_get_info()
print(f"torch.cuda.mem_get_info: free {free >> 20} MiB, total {total >> 20} MiB")
ok = total == 4 << 30
x = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
print("3 GiB tensor: allocated")
try:
    y = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    print("FAIL  2 more GiB allocated past the 4 GiB quota")
    ok = False
except torch.OutOfMemoryError as e:
    print("2 more GiB: refused (torch.OutOfMemoryError)")
del x
torch.cuda.empty_cache()
y = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
print("after free: 3 GiB again: allocated")
print("PASS  PyTorch sees and respects the quota" if ok else "FAIL  PyTorch")
raise SystemExit(0 if ok else 1)
EOF
  done
else
  echo "PyTorch with CUDA not available: skipped"
fi

echo; echo "== 4. memory without a cuMemAlloc (contexts, pools, cuCtxSetLimit): driver, then shim"
if cc -O2 -Wall -o "$WORK/memcheck" "$HERE/memcheck.c" -ldl; then
  echo "-- bare driver"
  "$WORK/memcheck"
  echo "-- shim, FGPU_MEMORY_LIMIT=8Gi FGPU_CONTEXT_OVERHEAD=300Mi"
  mkdir -p "$WORK/claim4"
  LD_PRELOAD=$SO FGPU_MEMORY_LIMIT=8Gi FGPU_CONTEXT_OVERHEAD=300Mi FGPU_STATE_DIR=$WORK/claim4 "$WORK/memcheck"
else
  echo "cc memcheck.c failed"; rc=1
fi

rm -rf "$WORK"
echo; [ $rc = 0 ] && echo "gpu-check: all PASS" || echo "gpu-check: FAILURES"
exit $rc
