#!/usr/bin/env bash
# Benchmark: the FGD paper's experiment through the real control plane. The Alibaba trace's
# GPU nodes as kwok Nodes with ResourceSlices shaped as the kubelet plugin publishes them, the
# trace's GPU pods as claims of shared.gpu.fgpu.dev and pods, created in fgpu-sim's arrival
# order for one seed; then the unallocated GPU % at 100 % arrived, computed from the API
# server's objects, for fgpu-controller --default-policy fragaware, fgpu-controller binpack and
# kube-scheduler's own allocation (consumable capacity), beside fgpu-sim on the same arrivals.
# A script for figures (docs/engine.md, "The replay"), not a test; tests/e2e/47 is the small one.
#
#   flock -w 1200 /tmp/fgpu-cluster.lock bash -c \
#     'make cluster-up K8S_VERSION=1.37 && hack/bench-replay.sh; make cluster-down'
#
#   hack/bench-replay.sh [TRACE] [SEED]     defaults openb_pod_list_default, 42
#
# TRACE is a pod list of $FGPU_DATA (default /work/shared/data/alibaba-gpu-v2023/csv), the
# nodes are its openb_node_list_gpu_node.csv. fgpu-sim --as-controller --online-workload
# --tune 1.3 draws the arrivals (how a pod becomes objects: hack/replay.py); the replay keeps
# them up to 105 % of the GPU capacity (what the metric at 100 % needs). Each phase creates
# them all gated, then lets its allocator go (the controller starts; kube-scheduler's gates
# are lifted) and waits until every claim is allocated or reported pending (the controller),
# or until no claim has been allocated for FGPU_REPLAY_SETTLE seconds (60; kube-scheduler,
# counted from its first allocation, which it may take minutes to write with 7,500 pods in
# its queue; at most FGPU_REPLAY_FIRST seconds, 900, are waited for that one).
# FGPU_REPLAY_PHASES (default "fragaware binpack kube-scheduler") picks phases; outputs in
# $FGPU_BENCH_DIR (default a temp dir): sim.csv, live-<phase>.csv, logs, summary.txt, and
# replay.svg, the live curves beside the simulator's (fgpu-sim plot).
# FGPU_BENCH_PROFILE (default release; `dist` is the shipped images' build) picks the cargo
# profile of fgpu-controller and fgpu-sim.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
trace="${1:-openb_pod_list_default}" seed="${2:-42}"
data="${FGPU_DATA:-/work/shared/data/alibaba-gpu-v2023/csv}"
phases="${FGPU_REPLAY_PHASES:-fragaware binpack kube-scheduler}"
settle="${FGPU_REPLAY_SETTLE:-60}" first="${FGPU_REPLAY_FIRST:-900}"
state="${FGPU_CLUSTER_STATE:-/var/lib/fgpu-cluster}"
[ -f "$state/env" ] || { echo "no local cluster: make cluster-up first" >&2; exit 1; }
# shellcheck disable=SC1091
source "$state/env"
[ "$(echo "$K8S_VERSION" | cut -d. -f2)" -ge 36 ] || { echo "Kubernetes $K8S_VERSION: no consumable capacity by default (1.36+)" >&2; exit 1; }
nodes_csv="$data/openb_node_list_gpu_node.csv" pods_csv="$data/$trace.csv"
for f in "$nodes_csv" "$pods_csv"; do [ -f "$f" ] || { echo "no trace file $f (FGPU_DATA)" >&2; exit 1; }; done
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${FGPU_CACHE:-/var/cache/fgpu}/target}"
dir="${FGPU_BENCH_DIR:-$(mktemp -d /tmp/fgpu-bench-replay.XXXXXX)}"
mkdir -p "$dir"
log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
replay() { python3 "$root/hack/replay.py" "$@"; }
kwok_pid="" ctrl_pid=""
stop_pid() {
  [ -n "$1" ] || return 0
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  local rc=$?
  stop_pid "$ctrl_pid"
  log "cleaning up"
  for p in $phases; do
    replay wipe "replay-$p" >/dev/null 2>&1 || true
    kubectl delete namespace "replay-$p" --wait=false >/dev/null 2>&1 || true
  done
  replay wipe-inventory >/dev/null 2>&1 || true
  kubectl apply -f "$root/deploy/deviceclasses.yaml" >/dev/null 2>&1 || true # the shipped classes again
  stop_pid "$kwok_pid"
  log "details in $dir"
  exit $rc
}
trap cleanup EXIT
trap "exit 143" TERM INT

profile="${FGPU_BENCH_PROFILE:-release}"
log "building kwok, the $profile fgpu-controller and fgpu-sim"
kwok="$("$root/hack/kwok-build.sh")"
(cd "$root" && cargo build -q --profile "$profile" -p fgpu-controller -p fgpu-sim --bin fgpu-controller --bin fgpu-sim)
ctl="$CARGO_TARGET_DIR/$profile/fgpu-controller"

