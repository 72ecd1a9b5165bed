/* test_kernels.c - white box: every SIMD kernel of kvattn.h against its scalar twin.
 *
 * kvattn.h section [4] has, per ISA compiled in (AVX2, also under AVX-512;
 * AVX-512; NEON), a score kernel kva__dot_tile_<isa>, a value kernel
 * kva__vacc_tile_<isa> and the helpers exp_sub_sum, scale_max, dot_f32,
 * f32_to_f16_row and fp8_encode, each with an always-compiled scalar twin
 * (_scalar).  The library calls the tile kernels through the dispatchers
 * kva__dot_tile / kva__vacc_tile (type and row count constant, so they are
 * specialised) and the helpers through kva__exp_sub_sum etc.; those are
 * tested against the twin too, on every build (so the scalar build checks
 * that the twin specialised by the dispatchers agrees with the generic one).
 *
 * Tile kernels: every storage type, nr = 1..4 query rows, nk keys (all of
 * 1..64 for widths <= 17, else 1-5, 7, 15-17, 31, 33, 63, 64), widths 1, 7,
 * 8, 16, 17, 33, 44, 65, 128, 576 (44 = 32 + 12 reaches NEON's 3-vector value
 * strip and AVX-512's 3-vector masked strip).  Rows are separate allocations
 * of exactly their size, picked at random (with repeats) from a pool, so a
 * kernel must follow the pointers and stay inside each row; INT8 rows are
 * handed over as pointers to their codes (the scale sits before them).  The
 * pointer arrays (q, krows, vrows, acc) hold exactly nr / nk entries.
 *
 *   dot_tile: scores[r*lds + j] vs the twin's, with lds = nk, nk + 3 or 64;
 *     every other float of the score buffer (between rows, after nk, the rows
 *     r >= nr) keeps its sentinel.  Some calls get a real kva__next_tile (the
 *     next tile's rows, to prefetch); its results must equal those of the same
 *     kernel with next = NULL bit for bit.
 *   wdot_tile (the many-row score kernel, keys along the lanes): its scalar
 *     twin, the AVX-512 kernel and the dispatcher (kva__dot_tile, which takes
 *     more than four rows there) against dot_tile's scalar
 *     twin, as dot_tile above, for passes of 1-5, 7, 8, 13, 16, 17, 31 and 64
 *     rows (from 9 rows on, every fourth key count of the long lists).
 *   vacc_tile: acc pre-filled with random values, p in [0, 1] with exact
 *     zeros (and some all-zero rows), ldp = nk, nk + 3 or 64 with NaN in the
 *     padding p never reads; the columns after dv keep their sentinel.
 *
 * Tolerances (the kernels sum in another order than the twin, and with FMA):
 *   dot:  |got - want| <= 1e-5 * sum_i |q_r[i]| * |k_j[i]| * scale_j + 1e-30
 *   vacc: |got - want| <= 1e-5 * (|acc0[i]| + sum_j |p_j * scale_j * v_j[i]|) + 1e-30
 * with k and v dequantized by kva__load_row (what the kernels see), bounds in
 * double.  Reordering n float additions moves a sum by about sqrt(n) * 2^-24
 * of its magnitude: on this data the largest error seen (AVX2, AVX-512,
 * NEON) is ~40x below these bounds (KVA_TEST_VERBOSE=1 prints the worst
 * ratio per test).  A wrong element, a lost lane or a lost tail is off by a
 * whole term, far more.
 * The twin itself is checked against a double-precision dot product with the
 * same bound.
 *
 * Helpers, n in {1, 7, 8, 9, 15, 16, 17, 31, 33, 65, 576}:
 *   exp_sub_sum: each x within 4e-7 relative of the twin (expf) + 3e-38
 *     absolute (the SIMD exp gives 0 below x - m = -86.5, where expf is at most
 *     e^-86.5 = 2.9e-38); -inf inputs give exactly +0; the returned sum
 *     within 1e-6 relative of the exact (double) sum of the values it wrote
 *     and of the twin's sum, plus the twin's own rounding error on the same
 *     data (summing in order, the twin is ~1e-6 off at n = 576).
 *   scale_max: x bit-identical (one multiplication), the max exactly equal.
 *   dot_f32: within 1e-6 * sum_i |a_i * b_i| of the twin.
 *   f32_to_f16_row, fp8_encode (E4M3, E5M2; mul 1, 20, 2^-10, 1/0.0123):
 *     bit-identical to the twin on random bit patterns (NaN payloads,
 *     subnormals, infinities), random values and specials; no byte written
 *     after dst[n - 1].
 * KVA_TEST_QUICK=1 (qemu) runs the short list of key counts at every width
 * (9 of them at widths >= 128) and fewer helper trials. */
/* The AVX-512 helpers are compiled here on their own (their addresses go in
   a table), where g++ 12 reports -Wuninitialized, not just the
   -Wmaybe-uninitialized kvattn.h silences, inside its own intrinsics (their
   `__Y = __Y` idiom for an undefined vector).  Only for the header's code. */
#if defined(__cplusplus) && defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "kvattn.h"
#pragma GCC diagnostic pop
#else
#include "kvattn.h"
#endif
#include "harness.h"

