/* test_int4.c - KVA_INT4 cache storage.
 *
 * The format is rebuilt here from docs/API.md, independently of the header:
 * groups of 32 values along the head dimension (a last group may be
 * shorter), per group min and max of the finite values; min' = the F16 at
 * or below min, scale' = the F16 at or above (max - min') / 15 (in double),
 * both saturated to +-65504; code = round((x - min') / scale') (double)
 * clamped to 0..15, read back as (float)code * scale' + min' (a float
 * multiply, then a float add).
 *   - kva_seq_read gives exactly the reference's read-back (bit for bit),
 *     within half a step (scale' / 2) of every finite value unless the
 *     group's range leaves F16's (then values clamp to the end codes);
 *     NaN, +-Inf, constant groups, ranges beyond F16 and beyond float,
 *     subnormal ranges;
 *   - kva_cache_bytes_per_token counts 20 bytes per 32 values (q4_1's);
 *   - attention over INT4 K and / or V (with INT8 / F16 for the other, per
 *     layer, latent caches, batch plans) equals the fp64 reference fed the
 *     read-back rows, at float tolerance;
 *   - fork and copy-on-write, streams re-export byte for byte. */
#include "kvattn.h"
#include "harness.h"
#include "ref.h"

/* min and max of the finite values among x[0..m) (0 and 0 without any) */
static void i4_range(const float *x, int m, double *mn, double *mx) {
  int i, any = 0;
  *mn = *mx = 0.0;
  for (i = 0; i < m; i++) {
    double v = (double)x[i];
    if (!isfinite(v)) continue;
    if (!any || v < *mn) *mn = v;
    if (!any || v > *mx) *mx = v;
    any = 1;
  }
}

/* the largest finite F16 value at or below x (x clamped to +-65504 first):
   the nearest F16 or one of its two neighbouring codes */
static double i4_f16_down(double x) {
  uint32_t h, c;
  double best = -INFINITY;
  int d;
  x = x > 65504.0 ? 65504.0 : x < -65504.0 ? -65504.0 : x;
  h = ref_encode_ieee(x, 5, 10);
  for (d = -1; d <= 1; d++) {
    double v;
    c = (h + (uint32_t)(d + 0x10000)) & 0xFFFFu;
    if ((c & 0x7C00u) == 0x7C00u) continue; /* Inf or NaN */
    v = ref_f16_to_f64((uint16_t)c);
    if (v <= x && v > best) best = v;
  }
  return best;
}
static double i4_f16_up(double x) { return -i4_f16_down(-x); }

/* the reference's stored minimum and scale of a group */
static void i4_params(const float *x, int m, double *fmn, double *scale) {
  double mn, mx;
  i4_range(x, m, &mn, &mx);
  *fmn = i4_f16_down(mn);
  *scale = i4_f16_up((mx - *fmn) / 15.0);
}

/* the reference read-back of n values x; out_fused: the same with the
   multiply-add rounded once (a compiler may fuse it in the scalar path, as
   C++ compilers do by default) */
static void i4_ref(const float *x, float *out, float *out_fused, int n) {
  int g0, i;
  for (g0 = 0; g0 < n; g0 += 32) {
    int m = n - g0 < 32 ? n - g0 : 32;
    double mn, dscale;
    float scale, fmn;
    i4_params(x + g0, m, &mn, &dscale);
    scale = (float)dscale, fmn = (float)mn;
    for (i = 0; i < m; i++) {
      double v = (double)x[g0 + i], c;
      volatile float prod;
      int code;
      if (isnan(v)) c = 0.0;
      else if (scale > 0.0f) c = (v - mn) / (double)scale;
      else c = v == INFINITY ? 15.0 : 0.0;
      code = c >= 15.0 ? 15 : c <= 0.0 ? 0 : (int)floor(c + 0.5);
      prod = (float)code * scale;
      out[g0 + i] = prod + fmn;
      out_fused[g0 + i] = fmaf((float)code, scale, fmn);
    }
  }
}

