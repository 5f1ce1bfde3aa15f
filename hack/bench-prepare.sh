#!/usr/bin/env bash
# Benchmark of the DRA kubelet plugin's NodePrepareResources against the local cluster's API
# server (a script for figures, not a test): start a cluster first (make cluster-up; any
# release with resource.k8s.io/v1, i.e. 1.34+).
#
#   hack/bench-prepare.sh [CLAIMS] [ROUNDS]      defaults 100 claims, 10 rounds
#
# What it does: starts fgpu-kubelet-plugin serve as a host process (as tests/e2e/30-dra-quota
# does: fake backend, deploy/fake/e2e-node.yaml; its --run-dir and the CDI specs on the
# cluster's tmpfs, $FGPU_CLUSTER_RUN, as /run is on a real node), creates CLAIMS ResourceClaims of
# shared.gpu.fgpu.dev in a scratch namespace and writes each one's allocation itself through
# the status subresource (result on gpu-0 or gpu-1 alternately, a GpuShareConfig of 512Mi; no
# scheduler, no pod: the plugin only GETs the claim). Then the example dra_call calls the
# plugin's DRA socket like the kubelet (one claim per NodePrepareResources call, one
# connection) and reports latency p50/p99/max:
#   * sequential: 1 call in flight, 1 round (every prepare is cold: GET claim, files, fsyncs)
#   * parallel:   8 calls in flight, 1 round
#   * the plugin's resident memory (VmRSS) at rest, then after ROUNDS rounds of
#     prepare + unprepare of every claim (CLAIMS x ROUNDS cycles), and after as many again.
# Everything it created (namespace, plugin, slice, files) is removed at the end.
# FGPU_E2E_PROFILE=release (default) or debug: which build of the plugin and dra_call runs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
claims="${1:-100}" rounds="${2:-10}"
state="${FGPU_CLUSTER_STATE:-/var/lib/fgpu-cluster}"
[ -f "$state/env" ] || { echo "no local cluster: make cluster-up first" >&2; exit 1; }
# shellcheck disable=SC1091
source "$state/env"
export E2E_NS="fgpu-bench-$RANDOM" E2E_DIR="$root/tests/e2e/30-dra-quota"
source "$root/tests/e2e/lib.sh"
[ "$(dra_api_version)" = v1 ] || fail "Kubernetes $K8S_VERSION: the bench writes resource.k8s.io/v1 claims (1.34+)"
source "$root/tests/e2e/plugin-lib.sh"
export FGPU_E2E_METRICS=127.0.0.1:19409 FGPU_E2E_PROFILE="${FGPU_E2E_PROFILE:-release}"

cleanup() {
  local rc=$?
  kubectl delete namespace "$E2E_NS" --wait=false >/dev/null 2>&1 || true
  plugin_cleanup $rc
  exit $rc
}
trap cleanup EXIT
plugin_setup bench
kubectl create namespace "$E2E_NS" >/dev/null
start_plugin
wait_registered 1
wait_until 30 "ResourceSlice $PLUGIN_SLICE published" kubectl get resourceslice "$PLUGIN_SLICE"

say "creating $claims claims with allocations in $E2E_NS"
mk() { # mk <i>: create claim bench-<i> and write its allocation; prints "<name> <uid>"
  local name="bench-$1" dev="gpu-$(($1 % 2))" uid
  kubectl apply -f - >/dev/null <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $name, namespace: $E2E_NS}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: shared.gpu.fgpu.dev}
