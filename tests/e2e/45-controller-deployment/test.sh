#!/usr/bin/env bash
# Scenario: fgpu-controller as the Deployment of deploy/controller/ (controller.yaml, rbac.yaml),
# in a pod from the image fgpu.local/controller:dev (hack/images.sh) with the ServiceAccount
# token of rbac.yaml's least rights, on every release with DRA (1.32+; skipped below). Unlike
# 40-44, where the controller is a host process with the admin's kubeconfig, a missing right
# shows here. The kubelet plugin is the host process of 40 (plugin-lib.sh).
#
# The Deployment is controller.yaml with __IMAGE__ filled in, --mode=controller for auto on
# 1.36+ (there auto picks capacity, where kube-scheduler allocates and the controller writes
# no allocation), and harness-patch.yaml merged in (`kubectl patch --local`): one replica,
# hostNetwork + KUBERNETES_SERVICE_HOST/PORT = the API server's host address (HARNESS ONLY:
# no kube-proxy, no CoreDNS here). Its serving certificate is the Secret fgpu-controller-tls
# made from hack/webhook-certs.sh's output (SAN IP:127.0.0.1); the webhooks are registered by
# URL on 127.0.0.1:9443 for this scenario's namespace only (controller-lib.sh).
#
# Asserted: the pod becomes Ready (readyz) as fgpu-controller, non-root, all capabilities
# dropped; it takes the Lease fgpu-system/fgpu-controller (holder = the pod); the validating
# webhook answers through the Secret's certificate; three pods of 40's workload (4, 8, 12 GiB
# on gpu-0) are gated, allocated by the pod (finalizer, status.allocation, consumedCapacity on
# 1.36+), ungated, run and see their quota; the mode in force; deleting the pods releases the
# claims (finalizers removed); the pod's log has no "forbidden"; RBAC allows each call the
# controller makes and refuses the rest (rbac.yaml's list); deleting the Deployment clears
# the Lease's holder (release on SIGTERM). Clean-up removes the webhooks, the Deployment,
# Service, Secret, Lease, the RBAC objects, the namespace (when this test created it), the
# classes and the plugin.
source "$(dirname "$0")/../lib.sh"
api="$(dra_api_version)"
[ "$api" != none ] || skip "Kubernetes $K8S_VERSION: no usable DRA before 1.32"
root="$(cd "$E2E_DIR/../../.." && pwd)"

source "$E2E_DIR/../plugin-lib.sh"
source "$E2E_DIR/../controller-lib.sh"
SYS_NS=fgpu-system
SA="system:serviceaccount:$SYS_NS:fgpu-controller"
SEL=app.kubernetes.io/component=controller
IMAGE=fgpu.local/controller:dev
# the manifest's --webhook-addr / --metrics-address (0.0.0.0:9443, 0.0.0.0:19500), on the host
CONTROLLER_WEBHOOK_ADDR=127.0.0.1:9443
METRICS=127.0.0.1:19500
WORKLOAD="$E2E_DIR/../40-controller-quota/workload.yaml"
ctl_pod() { kubectl -n "$SYS_NS" get pods -l "$SEL" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null; }
ctl_log() { kubectl -n "$SYS_NS" logs -l "$SEL" -c controller --tail=-1 2>/dev/null || true; }
# grep the controller pod's log (from a file: no SIGPIPE under pipefail)
clog="$(mktemp /tmp/fgpu-e2e-45-log.XXXXXX)"
ctl_grep() { ctl_log >"$clog"; grep "$@" "$clog" || true; }

owned=0 ns_created=0
cleanup() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    say "controller pod (last 60 log lines):"; ctl_log | tail -60 | sed 's/^/      /' >&2 || true
    kubectl -n "$SYS_NS" describe pods -l "$SEL" 2>/dev/null | tail -30 | sed 's/^/      /' >&2 || true
  fi
  # Workload pods first, while the controller still releases its finalizers.
  release_workloads
  controller_cleanup "$rc" # the webhooks (no host process was started)
  rm -f "$clog"
  if [ $owned = 1 ]; then
    kubectl -n "$SYS_NS" delete deployment fgpu-controller --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
    kubectl -n "$SYS_NS" wait --for=delete pod -l "$SEL" --timeout=60s >/dev/null 2>&1 || true
    kubectl -n "$SYS_NS" delete service/fgpu-controller secret/fgpu-controller-tls lease.coordination.k8s.io/fgpu-controller \
      rolebinding/fgpu-controller-leader role/fgpu-controller-leader serviceaccount/fgpu-controller \
      --ignore-not-found >/dev/null 2>&1 || true
    kubectl delete clusterrolebinding/fgpu-controller clusterrole/fgpu-controller --ignore-not-found >/dev/null 2>&1 || true
    [ $ns_created = 0 ] || kubectl delete namespace "$SYS_NS" --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
  fi
  classes | kubectl delete -f - --ignore-not-found >/dev/null 2>&1 || true
  plugin_cleanup "$rc"
  exit "$rc"
}
trap cleanup EXIT

