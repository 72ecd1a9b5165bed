#!/usr/bin/env bash
# tests/run_matrix.sh - the kvattn build/test matrix: `make test` runs its
# quick tier, `make test-all` (and CI) every step.
#
# Every step builds (and usually runs) the test program in one configuration.
# Output: a line naming the tier and an estimate of the run's time, the
# skipped steps,
#   [SKIP] name (why)    tool or CPU feature missing; counted neither way
# then one line per step the moment it ends, with its time and the progress,
#   [PASS] name   SECONDSs   DONE/TOTAL done, M:SS elapsed
#   [FAIL] name   ...        followed by the last TAIL_LINES lines of its log
# then the total time and last "N passed, N failed".
# Exit status: 0 if no step failed, else 1.  Full logs: $BUILD/logs/<step>.log
# (each starts with the exact commands it ran, so a step can be reproduced).
# Step times are kept in $BUILD/matrix-times-<tier> for the next estimate.
#
# Environment (all optional; the Makefile passes its variables through):
#   CC CXX CLANG AARCH64_CC QEMU_AARCH64   compilers / emulator
#   BUILD          output directory (build)
#   JOBS           steps run at once (number of cores)
#   RUN_TIMEOUT    seconds each test run may take (600)
#   TAIL_LINES     log lines shown for a failed step (30)
#   MATRIX_TIER    full (every step; the default) or quick (QUICK_STEPS below)
#   MATRIX_STEPS   space-separated glob patterns: run only the matching steps
#                  of the whole matrix, e.g. MATRIX_STEPS='native asan*'
#   EXAMPLE_CFLAGS flags for examples/*.c

# shellcheck disable=SC2317  # the step functions are called through `step`
# The whole script is one { ... } block: bash parses it completely before
# running it, so editing this file while a run is going does not upset that run.
{
set -u -o pipefail
shopt -s nullglob

cd "$(dirname "$0")/.." || exit 2

CC=${CC:-gcc}
CXX=${CXX:-g++}
CLANG=${CLANG:-clang}
AARCH64_CC=${AARCH64_CC:-aarch64-linux-gnu-gcc}
QEMU_AARCH64=${QEMU_AARCH64:-qemu-aarch64}
BUILD=${BUILD:-build}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 1)}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
TAIL_LINES=${TAIL_LINES:-30}
MATRIX_STEPS=${MATRIX_STEPS:-}
MATRIX_TIER=${MATRIX_TIER:-full}
EXAMPLE_CFLAGS=${EXAMPLE_CFLAGS:--std=c99 -O2 -march=native -Wall -Wextra}
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || JOBS=1
case $MATRIX_TIER in
    quick | full) ;;
    *) echo "MATRIX_TIER must be quick or full, not '$MATRIX_TIER'"; exit 2 ;;
esac

B=$BUILD/matrix
LOGS=$BUILD/logs
GEN=$BUILD/gen
mkdir -p "$BUILD" || exit 2
# one run at a time per build folder: a second `make test` in the same tree waits
if command -v flock >/dev/null 2>&1; then
    exec 9>"$BUILD/.matrix.lock"
    if ! flock -n 9; then
        echo "waiting for another test matrix run using $BUILD/ to finish ..."
        flock 9
    fi
fi
SECONDS=0
rm -rf "$B" "$LOGS"
mkdir -p "$B" "$LOGS" "$GEN" || exit 2

TEST_SRCS=(tests/test_*.c)
INC=(-I. -Itests)
HOST=$(uname -m)

have() { command -v "$1" >/dev/null 2>&1; }

# kvattn.h's AVX2 path needs AVX2, FMA and F16C (every AVX2 CPU has F16C)
AVX2_FLAGS=(-mavx2 -mfma -mf16c)
host_avx2_fma() {
    [ "$HOST" = x86_64 ] && grep -qw avx2 /proc/cpuinfo 2>/dev/null &&
        grep -qw fma /proc/cpuinfo 2>/dev/null && grep -qw f16c /proc/cpuinfo 2>/dev/null
}
# its AVX-512 path needs F, BW and VL on top
AVX512_FLAGS=("${AVX2_FLAGS[@]}" -mavx512f -mavx512bw -mavx512vl)
host_avx512() {
    host_avx2_fma && grep -qw avx512f /proc/cpuinfo 2>/dev/null &&
        grep -qw avx512bw /proc/cpuinfo 2>/dev/null && grep -qw avx512vl /proc/cpuinfo 2>/dev/null
}

# ---------------------------------------------------------------- helpers
# (used inside steps; a step's stdout+stderr go to its log)

show() { printf '+'; printf ' %q' "$@"; printf '\n'; }
x() { show "$@"; "$@"; }

# run CMD...: run a test program from the repo root with a time limit
run() {
    show "$@"
    timeout --foreground -k 10 "$RUN_TIMEOUT" "$@"
    local rc=$?
    if [ "$rc" -eq 124 ]; then
        echo "*** TIMEOUT: killed after ${RUN_TIMEOUT}s"
    elif [ "$rc" -gt 128 ]; then
        echo "*** killed by signal $((rc - 128)) (exit status $rc)"
    elif [ "$rc" -ne 0 ]; then
        echo "*** exit status $rc"
    fi
    return "$rc"
}

