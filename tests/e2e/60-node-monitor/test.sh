#!/usr/bin/env bash
# Scenario: the node monitor (issue 18) sees from the host what each claim really uses.
# fgpu's DRA kubelet plugin runs as a host process (30-dra-quota/plugin.sh, fake backend)
# with the fake driver's NVML as its usage source (--fake-nvml-library, host view:
# FAKE_CUDA_NVML_HOST=1, the node's shared fake GPU state); the workloads (workload.yaml) run
# as uid 1000 in their own PID namespaces, and the shims see NVML's PIDs shifted
# (FAKE_CUDA_NVML_PID_OFFSET), as on a real node.
#
# Asserted:
#   * cores-30 / cores-70 on one fake GPU: the monitor's measured SM utilisation of each
#     claim (fgpu_kubelet_plugin_claim_sm_utilization_ratio), averaged over 10 s of their
#     launches, within +-3 points of 30 and 70; each claim's feed (the file the shim's core
#     limiter reads) is version 1, fresh, and lists host PIDs of that pod's processes only;
#     feed age p99 <= 2 s; each probe's own share within +-3 points (the shim limits with
#     the feed in place);
#   * bypass (2Gi): a process through the shim holds 1024 MiB, then fgpu-bypass (the fake
#     driver linked in, nothing for the shim to interpose) takes 3072 MiB: with
#     --over-quota=report a Warning Event GpuMemoryOverQuota on the pod names the claim, the
#     GPU, used vs granted and the processes, over_quota_total counts it, nothing dies;
#     the plugin restarted with --over-quota=kill: the bypassing process dies (SIGKILL), the
#     shim's process in the same container lives, Event GpuMemoryOverQuotaKilled,
#     backstop_kills_total 1.
#   * claim status (--claim-status-interval-seconds 2): each claim's status.devices entry
#     (driver, pool, device, shareID of its allocation) carries the granted figures and the
#     monitor's used memory: bypass shows 4096 MiB and WithinGrant=False (MemoryOverGrant)
#     while over, 1024 MiB and True after the kill; status writes counted ok, none failed;
#   * lifecycle: GpuClaimPrepared on each claim, GpuContainerStarted on each pod,
#     GpuAllocationRefused on bypass (a second process asks past the grant once), and the
#     shim's counters as metrics (one refusal; cores-30's launches waited > 5 s);
#   * kubectl fgpu (kubectl-fgpu on PATH): `top gpus` shows gpu-0 with the three shares and
#     4096 MiB granted, `top claims` each claim's grant and bypass's use over it.
source "$(dirname "$0")/../lib.sh"
[ "$K8S_MINOR" -ge 36 ] || skip "Kubernetes $K8S_VERSION: DRA consumable capacity is not on by default before 1.36"

source "$E2E_DIR/../plugin-lib.sh"
plugin_setup 60
fake_dir="/run/fgpu-e2e/fake-60-$E2E_NS"
manifest=""
METRICS="127.0.0.1:19460"

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

# The node's fake GPU state, shared by the workloads (uid 1000) and the plugin (root): made
# writable for both before either opens it.
fake_state_setup "$fake_dir"

uuids="GPU-e2e00000-0000-4000-8000-000000000000,GPU-e2e00000-0000-4000-8000-000000000001"
monitor_args="--fake-nvml-library $work/bin/libfgpu_fake_cuda.so --monitor-period-ms 1000 --over-quota-tolerance 64Mi --compute-over-quota-seconds 5 --claim-status-interval-seconds 2"
start_monitored_plugin() { # <report|kill>
  FGPU_E2E_METRICS="$METRICS" FGPU_E2E_PLUGIN_ARGS="$monitor_args --over-quota $1" \
    FAKE_CUDA_STATE="$fake_dir/gpu" FAKE_CUDA_NVML_HOST=1 FAKE_CUDA_UUIDS="$uuids" start_plugin
}

kubectl apply -f "$E2E_DIR/../../../deploy/deviceclasses.yaml" >&2
start_monitored_plugin report
wait_registered 1
wait_until 30 "ResourceSlice $PLUGIN_SLICE published" kubectl get resourceslice "$PLUGIN_SLICE"
grep -q '"node monitor started"\|node monitor started' "$work/plugin.log" || fail "the node monitor did not start: $(grep -i monitor "$work/plugin.log" | head -3)"

manifest="$(mktemp /tmp/fgpu-e2e-60.XXXXXX.yaml)"
sed "s#__FAKE_DIR__#$fake_dir#g" "$E2E_DIR/workload.yaml" >"$manifest"
apply_tmpl "$manifest"

