/* test_rotate.c - rotated rows (kva_cache_desc.rotate).
 *
 * The transform is rebuilt here from its definition, independently of the
 * header: the Sylvester Hadamard matrix (entry (i, j) = (-1)^popcount(i & j))
 * scaled by 1/sqrt(n), over a whole row whose width is a power of two up to
 * 1024, else over each group of 32 values with a shorter last group left as
 * it is; computed as a matrix product in double.
 *   - what a rotated F32 cache stores (read raw from kva_seq_export's rows)
 *     is R x, within float rounding of the double product;
 *   - kva_seq_read gives the original rows back;
 *   - attention of a rotated F32 cache (K, V or both) through kva_attend_cache,
 *     kva_attend_batch and kva_gqa_forward equals the fp64 reference on the
 *     original rows within float tolerance, and the unrotated cache's output;
 *   - on keys with outlier channels, rotated INT8 / INT4 keys err less than
 *     unrotated ones against the fp64 reference (the errors are printed with
 *     KVA_TEST_VERBOSE); FP8 is measured too;
 *   - bad values and unsupported combinations are refused, streams keep the
 *     rotation, a plan does not cross caches of another rotation. */
#include "kvattn.h"
#include "harness.h"
#include "ref.h"

/* x times the rotation, in double (x has n values) */
static void rt_rotate_ref(const double *x, double *y, int n) {
  int whole = n <= 1024 && (n & (n - 1)) == 0, g0, i, j;
  for (i = 0; i < n; i++) y[i] = x[i];
  for (g0 = 0; g0 < n; g0 += whole ? n : 32) {
    int m = whole ? n : 32;
    if (g0 + m > n) break; /* a shorter last group stays */
    for (i = 0; i < m; i++) {
      double s = 0.0;
      for (j = 0; j < m; j++) {
        unsigned b = (unsigned)(i & j), parity = 0;
        while (b) parity ^= b & 1u, b >>= 1;
        s += (parity ? -1.0 : 1.0) * x[g0 + j];
      }
      y[g0 + i] = s / sqrt((double)m);
    }
  }
}

typedef struct {
  int H, G, D, DV, n, bs;
} rt_shape;

static kva_cache *rt_cache(const rt_shape *sh, kva_dtype kt, int rotate, int layers) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  memset(&d, 0, sizeof d);
  d.n_layers = layers;
  d.n_kv_heads = sh->G;
  d.head_dim = sh->D;
  d.v_dim = sh->DV;
  d.block_size = sh->bs;
  d.n_blocks = (sh->n + sh->bs - 1) / sh->bs * 3 + 4;
  d.dtype = kt;
  d.v_dtype = KVA_F32;
  d.k_scale = d.v_scale = 0.25f;
  d.rotate = rotate;
  d.max_seqs = 8;
  d.evict_support = KVA_EVICT_SUPPORT_NONE; /* the stream's rows: K and V only */
  if (kva_cache_create(&d, &c) != KVA_OK) return NULL;
  return c;
}

/* n tokens of k, v into a new sequence, in two appends (the last one the step of n_q) */
static int rt_fill(kva_cache *c, const rt_shape *sh, int n_q, const float *k, const float *v) {
  int seq = -1;
  if (kva_seq_new(c, &seq) != KVA_OK) return -1;
  if (sh->n > n_q) {
    kva_seq_append(c, seq, sh->n - n_q);
    kva_store(c, seq, 0, k, v, sh->n - n_q);
  }
  kva_seq_append(c, seq, n_q);
  kva_store(c, seq, 0, k + (size_t)(sh->n - n_q) * sh->G * sh->D, v + (size_t)(sh->n - n_q) * sh->G * sh->DV, n_q);
  return seq;
}

/* relative error of got against the reference over n values */
static double rt_rel_err(const float *got, const double *want, size_t n) {
  double e = 0.0, w = 0.0;
  size_t i;
  for (i = 0; i < n; i++) {
    e += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
    w += want[i] * want[i];
  }
  return w > 0.0 ? sqrt(e / w) : sqrt(e);
}

