# shellcheck shell=bash
# Helpers for the scenarios that run fgpu-controller as a host process (tests/e2e/4*-controller*;
# sourced after lib.sh and plugin-lib.sh, after plugin_setup, which made $work).
#
#   controller_setup     build this checkout's fgpu-controller (no-op when up to date), copy it
#                        to $work/bin; webhook certificates (hack/webhook-certs.sh) in $work/pki
#   start_controller [args...]  start `fgpu-controller run` against the cluster
#                        ($controller_pid, log $work/controller$CONTROLLER_TAG.log, webhooks on
#                        $CONTROLLER_WEBHOOK_ADDR, metrics on $CONTROLLER_METRICS_ADDR; set these
#                        to run a second replica); extra args are appended; waits for /readyz
#   stop_pid <pid>       SIGTERM, SIGKILL after 10 s
#   stop_controller      SIGTERM, SIGKILL after 10 s — only the pid this scenario started
#   register_webhooks    apply deploy/controller/webhooks.yaml rendered for this scenario:
#                        clientConfig.url https://$CONTROLLER_WEBHOOK_ADDR/..., the CA of
#                        $work/pki, failurePolicy Fail, only the namespace $E2E_NS
#   controller_cleanup <rc>  webhooks deleted, controller stopped, log tail on failure
#   release_workloads    (in a cleanup, before controller_cleanup) the scenario's pods deleted,
#                        30 s for the controller to release their claims' finalizers, then
#                        what is left stripped, so that the namespace can go
#   burst_claims         one line per claim of $E2E_NS: name, device(s), granted memory
#   burst_allocated      how many claims of $E2E_NS are allocated
#   burst_check_once <log>...  the 3Gi burst (41-controller-failover/burst.yaml) allocated
#                        exactly once over the given controller logs (one "allocated on" line
#                        per claim: 50, or 49 when a replica died between its write and its
#                        log line), one result per claim, no GPU over 81559Mi
#   render <file>        a scenario manifest with __RAPI__ (the served resource.k8s.io version,
#                        $api), __REQ__ (a request of the shared class in that version's
#                        shape), __NS__ and __IMAGE__ filled in
# shellcheck disable=SC2034 # used by the scripts that source this file
CONTROLLER_WEBHOOK_ADDR="${FGPU_E2E_WEBHOOK_ADDR:-127.0.0.1:19443}"
CONTROLLER_METRICS_ADDR="${FGPU_E2E_CONTROLLER_METRICS:-127.0.0.1:19500}"
controller_pid=""
webhook_file=""

