#!/usr/bin/env bash
# Bring up a one-node Kubernetes cluster from locally built upstream binaries, as processes
# (the way Kubernetes' hack/local-up-cluster.sh does): etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, containerd (+ runc, CNI bridge) and kubelet with
# this machine as the node. See docs/local-cluster.md.
#
#   hack/cluster-up.sh [VERSION]      VERSION: 1.37 (default), 1.34, 1.32, 1.31 or a full 1.N.x
#
# Environment knobs:
#   FGPU_FEATURE_GATES=A=true,B=false   extra gates for every component
#   FGPU_RUNTIME_CONFIG=grp/ver=true    extra apiserver --runtime-config entries
#   FGPU_SCHEDULER_CONFIG=file          KubeSchedulerConfiguration to use instead of the
#                                       default (the string __KUBECONFIG__ is replaced)
#   FGPU_SNAPSHOTTER=overlayfs|native   containerd snapshotter (default overlayfs)
#   FGPU_CLUSTER_STATE, FGPU_CLUSTER_LOGS, FGPU_KUBELET_ROOT, FGPU_NODE_NAME
#
# Writes $CLUSTER_STATE/env (source it: KUBECONFIG, NODE_NAME, kubelet paths, ...) and
# copies it to _out/cluster.env. Logs: _out/logs/<component>.log.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

K8S_VERSION="$(resolve_k8s_version "${1:-${K8S_VERSION:-}}" 2>/dev/null)" || {
  # no lockfile yet / not built: k8s-build.sh resolves, locks and builds
  "$FGPU_ROOT/hack/k8s-build.sh" "${1:-${K8S_VERSION:-$DEFAULT_K8S_VERSION}}"
  K8S_VERSION="$(resolve_k8s_version "${1:-${K8S_VERSION:-}}")"
}
MINOR="$(k8s_minor "$K8S_VERSION" | cut -d. -f2)"
BIN="$(k8s_bindir "$K8S_VERSION")"
{ [ -f "$BIN/.complete" ] && [ -x "$(etcd_bin)" ] && [ -x "$(containerd_bindir)/containerd" ]; } \
  || "$FGPU_ROOT/hack/k8s-build.sh" "$K8S_VERSION"

S="$CLUSTER_STATE"
PKI="$S/pki"
KUBELET_ROOT="${FGPU_KUBELET_ROOT:-/var/lib/kubelet}"
CTRD_DIR="$S/containerd"
CTRD_SOCK="$CTRD_DIR/containerd.sock"
HOST_IP="${FGPU_HOST_IP:-$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')}"
HOST_IP="${HOST_IP:-127.0.0.1}"
SNAPSHOTTER="${FGPU_SNAPSHOTTER:-overlayfs}"
CNI_BRIDGE=fgpu0
POD_CIDR="${FGPU_POD_CIDR:-10.244.0.0/24}"

# ---------------------------------------------------------------------------------------
# version-dependent flags
FEATURE_GATES=""
RUNTIME_CONFIG=""
case "$MINOR" in
  31) ;; # no usable DRA: the legacy device-plugin + extender path is tested here
  32) FEATURE_GATES="DynamicResourceAllocation=true"; RUNTIME_CONFIG="resource.k8s.io/v1beta1=true" ;;
  33) FEATURE_GATES="DynamicResourceAllocation=true"; RUNTIME_CONFIG="resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true" ;;
  *) ;; # 1.34+: resource.k8s.io/v1 on by default
esac
[ -n "${FGPU_FEATURE_GATES:-}" ] && FEATURE_GATES="${FEATURE_GATES:+$FEATURE_GATES,}$FGPU_FEATURE_GATES"
[ -n "${FGPU_RUNTIME_CONFIG:-}" ] && RUNTIME_CONFIG="${RUNTIME_CONFIG:+$RUNTIME_CONFIG,}$FGPU_RUNTIME_CONFIG"
gates_flag() { [ -n "$FEATURE_GATES" ] && echo "--feature-gates=$FEATURE_GATES"; true; }
# the same gates as a YAML map for the kubelet config
gates_yaml() {
  [ -n "$FEATURE_GATES" ] || return 0
  echo "featureGates:"
  tr ',' '\n' <<<"$FEATURE_GATES" | sed 's/^\(.*\)=\(.*\)$/  \1: \2/'
}

