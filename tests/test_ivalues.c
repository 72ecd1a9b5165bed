/* test_ivalues.c - integer values (kva_attn.int_values) over INT8 and INT4 values.
 *
 * The function (docs/API.md, "Integer values"; kvattn.h's comment above
 * kva__ivacc_tile): keys go in tiles of KVA__TILE = 64 consecutive held keys
 * counted from key 0. For one query row and one tile T, with p_j the float
 * path's probability exp(s_j - M) (0 for a masked key):
 *   INT8 (token j: codes v_jc, scale s_j):  w_j = p_j s_j,  W = max_T w_j,
 *     u_j = floor(255 w_j / W + 0.5) (all 0 when W = 0); the tile adds
 *     (W / 255) sum_j u_j v_jc to channel c.
 *   INT4 (group g of 32 channels; codes c_jc, scale s_jg, minimum m_jg): per
 *     group, w_jg = p_j s_jg, W_g = max_T w_jg, u_jg = floor(255 w_jg / W_g + 0.5);
 *     the tile adds (W_g / 255) sum_j u_jg c_jc + sum_j p_j m_jg.
 * The output is the sum of the tiles' contributions over l = sum p_j (the
 * float denominator); exp(-M) is a common factor of both, so the fp64
 * reference below takes M as the row's maximum score. lse is unchanged.
 *
 *   - the tile kernel kva__ivacc_tile (white box) against fp64 of the rule,
 *     widths 1..576 (whole INT4 groups and rests), 1..64 rows, 1..64 keys,
 *     exact-size row and probability allocations, zero / constant / large /
 *     small / outlier rows, zero (acc unchanged bit for bit), one-hot,
 *     spread and NaN probability rows (a NaN row: all NaN);
 *   - exact ties (iv_ties): scales and probabilities chosen so that every
 *     float step is exact and 255 w / W is often k + 0.5: half up, bit for bit
 *     (the only place the tie direction is visible: elsewhere ties are
 *     "ambiguous", below);
 *   - attention through the cache (prefill, decode, GQA 1..8 heads per KV
 *     head, latent caches, split-K at 5,000 keys, block sizes 1..64,
 *     integer scores, softcap, ALiBi, sink logits, non-causal), batch plans
 *     (one and two sequences), kva_gqa_forward and the absorbed MLA forward
 *     against fp64 of the rule over the rows as stored; lse bit for bit that
 *     of float values;
 *   - the bound against float values (iv_bound: stated there) with windows,
 *     sinks, chunks, softcap, sink logits; the MLA forward within it too;
 *   - NaN queries and NaN keys: NaN rows where float values have them;
 *   - F32 / F16 / BF16 / FP8 values ignore the option bit for bit (cache,
 *     batch, kva_attend); 2, -1, 255 are KVA_ERR_ARG everywhere (output
 *     untouched), kva_attn_check names int_values.
 *
 * Tolerances. The kernel computes w, W and the codes in float from float
 * probabilities, so a code may differ by one from the fp64 one when
 * 255 w / W lies within a margin of a half-integer: margin = 255 * 2e-5 +
 * 1e-6 (kernel level: the probabilities are given exactly), plus, through
 * attention, x * 2 (E_j + E_max) where x = 255 w_j / W and E_j bounds the
 * relative error of the float probability p_j (E_j = e_j + 1.2e-7 (|s_j - M|
 * + 1), e_j = 1e-6 * scale * sum_i |q_i| kmag_i the float score error, kmag_i
 * = |k_i|, or for INT4 keys with integer scores (15 s_g + |m_g|) of k_i's
 * group). Each such "ambiguous" token adds (W / 255) |v_jc| (INT8: the code)
 * to channel c's tolerance. On top: a float tolerance rel * (sum of the
 * |terms|) with rel = 2e-5 + 2 E_max + 2e-7 sqrt(visible keys) (kernel
 * level: 2e-5, plus 1e-6 |acc before|), all over l, plus 1e-30.
 * The same reference run with the float rule (sum p_j v_jc / l, the values
 * read back) checks int_values = 0 at the same tolerance: the reference is
 * calibrated on the float path (there its worst error is ~0.02 of the
 * tolerance; with int_values the worst cases, ~0.96, are codes that flipped
 * at an ambiguous tie). Without the ambiguity term about ten checks fail,
 * rounding half down instead of up fails the ties test, dropping INT4's
 * minimum term, tiles of 32 or truncating codes fail hundreds.
 * KVA_TEST_VERBOSE=1 prints the worst error / tolerance of each part. */
#include "kvattn.h"
#include "harness.h"
#include "ref.h"
#include "ref_mla.h"

#define IV_MARGIN (255.0 * 2e-5 + 1e-6)

/* worst error / tolerance seen, for KVA_TEST_VERBOSE: kernel, attention float / int, bound, gqa, mla int /
   bound, and the share of ambiguous codes met */
enum { IVW_KERNEL, IVW_FLOAT, IVW_INT, IVW_BOUND, IVW_GQA, IVW_MLA, IVW_MLA_BOUND, IVW_N };
static double iv_worst[IVW_N];
static long iv_codes_seen, iv_codes_ambiguous;
static void iv_note(int which, double ratio) {
  if (!(ratio <= iv_worst[which])) iv_worst[which] = ratio == ratio ? ratio : INFINITY;
}
#define IV_NW(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *iv_tname(kva_dtype t) { return kva_dtype_name(t); }

/* A stored row of the cache (slot of seq in layer, KV head g; V's when v, else K's), through the
   cache's own block table: the bytes the kernels read. */
static const unsigned char *iv_cache_row(const kva_cache *c, int seq, int layer, int slot, int g, int v) {
  int ib;
  const kva__seq *s = kva__seq_get(c, seq);
  int32_t b = kva__slot_block(c, s, layer, slot, &ib);
  return v ? kva__v_ptr(c, layer, b, g, ib) : kva__k_ptr(c, layer, b, g, ib);
}

/* Channel c of a stored row (rp: INT8 codes / INT4 row start) as its code, with the scale and minimum
   the rule uses (INT8: the row's scale, minimum 0), through the library's loaders. */
static int iv_code(kva_dtype t, const void *rp, int c, double *s, double *m) {
  if (t == KVA_INT8) {
    *s = (double)kva__row_scale(KVA_INT8, rp, 1.0f);
    *m = 0.0;
    return (int)kva__load1(KVA_INT8, rp, c);
  } else {
    float fs, fm;
    const uint8_t *codes = kva__i4_group(rp, c, &fs, &fm);
    *s = (double)fs;
    *m = (double)fm;
    return (codes[(c % 32) / 2] >> (4 * (c & 1))) & 15;
  }
}

/* The value the float path reads: INT8 code times its scale (the float product), INT4 the loader's */
static double iv_value(kva_dtype t, const void *rp, int c) {
  if (t == KVA_INT8) return (double)(kva__load1(KVA_INT8, rp, c) * kva__row_scale(KVA_INT8, rp, 1.0f));
  return (double)kva__load1(KVA_INT4, rp, c);
}

/* fp64 of the rule for one query row over one tile: p[j] (j < nk, >= 0, in a common exp(-M) unit),
   vrows[j] stored rows (kernel convention), xr[j] (NULL: 0) an extra relative uncertainty of the
   code's argument 255 w_j / W. Adds to sum[c] the contribution, to mag[c] the sum of the |terms|,
   to amb[c] (W / 255) |code| for each token whose code is ambiguous. Returns 0 if a p is NaN. */
static int iv_tile_rule(kva_dtype t, const double *p, const void *const *vrows, int nk, int dv, const double *xr,
                        double *sum, double *mag, double *amb) {
  int j, c, g0;
  for (j = 0; j < nk; j++)
    if (p[j] != p[j]) return 0;
  for (g0 = 0; g0 < dv; g0 += (t == KVA_INT4 ? 32 : dv)) {
    int g1 = t == KVA_INT4 ? (g0 + 32 < dv ? g0 + 32 : dv) : dv;
    double W = 0.0, s, m;
    for (j = 0; j < nk; j++) {
      double w;
      (void)iv_code(t, vrows[j], g0, &s, &m);
      w = p[j] * s;
      if (w > W) W = w;
    }
    for (j = 0; j < nk; j++) {
      double w, x, u, fr;
      int near;
      (void)iv_code(t, vrows[j], g0, &s, &m);
      w = p[j] * s;
      x = W > 0.0 ? 255.0 * w / W : 0.0;
      u = floor(x + 0.5);
      fr = x - floor(x);
      near = W > 0.0 && fabs(fr - 0.5) <= IV_MARGIN + x * (xr ? xr[j] : 0.0);
      iv_codes_seen++, iv_codes_ambiguous += near;
      for (c = g0; c < g1; c++) {
        int code = iv_code(t, vrows[j], c, &s, &m);
        double term = W / 255.0 * u * (double)code;
        sum[c] += term + p[j] * m;
        mag[c] += fabs(term) + fabs(p[j] * m);
        if (near) amb[c] += W / 255.0 * fabs((double)code);
      }
    }
  }
  return 1;
}

/* ------------------------------------------------------------------------ */
/* 1. the tile kernel                                                        */

