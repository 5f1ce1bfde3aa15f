#!/usr/bin/env bash
# Scenario: fgpu's DRA kubelet plugin as a DaemonSet pod (deploy/kubelet-plugin/), with its
# least-privilege RBAC, on every release with DRA (1.32+; skipped below). Unlike 30/31, where
# the plugin is a host process with the admin's kubeconfig, here it runs in a container from
# the image fgpu.local/kubelet-plugin-fake:dev (hack/images.sh: the node image + fake CUDA) with the ServiceAccount token of
# deploy/kubelet-plugin/rbac.yaml, so a missing right or a wrong mount shows.
#
# The DaemonSet is deploy/kubelet-plugin/daemonset.yaml with harness-patch.yaml merged in
# (`kubectl patch --local`, strategic merge): fake backend and profile from the image, the
# local image, hostNetwork + KUBERNETES_SERVICE_HOST/PORT = the API server's host address
# (HARNESS ONLY: no kube-proxy, no CoreDNS here), no capabilities at all.
#
# Asserted: the pod becomes Ready; the kubelet registers the plugin and the ResourceSlice
# appears only once the pod runs, and the pod's log says it published it; the slice's driver,
# pool, devices; its claim cache synced (list/watch of claims allowed); the pod's log has no
# "forbidden"; /healthz on the metrics port; a whole-GPU
# claim of gpu.fgpu.dev is prepared by the pod (its log names the claim and the DRA gRPC
# version) and the workload container sees the whole fake GPU with the shim; RBAC allows what
# the plugin does and refuses what it must not (claims' status, secrets, deleting slices,
# listing anything but claims, other namespaces' events); deleting the pod unprepares (CDI spec gone); deleting
# the DaemonSet removes the registration socket. Clean-up removes the DaemonSet, the RBAC
# objects, the namespace (when this test created it), the slice, the classes and the host's
# /var/lib/fgpu and /run/fgpu (each when this test created it).
source "$(dirname "$0")/../lib.sh"
api="$(dra_api_version)"
[ "$api" != none ] || skip "Kubernetes $K8S_VERSION: no usable DRA before 1.32"
root="$(cd "$E2E_DIR/../../.." && pwd)"
DRIVER=gpu.fgpu.dev
SLICE="$NODE_NAME-$DRIVER"
SYS_NS=fgpu-system
SA="system:serviceaccount:$SYS_NS:fgpu-kubelet-plugin"
SEL=app.kubernetes.io/component=kubelet-plugin
METRICS_PORT="${FGPU_E2E_DS_METRICS_PORT:-19433}"
REG_SOCK="$KUBELET_REGISTRAR_DIR/$DRIVER-reg.sock"
STATE=/var/lib/fgpu   # the DaemonSet's state dir on the host (the real default)
RUN=/run/fgpu         # its run dir: checkpoint and claim directories (the real default)
CDI=/var/run/cdi      # its CDI spec dir (the real default; containerd reads it)
plugin_pod() { kubectl -n "$SYS_NS" get pods -l "$SEL" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null; }
plugin_log() { kubectl -n "$SYS_NS" logs -l "$SEL" -c plugin --tail=-1 2>/dev/null || true; }
# grep the plugin pod's log (from a file: no SIGPIPE under pipefail)
plog="$(mktemp /tmp/fgpu-e2e-33-log.XXXXXX)"
plugin_grep() { plugin_log | sed 's/\x1b\[[0-9;]*m//g' >"$plog"; grep "$@" "$plog" || true; }

