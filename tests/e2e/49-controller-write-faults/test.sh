#!/usr/bin/env bash
# Scenario: fgpu-controller writes a pass's allocations side by side (--concurrent-writes 16)
# while the API server makes them slow and refuses some, and another writer changes the
# claims under it; it still never over-grants and ends with every claim allocated.
#
# Inventory: 4 nodes x 8 H100 as ResourceSlices shaped as the kubelet plugin publishes them
# (hack/replay.py inventory; no kubelet, no kwok: nothing has to run). Workload (claims.csv):
# 84 claims of shared.gpu.fgpu.dev, 64 quarter GPUs, 16 halves, 4 whole GPUs (28 of the 32
# GPUs), each with a gated pod, all created before the controller starts.
# Faults, all through the real API server: a validating webhook on ResourceClaim updates
# (the controller's finalizer patch and status write; faults.py) holds each request 0-250 ms
# and refuses one in ten as a conflict (409), one in twenty as an internal error (500) and
# one in twenty as unavailable (503; the kube client retries those itself, with backoff, so
# they slow the writes down but rarely reach the controller); and a
# second writer merge-patches an annotation of random claims every 20 ms, so the
# controller's writes, conditional on the version it planned from, meet newer ones.
#
# Asserted: every claim allocated within 180 s; no device gives more memory or cores than
# its slice publishes, no whole-device result beside another (from the claims); the
# controller counted conflicts and API failures; the webhook saw more than one of the
# controller's writes in flight at once (the writes are concurrent); every pod's gate lifted.
# Seen failing first: with --concurrent-writes 1 the last assertion fails (at most one in
# flight). Needs consumable capacity (1.36+); skipped elsewhere.
source "$(dirname "$0")/../lib.sh"
api="$(dra_api_version)"
[ "$K8S_MINOR" -ge 36 ] || skip "Kubernetes $K8S_VERSION: no consumable capacity by default (1.36+)"
source "$E2E_DIR/../controller-lib.sh"
root="$(cd "$E2E_DIR/../../.." && pwd)"
work="$(mktemp -d /tmp/fgpu-e2e-49.XXXXXX)"
mkdir -p "$work/bin"
replay() { python3 "$root/hack/replay.py" "$@"; }
FAULTS_ADDR=127.0.0.1:19461
hook_pid="" poke_pid="" vwc=fgpu-e2e-49-write-faults

cleanup() {
  local rc=$?
  kubectl delete validatingwebhookconfiguration "$vwc" --ignore-not-found >/dev/null 2>&1 || true
  touch "$work/stop"
  stop_pid "$poke_pid"
  stop_pid "$hook_pid"
  replay wipe "$E2E_NS" >/dev/null 2>&1 || true
  controller_cleanup $rc
  replay wipe-inventory >/dev/null 2>&1 || true
  classes | kubectl delete -f - --ignore-not-found >/dev/null 2>&1 || true
  [ "$rc" -ne 0 ] || rm -rf "$work"
  exit $rc
}
trap cleanup EXIT

controller_setup
classes | kubectl apply -f - >&2
say "inventory: $(replay inventory "$E2E_DIR/nodes.csv")"
say "created: $(replay create "$E2E_NS" "$E2E_DIR/claims.csv" faults gpu.fgpu.dev/allocate "$E2E_DIR/nodes.csv")"
claims=$(($(wc -l <"$E2E_DIR/claims.csv") - 1))

# --- the faults: a slow, refusing webhook on claim updates, and a second writer
python3 "$E2E_DIR/faults.py" webhook "${FAULTS_ADDR#*:}" "$work/pki/tls.crt" "$work/pki/tls.key" "$work/faults.json" \
  </dev/null >"$work/faults.log" 2>&1 &
hook_pid=$!
wait_until 10 "the fault webhook serving" test -s "$work/faults.json"
kubectl apply -f - >&2 <<YAML
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: $vwc}
webhooks:
- name: write-faults.e2e.fgpu.dev
  clientConfig: {url: "https://$FAULTS_ADDR/", caBundle: "$(cat "$work/pki/ca.b64")"}
  rules:
  - {apiGroups: [resource.k8s.io], apiVersions: ["*"], operations: [UPDATE], resources: [resourceclaims, resourceclaims/status]}
  namespaceSelector: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: In, values: [$E2E_NS]}]}
  failurePolicy: Fail
  sideEffects: None
  timeoutSeconds: 5
  admissionReviewVersions: [v1]
YAML
# The webhook is in the path once a poke is seen by it.
python3 "$E2E_DIR/faults.py" poke "$E2E_NS" "$work/stop" </dev/null >"$work/poke.log" 2>&1 &
poke_pid=$!
seen() { python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["requests"] > 0 else 1)' "$work/faults.json"; }
wait_until 30 "the API server calling the fault webhook" seen
say "faults in place: $(cat "$work/faults.json")"

# --- the controller, writing side by side
t0=$SECONDS
start_controller --mode controller --default-policy binpack --concurrent-writes "${FGPU_E2E_CONCURRENT_WRITES:-16}"
all_allocated() { [ "$(kubectl -n "$E2E_NS" get resourceclaims -o jsonpath='{range .items[*]}{.status.allocation.devices.results[0].pool}{"\n"}{end}' | grep -c .)" -eq "$claims" ]; }
wait_until 180 "all $claims claims allocated despite the faults" all_allocated
say "ok: all $claims claims allocated in $((SECONDS - t0))s; faults: $(cat "$work/faults.json")"
touch "$work/stop"
stop_pid "$poke_pid"; poke_pid=""

out="$(replay check "$E2E_NS")" || fail "over-grant: $out"
say "ok: no device over-granted: $out"
metric() { curl -s "http://$CONTROLLER_METRICS_ADDR/metrics" | sed -n "s/^fgpu_controller_allocation_failures_total{reason=\"$1\"} //p"; }
conflicts="$(metric conflict)" apierr="$(metric api)"
say "controller: failures conflict=${conflicts:-0} api=${apierr:-0}"
[ "${conflicts:-0}" -gt 0 ] || fail "the controller counted no conflict (the faults did not reach its writes?)"
[ "${apierr:-0}" -gt 0 ] || fail "the controller counted no API failure (the 500s did not reach its writes?)"
most="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["max_in_flight"])' "$work/faults.json")"
[ "$most" -gt 1 ] || fail "at most $most claim write(s) in flight at once: the writes are not concurrent"
say "ok: up to $most claim writes in flight at once"

kubectl delete validatingwebhookconfiguration "$vwc" >&2
ungated() { [ -z "$(kubectl -n "$E2E_NS" get pods -o jsonpath='{range .items[*]}{.spec.schedulingGates[*].name}{end}')" ]; }
wait_until 60 "every pod's gate lifted" ungated
say "PASS: $claims claims allocated through slow, refused and conflicting writes, $most at once, none over-granted"
