/* test_fp8bulk.c - bulk FP8 conversions and FP8 scale calibration.
 *
 * Bulk conversions (kva_f32_to_e4m3_n, kva_f32_to_e5m2_n, kva_e4m3_to_f32_n,
 * kva_e5m2_to_f32_n; SIMD on AVX2 / AVX-512 / NEON): every element must equal
 * the scalar function's result bit for bit (NaN outputs compared by code or
 * bits too: whatever sign and payload rule the scalar function has, the bulk
 * one must have the same).  Inputs:
 *   - every float whose top 16 bits take each of the 65536 values, with
 *     several low-16-bit patterns (0, 0xFFFF, 0x8000, 0x7FFF and random;
 *     fewer with KVA_TEST_QUICK), converted in one call and again in pieces
 *     of random lengths at odd offsets;
 *   - all 256 codes for decode;
 *   - specials: +-0, +-Inf, NaNs (quiet / signalling, payloads, both signs),
 *     float subnormals, FLT_MIN / FLT_MAX, every representable FP8 value,
 *     every midpoint between neighbours (a tie) and the floats 1-2 ulps either
 *     side, the midpoint between 0 and the smallest subnormal, +-max, the tie
 *     just above max, values beyond max;
 *   - lengths 0..70 at source and destination offsets 0..15 (tails), with
 *     guard bytes before and after the destination, and the source unchanged.
 * Independently of the scalar function: every representable value encodes to
 * its own code (both paths) and decode(encode(x)) == x for them.
 *
 * Calibration (kva_fp8_calibrate), for E4M3 and E5M2:
 *   - ABSMAX == max|x| / (448 or 57344), VLLM_K == max|x| / 200, VLLM_V ==
 *     max|x| / 100 (relative 1e-6: division or a multiplication by the
 *     reciprocal both pass), and with ABSMAX no |x| / scale exceeds the format
 *     max (beyond float rounding);
 *   - MSE: its round-trip squared error (store fp8(x / scale), load
 *     fp8 * scale, computed here with the scalar conversions, summed in
 *     double) is <= the error of the ABSMAX, VLLM_K and VLLM_V scales on the
 *     same sample (samples of <= 4096 values, which the MSE search looks at
 *     whole: exactly 4096 too), with a relative slack of 1e-9 for summation
 *     order; on gaussian,
 *     small gaussian, outlier-heavy, Student-t, log-uniform (values deep in the
 *     FP8 subnormals), constant, single-value and tiny (~1e-37) samples;
 *   - non-finite values are ignored (same scale bit for bit with NaN / Inf
 *     inserted); all-zero, all-non-finite and empty samples give 1.0;
 *   - every result is finite, > 0 and accepted by kva_cache_create as
 *     k_scale / v_scale, also for samples at FLT_MAX and at the smallest
 *     subnormal;
 *   - bad arguments: other dtypes, NULL x with n > 0, NULL scale, an unknown
 *     rule -> KVA_ERR_ARG with *scale unchanged. */
#include <float.h>

#include "kvattn.h"
#include "harness.h"
#include "ref.h"

typedef uint8_t (*fb_enc1)(float);
typedef float (*fb_dec1)(uint8_t);
typedef void (*fb_encn)(uint8_t *, const float *, size_t);
typedef void (*fb_decn)(float *, const uint8_t *, size_t);

typedef struct {
  const char *name;
  fb_enc1 enc;
  fb_dec1 dec;
  fb_encn encn;
  fb_decn decn;
  kva_dtype dt;
  double maxv;
} fb_fmt;

static fb_fmt fb_fmts[2];

static void fb_init(void) {
  fb_fmts[0].name = "E4M3";
  fb_fmts[0].enc = kva_f32_to_e4m3;
  fb_fmts[0].dec = kva_e4m3_to_f32;
  fb_fmts[0].encn = kva_f32_to_e4m3_n;
  fb_fmts[0].decn = kva_e4m3_to_f32_n;
  fb_fmts[0].dt = KVA_FP8_E4M3;
  fb_fmts[0].maxv = 448.0;
  fb_fmts[1].name = "E5M2";
  fb_fmts[1].enc = kva_f32_to_e5m2;
  fb_fmts[1].dec = kva_e5m2_to_f32;
  fb_fmts[1].encn = kva_f32_to_e5m2_n;
  fb_fmts[1].decn = kva_e5m2_to_f32_n;
  fb_fmts[1].dt = KVA_FP8_E5M2;
  fb_fmts[1].maxv = 57344.0;
}

/* bulk-encode src[0..n) (one call) and compare every code with the scalar
   encoder; returns the number of mismatches */
