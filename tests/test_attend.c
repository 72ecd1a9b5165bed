/* test_attend.c - kva_attend on plain arrays against ref_attend (fp64).
 *
 * Tolerances (F32 inputs, all work in float in the library):
 *   out: max |out - ref| <= 2e-5 * (1 + max|v|)
 *   lse: |lse - ref|     <= 1e-5 * (1 + |ref lse|)
 * Why: a float dot product of length D <= 128 over inputs in [-1, 1] is off
 * by a few 1e-7 relative (a few 1e-6 absolute on scores up to ~15), a SIMD
 * exp approximation adds up to ~1e-6 relative per term, and the weighted sum
 * of V in float adds ~1e-6 * max|v|.  Measured (KVA_TEST_VERBOSE=1 prints
 * it): worst out error 0.07 of the tolerance on the scalar path, 0.03 with
 * AVX2, i.e. ~1.4e-6 * (1 + max|v|); worst lse error 0.05 of its tolerance.
 * The margin is for other accumulation orders and exp approximations; any
 * semantic error (a wrong mask, scale, head mapping or softcap) moves outputs
 * by 1e-3 or more.  Queries that see nothing must give exact zeros and
 * lse == -INFINITY.
 *
 * Also: decode (n_q == 1) must never call KVATTN_MALLOC (docs/API.md), so this
 * file counts KVATTN_MALLOC/KVATTN_FREE calls; larger calls must free what
 * they take. */
#include "count_alloc.h"
#include "kvattn.h"
#include "harness.h"
#include "ref.h"

#define TOL_OUT_REL 2e-5
#define TOL_LSE_REL 1e-5
#define GUARD 8

static double worst_out_ratio, worst_lse_ratio; /* err / tol, for the report */

typedef struct {
  kva_attn a;
  int n_q, n_kv;
  const int32_t *q_pos, *kv_pos;
  int want_lse;
  float v_amp;
  int check_threads;
  const char *label;
} att_case;

/* Runs one case with random q, k, v; checks against the reference, the
   guards after out/lse, the invisible-query rule, the allocation rule and
   (optionally) n_threads 1 vs 2 bit-identity. */
