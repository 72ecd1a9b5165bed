/* bench/bench_quality.c - kvattn_bench quality, parts dtypes and calib: decode output error of
   each storage dtype (F16, BF16, INT8, INT4, FP8) against F32 storage and an fp64 reference; FP8 scale calibration rules
   (kva_fp8_calibrate) and the output error each gives. Eviction is in bench_quality_evict.c. */
#include "harness.h"

/* =====================================================================
   dtypes: output error of each storage dtype against F32 storage and fp64
   ===================================================================== */

enum { PAT_RANDOM, PAT_HEAVY, PAT_OUTLIER, NPAT };
static const char *pat_name[NPAT] = {"random", "heavy-hitter", "outlier-K"};

/* fills k [n][G][D], v [n][G][DV] (NULL for latent), q [T][H][D]; heavy: the set of heavy tokens */
static void gen_pattern(int pat, const shape *s, long n, int T, float *k, float *v, float *q, unsigned char *heavy,
                        uint64_t *rng) {
  size_t i, nk = (size_t)n * s->G * s->D, nv = (size_t)n * s->G * s->DV, nq = (size_t)T * s->H * s->D;
  int R = s->H / s->G, D = s->D;
  for (i = 0; i < nk; i++) k[i] = (float)rng_gauss(rng);
  if (v)
    for (i = 0; i < nv; i++) v[i] = (float)rng_gauss(rng);
  for (i = 0; i < nq; i++) q[i] = (float)rng_gauss(rng);
  memset(heavy, 0, (size_t)n);
  if (pat == PAT_HEAVY) {
    /* per KV head a direction u; queries lean on u, 1% of the keys (and the 4 first,
       "sinks") carry b*u: those keys get scores ~+8 above the rest */
    int g, d, t2, h;
    double a = sqrt((double)D), b = 8.0 * sqrt((double)D) / a; /* heavy score ~ a*b/sqrt(D) = 8 */
    long j;
    for (j = 0; j < n; j++) heavy[j] = j < 4 || rng_unif(rng) < 0.01;
    double *u = (double *)xalloc((size_t)D * sizeof(double));
    for (g = 0; g < s->G; g++) {
      double nrm = 0;
      for (d = 0; d < D; d++) { u[d] = rng_gauss(rng); nrm += u[d] * u[d]; }
      nrm = sqrt(nrm);
      for (d = 0; d < D; d++) u[d] /= nrm;
      for (j = 0; j < n; j++)
        if (heavy[j])
          for (d = 0; d < D; d++) k[((size_t)j * s->G + g) * D + d] += (float)(b * u[d]);
      for (t2 = 0; t2 < T; t2++)
        for (h = g * R; h < (g + 1) * R; h++)
          for (d = 0; d < D; d++) q[((size_t)t2 * s->H + h) * D + d] += (float)(a * u[d]);
    }
    free(u);
  } else if (pat == PAT_OUTLIER) {
    /* LLM-like keys: 4 channels of every key are large (~20) and consistent */
    static const int ch[4] = {3, 17, 60, 101};
    long j;
    int g, c;
    for (j = 0; j < n; j++)
      for (g = 0; g < s->G; g++)
        for (c = 0; c < 4; c++)
          if (ch[c] < D) k[((size_t)j * s->G + g) * D + ch[c]] = (float)(20.0 * (1.0 + 0.1 * rng_gauss(rng)));
  }
}

/* fp64 decode reference for the last position; out [H][DV]; mass: softmax mass on heavy tokens */
static void ref_decode(const shape *s, long n, const float *k, const float *v, const float *q, float scale,
                       double *out, double *scores, const unsigned char *heavy, double *mass) {
  int h, R = s->H / s->G;
  long j;
  double msum = 0;
  for (h = 0; h < s->H; h++) {
    int g = h / R, d;
    double mx = -INFINITY, sum = 0, hm = 0;
    const float *qh = q + (size_t)h * s->D;
    for (j = 0; j < n; j++) {
      const float *kj = k + ((size_t)j * s->G + g) * s->D;
      double dot = 0;
      for (d = 0; d < s->D; d++) dot += (double)qh[d] * kj[d];
      scores[j] = dot * scale;
      if (scores[j] > mx) mx = scores[j];
    }
    for (d = 0; d < s->DV; d++) out[(size_t)h * s->DV + d] = 0;
    for (j = 0; j < n; j++) {
      const float *vj = v ? v + ((size_t)j * s->G + g) * s->DV : k + ((size_t)j * s->G + g) * s->D;
      double p = exp(scores[j] - mx);
      sum += p;
      if (heavy[j]) hm += p;
      for (d = 0; d < s->DV; d++) out[(size_t)h * s->DV + d] += p * vj[d];
    }
    for (d = 0; d < s->DV; d++) out[(size_t)h * s->DV + d] /= sum;
    msum += hm / sum;
  }
  *mass = msum / s->H;
}

typedef struct {
  double se, sr, mx; /* sum sq err, sum sq ref, max abs err */
} errstat;

