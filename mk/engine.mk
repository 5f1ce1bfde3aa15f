# Allocation engine and trace simulator (owner: engine). See docs/engine.md.
#
#   make sim-smoke    every policy on the four traces, one seed (part of `make test`): the
#                     Alibaba trace when $(FGPU_DATA) holds it, else a small trace of our own
#                     that tests/sim/gen-trace.py generates (seeded: the same files every run);
#                     each trace's curves drawn by `fgpu-sim plot`, checked to name every policy
#   make sim-compare  the full comparison with the FGD paper: 10 seeds, every policy,
#                     four traces; prints ours beside the paper's figure and draws each
#                     trace's curves as the paper's figure, compare-<trace>.svg (needs the trace)
#   make sim-gpuspec  fgd vs fragaware on model-pinned variants of default (--pin-models
#                     5-35 % of GPU pods, models in capacity proportion), seeds 42-46; not
#                     part of `make test` (slow; needs the trace)
#   make engine-bench criterion bench of node evaluations per second
#
# FGPU_DATA: a directory with csv/ (the Alibaba GPU trace v2023, `cluster-trace-gpu-v2023/csv`
# of https://github.com/alibaba/clusterdata) and fgd-expected-results/ (the FGD paper's
# results, `experiments/analysis/expected_results` of
# https://github.com/hkust-adsl/kubernetes-scheduler-simulator). Default: the lead's copy
# beside the checkout, where there is one.
FGPU_DATA ?= $(CURDIR)/../shared/data/alibaba-gpu-v2023
SIM_TRACES ?= default cpu050 gpushare40 multigpu30
SIM_OUT ?= $(CARGO_TARGET_DIR)/sim
SIM_GEN = $(SIM_OUT)/generated
SIM_GEN_ARGS ?= --seed 42 --nodes 48 --pods 500
FGPU_DATA_HELP = the Alibaba GPU trace v2023 is not in FGPU_DATA=$(FGPU_DATA): clone \
  https://github.com/alibaba/clusterdata (cluster-trace-gpu-v2023/csv) and \
  https://github.com/hkust-adsl/kubernetes-scheduler-simulator (experiments/analysis/expected_results), \
  and point FGPU_DATA at a directory holding them as csv/ and fgd-expected-results/
SIM_BIN = $(CARGO_TARGET_DIR)/release/fgpu-sim
# The smoke test runs the debug binary: the workspace's dev profile optimises fgpu-driver (the
# engine), so it is as fast as a release build for this, and `make unit` has built it already.
SMOKE_BIN = $(CARGO_TARGET_DIR)/debug/fgpu-sim
SIM_ARGS = --nodes $(FGPU_DATA)/csv/openb_node_list_gpu_node.csv \
	--paper $(FGPU_DATA)/fgd-expected-results/analysis_allo_discrete.csv
# The smoke's inputs: the trace when present, else the generated one (no paper figures).
SIM_HAVE_DATA = $(wildcard $(FGPU_DATA)/csv/openb_node_list_gpu_node.csv)
SMOKE_CSV = $(if $(SIM_HAVE_DATA),$(FGPU_DATA)/csv,$(SIM_GEN))
SMOKE_ARGS = --nodes $(SMOKE_CSV)/openb_node_list_gpu_node.csv \
	$(if $(SIM_HAVE_DATA),--paper $(FGPU_DATA)/fgd-expected-results/analysis_allo_discrete.csv)

TEST_TARGETS += sim-smoke

.PHONY: sim-build sim-smoke-build sim-smoke sim-compare sim-gpuspec engine-bench

sim-build:
	$(CARGO) build --release -q -p fgpu-sim

sim-smoke-build:
	$(CARGO) build -q -p fgpu-sim

