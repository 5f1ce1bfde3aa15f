#!/usr/bin/env bash
# Benchmark: claims allocated per second by fgpu-controller (--mode controller) versus
# kube-scheduler's own allocation of the same claims (consumable capacity), side by side in one
# run, on a simulated inventory (a script for figures, not a test; not part of make test).
# Start a 1.36+ cluster first (consumable capacity on), e.g.
#   flock -w 1200 /tmp/fgpu-cluster.lock bash -c \
#     'make cluster-up K8S_VERSION=1.37 && hack/bench-controller.sh 1000 10000; make cluster-down'
#
#   hack/bench-controller.sh [NODES] [CLAIMS]        defaults 1000 nodes, 10000 claims
#
# Inventory: NODES Node objects (annotation kwok.x-k8s.io/node=fake), kept Ready without
# kubelets by kwok (built by hack/kwok-build.sh from tests/k8s/kwok/go.mod), and one
# ResourceSlice per node written directly to the API server: driver gpu.fgpu.dev, 8 devices
# shaped like the kubelet plugin's (H100, memory 81559Mi, cores 100, requestPolicy,
# allowMultipleAllocations). Claims: CLAIMS ResourceClaims of shared.gpu.fgpu.dev asking
# capacity.requests {memory: 20Gi, cores: 30} (3 fit per GPU), one pod each.
#
#   1. kube-scheduler: the claims and pods in namespace bench-sched, created with a holding
#      gate bench.fgpu.dev/hold; then the gates are lifted (32 concurrent PATCHes) and
#      kube-scheduler allocates (DRA plugin, consumable capacity) and binds to kwok nodes.
#   2. everything of phase 1 deleted; the same claims and pods in bench-ctrl, created with
#      the controller's gate gpu.fgpu.dev/allocate while no controller runs; then the release
#      build of fgpu-controller run --mode controller starts and allocates them (then lifts
#      the gates; kube-scheduler binds the pods).
# For each phase: claims/s from the first to the last allocation (a watch on the claims
# timestamps each claim's first event with status.allocation), the time from the trigger to
# the last allocation, and the no-double-grant check: per device, the sum of
# consumedCapacity over all allocated claims <= the device's capacity, one result per claim.
# Also the controller's VmRSS / VmHWM after its phase (and when its caches had synced).
# kube-scheduler runs with the harness's configuration: the upstream default client rate
# limit (qps 50, burst 100) unless the cluster was started with FGPU_SCHEDULER_CONFIG (e.g.
# clientConnection qps 500 / burst 1000) — each DRA pod costs it about four API writes. Everything it created is removed.
# FGPU_BENCH_SCHEDULER=0 skips phase 1 (the controller's rate and memory alone, no ratio);
# FGPU_BENCH_CONTROLLER_ARGS adds flags to the controller's command line (e.g. --list-page-size 25);
# the controller inherits the environment (MALLOC_ARENA_MAX defaults to 2, GLIBC_TUNABLES, ...);
# FGPU_BENCH_CONTROLLER_BIN runs that binary instead of building the release one (compare two
# builds in one cluster session); FGPU_BENCH_CONTROLLER_WRAP prefixes its command line (e.g.
# 'heaptrack -o /tmp/ctl': the VmRSS figures are then the wrapper's process, not the controller's).
# A phase that has not allocated every claim after FGPU_BENCH_PHASE_LIMIT seconds (1800) is
# reported with what it allocated by then. Needs python3; output: a summary on stdout, details in $FGPU_BENCH_DIR (default a temp dir).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
nodes="${1:-1000}" claims="${2:-10000}" limit="${FGPU_BENCH_PHASE_LIMIT:-1800}"
state="${FGPU_CLUSTER_STATE:-/var/lib/fgpu-cluster}"
[ -f "$state/env" ] || { echo "no local cluster: make cluster-up first" >&2; exit 1; }
# shellcheck disable=SC1091
source "$state/env"
minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
[ "$minor" -ge 36 ] || { echo "Kubernetes $K8S_VERSION: no consumable capacity by default (1.36+)" >&2; exit 1; }
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${FGPU_CACHE:-/var/cache/fgpu}/target}"
dir="${FGPU_BENCH_DIR:-$(mktemp -d /tmp/fgpu-bench-controller.XXXXXX)}"
mkdir -p "$dir"
log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
kwok_pid="" ctrl_pid="" watch_pid=""
stop_pid() {
  [ -n "$1" ] || return 0
  kill -TERM "$1" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
cleanup() {
  local rc=$?
  stop_pid "$watch_pid"; stop_pid "$ctrl_pid"
  log "cleaning up"
  for ns in bench-sched bench-ctrl; do
    python3 "$dir/bench.py" wipe "$ns" >/dev/null 2>&1 || true
    kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
  done
  timeout 120 sh -c 'while kubectl get ns bench-sched bench-ctrl >/dev/null 2>&1; do sleep 2; done' || true
  kubectl delete resourceslices -l bench.fgpu.dev/sim=true --wait=false >/dev/null 2>&1 || true
  kubectl delete nodes -l bench.fgpu.dev/sim=true --wait=false >/dev/null 2>&1 || true
  stop_pid "$kwok_pid"
  kubectl delete deviceclass shared.gpu.fgpu.dev --ignore-not-found >/dev/null 2>&1 || true
  log "details in $dir"
  exit $rc
}
trap cleanup EXIT
trap "exit 143" TERM INT

cat >"$dir/bench.py" <<'PY'
# Small API client for the bench (client certificate from the harness's kubeconfig files).
import json, os, re, ssl, sys, threading, time, http.client, concurrent.futures as cf
PKI = os.path.join(os.environ.get("FGPU_CLUSTER_STATE", "/var/lib/fgpu-cluster"), "pki")
HOST, PORT = "127.0.0.1", 6443
ctx = ssl.create_default_context(cafile=os.path.join(PKI, "ca.crt"))
ctx.load_cert_chain(os.path.join(PKI, "admin.crt"), os.path.join(PKI, "admin.key"))
tl = threading.local()
RES = "/apis/resource.k8s.io/v1"

def call(method, path, body=None, ctype="application/json", ok=(200, 201)):
    for attempt in range(20):
        c = getattr(tl, "c", None)
        if c is None:
            c = tl.c = http.client.HTTPSConnection(HOST, PORT, context=ctx, timeout=120)
        try:
            data = None if body is None else json.dumps(body).encode()
            c.request(method, path, body=data, headers={"Content-Type": ctype} if data else {})
            r = c.getresponse()
            out = r.read()
        except (http.client.HTTPException, OSError):
            tl.c = None; time.sleep(0.2); continue
        if r.status in ok:
            return json.loads(out) if out else None
        if r.status in (409, 429, 500, 503, 504) and attempt < 19:
            time.sleep(0.2 * (attempt + 1)); continue
        raise SystemExit(f"{method} {path}: {r.status} {out[:300]!r}")

def parallel(fn, items, workers=32):
    with cf.ThreadPoolExecutor(workers) as ex:
        for _ in ex.map(fn, items):
            pass

def qty(s):
    m = re.fullmatch(r"([0-9.]+)([KMGTE]i?|m)?", str(s))
    mult = {None: 1, "m": 1e-3, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "K": 1e3, "M": 1e6, "G": 1e9}[m.group(2)]
    return float(m.group(1)) * mult

def inventory(n):
    def node(i):
        name = f"kwok-{i:04d}"
        call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "labels": {"bench.fgpu.dev/sim": "true", "kubernetes.io/hostname": name, "type": "kwok"},
            "annotations": {"kwok.x-k8s.io/node": "fake"}}}, ok=(201, 409))
        devs = []
        for g in range(8):
            mem = "81559Mi"
            devs.append({"name": f"gpu-{g}", "allowMultipleAllocations": True,
                "attributes": {"type": {"string": "gpu"}, "uuid": {"string": f"GPU-{i:08d}-0000-4000-8000-{g:012d}"},
                               "productName": {"string": "NVIDIA H100 80GB HBM3"}, "index": {"int": g}, "numaNode": {"int": g // 4}},
                "capacity": {"memory": {"value": mem, "requestPolicy": {"default": mem, "validRange": {"min": "268435456", "step": "1048576"}}},
                             "cores": {"value": "100", "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}}}})
        call("POST", RES + "/resourceslices", {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {
            "name": f"{name}-gpu.fgpu.dev", "labels": {"bench.fgpu.dev/sim": "true"}},
            "spec": {"driver": "gpu.fgpu.dev", "nodeName": name, "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                     "devices": devs}}, ok=(201, 409))
    parallel(node, range(n))

def workload(ns, n, gate):
    def one(i):
        name = f"c-{i:05d}"
        call("POST", f"{RES}/namespaces/{ns}/resourceclaims", {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name}, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "shared.gpu.fgpu.dev", "capacity": {"requests": {"memory": "20Gi", "cores": "30"}}}}]}}}, ok=(201, 409))
        call("POST", f"/api/v1/namespaces/{ns}/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p-{i:05d}"},
            "spec": {"schedulingGates": [{"name": gate}], "terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                     "containers": [{"name": "c", "image": "bench.invalid/none", "resources": {"claims": [{"name": "gpu"}]}}]}}, ok=(201, 409))
    parallel(one, range(n))

def ungate(ns):
    pods = call("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
    t0 = time.time()
    parallel(lambda p: call("PATCH", f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}",
                            {"spec": {"schedulingGates": None}}, ctype="application/merge-patch+json"), pods)
    print(json.dumps({"ungate_start": t0, "ungate_end": time.time(), "pods": len(pods)}))

def watch(ns, n, out, limit):
    seen = {}
    def relist():
        # Allocations found by a list are timestamped now (after a broken watch: late by
        # at most the time it was broken; counted in "relists").
        lst = call("GET", f"{RES}/namespaces/{ns}/resourceclaims")
        for c in lst["items"]:
            if c.get("status", {}).get("allocation"):
                seen.setdefault(c["metadata"]["name"], time.time())
        return lst["metadata"]["resourceVersion"]
    rv, relists = relist(), 0
    open(out + ".ready", "w").close()
    deadline = time.time() + limit
    while len(seen) < n and time.time() < deadline:
        c = http.client.HTTPSConnection(HOST, PORT, context=ctx, timeout=30)
        try:
            c.request("GET", f"{RES}/namespaces/{ns}/resourceclaims?watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=60")
            r = c.getresponse()
            if r.status != 200:
                raise SystemExit(f"watch: {r.status}")
            while len(seen) < n:
                line = r.readline()
                if not line:
                    break
                now = time.time()
                ev = json.loads(line)
                if ev["type"] == "ERROR":  # e.g. 410 Gone: the version is too old to watch from
                    rv, relists = relist(), relists + 1
                    break
                o = ev["object"]
                rv = o.get("metadata", {}).get("resourceVersion", rv)
                if ev["type"] in ("ADDED", "MODIFIED") and o.get("status", {}).get("allocation"):
                    seen.setdefault(o["metadata"]["name"], now)
        except (OSError, http.client.HTTPException):
            pass
    ts = sorted(seen.values())
    json.dump({"allocated": len(ts), "first": ts[0] if ts else None, "last": ts[-1] if ts else None,
               "relists": relists, "times": ts}, open(out, "w"))

def check(nss):
    cap = {}
    for s in call("GET", RES + "/resourceslices?labelSelector=bench.fgpu.dev%2Fsim%3Dtrue")["items"]:
        for d in s["spec"]["devices"]:
            cap[(s["spec"]["pool"]["name"], d["name"])] = (qty(d["capacity"]["memory"]["value"]), qty(d["capacity"]["cores"]["value"]))
    use, bad, n, per_dev = {}, [], 0, {}
    for ns in nss:
        for c in call("GET", f"{RES}/namespaces/{ns}/resourceclaims")["items"]:
            a = c.get("status", {}).get("allocation")
            if not a:
                continue
            n += 1
            res = a["devices"]["results"]
            if len(res) != 1:
                bad.append(f"{ns}/{c['metadata']['name']}: {len(res)} results")
            for r in res:
                k = (r["pool"], r["device"])
                cc = r.get("consumedCapacity") or {}
                if "memory" not in cc or not r.get("shareID"):
                    bad.append(f"{ns}/{c['metadata']['name']}: no consumedCapacity.memory / shareID")
                u = use.setdefault(k, [0, 0, 0])
                u[0] += qty(cc.get("memory", 0)); u[1] += qty(cc.get("cores", 0)); u[2] += 1
    for k, (m, co, cnt) in use.items():
        if k not in cap:
            bad.append(f"{k}: not in the inventory"); continue
        if m > cap[k][0] or co > cap[k][1]:
            bad.append(f"{k[0]}/{k[1]} over-booked: {cnt} claims, {m / 2**30:g}Gi of {cap[k][0] / 2**30:g}Gi, {co:g} of {cap[k][1]:g} cores")
    hist = {}
    for k, (m, co, cnt) in use.items():
        hist[cnt] = hist.get(cnt, 0) + 1
    print(json.dumps({"allocated": n, "devices_used": len(use), "devices": len(cap),
                      "claims_per_device": dict(sorted(hist.items())), "violations": bad[:20], "n_violations": len(bad)}))
    return not bad

def wipe(ns):
    # pods at once (grace 0: no kubelet to wait for), then the claims, their finalizers stripped
    call("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0", ok=(200,))
    call("DELETE", f"{RES}/namespaces/{ns}/resourceclaims", ok=(200,))
    strip_finalizers(ns)

def strip_finalizers(ns):
    items = [c for c in call("GET", f"{RES}/namespaces/{ns}/resourceclaims")["items"] if c["metadata"].get("finalizers")]
    parallel(lambda c: call("PATCH", f"{RES}/namespaces/{ns}/resourceclaims/{c['metadata']['name']}",
                            {"metadata": {"finalizers": None}}, ctype="application/merge-patch+json", ok=(200, 404)), items)

cmd = sys.argv[1]
if cmd == "inventory": inventory(int(sys.argv[2]))
elif cmd == "workload": workload(sys.argv[2], int(sys.argv[3]), sys.argv[4])
elif cmd == "ungate": ungate(sys.argv[2])
elif cmd == "watch": watch(sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5]))
elif cmd == "check": sys.exit(0 if check(sys.argv[2:]) else 1)
elif cmd == "strip-finalizers": strip_finalizers(sys.argv[2])
elif cmd == "wipe": wipe(sys.argv[2])
PY
bench() { python3 "$dir/bench.py" "$@"; }
summary() { # summary <watch file> <trigger epoch>
  python3 - "$1" "$2" <<'PY'
import json, sys
w = json.load(open(sys.argv[1])); t0 = float(sys.argv[2])
n, f, l = w["allocated"], w["first"], w["last"]
span = (l - f) if n > 1 else 0
rate = (n - 1) / span if span > 0 else float("nan")
print(f"{n} claims allocated; first {f - t0:.2f}s after the trigger, last {l - t0:.2f}s; "
      f"first-to-last {span:.2f}s = {rate:.1f} claims/s; trigger-to-last {n / (l - t0):.1f} claims/s"
      + (f" ({w['relists']} watch relists)" if w.get("relists") else ""))
print(f"RATE {rate:.3f} {n / (l - t0):.3f}")
PY
}

# --- build
log "building kwok and the release fgpu-controller"
kwok="$("$root/hack/kwok-build.sh")"
if [ -n "${FGPU_BENCH_CONTROLLER_BIN:-}" ]; then
  cp "$FGPU_BENCH_CONTROLLER_BIN" "$dir/fgpu-controller"
else
  (cd "$root" && cargo build -q --release -p fgpu-controller --bin fgpu-controller)
  cp "$CARGO_TARGET_DIR/release/fgpu-controller" "$dir/fgpu-controller"
fi

# --- inventory
kubectl apply -f "$root/deploy/deviceclasses.yaml" >/dev/null
"$kwok" --kubeconfig "$KUBECONFIG" --config "$(dirname "$kwok")/../stages.yaml" --manage-all-nodes=false \
  --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --node-ip 10.99.0.1 --node-lease-duration-seconds 40 >"$dir/kwok.log" 2>&1 &
kwok_pid=$!
sleep 2
kill -0 "$kwok_pid" 2>/dev/null || { log "kwok exited: $(tail -3 "$dir/kwok.log")"; exit 1; }
# A previous run's nodes are deleted without waiting: writing the inventory while they still
# exist would keep some of them, then lose them to that deletion (never all Ready).
t=$SECONDS
while [ -n "$(kubectl get nodes -l bench.fgpu.dev/sim=true -o name | head -1)" ]; do
  [ $((SECONDS - t)) -lt 180 ] || { log "a previous run's simulated nodes still exist after 180s"; exit 1; }
  sleep 2
done
# Likewise its namespaces: the cleanup waits 120s for them, and 10,000 pods and claims can
# take longer to go; creating one while it is being deleted fails.
t=$SECONDS
while kubectl get ns bench-sched >/dev/null 2>&1 || kubectl get ns bench-ctrl >/dev/null 2>&1; do
  [ $((SECONDS - t)) -lt 300 ] || { log "a previous run's namespaces still exist after 300s"; exit 1; }
  sleep 2
done
t=$SECONDS
bench inventory "$nodes"
log "inventory: $nodes nodes x 8 GPUs ($((nodes * 8)) devices) written in $((SECONDS - t))s"
ready() { [ "$(kubectl get nodes -l bench.fgpu.dev/sim=true -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True)" -ge "$nodes" ]; }
t=$SECONDS
until ready; do [ $((SECONDS - t)) -lt 300 ] || { log "kwok: nodes not Ready in 300s"; exit 1; }; sleep 2; done
log "all $nodes simulated nodes Ready (kwok) after $((SECONDS - t))s"

# --- phase 1: kube-scheduler
sched_summary="(not run: FGPU_BENCH_SCHEDULER=0)" sched_ok=skipped sched_check=""
if [ "${FGPU_BENCH_SCHEDULER:-1}" != 0 ]; then
  kubectl create namespace bench-sched >/dev/null
  until kubectl -n bench-sched get serviceaccount default >/dev/null 2>&1; do sleep 1; done
  t=$SECONDS
  bench workload bench-sched "$claims" bench.fgpu.dev/hold
  log "scheduler phase: $claims claims + $claims held pods created in $((SECONDS - t))s"
  rm -f "$dir/sched.watch.ready"
  bench watch bench-sched "$claims" "$dir/sched.watch" "$limit" & watch_pid=$!
  until [ -f "$dir/sched.watch.ready" ]; do sleep 0.2; done
  ug="$(bench ungate bench-sched)"
  t_sched="$(echo "$ug" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ungate_start"])')"
  log "gates lifted: $ug"
  wait "$watch_pid"; watch_pid=""
  sched_summary="$(summary "$dir/sched.watch" "$t_sched")"
  log "kube-scheduler: $(echo "$sched_summary" | head -1)"
  sched_check="$(bench check bench-sched)" && sched_ok=yes || sched_ok=NO
  log "kube-scheduler double-grant check: $sched_ok $sched_check"
  cp "$root/_out/logs/kube-scheduler.log" "$dir/" 2>/dev/null || true

  # --- reset: the same inventory, empty
  t=$SECONDS
  bench wipe bench-sched
  until [ -z "$(kubectl -n bench-sched get resourceclaims -o name 2>/dev/null | head -1)" ]; do
    [ $((SECONDS - t)) -lt 300 ] || { log "scheduler-phase claims not gone in 300s"; exit 1; }
    sleep 2
  done
  log "scheduler phase removed in $((SECONDS - t))s"
