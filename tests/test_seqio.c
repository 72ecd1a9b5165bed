/* test_seqio.c - sequence streams: kva_seq_export / kva_seq_import.
 *
 * The reference here is a twin: a second cache built from the same
 * description that runs the same operations on the same data and never
 * moves.  A moved sequence must behave exactly like it (compared with
 * memcmp): the same length, position, kva_seq_read of every slot and layer
 * (K, V, per-head positions), the same attention outputs and lse, the same
 * evictions later (H2O scores travel in the stream: a lost score changes
 * which token goes).
 *
 *  - round trips over random shapes: KV and LATENT, 1-3 layers, every
 *    storage type for K and V, per-layer types, FP8 with tensor, per-layer
 *    and per-head scales, evict_support ALL/WINDOW/NONE; a random history
 *    (chunked stores, attention, WINDOW/H2O eviction with and without
 *    rollback, a policy change pending at export, forks sharing blocks,
 *    truncation, kva_seq_accept, publication, sequences started from the
 *    prefix cache, a step left half stored); the sequence is exported and
 *    imported back into the same cache after kva_seq_free, or into another
 *    cache of the same shape with another block size, pool size, max_seqs
 *    and evict_support; then subject and twin continue (the step's remaining
 *    stores, attention, appends with later evictions, policy changes).  A
 *    re-export equals the original stream byte for byte (modulo the writer's
 *    block-size field on another block size); the twin's export equals the
 *    subject's; export never changes the cache.
 *  - directed: WINDOW / H2O (rollback, pending policy) sequences with evicted
 *    tokens moved mid-history; a step stored in layer 0 only (and a chunk of
 *    it) finished after the move; prefix-cache sequences (kva_seq_publish,
 *    kva_seq_new_prefix) imported into fresh caches of the same and other
 *    block sizes publish their blocks under the same salt and tokens.
 *  - errors change nothing (kva_cache_get_stats field by field, the set of
 *    live ids, *seq untouched, the next id kva_seq_new hands out): every
 *    truncation and every single-byte flip of small streams, a dense sample
 *    of a large one -> KVA_ERR_STREAM; re-sealed streams
 *    (kva__stream_checksum) of another version or byte order, and a stream
 *    written in the other byte order -> KVA_ERR_UNSUPPORTED; caches of
 *    another shape, storage type or FP8 scale, too weak evict_support ->
 *    KVA_ERR_UNSUPPORTED; a full pool or max_seq_len -> KVA_ERR_FULL (then
 *    success after freeing / with cached blocks recycled); max_seqs ->
 *    KVA_ERR_SEQ_LIMIT; NULL arguments, a small cap (*size = needed) ->
 *    KVA_ERR_ARG; unknown ids -> KVA_ERR_SEQ.
 *
 * The stream fields the tests touch are those docs/API.md states: [8,12)
 * version, [12,16) byte-order mark, [16,24) size, the last 8 bytes the
 * checksum; and, from the documented header, the writer's block size at
 * [44,48) and the prefix token count at [108,112). */
#include <limits.h>

#include "kvattn.h"
#include "harness.h"

#define SQ_MAXL 3
#define SQ_MAXG 3
#define SQ_MAXD 9
#define SQ_MAXH (3 * SQ_MAXG)
#define SQ_MAXN 10   /* tokens of one step */
#define SQ_MAXTOK 72 /* tokens a sequence holds at most in these tests */

#define SQ_OFF_VERSION 8
#define SQ_OFF_ORDER 12
#define SQ_OFF_SIZE 16
#define SQ_OFF_BS 44
#define SQ_OFF_NPREFIX 108

/* ------------------------------------------------------------------------ */
/* Shapes                                                                   */

typedef struct {
  int kind, L, G, H, D, Dv, v_dim_desc; /* Dv resolved */
  int bs, nb, max_seqs, max_seq_len, evict_support, prefix_max_age;
  int per_layer;
  kva_dtype dtype, v_dtype, ldt[SQ_MAXL];
  int scale_mode; /* 0: k_scale/v_scale, 1: per layer, 2: per layer and head */
  float k_scale, v_scale, lk[SQ_MAXL], lv[SQ_MAXL], hk[SQ_MAXL * SQ_MAXG], hv[SQ_MAXL * SQ_MAXG];
  int window, n_sink; /* attention options */
  float softcap;
} sq_shape;

static void sq_desc(const sq_shape *s, kva_cache_desc *d) {
  memset(d, 0, sizeof *d);
  d->kind = s->kind;
  d->n_layers = s->L;
  d->n_kv_heads = s->G;
  d->head_dim = s->D;
  d->v_dim = s->v_dim_desc;
  d->block_size = s->bs;
  d->n_blocks = s->nb;
  d->dtype = s->dtype;
  d->v_dtype = s->v_dtype;
  d->layer_dtype = s->per_layer ? s->ldt : NULL;
  d->k_scale = s->k_scale;
  d->v_scale = s->v_scale;
  if (s->scale_mode == 1) d->layer_k_scale = s->lk, d->layer_v_scale = s->lv;
  if (s->scale_mode == 2) d->head_k_scale = s->hk, d->head_v_scale = s->hv;
  d->max_seqs = s->max_seqs;
  d->max_seq_len = s->max_seq_len;
  d->evict_support = s->evict_support;
  d->prefix_max_age = s->prefix_max_age;
}

static kva_cache *sq_create(const sq_shape *s) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_status st;
  sq_desc(s, &d);
  st = kva_cache_create(&d, &c);
  KT_CHECK(st == KVA_OK, "kva_cache_create: %s (kind %d L %d G %d D %d v_dim %d bs %d nb %d types %d/%d per layer %d "
           "[%d %d %d] scales %d %g %g; seqs %d len %d support %d age %d)", kva_status_str(st), s->kind, s->L, s->G, s->D, s->v_dim_desc, s->bs, s->nb,
           (int)s->dtype, (int)s->v_dtype, s->per_layer, (int)s->ldt[0], (int)s->ldt[1], (int)s->ldt[2],
           s->scale_mode, (double)s->k_scale, (double)s->v_scale, s->max_seqs, s->max_seq_len, s->evict_support, s->prefix_max_age);
  return st == KVA_OK ? c : NULL;
}

static void sq_attn(const sq_shape *s, kva_attn *a) {
  memset(a, 0, sizeof *a);
  a->n_heads = s->H;
  a->n_kv_heads = s->G;
  a->head_dim = s->D;
  a->v_dim = s->Dv;
  a->window = s->window;
  a->n_sink = s->n_sink;
  a->softcap = s->softcap;
  a->n_threads = 1;
}

static void sq_small_shape(sq_shape *s, int kind, int L, int G, int H, int D, int Dv, int bs, int nb, kva_dtype t) {
  int i;
  memset(s, 0, sizeof *s);
  s->kind = kind;
  s->L = L, s->G = G, s->H = H, s->D = D, s->Dv = Dv, s->v_dim_desc = Dv;
  s->bs = bs, s->nb = nb, s->max_seqs = 8;
  s->dtype = s->v_dtype = t;
  s->k_scale = 0.5f, s->v_scale = 0.25f;
  for (i = 0; i < SQ_MAXL; i++) s->ldt[i] = t, s->lk[i] = 0.5f, s->lv[i] = 0.25f;
  for (i = 0; i < SQ_MAXL * SQ_MAXG; i++) s->hk[i] = 0.5f, s->hv[i] = 0.25f;
}

static const kva_dtype sq_types[7] = {KVA_DTYPE_DEFAULT, KVA_F32,      KVA_F16,     KVA_BF16,
                                      KVA_INT8,          KVA_FP8_E4M3, KVA_FP8_E5M2};

static void sq_random_shape(kt_rng *r, sq_shape *s) {
  static const int supports[4] = {KVA_EVICT_SUPPORT_ALL, KVA_EVICT_SUPPORT_ALL, KVA_EVICT_SUPPORT_WINDOW,
                                  KVA_EVICT_SUPPORT_NONE};
  int i;
  memset(s, 0, sizeof *s);
  s->kind = kt_int(r, 0, 9) < 7 ? KVA_CACHE_KV : KVA_CACHE_LATENT;
  s->L = kt_int(r, 1, SQ_MAXL);
  s->G = kt_int(r, 1, s->kind == KVA_CACHE_KV ? SQ_MAXG : 2);
  s->H = s->G * kt_int(r, 1, 3);
  s->D = kt_int(r, 1, SQ_MAXD);
  s->v_dim_desc = s->kind == KVA_CACHE_KV ? kt_int(r, 0, SQ_MAXD) : kt_int(r, 0, s->D);
  s->Dv = s->v_dim_desc ? s->v_dim_desc : s->D;
  s->per_layer = kt_int(r, 0, 2) == 0;
  s->dtype = sq_types[kt_int(r, 0, 6)];
  s->v_dtype = sq_types[kt_int(r, 0, 6)];
  for (i = 0; i < SQ_MAXL; i++) s->ldt[i] = sq_types[kt_int(r, 0, 6)];
  s->scale_mode = kt_int(r, 0, 2);
  s->k_scale = kt_uniform(r, 0.01f, 0.5f);
  s->v_scale = kt_uniform(r, 0.01f, 0.5f);
  for (i = 0; i < SQ_MAXL; i++) s->lk[i] = kt_uniform(r, 0.01f, 0.5f), s->lv[i] = kt_uniform(r, 0.01f, 0.5f);
  for (i = 0; i < SQ_MAXL * SQ_MAXG; i++) s->hk[i] = kt_uniform(r, 0.01f, 0.5f), s->hv[i] = kt_uniform(r, 0.01f, 0.5f);
  s->bs = kt_int(r, 1, 8);
  s->max_seqs = kt_int(r, 6, 9);
  s->nb = 4 * ((SQ_MAXTOK + s->bs - 1) / s->bs) + 8;
  s->evict_support = supports[kt_int(r, 0, 3)];
  s->prefix_max_age = kt_int(r, 0, 3) == 0 ? kt_int(r, 1, 6) : 0;
  s->window = kt_int(r, 0, 3) == 0 ? kt_int(r, 2, 12) : 0;
  s->n_sink = s->window ? kt_int(r, 0, 2) : 0;
  s->softcap = kt_int(r, 0, 4) == 0 ? 4.0f : 0.0f;
}

/* ------------------------------------------------------------------------ */
/* Observing a cache                                                        */

static int sq_stats_sane(const kva_cache_stats *s) {
  return s->blocks_used + s->blocks_cached + s->blocks_free == s->n_blocks && s->blocks_used >= 0 &&
         s->blocks_cached >= 0 && s->blocks_free >= 0;
}

/* Which of the ids 0 .. 4 * max_seqs - 1 are live (ids are gen * max_seqs +
   record; the tests free few enough that the generations stay below 4). */
#define SQ_IDS 64
static void sq_live_ids(const kva_cache *c, int max_seqs, char *live) {
  int i, n = 4 * max_seqs < SQ_IDS ? 4 * max_seqs : SQ_IDS;
  memset(live, 0, SQ_IDS);
  for (i = 0; i < n; i++) live[i] = (char)(kva_seq_len(c, i) >= 0);
}

/* A snapshot of everything a failed call must leave as it was. */
typedef struct {
  kva_cache_stats st;
  char live[SQ_IDS];
} sq_snap;

static void sq_snap_take(const kva_cache *c, int max_seqs, sq_snap *s) {
  memset(s, 0, sizeof *s);
  kva_cache_get_stats(c, &s->st);
  sq_live_ids(c, max_seqs, s->live);
}

static int sq_snap_same(const kva_cache *c, int max_seqs, const sq_snap *s) {
  sq_snap now;
  sq_snap_take(c, max_seqs, &now);
  return kt_stats_equal(&now.st, &s->st, 0) && memcmp(now.live, s->live, SQ_IDS) == 0;
}