static void run_case(kt_rng *r, const att_case *tc, const float *q_in, const float *k_in,
                     const float *v_in) {
  const kva_attn *a = &tc->a;
  ref_attn_cfg c = ref_cfg(a);
  size_t nq = (size_t)tc->n_q * c.H * c.D, nk = (size_t)tc->n_kv * c.G * c.D,
         nv = (size_t)tc->n_kv * c.G * c.Dv, no = (size_t)tc->n_q * c.H * c.Dv,
         nl = (size_t)tc->n_q * c.H, i;
  float *q = KT_ALLOC(float, nq), *k = KT_ALLOC(float, nk + 1), *v = KT_ALLOC(float, nv + 1);
  float *out = KT_ALLOC(float, no + GUARD), *lse = KT_ALLOC(float, nl + GUARD);
  double *rq, *rk, *rv, *ro = KT_ALLOC(double, no + 1), *rl = KT_ALLOC(double, nl + 1);
  float *q0, *k0, *v0;
  double tol_out, err, vmax;
  size_t where = 0;
  long m0, f0;
  kva_status st;

  if (q_in) memcpy(q, q_in, nq * sizeof(float));
  else kt_fill(r, q, nq, -1.0f, 1.0f);
  if (k_in) memcpy(k, k_in, nk * sizeof(float));
  else kt_fill(r, k, nk, -1.0f, 1.0f);
  if (v_in) memcpy(v, v_in, nv * sizeof(float));
  else kt_fill(r, v, nv, -tc->v_amp, tc->v_amp);
  kt_fill_sentinel(out, no + GUARD);
  kt_fill_sentinel(lse, nl + GUARD);

  q0 = KT_ALLOC(float, nq + 1);
  k0 = KT_ALLOC(float, nk + 1);
  v0 = KT_ALLOC(float, nv + 1);
  memcpy(q0, q, nq * sizeof(float));
  memcpy(k0, k, nk * sizeof(float));
  memcpy(v0, v, nv * sizeof(float));
  m0 = kt_mallocs;
  f0 = kt_frees;
  st = kva_attend(a, q, tc->n_q, tc->q_pos, k, v, tc->n_kv, tc->kv_pos, out,
                  tc->want_lse ? lse : NULL);
  KT_CHECK(st == KVA_OK, "%s: kva_attend returned %d (H=%d G=%d D=%d Dv=%d n_q=%d n_kv=%d)",
           tc->label, (int)st, c.H, c.G, c.D, c.Dv, tc->n_q, tc->n_kv);
  if (tc->n_q == 1)
    KT_CHECK(kt_mallocs == m0, "%s: decode (n_q == 1) called KVATTN_MALLOC %ld times",
             tc->label, kt_mallocs - m0);
  KT_CHECK(kt_mallocs - m0 == kt_frees - f0,
           "%s: kva_attend took %ld blocks and freed %ld", tc->label, kt_mallocs - m0,
           kt_frees - f0);
  KT_CHECK(kt_all_sentinel(out + no, GUARD), "%s: wrote past the end of out", tc->label);
  KT_CHECK(kt_all_sentinel(lse + nl, GUARD), "%s: wrote past the end of lse", tc->label);
  if (!tc->want_lse) KT_CHECK(kt_all_sentinel(lse, nl), "%s: lse NULL but written?", tc->label);
  KT_CHECK(kt_same_bits(q, q0, nq) && kt_same_bits(k, k0, nk) && kt_same_bits(v, v0, nv),
           "%s: kva_attend modified its inputs", tc->label);
  free(q0);
  free(k0);
  free(v0);

  rq = ref_dup_f(q, nq);
  rk = ref_dup_f(k, nk);
  rv = ref_dup_f(v, nv);
  ref_attend(&c, rq, tc->n_q, tc->q_pos, rk, rv, tc->n_kv, tc->kv_pos, ro, rl);
  vmax = ref_max_abs_f(v, nv);
  tol_out = TOL_OUT_REL * (1.0 + vmax);
  err = ref_max_err(out, ro, no, &where);
  if (err / tol_out > worst_out_ratio) worst_out_ratio = err / tol_out;
  KT_CHECK(err <= tol_out,
           "%s: out max err %.3g > tol %.3g at [q %d][h %d][d %d]: got %.9g want %.9g "
           "(H=%d G=%d D=%d Dv=%d n_q=%d n_kv=%d win=%d sink=%d cap=%g scale=%g qpos=%s kvpos=%s)",
           tc->label, err, tol_out, (int)(where / ((size_t)c.H * c.Dv)),
           (int)(where / c.Dv % c.H), (int)(where % c.Dv), no ? (double)out[where] : 0.0,
           no ? ro[where] : 0.0, c.H, c.G, c.D, c.Dv, tc->n_q, tc->n_kv, c.window, c.n_sink,
           c.softcap, c.scale, tc->q_pos ? "given" : "NULL", tc->kv_pos ? "given" : "NULL");
  /* queries that see nothing: exact zeros and -inf */
  for (i = 0; i < nl; i++) {
    if (rl[i] == -INFINITY) {
      int d, zero = 1;
      for (d = 0; d < c.Dv; d++) zero &= out[i * c.Dv + d] == 0.0f;
      KT_CHECK(zero, "%s: query row %d head %d sees no key but output is not zero", tc->label,
               (int)(i / c.H), (int)(i % c.H));
      if (tc->want_lse)
        KT_CHECK(lse[i] == -INFINITY, "%s: query row %d head %d sees no key, lse = %g not -inf",
                 tc->label, (int)(i / c.H), (int)(i % c.H), (double)lse[i]);
    } else if (tc->want_lse) {
      double tl = TOL_LSE_REL * (1.0 + fabs(rl[i])), e = fabs((double)lse[i] - rl[i]);
      if (!(e <= 1e300)) e = INFINITY;
      if (e / tl > worst_lse_ratio) worst_lse_ratio = e / tl;
      KT_CHECK(e <= tl, "%s: lse[%d][%d] = %.9g, want %.9g (tol %.3g; H=%d G=%d D=%d n_kv=%d)",
               tc->label, (int)(i / c.H), (int)(i % c.H), (double)lse[i], rl[i], tl, c.H, c.G,
               c.D, tc->n_kv);
    }
  }

  if (tc->check_threads) {
    float *o1 = KT_ALLOC(float, no + 1), *o2 = KT_ALLOC(float, no + 1);
    float *l1 = KT_ALLOC(float, nl + 1), *l2 = KT_ALLOC(float, nl + 1);
    kva_attn a1 = *a, a2 = *a;
    kva_status s1, s2;
    a1.n_threads = 1;
    a2.n_threads = 2;
    s1 = kva_attend(&a1, q, tc->n_q, tc->q_pos, k, v, tc->n_kv, tc->kv_pos, o1, l1);
    s2 = kva_attend(&a2, q, tc->n_q, tc->q_pos, k, v, tc->n_kv, tc->kv_pos, o2, l2);
    KT_CHECK(s1 == KVA_OK && s2 == KVA_OK, "%s: threads run status %d %d", tc->label, (int)s1,
             (int)s2);
    KT_CHECK(kt_same_bits(o1, o2, no) && kt_same_bits(l1, l2, nl),
             "%s: n_threads 1 and 2 differ (H=%d G=%d D=%d n_q=%d n_kv=%d)", tc->label, c.H,
             c.G, c.D, tc->n_q, tc->n_kv);
    free(o1);
    free(o2);
    free(l1);
    free(l2);
  }
  free(q);
  free(k);
  free(v);
  free(out);
  free(lse);
  free(rq);
  free(rk);
  free(rv);
  free(ro);
  free(rl);
}

