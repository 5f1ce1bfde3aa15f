#!/usr/bin/env bash
# Scenario: two fgpu-controller replicas with leader election (a Lease in the scenario's
# namespace); the leader is paused with SIGSTOP past its lease while a burst of 50 claims is
# being allocated, the standby takes over, and the old leader is resumed with SIGCONT while
# the standby allocates. Replica b runs with its wall clock an hour ahead (libfaketime,
# monotonic clock untouched; `faketime` is installed by hack/cluster-up.sh); without it the skew part is
# skipped with a note (the unit tests of fgpu_plumbing::leader cover it).
#
# Asserted: a leads, b stands by, and b does not take a's live lease for two leases (with b
# an hour ahead the old wall-clock rule would have taken it at once); after SIGSTOP of a
# (some but not all claims allocated) b leads within 20 s; a, resumed, writes no allocation
# it had not sent before the stop (with --concurrent-writes 1, at most one "allocated on"
# line after SIGCONT: a write whose answer arrived while a was stopped; with faketime, no
# claim carries an allocationTimestamp of a's clock after SIGCONT) and exits within 15 s
# (fenced, or not renewed); every claim is allocated exactly once (one log line per claim
# over both replicas, one result each); no GPU grants more than it has (the over-grant
# check of 41-controller-failover). Runs on every release with DRA (1.32+).
source "$(dirname "$0")/../lib.sh"
api="$(dra_api_version)"
[ "$api" != none ] || skip "Kubernetes $K8S_VERSION: no DRA (resource.k8s.io) to allocate"

source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../controller-lib.sh"
plugin_setup 92
controller_setup
slice=$PLUGIN_SLICE
pid_a="" pid_b=""

cleanup() {
  local rc=$?
  [ -z "$pid_a" ] || kill -CONT "$pid_a" 2>/dev/null || true
  release_workloads
  stop_pid "$pid_a"; stop_pid "$pid_b"
  controller_cleanup $rc
  classes | kubectl delete -f - --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup $rc
  exit $rc
}
trap cleanup EXIT

plugin_up
consumable="$(jp "resourceslice/$slice" '{.spec.devices[0].allowMultipleAllocations}' "")"
mode=auto; [ "$consumable" != true ] || mode=controller
say "Kubernetes $K8S_VERSION, resource.k8s.io/$api, consumable capacity: ${consumable:-false}, --mode $mode"

le=(--mode "$mode" --leader-election-namespace "$E2E_NS")
# a writes one allocation at a time: at most one can be in flight when it is stopped.
CONTROLLER_TAG=-a start_controller "${le[@]}" --concurrent-writes 1; pid_a=$controller_pid
wait_until 30 "replica a leads" grep -q "leader identity" "$work/controller-a.log"

skewed=0
if command -v faketime >/dev/null; then
  # b's wall clock an hour ahead; its monotonic clock (expiry, fence) untouched.
  mv "$work/bin/fgpu-controller" "$work/bin/fgpu-controller.real"
  printf '#!/bin/sh\nFAKETIME_DONT_FAKE_MONOTONIC=1 exec faketime -f +1h "%s" "$@"\n' \
    "$work/bin/fgpu-controller.real" >"$work/bin/fgpu-controller"
  chmod +x "$work/bin/fgpu-controller"
  skewed=1
else
  say "note: faketime not installed: b runs with the host's clock (clock skew not exercised here)"
fi
CONTROLLER_TAG=-b CONTROLLER_WEBHOOK_ADDR=127.0.0.1:19444 CONTROLLER_METRICS_ADDR=127.0.0.1:19501 \
  start_controller "${le[@]}"; pid_b=$controller_pid
controller_pid=""
wait_until 30 "replica b is a standby" grep -q "standby" "$work/controller-b.log"
if [ $skewed = 1 ]; then
  # b's own Lease writes are not seen yet; check its clock through its log's timestamps
  b_year_hour="$(grep -m1 standby "$work/controller-b.log" | cut -c1-13)"
  say "b logs at ${b_year_hour}h (host: $(date -u +%Y-%m-%dT%H)h)"
