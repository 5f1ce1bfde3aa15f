#!/usr/bin/env python3
"""Replays fgpu-sim's arrivals through the real control plane and reads the outcome back.

Used by hack/bench-replay.sh (the Alibaba trace on 1,213 kwok nodes) and by
tests/e2e/47-controller-fragaware (a small replay compared pod by pod with the simulator).
Talks to the local cluster's API server with the harness's admin certificate
($FGPU_CLUSTER_STATE/pki); standard library only.

  replay.py inventory NODES_CSV                      kwok Nodes + one ResourceSlice each
  replay.py create NS PLACEMENTS POLICY GATE NODES_CSV [--sequential SECONDS]
                                                     a claim + a gated pod per arrival
  replay.py collect NS PLACEMENTS POLICY LABEL OUT   the live placements, in the sim's layout
  replay.py metric NODES_CSV FILE...                 the paper's metric per (policy, seed)
  replay.py curve NODES_CSV WORKLOAD OUT FILE...     the runs as fgpu-sim --out rows (for plotting)
  replay.py agree FILE_A POLICY_A FILE_B POLICY_B    pod-by-pod comparison of two runs
  replay.py ungate NS                                lift every pod's scheduling gates
  replay.py check NS                                 no device gives more than it has
  replay.py wipe NS | wipe-inventory                 delete what `create` / `inventory` made

How a trace pod becomes objects (docs/engine.md, "The replay"): a pod of `num_gpu` whole GPUs
is a claim of `num_gpu` devices of shared.gpu.fgpu.dev without capacity (whole GPUs); a pod
of `gpu_milli` < 1000 asks `cores` = gpu_milli / 10 and `memory` = gpu_milli / 1000 of the
smallest card in the inventory, rounded down to a MiB, so the share the engine sees is
gpu_milli on every model, as the trace means it. Host CPU and memory are not requested (the
controller does not account them; fgpu-sim --as-controller leaves them out too).
"""
import concurrent.futures as cf
import csv
import http.client
import json
import math
import os
import re
import ssl
import sys
import threading
import time

STATE = os.environ.get("FGPU_CLUSTER_STATE", "/var/lib/fgpu-cluster")
HOST, PORT = "127.0.0.1", 6443
RES = "/apis/resource.k8s.io/v1"
DRIVER = "gpu.fgpu.dev"
CLASS = "shared.gpu.fgpu.dev"
LABEL = "replay.fgpu.dev/sim"
# GPU memory per model of the Alibaba trace, MiB, as the kubelet plugin would publish it.
# The trace names Alibaba's own G2 and G3 without a size: taken as 32 and 48 GiB.
MODEL_MIB = {"T4": 15360, "P100": 16384, "V100M16": 16384, "V100M32": 32768, "A10": 23028,
             "G2": 32768, "G3": 49152, "H100": 81559, "A100": 81920}
DEFAULT_MIB = 16384
MIB = 1 << 20

_tl = threading.local()
_ctx = None


_ctx_lock = threading.Lock()


def ctx():
    """The TLS context with the admin certificate, made once. Published only when complete:
    a thread that saw it before load_cert_chain had run would connect without a client
    certificate and be served as system:anonymous (seen in CI as a 403 on POST nodes)."""
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            pki = os.path.join(STATE, "pki")
            c = ssl.create_default_context(cafile=os.path.join(pki, "ca.crt"))
            c.load_cert_chain(os.path.join(pki, "admin.crt"), os.path.join(pki, "admin.key"))
            _ctx = c
        return _ctx


def call(method, path, body=None, ctype="application/json", ok=(200, 201)):
    """One API call on this thread's kept-alive connection; retries what is transient."""
    for attempt in range(20):
        c = getattr(_tl, "c", None)
        if c is None:
            c = _tl.c = http.client.HTTPSConnection(HOST, PORT, context=ctx(), timeout=120)
        try:
            data = None if body is None else json.dumps(body).encode()
            c.request(method, path, body=data, headers={"Content-Type": ctype} if data else {})
            r = c.getresponse()
            out = r.read()
        except (http.client.HTTPException, OSError):
            _tl.c = None
            time.sleep(0.2)
            continue
        if r.status in ok:
            return json.loads(out) if out else None
        if r.status in (409, 429, 500, 503, 504) and attempt < 19:
            time.sleep(0.2 * (attempt + 1))
            continue
        sys.exit(f"{method} {path}: HTTP {r.status}: {out[:300]!r}")
    sys.exit(f"{method} {path}: no answer after 20 tries")