# ---------------------------------------------------------------------------------------
preflight() {
  ensure_pkgs openssl curl runc containernetworking-plugins iptables iproute2 busybox-static gcc libc6-dev python3 mount util-linux faketime
  [ "$(id -u)" = 0 ] || die "the local cluster needs root (kubelet, containerd, mounts)"
  if [ -d "$S/pids" ] && ls "$S"/pids/*.pid >/dev/null 2>&1; then
    local p alive=0
    for p in "$S"/pids/*.pid; do if pid_alive "$(basename "$p" .pid)"; then alive=1; fi; done
    if [ $alive = 1 ]; then die "a cluster is already running (pid files in $S/pids): run hack/cluster-down.sh first"; fi
    log "stale pid files from a previous run found: cleaning up first"
    "$FGPU_ROOT/hack/cluster-down.sh" --keep-logs
  fi
  local port
  for port in "$APISERVER_PORT" "$ETCD_CLIENT_PORT" "$ETCD_PEER_PORT" 10250 10257 10259; do
    if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then die "port $port is in use: another cluster or service is running"; fi
  done
  mkdir -p "$S" "$CLUSTER_LOGS" "$S/pids"
  # logs of a previous run move aside, so this run's logs are complete and alone
  if ls "$CLUSTER_LOGS"/*.log >/dev/null 2>&1; then
    rm -rf "$CLUSTER_LOGS.prev"; mkdir -p "$CLUSTER_LOGS.prev"; mv "$CLUSTER_LOGS"/* "$CLUSTER_LOGS.prev/" 2>/dev/null || true
  fi
  echo "$K8S_VERSION" >"$S/version"
  log "Kubernetes $K8S_VERSION; state $S; logs $CLUSTER_LOGS; node $NODE_NAME ($HOST_IP)"
}

# ---------------------------------------------------------------------------------------
# certificates and kubeconfigs (one CA signs everything; fine for a throwaway test cluster)
pki() {
  mkdir -p "$PKI"; cd "$PKI"
  if [ ! -f ca.key ]; then
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=fgpu-local-ca" 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  fi
  # cert <name> <subject> <ext: serverAuth|clientAuth> [SANs]
  cert() {
    local name="$1" subj="$2" eku="$3" san="${4:-}"
    [ -f "$name.crt" ] && return 0
    openssl genrsa -out "$name.key" 2048 2>/dev/null
    openssl req -new -key "$name.key" -out "$name.csr" -subj "$subj" 2>/dev/null
    {
      echo "basicConstraints=CA:FALSE"
      echo "keyUsage=critical,digitalSignature,keyEncipherment"
      echo "extendedKeyUsage=$eku"
      [ -n "$san" ] && echo "subjectAltName=$san"
    } >"$name.ext"
    openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$name.crt" -days 3650 -extfile "$name.ext" 2>/dev/null
    rm -f "$name.csr" "$name.ext"
  }
  local svc_ip="10.96.0.1"
  cert apiserver "/CN=kube-apiserver" serverAuth \
    "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:$svc_ip,IP:$HOST_IP"
  cert admin "/O=system:masters/CN=fgpu-admin" clientAuth
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
  cert controller-manager "/CN=system:kube-controller-manager" clientAuth
  cert scheduler "/CN=system:kube-scheduler" clientAuth
  cert kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
  cert kubelet-serving "/CN=$NODE_NAME" serverAuth "DNS:$NODE_NAME,DNS:localhost,IP:127.0.0.1,IP:$HOST_IP"
  local n
  for n in admin controller-manager scheduler kubelet-client; do
    cat >"$n.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: fgpu-local
  cluster:
    certificate-authority: $PKI/ca.crt
    server: https://127.0.0.1:$APISERVER_PORT
users:
- name: $n
  user:
    client-certificate: $PKI/$n.crt
    client-key: $PKI/$n.key
contexts:
- name: fgpu-local
  context: {cluster: fgpu-local, user: $n}
current-context: fgpu-local
EOF
  done
  cd "$FGPU_ROOT"
}

# ---------------------------------------------------------------------------------------
# Per-boot node files on a tmpfs, as /run is on a real node (here /run is a directory of the
# root file system, ext4 mounted with `discard`, where creating a file costs the kernel
# more than the rest of a DRA prepare): $S/run, with the CDI spec dir of the host-process
# plugin ($S/run/cdi, read by containerd) and the plugins' run dirs (tests/e2e/plugin-lib.sh).
# cluster-down unmounts it with everything else under $S.
run_tmpfs() {
  mkdir -p "$S/run"
  mountpoint -q "$S/run" || mount -t tmpfs -o mode=0755,size=256m fgpu-cluster-run "$S/run"
  mkdir -p "$S/run/cdi"
}

start_etcd() {
  mkdir -p "$S/etcd"
  start_bg etcd "$(etcd_bin)" --name fgpu --data-dir "$S/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "fgpu=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "" \
    --quota-backend-bytes 2147483648 --unsafe-no-fsync
  wait_up etcd 60 "etcd health" curl -fsS "http://127.0.0.1:$ETCD_CLIENT_PORT/health" || fail etcd
}

start_apiserver() {
  # shellcheck disable=SC2046 # $(gates_flag) is one word or none: unquoted so that none is no argument
  start_bg kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --bind-address 0.0.0.0 --secure-port "$APISERVER_PORT" --advertise-address "$HOST_IP" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --client-ca-file "$PKI/ca.crt" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP,Hostname \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --authorization-mode Node,RBAC --allow-privileged=true \
    --enable-admission-plugins NodeRestriction \
    ${RUNTIME_CONFIG:+--runtime-config "$RUNTIME_CONFIG"} $(gates_flag) --v=2
  wait_up kube-apiserver 120 "kube-apiserver /readyz" kc get --raw /readyz || fail kube-apiserver
}

start_controller_manager() {
  # shellcheck disable=SC2046 # $(gates_flag) is one word or none: unquoted so that none is no argument
  start_bg kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$PKI/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$PKI/controller-manager.kubeconfig" --authorization-kubeconfig "$PKI/controller-manager.kubeconfig" \
    --client-ca-file "$PKI/ca.crt" --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --service-account-private-key-file "$PKI/sa.key" --use-service-account-credentials=true \
    --service-cluster-ip-range "$SERVICE_CIDR" --allocate-node-cidrs=false \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port 10257 \
    --controllers '*' $(gates_flag) --v=2
  wait_up kube-controller-manager 60 "kube-controller-manager /healthz" curl -fsSk https://127.0.0.1:10257/healthz || fail kube-controller-manager
}

start_scheduler() {
  local cfg="$S/scheduler-config.yaml"
  if [ -n "${FGPU_SCHEDULER_CONFIG:-}" ]; then
    sed "s#__KUBECONFIG__#$PKI/scheduler.kubeconfig#g" "$FGPU_SCHEDULER_CONFIG" >"$cfg"
  else
    # v1 config API since 1.25; profiles and extenders can be added by passing a file
    cat >"$cfg" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $PKI/scheduler.kubeconfig
leaderElection:
  leaderElect: false
profiles:
- schedulerName: default-scheduler
EOF
  fi
  # shellcheck disable=SC2046 # $(gates_flag) is one word or none: unquoted so that none is no argument
  start_bg kube-scheduler "$BIN/kube-scheduler" --config "$cfg" \
    --authentication-kubeconfig "$PKI/scheduler.kubeconfig" --authorization-kubeconfig "$PKI/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 10259 $(gates_flag) --v=2
  wait_up kube-scheduler 60 "kube-scheduler /healthz" curl -fsSk https://127.0.0.1:10259/healthz || fail kube-scheduler
}

# ---------------------------------------------------------------------------------------
start_containerd() {
  mkdir -p "$CTRD_DIR"/{root,state} "$S/cni/net.d" "$S/cni/ipam" /etc/cdi /var/run/cdi
  # CNI: bridge + host-local (loopback is added by containerd itself)
  cat >"$S/cni/net.d/10-fgpu.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "fgpu",
  "plugins": [
    {
      "type": "bridge", "bridge": "$CNI_BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {"type": "host-local", "dataDir": "$S/cni/ipam", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}
    }
  ]
}
EOF
  # Base OCI spec for CRI containers: containerd's default, with RLIMIT_NOFILE at or below
  # this machine's hard limit (a higher one makes runc fail with "operation not permitted").
  local nofile; nofile="$(ulimit -Hn)"; [ "$nofile" = unlimited ] && nofile=1048576
  [ "$nofile" -gt 65536 ] && nofile=65536
  FGPU_NOFILE="$nofile" python3 - "$CTRD_DIR/base-spec.json" <<'EOF'
import json, os, sys
n = int(os.environ["FGPU_NOFILE"])
spec = {
  "ociVersion": "1.1.0",
  "process": {"user": {"uid": 0, "gid": 0}, "cwd": "/", "noNewPrivileges": True,
              "capabilities": {k: ["CAP_CHOWN","CAP_DAC_OVERRIDE","CAP_FSETID","CAP_FOWNER","CAP_MKNOD","CAP_NET_RAW",
                                   "CAP_SETGID","CAP_SETUID","CAP_SETFCAP","CAP_SETPCAP","CAP_NET_BIND_SERVICE",
                                   "CAP_SYS_CHROOT","CAP_KILL","CAP_AUDIT_WRITE"] for k in ("bounding","effective","permitted")},
              "rlimits": [{"type": "RLIMIT_NOFILE", "hard": n, "soft": n}]},
  "root": {"path": "rootfs"},
  "mounts": [
    {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid","noexec","nodev"]},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid","strictatime","mode=755","size=65536k"]},
    {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid","noexec","newinstance","ptmxmode=0666","mode=0620","gid=5"]},
    {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid","noexec","nodev","mode=1777","size=65536k"]},
    {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid","noexec","nodev"]},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid","noexec","nodev","ro"]},
    {"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid","strictatime","mode=755","size=65536k"]}
  ],
  "linux": {
    "resources": {"devices": [{"allow": False, "access": "rwm"}]},
    "namespaces": [{"type": t} for t in ("pid","ipc","uts","mount","network")],
    "maskedPaths": ["/proc/acpi","/proc/asound","/proc/kcore","/proc/keys","/proc/latency_stats","/proc/timer_list",
                    "/proc/timer_stats","/proc/sched_debug","/sys/firmware","/proc/scsi"],
    "readonlyPaths": ["/proc/bus","/proc/fs","/proc/irq","/proc/sys","/proc/sysrq-trigger"]
  }
}
json.dump(spec, open(sys.argv[1], "w"), indent=1)
EOF
  cat >"$CTRD_DIR/config.toml" <<EOF
version = 3
root = "$CTRD_DIR/root"
state = "$CTRD_DIR/state"
[grpc]
  address = "$CTRD_SOCK"
[ttrpc]
  address = "$CTRD_SOCK.ttrpc"
[debug]
  address = "$CTRD_SOCK.debug"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "$SNAPSHOTTER"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "fgpu.local/pause:3.10"
[plugins.'io.containerd.cri.v1.runtime']
  # this sandbox has no CAP_SYS_RESOURCE: runc cannot lower oom_score_adj (kubelet asks -998
  # for sandboxes): "failed to update /proc/self/oom_score_adj: Permission denied"
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi", "$S/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      base_runtime_spec = "$CTRD_DIR/base-spec.json"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$S/cni/net.d"
EOF
  PATH="$(containerd_bindir):$PATH" start_bg containerd "$(containerd_bindir)/containerd" --config "$CTRD_DIR/config.toml" --log-level info
  wait_up containerd 60 "containerd socket" test -S "$CTRD_SOCK" || fail containerd
  wait_up containerd 30 "containerd API" "$(containerd_bindir)/ctr" --address "$CTRD_SOCK" version || fail containerd
  "$FGPU_ROOT/hack/images.sh" import
}

start_kubelet() {
  mkdir -p "$KUBELET_ROOT" "$S/kubelet"
  local extra=""
  [ "$MINOR" -ge 35 ] && extra="failCgroupV1: ${FGPU_FAIL_CGROUPV1:-false}"
  cat >"$S/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CTRD_SOCK
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
address: 0.0.0.0
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
failSwapOn: false
hairpinMode: hairpin-veth
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
# the disk is shared with other builds: a moment of disk pressure must not taint the node for
# the default 5 minutes
evictionPressureTransitionPeriod: ${FGPU_EVICTION_PRESSURE_TRANSITION:-30s}
$(kubelet_cgroup_settings)
$extra
$(gates_yaml)
EOF
  start_bg kubelet "$BIN/kubelet" --config "$S/kubelet/config.yaml" --kubeconfig "$PKI/kubelet-client.kubeconfig" \
    --root-dir "$KUBELET_ROOT" --hostname-override "$NODE_NAME" --node-ip "$HOST_IP" --v=2
  wait_up kubelet 60 "kubelet /healthz" curl -fsS http://127.0.0.1:10248/healthz || fail kubelet
  wait_up kubelet 120 "node $NODE_NAME Ready" node_ready || fail kubelet
}

# Settings that make kubelet work inside this machine's sandbox (see docs/local-cluster.md).
kubelet_cgroup_settings() {
  cat <<EOF
cgroupsPerQOS: ${FGPU_CGROUPS_PER_QOS:-true}
cgroupRoot: /
enforceNodeAllocatable: ${FGPU_ENFORCE_NODE_ALLOCATABLE:-[pods]}
EOF
}

node_ready() {
  [ "$(kc get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

fail() {
  log "$1 did not come up; last lines of $CLUSTER_LOGS/$1.log:"
  tail -25 "$CLUSTER_LOGS/$1.log" >&2 || true
  log "logs kept in $CLUSTER_LOGS; tearing down (set FGPU_KEEP_ON_FAILURE=1 to keep the processes)"
  [ "${FGPU_KEEP_ON_FAILURE:-0}" = 1 ] || "$FGPU_ROOT/hack/cluster-down.sh" --keep-logs || true
  exit 1
}

write_env() {
  # kubectl's discovery cache, fresh per cluster: the shared ~/.kube/cache would keep the
  # resource versions of a cluster of another release (e.g. resourceslices only in v1beta1
  # after a 1.32 run) and make `kubectl get resourceslice` fail for minutes.
  rm -rf "$S/kubectl-cache"
  cat >"$S/env" <<EOF
# source me: the local fgpu test cluster (hack/cluster-up.sh $K8S_VERSION)
export K8S_VERSION=$K8S_VERSION
export KUBECONFIG=$PKI/admin.kubeconfig
export KUBECACHEDIR=$S/kubectl-cache
export PATH=$BIN:\$PATH
export NODE_NAME=$NODE_NAME
export KUBELET_ROOT_DIR=$KUBELET_ROOT
export KUBELET_REGISTRAR_DIR=$KUBELET_ROOT/plugins_registry
export KUBELET_PLUGINS_DIR=$KUBELET_ROOT/plugins
export KUBELET_DEVICE_PLUGINS_DIR=$KUBELET_ROOT/device-plugins
export CDI_SPEC_DIR=$S/run/cdi
export FGPU_CLUSTER_RUN=$S/run
export CONTAINERD_ADDRESS=$CTRD_SOCK
export FGPU_CLUSTER_STATE=$S
export FGPU_CLUSTER_LOGS=$CLUSTER_LOGS
export FGPU_WORKLOAD_IMAGE=fgpu.local/workload:dev
export FGPU_HELM=$(helm_bin)
EOF
  mkdir -p "$FGPU_ROOT/_out"
  cp "$S/env" "$FGPU_ROOT/_out/cluster.env"
}

main() {
  local t0=$SECONDS
  preflight
  # cheap (seconds), and picks up freshly built fake CUDA / libfgpu.so
  { [ "${FGPU_SKIP_IMAGE_BUILD:-0}" = 1 ] && [ -f "$FGPU_ROOT/_out/images/workload.tar" ]; } \
    || "$FGPU_ROOT/hack/images.sh" build
  pki
  run_tmpfs
  write_env
  start_etcd
  start_apiserver
  start_controller_manager
  start_scheduler
  start_containerd
  start_kubelet
  # the default ServiceAccount must exist before pods can be created in a namespace
  wait_for 60 "default ServiceAccount" kc -n default get serviceaccount default || fail kube-controller-manager
  log "cluster up in $((SECONDS - t0))s: source $S/env (or _out/cluster.env)"
  kc get nodes -o wide >&2
}
main