need_tests() {
    if [ ${#TEST_SRCS[@]} -eq 0 ]; then
        echo "*** no test sources: tests/test_*.c matched nothing"
        return 1
    fi
}

need_header() {
    if [ ! -f kvattn.h ]; then
        echo "*** kvattn.h does not exist"
        return 1
    fi
}

# build_tests DIR COMPILER FLAGS...: the whole test program -> DIR/kvattn_test
build_tests() {
    local d=$B/$1; shift
    need_header && need_tests || return 1
    mkdir -p "$d"
    x "$@" "${INC[@]}" "${TEST_SRCS[@]}" -o "$d/kvattn_test" -lm
}

# The sanitizer builds compile the library once, not once per test file:
# kvattn.h's one-copy mode (tests/one_copy_impl.c defines every function,
# the test files include the header with KVATTN_DECLARATIONS_ONLY), which
# makes the instrumented kernels cost one compile instead of a dozen.  The
# test files that define configuration macros before including the header,
# or call its internal kva__ functions, keep their own copy as usual.
# Objects go to $B/obj/<hash of the compiler and flags>/ and are shared by
# the steps that build with the same flags (one builds, the others wait on
# its lock and reuse the object).
OWN_COPY_SRCS=(tests/test_attend.c tests/test_batch.c tests/test_paged.c tests/test_paged_weak.c
               tests/test_iscores.c tests/test_ivalues.c tests/test_select.c tests/test_kernels.c tests/test_rotate.c
               tests/test_seqio.c tests/test_tier.c)
own_copy() {
    local s
    for s in "${OWN_COPY_SRCS[@]}"; do [ "$s" = "$1" ] && return 0; done
    return 1
}

# shared_obj OUT_VAR SRC COMPILER FLAGS...: compile SRC once per flag set; OUT_VAR gets the object
shared_obj() {
    local -n so_out=$1
    local so_src=$2 so_dir so_obj
    shift 2
    so_dir=$B/obj/$(printf '%s\n' "$@" | md5sum | cut -c1-12)
    so_obj=$so_dir/$(basename "$so_src" .c).o
    mkdir -p "$so_dir" || return 1
    (
        flock 8 2>/dev/null || true
        if [ -f "$so_obj" ]; then
            echo "(shared object $so_obj: built by another step with these flags)"
        else
            x "$@" -c "$so_src" -o "$so_obj.tmp" && mv "$so_obj.tmp" "$so_obj"
        fi
    ) 8>"$so_obj.lock" || return 1
    so_out=$so_obj
}

# build_tests_one_copy DIR COMPILER FLAGS... [-- SOURCES...]: the test
# program (every test source, or SOURCES) in one-copy mode -> DIR/kvattn_test;
# tests/test_main.c (which picks the sections) also gets MAIN_DEFS
MAIN_DEFS=()
build_tests_one_copy() {
    local d=$B/$1 cc=() srcs=() objs=() src obj
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do cc+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    srcs=("$@")
    [ ${#srcs[@]} -eq 0 ] && srcs=("${TEST_SRCS[@]}")
    need_header && need_tests || return 1
    mkdir -p "$d"
    shared_obj obj tests/one_copy_impl.c "${cc[@]}" "${INC[@]}" || return 1
    objs+=("$obj")
    for src in "${srcs[@]}"; do
        if own_copy "$src"; then
            shared_obj obj "$src" "${cc[@]}" "${INC[@]}" || return 1
        elif grep -qE '^#define KVATTN_[A-Z_]+[ (]|kva__' "$src"; then
            # compiled without the implementation it would not test what it says
            echo "*** $src configures kvattn.h or calls its internals: add it to OWN_COPY_SRCS"
            return 1
        elif [ "$src" = tests/test_main.c ]; then
            shared_obj obj "$src" "${cc[@]}" "${MAIN_DEFS[@]}" -DKVATTN_DECLARATIONS_ONLY "${INC[@]}" || return 1
        else
            shared_obj obj "$src" "${cc[@]}" -DKVATTN_DECLARATIONS_ONLY "${INC[@]}" || return 1
        fi
        objs+=("$obj")
    done
    x "${cc[@]}" "${objs[@]}" -o "$d/kvattn_test" -lm
}

# --------------------------------------------------- generated header TU
# kvattn.h alone (first include, so it must be self-contained), included
# twice (include guard), with the contract's signatures checked through
# typed pointers (a mismatch is an incompatible-pointer diagnostic, an error
# under -Werror).  External-linkage pointers force every API function to be
# emitted, which the no-openmp step inspects with nm.  Prints kva_simd_name().
cat >"$GEN/header_tu.c" <<'EOF'
/* generated by tests/run_matrix.sh - do not edit */
#include "kvattn.h"
#include "kvattn.h"

#include <stdio.h>

const char *(*kvm_status_str)(kva_status) = kva_status_str;
const char *(*kvm_simd_name)(void) = kva_simd_name;
float (*kvm_f16_to_f32)(uint16_t) = kva_f16_to_f32;
uint16_t (*kvm_f32_to_f16)(float) = kva_f32_to_f16;
float (*kvm_bf16_to_f32)(uint16_t) = kva_bf16_to_f32;
uint16_t (*kvm_f32_to_bf16)(float) = kva_f32_to_bf16;
float (*kvm_e4m3_to_f32)(uint8_t) = kva_e4m3_to_f32;
uint8_t (*kvm_f32_to_e4m3)(float) = kva_f32_to_e4m3;
float (*kvm_e5m2_to_f32)(uint8_t) = kva_e5m2_to_f32;
uint8_t (*kvm_f32_to_e5m2)(float) = kva_f32_to_e5m2;
kva_status (*kvm_attend)(const kva_attn *, const float *, int, const int32_t *,
                         const float *, const float *, int, const int32_t *,
                         float *, float *) = kva_attend;
kva_status (*kvm_rope_apply)(const kva_rope *, float *, int, int, int,
                             const int32_t *) = kva_rope_apply;
kva_status (*kvm_cache_create)(const kva_cache_desc *, kva_cache **) = kva_cache_create;
void (*kvm_cache_destroy)(kva_cache *) = kva_cache_destroy;
size_t (*kvm_cache_bytes_per_token)(const kva_cache_desc *) = kva_cache_bytes_per_token;
kva_status (*kvm_seq_new)(kva_cache *, int *) = kva_seq_new;
kva_status (*kvm_seq_fork)(kva_cache *, int, int *) = kva_seq_fork;
kva_status (*kvm_seq_free)(kva_cache *, int) = kva_seq_free;
kva_status (*kvm_seq_append)(kva_cache *, int, int) = kva_seq_append;
int (*kvm_seq_len)(const kva_cache *, int) = kva_seq_len;
int (*kvm_seq_pos)(const kva_cache *, int) = kva_seq_pos;
kva_status (*kvm_seq_truncate)(kva_cache *, int, int) = kva_seq_truncate;
kva_fit (*kvm_seq_fits)(const kva_cache *, int, int, int *) = kva_seq_fits;
kva_status (*kvm_store)(kva_cache *, int, int, const float *, const float *,
                        int) = kva_store;
kva_status (*kvm_attend_cache)(kva_cache *, int, int, const kva_attn *,
                               const float *, int, float *) = kva_attend_cache;
kva_status (*kvm_seq_read)(const kva_cache *, int, int, int, float *, float *,
                           int32_t *) = kva_seq_read;
kva_status (*kvm_seq_new_prefix)(kva_cache *, const int32_t *, int, uint64_t,
                                 int *, int *) = kva_seq_new_prefix;
kva_status (*kvm_seq_publish)(kva_cache *, int, const int32_t *, int,
                              uint64_t) = kva_seq_publish;
kva_status (*kvm_cache_reset_prefix)(kva_cache *) = kva_cache_reset_prefix;
kva_status (*kvm_seq_set_evict)(kva_cache *, int, const kva_evict *) = kva_seq_set_evict;
void (*kvm_cache_get_stats)(const kva_cache *, kva_cache_stats *) = kva_cache_get_stats;
kva_status (*kvm_gqa_forward)(const kva_gqa_layer *, kva_cache *, int, int,
                              const float *, int, float *) = kva_gqa_forward;
kva_status (*kvm_mla_forward)(const kva_mla_layer *, kva_cache *, int, int,
                              const float *, int, float *) = kva_mla_forward;

int main(void) {
    puts(kvm_simd_name());
    return 0;
}
EOF
HEADER_TU=$GEN/header_tu.c

# ---------------------------------------------------------------- steps

# native kernels with OpenMP on two threads (the other builds run without it):
# one build serves both, the suite is about as long to compile as to run
s_native() {
    build_tests native "$CC" -std=c99 -O2 -march=native -fopenmp &&
        run env OMP_NUM_THREADS=2 "$B/native/kvattn_test"
}

# The forced-ISA builds compile the library once (one-copy mode, as the
# sanitizer builds): the same kernels under test, a fraction of the compile;
# native, avx512 and cxx keep a static inline copy per test file.
s_scalar() {
    build_tests_one_copy scalar "$CC" -std=c99 -O2 -march=native -DKVATTN_SIMD=KVA_SIMD_SCALAR &&
        run "$B/scalar/kvattn_test"
}

s_avx2() {
    build_tests_one_copy avx2 "$CC" -std=c99 -O2 "${AVX2_FLAGS[@]}" -DKVATTN_SIMD=KVA_SIMD_AVX2 &&
        run "$B/avx2/kvattn_test"
}
s_avx512() {
    build_tests avx512 "$CC" -std=c99 -O2 "${AVX512_FLAGS[@]}" -DKVATTN_SIMD=KVA_SIMD_AVX512 &&
        run "$B/avx512/kvattn_test"
}

# shellcheck disable=SC2054  # commas belong to the flag
# the header's internal invariants (KVATTN_ASSERT) are checked in the sanitizer builds: a broken one traps
ASSERT_ON='-DKVATTN_ASSERT(x)=((x) ? (void)0 : __builtin_trap())'
SAN=(-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all "$ASSERT_ON")
SAN_ENV=(ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
         UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)

# baseline x86-64 (or whatever the compiler defaults to): the portable path,
# every section; the quick tier runs them at the quick sizes
s_asan_ubsan() {
    local quick=()
    [ "$MATRIX_TIER" = quick ] && quick=(KVA_TEST_QUICK=1)
    build_tests_one_copy asan-ubsan "$CC" -std=c99 "${SAN[@]}" &&
        run env "${SAN_ENV[@]}" "${quick[@]}" "$B/asan-ubsan/kvattn_test"
}

# the SIMD path the host can run, where out-of-bounds vector loads would be
# (the baseline build above runs every section at full size);
# sanitizers make this the slowest step of the matrix, compiling more than
# running: the sections that run the vector kernels, at the quick sizes
VECTOR_SRCS=(tests/test_main.c tests/test_numerics.c tests/test_attend.c tests/test_cache.c tests/test_mla.c
             tests/test_gqa.c tests/test_quant.c tests/test_fp8bulk.c tests/test_batch.c tests/test_kernels.c
             tests/test_strided.c tests/test_int4.c tests/test_iscores.c tests/test_ivalues.c tests/test_select.c)
s_asan_ubsan_native() {
    local d=$B/asan-ubsan-native
    need_header && need_tests || return 1
    mkdir -p "$d"
    MAIN_DEFS=(-DKT_VECTOR_SECTIONS)
    build_tests_one_copy asan-ubsan-native "$CC" -std=c99 -march=native "${SAN[@]}" -- "${VECTOR_SRCS[@]}" &&
        run env "${SAN_ENV[@]}" KVA_TEST_QUICK=1 "$d/kvattn_test"
}

s_cxx() {
    mkdir -p "$B/cxx"
    echo "== kvattn.h alone under the engine warning set"
    x "$CXX" -x c++ -std=c++11 -O2 -march=native -Wall -Wextra -Werror -pedantic "${ENGINE_WARN[@]}" \
        "${ENGINE_WARN_CXX[@]}" "${INC[@]}" -c "$HEADER_TU" -o "$B/cxx/header_tu.o" &&
    build_tests cxx "$CXX" -x c++ -std=c++11 -O2 -march=native -Wall -Wextra -Werror &&
        run "$B/cxx/kvattn_test"
}

# no -O: these steps are about the language (C99, pedantic) and are cheap at
# -O0; flow-based warnings at -O2 are covered by the cxx step's -Werror.
WARN=(-std=c99 -Wall -Wextra -Werror -pedantic)
# what engines add (llama.cpp's C and C++ sets, plus -Wconversion): kvattn.h
# itself must be clean under them; the tests need not be.
ENGINE_WARN=(-Wcast-qual -Wshadow -Wpointer-arith -Wdouble-promotion -Wconversion -Wsign-conversion -Wundef)
ENGINE_WARN_C=(-Wstrict-prototypes -Wmissing-prototypes)
ENGINE_WARN_CXX=(-Wmissing-declarations)

# warn_variants DIR COMPILER [LABEL FLAGS]... : compile the header TU and the
# whole test program for each variant; go on past failures, list them last.
warn_variants() {
    local d=$B/$1 cc=$2 failed=() label flags
    shift 2
    need_header && need_tests || return 1
    mkdir -p "$d"
    while [ $# -ge 2 ]; do
        label=$1 flags=$2
        shift 2
        echo "== $cc $label: kvattn.h alone"
        # shellcheck disable=SC2086  # flags is a word list
        x "$cc" "${WARN[@]}" "${ENGINE_WARN[@]}" "${ENGINE_WARN_C[@]}" -O2 $flags "${INC[@]}" \
            -c "$HEADER_TU" -o "$d/header_$label.o" || failed+=("$label: kvattn.h alone")
        # the test sources through the front end only (their warnings at -O0 are
        # all front-end ones; the other steps build and link them)
        echo "== $cc $label: test program"
        # shellcheck disable=SC2086
        x "$cc" "${WARN[@]}" $flags "${INC[@]}" -fsyntax-only "${TEST_SRCS[@]}" ||
            failed+=("$label: test program")
    done
    if [ ${#failed[@]} -gt 0 ]; then
        printf '*** failed: %s\n' "${failed[@]}"
        return 1
    fi
}

s_warnings_gcc() {
    warn_variants warnings-gcc "$CC" \
        native "-march=native" \
        scalar "-march=native -DKVATTN_SIMD=KVA_SIMD_SCALAR" \
        openmp "-march=native -fopenmp"
}

s_warnings_clang() {
    warn_variants warnings-clang "$CLANG" \
        native "-march=native" \
        scalar "-march=native -DKVATTN_SIMD=KVA_SIMD_SCALAR"
}

s_warnings_aarch64() {
    warn_variants warnings-aarch64 "$AARCH64_CC" \
        neon "" \
        scalar "-DKVATTN_SIMD=KVA_SIMD_SCALAR"
}

# KVATTN_NO_OPENMP under -fopenmp: kvattn.h builds cleanly (-Werror) and no
# API function references the OpenMP runtime.
s_no_openmp() {
    local d=$B/no-openmp refs
    need_header || return 1
    mkdir -p "$d"
    x "$CC" "${WARN[@]}" -march=native -fopenmp -DKVATTN_NO_OPENMP "${INC[@]}" \
        -c "$HEADER_TU" -o "$d/header_tu.o" || return 1
    show nm -u "$d/header_tu.o"
    refs=$(nm -u "$d/header_tu.o" | grep -E 'GOMP_|omp_')
    if [ -n "$refs" ]; then
        echo "*** with -DKVATTN_NO_OPENMP the API still references the OpenMP runtime:"
        echo "$refs"
        return 1
    fi
    echo "no OpenMP runtime references: ok"
}

# kva_simd_name() must report the path each configuration asks for, so that
# the matrix really tests what its step names say; forcing a path the
# compiler cannot target must be an #error.
s_simd_select() {
    local d=$B/simd-select bad=0 native_expect
    need_header || return 1
    mkdir -p "$d"

    expect_name() {  # LABEL EXPECTED RUNNER COMPILER FLAGS...
        local label=$1 want=$2 runner=$3 got
        shift 3
        echo "== $label: expect kva_simd_name() == \"$want\""
        x "$@" -std=c99 -O2 "${INC[@]}" "$HEADER_TU" -o "$d/$label" -lm || { bad=1; return; }
        if [ -n "$runner" ]; then
            got=$(timeout 120 "$runner" "$d/$label")
        else
            got=$(timeout 120 "$d/$label")
        fi
        if [ "$got" = "$want" ]; then
            echo "   got \"$got\": ok"
        else
            echo "*** $label: kva_simd_name() returned \"$got\", expected \"$want\""
            bad=1
        fi
    }
    expect_error() {  # LABEL COMPILER FLAGS...
        local label=$1 err
        shift
        echo "== $label: expect an #error"
        show "$@" -std=c99 "${INC[@]}" -c "$HEADER_TU" -o "$d/$label.o"
        if err=$("$@" -std=c99 "${INC[@]}" -c "$HEADER_TU" -o "$d/$label.o" 2>&1); then
            echo "*** $label: compiled, but forcing a path the compiler cannot target must be an #error"
            bad=1
        elif grep -q '#error' <<<"$err"; then
            grep '#error' <<<"$err" | head -3
            echo "   failed with #error: ok"
        else
            echo "$err" | tail -15
            echo "*** $label: failed, but not with an #error"
            bad=1
        fi
    }

    case $HOST in
        x86_64)
            if host_avx512; then native_expect=avx512
            elif host_avx2_fma; then native_expect=avx2
            else native_expect=scalar; fi
            expect_name x86-native "$native_expect" "" "$CC" -march=native
            expect_name x86-forced-scalar scalar "" "$CC" -march=native -DKVATTN_SIMD=KVA_SIMD_SCALAR
            if host_avx2_fma; then
                expect_name x86-avx2-flags avx2 "" "$CC" "${AVX2_FLAGS[@]}"
                expect_name x86-forced-avx2 avx2 "" "$CC" "${AVX2_FLAGS[@]}" -DKVATTN_SIMD=KVA_SIMD_AVX2
                expect_error x86-avx2-forced-avx512 "$CC" "${AVX2_FLAGS[@]}" -DKVATTN_SIMD=KVA_SIMD_AVX512
            fi
            if host_avx512; then
                expect_name x86-avx512-flags avx512 "" "$CC" "${AVX512_FLAGS[@]}"
                expect_name x86-forced-avx512 avx512 "" "$CC" "${AVX512_FLAGS[@]}" -DKVATTN_SIMD=KVA_SIMD_AVX512
                expect_name x86-avx512-forced-avx2 avx2 "" "$CC" "${AVX512_FLAGS[@]}" -DKVATTN_SIMD=KVA_SIMD_AVX2
            fi
            expect_error x86-forced-neon "$CC" -DKVATTN_SIMD=KVA_SIMD_NEON
            ;;
        aarch64)
            expect_name arm-native neon "" "$CC"
            expect_name arm-forced-scalar scalar "" "$CC" -DKVATTN_SIMD=KVA_SIMD_SCALAR
            expect_error arm-forced-avx2 "$CC" -DKVATTN_SIMD=KVA_SIMD_AVX2
            ;;
        *)
            expect_name forced-scalar scalar "" "$CC" -DKVATTN_SIMD=KVA_SIMD_SCALAR
            ;;
    esac
    if [ "$HOST" != aarch64 ] && have "$AARCH64_CC" && have "$QEMU_AARCH64"; then
        expect_name aarch64-default neon "$QEMU_AARCH64" "$AARCH64_CC" -static
        expect_name aarch64-forced-scalar scalar "$QEMU_AARCH64" "$AARCH64_CC" -static \
            -DKVATTN_SIMD=KVA_SIMD_SCALAR
        expect_error aarch64-forced-avx2 "$AARCH64_CC" -DKVATTN_SIMD=KVA_SIMD_AVX2
        expect_error aarch64-forced-avx512 "$AARCH64_CC" -DKVATTN_SIMD=KVA_SIMD_AVX512
    fi
    return "$bad"
}

# two translation units including kvattn.h, linked into one program:
# at -O0 (nothing inlined) and at -O2 with the SIMD and OpenMP paths.
s_two_tu() {
    local d=$B/two-tu
    need_header || return 1
    mkdir -p "$d"
    x "$CC" -std=c99 -O0 -Wall -Wextra "${INC[@]}" tests/two_tu_a.c tests/two_tu_b.c \
        -o "$d/two_tu_O0" -lm &&
        run "$d/two_tu_O0" &&
        x "$CC" -std=c99 -O2 -march=native -fopenmp -Wall -Wextra "${INC[@]}" \
            tests/two_tu_a.c tests/two_tu_b.c -o "$d/two_tu_O2" -lm &&
        run env OMP_NUM_THREADS=2 "$d/two_tu_O2"
}

# one compiled copy (stb-style): two_tu_a.c and two_tu_b.c with
# KVATTN_DECLARATIONS_ONLY define no kva_* function; tests/one_copy_impl.c
# (KVATTN_IMPLEMENTATION) defines every public one; linked, the program runs.
# As C and as C++ (extern "C": the same symbols).
s_one_copy() {
    local d=$B/one-copy lang n_api n
    need_header || return 1
    mkdir -p "$d"
    # the prototypes of the header's "API at a glance" block
    n_api=$(awk '/API at a glance/ { on = 1 } /^#if !defined\(KVATTN_DECLARATIONS_ONLY\)/ { on = 0 }
                 on && /^KVA_API / { n++ } END { print n + 0 }' kvattn.h)
    for lang in c c++; do
        local cc=("$CC" -std=c99)
        [ "$lang" = c++ ] && cc=("$CXX" -x c++ -std=c++11)
        x "${cc[@]}" -O2 -Wall -Wextra -Werror -pedantic -DKVATTN_DECLARATIONS_ONLY "${INC[@]}" -c tests/two_tu_a.c \
            -o "$d/a_$lang.o" &&
            x "${cc[@]}" -O2 -Wall -Wextra -Werror -pedantic -DKVATTN_DECLARATIONS_ONLY "${INC[@]}" -c tests/two_tu_b.c \
                -o "$d/b_$lang.o" &&
            x "${cc[@]}" -O2 -march=native -Wall -Wextra -Werror -pedantic "${INC[@]}" -c tests/one_copy_impl.c \
                -o "$d/impl_$lang.o" &&
            x "$CXX" "$d/a_$lang.o" "$d/b_$lang.o" "$d/impl_$lang.o" -o "$d/one_copy_$lang" -lm || return 1
        n=$(nm "$d/a_$lang.o" "$d/b_$lang.o" | grep -c ' T kva_')
        echo "declarations-only objects ($lang): $n kva_* definitions (want 0)"
        [ "$n" -eq 0 ] || return 1
        n=$(nm "$d/impl_$lang.o" | grep -c ' T kva_')
        echo "implementation object ($lang): $n kva_* definitions (want $n_api, the prototypes of kvattn.h)"
        [ "$n" -eq "$n_api" ] || return 1
        run "$d/one_copy_$lang" || return 1
    done
}

# NEON with the dot-product extension (SDOT for integer scores; qemu's "max"
# CPU has it), then the kernel sections again without it (widening multiplies)
s_neon() {
    if [ "$HOST" = aarch64 ]; then   # native aarch64 host: no emulator needed
        build_tests neon "$CC" -std=c99 -O2 && run "$B/neon/kvattn_test"
    else
        build_tests_one_copy neon "$AARCH64_CC" -std=c99 -O2 -static -march=armv8.2-a+dotprod &&
            run env KVA_TEST_QUICK=1 QEMU_CPU=max "$QEMU_AARCH64" "$B/neon/kvattn_test" || return 1
        mkdir -p "$B/neon-nodot"
        x "$AARCH64_CC" -std=c99 -O2 -static -DKT_ISA_SECTIONS "${INC[@]}" tests/test_main.c tests/test_kernels.c \
            tests/test_iscores.c tests/test_ivalues.c tests/test_select.c -o "$B/neon-nodot/kvattn_test" -lm &&
            run env KVA_TEST_QUICK=1 "$QEMU_AARCH64" "$B/neon-nodot/kvattn_test"
    fi
}

# compile only: the scalar twin builds for aarch64 too
s_aarch64_scalar() {
    build_tests_one_copy aarch64-scalar "$AARCH64_CC" -std=c99 -O2 -static -DKVATTN_SIMD=KVA_SIMD_SCALAR
}

s_example() {
    local src=$1 name
    name=$(basename "$src" .c)
    need_header || return 1
    mkdir -p "$BUILD/examples"
    # shellcheck disable=SC2086  # EXAMPLE_CFLAGS is a word list
    x "$CC" $EXAMPLE_CFLAGS -I. "$src" -o "$BUILD/examples/$name" -lm || return 1
    if [ "$name" = kvattn_run ]; then   # needs a model: here its --help; model steps run it for real
        run "$BUILD/examples/$name" --help >/dev/null
    else
        run "$BUILD/examples/$name"
    fi
}

# the directory prefix tier under concurrent and crashed writers (tests/tier_dir.sh)
s_tier_dir() {
    need_header || return 1
    mkdir -p "$BUILD/examples"
    # shellcheck disable=SC2086  # EXAMPLE_CFLAGS is a word list
    x "$CC" $EXAMPLE_CFLAGS -I. examples/prefix_tier.c -o "$BUILD/examples/prefix_tier_dir" -lm || return 1
    run bash tests/tier_dir.sh "$BUILD/examples/prefix_tier_dir"
}

# two processes share prefix blocks through a Redis server the script starts
# and stops (examples/redis/prefix_redis.c, tests/redis_tier.sh); a restart
# of kvattn_run --serve --prefix-redis starts warm
s_redis() {
    need_header || return 1
    mkdir -p "$BUILD/examples"
    x "$CC" -std=c99 -O2 -Wall -Wextra -Werror -Iexamples -I. examples/redis/prefix_redis.c \
        -o "$BUILD/examples/prefix_redis" -lhiredis -lm || return 1
    x "$CC" -std=c99 -O2 -Wall -Wextra -Werror -Iexamples -I. examples/redis/prefix_ttft.c \
        -o "$BUILD/examples/prefix_ttft" -lhiredis -lm || return 1   # a figure, run by hand (README)
    x "$CC" -std=c99 -O2 -Wall -Wextra -Werror -pedantic -DKVATTN_RUN_REDIS -I. -Iexamples examples/kvattn_run.c \
        -o "$BUILD/examples/kvattn_run_redis" -lhiredis -lm || return 1
    run bash tests/redis_tier.sh "$BUILD/examples/prefix_redis" "$BUILD/examples/kvattn_run_redis" bench/model
}

# the bench builds warning-free and its quick summary runs with every check passing
s_bench_smoke() {
    local out
    need_header || return 1
    mkdir -p "$BUILD/bench"
    x "$CC" -std=c99 -O2 -march=native -fopenmp -Wall -Wextra -Werror -pedantic -I. bench/*.c \
        -o "$BUILD/bench/kvattn_bench" -lm || return 1
    show "$BUILD/bench/kvattn_bench" --quick
    out=$("$BUILD/bench/kvattn_bench" --quick 2>"$BUILD/bench/quick.err") ||
        { echo "$out" | tail -20; tail -5 "$BUILD/bench/quick.err"; return 1; }
    echo "$out" | tail -5
    grep -q 'all checks passed' <<<"$out" || { echo "*** no 'all checks passed' line"; return 1; }
    # the summary (what make bench prints) fits one screen: 80 lines of 100 columns
    awk '{ if (length($0) > w) w = length($0) } END { print NR " lines, widest " w " columns";
                                                     exit !(NR <= 80 && w <= 100) }' <<<"$out" ||
        { echo "*** the summary does not fit 80 lines of 100 columns (--full is for the rest)"; return 1; }
    x "$BUILD/bench/kvattn_bench" memory --quick --csv >/dev/null || return 1
    # layer groups: the hybrid cache's decode equals the masked full cache's bit for bit
    out=$("$BUILD/bench/kvattn_bench" paged --parts hybrid --quick --quiet 2>&1) || { echo "$out" | tail -20; return 1; }
    grep -q 'all checks passed' <<<"$out" || { echo "*** paged hybrid: no 'all checks passed' line"; return 1; }
    # the trained model of bench/model/: every KV-cache configuration over 2 windows and 3 passkey
    # cases; the part's own checks (f32 run twice bit-identical: KL 0; f16 KL < 1e-3; losses finite;
    # bytes per token; eviction budgets) must pass
    show "$BUILD/bench/kvattn_bench" quality --parts model --quick --quiet
    out=$("$BUILD/bench/kvattn_bench" quality --parts model --quick --quiet 2>&1) || { echo "$out" | tail -30; return 1; }
    grep -E '^(storage +f32 |model part checks)' <<<"$out"
    grep -q '^model part checks: passed' <<<"$out" || { echo "*** no 'model part checks: passed' line"; return 1; }
    # the needle part on cases it makes from a text (the prose model cannot retrieve, so this checks
    # the machinery: every configuration runs every case, one line each in both tables)
    show "$BUILD/bench/kvattn_bench" quality --parts needle --model-dir bench/model --text \
        bench/model/heldout.txt --quick --quiet
    out=$("$BUILD/bench/kvattn_bench" quality --parts needle --model-dir bench/model --text \
        bench/model/heldout.txt --quick --quiet 2>&1) || { echo "$out" | tail -30; return 1; }
    grep -E '^  (single key|multi-key|f32 ) ' <<<"$out"
    [ "$(grep -cE '^  (f32|int4 rotated K|H2O 50% \(4 sinks\)) +[0-9.]+ \|' <<<"$out")" = 6 ] ||
        { echo "*** needle: want the f32, int4 rotated K and H2O 50% rows in both tables"; return 1; }
    ! grep -q 'ERROR' <<<"$out" || { echo "*** needle: an ERROR row"; return 1; }
}

# the repository stands on its own: no reference to a file it does not have
# (or to machine paths), docs/API.md names every public name of kvattn.h, and
# the examples in docs/API.md build and run (tests/check_repo.sh says how)
s_repo_check() {
    need_header || return 1
    x env CC="$CC" CXX="$CXX" bash tests/check_repo.sh
}

# every command of README.md's sh blocks runs as written from the repository
# root, in a copy of it (tests/readme_commands.sh says which it leaves to other steps)
s_readme_commands() {
    need_header || return 1
    x bash tests/readme_commands.sh
}

# ---- consumers: kvattn used from another project, as users get it: installed
# (CMake package, pkg-config) and as a CMake subproject.  tests/consumer/
# checks that it got the header the build system promised (version, include
# directory), OpenMP as asked, and a small cache's results (C and C++).

# an absolute path (the consumer builds run from other directories)
abs_path() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

# the version in kvattn.h, read here independently of the Makefile and CMakeLists.txt
header_version() { sed -n 's/^#define KVATTN_VERSION_STRING "\([^"]*\)".*/\1/p' kvattn.h; }

# make install / uninstall from a clean environment (no variables of an outer make)
make_clean_env() { x env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL "${MAKE:-make}" --no-print-directory "$@"; }

# cmake_consumer BUILDDIR CMAKE_ARGS...: configure, build and run tests/consumer
CONSUMER_WARN='-Wall -Wextra -Werror'
cmake_consumer() {
    local d=$1
    shift
    x cmake -S tests/consumer -B "$d" -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
        -DCMAKE_C_FLAGS="$CONSUMER_WARN" -DCMAKE_CXX_FLAGS="$CONSUMER_WARN" \
        -DKVATTN_EXPECT_VERSION="$(header_version)" "$@" &&
        x cmake --build "$d" &&
        run "$d/consumer_c" && run "$d/consumer_cpp"
}

# make install into a staged prefix (DESTDIR, so the package must find its
# header relative to itself), cmake --install must write the same files, a
# consumer finds the package (without, and with the OpenMP component), and
# make uninstall leaves no file behind.
s_consumer_cmake_installed() {
    local d prefix=/opt/kvattn left
    d=$(abs_path "$B/consumer-cmake-installed")
    need_header || return 1
    rm -rf "$d" && mkdir -p "$d" || return 1
    make_clean_env install DESTDIR="$d/stage" PREFIX="$prefix" || return 1
    x find "$d/stage" -type f
    echo "== cmake --install must write the same files"
    x cmake -S . -B "$d/top" -DCMAKE_C_COMPILER="$CC" -DCMAKE_INSTALL_PREFIX="$prefix" \
        -DCMAKE_INSTALL_LIBDIR=lib &&
        x env DESTDIR="$d/cstage" cmake --install "$d/top" &&
        x diff -r "$d/stage" "$d/cstage" || return 1
    echo "== find_package(kvattn) from the make install tree"
    cmake_consumer "$d/consumer" -DKVATTN_CONSUMER=package -DCMAKE_PREFIX_PATH="$d/stage$prefix" \
        -DKVATTN_EXPECT_INCLUDEDIR="$d/stage$prefix/include" || return 1
    echo "== find_package(kvattn COMPONENTS OpenMP) from the cmake --install tree"
    cmake_consumer "$d/consumer-omp" -DKVATTN_CONSUMER=package -DKVATTN_OPENMP=ON \
        -DCMAKE_PREFIX_PATH="$d/cstage$prefix" -DKVATTN_EXPECT_INCLUDEDIR="$d/cstage$prefix/include" || return 1
    echo "== make uninstall"
    make_clean_env uninstall DESTDIR="$d/stage" PREFIX="$prefix" || return 1
    left=$(find "$d/stage" -type f)
    if [ -n "$left" ]; then
        echo "*** make uninstall left files behind:"
        echo "$left"
        return 1
    fi
    echo "no file left: ok"
}

# add_subdirectory(kvattn) with KVATTN_OPENMP=ON, and FetchContent without
s_consumer_cmake_subdir() {
    local d src
    d=$(abs_path "$B/consumer-cmake-subdir")
    src=$(abs_path .)
    need_header || return 1
    rm -rf "$d" && mkdir -p "$d" || return 1
    echo "== add_subdirectory, KVATTN_OPENMP=ON"
    cmake_consumer "$d/subdir" -DKVATTN_CONSUMER=subdir -DKVATTN_SOURCE_DIR="$src" -DKVATTN_OPENMP=ON \
        -DKVATTN_EXPECT_INCLUDEDIR="$src" || return 1
    echo "== FetchContent"
    cmake_consumer "$d/fetch" -DKVATTN_CONSUMER=fetch -DKVATTN_SOURCE_DIR="$src" \
        -DKVATTN_EXPECT_INCLUDEDIR="$src"
}

# make install PREFIX=..., then the consumer built with pkg-config's flags alone
s_consumer_pkgconfig() {
    local d got want
    d=$(abs_path "$B/consumer-pkgconfig")
    need_header || return 1
    rm -rf "$d" && mkdir -p "$d" || return 1
    make_clean_env install PREFIX="$d/prefix" || return 1
    export PKG_CONFIG_PATH=$d/prefix/lib/pkgconfig
    echo "PKG_CONFIG_PATH=$PKG_CONFIG_PATH"
    want=$(header_version)
    got=$(pkg-config --modversion kvattn) || return 1
    [ "$got" = "$want" ] || { echo "*** pkg-config --modversion kvattn: '$got', kvattn.h says '$want'"; return 1; }
    got=$(pkg-config --variable=includedir kvattn)
    [ "$got" = "$d/prefix/include" ] ||
        { echo "*** pkg-config's includedir is '$got', expected $d/prefix/include"; return 1; }
    echo "pkg-config: kvattn $want, $(pkg-config --cflags --libs kvattn)"
    # shellcheck disable=SC2046,SC2086  # pkg-config's output and CONSUMER_WARN are word lists
    x "$CC" -std=c99 -O2 $CONSUMER_WARN $(pkg-config --cflags kvattn) -DKVATTN_PKG_VERSION="\"$want\"" \
        -DKVATTN_EXPECT_OPENMP=0 tests/consumer/main.c -o "$d/consumer_c" $(pkg-config --libs kvattn) &&
        run "$d/consumer_c" &&
        x "$CXX" -std=c++11 -O2 -fopenmp $CONSUMER_WARN $(pkg-config --cflags kvattn) \
            -DKVATTN_PKG_VERSION="\"$want\"" -DKVATTN_EXPECT_OPENMP=1 tests/consumer/main.cpp \
            -o "$d/consumer_cpp" $(pkg-config --libs kvattn) &&
        run env OMP_NUM_THREADS=2 "$d/consumer_cpp"
}

# examples/kvattn_run.c (the llama2.c-format inference program) against
# tests/model_check.c's double-precision reference: random GQA/MHA/MQA
# checkpoints, quantized caches, --serve, --ppl, bad input, and the trained
# models when they are there: bench/model/ (prose) and bench/retrieval/ (its
# logits, and 8 of the first 10 needle cases answered: the quick needle
# pass).  model: built with OpenMP (so --threads 2 runs 2 threads);
# model-asan: without, under ASan+UBSan, every bad input and random model,
# the prose model's logits only (--quick).
s_model() {
    local d=$B/model
    need_header || return 1
    mkdir -p "$d"
    x "$CC" -std=c99 -O2 -march=native -fopenmp -Wall -Wextra -I. examples/kvattn_run.c -o "$d/kvattn_run" -lm &&
        x "$CC" -std=c99 -O2 -Wall -Wextra tests/model_check.c -o "$d/model_check" -lm &&
        run "$d/model_check" "$d/kvattn_run" "$d/scratch" &&
        run "$d/model_check" --trained-only "$d/kvattn_run" "$d/scratch-retrieval" bench/retrieval \
            bench/model/tokenizer.bin bench/retrieval/needle_single.tsv
}
s_model_asan() {
    local d=$B/model-asan
    need_header || return 1
    mkdir -p "$d"
    local impl run_obj
    # the library: the asan-ubsan step's object (one-copy mode, shared)
    shared_obj impl tests/one_copy_impl.c "$CC" -std=c99 "${SAN[@]}" "${INC[@]}" &&
        shared_obj run_obj examples/kvattn_run.c "$CC" -std=c99 "${SAN[@]}" -DKVATTN_DECLARATIONS_ONLY -I. &&
        x "$CC" -std=c99 "${SAN[@]}" "$run_obj" "$impl" -o "$d/kvattn_run" -lm &&
        x "$CC" -std=c99 -O2 -Wall -Wextra tests/model_check.c -o "$d/model_check" -lm &&
        run env "${SAN_ENV[@]}" "$d/model_check" --quick "$d/kvattn_run" "$d/scratch"
}

# attention from the caller's own threads (tests/threads_check.c): results
# equal serial ones byte for byte; under ThreadSanitizer (no OpenMP, whose
# runtime TSan does not see); NEON under qemu (user-mode threads).
s_threads() {
    local d=$B/threads
    need_header || return 1
    mkdir -p "$d"
    x "$CC" -std=c99 -O2 -march=native -fopenmp -pthread -Wall -Wextra -Werror -I. tests/threads_check.c \
        -o "$d/threads_check" -lm &&
        run "$d/threads_check"
}
s_threads_tsan() {
    local d=$B/threads-tsan
    need_header || return 1
    mkdir -p "$d"
    x "$CC" -std=c99 -O1 -g -march=native -fsanitize=thread -pthread -I. tests/threads_check.c \
        -o "$d/threads_check" -lm &&
        run env TSAN_OPTIONS=halt_on_error=1:exitcode=66 "$d/threads_check" --quick
}
s_threads_neon() {
    local d=$B/threads-neon
    need_header || return 1
    mkdir -p "$d"
    if [ "$HOST" = aarch64 ]; then
        x "$CC" -std=c99 -O2 -pthread -I. tests/threads_check.c -o "$d/threads_check" -lm &&
            run "$d/threads_check"
    else
        x "$AARCH64_CC" -std=c99 -O2 -static -pthread -I. tests/threads_check.c -o "$d/threads_check" -lm &&
            run "$QEMU_AARCH64" "$d/threads_check" --quick
    fi
}

# libFuzzer over cache operation sequences, briefly (make fuzz runs longer)
s_fuzz() {
    local src=$1 name
    name=$(basename "$src" .c)
    need_header || return 1
    mkdir -p "$B/fuzz/$name-corpus"
    x "$CLANG" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all "$ASSERT_ON" -I. -Itests "$src" \
        -o "$B/fuzz/$name" &&
        run "$B/fuzz/$name" -max_total_time="${FUZZ_SMOKE_SECONDS:-20}" -seed=1 -print_final_stats=1 \
            "$B/fuzz/$name-corpus"
}

# ---------------------------------------------------------------- driver
# Steps are registered first (ORDER), then started longest first (by the
# estimate below) so that the jobs finish close together; each result is
# printed the moment its step ends, with its time and how far the run is.

ORDER=()
declare -A SKIPMSG=() FUNC=() ARG=() REPORTED=()
N_PASS=0
N_FAIL=0
N_DONE=0
N_RUN=0
CPU_TOTAL=0
TIMES=()

# the quick tier (`make test`): the suite natively and with the scalar
# kernels forced at full size, and under ASan+UBSan at the quick sizes; the
# full tier (`make test-all`, CI) is every step
QUICK_STEPS=(native scalar asan-ubsan repo-check)
in_tier() {
    [ "$MATRIX_TIER" = full ] && return 0
    local q
    for q in "${QUICK_STEPS[@]}"; do [ "$1" = "$q" ] && return 0; done
    return 1
}

# MATRIX_STEPS picks from every step of the matrix, whatever the tier
selected() {
    if [ -z "$MATRIX_STEPS" ]; then
        in_tier "$1"
        return
    fi
    local p pats
    read -r -a pats <<<"$MATRIX_STEPS"   # no pathname expansion of the patterns
    for p in "${pats[@]}"; do
        # shellcheck disable=SC2053  # glob match intended
        [[ $1 == $p ]] && return 0
    done
    return 1
}

# step NAME FUNCTION [ARG]: register a step
step() {
    selected "$1" || return 0
    ORDER+=("$1")
    FUNC[$1]=$2
    ARG[$1]=${3-}
}

# skip NAME WHY: register a skipped step
skip() {
    selected "$1" || return 0
    ORDER+=("$1")
    SKIPMSG[$1]=$2
}

# CPU seconds a step takes (about its wall time on an otherwise idle
# machine): those of the last run of this tier in $BUILD (TIMES_FILE) when
# there are any, else these, measured on a 2-core AMD EPYC (Zen 5) KVM guest.
TIMES_FILE=$BUILD/matrix-times-$MATRIX_TIER
typical() {
    case $MATRIX_TIER:$1 in
        quick:asan-ubsan) echo 140 ;;
        *:asan-ubsan) echo 200 ;;
        *:asan-ubsan-native) echo 220 ;;
        *:native | *:neon | *:cxx) echo 175 ;;
        *:avx2 | *:avx512) echo 110 ;;
        *:scalar | *:aarch64-scalar) echo 75 ;;
        *:warnings-*) echo 20 ;;
        *:bench-smoke | *:readme-commands) echo 60 ;;
        *:consumer-cmake-* | *:fuzz-* | *:model | *:repo-check) echo 35 ;;
        *:model-asan | *:threads-tsan | *:threads-neon) echo 15 ;;
        *) echo 10 ;;
    esac
}
declare -A EST=()
if [ -f "$TIMES_FILE" ]; then
    while read -r name secs; do
        [[ $secs =~ ^[0-9]+$ ]] && EST[$name]=$secs
    done <"$TIMES_FILE"
