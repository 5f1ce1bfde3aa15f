# shellcheck shell=bash
# Helpers for the chart scenarios (70-helm-install, 71-helm-controller-mode): build and import
# this checkout's images, install deploy/helm/fgpu with the demo values through the harness's
# post-renderer (tests/helm/harness-postrender.py: host network, webhooks by URL), and take
# everything down again. Sourced after lib.sh.
ROOT="$(cd "$E2E_LIB_DIR/../.." && pwd)"
CHART="$ROOT/deploy/helm/fgpu"
SYS_NS=fgpu-system
RELEASE=fgpu
DRIVER=gpu.fgpu.dev
HELM="${FGPU_CACHE:-/var/cache/fgpu}/k8s/tools/helm-3.22.0/bin/helm"
[ -x "$HELM" ] || HELM="$(cd "$ROOT" && bash -c 'source hack/lib.sh; helm_bin')"
[ -x "$HELM" ] || fail "no helm binary ($HELM): hack/k8s-build.sh --tools"
helm() { "$HELM" "$@"; }
sel() { echo "app.kubernetes.io/instance=$RELEASE,app.kubernetes.io/component=$1"; }
pod_of() { kubectl -n "$SYS_NS" get pods -l "$(sel "$1")" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null; }
log_of() { kubectl -n "$SYS_NS" logs -l "$(sel "$1")" --all-containers --tail=-1 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' || true; }

# helm_images: this checkout's binaries, packed and imported (no-ops when up to date)
helm_images() {
  (cd "$ROOT" && cargo build -q -p fgpu-kubelet-plugin -p fgpu-controller -p fgpu-hook -p fgpu-fake-cuda) >&2 \
    || fail "cargo build failed"
  local out
  out="$("$ROOT/hack/images.sh" plugin 2>&1)" || { tail -5 <<<"$out" >&2; fail "hack/images.sh plugin failed"; }
  out="$("$ROOT/hack/images.sh" controller 2>&1)" || { tail -5 <<<"$out" >&2; fail "hack/images.sh controller failed"; }
  python3 "$ROOT/tests/images/check-dockerfiles.py" "$ROOT" "$ROOT/_out/images" >&2 \
    || fail "the harness's images do not hold what deploy/images/*/Dockerfile declare"
}

# helm_args: the install's arguments for this harness (demo values + post-renderer)
HELM_ARGS=()
helm_setup() {
  local host port
  host="$(kubectl get node "$NODE_NAME" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')"
  port="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}' | sed -n 's#.*:\([0-9]*\)/*$#\1#p')"
  { [ -n "$host" ] && [ -n "$port" ]; } || fail "cannot tell the API server's host address ($host:$port)"
  say "harness: post-renderer with KUBERNETES_SERVICE_HOST=$host KUBERNETES_SERVICE_PORT=$port, webhooks on https://127.0.0.1:9443"
  HELM_ARGS=(-n "$SYS_NS" -f "$CHART/examples/demo.yaml" --set 'certs.extraDnsNames={127.0.0.1}'
    --post-renderer "$ROOT/tests/helm/harness-postrender.py" --post-renderer-args "$host" --post-renderer-args "$port")
  # the fake GPUs' device nodes come from the chart's install step now; the profile's deviceRoot
  [ -d /run/fgpu-e2e ] || devdir_created=1
}

# preconditions shared by both scenarios: nothing of fgpu on the cluster or the node
helm_preconditions() {
  helm status "$RELEASE" -n "$SYS_NS" >/dev/null 2>&1 && fail "a release $RELEASE exists already"
  kubectl get namespace "$SYS_NS" >/dev/null 2>&1 && fail "namespace $SYS_NS exists before this scenario (a previous one left it)"
  [ ! -e "$KUBELET_REGISTRAR_DIR/$DRIVER-reg.sock" ] || fail "another $DRIVER plugin is registered on this node"
  local p
  for p in 9400 9443 19500; do
    if ss -Hltn "sport = :$p" 2>/dev/null | grep -q .; then fail "host port $p is in use (the chart's ports on the host network)"; fi
  done
  [ -e /var/lib/fgpu ] || state_created=1
  [ -e /run/fgpu ] || run_created=1
  return 0
}

# leftovers: every object of the release, cluster-scoped and in the namespace (prints them)
helm_leftovers() {
  local l="app.kubernetes.io/instance=$RELEASE"
  kubectl get clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings,mutatingwebhookconfigurations,validatingwebhookconfigurations,deviceclasses -l "$l" -o name 2>/dev/null
  kubectl -n default get roles,rolebindings -l "$l" -o name 2>/dev/null
  if kubectl get namespace "$SYS_NS" >/dev/null 2>&1; then
    kubectl -n "$SYS_NS" get all,secrets,configmaps,serviceaccounts,roles,rolebindings,networkpolicies,poddisruptionbudgets,cronjobs,jobs -l "$l" -o name 2>/dev/null
  fi
  kubectl get resourceslices -o jsonpath="{range .items[?(@.spec.driver==\"$DRIVER\")]}resourceslice/{.metadata.name}{\"\n\"}{end}" 2>/dev/null
}

# helm_diagnostics <rc>: on a failure (not a skip, 77), the fgpu pods and the last lines of
# each component's log.
helm_diagnostics() {
  [ "$1" -ne 0 ] && [ "$1" -ne 77 ] || return 0
  say "fgpu pods:"; kubectl -n "$SYS_NS" get pods -o wide 2>/dev/null | sed 's/^/      /' >&2 || true
  for c in kubelet-plugin controller certs; do say "$c log (last 25):"; log_of "$c" | tail -25 | sed 's/^/      /' >&2; done
}

# helm_cleanup <rc>: what a failed run may leave
helm_cleanup() {
  kubectl -n "$E2E_NS" delete pods --all --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl -n "$E2E_NS" delete resourceclaims --all --wait=true --timeout=30s >/dev/null 2>&1 || true
  for c in $(kubectl -n "$E2E_NS" get resourceclaims -o name 2>/dev/null); do
    kubectl -n "$E2E_NS" patch "$c" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
  done
  [ "${owned:-0}" = 1 ] || return 0
  helm uninstall "$RELEASE" -n "$SYS_NS" --wait --timeout 90s >/dev/null 2>&1 || true
  kubectl delete namespace "$SYS_NS" --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1 || true
  kubectl delete resourceslice "$NODE_NAME-$DRIVER" --ignore-not-found >/dev/null 2>&1 || true
  rm -f "$KUBELET_REGISTRAR_DIR/$DRIVER-reg.sock" "$KUBELET_PLUGINS_DIR/$DRIVER/dra.sock"
  rmdir "$KUBELET_PLUGINS_DIR/$DRIVER" 2>/dev/null || true
  [ "${state_created:-0}" = 0 ] || rm -rf /var/lib/fgpu
  [ "${run_created:-0}" = 0 ] || rm -rf /run/fgpu
  [ "${devdir_created:-0}" = 0 ] || rm -rf /run/fgpu-e2e
  return 0
}

# helm_install <extra helm args...>: install and wait until the plugin published its slice
helm_install() {
  local t0=$SECONDS
  helm install "$RELEASE" "$CHART" --create-namespace "${HELM_ARGS[@]}" "$@" --wait --wait-for-jobs --timeout 240s >&2 \
    || { kubectl -n "$SYS_NS" get pods -o wide >&2 || true; kubectl -n "$SYS_NS" describe pods 2>/dev/null | tail -40 >&2 || true; log_of certs | tail -20 >&2; fail "helm install failed"; }
  say "ok: helm install --wait done in $((SECONDS - t0))s"
  wait_until 60 "ResourceSlice $NODE_NAME-$DRIVER published" kubectl get resourceslice "$NODE_NAME-$DRIVER"
}

# certs_checks: the Job filled the Secret, the webhooks carry its CA bundle
certs_checks() {
  local keys bundle cab w
  # shellcheck disable=SC2016 # a go-template, not shell
  keys="$(kubectl -n "$SYS_NS" get secret fgpu-webhook-tls -o go-template='{{range $k, $v := .data}}{{$k}} {{end}}')"
  assert_eq "Secret fgpu-webhook-tls keys (written by the certs Job)" "ca-bundle.crt ca.crt ca.key tls.crt tls.key " "$keys"
  bundle="$(kubectl -n "$SYS_NS" get secret fgpu-webhook-tls -o jsonpath='{.data.ca-bundle\.crt}')"
  for w in "$@"; do
    cab="$(kubectl get "$w" -o jsonpath='{.webhooks[0].clientConfig.caBundle}')"
    if [ -z "$cab" ] || [ "$cab" != "$bundle" ]; then fail "$w: caBundle is not the Secret's ca-bundle.crt"; fi
    say "ok: $w caBundle = the Secret's CA bundle (set by the certs Job)"
  done
  local line
  line="$(log_of certs | grep -m1 -E 'issued certificates|certificates valid, kept' || true)"
  [ -n "$line" ] || fail "the certs Job's log says neither that it issued nor that it kept the certificates"
  say "ok: certs Job: $(cut -c1-200 <<<"$line")"
}