static void iv_kernels(kt_rng *r) {
  static const int widths[] = {1, 7, 16, 31, 32, 33, 44, 64, 65, 100, 128, 160, 576};
  int it, iters = kt_iters(500);
  kt_begin("ivalues: the tile kernel kva__ivacc_tile against fp64 of the rule");
  for (it = 0; it < iters; it++) {
    kva_dtype t = it % 2 ? KVA_INT4 : KVA_INT8;
    int dv = kt_pick(r, widths, IV_NW(widths));
    int nr = it % 7 == 3 ? 64 : kt_int(r, 0, 2) ? kt_int(r, 1, 4) : kt_int(r, 1, 64);
    int nk = it % 5 == 1 ? 64 : kt_int(r, 0, 3) ? kt_int(r, 1, 64) : kt_int(r, 1, 3);
    int ldp = kt_int(r, 0, 2) == 0 ? nk : kt_int(r, 0, 1) ? 64 : nk + kt_int(r, 1, 7);
    int nan_row = it % 3 == 2 ? kt_int(r, 0, nr - 1) : -1, j, c, rr, bad = 0, bad_nan = 0, bad_zero = 0;
    size_t rb = kva__row_bytes(t, dv), np = (size_t)(nr - 1) * ldp + nk;
    unsigned char *rows[64];
    const void *vrows[64];
    float *p = KT_ALLOC(float, np), *acc[64], *before = KT_ALLOC(float, (size_t)nr * dv);
    double *sum = KT_ALLOC(double, dv), *mag = KT_ALLOC(double, dv), *amb = KT_ALLOC(double, dv), *pd;
    double worst = 0.0;
    char *zero_row = KT_ALLOC(char, nr);
    pd = KT_ALLOC(double, nk);
    for (j = 0; j < nk; j++) { /* exact-size stored rows of assorted kinds */
      float *x = KT_ALLOC(float, dv);
      int kind = kt_int(r, 0, 11);
      for (c = 0; c < dv; c++) {
        switch (kind) {
          case 0: x[c] = 0.0f; break;                                  /* zero row: scale 0 */
          case 1: x[c] = 0.75f; break;                                 /* constant: INT4 scale 0, min only */
          case 2: x[c] = kt_uniform(r, -1000.0f, 1000.0f); break;      /* large */
          case 3: x[c] = kt_uniform(r, -1e-3f, 1e-3f); break;          /* small */
          case 4: x[c] = kt_uniform(r, 0.5f, 2.0f); break;             /* one-signed: INT4 min > 0 */
          default: x[c] = kt_uniform(r, -3.0f, 3.0f); break;
        }
      }
      if (kind >= 5 && kt_int(r, 0, 2) == 0) x[kt_int(r, 0, dv - 1)] = kt_int(r, 0, 1) ? 40.0f : -60.0f; /* outlier */
      rows[j] = KT_ALLOC(unsigned char, rb);
      kva__store_row(t, rows[j], x, dv, 1.0f);
      vrows[j] = rows[j] + kva__code_offset(t);
      free(x);
    }
    for (rr = 0; rr < nr; rr++) { /* probabilities: the float path's exp(s - M), in [0, 1] */
      int kind = kt_int(r, 0, 9), one = kt_int(r, 0, nk - 1);
      zero_row[rr] = (char)(kind == 0);
      for (j = 0; j < nk; j++) {
        float v;
        switch (kind) {
          case 0: v = 0.0f; break;                                               /* a row that sees nothing */
          case 1: v = j == one ? 1.0f : 0.0f; break;                             /* one key */
          case 2: v = expf(-kt_uniform(r, 0.0f, 30.0f)); break;                  /* spread over decades */
          case 3: v = kt_int(r, 0, 3) ? 0.0f : kt_uniform(r, 0.0f, 1.0f); break; /* mostly masked */
          case 4: v = (float)kt_int(r, 0, 8) / 8.0f; break;                      /* ties of the codes */
          case 5: v = kt_uniform(r, 0.0f, 1.0f) * 1e-38f; break; /* a tile far below the row's maximum */
          case 6: v = expf(-kt_uniform(r, 80.0f, 100.0f)); break;  /* down into the subnormals */
          default: v = kt_uniform(r, 0.0f, 1.0f); break;
        }
        if (kind != 0 && kind != 3 && kt_int(r, 0, 9) == 0) v = 0.0f; /* some exactly 0 */
        p[(size_t)rr * ldp + j] = v;
      }
      if (kind >= 2 && kind != 5 && kind != 6 && kt_int(r, 0, 3)) p[(size_t)rr * ldp + one] = 1.0f; /* usually a maximum of 1 */
      if (rr == nan_row) p[(size_t)rr * ldp + kt_int(r, 0, nk - 1)] = NAN, zero_row[rr] = 0;
      if (rr < nr - 1)
        for (j = nk; j < ldp; j++) p[(size_t)rr * ldp + j] = KT_SENTINEL; /* between rows: never read as p */
    }
    for (rr = 0; rr < nr; rr++) {
      acc[rr] = KT_ALLOC(float, dv);
      if (kt_int(r, 0, 3) == 0) {
        for (c = 0; c < dv; c++) acc[rr][c] = 0.5f; /* nonzero: a zero row must leave it bit for bit */
      } else {
        kt_fill(r, acc[rr], dv, -2.0f, 2.0f);
        for (c = 0; c < dv; c++)
          if (acc[rr][c] == 0.0f) acc[rr][c] = 0.25f;
      }
      memcpy(before + (size_t)rr * dv, acc[rr], (size_t)dv * sizeof(float));
    }
    kva__ivacc_tile(t, acc, nr, p, ldp, vrows, nk, dv);
    for (rr = 0; rr < nr; rr++) {
      const float *b = before + (size_t)rr * dv;
      if (rr == nan_row) {
        int n_nan = 0;
        for (c = 0; c < dv; c++) n_nan += acc[rr][c] != acc[rr][c];
        bad_nan += n_nan != dv;
        if (n_nan != dv && kt_fail_prints < KT_MAX_FAIL_PRINTS)
          printf("  (it %d: the NaN row %d has %d of %d channels NaN)\n", it, rr, n_nan, dv);
        continue;
      }
      if (zero_row[rr]) {
        bad_zero += !kt_same_bits(acc[rr], b, (size_t)dv);
        continue;
      }
      for (j = 0; j < nk; j++) pd[j] = (double)p[(size_t)rr * ldp + j];
      for (c = 0; c < dv; c++) sum[c] = mag[c] = amb[c] = 0.0;
      iv_tile_rule(t, pd, vrows, nk, dv, NULL, sum, mag, amb);
      for (c = 0; c < dv; c++) {
        double want = (double)b[c] + sum[c], e = fabs((double)acc[rr][c] - want);
        double tol = 2e-5 * mag[c] + 1e-6 * fabs((double)b[c]) + amb[c] + 1e-30;
        if (!(e <= tol)) {
          if (bad < 3 && kt_fail_prints < KT_MAX_FAIL_PRINTS)
            printf("  (it %d %s dv=%d nr=%d nk=%d: row %d channel %d: got %.9g, want %.9g (before %.9g), tol %.3g)\n",
                   it, iv_tname(t), dv, nr, nk, rr, c, (double)acc[rr][c], want, (double)b[c], tol);
          bad++;
        }
        if (tol > 0 && e / tol > worst) worst = e / tol;
      }
    }
    iv_note(IVW_KERNEL, worst);
    KT_CHECK(bad == 0, "it %d %s dv=%d nr=%d nk=%d ldp=%d: %d channels off the rule (worst %.3g of the tolerance)", it,
             iv_tname(t), dv, nr, nk, ldp, bad, worst);
    KT_CHECK(bad_nan == 0, "it %d %s dv=%d nr=%d nk=%d: the row with a NaN probability is not all NaN", it, iv_tname(t),
             dv, nr, nk);
    KT_CHECK(bad_zero == 0, "it %d %s dv=%d nr=%d nk=%d: %d all-zero probability rows changed their accumulators", it,
             iv_tname(t), dv, nr, nk, bad_zero);
    for (j = 0; j < nk; j++) free(rows[j]);
    for (rr = 0; rr < nr; rr++) free(acc[rr]);
    free(p), free(before), free(sum), free(mag), free(amb), free(pd), free(zero_row);
  }
}

/* Exact ties: every weight and code in float exactly. Key 0 has scale 255 (INT8: a row whose largest
   |value| is 127 * 255; INT4: every group spans 15 * 255) and probability 1, so W = 255, 255 / W = 1 and
   255 w_j / W = p_j s_j; the other keys have small integer scales and dyadic probabilities, so that
   p_j s_j is often a half-integer (0.5 * 3 = 1.5). The rule rounds those up (floor(x + 0.5)); W / 255
   is 1, the codes' sums are integers below 2^24 and the INT4 minimums small integers, so the result is
   exact: compared bit for bit (accumulators start at 0). */
static void iv_ties(kt_rng *r) {
  static const int widths[] = {1, 2, 31, 32, 33, 64, 70, 128};
  static const float scales[] = {1.0f, 2.0f, 3.0f, 5.0f, 7.0f, 255.0f};
  static const float probs[] = {0.0f, 0.125f, 0.25f, 0.375f, 0.5f, 0.625f, 0.75f, 0.875f, 1.0f};
  int it, iters = kt_iters(200);
  kt_begin("ivalues: exact ties of the codes round half up (the tile kernel, bit for bit)");
  for (it = 0; it < iters; it++) {
    kva_dtype t = it % 2 ? KVA_INT4 : KVA_INT8;
    int dv = kt_pick(r, widths, IV_NW(widths)), nr = kt_int(r, 1, it % 4 == 0 ? 64 : 4), nk = kt_int(r, 1, 64);
    int j, c, rr, bad = 0, ties = 0;
    size_t rb = kva__row_bytes(t, dv);
    unsigned char *rows[64];
    const void *vrows[64];
    float *p = KT_ALLOC(float, (size_t)nr * nk), *acc[64], *x = KT_ALLOC(float, dv);
    double *pd = KT_ALLOC(double, nk), *sum = KT_ALLOC(double, dv), *mag = KT_ALLOC(double, dv);
    double *amb = KT_ALLOC(double, dv);
    for (j = 0; j < nk; j++) {
      if (t == KVA_INT8) {
        float s = j == 0 ? 255.0f : scales[kt_int(r, 0, IV_NW(scales) - 1)];
        for (c = 0; c < dv; c++) x[c] = (float)kt_int(r, -127, 127) * s;
        x[kt_int(r, 0, dv - 1)] = (kt_int(r, 0, 1) ? 127.0f : -127.0f) * s; /* amax 127 s: scale s */
      } else
        for (c = 0; c < dv; c += 32) { /* a group: min m, codes 0..15 with 0 and 15 present: scale s */
          int e, end = c + 32 < dv ? c + 32 : dv;
          float s = j == 0 ? 255.0f : scales[kt_int(r, 0, IV_NW(scales) - 1)], m = (float)kt_int(r, -9, 9);
          for (e = c; e < end; e++) x[e] = m + (float)kt_int(r, 0, 15) * s;
          x[c] = m;
          if (end - c > 1) x[c + 1 + kt_int(r, 0, end - c - 2)] = m + 15.0f * s;
          else if (j == 0) x[c] = 0.0f; /* a group of one has scale 0: key 0 keeps W_g = 0 there */
        }
      rows[j] = KT_ALLOC(unsigned char, rb);
      kva__store_row(t, rows[j], x, dv, 1.0f);
      vrows[j] = rows[j] + kva__code_offset(t);
    }
    for (rr = 0; rr < nr; rr++) {
      for (j = 0; j < nk; j++) p[(size_t)rr * nk + j] = j == 0 ? 1.0f : probs[kt_int(r, 0, IV_NW(probs) - 1)];
      acc[rr] = KT_ALLOC(float, dv);
      memset(acc[rr], 0, (size_t)dv * sizeof(float));
    }
    kva__ivacc_tile(t, acc, nr, p, nk, vrows, nk, dv);
    for (rr = 0; rr < nr; rr++) {
      for (j = 0; j < nk; j++) {
        double s, m;
        pd[j] = (double)p[(size_t)rr * nk + j];
        (void)iv_code(t, vrows[j], 0, &s, &m);
        ties += j > 0 && fabs(pd[j] * s - floor(pd[j] * s) - 0.5) == 0.0;
      }
      for (c = 0; c < dv; c++) sum[c] = mag[c] = amb[c] = 0.0;
      iv_tile_rule(t, pd, vrows, nk, dv, NULL, sum, mag, amb);
      for (c = 0; c < dv; c++) {
        if ((double)acc[rr][c] != sum[c]) {
          if (!bad && kt_fail_prints < KT_MAX_FAIL_PRINTS)
            printf("  (it %d %s dv=%d nk=%d: row %d channel %d: got %.9g, want %.9g exactly)\n", it, iv_tname(t), dv, nk,
                   rr, c, (double)acc[rr][c], sum[c]);
          bad++;
        }
      }
    }
    KT_CHECK(bad == 0, "it %d %s dv=%d nr=%d nk=%d: %d channels differ from the exact result (%d ties)", it,
             iv_tname(t), dv, nr, nk, bad, ties);
    for (j = 0; j < nk; j++) free(rows[j]);
    for (rr = 0; rr < nr; rr++) free(acc[rr]);
    free(p), free(x), free(pd), free(sum), free(mag), free(amb);
  }
}

