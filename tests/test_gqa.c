/* test_gqa.c - kva_gqa_forward against a fp64 reference layer.
 *
 * The reference keeps, per sequence and layer, every token's K and V
 * (projected in double from that token's x, RoPE at its absolute position),
 * and per step computes q for the new tokens, causal attention over the whole
 * history (window, sink, softcap, scale as in the layer's kva_attn) and the
 * output projection.
 *
 * What the cache holds is checked first (kva_seq_read of every slot):
 *   F32 cache: |K_lib - K_ref| <= 2e-5 * (1 + |K_ref|)   (float projections)
 *   F16 cache: K_lib is a binary16 value and |K_lib - K_ref| <= half an f16
 *              ulp of K_ref + 2e-5 * (1 + |K_ref|)       (the library rounds
 *              its float K, which may sit on the other side of a rounding
 *              midpoint than the double K)
 * The reference then attends over K/V in double: its own for F32, the
 * library's (exactly what the cache holds) for F16, so the F16 cache keeps
 * the same tight output tolerance:
 *   y: max |y - y_ref| <= 2e-5 * (1 + max|y_ref|)
 * (float projections of width <= 128 and float attention: measured worst
 * ~5e-7 relative, 0.025 of the tolerance; any error in positions, RoPE, head
 * mapping, biases or masking moves y by 1e-2 or more). */
#include "kvattn.h"
#include "harness.h"
#include "ref.h"

#define TOL_KV_REL 2e-5
#define TOL_Y_REL 2e-5

static double worst_y_ratio;

typedef struct {
  float *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo, *inv_freq;
  kva_gqa_layer L;
} glayer;

typedef struct {
  int id, len;
  double *rk, *rv; /* [n_layers][cap][G*D] reference K (after RoPE) and V */
} gseq;

typedef struct {
  kva_cache *c;
  int n_layers, d, H, G, D, bs, cap;
  kva_dtype dt;
  glayer *layers;
  const char *label;
} gsetup;

static float *rand_buf(kt_rng *r, size_t n, float amp) {
  float *p = KT_ALLOC(float, n);
  kt_fill(r, p, n, -amp, amp);
  return p;
}

static void glayer_free(glayer *g) {
  free(g->wq);
  free(g->bq);
  free(g->wk);
  free(g->bk);
  free(g->wv);
  free(g->bv);
  free(g->wo);
  free(g->bo);
  free(g->inv_freq);
}

/* random weights; biases present or NULL at random; rope and mask from args */
static void glayer_init(kt_rng *r, glayer *g, int d, int H, int G, int D, int rope_kind, int rope_dim,
                        int window, int n_sink, float softcap, float scale) {
  float wa = 3.0f / (float)sqrt((double)d), oa = 1.0f / (float)sqrt((double)(H * D));
  memset(g, 0, sizeof *g);
  g->wq = rand_buf(r, (size_t)H * D * d, wa);
  g->wk = rand_buf(r, (size_t)G * D * d, wa);
  g->wv = rand_buf(r, (size_t)G * D * d, 1.0f);
  g->wo = rand_buf(r, (size_t)d * H * D, oa);
  if (kt_int(r, 0, 1)) g->bq = rand_buf(r, (size_t)H * D, 0.5f);
  if (kt_int(r, 0, 1)) g->bk = rand_buf(r, (size_t)G * D, 0.5f);
  if (kt_int(r, 0, 1)) g->bv = rand_buf(r, (size_t)G * D, 0.5f);
  if (kt_int(r, 0, 1)) g->bo = rand_buf(r, (size_t)d, 0.5f);
  g->L.d_model = d;
  g->L.attn.n_heads = H;
  g->L.attn.n_kv_heads = G;
  g->L.attn.head_dim = D;
  g->L.attn.v_dim = 0;
  g->L.attn.window = window;
  g->L.attn.n_sink = n_sink;
  g->L.attn.softcap = softcap;
  g->L.attn.scale = scale;
  g->L.attn.n_threads = kt_int(r, 0, 2);
  g->L.wq = g->wq;
  g->L.bq = g->bq;
  g->L.wk = g->wk;
  g->L.bk = g->bk;
  g->L.wv = g->wv;
  g->L.bv = g->bv;
  g->L.wo = g->wo;
  g->L.bo = g->bo;
  /* rope_kind: 0 none, 1 rotate-half theta 1e4, 2 interleaved theta 5e5,
     3 inv_freq table (rotate-half) */
  g->L.rope.dim = rope_dim;
  g->L.rope.interleaved = rope_kind == 2;
  if (rope_kind == 1) g->L.rope.theta = 10000.0f;
  if (rope_kind == 2) g->L.rope.theta = 500000.0f;
  if (rope_kind == 3) {
    int i, half = (rope_dim ? rope_dim : D) / 2;
    g->inv_freq = KT_ALLOC(float, half);
    for (i = 0; i < half; i++) g->inv_freq[i] = (float)(0.9 * pow(0.7, (double)i));
    g->L.rope.inv_freq = g->inv_freq;
    g->L.rope.theta = 10000.0f; /* the table wins */
  }
}