fi
estimate() {
    if [ -n "${EST[$1]+x}" ]; then echo "${EST[$1]}"; else typical "$1"; fi
}

# m:ss
clock() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }

# report: print every step that has ended since the last call
report() {
    local name rc secs cpu verdict
    for name in "${ORDER[@]}"; do
        [ -n "${REPORTED[$name]+x}" ] && continue
        [ -n "${SKIPMSG[$name]+x}" ] && continue
        [ -f "$LOGS/$name.rc" ] || continue
        REPORTED[$name]=1
        read -r rc secs cpu <"$LOGS/$name.rc"
        TIMES+=("$name $cpu")
        CPU_TOTAL=$((CPU_TOTAL + cpu))
        N_DONE=$((N_DONE + 1))
        verdict=PASS
        [ "$rc" = 0 ] || verdict=FAIL
        printf '[%s] %-26s %5ss (cpu %5ss)   %d/%d done, %s elapsed\n' "$verdict" "$name" "$secs" "$cpu" \
            "$N_DONE" "$N_RUN" "$(clock $SECONDS)"
        if [ "$rc" = 0 ]; then
            N_PASS=$((N_PASS + 1))
        else
            N_FAIL=$((N_FAIL + 1))
            tail -n "$TAIL_LINES" "$LOGS/$name.log" | sed 's/^/    /'
            echo "    (exit status $rc; full log: $LOGS/$name.log)"
        fi
    done
}

