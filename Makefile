# fgpu — top-level entry points. `make help` lists them.
#
# Expensive things are cached outside the checkout, keyed so a later run reuses them:
#   $(FGPU_CACHE)/target   the cargo target directory (shared by every checkout on this machine)
#   $(FGPU_CACHE)/k8s/...  Kubernetes, etcd, containerd, helm binaries (see mk/cluster.mk)
FGPU_CACHE ?= /var/cache/fgpu
export FGPU_CACHE
export CARGO_TARGET_DIR ?= $(FGPU_CACHE)/target
CARGO ?= cargo

# Each area adds its own test steps to TEST_TARGETS in mk/<area>.mk.
TEST_TARGETS :=

.PHONY: help build test fmt-check clippy unit demo
.DEFAULT_GOAL := help

help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sort | \
	  awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

build: ## build every crate (debug)
	$(CARGO) build --workspace --all-targets

fmt-check: ## cargo fmt --check
	$(CARGO) fmt --all -- --check

clippy: ## clippy on every target, warnings are errors
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit: ## cargo test for the whole workspace
	$(CARGO) test --workspace

-include mk/*.mk

test: fmt-check clippy unit $(TEST_TARGETS) ## all tests: fmt, clippy, unit + integration, then each area's suites
	@echo "make test: all suites passed"
