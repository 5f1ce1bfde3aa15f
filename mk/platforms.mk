# Queueing platforms on top of fgpu's shares, installed on the running local cluster
# (docs/platforms.md). Kueue is built once from its Go module (tests/k8s/kueue pins it) into
# $(FGPU_CACHE)/k8s/tools/kueue-<version>.
#   make cluster-up; make kueue-install; ...; make kueue-uninstall
#   make e2e-kueue                      tests/e2e/8*-kueue-* on their own (cluster up and down)
# `make test` runs the Kueue scenario as part of `make e2e`.
.PHONY: kueue-build kueue-install kueue-uninstall e2e-kueue

kueue-build: ## build (once, cached) Kueue's manager from its pinned Go module
	hack/kueue-build.sh

kueue-install: ## install Kueue (CRDs, manager as a host process, DRA quota on) on the running cluster
	hack/kueue-install.sh

kueue-uninstall: ## stop the Kueue manager (by its recorded pid) and delete its CRDs
	hack/kueue-uninstall.sh

e2e-kueue: ## the Kueue scenarios end to end (quotas over fgpu shares) [K8S_VERSION=1.37]
	hack/e2e.sh $(or $(K8S_VERSION),1.37) '8*-kueue-*'