/* Import that must fail with `want` and change nothing. */
static void sq_import_fails(kva_cache *c, int max_seqs, const void *buf, size_t size, kva_status want,
                            const char *what, long detail) {
  sq_snap before;
  int id = -77;
  kva_status st;
  sq_snap_take(c, max_seqs, &before);
  st = kva_seq_import(c, buf, size, &id);
  KT_CHECK(st == want, "%s (%ld): kva_seq_import returned %s, expected %s", what, detail, kva_status_str(st),
           kva_status_str(want));
  KT_CHECK(id == -77, "%s (%ld): a failed import wrote *seq = %d", what, detail, id);
  KT_CHECK(sq_snap_same(c, max_seqs, &before), "%s (%ld): a failed import changed the cache", what, detail);
  if (st == KVA_OK && id != -77) kva_seq_free(c, id);
}

/* The whole visible state of two sequences: len, pos, every slot of every
   layer (K, V, per-head positions) bit for bit. */
static int sq_same_state(const sq_shape *s, kva_cache *ca, int a, kva_cache *cb, int b, const char *what) {
  size_t nk = (size_t)(s->G * s->D), nv = (size_t)(s->G * s->Dv);
  float *ka = KT_ALLOC(float, nk), *kb = KT_ALLOC(float, nk), *va = KT_ALLOC(float, nv), *vb = KT_ALLOC(float, nv);
  int32_t *pa = KT_ALLOC(int32_t, s->G), *pb = KT_ALLOC(int32_t, s->G);
  int l, slot, len = kva_seq_len(ca, a), lat = s->kind == KVA_CACHE_LATENT;
  int ok = len == kva_seq_len(cb, b) && kva_seq_pos(ca, a) == kva_seq_pos(cb, b) && len >= 0;
  KT_CHECK(ok, "%s: len/pos %d/%d vs %d/%d", what, len, kva_seq_pos(ca, a), kva_seq_len(cb, b), kva_seq_pos(cb, b));
  for (l = 0; ok && l < s->L; l++)
    for (slot = 0; ok && slot < len; slot++) {
      kva_status s1 = kva_seq_read(ca, a, l, slot, ka, lat ? NULL : va, pa);
      kva_status s2 = kva_seq_read(cb, b, l, slot, kb, lat ? NULL : vb, pb);
      ok = s1 == KVA_OK && s2 == KVA_OK && memcmp(ka, kb, sizeof(float) * nk) == 0 &&
           memcmp(pa, pb, sizeof(int32_t) * (size_t)s->G) == 0 && (lat || memcmp(va, vb, sizeof(float) * nv) == 0);
      KT_CHECK(ok, "%s: layer %d slot %d of %d differs (read %d/%d, pos[0] %d vs %d)", what, l, slot, len, (int)s1,
               (int)s2, (int)pa[0], (int)pb[0]);
    }
  free(ka), free(kb), free(va), free(vb), free(pa), free(pb);
  return ok;
}

/* Export with the size query; checks that exporting changed nothing.
   Returns a malloc'ed stream (NULL on failure). */
static unsigned char *sq_export(kva_cache *c, int max_seqs, int id, size_t *size) {
  sq_snap before;
  size_t need = 0, wrote = 0;
  unsigned char *buf;
  kva_status st;
  sq_snap_take(c, max_seqs, &before);
  st = kva_seq_export(c, id, NULL, 0, &need);
  KT_CHECK(st == KVA_OK && need > 24, "export size query: %s, %lu bytes", kva_status_str(st), (unsigned long)need);
  if (st != KVA_OK) return NULL;
  buf = KT_ALLOC(unsigned char, need + 16);
  memset(buf, 0xA5, need + 16);
  st = kva_seq_export(c, id, buf, need + 16, &wrote);
  KT_CHECK(st == KVA_OK && wrote == need, "export: %s, wrote %lu of %lu", kva_status_str(st), (unsigned long)wrote,
           (unsigned long)need);
  KT_CHECK(buf[need] == 0xA5 && buf[need + 15] == 0xA5, "export wrote past its size");
  KT_CHECK(sq_snap_same(c, max_seqs, &before), "kva_seq_export changed the cache");
  if (st != KVA_OK) {
    free(buf);
    return NULL;
  }
  *size = need;
  return buf;
}

static uint32_t sq_get_u32(const unsigned char *p, size_t off) {
  uint32_t x;
  memcpy(&x, p + off, 4);
  return x;
}
static void sq_put_u32(unsigned char *p, size_t off, uint32_t x) { memcpy(p + off, &x, 4); }
static void sq_reseal(unsigned char *p, size_t size) {
  uint64_t h = kva__stream_checksum(p, size - 8);
  memcpy(p + size - 8, &h, 8);
}

/* Bytes where two streams differ, ignoring the writer's block size and the
   checksum (which covers it) when ignore_bs; -1 if the sizes differ. */
static long sq_stream_diff(const unsigned char *a, size_t na, const unsigned char *b, size_t nb, int ignore_bs) {
  size_t i;
  long n = 0;
  if (na != nb) return -1;
  for (i = 0; i < na; i++) {
    if (ignore_bs && ((i >= SQ_OFF_BS && i < SQ_OFF_BS + 4) || i >= na - 8)) continue;
    n += a[i] != b[i];
  }
  return n;
}

/* ------------------------------------------------------------------------ */
/* Running the same operations on several sequences                         */

typedef struct {
  kva_cache *c;
  int id;
} sq_seq;

/* Scratch and data of one test. */
typedef struct {
  const sq_shape *s;
  kva_attn a;
  kt_rng *r;
  float *k, *v, *q;     /* [SQ_MAXN][G][D], [SQ_MAXN][G][Dv], [SQ_MAXN][H][D] */
  float *out[3], *lse[3];
  long n_attend, n_cmp_fail;
} sq_ctx;

static void sq_ctx_init(sq_ctx *x, const sq_shape *s, kt_rng *r) {
  int i;
  memset(x, 0, sizeof *x);
  x->s = s;
  x->r = r;
  sq_attn(s, &x->a);
  x->k = KT_ALLOC(float, SQ_MAXN * s->G * s->D);
  x->v = KT_ALLOC(float, SQ_MAXN * s->G * s->Dv);
  x->q = KT_ALLOC(float, SQ_MAXN * s->H * s->D);
  for (i = 0; i < 3; i++) {
    x->out[i] = KT_ALLOC(float, SQ_MAXN * s->H * s->Dv);
    x->lse[i] = KT_ALLOC(float, SQ_MAXN * s->H);
  }
}

static void sq_ctx_free(sq_ctx *x) {
  int i;
  free(x->k);
  free(x->v);
  free(x->q);
  for (i = 0; i < 3; i++) free(x->out[i]), free(x->lse[i]);
}

static void sq_gen_kv(sq_ctx *x, int n) {
  kt_fill(x->r, x->k, (size_t)(n * x->s->G * x->s->D), -1.5f, 1.5f);
  kt_fill(x->r, x->v, (size_t)(n * x->s->G * x->s->Dv), -1.5f, 1.5f);
}

/* every status equal to the first's; returns it */
static kva_status sq_same_status(const kva_status *st, int nv, const char *what) {
  int i;
  for (i = 1; i < nv; i++)
    KT_CHECK(st[i] == st[0], "%s: sequence %d returned %s, sequence 0 %s", what, i, kva_status_str(st[i]),
             kva_status_str(st[0]));
  return st[0];
}

static kva_status sq_all_append(sq_seq *v, int nv, int n) {
  kva_status st[3];
  int i;
  for (i = 0; i < nv; i++) st[i] = kva_seq_append(v[i].c, v[i].id, n);
  return sq_same_status(st, nv, "append");
}

/* store tokens [off, off + n) of the step in layer l from x->k/x->v (token t of the chunk at row off + t) */
static kva_status sq_all_store_at(sq_ctx *x, sq_seq *v, int nv, int l, int off, int n) {
  kva_status st[3];
  int i;
  const float *kk = x->k + (size_t)off * (size_t)(x->s->G * x->s->D);
  const float *vv = x->s->kind == KVA_CACHE_KV ? x->v + (size_t)off * (size_t)(x->s->G * x->s->Dv) : NULL;
  for (i = 0; i < nv; i++) st[i] = kva_store_at(v[i].c, v[i].id, l, off, kk, vv, n);
  return sq_same_status(st, nv, "store_at");
}

/* attention of the newest n_q tokens in layer l: statuses, outputs and lse bit-identical */
static kva_status sq_all_attend(sq_ctx *x, sq_seq *v, int nv, int l, int n_q, const char *what) {
  kva_status st[3];
  int i;
  size_t no = (size_t)n_q * (size_t)(x->s->H * x->s->Dv), nl = (size_t)n_q * (size_t)x->s->H;
  kt_fill(x->r, x->q, (size_t)n_q * (size_t)(x->s->H * x->s->D), -1.5f, 1.5f);
  for (i = 0; i < nv; i++) {
    kt_fill_sentinel(x->out[i], no);
    st[i] = kva_attend_cache_lse(v[i].c, v[i].id, l, &x->a, x->q, n_q, x->out[i], x->lse[i]);
  }
  sq_same_status(st, nv, what);
  if (st[0] == KVA_OK) x->n_attend++;
  for (i = 1; i < nv; i++)
    if (st[0] == KVA_OK && st[i] == KVA_OK) {
      int same = kt_same_bits(x->out[0], x->out[i], no) && kt_same_bits(x->lse[0], x->lse[i], nl);
      KT_CHECK(same, "%s: layer %d, %d queries: attention of sequence %d differs", what, l, n_q, i);
      if (!same) x->n_cmp_fail++;
    }
  return st[0];
}

/* What a history tracks: the step, what each layer stored of it, policies. */
typedef struct {
  int last;                 /* the step's tokens */
  int from[SQ_MAXL], to[SQ_MAXL]; /* the step's stored range per layer */
  kva_evict act, next;      /* policies (act: in force; next: from the next append) */
  int children[8], n_children;
} sq_hist;

static void sq_hist_init(sq_hist *h) {
  memset(h, 0, sizeof *h);
}

static void sq_hist_step(sq_hist *h, int n) {
  int l;
  h->last = n;
  for (l = 0; l < SQ_MAXL; l++) h->from[l] = h->to[l] = 0;
}

static int sq_hist_stored(const sq_hist *h, const sq_shape *s) {
  int l;
  for (l = 0; l < s->L; l++)
    if (h->from[l] != 0 || h->to[l] != h->last) return 0;
  return 1;
}

/* A step of n tokens: append; store every layer in `mask` (in one or two
   chunks, a random split); attend each layer stored (n_q random) when attend. */
static kva_status sq_step(sq_ctx *x, sq_hist *h, sq_seq *v, int nv, int n, unsigned mask, int attend) {
  kva_status st = sq_all_append(v, nv, n);
  int l;
  if (st != KVA_OK) return st;
  h->act = h->next;
  sq_hist_step(h, n);
  sq_gen_kv(x, n);
  for (l = 0; l < x->s->L; l++) {
    int split;
    if (!(mask & (1u << l))) continue;
    split = kt_int(x->r, 0, n);
    if (kt_int(x->r, 0, 1) && split > 0 && split < n) {
      KT_STATUS(sq_all_store_at(x, v, nv, l, split, n - split), KVA_OK); /* the tail first, then the head */
      KT_STATUS(sq_all_store_at(x, v, nv, l, 0, split), KVA_OK);
    } else {
      KT_STATUS(sq_all_store_at(x, v, nv, l, 0, n), KVA_OK);
    }
    h->from[l] = 0, h->to[l] = n;
  }
  if (attend)
    for (l = 0; l < x->s->L; l++)
      if (mask & (1u << l)) KT_STATUS(sq_all_attend(x, v, nv, l, kt_int(x->r, 1, n), "step"), KVA_OK);
  return KVA_OK;
}

