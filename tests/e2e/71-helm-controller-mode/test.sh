#!/usr/bin/env bash
# Scenario: controller mode through the chart (`--set mode=controller`): fgpu's controller
# allocates shared claims, its gate webhook holds their pods until it has. Written for any
# DRA release (1.32+: resource.k8s.io v1beta1 on 1.32/1.33, v1 from 1.34); on this machine
# only 1.37 is built, and it runs there.
#
# Asserted: the chart renders controller mode (gate webhook with matchConditions, the shared
# class matching no device for kube-scheduler, PDB, --mode=controller); the certs Job set the
# gate's and the validator's caBundle; three pods on one fake GPU gated by the webhook in the
# controller's pod, allocated by the controller (its finalizer, its opaque grant), quotas
# enforced in the containers; a shared claim whose pod the gate never saw (the release's own
# namespace is excluded) is not allocated by kube-scheduler as a whole GPU; with the
# controller down a pod without claims is still admitted (matchConditions) and a shared-class
# pod is refused (fail closed); the claims released; helm uninstall leaves nothing.
source "$(dirname "$0")/../lib.sh"
api="$(dra_api_version)"
[ "$api" != none ] || skip "Kubernetes $K8S_VERSION: no usable DRA before 1.32"
source "$E2E_DIR/../helm-lib.sh"
source "$E2E_DIR/../controller-lib.sh"
# FGPU_E2E_71_WITHOUT_FIXES=1: a negative control. The shared class of 0e99016's
# deploy/deviceclasses.yaml (it selects every GPU) and the gate without matchConditions are put
# in place of the chart's; the two attacks below must then succeed and the scenario fail.
WITHOUT_FIXES="${FGPU_E2E_71_WITHOUT_FIXES:-0}"
attacks_won=()
attack_won() { # the protection did not hold: fatal, or recorded in the negative control
  if [ "$WITHOUT_FIXES" = 1 ]; then say "NEGATIVE CONTROL: $*"; attacks_won+=("$*"); else fail "$*"; fi
}
owned=0 state_created=0 run_created=0 devdir_created=0
work="$(mktemp -d /tmp/fgpu-e2e-71.XXXXXX)"
cleanup() {
  local rc=$?
  helm_diagnostics "$rc"
  kubectl -n "$SYS_NS" delete pod bypass --ignore-not-found --wait=true --timeout=30s >/dev/null 2>&1 || true
  helm_cleanup
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
helm_preconditions
owned=1
helm_images
helm_setup

# shellcheck disable=SC2119 # (helm_install takes extra helm arguments)
helm_install --set mode=controller
ctl="$(pod_of controller)"
assert_eq "controller args: mode" "--mode=controller" "$(kubectl -n "$SYS_NS" get pod "$ctl" -o jsonpath='{.spec.containers[0].args[1]}')"
assert_eq "gate webhook matchCondition" "has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0" \
  "$(kubectl get mutatingwebhookconfiguration fgpu-allocation-gate -o jsonpath='{.webhooks[0].matchConditions[0].expression}')"
sel_expr="$(kubectl get "deviceclasses.$api.resource.k8s.io" "shared.$DRIVER" -o jsonpath='{.spec.selectors[0].cel.expression}')"
grep -q 'allocated-by-fgpu-controller' <<<"$sel_expr" || fail "the shared class matches devices for kube-scheduler: $sel_expr"
say "ok: shared class selector for kube-scheduler: $sel_expr"
assert_eq "PDB minAvailable" 1 "$(kubectl -n "$SYS_NS" get pdb fgpu-controller -o jsonpath='{.spec.minAvailable}')"
certs_checks mutatingwebhookconfiguration/fgpu-allocation-gate validatingwebhookconfiguration/fgpu-claim-config
wait_until 60 "Lease held by $ctl" sh -c "kubectl -n $SYS_NS get lease fgpu-controller -o jsonpath='{.spec.holderIdentity}' | grep -q '^${ctl}_'"
say "ok: $ctl leads"

if [ "$WITHOUT_FIXES" = 1 ]; then
  say "NEGATIVE CONTROL: 0e99016's shared class and a gate without matchConditions"
  sed "s#^apiVersion: resource.k8s.io/v1\$#apiVersion: resource.k8s.io/$api#" "$ROOT/deploy/deviceclasses.yaml" | kubectl apply -f - >&2
  kubectl patch mutatingwebhookconfiguration fgpu-allocation-gate --type=json \
    -p '[{"op":"remove","path":"/webhooks/0/matchConditions"}]' >&2
fi

# --- three pods, gated, allocated by the controller, quotas enforced
render "$E2E_DIR/../40-controller-quota/workload.yaml" | kubectl apply -f - >&2
for p in quota-4g quota-8g quota-12g; do
  wait_until 120 "pod $p ran its probe" sh -c "kubectl -n $E2E_NS logs $p 2>/dev/null | grep -q probe_done"
done
field() { kubectl -n "$E2E_NS" logs "$1" | sed -n "s/^$2=//p"; }
claims=()
for pm in 4g:4096 8g:8192 12g:12288; do
  p="quota-${pm%:*}" mib="${pm#*:}"
  log_of controller | grep 'scheduling gate added' | grep -F "$E2E_NS/$p" >/dev/null || fail "the webhook did not gate $p"
  c="resourceclaims.$api.resource.k8s.io/$(jp "pod/$p" '{.status.resourceClaimStatuses[0].resourceClaimName}')"
  claims+=("$c")
  assert_eq "$p: device" gpu-0 "$(jp "$c" '{.status.allocation.devices.results[0].device}')"
  assert_eq "$p: the controller's finalizer" "$DRIVER/allocation" "$(jp "$c" '{.metadata.finalizers[*]}')"
  assert_eq "$p: cuMemGetInfo total (MiB)" "$mib" "$(field "$p" cuda_total_mib)"
  assert_eq "$p: allocation past the quota" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(field "$p" next_alloc_result)"
done
say "ok: three pods gated, allocated by the controller, quotas enforced"

# --- a shared claim the gate never saw: kube-scheduler must not allocate it (no whole GPU)
if [ "$api" = v1 ]; then req="exactly: {deviceClassName: shared.$DRIVER, capacity: {requests: {memory: 1Gi}}}"
else req="deviceClassName: shared.$DRIVER"; fi
kubectl apply -f - >&2 <<YAML
apiVersion: resource.k8s.io/$api
kind: ResourceClaim
metadata: {name: bypass, namespace: $SYS_NS}
spec:
  devices:
    requests:
    - name: gpu
      $req
---
apiVersion: v1
kind: Pod
metadata: {name: bypass, namespace: $SYS_NS}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  resourceClaims: [{name: gpu, resourceClaimName: bypass}]
  containers:
  - name: probe
    image: $FGPU_WORKLOAD_IMAGE
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "sleep 3600"]
    resources: {claims: [{name: gpu}]}
