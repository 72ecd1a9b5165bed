/* test_groups.c - layer groups (kva_cache_desc.groups): hybrid local/global caches.
 *
 * Written from the documented behaviour.  A WINDOW or CHUNK group's layers
 * attend within the group's span and keep their tokens in the group's own
 * pool, releasing at each kva_seq_append (p0 = the length before it) the
 * blocks [sinks, first / bs) with sinks = ceil(n_sink / bs) (WINDOW; CHUNK 0)
 * and first = p0 - window + 1 (WINDOW) or floor(p0 / chunk) * chunk (CHUNK).
 * The test keeps its own model of every pool (main pool and each group's:
 * reference counts, copy-on-write of a shared tail, releases by that rule)
 * and checks the library against it and against a plain twin cache:
 *
 *  1. hybrid == plain: random shapes (2..6 layers over 1..3 groups, FULL /
 *     WINDOW with sinks / CHUNK, G 1..3, H = G * 1..3, D off multiples of 8,
 *     block sizes 1..17, F32 / F16 / INT8), decode steps and prefill chunks
 *     to ~150 tokens: every layer's kva_attend_cache_lse with window 0 (the
 *     group's span applies) is bit for bit the plain cache's with the span in
 *     kva_attn (and so for narrower spans the call asks for), and within
 *     2e-5 * (1 + max|v|) (lse 1e-5 * (1 + |lse|)) of ref.h over the values
 *     the plain cache holds; kva_seq_read of a held token is the plain
 *     twin's bit for bit, of a released one KVA_ERR_UNSUPPORTED; stats
 *     (blocks_used, group_blocks(_used), bytes_used) equal the model's,
 *     bytes_used <= the plain cache's; kva_gqa_forward likewise.
 *  2. kva_attend_batch(_lse) over 2-3 sequences of different lengths (one
 *     plan, window 0) == the plain cache's plans with each group's span, and
 *     == kva_attend_cache_lse per sequence, bit for bit; kva_seq_append_all.
 *  3. fork / copy-on-write: forks continue differently, each equal to its
 *     plain twin; stats follow the model (shared blocks once), nothing leaks.
 *  4. errors change nothing: a group's pool running out (KVA_ERR_FULL,
 *     kva_seq_fits NOW / LATER / NEVER as the model says), derived pool
 *     sizes, truncate / accept reaching released tokens (UNSUPPORTED) and
 *     within held ones (== the plain twin after), spans wider than the
 *     group's (KVA_ERR_ARG), bad group descriptions, eviction policies.
 *  5. prefix caching: hit lengths by the rule, shortened when the group
 *     released (or its pool took back) the window's blocks; attention after
 *     a hit == the plain twin.
 *  6. export / import across block sizes and patterns; released tokens are
 *     zeros in the stream; a re-export is the stream byte for byte.
 *  7. the memory figure of a Gemma-3-like pattern at 4096 tokens, exactly.
 */
#include "kvattn.h"
#include "harness.h"
#include "ref.h"

#define TG_TOL_OUT 2e-5
#define TG_TOL_LSE 1e-5
#define TG_MAXL 8
#define TG_MAXS 6 /* sequences one twin tracks */

static long tg_bitwise, tg_refs;
static double tg_worst;

static int tg_cdiv(long a, int b) { return (int)((a + b - 1) / b); }

/* ======================================================================== */
/* Shapes                                                                   */

typedef struct {
  int L, G, H, D, bs, n_groups, evict_support;
  kva_dtype dt;
  kva_layer_group gr[KVA_MAX_GROUPS];
  int lg[TG_MAXL];
  char label[256];
} tg_shape;

static int tg_is_span(const kva_layer_group *g) { return g->kind != KVA_SPAN_FULL; }

static void tg_label(tg_shape *s) {
  int g, l, at;
  at = snprintf(s->label, sizeof s->label, "L%d G%d H%d D%d bs%d %s [", s->L, s->G, s->H, s->D, s->bs,
                kva_dtype_name(s->dt));
  for (g = 0; g < s->n_groups && at < 200; g++) {
    const kva_layer_group *x = &s->gr[g];
    at += snprintf(s->label + at, sizeof s->label - (size_t)at, "%s%s",
                   x->kind == KVA_SPAN_WINDOW ? "W" : x->kind == KVA_SPAN_CHUNK ? "C" : "F", g + 1 < s->n_groups ? "" : "");
    if (x->kind == KVA_SPAN_WINDOW) at += snprintf(s->label + at, sizeof s->label - (size_t)at, "%d+%d", x->window, x->n_sink);
    if (x->kind == KVA_SPAN_CHUNK) at += snprintf(s->label + at, sizeof s->label - (size_t)at, "%d", x->chunk_size);
    at += snprintf(s->label + at, sizeof s->label - (size_t)at, "/%d ", x->n_blocks);
  }
  at += snprintf(s->label + at, sizeof s->label - (size_t)at, "] layers ");
  for (l = 0; l < s->L && at < 240; l++) at += snprintf(s->label + at, sizeof s->label - (size_t)at, "%d", s->lg[l]);
}

static void tg_random_group(kt_rng *r, kva_layer_group *g) {
  static const int kinds[4] = {KVA_SPAN_FULL, KVA_SPAN_WINDOW, KVA_SPAN_WINDOW, KVA_SPAN_CHUNK};
  memset(g, 0, sizeof *g);
  g->kind = kt_pick(r, kinds, 4);
  if (g->kind == KVA_SPAN_WINDOW) {
    g->window = kt_int(r, 0, 3) == 0 ? kt_int(r, 1, 4) : kt_int(r, 1, 40);
    g->n_sink = kt_int(r, 0, 1) ? 0 : kt_int(r, 1, 5);
  } else if (g->kind == KVA_SPAN_CHUNK) {
    g->chunk_size = kt_int(r, 0, 3) == 0 ? kt_int(r, 1, 4) : kt_int(r, 1, 40);
  }
}

/* a random shape; group pools (n_blocks) are left 0 for the caller */
static void tg_random_shape(kt_rng *r, tg_shape *s, int allow_quant) {
  static const int gs[3] = {1, 2, 3}, ds[6] = {5, 8, 13, 16, 24, 3};
  int g, l, u;
  memset(s, 0, sizeof *s);
  s->L = kt_int(r, 2, 6);
  s->n_groups = kt_int(r, 1, 3);
  for (g = 0; g < s->n_groups; g++) tg_random_group(r, &s->gr[g]);
  for (l = 0; l < s->L; l++) s->lg[l] = kt_int(r, 0, s->n_groups - 1);
  s->G = kt_pick(r, gs, 3);
  s->H = s->G * kt_int(r, 1, 3);
  s->D = kt_pick(r, ds, 6);
  s->bs = kt_int(r, 1, 17);
  u = kt_int(r, 0, 9);
  s->dt = !allow_quant || u < 6 ? KVA_F32 : u < 8 ? KVA_F16 : KVA_INT8;
  s->evict_support = kt_int(r, 0, 2); /* any: a cache with WINDOW / CHUNK groups behaves as NONE */
}

static void tg_desc(kva_cache_desc *d, const tg_shape *s, int n_blocks, int max_seqs, int hybrid, int bs) {
  memset(d, 0, sizeof *d);
  d->kind = KVA_CACHE_KV;
  d->n_layers = s->L;
  d->n_kv_heads = s->G;
  d->head_dim = s->D;
  d->block_size = bs ? bs : s->bs;
  d->n_blocks = n_blocks;
  d->dtype = s->dt;
  d->max_seqs = max_seqs;
  d->evict_support = KVA_EVICT_SUPPORT_NONE;
  if (hybrid) {
    d->n_groups = s->n_groups;
    d->groups = s->gr;
    d->layer_group = s->lg;
    d->evict_support = s->evict_support;
  }
}

static kva_cache *tg_create(const kva_cache_desc *d, const char *label) {
  kva_cache *c = NULL;
  kva_status st = kva_cache_create(d, &c);
  KT_CHECK(st == KVA_OK && c, "%s: kva_cache_create = %d", label, (int)st);
  if (st != KVA_OK || !c) {
    fprintf(stderr, "test_groups: cannot create a cache (%s)\n", label);
    exit(2);
  }
  return c;
}

static void tg_attn(kva_attn *a, const tg_shape *s) {
  memset(a, 0, sizeof *a);
  a->n_heads = s->H;
  a->n_kv_heads = s->G;
  a->head_dim = s->D;
  a->n_threads = 1;
}

/* the kva_attn mask a plain cache needs for layer l's group */
static void tg_layer_mask(const tg_shape *s, int l, kva_attn *a) {
  const kva_layer_group *g = &s->gr[s->lg[l]];
  a->window = g->kind == KVA_SPAN_WINDOW ? g->window : 0;
  a->n_sink = g->kind == KVA_SPAN_WINDOW ? g->n_sink : 0;
  a->chunk_size = g->kind == KVA_SPAN_CHUNK ? g->chunk_size : 0;
}

/* ======================================================================== */
/* The release rule                                                         */

/* the first block a query at position p (or later) can see (sinks aside) */
static int tg_first_block(const kva_layer_group *g, int bs, long p) {
  long first = g->kind == KVA_SPAN_WINDOW ? p - g->window + 1 : p / g->chunk_size * g->chunk_size;
  return first > 0 ? (int)(first / bs) : 0;
}
static int tg_sink_blocks(const kva_layer_group *g, int bs) {
  return g->kind == KVA_SPAN_WINDOW ? tg_cdiv(g->n_sink, bs) : 0;
}

/* ======================================================================== */
/* A model of the pools                                                     */

typedef struct {
  int cap, n_free;
  int *ref, *stack;
} tg_pool;

static void tg_pool_init(tg_pool *p, int cap) {
  int i;
  p->cap = cap;
  p->n_free = cap;
  p->ref = KT_ALLOC(int, cap + 1);
  p->stack = KT_ALLOC(int, cap + 1);
  for (i = 0; i <= cap; i++) p->ref[i] = 0, p->stack[i] = cap - 1 - i;
}
static void tg_pool_done(tg_pool *p) {
  free(p->ref);
  free(p->stack);
}
static int tg_pool_take(tg_pool *p) {
  int b;
  if (p->n_free <= 0) {
    KT_CHECK(0, "model: pool of %d taken past its end", p->cap);
    return 0;
  }
  b = p->stack[--p->n_free];
  p->ref[b] = 1;
  return b;
}
static void tg_pool_drop(tg_pool *p, int b) {
  if (--p->ref[b] == 0) p->stack[p->n_free++] = b;
}
static int tg_pool_used(const tg_pool *p) { return p->cap - p->n_free; }

typedef struct {
  int live, len, nb, step;
  int *main;               /* [max_b] */
  int *gt[KVA_MAX_GROUPS]; /* [max_b], -1: released */
  int from[KVA_MAX_GROUPS];
} tg_mseq;

typedef struct {
  const tg_shape *sh;
  int max_b;
  tg_pool main, gp[KVA_MAX_GROUPS];
  tg_mseq s[TG_MAXS];
} tg_model;

static void tg_model_init(tg_model *m, const tg_shape *sh, int main_blocks) {
  int i, g;
  memset(m, 0, sizeof *m);
  m->sh = sh;
  m->max_b = main_blocks;
  tg_pool_init(&m->main, main_blocks);
  for (g = 0; g < sh->n_groups; g++) tg_pool_init(&m->gp[g], tg_is_span(&sh->gr[g]) ? sh->gr[g].n_blocks : 0);
  for (i = 0; i < TG_MAXS; i++) {
    int k;
    m->s[i].main = KT_ALLOC(int, main_blocks + 1);
    for (k = 0; k <= main_blocks; k++) m->s[i].main[k] = -1;
    for (g = 0; g < sh->n_groups; g++) {
      m->s[i].gt[g] = KT_ALLOC(int, main_blocks + 1);
      for (k = 0; k <= main_blocks; k++) m->s[i].gt[g][k] = -1;
    }
  }
}
static void tg_model_done(tg_model *m) {
  int i, g;
  tg_pool_done(&m->main);
  for (g = 0; g < m->sh->n_groups; g++) tg_pool_done(&m->gp[g]);
  for (i = 0; i < TG_MAXS; i++) {
    free(m->s[i].main);
    for (g = 0; g < m->sh->n_groups; g++) free(m->s[i].gt[g]);
  }
}
/* dst (tg_model_init'ed alike) becomes a copy of src */
static void tg_model_copy(tg_model *dst, const tg_model *src) {
  int i, g;
  size_t mb = sizeof(int) * (size_t)(src->max_b + 1);
  dst->main.n_free = src->main.n_free;
  memcpy(dst->main.ref, src->main.ref, sizeof(int) * (size_t)(src->main.cap + 1));
  memcpy(dst->main.stack, src->main.stack, sizeof(int) * (size_t)(src->main.cap + 1));
  for (g = 0; g < src->sh->n_groups; g++) {
    dst->gp[g].n_free = src->gp[g].n_free;
    memcpy(dst->gp[g].ref, src->gp[g].ref, sizeof(int) * (size_t)(src->gp[g].cap + 1));
    memcpy(dst->gp[g].stack, src->gp[g].stack, sizeof(int) * (size_t)(src->gp[g].cap + 1));
  }
  for (i = 0; i < TG_MAXS; i++) {
    tg_mseq *d = &dst->s[i];
    const tg_mseq *s = &src->s[i];
    d->live = s->live, d->len = s->len, d->nb = s->nb, d->step = s->step;
    memcpy(d->main, s->main, mb);
    for (g = 0; g < src->sh->n_groups; g++) {
      d->from[g] = s->from[g];
      memcpy(d->gt[g], s->gt[g], mb);
    }
  }
}

