/* ref.h - the independent double-precision reference for the kvattn tests.
 *
 * Written from the documented behaviour (docs/API.md), not from kvattn.h's
 * code: plain loops in double, obvious rather than fast.  Everything is `static inline` so several
 * translation units may include it.  The only thing taken from kvattn.h is
 * the kva_attn struct, read by ref_cfg() to resolve the contract's defaults.
 *
 *  - IEEE binary16 / bfloat16 encode (round to nearest, ties to even, overflow
 *    to Inf, NaN stays NaN) and decode, from the format definition.
 *  - attention: full softmax over the visible keys, GQA head mapping
 *    h / (H/G), default scale 1/sqrt(D), softcap after scaling and before the
 *    mask, window/sink visibility, lse = natural log of the sum of exp(score),
 *    a query that sees nothing gives zeros and lse = -inf.
 *  - attention under an explicit mask with explicit (effective) positions,
 *    per KV head if need be (tree attention: the tests build the mask and
 *    the positions from a parent array).
 *  - RoPE (rotate-half and interleaved, partial dim, theta or an inv_freq
 *    table), angles in double.
 *  - linear layers (W is [out][in], y = x W^T + b, b may be NULL).
 */
#ifndef KVATTN_TEST_REF_H
#define KVATTN_TEST_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvattn.h"

/* ------------------------------------------------------------------------ */
/* IEEE-style binary formats with `ebits` exponent bits and `mbits` stored
   mantissa bits (binary16: 5/10, bfloat16: 8/7).                           */

static inline double ref_decode_ieee(uint32_t code, int ebits, int mbits) {
  uint32_t emask = (1u << ebits) - 1u, mmask = (1u << mbits) - 1u;
  int bias = (1 << (ebits - 1)) - 1;
  int neg = (int)((code >> (ebits + mbits)) & 1u);
  uint32_t e = (code >> mbits) & emask, m = code & mmask;
  double mag;
  if (e == emask)
    mag = m ? (double)NAN : (double)INFINITY;
  else if (e == 0)
    mag = ldexp((double)m, 1 - bias - mbits); /* subnormal: m * 2^(emin - mbits) */
  else
    mag = ldexp((double)(m + (1u << mbits)), (int)e - bias - mbits);
  return neg ? -mag : mag;
}

/* Encode a double (callers pass floats, exactly representable) with round to
   nearest, ties to even.  The magnitude codes of a binary format are ordered
   like the values, so code = (biased exponent << mbits) + significand - 2^mbits
   holds across the subnormal/normal boundary and rounding up into Inf. */
static inline uint32_t ref_encode_ieee(double x, int ebits, int mbits) {
  uint32_t sign = signbit(x) ? (1u << (ebits + mbits)) : 0u;
  uint32_t inf = ((1u << ebits) - 1u) << mbits;
  int bias = (1 << (ebits - 1)) - 1, emin = 1 - bias, e2;
  double a = fabs(x), q, n, fl, fr;
  uint64_t code;
  if (x != x) return sign | inf | (1u << (mbits - 1)); /* a quiet NaN */
  if (a == 0.0) return sign;
  if (a > 1e300) return sign | inf; /* Inf (and anything absurd) */
  (void)frexp(a, &e2);            /* a = f * 2^e2, f in [0.5, 1) */
  e2 -= 1;                        /* floor(log2(a)) */
  if (e2 < emin) e2 = emin;       /* subnormal range: fixed quantum */
  q = ldexp(1.0, e2 - mbits);     /* the spacing of the format at a */
  n = a / q;                      /* exact: a power-of-two division */
  fl = floor(n);
  fr = n - fl;
  if (fr > 0.5 || (fr == 0.5 && fmod(fl, 2.0) != 0.0)) fl += 1.0;
  code = ((uint64_t)(e2 + bias) << mbits) + (uint64_t)fl - ((uint64_t)1 << mbits);
  if (code >= inf) return sign | inf;
  return sign | (uint32_t)code;
}

