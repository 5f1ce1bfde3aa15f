# The Helm chart (deploy/helm/fgpu): lint, render every values example, structural checks.
# The server-side dry-run against a real API server is part of e2e (70-helm-install).
.PHONY: helm-check
helm-check: ## helm lint + helm template of each values example + chart structure checks
	hack/helm-check.sh

# before e2e: seconds, not minutes
TEST_TARGETS := helm-check $(TEST_TARGETS)

# The harness's images against deploy/images/*/Dockerfile (builds what is missing first).
.PHONY: images-check
images-check: ## the harness-built images hold exactly what deploy/images/*/Dockerfile declare
	$(CARGO) build -q -p fgpu-kubelet-plugin -p fgpu-controller -p fgpu-hook -p fgpu-fake-cuda
	hack/images.sh build
	tests/images/check-dockerfiles.py . _out/images --self-test

TEST_TARGETS += images-check
