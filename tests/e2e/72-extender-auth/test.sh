#!/usr/bin/env bash
# Scenario: the legacy extender's protections against callers other than its own
# kube-scheduler and users other than itself (issue 20, review findings C1 and H1), on the
# legacy path of tests/e2e/5*-legacy-* (host processes: the extender, the device plugin,
# the second kube-scheduler; the extender's webhooks registered for this namespace).
#
# The extender runs on its default address (no address flag), as deploy/extender does.
# Asserted, each an attack that succeeded before the fix (every check runs, the failures
# are listed at the end):
#   1. the extender refuses to start on a non-loopback address (0.0.0.0);
#   2. a pod's unauthenticated POST /bind to the node's address is refused (connection
#      refused: the verbs listen on loopback only), while the same pod reaches the API
#      server on that address (the network path exists);
#   3. a /bind from the extender's own network namespace for a pod addressed to another
#      scheduler is refused, and the pod stays unbound;
#   4. a user (e2e-tenant, with rights on pods) setting the grant annotation is refused at
#      admission: on create, on update of a pod without it, and changing the grant of a
#      pod the extender bound;
#   5. grants the extender did not write (annotated by the admin with another field manager:
#      the admin is the extender's own user here, so admission lets it pass) are not
#      counted: they claim both GPUs whole, and a GPU pod is still bound, with a warning
#      naming the forged pods in the extender's log.
export FGPU_E2E_EXTENDER_ADDR=127.0.0.1:8888 LEGACY_EXTENDER_DEFAULT_ADDR=1
source "$(dirname "$0")/../lib.sh"
source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../legacy-lib.sh"
trap 'legacy_cleanup $?' EXIT
failures=()
check_fail() { failures+=("$1"); printf '    FAIL: %s\n' "$1" >&2; }
ok() { say "ok: $1"; }

legacy_setup 72
legacy_up
ann="$LEGACY_DECISION_ANN"
host_ip="$(kubectl get node "$NODE_NAME" -o 'jsonpath={.status.addresses[?(@.type=="InternalIP")].address}')"
api_port="$(kubectl config view --minify -o 'jsonpath={.clusters[0].cluster.server}' | sed 's#.*:##')"
if [ -z "$host_ip" ] || [ -z "$api_port" ]; then
  fail "node address ($host_ip) or API server port ($api_port) unknown"
fi

# A pod that no scheduler places (its scheduler does not exist): the victim of the binds.
victim() {
  kubectl -n "$E2E_NS" apply -f - >&2 <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  schedulerName: nobody-scheduler
  terminationGracePeriodSeconds: 0
  containers: [{name: main, image: $FGPU_WORKLOAD_IMAGE, command: [sleep, "3600"]}]
YAML
}
bind_body() { # bind_body <pod>
  printf '{"PodName":"%s","PodNamespace":"%s","PodUID":"%s","Node":"%s"}' \
    "$1" "$E2E_NS" "$(jp "pod/$1" '{.metadata.uid}')" "$NODE_NAME"
}

# 1. A non-loopback address is refused at start.
log1="$work/extender-any.log"
"$work/bin/fgpu-controller" extender --extender-address 0.0.0.0:18889 --kubeconfig "$KUBECONFIG" \
  >"$log1" 2>&1 </dev/null &
any_pid=$!
for _ in $(seq 1 20); do [ -d "/proc/$any_pid" ] || break; sleep 0.5; done
if [ -d "/proc/$any_pid" ]; then
  kill "$any_pid" 2>/dev/null || true; wait "$any_pid" 2>/dev/null || true
  check_fail "1: the extender started on 0.0.0.0:18889 (it must refuse a non-loopback address)"
else
  rc=0; wait "$any_pid" || rc=$?
  if [ "$rc" -ne 0 ] && grep -q -- '--extender-address 0.0.0.0:18889: not a loopback address' "$log1"; then
    ok "1: the extender refuses 0.0.0.0:18889 (exit $rc: $(grep -o 'not a loopback address[^;]*' "$log1" | head -1))"
  else
    check_fail "1: the extender exited $rc without the expected refusal: $(tail -2 "$log1")"
  fi
fi

