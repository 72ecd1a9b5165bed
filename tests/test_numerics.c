/* test_numerics.c - F16 and BF16 conversions against ref.h's encoder/decoder.
 *
 * docs/API.md: conversions round to nearest, ties to even; F16 and BF16 behave
 * as IEEE 754 (and numpy/PyTorch): overflow gives ±Inf, NaN stays NaN.
 * Every check here is exact (bit patterns), there is no tolerance.  The
 * reference encoder is itself checked against the hand-derived expectations
 * (ties to the even neighbour) so the two cannot agree on a shared mistake. */
#include "kvattn.h"
#include "harness.h"
#include "ref.h"

/* A binary format under test: the library's pair and the reference's. */
typedef struct {
  const char *name;
  int ebits, mbits;
  uint16_t (*lib_enc)(float);
  float (*lib_dec)(uint16_t);
} kt_fmt;

static uint16_t lib_f16_enc(float x) { return kva_f32_to_f16(x); }
static float lib_f16_dec(uint16_t h) { return kva_f16_to_f32(h); }
static uint16_t lib_bf16_enc(float x) { return kva_f32_to_bf16(x); }
static float lib_bf16_dec(uint16_t h) { return kva_bf16_to_f32(h); }

static int fmt_is_nan(const kt_fmt *f, uint16_t h) {
  uint32_t emask = ((1u << f->ebits) - 1u) << f->mbits, mmask = (1u << f->mbits) - 1u;
  return (h & emask) == emask && (h & mmask) != 0;
}
static uint16_t fmt_ref_enc(const kt_fmt *f, float x) {
  return (uint16_t)ref_encode_ieee((double)x, f->ebits, f->mbits);
}
static double fmt_ref_dec(const kt_fmt *f, uint16_t h) { return ref_decode_ieee(h, f->ebits, f->mbits); }
static uint16_t fmt_inf(const kt_fmt *f) { return (uint16_t)(((1u << f->ebits) - 1u) << f->mbits); }
static uint16_t fmt_sign(const kt_fmt *f) { return (uint16_t)(1u << (f->ebits + f->mbits)); }

/* One conversion f32 -> code, checked against the reference (NaN: any NaN). */
static void check_enc(const kt_fmt *f, float x, const char *what) {
  uint16_t got = f->lib_enc(x);
  if (x != x) {
    KT_CHECK(fmt_is_nan(f, got), "%s: %s(NaN 0x%08lx) = 0x%04x, not a NaN", what, f->name,
             (unsigned long)kt_f2u(x), (unsigned)got);
  } else {
    uint16_t want = fmt_ref_enc(f, x);
    KT_CHECK(got == want, "%s: %s(%.9g = 0x%08lx) = 0x%04x, expected 0x%04x", what, f->name,
             (double)x, (unsigned long)kt_f2u(x), (unsigned)got, (unsigned)want);
  }
}

static void test_decode_all(const kt_fmt *f) {
  uint32_t c;
  kt_begin(f->ebits == 5 ? "f16 decode: all 65536 codes" : "bf16 decode: all 65536 codes");
  for (c = 0; c < 65536u; c++) {
    float got = f->lib_dec((uint16_t)c);
    double want = fmt_ref_dec(f, (uint16_t)c);
    if (want != want) {
      KT_CHECK(got != got, "%s decode 0x%04lx = %.9g, expected NaN", f->name, (unsigned long)c,
               (double)got);
    } else {
      int ok = (double)got == want && !signbit(got) == !signbit(want);
      KT_CHECK(ok, "%s decode 0x%04lx = %.9g, expected %.9g", f->name, (unsigned long)c,
               (double)got, want);
    }
  }
}

static void test_roundtrip_all(const kt_fmt *f) {
  uint32_t c;
  kt_begin(f->ebits == 5 ? "f16 encode: every non-NaN code round-trips"
                         : "bf16 encode: every non-NaN code round-trips");
  for (c = 0; c < 65536u; c++) {
    float x;
    uint16_t got;
    if (fmt_is_nan(f, (uint16_t)c)) continue;
    x = (float)fmt_ref_dec(f, (uint16_t)c);
    got = f->lib_enc(x);
    KT_CHECK(got == (uint16_t)c, "%s(%.9g) = 0x%04x, expected 0x%04lx", f->name, (double)x,
             (unsigned)got, (unsigned long)c);
    /* and the reference agrees with itself */
    KT_CHECK(fmt_ref_enc(f, x) == (uint16_t)c, "ref %s(%.9g) = 0x%04x, expected 0x%04lx",
             f->name, (double)x, (unsigned)fmt_ref_enc(f, x), (unsigned long)c);
  }
}