# --- the arrivals and the simulator's placements (the same rule as the controller's)
t=$SECONDS
"$CARGO_TARGET_DIR/$profile/fgpu-sim" --nodes "$nodes_csv" --pods "$pods_csv" --policy fragaware,binpack \
  --seeds "$seed" --online-workload --as-controller --placements "$dir/sim-all.csv" --out "$dir/sim-curve.csv" \
  >"$dir/sim.out" 2>"$dir/sim.log"
python3 - "$dir/sim-all.csv" "$dir/sim.csv" "$nodes_csv" <<'PY'
# Keep the arrivals up to 105 % of the GPU capacity.
import csv, sys
gpus = sum(int(r["gpu"]) for r in csv.DictReader(open(sys.argv[3])))
rows = list(csv.DictReader(open(sys.argv[1])))
out, arrived = {}, {}
for r in rows:
    p = r["sc_policy"]
    if arrived.get(p, 0) <= 1.05 * gpus * 1000:
        out.setdefault(p, []).append(r)
    arrived[p] = arrived.get(p, 0) + int(r["num_gpu"]) * min(int(r["gpu_milli"]), 1000)
with open(sys.argv[2], "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys()), lineterminator="\n")
    w.writeheader()
    for rs in out.values():
        w.writerows(rs)
PY
arrivals=$(($(grep -c '^fragaware,' "$dir/sim.csv")))
log "fgpu-sim: $arrivals arrivals kept (seed $seed) in $((SECONDS - t))s"

# --- the inventory
kubectl apply -f "$root/deploy/deviceclasses.yaml" >/dev/null
"$kwok" --kubeconfig "$KUBECONFIG" --config "$(dirname "$kwok")/../stages.yaml" --manage-all-nodes=false \
  --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --node-ip 10.99.0.1 --node-lease-duration-seconds 40 </dev/null >"$dir/kwok.log" 2>&1 &
kwok_pid=$!
t=$SECONDS
inv="$(replay inventory "$nodes_csv")"
want_nodes="$(echo "$inv" | python3 -c 'import json,sys; print(json.load(sys.stdin)["nodes"])')"
ready() { [ "$(kubectl get nodes -l replay.fgpu.dev/sim=true -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True)" -ge "$want_nodes" ]; }
until ready; do [ $((SECONDS - t)) -lt 300 ] || { log "kwok: nodes not Ready in 300s"; exit 1; }; sleep 2; done
# Ready is not enough: until the node lifecycle controller lifts node.kubernetes.io/not-ready,
# kube-scheduler finds no node for a pod there and clears its claim's allocation (441 claims
# in a multigpu30 run; the controller then places them again, away from that node). On this
# machine it lifts them slowly: 440 of the 1,213 nodes still had the taint 5 minutes after
# they were Ready, while the replay's pods were being created and bound.
tainted() { kubectl get nodes -l replay.fgpu.dev/sim=true -o jsonpath='{range .items[*]}{.spec.taints[*].key}{"\n"}{end}' | grep -c 'node.kubernetes.io/not-ready' || true; }
# Wait before any pod exists, so that nothing else competes with it.
until [ "$(tainted)" -eq 0 ]; do
  [ $((SECONDS - t)) -lt 600 ] || { log "kwok: $(tainted) nodes still tainted not-ready after 600s; going on"; break; }
  sleep 5
done
log "inventory $inv Ready in $((SECONDS - t))s"

allocated() { kubectl -n "$1" get resourceclaims -o jsonpath='{range .items[*]}{.status.allocation.devices.results[0].pool}{"\n"}{end}' | grep -c . || true; }
pending_metric() { curl -s http://127.0.0.1:19591/metrics | sed -n 's/^fgpu_controller_claims_pending{reason="no_fit"} //p'; }
alloc_span() { # seconds from the first to the last allocation write (managedFields, 1 s resolution)
  kubectl -n "$1" get resourceclaims -o json --show-managed-fields | python3 -c '
import json, sys, datetime
ts = sorted(datetime.datetime.fromisoformat(m["time"].replace("Z", "+00:00")).timestamp()
            for c in json.load(sys.stdin)["items"] if c.get("status", {}).get("allocation")
            for m in c["metadata"].get("managedFields", []) if m.get("subresource") == "status" and m.get("time"))
print(f"{ts[-1] - ts[0]:.0f}" if len(ts) > 1 else "nan")'
}

# The shared DeviceClass as each allocator's deployment has it. For kube-scheduler, as
# deploy/deviceclasses.yaml ships it. For the controller, as the chart renders it in
# controller mode: a selector no device matches, so that kube-scheduler never allocates a
# shared claim itself. With the shipped class it did, in the gpushare40 replay of
# 2026-12-07: it re-allocated the claims whose allocations it had cleared, minutes after
# deciding (its binding cycle waits on its client's rate limit while thousands of pods
# bind), onto GPUs the controller had filled since, and 3 to 13 GPUs ended granted twice
# (docs/engine.md, "Two more traces").
shared_class() { # $1: kube-scheduler | controller
  if [ "$1" = controller ]; then
    python3 "$root/hack/deviceclasses.py" controller-mode <"$root/deploy/deviceclasses.yaml"
  else
    cat "$root/deploy/deviceclasses.yaml"
  fi | kubectl apply -f - >/dev/null
}

summary="$dir/summary.txt"
: >"$summary"
for p in $phases; do
  ns="replay-$p"
  case "$p" in
    kube-scheduler) gate=bench.fgpu.dev/hold; shared_class kube-scheduler ;;
    *) gate=gpu.fgpu.dev/allocate; shared_class controller ;;
  esac
  t=$SECONDS
  replay create "$ns" "$dir/sim.csv" fragaware "$gate" "$nodes_csv" >/dev/null
  log "$p: $arrivals claims + gated pods created in $((SECONDS - t))s"
  t=$SECONDS
  if [ "$p" = kube-scheduler ]; then
    replay ungate "$ns" >/dev/null
    # 60 s without an allocation ended the first full run before kube-scheduler had written
    # any: its first PreBind came minutes after the gates were lifted.
    until [ "$(allocated "$ns")" -gt 0 ]; do
      [ $((SECONDS - t)) -lt "$first" ] || { log "$p: no allocation ${first}s after the gates were lifted"; break; }
      sleep 5
    done
    log "$p: first allocation $((SECONDS - t))s after the gates were lifted"
    last=0 since=$SECONDS
    while [ $((SECONDS - since)) -lt "$settle" ]; do
      n="$(allocated "$ns")"
      [ "$n" = "$last" ] || { last=$n; since=$SECONDS; }
      sleep 5
    done
  else
    MALLOC_ARENA_MAX=2 RUST_LOG=warn,fgpu_controller=info "$ctl" run --kubeconfig "$KUBECONFIG" --mode controller \
      --default-policy "$p" --workload-half-life-seconds 10000000000000000000 --metrics-addr 127.0.0.1:19591 --resync 30 \
      </dev/null >"$dir/controller-$p.log" 2>&1 &
    ctrl_pid=$!
    until [ "$(( $(allocated "$ns") + $(pending_metric || echo 0) ))" -ge "$arrivals" ] 2>/dev/null; do
      kill -0 "$ctrl_pid" 2>/dev/null || { log "the controller exited: $(tail -3 "$dir/controller-$p.log")"; exit 1; }
      sleep 5
    done
    rss="$(awk '/^VmHWM/ {printf "%d MiB", $2 / 1024}' "/proc/$ctrl_pid/status" 2>/dev/null || echo "?")"
    stop_pid "$ctrl_pid"; ctrl_pid=""
  fi
  span="$(alloc_span "$ns")"
  replay collect "$ns" "$dir/sim.csv" fragaware "live-$p" "$dir/live-$p.csv" >/dev/null
  chk="$(replay check "$ns")" && ok=yes || ok=NO
  live="$(replay metric "$nodes_csv" "$dir/live-$p.csv")"
  line="$p: $(echo "$live" | python3 -c 'import json,sys; m=json.load(sys.stdin); print("unallocated at 100 % {} %, placed {}/{}, first failure at {} % arrived ({} % unallocated there)".format(m["unallocated_at_100"], m["placed"], m["arrivals"], m["first_fail_arrived"], m["first_fail_unallocated"]))')"
  line="$line; $((SECONDS - t))s, allocations over ${span}s"
  [ "$p" = kube-scheduler ] || line="$line, controller peak RSS $rss"
  line="$line; no over-grant: $ok"
  if [ "$p" != kube-scheduler ]; then
    line="$line; vs fgpu-sim $p: $(replay metric "$nodes_csv" "$dir/sim.csv" | python3 -c "