# 2. An unauthenticated /bind from another pod, to the node's address.
victim victim-a
body_a="$(bind_body victim-a)"
# busybox's nc (its static wget crashes in this image): a raw HTTP/1.0 request each; nc
# stops at the end of its input, so the bind's input stays open until the answer is in.
kubectl -n "$E2E_NS" apply -f - >&2 <<YAML
apiVersion: v1
kind: Pod
metadata: {name: attacker}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 0
  containers:
    - name: main
      image: $FGPU_WORKLOAD_IMAGE
      env:
        - {name: BODY, value: '$body_a'}
      command:
        - sh
        - -c
        - |
          echo "bind: \$({ printf 'POST /bind HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %s\r\n\r\n%s' "\${#BODY}" "\$BODY"; sleep 3; } | nc -w 5 $host_ip 8888 2>&1 | tr '\r\n' '  ')"
          echo "api: \$(printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 $host_ip $api_port 2>&1 | head -1 | tr -d '\r')"
          echo attack_done
YAML
wait_until 90 "attacker pod ran" sh -c "kubectl -n $E2E_NS logs attacker 2>/dev/null | grep -q attack_done"
out="$(kubectl -n "$E2E_NS" logs attacker)"
printf '%s\n' "$out" | sed 's/^/      attacker: /' >&2
bind_line="$(printf '%s\n' "$out" | sed -n 's/^bind: //p')"
api_line="$(printf '%s\n' "$out" | sed -n 's/^api: //p')"
case "$api_line" in
  HTTP/*) ;;
  *) fail "2: the pod cannot reach the API server at $host_ip:$api_port either ($api_line): no network path to test" ;;
esac
if [ -n "$(jp pod/victim-a '{.spec.nodeName}')" ]; then
  check_fail "2: a pod's /bind to $host_ip:8888 bound victim-a to $(jp pod/victim-a '{.spec.nodeName}') ($bind_line)"
elif [[ "$bind_line" == *refused* ]]; then
  ok "2: a pod's /bind to $host_ip:8888 is refused ($bind_line); the API server on that address answers ($api_line)"
else
  check_fail "2: a pod's /bind to $host_ip:8888 was not refused by the network: $bind_line"
fi

# 3. /bind from the extender's own network namespace, for another scheduler's pod.
victim victim-b
answer="$(curl -s -H 'Content-Type: application/json' -d "$(bind_body victim-b)" "http://$LEGACY_EXTENDER_ADDR/bind")"
sleep 1
if [ -n "$(jp pod/victim-b '{.spec.nodeName}')" ]; then
  check_fail "3: /bind bound victim-b (schedulerName nobody-scheduler) to $(jp pod/victim-b '{.spec.nodeName}') (answer $answer)"
elif [[ "$answer" == *'spec.schedulerName is \"nobody-scheduler\"'* ]]; then
  ok "3: /bind of another scheduler's pod refused: $answer"
else
  check_fail "3: unexpected /bind answer for another scheduler's pod: $answer"
fi

# A GPU pod the extender places (the extender's own writes pass its guard), asking for
# 40000 MiB: it fits only if the forged grants of 5 are not counted.
cat >"$work/legit.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: legit, namespace: __NS__}
spec:
  terminationGracePeriodSeconds: 0
  containers:
    - name: main
      image: __IMAGE__
      command: [sleep, "3600"]
      resources: {limits: {nvidia.com/gpu: "1", nvidia.com/gpumem: "40000"}}
YAML

# 5 (set up before the GPU pod): forged grants claiming both GPUs whole, on pods no
# scheduler places (live, so counted by a resync that trusts them; not on the node, so the
# device plugin never takes them for the GPU pod), annotated by the admin under another
# field manager.
inv="$(node_inventory "$NODE_NAME")"
for i in 0 1; do
  kubectl -n "$E2E_NS" apply -f - >&2 <<YAML
apiVersion: v1
kind: Pod
metadata: {name: forged-$i}
spec:
  schedulerName: nobody-scheduler
  terminationGracePeriodSeconds: 0
  containers: [{name: main, image: $FGPU_WORKLOAD_IMAGE, command: [sleep, "3600"]}]
YAML
  grant="$(py_json "json.dumps({'node': '$NODE_NAME', 'containers': [{'index': 0, 'name': 'main', 'devices': [{'id': g['id'], 'uuid': g['uuid'], 'memoryBytes': g['memoryBytes'], 'cores': 100} for g in d if g['id'] == 'gpu-$i']}]})" <<<"$inv")"
  kubectl -n "$E2E_NS" annotate pod "forged-$i" --field-manager=e2e-forger "$ann=$grant" >&2
done
sleep 5 # two resyncs
legacy_apply "$work/legit.yaml"
# wait_until_soft <seconds> <cmd...>: as wait_until, but returns 1 instead of failing.
wait_until_soft() {
  local d=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do [ $SECONDS -lt $d ] || return 1; sleep 1; done
}
if wait_until_soft 60 jp_nonempty pod/legit '{.spec.nodeName}'; then
  ok "5: legit (40000 MiB) bound to $(jp pod/legit '{.spec.nodeName}') on $(decision_field legit 'd["containers"][0]["devices"][0]["id"]') beside grants that claim both GPUs whole"
else
  check_fail "5: legit stays unbound: the forged grants were counted ($(kubectl -n "$E2E_NS" get events --field-selector involvedObject.name=legit -o 'jsonpath={.items[-1:].message}'))"
fi
for i in 0 1; do
  if grep -q "pod $E2E_NS/forged-$i: annotation $ann was not written by the extender" "$work/extender.log"; then
    ok "5: the extender warns that forged-$i's grant is not its own"
  else
    check_fail "5: no warning naming forged-$i in the extender's log"
  fi
done
owner="$(kubectl -n "$E2E_NS" get pod legit -o json --show-managed-fields | py_json "[e['manager'] for e in d['metadata'].get('managedFields', []) if 'f:$ann' in e.get('fieldsV1', {}).get('f:metadata', {}).get('f:annotations', {})]")"
if [ "$owner" = "['fgpu-extender']" ]; then ok "legit's grant is owned by field manager fgpu-extender"; else check_fail "legit's grant owners: $owner"; fi

# 4. A user writing the grant annotation.
kubectl apply -f - >&2 <<YAML
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: e2e-tenant, namespace: $E2E_NS}
rules:
  - apiGroups: [""]
    resources: [pods]
    verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: e2e-tenant, namespace: $E2E_NS}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: e2e-tenant}
subjects: [{kind: User, name: e2e-tenant, apiGroup: rbac.authorization.k8s.io}]
YAML
tenant() { kubectl --as=e2e-tenant -n "$E2E_NS" "$@"; }
forged='{"node":"'"$NODE_NAME"'","containers":[{"index":0,"name":"main","devices":[{"id":"gpu-0","uuid":"GPU-e2e1e9ac-0000-4000-8000-000000000000","memoryBytes":85520809984,"cores":100}]}]}'
refused() { # refused <what> <kubectl output> <rc>
  if [ "$3" -ne 0 ] && [[ "$2" == *"only fgpu's extender"* ]]; then ok "4: $1 refused: $(printf '%s' "$2" | grep -o 'only fgpu.s extender.*' | head -1)"
  else check_fail "4: $1 was not refused (rc $3): $2"; fi
}
rc=0; out="$(tenant apply -f - 2>&1 <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: self-granted
  annotations: {$ann: '$forged'}
spec:
  terminationGracePeriodSeconds: 0
  containers: [{name: main, image: $FGPU_WORKLOAD_IMAGE, command: [sleep, "3600"]}]
YAML
)" || rc=$?
refused "a tenant's pod created with the grant annotation" "$out" "$rc"
tenant apply -f - >&2 <<YAML
apiVersion: v1
kind: Pod
metadata: {name: plain}
spec:
  terminationGracePeriodSeconds: 0
  containers: [{name: main, image: $FGPU_WORKLOAD_IMAGE, command: [sleep, "3600"]}]
YAML
rc=0; out="$(tenant annotate pod plain "$ann=$forged" 2>&1)" || rc=$?
refused "a tenant adding the grant annotation to its pod (update)" "$out" "$rc"
rc=0; out="$(tenant annotate --overwrite pod legit "$ann=$forged" 2>&1)" || rc=$?
refused "a tenant changing the grant the extender wrote (update)" "$out" "$rc"
rc=0; out="$(tenant annotate pod legit "$ann-" 2>&1)" || rc=$?
refused "a tenant removing the grant the extender wrote (update)" "$out" "$rc"
rc=0; out="$(tenant label pod legit e2e/touched=yes 2>&1)" || rc=$?
if [ "$rc" -eq 0 ]; then ok "4: the tenant's other updates of its pods pass"; else check_fail "4: a label update was refused: $out"; fi

if [ "${#failures[@]}" -gt 0 ]; then
  fail "${#failures[@]} check(s) failed: $(printf '%s; ' "${failures[@]}")"
fi
say "ok: every attack on the extender was refused"
