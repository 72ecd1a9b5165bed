/* test_main.c - runs every section of the kvattn test suite.
 *
 *   ./kvattn_tests              all sections
 *   ./kvattn_tests cache gqa    only the named sections
 *   KVA_TEST_QUICK=1            ~10x fewer iterations (for qemu)
 *   KVA_TEST_VERBOSE=1          per-section timings on stderr
 *
 * A new section is one more X(name) in KT_SECTIONS (it defines test_name). */
#include <time.h>

#include "kvattn.h"
#include "harness.h"

int kt_pass, kt_fail, kt_quick;
int kt_fail_prints;
const char *kt_test_name;

#ifdef KT_VECTOR_SECTIONS
/* the native sanitizer build of the test matrix: the sections whose cases run
   the vector kernels (the baseline sanitizer build runs every section) */
#define KT_SECTIONS(X) \
  X(numerics) X(attend) X(cache) X(mla) X(gqa) X(quant) X(fp8bulk) X(batch) X(kernels) X(strided) X(int4) X(iscores) X(ivalues) X(select)
#elif defined(KT_ISA_SECTIONS)
/* the matrix's second NEON build (without the dot-product extension): the
   sections that test the kernels themselves */
#define KT_SECTIONS(X) X(kernels) X(iscores) X(ivalues) X(select)
#else
#define KT_SECTIONS(X) \
  X(numerics)          \
  X(attend)            \
  X(rope)              \
  X(cache)             \
  X(evict)             \
  X(mla)               \
  X(paged) X(paged_weak) \
  X(gqa) X(quant)      \
  X(fp8bulk) X(batch)  \
  X(kernels) X(strided) \
  X(tree) X(seqio)     \
  X(groups)            \
  X(rotate) X(int4)   \
  X(demote)            \
  X(iscores) X(ivalues) X(select) X(scorers) X(errors) X(seqmem) X(tier) X(budgets)
#endif

#define KT_DECLARE(name) void test_##name(void);
KT_SECTIONS(KT_DECLARE)

typedef struct {
  const char *name;
  void (*fn)(void);
} kt_section;

#define KT_ENTRY(name) {#name, test_##name},
static const kt_section kt_sections[] = {KT_SECTIONS(KT_ENTRY)};

static int kt_env_on(const char *name) {
  const char *s = getenv(name);
  return s && *s && strcmp(s, "0") != 0;
}

int main(int argc, char **argv) {
  int i, a, n = (int)(sizeof kt_sections / sizeof kt_sections[0]);
  int verbose = kt_env_on("KVA_TEST_VERBOSE");
  kt_quick = kt_env_on("KVA_TEST_QUICK");
  for (a = 1; a < argc; a++) {
    int found = 0;
    for (i = 0; i < n; i++) found |= strcmp(argv[a], kt_sections[i].name) == 0;
    if (!found) {
      fprintf(stderr, "unknown section '%s'; sections:", argv[a]);
      for (i = 0; i < n; i++) fprintf(stderr, " %s", kt_sections[i].name);
      fprintf(stderr, "\n");
      return 2;
    }
  }
  for (i = 0; i < n; i++) {
    int run = argc < 2;
    clock_t t0;
    for (a = 1; a < argc; a++) run |= strcmp(argv[a], kt_sections[i].name) == 0;
    if (!run) continue;
    t0 = clock();
    kt_begin(kt_sections[i].name);
    kt_sections[i].fn();
    if (verbose)
      fprintf(stderr, "  %-10s %.2f s cpu, %d passed, %d failed so far\n", kt_sections[i].name,
              (double)(clock() - t0) / CLOCKS_PER_SEC, kt_pass, kt_fail);
  }
  printf("kvattn tests [%s]: %d checks passed, %d failed\n", kva_simd_name(), kt_pass, kt_fail);
  return kt_fail ? 1 : 0;
}
