/* test_scorers.c - eviction scorers: KVA_EVICT_SCORE (kva_evict.score,
 * score_user, accumulate), kva_seq_compress and the built-in scorers
 * kva_score_key_norm and kva_score_attention.
 *
 * Written from docs/API.md ("Eviction", "Eviction scorers") and the public
 * declarations, not from kvattn.h's code.  The rule the reference (sc_expect)
 * implements, per layer and KV head of a sequence holding n tokens:
 *   protected = the positions < n_sink and the positions >= kva_seq_pos -
 *               n_recent (the n_recent newest positions, held or not);
 *   wanted    = held + n - budget for kva_seq_append(n) (held - budget with
 *               rollback = 1), held - budget for kva_seq_compress(budget);
 *   e         = min(wanted, the fewest unprotected tokens any layer and KV
 *               head holds) tokens go in every layer and KV head;
 *   of the unprotected tokens the e lowest scores go, ties to the oldest
 *   position (-0 ties +0; -Inf goes first, +Inf last).
 * The scorer is called once per layer and KV head (layer 0 first, then its KV
 * heads in order) with a view whose positions ascend and whose rows are
 * kva_seq_read's, with keep = n - e, attn_sum only with accumulate = 1, and
 * never when nothing is evicted.  A NaN score is KVA_ERR_ARG, a status other
 * than KVA_OK comes back as is (KVA_ERR_ARG when it is not a kva_status), and
 * either changes nothing.  After an eviction every head holds exactly the
 * reference's survivors plus the appended positions; a survivor's rows are
 * bit for bit what kva_seq_read returned before, appended slots read zero.
 *
 *   - sc_directed: hand-computed keep sets (ties, -0, +/-Inf, sinks, recent)
 *     for several compress budgets on forks of one sequence; "the fewest any
 *     could evict" after heads evicted different tokens under an earlier
 *     policy (a head that lost its newest positions protects none as
 *     recent); nothing
 *     evictable: no scorer call, nothing changes;
 *   - sc_random_rule: random shapes (1..3 layers, 1..3 KV heads, head_dim 1,
 *     7, 33, 64, v_dim other than head_dim, block sizes 1, 3, 16, F32 / F16 /
 *     INT8, rotated rows, rollback), the test scorer on the keys' first
 *     channel, a position table (ties, -0, +/-Inf) or the last K and V
 *     channels; prefill, compress, decode appends (chunks beyond the budget
 *     too) with compresses between; every view checked; attention afterwards
 *     against fp64 over the rows read back;
 *   - sc_failures: NaN at any call / slot (sinks and recent ones too) and
 *     error statuses at the first or last call, through compress and append:
 *     the status, and nothing changed (rows, positions, len, pos, stats, the
 *     step still open);
 *   - sc_h2o_equiv: SCORE with accumulate = 1 and a scorer returning
 *     attn_sum against H2O, through kva_attend_cache and kva_attend_batch,
 *     with a compress midway: the same held positions and rows, attention
 *     bit for bit;
 *   - sc_builtin_direct / sc_builtin_args: kva_score_key_norm and
 *     kva_score_attention on views built here against fp64 (1e-5 relative +
 *     1e-7), scale 0 / given, q_pos NULL / given (queries that see no key),
 *     pool 0, 1, 3, 5, 7; bad user data is KVA_ERR_ARG with scores untouched;
 *   - sc_builtin_cache: the built-ins as a policy (key norm, TOVA, SnapKV
 *     with n_recent = window, explicit q_pos), compress and TOVA decode steps,
 *     checked with the rule; a head whose boundary scores are within 1e-4
 *     relative is only checked loosely and counted (at most 10 % of them);
 *   - sc_paths: forks after and before a SCORE eviction, a prefix-cached
 *     block shared with a compressed sequence, KVA_ERR_FULL when the shared
 *     blocks cannot be copied, KVA_ERR_NOMEM from alloc_fn, export / import
 *     (policy NONE after import), kva_seq_append_all, a latent cache (v NULL),
 *     block selection on an accumulating sequence;
 *   - sc_args: kva_seq_set_evict and kva_seq_compress refusals. */
#include "kvattn.h"
#include "harness.h"

static float sc_nan(void) { return kt_u2f(0x7FC00000u); }

static int sc_verbose(void) {
  const char *s = getenv("KVA_TEST_VERBOSE");
  return s && *s && strcmp(s, "0") != 0;
}

/* ------------------------------------------------------------------------ */
/* Snapshots: a sequence as kva_seq_read returns it                          */

typedef struct {
  int L, G, D, Dv, len, pos; /* Dv 0: a latent cache (V not read) */
  float *k, *v;              /* [L][len][G][D], [L][len][G][Dv] */
  int32_t *p;                /* [L][len][G] */
} sc_snap;

static const float *sc_sk(const sc_snap *s, int l, int slot, int g) {
  return s->k + (((size_t)l * s->len + slot) * s->G + g) * s->D;
}
static const float *sc_sv(const sc_snap *s, int l, int slot, int g) {
  return s->v + (((size_t)l * s->len + slot) * s->G + g) * s->Dv;
}
static int32_t sc_sp(const sc_snap *s, int l, int slot, int g) { return s->p[((size_t)l * s->len + slot) * s->G + g]; }

static void sc_snap_take(sc_snap *s, kva_cache *c, int seq, int L, int G, int D, int Dv) {
  int l, slot, len = kva_seq_len(c, seq);
  s->L = L, s->G = G, s->D = D, s->Dv = Dv, s->len = len < 0 ? 0 : len, s->pos = kva_seq_pos(c, seq);
  s->k = KT_ALLOC(float, (size_t)L * s->len * G * D + 1);
  s->v = KT_ALLOC(float, (size_t)L * s->len * G * Dv + 1);
  s->p = KT_ALLOC(int32_t, (size_t)L * s->len * G + 1);
  for (l = 0; l < L; l++)
    for (slot = 0; slot < s->len; slot++) {
      size_t o = (size_t)l * s->len + slot;
      kva_status st = kva_seq_read(c, seq, l, slot, s->k + o * G * D, Dv ? s->v + o * G * Dv : NULL, s->p + o * G);
      if (st != KVA_OK) {
        KT_CHECK(0, "kva_seq_read(seq %d, layer %d, slot %d) returned %d", seq, l, slot, (int)st);
        memset(s->k + o * G * D, 0, sizeof(float) * G * D);
        if (Dv) memset(s->v + o * G * Dv, 0, sizeof(float) * G * Dv);
        memset(s->p + o * G, 0xff, sizeof(int32_t) * G);
      }
    }
}

static void sc_snap_free(sc_snap *s) {
  free(s->k), free(s->v), free(s->p);
  s->k = s->v = NULL, s->p = NULL;
}

/* len, pos and every slot's rows and positions bit for bit */
static int sc_snap_same(const sc_snap *a, const sc_snap *b) {
  size_t n;
  if (a->len != b->len || a->pos != b->pos || a->L != b->L || a->G != b->G) return 0;
  n = (size_t)a->L * a->len * a->G;
  return memcmp(a->p, b->p, n * sizeof(int32_t)) == 0 && kt_same_bits(a->k, b->k, n * a->D) &&
         (a->Dv == 0 || kt_same_bits(a->v, b->v, n * a->Dv));
}

typedef struct {
  int32_t p;
  int slot;
} sc_ps;

static int sc_cmp_ps(const void *a, const void *b) {
  int32_t x = ((const sc_ps *)a)->p, y = ((const sc_ps *)b)->p;
  return (x > y) - (x < y);
}

static int sc_cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* Head g of layer l in position order: positions, K rows, V rows (k / v may be NULL). */
static void sc_gather(const sc_snap *s, int l, int g, int32_t *pos, float *k, float *v) {
  sc_ps *o = KT_ALLOC(sc_ps, s->len + 1);
  int j;
  for (j = 0; j < s->len; j++) o[j].p = sc_sp(s, l, j, g), o[j].slot = j;
  qsort(o, (size_t)s->len, sizeof(sc_ps), sc_cmp_ps);
  for (j = 0; j < s->len; j++) {
    pos[j] = o[j].p;
    if (k) memcpy(k + (size_t)j * s->D, sc_sk(s, l, o[j].slot, g), sizeof(float) * s->D);
    if (v && s->Dv) memcpy(v + (size_t)j * s->Dv, sc_sv(s, l, o[j].slot, g), sizeof(float) * s->Dv);
  }
  free(o);
}

/* Two snapshots hold the same positions with the same rows in every layer and KV head (slot order aside). */
static int sc_held_same(const sc_snap *a, const sc_snap *b) {
  int l, g, n = a->len, same = 1;
  int32_t *pa, *pb;
  float *ka, *kb, *va, *vb;
  if (a->len != b->len || a->pos != b->pos) return 0;
  pa = KT_ALLOC(int32_t, n + 1), pb = KT_ALLOC(int32_t, n + 1);
  ka = KT_ALLOC(float, (size_t)n * a->D + 1), kb = KT_ALLOC(float, (size_t)n * a->D + 1);
  va = KT_ALLOC(float, (size_t)n * a->Dv + 1), vb = KT_ALLOC(float, (size_t)n * a->Dv + 1);
  for (l = 0; l < a->L && same; l++)
    for (g = 0; g < a->G && same; g++) {
      sc_gather(a, l, g, pa, ka, va);
      sc_gather(b, l, g, pb, kb, vb);
      same = memcmp(pa, pb, sizeof(int32_t) * n) == 0 && kt_same_bits(ka, kb, (size_t)n * a->D) &&
             kt_same_bits(va, vb, (size_t)n * a->Dv);
    }
  free(pa), free(pb), free(ka), free(kb), free(va), free(vb);
  return same;
}

/* ------------------------------------------------------------------------ */
/* The test scorer                                                           */

enum { SC_KEY0 = 0, SC_TABLE, SC_ROWS, SC_SUM };

typedef struct {
  int mode;              /* SC_KEY0: k[0]; SC_TABLE: tab by (layer, head, position); SC_ROWS: k[D-1] - v[Dv-1] / 2
                            (k[D-1] in a latent cache); SC_SUM: attn_sum */
  int L, G, D, Dv;       /* the cache's (Dv: its v_dim) */
  int latent;            /* the view's v must be NULL */
  const float *tab;      /* SC_TABLE: [L][G][tab_p] */
  int tab_p;
  const sc_snap *expect; /* non-NULL: every view is checked against it (the sequence before the eviction) */
  int exp_seq, exp_keep, exp_sum;
  long calls;            /* since the last reset */
  int fail_call;         /* this call returns fail_status after writing its scores (-1: none) */
  kva_status fail_status;
  int nan_call, nan_slot; /* this call writes a NaN at nan_slot (-1: the last slot) */
  long views_bad, views_unsorted;
} sc_user;

static void sc_user_init(sc_user *u, int mode, int L, int G, int D, int Dv, int latent) {
  memset(u, 0, sizeof *u);
  u->mode = mode, u->L = L, u->G = G, u->D = D, u->Dv = Dv, u->latent = latent;
  u->fail_call = -1, u->nan_call = -1, u->fail_status = KVA_OK;
}

static float sc_rule(const sc_user *u, int l, int g, int32_t pos, const float *k, const float *v) {
  switch (u->mode) {
  case SC_KEY0: return k[0];
  case SC_TABLE:
    if (l < 0 || l >= u->L || g < 0 || g >= u->G || pos < 0 || pos >= u->tab_p) return 0.0f;
    return u->tab[((size_t)l * u->G + g) * u->tab_p + pos];
  default: return k[u->D - 1] - (v ? 0.5f * v[u->Dv - 1] : 0.0f); /* 0.5 v is exact: no contraction question */
  }
}

