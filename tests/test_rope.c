/* test_rope.c - kva_rope_apply against ref_rope (fp64).
 *
 * Tolerance: |x' - ref| <= 2e-6 * (1 + max|x|) on the rotated values, and the
 * values past `dim` must be bit-identical.  The library rotates floats with
 * cos/sin of a double angle: a few float roundings, ~3e-7 relative (measured
 * worst: 0.02 of the tolerance).  docs/API.md states that the angles
 * pos * inv_freq are computed in double (in float they are off by about
 * 1e-3 rad at position 32768), and defines inv_freq[i] =
 * theta^(-2i/dim): positions here go up to ~131072, where an angle (or an
 * inv_freq) rounded to float is off by 1e-3..1e-2 rad, 500x the tolerance. */
#include "kvattn.h"
#include "harness.h"
#include "ref.h"

#define TOL_ROPE 2e-6

static double worst_rope_ratio;

static void rope_init(kva_rope *rp, float theta, int dim, int interleaved, const float *inv_freq) {
  memset(rp, 0, sizeof *rp);
  rp->theta = theta;
  rp->dim = dim;
  rp->interleaved = interleaved;
  rp->inv_freq = inv_freq;
}

/* x random in [-2, 2]; checks the rotated part against the reference and
   the rest for bit-identity. */
static void rope_case(kt_rng *r, const kva_rope *rp, int n, int H, int hd, const int32_t *pos,
                      const char *label) {
  size_t total = (size_t)n * H * hd, i;
  float *x = KT_ALLOC(float, total + 4), *x0 = KT_ALLOC(float, total + 4);
  double *ref = KT_ALLOC(double, total + 1);
  int dim = rp->dim ? rp->dim : hd, t, h, d;
  double xmax, tol, worst = 0.0;
  size_t wi = 0;
  kva_status st;
  kt_fill(r, x, total, -2.0f, 2.0f);
  for (i = total; i < total + 4; i++) x[i] = KT_SENTINEL;
  memcpy(x0, x, (total + 4) * sizeof(float));
  st = kva_rope_apply(rp, x, n, H, hd, pos);
  KT_CHECK(st == KVA_OK, "%s: kva_rope_apply returned %d (n=%d H=%d hd=%d dim=%d)", label, (int)st,
           n, H, hd, rp->dim);
  KT_CHECK(kt_all_sentinel(x + total, 4), "%s: wrote past the end of x", label);
  for (i = 0; i < total; i++) ref[i] = (double)x0[i];
  for (t = 0; t < n; t++)
    ref_rope(ref + (size_t)t * H * hd, H, hd, rp->dim, rp->interleaved, (double)rp->theta,
             rp->inv_freq, pos[t]);
  xmax = ref_max_abs_f(x0, total);
  tol = TOL_ROPE * (1.0 + xmax);
  for (t = 0; t < n; t++)
    for (h = 0; h < H; h++)
      for (d = 0; d < hd; d++) {
        size_t k = ((size_t)t * H + h) * hd + d;
        if (d < dim) {
          double e = fabs((double)x[k] - ref[k]);
          if (!(e <= 1e300)) e = INFINITY;
          if (e > worst) {
            worst = e;
            wi = k;
          }
        } else {
          KT_CHECK(kt_f2u(x[k]) == kt_f2u(x0[k]),
                   "%s: value past dim changed: [t %d][h %d][d %d] %.9g -> %.9g (dim %d)", label,
                   t, h, d, (double)x0[k], (double)x[k], dim);
        }
      }
  if (worst / tol > worst_rope_ratio) worst_rope_ratio = worst / tol;
  KT_CHECK(worst <= tol,
           "%s: max err %.3g > tol %.3g at [t %d][h %d][d %d] pos %ld: got %.9g want %.9g "
           "(theta %g dim %d hd %d interleaved %d table %s)",
           label, worst, tol, (int)(wi / ((size_t)H * hd)), (int)(wi / hd % H), (int)(wi % hd),
           (long)pos[wi / ((size_t)H * hd)], (double)x[wi], ref[wi], (double)rp->theta, rp->dim,
           hd, rp->interleaved, rp->inv_freq ? "yes" : "no");
  free(x);
  free(x0);
  free(ref);
}

