#!/usr/bin/env bash
# Scenario: the controller (--mode controller: it writes consumedCapacity + shareID) and
# kube-scheduler allocate shares of the SAME fake GPUs at the same time (1.36+, consumable
# capacity on). The mutating webhook is registered for the scenario's namespace only
# (namespaceSelector kubernetes.io/metadata.name In [$E2E_NS]): pods there are gated and
# their claims allocated by the controller; pods in a second namespace ($E2E_NS-sched, which
# the webhook skips) are not gated, and kube-scheduler allocates their claims itself.
#
# Burst: 7 pods per side, each with one claim of the class shared.gpu.fgpu.dev asking for
# capacity.requests {memory: 12Gi, cores: 15}, all created in one `kubectl apply`. The node
# (deploy/fake/e2e-node.yaml) has two fake H100s, 81559Mi and 100 cores each: 6 shares fit
# per GPU (6 x 12Gi = 72Gi, 6 x 15 = 90 cores; a 7th would need 84Gi / 105 cores), so 12 of
# the 14 fit and 2 cannot. A blind allocator on either side would over-book.
#
# Asserted:
# * per GPU, the sum of status.allocation...consumedCapacity.memory and .cores over all
#   allocated claims of both namespaces (both allocators) <= the device's capacity in the
#   ResourceSlice; no claim has more than one result; every allocated claim has a shareID
#   (a UUID) and consumedCapacity; the number of allocated claims is exactly 12;
# * both allocators took part (at least one claim with the controller's finalizer, one
#   with only the scheduler's);
# * exactly 12 pods run, and each sees its quota (cuMemGetInfo total 12288 MiB, allocation
#   past it refused); the 2 others wait with a reason: gated with the Event
#   GpuAllocationPending (controller side) or PodScheduled=False/Unschedulable (scheduler
#   side);
# * deleting as many running pods as wait (one per side with the default 7 + 7) lets the
#   waiting ones run, each with its quota, and the per-GPU sums still hold.
# FGPU_E2E_COEXIST_PODS=N: N pods per side (default 7) for a bigger burst; when the pods do
# not all fit, the assertions count the fitting ones from the slice.
# Skipped below 1.36 (no consumable capacity by default: kube-scheduler cannot share a GPU,
# so there is nothing to coexist with) and where the API server dropped
# allowMultipleAllocations.
source "$(dirname "$0")/../lib.sh"
[ "$(dra_api_version)" = v1 ] || skip "Kubernetes $K8S_VERSION: no resource.k8s.io/v1"
[ "$K8S_MINOR" -ge 36 ] || skip "Kubernetes $K8S_VERSION: no consumable capacity by default before 1.36 (kube-scheduler cannot share a GPU; nothing to coexist with)"
# The two allocators share no lock: a claim one of them has chosen but not yet written is
# invisible to the other. This scenario found that race (2026-11-29: gpu-0 with 84Gi of
# 79.6Gi). The controller now lifts a gate only once its allocations have settled
# (--settle-ms) and still fit with every committed claim counted first; a claim of a
# still-gated pod that no longer fits is revoked and placed again (docs/controller.md,
# "Coexistence with kube-scheduler").

source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../controller-lib.sh"
plugin_setup 44
controller_setup
slice=$PLUGIN_SLICE
NS_C="$E2E_NS"            # gated: the controller allocates
NS_S="$E2E_NS-sched"      # not gated: kube-scheduler allocates
PER_SIDE="${FGPU_E2E_COEXIST_PODS:-7}"
MEM_GI=12 CORES=15

