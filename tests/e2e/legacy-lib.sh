# shellcheck shell=bash
# Helpers for the legacy-path scenarios (tests/e2e/5*-legacy-*; sourced after lib.sh and
# plugin-lib.sh). The legacy path is the one for clusters without DRA (below 1.32): HAMi's
# pod specs, a second kube-scheduler whose profile `fgpu-scheduler` calls fgpu's scheduler
# extender, and fgpu's kubelet device plugin for nvidia.com/gpu. Everything fgpu runs here is a
# host process against the harness's cluster; nothing is installed into the cluster.
#
#   legacy_setup <tag>     build this checkout's fgpu-kubelet-plugin and fgpu-controller (no-op
#                          when up to date), copy them with the shim and the fake CUDA driver to
#                          a fresh work dir ($work, see plugin-lib.sh), create the stand-in device
#                          nodes, render the fgpu-scheduler's KubeSchedulerConfiguration
#   start_extender [args]  fgpu-controller extender on $LEGACY_EXTENDER_ADDR (loopback: the
#                          extender refuses any other address; with LEGACY_EXTENDER_DEFAULT_ADDR=1
#                          no address flag is passed and the binary's default is used, which
#                          must then equal $LEGACY_EXTENDER_ADDR); /metrics on
#                          $LEGACY_EXTENDER_METRICS_ADDR; waits for both /healthz
#   start_device_plugin    fgpu-kubelet-plugin device-plugin (fake backend, $LEGACY_PROFILE);
#                          waits until it has registered with the kubelet once more than before;
#                          /metrics on $LEGACY_DP_METRICS_ADDR
#   start_scheduler        the second kube-scheduler (profile fgpu-scheduler + the extender)
#   start_kwok             kwok, managing only nodes annotated kwok.x-k8s.io/node=fake
#   kwok_node <name> <inventory JSON>  a kwok-managed Node carrying <inventory JSON> in the
#                          device plugin's annotation (the stand-in for a second GPU node)
#   legacy_stop <name> [signal]  stop one of the above (extender, device-plugin, scheduler,
#                          kwok) by the pid recorded when it was started (TERM, KILL after 10 s;
#                          or the signal given, e.g. KILL)
#   legacy_apply <file>    apply a manifest of HAMi pods as they are (the webhook sets the
#                          scheduler; see the function)
#   decision <pod>         the pod's decision annotation (JSON), empty when none
#   legacy_cleanup <rc>    pods deleted, kwok node and node annotation removed, every process
#                          stopped, logs printed on failure, $work removed
#
# Pids: each process started here is recorded as "<pid> <start time>" in
# $FGPU_CLUSTER_STATE/pids/e2e-legacy-<name>.pid, the format hack/cluster-down.sh reads, so a
# scenario killed before its cleanup still has its processes stopped by `make cluster-down`;
# only a pid whose start time matches is ever signalled.
# shellcheck disable=SC2034 # used by the scripts that source this file
LEGACY_SCHEDULER_NAME=fgpu-scheduler
LEGACY_EXTENDER_ADDR="${FGPU_E2E_EXTENDER_ADDR:-127.0.0.1:18888}"
LEGACY_EXTENDER_DEFAULT_ADDR="${LEGACY_EXTENDER_DEFAULT_ADDR:-0}"
# The extender's mutating webhook (HTTPS, same process), registered by URL for the
# scenario's namespace from deploy/extender/webhook.yaml. A scenario sets LEGACY_WEBHOOK=0
# before legacy_up to go without it (legacy_apply then sets spec.schedulerName itself):
# 53 restarts the extender, and with the webhook's failurePolicy Fail a pod created while
# it is down is refused (by design, docs/extender.md); 51 adds kwok nodes mid-way whose GPU
# models the webhook would check against an inventory a resync behind.
LEGACY_WEBHOOK_ADDR="${FGPU_E2E_LEGACY_WEBHOOK_ADDR:-127.0.0.1:18443}"
LEGACY_WEBHOOK="${LEGACY_WEBHOOK:-1}"
legacy_webhook_file=""
LEGACY_SCHEDULER_PORT="${FGPU_E2E_SCHEDULER_PORT:-10269}"
# The extender's /metrics and /healthz (--metrics-address; its own port, not the verbs').
LEGACY_EXTENDER_METRICS_ADDR="${FGPU_E2E_EXTENDER_METRICS_ADDR:-127.0.0.1:19502}"
# The device plugin's /metrics and /healthz (--metrics-address; loopback, the binary's
# default 0.0.0.0:9401 would be reachable from the node's network).
LEGACY_DP_METRICS_ADDR="${FGPU_E2E_DP_METRICS_ADDR:-127.0.0.1:19401}"
LEGACY_INVENTORY_ANN=gpu.fgpu.dev/node-gpus
LEGACY_DECISION_ANN=gpu.fgpu.dev/assigned-devices
# The node's fake GPUs: an H100 and an A100 (two models, for the type filters).
LEGACY_PROFILE="$E2E_LIB_DIR/legacy-node.yaml"
LEGACY_KWOK_NODES=()

