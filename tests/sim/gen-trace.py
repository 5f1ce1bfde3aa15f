#!/usr/bin/env python3
"""A small synthetic GPU cluster trace for the simulator smoke test (`make sim-smoke`).

Writes, in the column layout of the Alibaba GPU trace v2023 ("openb") that `fgpu-sim`
reads, a node list and four pod lists shaped like that trace's variants:

  openb_node_list_gpu_node.csv   sn,cpu_milli,memory_mib,gpu,model
  openb_pod_list_<variant>.csv   name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,
                                 pod_phase,creation_time,deletion_time,scheduled_time

  default      mostly one-GPU pods, a third of them sharing a GPU
  cpu050       half the pods ask for no GPU
  gpushare40   40 % sharing pods
  multigpu30   30 % multi-GPU pods (2, 4 or 8)

The numbers are our own (uniform and weighted draws from Python's seeded Mersenne Twister,
the same on every Python 3), not taken from the Alibaba data; the same seed gives the same
files byte for byte. Usage: gen-trace.py [--seed 42] [--nodes 48] [--pods 500] --out DIR
"""

import argparse
import os
import random

MODELS = [("T4", 0.2), ("P100", 0.15), ("V100M16", 0.2), ("V100M32", 0.1), ("A10", 0.15), ("G2", 0.1), ("G3", 0.1)]
GPUS_PER_NODE = [(1, 0.1), (2, 0.3), (4, 0.3), (8, 0.3)]
VARIANTS = {
    # name: (share of CPU-only pods, share of sharing pods, share of multi-GPU pods)
    "default": (0.10, 0.30, 0.08),
    "cpu050": (0.50, 0.20, 0.05),
    "gpushare40": (0.10, 0.40, 0.05),
    "multigpu30": (0.10, 0.20, 0.30),
}


def weighted(rng, items):
    x, acc = rng.random(), 0.0
    for value, w in items:
        acc += w
        if x < acc:
            return value
    return items[-1][0]


def nodes(rng, n):
    rows = ["sn,cpu_milli,memory_mib,gpu,model"]
    for i in range(n):
        gpus = weighted(rng, GPUS_PER_NODE)
        cpu = rng.choice([32, 64, 96, 128]) * 1000
        mem = rng.choice([128, 256, 384, 512, 768]) * 1024
        rows.append(f"gen-node-{i:04d},{cpu},{mem},{gpus},{weighted(rng, MODELS)}")
    return rows


def pods(rng, n, variant):
    cpu_only, sharing, multi = VARIANTS[variant]
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"]
    t = 0
    for i in range(n):
        x = rng.random()
        if x < cpu_only:
            gpus, milli = 0, 0
        elif x < cpu_only + sharing:
            gpus, milli = 1, rng.randrange(50, 1000, 50)
        elif x < cpu_only + sharing + multi:
            gpus, milli = rng.choice([2, 4, 8]), 1000
        else:
            gpus, milli = 1, 1000
        cpu = rng.choice([1, 2, 4, 6, 8, 12, 16, 32]) * 1000
        mem = rng.choice([2, 4, 8, 12, 16, 32, 64]) * 1024
        spec = rng.choice(["", "", "", "", "V100M16|V100M32"]) if gpus else ""
        qos = rng.choice(["LS", "LS", "BE", "Burstable"])
        t += rng.randrange(1, 5000)
        end = t + rng.randrange(10_000, 10_000_000)
        rows.append(f"gen-pod-{i:05d},{cpu},{mem},{gpus},{milli},{spec},{qos},Running,{t},{end},{t}")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--nodes", type=int, default=48)
    ap.add_argument("--pods", type=int, default=500)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    files = {"openb_node_list_gpu_node.csv": nodes(random.Random(a.seed), a.nodes)}
    for k, v in enumerate(VARIANTS):
        files[f"openb_pod_list_{v}.csv"] = pods(random.Random(a.seed * 1000 + k), a.pods, v)
    for name, rows in files.items():
        with open(os.path.join(a.out, name), "w", encoding="ascii") as f:
            f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