/* The view of call `call` against the sequence before the eviction. */
static void sc_check_view(sc_user *u, const kva_score_view *vw, long call) {
  const sc_snap *s = u->expect;
  int l = (int)(call / u->G), g = (int)(call % u->G), n = s->len, ok_pos, ok_k, ok_v;
  int32_t *pos;
  float *k, *v;
  if (call >= (long)u->L * u->G) {
    u->views_bad++;
    KT_CHECK(0, "scorer called %ld times in one eviction (%d layers x %d KV heads)", call + 1, u->L, u->G);
    return;
  }
  if (vw->seq != u->exp_seq || vw->layer != l || vw->kv_head != g) u->views_bad++;
  KT_CHECK(vw->seq == u->exp_seq && vw->layer == l && vw->kv_head == g,
           "scorer call %ld: view seq %d layer %d kv_head %d, want seq %d layer %d kv_head %d (layer 0 first, then "
           "KV heads)", call, vw->seq, vw->layer, vw->kv_head, u->exp_seq, l, g);
  KT_CHECK(vw->n_layers == u->L && vw->n_kv_heads == u->G && vw->head_dim == u->D && vw->v_dim == u->Dv,
           "scorer call %ld: view n_layers %d n_kv_heads %d head_dim %d v_dim %d, want %d %d %d %d", call, vw->n_layers,
           vw->n_kv_heads, vw->head_dim, vw->v_dim, u->L, u->G, u->D, u->Dv);
  KT_CHECK(vw->n == n && vw->keep == u->exp_keep, "scorer call %ld: view n %d keep %d, want %d and %d", call, vw->n,
           vw->keep, n, u->exp_keep);
  KT_CHECK((vw->attn_sum != NULL) == (u->exp_sum != 0), "scorer call %ld: attn_sum %s with accumulate = %d", call,
           vw->attn_sum ? "given" : "NULL", u->exp_sum);
  KT_CHECK(u->latent ? vw->v == NULL : vw->v != NULL, "scorer call %ld: view v %s in a %s cache", call,
           vw->v ? "given" : "NULL", u->latent ? "latent" : "KV");
  if (vw->n != n || !vw->pos || !vw->k) {
    u->views_bad++;
    return;
  }
  pos = KT_ALLOC(int32_t, n + 1), k = KT_ALLOC(float, (size_t)n * s->D + 1), v = KT_ALLOC(float, (size_t)n * s->Dv + 1);
  sc_gather(s, l, g, pos, k, v);
  { /* ascending, and each view entry is kva_seq_read's token at that position (rows bit for bit) */
    sc_ps *o = KT_ALLOC(sc_ps, n + 1);
    int j, asc = 1;
    for (j = 0; j < n; j++) o[j].p = vw->pos[j], o[j].slot = j;
    for (j = 1; j < n; j++) asc &= vw->pos[j] > vw->pos[j - 1];
    qsort(o, (size_t)n, sizeof(sc_ps), sc_cmp_ps);
    ok_pos = 1, ok_k = 1, ok_v = 1;
    for (j = 0; j < n; j++) {
      ok_pos &= o[j].p == pos[j];
      ok_k &= kt_same_bits(k + (size_t)j * s->D, vw->k + (size_t)o[j].slot * s->D, (size_t)s->D);
      ok_v &= u->latent || !vw->v || kt_same_bits(v + (size_t)j * s->Dv, vw->v + (size_t)o[j].slot * s->Dv, (size_t)s->Dv);
    }
    if (!asc) u->views_unsorted++;
    KT_CHECK(asc, "scorer call %ld (layer %d head %d): view positions not ascending (%d %d %d ... %d)", call, l, g,
             vw->pos[0], n > 1 ? vw->pos[1] : -1, n > 2 ? vw->pos[2] : -1, vw->pos[n - 1]);
    free(o);
  }
  if (!ok_pos || !ok_k || !ok_v) u->views_bad++;
  KT_CHECK(ok_pos, "scorer call %ld (layer %d head %d): view positions are not the ones kva_seq_read returns", call,
           l, g);
  KT_CHECK(ok_k && ok_v, "scorer call %ld (layer %d head %d): view %s rows differ from kva_seq_read's at their "
           "positions", call, l, g, ok_k ? "V" : "K");
  if (vw->attn_sum) {
    int j, fin = 1;
    for (j = 0; j < n; j++) fin &= vw->attn_sum[j] >= 0.0f && vw->attn_sum[j] < 1e30f;
    KT_CHECK(fin, "scorer call %ld: attn_sum not finite and non-negative", call);
  }
  free(pos), free(k), free(v);
}

static kva_status sc_scorer(void *user, const kva_score_view *vw, float *scores) {
  sc_user *u = (sc_user *)user;
  long call = u->calls++;
  int j;
  if (u->expect) sc_check_view(u, vw, call);
  if (u->mode == SC_SUM) {
    KT_CHECK(vw->attn_sum != NULL, "SC_SUM scorer: attn_sum NULL under accumulate = 1");
    for (j = 0; j < vw->n; j++) scores[j] = vw->attn_sum ? vw->attn_sum[j] : 0.0f;
  } else {
    for (j = 0; j < vw->n; j++)
      scores[j] = sc_rule(u, vw->layer, vw->kv_head, vw->pos[j], vw->k + (size_t)j * vw->head_dim,
                          vw->v && !u->latent ? vw->v + (size_t)j * vw->v_dim : NULL);
  }
  if (call == u->nan_call && vw->n > 0) scores[u->nan_slot < 0 || u->nan_slot >= vw->n ? vw->n - 1 : u->nan_slot] = sc_nan();
  if (call == u->fail_call) return u->fail_status;
  return KVA_OK;
}

/* ------------------------------------------------------------------------ */
/* fp64 references of the built-in scorers                                   */

static void sc_ref_key_norm(int n, int D, const float *k, double *out) {
  int j, d;
  for (j = 0; j < n; j++) {
    double s = 0.0;
    for (d = 0; d < D; d++) s += (double)k[(size_t)j * D + d] * (double)k[(size_t)j * D + d];
    out[j] = -sqrt(s);
  }
}

/* kva_score_attention's rule for layer l, KV head g of G: softmax over the keys at or before each query's
   position of scale q.k, summed over the queries and the group's heads, then average pooling with zero padding. */
static void sc_ref_attention(const kva_score_queries *sq, int l, int g, int G, int n, int D, const int32_t *pos,
                             const float *k, double *out) {
  int H = sq->n_heads, grp = H / G, nq = sq->n_q, t, h, j, i, d, half;
  double scale = sq->scale > 0.0f ? (double)sq->scale : 1.0 / sqrt((double)D);
  double *raw = KT_ALLOC(double, n + 1), *lg = KT_ALLOC(double, n + 1);
  for (j = 0; j < n; j++) raw[j] = 0.0;
  for (t = 0; t < nq; t++) {
    int32_t qp = sq->q_pos ? sq->q_pos[t] : pos[n - nq + t];
    for (h = g * grp; h < (g + 1) * grp; h++) {
      size_t stride = sq->layer_stride ? sq->layer_stride : (size_t)nq * H * D;
      const float *q = sq->q + (size_t)l * stride + ((size_t)t * H + h) * D;
      double mx = -INFINITY, sum = 0.0;
      int seen = 0;
      for (j = 0; j < n; j++) {
        double dot = 0.0;
        if (pos[j] > qp) continue;
        for (d = 0; d < D; d++) dot += (double)q[d] * (double)k[(size_t)j * D + d];
        lg[j] = scale * dot;
        if (lg[j] > mx) mx = lg[j];
        seen = 1;
      }
      if (!seen) continue;
      for (j = 0; j < n; j++)
        if (pos[j] <= qp) sum += exp(lg[j] - mx);
      for (j = 0; j < n; j++)
        if (pos[j] <= qp) raw[j] += exp(lg[j] - mx) / sum;
    }
  }
  half = sq->pool > 1 ? sq->pool / 2 : 0;
  for (j = 0; j < n; j++) {
    double s = 0.0;
    for (i = j - half; i <= j + half; i++)
      if (i >= 0 && i < n) s += raw[i];
    out[j] = half ? s / (double)sq->pool : s;
  }
  free(raw), free(lg);
}

/* ------------------------------------------------------------------------ */
/* The keep rule                                                             */

typedef struct {
  const sc_user *u;             /* the test scorer's rule, or NULL and: */
  const kva_score_queries *sq;  /* kva_score_attention's, or NULL: kva_score_key_norm's */
} sc_ref;

static void sc_ref_scores(const sc_ref *r, const sc_snap *s, int l, int g, const int32_t *pos, const float *k,
                          const float *v, double *out) {
  int j, n = s->len;
  if (r->u)
    for (j = 0; j < n; j++)
      out[j] = (double)sc_rule(r->u, l, g, pos[j], k + (size_t)j * s->D, s->Dv ? v + (size_t)j * s->Dv : NULL);
  else if (r->sq)
    sc_ref_attention(r->sq, l, g, s->G, n, s->D, pos, k, out);
  else
    sc_ref_key_norm(n, s->D, k, out);
}

typedef struct {
  double s;
  int32_t p;
} sc_cand;

static int sc_cmp_cand(const void *a, const void *b) {
  const sc_cand *x = (const sc_cand *)a, *y = (const sc_cand *)b;
  if (x->s < y->s) return -1;
  if (x->s > y->s) return 1;
  return (x->p > y->p) - (x->p < y->p);
}

typedef struct {
  int L, G, e, keep; /* e evicted in every layer and KV head; keep = held - e */
  int n_sink, n_recent;
  int32_t *kept;     /* [L][G][keep] survivors, ascending */
  char *near;        /* [L][G] the boundary scores are within the tie tolerance */
  int n_near;
} sc_want;

static void sc_want_free(sc_want *w) {
  free(w->kept), free(w->near);
  w->kept = NULL, w->near = NULL;
}

/* a sink, or at one of the n_recent newest positions (pos_next: kva_seq_pos at the eviction) */
static int sc_protected(int32_t p, int pos_next, int n_sink, int n_recent) {
  return p < n_sink || p >= pos_next - n_recent;
}

static void sc_expect(const sc_snap *s, int n_sink, int n_recent, int want, const sc_ref *ref, double tie_rel,
                      sc_want *w) {
  int L = s->L, G = s->G, n = s->len, l, g, j, i, e = want > 0 ? want : 0;
  int32_t *pos = KT_ALLOC(int32_t, n + 1);
  float *k = KT_ALLOC(float, (size_t)n * s->D + 1), *v = KT_ALLOC(float, (size_t)n * s->Dv + 1);
  double *sc = KT_ALLOC(double, n + 1);
  sc_cand *cd = KT_ALLOC(sc_cand, n + 1);
  char *gone = KT_ALLOC(char, n + 1);
  w->L = L, w->G = G, w->n_sink = n_sink, w->n_recent = n_recent, w->n_near = 0;
  for (l = 0; l < L; l++)
    for (g = 0; g < G; g++) {
      int nfree = 0;
      sc_gather(s, l, g, pos, NULL, NULL);
      for (j = 0; j < n; j++) nfree += !sc_protected(pos[j], s->pos, n_sink, n_recent);
      if (nfree < e) e = nfree;
    }
  w->e = e, w->keep = n - e;
  w->kept = KT_ALLOC(int32_t, (size_t)L * G * (n - e) + 1);
  w->near = KT_ALLOC(char, (size_t)L * G);
  memset(w->near, 0, (size_t)L * G);
  for (l = 0; l < L; l++)
    for (g = 0; g < G; g++) {
      int nc = 0, m = 0;
      int32_t *kept = w->kept + ((size_t)l * G + g) * (n - e);
      sc_gather(s, l, g, pos, k, v);
      if (e > 0) sc_ref_scores(ref, s, l, g, pos, k, v, sc);
      memset(gone, 0, (size_t)n + 1);
      for (j = 0; j < n && e > 0; j++)
        if (!sc_protected(pos[j], s->pos, n_sink, n_recent)) cd[nc].s = sc[j], cd[nc].p = pos[j], nc++;
      qsort(cd, (size_t)nc, sizeof(sc_cand), sc_cmp_cand);
      if (tie_rel > 0.0 && e > 0 && e < nc) {
        double a = cd[e - 1].s, b = cd[e].s;
        if (b - a <= tie_rel * fmax(fabs(a), fabs(b)) + 1e-30) w->near[l * G + g] = 1, w->n_near++;
      }
      for (i = 0; i < e; i++)
        for (j = 0; j < n; j++)
          if (pos[j] == cd[i].p) gone[j] = 1;
      for (j = 0; j < n; j++)
        if (!gone[j]) kept[m++] = pos[j];
    }
  free(pos), free(k), free(v), free(sc), free(cd), free(gone);
}

static int sc_all_zero(const float *x, int n) {
  int i;
  for (i = 0; i < n; i++)
    if (x[i] != 0.0f) return 0;
  return 1;
}

/* After an eviction (w) and an append of n_new: len and pos, every head's positions (the reference's survivors
   and the new positions; for a near tie only the protected and new ones), the survivors' rows bit for bit as
   `b` read them, the new slots zero.  Returns 1 when everything matched. */
static int sc_check_after(const sc_snap *b, const sc_want *w, kva_cache *c, int seq, int n_new, const char *what) {
  sc_snap a;
  int l, g, j, all_ok = 1, nb = b->len, na = nb - w->e + n_new, G = b->G, D = b->D, Dv = b->Dv;
  int *idx;
  int32_t *got, *bp;
  sc_snap_take(&a, c, seq, b->L, G, D, Dv);
  if (a.len != na || a.pos != b->pos + n_new) {
    KT_CHECK(0, "%s: kva_seq_len %d, kva_seq_pos %d; want %d and %d (%d held, %d evicted per layer and KV head, %d "
             "appended)", what, a.len, a.pos, na, b->pos + n_new, nb, w->e, n_new);
    sc_snap_free(&a);
    return 0;
  }
  idx = KT_ALLOC(int, b->pos + 1), got = KT_ALLOC(int32_t, na + 1), bp = KT_ALLOC(int32_t, nb + 1);
  for (l = 0; l < b->L; l++)
    for (g = 0; g < G; g++) {
      const int32_t *kept = w->kept + ((size_t)l * G + g) * w->keep;
      int rows_ok = 1, set_ok = 1, i;
      for (j = 0; j <= b->pos; j++) idx[j] = -1;
      for (j = 0; j < nb; j++) {
        int32_t p = sc_sp(b, l, j, g);
        if (p >= 0 && p < b->pos) idx[p] = j;
      }
      for (j = 0; j < na; j++) {
        int32_t p = sc_sp(&a, l, j, g);
        got[j] = p;
        if (p >= b->pos && p < b->pos + n_new)
          rows_ok &= sc_all_zero(sc_sk(&a, l, j, g), D) && (!Dv || sc_all_zero(sc_sv(&a, l, j, g), Dv));
        else if (p >= 0 && p < b->pos && idx[p] >= 0)
          rows_ok &= kt_same_bits(sc_sk(&a, l, j, g), sc_sk(b, l, idx[p], g), (size_t)D) &&
                     (!Dv || kt_same_bits(sc_sv(&a, l, j, g), sc_sv(b, l, idx[p], g), (size_t)Dv));
        else
          rows_ok = 0;
      }
      qsort(got, (size_t)na, sizeof(int32_t), sc_cmp_i32);
      for (i = 0; i < n_new; i++) set_ok &= got[w->keep + i] == b->pos + i;
      if (!w->near[l * G + g]) {
        for (i = 0; i < w->keep; i++) set_ok &= got[i] == kept[i];
      } else { /* a near tie: no duplicates, the protected positions all there */
        int m = 0;
        for (i = 1; i < na; i++) set_ok &= got[i] != got[i - 1];
        for (j = 0; j < nb; j++) bp[j] = sc_sp(b, l, j, g);
        qsort(bp, (size_t)nb, sizeof(int32_t), sc_cmp_i32);
        for (j = 0; j < nb; j++)
          if (sc_protected(bp[j], b->pos, w->n_sink, w->n_recent)) {
            while (m < w->keep && got[m] < bp[j]) m++;
            set_ok &= m < w->keep && got[m] == bp[j];
          }
      }
      KT_CHECK(rows_ok, "%s: layer %d KV head %d: a held row is not the one read before the eviction at its position "
               "(or an appended slot is not zero)", what, l, g);
      KT_CHECK(set_ok, "%s: layer %d KV head %d holds other positions than the rule keeps (%d held before, %d evicted, "
               "n_sink %d, n_recent %d)", what, l, g, nb, w->e, w->n_sink, w->n_recent);
      if (!set_ok && kt_fail_prints <= 4) {
        printf("    library:");
        for (i = 0; i < na && i < 48; i++) printf(" %d", got[i]);
        printf("\n    rule:   ");
        for (i = 0; i < w->keep && i < 48; i++) printf(" %d", kept[i]);
        printf(" + %d new\n", n_new);
      }
      all_ok &= rows_ok && set_ok;
    }
  free(idx), free(got), free(bp);
  sc_snap_free(&a);
  return all_ok;
}