fi

# --- phase 2: fgpu-controller
kubectl create namespace bench-ctrl >/dev/null
until kubectl -n bench-ctrl get serviceaccount default >/dev/null 2>&1; do sleep 1; done
t=$SECONDS
bench workload bench-ctrl "$claims" gpu.fgpu.dev/allocate
log "controller phase: $claims claims + $claims gated pods created in $((SECONDS - t))s"
rm -f "$dir/ctrl.watch.ready"
bench watch bench-ctrl "$claims" "$dir/ctrl.watch" "$limit" & watch_pid=$!
until [ -f "$dir/ctrl.watch.ready" ]; do sleep 0.2; done
t_ctrl="$(date +%s.%N)"
# MALLOC_ARENA_MAX as deploy/controller/controller.yaml sets it (docs/controller.md, "Memory").
# shellcheck disable=SC2086 # FGPU_BENCH_CONTROLLER_ARGS and _WRAP: word-split on purpose
MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-2}" \
RUST_LOG="${FGPU_BENCH_CONTROLLER_LOG:-warn,fgpu_controller=info}" ${FGPU_BENCH_CONTROLLER_WRAP:-} "$dir/fgpu-controller" run --kubeconfig "$KUBECONFIG" \
  --mode controller --metrics-addr 127.0.0.1:19590 --resync 30 ${FGPU_BENCH_CONTROLLER_ARGS:-} \
  </dev/null >"$dir/controller.log" 2>&1 &