static inline uint16_t ref_f32_to_f16(float x) { return (uint16_t)ref_encode_ieee((double)x, 5, 10); }
static inline double ref_f16_to_f64(uint16_t h) { return ref_decode_ieee(h, 5, 10); }
static inline uint16_t ref_f32_to_bf16(float x) { return (uint16_t)ref_encode_ieee((double)x, 8, 7); }
static inline double ref_bf16_to_f64(uint16_t h) { return ref_decode_ieee(h, 8, 7); }

/* x rounded through the format and back */
static inline float ref_round_f16(float x) { return (float)ref_f16_to_f64(ref_f32_to_f16(x)); }
static inline float ref_round_bf16(float x) { return (float)ref_bf16_to_f64(ref_f32_to_bf16(x)); }

static inline int ref_f16_is_nan(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0; }
static inline int ref_bf16_is_nan(uint16_t h) { return (h & 0x7F80u) == 0x7F80u && (h & 0x007Fu) != 0; }

/* spacing of binary16 numbers around |x| (finite range) */
static inline double ref_f16_ulp(double x) {
  int e2;
  double a = fabs(x);
  if (a < ldexp(1.0, -14)) return ldexp(1.0, -24);
  (void)frexp(a, &e2);
  return ldexp(1.0, e2 - 1 - 10);
}

/* ------------------------------------------------------------------------ */
/* Attention                                                                */

typedef struct {
  int H, G, D, Dv;
  double scale;
  int window, n_sink;
  double softcap;
  int non_causal;
  double alibi_max_bias;
  int chunk;                /* chunked attention: keys of the query's own chunk only (0: none) */
  const float *sink_logits; /* [H] a logit per head in every softmax's denominator, no value (NULL: none) */
} ref_attn_cfg;

/* The contract's defaults: v_dim 0 => head_dim, scale 0 => 1/sqrt(head_dim). */
static inline ref_attn_cfg ref_cfg(const kva_attn *a) {
  ref_attn_cfg c;
  c.H = a->n_heads;
  c.G = a->n_kv_heads;
  c.D = a->head_dim;
  c.Dv = a->v_dim ? a->v_dim : a->head_dim;
  c.scale = a->scale != 0.0f ? (double)a->scale : 1.0 / sqrt((double)a->head_dim);
  c.window = a->window;
  c.n_sink = a->n_sink;
  c.softcap = (double)a->softcap;
  c.non_causal = a->non_causal;
  c.alibi_max_bias = (double)a->alibi_max_bias;
  c.chunk = a->chunk_size;
  c.sink_logits = a->sink_logits;
  return c;
}

/* ALiBi slopes (Press et al. 2022, "Train Short, Test Long", and the
   reference code's get_slopes): for a power-of-two head count n the
   geometric sequence 2^(-b/n), 2^(-2b/n), ..., 2^(-nb/n) (b = 8 in the
   paper); otherwise the sequence for the largest power of two n below H,
   followed by every other term (the 1st, 3rd, ...) of the sequence for 2n,
   H - n of them. b = max bias. */
static inline double ref_alibi_slope(const ref_attn_cfg *c, int h) {
  int n = 1;
  if (c->alibi_max_bias == 0.0) return 0.0;
  while (2 * n <= c->H) n *= 2;
  if (h < n) return pow(2.0, -c->alibi_max_bias * (double)(h + 1) / (double)n);
  return pow(2.0, -c->alibi_max_bias * (double)(2 * (h - n) + 1) / (double)(2 * n));
}

/* Key at kp visible to a query at qp (docs/API.md, "Conventions": positions). */
static inline int ref_visible(const ref_attn_cfg *c, int32_t qp, int32_t kp) {
  int64_t dist = (int64_t)qp - (int64_t)kp;
  if (kp > qp && !c->non_causal) return 0;
  if (c->chunk > 0 && floor((double)kp / c->chunk) != floor((double)qp / c->chunk)) return 0;
  if (c->window <= 0) return 1;
  if (llabs((long long)dist) < (long long)c->window) return 1;
  return kp < c->n_sink;
}

