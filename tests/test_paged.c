/* test_paged.c - the paged block manager.
 *
 *  - a randomized differential test against the shadow model in paged_model.h
 *    (new, append incl. 0 and pool-exhausting sizes, store, fork, free,
 *    publish, new_prefix, truncate, read, attend_cache, fits, reset_prefix,
 *    stale ids) on several cache shapes, F32 (exact read-back) and F16
 *    (read-back == the f16-rounded value), with prefix_max_age on and off,
 *    most of them with a prefix tier (spill / fetch through a store that
 *    fails and corrupts, kva_prefix_save, kva_prefix_load, restarts);
 *  - directed tests: bad input (NULL cache, bad/stale ids, argument errors
 *    before sequence errors, outputs untouched on failure), ids never handed
 *    out twice, copy-on-write isolation, kva_seq_fits (NOW/LATER/NEVER and the
 *    blocks it takes), LRU recycling order (least recently used first, a
 *    sequence's tail before its head, cached blocks only when no free block
 *    is left), prefix_max_age, reset_prefix, salts, changed tokens;
 *  - allocation: a test alloc_fn failing the Nth allocation (KVA_ERR_NOMEM,
 *    no leak, output untouched), every byte returned at destroy, no
 *    allocation after kva_cache_create; KVATTN_MALLOC is counted here too
 *    (this translation unit defines it) for the default allocator. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

/* KVATTN_MALLOC / KVATTN_FREE for this translation unit: counted, and able to fail */
static long pg_mallocs, pg_frees, pg_fail_at;
static inline void *pg_malloc(size_t n) {
  pg_mallocs++;
  if (pg_fail_at && pg_mallocs >= pg_fail_at) return NULL;
  return malloc(n);
}
static inline void pg_free(void *p) {
  if (p) pg_frees++;
  free(p);
}
#define KVATTN_MALLOC(n) pg_malloc(n)
#define KVATTN_FREE(p) pg_free(p)

#include "kvattn.h"
#include "harness.h"
#include "ref.h"
#include "paged_model.h"

/* ---------------------------------------------------------------- helpers */

static void pg_desc(kva_cache_desc *d, int bs, int nb) {
  memset(d, 0, sizeof *d);
  d->n_layers = 1;
  d->n_kv_heads = 1;
  d->head_dim = 2;
  d->block_size = bs;
  d->n_blocks = nb;
  d->max_seqs = 16;
  d->dtype = KVA_F32;
}

/* store base + slot into every K and V value of the newest n slots (pg_desc
   shape: one layer, one KV head, head_dim 2) */
static void pg_store_marks(kva_cache *c, int id, int n, float base) {
  float k[64 * 2], v[64 * 2];
  int t, i, len = kva_seq_len(c, id);
  for (t = 0; t < n && t < 64; t++)
    for (i = 0; i < 2; i++) k[t * 2 + i] = v[t * 2 + i] = base + (float)(len - n + t);
  KT_STATUS(kva_store(c, id, 0, k, v, n), KVA_OK);
}

/* slot `slot` of seq id reads back K[0] == want */
static float pg_k0(kva_cache *c, int id, int slot) {
  float k[16], v[16];
  if (kva_seq_read(c, id, 0, slot, k, v, NULL) != KVA_OK) return -1e30f;
  return k[0];
}

static void pg_stats(kva_cache *c, kva_cache_stats *s) { kva_cache_get_stats(c, s); }

static int pg_stats_same(const kva_cache_stats *a, const kva_cache_stats *b) { return kt_stats_equal(a, b, 0); }

/* ---------------------------------------------------------------- random */

static void pg_random(void) {
  /* evict_support is set below; a demoted pool needs ALL or WINDOW (configs 0, 1, 3, 6) */
  static const pm_config cfgs[] = {
      /* L  G  D  DV H   bs nb  seqs age dtype          vocab salts  evict demote   demote_blocks tier */
      {2, 2, 3, 2, 4, 4, 24, 6, 0, KVA_F32, 3, 3, 0, KVA_F16, 0, 1},
      {1, 1, 4, 0, 3, 3, 16, 5, 5, KVA_F16, 2, 2, 0, KVA_F32, 4, 1},
      {2, 1, 2, 3, 2, 1, 20, 4, 0, KVA_F32, 4, 2, 0, KVA_DTYPE_DEFAULT, 0, 0},
      {1, 2, 8, 8, 8, 16, 6, 8, 2, KVA_F32, 2, 2, 0, KVA_BF16, 2, 1},
      {1, 1, 3, 0, 1, 5, 10, 3, 0, KVA_DTYPE_DEFAULT, 2, 4, 0, KVA_DTYPE_DEFAULT, 0, 1},
      {3, 2, 1, 1, 2, 2, 40, 10, 7, KVA_F32, 2, 3, 0, KVA_DTYPE_DEFAULT, 0, 1},
      {2, 4, 4, 2, 8, 7, 30, 12, 0, KVA_BF16, 2, 2, 0, KVA_F32, 3, 0},
  };
  int i, n = (int)(sizeof cfgs / sizeof cfgs[0]);
  long ops = 0, full = 0, hits = 0, cow = 0, lower = 0, attend = 0, never = 0, later = 0;
  long pol = 0, evicted = 0, demoted = 0, dropped = 0, sfail = 0, dfull = 0, refused = 0, compress = 0, dattend = 0,
       uneven = 0;
  long spilled = 0, fetched = 0, fbad = 0, fmiss = 0, loaded = 0, lrefused = 0, restarts = 0, saves = 0, twins = 0,
       ttokens = 0;
  kt_begin("paged random");
  for (i = 0; i < n; i++) {
    pm_model m;
    pm_config cf = cfgs[i];
    int ok;
    cf.evict_support = i % 3; /* ALL, WINDOW, NONE: the same answers, less bookkeeping */
    ok = pm_run(&cf, 0xC0FFEEULL + (uint64_t)i * 7919u, kt_iters(10000), &m);
    KT_CHECK(ok, "config %d: kva_cache_create failed", i);
    if (!ok) continue;
    if (getenv("KVA_TEST_VERBOSE"))
      fprintf(stderr, "    config %d: %ld ops, %ld full, %ld reused, %ld cow, %ld probes, %ld attends, %ld never, %ld later\n",
              i, m.n_ops, m.n_full, m.n_hit_tokens, m.n_cow, m.n_lower, m.n_attend, m.n_never, m.n_later);
    if (getenv("KVA_TEST_VERBOSE"))
      fprintf(stderr,
              "    config %d: %ld policies, %ld evictions (%ld tokens), %ld demoted, %ld dropped from the ring, "
              "%ld scorer refusals, %ld demoted pool short, %ld refusals, %ld compressions, %ld attends over "
              "demoted, %ld plans with uneven heads\n",
              i, m.n_policies, m.n_evictions, m.n_evicted, m.n_demoted, m.n_dropped, m.n_score_fail, m.n_dm_full,
              m.n_refused, m.n_compress, m.n_dm_attend, m.n_uneven);
    if (getenv("KVA_TEST_VERBOSE") && cf.tier)
      fprintf(stderr,
              "    config %d: tier: %ld spilled, %ld fetched (%ld tokens reused), %ld refused, %ld missed, %ld loaded, "
              "%ld loads refused, %ld restarts, %ld saves, %ld twins\n",
              i, m.n_spilled, m.n_fetched, m.n_tier_tokens, m.n_fetch_bad, m.n_fetch_miss, m.n_loaded,
              m.n_load_refused, m.n_restarts, m.n_saves, m.n_twins);
    spilled += m.n_spilled;
    fetched += m.n_fetched;
    fbad += m.n_fetch_bad;
    fmiss += m.n_fetch_miss;
    loaded += m.n_loaded;
    lrefused += m.n_load_refused;
    restarts += m.n_restarts;
    saves += m.n_saves;
    twins += m.n_twins;
    ttokens += m.n_tier_tokens;
    pol += m.n_policies;
    evicted += m.n_evicted;
    demoted += m.n_demoted;
    dropped += m.n_dropped;
    sfail += m.n_score_fail;
    dfull += m.n_dm_full;
    refused += m.n_refused;
    compress += m.n_compress;
    dattend += m.n_dm_attend;
    uneven += m.n_uneven;
    ops += m.n_ops;
    full += m.n_full;
    hits += m.n_hit_tokens;
    cow += m.n_cow;
    lower += m.n_lower;
    attend += m.n_attend;
    never += m.n_never;
    later += m.n_later;
  }
  /* the operations must really have exercised the interesting paths */
  KT_CHECK(full > 0 && hits > 0 && cow > 0 && lower > 0 && attend > 0 && never > 0 && later > 0,
           "coverage: %ld ops, %ld KVA_ERR_FULL, %ld reused tokens, %ld CoW copies, %ld post-publish probes, "
           "%ld attends, %ld NEVER, %ld LATER",
           ops, full, hits, cow, lower, attend, never, later);
  KT_CHECK(pol > 0 && evicted > 0 && demoted > 0 && dropped > 0 && sfail > 0 && dfull > 0 && refused > 0 &&
               compress > 0 && dattend > 0 && uneven > 0,
           "eviction coverage: %ld policies, %ld evicted, %ld demoted, %ld dropped from a ring, %ld scorer refusals, "
           "%ld demoted pool short, %ld refusals after eviction, %ld compressions, %ld attends over demoted tokens, "
           "%ld evictions the fewest head limited",
           pol, evicted, demoted, dropped, sfail, dfull, refused, compress, dattend, uneven);
  KT_CHECK(spilled > 0 && fetched > 0 && ttokens > 0 && fbad > 0 && fmiss > 0 && loaded > 0 && lrefused > 0 &&
               restarts > 0 && saves > 0 && twins > 0,
           "tier coverage: %ld spilled, %ld fetched (%ld tokens reused), %ld refused, %ld missed, %ld loaded, "
           "%ld loads refused, %ld restarts, %ld saves, %ld twin caches",
           spilled, fetched, ttokens, fbad, fmiss, loaded, lrefused, restarts, saves, twins);
  if (getenv("KVA_TEST_VERBOSE"))
    fprintf(stderr,
            "  paged random: %ld ops, %ld KVA_ERR_FULL, %ld reused tokens, %ld CoW copies, %ld probes, %ld attends, "
            "%ld NEVER, %ld LATER\n",
            ops, full, hits, cow, lower, attend, never, later);
}