static double *gk(const gsetup *s, gseq *q, int l, int t) {
  return q->rk + ((size_t)l * s->cap + t) * s->G * s->D;
}
static double *gv(const gsetup *s, gseq *q, int l, int t) {
  return q->rv + ((size_t)l * s->cap + t) * s->G * s->D;
}

/* One step for one sequence: append n, forward every layer, compare. */
static void gqa_step(kt_rng *r, gsetup *s, gseq *q, int n) {
  int H = s->H, G = s->G, D = s->D, d = s->d, l, t, T, i;
  size_t hd = (size_t)H * D, gd = (size_t)G * D;
  float *x = KT_ALLOC(float, (size_t)n * d), *y = KT_ALLOC(float, (size_t)n * d + 4);
  double *xd = KT_ALLOC(double, d), *qd = KT_ALLOC(double, (size_t)n * hd);
  double *od = KT_ALLOC(double, (size_t)n * hd), *yd = KT_ALLOC(double, (size_t)n * d);
  float *kbuf = KT_ALLOC(float, gd), *vbuf = KT_ALLOC(float, gd);
  int32_t *pbuf = KT_ALLOC(int32_t, G);
  kva_status st;
  st = kva_seq_append(s->c, q->id, n);
  KT_CHECK(st == KVA_OK, "%s: append %d = %d", s->label, n, (int)st);
  if (st != KVA_OK) goto done;
  q->len += n;
  T = q->len;
  for (l = 0; l < s->n_layers; l++) {
    const glayer *g = &s->layers[l];
    ref_attn_cfg c = ref_cfg(&g->L.attn);
    double *ak, *av, err, tol, kv_worst = 0.0;
    int f16_bad = 0;
    size_t where = 0;
    kt_fill(r, x, (size_t)n * d, -1.0f, 1.0f);
    kt_fill_sentinel(y, (size_t)n * d + 4);
    st = kva_gqa_forward(&g->L, s->c, q->id, l, x, n, y);
    KT_CHECK(st == KVA_OK, "%s: kva_gqa_forward(layer %d, n %d) = %d", s->label, l, n, (int)st);
    KT_CHECK(kt_all_sentinel(y + (size_t)n * d, 4), "%s: forward wrote past y", s->label);
    /* reference K, V, q of the new tokens */
    for (t = 0; t < n; t++) {
      int32_t pos = T - n + t;
      for (i = 0; i < d; i++) xd[i] = (double)x[(size_t)t * d + i];
      ref_linear(g->wk, g->bk, xd, d, (int)gd, gk(s, q, l, pos));
      ref_linear(g->wv, g->bv, xd, d, (int)gd, gv(s, q, l, pos));
      ref_linear(g->wq, g->bq, xd, d, (int)hd, qd + (size_t)t * hd);
      ref_rope(gk(s, q, l, pos), G, D, g->L.rope.dim, g->L.rope.interleaved, (double)g->L.rope.theta,
               g->L.rope.inv_freq, pos);
      ref_rope(qd + (size_t)t * hd, H, D, g->L.rope.dim, g->L.rope.interleaved,
               (double)g->L.rope.theta, g->L.rope.inv_freq, pos);
    }
    /* what the cache holds */
    ak = KT_ALLOC(double, (size_t)T * gd);
    av = KT_ALLOC(double, (size_t)T * gd);
    for (t = 0; t < T; t++) {
      const double *wk = gk(s, q, l, t), *wv = gv(s, q, l, t);
      st = kva_seq_read(s->c, q->id, l, t, kbuf, vbuf, pbuf);
      if (st != KVA_OK) {
        KT_CHECK(0, "%s: kva_seq_read(layer %d slot %d) = %d", s->label, l, t, (int)st);
        memset(kbuf, 0, gd * sizeof(float));
        memset(vbuf, 0, gd * sizeof(float));
      }
      for (i = 0; i < G; i++)
        if (pbuf[i] != t) {
          KT_CHECK(0, "%s: layer %d slot %d head %d: pos %ld", s->label, l, t, i, (long)pbuf[i]);
          break;
        }
      for (i = 0; i < (int)gd; i++) {
        double ek = fabs((double)kbuf[i] - wk[i]), ev = fabs((double)vbuf[i] - wv[i]);
        double bk = TOL_KV_REL * (1.0 + fabs(wk[i])), bv = TOL_KV_REL * (1.0 + fabs(wv[i]));
        if (s->dt == KVA_F16) {
          bk += 0.5 * ref_f16_ulp(wk[i]);
          bv += 0.5 * ref_f16_ulp(wv[i]);
          if (ref_round_f16(kbuf[i]) != kbuf[i] || ref_round_f16(vbuf[i]) != vbuf[i]) f16_bad++;
        }
        if (!(ek <= bk) || !(ev <= bv)) {
          if (kv_worst == 0.0)
            KT_CHECK(0, "%s: layer %d slot %d [%d]: cache K %.9g V %.9g, ref K %.9g V %.9g", s->label,
                     l, t, i, (double)kbuf[i], (double)vbuf[i], wk[i], wv[i]);
          kv_worst = ek > ev ? ek : ev;
        }
        ak[(size_t)t * gd + i] = s->dt == KVA_F16 ? (double)kbuf[i] : wk[i];
        av[(size_t)t * gd + i] = s->dt == KVA_F16 ? (double)vbuf[i] : wv[i];
      }
    }
    KT_CHECK(f16_bad == 0, "%s: layer %d: %d cached values are not binary16 values", s->label, l,
             f16_bad);
    KT_CHECK(kv_worst == 0.0, "%s: layer %d: cached K/V differ from the reference (len %d)", s->label,
             l, T);
    ref_attend(&c, qd, n, NULL, ak, av, T, NULL, od, NULL);
    for (t = 0; t < n; t++) ref_linear(g->wo, g->bo, od + (size_t)t * hd, (int)hd, d, yd + (size_t)t * d);
    tol = TOL_Y_REL * (1.0 + ref_max_abs_d(yd, (size_t)n * d));
    err = ref_max_err(y, yd, (size_t)n * d, &where);
    if (err / tol > worst_y_ratio) worst_y_ratio = err / tol;
    KT_CHECK(err <= tol,
             "%s: y err %.3g > tol %.3g at [t %d][%d]: got %.9g want %.9g (layer %d, len %d, n %d, "
             "H %d G %d D %d d %d, rope theta %g dim %d il %d table %s, win %d sink %d cap %g)",
             s->label, err, tol, (int)(where / d), (int)(where % d), (double)y[where], yd[where], l, T,
             n, H, G, D, d, (double)g->L.rope.theta, g->L.rope.dim, g->L.rope.interleaved,
             g->L.rope.inv_freq ? "yes" : "no", g->L.attn.window, g->L.attn.n_sink,
             (double)g->L.attn.softcap);
    free(ak);
    free(av);
  }
done:
  free(x);
  free(y);
  free(xd);
  free(qd);
  free(od);
  free(yd);
  free(kbuf);
  free(vbuf);
  free(pbuf);
}

