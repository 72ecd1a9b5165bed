/* fuzz_import.c - libFuzzer harness for the two ways bytes from outside
 * reach a cache: sequence streams (kva_seq_import) and the prefix tier's
 * records (kva_prefix_load, and what a fetch callback hands back).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. -Itests \
 *         tests/fuzz_import.c -o build/fuzz_import -lm
 *   ./build/fuzz_import -max_total_time=60      (or: make fuzz)
 *
 * Bit 7 of data[0] picks the mode.  Clear: sequence streams, below, with
 * the input read as before the tier mode existed (the stream seeds all start
 * below 0x80; an input starting at 0x80 or above, which used to pick stream
 * scenario data[0] % 6, now goes to the tier).  Set: the prefix tier's
 * records (ft_run, further down).
 *
 * Stream mode.
 * data[0] picks a source scenario: a small cache (KV or LATENT, per-layer
 * F16/BF16/F32/INT8/FP8 types with per-head FP8 scales, evict_support ALL /
 * WINDOW / NONE) and a sequence in some state (plain; H2O with evicted
 * tokens and a step stored in one layer only; WINDOW with rollback and a
 * pending policy; started from the prefix cache and published; forked,
 * accepted and half stored; empty with a policy set), built the same way on
 * every run, and exported.  data[1] and data[2] pick the mode and a target
 * cache of the same shape (block size, pool size, max_seqs, evict_support,
 * cached prefix blocks to recycle).  The rest of the input is
 *   (a) raw mode: the stream itself, imported as is;
 *   (b) mutation mode: 4-byte edits applied to the valid stream (byte xors,
 *       header and per-layer fields set to boundary values, positions and
 *       scores in the rows, truncation, extension, copies), then re-sealed
 *       (size field and kva__stream_checksum) unless the mode says not to,
 *       so that the semantic validation is what answers.
 * Every stream goes to three caches: the source cache (the source still
 * live), the target, and a cache of another head_dim (which must refuse).
 * After each call: a failure is one of the import statuses and changed
 * nothing (kva_cache_get_stats field by field, the live ids, *seq); a success
 * gives a sequence that reads back (positions in range), exports again to
 * the very same bytes (when the target keeps the same sections and block
 * size and publishes the same prefix), finishes its step (store, attend),
 * appends, stores and attends a token, exports again, and frees, with the
 * statistics consistent (used + cached + free == n_blocks, n_seqs and
 * tokens_held back).  An unmutated stream reads back exactly as the source.
 * A violated check prints what and traps; ASan/UBSan/LeakSanitizer catch
 * the rest. */
#include <float.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvattn.h"
#include "harness.h"

int kt_pass, kt_fail, kt_quick;
int kt_fail_prints;
const char *kt_test_name;

#define FI_CHECK(cond, ...)                                                       \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "fuzz_import: check failed at %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                               \
      fputc('\n', stderr);                                                        \
      __builtin_trap();                                                           \
    }                                                                             \
  } while (0)

/* stream fields (docs/API.md's layout) */
#define FI_OFF_SIZE 16
#define FI_OFF_BS 44
#define FI_OFF_FLAGS 48
#define FI_OFF_LEN 52
#define FI_OFF_POS 56
#define FI_OFF_STEP 60
#define FI_OFF_NPREFIX 108
#define FI_HEADER 128

#define FI_MAXG 2
#define FI_MAXD 8
#define FI_MAXN 8

typedef struct {
  int kind, L, G, D, Dv, bs, support, script;
  kva_dtype lt[2];
  int head_scales;
} fi_scen;

static const fi_scen fi_scens[6] = {
    /* kind            L  G  D  Dv bs support                    script types                       head scales */
    {KVA_CACHE_KV, 2, 2, 4, 3, 4, KVA_EVICT_SUPPORT_ALL, 0, {KVA_F16, KVA_BF16}, 0},
    {KVA_CACHE_KV, 2, 2, 3, 2, 3, KVA_EVICT_SUPPORT_ALL, 1, {KVA_INT8, KVA_FP8_E4M3}, 1},
    {KVA_CACHE_LATENT, 1, 1, 6, 4, 2, KVA_EVICT_SUPPORT_WINDOW, 2, {KVA_BF16, KVA_BF16}, 0},
    {KVA_CACHE_KV, 1, 1, 2, 2, 3, KVA_EVICT_SUPPORT_NONE, 3, {KVA_F32, KVA_F32}, 0},
    {KVA_CACHE_KV, 2, 1, 3, 2, 2, KVA_EVICT_SUPPORT_ALL, 4, {KVA_FP8_E5M2, KVA_INT8}, 1},
    {KVA_CACHE_LATENT, 2, 2, 4, 0, 5, KVA_EVICT_SUPPORT_ALL, 5, {KVA_FP8_E4M3, KVA_F16}, 1},
};

static const float fi_head_k[4] = {0.5f, 0.25f, 0.125f, 0.75f};
static const float fi_head_v[4] = {0.0625f, 0.5f, 1.5f, 0.25f};

typedef struct {
  int bs, nb, max_seqs, support, head_dim_delta;
} fi_target;

static kva_cache *fi_create(const fi_scen *s, const fi_target *t) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  memset(&d, 0, sizeof d);
  d.kind = s->kind;
  d.n_layers = s->L;
  d.n_kv_heads = s->G;
  d.head_dim = s->D + t->head_dim_delta;
  d.v_dim = s->Dv;
  d.block_size = t->bs;
  d.n_blocks = t->nb;
  d.max_seqs = t->max_seqs;
  d.evict_support = t->support;
  d.layer_dtype = s->lt;
  d.k_scale = 0.375f;
  d.v_scale = 0.875f;
  if (s->head_scales) d.head_k_scale = fi_head_k, d.head_v_scale = fi_head_v;
  return kva_cache_create(&d, &c) == KVA_OK ? c : NULL;
}

static void fi_attn(const fi_scen *s, kva_attn *a) {
  memset(a, 0, sizeof *a);
  a->n_heads = 2 * s->G;
  a->n_kv_heads = s->G;
  a->head_dim = s->D;
  a->v_dim = s->Dv ? s->Dv : s->D;
  a->n_threads = 1;
}

/* K/V/Q buffers, filled from a fixed RNG */
typedef struct {
  kt_rng rng;
  float k[FI_MAXN * FI_MAXG * FI_MAXD], v[FI_MAXN * FI_MAXG * FI_MAXD];
  float q[FI_MAXN * 2 * FI_MAXG * FI_MAXD], out[FI_MAXN * 2 * FI_MAXG * FI_MAXD];
} fi_data;

static void fi_fill(fi_data *x) {
  kt_fill(&x->rng, x->k, sizeof x->k / sizeof x->k[0], -2.0f, 2.0f);
  kt_fill(&x->rng, x->v, sizeof x->v / sizeof x->v[0], -2.0f, 2.0f);
  kt_fill(&x->rng, x->q, sizeof x->q / sizeof x->q[0], -2.0f, 2.0f);
}

/* store the newest n tokens in every layer of `mask`, attend them when attend */
static void fi_store_attend(kva_cache *c, const fi_scen *s, int seq, int n, unsigned mask, int attend,
                            fi_data *x) {
  kva_attn a;
  int l;
  kva_status st;
  fi_attn(s, &a);
  fi_fill(x);
  for (l = 0; l < s->L; l++) {
    if (!(mask & (1u << l))) continue;
    st = kva_store(c, seq, l, x->k, s->kind == KVA_CACHE_KV ? x->v : NULL, n);
    FI_CHECK(st == KVA_OK, "store of %d tokens, layer %d: %s", n, l, kva_status_str(st));
    if (attend) {
      st = kva_attend_cache(c, seq, l, &a, x->q, n, x->out);
      FI_CHECK(st == KVA_OK, "attend of %d tokens, layer %d: %s", n, l, kva_status_str(st));
    }
  }
}

static void fi_step(kva_cache *c, const fi_scen *s, int seq, int n, unsigned mask, int attend, fi_data *x) {
  kva_status st = kva_seq_append(c, seq, n);
  FI_CHECK(st == KVA_OK, "scenario append of %d: %s", n, kva_status_str(st));
  fi_store_attend(c, s, seq, n, mask, attend, x);
}

static void fi_policy(kva_cache *c, int seq, int kind, int budget, int sink, int recent, int rollback) {
  kva_evict e;
  kva_status st;
  memset(&e, 0, sizeof e);
  e.kind = kind, e.budget = budget, e.n_sink = sink, e.n_recent = recent, e.rollback = rollback;
  st = kva_seq_set_evict(c, seq, &e);
  FI_CHECK(st == KVA_OK, "set_evict: %s", kva_status_str(st));
}

/* The scenario's source sequence in c. */
static int fi_build(kva_cache *c, const fi_scen *s) {
  fi_data x;
  int32_t tok[16];
  int seq = -1, other = -1, reused = -1, i, all = (1 << s->L) - 1;
  kva_status st;
  kt_seed(&x.rng, 1234u + (uint64_t)s->script);
  for (i = 0; i < 16; i++) tok[i] = 7 * i + 1;
  switch (s->script) {
    case 0: /* plain */
      kva_seq_new(c, &seq);
      fi_step(c, s, seq, 5, (unsigned)all, 1, &x);
      fi_step(c, s, seq, 2, (unsigned)all, 1, &x);
      break;
    case 1: /* H2O, evicted, the last step stored in layer 0 only */
      kva_seq_new(c, &seq);
      fi_policy(c, seq, KVA_EVICT_H2O, 4, 1, 1, 0);
      for (i = 0; i < 4; i++) fi_step(c, s, seq, 2, (unsigned)all, 1, &x);
      fi_step(c, s, seq, 2, 1u, 0, &x);
      break;
    case 2: /* WINDOW with rollback, evicted, another WINDOW pending */
      kva_seq_new(c, &seq);
      fi_policy(c, seq, KVA_EVICT_WINDOW, 3, 1, 0, 1);
      for (i = 0; i < 4; i++) fi_step(c, s, seq, 2, (unsigned)all, 1, &x);
      fi_policy(c, seq, KVA_EVICT_WINDOW, 5, 0, 0, 0);
      break;
    case 3: /* from the prefix cache, then published */
      kva_seq_new(c, &other);
      fi_step(c, s, other, 6, (unsigned)all, 1, &x);
      st = kva_seq_publish(c, other, tok, 6, 9);
      FI_CHECK(st == KVA_OK, "publish: %s", kva_status_str(st));
      st = kva_seq_new_prefix(c, tok, 10, 9, &seq, &reused);
      FI_CHECK(st == KVA_OK && reused == 6, "new_prefix: %s, %d reused", kva_status_str(st), reused);
      fi_step(c, s, seq, 4, (unsigned)all, 1, &x);
      st = kva_seq_publish(c, seq, tok, 10, 9);
      FI_CHECK(st == KVA_OK, "publish: %s", kva_status_str(st));
      break;
    case 4: { /* forked (shared blocks), accepted, a chunk of the step stored */
      int32_t keep[2] = {0, 2};
      kva_seq_new(c, &seq);
      fi_step(c, s, seq, 6, (unsigned)all, 1, &x);
      st = kva_seq_fork(c, seq, &other);
      FI_CHECK(st == KVA_OK, "fork: %s", kva_status_str(st));
      fi_step(c, s, seq, 3, (unsigned)all, 1, &x);
      st = kva_seq_accept(c, seq, 3, keep, 2);
      FI_CHECK(st == KVA_OK, "accept: %s", kva_status_str(st));
      st = kva_seq_append(c, seq, 3);
      FI_CHECK(st == KVA_OK, "append: %s", kva_status_str(st));
      fi_fill(&x);
      st = kva_store_at(c, seq, 0, 1, x.k, x.v, 2);
      FI_CHECK(st == KVA_OK, "store_at: %s", kva_status_str(st));
      break;
    }
    default: /* empty, a policy set */
      kva_seq_new(c, &seq);
      fi_policy(c, seq, KVA_EVICT_H2O, 6, 2, 2, 1);
      break;
  }
  FI_CHECK(seq >= 0, "scenario %d: no sequence", s->script);
  return seq;
}

