# kvattn - single-header C99 library.  Nothing to build for users: copy
# kvattn.h (or `make install`).  This Makefile drives tests and tools.
#
#   make test        the build/test matrix (tests/run_matrix.sh); ends with
#                    "N passed, N failed", exits non-zero if a step failed.
#                    MATRIX_STEPS='native asan*' runs only matching steps,
#                    JOBS=1 runs one step at a time.
#   make bench       build/kvattn_bench from bench/kvattn_bench.c, run with BENCH_ARGS
#   make plot        bench --csv into $(BENCH_CSV), then gnuplot bench/plot.gp
#   make examples    every examples/*.c into build/examples/
#   make fuzz        every tests/fuzz_*.c with libFuzzer for FUZZ_SECONDS each
#   make install     kvattn.h into $(DESTDIR)$(PREFIX)/include
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
JOBS         ?= $(shell nproc 2>/dev/null || echo 1)
RUN_TIMEOUT  ?= 600
MATRIX_STEPS ?=

BENCH_CFLAGS   ?= -std=c99 -O3 -march=native -fopenmp
BENCH_ARGS     ?=
BENCH_CSV      ?= $(BUILD)/bench.csv
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

.PHONY: test bench plot examples fuzz install uninstall clean

test:
	@CC='$(CC)' CXX='$(CXX)' CLANG='$(CLANG)' AARCH64_CC='$(AARCH64_CC)' \
	  QEMU_AARCH64='$(QEMU_AARCH64)' BUILD='$(BUILD)' JOBS='$(JOBS)' \
	  RUN_TIMEOUT='$(RUN_TIMEOUT)' MATRIX_STEPS='$(MATRIX_STEPS)' \
	  EXAMPLE_CFLAGS='$(EXAMPLE_CFLAGS)' \
	  exec bash tests/run_matrix.sh

$(BUILD) $(BUILD)/examples:
	mkdir -p $@

# ---- benchmark
$(BUILD)/kvattn_bench: bench/kvattn_bench.c kvattn.h $(wildcard bench/*.h) | $(BUILD)
	$(CC) $(BENCH_CFLAGS) -I. $< -o $@ -lm

bench: $(BUILD)/kvattn_bench
	$(BUILD_RUN)/kvattn_bench $(BENCH_ARGS)

# bench/plot.gp gets the CSV path as `datafile` and the output folder as `outdir`.
plot: $(BUILD)/kvattn_bench
	$(BUILD_RUN)/kvattn_bench --csv $(BENCH_ARGS) > $(BENCH_CSV).tmp
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

# ---- examples
examples: $(EXAMPLE_BINS)
	@if [ -z "$(EXAMPLE_SRCS)" ]; then echo "no examples/*.c yet"; fi

$(BUILD)/examples/%: examples/%.c kvattn.h | $(BUILD)/examples
	$(CC) $(EXAMPLE_CFLAGS) -I. $< -o $@ -lm

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
install:
	install -d $(DESTDIR)$(PREFIX)/include
	install -m 0644 kvattn.h $(DESTDIR)$(PREFIX)/include/kvattn.h

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/include/kvattn.h

clean:
	rm -rf $(BUILD)