/* ---- hand-computed cases: they check the reference as much as the library */
static void test_hand(void) {
  kt_rng r;
  kva_attn a;
  float q[1] = {1.0f}, k[2], v[2] = {1.0f, 5.0f}, out[1], lse[1];
  float vq[1] = {0.0f}, vk[10], vv[10], vo[1];
  double rq = 1.0, rk[2], rv[2] = {1.0, 5.0}, ro[1], rl[1];
  ref_attn_cfg c;
  int j;
  kt_begin("attend: hand-computed cases");
  kt_seed(&r, 1);
  /* scores 0 and ln 3 -> p = 1/4, 3/4 -> out = 4, lse = ln 4 */
  k[0] = 0.0f;
  k[1] = (float)log(3.0);
  kt_attn_init(&a, 1, 1, 1, 0);
  a.scale = 1.0f;
  KT_STATUS(kva_attend(&a, q, 1, NULL, k, v, 2, NULL, out, lse), KVA_OK);
  KT_NEAR(out[0], 4.0, 1e-5);
  KT_NEAR(lse[0], log(4.0), 1e-6);
  c = ref_cfg(&a);
  rk[0] = k[0];
  rk[1] = k[1];
  ref_attend(&c, &rq, 1, NULL, rk, rv, 2, NULL, ro, rl);
  KT_NEAR(ro[0], 4.0, 1e-6);
  KT_NEAR(rl[0], log(4.0), 1e-7); /* k[1] is ln 3 rounded to float */
  /* default scale 1/sqrt(D): D = 4, q = k = (1,1,1,1) -> score 4/2 = 2 for
     one key; second key zero -> p = e^2/(e^2+1) */
  {
    float q4[4] = {1, 1, 1, 1}, k4[8] = {1, 1, 1, 1, 0, 0, 0, 0}, v4[8] = {1, 0, 0, 0, 0, 1, 0, 0};
    float o4[4], l4[1];
    double p = exp(2.0) / (exp(2.0) + 1.0);
    kt_attn_init(&a, 1, 1, 4, 0);
    KT_STATUS(kva_attend(&a, q4, 1, NULL, k4, v4, 2, NULL, o4, l4), KVA_OK);
    KT_NEAR(o4[0], p, 1e-6);
    KT_NEAR(o4[1], 1.0 - p, 1e-6);
    KT_NEAR(l4[0], log(exp(2.0) + 1.0), 1e-5);
    /* softcap 1: score 2 -> tanh(2) */
    a.softcap = 1.0f;
    p = exp(tanh(2.0)) / (exp(tanh(2.0)) + 1.0);
    KT_STATUS(kva_attend(&a, q4, 1, NULL, k4, v4, 2, NULL, o4, l4), KVA_OK);
    KT_NEAR(o4[0], p, 1e-6);
    KT_NEAR(l4[0], log(exp(tanh(2.0)) + 1.0), 1e-5);
  }
  /* window/sink: 10 keys at 0..9, all scores 0 (q = 0), v_j = j; the query
     at 9 averages the visible keys. window 3: {7,8,9} -> 8; window 3 with
     sink 2: {0,1,7,8,9} -> 5; window 1: {9}; window 10: all -> 4.5 */
  for (j = 0; j < 10; j++) {
    vk[j] = kt_uniform(&r, -1, 1);
    vv[j] = (float)j;
  }
  kt_attn_init(&a, 1, 1, 1, 0);
  a.window = 3;
  KT_STATUS(kva_attend(&a, vq, 1, NULL, vk, vv, 10, NULL, vo, NULL), KVA_OK);
  KT_NEAR(vo[0], 8.0, 1e-5);
  a.n_sink = 2;
  KT_STATUS(kva_attend(&a, vq, 1, NULL, vk, vv, 10, NULL, vo, NULL), KVA_OK);
  KT_NEAR(vo[0], 5.0, 1e-5);
  a.n_sink = 0;
  a.window = 1;
  KT_STATUS(kva_attend(&a, vq, 1, NULL, vk, vv, 10, NULL, vo, NULL), KVA_OK);
  KT_NEAR(vo[0], 9.0, 1e-5);
  a.window = 10;
  KT_STATUS(kva_attend(&a, vq, 1, NULL, vk, vv, 10, NULL, vo, NULL), KVA_OK);
  KT_NEAR(vo[0], 4.5, 1e-5);
  /* a sink with no window changes nothing: plain causal */
  a.window = 0;
  a.n_sink = 3;
  KT_STATUS(kva_attend(&a, vq, 1, NULL, vk, vv, 10, NULL, vo, NULL), KVA_OK);
  KT_NEAR(vo[0], 4.5, 1e-5);
  /* explicit positions: query at 4 sees keys at positions <= 4 only */
  {
    int32_t kp[10], qp[1] = {4};
    for (j = 0; j < 10; j++) kp[j] = 9 - j; /* reversed: key j at 9-j */
    a.n_sink = 0;
    KT_STATUS(kva_attend(&a, vq, 1, qp, vk, vv, 10, kp, vo, NULL), KVA_OK);
    /* visible keys j = 5..9 (positions 4..0) -> mean of 5..9 = 7 */
    KT_NEAR(vo[0], 7.0, 1e-5);
  }
}