/* ---------------------------------------------------------------- bad input */

static void pg_bad_input(void) {
  kva_cache_desc d;
  kva_cache *c = NULL, *c2 = (kva_cache *)&d;
  int a = -1, fr = -1, id = -7, reused = -7, need = -7, bad[5], i, j;
  float k[16], v[16], q[64], o[64];
  int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8}, pos[4];
  kva_attn at, at_bad;
  kva_evict ev;
  kva_cache_stats s0, s1;
  kt_begin("paged bad input");
  memset(k, 0, sizeof k);
  memset(v, 0, sizeof v);
  memset(q, 0, sizeof q);
  memset(&at, 0, sizeof at);
  at.n_heads = 2;
  at.n_kv_heads = 1;
  at.head_dim = 2;
  at.n_threads = 1;
  at_bad = at;
  at_bad.head_dim = 3;
  memset(&ev, 0, sizeof ev);
  ev.kind = KVA_EVICT_WINDOW;
  ev.budget = 8;

  /* NULL cache */
  KT_STATUS(kva_seq_new(NULL, &id), KVA_ERR_ARG);
  KT_STATUS(kva_seq_fork(NULL, 0, &id), KVA_ERR_ARG);
  KT_STATUS(kva_seq_free(NULL, 0), KVA_ERR_ARG);
  KT_STATUS(kva_seq_append(NULL, 0, 1), KVA_ERR_ARG);
  KT_CHECK(kva_seq_len(NULL, 0) == -1, "kva_seq_len(NULL)");
  KT_CHECK(kva_seq_pos(NULL, 0) == -1, "kva_seq_pos(NULL)");
  KT_STATUS(kva_seq_truncate(NULL, 0, 0), KVA_ERR_ARG);
  KT_CHECK(kva_seq_fits(NULL, 0, 1, &need) == KVA_FITS_NEVER, "kva_seq_fits(NULL)");
  KT_STATUS(kva_store(NULL, 0, 0, k, v, 1), KVA_ERR_ARG);
  KT_STATUS(kva_attend_cache(NULL, 0, 0, &at, q, 1, o), KVA_ERR_ARG);
  KT_STATUS(kva_seq_read(NULL, 0, 0, 0, k, v, pos), KVA_ERR_ARG);
  KT_STATUS(kva_seq_new_prefix(NULL, tok, 4, 0, &id, &reused), KVA_ERR_ARG);
  KT_STATUS(kva_seq_publish(NULL, 0, tok, 4, 0), KVA_ERR_ARG);
  KT_STATUS(kva_cache_reset_prefix(NULL), KVA_ERR_ARG);
  KT_STATUS(kva_seq_set_evict(NULL, 0, &ev), KVA_ERR_ARG);
  KT_CHECK(id == -7 && reused == -7, "failed calls wrote their outputs (id %d, n_reused %d)", id, reused);
  kva_cache_destroy(NULL);
  memset(&s0, 0x5A, sizeof s0);
  kva_cache_get_stats(NULL, &s0); /* must not crash */
  KT_CHECK(s0.n_blocks == 0 && s0.n_seqs == 0, "kva_cache_get_stats(NULL) leaves garbage (n_blocks %d)", s0.n_blocks);
  KT_STATUS(kva_cache_create(NULL, &c2), KVA_ERR_ARG);
  KT_CHECK(c2 == (kva_cache *)&d, "failed kva_cache_create wrote *out");

  pg_desc(&d, 4, 8);
  d.max_seqs = 4;
  KT_STATUS(kva_cache_create(&d, NULL), KVA_ERR_ARG);
  if (kva_cache_create(&d, &c) != KVA_OK) {
    KT_CHECK(0, "kva_cache_create");
    return;
  }
  kva_cache_get_stats(c, NULL); /* must not crash */
  KT_STATUS(kva_seq_new(c, NULL), KVA_ERR_ARG);
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_append(c, a, 6), KVA_OK);
  pg_store_marks(c, a, 6, 10.0f);
  KT_STATUS(kva_seq_new(c, &fr), KVA_OK);
  KT_STATUS(kva_seq_free(c, fr), KVA_OK);
  /* unknown ids: negative, far out, the next generation of a live slot, freed */
  bad[0] = -1;
  bad[1] = INT_MIN;
  bad[2] = INT_MAX;
  bad[3] = a + d.max_seqs;
  bad[4] = fr;
  pg_stats(c, &s0);
  for (i = 0; i < 5; i++) {
    int b = bad[i];
    id = -7;
    KT_CHECK(kva_seq_len(c, b) == -1 && kva_seq_pos(c, b) == -1, "id %d: len/pos", b);
    need = -7;
    KT_CHECK(kva_seq_fits(c, b, 1, &need) == KVA_FITS_NEVER, "id %d: fits", b);
    KT_STATUS(kva_seq_append(c, b, 1), KVA_ERR_SEQ);
    KT_STATUS(kva_seq_free(c, b), KVA_ERR_SEQ);
    KT_STATUS(kva_seq_truncate(c, b, 0), KVA_ERR_SEQ);
    KT_STATUS(kva_seq_fork(c, b, &id), KVA_ERR_SEQ);
    KT_CHECK(id == -7, "failed fork wrote *dst");
    KT_STATUS(kva_store(c, b, 0, k, v, 1), KVA_ERR_SEQ);
    kt_fill_sentinel(o, 64);
    KT_STATUS(kva_attend_cache(c, b, 0, &at, q, 1, o), KVA_ERR_SEQ);
    KT_CHECK(kt_all_sentinel(o, 64), "failed attend_cache wrote its output");
    kt_fill_sentinel(k, 16);
    KT_STATUS(kva_seq_read(c, b, 0, 0, k, v, pos), KVA_ERR_SEQ);
    KT_CHECK(kt_all_sentinel(k, 16), "failed read wrote its output");
    memset(k, 0, sizeof k);
    KT_STATUS(kva_seq_publish(c, b, tok, 4, 0), KVA_ERR_SEQ);
    KT_STATUS(kva_seq_set_evict(c, b, &ev), KVA_ERR_SEQ);
    /* argument errors come before sequence errors */
    KT_STATUS(kva_seq_append(c, b, -1), KVA_ERR_ARG);
    KT_STATUS(kva_seq_truncate(c, b, -1), KVA_ERR_ARG);
    KT_STATUS(kva_seq_fork(c, b, NULL), KVA_ERR_ARG);
    KT_STATUS(kva_store(c, b, -1, k, v, 1), KVA_ERR_ARG);
    KT_STATUS(kva_store(c, b, 1, k, v, 1), KVA_ERR_ARG);
    KT_STATUS(kva_store(c, b, 0, NULL, v, 1), KVA_ERR_ARG);
    KT_STATUS(kva_store(c, b, 0, k, NULL, 1), KVA_ERR_ARG);
    KT_STATUS(kva_store(c, b, 0, k, v, -1), KVA_ERR_ARG);
    KT_STATUS(kva_attend_cache(c, b, 0, NULL, q, 1, o), KVA_ERR_ARG);
    KT_STATUS(kva_attend_cache(c, b, 0, &at_bad, q, 1, o), KVA_ERR_ARG);
    KT_STATUS(kva_attend_cache(c, b, 1, &at, q, 1, o), KVA_ERR_ARG);
    KT_STATUS(kva_attend_cache(c, b, 0, &at, NULL, 1, o), KVA_ERR_ARG);
    KT_STATUS(kva_attend_cache(c, b, 0, &at, q, 1, NULL), KVA_ERR_ARG);
    KT_STATUS(kva_attend_cache(c, b, 0, &at, q, -1, o), KVA_ERR_ARG);
    KT_STATUS(kva_seq_read(c, b, -1, 0, k, v, pos), KVA_ERR_ARG);
    KT_STATUS(kva_seq_read(c, b, 1, 0, k, v, pos), KVA_ERR_ARG);
    KT_STATUS(kva_seq_read(c, b, 0, -1, k, v, pos), KVA_ERR_ARG);
    KT_STATUS(kva_seq_publish(c, b, NULL, 4, 0), KVA_ERR_ARG);
    KT_STATUS(kva_seq_publish(c, b, tok, -1, 0), KVA_ERR_ARG);
    KT_STATUS(kva_seq_set_evict(c, b, NULL), KVA_ERR_ARG);
    ev.budget = 0;
    KT_STATUS(kva_seq_set_evict(c, b, &ev), KVA_ERR_ARG);
    ev.budget = 8;
    KT_CHECK(kva_seq_fits(c, b, -1, &need) == KVA_FITS_NEVER, "fits(-1)");
  }
  pg_stats(c, &s1);
  KT_CHECK(kt_stats_equal(&s1, &s0, 1), "calls with bad ids changed the stats");
  /* new_prefix argument errors; outputs untouched */
  id = reused = -7;
  KT_STATUS(kva_seq_new_prefix(c, NULL, 4, 0, &id, &reused), KVA_ERR_ARG);
  KT_STATUS(kva_seq_new_prefix(c, tok, -1, 0, &id, &reused), KVA_ERR_ARG);
  KT_STATUS(kva_seq_new_prefix(c, tok, 4, 0, NULL, &reused), KVA_ERR_ARG);
  KT_STATUS(kva_seq_new_prefix(c, tok, 4, 0, &id, NULL), KVA_ERR_ARG);
  KT_CHECK(id == -7 && reused == -7, "failed new_prefix wrote its outputs");
  /* sequence-dependent argument errors on a live sequence */
  KT_STATUS(kva_seq_read(c, a, 0, 6, k, v, pos), KVA_ERR_ARG);
  KT_STATUS(kva_seq_truncate(c, a, 7), KVA_ERR_ARG);
  KT_STATUS(kva_seq_publish(c, a, tok, 7, 0), KVA_ERR_ARG);
  KT_STATUS(kva_store(c, a, 0, k, v, 7), KVA_ERR_STEP); /* more than the latest append */
  KT_STATUS(kva_attend_cache(c, a, 0, &at, q, 7, o), KVA_ERR_STEP);
  /* zero-token calls are no-ops */
  pg_stats(c, &s0);
  KT_STATUS(kva_seq_append(c, a, 0), KVA_OK);
  KT_STATUS(kva_store(c, a, 0, k, v, 0), KVA_OK);
  KT_STATUS(kva_attend_cache(c, a, 0, &at, q, 0, o), KVA_OK);
  KT_STATUS(kva_seq_publish(c, a, tok, 0, 0), KVA_OK);
  pg_stats(c, &s1);
  KT_CHECK(pg_stats_same(&s0, &s1), "zero-token calls changed the stats");
  /* append(0) keeps the latest append: the 6 tokens can still be stored */
  KT_STATUS(kva_store(c, a, 0, k, v, 6), KVA_OK);
  /* new_prefix with 0 tokens: an empty sequence */
  id = reused = -7;
  KT_STATUS(kva_seq_new_prefix(c, tok, 0, 0, &id, &reused), KVA_OK);
  KT_CHECK(reused == 0 && kva_seq_len(c, id) == 0 && kva_seq_pos(c, id) == 0, "new_prefix(0): n_reused %d len %d",
           reused, kva_seq_len(c, id));
  KT_STATUS(kva_seq_new_prefix(c, NULL, 0, 0, &j, &reused), KVA_OK);
  /* max_seqs live: the 5th sequence fails, nothing changes */
  KT_STATUS(kva_seq_new(c, &i), KVA_OK); /* a, id, j, i = 4 */
  pg_stats(c, &s0);
  id = reused = -7;
  KT_CHECK(kva_seq_new(c, &id) == KVA_ERR_SEQ_LIMIT && id == -7, "5th kva_seq_new with max_seqs 4");
  KT_CHECK(kva_seq_fork(c, a, &id) == KVA_ERR_SEQ_LIMIT && id == -7, "fork with max_seqs live");
  KT_CHECK(kva_seq_new_prefix(c, tok, 8, 0, &id, &reused) == KVA_ERR_SEQ_LIMIT && id == -7 && reused == -7,
           "new_prefix with max_seqs live");
  pg_stats(c, &s1);
  KT_CHECK(pg_stats_same(&s0, &s1), "failed creations changed the stats (prefix_queries %ld -> %ld)",
           s0.prefix_queries, s1.prefix_queries);
  /* a bad description */
  pg_desc(&d, 4, 0);
  c2 = (kva_cache *)&d;
  KT_STATUS(kva_cache_create(&d, &c2), KVA_ERR_ARG); /* n_blocks 0 and max_bytes 0 */
  KT_CHECK(c2 == (kva_cache *)&d, "failed create wrote *out");
  pg_desc(&d, -1, 4);
  KT_STATUS(kva_cache_create(&d, &c2), KVA_ERR_ARG);
  pg_desc(&d, 4, -4);
  KT_STATUS(kva_cache_create(&d, &c2), KVA_ERR_ARG);
  kva_cache_destroy(c);
}

