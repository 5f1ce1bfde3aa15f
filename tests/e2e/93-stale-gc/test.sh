#!/usr/bin/env bash
# Scenario (issue 25): the kubelet plugin's stale-claim sweep must never remove the state of
# a live claim when the API server answers badly. The plugin runs as a host process
# (../plugin-lib.sh) with a resync (and sweep) every 5 s; three pods with 1Gi shared claims
# run (kube-scheduler allocates: consumable capacity, 1.36+). Then, one after the other:
#   1. kube-apiserver stopped with SIGSTOP for 40 s (the sweep's reads time out);
#   2. kube-apiserver down for 20 s (connection refused);
#   3. kube-apiserver restarted with --runtime-config resource.k8s.io/v1=false for 25 s:
#      the version the plugin negotiated is no longer served, every read of a claim is a 404
#      that names no claim (before the two-sighting rule, the first sweep unprepared every
#      claim on the node);
# then the API server as it was. Asserted after each: the same three checkpoint records, CDI
# specs and claim directories, the pods Running; in 3, the plugin's log shows the sweeps'
# errors (so they ran). Then a positive control: deleting one pod removes its claim's files.
# FGPU_E2E_BIN_FROM=<dir> runs another build of the plugin (an older one fails in step 3).
# e2e-timeout: 600
source "$(dirname "$0")/../lib.sh"
[ "$K8S_MINOR" -ge 36 ] || skip "Kubernetes $K8S_VERSION: DRA consumable capacity is not on by default before 1.36"
source "$E2E_DIR/../plugin-lib.sh"
root="$E2E_LIB_DIR/../.."
api=v1
# hack/lib.sh's restart_apiserver in a child shell (it stops and starts the cluster's
# kube-apiserver by its recorded pid; the new one is in its own session).
apiserver() { (cd "$root" && bash -c 'source hack/lib.sh; restart_apiserver "$@"' _ "$@") >&2; }
apiserver_pid() { cut -d' ' -f1 "${FGPU_CLUSTER_STATE:-/var/lib/fgpu-cluster}/pids/kube-apiserver.pid"; }
altered=0

cleanup() {
  local rc=$?
  kill -CONT "$(apiserver_pid)" 2>/dev/null || true
  [ "$altered" = 0 ] || apiserver || true
  kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=120s >/dev/null 2>&1 || true
  kubectl -n "$E2E_NS" delete resourceclaimtemplates --all >/dev/null 2>&1 || true
  classes | kubectl delete -f - --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  exit $rc
}
trap cleanup EXIT
plugin_setup 93
plugin_up

checkpoint="$run_dir/checkpoint"

shared_claim_pods live 3
running() { kubectl -n "$E2E_NS" get pods -l app=live --field-selector=status.phase=Running -o name | wc -l; }
wait_until 120 "the three pods Running" sh -c "[ \"\$(kubectl -n $E2E_NS get pods -l app=live --field-selector=status.phase=Running -o name | wc -l)\" -eq 3 ]"
uids="$(for p in live-1 live-2 live-3; do
  c="$(jp "pod/$p" '{.status.resourceClaimStatuses[0].resourceClaimName}')"
  jp "resourceclaims.$api.resource.k8s.io/$c" '{.metadata.uid}'; echo
done | sort)"
assert_eq "claims prepared (records)" "$uids" "$(checkpoint_uids)"
books() { # books <after what>
  assert_eq "checkpoint records after $1" "$uids" "$(checkpoint_uids)"
  assert_eq "CDI specs after $1" "$uids" "$(cdi_spec_uids)"
  assert_eq "claim directories after $1" "$uids" "$(claim_dir_uids)"
}

say "1. kube-apiserver stopped (SIGSTOP) for 40 s"
kill -STOP "$(apiserver_pid)"
sleep 40
kill -CONT "$(apiserver_pid)"
wait_until 60 "the API server answers again" kubectl get --raw /readyz
sleep 12 # two more sweeps with the API server back
books "a hung API server"
assert_eq "pods Running" 3 "$(running)"

say "2. kube-apiserver down for 20 s"
altered=1
apiserver --down 20
altered=0
sleep 12
books "a refused connection"
assert_eq "pods Running" 3 "$(running)"

say "3. resource.k8s.io/v1 unserved for 25 s"
errors_before="$(grep -c 'stale-claim cleanup' "$work/plugin.log" || true)"
altered=1
apiserver --runtime-config resource.k8s.io/v1=false
code="$(kubectl get --raw "/apis/resource.k8s.io/v1/namespaces/$E2E_NS/resourceclaims" 2>&1 | grep -o 'NotFound\|not found\|could not find' | head -1 || true)"
say "GET of the claims at v1 now: ${code:-answered}"
[ -n "$code" ] || fail "the API server still serves resource.k8s.io/v1"
sleep 25
books "an unserved version"
errors_after="$(grep -c 'stale-claim cleanup' "$work/plugin.log" || true)"
say "sweep errors logged while v1 was unserved: $((errors_after - errors_before))"
[ "$((errors_after - errors_before))" -ge 3 ] || fail "the sweeps did not run (or did not see the 404s) while v1 was unserved"
apiserver
altered=0
wait_until 60 "the API server serves resource.k8s.io/v1 again" kubectl get "resourceclaims.$api.resource.k8s.io" -n "$E2E_NS"
sleep 12
books "the API server restored"
assert_eq "pods Running" 3 "$(running)"
say "ok: a hung, a down and a version-less API server left every live claim's state intact"

say "positive control: deleting live-1 removes its claim's files"
gone="$(jp "resourceclaims.$api.resource.k8s.io/$(jp pod/live-1 '{.status.resourceClaimStatuses[0].resourceClaimName}')" '{.metadata.uid}')"
# After three API server restarts the kubelet may take a while to hear of the deletion.
kubectl -n "$E2E_NS" delete pod live-1 --wait=true --timeout=180s >/dev/null
uids="$(echo "$uids" | grep -v "^$gone\$")"
wait_until 60 "two records left" sh -c "[ \"\$(find $checkpoint -maxdepth 1 -name '*.json' | wc -l)\" -eq 2 ]"
books "deleting one pod"
