#!/usr/bin/env bash
# Scenario: `helm install fgpu` (deploy/helm/fgpu) on 1.37 with the demo values (fake GPUs),
# the way an admin installs it; the harness's only change is tests/helm/harness-postrender.py
# (host network, webhooks by URL: no kube-proxy or CoreDNS here).
#
# Asserted: a server-side dry-run of every shipped values example against this API server;
# the install (certs Job -> Secret -> controller Ready; plugin DaemonSet -> slice); the
# certificates and the webhooks' caBundle; the webhook answers over TLS with the Job's
# certificate; three shared pods on one fake GPU with their memory quotas enforced;
# `helm upgrade` to a rebuilt image while the claims are prepared: the plugin pod is replaced,
# the running pods keep their GPU and quota, a new claim works; RBAC of every ServiceAccount
# (`kubectl auth can-i`); the VAP refuses a plugin writing another node's slice (and, with
# its binding removed, the same write goes through: the policy is what refuses it); once
# the claims are gone no CDI spec or claim state is left on the node; `helm uninstall`
# leaves nothing of the release in the cluster.
source "$(dirname "$0")/../lib.sh"
[ "$K8S_MINOR" -ge 34 ] || skip "Kubernetes $K8S_VERSION: this scenario uses resource.k8s.io/v1 and consumable capacity (71 covers controller mode)"
source "$E2E_DIR/../helm-lib.sh"
owned=0 state_created=0 run_created=0 devdir_created=0
work="$(mktemp -d /tmp/fgpu-e2e-70.XXXXXX)"
cleanup() {
  local rc=$?
  helm_diagnostics "$rc"
  helm_cleanup
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
helm_preconditions
owned=1
helm_images
helm_setup
api=v1

# --- server-side dry-run of every values example (admission and schema of this API server)
kubectl create namespace "$SYS_NS" >&2
for f in "$CHART"/examples/*.yaml; do
  if grep -q 'certManager' "$f"; then
    say "skip dry-run of $(basename "$f"): cert-manager's CRDs are not installed here"; continue
  fi
  helm template "$RELEASE" "$CHART" -n "$SYS_NS" -f "$f" --kube-version "$K8S_VERSION" >"$work/r.yaml" \
    || fail "helm template -f $f"
  kubectl apply --dry-run=server -f "$work/r.yaml" >"$work/dry.txt" 2>&1 \
    || { tail -5 "$work/dry.txt" >&2; fail "server-side dry-run of $(basename "$f") refused"; }
  say "ok: server-side dry-run of $(basename "$f"): $(grep -c 'server dry run' "$work/dry.txt") objects accepted"
done
kubectl delete namespace "$SYS_NS" --wait=true --timeout=60s >&2

# --- install
# shellcheck disable=SC2119 # no extra arguments
helm_install
say "$(helm status "$RELEASE" -n "$SYS_NS" | sed -n 's/^STATUS: /release status: /p')"
assert_eq "plugin image" fgpu.local/kubelet-plugin-fake:dev "$(kubectl -n "$SYS_NS" get ds fgpu-kubelet-plugin -o jsonpath='{.spec.template.spec.containers[0].image}')"
assert_eq "controller mode (auto on $K8S_VERSION)" "--mode=capacity" \
  "$(kubectl -n "$SYS_NS" get deploy fgpu-controller -o jsonpath='{.spec.template.spec.containers[0].args[1]}')"
s="resourceslice/$NODE_NAME-$DRIVER"
assert_eq "slice devices (from the pod's fake profile)" "gpu-0 gpu-1" "$(jp "$s" '{.spec.devices[*].name}' "")"
certs_checks validatingwebhookconfiguration/fgpu-claim-config
render_bad() { sed -e "s#__RAPI__#v1#g" -e "s#__REQ__#exactly: {deviceClassName: shared.gpu.fgpu.dev}#g" -e "s#__NS__#$E2E_NS#g" "$E2E_DIR/../40-controller-quota/bad-configs.yaml" \
  | python3 -c 'import sys; print(sys.stdin.read().split("\n---\n")[0])'; }
render_bad >"$work/bad.yaml"
wait_until 60 "the validating webhook denies through TLS with the Job's certificate" \
  sh -c "kubectl create --dry-run=server -f $work/bad.yaml 2>&1 | grep -q 'denied the request'"
say "ok: webhook over TLS: $(kubectl create --dry-run=server -f "$work/bad.yaml" 2>&1 | cut -c1-150)"

# --- three shared pods with quotas, on one fake GPU
for q in 4 8 12; do
  sed -e "s#__Q__#$q#g" -e "s#__C__#30#g" -e "s#__NS__#$E2E_NS#g" -e "s#__IMAGE__#$FGPU_WORKLOAD_IMAGE#g" "$E2E_DIR/workload.yaml" | kubectl apply -f - >&2
done
field() { kubectl -n "$E2E_NS" logs "$1" | sed -n "s/^$2=//p"; }
claims=()
for q in 4 8 12; do
  p="share-${q}g"
  wait_until 120 "pod $p ran its probe" sh -c "kubectl -n $E2E_NS logs $p 2>/dev/null | grep -q probe_done"
  c="$(jp "pod/$p" '{.status.resourceClaimStatuses[0].resourceClaimName}')"
  claims+=("$c")
  assert_eq "$p: device" gpu-0 "$(jp "resourceclaim/$c" '{.status.allocation.devices.results[0].device}')"
  assert_eq "$p: cuMemGetInfo total (MiB)" "$((q * 1024))" "$(field "$p" cuda_total_mib)"
  assert_eq "$p: allocation past the quota" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(field "$p" next_alloc_result)"
done
uids=()
for c in "${claims[@]}"; do uids+=("$(jp "resourceclaim/$c" '{.metadata.uid}')"); done
for u in "${uids[@]}"; do [ -f "/var/run/cdi/$DRIVER-claim_$u.json" ] || fail "no CDI spec for claim $u"; done
say "ok: three CDI specs on the node"

# --- helm upgrade to a rebuilt image, claims prepared
old_pod="$(pod_of kubelet-plugin)"
crt_before="$(kubectl -n "$SYS_NS" get secret fgpu-webhook-tls -o jsonpath='{.data.tls\.crt}')"
# shellcheck disable=SC2016 # expanded by the inner bash
CTR=("$(cd "$ROOT" && bash -c 'source hack/lib.sh; echo "$(containerd_bindir)/ctr"')" --address "$CONTAINERD_ADDRESS" -n k8s.io)
# "rebuilt": the archives packed again (a new build stamp, so a new digest), under a new tag
if ! FGPU_IMAGES_FORCE=1 "$ROOT/hack/images.sh" plugin >/dev/null 2>&1 || ! FGPU_IMAGES_FORCE=1 "$ROOT/hack/images.sh" controller >/dev/null 2>&1; then
  fail "rebuilding the images"
fi
for i in kubelet-plugin-fake controller; do
  "${CTR[@]}" images tag --force "fgpu.local/$i:dev" "fgpu.local/$i:upgrade" >/dev/null || fail "tagging $i:upgrade"
done
t0=$SECONDS
helm upgrade "$RELEASE" "$CHART" "${HELM_ARGS[@]}" --set image.tag=upgrade --wait --wait-for-jobs --timeout 240s >&2 || fail "helm upgrade failed"
wait_until 90 "the plugin pod replaced" sh -c "p=\$(kubectl -n $SYS_NS get pods -l '$(sel kubelet-plugin)' -o jsonpath='{.items[0].metadata.name}'); [ -n \"\$p\" ] && [ \"\$p\" != $old_pod ]"
kubectl -n "$SYS_NS" rollout status ds/fgpu-kubelet-plugin --timeout=90s >&2
assert_eq "plugin image after the upgrade" fgpu.local/kubelet-plugin-fake:upgrade "$(kubectl -n "$SYS_NS" get pod "$(pod_of kubelet-plugin)" -o jsonpath='{.spec.containers[0].image}')"
say "ok: helm upgrade in $((SECONDS - t0))s; release revision $(helm status "$RELEASE" -n "$SYS_NS" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')"
certs_checks validatingwebhookconfiguration/fgpu-claim-config
assert_eq "serving certificate across the upgrade (valid: kept, not reissued)" "$crt_before" \
  "$(kubectl -n "$SYS_NS" get secret fgpu-webhook-tls -o jsonpath='{.data.tls\.crt}')"
for q in 4 8 12; do
  p="share-${q}g"
  assert_eq "$p still Running after the upgrade" Running "$(jp "pod/$p" '{.status.phase}')"
  out="$(kubectl -n "$E2E_NS" exec "$p" -- /usr/local/bin/fgpu-probe --step-mib 1024 --max-gib 16 2>&1)"
  assert_eq "$p after the upgrade: total (MiB)" "$((q * 1024))" "$(sed -n 's/^cuda_total_mib=//p' <<<"$out")"
  assert_eq "$p after the upgrade: past the quota" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(sed -n 's/^next_alloc_result=//p' <<<"$out")"
done
sed -e "s#__Q__#2#g" -e "s#__C__#10#g" -e "s#__NS__#$E2E_NS#g" -e "s#__IMAGE__#$FGPU_WORKLOAD_IMAGE#g" "$E2E_DIR/workload.yaml" | kubectl apply -f - >&2
wait_until 120 "a new claim after the upgrade" sh -c "kubectl -n $E2E_NS logs share-2g 2>/dev/null | grep -q probe_done"
assert_eq "new pod after the upgrade: total (MiB)" 2048 "$(field share-2g cuda_total_mib)"
log_of kubelet-plugin | grep -qi forbidden && fail "the plugin pod's log shows a forbidden API call"

# --- RBAC of each ServiceAccount
can() { kubectl auth can-i --as="system:serviceaccount:$SYS_NS:$1" "${@:2}" 2>/dev/null || true; }
for a in "get resourceclaims.resource.k8s.io -n $E2E_NS" "list resourceclaims.resource.k8s.io -A" "watch resourceclaims.resource.k8s.io -A" \
         "create resourceslices.resource.k8s.io" "update resourceslices.resource.k8s.io" "get nodes" "create events -n default"; do
  # shellcheck disable=SC2086 # word-split on purpose
  assert_eq "kubelet-plugin can-i $a" yes "$(can fgpu-kubelet-plugin $a)"
done
for a in "delete resourceslices.resource.k8s.io" "patch nodes" "update nodes" "get secrets -n $SYS_NS" "list pods -A" \
         "update resourceclaims.resource.k8s.io --subresource=status -n $E2E_NS" "create events -n $E2E_NS"; do
  # shellcheck disable=SC2086
  assert_eq "kubelet-plugin can-i $a" no "$(can fgpu-kubelet-plugin $a)"
done
for a in "list pods -A" "patch pods -n $E2E_NS" "update resourceclaims.resource.k8s.io --subresource=status -n $E2E_NS" \
         "get deviceclasses.resource.k8s.io/shared.$DRIVER" "update leases.coordination.k8s.io/fgpu-controller -n $SYS_NS"; do
  # shellcheck disable=SC2086
  assert_eq "controller can-i $a" yes "$(can fgpu-controller $a)"
done
for a in "get secrets -n $SYS_NS" "create pods -n $E2E_NS" "patch nodes" "create resourceslices.resource.k8s.io" \
         "update mutatingwebhookconfigurations.admissionregistration.k8s.io/fgpu-allocation-gate"; do
  # shellcheck disable=SC2086
  assert_eq "controller can-i $a" no "$(can fgpu-controller $a)"
done
for a in "get secrets/fgpu-webhook-tls -n $SYS_NS" "update secrets/fgpu-webhook-tls -n $SYS_NS" \
         "update validatingwebhookconfigurations.admissionregistration.k8s.io/fgpu-claim-config" \
         "update mutatingwebhookconfigurations.admissionregistration.k8s.io/fgpu-allocation-gate"; do
  # shellcheck disable=SC2086
  assert_eq "certs can-i $a" yes "$(can fgpu-certs $a)"
done
for a in "get secrets -n kube-system" "list secrets -n $SYS_NS" "get secrets/other -n $SYS_NS" \
         "update validatingwebhookconfigurations.admissionregistration.k8s.io/other" "create validatingwebhookconfigurations.admissionregistration.k8s.io" \
         "list pods -A"; do
  # shellcheck disable=SC2086
  assert_eq "certs can-i $a" no "$(can fgpu-certs $a)"
done

# --- the VAP: a node's plugin writes only its own node's slices
slice() { # slice <name> <node>
  cat <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: $1}
spec:
  driver: $DRIVER
  nodeName: $2
  pool: {name: $2, generation: 1, resourceSliceCount: 1}
  devices: [{name: gpu-9}]
YAML
}
as_plugin=(--as="system:serviceaccount:$SYS_NS:fgpu-kubelet-plugin" --as-user-extra="authentication.kubernetes.io/node-name=$NODE_NAME")
slice "$NODE_NAME-e2e70" "$NODE_NAME" >"$work/own.yaml"
slice fgpu-e2e70-other "fgpu-e2e70-other-node" >"$work/other.yaml"
kubectl create --dry-run=server "${as_plugin[@]}" -f "$work/own.yaml" >&2 || fail "the plugin may not write a slice of its own node"
say "ok: as the plugin on $NODE_NAME: a slice of $NODE_NAME is admitted (dry-run)"
msg="$(kubectl create --dry-run=server "${as_plugin[@]}" -f "$work/other.yaml" 2>&1 || true)"
grep -q "ValidatingAdmissionPolicy 'fgpu-kubelet-plugin-own-node'.*denied request.*may not write the ResourceSlices of node 'fgpu-e2e70-other-node'" <<<"$msg" \
  || fail "the plugin wrote another node's slice: $msg"
say "ok: denied: $(cut -c1-200 <<<"$msg")"
msg="$(kubectl create --dry-run=server --as="system:serviceaccount:$SYS_NS:fgpu-kubelet-plugin" -f "$work/own.yaml" 2>&1 || true)"
grep -q "no node in the request's credentials" <<<"$msg" || fail "a plugin token without a node claim was not refused: $msg"
say "ok: without the token's node claim: denied"
# the attack without the policy's binding goes through: it is the policy that refuses it
helm get manifest "$RELEASE" -n "$SYS_NS" | python3 -c '
import sys, yaml
for d in yaml.safe_load_all(sys.stdin):
    if d and d["kind"] == "ValidatingAdmissionPolicyBinding" and d["metadata"]["name"] == "fgpu-kubelet-plugin-own-node":
        print(yaml.safe_dump(d))' >"$work/binding.yaml"
kubectl delete validatingadmissionpolicybinding fgpu-kubelet-plugin-own-node >&2
wait_until 30 "without the binding, the other node's slice is admitted" kubectl create --dry-run=server "${as_plugin[@]}" -f "$work/other.yaml"
say "ok: with the binding removed, the plugin on $NODE_NAME could write node fgpu-e2e70-other-node's slice (the attack the policy stops)"
kubectl apply -f "$work/binding.yaml" >&2
wait_until 30 "the binding back, denied again" sh -c "! kubectl create --dry-run=server ${as_plugin[*]} -f $work/other.yaml"
say "ok: binding restored, denied again"

# the Node policy: the plugin's identity, even with every right (system:masters), updates only
# the Node its token names (the device plugin's account is held the same way)
as_root_elsewhere=(--as="system:serviceaccount:$SYS_NS:fgpu-kubelet-plugin" --as-group=system:masters
  --as-user-extra="authentication.kubernetes.io/node-name=fgpu-e2e70-elsewhere")
msg="$(kubectl label node "$NODE_NAME" e2e70=x --dry-run=server "${as_root_elsewhere[@]}" 2>&1 || true)"
grep -q "ValidatingAdmissionPolicy 'fgpu-node-daemons-own-node'.*may only update its own Node" <<<"$msg" \
  || fail "a node daemon's identity updated another node's Node: $msg"
say "ok: denied: $(cut -c1-200 <<<"$msg")"
kubectl label node "$NODE_NAME" e2e70=x --dry-run=server --as="system:serviceaccount:$SYS_NS:fgpu-kubelet-plugin" --as-group=system:masters \
  --as-user-extra="authentication.kubernetes.io/node-name=$NODE_NAME" >&2 || fail "the plugin's identity may not update its own Node"
say "ok: the same update of its own Node is admitted"

# --- the claims go: no CDI spec or claim state on the node
kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >&2
wait_until 60 "the claims deleted" sh -c "! kubectl -n $E2E_NS get resourceclaims -o name | grep -q ."
wait_until 60 "the plugin unprepared every claim (no CDI spec)" sh -c "! ls /var/run/cdi/$DRIVER-claim_*.json 2>/dev/null | grep -q ."
left="$(ls -A /run/fgpu/claims 2>/dev/null; ls -A /run/fgpu/checkpoint 2>/dev/null)"
assert_eq "claim directories and checkpoint records left in /run/fgpu" "" "$left"

# --- uninstall: nothing of the release left
helm uninstall "$RELEASE" -n "$SYS_NS" --wait --timeout 120s >&2 || fail "helm uninstall failed"
wait_until 60 "the DaemonSet's pods gone" sh -c "! kubectl -n $SYS_NS get pods -l '$(sel kubelet-plugin)' -o name | grep -q ."
wait_until 60 "the driver's ResourceSlice removed" sh -c "! kubectl get resourceslice $NODE_NAME-$DRIVER"
left="$(helm_leftovers)"
assert_eq "objects of the release left after helm uninstall" "" "$left"
[ ! -e "$KUBELET_REGISTRAR_DIR/$DRIVER-reg.sock" ] || fail "registration socket left on the node"
rest="$(kubectl -n "$SYS_NS" get all,secrets,configmaps,serviceaccounts,leases -o name 2>/dev/null | grep -v -e '^configmap/kube-root-ca.crt$' -e '^serviceaccount/default$' || true)"
say "left in namespace $SYS_NS (not the chart's; goes with the namespace): ${rest:-nothing}"
kubectl delete namespace "$SYS_NS" --wait=true --timeout=60s >&2
say "ok: helm uninstall + namespace deletion leave nothing of fgpu in the cluster"