/* Every midpoint between neighbouring finite magnitudes (and between the
   largest finite and Inf): ties go to the even code; one float either side
   goes to the nearer neighbour.  Both signs. */
static void test_midpoints(const kt_fmt *f) {
  uint32_t c, inf = fmt_inf(f);
  kt_begin(f->ebits == 5 ? "f16 encode: midpoints, ties to even"
                         : "bf16 encode: midpoints, ties to even");
  for (c = 0; c < inf; c++) {
    double lo = fmt_ref_dec(f, (uint16_t)c);
    double hi = c + 1 < inf ? fmt_ref_dec(f, (uint16_t)(c + 1))
                            : ldexp(1.0, (1 << (f->ebits - 1))); /* where Inf "is": 2^(emax+1) */
    float mid = (float)((lo + hi) / 2.0);
    uint16_t even = (uint16_t)((c & 1u) ? c + 1 : c);
    int s;
    KT_CHECK((double)mid == (lo + hi) / 2.0, "%s midpoint of 0x%04lx not a float", f->name,
             (unsigned long)c);
    for (s = 0; s < 2; s++) {
      float sg = s ? -1.0f : 1.0f;
      uint16_t sb = s ? fmt_sign(f) : 0;
      float below = nextafterf(mid, 0.0f), above = nextafterf(mid, INFINITY);
      uint16_t want_mid = (uint16_t)(sb | even), want_lo = (uint16_t)(sb | c),
               want_hi = (uint16_t)(sb | (c + 1));
      uint16_t g_mid = f->lib_enc(sg * mid), g_lo = f->lib_enc(sg * below),
               g_hi = f->lib_enc(sg * above);
      KT_CHECK(g_mid == want_mid, "%s(%.9g) (tie) = 0x%04x, expected 0x%04x", f->name,
               (double)(sg * mid), (unsigned)g_mid, (unsigned)want_mid);
      KT_CHECK(g_lo == want_lo, "%s(%.9g) (just below tie) = 0x%04x, expected 0x%04x", f->name,
               (double)(sg * below), (unsigned)g_lo, (unsigned)want_lo);
      KT_CHECK(g_hi == want_hi, "%s(%.9g) (just above tie) = 0x%04x, expected 0x%04x", f->name,
               (double)(sg * above), (unsigned)g_hi, (unsigned)want_hi);
      /* the reference must say the same */
      KT_CHECK(fmt_ref_enc(f, sg * mid) == want_mid && fmt_ref_enc(f, sg * below) == want_lo &&
                   fmt_ref_enc(f, sg * above) == want_hi,
               "ref %s disagrees around midpoint of 0x%04lx", f->name, (unsigned long)c);
    }
  }
}

