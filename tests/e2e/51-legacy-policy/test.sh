#!/usr/bin/env bash
# Scenario: the legacy path's placement policies and device choice, on the real node
# (tests/e2e/legacy-node.yaml: gpu-0 an H100, gpu-1 an A100, both ~80 GiB) and on a second,
# simulated node. Every assertion reads the GPU UUIDs in the extender's decision annotation
# (gpu.fgpu.dev/assigned-devices) and the pod's node.
#
# * GPU policy (hami.io/gpu-scheduler-policy): two binpack pods share one GPU; a spread pod
#   then takes the other (less used) GPU.
# * nvidia.com/use-gputype, nvidia.com/nouse-gputype and nvidia.com/use-gpuuuid steer a
#   binpack pod away from the GPU binpack prefers; a type the cluster does not have leaves the
#   pod Pending with the extender's reason in the FailedScheduling event.
# * Node policy (hami.io/node-scheduler-policy) with two nodes: the second node is a
#   stand-in — a Node kept Ready by kwok (no kubelet, no containers: kwok marks its pods
#   Running) whose GPU inventory annotation the test writes in the device plugin's format
#   (two NVIDIA L40S). binpack goes to the node already in use (fgpu-node), spread to the
#   idle one (the kwok node). Pods on fgpu-node run for real (Allocate, CDI, container).
source "$(dirname "$0")/../lib.sh"
source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../legacy-lib.sh"
trap 'legacy_cleanup $?' EXIT
legacy_setup 51
LEGACY_WEBHOOK=0   # see legacy-lib.sh
legacy_up

H100=GPU-e2e1e9ac-0000-4000-8000-000000000000 A100=GPU-e2e1e9ac-0000-4000-8000-000000000001
model_of() { case "$1" in "$H100") echo H100 ;; "$A100") echo A100 ;; *) echo "?" ;; esac; }
# pod <name> <annotations flow map> <MiB>: create it, wait until it is bound
pod() {
  sed -e "s#__NAME__#$1#" -e "s#__ANNOTATIONS__#$2#" -e "s#__MEM__#$3#" "$E2E_DIR/pods.yaml" >"$work/$1.yaml"
  legacy_apply "$work/$1.yaml"
}
bound() { wait_until 60 "pod $1 bound" jp_nonempty "pod/$1" '{.spec.nodeName}'; }
uuid() { decision_field "$1" 'd["containers"][0]["devices"][0]["uuid"]'; }
running() { wait_until 90 "pod $1 Running" jp_eq "pod/$1" '{.status.phase}' Running; }

# --- GPU policy on fgpu-node
pod bin-1 '{hami.io/gpu-scheduler-policy: binpack}' 10000; bound bin-1
first="$(uuid bin-1)"
other="$A100"; [ "$first" = "$A100" ] && other="$H100"
say "bin-1 (binpack) on $(model_of "$first") $first"
pod bin-2 '{hami.io/gpu-scheduler-policy: binpack}' 10000; bound bin-2
assert_eq "bin-2 (binpack) shares bin-1's GPU" "$first" "$(uuid bin-2)"
pod spread-1 '{hami.io/gpu-scheduler-policy: spread}' 10000; bound spread-1
assert_eq "spread-1 (spread) takes the other GPU" "$other" "$(uuid spread-1)"

# --- include / exclude / pin, each against binpack's preference ($first has 20000 MiB used)
pod use-type "{hami.io/gpu-scheduler-policy: binpack, nvidia.com/use-gputype: $(model_of "$other")}" 1000; bound use-type
assert_eq "use-type (use-gputype $(model_of "$other"))" "$other" "$(uuid use-type)"
pod nouse-type "{hami.io/gpu-scheduler-policy: binpack, nvidia.com/nouse-gputype: $(model_of "$first")}" 1000; bound nouse-type
assert_eq "nouse-type (nouse-gputype $(model_of "$first"))" "$other" "$(uuid nouse-type)"
pod pin "{hami.io/gpu-scheduler-policy: binpack, nvidia.com/use-gpuuuid: $other}" 1000; bound pin
assert_eq "pin (use-gpuuuid $other)" "$other" "$(uuid pin)"
pod pin-first "{hami.io/gpu-scheduler-policy: spread, nvidia.com/use-gpuuuid: $first}" 1000; bound pin-first
assert_eq "pin-first (use-gpuuuid $first, against spread)" "$first" "$(uuid pin-first)"
pod no-such-type '{nvidia.com/use-gputype: T4}' 1000
wait_until 60 "no-such-type: FailedScheduling naming the model" sh -c \
  "kubectl -n $E2E_NS get events --field-selector involvedObject.name=no-such-type,reason=FailedScheduling -o jsonpath='{.items[*].message}' | grep -q 'model in'"
say "ok: no-such-type stays Pending: $(kubectl -n "$E2E_NS" get events --field-selector involvedObject.name=no-such-type,reason=FailedScheduling -o jsonpath='{.items[0].message}' | cut -c1-220)"
assert_eq "no-such-type node" "" "$(jp pod/no-such-type '{.spec.nodeName}')"
for p in bin-1 bin-2 spread-1 use-type nouse-type pin pin-first; do running "$p"; done
say "ok: the seven pods on fgpu-node are Running (allocated by the device plugin)"
# The containers got the GPUs of their decisions (device node of that GPU's minor).
for p in bin-1 spread-1 use-type; do
  g="$(decision_field "$p" 'd["containers"][0]["devices"][0]["id"]')"
  assert_eq "$p device node" "/dev/nvidia${g#gpu-}" "$(kubectl -n "$E2E_NS" exec "$p" -- sh -c 'ls /dev/nvidia[0-9]*')"
done

# --- node policy, two nodes
start_kwok
kwok_node fgpu-kwok-51 '[{"id":"gpu-0","uuid":"GPU-4b0c0000-0000-4000-8000-000000000000","model":"NVIDIA L40S","memoryBytes":48305799168,"cores":100,"numa":0,"healthy":true},{"id":"gpu-1","uuid":"GPU-4b0c0000-0000-4000-8000-000000000001","model":"NVIDIA L40S","memoryBytes":48305799168,"cores":100,"numa":0,"healthy":true}]'
sleep 3 # the extender's resync (2 s) reads the new node's inventory
pod node-bin '{hami.io/node-scheduler-policy: binpack}' 1000; bound node-bin
assert_eq "node-bin (node binpack) node" "$NODE_NAME" "$(jp pod/node-bin '{.spec.nodeName}')"
assert_eq "node-bin decision node" "$NODE_NAME" "$(decision_field node-bin 'd["node"]')"
pod node-spread '{hami.io/node-scheduler-policy: spread}' 1000; bound node-spread
assert_eq "node-spread (node spread) node" fgpu-kwok-51 "$(jp pod/node-spread '{.spec.nodeName}')"
assert_eq "node-spread decision: node, GPU of that node" "fgpu-kwok-51 GPU-4b0c0000" \
  "$(decision_field node-spread 'd["node"] + " " + d["containers"][0]["devices"][0]["uuid"][:12]')"
running node-bin
running node-spread
say "ok: node-spread Running on the kwok node (kwok's stage; no container there)"
