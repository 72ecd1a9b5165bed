/* test_mla.c - kva_mla_forward (DeepSeek-V2/V3 multi-head latent attention)
 * against ref_mla.h, the independent fp64 reference, and against a literal
 * transcription of a common simplified MLA sketch (d_rope = 0: a k_rope that
 * is computed and never used).
 *
 * Both paths (naive = 0 absorbed, naive = 1 rebuild) run every scenario on
 * their own sequence of one cache (absorbed on layer 1, naive on layer 0),
 * chunk by chunk (prefill chunks, second chunks, single-token decode steps),
 * and every chunk's output is compared with the reference, which keeps the
 * sequence's inputs and recomputes every latent, key and value in double.
 *
 * Tolerances, relative to M = max(max|y_ref| of the chunk, 0.05) (the weights
 * give every output's terms a magnitude of about 1):
 *  - F32 latent cache: |y - y_ref| <= 5e-5 M.  The library computes in float:
 *    projections (length <= 64), RMSNorm, RoPE with double angles, scores of
 *    d_nope+d_rope (naive) or d_latent+d_rope (absorbed) products, softmax,
 *    W_UV and the output projection.  Each stage adds a relative error of a
 *    few float epsilons times sqrt(length) (~1e-6); a score of size S carries
 *    an absolute error ~S·1e-6 that enters the probabilities with the same
 *    relative size.  Measured over 400 seeds: median 7e-7 M, worst 6e-6 M, so
 *    the bound has an 8x margin on the worst case and still fails at any real
 *    mistake (a wrong position, scale, eps, gain, bias or rope pair is an
 *    O(1e-2..1) change: every such mutation of kvattn.h fails hundreds of
 *    checks).  The two paths must agree with each other to the same bound.
 *  - F16 / BF16 latent cache, checked twice:
 *    (a) "over the stored latents": the reference attends over the vectors
 *        kva_seq_read returns, F32 bound (5e-5 M): the attention math over
 *        what the cache holds, free of rounding luck;
 *    (b) end to end: the reference rounds its own cached vectors (normalised
 *        c_kv, rotated k_pe) through f16 / bf16 with ref.h's encoder.  Both
 *        sides then hold the same numbers except where the library's float
 *        and the reference's double fall on two sides of a rounding midpoint
 *        (~1e-4 per large value for f16): one step, 2^-11 (bf16 2^-8)
 *        relative, which can move the output by ~1e-3 M when attention is
 *        sharp.  Bound 2e-3 M (F16), 4e-3 M (BF16); measured worst over 400
 *        seeds 4.8e-4 M / 6.8e-4 M.  For scale: against the unrounded
 *        reference the F16 cache itself is off by median 6e-4 M, worst 2e-2 M.
 *  - Cache content (kva_seq_read of a latent slot = [c_kv | k_pe]): F32
 *    within 1e-5 of the vector's max magnitude (the float error of the
 *    projection); F16 / BF16 within one step of the rounded reference plus
 *    that float error (tiny values come from cancelling O(1) sums, so their
 *    float error can exceed a subnormal f16 step).
 *  - INT8 / FP8 latents: see test_mla_quant.
 *
 * KVA_MLA_SEED=n runs the random parts with another seed; KVA_TEST_VERBOSE=1
 * prints the worst error/tolerance ratios.
 */
#include "kvattn.h"
#include "harness.h"
#include "ref.h"
#include "ref_mla.h"

#define MLA_TOL_F32 5e-5
#define MLA_TOL_F16 2e-3
#define MLA_TOL_BF16 4e-3
#define MLA_TOL_LAT_F32 1e-5
#define MLA_LAT_TOL(M) (MLA_TOL_LAT_F32 * ((M) > 1e-3 ? (M) : 1e-3))

static double mla_worst_ratio[3]; /* worst err/tol seen: F32, F16, BF16 */
static double mla_worst_f16_unrounded;
static int rope_set_d0_status = -1, q_norm_null_status = -1;

/* ------------------------------------------------------------------------ */
/* A model configuration and its random weights                             */

typedef struct {
  int d_model, H, dl, dn, dr, dv, qr; /* qr: q_lora_rank */
  int bias;                           /* every bias present */
  int kv_norm;                        /* kv_norm gain present */
  int interleaved, rope_dim;          /* rope.dim (0 => d_rope) */
  float theta;                        /* 0 => no RoPE */
  int inv_freq;                       /* give an inv_freq table */
  float scale, norm_eps;              /* 0 => defaults */
  float q_gain;                       /* sharpness of the attention */
  float dkv_gain;                     /* scale of w_dkv (tiny latents test the default eps) */
  int q_norm_null;                    /* q_lora with q_norm NULL */
} mla_cfg;

typedef struct {
  mla_cfg c;
  float *wq, *bq, *wq_a, *q_norm, *wq_b, *w_dkv, *b_dkv, *kv_norm, *w_kr, *b_kr;
  float *w_uk, *b_uk, *w_uv, *b_uv, *wo, *bo, *inv_freq;
  kva_mla_layer L;
} mla_model;

static void cfg_init(mla_cfg *c, int d, int H, int dl, int dn, int dr, int dv) {
  memset(c, 0, sizeof *c);
  c->d_model = d;
  c->H = H;
  c->dl = dl;
  c->dn = dn;
  c->dr = dr;
  c->dv = dv;
  c->kv_norm = 1;
  c->interleaved = 1;
  c->theta = 10000.0f;
  c->q_gain = 1.0f;
  c->dkv_gain = 1.0f;
}

/* uniform with variance gain²/in: unit-variance inputs give unit-variance outputs */
static float *rand_w(kt_rng *r, int out, int in, float gain) {
  float *w = KT_ALLOC(float, (size_t)out * in);
  float a = gain * (float)sqrt(3.0 / in);
  kt_fill(r, w, (size_t)out * in, -a, a);
  return w;
}
static float *rand_v(kt_rng *r, int n, float lo, float hi) {
  float *w = KT_ALLOC(float, n > 0 ? n : 1);
  kt_fill(r, w, (size_t)(n > 0 ? n : 1), lo, hi);
  return w;
}

static void model_build(kt_rng *r, const mla_cfg *c, mla_model *m) {
  int dq = c->dn + c->dr, i;
  memset(m, 0, sizeof *m);
  m->c = *c;
  if (c->qr > 0) {
    m->wq_a = rand_w(r, c->qr, c->d_model, 1.0f);
    m->q_norm = c->q_norm_null ? NULL : rand_v(r, c->qr, 0.5f, 1.5f);
    m->wq_b = rand_w(r, c->H * dq, c->qr, c->q_gain);
  } else {
    m->wq = rand_w(r, c->H * dq, c->d_model, c->q_gain);
    if (c->bias) m->bq = rand_v(r, c->H * dq, -0.5f, 0.5f);
  }
  m->w_dkv = rand_w(r, c->dl, c->d_model, c->dkv_gain);
  if (c->bias) m->b_dkv = rand_v(r, c->dl, -0.5f * c->dkv_gain, 0.5f * c->dkv_gain);
  if (c->kv_norm) m->kv_norm = rand_v(r, c->dl, 0.5f, 1.5f);
  if (c->dr > 0) {
    m->w_kr = rand_w(r, c->dr, c->d_model, 1.0f);
    if (c->bias) m->b_kr = rand_v(r, c->dr, -0.5f, 0.5f);
  }
  m->w_uk = rand_w(r, c->H * c->dn, c->dl, 1.0f);
  if (c->bias) m->b_uk = rand_v(r, c->H * c->dn, -2.0f, 2.0f); /* cancels in softmax */
  m->w_uv = rand_w(r, c->H * c->dv, c->dl, 1.0f);
  if (c->bias) m->b_uv = rand_v(r, c->H * c->dv, -0.5f, 0.5f);
  m->wo = rand_w(r, c->d_model, c->H * c->dv, 1.0f);
  if (c->bias) m->bo = rand_v(r, c->d_model, -0.5f, 0.5f);
  if (c->inv_freq) {
    int rd = c->rope_dim ? c->rope_dim : c->dr;
    m->inv_freq = KT_ALLOC(float, rd / 2 + 1);
    for (i = 0; i < rd / 2; i++) m->inv_freq[i] = (float)(0.9 / (1.0 + 1.7 * i));
  }

  m->L.d_model = c->d_model;
  m->L.n_heads = c->H;
  m->L.d_latent = c->dl;
  m->L.d_nope = c->dn;
  m->L.d_rope = c->dr;
  m->L.d_v = c->dv;
  m->L.scale = c->scale;
  m->L.wq = m->wq;
  m->L.bq = m->bq;
  m->L.q_lora_rank = c->qr;
  m->L.wq_a = m->wq_a;
  m->L.q_norm = m->q_norm;
  m->L.wq_b = m->wq_b;
  m->L.w_dkv = m->w_dkv;
  m->L.b_dkv = m->b_dkv;
  m->L.kv_norm = m->kv_norm;
  m->L.norm_eps = c->norm_eps;
  m->L.w_kr = m->w_kr;
  m->L.b_kr = m->b_kr;
  m->L.w_uk = m->w_uk;
  m->L.b_uk = m->b_uk;
  m->L.w_uv = m->w_uv;
  m->L.b_uv = m->b_uv;
  m->L.wo = m->wo;
  m->L.bo = m->bo;
  m->L.rope.theta = c->theta;
  m->L.rope.dim = c->rope_dim;
  m->L.rope.interleaved = c->interleaved;
  m->L.rope.inv_freq = m->inv_freq;
  m->L.naive = 0;
  m->L.n_threads = 1;
}

static void model_free(mla_model *m) {
  free(m->wq);
  free(m->bq);
  free(m->wq_a);
  free(m->q_norm);
  free(m->wq_b);
  free(m->w_dkv);
  free(m->b_dkv);
  free(m->kv_norm);
  free(m->w_kr);
  free(m->b_kr);
  free(m->w_uk);
  free(m->b_uk);
  free(m->w_uv);
  free(m->b_uv);
  free(m->wo);
  free(m->bo);
  free(m->inv_freq);
  memset(m, 0, sizeof *m);
}

static void latent_desc(kva_cache_desc *d, const mla_cfg *c, int n_layers, int bs, int n_blocks,
                        kva_dtype dt) {
  memset(d, 0, sizeof *d);
  d->kind = KVA_CACHE_LATENT;
  d->n_layers = n_layers;
  d->n_kv_heads = 1;
  d->head_dim = c->dl + c->dr;
  d->v_dim = c->dl;
  d->block_size = bs;
  d->n_blocks = n_blocks;
  d->dtype = dt;
}

static int store_of(kva_dtype dt) {
  if (dt == KVA_F16 || dt == KVA_DTYPE_DEFAULT) return REF_MLA_STORE_F16;
  if (dt == KVA_BF16) return REF_MLA_STORE_BF16;
  return REF_MLA_STORE_EXACT;
}
static int tol_idx(int store) { return store; }
static double tol_of(int store) {
  return store == REF_MLA_STORE_F16 ? MLA_TOL_F16
                                    : store == REF_MLA_STORE_BF16 ? MLA_TOL_BF16 : MLA_TOL_F32;
}