/* ---- observing a cache ---- */

typedef struct {
  kva_cache_stats st;
  char live[64];
} fi_snap;

static void fi_snap_take(const kva_cache *c, fi_snap *s) {
  int i;
  memset(s, 0, sizeof *s);
  kva_cache_get_stats(c, &s->st);
  for (i = 0; i < 64; i++) s->live[i] = (char)(kva_seq_len(c, i) >= 0);
}

static int fi_sane(const kva_cache_stats *s) {
  return s->blocks_used >= 0 && s->blocks_cached >= 0 && s->blocks_free >= 0 && s->n_seqs >= 0 &&
         s->blocks_used + s->blocks_cached + s->blocks_free == s->n_blocks && s->tokens_held >= 0;
}

static int32_t fi_i32(const unsigned char *p, size_t off) {
  int32_t x;
  memcpy(&x, p + off, 4);
  return x;
}

static unsigned char *fi_export(kva_cache *c, int seq, size_t *size) {
  fi_snap a, b;
  size_t need = 0, wrote = 0;
  unsigned char *buf;
  kva_status st;
  fi_snap_take(c, &a);
  st = kva_seq_export(c, seq, NULL, 0, &need);
  FI_CHECK(st == KVA_OK && need >= FI_HEADER + 8, "export size: %s, %lu", kva_status_str(st), (unsigned long)need);
  buf = (unsigned char *)malloc(need);
  FI_CHECK(buf != NULL, "out of memory");
  st = kva_seq_export(c, seq, buf, need, &wrote);
  FI_CHECK(st == KVA_OK && wrote == need, "export: %s", kva_status_str(st));
  fi_snap_take(c, &b);
  FI_CHECK(kt_stats_equal(&a.st, &b.st, 0) && memcmp(a.live, b.live, 64) == 0, "export changed the cache");
  *size = need;
  return buf;
}

/* same len, pos and every slot's K, V, positions */
static void fi_same_state(const fi_scen *s, kva_cache *ca, int a, kva_cache *cb, int b) {
  float k1[FI_MAXG * FI_MAXD], k2[FI_MAXG * FI_MAXD], v1[FI_MAXG * FI_MAXD], v2[FI_MAXG * FI_MAXD];
  int32_t p1[FI_MAXG], p2[FI_MAXG];
  int l, i, len = kva_seq_len(ca, a), lat = s->kind == KVA_CACHE_LATENT, dv = s->Dv ? s->Dv : s->D;
  FI_CHECK(len == kva_seq_len(cb, b) && kva_seq_pos(ca, a) == kva_seq_pos(cb, b), "len/pos differ after import");
  for (l = 0; l < s->L; l++)
    for (i = 0; i < len; i++) {
      FI_CHECK(kva_seq_read(ca, a, l, i, k1, lat ? NULL : v1, p1) == KVA_OK, "read");
      FI_CHECK(kva_seq_read(cb, b, l, i, k2, lat ? NULL : v2, p2) == KVA_OK, "read");
      FI_CHECK(memcmp(k1, k2, sizeof(float) * (size_t)(s->G * s->D)) == 0 &&
                   memcmp(p1, p2, sizeof(int32_t) * (size_t)s->G) == 0 &&
                   (lat || memcmp(v1, v2, sizeof(float) * (size_t)(s->G * dv)) == 0),
               "an unmutated stream imported into another state (layer %d slot %d)", l, i);
    }
}

/* One import of (buf, n) into c, with every invariant checked. */
static void fi_import(kva_cache *c, const fi_scen *s, int c_bs, int c_support, int c_head_dim, const unsigned char *buf,
                      size_t n, kva_cache *src, int src_seq, int exact) {
  fi_snap before, after;
  kva_cache_stats st0, st1;
  kva_attn a;
  fi_data x;
  int id = -77, l, i, g, len, pos, step, dv = s->Dv ? s->Dv : s->D, lat = s->kind == KVA_CACHE_LATENT;
  unsigned flags_c = c_support == KVA_EVICT_SUPPORT_ALL ? 3u : c_support == KVA_EVICT_SUPPORT_WINDOW ? 1u : 0u;
  kva_status st;
  unsigned char *re;
  size_t n_re = 0;
  int had_published;
  if (!c) return;
  fi_snap_take(c, &before);
  had_published = before.st.blocks_cached > 0 || c == src;
  st = kva_seq_import(c, buf, n, &id);
  if (st != KVA_OK) {
    FI_CHECK(st == KVA_ERR_STREAM || st == KVA_ERR_UNSUPPORTED || st == KVA_ERR_FULL || st == KVA_ERR_SEQ_LIMIT,
             "import returned %s", kva_status_str(st));
    FI_CHECK(id == -77, "a failed import (%s) wrote *seq", kva_status_str(st));
    fi_snap_take(c, &after);
    FI_CHECK(kt_stats_equal(&before.st, &after.st, 0) && memcmp(before.live, after.live, 64) == 0,
             "a failed import (%s) changed the cache", kva_status_str(st));
    FI_CHECK(!exact || st == KVA_ERR_FULL || st == KVA_ERR_SEQ_LIMIT || st == KVA_ERR_UNSUPPORTED,
             "an unmutated stream was refused: %s", kva_status_str(st));
    return;
  }
  FI_CHECK(c_head_dim == s->D, "a cache of head_dim %d accepted a stream of head_dim %d", c_head_dim, s->D);
  FI_CHECK(n >= FI_HEADER + 8, "a stream of %lu bytes was accepted", (unsigned long)n);
  len = kva_seq_len(c, id);
  pos = kva_seq_pos(c, id);
  step = fi_i32(buf, FI_OFF_STEP);
  FI_CHECK(id >= 0 && len == fi_i32(buf, FI_OFF_LEN) && pos == fi_i32(buf, FI_OFF_POS) && len <= pos && step >= 0 &&
               step <= len,
           "imported: id %d len %d pos %d step %d (stream %d %d)", id, len, pos, step, fi_i32(buf, FI_OFF_LEN),
           fi_i32(buf, FI_OFF_POS));
  kva_cache_get_stats(c, &st0);
  FI_CHECK(fi_sane(&st0) && st0.n_seqs == before.st.n_seqs + 1 && st0.tokens_held == before.st.tokens_held + len,
           "stats after import: %d used %d cached %d free of %d, %d seqs", st0.blocks_used, st0.blocks_cached,
           st0.blocks_free, st0.n_blocks, st0.n_seqs);
  if (exact && src) fi_same_state(s, src, src_seq, c, id);
  /* read back: positions in range */
  for (l = 0; l < s->L; l++)
    for (i = 0; i < len; i++) {
      float k[FI_MAXG * FI_MAXD], v[FI_MAXG * FI_MAXD];
      int32_t p[FI_MAXG];
      st = kva_seq_read(c, id, l, i, k, lat ? NULL : v, p);
      FI_CHECK(st == KVA_OK, "read layer %d slot %d: %s", l, i, kva_status_str(st));
      for (g = 0; g < s->G; g++)
        FI_CHECK(p[g] >= 0 && p[g] < pos && (len != pos || p[g] == i), "slot %d head %d at position %d (pos %d)", i,
                 g, p[g], pos);
    }
  /* the same bytes again, when nothing about the target changes what is written */
  re = fi_export(c, id, &n_re);
  if ((unsigned)fi_i32(buf, FI_OFF_FLAGS) == flags_c && fi_i32(buf, FI_OFF_BS) == c_bs &&
      (fi_i32(buf, FI_OFF_NPREFIX) == 0 || !had_published))
    FI_CHECK(n_re == n && memcmp(re, buf, n) == 0, "the re-export differs from the imported stream (%lu vs %lu bytes)",
             (unsigned long)n_re, (unsigned long)n);
  free(re);
  /* the step goes on: store it whole in every layer, attend */
  kt_seed(&x.rng, 99);
  fi_attn(s, &a);
  if (step > 0 && step <= FI_MAXN) fi_store_attend(c, s, id, step, (1u << s->L) - 1u, 1, &x);
  /* a new token */
  st = kva_seq_append(c, id, 1);
  FI_CHECK(st == KVA_OK || st == KVA_ERR_FULL || (st == KVA_ERR_ARG && pos == INT32_MAX), "append: %s",
           kva_status_str(st));
  if (st == KVA_OK) {
    fi_store_attend(c, s, id, 1, (1u << s->L) - 1u, 1, &x);
    len = kva_seq_len(c, id);
    for (l = 0; l < s->L; l++)
      for (i = 0; i < len; i++) {
        float k[FI_MAXG * FI_MAXD], v[FI_MAXG * FI_MAXD];
        int32_t p[FI_MAXG];
        FI_CHECK(kva_seq_read(c, id, l, i, k, lat ? NULL : v, p) == KVA_OK, "read after append");
        (void)dv;
      }
  }
  re = fi_export(c, id, &n_re);
  free(re);
  kva_cache_get_stats(c, &st1);
  FI_CHECK(fi_sane(&st1), "stats after the append");
  st = kva_seq_free(c, id);
  FI_CHECK(st == KVA_OK, "free: %s", kva_status_str(st));
  kva_cache_get_stats(c, &st1);
  FI_CHECK(fi_sane(&st1) && st1.n_seqs == before.st.n_seqs && st1.tokens_held == before.st.tokens_held,
           "stats after free: %d used %d cached %d free of %d, %d seqs (%d before), %ld tokens (%ld)", st1.blocks_used,
           st1.blocks_cached, st1.blocks_free, st1.n_blocks, st1.n_seqs, before.st.n_seqs, st1.tokens_held,
           before.st.tokens_held);
}

/* ---- mutations ---- */

static int32_t fi_interesting(int idx, int32_t old, const unsigned char *v) {
  switch (idx % 16) {
    case 0: return 0;
    case 1: return 1;
    case 2: return -1;
    case 3: return 2;
    case 4: return fi_i32(v, FI_OFF_BS);
    case 5: return fi_i32(v, FI_OFF_LEN);
    case 6: return fi_i32(v, FI_OFF_LEN) + 1;
    case 7: return fi_i32(v, FI_OFF_POS);
    case 8: return fi_i32(v, FI_OFF_POS) - 1;
    case 9: return INT_MAX;
    case 10: return INT_MIN;
    case 11: return fi_i32(v, FI_OFF_STEP);
    case 12: return (int32_t)((uint32_t)old + 1u);
    case 13: return (int32_t)((uint32_t)old - 1u);
    case 14: return 3;
    default: return 4;
  }
}