static void test_specials_f16(const kt_fmt *f) {
  float nan_pats[6];
  int i;
  kt_begin("f16 encode: overflow, zero, subnormal, NaN");
  /* overflow: 65520 is the tie between 65504 (0x7BFF, odd) and "65536" (Inf) */
  KT_CHECK(kva_f32_to_f16(65520.0f) == 0x7C00, "f16(65520) = 0x%04x, expected Inf 0x7C00",
           (unsigned)kva_f32_to_f16(65520.0f));
  KT_CHECK(kva_f32_to_f16(-65520.0f) == 0xFC00, "f16(-65520) = 0x%04x, expected -Inf 0xFC00",
           (unsigned)kva_f32_to_f16(-65520.0f));
  KT_CHECK(kva_f32_to_f16(nextafterf(65520.0f, 0.0f)) == 0x7BFF,
           "f16(65519.996) = 0x%04x, expected 65504 0x7BFF",
           (unsigned)kva_f32_to_f16(nextafterf(65520.0f, 0.0f)));
  KT_CHECK(kva_f32_to_f16(65519.99f) == 0x7BFF, "f16(65519.99f) = 0x%04x, expected 0x7BFF",
           (unsigned)kva_f32_to_f16(65519.99f));
  KT_CHECK(kva_f32_to_f16(65504.0f) == 0x7BFF, "f16(65504) = 0x%04x",
           (unsigned)kva_f32_to_f16(65504.0f));
  KT_CHECK(kva_f32_to_f16(1e10f) == 0x7C00, "f16(1e10) = 0x%04x", (unsigned)kva_f32_to_f16(1e10f));
  KT_CHECK(kva_f32_to_f16(3.4028235e38f) == 0x7C00, "f16(FLT_MAX) = 0x%04x",
           (unsigned)kva_f32_to_f16(3.4028235e38f));
  KT_CHECK(kva_f32_to_f16(-3.4028235e38f) == 0xFC00, "f16(-FLT_MAX) = 0x%04x",
           (unsigned)kva_f32_to_f16(-3.4028235e38f));
  KT_CHECK(kva_f32_to_f16(INFINITY) == 0x7C00, "f16(inf)");
  KT_CHECK(kva_f32_to_f16(-INFINITY) == 0xFC00, "f16(-inf)");
  KT_CHECK(kva_f16_to_f32(0x7C00) == INFINITY, "f16 decode 0x7C00");
  KT_CHECK(kva_f16_to_f32(0xFC00) == -INFINITY, "f16 decode 0xFC00");
  /* zeros keep their sign */
  KT_CHECK(kva_f32_to_f16(0.0f) == 0x0000, "f16(+0) = 0x%04x", (unsigned)kva_f32_to_f16(0.0f));
  KT_CHECK(kva_f32_to_f16(-0.0f) == 0x8000, "f16(-0) = 0x%04x", (unsigned)kva_f32_to_f16(-0.0f));
  KT_CHECK(signbit(kva_f16_to_f32(0x8000)) && kva_f16_to_f32(0x8000) == 0.0f, "f16 decode -0");
  /* subnormals: smallest 2^-24, largest 1023 * 2^-24, min normal 2^-14 */
  KT_CHECK(kva_f16_to_f32(0x0001) == ldexpf(1.0f, -24), "f16 decode 0x0001");
  KT_CHECK(kva_f16_to_f32(0x03FF) == 1023.0f * ldexpf(1.0f, -24), "f16 decode 0x03FF");
  KT_CHECK(kva_f16_to_f32(0x0400) == ldexpf(1.0f, -14), "f16 decode 0x0400");
  KT_CHECK(kva_f32_to_f16(ldexpf(1.0f, -24)) == 0x0001, "f16(2^-24)");
  KT_CHECK(kva_f32_to_f16(ldexpf(1.0f, -25)) == 0x0000, "f16(2^-25) tie -> even 0, got 0x%04x",
           (unsigned)kva_f32_to_f16(ldexpf(1.0f, -25)));
  KT_CHECK(kva_f32_to_f16(nextafterf(ldexpf(1.0f, -25), 1.0f)) == 0x0001,
           "f16(just above 2^-25) -> 0x0001, got 0x%04x",
           (unsigned)kva_f32_to_f16(nextafterf(ldexpf(1.0f, -25), 1.0f)));
  KT_CHECK(kva_f32_to_f16(3.0f * ldexpf(1.0f, -25)) == 0x0002, "f16(1.5 * 2^-24) tie -> 2");
  KT_CHECK(kva_f32_to_f16(-ldexpf(1.0f, -26)) == 0x8000, "f16(-2^-26) -> -0, got 0x%04x",
           (unsigned)kva_f32_to_f16(-ldexpf(1.0f, -26)));
  KT_CHECK(kva_f32_to_f16(1e-30f) == 0x0000, "f16(1e-30) -> +0");
  KT_CHECK(kva_f32_to_f16(-1e-30f) == 0x8000, "f16(-1e-30) -> -0");
  KT_CHECK(kva_f32_to_f16(kt_u2f(0x00000001u)) == 0x0000, "f16(float denormal min) -> 0");
  /* rounding from the subnormal/normal edge up into the min normal */
  KT_CHECK(kva_f32_to_f16(nextafterf(ldexpf(1.0f, -14), 0.0f)) == 0x0400,
           "f16(just below 2^-14) -> 0x0400, got 0x%04x",
           (unsigned)kva_f32_to_f16(nextafterf(ldexpf(1.0f, -14), 0.0f)));
  /* NaN stays NaN, including payloads only in the low bits that a plain
     truncation would turn into Inf */
  nan_pats[0] = kt_u2f(0x7FC00000u);
  nan_pats[1] = kt_u2f(0xFFC00000u);
  nan_pats[2] = kt_u2f(0x7F800001u);
  nan_pats[3] = kt_u2f(0xFF800001u);
  nan_pats[4] = kt_u2f(0x7F801FFFu);
  nan_pats[5] = kt_u2f(0x7FFFFFFFu);
  for (i = 0; i < 6; i++) {
    uint16_t h = kva_f32_to_f16(nan_pats[i]);
    KT_CHECK(ref_f16_is_nan(h), "f16(NaN 0x%08lx) = 0x%04x, not a NaN",
             (unsigned long)kt_f2u(nan_pats[i]), (unsigned)h);
  }
  KT_CHECK(isnan(kva_f16_to_f32(0x7E00)) && isnan(kva_f16_to_f32(0x7C01)) &&
               isnan(kva_f16_to_f32(0xFFFF)),
           "f16 NaN codes decode to NaN");
  (void)f;
}