static void err_add(errstat *e, const float *x, const double *ref, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) {
    double d = (double)x[i] - ref[i];
    e->se += d * d;
    e->sr += ref[i] * ref[i];
    if (fabs(d) > e->mx) e->mx = fabs(d);
  }
}

/* rows the dtypes table repeats with rotated keys: quantized types of a KV cache */
static int rotatable(kva_dtype dt, const shape *s) {
  return s->kind == KVA_CACHE_KV && (dt == KVA_INT8 || dt == KVA_INT4 || dt == KVA_FP8_E4M3 || dt == KVA_FP8_E5M2);
}

void quality_dtypes(const opts *o, const machine *m) {
  rows t = {0};
  int vi, pi, ci, di, tr, rot;
  uint64_t rng = o->seed + 3;
  (void)m;
  for (vi = 0; vi < o->n_variants; vi++) {
    shape s = variant_shape(o->variants[vi], o->H, o->G, o->D);
    kva_attn a = shape_attn(&s, 0);
    float scale = a.scale != 0.0f ? a.scale : (float)(1.0 / sqrt((double)s.D));
    for (pi = 0; pi < NPAT; pi++)
      for (ci = 0; ci < o->n_ctx; ci++) {
        long n = o->ctx[ci];
        int T = o->trials;
        size_t nk = (size_t)n * s.G * s.D, nv = (size_t)n * s.G * s.DV, no = (size_t)s.H * s.DV;
        float *k = (float *)xalloc(nk * 4), *v = s.kind == KVA_CACHE_LATENT ? NULL : (float *)xalloc(nv * 4);
        float *q = (float *)xalloc((size_t)T * s.H * s.D * 4), *o32 = (float *)xalloc((size_t)T * no * 4),
              *ox = (float *)xalloc(no * 4);
        double *ref = (double *)xalloc((size_t)T * no * 8), *sc = (double *)xalloc((size_t)n * 8), mass = 0, m1;
        unsigned char *heavy = (unsigned char *)xalloc((size_t)n);
        float kmax = 0, vmax = 0;
        size_t i;
        progress("quality %s %s ctx=%ld: reference", variant_name[s.var], pat_name[pi], n);
        gen_pattern(pi, &s, n, T, k, v, q, heavy, &rng);
        for (i = 0; i < nk; i++) if (fabsf(k[i]) > kmax) kmax = fabsf(k[i]);
        for (i = 0; v && i < nv; i++) if (fabsf(v[i]) > vmax) vmax = fabsf(v[i]);
        if (!v) vmax = kmax;
        for (tr = 0; tr < T; tr++) {
          ref_decode(&s, n, k, v, q + (size_t)tr * s.H * s.D, scale, ref + (size_t)tr * no, sc, heavy, &m1);
          mass += m1 / T;
        }
        /* f32 storage first: the baseline of every other dtype */
        /* each quantized type also with rotated keys (a KV cache's rotate = KVA_ROTATE_K), after it */
        for (di = -1; di < o->n_dtypes; di++)
          for (rot = 0; rot < (di >= 0 && rotatable(o->dtypes[di], &s) ? 2 : 1); rot++) {
          kva_dtype dt = di < 0 ? KVA_F32 : o->dtypes[di];
          kva_cache *c = NULL;
          int seq;
          kva_status st;
          errstat e = {0, 0, 0}, e64 = {0, 0, 0};
          row *w;
          if (di >= 0 && dt == KVA_F32) continue;
          progress("quality %s %s ctx=%ld: %s%s", variant_name[s.var], pat_name[pi], n, kva_dtype_name(dt),
                   rot ? " rotated K" : "");
          /* FP8 scale: vLLM's "calculate" rule, max|k|/200 and max|v|/100 */
          g_build_rotate = rot ? KVA_ROTATE_K : 0;
          st = build_cache(&s, dt, n, 1, 16, 0, kmax / 200.0f, vmax / 100.0f, k, v, &rng, &c, &seq);
          g_build_rotate = 0;
          w = rows_add(&t, "quality");
          set_shape_cols(w, &s, dt);
          if (rot) rs(w, C_DTYPE, "%s rotK", kva_dtype_name(dt));
          rs(w, C_PATTERN, "%s", pat_name[pi]);
          rn(w, C_CTX, (double)n);
          rn(w, C_NQ, T);
          if (pi == PAT_HEAVY) rn(w, C_MASS, mass);
          if (st != KVA_OK) {
            rs(w, C_NOTE, st == KVA_ERR_UNSUPPORTED ? "unsupported" : "cache: %s", kva_status_str(st));
            if (st != KVA_ERR_UNSUPPORTED) g_failed = 1;
            continue;
          }
          for (tr = 0; tr < T; tr++) {
            float *dst = di < 0 ? o32 + (size_t)tr * no : ox;
            if ((st = kva_attend_cache(c, seq, 0, &a, q + (size_t)tr * s.H * s.D, 1, dst)) != KVA_OK) break;
            err_add(&e64, dst, ref + (size_t)tr * no, no);
            if (di >= 0) {
              double tmp[4096];
              size_t off;
              for (off = 0; off < no; off += 4096) { /* against the f32 storage's output */
                size_t m = no - off < 4096 ? no - off : 4096, z;
                for (z = 0; z < m; z++) tmp[z] = o32[(size_t)tr * no + off + z];
                err_add(&e, ox + off, tmp, m);
              }
            }
          }
          kva_cache_destroy(c);
          if (st != KVA_OK) {
            rs(w, C_NOTE, "attend: %s", kva_status_str(st));
            g_failed = 1;
            continue;
          }
          if (di < 0) {
            rs(w, C_NOTE, "the baseline: f32 storage vs the fp64 reference");
          } else {
            rn(w, C_MAXABS, e.mx);
            rn(w, C_RELRMS, sqrt(e.se / e.sr));
          }
          rn(w, C_MAXABS64, e64.mx);
          rn(w, C_RELRMS64, sqrt(e64.se / e64.sr));
          if ((dt == KVA_FP8_E4M3 || dt == KVA_FP8_E5M2) && s.kind == KVA_CACHE_LATENT)
            rs(w, C_NOTE, "scale max|latent|/200 = %.3g (a latent cache has one scale)", kmax / 200.0f);
          else if (dt == KVA_FP8_E4M3 || dt == KVA_FP8_E5M2)
            rs(w, C_NOTE, "scales max|k|/200 = %.3g, max|v|/100 = %.3g", kmax / 200.0f, vmax / 100.0f);
          else if (dt == KVA_INT4)
            rs(w, C_NOTE, "4-bit codes, a scale and a minimum per 32 values (no tensor scale)");
        }
        free(k); free(v); free(q); free(o32); free(ox); free(ref); free(sc); free(heavy);
      }
  }
  progress_end();
  {
    static const vcol v[] = {{C_VARIANT, "variant", FM_STR},  {C_PATTERN, "pattern", FM_STR},
                             {C_CTX, "ctx", FM_SEP},          {C_DTYPE, "storage", FM_STR},
                             {C_MAXABS, "max|err| vs f32", FM_E}, {C_RELRMS, "rel RMS vs f32", FM_E},
                             {C_MAXABS64, "max|err| vs fp64", FM_E}, {C_RELRMS64, "rel RMS vs fp64", FM_E},
                             {C_MASS, "heavy mass", FM_PCT},  {C_NOTE, "note", FM_STR}};
    char title[600];
    snprintf(title, sizeof title,
             "Quality: decode output (n_q=1 at the last position, %d random queries) with K/V stored as each dtype,\n"
             "  against the same data stored as f32 and against an fp64 reference (H=%d G=%d D=%d; MLA: one latent\n"
             "  head of %d+%d, V = its first %d). Patterns: random N(0,1); heavy-hitter: 1%% of keys + 4 sinks score\n"
             "  ~8 higher (heavy mass = their softmax share); outlier-K: 4 key channels ~20 (as in real LLM keys).\n"
             "  rel RMS = ||out - ref|| / ||ref|| over all heads and queries. rotK: the same type with keys stored\n"
             "  rotated (kva_cache_desc.rotate = KVA_ROTATE_K; FP8 keeps the unrotated keys' scale).",
             o->trials, o->H, o->G, o->D, 4 * o->D, o->D / 2, 4 * o->D);
    print_table(title, v, NV(v), &t, C_VARIANT);
  }
  emit_rows(&t);
  rows_free(&t);
}