/* Apply the edits in m[0..nm) to the stream in buf (capacity cap); returns its new size. */
static size_t fi_mutate(unsigned char *buf, size_t size, size_t cap, const unsigned char *m, size_t nm,
                        const unsigned char *valid) {
  size_t i;
  for (i = 0; i + 4 <= nm; i += 4) {
    unsigned op = m[i], a = m[i + 1], b = m[i + 2], c = m[i + 3];
    size_t off;
    int32_t x;
    if (size < 8) break;
    switch (op % 8) {
      case 0: /* xor a byte: the header and layers (high bit) or anywhere */
        off = (op & 0x80) ? (a | (b << 8)) % (size < 256 ? size : 256) : (a | (b << 8)) % size;
        buf[off] ^= (unsigned char)(c ? c : 1);
        break;
      case 1: /* an i32 field of the header or the layers set to a boundary value */
        if (size < 32) break;
        off = 24 + 4 * ((a | (b << 8)) % ((size < 256 ? size : 256) / 4 - 6));
        if (off + 4 > size) break;
        x = fi_interesting(c, fi_i32(buf, off), valid);
        memcpy(buf + off, &x, 4);
        break;
      case 2: /* an i32 of the rows (positions live there) */
        off = (size_t)4 * ((a | (b << 8) | ((size_t)(op >> 3) << 16)) % (size / 4));
        x = fi_interesting(c, fi_i32(buf, off), valid);
        memcpy(buf + off, &x, 4);
        break;
      case 3: /* truncate */
        size = (a | (b << 8)) % size;
        break;
      case 4: /* extend by zeros */
        if (size + c + 1 <= cap) {
          memset(buf + size, 0, c + 1u);
          size += c + 1u;
        }
        break;
      case 5: { /* a special float (scores, INT8 scales, FP8 scales) */
        static const float sp[8] = {0.0f, -0.0f, -1.0f, 1e30f, 1.0f, 0.5f, 3.0e38f, 1e-40f};
        float f = sp[c % 8];
        off = (size_t)4 * ((a | (b << 8) | ((size_t)(op >> 3) << 16)) % (size / 4));
        if ((c & 8) != 0) { /* NaN and Inf, built from bits */
          uint32_t u = (c & 16) ? 0x7FC00000u : 0x7F800000u;
          memcpy(&f, &u, 4);
        }
        memcpy(buf + off, &f, 4);
        break;
      }
      case 6: { /* copy 4 bytes from one aligned place to another */
        size_t from = (size_t)4 * (a % (size / 4)), to = (size_t)4 * ((b | (c << 8)) % (size / 4));
        memmove(buf + to, buf + from, 4);
        break;
      }
      default: /* set a raw byte */
        off = (a | (b << 8)) % size;
        buf[off] = (unsigned char)c;
        break;
    }
  }
  return size;
}

/* ---- the prefix tier: records from outside, through kva_prefix_load and through fetch ----
 *
 * Records are untrusted twice over: a restarting server hands stored bytes
 * to kva_prefix_load, and the fetch callback answers a lookup with whatever
 * its store holds (any bytes, any claimed size, the wrong record, a
 * failure).  Each run takes the valid 3-block chain kva_prefix_save wrote
 * for one of the tier scenarios below, edits it (re-sealing key, parent
 * key, size field and checksum as the input says, so that the deep checks
 * are what answers), and feeds it through both routes, each into a fresh
 * cache that may already hold a live sequence, a cached block of another
 * salt and the chain's valid root.
 *
 * The checks are docs/API.md's, restated from the outside (ft_ok): a record
 * is taken iff it passes them, so a refused valid record fails as much as an
 * accepted invalid one.  A model of memory (each published block's key,
 * parent key, salt, token ids) predicts every kva_prefix_load outcome
 * (LOADED / IN_MEMORY / NO_PARENT / KVA_ERR_FULL) and which key each lookup
 * fetches and how many tokens it reuses, until a fetch recycles a cached
 * block.  A refusal or a miss changes no statistic but its own counter; a
 * record taken in costs exactly one free block (used + cached + free ==
 * n_blocks throughout), is found by a lookup of its own token ids and salt,
 * reads back through kva_seq_read as its bytes decode by the documented
 * storage formats (NaN for NaN) at the positions of its depth, is saved
 * again by kva_prefix_save byte for byte, parents first.  A token appended
 * after the reused prefix attends without a sanitizer report, finitely when
 * every row read back is finite and within F16's range, and bit for bit as
 * in the writer's cache when the reused rows are the valid chain's (the
 * rebuilt positions and block bounds included: with selection on, the
 * bounds choose which blocks are read). */

#define FT_HDR 128
#define FT_MAXL 2
#define FT_MAXG 2
#define FT_MAXD 40
#define FT_MAXBS 4
#define FT_NREC 3
#define FT_MMAX 16
#define FT_SALT 0x5EEDull
#define FT_OTHER_SALT 77u
#define FT_EXTRA_TOKEN 424242
#define FT_MAX_EDITS 64

typedef struct {
  int L, G, D, DV, bs, support, bounds, rotate;
  kva_dtype kt, vt;      /* dtype, v_dtype */
  kva_dtype lt[FT_MAXL]; /* layer_dtype, when lt[0] is set */
  int head_scales;
} ft_scen;

/* F16 with block bounds; INT8 keys and FP8 values with per-head scales;
   INT4 (a full 32-value group and a short one); an FP8 E5M2 and an F32
   layer, values stored rotated (a shape field more to get wrong; keys stay
   exact for the byte oracle), positions implicit (evict_support NONE). */
static const ft_scen ft_scens[4] = {
    {2, 2, 8, 8, 4, KVA_EVICT_SUPPORT_ALL, 1, 0, KVA_F16, KVA_F16, {KVA_DTYPE_DEFAULT, KVA_DTYPE_DEFAULT}, 0},
    {2, 2, 8, 6, 3, KVA_EVICT_SUPPORT_WINDOW, 1, 0, KVA_INT8, KVA_FP8_E4M3, {KVA_DTYPE_DEFAULT, KVA_DTYPE_DEFAULT}, 1},
    {1, 2, 40, 36, 2, KVA_EVICT_SUPPORT_ALL, 1, 0, KVA_INT4, KVA_INT4, {KVA_DTYPE_DEFAULT, KVA_DTYPE_DEFAULT}, 0},
    {2, 1, 8, 8, 4, KVA_EVICT_SUPPORT_NONE, 0, KVA_ROTATE_V, KVA_F16, KVA_F16, {KVA_FP8_E5M2, KVA_F32}, 1},
};

/* One scenario's valid chain and what the documented layout says about it.
   Built once per process: the source cache is deterministic. */
typedef struct {
  int ready;
  size_t rsize, tok_off, rows_off, rows_len;
  unsigned char *valid[FT_NREC];
  int32_t tok[FT_NREC * FT_MAXBS + 1];
  kva_dtype kt[FT_MAXL], vt[FT_MAXL];
  float ks[FT_MAXL][FT_MAXG], vs[FT_MAXL][FT_MAXG];
  size_t krow[FT_MAXL], vrow[FT_MAXL];
  float rk[FT_NREC][FT_MAXL][FT_MAXBS][FT_MAXG * FT_MAXD]; /* the source's kva_seq_read of each block */
  float rv[FT_NREC][FT_MAXL][FT_MAXBS][FT_MAXG * FT_MAXD];
  float ref[FT_NREC + 1][2][FT_MAXL][2 * FT_MAXG * FT_MAXD]; /* ft_step after 1..3 blocks, without / with select */
} ft_ctx;
static ft_ctx ft_ctxs[4];

typedef struct {
  uint8_t key[32];
  unsigned char *rec;
  size_t n;
} ft_ent;

/* The engine's side of the tier: a store of (possibly edited) records filed
   under their key field, and a capture of what kva_prefix_save spills. */
typedef struct {
  ft_ent ent[FT_NREC];
  int n_ent;
  size_t cap;
  int online;   /* 0: every fetch misses (checks must not pull records in) */
  int answered; /* one record per lookup, so each lookup's effect is one known block */
  int behave;   /* 0-2 honest; 3 ignores the key (records in order); 4 claims more than cap; 5 claims SIZE_MAX;
                   6 fails; 7 files each record under the next one's key */
  int n_calls, got, n_answers;
  uint8_t asked[4][32];
  size_t claimed;
  unsigned char *seen; /* rec as the cache reads it: what was copied, and stale bytes past it */
  int capture, n_cap;
  ft_ent caps[FT_MMAX + 4];
} ft_store;

static size_t ft_row_bytes(kva_dtype t, int dim) {
  switch (t) {
    case KVA_F32: return 4 * (size_t)dim;
    case KVA_INT8: return (size_t)dim + 4;
    case KVA_FP8_E4M3:
    case KVA_FP8_E5M2: return (size_t)dim;
    case KVA_INT4: return (size_t)(dim / 32) * 20 + (dim % 32 ? 4 + (size_t)(dim % 32 + 1) / 2 : 0);
    default: return 2 * (size_t)dim;
  }
}

static kva_status ft_spill(void *user, const uint8_t key[32], const void *rec, size_t size) {
  ft_store *s = (ft_store *)user;
  ft_ent *e;
  FI_CHECK(size == s->cap, "spill of %lu bytes, kva_prefix_record_size is %lu", (unsigned long)size,
           (unsigned long)s->cap);
  FI_CHECK(memcmp((const unsigned char *)rec + 24, key, 32) == 0, "a record spilled under another key");
  if (!s->capture) return KVA_OK; /* a block forgotten for room: the store keeps the fuzzer's records only */
  if (s->n_cap == FT_MMAX + 4) return KVA_ERR_FULL;
  e = &s->caps[s->n_cap++];
  memcpy(e->key, key, 32);
  e->rec = (unsigned char *)malloc(size);
  FI_CHECK(e->rec != NULL, "out of memory");
  memcpy(e->rec, rec, size);
  e->n = size;
  return KVA_OK;
}

static kva_status ft_fetch(void *user, const uint8_t key[32], void *rec, size_t cap, size_t *size) {
  ft_store *s = (ft_store *)user;
  size_t copy, claim;
  int i;
  FI_CHECK(cap == s->cap, "fetch with cap %lu, kva_prefix_record_size is %lu", (unsigned long)cap,
           (unsigned long)s->cap);
  if (s->n_calls < 4) memcpy(s->asked[s->n_calls], key, 32);
  s->n_calls++;
  if (!s->online || s->answered) return KVA_ERR_ARG;
  if (s->behave == 6) return KVA_ERR_FULL; /* a store that failed or timed out */
  if (s->behave == 3) { /* a store keyed by something else: only the record's key field can tell */
    i = s->n_answers % s->n_ent;
  } else {
    for (i = 0; i < s->n_ent && memcmp(s->ent[i].key, key, 32) != 0; i++) {
    }
    if (i == s->n_ent) return KVA_ERR_ARG;
    if (s->behave == 7) i = (i + 1) % s->n_ent;
  }
  s->n_answers++;
  s->answered = 1;
  copy = s->ent[i].n < cap ? s->ent[i].n : cap;
  memcpy(rec, s->ent[i].rec, copy);
  claim = s->ent[i].n;
  if (s->behave == 4) claim = cap + 1 + s->ent[i].n % 7;
  if (s->behave == 5) claim = (size_t)-1;
  memcpy(s->seen, rec, cap);
  s->got = i;
  s->claimed = claim;
  *size = claim;
  return KVA_OK;
}

static void ft_desc(const ft_scen *s, kva_cache_desc *d, int n_blocks, ft_store *st) {
  memset(d, 0, sizeof *d);
  d->kind = KVA_CACHE_KV;
  d->n_layers = s->L, d->n_kv_heads = s->G, d->head_dim = s->D, d->v_dim = s->DV;
  d->block_size = s->bs, d->n_blocks = n_blocks, d->max_seqs = 4;
  d->dtype = s->kt, d->v_dtype = s->vt;
  if (s->lt[0] != KVA_DTYPE_DEFAULT) d->layer_dtype = s->lt;
  d->k_scale = 0.375f, d->v_scale = 0.875f;
  if (s->head_scales) d->head_k_scale = fi_head_k, d->head_v_scale = fi_head_v;
  d->evict_support = s->support;
  d->block_bounds = s->bounds;
  d->rotate = s->rotate;
  d->spill = ft_spill, d->fetch = ft_fetch, d->tier_user = st;
}

