#!/usr/bin/env bash
# Benchmark of the DRA kubelet plugin's NodePrepareResources against the local cluster's API
# server (a script for figures, not a test): start a cluster first (make cluster-up; any
# release with resource.k8s.io/v1, i.e. 1.34+).
#
#   hack/bench-prepare.sh [CLAIMS] [ROUNDS]      defaults 100 claims, 10 rounds
#
# What it does: creates CLAIMS ResourceClaims of shared.gpu.fgpu.dev in a scratch namespace
# and writes each one's allocation itself through the status subresource (a result on gpu-0
# or gpu-1, a GpuShareConfig of 512Mi; no scheduler, no pod). Then, for each mode (below), it
# starts fgpu-kubelet-plugin serve as a host process (as tests/e2e/30-dra-quota does: fake
# backend, deploy/fake/e2e-node.yaml; its --run-dir and the CDI specs on the cluster's tmpfs,
# $FGPU_CLUSTER_RUN, as /run is on a real node) and calls its DRA socket like the kubelet with
# the example dra_call (one claim per NodePrepareResources call, one connection), reporting
# latency p50/p99/max:
#   * sequential: 1 call in flight, 1 round
#   * parallel:   8 calls in flight, 1 round
#   * the plugin's resident memory (VmRSS, and its anonymous / file-backed parts) at rest,
#     then after ROUNDS rounds of prepare + unprepare of every claim (CLAIMS x ROUNDS
#     cycles, 8 in flight), and after as many again.
# Before the sequential and before the parallel run every claim is deallocated and allocated
# again on the other GPU, as the resourceclaim controller and the scheduler do between two
# pods using one claim: each of those prepares is the first of an allocation, as a kubelet's
# is, and dra_call checks that each prepare returns the new device (a stale claim cache would
# return the old one). The ROUNDS rounds prepare again without a new allocation (with the
# claim cache on, these GET their claim: an unprepared claim is not answered from the cache
# until it was seen deallocated).
#
# Modes: FGPU_BENCH_MODES, `name=flags` items separated by `;`, run in that order on the same
# claims; flags of the form VAR=value are set in the plugin's environment. Default:
#   nocache=--claim-cache=false;cache=--claim-cache=true
# A summary table compares the modes (same cluster, same claims, same session).
# Everything it created (namespace, plugin, slice, files) is removed at the end.
# FGPU_E2E_PROFILE=release (default) or debug: which build of the plugin and dra_call runs;
# FGPU_E2E_BIN_FROM=<dir> runs the binaries in that directory instead (compare two builds).
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

modes="${FGPU_BENCH_MODES:-nocache=--claim-cache=false;cache=--claim-cache=true}"

cleanup() {
  local rc=$?
  # Waited for: a scenario run next on this cluster must not find these claims still allocated.
  kubectl delete namespace "$E2E_NS" --wait=true --timeout=90s >/dev/null 2>&1 || true
  plugin_cleanup $rc
  exit $rc
}
trap cleanup EXIT
plugin_setup bench
kubectl create namespace "$E2E_NS" >/dev/null

say "creating $claims claims with allocations in $E2E_NS"
mk() { # mk <i>: create claim bench-<i> allocated on gpu-<i mod 2> (plugin-lib.sh); prints "<name> <uid>"
  echo "bench-$1 $(allocated_claim "bench-$1" "gpu-$(($1 % 2))")"
}
realloc1() { # realloc1 <name> <uid> <device>: deallocate, allocate on <device>; prints "<name> <uid> <device>"
  kubectl -n "$E2E_NS" patch resourceclaim "$1" --subresource=status --type=json \
    -p '[{"op": "remove", "path": "/status/allocation"}]' >/dev/null
  kubectl -n "$E2E_NS" patch resourceclaim "$1" --subresource=status --type=merge -p "$(alloc_patch "$3")" >/dev/null
  echo "$1 $2 $3"
}
export -f mk realloc1 alloc_patch allocated_claim
export PLUGIN_DRIVER NODE_NAME E2E_NS
seq 0 $((claims - 1)) | xargs -P 8 -I{} bash -c 'mk {}' >"$work/claims.ids"
[ "$(wc -l <"$work/claims.ids")" -eq "$claims" ] || fail "created $(wc -l <"$work/claims.ids") claims, want $claims"
generation=0
# realloc: every claim deallocated and allocated on the other GPU than the last time; the
# claims file (with the device dra_call must see) is rewritten.
realloc() {
  generation=$((generation + 1))
  # shellcheck disable=SC2016 # expanded by the bash that xargs starts
  awk -v g="$generation" '{ print $1, $2, "gpu-" ((NR + g) % 2) }' "$work/claims.ids" \
    | xargs -P 8 -n 3 bash -c 'realloc1 "$0" "$1" "$2"' >"$work/claims"
  [ "$(wc -l <"$work/claims")" -eq "$claims" ] || fail "reallocated $(wc -l <"$work/claims") claims, want $claims"
}

