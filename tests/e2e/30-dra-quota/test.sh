#!/usr/bin/env bash
# Scenario: fgpu's DRA kubelet plugin against the real kubelet, API server, scheduler and
# containerd. The plugin runs as a host process (plugin.sh) with the fake backend
# (deploy/fake/e2e-node.yaml: two fake H100s on node fgpu-node); two pods with quota claims
# of 4 GiB and 8 GiB of the class shared.gpu.fgpu.dev.
#
# Asserted: the ResourceSlice's shape; kube-scheduler puts both claims on the same GPU with
# consumedCapacity and distinct shareIDs (consumable capacity); the kubelet calls the plugin's
# NodePrepareResources, containerd applies the claim's CDI spec, and each container sees its
# quota (4096 / 8192 MiB) and gets CUDA_ERROR_OUT_OF_MEMORY past it; the CDI specs exist while
# the pods run; after kill -9 and a restart, re-preparing a claim returns the same CDI ids;
# deleting the pods (NodeUnprepareResources) leaves no CDI spec, claim directory or
# checkpoint record behind.
#
# Device nodes: the profile puts them under /run/fgpu-e2e/dev; plugin.sh creates them there
# as character devices with /dev/null's numbers (1:3), so runc can create /dev/nvidia0,
# /dev/nvidiactl, ... in the containers on a machine without GPUs.
source "$(dirname "$0")/../lib.sh"
[ "$K8S_MINOR" -ge 36 ] || skip "Kubernetes $K8S_VERSION: DRA consumable capacity is not on by default before 1.36"

source "$E2E_DIR/../plugin-lib.sh"
plugin_setup 30
driver=$PLUGIN_DRIVER
slice=$PLUGIN_SLICE
dra_sock=$PLUGIN_DRA_SOCK

cleanup() {
  local rc=$?
  # Pods first, while the plugin still serves NodeUnprepareResources.
  delete_tmpl "$E2E_DIR/workload.yaml"
  kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl delete -f "$E2E_DIR/../../../deploy/deviceclasses.yaml" --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  exit $rc
}
trap cleanup EXIT

kubectl apply -f "$E2E_DIR/../../../deploy/deviceclasses.yaml" >&2
start_plugin
wait_registered 1
say "ok: the kubelet accepted the registration"
wait_until 30 "ResourceSlice $slice published" kubectl get resourceslice "$slice"

# --- the slice's shape
s="resourceslice/$slice"
[ "$(jp "$s" '{.spec.devices[0].allowMultipleAllocations}' "")" = true ] \
  || skip "the API server dropped allowMultipleAllocations (DRAConsumableCapacity off)"
assert_eq "slice driver/pool/node" "$driver/$NODE_NAME/$NODE_NAME" "$(jp "$s" '{.spec.driver}/{.spec.pool.name}/{.spec.nodeName}' "")"
assert_eq "slice devices" "gpu-0 gpu-1" "$(jp "$s" '{.spec.devices[*].name}' "")"
assert_eq "gpu-0 attributes type/uuid/productName" "gpu/GPU-e2e00000-0000-4000-8000-000000000000/NVIDIA H100 80GB HBM3" \
  "$(jp "$s" "{.spec.devices[0].attributes.type.string}/{.spec.devices[0].attributes.uuid.string}/{.spec.devices[0].attributes.productName.string}" "")"
assert_eq "gpu-0 capacity memory/cores" "81559Mi/100" "$(jp "$s" '{.spec.devices[0].capacity.memory.value}/{.spec.devices[0].capacity.cores.value}' "")"
assert_eq "allowMultipleAllocations" "true true" "$(jp "$s" '{.spec.devices[*].allowMultipleAllocations}' "")"

# --- two quota claims, two pods
apply_tmpl "$E2E_DIR/workload.yaml"
t0=$SECONDS
for p in quota-4g quota-8g; do
  wait_until 120 "pod $p ran its probe" sh -c "kubectl -n $E2E_NS logs $p 2>/dev/null | grep -q probe_done"
done
say "both probes done $((SECONDS - t0))s after the pods were created"
field() { kubectl -n "$E2E_NS" logs "$1" | sed -n "s/^$2=//p"; }
for p in quota-4g quota-8g; do kubectl -n "$E2E_NS" logs "$p" | sed "s/^/      $p: /" >&2; done
claim_of() { jp "pod/$1" '{.status.resourceClaimStatuses[0].resourceClaimName}'; }
c4="resourceclaims.resource.k8s.io/$(claim_of quota-4g)"
c8="resourceclaims.resource.k8s.io/$(claim_of quota-8g)"
r='{.status.allocation.devices.results[0]'
assert_eq "4Gi claim: driver/pool/device" "$driver/$NODE_NAME/gpu-0" "$(jp "$c4" "$r.driver}/$r.pool}/$r.device}")"
assert_eq "8Gi claim: same device" "$driver/$NODE_NAME/gpu-0" "$(jp "$c8" "$r.driver}/$r.pool}/$r.device}")"
assert_eq "4Gi claim: consumedCapacity.memory" 4Gi "$(jp "$c4" "$r.consumedCapacity.memory}")"
assert_eq "8Gi claim: consumedCapacity.memory" 8Gi "$(jp "$c8" "$r.consumedCapacity.memory}")"
share4="$(jp "$c4" "$r.shareID}")" share8="$(jp "$c8" "$r.shareID}")"
{ [ -n "$share4" ] && [ -n "$share8" ] && [ "$share4" != "$share8" ]; } || fail "shareIDs: '$share4' and '$share8' (want two distinct)"
say "ok: distinct shareIDs $share4 $share8"

