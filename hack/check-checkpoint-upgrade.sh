#!/usr/bin/env bash
# Upgrade check of the DRA kubelet plugin's checkpoint against the local cluster (1.34+; start
# one first: make cluster-up). A plugin of a version-1 checkpoint (one checkpoint.json) prepares
# two claims; this checkout's plugin then starts on the same run dir: checkpoint.json must be
# migrated to checkpoint/<uid>.json, its prepares must answer the same CDI ids from the records
# (no claim read), and unprepare must leave nothing.
#
#   hack/check-checkpoint-upgrade.sh OLD_BIN_DIR
#
# OLD_BIN_DIR holds the older build: fgpu-kubelet-plugin, libfgpu.so, libfgpu_fake_cuda.so
# (e.g. copied from a target directory of a checkout before the checkpoint directory).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
OLD="${1:?usage: $0 OLD_BIN_DIR}"
state="${FGPU_CLUSTER_STATE:-/var/lib/fgpu-cluster}"
[ -f "$state/env" ] || { echo "no local cluster: make cluster-up first" >&2; exit 1; }
# shellcheck disable=SC1091
source "$state/env"
export E2E_NS="fgpu-upg-$RANDOM" E2E_DIR="$root/tests/e2e/30-dra-quota"
source "$root/tests/e2e/lib.sh"
source "$root/tests/e2e/plugin-lib.sh"
export FGPU_E2E_PROFILE=release FGPU_E2E_METRICS=127.0.0.1:19408
cleanup() { local rc=$?; kubectl delete namespace "$E2E_NS" --wait=true --timeout=90s >/dev/null 2>&1 || true; plugin_cleanup $rc; exit $rc; }
trap cleanup EXIT
plugin_setup upgrade
kubectl create namespace "$E2E_NS" >/dev/null
uids=()
for i in 0 1; do
  uids+=("$(allocated_claim "upg-$i" "gpu-$i")")
done
say "old plugin ($OLD)"
FGPU_E2E_BIN_DIR="$OLD" start_plugin
wait_registered 1
old0="$("$dra_call" "$PLUGIN_DRA_SOCK" prepare "$E2E_NS" upg-0 "${uids[0]}")"
old1="$("$dra_call" "$PLUGIN_DRA_SOCK" prepare "$E2E_NS" upg-1 "${uids[1]}")"
say "old: $old0 / $old1"
[ -f "$run_dir/checkpoint.json" ] || fail "the old plugin wrote no $run_dir/checkpoint.json"
[ ! -e "$run_dir/checkpoint" ] || fail "the old plugin has a checkpoint directory?"
stop_plugin
say "new plugin ($FGPU_E2E_BIN_DIR)"
start_plugin
wait_registered 2
grep -q 'version-1 checkpoint migrated' "$work/plugin.log" || fail "no migration logged"
[ ! -e "$run_dir/checkpoint.json" ] || fail "checkpoint.json still there"
assert_eq "records after the migration" "${uids[0]}.json ${uids[1]}.json" "$(find "$run_dir/checkpoint" -mindepth 1 -printf '%f\n' | sort | tr '\n' ' ' | sed 's/ $//')"
reads0="$(curl -s "http://$FGPU_E2E_METRICS/metrics" | awk '/^fgpu_kubelet_plugin_claim_reads_total/ {s += $2} END {print s + 0}')"
new0="$("$dra_call" "$PLUGIN_DRA_SOCK" prepare "$E2E_NS" upg-0 "${uids[0]}")"
new1="$("$dra_call" "$PLUGIN_DRA_SOCK" prepare "$E2E_NS" upg-1 "${uids[1]}")"
reads1="$(curl -s "http://$FGPU_E2E_METRICS/metrics" | awk '/^fgpu_kubelet_plugin_claim_reads_total/ {s += $2} END {print s + 0}')"
assert_eq "claim 0 CDI ids across the upgrade" "$old0" "$new0"
assert_eq "claim 1 CDI ids across the upgrade" "$old1" "$new1"
assert_eq "claim reads by the new plugin's prepares (answered from the records)" "$reads0" "$reads1"
for i in 0 1; do "$dra_call" "$PLUGIN_DRA_SOCK" unprepare "$E2E_NS" "upg-$i" "${uids[$i]}" >/dev/null; done
assert_eq "records after unprepare" "" "$(ls "$run_dir/checkpoint")"
assert_eq "claim dirs after unprepare" "" "$(ls "$run_dir/claims" 2>/dev/null)"
assert_eq "CDI specs after unprepare" "" "$(find "$CDI_SPEC_DIR" -maxdepth 1 -name "$PLUGIN_DRIVER-*" -printf '%f\n')"
say "ok: upgrade kept both claims prepared (same CDI ids, no claim read), unprepare left nothing"
