#!/usr/bin/env bash
# Tear the local cluster down: delete the pods (so kubelet/CNI clean up properly), stop every
# process hack/cluster-up.sh started (by the pid it recorded), kill what containerd's shims
# left (by the pid files containerd wrote), unmount what containerd/kubelet mounted under the
# state dirs, remove the CNI bridge and the state. Logs in _out/logs are kept.
# Safe to run twice, and after a run that died half-way.
#
#   hack/cluster-down.sh [--keep-logs]     (logs are always kept; the flag is accepted for clarity)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

S="$CLUSTER_STATE"
KUBELET_ROOT="${FGPU_KUBELET_ROOT:-/var/lib/kubelet}"
CTRD_DIR="$S/containerd"
CTRD_SOCK="$CTRD_DIR/containerd.sock"
CNI_BRIDGE=fgpu0
K8S_VERSION="$(cat "$S/version" 2>/dev/null || true)"

[ -d "$S" ] || { log "no cluster state in $S: nothing to tear down"; exit 0; }

ctr_() { "$(containerd_bindir)/ctr" --address "$CTRD_SOCK" -n k8s.io "$@"; }

# 1. let kubelet stop the pods (runs CNI DEL, unprepares DRA claims)
if [ -n "$K8S_VERSION" ] && pid_alive kube-apiserver && pid_alive kubelet; then
  log "deleting all pods"
  timeout 90 "$(kubectl_bin)" --kubeconfig "$S/pki/admin.kubeconfig" delete pods --all --all-namespaces \
    --grace-period=1 --wait=true --timeout=80s >/dev/null 2>&1 || log "pods were not all deleted in time; forcing"
  if pid_alive containerd; then
    deadline=$((SECONDS + 30))
    while ctr_ tasks ls 2>/dev/null | grep -q RUNNING && [ $SECONDS -lt $deadline ]; do sleep 1; done
  fi
fi

# 2. kubelet first (so it does not restart containers), then the runtime's leftovers
stop_pid kubelet 20
# containerd died with containers running (a run that died half-way): start it again on the
# same state so it reconnects to its shims (bootstrap.json in each bundle), then clean up below
if ! pid_alive containerd && [ -f "$CTRD_DIR/config.toml" ] \
  && ls -d "$CTRD_DIR"/state/io.containerd.runtime.v2.task/*/* >/dev/null 2>&1; then
  log "containerd is gone but left tasks: restarting it to clean them up"
  rm -f "$(pidfile containerd)"
  PATH="$(containerd_bindir):$PATH" start_bg containerd "$(containerd_bindir)/containerd" --config "$CTRD_DIR/config.toml"
  wait_for 30 "containerd API" ctr_ version || log "containerd did not come back; leftover shims may remain"
fi
if pid_alive containerd; then
  for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
  sleep 1
  for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$id" >/dev/null 2>&1 || true; done
  for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$id" >/dev/null 2>&1 || true; done
fi
stop_pid containerd 20
# shims and container processes that outlived containerd: the pids they recorded in the
# bundle directories of our containerd's state dir (so never anyone else's process)
for f in "$CTRD_DIR"/state/io.containerd.runtime.v2.task/*/*/{init.pid,shim.pid}; do
  [ -f "$f" ] || continue
  pid="$(cat "$f" 2>/dev/null || true)"
  { [ -n "$pid" ] && [ -d "/proc/$pid" ]; } || continue
  log "killing leftover $(basename "$f" .pid) process $pid ($(dirname "$f"))"
  kill -KILL "$pid" 2>/dev/null || true
done

# 3. control plane
for c in kube-scheduler kube-controller-manager kube-apiserver etcd; do stop_pid "$c" 20; done
# anything else started with start_bg (e.g. fgpu components started by the e2e runner)
for f in "$S"/pids/*.pid; do if [ -f "$f" ]; then stop_pid "$(basename "$f" .pid)" 10; fi; done
# hack/kueue-install.sh's metrics-certificate symlink into the state removed below
if [ "$(readlink /etc/kueue/metrics/certs 2>/dev/null)" = "$S/kueue/pki" ]; then
  rm -f /etc/kueue/metrics/certs
  rmdir /etc/kueue/metrics /etc/kueue 2>/dev/null || true
fi
# hack/volcano-install.sh's empty mount point for the vGPU scheduler's service account
remove_sa_mount_point "$S/volcano"

# 4. mounts under our state dirs, deepest first; the pods' network namespaces
umount_under() {
  local dir="$1" mp
  [ -d "$dir" ] || return 0
  awk '{print $5}' /proc/self/mountinfo | sed 's/\\040/ /g' | { grep -E "^$dir(/|$)" || true; } | awk '{print length, $0}' \
    | sort -rn | cut -d' ' -f2- | while read -r mp; do
      umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || log "could not unmount $mp"
    done
}
umount_under "$S"
umount_under "$KUBELET_ROOT"
for ns in /run/netns/cni-* /var/run/netns/cni-*; do
  [ -e "$ns" ] || continue
  umount "$ns" 2>/dev/null || true
  rm -f "$ns"
done
if ip link show "$CNI_BRIDGE" >/dev/null 2>&1; then ip link delete "$CNI_BRIDGE" || true; fi

# 5. state
rm -rf "$S" 2>/dev/null || { sleep 1; rm -rf "$S"; }
rm -rf "$KUBELET_ROOT" 2>/dev/null || log "could not remove $KUBELET_ROOT completely"
rm -f "$FGPU_ROOT/_out/cluster.env"
log "cluster down (logs kept in $CLUSTER_LOGS)"
