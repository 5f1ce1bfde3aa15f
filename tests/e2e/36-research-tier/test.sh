#!/usr/bin/env bash
# Scenario: the oversubscribed research tier (issue 24) through fgpu's DRA kubelet plugin on
# the fake node, GPU 0 an 80 GiB GPU labelled fgpu.dev/oversubscribe-0=1.5, GPU 1 as the
# profile has it (81559 MiB), on 1.36+ (consumable capacity: kube-scheduler packs shares
# against the capacity the slice publishes).
#
# Asserted:
# * the slice publishes gpu-0 with memory capacity 120Gi (1.5 x 80 GiB) and tier=research,
#   physicalMemory and oversubscribeRatio=1.5; gpu-1 with its own memory and
#   tier=production; the plugin's gpu_oversubscribe_ratio metric says 1.5 and 1;
# * production claims (shared class) land on gpu-1 only: a 60 GiB one on gpu-1, then a
#   30 GiB one stays pending (gpu-1 has 19.6 GiB left) although gpu-0's capacity has room;
# * three research-class claims of 40 GiB each land on gpu-0: 120 GiB granted on an 80 GiB
#   GPU (their results name gpu-0; their consumedCapacity adds up to 120Gi); a fourth stays
#   pending (gpu-0 full, gpu-1 not on the tier);
# * the container of one research claim allocates its whole 40 GiB grant in 1 GiB steps
#   (physical share 40 / 1.5 = 26.67 GiB) and keeps running: the fake counts 26 GiB of
#   device memory and 14 GiB managed (host-resident), the next allocation is refused, and
#   the plugin's fgpu_kubelet_plugin_claim_managed_memory_bytes shows the 14 GiB;
# * a claim of the shared class that sets oversubscribe: true itself is refused at prepare
#   with the plugin's message (names the claim and the config field; its class does not
#   set oversubscribe).
# e2e-timeout: 600
source "$(dirname "$0")/../lib.sh"
[ "$K8S_MINOR" -ge 36 ] || skip "Kubernetes $K8S_VERSION: DRA consumable capacity is not on by default before 1.36"
api=v1
source "$E2E_DIR/../plugin-lib.sh"
ROOT="$E2E_DIR/../../.."
LABEL=fgpu.dev/oversubscribe-0
GI=$((1 << 30))

cleanup() {
  local rc=$?
  # Gone before the plugin stops, so that their claims are unprepared (the namespace's
  # deletion otherwise waits on pods that the kubelet cannot finish).
  kubectl -n "$E2E_NS" delete pod --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl -n "$E2E_NS" delete resourceclaim --all --wait=true --timeout=30s >/dev/null 2>&1 || true
  kubectl label node "$NODE_NAME" "$LABEL-" >/dev/null 2>&1 || true
  kubectl delete -f "$ROOT/deploy/deviceclasses.yaml" --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  exit $rc
}
trap cleanup EXIT
plugin_setup 36

# The node: GPU 0 with exactly 80 GiB (so 1.5x is 120 GiB), on the research tier by its
# label (set before the plugin starts: a GPU seen for the first time takes its ratio).
awk '/- uuid: GPU-e2e00000-0000-4000-8000-000000000000/ {gpu0=1} gpu0 && /memory:/ {sub(/memory: .*/, "memory: 80Gi"); gpu0=0} {print}' \
  "$ROOT/deploy/fake/e2e-node.yaml" >"$work/node.yaml"
grep -q "memory: 80Gi" "$work/node.yaml" || fail "could not give GPU 0 80Gi in $work/node.yaml"
export FGPU_E2E_FAKE_GPUS="$work/node.yaml"
kubectl label node "$NODE_NAME" "$LABEL=1.5" --overwrite >&2

kubectl apply -f "$ROOT/deploy/deviceclasses.yaml" >&2
# The node monitor reads the claims' accounts (the managed-memory metric); on a fake node it
# runs only with the fake NVML as its source.
FGPU_E2E_PLUGIN_ARGS="--fake-nvml-library $work/bin/libfgpu_fake_cuda.so --monitor-period-ms 1000" start_plugin
wait_registered 1
wait_until 30 "ResourceSlice $PLUGIN_SLICE published" kubectl get resourceslice "$PLUGIN_SLICE"

