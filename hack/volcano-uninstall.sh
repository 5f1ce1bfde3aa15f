#!/usr/bin/env bash
# Remove what hack/volcano-install.sh put on the local cluster: stop Volcano's scheduler and
# controller manager (their recorded pids only), remove their state, then delete Volcano's
# CRDs (and with them every queue, vcjob and podgroup).
# Safe to run twice, and when no cluster is running (then only the local leftovers go).
#
#   hack/volcano-uninstall.sh          (make volcano-uninstall)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

stop_pid vc-scheduler 20
stop_pid vc-controller-manager 20
rm -rf "$CLUSTER_STATE/volcano"

if [ -f "$CLUSTER_STATE/env" ] && pid_alive kube-apiserver; then
  # shellcheck disable=SC1091 # written by hack/cluster-up.sh
  source "$CLUSTER_STATE/env"
  mapfile -t crds < <(kubectl get crd -o name 2>/dev/null | grep '\.volcano\.sh$' || true)
  if [ ${#crds[@]} -gt 0 ]; then
    # With the controllers gone nobody removes Volcano's finalizers: drop them, or the CRDs'
    # deletion waits for their objects forever.
    for crd in "${crds[@]}"; do
      kubectl get "${crd#*/}" -A -o jsonpath='{range .items[?(@.metadata.finalizers)]}{.metadata.namespace}{" "}{.metadata.name}{"\n"}{end}' 2>/dev/null \
        | while read -r ns name; do
            [ -n "$name" ] || { name="$ns"; ns=""; }
            kubectl patch "${crd#*/}" "$name" ${ns:+-n "$ns"} --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
          done
    done
    kubectl delete --wait=true --timeout=60s "${crds[@]}" >/dev/null || log "Volcano's CRDs were not all deleted in 60s"
  fi
fi
log "volcano uninstalled"
