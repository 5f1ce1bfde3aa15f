#!/usr/bin/env bash
# Scenario: GPU health on the real control plane. The plugin runs as a host process
# (30-dra-quota/plugin.sh) on a copy of deploy/fake/e2e-node.yaml (two fake H100s), checking
# health every second, healthy again after 3 clean checks. A fault is injected with
# `fgpu-kubelet-plugin fake-fault` (a file beside the profile that the fake backend reads).
#
# Asserted: a pod on gpu-1 (CEL pin) runs; XID 79 on gpu-1 -> within 5 s the slice carries
# the taint fgpu.dev/unhealthy=xid-79:NoExecute on gpu-1 (gpu-0 untainted), a GpuUnhealthy
# Event on the Node, the transitions metric; the kubelet shows the device Unhealthy in the
# pod's status (allocatedResourcesStatus, ResourceHealthStatus: beta, on in 1.36+); the pod
# tolerates the taint for 20 s (tolerationSeconds) and is then evicted by the
# controller-manager's device-taint eviction; three new claims all land on gpu-0. Clearing
# the fault -> the taint is gone after the recovery window, a GpuHealthy Event, and a new
# pinned claim lands on gpu-1 and runs.
source "$(dirname "$0")/../lib.sh"
[ "$K8S_MINOR" -ge 36 ] || skip "Kubernetes $K8S_VERSION: device taints and consumable capacity are not on by default before 1.36"

source "$E2E_DIR/../plugin-lib.sh"
ROOT="$(cd "$E2E_DIR/../../.." && pwd)"
plugin_setup 34
slice="resourceslice/$PLUGIN_SLICE"
bin="$work/bin/fgpu-kubelet-plugin"

cleanup() {
  local rc=$?
  delete_tmpl "$E2E_DIR/workload.yaml"
  kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl delete -f "$E2E_DIR/../../../deploy/deviceclasses.yaml" --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  exit $rc
}
trap cleanup EXIT

# device_of <pod>: the device its claim was allocated.
device_of() {
  local claim
  claim="$(jp "pod/$1" '{.status.resourceClaimStatuses[0].resourceClaimName}')"
  [ -n "$claim" ] && jp "resourceclaim/$claim" '{.status.allocation.devices.results[0].device}'
}
taints() { jp "$slice" "{range .spec.devices[?(@.name==\"$1\")].taints[*]}{.key}={.value}:{.effect}{end}" ""; }
node_events() {
  kubectl get events -n default --field-selector "involvedObject.kind=Node,involvedObject.name=$NODE_NAME,reason=$1" \
    -o 'jsonpath={range .items[*]}{.message}{"\n"}{end}' 2>/dev/null
}

cp "$ROOT/deploy/fake/e2e-node.yaml" "$work/node.yaml"
export FGPU_E2E_FAKE_GPUS="$work/node.yaml"
export FGPU_E2E_PLUGIN_ARGS="--health-seconds 1 --health-recovery-checks 3"
kubectl apply -f "$ROOT/deploy/deviceclasses.yaml" >&2
start_plugin
wait_registered 1
wait_until 30 "ResourceSlice $PLUGIN_SLICE published" kubectl get "$slice"
[ "$(jp "$slice" '{.spec.devices[0].allowMultipleAllocations}' "")" = true ] \
  || skip "the API server dropped allowMultipleAllocations (DRAConsumableCapacity off)"
assert_eq "slice devices before the fault" "gpu-0 gpu-1" "$(jp "$slice" '{.spec.devices[*].name}' "")"
assert_eq "no taints before the fault" "" "$(taints gpu-0)$(taints gpu-1)"

# --- a pod on gpu-1, tolerating the taint for 20 s
apply_tmpl "$E2E_DIR/workload.yaml"
probe_pod victim template/on-gpu-1
wait_until 90 "pod victim running" jp_eq pod/victim '{.status.phase}' Running
assert_eq "victim's device" gpu-1 "$(device_of victim)"