static void rt_stored_and_read(kt_rng *r) {
  static const int widths[] = {1, 2, 4, 5, 8, 16, 31, 32, 33, 40, 64, 96, 100, 128, 256, 1024, 1056};
  int wi;
  kt_begin("rotate: what the cache stores is R x (from the stream), kva_seq_read gives x back");
  for (wi = 0; wi < (int)(sizeof widths / sizeof widths[0]); wi++) {
    rt_shape sh;
    kva_cache *c;
    float *k, *v, *back_k, *back_v;
    double *x, *y;
    int seq, t, g, i, rot;
    sh.G = kt_int(r, 1, 2), sh.H = sh.G, sh.D = widths[wi], sh.DV = kt_int(r, 0, 1) ? widths[wi] : 16;
    sh.n = kt_int(r, 1, 9), sh.bs = kt_int(r, 1, 5);
    k = KT_ALLOC(float, (size_t)sh.n * sh.G * sh.D);
    v = KT_ALLOC(float, (size_t)sh.n * sh.G * sh.DV);
    back_k = KT_ALLOC(float, (size_t)sh.G * sh.D);
    back_v = KT_ALLOC(float, (size_t)sh.G * sh.DV);
    x = KT_ALLOC(double, (size_t)(sh.D > sh.DV ? sh.D : sh.DV));
    y = KT_ALLOC(double, (size_t)(sh.D > sh.DV ? sh.D : sh.DV));
    kt_fill(r, k, (size_t)sh.n * sh.G * sh.D, -2.0f, 2.0f);
    kt_fill(r, v, (size_t)sh.n * sh.G * sh.DV, -1.0f, 1.0f);
    for (rot = 1; rot <= 3; rot++) {
      unsigned char *buf;
      size_t size = 0;
      c = rt_cache(&sh, KVA_F32, rot, 1);
      KT_CHECK(c != NULL, "create D=%d rotate %d", sh.D, rot);
      if (!c) continue;
      seq = rt_fill(c, &sh, 1, k, v);
      /* the stream's rows, after a 128-byte header, the layer record and no prefix: K then V per head */
      KT_STATUS(kva_seq_export(c, seq, NULL, 0, &size), KVA_OK);
      buf = KT_ALLOC(unsigned char, size);
      KT_STATUS(kva_seq_export(c, seq, buf, size, &size), KVA_OK);
      for (g = 0; g < sh.G; g++) {
        const unsigned char *rows = buf + 128 + 16 + 8 * (size_t)sh.G +
                                    (size_t)g * (size_t)sh.n * (size_t)(sh.D + sh.DV) * sizeof(float);
        for (t = 0; t < sh.n; t++) {
          int ok = 1, part;
          for (part = 0; part < 2; part++) {
            int w = part ? sh.DV : sh.D, rotated = rot & (part ? KVA_ROTATE_V : KVA_ROTATE_K);
            const float *src = part ? v + ((size_t)t * sh.G + g) * sh.DV : k + ((size_t)t * sh.G + g) * sh.D;
            const unsigned char *at = rows + (part ? (size_t)sh.n * sh.D * sizeof(float) : 0) +
                                      (size_t)t * (size_t)w * sizeof(float);
            for (i = 0; i < w; i++) x[i] = src[i];
            if (rotated) rt_rotate_ref(x, y, w);
            else
              for (i = 0; i < w; i++) y[i] = x[i];
            for (i = 0; i < w; i++) {
              float f;
              memcpy(&f, at + (size_t)i * sizeof(float), sizeof f);
              if (!(fabs((double)f - y[i]) <= 1e-6 * (1.0 + sqrt((double)w) * 2.0))) ok = 0;
            }
          }
          KT_CHECK(ok, "stored rows of D=%d DV=%d rotate %d, token %d head %d are not R x", sh.D, sh.DV, rot, t, g);
        }
      }
      for (t = 0; t < sh.n; t++) {
        int ok = 1;
        KT_STATUS(kva_seq_read(c, seq, 0, t, back_k, back_v, NULL), KVA_OK);
        for (i = 0; i < sh.G * sh.D; i++) ok &= fabs((double)back_k[i] - k[(size_t)t * sh.G * sh.D + i]) <= 2e-6;
        for (i = 0; i < sh.G * sh.DV; i++) ok &= fabs((double)back_v[i] - v[(size_t)t * sh.G * sh.DV + i]) <= 2e-6;
        KT_CHECK(ok, "kva_seq_read of D=%d rotate %d token %d: not the stored rows back", sh.D, rot, t);
      }
      free(buf);
      kva_cache_destroy(c);
    }
    free(k), free(v), free(back_k), free(back_v), free(x), free(y);
  }
}