/* ---------------------------------------------------------------- ids */

static void pg_ids(void) {
  kva_cache_desc d;
  kva_cache *c;
  int *seen, n_seen = 0, live[3], n_live = 0, i, j, rounds = kt_iters(3000);
  kt_rng r;
  kt_begin("paged ids");
  pg_desc(&d, 4, 8);
  d.max_seqs = 3;
  if (kva_cache_create(&d, &c) != KVA_OK) return;
  kt_seed(&r, 99);
  seen = KT_ALLOC(int, rounds + 3);
  for (i = 0; i < rounds; i++) {
    if (n_live < 3 && (n_live == 0 || kt_int(&r, 0, 1))) {
      int id = -1, dup = 0;
      kva_status st = kva_seq_new(c, &id);
      KT_STATUS(st, KVA_OK);
      if (st != KVA_OK) break;
      for (j = 0; j < n_seen; j++) dup |= seen[j] == id;
      KT_CHECK(!dup && id >= 0, "id %d handed out twice", id);
      seen[n_seen++] = id;
      live[n_live++] = id;
    } else {
      int w = kt_int(&r, 0, n_live - 1), id = live[w];
      KT_STATUS(kva_seq_free(c, id), KVA_OK);
      live[w] = live[--n_live];
      KT_STATUS(kva_seq_free(c, id), KVA_ERR_SEQ);
      KT_CHECK(kva_seq_len(c, id) == -1, "freed id %d still has a length", id);
    }
  }
  free(seen);
  kva_cache_destroy(c);
}