dev_field() { # dev_field <device> <jsonpath under the device>
  kubectl get resourceslice "$PLUGIN_SLICE" -o "jsonpath={.spec.devices[?(@.name==\"$1\")]$2}"
}
assert_eq "gpu-0 memory capacity (1.5 x 80Gi)" "120Gi" "$(dev_field gpu-0 '.capacity.memory.value')"
assert_eq "gpu-0 tier" "research" "$(dev_field gpu-0 '.attributes.tier.string')"
assert_eq "gpu-0 physicalMemory" "$((80 * GI))" "$(dev_field gpu-0 '.attributes.physicalMemory.int')"
assert_eq "gpu-0 oversubscribeRatio" "1.5" "$(dev_field gpu-0 '.attributes.oversubscribeRatio.string')"
assert_eq "gpu-1 memory capacity (physical)" "81559Mi" "$(dev_field gpu-1 '.capacity.memory.value')"
assert_eq "gpu-1 tier" "production" "$(dev_field gpu-1 '.attributes.tier.string')"
metrics() { curl -s "http://${FGPU_E2E_METRICS:-127.0.0.1:19400}/metrics"; }
ratio() { metrics | sed -n "s/^fgpu_kubelet_plugin_gpu_oversubscribe_ratio{gpu_uuid=\"$1\"} //p"; }
assert_eq "ratio metric of GPU 0" "1.5" "$(ratio GPU-e2e00000-0000-4000-8000-000000000000)"
assert_eq "ratio metric of GPU 1" "1.0" "$(ratio GPU-e2e00000-0000-4000-8000-000000000001)"

# claim_pod <name> <class> <memory> [extra request lines] [probe args...]: a claim and a pod
# (lib.sh probe_pod) whose container runs fgpu-probe against it (by default up to 1 GiB), holds
# what it got, then stays up.
claim_pod() {
  local name="$1" class="$2" memory="$3" config="${4:-}" probe=(--step-mib 1024 --max-gib 1)
  [ $# -le 4 ] || probe=("${@:5}")
  kubectl apply -f - >&2 <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $name, namespace: $E2E_NS}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: $class
        capacity: {requests: {memory: $memory}}
$config
YAML
  probe_pod "$name" "claim/$name" "${probe[@]}" --hold-s 3600
}
device_of() { jp "resourceclaim/$1" '{.status.allocation.devices.results[0].device}'; }
unschedulable() {
  kubectl -n "$E2E_NS" get pod "$1" -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].reason}' | grep -q Unschedulable
}
allocations_on() { # the claims allocated on device $1, sorted, on one line
  kubectl -n "$E2E_NS" get resourceclaims \
    -o 'jsonpath={range .items[*]}{.metadata.name} {.status.allocation.devices.results[0].device}{"\n"}{end}' \
    | awk -v d="$1" '$2 == d {print $1}' | sort | paste -sd' ' -
}

# --- production claims: gpu-1 only
claim_pod prod-60 shared.gpu.fgpu.dev 60Gi
wait_until 120 "pod prod-60 running" jp_eq pod/prod-60 '{.status.phase}' Running
assert_eq "prod-60 allocated on" "gpu-1" "$(device_of prod-60)"
claim_pod prod-30 shared.gpu.fgpu.dev 30Gi
wait_until 60 "pod prod-30 unschedulable (gpu-1 full, gpu-0 research)" unschedulable prod-30
assert_eq "prod-30 not allocated (not on gpu-0's free 120Gi)" "" "$(device_of prod-30)"

# --- research claims: three of 40 GiB on gpu-0 (120 GiB on an 80 GiB GPU)
claim_pod res-a research.gpu.fgpu.dev 40Gi "" --step-mib 1024 --max-gib 48
claim_pod res-b research.gpu.fgpu.dev 40Gi
claim_pod res-c research.gpu.fgpu.dev 40Gi
for p in res-a res-b res-c; do
  wait_until 120 "pod $p running" jp_eq "pod/$p" '{.status.phase}' Running
