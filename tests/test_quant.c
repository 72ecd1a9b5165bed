/* test_quant.c - FP8 conversions and the quantized cache dtypes (INT8, FP8 E4M3 / E5M2).
 *
 * The FP8 reference below is written from the OCP 8-bit floating point
 * specification (OFP8, rev 1.0), not from kvattn.h:
 *   E4M3FN: bias 7, max 448 (S.1111.110), subnormals m/8 * 2^-6, NaN only S.1111.111, no Inf.
 *   E5M2:   bias 15, max 57344, subnormals m/4 * 2^-14, +-Inf S.11111.00, NaN otherwise.
 * Decoding follows the bit fields; encoding searches the sorted table of the
 * representable magnitudes (in double) with round to nearest, ties to the even
 * code, saturation (finite beyond max and +-Inf -> +-max), NaN -> a NaN code,
 * and the sign kept (so -0 and negatives that round to zero give 0x80).
 *
 * Checks:
 *  - conversions: all 256 codes decode (bit-exact, NaN codes decode to NaN);
 *    encode bit-exact at every representable value (both signs), every midpoint
 *    of neighbours and a few ulps either side, the subnormal range densely (a
 *    fine linear grid and its float neighbours), between max and the next
 *    would-be value and far beyond, +-0, +-Inf, NaNs, and random floats
 *    (2M per format; 200k with KVA_TEST_QUICK).
 *  - cache dtypes INT8 / FP8_E4M3 / FP8_E5M2 (and F16/BF16/F32 mixed in via
 *    v_dtype and layer_dtype), KVA_CACHE_KV and KVA_CACHE_LATENT:
 *      read-back: FP8 == fp8(x * (1.0f/scale)) * scale exactly (x / scale also
 *      accepted: the two differ by at most one float rounding); F16/BF16 == ref.h's rounding; F32 exact;
 *      INT8 |r - x| <= 0.5 * s * (1 + 1e-6) + 3e-7 * |x| with s = max|x| / 127
 *      over the token-head vector (the second term covers float rounding of the
 *      scale and of code * scale, ~ 127 * 2^-23 * s: far below one step);
 *      all-zero vectors read exactly zero; appended-but-unstored slots read zero.
 *      attention: kva_attend_cache == ref_attend (fp64) over the cache's own
 *      read-back, |diff| <= 2e-5 * (1 + max|v|).
 *      immutability: after every later append + store every earlier slot reads
 *      back bit-identically to its first read-back.
 *      kva_cache_bytes_per_token == the sum per layer of K and V bytes (+4 per
 *      token per head for INT8; LATENT once).
 *      FP8 scales <= 0 or NaN -> KVA_ERR_ARG at create; INT8 ignores them.
 *      FP8 scales per layer (layer_k_scale / layer_v_scale) and per layer and
 *      KV head (head_k_scale / head_v_scale), mixed over layers of every type:
 *      each head's read-back exact under its own scale (the most specific one
 *      given), attention over it as above; an invalid entry of an FP8 layer is
 *      refused, entries of other layers are not read.
 *      K with a few channels 10-20x larger than the rest (Llama-like outliers).
 */
#include <float.h>

#include "kvattn.h"
#include "harness.h"
#include "ref.h"

/* ======================================================================== */
/* FP8 reference                                                            */

typedef struct {
  const char *name;
  int ebits, mbits, bias, fn; /* fn: E4M3FN (no Inf, one NaN pattern) */
  int max_code;               /* largest finite magnitude code */
  double mag[128];            /* mag[c] for c = 0..max_code: increasing */
  double maxv, next_would_be; /* max finite, and max + its step */
} q8_fmt;

static q8_fmt q8_e4m3, q8_e5m2;
static int q8_ready;

/* value of a code from its fields (NaN for NaN codes, +-Inf for E5M2 Inf) */
static double q8_decode(const q8_fmt *f, unsigned code) {
  unsigned s = (code >> 7) & 1u;
  unsigned e = (code >> f->mbits) & ((1u << f->ebits) - 1u);
  unsigned m = code & ((1u << f->mbits) - 1u);
  unsigned emax_field = (1u << f->ebits) - 1u;
  double mag;
  if (f->fn) {
    if (e == emax_field && m == (1u << f->mbits) - 1u) return (double)NAN;
  } else if (e == emax_field) {
    if (m != 0) return (double)NAN;
    return s ? -(double)INFINITY : (double)INFINITY;
  }
  if (e == 0)
    mag = ldexp((double)m, 1 - f->bias - f->mbits);
  else
    mag = ldexp(1.0 + (double)m / (double)(1u << f->mbits), (int)e - f->bias);
  return s ? -mag : mag;
}

static void q8_init_fmt(q8_fmt *f, const char *name, int ebits, int mbits, int fn) {
  int c;
  f->name = name;
  f->ebits = ebits;
  f->mbits = mbits;
  f->bias = (1 << (ebits - 1)) - 1;
  f->fn = fn;
  /* E4M3FN: 0x7E is the largest finite; E5M2: 0x7B (0x7C is +Inf) */
  f->max_code = fn ? 0x7E : 0x7B;
  for (c = 0; c <= f->max_code; c++) f->mag[c] = q8_decode(f, (unsigned)c);
  f->maxv = f->mag[f->max_code];
  f->next_would_be = f->maxv + (f->mag[f->max_code] - f->mag[f->max_code - 1]);
}

static void q8_init(void) {
  if (q8_ready) return;
  q8_init_fmt(&q8_e4m3, "e4m3", 4, 3, 1);
  q8_init_fmt(&q8_e5m2, "e5m2", 5, 2, 0);
  q8_ready = 1;
}

static int q8_is_nan_code(const q8_fmt *f, unsigned code) {
  double v = q8_decode(f, code & 0xFFu);
  return v != v;
}

/* round to nearest even, saturating; NaN -> 0x7F (callers accept any NaN code) */
static unsigned q8_encode(const q8_fmt *f, float x) {
  unsigned sign = signbit(x) ? 0x80u : 0u;
  double a = fabs((double)x);
  int lo, hi;
  if (x != x) return 0x7Fu;
  if (a >= f->maxv) return sign | (unsigned)f->max_code; /* saturate, incl. Inf */
  lo = 0;
  hi = f->max_code; /* mag[lo] <= a < mag[hi] */
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (f->mag[mid] <= a)
      lo = mid;
    else
      hi = mid;
  }
  {
    double dl = a - f->mag[lo], dh = f->mag[hi] - a;
    int c;
    if (dl < dh)
      c = lo;
    else if (dh < dl)
      c = hi;
    else
      c = (lo % 2 == 0) ? lo : hi;
    return sign | (unsigned)c;
  }
}

/* ======================================================================== */
/* Conversions                                                              */

typedef uint8_t (*q8_enc_fn)(float);
typedef float (*q8_dec_fn)(uint8_t);

static uint8_t lib_enc_e4m3(float x) { return kva_f32_to_e4m3(x); }
static uint8_t lib_enc_e5m2(float x) { return kva_f32_to_e5m2(x); }
static float lib_dec_e4m3(uint8_t b) { return kva_e4m3_to_f32(b); }
static float lib_dec_e5m2(uint8_t b) { return kva_e5m2_to_f32(b); }

static long q8_n_checked;

/* one encode check; returns 1 when it agreed */
static int q8_check_enc(const q8_fmt *f, q8_enc_fn enc, float x, const char *what) {
  unsigned got = enc(x), want = q8_encode(f, x);
  int ok;
  q8_n_checked++;
  if (x != x)
    ok = q8_is_nan_code(f, got);
  else
    ok = got == want;
  if (ok) {
    kt_pass++;
    return 1;
  }
  if (kt_fail_here(__FILE__, __LINE__)) {
    printf("kva_f32_to_%s(%.9g = %a) [%s] = 0x%02X, reference 0x%02X (%.9g)\n", f->name,
           (double)x, (double)x, what, got, want, q8_decode(f, want));
    fflush(stdout);
  }
  return 0;
}

static void q8_test_decode(const q8_fmt *f, q8_dec_fn dec) {
  unsigned c;
  int bad = 0;
  for (c = 0; c < 256; c++) {
    double want = q8_decode(f, c);
    float got = dec((uint8_t)c);
    int ok;
    if (want != want)
      ok = got != got;
    else
      ok = kt_f2u(got) == kt_f2u((float)want) && (double)(float)want == want;
    if (!ok) {
      bad++;
      if (kt_fail_here(__FILE__, __LINE__)) {
        printf("kva_%s_to_f32(0x%02X) = %.9g (%a), reference %.9g\n", f->name, c, (double)got,
               (double)got, want);
        fflush(stdout);
      }
    } else {
      kt_pass++;
    }
  }
  (void)bad;
}

static void q8_check_pm(const q8_fmt *f, q8_enc_fn enc, float x, const char *what) {
  q8_check_enc(f, enc, x, what);
  q8_check_enc(f, enc, -x, what);
}

