#!/usr/bin/env bash
# Scenario: the shim holds against a hostile, non-root tenant on a node that behaves like a
# real one (issue 17; the plugin-shim contract, docs/shim-contract.md). fgpu's DRA kubelet
# plugin runs as a host process (30-dra-quota/plugin.sh, fake backend); the workloads
# (workload.yaml) run as uid/gid 1000 and the fake driver's NVML reports host-style PIDs.
#
# Asserted:
#   * quad: four processes of one claim of 4 GiB get 4096 MiB together (one account, usable
#     by any UID), not 4 x 4096;
#   * redirect: FGPU_LIMITS_FILE pointed at the tenant's own file and every memory variable
#     unset: still 4096 MiB and CUDA_ERROR_OUT_OF_MEMORY past it;
#   * cores-30 / cores-70 on one fake GPU: each within +-3 points of its quota, measured on
#     the fake's shared timeline over the last 5 s of 7 s of launches;
#   * greedy: priority: high in a class without allowHighPriority is refused at prepare with
#     the field error (the pod never starts, the kubelet's event names the field).
# Each check is reported on its own line (PASS/FAIL) and the scenario fails if any failed,
# so one run shows which checks today's shim passes.
source "$(dirname "$0")/../lib.sh"
[ "$K8S_MINOR" -ge 36 ] || skip "Kubernetes $K8S_VERSION: DRA consumable capacity is not on by default before 1.36"

source "$E2E_DIR/../plugin-lib.sh"
plugin_setup 21
fake_dir="/run/fgpu-e2e/fake-21-$E2E_NS"
manifest=""

cleanup() {
  local rc=$?
  [ -z "$manifest" ] || delete_tmpl "$manifest"
  kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl delete -f "$E2E_DIR/../../../deploy/deviceclasses.yaml" --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  rm -rf "$fake_dir"
  [ -z "$manifest" ] || rm -f "$manifest"
  exit $rc
}
trap cleanup EXIT

# The fake GPU's timeline, shared by the two core-quota pods (the one physical GPU they
# share), written by uid 1000.
mkdir -p "$fake_dir"
: >"$fake_dir/timeline"
chmod 0755 "$fake_dir"
chmod 0666 "$fake_dir/timeline"

kubectl apply -f "$E2E_DIR/../../../deploy/deviceclasses.yaml" >&2
start_plugin
wait_registered 1
wait_until 30 "ResourceSlice $PLUGIN_SLICE published" kubectl get resourceslice "$PLUGIN_SLICE"

manifest="$(mktemp /tmp/fgpu-e2e-21.XXXXXX.yaml)"
sed "s#__FAKE_DIR__#$fake_dir#g" "$E2E_DIR/workload.yaml" >"$manifest"
apply_tmpl "$manifest"

failed=()
check() { # check <what> <expected> <actual>
  if [ "$2" = "$3" ]; then say "PASS $1: $3"; else say "FAIL $1: expected '$2', got '$3'"; failed+=("$1"); fi
}
within() { awk -v g="$1" -v q="$2" -v t="$3" 'BEGIN { d = g - q; if (d < 0) d = -d; exit !(g != "" && d <= t) }'; }
field() { kubectl -n "$E2E_NS" logs "$1" | sed -n "s/^$2=//p" | head -1; }

# --- the core quotas: start both launch loops together once both pods run
for p in cores-30 cores-70; do
  wait_until 120 "pod $p running" sh -c "kubectl -n $E2E_NS logs $p 2>/dev/null | grep -q waiting"
done
touch "$fake_dir/go"
for p in quad redirect; do
  wait_until 120 "pod $p ran its probe" sh -c "kubectl -n $E2E_NS logs $p 2>/dev/null | grep -q probe_done"
done
for p in quad redirect; do kubectl -n "$E2E_NS" logs "$p" | sed "s/^/      $p: /" >&2; done

check "quad: the probes run as" 1000 "$(kubectl -n "$E2E_NS" logs quad | sed -n 's/^p1: uid=\([0-9]*\).*/\1/p')"
check "quad: four processes of one 4 GiB claim together (MiB)" 4096 "$(field quad quad_sum_mib)"
check "redirect: memory variables left after unset" 0 "$(field redirect memory_vars_left)"
check "redirect: cuMemGetInfo total (MiB)" 4096 "$(field redirect cuda_total_mib)"
check "redirect: allocated before refusal (MiB)" 4096 "$(field redirect allocated_mib)"
check "redirect: allocation past the quota" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(field redirect next_alloc_result)"

for p in cores-30 cores-70; do
  wait_until 60 "pod $p finished its launches" sh -c "kubectl -n $E2E_NS logs $p 2>/dev/null | grep -q probe_done"
  kubectl -n "$E2E_NS" logs "$p" | sed "s/^/      $p: /" >&2
done
s30="$(field cores-30 work_share)" s70="$(field cores-70 work_share)"
if within "$s30" 30 3; then say "PASS cores-30: $s30 % of the GPU (quota 30)"; else say "FAIL cores-30: '$s30' % (want 30 +-3)"; failed+=(cores-30); fi
if within "$s70" 70 3; then say "PASS cores-70: $s70 % of the GPU (quota 70)"; else say "FAIL cores-70: '$s70' % (want 70 +-3)"; failed+=(cores-70); fi

# --- priority: high without the class allowing it
wait_until 90 "greedy's claim refused at prepare" sh -c \
  "kubectl -n $E2E_NS get events --field-selector involvedObject.name=greedy -o jsonpath='{.items[*].message}' | grep -q 'allowHighPriority'"
msg="$(kubectl -n "$E2E_NS" get events --field-selector involvedObject.name=greedy -o jsonpath='{.items[*].message}' | grep -o 'claim [^ ]*: status.allocation.devices.config\[[0-9]*\].opaque.parameters.priority: "high" is not allowed' | head -1)"
check "greedy: prepare refuses priority high (field error)" "yes" "$([ -n "$msg" ] && echo yes || echo no)"
[ -z "$msg" ] || say "      greedy: $msg"
check "greedy: the pod never started" "" "$(kubectl -n "$E2E_NS" logs greedy 2>/dev/null || true)"

[ ${#failed[@]} -eq 0 ] || fail "${#failed[@]} check(s) failed: ${failed[*]}"
say "ok: every check passed"