#define KK_NDT 7
static const kva_dtype kk_dtypes[KK_NDT] = {KVA_F32, KVA_F16, KVA_BF16, KVA_INT8, KVA_FP8_E4M3, KVA_FP8_E5M2, KVA_INT4};
static const char *const kk_dt_names[KK_NDT] = {"f32", "f16", "bf16", "int8", "e4m3", "e5m2", "int4"};

#define KK_NW 10
static const int kk_widths[KK_NW] = {1, 7, 8, 16, 17, 33, 44, 65, 128, 576};

static const int kk_nk_list[] = {1, 2, 3, 4, 5, 7, 15, 16, 17, 31, 33, 63, 64};
static const int kk_nk_quick[] = {1, 2, 3, 5, 16, 17, 33, 63, 64};

#define KK_FP8_SCALE 0.05f
#define KK_TOL 1e-5    /* tile kernels, relative to the sum of |terms| */
#define KK_ABS 1e-30
#define KK_POOL 96     /* stored rows per (type, width) */
#define KK_GUARD 16    /* sentinel floats after each acc row */

static int kk_verbose;
static double kk_worst; /* largest |err| / tol in the current test */
static char kk_name[160];

static void kk_begin(const char *fmt, const char *a, const char *b) {
  snprintf(kk_name, sizeof kk_name, fmt, a, b);
  kt_begin(kk_name);
  kk_worst = 0.0;
}
static void kk_end(void) {
  if (kk_verbose) fprintf(stderr, "    [%s] worst |err| / tol = %.3g\n", kk_name, kk_worst);
}
/* |got - want| <= tol, recording the ratio; NaN fails */
static int kk_close(double got, double want, double tol) {
  double e = fabs(got - want);
  if (!(e <= tol)) return 0;
  if (tol > 0.0 && e / tol > kk_worst) kk_worst = e / tol;
  return 1;
}

/* ------------------------------------------------------------ tile kernels */

typedef void (*kk_dot_fn)(kva_dtype, const float *const *, int, const void *const *, int, int, float *, int,
                          float, const kva__next_tile *);
typedef void (*kk_vacc_fn)(kva_dtype, float *const *, int, const float *, int, const void *const *, int, int,
                           float);

#define KK_TILE_WRAPPERS(isa)                                                                                  \
  static void kk_dot_##isa(kva_dtype t, const float *const *q, int nr, const void *const *k, int nk, int d,   \
                           float *s, int lds, float cs, const kva__next_tile *nx) {                            \
    kva__dot_tile_##isa(t, q, nr, k, nk, d, s, lds, cs, nx);                                                  \
  }                                                                                                            \
  static void kk_vacc_##isa(kva_dtype t, float *const *acc, int nr, const float *p, int ldp,                  \
                            const void *const *v, int nk, int dv, float cs) {                                  \
    kva__vacc_tile_##isa(t, acc, nr, p, ldp, v, nk, dv, cs);                                                  \
  }
#if KVATTN_SIMD == KVA_SIMD_AVX2 || KVATTN_SIMD == KVA_SIMD_AVX512
KK_TILE_WRAPPERS(avx2)
#endif
#if KVATTN_SIMD == KVA_SIMD_AVX512
KK_TILE_WRAPPERS(avx512)
#endif
#if KVATTN_SIMD == KVA_SIMD_NEON
KK_TILE_WRAPPERS(neon)
#endif

typedef struct {
  const char *name; /* NULL: the dispatchers, named after the selected ISA */
  kk_dot_fn dot;
  kk_vacc_fn vacc;
} kk_tile_impl;

static const kk_tile_impl kk_tile_impls[] = {
#if KVATTN_SIMD == KVA_SIMD_AVX2 || KVATTN_SIMD == KVA_SIMD_AVX512
    {"avx2", kk_dot_avx2, kk_vacc_avx2},
#endif
#if KVATTN_SIMD == KVA_SIMD_AVX512
    {"avx512", kk_dot_avx512, kk_vacc_avx512},
#endif
#if KVATTN_SIMD == KVA_SIMD_NEON
    {"neon", kk_dot_neon, kk_vacc_neon},
#endif
    {NULL, kva__dot_tile, kva__vacc_tile},
};

static const char *kk_impl_name(const char *name) {
  static char buf[64];
  if (name) return name;
  snprintf(buf, sizeof buf, "dispatch(%s)", kva_simd_name());
  return buf;
}

/* Stored rows of one type and width, each its own allocation. */
typedef struct {
  kva_dtype t;
  int d;
  size_t bytes;
  unsigned char *row[KK_POOL]; /* row starts */
  const void *code[KK_POOL];   /* what kernels get */
  float *deq[KK_POOL];         /* kva__load_row of each */
} kk_pool;

/* a value in [-4, 4), an eighth of them scaled down by up to 2^-20 (F16
   and FP8 subnormals, small INT8 codes) */
static float kk_val(kt_rng *r) {
  float x = kt_uniform(r, -4.0f, 4.0f);
  if (kt_int(r, 0, 7) == 0) x = (float)ldexp((double)x, -kt_int(r, 1, 20));
  return x;
}

