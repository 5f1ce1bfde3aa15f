# The legacy path (no DRA: HAMi pod specs, scheduler extender, kubelet device plugin) end to
# end on the local cluster. See docs/local-cluster.md ("Legacy path") and docs/extender.md.
#
#   make e2e-legacy                      tests/e2e/5*-legacy-* on Kubernetes 1.31 (no DRA)
#   make e2e-legacy K8S_VERSION=1.37     the same scenarios on another release
#
# `make test` runs them on the default release (1.37) as part of `make e2e`.
.PHONY: e2e-legacy

e2e-legacy: ## legacy path end to end (extender, device plugin, HAMi pods) [K8S_VERSION=1.31]
	hack/e2e.sh $(or $(K8S_VERSION),1.31) '5*-legacy-*'
