#!/usr/bin/env bash
# Scenario: fgpu-controller in controller mode against the real API server, scheduler,
# kubelet and containerd, with fgpu's kubelet plugin (fake backend, deploy/fake/e2e-node.yaml:
# two fake H100s, 81559Mi each) and the admission webhooks (deploy/controller/webhooks.yaml,
# registered with clientConfig.url on 127.0.0.1 and a CA made by hack/webhook-certs.sh).
#
# Asserted:
# * the validating webhook denies malformed GpuShareConfigs (the api crate's bad-input
#   cases) with the field path, for claims and templates, and warns on a shared-class claim
#   without memory; it denies a share of 0 bytes and priority: high in the shared class (which does not set
#   allowHighPriority) and a claim that sets allowHighPriority, and admits priority: high
#   in a class that allows it;
# * three pods (4, 8, 12 GiB, pinned to gpu-0) are gated by the mutating webhook, allocated
#   by the controller on gpu-0 (finalizer gpu.fgpu.dev/allocation, the grant as opaque config;
#   consumedCapacity + shareID where the cluster has consumable capacity), ungated, scheduled,
#   prepared by the plugin, and each container sees its quota;
# * a fourth (60 GiB) does not fit: it stays gated with an Event saying why and naming the
#   best candidate; deleting the 12 GiB pod releases its claim (finalizer removed) and the
#   fourth is allocated and runs with 60 GiB; claims_pending{reason="no_fit"} is 1 while it
#   waits, 0 after;
# * the default policy fragaware: the first allocation's Event says it fell back to binpack
#   (no workload model yet), the fourth's does not (the model holds the first three).
# Runs on every release with DRA (1.32+: resource.k8s.io v1 or v1beta1); skipped on 1.31.
source "$(dirname "$0")/../lib.sh"
api="$(dra_api_version)"
[ "$api" != none ] || skip "Kubernetes $K8S_VERSION: no DRA (resource.k8s.io) to allocate"

source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../controller-lib.sh"
plugin_setup 40
controller_setup
driver=$PLUGIN_DRIVER
slice=$PLUGIN_SLICE

cleanup() {
  local rc=$?
  release_workloads
  controller_cleanup $rc
  classes | kubectl delete -f - --ignore-not-found >/dev/null 2>&1 || true
  kubectl delete deviceclass high.gpu.fgpu.dev --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  exit $rc
}
trap cleanup EXIT

plugin_up
consumable="$(jp "resourceslice/$slice" '{.spec.devices[0].allowMultipleAllocations}' "")"
say "Kubernetes $K8S_VERSION, resource.k8s.io/$api, consumable capacity: ${consumable:-false}"
start_controller --mode controller
register_webhooks

# --- validating webhook
t0=$SECONDS
bad="$work/bad.yaml"
render "$E2E_DIR/bad-configs.yaml" >"$bad"
deny() { # deny <doc index> <expected field path>
  local out
  out="$(python3 -c 'import sys; print(open(sys.argv[1]).read().split("\n---\n")[int(sys.argv[2])])' "$bad" "$1" \
    | kubectl create --dry-run=server -f - 2>&1)" && return 1
  grep -qF "$2" <<<"$out" || { say "denied, but not naming $2: $out"; return 1; }
  say "ok: denied: $(echo "$out" | grep -oF "$2" | head -1)… ($(echo "$out" | sed 's/.*denied the request: //' | cut -c1-140))"
}
wait_until 30 "the validating webhook is called" sh -c "python3 -c 'import sys; print(open(sys.argv[1]).read().split(\"\n---\n\")[0])' $bad | kubectl create --dry-run=server -f - 2>&1 | grep -q 'denied the request'"
deny 0 "ResourceClaim $E2E_NS/bad-cores: spec.devices.config[0].opaque.parameters.cores:" || fail "cores 140 not denied with its path"
deny 1 "ResourceClaim $E2E_NS/bad-field: spec.devices.config[0].opaque.parameters.memroy:" || fail "unknown field not denied with its path"
deny 2 "ResourceClaimTemplate $E2E_NS/bad-version: spec.spec.devices.config[0].opaque.parameters.apiVersion:" || fail "bad apiVersion in a template not denied with its path"
deny 3 "ResourceClaim $E2E_NS/bad-memory: spec.devices.config[0].opaque.parameters.memory:" || fail "bad memory not denied with its path"
deny 4 "ResourceClaim $E2E_NS/bad-high: spec.devices.config[0].opaque.parameters.priority: \"high\" is not allowed for request \"gpu\": DeviceClass shared.gpu.fgpu.dev does not set allowHighPriority" \
  || fail "priority high in the shared class not denied with its path"
deny 5 "ResourceClaim $E2E_NS/bad-allow: spec.devices.config[0].opaque.parameters.allowHighPriority: may be set only in a DeviceClass" \
  || fail "allowHighPriority in a claim not denied with its path"
deny 6 "ResourceClaim $E2E_NS/bad-zero: spec.devices.config[0].opaque.parameters.memory: \"0\" grants no device memory" \
  || fail "a share of 0 bytes not denied with its path"