static void tg_m_new(tg_model *m, int i) {
  tg_mseq *q = &m->s[i];
  int g;
  q->live = 1;
  q->len = q->nb = q->step = 0;
  for (g = 0; g < m->sh->n_groups; g++) q->from[g] = tg_sink_blocks(&m->sh->gr[g], m->sh->bs);
}

/* What an append of n needs of each pool (the sequence's blocks as they are now) */
typedef struct {
  int never, need_main, need[KVA_MAX_GROUPS], rel[KVA_MAX_GROUPS];
} tg_plan;

static void tg_m_plan(const tg_model *m, int i, int n, tg_plan *pl) {
  const tg_mseq *q = &m->s[i];
  int bs = m->sh->bs, nb_new = tg_cdiv((long)q->len + n, bs), g, k;
  int tail = q->len % bs ? q->len / bs : -1;
  memset(pl, 0, sizeof *pl);
  pl->need_main = n ? nb_new - q->nb + (tail >= 0 && m->main.ref[q->main[tail]] > 1) : 0;
  pl->never = nb_new > m->max_b;
  for (g = 0; g < m->sh->n_groups && n; g++) {
    const kva_layer_group *gr = &m->sh->gr[g];
    const tg_pool *p = &m->gp[g];
    int to, released;
    if (!tg_is_span(gr)) continue;
    to = tg_first_block(gr, bs, q->len);
    if (to > q->nb) to = q->nb;
    for (k = q->from[g]; k < to; k++) pl->rel[g] += q->gt[g][k] >= 0 && p->ref[q->gt[g][k]] == 1;
    pl->need[g] = nb_new - q->nb + (tail >= 0 && tail < q->nb && q->gt[g][tail] >= 0 && p->ref[q->gt[g][tail]] > 1);
    released = (to > q->from[g] ? to : q->from[g]) - tg_sink_blocks(gr, bs);
    if (nb_new - (released > 0 ? released : 0) > p->cap) pl->never = 1;
  }
}

/* 1: an append of n fits now; *never: the sequence can never hold it */
static int tg_m_fits(const tg_model *m, int i, int n, int *never) {
  tg_plan pl;
  int ok, g;
  tg_m_plan(m, i, n, &pl);
  *never = pl.never;
  ok = !pl.never && pl.need_main <= m->main.n_free;
  for (g = 0; g < m->sh->n_groups; g++)
    if (tg_is_span(&m->sh->gr[g]) && pl.need[g] > m->gp[g].n_free + pl.rel[g]) ok = 0;
  return ok;
}

static void tg_m_append(tg_model *m, int i, int n) {
  tg_mseq *q = &m->s[i];
  int bs = m->sh->bs, nb_new = tg_cdiv((long)q->len + n, bs), g, k;
  int tail = q->len % bs ? q->len / bs : -1;
  for (g = 0; g < m->sh->n_groups; g++) {
    const kva_layer_group *gr = &m->sh->gr[g];
    tg_pool *p = &m->gp[g];
    int to;
    if (!tg_is_span(gr)) continue;
    to = tg_first_block(gr, bs, q->len);
    if (to > q->nb) to = q->nb;
    for (k = q->from[g]; k < to; k++) {
      if (q->gt[g][k] >= 0) tg_pool_drop(p, q->gt[g][k]);
      q->gt[g][k] = -1;
    }
    if (to > q->from[g]) q->from[g] = to;
    if (tail >= 0 && tail < q->nb && q->gt[g][tail] >= 0 && p->ref[q->gt[g][tail]] > 1) {
      tg_pool_drop(p, q->gt[g][tail]);
      q->gt[g][tail] = tg_pool_take(p);
    }
    for (k = q->nb; k < nb_new; k++) q->gt[g][k] = tg_pool_take(p);
  }
  if (tail >= 0 && m->main.ref[q->main[tail]] > 1) {
    tg_pool_drop(&m->main, q->main[tail]);
    q->main[tail] = tg_pool_take(&m->main);
  }
  for (k = q->nb; k < nb_new; k++) q->main[k] = tg_pool_take(&m->main);
  q->nb = nb_new;
  q->len += n;
  q->step = n;
}

static void tg_m_fork(tg_model *m, int src, int dst) {
  tg_mseq *a = &m->s[src], *b = &m->s[dst];
  int g, k;
  b->live = 1;
  b->len = a->len, b->nb = a->nb, b->step = 0;
  for (k = 0; k < a->nb; k++) b->main[k] = a->main[k], m->main.ref[a->main[k]]++;
  for (g = 0; g < m->sh->n_groups; g++) {
    b->from[g] = a->from[g];
    if (!tg_is_span(&m->sh->gr[g])) continue;
    for (k = 0; k < a->nb; k++) {
      b->gt[g][k] = a->gt[g][k];
      if (a->gt[g][k] >= 0) m->gp[g].ref[a->gt[g][k]]++;
    }
  }
  a->step = 0;
}

/* drop blocks from index kb on */
static void tg_m_cut(tg_model *m, int i, int kb) {
  tg_mseq *q = &m->s[i];
  int g, k;
  for (g = 0; g < m->sh->n_groups; g++) {
    int sinks = tg_sink_blocks(&m->sh->gr[g], m->sh->bs);
    if (!tg_is_span(&m->sh->gr[g])) continue;
    for (k = kb; k < q->nb; k++)
      if (q->gt[g][k] >= 0) tg_pool_drop(&m->gp[g], q->gt[g][k]);
    if (q->from[g] > kb) q->from[g] = kb > sinks ? kb : sinks;
  }
  for (k = kb; k < q->nb; k++) tg_pool_drop(&m->main, q->main[k]);
  if (q->nb > kb) q->nb = kb;
}

static void tg_m_free(tg_model *m, int i) {
  tg_m_cut(m, i, 0);
  m->s[i].live = 0;
  m->s[i].len = 0;
}

/* does every group still hold what a query at position p sees? */
static int tg_m_holds(const tg_model *m, int i, long p) {
  int g;
  for (g = 0; g < m->sh->n_groups; g++) {
    const kva_layer_group *gr = &m->sh->gr[g];
    int first, sinks;
    if (!tg_is_span(gr)) continue;
    first = tg_first_block(gr, m->sh->bs, p);
    sinks = tg_sink_blocks(gr, m->sh->bs);
    if ((first > sinks ? first : sinks) < m->s[i].from[g]) return 0;
  }
  return 1;
}

/* ======================================================================== */
/* Comparisons                                                              */

static void tg_fill_q(kt_rng *r, float *q, size_t n) { kt_fill(r, q, n, -2.0f, 2.0f); }

/* the K and V of every slot of layer l as the plain cache holds them, in double */
static void tg_read_plain(kva_cache *pl, int ps, const tg_shape *s, int l, int len, double *kd, double *vd) {
  float *k = KT_ALLOC(float, (size_t)s->G * s->D), *v = KT_ALLOC(float, (size_t)s->G * s->D);
  int t, i;
  for (t = 0; t < len; t++) {
    kva_status st = kva_seq_read(pl, ps, l, t, k, v, NULL);
    if (st != KVA_OK) KT_CHECK(0, "plain kva_seq_read(layer %d, slot %d) = %d", l, t, (int)st);
    for (i = 0; i < s->G * s->D; i++) {
      kd[(size_t)t * s->G * s->D + i] = (double)k[i];
      vd[(size_t)t * s->G * s->D + i] = (double)v[i];
    }
  }
  free(k);
  free(v);
}

/* out [nq][H][D] and lse [nq][H] against ref.h under a's mask over the plain
   cache's values (queries at len - nq ..) */
static void tg_check_ref(const tg_shape *s, const kva_attn *a, kva_cache *pl, int ps, int l, int len, const float *q,
                         int nq, const float *out, const float *lse, const char *what) {
  size_t kn = (size_t)(len ? len : 1) * s->G * s->D, on = (size_t)nq * s->H * s->D, where = 0;
  double *kd = KT_ALLOC(double, kn), *vd = KT_ALLOC(double, kn), *qd = ref_dup_f(q, on);
  double *od = KT_ALLOC(double, on), *ld = KT_ALLOC(double, (size_t)nq * s->H), err, tol, ratio;
  ref_attn_cfg cfg = ref_cfg(a);
  int i;
  tg_read_plain(pl, ps, s, l, len, kd, vd);
  ref_attend(&cfg, qd, nq, NULL, kd, vd, len, NULL, od, ld);
  err = ref_max_err(out, od, on, &where);
  tol = TG_TOL_OUT * (1.0 + ref_max_abs_d(vd, (size_t)len * s->G * s->D));
  ratio = err / tol;
  if (ratio > tg_worst) tg_worst = ratio;
  KT_CHECK(err <= tol, "%s: %s layer %d len %d nq %d (window %d sink %d chunk %d): |out - ref| %.3g > %.3g at %lu",
           s->label, what, l, len, nq, a->window, a->n_sink, a->chunk_size, err, tol, (unsigned long)where);
  for (i = 0; lse && i < nq * s->H; i++) {
    double e = fabs((double)lse[i] - ld[i]);
    if (!(e <= TG_TOL_LSE * (1.0 + fabs(ld[i])))) {
      KT_CHECK(0, "%s: %s layer %d len %d: lse[%d] %.9g vs ref %.9g", s->label, what, l, len, i, (double)lse[i], ld[i]);
      break;
    }
  }
  tg_refs++;
  free(kd);
  free(vd);
  free(qd);
  free(od);
  free(ld);
}

/* A narrower span than the group's, which the call may ask for: ah is the
   hybrid call's, ap the plain call's (the same visibility). */
static void tg_narrow(kt_rng *r, const tg_shape *s, int l, kva_attn *ah, kva_attn *ap) {
  const kva_layer_group *g = &s->gr[s->lg[l]];
  if (g->kind == KVA_SPAN_WINDOW) {
    switch (kt_int(r, 0, 2)) {
      case 0:
        ah->window = ap->window = kt_int(r, 1, g->window);
        ah->n_sink = ap->n_sink = kt_int(r, 0, g->n_sink);
        break;
      case 1: ah->n_sink = kt_int(r, 0, g->n_sink); break; /* window 0: the group's span, its sinks and all */
      default: ah->chunk_size = ap->chunk_size = kt_int(r, 1, 40); break; /* a chunk on a WINDOW group */
    }
  } else if (g->kind == KVA_SPAN_CHUNK) {
    if (kt_int(r, 0, 1)) {
      ah->window = ap->window = kt_int(r, 1, 60); /* a window on a CHUNK group */
      ah->n_sink = ap->n_sink = kt_int(r, 0, 3);
    } else {
      ah->chunk_size = g->chunk_size; /* the group's own chunk, explicitly */
    }
  } else {
    ah->window = ap->window = kt_int(r, 1, 50);
    ah->n_sink = ap->n_sink = kt_int(r, 0, 4);
  }
}

/* Every layer's attention of the newest nq tokens: the hybrid sequence
   (window 0: its group's span; narrow: sometimes a narrower one) bit for bit
   the plain twin's with the span in kva_attn; against ref.h if check_ref. */
