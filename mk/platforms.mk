# Queueing platforms on top of fgpu's shares, installed on the running local cluster
# (docs/platforms.md). Kueue and Volcano are built once from their Go modules (tests/k8s/kueue
# and tests/k8s/volcano pin them) into $(FGPU_CACHE)/k8s/tools/<name>-<version>.
#   make cluster-up; make kueue-install; ...; make kueue-uninstall
#   make cluster-up; make volcano-install; ...; make volcano-uninstall
#   make e2e-kueue                      tests/e2e/8*-kueue-* on their own (cluster up and down)
#   make e2e-volcano                    tests/e2e/8*-volcano-* on their own (cluster up and down)
# `make test` runs these scenarios as part of `make e2e`.
.PHONY: kueue-build kueue-install kueue-uninstall e2e-kueue
.PHONY: volcano-build volcano-install volcano-uninstall e2e-volcano

kueue-build: ## build (once, cached) Kueue's manager from its pinned Go module
	hack/kueue-build.sh

kueue-install: ## install Kueue (CRDs, manager as a host process, DRA quota on) on the running cluster
	hack/kueue-install.sh

kueue-uninstall: ## stop the Kueue manager (by its recorded pid) and delete its CRDs
	hack/kueue-uninstall.sh

e2e-kueue: ## the Kueue scenarios end to end (quotas over fgpu shares) [K8S_VERSION=1.37]
	hack/e2e.sh $(or $(K8S_VERSION),1.37) '8*-kueue-*'

volcano-build: ## build (once, cached) Volcano's scheduler and controller manager from the pinned Go module
	hack/volcano-build.sh

volcano-install: ## install Volcano (CRDs, scheduler and controllers as host processes, DRA on) on the running cluster
	hack/volcano-install.sh

volcano-uninstall: ## stop Volcano's processes (by their recorded pids) and delete its CRDs
	hack/volcano-uninstall.sh

e2e-volcano: ## the Volcano scenarios end to end (queues, gangs, reclaim over fgpu shares) [K8S_VERSION=1.37]
	hack/e2e.sh $(or $(K8S_VERSION),1.37) '8*-volcano-*'
