#!/usr/bin/env bash
# Scenario (issue 25, crash consistency on the real cluster): 200 kill -9 of fgpu's DRA
# kubelet plugin at random moments while the kubelet prepares a burst of 50 shared claims,
# then unprepares 25 of them. The plugin runs as a host process (../plugin-lib.sh) and is
# started again at once after each kill, as the DaemonSet's restart would. kube-scheduler
# allocates (consumable capacity, 1.36+): 50 claims of 1Gi on the fake node's two GPUs.
#
# Asserted after the kills: every pod still there is Running (none stuck, none failed);
# each claim has one result with a (device, shareID) of its own (kube-scheduler's part);
# the node's books match the API server's exactly: one checkpoint record in
# PrepareCompleted, one claim directory and one CDI spec per allocated claim of a running
# pod, and nothing else (no leak of the 25 unprepared, no duplicate of a retried prepare).
# Then every pod is deleted: no CDI spec, claim directory or record is left.
# About 4 minutes (200 kills take 2); FGPU_E2E_CHAOS_KILLS changes the count.
# e2e-timeout: 600
source "$(dirname "$0")/../lib.sh"
[ "$K8S_MINOR" -ge 36 ] || skip "Kubernetes $K8S_VERSION: DRA consumable capacity is not on by default before 1.36"
source "$E2E_DIR/../plugin-lib.sh"
api=v1
pods=50 removed=25 kills="${FGPU_E2E_CHAOS_KILLS:-200}"

cleanup() {
  local rc=$?
  kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=120s >/dev/null 2>&1 || true
  kubectl -n "$E2E_NS" delete resourceclaimtemplates --all >/dev/null 2>&1 || true
  classes | kubectl delete -f - --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  exit $rc
}
trap cleanup EXIT
plugin_setup 90
plugin_up

checkpoint="$run_dir/checkpoint"

# kill_loop <n>: n times, after a random 0.05-1.0 s, kill -9 the plugin and start it again.
killed=0
kill_loop() {
  local i
  for i in $(seq 1 "$1"); do
    sleep "$(awk -v r="$RANDOM" 'BEGIN{printf "%.2f", 0.05 + (r % 96) / 100}')"
    kill -KILL "$plugin_pid" 2>/dev/null || true
    wait "$plugin_pid" 2>/dev/null || true
    plugin_pid=""
    killed=$((killed + 1))
    plugin_pid="$("$E2E_LIB_DIR/30-dra-quota/plugin.sh" "$work")"
  done
}

shared_claim_pods chaos "$pods"
say "created $pods pods with 1Gi shared claims; killing the plugin $((kills * 3 / 4)) times during the burst"
t0=$SECONDS
kill_loop $((kills * 3 / 4))
running() { kubectl -n "$E2E_NS" get pods -l app=chaos --field-selector=status.phase=Running -o name | wc -l; }
say "$(running) of $pods pods Running after $killed kills ($((SECONDS - t0)) s)"

say "deleting $removed pods and killing the plugin $((kills - kills * 3 / 4)) times during their unprepare"
kubectl -n "$E2E_NS" delete pods $(seq -f 'chaos-%g' 1 "$removed") --wait=false >/dev/null
kill_loop $((kills - kills * 3 / 4))
say "$killed kills in $((SECONDS - t0)) s; the last plugin (pid $plugin_pid) stays up"

left=$((pods - removed))
wait_until 300 "the $left remaining pods Running and the $removed deleted gone" sh -c \
  "[ \"\$(kubectl -n $E2E_NS get pods -l app=chaos -o name | wc -l)\" -eq $left ] && [ \"\$(kubectl -n $E2E_NS get pods -l app=chaos --field-selector=status.phase=Running -o name | wc -l)\" -eq $left ]"
say "converged $((SECONDS - t0)) s after the first kill"
failed="$(kubectl -n "$E2E_NS" get pods -l app=chaos --field-selector=status.phase=Failed -o name | wc -l)"
assert_eq "pods Failed" 0 "$failed"

# The claims of the running pods, as the API server has them.
claims="$(kubectl -n "$E2E_NS" get pods -l app=chaos -o jsonpath='{range .items[*]}{.status.resourceClaimStatuses[0].resourceClaimName}{"\n"}{end}')"
uids="$(for c in $claims; do jp "resourceclaims.$api.resource.k8s.io/$c" '{.metadata.uid}'; echo; done | sort)"
assert_eq "allocated claims of running pods" "$left" "$(echo "$uids" | grep -c .)"
shares="$(for c in $claims; do jp "resourceclaims.$api.resource.k8s.io/$c" '{.status.allocation.devices.results[0].device}/{.status.allocation.devices.results[0].shareID}'; echo; done | sort)"
assert_eq "distinct (device, shareID) among the claims" "$left" "$(echo "$shares" | sort -u | grep -c /)"

# The node's books settle with the last resync (every 5 s) after the last kill.
wait_until 60 "checkpoint records = the running pods' claims" sh -c "[ \"\$(find $checkpoint -maxdepth 1 -name '*.json' | wc -l)\" -eq $left ]"
assert_eq "checkpoint records (claim UIDs)" "$uids" "$(checkpoint_uids)"
assert_eq "CDI specs (claim UIDs)" "$uids" "$(cdi_spec_uids)"
assert_eq "claim directories (claim UIDs)" "$uids" "$(claim_dir_uids)"
not_done="$(grep -L '"state":"PrepareCompleted"' "$checkpoint"/*.json || true)"
assert_eq "records not PrepareCompleted" "" "$not_done"
say "ok: after $killed kills, $left claims prepared once each, nothing of the $removed unprepared left"

kubectl -n "$E2E_NS" delete pods -l app=chaos --wait=true --timeout=180s >/dev/null
wait_until 60 "every CDI spec, claim directory and record removed" sh -c \
  "[ -z \"\$(find $checkpoint -maxdepth 1 -name '*.json')\" ] && [ -z \"\$(ls $run_dir/claims 2>/dev/null)\" ]"
assert_eq "leftover CDI specs" "" "$(cdi_spec_uids)"
say "ok: no leak after the last unprepare"