assert_eq "quota-4g preload (from the claim's CDI spec)" /usr/lib/fgpu/libfgpu.so "$(field quota-4g ld_so_preload)"
assert_eq "quota-4g cuMemGetInfo total (MiB)" 4096 "$(field quota-4g cuda_total_mib)"
assert_eq "quota-4g NVML total (MiB)" 4096 "$(field quota-4g nvml_total_mib)"
assert_eq "quota-4g allocated before refusal (MiB)" 4096 "$(field quota-4g allocated_mib)"
assert_eq "quota-4g allocation past the quota" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(field quota-4g next_alloc_result)"
assert_eq "quota-8g cuMemGetInfo total (MiB)" 8192 "$(field quota-8g cuda_total_mib)"
assert_eq "quota-8g allocated before refusal (MiB)" 8192 "$(field quota-8g allocated_mib)"
assert_eq "quota-8g allocation past the quota" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(field quota-8g next_alloc_result)"
# The contract's files (docs/shim-contract.md), seen by the pod's non-root user: its
# limits file, its accounts (0666, the shim's sizes), the feed directory and the GPU's
# priority file read-only; no node-wide writable directory.
assert_eq "quota-4g runs as uid" 1000 "$(field quota-4g uid | cut -d' ' -f1)"
# shellcheck disable=SC2016 # expanded by the container's sh
files4="$(kubectl -n "$E2E_NS" exec quota-4g -- sh -c 'cd /run/fgpu/claims/* && stat -c "%n %a %s" memory.state core.state && stat -c "%n %a" feed; ls /etc/fgpu/claims/*/limits | wc -l; echo "FGPU_GPU_DIR=${FGPU_GPU_DIR:-unset}"')"
assert_eq "quota-4g contract files" "memory.state 666 164928 core.state 666 4160 feed 755 " \
  "$(head -3 <<<"$files4" | tr '\n' ' ')"
assert_eq "quota-4g limits files" 1 "$(sed -n 4p <<<"$files4")"
assert_eq "quota-4g FGPU_GPU_DIR" "FGPU_GPU_DIR=unset" "$(sed -n 5p <<<"$files4")"
# shellcheck disable=SC2016 # expanded by the container's sh
prio="$(kubectl -n "$E2E_NS" exec quota-4g -- sh -c 'f=$(ls /run/fgpu/gpus/*.priority); echo $f; echo x > $f 2>/dev/null && echo written || echo refused')"
assert_eq "quota-4g may not stamp its GPU's priority file" refused "$(sed -n 2p <<<"$prio")"
say "ok: $(head -1 <<<"$prio") read-only in a normal-priority claim"

uid4="$(jp "$c4" '{.metadata.uid}')" uid8="$(jp "$c8" '{.metadata.uid}')"
spec4="$CDI_SPEC_DIR/$driver-claim_$uid4.json" spec8="$CDI_SPEC_DIR/$driver-claim_$uid8.json"
{ [ -f "$spec4" ] && [ -f "$spec8" ]; } || fail "CDI specs missing: $(ls "$CDI_SPEC_DIR")"
say "ok: CDI specs $(basename "$spec4") $(basename "$spec8")"
want4="$driver/claim=$uid4-gpu-0-$share4"
grep -q "\"$uid4-gpu-0-$share4\"" "$spec4" || fail "$spec4 has no device $uid4-gpu-0-$share4"
metric() { curl -s "http://${FGPU_E2E_METRICS:-127.0.0.1:19400}/metrics" | sed -n "s/^fgpu_kubelet_plugin_request_duration_seconds_$1{operation=\"Prepare\"} //p"; }
sum="$(metric sum)" count="$(metric count)"
[ -z "$count" ] || say "prepare latency: $count claims, $(awk -v s="$sum" -v c="$count" 'BEGIN{printf "%.1f", 1000*s/c}') ms on average (plugin metric)"

# --- kill -9 and restart: the prepared claim keeps its CDI ids
before="$("$dra_call" "$dra_sock" prepare "$E2E_NS" "${c4#*/}" "$uid4")"
assert_eq "re-prepare (same plugin) returns" "device=gpu-0 share=$share4 cdi=$want4" "$before"
kill -KILL "$plugin_pid"
wait "$plugin_pid" 2>/dev/null || true
plugin_pid=""
say "ok: plugin killed with SIGKILL"
start_plugin
wait_registered 2
after="$("$dra_call" "$dra_sock" prepare "$E2E_NS" "${c4#*/}" "$uid4")"
assert_eq "re-prepare after kill -9 and restart returns" "$before" "$after"
{ [ -f "$spec4" ] && [ -f "$spec8" ]; } || fail "CDI specs lost over the restart"
say "ok: CDI specs kept over the restart"

# --- delete the pods: the kubelet unprepares through the restarted plugin
kubectl -n "$E2E_NS" delete pod quota-4g quota-8g --wait=true --timeout=60s >&2
wait_until 60 "claims deleted with their pods" sh -c "[ -z \"\$(kubectl -n $E2E_NS get resourceclaims -o name)\" ]"
wait_until 30 "CDI specs removed" sh -c "[ ! -e $spec4 ] && [ ! -e $spec8 ]"
say "ok: CDI specs removed after the pods were deleted"
# shellcheck disable=SC2010 # names only, for the assertion's message; CDI spec names are plain
left="$(ls "$run_dir/claims" 2>/dev/null; ls "$CDI_SPEC_DIR" | grep "^$driver-" || true)"
assert_eq "leftover claim dirs and CDI specs" "" "$left"
assert_eq "checkpoint records (one file per claim)" "" "$(ls "$run_dir/checkpoint")"