# A class that allows high priority (the admin's decision): the same claim in it is admitted.
kubectl apply -f - >&2 <<YAML
apiVersion: resource.k8s.io/$api
kind: DeviceClass
metadata: {name: high.gpu.fgpu.dev}
spec:
  selectors: [{cel: {expression: 'device.driver == "gpu.fgpu.dev"'}}]
  config:
  - opaque:
      driver: gpu.fgpu.dev
      parameters: {apiVersion: gpu.fgpu.dev/v1alpha1, kind: GpuShareConfig, allowHighPriority: true}
YAML
out="$(python3 -c 'import sys; print(open(sys.argv[1]).read().split("\n---\n")[4])' "$bad" \
  | sed 's/shared\.gpu\.fgpu\.dev/high.gpu.fgpu.dev/' | kubectl create --dry-run=server -f - 2>&1)" \
  || fail "priority high in a class with allowHighPriority refused: $out"
say "ok: admitted in high.gpu.fgpu.dev (allowHighPriority: true): $out"
kubectl delete deviceclass high.gpu.fgpu.dev --ignore-not-found >&2
warn="$(render "$E2E_DIR/no-memory.yaml" | kubectl create --dry-run=server -f - 2>&1)" || fail "claim without memory refused: $warn"
grep -q "Warning: .*asks for no memory" <<<"$warn" || fail "no warning for a claim without memory: $warn"
say "ok: warned: $(echo "$warn" | grep -o 'Warning: .*' | cut -c1-120)…"
say "validating webhook checked in $((SECONDS - t0))s"

# --- three pods share gpu-0 through the controller
t0=$SECONDS
render "$E2E_DIR/workload.yaml" | kubectl apply -f - >&2
for p in quota-4g quota-8g quota-12g; do
  wait_until 120 "pod $p ran its probe" sh -c "kubectl -n $E2E_NS logs $p 2>/dev/null | grep -q probe_done"
done
say "three probes done $((SECONDS - t0))s after the pods were created"
for p in quota-4g quota-8g quota-12g; do
  grep -q "pod=$E2E_NS/$p.*scheduling gate added\|scheduling gate added.*pod=$E2E_NS/$p" "$work/controller.log" \
    || fail "the mutating webhook did not gate $p"
done
say "ok: the webhook gated the three pods"
field() { kubectl -n "$E2E_NS" logs "$1" | sed -n "s/^$2=//p"; }
claim_of() { jp "pod/$1" '{.status.resourceClaimStatuses[0].resourceClaimName}'; }
r='{.status.allocation.devices.results[0]'
for pm in 4g:4096 8g:8192 12g:12288; do
  p="quota-${pm%:*}" mib="${pm#*:}"
  c="resourceclaims.resource.k8s.io/$(claim_of "$p")"
  assert_eq "$p claim: driver/pool/device" "$driver/$NODE_NAME/gpu-0" "$(jp "$c" "$r.driver}/$r.pool}/$r.device}")"
  assert_eq "$p claim: finalizer" "gpu.fgpu.dev/allocation" "$(jp "$c" '{.metadata.finalizers[*]}')"
  assert_eq "$p claim: reserved for the pod" "$p" "$(jp "$c" '{.status.reservedFor[0].name}')"
  grant="$(jp "$c" '{.status.allocation.devices.config[-1:].opaque.parameters.memory}')"
  assert_eq "$p claim: granted memory (opaque config)" "${p#quota-}" "${grant/%Gi/g}"
  if [ "$consumable" = true ]; then
    jp_nonempty "$c" "$r.shareID}" || fail "$p: no shareID with consumable capacity"
    assert_eq "$p claim: consumedCapacity.memory" "${p#quota-}" "$(jp "$c" "$r.consumedCapacity.memory}" | sed 's/Gi$/g/')"
  fi
  assert_eq "$p cuMemGetInfo total (MiB)" "$mib" "$(field "$p" cuda_total_mib)"
  assert_eq "$p allocated before refusal (MiB)" "$mib" "$(field "$p" allocated_mib)"
  assert_eq "$p allocation past the quota" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(field "$p" next_alloc_result)"
done
ev() { kubectl -n "$E2E_NS" get events --field-selector "involvedObject.name=$1,reason=$2" -o jsonpath='{.items[*].message}' 2>/dev/null; }
say "event on quota-4g: $(ev quota-4g GpuAllocated)"
ev quota-4g GpuAllocated | grep -q "allocated on $NODE_NAME: gpu-0 (4Gi" || fail "no GpuAllocated event on quota-4g"
# The controller's default policy is fragaware; it started with no claim holding a GPU, so
# the first allocation had no workload model and says it fell back to binpack.
fell_back="policy fragaware has no workload model yet"
(for p in quota-4g quota-8g quota-12g; do ev "$p" GpuAllocated; done) | grep -q "$fell_back" \
  || fail "no GpuAllocated event says fragaware fell back without a workload model"
say "ok: the first allocation says fragaware fell back to binpack (no workload model yet)"

