#!/usr/bin/env bash
# make demo: on a fresh machine, install what is needed, build fgpu and the local cluster,
# start the cluster, and show fgpu sharing one fake GPU between three pods with 4, 8 and
# 12 GiB quotas: for each pod, the GPU memory its container sees and what happens when it
# allocates past its quota. Parts that do not exist yet are named plainly.
#
#   hack/demo.sh [--keep]      --keep (or FGPU_DEMO_KEEP=1): leave the cluster running
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

KEEP="${FGPU_DEMO_KEEP:-0}"
[ "${1:-}" = --keep ] && KEEP=1
K8S_VERSION="${K8S_VERSION:-$DEFAULT_K8S_VERSION}"
CARGO="${CARGO:-cargo}"
FAKE_PROFILE="$FGPU_ROOT/deploy/fake/node-2xh100.yaml"
missing=()

banner() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
cleanup() {
  local rc=$?
  if [ "$KEEP" = 1 ]; then
    banner "cluster left running: source _out/cluster.env; make cluster-down when done"
  elif [ -f "$CLUSTER_STATE/env" ]; then
    banner "tearing down (make demo FGPU_DEMO_KEEP=1 keeps it)"
    "$FGPU_ROOT/hack/cluster-down.sh" || true
  fi
  exit $rc
}

banner "1. build fgpu (cargo, cached in ${CARGO_TARGET_DIR:-$FGPU_CACHE/target})"
ensure_pkgs build-essential pkg-config
if ! command -v "$CARGO" >/dev/null; then die "cargo not found: install Rust stable (rustup)"; fi
if ! $CARGO build --workspace 2>&1 | tail -5; then
  missing+=("the workspace does not build right now (see cargo output above)")
fi

banner "2. build the Kubernetes components (once; cached in $FGPU_CACHE/k8s)"
"$FGPU_ROOT/hack/k8s-build.sh" "$K8S_VERSION"

banner "3. start the local cluster (Kubernetes $K8S_VERSION)"
trap cleanup EXIT
"$FGPU_ROOT/hack/cluster-up.sh" "$K8S_VERSION"
# shellcheck disable=SC1091
source "$CLUSTER_STATE/env"

banner "4. the fake GPUs of this node, as fgpu's kubelet plugin discovers them"
if [ -f "$FAKE_PROFILE" ] && $CARGO run -q -p fgpu-kubelet-plugin -- discover --backend fake --fake-gpus "$FAKE_PROFILE" 2>/tmp/fgpu-demo-discover.err; then
  :
else
  echo "(not available yet: $(tail -1 /tmp/fgpu-demo-discover.err 2>/dev/null || echo "$FAKE_PROFILE missing"))"
  missing+=("fgpu-kubelet-plugin discover --backend fake (kubelet-plugin issue)")
fi

banner "5. DRA on the real control plane: scheduler allocates a claim from a published ResourceSlice"
FGPU_E2E_REUSE=1 "$FGPU_ROOT/hack/e2e.sh" "$K8S_VERSION" '10-*' 2>&1 | grep -E 'ok:|FAIL|PASS|SKIP|passed' || true

banner "6. three pods sharing one fake GPU with 4, 8 and 12 GiB quotas"
have_serve=0
if $CARGO run -q -p fgpu-kubelet-plugin -- --help 2>/dev/null | grep -qw serve; then have_serve=1; fi
[ $have_serve = 1 ] || missing+=("DRA kubelet plugin 'serve' (registration + NodePrepareResources + CDI specs): the quota was injected by hand above, not by a claim")
ls "$FGPU_ROOT"/deploy/examples/*.yaml >/dev/null 2>&1 || missing+=("deploy/examples/: a ResourceClaimTemplate per quota")
[ -f "${CARGO_TARGET_DIR:-$FGPU_CACHE/target}/debug/libfgpu.so" ] || [ -f "${CARGO_TARGET_DIR:-$FGPU_CACHE/target}/release/libfgpu.so" ] \
  || missing+=("hook-lib libfgpu.so (the in-container shim)")

# run_round SUFFIX WITH_SHIM: three probe pods, one per quota; prints what each container saw.
run_round() {
  local suffix=$1 with_shim=$2 q env pod out total alloc res
  for q in 4 8 12; do
    if [ "$with_shim" = 1 ]; then
      env="[{name: LD_PRELOAD, value: /usr/lib/fgpu/libfgpu.so}, {name: FGPU_MEMORY_LIMIT, value: ${q}Gi}]"
    else
      env="[{name: FGPU_DEMO_QUOTA_GIB, value: \"$q\"}]"
    fi
    kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: demo-${q}gi-${suffix}, namespace: default, labels: {app: fgpu-demo}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: probe
    image: $FGPU_WORKLOAD_IMAGE
    imagePullPolicy: Never
    env: $env
    command: ["/usr/local/bin/fgpu-probe", "--step-mib", "1024", "--max-gib", "$((q + 4))"]
EOF
  done
  for q in 4 8 12; do
    pod="demo-${q}gi-${suffix}"
    wait_for 120 "$pod finished" sh -c "kubectl get pod $pod -o jsonpath='{.status.phase}' | grep -qE 'Succeeded|Failed'" || true
    out="$(kubectl logs "$pod" 2>&1 || true)"
    total="$(sed -n 's/^cuda_total_mib=//p' <<<"$out")"
    alloc="$(sed -n 's/^allocated_mib=//p; s/^alloc_stopped_at_max_mib=//p' <<<"$out")"
    res="$(sed -n 's/^next_alloc_result=//p' <<<"$out")"
    if [ -n "$total" ]; then
      printf '  pod %-14s quota %2s GiB: container sees %s MiB total; allocated %s MiB%s\n' "$pod" "$q" "$total" "${alloc:-?}" \
        "${res:+, then the next 1 GiB: $res}"
      [ -n "$res" ] || echo "      -> allocating past the ${q} GiB quota SUCCEEDED: nothing enforces it in this round"
    else
      echo "  pod $pod: the probe could not use CUDA: $(grep -E 'error|unavailable|cu[A-Z]' <<<"$out" | head -3 | tr '\n' ' ')"
    fi
  done
}

echo "Round 1 - no fgpu: each container sees the whole fake card and nothing stops it at its quota:"
run_round plain 0
grep -q . <<<"$(kubectl logs demo-4gi-plain 2>/dev/null | grep cuda_total_mib)" || missing+=("fake CUDA driver in the workload image (tests/fake-cuda)")
echo
echo "Round 2 - the same pods with libfgpu.so and FGPU_MEMORY_LIMIT set BY HAND in the pod spec"
echo "(the kubelet plugin is to inject exactly this through each claim's CDI spec):"
run_round shim 1
kubectl delete pod -l app=fgpu-demo --wait=false >/dev/null 2>&1 || true

banner "what is missing for the full demo"
if [ ${#missing[@]} -eq 0 ]; then echo "nothing"; else printf '  - %s\n' "${missing[@]}"; fi
