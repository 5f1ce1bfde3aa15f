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
PLUGIN_PID=""
stop_demo_plugin() { # the plugin this demo started, by its pid
  [ -n "$PLUGIN_PID" ] || return 0
  kill -TERM "$PLUGIN_PID" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$PLUGIN_PID" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$PLUGIN_PID" 2>/dev/null || true
  PLUGIN_PID=""
  kubectl delete resourceslice "$NODE_NAME-gpu.fgpu.dev" --ignore-not-found >/dev/null 2>&1 || true
}
cleanup() {
  local rc=$?
  [ -z "$PLUGIN_PID" ] || kubectl delete pod -l app=fgpu-demo --wait=true --timeout=30s >/dev/null 2>&1 || true
  stop_demo_plugin
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
TARGET="${CARGO_TARGET_DIR:-$FGPU_CACHE/target}"
have_serve=0
if [ -x "$TARGET/debug/fgpu-kubelet-plugin" ] && "$TARGET/debug/fgpu-kubelet-plugin" --help 2>/dev/null | grep -qw serve; then have_serve=1; fi
ls "$FGPU_ROOT"/deploy/examples/gpu-*gi.yaml >/dev/null 2>&1 || missing+=("deploy/examples/: a ResourceClaimTemplate per quota")
[ -f "$TARGET/debug/libfgpu.so" ] || missing+=("hook-lib libfgpu.so (the in-container shim)")

# run_round SUFFIX WITH_CLAIM: three probe pods, one per quota; prints what each container saw.
# With a claim, the pod names deploy/examples/gpu-<q>gi.yaml's template: kube-scheduler
# allocates a share of a fake GPU, the kubelet asks fgpu's plugin to prepare it, and the
# claim's CDI spec brings libfgpu.so and the limits into the container.
run_round() {
  local suffix=$1 with_claim=$2 q claims uses pod out total alloc res
  for q in 4 8 12; do
    claims="[]" uses="[]"
    if [ "$with_claim" = 1 ]; then claims="[{name: gpu, resourceClaimTemplateName: gpu-${q}gi}]" uses="[{name: gpu}]"; fi
    kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: demo-${q}gi-${suffix}, namespace: default, labels: {app: fgpu-demo}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  resourceClaims: $claims
  containers:
  - name: probe
    image: $FGPU_WORKLOAD_IMAGE
    imagePullPolicy: Never
    command: ["/usr/local/bin/fgpu-probe", "--step-mib", "1024", "--max-gib", "$((q + 4))"]
    resources: {claims: $uses}
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
      if [ "$with_claim" = 1 ]; then
        kubectl get events --field-selector involvedObject.name="$pod" -o 'jsonpath={range .items[*]}      {.reason}: {.message}{"\n"}{end}' 2>/dev/null | tail -3
      fi
    fi
  done
}

echo "Round 1 - no fgpu: each container sees the whole fake card and nothing stops it at its quota:"
run_round plain 0
grep -q . <<<"$(kubectl logs demo-4gi-plain 2>/dev/null | grep cuda_total_mib)" || missing+=("fake CUDA driver in the workload image (tests/fake-cuda)")
kubectl delete pod -l app=fgpu-demo --wait=false >/dev/null 2>&1 || true
echo
if [ $have_serve = 1 ]; then
  echo "Round 2 - the same pods, each with a claim from deploy/examples/gpu-<q>gi.yaml; fgpu's kubelet"
  echo "plugin (fgpu-kubelet-plugin serve, fake GPUs of deploy/fake/e2e-node.yaml) prepares the claims"
  echo "and each claim's CDI spec brings libfgpu.so and the quota into the container:"
  PLUGIN_WORK="$(mktemp -d /tmp/fgpu-demo-plugin.XXXXXX)"
  kubectl apply -f "$FGPU_ROOT/deploy/deviceclasses.yaml" >/dev/null
  kubectl apply -n default -f "$FGPU_ROOT/deploy/examples/" >/dev/null
  PLUGIN_PID="$("$FGPU_ROOT/tests/e2e/30-dra-quota/plugin.sh" "$PLUGIN_WORK")"
  if wait_for 30 "the plugin registered with the kubelet" grep -q 'registered with the kubelet' "$PLUGIN_WORK/plugin.log" \
    && wait_for 30 "the plugin's ResourceSlice" kubectl get resourceslice "$NODE_NAME-gpu.fgpu.dev"; then
    # The generated claims are deleted as soon as their pods finish: watch them meanwhile.
    kubectl get resourceclaims -n default --watch -o 'custom-columns=CLAIM:.metadata.name,DEVICE:.status.allocation.devices.results[0].device,MEMORY:.status.allocation.devices.results[0].consumedCapacity.memory,SHARE:.status.allocation.devices.results[0].shareID' \
      >"$PLUGIN_WORK/claims.txt" 2>/dev/null &
    watch_pid=$!
    run_round claim 1
    kill "$watch_pid" 2>/dev/null || true
    echo "  the claims as kube-scheduler allocated them (one fake GPU, one share each):"
    { head -1 "$PLUGIN_WORK/claims.txt"; tail -n +2 "$PLUGIN_WORK/claims.txt" | grep -v '<none>' | sort -u; } | sed 's/^/    /'
    plugin_ok=1
  else
    missing+=("the kubelet plugin did not register or publish its ResourceSlice (log: $PLUGIN_WORK/plugin.log)")
  fi
  kubectl delete pod -l app=fgpu-demo --wait=true --timeout=60s >/dev/null 2>&1 || true
  stop_demo_plugin
  [ "${plugin_ok:-0}" = 0 ] || rm -rf "$PLUGIN_WORK"
else
  missing+=("fgpu-kubelet-plugin serve (not built: cargo build -p fgpu-kubelet-plugin)")
fi

banner "what is missing for the full demo"
if [ ${#missing[@]} -eq 0 ]; then echo "nothing"; else printf '  - %s\n' "${missing[@]}"; fi
