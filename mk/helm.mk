# The Helm chart (deploy/helm/fgpu): lint, render every values example, structural checks.
# The server-side dry-run against a real API server is part of e2e (70-helm-install).
.PHONY: helm-check
helm-check: ## helm lint + helm template of each values example + chart structure checks
	hack/helm-check.sh

# before e2e: seconds, not minutes
TEST_TARGETS := helm-check $(TEST_TARGETS)