static void tg_cmp_attend(kt_rng *r, const tg_shape *s, kva_cache *hy, int hs, kva_cache *pl, int ps, int nq, int narrow,
                          int check_ref) {
  int len = kva_seq_len(pl, ps), l;
  size_t qn = (size_t)nq * s->H * s->D, ln = (size_t)nq * s->H;
  float *q = KT_ALLOC(float, qn), *o1 = KT_ALLOC(float, qn), *o2 = KT_ALLOC(float, qn);
  float *l1 = KT_ALLOC(float, ln), *l2 = KT_ALLOC(float, ln);
  KT_CHECK(kva_seq_len(hy, hs) == len, "%s: hybrid len %d, plain %d", s->label, kva_seq_len(hy, hs), len);
  for (l = 0; l < s->L; l++) {
    kva_attn ah, ap;
    kva_status st1, st2;
    tg_attn(&ah, s);
    tg_attn(&ap, s);
    tg_layer_mask(s, l, &ap);
    if (narrow && kt_int(r, 0, 2) == 0) tg_narrow(r, s, l, &ah, &ap);
    tg_fill_q(r, q, qn);
    kt_fill_sentinel(o1, qn);
    kt_fill_sentinel(o2, qn);
    st1 = kva_attend_cache_lse(hy, hs, l, &ah, q, nq, o1, l1);
    st2 = kva_attend_cache_lse(pl, ps, l, &ap, q, nq, o2, l2);
    KT_CHECK(st1 == KVA_OK && st2 == KVA_OK, "%s: attend layer %d: hybrid %d, plain %d (call window %d sink %d chunk %d)",
             s->label, l, (int)st1, (int)st2, ah.window, ah.n_sink, ah.chunk_size);
    if (st1 != KVA_OK || st2 != KVA_OK) continue;
    KT_CHECK(kt_same_bits(o1, o2, qn) && kt_same_bits(l1, l2, ln),
             "%s: layer %d (group %d) len %d nq %d: hybrid attention differs from the plain cache's (window %d sink %d "
             "chunk %d)",
             s->label, l, s->lg[l], len, nq, ap.window, ap.n_sink, ap.chunk_size);
    tg_bitwise++;
    if (check_ref) tg_check_ref(s, &ap, pl, ps, l, len, q, nq, o1, l1, "attend_cache");
  }
  free(q);
  free(o1);
  free(o2);
  free(l1);
  free(l2);
}

/* Every slot of every layer: a held token reads back as the plain twin's,
   bit for bit, at its slot; a released one is KVA_ERR_UNSUPPORTED.  from
   (the model's released blocks [sinks, from[g]) per group), or NULL: then a
   token a query at p_next or later sees must be held (and equal), another
   may be either (an import keeps zeros for it). */
static void tg_cmp_read(const tg_shape *s, int bs, kva_cache *hy, int hs, kva_cache *pl, int ps, const int *from,
                        long p_next) {
  size_t n = (size_t)s->G * s->D;
  float *k1 = KT_ALLOC(float, n), *v1 = KT_ALLOC(float, n), *k2 = KT_ALLOC(float, n), *v2 = KT_ALLOC(float, n);
  int32_t pos[3];
  int len = kva_seq_len(pl, ps), l, t, g, bad = 0;
  for (l = 0; l < s->L && !bad; l++) {
    const kva_layer_group *gr = &s->gr[s->lg[l]];
    int sinks = tg_sink_blocks(gr, bs);
    /* the first position a query at p_next or later sees (sinks aside) */
    long first = gr->kind == KVA_SPAN_WINDOW ? p_next - gr->window + 1
                 : gr->kind == KVA_SPAN_CHUNK ? p_next / gr->chunk_size * gr->chunk_size
                                              : 0;
    for (t = 0; t < len && !bad; t++) {
      int b = t / bs, released = -1, needed = t >= first || (gr->kind == KVA_SPAN_WINDOW && t < gr->n_sink);
      kva_status st = kva_seq_read(hy, hs, l, t, k1, v1, pos);
      if (!tg_is_span(gr)) released = 0;
      else if (from) released = b >= sinks && b < from[s->lg[l]];
      else if (needed) released = 0;
      if (released == 1 || (released == -1 && st != KVA_OK)) {
        KT_CHECK(st == KVA_ERR_UNSUPPORTED, "%s: layer %d slot %d (released) reads %d, want UNSUPPORTED", s->label, l, t,
                 (int)st);
        bad |= st != KVA_ERR_UNSUPPORTED;
        continue;
      }
      KT_CHECK(st == KVA_OK, "%s: layer %d slot %d (held) reads %d, want OK", s->label, l, t, (int)st);
      if (st != KVA_OK) {
        bad = 1;
        continue;
      }
      if (!needed && !from) continue;
      KT_STATUS(kva_seq_read(pl, ps, l, t, k2, v2, NULL), KVA_OK);
      for (g = 0; g < s->G; g++) bad |= pos[g] != t;
      if (!kt_same_bits(k1, k2, n) || !kt_same_bits(v1, v2, n) || bad) {
        KT_CHECK(0, "%s: layer %d slot %d reads back differently from the plain cache (pos %d)", s->label, l, t, pos[0]);
        bad = 1;
      }
    }
  }
  if (!bad) kt_pass++;
  free(k1);
  free(v1);
  free(k2);
  free(v2);
}

/* Random K and V for the newest n tokens of every layer, the same into both
   caches (pl may be NULL). */
static void tg_store(kt_rng *r, const tg_shape *s, kva_cache *hy, int hs, kva_cache *pl, int ps, int n) {
  size_t kn = (size_t)n * s->G * s->D;
  float *k = KT_ALLOC(float, kn), *v = KT_ALLOC(float, kn);
  int l;
  for (l = 0; l < s->L; l++) {
    kt_fill(r, k, kn, -1.0f, 1.0f);
    kt_fill(r, v, kn, -1.0f, 1.0f);
    KT_STATUS(kva_store(hy, hs, l, k, v, n), KVA_OK);
    if (pl) KT_STATUS(kva_store(pl, ps, l, k, v, n), KVA_OK);
  }
  free(k);
  free(v);
}

/* ======================================================================== */
/* A twin: a hybrid cache, a plain one, the model, and their sequences      */

typedef struct {
  tg_shape *sh;
  kva_cache *hy, *pl;
  tg_model m;
  int hid[TG_MAXS], pid[TG_MAXS];
} tg_twin;

static void tg_twin_init(tg_twin *t, tg_shape *sh, int main_blocks, int max_seqs) {
  kva_cache_desc d;
  tg_label(sh);
  t->sh = sh;
  tg_desc(&d, sh, main_blocks, max_seqs, 1, 0);
  t->hy = tg_create(&d, sh->label);
  tg_desc(&d, sh, main_blocks, max_seqs, 0, 0);
  t->pl = tg_create(&d, sh->label);
  tg_model_init(&t->m, sh, main_blocks);
}
static void tg_twin_done(tg_twin *t) {
  kva_cache_destroy(t->hy);
  kva_cache_destroy(t->pl);
  tg_model_done(&t->m);
}

static void tg_twin_new(tg_twin *t, int i) {
  KT_STATUS(kva_seq_new(t->hy, &t->hid[i]), KVA_OK);
  KT_STATUS(kva_seq_new(t->pl, &t->pid[i]), KVA_OK);
  tg_m_new(&t->m, i);
}

/* stats against the model and the plain cache */
static void tg_twin_stats(tg_twin *t) {
  const tg_shape *s = t->sh;
  kva_cache_stats hs, ps;
  int g, l, n_full = 0, n_in[KVA_MAX_GROUPS], sum_cap = 0, sum_used = 0;
  size_t lb, want;
  kva_cache_get_stats(t->hy, &hs);
  kva_cache_get_stats(t->pl, &ps);
  memset(n_in, 0, sizeof n_in);
  for (l = 0; l < s->L; l++) {
    if (tg_is_span(&s->gr[s->lg[l]])) n_in[s->lg[l]]++;
    else n_full++;
  }
  lb = ps.block_bytes / (size_t)s->L; /* every layer has the same type: one layer's block */
  want = lb * (size_t)n_full * (size_t)tg_pool_used(&t->m.main);
  for (g = 0; g < s->n_groups; g++) {
    if (!tg_is_span(&s->gr[g])) continue;
    sum_cap += t->m.gp[g].cap;
    sum_used += tg_pool_used(&t->m.gp[g]);
    want += lb * (size_t)n_in[g] * (size_t)tg_pool_used(&t->m.gp[g]);
  }
  KT_CHECK(ps.block_bytes % (size_t)s->L == 0 && hs.block_bytes == lb * (size_t)n_full,
           "%s: block_bytes hybrid %lu, plain %lu (%d FULL layers of %d)", s->label, (unsigned long)hs.block_bytes,
           (unsigned long)ps.block_bytes, n_full, s->L);
  KT_CHECK(hs.blocks_used == tg_pool_used(&t->m.main) && ps.blocks_used == hs.blocks_used,
           "%s: blocks_used hybrid %d, plain %d, model %d", s->label, hs.blocks_used, ps.blocks_used,
           tg_pool_used(&t->m.main));
  KT_CHECK(hs.group_blocks == sum_cap, "%s: group_blocks %d, want %d", s->label, hs.group_blocks, sum_cap);
  KT_CHECK(hs.group_blocks_used == sum_used, "%s: group_blocks_used %d, model %d", s->label, hs.group_blocks_used,
           sum_used);
  KT_CHECK(hs.bytes_used == want, "%s: bytes_used %lu, want %lu", s->label, (unsigned long)hs.bytes_used,
           (unsigned long)want);
  KT_CHECK(ps.bytes_used == ps.block_bytes * (size_t)ps.blocks_used && ps.group_blocks == 0 && ps.group_blocks_used == 0,
           "%s: plain cache bytes_used %lu, group blocks %d / %d", s->label, (unsigned long)ps.bytes_used,
           ps.group_blocks_used, ps.group_blocks);
  KT_CHECK(hs.bytes_used <= ps.bytes_used, "%s: hybrid holds %lu bytes, plain %lu", s->label,
           (unsigned long)hs.bytes_used, (unsigned long)ps.bytes_used);
  KT_CHECK(hs.tokens_held == ps.tokens_held && hs.n_seqs == ps.n_seqs, "%s: tokens_held %ld / %ld, n_seqs %d / %d",
           s->label, hs.tokens_held, ps.tokens_held, hs.n_seqs, ps.n_seqs);
}

/* a failed append changed nothing (but the count of failed appends) */
static int tg_same_stats(const kva_cache_stats *a, const kva_cache_stats *b) {
  return kt_stats_equal(a, b, 1) && a->group_blocks_used == b->group_blocks_used && a->bytes_used == b->bytes_used;
}

/* Append n to sequence i as the model says: fits and the status, and on
   success the plain twin too and K / V stored in both. Returns 1 if appended. */
static int tg_twin_append(kt_rng *r, tg_twin *t, int i, int n, int store) {
  int never, ok = tg_m_fits(&t->m, i, n, &never), want = ok ? KVA_FITS_NOW : never ? KVA_FITS_NEVER : KVA_FITS_LATER;
  int got = (int)kva_seq_fits(t->hy, t->hid[i], n, NULL), len = t->m.s[i].len;
  kva_cache_stats before, after;
  kva_status st;
  KT_CHECK(got == want, "%s: kva_seq_fits(seq len %d, %d) = %d, the model says %d", t->sh->label, len, n, got, want);
  kva_cache_get_stats(t->hy, &before);
  st = kva_seq_append(t->hy, t->hid[i], n);
  if (!ok) {
    KT_CHECK(st == KVA_ERR_FULL, "%s: append(len %d, %d) = %d, the model says FULL", t->sh->label, len, n, (int)st);
    kva_cache_get_stats(t->hy, &after);
    KT_CHECK(tg_same_stats(&before, &after) && kva_seq_len(t->hy, t->hid[i]) == len,
             "%s: a failed append changed the cache", t->sh->label);
    if (st == KVA_OK) { /* keep the twins in step */
      KT_STATUS(kva_seq_append(t->pl, t->pid[i], n), KVA_OK);
      tg_m_append(&t->m, i, n);
      if (store) tg_store(r, t->sh, t->hy, t->hid[i], t->pl, t->pid[i], n);
      return 1;
    }
    return 0;
  }
  KT_CHECK(st == KVA_OK, "%s: append(len %d, %d) = %d, the model says it fits", t->sh->label, len, n, (int)st);
  if (st != KVA_OK) return 0;
  KT_STATUS(kva_seq_append(t->pl, t->pid[i], n), KVA_OK);
  tg_m_append(&t->m, i, n);
  if (store) tg_store(r, t->sh, t->hy, t->hid[i], t->pl, t->pid[i], n);
  return 1;
}

static void tg_twin_fork(tg_twin *t, int src, int dst) {
  KT_STATUS(kva_seq_fork(t->hy, t->hid[src], &t->hid[dst]), KVA_OK);
  KT_STATUS(kva_seq_fork(t->pl, t->pid[src], &t->pid[dst]), KVA_OK);
  tg_m_fork(&t->m, src, dst);
}

static void tg_twin_free(tg_twin *t, int i) {
  KT_STATUS(kva_seq_free(t->hy, t->hid[i]), KVA_OK);
  KT_STATUS(kva_seq_free(t->pl, t->pid[i]), KVA_OK);
  tg_m_free(&t->m, i);
}

static int tg_step_size(kt_rng *r) { return kt_int(r, 0, 1) ? 1 : kt_int(r, 2, 20); }

/* ======================================================================== */
/* 1. hybrid == plain, randomized                                           */

