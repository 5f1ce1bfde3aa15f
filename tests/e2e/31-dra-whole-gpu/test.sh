#!/usr/bin/env bash
# Scenario: whole GPUs through fgpu's DRA kubelet plugin, on every release with DRA (1.32+;
# skipped below). The plugin runs as a host process (../plugin-lib.sh, ../30-dra-quota/plugin.sh)
# with the fake profile deploy/fake/e2e-node.yaml (two fake H100s on fgpu-node).
#
# Asserted: the ResourceSlice in the API version the release serves — v1 (1.34+) or v1beta1
# (1.32/1.33, device fields wrapped in `basic`) — with attributes and capacities, and
# allowMultipleAllocations only where the API server keeps it (DRAConsumableCapacity: on from
# 1.36; on 1.34/1.35 the plugin reads the slice back and republishes plain devices);
# deploy/deviceclasses.yaml applies (rendered for the served version); two claims of the
# whole-GPU class gpu.fgpu.dev are allocated by kube-scheduler on the two different GPUs, the
# kubelet prepares them through the plugin (DRA v1 or v1beta1 gRPC, whichever the kubelet
# speaks), containerd applies the CDI spec and each container sees the whole GPU (the profile's
# memory) with the shim preloaded and the whole-device limit; a third claim stays pending
# (unschedulable: both GPUs taken); deleting the pods unprepares (no CDI spec left).
source "$(dirname "$0")/../lib.sh"
api="$(dra_api_version)"
[ "$api" != none ] || skip "Kubernetes $K8S_VERSION: no usable DRA before 1.32"
source "$E2E_DIR/../plugin-lib.sh"
root="$E2E_DIR/../../.."

cleanup() {
  local rc=$?
  # Pods first, while the plugin still serves NodeUnprepareResources.
  kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl -n "$E2E_NS" delete resourceclaims --all --wait=true --timeout=30s >/dev/null 2>&1 || true
  classes | kubectl delete -f - --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  exit $rc
}
trap cleanup EXIT
plugin_setup 31

# The profile's memory per GPU (MiB), the number we expect in the containers.
mem_mi="$(sed -n 's/^ *memory: *\([0-9]*\)Mi$/\1/p' "$root/deploy/fake/e2e-node.yaml" | head -1)"
[ -n "$mem_mi" ] || fail "no 'memory: <n>Mi' in deploy/fake/e2e-node.yaml"

classes | kubectl apply -f - >&2
assert_eq "DeviceClasses ($api)" "gpu.fgpu.dev shared.gpu.fgpu.dev" \
  "$(kubectl get "deviceclasses.$api.resource.k8s.io" gpu.fgpu.dev shared.gpu.fgpu.dev -o jsonpath='{.items[*].metadata.name}')"
start_plugin
wait_registered 1
say "ok: the kubelet accepted the registration"
wait_until 30 "ResourceSlice $PLUGIN_SLICE published" kubectl get "resourceslices.$api.resource.k8s.io" "$PLUGIN_SLICE"

# --- the slice's shape, read in the served version
s="resourceslices.$api.resource.k8s.io/$PLUGIN_SLICE"
assert_eq "slice apiVersion" "resource.k8s.io/$api" "$(jp "$s" '{.apiVersion}' "")"
assert_eq "slice driver/pool/node" "$PLUGIN_DRIVER/$NODE_NAME/$NODE_NAME" "$(jp "$s" '{.spec.driver}/{.spec.pool.name}/{.spec.nodeName}' "")"
assert_eq "slice devices" "gpu-0 gpu-1" "$(jp "$s" '{.spec.devices[*].name}' "")"
b=""; [ "$api" = v1beta1 ] && b=".basic"
d0=".spec.devices[0]$b" d1=".spec.devices[1]$b"
assert_eq "gpu-0 attributes type/uuid/productName" "gpu/GPU-e2e00000-0000-4000-8000-000000000000/NVIDIA H100 80GB HBM3" \
  "$(jp "$s" "{$d0.attributes.type.string}/{$d0.attributes.uuid.string}/{$d0.attributes.productName.string}" "")"