/* A policy this cache supports. */
static void sq_random_policy(kt_rng *r, int support, kva_evict *e) {
  int kinds = support == KVA_EVICT_SUPPORT_ALL ? 3 : support == KVA_EVICT_SUPPORT_WINDOW ? 2 : 1;
  memset(e, 0, sizeof *e);
  e->kind = kt_int(r, 0, kinds - 1);
  if (e->kind == KVA_EVICT_NONE) return;
  e->budget = kt_int(r, 3, 10);
  e->n_sink = kt_int(r, 0, 2);
  e->n_recent = e->kind == KVA_EVICT_H2O ? kt_int(r, 0, e->budget - e->n_sink < 2 ? e->budget - e->n_sink : 2) : 0;
  e->rollback = kt_int(r, 0, 1);
}

static void sq_all_set_evict(sq_hist *h, sq_seq *v, int nv, const kva_evict *e) {
  kva_status st[3];
  int i;
  for (i = 0; i < nv; i++) st[i] = kva_seq_set_evict(v[i].c, v[i].id, e);
  KT_CHECK(sq_same_status(st, nv, "set_evict") == KVA_OK, "set_evict {%d, %d, %d, %d, %d}: %s", e->kind, e->budget,
           e->n_sink, e->n_recent, e->rollback, kva_status_str(st[0]));
  if (st[0] != KVA_OK) return;
  h->next = *e;
}

/* the weakest evict_support that can hold the sequence */
static int sq_needed_support(const sq_hist *h, int len, int pos) {
  if (h->act.kind == KVA_EVICT_H2O || h->next.kind == KVA_EVICT_H2O) return KVA_EVICT_SUPPORT_ALL;
  if (h->act.kind == KVA_EVICT_WINDOW || h->next.kind == KVA_EVICT_WINDOW || len != pos)
    return KVA_EVICT_SUPPORT_WINDOW;
  return KVA_EVICT_SUPPORT_NONE;
}

/* Finish the step where the history left it: the missing chunks of every
   layer (around the stored range), then attention on every layer. */
static void sq_finish_step(sq_ctx *x, sq_hist *h, sq_seq *v, int nv, const char *what) {
  int l;
  if (h->last == 0) return;
  sq_gen_kv(x, h->last);
  for (l = 0; l < x->s->L; l++) {
    if (h->to[l] <= h->from[l]) {
      KT_STATUS(sq_all_store_at(x, v, nv, l, 0, h->last), KVA_OK);
    } else {
      if (h->from[l] > 0) KT_STATUS(sq_all_store_at(x, v, nv, l, 0, h->from[l]), KVA_OK);
      if (h->to[l] < h->last) KT_STATUS(sq_all_store_at(x, v, nv, l, h->to[l], h->last - h->to[l]), KVA_OK);
    }
    h->from[l] = 0, h->to[l] = h->last;
  }
  for (l = 0; l < x->s->L; l++) KT_STATUS(sq_all_attend(x, v, nv, l, kt_int(x->r, 1, h->last), what), KVA_OK);
}

/* ------------------------------------------------------------------------ */
/* Random round trips                                                       */

typedef struct {
  long moves, same_cache, other_bs, evicted, h2o, midstep, prefix, latent, per_layer, fp8_head, weak, forks, accepts;
  long int8, fp8, steps_after, reexport, reexport_bs, not_stored;
} sq_cov;

static void sq_round_trip_one(uint64_t seed, sq_cov *cov) {
  kt_rng rng;
  sq_shape sh, sht;
  sq_ctx x;
  sq_hist h;
  kva_cache *A = NULL, *T = NULL, *C = NULL, *dst;
  sq_seq v[2], w[2];
  int32_t tok[SQ_MAXTOK];
  unsigned char *buf = NULL, *buf_t = NULL, *re = NULL;
  size_t size = 0, size_t_ = 0, size_re = 0;
  int i, n_ops, op, mode, id = -1, len, pos, l, need, n_prefix;
  kva_status st;
  char what[96];

  kt_seed(&rng, seed);
  memset(v, 0, sizeof v);
  memset(w, 0, sizeof w);
  v[0].id = v[1].id = -1;
  sq_random_shape(&rng, &sh);
  sq_ctx_init(&x, &sh, &rng);
  sq_hist_init(&h);
  for (i = 0; i < SQ_MAXTOK; i++) tok[i] = kt_int(&rng, 0, 3);
  A = sq_create(&sh);
  T = sq_create(&sh);
  if (!A || !T) goto done;
  v[0].c = A, v[1].c = T;

  /* the subject: a new sequence, or one started from the prefix cache */
  if (kt_int(&rng, 0, 3) == 0) {
    int donor[2] = {-1, -1}, reused[2] = {-1, -2}, n = kt_int(&rng, sh.bs + 1, 3 * sh.bs + 2);
    if (n > SQ_MAXN) n = SQ_MAXN;
    KT_STATUS(kva_seq_new(A, &donor[0]), KVA_OK);
    KT_STATUS(kva_seq_new(T, &donor[1]), KVA_OK);
    w[0].c = A, w[0].id = donor[0], w[1].c = T, w[1].id = donor[1];
    {
      sq_hist hd;
      sq_hist_init(&hd);
      KT_STATUS(sq_step(&x, &hd, w, 2, n, (1u << sh.L) - 1, 1), KVA_OK);
    }
    KT_STATUS(kva_seq_publish(A, donor[0], tok, n, 7), KVA_OK);
    KT_STATUS(kva_seq_publish(T, donor[1], tok, n, 7), KVA_OK);
    KT_STATUS(kva_seq_new_prefix(A, tok, n, 7, &v[0].id, &reused[0]), KVA_OK);
    KT_STATUS(kva_seq_new_prefix(T, tok, n, 7, &v[1].id, &reused[1]), KVA_OK);
    KT_CHECK(reused[0] == reused[1] && reused[0] > 0, "prefix reuse %d / %d", reused[0], reused[1]);
    h.children[h.n_children++] = donor[0]; /* the same ids in both caches */
  } else {
    KT_STATUS(kva_seq_new(A, &v[0].id), KVA_OK);
    KT_STATUS(kva_seq_new(T, &v[1].id), KVA_OK);
  }
  KT_CHECK(v[0].id == v[1].id, "twin ids differ");
  if (kt_int(&rng, 0, 2) > 0) {
    kva_evict e;
    sq_random_policy(&rng, sh.evict_support, &e);
    sq_all_set_evict(&h, v, 2, &e);
  }

  n_ops = kt_int(&rng, 2, 9);
  for (i = 0; i < n_ops; i++) {
    len = kva_seq_len(A, v[0].id);
    pos = kva_seq_pos(A, v[0].id);
    op = kt_int(&rng, 0, 19);
    if (op < 10 || len == 0) { /* a step; now and then some layer never stores it */
      int n = i == 0 ? kt_int(&rng, 1, SQ_MAXN - 1) : kt_int(&rng, 1, 4);
      unsigned mask = (1u << sh.L) - 1;
      if (len + n > SQ_MAXTOK - 24) continue;
      if (kt_int(&rng, 0, 7) == 0) mask &= ~(1u << kt_int(&rng, 0, sh.L - 1));
      KT_STATUS(sq_step(&x, &h, v, 2, n, mask, 1), KVA_OK);
    } else if (op < 12) {
      kva_evict e;
      sq_random_policy(&rng, sh.evict_support, &e);
      sq_all_set_evict(&h, v, 2, &e);
    } else if (op < 14) { /* a fork keeps the subject's blocks shared */
      int kid[2] = {-1, -2};
      kva_status sts[2];
      if (h.n_children >= 3) continue;
      sts[0] = kva_seq_fork(A, v[0].id, &kid[0]);
      sts[1] = kva_seq_fork(T, v[1].id, &kid[1]);
      KT_STATUS(sq_same_status(sts, 2, "fork"), KVA_OK);
      if (sts[0] != KVA_OK) continue;
      KT_CHECK(kid[0] == kid[1], "fork ids differ");
      h.children[h.n_children++] = kid[0];
      sq_hist_step(&h, 0);
      cov->forks++;
    } else if (op < 16) { /* truncate (within the newest step once tokens were evicted) */
      int lo = pos != len ? len - h.last : 0, keep = kt_int(&rng, lo, len);
      kva_status sts[2];
      sts[0] = kva_seq_truncate(A, v[0].id, keep);
      sts[1] = kva_seq_truncate(T, v[1].id, keep);
      KT_STATUS(sq_same_status(sts, 2, "truncate"), KVA_OK);
      sq_hist_step(&h, 0);
    } else if (op < 18) { /* publish (refused once tokens were evicted) */
      kva_status sts[2];
      uint64_t salt = (uint64_t)kt_int(&rng, 1, 3);
      sts[0] = kva_seq_publish(A, v[0].id, tok, len, salt);
      sts[1] = kva_seq_publish(T, v[1].id, tok, len, salt);
      sq_same_status(sts, 2, "publish");
      KT_CHECK(sts[0] == (pos != len ? KVA_ERR_UNSUPPORTED : KVA_OK) || sts[0] == KVA_ERR_NOT_STORED,
               "publish: %s", kva_status_str(sts[0]));
      if (sts[0] == KVA_OK && len > 0) sq_hist_step(&h, 0);
    } else if (h.last > 0 && sq_hist_stored(&h, &sh)) { /* accept a subset of the step */
      int32_t keep[SQ_MAXN];
      int n_new = kt_int(&rng, 1, h.last), n_keep = 0, j;
      kva_status sts[2];
      for (j = 0; j < n_new; j++)
        if (kt_int(&rng, 0, 1)) keep[n_keep++] = j;
      sts[0] = kva_seq_accept(A, v[0].id, n_new, keep, n_keep);
      sts[1] = kva_seq_accept(T, v[1].id, n_new, keep, n_keep);
      KT_STATUS(sq_same_status(sts, 2, "accept"), KVA_OK);
      sq_hist_step(&h, 0);
      cov->accepts++;
    }
  }
  /* half the time the step is left half stored: some layers, some chunks */
  if (kt_int(&rng, 0, 1) && kva_seq_len(A, v[0].id) < SQ_MAXTOK - 24) {
    int n = kt_int(&rng, 1, 5);
    if (sq_all_append(v, 2, n) == KVA_OK) {
      h.act = h.next;
      sq_hist_step(&h, n);
      sq_gen_kv(&x, n);
      for (l = 0; l < sh.L; l++) {
        int a0 = kt_int(&rng, 0, n), a1 = kt_int(&rng, a0, n);
        if (kt_int(&rng, 0, 2) == 0 || a1 == a0) continue; /* nothing stored in this layer */
        KT_STATUS(sq_all_store_at(&x, v, 2, l, a0, a1 - a0), KVA_OK);
        h.from[l] = a0, h.to[l] = a1;
      }
      if (!sq_hist_stored(&h, &sh)) cov->midstep++;
    }
  }

  /* the move */
  len = kva_seq_len(A, v[0].id);
  pos = kva_seq_pos(A, v[0].id);
  buf = sq_export(A, sh.max_seqs, v[0].id, &size);
  buf_t = sq_export(T, sh.max_seqs, v[1].id, &size_t_);
  if (!buf || !buf_t) goto done;
  KT_CHECK(size == size_t_ && memcmp(buf, buf_t, size) == 0, "the twin's stream differs from the subject's");
  n_prefix = (int)sq_get_u32(buf, SQ_OFF_NPREFIX);
  mode = kt_int(&rng, 0, 2) == 0 ? 0 : 1;
  need = sq_needed_support(&h, len, pos);
  if (mode == 0) { /* back into the same cache, after freeing it */
    KT_STATUS(kva_seq_free(A, v[0].id), KVA_OK);
    dst = A;
    sht = sh;
    cov->same_cache++;
  } else {
    sht = sh;
    do sht.bs = kt_int(&rng, 1, 9);
    while (sht.bs == sh.bs && kt_int(&rng, 0, 3) > 0);
    sht.nb = (SQ_MAXTOK + sht.bs - 1) / sht.bs + 2 + kt_int(&rng, 0, 6);
    sht.max_seqs = kt_int(&rng, 1, 5);
    sht.max_seq_len = kt_int(&rng, 0, 1) ? 0 : SQ_MAXTOK + kt_int(&rng, 0, 9);
    sht.prefix_max_age = kt_int(&rng, 0, 2);
    sht.evict_support = kt_int(&rng, 0, need); /* ALL .. the weakest that holds it */
    if (need < KVA_EVICT_SUPPORT_NONE && kt_int(&rng, 0, 1)) { /* one too weak first */
      sq_shape weak = sht;
      kva_cache *W;
      weak.evict_support = kt_int(&rng, need + 1, KVA_EVICT_SUPPORT_NONE);
      W = sq_create(&weak);
      if (W) sq_import_fails(W, weak.max_seqs, buf, size, KVA_ERR_UNSUPPORTED, "weak evict_support", weak.evict_support);
      kva_cache_destroy(W);
      cov->weak++;
    }
    C = sq_create(&sht);
    if (!C) goto done;
    dst = C;
    cov->other_bs += sht.bs != sh.bs;
  }
  {
    kva_cache_stats s0, s1;
    kva_cache_get_stats(dst, &s0);
    id = -77;
    st = kva_seq_import(dst, buf, size, &id);
    KT_CHECK(st == KVA_OK, "import (mode %d, bs %d -> %d, support %d -> %d): %s", mode, sh.bs, sht.bs,
             sh.evict_support, sht.evict_support, kva_status_str(st));
    if (st != KVA_OK) goto done;
    kva_cache_get_stats(dst, &s1);
    KT_CHECK(s1.n_seqs == s0.n_seqs + 1 && s1.tokens_held == s0.tokens_held + len && sq_stats_sane(&s1),
             "stats after import: %d seqs (was %d), %ld tokens (was %ld + %d)", s1.n_seqs, s0.n_seqs, s1.tokens_held,
             s0.tokens_held, len);
    KT_CHECK(mode == 1 || id != v[0].id, "the import reused the freed id %d", id);
  }
  cov->moves++;
  cov->evicted += len != pos;
  cov->h2o += h.act.kind == KVA_EVICT_H2O || h.next.kind == KVA_EVICT_H2O;
  cov->prefix += n_prefix > 0;
  cov->latent += sh.kind == KVA_CACHE_LATENT;
  cov->per_layer += sh.per_layer;
  for (l = 0; l < sh.L; l++) {
    kva_dtype kt = sh.per_layer ? sh.ldt[l] : sh.dtype;
    cov->int8 += kt == KVA_INT8;
    cov->fp8 += kt == KVA_FP8_E4M3 || kt == KVA_FP8_E5M2;
    cov->fp8_head += sh.scale_mode == 2 && (kt == KVA_FP8_E4M3 || kt == KVA_FP8_E5M2);
  }
  sprintf(what, "seed %llx mode %d bs %d->%d", (unsigned long long)seed, mode, sh.bs, sht.bs);
  w[0].c = dst, w[0].id = id, w[1].c = T, w[1].id = v[1].id;
  if (!sq_same_state(&sh, dst, id, T, v[1].id, what)) goto done;

  /* a re-export is the same stream (the block-size field aside) */
  re = sq_export(dst, sht.max_seqs, id, &size_re);
  if (re && (mode == 1 || n_prefix == 0) && (sht.bs == sh.bs || n_prefix == 0) &&
      sht.evict_support == sh.evict_support) { /* (the support decides which sections a stream has) */
    long d = sq_stream_diff(buf, size, re, size_re, sht.bs != sh.bs);
    cov->reexport++;
    cov->reexport_bs += sht.bs != sh.bs;
    KT_CHECK(d == 0, "%s: the re-export differs in %ld bytes (sizes %lu, %lu)", what, d, (unsigned long)size,
             (unsigned long)size_re);
    if (sht.bs != sh.bs)
      KT_CHECK(sq_get_u32(re, SQ_OFF_BS) == (uint32_t)sht.bs, "the re-export's block size is %u, not %d",
               sq_get_u32(re, SQ_OFF_BS), sht.bs);
  }

  /* continue both: the step where it was left, then more steps, evictions, policy changes */
  sq_finish_step(&x, &h, w, 2, what);
  n_ops = kt_int(&rng, 2, 6);
  for (i = 0; i < n_ops; i++) {
    int n = kt_int(&rng, 1, 4);
    if (kva_seq_len(T, v[1].id) + n > SQ_MAXTOK - 4) break;
    if (kt_int(&rng, 0, 4) == 0) {
      kva_evict e;
      sq_random_policy(&rng, sht.evict_support > sh.evict_support ? sht.evict_support : sh.evict_support, &e);
      sq_all_set_evict(&h, w, 2, &e);
    }
    KT_STATUS(sq_step(&x, &h, w, 2, n, (1u << sh.L) - 1, 1), KVA_OK);
    if (!sq_same_state(&sh, dst, id, T, v[1].id, what)) break;
    cov->steps_after++;
  }
  /* publication sees the same stored / evicted state (unstored earlier tokens: KVA_ERR_NOT_STORED) */
  {
    kva_status sts[2];
    len = kva_seq_len(T, v[1].id);
    sts[0] = kva_seq_publish(dst, id, tok, len, 11);
    sts[1] = kva_seq_publish(T, v[1].id, tok, len, 11);
    sq_same_status(sts, 2, what);
    cov->not_stored += sts[0] == KVA_ERR_NOT_STORED;
  }
done:
  free(buf);
  free(buf_t);
  free(re);
  kva_cache_destroy(A);
  kva_cache_destroy(T);
  kva_cache_destroy(C);
  sq_ctx_free(&x);
}

