#!/usr/bin/env bash
# Scenario (issue 24): Volcano queues over fgpu shares. Volcano (hack/volcano-install.sh:
# scheduler and controller manager built from its Go module, host processes, the predicates
# plugin's DRA allocation on) with the queues of deploy/examples/volcano/: production (1 share
# guaranteed, weight 3, capability 4, not reclaimable) and research (weight 1, capability 3,
# reclaimable). The node: fgpu's kubelet plugin (host process, ../plugin-lib.sh) with one fake
# 80 GiB GPU, so four 20 GiB shares (share-20gi.yaml), and the node advertises
# fgpu.dev/shares: 4, the unit Volcano's queues count (its queues do not count DRA claims).
#
#   1. gang: production's serve-fill holds 3 shares; research's train-gang (leader + worker,
#      minAvailable 2) has room for one pod only: neither pod is bound, its PodGroup is not
#      Running; serve-fill deleted: both pods start together.
#   2. guarantee: research's train-research (4 pods, minAvailable 1) runs 3 pods, the 4th waits
#      (research's capability 3, and production's guarantee: with the capability raised to 4
#      it still waits); production's serve-small (1 pod) then runs at once on the guaranteed
#      share, no research pod evicted.
#   3. no reclaim for DRA pods: production's serve-production (2 pods, minAvailable 2) is within
#      what production's weight gives it (3 shares) but the GPU is full; Volcano v1.14 cannot
#      reclaim pods with DRA claims (hack/volcano-install.sh leaves the reclaim action out),
#      so research keeps its 3 pods and serve-production waits, neither pod bound. When
#      train-research is deleted, its claims are unprepared on the node (records and CDI specs
#      gone) and serve-production's pods run on the freed capacity of the same GPU.
# Throughout (a sampler, back to back): never more than 4 claims or 80 GiB granted on the GPU,
# never more than 4 fgpu.dev/shares bound, never a train-gang pod bound before step 1 made room.
# e2e-timeout: 900
source "$(dirname "$0")/../lib.sh"
[ "$K8S_MINOR" -ge 36 ] || skip "Kubernetes $K8S_VERSION: DRA consumable capacity is not on by default before 1.36"
source "$E2E_DIR/../plugin-lib.sh"
root="$E2E_LIB_DIR/../.."
ex="$root/deploy/examples/volcano"
pods_py="$E2E_DIR/pods.py"
api=v1
gpu_bytes=$((80 << 30)) shares=4 unit=fgpu.dev/shares
# Volcano's kinds by their full names: "queue" is also a short name of Kueue's LocalQueue,
# and kubectl's discovery cache may still hold it after 80-kueue-shares.
pgs=podgroups.scheduling.volcano.sh

unadvertise() {
  kubectl patch node "$NODE_NAME" --subresource=status --type=json \
    -p '[{"op":"remove","path":"/status/capacity/fgpu.dev~1shares"}]' >/dev/null 2>&1 || true
}
cleanup() {
  local rc=$?
  sampler_stop
  kubectl -n "$E2E_NS" delete jobs.batch.volcano.sh --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  (cd "$root" && hack/volcano-uninstall.sh) >&2 || true
  kubectl -n "$E2E_NS" delete resourceclaimtemplates --all >/dev/null 2>&1 || true
  unadvertise
  classes | kubectl delete -f - --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup "$rc"
  exit "$rc"
}
trap cleanup EXIT
plugin_setup 81
one_gpu_node GPU-e2e81000-0000-4000-8000-000000000000 # four 20 GiB shares fill it
plugin_up
s="resourceslice/$PLUGIN_SLICE"
assert_eq "slice devices" gpu-0 "$(jp "$s" '{.spec.devices[*].name}' "")"
assert_eq "gpu-0 memory capacity" 80Gi "$(jp "$s" '{.spec.devices[0].capacity.memory.value}' "")"

# The unit Volcano counts: the node advertises one fgpu.dev/shares per share its GPU holds
# (an extended resource in the Node's status; the kubelet derives allocatable from it).
kubectl patch node "$NODE_NAME" --subresource=status --type=json \
  -p "[{\"op\":\"add\",\"path\":\"/status/capacity/fgpu.dev~1shares\",\"value\":\"$shares\"}]" >/dev/null
wait_until 60 "node allocatable $unit = $shares" jp_eq "node/$NODE_NAME" '{.status.allocatable.fgpu\.dev/shares}' "$shares" ""

t=$SECONDS
(cd "$root" && hack/volcano-install.sh) >&2
say "volcano built (or cached) and running in $((SECONDS - t))s"
kubectl apply -f "$ex/queues.yaml" >&2
for q in production research; do
  wait_until 60 "queue $q open" jp_eq "queues.scheduling.volcano.sh/$q" '{.status.state}' Open ""
done
kubectl -n "$E2E_NS" apply -f "$ex/share-20gi.yaml" >&2
say "ok: queues open"

