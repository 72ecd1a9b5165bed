/* fuzz_paged.c - libFuzzer harness for the paged block manager.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. -Itests \
 *         tests/fuzz_paged.c -o build/fuzz_paged -lm
 *   ./build/fuzz_paged -max_total_time=30          (or: make fuzz)
 *
 * The first bytes pick a small cache (layers, heads, dims, block size, pool
 * size, max_seqs, prefix_max_age, F32/F16/BF16, token vocabulary, salts,
 * evict_support, a demoted pool); the rest drive the shadow model of
 * paged_model.h, byte by byte: which operation (new, new_prefix, prefill,
 * append incl. 0 / pool-exhausting / negative sizes, store, fork, free,
 * publish + immediate re-query, truncate, attend_cache vs the double
 * reference, fits, reset_prefix, stale ids, eviction policies with demotion,
 * compress, export; with a prefix tier: spills and fetches through a store
 * that fails, corrupts or misfiles records, kva_prefix_save, kva_prefix_load,
 * restarts) on which sequence with which sizes and tokens.  After every
 * operation the model checks the stats invariants and the exact read-back of
 * every live sequence; on KVA_ERR_FULL, that nothing changed.  A violated check prints
 * what and traps; ASan/UBSan/LeakSanitizer catch the rest. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvattn.h"
#include "harness.h"

int kt_pass, kt_fail, kt_quick;
int kt_fail_prints;
const char *kt_test_name;

#define PM_CHECK(cond, ...)                                                    \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_paged: check failed at %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
      __builtin_trap();                                                        \
    }                                                                          \
  } while (0)

#include "ref.h"
#include "paged_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const kva_dtype types[3] = {KVA_F32, KVA_F16, KVA_BF16};
  pm_config cfg;
  pm_src src;
  uint64_t seed = 0x9E3779B97F4A7C15ULL;
  size_t i;
  if (size < 6) return 0;
  memset(&cfg, 0, sizeof cfg);
  cfg.n_layers = 1 + (data[0] & 1);
  cfg.n_kv_heads = 1 + ((data[0] >> 1) & 1);
  cfg.n_heads = cfg.n_kv_heads * (1 + ((data[0] >> 2) & 1));
  cfg.head_dim = 1 + ((data[0] >> 3) & 3);
  cfg.v_dim = (data[0] >> 5) & 3; /* 0 => head_dim */
  cfg.block_size = 1 + data[1] % 5;
  cfg.tier = (data[1] / 5) % 2; /* a prefix tier: the shadow's store, misbehaving now and then */
  cfg.n_blocks = 1 + data[2] % 12;
  cfg.max_seqs = 1 + data[3] % 5;
  cfg.prefix_max_age = data[4] % 5;
  cfg.dtype = types[(data[4] / 5) % 3];
  cfg.vocab = 1 + data[5] % 3;
  cfg.n_salts = 1 + (data[5] / 3) % 4;
  cfg.evict_support = (data[5] / 12) % 3;
  if (cfg.evict_support != KVA_EVICT_SUPPORT_NONE) { /* a demoted pool: none, F32, F16 or BF16, small or default */
    static const kva_dtype dtypes[4] = {KVA_DTYPE_DEFAULT, KVA_F32, KVA_F16, KVA_BF16};
    cfg.demote_dtype = dtypes[(data[3] / 5) % 4];
    cfg.demote_blocks = (data[2] / 12) % 4;
  }
  for (i = 0; i < size; i++) seed = (seed ^ data[i]) * 0x100000001B3ULL;
  memset(&src, 0, sizeof src);
  kt_seed(&src.rng, seed); /* K/V and query values */
  src.bytes = 1;
  src.data = data + 6;
  src.n = size - 6;
  if (!pm_run_src(&cfg, &src, 400, NULL)) __builtin_trap(); /* a valid description must create */
  return 0;
}
