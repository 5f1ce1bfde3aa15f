#!/usr/bin/env bash
# Scenario: GPU health on the legacy path. The device plugin (fake backend, a copy of
# tests/e2e/legacy-node.yaml: gpu-0 H100, gpu-1 A100) checks health every 2 s, healthy again
# after 3 clean checks; a fault is injected with `fgpu-kubelet-plugin fake-fault`.
#
# Asserted: XID 79 on the H100 -> the kubelet's allocatable nvidia.com/gpu drops from 20 to
# 10 (ListAndWatch sent the H100's 10 shares Unhealthy), the node's inventory annotation
# says healthy=false for it, a GpuUnhealthy Event on the Node; a pod pinned to the H100
# stays Pending with the extender's reason, an unpinned pod lands on the A100 and runs.
# Clearing the fault -> allocatable back to 20 after the recovery window, the annotation
# healthy again, a GpuHealthy Event, and a pod pinned to the H100 runs on it.
source "$(dirname "$0")/../lib.sh"
source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../legacy-lib.sh"
trap 'legacy_cleanup $?' EXIT
legacy_setup 54
LEGACY_WEBHOOK=0   # see legacy-lib.sh
cp "$LEGACY_PROFILE" "$work/legacy-node.yaml"
LEGACY_PROFILE="$work/legacy-node.yaml"
legacy_up
H100=GPU-e2e1e9ac-0000-4000-8000-000000000000 A100=GPU-e2e1e9ac-0000-4000-8000-000000000001
bin="$work/bin/fgpu-kubelet-plugin"
pod() { # pod <name> <MiB> [annotations]
  local ann="${3:-"{}"}"
  sed -e "s#__NAME__#$1#" -e "s#__MEM__#$2#" -e "s#__ANNOTATIONS__#$ann#" "$E2E_DIR/pods.yaml" >"$work/$1.yaml"
  legacy_apply "$work/$1.yaml"
}
uuid() { decision_field "$1" 'd["containers"][0]["devices"][0]["uuid"]'; }
allocatable() { kubectl get node "$NODE_NAME" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}'; }
# healthy_in_inventory <uuid>: the inventory annotation's healthy field of that GPU.
healthy_in_inventory() {
  node_inventory "$NODE_NAME" | py_json "[g.get('healthy', True) for g in d if g['uuid'] == '$1'][0]"
}
node_events() {
  kubectl get events -n default --field-selector "involvedObject.kind=Node,involvedObject.name=$NODE_NAME,reason=$1" \
    -o 'jsonpath={range .items[*]}{.message}{"\n"}{end}' 2>/dev/null
}

assert_eq "H100 healthy in the inventory before the fault" True "$(healthy_in_inventory "$H100")"

# --- XID 79 on the H100
"$bin" fake-fault --fake-gpus "$LEGACY_PROFILE" --gpu 0 xid 79 >&2 || fail "fake-fault refused"
t0=$SECONDS
wait_until 30 "allocatable nvidia.com/gpu = 10 (the H100's shares Unhealthy)" sh -c "[ \"\$(kubectl get node $NODE_NAME -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')\" = 10 ]"
say "ok: allocatable $(allocatable) $((SECONDS - t0))s after the fault"
wait_until 15 "the inventory annotation says the H100 is unhealthy" sh -c "[ \"\$(kubectl get node $NODE_NAME -o jsonpath='{.metadata.annotations.gpu\.fgpu\.dev/node-gpus}' | python3 -c 'import json,sys; print([g.get(\"healthy\", True) for g in json.load(sys.stdin) if g[\"uuid\"] == \"$H100\"][0])')\" = False ]"
assert_eq "A100 still healthy in the inventory" True "$(healthy_in_inventory "$A100")"
# (the Node's Events of earlier scenarios may still be there: look for the H100's)
wait_until 15 "a GpuUnhealthy Event on the Node for the H100" sh -c "kubectl get events -n default --field-selector involvedObject.kind=Node,reason=GpuUnhealthy -o jsonpath='{.items[*].message}' | grep -q '$H100: unhealthy (fatal): XID 79'"
say "ok: GpuUnhealthy event: $(node_events GpuUnhealthy | grep "$H100" | tail -1)"
metrics="$(curl -fsS "http://$LEGACY_DP_METRICS_ADDR/metrics")" || fail "cannot scrape the device plugin"
grep -q "^fgpu_kubelet_plugin_gpu_healthy{gpu_uuid=\"$H100\",gpu_index=\"0\"} 0$" <<<"$metrics" \
  || fail "gpu_healthy metric: $(grep gpu_healthy <<<"$metrics")"
say "ok: metric gpu_healthy 0 for the H100"

# --- the extender keeps new pods off it
sleep 3 # the extender's resync reads the annotation
pod pinned 5000 "{nvidia.com/use-gpuuuid: $H100}"
pod free 5000
wait_until 60 "pinned: FailedScheduling from the extender" sh -c \
  "kubectl -n $E2E_NS get events --field-selector involvedObject.name=pinned,reason=FailedScheduling -o name | grep -q ."
say "ok: pinned stays Pending: $(kubectl -n "$E2E_NS" get events --field-selector involvedObject.name=pinned,reason=FailedScheduling -o jsonpath='{.items[0].message}' | cut -c1-220)"
assert_eq "pinned: node" "" "$(jp pod/pinned '{.spec.nodeName}')"
wait_probe free
assert_eq "free: GPU (the healthy A100)" "$A100" "$(uuid free)"
assert_eq "free: cuMemGetInfo total (MiB)" 5000 "$(probe_field free cuda_total_mib)"
kubectl -n "$E2E_NS" delete pod pinned --wait=true >&2

# --- recovery
"$bin" fake-fault --fake-gpus "$LEGACY_PROFILE" --gpu 0 --clear >&2
t1=$SECONDS
wait_until 30 "allocatable nvidia.com/gpu = 20 again" sh -c "[ \"\$(kubectl get node $NODE_NAME -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')\" = 20 ]"
took=$((SECONDS - t1))
say "ok: allocatable $(allocatable) ${took}s after the fault was cleared (3 clean checks, 2 s apart)"
[ "$took" -ge 4 ] || fail "healthy after ${took}s: the recovery window (3 checks, 2 s apart) was not kept"
wait_until 15 "the inventory annotation says the H100 is healthy" sh -c "[ \"\$(kubectl get node $NODE_NAME -o jsonpath='{.metadata.annotations.gpu\.fgpu\.dev/node-gpus}' | python3 -c 'import json,sys; print([g.get(\"healthy\", True) for g in json.load(sys.stdin) if g[\"uuid\"] == \"$H100\"][0])')\" = True ]"
wait_until 15 "a GpuHealthy Event on the Node for the H100" sh -c "kubectl get events -n default --field-selector involvedObject.kind=Node,reason=GpuHealthy -o jsonpath='{.items[*].message}' | grep -q '$H100'"
say "ok: GpuHealthy event: $(node_events GpuHealthy | grep "$H100" | tail -1)"
sleep 3 # the extender's resync
pod again 5000 "{nvidia.com/use-gpuuuid: $H100}"
wait_probe again
assert_eq "again: GPU (the H100, healthy again)" "$H100" "$(uuid again)"
say "PASS"