/* ---------------------------------------------------------------- copy-on-write */

static void pg_cow(void) {
  kva_cache_desc d;
  kva_cache *c;
  kva_cache_stats s0, s1;
  int a = -1, b = -1, x = -1, e = -1, i, reused = -1;
  int32_t tok[8] = {5, 6, 7, 8, 9, 10, 11, 12};
  kt_begin("paged copy-on-write");
  pg_desc(&d, 4, 12);
  if (kva_cache_create(&d, &c) != KVA_OK) return;
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_append(c, a, 6), KVA_OK);
  pg_store_marks(c, a, 6, 100.0f);
  pg_stats(c, &s0);
  KT_STATUS(kva_seq_fork(c, a, &b), KVA_OK);
  pg_stats(c, &s1);
  KT_CHECK(s1.blocks_used == s0.blocks_used && s1.blocks_free == s0.blocks_free && s1.cow_copies == 0,
           "fork took blocks: used %d -> %d", s0.blocks_used, s1.blocks_used);
  KT_CHECK(s1.tokens_held == 12 && s1.n_seqs == 2, "after fork: tokens_held %ld", s1.tokens_held);
  /* a fork has no latest append; nor has its source any more */
  {
    float kv[2] = {1.0f, 2.0f};
    KT_STATUS(kva_store(c, b, 0, kv, kv, 1), KVA_ERR_STEP);
    KT_STATUS(kva_store(c, a, 0, kv, kv, 1), KVA_ERR_STEP);
  }
  /* child appends into the shared partial block: one copy */
  KT_STATUS(kva_seq_append(c, b, 1), KVA_OK);
  pg_stats(c, &s1);
  KT_CHECK(s1.cow_copies == 1 && s1.blocks_used == s0.blocks_used + 1, "child append: cow %ld, used %d",
           s1.cow_copies, s1.blocks_used);
  pg_store_marks(c, b, 1, 200.0f);
  for (i = 0; i < 6; i++) {
    KT_CHECK(pg_k0(c, a, i) == 100.0f + (float)i, "parent slot %d changed: %g", i, (double)pg_k0(c, a, i));
    KT_CHECK(pg_k0(c, b, i) == 100.0f + (float)i, "child slot %d: %g", i, (double)pg_k0(c, b, i));
  }
  KT_CHECK(pg_k0(c, b, 6) == 206.0f, "child slot 6: %g", (double)pg_k0(c, b, 6));
  KT_CHECK(kva_seq_len(c, a) == 6, "parent length %d", kva_seq_len(c, a));
  /* the parent's partial block is its own again: no copy */
  KT_STATUS(kva_seq_append(c, a, 2), KVA_OK);
  pg_stats(c, &s1);
  KT_CHECK(s1.cow_copies == 1, "parent append after the child copied: cow %ld", s1.cow_copies);
  pg_store_marks(c, a, 2, 300.0f);
  KT_CHECK(pg_k0(c, a, 6) == 306.0f && pg_k0(c, a, 7) == 307.0f && pg_k0(c, b, 6) == 206.0f,
           "after both appended: parent 6 %g, child 6 %g", (double)pg_k0(c, a, 6), (double)pg_k0(c, b, 6));
  /* a full shared block is never written: truncate the fork into it, append */
  KT_STATUS(kva_seq_fork(c, a, &x), KVA_OK);
  KT_STATUS(kva_seq_truncate(c, x, 2), KVA_OK);
  KT_CHECK(kva_seq_len(c, x) == 2 && kva_seq_pos(c, x) == 2, "truncate: len %d pos %d", kva_seq_len(c, x),
           kva_seq_pos(c, x));
  KT_STATUS(kva_seq_append(c, x, 3), KVA_OK);
  pg_stats(c, &s1);
  KT_CHECK(s1.cow_copies == 2, "append into a truncated shared full block: cow %ld", s1.cow_copies);
  pg_store_marks(c, x, 3, 400.0f);
  for (i = 0; i < 8; i++)
    KT_CHECK(pg_k0(c, a, i) == (i < 6 ? 100.0f : 300.0f) + (float)i, "parent slot %d changed by the fork: %g", i,
             (double)pg_k0(c, a, i));
  KT_CHECK(pg_k0(c, x, 1) == 101.0f && pg_k0(c, x, 2) == 402.0f && pg_k0(c, x, 4) == 404.0f,
           "fork after truncate: %g %g %g", (double)pg_k0(c, x, 1), (double)pg_k0(c, x, 2), (double)pg_k0(c, x, 4));
  {
    int32_t p[4] = {-1, -1, -1, -1};
    KT_STATUS(kva_seq_read(c, x, 0, 4, NULL, NULL, p), KVA_OK);
    KT_CHECK(p[0] == 4, "position after truncate + append: %d", (int)p[0]);
  }
  /* a published block the sequence owns alone is not written either */
  KT_STATUS(kva_seq_new(c, &e), KVA_OK);
  KT_STATUS(kva_seq_append(c, e, 8), KVA_OK);
  pg_store_marks(c, e, 8, 500.0f);
  KT_STATUS(kva_seq_publish(c, e, tok, 8, 77), KVA_OK);
  KT_STATUS(kva_seq_truncate(c, e, 6), KVA_OK);
  pg_stats(c, &s0);
  KT_STATUS(kva_seq_append(c, e, 1), KVA_OK);
  pg_stats(c, &s1);
  KT_CHECK(s1.cow_copies == s0.cow_copies + 1, "append into a truncated published block: no copy");
  pg_store_marks(c, e, 1, 600.0f);
  KT_CHECK(pg_k0(c, e, 6) == 606.0f, "e slot 6 %g", (double)pg_k0(c, e, 6));
  {
    int32_t t9[9] = {5, 6, 7, 8, 9, 10, 11, 12, 13};
    KT_STATUS(kva_seq_new_prefix(c, t9, 9, 77, &x, &reused), KVA_OK);
    KT_CHECK(reused == 8, "prefix after the publisher truncated: n_reused %d", reused);
    for (i = 0; i < reused; i++)
      KT_CHECK(pg_k0(c, x, i) == 500.0f + (float)i, "published slot %d was modified: %g", i, (double)pg_k0(c, x, i));
  }
  kva_cache_destroy(c);
}

