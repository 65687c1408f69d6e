# loom build. `make` builds build/loom; `make test` builds and runs tests.
# SANITIZE=address,undefined builds everything under $(BUILD)/san with
# sanitizers. BUILD=dir puts all outputs under dir (default build).

CC      ?= cc
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
BUILD   ?= build

ifneq ($(SANITIZE),)
override BUILD := $(BUILD)/san
CFLAGS  += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SANITIZE)
endif

override CFLAGS += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -pthread -Iinclude -Isrc -MMD -MP
# DEPS=DIR: packages unpacked into DIR (dpkg -x PKG.deb DIR) on a machine
# where they are not installed, e.g. the CUDA check's (README, CUDA).
ifneq ($(DEPS),)
DEPS_INC := $(abspath $(DEPS))/usr/include
DEPS_LIB := $(abspath $(DEPS))/usr/lib/$(shell $(CC) -dumpmachine)
DEPS_FLAGS := -I$(DEPS_INC) -L$(DEPS_LIB)
override CFLAGS += -I$(DEPS_INC)
LDFLAGS += -L$(DEPS_LIB) -Wl,-rpath,$(DEPS_LIB)
endif
LDLIBS  += -lmicrohttpd -lxxhash -lpcre2-8 -lutf8proc -lcjson -lpng -ljpeg -lm -pthread
# zstd (libzstd-dev), when installed, lets the prefix cache's disk tier
# compress its files (--prefix-cache-zstd).
ifneq ($(shell pkg-config --exists libzstd 2>/dev/null && echo yes),)
override CFLAGS += -DLOOM_ZSTD
LDLIBS  += -lzstd
endif

# Files named *_avx2.c and *_avx512.c hold the x86 SIMD kernels; they are
# only called after a runtime CPU check, so only they get the ISA flags.
SIMD_FLAGS := -mavx2 -mfma -mf16c
AVX512_FLAGS := $(SIMD_FLAGS) -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512vnni -mavx512bf16