static void tg_test_equal(void) {
  kt_rng r;
  int it, iters = kt_iters(80);
  kt_begin("groups: hybrid == plain cache");
  kt_seed(&r, 0x6001);
  for (it = 0; it < iters; it++) {
    tg_shape sh;
    tg_twin t;
    int maxlen, g, nb, steps = 0;
    tg_random_shape(&r, &sh, 1);
    maxlen = kt_int(&r, 10, kt_quick ? 80 : 150);
    nb = tg_cdiv(maxlen + 20, sh.bs) + 2;
    for (g = 0; g < sh.n_groups; g++)
      if (tg_is_span(&sh.gr[g])) sh.gr[g].n_blocks = nb;
    tg_twin_init(&t, &sh, nb, 2);
    tg_twin_new(&t, 0);
    while (t.m.s[0].len < maxlen) {
      int n = tg_step_size(&r), nq;
      if (!tg_twin_append(&r, &t, 0, n, 1)) break;
      nq = kt_int(&r, 0, 2) ? n : kt_int(&r, 1, n);
      tg_cmp_attend(&r, &sh, t.hy, t.hid[0], t.pl, t.pid[0], nq, 1, (steps++ & 1) == 0 || n > 1);
      tg_twin_stats(&t);
      tg_cmp_read(&sh, sh.bs, t.hy, t.hid[0], t.pl, t.pid[0], t.m.s[0].from, t.m.s[0].len - n);
    }
    tg_twin_free(&t, 0);
    tg_twin_stats(&t);
    tg_twin_done(&t);
  }
}

/* kva_gqa_forward: window 0 on the hybrid layer == the plain layer with the span */
static void tg_test_gqa(void) {
  kt_rng r;
  int it, iters = kt_iters(6);
  kt_begin("groups: kva_gqa_forward");
  kt_seed(&r, 0x6002);
  for (it = 0; it < iters; it++) {
    tg_shape sh;
    tg_twin t;
    int dm = 12, nb, g, l, len = 0, maxlen = kt_int(&r, 30, 90);
    float *wq, *wk, *wv, *wo, *x, *y1, *y2;
    tg_random_shape(&r, &sh, 0);
    sh.dt = it % 2 ? KVA_F16 : KVA_F32;
    nb = tg_cdiv(maxlen + 20, sh.bs) + 2;
    for (g = 0; g < sh.n_groups; g++)
      if (tg_is_span(&sh.gr[g])) sh.gr[g].n_blocks = nb;
    tg_twin_init(&t, &sh, nb, 1);
    tg_twin_new(&t, 0);
    wq = KT_ALLOC(float, (size_t)sh.H * sh.D * dm);
    wk = KT_ALLOC(float, (size_t)sh.G * sh.D * dm);
    wv = KT_ALLOC(float, (size_t)sh.G * sh.D * dm);
    wo = KT_ALLOC(float, (size_t)sh.H * sh.D * dm);
    x = KT_ALLOC(float, (size_t)20 * dm);
    y1 = KT_ALLOC(float, (size_t)20 * dm);
    y2 = KT_ALLOC(float, (size_t)20 * dm);
    kt_fill(&r, wq, (size_t)sh.H * sh.D * dm, -0.5f, 0.5f);
    kt_fill(&r, wk, (size_t)sh.G * sh.D * dm, -0.5f, 0.5f);
    kt_fill(&r, wv, (size_t)sh.G * sh.D * dm, -0.5f, 0.5f);
    kt_fill(&r, wo, (size_t)sh.H * sh.D * dm, -0.5f, 0.5f);
    while (len < maxlen) {
      int n = tg_step_size(&r);
      if (!tg_twin_append(&r, &t, 0, n, 0)) break;
      len += n;
      for (l = 0; l < sh.L; l++) {
        kva_gqa_layer L1, L2;
        memset(&L1, 0, sizeof L1);
        L1.d_model = dm;
        tg_attn(&L1.attn, &sh);
        L1.wq = wq, L1.wk = wk, L1.wv = wv, L1.wo = wo;
        L1.rope.theta = 10000.0f;
        L1.rope.dim = sh.D & ~1; /* RoPE pairs: an even dim (even unrotated, kva_gqa_forward wants one) */
        L2 = L1;
        tg_layer_mask(&sh, l, &L2.attn);
        kt_fill(&r, x, (size_t)n * dm, -1.0f, 1.0f);
        KT_STATUS(kva_gqa_forward(&L1, t.hy, t.hid[0], l, x, n, y1), KVA_OK);
        KT_STATUS(kva_gqa_forward(&L2, t.pl, t.pid[0], l, x, n, y2), KVA_OK);
        KT_CHECK(kt_same_bits(y1, y2, (size_t)n * dm), "%s: gqa_forward layer %d len %d differs from the plain cache's",
                 sh.label, l, len);
        if (tg_is_span(&sh.gr[sh.lg[l]]) && sh.gr[sh.lg[l]].kind == KVA_SPAN_WINDOW) {
          L1.attn.window = sh.gr[sh.lg[l]].window + 1; /* wider than the group's */
          KT_STATUS(kva_gqa_forward(&L1, t.hy, t.hid[0], l, x, n, y1), KVA_ERR_ARG);
        }
      }
      tg_twin_stats(&t);
    }
    tg_cmp_attend(&r, &sh, t.hy, t.hid[0], t.pl, t.pid[0], t.m.s[0].step, 0, 1);
    free(wq);
    free(wk);
    free(wv);
    free(wo);
    free(x);
    free(y1);
    free(y2);
    tg_twin_done(&t);
  }
}

/* ======================================================================== */
/* 2. batched attention                                                     */

static void tg_test_batch(void) {
  kt_rng r;
  int it, iters = kt_iters(14);
  kt_begin("groups: kva_attend_batch");
  kt_seed(&r, 0x6003);
  for (it = 0; it < iters; it++) {
    tg_shape sh;
    tg_twin t;
    int n_seq = kt_int(&r, 2, 3), maxlen = kt_int(&r, 20, kt_quick ? 60 : 120), nb, g, i, round;
    tg_random_shape(&r, &sh, 1);
    nb = n_seq * (tg_cdiv(maxlen + 40, sh.bs) + 2);
    for (g = 0; g < sh.n_groups; g++)
      if (tg_is_span(&sh.gr[g])) sh.gr[g].n_blocks = nb;
    tg_twin_init(&t, &sh, nb, 4);
    for (i = 0; i < n_seq; i++) {
      tg_twin_new(&t, i);
      tg_twin_append(&r, &t, i, kt_int(&r, 1, 30), 1); /* different lengths */
    }
    for (round = 0; round < (kt_quick ? 3 : 6); round++) {
      int nt[3], ids_h[3], ids_p[3], nq[3], rows = 0, l, never;
      size_t qn, ln;
      float *q, *o1, *o2, *o3, *l1, *l2, *l3;
      kva_batch *bh = NULL, *bp[KVA_MAX_GROUPS];
      kva_attn a;
      int okall = 1;
      for (i = 0; i < n_seq; i++) {
        nt[i] = kt_int(&r, 0, 3) ? kt_int(&r, 1, 3) : kt_int(&r, 4, 24);
        okall &= tg_m_fits(&t.m, i, nt[i], &never); /* alone; the pools hold everything together */
        ids_h[i] = t.hid[i];
        ids_p[i] = t.pid[i];
      }
      KT_CHECK(okall, "%s: model: batch does not fit", sh.label);
      KT_STATUS(kva_seq_append_all(t.hy, ids_h, nt, n_seq), KVA_OK);
      KT_STATUS(kva_seq_append_all(t.pl, ids_p, nt, n_seq), KVA_OK);
      for (i = 0; i < n_seq; i++) {
        tg_m_append(&t.m, i, nt[i]);
        tg_store(&r, &sh, t.hy, t.hid[i], t.pl, t.pid[i], nt[i]);
        nq[i] = kt_int(&r, 0, 1) ? nt[i] : kt_int(&r, 0, nt[i]);
        rows += nq[i];
      }
      tg_twin_stats(&t);
      qn = (size_t)(rows ? rows : 1) * sh.H * sh.D;
      ln = (size_t)(rows ? rows : 1) * sh.H;
      q = KT_ALLOC(float, qn), o1 = KT_ALLOC(float, qn), o2 = KT_ALLOC(float, qn), o3 = KT_ALLOC(float, qn);
      l1 = KT_ALLOC(float, ln), l2 = KT_ALLOC(float, ln), l3 = KT_ALLOC(float, ln);
      tg_attn(&a, &sh);
      KT_STATUS(kva_batch_plan(t.hy, &a, ids_h, nq, n_seq, &bh), KVA_OK);
      for (g = 0; g < sh.n_groups; g++) {
        kva_attn ap;
        int l0 = -1;
        bp[g] = NULL;
        for (l = 0; l < sh.L; l++)
          if (sh.lg[l] == g) l0 = l;
        if (l0 < 0) continue;
        tg_attn(&ap, &sh);
        tg_layer_mask(&sh, l0, &ap);
        KT_STATUS(kva_batch_plan(t.pl, &ap, ids_p, nq, n_seq, &bp[g]), KVA_OK);
      }
      for (l = 0; l < sh.L && bh; l++) {
        int row = 0;
        tg_fill_q(&r, q, qn);
        kt_fill_sentinel(o1, qn);
        kt_fill_sentinel(o2, qn);
        KT_STATUS(kva_attend_batch_lse(t.hy, bh, l, q, o1, l1), KVA_OK);
        if (bp[sh.lg[l]]) KT_STATUS(kva_attend_batch_lse(t.pl, bp[sh.lg[l]], l, q, o2, l2), KVA_OK);
        KT_CHECK(kt_same_bits(o1, o2, (size_t)rows * sh.H * sh.D) && kt_same_bits(l1, l2, (size_t)rows * sh.H),
                 "%s: layer %d: hybrid batch differs from the plain cache's", sh.label, l);
        tg_bitwise++;
        for (i = 0; i < n_seq; i++) {
          size_t off = (size_t)row * sh.H * sh.D, nn = (size_t)nq[i] * sh.H * sh.D;
          if (nq[i] > 0) {
            kva_attn ap;
            KT_STATUS(kva_attend_cache_lse(t.hy, t.hid[i], l, &a, q + off, nq[i], o3, l3), KVA_OK);
            KT_CHECK(kt_same_bits(o1 + off, o3, nn) && kt_same_bits(l1 + (size_t)row * sh.H, l3, (size_t)nq[i] * sh.H),
                     "%s: layer %d seq %d: batch rows differ from kva_attend_cache_lse", sh.label, l, i);
            tg_attn(&ap, &sh);
            tg_layer_mask(&sh, l, &ap);
            if (round == 0 || l == 0)
              tg_check_ref(&sh, &ap, t.pl, t.pid[i], l, t.m.s[i].len, q + off, nq[i], o1 + off, l1 + (size_t)row * sh.H,
                           "batch");
          }
          row += nq[i];
        }
        if (sh.gr[sh.lg[l]].kind == KVA_SPAN_WINDOW && rows > 0) { /* a plan wider than the group: refused */
          kva_attn aw;
          kva_batch *bw = NULL;
          tg_attn(&aw, &sh);
          aw.window = sh.gr[sh.lg[l]].window + 1;
          KT_STATUS(kva_batch_plan(t.hy, &aw, ids_h, nq, n_seq, &bw), KVA_OK);
          kt_fill_sentinel(o3, qn);
          KT_STATUS(kva_attend_batch(t.hy, bw, l, q, o3), KVA_ERR_ARG);
          KT_CHECK(kt_all_sentinel(o3, (size_t)rows * sh.H * sh.D), "%s: a refused batch wrote its output", sh.label);
          kva_batch_free(bw);
        }
      }
      kva_batch_free(bh);
      for (g = 0; g < sh.n_groups; g++) kva_batch_free(bp[g]);
      free(q), free(o1), free(o2), free(o3), free(l1), free(l2), free(l3);
    }
    for (i = 0; i < n_seq; i++) tg_twin_free(&t, i);
    tg_twin_stats(&t);
    tg_twin_done(&t);
  }
}

/* ======================================================================== */
/* 3. fork / copy-on-write                                                  */