import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m['policy'] == '$p': print(m['unallocated_at_100'], '%')")"
    if [ "$p" = fragaware ] || [ "$p" = binpack ]; then
      line="$line, same placement $(replay agree "$dir/sim.csv" "$p" "$dir/live-$p.csv" "live-$p" | python3 -c 'import json,sys; m=json.load(sys.stdin); print("{}/{}".format(m["same"], m["arrivals"]))' || true)"
    fi
  fi
  log "$line"
  echo "$line" >>"$summary"
  [ "$ok" = yes ] || log "over-grant: $chk"
  replay wipe "$ns"
  kubectl delete namespace "$ns" --wait=true --timeout=300s >/dev/null 2>&1 || true
done
# The live curves beside the simulator's, as the paper's figure (docs/engine.md, "The replay").
if replay curve "$nodes_csv" "$trace" "$dir/curve-live.csv" "$dir"/live-*.csv \
  && "$CARGO_TARGET_DIR/$profile/fgpu-sim" plot --in "$dir/sim-curve.csv" --in "$dir/curve-live.csv" \
    --out "$dir/replay.svg" 2>>"$dir/sim.log"; then
  log "figure: $dir/replay.svg"
else
  log "no figure (see $dir/sim.log)"
fi
echo "bench-replay: Kubernetes $K8S_VERSION, $trace seed $seed, $inv, $arrivals arrivals (to 105 % of capacity)"
sed 's/^/  /' "$summary"