static void kk_pool_make(kk_pool *p, kva_dtype t, int d, kt_rng *r) {
  float *src = KT_ALLOC(float, d);
  int k, i;
  p->t = t;
  p->d = d;
  p->bytes = kva__row_bytes(t, d); /* (INT8: its scale, then the codes; INT4: its groups) */
  for (k = 0; k < KK_POOL; k++) {
    for (i = 0; i < d; i++) src[i] = k == 0 ? 0.0f : kk_val(r); /* row 0: all zero (INT8 scale 0) */
    p->row[k] = KT_ALLOC(unsigned char, p->bytes);
    kva__store_row(t, p->row[k], src, d, KK_FP8_SCALE);
    p->code[k] = p->row[k] + kva__code_offset(t);
    p->deq[k] = KT_ALLOC(float, d);
    kva__load_row(t, p->deq[k], p->row[k], d, KK_FP8_SCALE);
  }
  free(src);
}

static void kk_pool_free(kk_pool *p) {
  int k;
  for (k = 0; k < KK_POOL; k++) {
    free(p->row[k]);
    free(p->deq[k]);
  }
}

static kk_pool kk_pools[KK_NDT][KK_NW];
#define KK_QROWS 64 /* query rows per width: four for the row-block kernels, up to a pass for the wide one */
static float *kk_q[KK_NW][KK_QROWS]; /* query rows per width, exactly d floats each */

static void kk_setup(void) {
  kt_rng r;
  int ti, wi, k, i;
  kt_seed(&r, 0x4B45524EULL);
  for (wi = 0; wi < KK_NW; wi++) {
    for (k = 0; k < KK_QROWS; k++) {
      kk_q[wi][k] = KT_ALLOC(float, kk_widths[wi]);
      for (i = 0; i < kk_widths[wi]; i++) kk_q[wi][k][i] = kk_val(&r);
    }
    for (ti = 0; ti < KK_NDT; ti++) kk_pool_make(&kk_pools[ti][wi], kk_dtypes[ti], kk_widths[wi], &r);
  }
}

static void kk_teardown(void) {
  int ti, wi, k;
  for (wi = 0; wi < KK_NW; wi++) {
    for (k = 0; k < KK_QROWS; k++) free(kk_q[wi][k]);
    for (ti = 0; ti < KK_NDT; ti++) kk_pool_free(&kk_pools[ti][wi]);
  }
}

/* the key counts for a width: all of 1..64 at the small widths (natively) */
static int kk_nks(int d, int *out) {
  int n = 0, k;
  if (!kt_quick && d <= 17) {
    for (k = 1; k <= 64; k++) out[n++] = k;
  } else if (kt_quick && d >= 128) {
    for (k = 0; k < (int)(sizeof kk_nk_quick / sizeof kk_nk_quick[0]); k++) out[n++] = kk_nk_quick[k];
  } else {
    for (k = 0; k < (int)(sizeof kk_nk_list / sizeof kk_nk_list[0]); k++) out[n++] = kk_nk_list[k];
  }
  return n;
}

static int kk_stride(int nk, int which) { return which == 0 ? nk : which == 1 ? nk + 3 : 64; }

/* One dot_tile case: impl (NULL: the twin against a double dot product) vs
   the twin.  Returns nothing; checks count. */
static void kk_dot_case(const kk_tile_impl *im, const kk_pool *pool, float *const *q, int nr, int nk, int lds,
                        int use_next, kt_rng *r) {
  const kva_dtype t = pool->t;
  const int d = pool->d;
  const char *dn = kk_dt_names[0];
  const float **qp = KT_ALLOC(const float *, nr);
  const void **kr = KT_ALLOC(const void *, nk);
  int *idx = KT_ALLOC(int, nk);
  size_t ns = (size_t)(nr + 1) * (size_t)lds + 8, s;
  float *want = KT_ALLOC(float, ns), *got = KT_ALLOC(float, ns);
  const void **nk_rows = NULL, **nv_rows = NULL;
  kva__next_tile next;
  int i, j, k, bad = 0, fr = -1, fj = -1, outside = 0;
  double fgot = 0.0, fwant = 0.0, ftol = 0.0;
  for (k = 0; k < KK_NDT; k++)
    if (kk_dtypes[k] == t) dn = kk_dt_names[k];
  for (k = 0; k < nr; k++) qp[k] = q[k];
  for (j = 0; j < nk; j++) {
    idx[j] = kt_int(r, 0, KK_POOL - 1);
    kr[j] = pool->code[idx[j]];
  }
  kt_fill_sentinel(want, ns);
  kt_fill_sentinel(got, ns);
  kva__dot_tile_scalar(t, qp, nr, kr, nk, d, want, lds, KK_FP8_SCALE, NULL);
  if (im) {
    const kva__next_tile *np = NULL;
    if (use_next) { /* the next tile: other rows of the pool, at most nk of them */
      next.n = kt_int(r, 0, nk);
      nk_rows = KT_ALLOC(const void *, next.n);
      nv_rows = KT_ALLOC(const void *, next.n);
      for (j = 0; j < next.n; j++) {
        nk_rows[j] = pool->code[kt_int(r, 0, KK_POOL - 1)];
        nv_rows[j] = pool->code[kt_int(r, 0, KK_POOL - 1)];
      }
      next.k = nk_rows;
      next.v = nv_rows;
      next.k_bytes = pool->bytes;
      next.v_bytes = kt_int(r, 0, 1) ? pool->bytes : 0;
      np = &next;
    }
    im->dot(t, qp, nr, kr, nk, d, got, lds, KK_FP8_SCALE, np);
    if (use_next) {
      float *again = KT_ALLOC(float, ns);
      kt_fill_sentinel(again, ns);
      im->dot(t, qp, nr, kr, nk, d, again, lds, KK_FP8_SCALE, NULL);
      KT_CHECK(kt_same_bits(got, again, ns),
               "%s nr=%d nk=%d d=%d lds=%d: scores with a next tile to prefetch differ from next = NULL", dn, nr,
               nk, d, lds);
      free(again);
    }
  }
  for (k = 0; k < nr; k++)
    for (j = 0; j < nk; j++) {
      const float *kv = pool->deq[idx[j]];
      double bnd = 0.0, ref = 0.0, g, w, tol;
      for (i = 0; i < d; i++) {
        bnd += fabs((double)q[k][i] * (double)kv[i]);
        ref += (double)q[k][i] * (double)kv[i];
      }
      tol = KK_TOL * bnd + KK_ABS;
      g = im ? (double)got[(size_t)k * lds + j] : (double)want[(size_t)k * lds + j];
      w = im ? (double)want[(size_t)k * lds + j] : ref;
      if (!kk_close(g, w, tol)) {
        if (!bad) {
          fr = k;
          fj = j;
          fgot = g;
          fwant = w;
          ftol = tol;
        }
        bad++;
      }
    }
  KT_CHECK(bad == 0, "%s nr=%d nk=%d d=%d lds=%d%s: %d of %d scores off, first r=%d j=%d: got %.9g, %s %.9g (tol %.3g)",
           dn, nr, nk, d, lds, use_next ? " (next tile)" : "", bad, nr * nk, fr, fj, fgot,
           im ? "twin" : "double", fwant, ftol);
  if (im) {
    for (s = 0; s < ns; s++) {
      size_t row = s / (size_t)lds, col = s % (size_t)lds;
      if (row < (size_t)nr && col < (size_t)nk) continue;
      if (kt_f2u(got[s]) != kt_f2u(KT_SENTINEL)) outside++;
    }
    KT_CHECK(outside == 0, "%s nr=%d nk=%d d=%d lds=%d: %d floats written outside r < nr, j < nk", dn, nr, nk, d,
             lds, outside);
  }
  free(qp);
  free(kr);
  free(idx);
  free(want);
  free(got);
  free(nk_rows);
  free(nv_rows);
}

