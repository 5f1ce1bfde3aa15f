#!/usr/bin/env bash
# make demo: on a fresh machine, install what is needed, build fgpu, its images and the local
# cluster, then install fgpu the way an admin does, `helm install` of deploy/helm/fgpu with
# the demo values (fake GPUs: deploy/helm/fgpu/examples/demo.yaml), and show what it does:
#   * what an admin looks at: the release, fgpu's pods, the ResourceSlices, the classes;
#   * memory: three pods sharing one fake GPU with 4, 8 and 12 GiB quotas, what each
#     container sees and what happens when it allocates past its quota;
#   * compute: two pods at 30 % and 70 % of one fake GPU's cores, competing, the split they
#     get on the node's shared fake GPU and what the node monitor measures of each claim.
# Parts that fail are named plainly at the end.
#
#   hack/demo.sh [--keep]      --keep (or FGPU_DEMO_KEEP=1): leave the cluster running
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

KEEP="${FGPU_DEMO_KEEP:-0}"
[ "${1:-}" = --keep ] && KEEP=1
K8S_VERSION="${K8S_VERSION:-$DEFAULT_K8S_VERSION}"
CARGO="${CARGO:-cargo}"
CHART="$FGPU_ROOT/deploy/helm/fgpu"
SYS_NS=fgpu-system
missing=()

banner() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
installed=0
cleanup() {
  local rc=$?
  if [ "$KEEP" = 1 ]; then
    banner "cluster left running: source _out/cluster.env; helm uninstall fgpu -n $SYS_NS; make cluster-down when done"
  else
    if [ $installed = 1 ]; then
      kubectl delete pod -l app=fgpu-demo --wait=true --timeout=60s >/dev/null 2>&1 || true
      "$(helm_bin)" uninstall fgpu -n "$SYS_NS" --wait --timeout 90s >/dev/null 2>&1 || true
    fi
    if [ -f "$CLUSTER_STATE/env" ]; then
      banner "tearing down (make demo FGPU_DEMO_KEEP=1 keeps it)"
      "$FGPU_ROOT/hack/cluster-down.sh" || true
    fi
  fi
  exit $rc
}

banner "1. build fgpu (cargo, cached in ${CARGO_TARGET_DIR:-$FGPU_CACHE/target})"
ensure_pkgs build-essential pkg-config python3 python3-yaml
if ! command -v "$CARGO" >/dev/null; then die "cargo not found: install Rust stable (rustup)"; fi
if ! $CARGO build --workspace 2>&1 | tail -5; then
  missing+=("the workspace does not build right now (see cargo output above)")
fi

banner "2. build the Kubernetes components and helm (once; cached in $FGPU_CACHE/k8s)"
"$FGPU_ROOT/hack/k8s-build.sh" "$K8S_VERSION"
HELM="$(helm_bin)"
[ -x "$HELM" ] || "$FGPU_ROOT/hack/k8s-build.sh" --tools

banner "3. fgpu's images (deploy/images/*/Dockerfile's content, packed by hack/images.sh)"
"$FGPU_ROOT/hack/images.sh" build 2>&1 | grep -E 'image holds|images hold|up to date|NOTE' || true

banner "4. start the local cluster (Kubernetes $K8S_VERSION)"
trap cleanup EXIT
"$FGPU_ROOT/hack/cluster-up.sh" "$K8S_VERSION"
# shellcheck disable=SC1091
source "$CLUSTER_STATE/env"
"$FGPU_ROOT/hack/images.sh" import >/dev/null 2>&1 || missing+=("importing fgpu's images into containerd")