# --- preconditions: no controller of the driver's yet
kubectl -n "$SYS_NS" get deployment fgpu-controller >/dev/null 2>&1 \
  && fail "Deployment $SYS_NS/fgpu-controller exists before this scenario (a previous one left it)"
kubectl -n "$SYS_NS" get lease fgpu-controller >/dev/null 2>&1 \
  && fail "Lease $SYS_NS/fgpu-controller exists before this scenario (another controller, or leftovers)"
for p in 9443 19500; do
  if ss -Hltn "sport = :$p" 2>/dev/null | grep -q .; then fail "host port $p is in use (the manifest's webhook/metrics port)"; fi
done
kubectl get namespace "$SYS_NS" >/dev/null 2>&1 || ns_created=1
owned=1

# --- binaries, certificates, the image (this checkout's controller; a no-op when up to date)
plugin_setup 45
controller_setup # builds fgpu-controller; $work/pki for IP:127.0.0.1
t0=$SECONDS
# this checkout's build, as controller_setup copied it (the newest of the shared target dir's
# debug/release binaries may be another checkout's)
out="$(FGPU_CONTROLLER_BIN="$work/bin/fgpu-controller" "$root/hack/images.sh" controller 2>&1)" || { tail -5 <<<"$out" >&2; fail "hack/images.sh controller failed"; }
grep -E 'controller image holds|is up to date' <<<"$out" | sed 's/^/      /' >&2 || true
grep -qF "controller from $work/bin/fgpu-controller" <<<"$out" || fail "the image was not packed from $work/bin/fgpu-controller"
say "image $IMAGE ready in $((SECONDS - t0))s"

classes | kubectl apply -f - >&2
start_plugin
wait_registered 1
wait_until 30 "ResourceSlice $PLUGIN_SLICE published" kubectl get resourceslice "$PLUGIN_SLICE"
consumable="$(jp "resourceslice/$PLUGIN_SLICE" '{.spec.devices[0].allowMultipleAllocations}' "")"
mode=auto want_mode=controller
[ "$K8S_MINOR" -lt 36 ] || mode=controller
say "Kubernetes $K8S_VERSION, resource.k8s.io/$api, consumable capacity: ${consumable:-false}, --mode=$mode"

# --- RBAC, TLS Secret, Deployment
# FGPU_E2E_45_RBAC=<file>: apply that instead of rbac.yaml (an experiment: with a right taken
# out, the scenario must fail)
kubectl apply -f "${FGPU_E2E_45_RBAC:-$root/deploy/controller/rbac.yaml}" >&2
kubectl -n "$SYS_NS" create secret tls fgpu-controller-tls --cert="$work/pki/tls.crt" --key="$work/pki/tls.key" \
  --dry-run=client -o yaml | kubectl apply -f - >&2
apiserver_host="$(kubectl get node "$NODE_NAME" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')"
apiserver_port="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}' | sed -n 's#.*:\([0-9]*\)/*$#\1#p')"
if [ -z "$apiserver_host" ] || [ -z "$apiserver_port" ]; then
  fail "cannot tell the API server's host address ($apiserver_host:$apiserver_port)"
fi
say "harness override: KUBERNETES_SERVICE_HOST=$apiserver_host KUBERNETES_SERVICE_PORT=$apiserver_port (hostNetwork)"
sed -e "s#__APISERVER_HOST__#$apiserver_host#g" -e "s#__APISERVER_PORT__#$apiserver_port#g" \
    "$E2E_DIR/harness-patch.yaml" >"$work/patch.yaml"