static void test_rope_hand(void) {
  kva_rope rp;
  float x2[2] = {1.0f, 0.0f}, x4[4];
  double r2[2] = {1.0, 0.0}, r4[4];
  int32_t p1 = 1, p5 = 5;
  kt_begin("rope: hand-computed rotations");
  /* dim 2: pair 0 frequency theta^0 = 1 -> angle = pos */
  rope_init(&rp, 10000.0f, 0, 0, NULL);
  KT_STATUS(kva_rope_apply(&rp, x2, 1, 1, 2, &p1), KVA_OK);
  KT_NEAR(x2[0], cos(1.0), 1e-6);
  KT_NEAR(x2[1], sin(1.0), 1e-6);
  ref_rope(r2, 1, 2, 0, 0, 10000.0, NULL, 1);
  KT_NEAR(r2[0], cos(1.0), 1e-15);
  KT_NEAR(r2[1], sin(1.0), 1e-15);
  /* rotate-half, head 4, theta 100: pair 1 is (x1, x3) at frequency 0.1 */
  x4[0] = 0.0f;
  x4[1] = 1.0f;
  x4[2] = 0.0f;
  x4[3] = 0.0f;
  rope_init(&rp, 100.0f, 0, 0, NULL);
  KT_STATUS(kva_rope_apply(&rp, x4, 1, 1, 4, &p5), KVA_OK);
  KT_NEAR(x4[0], 0.0, 1e-7);
  KT_NEAR(x4[1], cos(0.5), 1e-6);
  KT_NEAR(x4[2], 0.0, 1e-7);
  KT_NEAR(x4[3], sin(0.5), 1e-6);
  r4[0] = 0;
  r4[1] = 1;
  r4[2] = 0;
  r4[3] = 0;
  ref_rope(r4, 1, 4, 0, 0, 100.0, NULL, 5);
  KT_NEAR(r4[1], cos(0.5), 1e-15);
  KT_NEAR(r4[3], sin(0.5), 1e-15);
  /* interleaved, head 4, theta 100: pair 1 is (x2, x3) at frequency 0.1 */
  x4[0] = 0.0f;
  x4[1] = 0.0f;
  x4[2] = 1.0f;
  x4[3] = 0.0f;
  rope_init(&rp, 100.0f, 0, 1, NULL);
  KT_STATUS(kva_rope_apply(&rp, x4, 1, 1, 4, &p5), KVA_OK);
  KT_NEAR(x4[0], 0.0, 1e-7);
  KT_NEAR(x4[1], 0.0, 1e-7);
  KT_NEAR(x4[2], cos(0.5), 1e-6);
  KT_NEAR(x4[3], sin(0.5), 1e-6);
  /* partial dim 2 of head 4 (rotate half): only (x0, x1) rotate, at freq 1 */
  x4[0] = 1.0f;
  x4[1] = 0.0f;
  x4[2] = 3.0f;
  x4[3] = 4.0f;
  rope_init(&rp, 100.0f, 2, 0, NULL);
  KT_STATUS(kva_rope_apply(&rp, x4, 1, 1, 4, &p1), KVA_OK);
  KT_NEAR(x4[0], cos(1.0), 1e-6);
  KT_NEAR(x4[1], sin(1.0), 1e-6);
  KT_CHECK(x4[2] == 3.0f && x4[3] == 4.0f, "partial dim touched the tail: %g %g", (double)x4[2],
           (double)x4[3]);
  /* an inv_freq table overrides theta */
  {
    float tab[2] = {0.25f, 2.0f};
    x4[0] = 1.0f;
    x4[1] = 1.0f;
    x4[2] = 0.0f;
    x4[3] = 0.0f;
    rope_init(&rp, 10000.0f, 0, 0, tab);
    KT_STATUS(kva_rope_apply(&rp, x4, 1, 1, 4, &p1), KVA_OK);
    KT_NEAR(x4[0], cos(0.25), 1e-6);
    KT_NEAR(x4[2], sin(0.25), 1e-6);
    KT_NEAR(x4[1], cos(2.0), 1e-6);
    KT_NEAR(x4[3], sin(2.0), 1e-6);
  }
}

/* Large positions: angles must be computed in double. */
static void test_rope_far(void) {
  static const int32_t far[] = {32768, 32769, 65535, 100000, 131071, 4095, 8191, 77777};
  kt_rng r;
  kva_rope rp;
  int s;
  kt_begin("rope: large positions (double-precision angles)");
  kt_seed(&r, 0x1234);
  for (s = 0; s < 2; s++) {
    rope_init(&rp, 10000.0f, 0, s, NULL);
    rope_case(&r, &rp, 8, 2, 128, far, "theta 1e4 D128 far");
    rope_init(&rp, 500000.0f, 0, s, NULL);
    rope_case(&r, &rp, 8, 2, 128, far, "theta 5e5 D128 far");
    rope_init(&rp, 10000.0f, 64, s, NULL);
    rope_case(&r, &rp, 8, 3, 192, far, "theta 1e4 partial 64 of 192 far");
  }
}

