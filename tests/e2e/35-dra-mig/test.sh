#!/usr/bin/env bash
# Scenario: dynamic MIG through fgpu's DRA kubelet plugin (issue 23) on a fake H100 80GB in
# mode mig (a copy of deploy/fake/e2e-node.yaml with GPU 0 migCapable and mode: mig), on
# 1.36+ (partitionable devices: the GPU's placements consume shared counters, so
# kube-scheduler allocates only placements that can exist together).
#
# Asserted:
# * the slices publish GPU 0's placements (gpu-0-mig-<profile>-<start>) and its counter set;
# * claims of 40, 20 and 10 GiB of the class mig.gpu.fgpu.dev (made in that order, so the
#   first-fit placements leave room for the next) get 3g.40gb, 2g.20gb and 1g.10gb
#   instances: the fake backend's state file (<profile>.mig.json) lists exactly those, each
#   named by the claim's checkpoint record;
# * each container sees its instance's memory as the device's total (fgpu-probe: cuMemGetInfo
#   and NVML 10240 / 20480 / 40960 MiB; allocations stop there) and no shim is injected
#   (/etc/ld.so.preload absent: the hardware isolates a MIG instance);
# * a fourth claim (80 GiB, a 7g.80gb) stays pending: its pod is unschedulable with a reason;
# * kill -9 of the plugin while it prepares a claim (after the instance is created, before the
#   claim is recorded PrepareCompleted: the test pause) leaves no orphan: after the restart
#   the kubelet's retry completes the claim with the same instance, and the state file holds
#   one instance per claim;
# * deleting the pods destroys the instances (the state file is empty) and leaves no CDI
#   spec, claim directory or record;
# * controller mode (fgpu-controller --mode controller, its gate webhook): claims asking only
#   memory (GpuShareConfig, no profile, no CEL) of 10, 20 and 40 GiB, made in that order, get
#   the smallest fitting profiles at the placements that keep the large ones possible
#   (1g.10gb at 6, 2g.20gb at 4, 3g.40gb at 0: first fit would have put the 10 GiB at 0),
#   each container sees its instance's memory, and a fourth 40 GiB claim stays gated and
#   unallocated with the controller's reason.
# e2e-timeout: 600
source "$(dirname "$0")/../lib.sh"
[ "$K8S_MINOR" -ge 36 ] || skip "Kubernetes $K8S_VERSION: partitionable devices are not on by default before 1.36"
api=v1
source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../controller-lib.sh"
ROOT="$E2E_DIR/../../.."

cleanup() {
  local rc=$?
  release_workloads
  controller_cleanup $rc
  delete_tmpl "$E2E_DIR/workload.yaml"
  kubectl delete -f "$ROOT/deploy/deviceclasses.yaml" --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  # The pool's other slices (<node>-<driver>-<n>, -counters-<n>: the MIG GPU's devices and
  # counter sets), once the plugin is gone.
  kubectl get resourceslices -o name 2>/dev/null | grep "/$PLUGIN_SLICE-" \
    | xargs -r kubectl delete --ignore-not-found >/dev/null 2>&1 || true
  exit $rc
}
trap cleanup EXIT
plugin_setup 35

# The node: GPU 0 in mode mig, the stand-ins for its instances' capability nodes beside the
# GPUs' (plugin.sh makes those).
mig_node "$ROOT/deploy/fake/e2e-node.yaml" GPU-e2e00000-0000-4000-8000-000000000000
export FGPU_E2E_FAKE_GPUS="$work/node.yaml"
# The MIG UUIDs the plugin's records name, sorted.
recorded_uuids() {
  python3 -c 'import glob,json,sys
u=[d["mig"]["uuid"] for f in glob.glob(sys.argv[1]+"/*.json") for d in json.load(open(f))["claim"]["devices"] if (d.get("mig") or {}).get("uuid")]
print(" ".join(sorted(u)))' "$run_dir/checkpoint"
}
# The probe's arguments in every pod (lib.sh probe_pod): 1 GiB steps up to past the largest
# instance.
probe=(--step-mib 1024 --max-gib 48)
field() { kubectl -n "$E2E_NS" logs "$1" | sed -n "s/^$2=//p"; }
nothing_left() {
  [ -z "$(checkpoint_uids)$(claim_dir_uids)$(cdi_spec_uids)" ]
}
device_of() {
  local claim
  claim="$(jp "pod/$1" '{.status.resourceClaimStatuses[0].resourceClaimName}')"
  [ -n "$claim" ] && jp "resourceclaim/$claim" '{.status.allocation.devices.results[0].device}'
}

