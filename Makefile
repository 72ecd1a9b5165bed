# kvattn - single-header C99 library.  Nothing to build for users: copy
# kvattn.h (or `make install`).  This Makefile drives tests and tools.
#
#   make test        the quick default of the build/test matrix
#                    (tests/run_matrix.sh): the suite natively, with the
#                    scalar kernels forced, under ASan+UBSan at the quick
#                    sizes, and the repository check; a few minutes
#   make test-all    the whole matrix (what .ci/run runs)
#                    Both print a line per step as it ends, end with
#                    "N passed, N failed" and exit non-zero if a step failed.
#                    MATRIX_STEPS='native asan*' runs only the matching steps
#                    (of the whole matrix), JOBS=1 one step at a time.
#   make bench       build/kvattn_bench from bench/*.c, run with BENCH_ARGS
#   make plot        kvattn_bench plot-data (memory and decode against context) into
#                    $(BENCH_CSV), then gnuplot bench/plot.gp; BENCH_ARGS=--sweep
#                    decodes to 128K tokens, cold and warm; then, when the
#                    retrieval model is there, the needle part (one case per
#                    depth and length; NEEDLE_ARGS= without --quick: all) into
#                    $(NEEDLE_CSV) and bench/plot_needle.gp's charts
#   make examples    every examples/*.c into build/examples/
#   make kvattn_run_redis   kvattn_run with --prefix-redis (links hiredis: libhiredis-dev)
#   make fuzz        every tests/fuzz_*.c with libFuzzer for FUZZ_SECONDS each
#   make install     kvattn.h into $(DESTDIR)$(INCLUDEDIR), kvattn.pc into
#                    $(PKGCONFIGDIR), the CMake package (find_package(kvattn),
#                    target kvattn::kvattn) into $(CMAKEDIR); PREFIX=/usr/local,
#                    LIBDIR=$(PREFIX)/lib.  make uninstall removes them.
#   make clean

.DEFAULT_GOAL := test

# make's built-in default CC is "cc"; the matrix is specified against gcc.
ifeq ($(origin CC),default)
CC := gcc
endif
ifeq ($(origin CXX),default)
CXX := g++
endif
CLANG        ?= clang
AARCH64_CC   ?= aarch64-linux-gnu-gcc
QEMU_AARCH64 ?= qemu-aarch64

BUILD        ?= build
PREFIX       ?= /usr/local
INCLUDEDIR   ?= $(PREFIX)/include
LIBDIR       ?= $(PREFIX)/lib
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
CMAKEDIR     ?= $(LIBDIR)/cmake/kvattn
JOBS         ?= $(shell nproc 2>/dev/null || echo 1)
RUN_TIMEOUT  ?= 600
MATRIX_STEPS ?=

BENCH_CFLAGS   ?= -std=c99 -O3 -march=native -fopenmp
BENCH_ARGS     ?=
BENCH_CSV      ?= $(BUILD)/bench.csv
NEEDLE_MODEL_DIR ?= bench/retrieval
NEEDLE_CSV     ?= $(BUILD)/needle.csv
NEEDLE_TOKENIZER ?= bench/model/tokenizer.bin
NEEDLE_ARGS    ?= --quick
EXAMPLE_CFLAGS ?= -std=c99 -O2 -march=native -Wall -Wextra
FUZZ_CFLAGS    ?= -std=c99 -g -O1 -fsanitize=fuzzer,address,undefined \
                  -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_SECONDS   ?= 60
FUZZ_ARGS      ?=

# $(BUILD) as a command path: ./build/..., or an absolute BUILD as it is
BUILD_RUN    := $(if $(filter /%,$(BUILD)),$(BUILD),./$(BUILD))