/* ---------------------------------------------------------------- fits */

static void pg_fits(void) {
  kva_cache_desc d;
  kva_cache *c;
  kva_cache_stats s0, s1;
  int a = -1, b = -1, x = -1, need = -1;
  kva_fit f;
  int32_t tok[16];
  kt_begin("paged fits");
  pg_desc(&d, 4, 4);
  if (kva_cache_create(&d, &c) != KVA_OK) return;
  for (a = 0; a < 16; a++) tok[a] = a;
  /* exact boundary: NOW means the append succeeds */
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_append(c, a, 3), KVA_OK);
  pg_store_marks(c, a, 3, 0.0f);
  f = kva_seq_fits(c, a, 13, &need);
  KT_CHECK(f == KVA_FITS_NOW && need == 3, "fits(a, 13): %d, %d blocks", (int)f, need);
  f = kva_seq_fits(c, a, 14, &need);
  KT_CHECK(f == KVA_FITS_NEVER && need == 4, "fits(a, 14) in a pool of 4 blocks: %d, %d blocks", (int)f, need);
  f = kva_seq_fits(c, a, 0, &need);
  KT_CHECK(f == KVA_FITS_NOW && need == 0, "fits(a, 0): %d, %d blocks", (int)f, need);
  KT_STATUS(kva_seq_append(c, a, 13), KVA_OK);
  KT_STATUS(kva_seq_new(c, &b), KVA_OK);
  f = kva_seq_fits(c, b, 1, &need);
  KT_CHECK(f == KVA_FITS_LATER && need == 1, "fits(b, 1) with the pool held by a: %d, %d blocks", (int)f, need);
  pg_stats(c, &s0);
  KT_STATUS(kva_seq_append(c, b, 1), KVA_ERR_FULL);
  pg_stats(c, &s1);
  KT_CHECK(kt_stats_equal(&s0, &s1, 1) && s1.appends_failed == s0.appends_failed + 1,
           "KVA_ERR_FULL: stats changed, or appends_failed %ld -> %ld", s0.appends_failed, s1.appends_failed);
  KT_CHECK(kva_seq_len(c, b) == 0 && kva_seq_pos(c, b) == 0, "failed append moved b");
  /* cached (published, unreferenced) blocks count as available */
  pg_store_marks(c, a, 13, 0.0f);
  KT_STATUS(kva_seq_publish(c, a, tok, 16, 3), KVA_OK);
  KT_STATUS(kva_seq_free(c, a), KVA_OK);
  f = kva_seq_fits(c, b, 16, &need);
  KT_CHECK(f == KVA_FITS_NOW && need == 4, "fits(b, 16) with 4 cached blocks: %d, %d blocks", (int)f, need);
  KT_STATUS(kva_seq_append(c, b, 16), KVA_OK);
  pg_stats(c, &s1);
  KT_CHECK(s1.prefix_forgotten == 4 && s1.blocks_cached == 0, "recycled 4 cached blocks: forgotten %ld, cached %d",
           s1.prefix_forgotten, s1.blocks_cached);
  KT_STATUS(kva_seq_free(c, b), KVA_OK);

  /* the copy-on-write block of a tail shared with a fork is needed only
     while the fork holds it: that is LATER, not NEVER */
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_append(c, a, 6), KVA_OK);
  KT_STATUS(kva_seq_fork(c, a, &x), KVA_OK);
  f = kva_seq_fits(c, a, 10, &need);
  KT_CHECK(need == 3, "fits(a, 10) with a shared partial tail: %d blocks, want 3 (2 + a copy)", need);
  KT_CHECK(f == KVA_FITS_LATER,
           "fits(a, 10) = %s with the partial tail shared by a fork (2 held + 2 new fit the pool of 4 "
           "once the fork is freed), want LATER",
           f == KVA_FITS_NEVER ? "NEVER" : f == KVA_FITS_NOW ? "NOW" : "LATER");
  KT_STATUS(kva_seq_append(c, a, 10), KVA_ERR_FULL);
  KT_STATUS(kva_seq_free(c, x), KVA_OK);
  f = kva_seq_fits(c, a, 10, &need);
  KT_CHECK(f == KVA_FITS_NOW && need == 2, "after freeing the fork: %d, %d blocks", (int)f, need);
  KT_STATUS(kva_seq_append(c, a, 10), KVA_OK);
  kva_cache_destroy(c);
}

/* ---------------------------------------------------------------- LRU */

static int pg_make(kva_cache *c, const kva_cache_desc *d, const int32_t *t, int n, uint64_t salt) {
  return pm_make_published(c, d, t, n, salt, 1);
}