# --- XID 79 on gpu-1
"$bin" fake-fault --fake-gpus "$work/node.yaml" --gpu 1 xid 79 >&2 || fail "fake-fault refused"
t0=$SECONDS
wait_until 10 "gpu-1 tainted in the slice" sh -c "[ -n \"\$(kubectl get $slice -o jsonpath='{.spec.devices[?(@.name==\"gpu-1\")].taints}')\" ]"
took=$((SECONDS - t0))
say "ok: taint in the slice ${took}s after the fault"
[ "$took" -le 5 ] || fail "the taint took ${took}s (want <= 5s)"
assert_eq "gpu-1's taint" "fgpu.dev/unhealthy=xid-79:NoExecute" "$(taints gpu-1)"
assert_eq "gpu-0 untainted" "" "$(taints gpu-0)"
wait_until 15 "a GpuUnhealthy Event on the Node" sh -c "kubectl get events -n default --field-selector involvedObject.kind=Node,reason=GpuUnhealthy -o name | grep -q ."
node_events GpuUnhealthy | grep -q "GPU-e2e00000-0000-4000-8000-000000000001: unhealthy (fatal): XID 79" \
  || fail "GpuUnhealthy event: $(node_events GpuUnhealthy)"
say "ok: GpuUnhealthy event: $(node_events GpuUnhealthy | tail -1)"
metrics="$(curl -fsS "http://${FGPU_E2E_METRICS:-127.0.0.1:19400}/metrics")" || fail "cannot scrape the plugin"
grep -q '^fgpu_kubelet_plugin_gpu_health_transitions_total{gpu_uuid="GPU-e2e00000-0000-4000-8000-000000000001",to="fatal"} 1$' <<<"$metrics" \
  || fail "transitions metric: $(grep health_transitions <<<"$metrics")"
grep -q '^fgpu_kubelet_plugin_gpu_healthy{gpu_uuid="GPU-e2e00000-0000-4000-8000-000000000001",gpu_index="1"} 0$' <<<"$metrics" \
  || fail "gpu_healthy metric: $(grep gpu_healthy <<<"$metrics")"
say "ok: metrics gpu_healthy 0 and gpu_health_transitions_total{to=fatal} 1"

# --- the kubelet's view in the pod's status (DRAResourceHealth stream)
health_json() { jp pod/victim '{.status.containerStatuses[0].allocatedResourcesStatus}'; }
wait_until 20 "the victim's status shows its device Unhealthy" sh -c "kubectl -n $E2E_NS get pod victim -o jsonpath='{.status.containerStatuses[0].allocatedResourcesStatus}' | grep -q '\"health\":\"Unhealthy\"'"
say "ok: allocatedResourcesStatus: $(health_json)"
# The kubelet names a shared device <driver>/<claim uid>-<device>-<share id>.
grep -q -- '-gpu-1-' <<<"$(health_json)" || fail "resource id of gpu-1 not in $(health_json)"

# --- new claims avoid gpu-1
for i in 0 1 2; do probe_pod "after-$i" template/any-gpu; done
for i in 0 1 2; do
  wait_until 60 "pod after-$i running" jp_eq "pod/after-$i" '{.status.phase}' Running
  assert_eq "after-$i's device" gpu-0 "$(device_of "after-$i")"
done

# --- NoExecute: evicted after its 20 s toleration
wait_until 60 "the victim evicted (NoExecute after tolerationSeconds)" sh -c \
  "! kubectl -n $E2E_NS get pod victim -o jsonpath='{.metadata.deletionTimestamp}{.status.phase}' 2>/dev/null | grep -qx Running"
say "ok: victim evicted $((SECONDS - t0))s after the fault"
[ $((SECONDS - t0)) -ge 18 ] || fail "evicted before its tolerationSeconds (20 s)"

# --- recovery
"$bin" fake-fault --fake-gpus "$work/node.yaml" --gpu 1 --clear >&2
t1=$SECONDS
wait_until 15 "gpu-1 untainted after the recovery window" sh -c "[ -z \"\$(kubectl get $slice -o jsonpath='{.spec.devices[?(@.name==\"gpu-1\")].taints}')\" ]"
took=$((SECONDS - t1))
say "ok: untainted ${took}s after the fault was cleared (3 clean checks, 1 s apart)"
[ "$took" -ge 2 ] || fail "untainted after ${took}s: the recovery window (3 checks) was not kept"
wait_until 15 "a GpuHealthy Event on the Node" sh -c "kubectl get events -n default --field-selector involvedObject.kind=Node,reason=GpuHealthy -o name | grep -q ."
kubectl -n "$E2E_NS" delete pod victim --wait=true --timeout=30s >/dev/null 2>&1 || true
probe_pod again template/on-gpu-1
wait_until 90 "pod again running" jp_eq pod/again '{.status.phase}' Running
assert_eq "again's device (gpu-1 usable again)" gpu-1 "$(device_of again)"
say "PASS"
