# Coverage-guided fuzzing of the parsers (cargo-fuzz + libFuzzer; fuzz/, its own workspace).
#
#   make fuzz        build the targets and run each for FUZZ_SECONDS (default 600), one at a
#                    time (hack/fuzz.sh; FUZZ_TARGETS="quantity authority" for some only)
#
# Not part of `make test`: that replays every committed seed and regression input of every
# target without libFuzzer (tests/fuzz-targets, a member of the workspace, in `make unit`).
# Figures of the last long run: docs/reliability.md, "Fuzzing".
.PHONY: fuzz

FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?=

fuzz: ## run every fuzz target for FUZZ_SECONDS each (default 600; hack/fuzz.sh)
	FUZZ_SECONDS=$(FUZZ_SECONDS) hack/fuzz.sh $(FUZZ_TARGETS)