/* ---- large-magnitude scores: the softmax must subtract its max */
static void test_stability(void) {
  kt_rng r;
  att_case tc;
  int n = 64, j;
  float *q = KT_ALLOC(float, 8), *k = KT_ALLOC(float, (size_t)n * 8), *v = KT_ALLOC(float, (size_t)n * 4);
  float out[2 * 4], lse[2];
  kt_begin("attend: large scores (stability)");
  kt_seed(&r, 77);
  memset(&tc, 0, sizeof tc);
  kt_attn_init(&tc.a, 2, 1, 4, 4);
  tc.a.scale = 1.0f;
  /* exact scores: q = (s, 0, 0, 0) per head, k_j = (j - 32, 0, 0, 0) */
  memset(q, 0, 8 * sizeof(float));
  memset(k, 0, (size_t)n * 4 * sizeof(float));
  q[0] = 30.0f;  /* head 0: scores 30 * (j - 32), up to +-960 */
  q[4] = -25.0f; /* head 1: the opposite end */
  for (j = 0; j < n; j++) k[(size_t)j * 4] = (float)(j - 32);
  kt_fill(&r, v, (size_t)n * 4, -3.0f, 3.0f);
  KT_STATUS(kva_attend(&tc.a, q, 1, NULL, k, v, n, NULL, out, lse), KVA_OK);
  /* head 0: key 63 dominates (next is e^-30 smaller); head 1: key 0 */
  for (j = 0; j < 4; j++) {
    KT_NEAR(out[j], v[63 * 4 + j], 1e-5);
    KT_NEAR(out[4 + j], v[0 * 4 + j], 1e-5);
  }
  KT_NEAR(lse[0], 30.0 * 31.0, 1e-5 * 931.0);
  KT_NEAR(lse[1], 25.0 * 32.0, 1e-5 * 801.0);
  /* huge: 1e15 * 1e15 = 1e30 */
  q[0] = 1e15f;
  q[4] = -1e15f;
  for (j = 0; j < n; j++) k[(size_t)j * 4] = (j == 10 ? 1e15f : (j == 20 ? -1e15f : 0.0f));
  KT_STATUS(kva_attend(&tc.a, q, 1, NULL, k, v, n, NULL, out, lse), KVA_OK);
  for (j = 0; j < 4; j++) {
    KT_NEAR(out[j], v[10 * 4 + j], 1e-5);
    KT_NEAR(out[4 + j], v[20 * 4 + j], 1e-5);
  }
  KT_CHECK(fabs(lse[0] / 1e30 - 1.0) < 1e-5, "lse at 1e30 scores: %g", (double)lse[0]);
  /* softcap keeps them bounded: cap 50 -> scores in (-50, 50), exact ref */
  memset(&tc, 0, sizeof tc);
  kt_attn_init(&tc.a, 2, 1, 4, 4);
  tc.a.scale = 1.0f;
  tc.a.softcap = 50.0f;
  tc.n_q = 1;
  tc.n_kv = n;
  tc.want_lse = 1;
  tc.v_amp = 3.0f;
  tc.label = "softcap 50 with scores ~1e30";
  run_case(&r, &tc, q, k, v);
  free(q);
  free(k);
  free(v);
}