/* im NULL: the twin against double precision */
static void kk_test_dot(const kk_tile_impl *im, uint64_t seed) {
  kt_rng r;
  int ti, wi, nr, c, nks[64], n_nk, cases = 0;
  if (im)
    kk_begin("kernels: dot_tile %s vs %s", kk_impl_name(im->name), "scalar");
  else
    kk_begin("kernels: dot_tile %s vs %s", "scalar", "double");
  kt_seed(&r, seed);
  for (ti = 0; ti < KK_NDT; ti++)
    for (wi = 0; wi < KK_NW; wi++) {
      n_nk = kk_nks(kk_widths[wi], nks);
      for (nr = 1; nr <= 4; nr++)
        for (c = 0; c < n_nk; c++, cases++)
          kk_dot_case(im, &kk_pools[ti][wi], kk_q[wi], nr, nks[c], kk_stride(nks[c], cases % 3), cases % 4 == 3,
                      &r);
    }
  kk_end();
}

/* The many-row score kernel (keys along the lanes): its scalar twin, the
   build's vector one and the dispatcher, against the row-block scalar twin
   (itself checked against double above), for pass sizes 1..64 rows. */
static void kk_wdot_scalar(kva_dtype t, const float *const *q, int nr, const void *const *k, int nk, int d,
                           float *s, int lds, float cs, const kva__next_tile *nx) {
  kva__wdot_tile_scalar(t, q, nr, k, nk, d, s, lds, cs, nx);
}
#if KVATTN_SIMD == KVA_SIMD_AVX512
static void kk_wdot_avx512(kva_dtype t, const float *const *q, int nr, const void *const *k, int nk, int d,
                           float *s, int lds, float cs, const kva__next_tile *nx) {
  kva__wdot_tile_avx512(t, q, nr, k, nk, d, s, lds, cs, nx);
}
#endif
static const kk_tile_impl kk_wide_impls[] = {
    {"wide scalar", kk_wdot_scalar, NULL},
#if KVATTN_SIMD == KVA_SIMD_AVX512
    {"wide avx512", kk_wdot_avx512, NULL},
#endif
    {"wide dispatch", kva__dot_tile, NULL}, /* more than four rows: the many-row kernel */
};
static const int kk_wide_rows[] = {1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31, 64};

static void kk_test_wdot(const kk_tile_impl *im, uint64_t seed) {
  kt_rng r;
  int ti, wi, ri, c, nks[64], n_nk, cases = 0;
  const int n_rows = (int)(sizeof kk_wide_rows / sizeof kk_wide_rows[0]);
  kk_begin("kernels: %s vs %s", im->name, "scalar");
  kt_seed(&r, seed);
  for (ti = 0; ti < KK_NDT; ti++)
    for (wi = 0; wi < KK_NW; wi++) {
      n_nk = kk_nks(kk_widths[wi], nks);
      for (ri = 0; ri < n_rows; ri++)
        for (c = 0; c < n_nk; c++, cases++) {
          if (kk_wide_rows[ri] > 8 && n_nk > 13 && c % 4 != 0) continue; /* big passes: every 4th key count */
          kk_dot_case(im, &kk_pools[ti][wi], kk_q[wi], kk_wide_rows[ri], nks[c], kk_stride(nks[c], cases % 3),
                      cases % 4 == 3, &r);
        }
    }
  kk_end();
}

