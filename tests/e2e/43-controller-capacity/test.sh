#!/usr/bin/env bash
# Scenario: --mode auto on a cluster with consumable capacity (1.36+) picks capacity:
# kube-scheduler allocates, the controller stays out of the way.
#
# Asserted: the controller logs and exports mode capacity with its reason (the plugin's
# devices kept allowMultipleAllocations); the mutating webhook (registered) adds no gate; a
# 4Gi claim is allocated by kube-scheduler (consumedCapacity, shareID, no controller
# finalizer) and the container sees 4096 MiB. Skipped below 1.36 (no consumable capacity by
# default: auto picks controller there, which 41-controller-failover covers).
source "$(dirname "$0")/../lib.sh"
[ "$(dra_api_version)" != none ] || skip "Kubernetes $K8S_VERSION: no DRA (resource.k8s.io)"
[ "$K8S_MINOR" -ge 36 ] || skip "Kubernetes $K8S_VERSION: no consumable capacity by default before 1.36, auto picks controller (see 41-controller-failover)"

source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../controller-lib.sh"
plugin_setup 43
controller_setup
slice=$PLUGIN_SLICE

cleanup() {
  local rc=$?
  delete_tmpl "$E2E_DIR/workload.yaml"
  kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  controller_cleanup $rc
  kubectl delete -f "$E2E_DIR/../../../deploy/deviceclasses.yaml" --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  exit $rc
}
trap cleanup EXIT

kubectl apply -f "$E2E_DIR/../../../deploy/deviceclasses.yaml" >&2
start_plugin
wait_registered 1
wait_until 30 "ResourceSlice $slice published" kubectl get resourceslice "$slice"
[ "$(jp "resourceslice/$slice" '{.spec.devices[0].allowMultipleAllocations}' "")" = true ] \
  || skip "the API server dropped allowMultipleAllocations (DRAConsumableCapacity off)"
start_controller --mode auto
register_webhooks
wait_until 15 "the controller picked its mode" grep -q "allocation mode" "$work/controller.log"
grep -q 'allocation mode mode="capacity" reason="auto: this driver'"'"'s devices kept allowMultipleAllocations' "$work/controller.log" \
  || fail "auto did not pick capacity: $(grep 'allocation mode' "$work/controller.log")"
say "ok: $(grep -o 'allocation mode.*' "$work/controller.log" | head -1)"
# Read the whole page first: `curl | grep -q` under pipefail fails when grep exits early and
# curl dies of SIGPIPE on the rest of the page.
m="$(curl -s "http://$CONTROLLER_METRICS_ADDR/metrics")"
grep -q '^fgpu_controller_mode_info{mode="capacity",' <<<"$m" || fail "mode_info is not capacity: $(echo "$m" | grep mode_info)"

apply_tmpl "$E2E_DIR/workload.yaml"
wait_until 120 "pod cap-4g ran its probe" sh -c "kubectl -n $E2E_NS logs cap-4g 2>/dev/null | grep -q probe_done"
! grep -q "scheduling gate added" "$work/controller.log" || fail "the webhook gated a pod in capacity mode"
say "ok: no gate in capacity mode"
c="resourceclaims.resource.k8s.io/$(jp pod/cap-4g '{.status.resourceClaimStatuses[0].resourceClaimName}')"
r='{.status.allocation.devices.results[0]'
assert_eq "consumedCapacity.memory (kube-scheduler)" 4Gi "$(jp "$c" "$r.consumedCapacity.memory}")"
jp_nonempty "$c" "$r.shareID}" || fail "no shareID"
assert_eq "finalizers (the scheduler's only)" "resource.kubernetes.io/delete-protection" "$(jp "$c" '{.metadata.finalizers[*]}')"
! grep -q "allocated on" "$work/controller.log" || fail "the controller allocated in capacity mode"
assert_eq "cap-4g cuMemGetInfo total (MiB)" 4096 "$(kubectl -n "$E2E_NS" logs cap-4g | sed -n 's/^cuda_total_mib=//p')"