/* ---- queries that see nothing */
static void test_invisible(void) {
  kt_rng r;
  att_case tc;
  int32_t kvp[6] = {5, 6, 7, 8, 9, 10}, qp[3] = {0, 4, 7};
  float dummy[64];
  float out[3 * 2 * 3], lse[3 * 2];
  int i;
  kt_begin("attend: queries that see no key");
  kt_seed(&r, 5);
  memset(&tc, 0, sizeof tc);
  kt_attn_init(&tc.a, 2, 1, 3, 0);
  tc.n_q = 3;
  tc.n_kv = 6;
  tc.q_pos = qp;
  tc.kv_pos = kvp;
  tc.want_lse = 1;
  tc.v_amp = 1.0f;
  tc.label = "queries before every key";
  run_case(&r, &tc, NULL, NULL, NULL); /* rows 0, 1 see nothing, row 2 sees 5..7 */
  /* n_kv == 0 with explicit q_pos: zeros and -inf */
  for (i = 0; i < 64; i++) dummy[i] = 1.0f;
  kt_fill_sentinel(out, 18);
  kt_fill_sentinel(lse, 6);
  KT_STATUS(kva_attend(&tc.a, dummy, 3, qp, dummy, dummy, 0, NULL, out, lse), KVA_OK);
  for (i = 0; i < 18; i++) KT_CHECK(out[i] == 0.0f, "n_kv == 0: out[%d] = %g", i, (double)out[i]);
  for (i = 0; i < 6; i++) KT_CHECK(lse[i] == -INFINITY, "n_kv == 0: lse[%d] = %g", i, (double)lse[i]);
  /* a window with sink 0 and the query far ahead of every key */
  {
    int32_t qfar[1] = {100};
    tc.n_q = 1;
    tc.q_pos = qfar;
    tc.a.window = 4;
    tc.label = "window leaves nothing visible";
    run_case(&r, &tc, NULL, NULL, NULL);
    tc.a.n_sink = 6; /* position 5 is a sink -> visible */
    tc.label = "window with one sink visible";
    run_case(&r, &tc, NULL, NULL, NULL);
  }
}

static int divisor_of(kt_rng *r, int H) {
  int divs[16], n = 0, d;
  for (d = 1; d <= H; d++)
    if (H % d == 0) divs[n++] = d;
  return divs[kt_int(r, 0, n - 1)];
}