static long fb_check_encode(const fb_fmt *f, const float *src, size_t n, const char *what) {
  uint8_t *dst = KT_ALLOC(uint8_t, n + 1);
  size_t i;
  long bad = 0;
  memset(dst, 0xA5, n + 1);
  f->encn(dst, src, n);
  for (i = 0; i < n; i++) {
    uint8_t want = f->enc(src[i]);
    if (dst[i] != want) {
      if (bad < 8)
        KT_CHECK(0, "%s %s: element %lu, float bits %08lx (%.9g): bulk code 0x%02x, scalar 0x%02x", f->name, what,
                 (unsigned long)i, (unsigned long)kt_f2u(src[i]), (double)src[i], dst[i], want);
      bad++;
    }
  }
  KT_CHECK(dst[n] == 0xA5, "%s %s: bulk encode wrote past n = %lu", f->name, what, (unsigned long)n);
  free(dst);
  return bad;
}

/* every float with each top-16-bit pattern and several low halves */
static void test_encode_all_top16(void) {
  static const uint32_t fixed_lo[] = {0x0000u, 0xFFFFu, 0x8000u, 0x7FFFu, 0x0001u};
  kt_rng r;
  int fi, p, n_pat = kt_quick ? 3 : 8;
  size_t n = (size_t)65536 * (size_t)n_pat, i;
  float *src = KT_ALLOC(float, n);
  kt_begin("fp8bulk: encode, every top-16-bit pattern x low halves");
  kt_seed(&r, 0xF8B01);
  for (p = 0; p < n_pat; p++) {
    uint32_t hi;
    for (hi = 0; hi < 65536u; hi++) {
      uint32_t lo = p < 5 && (p < 2 || !kt_quick) ? fixed_lo[p] : (kt_u32(&r) & 0xFFFFu);
      src[(size_t)p * 65536u + hi] = kt_u2f((hi << 16) | lo);
    }
  }
  for (fi = 0; fi < 2; fi++) {
    const fb_fmt *f = &fb_fmts[fi];
    long bad = fb_check_encode(f, src, n, "one call over all patterns");
    uint8_t *dst = KT_ALLOC(uint8_t, n + 64);
    KT_CHECK(bad == 0, "%s: %ld of %lu floats encode differently in bulk", f->name, bad, (unsigned long)n);
    /* again in pieces of random lengths, each starting wherever the last ended */
    bad = 0;
    memset(dst, 0xA5, n + 64);
    for (i = 0; i < n;) {
      size_t len = (size_t)kt_int(&r, 0, 77);
      if (len > n - i) len = n - i;
      f->encn(dst + i, src + i, len);
      i += len;
    }
    for (i = 0; i < n; i++)
      if (dst[i] != f->enc(src[i])) {
        if (bad < 8)
          KT_CHECK(0, "%s pieces: element %lu (bits %08lx): bulk 0x%02x, scalar 0x%02x", f->name, (unsigned long)i,
                   (unsigned long)kt_f2u(src[i]), dst[i], f->enc(src[i]));
        bad++;
      }
    KT_CHECK(bad == 0 && dst[n] == 0xA5, "%s: %ld floats encode differently when converted in pieces", f->name,
             bad);
    free(dst);
  }
  free(src);
}

static void test_decode_all_codes(void) {
  int fi, c, off;
  kt_begin("fp8bulk: decode, all 256 codes");
  for (fi = 0; fi < 2; fi++) {
    const fb_fmt *f = &fb_fmts[fi];
    uint8_t codes[256 + 16];
    float out[256 + 32];
    for (off = 0; off < 16; off++) {
      int bad = 0;
      for (c = 0; c < 256; c++) codes[off + c] = (uint8_t)(c + off * 37); /* each offset a different order */
      kt_fill_sentinel(out, 256 + 32);
      f->decn(out + (off & 7), codes + off, 256);
      for (c = 0; c < 256; c++) {
        float want = f->dec(codes[off + c]);
        if (kt_f2u(out[(off & 7) + c]) != kt_f2u(want)) {
          if (bad < 4)
            KT_CHECK(0, "%s decode code 0x%02x: bulk bits %08lx, scalar %08lx", f->name, codes[off + c],
                     (unsigned long)kt_f2u(out[(off & 7) + c]), (unsigned long)kt_f2u(want));
          bad++;
        }
      }
      KT_CHECK(bad == 0, "%s: %d codes decode differently in bulk (offset %d)", f->name, bad, off);
      KT_CHECK(kt_all_sentinel(out, (size_t)(off & 7)) && kt_all_sentinel(out + (off & 7) + 256, 32 - (off & 7)),
               "%s decode wrote outside [dst, dst + 256) (offset %d)", f->name, off);
    }
  }
}

