# fgpu — top-level entry points. `make help` lists them.
#
# Expensive things are cached outside the checkout, keyed so a later run reuses them:
#   $(FGPU_CACHE)/target   the cargo target directory (shared by every checkout on this machine),
#                          kept under FGPU_TARGET_MAX_GB GiB (default 30) by hack/prune-target.sh,
#                          the first step of `make test`
#   $(FGPU_CACHE)/k8s/...  Kubernetes, etcd, containerd, helm binaries (see mk/cluster.mk)
FGPU_CACHE ?= /var/cache/fgpu
export FGPU_CACHE
export CARGO_TARGET_DIR ?= $(FGPU_CACHE)/target
CARGO ?= cargo

# Each area adds its own test steps to TEST_TARGETS in mk/<area>.mk.
TEST_TARGETS :=

.PHONY: help build test prune-target fmt-check clippy unit demo
.DEFAULT_GOAL := help

help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sort | \
	  awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

build: ## build every crate (debug)
	$(CARGO) build --workspace --all-targets

prune-target: ## trim the cached cargo target dir when over FGPU_TARGET_MAX_GB GiB (default 30)
	hack/prune-target.sh

fmt-check: ## cargo fmt --check
	$(CARGO) fmt --all -- --check

clippy: ## clippy on every target, warnings are errors
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit: ## cargo test for the whole workspace
	@# The fake driver's cdylib, which tests/fake-cuda's integration tests load: cargo test
	@# builds only the rlib of a package's lib for its own tests.
	$(CARGO) build -p fgpu-fake-cuda --lib
	$(CARGO) test --workspace

-include mk/*.mk

test: prune-target fmt-check clippy unit $(TEST_TARGETS) ## all tests: fmt, clippy, unit + integration, then each area's suites
	@echo "make test: all suites passed"