static void sq_round_trips(void) {
  sq_cov cov;
  int i, n = kt_iters(1500);
  kt_begin("seqio round trips");
  memset(&cov, 0, sizeof cov);
  for (i = 0; i < n; i++) sq_round_trip_one(0x5E910ULL + (uint64_t)i * 0x9E3779B97F4A7C15ULL, &cov);
  if (getenv("KVA_TEST_VERBOSE"))
    fprintf(stderr,
            "    seqio: %ld moves (%ld same cache, %ld other block size), %ld evicted, %ld H2O, %ld mid-step, "
            "%ld prefix, %ld latent, %ld per-layer, %ld INT8 / %ld FP8 / %ld per-head FP8 layers, %ld weak, %ld forks, "
            "%ld accepts, %ld steps after, %ld re-exports compared (%ld on another block size), %ld not stored\n",
            cov.moves, cov.same_cache, cov.other_bs, cov.evicted, cov.h2o, cov.midstep, cov.prefix, cov.latent,
            cov.per_layer, cov.int8, cov.fp8, cov.fp8_head, cov.weak, cov.forks, cov.accepts, cov.steps_after,
            cov.reexport, cov.reexport_bs, cov.not_stored);
  KT_CHECK(cov.moves == n && cov.same_cache > 0 && cov.other_bs > 0 && cov.evicted > 0 && cov.h2o > 0 &&
               cov.midstep > 0 && cov.prefix > 0 && cov.latent > 0 && cov.per_layer > 0 && cov.int8 > 0 &&
               cov.fp8 > 0 && cov.fp8_head > 0 && cov.weak > 0 && cov.forks > 0 && cov.accepts > 0 &&
               cov.reexport_bs > 0 && cov.not_stored > 0,
           "coverage: %ld moves of %d, %ld same cache, %ld other bs, %ld evicted, %ld h2o, %ld midstep, %ld prefix, "
           "%ld latent, %ld per-layer, %ld int8, %ld fp8, %ld fp8 per head, %ld weak, %ld forks, %ld accepts",
           cov.moves, n, cov.same_cache, cov.other_bs, cov.evicted, cov.h2o, cov.midstep, cov.prefix, cov.latent,
           cov.per_layer, cov.int8, cov.fp8, cov.fp8_head, cov.weak, cov.forks, cov.accepts);
}

/* ------------------------------------------------------------------------ */
/* Eviction: WINDOW and H2O sequences with evicted tokens                   */

static void sq_evict_case(const sq_shape *sh, const kva_evict *e1, const kva_evict *e2, int bs_dst, uint64_t seed) {
  kt_rng rng;
  sq_ctx x;
  sq_hist h;
  sq_shape sht = *sh;
  kva_cache *A, *T, *C;
  sq_seq v[2];
  unsigned char *buf = NULL;
  size_t size = 0;
  int i, id = -1, a0 = -1, moved_evicted = 0;
  char what[64];
  kt_seed(&rng, seed);
  sq_ctx_init(&x, sh, &rng);
  sq_hist_init(&h);
  memset(v, 0, sizeof v);
  v[0].id = v[1].id = -1;
  sht.bs = bs_dst;
  sht.nb = (SQ_MAXTOK + bs_dst - 1) / bs_dst + 1;
  A = sq_create(sh);
  T = sq_create(sh);
  C = sq_create(&sht);
  if (!A || !T || !C) goto done;
  sprintf(what, "evict %d/%d bs %d->%d", e1->kind, e2->kind, sh->bs, bs_dst);
  v[0].c = A, v[1].c = T;
  KT_STATUS(kva_seq_new(A, &v[0].id), KVA_OK);
  KT_STATUS(kva_seq_new(T, &v[1].id), KVA_OK);
  a0 = v[0].id;
  sq_all_set_evict(&h, v, 2, e1);
  KT_STATUS(sq_step(&x, &h, v, 2, 6, (1u << sh->L) - 1, 1), KVA_OK);
  for (i = 0; i < 14; i++) KT_STATUS(sq_step(&x, &h, v, 2, kt_int(&rng, 1, 3), (1u << sh->L) - 1, 1), KVA_OK);
  sq_all_set_evict(&h, v, 2, e2); /* pending at the export */
  moved_evicted = kva_seq_len(A, v[0].id) != kva_seq_pos(A, v[0].id);
  KT_CHECK(moved_evicted, "%s: nothing was evicted before the move (len %d pos %d)", what, kva_seq_len(A, v[0].id),
           kva_seq_pos(A, v[0].id));
  buf = sq_export(A, sh->max_seqs, v[0].id, &size);
  if (!buf) goto done;
  KT_STATUS(kva_seq_import(C, buf, size, &id), KVA_OK);
  v[0].c = C, v[0].id = id;
  if (!sq_same_state(sh, C, id, T, v[1].id, what)) goto done;
  /* later appends evict under e2 (switching to H2O zeroes the scores), then back to e1 */
  for (i = 0; i < 16; i++) {
    if (i == 9) sq_all_set_evict(&h, v, 2, e1);
    KT_STATUS(sq_step(&x, &h, v, 2, kt_int(&rng, 1, 3), (1u << sh->L) - 1, 1), KVA_OK);
    if (!sq_same_state(sh, C, id, T, v[1].id, what)) break;
  }
  /* and a second move, from the target back into A (after freeing the original) */
  free(buf);
  buf = sq_export(C, sht.max_seqs, id, &size);
  if (!buf) goto done;
  KT_STATUS(kva_seq_free(A, a0), KVA_OK);
  id = -1;
  KT_STATUS(kva_seq_import(A, buf, size, &id), KVA_OK);
  v[0].c = A, v[0].id = id;
  if (!sq_same_state(sh, A, id, T, v[1].id, what)) goto done;
  for (i = 0; i < 6; i++) {
    KT_STATUS(sq_step(&x, &h, v, 2, kt_int(&rng, 1, 3), (1u << sh->L) - 1, 1), KVA_OK);
    if (!sq_same_state(sh, A, id, T, v[1].id, what)) break;
  }
done:
  free(buf);
  kva_cache_destroy(A);
  kva_cache_destroy(T);
  kva_cache_destroy(C);
  sq_ctx_free(&x);
}