/* q [n_q][H][D], k [n_kv][G][D], v [n_kv][G][Dv] (double), out [n_q][H][Dv],
   lse NULL or [n_q][H].  kv_pos NULL => key j at j; q_pos NULL => query i at
   the position of key n_kv - n_q + i (requires n_q <= n_kv). */
static inline void ref_attend(const ref_attn_cfg *c, const double *q, int n_q,
                              const int32_t *q_pos, const double *k, const double *v,
                              int n_kv, const int32_t *kv_pos, double *out, double *lse) {
  int i, h, j, d, grp = c->H / c->G;
  double *s = (double *)malloc(sizeof(double) * (size_t)(n_kv > 0 ? n_kv : 1));
  char *vis = (char *)malloc((size_t)(n_kv > 0 ? n_kv : 1));
  if (!s || !vis) abort();
  for (i = 0; i < n_q; i++) {
    /* q_pos NULL: query i has the position of key n_kv - n_q + i */
    int32_t qp = q_pos ? q_pos[i] : (kv_pos ? kv_pos[n_kv - n_q + i] : (int32_t)(n_kv - n_q + i));
    for (h = 0; h < c->H; h++) {
      int g = h / grp;
      const double *qh = q + ((size_t)i * c->H + h) * c->D;
      double *o = out + ((size_t)i * c->H + h) * c->Dv;
      double m = -INFINITY, sum = 0.0;
      int any = 0;
      for (j = 0; j < n_kv; j++) {
        int32_t kp = kv_pos ? kv_pos[j] : (int32_t)j;
        const double *kj = k + ((size_t)j * c->G + g) * c->D;
        double dot = 0.0;
        vis[j] = (char)ref_visible(c, qp, kp);
        if (!vis[j]) continue;
        for (d = 0; d < c->D; d++) dot += qh[d] * kj[d];
        dot *= c->scale;
        if (c->softcap > 0.0) dot = c->softcap * tanh(dot / c->softcap);
        dot -= ref_alibi_slope(c, h) * fabs((double)qp - (double)kp);
        s[j] = dot;
        if (dot > m) m = dot;
        any = 1;
      }
      for (d = 0; d < c->Dv; d++) o[d] = 0.0;
      if (!any && !c->sink_logits) {
        if (lse) lse[(size_t)i * c->H + h] = -INFINITY;
        continue;
      }
      /* a sink logit is one more term of the denominator, with no value */
      if (c->sink_logits && (double)c->sink_logits[h] > m) m = (double)c->sink_logits[h];
      if (c->sink_logits) sum += exp((double)c->sink_logits[h] - m);
      for (j = 0; j < n_kv; j++)
        if (vis[j]) {
          s[j] = exp(s[j] - m);
          sum += s[j];
        }
      for (j = 0; j < n_kv; j++) {
        const double *vj;
        double p;
        if (!vis[j]) continue;
        vj = v + ((size_t)j * c->G + g) * c->Dv;
        p = s[j] / sum;
        for (d = 0; d < c->Dv; d++) o[d] += p * vj[d];
      }
      if (lse) lse[(size_t)i * c->H + h] = m + log(sum);
    }
  }
  free(s);
  free(vis);
}

/* Attention under an explicit mask and explicit positions (tree attention:
   docs/API.md, kva_attn.tree_parent).  The caller resolves everything
   structural: qpos[i] is query i's (effective) position, kpos its keys'
   (effective) positions, and mask[i][j] != 0 lets query i consider key j at
   all (NULL: every key).  On top of the mask the usual rules apply with those
   positions: causal unless non_causal, the window (both ways when
   non_causal), sinks by kpos < n_sink; scores are scaled, soft-capped, then
   ALiBi subtracts slope_h * |qpos[i] - kpos[j]|.
   q [n_q][H][D], k [n_kv][G][D], v [n_kv][G][Dv], out [n_q][H][Dv], lse NULL
   or [n_q][H].  kpos is [n_kv] for every KV head when kpos_head_stride is 0,
   else KV head g's positions are kpos[g * kpos_head_stride + j] (eviction
   keeps different tokens per head).  A query that sees nothing gets zeros
   and lse = -inf. */