banner "5. helm install fgpu (deploy/helm/fgpu, values examples/demo.yaml: fake GPUs)"
host="$(kubectl get node "$NODE_NAME" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')"
port="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}' | sed -n 's#.*:\([0-9]*\)/*$#\1#p')"
echo "(this local cluster has no kube-proxy and no CoreDNS: tests/helm/harness-postrender.py puts"
echo " fgpu's pods on the host network and calls the webhooks by URL; the chart is unchanged)"
echo "\$ helm install fgpu deploy/helm/fgpu -n $SYS_NS --create-namespace -f deploy/helm/fgpu/examples/demo.yaml --wait"
if "$HELM" install fgpu "$CHART" -n "$SYS_NS" --create-namespace -f "$CHART/examples/demo.yaml" \
    --set 'certs.extraDnsNames={127.0.0.1}' \
    --post-renderer "$FGPU_ROOT/tests/helm/harness-postrender.py" --post-renderer-args "$host" --post-renderer-args "$port" \
    --wait --wait-for-jobs --timeout 240s >/tmp/fgpu-demo-helm.log 2>&1; then
  installed=1
else
  installed=1
  tail -5 /tmp/fgpu-demo-helm.log
  missing+=("helm install did not become ready (kubectl -n $SYS_NS get pods; /tmp/fgpu-demo-helm.log)")
fi
wait_for 60 "the plugin's ResourceSlice" kubectl get resourceslice "$NODE_NAME-gpu.fgpu.dev" || missing+=("the plugin's ResourceSlice")

banner "6. what an admin looks at"
echo "\$ helm status fgpu -n $SYS_NS"; "$HELM" status fgpu -n "$SYS_NS" 2>&1 | sed -n '1,8p'
echo; echo "\$ kubectl -n $SYS_NS get pods"; kubectl -n "$SYS_NS" get pods 2>&1
echo; echo "\$ kubectl get resourceslices"; kubectl get resourceslices 2>&1
echo; echo "\$ kubectl get deviceclasses"; kubectl get deviceclasses 2>&1
echo; echo "GPUs of the slice (name, product, memory, cores, shareable):"
kubectl get resourceslice "$NODE_NAME-gpu.fgpu.dev" -o jsonpath='{range .spec.devices[*]}  {.name}  {.attributes.productName.string}  {.capacity.memory.value}  {.capacity.cores.value} cores  {.allowMultipleAllocations}{"\n"}{end}' 2>/dev/null

banner "7. memory: three pods sharing one fake GPU with 4, 8 and 12 GiB quotas"
kubectl apply -n default -f "$FGPU_ROOT/deploy/examples/" >/dev/null 2>&1 || missing+=("deploy/examples/ templates")
for q in 4 8 12; do
  kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: demo-${q}gi, namespace: default, labels: {app: fgpu-demo}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  resourceClaims: [{name: gpu, resourceClaimTemplateName: gpu-${q}gi}]
  containers:
  - name: probe
    image: $FGPU_WORKLOAD_IMAGE
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "/usr/local/bin/fgpu-probe --step-mib 1024 --max-gib $((q + 4)); exec sleep 3600"]
    resources: {claims: [{name: gpu}]}
EOF
done
for q in 4 8 12; do
  pod="demo-${q}gi"
  wait_for 120 "$pod ran its probe" sh -c "kubectl logs $pod 2>/dev/null | grep -q next_alloc_result" || true
  out="$(kubectl logs "$pod" 2>&1 || true)"
  total="$(sed -n 's/^cuda_total_mib=//p' <<<"$out")"
  alloc="$(sed -n 's/^allocated_mib=//p; s/^alloc_stopped_at_max_mib=//p' <<<"$out")"
  res="$(sed -n 's/^next_alloc_result=//p' <<<"$out")"
  if [ -n "$total" ]; then
    printf '  pod %-10s quota %2s GiB: container sees %s MiB total; allocated %s MiB%s\n' "$pod" "$q" "$total" "${alloc:-?}" \
      "${res:+, then the next 1 GiB: $res}"
  else
    echo "  pod $pod: no result: $(kubectl get events --field-selector involvedObject.name="$pod" -o jsonpath='{.items[-1:].message}' 2>/dev/null)"
    missing+=("pod $pod did not run its probe")
  fi
