/* test_tier.c - the prefix tier: kva_cache_desc.spill / fetch / tier_user,
 * kva_prefix_record_size, kva_prefix_key, kva_sha256.
 *
 * Written from docs/API.md ("Prefix tier"). The store is an in-memory table
 * of records by key that can fail, stall (an error status), hand back a
 * record cut short, with one bit flipped, or filed under another key.
 *
 *   - tt_sha: kva_sha256 against FIPS 180-4's examples; kva_prefix_key
 *     against SHA-256 of the documented byte string;
 *   - tt_roundtrip: per storage type, a published 3-block prefix forgotten
 *     by the LRU spills 3 records of kva_prefix_record_size bytes under the
 *     documented chain of keys; a later lookup fetches them (also when the
 *     first block is still in memory) and the rows and positions are bit
 *     for bit the original's; another salt reuses nothing;
 *   - tt_attention: the attention of a token over a fetched prefix, with and
 *     without block selection (bounds rebuilt from the rows), bit for bit
 *     the original's;
 *   - tt_refusals: a record with any one byte's bit flipped, cut at any
 *     length, filed under another key, or of another cache shape is refused
 *     (counted, the lookup a miss, the pool unchanged); a store that fails
 *     is a miss; a spill that fails is counted and changes nothing else;
 *     kva_cache_reset_prefix spills nothing; description rules;
 *   - tt_load: kva_prefix_load takes saved records into a new cache in any
 *     order (children first: they wait for their parents), after which
 *     lookups find them without the store, bit for bit, salts apart; flipped,
 *     cut and forged records are refused and change nothing; a full pool is
 *     KVA_ERR_FULL and a load never recycles a cached block. */
#include "kvattn.h"
#include "harness.h"

#define TT_MAX 64
typedef struct {
  uint8_t key[TT_MAX][32];
  unsigned char *rec[TT_MAX];
  size_t size[TT_MAX];
  int n;
  int fail_spill, fail_fetch; /* return an error status */
  long flip_at;               /* >= 0: a fetched record has bit 3 of this byte flipped */
  long cut_to;                /* >= 0: a fetched record is cut to this many bytes */
  int other_key;              /* a fetch is answered with the next stored record after the one asked for */
  long spills, fetches;
} tt_store;

static int tt_find(const tt_store *s, const uint8_t key[32]) {
  int i;
  for (i = 0; i < s->n; i++)
    if (memcmp(s->key[i], key, 32) == 0) return i;
  return -1;
}
static kva_status tt_spill(void *user, const uint8_t key[32], const void *rec, size_t size) {
  tt_store *s = (tt_store *)user;
  int i = tt_find(s, key);
  s->spills++;
  if (s->fail_spill) return KVA_ERR_FULL;
  if (i < 0) {
    if (s->n == TT_MAX) return KVA_ERR_FULL;
    i = s->n++;
    memcpy(s->key[i], key, 32);
  } else {
    free(s->rec[i]);
  }
  s->rec[i] = (unsigned char *)malloc(size);
  memcpy(s->rec[i], rec, size);
  s->size[i] = size;
  return KVA_OK;
}
static kva_status tt_fetch(void *user, const uint8_t key[32], void *rec, size_t cap, size_t *size) {
  tt_store *s = (tt_store *)user;
  int i = tt_find(s, key);
  size_t n;
  s->fetches++;
  if (s->other_key && i >= 0) i = (i + 1) % s->n;
  if (s->fail_fetch || i < 0) return KVA_ERR_ARG;
  n = s->size[i];
  if (s->cut_to >= 0 && (size_t)s->cut_to < n) n = (size_t)s->cut_to;
  if (n > cap) n = cap;
  memcpy(rec, s->rec[i], n);
  if (s->flip_at >= 0 && (size_t)s->flip_at < n) ((unsigned char *)rec)[s->flip_at] ^= 8;
  *size = n;
  return KVA_OK;
}
static void tt_store_init(tt_store *s) {
  memset(s, 0, sizeof *s);
  s->flip_at = s->cut_to = -1;
}
static void tt_store_free(tt_store *s) {
  int i;
  for (i = 0; i < s->n; i++) free(s->rec[i]);
  s->n = 0;
}

/* bytes of one stored row, from docs/API.md "Storage types of a cache" */
static size_t tt_row_bytes(kva_dtype t, int dim) {
  switch (t) {
    case KVA_F32: return 4 * (size_t)dim;
    case KVA_INT8: return (size_t)dim + 4;
    case KVA_FP8_E4M3: case KVA_FP8_E5M2: return (size_t)dim;
    case KVA_INT4: return (size_t)(dim / 32) * 20 + (dim % 32 ? 4 + (size_t)(dim % 32 + 1) / 2 : 0);
    default: return 2 * (size_t)dim;
  }
}

