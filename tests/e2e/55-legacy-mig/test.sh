#!/usr/bin/env bash
# Scenario: dynamic MIG on the legacy path (issue 23): the device plugin with the node's H100
# in mode mig (a copy of tests/e2e/legacy-node.yaml with GPU 0 migCapable and mode: mig) and
# its A100 in mode whole (--gpu-mode through FGPU_GPU_MODE), the extender placing
# nvidia.com/gpumem on MIG placements, Allocate creating the instances.
#
# Asserted:
# * the node inventory annotation registers gpu-0 as mode mig and gpu-1 as mode whole;
# * pods asking nvidia.com/gpu: 1 with nvidia.com/gpumem 10000 and 20000 are assigned the
#   placement devices gpu-0-mig-1g10gb-<start> and gpu-0-mig-2g20gb-<start> (10 and 20 GiB,
#   no core quota), and the fake backend's state file (<profile>.mig.json) holds exactly a
#   1g.10gb and a 2g.20gb at those starts;
# * each container sees its instance's memory as the device's total (cuMemGetInfo and NVML
#   10240 / 20480 MiB) and no shim (/etc/ld.so.preload absent), and has its instance's
#   capability nodes;
# * deleting the pods destroys the instances (the state file is empty after the device
#   plugin's resync) and removes their CDI specs.
# e2e-timeout: 400
source "$(dirname "$0")/../lib.sh"
source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../legacy-lib.sh"
trap 'legacy_cleanup $?' EXIT
legacy_setup 55

# The node: GPU 0 (the H100, minor 0) in mode mig, GPU 1 (the A100) whole, so that no shared
# GPU takes the memory requests and the extender places them on MIG placements.
mig_node "$E2E_LIB_DIR/legacy-node.yaml" GPU-e2e1e9ac-0000-4000-8000-000000000000
LEGACY_PROFILE="$work/node.yaml"
export FGPU_GPU_MODE="1=whole"

legacy_up
inv="$(node_inventory "$NODE_NAME")"
assert_eq "inventory modes (id mode)" "gpu-0 mig;gpu-1 whole" \
  "$(py_json "';'.join(g['id'] + ' ' + g.get('mode', 'shared') for g in d)" <<<"$inv")"
assert_eq "no instance before the pods" "" "$(mig_instances)"

legacy_apply "$E2E_DIR/pods.yaml"
for p in mig-10g mig-20g; do wait_probe "$p"; done
for p in mig-10g mig-20g; do kubectl -n "$E2E_NS" logs "$p" | sed "s/^/      $p: /" >&2; done

dev() { decision_field "$1" "d[\"containers\"][0][\"devices\"][0][\"$2\"]"; }
want=""
for pair in mig-10g:1g10gb:1g.10gb:10 mig-20g:2g20gb:2g.20gb:20; do
  IFS=: read -r p label profile gib <<<"$pair"
  id="$(dev "$p" id)"
  [[ "$id" =~ ^gpu-0-mig-$label-([0-9]+)$ ]] || fail "$p assigned $id, not a $profile placement of gpu-0"
  want="$want $profile@${BASH_REMATCH[1]}"
  assert_eq "$p assigned memory (bytes)" $((gib << 30)) "$(dev "$p" memoryBytes)"
  assert_eq "$p assigned cores (none: the hardware isolates)" 0 "$(dev "$p" cores)"
  assert_eq "$p cuMemGetInfo total (MiB)" $((gib * 1024)) "$(probe_field "$p" cuda_total_mib)"
  assert_eq "$p NVML total (MiB)" $((gib * 1024)) "$(probe_field "$p" nvml_total_mib)"
  assert_eq "$p: no shim (the hardware isolates)" "(none)" "$(probe_field "$p" ld_so_preload)"
  caps="$(kubectl -n "$E2E_NS" exec "$p" -- sh -c 'ls /dev/nvidia-caps/ 2>/dev/null | wc -l')"
  assert_eq "$p capability nodes (GPU instance, compute instance)" 2 "$caps"
done
assert_eq "instances in the fake's state file" "$(tr ' ' '\n' <<<"${want# }" | sort | tr '\n' ' ' | sed 's/ $//')" "$(mig_instances)"
say "ok: the extender's placements are the instances the device plugin created: $(mig_instances)"
uid="$(jp pod/mig-10g '{.metadata.uid}')"
spec="$CDI_SPEC_DIR/gpu.fgpu.dev-claim_$uid-probe.json"
[ -f "$spec" ] || fail "no CDI spec $spec: $(ls "$CDI_SPEC_DIR")"

kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >&2
wait_until 30 "instances of the deleted pods destroyed (device plugin resync)" mig_instances_are ""
wait_until 30 "CDI specs of the deleted pods removed" sh -c "[ ! -e $spec ]"
say "ok: deleting the pods destroyed their MIG instances"