/* The summary's accuracy column: GQA decode (o->H, o->G, o->D, n_q=1) over n tokens of
   outlier-channel keys (the outlier-K pattern), T random queries; per dtype the relative RMS error
   of the output against the same K/V stored as f32 (FP8 scales by vLLM's rule, as in the dtypes
   part). int_ops[i]: INT_SCORES and / or INT_VALUES (kva_attn.int_scores, int_values), or NULL.
   rel[i] < 0: not measured (the error is reported and counted as a failure). */
void quality_dtype_errors(const opts *o, const kva_dtype *dts, const int *int_ops, const int *rotate, int n_dt,
                          long n, int T, double *rel) {
  shape s = variant_shape(V_GQA, o->H, o->G, o->D);
  kva_attn a = shape_attn(&s, 1);
  size_t nk = (size_t)n * s.G * s.D, nv = (size_t)n * s.G * s.DV, no = (size_t)s.H * s.DV, i;
  float *k = (float *)xalloc(nk * 4), *v = (float *)xalloc(nv * 4), *q = (float *)xalloc((size_t)T * s.H * s.D * 4);
  float *ref = (float *)xalloc((size_t)T * no * 4), *ox = (float *)xalloc(no * 4), kmax = 0, vmax = 0;
  unsigned char *heavy = (unsigned char *)xalloc((size_t)n);
  uint64_t rng = o->seed + 51;
  int di, tr, seq;
  kva_cache *c = NULL;
  kva_status st;
  progress("accuracy: %ld tokens of outlier-channel keys, the f32 reference", n);
  gen_pattern(PAT_OUTLIER, &s, n, T, k, v, q, heavy, &rng);
  for (i = 0; i < nk; i++) if (fabsf(k[i]) > kmax) kmax = fabsf(k[i]);
  for (i = 0; i < nv; i++) if (fabsf(v[i]) > vmax) vmax = fabsf(v[i]);
  st = build_cache(&s, KVA_F32, n, 1, 16, 0, 1.0f, 1.0f, k, v, &rng, &c, &seq);
  for (tr = 0; tr < T && st == KVA_OK; tr++)
    st = kva_attend_cache(c, seq, 0, &a, q + (size_t)tr * s.H * s.D, 1, ref + (size_t)tr * no);
  if (c) kva_cache_destroy(c);
  for (di = 0; di < n_dt; di++) {
    errstat e = {0, 0, 0};
    rel[di] = -1;
    if (st != KVA_OK) continue;
    kva_attn ai = a;
    progress("accuracy: %s%s%s%s", kva_dtype_name(dts[di]), int_ops && int_ops[di] & INT_SCORES ? "+iq" : "",
             int_ops && int_ops[di] & INT_VALUES ? "+iv" : "", rotate && rotate[di] ? " rot" : "");
    c = NULL;
    ai.int_scores = int_ops && int_ops[di] & INT_SCORES ? 1 : 0;
    ai.int_values = int_ops && int_ops[di] & INT_VALUES ? 1 : 0;
    g_build_rotate = rotate ? rotate[di] : 0;
    st = build_cache(&s, dts[di], n, 1, 16, 0, kmax / 200.0f, vmax / 100.0f, k, v, &rng, &c, &seq);
    g_build_rotate = 0;
    if (st != KVA_OK) {
      st = KVA_OK; /* this configuration's error stays unknown (-1); the next one may build */
      continue;
    }
    for (tr = 0; tr < T; tr++) {
      double tmp[4096];
      size_t off, z;
      if (kva_attend_cache(c, seq, 0, &ai, q + (size_t)tr * s.H * s.D, 1, ox) != KVA_OK) break;
      for (off = 0; off < no; off += 4096) {
        size_t m = no - off < 4096 ? no - off : 4096;
        for (z = 0; z < m; z++) tmp[z] = ref[(size_t)tr * no + off + z];
        err_add(&e, ox + off, tmp, m);
      }
    }
    kva_cache_destroy(c);
    if (tr == T && e.sr > 0) rel[di] = sqrt(e.se / e.sr);
  }
  progress_end();
  for (di = 0; di < n_dt; di++)
    if (rel[di] < 0) {
      fprintf(stderr, "kvattn_bench: accuracy of %s: %s\n", kva_dtype_name(dts[di]),
              st != KVA_OK ? kva_status_str(st) : "the cache or the decode call failed");
      g_failed = 1;
    }
  free(k); free(v); free(q); free(ref); free(ox); free(heavy);
}