# launch NAME: run the step in the background once a job slot is free
launch() {
    local name=$1
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do
        wait -n
        report
    done
    (
        start=$SECONDS
        if [ -n "${ARG[$name]}" ]; then
            ( "${FUNC[$name]}" "${ARG[$name]}" ) >"$LOGS/$name.log" 2>&1 </dev/null
        else
            ( "${FUNC[$name]}" ) >"$LOGS/$name.log" 2>&1 </dev/null
        fi
        rc=$?
        # the CPU seconds of everything the step ran (user + system): unlike its
        # wall time, they do not grow when other work shares the machine
        # (times in this shell, not in a pipeline's or $(...)'s fork, which has no children)
        times >"$LOGS/$name.times"
        cpu=$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, p, "m"); t += p[1] * 60 + p[2] }
                             printf "%d", t + 0.5 }' "$LOGS/$name.times")
        echo "$rc $((SECONDS - start)) ${cpu:-0}" >"$LOGS/$name.rc.tmp" &&
            mv "$LOGS/$name.rc.tmp" "$LOGS/$name.rc"
    ) &
    report
}

# on Ctrl-C / TERM: stop the steps and everything they started (background
# steps ignore SIGINT, and so would their compilers and test programs)
kill_tree() {
    local c
    if command -v ps >/dev/null 2>&1; then
        for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$c"; done
    fi
    kill "$1" 2>/dev/null
}
cleanup() {
    local p
    trap - INT TERM
    for p in $(jobs -p); do kill_tree "$p"; done
    wait
    echo "interrupted"
    exit 130
}
trap cleanup INT TERM