static void gqa_case(kt_rng *r, int H, int G, kva_dtype dt, int rope_kind, const char *label) {
  static const int Ds[] = {4, 6, 8, 12, 16, 32};
  static const int bss[] = {1, 3, 5, 16};
  enum { NSEQ = 2 };
  gsetup s;
  gseq seqs[NSEQ];
  kva_cache_desc cd;
  int i, l, step, rope_dim, n_decode = kt_quick ? 3 : 6;
  memset(&s, 0, sizeof s);
  s.n_layers = kt_int(r, 1, 3);
  s.d = kt_int(r, 16, 96);
  s.H = H;
  s.G = G;
  s.D = kt_pick(r, Ds, 6);
  s.bs = kt_pick(r, bss, 4);
  s.cap = 20 + 20 + n_decode + 2;
  s.dt = dt == KVA_DTYPE_DEFAULT ? KVA_F16 : dt;
  s.label = label;
  rope_dim = kt_int(r, 0, 1) ? 0 : 2 * kt_int(r, 1, s.D / 2);
  s.layers = KT_ALLOC(glayer, s.n_layers);
  for (l = 0; l < s.n_layers; l++) {
    /* layers alternate global / local (Gemma-like); sink and softcap vary */
    int window = (l % 2 == 1 || kt_int(r, 0, 3) == 0) ? kt_int(r, 1, 9) : 0;
    int sink = window && kt_int(r, 0, 1) ? kt_int(r, 1, 3) : 0;
    float cap = kt_int(r, 0, 3) == 0 ? 20.0f : 0.0f;
    float scale = kt_int(r, 0, 3) == 0 ? kt_uniform(r, 0.1f, 0.6f) : 0.0f;
    glayer_init(r, &s.layers[l], s.d, H, G, s.D, rope_kind, rope_dim, window, sink, cap, scale);
  }
  memset(&cd, 0, sizeof cd);
  cd.n_layers = s.n_layers;
  cd.n_kv_heads = G;
  cd.head_dim = s.D;
  cd.block_size = s.bs;
  cd.n_blocks = NSEQ * ((s.cap + s.bs - 1) / s.bs) + 1;
  cd.dtype = dt;
  if (kva_cache_create(&cd, &s.c) != KVA_OK) {
    KT_CHECK(0, "%s: cache create failed", label);
    goto out;
  }
  for (i = 0; i < NSEQ; i++) {
    seqs[i].id = -1;
    seqs[i].len = 0;
    seqs[i].rk = KT_ALLOC(double, (size_t)s.n_layers * s.cap * G * s.D);
    seqs[i].rv = KT_ALLOC(double, (size_t)s.n_layers * s.cap * G * s.D);
    KT_STATUS(kva_seq_new(s.c, &seqs[i].id), KVA_OK);
  }
  /* prefill chunk, a second chunk, then single-token decode; the two
     sequences interleave */
  for (step = 0; step < 2 + n_decode; step++)
    for (i = 0; i < NSEQ; i++) {
      int n = step < 2 ? kt_int(r, 1, 20) : 1;
      gqa_step(r, &s, &seqs[i], n);
    }
  for (i = 0; i < NSEQ; i++) {
    free(seqs[i].rk);
    free(seqs[i].rv);
  }
  kva_cache_destroy(s.c);
out:
  for (l = 0; l < s.n_layers; l++) glayer_free(&s.layers[l]);
  free(s.layers);
}