def parallel(fn, items, workers=32):
    with cf.ThreadPoolExecutor(workers) as ex:
        for _ in ex.map(fn, items):
            pass


def list_all(path):
    items, cont = [], ""
    while True:
        sep = "&" if "?" in path else "?"
        page = call("GET", f"{path}{sep}limit=2000" + (f"&continue={cont}" if cont else ""))
        items += page["items"]
        cont = page["metadata"].get("continue")
        if not cont:
            return items


def qty(s):
    m = re.fullmatch(r"([0-9.]+)([KMGTE]i?|m)?", str(s))
    if not m:
        sys.exit(f"not a quantity: {s!r}")
    mult = {None: 1, "m": 1e-3, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
            "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[m.group(2)]
    return float(m.group(1)) * mult


def read_nodes(path):
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["gpu"]) > 0]
    for r in rows:
        r["gpu"] = int(r["gpu"])
        r["mib"] = MODEL_MIB.get(r["model"], DEFAULT_MIB)
    return rows


def read_placements(path, policy=None, seed=None):
    """Rows of fgpu-sim --placements (or of `collect`), in arrival order."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "seq" not in rows[0]:
        sys.exit(f"{path}: not a placements file (no seq column)")
    out = [r for r in rows if (policy is None or r["sc_policy"] == policy)
           and (seed is None or r["seed"] == str(seed))]
    for r in out:
        for k in ("seq", "num_gpu", "gpu_milli"):
            r[k] = int(r[k])
    out.sort(key=lambda r: (r["sc_policy"], int(r["seed"]), r["seq"]))
    return out


# --- inventory

def inventory(nodes_csv):
    nodes = read_nodes(nodes_csv)

    def one(n):
        name = n["sn"]
        call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "labels": {LABEL: "true", "kubernetes.io/hostname": name, "type": "kwok"},
            "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "status": {"capacity": {"cpu": f"{int(n['cpu_milli'])}m", "memory": f"{n['memory_mib']}Mi", "pods": "1000"},
                       "allocatable": {"cpu": f"{int(n['cpu_milli'])}m", "memory": f"{n['memory_mib']}Mi", "pods": "1000"}}},
            ok=(201, 409))
        mem = f"{n['mib']}Mi"
        devs = [{"name": f"gpu-{g}", "allowMultipleAllocations": True,
                 "attributes": {"type": {"string": "gpu"}, "uuid": {"string": f"GPU-{name}-{g}"},
                                "productName": {"string": n["model"]}, "index": {"int": g},
                                "numaNode": {"int": 2 * g // n["gpu"]}},
                 "capacity": {"memory": {"value": mem, "requestPolicy": {"default": mem, "validRange": {"min": "256Mi", "step": "1Mi"}}},
                              "cores": {"value": "100", "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}}}}
                for g in range(n["gpu"])]
        call("POST", RES + "/resourceslices", {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {
            "name": f"{name}-{DRIVER}", "labels": {LABEL: "true"}},
            "spec": {"driver": DRIVER, "nodeName": name, "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                     "devices": devs}}, ok=(201, 409))
    parallel(one, nodes)
    print(json.dumps({"nodes": len(nodes), "gpus": sum(n["gpu"] for n in nodes)}))


def wipe_inventory():
    sel = LABEL.replace("/", "%2F") + "%3Dtrue"
    call("DELETE", f"{RES}/resourceslices?labelSelector={sel}", ok=(200,))
    for n in list_all(f"/api/v1/nodes?labelSelector={sel}"):
        call("DELETE", f"/api/v1/nodes/{n['metadata']['name']}", ok=(200, 404))


# --- workload

def claim_spec(row, min_mib):
    req = {"deviceClassName": CLASS}
    if row["gpu_milli"] >= 1000:
        req["count"] = max(1, row["num_gpu"])
    else:
        mem = row["gpu_milli"] * min_mib // 1000
        req["capacity"] = {"requests": {"memory": f"{mem}Mi", "cores": str(row["gpu_milli"] // 10)}}
    return {"devices": {"requests": [{"name": "gpu", "exactly": req}]}}


def create(ns, placements, policy, gate, nodes_csv, sequential=None):
    rows = read_placements(placements, policy)
    seeds = {r["seed"] for r in rows}
    if len(seeds) != 1:
        sys.exit(f"{placements}: policy {policy}: want the rows of one seed, found {sorted(seeds) or 'none'}")
    bad = [r["name"] for r in rows if r["gpu_milli"] < 1000 and r["gpu_milli"] % 10]
    if bad:
        sys.exit(f"{placements}: gpu_milli not a multiple of 10 (cores are whole percent): {bad[:5]}")
    min_mib = min(n["mib"] for n in read_nodes(nodes_csv))
    call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, ok=(201, 409))

    def one(r):
        seq = r["seq"]
        call("POST", f"{RES}/namespaces/{ns}/resourceclaims", {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": f"c-{seq:06d}", "annotations": {"replay.fgpu.dev/pod": r["name"]}},
             "spec": claim_spec(r, min_mib)}, ok=(201, 409))
        call("POST", f"/api/v1/namespaces/{ns}/pods", {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"p-{seq:06d}", "annotations": {"replay.fgpu.dev/pod": r["name"]}},
             "spec": {"schedulingGates": [{"name": gate}], "terminationGracePeriodSeconds": 0,
                      "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                      "resourceClaims": [{"name": "gpu", "resourceClaimName": f"c-{seq:06d}"}],
                      "containers": [{"name": "c", "image": "replay.invalid/none", "resources": {"claims": [{"name": "gpu"}]}}]}},
             ok=(201, 409))

    if sequential is None:
        parallel(one, rows)
        print(json.dumps({"created": len(rows)}))
        return
    # One at a time, each decided (allocated, or an Event that it does not fit) before the
    # next: the controller then sees the arrivals one per pass, as the simulator does.
    t0 = time.time()
    for r in rows:
        one(r)
        seq, deadline = r["seq"], time.time() + sequential
        while True:
            c = call("GET", f"{RES}/namespaces/{ns}/resourceclaims/c-{seq:06d}")
            if c.get("status", {}).get("allocation"):
                break
            ev = call("GET", f"/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name%3Dp-{seq:06d}"
                      "%2Creason%3DGpuAllocationPending")
            if ev["items"]:
                break
            if time.time() > deadline:
                sys.exit(f"arrival {seq} ({r['name']}): neither allocated nor reported pending in {sequential}s")
            time.sleep(0.1)
    print(json.dumps({"created": len(rows), "seconds": round(time.time() - t0, 1)}))


def collect(ns, placements, policy, label, out):
    rows = read_placements(placements, policy)
    by_seq = {}
    for c in list_all(f"{RES}/namespaces/{ns}/resourceclaims"):
        m = re.fullmatch(r"c-(\d+)", c["metadata"]["name"])
        a = c.get("status", {}).get("allocation")
        if m and a:
            res = a["devices"]["results"]
            pools = {x["pool"] for x in res}
            if len(pools) != 1:
                sys.exit(f"{ns}/{c['metadata']['name']}: results on {len(pools)} pools")
            by_seq[int(m.group(1))] = (pools.pop(), "+".join(x["device"] for x in res))
    cols = ["sc_policy", "seed", "seq", "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "node", "gpus"]
    with open(out, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(cols)
        for r in rows:
            node, gpus = by_seq.get(r["seq"], ("", ""))
            w.writerow([label] + [r[k] for k in cols[1:9]] + [node, gpus])
    print(json.dumps({"arrivals": len(rows), "allocated": len(by_seq)}))


# --- figures

def round2(x):
    """Rust's (x * 100).round() / 100 for x >= 0 (half away from zero), as fgpu-sim rounds."""
    return math.floor(x * 100 + 0.5) / 100