/* ---- randomized shapes */
static void test_random_shapes(void) {
  static const int dims[] = {1, 3, 7, 8, 13, 16, 64, 100, 128};
  kt_rng r;
  int it, n_cases = kt_iters(800);
  kt_begin("attend: random shapes vs fp64 reference");
  kt_seed(&r, 0xA77E4D);
  for (it = 0; it < n_cases; it++) {
    att_case tc;
    int H = kt_int(&r, 1, 16), G = divisor_of(&r, H);
    int D = kt_pick(&r, dims, (int)(sizeof dims / sizeof dims[0]));
    int Dv = kt_int(&r, 0, 2) ? D : kt_pick(&r, dims, (int)(sizeof dims / sizeof dims[0]));
    int n_kv, n_q, j, kvmode, qmode, maxkp = 0, minkp = 0;
    int32_t *qp = NULL, *kp = NULL;
    float sinks[16];
    double budget;
    memset(&tc, 0, sizeof tc);
    kt_attn_init(&tc.a, H, G, D, (Dv == D && kt_int(&r, 0, 1)) ? 0 : Dv);
    switch (kt_int(&r, 0, 5)) {
      case 0: n_kv = kt_int(&r, 0, 2); break;
      case 1: n_kv = kt_int(&r, 3, 40); break;
      case 2: n_kv = kt_int(&r, 100, 600); break;
      default: n_kv = kt_int(&r, 1, 200); break;
    }
    /* keep the fp64 reference's work bounded: H * n_q * n_kv * (D + Dv) */
    budget = 3e6 / ((double)H * (D + Dv) * (n_kv + 1));
    if (budget < 1) budget = 1;
    qmode = kt_int(&r, 0, 2); /* 0, 1: q_pos NULL; 2: explicit */
    kvmode = kt_int(&r, 0, 2); /* 0: NULL, 1: offset sorted, 2: random unsorted, duplicates */
    if (qmode < 2 && n_kv == 0) qmode = 2;
    if (qmode < 2) {
      n_q = kt_int(&r, 0, 1) ? 1 : kt_int(&r, 1, n_kv);
      if (n_q > budget) n_q = (int)budget;
    } else {
      n_q = kt_int(&r, 0, 1) ? 1 : kt_int(&r, 1, 24);
      if (n_q > budget) n_q = (int)budget;
    }
    if (kvmode > 0 && n_kv > 0) {
      int base = kt_int(&r, 0, 50);
      kp = KT_ALLOC(int32_t, n_kv);
      for (j = 0; j < n_kv; j++)
        kp[j] = kvmode == 1 ? base + j : kt_int(&r, 0, n_kv + 20);
      minkp = maxkp = kp[0];
      for (j = 0; j < n_kv; j++) {
        if (kp[j] > maxkp) maxkp = kp[j];
        if (kp[j] < minkp) minkp = kp[j];
      }
    } else {
      maxkp = n_kv > 0 ? n_kv - 1 : 0;
    }
    if (qmode == 2) {
      qp = KT_ALLOC(int32_t, n_q);
      for (j = 0; j < n_q; j++) {
        int lo = minkp - 3 < 0 ? 0 : minkp - 3;
        qp[j] = kt_int(&r, 0, 3) ? kt_int(&r, lo, maxkp + 3) : maxkp;
      }
    }
    if (kt_int(&r, 0, 1)) {
      tc.a.window = kt_int(&r, 0, 3) ? kt_int(&r, 1, n_kv > 1 ? n_kv : 2) : kt_int(&r, 1, 4);
      if (kt_int(&r, 0, 1)) tc.a.n_sink = kt_int(&r, 1, 6);
    } else if (kt_int(&r, 0, 5) == 0) {
      tc.a.n_sink = kt_int(&r, 1, 4); /* sink without window: no effect */
    }
    if (kt_int(&r, 0, 3) == 0) {
      static const float caps[] = {2.5f, 20.0f, 50.0f};
      tc.a.softcap = caps[kt_int(&r, 0, 2)];
    }
    if (kt_int(&r, 0, 2) == 0) tc.a.scale = kt_uniform(&r, 0.02f, 1.0f);
    if (kt_int(&r, 0, 4) == 0) tc.a.non_causal = 1;                     /* encoder / cross-attention */
    if (kt_int(&r, 0, 4) == 0) tc.a.alibi_max_bias = kt_int(&r, 0, 1) ? 8.0f : kt_uniform(&r, 0.5f, 16.0f);
    if (kt_int(&r, 0, 4) == 0) tc.a.chunk_size = kt_int(&r, 1, n_kv + 2); /* chunked attention */
    if (kt_int(&r, 0, 4) == 0) { /* learned sinks: small, or large enough to dominate */
      int h;
      for (h = 0; h < tc.a.n_heads; h++) sinks[h] = kt_int(&r, 0, 3) ? kt_uniform(&r, -4.0f, 4.0f) : 30.0f;
      tc.a.sink_logits = sinks;
    }
    tc.a.n_threads = kt_int(&r, 0, 2);
    tc.n_q = n_q;
    tc.n_kv = n_kv;
    tc.q_pos = qp;
    tc.kv_pos = kp;
    tc.want_lse = kt_int(&r, 0, 2) != 0;
    tc.v_amp = kt_int(&r, 0, 1) ? 1.0f : 4.0f;
    tc.check_threads = (it % 4) == 0;
    tc.label = "random";
    run_case(&r, &tc, NULL, NULL, NULL);
    free(qp);
    free(kp);
  }
}