owned=0 ns_created=0 state_created=0 run_created=0 devdir_created=0 rendered=""
cleanup() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    say "plugin pod (last 40 log lines):"; plugin_log | tail -40 | sed 's/^/      /' >&2 || true
    kubectl -n "$SYS_NS" describe pods -l "$SEL" 2>/dev/null | tail -30 | sed 's/^/      /' >&2 || true
  fi
  # Workload pods first, while the plugin still serves NodeUnprepareResources.
  kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl -n "$E2E_NS" delete resourceclaims --all --wait=true --timeout=30s >/dev/null 2>&1 || true
  rm -f "$plog"
  # The rest only when the preconditions held (else it is someone else's plugin).
  [ $owned = 1 ] || exit "$rc"
  kubectl -n "$SYS_NS" delete daemonset fgpu-kubelet-plugin --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl -n "$SYS_NS" wait --for=delete pod -l "$SEL" --timeout=60s >/dev/null 2>&1 || true
  kubectl delete resourceslice "$SLICE" --ignore-not-found >/dev/null 2>&1 || true
  kubectl delete clusterrolebinding/fgpu-kubelet-plugin clusterrole/fgpu-kubelet-plugin --ignore-not-found >/dev/null 2>&1 || true
  kubectl -n default delete rolebinding/fgpu-kubelet-plugin-events role/fgpu-kubelet-plugin-events --ignore-not-found >/dev/null 2>&1 || true
  kubectl -n "$SYS_NS" delete serviceaccount fgpu-kubelet-plugin --ignore-not-found >/dev/null 2>&1 || true
  [ $ns_created = 0 ] || kubectl delete namespace "$SYS_NS" --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
  classes | kubectl delete -f - --ignore-not-found >/dev/null 2>&1 || true
  # What a killed pod could leave on the host: its sockets (only ours: the driver's names).
  rm -f "$REG_SOCK" "$KUBELET_PLUGINS_DIR/$DRIVER/dra.sock"
  rmdir "$KUBELET_PLUGINS_DIR/$DRIVER" 2>/dev/null || true
  [ $state_created = 0 ] || rm -rf "$STATE"
  [ $run_created = 0 ] || rm -rf "$RUN"
  [ $devdir_created = 0 ] || rm -rf /run/fgpu-e2e
  [ -z "$rendered" ] || rm -f "$rendered"
  exit "$rc"
}
trap cleanup EXIT

# --- preconditions: nothing of the driver's on the node yet
[ ! -e "$REG_SOCK" ] || fail "$REG_SOCK exists: another gpu.fgpu.dev plugin is running on this node"
if kubectl get "resourceslices.$api.resource.k8s.io" "$SLICE" >/dev/null 2>&1; then
  fail "ResourceSlice $SLICE exists before the DaemonSet runs (a previous scenario left it)"
fi
kubectl get namespace "$SYS_NS" >/dev/null 2>&1 || ns_created=1
[ -e "$STATE" ] || state_created=1
[ -e "$RUN" ] || run_created=1
if ss -Hltn "sport = :$METRICS_PORT" 2>/dev/null | grep -q .; then fail "port $METRICS_PORT is in use (set FGPU_E2E_DS_METRICS_PORT)"; fi
owned=1

# --- the image: this checkout's plugin (a no-op build when up to date), packed and imported
(cd "$root" && cargo build -q -p fgpu-kubelet-plugin --bin fgpu-kubelet-plugin) >&2 \
  || fail "cargo build -p fgpu-kubelet-plugin failed"
out="$("$root/hack/images.sh" plugin 2>&1)" || { tail -5 <<<"$out" >&2; fail "hack/images.sh plugin failed"; }
tail -3 <<<"$out" | sed 's/^/      /' >&2

# The fake GPUs' device nodes (the profile's deviceRoot), as tests/e2e/30-dra-quota/plugin.sh makes them.
[ -d /run/fgpu-e2e ] || devdir_created=1
mkdir -p /run/fgpu-e2e/dev
for n in nvidia0 nvidia1 nvidiactl nvidia-uvm nvidia-uvm-tools; do
  [ -c "/run/fgpu-e2e/dev/$n" ] || mknod -m 0666 "/run/fgpu-e2e/dev/$n" c 1 3
done

# --- RBAC + DaemonSet
kubectl apply -f "$root/deploy/kubelet-plugin/rbac.yaml" >&2
apiserver_host="$(kubectl get node "$NODE_NAME" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')"
apiserver_port="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}' | sed -n 's#.*:\([0-9]*\)/*$#\1#p')"
{ [ -n "$apiserver_host" ] && [ -n "$apiserver_port" ]; } || fail "cannot tell the API server's host address ($apiserver_host:$apiserver_port)"
say "harness override: KUBERNETES_SERVICE_HOST=$apiserver_host KUBERNETES_SERVICE_PORT=$apiserver_port (hostNetwork)"
rendered="$(mktemp /tmp/fgpu-e2e-33-patch.XXXXXX)"
sed -e "s#__NODE_NAME__#$NODE_NAME#g" -e "s#__APISERVER_HOST__#$apiserver_host#g" \
    -e "s#__APISERVER_PORT__#$apiserver_port#g" -e "s#__METRICS_PORT__#$METRICS_PORT#g" \
    "$E2E_DIR/harness-patch.yaml" >"$rendered"
ds="$(kubectl patch --local -f "$root/deploy/kubelet-plugin/daemonset.yaml" --type=strategic --patch-file "$rendered" -o yaml)" \
  || fail "rendering the DaemonSet"
{ grep -q 'image: fgpu.local/kubelet-plugin-fake:dev' <<<"$ds" && ! grep -q 'fgpu/kubelet-plugin:0.1.0' <<<"$ds"; } \
  || fail "the rendered DaemonSet still names the placeholder image"
