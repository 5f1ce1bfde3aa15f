#!/usr/bin/env bash
# Scenario: a small replay through the real control plane gives fgpu-controller's fragaware
# the same placements as the simulator on the same inputs.
#
# Inputs (committed): nodes.csv, 20 nodes of five models (1-8 GPUs each, 64 GPUs), and
# pods.csv, 95 GPU pods drawn with the Alibaba default trace's mix (fractions 110-810
# milli, whole and multi-GPU pods), asking 1.15 x the capacity, so that the last arrivals
# find no room. fgpu-sim shuffles them (seed 42) and places them as the controller does
# (--as-controller --online-workload), writing each arrival and where it went.
#
# Live: the same 20 nodes as kwok Nodes, each with a ResourceSlice shaped as the kubelet
# plugin publishes it (hack/replay.py inventory), fgpu-controller run --mode controller
# --default-policy fragaware (a half-life of 10^19 s: every weight is 1.0 to the last bit, the
# simulator's counts), and
# the arrivals created in the simulator's order, each a claim of shared.gpu.fgpu.dev and a
# gated pod, one at a time: the next only once the controller has allocated the last or
# reported it pending.
#
# Asserted: every arrival is placed on the same node and the same GPUs as in the simulator,
# those it could not place are pending; the paper's metric from the API objects equals the
# simulator's; no device gives more than it has; the allocated pods are bound to their
# claim's node and Running (kwok). Needs consumable capacity (1.36+); skipped elsewhere.
source "$(dirname "$0")/../lib.sh"
api="$(dra_api_version)"
[ "$K8S_MINOR" -ge 36 ] || skip "Kubernetes $K8S_VERSION: no consumable capacity by default (1.36+)"
source "$E2E_DIR/../controller-lib.sh"
root="$(cd "$E2E_DIR/../../.." && pwd)"
work="$(mktemp -d /tmp/fgpu-e2e-47.XXXXXX)"
mkdir -p "$work/bin"
replay() { python3 "$root/hack/replay.py" "$@"; }
kwok_pid=""

cleanup() {
  local rc=$?
  replay wipe "$E2E_NS" >/dev/null 2>&1 || true
  controller_cleanup $rc
  replay wipe-inventory >/dev/null 2>&1 || true
  stop_pid "$kwok_pid"
  classes | kubectl delete -f - --ignore-not-found >/dev/null 2>&1 || true
  [ "$rc" -ne 0 ] || rm -rf "$work"
  exit $rc
}
trap cleanup EXIT

# --- the simulator's placements
(cd "$root" && cargo build -q -p fgpu-sim) >&2 || fail "cargo build -p fgpu-sim failed"
sim="$CARGO_TARGET_DIR/debug/fgpu-sim"
"$sim" --nodes "$E2E_DIR/nodes.csv" --pods "$E2E_DIR/pods.csv" --policy fragaware --seeds 42 --tune 0 \
  --online-workload --as-controller --placements "$work/sim.csv" --out "$work/sim-curve.csv" >"$work/sim.out" 2>"$work/sim.log" \
  || fail "fgpu-sim failed: $(tail -3 "$work/sim.log")"
arrivals=$(($(wc -l <"$work/sim.csv") - 1))
unplaced="$(awk -F, 'NR > 1 && $10 == "" {n++} END {print n + 0}' "$work/sim.csv")"
say "simulator: $arrivals arrivals, $unplaced without room"
[ "$unplaced" -gt 0 ] || fail "the inputs must overfill the cluster (no arrival failed in the simulator)"
# hack/replay.py's metric is fgpu-sim's: its curve of the simulator's placements is the
# simulator's own --out row.
replay curve "$E2E_DIR/nodes.csv" pods "$work/sim-curve-py.csv" "$work/sim.csv"
assert_eq "replay.py's allocation curve of the simulated run" "$(tail -1 "$work/sim-curve.csv" | cut -d, -f5-)" \
  "$(tail -1 "$work/sim-curve-py.csv" | cut -d, -f5-)"

# --- the live inventory: kwok nodes, slices as the plugin publishes them
controller_setup
classes | kubectl apply -f - >&2
kwok="$("$root/hack/kwok-build.sh")" || fail "hack/kwok-build.sh failed"
"$kwok" --kubeconfig "$KUBECONFIG" --config "$(dirname "$kwok")/../stages.yaml" --manage-all-nodes=false \
  --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --node-ip 10.99.0.1 --node-lease-duration-seconds 40 </dev/null >"$work/kwok.log" 2>&1 &
kwok_pid=$!
say "inventory: $(replay inventory "$E2E_DIR/nodes.csv")"
ready() { [ "$(kubectl get nodes -l replay.fgpu.dev/sim=true -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True)" -eq 20 ]; }
wait_until 60 "the 20 kwok nodes Ready" ready

start_controller --mode controller --default-policy fragaware --workload-half-life-seconds 10000000000000000000

# --- the arrivals, one at a time, in the simulator's order
t0=$SECONDS
say "created: $(replay create "$E2E_NS" "$work/sim.csv" fragaware gpu.fgpu.dev/allocate "$E2E_DIR/nodes.csv" --sequential 30)"
say "all $arrivals arrivals decided in $((SECONDS - t0))s"
say "live: $(replay collect "$E2E_NS" "$work/sim.csv" fragaware live-fragaware "$work/live.csv")"

# --- the same placements, the same metric, no over-grant
if ! out="$(replay agree "$work/sim.csv" fragaware "$work/live.csv" live-fragaware)"; then
  fail "live and simulated placements differ: $out"
fi
say "ok: placements equal: $out"
sim_metric="$(replay metric "$E2E_DIR/nodes.csv" "$work/sim.csv" | sed 's/"file": "[^"]*", //')"
live_metric="$(replay metric "$E2E_DIR/nodes.csv" "$work/live.csv" | sed 's/"file": "[^"]*", //; s/live-fragaware/fragaware/')"
assert_eq "the paper's metric from the API objects" "$sim_metric" "$live_metric"
out="$(replay check "$E2E_NS")" || fail "over-grant: $out"
say "ok: no device over-granted: $out"
pending="$(curl -s "http://$CONTROLLER_METRICS_ADDR/metrics" | sed -n 's/^fgpu_controller_claims_pending{reason="no_fit"} //p')"
assert_eq "claims pending for no_fit (the simulator's unplaced arrivals)" "$unplaced" "$pending"

# --- the allocated pods run where their claims are
bound() {
  python3 - "$work/live.csv" "$E2E_NS" <<'PY'
import csv, json, subprocess, sys
want = {f"p-{int(r['seq']):06d}": r["node"] for r in csv.DictReader(open(sys.argv[1])) if r["node"]}
pods = json.loads(subprocess.run(["kubectl", "-n", sys.argv[2], "get", "pods", "-o", "json"], check=True,
                                 capture_output=True, text=True).stdout)["items"]
got = {p["metadata"]["name"]: (p["spec"].get("nodeName"), p["status"].get("phase")) for p in pods}
bad = [(n, w, got.get(n)) for n, w in want.items() if got.get(n) != (w, "Running")]
print(f"{len(want) - len(bad)}/{len(want)} Running on their claim's node; first off: {bad[:1]}")
sys.exit(1 if bad else 0)
PY
}
wait_until 90 "every allocated pod Running on its claim's node" bound
say "ok: $(bound)"
un="${live_metric#*\"unallocated_at_100\": }"
say "PASS: $arrivals arrivals through the real control plane, placed as the simulator places them (${un%%,*} % unallocated at 100 % arrived)"