/* the shapes engines use, with threads compared */
static void test_typical(void) {
  kt_rng r;
  att_case tc;
  kt_begin("attend: typical prefill/decode shapes");
  kt_seed(&r, 31337);
  memset(&tc, 0, sizeof tc);
  kt_attn_init(&tc.a, 8, 2, 128, 0);
  tc.n_q = kt_quick ? 16 : 64;
  tc.n_kv = kt_quick ? 160 : 600;
  tc.want_lse = 1;
  tc.v_amp = 2.0f;
  tc.check_threads = 1;
  tc.label = "prefill chunk GQA 8/2 D128";
  run_case(&r, &tc, NULL, NULL, NULL);
  tc.n_q = 1;
  tc.label = "decode GQA 8/2 D128";
  run_case(&r, &tc, NULL, NULL, NULL);
  tc.a.window = 100;
  tc.a.n_sink = 4;
  tc.label = "decode GQA window 100 sink 4";
  run_case(&r, &tc, NULL, NULL, NULL);
  kt_attn_init(&tc.a, 16, 1, 64, 0);
  tc.a.window = 0;
  tc.a.n_sink = 0;
  tc.n_q = kt_quick ? 8 : 37;
  tc.n_kv = kt_quick ? 100 : 401;
  tc.label = "MQA 16/1 D64 chunk";
  run_case(&r, &tc, NULL, NULL, NULL);
  kt_attn_init(&tc.a, 4, 4, 100, 36);
  tc.label = "MHA D100 Dv36";
  run_case(&r, &tc, NULL, NULL, NULL);
  tc.n_q = tc.n_kv;
  tc.label = "full causal prefill";
  run_case(&r, &tc, NULL, NULL, NULL);
}