legacy_pidfile() { echo "$FGPU_CLUSTER_STATE/pids/e2e-legacy-$1.pid"; }
# The pid recorded for <name> if that process is still the one started, else nothing.
legacy_pid() {
  local f pid start
  f="$(legacy_pidfile "$1")"
  [ -f "$f" ] || return 0
  read -r pid start <"$f" || return 0
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 0
  [ "$(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null)" = "$start" ] && echo "$pid"
  return 0
}
# legacy_start <name> <cmd...>: background, log $work/<name>.log, pid recorded.
legacy_start() {
  local name="$1" pid; shift
  [ -z "$(legacy_pid "$name")" ] || fail "$name is already running (pid $(legacy_pid "$name"))"
  mkdir -p "$FGPU_CLUSTER_STATE/pids"
  "$@" </dev/null >>"$work/$name.log" 2>&1 &
  pid=$!
  echo "$pid $(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null)" >"$(legacy_pidfile "$name")"
  say "$name started (pid $pid)"
}
legacy_stop() {
  local name="$1" sig="${2:-TERM}" pid
  pid="$(legacy_pid "$name")"
  if [ -n "$pid" ]; then
    kill -"$sig" "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do [ -d "/proc/$pid" ] || break; sleep 0.2; done
    if [ -d "/proc/$pid" ]; then kill -KILL "$pid" 2>/dev/null || true; fi
    wait "$pid" 2>/dev/null || true
    say "$name stopped (pid $pid, SIG$sig)"
  fi
  rm -f "$(legacy_pidfile "$name")"
}

# own_build <dest dir> <binary> <cargo build args...>: build, then copy the binary. The cargo
# target directory is shared with other checkouts, and target/<profile>/<binary> is whichever
# checkout built last: build again after the copy and compare, so a copy taken just after
# another checkout's build replaced ours is noticed and taken again.
own_build() {
  local dest="$1" bin="$2" i; shift 2
  local target="${CARGO_TARGET_DIR:-${FGPU_CACHE:-/var/cache/fgpu}/target}/${FGPU_E2E_PROFILE:-debug}"
  for i in 1 2 3; do
    (cd "$E2E_LIB_DIR/../.." && cargo build -q "$@") >&2 || fail "cargo build $* failed"
    if [ "$i" -gt 1 ] && cmp -s "$target/$bin" "$dest/$bin"; then return 0; fi
    cp "$target/$bin" "$dest/$bin"
  done
  fail "$target/$bin keeps changing under us (another checkout building the same binary)"
}

legacy_setup() {
  local flags=() n
  plugin_setup "$1"
  [ "${FGPU_E2E_PROFILE:-debug}" = debug ] || flags=(--profile "$FGPU_E2E_PROFILE")
  own_build "$work/bin" fgpu-kubelet-plugin "${flags[@]}" -p fgpu-kubelet-plugin --bin fgpu-kubelet-plugin
  own_build "$work/bin" fgpu-controller "${flags[@]}" -p fgpu-controller --bin fgpu-controller
  # Stand-ins for the fake GPUs' device nodes (the profile's deviceRoot), as plugin.sh makes.
  mkdir -p /run/fgpu-e2e/dev
  for n in nvidia0 nvidia1 nvidiactl nvidia-uvm nvidia-uvm-tools; do
    [ -c "/run/fgpu-e2e/dev/$n" ] || mknod -m 0666 "/run/fgpu-e2e/dev/$n" c 1 3
  done
  legacy_scheduler_config >"$work/scheduler.yaml"
  "$E2E_LIB_DIR/../../hack/webhook-certs.sh" "$work/pki" "IP:${LEGACY_WEBHOOK_ADDR%:*}" >&2
}