classes | kubectl apply -f - >&2
kubectl apply -f - <<<"$ds" >&2
kubectl -n "$SYS_NS" rollout status daemonset/fgpu-kubelet-plugin --timeout=120s >&2 \
  || fail "DaemonSet fgpu-kubelet-plugin did not roll out"
wait_until 60 "plugin pod Ready" sh -c "kubectl -n $SYS_NS get pods -l $SEL -o jsonpath='{.items[0].status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
pod="$(plugin_pod)"
say "ok: pod $SYS_NS/$pod Ready on $(kubectl -n "$SYS_NS" get pod "$pod" -o jsonpath='{.spec.nodeName}') as $(kubectl -n "$SYS_NS" get pod "$pod" -o jsonpath='{.spec.serviceAccountName}')"
assert_eq "plugin container capabilities dropped / privileged" "[\"ALL\"]/false" \
  "$(kubectl -n "$SYS_NS" get pod "$pod" -o jsonpath='{.spec.containers[0].securityContext.capabilities.drop}/{.spec.containers[0].securityContext.privileged}')"

# --- registration and the slice, by the pod
wait_until 60 "the pod registered with the kubelet" sh -c "kubectl -n $SYS_NS logs $pod -c plugin | grep -q 'registered with the kubelet'"
[ -S "$REG_SOCK" ] || fail "no registration socket $REG_SOCK on the host"
say "ok: the kubelet registered the pod's plugin ($REG_SOCK)"
wait_until 60 "ResourceSlice $SLICE published" kubectl get "resourceslices.$api.resource.k8s.io" "$SLICE"
wait_until 30 "the pod logged the publication" sh -c "kubectl -n $SYS_NS logs $pod -c plugin | grep -q 'published the ResourceSlice'"
pub="$(plugin_grep -m1 'published the ResourceSlice')"
say "ok: published by the pod: ${pub:0:200}"
s="resourceslices.$api.resource.k8s.io/$SLICE"
assert_eq "slice driver/pool/node" "$DRIVER/$NODE_NAME/$NODE_NAME" "$(jp "$s" '{.spec.driver}/{.spec.pool.name}/{.spec.nodeName}' "")"
assert_eq "slice devices" "gpu-0 gpu-1" "$(jp "$s" '{.spec.devices[*].name}' "")"
assert_eq "slice owner" "Node/$NODE_NAME" "$(jp "$s" '{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}' "")"
wait_until 60 "the pod's claim cache listed the claims (list + watch allowed)" \
  sh -c "kubectl -n $SYS_NS logs $pod -c plugin | grep -q 'claim cache synced'"
say "ok: claim cache synced (list/watch on resourceclaims with the ServiceAccount)"
v_line="$(plugin_grep -m1 'using resource.k8s.io version')"
[ -n "$v_line" ] || fail "the pod did not log the negotiated resource.k8s.io version"
say "ok: ${v_line:0:200}"
wait_until 30 "/healthz on the metrics port" curl -fsS "http://127.0.0.1:$METRICS_PORT/healthz"
say "ok: /healthz on :$METRICS_PORT (liveness probe target)"

# --- one whole-GPU claim, prepared by the pod
mem_mi="$(sed -n 's/^ *memory: *\([0-9]*\)Mi$/\1/p' "$root/deploy/fake/e2e-node.yaml" | head -1)"
whole_gpu_probe whole 4096
wait_until 120 "pod whole ran its probe" sh -c "kubectl -n $E2E_NS logs whole 2>/dev/null | grep -q probe_done"
kubectl -n "$E2E_NS" logs whole | sed 's/^/      whole: /' >&2
field() { kubectl -n "$E2E_NS" logs whole | sed -n "s/^$1=//p"; }
c="resourceclaims.$api.resource.k8s.io/whole"
uid="$(jp "$c" '{.metadata.uid}')"
assert_eq "claim driver/pool" "$DRIVER/$NODE_NAME" "$(jp "$c" '{.status.allocation.devices.results[0].driver}/{.status.allocation.devices.results[0].pool}')"
assert_eq "whole preload (from the pod-written CDI spec)" /usr/lib/fgpu/libfgpu.so "$(field ld_so_preload)"
assert_eq "whole cuMemGetInfo total (MiB)" "$mem_mi" "$(field cuda_total_mib)"
assert_eq "whole NVML total (MiB)" "$mem_mi" "$(field nvml_total_mib)"
line="$(plugin_grep 'prepared claim' | grep "$uid" | head -1 || true)"
[ -n "$line" ] || fail "the plugin pod's log has no 'prepared claim' for $uid"
want_grpc=v1; [ "$K8S_MINOR" -ge 34 ] || want_grpc=v1beta1
assert_eq "DRA gRPC of the kubelet's prepare (pod log)" "$want_grpc" \
  "$(sed -n 's/.*"grpc":"\([a-z0-9]*\)".*/\1/p; s/.*grpc="\{0,1\}\([a-z0-9]*\).*/\1/p' <<<"$line" | head -1)"