static void tg_test_fork(void) {
  kt_rng r;
  int it, iters = kt_iters(14);
  kt_begin("groups: fork / copy-on-write");
  kt_seed(&r, 0x6004);
  for (it = 0; it < iters; it++) {
    tg_shape sh;
    tg_twin t;
    int nb, g, i, k, n_live = 1, mid = kt_int(&r, 1, 70), extra = kt_int(&r, 10, 70);
    int live[TG_MAXS];
    tg_random_shape(&r, &sh, 1);
    nb = 4 * (tg_cdiv(mid + extra + 40, sh.bs) + 2);
    for (g = 0; g < sh.n_groups; g++)
      if (tg_is_span(&sh.gr[g])) sh.gr[g].n_blocks = nb;
    tg_twin_init(&t, &sh, nb, TG_MAXS);
    memset(live, 0, sizeof live);
    tg_twin_new(&t, 0);
    live[0] = 1;
    while (t.m.s[0].len < mid) tg_twin_append(&r, &t, 0, tg_step_size(&r), 1);
    tg_twin_fork(&t, 0, 1);
    live[1] = 1, n_live = 2;
    tg_twin_stats(&t);
    if (kt_int(&r, 0, 1)) { /* a fork of the fork */
      tg_twin_fork(&t, 1, 2);
      live[2] = 1, n_live = 3;
      tg_twin_stats(&t);
    }
    for (k = 0; k < 12; k++)
      for (i = 0; i < TG_MAXS; i++) {
        int n;
        if (!live[i]) continue;
        n = tg_step_size(&r);
        if (!tg_twin_append(&r, &t, i, n, 1)) continue;
        tg_cmp_attend(&r, &sh, t.hy, t.hid[i], t.pl, t.pid[i], n, 0, k % 4 == 0);
        tg_twin_stats(&t);
        tg_cmp_read(&sh, sh.bs, t.hy, t.hid[i], t.pl, t.pid[i], t.m.s[i].from, t.m.s[i].len - n);
      }
    /* free one: the stats come back as the model says */
    for (i = TG_MAXS - 1; i >= 0 && n_live > 0; i--) {
      kva_cache_stats before, after;
      if (!live[i]) continue;
      kva_cache_get_stats(t.hy, &before);
      tg_twin_free(&t, i);
      live[i] = 0, n_live--;
      kva_cache_get_stats(t.hy, &after);
      KT_CHECK(after.group_blocks_used <= before.group_blocks_used && after.bytes_used <= before.bytes_used,
               "%s: freeing a fork raised the stats", sh.label);
      tg_twin_stats(&t);
      for (k = 0; k < TG_MAXS; k++) /* the others are untouched */
        if (live[k]) {
          tg_twin_append(&r, &t, k, 1, 1);
          tg_cmp_attend(&r, &sh, t.hy, t.hid[k], t.pl, t.pid[k], 1, 0, 0);
        }
    }
    {
      kva_cache_stats st;
      kva_cache_get_stats(t.hy, &st);
      KT_CHECK(st.blocks_used == 0 && st.group_blocks_used == 0 && st.bytes_used == 0 && st.n_seqs == 0,
               "%s: after freeing everything: blocks_used %d, group_blocks_used %d, bytes_used %lu", sh.label,
               st.blocks_used, st.group_blocks_used, (unsigned long)st.bytes_used);
    }
    tg_twin_done(&t);
  }
}

/* ======================================================================== */
/* 4. errors change nothing                                                 */

/* random appends, forks and frees on small group pools: fits and FULL as the model says */
static void tg_test_exhaustion(void) {
  kt_rng r;
  int it, iters = kt_iters(30);
  long n_full = 0, n_later = 0, n_never = 0;
  kt_begin("groups: a group's pool runs out");
  kt_seed(&r, 0x6005);
  for (it = 0; it < iters; it++) {
    tg_shape sh;
    tg_twin t;
    int nb, g, op, live[TG_MAXS], any = 0;
    tg_random_shape(&r, &sh, 0);
    sh.bs = kt_int(&r, 1, 6);
    if (!tg_is_span(&sh.gr[0])) { /* at least one group of each test's own */
      sh.gr[0].kind = KVA_SPAN_WINDOW;
      sh.gr[0].window = kt_int(&r, 1, 12);
      sh.gr[0].n_sink = kt_int(&r, 0, 3);
    }
    nb = 400;
    for (g = 0; g < sh.n_groups; g++)
      if (tg_is_span(&sh.gr[g])) sh.gr[g].n_blocks = kt_int(&r, 3, 14);
    tg_twin_init(&t, &sh, nb, TG_MAXS);
    memset(live, 0, sizeof live);
    for (op = 0; op < (kt_quick ? 40 : 120); op++) {
      int i = kt_int(&r, 0, TG_MAXS - 1), u = kt_int(&r, 0, 19);
      if (!live[i]) {
        if (u < 10) {
          tg_twin_new(&t, i);
          live[i] = 1;
        }
        continue;
      }
      if (u < 13) {
        int never, n = kt_int(&r, 0, 2) ? kt_int(&r, 1, 3) : kt_int(&r, 4, 30), ok = tg_m_fits(&t.m, i, n, &never);
        if (t.m.s[i].len + n > 300) continue;
        n_full += !ok;
        n_never += !ok && never;
        n_later += !ok && !never;
        if (tg_twin_append(&r, &t, i, n, 1)) {
          tg_cmp_attend(&r, &sh, t.hy, t.hid[i], t.pl, t.pid[i], n, 0, 0);
          any = 1;
        }
      } else if (u < 15) {
        int j;
        for (j = 0; j < TG_MAXS && live[j]; j++) {
        }
        if (j < TG_MAXS) {
          tg_twin_fork(&t, i, j);
          live[j] = 1;
        }
      } else if (u < 17) {
        tg_twin_free(&t, i);
        live[i] = 0;
      } else { /* kva_seq_append_all over every live sequence: all or nothing */
        int ids[TG_MAXS], pids[TG_MAXS], ns[TG_MAXS], idx[TG_MAXS], m = 0, j, okall = 1, never;
        kva_cache_stats before, after;
        tg_model *mm = &t.m;
        kva_status st;
        for (j = 0; j < TG_MAXS; j++)
          if (live[j] && t.m.s[j].len < 250) ids[m] = t.hid[j], pids[m] = t.pid[j], ns[m] = kt_int(&r, 0, 6), idx[m++] = j;
        /* the documented check: every plan against the pools as they are now, chained (each append's new blocks
           come out of what the ones before it left, with the blocks their groups release); then one after
           another on a copy of the model, which must then succeed */
        {
          tg_model sim;
          int av_main = mm->main.n_free, av[KVA_MAX_GROUPS], gg;
          for (gg = 0; gg < sh.n_groups; gg++) av[gg] = mm->gp[gg].n_free;
          for (j = 0; j < m && okall; j++) {
            tg_plan pl;
            if (ns[j] == 0) continue;
            tg_m_plan(mm, idx[j], ns[j], &pl);
            if (pl.never || pl.need_main > av_main) okall = 0;
            av_main -= pl.need_main;
            for (gg = 0; gg < sh.n_groups; gg++) {
              if (!tg_is_span(&sh.gr[gg])) continue;
              if (pl.need[gg] > av[gg] + pl.rel[gg]) okall = 0;
              av[gg] += pl.rel[gg] - pl.need[gg];
            }
          }
          tg_model_init(&sim, &sh, nb);
          tg_model_copy(&sim, mm);
          for (j = 0; j < m && okall; j++) {
            int fits;
            if (ns[j] == 0) continue;
            fits = tg_m_fits(&sim, idx[j], ns[j], &never);
            KT_CHECK(fits, "model: a chained append_all plan does not fit one after another");
            if (fits) tg_m_append(&sim, idx[j], ns[j]);
          }
          kva_cache_get_stats(t.hy, &before);
          st = kva_seq_append_all(t.hy, ids, ns, m);
          KT_CHECK(st == (okall ? KVA_OK : KVA_ERR_FULL), "%s: append_all over %d = %d, the model says %s", sh.label, m,
                   (int)st, okall ? "OK" : "FULL");
          if (st != (okall ? KVA_OK : KVA_ERR_FULL) && getenv("TG_DEBUG")) {
            for (j = 0; j < m; j++) {
              int nv, f = tg_m_fits(mm, idx[j], ns[j], &nv);
              printf("  seq %d len %d +%d: alone %d, lib fits %d\n", idx[j], mm->s[idx[j]].len, ns[j], f,
                     (int)kva_seq_fits(t.hy, ids[j], ns[j], NULL));
            }
          }
          if (st == KVA_OK) {
            KT_STATUS(kva_seq_append_all(t.pl, pids, ns, m), KVA_OK);
            tg_model_copy(mm, &sim);
            for (j = 0; j < m; j++) mm->s[idx[j]].step = ns[j];
          } else {
            kva_cache_get_stats(t.hy, &after);
            KT_CHECK(tg_same_stats(&before, &after), "%s: a failed append_all changed the cache", sh.label);
          }
          tg_model_done(&sim);
          if (st == KVA_OK)
            for (j = 0; j < m; j++)
              if (ns[j]) {
                tg_store(&r, &sh, t.hy, ids[j], t.pl, pids[j], ns[j]);
                tg_cmp_attend(&r, &sh, t.hy, ids[j], t.pl, pids[j], ns[j], 0, 0);
              }
          if (st != (okall ? KVA_OK : KVA_ERR_FULL)) break; /* out of step: stop this shape */
        }
      }
      tg_twin_stats(&t);
    }
    (void)any;
    tg_twin_done(&t);
  }
  KT_CHECK(kt_quick || (n_full > 10 && n_later > 0 && n_never > 0),
           "coverage (full runs): %ld full appends (%ld later, %ld never)", n_full, n_later, n_never);
}

/* a group pool of 0 blocks: derived from max_seqs and the span; decode
   steps of max_seqs sequences never run it out */
static void tg_test_derived(void) {
  kt_rng r;
  int it, iters = kt_iters(12);
  kt_begin("groups: derived pool sizes");
  kt_seed(&r, 0x6006);
  for (it = 0; it < iters; it++) {
    tg_shape sh;
    kva_cache_desc d;
    kva_cache *c;
    kva_cache_stats st;
    int g, want = 0, ms = kt_int(&r, 1, 3), main_blocks = kt_int(&r, 20, 400), i, k, ids[3], reach = 0, fails = 0;
    tg_random_shape(&r, &sh, 0);
    tg_label(&sh);
    for (g = 0; g < sh.n_groups; g++) {
      const kva_layer_group *x = &sh.gr[g];
      long per;
      int rr = x->kind == KVA_SPAN_WINDOW ? x->window : x->chunk_size;
      if (!tg_is_span(x)) continue;
      /* the sinks' blocks, the most blocks `reach` consecutive tokens touch, one more */
      per = tg_sink_blocks(x, sh.bs) + (rr + sh.bs - 2) / sh.bs + 1 + 1;
      want += (long)ms * per < main_blocks ? (int)(ms * per) : main_blocks;
      if (rr > reach) reach = rr;
    }
    tg_desc(&d, &sh, main_blocks, ms, 1, 0);
    c = tg_create(&d, sh.label);
    kva_cache_get_stats(c, &st);
    KT_CHECK(st.group_blocks == want, "%s: derived group pools %d blocks, want %d (max_seqs %d, main %d)", sh.label,
             st.group_blocks, want, ms, main_blocks);
    for (i = 0; i < ms; i++) KT_STATUS(kva_seq_new(c, &ids[i]), KVA_OK);
    for (k = 0; k < 3 * reach + 10 && (k + 1) * ms <= main_blocks * sh.bs - ms * sh.bs; k++)
      for (i = 0; i < ms; i++) fails += kva_seq_append(c, ids[i], 1) != KVA_OK;
    KT_CHECK(fails == 0 || want >= main_blocks, "%s: %d decode appends failed in derived pools", sh.label, fails);
    kva_cache_destroy(c);
  }
}

/* truncate and accept: refused when a group released what the next query
   sees (nothing changes), else the same as the plain twin */