static void tt_sha(void) {
  static const char *const in[3] = {"abc", "", "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"};
  static const char *const want[3] = {"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
                                      "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                                      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"};
  uint8_t d[32], k[32], parent[32];
  unsigned char msg[15 + 32 + 8 + 4 * 3];
  const int32_t tok[3] = {7, -1, 65536};
  char hex[65];
  int i, j;
  kt_begin("tier sha256");
  for (j = 0; j < 3; j++) {
    kva_sha256(in[j], strlen(in[j]), d);
    for (i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
    KT_CHECK(strcmp(hex, want[j]) == 0, "sha256(\"%s\") = %s", in[j], hex);
  }
  /* kva_prefix_key: "kvattn-prefix-1", the parent's key (zeros: none), salt LE, token ids LE */
  for (j = 0; j < 2; j++) {
    uint64_t salt = 0x0102030405060708ull;
    for (i = 0; i < 32; i++) parent[i] = (uint8_t)(j ? 3 * i + 1 : 0);
    memcpy(msg, "kvattn-prefix-1", 15);
    memcpy(msg + 15, parent, 32);
    for (i = 0; i < 8; i++) msg[47 + i] = (unsigned char)(salt >> (8 * i));
    for (i = 0; i < 12; i++) msg[55 + i] = (unsigned char)((uint32_t)tok[i / 4] >> (8 * (i % 4)));
    kva_sha256(msg, sizeof msg, d);
    kva_prefix_key(j ? parent : NULL, salt, tok, 3, k);
    KT_CHECK(memcmp(d, k, 32) == 0, "kva_prefix_key (parent %s) differs from SHA-256 of the documented bytes",
             j ? "given" : "NULL");
  }
}

enum { TT_L = 2, TT_G = 2, TT_D = 20, TT_BS = 4, TT_H = 4 };

static kva_cache *tt_cache(tt_store *st, kva_dtype t, int n_blocks, int bounds) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  memset(&d, 0, sizeof d);
  d.n_layers = TT_L, d.n_kv_heads = TT_G, d.head_dim = TT_D, d.block_size = TT_BS, d.n_blocks = n_blocks;
  d.dtype = t;
  d.k_scale = d.v_scale = 0.25f;
  d.block_bounds = bounds;
  d.spill = tt_spill, d.fetch = tt_fetch, d.tier_user = st;
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  return c;
}

/* fill tokens [from, to) of every layer with pseudo-random rows */
static void tt_store_rows(kva_cache *c, int seq, int from, int to, uint32_t seed) {
  float k[TT_G * TT_D], v[TT_G * TT_D];
  int t, l, i;
  for (t = from; t < to; t++)
    for (l = 0; l < TT_L; l++) {
      for (i = 0; i < TT_G * TT_D; i++) {
        seed = seed * 1664525u + 1013904223u;
        k[i] = (float)((int)(seed >> 9) % 2001 - 1000) / 500.0f;
        seed = seed * 1664525u + 1013904223u;
        v[i] = (float)((int)(seed >> 9) % 2001 - 1000) / 500.0f;
      }
      KT_STATUS(kva_store_at(c, seq, l, t - from, k, v, 1), KVA_OK);
    }
}