static inline void ref_attend_masked_heads(const ref_attn_cfg *c, const double *q, int n_q, const double *k,
                                           const double *v, int n_kv, const int32_t *qpos, const int32_t *kpos,
                                           size_t kpos_head_stride, const unsigned char *mask, double *out,
                                           double *lse) {
  int i, h, j, d, grp = c->H / c->G;
  double *sc = (double *)malloc(sizeof(double) * (size_t)(n_kv > 0 ? n_kv : 1));
  char *ok = (char *)malloc((size_t)(n_kv > 0 ? n_kv : 1));
  if (!sc || !ok) abort();
  for (i = 0; i < n_q; i++) {
    for (h = 0; h < c->H; h++) {
      int g = h / grp, seen = 0;
      const int32_t *kp = kpos + (size_t)g * kpos_head_stride;
      const double *qh = q + ((size_t)i * c->H + h) * c->D;
      double *o = out + ((size_t)i * c->H + h) * c->Dv, best = -INFINITY, total = 0.0;
      double slope = ref_alibi_slope(c, h);
      for (d = 0; d < c->Dv; d++) o[d] = 0.0;
      for (j = 0; j < n_kv; j++) {
        const double *kj = k + ((size_t)j * c->G + g) * c->D;
        double x = 0.0;
        ok[j] = (char)((!mask || mask[(size_t)i * n_kv + j]) && ref_visible(c, qpos[i], kp[j]));
        if (!ok[j]) continue;
        for (d = 0; d < c->D; d++) x += qh[d] * kj[d];
        x *= c->scale;
        if (c->softcap > 0.0) x = c->softcap * tanh(x / c->softcap);
        x -= slope * fabs((double)qpos[i] - (double)kp[j]);
        sc[j] = x;
        if (x > best) best = x;
        seen = 1;
      }
      if (!seen) {
        if (lse) lse[(size_t)i * c->H + h] = -INFINITY;
        continue;
      }
      for (j = 0; j < n_kv; j++)
        if (ok[j]) total += sc[j] = exp(sc[j] - best);
      for (j = 0; j < n_kv; j++) {
        const double *vj = v + ((size_t)j * c->G + g) * c->Dv;
        if (!ok[j]) continue;
        for (d = 0; d < c->Dv; d++) o[d] += sc[j] / total * vj[d];
      }
      if (lse) lse[(size_t)i * c->H + h] = best + log(total);
    }
  }
  free(sc);
  free(ok);
}

/* The same with one kpos [n_kv] for every KV head. */
static inline void ref_attend_masked(const ref_attn_cfg *c, const double *q, int n_q, const double *k,
                                     const double *v, int n_kv, const int32_t *qpos, const int32_t *kpos,
                                     const unsigned char *mask, double *out, double *lse) {
  ref_attend_masked_heads(c, q, n_q, k, v, n_kv, qpos, kpos, 0, mask, out, lse);
}

/* ------------------------------------------------------------------------ */
/* RoPE on one token's heads, in double.  x [n_heads][head_dim].
   dim 0 => head_dim; theta 0 and inv_freq NULL => nothing.  Pair i uses
   inv_freq[i] = theta^(-2i/dim) unless a table is given; rotate-half pairs
   (x[i], x[i+dim/2]), interleaved pairs (x[2i], x[2i+1]). */