YAML
sleep 15
assert_eq "bypass pod (no gate): scheduling gates" "" "$(jp pod/bypass '{.spec.schedulingGates}' "$SYS_NS")"
by="$(jp "resourceclaims.$api.resource.k8s.io/bypass" '{.status.allocation.devices.results[0].device}' "$SYS_NS")"
if [ -n "$by" ]; then
  attack_won "kube-scheduler allocated the ungated shared claim itself ($by, phase $(jp pod/bypass '{.status.phase}' "$SYS_NS"))"
else
  assert_eq "bypass claim: allocated by nobody after 15 s" "" "$(jp "resourceclaims.$api.resource.k8s.io/bypass" '{.status.allocation}' "$SYS_NS")"
  assert_eq "bypass pod: not running" Pending "$(jp pod/bypass '{.status.phase}' "$SYS_NS")"
fi
kubectl -n "$SYS_NS" delete pod/bypass "resourceclaims.$api.resource.k8s.io/bypass" --wait=true --timeout=30s >&2

# --- controller down: matchConditions let claim-less pods through, shared pods fail closed
kubectl -n "$SYS_NS" scale deployment fgpu-controller --replicas=0 >&2
wait_until 60 "controller pods gone" sh -c "! kubectl -n $SYS_NS get pods -l '$(sel controller)' -o name | grep -q ."
if kubectl -n "$E2E_NS" run plain --image="$FGPU_WORKLOAD_IMAGE" --image-pull-policy=Never --restart=Never --dry-run=server -- true >"$work/plain.txt" 2>&1; then
  say "ok: controller down: a pod without resourceClaims is admitted (matchConditions)"
else
  attack_won "with the controller down a pod without claims was refused: $(cut -c1-160 "$work/plain.txt")"
fi
render "$E2E_DIR/../40-controller-quota/workload.yaml" | sed 's/name: quota-4g/name: quota-4g-down/' | python3 -c '
import sys
docs = sys.stdin.read().split("\n---\n")
print("\n---\n".join(d for d in docs if "name: quota-4g-down" in d))' >"$work/down.yaml"
msg="$(kubectl create --dry-run=server -f "$work/down.yaml" 2>&1 || true)"
grep -q 'failed calling webhook "allocation-gate' <<<"$msg" || fail "with the controller down a shared-class pod was admitted: $msg"
say "ok: controller down: a shared-class pod is refused (fail closed): $(cut -c1-140 <<<"$msg")"
kubectl -n "$SYS_NS" scale deployment fgpu-controller --replicas=1 >&2
kubectl -n "$SYS_NS" rollout status deployment/fgpu-controller --timeout=120s >&2

# --- release, uninstall
kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >&2
for c in "${claims[@]}"; do
  wait_until 90 "claim $c released and deleted" sh -c "! kubectl -n $E2E_NS get $c"
done
say "ok: claims released by the controller and deleted"
helm uninstall "$RELEASE" -n "$SYS_NS" --wait --timeout 120s >&2 || fail "helm uninstall failed"
# The release's pods go by garbage collection after their owners; on 1.32 that can take
# seconds after `helm uninstall --wait` returns (they show Completed meanwhile).
wait_until 60 "the release's pods gone" sh -c "! kubectl -n $SYS_NS get pods -l app.kubernetes.io/instance=$RELEASE -o name | grep -q ."
wait_until 60 "the driver's ResourceSlice removed" sh -c "! kubectl get resourceslice $NODE_NAME-$DRIVER"
assert_eq "objects of the release left after helm uninstall" "" "$(helm_leftovers)"
kubectl delete namespace "$SYS_NS" --wait=true --timeout=60s >&2
[ ${#attacks_won[@]} -eq 0 ] || fail "negative control: ${#attacks_won[@]} protections did not hold without the fixes"
say "ok: controller mode through the chart on Kubernetes $K8S_VERSION"