static void tt_roundtrip(void) {
  static const kva_dtype types[5] = {KVA_F16, KVA_F32, KVA_INT8, KVA_INT4, KVA_FP8_E4M3};
  int ti;
  kt_begin("tier roundtrip");
  for (ti = 0; ti < 5; ti++) {
    const kva_dtype t = types[ti];
    const int n_blocks = 8;
    tt_store st;
    kva_cache *c;
    kva_cache_stats cs;
    int32_t tok[13];
    float rows_k[12][TT_L][TT_G * TT_D], rows_v[12][TT_L][TT_G * TT_D];
    int32_t pos[TT_G];
    int a = -1, b = -1, r, reused = 0, i, l, j, round;
    size_t want_bytes;
    tt_store_init(&st);
    c = tt_cache(&st, t, n_blocks, 0);
    if (!c) continue;
    want_bytes = 128 + 4 * TT_BS + 8;
    for (l = 0; l < TT_L; l++)
      want_bytes += 8 + 8 * TT_G + (size_t)TT_G * TT_BS * (tt_row_bytes(t, TT_D) * 2);
    KT_CHECK(kva_prefix_record_size(c) == want_bytes, "%s: record size %zu, want %zu", kva_dtype_name(t),
             kva_prefix_record_size(c), want_bytes);
    for (i = 0; i < 13; i++) tok[i] = 100 + 7 * i;
    /* the original: 13 tokens, 12 published, and its rows */
    KT_STATUS(kva_seq_new(c, &a), KVA_OK);
    KT_STATUS(kva_seq_append(c, a, 13), KVA_OK);
    tt_store_rows(c, a, 0, 13, 99u + (uint32_t)ti);
    for (j = 0; j < 12; j++)
      for (l = 0; l < TT_L; l++) KT_STATUS(kva_seq_read(c, a, l, j, rows_k[j][l], rows_v[j][l], pos), KVA_OK);
    KT_STATUS(kva_seq_publish(c, a, tok, 12, 7), KVA_OK);
    KT_STATUS(kva_seq_free(c, a), KVA_OK);
    for (round = 0; round < 2; round++) {
      /* round 0: the LRU forgets all three; round 1: only the last two (the tail goes first) */
      int take = round == 0 ? n_blocks * TT_BS : (n_blocks - 1) * TT_BS;
      long spills0, hits0;
      kva_cache_get_stats(c, &cs);
      spills0 = cs.tier_spills, hits0 = cs.tier_fetch_hits;
      KT_STATUS(kva_seq_new(c, &b), KVA_OK);
      KT_STATUS(kva_seq_append(c, b, take), KVA_OK);
      KT_STATUS(kva_seq_free(c, b), KVA_OK);
      kva_cache_get_stats(c, &cs);
      KT_CHECK(cs.tier_spills - spills0 == (round == 0 ? 3 : 2) && cs.tier_spill_errors == 0,
               "%s round %d: %ld spills, %ld errors", kva_dtype_name(t), round, cs.tier_spills - spills0,
               cs.tier_spill_errors);
      if (round == 0) { /* the chain of keys, and each record under its key */
        uint8_t key[32], parent[32];
        for (j = 0; j < 3; j++) {
          kva_prefix_key(j ? parent : NULL, 7, tok + TT_BS * j, TT_BS, key);
          r = tt_find(&st, key);
          KT_CHECK(r >= 0 && st.size[r] == want_bytes, "%s: block %d's record missing or of %zu bytes",
                   kva_dtype_name(t), j, r >= 0 ? st.size[r] : (size_t)0);
          memcpy(parent, key, 32);
        }
      }
      /* a lookup: the blocks come back, bit for bit */
      KT_STATUS(kva_seq_new_prefix(c, tok, 13, 7, &b, &reused), KVA_OK);
      kva_cache_get_stats(c, &cs);
      KT_CHECK(reused == 12 && cs.tier_fetch_hits - hits0 == (round == 0 ? 3 : 2) && cs.blocks_used == 3 &&
                   cs.blocks_used + cs.blocks_cached + cs.blocks_free == n_blocks,
               "%s round %d: reused %d, %ld fetched, %d blocks used", kva_dtype_name(t), round, reused,
               cs.tier_fetch_hits - hits0, cs.blocks_used);
      for (j = 0; j < reused; j++)
        for (l = 0; l < TT_L; l++) {
          float k2[TT_G * TT_D], v2[TT_G * TT_D];
          KT_STATUS(kva_seq_read(c, b, l, j, k2, v2, pos), KVA_OK);
          KT_CHECK(memcmp(k2, rows_k[j][l], sizeof k2) == 0 && memcmp(v2, rows_v[j][l], sizeof v2) == 0 &&
                       pos[0] == j && pos[TT_G - 1] == j,
                   "%s round %d: token %d layer %d differs after the tier", kva_dtype_name(t), round, j, l);
        }
      kva_seq_free(c, b);
    }
    /* another salt: nothing of it is in memory or in the tier */
    KT_STATUS(kva_seq_new_prefix(c, tok, 13, 8, &b, &reused), KVA_OK);
    KT_CHECK(reused == 0, "%s: salt 8 reused %d tokens of salt 7's prefix", kva_dtype_name(t), reused);
    kva_seq_free(c, b);
    kva_cache_destroy(c);
    tt_store_free(&st);
  }
}

/* The attention of the 13th token over a fetched prefix equals the
   original's, with block selection over bounds rebuilt from the rows. */
static void tt_attention(void) {
  tt_store st;
  kva_cache *c;
  int32_t tok[13], pos[TT_G];
  float q[TT_H * TT_D], out_a[TT_H * TT_D], out_b[TT_H * TT_D], k13[TT_L][TT_G * TT_D], v13[TT_L][TT_G * TT_D];
  int a = -1, b = -1, reused = 0, i, l, sel;
  kva_attn at;
  kt_begin("tier attention");
  for (sel = 0; sel < 2; sel++) {
    tt_store_init(&st);
    c = tt_cache(&st, KVA_F16, 8, 1);
    if (!c) return;
    for (i = 0; i < 13; i++) tok[i] = 5 + i;
    memset(&at, 0, sizeof at);
    at.n_heads = TT_H, at.n_kv_heads = TT_G, at.head_dim = TT_D;
    if (sel) at.select_budget = 9, at.select_sink = 1, at.select_recent = 1; /* one of the two middle blocks */
    for (i = 0; i < TT_H * TT_D; i++) q[i] = (float)((i * 29) % 17 - 8) / 3.0f;
    KT_STATUS(kva_seq_new(c, &a), KVA_OK);
    KT_STATUS(kva_seq_append(c, a, 13), KVA_OK);
    tt_store_rows(c, a, 0, 13, 4242u);
    for (l = 0; l < TT_L; l++) KT_STATUS(kva_seq_read(c, a, l, 12, k13[l], v13[l], pos), KVA_OK);
    KT_STATUS(kva_attend_cache(c, a, 1, &at, q, 1, out_a), KVA_OK);
    KT_STATUS(kva_seq_publish(c, a, tok, 12, 1), KVA_OK);
    KT_STATUS(kva_seq_free(c, a), KVA_OK);
    KT_STATUS(kva_seq_new(c, &a), KVA_OK); /* the whole pool: every published block spills */
    KT_STATUS(kva_seq_append(c, a, 8 * TT_BS), KVA_OK);
    KT_STATUS(kva_seq_free(c, a), KVA_OK);
    KT_STATUS(kva_seq_new_prefix(c, tok, 13, 1, &b, &reused), KVA_OK);
    KT_CHECK(reused == 12, "reused %d", reused);
    KT_STATUS(kva_seq_append(c, b, 1), KVA_OK);
    for (l = 0; l < TT_L; l++) KT_STATUS(kva_store(c, b, l, k13[l], v13[l], 1), KVA_OK);
    KT_STATUS(kva_attend_cache(c, b, 1, &at, q, 1, out_b), KVA_OK);
    KT_CHECK(memcmp(out_a, out_b, sizeof out_a) == 0, "attention over the fetched prefix differs (select %d)", sel);
    kva_seq_free(c, b);
    kva_cache_destroy(c);
    tt_store_free(&st);
  }
}