/* |y - ref| <= rel · M, M = max|ref| but at least 0.05: the weights give the
   terms of every output a magnitude of about 1, so an output that cancels to
   1e-3 (H 1, d_v 1) still carries the float error of its O(1) terms. */
static void check_y(const float *y, const double *yr, size_t n, double rel, int store,
                    const char *label, const char *what, int chunk) {
  size_t wi;
  double M = ref_max_abs_d(yr, n), err = ref_max_err(y, yr, n, &wi), tol;
  if (M < 0.05) M = 0.05;
  tol = rel * M;
  if (store >= 0 && err / tol > mla_worst_ratio[tol_idx(store)])
    mla_worst_ratio[tol_idx(store)] = err / tol;
  KT_CHECK(err <= tol, "%s: %s chunk %d: y[%lu] = %.9g vs ref %.9g (|err| %.3g > tol %.3g, M %.3g)",
           label, what, chunk, (unsigned long)wi, (double)y[wi], yr[wi], err, tol, M);
}

/* kva_seq_read of every slot of (seq, layer) against the reference's cached
   vectors. */
static void check_latents(kva_cache *c, int seq, int layer, const ref_mla_seq *rs, int store,
                          const char *label) {
  const kva_mla_layer *L = rs->L;
  int dl = L->d_latent, dr = L->d_rope, D = dl + dr, t, i, n = rs->n, bad = 0;
  double *ckv = KT_ALLOC(double, (size_t)n * dl), *kpe = KT_ALLOC(double, (size_t)n * dr + 1);
  float *k = KT_ALLOC(float, D + 1);
  KT_CHECK(kva_seq_len(c, seq) == n, "%s: kva_seq_len %d, expected %d", label, kva_seq_len(c, seq),
           n);
  ref_mla_seq_latents(rs, ckv, kpe);
  for (t = 0; t < n && bad < 3; t++) {
    int32_t pos = -7;
    double M = 0.0;
    kva_status st;
    memset(k, 0, sizeof(float) * (size_t)(D + 1));
    k[D] = KT_SENTINEL;
    st = kva_seq_read(c, seq, layer, t, k, NULL, &pos);
    KT_STATUS(st, KVA_OK);
    KT_CHECK(pos == t, "%s: slot %d read position %d", label, t, (int)pos);
    KT_CHECK(kt_f2u(k[D]) == kt_f2u(KT_SENTINEL), "%s: kva_seq_read wrote past head_dim", label);
    M = ref_max_abs_d(ckv + (size_t)t * dl, (size_t)dl);
    if (dr > 0 && ref_max_abs_d(kpe + (size_t)t * dr, (size_t)dr) > M)
      M = ref_max_abs_d(kpe + (size_t)t * dr, (size_t)dr);
    for (i = 0; i < D; i++) {
      double want = i < dl ? ckv[(size_t)t * dl + i] : kpe[(size_t)t * dr + (i - dl)];
      double err = fabs((double)k[i] - want), tol;
      if (store == REF_MLA_STORE_EXACT)
        tol = MLA_LAT_TOL(M);
      else if (store == REF_MLA_STORE_F16) /* one step, plus the float error before rounding */
        tol = ref_f16_ulp(want) * 1.0001 + MLA_LAT_TOL(M);
      else
        tol = fabs(want) * ldexp(1.0, -7) + MLA_LAT_TOL(M); /* one bf16 step at most */
      if (!(err <= tol)) {
        bad++;
        KT_CHECK(err <= tol, "%s: layer %d slot %d value %d (%s): read %.9g, reference %.9g",
                 label, layer, t, i, i < dl ? "c_kv" : "k_pe", (double)k[i], want);
        break;
      }
    }
  }
  if (!bad) KT_CHECK(1, "latents");
  free(ckv);
  free(kpe);
  free(k);
}

/* ------------------------------------------------------------------------ */
/* One scenario: both paths chunk by chunk against the reference.           */

static void run_scenario(kt_rng *r, const mla_cfg *cfg, int bs, kva_dtype dt, const int *chunks,
                         int n_chunks, const char *label) {
  mla_model m;
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_mla_layer La, Ln;
  ref_mla_seq rs, ru, rx;
  int total = 0, i, sa = -1, sn = -1, dmod = cfg->d_model, maxc = 0, D = cfg->dl + cfg->dr;
  int store = store_of(dt);
  float *x, *ya, *yn, *row;
  double *yr, *yu, *ext_c, *ext_k;
  kva_status st;
  char lab[200];

  for (i = 0; i < n_chunks; i++) {
    total += chunks[i];
    if (chunks[i] > maxc) maxc = chunks[i];
  }
  model_build(r, cfg, &m);
  La = m.L;
  La.naive = 0;
  Ln = m.L;
  Ln.naive = 1;
  latent_desc(&d, cfg, 2, bs, 2 * ((total + bs - 1) / bs) + 2, dt);
  st = kva_cache_create(&d, &c);
  KT_CHECK(st == KVA_OK, "%s: kva_cache_create = %d", label, (int)st);
  if (st != KVA_OK) {
    model_free(&m);
    return;
  }
  KT_STATUS(kva_seq_new(c, &sa), KVA_OK);
  KT_STATUS(kva_seq_new(c, &sn), KVA_OK);
  ref_mla_seq_init(&rs, &m.L, store, total);
  ref_mla_seq_init(&ru, &m.L, REF_MLA_STORE_EXACT, total);
  ref_mla_seq_init(&rx, &m.L, REF_MLA_STORE_EXACT, total);
  ext_c = KT_ALLOC(double, (size_t)total * cfg->dl);
  ext_k = KT_ALLOC(double, (size_t)total * cfg->dr + 1);
  row = KT_ALLOC(float, D);
  rx.ext_ckv = ext_c;
  rx.ext_kpe = ext_k;
  x = KT_ALLOC(float, (size_t)maxc * dmod);
  ya = KT_ALLOC(float, (size_t)maxc * dmod + 4);
  yn = KT_ALLOC(float, (size_t)maxc * dmod + 4);
  yr = KT_ALLOC(double, (size_t)maxc * dmod);
  yu = KT_ALLOC(double, (size_t)maxc * dmod);

  for (i = 0; i < n_chunks; i++) {
    int n = chunks[i];
    size_t ny = (size_t)n * dmod;
    kt_fill(r, x, ny, -1.7f, 1.7f);
    kt_fill_sentinel(ya, ny + 4);
    kt_fill_sentinel(yn, ny + 4);
    KT_STATUS(kva_seq_append(c, sa, n), KVA_OK);
    KT_STATUS(kva_seq_append(c, sn, n), KVA_OK);
    st = kva_mla_forward(&La, c, sa, 1, x, n, ya);
    KT_CHECK(st == KVA_OK, "%s: absorbed forward chunk %d (n %d) returned %d", label, i, n, (int)st);
    if (st != KVA_OK) break;
    st = kva_mla_forward(&Ln, c, sn, 0, x, n, yn);
    KT_CHECK(st == KVA_OK, "%s: naive forward chunk %d (n %d) returned %d", label, i, n, (int)st);
    if (st != KVA_OK) break; /* one failure per scenario is enough */
    KT_CHECK(kt_all_sentinel(ya + ny, 4) && kt_all_sentinel(yn + ny, 4),
             "%s: forward wrote past y[n_tokens][d_model]", label);
    ref_mla_forward(&rs, x, n, yr);
    check_y(ya, yr, ny, tol_of(store), store, label, "absorbed", i);
    check_y(yn, yr, ny, tol_of(store), store, label, "naive", i);
    {
      double *yad = ref_dup_f(ya, ny);
      check_y(yn, yad, ny, MLA_TOL_F32, -1, label, "naive vs absorbed", i);
      free(yad);
    }
    if (store != REF_MLA_STORE_EXACT) { /* attention over the vectors the cache holds */
      int t, j, len = kva_seq_len(c, sa);
      for (t = 0; t < len; t++) {
        KT_STATUS(kva_seq_read(c, sa, 1, t, row, NULL, NULL), KVA_OK);
        for (j = 0; j < D; j++) {
          if (j < cfg->dl)
            ext_c[(size_t)t * cfg->dl + j] = (double)row[j];
          else
            ext_k[(size_t)t * cfg->dr + (j - cfg->dl)] = (double)row[j];
        }
      }
      rx.n_ext = len;
      ref_mla_forward(&rx, x, n, yu);
      check_y(ya, yu, ny, MLA_TOL_F32, 0, label, "absorbed over the stored latents", i);
      check_y(yn, yu, ny, MLA_TOL_F32, 0, label, "naive over the stored latents", i);
    }
    if (store == REF_MLA_STORE_F16) { /* the storage error itself, for the report */
      size_t w;
      double M;
      ref_mla_forward(&ru, x, n, yu);
      M = ref_max_abs_d(yu, ny);
      if (M > 1e-3 && ref_max_err(ya, yu, ny, &w) / M > mla_worst_f16_unrounded)
        mla_worst_f16_unrounded = ref_max_err(ya, yu, ny, &w) / M;
    }
  }
  if (i < n_chunks) goto done;
  KT_CHECK(kva_seq_pos(c, sa) == total, "%s: kva_seq_pos %d, expected %d", label, kva_seq_pos(c, sa),
           total);
  sprintf(lab, "%s (absorbed, layer 1)", label);
  check_latents(c, sa, 1, &rs, store, lab);
  sprintf(lab, "%s (naive, layer 0)", label);
  check_latents(c, sn, 0, &rs, store, lab);
done:
  kva_cache_destroy(c);
  ref_mla_seq_free(&rs);
  ref_mla_seq_free(&ru);
  ref_mla_seq_free(&rx);
  free(ext_c);
  free(ext_k);
  free(row);
  free(x);
  free(ya);
  free(yn);
  free(yr);
  free(yu);
  model_free(&m);
}

/* ------------------------------------------------------------------------ */
/* Fixed scenarios: DeepSeek-V2-Lite-like proportions scaled down, odd sizes */

static const int CH_PRE[] = {7, 5, 1, 1, 1};        /* prefill, second chunk, decode steps */
static const int CH_DEC[] = {1, 1, 1, 1, 1, 1, 1};  /* decode from an empty cache */
static const int CH_BLK[] = {16, 1, 1, 17, 1, 2};   /* fills and crosses 16-token blocks */
static const int CH_ODD[] = {4, 3, 1, 5, 1, 1};
static const int CH_LONG[] = {150, 37, 1, 1, 64, 1}; /* many attention tiles and blocks */
#define NCH(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void v2lite(mla_cfg *c) { cfg_init(c, 64, 4, 32, 16, 8, 16); }