static void q8_test_encode(const q8_fmt *f, q8_enc_fn enc, kt_rng *r) {
  int c, i, k;
  float mn = (float)f->mag[1];                          /* smallest subnormal */
  float min_normal = (float)ldexp(1.0, 1 - f->bias);    /* 2^(1-bias) */
  long n_rand = kt_quick ? 500000L : 2000000L;
  int n_grid = kt_quick ? (1 << 15) : (1 << 17);
  float special[12];

  /* table sanity: strictly increasing, the spec's maxima (448, 57344) */
  for (c = 1; c <= f->max_code; c++)
    KT_CHECK(f->mag[c] > f->mag[c - 1], "%s reference table not increasing at %d", f->name, c);
  KT_CHECK(f->maxv == (f->fn ? 448.0 : 57344.0), "%s reference max %.9g", f->name, f->maxv);
  KT_CHECK((double)min_normal == f->mag[1 << f->mbits], "%s min normal", f->name);

  /* every representable value, both signs (incl. +-0) */
  for (c = 0; c <= f->max_code; c++) q8_check_pm(f, enc, (float)f->mag[c], "representable");
  KT_CHECK(enc(-0.0f) == 0x80, "kva_f32_to_%s(-0) = 0x%02X, want 0x80", f->name, enc(-0.0f));
  KT_CHECK(enc(0.0f) == 0x00, "kva_f32_to_%s(+0) = 0x%02X, want 0x00", f->name, enc(0.0f));

  /* midpoints (ties to even) and a few float ulps either side */
  for (c = 0; c < f->max_code; c++) {
    float mid = (float)((f->mag[c] + f->mag[c + 1]) * 0.5), lo = mid, hi = mid;
    KT_CHECK((double)mid == (f->mag[c] + f->mag[c + 1]) * 0.5, "midpoint not exact in float");
    q8_check_pm(f, enc, mid, "midpoint");
    for (k = 0; k < 3; k++) {
      lo = nextafterf(lo, 0.0f);
      hi = nextafterf(hi, INFINITY);
      q8_check_pm(f, enc, lo, "below midpoint");
      q8_check_pm(f, enc, hi, "above midpoint");
    }
    /* quarter points too */
    q8_check_pm(f, enc, (float)(f->mag[c] * 0.75 + f->mag[c + 1] * 0.25), "quarter");
    q8_check_pm(f, enc, (float)(f->mag[c] * 0.25 + f->mag[c + 1] * 0.75), "three quarters");
  }
  /* between 0 and the smallest subnormal: half of it is a tie to 0 */
  q8_check_pm(f, enc, mn * 0.5f, "half min subnormal");
  q8_check_pm(f, enc, nextafterf(mn * 0.5f, INFINITY), "just above half min subnormal");
  q8_check_pm(f, enc, nextafterf(mn * 0.5f, 0.0f), "just below half min subnormal");
  q8_check_pm(f, enc, kt_u2f(1u), "smallest float subnormal");
  q8_check_pm(f, enc, FLT_MIN, "FLT_MIN");

  /* saturation: max .. next would-be value .. far beyond, Inf */
  {
    float mx = (float)f->maxv, nw = (float)f->next_would_be, mid = (float)((f->maxv + f->next_would_be) * 0.5);
    special[0] = mx;
    special[1] = nextafterf(mx, INFINITY);
    special[2] = nextafterf(mid, 0.0f);
    special[3] = mid;
    special[4] = nextafterf(mid, INFINITY);
    special[5] = nw;
    special[6] = nw * 2.0f;
    special[7] = 1e10f;
    special[8] = 1e30f;
    special[9] = FLT_MAX;
    special[10] = INFINITY;
    special[11] = nextafterf(mx, 0.0f);
    for (i = 0; i < 12; i++) q8_check_pm(f, enc, special[i], "saturation");
    for (i = 0; i < 11; i++) {
      unsigned gp = enc(special[i]), gn = enc(-special[i]);
      KT_CHECK(gp == (unsigned)f->max_code && gn == (0x80u | (unsigned)f->max_code),
               "kva_f32_to_%s(+-%.9g) = 0x%02X / 0x%02X, want saturation 0x%02X / 0x%02X", f->name,
               (double)special[i], gp, gn, (unsigned)f->max_code, 0x80u | (unsigned)f->max_code);
    }
  }
  /* NaNs: quiet, signalling-ish payloads, both signs */
  {
    uint32_t nans[6] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0x7FA12345u};
    for (i = 0; i < 6; i++) {
      float x = kt_u2f(nans[i]);
      unsigned got = enc(x);
      q8_check_enc(f, enc, x, "NaN");
      KT_CHECK(q8_is_nan_code(f, got), "kva_f32_to_%s(NaN 0x%08X) = 0x%02X is not a NaN code",
               f->name, (unsigned)nans[i], got);
    }
  }

  /* the subnormal range densely: a linear grid on [0, 4 * min_normal] with
     step a power of two (so every tie is on the grid) and float neighbours */
  {
    float step = (float)ldexp(4.0 * (double)min_normal, -(int)(log2((double)n_grid) + 0.5));
    for (i = 0; i <= n_grid; i++) {
      float x = step * (float)i;
      q8_check_pm(f, enc, x, "subnormal grid");
      q8_check_pm(f, enc, nextafterf(x, 0.0f), "subnormal grid -");
      q8_check_pm(f, enc, nextafterf(x, INFINITY), "subnormal grid +");
    }
  }

  /* random floats across magnitudes */
  {
    int emin = 1 - f->bias - f->mbits - 4, emax = (f->fn ? 8 : 15) + 4;
    long n;
    for (n = 0; n < n_rand; n++) {
      int mode = (int)(n % 4);
      float x;
      if (mode == 0) { /* any bit pattern (NaN, Inf, tiny, huge) */
        x = kt_u2f(kt_u32(r));
      } else if (mode == 1 || mode == 2) { /* exponent within the format's reach */
        int e = kt_int(r, emin, emax);
        uint32_t m = kt_u32(r) & 0x7FFFFFu;
        x = (float)ldexp(1.0 + (double)m / 8388608.0, e);
        if (kt_u32(r) & 1u) x = -x;
      } else { /* near a representable value or a midpoint, a few ulps away */
        int cc = kt_int(r, 0, f->max_code - 1), off = kt_int(r, -4, 4);
        float base = (kt_u32(r) & 1u) ? (float)f->mag[cc] : (float)((f->mag[cc] + f->mag[cc + 1]) * 0.5);
        uint32_t u = kt_f2u(base);
        if (off < 0 && (uint32_t)(-off) > u) off = 0;
        x = kt_u2f(u + (uint32_t)off);
        if (kt_u32(r) & 1u) x = -x;
      }
      q8_check_enc(f, enc, x, "random");
    }
  }
}

/* decode(encode(x)) for every code round-trips (only for the codes the library
   itself decodes, so an inconsistent decoder shows up here too) */
static void q8_test_roundtrip(const q8_fmt *f, q8_enc_fn enc, q8_dec_fn dec) {
  unsigned c;
  for (c = 0; c < 256; c++) {
    float v = dec((uint8_t)c);
    unsigned back;
    if (v != v || isinf(v)) continue;
    back = enc(v);
    KT_CHECK(back == c, "kva_f32_to_%s(kva_%s_to_f32(0x%02X) = %.9g) = 0x%02X", f->name, f->name, c,
             (double)v, back);
  }
}

static void test_quant_conversions(void) {
  kt_rng r;
  q8_init();
  kt_seed(&r, 0xF8F8u);
  kt_begin("quant: e4m3 decode (all 256 codes)");
  q8_test_decode(&q8_e4m3, lib_dec_e4m3);
  kt_begin("quant: e5m2 decode (all 256 codes)");
  q8_test_decode(&q8_e5m2, lib_dec_e5m2);
  kt_begin("quant: e4m3 encode");
  q8_test_encode(&q8_e4m3, lib_enc_e4m3, &r);
  q8_test_roundtrip(&q8_e4m3, lib_enc_e4m3, lib_dec_e4m3);
  kt_begin("quant: e5m2 encode");
  q8_test_encode(&q8_e5m2, lib_enc_e5m2, &r);
  q8_test_roundtrip(&q8_e5m2, lib_enc_e5m2, lib_dec_e5m2);
}

/* ======================================================================== */
/* Cache dtypes                                                             */

static size_t qc_elem_bytes(kva_dtype t) {
  switch (t) {
    case KVA_F32: return 4;
    case KVA_F16: case KVA_BF16: return 2;
    default: return 1;
  }
}
static size_t qc_row_bytes(kva_dtype t, int dim) {
  if (t == KVA_INT4) /* 20 bytes per group of 32 values (two F16s, 16 code bytes), a last group 4 + its codes */
    return (size_t)(dim / 32) * 20u + (dim % 32 ? 4u + (size_t)(dim % 32 + 1) / 2u : 0u);
  return qc_elem_bytes(t) * (size_t)dim + (t == KVA_INT8 ? 4u : 0u);
}
static int qc_is_fp8(kva_dtype t) { return t == KVA_FP8_E4M3 || t == KVA_FP8_E5M2; }

static const char *qc_tname(kva_dtype t) {
  switch (t) {
    case KVA_DTYPE_DEFAULT: return "default";
    case KVA_F32: return "f32";
    case KVA_F16: return "f16";
    case KVA_BF16: return "bf16";
    case KVA_INT8: return "int8";
    case KVA_FP8_E4M3: return "e4m3";
    case KVA_FP8_E5M2: return "e5m2";
    case KVA_INT4: return "int4";
  }
  return "?";
}

/* storage types of layer l as docs/API.md defines them */
static void qc_layer_types(const kva_cache_desc *d, int l, kva_dtype *kt, kva_dtype *vt) {
  kva_dtype k = d->layer_dtype ? d->layer_dtype[l] : d->dtype;
  kva_dtype v = d->layer_dtype ? d->layer_dtype[l] : d->v_dtype;
  if (k == KVA_DTYPE_DEFAULT) k = KVA_F16;
  if (v == KVA_DTYPE_DEFAULT) v = k;
  if (d->kind == KVA_CACHE_LATENT) v = k;
  *kt = k;
  *vt = v;
}

static size_t qc_expected_bpt(const kva_cache_desc *d) {
  size_t total = 0;
  int l, dv = d->v_dim ? d->v_dim : d->head_dim;
  for (l = 0; l < d->n_layers; l++) {
    kva_dtype kt, vt;
    qc_layer_types(d, l, &kt, &vt);
    total += (size_t)d->n_kv_heads * qc_row_bytes(kt, d->head_dim);
    if (d->kind == KVA_CACHE_KV) total += (size_t)d->n_kv_heads * qc_row_bytes(vt, dv);
  }
  return total;
}