/* One lookup of the prefix after a reset (nothing in memory): reused tokens
   and the stats' change; the pool must be as before but for the sequence. */
static int tt_lookup(kva_cache *c, const int32_t *tok, int n, uint64_t salt, kva_cache_stats *before,
                     kva_cache_stats *after) {
  int s = -1, reused = -1;
  KT_STATUS(kva_cache_reset_prefix(c), KVA_OK);
  kva_cache_get_stats(c, before);
  KT_STATUS(kva_seq_new_prefix(c, tok, n, salt, &s, &reused), KVA_OK);
  kva_cache_get_stats(c, after);
  kva_seq_free(c, s);
  return reused;
}

static void tt_refusals(void) {
  tt_store st;
  kva_cache *c, *other;
  kva_cache_stats b0, b1;
  int32_t tok[9];
  int a = -1, i, reused, fails = 0;
  size_t size;
  kt_begin("tier refusals");
  tt_store_init(&st);
  c = tt_cache(&st, KVA_INT8, 6, 0);
  if (!c) return;
  for (i = 0; i < 9; i++) tok[i] = 40 - i;
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_append(c, a, 9), KVA_OK);
  tt_store_rows(c, a, 0, 9, 7u);
  KT_STATUS(kva_seq_publish(c, a, tok, 8, 3), KVA_OK);
  KT_STATUS(kva_seq_free(c, a), KVA_OK);
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_append(c, a, 6 * TT_BS), KVA_OK);
  KT_STATUS(kva_seq_free(c, a), KVA_OK);
  KT_CHECK(st.n == 2, "%d records stored, want 2", st.n);
  size = kva_prefix_record_size(c);
  reused = tt_lookup(c, tok, 9, 3, &b0, &b1);
  KT_CHECK(reused == 8 && b1.tier_fetch_hits - b0.tier_fetch_hits == 2, "clean: reused %d", reused);
  /* kva_cache_reset_prefix forgets on purpose: nothing spilled (the fetched blocks are published now) */
  KT_CHECK(b0.tier_spills == b1.tier_spills, "a lookup spilled");
  KT_STATUS(kva_cache_reset_prefix(c), KVA_OK);
  kva_cache_get_stats(c, &b0);
  KT_CHECK(b0.tier_spills == b1.tier_spills && b0.blocks_cached == 0, "kva_cache_reset_prefix spilled %ld blocks",
           b0.tier_spills - b1.tier_spills);
  /* every byte of the first record, one bit flipped: refused, the pool unchanged */
  for (st.flip_at = 0; st.flip_at < (long)size; st.flip_at++) {
    reused = tt_lookup(c, tok, 9, 3, &b0, &b1);
    if (reused != 0 || b1.tier_fetch_refused - b0.tier_fetch_refused != 1 || b1.blocks_free != b0.blocks_free ||
        b1.blocks_cached != b0.blocks_cached || b1.tier_fetch_hits != b0.tier_fetch_hits)
      fails++;
  }
  KT_CHECK(fails == 0, "%d of %zu one-bit corruptions were not refused cleanly", fails, size);
  st.flip_at = -1;
  fails = 0;
  for (st.cut_to = 0; st.cut_to < (long)size; st.cut_to++) { /* cut short at every length */
    reused = tt_lookup(c, tok, 9, 3, &b0, &b1);
    if (reused != 0 || b1.tier_fetch_refused - b0.tier_fetch_refused != 1 || b1.blocks_free != b0.blocks_free)
      fails++;
  }
  KT_CHECK(fails == 0, "%d of %zu truncations were not refused cleanly", fails, size);
  st.cut_to = -1;
  /* forged records: one field changed and the checksum made right again. Every header field, type,
     scale and token id is refused; a row byte is data and is taken as it is */
  {
    const size_t toks = 128 + (size_t)TT_L * (8 + 8 * TT_G), rows = toks + 4 * TT_BS;
    const size_t at[] = {8, 12, 16, 24, 56, 88, 96, 100, 104, 108, 112, 116, 120, 124, 128, 132, 136, 140 + 4 * TT_G,
                         toks, toks + 4 * (TT_BS - 1), rows, size - 9};
    unsigned char *keep = (unsigned char *)malloc(size);
    uint8_t key0[32];
    int k, r0;
    kva_prefix_key(NULL, 3, tok, TT_BS, key0);
    r0 = tt_find(&st, key0);
    KT_CHECK(r0 >= 0, "the first block's record is missing");
    for (k = 0; r0 >= 0 && k < (int)(sizeof at / sizeof at[0]); k++) {
      uint64_t sum;
      int data = at[k] >= rows;
      memcpy(keep, st.rec[r0], size);
      st.rec[r0][at[k]] ^= 1;
      sum = kva__stream_checksum(st.rec[r0], size - 8);
      memcpy(st.rec[r0] + size - 8, &sum, 8);
      reused = tt_lookup(c, tok, 9, 3, &b0, &b1);
      KT_CHECK(data ? reused == 8 && b1.tier_fetch_refused == b0.tier_fetch_refused
                    : reused == 0 && b1.tier_fetch_refused - b0.tier_fetch_refused == 1,
               "a forged byte %zu (%s): reused %d, refused %ld", at[k], data ? "row data" : "header", reused,
               b1.tier_fetch_refused - b0.tier_fetch_refused);
      memcpy(st.rec[r0], keep, size);
    }
    free(keep);
  }
  /* a record filed under another key (each block's key answered with the other block's record) */
  st.other_key = 1;
  reused = tt_lookup(c, tok, 9, 3, &b0, &b1);
  KT_CHECK(reused == 0 && b1.tier_fetch_refused - b0.tier_fetch_refused == 1,
           "a record filed under another key: reused %d, refused %ld", reused, b1.tier_fetch_refused - b0.tier_fetch_refused);
  st.other_key = 0;
  /* another salt asks other keys; a lookup with this salt but other tokens too */
  reused = tt_lookup(c, tok, 9, 4, &b0, &b1);
  KT_CHECK(reused == 0 && b1.tier_fetch_misses - b0.tier_fetch_misses == 1, "salt 4: reused %d", reused);
  /* a failing store: a miss */
  st.fail_fetch = 1;
  reused = tt_lookup(c, tok, 9, 3, &b0, &b1);
  KT_CHECK(reused == 0 && b1.tier_fetch_misses - b0.tier_fetch_misses == 1 && b1.blocks_free == b0.blocks_free,
           "a failing fetch: reused %d", reused);
  st.fail_fetch = 0;
  /* another cache shape (INT4, or another head_dim) finds the keys but refuses the records */
  {
    kva_cache_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = TT_L, d.n_kv_heads = TT_G, d.head_dim = TT_D, d.block_size = TT_BS, d.n_blocks = 4;
    d.dtype = KVA_INT4;
    d.spill = tt_spill, d.fetch = tt_fetch, d.tier_user = &st;
    KT_STATUS(kva_cache_create(&d, &other), KVA_OK);
    if (other) {
      reused = tt_lookup(other, tok, 9, 3, &b0, &b1);
      KT_CHECK(reused == 0 && b1.tier_fetch_refused - b0.tier_fetch_refused == 1, "INT4 cache: reused %d", reused);
      kva_cache_destroy(other);
    }
    d.dtype = KVA_INT8, d.head_dim = TT_D + 1;
    KT_STATUS(kva_cache_create(&d, &other), KVA_OK);
    if (other) {
      reused = tt_lookup(other, tok, 9, 3, &b0, &b1);
      KT_CHECK(reused == 0 && b1.tier_fetch_refused - b0.tier_fetch_refused == 1, "head_dim+1: reused %d", reused);
      kva_cache_destroy(other);
    }
    /* description rules */
    d.head_dim = TT_D;
    d.fetch = NULL;
    KT_STATUS(kva_cache_create(&d, &other), KVA_ERR_ARG);
    d.fetch = tt_fetch;
    d.kind = KVA_CACHE_LATENT;
    KT_STATUS(kva_cache_create(&d, &other), KVA_ERR_UNSUPPORTED);
    d.kind = KVA_CACHE_KV;
    {
      kva_layer_group g[2];
      memset(g, 0, sizeof g);
      g[1].kind = KVA_SPAN_WINDOW, g[1].window = 8;
      d.n_groups = 2, d.groups = g;
      KT_STATUS(kva_cache_create(&d, &other), KVA_ERR_UNSUPPORTED);
    }
  }
  /* a spill that fails: counted, nothing else changes; later lookups miss */
  KT_STATUS(kva_cache_reset_prefix(c), KVA_OK);
  tt_store_free(&st);
  st.fail_spill = 1;
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_append(c, a, 9), KVA_OK);
  tt_store_rows(c, a, 0, 9, 8u);
  KT_STATUS(kva_seq_publish(c, a, tok, 8, 3), KVA_OK);
  KT_STATUS(kva_seq_free(c, a), KVA_OK);
  kva_cache_get_stats(c, &b0);
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_append(c, a, 6 * TT_BS), KVA_OK);
  KT_STATUS(kva_seq_free(c, a), KVA_OK);
  kva_cache_get_stats(c, &b1);
  KT_CHECK(b1.tier_spills - b0.tier_spills == 2 && b1.tier_spill_errors - b0.tier_spill_errors == 2 && st.n == 0,
           "failing spills: %ld spills, %ld errors", b1.tier_spills - b0.tier_spills,
           b1.tier_spill_errors - b0.tier_spill_errors);
  st.fail_spill = 0;
  reused = tt_lookup(c, tok, 9, 3, &b0, &b1);
  KT_CHECK(reused == 0, "after failed spills: reused %d", reused);
  KT_CHECK(kva_prefix_record_size(NULL) == 0, "record size of NULL");
  kva_cache_destroy(c);
  tt_store_free(&st);
}

