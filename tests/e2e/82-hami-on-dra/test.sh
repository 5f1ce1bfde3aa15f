#!/usr/bin/env bash
# Scenario: HAMi's pod manifests on a DRA cluster with no legacy path (issue 24): the chart
# in controller mode with controller.hamiPods.enabled (the /mutate-pods-dra webhook) and
# wholeGpuExtendedResourceName=nvidia.com/gpu (the whole-GPU DeviceClass answers that name).
# The pods carry HAMi's resources and annotations as HAMi documents them; only the image and
# command are this harness's (fgpu-probe reports what CUDA shows and where allocation stops).
#
# Asserted: HAMi's README pod (gpu 1, gpumem 3000, gpucores 30) is rewritten to a claim of the
# shared class and sees 3000 MiB, allocation past it refused; an identical pod reuses its
# template (one per namespace); gpumem-percentage 50 sees half the card (40779 of 81559 MiB,
# through firstAvailable); use-gputype A100 waits (no such card) while H100 runs; numa-bind
# over two GPUs on two NUMA nodes waits while the same pod without it runs on both; gpumem
# beside gpumem-percentage is refused naming the field; a server dry run answers the patch
# and creates no template; a pod the webhook leaves alone (its opt-out label) asking only
# nvidia.com/gpu gets a whole GPU through extendedResourceName; then in capacity mode
# (helm upgrade) the README pod again sees 3000 MiB with kube-scheduler placing the share.
# e2e-timeout: 600
source "$(dirname "$0")/../lib.sh"
api="$(dra_api_version)"
[ "$K8S_MINOR" -ge 37 ] || skip "Kubernetes $K8S_VERSION: extendedResourceName is GA from 1.37 (alpha/beta before)"
source "$E2E_DIR/../helm-lib.sh"
owned=0 state_created=0 run_created=0 devdir_created=0
cleanup() {
  local rc=$?
  helm_diagnostics "$rc"
  helm_cleanup
  kubectl -n "$E2E_NS" delete resourceclaimtemplates --all --wait=false >/dev/null 2>&1 || true
  exit "$rc"
}
trap cleanup EXIT
helm_preconditions
owned=1
helm_images
helm_setup

# shellcheck disable=SC2119 # (helm_install takes extra helm arguments)
helm_install --set mode=controller --set controller.hamiPods.enabled=true \
  --set wholeGpuExtendedResourceName=nvidia.com/gpu
certs_checks mutatingwebhookconfiguration/fgpu-hami-pods
assert_eq "whole class extendedResourceName" nvidia.com/gpu \
  "$(kubectl get "deviceclasses.$api.resource.k8s.io" "$DRIVER" -o jsonpath='{.spec.extendedResourceName}')"
ctl="$(pod_of controller)"
wait_until 60 "Lease held by $ctl" sh -c "kubectl -n $SYS_NS get lease fgpu-controller -o jsonpath='{.spec.holderIdentity}' | grep -q '^${ctl}_'"

# hami_pod <name> <limits (flow map body)> [<annotations (flow map body)>] [<labels>] [<probe args>]
hami_pod() {
  local name="$1" limits="$2" ann="${3:-}" labels="${4:-}" probe="${5:---step-mib 1024 --max-gib 16}"
  cat <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $name
  namespace: $E2E_NS
  annotations: {$ann}
  labels: {$labels}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: ubuntu-container
    image: $FGPU_WORKLOAD_IMAGE
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "/usr/local/bin/fgpu-probe $probe; echo probe_done; exec sleep 3600"]
    resources:
      limits: {$limits}
YAML
}
field() { kubectl -n "$E2E_NS" logs "$1" | sed -n "s/^$2=//p"; }
probed() { wait_until "${2:-120}" "pod $1 ran its probe" sh -c "kubectl -n $E2E_NS logs $1 2>/dev/null | grep -q probe_done"; }
template_of() { jp "pod/$1" '{.spec.resourceClaims[?(@.name=="fgpu-hami")].resourceClaimTemplateName}'; }
claim_of() { echo "resourceclaims.$api.resource.k8s.io/$(jp "pod/$1" '{.status.resourceClaimStatuses[0].resourceClaimName}')"; }
README='nvidia.com/gpu: 1, nvidia.com/gpumem: 3000, nvidia.com/gpucores: 30'

