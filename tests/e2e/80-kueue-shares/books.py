#!/usr/bin/env python3
"""What the cluster has granted, read from `kubectl get -o json` output (for test.sh).

  books.py grants <list.json> <driver> <pool> <device> <resource>
      one line: "claims=N memory=BYTES kueue=UNITS" from a list of ResourceClaims and
      Workloads (`kubectl get resourceclaims,workloads -A -o json`): the claims allocated
      on that device, the memory their allocations consume, and the units of <resource>
      Kueue has reserved (the admissions of the Workloads whose QuotaReserved is True).
      Each kind comes from one list, so one consistent snapshot of it (ClusterQueue
      status, updated queue by queue, is not)
  books.py usage <clusterqueue.json> <resource>
      "total borrowed" of that resource in one ClusterQueue's status.flavorsUsage
  books.py condition <object.json> <type>
      "status reason" of that condition, or "none"
  books.py claim <claim.json>
      "driver/pool/device memory" of the claim's first allocation result
"""
import json
import re
import sys

UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
         "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity(q):
    """Bytes of a Kubernetes quantity such as 20Gi or 21474836480."""
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q))
    if not m or m.group(2) not in UNITS:
        raise SystemExit(f"books.py: not a quantity: {q!r}")
    return int(float(m.group(1)) * UNITS[m.group(2)])


def load(path):
    with open(path) as f:
        return json.load(f)


def results(claim):
    return (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []


def grants(items, driver, pool, device, resource):
    claims = [i for i in items["items"] if i.get("kind") == "ResourceClaim"]
    workloads = [i for i in items["items"] if i.get("kind") == "Workload"]
    n = mem = 0
    for c in claims:
        for r in results(c):
            if (r.get("driver"), r.get("pool"), r.get("device")) == (driver, pool, device):
                n += 1
                mem += quantity((r.get("consumedCapacity") or {}).get("memory", 0))
    used = 0
    for wl in workloads:
        if not condition(wl, "QuotaReserved").startswith("True "):
            continue
        admission = (wl.get("status") or {}).get("admission") or {}
        for psa in admission.get("podSetAssignments") or []:
            used += quantity((psa.get("resourceUsage") or {}).get(resource, 0))
    return f"claims={n} memory={mem} kueue={used}"


def usage(cq, resource):
    for fl in (cq.get("status") or {}).get("flavorsUsage") or []:
        for res in fl.get("resources") or []:
            if res.get("name") == resource:
                return f"{quantity(res.get('total', 0))} {quantity(res.get('borrowed', 0))}"
    return "0 0"


def condition(obj, ctype):
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return f"{c.get('status')} {c.get('reason')}"
    return "none"


def claim(c):
    rs = results(c)
    if not rs:
        return "unallocated"
    r = rs[0]
    mem = (r.get("consumedCapacity") or {}).get("memory", "none")
    return f"{r.get('driver')}/{r.get('pool')}/{r.get('device')} {mem}"


def main(argv):
    cmd, args = argv[1], argv[2:]
    if cmd == "grants":
        print(grants(load(args[0]), *args[1:5]))
    elif cmd == "usage":
        print(usage(load(args[0]), args[1]))
    elif cmd == "condition":
        print(condition(load(args[0]), args[1]))
    elif cmd == "claim":
        print(claim(load(args[0])))
    else:
        raise SystemExit(f"books.py: unknown command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv)