spec="$CDI/$DRIVER-claim_$uid.json"
[ -f "$spec" ] || fail "no CDI spec $spec on the host"
[ -d "$RUN/claims/$uid" ] || fail "no claim directory $RUN/claims/$uid on the host"
say "ok: the pod wrote $spec and $RUN/claims/$uid on the host"
# The node image carries only the applets install.sh needs (no sed): read there, parse here.
rss="$(kubectl -n "$SYS_NS" exec "$pod" -c plugin -- cat /proc/1/status | sed -n 's/^VmRSS:[[:space:]]*//p')"
say "plugin RSS: $rss (memory limit $(kubectl -n "$SYS_NS" get pod "$pod" -o jsonpath='{.spec.containers[0].resources.limits.memory}'))"

# --- least privilege: the plugin did its work without a refusal, and RBAC refuses the rest
forbidden="$(plugin_grep -i forbidden)"
if [ -n "$forbidden" ]; then
  head -5 <<<"$forbidden" | sed 's/^/      /' >&2
  fail "the plugin pod's log shows a forbidden API call"
fi
can() { kubectl auth can-i --as="$SA" "$@" 2>/dev/null || true; }
for a in "get resourceclaims.resource.k8s.io -n $E2E_NS" "list resourceclaims.resource.k8s.io -A" \
         "watch resourceclaims.resource.k8s.io -A" "get resourceslices.resource.k8s.io" \
         "create resourceslices.resource.k8s.io" "update resourceslices.resource.k8s.io" \
         "get nodes" "create events -n default" \
         "patch resourceclaims.resource.k8s.io --subresource=status -n $E2E_NS" \
         "associated-node:patch resourceclaims.resource.k8s.io/gpu.fgpu.dev --subresource=driver -n $E2E_NS"; do
  # shellcheck disable=SC2086 # word-split on purpose
  assert_eq "can-i $a" yes "$(can $a)"
done
# (status: patch only, for the node monitor's status.devices; never update, never the claim.)
for a in "update resourceclaims.resource.k8s.io --subresource=status -n $E2E_NS" \
         "associated-node:patch resourceclaims.resource.k8s.io/other.dev --subresource=driver -n $E2E_NS" \
         "update resourceclaims.resource.k8s.io -n $E2E_NS" "delete resourceclaims.resource.k8s.io -n $E2E_NS" \
         "delete resourceslices.resource.k8s.io" "list resourceslices.resource.k8s.io" \
         "list secrets -A" "get secrets -n $SYS_NS" "patch nodes" "create pods -n $E2E_NS" \
         "create events -n kube-system" "update deviceclasses.resource.k8s.io"; do
  # shellcheck disable=SC2086
  assert_eq "can-i $a" no "$(can $a)"
done

# --- unprepare through the pod, then the DaemonSet goes
kubectl -n "$E2E_NS" delete pod whole --wait=true --timeout=60s >&2
wait_until 30 "CDI spec removed by the pod" sh -c "[ ! -e $spec ]"
wait_until 30 "the pod logged the unprepare" sh -c "kubectl -n $SYS_NS logs $pod -c plugin | grep 'unprepared claim' | grep -q $uid"
[ ! -e "$RUN/claims/$uid" ] || fail "$RUN/claims/$uid left after unprepare"
say "ok: unprepared by the pod (CDI spec and claim dir gone)"
kubectl -n "$E2E_NS" delete resourceclaim whole --wait=true --timeout=30s >&2
kubectl -n "$SYS_NS" delete daemonset fgpu-kubelet-plugin --wait=true --timeout=60s >&2
kubectl -n "$SYS_NS" wait --for=delete "pod/$pod" --timeout=60s >&2 || fail "plugin pod $pod not gone after the DaemonSet's deletion"
wait_until 30 "registration socket removed on SIGTERM" sh -c "[ ! -e $REG_SOCK ]"
say "ok: DaemonSet deleted; the pod removed $REG_SOCK on SIGTERM"
