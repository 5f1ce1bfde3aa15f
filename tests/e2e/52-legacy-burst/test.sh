#!/usr/bin/env bash
# Scenario: 20 pods created at once onto 2 nodes never over-grant. Each pod asks for one GPU
# with 40000 MiB and 50 % cores: two fit per GPU. Nodes: fgpu-node (real kubelet, the device
# plugin, tests/e2e/legacy-node.yaml: an H100 of 81559 MiB and an A100 of 81920 MiB) and a
# stand-in, fgpu-kwok-52: a Node kept Ready by kwok (no kubelet; kwok marks its pods
# Running, no container runs) whose inventory annotation the test writes in the device
# plugin's format (two A100 80 GB). Together: 4 GPUs, room for exactly 8 pods.
#
# Asserted, from the decision annotations (what the extender granted): exactly 8 pods are
# bound, each with a decision for the node it is bound to; per GPU the granted memory and
# cores sum to at most the GPU's capacity (here: every GPU exactly full, 2 pods, 100 %
# cores); the other 12 stay Pending with FailedScheduling. The 4 pods on fgpu-node reach
# Running (the kubelet's Allocate through the device plugin) and each container has the
# limits of its own decision's GPU (the device plugin asked the kubelet's pod resources API
# which pod each Allocate was for). Deleting two bound pods lets two pending ones in.
source "$(dirname "$0")/../lib.sh"
source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../legacy-lib.sh"
trap 'legacy_cleanup $?' EXIT
legacy_setup 52
legacy_up
start_kwok
kwok_node fgpu-kwok-52 '[{"id":"gpu-0","uuid":"GPU-4b0c5200-0000-4000-8000-000000000000","model":"NVIDIA A100-SXM4-80GB","memoryBytes":85899345920,"cores":100,"numa":0,"healthy":true},{"id":"gpu-1","uuid":"GPU-4b0c5200-0000-4000-8000-000000000001","model":"NVIDIA A100-SXM4-80GB","memoryBytes":85899345920,"cores":100,"numa":1,"healthy":true}]'
sleep 3 # the extender's resync (2 s) reads the new node's inventory

t0=$SECONDS
legacy_apply "$E2E_DIR/pods.yaml"
nbound() { kubectl -n "$E2E_NS" get pods -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | grep -c . || true; }
wait_until 120 "8 pods bound" sh -c "[ \"\$(kubectl -n $E2E_NS get pods -o jsonpath='{range .items[*]}{.spec.nodeName}{\"\\n\"}{end}' | grep -c .)\" -ge 8 ]"
say "8 pods bound $((SECONDS - t0))s after the 20 were created"
# Give the scheduler time to try the rest (and to bind too many, were it able to).
wait_until 60 "12 pods reported FailedScheduling" sh -c \
  "[ \"\$(kubectl -n $E2E_NS get events --field-selector reason=FailedScheduling -o jsonpath='{range .items[*]}{.involvedObject.name}{\"\\n\"}{end}' | sort -u | wc -l)\" -ge 12 ]"
say "12 pods reported FailedScheduling $((SECONDS - t0))s after the 20 were created"
sleep 5
assert_eq "pods bound" 8 "$(nbound)"

# The grants, from the decision annotations, against the capacities.
kubectl -n "$E2E_NS" get pods -o json >"$work/pods.json"
{ node_inventory "$NODE_NAME"; echo; node_inventory fgpu-kwok-52; echo; } >"$work/inventories.json"
python3 - "$work/pods.json" "$work/inventories.json" "$NODE_NAME" <<'PY' >&2 || fail "over-grant or inconsistent decisions (above)"
import json, sys
pods = json.load(open(sys.argv[1]))["items"]
invs = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
nodes = [sys.argv[3], "fgpu-kwok-52"]
cap = {(n, g["uuid"]): (g["memoryBytes"], g.get("cores", 100)) for n, inv in zip(nodes, invs) for g in inv}
use, bad = {k: [0, 0, 0] for k in cap}, []
for p in pods:
    name, node = p["metadata"]["name"], p["spec"].get("nodeName", "")
    ann = p["metadata"].get("annotations", {}).get("gpu.fgpu.dev/assigned-devices")
    if not node:
        if ann:
            bad.append(f"{name}: not bound but has a decision")
        continue
    if not ann:
        bad.append(f"{name}: bound to {node} without a decision"); continue
    d = json.loads(ann)
    if d["node"] != node:
        bad.append(f"{name}: bound to {node}, decision for {d['node']}")
    for c in d["containers"]:
        for dev in c["devices"]:
            k = (d["node"], dev["uuid"])
            if k not in cap:
                bad.append(f"{name}: unknown GPU {k}"); continue
            use[k][0] += dev["memoryBytes"]; use[k][1] += dev["cores"]; use[k][2] += 1