static void kk_vacc_case(const kk_tile_impl *im, const kk_pool *pool, int nr, int nk, int ldp, int zero_row,
                         kt_rng *r) {
  const kva_dtype t = pool->t;
  const int dv = pool->d;
  const char *dn = kk_dt_names[0];
  size_t np = (size_t)(nr - 1) * (size_t)ldp + (size_t)nk;
  float *p = KT_ALLOC(float, np);
  const void **vr = KT_ALLOC(const void *, nk);
  int *idx = KT_ALLOC(int, nk);
  float **acc0 = KT_ALLOC(float *, nr), **want = KT_ALLOC(float *, nr), **got = KT_ALLOC(float *, nr);
  size_t rowf = (size_t)dv + KK_GUARD, s;
  int i, j, k, bad = 0, fr = -1, fi = -1, outside = 0;
  double fgot = 0.0, fwant = 0.0, ftol = 0.0;
  for (k = 0; k < KK_NDT; k++)
    if (kk_dtypes[k] == t) dn = kk_dt_names[k];
  for (s = 0; s < np; s++) p[s] = kt_u2f(0x7fc0dead); /* padding: a NaN nobody may read */
  for (k = 0; k < nr; k++)
    for (j = 0; j < nk; j++)
      p[(size_t)k * ldp + j] = k == zero_row || kt_int(r, 0, 4) == 0 ? 0.0f : (float)kt_unit(r);
  for (j = 0; j < nk; j++) {
    idx[j] = kt_int(r, 0, KK_POOL - 1);
    vr[j] = pool->code[idx[j]];
  }
  for (k = 0; k < nr; k++) {
    acc0[k] = KT_ALLOC(float, rowf);
    want[k] = KT_ALLOC(float, rowf);
    got[k] = KT_ALLOC(float, rowf);
    kt_fill(r, acc0[k], (size_t)dv, -4.0f, 4.0f);
    kt_fill_sentinel(acc0[k] + dv, KK_GUARD);
    memcpy(want[k], acc0[k], rowf * sizeof(float));
    memcpy(got[k], acc0[k], rowf * sizeof(float));
  }
  kva__vacc_tile_scalar(t, want, nr, p, ldp, vr, nk, dv, KK_FP8_SCALE);
  im->vacc(t, got, nr, p, ldp, vr, nk, dv, KK_FP8_SCALE);
  for (k = 0; k < nr; k++) {
    for (i = 0; i < dv; i++) {
      double bnd = fabs((double)acc0[k][i]), tol;
      for (j = 0; j < nk; j++) bnd += fabs((double)p[(size_t)k * ldp + j] * (double)pool->deq[idx[j]][i]);
      tol = KK_TOL * bnd + KK_ABS;
      if (!kk_close(got[k][i], want[k][i], tol)) {
        if (!bad) {
          fr = k;
          fi = i;
          fgot = got[k][i];
          fwant = want[k][i];
          ftol = tol;
        }
        bad++;
      }
    }
    if (!kt_all_sentinel(got[k] + dv, KK_GUARD)) outside++;
  }
  KT_CHECK(bad == 0, "%s nr=%d nk=%d dv=%d ldp=%d: %d of %d sums off, first r=%d i=%d: got %.9g, twin %.9g (tol %.3g)",
           dn, nr, nk, dv, ldp, bad, nr * dv, fr, fi, fgot, fwant, ftol);
  KT_CHECK(outside == 0, "%s nr=%d nk=%d dv=%d ldp=%d: %d acc rows written after column dv", dn, nr, nk, dv, ldp,
           outside);
  for (k = 0; k < nr; k++) {
    free(acc0[k]);
    free(want[k]);
    free(got[k]);
  }
  free(acc0);
  free(want);
  free(got);
  free(p);
  free(vr);
  free(idx);
}

static void kk_test_vacc(const kk_tile_impl *im, uint64_t seed) {
  kt_rng r;
  int ti, wi, nr, c, nks[64], n_nk, cases = 0;
  kk_begin("kernels: vacc_tile %s vs %s", kk_impl_name(im->name), "scalar");
  kt_seed(&r, seed);
  for (ti = 0; ti < KK_NDT; ti++)
    for (wi = 0; wi < KK_NW; wi++) {
      n_nk = kk_nks(kk_widths[wi], nks);
      for (nr = 1; nr <= 4; nr++)
        for (c = 0; c < n_nk; c++, cases++)
          kk_vacc_case(im, &kk_pools[ti][wi], nr, nks[c], kk_stride(nks[c], cases % 3),
                       cases % 5 == 4 ? kt_int(&r, 0, nr - 1) : -1, &r);
    }
  kk_end();
}

/* ----------------------------------------------------------------- helpers */

typedef float (*kk_exp_fn)(float *, int, float);
typedef float (*kk_smax_fn)(float *, int, float);
typedef float (*kk_dotf_fn)(const float *, const float *, int);
typedef void (*kk_f16_fn)(uint16_t *, const float *, int);
typedef void (*kk_fp8_fn)(uint8_t *, const float *, size_t, float, const kva__fp8_format *);