failed=()
check() { # check <what> <expected> <actual>
  if [ "$2" = "$3" ]; then say "PASS $1: $3"; else say "FAIL $1: expected '$2', got '$3'"; failed+=("$1"); fi
}
within() { awk -v g="$1" -v q="$2" -v t="$3" 'BEGIN { d = g - q; if (d < 0) d = -d; exit !(g != "" && d <= t) }'; }
field() { kubectl -n "$E2E_NS" logs "$1" | sed -n "s/^$2=//p" | head -1; }
claim_of() { jp "pod/$1" '{.status.resourceClaimStatuses[0].resourceClaimName}'; }
uid_of_claim() { kubectl -n "$E2E_NS" get resourceclaim "$1" -o jsonpath='{.metadata.uid}'; }
metrics() { curl -s "http://$METRICS/metrics"; }
# metric <family> <claim> [page]: the value of the family's series for that claim, in page
# (default: a fresh scrape)
metric() {
  local page="${3:-$(metrics)}"
  sed -n "s/^fgpu_kubelet_plugin_$1{namespace=\"$E2E_NS\",claim=\"$2\",[^}]*} //p" <<<"$page" | sed -n 1p
}
metric_is() { [ "$(metric "$1" "$2")" = "$3" ]; }
now_ms() { date +%s%3N; }

for p in cores-30 cores-70; do
  wait_until 120 "pod $p running" sh -c "kubectl -n $E2E_NS logs $p 2>/dev/null | grep -q waiting"
done
wait_until 120 "pod bypass: the shim's process holds its memory" sh -c "kubectl -n $E2E_NS logs bypass 2>/dev/null | grep -q '^shim: allocated_mib=\|^shim: alloc_stopped_at_max_mib='"
c30="$(claim_of cores-30)" c70="$(claim_of cores-70)" cb="$(claim_of bypass)"
u30="$(uid_of_claim "$c30")" u70="$(uid_of_claim "$c70")"

# --- the core quotas, measured from the host
touch "$fake_dir/go"
sleep 5
s30=() s70=() ages=()
for _ in $(seq 1 10); do
  for i in 1 2 3 4 5; do
    for u in "$u30" "$u70"; do
      t="$(sed -n 's/^sampled_unix_ms=//p' "$run_dir/claims/$u/feed/utilisation" 2>/dev/null)"
      [ -z "$t" ] || ages+=("$(( $(now_ms) - t ))")
    done
    [ "$i" -eq 5 ] || sleep 0.2
  done
  m="$(metrics)"
  s30+=("$(metric claim_sm_utilization_ratio "$c30" "$m")")
  s70+=("$(metric claim_sm_utilization_ratio "$c70" "$m")")