static void test_mla_fixed(kt_rng *r) {
  mla_cfg c;

  kt_begin("mla: V2-Lite-like (d 64, H 4, latent 32, nope 16, rope 8, v 16), interleaved");
  v2lite(&c);
  run_scenario(r, &c, 16, KVA_F32, CH_PRE, NCH(CH_PRE), "v2lite bs16 pre");
  run_scenario(r, &c, 16, KVA_F32, CH_BLK, NCH(CH_BLK), "v2lite bs16 blocks");
  run_scenario(r, &c, 1, KVA_F32, CH_DEC, NCH(CH_DEC), "v2lite bs1 decode");
  c.q_gain = 3.0f;
  run_scenario(r, &c, 3, KVA_F32, CH_ODD, NCH(CH_ODD), "v2lite sharp bs3");
  if (!kt_quick) {
    c.bias = 1;
    run_scenario(r, &c, 16, KVA_F32, CH_LONG, NCH(CH_LONG), "v2lite long bs16");
    c.qr = 24;
    c.interleaved = 0;
    run_scenario(r, &c, 5, KVA_F16, CH_LONG, NCH(CH_LONG), "v2lite long qlora f16 bs5");
  }

  kt_begin("mla: biases (b_uk cancels, b_uv passes through)");
  v2lite(&c);
  c.bias = 1;
  c.q_gain = 2.5f;
  run_scenario(r, &c, 3, KVA_F32, CH_PRE, NCH(CH_PRE), "bias bs3 pre");
  run_scenario(r, &c, 1, KVA_F32, CH_ODD, NCH(CH_ODD), "bias bs1 odd");

  kt_begin("mla: query LoRA (q_lora_rank > 0), rotate-half");
  cfg_init(&c, 64, 8, 32, 16, 8, 16);
  c.qr = 24;
  c.bias = 1;
  c.interleaved = 0;
  c.q_gain = 2.0f;
  run_scenario(r, &c, 16, KVA_F32, CH_BLK, NCH(CH_BLK), "qlora bs16 blocks");
  run_scenario(r, &c, 3, KVA_F32, CH_PRE, NCH(CH_PRE), "qlora bs3 pre");
  c.interleaved = 1;
  run_scenario(r, &c, 1, KVA_F32, CH_PRE, NCH(CH_PRE), "qlora interleaved bs1");

  kt_begin("mla: odd sizes (d 48, H 5, latent 20, nope 12, rope 6, v 12)");
  cfg_init(&c, 48, 5, 20, 12, 6, 12);
  c.bias = 1;
  c.q_gain = 2.0f;
  run_scenario(r, &c, 3, KVA_F32, CH_ODD, NCH(CH_ODD), "odd bs3");
  c.interleaved = 0;
  run_scenario(r, &c, 1, KVA_F32, CH_PRE, NCH(CH_PRE), "odd rotate-half bs1");

  kt_begin("mla: partial rope dim, inv_freq table, explicit scale");
  v2lite(&c);
  c.rope_dim = 4;
  c.scale = 0.3f;
  c.q_gain = 2.0f;
  run_scenario(r, &c, 16, KVA_F32, CH_PRE, NCH(CH_PRE), "partial interleaved bs16");
  c.interleaved = 0;
  c.inv_freq = 1;
  run_scenario(r, &c, 3, KVA_F32, CH_ODD, NCH(CH_ODD), "partial rotate-half inv_freq bs3");
  c.rope_dim = 0;
  c.interleaved = 1;
  run_scenario(r, &c, 3, KVA_F32, CH_PRE, NCH(CH_PRE), "full inv_freq interleaved bs3");
  cfg_init(&c, 40, 3, 16, 8, 5, 8); /* odd d_rope: the first 4 values rotate, the 5th does not */
  c.rope_dim = 4;
  c.bias = 1;
  run_scenario(r, &c, 3, KVA_F32, CH_PRE, NCH(CH_PRE), "d_rope 5 rope.dim 4");

  kt_begin("mla: kv_norm off, explicit eps, default eps 1e-6");
  v2lite(&c);
  c.kv_norm = 0;
  c.bias = 1;
  run_scenario(r, &c, 3, KVA_F32, CH_PRE, NCH(CH_PRE), "no kv_norm");
  v2lite(&c);
  c.norm_eps = 0.5f; /* comparable to mean(c²): the eps matters */
  run_scenario(r, &c, 16, KVA_F32, CH_PRE, NCH(CH_PRE), "norm_eps 0.5");
  c.qr = 16; /* the same eps in the query LoRA's norm */
  run_scenario(r, &c, 3, KVA_F32, CH_ODD, NCH(CH_ODD), "norm_eps 0.5, q LoRA");
  v2lite(&c);
  c.dkv_gain = 1e-3f; /* mean(c²) ~ 1e-6: 1e-6 vs any other default is an O(1) change */
  c.qr = 16;          /* the q norm then sees normal magnitudes */
  run_scenario(r, &c, 3, KVA_F32, CH_ODD, NCH(CH_ODD), "tiny latents, default eps");

  kt_begin("mla: Llama-3 theta, rotate-half, q LoRA, explicit scale");
  cfg_init(&c, 56, 6, 24, 8, 8, 10);
  c.theta = 500000.0f;
  c.interleaved = 0;
  c.qr = 16;
  c.scale = 0.125f;
  c.q_gain = 3.0f;
  run_scenario(r, &c, 16, KVA_F32, CH_BLK, NCH(CH_BLK), "theta 5e5");

  kt_begin("mla: d_rope > 0 with RoPE off (theta 0)");
  v2lite(&c);
  c.theta = 0.0f;
  c.bias = 1;
  run_scenario(r, &c, 16, KVA_F32, CH_PRE, NCH(CH_PRE), "rope off");

  kt_begin("mla: d_rope 0, w_kr NULL (the simplified sketch of MLA)");
  cfg_init(&c, 64, 4, 32, 16, 0, 16);
  c.theta = 0.0f; /* nothing to rotate: the rope descriptor is empty too */
  c.bias = 1;
  c.q_gain = 2.0f;
  run_scenario(r, &c, 3, KVA_F32, CH_PRE, NCH(CH_PRE), "d_rope 0 kv_norm");
  c.kv_norm = 0;
  run_scenario(r, &c, 16, KVA_F32, CH_BLK, NCH(CH_BLK), "d_rope 0 plain");
  {
    /* d_rope 0 with a RoPE descriptor still set (theta 1e4): there is
       nothing to rotate (docs/API.md checks rope only when d_rope > 0).  Accept a rejection, but an accepted
       call must be the same function. */
    mla_model m;
    kva_cache_desc d;
    kva_cache *cc = NULL;
    int s = -1;
    float x[2 * 64], y[2 * 64];
    kva_status st;
    c.theta = 10000.0f;
    model_build(r, &c, &m);
    latent_desc(&d, &c, 1, 16, 4, KVA_F32);
    KT_STATUS(kva_cache_create(&d, &cc), KVA_OK);
    KT_STATUS(kva_seq_new(cc, &s), KVA_OK);
    KT_STATUS(kva_seq_append(cc, s, 2), KVA_OK);
    kt_fill(r, x, 2 * 64, -1.7f, 1.7f);
    st = kva_mla_forward(&m.L, cc, s, 0, x, 2, y);
    KT_CHECK(st == KVA_OK || st == KVA_ERR_ARG, "d_rope 0 with theta set: status %d", (int)st);
    rope_set_d0_status = (int)st;
    kva_cache_destroy(cc);
    model_free(&m);
    if (st == KVA_OK) run_scenario(r, &c, 3, KVA_F32, CH_PRE, NCH(CH_PRE), "d_rope 0, theta set");
  }

  kt_begin("mla: q LoRA with q_norm NULL (gain 1)");
  {
    mla_model m;
    kva_cache_desc d;
    kva_cache *cc = NULL;
    int s = -1;
    float x[2 * 64], y[2 * 64];
    kva_status st;
    v2lite(&c);
    c.qr = 12;
    c.q_norm_null = 1;
    model_build(r, &c, &m);
    latent_desc(&d, &c, 1, 16, 4, KVA_F32);
    KT_STATUS(kva_cache_create(&d, &cc), KVA_OK);
    KT_STATUS(kva_seq_new(cc, &s), KVA_OK);
    KT_STATUS(kva_seq_append(cc, s, 2), KVA_OK);
    kt_fill(r, x, 2 * 64, -1.7f, 1.7f);
    st = kva_mla_forward(&m.L, cc, s, 0, x, 2, y);
    /* q_norm is the gain; docs/API.md documents NULL as gain 1.  Accept a
       rejection, but an accepted NULL must mean gain 1. */
    KT_CHECK(st == KVA_OK || st == KVA_ERR_ARG, "q_norm NULL: status %d", (int)st);
    q_norm_null_status = (int)st;
    kva_cache_destroy(cc);
    model_free(&m);
    if (st == KVA_OK) run_scenario(r, &c, 3, KVA_F32, CH_PRE, NCH(CH_PRE), "q_norm NULL");
  }

  kt_begin("mla: F16 latent cache");
  v2lite(&c);
  c.bias = 1;
  c.q_gain = 2.0f;
  run_scenario(r, &c, 16, KVA_F16, CH_PRE, NCH(CH_PRE), "f16 v2lite bs16");
  run_scenario(r, &c, 16, KVA_DTYPE_DEFAULT, CH_BLK, NCH(CH_BLK), "default dtype (f16) bs16");
  cfg_init(&c, 64, 8, 32, 16, 8, 16);
  c.qr = 24;
  c.interleaved = 0;
  run_scenario(r, &c, 3, KVA_F16, CH_ODD, NCH(CH_ODD), "f16 qlora bs3");
  cfg_init(&c, 48, 5, 20, 12, 6, 12);
  c.bias = 1;
  run_scenario(r, &c, 1, KVA_F16, CH_PRE, NCH(CH_PRE), "f16 odd bs1");

  kt_begin("mla: BF16 latent cache");
  v2lite(&c);
  c.bias = 1;
  run_scenario(r, &c, 3, KVA_BF16, CH_PRE, NCH(CH_PRE), "bf16 v2lite bs3");
}

/* ------------------------------------------------------------------------ */
/* Random shapes                                                             */