static void tg_test_truncate(void) {
  kt_rng r;
  int it, iters = kt_iters(24);
  long n_refused = 0, n_done = 0;
  kt_begin("groups: truncate / accept");
  kt_seed(&r, 0x6007);
  for (it = 0; it < iters; it++) {
    tg_shape sh;
    tg_twin t;
    int nb, g, op;
    tg_random_shape(&r, &sh, 1);
    nb = tg_cdiv(400, sh.bs) + 4;
    for (g = 0; g < sh.n_groups; g++)
      if (tg_is_span(&sh.gr[g])) sh.gr[g].n_blocks = nb;
    tg_twin_init(&t, &sh, nb, 2);
    tg_twin_new(&t, 0);
    for (op = 0; op < (kt_quick ? 12 : 30); op++) {
      tg_mseq *q = &t.m.s[0];
      int u = kt_int(&r, 0, 5), len = q->len, step = q->step;
      if (u < 3 || len == 0 || len > 300) {
        int n = tg_step_size(&r);
        if (len > 300) {
          KT_STATUS(kva_seq_truncate(t.hy, t.hid[0], len - step), KVA_OK); /* within the step: always */
          KT_STATUS(kva_seq_truncate(t.pl, t.pid[0], len - step), KVA_OK);
          tg_m_cut(&t.m, 0, tg_cdiv(len - step, sh.bs));
          q->len = len - step, q->step = 0;
        }
        if (tg_twin_append(&r, &t, 0, n, 1)) tg_cmp_attend(&r, &sh, t.hy, t.hid[0], t.pl, t.pid[0], n, 0, 0);
      } else if (u < 5) { /* truncate: within the newest step, or anywhere */
        int keep = kt_int(&r, 0, 1) && step > 0 ? kt_int(&r, len - step, len) : kt_int(&r, 0, len);
        int ok = tg_m_holds(&t.m, 0, keep);
        kva_cache_stats before, after;
        kva_status st;
        kva_cache_get_stats(t.hy, &before);
        st = kva_seq_truncate(t.hy, t.hid[0], keep);
        KT_CHECK(st == (ok ? KVA_OK : KVA_ERR_UNSUPPORTED), "%s: truncate(len %d step %d, keep %d) = %d, want %d",
                 sh.label, len, step, keep, (int)st, ok ? 0 : (int)KVA_ERR_UNSUPPORTED);
        if (keep >= len - step) KT_CHECK(st == KVA_OK, "%s: truncating within the newest step refused", sh.label);
        if (st != KVA_OK) {
          kva_cache_get_stats(t.hy, &after);
          KT_CHECK(tg_same_stats(&before, &after) && kva_seq_len(t.hy, t.hid[0]) == len,
                   "%s: a refused truncate changed the cache", sh.label);
          n_refused++;
          if (ok) break;
          continue;
        }
        n_done++;
        KT_STATUS(kva_seq_truncate(t.pl, t.pid[0], keep), KVA_OK);
        tg_m_cut(&t.m, 0, tg_cdiv(keep, sh.bs));
        q->len = keep, q->step = 0;
        if (!ok) break;
        tg_twin_stats(&t);
        if (tg_twin_append(&r, &t, 0, tg_step_size(&r), 1)) {
          tg_cmp_attend(&r, &sh, t.hy, t.hid[0], t.pl, t.pid[0], q->step, 0, 1);
          tg_cmp_read(&sh, sh.bs, t.hy, t.hid[0], t.pl, t.pid[0], q->from, q->len - q->step);
        }
      } else { /* accept: keep some of the newest n_new tokens */
        int n_new = kt_int(&r, 0, 1) && step > 0 ? kt_int(&r, 1, step) : kt_int(&r, 1, len), n_keep = 0, j;
        int32_t keep[64];
        int ok, start = len - n_new;
        kva_cache_stats before, after;
        kva_status st;
        if (n_new > 64) n_new = 64, start = len - n_new;
        for (j = 0; j < n_new; j++)
          if (kt_int(&r, 0, 1)) keep[n_keep++] = j;
        ok = tg_m_holds(&t.m, 0, start);
        kva_cache_get_stats(t.hy, &before);
        st = kva_seq_accept(t.hy, t.hid[0], n_new, keep, n_keep);
        KT_CHECK(st == (ok ? KVA_OK : KVA_ERR_UNSUPPORTED), "%s: accept(len %d step %d, n_new %d) = %d, want %d",
                 sh.label, len, step, n_new, (int)st, ok ? 0 : (int)KVA_ERR_UNSUPPORTED);
        if (n_new <= step) KT_CHECK(st == KVA_OK, "%s: accept within the newest step refused", sh.label);
        if (st != KVA_OK) {
          kva_cache_get_stats(t.hy, &after);
          KT_CHECK(tg_same_stats(&before, &after) && kva_seq_len(t.hy, t.hid[0]) == len,
                   "%s: a refused accept changed the cache", sh.label);
          n_refused++;
          if (ok) break;
          continue;
        }
        n_done++;
        KT_STATUS(kva_seq_accept(t.pl, t.pid[0], n_new, keep, n_keep), KVA_OK);
        tg_m_cut(&t.m, 0, tg_cdiv(start + n_keep, sh.bs));
        q->len = start + n_keep, q->step = 0;
        if (!ok) break;
        tg_twin_stats(&t);
        tg_cmp_read(&sh, sh.bs, t.hy, t.hid[0], t.pl, t.pid[0], q->from, q->len);
        if (tg_twin_append(&r, &t, 0, tg_step_size(&r), 1))
          tg_cmp_attend(&r, &sh, t.hy, t.hid[0], t.pl, t.pid[0], q->step, 0, 1);
      }
      tg_twin_stats(&t);
    }
    tg_twin_done(&t);
  }
  KT_CHECK(kt_quick || (n_refused > 5 && n_done > 5), "coverage (full runs): %ld refused, %ld done", n_refused,
           n_done);
}

/* spans wider than the group's, bad descriptions, eviction policies */
static void tg_test_args(void) {
  tg_shape sh;
  kva_cache_desc d;
  kva_cache *c, *bad;
  kt_rng r;
  int seq = -1, l, i;
  size_t bytes;
  float *q, *o;
  kva_layer_group many[KVA_MAX_GROUPS + 1];
  int lg[3] = {0, 1, 2};
  kt_begin("groups: argument errors");
  kt_seed(&r, 0x6008);
  memset(&sh, 0, sizeof sh);
  sh.L = 3, sh.G = 1, sh.H = 2, sh.D = 8, sh.bs = 4, sh.n_groups = 3, sh.dt = KVA_F32;
  sh.gr[0].kind = KVA_SPAN_FULL;
  sh.gr[1].kind = KVA_SPAN_WINDOW, sh.gr[1].window = 6, sh.gr[1].n_sink = 2;
  sh.gr[2].kind = KVA_SPAN_CHUNK, sh.gr[2].chunk_size = 5;
  for (l = 0; l < 3; l++) sh.lg[l] = l;
  tg_label(&sh);
  tg_desc(&d, &sh, 64, 4, 1, 0);
  c = tg_create(&d, sh.label);
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  KT_STATUS(kva_seq_append(c, seq, 20), KVA_OK);
  tg_store(&r, &sh, c, seq, NULL, 0, 20);
  KT_STATUS(kva_seq_append(c, seq, 3), KVA_OK);
  tg_store(&r, &sh, c, seq, NULL, 0, 3);
  q = KT_ALLOC(float, 3 * 2 * 8);
  o = KT_ALLOC(float, 3 * 2 * 8);
  tg_fill_q(&r, q, 48);
  {
    /* layer, window, n_sink, chunk, expected */
    static const int cases[][5] = {
        {1, 7, 0, 0, KVA_ERR_ARG},  {1, 6, 3, 0, KVA_ERR_ARG}, {1, 0, 3, 0, KVA_ERR_ARG}, {1, 100, 2, 0, KVA_ERR_ARG},
        {2, 0, 0, 4, KVA_ERR_ARG},  {2, 0, 0, 10, KVA_ERR_ARG}, {1, 6, 2, 0, KVA_OK},     {1, 3, 1, 0, KVA_OK},
        {1, 0, 1, 0, KVA_OK},       {1, 0, 0, 7, KVA_OK},       {2, 0, 0, 5, KVA_OK},     {2, 9, 1, 0, KVA_OK},
        {0, 1000, 0, 0, KVA_OK},    {0, 0, 0, 3, KVA_OK}};
    for (i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
      kva_attn a;
      kva_status st;
      tg_attn(&a, &sh);
      a.window = cases[i][1], a.n_sink = cases[i][2], a.chunk_size = cases[i][3];
      kt_fill_sentinel(o, 48);
      st = kva_attend_cache(c, seq, cases[i][0], &a, q, 3, o);
      KT_CHECK((int)st == cases[i][4], "layer %d window %d sink %d chunk %d: %d, want %d", cases[i][0], cases[i][1],
               cases[i][2], cases[i][3], (int)st, cases[i][4]);
      if (cases[i][4] != KVA_OK) KT_CHECK(kt_all_sentinel(o, 48), "case %d: a refused call wrote its output", i);
    }
  }
  {
    kva_evict e;
    memset(&e, 0, sizeof e);
    e.kind = KVA_EVICT_WINDOW, e.budget = 16, e.n_sink = 2;
    KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_UNSUPPORTED);
    e.kind = KVA_EVICT_H2O, e.n_recent = 4;
    KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_UNSUPPORTED);
    memset(&e, 0, sizeof e);
    KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  }
  kva_cache_destroy(c);

  /* bad descriptions */
  for (i = 0; i < 22; i++) {
    tg_shape b = sh;
    kva_status st1, st2;
    tg_desc(&d, &b, 64, 4, 1, 0);
    d.evict_support = KVA_EVICT_SUPPORT_ALL;
    switch (i) {
      case 0: b.gr[1].kind = 3; break;
      case 1: b.gr[1].kind = -1; break;
      case 2: b.gr[1].window = 0; break;
      case 3: b.gr[1].chunk_size = 4; break;
      case 4: b.gr[2].n_sink = 1; break;
      case 5: b.gr[2].window = 3; break;
      case 6: b.gr[2].chunk_size = 0; break;
      case 7: b.gr[0].window = 4; break;
      case 8: b.gr[0].n_sink = 1; break;
      case 9: b.gr[0].chunk_size = 4; break;
      case 10: b.gr[0].n_blocks = 4; break;
      case 11: b.lg[2] = 3; break;
      case 12: b.lg[0] = -1; break;
      case 13: d.n_groups = KVA_MAX_GROUPS + 1; break;
      case 14: d.groups = NULL; break;
      case 15: b.gr[1].window = -2; break;
      case 16: b.gr[1].n_sink = -1; break;
      case 17: b.gr[1].n_blocks = -1; break;
      case 18: b.gr[2].chunk_size = -5; break;
      case 19: d.n_groups = -1; break;
      case 20: b.gr[2].kind = 7; break;
      default: d.n_groups = 2; break; /* layer 2 names group 2 of 2 */
    }
    if (i == 13) {
      for (l = 0; l <= KVA_MAX_GROUPS; l++) memset(&many[l], 0, sizeof many[l]);
      d.groups = many;
      d.layer_group = lg;
    } else if (i != 14) {
      d.groups = b.gr;
      d.layer_group = b.lg;
    }
    bad = NULL;
    st1 = kva_cache_create(&d, &bad);
    st2 = kva_cache_size(&d, &bytes);
    KT_CHECK(st1 == KVA_ERR_ARG && st2 == KVA_ERR_ARG, "bad group description %d: create %d, size %d", i, (int)st1,
             (int)st2);
    if (st1 == KVA_OK) kva_cache_destroy(bad);
  }
  /* and the limits that are fine: KVA_MAX_GROUPS groups, NULL layer_group (every layer in group 0) */
  for (l = 0; l < KVA_MAX_GROUPS; l++) {
    memset(&many[l], 0, sizeof many[l]);
    many[l].kind = l % 2 ? KVA_SPAN_WINDOW : KVA_SPAN_CHUNK;
    many[l].window = l % 2 ? l + 1 : 0;
    many[l].chunk_size = l % 2 ? 0 : l + 2;
  }
  tg_desc(&d, &sh, 64, 4, 1, 0);
  d.n_groups = KVA_MAX_GROUPS, d.groups = many, d.layer_group = lg;
  bad = NULL;
  KT_STATUS(kva_cache_create(&d, &bad), KVA_OK);
  kva_cache_destroy(bad);
  d.layer_group = NULL, d.n_groups = 1;
  bad = NULL;
  KT_STATUS(kva_cache_create(&d, &bad), KVA_OK);
  if (bad) { /* every layer in the first group: CHUNK 2 */
    kva_attn a;
    KT_STATUS(kva_seq_new(bad, &seq), KVA_OK);
    KT_STATUS(kva_seq_append(bad, seq, 3), KVA_OK);
    tg_store(&r, &sh, bad, seq, NULL, 0, 3);
    tg_attn(&a, &sh);
    a.chunk_size = 3;
    for (l = 0; l < 3; l++) KT_STATUS(kva_attend_cache(bad, seq, l, &a, q, 1, o), KVA_ERR_ARG);
    a.chunk_size = 2;
    for (l = 0; l < 3; l++) KT_STATUS(kva_attend_cache(bad, seq, l, &a, q, 1, o), KVA_OK);
    kva_cache_destroy(bad);
  }
  free(q);
  free(o);
}

/* ======================================================================== */
/* 5. prefix caching                                                        */

/* the released-from block of each group after appends of these steps */
static void tg_rule_from(const tg_shape *s, const int *steps, int n_steps, int *from) {
  int g, k;
  long len = 0;
  for (g = 0; g < s->n_groups; g++) from[g] = tg_sink_blocks(&s->gr[g], s->bs);
  for (k = 0; k < n_steps; k++) {
    for (g = 0; g < s->n_groups; g++) {
      int to;
      if (!tg_is_span(&s->gr[g])) continue;
      to = tg_first_block(&s->gr[g], s->bs, len);
      if (to > tg_cdiv(len, s->bs)) to = tg_cdiv(len, s->bs);
      if (to > from[g]) from[g] = to;
    }
    len += steps[k];
  }
}

/* the hit the rule gives for a prompt of n tokens whose first n_pub blocks
   were published with groups released up to from[] */