/* ------------------------------------------------------------------------ */
/* 2. attention: the fp64 reference of the rule                              */

typedef struct {
  double *w_int, *t_int; /* the rule and its tolerance */
  double *w_flt, *t_flt; /* float values (read back) and its tolerance */
  double *bnd;           /* the bound of |int - float| (iv_bound's comment), without float tolerance */
} iv_want;

static void iv_want_alloc(iv_want *w, size_t n) {
  w->w_int = KT_ALLOC(double, n), w->t_int = KT_ALLOC(double, n);
  w->w_flt = KT_ALLOC(double, n), w->t_flt = KT_ALLOC(double, n);
  w->bnd = KT_ALLOC(double, n);
}
static void iv_want_free(iv_want *w) { free(w->w_int), free(w->t_int), free(w->w_flt), free(w->t_flt), free(w->bnd); }

/* Attention of q [n_q][H][D] (double: the query the scores see) over n keys k [n][G][D] (double, as read
   back) at positions 0..n-1, queries at n - n_q + i (or qpos), V the stored rows vrows[j * G + g]
   (kernel convention) of type vt, DV wide. kmag [n][G][D]: per element the magnitude the score's
   float error scales with. Rows by tiles of 64 from key 0 (exact only without window / chunk). */
static void iv_ref(const ref_attn_cfg *cf, const double *q, int n_q, const int32_t *qpos, const double *k,
                   const double *kmag, int n, kva_dtype vt, const void *const *vrows, iv_want *out) {
  int i, h, j, c, g0, grp = cf->H / cf->G, DV = cf->Dv, D = cf->D;
  double *s = KT_ALLOC(double, n + 1), *p = KT_ALLOC(double, n + 1), *E = KT_ALLOC(double, n + 1);
  double *xr = KT_ALLOC(double, 64), *pt = KT_ALLOC(double, 64);
  double *sum = KT_ALLOC(double, DV), *mag = KT_ALLOC(double, DV), *amb = KT_ALLOC(double, DV);
  double *magf = KT_ALLOC(double, DV), *Wg = KT_ALLOC(double, (DV + 31) / 32 + 1);
  char *vis = KT_ALLOC(char, n + 1);
  const void *tv[64];
  for (i = 0; i < n_q; i++) {
    int32_t qp = qpos ? qpos[i] : (int32_t)(n - n_q + i);
    for (h = 0; h < cf->H; h++) {
      int g = h / grp, any = 0, nvis = 0;
      const double *qh = q + ((size_t)i * cf->H + h) * D;
      size_t o = ((size_t)i * cf->H + h) * DV;
      double m = -INFINITY, l = 0.0, Emax = 0.0, rel;
      for (j = 0; j < n; j++) {
        const double *kj = k + ((size_t)j * cf->G + g) * D, *km = kmag + ((size_t)j * cf->G + g) * D;
        double dot = 0.0, am = 0.0;
        int d;
        vis[j] = (char)ref_visible(cf, qp, j);
        if (!vis[j]) continue;
        for (d = 0; d < D; d++) dot += qh[d] * kj[d], am += fabs(qh[d]) * km[d];
        dot *= cf->scale;
        if (cf->softcap > 0.0) dot = cf->softcap * tanh(dot / cf->softcap);
        dot -= ref_alibi_slope(cf, h) * fabs((double)qp - (double)j);
        s[j] = dot;
        E[j] = 1e-6 * fabs(cf->scale) * am;
        if (dot > m) m = dot;
        any = 1, nvis++;
      }
      for (c = 0; c < DV; c++)
        out->w_int[o + c] = out->w_flt[o + c] = out->bnd[o + c] = 0.0, out->t_int[o + c] = out->t_flt[o + c] = 1e-30;
      if (!any) continue; /* a row that sees nothing: zeros */
      if (cf->sink_logits && (double)cf->sink_logits[h] > m) m = (double)cf->sink_logits[h];
      if (cf->sink_logits) l += exp((double)cf->sink_logits[h] - m);
      for (j = 0; j < n; j++) {
        p[j] = 0.0;
        if (!vis[j]) continue;
        p[j] = exp(s[j] - m);
        l += p[j];
        E[j] += 1.2e-7 * (fabs(s[j] - m) + 1.0);
        if (E[j] > Emax) Emax = E[j];
      }
      rel = 2e-5 + 2.0 * Emax + 2e-7 * sqrt((double)nvis);
      for (c = 0; c < DV; c++) sum[c] = mag[c] = amb[c] = magf[c] = 0.0;
      /* the rule, tile by tile from key 0 */
      for (j = 0; j < n; j += 64) {
        int nk = n - j < 64 ? n - j : 64, jj;
        for (jj = 0; jj < nk; jj++) {
          tv[jj] = vrows[(size_t)(j + jj) * cf->G + g];
          pt[jj] = p[j + jj];
          xr[jj] = 2.0 * (E[j + jj] + Emax);
        }
        iv_tile_rule(vt, pt, tv, nk, DV, xr, sum, mag, amb);
      }
      /* float values, and the bound: W over every visible key (bounds each tile's W, whatever the tiles) */
      for (g0 = 0; g0 < DV; g0 += 32) Wg[g0 / 32] = 0.0;
      for (j = 0; j < n; j++) {
        const void *rp = vrows[(size_t)j * cf->G + g];
        if (!vis[j]) continue;
        for (g0 = 0; g0 < DV; g0 += 32) {
          double sc, mn;
          (void)iv_code(vt, rp, g0, &sc, &mn);
          if (p[j] * sc > Wg[g0 / 32]) Wg[g0 / 32] = p[j] * sc;
        }
      }
      if (vt == KVA_INT8)
        for (g0 = 32; g0 < DV; g0 += 32) Wg[g0 / 32] = Wg[0]; /* INT8: one scale per row */
      for (j = 0; j < n; j++) {
        const void *rp = vrows[(size_t)j * cf->G + g];
        if (!vis[j]) continue;
        for (c = 0; c < DV; c++) {
          double sc, mn;
          int code = iv_code(vt, rp, c, &sc, &mn);
          double W = vt == KVA_INT8 ? Wg[0] : Wg[c / 32];
          out->w_flt[o + c] += p[j] * iv_value(vt, rp, c);
          magf[c] += p[j] * (fabs((double)code * sc) + fabs(mn));
          out->bnd[o + c] += W / 510.0 * fabs((double)code);
        }
      }
      for (c = 0; c < DV; c++) {
        out->w_int[o + c] = sum[c] / l;
        out->t_int[o + c] = (rel * mag[c] + amb[c]) / l + 1e-30;
        out->w_flt[o + c] /= l;
        out->t_flt[o + c] = rel * magf[c] / l + 1e-30;
        out->bnd[o + c] /= l;
      }
    }
  }
  free(s), free(p), free(E), free(xr), free(pt), free(sum), free(mag), free(amb), free(magf), free(Wg), free(vis);
}

/* got against want within tol: the number off, the worst err / tol in *worst, the first in *at */
static int iv_cmp(const float *got, const double *want, const double *tol, size_t n, double *worst, size_t *at) {
  size_t i;
  int bad = 0;
  for (i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= tol[i])) {
      if (!bad) *at = i;
      bad++;
    }
    if (!(e / tol[i] <= *worst)) *worst = e / tol[i] == e / tol[i] ? e / tol[i] : INFINITY;
  }
  return bad;
}

/* kmag of the scores' float error: |k_i|, or for INT4 keys under integer scores, the group's
   15 s + |m| (the sum is taken per group, so its terms are that large) */
static void iv_kmag(const float *kr, int n, int G, int D, int int4_iscores, double *km) {
  int t, g, i;
  for (t = 0; t < n; t++)
    for (g = 0; g < G; g++) {
      const float *row = kr + ((size_t)t * G + g) * D;
      double *o = km + ((size_t)t * G + g) * D;
      for (i = 0; i < D; i++) o[i] = fabs((double)row[i]);
      if (int4_iscores)
        for (i = 0; i < D; i += 32) {
          int e, end = i + 32 < D ? i + 32 : D;
          double lo = INFINITY, hi = -INFINITY;
          for (e = i; e < end; e++) lo = fmin(lo, (double)row[e]), hi = fmax(hi, (double)row[e]);
          for (e = i; e < end; e++) o[e] = (hi - lo) + fabs(lo);
        }
    }
}

/* Reports a comparison of a call's output: prints the first bad element */
static void iv_report(int bad, double worst, size_t at, const float *got, const double *want, const double *tol,
                      const char *what, int it, const char *shape) {
  KT_CHECK(bad == 0, "it %d %s: %s: %d values off (worst %.3g of the tolerance; [%lu] = %.9g, want %.9g, tol %.3g)", it,
           shape, what, bad, worst, (unsigned long)at, bad ? (double)got[at] : 0.0, bad ? want[at] : 0.0,
           bad ? tol[at] : 0.0);
}