static void test_mla_random(kt_rng *r, int n) {
  static const int drs[] = {0, 2, 4, 6, 8};
  static const int bss[] = {1, 2, 3, 5, 16};
  int it, i;
  kt_begin("mla: random shapes, schedules, blocks");
  for (it = 0; it < n; it++) {
    mla_cfg c;
    int chunks[6], nc = kt_int(r, 1, 6), bs = kt_pick(r, bss, 5);
    kva_dtype dt = kt_int(r, 0, 2) == 0 ? KVA_F16 : KVA_F32;
    char label[240];
    int dm = kt_int(r, 4, 48), H = kt_int(r, 1, 6), dl = kt_int(r, 2, 40), dn = kt_int(r, 1, 16);
    int dr = kt_pick(r, drs, 5), dv = kt_int(r, 1, 16); /* (argument order is unspecified) */
    cfg_init(&c, dm, H, dl, dn, dr, dv);
    c.qr = kt_int(r, 0, 1) ? kt_int(r, 2, 20) : 0;
    c.bias = kt_int(r, 0, 1);
    c.kv_norm = kt_int(r, 0, 1);
    c.interleaved = kt_int(r, 0, 1);
    c.rope_dim = (c.dr > 0 && kt_int(r, 0, 2) == 0) ? 2 * kt_int(r, 1, c.dr / 2) : 0;
    c.theta = kt_int(r, 0, 5) == 0 ? 0.0f : (kt_int(r, 0, 1) ? 10000.0f : 500.0f);
    if (c.dr == 0) c.theta = 0.0f; /* no rope part: an empty rope descriptor */
    c.scale = kt_int(r, 0, 2) == 0 ? kt_uniform(r, 0.1f, 0.5f) : 0.0f;
    c.q_gain = kt_uniform(r, 0.5f, 3.0f);
    for (i = 0; i < nc; i++) chunks[i] = kt_int(r, 0, 1) ? 1 : kt_int(r, 1, 9);
    sprintf(label,
            "random #%d: d %d H %d lat %d nope %d rope %d (dim %d, %s, theta %g) v %d qr %d bias %d "
            "norm %d scale %g bs %d %s",
            it, c.d_model, c.H, c.dl, c.dn, c.dr, c.rope_dim, c.interleaved ? "inter" : "half",
            (double)c.theta, c.dv, c.qr, c.bias, c.kv_norm, (double)c.scale, bs,
            dt == KVA_F16 ? "f16" : "f32");
    run_scenario(r, &c, bs, dt, chunks, nc, label);
  }
}

/* ------------------------------------------------------------------------ */
/* The simplified sketch: d_rope 0, no kv_norm, every nn.Linear with a bias,
   scale 1/sqrt(d_k) (the default 1/sqrt(d_nope + 0)).  Its k_rope (rope_dim
   4 here) is computed and cached by the transcription and never used.     */

static void test_mla_sketch(kt_rng *r) {
  enum { D = 32, H = 4, DK = 8, DL = 12, RD = 4, CAP = 16 };
  static const int steps[] = {5, 1, 1, 3, 1};
  ref_sketch_mla sc, sn; /* causal (the intended module) and the sketch as written */
  kva_mla_layer L;
  kva_cache_desc d;
  kva_cache *c = NULL;
  mla_cfg cfg;
  int sa = -1, sb = -1, i, pass;
  float x[5 * D], ya[5 * D], yb[5 * D];
  double yr[5 * D], ynm[5 * D];
  float *W_q = rand_w(r, H * DK, D, 2.0f), *b_q = rand_v(r, H * DK, -0.5f, 0.5f);
  float *W_dkv = rand_w(r, DL, D, 1.0f), *b_dkv = rand_v(r, DL, -0.5f, 0.5f);
  float *W_uk = rand_w(r, H * DK, DL, 1.0f), *b_uk = rand_v(r, H * DK, -0.5f, 0.5f);
  float *W_uv = rand_w(r, H * DK, DL, 1.0f), *b_uv = rand_v(r, H * DK, -0.5f, 0.5f);
  float *W_kr = rand_w(r, RD, D, 1.0f), *b_kr = rand_v(r, RD, -0.5f, 0.5f);
  float *W_o = rand_w(r, D, D, 1.0f), *b_o = rand_v(r, D, -0.5f, 0.5f);

  kt_begin("mla: the simplified sketch of MLA is d_rope 0");
  memset(&sc, 0, sizeof sc);
  sc.d_model = D;
  sc.n_heads = H;
  sc.d_k = DK;
  sc.d_latent = DL;
  sc.rope_dim = RD;
  sc.W_q = W_q;
  sc.b_q = b_q;
  sc.W_dkv = W_dkv;
  sc.b_dkv = b_dkv;
  sc.W_uk = W_uk;
  sc.b_uk = b_uk;
  sc.W_uv = W_uv;
  sc.b_uv = b_uv;
  sc.W_kr = W_kr;
  sc.b_kr = b_kr;
  sc.W_o = W_o;
  sc.b_o = b_o;
  sn = sc;
  ref_sketch_alloc(&sc, CAP);
  ref_sketch_alloc(&sn, CAP);

  memset(&L, 0, sizeof L);
  L.d_model = D;
  L.n_heads = H;
  L.d_latent = DL;
  L.d_nope = DK;
  L.d_rope = 0;
  L.d_v = DK;
  L.wq = W_q;
  L.bq = b_q;
  L.w_dkv = W_dkv;
  L.b_dkv = b_dkv;
  L.w_uk = W_uk;
  L.b_uk = b_uk;
  L.w_uv = W_uv;
  L.b_uv = b_uv;
  L.wo = W_o;
  L.bo = b_o;
  L.n_threads = 1;
  cfg_init(&cfg, D, H, DL, DK, 0, DK);
  latent_desc(&d, &cfg, 1, 3, 16, KVA_F32);
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  if (!c) return;
  KT_STATUS(kva_seq_new(c, &sa), KVA_OK);
  KT_STATUS(kva_seq_new(c, &sb), KVA_OK);
  for (i = 0; i < (int)(sizeof steps / sizeof steps[0]); i++) {
    int n = steps[i];
    size_t ny = (size_t)n * D;
    kt_fill(r, x, ny, -1.7f, 1.7f);
    KT_STATUS(kva_seq_append(c, sa, n), KVA_OK);
    KT_STATUS(kva_seq_append(c, sb, n), KVA_OK);
    L.naive = 0;
    KT_STATUS(kva_mla_forward(&L, c, sa, 0, x, n, ya), KVA_OK);
    L.naive = 1;
    KT_STATUS(kva_mla_forward(&L, c, sb, 0, x, n, yb), KVA_OK);
    ref_sketch_forward(&sc, x, n, 1, yr);
    ref_sketch_forward(&sn, x, n, 0, ynm);
    check_y(ya, yr, ny, MLA_TOL_F32, REF_MLA_STORE_EXACT, "sketch (causal)", "absorbed", i);
    check_y(yb, yr, ny, MLA_TOL_F32, REF_MLA_STORE_EXACT, "sketch (causal)", "naive", i);
    if (n == 1) { /* a decode step: the sketch's missing mask changes nothing */
      check_y(ya, ynm, ny, MLA_TOL_F32, REF_MLA_STORE_EXACT, "sketch as written", "absorbed", i);
    } else { /* a chunk: the sketch lets earlier tokens see later ones */
      double diff = 0.0, M = ref_max_abs_d(yr, ny);
      size_t k;
      for (k = 0; k < (size_t)(n - 1) * D; k++)
        if (fabs(yr[k] - ynm[k]) > diff) diff = fabs(yr[k] - ynm[k]);
      KT_CHECK(diff > 1e-2 * M, "sketch without mask should differ on a chunk (diff %.3g)", diff);
    }
  }
  /* the cache holds the sketch's raw c_kv (no norm, no rope part) */
  for (pass = 0; pass < sc.n; pass++) {
    float k[DL + 1];
    int32_t p = -1;
    size_t w;
    k[DL] = KT_SENTINEL;
    KT_STATUS(kva_seq_read(c, sa, 0, pass, k, NULL, &p), KVA_OK);
    KT_CHECK(p == pass && kt_f2u(k[DL]) == kt_f2u(KT_SENTINEL), "sketch slot %d: pos %d", pass, (int)p);
    KT_CHECK(ref_max_err(k, sc.c_kv + (size_t)pass * DL, DL, &w) <=
                 MLA_LAT_TOL(ref_max_abs_d(sc.c_kv + (size_t)pass * DL, DL)),
             "sketch slot %d: c_kv[%lu] = %.9g vs %.9g", pass, (unsigned long)w, (double)k[w],
             sc.c_kv[(size_t)pass * DL + w]);
  }
  kva_cache_destroy(c);
  ref_sketch_free(&sc);
  ref_sketch_free(&sn);
  free(W_q); free(b_q); free(W_dkv); free(b_dkv); free(W_uk); free(b_uk);
  free(W_uv); free(b_uv); free(W_kr); free(b_kr); free(W_o); free(b_o);
}

/* ------------------------------------------------------------------------ */
/* Position information: with d_rope 0 the output of the newest token does
   not depend on the order of the earlier tokens; with RoPE it does.        */

static void order_case(kt_rng *r, int dr, const char *label) {
  enum { N = 6, D = 32 };
  static const int perm[N - 1] = {3, 1, 4, 0, 2};
  mla_cfg cfg;
  mla_model m;
  kva_cache_desc d;
  kva_cache *c = NULL;
  int sa = -1, sb = -1, t, path;
  float x[N * D], xp[N * D], ya[N * D], yb[N * D];
  cfg_init(&cfg, D, 4, 16, 8, dr, 8);
  if (dr == 0) cfg.theta = 0.0f;
  cfg.bias = 1;
  cfg.q_gain = 3.0f;
  model_build(r, &cfg, &m);
  kt_fill(r, x, (size_t)N * D, -1.7f, 1.7f);
  for (t = 0; t < N - 1; t++) memcpy(xp + (size_t)t * D, x + (size_t)perm[t] * D, sizeof(float) * D);
  memcpy(xp + (size_t)(N - 1) * D, x + (size_t)(N - 1) * D, sizeof(float) * D);
  latent_desc(&d, &cfg, 1, 4, 8, KVA_F32);
  for (path = 0; path < 2; path++) {
    double diff = 0.0, M;
    m.L.naive = path;
    KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
    if (!c) break;
    KT_STATUS(kva_seq_new(c, &sa), KVA_OK);
    KT_STATUS(kva_seq_new(c, &sb), KVA_OK);
    /* prefill the first N-1 tokens in one chunk, then decode the last */
    KT_STATUS(kva_seq_append(c, sa, N - 1), KVA_OK);
    KT_STATUS(kva_mla_forward(&m.L, c, sa, 0, x, N - 1, ya), KVA_OK);
    KT_STATUS(kva_seq_append(c, sb, N - 1), KVA_OK);
    KT_STATUS(kva_mla_forward(&m.L, c, sb, 0, xp, N - 1, yb), KVA_OK);
    KT_STATUS(kva_seq_append(c, sa, 1), KVA_OK);
    KT_STATUS(kva_mla_forward(&m.L, c, sa, 0, x + (size_t)(N - 1) * D, 1, ya), KVA_OK);
    KT_STATUS(kva_seq_append(c, sb, 1), KVA_OK);
    KT_STATUS(kva_mla_forward(&m.L, c, sb, 0, xp + (size_t)(N - 1) * D, 1, yb), KVA_OK);
    M = ref_max_abs_f(ya, D);
    { /* (a loop of fmax here crashes aarch64-linux-gnu-gcc 12.2 -O2: vect_transform_reduction) */
      double *yad = ref_dup_f(ya, D);
      diff = ref_max_err(yb, yad, D, NULL);
      free(yad);
    }
    if (dr == 0)
      KT_CHECK(diff <= MLA_TOL_F32 * M, "%s (naive %d): permuting earlier tokens changed the "
               "newest output by %.3g (M %.3g)", label, path, diff, M);
    else
      KT_CHECK(diff > 1e-3 * M, "%s (naive %d): permuting earlier tokens changed the newest "
               "output by only %.3g (M %.3g): no position information?", label, path, diff, M);
    kva_cache_destroy(c);
    c = NULL;
  }
  model_free(&m);
}

