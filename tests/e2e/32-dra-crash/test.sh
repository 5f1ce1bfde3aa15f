#!/usr/bin/env bash
# Scenario: kill -9 of fgpu's DRA kubelet plugin between the two phases of a prepare, on every
# release with DRA (1.32+). The plugin runs as a host process (../plugin-lib.sh) with a test
# pause (FGPU_TEST_PAUSE_PREPARE_SECONDS, a hidden flag): after it has written a claim's files
# (CDI spec, claim directory) and before it records the claim PrepareCompleted, it logs
# "test pause" and waits.
#
# Asserted: while paused, the checkpoint says PrepareStarted and the CDI spec exists; after
# kill -9 and a restart (without the pause), the kubelet's retry of NodePrepareResources
# completes the same claim — the pod runs and sees its GPU, the checkpoint says
# PrepareCompleted, and there is exactly one CDI spec and one claim directory (no duplicate);
# deleting the pod unprepares — no CDI spec, claim directory or checkpoint record is left (no
# leak).
source "$(dirname "$0")/../lib.sh"
api="$(dra_api_version)"
[ "$api" != none ] || skip "Kubernetes $K8S_VERSION: no usable DRA before 1.32"
source "$E2E_DIR/../plugin-lib.sh"
root="$E2E_DIR/../../.."

cleanup() {
  local rc=$?
  kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl -n "$E2E_NS" delete resourceclaims --all --wait=true --timeout=30s >/dev/null 2>&1 || true
  classes | kubectl delete -f - --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  exit $rc
}
trap cleanup EXIT
plugin_setup 32
mem_mi="$(sed -n 's/^ *memory: *\([0-9]*\)Mi$/\1/p' "$root/deploy/fake/e2e-node.yaml" | head -1)"
classes | kubectl apply -f - >&2

FGPU_TEST_PAUSE_PREPARE_SECONDS=600 start_plugin
wait_registered 1
wait_until 30 "ResourceSlice $PLUGIN_SLICE published" kubectl get "resourceslices.$api.resource.k8s.io" "$PLUGIN_SLICE"

whole_gpu_probe crash 1024

c="resourceclaims.$api.resource.k8s.io"
wait_until 90 "the plugin paused inside the claim's prepare" grep -q 'test pause' "$work/plugin.log"
uid="$(jp "$c/crash" '{.metadata.uid}')"
checkpoint="$run_dir/checkpoint" # one record file per claim: <uid>.json
state_of() { sed -n 's/.*"state":"\([A-Za-z]*\)".*/\1/p' "$checkpoint/$1.json" 2>/dev/null; }
records() { find "$checkpoint" -maxdepth 1 -name '*.json' | wc -l; }
specs() { find "$CDI_SPEC_DIR" -maxdepth 1 -name "$PLUGIN_DRIVER-claim_*.json" | sort; }
spec="$CDI_SPEC_DIR/$PLUGIN_DRIVER-claim_$uid.json"
assert_eq "checkpoint state while paused" PrepareStarted "$(state_of "$uid")"
assert_eq "CDI specs while paused (written before PrepareCompleted)" "$spec" "$(specs)"
assert_eq "claim directories while paused" "$uid" "$(ls "$run_dir/claims")"

say "kill -9 of the plugin (pid $plugin_pid) between the two phases"
kill -KILL "$plugin_pid"
wait "$plugin_pid" 2>/dev/null || true
plugin_pid=""
start_plugin
wait_registered 2

wait_until 150 "pod crash ran its probe after the restart" sh -c "kubectl -n $E2E_NS logs crash 2>/dev/null | grep -q probe_done"
assert_eq "the pod's cuMemGetInfo total (MiB)" "$mem_mi" "$(kubectl -n "$E2E_NS" logs crash | sed -n 's/^cuda_total_mib=//p')"
assert_eq "checkpoint state after the restart" PrepareCompleted "$(state_of "$uid")"
assert_eq "checkpoint records" 1 "$(records)"
assert_eq "CDI specs after the restart (no duplicate)" "$spec" "$(specs)"
assert_eq "claim directories after the restart" "$uid" "$(ls "$run_dir/claims")"
dev="$(jp "$c/crash" '{.status.allocation.devices.results[0].device}')"
share="$(jp "$c/crash" '{.status.allocation.devices.results[0].shareID}')"
name="$uid-$dev${share:+-$share}"
grep -q "\"$name\"" "$spec" || fail "$spec has no device $name"
say "ok: prepared once, CDI device $PLUGIN_DRIVER/claim=$name"

kubectl -n "$E2E_NS" delete pod crash --wait=true --timeout=60s >&2
wait_until 30 "CDI spec removed" sh -c "[ ! -e $spec ]"
assert_eq "leftover CDI specs" "" "$(specs)"
assert_eq "leftover claim directories" "" "$(ls "$run_dir/claims")"
assert_eq "checkpoint records after unprepare" 0 "$(records)"
say "ok: no duplicate, no leak"