# The second scheduler's configuration: one profile, fgpu-scheduler, with the extender.
# Rendered here rather than read from deploy/ (the deployment's own configuration is written
# elsewhere); the extender part is what a cluster admin configures: the three verbs, the
# node cache (NodeNames only), HAMi's four resources ignored by kube-scheduler's own fit
# check (only nvidia.com/gpu is a node resource, and the extender accounts for it), and a
# weight that makes the extender's score (0-10, the pod's node policy) outweigh the default
# score plugins (kube-scheduler multiplies it by weight x 10; the plugins' sum moves by a few
# hundred at most), so that hami.io/node-scheduler-policy decides between feasible nodes.
legacy_scheduler_config() {
  local r
  cat <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $FGPU_CLUSTER_STATE/pki/scheduler.kubeconfig
leaderElection:
  leaderElect: false
profiles:
- schedulerName: $LEGACY_SCHEDULER_NAME
extenders:
- urlPrefix: http://$LEGACY_EXTENDER_ADDR
  filterVerb: filter
  prioritizeVerb: prioritize
  bindVerb: bind
  weight: 100
  enableHTTPS: false
  nodeCacheCapable: true
  httpTimeout: 30s
  ignorable: false
  managedResources:
EOF
  for r in nvidia.com/gpu nvidia.com/gpumem nvidia.com/gpumem-percentage nvidia.com/gpucores; do
    printf '  - name: %s\n    ignoredByScheduler: true\n' "$r"
  done
}

# shellcheck disable=SC2120 # extra flags are optional
start_extender() {
  local hook=() addr=(--extender-address "$LEGACY_EXTENDER_ADDR")
  [ "$LEGACY_WEBHOOK" != 1 ] || hook=(--webhook-addr "$LEGACY_WEBHOOK_ADDR" \
    --tls-cert "$work/pki/tls.crt" --tls-key "$work/pki/tls.key")
  [ "$LEGACY_EXTENDER_DEFAULT_ADDR" != 1 ] || addr=()
  legacy_start extender env RUST_LOG="${FGPU_E2E_EXTENDER_LOG:-info}" "$work/bin/fgpu-controller" extender \
    "${addr[@]}" --kubeconfig "$KUBECONFIG" --resync-seconds 2 \
    --metrics-address "$LEGACY_EXTENDER_METRICS_ADDR" \
    --scheduler-name "$LEGACY_SCHEDULER_NAME" "${hook[@]}" "$@"
  wait_until 30 "extender /healthz" curl -sf "http://$LEGACY_EXTENDER_ADDR/healthz"
  wait_until 10 "extender metrics /healthz" curl -sf "http://$LEGACY_EXTENDER_METRICS_ADDR/healthz"
  [ "$LEGACY_WEBHOOK" != 1 ] \
    || wait_until 30 "extender webhook /healthz" curl -sfk "https://$LEGACY_WEBHOOK_ADDR/healthz"
}

# deploy/extender/webhook.yaml as a cluster admin applies it (the mutating webhook and the
# validating assignment guard), but by URL (no Service here) and for the scenario's
# namespace only. The extender runs with the harness's kubeconfig, so the user it may write
# the assignment annotation as (asked of the API server at start) is that kubeconfig's.
register_legacy_webhook() {
  legacy_webhook_file="$work/legacy-webhook.yaml"
  sed -e "s#service: {namespace: fgpu-system, name: fgpu-extender, path: \([^,]*\), port: 443}#url: https://$LEGACY_WEBHOOK_ADDR\1#" \
      -e "s#__CA_BUNDLE__#$(cat "$work/pki/ca.b64")#" \
      -e "s#operator: NotIn, values: \[kube-system, fgpu-system\]#operator: In, values: [$E2E_NS]#" \
      "$E2E_LIB_DIR/../../deploy/extender/webhook.yaml" >"$legacy_webhook_file"
  grep -q "url: https://$LEGACY_WEBHOOK_ADDR/mutate-pods" "$legacy_webhook_file" || fail "rendering $legacy_webhook_file"
  grep -q "url: https://$LEGACY_WEBHOOK_ADDR/validate-pods" "$legacy_webhook_file" || fail "rendering $legacy_webhook_file (validate)"
  grep -q "values: \[$E2E_NS\]" "$legacy_webhook_file" || fail "rendering $legacy_webhook_file (namespace)"
  kubectl apply -f "$legacy_webhook_file" >&2
}