/* ------------------------------------------------------------------------ */
/* Running a sequence                                                        */

typedef struct {
  kva_cache *c;
  int seq, L, G, D, Dv; /* Dv 0: latent */
  kva_evict pol;        /* the policy set (its budget, n_sink, n_recent, rollback) */
  sc_user *u;           /* the test scorer's data, NULL for a built-in scorer */
  sc_ref ref;
  double tie_rel;       /* > 0: heads with near ties at the boundary are checked loosely (counted) */
  long heads, heads_near;
  const char *what;
} sc_run;

static void sc_run_init(sc_run *x, kva_cache *c, int seq, int L, int G, int D, int Dv, const kva_evict *pol,
                        sc_user *u, const char *what) {
  memset(x, 0, sizeof *x);
  x->c = c, x->seq = seq, x->L = L, x->G = G, x->D = D, x->Dv = Dv, x->pol = *pol, x->u = u, x->what = what;
  x->ref.u = u;
}

/* kva_seq_append(amount) (compress 0) or kva_seq_compress(amount), checked against the rule. Returns e. */
static int sc_apply(sc_run *x, int compress, int amount) {
  sc_snap b;
  sc_want w;
  int want, e;
  kva_status st;
  sc_snap_take(&b, x->c, x->seq, x->L, x->G, x->D, x->Dv);
  if (compress) want = b.len - amount;
  else want = (x->pol.rollback ? b.len : b.len + amount) - x->pol.budget;
  sc_expect(&b, x->pol.n_sink, x->pol.n_recent, want, &x->ref, x->tie_rel, &w);
  if (x->u) x->u->expect = &b, x->u->exp_seq = x->seq, x->u->exp_keep = w.keep, x->u->calls = 0;
  st = compress ? kva_seq_compress(x->c, x->seq, amount) : kva_seq_append(x->c, x->seq, amount);
  KT_CHECK(st == KVA_OK, "%s: %s(%d) returned %d (%s) (%d held, pos %d)", x->what,
           compress ? "kva_seq_compress" : "kva_seq_append", amount, (int)st, kva_status_str(st), b.len, b.pos);
  if (x->u) {
    KT_CHECK(x->u->calls == (w.e > 0 ? (long)x->L * x->G : 0L),
             "%s: the scorer was called %ld times, want %d (%d layers x %d KV heads, %d evicted each)", x->what,
             x->u->calls, w.e > 0 ? x->L * x->G : 0, x->L, x->G, w.e);
    x->u->expect = NULL;
  }
  if (st == KVA_OK) sc_check_after(&b, &w, x->c, x->seq, compress ? 0 : amount, x->what);
  if (w.e > 0) x->heads += (long)x->L * x->G, x->heads_near += w.n_near;
  e = w.e;
  sc_want_free(&w);
  sc_snap_free(&b);
  return e;
}

/* Random K/V for the newest n tokens of every layer, stored; the keys' first channel is often one of a few values
   (ties for SC_KEY0).  Dv 0: a latent cache. */
static void sc_store(kva_cache *c, int seq, int L, int G, int D, int Dv, int n, kt_rng *r) {
  static const float few[4] = {-0.5f, 0.0f, 0.25f, 0.5f};
  float *k = KT_ALLOC(float, (size_t)n * G * D + 1), *v = KT_ALLOC(float, (size_t)n * G * Dv + 1);
  int l, i;
  for (l = 0; l < L; l++) {
    kt_fill(r, k, (size_t)n * G * D, -1.0f, 1.0f);
    kt_fill(r, v, (size_t)n * G * Dv, -1.0f, 1.0f);
    for (i = 0; i < n * G; i++)
      if (kt_int(r, 0, 1)) k[(size_t)i * D] = few[kt_int(r, 0, 3)];
    KT_STATUS(kva_store(c, seq, l, k, Dv ? v : NULL, n), KVA_OK);
  }
  free(k), free(v);
}

static kva_cache *sc_cache(int L, int G, int D, int Dv, int bs, int n_blocks, kva_dtype t) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  kt_desc_init(&d, L, G, D, bs, n_blocks, 16, t);
  d.v_dim = Dv;
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  return c;
}

static kva_evict sc_policy(int budget, int n_sink, int n_recent, sc_user *u) {
  kva_evict e;
  memset(&e, 0, sizeof e);
  e.kind = KVA_EVICT_SCORE, e.budget = budget, e.n_sink = n_sink, e.n_recent = n_recent;
  e.score = sc_scorer, e.score_user = u;
  return e;
}

static float sc_table_value(kt_rng *r) {
  static const float vals[8] = {-1.0f, 0.0f, 0.5f, 0.5f, 1.0f, 2.0f, 3.0f, -0.0f};
  int k = kt_int(r, 0, 11);
  if (k == 10) return INFINITY;
  if (k == 11) return -INFINITY;
  return k < 8 ? vals[k] : kt_uniform(r, -2.0f, 2.0f);
}

/* A table scorer's user over tp positions per layer and KV head, the table drawn from sc_table_value. */
static void sc_table_user(sc_user *u, float *tab, int L, int G, int D, int Dv, int tp, kt_rng *r) {
  int i;
  for (i = 0; i < L * G * tp; i++) tab[i] = sc_table_value(r);
  sc_user_init(u, SC_TABLE, L, G, D, Dv, 0);
  u->tab = tab, u->tab_p = tp;
}

/* A new sequence holding n appended and stored tokens (random rows); -1 if that failed. */
static int sc_seq_stored(kva_cache *c, int L, int G, int D, int Dv, int n, kt_rng *r) {
  int seq = -1;
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  if (seq < 0) return -1;
  KT_STATUS(kva_seq_append(c, seq, n), KVA_OK);
  sc_store(c, seq, L, G, D, Dv, n, r);
  return seq;
}

/* The newest token's attention (n_q 1, grp query heads per KV head) in every layer against fp64 over the rows
   read back (every held key is at or before the query). */
static void sc_attn_check(const sc_run *x, int grp, kt_rng *r) {
  int H = x->G * grp, D = x->D, Dv = x->Dv, l, h, j, d;
  kva_attn a;
  sc_snap s;
  float *q = KT_ALLOC(float, (size_t)H * D), *out = KT_ALLOC(float, (size_t)H * Dv + 1);
  double *lg, *o = KT_ALLOC(double, (size_t)Dv + 1);
  kt_attn_init(&a, H, x->G, D, Dv);
  sc_snap_take(&s, x->c, x->seq, x->L, x->G, D, Dv);
  lg = KT_ALLOC(double, s.len + 1);
  for (l = 0; l < x->L; l++) {
    kva_status st;
    double vmax = 0.0, tol;
    kt_fill(r, q, (size_t)H * D, -1.0f, 1.0f);
    st = kva_attend_cache(x->c, x->seq, l, &a, q, 1, out);
    KT_CHECK(st == KVA_OK, "%s: kva_attend_cache after eviction returned %d", x->what, (int)st);
    if (st != KVA_OK) continue;
    for (h = 0; h < H; h++) {
      int g = h / grp;
      double mx = -INFINITY, sum = 0.0, err = 0.0;
      for (j = 0; j < s.len; j++) {
        double dot = 0.0;
        for (d = 0; d < D; d++) dot += (double)q[(size_t)h * D + d] * (double)sc_sk(&s, l, j, g)[d];
        lg[j] = dot / sqrt((double)D);
        if (lg[j] > mx) mx = lg[j];
      }
      for (d = 0; d < Dv; d++) o[d] = 0.0;
      for (j = 0; j < s.len; j++) sum += (lg[j] = exp(lg[j] - mx));
      for (j = 0; j < s.len; j++)
        for (d = 0; d < Dv; d++) {
          double vv = (double)sc_sv(&s, l, j, g)[d];
          o[d] += lg[j] / sum * vv;
          if (fabs(vv) > vmax) vmax = fabs(vv);
        }
      for (d = 0; d < Dv; d++) {
        double diff = fabs((double)out[(size_t)h * Dv + d] - o[d]);
        if (!(diff <= err)) err = diff == diff ? diff : 1e30; /* a NaN output fails */
      }
      tol = fmax(2e-5, 4e-6 * (1.0 + sqrt((double)D))) * (1.0 + vmax);
      KT_CHECK(err <= tol, "%s: layer %d head %d: attention over the held rows differs from fp64 by %.3g (tol %.3g, "
               "%d held)", x->what, l, h, err, tol, s.len);
    }
  }
  sc_snap_free(&s);
  free(q), free(out), free(lg), free(o);
}

/* ------------------------------------------------------------------------ */
/* Directed cases                                                            */

/* positions of head g in layer l, ascending, as a string "0 4 5" compared with want */
static int sc_positions_are(kva_cache *c, int seq, int L, int G, int D, int l, int g, const int32_t *want, int n) {
  sc_snap s;
  int32_t *p;
  int same;
  sc_snap_take(&s, c, seq, L, G, D, 0);
  if (s.len != n) {
    sc_snap_free(&s);
    return 0;
  }
  p = KT_ALLOC(int32_t, n + 1);
  sc_gather(&s, l, g, p, NULL, NULL);
  same = memcmp(p, want, sizeof(int32_t) * n) == 0;
  free(p);
  sc_snap_free(&s);
  return same;
}