/* The exact read-back of x stored as FP8 with scale cs; alt: the x / cs variant. */
static float qc_fp8_expect(kva_dtype t, float x, float cs, int alt) {
  const q8_fmt *f = t == KVA_FP8_E4M3 ? &q8_e4m3 : &q8_e5m2;
  float inv = 1.0f / cs;
  volatile float y = alt ? x / cs : x * inv;
  unsigned code = q8_encode(f, y);
  float dec = (float)q8_decode(f, code);
  volatile float out = dec * cs;
  return out;
}

static double qc_worst_int8; /* worst |err| / s over all INT8 checks */

/* Checks one stored vector's read-back; returns the number of bad elements. */
static int qc_check_row(kva_dtype t, float cs, const float *x, const float *got, int n, const char *what,
                        int layer, int slot, int head) {
  int i, bad = 0;
  if (t == KVA_INT8) {
    double amax = 0.0, s;
    for (i = 0; i < n; i++)
      if (fabs((double)x[i]) > amax) amax = fabs((double)x[i]);
    s = amax / 127.0;
    for (i = 0; i < n; i++) {
      double err = fabs((double)got[i] - (double)x[i]);
      double tol = 0.5 * s * (1.0 + 1e-6) + 3e-7 * fabs((double)x[i]);
      int ok = err <= tol;
      if (amax == 0.0) ok = kt_f2u(got[i]) == 0u || got[i] == 0.0f;
      if (s > 0.0 && err / s > qc_worst_int8) qc_worst_int8 = err / s;
      if (!ok) {
        bad++;
        if (kt_fail_here(__FILE__, __LINE__)) {
          printf("%s int8 layer %d slot %d head %d [%d/%d]: read %.9g, stored %.9g, |err| %.3g > %.3g "
                 "(amax %.6g)\n",
                 what, layer, slot, head, i, n, (double)got[i], (double)x[i], err, tol, amax);
          fflush(stdout);
        }
      }
    }
  } else {
    for (i = 0; i < n; i++) {
      float want, want2;
      int ok;
      if (t == KVA_F32) {
        want = want2 = x[i];
      } else if (t == KVA_F16) {
        want = want2 = ref_round_f16(x[i]);
      } else if (t == KVA_BF16) {
        want = want2 = ref_round_bf16(x[i]);
      } else {
        want = qc_fp8_expect(t, x[i], cs, 0);
        want2 = qc_fp8_expect(t, x[i], cs, 1);
      }
      ok = kt_f2u(got[i]) == kt_f2u(want) || kt_f2u(got[i]) == kt_f2u(want2) ||
           (want != want && got[i] != got[i]);
      /* -0 vs +0 on read-back is not a contract matter (fp8 -0 * scale = -0 anyway) */
      if (!ok && got[i] == 0.0f && want == 0.0f) ok = 1;
      if (!ok) {
        bad++;
        if (kt_fail_here(__FILE__, __LINE__)) {
          printf("%s %s layer %d slot %d head %d [%d/%d]: read %.9g (%a), want %.9g (%a) from %.9g, scale %g\n",
                 what, qc_tname(t), layer, slot, head, i, n, (double)got[i], (double)got[i], (double)want,
                 (double)want, (double)x[i], (double)cs);
          fflush(stdout);
        }
      }
    }
  }
  if (!bad) kt_pass++;
  return bad;
}

typedef struct {
  kva_cache_kind kind;
  int L, G, H, D, Dv, bs;
  kva_dtype kdt, vdt;
  const kva_dtype *ldt; /* NULL or [L] */
  float ks, vs;
  const float *lks, *lvs; /* NULL or [L]: per-layer FP8 scales */
  const float *hks, *hvs; /* NULL or [L][G]: per layer and KV head */
  int n_threads;
} qc_case;

/* The FP8 scale the cache must use for layer l, head g: per head over per
   layer over the single one; LATENT's V is its K. */
static float qc_scale(const qc_case *cs, int is_v, int l, int g) {
  const float *h, *ly;
  if (cs->kind == KVA_CACHE_LATENT) is_v = 0;
  h = is_v ? cs->hvs : cs->hks;
  ly = is_v ? cs->lvs : cs->lks;
  if (h) return h[l * cs->G + g];
  if (ly) return ly[l];
  return is_v ? cs->vs : cs->ks;
}

/* Fill one token's [G][dim] vectors with Llama-like structure: uniform values,
   a few channels 10-20x larger (outliers) in even heads, occasional tiny or
   all-zero head vectors, occasional all-zero tokens. */
static void qc_gen(kt_rng *r, float *x, int G, int dim, int outliers, int zero_token) {
  int g, i;
  for (g = 0; g < G; g++) {
    float *xg = x + (size_t)g * dim;
    int kind = kt_int(r, 0, 15);
    float amp = kind == 0 ? 0.0f : kind == 1 ? 1e-3f : kind == 2 ? 30.0f : 1.0f;
    for (i = 0; i < dim; i++) {
      float v = kt_uniform(r, -1.0f, 1.0f) * amp;
      if (outliers && (g % 2 == 0) && ((i * 7 + g) % 11 == 3)) v *= kt_uniform(r, 10.0f, 20.0f);
      xg[i] = zero_token ? 0.0f : v;
    }
  }
}

static void qc_describe(const qc_case *cs, char *buf, size_t n) {
  snprintf(buf, n, "%s L%d G%d H%d D%d Dv%d bs%d k=%s v=%s%s ks=%g vs=%g%s%s%s%s",
           cs->kind == KVA_CACHE_LATENT ? "latent" : "kv", cs->L, cs->G, cs->H, cs->D, cs->Dv, cs->bs,
           qc_tname(cs->kdt), qc_tname(cs->vdt), cs->ldt ? " +layer_dtype" : "", (double)cs->ks,
           (double)cs->vs, cs->lks ? " +layer_k_scale" : "", cs->lvs ? " +layer_v_scale" : "",
           cs->hks ? " +head_k_scale" : "", cs->hvs ? " +head_v_scale" : "");
}

static double qc_worst_attn; /* worst |diff| / (1 + max|v|) */