static void test_mla_order(kt_rng *r) {
  kt_begin("mla: d_rope 0 has no position information");
  order_case(r, 0, "d_rope 0");
  kt_begin("mla: decoupled RoPE carries position");
  order_case(r, 8, "d_rope 8");
}

/* ------------------------------------------------------------------------ */
/* Fork (copy-on-write of a shared, partly filled latent block) and truncate */

static void test_mla_fork(kt_rng *r) {
  enum { D = 64 };
  mla_cfg cfg;
  mla_model m;
  kva_cache_desc d;
  kva_cache *c = NULL;
  ref_mla_seq ra, rb;
  int a = -1, b = -1, step;
  float x[7 * D], y[7 * D];
  double yr[7 * D];
  kt_begin("mla: fork (copy-on-write) and truncate");
  v2lite(&cfg);
  cfg.bias = 1;
  cfg.q_gain = 2.5f;
  model_build(r, &cfg, &m);
  latent_desc(&d, &cfg, 1, 3, 16, KVA_F32);
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  if (!c) {
    model_free(&m);
    return;
  }
  ref_mla_seq_init(&ra, &m.L, REF_MLA_STORE_EXACT, 32);
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  kt_fill(r, x, 7 * D, -1.7f, 1.7f);
  KT_STATUS(kva_seq_append(c, a, 7), KVA_OK); /* 2 full blocks and 1 token of the third */
  KT_STATUS(kva_mla_forward(&m.L, c, a, 0, x, 7, y), KVA_OK);
  ref_mla_forward(&ra, x, 7, yr);
  check_y(y, yr, 7 * D, MLA_TOL_F32, REF_MLA_STORE_EXACT, "fork", "prefill", 0);
  KT_STATUS(kva_seq_fork(c, a, &b), KVA_OK);
  ref_mla_seq_copy(&rb, &ra);
  for (step = 0; step < 4; step++) { /* different tokens on each branch */
    m.L.naive = step & 1;
    kt_fill(r, x, D, -1.7f, 1.7f);
    KT_STATUS(kva_seq_append(c, a, 1), KVA_OK);
    KT_STATUS(kva_mla_forward(&m.L, c, a, 0, x, 1, y), KVA_OK);
    ref_mla_forward(&ra, x, 1, yr);
    check_y(y, yr, D, MLA_TOL_F32, REF_MLA_STORE_EXACT, "fork parent", "decode", step);
    kt_fill(r, x, D, -1.7f, 1.7f);
    KT_STATUS(kva_seq_append(c, b, 1), KVA_OK);
    KT_STATUS(kva_mla_forward(&m.L, c, b, 0, x, 1, y), KVA_OK);
    ref_mla_forward(&rb, x, 1, yr);
    check_y(y, yr, D, MLA_TOL_F32, REF_MLA_STORE_EXACT, "fork child", "decode", step);
  }
  check_latents(c, a, 0, &ra, REF_MLA_STORE_EXACT, "fork parent");
  check_latents(c, b, 0, &rb, REF_MLA_STORE_EXACT, "fork child");
  /* speculative rollback: keep 8 of 11 and decode a different continuation */
  KT_STATUS(kva_seq_truncate(c, a, 8), KVA_OK);
  ra.n = 8;
  kt_fill(r, x, 2 * D, -1.7f, 1.7f);
  KT_STATUS(kva_seq_append(c, a, 2), KVA_OK);
  m.L.naive = 0;
  KT_STATUS(kva_mla_forward(&m.L, c, a, 0, x, 2, y), KVA_OK);
  ref_mla_forward(&ra, x, 2, yr);
  check_y(y, yr, 2 * D, MLA_TOL_F32, REF_MLA_STORE_EXACT, "truncate", "chunk after rollback", 0);
  check_latents(c, a, 0, &ra, REF_MLA_STORE_EXACT, "truncated parent");
  check_latents(c, b, 0, &rb, REF_MLA_STORE_EXACT, "fork child after parent's truncate");
  kva_cache_destroy(c);
  ref_mla_seq_free(&ra);
  ref_mla_seq_free(&rb);
  model_free(&m);
}

/* ------------------------------------------------------------------------ */
/* INT8 / FP8 latent storage.
 *  - FP8 (E4M3 scale 1/16, E5M2 scale 1/4: powers of two, so x / scale and
 *    x · (1/scale) are the same number): the reference stores
 *    fp8(v / scale) · scale with its own OCP rounding, so both sides attend
 *    over the same numbers unless the library's float and the reference's
 *    double fall on two sides of a rounding midpoint (~1e-6 per value, one
 *    fp8 step).  Latents: equal or one fp8 step apart.  Outputs: 5e-3 M,
 *    which covers one such step (a 6-12 % change of one latent value moves
 *    one token's scores by ~1e-2); measured 2-5e-7 M, and 2.9e-4 M for the
 *    one flip seen in 400 seeds.
 *  - INT8 (symmetric, the scale is the library's; docs/API.md: one per token
 *    per KV head, for a latent cache one per whole latent row): against the unquantized reference, each value
 *    within amax/254 of its vector; outputs within 6e-2 M (measured: median
 *    1e-2 M, worst 2.4e-2 M over 400 seeds).
 *  - Both paths read the same stored numbers: they agree to the F32 bound. */

static double mla_worst_quant[3], mla_worst_fp8_unemulated[2];
static int fp8_kscale_only_status = -1;

static void quant_case(kt_rng *r, kva_dtype dt, float k_scale, const char *label) {
  enum { D = 64 };
  static const int chunks[] = {7, 5, 1, 1, 1, 9, 1};
  mla_cfg cfg;
  mla_model m;
  kva_mla_layer La, Ln;
  kva_cache_desc d;
  kva_cache *c = NULL;
  ref_mla_seq rs, ru, rx;
  double ext_c[40 * 32], ext_k[40 * 8];
  int a = -1, b = -1, i, t, total = 0, qi = dt == KVA_INT8 ? 0 : dt == KVA_FP8_E4M3 ? 1 : 2;
  int store = dt == KVA_INT8 ? REF_MLA_STORE_EXACT
                             : dt == KVA_FP8_E4M3 ? REF_MLA_STORE_E4M3 : REF_MLA_STORE_E5M2;
  double out_tol = dt == KVA_INT8 ? 6e-2 : 5e-3;
  float x[9 * D], ya[9 * D], yb[9 * D], k[41];
  double yr[9 * D], ckv[40 * 32], kpe[40 * 8];
  kva_status st;
  v2lite(&cfg);
  cfg.bias = 1;
  cfg.q_gain = 2.0f;
  model_build(r, &cfg, &m);
  La = m.L;
  La.naive = 0;
  Ln = m.L;
  Ln.naive = 1;
  latent_desc(&d, &cfg, 1, 3, 40, dt);
  d.k_scale = k_scale; /* the latent cache has one vector (header: "LATENT uses k_scale") */
  st = kva_cache_create(&d, &c);
  if (dt != KVA_INT8) {
    /* docs/API.md: a latent FP8 cache uses k_scale only; still accept either */
    KT_CHECK(st == KVA_OK || st == KVA_ERR_ARG, "%s: create with k_scale only = %d", label, (int)st);
    fp8_kscale_only_status = (int)st;
  }
  if (st != KVA_OK) {
    d.v_scale = k_scale;
    st = kva_cache_create(&d, &c);
    KT_STATUS(st, KVA_OK);
    if (st != KVA_OK) {
      model_free(&m);
      return;
    }
  }
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_new(c, &b), KVA_OK);
  ref_mla_seq_init(&rs, &m.L, store, 40);
  rs.store_scale = (double)k_scale;
  ref_mla_seq_init(&ru, &m.L, REF_MLA_STORE_EXACT, 40);
  ref_mla_seq_init(&rx, &m.L, REF_MLA_STORE_EXACT, 40);
  rx.ext_ckv = ext_c;
  rx.ext_kpe = ext_k;
  for (i = 0; i < NCH(chunks); i++) {
    int n = chunks[i];
    size_t ny = (size_t)n * D, w;
    double M, err;
    double *yad;
    total += n;
    kt_fill(r, x, ny, -1.7f, 1.7f);
    KT_STATUS(kva_seq_append(c, a, n), KVA_OK);
    KT_STATUS(kva_seq_append(c, b, n), KVA_OK);
    KT_STATUS(kva_mla_forward(&La, c, a, 0, x, n, ya), KVA_OK);
    KT_STATUS(kva_mla_forward(&Ln, c, b, 0, x, n, yb), KVA_OK);
    yad = ref_dup_f(ya, ny);
    check_y(yb, yad, ny, MLA_TOL_F32, -1, label, "naive vs absorbed", i);
    free(yad);
    ref_mla_forward(&rs, x, n, yr);
    M = ref_max_abs_d(yr, ny);
    err = ref_max_err(ya, yr, ny, &w);
    if (M > 1e-3 && err / M > mla_worst_quant[qi]) mla_worst_quant[qi] = err / M;
    KT_CHECK(err <= out_tol * M, "%s: chunk %d: y[%lu] = %.6g vs ref %.6g (err %.3g M > %.0e M)",
             label, i, (unsigned long)w, (double)ya[w], yr[w], err / M, out_tol);
    { /* tight: the attention over the vectors the cache holds */
      int j;
      for (t = 0; t < total; t++) {
        KT_STATUS(kva_seq_read(c, a, 0, t, k, NULL, NULL), KVA_OK);
        for (j = 0; j < 40; j++) {
          if (j < 32)
            ext_c[t * 32 + j] = (double)k[j];
          else
            ext_k[t * 8 + j - 32] = (double)k[j];
        }
      }
      rx.n_ext = total;
      ref_mla_forward(&rx, x, n, yr);
      check_y(ya, yr, ny, MLA_TOL_F32, 0, label, "absorbed over the stored latents", i);
      check_y(yb, yr, ny, MLA_TOL_F32, 0, label, "naive over the stored latents", i);
    }
    if (qi > 0) { /* for the report: the FP8 storage error itself */
      ref_mla_forward(&ru, x, n, yr);
      M = ref_max_abs_d(yr, ny);
      err = ref_max_err(ya, yr, ny, &w);
      if (M > 1e-3 && err / M > mla_worst_fp8_unemulated[qi - 1])
        mla_worst_fp8_unemulated[qi - 1] = err / M;
    }
  }
  ref_mla_seq_latents(&rs, ckv, kpe);
  for (t = 0; t < total; t++) {
    double amax = 0.0;
    int j, bad = -1;
    KT_STATUS(kva_seq_read(c, a, 0, t, k, NULL, NULL), KVA_OK);
    for (j = 0; j < 40; j++) {
      double v = j < 32 ? ckv[t * 32 + j] : kpe[t * 8 + j - 32];
      if (fabs(v) > amax) amax = fabs(v);
    }
    for (j = 0; j < 40 && bad < 0; j++) {
      double v = j < 32 ? ckv[t * 32 + j] : kpe[t * 8 + j - 32], e = fabs((double)k[j] - v), bound;
      if (dt == KVA_INT8) {
        bound = amax / 254.0 * 1.01 + 1e-7;
      } else { /* one fp8 step at v (v is already on the grid) */
        int mb = dt == KVA_FP8_E4M3 ? 3 : 2, emin = dt == KVA_FP8_E4M3 ? -6 : -14, e2;
        (void)frexp(fabs(v) / k_scale + 1e-300, &e2);
        e2 -= 1;
        if (e2 < emin) e2 = emin;
        bound = ldexp(1.0, e2 - mb) * k_scale * 1.0001;
      }
      if (!(e <= bound)) bad = j;
    }
    KT_CHECK(bad < 0, "%s: slot %d value %d: read %.6g vs %.6g, beyond the storage bound", label, t,
             bad, bad >= 0 ? (double)k[bad] : 0.0,
             bad >= 0 ? (bad < 32 ? ckv[t * 32 + bad] : kpe[t * 8 + bad - 32]) : 0.0);
  }
  kva_cache_destroy(c);
  ref_mla_seq_free(&rs);
  ref_mla_seq_free(&ru);
  ref_mla_seq_free(&rx);
  model_free(&m);
}