# Files named *_cuda.c are the host side of the CUDA backend: CUDA=1 only.
LIB_SRC  := $(shell find src -name '*.c' ! -path 'src/cli/*' ! -name '*_cuda.c' | sort)
CLI_SRC  := $(sort $(wildcard src/cli/*.c))

# CUDA_MIN=1 (`make CUDA=1 cuda-min` sets it) builds the GPU tests on a
# machine that lacks the library's packages. Its library is LIB_SRC less
# the text side the GPU tests never call (src/serve, src/stream,
# src/tokenize, src/template: microhttpd, PCRE2, utf8proc) and the image
# decoder (src/vision/image.c: libpng, libjpeg), and where cJSON
# is missing also less every source that includes it (then only the kernel
# test is built, else also tools/gen_model); tests/cuda/shim stands in for <xxhash.h> and <utf8proc.h>
# unless both libraries are installed. Being a filter of the full list, it
# follows the sources the GPU code calls as they move. MIN_CJSON and
# MIN_SYSLIBS (y or empty) override what was found.
ifeq ($(CUDA_MIN),1)
have_lib = $(shell printf '\043include <%s>\nint main(void) { return 0; }\n' $(1) | \
                   $(CC) $(DEPS_FLAGS) -x c - -l$(2) -o /dev/null >/dev/null 2>&1 && echo y)
MIN_CJSON   ?= $(call have_lib,cjson/cJSON.h,cjson)
MIN_SYSLIBS ?= $(if $(call have_lib,xxhash.h,xxhash),$(call have_lib,utf8proc.h,utf8proc))
LIB_SRC  := $(filter-out src/serve/% src/stream/% src/tokenize/% src/template/% src/vision/image.c \
                         src/grammar/vocab_tok.c,$(LIB_SRC))
override CFLAGS += -DLOOM_NO_PCRE2 # the schema compiler's pattern check (src/grammar/schema.c)
MIN_LIBS := $(filter -lzstd,$(LDLIBS)) -lm -pthread
ifeq ($(MIN_SYSLIBS),y)
MIN_LIBS += -lxxhash -lutf8proc
else
override CFLAGS += -Itests/cuda/shim
endif
ifeq ($(MIN_CJSON),y)
MIN_LIBS += -lcjson
MIN_TESTS := cuda-tests/test_cuda_kernels cuda-tests/test_cuda_forward \
             cuda-tests/test_cuda_engine cuda-tests/test_cuda_spec tools/gen_model
else
LIB_SRC  := $(filter-out $(shell grep -l '^\#include <cjson/cJSON.h>' $(LIB_SRC)),$(LIB_SRC))
MIN_TESTS := cuda-tests/test_cuda_kernels
endif
LDLIBS   := $(MIN_LIBS)
endif

TEST_SRC := $(sort $(wildcard tests/test_*.c))
TOOL_SRC := $(sort $(wildcard tools/*.c))
BENCH_SRC := $(sort $(wildcard bench/*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TESTS    := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TOOLS    := $(TOOL_SRC:tools/%.c=$(BUILD)/tools/%)
BENCHES  := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
LIB      := $(BUILD)/libloom.a

# CUDA=1 adds the CUDA backend: src/cuda/*.cu built by nvcc for sm_90 into
# $(BUILD)/cuda and archived into the library, which then links cudart and
# cuBLAS. `make CUDA=1 cuda-tests` builds the GPU kernel tests (tests/cuda/;
# they need a GPU to run: tools/cuda_check.sh). Use its own BUILD dir
# (e.g. BUILD=build/cuda) so CPU-only and CUDA libraries never mix.
ifeq ($(CUDA),1)
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CUDA_ARCH ?= -arch=sm_90
NVCCFLAGS ?= -O3 -lineinfo
# CUDA_WERROR= relaxes warnings-as-errors for the .cu files only (another
# host compiler's new warnings need not stop a one-off GPU check).
CUDA_WERROR ?= -Xcompiler -Werror -Werror all-warnings
override NVCCFLAGS += $(CUDA_ARCH) -std=c++17 -Iinclude -Isrc -Xcompiler -Wall,-Wextra $(CUDA_WERROR)
override CFLAGS += -DLOOM_CUDA
CU_SRC   := $(sort $(wildcard src/cuda/*.cu))
CU_HDR   := $(wildcard src/cuda/*.h src/cuda/*.cuh) include/loom.h
CU_OBJ   := $(CU_SRC:%.cu=$(BUILD)/cuda/%.o)
CUC_SRC  := $(shell find src -name '*_cuda.c' ! -path 'src/cli/*' | sort)
LIB_OBJ  += $(CU_OBJ) $(CUC_SRC:%.c=$(BUILD)/obj/%.o)
LDLIBS   += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
# NCCL (tensor parallelism across devices) where NCCL_HOME (default the
# toolkit; e.g. a Python nvidia-nccl package's nvidia/nccl) has nccl.h and
# lib64/ or lib/libnccl; NCCL=0 builds without (a split then runs on one device)
NCCL_HOME ?= $(CUDA_HOME)
ifneq ($(NCCL),0)
ifneq ($(wildcard $(NCCL_HOME)/include/nccl.h),)
override NVCCFLAGS += -DLOOM_NCCL -I$(NCCL_HOME)/include
NCCL_LIB := $(firstword $(wildcard $(NCCL_HOME)/lib64/libnccl.so* $(NCCL_HOME)/lib/libnccl.so*))
LDLIBS   += -L$(dir $(NCCL_LIB)) -Wl,-rpath,$(dir $(NCCL_LIB)) -l:$(notdir $(NCCL_LIB))
endif
endif
CUDA_TESTS := $(BUILD)/cuda-tests/test_cuda_kernels $(BUILD)/cuda-tests/test_cuda_forward \
              $(BUILD)/cuda-tests/test_cuda_engine $(BUILD)/cuda-tests/test_cuda_spec \
              $(BUILD)/cuda-tests/test_cuda_vision $(BUILD)/cuda-tests/test_cuda_tp
ifeq ($(CUDA_MIN),1)
CUDA_TESTS := $(MIN_TESTS:%=$(BUILD)/%)
endif
endif

.PHONY: all test tests tools clean
all: $(BUILD)/loom $(TOOLS) $(BENCHES)

$(BUILD)/obj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(SIMD_FLAGS) -c $< -o $@

$(BUILD)/obj/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX512_FLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/loom: $(CLI_OBJ) $(LIB)
	$(CC) $(CFLAGS) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/tests/%: tests/%.c $(LIB) tests/test.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@

$(BUILD)/tools/%: tools/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@

$(BUILD)/bench/%: bench/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@

tests: $(TESTS) $(BUILD)/loom

# Each test binary runs from the repo root; tests/run.sh adds the CLI checks.
test: tests
	@LOOM_BUILD=$(BUILD) sh tests/run.sh $(TESTS)

# libFuzzer targets (fuzz/README.md): `make fuzz` builds $(BUILD)/fuzz/*
# with clang; the code under test gets coverage, the rest links from $(LIB).
FUZZ_CC  ?= clang
FUZZ_SRC := src/base/base.c src/load/safetensors.c src/serve/api.c src/serve/media.c src/serve/toolcall.c \
            src/serve/api_messages.c src/serve/api_responses.c \
            src/grammar/grammar.c src/grammar/schema.c \
            src/stream/textstream.c src/vision/image.c src/vision/imgproc.c \
            $(sort $(wildcard src/tokenize/*.c)) $(sort $(wildcard src/template/*.c))
.PHONY: fuzz
fuzz: $(patsubst fuzz/%.c,$(BUILD)/fuzz/%,$(wildcard fuzz/fuzz_*.c))
$(BUILD)/fuzz/%: fuzz/%.c $(FUZZ_SRC) $(LIB)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -g -O1 -fsanitize=fuzzer,address,undefined -std=c11 -D_GNU_SOURCE -Iinclude -Isrc \
	    $< $(FUZZ_SRC) $(LIB) $(LDLIBS) -o $@

# CUDA=1 rules (variables above, next to LIB).
.PHONY: cuda-tests
ifeq ($(CUDA),1)
$(BUILD)/cuda/%.o: %.cu $(CU_HDR)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

$(BUILD)/cuda-tests/%: tests/cuda/%.c $(LIB) tests/test.h $(wildcard tests/cuda/*.h) $(CU_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@

cuda-tests: $(CUDA_TESTS)

# The GPU tests without the library's packages (CUDA_MIN above), in
# $(BUILD)/min so that its objects never mix with the full build's.
.PHONY: cuda-min
cuda-min:
	$(MAKE) BUILD=$(BUILD)/min CUDA=1 CUDA_MIN=1 cuda-tests
else
cuda-tests cuda-min:
	@echo "$@: build with CUDA=1 (make BUILD=build/cuda CUDA=1 $@)" >&2; exit 1
endif

clean:
	rm -rf build

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