static int tg_rule_hit(const tg_shape *s, int n, int n_pub, const int *from) {
  int m = (n - 1) / s->bs, g;
  if (m > n_pub) m = n_pub;
  for (; m > 0; m--) {
    int ok = 1;
    for (g = 0; g < s->n_groups; g++) {
      int a, sinks;
      if (!tg_is_span(&s->gr[g])) continue;
      sinks = tg_sink_blocks(&s->gr[g], s->bs);
      a = tg_first_block(&s->gr[g], s->bs, (long)m * s->bs);
      if (a < sinks) a = sinks;
      if (a < m && a < from[g]) ok = 0;
    }
    if (ok) break;
  }
  return m * s->bs;
}

/* A new sequence from the prefix cache, its plain twin (a fork of the plain
   snapshot truncated to the hit), then the rest of the prompt appended to
   both and attended: bit for bit. */
static void tg_hit_and_check(kt_rng *r, const tg_shape *s, kva_cache *hy, kva_cache *pl, int snap, const int32_t *tok,
                             int n, uint64_t salt, int want_hit) {
  int hs = -1, ps = -1, hit = -1;
  kva_status st;
  KT_STATUS(kva_seq_new_prefix(hy, tok, n, salt, &hs, &hit), KVA_OK);
  if (want_hit >= 0)
    KT_CHECK(hit == want_hit, "%s: prefix hit %d tokens of %d, the rule says %d", s->label, hit, n, want_hit);
  KT_CHECK(hit >= 0 && hit % s->bs == 0 && hit <= n - 1, "%s: prefix hit %d of %d", s->label, hit, n);
  KT_CHECK(kva_seq_len(hy, hs) == hit, "%s: hit sequence holds %d, hit %d", s->label, kva_seq_len(hy, hs), hit);
  KT_STATUS(kva_seq_fork(pl, snap, &ps), KVA_OK);
  KT_STATUS(kva_seq_truncate(pl, ps, hit), KVA_OK);
  if (hit > 0) tg_cmp_read(s, s->bs, hy, hs, pl, ps, NULL, hit);
  st = kva_seq_append(hy, hs, n - hit);
  KT_CHECK(st == KVA_OK, "%s: appending the rest of the prompt (%d after a hit of %d) = %d", s->label, n - hit, hit,
           (int)st);
  if (st != KVA_OK) {
    KT_STATUS(kva_seq_free(hy, hs), KVA_OK);
    KT_STATUS(kva_seq_free(pl, ps), KVA_OK);
    return;
  }
  KT_STATUS(kva_seq_append(pl, ps, n - hit), KVA_OK);
  tg_store(r, s, hy, hs, pl, ps, n - hit);
  tg_cmp_attend(r, s, hy, hs, pl, ps, n - hit, 0, 1);
  KT_STATUS(kva_seq_append(hy, hs, 1), KVA_OK);
  KT_STATUS(kva_seq_append(pl, ps, 1), KVA_OK);
  tg_store(r, s, hy, hs, pl, ps, 1);
  tg_cmp_attend(r, s, hy, hs, pl, ps, 1, 0, 0);
  KT_STATUS(kva_seq_free(hy, hs), KVA_OK);
  KT_STATUS(kva_seq_free(pl, ps), KVA_OK);
}

static void tg_prefix_shape(kt_rng *r, tg_shape *s) {
  memset(s, 0, sizeof *s);
  s->L = 3, s->G = kt_int(r, 1, 2), s->D = 8, s->bs = kt_int(r, 2, 8), s->n_groups = 3, s->dt = KVA_F32;
  s->H = 2 * s->G;
  s->gr[0].kind = KVA_SPAN_FULL;
  s->gr[1].kind = KVA_SPAN_WINDOW, s->gr[1].window = kt_int(r, 2, 20), s->gr[1].n_sink = kt_int(r, 0, 3);
  s->gr[2].kind = KVA_SPAN_CHUNK, s->gr[2].chunk_size = kt_int(r, 3, 16);
  s->lg[0] = 0, s->lg[1] = 1, s->lg[2] = 2;
  if (kt_int(r, 0, 1)) s->lg[0] = 1, s->lg[2] = 0; /* another order */
}

static void tg_test_prefix(void) {
  kt_rng r;
  int it, iters = kt_iters(16);
  long hits = 0, short_hits = 0;
  kt_begin("groups: prefix caching");
  kt_seed(&r, 0x6009);
  for (it = 0; it < iters; it++) {
    tg_shape sh;
    kva_cache_desc d;
    kva_cache *hy, *pl;
    kva_cache_stats st;
    int32_t tok[128];
    int n = 0, nb = 300, g, pub = -1, ppub = -1, snap = -1, k, steps[64], n_steps = 0, from[KVA_MAX_GROUPS], want;
    uint64_t salt = (uint64_t)it * 77u + 1u;
    int one_step = it % 2 == 0;
    tg_prefix_shape(&r, &sh);
    n = kt_int(&r, 2 * sh.bs, 100);
    for (g = 0; g < 3; g++)
      if (tg_is_span(&sh.gr[g])) sh.gr[g].n_blocks = nb;
    tg_label(&sh);
    tg_desc(&d, &sh, nb, 8, 1, 0);
    hy = tg_create(&d, sh.label);
    tg_desc(&d, &sh, nb, 8, 0, 0);
    pl = tg_create(&d, sh.label);
    for (k = 0; k < n; k++) tok[k] = (int32_t)kt_int(&r, 0, 50000);
    /* the publisher: the prompt in one step, or in chunks (the groups release before publishing) */
    KT_STATUS(kva_seq_new(hy, &pub), KVA_OK);
    KT_STATUS(kva_seq_new(pl, &ppub), KVA_OK);
    for (k = 0; k < n; k += steps[n_steps++]) {
      steps[n_steps] = one_step ? n : kt_int(&r, 0, 1) ? 1 : kt_int(&r, 2, 12);
      if (k + steps[n_steps] > n) steps[n_steps] = n - k;
      KT_STATUS(kva_seq_append(hy, pub, steps[n_steps]), KVA_OK);
      KT_STATUS(kva_seq_append(pl, ppub, steps[n_steps]), KVA_OK);
      tg_store(&r, &sh, hy, pub, pl, ppub, steps[n_steps]);
    }
    tg_rule_from(&sh, steps, n_steps, from);
    KT_STATUS(kva_seq_publish(hy, pub, tok, n, salt), KVA_OK);
    KT_STATUS(kva_seq_fork(pl, ppub, &snap), KVA_OK); /* the prompt's K / V as the publisher stored them */
    want = tg_rule_hit(&sh, n, n / sh.bs, from);
    hits += want > 0;
    short_hits += want < (n - 1) / sh.bs * sh.bs;
    tg_hit_and_check(&r, &sh, hy, pl, snap, tok, n, salt, want);
    /* the publisher goes far past the window, then is freed: the published group blocks stay */
    for (k = 0; k < 60; k++) {
      int m = kt_int(&r, 0, 3) ? 1 : kt_int(&r, 2, 9);
      KT_STATUS(kva_seq_append(hy, pub, m), KVA_OK);
      tg_store(&r, &sh, hy, pub, NULL, 0, m);
    }
    KT_STATUS(kva_seq_free(hy, pub), KVA_OK);
    tg_hit_and_check(&r, &sh, hy, pl, snap, tok, n, salt, want);
    kva_cache_get_stats(hy, &st);
    KT_CHECK(st.blocks_used == 0 && st.bytes_used == 0 && st.n_seqs == 0,
             "%s: only publications left: blocks_used %d, bytes_used %lu", sh.label, st.blocks_used,
             (unsigned long)st.bytes_used);
    KT_CHECK(want < sh.bs || st.blocks_cached > 0, "%s: nothing cached after publishing", sh.label);
    KT_STATUS(kva_seq_free(pl, ppub), KVA_OK);
    KT_STATUS(kva_seq_free(pl, snap), KVA_OK);
    kva_cache_destroy(hy);
    kva_cache_destroy(pl);
  }
  KT_CHECK(kt_quick || (hits > 3 && short_hits > 0), "coverage (full runs): %ld hits, %ld shortened", hits,
           short_hits);

  /* a group pool that runs short takes the published blocks back: the hit gets shorter */
  kt_begin("groups: prefix caching, pool taken back");
  for (it = 0; it < kt_iters(8); it++) {
    tg_shape sh;
    kva_cache_desc d;
    kva_cache *hy, *pl;
    kva_cache_stats st;
    int32_t tok[128];
    int n, pub = -1, ppub = -1, snap = -1, other = -1, k, cap, hit = -1, s2 = -1;
    tg_prefix_shape(&r, &sh);
    sh.n_groups = 2, sh.lg[0] = 0, sh.lg[1] = 1, sh.lg[2] = 0;
    sh.gr[1].window = kt_int(&r, 2, 12);
    n = kt_int(&r, 3 * sh.bs, 60);
    cap = tg_cdiv(n, sh.bs) + 3;
    sh.gr[1].n_blocks = cap;
    tg_label(&sh);
    tg_desc(&d, &sh, 200, 8, 1, 0);
    hy = tg_create(&d, sh.label);
    tg_desc(&d, &sh, 200, 8, 0, 0);
    pl = tg_create(&d, sh.label);
    for (k = 0; k < n; k++) tok[k] = (int32_t)(k * 7 + it);
    KT_STATUS(kva_seq_new(hy, &pub), KVA_OK);
    KT_STATUS(kva_seq_new(pl, &ppub), KVA_OK);
    KT_STATUS(kva_seq_append(hy, pub, n), KVA_OK);
    KT_STATUS(kva_seq_append(pl, ppub, n), KVA_OK);
    tg_store(&r, &sh, hy, pub, pl, ppub, n);
    KT_STATUS(kva_seq_publish(hy, pub, tok, n, 5), KVA_OK);
    KT_STATUS(kva_seq_fork(pl, ppub, &snap), KVA_OK);
    KT_STATUS(kva_seq_free(hy, pub), KVA_OK);
    kva_cache_get_stats(hy, &st);
    KT_CHECK(st.group_blocks_used == 0 && st.bytes_used == 0,
             "%s: publications only: group_blocks_used %d, bytes_used %lu", sh.label, st.group_blocks_used,
             (unsigned long)st.bytes_used);
    /* another sequence takes every block of the group's pool, the published ones too */
    KT_STATUS(kva_seq_new(hy, &other), KVA_OK);
    KT_CHECK(kva_seq_fits(hy, other, cap * sh.bs, NULL) == KVA_FITS_NOW, "%s: the group's spare blocks do not count",
             sh.label);
    KT_STATUS(kva_seq_append(hy, other, cap * sh.bs), KVA_OK);
    kva_cache_get_stats(hy, &st);
    KT_CHECK(st.group_blocks_used == cap, "%s: group_blocks_used %d of %d", sh.label, st.group_blocks_used, cap);
    KT_STATUS(kva_seq_new_prefix(hy, tok, n, 5, &s2, &hit), KVA_OK);
    KT_CHECK(hit == 0, "%s: hit %d after the group took its published blocks back", sh.label, hit);
    KT_STATUS(kva_seq_free(hy, s2), KVA_OK);
    KT_STATUS(kva_seq_free(hy, other), KVA_OK);
    tg_hit_and_check(&r, &sh, hy, pl, snap, tok, n, 5, 0);
    kva_cache_destroy(hy);
    kva_cache_destroy(pl);
  }
}

/* ======================================================================== */
/* 6. export / import                                                       */