/* attention of rotated F32 caches against the reference and the unrotated cache */
static void rt_attention(kt_rng *r) {
  static const int dims[] = {4, 8, 13, 16, 32, 40, 64, 96, 128};
  int it, iters = kt_iters(60);
  kt_begin("rotate: a rotated F32 cache attends as the unrotated one (cache, batch, GQA forward)");
  for (it = 0; it < iters; it++) {
    rt_shape sh;
    int n_q, rot = 1 + it % 3, seq_a, seq_b, i;
    kva_cache *plain, *rc;
    kva_attn a;
    float *k, *v, *q, *o_plain, *o_rot, *o_batch;
    double *kd, *vd, *qd, *od;
    ref_attn_cfg cfg;
    sh.G = kt_int(r, 1, 3), sh.H = sh.G * kt_int(r, 1, 3);
    sh.D = dims[kt_int(r, 0, 8)], sh.DV = kt_int(r, 0, 2) ? sh.D : dims[kt_int(r, 0, 8)];
    sh.n = kt_int(r, 1, 90), sh.bs = kt_int(r, 1, 17);
    n_q = kt_int(r, 1, sh.n < 6 ? sh.n : 6);
    k = KT_ALLOC(float, (size_t)sh.n * sh.G * sh.D);
    v = KT_ALLOC(float, (size_t)sh.n * sh.G * sh.DV);
    q = KT_ALLOC(float, (size_t)n_q * sh.H * sh.D);
    o_plain = KT_ALLOC(float, (size_t)n_q * sh.H * sh.DV);
    o_rot = KT_ALLOC(float, (size_t)n_q * sh.H * sh.DV);
    o_batch = KT_ALLOC(float, (size_t)n_q * sh.H * sh.DV);
    od = KT_ALLOC(double, (size_t)n_q * sh.H * sh.DV);
    kt_fill(r, k, (size_t)sh.n * sh.G * sh.D, -1.5f, 1.5f);
    kt_fill(r, v, (size_t)sh.n * sh.G * sh.DV, -1.0f, 1.0f);
    kt_fill(r, q, (size_t)n_q * sh.H * sh.D, -1.0f, 1.0f);
    plain = rt_cache(&sh, KVA_F32, 0, 1);
    rc = rt_cache(&sh, KVA_F32, rot, 1);
    if (!plain || !rc) {
      KT_CHECK(0, "create");
      kva_cache_destroy(plain), kva_cache_destroy(rc);
      continue;
    }
    seq_a = rt_fill(plain, &sh, n_q, k, v);
    seq_b = rt_fill(rc, &sh, n_q, k, v);
    memset(&a, 0, sizeof a);
    a.n_heads = sh.H, a.n_kv_heads = sh.G, a.head_dim = sh.D, a.v_dim = sh.DV, a.n_threads = 1;
    if (it % 4 == 1) a.window = kt_int(r, 1, 20), a.n_sink = kt_int(r, 0, 3);
    KT_STATUS(kva_attend_cache(plain, seq_a, 0, &a, q, n_q, o_plain), KVA_OK);
    KT_STATUS(kva_attend_cache(rc, seq_b, 0, &a, q, n_q, o_rot), KVA_OK);
    { /* the same through a batch plan */
      kva_batch *plan = NULL;
      KT_STATUS(kva_batch_plan(rc, &a, &seq_b, &n_q, 1, &plan), KVA_OK);
      if (plan) KT_STATUS(kva_attend_batch(rc, plan, 0, q, o_batch), KVA_OK);
      kva_batch_free(plan);
      /* a plan of the rotated cache does not run on a cache without rotation */
      plan = NULL;
      KT_STATUS(kva_batch_plan(rc, &a, &seq_b, &n_q, 1, &plan), KVA_OK);
      if (plan) KT_STATUS(kva_attend_batch(plain, plan, 0, q, o_batch + 0 * n_q), KVA_ERR_ARG);
      kva_batch_free(plan);
      plan = NULL;
      KT_STATUS(kva_batch_plan(rc, &a, &seq_b, &n_q, 1, &plan), KVA_OK);
      if (plan) KT_STATUS(kva_attend_batch(rc, plan, 0, q, o_batch), KVA_OK);
      kva_batch_free(plan);
    }
    kd = ref_dup_f(k, (size_t)sh.n * sh.G * sh.D);
    vd = ref_dup_f(v, (size_t)sh.n * sh.G * sh.DV);
    qd = ref_dup_f(q, (size_t)n_q * sh.H * sh.D);
    cfg = ref_cfg(&a);
    ref_attend(&cfg, qd, n_q, NULL, kd, vd, sh.n, NULL, od, NULL);
    {
      double tol = 3e-6 * (1.0 + sqrt((double)sh.D)), e_rot = ref_max_err(o_rot, od, (size_t)n_q * sh.H * sh.DV, NULL);
      double e_batch = ref_max_err(o_batch, od, (size_t)n_q * sh.H * sh.DV, NULL);
      double e_plain = ref_max_err(o_plain, od, (size_t)n_q * sh.H * sh.DV, NULL), diff = 0.0;
      for (i = 0; i < n_q * sh.H * sh.DV; i++)
        if (fabs((double)o_rot[i] - o_plain[i]) > diff) diff = fabs((double)o_rot[i] - o_plain[i]);
      KT_CHECK(e_rot <= tol && e_batch <= tol && e_plain <= tol,
               "H=%d G=%d D=%d DV=%d n=%d n_q=%d rotate %d win %d: |err| cache %.3g batch %.3g plain %.3g > %.3g",
               sh.H, sh.G, sh.D, sh.DV, sh.n, n_q, rot, a.window, e_rot, e_batch, e_plain, tol);
      KT_CHECK(diff <= tol, "rotated vs unrotated cache: %.3g > %.3g (D=%d rotate %d)", diff, tol, sh.D, rot);
    }
    free(kd), free(vd), free(qd);
    free(k), free(v), free(q), free(o_plain), free(o_rot), free(o_batch), free(od);
    kva_cache_destroy(plain), kva_cache_destroy(rc);
  }
}