fi
sleep 26 # two leases: a renews, b must not take the lease
id_a="$(grep -m1 -o 'leader identity=[^ ]*' "$work/controller-a.log" | sed 's/.*identity=//')"
assert_eq "Lease holder after two leases (a)" "$id_a" "$(jp lease/fgpu-controller '{.spec.holderIdentity}')"
! grep -q "leader identity" "$work/controller-b.log" || fail "b took the live lease of a (skewed: $skewed)"
say "ok: a still leads after two leases, b stands by (b's clock +1h: $skewed)"

# Only the mutating webhook (a's, then b's): the validating one would refuse claim updates
# while a is stopped (failurePolicy Fail in tests).
register_webhooks
kubectl delete validatingwebhookconfiguration fgpu-claim-config >&2

allocated() { burst_allocated; }
stamps() { # the claims' allocationTimestamps, one a line
  kubectl -n "$E2E_NS" get resourceclaims -o jsonpath='{range .items[*]}{.status.allocation.allocationTimestamp}{"\n"}{end}' 2>/dev/null
}

render "$E2E_DIR/../41-controller-failover/burst.yaml" | kubectl apply -f - >/dev/null
t0=$SECONDS
until [ "$(allocated)" -ge 1 ]; do
  [ $((SECONDS - t0)) -lt 60 ] || fail "no claim allocated within 60s"
  sleep 0.2
done
kill -STOP "$pid_a"
t_stop=$SECONDS
n_stop="$(allocated)"
say "paused the leader (SIGSTOP) with $n_stop of 50 claims allocated"
[ "$n_stop" -lt 50 ] || say "note: the burst finished before the stop landed; the takeover and the fence are still checked"
wait_until 20 "replica b leads" grep -q "leader identity" "$work/controller-b.log"
say "b took over $((SECONDS - t_stop))s after the stop"

# Resume a while b allocates: a's fence closed 10 s after its last renewal was sent.
cont_at="$(date -u +%Y-%m-%dT%H:%M:%S)"
kill -CONT "$pid_a"
say "resumed a (SIGCONT) at $cont_at, $((SECONDS - t_stop))s after the stop, with $(allocated) claims allocated"
wait_until 15 "a exits (fenced or not renewed)" sh -c "! kill -0 $pid_a 2>/dev/null"
wait "$pid_a" 2>/dev/null || true
pid_a=""
grep -Eq "could not renew the lease|lost the lease|not renewed in time|does not lead" "$work/controller-a.log" \
  || fail "a exited without saying it was fenced: $(tail -3 "$work/controller-a.log")"
say "ok: a stopped: $(grep -Eo "could not renew the lease[^\"]*|lost the lease[^\"]*|not renewed in time[^\"]*|does not lead[^\"]*" "$work/controller-a.log" | tail -1)"
fenced="$(grep -c "allocation not written: Lease" "$work/controller-a.log" || true)"
say "a's writes refused by its fence: $fenced"
# a's allocation log lines stamped after SIGCONT (a's log is on the host's clock)
late="$(grep "allocated on .*claim=$E2E_NS/" "$work/controller-a.log" | awk -v t="$cont_at" 'substr($1, 1, 19) >= t' | wc -l)"
[ "$late" -le 1 ] || fail "a logged $late allocations after it was resumed (at most the one in flight at the stop)"
say "ok: a logged $late allocation(s) after SIGCONT (an answer that arrived while it was stopped)"
if [ $skewed = 1 ]; then
  # b stamps allocationTimestamp an hour ahead; a stamp of a's clock after SIGCONT is a
  # write a built after it resumed
  now="$(date -u +%Y-%m-%dT%H:%M:%S)"
  built="$(stamps | awk -v t="$cont_at" -v n="$now" 'substr($1, 1, 19) >= t && substr($1, 1, 19) <= n' | wc -l)"
  assert_eq "allocations a built after it was resumed" "0" "$built"
fi

wait_until 60 "all 50 claims allocated" sh -c "[ \$(kubectl -n $E2E_NS get resourceclaims -o jsonpath='{range .items[*]}{.status.allocation.nodeSelector}{\"\\n\"}{end}' | grep -c .) -eq 50 ]"
say "all 50 claims allocated $((SECONDS - t0))s after the burst started"

# exactly once over both replicas, one result each, no GPU over-granted
burst_check_once "$work"/controller-a.log "$work"/controller-b.log
say "by a: $(grep -c "allocated on .*claim=$E2E_NS/" "$work/controller-a.log"), by b: $(grep -c "allocated on .*claim=$E2E_NS/" "$work/controller-b.log")"