/* the specials list for one format; returns its length */
static size_t fb_specials(const fb_fmt *f, float *v, size_t cap) {
  static const uint32_t bits[] = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,             /* zeros, infinities */
      0x7fc00000u, 0xffc00000u, 0x7fc00001u, 0xffc12345u, 0x7fffffffu, /* quiet NaNs, payloads */
      0xffffffffu, 0x7f800001u, 0xff800001u, 0x7fbfffffu, 0xffa00000u, /* signalling NaNs */
      0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu, 0x00400000u, /* float subnormals */
      0x00800000u, 0x80800000u, 0x7f7fffffu, 0xff7fffffu};            /* FLT_MIN, FLT_MAX */
  size_t n = 0, i;
  int c, k;
  double vals[256], mags[128], maxv = f->maxv;
  int nm = 0;
  for (i = 0; i < sizeof bits / sizeof bits[0] && n < cap; i++) v[n++] = kt_u2f(bits[i]);
  /* the representable magnitudes, ascending (codes 0x00.. of the positive half) */
  for (c = 0; c < 128; c++) {
    double x = (double)f->dec((uint8_t)c);
    vals[c] = x;
    if (x == x && x <= maxv) mags[nm++] = x;
  }
  (void)vals;
  for (k = 0; k < nm; k++) {
    double lo = mags[k], hi = k + 1 < nm ? mags[k + 1] : maxv + (maxv - mags[k - 1]); /* beyond max: the would-be next */
    float pts[2];
    int s, j;
    pts[0] = (float)lo;
    pts[1] = (float)((lo + hi) / 2.0); /* a midpoint (exact in float) */
    for (j = 0; j < 2; j++)
      for (s = -2; s <= 2; s++) {
        float x = pts[j];
        uint32_t u = kt_f2u(x);
        if (x == 0.0f && s < 0) continue;
        x = kt_u2f((uint32_t)((int64_t)u + s));
        if (n + 2 <= cap) {
          v[n++] = x;
          v[n++] = -x;
        }
      }
  }
  /* between 0 and the smallest subnormal, and far beyond max */
  {
    float extra[] = {(float)(mags[1] / 2.0), (float)(mags[1] / 4.0), (float)(mags[1] * 0.75),
                     (float)(maxv * 1.5), (float)(maxv * 2.0), (float)(maxv * 1024.0), 1e30f, 3e38f};
    for (i = 0; i < sizeof extra / sizeof extra[0] && n + 2 <= cap; i++) {
      v[n++] = extra[i];
      v[n++] = -extra[i];
    }
  }
  return n;
}

static void test_specials(void) {
  int fi, c;
  kt_begin("fp8bulk: specials, midpoints, saturation, NaN codes");
  for (fi = 0; fi < 2; fi++) {
    const fb_fmt *f = &fb_fmts[fi];
    float v[4096];
    size_t n = fb_specials(f, v, 4096), k;
    long bad = fb_check_encode(f, v, n, "specials");
    KT_CHECK(bad == 0, "%s: %ld specials encode differently in bulk", f->name, bad);
    /* each one alone too (the pure tail path), and at every position of an 8/16-wide vector */
    for (k = 0; k < n; k++) {
      float buf[16];
      uint8_t out[16];
      int pos = (int)(k % 16), j;
      for (j = 0; j < 16; j++) buf[j] = 1.0f;
      buf[pos] = v[k];
      f->encn(out, buf, 16);
      KT_CHECK(out[pos] == f->enc(v[k]), "%s: bits %08lx at lane %d of 16: bulk 0x%02x, scalar 0x%02x", f->name,
               (unsigned long)kt_f2u(v[k]), pos, out[pos], f->enc(v[k]));
      f->encn(out, &v[k], 1);
      KT_CHECK(out[0] == f->enc(v[k]), "%s: bits %08lx alone: bulk 0x%02x, scalar 0x%02x", f->name,
               (unsigned long)kt_f2u(v[k]), out[0], f->enc(v[k]));
    }
    /* independent of the scalar function: representable values encode to their own codes */
    for (c = 0; c < 256; c++) {
      float x = f->dec((uint8_t)c), back;
      uint8_t code1, coden;
      if (x != x || isinf(x)) continue;
      code1 = f->enc(x);
      f->encn(&coden, &x, 1);
      back = f->dec(code1);
      KT_CHECK(code1 == (uint8_t)c && coden == (uint8_t)c && kt_f2u(back) == kt_f2u(x),
               "%s: the value of code 0x%02x (%.9g) encodes to 0x%02x (bulk 0x%02x)", f->name, c, (double)x, code1,
               coden);
    }
  }
}