/* a GQA layer over a rotated cache equals it over a plain one */
static void rt_gqa(kt_rng *r) {
  const int dm = 24, H = 4, G = 2, D = 16, n = 9;
  float *w = KT_ALLOC(float, 4 * (size_t)H * D * dm), *x = KT_ALLOC(float, (size_t)n * dm);
  float *y0 = KT_ALLOC(float, (size_t)n * dm), *y1 = KT_ALLOC(float, (size_t)n * dm);
  kva_gqa_layer L;
  rt_shape sh;
  kva_cache *c0, *c1;
  int s0 = -1, s1 = -1, i;
  double worst = 0.0;
  kt_begin("rotate: kva_gqa_forward over a rotated cache");
  kt_fill(r, w, 4 * (size_t)H * D * dm, -0.3f, 0.3f);
  kt_fill(r, x, (size_t)n * dm, -1.0f, 1.0f);
  memset(&L, 0, sizeof L);
  L.d_model = dm;
  L.attn.n_heads = H, L.attn.n_kv_heads = G, L.attn.head_dim = D, L.attn.n_threads = 1;
  L.wq = w, L.wk = w + (size_t)H * D * dm, L.wv = L.wk + (size_t)G * D * dm, L.wo = w + 3 * (size_t)H * D * dm;
  L.rope.theta = 10000.0f;
  sh.H = H, sh.G = G, sh.D = D, sh.DV = D, sh.n = n, sh.bs = 4;
  c0 = rt_cache(&sh, KVA_F32, 0, 1);
  c1 = rt_cache(&sh, KVA_F32, KVA_ROTATE_K | KVA_ROTATE_V, 1);
  KT_CHECK(c0 && c1, "create");
  if (c0 && c1) {
    kva_seq_new(c0, &s0), kva_seq_new(c1, &s1);
    kva_seq_append(c0, s0, n), kva_seq_append(c1, s1, n);
    KT_STATUS(kva_gqa_forward(&L, c0, s0, 0, x, n, y0), KVA_OK);
    KT_STATUS(kva_gqa_forward(&L, c1, s1, 0, x, n, y1), KVA_OK);
    for (i = 0; i < n * dm; i++)
      if (fabs((double)y0[i] - y1[i]) > worst) worst = fabs((double)y0[i] - y1[i]);
    KT_CHECK(worst <= 1e-5, "GQA forward, rotated vs plain cache: %.3g", worst);
  }
  kva_cache_destroy(c0), kva_cache_destroy(c1);
  free(w), free(x), free(y0), free(y1);
}