/* =====================================================================
   calib: FP8 scale calibration rules (kva_fp8_calibrate)
   ===================================================================== */

/* x -> fp8(x / scale) -> back, as the cache stores it (the bulk converters): relative RMS error
   of the round trip and the share of values beyond the format's largest finite (saturated) */
static void fp8_roundtrip(kva_dtype fmt, const float *x, size_t n, float scale, double *rel_rms, double *sat) {
  float buf[4096], inv = 1.0f / scale;
  uint8_t codes[4096];
  const double fmax = fmt == KVA_FP8_E4M3 ? 448.0 : 57344.0;
  double se = 0, sr = 0;
  size_t off, i, n_sat = 0;
  for (off = 0; off < n; off += 4096) {
    size_t m = n - off < 4096 ? n - off : 4096;
    for (i = 0; i < m; i++) {
      buf[i] = x[off + i] * inv;
      n_sat += fabs((double)buf[i]) > fmax;
    }
    if (fmt == KVA_FP8_E4M3) {
      kva_f32_to_e4m3_n(codes, buf, m);
      kva_e4m3_to_f32_n(buf, codes, m);
    } else {
      kva_f32_to_e5m2_n(codes, buf, m);
      kva_e5m2_to_f32_n(buf, codes, m);
    }
    for (i = 0; i < m; i++) {
      double d = (double)buf[i] * scale - x[off + i];
      se += d * d;
      sr += (double)x[off + i] * x[off + i];
    }
  }
  *rel_rms = sr > 0 ? sqrt(se / sr) : 0;
  *sat = n ? (double)n_sat / (double)n : 0;
}

enum { CAL_NONE, CAL_ABSMAX, CAL_VLLM, CAL_MSE, NCAL };
enum { TEN_K, TEN_V, TEN_KV, NTEN };