static void sq_evict(void) {
  sq_shape sh;
  kva_evict win, win_rb, h2o, h2o_rb, none;
  kt_begin("seqio eviction");
  memset(&none, 0, sizeof none);
  memset(&win, 0, sizeof win);
  win.kind = KVA_EVICT_WINDOW, win.budget = 6, win.n_sink = 1;
  win_rb = win, win_rb.rollback = 1, win_rb.budget = 5, win_rb.n_sink = 0;
  memset(&h2o, 0, sizeof h2o);
  h2o.kind = KVA_EVICT_H2O, h2o.budget = 7, h2o.n_sink = 1, h2o.n_recent = 2;
  h2o_rb = h2o, h2o_rb.rollback = 1, h2o_rb.n_recent = 1, h2o_rb.budget = 5;

  sq_small_shape(&sh, KVA_CACHE_KV, 2, 2, 4, 4, 3, 4, 40, KVA_F32);
  sq_evict_case(&sh, &h2o, &h2o, 3, 101);
  sq_evict_case(&sh, &h2o_rb, &win, 5, 102);
  sq_evict_case(&sh, &win, &h2o, 4, 103);
  sq_evict_case(&sh, &win_rb, &none, 1, 104);
  sq_small_shape(&sh, KVA_CACHE_KV, 2, 1, 3, 5, 5, 3, 40, KVA_INT8);
  sq_evict_case(&sh, &h2o, &h2o_rb, 2, 105);
  sq_small_shape(&sh, KVA_CACHE_LATENT, 1, 1, 4, 6, 4, 2, 60, KVA_FP8_E4M3);
  sh.scale_mode = 2;
  sq_evict_case(&sh, &h2o, &win, 7, 106);
  sq_small_shape(&sh, KVA_CACHE_KV, 3, 2, 2, 2, 2, 5, 40, KVA_F16);
  sh.evict_support = KVA_EVICT_SUPPORT_WINDOW;
  sq_evict_case(&sh, &win, &win_rb, 2, 107);
}

/* ------------------------------------------------------------------------ */
/* Mid-step: a step stored in layer 0 only moves, the rest is stored after   */

static void sq_midstep(void) {
  static const int kinds[2] = {KVA_CACHE_KV, KVA_CACHE_LATENT};
  int kk;
  kt_begin("seqio mid-step");
  for (kk = 0; kk < 2; kk++) {
    kt_rng rng;
    sq_shape sh, sht;
    sq_ctx x;
    sq_hist h;
    kva_cache *A, *C;
    sq_seq v[2];
    unsigned char *buf = NULL, *re = NULL;
    size_t size = 0, size_re = 0;
    int id = -1, l, n = 5;
    kva_status st[2];
    kt_seed(&rng, 77 + (uint64_t)kk);
    memset(v, 0, sizeof v);
    v[0].id = v[1].id = -1;
    sq_small_shape(&sh, kinds[kk], 3, 2, 4, 4, kk ? 3 : 5, 4, 16, KVA_BF16);
    sh.per_layer = 1;
    sh.ldt[0] = KVA_INT8, sh.ldt[1] = KVA_FP8_E5M2, sh.ldt[2] = KVA_F16;
    sh.scale_mode = 1;
    sht = sh;
    sht.bs = 3, sht.nb = 20;
    sq_ctx_init(&x, &sh, &rng);
    sq_hist_init(&h);
    A = sq_create(&sh);
    C = sq_create(&sht);
    if (!A || !C) {
      kva_cache_destroy(A);
      kva_cache_destroy(C);
      sq_ctx_free(&x);
      continue;
    }
    v[0].c = A, v[1].c = C;
    KT_STATUS(kva_seq_new(A, &v[0].id), KVA_OK);
    /* history on A alone (v[0]), then the mid-step */
    KT_STATUS(sq_step(&x, &h, v, 1, 6, 7u, 1), KVA_OK);
    KT_STATUS(sq_step(&x, &h, v, 1, 2, 7u, 1), KVA_OK);
    KT_STATUS(sq_all_append(v, 1, n), KVA_OK);
    sq_hist_step(&h, n);
    sq_gen_kv(&x, n);
    KT_STATUS(sq_all_store_at(&x, v, 1, 0, 0, n), KVA_OK); /* layer 0 whole */
    KT_STATUS(sq_all_store_at(&x, v, 1, 1, 3, 2), KVA_OK); /* layer 1: [3, 5) */
    buf = sq_export(A, sh.max_seqs, v[0].id, &size);
    if (!buf) goto next;
    KT_STATUS(kva_seq_import(C, buf, size, &id), KVA_OK);
    v[1].id = id;
    if (!sq_same_state(&sh, A, v[0].id, C, id, "mid-step")) goto next;
    re = sq_export(C, sht.max_seqs, id, &size_re);
    KT_CHECK(re && sq_stream_diff(buf, size, re, size_re, 1) == 0, "mid-step: the re-export differs");
    /* the step goes on the same in both: unstored layers refuse attention, a
       chunk away from the stored range is refused, the rest completes it */
    KT_STATUS(sq_all_attend(&x, v, 2, 1, 1, "layer 1 not complete"), KVA_ERR_NOT_STORED);
    KT_STATUS(sq_all_attend(&x, v, 2, 2, 1, "layer 2 not stored"), KVA_ERR_NOT_STORED);
    KT_STATUS(sq_all_store_at(&x, v, 2, 1, 0, 2), KVA_ERR_ARG); /* [0,2) neither touches nor overlaps [3,5) */
    KT_STATUS(sq_all_attend(&x, v, 2, 0, n, "layer 0"), KVA_OK);
    KT_STATUS(sq_all_store_at(&x, v, 2, 1, 1, 2), KVA_OK); /* [1,3) touches [3,5) */
    KT_STATUS(sq_all_store_at(&x, v, 2, 1, 0, 1), KVA_OK);
    sq_gen_kv(&x, n);
    KT_STATUS(sq_all_store_at(&x, v, 2, 2, 0, n), KVA_OK);
    for (l = 0; l < 3; l++) KT_STATUS(sq_all_attend(&x, v, 2, l, kt_int(&rng, 1, n), "after the move"), KVA_OK);
    /* the source's export did not end its step: more stores of it work on both */
    st[0] = kva_store(A, v[0].id, 2, x.k, kinds[kk] == KVA_CACHE_KV ? x.v : NULL, 2);
    st[1] = kva_store(C, id, 2, x.k, kinds[kk] == KVA_CACHE_KV ? x.v : NULL, 2);
    KT_STATUS(sq_same_status(st, 2, "store again"), KVA_OK);
    KT_STATUS(sq_all_attend(&x, v, 2, 2, n, "after storing again"), KVA_OK);
    for (l = 0; l < 3; l++) {
      h.from[l] = 0, h.to[l] = n;
    }
    for (l = 0; l < 4; l++) KT_STATUS(sq_step(&x, &h, v, 2, kt_int(&rng, 1, 4), 7u, 1), KVA_OK);
    sq_same_state(&sh, A, v[0].id, C, id, "mid-step, continued");
  next:
    free(buf);
    free(re);
    kva_cache_destroy(A);
    kva_cache_destroy(C);
    sq_ctx_free(&x);
  }
}

/* ------------------------------------------------------------------------ */
/* Prefix cache                                                              */