static void sc_directed_ties(void) {
  /* position:                  0     1       2     3     4      5     6      7     8     9 */
  static const float tab[10] = {5.0f, 0.0f, 1.0f, 1.0f, 0.0f, 1.0f, -0.0f, 0.0f, 3.0f, 2.0f};
  static const int budgets[7] = {10, 9, 8, 5, 4, 3, 1};
  static const int32_t k10[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, k9[9] = {0, 2, 3, 4, 5, 6, 7, 8, 9},
                       k8[8] = {0, 2, 3, 4, 5, 7, 8, 9}, /* -0 (6) before +0 (7): a tie, the older first */
                       k5[5] = {0, 4, 5, 8, 9}, k4[4] = {0, 4, 8, 9}, k3[3] = {0, 8, 9};
  const int32_t *keeps[7];
  static const int nkeep[7] = {10, 9, 8, 5, 4, 3, 3};
  float table[10];
  sc_user u;
  sc_run x;
  kva_evict e;
  kt_rng r;
  kva_cache *c = sc_cache(1, 1, 2, 2, 3, 32, KVA_F32);
  int a = -1, f = -1, i;
  kt_begin("scorers: directed keep sets (ties to the oldest, -0 = +0, -Inf first, +Inf last, sinks, recent)");
  if (!c) return;
  keeps[0] = k10, keeps[1] = k9, keeps[2] = k8, keeps[3] = k5, keeps[4] = k4, keeps[5] = k3, keeps[6] = k3;
  memcpy(table, tab, sizeof table);
  table[1] = -INFINITY, table[4] = INFINITY;
  /* unprotected 1..7 (sink 0, recent 8 9) in eviction order: 1 (-Inf), 6 (-0), 7 (+0), 2, 3, 5 (1), 4 (+Inf) */
  kt_seed(&r, 0xD1);
  sc_user_init(&u, SC_TABLE, 1, 1, 2, 2, 0);
  u.tab = table, u.tab_p = 10;
  a = sc_seq_stored(c, 1, 1, 2, 2, 10, &r);
  e = sc_policy(8, 1, 2, &u);
  KT_STATUS(kva_seq_set_evict(c, a, &e), KVA_OK);
  for (i = 0; i < 7; i++) {
    KT_STATUS(kva_seq_fork(c, a, &f), KVA_OK); /* the fork copies the policy */
    sc_run_init(&x, c, f, 1, 1, 2, 2, &e, &u, "directed ties");
    sc_apply(&x, 1, budgets[i]);
    KT_CHECK(sc_positions_are(c, f, 1, 1, 2, 0, 0, keeps[i], nkeep[i]),
             "directed ties: kva_seq_compress(%d) kept other positions than the %d worked out by hand", budgets[i],
             nkeep[i]);
    KT_STATUS(kva_seq_free(c, f), KVA_OK);
  }
  kva_cache_destroy(c);
}

/* Heads evict different tokens under a first policy; a second policy with more sinks and recent tokens then
   protects more of some heads than of others: every layer and head evicts the fewest any could. Recent means
   the n_recent newest positions, held or not: layer 1 head 0 lost positions 14 and 15 to the first policy and
   so protects no recent token. */
static void sc_directed_fewest(void) {
  enum { L = 2, G = 2, D = 3, P = 16 };
  float tab[L * G * P];
  static const int low[L * G][2] = {{0, 1}, {5, 6}, {14, 15}, {2, 9}};
  sc_user u;
  sc_run x;
  kva_evict e;
  kt_rng r;
  kva_cache *c = sc_cache(L, G, D, D, 4, 32, KVA_F16);
  int seq = -1, i, h, ev;
  kt_begin("scorers: every layer and KV head evicts the fewest any could (n_recent: the newest positions)");
  if (!c) return;
  kt_seed(&r, 0xFE);
  for (h = 0; h < L * G; h++)
    for (i = 0; i < P; i++) tab[h * P + i] = (i == low[h][0] || i == low[h][1]) ? -5.0f : kt_uniform(&r, 0.0f, 1.0f);
  sc_user_init(&u, SC_TABLE, L, G, D, D, 0);
  u.tab = tab, u.tab_p = P;
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK); /* a second id: the view's seq is not 0 */
  KT_STATUS(kva_seq_append(c, seq, P), KVA_OK);
  sc_store(c, seq, L, G, D, D, P, &r);
  e = sc_policy(P, 0, 0, &u);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  sc_run_init(&x, c, seq, L, G, D, D, &e, &u, "fewest: first policy");
  sc_apply(&x, 1, P - 2);
  e = sc_policy(6, 4, 2, &u);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  sc_run_init(&x, c, seq, L, G, D, D, &e, &u, "fewest: second policy");
  /* unprotected: L0H0 14 - {2,3} - {14,15} = 10; L0H1 14 - {0..3} - {14,15} = 8; L1H0 14 - {0..3} = 10 (14, 15
     gone); L1H1 14 - {0,1,3} - {14,15} = 9: 8 go everywhere, 6 stay */
  ev = sc_apply(&x, 1, 1);
  KT_CHECK(ev == 8 && kva_seq_len(c, seq) == 6, "fewest: %d evicted (reference), %d held; want 8 and 6", ev,
           kva_seq_len(c, seq));
  { /* layer 1 head 0: its 4 sinks and the 2 highest scores of positions 4..13 (12, 13 are not recent) */
    int32_t l1h0[6] = {0, 1, 2, 3, -1, -1}, t;
    const float *tb = tab + 2 * P;
    for (i = 4; i < 14; i++) {
      if (l1h0[4] < 0 || tb[i] >= tb[l1h0[4]]) l1h0[5] = l1h0[4], l1h0[4] = i; /* ties: the newer stays */
      else if (l1h0[5] < 0 || tb[i] >= tb[l1h0[5]]) l1h0[5] = i;
    }
    if (l1h0[4] > l1h0[5]) t = l1h0[4], l1h0[4] = l1h0[5], l1h0[5] = t;
    KT_CHECK(sc_positions_are(c, seq, L, G, D, 1, 0, l1h0, 6),
             "fewest: layer 1 head 0 should keep its sinks and the two best of 4..13 (0 1 2 3 %d %d)", l1h0[4], l1h0[5]);
  }
  kva_cache_destroy(c);
}