# Registrations in the device plugin's log so far.
legacy_registrations() { grep -c 'registered with the kubelet' "$work/device-plugin.log" 2>/dev/null || true; }
start_device_plugin() {
  local t="$work/bin" libdir=/usr/lib/x86_64-linux-gnu before
  before="$(legacy_registrations)"
  # The driver files as a real node's would be mounted: the fake CUDA driver/NVML over the
  # image's copies, libfgpu.so at /usr/lib/fgpu/libfgpu.so (see 30-dra-quota/plugin.sh).
  legacy_start device-plugin env MALLOC_ARENA_MAX=2 RUST_LOG="${FGPU_E2E_PLUGIN_LOG:-info}" \
    "$t/fgpu-kubelet-plugin" device-plugin \
    --node "$NODE_NAME" --backend fake --fake-gpus "$LEGACY_PROFILE" \
    --device-plugin-path "$KUBELET_DEVICE_PLUGINS_DIR" \
    --cdi-root "$CDI_SPEC_DIR" --state-dir "$work/dp-state" \
    --shim-library "$t/libfgpu.so" \
    --driver-file "$t/libfgpu_fake_cuda.so:$libdir/libcuda.so.1" \
    --driver-file "$t/libfgpu_fake_cuda.so:$libdir/libnvidia-ml.so.1" \
    --health-seconds 2 --resync-seconds 2 --metrics-address "$LEGACY_DP_METRICS_ADDR"
  wait_until 30 "device plugin registered with the kubelet" \
    sh -c "[ \"\$(grep -c 'registered with the kubelet' $work/device-plugin.log)\" -gt ${before:-0} ]"
}

start_scheduler() {
  legacy_start scheduler "$(command -v kube-scheduler)" --config "$work/scheduler.yaml" \
    --authentication-kubeconfig "$FGPU_CLUSTER_STATE/pki/scheduler.kubeconfig" \
    --authorization-kubeconfig "$FGPU_CLUSTER_STATE/pki/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$LEGACY_SCHEDULER_PORT" --v=2
  wait_until 60 "fgpu-scheduler /healthz" curl -fsSk "https://127.0.0.1:$LEGACY_SCHEDULER_PORT/healthz"
}

# Everything a scenario needs: extender, device plugin, scheduler; the node's GPUs in
# nvidia.com/gpu (2 GPUs x 10) and its inventory annotation published.
legacy_up() {
  start_extender
  start_device_plugin
  start_scheduler
  wait_until 60 "node $NODE_NAME allocatable nvidia.com/gpu = 20" \
    sh -c "[ \"\$(kubectl get node $NODE_NAME -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')\" = 20 ]"
  wait_until 30 "node inventory annotation published" inventory_published "$NODE_NAME"
  if [ "$LEGACY_WEBHOOK" = 1 ]; then
    register_legacy_webhook
    # Let the extender's resync see the inventory the webhook checks GPU sizes against.
    sleep 3
  fi
}
inventory_published() { [ -n "$(node_inventory "$1")" ]; }

node_inventory() { kubectl get node "$1" -o "jsonpath={.metadata.annotations.gpu\.fgpu\.dev/node-gpus}"; }

start_kwok() {
  local kwok
  kwok="$("$E2E_LIB_DIR/../../hack/kwok-build.sh")" || fail "hack/kwok-build.sh failed"
  legacy_start kwok "$kwok" --kubeconfig "$KUBECONFIG" --config "$(dirname "$kwok")/../stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-ip 10.99.0.1 --node-lease-duration-seconds 40
  sleep 1
  [ -n "$(legacy_pid kwok)" ] || fail "kwok exited: $(tail -3 "$work/kwok.log")"
}
# kwok_node <name> <inventory JSON>: a Node that kwok keeps Ready (no kubelet: its pods are
# marked Running by kwok, no container runs), with the GPU inventory written by the test in
# the device plugin's format.
kwok_node() {
  local name="$1" inv="$2"
  LEGACY_KWOK_NODES+=("$name")
  python3 - "$name" "$inv" <<'EOF' | kubectl apply -f - >&2
import json, sys
name, inv = sys.argv[1], sys.argv[2]
json.loads(inv)  # must be JSON
print(json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {
    "name": name, "labels": {"kubernetes.io/hostname": name, "type": "kwok", "fgpu.dev/e2e": "legacy"},
    "annotations": {"kwok.x-k8s.io/node": "fake", "gpu.fgpu.dev/node-gpus": inv}}}))