static void iv_attention(kt_rng *r) {
  static const int dims[] = {1, 8, 31, 32, 33, 64, 100, 128};
  static const int hpg[] = {1, 2, 4, 8};
  static const kva_dtype ktypes[] = {KVA_F16, KVA_F32, KVA_BF16, KVA_INT8, KVA_INT4};
  static const int bss[] = {1, 3, 16, 17, 32, 64};
  int it, iters = kt_iters(70);
  kt_begin("ivalues: attention (cache, batch, split-K, latent) against fp64 of the rule over the stored rows");
  for (it = 0; it < iters; it++) {
    int latent = it % 7 == 6, G = latent ? 1 : kt_int(r, 1, 2), H = G * kt_pick(r, hpg, 4);
    int D = kt_pick(r, dims, IV_NW(dims)), DV = latent ? kt_int(r, 1, D) : kt_pick(r, dims, IV_NW(dims));
    int longc = it % 10 == 4, n = longc ? 5000 : kt_int(r, 0, 2) ? kt_int(r, 1, 300) : 64 * kt_int(r, 1, 4) + kt_int(r, -1, 1);
    int n_q, bs = kt_pick(r, bss, IV_NW(bss)), seq = -1, t, g, two = !latent && it % 3 == 0, bad, child = -1;
    kva_dtype vt = it % 2 ? KVA_INT4 : KVA_INT8, kt = latent ? vt : ktypes[kt_int(r, 0, 4)];
    kva_cache_desc d;
    kva_cache *c = NULL;
    kva_attn a;
    kva_batch *plan = NULL;
    float *k, *v, *q, *out0, *out1, *out1b, *outb, *outb0, *kr, *vr, *lse0, *lse1, *lseb, *lseb0, sinks[64];
    double *kd, *qd, *km, worst;
    const void **vrows;
    size_t nq_out, at = 0;
    iv_want w;
    ref_attn_cfg cfg;
    char shape[200];
    if (n < 1) n = 1;
    if (latent && D < 2) D = 8, DV = kt_int(r, 1, D);
    n_q = longc ? 1 : kt_int(r, 0, 3) == 0 && n <= 80 ? n : kt_int(r, 1, n < 4 ? n : 4);
    if (longc) H = G * kt_int(r, 1, 2);
    memset(&d, 0, sizeof d);
    d.kind = latent ? KVA_CACHE_LATENT : KVA_CACHE_KV;
    d.n_layers = 1, d.n_kv_heads = G, d.head_dim = D, d.v_dim = DV, d.block_size = bs;
    d.n_blocks = (n + bs) / bs * 2 + 4, d.max_seqs = 4, d.max_seq_len = n + 1;
    d.dtype = kt, d.v_dtype = latent ? KVA_DTYPE_DEFAULT : vt;
    if (kva_cache_create(&d, &c) != KVA_OK) {
      KT_CHECK(0, "create (it %d)", it);
      continue;
    }
    memset(&a, 0, sizeof a);
    a.n_heads = H, a.n_kv_heads = G, a.head_dim = D, a.v_dim = DV;
    a.n_threads = kt_int(r, 1, 2);
    a.int_scores = (kt == KVA_INT8 || kt == KVA_INT4) && kt_int(r, 0, 1);
    if (kt_int(r, 0, 4) == 0) a.softcap = kt_uniform(r, 2.0f, 20.0f);
    if (kt_int(r, 0, 5) == 0) a.alibi_max_bias = 8.0f;
    if (kt_int(r, 0, 6) == 0) a.non_causal = 1;
    if (kt_int(r, 0, 5) == 0) {
      for (t = 0; t < H; t++) sinks[t] = kt_uniform(r, -2.0f, 3.0f);
      a.sink_logits = sinks;
    }
    snprintf(shape, sizeof shape, "%s K %s V %s%s H=%d G=%d D=%d DV=%d n=%d n_q=%d bs=%d%s%s%s%s",
             latent ? "latent" : "kv", iv_tname(kt), iv_tname(vt), a.int_scores ? " int_scores" : "", H, G, D, DV, n,
             n_q, bs, a.softcap > 0 ? " softcap" : "", a.alibi_max_bias > 0 ? " alibi" : "",
             a.non_causal ? " non-causal" : "", a.sink_logits ? " sink-logits" : "");
    nq_out = (size_t)n_q * H * DV;
    k = KT_ALLOC(float, (size_t)n * G * D), v = KT_ALLOC(float, (size_t)n * G * DV);
    kr = KT_ALLOC(float, (size_t)n * G * D), vr = KT_ALLOC(float, (size_t)n * G * DV);
    q = KT_ALLOC(float, (size_t)n_q * H * D);
    out0 = KT_ALLOC(float, nq_out), out1 = KT_ALLOC(float, nq_out), out1b = KT_ALLOC(float, nq_out);
    outb = KT_ALLOC(float, nq_out), outb0 = KT_ALLOC(float, nq_out);
    lse0 = KT_ALLOC(float, n_q * H), lse1 = KT_ALLOC(float, n_q * H), lseb = KT_ALLOC(float, n_q * H);
    lseb0 = KT_ALLOC(float, n_q * H);
    vrows = KT_ALLOC(const void *, (size_t)n * G);
    kt_fill(r, k, (size_t)n * G * D, -2.0f, 2.0f);
    kt_fill(r, v, (size_t)n * G * DV, -1.0f, 1.0f);
    kt_fill(r, q, (size_t)n_q * H * D, -1.0f, 1.0f);
    for (t = 0; t < n; t++) { /* some tokens with zero values, some with an outlier */
      if (kt_int(r, 0, 30) == 0) memset(v + (size_t)t * G * DV, 0, (size_t)G * DV * sizeof(float));
      if (kt_int(r, 0, 20) == 0) v[(size_t)t * G * DV + kt_int(r, 0, G * DV - 1)] = 25.0f;
    }
    if (latent && kt_int(r, 0, 1)) /* a sharper attention */
      for (t = 0; t < n_q * H * D; t++) q[t] *= 3.0f;
    KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
    KT_STATUS(kva_seq_append(c, seq, n), KVA_OK);
    KT_STATUS(kva_store(c, seq, 0, k, latent ? NULL : v, n), KVA_OK);
    bad = 0;
    for (t = 0; t < n; t++) {
      float *kt_ = kr + (size_t)t * G * D;
      KT_STATUS(kva_seq_read(c, seq, 0, t, kt_, latent ? NULL : vr + (size_t)t * G * DV, NULL), KVA_OK);
      if (latent) memcpy(vr + (size_t)t * DV, kt_, (size_t)DV * sizeof(float));
      for (g = 0; g < G; g++) {
        const unsigned char *row = iv_cache_row(c, seq, 0, t, g, !latent);
        float *back = KT_ALLOC(float, DV);
        int e;
        vrows[(size_t)t * G + g] = row + kva__code_offset(vt);
        for (e = 0; e < DV; e++) back[e] = (float)iv_value(vt, vrows[(size_t)t * G + g], e);
        bad += !kt_same_bits(back, vr + ((size_t)t * G + g) * DV, (size_t)DV);
        free(back);
      }
    }
    KT_CHECK(bad == 0, "it %d %s: %d stored V rows do not load back as kva_seq_read reads them", it, shape, bad);
    a.int_values = 0;
    KT_STATUS(kva_attend_cache_lse(c, seq, 0, &a, q, n_q, out0, lse0), KVA_OK);
    KT_STATUS(kva_batch_plan(c, &a, &seq, &n_q, 1, &plan), KVA_OK);
    if (plan) KT_STATUS(kva_attend_batch_lse(c, plan, 0, q, outb0, lseb0), KVA_OK);
    kva_batch_free(plan);
    plan = NULL;
    a.int_values = 1;
    KT_STATUS(kva_attend_cache_lse(c, seq, 0, &a, q, n_q, out1, lse1), KVA_OK);
    KT_STATUS(kva_attend_cache(c, seq, 0, &a, q, n_q, out1b), KVA_OK);
    KT_STATUS(kva_batch_plan(c, &a, &seq, &n_q, 1, &plan), KVA_OK);
    if (plan) KT_STATUS(kva_attend_batch_lse(c, plan, 0, q, outb, lseb), KVA_OK);
    kva_batch_free(plan);
    plan = NULL;
    cfg = ref_cfg(&a);
    kd = ref_dup_f(kr, (size_t)n * G * D);
    km = KT_ALLOC(double, (size_t)n * G * D);
    iv_kmag(kr, n, G, D, a.int_scores && kt == KVA_INT4, km);
    qd = KT_ALLOC(double, (size_t)n_q * H * D);
    if (a.int_scores)
      ref_int_query(qd, q, (size_t)n_q * H, D);
    else
      for (t = 0; t < n_q * H * D; t++) qd[t] = (double)q[t];
    iv_want_alloc(&w, nq_out);
    iv_ref(&cfg, qd, n_q, NULL, kd, km, n, vt, vrows, &w);
    /* the reference on the float path (calibration: int_values 0) */
    worst = 0.0;
    bad = iv_cmp(out0, w.w_flt, w.t_flt, nq_out, &worst, &at);
    iv_note(IVW_FLOAT, worst);
    iv_report(bad, worst, at, out0, w.w_flt, w.t_flt, "int_values 0 against the float reference", it, shape);
    worst = 0.0;
    bad = iv_cmp(out1, w.w_int, w.t_int, nq_out, &worst, &at);
    iv_report(bad, worst, at, out1, w.w_int, w.t_int, "kva_attend_cache_lse against the rule", it, shape);
    worst = 0.0;
    bad = iv_cmp(out1b, w.w_int, w.t_int, nq_out, &worst, &at);
    iv_report(bad, worst, at, out1b, w.w_int, w.t_int, "kva_attend_cache against the rule", it, shape);
    worst = 0.0;
    bad = iv_cmp(outb, w.w_int, w.t_int, nq_out, &worst, &at);
    iv_note(IVW_INT, worst);
    iv_report(bad, worst, at, outb, w.w_int, w.t_int, "a batch plan against the rule", it, shape);
    KT_CHECK(kt_same_bits(lse1, lse0, (size_t)n_q * H), "it %d %s: lse with int_values differs from float values'",
             it, shape);
    KT_CHECK(kt_same_bits(lseb, lseb0, (size_t)n_q * H),
             "it %d %s: a batch plan's lse with int_values differs from float values'", it, shape);
    if (two) { /* two sequences in one plan: the second holds the same rows, its one query the last one */
      int seqs[2], nq2[2];
      float *o2 = KT_ALLOC(float, nq_out + (size_t)H * DV);
      float *q2 = KT_ALLOC(float, (size_t)(n_q + 1) * H * D);
      double w2;
      KT_STATUS(kva_seq_new(c, &child), KVA_OK);
      KT_STATUS(kva_seq_append(c, child, n), KVA_OK);
      KT_STATUS(kva_store(c, child, 0, k, v, n), KVA_OK);
      seqs[0] = seq, seqs[1] = child, nq2[0] = n_q, nq2[1] = 1;
      memcpy(q2, q, (size_t)n_q * H * D * sizeof(float));
      memcpy(q2 + (size_t)n_q * H * D, q + (size_t)(n_q - 1) * H * D, (size_t)H * D * sizeof(float));
      KT_STATUS(kva_batch_plan(c, &a, seqs, nq2, 2, &plan), KVA_OK);
      if (plan) KT_STATUS(kva_attend_batch(c, plan, 0, q2, o2), KVA_OK);
      kva_batch_free(plan);
      plan = NULL;
      w2 = 0.0;
      bad = iv_cmp(o2, w.w_int, w.t_int, nq_out, &w2, &at);
      bad += iv_cmp(o2 + nq_out, w.w_int + nq_out - (size_t)H * DV, w.t_int + nq_out - (size_t)H * DV, (size_t)H * DV,
                    &w2, &at);
      KT_CHECK(bad == 0, "it %d %s: a two-sequence plan: %d values off the rule (worst %.3g of the tolerance)", it,
               shape, bad, w2);
      free(o2), free(q2);
    }
    iv_want_free(&w);
    kva_cache_destroy(c);
    free(k), free(v), free(kr), free(vr), free(q), free(out0), free(out1), free(out1b), free(outb), free(outb0);
    free(lse0), free(lse1), free(lseb), free(lseb0), free(vrows), free(kd), free(km), free(qd);
  }
}