static void qc_run_case(const qc_case *cs, kt_rng *r, int total_tokens) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_attn a;
  kva_status st;
  char name[256];
  int latent = cs->kind == KVA_CACHE_LATENT;
  int G = cs->G, D = cs->D, Dv = cs->Dv, L = cs->L, H = cs->H;
  int seq = -1, len = 0, l, t, g, i;
  size_t kstride = (size_t)G * D, vstride = (size_t)G * Dv;
  float *first_k, *first_v, *stored_k, *stored_v, *kin, *vin, *rk, *rv, *q, *out;
  double *dk, *dv, *dq, *dout;
  char *have; /* [L][slot] read-back recorded */
  int32_t *pos;
  int bad_imm = 0;

  qc_describe(cs, name, sizeof name);
  memset(&d, 0, sizeof d);
  d.kind = cs->kind;
  d.n_layers = L;
  d.n_kv_heads = G;
  d.head_dim = D;
  d.v_dim = Dv == D ? 0 : Dv;
  d.block_size = cs->bs;
  d.n_blocks = total_tokens / cs->bs + 4;
  d.dtype = cs->kdt;
  d.v_dtype = cs->vdt;
  d.layer_dtype = cs->ldt;
  d.k_scale = cs->ks;
  d.v_scale = cs->vs;
  d.layer_k_scale = cs->lks;
  d.layer_v_scale = cs->lvs;
  d.head_k_scale = cs->hks;
  d.head_v_scale = cs->hvs;
  d.max_seqs = 4;

  KT_CHECK(kva_cache_bytes_per_token(&d) == qc_expected_bpt(&d),
           "%s: kva_cache_bytes_per_token = %lu, expected %lu", name,
           (unsigned long)kva_cache_bytes_per_token(&d), (unsigned long)qc_expected_bpt(&d));
  st = kva_cache_create(&d, &c);
  KT_CHECK(st == KVA_OK && c, "%s: kva_cache_create -> %d", name, (int)st);
  if (st != KVA_OK || !c) return;
  {
    kva_cache_stats S;
    kva_cache_get_stats(c, &S);
    KT_CHECK(S.block_bytes >= (size_t)cs->bs * qc_expected_bpt(&d),
             "%s: stats block_bytes %lu < block_size * bytes_per_token %lu", name, (unsigned long)S.block_bytes,
             (unsigned long)((size_t)cs->bs * qc_expected_bpt(&d)));
  }
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);

  first_k = KT_ALLOC(float, (size_t)L * total_tokens * kstride);
  first_v = KT_ALLOC(float, (size_t)L * total_tokens * vstride);
  stored_k = KT_ALLOC(float, (size_t)L * total_tokens * kstride);
  stored_v = KT_ALLOC(float, (size_t)L * total_tokens * vstride);
  have = KT_ALLOC(char, (size_t)L * total_tokens);
  memset(have, 0, (size_t)L * total_tokens);
  kin = KT_ALLOC(float, (size_t)total_tokens * kstride);
  vin = KT_ALLOC(float, (size_t)total_tokens * vstride);
  rk = KT_ALLOC(float, kstride);
  rv = KT_ALLOC(float, vstride);
  pos = KT_ALLOC(int32_t, G);
  q = KT_ALLOC(float, (size_t)total_tokens * H * D);
  out = KT_ALLOC(float, (size_t)total_tokens * H * Dv);
  dk = KT_ALLOC(double, (size_t)total_tokens * kstride);
  dv = KT_ALLOC(double, (size_t)total_tokens * vstride);
  dq = KT_ALLOC(double, (size_t)total_tokens * H * D);
  dout = KT_ALLOC(double, (size_t)total_tokens * H * Dv);

  memset(&a, 0, sizeof a);
  a.n_heads = H;
  a.n_kv_heads = G;
  a.head_dim = D;
  a.v_dim = Dv;
  a.n_threads = cs->n_threads;

  while (len < total_tokens) {
    int n, choice = kt_int(r, 0, 5), n_q;
    /* chunk sizes that cross block boundaries in different ways */
    n = choice == 0 ? 1 : choice == 1 ? cs->bs : choice == 2 ? cs->bs + 1 : choice == 3 ? 2 * cs->bs + 1
        : kt_int(r, 1, 7);
    if (len + n > total_tokens) n = total_tokens - len;
    st = kva_seq_append(c, seq, n);
    KT_CHECK(st == KVA_OK, "%s: append(%d) at len %d -> %d", name, n, len, (int)st);
    if (st != KVA_OK) break;
    len += n;
    for (l = 0; l < L; l++) {
      kva_dtype kt, vt;
      qc_layer_types(&d, l, &kt, &vt);
      /* appended but not stored yet: zeros */
      for (t = len - n; t < len; t++) {
        st = kva_seq_read(c, seq, l, t, rk, latent ? NULL : rv, pos);
        KT_CHECK(st == KVA_OK, "%s: read before store -> %d", name, (int)st);
        for (i = 0; i < (int)kstride; i++)
          if (rk[i] != 0.0f) break;
        KT_CHECK(i == (int)kstride, "%s: unstored slot %d layer %d reads k[%d] = %g, want 0", name, t, l, i,
                 (double)rk[i < (int)kstride ? i : 0]);
        if (!latent) {
          for (i = 0; i < (int)vstride; i++)
            if (rv[i] != 0.0f) break;
          KT_CHECK(i == (int)vstride, "%s: unstored slot %d layer %d reads v[%d] != 0", name, t, l, i);
        }
      }
      for (t = 0; t < n; t++) {
        int zt = kt_int(r, 0, 19) == 0;
        qc_gen(r, kin + (size_t)t * kstride, G, D, 1, zt);
        qc_gen(r, vin + (size_t)t * vstride, G, Dv, 0, zt);
      }
      st = kva_store(c, seq, l, kin, latent ? NULL : vin, n);
      KT_CHECK(st == KVA_OK, "%s: store -> %d", name, (int)st);
      memcpy(stored_k + ((size_t)l * total_tokens + (len - n)) * kstride, kin, sizeof(float) * n * kstride);
      if (!latent)
        memcpy(stored_v + ((size_t)l * total_tokens + (len - n)) * vstride, vin, sizeof(float) * n * vstride);
      /* read-back of the new slots */
      for (t = len - n; t < len; t++) {
        float *fk = first_k + ((size_t)l * total_tokens + t) * kstride;
        float *fv = first_v + ((size_t)l * total_tokens + t) * vstride;
        const float *sk = stored_k + ((size_t)l * total_tokens + t) * kstride;
        const float *sv = stored_v + ((size_t)l * total_tokens + t) * vstride;
        for (g = 0; g < G; g++) pos[g] = -7;
        st = kva_seq_read(c, seq, l, t, fk, latent ? NULL : fv, pos);
        KT_CHECK(st == KVA_OK, "%s: read -> %d", name, (int)st);
        for (g = 0; g < G; g++) {
          KT_CHECK(pos[g] == t, "%s: slot %d head %d pos %d", name, t, g, (int)pos[g]);
          qc_check_row(kt, qc_scale(cs, 0, l, g), sk + (size_t)g * D, fk + (size_t)g * D, D,
                       latent ? "latent" : "K", l, t, g);
          if (!latent)
            qc_check_row(vt, qc_scale(cs, 1, l, g), sv + (size_t)g * Dv, fv + (size_t)g * Dv, Dv, "V", l, t, g);
        }
        have[(size_t)l * total_tokens + t] = 1;
      }
      /* attention on the quantized cache == attention over its read-back */
      n_q = kt_int(r, 1, n);
      kt_fill(r, q, (size_t)n_q * H * D, -0.5f, 0.5f);
      /* sometimes a window (with sinks) and a softcap: same fused kernels, other masks */
      a.window = kt_int(r, 0, 3) == 0 ? kt_int(r, 1, len) : 0;
      a.n_sink = a.window ? kt_int(r, 0, 2) : 0;
      a.softcap = kt_int(r, 0, 3) == 0 ? 2.5f : 0.0f;
      st = kva_attend_cache(c, seq, l, &a, q, n_q, out);
      KT_CHECK(st == KVA_OK, "%s: attend_cache -> %d", name, (int)st);
      if (st == KVA_OK) {
        ref_attn_cfg rc = ref_cfg(&a);
        double vmax, err;
        size_t where, no = (size_t)n_q * H * Dv;
        for (t = 0; t < len; t++) {
          const float *fk = first_k + ((size_t)l * total_tokens + t) * kstride;
          const float *fv = first_v + ((size_t)l * total_tokens + t) * vstride;
          for (i = 0; i < (int)kstride; i++) dk[(size_t)t * kstride + i] = fk[i];
          for (g = 0; g < G; g++)
            for (i = 0; i < Dv; i++)
              dv[(size_t)t * vstride + (size_t)g * Dv + i] = latent ? (double)fk[(size_t)g * D + i]
                                                                    : (double)fv[(size_t)g * Dv + i];
        }
        for (i = 0; i < n_q * H * D; i++) dq[i] = q[i];
        ref_attend(&rc, dq, n_q, NULL, dk, dv, len, NULL, dout, NULL);
        vmax = ref_max_abs_d(dv, (size_t)len * vstride);
        err = ref_max_err(out, dout, no, &where);
        if (err / (1.0 + vmax) > qc_worst_attn) qc_worst_attn = err / (1.0 + vmax);
        KT_CHECK(err <= 2e-5 * (1.0 + vmax),
                 "%s: layer %d len %d n_q %d (k=%s v=%s): attend_cache vs fp64 over read-back: max err %.3g at "
                 "%lu (got %.9g want %.9g), tol %.3g",
                 name, l, len, n_q, qc_tname(kt), qc_tname(vt), err, (unsigned long)where, (double)out[where],
                 dout[where], 2e-5 * (1.0 + vmax));
      }
      /* every earlier slot of every layer still reads back bit-identically */
      {
        int ll;
        for (ll = 0; ll < L; ll++)
          for (t = 0; t < len; t++) {
            const float *fk, *fv;
            int okk, okv = 1;
            if (!have[(size_t)ll * total_tokens + t]) continue;
            fk = first_k + ((size_t)ll * total_tokens + t) * kstride;
            fv = first_v + ((size_t)ll * total_tokens + t) * vstride;
            st = kva_seq_read(c, seq, ll, t, rk, latent ? NULL : rv, NULL);
            okk = st == KVA_OK && kt_same_bits(rk, fk, kstride);
            if (!latent) okv = kt_same_bits(rv, fv, vstride);
            if (!(okk && okv)) {
              bad_imm++;
              if (kt_fail_here(__FILE__, __LINE__)) {
                printf("%s: layer %d slot %d changed after a later append/store (len %d, storing layer %d): "
                       "k %s, v %s\n",
                       name, ll, t, len, l, okk ? "same" : "CHANGED", okv ? "same" : "CHANGED");
                fflush(stdout);
              }
            }
          }
      }
    }
  }
  if (!bad_imm) kt_pass++;

  kva_cache_destroy(c);
  free(first_k);
  free(first_v);
  free(stored_k);
  free(stored_v);
  free(have);
  free(kin);
  free(vin);
  free(rk);
  free(rv);
  free(pos);
  free(q);
  free(out);
  free(dk);
  free(dv);
  free(dq);
  free(dout);
}

static float qc_scale_for(kva_dtype t, kt_rng *r) {
  /* scales that put stored values in the subnormal range (tiny tokens),
     the normal range, and beyond max (saturation, 30x tokens with outliers) */
  static const float e4[4] = {0.02f, 0.125f, 1.0f, 0.37f};
  static const float e5[4] = {0.001f, 0.25f, 1.0f, 3.1f};
  if (t == KVA_FP8_E4M3) return e4[kt_int(r, 0, 3)];
  if (t == KVA_FP8_E5M2) return e5[kt_int(r, 0, 3)];
  return kt_int(r, 0, 1) ? 0.0f : 1.0f; /* INT8 / others ignore the scale: 0 must be fine */
}

