#!/usr/bin/env bash
# Install Volcano on the running local cluster (hack/cluster-up.sh): its CRDs, and its
# scheduler and controller manager as host processes recorded like the cluster's own (pid
# files, stopped by hack/volcano-uninstall.sh or hack/cluster-down.sh), logs in
# _out/logs/vc-scheduler.log and _out/logs/vc-controller-manager.log.
#
#   hack/volcano-install.sh          (make volcano-install)
#
# The scheduler's configuration (written to $CLUSTER_STATE/volcano/scheduler.yaml):
# * actions enqueue, allocate, backfill. Not reclaim or preempt: in Volcano v1.14 they do not
#   work for pods with DRA claims. The embedded DRA filter reports a full GPU as
#   unschedulable and unresolvable, so they never look for victims; and their pipeline step runs the DRA
#   Reserve with an empty spec.nodeName, or, committed, leaves the claim "in the process of
#   being allocated" for good (preempt wedged a gang so; docs/platforms.md).
# * tier 1: priority, gang (all-or-nothing: a job's pods bind only when minAvailable of them
#   fit), conformance; tier 2: drf, predicates with DRA on (the kube-scheduler DRA plugin
#   Volcano embeds allocates the pods' ResourceClaims), proportion (queues: guarantee,
#   capability, weight), nodeorder, binpack.
# * Feature gate DRAConsumableCapacity on: fgpu's shared class hands out parts of a GPU's
#   memory (consumable capacity), alpha in the Kubernetes 1.34 libraries Volcano v1.14 is
#   built on.
# Volcano counts in its queues the resources a pod's containers request, not its DRA claims:
# the shares a queue may use are counted through fgpu.dev/shares, an extended resource each
# share-using container asks one of and the node advertises (docs/platforms.md).
#
# No admission webhook is registered (the webhook manager is not built): its defaulting is
# written out in the vcjobs of deploy/examples/volcano/ and its validation is not done.
# Controllers: job, podgroup, queue, garbage collection (no job flows, cron jobs, hypernodes).
# No leader election (one of each).
#
# Environment: FGPU_VOLCANO_PORT_BASE (19690: scheduler metrics, scheduler health, controller
# manager metrics, controller manager health on the four ports from there),
# FGPU_VOLCANO_LOG_LEVEL (klog -v, default 3), FGPU_VOLCANO_ACTIONS (the scheduler's actions,
# default "enqueue, allocate, backfill"; to try reclaim again on a later Volcano),
# FGPU_VOLCANO_VGPU (1: the deviceshare plugin with deviceshare.VGPUEnable, Volcano's vGPU
# device sharing, which fgpu's device plugin serves with --scheduler volcano; pods ask
# volcano.sh/vgpu-number, vgpu-memory, vgpu-cores, and reclaim works for them:
# docs/platforms.md, "Volcano with reclaim"; default 0).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ -f "$CLUSTER_STATE/env" ] || die "no running cluster ($CLUSTER_STATE/env): run make cluster-up first"
# shellcheck disable=SC1091 # written by hack/cluster-up.sh
source "$CLUSTER_STATE/env"
base="${FGPU_VOLCANO_PORT_BASE:-19690}"
v="${FGPU_VOLCANO_LOG_LEVEL:-3}"
actions="${FGPU_VOLCANO_ACTIONS:-enqueue, allocate, backfill}"
vgpu="${FGPU_VOLCANO_VGPU:-0}"
state="$CLUSTER_STATE/volcano"
t0=$SECONDS

bindir="$("$FGPU_ROOT/hack/volcano-build.sh")"
crds="$(dirname "$bindir")/crds"
for c in vc-scheduler vc-controller-manager; do
  pid_alive "$c" && die "$c already running (pid $(cut -d' ' -f1 "$(pidfile "$c")")); run hack/volcano-uninstall.sh first"
done

# Server-side apply: the Job CRD (a whole pod template per task) is too large for the
# last-applied annotation.
kubectl apply --server-side --force-conflicts -f "$crds" >/dev/null
kubectl wait --for=condition=Established --timeout=60s -f "$crds" >/dev/null \
  || die "Volcano's CRDs were not established in 60s"

mkdir -p "$state"
cat >"$state/scheduler.yaml" <<YAML
actions: "$actions"
tiers:
- plugins:
  - name: priority
  - name: gang
  - name: conformance
- plugins:
  - name: drf
  - name: predicates
    arguments:
      predicate.DynamicResourceAllocationEnable: true
  - name: proportion
  - name: nodeorder
  - name: binpack