done
assert_eq "claims on gpu-0" "res-a res-b res-c" "$(allocations_on gpu-0)"
assert_eq "claims on gpu-1" "prod-60" "$(allocations_on gpu-1)"
consumed="$(kubectl -n "$E2E_NS" get resourceclaims res-a res-b res-c -o jsonpath='{range .items[*]}{.status.allocation.devices.results[0].consumedCapacity.memory} {end}')"
assert_eq "consumedCapacity of the research claims" "40Gi 40Gi 40Gi" "${consumed% }"
claim_pod res-d research.gpu.fgpu.dev 40Gi
wait_until 60 "pod res-d unschedulable (gpu-0 full at 1.5x, gpu-1 not on the tier)" unschedulable res-d

# --- res-a allocates its whole grant past its physical share and keeps running
wait_until 120 "res-a's probe allocated" sh -c "kubectl -n $E2E_NS logs res-a 2>/dev/null | grep -q fake_managed_mib="
field() { kubectl -n "$E2E_NS" logs "$1" | sed -n "s/^$2=//p"; }
kubectl -n "$E2E_NS" logs res-a | sed 's/^/      res-a: /' >&2
assert_eq "res-a cuMemGetInfo total (MiB): its grant" "40960" "$(field res-a cuda_total_mib)"
assert_eq "res-a allocated before refusal (MiB): all of the grant" "40960" "$(field res-a allocated_mib)"
assert_eq "res-a device memory in the fake (MiB): 26 GiB, within 40/1.5" "26624" "$(field res-a fake_device_mib)"
assert_eq "res-a managed memory in the fake (MiB): the rest" "14336" "$(field res-a fake_managed_mib)"
assert_eq "res-a still running" "Running" "$(jp pod/res-a '{.status.phase}')"
managed() { metrics | sed -n "s/^fgpu_kubelet_plugin_claim_managed_memory_bytes{namespace=\"$E2E_NS\",claim=\"res-a\",gpu_uuid=\"GPU-e2e00000-0000-4000-8000-000000000000\"} //p"; }
managed_seen() { [ "$(managed)" = "$((14 * GI))" ]; }
# The node monitor reads the claim's account each pass (every few seconds).
wait_until 60 "the managed-memory metric of res-a at 14 GiB (now '$(managed)')" managed_seen
assert_eq "fgpu_kubelet_plugin_claim_managed_memory_bytes of res-a" "$((14 * GI))" "$(managed)"

# --- a claim that sets oversubscribe: true itself on the shared class is refused
kubectl -n "$E2E_NS" delete pod prod-30 --wait=false >/dev/null
kubectl -n "$E2E_NS" delete resourceclaim prod-30 --wait=false >/dev/null
claim_pod sneaky shared.gpu.fgpu.dev 1Gi "    config:
    - opaque:
        driver: gpu.fgpu.dev
        parameters: {apiVersion: gpu.fgpu.dev/v1alpha1, kind: GpuShareConfig, oversubscribe: true}"
refusal() {
  kubectl -n "$E2E_NS" get events --field-selector involvedObject.name=sneaky -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' \
    | grep -m1 'oversubscribe: (result 0) true is not allowed'
}
wait_until 120 "sneaky's prepare refused with the plugin's message" refusal
say "ok: $(refusal | cut -c1-300)"
grep -q "claim $E2E_NS/sneaky: status.allocation.devices.config\[0\].opaque.parameters.oversubscribe" <<<"$(refusal)" \
  || fail "the refusal does not name the claim and the field: $(refusal)"
assert_eq "sneaky allocated on the production GPU" "gpu-1" "$(device_of sneaky)"
[ "$(jp pod/sneaky '{.status.phase}')" != Running ] || fail "sneaky is running"
say "ok: sneaky is not running"