assert_eq "gpu-1 attribute uuid" GPU-e2e00000-0000-4000-8000-000000000001 "$(jp "$s" "{$d1.attributes.uuid.string}" "")"
assert_eq "gpu-0 capacity memory/cores" "${mem_mi}Mi/100" "$(jp "$s" "{$d0.capacity.memory.value}/{$d0.capacity.cores.value}" "")"
assert_eq "gpu-1 capacity memory/cores" "${mem_mi}Mi/100" "$(jp "$s" "{$d1.capacity.memory.value}/{$d1.capacity.cores.value}" "")"
multi="$(jp "$s" "{.spec.devices[*]$b.allowMultipleAllocations}" "")"
if [ "$K8S_MINOR" -ge 36 ]; then
  assert_eq "allowMultipleAllocations (DRAConsumableCapacity on)" "true true" "$multi"
else
  # 1.34/1.35 (gate off): the API server drops the field; the plugin must notice and
  # republish plain devices. 1.32/1.33 have no such field.
  assert_eq "allowMultipleAllocations (none: DRAConsumableCapacity off)" "" "$multi"
  if [ "$K8S_MINOR" -ge 34 ]; then
    grep -q 'publishing plain devices' "$work/plugin.log" || fail "the plugin did not log that it republished plain devices"
    say "ok: the plugin republished plain devices"
  fi
fi

# --- whole-GPU claims
# Each: a claim of one whole GPU and a pod running fgpu-probe over the whole card (lib.sh).
for i in 1 2; do whole_gpu_probe "whole-$i" 1024; done
for i in 1 2; do
  wait_until 120 "pod whole-$i ran its probe" sh -c "kubectl -n $E2E_NS logs whole-$i 2>/dev/null | grep -q probe_done"
  kubectl -n "$E2E_NS" logs "whole-$i" | sed "s/^/      whole-$i: /" >&2
done
field() { kubectl -n "$E2E_NS" logs "$1" | sed -n "s/^$2=//p"; }
r='{.status.allocation.devices.results[0]'
c="resourceclaims.$api.resource.k8s.io"
dev1="$(jp "$c/whole-1" "$r.device}")" dev2="$(jp "$c/whole-2" "$r.device}")"
assert_eq "whole-1 driver/pool" "$PLUGIN_DRIVER/$NODE_NAME" "$(jp "$c/whole-1" "$r.driver}/$r.pool}")"
assert_eq "whole-2 driver/pool" "$PLUGIN_DRIVER/$NODE_NAME" "$(jp "$c/whole-2" "$r.driver}/$r.pool}")"
assert_eq "the two claims' devices" "gpu-0 gpu-1" "$(printf '%s\n' "$dev1" "$dev2" | sort | xargs)"
whole_alloc=$(( mem_mi / 1024 * 1024 ))
for i in 1 2; do
  assert_eq "whole-$i preload (from the claim's CDI spec)" /usr/lib/fgpu/libfgpu.so "$(field whole-$i ld_so_preload)"
  assert_eq "whole-$i cuMemGetInfo total (MiB)" "$mem_mi" "$(field whole-$i cuda_total_mib)"
  assert_eq "whole-$i NVML total (MiB)" "$mem_mi" "$(field whole-$i nvml_total_mib)"
  assert_eq "whole-$i allocated before refusal (MiB)" "$whole_alloc" "$(field whole-$i allocated_mib)"
  assert_eq "whole-$i allocation past the card" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(field whole-$i next_alloc_result)"
  # The shim runs with the whole-device limit (limits file and environment from the CDI spec).
  # shellcheck disable=SC2016 # expanded by the container's sh
  assert_eq "whole-$i limits file gpu.<uuid>.memory (bytes)" "$((mem_mi * 1024 * 1024))" \
    "$(kubectl -n "$E2E_NS" exec "whole-$i" -- sh -c 'sed -n "s/^gpu\.[^.]*\.memory=//p" /etc/fgpu/claims/*/limits')"
  # shellcheck disable=SC2016 # expanded by the container's sh
  assert_eq "whole-$i FGPU_MEMORY_LIMIT in the environment" "$((mem_mi * 1024 * 1024))" \
    "$(kubectl -n "$E2E_NS" exec "whole-$i" -- sh -c 'echo $FGPU_MEMORY_LIMIT')"
