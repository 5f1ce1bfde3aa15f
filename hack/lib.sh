# shellcheck shell=bash
# Common settings and helpers for the local-cluster harness (hack/*.sh).
# Sourced, never executed. See docs/local-cluster.md.

# shellcheck disable=SC2034 # the settings below are read by the scripts that source this file
set -euo pipefail

FGPU_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export FGPU_CACHE="${FGPU_CACHE:-/var/cache/fgpu}"
# Cargo builds run by these scripts go to the cache, as make's do (not to ./target).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$FGPU_CACHE/target}"
# Default Kubernetes minor; the patch is pinned by tests/k8s/v<minor>/go.mod.
DEFAULT_K8S_VERSION="${DEFAULT_K8S_VERSION:-1.37}"

# Go: one module + build cache for every build of the harness, so versions share downloads.
export GOMODCACHE="${FGPU_GOMODCACHE:-$FGPU_CACHE/go/mod}"
export GOCACHE="${FGPU_GOCACHE:-$FGPU_CACHE/go/cache}"
export GOFLAGS="-mod=mod -buildvcs=false"
export GOTOOLCHAIN=local
[ -x /usr/local/go/bin/go ] && case ":$PATH:" in *:/usr/local/go/bin:*) ;; *) PATH="$PATH:/usr/local/go/bin" ;; esac

# Cluster state, pid files and logs.
CLUSTER_STATE="${FGPU_CLUSTER_STATE:-/var/lib/fgpu-cluster}"
CLUSTER_LOGS="${FGPU_CLUSTER_LOGS:-$FGPU_ROOT/_out/logs}"
NODE_NAME="${FGPU_NODE_NAME:-fgpu-node}"
APISERVER_PORT="${FGPU_APISERVER_PORT:-6443}"
ETCD_CLIENT_PORT="${FGPU_ETCD_PORT:-23790}"
ETCD_PEER_PORT="$((ETCD_CLIENT_PORT + 1))"
SERVICE_CIDR="${FGPU_SERVICE_CIDR:-10.96.0.0/16}"
POD_CIDR="${FGPU_POD_CIDR:-10.88.0.0/16}"
CLUSTER_DNS_IP="10.96.0.10"

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; exit 1; }

# k8s_minor 1.37.2 -> 1.37 ; accepts v-prefixed input
k8s_minor() { local v="${1#v}"; echo "$v" | cut -d. -f1,2; }
k8s_lockdir() { echo "$FGPU_ROOT/tests/k8s/v$(k8s_minor "$1")"; }
# The Kubernetes release pinned by the lockfile of a minor ("1.37.2"), empty if none yet.
k8s_pinned() {
  local gm; gm="$(k8s_lockdir "$1")/go.mod"
  [ -f "$gm" ] || return 0
  grep -Eo 'k8s.io/kubernetes v1\.[0-9]+\.[0-9]+' "$gm" | head -1 | sed 's/.* v//'
}
k8s_bindir() { echo "$FGPU_CACHE/k8s/$1/bin"; }

# Versions of the non-Kubernetes tools, read from their lockfiles.
tool_version() { # tool_version <dir under tests/k8s> <module>
  grep -Eo "$2 v[0-9][^ ]*" "$FGPU_ROOT/tests/k8s/$1/go.mod" | head -1 | sed 's/.* v//'
}
tools_bindir() { echo "$FGPU_CACHE/k8s/tools/$1/bin"; } # tools_bindir <name-version>
etcd_bin() { echo "$(tools_bindir "etcd-$(tool_version etcd go.etcd.io/etcd/server/v3)")/etcd"; }
containerd_bindir() { tools_bindir "containerd-$(tool_version containerd github.com/containerd/containerd/v2)"; }
helm_bin() { echo "$(tools_bindir "helm-$(tool_version helm helm.sh/helm/v3)")/helm"; }

# Resolve a user-supplied version (1.37, v1.37.2, empty) to the pinned full version.
resolve_k8s_version() {
  local want="${1:-$DEFAULT_K8S_VERSION}" pinned
  want="${want#v}"
  pinned="$(k8s_pinned "$want")"
  if [ -z "$pinned" ]; then
    die "no lockfile for Kubernetes $(k8s_minor "$want") (tests/k8s/v$(k8s_minor "$want")/go.mod); run: hack/k8s-build.sh $want"
  fi
  case "$want" in
    *.*.*) [ "$want" = "$pinned" ] || die "Kubernetes $want requested but tests/k8s/v$(k8s_minor "$want")/go.mod pins $pinned" ;;
  esac
  echo "$pinned"
}

