#!/usr/bin/env bash
# Remove what hack/kueue-install.sh put on the local cluster: stop the Kueue manager (its
# recorded pid only), remove the /etc/kueue/metrics/certs symlink and the manager's state,
# then delete Kueue's CRDs (and with them every queue and workload object).
# Safe to run twice, and when no cluster is running (then only the local leftovers go).
#
#   hack/kueue-uninstall.sh          (make kueue-uninstall)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

stop_pid kueue 20
metrics_certs=/etc/kueue/metrics/certs
if [ -L "$metrics_certs" ]; then
  rm -f "$metrics_certs"
  rmdir /etc/kueue/metrics /etc/kueue 2>/dev/null || true
fi
rm -rf "$CLUSTER_STATE/kueue"

if [ -f "$CLUSTER_STATE/env" ] && pid_alive kube-apiserver; then
  # shellcheck disable=SC1091 # written by hack/cluster-up.sh
  source "$CLUSTER_STATE/env"
  delete_crds .kueue.x-k8s.io Kueue
  kubectl delete namespace kueue-system --ignore-not-found --wait=false >/dev/null 2>&1 || true
fi
log "kueue uninstalled"
