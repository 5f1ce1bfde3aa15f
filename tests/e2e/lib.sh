# shellcheck shell=bash
# Helpers for e2e scenarios (sourced by tests/e2e/*/test.sh, which hack/e2e.sh runs with the
# cluster's env: KUBECONFIG, NODE_NAME, K8S_VERSION, FGPU_WORKLOAD_IMAGE, E2E_NS, E2E_DIR).
set -euo pipefail
E2E_LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
K8S_MINOR="$(echo "$K8S_VERSION" | cut -d. -f2)"
# The build cache every script reads binaries from (also when a scenario or the bench is run
# outside make, which exports the same default).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${FGPU_CACHE:-/var/cache/fgpu}/target}"

say() { printf '    %s\n' "$*" >&2; }
fail() { printf '    FAIL: %s\n' "$*" >&2; exit 1; }
skip() { printf '    SKIP: %s\n' "$*" >&2; exit 77; }
kc() { kubectl "$@"; }

# wait_until <seconds> <description> <cmd...>
wait_until() {
  local t="$1" what="$2"; shift 2
  local deadline=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "timed out after ${t}s: $what"
    sleep 1
  done
}
# jp <kind/name> <jsonpath> [namespace]
jp() { kubectl get "$1" -n "${3:-$E2E_NS}" -o "jsonpath=$2" 2>/dev/null; }
jp_eq() { [ "$(jp "$1" "$2" "${4:-$E2E_NS}")" = "$3" ]; }
jp_nonempty() { [ -n "$(jp "$1" "$2" "${3:-$E2E_NS}")" ]; }
assert_eq() { # assert_eq <what> <expected> <actual>
  [ "$2" = "$3" ] || fail "$1: expected '$2', got '$3'"
  say "ok: $1 = $3"
}
# deploy/deviceclasses.yaml with its apiVersion set to the version the cluster serves ($api,
# from dra_api_version; the spec is the same in every version).
# shellcheck disable=SC2154 # $api: set by the scenario (dra_api_version)
shipped_classes() { sed "s#^apiVersion: resource.k8s.io/v1\$#apiVersion: resource.k8s.io/$api#" "$E2E_LIB_DIR/../../deploy/deviceclasses.yaml"; }
# What the scenarios apply (a scenario may redefine it; tests/e2e/42 does).
classes() { shipped_classes; }
# The resource.k8s.io version this cluster serves for claims: v1 (1.34+), v1beta1 (1.32/1.33), none
dra_api_version() {
  if [ "$K8S_MINOR" -ge 34 ]; then echo v1
  elif [ "$K8S_MINOR" -ge 32 ]; then echo v1beta1
  else echo none; fi
}
# apply a manifest after substituting __NODE_NAME__, __NS__, __IMAGE__
apply_tmpl() {
  sed -e "s#__NODE_NAME__#$NODE_NAME#g" -e "s#__NS__#$E2E_NS#g" -e "s#__IMAGE__#$FGPU_WORKLOAD_IMAGE#g" "$1" \
    | kubectl apply -f - >&2
}
delete_tmpl() {
  sed -e "s#__NODE_NAME__#$NODE_NAME#g" -e "s#__NS__#$E2E_NS#g" -e "s#__IMAGE__#$FGPU_WORKLOAD_IMAGE#g" "$1" \
    | kubectl delete --ignore-not-found --wait=false -f - >&2 || true
}

# whole_gpu_claim <name>: a ResourceClaim <name> of the whole-GPU class gpu.fgpu.dev, in the
# shape of the served version ($(dra_api_version)).
whole_gpu_claim() {
  local api req
  api="$(dra_api_version)"
  if [ "$api" = v1 ]; then req="      exactly: {deviceClassName: gpu.fgpu.dev}"
  else req="      deviceClassName: gpu.fgpu.dev"; fi
  kubectl apply -f - >&2 <<YAML
apiVersion: resource.k8s.io/$api
kind: ResourceClaim
metadata: {name: $1, namespace: $E2E_NS}
spec:
  devices:
    requests:
    - name: gpu
$req
YAML
}
# probe_pod <name> claim/<claim>|template/<template> [fgpu-probe args...]: a pod <name> (uid
# 1000, never restarted, 1 s grace) whose one container has the claim <claim>, or one made
# from <template>; it runs fgpu-probe with the args (plain words, joined into a sh -c line),
# prints probe_done and stays up. Without args it only stays up.
probe_pod() {
  local name="$1" ref="$2" kind cmd="exec sleep 3600"
  shift 2
  case "$ref" in
    claim/*) kind=resourceClaimName ;;
    template/*) kind=resourceClaimTemplateName ;;
    *) fail "probe_pod $name: '$ref' is neither claim/<name> nor template/<name>" ;;
  esac
  [ $# -eq 0 ] || cmd="/usr/local/bin/fgpu-probe $*; echo probe_done; $cmd"
  kubectl apply -f - >&2 <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $name, namespace: $E2E_NS}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  resourceClaims: [{name: gpu, $kind: ${ref#*/}}]
  securityContext: {runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true}
  containers:
  - name: probe
    image: $FGPU_WORKLOAD_IMAGE
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "$cmd"]
    resources: {claims: [{name: gpu}]}
YAML
}
# whole_gpu_probe <name> <step MiB>: whole_gpu_claim <name> and probe_pod <name> running
# fgpu-probe against it (allocating <step MiB> at a time, up to the whole card).
whole_gpu_probe() {
  whole_gpu_claim "$1"
  probe_pod "$1" "claim/$1" --step-mib "$2" --max-gib 100
}