# --- the books, sampled back to back (two list calls, then 0.2 s) until the end
grants_now() { # grants_now <tag>: "claims=N memory=B kueue=0 shares=S gang=G", from $work/<tag>-*.json
  local tag="$1" g b
  kubectl get resourceclaims -A -o json >"$work/$tag-claims.json" 2>/dev/null || return 1
  kubectl -n "$E2E_NS" get pods -o json >"$work/$tag-pods.json" 2>/dev/null || return 1
  g="$(python3 "$PLUGIN_BOOKS" grants "$work/$tag-claims.json" "$PLUGIN_DRIVER" "$NODE_NAME" gpu-0 none)" || return 1
  b="$(python3 "$pods_py" bound "$work/$tag-pods.json" "$unit" train-gang)" || return 1
  echo "${g% kueue=*} $b"
}
sampler_start grants_now sample

# An example vcjob with the e2e image, a command that waits, a 1 s grace period; for the
# production one, another name and size: vcjob <file> [<name> <pods>].
vcjob() {
  local f="$1" name="${2:-}" n="${3:-}"
  sed -e "s#image: my-cuda-image#image: $FGPU_WORKLOAD_IMAGE\n          imagePullPolicy: Never#" \
      -e 's#command: \[.*\]#command: ["/bin/sh", "-c", "exec sleep 3600"]#' \
      -e 's#restartPolicy: Never#restartPolicy: Never\n        terminationGracePeriodSeconds: 1#' \
      ${name:+-e "s#name: serve-production#name: $name#"} \
      ${n:+-e "s#replicas: 2#replicas: $n#" -e "s#minAvailable: 2#minAvailable: $n#"} \
      "$ex/$f" | kubectl -n "$E2E_NS" apply -f - >&2
}
sel() { echo "volcano.sh/job-name=$1"; }
running() { kubectl -n "$E2E_NS" get pods -l "$(sel "$1")" --field-selector=status.phase=Running -o name | wc -l; }
pods_of() { kubectl -n "$E2E_NS" get pods -l "$(sel "$1")" -o name | wc -l; }
bound_of() { kubectl -n "$E2E_NS" get pods -l "$(sel "$1")" -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | grep -c . || true; }
podgroup_of() { kubectl -n "$E2E_NS" get pods -l "$(sel "$1")" -o jsonpath='{.items[0].metadata.annotations.scheduling\.k8s\.io/group-name}'; }
claim_uids() { claim_uids_of -l "$(sel "$1")" --field-selector=status.phase=Running; } # of vcjob $1's Running pods, sorted
# every claim of vcjob $1's Running pods: a 20Gi share of gpu-0
assert_claims_on_gpu() { assert_share_claims gpu-0 20Gi -l "$(sel "$1")" --field-selector=status.phase=Running; }
sorted() { printf '%s\n' "$@" | grep . | sort; }
# Conditions for wait_until (checked anew each second).
n_running() { [ "$(running "$1")" -eq "$2" ]; }
n_pods() { [ "$(pods_of "$1")" -eq "$2" ]; }
no_pods() { [ "$(pods_of "$1")" -eq 0 ]; }
delete_job() { kubectl -n "$E2E_NS" delete jobs.batch.volcano.sh "$1" --wait=true --timeout=60s >&2; wait_until 60 "$1's pods gone" no_pods "$1"; }

# --- 1. gang: all or nothing
t1=$SECONDS
vcjob job-production.yaml serve-fill 3
wait_until 120 "serve-fill's 3 pods Running" n_running serve-fill 3
say "serve-fill (production, 3 shares) running $((SECONDS - t1))s after its vcjob was created"
assert_claims_on_gpu serve-fill
t_gang=$(date +%s)
vcjob job-gang.yaml
wait_until 60 "train-gang's 2 pods created" n_pods train-gang 2
pg="$(podgroup_of train-gang)"
[ -n "$pg" ] || fail "train-gang's pods name no PodGroup"
# Several scheduling periods (1 s each): Volcano has one share free and must bind neither.
sleep 10
assert_eq "train-gang pods bound while one share is free" 0 "$(bound_of train-gang)"
assert_eq "train-gang pods Running" 0 "$(running train-gang)"
phase="$(jp "$pgs/$pg" '{.status.phase}')"
case "$phase" in Pending | Inqueue) say "ok: PodGroup $pg is $phase" ;; *) fail "PodGroup $pg is $phase while its gang cannot fit" ;; esac
t_room=$(date +%s)
t1b=$SECONDS
delete_job serve-fill
wait_until 120 "train-gang's 2 pods Running" n_running train-gang 2
wait_until 30 "PodGroup $pg Running" jp_eq "$pgs/$pg" '{.status.phase}' Running
gap="$(python3 "$pods_py" scheduled-gap "$(obj_json pods)" train-gang)"
say "gang: both pods running $((SECONDS - t1b))s after serve-fill was deleted; scheduled ${gap}s apart"
if [ "$gap" = none ] || [ "$gap" -gt 2 ]; then fail "train-gang's pods were not scheduled together (${gap}s apart)"; fi
assert_claims_on_gpu train-gang
# The sampler: no train-gang pod bound while serve-fill held the GPU.
early="$(awk -v a="$t_gang" -v b="$t_room" '$1 >= a && $1 < b && $NF != "gang=0"' "$work/grants.log" | head -3)"
[ -z "$early" ] || fail "a train-gang pod was bound before there was room for both: $early"
delete_job train-gang
wait_until 60 "no claim left prepared" records_are ""