# Builds the crates.io tool <crate> at exactly <version> into $FGPU_CACHE/tools/<crate>-<version>
# once per machine (cargo install --locked; one build at a time, a second caller waits and
# then finds it; its build directory is removed afterwards) and prints the binary's path.
#   bin="$(cached_cargo_tool cargo-deny 0.20.2)"
cached_cargo_tool() {
  local crate="$1" version="$2" root bin build_dir partial start
  root="$FGPU_CACHE/tools/$crate-$version"
  bin="$root/bin/$crate"
  if [ ! -x "$bin" ]; then
    mkdir -p "$FGPU_CACHE/tools"
    exec 9>"$FGPU_CACHE/tools/.$crate.lock"
    flock 9
    if [ ! -x "$bin" ]; then
      build_dir="$FGPU_CACHE/target-$crate-install"
      partial="$root.partial"
      rm -rf "$partial" "$build_dir"
      log "building $crate $version into $root (once per machine)"
      start=$SECONDS
      CARGO_TARGET_DIR="$build_dir" cargo install --quiet --locked "$crate" \
        --version "=$version" --root "$partial" >&2
      mv "$partial" "$root"
      rm -rf "$build_dir"
      log "$crate $version built in $((SECONDS - start))s"
    fi
    exec 9>&-
  fi
  echo "$bin"
}

# Install Debian packages that are missing (idempotent; apt-get update only when needed).
APT_UPDATED_STAMP=/var/lib/apt/periodic/fgpu-apt-updated
ensure_pkgs() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  if [ ! -f "$APT_UPDATED_STAMP" ] || ! apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    mkdir -p "$(dirname "$APT_UPDATED_STAMP")" && touch "$APT_UPDATED_STAMP"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# Wait until a command succeeds: wait_for <seconds> <description> <cmd...>
wait_for() {
  local timeout="$1" what="$2"; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "timed out after ${timeout}s waiting for: $what"
      return 1
    fi
    sleep 1
  done
}

# wait_up <component> <seconds> <description> <cmd...>: like wait_for, but gives up at once
# when the component's process has exited (its log says why).
wait_up() {
  local name="$1" timeout="$2" what="$3"; shift 3
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ! pid_alive "$name"; then log "$name exited while waiting for: $what"; return 1; fi
    if [ "$SECONDS" -ge "$deadline" ]; then log "timed out after ${timeout}s waiting for: $what"; return 1; fi
    sleep 1
  done
}

# Process management: only processes we started, by recorded pid.
pidfile() { echo "$CLUSTER_STATE/pids/$1.pid"; }
# Is the process recorded in the pid file alive and still the one we started?
pid_alive() {
  local f; f="$(pidfile "$1")"
  [ -f "$f" ] || return 1
  local pid start; read -r pid start <"$f" || return 1
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  # guard against pid reuse: compare the start time recorded at launch
  [ -z "$start" ] || [ "$(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null)" = "$start" ]
}
# start_bg <name> <cmd...>: run in the background, logs to $CLUSTER_LOGS/<name>.log
start_bg() {
  local name="$1"; shift
  mkdir -p "$CLUSTER_STATE/pids" "$CLUSTER_LOGS"
  if pid_alive "$name"; then die "$name already running (pid $(cut -d' ' -f1 "$(pidfile "$name")")); run hack/cluster-down.sh first"; fi
  log "starting $name"
  # setsid: own session, so a Ctrl-C of the caller does not hit it and we can stop its group
  setsid "$@" >>"$CLUSTER_LOGS/$name.log" 2>&1 </dev/null &
  local pid=$!
  sleep 0.2
  echo "$pid $(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null)" >"$(pidfile "$name")"
}
# Where client-go's in-cluster configuration reads its token and CA (a fixed path).
# hack/volcano-install.sh bind-mounts a directory there for vc-scheduler, in a mount
# namespace of its own, creating the (empty) mount point on the host if missing and
# marking that in <state>/created-mount-point.
SA_MOUNT_POINT=/var/run/secrets/kubernetes.io/serviceaccount
# remove_sa_mount_point <volcano state dir>: removes the empty mount point if the install
# created it (rmdir only: never anything with files in it).
remove_sa_mount_point() {
  [ -f "$1/created-mount-point" ] || return 0
  rmdir "$SA_MOUNT_POINT" "$(dirname "$SA_MOUNT_POINT")" "$(dirname "$(dirname "$SA_MOUNT_POINT")")" 2>/dev/null || true
}
# stop_pid <name> [timeout]: SIGTERM, then SIGKILL, the recorded pid only
stop_pid() {
  local name="$1" t="${2:-20}" f pid
  f="$(pidfile "$name")"
  [ -f "$f" ] || return 0
  if pid_alive "$name"; then
    pid="$(cut -d' ' -f1 "$f")"
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    local i=0
    while [ -d "/proc/$pid" ] && [ $i -lt $((t * 5)) ]; do sleep 0.2; i=$((i + 1)); done
    if [ -d "/proc/$pid" ]; then log "$name did not stop in ${t}s, SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; sleep 0.5; fi
  fi
  rm -f "$f"
}