static void sq_prefix(void) {
  kt_rng rng;
  sq_shape sh, sht;
  sq_ctx x;
  sq_hist h;
  kva_cache *A, *F;
  sq_seq v[1];
  int32_t tok[32], tok2[32];
  unsigned char *buf_a = NULL, *buf_b = NULL;
  size_t size_a = 0, size_b = 0;
  int a = -1, b = -1, reused = -1, id = -1, id2 = -1, p, i, t;
  kva_cache_stats s0, s1;
  static const int bss[4] = {4, 2, 3, 8};
  kt_begin("seqio prefix cache");
  memset(v, 0, sizeof v);
  kt_seed(&rng, 4242);
  sq_small_shape(&sh, KVA_CACHE_KV, 2, 1, 2, 4, 4, 4, 24, KVA_F16);
  sq_ctx_init(&x, &sh, &rng);
  sq_hist_init(&h);
  for (i = 0; i < 32; i++) tok[i] = tok2[i] = 100 + i;
  tok2[5] = 9; /* the second block differs */
  A = sq_create(&sh);
  if (!A) {
    sq_ctx_free(&x);
    return;
  }
  /* a: 10 tokens, published (2 full blocks); b: from the prefix cache (8 reused) plus 5 */
  KT_STATUS(kva_seq_new(A, &a), KVA_OK);
  v[0].c = A, v[0].id = a;
  KT_STATUS(sq_step(&x, &h, v, 1, 10, 3u, 1), KVA_OK);
  KT_STATUS(kva_seq_publish(A, a, tok, 10, 42), KVA_OK);
  KT_STATUS(kva_seq_new_prefix(A, tok, 13, 42, &b, &reused), KVA_OK);
  KT_CHECK(reused == 8, "new_prefix reused %d", reused);
  v[0].id = b;
  KT_STATUS(sq_step(&x, &h, v, 1, 5, 3u, 1), KVA_OK);
  buf_a = sq_export(A, sh.max_seqs, a, &size_a);
  buf_b = sq_export(A, sh.max_seqs, b, &size_b);
  if (!buf_a || !buf_b) goto done;
  KT_CHECK(sq_get_u32(buf_a, SQ_OFF_NPREFIX) == 8 && sq_get_u32(buf_b, SQ_OFF_NPREFIX) == 8,
           "prefix tokens in the streams: %u, %u (expected 8: two full published blocks)",
           sq_get_u32(buf_a, SQ_OFF_NPREFIX), sq_get_u32(buf_b, SQ_OFF_NPREFIX));
  for (t = 0; t < 4; t++) {
    int bs = bss[t], want = 8 / bs * bs; /* whole blocks of the reader's size inside the 8 tokens */
    if (want > 12 / bs * bs) want = 12 / bs * bs; /* new_prefix reuses at most n - 1 = 12 */
    sht = sh;
    sht.bs = bs, sht.nb = 32 / bs + 4;
    for (p = 0; p < 2; p++) {
      const unsigned char *buf = p ? buf_b : buf_a;
      size_t size = p ? size_b : size_a;
      int src = p ? b : a, s_len = p ? 13 : 10;
      F = sq_create(&sht);
      if (!F) continue;
      KT_STATUS(kva_seq_import(F, buf, size, &id), KVA_OK);
      KT_CHECK(sq_same_state(&sh, A, src, F, id, "prefix import"), "prefix import: state (bs %d)", bs);
      KT_STATUS(kva_seq_new_prefix(F, tok, 13, 42, &id2, &reused), KVA_OK);
      KT_CHECK(reused == want, "bs %d, stream %d: kva_seq_new_prefix after the import reused %d, expected %d", bs, p,
               reused, want);
      /* the reused slots hold the exported sequence's K/V */
      if (reused > 0) {
        float k1[8], k2[8], v1[8], v2[8];
        int l, slot, same = 1;
        for (l = 0; l < 2; l++)
          for (slot = 0; slot < reused; slot++) {
            kva_seq_read(A, src, l, slot, k1, v1, NULL);
            kva_seq_read(F, id2, l, slot, k2, v2, NULL);
            same &= memcmp(k1, k2, sizeof(float) * 4) == 0 && memcmp(v1, v2, sizeof(float) * 4) == 0;
          }
        KT_CHECK(same, "bs %d: the reused blocks hold other K/V", bs);
      }
      KT_STATUS(kva_seq_free(F, id2), KVA_OK);
      KT_STATUS(kva_seq_new_prefix(F, tok, 13, 43, &id2, &reused), KVA_OK);
      KT_CHECK(reused == 0, "bs %d: another salt reused %d", bs, reused);
      KT_STATUS(kva_seq_free(F, id2), KVA_OK);
      KT_STATUS(kva_seq_new_prefix(F, tok2, 13, 42, &id2, &reused), KVA_OK);
      KT_CHECK(reused == (bs <= 4 ? 4 / bs * bs : 0), "bs %d: other tokens in block 2 reused %d", bs, reused);
      KT_STATUS(kva_seq_free(F, id2), KVA_OK);
      /* a second import of the same stream: the target has the blocks already */
      kva_cache_get_stats(F, &s0);
      KT_STATUS(kva_seq_import(F, buf, size, &id2), KVA_OK);
      kva_cache_get_stats(F, &s1);
      KT_CHECK(s1.n_seqs == s0.n_seqs + 1 && s1.tokens_held == s0.tokens_held + s_len && sq_stats_sane(&s1),
               "second import: stats");
      KT_CHECK(sq_same_state(&sh, A, src, F, id2, "second prefix import"), "second import: state");
      /* freed, the published blocks stay cached and still hit */
      KT_STATUS(kva_seq_free(F, id), KVA_OK);
      KT_STATUS(kva_seq_free(F, id2), KVA_OK);
      kva_cache_get_stats(F, &s1);
      KT_CHECK(s1.n_seqs == 0 && s1.blocks_used == 0 && s1.blocks_cached == want / bs && sq_stats_sane(&s1),
               "bs %d: after freeing: %d used, %d cached (expected %d)", bs, s1.blocks_used, s1.blocks_cached,
               want / bs);
      KT_STATUS(kva_seq_new_prefix(F, tok, 13, 42, &id2, &reused), KVA_OK);
      KT_CHECK(reused == want, "bs %d: after freeing, reused %d", bs, reused);
      kva_cache_destroy(F);
    }
  }
  /* the same cache: export, free, import; the published blocks stay, a new
     prefix sequence still hits them */
  {
    int id3 = -1;
    KT_STATUS(kva_seq_free(A, b), KVA_OK);
    KT_STATUS(kva_seq_import(A, buf_b, size_b, &id3), KVA_OK);
    KT_STATUS(kva_seq_new_prefix(A, tok, 13, 42, &id2, &reused), KVA_OK);
    KT_CHECK(reused == 8, "same cache: reused %d", reused);
    KT_STATUS(kva_seq_free(A, id2), KVA_OK);
    kva_cache_get_stats(A, &s1);
    KT_CHECK(sq_stats_sane(&s1) && s1.n_seqs == 2, "same cache: stats");
  }
done:
  free(buf_a);
  free(buf_b);
  kva_cache_destroy(A);
  sq_ctx_free(&x);
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */

/* Every truncation and every single-byte change of a stream fails with
   KVA_ERR_STREAM and changes nothing (all of them for a small stream, a
   sample for a large one). */
static void sq_corrupt_all(kva_cache *c, int max_seqs, const unsigned char *buf, size_t size, int dense) {
  unsigned char *m = KT_ALLOC(unsigned char, size + 1);
  size_t i, step = dense ? 1 : size / (size_t)kt_iters(600) + 1;
  for (i = 0; i < size; i += (i < 300 || i + 300 > size) ? 1 : step)
    sq_import_fails(c, max_seqs, buf, i, KVA_ERR_STREAM, "truncated to", (long)i);
  /* one byte more than the stream says */
  memcpy(m, buf, size);
  m[size] = 0;
  sq_import_fails(c, max_seqs, m, size + 1, KVA_ERR_STREAM, "a byte appended", (long)size);
  for (i = 0; i < size; i += (i < 300 || i + 300 > size) ? 1 : step) {
    unsigned char flip = (unsigned char)(i % 3 == 0 ? 0xFF : 1u << (i % 8));
    kva_status want = KVA_ERR_STREAM;
    memcpy(m, buf, size);
    m[i] ^= flip;
    /* a stream of another version need not carry a checksum this reader knows */
    if (i >= SQ_OFF_VERSION && i < SQ_OFF_VERSION + 4) {
      int id = -77;
      kva_status st = kva_seq_import(c, m, size, &id);
      KT_CHECK(st == KVA_ERR_STREAM || st == KVA_ERR_UNSUPPORTED, "version byte %lu flipped: %s", (unsigned long)i,
               kva_status_str(st));
      KT_CHECK(id == -77, "version byte flipped: *seq written");
      continue;
    }
    sq_import_fails(c, max_seqs, m, size, want, "byte flipped at", (long)i);
  }
  free(m);
}

/* A stream as a machine of the other byte order would have written this
   header: magic as is, every number byte-swapped. */
static uint32_t sq_bswap32(uint32_t x) {
  return (x >> 24) | ((x >> 8) & 0xFF00u) | ((x << 8) & 0xFF0000u) | (x << 24);
}

static void sq_errors(void) {
  kt_rng rng;
  sq_shape sh, sh2, big;
  sq_ctx x, xb;
  sq_hist h;
  kva_cache *E, *P, *B, *D;
  sq_seq v[2];
  unsigned char *s_evict = NULL, *s_prefix = NULL, *s_big = NULL, *s_plain = NULL, *m = NULL;
  size_t z_evict = 0, z_prefix = 0, z_big = 0, z_plain = 0, sz = 0;
  int e_id[2] = {-1, -1}, p_id[2] = {-1, -1}, plain[2] = {-1, -1}, i, id = -1, id_e = -1, id_p = -1, reused = -1;
  int32_t tok[16];
  kva_evict win, h2o;
  sq_snap snap;
  kt_begin("seqio errors");
  kt_seed(&rng, 999);
  for (i = 0; i < 16; i++) tok[i] = i * 3;
  /* E: the cache the failures run against; P: its twin that sees none of them */
  sq_small_shape(&sh, KVA_CACHE_KV, 2, 2, 4, 3, 2, 4, 16, KVA_F16);
  sh.per_layer = 1, sh.ldt[0] = KVA_INT8, sh.ldt[1] = KVA_FP8_E4M3, sh.scale_mode = 2;
  sh.max_seqs = 5;
  sh.hk[2] = 0.75f, sh.hv[3] = 0.125f;
  sq_ctx_init(&x, &sh, &rng);
  sq_hist_init(&h);
  E = sq_create(&sh);
  P = sq_create(&sh);
  if (!E || !P) {
    kva_cache_destroy(E);
    kva_cache_destroy(P);
    sq_ctx_free(&x);
    return;
  }
  memset(&win, 0, sizeof win);
  win.kind = KVA_EVICT_WINDOW, win.budget = 3, win.n_sink = 1;
  memset(&h2o, 0, sizeof h2o);
  h2o.kind = KVA_EVICT_H2O, h2o.budget = 4, h2o.n_recent = 1;
  /* an H2O sequence with evicted tokens, mid-step; a published one; a plain one */
  KT_STATUS(kva_seq_new(E, &e_id[0]), KVA_OK);
  KT_STATUS(kva_seq_new(P, &e_id[1]), KVA_OK);
  v[0].c = E, v[0].id = e_id[0], v[1].c = P, v[1].id = e_id[1];
  sq_all_set_evict(&h, v, 2, &h2o);
  for (i = 0; i < 4; i++) KT_STATUS(sq_step(&x, &h, v, 2, 2, 3u, 1), KVA_OK);
  KT_STATUS(sq_step(&x, &h, v, 2, 2, 1u, 0), KVA_OK);
  KT_CHECK(kva_seq_len(E, e_id[0]) < kva_seq_pos(E, e_id[0]), "errors: no eviction in the H2O sequence");
  KT_STATUS(kva_seq_new(E, &p_id[0]), KVA_OK);
  KT_STATUS(kva_seq_new(P, &p_id[1]), KVA_OK);
  v[0].id = p_id[0], v[1].id = p_id[1];
  sq_hist_init(&h);
  KT_STATUS(sq_step(&x, &h, v, 2, 9, 3u, 1), KVA_OK);
  KT_STATUS(kva_seq_publish(E, p_id[0], tok, 9, 5), KVA_OK);
  KT_STATUS(kva_seq_publish(P, p_id[1], tok, 9, 5), KVA_OK);
  KT_STATUS(kva_seq_new(E, &plain[0]), KVA_OK);
  KT_STATUS(kva_seq_new(P, &plain[1]), KVA_OK);
  v[0].id = plain[0], v[1].id = plain[1];
  sq_hist_init(&h);
  KT_STATUS(sq_step(&x, &h, v, 2, 3, 3u, 1), KVA_OK);
  s_evict = sq_export(E, sh.max_seqs, e_id[0], &z_evict);
  s_prefix = sq_export(E, sh.max_seqs, p_id[0], &z_prefix);
  s_plain = sq_export(E, sh.max_seqs, plain[0], &z_plain);
  if (!s_evict || !s_prefix || !s_plain) goto done;
  KT_CHECK(sq_get_u32(s_prefix, SQ_OFF_NPREFIX) == 8, "the published sequence's stream has %u prefix tokens",
           sq_get_u32(s_prefix, SQ_OFF_NPREFIX));
  if (getenv("KVA_TEST_VERBOSE"))
    fprintf(stderr, "    seqio errors: streams of %lu, %lu, %lu bytes\n", (unsigned long)z_evict,
            (unsigned long)z_prefix, (unsigned long)z_plain);

  /* truncated and corrupted */
  sq_corrupt_all(E, sh.max_seqs, s_evict, z_evict, 1);
  sq_corrupt_all(E, sh.max_seqs, s_prefix, z_prefix, 1);
  m = KT_ALLOC(unsigned char, z_evict + 64);
  /* not a stream at all */
  memset(m, 0, z_evict);
  sq_import_fails(E, sh.max_seqs, m, z_evict, KVA_ERR_STREAM, "zeros", 0);
  sq_import_fails(E, sh.max_seqs, "kvattnSQ", 8, KVA_ERR_STREAM, "magic only", 0);
  sq_import_fails(E, sh.max_seqs, s_evict, 0, KVA_ERR_STREAM, "empty", 0);
  /* the checksum itself wrong, everything else right */
  memcpy(m, s_evict, z_evict);
  m[z_evict - 1] ^= 0x10;
  sq_import_fails(E, sh.max_seqs, m, z_evict, KVA_ERR_STREAM, "checksum changed", 0);
  /* the size field changed, re-sealed */
  memcpy(m, s_evict, z_evict);
  {
    uint64_t z = (uint64_t)z_evict + 4;
    memcpy(m + SQ_OFF_SIZE, &z, 8);
  }
  sq_reseal(m, z_evict);
  sq_import_fails(E, sh.max_seqs, m, z_evict, KVA_ERR_STREAM, "size field +4, re-sealed", 0);
  /* an older, a newer or a foreign version, re-sealed */
  for (i = 0; i < 3; i++) {
    static const uint32_t vers[3] = {1, 3, 0x100}; /* 1: INT4 groups with f32 scales */
    memcpy(m, s_evict, z_evict);
    sq_put_u32(m, SQ_OFF_VERSION, vers[i]);
    sq_reseal(m, z_evict);
    sq_import_fails(E, sh.max_seqs, m, z_evict, KVA_ERR_UNSUPPORTED, "version, re-sealed", (long)vers[i]);
  }
  /* the other byte order's mark, re-sealed */
  memcpy(m, s_evict, z_evict);
  sq_put_u32(m, SQ_OFF_ORDER, 0x04030201u);
  sq_reseal(m, z_evict);
  sq_import_fails(E, sh.max_seqs, m, z_evict, KVA_ERR_UNSUPPORTED, "foreign byte-order mark, re-sealed", 0);
  /* a mark that is neither byte order: not a stream */
  memcpy(m, s_evict, z_evict);
  sq_put_u32(m, SQ_OFF_ORDER, 0x01020305u);
  sq_reseal(m, z_evict);
  sq_import_fails(E, sh.max_seqs, m, z_evict, KVA_ERR_STREAM, "garbage byte-order mark, re-sealed", 0);
  /* written by a machine of the other byte order: its version, mark and size
     fields are byte-swapped and its checksum was computed over its own
     words, so this reader cannot verify it: still "another byte order" */
  memcpy(m, s_evict, z_evict);
  sq_put_u32(m, SQ_OFF_VERSION, sq_bswap32(1));
  sq_put_u32(m, SQ_OFF_ORDER, 0x04030201u);
  {
    uint64_t z = (uint64_t)z_evict, sw = 0;
    int b;
    for (b = 0; b < 8; b++) sw |= ((z >> (8 * b)) & 0xFFu) << (8 * (7 - b));
    memcpy(m + SQ_OFF_SIZE, &sw, 8);
  }
  sq_import_fails(E, sh.max_seqs, m, z_evict, KVA_ERR_UNSUPPORTED, "a stream in the other byte order", 0);

  /* re-sealed streams whose fields disagree (the documented layout: header
     i32s from byte 24: kind, n_layers, n_kv_heads, head_dim, v_dim,
     block_size, flags, len, pos, step, first unstored, two policies) */
  {
    static const struct {
      int off, val, want; /* the i32 at off set to val */
    } f[] = {
        {24, 1, KVA_ERR_UNSUPPORTED},  /* kind LATENT */
        {28, 3, KVA_ERR_UNSUPPORTED},  /* n_layers */
        {32, 1, KVA_ERR_UNSUPPORTED},  /* n_kv_heads */
        {36, 4, KVA_ERR_UNSUPPORTED},  /* head_dim */
        {40, 3, KVA_ERR_UNSUPPORTED},  /* v_dim */
        {44, 0, KVA_ERR_STREAM},       /* block size 0 */
        {48, 32, KVA_ERR_STREAM},      /* an unknown flag */
        {48, 11, KVA_ERR_UNSUPPORTED}, /* K rows rotated, which this cache's are not */
        {48, 7, KVA_ERR_UNSUPPORTED},  /* layer groups, which this cache has not */
        {48, 1, KVA_ERR_STREAM},       /* no scores: the size disagrees */
        {52, -1, KVA_ERR_STREAM},      /* len */
        {56, 0, KVA_ERR_STREAM},       /* pos < len */
        {60, 99, KVA_ERR_STREAM},      /* step > len */
        {64, -2, KVA_ERR_STREAM},      /* first unstored */
        {68, 7, KVA_ERR_STREAM},       /* policy kind */
        {72, 0, KVA_ERR_STREAM},       /* H2O budget 0 */
        {108, 4, KVA_ERR_STREAM},      /* prefix tokens of an evicted sequence */
        {112, 1, KVA_ERR_STREAM},      /* a reserved word */
        {124, 1, KVA_ERR_STREAM},      /* a reserved word */
        {128, KVA_F32, KVA_ERR_UNSUPPORTED}, /* layer 0's K type */
        {136, 3, KVA_ERR_STREAM},      /* layer 0's stored range [3, 2) */
        {140, 3, KVA_ERR_STREAM},      /* layer 0's stored range [0, 3) beyond the step of 2 */
    };
    int j;
    for (j = 0; j < (int)(sizeof f / sizeof f[0]); j++) {
      memcpy(m, s_evict, z_evict);
      sq_put_u32(m, (size_t)f[j].off, (uint32_t)f[j].val);
      sq_reseal(m, z_evict);
      sq_import_fails(E, sh.max_seqs, m, z_evict, (kva_status)f[j].want, "field changed, re-sealed", f[j].off);
    }
    /* four bytes more, the size field saying so, re-sealed */
    memcpy(m, s_evict, z_evict - 8);
    memset(m + z_evict - 8, 0, 4);
    {
      uint64_t z = (uint64_t)z_evict + 4;
      memcpy(m + SQ_OFF_SIZE, &z, 8);
    }
    sq_reseal(m, z_evict + 4);
    sq_import_fails(E, sh.max_seqs, m, z_evict + 4, KVA_ERR_STREAM, "4 bytes more, re-sealed", 0);
    /* the rows: positions of layer 0, head 0 follow its K and V rows
       (INT8: head_dim + 4 and v_dim + 4 bytes a token), scores follow them */
    {
      int len = kva_seq_len(E, e_id[0]), pos = kva_seq_pos(E, e_id[0]);
      size_t rows = 128 + (size_t)sh.L * (16 + 8 * (size_t)sh.G), at_pos = rows + (size_t)len * (3 + 4 + 2 + 4);
      size_t at_score = at_pos + 4 * (size_t)len;
      int32_t bad[3];
      float fbad[3];
      uint32_t nan = 0x7FC00000u;
      bad[0] = pos, bad[1] = -1, bad[2] = 0; /* slot 0 beyond pos or negative; a token of the step at 0 */
      fbad[0] = -1.0f, fbad[2] = 1e30f;
      memcpy(&fbad[1], &nan, 4);
      KT_CHECK(sq_get_u32(s_evict, at_pos) == 0u, "errors: the position of slot 0 is %u, not the sink 0",
               sq_get_u32(s_evict, at_pos));
      for (j = 0; j < 3; j++) {
        memcpy(m, s_evict, z_evict);
        memcpy(m + at_pos + (j < 2 ? 0 : 4 * (size_t)(len - 1)), &bad[j], 4);
        sq_reseal(m, z_evict);
        sq_import_fails(E, sh.max_seqs, m, z_evict, KVA_ERR_STREAM, "position out of range, re-sealed", j);
      }
      for (j = 0; j < 2; j++) {
        memcpy(m, s_evict, z_evict);
        memcpy(m + at_score, &fbad[j], 4);
        sq_reseal(m, z_evict);
        sq_import_fails(E, sh.max_seqs, m, z_evict, KVA_ERR_STREAM, "score negative / NaN, re-sealed", j);
      }
      /* a large but finite score is a score */
      memcpy(m, s_evict, z_evict);
      memcpy(m + at_score, &fbad[2], 4);
      sq_reseal(m, z_evict);
      id = -1;
      KT_STATUS(kva_seq_import(E, m, z_evict, &id), KVA_OK);
      if (id >= 0) KT_STATUS(kva_seq_free(E, id), KVA_OK);
      id = -1; /* the same on the twin, so that the ids it hands out stay comparable */
      KT_STATUS(kva_seq_import(P, m, z_evict, &id), KVA_OK);
      if (id >= 0) KT_STATUS(kva_seq_free(P, id), KVA_OK);
    }
  }

  /* the plain stream imports into E (the failures left room) */
  id = -1;
  KT_STATUS(kva_seq_import(E, s_plain, z_plain, &id), KVA_OK);
  KT_CHECK(sq_same_state(&sh, E, plain[0], E, id, "plain import into E"), "plain import into E");
  KT_STATUS(kva_seq_free(E, id), KVA_OK);
  /* max_seqs: E has 3 of 5 live */
  KT_STATUS(kva_seq_import(E, s_plain, z_plain, &id), KVA_OK);
  KT_STATUS(kva_seq_import(E, s_plain, z_plain, &id_e), KVA_OK);
  sq_import_fails(E, sh.max_seqs, s_plain, z_plain, KVA_ERR_SEQ_LIMIT, "max_seqs live", 0);
  KT_STATUS(kva_seq_free(E, id_e), KVA_OK);
  KT_STATUS(kva_seq_import(E, s_plain, z_plain, &id_e), KVA_OK);
  KT_STATUS(kva_seq_free(E, id_e), KVA_OK);
  KT_STATUS(kva_seq_free(E, id), KVA_OK);
  /* so did P, without the failures: the next ids agree */
  KT_STATUS(kva_seq_import(P, s_plain, z_plain, &id), KVA_OK);
  KT_STATUS(kva_seq_free(P, id), KVA_OK);
  KT_STATUS(kva_seq_import(P, s_plain, z_plain, &id), KVA_OK);
  KT_STATUS(kva_seq_import(P, s_plain, z_plain, &id_e), KVA_OK);
  KT_STATUS(kva_seq_free(P, id_e), KVA_OK);
  KT_STATUS(kva_seq_import(P, s_plain, z_plain, &id_e), KVA_OK);
  KT_STATUS(kva_seq_free(P, id_e), KVA_OK);
  KT_STATUS(kva_seq_free(P, id), KVA_OK);
  {
    int ne = -1, np = -2;
    kva_cache_stats se, sp;
    KT_STATUS(kva_seq_new(E, &ne), KVA_OK);
    KT_STATUS(kva_seq_new(P, &np), KVA_OK);
    KT_CHECK(ne == np, "after the failed imports kva_seq_new hands out id %d, the twin %d", ne, np);
    kva_cache_get_stats(E, &se);
    kva_cache_get_stats(P, &sp);
    KT_CHECK(kt_stats_equal(&se, &sp, 0), "after the failed imports the stats differ from the twin's");
    kva_seq_free(E, ne);
    kva_seq_free(P, np);
  }

  /* NULL arguments, an unknown sequence, a small cap */
  sq_snap_take(E, sh.max_seqs, &snap);
  id = -77;
  KT_STATUS(kva_seq_import(NULL, s_plain, z_plain, &id), KVA_ERR_ARG);
  KT_STATUS(kva_seq_import(E, NULL, z_plain, &id), KVA_ERR_ARG);
  KT_STATUS(kva_seq_import(E, s_plain, z_plain, NULL), KVA_ERR_ARG);
  KT_STATUS(kva_seq_import(E, NULL, 0, &id), KVA_ERR_ARG);
  KT_CHECK(id == -77, "a failed import wrote *seq");
  sz = 12345;
  KT_STATUS(kva_seq_export(NULL, plain[0], NULL, 0, &sz), KVA_ERR_ARG);
  KT_STATUS(kva_seq_export(E, plain[0], NULL, 0, NULL), KVA_ERR_ARG);
  KT_STATUS(kva_seq_export(E, plain[0], m, z_evict + 64, NULL), KVA_ERR_ARG);
  KT_STATUS(kva_seq_export(E, -1, NULL, 0, &sz), KVA_ERR_SEQ);
  KT_STATUS(kva_seq_export(E, plain[0] + sh.max_seqs, m, z_evict + 64, &sz), KVA_ERR_SEQ);
  KT_STATUS(kva_seq_export(E, INT_MAX, m, z_evict + 64, &sz), KVA_ERR_SEQ);
  KT_CHECK(sz == 12345, "a failed export wrote *size = %lu", (unsigned long)sz);
  memset(m, 0x3C, z_plain);
  KT_STATUS(kva_seq_export(E, plain[0], m, z_plain - 1, &sz), KVA_ERR_ARG);
  KT_CHECK(sz == z_plain, "export with a small cap: *size %lu, needed %lu", (unsigned long)sz, (unsigned long)z_plain);
  for (i = 0; i < (int)z_plain && m[i] == 0x3C; i++) {
  }
  KT_CHECK(i == (int)z_plain, "export with a small cap wrote into the buffer");
  KT_STATUS(kva_seq_export(E, plain[0], m, 0, &sz), KVA_ERR_ARG);
  KT_STATUS(kva_seq_export(E, plain[0], m, z_plain, &sz), KVA_OK); /* exactly enough */
  KT_CHECK(sz == z_plain && memcmp(m, s_plain, z_plain) == 0, "export into an exact buffer");
  KT_CHECK(sq_snap_same(E, sh.max_seqs, &snap), "the argument errors changed the cache");
  {
    int dead = -1;
    KT_STATUS(kva_seq_new(E, &dead), KVA_OK);
    KT_STATUS(kva_seq_free(E, dead), KVA_OK);
    sq_snap_take(E, sh.max_seqs, &snap);
    KT_STATUS(kva_seq_export(E, dead, m, z_evict + 64, &sz), KVA_ERR_SEQ); /* freed */
    KT_CHECK(sq_snap_same(E, sh.max_seqs, &snap), "export of a freed id changed the cache");
  }

  /* caches of another shape: kind, layers, heads, dims, storage types, FP8 scales */
  for (i = 0; i < 15; i++) {
    kva_cache *W;
    sh2 = sh;
    switch (i) {
      case 0: sh2.kind = KVA_CACHE_LATENT, sh2.Dv = sh2.v_dim_desc = 2; break;
      case 1: sh2.L = 3, sh2.ldt[2] = KVA_F16; break;
      case 2: sh2.L = 1; break;
      case 3: sh2.G = 1, sh2.H = 4; break;
      case 4: sh2.G = 4, sh2.H = 4; break;
      case 5: sh2.D = 4; break;
      case 6: sh2.Dv = sh2.v_dim_desc = 3; break;
      case 7: sh2.v_dim_desc = 0, sh2.Dv = 3; break; /* 0 resolves to head_dim 3, not 2 */
      case 8: sh2.ldt[0] = KVA_F16; break;               /* layer 0: INT8 -> F16 */
      case 9: sh2.ldt[1] = KVA_FP8_E5M2; break;          /* layer 1: E4M3 -> E5M2 */
      case 10: sh2.hk[2] = 0.5f; break;                  /* one K head scale */
      case 11: sh2.hv[3] = 0.25f; break;                 /* one V head scale */
      case 12: sh2.scale_mode = 1; break;                /* per layer: the head scales differ */
      case 13: sh2.per_layer = 0, sh2.dtype = KVA_INT8, sh2.v_dtype = KVA_FP8_E4M3; break; /* V of layer 0 */
      default: sh2.per_layer = 0, sh2.dtype = KVA_INT8, sh2.v_dtype = KVA_INT8; break;      /* layer 1 */
    }
    W = sq_create(&sh2);
    if (!W) continue;
    sq_import_fails(W, sh2.max_seqs, s_plain, z_plain, KVA_ERR_UNSUPPORTED, "another shape", i);
    kva_cache_destroy(W);
  }
  /* ... but what the stream does not depend on may differ */
  for (i = 0; i < 5; i++) {
    kva_cache *W;
    sh2 = sh;
    switch (i) {
      case 0: sh2.bs = 1, sh2.nb = 8; break;
      case 1: sh2.bs = 16, sh2.nb = 1, sh2.max_seqs = 1; break;
      case 2: sh2.max_seq_len = 3, sh2.prefix_max_age = 1; break;
      case 3: sh2.evict_support = KVA_EVICT_SUPPORT_NONE; break;
      default: sh2.k_scale = 3.0f, sh2.scale_mode = 2; break; /* head scales as before; tensor scales unread */
    }
    W = sq_create(&sh2);
    if (!W) continue;
    id = -1;
    KT_STATUS(kva_seq_import(W, s_plain, z_plain, &id), KVA_OK);
    KT_CHECK(sq_same_state(&sh, E, plain[0], W, id, "compatible cache"), "compatible cache %d", i);
    kva_cache_destroy(W);
  }
  /* evict_support too weak for the sequence */
  {
    kva_cache *W;
    int wid = -1;
    sh2 = sh;
    sh2.evict_support = KVA_EVICT_SUPPORT_WINDOW;
    W = sq_create(&sh2);
    if (W) {
      sq_import_fails(W, sh2.max_seqs, s_evict, z_evict, KVA_ERR_UNSUPPORTED, "H2O into WINDOW support", 0);
      /* H2O only pending (set, not yet applied) still needs the scores */
      KT_STATUS(kva_seq_set_evict(E, plain[0], &h2o), KVA_OK);
      free(s_plain);
      s_plain = sq_export(E, sh.max_seqs, plain[0], &z_plain);
      if (s_plain)
        sq_import_fails(W, sh2.max_seqs, s_plain, z_plain, KVA_ERR_UNSUPPORTED, "pending H2O into WINDOW support",
                        0);
      /* evicted under WINDOW, then the policy off: the positions still need keeping */
      KT_STATUS(kva_seq_new(E, &wid), KVA_OK);
      v[0].c = E, v[0].id = wid;
      sq_hist_init(&h);
      sq_all_set_evict(&h, v, 1, &win);
      for (i = 0; i < 3; i++) KT_STATUS(sq_step(&x, &h, v, 1, 2, 3u, 1), KVA_OK);
      memset(&h.next, 0, sizeof h.next);
      KT_STATUS(kva_seq_set_evict(E, wid, &h.next), KVA_OK);
      KT_STATUS(sq_step(&x, &h, v, 1, 1, 3u, 1), KVA_OK);
      KT_CHECK(kva_seq_len(E, wid) < kva_seq_pos(E, wid), "the WINDOW sequence evicted nothing");
      free(s_plain);
      s_plain = sq_export(E, sh.max_seqs, wid, &z_plain);
      if (s_plain) {
        KT_STATUS(kva_seq_import(W, s_plain, z_plain, &id), KVA_OK);
        KT_CHECK(sq_same_state(&sh, E, wid, W, id, "evicted into WINDOW support"), "evicted into WINDOW support");
      }
      kva_cache_destroy(W);
      sh2.evict_support = KVA_EVICT_SUPPORT_NONE;
      W = sq_create(&sh2);
      if (W && s_plain)
        sq_import_fails(W, sh2.max_seqs, s_plain, z_plain, KVA_ERR_UNSUPPORTED, "evicted into NONE support", 0);
      kva_cache_destroy(W);
      /* a WINDOW policy into NONE */
      KT_STATUS(kva_seq_set_evict(E, plain[0], &win), KVA_OK);
      free(s_plain);
      s_plain = sq_export(E, sh.max_seqs, plain[0], &z_plain);
      W = sq_create(&sh2);
      if (W && s_plain)
        sq_import_fails(W, sh2.max_seqs, s_plain, z_plain, KVA_ERR_UNSUPPORTED, "WINDOW into NONE support", 0);
      kva_cache_destroy(W);
      KT_STATUS(kva_seq_free(E, wid), KVA_OK);
    }
  }

  /* a full pool: KVA_ERR_FULL, then success once blocks are free (or cached) */
  sh2 = sh;
  sh2.nb = 5;
  D = sq_create(&sh2);
  if (D && s_prefix) { /* the published stream: 9 tokens = 3 blocks of 4 */
    int hog = -1, hog2 = -1;
    KT_STATUS(kva_seq_new(D, &hog), KVA_OK);
    KT_STATUS(kva_seq_append(D, hog, 12), KVA_OK); /* 3 of 5 blocks */
    sq_import_fails(D, sh2.max_seqs, s_prefix, z_prefix, KVA_ERR_FULL, "pool too full", 0);
    KT_STATUS(kva_seq_truncate(D, hog, 8), KVA_OK);
    KT_STATUS(kva_seq_import(D, s_prefix, z_prefix, &id_p), KVA_OK); /* 2 + 3 blocks */
    KT_CHECK(sq_same_state(&sh, E, p_id[0], D, id_p, "after freeing"), "import after freeing");
    sq_import_fails(D, sh2.max_seqs, s_prefix, z_prefix, KVA_ERR_FULL, "pool full", 1);
    /* freed, its two published blocks are cached: an import may recycle them */
    KT_STATUS(kva_seq_free(D, id_p), KVA_OK);
    {
      kva_cache_stats s;
      kva_cache_get_stats(D, &s);
      KT_CHECK(s.blocks_cached == 2 && s.blocks_free == 1, "cached %d free %d", s.blocks_cached, s.blocks_free);
    }
    KT_STATUS(kva_seq_new_prefix(D, tok, 9, 5, &hog2, &reused), KVA_OK);
    KT_CHECK(reused == 8, "the import's published blocks: reused %d", reused);
    KT_STATUS(kva_seq_free(D, hog2), KVA_OK);
    KT_STATUS(kva_seq_import(D, s_prefix, z_prefix, &id_p), KVA_OK); /* 1 free + 2 cached */
    KT_CHECK(sq_same_state(&sh, E, p_id[0], D, id_p, "recycling"), "import recycling cached blocks");
    KT_STATUS(kva_seq_free(D, id_p), KVA_OK);
    KT_STATUS(kva_seq_free(D, hog), KVA_OK);
    /* a pool smaller than the sequence */
    kva_cache_destroy(D);
    sh2.nb = 2;
    D = sq_create(&sh2);
    if (D) sq_import_fails(D, sh2.max_seqs, s_prefix, z_prefix, KVA_ERR_FULL, "pool smaller than the sequence", 0);
    kva_cache_destroy(D);
    /* max_seq_len below the sequence (in whole blocks: 8 tokens = 2 blocks) */
    sh2.nb = 16, sh2.max_seq_len = 8;
    D = sq_create(&sh2);
    if (D) sq_import_fails(D, sh2.max_seqs, s_prefix, z_prefix, KVA_ERR_FULL, "max_seq_len", 8);
    kva_cache_destroy(D);
    sh2.max_seq_len = 9;
    D = sq_create(&sh2);
    if (D) {
      KT_STATUS(kva_seq_import(D, s_prefix, z_prefix, &id_p), KVA_OK);
    }
  }
  kva_cache_destroy(D);

  /* a large stream: a dense sample of truncations and flips */
  sq_small_shape(&big, KVA_CACHE_KV, 3, 2, 4, 16, 12, 16, 40, KVA_F32);
  big.per_layer = 1, big.ldt[1] = KVA_INT8, big.ldt[2] = KVA_BF16;
  sq_ctx_init(&xb, &big, &rng);
  B = sq_create(&big);
  if (B) {
    int bid = -1;
    sq_hist hb;
    sq_hist_init(&hb);
    KT_STATUS(kva_seq_new(B, &bid), KVA_OK);
    v[0].c = B, v[0].id = bid;
    for (i = 0; i < 30; i++) KT_STATUS(sq_step(&xb, &hb, v, 1, 9, 7u, 0), KVA_OK);
    s_big = sq_export(B, big.max_seqs, bid, &z_big);
    if (s_big) {
      KT_CHECK(z_big > 30000, "the large stream has %lu bytes", (unsigned long)z_big);
      sq_corrupt_all(B, big.max_seqs, s_big, z_big, 0);
      KT_STATUS(kva_seq_import(B, s_big, z_big, &id), KVA_OK);
      KT_CHECK(sq_same_state(&big, B, bid, B, id, "large"), "large import");
    }
    kva_cache_destroy(B);
  }
  sq_ctx_free(&xb);
  /* and the H2O sequence moves fine after all that */
  id_e = -1;
  KT_STATUS(kva_seq_import(P, s_evict, z_evict, &id_e), KVA_OK);
  KT_CHECK(sq_same_state(&sh, E, e_id[0], P, id_e, "H2O after the errors"), "H2O import");
done:
  free(s_evict);
  free(s_prefix);
  free(s_plain);
  free(s_big);
  free(m);
  kva_cache_destroy(E);
  kva_cache_destroy(P);
  sq_ctx_free(&x);
}

void test_seqio(void);
void test_seqio(void) {
  sq_round_trips();
  sq_evict();
  sq_midstep();
  sq_prefix();
  sq_errors();
}