step native s_native
step scalar s_scalar
if host_avx2_fma; then
    step avx2 s_avx2
else
    skip avx2 "host is not x86_64 with AVX2, FMA and F16C"
fi
if host_avx512; then
    # -march=native picks the AVX-512 kernels here, so the native step runs
    # them (simd-select checks which kernels each flag set selects); the
    # explicit-flags build stays for `MATRIX_STEPS=avx512`
    if [ -n "$MATRIX_STEPS" ]; then step avx512 s_avx512
    else skip avx512 "the native step runs the AVX-512 kernels on this host"; fi
else
    skip avx512 "host is not x86_64 with AVX-512 F, BW and VL"
fi
step asan-ubsan s_asan_ubsan
step asan-ubsan-native s_asan_ubsan_native
step cxx s_cxx
step "warnings-$(basename "$CC")" s_warnings_gcc
if have "$CLANG"; then
    step warnings-clang s_warnings_clang
else
    skip warnings-clang "$CLANG not found: install clang"
fi
step no-openmp s_no_openmp
step simd-select s_simd_select
step two-tu s_two_tu
step one-copy s_one_copy
if have cmake; then
    step consumer-cmake-installed s_consumer_cmake_installed
    step consumer-cmake-subdir s_consumer_cmake_subdir
else
    skip consumer-cmake-installed "cmake not found: install cmake"
    skip consumer-cmake-subdir "cmake not found: install cmake"
