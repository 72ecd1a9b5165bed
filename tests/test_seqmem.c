/* test_seqmem.c - kva_seq_get_stats: one sequence's memory.
 *
 * Hand-counted cases (a fork shares every block; an append copies the
 * shared tail; a publication makes a block shared; eviction counts the
 * positions given up), then random workloads where the sequences' shares
 * must add up to the cache's bytes_used, and freeing a sequence must
 * return exactly its own blocks to the free pool. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvattn.h"
#include "harness.h"

static kva_cache *sm_cache(int bs, int n_blocks, int n_groups, const kva_layer_group *groups, const int *lg,
                           int n_layers) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  kt_desc_init(&d, n_layers, 2, 8, bs, n_blocks, 8, KVA_INT8);
  d.n_groups = n_groups;
  d.groups = groups;
  d.layer_group = lg;
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  return c;
}

static void sm_fill(kva_cache *c, int seq, int n, int n_layers) {
  float k[64 * 16], v[64 * 16];
  int l, i;
  for (i = 0; i < n * 16 && i < 64 * 16; i++) k[i] = v[i] = 0.001f * (float)(i % 97);
  KT_STATUS(kva_seq_append(c, seq, n), KVA_OK);
  for (l = 0; l < n_layers; l++) KT_STATUS(kva_store(c, seq, l, k, v, n), KVA_OK);
}

#define SM_EXPECT(st, b, bsh, tok, ev)                                                                         \
  KT_CHECK((st).blocks == (b) && (st).blocks_shared == (bsh) && (st).tokens == (tok) &&                        \
               (st).tokens_evicted == (ev) && (st).bytes == (size_t)(b) * blk &&                               \
               (st).bytes_shared == (size_t)(bsh) * blk && (st).bytes_own == (st).bytes - (st).bytes_shared,   \
           "line %d: blocks %d shared %d tokens %ld evicted %ld bytes %zu/%zu/%zu; want %d %d %d %d", __LINE__, \
           (st).blocks, (st).blocks_shared, (st).tokens, (st).tokens_evicted, (st).bytes, (st).bytes_shared,    \
           (st).bytes_own, (b), (bsh), (tok), (ev))

static void sm_counted(void) {
  kva_cache *c;
  kva_cache_stats cs;
  kva_seq_stats a, b;
  size_t blk;
  int s = -1, f = -1, i;
  int32_t tok[64];
  kva_evict ev;
  kt_begin("seqmem: hand-counted blocks, sharing, eviction and billing");
  for (i = 0; i < 64; i++) tok[i] = 3 * i + 1;
  c = sm_cache(16, 32, 0, NULL, NULL, 2);
  if (!c) return;
  kva_cache_get_stats(c, &cs);
  blk = cs.block_bytes;
  KT_STATUS(kva_seq_new(c, &s), KVA_OK);
  KT_STATUS(kva_seq_get_stats(c, s, &a), KVA_OK);
  SM_EXPECT(a, 0, 0, 0, 0);
  KT_CHECK(a.bytes_meta > 0, "no bookkeeping counted");
  sm_fill(c, s, 40, 2);
  KT_STATUS(kva_seq_get_stats(c, s, &a), KVA_OK);
  SM_EXPECT(a, 3, 0, 40, 0);
  KT_CHECK(a.bytes_prorated == (double)(3 * blk), "alone: prorated %.1f", a.bytes_prorated);
  /* a fork holds the same three blocks: each pays half */
  KT_STATUS(kva_seq_fork(c, s, &f), KVA_OK);
  KT_STATUS(kva_seq_get_stats(c, s, &a), KVA_OK);
  KT_STATUS(kva_seq_get_stats(c, f, &b), KVA_OK);
  SM_EXPECT(a, 3, 3, 40, 0);
  SM_EXPECT(b, 3, 3, 40, 0);
  KT_CHECK(a.bytes_prorated == 1.5 * (double)blk && b.bytes_prorated == 1.5 * (double)blk, "forked: %.1f %.1f",
           a.bytes_prorated, b.bytes_prorated);
  /* the child's append copies the shared tail block: one of its own each */
  sm_fill(c, f, 1, 2);
  KT_STATUS(kva_seq_get_stats(c, s, &a), KVA_OK);
  KT_STATUS(kva_seq_get_stats(c, f, &b), KVA_OK);
  SM_EXPECT(a, 3, 2, 40, 0);
  SM_EXPECT(b, 3, 2, 41, 0);
  kva_cache_get_stats(c, &cs);
  KT_CHECK(a.bytes_prorated + b.bytes_prorated == (double)cs.bytes_used, "shares %.1f + %.1f != bytes_used %zu",
           a.bytes_prorated, b.bytes_prorated, cs.bytes_used);
  /* freeing the parent returns its one own block */
  {
    int free0 = cs.blocks_free;
    KT_STATUS(kva_seq_free(c, s), KVA_OK);
    kva_cache_get_stats(c, &cs);
    KT_CHECK(cs.blocks_free == free0 + 1, "free returned %d blocks, its own was 1", cs.blocks_free - free0);
  }
  KT_STATUS(kva_seq_get_stats(c, f, &b), KVA_OK);
  SM_EXPECT(b, 3, 0, 41, 0);
  /* publishing makes the full blocks shared with the prefix cache; the sequence still pays for them */
  KT_STATUS(kva_seq_publish(c, f, tok, 41, 9), KVA_OK);
  KT_STATUS(kva_seq_get_stats(c, f, &b), KVA_OK);
  SM_EXPECT(b, 3, 2, 41, 0);
  KT_CHECK(b.bytes_prorated == (double)(3 * blk), "published: prorated %.1f", b.bytes_prorated);
  KT_STATUS(kva_seq_free(c, f), KVA_OK);
  /* a window: positions given up are counted, blocks shrink */
  KT_STATUS(kva_seq_new(c, &s), KVA_OK);
  memset(&ev, 0, sizeof ev);
  ev.kind = KVA_EVICT_WINDOW;
  ev.budget = 20;
  ev.n_sink = 4;
  KT_STATUS(kva_seq_set_evict(c, s, &ev), KVA_OK);
  for (i = 0; i < 6; i++) sm_fill(c, s, 10, 2);
  KT_STATUS(kva_seq_get_stats(c, s, &a), KVA_OK);
  KT_CHECK(a.tokens == kva_seq_len(c, s) && a.tokens_evicted == 60 - kva_seq_len(c, s) && a.tokens_evicted > 0,
           "window: tokens %ld evicted %ld, len %d", a.tokens, a.tokens_evicted, kva_seq_len(c, s));
  KT_CHECK(a.blocks == (kva_seq_len(c, s) + 15) / 16, "window: %d blocks for %d tokens", a.blocks,
           kva_seq_len(c, s));
  /* refusals */
  KT_STATUS(kva_seq_get_stats(c, s + 12345, &a), KVA_ERR_SEQ);
  KT_STATUS(kva_seq_get_stats(c, s, NULL), KVA_ERR_ARG);
  KT_STATUS(kva_seq_get_stats(NULL, s, &a), KVA_ERR_ARG);
  kva_cache_destroy(c);
}