/* ------------------------------------------------------------------------ */
/* 3. the bound against float values                                         */

/* |out_int - out_float| <= sum_{visible j} (W / 510) |code_jc| / l  (+ float tolerance), with
   W = max over the row's visible keys of w_j = p_j s_j (INT4: per group, s_jg): every code is within
   half a step, (W_T / 255) / 2, of 255 w_j / W_T (in weight units: |u_j W_T / 255 - w_j| <= W_T / 510),
   so token j's term moves by at most (W_T / 510) |code_jc|; the INT4 minimum's term is exact; and
   W_T <= W for every tile T, whatever the tiles are (windows and chunks start them anywhere). Float
   tolerance (both outputs round): twice iv_ref's, (4e-5 + 4 E_max + 4e-7 sqrt(visible keys))
   sum_j p_j (|code_jc s_j| + |m_j|) / l, plus 1e-3 of the bound (the float weights and W). */
static void iv_bound(kt_rng *r) {
  static const int dims[] = {1, 16, 31, 33, 64, 100, 128};
  int it, iters = kt_iters(60);
  kt_begin("ivalues: within the bound of float values (windows, sinks, softcap, chunks, eviction-free)");
  for (it = 0; it < iters; it++) {
    int G = kt_int(r, 1, 2), H = G * kt_int(r, 1, 4), D = kt_pick(r, dims, IV_NW(dims));
    int DV = kt_pick(r, dims, IV_NW(dims)), n = it % 9 == 4 ? kt_int(r, 1100, 2300) : kt_int(r, 1, 300);
    int n_q = kt_int(r, 0, 3) == 0 && n <= 64 ? n : kt_int(r, 1, n < 3 ? n : 3), seq = -1, t, g, bad = 0, nb;
    kva_dtype vt = it % 2 ? KVA_INT4 : KVA_INT8;
    kva_cache_desc d;
    kva_cache *c = NULL;
    kva_attn a;
    kva_batch *plan = NULL;
    size_t nq_out = (size_t)n_q * H * DV, i;
    float *k = KT_ALLOC(float, (size_t)n * G * D), *v = KT_ALLOC(float, (size_t)n * G * DV);
    float *kr = KT_ALLOC(float, (size_t)n * G * D), *q = KT_ALLOC(float, (size_t)n_q * H * D);
    float *o0 = KT_ALLOC(float, nq_out), *o1 = KT_ALLOC(float, nq_out), *ob = KT_ALLOC(float, nq_out), sinks[8];
    double *kd, *km, *qd, worst = 0.0, worstb = 0.0;
    const void **vrows = KT_ALLOC(const void *, (size_t)n * G);
    iv_want w;
    ref_attn_cfg cfg;
    char shape[200];
    kt_desc_init(&d, 1, G, D, kt_int(r, 1, 20), 0, 2, KVA_F16);
    d.v_dim = DV, d.v_dtype = vt;
    d.n_blocks = (n + d.block_size) / d.block_size + 2;
    kt_attn_init(&a, H, G, D, DV);
    if (it % 4 != 3) a.window = kt_int(r, 1, 80), a.n_sink = kt_int(r, 0, 4);
    if (it % 5 == 2) a.chunk_size = kt_int(r, 3, 100);
    if (it % 3 == 1) a.softcap = kt_uniform(r, 1.0f, 10.0f);
    if (it % 6 == 5) a.non_causal = 1;
    if (it % 7 == 3) {
      for (t = 0; t < H; t++) sinks[t] = kt_uniform(r, -1.0f, 2.0f);
      a.sink_logits = sinks;
    }
    snprintf(shape, sizeof shape, "V %s H=%d G=%d D=%d DV=%d n=%d n_q=%d win=%d sink=%d chunk=%d softcap=%g%s%s",
             iv_tname(vt), H, G, D, DV, n, n_q, a.window, a.n_sink, a.chunk_size, (double)a.softcap,
             a.non_causal ? " non-causal" : "", a.sink_logits ? " sink-logits" : "");
    KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
    if (!c) continue;
    kt_fill(r, k, (size_t)n * G * D, -3.0f, 3.0f); /* sharp enough for large codes */
    kt_fill(r, v, (size_t)n * G * DV, -1.0f, 1.0f);
    kt_fill(r, q, (size_t)n_q * H * D, -2.0f, 2.0f);
    for (t = 0; t < n; t++)
      if (kt_int(r, 0, 15) == 0) v[(size_t)t * G * DV + kt_int(r, 0, G * DV - 1)] = -30.0f;
    kva_seq_new(c, &seq);
    KT_STATUS(kva_seq_append(c, seq, n), KVA_OK);
    KT_STATUS(kva_store(c, seq, 0, k, v, n), KVA_OK);
    for (t = 0; t < n; t++) {
      kva_seq_read(c, seq, 0, t, kr + (size_t)t * G * D, NULL, NULL);
      for (g = 0; g < G; g++) vrows[(size_t)t * G + g] = iv_cache_row(c, seq, 0, t, g, 1) + kva__code_offset(vt);
    }
    KT_STATUS(kva_attend_cache(c, seq, 0, &a, q, n_q, o0), KVA_OK);
    a.int_values = 1;
    KT_STATUS(kva_attend_cache(c, seq, 0, &a, q, n_q, o1), KVA_OK);
    KT_STATUS(kva_batch_plan(c, &a, &seq, &n_q, 1, &plan), KVA_OK);
    if (plan) KT_STATUS(kva_attend_batch(c, plan, 0, q, ob), KVA_OK);
    kva_batch_free(plan);
    cfg = ref_cfg(&a);
    kd = ref_dup_f(kr, (size_t)n * G * D);
    qd = ref_dup_f(q, (size_t)n_q * H * D);
    km = KT_ALLOC(double, (size_t)n * G * D);
    iv_kmag(kr, n, G, D, 0, km);
    iv_want_alloc(&w, nq_out);
    iv_ref(&cfg, qd, n_q, NULL, kd, km, n, vt, vrows, &w);
    nb = 0;
    for (i = 0; i < nq_out; i++) {
      /* t_flt is rel * sum p (|c s| + |m|) / l with rel = 2e-5 + 2 E_max (+ a sqrt(n) term): doubled */
      double tol = w.bnd[i] * (1.0 + 1e-3) + 2.0 * w.t_flt[i];
      double e = fabs((double)o1[i] - (double)o0[i]), eb = fabs((double)ob[i] - (double)o0[i]);
      if (!(e <= tol)) {
        if (!bad && kt_fail_prints < KT_MAX_FAIL_PRINTS)
          printf("  (it %d %s: [%lu] int %.9g float %.9g: |diff| %.3g > bound %.3g + float tol %.3g)\n", it, shape,
                 (unsigned long)i, (double)o1[i], (double)o0[i], e, w.bnd[i], 2.0 * w.t_flt[i]);
        bad++;
      }
      nb += !(eb <= tol);
      if (e / tol > worst) worst = e / tol;
      if (eb / tol > worstb) worstb = eb / tol;
    }
    iv_note(IVW_BOUND, worst > worstb ? worst : worstb);
    KT_CHECK(bad == 0, "it %d %s: %d outputs beyond the bound (worst %.3g of it)", it, shape, bad, worst);
    KT_CHECK(nb == 0, "it %d %s: batch plan: %d outputs beyond the bound (worst %.3g of it)", it, shape, nb, worstb);
    iv_want_free(&w);
    kva_cache_destroy(c);
    free(k), free(v), free(kr), free(q), free(o0), free(o1), free(ob), free(kd), free(qd), free(km), free(vrows);
  }
}

/* ------------------------------------------------------------------------ */
/* kva_gqa_forward: wq and wo the identity (d_model = H * D), no RoPE: the layer's output is the
   attention of x over the K and V it stored (wk, wv random), checked against the rule */