static void ft_store_rows(kva_cache *c, const ft_scen *s, int seq, int n, kt_rng *rng) {
  float k[(FT_NREC * FT_MAXBS + 1) * FT_MAXG * FT_MAXD], v[(FT_NREC * FT_MAXBS + 1) * FT_MAXG * FT_MAXD];
  int l;
  kva_status st;
  for (l = 0; l < s->L; l++) {
    kt_fill(rng, k, (size_t)(n * s->G * s->D), -2.0f, 2.0f);
    kt_fill(rng, v, (size_t)(n * s->G * s->DV), -2.0f, 2.0f);
    st = kva_store(c, seq, l, k, v, n);
    FI_CHECK(st == KVA_OK, "tier store of %d tokens: %s", n, kva_status_str(st));
  }
}

static void ft_caps_free(ft_store *s) {
  int i;
  for (i = 0; i < s->n_cap; i++) free(s->caps[i].rec);
  s->n_cap = 0;
}

/* One token after seq's reused prefix: appended, stored and attended in
   every layer with the same K, V and queries on every call, so that a cache
   that took records in can be compared with the one that wrote them.  With
   select (and bounds), a budget of two reused blocks besides the new token:
   with three reused, the blocks' bounds decide which two are read. */
static kva_status ft_step(kva_cache *c, const ft_scen *s, int seq, int select,
                          float out[FT_MAXL][2 * FT_MAXG * FT_MAXD]) {
  float k[FT_MAXG * FT_MAXD], v[FT_MAXG * FT_MAXD], q[2 * FT_MAXG * FT_MAXD];
  kva_attn a;
  kt_rng rng;
  int l;
  kva_status st = kva_seq_append(c, seq, 1);
  if (st != KVA_OK) return st;
  memset(&a, 0, sizeof a);
  a.n_heads = 2 * s->G, a.n_kv_heads = s->G, a.head_dim = s->D, a.v_dim = s->DV, a.n_threads = 1;
  if (select && s->bounds) a.select_budget = 2 * s->bs + 1, a.select_recent = 1;
  kt_seed(&rng, 0xA77Eu);
  for (l = 0; l < s->L; l++) {
    kt_fill(&rng, k, (size_t)(s->G * s->D), -2.0f, 2.0f);
    kt_fill(&rng, v, (size_t)(s->G * s->DV), -2.0f, 2.0f);
    kt_fill(&rng, q, (size_t)(2 * s->G * s->D), -2.0f, 2.0f);
    st = kva_store(c, seq, l, k, v, 1);
    FI_CHECK(st == KVA_OK, "step store: %s", kva_status_str(st));
    st = kva_attend_cache(c, seq, l, &a, q, 1, out[l]);
    FI_CHECK(st == KVA_OK, "attention over a reused prefix: %s", kva_status_str(st));
  }
  return KVA_OK;
}

static ft_ctx *ft_ctx_get(int si) {
  const ft_scen *s = &ft_scens[si];
  ft_ctx *t = &ft_ctxs[si];
  kva_cache_desc d;
  kva_cache *c = NULL;
  ft_store st;
  kt_rng rng;
  size_t want, p;
  int seq = -1, i, l, slot, n_saved = 0;
  int32_t pos[FT_MAXG];
  kva_status r;
  if (t->ready) return t;
  memset(&st, 0, sizeof st);
  ft_desc(s, &d, 8, &st);
  r = kva_cache_create(&d, &c);
  FI_CHECK(r == KVA_OK, "tier scenario %d: %s", si, kva_status_str(r));
  st.cap = t->rsize = kva_prefix_record_size(c);
  t->tok_off = FT_HDR + (size_t)s->L * (8 + 8 * (size_t)s->G);
  t->rows_off = t->tok_off + 4 * (size_t)s->bs;
  want = t->rows_off + 8;
  p = FT_HDR;
  for (l = 0; l < s->L; l++) {
    kva_dtype kt = s->lt[0] != KVA_DTYPE_DEFAULT ? s->lt[l] : s->kt;
    kva_dtype vt = s->lt[0] != KVA_DTYPE_DEFAULT ? s->lt[l] : s->vt;
    t->krow[l] = ft_row_bytes(kt, s->D);
    t->vrow[l] = ft_row_bytes(vt, s->DV);
    want += (size_t)s->G * (size_t)s->bs * (t->krow[l] + t->vrow[l]);
  }
  FI_CHECK(t->rsize == want, "kva_prefix_record_size %lu, the documented layout gives %lu",
           (unsigned long)t->rsize, (unsigned long)want);
  t->rows_len = t->rsize - 8 - t->rows_off;
  for (i = 0; i < FT_NREC * s->bs + 1; i++) t->tok[i] = 11 * i + 3;
  kt_seed(&rng, 4321u + (uint64_t)si);
  kva_seq_new(c, &seq);
  r = kva_seq_append(c, seq, FT_NREC * s->bs + 1);
  FI_CHECK(r == KVA_OK, "tier source append: %s", kva_status_str(r));
  ft_store_rows(c, s, seq, FT_NREC * s->bs + 1, &rng);
  for (i = 0; i < FT_NREC; i++)
    for (l = 0; l < s->L; l++)
      for (slot = 0; slot < s->bs; slot++) {
        r = kva_seq_read(c, seq, l, i * s->bs + slot, t->rk[i][l][slot], t->rv[i][l][slot], pos);
        FI_CHECK(r == KVA_OK, "tier source read: %s", kva_status_str(r));
      }
  r = kva_seq_publish(c, seq, t->tok, FT_NREC * s->bs, FT_SALT);
  FI_CHECK(r == KVA_OK, "tier source publish: %s", kva_status_str(r));
  st.capture = 1;
  r = kva_prefix_save(c, &n_saved);
  FI_CHECK(r == KVA_OK && n_saved == FT_NREC && st.n_cap == FT_NREC, "tier source save: %s, %d saved",
           kva_status_str(r), n_saved);
  for (i = 0; i < FT_NREC; i++) t->valid[i] = st.caps[i].rec; /* parents first: the chain in order */
  st.n_cap = 0;
  /* ft_ok compares with these records' header and layer fields, so they must
     be the documented ones, not merely what this writer wrote */
  for (i = 0; i < FT_NREC; i++) {
    const unsigned char *v = t->valid[i];
    const int32_t shape[8] = {KVA_CACHE_KV, s->L, s->G, s->D, s->DV, s->bs, s->rotate, 0};
    uint8_t key[32], parent[32], root[32];
    uint64_t u;
    uint32_t w[2];
    memset(parent, 0, 32);
    kva_prefix_key(NULL, FT_SALT, t->tok, s->bs, root);
    if (i == 1) memcpy(parent, root, 32);
    if (i == 2) kva_prefix_key(root, FT_SALT, t->tok + s->bs, s->bs, parent);
    kva_prefix_key(i ? parent : NULL, FT_SALT, t->tok + i * s->bs, s->bs, key);
    memcpy(w, v + 8, 8);
    FI_CHECK(memcmp(v, "kvattnPB", 8) == 0 && w[0] == 1 && w[1] == 0x01020304u, "record %d: magic, version, order", i);
    memcpy(&u, v + 16, 8);
    FI_CHECK(u == t->rsize && memcmp(v + 24, key, 32) == 0 && memcmp(v + 56, parent, 32) == 0,
             "record %d: size field, key or parent key", i);
    memcpy(&u, v + 88, 8);
    FI_CHECK(u == FT_SALT && memcmp(v + 96, shape, 32) == 0, "record %d: salt, shape or reserved word", i);
    FI_CHECK(memcmp(v + t->tok_off, t->tok + i * s->bs, 4 * (size_t)s->bs) == 0, "record %d: token ids", i);
    memcpy(&u, v + t->rsize - 8, 8);
    FI_CHECK(u == kva__stream_checksum(v, t->rsize - 8), "record %d: checksum", i);
    for (l = 0, p = FT_HDR; l < s->L; l++, p += 8 + 8 * (size_t)s->G) {
      const kva_dtype want_t[2] = {s->lt[0] != KVA_DTYPE_DEFAULT ? s->lt[l] : s->kt,
                                   s->lt[0] != KVA_DTYPE_DEFAULT ? s->lt[l] : s->vt};
      int kv, g;
      memcpy(w, v + p, 8);
      FI_CHECK(w[0] == (uint32_t)want_t[0] && w[1] == (uint32_t)want_t[1], "record %d layer %d: types", i, l);
      for (kv = 0; kv < 2; kv++)
        for (g = 0; g < s->G; g++) {
          const int fp8 = want_t[kv] == KVA_FP8_E4M3 || want_t[kv] == KVA_FP8_E5M2;
          float f, want_f = !fp8 ? 1.0f : s->head_scales ? (kv ? fi_head_v : fi_head_k)[l * s->G + g]
                                                         : (kv ? 0.875f : 0.375f);
          memcpy(&f, v + p + 8 + 4 * (size_t)(kv * s->G + g), 4);
          FI_CHECK(kt_f2u(f) == kt_f2u(want_f), "record %d layer %d: %s scale of head %d is %g", i, l, kv ? "V" : "K",
                   g, (double)f);
        }
    }
  }
  p = FT_HDR;
  /* the types and FP8 scales a record of this cache carries, as the layout says */
  for (l = 0; l < s->L; l++) {
    const unsigned char *m = t->valid[0] + p;
    int32_t ty;
    memcpy(&ty, m, 4), t->kt[l] = (kva_dtype)ty;
    memcpy(&ty, m + 4, 4), t->vt[l] = (kva_dtype)ty;
    memcpy(t->ks[l], m + 8, 4 * (size_t)s->G);
    memcpy(t->vs[l], m + 8 + 4 * (size_t)s->G, 4 * (size_t)s->G);
    p += 8 + 8 * (size_t)s->G;
  }
  kva_seq_free(c, seq);
  for (i = 1; i <= FT_NREC; i++)
    for (l = 0; l < 2; l++) {
      int reused = -1;
      r = kva_seq_new_prefix(c, t->tok, i * s->bs + 1, FT_SALT, &seq, &reused);
      FI_CHECK(r == KVA_OK && reused == i * s->bs, "tier source lookup: %s, %d reused", kva_status_str(r), reused);
      r = ft_step(c, s, seq, l, t->ref[i][l]);
      FI_CHECK(r == KVA_OK, "tier source step: %s", kva_status_str(r));
      kva_seq_free(c, seq);
    }
  kva_cache_destroy(c);
  t->ready = 1;
  return t;
}

/* The documented checks, from the outside.  key NULL: kva_prefix_load's
   view (the key must be the record's own parent key, salt and token ids);
   else fetch's (the key, parent key, salt and token ids asked for). */