done
uid1="$(jp "$c/whole-1" '{.metadata.uid}')" uid2="$(jp "$c/whole-2" '{.metadata.uid}')"
spec1="$CDI_SPEC_DIR/$PLUGIN_DRIVER-claim_$uid1.json" spec2="$CDI_SPEC_DIR/$PLUGIN_DRIVER-claim_$uid2.json"
{ [ -f "$spec1" ] && [ -f "$spec2" ]; } || fail "CDI specs missing: $(ls "$CDI_SPEC_DIR")"
share1="$(jp "$c/whole-1" "$r.shareID}")"
name1="$uid1-$dev1${share1:+-$share1}"
grep -q "\"$name1\"" "$spec1" || fail "$spec1 has no device $name1"
say "ok: CDI specs $(basename "$spec1") $(basename "$spec2")"
# The kubelet called NodePrepareResources in the DRA gRPC version it prefers: v1 from 1.34,
# v1beta1 on 1.32/1.33 (the plugin logs which service the call came in on).
grpc_of() {
  sed 's/\x1b\[[0-9;]*m//g' "$work/plugin.log" | grep 'prepared claim' | grep "$1" | head -1 \
    | sed -n 's/.*grpc="\{0,1\}\([a-z0-9]*\).*/\1/p'
}
want_grpc=v1; [ "$K8S_MINOR" -ge 34 ] || want_grpc=v1beta1
assert_eq "kubelet's DRA gRPC for whole-1" "$want_grpc" "$(grpc_of "$uid1")"
assert_eq "kubelet's DRA gRPC for whole-2" "$want_grpc" "$(grpc_of "$uid2")"
# Preparing again (here over DRA v1 gRPC, whatever the kubelet spoke) returns the recorded ids.
assert_eq "whole-1 re-prepare through dra_call" "device=$dev1 share=$share1 cdi=$PLUGIN_DRIVER/claim=$name1" \
  "$("$dra_call" "$PLUGIN_DRA_SOCK" prepare "$E2E_NS" whole-1 "$uid1")"

# --- a third whole GPU does not fit
whole_gpu_probe whole-3 1024
wait_until 60 "pod whole-3 unschedulable" sh -c \
  "kubectl -n $E2E_NS get pod whole-3 -o jsonpath='{.status.conditions[?(@.type==\"PodScheduled\")].reason}' | grep -q Unschedulable"
assert_eq "whole-3 phase" Pending "$(jp pod/whole-3 '{.status.phase}')"
assert_eq "whole-3 claim allocation" "" "$(jp "$c/whole-3" '{.status.allocation}')"
say "ok: the third whole-GPU claim stays pending ($(jp pod/whole-3 '{.status.conditions[?(@.type=="PodScheduled")].message}'))"

# --- delete the pods: the kubelet unprepares
kubectl -n "$E2E_NS" delete pod whole-1 whole-2 whole-3 --wait=true --timeout=60s >&2
wait_until 30 "CDI specs removed" sh -c "[ ! -e $spec1 ] && [ ! -e $spec2 ]"
# shellcheck disable=SC2010 # names only, for the assertion's message; CDI spec names are plain
left="$(ls "$run_dir/claims" 2>/dev/null; ls "$CDI_SPEC_DIR" | grep "^$PLUGIN_DRIVER-" || true)"
assert_eq "leftover claim dirs and CDI specs" "" "$left"