ctrl_pid=$!
log "controller started (pid $ctrl_pid, release build)"
rss_peak=0 rss_sync=""
while kill -0 "$watch_pid" 2>/dev/null; do
  r="$(awk '/^VmRSS/ {print $2}' "/proc/$ctrl_pid/status" 2>/dev/null || echo 0)"
  [ "${r:-0}" -le "$rss_peak" ] || rss_peak=$r
  [ -n "$rss_sync" ] || ! grep -q "caches synced" "$dir/controller.log" || rss_sync=$r
  echo "$(date +%s.%N) $r" >>"$dir/controller.rss"
  sleep 0.5
done
wait "$watch_pid"; watch_pid=""
ctrl_summary="$(summary "$dir/ctrl.watch" "$t_ctrl")"
log "fgpu-controller: $(echo "$ctrl_summary" | head -1) (trigger: process start, incl. its cache sync)"
ctrl_check="$(bench check bench-ctrl)" && ctrl_ok=yes || ctrl_ok=NO
log "fgpu-controller double-grant check: $ctrl_ok $ctrl_check"
sleep 5
rss="$(awk '/^VmRSS|^VmHWM|^RssAnon|^RssFile/ {printf "%s %d MiB; ", $1, $2 / 1024}' "/proc/$ctrl_pid/status" 2>/dev/null || echo "exited")"
curl -s http://127.0.0.1:19590/metrics >"$dir/controller.metrics" || true
stop_pid "$ctrl_pid"; ctrl_pid=""