done
echo; echo "The pods' claims, as kube-scheduler allocated them (one fake GPU, one share each):"
kubectl get resourceclaims -n default -o 'custom-columns=CLAIM:.metadata.name,DEVICE:.status.allocation.devices.results[0].device,MEMORY:.status.allocation.devices.results[0].consumedCapacity.memory,SHARE:.status.allocation.devices.results[0].shareID' 2>&1 | sed 's/^/  /'
kubectl delete pod -l app=fgpu-demo --wait=false >/dev/null 2>&1 || true

banner "8. compute: two pods at 30 % and 70 % of one fake GPU's cores, competing"
# Two pods whose claims ask 30 and 70 cores (percent of the SMs) of the same fake GPU. The
# plugin shares the node's fake GPU state with every claim's containers (--fake-state-dir),
# so their kernels queue on one timeline, as on one real GPU; each probe launches for 9 s
# and prints its share of the GPU's time over the last 7 s. Meanwhile the node monitor
# measures each claim from the host (its metrics).
STATE_DIR=/run/fgpu-e2e/fake-state # the chart's fakeGpus.stateDir
rm -f "$STATE_DIR/demo-go"
for c in 30 70; do
  kubectl apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: gpu-cores-$c, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: shared.gpu.fgpu.dev
          capacity: {requests: {memory: 1Gi, cores: "$c"}}
          selectors:
          - cel: {expression: 'device.attributes["gpu.fgpu.dev"].index == 0'}
---
apiVersion: v1
kind: Pod
metadata: {name: demo-cores-$c, namespace: default, labels: {app: fgpu-demo}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  resourceClaims: [{name: gpu, resourceClaimTemplateName: gpu-cores-$c}]
  containers:
  - name: probe
    image: $FGPU_WORKLOAD_IMAGE
    imagePullPolicy: Never
    env: [{name: FAKE_CUDA_BLOCK_NS, value: "10000"}]
    command: ["/bin/sh", "-c", "echo waiting; until [ -e /run/fgpu-fake/demo-go ]; do sleep 0.1; done; /usr/local/bin/fgpu-probe --step-mib 256 --max-gib 0 --work-s 9 --warm-s 2; echo probe_done; exec sleep 3600"]
    resources: {claims: [{name: gpu}]}
EOF
done
ready=1
for c in 30 70; do
  wait_for 120 "demo-cores-$c started" sh -c "kubectl logs demo-cores-$c 2>/dev/null | grep -q waiting" || ready=0
done
if [ $ready = 1 ]; then
  touch "$STATE_DIR/demo-go"
  sleep 5
  echo "  the node monitor, from the host (fgpu_kubelet_plugin_claim_sm_utilization_ratio, one sample):"
  m="$(curl -s "http://127.0.0.1:9400/metrics" | grep '^fgpu_kubelet_plugin_claim_sm_utilization_ratio' || true)"
  if [ -n "$m" ]; then printf '    %s\n' "${m//$'\n'/$'\n'    }"; else missing+=("the node monitor's metrics on 127.0.0.1:9400"); fi
  for c in 30 70; do
    wait_for 60 "demo-cores-$c finished" sh -c "kubectl logs demo-cores-$c 2>/dev/null | grep -q probe_done" || true
    share="$(kubectl logs "demo-cores-$c" 2>/dev/null | sed -n 's/^work_share=//p')"
    if [ -n "$share" ]; then
      echo "  pod demo-cores-$c (claim: $c cores): ${share} % of the GPU's time"
    else
      missing+=("the core split of demo-cores-$c (kubectl logs demo-cores-$c)")
    fi
  done
else
  missing+=("the core-quota pods did not start")
fi
kubectl delete pod -l app=fgpu-demo --wait=false >/dev/null 2>&1 || true
rm -f "$STATE_DIR/demo-go"

banner "what is missing for the full demo"
if [ ${#missing[@]} -eq 0 ]; then echo "nothing"; else printf '  - %s\n' "${missing[@]}"; fi