for k, (m, c, n) in sorted(use.items()):
    print(f"    {k[0]} {k[1]}: {n} pods, {m >> 20} of {cap[k][0] >> 20} MiB, {c} of {cap[k][1]} % cores")
    if m > cap[k][0] or c > cap[k][1]:
        bad.append(f"{k}: OVER-GRANTED: {m} > {cap[k][0]} bytes or {c} > {cap[k][1]} cores")
    if n != 2:
        bad.append(f"{k}: {n} pods, want exactly 2 (two fit per GPU)")
for b in bad:
    print("    " + b)
sys.exit(1 if bad else 0)
PY
say "ok: no GPU over-granted; every GPU holds exactly two 40000 MiB / 50 % grants"
pending="$(kubectl -n "$E2E_NS" get pods --field-selector=status.phase=Pending -o json \
  | py_json "len([p for p in d['items'] if not p['spec'].get('nodeName')])")"
assert_eq "unbound pods" 12 "$pending"
say "one FailedScheduling: $(kubectl -n "$E2E_NS" get events --field-selector reason=FailedScheduling -o jsonpath='{.items[-1:].message}' | cut -c1-250)"

# The real node's pods run, each with its own decision's GPU and grant.
real="$(kubectl -n "$E2E_NS" get pods -o jsonpath="{range .items[?(@.spec.nodeName==\"$NODE_NAME\")]}{.metadata.name}{\" \"}{end}")"
assert_eq "pods on $NODE_NAME" 4 "$(wc -w <<<"$real")"
t0=$SECONDS
for p in $real; do
  wait_until 120 "pod $p Running" jp_eq "pod/$p" '{.status.phase}' Running
  g="$(decision_field "$p" 'd["containers"][0]["devices"][0]["id"]')"
  got="$(kubectl -n "$E2E_NS" exec "$p" -- sh -c 'ls /dev/nvidia[0-9]*; sed -n "s/^gpu\.[^.]*\.\(memory\|cores\)=/\1=/p" /etc/fgpu/claims/*/limits' | tr '\n' ' ')"
  assert_eq "$p: device node and limits (decision: $g)" "/dev/nvidia${g#gpu-} memory=$((40000 << 20)) cores=50 " "$got"
done

say "the 4 pods on $NODE_NAME checked $((SECONDS - t0))s after the first check began"
# Each Allocate named the pod the kubelet was admitting (its pod resources API), not a guess.
assert_eq "allocations confirmed by the kubelet's pod resources view" 4 \
  "$(grep -c 'kubelet_confirmed=true' "$work/device-plugin.log" || true)"

# Two bound pods go; two pending pods take their places (and nothing more).
gone="$(kubectl -n "$E2E_NS" get pods -o jsonpath="{range .items[?(@.spec.nodeName==\"fgpu-kwok-52\")]}{.metadata.name}{\" \"}{end}" | cut -d' ' -f1-2)"
# shellcheck disable=SC2086 # two names
kubectl -n "$E2E_NS" delete pod $gone --grace-period=0 --force >&2 2>/dev/null || true
t0=$SECONDS
wait_until 90 "8 pods bound again" sh -c "[ \"\$(kubectl -n $E2E_NS get pods -o jsonpath='{range .items[*]}{.spec.nodeName}{\"\\n\"}{end}' | grep -c .)\" -ge 8 ]"
say "two pending pods bound $((SECONDS - t0))s after two bound ones were deleted"
sleep 5
assert_eq "pods bound after deleting two" 8 "$(nbound)"
