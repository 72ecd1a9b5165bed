/* fuzz_import.c - libFuzzer harness for kva_seq_import.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. -Itests \
 *         tests/fuzz_import.c -o build/fuzz_import -lm
 *   ./build/fuzz_import -max_total_time=60      (or: make fuzz)
 *
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