static void test_mla_quant(kt_rng *r) {
  kt_begin("mla: INT8 latent cache");
  quant_case(r, KVA_INT8, 0.0f, "int8 latent");
  kt_begin("mla: FP8 E4M3 latent cache");
  quant_case(r, KVA_FP8_E4M3, 0.0625f, "e4m3 latent (scale 1/16)");
  kt_begin("mla: FP8 E5M2 latent cache");
  quant_case(r, KVA_FP8_E5M2, 0.25f, "e5m2 latent (scale 1/4)");
}

/* ------------------------------------------------------------------------ */
/* Eviction on a latent cache: both paths attend over exactly the tokens the
   cache holds, at their absolute positions, and agree on what to evict.     */

/* held[pos] = 1 for every position (seq, layer) holds; returns the count */
static int held_set(kva_cache *c, int seq, int layer, unsigned char *held, int cap) {
  int n = kva_seq_len(c, seq), slot, cnt = 0;
  memset(held, 0, (size_t)cap);
  for (slot = 0; slot < n; slot++) {
    int32_t p = -1;
    if (kva_seq_read(c, seq, layer, slot, NULL, NULL, &p) == KVA_OK && p >= 0 && p < cap) {
      if (!held[p]) cnt++;
      held[p] = 1;
    }
  }
  return cnt;
}

static void evict_case(kt_rng *r, const kva_evict *ev, const char *label) {
  enum { D = 64, CAP = 40 };
  static const int chunks[] = {6, 1, 1, 1, 1, 1, 1, 1, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  mla_cfg cfg;
  mla_model m;
  kva_mla_layer La, Ln;
  kva_cache_desc d;
  kva_cache *c = NULL;
  ref_mla_seq ra, rb;
  unsigned char ha[CAP], hb[CAP];
  float x[6 * D], ya[6 * D], yb[6 * D];
  double yr[6 * D];
  int a = -1, b = -1, i, total = 0, same_sets = 1;
  char what[160];
  v2lite(&cfg);
  cfg.bias = 1;
  cfg.q_gain = 2.5f;
  model_build(r, &cfg, &m);
  La = m.L;
  La.naive = 0;
  Ln = m.L;
  Ln.naive = 1;
  latent_desc(&d, &cfg, 1, 4, 32, KVA_F32);
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  if (!c) {
    model_free(&m);
    return;
  }
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_new(c, &b), KVA_OK);
  KT_STATUS(kva_seq_set_evict(c, a, ev), KVA_OK);
  KT_STATUS(kva_seq_set_evict(c, b, ev), KVA_OK);
  ref_mla_seq_init(&ra, &m.L, REF_MLA_STORE_EXACT, CAP);
  ref_mla_seq_init(&rb, &m.L, REF_MLA_STORE_EXACT, CAP);
  for (i = 0; i < NCH(chunks); i++) {
    int n = chunks[i], na, nb, p;
    kva_status st;
    total += n;
    kt_fill(r, x, (size_t)n * D, -1.7f, 1.7f);
    KT_STATUS(kva_seq_append(c, a, n), KVA_OK);
    KT_STATUS(kva_seq_append(c, b, n), KVA_OK);
    st = kva_mla_forward(&La, c, a, 0, x, n, ya);
    KT_CHECK(st == KVA_OK, "%s: absorbed forward step %d returned %d", label, i, (int)st);
    st = kva_mla_forward(&Ln, c, b, 0, x, n, yb);
    KT_CHECK(st == KVA_OK, "%s: naive forward step %d returned %d", label, i, (int)st);
    na = held_set(c, a, 0, ha, CAP);
    nb = held_set(c, b, 0, hb, CAP);
    KT_CHECK(na == kva_seq_len(c, a) && nb == kva_seq_len(c, b),
             "%s: step %d: slots hold duplicate or out-of-range positions", label, i);
    for (p = total - n; p < total; p++)
      KT_CHECK(ha[p] && hb[p], "%s: step %d: the newest token (position %d) is not held", label, i,
               p);
    if (ev->kind == KVA_EVICT_WINDOW) { /* the first n_sink and the newest budget - n_sink */
      int want = total < ev->budget ? total : ev->budget, ok = na == want;
      for (p = 0; p < total; p++)
        ok &= ha[p] == (p < ev->n_sink || p >= total - (want - ev->n_sink));
      KT_CHECK(ok, "%s: step %d: window keeps %d tokens, not sinks + newest %d", label, i, na,
               want - ev->n_sink);
    }
    if (memcmp(ha, hb, CAP) != 0 && same_sets) {
      same_sets = 0;
      KT_CHECK(0, "%s: step %d: absorbed and naive sequences hold different tokens (%d vs %d "
               "held): the two paths evict differently", label, i, na, nb);
    }
    ref_mla_forward_masked(&ra, x, n, ha, yr);
    sprintf(what, "absorbed (held %d of %d)", na, total);
    check_y(ya, yr, (size_t)n * D, MLA_TOL_F32, REF_MLA_STORE_EXACT, label, what, i);
    ref_mla_forward_masked(&rb, x, n, hb, yr);
    sprintf(what, "naive (held %d of %d)", nb, total);
    check_y(yb, yr, (size_t)n * D, MLA_TOL_F32, REF_MLA_STORE_EXACT, label, what, i);
  }
  kva_cache_destroy(c);
  ref_mla_seq_free(&ra);
  ref_mla_seq_free(&rb);
  model_free(&m);
}

static void test_mla_evict(kt_rng *r) {
  kva_evict e;
  kt_begin("mla: sliding-window eviction on a latent cache");
  memset(&e, 0, sizeof e);
  e.kind = KVA_EVICT_WINDOW;
  e.budget = 8;
  e.n_sink = 2;
  evict_case(r, &e, "window 8, 2 sinks");
  kt_begin("mla: H2O eviction on a latent cache");
  e.kind = KVA_EVICT_H2O;
  e.budget = 9;
  e.n_sink = 1;
  e.n_recent = 3;
  evict_case(r, &e, "H2O 9, 1 sink, 3 recent");
}

/* ------------------------------------------------------------------------ */
/* Prefix caching: a sequence that reuses published latent blocks computes
   the same outputs as one that computed them.                               */

static void test_mla_prefix(kt_rng *r) {
  enum { D = 64, N0 = 10, N1 = 13 };
  mla_cfg cfg;
  mla_model m;
  kva_cache_desc d;
  kva_cache *c = NULL;
  ref_mla_seq rs;
  int32_t tok[N1];
  float x[N1 * D], y[N1 * D];
  double yr[N1 * D];
  int a = -1, p = -1, reused = -1, i, path;
  kt_begin("mla: prefix caching over latent blocks");
  v2lite(&cfg);
  cfg.bias = 1;
  cfg.q_gain = 2.0f;
  model_build(r, &cfg, &m);
  latent_desc(&d, &cfg, 1, 4, 32, KVA_F16);
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  if (!c) {
    model_free(&m);
    return;
  }
  for (i = 0; i < N1; i++) tok[i] = 1000 + 7 * i;
  kt_fill(r, x, (size_t)N1 * D, -1.7f, 1.7f);
  ref_mla_seq_init(&rs, &m.L, REF_MLA_STORE_F16, N1);
  ref_mla_forward(&rs, x, N1, yr); /* the whole prompt, computed from scratch */
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_append(c, a, N0), KVA_OK);
  KT_STATUS(kva_mla_forward(&m.L, c, a, 0, x, N0, y), KVA_OK);
  check_y(y, yr, (size_t)N0 * D, MLA_TOL_F16, REF_MLA_STORE_F16, "prefix", "first prompt", 0);
  KT_STATUS(kva_seq_publish(c, a, tok, N0, 77), KVA_OK);
  for (path = 0; path < 2; path++) {
    m.L.naive = path;
    KT_STATUS(kva_seq_new_prefix(c, tok, N1, 77, &p, &reused), KVA_OK);
    KT_CHECK(reused == 8, "prefix: %d tokens reused, expected the 2 full blocks (8)", reused);
    if (reused < 0 || reused > N1 - 1) break;
    KT_STATUS(kva_seq_append(c, p, N1 - reused), KVA_OK);
    KT_STATUS(kva_mla_forward(&m.L, c, p, 0, x + (size_t)reused * D, N1 - reused, y), KVA_OK);
    check_y(y, yr + (size_t)reused * D, (size_t)(N1 - reused) * D, MLA_TOL_F16, REF_MLA_STORE_F16,
            "prefix", path ? "reusing sequence (naive)" : "reusing sequence (absorbed)", 1);
    check_latents(c, p, 0, &rs, REF_MLA_STORE_F16, "prefix-reusing sequence");
    KT_STATUS(kva_seq_free(c, p), KVA_OK);
  }
  KT_STATUS(kva_seq_new_prefix(c, tok, N1, 78, &p, &reused), KVA_OK);
  KT_CHECK(reused == 0, "prefix: another salt reused %d tokens", reused);
  kva_cache_destroy(c);
  ref_mla_seq_free(&rs);
  model_free(&m);
}

/* ------------------------------------------------------------------------ */
/* Memory per token                                                          */

