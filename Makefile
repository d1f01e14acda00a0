# dsv4 - DeepSeek-V4 inference engine.
#   make            CPU engine: build/dsv4 (and ./dsv4 -> build/dsv4)
#   make CUDA=1     adds the CUDA backend (sm_90a)
#   make test       installs missing packages, builds, runs every test (normal + ASan/UBSan build)
#   make run        builds, prepares the default (synthetic) model, chats with it
#   make fuzz       libFuzzer targets (clang) in build/fuzz/
CC      ?= cc
NVCC    ?= nvcc
CUDA    ?= 0
BUILD   ?= build
OPT     ?= -O2 -ftree-vectorize
SAN     ?=
CFLAGS  ?= $(OPT) -g
CFLAGS  += $(SAN) -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -fopenmp -MMD -MP -Iinclude -Isrc
LDLIBS  += -lcjson -lpcre2-8 -lmicrohttpd -lm -lpthread -fopenmp $(SAN)
NVFLAGS ?= -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -Xcompiler -fPIC,-Wall -Iinclude

LIB_SRC  := $(sort $(filter-out src/cuda/%,$(wildcard src/*/*.c)))
LIB_SRC  := $(filter-out src/cli/%,$(LIB_SRC))
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))
CU_SRC   := $(sort $(wildcard src/cuda/*.cu))

ifeq ($(CUDA),1)
CFLAGS   += -DDSV4_CUDA
LIB_SRC  += $(sort $(wildcard src/cuda/*.c))
CUDA_HOME ?= /usr/local/cuda
LDLIBS   += -L$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lstdc++
endif

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
ifeq ($(CUDA),1)
LIB_OBJ  += $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
endif
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

.PHONY: all deps test test-asan run fuzz clean gpu-test install
all: $(BUILD)/dsv4
	@if [ "$(BUILD)" = build ]; then ln -sf build/dsv4 dsv4; fi

# CUDA=1 also builds the per-kernel GPU test; it links only the CPU twins and the CUDA objects.
ifeq ($(CUDA),1)
GPU_TEST_OBJ := $(addprefix $(BUILD)/src/,cpu/ops.o cpu/topk.o quant/formats.o quant/weight.o) $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
all: $(BUILD)/tests/gpu/test_kernels
KT_SRC := tests/gpu/test_kernels.c $(wildcard tests/gpu/kt_*.c)
$(BUILD)/tests/gpu/test_kernels: $(KT_SRC) tests/gpu/kt.h $(GPU_TEST_OBJ)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include -o $@ $(KT_SRC) $(GPU_TEST_OBJ) -L$(CUDA_HOME)/lib64 -lcudart -lstdc++ -lm -fopenmp
# the KV cache format and the attention that reads it, against dsv4_cpu_sparse_attn
all: $(BUILD)/tests/gpu/test_attn_kv8
$(BUILD)/tests/gpu/test_attn_kv8: tests/gpu/test_attn_kv8.c $(GPU_TEST_OBJ) $(BUILD)/tests/gpu/legacy_kv8.cu.o
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include -o $@ $^ -L$(CUDA_HOME)/lib64 -lcudart -lstdc++ -lm -fopenmp
# the GPU sampler against the CPU sampler (src/engine/sample.c)
all: $(BUILD)/tests/gpu/test_sample
$(BUILD)/tests/gpu/test_sample: tests/gpu/test_sample.c $(BUILD)/src/engine/sample.o $(BUILD)/src/util/err.o $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -I$(CUDA_HOME)/include -o $@ $^ -L$(CUDA_HOME)/lib64 -lcudart -lstdc++ -lm
endif

$(BUILD)/libdsv4.a: $(LIB_OBJ)
	@mkdir -p $(@D)
	$(AR) rcs $@ $^

$(BUILD)/dsv4: $(CLI_OBJ) $(BUILD)/libdsv4.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<

# PTXAS_REPORT=1 (.ci/run): each CUDA object's ptxas report (registers, stack, spills) kept in OBJ.ptxas for
# scripts/spill_check.sh; the compiler's other messages still go to stderr
$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(@D)
ifeq ($(PTXAS_REPORT),1)
	@echo "$(NVCC) $(NVFLAGS) -Xptxas -v -MMD -MP -c -o $@ $< 2>$@.ptxas"
	@$(NVCC) $(NVFLAGS) -Xptxas -v -MMD -MP -c -o $@ $< 2>$@.ptxas; rc=$$?; touch $@.ptxas; \
	    grep -v -e '^ptxas info' -e '^    [0-9]* bytes stack frame' $@.ptxas >&2; exit $$rc
else
	$(NVCC) $(NVFLAGS) -MMD -MP -c -o $@ $<
endif

$(BUILD)/tests/%: tests/%.c $(BUILD)/libdsv4.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(BUILD)/libdsv4.a -lcriterion $(LDLIBS)

deps:
	@sh scripts/deps.sh

# Tests: the normal build, then the same tests under AddressSanitizer + UndefinedBehaviorSanitizer.
test: deps
	$(MAKE) all tests
	sh scripts/run_tests.sh $(BUILD)
	DSV4_SERVER_CONC=64 DSV4_SERVER_TOKENS=200 sh scripts/server_test.sh $(BUILD)
	$(MAKE) test-asan
	DSV4_STRESS=1 DSV4_STRESS_N=5000 sh scripts/server_test.sh build-asan
	@echo "suites: 4 passed, 0 failed"

tests: $(TEST_BIN) $(BUILD)/dsv4

test-asan:
	$(MAKE) BUILD=build-asan OPT="-O1" \
	  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" all tests
	ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/scripts/lsan.supp DSV4_ASAN=1 sh scripts/run_tests.sh build-asan

run: deps all
	sh scripts/make_run.sh

fuzz:
	$(MAKE) -C tests/fuzz

gpu-test:
	sh scripts/gpu_test.sh

install: all
	install -m 755 $(BUILD)/dsv4 $(or $(PREFIX),/usr/local)/bin/dsv4

clean:
	rm -rf build build-asan dsv4

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_BIN:=.d)