kubectl apply -f "$ROOT/deploy/deviceclasses.yaml" >&2
start_plugin
wait_registered 1
wait_until 30 "ResourceSlices published" sh -c "kubectl get resourceslices -o name | grep -q ."
# Every slice of the node's pool (devices and counter sets are in slices of their own).
pool="{range .items[?(@.spec.pool.name==\"$NODE_NAME\")]}"
devices="$(kubectl get resourceslices -o "jsonpath=$pool{.spec.devices[*].name} {end}")"
grep -qw gpu-0-mig-3g40gb-0 <<<"$devices" || fail "no MIG placement gpu-0-mig-3g40gb-0 published: $devices"
grep -qw gpu-0-mig-1g10gb-6 <<<"$devices" || fail "no MIG placement gpu-0-mig-1g10gb-6 published: $devices"
grep -qw gpu-1 <<<"$devices" || fail "GPU 1 (shared mode) not published: $devices"
sets="$(kubectl get resourceslices -o "jsonpath=$pool{.spec.sharedCounters[*].name} {end}")"
grep -qw gpu-0-counters <<<"$sets" || skip "the API server dropped sharedCounters (partitionable devices off): $sets"
say "ok: GPU 0 published as $(wc -w <<<"$devices") devices with its counter set"

# --- 40, 20, 10 GiB, in that order
apply_tmpl "$E2E_DIR/workload.yaml"
for p in mig-40g mig-20g mig-10g; do
  probe_pod "$p" "template/$p" "${probe[@]}"
  wait_until 120 "pod $p ran its probe" sh -c "kubectl -n $E2E_NS logs $p 2>/dev/null | grep -q probe_done"
  say "$p: device $(device_of "$p")"
done
assert_eq "instances in the fake's state file" "1g.10gb@6 2g.20gb@4 3g.40gb@0" "$(mig_instances)"
assert_eq "instances named by the plugin's records" "$(mig_instance_uuids)" "$(recorded_uuids)"
for p in mig-10g:10240 mig-20g:20480 mig-40g:40960; do
  name="${p%%:*}" mib="${p#*:}"
  kubectl -n "$E2E_NS" logs "$name" | sed "s/^/      $name: /" >&2
  assert_eq "$name cuMemGetInfo total (MiB)" "$mib" "$(field "$name" cuda_total_mib)"
  assert_eq "$name NVML total (MiB)" "$mib" "$(field "$name" nvml_total_mib)"
  assert_eq "$name allocated before refusal (MiB)" "$mib" "$(field "$name" allocated_mib)"
  assert_eq "$name: no shim (the hardware isolates)" "(none)" "$(field "$name" ld_so_preload)"
done
# shellcheck disable=SC2016 # expanded by the container's sh
vis="$(kubectl -n "$E2E_NS" exec mig-10g -- sh -c 'echo $NVIDIA_VISIBLE_DEVICES')"
grep -qw -- "$vis" <<<"$(mig_instance_uuids)" || fail "mig-10g: NVIDIA_VISIBLE_DEVICES=$vis names no instance"
say "ok: mig-10g sees instance $vis"

# --- a fourth claim that cannot fit
probe_pod mig-80g template/mig-80g "${probe[@]}"
wait_until 60 "pod mig-80g unschedulable with a reason" \
  sh -c "kubectl -n $E2E_NS get pod mig-80g -o jsonpath='{.status.conditions[?(@.type==\"PodScheduled\")].reason}' | grep -q Unschedulable"
say "ok: mig-80g pending: $(jp pod/mig-80g '{.status.conditions[?(@.type=="PodScheduled")].message}')"
assert_eq "instances unchanged by the pending claim" "1g.10gb@6 2g.20gb@4 3g.40gb@0" "$(mig_instances)"
kubectl -n "$E2E_NS" delete pod mig-80g --wait=true --timeout=60s >&2

