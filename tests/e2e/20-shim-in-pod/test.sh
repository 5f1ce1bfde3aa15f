#!/usr/bin/env bash
# Scenario (the one e2e scenario whose pods run as root; every other runs as uid 1000):
# libfgpu.so enforces a memory quota inside real containers (kubelet + containerd +
# runc), loaded through /etc/ld.so.preload and reading a read-only limits file, against the
# fake CUDA driver in the workload image. Each quota pod must see its quota as the card's
# total and be refused exactly at it; the control pod sees the whole fake card (80 GiB).
source "$(dirname "$0")/../lib.sh"
apply_tmpl "$E2E_DIR/pods.yaml"
for p in quota-4g quota-8g bare; do
  wait_until 120 "pod $p finished" jp_eq "pod/$p" '{.status.phase}' Succeeded
done
field() { kubectl -n "$E2E_NS" logs "$1" | sed -n "s/^$2=//p"; }
for p in quota-4g quota-8g bare; do kubectl -n "$E2E_NS" logs "$p" | sed "s/^/    $p: /" >&2; done

assert_eq "quota-4g preload" /usr/lib/fgpu/libfgpu.so "$(field quota-4g ld_so_preload)"
assert_eq "quota-4g cuMemGetInfo total (MiB)" 4096 "$(field quota-4g cuda_total_mib)"
assert_eq "quota-4g NVML total (MiB)" 4096 "$(field quota-4g nvml_total_mib)"
assert_eq "quota-4g allocated before refusal (MiB)" 4096 "$(field quota-4g allocated_mib)"
assert_eq "quota-4g allocation past the quota" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(field quota-4g next_alloc_result)"

assert_eq "quota-8g cuMemGetInfo total (MiB)" 8192 "$(field quota-8g cuda_total_mib)"
assert_eq "quota-8g allocated before refusal (MiB)" 8192 "$(field quota-8g allocated_mib)"
assert_eq "quota-8g allocation past the quota" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(field quota-8g next_alloc_result)"

assert_eq "bare preload" "(none)" "$(field bare ld_so_preload)"
assert_eq "bare cuMemGetInfo total (MiB)" 81920 "$(field bare cuda_total_mib)"
assert_eq "bare stops only at the probe's own 16 GiB cap" 16384 "$(field bare alloc_stopped_at_max_mib)"
delete_tmpl "$E2E_DIR/pods.yaml"