static int ft_ok(const ft_ctx *t, int bs, const unsigned char *r, size_t n, const uint8_t *key, const uint8_t *parent,
                 uint64_t salt, const int32_t *tok) {
  static const uint8_t zero[32] = {0};
  uint64_t u;
  uint8_t own[32];
  int32_t rt[FT_MAXBS];
  if (n != t->rsize) return 0;
  memcpy(&u, r + n - 8, 8);
  if (u != kva__stream_checksum(r, n - 8)) return 0;
  if (memcmp(r, t->valid[0], 16) != 0) return 0; /* magic, version, byte order */
  memcpy(&u, r + 16, 8);
  if (u != (uint64_t)n) return 0;
  if (memcmp(r + 96, t->valid[0] + 96, 32) != 0) return 0; /* shape and the reserved word */
  if (memcmp(r + FT_HDR, t->valid[0] + FT_HDR, t->tok_off - FT_HDR) != 0) return 0; /* types, FP8 scales */
  memcpy(rt, r + t->tok_off, 4 * (size_t)bs);
  memcpy(&u, r + 88, 8);
  if (key) return memcmp(r + 24, key, 32) == 0 && memcmp(r + 56, parent, 32) == 0 && u == salt &&
                  memcmp(rt, tok, 4 * (size_t)bs) == 0;
  kva_prefix_key(memcmp(r + 56, zero, 32) != 0 ? r + 56 : NULL, u, rt, bs, own);
  return memcmp(own, r + 24, 32) == 0;
}

/* Element i of a stored row, as docs/API.md "Storage types of a cache" reads it back */
static float ft_decode(kva_dtype t, const unsigned char *row, int i, float fp8) {
  uint16_t h;
  float f;
  switch (t) {
    case KVA_F32: memcpy(&f, row + 4 * i, 4); return f;
    case KVA_F16: memcpy(&h, row + 2 * i, 2); return kva_f16_to_f32(h);
    case KVA_BF16: memcpy(&h, row + 2 * i, 2); return kva_bf16_to_f32(h);
    case KVA_INT8: memcpy(&f, row, 4); return (float)(int8_t)row[4 + i] * f;
    case KVA_FP8_E4M3: return kva_e4m3_to_f32(row[i]) * fp8;
    case KVA_FP8_E5M2: return kva_e5m2_to_f32(row[i]) * fp8;
    default: { /* INT4: [f16 scale][f16 min][codes, the lower element in the low nibble] per 32 values */
      const unsigned char *g = row + 20 * (i / 32);
      uint16_t hm;
      memcpy(&h, g, 2), memcpy(&hm, g + 2, 2);
      return (float)((g[4 + (i % 32) / 2] >> (4 * (i & 1))) & 15) * kva_f16_to_f32(h) + kva_f16_to_f32(hm);
    }
  }
}

static int ft_same_float(float a, float b) { return a != a ? b != b : kt_f2u(a) == kt_f2u(b); }

/* ---- the model of memory ---- */

typedef struct {
  uint8_t key[32], parent[32];
  uint64_t salt;
  int32_t tok[FT_MAXBS];
  unsigned char *bytes; /* the record it came from (owned), NULL: published in this cache */
} ft_blk;

typedef struct {
  const ft_scen *s;
  ft_ctx *t;
  kva_cache *c;
  ft_store *st;
  ft_blk m[FT_MMAX];
  int nm;
  int exact; /* the model knows every published block: nothing was recycled */
  int select;
} ft_route;

static const uint8_t ft_zero[32] = {0};

static int ft_find(const ft_route *r, const uint8_t key[32]) {
  int i;
  for (i = 0; i < r->nm; i++)
    if (memcmp(r->m[i].key, key, 32) == 0) return i;
  return -1;
}

static int ft_add(ft_route *r, const uint8_t key[32], const uint8_t parent[32], uint64_t salt, const int32_t *tok,
                  const unsigned char *bytes) {
  int i = ft_find(r, key);
  ft_blk *b;
  if (i < 0) {
    FI_CHECK(r->nm < FT_MMAX, "more published blocks than the model holds");
    i = r->nm++;
    memset(&r->m[i], 0, sizeof r->m[i]);
  }
  b = &r->m[i];
  memcpy(b->key, key, 32), memcpy(b->parent, parent, 32);
  b->salt = salt;
  memcpy(b->tok, tok, 4 * (size_t)r->s->bs);
  free(b->bytes);
  b->bytes = NULL;
  if (bytes) {
    b->bytes = (unsigned char *)malloc(r->t->rsize);
    FI_CHECK(b->bytes != NULL, "out of memory");
    memcpy(b->bytes, bytes, r->t->rsize);
  }
  return i;
}

/* The token ids of block i's whole prefix, root first; 0 when the model
   lost a parent (recycled), else the number of blocks.  *same: one salt. */
static int ft_chain(const ft_route *r, int i, int32_t *tok, int *same) {
  int path[FT_MMAX], n = 0, k;
  *same = 1;
  while (i >= 0 && n < FT_MMAX) {
    path[n++] = i;
    if (memcmp(r->m[i].parent, ft_zero, 32) == 0) break;
    k = ft_find(r, r->m[i].parent);
    if (k >= 0 && r->m[k].salt != r->m[i].salt) *same = 0;
    i = k;
  }
  if (i < 0 || n == FT_MMAX) return 0;
  for (k = 0; k < n; k++) memcpy(tok + (size_t)k * (size_t)r->s->bs, r->m[path[n - 1 - k]].tok, 4 * (size_t)r->s->bs);
  return n;
}

/* Blocks a lookup of (tok, salt) finds in memory, per the model: a key is
   the identity, so memory holds block i iff it holds its key. */
static int ft_expect(const ft_route *r, const int32_t *tok, int nb, uint64_t salt, uint8_t keys[][32]) {
  uint8_t k[32], parent[32];
  int i;
  for (i = 0; i < nb; i++) {
    if (i) memcpy(parent, k, 32); /* (kva_prefix_key is not documented to allow parent == key) */
    kva_prefix_key(i ? parent : NULL, salt, tok + (size_t)i * (size_t)r->s->bs, r->s->bs, k);
    if (keys) memcpy(keys[i], k, 32);
    if (ft_find(r, k) < 0) break;
  }
  return i;
}

static int ft_tier_same(const kva_cache_stats *a, const kva_cache_stats *b) {
  return kt_stats_equal(a, b, 0) && a->tier_spills == b->tier_spills && a->tier_spill_errors == b->tier_spill_errors &&
         a->tier_fetch_hits == b->tier_fetch_hits && a->tier_fetch_misses == b->tier_fetch_misses &&
         a->tier_fetch_refused == b->tier_fetch_refused && a->tier_loads == b->tier_loads;
}

static void ft_stats(const ft_route *r, kva_cache_stats *st) {
  kva_cache_get_stats(r->c, st);
  FI_CHECK(fi_sane(st), "tier stats: %d used %d cached %d free of %d", st->blocks_used, st->blocks_cached,
           st->blocks_free, st->n_blocks);
}

/* Block `blk` of seq reads back as the record's rows say, at the positions of its depth */
static void ft_rows(const ft_route *r, int seq, int blk, const unsigned char *bytes) {
  const ft_scen *s = r->s;
  const ft_ctx *t = r->t;
  float k[FT_MAXG * FT_MAXD], v[FT_MAXG * FT_MAXD];
  int32_t pos[FT_MAXG];
  int l, slot, g, i, j, src = -1;
  size_t off = t->rows_off;
  kva_status st;
  for (j = 0; j < FT_NREC && bytes; j++)
    if (memcmp(bytes + t->rows_off, t->valid[j] + t->rows_off, t->rows_len) == 0) src = j;
  for (l = 0; l < s->L; l++) {
    size_t voff = off + (size_t)s->G * (size_t)s->bs * t->krow[l];
    for (slot = 0; slot < s->bs; slot++) {
      st = kva_seq_read(r->c, seq, l, blk * s->bs + slot, k, v, pos);
      FI_CHECK(st == KVA_OK, "read of reused block %d: %s", blk, kva_status_str(st));
      for (g = 0; g < s->G; g++)
        FI_CHECK(pos[g] == blk * s->bs + slot, "reused block %d slot %d head %d at position %d", blk, slot, g, pos[g]);
      if (!bytes) continue;
      if (src >= 0) /* the source's rows: the source's values, rotated or not */
        FI_CHECK(kt_same_bits(k, t->rk[src][l][slot], (size_t)(s->G * s->D)) &&
                     kt_same_bits(v, t->rv[src][l][slot], (size_t)(s->G * s->DV)),
                 "block %d layer %d slot %d reads back other than its source (record %d's rows)", blk, l, slot, src);
      for (g = 0; g < s->G; g++) { /* (rows rotated back in float have no exact oracle from the bytes) */
        const unsigned char *kr = bytes + off + ((size_t)g * (size_t)s->bs + (size_t)slot) * t->krow[l];
        const unsigned char *vr = bytes + voff + ((size_t)g * (size_t)s->bs + (size_t)slot) * t->vrow[l];
        for (i = 0; i < s->D && !(s->rotate & KVA_ROTATE_K); i++)
          FI_CHECK(ft_same_float(k[g * s->D + i], ft_decode(t->kt[l], kr, i, t->ks[l][g])),
                   "block %d layer %d slot %d head %d: K[%d] reads %g, its record's bytes say %g", blk, l, slot, g, i,
                   (double)k[g * s->D + i], (double)ft_decode(t->kt[l], kr, i, t->ks[l][g]));
        for (i = 0; i < s->DV && !(s->rotate & KVA_ROTATE_V); i++)
          FI_CHECK(ft_same_float(v[g * s->DV + i], ft_decode(t->vt[l], vr, i, t->vs[l][g])),
                   "block %d layer %d slot %d head %d: V[%d] reads %g, its record's bytes say %g", blk, l, slot, g, i,
                   (double)v[g * s->DV + i], (double)ft_decode(t->vt[l], vr, i, t->vs[l][g]));
      }
    }
    off = voff + (size_t)s->G * (size_t)s->bs * t->vrow[l];
  }
}

/* Every reused block of seq: positions, and rows where the model has its record */
static void ft_read_reused(const ft_route *r, int seq, const int32_t *tok, int nb, uint64_t salt) {
  uint8_t keys[FT_MMAX + 1][32];
  int i, j;
  for (i = 0; i < nb; i++) {
    kva_prefix_key(i ? keys[i - 1] : NULL, salt, tok + (size_t)i * (size_t)r->s->bs, r->s->bs, keys[i]);
    j = ft_find(r, keys[i]);
    ft_rows(r, seq, i, j >= 0 ? r->m[j].bytes : NULL);
  }
}

/* kva_prefix_save hands every published block over, parents first, and
   block i's record is the very record it was taken in from. */
static void ft_saved(ft_route *r, int i) {
  kva_cache_stats a, b;
  int n_saved = -1, j, k, found = 0;
  kva_status st;
  ft_stats(r, &a);
  r->st->capture = 1;
  st = kva_prefix_save(r->c, &n_saved);
  r->st->capture = 0;
  ft_stats(r, &b);
  FI_CHECK(st == KVA_OK && n_saved == r->st->n_cap, "save: %s, %d saved of %d spilled", kva_status_str(st), n_saved,
           r->st->n_cap);
  FI_CHECK(kt_stats_equal(&a, &b, 0) && b.tier_spills == a.tier_spills + n_saved, "save changed the cache");
  if (r->exact) FI_CHECK(n_saved == r->nm, "save spilled %d records, %d blocks are published", n_saved, r->nm);
  for (j = 0; j < r->st->n_cap; j++) {
    const unsigned char *rec = r->st->caps[j].rec;
    if (memcmp(rec + 56, ft_zero, 32) != 0) {
      for (k = 0; k < j && memcmp(r->st->caps[k].key, rec + 56, 32) != 0; k++) {
      }
      FI_CHECK(k < j, "save spilled a child before its parent");
    }
    if (memcmp(r->st->caps[j].key, r->m[i].key, 32) == 0) {
      found = 1;
      if (r->m[i].bytes)
        FI_CHECK(memcmp(rec, r->m[i].bytes, r->t->rsize) == 0, "the saved record differs from the one taken in");
    }
  }
  FI_CHECK(found, "a block just taken in is not saved");
  ft_caps_free(r->st);
}