/* lengths 0..70 at offsets, guards around the destination, source unchanged */
static void test_lengths_offsets(void) {
  enum { MAXN = 70, PAD = 64 };
  kt_rng r;
  int fi, n, so, dof, count = 0;
  float pool[4096];
  size_t npool;
  kt_begin("fp8bulk: lengths 0..70 at unaligned offsets (tails, guards)");
  kt_seed(&r, 0xF8B02);
  for (fi = 0; fi < 2; fi++) {
    const fb_fmt *f = &fb_fmts[fi];
    float *src = KT_ALLOC(float, MAXN + PAD), *src0 = KT_ALLOC(float, MAXN + PAD);
    float *fout = KT_ALLOC(float, MAXN + 2 * PAD);
    uint8_t *bytes = KT_ALLOC(uint8_t, MAXN + 2 * PAD), *codes = KT_ALLOC(uint8_t, MAXN + PAD);
    npool = fb_specials(f, pool, 4096);
    for (n = 0; n <= MAXN; n++)
      for (so = 0; so < 16; so++)
        for (dof = 0; dof < 16; dof++) {
          int i, bad = 0, guard_ok = 1;
          if (!kt_quick ? ((so + dof + n) % 3 != 0 && n > 20) : ((so * 16 + dof + n) % 17 != 0)) continue;
          count++;
          for (i = 0; i < MAXN + PAD; i++) {
            switch (kt_int(&r, 0, 3)) {
              case 0: src[i] = pool[kt_int(&r, 0, (int)npool - 1)]; break;
              case 1: src[i] = kt_u2f(kt_u32(&r)); break;
              default: src[i] = kt_uniform(&r, -1.2f, 1.2f) * (float)f->maxv; break;
            }
          }
          memcpy(src0, src, sizeof(float) * (MAXN + PAD));
          memset(bytes, 0x5A, MAXN + 2 * PAD);
          f->encn(bytes + PAD / 2 + dof, src + so, (size_t)n);
          for (i = 0; i < n; i++) bad += bytes[PAD / 2 + dof + i] != f->enc(src[so + i]);
          for (i = 0; i < PAD / 2 + dof; i++) guard_ok &= bytes[i] == 0x5A;
          for (i = PAD / 2 + dof + n; i < MAXN + 2 * PAD; i++) guard_ok &= bytes[i] == 0x5A;
          KT_CHECK(bad == 0, "%s encode n=%d src+%d dst+%d: %d codes differ from the scalar encoder", f->name, n, so,
                   dof, bad);
          KT_CHECK(guard_ok, "%s encode n=%d src+%d dst+%d: wrote outside [dst, dst + n)", f->name, n, so, dof);
          KT_CHECK(kt_same_bits(src, src0, MAXN + PAD), "%s encode modified its source", f->name);
          /* decode the same length from a byte offset into a float offset */
          for (i = 0; i < MAXN + PAD; i++) codes[i] = (uint8_t)kt_u32(&r);
          kt_fill_sentinel(fout, MAXN + 2 * PAD);
          f->decn(fout + PAD / 2 + dof, codes + so, (size_t)n);
          bad = 0;
          for (i = 0; i < n; i++) bad += kt_f2u(fout[PAD / 2 + dof + i]) != kt_f2u(f->dec(codes[so + i]));
          KT_CHECK(bad == 0, "%s decode n=%d src+%d dst+%d: %d values differ from the scalar decoder", f->name, n, so,
                   dof, bad);
          KT_CHECK(kt_all_sentinel(fout, (size_t)(PAD / 2 + dof)) &&
                       kt_all_sentinel(fout + PAD / 2 + dof + n, (size_t)(MAXN + 2 * PAD - (PAD / 2 + dof + n))),
                   "%s decode n=%d src+%d dst+%d: wrote outside [dst, dst + n)", f->name, n, so, dof);
        }
    free(src);
    free(src0);
    free(fout);
    free(bytes);
    free(codes);
  }
  KT_CHECK(count > 100, "only %d length/offset cases ran", count);
}

/* ======================================================================== */
/* Calibration                                                              */

/* sum over finite x of (fp8(x / s) * s - x)^2, in double, scalar conversions */
static double fb_rt_error(const fb_fmt *f, const float *x, size_t n, float s) {
  double e = 0.0;
  size_t i;
  for (i = 0; i < n; i++) {
    double y, d;
    if (!(fabsf(x[i]) <= FLT_MAX)) continue;
    y = (double)f->dec(f->enc(x[i] / s)) * (double)s;
    d = y - (double)x[i];
    e += d * d;
  }
  return e;
}