EXAMPLE_SRCS := $(wildcard examples/*.c)
EXAMPLE_BINS := $(EXAMPLE_SRCS:examples/%.c=$(BUILD)/examples/%)
FUZZ_SRCS    := $(wildcard tests/fuzz_*.c)

.PHONY: test test-all bench plot examples fuzz install uninstall clean kvattn_run_redis

MATRIX_TIER := quick
test-all: MATRIX_TIER := full
test test-all:
	@MATRIX_TIER='$(MATRIX_TIER)' CC='$(CC)' CXX='$(CXX)' CLANG='$(CLANG)' AARCH64_CC='$(AARCH64_CC)' \
	  QEMU_AARCH64='$(QEMU_AARCH64)' BUILD='$(BUILD)' JOBS='$(JOBS)' \
	  RUN_TIMEOUT='$(RUN_TIMEOUT)' MATRIX_STEPS='$(MATRIX_STEPS)' \
	  EXAMPLE_CFLAGS='$(EXAMPLE_CFLAGS)' \
	  exec bash tests/run_matrix.sh

$(BUILD) $(BUILD)/examples:
	mkdir -p $@

# ---- benchmark
# every bench/*.c is one object of build/kvattn_bench (bench/harness.h lists them); -MMD
# records each object's headers. `make bench` compiles them JOBS at a time.
BENCH_SRCS := $(wildcard bench/*.c)
BENCH_OBJS := $(BENCH_SRCS:bench/%.c=$(BUILD)/bench/%.o)

$(BUILD)/bench:
	mkdir -p $@

$(BUILD)/bench/%.o: bench/%.c kvattn.h | $(BUILD)/bench
	$(CC) $(BENCH_CFLAGS) -I. -MMD -MP -c $< -o $@

$(BUILD)/kvattn_bench: $(BENCH_OBJS) | $(BUILD)
	$(CC) $(BENCH_CFLAGS) $(BENCH_OBJS) -o $@ -lm

-include $(BENCH_OBJS:.o=.d)

bench:
	@$(MAKE) --no-print-directory -q $(BUILD)/kvattn_bench || \
	  $(MAKE) --no-print-directory -j$(JOBS) $(BUILD)/kvattn_bench
	$(BUILD_RUN)/kvattn_bench $(BENCH_ARGS)

# bench/plot.gp gets the CSV path as `datafile` and the output folder as `outdir`.
plot: $(BUILD)/kvattn_bench
	$(BUILD_RUN)/kvattn_bench plot-data $(BENCH_ARGS) > $(BENCH_CSV).tmp
	@mv $(BENCH_CSV).tmp $(BENCH_CSV)
	@echo "wrote $(BENCH_CSV)"
	@if [ ! -f bench/plot.gp ]; then \
	  echo "bench/plot.gp does not exist yet: nothing to plot"; \
	elif ! command -v gnuplot >/dev/null 2>&1; then \
	  echo "gnuplot not found: install it (apt-get install gnuplot-nox) and run 'make plot' again"; \
	else \
	  echo "gnuplot -e \"datafile='$(BENCH_CSV)'; outdir='$(BUILD)'\" bench/plot.gp"; \
	  gnuplot -e "datafile='$(BENCH_CSV)'; outdir='$(BUILD)'" bench/plot.gp && \
	  echo "plots written to $(BUILD)/"; \
	fi
	@if [ ! -f $(NEEDLE_MODEL_DIR)/model.bin ]; then \
	  echo "$(NEEDLE_MODEL_DIR)/model.bin does not exist: no needle charts"; \
	else \
	  echo "$(BUILD_RUN)/kvattn_bench quality --parts needle --csv --model-dir $(NEEDLE_MODEL_DIR)" \
	    "--tokenizer $(NEEDLE_TOKENIZER) $(NEEDLE_ARGS) > $(NEEDLE_CSV)"; \
	  $(BUILD_RUN)/kvattn_bench quality --parts needle --csv --model-dir $(NEEDLE_MODEL_DIR) \
	    --tokenizer $(NEEDLE_TOKENIZER) $(NEEDLE_ARGS) > $(NEEDLE_CSV).tmp && \
	  mv $(NEEDLE_CSV).tmp $(NEEDLE_CSV) && \
	  if command -v gnuplot >/dev/null 2>&1; then \
	    gnuplot -e "datafile='$(NEEDLE_CSV)'; outdir='$(BUILD)'" bench/plot_needle.gp && \
	    echo "needle charts written to $(BUILD)/"; \
	  fi; \
	fi

# ---- examples
examples: $(EXAMPLE_BINS)
	@if [ -z "$(EXAMPLE_SRCS)" ]; then echo "no examples/*.c yet"; fi

$(BUILD)/examples/%: examples/%.c kvattn.h | $(BUILD)/examples
	$(CC) $(EXAMPLE_CFLAGS) -I. $< -o $@ -lm

# kvattn_run: the decoder is examples/llm.h; OpenMP threads its matrix products
# when the compiler has it (it builds and runs without)
EXAMPLE_OPENMP = $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo -fopenmp)
$(BUILD)/examples/kvattn_run $(BUILD)/examples/prefill_decode: examples/llm.h
$(BUILD)/examples/kvattn_run: EXAMPLE_CFLAGS += $(EXAMPLE_OPENMP)

# kvattn_run_redis: kvattn_run with --prefix-redis (hiredis: Debian's libhiredis-dev)
kvattn_run_redis: $(BUILD)/examples/kvattn_run_redis
$(BUILD)/examples/kvattn_run_redis: examples/kvattn_run.c examples/llm.h examples/tier_dir.h \
    examples/redis/tier_redis.h kvattn.h | $(BUILD)/examples
	$(CC) $(EXAMPLE_CFLAGS) $(EXAMPLE_OPENMP) -DKVATTN_RUN_REDIS -I. -Iexamples $< -o $@ -lhiredis -lm

# ---- fuzzing (libFuzzer; clang's runtime comes with libclang-rt-14-dev on Debian 12)
# Each tests/fuzz_NAME.c defines LLVMFuzzerTestOneInput.  New inputs collect in
# build/fuzz/NAME.corpus; tests/fuzz_corpus/NAME/, if present, seeds it.
# Crashes are written to build/fuzz/.
fuzz:
	@if [ -z "$(FUZZ_SRCS)" ]; then \
	  echo "no fuzz targets yet (add tests/fuzz_NAME.c defining LLVMFuzzerTestOneInput)"; \
	  exit 0; \
	fi; \
	mkdir -p $(BUILD)/fuzz; failed=0; \
	for src in $(FUZZ_SRCS); do \
	  name=$$(basename $$src .c); \
	  echo "$(CLANG) $(FUZZ_CFLAGS) -I. -Itests $$src -o $(BUILD)/fuzz/$$name -lm"; \
	  $(CLANG) $(FUZZ_CFLAGS) -I. -Itests $$src -o $(BUILD)/fuzz/$$name -lm || { failed=1; continue; }; \
	  mkdir -p $(BUILD)/fuzz/$$name.corpus; \
	  seeds=; [ -d tests/fuzz_corpus/$$name ] && seeds=tests/fuzz_corpus/$$name; \
	  echo "== $$name: $(FUZZ_SECONDS) s"; \
	  $(BUILD_RUN)/fuzz/$$name -max_total_time=$(FUZZ_SECONDS) \
	    -artifact_prefix=$(BUILD)/fuzz/$$name- $(FUZZ_ARGS) \
	    $(BUILD)/fuzz/$$name.corpus $$seeds || failed=1; \
	done; \
	exit $$failed

# ---- install
# kvattn.h, kvattn.pc and the CMake package (kvattnConfig.cmake,
# kvattnConfigVersion.cmake), the last three from cmake/*.in with the version
# read from kvattn.h now.  The CMake package finds the header relative to
# itself (the installed tree can move); kvattn.pc names $(PREFIX).
# CMakeLists.txt (`cmake --install`) writes the same files from the same templates.
KVATTN_VERSION_PART = $(shell sed -n 's/^\#define KVATTN_VERSION_$(1)  *\([0-9][0-9]*\).*/\1/p' kvattn.h)
KVATTN_MAJOR   = $(call KVATTN_VERSION_PART,MAJOR)
KVATTN_MINOR   = $(call KVATTN_VERSION_PART,MINOR)
KVATTN_VERSION = $(KVATTN_MAJOR).$(KVATTN_MINOR).$(call KVATTN_VERSION_PART,PATCH)
# kvattn.pc's includedir: under $(PREFIX) it is written as ${prefix}/...
KVATTN_PC_INCLUDEDIR = $(if $(filter $(PREFIX)/%,$(INCLUDEDIR)),$${prefix}$(patsubst $(PREFIX)%,%,$(INCLUDEDIR)),$(INCLUDEDIR))

install:
	@case '$(KVATTN_VERSION)' in [0-9]*.[0-9]*.[0-9]*) ;; \
	  *) echo "make install: no KVATTN_VERSION_MAJOR/MINOR/PATCH numbers in kvattn.h (got '$(KVATTN_VERSION)')"; exit 1 ;; esac
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(CMAKEDIR)
	install -m 0644 kvattn.h $(DESTDIR)$(INCLUDEDIR)/kvattn.h
	sed -e 's|@KVATTN_PC_PREFIX@|$(PREFIX)|g' -e 's|@KVATTN_PC_INCLUDEDIR@|$(KVATTN_PC_INCLUDEDIR)|g' \
	  -e 's|@KVATTN_VERSION@|$(KVATTN_VERSION)|g' cmake/kvattn.pc.in > $(DESTDIR)$(PKGCONFIGDIR)/kvattn.pc
	@# the include directory as seen from the CMake package (absolute if realpath cannot say)
	inc=$$(realpath -m -s --relative-to='$(CMAKEDIR)' '$(INCLUDEDIR)' 2>/dev/null) || inc='$(INCLUDEDIR)'; \
	sed -e "s|@KVATTN_CONFIG_INCLUDEDIR@|$$inc|g" cmake/kvattnConfig.cmake.in \
	  > $(DESTDIR)$(CMAKEDIR)/kvattnConfig.cmake
	sed -e 's|@KVATTN_VERSION@|$(KVATTN_VERSION)|g' -e 's|@KVATTN_VERSION_MAJOR@|$(KVATTN_MAJOR)|g' \
	  -e 's|@KVATTN_VERSION_MINOR@|$(KVATTN_MINOR)|g' cmake/kvattnConfigVersion.cmake.in \
	  > $(DESTDIR)$(CMAKEDIR)/kvattnConfigVersion.cmake
	chmod 0644 $(DESTDIR)$(PKGCONFIGDIR)/kvattn.pc $(DESTDIR)$(CMAKEDIR)/kvattnConfig.cmake \
	  $(DESTDIR)$(CMAKEDIR)/kvattnConfigVersion.cmake
	@echo "installed kvattn $(KVATTN_VERSION) under $(DESTDIR)$(PREFIX)"

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/kvattn.h $(DESTDIR)$(PKGCONFIGDIR)/kvattn.pc \
	  $(DESTDIR)$(CMAKEDIR)/kvattnConfig.cmake $(DESTDIR)$(CMAKEDIR)/kvattnConfigVersion.cmake
	rmdir $(DESTDIR)$(CMAKEDIR) 2>/dev/null || true

clean:
	rm -rf $(BUILD)
