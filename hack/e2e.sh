#!/usr/bin/env bash
# e2e runner: build what is missing (cached), bring the local cluster up once, run the
# scenarios under tests/e2e/ (each a folder with manifests and a test.sh), collect
# diagnostics on failure, tear down.
#
#   hack/e2e.sh [VERSION] [SCENARIO_GLOB]      e.g. hack/e2e.sh 1.34 '10-*'
#
#   FGPU_E2E_KEEP=1           leave the cluster up afterwards (tear down with make cluster-down)
#   FGPU_E2E_REUSE=1          use an already running cluster (do not bring up / tear down)
#   FGPU_E2E_TIMEOUT=300      seconds per scenario; a scenario whose test.sh has a line
#                             `# e2e-timeout: N` gets N seconds instead (a longer one)
# Exit status 0 only when every scenario passed (skipped ones count as passed).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

K8S_VERSION="${1:-${K8S_VERSION:-}}"
GLOB="${2:-${E2E_SCENARIOS:-[0-9]*}}"
TIMEOUT="${FGPU_E2E_TIMEOUT:-300}"
E2E_LOGS="$CLUSTER_LOGS/e2e"
t0=$SECONDS

started=0
finish() {
  local rc=$?
  if [ $rc -ne 0 ] && [ -f "$CLUSTER_STATE/env" ]; then collect_diagnostics || true; fi
  if [ $started = 1 ] && [ "${FGPU_E2E_KEEP:-0}" != 1 ]; then
    "$FGPU_ROOT/hack/cluster-down.sh" || log "tear-down failed"
  fi
  [ $rc -eq 0 ] || log "e2e FAILED; logs: $CLUSTER_LOGS"
  log "e2e took $((SECONDS - t0))s"
  exit $rc
}
trap finish EXIT
trap 'exit 130' INT TERM

collect_diagnostics() {
  # shellcheck disable=SC1091
  source "$CLUSTER_STATE/env"
  local d="$CLUSTER_LOGS/diagnostics"
  mkdir -p "$d"
  log "collecting diagnostics into $d"
  timeout 60 kubectl get nodes -o wide >"$d/nodes.txt" 2>&1 || true
  timeout 60 kubectl describe nodes >"$d/nodes-describe.txt" 2>&1 || true
  timeout 60 kubectl get all,resourceclaims,resourceclaimtemplates -A -o wide >"$d/objects.txt" 2>&1 || true
  timeout 60 kubectl get resourceslices,deviceclasses -o yaml >"$d/dra-cluster.yaml" 2>&1 || true
  timeout 60 kubectl get resourceclaims -A -o yaml >"$d/resourceclaims.yaml" 2>&1 || true
  timeout 60 kubectl describe pods -A >"$d/pods-describe.txt" 2>&1 || true
  timeout 60 kubectl get events -A --sort-by=.lastTimestamp >"$d/events.txt" 2>&1 || true
  timeout 30 "$(containerd_bindir)/ctr" --address "$CONTAINERD_ADDRESS" -n k8s.io containers ls >"$d/containers.txt" 2>&1 || true
}

if [ "${FGPU_E2E_REUSE:-0}" = 1 ] && [ -f "$CLUSTER_STATE/env" ]; then
  log "reusing the running cluster"
else
  started=1
  if [ -d "$CLUSTER_STATE" ]; then
    log "a cluster (or what a dead run left) exists in $CLUSTER_STATE: tearing it down first"
    "$FGPU_ROOT/hack/cluster-down.sh"
  fi
  "$FGPU_ROOT/hack/cluster-up.sh" ${K8S_VERSION:+"$K8S_VERSION"}
fi
# shellcheck disable=SC1091
source "$CLUSTER_STATE/env"
mkdir -p "$E2E_LOGS"

passed=0 failed=0 skipped=0 failures=()
for dir in "$FGPU_ROOT"/tests/e2e/$GLOB/; do
  [ -x "$dir/test.sh" ] || continue
  name="$(basename "$dir")"
  ns="e2e-$(echo "$name" | tr -c 'a-z0-9\n' '-' | cut -c1-40)-$RANDOM"
  kubectl create namespace "$ns" >/dev/null
  # pods need the namespace's default ServiceAccount
  wait_for 30 "ServiceAccount default in $ns" kubectl -n "$ns" get serviceaccount default || true
  log "scenario $name (namespace $ns)"
  st=$SECONDS rc=0
  limit="$(sed -n 's/^# e2e-timeout: *\([0-9][0-9]*\)$/\1/p' "$dir/test.sh" | head -1)"
  limit="${limit:-$TIMEOUT}"
  E2E_NS="$ns" E2E_DIR="${dir%/}" timeout --kill-after=10 "$limit" "$dir/test.sh" >"$E2E_LOGS/$name.log" 2>&1 || rc=$?
  sed 's/^/  /' "$E2E_LOGS/$name.log" >&2
  case $rc in
    0) passed=$((passed + 1)); log "PASS $name ($((SECONDS - st))s)" ;;
    77) skipped=$((skipped + 1)); log "SKIP $name" ;;
    124|137) failed=$((failed + 1)); failures+=("$name"); log "FAIL $name: timed out after ${limit}s" ;;
    *) failed=$((failed + 1)); failures+=("$name"); log "FAIL $name (exit $rc, $((SECONDS - st))s)" ;;
  esac
  if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then collect_diagnostics; cp -r "$CLUSTER_LOGS/diagnostics" "$E2E_LOGS/$name.diagnostics" 2>/dev/null || true; fi
  kubectl delete namespace "$ns" --wait=true --timeout=60s >/dev/null 2>&1 \
    || log "namespace $ns was not deleted in 60s"
done

[ $((passed + failed + skipped)) -gt 0 ] || die "no scenario matched tests/e2e/$GLOB"
log "e2e on Kubernetes $K8S_VERSION: ${failures[*]:+failed: ${failures[*]}}"
echo "e2e: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