/* keys with outlier channels: rotated quantized keys err less */
static void rt_outliers(kt_rng *r) {
  static const kva_dtype dts[4] = {KVA_INT8, KVA_INT4, KVA_FP8_E4M3, KVA_FP8_E5M2};
  rt_shape sh;
  int di, i, n_q = 4, seq;
  float *k, *v, *q, *o;
  double *kd, *vd, *qd, *od;
  kva_attn a;
  ref_attn_cfg cfg;
  kt_begin("rotate: on keys with outlier channels, rotated INT8 / INT4 keys err less than unrotated");
  sh.H = 8, sh.G = 2, sh.D = 128, sh.DV = 128, sh.n = 256, sh.bs = 16;
  k = KT_ALLOC(float, (size_t)sh.n * sh.G * sh.D);
  v = KT_ALLOC(float, (size_t)sh.n * sh.G * sh.DV);
  q = KT_ALLOC(float, (size_t)n_q * sh.H * sh.D);
  o = KT_ALLOC(float, (size_t)n_q * sh.H * sh.DV);
  od = KT_ALLOC(double, (size_t)n_q * sh.H * sh.DV);
  kt_fill(r, k, (size_t)sh.n * sh.G * sh.D, -1.0f, 1.0f);
  for (i = 0; i < sh.n * sh.G * sh.D; i++) /* four channels of every head 40x larger (LLM keys' outliers) */
    if (i % sh.D == 3 || i % sh.D == 17 || i % sh.D == 64 || i % sh.D == 101) k[i] *= 40.0f;
  kt_fill(r, v, (size_t)sh.n * sh.G * sh.DV, -1.0f, 1.0f);
  kt_fill(r, q, (size_t)n_q * sh.H * sh.D, -0.2f, 0.2f);
  memset(&a, 0, sizeof a);
  a.n_heads = sh.H, a.n_kv_heads = sh.G, a.head_dim = sh.D, a.n_threads = 1;
  kd = ref_dup_f(k, (size_t)sh.n * sh.G * sh.D);
  vd = ref_dup_f(v, (size_t)sh.n * sh.G * sh.DV);
  qd = ref_dup_f(q, (size_t)n_q * sh.H * sh.D);
  cfg = ref_cfg(&a);
  ref_attend(&cfg, qd, n_q, NULL, kd, vd, sh.n, NULL, od, NULL);
  for (di = 0; di < 4; di++) {
    double err[2];
    int rot;
    for (rot = 0; rot < 2; rot++) {
      kva_cache_desc d;
      kva_cache *c = NULL;
      memset(&d, 0, sizeof d);
      d.n_layers = 1, d.n_kv_heads = sh.G, d.head_dim = sh.D, d.n_blocks = sh.n / sh.bs + 2;
      d.dtype = dts[di], d.v_dtype = KVA_F32, d.rotate = rot ? KVA_ROTATE_K : 0;
      /* FP8: a scale that keeps the outliers in range (calibrated on the stored rows) */
      d.k_scale = dts[di] == KVA_FP8_E4M3 ? 80.0f / 448.0f : 1.0f;
      if (kva_cache_create(&d, &c) != KVA_OK) {
        KT_CHECK(0, "create %s", kva_dtype_name(dts[di]));
        continue;
      }
      seq = -1;
      kva_seq_new(c, &seq);
      kva_seq_append(c, seq, sh.n - n_q);
      kva_store(c, seq, 0, k, v, sh.n - n_q);
      kva_seq_append(c, seq, n_q);
      kva_store(c, seq, 0, k + (size_t)(sh.n - n_q) * sh.G * sh.D, v + (size_t)(sh.n - n_q) * sh.G * sh.DV, n_q);
      KT_STATUS(kva_attend_cache(c, seq, 0, &a, q, n_q, o), KVA_OK);
      err[rot] = rt_rel_err(o, od, (size_t)n_q * sh.H * sh.DV);
      kva_cache_destroy(c);
    }
    if (getenv("KVA_TEST_VERBOSE"))
      fprintf(stderr, "    rotation, outlier keys, %s: relative error %.3g unrotated, %.3g rotated\n",
              kva_dtype_name(dts[di]), err[0], err[1]);
    if (dts[di] == KVA_INT8 || dts[di] == KVA_INT4)
      KT_CHECK(err[1] <= 0.7 * err[0], "%s: rotated keys err %.3g, unrotated %.3g (want <= 0.7x)",
               kva_dtype_name(dts[di]), err[1], err[0]);
    else
      KT_CHECK(err[1] <= 1.5 * err[0] + 1e-3, "%s: rotated keys err %.3g, unrotated %.3g", kva_dtype_name(dts[di]),
               err[1], err[0]);
  }
  free(kd), free(vd), free(qd), free(k), free(v), free(q), free(o), free(od);
}

