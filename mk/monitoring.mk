# The monitoring artefacts (deploy/monitoring/, the chart's files/monitoring/): promtool on
# the alert rules and their tests, the dashboard's queries against the families the Rust
# source registers, the docs' tables; then the checker's self-test. No cluster, no build.
.PHONY: monitoring-check
monitoring-check: ## alert rules + tests (promtool), dashboard queries vs the code's metric families
	hack/monitoring-check.sh

TEST_TARGETS += monitoring-check