static void test_rope_random(void) {
  static const int hds[] = {2, 4, 6, 8, 10, 16, 32, 64, 96, 128, 7, 9, 33};
  static const float thetas[] = {10000.0f, 500000.0f, 1000000.0f, 10.0f, 0.0f};
  kt_rng r;
  int it, n_it = kt_iters(600);
  kt_begin("rope: random shapes vs fp64 reference");
  kt_seed(&r, 0x707E);
  for (it = 0; it < n_it; it++) {
    kva_rope rp;
    int hd = kt_pick(&r, hds, (int)(sizeof hds / sizeof hds[0]));
    int n = kt_int(&r, 1, 6), H = kt_int(&r, 1, 5), dim, t, j;
    float theta = thetas[kt_int(&r, 0, 4)];
    float *tab = NULL;
    int32_t *pos = KT_ALLOC(int32_t, n);
    if (hd % 2 == 0 && kt_int(&r, 0, 1))
      dim = kt_int(&r, 0, 1) ? 0 : hd;
    else
      dim = 2 * kt_int(&r, 1, hd / 2); /* even, <= hd */
    if (theta == 0.0f || kt_int(&r, 0, 4) == 0) {
      int half = (dim ? dim : hd) / 2;
      tab = KT_ALLOC(float, half);
      for (j = 0; j < half; j++) tab[j] = (float)(pow(kt_unit(&r), 3.0) * 1.5);
    }
    for (t = 0; t < n; t++) {
      switch (kt_int(&r, 0, 3)) {
        case 0: pos[t] = kt_int(&r, 0, 16); break;
        case 1: pos[t] = kt_int(&r, 0, 4096); break;
        default: pos[t] = kt_int(&r, 0, 131072); break;
      }
    }
    rope_init(&rp, theta, dim, kt_int(&r, 0, 1), tab);
    rope_case(&r, &rp, n, H, hd, pos, "random");
    free(tab);
    free(pos);
  }
}

static void test_rope_noop_and_bad(void) {
  kva_rope rp;
  float x[3 * 2 * 8], x0[3 * 2 * 8];
  int32_t pos[3] = {1, 50, 7000};
  kt_rng r;
  kva_status st;
  kt_begin("rope: no-op and bad arguments");
  kt_seed(&r, 3);
  kt_fill(&r, x, sizeof x / sizeof x[0], -2, 2);
  memcpy(x0, x, sizeof x);
  /* theta 0 and inv_freq NULL: no RoPE */
  rope_init(&rp, 0.0f, 0, 0, NULL);
  KT_STATUS(kva_rope_apply(&rp, x, 3, 2, 8, pos), KVA_OK);
  KT_CHECK(memcmp(x, x0, sizeof x) == 0, "theta 0, no table: x changed");
  rope_init(&rp, 0.0f, 4, 1, NULL);
  KT_STATUS(kva_rope_apply(&rp, x, 3, 2, 8, pos), KVA_OK);
  KT_CHECK(memcmp(x, x0, sizeof x) == 0, "theta 0, no table, dim 4: x changed");
  /* zero tokens: nothing to do */
  rope_init(&rp, 10000.0f, 0, 0, NULL);
  KT_STATUS(kva_rope_apply(&rp, x, 0, 2, 8, pos), KVA_OK);
  KT_CHECK(memcmp(x, x0, sizeof x) == 0, "n_tokens 0: x changed");
#define BADR(call, what)                                                                  \
  do {                                                                                    \
    memcpy(x, x0, sizeof x);                                                              \
    st = (call);                                                                          \
    KT_CHECK(st == KVA_ERR_ARG, "%s: status %d, expected KVA_ERR_ARG", what, (int)st);    \
    KT_CHECK(memcmp(x, x0, sizeof x) == 0, "%s: x changed on error", what);               \
  } while (0)
  rope_init(&rp, 10000.0f, 3, 0, NULL);
  BADR(kva_rope_apply(&rp, x, 3, 2, 8, pos), "odd dim 3");
  rope_init(&rp, 10000.0f, 10, 0, NULL);
  BADR(kva_rope_apply(&rp, x, 3, 2, 8, pos), "dim 10 > head_dim 8");
  rope_init(&rp, 10000.0f, -2, 0, NULL);
  BADR(kva_rope_apply(&rp, x, 3, 2, 8, pos), "dim < 0");
  rope_init(&rp, 10000.0f, 0, 0, NULL);
  BADR(kva_rope_apply(&rp, x, 3, 2, 7, pos), "dim 0 with odd head_dim 7");
  BADR(kva_rope_apply(NULL, x, 3, 2, 8, pos), "r NULL");
  BADR(kva_rope_apply(&rp, NULL, 3, 2, 8, pos), "x NULL");
  BADR(kva_rope_apply(&rp, x, -1, 2, 8, pos), "n_tokens < 0");
  BADR(kva_rope_apply(&rp, x, 3, 0, 8, pos), "n_heads 0");
  BADR(kva_rope_apply(&rp, x, 3, -2, 8, pos), "n_heads < 0");
  BADR(kva_rope_apply(&rp, x, 3, 2, 0, pos), "head_dim 0");
  BADR(kva_rope_apply(&rp, x, 3, 2, -8, pos), "head_dim < 0");
#undef BADR
}

void test_rope(void) {
  test_rope_hand();
  test_rope_far();
  test_rope_random();
  test_rope_noop_and_bad();
  if (getenv("KVA_TEST_VERBOSE")) fprintf(stderr, "  rope: worst err/tol %.3f\n", worst_rope_ratio);
}