static void iv_gqa(kt_rng *r) {
  static const int chunks[] = {5, 1, 70, 1, 1, 60, 1};
  int round_;
  kt_begin("ivalues: kva_gqa_forward with int_values against the rule over its stored rows");
  for (round_ = 0; round_ < kt_iters(4); round_++) {
    int G = 1 + round_ % 2, H = G * (round_ < 2 ? 2 : 4), D = round_ % 2 ? 33 : 32, dm = H * D, total = 0, ci, i, t, g;
    kva_dtype vt = round_ % 2 ? KVA_INT4 : KVA_INT8;
    kva_cache_desc d;
    kva_cache *c = NULL;
    kva_gqa_layer L;
    int sa = -1, sb = -1;
    float *wq = KT_ALLOC(float, (size_t)dm * dm), *wo = KT_ALLOC(float, (size_t)dm * dm);
    float *wk = KT_ALLOC(float, (size_t)G * D * dm), *wv = KT_ALLOC(float, (size_t)G * D * dm);
    kt_desc_init(&d, 1, G, D, 16, 24, 2, KVA_F16);
    d.v_dtype = vt;
    if (round_ >= 2) d.dtype = vt;
    KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
    if (!c) continue;
    memset(wq, 0, sizeof(float) * (size_t)dm * dm);
    memset(wo, 0, sizeof(float) * (size_t)dm * dm);
    for (i = 0; i < dm; i++) wq[(size_t)i * dm + i] = wo[(size_t)i * dm + i] = 1.0f;
    kt_fill(r, wk, (size_t)G * D * dm, -0.3f, 0.3f);
    kt_fill(r, wv, (size_t)G * D * dm, -0.3f, 0.3f);
    memset(&L, 0, sizeof L);
    L.d_model = dm;
    kt_attn_init(&L.attn, H, G, D, 0);
    L.attn.int_scores = round_ == 3;
    L.rope.dim = D & ~1; /* no rotation (theta 0), but an odd head needs an even rope.dim to be valid */
    L.wq = wq, L.wk = wk, L.wv = wv, L.wo = wo;
    KT_STATUS(kva_seq_new(c, &sa), KVA_OK);
    KT_STATUS(kva_seq_new(c, &sb), KVA_OK);
    for (ci = 0; ci < IV_NW(chunks); ci++) {
      int n = chunks[ci], bad, bad0;
      size_t ny = (size_t)n * dm, at = 0;
      float *x = KT_ALLOC(float, ny), *ya = KT_ALLOC(float, ny), *yb = KT_ALLOC(float, ny);
      float *kr = KT_ALLOC(float, (size_t)(total + n) * G * D);
      double *kd, *km, *qd = KT_ALLOC(double, ny), worst = 0.0, worst0 = 0.0;
      const void **vrows = KT_ALLOC(const void *, (size_t)(total + n) * G);
      ref_attn_cfg cfg;
      iv_want w;
      kt_fill(r, x, ny, -1.5f, 1.5f);
      total += n;
      KT_STATUS(kva_seq_append(c, sa, n), KVA_OK);
      KT_STATUS(kva_seq_append(c, sb, n), KVA_OK);
      L.attn.int_values = 1;
      KT_STATUS(kva_gqa_forward(&L, c, sa, 0, x, n, ya), KVA_OK);
      L.attn.int_values = 0;
      KT_STATUS(kva_gqa_forward(&L, c, sb, 0, x, n, yb), KVA_OK);
      for (t = 0; t < total; t++) {
        kva_seq_read(c, sa, 0, t, kr + (size_t)t * G * D, NULL, NULL);
        for (g = 0; g < G; g++) vrows[(size_t)t * G + g] = iv_cache_row(c, sa, 0, t, g, 1) + kva__code_offset(vt);
      }
      cfg.H = H, cfg.G = G, cfg.D = D, cfg.Dv = D, cfg.scale = 1.0 / sqrt((double)D);
      cfg.window = cfg.n_sink = cfg.non_causal = cfg.chunk = 0;
      cfg.softcap = cfg.alibi_max_bias = 0.0;
      cfg.sink_logits = NULL;
      kd = ref_dup_f(kr, (size_t)total * G * D);
      km = KT_ALLOC(double, (size_t)total * G * D);
      iv_kmag(kr, total, G, D, L.attn.int_scores && d.dtype == KVA_INT4, km);
      if (L.attn.int_scores && (d.dtype == KVA_INT8 || d.dtype == KVA_INT4))
        ref_int_query(qd, x, (size_t)n * H, D);
      else
        for (i = 0; i < (int)ny; i++) qd[i] = (double)x[i];
      iv_want_alloc(&w, ny);
      iv_ref(&cfg, qd, n, NULL, kd, km, total, vt, vrows, &w);
      bad0 = iv_cmp(yb, w.w_flt, w.t_flt, ny, &worst0, &at);
      KT_CHECK(bad0 == 0, "gqa round %d chunk %d: int_values 0 off the float reference by %.3g of the tolerance",
               round_, ci, worst0);
      bad = iv_cmp(ya, w.w_int, w.t_int, ny, &worst, &at);
      iv_note(IVW_GQA, worst);
      KT_CHECK(bad == 0,
               "gqa round %d (V %s, K %s%s) chunk %d (n=%d of %d): %d values off the rule (worst %.3g of the "
               "tolerance; [%lu] = %.9g, want %.9g)",
               round_, iv_tname(vt), iv_tname(d.dtype), L.attn.int_scores ? ", int_scores" : "", ci, n, total, bad,
               worst, (unsigned long)at, (double)ya[at], w.w_int[at]);
      iv_want_free(&w);
      free(x), free(ya), free(yb), free(kr), free(kd), free(km), free(qd), free(vrows);
    }
    kva_cache_destroy(c);
    free(wq), free(wo), free(wk), free(wv);
  }
}

/* ------------------------------------------------------------------------ */
/* The absorbed MLA forward over an INT8 / INT4 latent cache: int_values 1 against the rule over the
   stored latent rows (V = their first d_latent values) and against int_values 0 within the bound, both
   carried through W_UV and wo. The reference's scores are the naive form's over the stored latents
   (q_nope . (W_UK c) + q_pe . k_pe); the absorbed path's float scores differ by ~1e-6 of
   sum |q_abs| |c| + |q_pe| |k_pe|: that is e_j. */

static void iv_mla(kt_rng *r) {
  enum { DM = 48, H = 2, DL = 40, DN = 16, DR = 8, DV = 16, DQ = DN + DR, NMAX = 160 };
  static const int chunks[] = {9, 1, 1, 70, 1, 66, 1};
  int round_;
  kt_begin("ivalues: the absorbed MLA forward over quantized latents (the rule; the bound against float values)");
  for (round_ = 0; round_ < (kt_quick ? 2 : 4); round_++) {
    kva_dtype dt = round_ % 2 ? KVA_INT4 : KVA_INT8;
    float qgain = round_ >= 2 ? 1.5f : 0.5f; /* rounds 2, 3: a sharper attention */
    kva_cache_desc d;
    kva_cache *c = NULL;
    kva_mla_layer L;
    int sa = -1, sb = -1, total = 0, ci, i, h, j, e, cc;
    float *wq = KT_ALLOC(float, H * DQ * DM), *wdkv = KT_ALLOC(float, DL * DM), *wkr = KT_ALLOC(float, DR * DM);
    float *wuk = KT_ALLOC(float, H * DN * DL), *wuv = KT_ALLOC(float, H * DV * DL), *wo = KT_ALLOC(float, DM * H * DV);
    float *buv = KT_ALLOC(float, H * DV), *bo = KT_ALLOC(float, DM);
    double scale = 1.0 / sqrt((double)DQ);
    kt_fill(r, wq, H * DQ * DM, -qgain, qgain);
    kt_fill(r, wdkv, DL * DM, -0.4f, 0.4f);
    kt_fill(r, wkr, DR * DM, -0.4f, 0.4f);
    kt_fill(r, wuk, H * DN * DL, -0.4f, 0.4f);
    kt_fill(r, wuv, H * DV * DL, -0.3f, 0.3f);
    kt_fill(r, wo, DM * H * DV, -0.3f, 0.3f);
    kt_fill(r, buv, H * DV, -0.2f, 0.2f);
    kt_fill(r, bo, DM, -0.2f, 0.2f);
    memset(&L, 0, sizeof L);
    L.d_model = DM, L.n_heads = H, L.d_latent = DL, L.d_nope = DN, L.d_rope = DR, L.d_v = DV;
    L.wq = wq, L.w_dkv = wdkv, L.w_kr = wkr, L.w_uk = wuk, L.w_uv = wuv, L.b_uv = buv, L.wo = wo, L.bo = bo;
    L.rope.theta = 10000.0f;
    L.n_threads = 1;
    memset(&d, 0, sizeof d);
    d.kind = KVA_CACHE_LATENT, d.n_layers = 1, d.n_kv_heads = 1, d.head_dim = DL + DR, d.v_dim = DL;
    d.block_size = 16, d.n_blocks = 2 * NMAX / 16 + 4, d.max_seqs = 2, d.dtype = dt;
    KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
    if (!c) continue;
    KT_STATUS(kva_seq_new(c, &sa), KVA_OK);
    KT_STATUS(kva_seq_new(c, &sb), KVA_OK);
    {
      float *xs = KT_ALLOC(float, NMAX * DM), *lat = KT_ALLOC(float, NMAX * (DL + DR));
      double *qh = KT_ALLOC(double, H * DQ), *kn = KT_ALLOC(double, NMAX * H * DN), *s = KT_ALLOC(double, NMAX);
      double *p = KT_ALLOC(double, NMAX), *E = KT_ALLOC(double, NMAX), *xr = KT_ALLOC(double, 64);
      double *sum = KT_ALLOC(double, DL), *mag = KT_ALLOC(double, DL), *amb = KT_ALLOC(double, DL);
      double *of = KT_ALLOC(double, DL), *bl = KT_ALLOC(double, DL), *magf = KT_ALLOC(double, DL);
      double *oi = KT_ALLOC(double, H * DL), *ti = KT_ALLOC(double, H * DL), *ofl = KT_ALLOC(double, H * DL);
      double *tf = KT_ALLOC(double, H * DL), *bd = KT_ALLOC(double, H * DL);
      const void **vrows = KT_ALLOC(const void *, NMAX);
      for (ci = 0; ci < IV_NW(chunks); ci++) {
        int n = chunks[ci], bad = 0, badb = 0, badf = 0, t;
        float ya[NMAX * DM], yb[NMAX * DM];
        double worst = 0.0, worstb = 0.0, worstf = 0.0;
        float *x = xs + (size_t)total * DM;
        kt_fill(r, x, (size_t)n * DM, -1.5f, 1.5f);
        total += n;
        KT_STATUS(kva_seq_append(c, sa, n), KVA_OK);
        KT_STATUS(kva_seq_append(c, sb, n), KVA_OK);
        L.int_values = 1;
        KT_STATUS(kva_mla_forward(&L, c, sa, 0, x, n, ya), KVA_OK);
        L.int_values = 0;
        KT_STATUS(kva_mla_forward(&L, c, sb, 0, x, n, yb), KVA_OK);
        for (j = 0; j < total; j++) {
          KT_STATUS(kva_seq_read(c, sa, 0, j, lat + (size_t)j * (DL + DR), NULL, NULL), KVA_OK);
          vrows[j] = iv_cache_row(c, sa, 0, j, 0, 0) + kva__code_offset(dt);
          for (h = 0; h < H; h++) {
            double cd[DL];
            for (e = 0; e < DL; e++) cd[e] = (double)lat[(size_t)j * (DL + DR) + e];
            ref_linear(wuk + (size_t)h * DN * DL, NULL, cd, DL, DN, kn + ((size_t)j * H + h) * DN);
          }
        }
        for (t = 0; t < n; t++) {
          int32_t pos = (int32_t)(total - n + t);
          double yi_[DM], yf_[DM], ty_[DM], tyf_[DM], by_[DM];
          ref_mla_query(&L, x + (size_t)t * DM, pos, qh);
          for (h = 0; h < H; h++) {
            const double *q = qh + (size_t)h * DQ;
            double m = -INFINITY, l = 0.0, Emax = 0.0, rel, qa[DL], W = 0.0;
            for (e = 0; e < DL; e++) { /* q_abs = W_UK^T q_nope, for the error estimate */
              qa[e] = 0.0;
              for (i = 0; i < DN; i++) qa[e] += q[i] * (double)wuk[((size_t)h * DN + i) * DL + e];
            }
            for (j = 0; j <= pos; j++) {
              const float *lj = lat + (size_t)j * (DL + DR);
              double dot = 0.0, am = 0.0;
              for (i = 0; i < DN; i++) dot += q[i] * kn[((size_t)j * H + h) * DN + i];
              for (i = 0; i < DR; i++) dot += q[DN + i] * (double)lj[DL + i], am += fabs(q[DN + i] * lj[DL + i]);
              for (e = 0; e < DL; e++) am += fabs(qa[e] * lj[e]);
              s[j] = dot * scale;
              E[j] = 2e-6 * scale * am;
              if (s[j] > m) m = s[j];
            }
            for (j = 0; j <= pos; j++) {
              p[j] = exp(s[j] - m);
              l += p[j];
              E[j] += 1.2e-7 * (fabs(s[j] - m) + 1.0);
              if (E[j] > Emax) Emax = E[j];
            }
            rel = 2e-5 + 2.0 * Emax;
            for (e = 0; e < DL; e++) sum[e] = mag[e] = amb[e] = of[e] = bl[e] = magf[e] = 0.0;
            for (j = 0; j <= pos; j += 64) {
              int nk = pos + 1 - j < 64 ? pos + 1 - j : 64, jj;
              for (jj = 0; jj < nk; jj++) xr[jj] = 2.0 * (E[j + jj] + Emax);
              iv_tile_rule(dt, p + j, vrows + j, nk, DL, xr, sum, mag, amb);
            }
            for (e = 0; e < DL; e++) {
              double sc, mn;
              W = 0.0;
              for (j = 0; j <= pos; j++) {
                (void)iv_code(dt, vrows[j], e, &sc, &mn);
                if (p[j] * sc > W) W = p[j] * sc;
              }
              for (j = 0; j <= pos; j++) {
                int code = iv_code(dt, vrows[j], e, &sc, &mn);
                of[e] += p[j] * iv_value(dt, vrows[j], e);
                magf[e] += p[j] * (fabs(code * sc) + fabs(mn));
                bl[e] += W / 510.0 * fabs((double)code);
              }
              oi[h * DL + e] = sum[e] / l;
              ti[h * DL + e] = (rel * mag[e] + amb[e]) / l;
              ofl[h * DL + e] = of[e] / l;
              tf[h * DL + e] = rel * magf[e] / l;
              bd[h * DL + e] = bl[e] / l;
            }
          }
          /* y = wo (W_UV o_h + b_uv) + bo; tolerances through |wo| |W_UV|, plus the float error of the
             projections (2e-5 of their |terms|) */
          for (i = 0; i < DM; i++) {
            double yi = (double)bo[i], yf = (double)bo[i], tyi = 0.0, tyf = 0.0, by = 0.0, mi = fabs((double)bo[i]);
            double mf = mi;
            for (h = 0; h < H; h++)
              for (cc = 0; cc < DV; cc++) {
                double wgt = (double)wo[(size_t)i * H * DV + h * DV + cc], vi = (double)buv[h * DV + cc], vf = vi;
                double ai = 0.0, af = 0.0, mvi = fabs(vi), mvf = fabs(vi);
                for (e = 0; e < DL; e++) {
                  double u = (double)wuv[((size_t)h * DV + cc) * DL + e];
                  vi += u * oi[h * DL + e], vf += u * ofl[h * DL + e];
                  mvi += fabs(u * oi[h * DL + e]), mvf += fabs(u * ofl[h * DL + e]);
                  ai += fabs(u) * ti[h * DL + e], af += fabs(u) * tf[h * DL + e];
                  by += fabs(wgt * u) * bd[h * DL + e];
                }
                yi += wgt * vi, yf += wgt * vf;
                tyi += fabs(wgt) * (ai + 2e-5 * mvi), tyf += fabs(wgt) * (af + 2e-5 * mvf);
                mi += fabs(wgt * vi), mf += fabs(wgt * vf);
              }
            yi_[i] = yi, yf_[i] = yf;
            ty_[i] = tyi + 2e-5 * mi + 1e-30, tyf_[i] = tyf + 2e-5 * mf + 1e-30;
            by_[i] = by;
          }
          for (i = 0; i < DM; i++) {
            double gi = (double)ya[(size_t)t * DM + i], gf = (double)yb[(size_t)t * DM + i];
            double ei = fabs(gi - yi_[i]), ef = fabs(gf - yf_[i]), eb = fabs(gi - gf);
            double tb = by_[i] * (1 + 1e-3) + ty_[i] + tyf_[i];
            if (!(ei <= ty_[i])) {
              if (!bad && kt_fail_prints < KT_MAX_FAIL_PRINTS)
                printf("  (mla %s chunk %d token %d y[%d] = %.9g, want %.9g, tol %.3g)\n", iv_tname(dt), ci, pos, i,
                       gi, yi_[i], ty_[i]);
              bad++;
            }
            badf += !(ef <= tyf_[i]);
            badb += !(eb <= tb);
            if (ei / ty_[i] > worst) worst = ei / ty_[i];
            if (ef / tyf_[i] > worstf) worstf = ef / tyf_[i];
            if (eb / tb > worstb) worstb = eb / tb;
          }
        }
        iv_note(IVW_MLA, worst);
        iv_note(IVW_MLA_BOUND, worstb);
        KT_CHECK(badf == 0, "mla %s%s chunk %d: int_values 0 off the float reference (worst %.3g of the tolerance)",
                 iv_tname(dt), qgain > 1.0f ? " sharp" : "", ci, worstf);
        KT_CHECK(bad == 0, "mla %s%s chunk %d (n=%d of %d): %d outputs off the rule (worst %.3g of the tolerance)",
                 iv_tname(dt), qgain > 1.0f ? " sharp" : "", ci, n, total, bad, worst);
        KT_CHECK(badb == 0, "mla %s%s chunk %d: %d outputs beyond the bound against float values (worst %.3g of it)",
                 iv_tname(dt), qgain > 1.0f ? " sharp" : "", ci, badb, worstb);
      }
      free(xs), free(lat), free(qh), free(kn), free(s), free(p), free(E), free(xr), free(sum), free(mag), free(amb);
      free(of), free(bl), free(magf), free(oi), free(ti), free(ofl), free(tf), free(bd), free(vrows);
    }
    kva_cache_destroy(c);
    free(wq), free(wdkv), free(wkr), free(wuk), free(wuv), free(wo), free(buv), free(bo);
  }
}

