#!/usr/bin/env bash
# Install Kueue on the running local cluster (hack/cluster-up.sh): its CRDs, and its manager
# as a host process recorded like the cluster's own (pid file, stopped by
# hack/kueue-uninstall.sh or hack/cluster-down.sh), log in _out/logs/kueue.log.
#
#   hack/kueue-install.sh          (make kueue-install)
#
# The manager's Configuration (written to $CLUSTER_STATE/kueue/config.yaml):
# * DRA quota on: feature gate DynamicResourceAllocation, and deviceClassMappings that count
#   each device of fgpu's shared class (shared.gpu.fgpu.dev) as one `fgpu.dev/shares` and
#   each whole GPU (gpu.fgpu.dev) as one `fgpu.dev/gpus` (docs/platforms.md).
# * Only the batch/job integration; no leader election (one manager).
# * No admission webhook is registered with the API server. Kueue's Job webhook only
#   defaults `suspend: true` on a queued Job and its validating webhooks check objects the
#   admin writes; the Job reconciler does the queueing without them. So a Job must be
#   created suspended (the manifests in deploy/examples/kueue/ are). The webhook server
#   still starts (Kueue always starts it): it listens on 127.0.0.1 with a certificate from
#   hack/webhook-certs.sh and is never called.
# * Internal certificate management off: it would wait for webhook configurations and a
#   Service that do not exist here. With it off, Kueue reads its metrics certificate from
#   the fixed path /etc/kueue/metrics/certs: a symlink to the same certificate, removed by
#   hack/kueue-uninstall.sh (the metrics server itself is off, bindAddress "0").
# * The visibility API server off (VisibilityOnDemand=false): an aggregated API server
#   the local cluster does not route to.
#
# Environment: FGPU_KUEUE_WEBHOOK_PORT (19680), FGPU_KUEUE_HEALTH_PORT (19681),
# FGPU_KUEUE_LOG_LEVEL (zap level, default info).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[ -f "$CLUSTER_STATE/env" ] || die "no running cluster ($CLUSTER_STATE/env): run make cluster-up first"
# shellcheck disable=SC1091 # written by hack/cluster-up.sh
source "$CLUSTER_STATE/env"
webhook_port="${FGPU_KUEUE_WEBHOOK_PORT:-19680}"
health_port="${FGPU_KUEUE_HEALTH_PORT:-19681}"
state="$CLUSTER_STATE/kueue"
metrics_certs=/etc/kueue/metrics/certs
t0=$SECONDS

bin="$("$FGPU_ROOT/hack/kueue-build.sh")"
crds="$(dirname "$(dirname "$bin")")/crds"
pid_alive kueue && die "kueue already running (pid $(cut -d' ' -f1 "$(pidfile kueue)")); run hack/kueue-uninstall.sh first"

# Server-side apply: the Workload CRD is larger than the last-applied annotation allows.
kubectl apply --server-side --force-conflicts -f "$crds" >/dev/null
kubectl wait --for=condition=Established --timeout=60s -f "$crds" >/dev/null \
  || die "Kueue's CRDs were not established in 60s"
kubectl create namespace kueue-system --dry-run=client -o yaml | kubectl apply -f - >/dev/null

mkdir -p "$state"
"$FGPU_ROOT/hack/webhook-certs.sh" "$state/pki" IP:127.0.0.1 DNS:kueue-webhook-service.kueue-system.svc
if [ -e "$metrics_certs" ] && [ ! -L "$metrics_certs" ]; then
  die "$metrics_certs exists and is not our symlink: not touching it"
fi
mkdir -p "$(dirname "$metrics_certs")"
ln -sfn "$state/pki" "$metrics_certs"

cat >"$state/config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:$health_port
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: $webhook_port
  certDir: $state/pki
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
featureGates:
  DynamicResourceAllocation: true
  VisibilityOnDemand: false
integrations:
  frameworks: ["batch/job"]
resources:
  deviceClassMappings:
  - name: fgpu.dev/shares
    deviceClassNames: [shared.gpu.fgpu.dev]
  - name: fgpu.dev/gpus
    deviceClassNames: [gpu.fgpu.dev]
EOF

start_bg kueue env KUBECONFIG="$KUBECONFIG" "$bin" --config "$state/config.yaml" \
  --zap-log-level="${FGPU_KUEUE_LOG_LEVEL:-info}"
wait_up kueue 60 "kueue /readyz on 127.0.0.1:$health_port" curl -fsS "http://127.0.0.1:$health_port/readyz" \
  || die "kueue did not become ready; log: $CLUSTER_LOGS/kueue.log"
log "kueue $(basename "$(dirname "$(dirname "$bin")")") ready in $((SECONDS - t0))s (log: $CLUSTER_LOGS/kueue.log)"