/* every value bit for bit one of the two roundings */
static int i4_same(const float *got, const float *want, const float *want_fused, int n) {
  int i;
  for (i = 0; i < n; i++)
    if (!kt_same_bits(got + i, want + i, 1) && !kt_same_bits(got + i, want_fused + i, 1)) return 0;
  return 1;
}

static size_t i4_row_bytes(int n) { return (size_t)(n / 32) * 20 + (n % 32 ? 4 + (size_t)(n % 32 + 1) / 2 : 0); }

static void i4_readback(kt_rng *r) {
  static const int widths[] = {1, 2, 7, 31, 32, 33, 63, 64, 65, 100, 128, 576};
  int wi, kind;
  kt_begin("int4: read-back equals the reference quantizer, within half a step; bytes per token");
  for (wi = 0; wi < (int)(sizeof widths / sizeof widths[0]); wi++)
    for (kind = 0; kind < 9; kind++) {
      int D = widths[wi], G = 2, n = 4, i, t, bad = 0, far = 0;
      kva_cache_desc d;
      kva_cache *c = NULL;
      float *k = KT_ALLOC(float, (size_t)n * G * D), *v = KT_ALLOC(float, (size_t)n * G * D);
      float *got_k = KT_ALLOC(float, (size_t)G * D), *got_v = KT_ALLOC(float, (size_t)G * D);
      float *want = KT_ALLOC(float, (size_t)D), *want_fused = KT_ALLOC(float, (size_t)D);
      int seq = -1;
      for (i = 0; i < n * G * D; i++) {
        switch (kind) {
          case 0: k[i] = kt_uniform(r, -3.0f, 3.0f); break;
          case 1: k[i] = kt_int(r, 0, 9) == 0 ? 2.5f : 2.5f; break;                     /* constant */
          case 2: k[i] = kt_uniform(r, -3.0e38f, 3.0e38f); break;                        /* range > FLT_MAX */
          case 3: k[i] = kt_uniform(r, -1.0f, 1.0f) * 1e-39f; break;                     /* subnormals */
          case 4: k[i] = kt_int(r, 0, 5) == 0 ? (kt_int(r, 0, 1) ? INFINITY : -INFINITY) : kt_uniform(r, -1, 1); break;
          case 5: k[i] = kt_int(r, 0, 5) == 0 ? NAN : kt_uniform(r, 0.5f, 4.0f); break;
          case 7: k[i] = kt_uniform(r, -2.0e5f, 3.0e5f); break; /* beyond F16's range: saturated */
          case 8: k[i] = kt_uniform(r, 6.0e4f, 6.5e4f) * (kt_int(r, 0, 1) ? 1.0f : -1.0f); break; /* near its edge */
          default: { /* a value exactly half-way between codes 0 and 1 with a scale whose reciprocal
                        rounds it below (found by search); a constant group of 1.0 with +Inf */
            static const float tie_max[4] = {3.84763885f, 2.80561328f, 3.08635783f, 3.55557489f};
            static const float tie_x[4] = {0.128254622f, 0.0935204402f, 0.102878593f, 0.118519165f};
            int which = i / D % 4;
            k[i] = i % D % 32 == 0 ? 0.0f : i % D % 32 == 1 ? tie_max[which] : tie_x[which];
            if (D % 32 == 2 && i % D >= D - 2) k[i] = i % D == D - 1 ? INFINITY : 1.0f;
            break;
          }
        }
        v[i] = kt_uniform(r, -1.0f, 1.0f);
      }
      memset(&d, 0, sizeof d);
      d.n_layers = 1, d.n_kv_heads = G, d.head_dim = D, d.n_blocks = 4, d.block_size = 3, d.dtype = KVA_INT4;
      KT_CHECK(kva_cache_bytes_per_token(&d) == 2 * (size_t)G * i4_row_bytes(D), "bytes per token D=%d: %zu", D,
               kva_cache_bytes_per_token(&d));
      if (kva_cache_create(&d, &c) != KVA_OK) {
        KT_CHECK(0, "create D=%d", D);
        continue;
      }
      kva_seq_new(c, &seq);
      kva_seq_append(c, seq, n);
      kva_store(c, seq, 0, k, v, n);
      for (t = 0; t < n; t++) {
        int g;
        KT_STATUS(kva_seq_read(c, seq, 0, t, got_k, got_v, NULL), KVA_OK);
        for (g = 0; g < G; g++) {
          const float *x = k + ((size_t)t * G + g) * D;
          i4_ref(x, want, want_fused, D);
          bad += !i4_same(got_k + (size_t)g * D, want, want_fused, D);
          for (i = 0; i < D; i++) { /* half a step of the group's finite range */
            int g0 = i / 32 * 32, m = D - g0 < 32 ? D - g0 : 32;
            double mn, mx, fmn, scale, half;
            if (!isfinite((double)x[i])) continue;
            i4_range(x + g0, m, &mn, &mx);
            i4_params(x + g0, m, &fmn, &scale);
            if (mn < -65504.0 || fmn + 15.0 * scale < mx) continue; /* beyond F16: clamped (checked bit for bit above) */
            half = scale / 2.0;
            if (fabs((double)got_k[(size_t)g * D + i] - (double)x[i]) > half * (1 + 1e-6) + 4e-7 * (fabs(fmn) + fabs(mx)) + 1e-45)
              far++;
          }
          i4_ref(v + ((size_t)t * G + g) * D, want, want_fused, D);
          bad += !i4_same(got_v + (size_t)g * D, want, want_fused, D);
        }
      }
      KT_CHECK(bad == 0, "D=%d data %d: %d rows differ from the reference read-back", D, kind, bad);
      KT_CHECK(far == 0, "D=%d data %d: %d values beyond half a step", D, kind, far);
      kva_cache_destroy(c);
      free(k), free(v), free(got_k), free(got_v), free(want), free(want_fused);
    }
}