typedef struct {
  const char *name; /* NULL: the selected ones (kva__exp_sub_sum, ...) */
  kk_exp_fn exp_sub_sum;
  kk_smax_fn scale_max;
  kk_dotf_fn dot_f32; /* NULL where it is another ISA's (AVX-512 uses AVX2's) */
  kk_f16_fn f16_row;
  kk_fp8_fn fp8_encode;
} kk_helper_impl;

static const kk_helper_impl kk_helper_impls[] = {
#if KVATTN_SIMD == KVA_SIMD_AVX2 || KVATTN_SIMD == KVA_SIMD_AVX512
    {"avx2", kva__exp_sub_sum_avx2, kva__scale_max_avx2, kva__dot_f32_avx2, kva__f32_to_f16_row_avx2,
     kva__fp8_encode_avx2},
#endif
#if KVATTN_SIMD == KVA_SIMD_AVX512
    {"avx512", kva__exp_sub_sum_avx512, kva__scale_max_avx512, NULL, NULL, NULL},
#endif
#if KVATTN_SIMD == KVA_SIMD_NEON
    {"neon", kva__exp_sub_sum_neon, kva__scale_max_neon, kva__dot_f32_neon, kva__f32_to_f16_row_neon,
     kva__fp8_encode_neon},
#endif
    {NULL, kva__exp_sub_sum, kva__scale_max, kva__dot_f32, kva__f32_to_f16_row, kva__fp8_encode},
};

static const char *kk_helper_name(const char *name) {
  static char buf[64];
  if (name) return name;
  snprintf(buf, sizeof buf, "selected(%s)", kva_simd_name());
  return buf;
}

#define KK_NN 11
static const int kk_ns[KK_NN] = {1, 7, 8, 9, 15, 16, 17, 31, 33, 65, 576};

/* exp_sub_sum inputs, by mode:
   0: x - m in [-20, 0], one element equal to m
   1: as 0 with a quarter of the elements -inf (masked scores)
   2: x - m in [-110, 0]: through the SIMD flush at -86.5 and expf's underflow
   3: all -inf but one element, m
   4: x - m in [-4, 4] (m not the largest) */
static float kk_exp_inputs(kt_rng *r, float *x, int n, int mode) {
  float m = kt_uniform(r, -50.0f, 50.0f);
  int i, top = kt_int(r, 0, n - 1);
  for (i = 0; i < n; i++) {
    switch (mode) {
      case 0: x[i] = m + kt_uniform(r, -20.0f, 0.0f); break;
      case 1: x[i] = kt_int(r, 0, 3) == 0 ? -INFINITY : m + kt_uniform(r, -20.0f, 0.0f); break;
      case 2: x[i] = m + kt_uniform(r, -110.0f, 0.0f); break;
      case 3: x[i] = -INFINITY; break;
      default: x[i] = m + kt_uniform(r, -4.0f, 4.0f); break;
    }
  }
  if (mode != 4) x[top] = m;
  return m;
}

static void kk_test_exp(const kk_helper_impl *h, uint64_t seed) {
  kt_rng r;
  int ni, mode, trial, trials = kt_quick ? 2 : 8, i;
  kk_begin("kernels: exp_sub_sum %s vs %s", kk_helper_name(h->name), "scalar");
  kt_seed(&r, seed);
  for (ni = 0; ni < KK_NN; ni++)
    for (mode = 0; mode < 5; mode++)
      for (trial = 0; trial < trials; trial++) {
        int n = kk_ns[ni], bad = 0, fi = -1, nz = 0;
        float *in = KT_ALLOC(float, n), *want = KT_ALLOC(float, n), *got = KT_ALLOC(float, n);
        float m = kk_exp_inputs(&r, in, n, mode), sw, sg;
        double exact = 0.0, exact_w = 0.0, abs_w = 0.0, tol;
        memcpy(want, in, (size_t)n * sizeof(float));
        memcpy(got, in, (size_t)n * sizeof(float));
        sw = kva__exp_sub_sum_scalar(want, n, m);
        sg = h->exp_sub_sum(got, n, m);
        for (i = 0; i < n; i++) {
          if (in[i] == -INFINITY) {
            if (kt_f2u(got[i]) != 0u) nz++;
          } else if (!kk_close(got[i], want[i], 4e-7 * fabs((double)want[i]) + 3e-38)) {
            if (!bad) fi = i;
            bad++;
          }
          exact += (double)got[i];
          exact_w += (double)want[i];
          abs_w += fabs((double)want[i]);
        }
        KT_CHECK(bad == 0, "n=%d mode %d: %d values off, first x[%d] = exp(%.9g - %.9g): got %.9g, twin %.9g", n,
                 mode, bad, fi, fi >= 0 ? (double)in[fi] : 0.0, (double)m, fi >= 0 ? (double)got[fi] : 0.0,
                 fi >= 0 ? (double)want[fi] : 0.0);
        KT_CHECK(nz == 0, "n=%d mode %d: %d of the -inf inputs did not give exactly +0", n, mode, nz);
        /* The sum: within 1e-6 of the exact sum of the values it wrote, and
           of the twin's sum, each plus the twin's own rounding error on this
           data (its float sum in order is off the exact one by up to ~1.1e-6
           relative at n = 576) */
        tol = 1e-6 * abs_w + fabs((double)sw - exact_w) + 1e-37;
        KT_CHECK(kk_close(sg, exact, tol), "n=%d mode %d: returned sum %.9g, the values written sum to %.9g (tol %.3g)",
                 n, mode, (double)sg, exact, tol);
        KT_CHECK(kk_close(sg, sw, tol), "n=%d mode %d: sum %.9g, twin's %.9g (tol %.3g)", n, mode, (double)sg,
                 (double)sw, tol);
        free(in);
        free(want);
        free(got);
      }
  kk_end();
}