static void pg_lru(void) {
  kva_cache_desc d;
  kva_cache *c;
  kva_cache_stats s;
  int32_t ta[5] = {1, 2, 3, 4, 99}, tb[5] = {5, 6, 7, 8, 99}, tc[5] = {9, 10, 11, 12, 99};
  int a = -1, b = -1, cc = -1, x = -1, p = -1;
  kt_begin("paged LRU");
  pg_desc(&d, 2, 8);
  if (kva_cache_create(&d, &c) != KVA_OK) return;
  a = pg_make(c, &d, ta, 4, 0);
  b = pg_make(c, &d, tb, 4, 0);
  cc = pg_make(c, &d, tc, 4, 0);
  KT_CHECK(a >= 0 && b >= 0 && cc >= 0, "make");
  /* published blocks outlive their sequence */
  KT_STATUS(kva_seq_free(c, a), KVA_OK);
  KT_STATUS(kva_seq_free(c, b), KVA_OK);
  KT_STATUS(kva_seq_free(c, cc), KVA_OK);
  pg_stats(c, &s);
  KT_CHECK(s.blocks_cached == 6 && s.blocks_free == 2 && s.blocks_used == 0, "cached %d free %d used %d",
           s.blocks_cached, s.blocks_free, s.blocks_used);
  /* LRU order now: a1 a0 b1 b0 c1 c0 (tails first). A hit on b makes b the newest. */
  pm_probe(c, &d, tb, 5, 0, 4, "b whole");
  /* order: a1 a0 c1 c0 b1 b0.  Taking the 2 free blocks recycles nothing */
  KT_STATUS(kva_seq_new(c, &x), KVA_OK);
  KT_STATUS(kva_seq_append(c, x, 4), KVA_OK);
  pg_stats(c, &s);
  KT_CHECK(s.blocks_cached == 6 && s.prefix_forgotten == 0, "free blocks first: cached %d, forgotten %ld",
           s.blocks_cached, s.prefix_forgotten);
  pm_probe(c, &d, ta, 5, 0, 4, "a whole while free blocks were left");
  /* order: c1 c0 b1 b0 a1 a0.  One more block: c's tail goes */
  KT_STATUS(kva_seq_append(c, x, 2), KVA_OK);
  pg_stats(c, &s);
  KT_CHECK(s.blocks_cached == 5 && s.prefix_forgotten == 1, "one recycled: cached %d, forgotten %ld",
           s.blocks_cached, s.prefix_forgotten);
  pm_probe(c, &d, tc, 5, 0, 2, "c lost its tail (least recently used), kept its head");
  pm_probe(c, &d, tb, 5, 0, 4, "b whole");
  pm_probe(c, &d, ta, 5, 0, 4, "a whole");
  /* the probes released c0, then b1 b0, then a1 a0: order c0 b1 b0 a1 a0.
     Two more blocks: c0 and b1 go */
  KT_STATUS(kva_seq_append(c, x, 4), KVA_OK);
  pm_probe(c, &d, tc, 5, 0, 0, "c gone");
  pm_probe(c, &d, tb, 5, 0, 2, "b lost its tail");
  pm_probe(c, &d, ta, 5, 0, 4, "a whole (most recently used)");
  /* a held by a live sequence cannot be recycled: fill the pool */
  KT_STATUS(kva_seq_new_prefix(c, ta, 5, 0, &p, &a), KVA_OK);
  KT_CHECK(a == 4, "hold a: n_reused %d", a);
  pg_stats(c, &s);
  KT_CHECK(s.blocks_cached == 1, "cached %d (b0)", s.blocks_cached);
  KT_STATUS(kva_seq_append(c, x, 2), KVA_OK); /* takes b0 */
  KT_STATUS(kva_seq_append(c, x, 2), KVA_ERR_FULL);
  pm_probe(c, &d, ta, 5, 0, 4, "a, held by a live sequence, survives a full pool");
  pm_probe(c, &d, tb, 5, 0, 0, "b gone");
  kva_cache_destroy(c);
}

/* ---------------------------------------------------------------- prefix_max_age */

static void pg_max_age(void) {
  kva_cache_desc d;
  kva_cache *c;
  kva_cache_stats s;
  int32_t ta[5] = {1, 2, 3, 4, 99}, tb[5] = {5, 6, 7, 8, 99};
  int a = -1, b = -1, x = -1, y = -1, i;
  long f0;
  kt_begin("paged prefix_max_age");
  pg_desc(&d, 2, 12);
  d.prefix_max_age = 3;
  if (kva_cache_create(&d, &c) != KVA_OK) return;
  a = pg_make(c, &d, ta, 4, 0);                     /* append #1 */
  KT_STATUS(kva_seq_free(c, a), KVA_OK);            /* a's blocks released after append #1 */
  KT_STATUS(kva_seq_new(c, &x), KVA_OK);
  KT_STATUS(kva_seq_new(c, &y), KVA_OK);
  KT_STATUS(kva_seq_append(c, x, 1), KVA_OK);       /* 1 append since */
  KT_STATUS(kva_seq_append(c, x, 1), KVA_OK);       /* 2 */
  pg_stats(c, &s);
  KT_CHECK(s.blocks_cached == 2, "after 2 appends: cached %d", s.blocks_cached);
  /* zero-token and failed appends do not count */
  for (i = 0; i < 5; i++) {
    KT_STATUS(kva_seq_append(c, x, 0), KVA_OK);
    KT_STATUS(kva_seq_append(c, y, 1000), KVA_ERR_FULL);
  }
  pg_stats(c, &s);
  KT_CHECK(s.blocks_cached == 2 && s.prefix_forgotten == 0, "after no-op and failed appends: cached %d forgotten %ld",
           s.blocks_cached, s.prefix_forgotten);
  pm_probe(c, &d, ta, 5, 0, 4, "a after 2 appends (a hit makes it young again)");
  KT_STATUS(kva_seq_append(c, x, 1), KVA_OK);
  KT_STATUS(kva_seq_append(c, x, 1), KVA_OK);
  pg_stats(c, &s);
  KT_CHECK(s.blocks_cached == 2, "2 appends after the hit: cached %d", s.blocks_cached);
  KT_STATUS(kva_seq_append(c, x, 1), KVA_OK); /* the 3rd: forgotten */
  pg_stats(c, &s);
  KT_CHECK(s.blocks_cached == 0 && s.prefix_forgotten == 2, "3 appends unused: cached %d, forgotten %ld",
           s.blocks_cached, s.prefix_forgotten);
  pm_probe(c, &d, ta, 5, 0, 0, "a forgotten");
  /* a published block in use is not aged */
  f0 = s.prefix_forgotten;
  b = pg_make(c, &d, tb, 4, 0);
  for (i = 0; i < 8; i++) KT_STATUS(kva_seq_append(c, x, 1), KVA_OK);
  pg_stats(c, &s);
  KT_CHECK(s.prefix_forgotten == f0, "blocks held by a live sequence were forgotten");
  pm_probe(c, &d, tb, 5, 0, 4, "b, live, after 8 appends");
  KT_STATUS(kva_seq_free(c, b), KVA_OK);
  for (i = 0; i < 3; i++) KT_STATUS(kva_seq_append(c, x, 1), KVA_OK);
  pm_probe(c, &d, tb, 5, 0, 0, "b, 3 appends after its sequence ended");
  kva_cache_destroy(c);
}

/* ---------------------------------------------------------------- allocation */

typedef struct {
  long calls, fail_at, frees, live_n, live_bytes, bad;
  size_t max_size;
} pg_alloc_state;

static void *pg_alloc_fn(size_t size, size_t align, void *user) {
  pg_alloc_state *a = (pg_alloc_state *)user;
  unsigned char *raw, *p;
  size_t hdr = 2 * sizeof(size_t) + sizeof(void *), al = align ? align : 1;
  a->calls++;
  if (a->fail_at && a->calls == a->fail_at) return NULL;
  if (size > a->max_size) return NULL;
  if (al & (al - 1)) a->bad++; /* not a power of two */
  raw = (unsigned char *)malloc(size + al + hdr);
  if (!raw) return NULL;
  p = raw + hdr;
  p += (al - (size_t)((uintptr_t)p % al)) % al;
  memcpy(p - hdr, &raw, sizeof raw);
  memcpy(p - hdr + sizeof(void *), &size, sizeof size);
  a->live_n++;
  a->live_bytes += (long)size;
  return p;
}

static void pg_free_fn(void *vp, size_t size, void *user) {
  pg_alloc_state *a = (pg_alloc_state *)user;
  unsigned char *p = (unsigned char *)vp, *raw;
  size_t hdr = 2 * sizeof(size_t) + sizeof(void *), was;
  if (!p) return;
  memcpy(&raw, p - hdr, sizeof raw);
  memcpy(&was, p - hdr + sizeof(void *), sizeof was);
  if (was != size) a->bad++;
  a->frees++;
  a->live_n--;
  a->live_bytes -= (long)was;
  free(raw);
}