/* A lookup of model block i's own prefix under its own salt reuses it (with
   every block before it when the chain has one salt); the rows read back. */
static void ft_check_block(ft_route *r, int i) {
  int32_t tok[(FT_MMAX + 1) * FT_MAXBS + 1];
  kva_cache_stats a, b;
  int nb, same, want, seq = -1, reused = -1;
  uint64_t salt = r->m[i].salt;
  kva_status st;
  nb = ft_chain(r, i, tok, &same);
  FI_CHECK(nb > 0 || !r->exact, "a block in memory whose parent is not");
  if (nb == 0) { /* the model lost a parent to recycling: the record still saves as it came */
    ft_saved(r, i);
    return;
  }
  tok[nb * r->s->bs] = FT_EXTRA_TOKEN;
  r->st->online = 0;
  want = ft_expect(r, tok, nb, salt, NULL);
  ft_stats(r, &a);
  st = kva_seq_new_prefix(r->c, tok, nb * r->s->bs + 1, salt, &seq, &reused);
  FI_CHECK(st == KVA_OK, "lookup of a block taken in: %s", kva_status_str(st));
  FI_CHECK(reused >= 0 && reused % r->s->bs == 0 && reused <= nb * r->s->bs, "lookup reused %d", reused);
  if (r->exact) {
    FI_CHECK(reused == want * r->s->bs, "a lookup reused %d tokens, memory holds %d of its blocks", reused, want);
    FI_CHECK(!same || want == nb, "a block taken in is not found by its own tokens and salt");
  }
  ft_read_reused(r, seq, tok, reused / r->s->bs, salt);
  st = kva_seq_free(r->c, seq);
  FI_CHECK(st == KVA_OK, "free: %s", kva_status_str(st));
  ft_stats(r, &b);
  FI_CHECK(a.blocks_used == b.blocks_used && a.blocks_cached == b.blocks_cached && a.blocks_free == b.blocks_free,
           "a lookup and free moved blocks");
  ft_saved(r, i);
}

/* One kva_prefix_load of n bytes; returns the outcome, or -100 - status */
static int ft_load(ft_route *r, const unsigned char *rec, size_t n) {
  kva_cache_stats a, b, e;
  unsigned char *buf = (unsigned char *)malloc(n ? n : 1); /* exactly n: ASan sees a read past it */
  int outcome = 77, valid, want = 99, mixed = 0;
  uint64_t salt = 0;
  kva_status st;
  FI_CHECK(buf != NULL, "out of memory");
  memcpy(buf, rec, n);
  ft_stats(r, &a);
  st = kva_prefix_load(r->c, buf, n, &outcome);
  ft_stats(r, &b);
  valid = ft_ok(r->t, r->s->bs, rec, n, NULL, NULL, 0, NULL);
  if (valid && memcmp(rec + 56, ft_zero, 32) != 0) { /* a chain keeps one salt: under another parent's, refused */
    int pi = ft_find(r, rec + 56);
    uint64_t own;
    memcpy(&own, rec + 88, 8);
    mixed = pi >= 0 && r->m[pi].salt != own;
  }
  FI_CHECK(st == KVA_OK || st == KVA_ERR_STREAM || st == KVA_ERR_FULL, "load returned %s", kva_status_str(st));
  FI_CHECK(st != KVA_ERR_STREAM || !valid || mixed, "a record that passes every documented check was refused");
  /* (the model may still list a parent a fetch recycled: then the library finds none) */
  FI_CHECK(!mixed || st == KVA_ERR_STREAM || (!r->exact && st == KVA_OK && outcome == KVA_PREFIX_NO_PARENT),
           "a record under another salt than its parent's: %s, outcome %d", kva_status_str(st), outcome);
  if (mixed && st != KVA_OK) {
    FI_CHECK(outcome == 77 && ft_tier_same(&a, &b), "a refused load changed the cache or wrote *outcome");
    free(buf);
    return -100 - (int)st;
  }
  FI_CHECK(st == KVA_ERR_STREAM || valid, "load accepted (%s, outcome %d) a record that fails a documented check",
           kva_status_str(st), outcome);
  if (valid) {
    memcpy(&salt, rec + 88, 8);
    if (memcmp(rec + 56, ft_zero, 32) != 0 && ft_find(r, rec + 56) < 0) want = KVA_PREFIX_NO_PARENT;
    else if (ft_find(r, rec + 24) >= 0) want = KVA_PREFIX_IN_MEMORY;
    else if (a.blocks_free == 0) want = -100 - KVA_ERR_FULL;
    else want = KVA_PREFIX_LOADED;
  }
  if (st != KVA_OK) {
    FI_CHECK(outcome == 77, "a refused load (%s) wrote *outcome", kva_status_str(st));
    FI_CHECK(ft_tier_same(&a, &b), "a refused load (%s) changed the cache", kva_status_str(st));
    FI_CHECK(st != KVA_ERR_FULL || a.blocks_free == 0, "KVA_ERR_FULL with %d free blocks", a.blocks_free);
    if (r->exact && st == KVA_ERR_FULL) FI_CHECK(want == -100 - KVA_ERR_FULL, "KVA_ERR_FULL, the model says %d", want);
    free(buf);
    return -100 - (int)st;
  }
  free(buf);
  FI_CHECK(outcome == KVA_PREFIX_LOADED || outcome == KVA_PREFIX_IN_MEMORY || outcome == KVA_PREFIX_NO_PARENT,
           "load outcome %d", outcome);
  if (r->exact) FI_CHECK(outcome == want, "load outcome %d, the model says %d", outcome, want);
  if (outcome != KVA_PREFIX_LOADED) {
    FI_CHECK(ft_tier_same(&a, &b), "a load with outcome %d changed the cache", outcome);
    return outcome;
  }
  e = a;
  e.blocks_cached++, e.blocks_free--, e.tier_loads++;
  FI_CHECK(ft_tier_same(&e, &b), "a loaded record: %d used %d cached %d free (before %d %d %d), %ld loads",
           b.blocks_used, b.blocks_cached, b.blocks_free, a.blocks_used, a.blocks_cached, a.blocks_free, b.tier_loads);
  {
    int32_t tok[FT_MAXBS];
    memcpy(tok, rec + r->t->tok_off, 4 * (size_t)r->s->bs);
    ft_check_block(r, ft_add(r, rec + 24, rec + 56, salt, tok, rec));
  }
  return outcome;
}

/* State the cache holds before the records arrive */
static void ft_setup(ft_route *r, int live, int other, int preload, kt_rng *rng) {
  const int bs = r->s->bs;
  kva_cache_stats a;
  int seq, i;
  int32_t tok[FT_MAXBS];
  uint8_t key[32];
  if (live) { /* blocks a sequence holds: fewer free ones, never recyclable */
    ft_stats(r, &a);
    if (a.blocks_free >= 2 && kva_seq_new(r->c, &seq) == KVA_OK) {
      FI_CHECK(kva_seq_append(r->c, seq, bs + 1) == KVA_OK, "live append");
      ft_store_rows(r->c, r->s, seq, bs + 1, rng);
    }
  }
  if (other) { /* a cached block of another salt: a load never takes it, a fetch may recycle it */
    ft_stats(r, &a);
    if (a.blocks_free >= 1 && kva_seq_new(r->c, &seq) == KVA_OK) {
      for (i = 0; i < bs; i++) tok[i] = 1000 + i;
      FI_CHECK(kva_seq_append(r->c, seq, bs) == KVA_OK, "other append");
      ft_store_rows(r->c, r->s, seq, bs, rng);
      FI_CHECK(kva_seq_publish(r->c, seq, tok, bs, FT_OTHER_SALT) == KVA_OK, "other publish");
      FI_CHECK(kva_seq_free(r->c, seq) == KVA_OK, "other free");
      kva_prefix_key(NULL, FT_OTHER_SALT, tok, bs, key);
      ft_add(r, key, ft_zero, FT_OTHER_SALT, tok, NULL);
    }
  }
  if (preload) ft_load(r, r->t->valid[0], r->t->rsize); /* a chain's root already in memory */
}

/* Attention over the longest prefix of (tok, salt) memory holds, one token
   on.  When every reused block holds the valid chain's rows in order, the
   result is the writer's own (ft_ctx.ref), bit for bit: positions and block
   bounds rebuilt from the rows must be those the writer had. */
static void ft_attend(ft_route *r, const int32_t *tok, int nb, uint64_t salt) {
  const ft_scen *s = r->s;
  const ft_ctx *t = r->t;
  float k[FT_MAXG * FT_MAXD], v[FT_MAXG * FT_MAXD], out[FT_MAXL][2 * FT_MAXG * FT_MAXD];
  int32_t pos[FT_MAXG];
  uint8_t key[32], parent[32];
  kva_cache_stats cs;
  int seq = -1, reused = -1, l, i, j, len, nr, same_rows, bounded = 1;
  kva_status st;
  r->st->online = 0;
  st = kva_seq_new_prefix(r->c, tok, nb * s->bs + 1, salt, &seq, &reused);
  FI_CHECK(st == KVA_OK, "attend lookup: %s", kva_status_str(st));
  nr = reused / s->bs;
  same_rows = nr >= 1 && nr <= FT_NREC;
  for (i = 0; i < nr && same_rows; i++) {
    if (i) memcpy(parent, key, 32);
    kva_prefix_key(i ? parent : NULL, salt, tok + (size_t)i * (size_t)s->bs, s->bs, key);
    j = ft_find(r, key);
    same_rows = j >= 0 && r->m[j].bytes &&
                memcmp(r->m[j].bytes + t->rows_off, t->valid[i] + t->rows_off, t->rows_len) == 0;
  }
  st = ft_step(r->c, s, seq, r->select, out);
  FI_CHECK(st == KVA_OK || st == KVA_ERR_FULL, "attend append: %s", kva_status_str(st));
  len = kva_seq_len(r->c, seq);
  for (l = 0; st == KVA_OK && l < s->L; l++) {
    if (same_rows)
      FI_CHECK(kt_same_bits(out[l], t->ref[nr][r->select][l], (size_t)(2 * s->G * s->DV)),
               "layer %d: attention over %d blocks taken in differs from the writer's over the same rows", l, nr);
    /* softmax weights average the values: finite rows in F16's range give a finite output */
    for (i = 0; i < len; i++) {
      FI_CHECK(kva_seq_read(r->c, seq, l, i, k, v, pos) == KVA_OK, "read");
      for (j = 0; j < s->G * s->D; j++) bounded &= k[j] == k[j] && fabsf(k[j]) <= 65504.0f;
      for (j = 0; j < s->G * s->DV; j++) bounded &= v[j] == v[j] && fabsf(v[j]) <= 65504.0f;
    }
    for (j = 0; bounded && j < 2 * s->G * s->DV; j++)
      FI_CHECK(out[l][j] == out[l][j] && fabsf(out[l][j]) <= FLT_MAX, "layer %d: output %g from bounded rows", l,
               (double)out[l][j]);
  }
  FI_CHECK(kva_seq_free(r->c, seq) == KVA_OK, "attend free");
  ft_stats(r, &cs);
}

/* The fetch route: lookups of (tok, salt), each answered with at most one
   record, until one takes nothing in. */