sed -e "s#__IMAGE__#$IMAGE#" -e "s#--mode=auto#--mode=$mode#" "$root/deploy/controller/controller.yaml" >"$work/controller.yaml"
# kubectl patch --local takes one object: the Deployment; the rest as it is
python3 - "$work/controller.yaml" "$work/rest.yaml" "$work/deployment.yaml" <<'PY'
import sys
docs = open(sys.argv[1]).read().split("\n---\n")
dep = [d for d in docs if "\nkind: Deployment\n" in "\n" + d + "\n"]
rest = [d for d in docs if d not in dep]
assert len(dep) == 1, "controller.yaml: expected one Deployment"
open(sys.argv[2], "w").write("\n---\n".join(rest) + "\n")
open(sys.argv[3], "w").write(dep[0] + "\n")
PY
kubectl patch --local -f "$work/deployment.yaml" --type=strategic --patch-file "$work/patch.yaml" -o yaml >"$work/deployment.rendered.yaml" \
  || fail "rendering the Deployment"
if ! grep -q "image: $IMAGE" "$work/deployment.rendered.yaml" || grep -q __IMAGE__ "$work/deployment.rendered.yaml"; then
  fail "the rendered Deployment does not name $IMAGE"
fi
grep -q -- "--mode=$mode" "$work/deployment.rendered.yaml" || fail "the rendered Deployment has no --mode=$mode"
kubectl apply -f "$work/rest.yaml" -f "$work/deployment.rendered.yaml" >&2
t0=$SECONDS
kubectl -n "$SYS_NS" rollout status deployment/fgpu-controller --timeout=120s >&2 \
  || fail "Deployment fgpu-controller did not roll out"
wait_until 60 "controller pod Ready" sh -c "kubectl -n $SYS_NS get pods -l $SEL -o jsonpath='{.items[0].status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
pod="$(ctl_pod)"
say "ok: pod $SYS_NS/$pod Ready $((SECONDS - t0))s after apply, as $(kubectl -n "$SYS_NS" get pod "$pod" -o jsonpath='{.spec.serviceAccountName}')"
assert_eq "pod's ServiceAccount" fgpu-controller "$(kubectl -n "$SYS_NS" get pod "$pod" -o jsonpath='{.spec.serviceAccountName}')"
assert_eq "pod's image" "$IMAGE" "$(kubectl -n "$SYS_NS" get pod "$pod" -o jsonpath='{.spec.containers[0].image}')"
assert_eq "capabilities dropped / runAsNonRoot / readOnlyRootFilesystem" '["ALL"]/true/true' \
  "$(kubectl -n "$SYS_NS" get pod "$pod" -o jsonpath='{.spec.containers[0].securityContext.capabilities.drop}/{.spec.containers[0].securityContext.runAsNonRoot}/{.spec.containers[0].securityContext.readOnlyRootFilesystem}')"
curl -fsS "http://$METRICS/readyz" >/dev/null || fail "/readyz on $METRICS does not answer 200"
say "ok: /readyz on $METRICS (the readiness probe's target)"
# the container's process: uid and memory, from the host's /proc (the image has no shell)
cpid="$(pgrep -n -u 65532 -x fgpu-controller || true)"
if [ -n "$cpid" ]; then
  say "controller process $cpid: uid $(awk '/^Uid:/ {print $2}' "/proc/$cpid/status"), VmRSS $(awk '/^VmRSS/ {print $2 " " $3}' "/proc/$cpid/status") (memory limit $(kubectl -n "$SYS_NS" get pod "$pod" -o jsonpath='{.spec.containers[0].resources.limits.memory}'))"
  assert_eq "controller's uid" 65532 "$(awk '/^Uid:/ {print $2}' "/proc/$cpid/status")"
fi

# --- leader election with the pod's rights
wait_until 30 "Lease $SYS_NS/fgpu-controller held by $pod" sh -c \
  "kubectl -n $SYS_NS get lease fgpu-controller -o jsonpath='{.spec.holderIdentity}' | grep -q '^${pod}_'"
say "ok: leader: Lease $SYS_NS/fgpu-controller held by $(kubectl -n "$SYS_NS" get lease fgpu-controller -o jsonpath='{.spec.holderIdentity}')"
wait_until 30 "the pod logged that it leads" sh -c "kubectl -n $SYS_NS logs $pod -c controller | grep -q '\"leader\"'"

# --- webhooks by URL on the host, the Secret's certificate
register_webhooks
render "$E2E_DIR/../40-controller-quota/bad-configs.yaml" \
  | python3 -c 'import sys; print(sys.stdin.read().split("\n---\n")[0])' >"$work/bad.yaml"