static void pg_workload(kva_cache *c) {
  int a = -1, b = -1, p = -1, r = -1, i;
  int32_t tok[20];
  float k[64], v[64], o[64], q[64];
  kva_attn at;
  for (i = 0; i < 20; i++) tok[i] = i % 3;
  for (i = 0; i < 64; i++) k[i] = v[i] = q[i] = 0.25f * (float)(i % 7);
  memset(&at, 0, sizeof at);
  at.n_heads = 2;
  at.n_kv_heads = 1;
  at.head_dim = 2;
  at.n_threads = 1;
  kva_seq_new(c, &a);
  kva_seq_append(c, a, 9);
  kva_store(c, a, 0, k, v, 9);
  kva_attend_cache(c, a, 0, &at, q, 1, o);
  kva_seq_publish(c, a, tok, 9, 1);
  kva_seq_fork(c, a, &b);
  kva_seq_append(c, b, 3);
  kva_store(c, b, 0, k, v, 3);
  kva_attend_cache(c, b, 0, &at, q, 1, o);
  kva_seq_truncate(c, a, 5);
  kva_seq_append(c, a, 2);
  kva_seq_new_prefix(c, tok, 12, 1, &p, &r);
  kva_seq_fits(c, p, 40, NULL);
  kva_seq_append(c, p, 1000);
  kva_seq_read(c, p, 0, 0, k, v, NULL);
  kva_seq_free(c, a);
  kva_cache_reset_prefix(c);
  kva_seq_free(c, b);
}

static void pg_alloc(void) {
  kva_cache_desc d;
  kva_cache *c, *sent = (kva_cache *)&d;
  pg_alloc_state st;
  kva_status s;
  long n, m0, f0;
  int succeeded = 0;
  kt_begin("paged allocation");
  /* a test allocator failing the Nth allocation */
  for (n = 1; n <= 8 && !succeeded; n++) {
    pg_desc(&d, 4, 16);
    memset(&st, 0, sizeof st);
    st.fail_at = n;
    st.max_size = (size_t)1 << 30;
    d.alloc_fn = pg_alloc_fn;
    d.free_fn = pg_free_fn;
    d.user = &st;
    c = sent;
    s = kva_cache_create(&d, &c);
    if (s == KVA_OK) {
      long calls = st.calls;
      succeeded = 1;
      KT_CHECK(st.live_n >= 1, "create succeeded without allocating");
      pg_workload(c);
      KT_CHECK(st.calls == calls, "allocations after kva_cache_create: %ld", st.calls - calls);
      kva_cache_destroy(c);
      KT_CHECK(st.live_n == 0 && st.live_bytes == 0 && st.bad == 0,
               "after destroy: %ld blocks / %ld bytes still live, %ld bad frees", st.live_n, st.live_bytes, st.bad);
    } else {
      KT_STATUS(s, KVA_ERR_NOMEM);
      KT_CHECK(c == sent, "failed create (allocation %ld) wrote *out", n);
      KT_CHECK(st.live_n == 0 && st.live_bytes == 0 && st.bad == 0,
               "failed create (allocation %ld): %ld allocations / %ld bytes leaked", n, st.live_n, st.live_bytes);
    }
  }
  KT_CHECK(succeeded, "kva_cache_create never succeeded");
  /* alloc_fn without free_fn (or the reverse) is an argument error */
  pg_desc(&d, 4, 16);
  memset(&st, 0, sizeof st);
  st.max_size = (size_t)1 << 30;
  d.alloc_fn = pg_alloc_fn;
  d.user = &st;
  KT_STATUS(kva_cache_create(&d, &c), KVA_ERR_ARG);
  d.alloc_fn = NULL;
  d.free_fn = pg_free_fn;
  KT_STATUS(kva_cache_create(&d, &c), KVA_ERR_ARG);
  KT_CHECK(st.calls == 0 && st.live_n == 0, "argument error allocated");
  /* an absurd pool: NOMEM (or ARG), never a crash, nothing leaked */
  pg_desc(&d, 16, 1 << 24);
  d.n_layers = 64;
  d.head_dim = 1024;
  d.n_kv_heads = 8;
  d.alloc_fn = pg_alloc_fn;
  d.free_fn = pg_free_fn;
  d.user = &st;
  c = sent;
  s = kva_cache_create(&d, &c);
  KT_CHECK(s == KVA_ERR_NOMEM || s == KVA_ERR_ARG, "huge pool: %s", kva_status_str(s));
  if (s == KVA_OK) kva_cache_destroy(c);
  KT_CHECK(c == sent && st.live_n == 0, "huge pool: wrote *out or leaked");

  /* the default allocator (KVATTN_MALLOC, counted in this file) */
  pg_desc(&d, 4, 16);
  m0 = pg_mallocs;
  f0 = pg_frees;
  pg_fail_at = pg_mallocs + 1;
  c = sent;
  s = kva_cache_create(&d, &c);
  pg_fail_at = 0;
  KT_STATUS(s, KVA_ERR_NOMEM);
  KT_CHECK(c == sent, "failed create wrote *out");
  KT_CHECK(pg_mallocs - m0 - (pg_frees - f0) == 1, "KVATTN_MALLOC failure: %ld mallocs (1 failed), %ld frees",
           pg_mallocs - m0, pg_frees - f0);
  m0 = pg_mallocs;
  f0 = pg_frees;
  if (kva_cache_create(&d, &c) == KVA_OK) {
    long m1 = pg_mallocs;
    pg_workload(c);
    KT_CHECK(pg_mallocs == m1, "KVATTN_MALLOC called %ld times by block operations and decode attention",
             pg_mallocs - m1);
    kva_cache_destroy(c);
    KT_CHECK(pg_mallocs - m0 == pg_frees - f0, "default allocator: %ld mallocs, %ld frees", pg_mallocs - m0,
             pg_frees - f0);
  } else {
    KT_CHECK(0, "kva_cache_create with KVATTN_MALLOC");
  }
}

/* F16 cache: stored values read back f16-rounded (and exact for the random model) */
static void pg_f16_rounding(void) {
  kva_cache_desc d;
  kva_cache *c;
  float k[8], v[8], rk[8], rv[8];
  int a = -1, i, good = 1;
  kt_begin("paged f16 read-back");
  pg_desc(&d, 4, 4);
  d.dtype = KVA_DTYPE_DEFAULT; /* F16 */
  d.head_dim = 8;
  if (kva_cache_create(&d, &c) != KVA_OK) return;
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_append(c, a, 1), KVA_OK);
  for (i = 0; i < 8; i++) {
    k[i] = 1.0f + (float)i * 0.000244140625f + 0.0001f; /* between f16 neighbours near 1 */
    v[i] = -70000.0f + (float)i * 1e4f;                 /* some beyond the f16 range */
  }
  k[7] = 1e-6f; /* f16 subnormal */
  KT_STATUS(kva_store(c, a, 0, k, v, 1), KVA_OK);
  KT_STATUS(kva_seq_read(c, a, 0, 0, rk, rv, NULL), KVA_OK);
  for (i = 0; i < 8; i++) good &= kt_f2u(rk[i]) == kt_f2u(ref_round_f16(k[i])) && kt_f2u(rv[i]) == kt_f2u(ref_round_f16(v[i]));
  KT_CHECK(good, "F16 cache read-back is not the f16-rounded value");
  kva_cache_destroy(c);
}

