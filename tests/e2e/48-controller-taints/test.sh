#!/usr/bin/env bash
# Scenario: an admin's DeviceTaintRule keeps fgpu-controller (controller mode, host process,
# with its webhooks) off the device it taints, unless the claim tolerates it; the kubelet
# plugin (fake backend, deploy/fake/e2e-node.yaml: two fake H100s) publishes both GPUs
# untainted, so the taint reaches the controller only through the rule.
#
# Asserted, with the rule (rule.yaml: gpu-0 of this node, example.com/maintenance=bios,
# NoSchedule) in place:
#   * `tolerant` (4Gi, pinned to gpu-0, tolerating the key) is allocated on gpu-0;
#   * `free` (4Gi, unpinned) is allocated on gpu-1, although binpack puts it beside
#     `tolerant` on gpu-0 without the rule;
#   * `pinned` (4Gi, pinned to gpu-0, no toleration) stays gated, unallocated, with a
#     GpuAllocationPending Event naming gpu-0 and the taint, counted as no_fit (a taint is
#     not forever), not never_fits;
# and once the rule is deleted, `pinned` is allocated on gpu-0 and runs. The controller never
# writes the rule (it is unchanged at the end of the first part).
# Needs DeviceTaintRules at resource.k8s.io/v1 (1.37); skipped elsewhere.
source "$(dirname "$0")/../lib.sh"
api="$(dra_api_version)"
[ "$api" = v1 ] || skip "Kubernetes $K8S_VERSION: resource.k8s.io/$api, not v1"
kubectl get --raw /apis/resource.k8s.io/v1 | grep -q '"name":"devicetaintrules"' \
  || skip "Kubernetes $K8S_VERSION: DeviceTaintRules not served at resource.k8s.io/v1"

source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../controller-lib.sh"
plugin_setup 48
controller_setup
slice=$PLUGIN_SLICE
RULE=fgpu-e2e-maintenance

cleanup() {
  local rc=$?
  kubectl delete devicetaintrule "$RULE" --ignore-not-found >/dev/null 2>&1 || true
  release_workloads
  controller_cleanup $rc
  classes | kubectl delete -f - --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  exit $rc
}
trap cleanup EXIT

plugin_up
assert_eq "the plugin publishes both GPUs untainted" "gpu-0 gpu-1 " \
  "$(jp "resourceslice/$slice" '{range .spec.devices[*]}{.name} {.taints[*].key}{end}' "")"
sed "s#__NODE__#$NODE_NAME#" "$E2E_DIR/rule.yaml" | kubectl apply -f - >&2
rule_version="$(kubectl get devicetaintrule "$RULE" -o jsonpath='{.metadata.resourceVersion}')"
start_controller --mode controller
register_webhooks
grep -q "serves no DeviceTaintRules" "$work/controller.log" && fail "the controller did not discover DeviceTaintRules"

docs="$work/workload.yaml"
render "$E2E_DIR/workload.yaml" >"$docs"
doc() { python3 -c 'import sys; d = open(sys.argv[1]).read().split("\n---\n"); print("\n---\n".join(d[int(i)] for i in sys.argv[2:]))' "$docs" "$@"; }
claim_of() { jp "pod/$1" '{.status.resourceClaimStatuses[0].resourceClaimName}'; }
r='{.status.allocation.devices.results[0]'
device_of() { jp "resourceclaims.resource.k8s.io/$(claim_of "$1")" "$r.device}"; }
allocated_on() { [ "$(device_of "$1")" = "$2" ]; }
ev() { kubectl -n "$E2E_NS" get events --field-selector "involvedObject.name=$1,reason=$2" -o jsonpath='{.items[*].message}' 2>/dev/null; }

# --- the tolerant claim goes where the rule points; the unpinned one goes elsewhere
t0=$SECONDS
doc 0 1 3 | kubectl apply -f - >&2
wait_until 60 "tolerant allocated on gpu-0" allocated_on tolerant gpu-0
say "ok: tolerant on gpu-0 $((SECONDS - t0))s after it was created ($(ev tolerant GpuAllocated))"
doc 4 | kubectl apply -f - >&2
wait_until 60 "free allocated" jp_nonempty "resourceclaims.resource.k8s.io/$(claim_of free)" "$r.device}"
assert_eq "free: kept off the tainted gpu-0" "gpu-1" "$(device_of free)"

# --- the pinned claim without a toleration waits, and says why
doc 2 | kubectl apply -f - >&2
wait_until 30 "Event GpuAllocationPending on pinned" sh -c "kubectl -n $E2E_NS get events --field-selector involvedObject.name=pinned,reason=GpuAllocationPending -o name | grep -q ."
msg="$(ev pinned GpuAllocationPending)"
say "event on pinned: $msg"
grep -qF "$NODE_NAME/gpu-0 (example.com/maintenance=bios:NoSchedule)" <<<"$msg" || fail "the event does not name gpu-0 and its taint: $msg"
sleep 3
assert_eq "pinned still gated" "gpu.fgpu.dev/allocate" "$(jp pod/pinned '{.spec.schedulingGates[*].name}')"
assert_eq "pinned claim not allocated" "" "$(jp "resourceclaims.resource.k8s.io/$(claim_of pinned)" '{.status.allocation}')"
pending() { curl -s "http://$CONTROLLER_METRICS_ADDR/metrics" | sed -n "s/^fgpu_controller_claims_pending{reason=\"$1\"} //p"; }
pending_is() { [ "$(pending "$1")" = "$2" ]; }
wait_until 15 "metric: one claim pending for no_fit" pending_is no_fit 1
assert_eq "metric: claims pending for never_fits" 0 "$(pending never_fits)"
assert_eq "the rule is the admin's, unchanged" "$rule_version" "$(kubectl get devicetaintrule "$RULE" -o jsonpath='{.metadata.resourceVersion}')"

# --- the rule goes: the pinned claim is allocated where it asked
t0=$SECONDS
kubectl delete devicetaintrule "$RULE" >&2
wait_until 30 "pinned allocated on gpu-0 once the rule is gone" allocated_on pinned gpu-0
say "ok: pinned on gpu-0 $((SECONDS - t0))s after the rule was deleted"
wait_until 90 "pod pinned running" jp_eq pod/pinned '{.status.phase}' Running
wait_until 15 "metric: no claim pending" pending_is no_fit 0
say "PASS: a DeviceTaintRule keeps the controller off its device unless tolerated; gone, the device is used again"