def curve_of(rows, total_gpus):
    """Allocation % of GPU capacity at arrived = 0..130 %, discretised as fgpu-sim does
    (sim::discretise, the artifact's merge_alloc_discrete): the rows whose arrived % rounds
    (half to even) to x, else those within x +- 1, averaged; None where there are none."""
    tg = max(total_gpus, 1)
    log, arrived, used = [], 0, 0
    for r in rows:
        ask = r["num_gpu"] * min(r["gpu_milli"], 1000)
        arrived += ask
        if r["node"]:
            used += ask
        log.append((round(arrived / tg / 10.0), round2(used / tg / 10.0)))
    out = []
    for x in range(131):
        def mean(lo, hi):
            v = [u for a, u in log if lo <= a <= hi]
            return round2(sum(v) / len(v)) if v else None
        m = mean(x, x)
        out.append(m if m is not None else mean(x - 1, x + 1))
    return out


def metric_of(rows, total_gpus):
    """The paper's metric over one run's rows (arrival order): unallocated GPU % at arrived
    = 100 % (fgpu-sim's figure), and the arrived and unallocated % at the first arrival that
    found no room."""
    cap = total_gpus * 1000
    arrived = used = 0
    first_fail = None
    for r in rows:
        ask = r["num_gpu"] * min(r["gpu_milli"], 1000)
        arrived += ask
        if r["node"]:
            used += ask
        elif first_fail is None:
            first_fail = (100.0 * arrived / cap, 100.0 * (1 - used / cap))
    at100 = curve_of(rows, total_gpus)[100]
    return {"unallocated_at_100": None if at100 is None else round2(100.0 - at100), "arrivals": len(rows),
            "placed": sum(1 for r in rows if r["node"]),
            "first_fail_arrived": None if first_fail is None else round(first_fail[0], 2),
            "first_fail_unallocated": None if first_fail is None else round(first_fail[1], 2)}