/* NaN, two ways in. (a) A query row holding a NaN: its output row is NaN with int_values where it is
   with float values (what float values give depends on the ISA: zeros and lse -inf from the AVX-512
   and scalar kernels, other numbers from AVX2's), and every other row is bit for bit what it is
   without the NaN. (b) A NaN stored in one key (F32 / F16 keys keep it): its score,
   then its probability are NaN where the row sees it; docs/API.md: "a weight that is NaN makes the
   row NaN, as it would in the float path" - so a row is NaN with int_values wherever it is with float
   values, finite where they are finite, and lse is float values' bit for bit. */
static void iv_nan(kt_rng *r) {
  int it;
  kt_begin("ivalues: NaN queries and NaN keys give the rows float values give");
  for (it = 0; it < kt_iters(24); it++) {
    int G = kt_int(r, 1, 2), H = G * kt_int(r, 1, 4), D = it % 3 ? 64 : 31, n = it % 4 == 3 ? 2100 : kt_int(r, 1, 200);
    int n_q = kt_int(r, 1, n < 4 ? n : 4), seq = -1, bi = kt_int(r, 0, n_q - 1), bh = kt_int(r, 0, H - 1), i, h;
    int bad_row = 0, bad_other = 0, bad_key = 0, nan_rows = 0, key_case = it % 2;
    kva_dtype vt = it % 4 < 2 ? KVA_INT8 : KVA_INT4;
    kva_cache_desc d;
    kva_cache *c = NULL;
    kva_attn a;
    size_t no = (size_t)n_q * H * D;
    float *k = KT_ALLOC(float, (size_t)n * G * D), *v = KT_ALLOC(float, (size_t)n * G * D);
    float *q = KT_ALLOC(float, (size_t)n_q * H * D), *clean = KT_ALLOC(float, no), *o1 = KT_ALLOC(float, no);
    float *o0 = KT_ALLOC(float, no), *l0 = KT_ALLOC(float, n_q * H), *l1 = KT_ALLOC(float, n_q * H);
    kt_desc_init(&d, 1, G, D, 16, n / 16 + 2, 2, key_case ? (it % 3 ? KVA_F32 : KVA_F16) : it % 5 == 1 ? KVA_INT8 : KVA_F16);
    d.v_dtype = vt;
    KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
    if (!c) continue;
    kt_fill(r, k, (size_t)n * G * D, -2.0f, 2.0f);
    kt_fill(r, v, (size_t)n * G * D, -1.0f, 1.0f);
    kt_fill(r, q, (size_t)n_q * H * D, -2.0f, 2.0f);
    if (key_case) k[(size_t)kt_int(r, 0, n - 1) * G * D + kt_int(r, 0, G * D - 1)] = NAN;
    kva_seq_new(c, &seq);
    kva_seq_append(c, seq, n);
    kva_store(c, seq, 0, k, v, n);
    kt_attn_init(&a, H, G, D, 0);
    a.int_values = 1;
    a.int_scores = d.dtype == KVA_INT8 && it % 8 == 1;
    if (!key_case) {
      KT_STATUS(kva_attend_cache(c, seq, 0, &a, q, n_q, clean), KVA_OK);
      q[((size_t)bi * H + bh) * D + kt_int(r, 0, D - 1)] = NAN;
    }
    KT_STATUS(kva_attend_cache_lse(c, seq, 0, &a, q, n_q, o1, l1), KVA_OK);
    a.int_values = 0;
    KT_STATUS(kva_attend_cache_lse(c, seq, 0, &a, q, n_q, o0, l0), KVA_OK);
    for (i = 0; i < n_q; i++)
      for (h = 0; h < H; h++) {
        size_t o = ((size_t)i * H + h) * D, e;
        int nan0 = 0, nan1 = 0;
        for (e = 0; e < (size_t)D; e++) nan0 += o0[o + e] != o0[o + e], nan1 += o1[o + e] != o1[o + e];
        if (key_case) {
          nan_rows += nan0 > 0;
          bad_key += nan0 != nan1;
        } else if (i == bi && h == bh)
          bad_row += nan0 != nan1;
        else
          bad_other += !kt_same_bits(o1 + o, clean + o, (size_t)D);
      }
    if (key_case) {
      KT_CHECK(bad_key == 0,
               "it %d K %s V %s n=%d n_q=%d H=%d: a NaN key: %d rows NaN with float values but not with int_values, or "
               "the reverse (%d rows NaN with float values)",
               it, iv_tname(d.dtype), iv_tname(vt), n, n_q, H, bad_key, nan_rows);
      KT_CHECK(kt_same_bits(l0, l1, (size_t)n_q * H), "it %d V %s: a NaN key: lse differs from float values'", it,
               iv_tname(vt));
    } else {
      KT_CHECK(bad_row == 0, "it %d V %s n=%d: the NaN query's row is NaN with one of int / float values only (%g vs %g)", it,
               iv_tname(vt), n, (double)o1[((size_t)bi * H + bh) * D], (double)o0[((size_t)bi * H + bh) * D]);
      KT_CHECK(bad_other == 0, "it %d V %s n=%d: %d other rows changed by a NaN in query row (%d, %d)", it,
               iv_tname(vt), n, bad_other, bi, bh);
    }
    kva_cache_destroy(c);
    free(k), free(v), free(q), free(clean), free(o1), free(o0), free(l0), free(l1);
  }
}