cleanup() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    say "claims at failure:"; claims_table 2>/dev/null | sed 's/^/      /' >&2 || true
  fi
  for ns in "$NS_C" "$NS_S"; do
    kubectl -n "$ns" delete pods --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  done
  timeout 30 sh -c "while kubectl -n $NS_C get resourceclaims -o name | grep -q .; do sleep 1; done" 2>/dev/null || true
  for c in $(kubectl -n "$NS_C" get resourceclaims -o name 2>/dev/null); do
    kubectl -n "$NS_C" patch "$c" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
  done
  kubectl delete namespace "$NS_S" --wait=true --timeout=60s >/dev/null 2>&1 || true
  controller_cleanup $rc
  kubectl delete -f "$E2E_DIR/../../../deploy/deviceclasses.yaml" --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  exit $rc
}
trap cleanup EXIT

kubectl create namespace "$NS_S" >&2
wait_until 30 "ServiceAccount default in $NS_S" kubectl -n "$NS_S" get serviceaccount default
kubectl apply -f "$E2E_DIR/../../../deploy/deviceclasses.yaml" >&2
start_plugin
wait_registered 1
wait_until 30 "ResourceSlice $slice published" kubectl get resourceslice "$slice"
[ "$(jp "resourceslice/$slice" '{.spec.devices[0].allowMultipleAllocations}' "")" = true ] \
  || skip "the API server dropped allowMultipleAllocations (DRAConsumableCapacity off)"
# device capacity from the slice: "gpu-0 81559Mi 100"
capacity="$(kubectl get resourceslice "$slice" -o jsonpath='{range .spec.devices[*]}{.name} {.capacity.memory.value} {.capacity.cores.value}{"\n"}{end}')"
say "devices (name memory cores): $(echo "$capacity" | tr '\n' ';')"
start_controller --mode controller
register_webhooks

# --- the burst: both sides in one apply
manifest() {
  local ns
  for ns in "$NS_C" "$NS_S"; do
    cat <<EOF
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: share, namespace: $ns}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: shared.gpu.fgpu.dev
          capacity: {requests: {memory: ${MEM_GI}Gi, cores: "$CORES"}}
EOF
  done
  local i
  for i in $(seq 1 "$PER_SIDE"); do
    for ns in "$NS_C" "$NS_S"; do
      cat <<EOF
---
apiVersion: v1
kind: Pod
metadata: {name: share-$i, namespace: $ns}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  resourceClaims: [{name: gpu, resourceClaimTemplateName: share}]
  securityContext: {runAsUser: 1000, runAsGroup: 1000, runAsNonRoot: true}
  containers:
  - name: probe
    image: $FGPU_WORKLOAD_IMAGE
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "/usr/local/bin/fgpu-probe --step-mib 1024 --max-gib 16; echo probe_done; exec sleep 3600"]
    resources: {claims: [{name: gpu}]}
EOF
    done
  done
}
# the templates first (the webhook looks them up when a pod is created)
manifest | python3 -c 'import sys; print("\n---\n".join(d for d in sys.stdin.read().split("\n---\n") if "kind: ResourceClaimTemplate" in d))' | kubectl apply -f - >&2
t0=$SECONDS
manifest | python3 -c 'import sys; print("\n---\n".join(d for d in sys.stdin.read().split("\n---\n") if "kind: Pod" in d))' | kubectl apply -f - >/dev/null
say "created $PER_SIDE pods in $NS_C (gated, controller) and $PER_SIDE in $NS_S (kube-scheduler), ${MEM_GI}Gi + $CORES cores each"

# claims_table: ns|name|devices|memory|cores|shareIDs|finalizers, one line per claim ('|'
# between fields: an unallocated claim still carries the controller's finalizer when its
# allocation was revoked)
claims_table() {
  local ns
  for ns in "$NS_C" "$NS_S"; do
    kubectl -n "$ns" get resourceclaims -o jsonpath='{range .items[*]}{.metadata.namespace}|{.metadata.name}|{.status.allocation.devices.results[*].device}|{.status.allocation.devices.results[*].consumedCapacity.memory}|{.status.allocation.devices.results[*].consumedCapacity.cores}|{.status.allocation.devices.results[*].shareID}|{.metadata.finalizers[*]}{"\n"}{end}'
  done
}
# check_sums: per GPU sum of consumedCapacity <= capacity, one result per allocated claim
check_sums() {
  claims_table | CAPACITY="$capacity" python3 -c '
import os, sys, re
def q(s):
    m = re.fullmatch(r"([0-9.]+)([KMGTE]i?)?", s)
    if not m: raise SystemExit("cannot parse quantity " + repr(s))
    mult = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "K": 10**3, "M": 10**6, "G": 10**9}[m.group(2)]
    return float(m.group(1)) * mult