static void test_specials_bf16(const kt_fmt *f) {
  float nan_pats[6];
  float maxmid = kt_u2f(0x7F7F8000u); /* tie between max finite 0x7F7F and 2^128 */
  int i;
  kt_begin("bf16 encode: overflow, zero, subnormal, NaN");
  KT_CHECK(kva_f32_to_bf16(3.4028235e38f) == 0x7F80, "bf16(FLT_MAX) = 0x%04x, expected Inf",
           (unsigned)kva_f32_to_bf16(3.4028235e38f));
  KT_CHECK(kva_f32_to_bf16(-3.4028235e38f) == 0xFF80, "bf16(-FLT_MAX) = 0x%04x, expected -Inf",
           (unsigned)kva_f32_to_bf16(-3.4028235e38f));
  KT_CHECK(kva_f32_to_bf16(maxmid) == 0x7F80, "bf16(tie at max) = 0x%04x, expected Inf",
           (unsigned)kva_f32_to_bf16(maxmid));
  KT_CHECK(kva_f32_to_bf16(nextafterf(maxmid, 0.0f)) == 0x7F7F, "bf16(below tie at max) = 0x%04x",
           (unsigned)kva_f32_to_bf16(nextafterf(maxmid, 0.0f)));
  KT_CHECK(kva_f32_to_bf16(INFINITY) == 0x7F80, "bf16(inf)");
  KT_CHECK(kva_f32_to_bf16(-INFINITY) == 0xFF80, "bf16(-inf)");
  KT_CHECK(kva_f32_to_bf16(0.0f) == 0x0000, "bf16(+0)");
  KT_CHECK(kva_f32_to_bf16(-0.0f) == 0x8000, "bf16(-0) = 0x%04x", (unsigned)kva_f32_to_bf16(-0.0f));
  KT_CHECK(kva_f32_to_bf16(1.0f) == 0x3F80, "bf16(1)");
  /* 1 + 2^-8 is the tie between 1 (0x3F80, even) and 1 + 2^-7 */
  KT_CHECK(kva_f32_to_bf16(1.00390625f) == 0x3F80, "bf16(1+2^-8) tie -> 0x3F80, got 0x%04x",
           (unsigned)kva_f32_to_bf16(1.00390625f));
  KT_CHECK(kva_f32_to_bf16(1.01171875f) == 0x3F82, "bf16(1+3*2^-8) tie -> 0x3F82, got 0x%04x",
           (unsigned)kva_f32_to_bf16(1.01171875f));
  /* float subnormals are bf16 subnormals: no flush to zero */
  KT_CHECK(kva_f32_to_bf16(kt_u2f(0x00010000u)) == 0x0001, "bf16(2^-133) = 0x%04x",
           (unsigned)kva_f32_to_bf16(kt_u2f(0x00010000u)));
  KT_CHECK(kva_bf16_to_f32(0x0001) == kt_u2f(0x00010000u), "bf16 decode 0x0001 (subnormal)");
  KT_CHECK(kva_f32_to_bf16(kt_u2f(0x00008000u)) == 0x0000, "bf16(2^-134) tie -> 0");
  KT_CHECK(kva_f32_to_bf16(kt_u2f(0x80018000u)) == 0x8002, "bf16(-1.5*2^-133) tie -> 0x8002");
  nan_pats[0] = kt_u2f(0x7FC00000u);
  nan_pats[1] = kt_u2f(0xFFC00000u);
  nan_pats[2] = kt_u2f(0x7F800001u);
  nan_pats[3] = kt_u2f(0xFF800001u);
  nan_pats[4] = kt_u2f(0x7FFFFFFFu);
  nan_pats[5] = kt_u2f(0x7F807FFFu);
  for (i = 0; i < 6; i++) {
    uint16_t h = kva_f32_to_bf16(nan_pats[i]);
    KT_CHECK(ref_bf16_is_nan(h), "bf16(NaN 0x%08lx) = 0x%04x, not a NaN",
             (unsigned long)kt_f2u(nan_pats[i]), (unsigned)h);
  }
  KT_CHECK(isnan(kva_bf16_to_f32(0x7FC0)) && isnan(kva_bf16_to_f32(0x7F81)) &&
               isnan(kva_bf16_to_f32(0xFFFF)),
           "bf16 NaN codes decode to NaN");
  (void)f;
}