wait_until 30 "the validating webhook denies through the pod" sh -c "kubectl create --dry-run=server -f $work/bad.yaml 2>&1 | grep -q 'denied the request'"
msg="$(kubectl create --dry-run=server -f "$work/bad.yaml" 2>&1 || true)"
grep -qF "ResourceClaim $E2E_NS/bad-cores: spec.devices.config[0].opaque.parameters.cores:" <<<"$msg" \
  || fail "the validating webhook did not deny with the field path: $msg"
say "ok: denied: $(cut -c1-140 <<<"${msg#*denied the request: }")"

# --- three pods share gpu-0 through the pod's controller
t0=$SECONDS
render "$WORKLOAD" | kubectl apply -f - >&2
for p in quota-4g quota-8g quota-12g; do
  wait_until 120 "pod $p ran its probe" sh -c "kubectl -n $E2E_NS logs $p 2>/dev/null | grep -q probe_done"
done
say "three probes done $((SECONDS - t0))s after the pods were created"
for p in quota-4g quota-8g quota-12g; do
  ctl_grep 'scheduling gate added' | grep -F "$E2E_NS/$p" >/dev/null || fail "the mutating webhook did not gate $p (pod log)"
done
say "ok: the webhook (in the pod) gated the three pods"
field() { kubectl -n "$E2E_NS" logs "$1" | sed -n "s/^$2=//p"; }
claim_of() { jp "pod/$1" '{.status.resourceClaimStatuses[0].resourceClaimName}'; }
r='{.status.allocation.devices.results[0]'
claims=()
for pm in 4g:4096 8g:8192 12g:12288; do
  p="quota-${pm%:*}" mib="${pm#*:}"
  claims+=("$(claim_of "$p")")
  c="resourceclaims.resource.k8s.io/$(claim_of "$p")"
  assert_eq "$p claim: driver/pool/device" "$PLUGIN_DRIVER/$NODE_NAME/gpu-0" "$(jp "$c" "$r.driver}/$r.pool}/$r.device}")"
  assert_eq "$p claim: finalizer" "gpu.fgpu.dev/allocation" "$(jp "$c" '{.metadata.finalizers[*]}')"
  assert_eq "$p claim: reserved for the pod" "$p" "$(jp "$c" '{.status.reservedFor[0].name}')"
  grant="$(jp "$c" '{.status.allocation.devices.config[-1:].opaque.parameters.memory}')"
  assert_eq "$p claim: granted memory (opaque config)" "${p#quota-}" "${grant%Gi}g"
  if [ "$consumable" = true ]; then
    jp_nonempty "$c" "$r.shareID}" || fail "$p: no shareID with consumable capacity"
    assert_eq "$p claim: consumedCapacity.memory" "${p#quota-}" "$(jp "$c" "$r.consumedCapacity.memory}" | sed 's/Gi$/g/')"
  fi
  assert_eq "$p cuMemGetInfo total (MiB)" "$mib" "$(field "$p" cuda_total_mib)"
  assert_eq "$p allocation past the quota" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(field "$p" next_alloc_result)"
done
ev="$(kubectl -n "$E2E_NS" get events --field-selector involvedObject.name=quota-4g,reason=GpuAllocated -o jsonpath='{.items[*].message}' 2>/dev/null)"
grep -q "allocated on $NODE_NAME: gpu-0 (4Gi" <<<"$ev" || fail "no GpuAllocated Event on quota-4g (events.k8s.io create): $ev"
say "ok: Event on quota-4g: $ev"
m="$(curl -s "http://$METRICS/metrics")"
say "metrics: $(grep -E '^fgpu_controller_(claims_allocated_total|mode_info)' <<<"$m" | tr '\n' ' ')"
grep -q '^fgpu_controller_claims_allocated_total 3$' <<<"$m" || fail "claims_allocated_total is not 3"
grep -q "^fgpu_controller_mode_info{mode=\"$want_mode\"" <<<"$m" || fail "mode_info does not say $want_mode"

# --- release: the pods go, the controller removes its finalizers, the claims go
kubectl -n "$E2E_NS" delete pods --all --wait=false >&2
for c in "${claims[@]}"; do
  wait_until 60 "claim $c released and deleted" sh -c "! kubectl -n $E2E_NS get resourceclaim $c"
  ctl_grep 'released' | grep -F "$E2E_NS/$c" >/dev/null || fail "the pod's log does not say it released $c"
done
say "ok: the three claims released (finalizer removed by the pod) and deleted"