static inline void ref_rope(double *x, int n_heads, int head_dim, int dim, int interleaved,
                            double theta, const float *inv_freq, int32_t pos) {
  int h, i, half;
  if (theta == 0.0 && !inv_freq) return;
  if (dim == 0) dim = head_dim;
  half = dim / 2;
  for (h = 0; h < n_heads; h++) {
    double *xh = x + (size_t)h * head_dim;
    for (i = 0; i < half; i++) {
      double f = inv_freq ? (double)inv_freq[i] : pow(theta, -2.0 * i / dim);
      double ang = (double)pos * f, cs = cos(ang), sn = sin(ang);
      int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
      double x0 = xh[a], x1 = xh[b];
      xh[a] = x0 * cs - x1 * sn;
      xh[b] = x1 * cs + x0 * sn;
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Linear: W [out][in] float, b NULL or [out]; y = x W^T + b for one row. */
static inline void ref_linear(const float *W, const float *b, const double *x, int in, int out,
                              double *y) {
  int o, i;
  for (o = 0; o < out; o++) {
    double acc = b ? (double)b[o] : 0.0;
    const float *w = W + (size_t)o * in;
    for (i = 0; i < in; i++) acc += (double)w[i] * x[i];
    y[o] = acc;
  }
}

/* ------------------------------------------------------------------------ */
/* Helpers for comparing float results against double references.           */

/* Integer scores (kva_attn.int_scores), from docs/API.md "Integer scores": a
   query row of d floats becomes int8 codes with one symmetric scale,
   scale = (float)(amax / 127), code = round(q * 127 / amax) half away from
   zero in double, clamped to +-127; amax 0 gives codes 0. Returns 0 when the
   row holds a NaN or an infinity (its scores are then NaN). */
static inline int ref_query_codes(const float *q, int d, int *codes, float *scale) {
  double amax = 0.0;
  int i;
  for (i = 0; i < d; i++) {
    if (!isfinite((double)q[i])) return 0;
    if (fabs((double)q[i]) > amax) amax = fabs((double)q[i]);
  }
  *scale = (float)(amax / 127.0);
  for (i = 0; i < d; i++) {
    double x = amax > 0.0 ? (double)q[i] * (127.0 / amax) : 0.0;
    double c = x < 0.0 ? -floor(-x + 0.5) : floor(x + 0.5);
    codes[i] = c > 127.0 ? 127 : c < -127.0 ? -127 : (int)c;
  }
  return 1;
}
/* The query the integer scores see: code * scale per value, rows of d in place. */
static inline void ref_int_query(double *q, const float *qf, size_t rows, int d) {
  int *codes = (int *)malloc(sizeof(int) * (size_t)d), i;
  size_t r;
  for (r = 0; r < rows; r++) {
    float scale;
    if (!ref_query_codes(qf + r * (size_t)d, d, codes, &scale)) {
      for (i = 0; i < d; i++) q[r * (size_t)d + (size_t)i] = NAN;
      continue;
    }
    for (i = 0; i < d; i++) q[r * (size_t)d + (size_t)i] = (double)codes[i] * (double)scale;
  }
  free(codes);
}

static inline double *ref_dup_f(const float *x, size_t n) {
  size_t i;
  double *d = (double *)calloc(n ? n : 1, sizeof(double)); /* calloc: an empty array still reads as 0 */
  if (!d) abort();
  for (i = 0; i < n; i++) d[i] = (double)x[i];
  return d;
}

/* max |got - want| (NaN/Inf in got counts as +inf); *where gets the index */
static inline double ref_max_err(const float *got, const double *want, size_t n, size_t *where) {
  size_t i, w = 0;
  double worst = 0.0;
  for (i = 0; i < n; i++) {
    double e = fabs((double)got[i] - want[i]);
    if (!(e <= 1e300)) e = INFINITY; /* NaN */
    if (e > worst) {
      worst = e;
      w = i;
    }
  }
  if (where) *where = w;
  return worst;
}

static inline double ref_max_abs_f(const float *x, size_t n) {
  size_t i;
  double m = 0.0;
  for (i = 0; i < n; i++)
    if (fabs((double)x[i]) > m) m = fabs((double)x[i]);
  return m;
}

static inline double ref_max_abs_d(const double *x, size_t n) {
  size_t i;
  double m = 0.0;
  for (i = 0; i < n; i++)
    if (fabs(x[i]) > m) m = fabs(x[i]);
  return m;
}

#endif /* KVATTN_TEST_REF_H */