fi
if have pkg-config; then
    step consumer-pkgconfig s_consumer_pkgconfig
else
    skip consumer-pkgconfig "pkg-config not found: install pkg-config"
fi
if [ "$HOST" = aarch64 ] || { have "$AARCH64_CC" && have "$QEMU_AARCH64"; }; then
    step neon s_neon
else
    skip neon "install gcc-aarch64-linux-gnu qemu-user"
fi
if have "$AARCH64_CC"; then
    step aarch64-scalar s_aarch64_scalar
    step warnings-aarch64 s_warnings_aarch64
else
    skip aarch64-scalar "install gcc-aarch64-linux-gnu"
    skip warnings-aarch64 "install gcc-aarch64-linux-gnu"
fi
for src in examples/*.c; do
    step "example-$(basename "$src" .c)" s_example "$src"
done
step tier-dir s_tier_dir
if have redis-server && [ -f /usr/include/hiredis/hiredis.h ]; then
    step redis s_redis
else
    skip redis "install redis-server libhiredis-dev"
fi
step bench-smoke s_bench_smoke
step repo-check s_repo_check
step readme-commands s_readme_commands
step threads s_threads
step threads-tsan s_threads_tsan
if [ "$HOST" = aarch64 ] || { have "$AARCH64_CC" && have "$QEMU_AARCH64"; }; then
    step threads-neon s_threads_neon
else
    skip threads-neon "install gcc-aarch64-linux-gnu qemu-user"
fi
if [ -f examples/kvattn_run.c ]; then
    step model s_model
    step model-asan s_model_asan
else
    skip model "examples/kvattn_run.c does not exist"
    skip model-asan "examples/kvattn_run.c does not exist"
fi
for src in tests/fuzz_*.c; do
    if have "$CLANG" && printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; return (int)n * 0; }\n' |
        "$CLANG" -x c -fsanitize=fuzzer - -o "$GEN/fuzz_probe" >/dev/null 2>&1; then
        step "fuzz-$(basename "$src" .c)" s_fuzz "$src"
    else
        skip "fuzz-$(basename "$src" .c)" "needs clang with libFuzzer: install clang libclang-rt-14-dev"
    fi
done


# the steps to run, longest first; the estimate is that order's schedule on JOBS slots
RUNNABLE=()
for name in "${ORDER[@]}"; do
    [ -z "${SKIPMSG[$name]+x}" ] && RUNNABLE+=("$(estimate "$name") $name")
done
N_RUN=${#RUNNABLE[@]}
START_ORDER=()
while read -r _ name; do
    [ -n "$name" ] && START_ORDER+=("$name")
done < <(printf '%s\n' "${RUNNABLE[@]}" | sort -k1,1nr -k2,2)
declare -a SLOT=()
for ((i = 0; i < JOBS; i++)); do SLOT[i]=0; done
for name in "${START_ORDER[@]}"; do
    least=0
    for ((i = 1; i < JOBS; i++)); do [ "${SLOT[i]}" -lt "${SLOT[least]}" ] && least=$i; done
    SLOT[least]=$((SLOT[least] + $(estimate "$name")))
done
est=0
for ((i = 0; i < JOBS; i++)); do [ "${SLOT[i]}" -gt "$est" ] && est=${SLOT[i]}; done
if [ -f "$TIMES_FILE" ]; then est_from="from the last run's step times in $TIMES_FILE"
else est_from="from typical step times on a 2-core machine"; fi

if [ "$MATRIX_TIER" = full ]; then
    tier_says="the whole matrix"
else
    tier_says="the quick default (make test-all runs the whole matrix)"
fi
echo "kvattn test matrix, $tier_says: $(basename "$CC") on $HOST, $N_RUN steps, $JOBS jobs," \
    "logs in $LOGS/"
echo "estimate: about $(clock "$est") on an otherwise idle machine ($est_from);" \
    "each step prints a line when it ends"
load=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null)
if [ -n "$load" ] && awk -v l="$load" -v n="$(nproc 2>/dev/null || echo 1)" 'BEGIN { exit !(l > n / 2) }'; then
    echo "  other work is running (load average $load on $(nproc) cores): expect longer"
fi
for name in "${ORDER[@]}"; do
    [ -n "${SKIPMSG[$name]+x}" ] && echo "[SKIP] $name (${SKIPMSG[$name]})"
done
for name in "${START_ORDER[@]}"; do
    launch "$name"
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do
    wait -n
    report
done
wait
report

if [ ${#TIMES[@]} -gt 0 ]; then
    # a selection (MATRIX_STEPS) updates its steps' times and keeps the others'
    declare -A EST_KEEP=()
    for name in "${!EST[@]}"; do EST_KEEP[$name]=${EST[$name]}; done
    for t in "${TIMES[@]}"; do EST_KEEP[${t% *}]=${t#* }; done
    for name in "${!EST_KEEP[@]}"; do echo "$name ${EST_KEEP[$name]}"; done | sort >"$TIMES_FILE.tmp" &&
        mv "$TIMES_FILE.tmp" "$TIMES_FILE"
fi
echo "total $(clock $SECONDS) (estimate $(clock "$est")); the steps' CPU time $(clock "$CPU_TOTAL")," \
    "$(clock $(((CPU_TOTAL + JOBS - 1) / JOBS))) over $JOBS jobs"
echo "$N_PASS passed, $N_FAIL failed"
[ "$N_FAIL" -eq 0 ]
exit
}
