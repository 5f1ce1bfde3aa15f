#!/usr/bin/env bash
# Scenario (issue 24): Kueue quotas over fgpu shares. Kueue (hack/kueue-install.sh: built from
# its Go module, run as a host process, DRA quota on, shared.gpu.fgpu.dev counted as
# fgpu.dev/shares) with the queues of deploy/examples/kueue/: fgpu-production (3 shares
# guaranteed, reclaims) and fgpu-research (1 share, borrows up to 3 more) in one cohort. The
# node: fgpu's kubelet plugin (host process, ../plugin-lib.sh) with one fake 80 GiB GPU, so
# four 20 GiB shares (share-20gi.yaml); kube-scheduler allocates (consumable capacity, 1.36+).
#
#   1. Job train-research (3 pods, a share each) in the research queue: admitted by borrowing
#      2 shares; its pods run, their claims on gpu-0 (20Gi each) are prepared on the node
#      (checkpoint records and CDI specs).
#   2. Job serve-production (3 pods) in the production queue: Kueue preempts the research
#      workload (Evicted/Preempted, InCohortReclamation), suspends its Job; its pods go, the
#      node unprepares their claims (records and CDI specs gone); the production pods run on
#      the freed capacity of the same GPU; research waits (no quota reserved).
#   3. serve-production deleted: research is admitted again, by borrowing, and runs.
# Throughout (a sampler, back to back): never more than 4 claims or 80 GiB granted on the GPU,
# never more than 4 shares reserved in Kueue's books (its Workloads' admissions).
# e2e-timeout: 900
source "$(dirname "$0")/../lib.sh"
[ "$K8S_MINOR" -ge 36 ] || skip "Kubernetes $K8S_VERSION: DRA consumable capacity is not on by default before 1.36"
source "$E2E_DIR/../plugin-lib.sh"
root="$E2E_LIB_DIR/../.."
ex="$root/deploy/examples/kueue"
api=v1
gpu_bytes=$((80 << 30)) shares=4

cleanup() {
  local rc=$?
  sampler_stop
  kubectl -n "$E2E_NS" delete jobs --all --cascade=foreground --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  (cd "$root" && hack/kueue-uninstall.sh) >&2 || true
  kubectl -n "$E2E_NS" delete resourceclaimtemplates --all >/dev/null 2>&1 || true
  classes | kubectl delete -f - --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup "$rc"
  exit "$rc"
}
trap cleanup EXIT
plugin_setup 80
one_gpu_node GPU-e2e80000-0000-4000-8000-000000000000 # four 20 GiB shares fill it
plugin_up
s="resourceslice/$PLUGIN_SLICE"
assert_eq "slice devices" gpu-0 "$(jp "$s" '{.spec.devices[*].name}' "")"
assert_eq "gpu-0 memory capacity" 80Gi "$(jp "$s" '{.spec.devices[0].capacity.memory.value}' "")"

t=$SECONDS
(cd "$root" && hack/kueue-install.sh) >&2
say "kueue built (or cached) and running in $((SECONDS - t))s"
kubectl apply -f "$ex/queues.yaml" >&2
kubectl -n "$E2E_NS" apply -f "$ex/local-queues.yaml" -f "$ex/share-20gi.yaml" >&2
for cq in fgpu-production fgpu-research; do
  wait_until 30 "ClusterQueue $cq active" jp_eq "clusterqueue/$cq" '{.status.conditions[?(@.type=="Active")].status}' True ""
done
for lq in production research; do
  wait_until 30 "LocalQueue $lq active" jp_eq "localqueue/$lq" '{.status.conditions[?(@.type=="Active")].status}' True
done
say "ok: queues active"

# --- the books, sampled back to back (one list call, then 0.2 s) until the end
grants_now() { # grants_now <tag>: books.py grants, from $work/<tag>-books.json
  local f="$work/$1-books.json"
  kubectl get resourceclaims,workloads -A -o json >"$f" 2>/dev/null || return 1
  python3 "$PLUGIN_BOOKS" grants "$f" "$PLUGIN_DRIVER" "$NODE_NAME" gpu-0 fgpu.dev/shares
}
sampler_start grants_now sample

# The example Jobs, with the e2e image, a command that waits, and a 1 s grace period.
job() {
  sed -e "s#image: my-cuda-image#image: $FGPU_WORKLOAD_IMAGE\n        imagePullPolicy: Never#" \
      -e 's#command: \[.*\]#command: ["/bin/sh", "-c", "exec sleep 3600"]#' \
      -e 's#restartPolicy: Never#restartPolicy: Never\n      terminationGracePeriodSeconds: 1#' \
      "$ex/$1" | kubectl -n "$E2E_NS" apply -f - >&2
}
workload_of() { # the Workload Kueue made for Job $1
  local uid
  uid="$(jp "job/$1" '{.metadata.uid}')"
  kubectl -n "$E2E_NS" get workloads -l "kueue.x-k8s.io/job-uid=$uid" -o name 2>/dev/null | head -1
}
cond() { python3 "$PLUGIN_BOOKS" condition "$(obj_json "$1")" "$2"; }
running() { kubectl -n "$E2E_NS" get pods -l "batch.kubernetes.io/job-name=$1" --field-selector=status.phase=Running -o name | wc -l; }
pods_of() { kubectl -n "$E2E_NS" get pods -l "batch.kubernetes.io/job-name=$1" -o name | wc -l; }
claim_uids() { claim_uids_of -l "batch.kubernetes.io/job-name=$1"; } # of Job $1's pods, sorted
# every claim of Job $1's pods: a 20Gi share of gpu-0
assert_claims_on_gpu() { assert_share_claims gpu-0 20Gi -l "batch.kubernetes.io/job-name=$1"; }
cq_usage() { kubectl get clusterqueue "$1" -o json >"$work/cq.json" && python3 "$PLUGIN_BOOKS" usage "$work/cq.json" fgpu.dev/shares; }
# A ClusterQueue's status is written after the admission it counts (seen 0 0 right after
# one): wait for the expected figures, then show them.
usage_is() { [ "$(cq_usage "$1")" = "$2" ]; }
assert_usage() { # assert_usage <clusterqueue> <"total borrowed">
  wait_until 30 "$1 usage (total borrowed) $2" usage_is "$1" "$2"
  assert_eq "$1 usage (total borrowed)" "$2" "$(cq_usage "$1")"
}
# Conditions for wait_until (checked anew each second).
has_workload() { [ -n "$(workload_of "$1")" ]; }
admitted_to() { [ "$(jp "$1" '{.status.admission.clusterQueue}')" = "$2" ]; }
cond_is() { [ "$(cond "$1" "$2" | cut -d' ' -f1)" = "$3" ]; }
n_running() { [ "$(running "$1")" -eq "$2" ]; }
no_pods() { [ "$(pods_of "$1")" -eq 0 ]; }

