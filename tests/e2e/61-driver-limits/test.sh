#!/usr/bin/env bash
# Scenario: driver-native memory limits (issue 18). fgpu's DRA kubelet plugin runs as a host
# process (30-dra-quota/plugin.sh, fake backend) whose fake NVML (--fake-nvml-library) has
# the r615 per-cgroup limit calls (FAKE_CUDA_MEMORY_LIMITS=1); the fake CUDA driver in the
# containers enforces what is set on their cgroup (tests/fake-cuda/src/limits.rs), under the
# real containerd + runc of the local cluster.
#
# Asserted:
#   * the node's ResourceSlice says `enforcement: driver` for its GPUs;
#   * pod limited (1Gi share, uid 1000): the claim's CDI spec has the createRuntime hook,
#     which set a hard limit of 1 GiB (soft 0) on the container's own cgroup (the pod's,
#     read back through the fake NVML from the host); fgpu-bypass in the container — the
#     fake driver linked in, nothing for the shim to interpose — is refused past 1024 MiB of
#     the 2048 it asks and sees 1024 MiB as the device's total; a second run holds 512 MiB
#     within it; the claim's status.devices says `enforcement: driver`;
#   * after the pod ends, the hook's record is gone and the cgroup holds no limit;
#   * the plugin restarted on a shim-only node (the fake without the limit calls): the
#     slice says `enforcement: shim`, and a claim whose CEL requires `driver` is not
#     allocated (its pod stays Pending).
source "$(dirname "$0")/../lib.sh"
[ "$K8S_MINOR" -ge 36 ] || skip "Kubernetes $K8S_VERSION: DRA consumable capacity is not on by default before 1.36"
# cgroup v2, or at least its hierarchy beside v1 ("hybrid", as on this project's machines,
# where runc places containers in /sys/fs/cgroup/unified too).
grep -q ' - cgroup2 ' /proc/self/mountinfo || skip "the node has no cgroup v2 hierarchy"

source "$E2E_DIR/../plugin-lib.sh"
plugin_setup 61
fake_dir="/run/fgpu-e2e/fake-61-$E2E_NS"
manifest="" manifest2=""
METRICS="127.0.0.1:19461"

cleanup() {
  local rc=$?
  [ -z "$manifest" ] || delete_tmpl "$manifest"
  [ -z "$manifest2" ] || delete_tmpl "$manifest2"
  kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl delete -f "$E2E_DIR/../../../deploy/deviceclasses.yaml" --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  rm -rf "$fake_dir"
  rm -f "$manifest" "$manifest2"
  exit $rc
}
trap cleanup EXIT

fake_state_setup "$fake_dir"
uuids="GPU-e2e00000-0000-4000-8000-000000000000,GPU-e2e00000-0000-4000-8000-000000000001"
(cd "$E2E_DIR/../../.." && cargo build -q -p fgpu-fake-cuda --bin fgpu-fake-smi) >&2 || fail "cargo build -p fgpu-fake-cuda failed"
cp "$CARGO_TARGET_DIR/debug/fgpu-fake-smi" "$work/bin/"
# The host's view of the fake driver's limits (fgpu-fake-smi get-limit <gpu> <cgroup>).
smi() { FAKE_CUDA_STATE="$fake_dir/gpu" FAKE_CUDA_UUIDS="$uuids" FAKE_CUDA_MEMORY_LIMITS=1 "$work/bin/fgpu-fake-smi" "$@"; }

# start_limits_plugin <0|1>: the plugin, its fake NVML with (1) or without (0) the limit calls
start_limits_plugin() {
  FGPU_E2E_METRICS="$METRICS" \
    FGPU_E2E_PLUGIN_ARGS="--fake-nvml-library $work/bin/libfgpu_fake_cuda.so --monitor-period-ms 1000 --claim-status-interval-seconds 2" \
    FAKE_CUDA_STATE="$fake_dir/gpu" FAKE_CUDA_NVML_HOST=1 FAKE_CUDA_UUIDS="$uuids" FAKE_CUDA_MEMORY_LIMITS="$1" start_plugin
}
enforcement() { kubectl get resourceslice "$PLUGIN_SLICE" -o jsonpath='{.spec.devices[*].attributes.enforcement.string}' 2>/dev/null; }

failed=()
check() { # check <what> <expected> <actual>
  if [ "$2" = "$3" ]; then say "PASS $1: $3"; else say "FAIL $1: expected '$2', got '$3'"; failed+=("$1"); fi
}
field() { kubectl -n "$E2E_NS" logs "$1" | sed -n "s/^$2=//p" | head -1; }

kubectl apply -f "$E2E_DIR/../../../deploy/deviceclasses.yaml" >&2
start_limits_plugin 1
wait_registered 1
wait_until 30 "ResourceSlice $PLUGIN_SLICE published" kubectl get resourceslice "$PLUGIN_SLICE"
check "slice: enforcement of the node's GPUs" "driver driver" "$(enforcement)"
grep -q 'driver memory limits on' "$work/plugin.log" || fail "the plugin did not turn the driver's limits on: $(grep -i 'limit' "$work/plugin.log" | head -3)"