typedef struct {
  int H, G, D, DV, n, n_q, bs, layers;
} i4_shape;

/* attention over a cache with INT4 somewhere against fp64 on the read-back rows */
static void i4_attention(kt_rng *r) {
  static const int dims[] = {5, 8, 16, 31, 32, 40, 64, 96, 128};
  static const kva_dtype others[3] = {KVA_INT4, KVA_INT8, KVA_F16};
  int it, iters = kt_iters(50);
  kt_begin("int4: attention (cache, batch, per-layer and K/V mixes, latent) against fp64 on the read-back rows");
  for (it = 0; it < iters; it++) {
    i4_shape sh;
    kva_cache_desc d;
    kva_cache *c = NULL;
    kva_dtype ldt[3];
    kva_attn a;
    float *k, *v, *q, *out, *outb, *kr, *vr;
    double *kd, *vd, *qd, *od;
    int seq = -1, l, t, latent = it % 5 == 4, i;
    sh.G = latent ? 1 : kt_int(r, 1, 3), sh.H = sh.G * kt_int(r, 1, 3);
    sh.D = dims[kt_int(r, 0, 8)], sh.DV = latent ? kt_int(r, 1, sh.D) : (kt_int(r, 0, 1) ? sh.D : dims[kt_int(r, 0, 8)]);
    sh.n = kt_int(r, 1, 80), sh.n_q = kt_int(r, 1, sh.n < 5 ? sh.n : 5), sh.bs = kt_int(r, 1, 17), sh.layers = 3;
    memset(&d, 0, sizeof d);
    d.kind = latent ? KVA_CACHE_LATENT : KVA_CACHE_KV;
    d.n_layers = sh.layers, d.n_kv_heads = sh.G, d.head_dim = sh.D, d.v_dim = sh.DV;
    d.block_size = sh.bs, d.n_blocks = (sh.n + sh.bs - 1) / sh.bs * 2 + 2, d.max_seqs = 4;
    switch (it % 4) {
      case 0: d.dtype = KVA_INT4; break;
      case 1: d.dtype = KVA_INT4, d.v_dtype = others[kt_int(r, 1, 2)]; break;
      case 2: d.dtype = others[kt_int(r, 1, 2)], d.v_dtype = KVA_INT4; break;
      default: /* f16 first and last layers, INT4 between */
        ldt[0] = KVA_F16, ldt[1] = KVA_INT4, ldt[2] = KVA_F16;
        d.layer_dtype = ldt;
    }
    if (kva_cache_create(&d, &c) != KVA_OK) {
      KT_CHECK(0, "create (it %d)", it);
      continue;
    }
    k = KT_ALLOC(float, (size_t)sh.n * sh.G * sh.D);
    v = KT_ALLOC(float, (size_t)sh.n * sh.G * sh.DV);
    kr = KT_ALLOC(float, (size_t)sh.n * sh.G * sh.D);
    vr = KT_ALLOC(float, (size_t)sh.n * sh.G * sh.DV);
    q = KT_ALLOC(float, (size_t)sh.n_q * sh.H * sh.D);
    out = KT_ALLOC(float, (size_t)sh.n_q * sh.H * sh.DV);
    outb = KT_ALLOC(float, (size_t)sh.n_q * sh.H * sh.DV);
    od = KT_ALLOC(double, (size_t)sh.n_q * sh.H * sh.DV);
    kva_seq_new(c, &seq);
    memset(&a, 0, sizeof a);
    a.n_heads = sh.H, a.n_kv_heads = sh.G, a.head_dim = sh.D, a.v_dim = sh.DV, a.n_threads = 1;
    if (it % 3 == 1) a.window = kt_int(r, 1, 30), a.n_sink = kt_int(r, 0, 2);
    if (sh.n > sh.n_q) kva_seq_append(c, seq, sh.n - sh.n_q);
    /* store every layer's rows in two appends: the prefix, then the step */
    {
      float *ks[3], *vs[3];
      for (l = 0; l < sh.layers; l++) {
        ks[l] = KT_ALLOC(float, (size_t)sh.n * sh.G * sh.D);
        vs[l] = KT_ALLOC(float, (size_t)sh.n * sh.G * sh.DV);
        kt_fill(r, ks[l], (size_t)sh.n * sh.G * sh.D, -2.0f, 2.0f);
        kt_fill(r, vs[l], (size_t)sh.n * sh.G * sh.DV, -1.0f, 1.0f);
        if (sh.n > sh.n_q) kva_store(c, seq, l, ks[l], latent ? NULL : vs[l], sh.n - sh.n_q);
      }
      kva_seq_append(c, seq, sh.n_q);
      for (l = 0; l < sh.layers; l++)
        kva_store(c, seq, l, ks[l] + (size_t)(sh.n - sh.n_q) * sh.G * sh.D,
                  latent ? NULL : vs[l] + (size_t)(sh.n - sh.n_q) * sh.G * sh.DV, sh.n_q);
      for (l = 0; l < sh.layers; l++) {
        ref_attn_cfg cfg = ref_cfg(&a);
        kva_batch *plan = NULL;
        double tol, e, eb;
        kt_fill(r, q, (size_t)sh.n_q * sh.H * sh.D, -1.0f, 1.0f);
        for (t = 0; t < sh.n; t++) { /* the read-back rows (latent: V is K's first DV values) */
          float *kt = kr + (size_t)t * sh.G * sh.D;
          KT_STATUS(kva_seq_read(c, seq, l, t, kt, latent ? NULL : vr + (size_t)t * sh.G * sh.DV, NULL), KVA_OK);
          if (latent) memcpy(vr + (size_t)t * sh.DV, kt, (size_t)sh.DV * sizeof(float));
        }
        KT_STATUS(kva_attend_cache(c, seq, l, &a, q, sh.n_q, out), KVA_OK);
        KT_STATUS(kva_batch_plan(c, &a, &seq, &sh.n_q, 1, &plan), KVA_OK);
        if (plan) KT_STATUS(kva_attend_batch(c, plan, l, q, outb), KVA_OK);
        kva_batch_free(plan);
        kd = ref_dup_f(kr, (size_t)sh.n * sh.G * sh.D);
        vd = ref_dup_f(vr, (size_t)sh.n * sh.G * sh.DV);
        qd = ref_dup_f(q, (size_t)sh.n_q * sh.H * sh.D);
        ref_attend(&cfg, qd, sh.n_q, NULL, kd, vd, sh.n, NULL, od, NULL);
        tol = 2e-6 * (1.0 + sqrt((double)sh.D)) * (1.0 + ref_max_abs_d(vd, (size_t)sh.n * sh.G * sh.DV));
        e = ref_max_err(out, od, (size_t)sh.n_q * sh.H * sh.DV, NULL);
        eb = ref_max_err(outb, od, (size_t)sh.n_q * sh.H * sh.DV, NULL);
        KT_CHECK(e <= tol && eb <= tol,
                 "it %d layer %d %s H=%d G=%d D=%d DV=%d n=%d n_q=%d bs=%d win=%d: |err| cache %.3g batch %.3g > %.3g",
                 it, l, latent ? "latent" : "kv", sh.H, sh.G, sh.D, sh.DV, sh.n, sh.n_q, sh.bs, a.window, e, eb, tol);
        free(kd), free(vd), free(qd);
      }
      for (l = 0; l < sh.layers; l++) free(ks[l]), free(vs[l]);
    }
    /* a fork continues on its own copy of the shared tail */
    {
      int child = -1;
      float row[2 * 3 * 128], before[3 * 128];
      KT_STATUS(kva_seq_fork(c, seq, &child), KVA_OK);
      KT_STATUS(kva_seq_read(c, seq, 0, sh.n - 1, before, NULL, NULL), KVA_OK);
      if (kva_seq_append(c, child, 1) == KVA_OK) {
        for (i = 0; i < sh.G * sh.D; i++) row[i] = 100.0f + (float)i;
        for (l = 0; l < sh.layers; l++) kva_store(c, child, l, row, latent ? NULL : row, 1);
        KT_STATUS(kva_seq_read(c, seq, 0, sh.n - 1, row, NULL, NULL), KVA_OK);
        KT_CHECK(memcmp(row, before, (size_t)sh.G * sh.D * sizeof(float)) == 0, "the fork changed its parent's rows");
      }
      kva_seq_free(c, child);
    }
    /* a stream re-exports byte for byte */
    {
      size_t size = 0, size2 = 0;
      unsigned char *buf, *buf2;
      int imp = -1;
      KT_STATUS(kva_seq_export(c, seq, NULL, 0, &size), KVA_OK);
      buf = KT_ALLOC(unsigned char, size);
      buf2 = KT_ALLOC(unsigned char, size);
      KT_STATUS(kva_seq_export(c, seq, buf, size, &size), KVA_OK);
      if (kva_seq_import(c, buf, size, &imp) == KVA_OK) {
        KT_STATUS(kva_seq_export(c, imp, buf2, size, &size2), KVA_OK);
        KT_CHECK(size2 == size && memcmp(buf, buf2, size) == 0, "it %d: the imported INT4 sequence re-exports differently", it);
        kva_seq_free(c, imp);
      }
      free(buf), free(buf2);
    }
    kva_cache_destroy(c);
    free(k), free(v), free(kr), free(vr), free(q), free(out), free(outb), free(od);
  }
}

void test_int4(void) {
  kt_rng r;
  kt_seed(&r, 0x1a74);
  i4_readback(&r);
  i4_attention(&r);
}