EOF
  wait_until 60 "kwok node $name Ready" jp_eq "node/$name" '{.status.conditions[?(@.type=="Ready")].status}' True ""
}

# legacy_apply <file>: apply HAMi pod specs as HAMi documents them (__NS__/__IMAGE__ filled
# in). With the webhook (LEGACY_WEBHOOK=1) nothing else is changed: the webhook gives them
# spec.schedulerName fgpu-scheduler and its defaults. Without it, this adds only
# spec.schedulerName, standing in for the webhook.
legacy_apply() {
  if [ "$LEGACY_WEBHOOK" = 1 ]; then
    sed -e "s#__NS__#$E2E_NS#g" -e "s#__IMAGE__#$FGPU_WORKLOAD_IMAGE#g" "$1" | kubectl apply -f - >&2
    return
  fi
  sed -e "s#__NS__#$E2E_NS#g" -e "s#__IMAGE__#$FGPU_WORKLOAD_IMAGE#g" "$1" \
    | kubectl create --dry-run=client -o json -f - \
    | python3 -c '
import json, sys
text, dec, i = sys.stdin.read(), json.JSONDecoder(), 0
while True:  # kubectl prints one JSON object per document
    while i < len(text) and text[i].isspace():
        i += 1
    if i == len(text):
        break
    d, i = dec.raw_decode(text, i)
    for o in d.get("items", [d]):
        if o.get("kind") == "Pod":
            o["spec"]["schedulerName"] = sys.argv[1]
    print(json.dumps(d))
' "$LEGACY_SCHEDULER_NAME" | kubectl apply -f - >&2
}

decision() { kubectl -n "${2:-$E2E_NS}" get pod "$1" -o "jsonpath={.metadata.annotations.gpu\.fgpu\.dev/assigned-devices}" 2>/dev/null; }
# py_json <python expression on d>: evaluate it on the JSON document on stdin, print it.
py_json() { python3 -c "import json, sys; d = json.load(sys.stdin); print($1)"; }
# decision_field <pod> <python expression on d>: e.g. 'd["containers"][0]["devices"][0]["uuid"]'
decision_field() {
  decision "$1" | py_json "$2"
}
# The probe's key=value output of a pod.
probe_field() { kubectl -n "$E2E_NS" logs "$1" | sed -n "s/^$2=//p" | head -1; }
wait_probe() { wait_until "${2:-120}" "pod $1 ran its probe" sh -c "kubectl -n $E2E_NS logs $1 2>/dev/null | grep -q probe_done"; }

legacy_cleanup() {
  local rc="$1" n f
  [ -z "$legacy_webhook_file" ] || kubectl delete -f "$legacy_webhook_file" --ignore-not-found >/dev/null 2>&1 || true
  kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >/dev/null 2>&1 \
    || kubectl -n "$E2E_NS" delete pods --all --force --grace-period=0 >/dev/null 2>&1 || true
  for n in "${LEGACY_KWOK_NODES[@]}"; do kubectl delete node "$n" --ignore-not-found >/dev/null 2>&1 || true; done
  legacy_stop scheduler
  legacy_stop kwok
  legacy_stop extender
  # Give the device plugin a resync to remove the files of the deleted pods' containers.
  [ -z "$(legacy_pid device-plugin)" ] || sleep 3
  legacy_stop device-plugin
  kubectl annotate node "$NODE_NAME" "$LEGACY_INVENTORY_ANN-" >/dev/null 2>&1 || true
  if [ "$rc" -ne 0 ] && [ -n "$work" ]; then
    for f in extender device-plugin scheduler kwok; do
      [ -f "$work/$f.log" ] || continue
      say "$f.log (last 40 lines):"
      grep -v configmap_cafile_content "$work/$f.log" | tail -40 | sed 's/^/      /' >&2
    done
  fi
  plugin_cleanup "$rc"
}