static void test_quant_cache(void) {
  static const int dims[6] = {1, 3, 13, 37, 64, 130};
  static const int bss[3] = {1, 3, 16};
  static const kva_dtype qt[3] = {KVA_INT8, KVA_FP8_E4M3, KVA_FP8_E5M2};
  static const kva_dtype allt[6] = {KVA_F32, KVA_F16, KVA_BF16, KVA_INT8, KVA_FP8_E4M3, KVA_FP8_E5M2};
  kt_rng r;
  int i, n_cases = kt_quick ? 30 : 60;
  kva_dtype ldt[4];
  q8_init();
  kt_seed(&r, 0xCAC8E);

  /* every quantized dtype for K and V alike, over the shape grid */
  kt_begin("quant: cache KV, one dtype");
  for (i = 0; i < 3 * 6; i++) {
    qc_case cs;
    int bs = bss[i % 3];
    memset(&cs, 0, sizeof cs);
    cs.kind = KVA_CACHE_KV;
    cs.L = 2;
    cs.G = 1 + i % 4;
    cs.H = cs.G * (1 + i % 3);
    cs.D = dims[i % 6];
    cs.Dv = (i % 4 == 1) ? dims[(i + 2) % 6] : cs.D;
    cs.bs = bs;
    cs.kdt = cs.vdt = qt[i % 3];
    cs.ks = qc_scale_for(cs.kdt, &r);
    cs.vs = qc_scale_for(cs.vdt, &r);
    cs.n_threads = i % 2;
    if (kt_quick && cs.D > 64 && i % 2) cs.D = 37;
    qc_run_case(&cs, &r, kt_quick ? 2 * bs + 5 : 3 * bs + 9);
  }

  /* every 1-byte K type with every 2/4-byte V type and back, odd row sizes
     (V rows then start at odd byte offsets unless the layout pads them) */
  kt_begin("quant: cache KV, K/V dtype grid");
  for (i = 0; i < 6 * 6; i++) {
    qc_case cs;
    memset(&cs, 0, sizeof cs);
    cs.kind = KVA_CACHE_KV;
    cs.L = 1;
    cs.G = 1 + i % 2;
    cs.H = cs.G * 2;
    cs.D = (i % 3 == 0) ? 3 : (i % 3 == 1) ? 13 : 1;
    cs.Dv = (i % 2) ? cs.D : 5;
    cs.bs = (i % 4 == 0) ? 3 : 1;
    cs.kdt = allt[i / 6];
    cs.vdt = allt[i % 6];
    cs.ks = 0.25f;
    cs.vs = 0.5f;
    cs.n_threads = 1;
    qc_run_case(&cs, &r, 7);
  }

  /* K one type, V another (any of the six), random shapes */
  kt_begin("quant: cache KV, mixed K/V dtypes");
  for (i = 0; i < n_cases; i++) {
    qc_case cs;
    memset(&cs, 0, sizeof cs);
    cs.kind = KVA_CACHE_KV;
    cs.L = kt_int(&r, 1, 3);
    cs.G = kt_int(&r, 1, 4);
    cs.H = cs.G * kt_int(&r, 1, 3);
    cs.D = kt_pick(&r, dims, 6);
    cs.Dv = kt_int(&r, 0, 2) ? cs.D : kt_pick(&r, dims, 6);
    cs.bs = kt_pick(&r, bss, 3);
    cs.kdt = allt[kt_int(&r, 0, 5)];
    cs.vdt = (i % 3 == 0) ? KVA_DTYPE_DEFAULT : allt[kt_int(&r, 0, 5)];
    if (i % 2 == 0 && !qc_is_fp8(cs.kdt) && cs.kdt != KVA_INT8) cs.kdt = qt[kt_int(&r, 0, 2)];
    cs.ks = qc_scale_for(cs.kdt, &r);
    cs.vs = qc_scale_for(cs.vdt == KVA_DTYPE_DEFAULT ? cs.kdt : cs.vdt, &r);
    cs.n_threads = kt_int(&r, 0, 2);
    qc_run_case(&cs, &r, kt_int(&r, 1, kt_quick ? 20 : 40));
  }

  /* per-layer overrides: F16 first and last, INT8 / FP8 between */
  kt_begin("quant: cache layer_dtype");
  for (i = 0; i < 8; i++) {
    qc_case cs;
    memset(&cs, 0, sizeof cs);
    cs.kind = (i % 4 == 3) ? KVA_CACHE_LATENT : KVA_CACHE_KV;
    cs.L = 4;
    cs.G = cs.kind == KVA_CACHE_LATENT ? 1 : kt_int(&r, 1, 4);
    cs.H = cs.G * kt_int(&r, 1, 3);
    cs.D = dims[(i + 2) % 6];
    cs.Dv = cs.kind == KVA_CACHE_LATENT ? (cs.D > 1 ? cs.D - 1 - cs.D / 4 : 1) : cs.D;
    cs.bs = bss[i % 3];
    ldt[0] = KVA_F16;
    ldt[1] = i % 2 ? KVA_INT8 : KVA_FP8_E4M3;
    ldt[2] = i % 3 == 0 ? KVA_FP8_E5M2 : KVA_INT8;
    ldt[3] = i % 4 == 1 ? KVA_BF16 : KVA_F16;
    cs.ldt = ldt;
    cs.kdt = KVA_F32;     /* overridden */
    cs.vdt = KVA_INT8;    /* overridden */
    cs.ks = 0.125f;
    cs.vs = 0.25f;
    if (cs.kind == KVA_CACHE_LATENT) cs.vs = cs.ks;
    cs.n_threads = 1;
    qc_run_case(&cs, &r, kt_quick ? 12 : 30);
  }

  /* the latent (MLA) cache: n_kv_heads 1, head_dim > v_dim, V = first v_dim values */
  kt_begin("quant: cache LATENT");
  {
    static const int lat[6][2] = {{3, 1}, {13, 8}, {37, 32}, {64, 48}, {130, 128}, {2, 1}};
    for (i = 0; i < (kt_quick ? 12 : 18); i++) {
      qc_case cs;
      memset(&cs, 0, sizeof cs);
      cs.kind = KVA_CACHE_LATENT;
      cs.L = 1 + i % 2;
      cs.G = 1;
      cs.H = 1 + i % 4;
      cs.D = lat[i % 6][0];
      cs.Dv = lat[i % 6][1];
      cs.bs = bss[i % 3];
      cs.kdt = qt[i % 3];
      cs.vdt = KVA_DTYPE_DEFAULT;
      cs.ks = qc_scale_for(cs.kdt, &r);
      /* the latent vector (V included) uses k_scale; v_scale is ignored (a1480e8's
         "LATENT FP8 needs only k_scale"): 0 or a different value must not matter */
      cs.vs = (i % 3 == 0) ? 0.0f : cs.ks * 3.0f;
      cs.n_threads = i % 2;
      qc_run_case(&cs, &r, kt_quick ? 10 : 25);
    }
  }

  /* FP8 scales per layer and per (layer, KV head), as checkpoints ship them:
     every read-back exact under its own head's scale, attention over it;
     entries of non-FP8 layers are NaN (must not be read); the single and
     per-layer scales are 0 or NaN when a more specific array covers them */
  kt_begin("quant: cache per-layer and per-head FP8 scales");
  for (i = 0; i < (kt_quick ? 16 : 32); i++) {
    qc_case cs;
    float lks[4], lvs[4], hks[4 * 4], hvs[4 * 4];
    int l, g, which = i % 4; /* 0: layer K+V, 1: head K+V, 2: head K + layer V, 3: both for K (head wins) */
    memset(&cs, 0, sizeof cs);
    cs.kind = (i % 8 == 7) ? KVA_CACHE_LATENT : KVA_CACHE_KV;
    cs.L = kt_int(&r, 1, 4);
    cs.G = cs.kind == KVA_CACHE_LATENT ? 1 : kt_int(&r, 1, 4);
    cs.H = cs.G * kt_int(&r, 1, 3);
    cs.D = kt_pick(&r, dims, 6);
    cs.Dv = cs.kind == KVA_CACHE_LATENT ? (cs.D > 1 ? cs.D - 1 : 1) : kt_pick(&r, dims, 6);
    if (kt_quick && cs.D > 64) cs.D = 37, cs.Dv = cs.kind == KVA_CACHE_LATENT ? 36 : cs.Dv;
    cs.bs = kt_pick(&r, bss, 3);
    for (l = 0; l < cs.L; l++) ldt[l] = allt[kt_int(&r, 0, 5)];
    ldt[kt_int(&r, 0, cs.L - 1)] = qt[1 + kt_int(&r, 0, 1)]; /* at least one FP8 layer */
    cs.ldt = ldt;
    cs.kdt = cs.vdt = KVA_F32; /* overridden */
    for (l = 0; l < cs.L; l++) {
      int fp8 = qc_is_fp8(ldt[l]);
      lks[l] = fp8 ? qc_scale_for(ldt[l], &r) : NAN;
      lvs[l] = fp8 ? qc_scale_for(ldt[l], &r) : NAN;
      for (g = 0; g < cs.G; g++) {
        hks[l * cs.G + g] = fp8 ? qc_scale_for(ldt[l], &r) : NAN;
        hvs[l * cs.G + g] = fp8 ? qc_scale_for(ldt[l], &r) : NAN;
      }
    }
    cs.ks = which == 3 ? 0.0f : NAN;
    cs.vs = cs.kind == KVA_CACHE_LATENT ? 0.0f : which == 3 ? 0.5f : NAN;
    if (which == 0) cs.lks = lks, cs.lvs = lvs;
    if (which == 1) cs.hks = hks, cs.hvs = hvs;
    if (which == 2) cs.hks = hks, cs.lvs = lvs;
    if (which == 3) cs.hks = hks, cs.lks = lks;
    cs.n_threads = kt_int(&r, 0, 2);
    qc_run_case(&cs, &r, kt_int(&r, 1, kt_quick ? 20 : 40));
  }
}

/* ------------------------------------------------------------------------ */