/* Random floats: raw 32-bit patterns (every class), values spread over the
   format's range, and values a few float ulps from the format's midpoints. */
static void test_random(const kt_fmt *f, uint64_t seed) {
  kt_rng r;
  int i, n = kt_iters(3000000);
  int emax = (1 << (f->ebits - 1)) - 1;
  kt_begin(f->ebits == 5 ? "f16 encode: random floats" : "bf16 encode: random floats");
  kt_seed(&r, seed);
  for (i = 0; i < n; i++) {
    float x;
    int kind = i % 3;
    if (kind == 0) {
      x = kt_u2f(kt_u32(&r));
    } else if (kind == 1) {
      /* exponent from below the subnormals to just above the max */
      int e = kt_int(&r, -(emax + f->mbits + 3), emax + 2);
      uint32_t bits = ((uint32_t)(e + 127) << 23) | (kt_u32(&r) & 0x7FFFFFu);
      if (e + 127 <= 0) bits = kt_u32(&r) & 0x7FFFFFu; /* float subnormal */
      if (e + 127 >= 255) bits = 0x7F7FFFFFu;
      bits |= (kt_u32(&r) & 1u) << 31;
      x = kt_u2f(bits);
    } else {
      uint32_t c = kt_u32(&r) % (uint32_t)fmt_inf(f);
      double lo = fmt_ref_dec(f, (uint16_t)c);
      double hi = (c + 1 < fmt_inf(f)) ? fmt_ref_dec(f, (uint16_t)(c + 1)) : 2.0 * lo;
      int k;
      x = (float)((lo + hi) / 2.0);
      for (k = kt_int(&r, -3, 3); k > 0; k--) x = nextafterf(x, INFINITY);
      for (k = kt_int(&r, -3, 3); k < 0; k++) x = nextafterf(x, 0.0f);
      if (kt_u32(&r) & 1u) x = -x;
    }
    check_enc(f, x, "random");
  }
}

void test_numerics(void) {
  kt_fmt f16, bf16;
  f16.name = "f16";
  f16.ebits = 5;
  f16.mbits = 10;
  f16.lib_enc = lib_f16_enc;
  f16.lib_dec = lib_f16_dec;
  bf16.name = "bf16";
  bf16.ebits = 8;
  bf16.mbits = 7;
  bf16.lib_enc = lib_bf16_enc;
  bf16.lib_dec = lib_bf16_dec;

  test_decode_all(&f16);
  test_roundtrip_all(&f16);
  test_midpoints(&f16);
  test_specials_f16(&f16);
  test_random(&f16, 0xF16F16ULL);

  test_decode_all(&bf16);
  test_roundtrip_all(&bf16);
  test_midpoints(&bf16);
  test_specials_bf16(&bf16);
  test_random(&bf16, 0xBF16BF16ULL);
}