static double fb_gauss(kt_rng *r) {
  double u1 = kt_unit(r), u2 = kt_unit(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static float fb_amax(const float *x, size_t n) {
  float m = 0.0f;
  size_t i;
  for (i = 0; i < n; i++)
    if (fabsf(x[i]) <= FLT_MAX && fabsf(x[i]) > m) m = fabsf(x[i]);
  return m;
}

/* the scale is usable: finite, > 0, and a cache takes it */
static void fb_check_usable(const fb_fmt *f, float s, const char *what) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_status st;
  KT_CHECK(s > 0.0f && s <= FLT_MAX, "%s %s: scale %g is not finite and > 0", f->name, what, (double)s);
  memset(&d, 0, sizeof d);
  d.n_layers = 1;
  d.n_kv_heads = 1;
  d.head_dim = 8;
  d.n_blocks = 2;
  d.block_size = 4;
  d.dtype = f->dt;
  d.k_scale = s;
  d.v_scale = s;
  st = kva_cache_create(&d, &c);
  KT_CHECK(st == KVA_OK, "%s %s: kva_cache_create rejects scale %.9g (status %d)", f->name, what, (double)s, (int)st);
  if (st == KVA_OK) kva_cache_destroy(c);
}

static int fb_nearly(double got, double want, double rel) { return fabs(got - want) <= rel * fabs(want); }

/* all rules on one sample (n <= 4096): closed forms, MSE optimality, usability */
static void fb_calib_sample(const char *label, const float *x, size_t n) {
  static const char *rule_names[] = {"MSE", "ABSMAX", "VLLM_K", "VLLM_V"};
  int fi, ru;
  for (fi = 0; fi < 2; fi++) {
    const fb_fmt *f = &fb_fmts[fi];
    float s[4], amax = fb_amax(x, n);
    double err[4];
    char what[256];
    for (ru = 0; ru < 4; ru++) {
      s[ru] = -1.0f;
      KT_STATUS(kva_fp8_calibrate(f->dt, x, n, (kva_calib)ru, &s[ru]), KVA_OK);
      sprintf(what, "%s, rule %s (n %lu, max|x| %.6g)", label, rule_names[ru], (unsigned long)n, (double)amax);
      fb_check_usable(f, s[ru], what);
      err[ru] = fb_rt_error(f, x, n, s[ru]);
    }
    if (amax == 0.0f) {
      for (ru = 0; ru < 4; ru++)
        KT_CHECK(s[ru] == 1.0f, "%s %s: all-zero sample, rule %s gives %g, want 1", f->name, label, rule_names[ru],
                 (double)s[ru]);
      continue;
    }
    /* closed forms where they are ordinary floats (the library may clamp tiny or huge ones) */
    {
      double ab = (double)amax / f->maxv, vk = (double)amax / 200.0, vv = (double)amax / 100.0;
      double hi = f->dt == KVA_FP8_E4M3 ? (double)FLT_MAX / 512.0 : (double)FLT_MAX;
      if (ab >= (double)FLT_MIN && ab <= hi) {
        size_t i;
        int sat = 0;
        KT_CHECK(fb_nearly(s[1], ab, 1e-6), "%s %s: ABSMAX %.9g, want max|x| / %g = %.9g", f->name, label,
                 (double)s[1], f->maxv, ab);
        for (i = 0; i < n; i++)
          if (fabsf(x[i]) <= FLT_MAX && fabs((double)x[i] / (double)s[1]) > f->maxv * (1.0 + 1e-6)) sat++;
        KT_CHECK(sat == 0, "%s %s: with the ABSMAX scale %d values exceed the format max", f->name, label, sat);
      }
      if (vk >= (double)FLT_MIN && vk <= hi)
        KT_CHECK(fb_nearly(s[2], vk, 1e-6), "%s %s: VLLM_K %.9g, want max|x| / 200 = %.9g", f->name, label,
                 (double)s[2], vk);
      if (vv >= (double)FLT_MIN && vv <= hi)
        KT_CHECK(fb_nearly(s[3], vv, 1e-6), "%s %s: VLLM_V %.9g, want max|x| / 100 = %.9g", f->name, label,
                 (double)s[3], vv);
    }
    /* MSE: no worse than any of the other rules' scales on this sample */
    if (n <= 4096)
      for (ru = 1; ru < 4; ru++)
        KT_CHECK(err[0] <= err[ru] * (1.0 + 1e-9),
                 "%s %s: MSE scale %.9g has round-trip error %.6g > %.6g of the %s scale %.9g (n %lu)", f->name,
                 label, (double)s[0], err[0], err[ru], rule_names[ru], (double)s[ru], (unsigned long)n);
  }
}

static void test_calibrate_distributions(void) {
  enum { NMAX = 4096 };
  kt_rng r;
  float *x = KT_ALLOC(float, NMAX);
  int rep, i, reps = kt_iters(6);
  kt_begin("fp8bulk: kva_fp8_calibrate closed forms and MSE optimality");
  kt_seed(&r, 0xCA1B);
  for (rep = 0; rep < reps; rep++) {
    int n = rep == 0 ? NMAX - 1 : kt_int(&r, 64, NMAX - 1);
    double sd = pow(10.0, kt_uniform(&r, -4.0f, 3.0f));
    for (i = 0; i < n; i++) x[i] = (float)(sd * fb_gauss(&r));
    fb_calib_sample("gaussian", x, (size_t)n);
    for (i = 0; i < n; i++) x[i] = (float)(0.02 * fb_gauss(&r));
    fb_calib_sample("gaussian sd 0.02", x, (size_t)n);
    for (i = 0; i < n; i++) { /* 0.5 % outliers 30-300x (activation-like) */
      x[i] = (float)fb_gauss(&r);
      if (kt_int(&r, 0, 199) == 0) x[i] *= kt_uniform(&r, 30.0f, 300.0f);
    }
    fb_calib_sample("gaussian with outliers", x, (size_t)n);
    for (i = 0; i < n; i++) { /* Student t, 2 degrees of freedom: heavy tails */
      double g1 = fb_gauss(&r), g2 = fb_gauss(&r), g3 = fb_gauss(&r);
      x[i] = (float)(g1 / sqrt((g2 * g2 + g3 * g3) / 2.0 + 1e-30));
    }
    fb_calib_sample("student-t(2)", x, (size_t)n);
    for (i = 0; i < n; i++) /* log-uniform over 1e-7..1: many values in FP8 subnormals or below */
      x[i] = (float)(pow(10.0, kt_uniform(&r, -7.0f, 0.0f)) * (kt_int(&r, 0, 1) ? 1 : -1));
    fb_calib_sample("log-uniform 1e-7..1", x, (size_t)n);
    for (i = 0; i < n; i++) /* tiny: float values near the float subnormal range */
      x[i] = (float)(1e-37 * fb_gauss(&r));
    fb_calib_sample("tiny (~1e-37)", x, (size_t)n);
    for (i = 0; i < n; i++) x[i] = (float)(3e-41 * fb_gauss(&r)); /* float subnormals */
    fb_calib_sample("float subnormals", x, (size_t)n);
    for (i = 0; i < n; i++) x[i] = 3.7f;
    fb_calib_sample("constant", x, (size_t)n);
    for (i = 0; i < n; i++) x[i] = 0.0f;
    x[kt_int(&r, 0, n - 1)] = -0.37f;
    fb_calib_sample("one non-zero value", x, (size_t)n);
  }
  /* the extremes: still usable */
  for (i = 0; i < 64; i++) x[i] = (float)fb_gauss(&r);
  x[5] = FLT_MAX;
  x[9] = -FLT_MAX;
  fb_calib_sample("with +-FLT_MAX", x, 64);
  for (i = 0; i < 64; i++) x[i] = kt_u2f(i % 2 ? 0x80000001u : 0x00000001u);
  fb_calib_sample("the smallest subnormals", x, 64);
  free(x);
}

/* exactly 4096 values: the MSE rule looks at up to 4096 values, so at all of them */
static void test_calibrate_4096(void) {
  kt_rng r;
  float *x = KT_ALLOC(float, 4096);
  int i;
  kt_begin("fp8bulk: kva_fp8_calibrate on exactly 4096 values");
  kt_seed(&r, 0xCA1E);
  for (i = 0; i < 4096; i++) x[i] = (float)fb_gauss(&r);
  x[1] = 300.0f; /* one outlier at an odd index */
  fb_calib_sample("4096 values, one outlier at index 1", x, 4096);
  for (i = 0; i < 4096; i++) {
    x[i] = (float)fb_gauss(&r);
    if (kt_int(&r, 0, 199) == 0) x[i] *= kt_uniform(&r, 30.0f, 300.0f);
  }
  fb_calib_sample("4096 values, 0.5% outliers", x, 4096);
  free(x);
}

/* Samples larger than the MSE rule's subsample (4096 values): its scale must
   still serve the whole sample about as well as ABSMAX's (the subsample is a
   shortcut, not a different objective).  K-cache-like [tokens][head_dim]
   layouts with fixed outlier channels, where a stride that is a multiple of
   a power of two can see the same few channels only. */
static void test_calibrate_large(void) {
  static const int dims[] = {64, 128, 128, 96};
  static const int tokens[] = {500, 1000, 333, 2000};
  kt_rng r;
  int c, fi, reps = kt_quick ? 2 : 4;
  kt_begin("fp8bulk: kva_fp8_calibrate MSE on samples larger than 4096 values");
  kt_seed(&r, 0xCA1D);
  for (c = 0; c < reps; c++) {
    int D = dims[c], T = tokens[c], t, d, och = 5 + 7 * c;
    size_t n = (size_t)T * D;
    float *x = KT_ALLOC(float, n);
    for (t = 0; t < T; t++)
      for (d = 0; d < D; d++) x[(size_t)t * D + d] = (float)(fb_gauss(&r) * (d == och ? 20.0 : 1.0));
    for (fi = 0; fi < 2; fi++) {
      const fb_fmt *f = &fb_fmts[fi];
      float sm = -1.0f, sa = -1.0f;
      double em, ea;
      KT_STATUS(kva_fp8_calibrate(f->dt, x, n, KVA_CALIB_MSE, &sm), KVA_OK);
      KT_STATUS(kva_fp8_calibrate(f->dt, x, n, KVA_CALIB_ABSMAX, &sa), KVA_OK);
      fb_check_usable(f, sm, "large sample, MSE");
      em = fb_rt_error(f, x, n, sm);
      ea = fb_rt_error(f, x, n, sa);
      KT_CHECK(em <= 1.25 * ea,
               "%s: %d tokens x %d channels (channel %d 20x larger): MSE scale %.6g has round-trip error %.6g, "
               "%.1fx the ABSMAX scale's (%.6g, scale %.6g)",
               f->name, T, D, och, (double)sm, em, em / ea, ea, (double)sa);
    }
    free(x);
  }
}

static void test_calibrate_special_samples(void) {
  kt_rng r;
  float x[1200], y[1400], s, t;
  int i, j, fi, ru;
  kt_begin("fp8bulk: kva_fp8_calibrate ignores non-finite values; empty and zero samples");
  kt_seed(&r, 0xCA1C);
  for (i = 0; i < 1200; i++) x[i] = (float)(0.5 * fb_gauss(&r));
  /* the same sample with NaN / Inf inserted */
  for (i = 0, j = 0; i < 1200; i++) {
    if (i % 13 == 0) y[j++] = kt_u2f(i % 2 ? 0x7fc00000u : 0xff800000u);
    if (i % 29 == 0) y[j++] = kt_u2f(i % 3 ? 0x7f800000u : 0xffc00001u);
    y[j++] = x[i];
  }
  for (fi = 0; fi < 2; fi++)
    for (ru = 0; ru < 4; ru++) {
      const fb_fmt *f = &fb_fmts[fi];
      s = t = -1.0f;
      KT_STATUS(kva_fp8_calibrate(f->dt, x, 1200, (kva_calib)ru, &s), KVA_OK);
      KT_STATUS(kva_fp8_calibrate(f->dt, y, (size_t)j, (kva_calib)ru, &t), KVA_OK);
      KT_CHECK(kt_f2u(s) == kt_f2u(t), "%s rule %d: NaN/Inf in the sample changed the scale %.9g -> %.9g", f->name,
               ru, (double)s, (double)t);
      /* only non-finite values, all zeros (both signs), empty */
      for (i = 0; i < 16; i++) y[i] = kt_u2f(i % 4 == 0 ? 0x7f800000u : i % 4 == 1 ? 0xff800000u : i % 4 == 2 ? 0x7fc00000u : 0xffffffffu);
      t = -1.0f;
      KT_STATUS(kva_fp8_calibrate(f->dt, y, 16, (kva_calib)ru, &t), KVA_OK);
      KT_CHECK(t == 1.0f, "%s rule %d: a sample of only NaN/Inf gives %g, want 1", f->name, ru, (double)t);
      for (i = 0; i < 16; i++) y[i] = i % 2 ? -0.0f : 0.0f;
      t = -1.0f;
      KT_STATUS(kva_fp8_calibrate(f->dt, y, 16, (kva_calib)ru, &t), KVA_OK);
      KT_CHECK(t == 1.0f, "%s rule %d: an all-zero sample gives %g, want 1", f->name, ru, (double)t);
      t = -1.0f;
      KT_STATUS(kva_fp8_calibrate(f->dt, NULL, 0, (kva_calib)ru, &t), KVA_OK);
      KT_CHECK(t == 1.0f, "%s rule %d: an empty sample (NULL, 0) gives %g, want 1", f->name, ru, (double)t);
      t = -1.0f;
      KT_STATUS(kva_fp8_calibrate(f->dt, x, 0, (kva_calib)ru, &t), KVA_OK);
      KT_CHECK(t == 1.0f, "%s rule %d: an empty sample (x, 0) gives %g, want 1", f->name, ru, (double)t);
      /* rebuild y for the next rule */
      for (i = 0, j = 0; i < 1200; i++) {
        if (i % 13 == 0) y[j++] = kt_u2f(i % 2 ? 0x7fc00000u : 0xff800000u);
        if (i % 29 == 0) y[j++] = kt_u2f(i % 3 ? 0x7f800000u : 0xffc00001u);
        y[j++] = x[i];
      }
    }
}

static void test_calibrate_args(void) {
  static const kva_dtype bad_types[] = {KVA_DTYPE_DEFAULT, KVA_F32, KVA_F16, KVA_BF16, KVA_INT8, (kva_dtype)99,
                                        (kva_dtype)-1};
  float x[4] = {1.0f, -2.0f, 0.5f, 3.0f}, s;
  size_t i;
  kt_begin("fp8bulk: kva_fp8_calibrate arguments");
  for (i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
    s = KT_SENTINEL;
    KT_STATUS(kva_fp8_calibrate(bad_types[i], x, 4, KVA_CALIB_MSE, &s), KVA_ERR_ARG);
    KT_CHECK(kt_f2u(s) == kt_f2u(KT_SENTINEL), "dtype %d: *scale changed on error", (int)bad_types[i]);
  }
  s = KT_SENTINEL;
  KT_STATUS(kva_fp8_calibrate(KVA_FP8_E4M3, NULL, 4, KVA_CALIB_ABSMAX, &s), KVA_ERR_ARG);
  KT_CHECK(kt_f2u(s) == kt_f2u(KT_SENTINEL), "NULL x: *scale changed on error");
  KT_STATUS(kva_fp8_calibrate(KVA_FP8_E5M2, NULL, 1, KVA_CALIB_MSE, &s), KVA_ERR_ARG);
  KT_STATUS(kva_fp8_calibrate(KVA_FP8_E4M3, x, 4, KVA_CALIB_MSE, NULL), KVA_ERR_ARG);
  KT_STATUS(kva_fp8_calibrate(KVA_FP8_E5M2, x, 4, KVA_CALIB_VLLM_V, NULL), KVA_ERR_ARG);
  s = KT_SENTINEL;
  KT_STATUS(kva_fp8_calibrate(KVA_FP8_E4M3, x, 4, (kva_calib)17, &s), KVA_ERR_ARG);
  KT_CHECK(kt_f2u(s) == kt_f2u(KT_SENTINEL), "unknown rule: *scale changed on error");
  s = KT_SENTINEL;
  KT_STATUS(kva_fp8_calibrate(KVA_FP8_E4M3, x, 4, KVA_CALIB_MSE, &s), KVA_OK);
  KT_CHECK(s > 0.0f && s <= FLT_MAX, "4-value sample: scale %g", (double)s);
}

/* kva_fp8_calibrate_heads: each head's scale equals kva_fp8_calibrate over
   that head's values gathered into one array (any rule, any shape), heads
   of very different ranges get scales in proportion; arguments */
static void test_calibrate_heads(void) {
  kt_rng r;
  int rep, fi, ru;
  kt_begin("fp8bulk: kva_fp8_calibrate_heads == kva_fp8_calibrate per head");
  kt_seed(&r, 0xCA1D);
  for (rep = 0; rep < kt_iters(12); rep++) {
    int T = kt_int(&r, 1, 300), Hh = kt_int(&r, 1, 6), Dh = kt_int(&r, 1, 70), h, t, i;
    float *x = KT_ALLOC(float, (size_t)T * Hh * Dh), *gather = KT_ALLOC(float, (size_t)T * Dh);
    float scales[6], want = 0.0f;
    for (h = 0; h < Hh; h++) { /* head h spans 10^(h - 2) */
      double sd = pow(10.0, (double)h - 2.0);
      for (t = 0; t < T; t++)
        for (i = 0; i < Dh; i++) x[((size_t)t * Hh + h) * Dh + i] = (float)(sd * fb_gauss(&r));
    }
    if (rep % 3 == 0) x[kt_int(&r, 0, T * Hh * Dh - 1)] = kt_u2f(0x7fc00000u); /* a NaN is ignored */
    for (fi = 0; fi < 2; fi++)
      for (ru = 0; ru < 4; ru++) {
        const fb_fmt *f = &fb_fmts[fi];
        KT_STATUS(kva_fp8_calibrate_heads(f->dt, x, T, Hh, Dh, (kva_calib)ru, scales), KVA_OK);
        for (h = 0; h < Hh; h++) {
          for (t = 0; t < T; t++) memcpy(gather + (size_t)t * Dh, x + ((size_t)t * Hh + h) * Dh, sizeof(float) * Dh);
          KT_STATUS(kva_fp8_calibrate(f->dt, gather, (size_t)T * Dh, (kva_calib)ru, &want), KVA_OK);
          KT_CHECK(kt_f2u(scales[h]) == kt_f2u(want), "%s rule %d T%d H%d D%d head %d: %.9g, per-head gather %.9g",
                   f->name, ru, T, Hh, Dh, h, (double)scales[h], (double)want);
        }
      }
    free(x);
    free(gather);
  }
  kt_begin("fp8bulk: kva_fp8_calibrate_heads arguments");
  {
    float x[2 * 3 * 4] = {0}, sc[3] = {KT_SENTINEL, KT_SENTINEL, KT_SENTINEL};
    KT_STATUS(kva_fp8_calibrate_heads(KVA_INT8, x, 2, 3, 4, KVA_CALIB_MSE, sc), KVA_ERR_ARG);
    KT_STATUS(kva_fp8_calibrate_heads(KVA_FP8_E4M3, x, 2, 3, 4, (kva_calib)9, sc), KVA_ERR_ARG);
    KT_STATUS(kva_fp8_calibrate_heads(KVA_FP8_E4M3, NULL, 2, 3, 4, KVA_CALIB_MSE, sc), KVA_ERR_ARG);
    KT_STATUS(kva_fp8_calibrate_heads(KVA_FP8_E4M3, x, -1, 3, 4, KVA_CALIB_MSE, sc), KVA_ERR_ARG);
    KT_STATUS(kva_fp8_calibrate_heads(KVA_FP8_E4M3, x, 2, 0, 4, KVA_CALIB_MSE, sc), KVA_ERR_ARG);
    KT_STATUS(kva_fp8_calibrate_heads(KVA_FP8_E4M3, x, 2, 3, 0, KVA_CALIB_MSE, sc), KVA_ERR_ARG);
    KT_CHECK(kt_f2u(sc[0]) == kt_f2u(KT_SENTINEL) && kt_f2u(sc[2]) == kt_f2u(KT_SENTINEL),
             "scales changed on error");
    KT_STATUS(kva_fp8_calibrate_heads(KVA_FP8_E4M3, x, 2, 3, 4, KVA_CALIB_MSE, NULL), KVA_ERR_ARG);
    KT_STATUS(kva_fp8_calibrate_heads(KVA_FP8_E5M2, NULL, 0, 3, 4, KVA_CALIB_MSE, sc), KVA_OK);
    KT_CHECK(sc[0] == 1.0f && sc[1] == 1.0f && sc[2] == 1.0f, "no tokens: scales %g %g %g, want 1", (double)sc[0],
             (double)sc[1], (double)sc[2]);
  }
}

void test_fp8bulk(void) {
  fb_init();
  test_encode_all_top16();
  test_decode_all_codes();
  test_specials();
  test_lengths_offsets();
  test_calibrate_distributions();
  test_calibrate_4096();
  test_calibrate_large();
  test_calibrate_special_samples();
  test_calibrate_args();
  test_calibrate_heads();
}
