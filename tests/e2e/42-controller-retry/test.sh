#!/usr/bin/env bash
# Scenario: kube-scheduler clears an allocation the controller wrote, and the controller
# allocates again on another node. A ResourceSlice for a node that does not exist
# (ghost-node, one 200Gi GPU, otherwise a copy of the plugin's slice) lures the controller
# (pod policy spread: the emptiest node); kube-scheduler finds the claim unavailable on the
# only real node and clears the allocation (its PostFilter, reference dra.md §4). The shared
# DeviceClass matches no device for kube-scheduler (see classes below), so only the
# controller allocates the claim again.
#
# Asserted: the controller notices (log and Event AllocationCleared on the claim, naming
# ghost-node), backs off, allocates again away from ghost-node (on the real node's GPU), and
# the pod runs with its 8 GiB quota. Runs on every release with DRA (1.32+).
source "$(dirname "$0")/../lib.sh"
api="$(dra_api_version)"
[ "$api" != none ] || skip "Kubernetes $K8S_VERSION: no DRA (resource.k8s.io) to allocate"

source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../controller-lib.sh"
plugin_setup 42
controller_setup
slice=$PLUGIN_SLICE
# The shared class as controller mode wants it where kube-scheduler cannot share: a selector
# no device matches, so that the scheduler never allocates a shared claim itself (it would
# take a whole device, racing the controller's retry after it cleared an allocation). The
# controller does not evaluate class selectors.
classes() { shipped_classes | python3 "$E2E_LIB_DIR/../../hack/deviceclasses.py" controller-mode; }
ghost="ghost-node-gpu.fgpu.dev"

cleanup() {
  local rc=$?
  release_workloads
  kubectl delete resourceslice "$ghost" --ignore-not-found >/dev/null 2>&1 || true
  controller_cleanup $rc
  classes | kubectl delete -f - --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  exit $rc
}
trap cleanup EXIT

plugin_up
# The ghost: the plugin's slice for a node that does not exist, one GPU of 200Gi.
kubectl get resourceslice "$slice" -o json | python3 -c '
import json, sys
s = json.load(sys.stdin)
for k in ("uid", "resourceVersion", "creationTimestamp", "generation", "ownerReferences", "managedFields"):
    s["metadata"].pop(k, None)
s["metadata"]["name"] = sys.argv[1]
s["spec"]["nodeName"] = "ghost-node"
s["spec"]["pool"] = {"name": "ghost-node", "generation": 1, "resourceSliceCount": 1}
d = s["spec"]["devices"][0]
body = d.get("basic", d)
body["capacity"]["memory"]["value"] = "200Gi"
body["attributes"]["uuid"] = {"string": "GPU-ghost000-0000-4000-8000-000000000000"}
s["spec"]["devices"] = [d]
print(json.dumps(s))' "$ghost" | kubectl create -f - >&2
start_controller --mode controller

render "$E2E_DIR/workload.yaml" | kubectl apply -f - >&2
t0=$SECONDS
wait_until 60 "the controller saw the allocation on ghost-node cleared" grep -q "allocation on node ghost-node was cleared" "$work/controller.log"
say "ok: $(grep -o 'the allocation on node ghost-node was cleared.*' "$work/controller.log" | head -1)"
wait_until 120 "pod retry-8g ran its probe" sh -c "kubectl -n $E2E_NS logs retry-8g 2>/dev/null | grep -q probe_done"
say "retry-8g ran $((SECONDS - t0))s after it was created"
c="resourceclaims.resource.k8s.io/$(jp pod/retry-8g '{.status.resourceClaimStatuses[0].resourceClaimName}')"
r='{.status.allocation.devices.results[0]'
assert_eq "claim allocated again on the real node" "$NODE_NAME" "$(jp "$c" "$r.pool}")"
assert_eq "retry-8g cuMemGetInfo total (MiB)" 8192 "$(kubectl -n "$E2E_NS" logs retry-8g | sed -n 's/^cuda_total_mib=//p')"
ev="$(kubectl -n "$E2E_NS" get events --field-selector "involvedObject.name=${c#*/},reason=AllocationCleared" -o jsonpath='{.items[*].message}')"
grep -q "ghost-node" <<<"$ev" || fail "no AllocationCleared event naming ghost-node on the claim: '$ev'"
say "ok: event AllocationCleared: $ev"