static size_t bpt(kva_cache_kind kind, int layers, int G, int D, int Dv, kva_dtype dt) {
  kva_cache_desc d;
  memset(&d, 0, sizeof d);
  d.kind = kind;
  d.n_layers = layers;
  d.n_kv_heads = G;
  d.head_dim = D;
  d.v_dim = Dv;
  d.dtype = dt;
  d.n_blocks = 4;
  return kva_cache_bytes_per_token(&d);
}

static void test_mla_bytes(void) {
  size_t v2, v3, one, mha;
  kt_begin("mla: kva_cache_bytes_per_token for DeepSeek-V2/V3 latent caches");
  v2 = bpt(KVA_CACHE_LATENT, 60, 1, 576, 512, KVA_F16);
  v3 = bpt(KVA_CACHE_LATENT, 61, 1, 576, 512, KVA_F16);
  one = bpt(KVA_CACHE_LATENT, 1, 1, 576, 512, KVA_F16);
  KT_CHECK(v2 == 69120, "DeepSeek-V2 (60 layers, 512 + 64 latent values; DeepSeek-V2 paper): %lu bytes per token, expected 69,120",
           (unsigned long)v2);
  KT_CHECK(v3 == 70272, "DeepSeek-V3 (61 layers; DeepSeek-V3 report): %lu bytes per token, expected 70,272",
           (unsigned long)v3);
  KT_CHECK(one == 1152, "one layer: %lu bytes (576 F16 values = 1152)", (unsigned long)one);
  KT_CHECK(bpt(KVA_CACHE_LATENT, 1, 1, 576, 512, KVA_DTYPE_DEFAULT) == 1152, "DEFAULT dtype");
  KT_CHECK(bpt(KVA_CACHE_LATENT, 1, 1, 576, 512, KVA_BF16) == 1152, "BF16 latent");
  KT_CHECK(bpt(KVA_CACHE_LATENT, 1, 1, 576, 512, KVA_F32) == 2304, "F32 latent");
  KT_CHECK(bpt(KVA_CACHE_LATENT, 2, 1, 52, 40, KVA_F32) == 2 * 52 * 4, "latent stores V once");
  /* MHA with the same heads: 2 x 128 x 128 values per layer */
  mha = bpt(KVA_CACHE_KV, 1, 128, 128, 0, KVA_F16);
  KT_CHECK(mha == 65536, "MHA 128 heads x 128: %lu bytes per token per layer", (unsigned long)mha);
  KT_CHECK(one * 56 < mha && mha < one * 57, "ratio %.2f, expected 32768 / 576 = 56.9x",
           (double)mha / (double)one);
  KT_CHECK(bpt(KVA_CACHE_LATENT, 1, 1, 576, 577, KVA_F16) == 0, "latent v_dim > head_dim is invalid");
  {
    kva_cache_desc d;
    kva_cache *c = NULL;
    kva_cache_stats s;
    memset(&d, 0, sizeof d);
    d.kind = KVA_CACHE_LATENT;
    d.n_layers = 3;
    d.n_kv_heads = 1;
    d.head_dim = 576;
    d.v_dim = 512;
    d.n_blocks = 5;
    KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
    if (c) {
      kva_cache_get_stats(c, &s);
      KT_CHECK(s.block_bytes == (size_t)16 * 3 * 1152,
               "latent pool: block_bytes %lu, expected 16 tokens x 3 layers x 1152",
               (unsigned long)s.block_bytes);
      KT_CHECK(s.bytes_total == 5 * s.block_bytes, "bytes_total %lu", (unsigned long)s.bytes_total);
      kva_cache_destroy(c);
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Bad arguments: nothing changes, ARG before SEQ                            */

typedef struct {
  kva_cache *c;
  int seq;
  float *x, *y;
  int n;
} arg_env;

/* Calls forward, expects `want` (or any failure if want < 0), checks y and
   the two appended slots are untouched. */
static void expect_fail(const kva_mla_layer *L, arg_env *e, kva_cache *c, int seq, int layer,
                        int n, int want, const char *what) {
  kva_status st;
  float k[64];
  int slot, ok = 1;
  kt_fill_sentinel(e->y, (size_t)4 * 64);
  st = kva_mla_forward(L, c, seq, layer, e->x, n, e->y);
  if (want >= 0)
    KT_CHECK((int)st == want, "%s: returned %d, expected %d", what, (int)st, want);
  else
    KT_CHECK(st != KVA_OK, "%s: returned KVA_OK", what);
  KT_CHECK(kt_all_sentinel(e->y, (size_t)4 * 64), "%s: y changed on failure", what);
  for (slot = 0; slot < 2; slot++) {
    int i;
    memset(k, 0x55, sizeof k);
    if (kva_seq_read(e->c, e->seq, 0, slot, k, NULL, NULL) != KVA_OK) ok = 0;
    for (i = 0; i < 40; i++)
      if (k[i] != 0.0f) ok = 0;
  }
  KT_CHECK(ok, "%s: the cache changed on failure (slots appended, never stored, read as zeros)",
           what);
}

static void test_mla_args(kt_rng *r) {
  mla_cfg cfg;
  mla_model m;
  kva_mla_layer L;
  kva_cache_desc d;
  kva_cache *c = NULL, *bad = NULL;
  arg_env e;
  int fresh = -1, freed = -1, s3 = -1;
  float x[4 * 64], y[4 * 64];
  kt_begin("mla: bad arguments");
  memset(&e, 0, sizeof e);
  e.seq = -1;
  cfg_init(&cfg, 64, 4, 32, 16, 8, 16); /* latent vector 40 */
  cfg.qr = 0;
  model_build(r, &cfg, &m);
  latent_desc(&d, &cfg, 2, 4, 16, KVA_F32);
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  if (!c) {
    model_free(&m);
    return;
  }
  kt_fill(r, x, 4 * 64, -1.7f, 1.7f);
  e.c = c;
  e.x = x;
  e.y = y;
  KT_STATUS(kva_seq_new(c, &e.seq), KVA_OK);
  KT_STATUS(kva_seq_append(c, e.seq, 2), KVA_OK);

  /* mismatched caches */
  latent_desc(&d, &cfg, 2, 4, 16, KVA_F32);
  d.kind = KVA_CACHE_KV;
  if (kva_cache_create(&d, &bad) == KVA_OK) {
    int s = -1;
    kva_seq_new(bad, &s);
    kva_seq_append(bad, s, 2);
    expect_fail(&m.L, &e, bad, s, 0, 2, KVA_ERR_ARG, "KV cache (not latent)");
    kva_cache_destroy(bad);
    bad = NULL;
  }
  {
    static const int hd[] = {42, 32, 40, 40, 40};
    static const int vd[] = {32, 32, 30, 0, 40};
    static const int G[] = {1, 1, 1, 1, 2};
    static const char *what[] = {"head_dim d_latent+d_rope+2", "head_dim d_latent", "v_dim d_latent-2",
                                 "v_dim 0 (=> head_dim)", "n_kv_heads 2"};
    int i;
    for (i = 0; i < 5; i++) {
      latent_desc(&d, &cfg, 2, 4, 16, KVA_F32);
      d.head_dim = hd[i];
      d.v_dim = vd[i];
      d.n_kv_heads = G[i];
      if (kva_cache_create(&d, &bad) == KVA_OK) {
        int s = -1;
        kva_seq_new(bad, &s);
        kva_seq_append(bad, s, 2);
        expect_fail(&m.L, &e, bad, s, 0, 2, KVA_ERR_ARG, what[i]);
        kva_cache_destroy(bad);
        bad = NULL;
      }
    }
  }

  /* NULL required pointers */
#define BAD_FIELD(field, val, what)                               \
  do {                                                            \
    L = m.L;                                                      \
    L.field = val;                                                \
    expect_fail(&L, &e, c, e.seq, 0, 2, KVA_ERR_ARG, what);       \
    L.naive = 1;                                                  \
    expect_fail(&L, &e, c, e.seq, 0, 2, KVA_ERR_ARG, what " (naive)"); \
  } while (0)
  BAD_FIELD(w_dkv, NULL, "w_dkv NULL");
  BAD_FIELD(w_uk, NULL, "w_uk NULL");
  BAD_FIELD(w_uv, NULL, "w_uv NULL");
  BAD_FIELD(wo, NULL, "wo NULL");
  BAD_FIELD(wq, NULL, "wq NULL with q_lora_rank 0");
  BAD_FIELD(w_kr, NULL, "w_kr NULL with d_rope 8");
  BAD_FIELD(n_heads, 0, "n_heads 0");
  BAD_FIELD(d_model, 0, "d_model 0");
  BAD_FIELD(d_latent, 0, "d_latent 0");
  BAD_FIELD(d_v, 0, "d_v 0");
  BAD_FIELD(d_rope, -2, "d_rope -2");
  BAD_FIELD(q_lora_rank, -1, "q_lora_rank -1");
  BAD_FIELD(int_scores, 2, "int_scores 2");
  BAD_FIELD(int_scores, -1, "int_scores -1");
  {
    float *wa = rand_w(r, 8, 64, 1.0f), *wb = rand_w(r, 4 * 24, 8, 1.0f);
    L = m.L;
    L.q_lora_rank = 8;
    L.wq_a = NULL;
    L.wq_b = wb;
    expect_fail(&L, &e, c, e.seq, 0, 2, KVA_ERR_ARG, "q_lora_rank 8, wq_a NULL");
    L.wq_a = wa;
    L.wq_b = NULL;
    expect_fail(&L, &e, c, e.seq, 0, 2, KVA_ERR_ARG, "q_lora_rank 8, wq_b NULL");
    free(wa);
    free(wb);
  }
  L = m.L;
  expect_fail(NULL, &e, c, e.seq, 0, 2, KVA_ERR_ARG, "L NULL");
  expect_fail(&L, &e, NULL, e.seq, 0, 2, KVA_ERR_ARG, "cache NULL");
  expect_fail(&L, &e, c, e.seq, -1, 2, KVA_ERR_ARG, "layer -1");
  expect_fail(&L, &e, c, e.seq, 2, 2, KVA_ERR_ARG, "layer n_layers");
  expect_fail(&L, &e, c, e.seq, 0, -1, KVA_ERR_ARG, "n_tokens -1");
  e.x = NULL;
  expect_fail(&L, &e, c, e.seq, 0, 2, KVA_ERR_ARG, "x NULL");
  e.x = x;
  kt_fill_sentinel(y, 4 * 64);
  KT_STATUS(kva_mla_forward(&L, c, e.seq, 0, x, 2, NULL), KVA_ERR_ARG);
  KT_STATUS(kva_seq_read(c, e.seq, 0, 0, y, y + 64, NULL), KVA_ERR_ARG); /* latent: v must be NULL */

  /* sequences */
  expect_fail(&L, &e, c, 12345, 0, 1, KVA_ERR_SEQ, "unknown sequence");
  expect_fail(&L, &e, c, -1, 0, 1, KVA_ERR_SEQ, "negative sequence");
  KT_STATUS(kva_seq_new(c, &freed), KVA_OK);
  KT_STATUS(kva_seq_append(c, freed, 1), KVA_OK);
  KT_STATUS(kva_seq_free(c, freed), KVA_OK);
  expect_fail(&L, &e, c, freed, 0, 1, KVA_ERR_SEQ, "freed sequence");
  L.w_uk = NULL;
  expect_fail(&L, &e, c, 12345, 0, 1, KVA_ERR_ARG, "bad weights and unknown sequence (ARG first)");
  L = m.L;
  KT_STATUS(kva_seq_new(c, &fresh), KVA_OK);
  expect_fail(&L, &e, c, fresh, 0, 1, -1, "forward before any append");
  expect_fail(&L, &e, c, e.seq, 0, 3, -1, "n_tokens 3 after append(2)");
  L.naive = 1;
  expect_fail(&L, &e, c, fresh, 0, 1, -1, "forward before any append (naive)");

  /* n_tokens 0: a no-op */
  L = m.L;
  kt_fill_sentinel(y, 4 * 64);
  KT_STATUS(kva_mla_forward(&L, c, e.seq, 0, x, 0, y), KVA_OK);
  KT_CHECK(kt_all_sentinel(y, 4 * 64), "n_tokens 0 wrote y");

  /* q_lora_rank > 0 does not need wq */
  {
    mla_cfg qc = cfg;
    mla_model qm;
    qc.qr = 8;
    model_build(r, &qc, &qm);
    KT_CHECK(qm.L.wq == NULL, "setup");
    KT_STATUS(kva_seq_new(c, &s3), KVA_OK);
    KT_STATUS(kva_seq_append(c, s3, 2), KVA_OK);
    KT_STATUS(kva_mla_forward(&qm.L, c, s3, 1, x, 2, y), KVA_OK);
    model_free(&qm);
  }
  /* and the valid call on the sequence the failures left alone */
  KT_STATUS(kva_mla_forward(&L, c, e.seq, 0, x, 2, y), KVA_OK);
  kva_cache_destroy(c);
  model_free(&m);
#undef BAD_FIELD
}

/* ------------------------------------------------------------------------ */
/* Thread counts give bit-identical results (kvattn.h promises it)           */

static void test_mla_threads(kt_rng *r) {
  enum { D = 64, N = 9 };
  mla_cfg cfg;
  mla_model m;
  kva_cache_desc d;
  kva_cache *c = NULL;
  float x[(N + 1) * D], y[3][(N + 1) * D];
  int path, t, s[3];
  static const int nth[3] = {1, 2, 0};
  kt_begin("mla: n_threads 1, 2, 0 bit-identical");
  v2lite(&cfg);
  cfg.bias = 1;
  cfg.qr = 16;
  model_build(r, &cfg, &m);
  kt_fill(r, x, (size_t)(N + 1) * D, -1.7f, 1.7f);
  latent_desc(&d, &cfg, 1, 4, 32, KVA_F16);
  for (path = 0; path < 2; path++) {
    KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
    if (!c) break;
    for (t = 0; t < 3; t++) {
      m.L.naive = path;
      m.L.n_threads = nth[t];
      KT_STATUS(kva_seq_new(c, &s[t]), KVA_OK);
      KT_STATUS(kva_seq_append(c, s[t], N), KVA_OK);
      KT_STATUS(kva_mla_forward(&m.L, c, s[t], 0, x, N, y[t]), KVA_OK);
      KT_STATUS(kva_seq_append(c, s[t], 1), KVA_OK);
      KT_STATUS(kva_mla_forward(&m.L, c, s[t], 0, x + (size_t)N * D, 1, y[t] + (size_t)N * D),
                KVA_OK);
    }
    KT_CHECK(kt_same_bits(y[0], y[1], (size_t)(N + 1) * D) &&
                 kt_same_bits(y[0], y[2], (size_t)(N + 1) * D),
             "naive %d: outputs differ between thread counts", path);
    kva_cache_destroy(c);
    c = NULL;
  }
  model_free(&m);
}

/* Temporaries: with a workspace of kva_mla_workspace_bytes (for the length
   after the append) the forward calls no allocator; without one, or one
   byte short, it takes exactly one block from the cache's alloc_fn and
   gives it back; the outputs are the same bits. Both paths.                */
typedef struct {
  long takes, gives;
} mla_ws_count;

static void *mla_ws_alloc(size_t size, size_t align, void *user) {
  unsigned char *raw, *al;
  ((mla_ws_count *)user)->takes++;
  raw = KT_ALLOC(unsigned char, size + align + sizeof(void *));
  al = raw + sizeof(void *);
  al += (align - (uintptr_t)al % align) % align;
  ((void **)al)[-1] = raw;
  return al;
}

static void mla_ws_free(void *p, size_t size, void *user) {
  (void)size;
  ((mla_ws_count *)user)->gives++;
  free(((void **)p)[-1]);
}

static void test_mla_workspace(kt_rng *r) {
  enum { D = 64, N = 9 };
  mla_cfg cfg;
  mla_model m;
  kva_cache_desc d;
  kva_cache *c[3];
  mla_ws_count cnt[3];
  float x[(N + 3) * D], y[3][(N + 3) * D];
  unsigned char *ws;
  int path, i, s[3], step;
  size_t cap;
  kt_begin("mla: workspace and allocations through alloc_fn");
  v2lite(&cfg);
  cfg.qr = 16;
  model_build(r, &cfg, &m);
  kt_fill(r, x, (size_t)(N + 3) * D, -1.7f, 1.7f);
  m.L.naive = 0;
  cap = kva_mla_workspace_bytes(&m.L, N, N + 3);
  m.L.naive = 1; /* the naive path's temporaries grow with the sequence */
  if (kva_mla_workspace_bytes(&m.L, N, N + 3) > cap) cap = kva_mla_workspace_bytes(&m.L, N, N + 3);
  ws = KT_ALLOC(unsigned char, cap);
  KT_CHECK(kva_mla_workspace_bytes(NULL, 1, 1) == 0 && kva_mla_workspace_bytes(&m.L, -1, 1) == 0 &&
               kva_mla_workspace_bytes(&m.L, 1, -1) == 0,
           "workspace size of bad arguments is not 0");
  for (path = 0; path < 2; path++) {
    m.L.naive = path;
    for (i = 0; i < 3; i++) {
      memset(&cnt[i], 0, sizeof cnt[i]);
      latent_desc(&d, &cfg, 1, 4, 32, KVA_F16);
      d.alloc_fn = mla_ws_alloc;
      d.free_fn = mla_ws_free;
      d.user = &cnt[i];
      c[i] = NULL;
      KT_STATUS(kva_cache_create(&d, &c[i]), KVA_OK);
      if (c[i]) KT_STATUS(kva_seq_new(c[i], &s[i]), KVA_OK);
    }
    for (step = 0; step < 4 && c[0] && c[1] && c[2]; step++) {
      int n = step == 0 ? N : 1, at = step == 0 ? 0 : N + step - 1;
      for (i = 0; i < 3; i++) {
        kva_mla_layer L = m.L;
        long t0 = cnt[i].takes, g0 = cnt[i].gives;
        KT_STATUS(kva_seq_append(c[i], s[i], n), KVA_OK);
        if (i > 0) {
          L.workspace = ws;
          L.workspace_bytes = kva_mla_workspace_bytes(&L, n, kva_seq_len(c[i], s[i])) - (i == 2);
        }
        KT_STATUS(kva_mla_forward(&L, c[i], s[i], 0, x + (size_t)at * D, n, y[i] + (size_t)at * D), KVA_OK);
        if (i == 1)
          KT_CHECK(cnt[i].takes == t0 && cnt[i].gives == g0, "naive %d step %d: %ld takes with a workspace", path,
                   step, cnt[i].takes - t0);
        else
          KT_CHECK(cnt[i].takes == t0 + 1 && cnt[i].gives == g0 + 1,
                   "naive %d step %d cache %d: %ld takes, %ld gives (want 1 and 1)", path, step, i,
                   cnt[i].takes - t0, cnt[i].gives - g0);
      }
    }
    KT_CHECK(kt_same_bits(y[0], y[1], (size_t)(N + 3) * D) && kt_same_bits(y[0], y[2], (size_t)(N + 3) * D),
             "naive %d: outputs differ between workspace and allocation", path);
    for (i = 0; i < 3; i++) {
      kva_cache_destroy(c[i]);
      KT_CHECK(cnt[i].takes == cnt[i].gives, "naive %d cache %d: %ld takes, %ld gives", path, i, cnt[i].takes,
               cnt[i].gives);
    }
  }
  free(ws);
  model_free(&m);
}

/* ------------------------------------------------------------------------ */

void test_mla(void) {
  kt_rng r;
  const char *seed = getenv("KVA_MLA_SEED"); /* other seeds, for exploring */
  kt_seed(&r, seed && *seed ? (uint64_t)strtoull(seed, NULL, 0) : 0x4D4C41ULL);
  memset(mla_worst_ratio, 0, sizeof mla_worst_ratio);
  mla_worst_f16_unrounded = 0.0;
  memset(mla_worst_quant, 0, sizeof mla_worst_quant);
  memset(mla_worst_fp8_unemulated, 0, sizeof mla_worst_fp8_unemulated);
  test_mla_bytes();
  test_mla_args(&r);
  test_mla_fixed(&r);
  test_mla_random(&r, kt_iters(24));
  test_mla_sketch(&r);
  test_mla_order(&r);
  test_mla_fork(&r);
  test_mla_prefix(&r);
  test_mla_evict(&r);
  test_mla_quant(&r);
  test_mla_threads(&r);
  test_mla_workspace(&r);
  if (getenv("KVA_TEST_VERBOSE"))
    fprintf(stderr,
            "  mla: worst err/tol F32 %.4f (tol %.0e), F16 %.4f (tol %.0e), BF16 %.4f (tol %.0e); "
            "F16 cache vs unrounded reference %.2e of M\n",
            mla_worst_ratio[0], MLA_TOL_F32, mla_worst_ratio[1], MLA_TOL_F16, mla_worst_ratio[2],
            MLA_TOL_BF16, mla_worst_f16_unrounded);
  if (getenv("KVA_TEST_VERBOSE"))
    fprintf(stderr, "  mla: int8 vs unquantized ref %.2e M (tol 6e-2); e4m3 / e5m2 vs emulated "
            "ref %.2e / %.2e M (tol 5e-3), vs unquantized %.2e / %.2e M; FP8 latent with k_scale "
            "only -> status %d\n", mla_worst_quant[0], mla_worst_quant[1], mla_worst_quant[2],
            mla_worst_fp8_unemulated[0], mla_worst_fp8_unemulated[1], fp8_kscale_only_status);
  if (getenv("KVA_TEST_VERBOSE"))
    fprintf(stderr, "  mla: d_rope 0 with theta set -> status %d; q_norm NULL -> status %d\n",
            rope_set_d0_status, q_norm_null_status);
}