/* Random appends, forks, publications, prefix reuse, truncations and frees:
   the live sequences' shares add up to bytes_used; blocks and bytes agree;
   freeing a sequence of a cache without groups frees exactly its own blocks. */
static void sm_random(int with_groups) {
  kva_layer_group groups[2];
  int lg[3] = {0, 1, 0};
  kva_cache *c;
  kt_rng rng;
  int seqs[8], it, i, iters = kt_iters(1500), n_layers = 3;
  int32_t tok[512];
  kt_begin(with_groups ? "seqmem: random workloads with a WINDOW group: shares add up to bytes_used"
                       : "seqmem: random workloads: shares add up to bytes_used, a free returns the own blocks");
  memset(groups, 0, sizeof groups);
  groups[0].kind = KVA_SPAN_FULL;
  groups[1].kind = KVA_SPAN_WINDOW;
  groups[1].window = 12;
  groups[1].n_sink = 2;
  c = with_groups ? sm_cache(4, 96, 2, groups, lg, n_layers) : sm_cache(4, 96, 0, NULL, NULL, n_layers);
  if (!c) return;
  kt_seed(&rng, with_groups ? 77 : 78);
  for (i = 0; i < 512; i++) tok[i] = (int32_t)(kt_u32(&rng) % 5);
  for (i = 0; i < 8; i++) seqs[i] = -1;
  for (it = 0; it < iters; it++) {
    int si = (int)(kt_u32(&rng) % 8), op = (int)(kt_u32(&rng) % 7);
    kva_cache_stats cs;
    double sum = 0.0;
    if (seqs[si] < 0) {
      if (kt_u32(&rng) % 2) {
        int reused = 0;
        if (kva_seq_new_prefix(c, tok, (int)(kt_u32(&rng) % 40), 0, &seqs[si], &reused) != KVA_OK) seqs[si] = -1;
      } else if (kva_seq_new(c, &seqs[si]) != KVA_OK) {
        seqs[si] = -1;
      }
      continue;
    }
    if (op <= 2) {
      int n = 1 + (int)(kt_u32(&rng) % 9);
      if (kva_seq_len(c, seqs[si]) + n < 200 && kva_seq_append(c, seqs[si], n) == KVA_OK) {
        float k[9 * 16], v[9 * 16];
        int l;
        for (i = 0; i < n * 16; i++) k[i] = v[i] = kt_uniform(&rng, -1.0f, 1.0f);
        for (l = 0; l < n_layers; l++) kva_store(c, seqs[si], l, k, v, n);
      }
    } else if (op == 3) {
      int d = (si + 1 + (int)(kt_u32(&rng) % 7)) % 8;
      if (seqs[d] < 0 && kva_seq_fork(c, seqs[si], &seqs[d]) != KVA_OK) seqs[d] = -1;
    } else if (op == 4) {
      int len = kva_seq_len(c, seqs[si]);
      if (len > 0) kva_seq_publish(c, seqs[si], tok, len < 512 ? len : 512, 0);
    } else if (op == 5) {
      int len = kva_seq_len(c, seqs[si]);
      kva_seq_truncate(c, seqs[si], len > 0 ? (int)(kt_u32(&rng) % (unsigned)len) : 0);
    } else {
      kva_seq_stats own;
      int free0;
      KT_STATUS(kva_seq_get_stats(c, seqs[si], &own), KVA_OK);
      kva_cache_get_stats(c, &cs);
      free0 = cs.blocks_free;
      KT_STATUS(kva_seq_free(c, seqs[si]), KVA_OK);
      kva_cache_get_stats(c, &cs);
      if (!with_groups)
        KT_CHECK(cs.blocks_free - free0 == own.blocks - own.blocks_shared,
                 "free returned %d blocks; the sequence owned %d", cs.blocks_free - free0,
                 own.blocks - own.blocks_shared);
      seqs[si] = -1;
    }
    kva_cache_get_stats(c, &cs);
    for (i = 0; i < 8; i++) {
      kva_seq_stats st;
      if (seqs[i] < 0) continue;
      KT_STATUS(kva_seq_get_stats(c, seqs[i], &st), KVA_OK);
      sum += st.bytes_prorated;
      KT_CHECK(st.tokens == kva_seq_len(c, seqs[i]) && st.tokens_evicted == kva_seq_pos(c, seqs[i]) - st.tokens,
               "tokens %ld evicted %ld, len %d pos %d", st.tokens, st.tokens_evicted, kva_seq_len(c, seqs[i]),
               kva_seq_pos(c, seqs[i]));
      KT_CHECK(st.blocks_shared <= st.blocks && st.bytes_shared <= st.bytes &&
                   st.bytes_own == st.bytes - st.bytes_shared && st.bytes_prorated <= (double)st.bytes + 0.5 &&
                   st.bytes_prorated >= (double)st.bytes_own - 0.5,
               "inconsistent: blocks %d/%d bytes %zu/%zu/%zu prorated %.1f", st.blocks, st.blocks_shared, st.bytes,
               st.bytes_shared, st.bytes_own, st.bytes_prorated);
    }
    KT_CHECK(sum > (double)cs.bytes_used - 0.5 && sum < (double)cs.bytes_used + 0.5,
             "step %d: the shares add up to %.1f, bytes_used is %zu", it, sum, cs.bytes_used);
  }
  kva_cache_destroy(c);
}

void test_seqmem(void) {
  sm_counted();
  sm_random(0);
  sm_random(1);
}
