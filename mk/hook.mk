# hook-lib (libfgpu.so) and the fake CUDA driver: build, integration tests, benchmark.
#
#   make hook-build   the two cdylibs, the fake driver directory and the C test programs
#   make hook-test    the integration suite (hook-lib/tests/run.sh), part of `make test`
#   make hook-bench   ns added per cuLaunchKernel and per cuMemAlloc+cuMemFree, without a
#                     quota, with a memory quota and with a core quota (release)
#
# Artefacts (the cluster harness copies these into the workload image):
#   $(CARGO_TARGET_DIR)/<profile>/libfgpu.so              the shim
#   $(CARGO_TARGET_DIR)/<profile>/fake-cuda/libcuda.so.1  } symlinks to
#   $(CARGO_TARGET_DIR)/<profile>/fake-cuda/libnvidia-ml.so.1 } libfgpu_fake_cuda.so
.PHONY: hook-build hook-test hook-bench hook-release

HOOK_CC ?= cc
HOOK_CFLAGS ?= -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter
HOOK_TEST_SRC := hook-lib/tests/c/hooktest.c
HOOK_MEMTEST_SRC := hook-lib/tests/c/memtest.c

# $(1) = profile directory (debug|release), $(2) = cargo flags
define hook_build_steps
	$(CARGO) build $(2) -p fgpu-hook -p fgpu-fake-cuda
	mkdir -p $(CARGO_TARGET_DIR)/$(1)/fake-cuda $(CARGO_TARGET_DIR)/$(1)/fgpu-hook-test
	ln -sf ../libfgpu_fake_cuda.so $(CARGO_TARGET_DIR)/$(1)/fake-cuda/libcuda.so.1
	ln -sf ../libfgpu_fake_cuda.so $(CARGO_TARGET_DIR)/$(1)/fake-cuda/libnvidia-ml.so.1
	$(HOOK_CC) $(HOOK_CFLAGS) -o $(CARGO_TARGET_DIR)/$(1)/fgpu-hook-test/hooktest $(HOOK_TEST_SRC) -ldl -lpthread
	$(HOOK_CC) $(HOOK_CFLAGS) -o $(CARGO_TARGET_DIR)/$(1)/fgpu-hook-test/hostile hook-lib/tests/c/hostile.c -ldl
	$(HOOK_CC) $(HOOK_CFLAGS) -DDIRECT -o $(CARGO_TARGET_DIR)/$(1)/fgpu-hook-test/hooktest-direct $(HOOK_TEST_SRC) \
	  -L$(CARGO_TARGET_DIR)/$(1)/fake-cuda -l:libcuda.so.1 -ldl -lpthread
	$(HOOK_CC) $(HOOK_CFLAGS) -o $(CARGO_TARGET_DIR)/$(1)/fgpu-hook-test/memtest $(HOOK_MEMTEST_SRC) -ldl -lpthread
	$(HOOK_CC) $(HOOK_CFLAGS) -DDIRECT -o $(CARGO_TARGET_DIR)/$(1)/fgpu-hook-test/memtest-direct $(HOOK_MEMTEST_SRC) \
	  -L$(CARGO_TARGET_DIR)/$(1)/fake-cuda -l:libcuda.so.1 -ldl -lpthread
endef

hook-build: ## build libfgpu.so, the fake CUDA driver and the hook test programs (debug)
	$(call hook_build_steps,debug,)

hook-release: ## the same, release profile
	$(call hook_build_steps,release,--release)

hook-test: hook-build ## libfgpu.so integration tests against the fake CUDA driver
	HOOK_DIR=$(CARGO_TARGET_DIR)/debug hook-lib/tests/run.sh

hook-bench: hook-release ## ns added by libfgpu.so per launch and per alloc+free, memory/core quotas (release)
	HOOK_DIR=$(CARGO_TARGET_DIR)/release hook-lib/tests/bench.sh

TEST_TARGETS += hook-test