void quality_calib(const opts *o, const machine *m) {
  static const kva_dtype fmts[2] = {KVA_FP8_E4M3, KVA_FP8_E5M2};
  static const char *ten_name[NTEN] = {"K (outlier ch.)", "V", "K+V"};
  rows t = {0};
  shape s = variant_shape(V_GQA, o->H, o->G, o->D);
  kva_attn a = shape_attn(&s, 0);
  long n = o->ctx[0];
  int T = o->trials, fi, te, ru, tr, seq;
  size_t nk = (size_t)n * s.G * s.D, nv = (size_t)n * s.G * s.DV, no = (size_t)s.H * s.DV;
  float *k = (float *)xalloc(nk * 4), *v = (float *)xalloc(nv * 4), *q = (float *)xalloc((size_t)T * s.H * s.D * 4);
  float *ref = (float *)xalloc((size_t)T * no * 4), *ox = (float *)xalloc(no * 4);
  unsigned char *heavy = (unsigned char *)xalloc((size_t)n);
  uint64_t rng = o->seed + 41;
  kva_cache *c = NULL;
  kva_status st;
  char title[1400];
  (void)m;
  progress("quality calib: data and the f32 reference");
  gen_pattern(PAT_OUTLIER, &s, n, T, k, v, q, heavy, &rng);
  st = build_cache(&s, KVA_F32, n, 1, 16, 0, 1.0f, 1.0f, k, v, &rng, &c, &seq);
  for (tr = 0; tr < T && st == KVA_OK; tr++)
    st = kva_attend_cache(c, seq, 0, &a, q + (size_t)tr * s.H * s.D, 1, ref + (size_t)tr * no);
  if (c) kva_cache_destroy(c);
  if (st != KVA_OK) {
    row *w = rows_add(&t, "calib");
    rs(w, C_NOTE, "ERROR f32 reference: %s", kva_status_str(st));
    g_failed = 1;
  }
  for (fi = 0; fi < 2 && st == KVA_OK; fi++) {
    kva_dtype fmt = fmts[fi];
    float scale[2][NCAL]; /* [K, V][rule] */
    double rt[2][NCAL], sat[2][NCAL];
    for (te = 0; te < 2; te++)
      for (ru = 0; ru < NCAL; ru++) {
        const float *x = te ? v : k;
        size_t nx = te ? nv : nk;
        kva_calib rule = ru == CAL_ABSMAX ? KVA_CALIB_ABSMAX
                         : ru == CAL_VLLM ? (te ? KVA_CALIB_VLLM_V : KVA_CALIB_VLLM_K)
                                          : KVA_CALIB_MSE;
        kva_status cs = KVA_OK;
        scale[te][ru] = 1.0f;
        if (ru != CAL_NONE) cs = kva_fp8_calibrate(fmt, x, nx, rule, &scale[te][ru]);
        if (cs != KVA_OK || !(scale[te][ru] > 0)) {
          row *w = rows_add(&t, "calib");
          rs(w, C_DTYPE, "%s", kva_dtype_name(fmt));
          rs(w, C_NOTE, "ERROR kva_fp8_calibrate: %s (scale %g)", kva_status_str(cs), scale[te][ru]);
          g_failed = 1;
          scale[te][ru] = 1.0f;
        }
        fp8_roundtrip(fmt, x, nx, scale[te][ru], &rt[te][ru], &sat[te][ru]);
      }
    for (te = 0; te < NTEN; te++) {
      double err[NCAL];
      int first = t.n, best = -1;
      for (ru = 0; ru < NCAL; ru++) {
        row *w = rows_add(&t, "calib");
        kva_dtype kd = te == TEN_V ? KVA_F32 : fmt, vd = te == TEN_K ? KVA_F32 : fmt;
        float ks = te == TEN_V ? 1.0f : scale[0][ru], vs = te == TEN_K ? 1.0f : scale[1][ru];
        errstat e = {0, 0, 0};
        size_t z;
        progress("quality calib: %s %s %s", kva_dtype_name(fmt), ten_name[te],
                 ru == CAL_NONE ? "1.0" : ru == CAL_ABSMAX ? "absmax" : ru == CAL_VLLM ? "vllm" : "mse");
        set_shape_cols(w, &s, fmt);
        rs(w, C_PATTERN, "outlier-K");
        rs(w, C_TENSOR, "%s", ten_name[te]);
        rs(w, C_RULE, "%s", ru == CAL_NONE ? "none (1.0)" : ru == CAL_ABSMAX ? "ABSMAX" : ru == CAL_MSE ? "MSE"
                            : te == TEN_K ? "VLLM_K (/200)" : te == TEN_V ? "VLLM_V (/100)" : "VLLM_K / VLLM_V");
        rn(w, C_CTX, (double)n);
        rn(w, C_NQ, T);
        if (te != TEN_KV) {
          rn(w, C_SCALE, scale[te][ru]);
          rn(w, C_RTRMS, rt[te][ru]);
          rn(w, C_SAT, sat[te][ru]);
        } else {
          rs(w, C_NOTE, "scales K %.3g, V %.3g", scale[0][ru], scale[1][ru]);
        }
        err[ru] = -1;
        st = build_cache_kv(&s, kd, vd, n, 1, 16, 0, ks, vs, k, v, &rng, &c, &seq);
        if (st != KVA_OK) {
          rs(w, C_NOTE, st == KVA_ERR_UNSUPPORTED ? "unsupported" : "cache: %s", kva_status_str(st));
          if (st != KVA_ERR_UNSUPPORTED) g_failed = 1;
          st = KVA_OK;
          continue;
        }
        for (tr = 0; tr < T && st == KVA_OK; tr++) {
          double tmp[4096];
          size_t off;
          st = kva_attend_cache(c, seq, 0, &a, q + (size_t)tr * s.H * s.D, 1, ox);
          for (off = 0; off < no && st == KVA_OK; off += 4096) {
            size_t m = no - off < 4096 ? no - off : 4096;
            for (z = 0; z < m; z++) tmp[z] = ref[(size_t)tr * no + off + z];
            err_add(&e, ox + off, tmp, m);
          }
        }
        kva_cache_destroy(c);
        c = NULL;
        if (st != KVA_OK) {
          rs(w, C_NOTE, "attend: %s", kva_status_str(st));
          g_failed = 1;
          st = KVA_OK;
          continue;
        }
        err[ru] = sqrt(e.se / e.sr);
        rn(w, C_RELRMS, err[ru]);
        rn(w, C_MAXABS, e.mx);
        if (best < 0 || err[ru] < err[best]) best = ru;
      }
      for (ru = 0; ru < NCAL; ru++) {
        row *w = &t.r[first + ru];
        if (err[ru] < 0) continue;
        if (err[CAL_VLLM] > 0) rn(w, C_RATIO, err[ru] / err[CAL_VLLM]);
        if (best >= 0 && err[ru] == err[best]) rs(w, C_PASS, "best"); /* ties: every rule with that error */
      }
    }
  }
  progress_end();
  if (g_fmt == OUT_TABLE) {
    static const vcol vv[] = {{C_DTYPE, "format", FM_STR},         {C_TENSOR, "FP8 tensor", FM_STR},
                              {C_RULE, "rule", FM_STR},            {C_SCALE, "scale", FM_G3},
                              {C_SAT, "saturated", FM_PCT},        {C_RTRMS, "round trip rel RMS", FM_E},
                              {C_RELRMS, "out rel RMS vs f32", FM_E}, {C_MAXABS, "out max|err|", FM_E},
                              {C_RATIO, "vs vLLM", FM_X},          {C_PASS, "", FM_STR},
                              {C_NOTE, "note", FM_STR}};
    snprintf(title, sizeof title,
             "FP8 scale calibration (kva_fp8_calibrate on the whole tensor): GQA H=%d G=%d D=%d, %ld tokens; K with\n"
             "  4 outlier channels (~20, the rest N(0,1)), V N(0,1). Rules: none = 1.0 (vLLM's silent default),\n"
             "  ABSMAX = max|x|/format max (448, 57344), VLLM = max|x|/200 (K) and /100 (V), MSE = the library's\n"
             "  least round-trip squared error. saturated = share of values beyond the format's range at that scale;\n"
             "  round trip = ||fp8(x/scale)*scale - x|| / ||x||. Output: decode (n_q=1, %d random queries) with only\n"
             "  that tensor in FP8 (the other f32; K+V: both, each with its rule) against the same data in f32;\n"
             "  vs vLLM = output error / the VLLM rule's (below 1: better than vLLM); best = the least output error.",
             o->H, o->G, o->D, n, T);
    print_table(title, vv, NV(vv), &t, C_DTYPE);
  }
  emit_rows(&t);
  rows_free(&t);
  free(k); free(v); free(q); free(ref); free(ox); free(heavy);
}