/* a sequence that evicted tokens can be neither published nor truncated */
static void pg_evicted(void) {
  kva_cache_desc d;
  kva_cache *c;
  kva_evict ev;
  int a = -1, p = -1, reused = -1;
  int32_t tok[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  kva_cache_stats s0, s1;
  kt_begin("paged evicted sequences");
  pg_desc(&d, 4, 8);
  if (kva_cache_create(&d, &c) != KVA_OK) return;
  memset(&ev, 0, sizeof ev);
  ev.kind = KVA_EVICT_WINDOW;
  ev.budget = 4;
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_set_evict(c, a, &ev), KVA_OK);
  KT_STATUS(kva_seq_append(c, a, 4), KVA_OK);
  pg_store_marks(c, a, 4, 0.0f);
  KT_STATUS(kva_seq_publish(c, a, tok, 4, 5), KVA_OK); /* nothing evicted yet */
  KT_STATUS(kva_seq_append(c, a, 4), KVA_OK);         /* evicts the first 4 */
  KT_CHECK(kva_seq_len(c, a) == 4 && kva_seq_pos(c, a) == 8, "window 4: len %d pos %d", kva_seq_len(c, a),
           kva_seq_pos(c, a));
  pg_stats(c, &s0);
  KT_STATUS(kva_seq_publish(c, a, tok, 4, 5), KVA_ERR_UNSUPPORTED);
  pg_stats(c, &s1);
  KT_CHECK(pg_stats_same(&s0, &s1) && kva_seq_len(c, a) == 4 && kva_seq_pos(c, a) == 8,
           "failed publish changed something");
  /* the 4 held are the newest step's (appended after its eviction): a rollback within it works */
  KT_STATUS(kva_seq_truncate(c, a, 2), KVA_OK);
  KT_CHECK(kva_seq_len(c, a) == 2 && kva_seq_pos(c, a) == 6, "truncate within the step: len %d pos %d",
           kva_seq_len(c, a), kva_seq_pos(c, a));
  KT_STATUS(kva_seq_truncate(c, a, 1), KVA_ERR_UNSUPPORTED); /* the truncate ended the step */
  /* what was published before the eviction still serves the same K/V */
  KT_STATUS(kva_seq_new_prefix(c, tok, 5, 5, &p, &reused), KVA_OK);
  KT_CHECK(reused == 4, "block published before the eviction: n_reused %d", reused);
  if (reused == 4) KT_CHECK(pg_k0(c, p, 0) == 0.0f && pg_k0(c, p, 3) == 3.0f, "evicted block's content changed");
  kva_cache_destroy(c);
}


/* kva_seq_append_all: all or nothing. Random pools with forks (shared
   blocks) and window eviction: on KVA_OK every sequence grew by its count;
   on KVA_ERR_FULL nothing changed (stats, lengths, positions) and one failure
   is counted. Without sharing or eviction the answer is exact: OK exactly when
   the new blocks fit the free ones. */
static void pg_append_all(void) {
  kt_rng r;
  int iter;
  kt_begin("paged: kva_seq_append_all (batch admission)");
  kt_seed(&r, 0xA11);
  for (iter = 0; iter < kt_iters(300); iter++) {
    kva_cache_desc d;
    kva_cache *c;
    kva_cache_stats s0, s1;
    int ids[6], n[6], len0[6], pos0[6], ns = kt_int(&r, 1, 6), i, plain = iter % 2, step;
    pg_desc(&d, kt_int(&r, 1, 4), kt_int(&r, 4, 24));
    if (kva_cache_create(&d, &c) != KVA_OK) {
      KT_CHECK(0, "create");
      return;
    }
    for (i = 0; i < ns; i++) {
      if (!plain && i > 0 && kt_int(&r, 0, 2) == 0) {
        KT_STATUS(kva_seq_fork(c, ids[kt_int(&r, 0, i - 1)], &ids[i]), KVA_OK);
      } else {
        KT_STATUS(kva_seq_new(c, &ids[i]), KVA_OK);
        if (kva_seq_append(c, ids[i], kt_int(&r, 0, 2 * d.block_size)) == KVA_OK) pg_store_marks(c, ids[i], 0, 0);
      }
      if (!plain && kt_int(&r, 0, 2) == 0) {
        kva_evict e;
        memset(&e, 0, sizeof e);
        e.kind = KVA_EVICT_WINDOW;
        e.budget = kt_int(&r, 1, 3 * d.block_size);
        KT_STATUS(kva_seq_set_evict(c, ids[i], &e), KVA_OK);
      }
    }
    for (step = 0; step < 6; step++) {
      int free_blocks, need = 0;
      kva_status st;
      pg_stats(c, &s0);
      free_blocks = s0.blocks_free + s0.blocks_cached;
      for (i = 0; i < ns; i++) {
        n[i] = kt_int(&r, 0, 2 * d.block_size + 1);
        len0[i] = kva_seq_len(c, ids[i]);
        pos0[i] = kva_seq_pos(c, ids[i]);
        need += (len0[i] + n[i] + d.block_size - 1) / d.block_size - (len0[i] + d.block_size - 1) / d.block_size;
      }
      st = kva_seq_append_all(c, ids, n, ns);
      pg_stats(c, &s1);
      if (st == KVA_OK) {
        for (i = 0; i < ns; i++)
          KT_CHECK(kva_seq_pos(c, ids[i]) == pos0[i] + n[i], "append_all OK but seq %d pos %d, want %d + %d", i,
                   kva_seq_pos(c, ids[i]), pos0[i], n[i]);
      } else {
        KT_CHECK(st == KVA_ERR_FULL, "append_all = %s", kva_status_str(st));
        KT_CHECK(kt_stats_equal(&s0, &s1, 1) && s1.appends_failed == s0.appends_failed + 1,
                 "refused append_all changed the stats");
        for (i = 0; i < ns; i++)
          KT_CHECK(kva_seq_len(c, ids[i]) == len0[i] && kva_seq_pos(c, ids[i]) == pos0[i],
                   "refused append_all moved seq %d", i);
      }
      if (plain)
        KT_CHECK((st == KVA_OK) == (need <= free_blocks), "plain pool: %d new blocks, %d free: %s", need,
                 free_blocks, kva_status_str(st));
    }
    {
      int dup[2], nn[2] = {1, 1};
      dup[0] = dup[1] = ids[0];
      KT_STATUS(kva_seq_append_all(c, dup, nn, 2), KVA_ERR_ARG);
      KT_STATUS(kva_seq_append_all(c, ids, NULL, 1), KVA_ERR_ARG);
      KT_STATUS(kva_seq_append_all(NULL, ids, nn, 1), KVA_ERR_ARG);
      KT_STATUS(kva_seq_append_all(c, ids, nn, -1), KVA_ERR_ARG);
      KT_STATUS(kva_seq_append_all(c, NULL, NULL, 0), KVA_OK);
      nn[0] = -1;
      KT_STATUS(kva_seq_append_all(c, ids, nn, 1), KVA_ERR_ARG);
      dup[1] = 12345;
      nn[0] = 1;
      KT_STATUS(kva_seq_append_all(c, dup, nn, 2), KVA_ERR_SEQ);
    }
    kva_cache_destroy(c);
  }
}

void test_paged(void) {
  pg_bad_input();
  pg_append_all();
  pg_ids();
  pg_cow();
  pg_fits();
  pg_lru();
  pg_max_age();
  pg_alloc();
  pg_f16_rounding();
  pg_evicted();
  kt_begin("paged prefix");
  pm_prefix_directed(0);
  pg_random();
}