mem() { # VmRSS and its parts (MiB), threads
  awk '/^VmRSS/ {r = $2} /^RssAnon/ {a = $2} /^RssFile/ {f = $2} /^Threads/ {t = $2}
       END {printf "%.1f (anon %.1f, file %.1f; %d threads)", r / 1024, a / 1024, f / 1024, t}' "/proc/$plugin_pid/status"
}
rss() { awk '/^VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$plugin_pid/status"; }
run() { "$dra_call" "$PLUGIN_DRA_SOCK" bench "$E2E_NS" "$work/claims" "$@" || fail "dra_call bench $* failed"; }
# shellcheck disable=SC2001 # a regex, not a plain replacement
field() { sed "s/.*$1=\([0-9.]*\).*/\1/" <<<"$2"; }
row() { # row <label> <dra_call output>
  local p u
  p="$(grep '^prepare ' <<<"$2")" u="$(grep '^unprepare ' <<<"$2")"
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$1" "$(field n "$p")" \
    "$(field p50_ms "$p")" "$(field p99_ms "$p")" "$(field max_ms "$p")" \
    "$(field p50_ms "$u")" "$(field p99_ms "$u")"
}
scrape() { curl -s "http://$FGPU_E2E_METRICS/metrics"; }
# The plugin's own view (its duration metric: from the claim lock to the last fsync, without
# gRPC and the socket relay), as a mean over one run: metric_ms <sum before> <count before>.
metric() { scrape | sed -n "s/^fgpu_kubelet_plugin_request_duration_seconds_$1{operation=\"Prepare\"} //p"; }
metric_ms() { awk -v s0="$1" -v c0="$2" -v s="$(metric sum)" -v c="$(metric count)" 'BEGIN{printf "%.2f", 1000*(s-s0)/(c-c0)}'; }
# The claim GET alone: the API server's answer to the same GET, 100 times on one connection.
get_ms() {
  local pki="$FGPU_CLUSTER_STATE/pki" name u args=()
  read -r name _ <"$work/claims.ids"
  u="https://127.0.0.1:6443/apis/resource.k8s.io/v1/namespaces/$E2E_NS/resourceclaims/$name"
  for _ in $(seq 1 100); do args+=(-o /dev/null "$u"); done
  curl -s --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" -w '%{time_total}\n' "${args[@]}" \
    | tail -n +2 | sort -n | awk '{a[NR]=$1} END{printf "p50 %.2f ms, p99 %.2f ms", 1000*a[int(NR/2)], 1000*a[int(NR*0.99)]}'
}
# Per-run deltas of the phase histogram ("ClaimGet 0.81, Build 0.20, ...") and of the claim
# reads ("CacheHit 100"): snap before the run, delta after it.
counters() {
  scrape | sed -n -e 's/^fgpu_kubelet_plugin_prepare_phase_duration_seconds_\(sum\|count\){phase="\([A-Za-z]*\)"} \(.*\)/phase \2 \1 \3/p' \
    -e 's/^fgpu_kubelet_plugin_claim_reads_total{read="\([A-Za-z]*\)"} \(.*\)/read \1 count \2/p'
}
snap() { counters >"$work/counters.before"; }
delta() { # delta phase|read
  counters | awk -v kind="$1" -v before="$work/counters.before" '
    BEGIN { while ((getline line < before) > 0) { split(line, f, " "); b[f[1]" "f[2]" "f[3]] = f[4] } }
    $1 == kind { v[$2" "$3] = $4 - b[$1" "$2" "$3]; if (!($2 in seen)) { seen[$2] = 1; order[++n] = $2 } }
    END { for (i = 1; i <= n; i++) { p = order[i]; c = v[p" count"]
            if (kind == "phase") printf "%s%s %.2f", (i > 1 ? ", " : ""), p, (c > 0 ? 1000 * v[p" sum"] / c : 0)
            else if (c > 0) printf "%s%s %d", (out++ ? ", " : ""), p, c } }'
}
cache_size() { scrape | sed -n 's/^fgpu_kubelet_plugin_claim_cache_claims //p'; }
# After a reallocation: 2 s (a kubelet's prepare comes after the scheduler's allocation, the
# binding and the pod's start, which take longer than a watch event), then, with the claim
# cache on, until it holds every claim. A cache still holding an old allocation would make
# dra_call fail on the device check.
settle() {
  sleep 2
  if grep -q -- '--claim-cache=true' <<<"${FGPU_E2E_PLUGIN_ARGS:-}"; then
    wait_until 30 "the claim cache holds the $claims claims" sh -c "[ \"\$(curl -s http://$FGPU_E2E_METRICS/metrics | sed -n 's/^fgpu_kubelet_plugin_claim_cache_claims //p')\" = $claims ]"
  fi
}
cpu_ms() { awk -v hz="$(getconf CLK_TCK)" '{printf "%d", ($14 + $15) * 1000 / hz}' "/proc/$1/stat"; }
apiserver_pid="$(awk '{print $1}' "$FGPU_CLUSTER_STATE/pids/kube-apiserver.pid" 2>/dev/null || true)"
get="$(get_ms)"

summary=()
n=0
IFS=';' read -r -a mode_list <<<"$modes"
for m in "${mode_list[@]}"; do
  name="${m%%=*}" spec="${m#*=}" args=() envs=()
  [ "$name" != "$m" ] || spec=""
  for tok in $spec; do
    if [[ "$tok" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then envs+=("$tok"); else args+=("$tok"); fi
  done
  say "mode $name: flags ${args[*]:-none}; environment ${envs[*]:-as plugin.sh sets it}"
  export FGPU_E2E_PLUGIN_ARGS="${args[*]:-}"
  n=$((n + 1))
  # As start_plugin does, with the mode's environment.
  plugin_pid="$(env ${envs[@]+"${envs[@]}"} "$E2E_LIB_DIR/30-dra-quota/plugin.sh" "$work")"
  [ -n "$plugin_pid" ] || fail "mode $name: the plugin did not start"
  say "plugin started (pid $plugin_pid)"
  wait_registered "$n"
  wait_until 30 "ResourceSlice $PLUGIN_SLICE published" kubectl get resourceslice "$PLUGIN_SLICE"

  realloc; settle
  rest="$(mem)"
  s0="$(metric sum)" c0="$(metric count)"; snap
  seq_out="$(run 1 1)"
  seq_plugin="$(metric_ms "$s0" "$c0")" seq_phases="$(delta phase)" seq_reads="$(delta read)"
  realloc; settle
  s0="$(metric sum)" c0="$(metric count)"; snap
  par_out="$(run 8 1)"
  par_plugin="$(metric_ms "$s0" "$c0")" par_phases="$(delta phase)" par_reads="$(delta read)"
  c0="$(cpu_ms "$plugin_pid")" a0="$( [ -n "$apiserver_pid" ] && cpu_ms "$apiserver_pid" || echo 0)"
  snap
  long1="$(run 8 "$rounds")"
  long_reads="$(delta read)"
  c1="$(cpu_ms "$plugin_pid")" a1="$( [ -n "$apiserver_pid" ] && cpu_ms "$apiserver_pid" || echo 0)"
  mem1="$(mem)" rss1="$(rss)"
  long2="$(run 8 "$rounds")"
  mem2="$(mem)" rss2="$(rss)"
  environ="$(tr '\0' '\n' <"/proc/$plugin_pid/environ" | grep -a '^MALLOC_' | tr '\n' ' ' || true)"
  stop_plugin

  cycles=$((claims * rounds))
  echo
  echo "### mode $name (${args[*]:-no flags}; ${environ:-no MALLOC_ variables})"
  echo
  echo "| run | prepares | prepare p50 ms | prepare p99 ms | prepare max ms | unprepare p50 ms | unprepare p99 ms |"
  echo "|---|---|---|---|---|---|---|"
  row "sequential (1 in flight)" "$seq_out"
  row "8 in flight" "$par_out"
  row "8 in flight, $rounds rounds" "$long1"
  row "8 in flight, $rounds more rounds" "$long2"
  echo
  echo "Claim reads: sequential ${seq_reads:-none}; 8 in flight ${par_reads:-none}; $rounds rounds ${long_reads:-none}."
  echo "Mean prepare inside the plugin (its metric): sequential $seq_plugin ms, 8 in flight $par_plugin ms."
  echo "Mean per step (ms), sequential: $seq_phases."
  echo "Mean per step (ms), 8 in flight: $par_phases."
  echo "CPU per prepare + unprepare cycle ($cycles cycles, 8 in flight): plugin $(awk -v c="$((c1 - c0))" -v n="$cycles" 'BEGIN{printf "%.2f", c/n}') ms, kube-apiserver $(awk -v c="$((a1 - a0))" -v n="$cycles" 'BEGIN{printf "%.2f", c/n}') ms."
  echo "Plugin memory (MiB): at rest $rest; after $((cycles + 2 * claims)) cycles $mem1; after $((2 * cycles + 2 * claims)) cycles $mem2."
  summary+=("| $name | $(field p50_ms "$(grep '^prepare ' <<<"$seq_out")") | $(field p99_ms "$(grep '^prepare ' <<<"$seq_out")") | $(field p50_ms "$(grep '^prepare ' <<<"$par_out")") | $(field p99_ms "$(grep '^prepare ' <<<"$par_out")") | ${seq_reads:-none} / ${par_reads:-none} | ${rest%% *} | $rss1 | $rss2 |")
done

echo
echo "Kubernetes $K8S_VERSION, $claims claims, $FGPU_E2E_PROFILE build, $(nproc) CPUs (load $(cut -d' ' -f1-3 /proc/loadavg)), $(date -u +%F)"
echo "The claim GET alone (curl, keep-alive, 100 GETs): $get."
echo
echo "| mode | seq p50 ms | seq p99 ms | 8 in flight p50 ms | 8 in flight p99 ms | claim reads (seq / 8) | VmRSS MiB at rest | after $((claims * rounds + 2 * claims)) cycles | after $((2 * claims * rounds + 2 * claims)) cycles |"
echo "|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${summary[@]}"
