# Lints that need no build of the workspace: the harness's shell scripts, the dependency
# graph's licenses, bans and sources, and module cycles.
#
#   make lint-shell      shellcheck over hack/*.sh and tests/e2e/**/*.sh (installs it if missing)
#   make deny            cargo deny: licenses, bans, sources (deny.toml; offline, no advisories)
#   make module-cycles   dependency cycles between the modules of each crate (fails on any)
#   make flags-check     every binary spells the shared flags the same way (--help of each)
#
# cargo-deny is built once per machine into $(FGPU_CACHE)/tools/cargo-deny-<version>
# (hack/cargo-deny.sh).
.PHONY: lint-shell deny module-cycles flags-check

lint-shell: ## shellcheck over every harness script (hack/, tests/e2e/)
	hack/lint-shell.sh

# --offline: the graph from the local registry (hack/cargo-deny.sh fetches what it lacks
# first), no advisory database (advisories are not checked: they need the network). The
# duplicate-version warnings come without their inclusion trees (hundreds of lines).
deny: ## cargo deny: licenses, bans and sources of the dependency graph (deny.toml)
	hack/cargo-deny.sh --offline check --hide-inclusion-graph licenses bans sources

module-cycles: ## report dependency cycles between the modules of each crate
	hack/check-module-cycles.py

flags-check: ## the binaries' shared flags: same names, value names and env vars (--help)
	hack/check-flags.py --self-test >/dev/null
	$(CARGO) build -q -p fgpu-kubelet-plugin -p fgpu-controller -p fgpu-sim
	hack/check-flags.py $(CARGO_TARGET_DIR)/debug

# First among the area suites: they take seconds, the others minutes.
TEST_TARGETS := lint-shell deny module-cycles $(TEST_TARGETS) flags-check
