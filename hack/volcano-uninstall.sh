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
# The empty mount point of the vGPU scheduler's in-cluster configuration, if the install
# created it (it bind-mounted a directory there in the scheduler's own mount namespace).
remove_sa_mount_point "$CLUSTER_STATE/volcano"
rm -rf "$CLUSTER_STATE/volcano"

if [ -f "$CLUSTER_STATE/env" ] && pid_alive kube-apiserver; then
  # shellcheck disable=SC1091 # written by hack/cluster-up.sh
  source "$CLUSTER_STATE/env"
  delete_crds .volcano.sh Volcano
fi
log "volcano uninstalled"