static void ft_fetch_route(ft_route *r, const int32_t *tok, uint64_t salt) {
  const int bs = r->s->bs;
  uint8_t keys[FT_NREC][32];
  kva_cache_stats a, b, e;
  int round, h, j, seq, reused, dh, dr, dm, ok;
  kva_status st;
  for (round = 0; round < FT_NREC + 1; round++) {
    ft_store *fs = r->st;
    h = ft_expect(r, tok, FT_NREC, salt, keys);
    for (j = h + 1; j < FT_NREC; j++) kva_prefix_key(keys[j - 1], salt, tok + (size_t)j * (size_t)bs, bs, keys[j]);
    fs->online = 1, fs->answered = 0, fs->n_calls = 0, fs->got = -1, fs->claimed = 0;
    ft_stats(r, &a);
    seq = reused = -1;
    st = kva_seq_new_prefix(r->c, tok, FT_NREC * bs + 1, salt, &seq, &reused);
    fs->online = 0;
    FI_CHECK(st == KVA_OK, "fetch lookup: %s", kva_status_str(st));
    ft_stats(r, &b);
    dh = (int)(b.tier_fetch_hits - a.tier_fetch_hits);
    dr = (int)(b.tier_fetch_refused - a.tier_fetch_refused);
    dm = (int)(b.tier_fetch_misses - a.tier_fetch_misses);
    FI_CHECK(dh >= 0 && dr >= 0 && dm >= 0 && dh + dr + dm == fs->n_calls && dh <= 1 && dr <= 1 && fs->n_calls <= 2,
             "%d fetch calls: %d hits, %d refused, %d misses", fs->n_calls, dh, dr, dm);
    FI_CHECK(reused >= 0 && reused % bs == 0 && reused <= FT_NREC * bs, "fetch lookup reused %d", reused);
    j = -1;
    if (fs->n_calls > 0) { /* the key asked is the documented key of the next block */
      for (j = 0; j < FT_NREC && memcmp(fs->asked[0], keys[j], 32) != 0; j++) {
      }
      FI_CHECK(j < FT_NREC, "fetch asked for a key that is not kva_prefix_key of the lookup's chain");
    }
    if (r->exact && h < FT_NREC) { /* asked exactly when memory lacks the block and the pool has room */
      FI_CHECK((fs->n_calls > 0) == (a.blocks_free + a.blocks_cached - h > 0),
               "%d fetch calls with %d free and %d cached blocks, %d of them hit", fs->n_calls, a.blocks_free,
               a.blocks_cached, h);
      FI_CHECK(fs->n_calls == 0 || j == h, "fetch asked for block %d, memory holds %d", j, h);
    }
    if (r->exact) FI_CHECK(reused == (h + dh) * bs, "fetch lookup reused %d, memory held %d blocks and %d came", reused,
                           h, dh);
    ok = 0;
    if (fs->got >= 0) { /* a record was handed over: verified iff the documented checks pass on what rec holds */
      ok = fs->claimed <= fs->cap && ft_ok(r->t, bs, fs->seen, fs->claimed, keys[j], j ? keys[j - 1] : ft_zero, salt,
                                           tok + (size_t)j * (size_t)bs);
      FI_CHECK(!ok || dh == 1, "a fetched record that passes every documented check was refused");
      FI_CHECK(ok || dh == 0, "a fetched record that fails a documented check was used (claimed %lu of %lu bytes)",
               (unsigned long)fs->claimed, (unsigned long)fs->cap);
    } else {
      FI_CHECK(dh == 0 && dr == 0, "a fetch that handed nothing over was counted as a hit or a refusal");
    }
    if (dh) {
      int i;
      FI_CHECK(fs->got >= 0 && ok, "a fetch hit without a verified record");
      ft_rows(r, seq, j, fs->seen);
      i = ft_add(r, keys[j], j ? keys[j - 1] : ft_zero, salt, tok + (size_t)j * (size_t)bs, fs->seen);
      if (a.blocks_free == 0) r->exact = 0; /* an LRU block (and what hangs on it) was recycled */
      ft_read_reused(r, seq, tok, reused / bs, salt);
      FI_CHECK(kva_seq_free(r->c, seq) == KVA_OK, "free");
      ft_stats(r, &e);
      if (a.blocks_free > 0)
        FI_CHECK(e.blocks_free == a.blocks_free - 1 && e.blocks_cached == a.blocks_cached + 1 &&
                     e.blocks_used == a.blocks_used && e.tier_spills == a.tier_spills,
                 "a fetched block: %d used %d cached %d free (before %d %d %d)", e.blocks_used, e.blocks_cached,
                 e.blocks_free, a.blocks_used, a.blocks_cached, a.blocks_free);
      ft_check_block(r, i);
    } else {
      ft_read_reused(r, seq, tok, reused / bs, salt);
      FI_CHECK(kva_seq_free(r->c, seq) == KVA_OK, "free");
      ft_stats(r, &e);
      b = a; /* a refusal or a miss: the lookup's own counters, nothing else */
      b.prefix_queries += FT_NREC * bs + 1, b.prefix_hits += reused;
      b.tier_fetch_refused += dr, b.tier_fetch_misses += dm;
      FI_CHECK(ft_tier_same(&b, &e), "a %s fetch changed the cache: %d used %d cached %d free (before %d %d %d)",
               dr ? "refused" : "missed", e.blocks_used, e.blocks_cached, e.blocks_free, a.blocks_used,
               a.blocks_cached, a.blocks_free);
      break;
    }
  }
}

static int32_t ft_interesting(int sel, int32_t old, const ft_ctx *t, int bs) {
  switch (sel % 14) {
    case 0: return 0;
    case 1: return 1;
    case 2: return -1;
    case 3: return 2;
    case 4: return (int32_t)((uint32_t)old + 1u);
    case 5: return (int32_t)((uint32_t)old - 1u);
    case 6: return INT_MAX;
    case 7: return INT_MIN;
    case 8: return bs;
    case 9: return bs + 1;
    case 10: return 8;
    case 11: return (int32_t)t->rsize;
    case 12: return KVA_INT4 + 1;
    default: return 3;
  }
}

/* Apply the 4-byte edits of m[0..nm) to the records R[0..3) (capacity cap each) */
static void ft_edit(const ft_ctx *t, const ft_scen *s, unsigned char **R, size_t *n, size_t cap, const uint8_t *m,
                    size_t nm) {
  size_t e;
  for (e = 0; e + 4 <= nm && e < 4 * FT_MAX_EDITS; e += 4) {
    unsigned op = m[e], a = m[e + 1], b = m[e + 2], c = m[e + 3], w = a | (b << 8);
    int ri = (int)((op >> 4) % FT_NREC), o = (int)(a % FT_NREC);
    unsigned char *r = R[ri];
    size_t sz = n[ri], off;
    int32_t x;
    switch (op & 15) {
      case 0: /* a byte anywhere */
        if (sz) r[w % sz] ^= (unsigned char)(c ? c : 1);
        break;
      case 1: /* a byte of what the checks read (header, types, scales, token ids) */
        if (sz) r[w % (sz < t->rows_off ? sz : t->rows_off)] ^= (unsigned char)(c ? c : 1);
        break;
      case 2: { /* version, byte order, a shape field or the reserved word */
        static const int fields[10] = {8, 12, 96, 100, 104, 108, 112, 116, 120, 124};
        off = (size_t)fields[a % 10];
        if (off + 4 > sz) break;
        memcpy(&x, r + off, 4);
        x = ft_interesting((int)c, x, t, s->bs);
        memcpy(r + off, &x, 4);
        break;
      }
      case 3: { /* the size field */
        uint64_t u = 0;
        if (sz < 24) break;
        switch (c % 8) {
          case 0: u = sz + 1; break;
          case 1: u = sz - 1; break;
          case 2: u = 0; break;
          case 3: u = t->rsize; break;
          case 4: u = UINT64_MAX; break;
          case 5: u = 2 * (uint64_t)t->rsize; break;
          case 6: u = ((uint64_t)1 << 32) | sz; break;
          default: u = sz; break;
        }
        memcpy(r + 16, &u, 8);
        break;
      }
      case 4: { /* a layer's storage type or one FP8 scale */
        int l = (int)(a % (unsigned)s->L), item = (int)(b % (unsigned)(2 + 2 * s->G));
        off = FT_HDR + (size_t)l * (8 + 8 * (size_t)s->G) + 4 * (size_t)item;
        if (off + 4 > sz) break;
        if (item < 2) {
          x = (int32_t)(c % 10); /* every kva_dtype and two past them */
          memcpy(r + off, &x, 4);
        } else {
          static const float sp[8] = {0.0f, -0.0f, -1.0f, 1e30f, 1.0f, 0.5f, 0.375f, 0.875f};
          float f = sp[c % 8];
          if (c & 8) f = (c & 16) ? kt_u2f(0x7FC00000u) : kt_u2f(0x7F800000u);
          if (c & 32) { /* one ulp away: "bit for bit" */
            memcpy(&x, r + off, 4);
            x ^= 1;
            memcpy(r + off, &x, 4);
          } else {
            memcpy(r + off, &f, 4);
          }
        }
        break;
      }
      case 5: { /* a token id */
        off = t->tok_off + 4 * (size_t)(a % (unsigned)s->bs);
        if (off + 4 > sz) break;
        memcpy(&x, r + off, 4);
        if (c % 12 == 11) x = (int32_t)(int8_t)b;
        else if (c % 12 == 10) x = FT_EXTRA_TOKEN;
        else x = ft_interesting((int)c, x, t, s->bs);
        memcpy(r + off, &x, 4);
        break;
      }
      case 6: { /* the salt */
        uint64_t u, v = 0;
        if (sz < 96) break;
        memcpy(&u, r + 88, 8);
        if (n[o] >= 96) memcpy(&v, R[o] + 88, 8);
        switch (c % 6) {
          case 0: u = 0; break;
          case 1: u++; break;
          case 2: u = v; break;
          case 3: u = FT_OTHER_SALT; break;
          case 4: u = ~u; break;
          default: u ^= (uint64_t)1 << (b % 64); break;
        }
        memcpy(r + 88, &u, 8);
        break;
      }
      case 7: /* the parent's key, or the key: zeros, another record's, one bit off */
      case 8:
        off = (op & 15) == 7 ? 56 : 24;
        if (sz < off + 32) break;
        switch (c % 4) {
          case 0: memset(r + off, 0, 32); break;
          case 1:
            if (n[o] >= 56) memmove(r + off, R[o] + 24, 32);
            break;
          case 2:
            if (n[o] >= 88) memmove(r + off, R[o] + 56, 32);
            break;
          default: r[off + b % 32] ^= (unsigned char)(1u << (c >> 5)); break;
        }
        break;
      case 9: /* cut */
        n[ri] = (c & 1) ? w % (sz + 1) : sz - (sz < 1u + c % 16 ? sz : 1u + c % 16);
        break;
      case 10: /* grow */
        if (sz + c + 1 <= cap) {
          memset(r + sz, (int)a, c + 1u);
          n[ri] = sz + c + 1;
        }
        break;
      case 11: { /* special bit patterns in the rows: NaN, Inf, the largest finite, a subnormal */
        static const uint32_t sp[8] = {0x7FC00000u, 0x7F800000u, 0x7E007E00u, 0x7C00FC00u,
                                       0x7F7F7F7Fu, 0xFFFFFFFFu, 0x7F7FFFFFu, 0x00000001u};
        if (sz < t->rows_off + 4) break;
        off = t->rows_off + (2 * (size_t)w) % (sz - t->rows_off - 3);
        memcpy(r + off, &sp[c % 8], 4);
        break;
      }
      case 12: /* a copy of another record */
        if (o != ri) memcpy(r, R[o], n[o]), n[ri] = n[o];
        break;
      case 13: /* a raw byte */
        if (sz) r[w % sz] = (unsigned char)c;
        break;
      case 14: /* two records change places (load order, chain order) */
        if (o != ri) {
          unsigned char *p = R[o];
          size_t q = n[o];
          R[o] = R[ri], n[o] = n[ri];
          R[ri] = p, n[ri] = q;
        }
        break;
      default: /* 4 bytes copied within the record */
        if (sz >= 8) memmove(r + 4 * ((b | (c << 8)) % (sz / 4)), r + 4 * (a % (sz / 4)), 4);
        break;
    }
  }
}