read -r _ s_rate s_rate2 <<<"$(echo "$sched_summary" | grep '^RATE')"
read -r _ c_rate c_rate2 <<<"$(echo "$ctrl_summary" | grep '^RATE')"
ratio="$(python3 -c "print(f'{$c_rate / $s_rate:.2f}')" 2>/dev/null || echo nan)"
ratio2="$(python3 -c "print(f'{$c_rate2 / $s_rate2:.2f}')" 2>/dev/null || echo nan)"
cat <<EOF
bench-controller: Kubernetes $K8S_VERSION, $nodes simulated nodes (kwok) x 8 GPUs, $claims claims of 20Gi + 30 cores per side (3 fit per GPU)
  kube-scheduler : $(echo "$sched_summary" | head -1)
  fgpu-controller: $(echo "$ctrl_summary" | head -1)
  ratio controller/scheduler: ${ratio}x first-to-last, ${ratio2}x trigger-to-last
  no double grant: scheduler $sched_ok, controller $ctrl_ok
    scheduler:  $sched_check
    controller: $ctrl_check
  controller memory (release build): ${rss}peak VmRSS sampled during the phase $((rss_peak / 1024)) MiB; VmRSS when its caches had synced (before allocating) $((${rss_sync:-0} / 1024)) MiB
EOF
[ "$sched_ok" != NO ] && [ "$ctrl_ok" = yes ]