/* =====================================================================
   scales: one FP8 scale per cache, per layer, or per layer and KV head,
   on K/V whose layers (and heads) differ in range
   ===================================================================== */

enum { SC_ONE, SC_LAYER, SC_HEAD, NSC };

/* An L-layer cache of fmt (scales by `how`, from the MSE rule), every layer's
   decode output against the f32 cache's: *mean and *worst relative RMS over layers. */
static kva_status scales_run(const shape *s, int L, long n, int T, kva_dtype fmt, int how, const float *k,
                             const float *v, const float *q, const float *ref, double *mean, double *worst,
                             float *range_lo, float *range_hi) {
  size_t per_k = (size_t)n * s->G * s->D, per_v = (size_t)n * s->G * s->DV, no = (size_t)s->H * s->DV;
  float *lk = (float *)xalloc(sizeof(float) * (size_t)L), *lv = (float *)xalloc(sizeof(float) * (size_t)L);
  float *hk = (float *)xalloc(sizeof(float) * (size_t)L * s->G), *hv = (float *)xalloc(sizeof(float) * (size_t)L * s->G);
  float *ox = (float *)xalloc(no * 4);
  kva_cache_desc d;
  kva_attn a = shape_attn(s, 0);
  kva_cache *c = NULL;
  kva_status st = KVA_OK;
  int l, tr, seq = -1, i;
  memset(&d, 0, sizeof d);
  d.n_layers = L, d.n_kv_heads = s->G, d.head_dim = s->D, d.v_dim = s->DV;
  d.n_blocks = (int)(n / 16 + 2), d.dtype = fmt;
  if (how == SC_ONE) {
    st = kva_fp8_calibrate(fmt, k, per_k * (size_t)L, KVA_CALIB_MSE, &d.k_scale);
    if (st == KVA_OK) st = kva_fp8_calibrate(fmt, v, per_v * (size_t)L, KVA_CALIB_MSE, &d.v_scale);
    *range_lo = *range_hi = d.k_scale;
  }
  for (l = 0; l < L && st == KVA_OK && how != SC_ONE; l++) {
    if (how == SC_LAYER) {
      st = kva_fp8_calibrate(fmt, k + (size_t)l * per_k, per_k, KVA_CALIB_MSE, &lk[l]);
      if (st == KVA_OK) st = kva_fp8_calibrate(fmt, v + (size_t)l * per_v, per_v, KVA_CALIB_MSE, &lv[l]);
    } else {
      st = kva_fp8_calibrate_heads(fmt, k + (size_t)l * per_k, (int)n, s->G, s->D, KVA_CALIB_MSE, hk + (size_t)l * s->G);
      if (st == KVA_OK)
        st = kva_fp8_calibrate_heads(fmt, v + (size_t)l * per_v, (int)n, s->G, s->DV, KVA_CALIB_MSE,
                                     hv + (size_t)l * s->G);
    }
  }
  if (how == SC_LAYER) d.layer_k_scale = lk, d.layer_v_scale = lv;
  if (how == SC_HEAD) d.head_k_scale = hk, d.head_v_scale = hv;
  if (how != SC_ONE) {
    const float *x = how == SC_LAYER ? lk : hk;
    int nx = how == SC_LAYER ? L : L * s->G;
    *range_lo = *range_hi = x[0];
    for (i = 1; i < nx; i++) {
      if (x[i] < *range_lo) *range_lo = x[i];
      if (x[i] > *range_hi) *range_hi = x[i];
    }
  }
  if (st == KVA_OK) st = kva_cache_create(&d, &c);
  if (st == KVA_OK) st = kva_seq_new(c, &seq);
  if (st == KVA_OK) st = kva_seq_append(c, seq, (int)n);
  for (l = 0; l < L && st == KVA_OK; l++)
    st = kva_store(c, seq, l, k + (size_t)l * per_k, v + (size_t)l * per_v, (int)n);
  *mean = *worst = 0;
  for (l = 0; l < L && st == KVA_OK; l++) {
    errstat e = {0, 0, 0};
    double tmp[4096], err;
    size_t z;
    for (tr = 0; tr < T && st == KVA_OK; tr++) {
      const float *rr = ref + ((size_t)l * T + (size_t)tr) * no;
      st = kva_attend_cache(c, seq, l, &a, q + ((size_t)l * T + (size_t)tr) * s->H * s->D, 1, ox);
      for (z = 0; z < no && z < 4096; z++) tmp[z] = rr[z];
      if (st == KVA_OK) err_add(&e, ox, tmp, no < 4096 ? no : 4096);
    }
    err = e.sr > 0 ? sqrt(e.se / e.sr) : 0;
    *mean += err / L;
    if (err > *worst) *worst = err;
  }
  kva_cache_destroy(c);
  free(lk), free(lv), free(hk), free(hv), free(ox);
  return st;
}