/* data[0]: bit 7 set (this mode); bits 0-1 the scenario; bits 2-4 the pool
   (2..9 blocks); bit 5 a live sequence; bit 6 a cached block of another salt.
   data[1]: bit 0 re-key (each record's key from its parent key, salt and
   token ids); bit 1 leave the checksum; bit 2 leave the size field; bit 3
   the rest of the input is record 0 itself; bits 4-6 fetch's behaviour
   (ft_store.behave); bit 7 block selection in the final attention.
   data[2]: bit 0 load the valid root first; bits 1-2 the load order; bit 3
   the lookups use the original token ids and salt (not the records'); bit 4
   re-chain (each record's parent key is the key of the one before it).
   The rest: 4-byte edits (ft_edit). */
static void ft_run(const uint8_t *data, size_t size) {
  static const int perms[4][FT_NREC] = {{0, 1, 2}, {2, 1, 0}, {1, 2, 0}, {2, 0, 1}};
  const int si = data[0] & 3;
  const ft_scen *s = &ft_scens[si];
  ft_ctx *t = ft_ctx_get(si);
  const int bs = s->bs, n_blocks = 2 + ((data[0] >> 2) & 7);
  const int live = (data[0] >> 5) & 1, other = (data[0] >> 6) & 1, preload = data[2] & 1;
  const int *perm = perms[(data[2] >> 1) & 3];
  unsigned char *R[FT_NREC];
  size_t n[FT_NREC], cap = t->rsize + 256;
  int32_t tok[FT_NREC * FT_MAXBS + 1];
  uint64_t salt = FT_SALT;
  ft_store st;
  ft_route r;
  kva_cache_desc d;
  kt_rng rng;
  int i, pass, done[FT_NREC] = {0, 0, 0}, route, deepest, depth;
  kva_status cs;
  for (i = 0; i < FT_NREC; i++) {
    R[i] = (unsigned char *)malloc(cap);
    FI_CHECK(R[i] != NULL, "out of memory");
    memcpy(R[i], t->valid[i], t->rsize);
    n[i] = t->rsize;
  }
  if (data[1] & 8) {
    n[0] = size - 3 < cap ? size - 3 : cap;
    memcpy(R[0], data + 3, n[0]);
  } else {
    ft_edit(t, s, R, n, cap, data + 3, size - 3);
  }
  for (i = 0; i < FT_NREC; i++) { /* re-sealing: what a forger (or a careless writer) gets right */
    uint64_t u = n[i];
    if (n[i] >= t->rows_off) {
      if ((data[2] & 16) && i > 0 && n[i - 1] >= 56) memcpy(R[i] + 56, R[i - 1] + 24, 32);
      if (data[1] & 1) {
        int32_t rt[FT_MAXBS];
        memcpy(rt, R[i] + t->tok_off, 4 * (size_t)bs);
        memcpy(&u, R[i] + 88, 8);
        kva_prefix_key(memcmp(R[i] + 56, ft_zero, 32) != 0 ? R[i] + 56 : NULL, u, rt, bs, R[i] + 24);
        u = n[i];
      }
    }
    if (!(data[1] & 4) && n[i] >= 24) memcpy(R[i] + 16, &u, 8);
    if (!(data[1] & 2) && n[i] >= 8) {
      u = kva__stream_checksum(R[i], n[i] - 8);
      memcpy(R[i] + n[i] - 8, &u, 8);
    }
  }
  /* the lookups: the records' own token ids and salt, or the original ones */
  memcpy(tok, t->tok, sizeof(int32_t) * (size_t)(FT_NREC * bs + 1));
  tok[FT_NREC * bs] = FT_EXTRA_TOKEN;
  if (!(data[2] & 8)) {
    for (i = 0; i < FT_NREC; i++)
      if (n[i] >= t->rows_off) memcpy(tok + i * bs, R[i] + t->tok_off, 4 * (size_t)bs);
    if (n[0] >= 96) memcpy(&salt, R[0] + 88, 8);
  }
  for (route = 0; route < 2; route++) {
    kva_cache *c = NULL;
    memset(&st, 0, sizeof st);
    memset(&r, 0, sizeof r);
    st.cap = t->rsize;
    st.seen = (unsigned char *)malloc(t->rsize);
    FI_CHECK(st.seen != NULL, "out of memory");
    ft_desc(s, &d, n_blocks, &st);
    cs = kva_cache_create(&d, &c);
    FI_CHECK(cs == KVA_OK, "tier cache: %s", kva_status_str(cs));
    FI_CHECK(kva_prefix_record_size(c) == t->rsize, "record size differs between caches of one description");
    r.s = s, r.t = t, r.c = c, r.st = &st, r.exact = 1, r.select = data[1] >> 7;
    kt_seed(&rng, 77u + (uint64_t)route);
    ft_setup(&r, live, other, preload, &rng);
    if (route == 0) { /* kva_prefix_load: passes until one takes nothing in, as a loader over a store would */
      for (pass = 0; pass < FT_NREC; pass++) {
        int took = 0, k, o;
        for (k = 0; k < FT_NREC; k++) {
          i = perm[k];
          if (done[i]) continue;
          o = ft_load(&r, R[i], n[i]);
          took |= o == KVA_PREFIX_LOADED;
          done[i] = o != KVA_PREFIX_NO_PARENT;
        }
        if (!took) break;
      }
      /* attention over the deepest chain taken in */
      deepest = -1, depth = 0;
      for (i = 0; i < r.nm; i++) {
        int32_t ct[(FT_MMAX + 1) * FT_MAXBS + 1];
        int same, nb = ft_chain(&r, i, ct, &same);
        if (nb > depth) depth = nb, deepest = i;
      }
      if (deepest >= 0) {
        int32_t ct[(FT_MMAX + 1) * FT_MAXBS + 1];
        int same;
        depth = ft_chain(&r, deepest, ct, &same);
        ct[depth * bs] = FT_EXTRA_TOKEN;
        ft_attend(&r, ct, depth, r.m[deepest].salt);
      }
    } else { /* fetch: the records filed under their key field */
      for (i = 0; i < FT_NREC; i++) {
        st.ent[i].rec = R[i], st.ent[i].n = n[i];
        memset(st.ent[i].key, 0, 32);
        if (n[i] > 24) memcpy(st.ent[i].key, R[i] + 24, n[i] >= 56 ? 32 : n[i] - 24);
      }
      st.n_ent = FT_NREC;
      st.behave = (data[1] >> 4) & 7;
      ft_fetch_route(&r, tok, salt);
      ft_attend(&r, tok, FT_NREC, salt);
    }
    kva_cache_destroy(c);
    for (i = 0; i < r.nm; i++) free(r.m[i].bytes);
    free(st.seen);
  }
  for (i = 0; i < FT_NREC; i++) free(R[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const fi_scen *s;
  fi_target ts, tt, to;
  kva_cache *S = NULL, *T = NULL, *O = NULL;
  unsigned char *valid = NULL, *buf = NULL;
  const unsigned char *in;
  size_t n_valid = 0, n, cap;
  int seq, mode, exact;
  if (size < 3) return 0;
  if (data[0] & 0x80) { /* the prefix tier's records */
    ft_run(data, size);
    return 0;
  }
  s = &fi_scens[data[0] % 6];
  mode = data[1] & 3; /* 0: raw; 1: mutations, re-sealed; 2: mutations, the size field kept; 3: not re-sealed */
  /* the source cache */
  ts.bs = s->bs, ts.nb = 40, ts.max_seqs = 4, ts.support = s->support, ts.head_dim_delta = 0;
  S = fi_create(s, &ts);
  FI_CHECK(S != NULL, "scenario %d: the source cache", data[0] % 6);
  seq = fi_build(S, s);
  valid = fi_export(S, seq, &n_valid);
  /* the target: data[2] and data[1]'s high bits */
  tt.bs = 1 + data[2] % 8;
  tt.nb = 1 + (data[2] >> 3) % 12;
  tt.max_seqs = 1 + (data[1] >> 5) % 3;
  tt.support = (data[1] >> 2) % 3;
  tt.head_dim_delta = 0;
  if (tt.support < s->support && (data[1] & 16)) tt.support = s->support; /* often one that can hold it */
  T = fi_create(s, &tt);
  FI_CHECK(T != NULL, "the target cache");
  if (data[2] & 0x80) { /* cached prefix blocks: recyclable, or the keys the stream publishes */
    fi_data x;
    int32_t tok[16];
    int t, k;
    kt_seed(&x.rng, 5);
    for (k = 0; k < 16; k++) tok[k] = 7 * k + 1;
    if (kva_seq_new(T, &t) == KVA_OK) {
      if (kva_seq_append(T, t, tt.bs) == KVA_OK) {
        fi_store_attend(T, s, t, tt.bs, (1u << s->L) - 1u, 0, &x);
        FI_CHECK(kva_seq_publish(T, t, tok, tt.bs, 9) == KVA_OK, "target publish");
      }
      kva_seq_free(T, t);
    }
  }
  if (data[2] & 0x40) { /* a live sequence (with max_seqs 1: the limit) */
    int t;
    if (kva_seq_new(T, &t) == KVA_OK) kva_seq_append(T, t, 1);
  }
  to = ts;
  to.head_dim_delta = 1;
  O = fi_create(s, &to);
  FI_CHECK(O != NULL, "the other cache");

  in = data + 3;
  n = size - 3;
  if (mode == 0) {
    buf = (unsigned char *)malloc(n ? n : 1);
    FI_CHECK(buf != NULL, "out of memory");
    memcpy(buf, in, n);
    exact = n == n_valid && memcmp(buf, valid, n) == 0;
  } else {
    cap = n_valid + 4 * 256;
    buf = (unsigned char *)malloc(cap);
    FI_CHECK(buf != NULL, "out of memory");
    memcpy(buf, valid, n_valid);
    n = fi_mutate(buf, n_valid, cap, in, n, valid);
    if (mode != 3 && n >= 24) {
      uint64_t z = (uint64_t)n, h;
      if (mode == 1) memcpy(buf + FI_OFF_SIZE, &z, 8);
      if (n >= 8) {
        h = kva__stream_checksum(buf, n - 8);
        memcpy(buf + n - 8, &h, 8);
      }
    }
    exact = n == n_valid && memcmp(buf, valid, n) == 0;
  }
  fi_import(S, s, ts.bs, ts.support, s->D, buf, n, S, seq, exact);
  fi_import(T, s, tt.bs, tt.support, s->D, buf, n, S, seq, exact);
  fi_import(O, s, to.bs, to.support, s->D + 1, buf, n, NULL, -1, 0);
  free(buf);
  free(valid);
  kva_cache_destroy(S);
  kva_cache_destroy(T);
  kva_cache_destroy(O);
  return 0;
}