controller_setup() {
  local target profile="${FGPU_E2E_PROFILE:-debug}" flags=()
  target="${CARGO_TARGET_DIR:-${FGPU_CACHE:-/var/cache/fgpu}/target}/$profile"
  [ "$profile" = debug ] || flags=(--profile "$profile")
  (cd "$E2E_LIB_DIR/../.." && cargo build -q "${flags[@]}" -p fgpu-controller --bin fgpu-controller) >&2 \
    || fail "cargo build -p fgpu-controller failed"
  cp "$target/fgpu-controller" "$work/bin/"
  "$E2E_LIB_DIR/../../hack/webhook-certs.sh" "$work/pki" "IP:${CONTROLLER_WEBHOOK_ADDR%:*}" >&2
}
start_controller() {
  MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-2}" RUST_LOG="${FGPU_E2E_CONTROLLER_LOG:-info}" "$work/bin/fgpu-controller" run \
    --kubeconfig "$KUBECONFIG" \
    --webhook-addr "$CONTROLLER_WEBHOOK_ADDR" --tls-cert "$work/pki/tls.crt" --tls-key "$work/pki/tls.key" \
    --metrics-address "$CONTROLLER_METRICS_ADDR" --resync-seconds 5 "$@" \
    </dev/null >>"$work/controller${CONTROLLER_TAG:-}.log" 2>&1 &
  controller_pid=$!
  say "controller started (pid $controller_pid): $*"
  wait_until 30 "controller ready (/readyz)" curl -sf "http://$CONTROLLER_METRICS_ADDR/readyz"
}
stop_pid() {
  [ -n "$1" ] || return 0
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
stop_controller() {
  stop_pid "$controller_pid"
  controller_pid=""
}
register_webhooks() {
  webhook_file="$work/webhooks.yaml"
  sed -e "s#service: {namespace: fgpu-system, name: fgpu-controller, path: \([^,]*\), port: 443}#url: https://$CONTROLLER_WEBHOOK_ADDR\1#" \
      -e "s#__CA_BUNDLE__#$(cat "$work/pki/ca.b64")#" \
      -e "s#operator: NotIn, values: \[kube-system, fgpu-system\]#operator: In, values: [$E2E_NS]#" \
      -e "s#failurePolicy: Ignore#failurePolicy: Fail#" \
      "$E2E_LIB_DIR/../../deploy/controller/webhooks.yaml" >"$webhook_file"
  grep -q "url: https://$CONTROLLER_WEBHOOK_ADDR/mutate-pods" "$webhook_file" || fail "rendering $webhook_file"
  kubectl apply -f "$webhook_file" >&2
}
release_workloads() {
  kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  timeout 30 sh -c "while kubectl -n $E2E_NS get resourceclaims -o name | grep -q .; do sleep 1; done" 2>/dev/null || true
  local c
  for c in $(kubectl -n "$E2E_NS" get resourceclaims -o name 2>/dev/null); do
    kubectl -n "$E2E_NS" patch "$c" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
  done
}
controller_cleanup() {
  local rc="$1"
  [ -z "$webhook_file" ] || kubectl delete -f "$webhook_file" --ignore-not-found >/dev/null 2>&1 || true
  stop_controller
  if [ "$rc" -ne 0 ] && [ -n "$work" ]; then
    for f in "$work"/controller*.log; do
      [ -f "$f" ] || continue
      say "$(basename "$f") (last 60 lines):"; tail -60 "$f" | sed 's/^/      /' >&2
    done
  fi
}
burst_claims() {
  kubectl -n "$E2E_NS" get resourceclaims -o jsonpath='{range .items[*]}{.metadata.name} {.status.allocation.devices.results[*].device} {.status.allocation.devices.config[-1:].opaque.parameters.memory}{"\n"}{end}' 2>/dev/null
}
burst_allocated() { burst_claims | awk 'NF >= 3' | wc -l; }
burst_check_once() {
  local dup logged per_gpu
  dup="$(cat "$@" | grep -o "allocated on .*claim=$E2E_NS/[^ ]*" | sed 's/.*claim=//' | sort | uniq -d)"
  assert_eq "claims allocated twice (log)" "" "$dup"
  logged="$(cat "$@" | grep -c "allocated on .*claim=$E2E_NS/")"
  [ "$logged" -eq 50 ] || [ "$logged" -eq 49 ] || fail "allocation log lines: $logged (want 50, or 49)"
  say "ok: allocation log lines over $#: $logged"
  burst_claims | awk 'NF != 3 { bad = bad $0 "; " } END { if (bad != "") { print "claims without exactly one result: " bad; exit 1 } }' >&2 || fail "a claim has no or several results"
  # no over-grant: sum per GPU (all 3Gi) against 81559Mi
  per_gpu="$(burst_claims | awk '{n[$2]++} END {for (g in n) printf "%s=%d ", g, n[g]}')"
  say "claims per GPU: $per_gpu"
  burst_claims | awk '{n[$2]++} END {for (g in n) if (n[g] * 3 * 1024 > 81559) { print g " over-granted: " n[g] " x 3Gi"; exit 1 }}' >&2 || fail "a GPU is over-granted"
  say "ok: no GPU grants more than 81559Mi"
}
# shellcheck disable=SC2154 # $api: set by the scenario (dra_api_version)
render() {
  local req='exactly: {deviceClassName: shared.gpu.fgpu.dev}'
  [ "$api" = v1 ] || req='deviceClassName: shared.gpu.fgpu.dev'
  sed -e "s#__RAPI__#$api#g" -e "s#__REQ__#$req#g" -e "s#__NS__#$E2E_NS#g" -e "s#__IMAGE__#$FGPU_WORKLOAD_IMAGE#g" "$1"
}
