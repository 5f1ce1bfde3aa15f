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
  mapfile -t crds < <(kubectl get crd -o name 2>/dev/null | grep '\.kueue\.x-k8s\.io$' || true)
  if [ ${#crds[@]} -gt 0 ]; then
    # With the manager gone nobody removes Kueue's finalizers (on workloads, queues,
    # flavors): drop them, or the CRDs' deletion waits for their objects forever.
    for crd in "${crds[@]}"; do
      kubectl get "${crd#*/}" -A -o jsonpath='{range .items[?(@.metadata.finalizers)]}{.metadata.namespace}{" "}{.metadata.name}{"\n"}{end}' 2>/dev/null \
        | while read -r ns name; do
            [ -n "$name" ] || { name="$ns"; ns=""; }
            kubectl patch "${crd#*/}" "$name" ${ns:+-n "$ns"} --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
          done
    done
    kubectl delete --wait=true --timeout=60s "${crds[@]}" >/dev/null || log "Kueue's CRDs were not all deleted in 60s"
  fi
  kubectl delete namespace kueue-system --ignore-not-found --wait=false >/dev/null 2>&1 || true
fi
log "kueue uninstalled"