static void rt_errors(void) {
  kva_cache_desc d;
  kva_cache *c = NULL, *c2 = NULL;
  rt_shape sh;
  float k[2 * 8], v[2 * 8];
  int seq = -1, imp = -1, i;
  size_t size = 0;
  unsigned char *buf;
  kt_begin("rotate: bad values refused; streams keep the rotation");
  memset(&d, 0, sizeof d);
  d.n_layers = 1, d.n_kv_heads = 2, d.head_dim = 8, d.n_blocks = 4;
  d.rotate = 4;
  KT_STATUS(kva_cache_create(&d, &c), KVA_ERR_ARG);
  d.rotate = -1;
  KT_STATUS(kva_cache_create(&d, &c), KVA_ERR_ARG);
  d.rotate = KVA_ROTATE_K;
  d.kind = KVA_CACHE_LATENT;
  KT_STATUS(kva_cache_create(&d, &c), KVA_ERR_UNSUPPORTED);
  KT_CHECK(c == NULL, "a refused create wrote *out");
  sh.H = 2, sh.G = 2, sh.D = 8, sh.DV = 8, sh.n = 1, sh.bs = 4;
  for (i = 0; i < 16; i++) k[i] = (float)i - 7.5f, v[i] = 0.25f * (float)i;
  c = rt_cache(&sh, KVA_F16, KVA_ROTATE_K, 1);
  c2 = rt_cache(&sh, KVA_F16, 0, 1);
  KT_CHECK(c && c2, "create");
  if (c && c2) {
    seq = rt_fill(c, &sh, 1, k, v);
    KT_STATUS(kva_seq_export(c, seq, NULL, 0, &size), KVA_OK);
    buf = KT_ALLOC(unsigned char, size);
    KT_STATUS(kva_seq_export(c, seq, buf, size, &size), KVA_OK);
    KT_STATUS(kva_seq_import(c2, buf, size, &imp), KVA_ERR_UNSUPPORTED); /* another basis */
    KT_STATUS(kva_seq_import(c, buf, size, &imp), KVA_OK);
    free(buf);
    seq = rt_fill(c2, &sh, 1, k, v);
    KT_STATUS(kva_seq_export(c2, seq, NULL, 0, &size), KVA_OK);
    buf = KT_ALLOC(unsigned char, size);
    KT_STATUS(kva_seq_export(c2, seq, buf, size, &size), KVA_OK);
    KT_STATUS(kva_seq_import(c, buf, size, &imp), KVA_ERR_UNSUPPORTED);
    free(buf);
  }
  kva_cache_destroy(c), kva_cache_destroy(c2);
}

/* white box: the build's transform (kva__fwht: vector on x86) gives the scalar twin's bits,
   NaN and infinities included, at every power of two up to 1,024 */
static void rt_fwht_twin(kt_rng *r) {
  static float a[1024], b[1024];
  int n, it, bad = 0;
  kt_begin("rotate: the build's Walsh-Hadamard transform equals the scalar twin bit for bit");
  for (n = 1; n <= 1024; n *= 2)
    for (it = 0; it < 20; it++) {
      int i;
      for (i = 0; i < n; i++) {
        a[i] = kt_uniform(r, -1.0f, 1.0f) * (it % 4 == 1 ? 3e37f : 1.0f);
        if (it % 4 == 2 && kt_int(r, 0, 15) == 0) a[i] = kt_int(r, 0, 2) == 0 ? NAN : kt_int(r, 0, 1) ? INFINITY : -INFINITY;
        b[i] = a[i];
      }
      kva__fwht(a, n);
      kva__fwht_scalar(b, n);
      bad += memcmp(a, b, (size_t)n * sizeof(float)) != 0;
    }
  KT_CHECK(bad == 0, "%d transforms differ from the scalar twin", bad);
}

void test_rotate(void) {
  kt_rng r;
  kt_seed(&r, 0x70747e);
  rt_stored_and_read(&r);
  rt_attention(&r);
  rt_gqa(&r);
  rt_outliers(&r);
  rt_errors();
  rt_fwht_twin(&r);
}