sim-smoke: sim-smoke-build ## trace simulator: every policy on the four traces, one seed
	@mkdir -p $(SIM_OUT)
	@if [ -z "$(SIM_HAVE_DATA)" ]; then \
	  echo "sim-smoke: $(FGPU_DATA_HELP); running on a generated trace ($(SIM_GEN_ARGS))"; \
	  python3 tests/sim/gen-trace.py $(SIM_GEN_ARGS) --out $(SIM_GEN) || exit 1; \
	fi
	@for t in $(SIM_TRACES); do \
	  $(SMOKE_BIN) --log-format json $(SMOKE_ARGS) --pods $(SMOKE_CSV)/openb_pod_list_$$t.csv \
	    --policy all --seeds 42 --out $(SIM_OUT)/smoke-$$t.csv 2>/dev/null || exit 1; \
	  test "$$(wc -l < $(SIM_OUT)/smoke-$$t.csv)" -eq 7 || { echo "sim-smoke: $$t: expected 6 rows"; exit 1; }; \
	  head -1 $(SIM_OUT)/smoke-$$t.csv | grep -q '^workload,sc_policy,tune,seed,total_gpus,0,1,' || exit 1; \
	  rm -f $(SIM_OUT)/smoke-$$t.svg; \
	  $(SMOKE_BIN) --log-format json plot --in $(SIM_OUT)/smoke-$$t.csv --out $(SIM_OUT)/smoke-$$t.svg \
	    2>/dev/null || { echo "sim-smoke: $$t: fgpu-sim plot failed"; exit 1; }; \
	  policies="$$(tail -n +2 $(SIM_OUT)/smoke-$$t.csv | cut -d, -f2 | sort -u)"; \
	  for p in $$policies; do \
	    grep -qx "$$p" $(SIM_OUT)/smoke-$$t.svg || { echo "sim-smoke: $$t: $$p not in the figure's legend"; exit 1; }; \
	  done; \
	  test "$$(grep -c '^<polyline.*stroke-width="2"' $(SIM_OUT)/smoke-$$t.svg)" -eq "$$(echo "$$policies" | wc -l)" \
	    || { echo "sim-smoke: $$t: expected one path per policy in smoke-$$t.svg"; exit 1; }; \
	done
	@printf 'sn,cpu_milli,memory_mib,gpu,model\nn0,1,x,1,T4\n' > $(SIM_OUT)/bad.csv
	@$(SMOKE_BIN) --nodes $(SIM_OUT)/bad.csv --pods $(SMOKE_CSV)/openb_pod_list_default.csv \
	  --seeds 42 --out $(SIM_OUT)/bad-out.csv 2>$(SIM_OUT)/bad.err; \
	  test $$? -eq 2 && grep -q 'bad.csv:2: column 3 (memory_mib)' $(SIM_OUT)/bad.err \
	  || { echo "sim-smoke: a malformed CSV must exit 2 naming file, line and column"; exit 1; }
	@echo "sim-smoke: ok ($(if $(SIM_HAVE_DATA),the Alibaba trace in $(FGPU_DATA),the generated trace in $(SIM_GEN)))"

sim-compare: sim-build ## FGD comparison: 10 seeds x every policy x four traces, ours vs paper
	@[ -n "$(SIM_HAVE_DATA)" ] || { echo "sim-compare: $(FGPU_DATA_HELP)"; exit 1; }
	@mkdir -p $(SIM_OUT)
	@for t in $(SIM_TRACES); do \
	  $(SIM_BIN) $(SIM_ARGS) --pods $(FGPU_DATA)/csv/openb_pod_list_$$t.csv \
	    --policy all --seeds 42-51 --out $(SIM_OUT)/compare-$$t.csv 2>/dev/null || exit 1; \
	  $(SIM_BIN) --log-format json plot --in $(SIM_OUT)/compare-$$t.csv \
	    --out $(SIM_OUT)/compare-$$t.svg 2>/dev/null || exit 1; \
	done
	@echo "per-seed curves: $(SIM_OUT)/compare-<trace>.csv (layout of analysis_allo_discrete.csv)"
	@echo "figures (mean over seeds, the paper's axes): $(SIM_OUT)/compare-<trace>.svg"

SIM_PIN_FRACTIONS ?= 0.05 0.10 0.20 0.25 0.30 0.35
sim-gpuspec: sim-build ## fgd vs fragaware on model-pinned variants of default (5-35 %)
	@[ -n "$(SIM_HAVE_DATA)" ] || { echo "sim-gpuspec: $(FGPU_DATA_HELP)"; exit 1; }
	@mkdir -p $(SIM_OUT)
	@for f in $(SIM_PIN_FRACTIONS); do \
	  $(SIM_BIN) $(SIM_ARGS) --pods $(FGPU_DATA)/csv/openb_pod_list_default.csv --pin-models $$f \
	    --policy fgd,fragaware --seeds 42-46 --out $(SIM_OUT)/gpuspec-$$f.csv 2>/dev/null || exit 1; \
	done

engine-bench: ## criterion bench: node evaluations per second
	$(CARGO) bench -p fgpu-driver --bench engine