# delete_crds <group suffix> <what>: delete every CRD whose name ends in <group suffix> (e.g.
# .kueue.x-k8s.io), and with them their objects, on the running cluster (kubectl from its
# env). The objects' finalizers are dropped first: with the operator that owns them stopped,
# nobody removes them and the CRDs' deletion would wait for their objects forever.
delete_crds() {
  local suffix="$1" what="$2" names crd
  mapfile -t names < <(kubectl get crd -o name 2>/dev/null | grep -- "${suffix//./\\.}\$" || true)
  [ ${#names[@]} -gt 0 ] || return 0
  for crd in "${names[@]}"; do
    kubectl get "${crd#*/}" -A -o jsonpath='{range .items[?(@.metadata.finalizers)]}{.metadata.namespace}{" "}{.metadata.name}{"\n"}{end}' 2>/dev/null \
      | while read -r ns name; do
          [ -n "$name" ] || { name="$ns"; ns=""; }
          kubectl patch "${crd#*/}" "$name" ${ns:+-n "$ns"} --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
        done
  done
  kubectl delete --wait=true --timeout=60s "${names[@]}" >/dev/null || log "$what's CRDs were not all deleted in 60s"
}
kubectl_bin() { echo "$(k8s_bindir "$K8S_VERSION")/kubectl"; }
kc() { "$(kubectl_bin)" --kubeconfig "$CLUSTER_STATE/pki/admin.kubeconfig" "$@"; }
# restart_recorded NAME SECONDS [FLAG...]: stop the cluster's NAME (its recorded pid; SIGKILL
# after 5 s: a crash more than a shutdown, a loaded API server takes over a minute to drain),
# keep it down SECONDS, start it again with the command line cluster-up gave it plus FLAGs.
# The first call keeps that command line in $CLUSTER_STATE/NAME.cmdline, so a later call
# without FLAGs restores it. For the e2e chaos scenarios (tests/e2e/9*).
restart_recorded() {
  local name="$1" down="$2" saved="$CLUSTER_STATE/$1.cmdline" pid cmd=()
  shift 2
  if [ ! -s "$saved" ]; then
    pid_alive "$name" || die "$name is not running"
    pid="$(cut -d' ' -f1 "$(pidfile "$name")")"
    cp "/proc/$pid/cmdline" "$saved"
  fi
  mapfile -d '' -t cmd <"$saved"
  stop_pid "$name" 5
  sleep "$down"
  start_bg "$name" "${cmd[@]}" "$@"
}
# restart_apiserver [--down SECONDS] [FLAG...]: restart_recorded kube-apiserver (e.g. with
# --runtime-config resource.k8s.io/v1=false), then wait until it serves (/livez) and, without
# FLAGs, until it is ready (/readyz: with a DRA version switched off it never is, its own
# ResourceSlice informer cannot start).
restart_apiserver() {
  local down=0
  if [ "${1:-}" = --down ]; then down="$2"; shift 2; fi
  restart_recorded kube-apiserver "$down" "$@"
  wait_up kube-apiserver 120 "kube-apiserver /livez" kc get --raw /livez || return 1
  [ $# -gt 0 ] || wait_up kube-apiserver 120 "kube-apiserver /readyz" kc get --raw /readyz
}
# restart_etcd [--down SECONDS]: restart_recorded etcd, then wait until it is healthy and the
# API server ready again.
restart_etcd() {
  local down=0
  if [ "${1:-}" = --down ]; then down="$2"; shift 2; fi
  restart_recorded etcd "$down"
  wait_up etcd 60 "etcd health" curl -fsS "http://127.0.0.1:$ETCD_CLIENT_PORT/health" || return 1
  wait_up kube-apiserver 120 "kube-apiserver /readyz" kc get --raw /readyz
}