static void test_gqa_random(void) {
  static const int HG[][2] = {{4, 4}, {4, 1}, {4, 2}, {6, 3}, {8, 2}, {2, 1}, {3, 3}, {1, 1}};
  kt_rng r;
  int it, n_it = kt_iters(64);
  char label[96];
  kt_begin("gqa: forward vs fp64 reference layer");
  kt_seed(&r, 0x6A4);
  for (it = 0; it < n_it; it++) {
    int hg = it % 8, rope_kind = (it / 8) % 4;
    kva_dtype dt = (it % 3 == 0) ? KVA_F32 : (it % 3 == 1 ? KVA_F16 : KVA_DTYPE_DEFAULT);
    sprintf(label, "case %d H %d G %d rope %d dtype %d", it, HG[hg][0], HG[hg][1], rope_kind, (int)dt);
    gqa_case(&r, HG[hg][0], HG[hg][1], dt, rope_kind, label);
  }
}

/* ------------------------------------------------------------------------ */

static void test_gqa_bad(void) {
  kt_rng r;
  glayer g;
  kva_gqa_layer L;
  kva_cache_desc cd;
  kva_cache *c = NULL;
  int seq = -1, fresh = -1, d = 16, H = 4, G = 2, D = 8, n = 3, i;
  float x[3 * 16], y[3 * 16 + 4], k[2 * 8], v[2 * 8];
  int32_t p[2];
  kva_status st;
  kt_begin("gqa: bad arguments change nothing");
  kt_seed(&r, 0xBAD);
  glayer_init(&r, &g, d, H, G, D, 1, 0, 0, 0, 0.0f, 0.0f);
  memset(&cd, 0, sizeof cd);
  cd.n_layers = 2;
  cd.n_kv_heads = G;
  cd.head_dim = D;
  cd.block_size = 4;
  cd.n_blocks = 8;
  cd.dtype = KVA_F32;
  if (kva_cache_create(&cd, &c) != KVA_OK) {
    KT_CHECK(0, "create failed");
    glayer_free(&g);
    return;
  }
  kt_fill(&r, x, sizeof x / sizeof x[0], -1, 1);
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  KT_STATUS(kva_seq_new(c, &fresh), KVA_OK);
  /* forward on a sequence that has not appended */
  kt_fill_sentinel(y, sizeof y / sizeof y[0]);
  KT_STATUS(kva_gqa_forward(&g.L, c, fresh, 0, x, 1, y), KVA_ERR_STEP);
  KT_CHECK(kt_all_sentinel(y, sizeof y / sizeof y[0]), "forward without append wrote y");
  KT_STATUS(kva_seq_append(c, seq, n), KVA_OK);
#define BADG(call, want, what)                                                          \
  do {                                                                                  \
    kt_fill_sentinel(y, sizeof y / sizeof y[0]);                                        \
    st = (call);                                                                        \
    KT_CHECK(st == (want), "%s: status %d, want %d", what, (int)st, (int)(want));       \
    KT_CHECK(kt_all_sentinel(y, sizeof y / sizeof y[0]), "%s: y changed", what);        \
  } while (0)
  BADG(kva_gqa_forward(NULL, c, seq, 0, x, n, y), KVA_ERR_ARG, "L NULL");
  BADG(kva_gqa_forward(&g.L, NULL, seq, 0, x, n, y), KVA_ERR_ARG, "cache NULL");
  BADG(kva_gqa_forward(&g.L, c, seq, 0, NULL, n, y), KVA_ERR_ARG, "x NULL");
  st = kva_gqa_forward(&g.L, c, seq, 0, x, n, NULL);
  KT_CHECK(st == KVA_ERR_ARG, "y NULL: status %d", (int)st);
  BADG(kva_gqa_forward(&g.L, c, seq, 0, x, -1, y), KVA_ERR_ARG, "n_tokens < 0");
  BADG(kva_gqa_forward(&g.L, c, seq, 0, x, n + 1, y), KVA_ERR_STEP, "n_tokens > latest append");
  BADG(kva_gqa_forward(&g.L, c, seq, -1, x, n, y), KVA_ERR_ARG, "layer -1");
  BADG(kva_gqa_forward(&g.L, c, seq, 2, x, n, y), KVA_ERR_ARG, "layer == n_layers");
  BADG(kva_gqa_forward(&g.L, c, seq + 1000, 0, x, n, y), KVA_ERR_SEQ, "unknown seq");
  BADG(kva_gqa_forward(&g.L, c, -3, 0, x, n, y), KVA_ERR_SEQ, "negative seq");
  BADG(kva_gqa_forward(NULL, c, -3, 0, x, n, y), KVA_ERR_ARG, "L NULL before bad seq");
  L = g.L;
  L.wq = NULL;
  BADG(kva_gqa_forward(&L, c, seq, 0, x, n, y), KVA_ERR_ARG, "wq NULL");
  L = g.L;
  L.wk = NULL;
  BADG(kva_gqa_forward(&L, c, seq, 0, x, n, y), KVA_ERR_ARG, "wk NULL");
  L = g.L;
  L.wv = NULL;
  BADG(kva_gqa_forward(&L, c, seq, 0, x, n, y), KVA_ERR_ARG, "wv NULL");
  L = g.L;
  L.wo = NULL;
  BADG(kva_gqa_forward(&L, c, seq, 0, x, n, y), KVA_ERR_ARG, "wo NULL");
  L = g.L;
  L.d_model = 0;
  BADG(kva_gqa_forward(&L, c, seq, 0, x, n, y), KVA_ERR_ARG, "d_model 0");
  L = g.L;
  L.attn.n_kv_heads = 1;
  L.attn.n_heads = 4;
  BADG(kva_gqa_forward(&L, c, seq, 0, x, n, y), KVA_ERR_ARG, "attn G 1 vs cache G 2");
  L = g.L;
  L.attn.head_dim = 4;
  BADG(kva_gqa_forward(&L, c, seq, 0, x, n, y), KVA_ERR_ARG, "attn head_dim 4 vs cache 8");
  L = g.L;
  L.attn.n_heads = 3;
  BADG(kva_gqa_forward(&L, c, seq, 0, x, n, y), KVA_ERR_ARG, "H 3 % G 2");
  L = g.L;
  L.rope.dim = 3;
  BADG(kva_gqa_forward(&L, c, seq, 0, x, n, y), KVA_ERR_ARG, "rope dim 3 (odd)");
  L = g.L;
  L.rope.dim = 10;
  BADG(kva_gqa_forward(&L, c, seq, 0, x, n, y), KVA_ERR_ARG, "rope dim 10 > head_dim 8");
  L = g.L;
  L.rope.table_len = 4; /* a table length without a table: refused up front, not an unrotated layer */
  BADG(kva_gqa_forward(&L, c, seq, 0, x, n, y), KVA_ERR_ARG, "rope table_len 4, table NULL");
  L.rope.table_len = -1;
  BADG(kva_gqa_forward(&L, c, seq, 0, x, n, y), KVA_ERR_ARG, "rope table_len -1");
  BADG(kva_gqa_forward(&g.L, c, seq, 0, x, 0, y), KVA_OK, "n_tokens 0 no-op");
#undef BADG
  /* none of it stored anything: the appended slots still read zeros */
  for (i = 0; i < n; i++) {
    int l;
    for (l = 0; l < 2; l++) {
      int z = 1, j;
      KT_STATUS(kva_seq_read(c, seq, l, i, k, v, p), KVA_OK);
      for (j = 0; j < G * D; j++) z &= k[j] == 0.0f && v[j] == 0.0f;
      KT_CHECK(z, "failed forward calls stored into layer %d slot %d", l, i);
    }
  }
  KT_CHECK(kva_seq_len(c, seq) == n && kva_seq_len(c, fresh) == 0, "lengths changed");
  /* a forward of fewer tokens than the step would leave the step's older
     tokens unstored in its layer: refused before storing anything */
  KT_STATUS(kva_gqa_forward(&g.L, c, seq, 1, x, 1, y), KVA_ERR_NOT_STORED);
  {
    int z = 1, j;
    KT_STATUS(kva_seq_read(c, seq, 1, n - 1, k, v, p), KVA_OK);
    for (j = 0; j < G * D; j++) z &= k[j] == 0.0f && v[j] == 0.0f;
    KT_CHECK(z, "a refused forward stored its token");
  }
  /* and the valid calls work: the whole step, or its older part stored first */
  KT_STATUS(kva_gqa_forward(&g.L, c, seq, 0, x, n, y), KVA_OK);
  KT_STATUS(kva_store(c, seq, 1, x, x, n), KVA_OK); /* x: n x G x D floats */
  KT_STATUS(kva_gqa_forward(&g.L, c, seq, 1, x, 1, y), KVA_OK);
  kva_cache_destroy(c);
  glayer_free(&g);
}