static void kk_test_scale_max(const kk_helper_impl *h, uint64_t seed) {
  static const float scales[4] = {0.125f, 0.0883883476f, 1.0f, 3.7f};
  kt_rng r;
  int ni, mode, trial, trials = kt_quick ? 2 : 6, i;
  kk_begin("kernels: scale_max %s vs %s", kk_helper_name(h->name), "scalar");
  kt_seed(&r, seed);
  for (ni = 0; ni < KK_NN; ni++)
    for (mode = 0; mode < 3; mode++)
      for (trial = 0; trial < trials; trial++) {
        int n = kk_ns[ni];
        float *want = KT_ALLOC(float, n + 1), *got = KT_ALLOC(float, n + 1), sc = scales[trial % 4], mw, mg;
        for (i = 0; i < n; i++) /* mode 1: some -inf; mode 2: all -inf but maybe one */
          want[i] = mode == 2 ? -INFINITY
                    : mode == 1 && kt_int(&r, 0, 3) == 0 ? -INFINITY
                                                         : kt_uniform(&r, -30.0f, 30.0f);
        if (mode == 2 && trial % 2) want[kt_int(&r, 0, n - 1)] = kt_uniform(&r, -30.0f, 30.0f);
        want[n] = KT_SENTINEL;
        memcpy(got, want, (size_t)(n + 1) * sizeof(float));
        mw = kva__scale_max_scalar(want, n, sc);
        mg = h->scale_max(got, n, sc);
        KT_CHECK(kt_same_bits(got, want, (size_t)n + 1), "n=%d mode %d scale %g: scaled values differ from the twin's",
                 n, mode, (double)sc);
        KT_CHECK(mg == mw, "n=%d mode %d scale %g: max %.9g, twin %.9g", n, mode, (double)sc, (double)mg,
                 (double)mw);
        free(want);
        free(got);
      }
  kk_end();
}

static void kk_test_dot_f32(const kk_helper_impl *h, uint64_t seed) {
  kt_rng r;
  int ni, trial, trials = kt_quick ? 3 : 12, i;
  kk_begin("kernels: dot_f32 %s vs %s", kk_helper_name(h->name), "scalar");
  kt_seed(&r, seed);
  for (ni = 0; ni < KK_NN; ni++)
    for (trial = 0; trial < trials; trial++) {
      int n = kk_ns[ni];
      float *a = KT_ALLOC(float, n), *b = KT_ALLOC(float, n), w, g;
      double bnd = 0.0;
      for (i = 0; i < n; i++) {
        a[i] = kk_val(&r);
        b[i] = kk_val(&r);
        bnd += fabs((double)a[i] * (double)b[i]);
      }
      w = kva__dot_f32_scalar(a, b, n);
      g = h->dot_f32(a, b, n);
      KT_CHECK(kk_close(g, w, 1e-6 * bnd + 1e-30), "n=%d: %.9g, twin %.9g (tol %.3g)", n, (double)g, (double)w,
               1e-6 * bnd + 1e-30);
      free(a);
      free(b);
    }
  kk_end();
}

/* conversion inputs: specials first, then random bit patterns, then random
   values over the formats' ranges (x 2^[-30, 20]) */
static void kk_conv_inputs(kt_rng *r, float *x, int n, int trial) {
  static const uint32_t specials[] = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7fc00001u,
      0xffc12345u, 0x7fffffffu, 0x7f800001u, 0xff800001u, 0x7fbfffffu, 0x00000001u, 0x80000001u,
      0x007fffffu, 0x807fffffu, 0x00800000u, 0x7f7fffffu, 0xff7fffffu, 0x477ff000u, 0x477fefffu,
      0xc77ff000u, 0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u, 0x43e00000u, 0x43e80000u,
      0x47600000u, 0x47700000u, 0x3b800000u, 0x37800000u, 0x3f800000u, 0xbf800000u};
  const int ns = (int)(sizeof specials / sizeof specials[0]);
  int i;
  for (i = 0; i < n; i++) {
    int k = kt_int(r, 0, 2);
    if (trial == 0 && i < ns)
      x[i] = kt_u2f(specials[(i + n) % ns]);
    else if (k == 0)
      x[i] = kt_u2f(kt_u32(r));
    else if (k == 1)
      x[i] = kt_u2f(specials[kt_int(r, 0, ns - 1)]);
    else
      x[i] = (float)ldexp((double)kt_uniform(r, -1.0f, 1.0f), kt_int(r, -30, 20));
  }
}