YAML
  kubectl -n "$E2E_NS" patch resourceclaim "$name" --subresource=status --type=merge -p "$(cat <<JSON
{"status": {"allocation": {"devices": {
  "results": [{"request": "gpu", "driver": "$PLUGIN_DRIVER", "pool": "$NODE_NAME", "device": "$dev"}],
  "config": [{"source": "FromClaim", "opaque": {"driver": "$PLUGIN_DRIVER",
    "parameters": {"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "memory": "512Mi"}}}]}}}}
JSON
)" >/dev/null
  uid="$(kubectl -n "$E2E_NS" get resourceclaim "$name" -o jsonpath='{.metadata.uid}')"
  echo "$name $uid"
}
export -f mk
export PLUGIN_DRIVER NODE_NAME E2E_NS
seq 0 $((claims - 1)) | xargs -P 8 -I{} bash -c 'mk {}' >"$work/claims"
[ "$(wc -l <"$work/claims")" -eq "$claims" ] || fail "created $(wc -l <"$work/claims") claims, want $claims"

rss() { awk '/^VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$plugin_pid/status"; }
run() { "$dra_call" "$PLUGIN_DRA_SOCK" bench "$E2E_NS" "$work/claims" "$@" || fail "dra_call bench $* failed"; }
row() { # row <label> <dra_call output>
  local p u
  p="$(grep '^prepare ' <<<"$2")" u="$(grep '^unprepare ' <<<"$2")"
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$1" \
    "$(sed 's/.*n=\([0-9]*\).*/\1/' <<<"$p")" \
    "$(sed 's/.*p50_ms=\([0-9.]*\).*/\1/' <<<"$p")" "$(sed 's/.*p99_ms=\([0-9.]*\).*/\1/' <<<"$p")" \
    "$(sed 's/.*max_ms=\([0-9.]*\).*/\1/' <<<"$p")" \
    "$(sed 's/.*p50_ms=\([0-9.]*\).*/\1/' <<<"$u")" "$(sed 's/.*p99_ms=\([0-9.]*\).*/\1/' <<<"$u")"
}
# The plugin's own view (its duration metric: from the claim lock to the last fsync, without
# gRPC and the socket relay), as a mean over one run: metric_ms <sum before> <count before>.
metric() { curl -s "http://$FGPU_E2E_METRICS/metrics" | sed -n "s/^fgpu_kubelet_plugin_request_duration_seconds_$1{operation=\"Prepare\"} //p"; }
metric_ms() { awk -v s0="$1" -v c0="$2" -v s="$(metric sum)" -v c="$(metric count)" 'BEGIN{printf "%.2f", 1000*(s-s0)/(c-c0)}'; }
# The claim GET alone: the API server's answer to the same GET, 100 times on one connection.
get_ms() {
  local pki="$FGPU_CLUSTER_STATE/pki" name uid u args=()
  read -r name uid <"$work/claims"
  u="https://127.0.0.1:6443/apis/resource.k8s.io/v1/namespaces/$E2E_NS/resourceclaims/$name"
  for _ in $(seq 1 100); do args+=(-o /dev/null "$u"); done
  curl -s --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" -w '%{time_total}\n' "${args[@]}" \
    | tail -n +2 | sort -n | awk '{a[NR]=$1} END{printf "p50 %.2f ms, p99 %.2f ms", 1000*a[int(NR/2)], 1000*a[int(NR*0.99)]}'
}
# The mean time of each step of a prepare (the plugin's phase metric) over one run:
# phases_before, then phases_ms prints "ClaimGet 0.81, Build 0.20, ..." since that call.
phase_metrics() { curl -s "http://$FGPU_E2E_METRICS/metrics" | sed -n 's/^fgpu_kubelet_plugin_prepare_phase_duration_seconds_\(sum\|count\){phase="\([A-Za-z]*\)"} \(.*\)/\2 \1 \3/p'; }
phases_before() { phase_metrics >"$work/phases.before"; }
phases_ms() {
  phase_metrics | awk -v before="$work/phases.before" '
    BEGIN { while ((getline line < before) > 0) { split(line, f, " "); b[f[1]" "f[2]] = f[3] } }
    { v[$1" "$2] = $3 - b[$1" "$2]; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
    END { for (i = 1; i <= n; i++) { p = order[i]; c = v[p" count"]; printf "%s%s %.2f", (i > 1 ? ", " : ""), p, (c > 0 ? 1000 * v[p" sum"] / c : 0) } }'
}
rest="$(rss)"
s0="$(metric sum)" c0="$(metric count)"; phases_before
seq_out="$(run 1 1)"
seq_plugin="$(metric_ms "$s0" "$c0")" seq_phases="$(phases_ms)"
s0="$(metric sum)" c0="$(metric count)"; phases_before
par_out="$(run 8 1)"
par_plugin="$(metric_ms "$s0" "$c0")" par_phases="$(phases_ms)"
get="$(get_ms)"
# CPU time (user + system) of a process in ms, from /proc/<pid>/stat (clock ticks).
cpu_ms() { awk -v hz="$(getconf CLK_TCK)" '{printf "%d", ($14 + $15) * 1000 / hz}' "/proc/$1/stat"; }
apiserver_pid="$(awk '{print $1}' "$FGPU_CLUSTER_STATE/pids/kube-apiserver.pid" 2>/dev/null || true)"
c0="$(cpu_ms "$plugin_pid")" a0="$( [ -n "$apiserver_pid" ] && cpu_ms "$apiserver_pid" || echo 0)"
long1="$(run 8 "$rounds")"
c1="$(cpu_ms "$plugin_pid")" a1="$( [ -n "$apiserver_pid" ] && cpu_ms "$apiserver_pid" || echo 0)"
rss1="$(rss)"
long2="$(run 8 "$rounds")"
rss2="$(rss)"

echo
echo "Kubernetes $K8S_VERSION, $claims claims, $FGPU_E2E_PROFILE build, $(nproc) CPUs (load $(cut -d' ' -f1-3 /proc/loadavg)), $(date -u +%F)"
echo
echo "| run | prepares | prepare p50 ms | prepare p99 ms | prepare max ms | unprepare p50 ms | unprepare p99 ms |"
echo "|---|---|---|---|---|---|---|"
row "sequential (1 in flight)" "$seq_out"
row "8 in flight" "$par_out"
row "8 in flight, $rounds rounds" "$long1"
row "8 in flight, $rounds more rounds" "$long2"
echo
echo "Mean prepare inside the plugin (its metric): sequential $seq_plugin ms, 8 in flight $par_plugin ms."
echo "Mean per step (ms), sequential: $seq_phases."
echo "Mean per step (ms), 8 in flight: $par_phases."
echo "The claim GET alone (curl, keep-alive, 100 GETs): $get."
cycles=$((claims * rounds))
echo "CPU per prepare + unprepare cycle ($cycles cycles, 8 in flight): plugin $(awk -v c="$((c1 - c0))" -v n="$cycles" 'BEGIN{printf "%.2f", c/n}') ms, kube-apiserver $(awk -v c="$((a1 - a0))" -v n="$cycles" 'BEGIN{printf "%.2f", c/n}') ms; plugin environment: $(tr '\0' '\n' <"/proc/$plugin_pid/environ" | grep -a '^MALLOC_ARENA_MAX=' || echo 'MALLOC_ARENA_MAX unset')."
echo
echo "| plugin RSS (MiB) | at rest | after $((claims * rounds + 2 * claims)) cycles | after $((2 * claims * rounds + 2 * claims)) cycles |"
echo "|---|---|---|---|"
echo "| VmRSS | $rest | $rss1 | $rss2 |"