manifest="$(mktemp /tmp/fgpu-e2e-61.XXXXXX.yaml)"
sed "s#__FAKE_DIR__#$fake_dir#g" "$E2E_DIR/workload.yaml" >"$manifest"
apply_tmpl "$manifest"
wait_until 120 "pod limited holds its 512 MiB" sh -c "kubectl -n $E2E_NS logs limited 2>/dev/null | grep -q '^bypass_allocated_mib='"
claim="$(jp pod/limited '{.status.resourceClaimStatuses[0].resourceClaimName}')"
uid="$(kubectl -n "$E2E_NS" get resourceclaim "$claim" -o jsonpath='{.metadata.uid}')"
pod_uid="$(jp pod/limited '{.metadata.uid}')"

spec="$CDI_SPEC_DIR/$PLUGIN_DRIVER-claim_$uid.json"
check "CDI spec: the createRuntime hook with the claim's limit" yes \
  "$(grep -q "\"createRuntime\"" "$spec" && grep -q "GPU-e2e00000-0000-4000-8000-000000000000=$((1 << 30))" "$spec" && echo yes || echo "no: $(head -c 600 "$spec")")"
records=()
for f in "$run_dir/claims/$uid/driver-limits/"*.json; do [ ! -e "$f" ] || records+=("$f"); done
check "the hook's records (one container)" 1 "${#records[@]}"
cg="$(sed -n 's/.*"cgroup":"\([^"]*\)".*/\1/p' "${records[0]}" 2>/dev/null)" || cg=""
say "      the container's cgroup: $cg"
check "the limit's cgroup is the pod's container's" yes \
  "$(grep -Eq "pod(${pod_uid//-/_}|$pod_uid)" <<<"$cg" && [ -n "$(cat "$cg/cgroup.procs" 2>/dev/null)" ] && echo yes || echo "no: $cg")"
got="$(smi get-limit 0 "$cg")" || got="exit $?: $got"
check "the driver's limit on the container's cgroup (host view)" "soft=0 hard=$((1 << 30)) current_used=$((512 << 20))" "$got"

check "bypass of the shim, 2048 MiB asked: refused" 1 "$(field limited big_exit)"
check "bypass of the shim: what it got" 1024 "$(field limited 'big: bypass_allocated_mib')"
check "bypass of the shim: the device's total it saw (MiB)" 1024 \
  "$(kubectl -n "$E2E_NS" logs limited | sed -n 's/^big: bypass_mem_total_mib=\([0-9]*\) .*/\1/p')"
check "a second run within the limit" 512 "$(field limited bypass_allocated_mib)"
cstat() { kubectl -n "$E2E_NS" get resourceclaim "$claim" -o jsonpath="{.status.devices[0].data.$1}"; }
wait_until 15 "claim status written" sh -c "[ -n \"\$(kubectl -n $E2E_NS get resourceclaim $claim -o jsonpath='{.status.devices[0].data.enforcement}')\" ]"
check "claim status: enforcement" driver "$(cstat enforcement)"

# --- the pod ends: its limit goes with it
kubectl -n "$E2E_NS" delete pod limited --wait=true --timeout=60s >&2
wait_until 60 "claim $uid unprepared" sh -c "[ ! -e $run_dir/claims/$uid ]"
after="$(smi get-limit 0 "$cg" 2>&1)" && rc=0 || rc=$?
check "after the pod: no limit left on its cgroup" yes \
  "$([ "$rc" -eq 6 ] || [ "$after" = "soft=0 hard=18446744073709551615 current_used=0" ] && echo yes || echo "no: exit $rc $after")"
check "after the pod: no clearing failed" "" "$(grep 'cannot clear a driver memory limit' "$work/plugin.log" | head -1)"

# --- a shim-only node: a claim that needs the driver is not placed there
stop_plugin
start_limits_plugin 0
wait_registered 2
wait_until 30 "the slice says enforcement: shim" sh -c "[ \"\$(kubectl get resourceslice $PLUGIN_SLICE -o jsonpath='{.spec.devices[*].attributes.enforcement.string}')\" = 'shim shim' ]"
check "slice on a shim-only node" "shim shim" "$(enforcement)"
manifest2="$(mktemp /tmp/fgpu-e2e-61b.XXXXXX.yaml)"
cp "$E2E_DIR/needs-driver.yaml" "$manifest2"
apply_tmpl "$manifest2"
sleep 15
check "needs-driver: pod phase" Pending "$(jp pod/needs-driver '{.status.phase}')"
c2="$(jp pod/needs-driver '{.status.resourceClaimStatuses[0].resourceClaimName}')"
check "needs-driver: its claim is not allocated" "" \
  "$([ -z "$c2" ] || kubectl -n "$E2E_NS" get resourceclaim "$c2" -o jsonpath='{.status.allocation}')"
say "      scheduler: $(kubectl -n "$E2E_NS" get events --field-selector involvedObject.name=needs-driver,reason=FailedScheduling -o jsonpath='{.items[-1:].message}' 2>/dev/null)"

[ ${#failed[@]} -eq 0 ] || fail "${#failed[@]} check(s) failed: ${failed[*]}"
say "ok: every check passed"