# --- HAMi's README pod, twice
t0=$SECONDS
hami_pod gpu-pod "$README" | kubectl apply -f - >&2
hami_pod gpu-pod-2 "$README" | kubectl apply -f - >&2
probed gpu-pod; probed gpu-pod-2
say "ok: two README pods ran their probes $((SECONDS - t0)) s after creation"
tmpl="$(template_of gpu-pod)"
[[ "$tmpl" =~ ^hami-[0-9a-f]{12}$ ]] || fail "gpu-pod: no template hami-<hash> in spec.resourceClaims: '$tmpl'"
assert_eq "gpu-pod: limits left in the container" "" "$(jp pod/gpu-pod '{.spec.containers[0].resources.limits}')"
assert_eq "gpu-pod: container claim" "fgpu-hami/ubuntu-container" \
  "$(jp pod/gpu-pod '{.spec.containers[0].resources.claims[0].name}/{.spec.containers[0].resources.claims[0].request}')"
assert_eq "gpu-pod-2: the same template" "$tmpl" "$(template_of gpu-pod-2)"
assert_eq "templates in the namespace" 1 "$(kubectl -n "$E2E_NS" get resourceclaimtemplates -o name | wc -l)"
assert_eq "template class" "shared.$DRIVER" \
  "$(jp "resourceclaimtemplates.$api.resource.k8s.io/$tmpl" '{.spec.spec.devices.requests[0].exactly.deviceClassName}')"
for p in gpu-pod gpu-pod-2; do
  c="$(claim_of "$p")"
  assert_eq "$p: allocated by the controller" "$DRIVER/allocation" "$(jp "$c" '{.metadata.finalizers[*]}')"
  assert_eq "$p: cuMemGetInfo total (MiB)" 3000 "$(field "$p" cuda_total_mib)"
  assert_eq "$p: allocation past the quota" "CUDA_ERROR_OUT_OF_MEMORY (2)" "$(field "$p" next_alloc_result)"
done
grant="$(jp "$(claim_of gpu-pod)" '{.status.allocation.devices.config[*].opaque.parameters}')"
grep -q '"cores":30' <<<"$grant" || fail "gpu-pod: the grant does not carry cores 30: $grant"
say "ok: grant $grant"

# --- gpumem-percentage 50 of an 81559 MiB card
hami_pod pct-pod 'nvidia.com/gpu: 1, nvidia.com/gpumem-percentage: 50' "" "" "--step-mib 4096 --max-gib 48" | kubectl apply -f - >&2
probed pct-pod
say "pct-pod: claim results $(jp "$(claim_of pct-pod)" '{.status.allocation.devices.results}') config $(jp "$(claim_of pct-pod)" '{.status.allocation.devices.config}')"
assert_eq "pct-pod: cuMemGetInfo total (MiB)" 40779 "$(field pct-pod cuda_total_mib)"
assert_eq "pct-pod: template alternatives (firstAvailable)" 1 \
  "$(jp "resourceclaimtemplates.$api.resource.k8s.io/$(template_of pct-pod)" '{.spec.spec.devices.requests[0].firstAvailable[*].name}' | wc -w)"

# --- model selectors: A100 waits, H100 runs
hami_pod type-a100 'nvidia.com/gpu: 1, nvidia.com/gpumem: 1000' 'nvidia.com/use-gputype: "A100"' | kubectl apply -f - >&2
hami_pod type-h100 'nvidia.com/gpu: 1, nvidia.com/gpumem: 1000' 'nvidia.com/use-gputype: "H100"' | kubectl apply -f - >&2
probed type-h100
sleep 10
assert_eq "type-a100: phase (no A100 on the node)" Pending "$(jp pod/type-a100 '{.status.phase}')"
assert_eq "type-a100: claim allocation" "" "$(jp "$(claim_of type-a100)" '{.status.allocation}')"

# --- numa-bind: two GPUs on NUMA nodes 0 and 1 cannot be bound; without it they can
hami_pod numa-2 'nvidia.com/gpu: 2, nvidia.com/gpumem: 1000' 'nvidia.com/numa-bind: "true"' | kubectl apply -f - >&2
hami_pod two-gpu 'nvidia.com/gpu: 2, nvidia.com/gpumem: 1000' | kubectl apply -f - >&2
probed two-gpu
assert_eq "two-gpu: devices" "gpu-0 gpu-1" \
  "$(jp "$(claim_of two-gpu)" '{.status.allocation.devices.results[*].device}' | tr ' ' '\n' | sort | xargs)"