/* ------------------------------------------------------------------------ */
/* 4. other value types ignore the option; bad values are refused            */

static void iv_others(kt_rng *r) {
  static const kva_dtype vts[] = {KVA_F32, KVA_F16, KVA_BF16, KVA_FP8_E4M3, KVA_FP8_E5M2};
  static const int bad_vals[] = {2, -1, 255};
  int it, bv;
  kt_begin("ivalues: float and FP8 values ignore int_values bit for bit; out-of-range values refused");
  for (it = 0; it < kt_iters(20); it++) {
    int G = kt_int(r, 1, 2), H = G * kt_int(r, 1, 4), D = kt_int(r, 0, 1) ? 64 : 33, n = kt_int(r, 1, 200);
    int n_q = kt_int(r, 1, n < 3 ? n : 3), seq = -1;
    kva_dtype vt = vts[it % IV_NW(vts)];
    kva_cache_desc d;
    kva_cache *c = NULL;
    kva_attn a;
    kva_batch *plan = NULL;
    size_t no = (size_t)n_q * H * D;
    float *k = KT_ALLOC(float, (size_t)n * G * D), *q = KT_ALLOC(float, (size_t)n_q * H * D);
    float *o0 = KT_ALLOC(float, no), *o1 = KT_ALLOC(float, no), *l0 = KT_ALLOC(float, n_q * H);
    float *l1 = KT_ALLOC(float, n_q * H), *ob0 = KT_ALLOC(float, no), *ob1 = KT_ALLOC(float, no);
    kt_desc_init(&d, 1, G, D, 16, n / 16 + 2, 2, kt_int(r, 0, 1) ? KVA_INT8 : KVA_F16);
    d.v_dtype = vt;
    d.k_scale = d.v_scale = 0.05f;
    KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
    if (!c) continue;
    kt_fill(r, k, (size_t)n * G * D, -2.0f, 2.0f);
    kt_fill(r, q, (size_t)n_q * H * D, -2.0f, 2.0f);
    kva_seq_new(c, &seq);
    kva_seq_append(c, seq, n);
    kva_store(c, seq, 0, k, k, n);
    kt_attn_init(&a, H, G, D, 0);
    if (it % 3 == 1) a.window = 30;
    KT_STATUS(kva_attend_cache_lse(c, seq, 0, &a, q, n_q, o0, l0), KVA_OK);
    KT_STATUS(kva_batch_plan(c, &a, &seq, &n_q, 1, &plan), KVA_OK);
    if (plan) KT_STATUS(kva_attend_batch(c, plan, 0, q, ob0), KVA_OK);
    kva_batch_free(plan);
    plan = NULL;
    a.int_values = 1;
    KT_STATUS(kva_attend_cache_lse(c, seq, 0, &a, q, n_q, o1, l1), KVA_OK);
    KT_STATUS(kva_batch_plan(c, &a, &seq, &n_q, 1, &plan), KVA_OK);
    if (plan) KT_STATUS(kva_attend_batch(c, plan, 0, q, ob1), KVA_OK);
    kva_batch_free(plan);
    plan = NULL;
    KT_CHECK(kt_same_bits(o0, o1, no) && kt_same_bits(l0, l1, (size_t)n_q * H),
             "it %d: V %s changed with int_values (cache call)", it, iv_tname(vt));
    KT_CHECK(kt_same_bits(ob0, ob1, no), "it %d: V %s changed with int_values (batch plan)", it, iv_tname(vt));
    if (it < 2) { /* kva_attend over float arrays ignores it too */
      float *v = KT_ALLOC(float, (size_t)n * G * D);
      kt_fill(r, v, (size_t)n * G * D, -1.0f, 1.0f);
      a.int_values = 0;
      KT_STATUS(kva_attend(&a, q, n_q, NULL, k, v, n, NULL, o0, l0), KVA_OK);
      a.int_values = 1;
      KT_STATUS(kva_attend(&a, q, n_q, NULL, k, v, n, NULL, o1, l1), KVA_OK);
      KT_CHECK(kt_same_bits(o0, o1, no) && kt_same_bits(l0, l1, (size_t)n_q * H),
               "kva_attend changed with int_values");
      for (bv = 0; bv < IV_NW(bad_vals); bv++) {
        a.int_values = bad_vals[bv];
        kt_fill_sentinel(o1, no);
        KT_STATUS(kva_attend(&a, q, n_q, NULL, k, v, n, NULL, o1, NULL), KVA_ERR_ARG);
        KT_CHECK(kt_all_sentinel(o1, no), "kva_attend with int_values %d wrote out", bad_vals[bv]);
      }
      free(v);
    }
    for (bv = 0; bv < IV_NW(bad_vals); bv++) {
      const char *why;
      a.int_values = bad_vals[bv];
      why = kva_attn_check(&a);
      KT_CHECK(why && strstr(why, "int_values"), "kva_attn_check with int_values %d: %s", bad_vals[bv],
               why ? why : "(NULL)");
      kt_fill_sentinel(o1, no);
      kt_fill_sentinel(l1, (size_t)n_q * H);
      KT_STATUS(kva_attend_cache(c, seq, 0, &a, q, n_q, o1), KVA_ERR_ARG);
      KT_STATUS(kva_attend_cache_lse(c, seq, 0, &a, q, n_q, o1, l1), KVA_ERR_ARG);
      KT_CHECK(kt_all_sentinel(o1, no) && kt_all_sentinel(l1, (size_t)n_q * H),
               "int_values %d: the refused call wrote its output", bad_vals[bv]);
      plan = NULL;
      KT_STATUS(kva_batch_plan(c, &a, &seq, &n_q, 1, &plan), KVA_ERR_ARG);
      KT_CHECK(plan == NULL, "int_values %d: a refused plan is not NULL", bad_vals[bv]);
      kva_batch_free(plan);
    }
    kva_cache_destroy(c);
    free(k), free(q), free(o0), free(o1), free(l0), free(l1), free(ob0), free(ob1);
  }
  { /* the layers: kva_gqa_layer.attn.int_values and kva_mla_layer.int_values out of range */
    enum { DM = 16, HH = 2, DD = 8 };
    kva_cache_desc d;
    kva_cache *c = NULL, *cl = NULL;
    kva_gqa_layer L;
    kva_mla_layer M;
    int seq = -1, ls = -1;
    float w[DM * DM], x[2 * DM], y[2 * DM];
    kt_fill(r, w, DM * DM, -0.3f, 0.3f);
    kt_fill(r, x, 2 * DM, -1.0f, 1.0f);
    kt_desc_init(&d, 1, HH, DD, 16, 4, 2, KVA_INT8);
    KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
    memset(&L, 0, sizeof L);
    L.d_model = DM;
    kt_attn_init(&L.attn, HH, HH, DD, 0);
    L.wq = L.wk = L.wv = L.wo = w;
    memset(&M, 0, sizeof M);
    M.d_model = DM, M.n_heads = 2, M.d_latent = 8, M.d_nope = 4, M.d_rope = 0, M.d_v = 4, M.n_threads = 1;
    M.wq = M.w_dkv = M.w_uk = M.w_uv = M.wo = w;
    memset(&d, 0, sizeof d);
    d.kind = KVA_CACHE_LATENT, d.n_layers = 1, d.n_kv_heads = 1, d.head_dim = 8, d.v_dim = 8;
    d.block_size = 16, d.n_blocks = 4, d.max_seqs = 2, d.dtype = KVA_INT8;
    KT_STATUS(kva_cache_create(&d, &cl), KVA_OK);
    if (c && cl) {
      KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
      KT_STATUS(kva_seq_append(c, seq, 2), KVA_OK);
      KT_STATUS(kva_seq_new(cl, &ls), KVA_OK);
      KT_STATUS(kva_seq_append(cl, ls, 2), KVA_OK);
      for (bv = 0; bv < IV_NW(bad_vals); bv++) {
        L.attn.int_values = bad_vals[bv];
        kt_fill_sentinel(y, 2 * DM);
        KT_STATUS(kva_gqa_forward(&L, c, seq, 0, x, 2, y), KVA_ERR_ARG);
        KT_CHECK(kt_all_sentinel(y, 2 * DM), "kva_gqa_forward with int_values %d wrote y", bad_vals[bv]);
        M.int_values = bad_vals[bv];
        kt_fill_sentinel(y, 2 * DM);
        KT_STATUS(kva_mla_forward(&M, cl, ls, 0, x, 2, y), KVA_ERR_ARG);
        KT_CHECK(kt_all_sentinel(y, 2 * DM), "kva_mla_forward with int_values %d wrote y", bad_vals[bv]);
        M.naive = 1;
        KT_STATUS(kva_mla_forward(&M, cl, ls, 0, x, 2, y), KVA_ERR_ARG);
        M.naive = 0;
      }
      L.attn.int_values = 1;
      KT_STATUS(kva_gqa_forward(&L, c, seq, 0, x, 2, y), KVA_OK);
      M.int_values = 1;
      KT_STATUS(kva_mla_forward(&M, cl, ls, 0, x, 2, y), KVA_OK);
    }
    kva_cache_destroy(c);
    kva_cache_destroy(cl);
  }
}

void test_ivalues(void) {
  kt_rng r;
  kt_seed(&r, 0x1a7e5);
  iv_kernels(&r);
  iv_ties(&r);
  iv_attention(&r);
  iv_bound(&r);
  iv_gqa(&r);
  iv_mla(&r);
  iv_nan(&r);
  iv_others(&r);
  if (getenv("KVA_TEST_VERBOSE") && *getenv("KVA_TEST_VERBOSE") && strcmp(getenv("KVA_TEST_VERBOSE"), "0") != 0)
    fprintf(stderr,
            "  ivalues: worst err/tol: kernel %.3g, attention float %.3g int %.3g, bound %.3g, gqa %.3g, mla %.3g, "
            "mla bound %.3g; %ld of %ld codes ambiguous\n",
            iv_worst[IVW_KERNEL], iv_worst[IVW_FLOAT], iv_worst[IVW_INT], iv_worst[IVW_BOUND], iv_worst[IVW_GQA],
            iv_worst[IVW_MLA], iv_worst[IVW_MLA_BOUND], iv_codes_ambiguous, iv_codes_seen);
}