cap = {}
for l in os.environ["CAPACITY"].split("\n"):
    if l.strip():
        n, m, c = l.split()
        cap[n] = (q(m), q(c))
use = {n: [0, 0, 0, 0] for n in cap}  # memory, cores, claims by controller, by scheduler
bad = []
for l in sys.stdin:
    f = l.rstrip("\n").split("|")
    if len(f) != 7:
        if l.strip(): bad.append(f"cannot read claims table line {l!r}")
        continue
    ns, name = f[0], f[1]
    devs, mems, coress, shares, fins = (x.split() for x in f[2:])
    if not devs: continue   # not allocated
    if len(devs) != 1 or len(mems) != 1 or len(coress) != 1 or len(shares) != 1:
        bad.append(f"{ns}/{name}: not one result with consumedCapacity and shareID {f[2:]}"); continue
    dev, mem, cores, share = devs[0], mems[0], coress[0], shares[0]
    if dev not in cap:
        bad.append(f"{ns}/{name}: unexpected device {dev}"); continue
    if not re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", share):
        bad.append(f"{ns}/{name}: no shareID {f[2:]}"); continue
    use[dev][0] += q(mem); use[dev][1] += q(cores)
    use[dev][2 if "gpu.fgpu.dev/allocation" in fins else 3] += 1
out = []
for n, (m, c, bc, bs) in sorted(use.items()):
    out.append(f"{n}: {m / 2**30:g}Gi of {cap[n][0] / 2**30:g}Gi, {c:g} of {cap[n][1]:g} cores ({bc} by the controller, {bs} by kube-scheduler)")
    if m > cap[n][0]: bad.append(f"{n}: memory over-booked: {m / 2**30:g}Gi > {cap[n][0] / 2**30:g}Gi")
    if c > cap[n][1]: bad.append(f"{n}: cores over-booked: {c:g} > {cap[n][1]:g}")
print("; ".join(out))
tot_c = sum(u[2] for u in use.values()); tot_s = sum(u[3] for u in use.values())
print(f"TOTALS {tot_c} {tot_s}")
if bad:
    print("DOUBLE GRANT / BAD ALLOCATION: " + " | ".join(bad))
    sys.exit(1)
'
}
running_pods() { # ns/name of pods whose probe is done
  local ns p
  for ns in "$NS_C" "$NS_S"; do
    for p in $(kubectl -n "$ns" get pods -o jsonpath='{range .items[?(@.status.phase=="Running")]}{.metadata.name}{" "}{end}'); do
      if kubectl -n "$ns" logs "$p" 2>/dev/null | grep -q probe_done; then echo "$ns/$p"; fi
    done
  done
  return 0
}
n_running() { running_pods | wc -l; }
want=$(( 2 * 6 ))   # 6 shares per GPU by memory and by cores
[ $((2 * PER_SIDE)) -gt "$want" ] || want=$((2 * PER_SIDE))

# wait until the burst settles: $want pods ran their probe, and stays so
enough_running() { [ "$(n_running)" -ge "$want" ]; }
wait_until 240 "$want pods ran their probe" enough_running
say "$want pods ran their probe $((SECONDS - t0))s after the burst"
sleep 5   # give a would-be double grant time to show
out="$(check_sums)" || fail "per-GPU sums: $out"
say "ok: per-GPU sums: $(echo "$out" | head -1)"
read -r _ by_c by_s <<<"$(echo "$out" | grep '^TOTALS')"
[ "$by_c" -ge 1 ] || fail "no claim allocated by the controller"
[ "$by_s" -ge 1 ] || fail "no claim allocated by kube-scheduler"
say "ok: both allocators took part: $by_c claims by the controller, $by_s by kube-scheduler"
[ "$((by_c + by_s))" -eq "$want" ] || fail "$((by_c + by_s)) claims allocated, want $want (capacity)"
running="$(running_pods)"
assert_eq "pods running" "$want" "$(echo "$running" | grep -c .)"

