/* test_paged_weak.c - the prefix cache with a hash where every key collides.
 *
 * KVATTN_TEST_WEAK_HASH (a test-only macro) makes kvattn.h's prefix hash
 * constant, so every published block lands in one bucket and only the full
 * comparison of salt, parent and token ids tells keys apart.  This
 * translation unit builds the library that way and runs the directed prefix
 * tests and the randomized differential test (paged_model.h) with small
 * vocabularies, where many prompts share blocks: a hit must never serve
 * another prefix's or another tenant's K/V, from memory or (two configs with
 * a prefix tier, whose keys are SHA-256 whatever the memory hash) from the
 * tier. */
#define KVATTN_TEST_WEAK_HASH 1
#include "kvattn.h"
#include "harness.h"
#include "ref.h"
#include "paged_model.h"

void test_paged_weak(void) {
  static const pm_config cfgs[] = {
      /* L  G  D  DV H  bs nb  seqs age dtype    vocab salts evict demote dblocks tier */
      {1, 1, 2, 0, 2, 2, 32, 8, 0, KVA_F32, 2, 3, 0, KVA_DTYPE_DEFAULT, 0, 1},
      {2, 2, 2, 3, 4, 3, 24, 6, 4, KVA_F32, 2, 2, 0, KVA_F16, 0, 0},
      {1, 1, 3, 0, 1, 1, 24, 6, 0, KVA_F16, 3, 4, 0, KVA_DTYPE_DEFAULT, 0, 1},
  };
  int i, n = (int)(sizeof cfgs / sizeof cfgs[0]);
  long hits = 0;
  kt_begin("paged weak hash: prefix");
  pm_prefix_directed(1);
  kt_begin("paged weak hash: random");
  for (i = 0; i < n; i++) {
    pm_model m;
    int ok = pm_run(&cfgs[i], 0xBADA55ULL + (uint64_t)i, kt_iters(4000), &m);
    KT_CHECK(ok, "config %d: kva_cache_create failed", i);
    if (ok) hits += m.n_hit_tokens;
  }
  KT_CHECK(hits > 0, "no prefix hits at all: the weak-hash run tested nothing");
}