static void tg_test_export(void) {
  kt_rng r;
  int it, iters = kt_iters(16);
  kt_begin("groups: export / import");
  kt_seed(&r, 0x600A);
  for (it = 0; it < iters; it++) {
    tg_shape sh, sh2, other;
    kva_cache_desc d;
    kva_cache *a, *b, *pl, *c3;
    int sa = -1, sb = -1, ps = -1, s3 = -1, len = 0, target = kt_int(&r, 10, 120), g, k, step = 0, l, gg, t;
    int bs2, nb = 200;
    size_t size = 0, size2 = 0;
    unsigned char *buf, *buf2;
    kva_status st;
    tg_random_shape(&r, &sh, 0);
    sh.dt = it % 3 == 2 ? KVA_F16 : KVA_F32;
    if (!tg_is_span(&sh.gr[0])) sh.gr[0].kind = KVA_SPAN_WINDOW, sh.gr[0].window = kt_int(&r, 1, 20);
    for (g = 0; g < sh.n_groups; g++)
      if (tg_is_span(&sh.gr[g])) sh.gr[g].n_blocks = nb;
    bs2 = it % 4 == 0 ? sh.bs : kt_int(&r, 1, 17);
    tg_label(&sh);
    tg_desc(&d, &sh, nb, 4, 1, 0);
    a = tg_create(&d, sh.label);
    tg_desc(&d, &sh, nb * 17, 4, 1, bs2);
    d.n_blocks = tg_cdiv(200 * 17, bs2);
    for (g = 0; g < sh.n_groups; g++) sh2 = sh;
    for (g = 0; g < sh.n_groups; g++)
      if (tg_is_span(&sh2.gr[g])) sh2.gr[g].n_blocks = d.n_blocks;
    d.groups = sh2.gr;
    b = tg_create(&d, sh.label);
    tg_desc(&d, &sh, nb, 4, 0, 0);
    pl = tg_create(&d, sh.label);
    KT_STATUS(kva_seq_new(a, &sa), KVA_OK);
    KT_STATUS(kva_seq_new(pl, &ps), KVA_OK);
    while (len < target) {
      step = tg_step_size(&r);
      KT_STATUS(kva_seq_append(a, sa, step), KVA_OK);
      KT_STATUS(kva_seq_append(pl, ps, step), KVA_OK);
      tg_store(&r, &sh, a, sa, pl, ps, step);
      len += step;
    }
    KT_STATUS(kva_seq_export(a, sa, NULL, 0, &size), KVA_OK);
    buf = KT_ALLOC(unsigned char, size);
    KT_STATUS(kva_seq_export(a, sa, buf, size, &size), KVA_OK);
    /* the rows: released tokens are zeros, held ones the plain cache's (F32: the floats) */
    if (sh.dt == KVA_F32) {
      size_t off = 128 + (size_t)sh.L * (16 + 8 * (size_t)sh.G) + 16 * (size_t)sh.L, n_bad = 0;
      float *kk = KT_ALLOC(float, (size_t)sh.G * sh.D), *vv = KT_ALLOC(float, (size_t)sh.G * sh.D);
      KT_CHECK(size == off + (size_t)sh.L * sh.G * 2 * len * sh.D * 4 + 8, "%s: stream of %lu bytes", sh.label,
               (unsigned long)size);
      for (l = 0; l < sh.L && size == off + (size_t)sh.L * sh.G * 2 * len * sh.D * 4 + 8; l++) {
        const kva_layer_group *gr = &sh.gr[sh.lg[l]];
        int sinks = tg_sink_blocks(gr, sh.bs), fb = tg_is_span(gr) ? tg_first_block(gr, sh.bs, len - step) : 0;
        if (fb > tg_cdiv(len - step, sh.bs)) fb = tg_cdiv(len - step, sh.bs);
        for (t = 0; t < len; t++) {
          int released = tg_is_span(gr) && t / sh.bs >= sinks && t / sh.bs < fb;
          KT_STATUS(kva_seq_read(pl, ps, l, t, kk, vv, NULL), KVA_OK);
          for (gg = 0; gg < sh.G; gg++) {
            size_t head = off + ((size_t)l * sh.G + gg) * 2 * (size_t)len * sh.D * 4;
            float x[64], y[64];
            memcpy(x, buf + head + (size_t)t * sh.D * 4, (size_t)sh.D * 4);
            memcpy(y, buf + head + ((size_t)len + t) * sh.D * 4, (size_t)sh.D * 4);
            for (k = 0; k < sh.D; k++)
              n_bad += released ? (kt_f2u(x[k]) | kt_f2u(y[k])) != 0
                                : kt_f2u(x[k]) != kt_f2u(kk[gg * sh.D + k]) || kt_f2u(y[k]) != kt_f2u(vv[gg * sh.D + k]);
          }
        }
      }
      KT_CHECK(n_bad == 0, "%s: %lu stream values are not the held tokens' / zeros for released ones", sh.label,
               (unsigned long)n_bad);
      free(kk);
      free(vv);
    }
    st = kva_seq_import(b, buf, size, &sb);
    KT_CHECK(st == KVA_OK, "%s: import into block size %d (from %d, len %d, step %d) = %d", sh.label, bs2, sh.bs, len,
             step, (int)st);
    if (st == KVA_OK) {
      KT_CHECK(kva_seq_len(b, sb) == len, "%s: imported len %d, want %d", sh.label, kva_seq_len(b, sb), len);
      tg_cmp_read(&sh, bs2, b, sb, pl, ps, NULL, len - step);
      if (bs2 == sh.bs) { /* a re-export is the stream */
        KT_STATUS(kva_seq_export(b, sb, NULL, 0, &size2), KVA_OK);
        buf2 = KT_ALLOC(unsigned char, size2);
        KT_STATUS(kva_seq_export(b, sb, buf2, size2, &size2), KVA_OK);
        KT_CHECK(size2 == size && memcmp(buf, buf2, size) == 0, "%s: re-export differs from the stream", sh.label);
        free(buf2);
      }
      for (k = 0; k < 4; k++) { /* continue all three identically */
        int n = tg_step_size(&r), q;
        size_t kn;
        float *kx, *vx;
        KT_STATUS(kva_seq_append(a, sa, n), KVA_OK);
        KT_STATUS(kva_seq_append(b, sb, n), KVA_OK);
        KT_STATUS(kva_seq_append(pl, ps, n), KVA_OK);
        kn = (size_t)n * sh.G * sh.D;
        kx = KT_ALLOC(float, kn), vx = KT_ALLOC(float, kn);
        for (l = 0; l < sh.L; l++) {
          kt_fill(&r, kx, kn, -1.0f, 1.0f);
          kt_fill(&r, vx, kn, -1.0f, 1.0f);
          KT_STATUS(kva_store(a, sa, l, kx, vx, n), KVA_OK);
          KT_STATUS(kva_store(b, sb, l, kx, vx, n), KVA_OK);
          KT_STATUS(kva_store(pl, ps, l, kx, vx, n), KVA_OK);
        }
        free(kx), free(vx);
        tg_cmp_attend(&r, &sh, a, sa, pl, ps, n, 0, 0);
        if (bs2 == sh.bs) {
          tg_cmp_attend(&r, &sh, b, sb, pl, ps, n, 0, 0);
        } else { /* another block size: at tolerance */
          size_t qn = (size_t)n * sh.H * sh.D;
          float *qq = KT_ALLOC(float, qn), *o = KT_ALLOC(float, qn), *lse = KT_ALLOC(float, (size_t)n * sh.H);
          for (l = 0; l < sh.L; l++) {
            kva_attn ah, ap;
            tg_attn(&ah, &sh);
            tg_attn(&ap, &sh);
            tg_layer_mask(&sh, l, &ap);
            tg_fill_q(&r, qq, qn);
            KT_STATUS(kva_attend_cache_lse(b, sb, l, &ah, qq, n, o, lse), KVA_OK);
            tg_check_ref(&sh, &ap, pl, ps, l, len + n, qq, n, o, lse, "imported");
          }
          free(qq), free(o), free(lse);
        }
        len += n;
        (void)q;
      }
      KT_STATUS(kva_seq_free(b, sb), KVA_OK);
    }
    /* another layer pattern, or no groups: refused */
    KT_STATUS(kva_seq_import(pl, buf, size, &s3), KVA_ERR_UNSUPPORTED);
    other = sh;
    g = other.lg[0]; /* layer 0's group, a span or not, another span */
    if (other.gr[g].kind == KVA_SPAN_WINDOW) other.gr[g].window++;
    else if (other.gr[g].kind == KVA_SPAN_CHUNK) other.gr[g].chunk_size++;
    else other.gr[g].kind = KVA_SPAN_CHUNK, other.gr[g].chunk_size = 4, other.gr[g].n_blocks = nb;
    tg_desc(&d, &other, nb, 4, 1, 0);
    c3 = tg_create(&d, sh.label);
    KT_STATUS(kva_seq_import(c3, buf, size, &s3), KVA_ERR_UNSUPPORTED);
    kva_cache_destroy(c3);
    other = sh;
    other.lg[0] = (other.lg[0] + 1) % (other.n_groups + 1);
    if (other.lg[0] == other.n_groups) other.gr[other.n_groups++].kind = KVA_SPAN_FULL;
    if (other.gr[other.lg[0]].kind != sh.gr[sh.lg[0]].kind || other.gr[other.lg[0]].window != sh.gr[sh.lg[0]].window ||
        other.gr[other.lg[0]].chunk_size != sh.gr[sh.lg[0]].chunk_size ||
        other.gr[other.lg[0]].n_sink != sh.gr[sh.lg[0]].n_sink) {
      tg_desc(&d, &other, nb, 4, 1, 0);
      c3 = tg_create(&d, sh.label);
      st = kva_seq_import(c3, buf, size, &s3);
      tg_label(&other);
      KT_CHECK(st == KVA_ERR_UNSUPPORTED, "%s: import into layer pattern %s = %d", sh.label, other.label, (int)st);
      kva_cache_destroy(c3);
    }
    free(buf);
    /* a plain stream into a hybrid cache */
    KT_STATUS(kva_seq_export(pl, ps, NULL, 0, &size), KVA_OK);
    buf = KT_ALLOC(unsigned char, size);
    KT_STATUS(kva_seq_export(pl, ps, buf, size, &size), KVA_OK);
    KT_STATUS(kva_seq_import(a, buf, size, &s3), KVA_ERR_UNSUPPORTED);
    free(buf);
    kva_cache_destroy(a);
    kva_cache_destroy(b);
    kva_cache_destroy(pl);
  }
}

/* ======================================================================== */
/* 7. the memory figure of a Gemma-3-like pattern                           */

static void tg_test_memory(void) {
  tg_shape sh;
  kva_cache_desc d;
  kva_cache *hy, *pl;
  kva_cache_stats hs, ps;
  int l, hseq = -1, pseq = -1, len = 0;
  kt_begin("groups: Gemma-3-like memory");
  memset(&sh, 0, sizeof sh);
  sh.L = 6, sh.G = 1, sh.H = 2, sh.D = 8, sh.bs = 16, sh.n_groups = 2, sh.dt = KVA_F16;
  sh.gr[0].kind = KVA_SPAN_WINDOW, sh.gr[0].window = 1024, sh.gr[0].n_blocks = 96;
  sh.gr[1].kind = KVA_SPAN_FULL;
  for (l = 0; l < 6; l++) sh.lg[l] = l == 5 ? 1 : 0;
  tg_label(&sh);
  tg_desc(&d, &sh, 256, 1, 1, 0);
  hy = tg_create(&d, sh.label);
  tg_desc(&d, &sh, 256, 1, 0, 0);
  pl = tg_create(&d, sh.label);
  KT_STATUS(kva_seq_new(hy, &hseq), KVA_OK);
  KT_STATUS(kva_seq_new(pl, &pseq), KVA_OK);
  while (len < 4096) {
    int p0 = len, first = p0 - 1024 + 1, released = first > 0 ? first / 16 : 0, held;
    KT_STATUS(kva_seq_append(hy, hseq, 256), KVA_OK);
    KT_STATUS(kva_seq_append(pl, pseq, 256), KVA_OK);
    len += 256;
    held = len / 16 - released;
    kva_cache_get_stats(hy, &hs);
    kva_cache_get_stats(pl, &ps);
    KT_CHECK(hs.blocks_used == len / 16 && hs.group_blocks_used == held && hs.group_blocks == 96,
             "len %d: blocks_used %d (want %d), group_blocks_used %d (want %d)", len, hs.blocks_used, len / 16,
             hs.group_blocks_used, held);
    /* one FULL layer's blocks + 5 WINDOW layers' held blocks, of 6 layers' blocks */
    KT_CHECK(hs.bytes_used * (size_t)(6 * (len / 16)) == ps.bytes_used * (size_t)(len / 16 + 5 * held),
             "len %d: bytes_used %lu hybrid, %lu plain: want the ratio %d / %d", len, (unsigned long)hs.bytes_used,
             (unsigned long)ps.bytes_used, len / 16 + 5 * held, 6 * (len / 16));
  }
  KT_CHECK(hs.blocks_used == 256 && hs.group_blocks_used == 80, "4096 tokens: %d main and %d group blocks, want 256, 80",
           hs.blocks_used, hs.group_blocks_used);
  KT_CHECK(hs.bytes_used * 1536 == ps.bytes_used * 656, "4096 tokens: bytes_used %lu / %lu, want 656 / 1536",
           (unsigned long)hs.bytes_used, (unsigned long)ps.bytes_used);
  kva_cache_destroy(hy);
  kva_cache_destroy(pl);
}

/* ======================================================================== */

void test_groups(void) {
  tg_bitwise = tg_refs = 0;
  tg_worst = 0.0;
  tg_test_equal();
  tg_test_gqa();
  tg_test_batch();
  tg_test_fork();
  tg_test_exhaustion();
  tg_test_derived();
  tg_test_truncate();
  tg_test_args();
  tg_test_prefix();
  tg_test_export();
  tg_test_memory();
  if (getenv("KVA_TEST_VERBOSE"))
    fprintf(stderr, "  groups: %ld bit-for-bit comparisons, %ld reference checks, worst |err| / tol %.3f\n", tg_bitwise,
            tg_refs, tg_worst);
}