def curve(nodes_csv, workload, out, files):
    """The runs of `files` as rows of fgpu-sim's --out layout (analysis_allo_discrete.csv)."""
    total = sum(n["gpu"] for n in read_nodes(nodes_csv))
    with open(out, "w") as f:
        f.write("workload,sc_policy,tune,seed,total_gpus," + ",".join(str(x) for x in range(131)) + "\n")
        for path in files:
            runs = {}
            for r in read_placements(path):
                runs.setdefault((r["sc_policy"], r["seed"]), []).append(r)
            for (p, seed), rs in sorted(runs.items()):
                cells = ["" if v is None else (f"{v:.1f}" if v == int(v) else repr(v)) for v in curve_of(rs, total)]
                f.write(f"{workload},{p},0,{seed},{total}," + ",".join(cells) + "\n")


def metric(nodes_csv, files):
    total = sum(n["gpu"] for n in read_nodes(nodes_csv))
    for f in files:
        rows = read_placements(f)
        runs = {}
        for r in rows:
            runs.setdefault((r["sc_policy"], r["seed"]), []).append(r)
        for (p, s), rs in sorted(runs.items()):
            print(json.dumps({"file": f, "policy": p, "seed": int(s), "gpus": total, **metric_of(rs, total)}))


def agree(fa, pa, fb, pb):
    a = {r["seq"]: r for r in read_placements(fa, pa)}
    b = {r["seq"]: r for r in read_placements(fb, pb)}
    if a.keys() != b.keys():
        sys.exit(f"{fa} ({pa}) and {fb} ({pb}) list different arrivals")
    diff = [s for s in sorted(a) if (a[s]["node"], a[s]["gpus"]) != (b[s]["node"], b[s]["gpus"])]
    first = None
    if diff:
        s = diff[0]
        first = {"seq": s, "pod": a[s]["name"], pa: f"{a[s]['node']}/{a[s]['gpus']}", pb: f"{b[s]['node']}/{b[s]['gpus']}"}
    print(json.dumps({"arrivals": len(a), "same": len(a) - len(diff), "different": len(diff), "first_difference": first}))
    return not diff


