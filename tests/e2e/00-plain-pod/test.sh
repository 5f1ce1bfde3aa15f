#!/usr/bin/env bash
# Scenario: a plain pod (no claims) reaches Running, gets a pod IP from the CNI bridge, and its
# log (served by kubelet through the apiserver) shows the workload image's content.
source "$(dirname "$0")/../lib.sh"
apply_tmpl "$E2E_DIR/pod.yaml"
wait_until 120 "pod plain Running" jp_eq pod/plain '{.status.phase}' Running
assert_eq "pod plain node" "$NODE_NAME" "$(jp pod/plain '{.spec.nodeName}')"
ip="$(jp pod/plain '{.status.podIP}')"
[ -n "$ip" ] || fail "pod plain has no IP"
say "ok: pod IP $ip"
wait_until 30 "log of pod plain" sh -c "kubectl -n $E2E_NS logs plain | grep -q fgpu-e2e-hello"
kubectl -n "$E2E_NS" logs plain | sed 's/^/    log: /' >&2
out="$(kubectl -n "$E2E_NS" exec plain -- /bin/sh -c 'echo exec-ok')"
assert_eq "kubectl exec" exec-ok "$out"
kubectl -n "$E2E_NS" delete pod plain --wait=true --timeout=60s >&2