# --- 2. guarantee: research borrows the shared part, production's share stays free
t2=$SECONDS
vcjob job-research.yaml
wait_until 60 "train-research's 4 pods created" n_pods train-research 4
wait_until 120 "train-research's 3 pods Running" n_running train-research 3
say "research running 3 pods $((SECONDS - t2))s after its vcjob was created"
sleep 10
assert_eq "train-research pods bound (capability 3, production's guarantee kept)" 3 "$(bound_of train-research)"
assert_claims_on_gpu train-research
uids_r="$(claim_uids train-research)"
assert_eq "research claims" 3 "$(wc -l <<<"$uids_r")"
wait_until 30 "research claims in the node's checkpoint" records_are "$uids_r"
assert_eq "CDI specs" "$uids_r" "$(cdi_spec_uids)"
assert_eq "books now" "claims=3 memory=$((3 * (20 << 30))) shares=3 gang=0" "$(grants_now now)"
# The guarantee on its own: research's capability raised to the whole GPU, research still
# gets 3 (production's guaranteed share is never lent); then the capability back to 3.
cap() { kubectl patch queues.scheduling.volcano.sh research --type=merge -p "{\"spec\":{\"capability\":{\"$unit\":\"$1\"}}}" >&2; }
cap 4
sleep 10
assert_eq "train-research pods bound with research's capability 4 (guarantee kept)" 3 "$(bound_of train-research)"
cap 3
t2b=$SECONDS
vcjob job-production.yaml serve-small 1
wait_until 60 "serve-small running on the guaranteed share" n_running serve-small 1
say "guarantee: serve-small running $((SECONDS - t2b))s after its vcjob was created"
assert_claims_on_gpu serve-small
assert_eq "research claims untouched" "$uids_r" "$(claim_uids train-research)"
assert_eq "books now" "claims=4 memory=$gpu_bytes shares=4 gang=0" "$(grants_now now)"

# --- 3. production waits for the shares research holds (no reclaim with DRA claims)
t3=$SECONDS
vcjob job-production.yaml serve-production 2
wait_until 60 "serve-production's 2 pods created" n_pods serve-production 2
pg_p="$(podgroup_of serve-production)"
sleep 10
assert_eq "serve-production pods bound while the GPU is full" 0 "$(bound_of serve-production)"
assert_eq "research claims still running (nothing reclaimed)" "$uids_r" "$(claim_uids train-research)"
phase="$(jp "$pgs/$pg_p" '{.status.phase}')"
case "$phase" in Pending | Inqueue) say "ok: PodGroup $pg_p is $phase" ;; *) fail "PodGroup $pg_p is $phase while the GPU is full" ;; esac
t3b=$SECONDS
delete_job train-research
wait_until 60 "research claims unprepared (checkpoint)" none_recorded "$uids_r"
t_unprep=$((SECONDS - t3b))
assert_eq "research claims left in the checkpoint" "$uids_r" "$(without "$uids_r" "$(checkpoint_uids)")"
assert_eq "research claims left as CDI specs" "$uids_r" "$(without "$uids_r" "$(cdi_spec_uids)")"
say "ok: the research claims are unprepared (no record, no CDI spec)"
wait_until 120 "serve-production's 2 pods Running" n_running serve-production 2
t_run=$((SECONDS - t3b))
wait_until 30 "PodGroup $pg_p Running" jp_eq "$pgs/$pg_p" '{.status.phase}' Running
assert_claims_on_gpu serve-production
uids_p="$(sorted "$(claim_uids serve-small)" "$(claim_uids serve-production)")"
assert_eq "production claims" 3 "$(wc -l <<<"$uids_p")"
wait_until 30 "production's 3 claims in the checkpoint" records_are "$uids_p"
assert_eq "CDI specs (production only)" "$uids_p" "$(cdi_spec_uids)"
assert_eq "books now" "claims=3 memory=$((3 * (20 << 30))) shares=3 gang=0" "$(grants_now now)"
say "research deleted after serve-production waited $((t3b - t3))s: its claims unprepared after ${t_unprep}s, production running after ${t_run}s"

# --- never an over-grant
assert_no_overgrant "$shares" "$gpu_bytes" shares "$unit bound" 4