# --- least rights: no refusal in the log, and RBAC refuses the rest
forbidden="$(ctl_grep -i forbidden)"
if [ -n "$forbidden" ]; then
  head -5 <<<"$forbidden" | sed 's/^/      /' >&2
  fail "the controller pod's log shows a forbidden API call"
fi
say "ok: no \"forbidden\" in the pod's log ($(ctl_log | wc -l) lines)"
can() { kubectl auth can-i --as="$SA" "$@" 2>/dev/null || true; }
for a in "list resourceclaims.resource.k8s.io -A" "watch resourceclaims.resource.k8s.io -A" \
         "get resourceclaims.resource.k8s.io -n $E2E_NS" "patch resourceclaims.resource.k8s.io -n $E2E_NS" \
         "update resourceclaims.resource.k8s.io --subresource=status -n $E2E_NS" \
         "update resourceclaims.resource.k8s.io --subresource=binding -n $E2E_NS" \
         "get resourceclaimtemplates.resource.k8s.io -n $E2E_NS" \
         "list resourceslices.resource.k8s.io" "watch resourceslices.resource.k8s.io" \
         "get deviceclasses.resource.k8s.io/shared.gpu.fgpu.dev" \
         "get deviceclasses.resource.k8s.io/gpu.fgpu.dev" \
         "list pods -A" "watch pods -A" "patch pods -n $E2E_NS" \
         "create events.events.k8s.io -n $E2E_NS" \
         "get leases.coordination.k8s.io/fgpu-controller -n $SYS_NS" \
         "update leases.coordination.k8s.io/fgpu-controller -n $SYS_NS" \
         "create leases.coordination.k8s.io -n $SYS_NS"; do
  # shellcheck disable=SC2086 # word-split on purpose
  assert_eq "can-i $a" yes "$(can $a)"
done
for a in "list secrets -A" "get secrets -n $SYS_NS" "get configmaps -n $SYS_NS" \
         "delete resourceclaims.resource.k8s.io -n $E2E_NS" "create resourceclaims.resource.k8s.io -n $E2E_NS" \
         "update resourceclaims.resource.k8s.io -n $E2E_NS" \
         "patch resourceclaims.resource.k8s.io --subresource=status -n $E2E_NS" \
         "patch resourceclaims.resource.k8s.io --subresource=binding -n $E2E_NS" \
         "update resourceclaims.resource.k8s.io --subresource=driver -n $E2E_NS" \
         "create resourceclaimtemplates.resource.k8s.io -n $E2E_NS" \
         "create resourceslices.resource.k8s.io" "update resourceslices.resource.k8s.io" \
         "delete resourceslices.resource.k8s.io" "get resourceslices.resource.k8s.io" \
         "list deviceclasses.resource.k8s.io" \
         "update deviceclasses.resource.k8s.io/shared.gpu.fgpu.dev" \
         "get nodes" "patch nodes" "create pods -n $E2E_NS" "delete pods -n $E2E_NS" \
         "update pods -n $E2E_NS" "get pods -n $E2E_NS" "patch pods --subresource=status -n $E2E_NS" \
         "create pods --subresource=binding -n $E2E_NS" "create pods --subresource=eviction -n $E2E_NS" \
         "create events -n $E2E_NS" "delete events.events.k8s.io -n $E2E_NS" \
         "patch events.events.k8s.io -n $E2E_NS" \
         "update leases.coordination.k8s.io/other -n $SYS_NS" "delete leases.coordination.k8s.io/fgpu-controller -n $SYS_NS" \
         "get leases.coordination.k8s.io -n kube-system" "update leases.coordination.k8s.io -n kube-system" \
         "create mutatingwebhookconfigurations.admissionregistration.k8s.io"; do
  # shellcheck disable=SC2086
  assert_eq "can-i $a" no "$(can $a)"
done

# --- the Deployment goes: on SIGTERM the leader gives the Lease up (an UPDATE with its rights)
kubectl -n "$SYS_NS" delete deployment fgpu-controller --wait=true --timeout=60s >&2
kubectl -n "$SYS_NS" wait --for=delete "pod/$pod" --timeout=60s >&2 || fail "controller pod $pod not gone after the Deployment's deletion"
assert_eq "Lease holder after the leader's SIGTERM" "" "$(kubectl -n "$SYS_NS" get lease fgpu-controller -o jsonpath='{.spec.holderIdentity}')"
say "ok: Deployment deleted; the pod released the Lease on SIGTERM"
