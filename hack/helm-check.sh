#!/usr/bin/env bash
# The Helm chart's checks without a cluster (make helm-check, part of make test):
#   helm lint, helm template of every values example (deploy/helm/fgpu/examples/*.yaml) on
#   the oldest and newest Kubernetes the chart supports, and the structural checks of
#   tests/helm/check-chart.py. The server-side dry-run of the rendered manifests runs where a
#   cluster is up: tests/e2e/70-helm-install.
# helm is the harness's (hack/k8s-build.sh --tools builds it once into $FGPU_CACHE).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHART="$FGPU_ROOT/deploy/helm/fgpu"
HELM="$(helm_bin)"
if [ ! -x "$HELM" ]; then
  log "no helm at $HELM: building the harness's tools"
  "$FGPU_ROOT/hack/k8s-build.sh" --tools
fi
ensure_pkgs python3 python3-yaml

"$HELM" lint --strict "$CHART"
n=0
for f in "$CHART"/examples/*.yaml; do
  for v in 1.31.0 1.32.0 1.34.0 1.37.2; do
    "$HELM" lint --strict --quiet "$CHART" -f "$f" --kube-version "$v" >/dev/null \
      || die "helm lint -f $f --kube-version $v failed"
    out="$("$HELM" template fgpu "$CHART" -n fgpu-system -f "$f" --kube-version "$v")" \
      || die "helm template -f $f --kube-version $v failed"
    [ -n "$out" ] || die "helm template -f $f --kube-version $v rendered nothing"
    n=$((n + 1))
  done
  log "rendered $(basename "$f") on 1.31, 1.32, 1.34, 1.37"
done
log "helm template: $n renders"
python3 "$FGPU_ROOT/tests/helm/check-chart.py" "$HELM" "$CHART"