# --- 1. research borrows
t1=$SECONDS
job job-research.yaml
wait_until 30 "a Workload for train-research" has_workload train-research
wl_r="$(workload_of train-research)"
wait_until 60 "$wl_r admitted to fgpu-research" admitted_to "$wl_r" fgpu-research
say "research admitted $((SECONDS - t1))s after its Job was created"
assert_eq "research Job suspended" false "$(jp job/train-research '{.spec.suspend}')"
assert_usage fgpu-research "3 2"
wait_until 120 "train-research's 3 pods Running" n_running train-research 3
say "research pods running $((SECONDS - t1))s after its Job was created"
assert_claims_on_gpu train-research
uids_r="$(claim_uids train-research)"
assert_eq "research claims" 3 "$(wc -l <<<"$uids_r")"
wait_until 30 "research claims in the node's checkpoint" records_are "$uids_r"
assert_eq "checkpoint records" "$uids_r" "$(checkpoint_uids)"
assert_eq "CDI specs" "$uids_r" "$(cdi_spec_uids)"
assert_eq "books now" "claims=3 memory=$((3 * (20 << 30))) kueue=3" "$(grants_now now)"

# --- 2. production reclaims
t2=$SECONDS
job job-production.yaml
wait_until 30 "a Workload for serve-production" has_workload serve-production
wl_p="$(workload_of serve-production)"
wait_until 60 "$wl_r evicted" cond_is "$wl_r" Evicted True
t_evict=$((SECONDS - t2))
assert_eq "research eviction" "True Preempted" "$(cond "$wl_r" Evicted)"
assert_eq "research preemption" "True InCohortReclamation" "$(cond "$wl_r" Preempted)"
wait_until 30 "train-research suspended" jp_eq job/train-research '{.spec.suspend}' true
wait_until 60 "train-research's pods gone" no_pods train-research
wait_until 60 "research claims unprepared (checkpoint)" none_recorded "$uids_r"
t_unprep=$((SECONDS - t2))
assert_eq "research claims left in the checkpoint" "$uids_r" "$(without "$uids_r" "$(checkpoint_uids)")"
assert_eq "research claims left as CDI specs" "$uids_r" "$(without "$uids_r" "$(cdi_spec_uids)")"
say "ok: the research claims are unprepared (no record, no CDI spec)"
wait_until 60 "$wl_p admitted to fgpu-production" admitted_to "$wl_p" fgpu-production
wait_until 120 "serve-production's 3 pods Running" n_running serve-production 3
t_run=$((SECONDS - t2))
assert_claims_on_gpu serve-production
uids_p="$(claim_uids serve-production)"
wait_until 30 "production claims in the node's checkpoint" records_are "$uids_p"
assert_eq "checkpoint records (production only)" "$uids_p" "$(checkpoint_uids)"
assert_eq "CDI specs (production only)" "$uids_p" "$(cdi_spec_uids)"
assert_usage fgpu-production "3 0"
assert_usage fgpu-research "0 0"
assert_eq "research waits (QuotaReserved)" False "$(cond "$wl_r" QuotaReserved | cut -d' ' -f1)"
assert_eq "train-research still suspended" true "$(jp job/train-research '{.spec.suspend}')"
assert_eq "books now" "claims=3 memory=$((3 * (20 << 30))) kueue=3" "$(grants_now now)"
say "reclaim: research evicted after ${t_evict}s, its claims unprepared after ${t_unprep}s, production running after ${t_run}s"

# --- 3. production done: research borrows again
t3=$SECONDS
kubectl -n "$E2E_NS" delete job serve-production --cascade=foreground --wait=true --timeout=60s >&2
wait_until 90 "$wl_r admitted again" cond_is "$wl_r" Admitted True
wait_until 120 "train-research's 3 pods Running again" n_running train-research 3
assert_claims_on_gpu train-research
assert_eq "fgpu-research usage again (total borrowed)" "3 2" "$(cq_usage fgpu-research)"
uids_r2="$(claim_uids train-research)"
wait_until 30 "new research claims in the node's checkpoint" records_are "$uids_r2"
assert_eq "CDI specs (new research claims only)" "$uids_r2" "$(cdi_spec_uids)"
say "research re-admitted and running $((SECONDS - t3))s after production was deleted"

# --- never an over-grant
assert_no_overgrant "$shares" "$gpu_bytes" kueue "Kueue shares in use" 3