static void test_quant_desc(void) {
  kva_cache_desc d;
  kva_cache *c;
  int i;
  static const float bad[4] = {0.0f, -1.0f, -0.0f, 0.0f};
  kt_begin("quant: FP8 scales required, INT8 ignores them");
  memset(&d, 0, sizeof d);
  d.kind = KVA_CACHE_KV;
  d.n_layers = 2;
  d.n_kv_heads = 2;
  d.head_dim = 8;
  d.n_blocks = 4;
  d.block_size = 4;
  for (i = 0; i < 5; i++) {
    float s = i < 4 ? bad[i] : (float)NAN;
    if (i == 3) s = -INFINITY;
    /* K FP8 with a bad k_scale */
    d.dtype = (i % 2) ? KVA_FP8_E5M2 : KVA_FP8_E4M3;
    d.v_dtype = KVA_F16;
    d.k_scale = s;
    d.v_scale = 1.0f;
    c = NULL;
    KT_CHECK(kva_cache_create(&d, &c) == KVA_ERR_ARG, "FP8 K with k_scale %g accepted", (double)s);
    if (c) kva_cache_destroy(c);
    /* V FP8 with a bad v_scale */
    d.dtype = KVA_INT8;
    d.v_dtype = (i % 2) ? KVA_FP8_E4M3 : KVA_FP8_E5M2;
    d.k_scale = 1.0f;
    d.v_scale = s;
    c = NULL;
    KT_CHECK(kva_cache_create(&d, &c) == KVA_ERR_ARG, "FP8 V with v_scale %g accepted", (double)s);
    if (c) kva_cache_destroy(c);
  }
  /* FP8 via layer_dtype with zero scales */
  {
    kva_dtype ldt[2];
    ldt[0] = KVA_F16;
    ldt[1] = KVA_FP8_E4M3;
    d.dtype = KVA_INT8;
    d.v_dtype = KVA_INT8;
    d.layer_dtype = ldt;
    d.k_scale = 0.0f;
    d.v_scale = 0.0f;
    c = NULL;
    KT_CHECK(kva_cache_create(&d, &c) == KVA_ERR_ARG, "FP8 in layer_dtype with zero scales accepted");
    if (c) kva_cache_destroy(c);
    ldt[1] = KVA_INT8;
    c = NULL;
    KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
    if (c) kva_cache_destroy(c);
    d.layer_dtype = NULL;
  }
  /* INT8 ignores the scales (0, negative, NaN all fine); so do F16/F32 */
  for (i = 0; i < 3; i++) {
    d.dtype = KVA_INT8;
    d.v_dtype = i == 2 ? KVA_F32 : KVA_DTYPE_DEFAULT;
    d.k_scale = i == 0 ? 0.0f : i == 1 ? -3.0f : (float)NAN;
    d.v_scale = d.k_scale;
    c = NULL;
    KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
    if (c) kva_cache_destroy(c);
  }
  /* the FP8 side alone needs its scale: K FP8 + V INT8 with v_scale 0 is fine */
  d.dtype = KVA_FP8_E4M3;
  d.v_dtype = KVA_INT8;
  d.k_scale = 0.5f;
  d.v_scale = 0.0f;
  c = NULL;
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  if (c) kva_cache_destroy(c);
  d.dtype = KVA_F16;
  d.v_dtype = KVA_FP8_E5M2;
  d.k_scale = 0.0f;
  d.v_scale = 2.0f;
  c = NULL;
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  if (c) kva_cache_destroy(c);

  /* per-layer / per-head scales: an FP8 layer's entry must be valid; the
     entries of other layers are not read; a covered single scale may be 0 */
  kt_begin("quant: per-layer and per-head FP8 scale validation");
  {
    kva_dtype ldt[2] = {KVA_F16, KVA_FP8_E4M3};
    float lk[2], hk[4], lv[2] = {0.5f, 0.5f}, hv[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    static const float badv[5] = {0.0f, -1.0f, (float)NAN, (float)INFINITY, -0.0f};
    kva_cache_desc e = d;
    e.dtype = e.v_dtype = KVA_F16;
    e.layer_dtype = ldt;
    e.k_scale = e.v_scale = 0.0f;
    for (i = 0; i < 5; i++) {
      lk[0] = (float)NAN, lk[1] = badv[i]; /* layer 0 is F16: its NaN is not read */
      e.layer_k_scale = lk, e.layer_v_scale = lv, e.head_k_scale = e.head_v_scale = NULL;
      c = NULL;
      KT_CHECK(kva_cache_create(&e, &c) == KVA_ERR_ARG, "layer_k_scale[1] = %g accepted", (double)badv[i]);
      if (c) kva_cache_destroy(c);
      hk[0] = hk[1] = (float)NAN, hk[2] = 0.5f, hk[3] = badv[i]; /* layer 1, head 1 bad */
      e.layer_k_scale = NULL, e.head_k_scale = hk, e.head_v_scale = hv;
      c = NULL;
      KT_CHECK(kva_cache_create(&e, &c) == KVA_ERR_ARG, "head_k_scale[1][1] = %g accepted", (double)badv[i]);
      if (c) kva_cache_destroy(c);
    }
    hk[3] = 0.25f;
    c = NULL;
    KT_STATUS(kva_cache_create(&e, &c), KVA_OK); /* valid heads; F16 layer's NaN entries and k_scale 0 unread */
    if (c) kva_cache_destroy(c);
    e.head_v_scale = NULL, e.layer_v_scale = NULL; /* V's FP8 layer falls back to v_scale 0 */
    c = NULL;
    KT_CHECK(kva_cache_create(&e, &c) == KVA_ERR_ARG, "FP8 V layer without any valid V scale accepted");
    if (c) kva_cache_destroy(c);
    e.layer_v_scale = lv;
    hk[3] = FLT_MAX / 256.0f; /* E4M3 folds x256 into the scale: beyond what stays finite */
    c = NULL;
    KT_CHECK(kva_cache_create(&e, &c) == KVA_ERR_UNSUPPORTED, "E4M3 head scale FLT_MAX/256 not refused");
    if (c) kva_cache_destroy(c);
    ldt[1] = KVA_FP8_E5M2; /* E5M2 takes it */
    c = NULL;
    KT_STATUS(kva_cache_create(&e, &c), KVA_OK);
    if (c) kva_cache_destroy(c);
  }

  /* LATENT: one vector, one scale (k_scale) */
  {
    kva_cache_desc dl;
    memset(&dl, 0, sizeof dl);
    dl.kind = KVA_CACHE_LATENT;
    dl.n_layers = 1;
    dl.n_kv_heads = 1;
    dl.head_dim = 9;
    dl.v_dim = 8;
    dl.n_blocks = 4;
    dl.dtype = KVA_FP8_E4M3;
    dl.k_scale = 0.5f;
    dl.v_scale = 0.0f;
    c = NULL;
    KT_STATUS(kva_cache_create(&dl, &c), KVA_OK);
    if (c) kva_cache_destroy(c);
    dl.k_scale = 0.0f;
    dl.v_scale = 1.0f;
    c = NULL;
    KT_CHECK(kva_cache_create(&dl, &c) == KVA_ERR_ARG, "LATENT FP8 with k_scale 0 accepted");
    if (c) kva_cache_destroy(c);
  }

  /* bytes per token: explicit figures (Llama-3-8B shape) */
  kt_begin("quant: bytes per token");
  memset(&d, 0, sizeof d);
  d.kind = KVA_CACHE_KV;
  d.n_layers = 32;
  d.n_kv_heads = 8;
  d.head_dim = 128;
  d.dtype = KVA_F16;
  KT_CHECK(kva_cache_bytes_per_token(&d) == 131072u, "llama3-8b f16 %lu", (unsigned long)kva_cache_bytes_per_token(&d));
  d.dtype = KVA_INT8;
  KT_CHECK(kva_cache_bytes_per_token(&d) == 32u * 2u * 8u * (128u + 4u), "llama3-8b int8 %lu",
           (unsigned long)kva_cache_bytes_per_token(&d));
  d.dtype = KVA_FP8_E4M3;
  KT_CHECK(kva_cache_bytes_per_token(&d) == 65536u, "llama3-8b e4m3 %lu", (unsigned long)kva_cache_bytes_per_token(&d));
  d.dtype = KVA_FP8_E5M2;
  d.v_dtype = KVA_INT8;
  KT_CHECK(kva_cache_bytes_per_token(&d) == 32u * 8u * (128u + 128u + 4u), "llama3-8b e5m2/int8 %lu",
           (unsigned long)kva_cache_bytes_per_token(&d));
  d.v_dtype = KVA_DTYPE_DEFAULT;
  {
    kva_dtype *ldt = KT_ALLOC(kva_dtype, 32);
    for (i = 0; i < 32; i++) ldt[i] = (i == 0 || i == 31) ? KVA_F16 : KVA_INT8;
    d.layer_dtype = ldt;
    KT_CHECK(kva_cache_bytes_per_token(&d) == 2u * 4096u + 30u * 2u * 8u * 132u, "f16/int8 mix %lu",
             (unsigned long)kva_cache_bytes_per_token(&d));
    d.layer_dtype = NULL;
    free(ldt);
  }
  /* DeepSeek-V3 latent: 61 layers x 576 */
  memset(&d, 0, sizeof d);
  d.kind = KVA_CACHE_LATENT;
  d.n_layers = 61;
  d.n_kv_heads = 1;
  d.head_dim = 576;
  d.v_dim = 512;
  d.dtype = KVA_F16;
  KT_CHECK(kva_cache_bytes_per_token(&d) == 70272u, "dsv3 latent f16 %lu", (unsigned long)kva_cache_bytes_per_token(&d));
  d.dtype = KVA_INT8;
  KT_CHECK(kva_cache_bytes_per_token(&d) == 61u * (576u + 4u), "dsv3 latent int8 %lu",
           (unsigned long)kva_cache_bytes_per_token(&d));
  d.dtype = KVA_FP8_E4M3;
  KT_CHECK(kva_cache_bytes_per_token(&d) == 61u * 576u, "dsv3 latent e4m3 %lu",
           (unsigned long)kva_cache_bytes_per_token(&d));
}

/* ------------------------------------------------------------------------ */
/* Extreme magnitudes through the cache: INT8 with tiny (incl. subnormal
   float) and huge amax, FP8 with Inf / NaN / huge inputs (saturate; NaN stays). */
static void test_quant_extremes(void) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  int seq = -1, t, i, D = 13;
  float k[4 * 13], v[4 * 13], rk[4 * 13], rv[4 * 13];
  static const float amax[6] = {1e-35f, 1e-30f, 3e38f, 1.0f, 1e-39f, 2e-45f};
  kt_begin("quant: extreme magnitudes");
  q8_init();
  memset(&d, 0, sizeof d);
  d.kind = KVA_CACHE_KV;
  d.n_layers = 1;
  d.n_kv_heads = 4;
  d.head_dim = D;
  d.block_size = 3;
  d.n_blocks = 8;
  d.dtype = KVA_INT8;
  d.v_dtype = KVA_FP8_E4M3;
  d.v_scale = 0.5f;
  if (kva_cache_create(&d, &c) != KVA_OK || !c) {
    KT_CHECK(0, "create int8/e4m3 failed");
    return;
  }
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  for (t = 0; t < 6; t++) {
    KT_STATUS(kva_seq_append(c, seq, 1), KVA_OK);
    for (i = 0; i < 4 * D; i++) {
      /* head h: amax[t] spread over a ramp, sign alternating; head 3 all 0 */
      int h = i / D, j = i % D;
      float m = h == 3 ? 0.0f : amax[t] * (float)(j + 1) / (float)D;
      k[i] = (j % 2) ? -m : m;
    }
    for (i = 0; i < 4 * D; i++) v[i] = (float)(i - 2 * D) * 37.0f;
    v[0] = INFINITY;
    v[1] = -INFINITY;
    v[2] = 1e30f;
    v[3] = -FLT_MAX;
    v[4] = -0.0f;
    v[5] = 1e-30f;
    v[6] = -1e-30f;
    v[7] = (float)NAN;
    KT_STATUS(kva_store(c, seq, 0, k, v, 1), KVA_OK);
    KT_STATUS(kva_seq_read(c, seq, 0, t, rk, rv, NULL), KVA_OK);
    for (i = 0; i < 4; i++) {
      int j, finite = 1;
      for (j = 0; j < D; j++) finite &= isfinite(rk[i * D + j]) ? 1 : 0;
      KT_CHECK(finite, "int8 amax %g head %d reads non-finite values", (double)amax[t], i);
      if (amax[t] >= 1e-37f)
        qc_check_row(KVA_INT8, 0.0f, k + i * D, rk + i * D, D, "extreme K", 0, t, i);
      else { /* subnormal floats: one step of slack, no Inf/NaN */
        for (j = 0; j < D; j++) {
          double err = fabs((double)rk[i * D + j] - (double)k[i * D + j]);
          KT_CHECK(err <= (double)amax[t] / 127.0 + 1e-45 * 64 || err <= fabs((double)k[i * D + j]) * 0.02 + 2e-45,
                   "int8 subnormal amax %g head %d [%d]: read %g from %g", (double)amax[t], i, j,
                   (double)rk[i * D + j], (double)k[i * D + j]);
        }
      }
      qc_check_row(KVA_FP8_E4M3, 0.5f, v + i * D, rv + i * D, D, "extreme V", 0, t, i);
    }
    KT_CHECK(rv[0] == 448.0f * 0.5f && rv[1] == -448.0f * 0.5f && rv[2] == 224.0f && rv[3] == -224.0f,
             "e4m3 saturation on the cache path: %g %g %g %g", (double)rv[0], (double)rv[1], (double)rv[2],
             (double)rv[3]);
    KT_CHECK(rv[7] != rv[7], "e4m3 NaN on the cache path reads %g", (double)rv[7]);
  }
  kva_cache_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* Quantized storage under the cache's block moves: eviction compaction
   (WINDOW, H2O per head), fork + copy-on-write, truncate + re-append.  A
   token's (layer, position, head) read-back must stay bit-identical to its
   first read-back wherever its slot moves (the INT8 scale travels with the
   codes), and attention must equal the fp64 reference over the held read-back,
   per KV head with its own positions. */

typedef struct {
  int L, G, H, D, Dv, P; /* P: positions capacity */
  float *fk, *fv;        /* [L][P][G][D], [L][P][G][Dv]: first read-back per position */
  char *have;            /* [L][P][G] */
} qd_shadow;

static float *qd_k(qd_shadow *s, int l, int p, int g) {
  return s->fk + (((size_t)l * s->P + p) * s->G + g) * s->D;
}
static float *qd_v(qd_shadow *s, int l, int p, int g) {
  return s->fv + (((size_t)l * s->P + p) * s->G + g) * s->Dv;
}

/* store n new tokens of `seq` at layer l, record/check read-backs of the new
   positions (INT8 / FP8 rules), returns 0 on a failed call */
static int qd_store(kva_cache *c, const kva_cache_desc *d, qd_shadow *sh, int seq, int l, int n, kt_rng *r,
                    const char *name) {
  int G = sh->G, D = sh->D, Dv = sh->Dv, t, g, len = kva_seq_len(c, seq), p0 = kva_seq_pos(c, seq) - n;
  float *k = KT_ALLOC(float, (size_t)n * G * D), *v = KT_ALLOC(float, (size_t)n * G * Dv);
  float *rk = KT_ALLOC(float, (size_t)G * D), *rv = KT_ALLOC(float, (size_t)G * Dv);
  int32_t *pos = KT_ALLOC(int32_t, G);
  kva_dtype kt, vt;
  kva_status st;
  int ok = 1;
  qc_layer_types(d, l, &kt, &vt);
  for (t = 0; t < n; t++) {
    qc_gen(r, k + (size_t)t * G * D, G, D, 1, 0);
    qc_gen(r, v + (size_t)t * G * Dv, G, Dv, 0, 0);
  }
  st = kva_store(c, seq, l, k, v, n);
  KT_CHECK(st == KVA_OK, "%s: store -> %d", name, (int)st);
  if (st != KVA_OK) ok = 0;
  /* the newest n slots hold the new positions (they were just appended) */
  for (t = 0; ok && t < n; t++) {
    st = kva_seq_read(c, seq, l, len - n + t, rk, rv, pos);
    KT_CHECK(st == KVA_OK, "%s: read -> %d", name, (int)st);
    for (g = 0; g < G; g++) {
      int p = pos[g];
      KT_CHECK(p == p0 + t, "%s: newest slot %d head %d has pos %d, want %d", name, len - n + t, g, p, p0 + t);
      if (p < 0 || p >= sh->P) continue;
      qc_check_row(kt, d->k_scale, k + ((size_t)t * G + g) * D, rk + (size_t)g * D, D, "K", l, p, g);
      qc_check_row(vt, d->v_scale, v + ((size_t)t * G + g) * Dv, rv + (size_t)g * Dv, Dv, "V", l, p, g);
      memcpy(qd_k(sh, l, p, g), rk + (size_t)g * D, sizeof(float) * D);
      memcpy(qd_v(sh, l, p, g), rv + (size_t)g * Dv, sizeof(float) * Dv);
      sh->have[((size_t)l * sh->P + p) * G + g] = 1;
    }
  }
  free(k);
  free(v);
  free(rk);
  free(rv);
  free(pos);
  return ok;
}

/* every held slot of every layer reads back as first recorded; then attention
   at layer l for the newest n_q tokens against the per-head reference */
static void qd_verify(kva_cache *c, qd_shadow *sh, int seq, int l_attend, int n_q, int n_threads, kt_rng *r,
                      const char *name, const char *when) {
  int G = sh->G, D = sh->D, Dv = sh->Dv, H = sh->H, grp = H / G, len = kva_seq_len(c, seq), ll, s, g, i, h;
  float *rk = KT_ALLOC(float, (size_t)G * D), *rv = KT_ALLOC(float, (size_t)G * Dv);
  int32_t *pos = KT_ALLOC(int32_t, G);
  int32_t *kvp = KT_ALLOC(int32_t, (size_t)G * (len > 0 ? len : 1));
  double *dk = KT_ALLOC(double, (size_t)G * (len > 0 ? len : 1) * D);
  double *dv = KT_ALLOC(double, (size_t)G * (len > 0 ? len : 1) * Dv);
  int *cnt = KT_ALLOC(int, G);
  int bad = 0;
  for (g = 0; g < G; g++) cnt[g] = 0;
  for (ll = 0; ll < sh->L; ll++)
    for (s = 0; s < len; s++) {
      kva_status st = kva_seq_read(c, seq, ll, s, rk, rv, pos);
      if (st != KVA_OK) {
        KT_CHECK(0, "%s: read slot %d -> %d", name, s, (int)st);
        continue;
      }
      for (g = 0; g < G; g++) {
        int p = pos[g];
        if (p < 0 || p >= sh->P || !sh->have[((size_t)ll * sh->P + p) * G + g]) {
          bad++;
          if (kt_fail_here(__FILE__, __LINE__)) {
            printf("%s (%s): layer %d slot %d head %d holds unknown pos %d\n", name, when, ll, s, g, p);
            fflush(stdout);
          }
          continue;
        }
        if (!kt_same_bits(rk + (size_t)g * D, qd_k(sh, ll, p, g), D) ||
            !kt_same_bits(rv + (size_t)g * Dv, qd_v(sh, ll, p, g), Dv)) {
          bad++;
          if (kt_fail_here(__FILE__, __LINE__)) {
            printf("%s (%s): layer %d slot %d head %d pos %d reads back differently from when it was stored "
                   "(k[0] %g vs %g)\n",
                   name, when, ll, s, g, p, (double)rk[(size_t)g * D], (double)qd_k(sh, ll, p, g)[0]);
            fflush(stdout);
          }
        }
        if (ll == l_attend) {
          int j = cnt[g]++;
          kvp[(size_t)g * len + j] = p;
          for (i = 0; i < D; i++) dk[((size_t)g * len + j) * D + i] = rk[(size_t)g * D + i];
          for (i = 0; i < Dv; i++) dv[((size_t)g * len + j) * Dv + i] = rv[(size_t)g * Dv + i];
        }
      }
    }
  if (!bad) kt_pass++;
  if (n_q > 0) {
    kva_attn a;
    float *q = KT_ALLOC(float, (size_t)n_q * H * D), *out = KT_ALLOC(float, (size_t)n_q * H * Dv);
    double *dq = KT_ALLOC(double, (size_t)n_q * grp * D), *dout = KT_ALLOC(double, (size_t)n_q * grp * Dv);
    int32_t *qp = KT_ALLOC(int32_t, n_q);
    kva_status st;
    memset(&a, 0, sizeof a);
    a.n_heads = H;
    a.n_kv_heads = G;
    a.head_dim = D;
    a.v_dim = Dv;
    a.n_threads = n_threads;
    kt_fill(r, q, (size_t)n_q * H * D, -0.5f, 0.5f);
    for (i = 0; i < n_q; i++) qp[i] = kva_seq_pos(c, seq) - n_q + i;
    st = kva_attend_cache(c, seq, l_attend, &a, q, n_q, out);
    KT_CHECK(st == KVA_OK, "%s: attend_cache -> %d", name, (int)st);
    for (g = 0; st == KVA_OK && g < G; g++) {
      kva_attn a1 = a;
      ref_attn_cfg rc;
      double vmax = ref_max_abs_d(dv + (size_t)g * len * Dv, (size_t)cnt[g] * Dv), worst = 0.0, want = 0, got = 0;
      int t;
      a1.n_heads = grp;
      a1.n_kv_heads = 1;
      a1.scale = 1.0f / sqrtf((float)D);
      rc = ref_cfg(&a1);
      rc.scale = 1.0 / sqrt((double)D);
      for (t = 0; t < n_q; t++)
        for (h = 0; h < grp; h++)
          for (i = 0; i < D; i++)
            dq[((size_t)t * grp + h) * D + i] = q[((size_t)t * H + g * grp + h) * D + i];
      ref_attend(&rc, dq, n_q, qp, dk + (size_t)g * len * D, dv + (size_t)g * len * Dv, cnt[g],
                 kvp + (size_t)g * len, dout, NULL);
      for (t = 0; t < n_q; t++)
        for (h = 0; h < grp; h++)
          for (i = 0; i < Dv; i++) {
            double w = dout[((size_t)t * grp + h) * Dv + i], o = out[((size_t)t * H + g * grp + h) * Dv + i];
            double e = fabs(o - w);
            if (!(e <= 1e300)) e = INFINITY;
            if (e > worst) worst = e, want = w, got = o;
          }
      if (worst / (1.0 + vmax) > qc_worst_attn) qc_worst_attn = worst / (1.0 + vmax);
      KT_CHECK(worst <= 2e-5 * (1.0 + vmax),
               "%s (%s): layer %d kv head %d: attend_cache vs fp64 over held read-back: err %.3g (got %.9g want "
               "%.9g), tol %.3g",
               name, when, l_attend, g, worst, got, want, 2e-5 * (1.0 + vmax));
    }
    free(q);
    free(out);
    free(dq);
    free(dout);
    free(qp);
  }
  free(rk);
  free(rv);
  free(pos);
  free(kvp);
  free(dk);
  free(dv);
  free(cnt);
}

static void qd_shadow_init(qd_shadow *sh, int L, int G, int H, int D, int Dv, int P) {
  sh->L = L;
  sh->G = G;
  sh->H = H;
  sh->D = D;
  sh->Dv = Dv;
  sh->P = P;
  sh->fk = KT_ALLOC(float, (size_t)L * P * G * D);
  sh->fv = KT_ALLOC(float, (size_t)L * P * G * Dv);
  sh->have = KT_ALLOC(char, (size_t)L * P * G);
  memset(sh->have, 0, (size_t)L * P * G);
}
static void qd_shadow_free(qd_shadow *sh) {
  free(sh->fk);
  free(sh->fv);
  free(sh->have);
}
static void qd_shadow_copy(qd_shadow *dst, const qd_shadow *src) {
  qd_shadow_init(dst, src->L, src->G, src->H, src->D, src->Dv, src->P);
  memcpy(dst->fk, src->fk, sizeof(float) * (size_t)src->L * src->P * src->G * src->D);
  memcpy(dst->fv, src->fv, sizeof(float) * (size_t)src->L * src->P * src->G * src->Dv);
  memcpy(dst->have, src->have, (size_t)src->L * src->P * src->G);
}

/* one step: append n (must succeed), store + verify every layer */
static int qd_step(kva_cache *c, const kva_cache_desc *d, qd_shadow *sh, int seq, int n, int n_threads, kt_rng *r,
                   const char *name, const char *when) {
  int l;
  kva_status st = kva_seq_append(c, seq, n);
  KT_CHECK(st == KVA_OK, "%s (%s): append(%d) -> %d", name, when, n, (int)st);
  if (st != KVA_OK) return 0;
  for (l = 0; l < d->n_layers; l++)
    if (!qd_store(c, d, sh, seq, l, n, r, name)) return 0;
  for (l = 0; l < d->n_layers; l++) qd_verify(c, sh, seq, l, kt_int(r, 1, n), n_threads, r, name, when);
  return 1;
}

static void test_quant_moves(void) {
  static const kva_dtype types[5] = {KVA_INT8, KVA_FP8_E4M3, KVA_FP8_E5M2, KVA_INT8, KVA_F16};
  static const int dims[5] = {1, 3, 13, 37, 64};
  kt_rng r;
  int it, n_it = kt_quick ? 24 : 36;
  q8_init();
  kt_seed(&r, 0xE71C7);
  kt_begin("quant: eviction / fork / truncate keep quantized tokens intact");
  for (it = 0; it < n_it; it++) {
    kva_cache_desc d;
    kva_cache *c = NULL;
    qd_shadow sh;
    char name[200];
    int mode = it % 4, seq = -1, step, G = kt_int(&r, 1, 3), H = G * kt_int(&r, 1, 2), D = dims[it % 5];
    int Dv = (it % 3 == 0) ? dims[(it + 1) % 5] : D, bs = (it % 3 == 0) ? 1 : (it % 3 == 1) ? 3 : 16;
    int n_threads = it % 2, P = 80;
    kva_status st;
    memset(&d, 0, sizeof d);
    d.kind = KVA_CACHE_KV;
    d.n_layers = 2;
    d.n_kv_heads = G;
    d.head_dim = D;
    d.v_dim = Dv;
    d.block_size = bs;
    d.n_blocks = 2 * P / bs + 8;
    d.dtype = types[it % 5];
    d.v_dtype = types[(it / 5 + 1) % 3];
    d.k_scale = 0.125f;
    d.v_scale = 0.25f;
    snprintf(name, sizeof name, "%s G%d H%d D%d Dv%d bs%d k=%s v=%s",
             mode == 0 ? "evict window" : mode == 1 ? "evict h2o" : mode == 2 ? "fork" : "truncate", G, H, D, Dv,
             bs, qc_tname(d.dtype), qc_tname(d.v_dtype));
    st = kva_cache_create(&d, &c);
    KT_CHECK(st == KVA_OK, "%s: create -> %d", name, (int)st);
    if (st != KVA_OK) continue;
    KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
    qd_shadow_init(&sh, 2, G, H, D, Dv, P);
    if (mode <= 1) {
      kva_evict e;
      memset(&e, 0, sizeof e);
      e.kind = mode == 0 ? KVA_EVICT_WINDOW : KVA_EVICT_H2O;
      e.budget = kt_int(&r, 4, 12);
      e.n_sink = kt_int(&r, 0, 2);
      e.n_recent = mode == 1 ? kt_int(&r, 1, 3) : 0;
      KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
      for (step = 0; step < 14 && kva_seq_pos(c, seq) < P - 8; step++)
        if (!qd_step(c, &d, &sh, seq, step == 0 ? kt_int(&r, 1, 6) : kt_int(&r, 1, 3), n_threads, &r, name,
                     "after eviction"))
          break;
    } else if (mode == 2) {
      int child = -1, n0 = kt_int(&r, 1, 2 * bs + 2);
      qd_shadow sc;
      if (qd_step(c, &d, &sh, seq, n0, n_threads, &r, name, "before fork")) {
        KT_STATUS(kva_seq_fork(c, seq, &child), KVA_OK);
        qd_shadow_copy(&sc, &sh);
        for (step = 0; step < 3; step++) {
          int n1 = kt_int(&r, 1, bs + 1), n2 = kt_int(&r, 1, bs + 1);
          if (!qd_step(c, &d, &sc, child, n1, n_threads, &r, name, "child after fork")) break;
          if (!qd_step(c, &d, &sh, seq, n2, n_threads, &r, name, "parent after fork")) break;
          /* the child's tokens are still intact after the parent's writes */
          qd_verify(c, &sc, child, step % 2, 0, n_threads, &r, name, "child after parent's write");
        }
        qd_shadow_free(&sc);
      }
    } else {
      int n0 = kt_int(&r, 2, 3 * bs + 3), keep;
      if (qd_step(c, &d, &sh, seq, n0, n_threads, &r, name, "before truncate")) {
        keep = kt_int(&r, 0, n0 - 1);
        KT_STATUS(kva_seq_truncate(c, seq, keep), KVA_OK);
        /* positions >= keep get new tokens: forget their old read-backs */
        {
          int l, p, g;
          for (l = 0; l < 2; l++)
            for (p = keep; p < P; p++)
              for (g = 0; g < G; g++) sh.have[((size_t)l * P + p) * G + g] = 0;
        }
        for (step = 0; step < 3; step++)
          if (!qd_step(c, &d, &sh, seq, kt_int(&r, 1, bs + 2), n_threads, &r, name, "after truncate")) break;
      }
    }
    qd_shadow_free(&sh);
    kva_cache_destroy(c);
  }
}

void test_quant(void) {
  test_quant_conversions();
  test_quant_desc();
  test_quant_extremes();
  test_quant_cache();
  test_quant_moves();
  if (getenv("KVA_TEST_VERBOSE"))
    fprintf(stderr, "  quant: %ld fp8 encodes checked; worst int8 |err|/s %.6f; worst attn err/(1+max|v|) %.3g\n",
            q8_n_checked, qc_worst_int8, qc_worst_attn);
}