# --- kill -9 inside a prepare: no orphan instance
kubectl -n "$E2E_NS" delete pod mig-10g --wait=true --timeout=60s >&2
wait_until 60 "the 1g.10gb instance destroyed" mig_instances_are "2g.20gb@4 3g.40gb@0"
stop_plugin
FGPU_TEST_PAUSE_PREPARE_SECONDS=600 start_plugin
wait_registered 2
probe_pod mig-10g-again template/mig-10g "${probe[@]}"
wait_until 90 "the plugin paused inside the claim's prepare" grep -q 'test pause' "$work/plugin.log"
assert_eq "instances while paused (created, recorded, not completed)" "1g.10gb@6 2g.20gb@4 3g.40gb@0" "$(mig_instances)"
assert_eq "instances named by the records while paused" "$(mig_instance_uuids)" "$(recorded_uuids)"
before="$(mig_instance_uuids)"
kill -KILL "$plugin_pid"
wait "$plugin_pid" 2>/dev/null || true
plugin_pid=""
say "ok: plugin killed with SIGKILL inside the prepare"
start_plugin
wait_registered 3
wait_until 120 "pod mig-10g-again ran its probe" sh -c "kubectl -n $E2E_NS logs mig-10g-again 2>/dev/null | grep -q probe_done"
assert_eq "instances after the restart and the retry (same ones, no orphan)" "$before" "$(mig_instance_uuids)"
assert_eq "instances named by the records after the retry" "$(mig_instance_uuids)" "$(recorded_uuids)"
assert_eq "mig-10g-again cuMemGetInfo total (MiB)" 10240 "$(field mig-10g-again cuda_total_mib)"
grep -q "MIG instance no claim names" "$work/plugin.log" && fail "the restart destroyed an instance a record named"

# --- delete the pods: the instances go
kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >&2
wait_until 60 "every instance destroyed" mig_instances_are ""
wait_until 30 "no CDI spec, claim directory or record left" nothing_left
say "ok: the pods' deletion destroyed their instances and left nothing"

# --- controller mode: the controller chooses the profile and the placement
controller_setup
start_controller --mode controller
register_webhooks
for g in 10 20 40 40; do
  t="ctl-${g}g"
  kubectl apply -f - >&2 <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: $t, namespace: $E2E_NS}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: mig.gpu.fgpu.dev}
      config:
      - requests: [gpu]
        opaque:
          driver: gpu.fgpu.dev
          parameters: {apiVersion: gpu.fgpu.dev/v1alpha1, kind: GpuShareConfig, memory: ${g}Gi}
YAML
done
for p in ctl-10g ctl-20g ctl-40g; do
  probe_pod "$p" "template/$p" "${probe[@]}"
  wait_until 120 "pod $p ran its probe" sh -c "kubectl -n $E2E_NS logs $p 2>/dev/null | grep -q probe_done"
done
assert_eq "controller mode: devices" "gpu-0-mig-1g10gb-6 gpu-0-mig-2g20gb-4 gpu-0-mig-3g40gb-0" \
  "$(device_of ctl-10g) $(device_of ctl-20g) $(device_of ctl-40g)"
assert_eq "ctl-10g: allocated by the controller (its finalizer)" "gpu.fgpu.dev/allocation" \
  "$(jp "resourceclaim/$(jp pod/ctl-10g '{.status.resourceClaimStatuses[0].resourceClaimName}')" '{.metadata.finalizers[*]}')"
assert_eq "controller mode: instances" "1g.10gb@6 2g.20gb@4 3g.40gb@0" "$(mig_instances)"
for p in ctl-10g:10240 ctl-20g:20480 ctl-40g:40960; do
  assert_eq "${p%%:*} cuMemGetInfo total (MiB)" "${p#*:}" "$(field "${p%%:*}" cuda_total_mib)"
done
probe_pod ctl-40g-more template/ctl-40g "${probe[@]}"
sleep 15
assert_eq "ctl-40g-more: still gated" "gpu.fgpu.dev/allocate" "$(jp pod/ctl-40g-more '{.spec.schedulingGates[*].name}')"
assert_eq "ctl-40g-more: claim allocation" "" "$(jp "resourceclaim/$(jp pod/ctl-40g-more '{.status.resourceClaimStatuses[0].resourceClaimName}')" '{.status.allocation}')"
say "ok: ctl-40g-more waits: $(grep -o 'no free MIG placement[^"]*' "$work/controller.log" | tail -1)"
kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >&2
wait_until 60 "every instance destroyed" mig_instances_are ""
say "ok: MIG in controller mode"