/* ------------------------------------------------------------------------ */
/* Temporaries: with a workspace of kva_gqa_workspace_bytes the forward takes
   no memory at all; without one (or too small) every byte comes from the
   cache's alloc_fn and goes back; outputs are the same bits either way.     */

typedef struct {
  long takes, gives, live_bytes;
} ws_count;

static void *ws_alloc(size_t size, size_t align, void *user) {
  ws_count *w = (ws_count *)user;
  void *p;
  w->takes++;
  w->live_bytes += (long)size;
  /* the cache's one block wants 64-byte alignment; forwards ask for 64 too */
  p = KT_ALLOC(unsigned char, size + align + sizeof(void *));
  if (!p) return NULL;
  {
    unsigned char *raw = (unsigned char *)p, *al = raw + sizeof(void *);
    al += (align - (uintptr_t)al % align) % align;
    ((void **)al)[-1] = raw; /* al - raw >= sizeof(void *): room for the pointer */
    return al;
  }
}

static void ws_free(void *p, size_t size, void *user) {
  ws_count *w = (ws_count *)user;
  w->gives++;
  w->live_bytes -= (long)size;
  free(((void **)p)[-1]);
}

static void test_gqa_workspace(void) {
  kt_rng r;
  glayer g;
  kva_cache_desc cd;
  kva_cache *c[3] = {NULL, NULL, NULL};
  ws_count cnt[3];
  int seq[3], d = 24, H = 6, G = 2, D = 12, i, step, n;
  size_t need1, need5;
  float x[5 * 24], y[3][5 * 24];
  unsigned char *ws;
  kt_begin("gqa: workspace and allocations through alloc_fn");
  kt_seed(&r, 0x5eed);
  glayer_init(&r, &g, d, H, G, D, 1, 0, 0, 0, 0.0f, 0.0f);
  need1 = kva_gqa_workspace_bytes(&g.L, 1);
  need5 = kva_gqa_workspace_bytes(&g.L, 5);
  KT_CHECK(need1 == (size_t)(2 * H * D + 2 * G * D) * sizeof(float) + sizeof(int32_t),
           "kva_gqa_workspace_bytes(1) = %lu", (unsigned long)need1);
  KT_CHECK(need5 == 5 * need1, "kva_gqa_workspace_bytes(5) = %lu, 5 x (1) = %lu", (unsigned long)need5,
           (unsigned long)(5 * need1));
  KT_CHECK(kva_gqa_workspace_bytes(NULL, 1) == 0 && kva_gqa_workspace_bytes(&g.L, -1) == 0,
           "workspace size of bad arguments is not 0");
  ws = KT_ALLOC(unsigned char, need5 + 8);
  /* three caches: 0 without a workspace, 1 with one large enough, 2 with one a byte short */
  for (i = 0; i < 3; i++) {
    memset(&cnt[i], 0, sizeof cnt[i]);
    memset(&cd, 0, sizeof cd);
    cd.n_layers = 1;
    cd.n_kv_heads = G;
    cd.head_dim = D;
    cd.block_size = 4;
    cd.n_blocks = 16;
    cd.alloc_fn = ws_alloc;
    cd.free_fn = ws_free;
    cd.user = &cnt[i];
    KT_STATUS(kva_cache_create(&cd, &c[i]), KVA_OK);
    KT_STATUS(kva_seq_new(c[i], &seq[i]), KVA_OK);
  }
  if (!c[0] || !c[1] || !c[2]) goto done;
  for (step = 0; step < 6; step++) {
    n = step == 0 ? 5 : 1;
    kt_fill(&r, x, (size_t)n * d, -1, 1);
    for (i = 0; i < 3; i++) {
      kva_gqa_layer L = g.L;
      long t0 = cnt[i].takes, g0 = cnt[i].gives;
      if (i == 1) {
        L.workspace = ws;
        L.workspace_bytes = kva_gqa_workspace_bytes(&L, n);
      } else if (i == 2) {
        L.workspace = ws;
        L.workspace_bytes = kva_gqa_workspace_bytes(&L, n) - 1;
      }
      KT_STATUS(kva_seq_append(c[i], seq[i], n), KVA_OK);
      KT_STATUS(kva_gqa_forward(&L, c[i], seq[i], 0, x, n, y[i]), KVA_OK);
      if (i == 1)
        KT_CHECK(cnt[i].takes == t0 && cnt[i].gives == g0, "step %d: with a workspace the forward took %ld blocks",
                 step, cnt[i].takes - t0);
      else
        KT_CHECK(cnt[i].takes == t0 + 1 && cnt[i].gives == g0 + 1,
                 "step %d, cache %d: %ld takes, %ld gives through alloc_fn (want 1 and 1)", step, i, cnt[i].takes - t0,
                 cnt[i].gives - g0);
    }
    KT_CHECK(memcmp(y[0], y[1], (size_t)n * d * sizeof(float)) == 0 &&
                 memcmp(y[0], y[2], (size_t)n * d * sizeof(float)) == 0,
             "step %d: outputs differ between workspace and allocation", step);
  }
  {
    /* a workspace that is not float-aligned is an argument error, and nothing changes */
    kva_gqa_layer L = g.L;
    L.workspace = ws + 1;
    L.workspace_bytes = need5;
    KT_STATUS(kva_seq_append(c[1], seq[1], 1), KVA_OK);
    KT_STATUS(kva_gqa_forward(&L, c[1], seq[1], 0, x, 1, y[1]), KVA_ERR_ARG);
  }
done:
  for (i = 0; i < 3; i++) {
    kva_cache_destroy(c[i]);
    KT_CHECK(cnt[i].takes == cnt[i].gives && cnt[i].live_bytes == 0,
             "cache %d: %ld takes, %ld gives, %ld bytes not given back", i, cnt[i].takes, cnt[i].gives,
             cnt[i].live_bytes);
  }
  free(ws);
  glayer_free(&g);
}

void test_gqa(void) {
  test_gqa_bad();
  test_gqa_workspace();
  test_gqa_random();
  if (getenv("KVA_TEST_VERBOSE")) fprintf(stderr, "  gqa: worst y err/tol %.3f\n", worst_y_ratio);
}