/* Nothing evictable (every held token protected): no scorer call, nothing evicted. */
static void sc_directed_protected(void) {
  sc_user u;
  sc_run x;
  kva_evict e;
  kt_rng r;
  kva_cache *c = sc_cache(2, 2, 4, 4, 4, 32, KVA_F32);
  int seq = -1;
  kt_begin("scorers: nothing evictable: the scorer is not called");
  if (!c) return;
  kt_seed(&r, 0xA7);
  sc_user_init(&u, SC_KEY0, 2, 2, 4, 4, 0);
  seq = sc_seq_stored(c, 2, 2, 4, 4, 6, &r);
  e = sc_policy(6, 3, 3, &u);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  sc_run_init(&x, c, seq, 2, 2, 4, 4, &e, &u, "nothing evictable");
  KT_CHECK(sc_apply(&x, 1, 1) == 0, "nothing evictable: compress");
  KT_CHECK(sc_apply(&x, 0, 1) == 0, "nothing evictable: append");
  KT_CHECK(kva_seq_len(c, seq) == 7, "nothing evictable: %d held, want 7", kva_seq_len(c, seq));
  sc_store(c, seq, 2, 2, 4, 4, 1, &r);
  KT_CHECK(sc_apply(&x, 0, 1) == 1, "then the oldest unprotected token (position 3) goes");
  kva_cache_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* Random shapes against the rule                                            */

static void sc_random_rule(void) {
  static const int dims[4] = {1, 7, 33, 64}, bss[3] = {1, 3, 16};
  static const kva_dtype types[3] = {KVA_F32, KVA_F16, KVA_INT8};
  kt_rng r;
  int it;
  long views_bad = 0, heads = 0;
  kt_begin("scorers: the keep rule with a test scorer (random shapes, types, budgets; compress and decode)");
  kt_seed(&r, 0x5C0E);
  for (it = 0; it < kt_iters(200); it++) {
    int L = kt_int(&r, 1, 3), G = kt_int(&r, 1, 3), D = dims[kt_int(&r, 0, 3)];
    int Dv = it % 3 == 1 ? kt_int(&r, 1, 40) : D, bs = bss[kt_int(&r, 0, 2)], P = kt_int(&r, 1, 90);
    int steps = kt_iters(kt_int(&r, 8, 30)), mode = kt_int(&r, 0, 2), before = kt_int(&r, 0, 1), s, big;
    int n_sink = kt_int(&r, 0, 1) ? 0 : kt_int(&r, 1, 3), n_recent = kt_int(&r, 0, 1) ? 0 : kt_int(&r, 1, 4);
    int budget = n_sink + n_recent + (kt_int(&r, 0, 1) ? kt_int(&r, 1, 6) : kt_int(&r, 20, 60)), tab_p, i;
    kva_dtype t = types[kt_int(&r, 0, 2)];
    kva_cache_desc d;
    kva_cache *c = NULL;
    sc_user u;
    sc_run x;
    kva_evict e;
    float *tab;
    char what[160];
    int seq = -1;
    big = budget + 3;
    tab_p = P + steps * big + 8;
    kt_desc_init(&d, L, G, D, bs, (P + 2 * budget + 40) / bs + 4, 4, t);
    d.v_dim = Dv;
    if (it % 7 == 3) d.rotate = KVA_ROTATE_K | KVA_ROTATE_V;
    sprintf(what, "random rule it %d: L %d G %d D %d Dv %d bs %d %s%s mode %d budget %d sink %d recent %d%s", it, L,
            G, D, Dv, bs, kva_dtype_name(t), d.rotate ? " rotated" : "", mode, budget, n_sink, n_recent,
            it % 5 == 4 ? " rollback" : "");
    if (kva_cache_create(&d, &c) != KVA_OK) {
      KT_CHECK(0, "%s: kva_cache_create", what);
      continue;
    }
    tab = KT_ALLOC(float, (size_t)L * G * tab_p);
    for (i = 0; i < L * G * tab_p; i++) tab[i] = sc_table_value(&r);
    sc_user_init(&u, mode, L, G, D, Dv, 0);
    u.tab = tab, u.tab_p = tab_p;
    e = sc_policy(budget, n_sink, n_recent, &u);
    e.rollback = it % 5 == 4;
    KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
    sc_run_init(&x, c, seq, L, G, D, Dv, &e, &u, what);
    if (before) {
      KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
      sc_apply(&x, 0, P); /* held 0: nothing to evict, a prefill beyond the budget is held whole */
    } else {
      KT_STATUS(kva_seq_append(c, seq, P), KVA_OK);
    }
    sc_store(c, seq, L, G, D, Dv, P, &r);
    if (!before) KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
    sc_apply(&x, 1, kt_int(&r, 1, P + 3));
    if (it % 4 == 0) { /* the compress ended the step */
      float *kk = KT_ALLOC(float, (size_t)G * D), *vv = KT_ALLOC(float, (size_t)G * Dv);
      memset(kk, 0, sizeof(float) * G * D), memset(vv, 0, sizeof(float) * G * Dv);
      KT_CHECK(kva_store(c, seq, 0, kk, vv, 1) != KVA_OK, "%s: kva_store accepted right after kva_seq_compress", what);
      free(kk), free(vv);
    }
    for (s = 0; s < steps; s++) {
      int n = s % 9 == 8 ? kt_int(&r, 1, big) : kt_int(&r, 1, 3);
      sc_apply(&x, 0, n);
      sc_store(c, seq, L, G, D, Dv, n, &r);
      if (s % 10 == 5) sc_apply(&x, 1, kt_int(&r, 1, budget));
    }
    sc_apply(&x, 0, 1);
    sc_store(c, seq, L, G, D, Dv, 1, &r);
    sc_attn_check(&x, kt_int(&r, 1, 3), &r);
    views_bad += u.views_bad;
    heads += x.heads;
    free(tab);
    kva_cache_destroy(c);
  }
  KT_CHECK(heads > 0, "random rule: no eviction happened at all");
  if (sc_verbose()) fprintf(stderr, "  scorers: random rule: %ld head evictions checked, %ld bad views\n", heads, views_bad);
}

/* ------------------------------------------------------------------------ */
/* A refused eviction changes nothing                                        */

/* Store the step's newest n tokens again with the rows `b` read (F32 / F16 caches keep them bit for bit). */
static kva_status sc_restore_step(kva_cache *c, int seq, const sc_snap *b, int n) {
  int l, t, g, sl;
  kva_status st = KVA_OK;
  float *kk = KT_ALLOC(float, (size_t)n * b->G * b->D + 1), *vv = KT_ALLOC(float, (size_t)n * b->G * b->Dv + 1);
  for (l = 0; l < b->L && st == KVA_OK; l++) {
    for (t = 0; t < n; t++)
      for (g = 0; g < b->G; g++) {
        int32_t p = b->pos - n + t;
        float *kd = kk + ((size_t)t * b->G + g) * b->D, *vd = vv + ((size_t)t * b->G + g) * b->Dv;
        for (sl = 0; sl < b->len && sc_sp(b, l, sl, g) != p; sl++) {
        }
        if (sl == b->len) {
          memset(kd, 0, sizeof(float) * b->D);
          memset(vd, 0, sizeof(float) * b->Dv);
        } else {
          memcpy(kd, sc_sk(b, l, sl, g), sizeof(float) * b->D);
          memcpy(vd, sc_sv(b, l, sl, g), sizeof(float) * b->Dv);
        }
      }
    st = kva_store(c, seq, l, kk, vv, n);
  }
  free(kk), free(vv);
  return st;
}

static void sc_failures(void) {
  enum { L = 2, G = 3, D = 5, Dv = 3, P = 20 };
  typedef struct {
    int nan_call, nan_slot, fail_call;
    int status, want;
  } sc_case;
  static const sc_case cases[] = {
      {0, 5, -1, 0, KVA_ERR_ARG},                          /* NaN on an unprotected token */
      {L * G - 1, 5, -1, 0, KVA_ERR_ARG},                  /* on the last layer and head only */
      {2, 0, -1, 0, KVA_ERR_ARG},                          /* on a sink */
      {3, -1, -1, 0, KVA_ERR_ARG},                         /* on the newest (recent) token */
      {-1, 0, 0, KVA_ERR_NOMEM, KVA_ERR_NOMEM},            /* statuses come back as they are */
      {-1, 0, L * G - 1, KVA_ERR_UNSUPPORTED, KVA_ERR_UNSUPPORTED},
      {-1, 0, 1, KVA_ERR_FULL, KVA_ERR_FULL},
      {-1, 0, 0, KVA_ERR_STEP, KVA_ERR_STEP},
      {-1, 0, L * G - 1, 13, KVA_ERR_ARG},                 /* not a kva_status */
  };
  int nc = (int)(sizeof cases / sizeof cases[0]), ci, op, phase;
  float tab[L * G * 200];
  sc_user u;
  sc_run x;
  kva_evict e;
  kt_rng r;
  kva_cache *c = sc_cache(L, G, D, Dv, 4, 48, KVA_F16);
  int seq = -1, other = -1, i;
  kt_begin("scorers: a NaN or an error status refuses the eviction and changes nothing");
  if (!c) return;
  kt_seed(&r, 0xFA11);
  for (i = 0; i < L * G * 200; i++) tab[i] = sc_table_value(&r);
  sc_user_init(&u, SC_TABLE, L, G, D, Dv, 0);
  u.tab = tab, u.tab_p = 200;
  KT_STATUS(kva_seq_new(c, &other), KVA_OK);
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  KT_STATUS(kva_seq_append(c, other, 5), KVA_OK);
  sc_store(c, other, L, G, D, Dv, 5, &r);
  KT_STATUS(kva_seq_append(c, seq, P), KVA_OK);
  sc_store(c, seq, L, G, D, Dv, P, &r);
  e = sc_policy(12, 2, 3, &u);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  sc_run_init(&x, c, seq, L, G, D, Dv, &e, &u, "failures");
  for (phase = 0; phase < 2; phase++) { /* 0: nothing evicted yet, mid-step; 1: after evictions, mid-step */
    int step_n = phase == 0 ? P : 1;
    for (ci = 0; ci < nc; ci++)
      for (op = 0; op < 2; op++) { /* 0: compress, 1: append */
        sc_snap b, a, ob, oa;
        kva_cache_stats s0, s1;
        kva_status st;
        sc_snap_take(&b, c, seq, L, G, D, Dv);
        sc_snap_take(&ob, c, other, L, G, D, Dv);
        kva_cache_get_stats(c, &s0);
        u.calls = 0, u.expect = NULL;
        u.nan_call = cases[ci].nan_call, u.nan_slot = cases[ci].nan_slot;
        u.fail_call = cases[ci].fail_call, u.fail_status = (kva_status)cases[ci].status;
        st = op == 0 ? kva_seq_compress(c, seq, 8) : kva_seq_append(c, seq, 2);
        u.nan_call = -1, u.fail_call = -1;
        KT_CHECK((int)st == cases[ci].want, "failures phase %d case %d (%s): returned %d, want %d", phase, ci,
                 op ? "append" : "compress", (int)st, cases[ci].want);
        kva_cache_get_stats(c, &s1);
        sc_snap_take(&a, c, seq, L, G, D, Dv);
        sc_snap_take(&oa, c, other, L, G, D, Dv);
        KT_CHECK(sc_snap_same(&b, &a) && sc_snap_same(&ob, &oa),
                 "failures phase %d case %d (%s): the sequence changed (len %d -> %d, pos %d -> %d)", phase, ci,
                 op ? "append" : "compress", b.len, a.len, b.pos, a.pos);
        KT_CHECK(kt_stats_equal(&s0, &s1, 1), "failures phase %d case %d (%s): cache statistics changed", phase, ci,
                 op ? "append" : "compress");
        KT_CHECK(u.calls >= 1, "failures phase %d case %d: the scorer was not called", phase, ci);
        /* the step is still open: its tokens can be stored again (the same rows, an F16 cache keeps them) */
        KT_CHECK(sc_restore_step(c, seq, &b, step_n) == KVA_OK,
                 "failures phase %d case %d (%s): the step's tokens can no longer be stored", phase, ci,
                 op ? "append" : "compress");
        sc_snap_free(&a);
        sc_snap_take(&a, c, seq, L, G, D, Dv);
        KT_CHECK(sc_snap_same(&b, &a), "failures phase %d case %d: storing the same rows again changed them", phase,
                 ci);
        sc_snap_free(&b), sc_snap_free(&a), sc_snap_free(&ob), sc_snap_free(&oa);
      }
    if (phase == 0) {
      sc_apply(&x, 1, 10);
      for (i = 0; i < 4; i++) {
        sc_apply(&x, 0, 1);
        sc_store(c, seq, L, G, D, Dv, 1, &r);
      }
    }
  }
  sc_apply(&x, 0, 1); /* and a good one still works */
  KT_CHECK(u.views_bad == 0, "failures: %ld bad views", u.views_bad);
  kva_cache_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* accumulate = 1 with a scorer returning attn_sum is H2O                    */

static void sc_h2o_equiv(void) {
  enum { L = 2, G = 2, H = 4, D = 16, Dv = 8, PRE = 12 };
  kva_cache *c[2];
  int seq[2] = {-1, -1}, s, l, i, k, steps = kt_iters(300);
  sc_user u;
  kva_evict e[2];
  kva_attn a;
  kt_rng r;
  float *kk = KT_ALLOC(float, (size_t)PRE * G * D), *vv = KT_ALLOC(float, (size_t)PRE * G * Dv);
  float *q = KT_ALLOC(float, (size_t)PRE * H * D), *o[2];
  kt_begin("scorers: SCORE with accumulate = 1 returning attn_sum equals H2O (held sets, outputs bit for bit)");
  o[0] = KT_ALLOC(float, (size_t)PRE * H * Dv), o[1] = KT_ALLOC(float, (size_t)PRE * H * Dv);
  c[0] = sc_cache(L, G, D, Dv, 4, 64, KVA_F16);
  c[1] = sc_cache(L, G, D, Dv, 4, 64, KVA_F16);
  kt_seed(&r, 0x420);
  kt_attn_init(&a, H, G, D, Dv);
  sc_user_init(&u, SC_SUM, L, G, D, Dv, 0);
  u.exp_sum = 1;
  memset(&e[0], 0, sizeof e[0]);
  e[0].kind = KVA_EVICT_H2O, e[0].budget = 20, e[0].n_sink = 2, e[0].n_recent = 4;
  e[1] = sc_policy(20, 2, 4, &u);
  e[1].accumulate = 1;
  for (k = 0; k < 2; k++) {
    KT_STATUS(kva_seq_new(c[k], &seq[k]), KVA_OK);
    KT_STATUS(kva_seq_set_evict(c[k], seq[k], &e[k]), KVA_OK);
  }
  for (s = -1; s < steps; s++) {
    int n = s < 0 ? PRE : (s % 17 == 16 ? 3 : 1), batch = s % 25 == 7;
    sc_snap sa, sb;
    for (k = 0; k < 2; k++) KT_STATUS(kva_seq_append(c[k], seq[k], n), KVA_OK);
    for (l = 0; l < L; l++) {
      kt_fill(&r, kk, (size_t)n * G * D, -1.0f, 1.0f);
      kt_fill(&r, vv, (size_t)n * G * Dv, -1.0f, 1.0f);
      for (i = 0; i < n * G; i++)
        if (kt_unit(&r) < 0.15) kk[(size_t)i * D] = 4.0f; /* heavy hitters along channel 0 */
      kt_fill(&r, q, (size_t)n * H * D, -1.0f, 1.0f);
      for (i = 0; i < n * H; i++) q[(size_t)i * D] = 1.5f;
      for (k = 0; k < 2; k++) {
        KT_STATUS(kva_store(c[k], seq[k], l, kk, vv, n), KVA_OK);
        if (batch) {
          kva_batch *plan = NULL;
          KT_STATUS(kva_batch_plan(c[k], &a, &seq[k], &n, 1, &plan), KVA_OK);
          KT_STATUS(kva_attend_batch(c[k], plan, l, q, o[k]), KVA_OK);
          kva_batch_free(plan);
        } else {
          KT_STATUS(kva_attend_cache(c[k], seq[k], l, &a, q, n, o[k]), KVA_OK);
        }
      }
      KT_CHECK(kt_same_bits(o[0], o[1], (size_t)n * H * Dv), "h2o equiv: step %d layer %d: outputs differ (%s)", s, l,
               batch ? "kva_attend_batch" : "kva_attend_cache");
    }
    if (s == steps / 3)
      for (k = 0; k < 2; k++) KT_STATUS(kva_seq_compress(c[k], seq[k], 11), KVA_OK);
    sc_snap_take(&sa, c[0], seq[0], L, G, D, Dv);
    sc_snap_take(&sb, c[1], seq[1], L, G, D, Dv);
    KT_CHECK(sc_held_same(&sa, &sb), "h2o equiv: step %d: held positions or rows differ (H2O %d held, SCORE %d)", s,
             sa.len, sb.len);
    sc_snap_free(&sa), sc_snap_free(&sb);
  }
  KT_CHECK(u.calls > 0 && kva_seq_len(c[1], seq[1]) <= 20, "h2o equiv: the scorer never ran (%ld calls, %d held)",
           u.calls, kva_seq_len(c[1], seq[1]));
  kva_cache_destroy(c[0]), kva_cache_destroy(c[1]);
  free(kk), free(vv), free(q), free(o[0]), free(o[1]);
}

/* ------------------------------------------------------------------------ */
/* Built-in scorers on views built here                                      */

static void sc_view_init(kva_score_view *vw, int L, int l, int G, int g, int n, int D, int Dv, const int32_t *pos,
                         const float *k, const float *v) {
  memset(vw, 0, sizeof *vw);
  vw->seq = 3, vw->layer = l, vw->kv_head = g, vw->n_layers = L, vw->n_kv_heads = G, vw->n = n, vw->keep = n / 2;
  vw->head_dim = D, vw->v_dim = Dv, vw->pos = pos, vw->k = k, vw->v = v, vw->attn_sum = NULL;
}

static int sc_scores_near(const float *got, const double *want, int n, double *worst) {
  int j, ok = 1;
  for (j = 0; j < n; j++) {
    double tol = 1e-5 * fabs(want[j]) + 1e-7, err = fabs((double)got[j] - want[j]);
    if (!(err <= tol)) ok = 0;
    if (err / tol > *worst || err != err) *worst = err != err ? 1e30 : err / tol;
  }
  return ok;
}

static void sc_builtin_direct(void) {
  static const int dims[5] = {1, 7, 33, 64, 5}, pools[5] = {0, 1, 3, 5, 7};
  kt_rng r;
  int it;
  double worst_n = 0.0, worst_a = 0.0;
  kt_begin("scorers: kva_score_key_norm and kva_score_attention against fp64 on views built here");
  kt_seed(&r, 0xB11);
  for (it = 0; it < kt_iters(1000); it++) {
    int L = kt_int(&r, 1, 3), l = kt_int(&r, 0, L - 1), G = kt_int(&r, 1, 3), g = kt_int(&r, 0, G - 1);
    int grp = kt_int(&r, 1, 4), H = G * grp, D = it % 6 == 5 ? kt_int(&r, 1, 70) : dims[kt_int(&r, 0, 4)];
    int n = kt_int(&r, 1, 60), Dv = kt_int(&r, 0, 2) ? kt_int(&r, 1, 9) : 0, j, nq, cap, given = kt_int(&r, 0, 1);
    int32_t *pos = KT_ALLOC(int32_t, n), *qpos;
    float *k = KT_ALLOC(float, (size_t)n * D), *v = KT_ALLOC(float, (size_t)n * Dv + 1), *sc = KT_ALLOC(float, n + 1);
    float *q;
    double *want = KT_ALLOC(double, n);
    kva_score_view vw;
    kva_score_queries sq;
    kva_status st;
    pos[0] = kt_int(&r, 0, 20);
    for (j = 1; j < n; j++) pos[j] = pos[j - 1] + kt_int(&r, 1, 3);
    kt_fill(&r, k, (size_t)n * D, -2.0f, 2.0f);
    for (j = 0; j < n; j++)
      if (kt_unit(&r) < 0.1) k[(size_t)j * D] *= 4.0f;
    if (it % 17 == 3) memset(k + (size_t)(n / 2) * D, 0, sizeof(float) * D); /* a zero key */
    kt_fill(&r, v, (size_t)n * Dv, -1.0f, 1.0f);
    sc_view_init(&vw, L, l, G, g, n, D, Dv, pos, k, Dv ? v : NULL);
    /* key norm */
    sc[n] = KT_SENTINEL;
    st = kva_score_key_norm(NULL, &vw, sc);
    KT_STATUS(st, KVA_OK);
    sc_ref_key_norm(n, D, k, want);
    KT_CHECK(st != KVA_OK || sc_scores_near(sc, want, n, &worst_n), "key norm it %d (n %d D %d): scores differ from "
             "-||k|| (worst err/tol %.3g)", it, n, D, worst_n);
    KT_CHECK(kt_f2u(sc[n]) == kt_f2u(KT_SENTINEL), "key norm it %d: wrote beyond n scores", it);
    /* attention */
    nq = given ? kt_int(&r, 1, 6) : kt_int(&r, 1, n < 6 ? n : 6);
    qpos = KT_ALLOC(int32_t, nq);
    for (j = 0; j < nq; j++) qpos[j] = kt_int(&r, pos[0] - 2, pos[n - 1] + 2); /* some see no key */
    cap = it % 4 == 2 ? nq + kt_int(&r, 1, 3) : nq; /* a fixed-capacity buffer per layer: layer_stride */
    q = KT_ALLOC(float, (size_t)L * cap * H * D);
    kt_fill(&r, q, (size_t)L * cap * H * D, -2.0f, 2.0f);
    memset(&sq, 0, sizeof sq);
    sq.layer_stride = cap > nq ? (size_t)cap * H * D : 0;
    sq.q = q, sq.n_q = nq, sq.n_heads = H, sq.scale = it % 3 == 0 ? 0.0f : kt_uniform(&r, 0.05f, 1.0f);
    sq.q_pos = given ? qpos : NULL, sq.pool = pools[kt_int(&r, 0, 4)];
    sc[n] = KT_SENTINEL;
    st = kva_score_attention(&sq, &vw, sc);
    KT_STATUS(st, KVA_OK);
    sc_ref_attention(&sq, l, g, G, n, D, pos, k, want);
    KT_CHECK(st != KVA_OK || sc_scores_near(sc, want, n, &worst_a),
             "attention it %d (L %d l %d G %d g %d H %d D %d n %d n_q %d q_pos %s scale %g pool %d layer_stride %lu): "
             "scores differ from fp64 (worst err/tol %.3g)", it, L, l, G, g, H, D, n, nq, given ? "given" : "NULL",
             (double)sq.scale, sq.pool, (unsigned long)sq.layer_stride, worst_a);
    KT_CHECK(kt_f2u(sc[n]) == kt_f2u(KT_SENTINEL), "attention it %d: wrote beyond n scores", it);
    free(pos), free(qpos), free(k), free(v), free(sc), free(q), free(want);
  }
  if (sc_verbose()) fprintf(stderr, "  scorers: built-ins: worst err/tol key norm %.3g, attention %.3g\n", worst_n, worst_a);
}

/* Bad user data: KVA_ERR_ARG, scores untouched; also as a policy (the compress returns it, nothing changes). */
static void sc_builtin_args(void) {
  enum { L = 2, G = 2, H = 4, D = 4, N = 6, NQ = 2 };
  int32_t pos[N] = {0, 1, 2, 5, 6, 9};
  float k[N * D], q[L * NQ * H * D], sc[N];
  kva_score_view vw;
  kva_score_queries sq, bad;
  kt_rng r;
  int which;
  kt_begin("scorers: kva_score_attention refuses bad user data (KVA_ERR_ARG, scores untouched)");
  kt_seed(&r, 0xBAD);
  kt_fill(&r, k, (size_t)N * D, -1.0f, 1.0f);
  kt_fill(&r, q, (size_t)L * NQ * H * D, -1.0f, 1.0f);
  sc_view_init(&vw, L, 1, G, 1, N, D, D, pos, k, NULL);
  memset(&sq, 0, sizeof sq);
  sq.q = q, sq.n_q = NQ, sq.n_heads = H;
  KT_STATUS(kva_score_attention(&sq, &vw, sc), KVA_OK);
  sq.pool = 1;
  KT_STATUS(kva_score_attention(&sq, &vw, sc), KVA_OK);
  sq.pool = 0;
  sq.layer_stride = (size_t)NQ * H * D; /* packed, stated */
  KT_STATUS(kva_score_attention(&sq, &vw, sc), KVA_OK);
  sq.layer_stride = 0;
  for (which = 0; which < 10; which++) {
    bad = sq;
    switch (which) {
    case 9: bad.layer_stride = (size_t)NQ * H * D - 1; break; /* the layers would overlap */
    case 0: bad.q = NULL; break;
    case 1: bad.n_q = 0; break;
    case 2: bad.n_q = -1; break;
    case 3: bad.n_heads = 3; break; /* not a multiple of 2 KV heads */
    case 4: bad.n_heads = 0; break;
    case 5: bad.n_heads = -2; break;
    case 6: bad.pool = 2; break;
    case 7: bad.pool = 4; break;
    default: bad.scale = -0.5f; break;
    }
    kt_fill_sentinel(sc, N);
    KT_CHECK(kva_score_attention(&bad, &vw, sc) == KVA_ERR_ARG, "bad user data case %d: not KVA_ERR_ARG", which);
    KT_CHECK(kt_all_sentinel(sc, N), "bad user data case %d: scores written", which);
  }
  for (which = 0; which < 4; which++) { /* a view out of its own ranges */
    kva_score_view bv = vw;
    if (which == 0) bv.layer = -1;
    else if (which == 1) bv.layer = bv.n_layers;
    else if (which == 2) bv.kv_head = bv.n_kv_heads;
    else bv.head_dim = 0;
    kt_fill_sentinel(sc, N);
    KT_CHECK(kva_score_attention(&sq, &bv, sc) == KVA_ERR_ARG && kt_all_sentinel(sc, N),
             "a view out of range (case %d): not KVA_ERR_ARG with scores untouched", which);
  }
  { /* as a policy: compress returns the scorer's KVA_ERR_ARG, nothing changes */
    kva_cache *c = sc_cache(L, G, D, D, 4, 16, KVA_F32);
    kva_evict e;
    sc_snap b, a;
    int seq = -1;
    if (!c) return;
    KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
    KT_STATUS(kva_seq_append(c, seq, 10), KVA_OK);
    sc_store(c, seq, L, G, D, D, 10, &r);
    bad = sq;
    bad.pool = 2;
    memset(&e, 0, sizeof e);
    e.kind = KVA_EVICT_SCORE, e.budget = 8, e.score = kva_score_attention, e.score_user = &bad;
    KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
    sc_snap_take(&b, c, seq, L, G, D, D);
    KT_STATUS(kva_seq_compress(c, seq, 5), KVA_ERR_ARG);
    sc_snap_take(&a, c, seq, L, G, D, D);
    KT_CHECK(sc_snap_same(&b, &a), "a built-in's refusal through kva_seq_compress changed the sequence");
    bad.pool = 3;
    KT_STATUS(kva_seq_compress(c, seq, 5), KVA_OK);
    KT_CHECK(kva_seq_len(c, seq) == 5, "then with pool 3: %d held, want 5", kva_seq_len(c, seq));
    sc_snap_free(&b), sc_snap_free(&a);
    kva_cache_destroy(c);
  }
}

/* The built-ins as a policy: prompt compression (key norm, TOVA, SnapKV, explicit query positions) and TOVA
   decode steps, checked with the rule on fp64 scores of the rows read back. */
static void sc_builtin_cache(void) {
  static const int dims[4] = {1, 7, 33, 64}, bss[3] = {1, 3, 16}, pools[3] = {1, 3, 5};
  static const kva_dtype types[3] = {KVA_F32, KVA_F16, KVA_INT8};
  static const char *names[4] = {"key norm", "TOVA", "SnapKV", "given q_pos"};
  kt_rng r;
  int it;
  long heads = 0, near = 0;
  kt_begin("scorers: the built-in scorers as a policy (compress, TOVA decode) against the rule on fp64 scores");
  kt_seed(&r, 0xB0C);
  for (it = 0; it < kt_iters(160); it++) {
    int which = it % 4, L = kt_int(&r, 1, 3), G = kt_int(&r, 1, 3), grp = kt_int(&r, 1, 3), H = G * grp;
    int D = dims[kt_int(&r, 0, 3)], Dv = kt_int(&r, 0, 1) ? D : kt_int(&r, 1, 20), bs = bss[kt_int(&r, 0, 2)];
    int P = kt_int(&r, 8, 120), nq = which == 1 ? 1 : which == 2 ? kt_int(&r, 2, 8) : kt_int(&r, 1, 4), s, j;
    int n_sink = kt_int(&r, 0, 3), n_recent = which == 2 ? nq : kt_int(&r, 0, 2), budget, seq = -1;
    kva_dtype t = types[kt_int(&r, 0, 2)];
    kva_cache *c = sc_cache(L, G, D, Dv, bs, (2 * P + 40) / bs + 4, t);
    float *q = KT_ALLOC(float, (size_t)L * nq * H * D);
    int32_t *qpos = KT_ALLOC(int32_t, nq);
    kva_score_queries sq;
    kva_evict e;
    sc_run x;
    char what[128];
    budget = n_sink + n_recent + kt_int(&r, 4, 24);
    sprintf(what, "built-in %s it %d: L %d G %d H %d D %d Dv %d bs %d %s n_q %d", names[which], it, L, G, H, D, Dv,
            bs, kva_dtype_name(t), nq);
    if (!c) {
      free(q), free(qpos);
      continue;
    }
    kt_fill(&r, q, (size_t)L * nq * H * D, -1.5f, 1.5f);
    for (j = 0; j < nq; j++) qpos[j] = kt_int(&r, 0, P + 2);
    memset(&sq, 0, sizeof sq);
    sq.q = q, sq.n_q = nq, sq.n_heads = H, sq.scale = it % 3 == 0 ? kt_uniform(&r, 0.1f, 0.6f) : 0.0f;
    sq.q_pos = which == 3 ? qpos : NULL, sq.pool = which == 2 ? pools[kt_int(&r, 0, 2)] : which == 3 ? 3 : 0;
    memset(&e, 0, sizeof e);
    e.kind = KVA_EVICT_SCORE, e.budget = budget, e.n_sink = n_sink, e.n_recent = n_recent;
    e.score = which == 0 ? kva_score_key_norm : kva_score_attention;
    e.score_user = which == 0 ? NULL : &sq;
    KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
    KT_STATUS(kva_seq_append(c, seq, P), KVA_OK);
    KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
    {
      /* the prompt's keys a little larger than sc_store's so that the softmax is not flat */
      float *kk = KT_ALLOC(float, (size_t)P * G * D), *vv = KT_ALLOC(float, (size_t)P * G * Dv);
      int l;
      for (l = 0; l < L; l++) {
        kt_fill(&r, kk, (size_t)P * G * D, -1.5f, 1.5f);
        kt_fill(&r, vv, (size_t)P * G * Dv, -1.0f, 1.0f);
        KT_STATUS(kva_store(c, seq, l, kk, vv, P), KVA_OK);
      }
      free(kk), free(vv);
    }
    sc_run_init(&x, c, seq, L, G, D, Dv, &e, NULL, what);
    x.ref.sq = which == 0 ? NULL : &sq;
    x.tie_rel = 1e-4;
    sc_apply(&x, 1, kt_int(&r, 1, P));
    if (which == 1) /* TOVA: the current query judges at every step */
      for (s = 0; s < kt_iters(12); s++) {
        kt_fill(&r, q, (size_t)L * nq * H * D, -1.5f, 1.5f);
        sc_apply(&x, 0, 1);
        sc_store(c, seq, L, G, D, Dv, 1, &r);
      }
    else {
      sc_apply(&x, 0, 1);
      sc_store(c, seq, L, G, D, Dv, 1, &r);
    }
    sc_attn_check(&x, grp, &r);
    heads += x.heads, near += x.heads_near;
    free(q), free(qpos);
    kva_cache_destroy(c);
  }
  KT_CHECK(heads > 0 && near * 10 <= heads, "built-ins through the cache: %ld of %ld head evictions were near ties "
           "(at most 10 %% may be)", near, heads);
  if (sc_verbose()) fprintf(stderr, "  scorers: built-ins through the cache: %ld head evictions, %ld near ties\n", heads, near);
}

/* ------------------------------------------------------------------------ */
/* Paths: forks, shared blocks, pool and allocator failures, streams         */

static void sc_paths_fork(void) {
  enum { L = 2, G = 2, D = 8, Dv = 6, TP = 256 };
  float tab[L * G * TP];
  sc_user u;
  sc_run xp, xc;
  kva_evict e;
  kt_rng r;
  sc_snap p0, c0, p1, c1;
  kva_cache *c = sc_cache(L, G, D, Dv, 4, 96, KVA_F16);
  int par = -1, ch = -1, s;
  kt_begin("scorers: a fork after a SCORE eviction keeps its own copy (and the same scorer)");
  if (!c) return;
  kt_seed(&r, 0xF0C);
  sc_table_user(&u, tab, L, G, D, Dv, TP, &r);
  par = sc_seq_stored(c, L, G, D, Dv, 30, &r);
  e = sc_policy(16, 2, 3, &u);
  KT_STATUS(kva_seq_set_evict(c, par, &e), KVA_OK);
  sc_run_init(&xp, c, par, L, G, D, Dv, &e, &u, "fork: parent");
  sc_apply(&xp, 1, 16);
  KT_STATUS(kva_seq_fork(c, par, &ch), KVA_OK);
  sc_run_init(&xc, c, ch, L, G, D, Dv, &e, &u, "fork: child");
  sc_snap_take(&p0, c, par, L, G, D, Dv);
  sc_snap_take(&c0, c, ch, L, G, D, Dv);
  KT_CHECK(sc_held_same(&p0, &c0), "fork: the child does not hold the parent's rows");
  sc_snap_free(&c0);
  for (s = 0; s < 12; s++) { /* the child evicts under the copied policy (view.seq is the child's) */
    sc_apply(&xc, 0, 1);
    sc_store(c, ch, L, G, D, Dv, 1, &r);
    sc_snap_take(&p1, c, par, L, G, D, Dv);
    KT_CHECK(sc_snap_same(&p0, &p1), "fork: the parent changed after the child's step %d", s);
    sc_snap_free(&p1);
  }
  sc_apply(&xc, 1, 8);
  sc_snap_take(&p1, c, par, L, G, D, Dv);
  KT_CHECK(sc_snap_same(&p0, &p1), "fork: the parent changed after the child's compress");
  sc_snap_free(&p1);
  sc_snap_take(&c1, c, ch, L, G, D, Dv);
  for (s = 0; s < 12; s++) {
    sc_apply(&xp, 0, 1);
    sc_store(c, par, L, G, D, Dv, 1, &r);
    sc_snap_take(&c0, c, ch, L, G, D, Dv);
    KT_CHECK(sc_snap_same(&c1, &c0), "fork: the child changed after the parent's step %d", s);
    sc_snap_free(&c0);
  }
  { /* a fresh fork compressed at once: its blocks are all shared */
    int f = -1;
    sc_run xf;
    KT_STATUS(kva_seq_fork(c, par, &f), KVA_OK);
    sc_snap_free(&p0);
    sc_snap_take(&p0, c, par, L, G, D, Dv);
    sc_run_init(&xf, c, f, L, G, D, Dv, &e, &u, "fork: fresh fork compressed");
    sc_apply(&xf, 1, 7);
    sc_snap_take(&p1, c, par, L, G, D, Dv);
    KT_CHECK(sc_snap_same(&p0, &p1), "fork: the parent changed when a fresh fork compressed");
    sc_snap_free(&p1);
  }
  KT_STATUS(kva_seq_free(c, ch), KVA_OK);
  sc_apply(&xp, 0, 1);
  KT_CHECK(u.views_bad == 0, "fork: %ld bad views", u.views_bad);
  sc_snap_free(&p0), sc_snap_free(&c1);
  kva_cache_destroy(c);
}

static void sc_paths_prefix(void) {
  enum { L = 2, G = 2, D = 8, TP = 128 };
  float tab[L * G * TP];
  int32_t toks[40];
  sc_user u;
  sc_run x;
  kva_evict e;
  kt_rng r;
  sc_snap a0, a1, c0;
  kva_cache *c = sc_cache(L, G, D, D, 4, 64, KVA_F32);
  int A = -1, B = -1, C = -1, reused = -1, i, l, sl, same = 1;
  kt_begin("scorers: compressing a sequence that shares prefix-cached blocks leaves them alone");
  if (!c) return;
  kt_seed(&r, 0x9F);
  for (i = 0; i < 40; i++) toks[i] = 7 * i + 3;
  sc_table_user(&u, tab, L, G, D, D, TP, &r);
  A = sc_seq_stored(c, L, G, D, D, 24, &r);
  KT_STATUS(kva_seq_publish(c, A, toks, 24, 9), KVA_OK);
  sc_snap_take(&a0, c, A, L, G, D, D);
  KT_STATUS(kva_seq_new_prefix(c, toks, 30, 9, &B, &reused), KVA_OK);
  KT_CHECK(reused == 24, "prefix: %d tokens reused, want 24", reused);
  KT_STATUS(kva_seq_append(c, B, 30 - reused), KVA_OK);
  sc_store(c, B, L, G, D, D, 30 - reused, &r);
  e = sc_policy(20, 1, 2, &u);
  KT_STATUS(kva_seq_set_evict(c, B, &e), KVA_OK);
  sc_run_init(&x, c, B, L, G, D, D, &e, &u, "prefix: B");
  sc_apply(&x, 1, 12);
  for (i = 0; i < 10; i++) {
    sc_apply(&x, 0, 2);
    sc_store(c, B, L, G, D, D, 2, &r);
  }
  sc_snap_take(&a1, c, A, L, G, D, D);
  KT_CHECK(sc_snap_same(&a0, &a1), "prefix: the publishing sequence changed when a sharer compressed");
  KT_STATUS(kva_seq_new_prefix(c, toks, 30, 9, &C, &reused), KVA_OK);
  KT_CHECK(reused == 24, "prefix: a later request reuses %d tokens, want 24", reused);
  sc_snap_take(&c0, c, C, L, G, D, D);
  for (l = 0; l < L && c0.len == 24; l++)
    for (sl = 0; sl < 24; sl++)
      same &= kt_same_bits(sc_sk(&c0, l, sl, 0), sc_sk(&a0, l, sl, 0), (size_t)G * D) &&
              kt_same_bits(sc_sv(&c0, l, sl, 0), sc_sv(&a0, l, sl, 0), (size_t)G * D) &&
              memcmp(&c0.p[((size_t)l * 24 + sl) * G], &a0.p[((size_t)l * 24 + sl) * G], sizeof(int32_t) * G) == 0;
  KT_CHECK(c0.len == 24 && same, "prefix: the published blocks changed (a later hit reads other rows)");
  KT_STATUS(kva_seq_append(c, A, 3), KVA_OK); /* the publisher goes on */
  sc_store(c, A, L, G, D, D, 3, &r);
  KT_CHECK(kva_seq_len(c, A) == 27, "prefix: A holds %d, want 27", kva_seq_len(c, A));
  sc_snap_free(&a0), sc_snap_free(&a1), sc_snap_free(&c0);
  kva_cache_destroy(c);
}

/* The blocks a compress must copy are not there: KVA_ERR_FULL, nothing changes; once they are, it works. */
static void sc_paths_full(void) {
  enum { D = 4, TP = 64 };
  float tab[TP];
  sc_user u;
  sc_run x;
  kva_evict e;
  kt_rng r;
  sc_snap a0, f0, a1, f1;
  kva_cache_stats s0, s1;
  kva_cache *c = sc_cache(1, 1, D, D, 4, 8, KVA_F32);
  int A = -1, F = -1, hog = -1, i;
  kt_begin("scorers: kva_seq_compress that cannot copy the shared blocks is KVA_ERR_FULL and changes nothing");
  if (!c) return;
  kt_seed(&r, 0xF11);
  for (i = 0; i < TP; i++) tab[i] = (i % 4 == 1 || i % 4 == 2) ? -1.0f - 0.01f * (float)i : (float)i;
  sc_user_init(&u, SC_TABLE, 1, 1, D, D, 0);
  u.tab = tab, u.tab_p = TP;
  A = sc_seq_stored(c, 1, 1, D, D, 16, &r);
  KT_STATUS(kva_seq_fork(c, A, &F), KVA_OK);
  KT_STATUS(kva_seq_new(c, &hog), KVA_OK);
  KT_STATUS(kva_seq_append(c, hog, 16), KVA_OK); /* the pool's other 4 blocks */
  e = sc_policy(12, 0, 0, &u);
  KT_STATUS(kva_seq_set_evict(c, F, &e), KVA_OK);
  sc_snap_take(&a0, c, A, 1, 1, D, D);
  sc_snap_take(&f0, c, F, 1, 1, D, D);
  kva_cache_get_stats(c, &s0);
  KT_STATUS(kva_seq_compress(c, F, 8), KVA_ERR_FULL);
  kva_cache_get_stats(c, &s1);
  sc_snap_take(&a1, c, A, 1, 1, D, D);
  sc_snap_take(&f1, c, F, 1, 1, D, D);
  KT_CHECK(sc_snap_same(&a0, &a1) && sc_snap_same(&f0, &f1), "full: a refused compress changed a sequence");
  KT_CHECK(kt_stats_equal(&s0, &s1, 1), "full: a refused compress changed the cache statistics");
  KT_STATUS(kva_seq_free(c, hog), KVA_OK);
  sc_run_init(&x, c, F, 1, 1, D, D, &e, &u, "full: then with room");
  sc_apply(&x, 1, 8);
  sc_snap_free(&a1);
  sc_snap_take(&a1, c, A, 1, 1, D, D);
  KT_CHECK(sc_snap_same(&a0, &a1), "full: the fork's compress changed its source");
  sc_snap_free(&a0), sc_snap_free(&f0), sc_snap_free(&a1), sc_snap_free(&f1);
  kva_cache_destroy(c);
}


/* The scoring copies come from alloc_fn: when it fails, KVA_ERR_NOMEM and nothing changes. */
static void sc_paths_nomem(void) {
  enum { L = 2, G = 2, D = 8, TP = 64 };
  float tab[L * G * TP];
  kt_heap h;
  sc_user u;
  sc_run x;
  kva_evict e;
  kva_cache_desc d;
  kva_cache *c = NULL;
  kt_rng r;
  sc_snap b, a;
  int seq = -1;
  kt_begin("scorers: the scorer's copies come from alloc_fn (KVA_ERR_NOMEM changes nothing)");
  memset(&h, 0, sizeof h);
  kt_desc_init(&d, L, G, D, 4, 32, 4, KVA_F16);
  d.alloc_fn = kt_heap_alloc, d.free_fn = kt_heap_free, d.user = &h;
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  if (!c) return;
  kt_seed(&r, 0x0E);
  sc_table_user(&u, tab, L, G, D, D, TP, &r);
  seq = sc_seq_stored(c, L, G, D, D, 20, &r);
  e = sc_policy(12, 1, 1, &u);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  sc_snap_take(&b, c, seq, L, G, D, D);
  h.fail = 1;
  KT_STATUS(kva_seq_compress(c, seq, 10), KVA_ERR_NOMEM);
  KT_STATUS(kva_seq_append(c, seq, 1), KVA_ERR_NOMEM);
  h.fail = 0;
  KT_CHECK(h.refused > 0, "nomem: alloc_fn was never asked");
  sc_snap_take(&a, c, seq, L, G, D, D);
  KT_CHECK(sc_snap_same(&b, &a), "nomem: a refused eviction changed the sequence");
  KT_CHECK(sc_restore_step(c, seq, &b, 20) == KVA_OK, "nomem: the step was ended by a refused eviction");
  sc_run_init(&x, c, seq, L, G, D, D, &e, &u, "nomem: then with memory");
  sc_apply(&x, 1, 10);
  e.budget = 40;
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  h.fail = 1, h.refused = 0;
  KT_STATUS(kva_seq_append(c, seq, 2), KVA_OK); /* nothing to evict: nothing allocated */
  h.fail = 0;
  KT_CHECK(h.refused == 0 && kva_seq_len(c, seq) == 12, "nomem: an append that evicts nothing asked alloc_fn %ld "
           "times (len %d)", h.refused, kva_seq_len(c, seq));
  sc_snap_free(&b), sc_snap_free(&a);
  kva_cache_destroy(c);
}

/* A stream records a SCORE policy as NONE; the rows come back. */
static void sc_paths_export(void) {
  enum { L = 2, G = 2, D = 8, Dv = 4, TP = 128 };
  float tab[L * G * TP];
  sc_user u;
  sc_run x;
  kva_evict e;
  kt_rng r;
  sc_snap s0, s1;
  kva_cache *c = sc_cache(L, G, D, Dv, 4, 64, KVA_INT8), *c2 = sc_cache(L, G, D, Dv, 16, 16, KVA_INT8);
  int seq = -1, imp[2] = {-1, -1}, i, k;
  size_t need = 0, wrote = 0;
  void *buf;
  kt_begin("scorers: export / import of a SCORE sequence: the rows, and policy NONE");
  if (!c || !c2) return;
  kt_seed(&r, 0xE7);
  sc_table_user(&u, tab, L, G, D, Dv, TP, &r);
  seq = sc_seq_stored(c, L, G, D, Dv, 24, &r);
  e = sc_policy(14, 1, 2, &u);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  sc_run_init(&x, c, seq, L, G, D, Dv, &e, &u, "export");
  sc_apply(&x, 1, 14);
  for (i = 0; i < 5; i++) {
    sc_apply(&x, 0, 1);
    sc_store(c, seq, L, G, D, Dv, 1, &r);
  }
  KT_STATUS(kva_seq_export(c, seq, NULL, 0, &need), KVA_OK);
  buf = kt_xmalloc(need);
  KT_STATUS(kva_seq_export(c, seq, buf, need, &wrote), KVA_OK);
  KT_STATUS(kva_seq_import(c, buf, wrote, &imp[0]), KVA_OK);
  KT_STATUS(kva_seq_import(c2, buf, wrote, &imp[1]), KVA_OK);
  sc_snap_take(&s0, c, seq, L, G, D, Dv);
  for (k = 0; k < 2; k++) {
    kva_cache *ck = k ? c2 : c;
    sc_snap_take(&s1, ck, imp[k], L, G, D, Dv);
    KT_CHECK(sc_held_same(&s0, &s1), "import %d: held positions or rows differ from the source's (len %d / %d, pos "
             "%d / %d)", k, s0.len, s1.len, s0.pos, s1.pos);
    sc_snap_free(&s1);
    KT_CHECK(kva_seq_compress(ck, imp[k], 4) != KVA_OK, "import %d: kva_seq_compress accepted: the policy is not NONE", k);
    u.calls = 0;
    for (i = 0; i < 8; i++) {
      KT_STATUS(kva_seq_append(ck, imp[k], 1), KVA_OK);
      sc_store(ck, imp[k], L, G, D, Dv, 1, &r);
    }
    KT_CHECK(u.calls == 0 && kva_seq_len(ck, imp[k]) == s0.len + 8,
             "import %d: the imported sequence evicted (%ld scorer calls, %d held, want %d): its policy is not NONE", k,
             u.calls, kva_seq_len(ck, imp[k]), s0.len + 8);
  }
  sc_snap_free(&s0);
  free(buf);
  kva_cache_destroy(c), kva_cache_destroy(c2);
}

/* kva_seq_append_all refuses an append that would make a SCORE sequence evict. */
static void sc_paths_append_all(void) {
  enum { D = 4, TP = 64 };
  float tab[TP];
  sc_user u;
  kva_evict e, w;
  kt_rng r;
  kva_cache *c = sc_cache(1, 1, D, D, 4, 32, KVA_F32);
  int a = -1, b = -1, win = -1, i, seqs[2], ns[2];
  sc_snap sa0, sb0, sa1, sb1;
  kva_cache_stats s0, s1;
  kt_begin("scorers: kva_seq_append_all refuses an append that would make a SCORE sequence evict");
  if (!c) return;
  kt_seed(&r, 0xA11);
  for (i = 0; i < TP; i++) tab[i] = sc_table_value(&r);
  sc_user_init(&u, SC_TABLE, 1, 1, D, D, 0);
  u.tab = tab, u.tab_p = TP;
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_new(c, &b), KVA_OK);
  KT_STATUS(kva_seq_new(c, &win), KVA_OK);
  e = sc_policy(8, 0, 0, &u);
  KT_STATUS(kva_seq_set_evict(c, a, &e), KVA_OK);
  memset(&w, 0, sizeof w);
  w.kind = KVA_EVICT_WINDOW, w.budget = 6;
  KT_STATUS(kva_seq_set_evict(c, win, &w), KVA_OK);
  KT_STATUS(kva_seq_append(c, a, 8), KVA_OK);
  sc_store(c, a, 1, 1, D, D, 8, &r);
  KT_STATUS(kva_seq_append(c, b, 3), KVA_OK);
  sc_store(c, b, 1, 1, D, D, 3, &r);
  KT_STATUS(kva_seq_append(c, win, 6), KVA_OK);
  sc_store(c, win, 1, 1, D, D, 6, &r);
  sc_snap_take(&sa0, c, a, 1, 1, D, D);
  sc_snap_take(&sb0, c, b, 1, 1, D, D);
  kva_cache_get_stats(c, &s0);
  for (i = 0; i < 2; i++) {
    seqs[i] = i ? a : b, seqs[1 - i] = i ? b : a;
    ns[i] = i ? 1 : 2, ns[1 - i] = i ? 2 : 1;
    u.calls = 0;
    KT_STATUS(kva_seq_append_all(c, seqs, ns, 2), KVA_ERR_UNSUPPORTED);
    kva_cache_get_stats(c, &s1);
    sc_snap_take(&sa1, c, a, 1, 1, D, D);
    sc_snap_take(&sb1, c, b, 1, 1, D, D);
    KT_CHECK(sc_snap_same(&sa0, &sa1) && sc_snap_same(&sb0, &sb1) && kt_stats_equal(&s0, &s1, 1),
             "append_all (order %d): the refusal changed something", i);
    KT_CHECK(u.calls == 0, "append_all (order %d): the scorer was called %ld times", i, u.calls);
    sc_snap_free(&sa1), sc_snap_free(&sb1);
  }
  seqs[0] = a, seqs[1] = b, ns[0] = 0, ns[1] = 2;
  KT_STATUS(kva_seq_append_all(c, seqs, ns, 2), KVA_OK); /* a does not evict */
  KT_CHECK(kva_seq_len(c, a) == 8 && kva_seq_len(c, b) == 5, "append_all: lens %d %d, want 8 5", kva_seq_len(c, a),
           kva_seq_len(c, b));
  seqs[0] = win, seqs[1] = b, ns[0] = 1, ns[1] = 1;
  KT_STATUS(kva_seq_append_all(c, seqs, ns, 2), KVA_OK); /* WINDOW evicts inside append_all */
  KT_CHECK(kva_seq_len(c, win) == 6 && kva_seq_pos(c, win) == 7, "append_all: WINDOW holds %d at pos %d, want 6 and 7",
           kva_seq_len(c, win), kva_seq_pos(c, win));
  e.budget = 20;
  KT_STATUS(kva_seq_set_evict(c, a, &e), KVA_OK);
  seqs[0] = a, ns[0] = 1;
  KT_STATUS(kva_seq_append_all(c, seqs, ns, 1), KVA_OK);
  KT_CHECK(kva_seq_len(c, a) == 9, "append_all: SCORE under its budget holds %d, want 9", kva_seq_len(c, a));
  sc_snap_free(&sa0), sc_snap_free(&sb0);
  kva_cache_destroy(c);
}

/* A latent cache: the view's v is NULL, v_dim the cache's, k the latent rows. */
static void sc_paths_latent(void) {
  enum { D = 12, DV = 8 };
  kva_cache_desc d;
  kva_cache *c = NULL;
  sc_user u;
  sc_run x;
  kva_evict e;
  kt_rng r;
  int seq = -1, i;
  kt_begin("scorers: a latent cache's view (v NULL)");
  kt_desc_init(&d, 2, 1, D, 4, 32, 4, KVA_F16);
  d.kind = KVA_CACHE_LATENT, d.v_dim = DV;
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  if (!c) return;
  kt_seed(&r, 0x1A7);
  sc_user_init(&u, SC_ROWS, 2, 1, D, DV, 1);
  seq = sc_seq_stored(c, 2, 1, D, 0, 14, &r);
  e = sc_policy(10, 1, 2, &u);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  sc_run_init(&x, c, seq, 2, 1, D, 0, &e, &u, "latent");
  sc_apply(&x, 1, 6);
  for (i = 0; i < 6; i++) {
    sc_apply(&x, 0, 1);
    sc_store(c, seq, 2, 1, D, 0, 1, &r);
  }
  KT_CHECK(u.views_bad == 0, "latent: %ld bad views", u.views_bad);
  kva_cache_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* Argument checks                                                           */

static void sc_args(void) {
  sc_user u;
  kva_evict e;
  kva_cache_desc d;
  kva_cache *c = sc_cache(2, 1, 4, 4, 4, 32, KVA_F32), *cw = NULL, *cn = NULL, *cg = NULL;
  int seq = -1, fresh = -1, freed = -1, sw = -1, sn = -1, sg = -1;
  float kk[8 * 4];
  sc_snap b, a;
  kt_rng r;
  kt_begin("scorers: kva_seq_set_evict and kva_seq_compress refusals");
  if (!c) return;
  kt_seed(&r, 0xA5);
  memset(kk, 0, sizeof kk);
  sc_user_init(&u, SC_KEY0, 2, 1, 4, 4, 0);
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  KT_STATUS(kva_seq_new(c, &fresh), KVA_OK);
  KT_STATUS(kva_seq_new(c, &freed), KVA_OK);
  KT_STATUS(kva_seq_free(c, freed), KVA_OK);
  /* kva_seq_set_evict */
  e = sc_policy(8, 1, 1, &u);
  e.score = NULL;
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_ARG);
  KT_STATUS(kva_seq_set_evict(c, 12345, &e), KVA_ERR_ARG); /* argument errors first */
  e = sc_policy(8, 1, 1, &u);
  e.accumulate = 2;
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_ARG);
  e.accumulate = -1;
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_ARG);
  e = sc_policy(8, 5, 4, &u); /* n_sink + n_recent > budget */
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_ARG);
  e = sc_policy(8, 0, -1, &u);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_ARG);
  e = sc_policy(0, 0, 0, &u);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_ARG);
  e = sc_policy(8, 4, 4, &u);
  e.kind = KVA_EVICT_WINDOW; /* score set for another kind */
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_ARG);
  e.kind = KVA_EVICT_H2O;
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_ARG);
  e.score = NULL, e.score_user = NULL, e.accumulate = 1; /* accumulate set for another kind */
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_ARG);
  e.kind = KVA_EVICT_WINDOW;
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_ARG);
  e = sc_policy(8, 4, 4, &u);
  KT_STATUS(kva_seq_set_evict(c, 12345, &e), KVA_ERR_SEQ);
  KT_STATUS(kva_seq_set_evict(c, freed, &e), KVA_ERR_SEQ);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  e.accumulate = 1;
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  e.accumulate = 0;
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  /* evict_support */
  kt_desc_init(&d, 1, 1, 4, 4, 16, 4, KVA_F32);
  d.evict_support = KVA_EVICT_SUPPORT_WINDOW;
  KT_STATUS(kva_cache_create(&d, &cw), KVA_OK);
  d.evict_support = KVA_EVICT_SUPPORT_NONE;
  KT_STATUS(kva_cache_create(&d, &cn), KVA_OK);
  if (cw && cn) {
    KT_STATUS(kva_seq_new(cw, &sw), KVA_OK);
    KT_STATUS(kva_seq_new(cn, &sn), KVA_OK);
    e = sc_policy(8, 1, 1, &u);
    KT_STATUS(kva_seq_set_evict(cn, sn, &e), KVA_ERR_UNSUPPORTED);
    KT_STATUS(kva_seq_set_evict(cw, sw, &e), KVA_OK);
    e.accumulate = 1;
    KT_STATUS(kva_seq_set_evict(cw, sw, &e), KVA_ERR_UNSUPPORTED);
    e.accumulate = 0;
  }
  { /* a cache with a WINDOW layer group keeps no positions: as evict_support NONE */
    kva_layer_group grp[2];
    int lg[2] = {0, 1};
    memset(grp, 0, sizeof grp);
    grp[1].kind = KVA_SPAN_WINDOW, grp[1].window = 8;
    kt_desc_init(&d, 2, 1, 4, 4, 16, 4, KVA_F32);
    d.n_groups = 2, d.groups = grp, d.layer_group = lg;
    KT_STATUS(kva_cache_create(&d, &cg), KVA_OK);
    if (cg) {
      KT_STATUS(kva_seq_new(cg, &sg), KVA_OK);
      KT_STATUS(kva_seq_set_evict(cg, sg, &e), KVA_ERR_UNSUPPORTED);
    }
  }
  /* kva_seq_compress */
  KT_STATUS(kva_seq_compress(NULL, seq, 4), KVA_ERR_ARG);
  KT_STATUS(kva_seq_compress(c, seq, 0), KVA_ERR_ARG);
  KT_STATUS(kva_seq_compress(c, seq, -3), KVA_ERR_ARG);
  KT_STATUS(kva_seq_compress(c, 12345, 0), KVA_ERR_ARG);
  KT_STATUS(kva_seq_compress(c, -1, 4), KVA_ERR_SEQ);
  KT_STATUS(kva_seq_compress(c, 12345, 4), KVA_ERR_SEQ);
  KT_STATUS(kva_seq_compress(c, freed, 4), KVA_ERR_SEQ);
  /* policy NONE: never set, and set back to NONE */
  KT_STATUS(kva_seq_append(c, fresh, 8), KVA_OK);
  sc_store(c, fresh, 2, 1, 4, 4, 8, &r);
  sc_snap_take(&b, c, fresh, 2, 1, 4, 4);
  KT_CHECK(kva_seq_compress(c, fresh, 4) != KVA_OK, "compress without a policy returned KVA_OK");
  e = sc_policy(6, 0, 0, &u);
  KT_STATUS(kva_seq_set_evict(c, fresh, &e), KVA_OK);
  memset(&e, 0, sizeof e);
  KT_STATUS(kva_seq_set_evict(c, fresh, &e), KVA_OK);
  KT_CHECK(kva_seq_compress(c, fresh, 4) != KVA_OK, "compress with policy NONE returned KVA_OK");
  sc_snap_take(&a, c, fresh, 2, 1, 4, 4);
  KT_CHECK(sc_snap_same(&b, &a), "a refused compress (policy NONE) changed the sequence");
  sc_snap_free(&b), sc_snap_free(&a);
  /* the step not stored in every layer */
  e = sc_policy(6, 0, 0, &u);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  KT_STATUS(kva_seq_append(c, seq, 8), KVA_OK);
  sc_store(c, seq, 2, 1, 4, 4, 8, &r);
  KT_STATUS(kva_seq_append(c, seq, 3), KVA_OK); /* evicts; the step is these 3 tokens */
  sc_snap_take(&b, c, seq, 2, 1, 4, 4);
  KT_STATUS(kva_store(c, seq, 0, kk, kk, 3), KVA_OK); /* layer 0 only */
  sc_snap_free(&b);
  sc_snap_take(&b, c, seq, 2, 1, 4, 4);
  KT_STATUS(kva_seq_compress(c, seq, 2), KVA_ERR_NOT_STORED);
  KT_STATUS(kva_store_at(c, seq, 1, 0, kk, kk, 2), KVA_OK); /* layer 1: two of the three */
  KT_STATUS(kva_seq_compress(c, seq, 2), KVA_ERR_NOT_STORED);
  sc_snap_take(&a, c, seq, 2, 1, 4, 4);
  KT_CHECK(a.len == b.len && a.pos == b.pos, "a refused compress (not stored) changed len / pos");
  sc_snap_free(&b), sc_snap_free(&a);
  KT_STATUS(kva_store(c, seq, 1, kk, kk, 3), KVA_OK);
  KT_STATUS(kva_seq_compress(c, seq, 2), KVA_OK);
  KT_CHECK(kva_seq_len(c, seq) == 2, "compress(2): %d held", kva_seq_len(c, seq));
  { /* WINDOW policy: compress keeps the sinks and the newest */
    kva_evict w;
    int ws = -1;
    static const int32_t want[4] = {0, 1, 10, 11};
    memset(&w, 0, sizeof w);
    w.kind = KVA_EVICT_WINDOW, w.budget = 20, w.n_sink = 2;
    KT_STATUS(kva_seq_new(c, &ws), KVA_OK);
    KT_STATUS(kva_seq_set_evict(c, ws, &w), KVA_OK);
    KT_STATUS(kva_seq_append(c, ws, 12), KVA_OK);
    sc_store(c, ws, 2, 1, 4, 4, 12, &r);
    KT_STATUS(kva_seq_compress(c, ws, 4), KVA_OK);
    KT_CHECK(sc_positions_are(c, ws, 2, 1, 4, 1, 0, want, 4), "WINDOW compress(4) with 2 sinks: not 0 1 10 11");
  }
  { /* block selection refuses an accumulating sequence */
    kva_cache *cb = NULL;
    kva_attn at;
    float q[2 * 8], out[2 * 8];
    int sa = -1, sb = -1;
    sc_user us;
    kt_desc_init(&d, 1, 1, 8, 4, 32, 4, KVA_F16);
    d.block_bounds = 1;
    KT_STATUS(kva_cache_create(&d, &cb), KVA_OK);
    if (cb) {
      sc_user_init(&us, SC_SUM, 1, 1, 8, 8, 0);
      kt_attn_init(&at, 2, 1, 8, 8);
      at.select_budget = 8;
      kt_fill(&r, q, 16, -1.0f, 1.0f);
      KT_STATUS(kva_seq_new(cb, &sa), KVA_OK);
      KT_STATUS(kva_seq_new(cb, &sb), KVA_OK);
      e = sc_policy(40, 0, 0, &us);
      e.accumulate = 1;
      KT_STATUS(kva_seq_set_evict(cb, sa, &e), KVA_OK);
      e.accumulate = 0;
      KT_STATUS(kva_seq_set_evict(cb, sb, &e), KVA_OK);
      KT_STATUS(kva_seq_append(cb, sa, 30), KVA_OK);
      KT_STATUS(kva_seq_append(cb, sb, 30), KVA_OK);
      sc_store(cb, sa, 1, 1, 8, 8, 30, &r);
      sc_store(cb, sb, 1, 1, 8, 8, 30, &r);
      kt_fill_sentinel(out, 16);
      KT_STATUS(kva_attend_cache(cb, sa, 0, &at, q, 1, out), KVA_ERR_UNSUPPORTED);
      KT_CHECK(kt_all_sentinel(out, 16), "block selection on an accumulating sequence wrote its output");
      KT_STATUS(kva_attend_cache(cb, sb, 0, &at, q, 1, out), KVA_OK);
      kva_cache_destroy(cb);
    }
  }
  kva_cache_destroy(c), kva_cache_destroy(cw), kva_cache_destroy(cn), kva_cache_destroy(cg);
}

void test_scorers(void) {
  sc_args();
  sc_directed_ties();
  sc_directed_fewest();
  sc_directed_protected();
  sc_random_rule();
  sc_failures();
  sc_h2o_equiv();
  sc_builtin_direct();
  sc_builtin_args();
  sc_builtin_cache();
  sc_paths_fork();
  sc_paths_prefix();
  sc_paths_full();
  sc_paths_nomem();
  sc_paths_export();
  sc_paths_append_all();
  sc_paths_latent();
}
