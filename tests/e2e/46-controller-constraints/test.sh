#!/usr/bin/env bash
# Scenario: claim semantics in controller mode (fgpu-controller as a host process with its
# webhooks; the kubelet plugin with node.yaml: four fake GPUs, NUMA node 0 = gpu-0 H100 +
# gpu-3 A100, NUMA node 1 = gpu-1 + gpu-2 H100). Asserted:
#   * `pair` (two requests of 4Gi, a CEL selector on H100, matchAttribute
#     gpu.fgpu.dev/numaNode over both) gets gpu-1 and gpu-2 (NUMA node 1; binpack alone
#     would start on gpu-0), and its pod runs;
#   * `a100` (CEL on productName and on the memory quantity) gets gpu-3;
#   * `fallback` (firstAvailable: 200Gi, then 2Gi) is allocated as request gpu/small;
#   * `bad-cel` (a selector reading a missing attribute) stays gated with a
#     GpuClaimRejected Event naming spec.devices.requests[0].exactly.selectors[0].cel.expression;
#   * `distinct` (distinctAttribute) stays gated with an Event naming
#     spec.devices.constraints[0].distinctAttribute.
# Needs resource.k8s.io/v1 (1.34+: firstAvailable and the v1 shape); skipped elsewhere.
source "$(dirname "$0")/../lib.sh"
api="$(dra_api_version)"
[ "$api" = v1 ] || skip "Kubernetes $K8S_VERSION: resource.k8s.io/$api, not v1"

source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../controller-lib.sh"
plugin_setup 46
controller_setup
export FGPU_E2E_FAKE_GPUS="$E2E_DIR/node.yaml"
mkdir -p /run/fgpu-e2e/dev
for n in nvidia2 nvidia3; do
  [ -c "/run/fgpu-e2e/dev/$n" ] || mknod -m 0666 "/run/fgpu-e2e/dev/$n" c 1 3
done

cleanup() {
  local rc=$?
  release_workloads
  controller_cleanup $rc
  classes | kubectl delete -f - --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  exit $rc
}
trap cleanup EXIT

plugin_up
assert_eq "the plugin publishes four GPUs" "gpu-0 gpu-1 gpu-2 gpu-3" \
  "$(jp "resourceslice/$PLUGIN_SLICE" '{.spec.devices[*].name}' "")"
start_controller --mode controller
register_webhooks

docs="$work/workload.yaml"
render "$E2E_DIR/workload.yaml" >"$docs"
kubectl apply -f "$docs" >&2
claim_of() { jp "pod/$1" '{.status.resourceClaimStatuses[0].resourceClaimName}'; }
results() { jp "resourceclaims.resource.k8s.io/$(claim_of "$1")" '{range .status.allocation.devices.results[*]}{.request}={.device} {end}'; }
allocated() { [ -n "$(results "$1")" ]; }
ev() { kubectl -n "$E2E_NS" get events --field-selector "involvedObject.name=$1,reason=$2" -o jsonpath='{.items[*].message}' 2>/dev/null; }
has_event() { [ -n "$(ev "$1" "$2")" ]; }

wait_until 60 "pair allocated" allocated pair
assert_eq "pair: both H100s of NUMA node 1" "a=gpu-1 b=gpu-2 " "$(results pair)"
wait_until 60 "a100 allocated" allocated a100
assert_eq "a100: the A100" "gpu=gpu-3 " "$(results a100)"
wait_until 60 "fallback allocated" allocated fallback
case "$(results fallback)" in gpu/small=gpu-*) ;; *) fail "fallback: $(results fallback), want gpu/small" ;; esac
say "ok: pair $(results pair), a100 $(results a100), fallback $(results fallback)"

wait_until 30 "Event GpuClaimRejected on bad-cel" has_event bad-cel GpuClaimRejected
msg="$(ev bad-cel GpuClaimRejected)"
say "event on bad-cel: $msg"
grep -qF "spec.devices.requests[0].exactly.selectors[0].cel.expression" <<<"$msg" || fail "the event does not name the selector: $msg"
wait_until 30 "Event GpuClaimRejected on distinct" has_event distinct GpuClaimRejected
msg="$(ev distinct GpuClaimRejected)"
say "event on distinct: $msg"
grep -qF "spec.devices.constraints[0].distinctAttribute" <<<"$msg" || fail "the event does not name distinctAttribute: $msg"
for p in bad-cel distinct; do
  assert_eq "$p still gated" "gpu.fgpu.dev/allocate" "$(jp "pod/$p" '{.spec.schedulingGates[*].name}')"
  assert_eq "$p not allocated" "" "$(results "$p")"
done

wait_until 90 "pod pair running" jp_eq pod/pair '{.status.phase}' Running
say "PASS: constraints, CEL selectors and firstAvailable honoured in controller mode; unsupported ones refused by field"