static void kk_test_f16(const kk_helper_impl *h, uint64_t seed) {
  kt_rng r;
  int ni, trial, trials = kt_quick ? 4 : 24, i;
  kk_begin("kernels: f32_to_f16_row %s vs %s", kk_helper_name(h->name), "scalar");
  kt_seed(&r, seed);
  for (ni = 0; ni < KK_NN; ni++)
    for (trial = 0; trial < trials; trial++) {
      int n = kk_ns[ni], bad = 0, fi = -1;
      float *x = KT_ALLOC(float, n), *x0 = KT_ALLOC(float, n);
      uint16_t *want = KT_ALLOC(uint16_t, n + 4), *got = KT_ALLOC(uint16_t, n + 4);
      kk_conv_inputs(&r, x, n, trial);
      memcpy(x0, x, (size_t)n * sizeof(float));
      for (i = 0; i < n + 4; i++) got[i] = want[i] = 0xA5A5u;
      kva__f32_to_f16_row_scalar(want, x, n);
      h->f16_row(got, x, n);
      for (i = 0; i < n + 4; i++)
        if (got[i] != want[i]) {
          if (!bad) fi = i;
          bad++;
        }
      KT_CHECK(bad == 0, "n=%d: %d halves differ, first [%d] (float bits %08lx): 0x%04x, twin 0x%04x", n, bad, fi,
               fi >= 0 && fi < n ? (unsigned long)kt_f2u(x[fi]) : 0ul, fi >= 0 ? got[fi] : 0, fi >= 0 ? want[fi] : 0);
      KT_CHECK(kt_same_bits(x, x0, (size_t)n), "n=%d: the source changed", n);
      free(x);
      free(x0);
      free(want);
      free(got);
    }
  kk_end();
}

static void kk_test_fp8(const kk_helper_impl *h, uint64_t seed) {
  static const float muls[4] = {1.0f, 20.0f, 0.0009765625f, 81.300813f};
  kt_rng r;
  int ni, trial, trials = kt_quick ? 4 : 24, i, fi_;
  kk_begin("kernels: fp8_encode %s vs %s", kk_helper_name(h->name), "scalar");
  kt_seed(&r, seed);
  for (fi_ = 0; fi_ < 2; fi_++) {
    const kva__fp8_format *f = fi_ ? &kva__e5m2_format : &kva__e4m3_format;
    const char *fn = fi_ ? "E5M2" : "E4M3";
    for (ni = 0; ni < KK_NN; ni++)
      for (trial = 0; trial < trials; trial++) {
        int n = kk_ns[ni], bad = 0, fi = -1;
        float mul = muls[trial % 4];
        float *x = KT_ALLOC(float, n), *x0 = KT_ALLOC(float, n);
        uint8_t *want = KT_ALLOC(uint8_t, n + 4), *got = KT_ALLOC(uint8_t, n + 4);
        kk_conv_inputs(&r, x, n, trial);
        memcpy(x0, x, (size_t)n * sizeof(float));
        memset(want, 0xA5, (size_t)n + 4);
        memset(got, 0xA5, (size_t)n + 4);
        kva__fp8_encode_scalar(want, x, (size_t)n, mul, f);
        h->fp8_encode(got, x, (size_t)n, mul, f);
        for (i = 0; i < n + 4; i++)
          if (got[i] != want[i]) {
            if (!bad) fi = i;
            bad++;
          }
        KT_CHECK(bad == 0, "%s mul %g n=%d: %d codes differ, first [%d] (float bits %08lx): 0x%02x, twin 0x%02x", fn,
                 (double)mul, n, bad, fi, fi >= 0 && fi < n ? (unsigned long)kt_f2u(x[fi]) : 0ul,
                 fi >= 0 ? got[fi] : 0, fi >= 0 ? want[fi] : 0);
        KT_CHECK(kt_same_bits(x, x0, (size_t)n), "%s n=%d: the source changed", fn, n);
        free(x);
        free(x0);
        free(want);
        free(got);
      }
  }
  kk_end();
}

void test_kernels(void) {
  const int n_tile = (int)(sizeof kk_tile_impls / sizeof kk_tile_impls[0]);
  const int n_help = (int)(sizeof kk_helper_impls / sizeof kk_helper_impls[0]);
  const char *v = getenv("KVA_TEST_VERBOSE");
  int k;
  kk_verbose = v && *v && strcmp(v, "0") != 0;
  kk_setup();
  kk_test_dot(NULL, 0xD0700ULL);
  for (k = 0; k < n_tile; k++) {
    kk_test_dot(&kk_tile_impls[k], 0xD0701ULL + (uint64_t)k);
    kk_test_vacc(&kk_tile_impls[k], 0x7ACC0ULL + (uint64_t)k);
  }
  for (k = 0; k < (int)(sizeof kk_wide_impls / sizeof kk_wide_impls[0]); k++)
    kk_test_wdot(&kk_wide_impls[k], 0x3D070ULL + (uint64_t)k);
  for (k = 0; k < n_help; k++) {
    const kk_helper_impl *h = &kk_helper_impls[k];
    kk_test_exp(h, 0xE0900ULL + (uint64_t)k);
    kk_test_scale_max(h, 0x5CA1E0ULL + (uint64_t)k);
    if (h->dot_f32) kk_test_dot_f32(h, 0xD0F320ULL + (uint64_t)k);
    if (h->f16_row) kk_test_f16(h, 0xF1600ULL + (uint64_t)k);
    if (h->fp8_encode) kk_test_fp8(h, 0xF8E00ULL + (uint64_t)k);
  }
  kk_teardown();
}
