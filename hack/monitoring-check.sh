#!/usr/bin/env bash
# The monitoring artefacts against the code (make monitoring-check, part of make test):
# deploy/helm/fgpu/files/monitoring/ (the alert rules and the Grafana dashboard, linked from
# deploy/monitoring/) and deploy/monitoring/'s monitors, scrape config and generated
# PrometheusRule. hack/monitoring-check.py says what each check is; --self-test breaks each
# artefact on purpose and requires its check to fail. No cluster, no build; seconds.
#   hack/monitoring-check.sh            check (then the self-test)
#   hack/monitoring-check.sh --update   regenerate deploy/monitoring/prometheus-rules.yaml
# promtool is Debian's (package prometheus; installed when missing, its service not started).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if ! command -v promtool >/dev/null; then
  ensure_pkgs prometheus
fi
ensure_pkgs python3 python3-yaml
PROMTOOL="$(command -v promtool)" || die "no promtool after installing Debian's prometheus"
check=("$FGPU_ROOT/hack/monitoring-check.py" "$FGPU_ROOT" "$PROMTOOL")

case "${1:-}" in
  --update) python3 "${check[@]}" --update ;;
  "")
    log "monitoring: $("$PROMTOOL" --version 2>&1 | head -1)"
    python3 "${check[@]}"
    python3 "${check[@]}" --self-test
    ;;
  *) die "usage: $0 [--update]" ;;
esac