/* ---- bad arguments: KVA_ERR_ARG and the caller's buffers unchanged */
static void test_bad_args(void) {
  kva_attn a, base;
  float q[4 * 2 * 8], k[5 * 2 * 8], v[5 * 2 * 8], out[4 * 4 * 8 + 8], lse[4 * 4 + 8];
  int32_t qp[4] = {1, 2, 3, 4};
  kt_rng r;
  kt_begin("attend: bad arguments");
  kt_seed(&r, 9);
  kt_fill(&r, q, sizeof q / sizeof q[0], -1, 1);
  kt_fill(&r, k, sizeof k / sizeof k[0], -1, 1);
  kt_fill(&r, v, sizeof v / sizeof v[0], -1, 1);
  kt_attn_init(&base, 4, 2, 8, 0);
#define BAD(call, what)                                                                \
  do {                                                                                 \
    kva_status st_;                                                                    \
    kt_fill_sentinel(out, sizeof out / sizeof out[0]);                                 \
    kt_fill_sentinel(lse, sizeof lse / sizeof lse[0]);                                 \
    st_ = (call);                                                                      \
    KT_CHECK(st_ == KVA_ERR_ARG, "%s: status %d, expected KVA_ERR_ARG", what, (int)st_); \
    KT_CHECK(kt_all_sentinel(out, sizeof out / sizeof out[0]) &&                       \
                 kt_all_sentinel(lse, sizeof lse / sizeof lse[0]),                     \
             "%s: output buffers changed on error", what);                             \
  } while (0)
  /* sanity: the base call works */
  KT_STATUS(kva_attend(&base, q, 2, NULL, k, v, 5, NULL, out, lse), KVA_OK);
  BAD(kva_attend(NULL, q, 2, NULL, k, v, 5, NULL, out, lse), "a NULL");
  BAD(kva_attend(&base, NULL, 2, NULL, k, v, 5, NULL, out, lse), "q NULL");
  BAD(kva_attend(&base, q, 2, NULL, NULL, v, 5, NULL, out, lse), "k NULL");
  BAD(kva_attend(&base, q, 2, NULL, k, NULL, 5, NULL, out, lse), "v NULL");
  BAD(kva_attend(&base, q, 2, NULL, k, v, 5, NULL, NULL, lse), "out NULL");
  BAD(kva_attend(&base, q, 1, NULL, k, v, 5, NULL, NULL, NULL), "out NULL, decode");
  BAD(kva_attend(&base, q, -1, NULL, k, v, 5, NULL, out, lse), "n_q < 0");
  BAD(kva_attend(&base, q, 2, qp, k, v, -1, NULL, out, lse), "n_kv < 0");
  BAD(kva_attend(&base, q, 4, NULL, k, v, 3, NULL, out, lse), "n_q > n_kv with q_pos NULL");
  BAD(kva_attend(&base, q, 1, NULL, k, v, 0, NULL, out, lse), "n_kv 0 with q_pos NULL");
  a = base;
  a.n_heads = 0;
  BAD(kva_attend(&a, q, 2, NULL, k, v, 5, NULL, out, lse), "n_heads 0");
  a.n_heads = -4;
  BAD(kva_attend(&a, q, 2, NULL, k, v, 5, NULL, out, lse), "n_heads < 0");
  a = base;
  a.n_kv_heads = 0;
  BAD(kva_attend(&a, q, 2, NULL, k, v, 5, NULL, out, lse), "n_kv_heads 0");
  a.n_kv_heads = -2;
  BAD(kva_attend(&a, q, 2, NULL, k, v, 5, NULL, out, lse), "n_kv_heads < 0");
  a = base;
  a.head_dim = 0;
  BAD(kva_attend(&a, q, 2, NULL, k, v, 5, NULL, out, lse), "head_dim 0");
  a.head_dim = -8;
  BAD(kva_attend(&a, q, 2, NULL, k, v, 5, NULL, out, lse), "head_dim < 0");
  a = base;
  a.v_dim = -1;
  BAD(kva_attend(&a, q, 2, NULL, k, v, 5, NULL, out, lse), "v_dim < 0");
  a = base;
  a.n_heads = 3; /* 3 % 2 != 0 */
  BAD(kva_attend(&a, q, 2, NULL, k, v, 5, NULL, out, lse), "H % G != 0 (3, 2)");
  a = base;
  a.n_heads = 2;
  a.n_kv_heads = 4; /* G > H */
  BAD(kva_attend(&a, q, 2, NULL, k, v, 5, NULL, out, lse), "H % G != 0 (2, 4)");
#undef BAD
  /* n_q == 0: a no-op returning KVA_OK, buffers untouched */
  kt_fill_sentinel(out, sizeof out / sizeof out[0]);
  kt_fill_sentinel(lse, sizeof lse / sizeof lse[0]);
  KT_STATUS(kva_attend(&base, q, 0, NULL, k, v, 5, NULL, out, lse), KVA_OK);
  KT_STATUS(kva_attend(&base, q, 0, qp, k, v, 5, NULL, out, lse), KVA_OK);
  KT_STATUS(kva_attend(&base, NULL, 0, NULL, k, v, 5, NULL, NULL, NULL), KVA_OK);
  KT_CHECK(kt_all_sentinel(out, sizeof out / sizeof out[0]) &&
               kt_all_sentinel(lse, sizeof lse / sizeof lse[0]),
           "n_q == 0 wrote to out/lse");
}

void test_attend(void) {
  test_hand();
  test_stability();
  test_invisible();
  test_typical();
  test_random_shapes();
  test_bad_args();
  if (getenv("KVA_TEST_VERBOSE"))
    fprintf(stderr, "  attend: worst err/tol: out %.3f, lse %.3f\n", worst_out_ratio,
            worst_lse_ratio);
}