void quality_scales(const opts *o, const machine *m) {
  static const kva_dtype fmts[2] = {KVA_FP8_E4M3, KVA_FP8_E5M2};
  static const char *how_name[NSC] = {"one per cache", "per layer", "per layer and KV head"};
  enum { L = 6 };
  rows t = {0};
  shape s = variant_shape(V_GQA, o->H, o->G, o->D);
  long n = o->ctx[0] < 2048 ? o->ctx[0] : 2048;
  int T = o->trials < 8 ? o->trials : 8, l, g, tr, fi, how, seq = -1;
  size_t per_k = (size_t)n * s.G * s.D, per_v = (size_t)n * s.G * s.DV, no = (size_t)s.H * s.DV, i;
  float *k = (float *)xalloc(per_k * L * 4), *v = (float *)xalloc(per_v * L * 4);
  float *q = (float *)xalloc((size_t)L * T * s.H * s.D * 4), *ref = (float *)xalloc((size_t)L * T * no * 4);
  uint64_t rng = o->seed + 43;
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_attn a = shape_attn(&s, 0);
  kva_status st;
  char title[1200];
  (void)m;
  if (s.DV > 4096 / 1 || no > 4096) {
    free(k), free(v), free(q), free(ref);
    return;
  }
  progress("quality scales: data and the f32 reference");
  /* layer l spans 8^(l - 3) (1/512 .. 64: more than E4M3's normal range, 2^-6 .. 448), KV head g a
     further 1 + g/2; trained models' layers differ less (their checkpoints still ship a scale per layer)
     */
  for (l = 0; l < L; l++)
    for (i = 0; i < (size_t)n; i++)
      for (g = 0; g < s.G; g++) {
        double amp = pow(8.0, l - 3) * (1.0 + 0.5 * g);
        size_t j;
        for (j = 0; j < (size_t)s.D; j++) k[(size_t)l * per_k + (i * s.G + g) * s.D + j] = (float)(amp * rng_gauss(&rng));
        for (j = 0; j < (size_t)s.DV; j++) v[(size_t)l * per_v + (i * s.G + g) * s.DV + j] = (float)(amp * rng_gauss(&rng));
      }
  for (i = 0; i < (size_t)L * T * s.H * s.D; i++) q[i] = (float)rng_gauss(&rng);
  memset(&d, 0, sizeof d);
  d.n_layers = L, d.n_kv_heads = s.G, d.head_dim = s.D, d.v_dim = s.DV, d.n_blocks = (int)(n / 16 + 2);
  d.dtype = KVA_F32;
  st = kva_cache_create(&d, &c);
  if (st == KVA_OK) st = kva_seq_new(c, &seq);
  if (st == KVA_OK) st = kva_seq_append(c, seq, (int)n);
  for (l = 0; l < L && st == KVA_OK; l++) st = kva_store(c, seq, l, k + (size_t)l * per_k, v + (size_t)l * per_v, (int)n);
  for (l = 0; l < L && st == KVA_OK; l++)
    for (tr = 0; tr < T && st == KVA_OK; tr++) {
      /* scores scaled back to ~N(0,1) per layer: the queries carry 1 / the layer's key range */
      float *qq = q + ((size_t)l * T + (size_t)tr) * s.H * s.D;
      size_t z;
      for (z = 0; z < (size_t)s.H * s.D; z++) qq[z] /= (float)pow(8.0, l - 3);
      st = kva_attend_cache(c, seq, l, &a, qq, 1, ref + ((size_t)l * T + (size_t)tr) * no);
    }
  kva_cache_destroy(c);
  if (st != KVA_OK) {
    row *w = rows_add(&t, "scales");
    rs(w, C_NOTE, "ERROR f32 reference: %s", kva_status_str(st));
    g_failed = 1;
  }
  for (fi = 0; fi < 2 && st == KVA_OK; fi++) {
    double one = 0;
    for (how = 0; how < NSC; how++) {
      row *w = rows_add(&t, "scales");
      double mean, worst;
      float lo, hi;
      kva_status rs_st;
      progress("quality scales: %s %s", kva_dtype_name(fmts[fi]), how_name[how]);
      set_shape_cols(w, &s, fmts[fi]);
      rs(w, C_RULE, "%s", how_name[how]);
      rn(w, C_CTX, (double)n);
      rn(w, C_NQ, T);
      rs_st = scales_run(&s, L, n, T, fmts[fi], how, k, v, q, ref, &mean, &worst, &lo, &hi);
      if (rs_st != KVA_OK) {
        rs(w, C_NOTE, "ERROR %s", kva_status_str(rs_st));
        g_failed = 1;
        continue;
      }
      if (how == SC_ONE) one = mean;
      rn(w, C_RELRMS, mean);
      rn(w, C_MAXABS, worst);
      if (one > 0) rn(w, C_RATIO, mean / one);
      rs(w, C_NOTE, lo == hi ? "K scale %.3g" : "K scales %.3g-%.3g", (double)lo, (double)hi);
    }
  }
  progress_end();
  if (g_fmt == OUT_TABLE) {
    static const vcol vv[] = {{C_DTYPE, "format", FM_STR},        {C_RULE, "FP8 scales", FM_STR},
                              {C_RELRMS, "out rel RMS (mean of layers)", FM_E},
                              {C_MAXABS, "worst layer", FM_E},   {C_RATIO, "vs one scale", FM_X},
                              {C_NOTE, "note", FM_STR}};
    snprintf(title, sizeof title,
             "FP8 scales per cache, per layer, per layer and KV head (kva_cache_desc.layer_k_scale / head_k_scale,\n"
             "  kva_fp8_calibrate / kva_fp8_calibrate_heads, MSE rule): %d layers of GQA H=%d G=%d D=%d, %ld tokens;\n"
             "  layer l's K and V ~ N(0, 8^(l-3)) (1/512 .. 64), KV head g x(1 + g/2). Decode (n_q=1, %d queries per\n"
             "  layer) against the f32 cache; vs one scale = mean error / the one-scale cache's.",
             L, o->H, o->G, o->D, n, T);
    print_table(title, vv, NV(vv), &t, C_DTYPE);
  }
  emit_rows(&t);
  rows_free(&t);
  free(k), free(v), free(q), free(ref);
}