/* kva_prefix_save: every published block to the tier, kept in memory; a new
   cache (a restarted process) over the same store starts warm */
static void tt_save(void) {
  tt_store st;
  kva_cache *c, *next;
  kva_cache_desc d;
  kva_cache_stats cs;
  int32_t tok[21];
  float k1[TT_G * TT_D], v1[TT_G * TT_D], k2[TT_G * TT_D], v2[TT_G * TT_D];
  int32_t pos[TT_G];
  int a = -1, b = -1, i, saved = -1, reused = 0, j;
  kt_begin("tier save");
  tt_store_init(&st);
  c = tt_cache(&st, KVA_BF16, 16, 0);
  if (!c) return;
  for (i = 0; i < 21; i++) tok[i] = 3 * i + 1;
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_append(c, a, 21), KVA_OK);
  tt_store_rows(c, a, 0, 21, 77u);
  KT_STATUS(kva_seq_publish(c, a, tok, 20, 9), KVA_OK);
  KT_STATUS(kva_seq_publish(c, a, tok, 8, 10), KVA_OK); /* another tenant's chain of 2 */
  KT_STATUS(kva_prefix_save(c, &saved), KVA_OK);
  kva_cache_get_stats(c, &cs);
  KT_CHECK(saved == 5 && st.n == 5 && cs.blocks_cached + cs.blocks_used == 6 && cs.prefix_forgotten == 0,
           "saved %d, %d records, %d blocks still in memory", saved, st.n, cs.blocks_cached + cs.blocks_used);
  memset(&d, 0, sizeof d);
  d.n_layers = TT_L, d.n_kv_heads = TT_G, d.head_dim = TT_D, d.block_size = TT_BS, d.n_blocks = 8;
  d.dtype = KVA_BF16, d.k_scale = d.v_scale = 0.25f;
  d.spill = tt_spill, d.fetch = tt_fetch, d.tier_user = &st;
  KT_STATUS(kva_cache_create(&d, &next), KVA_OK);
  if (next) {
    KT_STATUS(kva_seq_new_prefix(next, tok, 21, 9, &b, &reused), KVA_OK);
    KT_CHECK(reused == 20, "the restarted cache reused %d tokens", reused);
    for (j = 0; j < reused; j++) {
      KT_STATUS(kva_seq_read(c, a, 1, j, k1, v1, pos), KVA_OK);
      KT_STATUS(kva_seq_read(next, b, 1, j, k2, v2, pos), KVA_OK);
      KT_CHECK(memcmp(k1, k2, sizeof k1) == 0 && memcmp(v1, v2, sizeof v1) == 0, "token %d differs", j);
    }
    kva_cache_destroy(next);
  }
  st.fail_spill = 1;
  KT_STATUS(kva_prefix_save(c, &saved), KVA_OK);
  KT_CHECK(saved == 0, "a failing store saved %d", saved);
  KT_STATUS(kva_prefix_save(c, NULL), KVA_ERR_ARG);
  KT_STATUS(kva_prefix_save(NULL, &saved), KVA_ERR_ARG);
  kva_cache_destroy(c);
  d.spill = NULL, d.fetch = NULL;
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  if (c) {
    KT_STATUS(kva_prefix_save(c, &saved), KVA_ERR_UNSUPPORTED);
    kva_cache_destroy(c);
  }
  tt_store_free(&st);
}

