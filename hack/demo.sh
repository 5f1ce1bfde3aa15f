#!/usr/bin/env bash
# make demo: on a fresh machine, install what is needed, build fgpu, its images and the local
# cluster, then install fgpu the way an admin does, `helm install` of deploy/helm/fgpu with
# the demo values (fake GPUs: deploy/helm/fgpu/examples/demo.yaml), and show what it does:
#   * what an admin looks at: the release, fgpu's pods, the ResourceSlices, the classes;
#   * memory: three pods sharing one fake GPU with 4, 8 and 12 GiB quotas, what each
#     container sees and what happens when it allocates past its quota;
#   * compute: two processes at 30 % and 70 % of one fake GPU's cores, competing, and the
#     split they get on the fake's shared timeline (with libfgpu.so, on this host).
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

banner "8. compute: 30 % and 70 % of one fake GPU's cores, competing"
# The shim's core limiter, as hook-lib/tests/run.sh measures it: two processes with
# libfgpu.so on one GPU of the fake driver's shared timeline (GPU time, kernels of 40 blocks
# x 10 us), their share over 5 s after 2 s of warm-up. On this host: in pods the two
# containers would need the fake's timeline file shared between them, which the demo
# profile does not set up.
TARGET="${CARGO_TARGET_DIR:-$FGPU_CACHE/target}"
if make -s -C "$FGPU_ROOT" hook-build >/tmp/fgpu-demo-hook.log 2>&1; then
  w="$(mktemp -d /tmp/fgpu-demo-core.XXXXXX)"; mkdir -p "$w/a" "$w/b"
  run_core() { env FAKE_CUDA_GPUS=1 FAKE_CUDA_STATE="$w/gpu" FAKE_CUDA_BLOCK_NS=10000 LD_LIBRARY_PATH="$TARGET/debug/fake-cuda" \
    LD_PRELOAD="$TARGET/debug/libfgpu.so" HT_DEV=0 FGPU_CORE_LIMIT="$1" FGPU_STATE_DIR="$2" "$TARGET/debug/fgpu-hook-test/hooktest" work 7 2; }
  run_core 30 "$w/a" >"$w/a.out" 2>&1 & pa=$!
  run_core 70 "$w/b" >"$w/b.out" 2>&1 & pb=$!
  wait "$pa" "$pb" || true
  sa="$(sed -n 's/.*share=\([0-9.]*\).*/\1/p' "$w/a.out")"; sb="$(sed -n 's/.*share=\([0-9.]*\).*/\1/p' "$w/b.out")"
  if [ -n "$sa" ] && [ -n "$sb" ]; then
    echo "  process at FGPU_CORE_LIMIT=30: ${sa} % of the GPU's time"
    echo "  process at FGPU_CORE_LIMIT=70: ${sb} % of the GPU's time"
  else
    missing+=("the core split (outputs in $w)")
  fi
  [ ${#missing[@]} -gt 0 ] || rm -rf "$w"
else
  missing+=("make hook-build (see /tmp/fgpu-demo-hook.log)")
fi

banner "what is missing for the full demo"
if [ ${#missing[@]} -eq 0 ]; then echo "nothing"; else printf '  - %s\n' "${missing[@]}"; fi