YAML
if [ "$vgpu" = 1 ]; then
  # Volcano's vGPU placement: the node's GPUs from volcano.sh/node-vgpu-register, each pod's
  # allocation written by the predicates plugin's allocate handler (node lock off: fgpu's
  # device plugin matches Allocate to its pod through the kubelet's pod resources).
  cat >>"$state/scheduler.yaml" <<YAML
  - name: deviceshare
    arguments:
      deviceshare.VGPUEnable: true
YAML
fi

common=(--kubeconfig "$KUBECONFIG" --leader-elect=false --enable-healthz=true -v "$v")
sched=("$bindir/vc-scheduler")
if [ "$vgpu" = 1 ]; then
  # The deviceshare plugin reads nodes and writes pods through a client of its own, built
  # only from the in-cluster configuration (rest.InClusterConfig in
  # pkg/scheduler/api/devices/util.go): KUBERNETES_SERVICE_HOST/PORT and a token and CA at
  # the fixed path /var/run/secrets/kubernetes.io/serviceaccount; without them it panics at
  # the first vGPU pod. So the scheduler gets what a pod would: the service account
  # volcano-system/volcano-scheduler (the user the chart's admission policy lets set the
  # allocation annotations; cluster-admin on this throwaway cluster), a token for it, and
  # the CA, bind-mounted at that path in a mount namespace of its own. The host sees only
  # the empty mount point, created if missing and removed by volcano-uninstall.sh.
  sa="$state/serviceaccount"
  mkdir -p "$sa"
  kubectl create namespace volcano-system --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl -n volcano-system create serviceaccount volcano-scheduler --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl create clusterrolebinding fgpu-volcano-scheduler --clusterrole cluster-admin \
    --serviceaccount volcano-system:volcano-scheduler --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl -n volcano-system create token volcano-scheduler --duration 48h >"$sa/token"
  kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}' \
    | xargs -r cat >"$sa/ca.crt"
  [ -s "$sa/ca.crt" ] || die "no CA file in $KUBECONFIG for the scheduler's in-cluster configuration"
  echo volcano-system >"$sa/namespace"
  server="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
  hostport="${server#https://}"
  mnt="$SA_MOUNT_POINT"
  if [ ! -d "$mnt" ]; then mkdir -p "$mnt" && touch "$state/created-mount-point"; fi
  # unshare and sh exec in place, so the recorded pid is the scheduler's.
  # shellcheck disable=SC2016 # $1.. are sh -c's own arguments
  sched=(env KUBERNETES_SERVICE_HOST="${hostport%:*}" KUBERNETES_SERVICE_PORT="${hostport##*:}"
    unshare --mount --propagation private
    sh -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' vc-scheduler "$sa" "$mnt" "$bindir/vc-scheduler")
fi
start_bg vc-scheduler "${sched[@]}" "${common[@]}" \
  --scheduler-conf "$state/scheduler.yaml" --feature-gates DRAConsumableCapacity=true \
  --listen-address "127.0.0.1:$base" --healthz-address "127.0.0.1:$((base + 1))" \
  --cache-dump-dir "$state"
start_bg vc-controller-manager "$bindir/vc-controller-manager" "${common[@]}" \
  --controllers job-controller,pg-controller,queue-controller,gc-controller \
  --listen-address "127.0.0.1:$((base + 2))" --healthz-address "127.0.0.1:$((base + 3))"
wait_up vc-scheduler 60 "vc-scheduler /healthz on 127.0.0.1:$((base + 1))" \
  curl -fsS "http://127.0.0.1:$((base + 1))/healthz" \
  || die "vc-scheduler did not become ready; log: $CLUSTER_LOGS/vc-scheduler.log"
wait_up vc-controller-manager 60 "vc-controller-manager /healthz on 127.0.0.1:$((base + 3))" \
  curl -fsS "http://127.0.0.1:$((base + 3))/healthz" \
  || die "vc-controller-manager did not become ready; log: $CLUSTER_LOGS/vc-controller-manager.log"
# The scheduler creates the queues root and default at start; jobs need them open.
wait_up vc-scheduler 60 "queue default created" kubectl get queues.scheduling.volcano.sh default \
  || die "vc-scheduler did not create the default queue; log: $CLUSTER_LOGS/vc-scheduler.log"
log "volcano $(basename "$(dirname "$bindir")") ready in $((SECONDS - t0))s (logs: $CLUSTER_LOGS/vc-*.log)"