/* kva_prefix_load: records taken in now, in any order (a record whose parent
   is not yet in memory says so and waits for a later pass), published under
   their own key; refused records change nothing */
static int tt_load_all(kva_cache *c, tt_store *st, int *passes, int *loaded, int *held) {
  int done[TT_MAX] = {0}, progress = 1, i, outcome, n_done = 0;
  *passes = *loaded = *held = 0;
  while (progress && n_done < st->n) {
    progress = 0;
    ++*passes;
    for (i = st->n - 1; i >= 0; i--) { /* children before parents: a store's order is arbitrary */
      if (done[i]) continue;
      outcome = 99;
      if (kva_prefix_load(c, st->rec[i], st->size[i], &outcome) != KVA_OK) return -1;
      if (outcome == KVA_PREFIX_NO_PARENT) continue;
      if (outcome != KVA_PREFIX_LOADED && outcome != KVA_PREFIX_IN_MEMORY) return -1;
      *loaded += outcome == KVA_PREFIX_LOADED;
      *held += outcome == KVA_PREFIX_IN_MEMORY;
      done[i] = progress = 1;
      n_done++;
    }
  }
  return n_done;
}
static void tt_load(void) {
  tt_store st;
  kva_cache *c, *next = NULL;
  kva_cache_desc d;
  kva_cache_stats s0, s1;
  int32_t tok[21], tok_b[9];
  float k1[TT_G * TT_D], v1[TT_G * TT_D], k2[TT_G * TT_D], v2[TT_G * TT_D];
  int32_t pos1[TT_G], pos2[TT_G];
  unsigned char *rec;
  size_t size;
  uint64_t sum;
  int a = -1, b = -1, i, saved = 0, reused = 0, j, passes, loaded, held, outcome;
  long fetches;
  kt_begin("tier load");
  tt_store_init(&st);
  c = tt_cache(&st, KVA_INT8, 16, 1);
  if (!c) return;
  for (i = 0; i < 21; i++) tok[i] = 5 * i - 40;
  for (i = 0; i < 9; i++) tok_b[i] = 1000 + i;
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_append(c, a, 21), KVA_OK);
  tt_store_rows(c, a, 0, 21, 91u);
  KT_STATUS(kva_seq_publish(c, a, tok, 20, 9), KVA_OK);
  KT_STATUS(kva_seq_new(c, &b), KVA_OK);
  KT_STATUS(kva_seq_append(c, b, 9), KVA_OK);
  tt_store_rows(c, b, 0, 9, 92u);
  KT_STATUS(kva_seq_publish(c, b, tok_b, 8, 10), KVA_OK);
  KT_STATUS(kva_prefix_save(c, &saved), KVA_OK);
  KT_CHECK(saved == 7 && st.n == 7, "saved %d records", saved);

  memset(&d, 0, sizeof d);
  d.n_layers = TT_L, d.n_kv_heads = TT_G, d.head_dim = TT_D, d.block_size = TT_BS, d.n_blocks = 10;
  d.dtype = KVA_INT8, d.k_scale = d.v_scale = 0.25f, d.block_bounds = 1;
  d.spill = tt_spill, d.fetch = tt_fetch, d.tier_user = &st;
  KT_STATUS(kva_cache_create(&d, &next), KVA_OK);
  if (!next) goto out;
  KT_CHECK(tt_load_all(next, &st, &passes, &loaded, &held) == 7 && loaded == 7 && held == 0 && passes > 1,
           "load: %d loaded, %d already held, %d passes", loaded, held, passes);
  kva_cache_get_stats(next, &s0);
  KT_CHECK(s0.tier_loads == 7 && s0.blocks_cached == 7 && s0.blocks_used == 0 && s0.blocks_free == 3 &&
               s0.tier_spills == 0 && s0.tier_fetch_hits + s0.tier_fetch_misses == 0,
           "after the load: %ld loads, %d cached, %d used, %d free, %ld spills", s0.tier_loads, s0.blocks_cached,
           s0.blocks_used, s0.blocks_free, s0.tier_spills);
  /* again: every record is already in memory, nothing changes */
  KT_CHECK(tt_load_all(next, &st, &passes, &loaded, &held) == 7 && loaded == 0 && held == 7,
           "a second load: %d loaded, %d held", loaded, held);
  kva_cache_get_stats(next, &s1);
  KT_CHECK(s1.blocks_free == s0.blocks_free && s1.tier_loads == 7, "a second load changed the pool");
  /* lookups find the loaded blocks in memory: the store is not asked */
  fetches = st.fetches;
  KT_STATUS(kva_seq_new_prefix(next, tok, 21, 9, &j, &reused), KVA_OK);
  KT_CHECK(reused == 20 && st.fetches == fetches, "reused %d tokens, %ld fetches", reused, st.fetches - fetches);
  for (i = 0; i < reused; i++) {
    KT_STATUS(kva_seq_read(c, a, i % TT_L, i, k1, v1, pos1), KVA_OK);
    KT_STATUS(kva_seq_read(next, j, i % TT_L, i, k2, v2, pos2), KVA_OK);
    KT_CHECK(memcmp(k1, k2, sizeof k1) == 0 && memcmp(v1, v2, sizeof v1) == 0 && pos1[0] == pos2[0] &&
                 pos2[0] == i && pos2[1] == i,
             "loaded token %d differs (position %d)", i, pos2[0]);
  }
  KT_STATUS(kva_seq_free(next, j), KVA_OK);
  KT_STATUS(kva_seq_new_prefix(next, tok_b, 9, 10, &j, &reused), KVA_OK);
  KT_CHECK(reused == 8, "the second tenant's chain: reused %d", reused);
  KT_STATUS(kva_seq_free(next, j), KVA_OK);
  st.fail_fetch = 1; /* tenants stay apart: the same tokens under another salt find nothing */
  KT_STATUS(kva_seq_new_prefix(next, tok_b, 9, 9, &j, &reused), KVA_OK);
  KT_CHECK(reused == 0, "another salt reused %d", reused);
  KT_STATUS(kva_seq_free(next, j), KVA_OK);
  st.fail_fetch = 0;
  kva_cache_destroy(next);
  next = NULL;

  /* refusals on an empty cache: nothing may change */
  KT_STATUS(kva_cache_create(&d, &next), KVA_OK);
  if (!next) goto out;
  size = st.size[0];
  rec = (unsigned char *)malloc(size + 1);
  kva_cache_get_stats(next, &s0);
  for (i = 0; i < (int)size; i++) { /* every byte of a record, bit 5 flipped */
    memcpy(rec, st.rec[0], size);
    rec[i] ^= 32;
    outcome = 99;
    if (kva_prefix_load(next, rec, size, &outcome) != KVA_ERR_STREAM || outcome != 99) {
      KT_CHECK(0, "a record with byte %d flipped was not refused", i);
      break;
    }
  }
  memcpy(rec, st.rec[0], size);
  rec[size] = 0;
  KT_STATUS(kva_prefix_load(next, rec, size - 1, &outcome), KVA_ERR_STREAM);
  KT_STATUS(kva_prefix_load(next, rec, size + 1, &outcome), KVA_ERR_STREAM);
  KT_STATUS(kva_prefix_load(next, rec, 0, &outcome), KVA_ERR_STREAM);
  /* forged, checksum made right: another salt, another token id, another key, another parent's key */
  for (j = 0; j < 4; j++) {
    static const size_t at[4] = {88, 0, 24, 56};
    size_t off = j == 1 ? 128 + (size_t)TT_L * (8 + 8 * TT_G) : at[j]; /* (1: the first token id) */
    memcpy(rec, st.rec[0], size);
    rec[off] ^= 1;
    sum = kva__stream_checksum(rec, size - 8);
    memcpy(rec + size - 8, &sum, 8);
    outcome = 99;
    KT_CHECK(kva_prefix_load(next, rec, size, &outcome) == KVA_ERR_STREAM && outcome == 99,
             "a forged record (byte %zu) was not refused", off);
  }
  kva_cache_get_stats(next, &s1);
  KT_CHECK(s1.blocks_free == s0.blocks_free && s1.tier_loads == 0 && s1.blocks_cached == 0,
           "refused records changed the pool: %d free, %ld loads", s1.blocks_free, s1.tier_loads);
  /* a row byte is data: with the checksum made right it loads */
  for (i = 0; i < st.n; i++) { /* a first block: its parent key is zeros */
    static const uint8_t zero[32] = {0};
    if (memcmp(st.rec[i] + 56, zero, 32) == 0) break;
  }
  memcpy(rec, st.rec[i], size);
  rec[size - 9] ^= 1;
  sum = kva__stream_checksum(rec, size - 8);
  memcpy(rec + size - 8, &sum, 8);
  KT_STATUS(kva_prefix_load(next, rec, size, &outcome), KVA_OK);
  KT_CHECK(outcome == KVA_PREFIX_LOADED, "a first block's record with a changed row byte: outcome %d", outcome);
  /* its child under another salt, key and checksum made right: a chain keeps one salt */
  for (j = 0; j < st.n; j++)
    if (memcmp(st.rec[j] + 56, st.rec[i] + 24, 32) == 0) break;
  KT_CHECK(j < st.n, "no child of a first block among the records");
  if (j < st.n) {
    uint64_t other = 77;
    uint8_t key[32];
    int32_t child_tok[TT_BS];
    memcpy(rec, st.rec[j], size);
    memcpy(rec + 88, &other, 8);
    memcpy(child_tok, rec + 128 + (size_t)TT_L * (8 + 8 * TT_G), sizeof child_tok);
    kva_prefix_key(rec + 56, other, child_tok, TT_BS, key);
    memcpy(rec + 24, key, 32);
    sum = kva__stream_checksum(rec, size - 8);
    memcpy(rec + size - 8, &sum, 8);
    outcome = 99;
    KT_CHECK(kva_prefix_load(next, rec, size, &outcome) == KVA_ERR_STREAM && outcome == 99,
             "a record under another salt than its parent's was not refused (outcome %d)", outcome);
  }
  /* a full pool: KVA_ERR_FULL, nothing changed; a load never recycles a cached block */
  KT_STATUS(kva_seq_new(next, &j), KVA_OK);
  KT_STATUS(kva_seq_append(next, j, 9 * TT_BS), KVA_OK);
  kva_cache_get_stats(next, &s0);
  for (i = 0; i < st.n; i++) {
    kva_status r;
    outcome = 99;
    r = kva_prefix_load(next, st.rec[i], size, &outcome);
    KT_CHECK((r == KVA_ERR_FULL && outcome == 99) || (r == KVA_OK && outcome != KVA_PREFIX_LOADED),
             "record %d into a full pool: %s, outcome %d", i, kva_status_str(r), outcome);
  }
  kva_cache_get_stats(next, &s1);
  KT_CHECK(s1.blocks_cached == s0.blocks_cached && s1.blocks_free == 0 && s1.tier_loads == s0.tier_loads,
           "a load into a full pool changed it");
  KT_STATUS(kva_prefix_load(next, NULL, size, &outcome), KVA_ERR_ARG);
  KT_STATUS(kva_prefix_load(next, st.rec[0], size, NULL), KVA_ERR_ARG);
  KT_STATUS(kva_prefix_load(NULL, st.rec[0], size, &outcome), KVA_ERR_ARG);
  free(rec);
  kva_cache_destroy(next);
  d.spill = NULL, d.fetch = NULL;
  KT_STATUS(kva_cache_create(&d, &next), KVA_OK);
  if (next) {
    KT_STATUS(kva_prefix_load(next, st.rec[0], st.size[0], &outcome), KVA_ERR_UNSUPPORTED);
    kva_cache_destroy(next);
  }
out:
  kva_cache_destroy(c);
  tt_store_free(&st);
}

void test_tier(void) {
  tt_sha();
  tt_save();
  tt_load();
  tt_roundtrip();
  tt_attention();
  tt_refusals();
}