# --- a fourth pod does not fit: gated, with an Event saying why
render "$E2E_DIR/big.yaml" | kubectl apply -f - >&2
wait_until 30 "Event GpuAllocationPending on quota-60g" sh -c "kubectl -n $E2E_NS get events --field-selector involvedObject.name=quota-60g,reason=GpuAllocationPending -o name | grep -q ."
msg="$(ev quota-60g GpuAllocationPending)"
say "event on quota-60g: $msg"
grep -q "no GPU has 60Gi" <<<"$msg" || fail "the event does not say what is missing: $msg"
grep -q "best candidate $NODE_NAME/gpu-0" <<<"$msg" || fail "the event does not name the best candidate: $msg"
sleep 3
assert_eq "quota-60g still gated" "gpu.fgpu.dev/allocate" "$(jp pod/quota-60g '{.spec.schedulingGates[*].name}')"
assert_eq "quota-60g claim not allocated" "" "$(jp "resourceclaims.resource.k8s.io/$(claim_of quota-60g)" '{.status.allocation}')"
# The controller's pending claims by reason: this one fits no GPU now (but would on an empty one).
pending() { curl -s "http://$CONTROLLER_METRICS_ADDR/metrics" | sed -n "s/^fgpu_controller_claims_pending{reason=\"$1\"} //p"; }
pending_is() { [ "$(pending "$1")" = "$2" ]; }
wait_until 15 "metric: one claim pending for no_fit" pending_is no_fit 1
assert_eq "metric: claims pending for never_fits" 0 "$(pending never_fits)"

# --- deleting one pod lets it run
c12="$(claim_of quota-12g)"
t0=$SECONDS
kubectl -n "$E2E_NS" delete pod quota-12g --wait=false >&2
wait_until 90 "pod quota-60g ran its probe" sh -c "kubectl -n $E2E_NS logs quota-60g 2>/dev/null | grep -q probe_done"
say "quota-60g ran $((SECONDS - t0))s after quota-12g was deleted"
wait_until 30 "quota-12g's claim released and deleted" sh -c "! kubectl -n $E2E_NS get resourceclaim $c12"
grep -q "released: .*claim=$E2E_NS/$c12" "$work/controller.log" || fail "the controller did not log releasing $c12"
say "ok: $(grep -o "released: .*claim=$E2E_NS/$c12.*" "$work/controller.log" | head -1)"
assert_eq "quota-60g claim: device" "gpu-0" "$(jp "resourceclaims.resource.k8s.io/$(claim_of quota-60g)" "$r.device}")"
# By then the model holds the three claims: fragaware ran without falling back.
msg60="$(ev quota-60g GpuAllocated)"
grep -q "allocated on $NODE_NAME: gpu-0 (60Gi" <<<"$msg60" || fail "no GpuAllocated event on quota-60g: $msg60"
if grep -q "$fell_back" <<<"$msg60"; then fail "quota-60g was placed without the workload model: $msg60"; fi
say "ok: quota-60g placed by fragaware with the model of the claims seen"
assert_eq "quota-60g cuMemGetInfo total (MiB)" 61440 "$(field quota-60g cuda_total_mib)"
m="$(curl -s "http://$CONTROLLER_METRICS_ADDR/metrics")"
say "metrics: $(echo "$m" | grep -E '^fgpu_controller_(claims_allocated_total|mode_info)' | tr '\n' ' ')"
grep -q '^fgpu_controller_claims_allocated_total 4$' <<<"$m" || fail "claims_allocated_total is not 4"
wait_until 15 "metric: no claim pending once quota-60g is allocated" pending_is no_fit 0
grep -q '^fgpu_controller_mode_info{mode="controller",reason="set by --mode"} 1$' <<<"$m" || fail "mode_info does not say controller"
# 4 + 8 + 60 GiB granted on gpu-0 once quota-12g's claim is gone; the per-GPU families name a
# GPU by the slice device's uuid (gpu_uuid, as the plugin's do), not by its device name
uuid0="$(kubectl get resourceslices -o json | python3 -c '
import json, sys
for s in json.load(sys.stdin)["items"]:
    if s["spec"].get("driver") != "gpu.fgpu.dev" or s["spec"].get("nodeName") != sys.argv[1]:
        continue
    for d in s["spec"].get("devices", []):
        if d["name"] == "gpu-0":
            print(d.get("basic", d)["attributes"]["uuid"]["string"])
' "$NODE_NAME")"
[ -n "$uuid0" ] || fail "no uuid attribute for gpu-0 in $NODE_NAME's ResourceSlice"
granted() { curl -s "http://$CONTROLLER_METRICS_ADDR/metrics" | sed -n "s/^fgpu_controller_gpu_granted_memory_bytes{node=\"$NODE_NAME\",gpu_uuid=\"$uuid0\",gpu_index=\"[0-9]*\"} //p"; }
granted_is() { [ "$(granted)" = "$1" ]; }
wait_until 15 "metric: 72Gi granted on gpu-0" granted_is 77309411328
assert_eq "metric: granted memory on gpu-0" 77309411328 "$(granted)"
say "controller resident memory: $(awk '/^VmRSS/ {print $2 " " $3}' "/proc/$controller_pid/status" 2>/dev/null || echo unknown) (debug build, this cluster: 1 node, 2 GPUs)"