# every running pod sees its quota
field() { kubectl -n "${1%/*}" logs "${1#*/}" | sed -n "s/^$2=//p"; }
for np in $running; do
  assert_eq "$np cuMemGetInfo total (MiB)" $((MEM_GI * 1024)) "$(field "$np" cuda_total_mib)"
  assert_eq "$np allocation past the quota" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(field "$np" next_alloc_result)"
done
say "ok: the $want running pods each see $((MEM_GI * 1024)) MiB and are refused past it"

# the others wait with a reason
waiting=()
for ns in "$NS_C" "$NS_S"; do
  for p in $(kubectl -n "$ns" get pods -o jsonpath='{.items[*].metadata.name}'); do
    grep -qx "$ns/$p" <<<"$running" || waiting+=("$ns/$p")
  done
done
assert_eq "pods waiting" $((2 * PER_SIDE - want)) "${#waiting[@]}"
for np in "${waiting[@]}"; do
  ns="${np%/*}" p="${np#*/}"
  if [ "$ns" = "$NS_C" ]; then
    wait_until 30 "Event GpuAllocationPending on $np" sh -c "kubectl -n $ns get events --field-selector involvedObject.name=$p,reason=GpuAllocationPending -o name | grep -q ."
    assert_eq "$np gated" "gpu.fgpu.dev/allocate" "$(jp "pod/$p" '{.spec.schedulingGates[*].name}' "$ns")"
    say "ok: $np gated: $(kubectl -n "$ns" get events --field-selector "involvedObject.name=$p,reason=GpuAllocationPending" -o jsonpath='{.items[-1:].message}')"
  else
    wait_until 30 "$np unschedulable" sh -c "[ \"\$(kubectl -n $ns get pod $p -o jsonpath='{.status.conditions[?(@.type==\"PodScheduled\")].reason}')\" = Unschedulable ]"
    say "ok: $np pending: $(jp "pod/$p" '{.status.conditions[?(@.type=="PodScheduled")].message}' "$ns" | cut -c1-160)"
  fi
done

# --- deleting as many running pods as wait (alternately from each side; all shares are the
# same size, so each frees a place for one) lets the waiting ones run
if [ "${#waiting[@]}" -gt 0 ]; then
  mapfile -t del < <(paste -d '\n' <(echo "$running" | grep "^$NS_C/") <(echo "$running" | grep "^$NS_S/") | grep . | head -"${#waiting[@]}")
  t0=$SECONDS
  for np in "${del[@]}"; do kubectl -n "${np%/*}" delete pod "${np#*/}" --wait=false >&2; done
  for np in "${waiting[@]}"; do
    wait_until 120 "$np ran its probe" sh -c "kubectl -n ${np%/*} logs ${np#*/} 2>/dev/null | grep -q probe_done"
    assert_eq "$np cuMemGetInfo total (MiB)" $((MEM_GI * 1024)) "$(field "$np" cuda_total_mib)"
  done
  say "ok: after deleting ${del[*]}, ${waiting[*]} ran ($((SECONDS - t0))s), each with $((MEM_GI * 1024)) MiB"
  sleep 3
  out="$(check_sums)" || fail "per-GPU sums after the deletions: $out"
  say "ok: per-GPU sums after the deletions: $(echo "$out" | head -1)"
fi
say "controller: $(curl -s "http://$CONTROLLER_METRICS_ADDR/metrics" | grep -E '^fgpu_controller_(claims_allocated_total|allocation_failures_total)' | tr '\n' ' ')"