done
avg() { printf '%s\n' "$@" | awk 'NF { s += $1 * 100; n++ } END { if (n) printf "%.1f", s / n }'; }
a30="$(avg "${s30[@]}")" a70="$(avg "${s70[@]}")"
say "      monitor samples cores-30: ${s30[*]}"
say "      monitor samples cores-70: ${s70[*]}"
if within "$a30" 30 3; then say "PASS monitor: cores-30 measured $a30 % over 10 s (quota 30)"; else say "FAIL monitor: cores-30 measured '$a30' % (want 30 +-3)"; failed+=(monitor-30); fi
if within "$a70" 70 3; then say "PASS monitor: cores-70 measured $a70 % over 10 s (quota 70)"; else say "FAIL monitor: cores-70 measured '$a70' % (want 70 +-3)"; failed+=(monitor-70); fi
p99="$(printf '%s\n' "${ages[@]}" | sort -n | awk '{ a[NR] = $1 } END { i = int(NR * 0.99); if (i < 1) i = 1; print a[i] }')"
say "      feed age over ${#ages[@]} reads: p50 $(printf '%s\n' "${ages[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }') ms, p99 $p99 ms"
check "feed age p99 <= 2000 ms" yes "$([ -n "$p99" ] && [ "$p99" -le 2000 ] && echo yes || echo "no ($p99)")"

# Each feed: version 1, its own pod's host PIDs (their cgroup names the pod), nothing else.
for p in cores-30 cores-70; do
  u="$(uid_of_claim "$(claim_of "$p")")" pod_uid="$(jp "pod/$p" '{.metadata.uid}')"
  f="$run_dir/claims/$u/feed/utilisation"
  check "$p: feed version" 1 "$(sed -n 's/^version=//p' "$f")"
  pids="$(sed -n 's/^gpu\.GPU-e2e00000-0000-4000-8000-000000000000\.pids=//p' "$f" | tr ',' ' ')"
  bad=0 n=0
  for pid in $pids; do
    n=$((n + 1))
    # (A PID gone since the feed was written cannot be judged: only a live one counts.)
    cg="$(cat "/proc/$pid/cgroup" 2>/dev/null)" || continue
    grep -q "pod$pod_uid" <<<"$cg" || { bad=$((bad + 1)); say "      foreign PID $pid in $p's feed: $cg"; }
  done
  check "$p: feed lists the pod's host PIDs (count >= 1, none foreign)" "yes 0" "$([ "$n" -ge 1 ] && echo yes || echo no) $bad"
done
for p in cores-30 cores-70; do
  wait_until 60 "pod $p finished its launches" sh -c "kubectl -n $E2E_NS logs $p 2>/dev/null | grep -q probe_done"
done
w30="$(field cores-30 work_share)" w70="$(field cores-70 work_share)"
if within "$w30" 30 3; then say "PASS shim: cores-30 got $w30 % (quota 30)"; else say "FAIL shim: cores-30 got '$w30' %"; failed+=(shim-30); fi
if within "$w70" 70 3; then say "PASS shim: cores-70 got $w70 % (quota 70)"; else say "FAIL shim: cores-70 got '$w70' %"; failed+=(shim-70); fi

# --- the backstop, report
touch "$fake_dir/bypass"
ev() { kubectl -n "$E2E_NS" get events --field-selector "involvedObject.name=bypass,reason=$1" -o jsonpath='{.items[*].note}{.items[*].message}' 2>/dev/null; }
wait_until 30 "Event GpuMemoryOverQuota on pod bypass" sh -c "kubectl -n $E2E_NS get events --field-selector involvedObject.name=bypass,reason=GpuMemoryOverQuota -o name | grep -q ."
note="$(ev GpuMemoryOverQuota)"
say "      event: $note"
check "report: the Event names claim, GPU, used vs granted" yes \
  "$(grep -q "claim $E2E_NS/$cb holds 4096 MiB of device memory on GPU GPU-e2e00000-0000-4000-8000-000000000000, granted 2048 MiB" <<<"$note" && echo yes || echo no)"
check "report: the Event lists both processes" 2 "$(echo "$note" | grep -o 'pid [0-9]* [0-9]* MiB' | wc -l)"
check "report: over_quota_total{memory,report}" 1 "$(metrics | sed -n 's/^fgpu_kubelet_plugin_over_quota_total{kind="memory",action="report"} //p')"
check "report: used memory of the claim (bytes)" "$((4096 << 20))" "$(metric claim_used_memory_bytes "$cb")"
# The same per container, named from the real kubelet's pod resources API (pod bypass,
# container probe, the one container that uses the claim).
check "container: used memory of bypass/probe (bytes)" "$((4096 << 20))" \
  "$(metrics | sed -n "s/^fgpu_kubelet_plugin_container_used_memory_bytes{namespace=\"$E2E_NS\",pod=\"bypass\",container=\"probe\",claim=\"$cb\",[^}]*} //p")"
# The claim's status.devices: the same figure, within one sample of the monitor's.
cstat() { kubectl -n "$E2E_NS" get resourceclaim "$1" -o jsonpath="{.status.devices[0]$2}"; }
status_is() { [ "$(cstat "$1" "$2")" = "$3" ]; }
wait_until 15 "claim $cb: status.devices shows 4096 MiB used" status_is "$cb" .data.usedMemoryBytes "$((4096 << 20))"
check "status: bypass's WithinGrant condition" "False MemoryOverGrant" \
  "$(cstat "$cb" '.conditions[?(@.type=="WithinGrant")].status') $(cstat "$cb" '.conditions[?(@.type=="WithinGrant")].reason')"
check "status: the entry's driver and device are the allocation's" \
  "$(kubectl -n "$E2E_NS" get resourceclaim "$cb" -o jsonpath='{.status.allocation.devices.results[0].driver} {.status.allocation.devices.results[0].device} {.status.allocation.devices.results[0].shareID}')" \
  "$(cstat "$cb" .driver) $(cstat "$cb" .device) $(cstat "$cb" .shareID)"
check "status: cores-30's granted cores, enforcement" "30 shim" "$(cstat "$c30" .data.grantedCores) $(cstat "$c30" .data.enforcement)"
check "status: bypass's granted memory" "$((2048 << 20))" "$(cstat "$cb" .data.grantedMemoryBytes)"

# Lifecycle Events and the shim's counters read back from the claims' accounts.
ev_any() { kubectl -n "$E2E_NS" get events --field-selector "involvedObject.name=$1,reason=$2" -o name | grep -q .; }
wait_until 15 "Event GpuAllocationRefused on pod bypass" ev_any bypass GpuAllocationRefused
check "lifecycle: the refusal's note" yes \
  "$(ev GpuAllocationRefused | grep -q "^1 device memory allocation(s) on GPU GPU-e2e00000-0000-4000-8000-000000000000 refused: claim $E2E_NS/$cb" && echo yes || echo "no: $(ev GpuAllocationRefused)")"
check "lifecycle: the probe was refused after" 1024 "$(field bypass refused_after_mib)"
check "metrics: bypass's claim_allocation_refusals_total" 1 "$(metric claim_allocation_refusals_total "$cb")"
check "metrics: cores-30 waited for its quota (claim_throttled_seconds_total > 5)" yes \
  "$(awk -v t="$(metric claim_throttled_seconds_total "$c30")" 'BEGIN { print (t > 5) ? "yes" : "no (" t ")" }')"
for p in cores-30 cores-70 bypass; do
  wait_until 10 "Event GpuContainerStarted on pod $p" ev_any "$p" GpuContainerStarted
done
wait_until 10 "Event GpuClaimPrepared on claim $c30" ev_any "$c30" GpuClaimPrepared

# kubectl fgpu (the kubectl-fgpu binary on PATH): the three shares of gpu-0, their grants.
(cd "$E2E_DIR/../../.." && cargo build -q -p kubectl-fgpu) >&2 || fail "cargo build -p kubectl-fgpu failed"
kf_dir="${CARGO_TARGET_DIR:-${FGPU_CACHE:-/var/cache/fgpu}/target}/debug"
claims_with_status() {
  kubectl -n "$E2E_NS" get resourceclaims -o jsonpath='{range .items[*]}{.status.devices[0].data.grantedMemoryBytes}{"\n"}{end}' | grep -c .
}
all_status() { [ "$(claims_with_status)" = 3 ]; }
wait_until 15 "every claim's status written" all_status
top="$(PATH="$kf_dir:$PATH" kubectl fgpu top gpus)"
say "      kubectl fgpu top gpus:"; printf '%s\n' "$top" | sed 's/^/        /' >&2
check "kubectl fgpu top gpus: gpu-0's shares and granted memory" "3 4096Mi" \
  "$(awk '$2 == "gpu-0" { print $4, $6 }' <<<"$top")"
claims_top="$(PATH="$kf_dir:$PATH" kubectl fgpu top claims -n "$E2E_NS")"
printf '%s\n' "$claims_top" | sed 's/^/        /' >&2
check "kubectl fgpu top claims: cores-30's grant" "1024Mi 30%" "$(awk -v c="$E2E_NS/$c30" '$1 == c { print $4, $5 }' <<<"$claims_top")"
check "kubectl fgpu top claims: bypass over its grant" "2048Mi 4096Mi False" \
  "$(awk -v c="$E2E_NS/$cb" '$1 == c { print $4, $6, $9 }' <<<"$claims_top")"
sleep 2
check "report: nothing killed" "" "$(kubectl -n "$E2E_NS" logs bypass | sed -n 's/^bypass_exit=//p')"

# --- the backstop, kill
stop_plugin
start_monitored_plugin kill
wait_registered 2
wait_until 30 "the bypassing process killed" sh -c "kubectl -n $E2E_NS logs bypass 2>/dev/null | grep -q '^bypass_exit='"
check "kill: the bypassing process's exit status (SIGKILL)" 137 "$(field bypass bypass_exit)"
check "kill: the shim's process in the same container" alive "$(field bypass shim_process)"
check "kill: backstop_kills_total" 1 "$(metrics | sed -n 's/^fgpu_kubelet_plugin_backstop_kills_total //p')"
wait_until 30 "Event GpuMemoryOverQuotaKilled on pod bypass" sh -c "kubectl -n $E2E_NS get events --field-selector involvedObject.name=bypass,reason=GpuMemoryOverQuotaKilled -o name | grep -q ."
say "      event: $(ev GpuMemoryOverQuotaKilled)"
wait_until 15 "the claim back under its grant" metric_is claim_used_memory_bytes "$cb" "$((1024 << 20))"
say "ok: claim $cb holds $(( $(metric claim_used_memory_bytes "$cb") >> 20 )) MiB after the kill"
wait_until 15 "claim $cb: status.devices back to 1024 MiB, WithinGrant" sh -c \
  "[ \"\$(kubectl -n $E2E_NS get resourceclaim $cb -o jsonpath='{.status.devices[0].data.usedMemoryBytes} {.status.devices[0].conditions[0].status}')\" = '$((1024 << 20)) True' ]"
page="$(metrics)"
check "status: writes failed" "" "$(sed -n 's/^fgpu_kubelet_plugin_claim_status_writes_total{result="error"} //p' <<<"$page")"
say "      status writes ok: $(sed -n 's/^fgpu_kubelet_plugin_claim_status_writes_total{result="ok"} //p' <<<"$page")"

[ ${#failed[@]} -eq 0 ] || fail "${#failed[@]} check(s) failed: ${failed[*]}"
say "ok: every check passed"
