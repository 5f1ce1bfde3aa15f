#!/usr/bin/env bash
# Starts fgpu-kubelet-plugin serve as a host process for this scenario (and for make demo), in the background, and
# prints its pid. Usage: plugin.sh <work dir>   (log appended to <work dir>/plugin.log)
# FGPU_E2E_PLUGIN_ARGS: more flags for serve, split on spaces (hack/bench-prepare.sh's modes).
# FGPU_E2E_FAKE_GPUS: another fake profile for the same node (62-observability marks a GPU
# unhealthy in a copy).
#
# The node is the local cluster's (fgpu-node) with the fake profile deploy/fake/e2e-node.yaml;
# its device nodes are stand-ins under /run/fgpu-e2e/dev, created here. The driver files are
# what a real node's would be: the fake CUDA driver/NVML from the cargo target directory,
# bind-mounted over the image's libcuda.so.1 / libnvidia-ml.so.1 (on a real node the host's
# driver libraries are mounted the same way), and libfgpu.so from the target directory at
# /usr/lib/fgpu/libfgpu.so (over the image's copy).
set -euo pipefail
work="$1"
mkdir -p "$work" /run/fgpu-e2e/dev
# Stand-ins for the fake GPUs' device nodes (the profile's deviceRoot): character devices
# with /dev/null's numbers (1:3), which runc can create in containers.
for n in nvidia0 nvidia1 nvidiactl nvidia-uvm nvidia-uvm-tools; do
  [ -c "/run/fgpu-e2e/dev/$n" ] || mknod -m 0666 "/run/fgpu-e2e/dev/$n" c 1 3
done
root="$(cd "$(dirname "$0")/../../.." && pwd)"
# The plugin binary and the libraries: $FGPU_E2E_BIN_DIR (test.sh copies them there), else
# the cargo target directory.
t="${FGPU_E2E_BIN_DIR:-${CARGO_TARGET_DIR:-${FGPU_CACHE:-/var/cache/fgpu}/target}/debug}"
libdir=/usr/lib/x86_64-linux-gnu
# As deploy/kubelet-plugin/daemonset.yaml runs it: two malloc arenas, which keeps the
# plugin's resident memory flat under concurrent prepares (glibc otherwise gives each of
# its threads an arena of its own).
export MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-2}"
# shellcheck disable=SC2086 # FGPU_E2E_PLUGIN_ARGS is split on purpose
"$t/fgpu-kubelet-plugin" serve \
  --node "$NODE_NAME" --backend fake --fake-gpus "${FGPU_E2E_FAKE_GPUS:-$root/deploy/fake/e2e-node.yaml}" \
  --kubelet-registrar-directory-path "$KUBELET_REGISTRAR_DIR" \
  --kubelet-plugins-directory-path "$KUBELET_PLUGINS_DIR" \
  --cdi-root "$CDI_SPEC_DIR" --state-dir "$work/state" --run-dir "${FGPU_E2E_RUN_DIR:-$work/run}" \
  --shim-library "$t/libfgpu.so" \
  --driver-file "$t/libfgpu_fake_cuda.so:$libdir/libcuda.so.1" \
  --driver-file "$t/libfgpu_fake_cuda.so:$libdir/libnvidia-ml.so.1" \
  --metrics-address "${FGPU_E2E_METRICS:-127.0.0.1:19400}" --resync-seconds 5 \
  ${FGPU_E2E_PLUGIN_ARGS:-} \
  </dev/null >>"$work/plugin.log" 2>&1 &
echo $!
