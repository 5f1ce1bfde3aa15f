#!/usr/bin/env bash
# Scenario: restarts of the extender and of the device plugin in the middle of work lose
# nothing. One real node (tests/e2e/legacy-node.yaml: gpu-0 H100 81559 MiB, gpu-1 A100).
#
# 1. big (70000 MiB) runs; its decision is on the pod.
# 2. The extender is stopped (SIGTERM). A pod created now (late, 20000 MiB, pinned to the
#    other GPU) stays Pending, unbound (kube-scheduler cannot reach the extender). The
#    extender is started again: it rebuilds its ledger from the pods' decisions, late is
#    placed and runs; a pod pinned to big's GPU asking more than is left there (over, 20000
#    MiB) stays Pending with the extender's reason: big's grant survived the restart.
# 3. The device plugin is killed (SIGKILL) and the node's inventory annotation removed; the
#    plugin is started again: it registers with the kubelet again, re-publishes the same
#    inventory, keeps big's files (CDI spec, limits); big still runs with its quota (a new
#    probe through kubectl exec sees 70000 MiB and is refused past it); a pod created after
#    the restart (after, 5000 MiB) is allocated by the new process and sees its quota.
source "$(dirname "$0")/../lib.sh"
source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../legacy-lib.sh"
trap 'legacy_cleanup $?' EXIT
legacy_setup 53
LEGACY_WEBHOOK=0   # see legacy-lib.sh
legacy_up
H100=GPU-e2e1e9ac-0000-4000-8000-000000000000 A100=GPU-e2e1e9ac-0000-4000-8000-000000000001
pod() { # pod <name> <MiB> [annotations]
  local ann="${3:-"{}"}"
  sed -e "s#__NAME__#$1#" -e "s#__MEM__#$2#" -e "s#__ANNOTATIONS__#$ann#" "$E2E_DIR/pods.yaml" >"$work/$1.yaml"
  legacy_apply "$work/$1.yaml"
}
uuid() { decision_field "$1" 'd["containers"][0]["devices"][0]["uuid"]'; }

# --- 1
pod big 70000 "{nvidia.com/use-gpuuuid: $H100}"
wait_probe big
assert_eq "big: GPU" "$H100" "$(uuid big)"
assert_eq "big: cuMemGetInfo total (MiB)" 70000 "$(probe_field big cuda_total_mib)"

# --- 2: extender down
legacy_stop extender
pod late 20000 "{nvidia.com/use-gpuuuid: $A100}"
wait_until 60 "late: FailedScheduling while the extender is down" sh -c \
  "kubectl -n $E2E_NS get events --field-selector involvedObject.name=late,reason=FailedScheduling -o name | grep -q ."
say "late while the extender is down: $(kubectl -n "$E2E_NS" get events --field-selector involvedObject.name=late,reason=FailedScheduling -o jsonpath='{.items[0].message}' | cut -c1-200)"
assert_eq "late: node while the extender is down" "" "$(jp pod/late '{.spec.nodeName}')"
assert_eq "late: decision while the extender is down" "" "$(decision late)"
t0=$SECONDS
start_extender
wait_until 120 "late bound after the extender is back" jp_nonempty pod/late '{.spec.nodeName}'
say "ok: late bound $((SECONDS - t0))s after the extender restarted"
assert_eq "late: GPU" "$A100" "$(uuid late)"
wait_probe late
assert_eq "late: cuMemGetInfo total (MiB)" 20000 "$(probe_field late cuda_total_mib)"
pod over 20000 "{nvidia.com/use-gpuuuid: $H100}"
wait_until 60 "over: FailedScheduling from the extender" sh -c \
  "kubectl -n $E2E_NS get events --field-selector involvedObject.name=over,reason=FailedScheduling -o jsonpath='{.items[*].message}' | grep -q 'UUID in'"
say "ok: over stays Pending: $(kubectl -n "$E2E_NS" get events --field-selector involvedObject.name=over,reason=FailedScheduling -o jsonpath='{.items[0].message}' | cut -c1-220)"
assert_eq "over: node" "" "$(jp pod/over '{.spec.nodeName}')"
kubectl -n "$E2E_NS" delete pod over --wait=true >&2

# --- 3: device plugin killed, annotation gone, plugin back
inv_before="$(node_inventory "$NODE_NAME")"
uid="$(jp pod/big '{.metadata.uid}')"
spec="$CDI_SPEC_DIR/gpu.fgpu.dev-claim_$uid-main.json"
[ -f "$spec" ] || fail "no CDI spec for big: $spec"
legacy_stop device-plugin KILL
kubectl annotate node "$NODE_NAME" "$LEGACY_INVENTORY_ANN-" >&2
start_device_plugin
wait_until 30 "inventory re-published" inventory_published "$NODE_NAME"
assert_eq "inventory after the restart" "$inv_before" "$(node_inventory "$NODE_NAME")"
sleep 5 # two resyncs of the restarted plugin: big's files must survive them
[ -f "$spec" ] || fail "big's CDI spec was removed by the restarted plugin"
say "ok: big's CDI spec kept over the restart and two resyncs"
assert_eq "big: phase" Running "$(jp pod/big '{.status.phase}')"
again="$(kubectl -n "$E2E_NS" exec big -- /usr/local/bin/fgpu-probe --step-mib 1000 --max-gib 96)"
assert_eq "big: a new process sees (MiB)" 70000 "$(sed -n 's/^cuda_total_mib=//p' <<<"$again")"
assert_eq "big: a new process is refused at (MiB)" 70000 "$(sed -n 's/^allocated_mib=//p' <<<"$again")"
assert_eq "big: refusal" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(sed -n 's/^next_alloc_result=//p' <<<"$again")"
pod after 5000
wait_probe after
assert_eq "after: cuMemGetInfo total (MiB)" 5000 "$(probe_field after cuda_total_mib)"
assert_eq "after: refusal" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(probe_field after next_alloc_result)"
grep -q "pod=$E2E_NS/after" "$work/device-plugin.log" || fail "the restarted device plugin did not log the allocation of after"
say "ok: the restarted device plugin allocated after"