def check(ns):
    """No over-grant, from the API objects: per device, the consumed capacity of all claims
    within what the slice publishes; a result without a share takes the device alone."""
    cap = {}
    for s in list_all(f"{RES}/resourceslices"):
        if s["spec"].get("driver") != DRIVER:
            continue
        for d in s["spec"].get("devices", []):
            c = d.get("capacity", {})
            cap[(s["spec"]["pool"]["name"], d["name"])] = (qty(c["memory"]["value"]), qty(c["cores"]["value"]))
    use, bad, n = {}, [], 0
    for c in list_all(f"{RES}/namespaces/{ns}/resourceclaims"):
        a = c.get("status", {}).get("allocation")
        if not a:
            continue
        n += 1
        for r in a["devices"]["results"]:
            k = (r["pool"], r["device"])
            u = use.setdefault(k, [0.0, 0.0, 0, 0])
            if r.get("shareID"):
                cc = r.get("consumedCapacity") or {}
                u[0] += qty(cc.get("memory", 0))
                u[1] += qty(cc.get("cores", 0))
                u[2] += 1
            else:
                u[3] += 1
    for k, (m, co, shares, whole) in use.items():
        if k not in cap:
            bad.append(f"{k[0]}/{k[1]}: not in the inventory")
        elif whole > 1 or (whole and shares):
            bad.append(f"{k[0]}/{k[1]}: {whole} whole grants beside {shares} shares")
        elif m > cap[k][0] or co > cap[k][1]:
            bad.append(f"{k[0]}/{k[1]} over-granted: {shares} shares, {m / MIB:g}Mi of {cap[k][0] / MIB:g}Mi, {co:g} of {cap[k][1]:g} cores")
    print(json.dumps({"allocated": n, "devices_used": len(use), "violations": bad[:20], "n_violations": len(bad)}))
    return not bad


def ungate(ns):
    pods = list_all(f"/api/v1/namespaces/{ns}/pods")
    parallel(lambda p: call("PATCH", f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}",
                            {"spec": {"schedulingGates": None}}, ctype="application/merge-patch+json"), pods)
    print(json.dumps({"ungated": len(pods)}))


def wipe(ns):
    call("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0", ok=(200, 404))
    call("DELETE", f"{RES}/namespaces/{ns}/resourceclaims", ok=(200, 404))
    left = [c for c in list_all(f"{RES}/namespaces/{ns}/resourceclaims") if c["metadata"].get("finalizers")]
    parallel(lambda c: call("PATCH", f"{RES}/namespaces/{ns}/resourceclaims/{c['metadata']['name']}",
                            {"metadata": {"finalizers": None}}, ctype="application/merge-patch+json", ok=(200, 404)), left)


def main(argv):
    usage = __doc__.split("\n\n")[2]
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(usage)
        return 0 if len(argv) >= 2 else 2
    cmd, a = argv[1], argv[2:]
    try:
        if cmd == "inventory" and len(a) == 1:
            inventory(a[0])
        elif cmd == "wipe-inventory" and not a:
            wipe_inventory()
        elif cmd == "create" and len(a) in (5, 7) and (len(a) == 5 or a[5] == "--sequential"):
            create(a[0], a[1], a[2], a[3], a[4], float(a[6]) if len(a) == 7 else None)
        elif cmd == "collect" and len(a) == 5:
            collect(*a)
        elif cmd == "metric" and len(a) >= 2:
            metric(a[0], a[1:])
        elif cmd == "curve" and len(a) >= 4:
            curve(a[0], a[1], a[2], a[3:])
        elif cmd == "agree" and len(a) == 4:
            return 0 if agree(*a) else 1
        elif cmd == "ungate" and len(a) == 1:
            ungate(a[0])
        elif cmd == "check" and len(a) == 1:
            return 0 if check(a[0]) else 1
        elif cmd == "wipe" and len(a) == 1:
            wipe(a[0])
        else:
            print(f"replay.py: bad arguments: {' '.join(argv[1:])}\n{usage}", file=sys.stderr)
            return 2
    except (OSError, KeyError, ValueError) as e:
        print(f"replay.py {cmd}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