sleep 5
assert_eq "numa-2: phase (numa-bind over two NUMA nodes)" Pending "$(jp pod/numa-2 '{.status.phase}')"
assert_eq "numa-2: claim allocation" "" "$(jp "$(claim_of numa-2)" '{.status.allocation}')"

# --- refusals name the field; a dry run creates nothing
msg="$(hami_pod both 'nvidia.com/gpu: 1, nvidia.com/gpumem: 1000, nvidia.com/gpumem-percentage: 10' | kubectl create -f - 2>&1 || true)"
if ! grep -q 'gpumem-percentage' <<<"$msg" || ! grep -q 'ubuntu-container' <<<"$msg"; then
  fail "gpumem beside gpumem-percentage was not refused naming the field and container: $msg"
fi
say "ok: refused: $(cut -c1-200 <<<"$msg")"
before="$(kubectl -n "$E2E_NS" get resourceclaimtemplates -o name | sort)"
dry="$(hami_pod dry 'nvidia.com/gpu: 1, nvidia.com/gpumem: 1234' | kubectl create --dry-run=server -o jsonpath='{.spec.resourceClaims[0].resourceClaimTemplateName}' -f - 2>&1)"
[[ "$dry" =~ ^hami-[0-9a-f]{12}$ ]] || fail "dry run: no patched template name: $dry"
assert_eq "templates after a dry run (none created)" "$before" "$(kubectl -n "$E2E_NS" get resourceclaimtemplates -o name | sort)"
kubectl -n "$E2E_NS" get "resourceclaimtemplates.$api.resource.k8s.io/$dry" >/dev/null 2>&1 && fail "dry run created template $dry"
say "ok: dry run answered $dry and created nothing"

# --- extendedResourceName: a pod the webhook leaves alone gets a whole GPU through DRA
kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >&2
wait_until 90 "the shares released" sh -c "[ -z \"\$(kubectl -n $E2E_NS get resourceclaims -o name)\" ]"
hami_pod whole 'nvidia.com/gpu: 1' "" 'gpu.fgpu.dev/webhook: disabled' "--step-mib 8192 --max-gib 96" | kubectl apply -f - >&2
probed whole
assert_eq "whole: limits kept (not rewritten)" 1 "$(jp pod/whole '{.spec.containers[0].resources.limits.nvidia\.com/gpu}')"
ext="$(jp pod/whole '{.status.extendedResourceClaimStatus.resourceClaimName}')"
[ -n "$ext" ] || fail "whole: no status.extendedResourceClaimStatus (kube-scheduler did not use extendedResourceName)"
assert_eq "whole: the claim's class" "$DRIVER" \
  "$(jp "resourceclaims.$api.resource.k8s.io/$ext" '{.spec.devices.requests[0].exactly.deviceClassName}')"
# a share of a multi-allocatable device, as kube-scheduler gives every one, holding all of it
assert_eq "whole: memory consumed (the card's whole memory, the class's default)" 81559Mi \
  "$(jp "resourceclaims.$api.resource.k8s.io/$ext" '{.status.allocation.devices.results[0].consumedCapacity.memory}')"
assert_eq "whole: cuMemGetInfo total (MiB)" 81559 "$(field whole cuda_total_mib)"
kubectl -n "$E2E_NS" delete pod whole --wait=true --timeout=60s >&2

# --- capacity mode: kube-scheduler places the README pod's share
helm upgrade "$RELEASE" "$CHART" "${HELM_ARGS[@]}" --set mode=capacity --set controller.hamiPods.enabled=true \
  --set wholeGpuExtendedResourceName=nvidia.com/gpu --wait --timeout 180s >&2 || fail "helm upgrade to capacity mode failed"
kubectl -n "$SYS_NS" rollout status deployment/fgpu-controller --timeout=120s >&2
hami_pod cap-pod "$README" | kubectl apply -f - >&2
probed cap-pod
assert_eq "cap-pod: cuMemGetInfo total (MiB)" 3000 "$(field cap-pod cuda_total_mib)"
c="$(claim_of cap-pod)"
assert_eq "cap-pod: consumed memory (kube-scheduler)" 3000Mi "$(jp "$c" '{.status.allocation.devices.results[0].consumedCapacity.memory}')"
[ "$(template_of cap-pod)" != "$tmpl" ] || fail "capacity mode reused the controller-mode template $tmpl (it must carry capacity requests)"
say "ok: HAMi pods on DRA through the webhook and extendedResourceName on Kubernetes $K8S_VERSION"
