/* test_demote.c - demotion: kva_cache_desc.demote_dtype / demote_blocks, kva_evict.demote_dtype /
 * demote_budget, kva_seq_demoted and kva_seq_read_demoted.
 *
 * Written from docs/API.md ("Demotion: evicted tokens kept at low precision", with "Eviction" and
 * "Eviction scorers") and the public declarations, not from kvattn.h's code.  The reference here is
 * plain double precision C.  The rules it implements, per layer and KV head of a sequence:
 *   - eviction is what it is without demotion: e = min(wanted, the fewest unprotected tokens any layer
 *     and KV head holds) tokens go (wanted = held + n - budget for kva_seq_append(n), held - budget
 *     with rollback = 1, held - b for kva_seq_compress(b)); WINDOW takes the oldest (sinks kept),
 *     SCORE the lowest scores, ties to the oldest (sinks and the n_recent newest positions kept); H2O
 *     by its accumulated attention, of which only e and the set are checked (and, through a twin
 *     cache whose policy deletes, that demotion leaves the held tokens exactly as deletion does);
 *   - under a demoting policy every evicted token enters its head's demoted region in the order the
 *     policy evicts it.  The region is a FIFO ring of cap tokens (demote_budget; 0: min(demote_blocks,
 *     the blocks of a block table) * block_size): it holds the last min(demoted so far, cap) in that
 *     order, the earlier ones are deleted (for H2O, whose order within one eviction is not modelled,
 *     a cut through one eviction's tokens accepts any subset of the right size and learns it).  Held,
 *     demoted and deleted positions partition every position appended; a policy that does not demote
 *     deletes and leaves the region as it is;
 *   - a demoted row reads back as kva_seq_read gave the held row just before its eviction, converted
 *     to the demoted type: F32 the same, F16 / BF16 rounded to nearest even, INT8 one scale amax / 127
 *     per row and codes round(x * 127 / amax) half away from zero, INT4 groups of 32 with min' the F16
 *     at or below the minimum, scale' the F16 at or above (max - min') / 15 and codes rounded half up
 *     (a rounding within 1e-6 of a half may go either way); with rotated rows the conversion happens
 *     in the stored basis, so it is checked by an L2 bound (the half steps of the rotated row).  Every
 *     demoted row is also within the two quantizations' steps of what kva_store was given, and never
 *     changes while it is demoted (nor does a held row while it is held);
 *   - attention (kva_attend_cache_lse) is one softmax over the held rows and the demoted rows as they
 *     read back, by position: causal, window with n_sink, chunk_size, softcap, ALiBi, sink logits
 *     counted once, GQA, several query tokens, q_stride / out_stride, scale, integer scores (the query
 *     as code * qscale against INT8 / INT4 rows, held or demoted), draft trees (query i at base +
 *     depth(i) for every key, demoted ones included); lse over both; kva_attend_cache gives the same
 *     bits; with F32 rows demoted to F32 and an unbounded ring, the output is attention over every
 *     token ever stored (demotion loses nothing); kva_attend_batch_lse (sequences that neither select
 *     nor accumulate) against the same reference;
 *   - stats: tokens_demoted = kva_seq_demoted = min(demoted so far, cap), tokens_evicted = pos - len -
 *     demoted, demote_blocks = ceil(demoted / block_size); bytes (own, prorated) and bytes_used count
 *     demote_block_bytes per demoted block, bytes_total the pool; demote_block_bytes holds block_size *
 *     n_layers * n_kv_heads * (a K row + a V row in the demoted type + 4) plus at most the alignment a
 *     block pads with, and gives the fractions docs/API.md quotes for Llama-2-7B's head at blocks of
 *     16; kva_cache_size grows with demote_blocks.
 *
 *   - dm_random: random shapes (1..3 layers, 1..3 KV heads, head_dim 5 .. 64, v_dim other than
 *     head_dim, block sizes 1..8), K / V types F32 / F16 / INT8 / INT4, every demoted type, rotated
 *     rows, WINDOW / H2O / SCORE (a hash scorer with ties, accumulate), sinks, recent, rollback,
 *     rings of 1..12 and the default (wrapping, an eviction larger than the ring), appends of 1 ..
 *     budget + 4 tokens, compresses, truncation and kva_seq_accept within a step, switches to a
 *     deleting policy and back; every step checked against the model and attention against fp64;
 *   - dm_exact: F32 demoted to F32 with an unbounded ring against attention over every token stored;
 *   - dm_tree: draft trees over held and demoted tokens, with causal masks only and with window,
 *     chunk and ALiBi (which read the tree positions);
 *   - dm_directed_fifo: hand-computed rings (an eviction larger than the ring, wrap order);
 *   - dm_desc_rules, dm_policy_rules, dm_ring_change: the refusals (and that they change nothing),
 *     the ring size rule, kind NONE ignoring the demotion fields, a deleting policy leaving the region
 *     attended;
 *   - dm_pool_full: KVA_ERR_FULL and KVA_FITS_LATER when the demoted pool is short, changing nothing;
 *     kva_seq_append_all counting demoted blocks across its sequences;
 *   - dm_fork: a fork copies the region (its own blocks, then independent), KVA_ERR_FULL when the
 *     pool cannot, kva_seq_free returning the blocks;
 *   - dm_refusals: batch plans (a WINDOW sequence holding demoted tokens accepted and attended as by
 *     kva_attend_cache; H2O, accumulate and block selection refused), export, read-back arguments,
 *     unknown sequences; a stream's policy without the demotion fields;
 *   - dm_batch: plans over several sequences, with a small ring, deleting, the default ring, against
 *     kva_attend_cache_lse per sequence (sink logits once, windows);
 *   - dm_compress: kva_seq_compress demotes as an append does, every kind;
 *   - dm_nomem: the working memory of a large call comes from alloc_fn (KVA_ERR_NOMEM writes nothing);
 *     a decode step takes none. */
#include "kvattn.h"
#include "harness.h"

enum { DM_NONE = 0, DM_HELD, DM_DEMOTED, DM_DELETED };

static int dm_verbose(void) {
  const char *s = getenv("KVA_TEST_VERBOSE");
  return s && *s && strcmp(s, "0") != 0;
}

static int dm_cdiv(int a, int b) { return (a + b - 1) / b; }

static long dm_scorer_calls, dm_rows_checked, dm_rows_rotated, dm_rows_ambiguous, dm_attn_rows, dm_ops_total;
static long dm_cut_groups, dm_big_evictions, dm_batch_rows;
static double dm_worst_attn; /* worst err / tol of the attention checks */

/* ------------------------------------------------------------------------ */
/* Number formats, from docs/API.md "Conversions" and "Storage types"        */

/* x rounded to the nearest value of a binary format (ebits exponent bits, mbits stored mantissa bits), ties to
   even, beyond the largest finite value +-Inf */
static double dm_round_fmt(double x, int ebits, int mbits) {
  int bias = (1 << (ebits - 1)) - 1, emin = 1 - bias, e;
  double a = fabs(x), q, n, fl, r, maxf;
  if (x != x || a == 0.0 || a > 1e300) return x;
  (void)frexp(a, &e);
  e -= 1; /* floor(log2(a)) */
  if (e < emin) e = emin;
  q = ldexp(1.0, e - mbits);
  n = a / q;
  fl = floor(n);
  if (n - fl > 0.5 || (n - fl == 0.5 && fmod(fl, 2.0) != 0.0)) fl += 1.0;
  r = fl * q;
  maxf = ldexp(2.0 - ldexp(1.0, -mbits), bias);
  if (r > maxf) r = INFINITY;
  return x < 0.0 ? -r : r;
}
static float dm_f16(float x) { return (float)dm_round_fmt((double)x, 5, 10); }
static float dm_bf16(float x) { return (float)dm_round_fmt((double)x, 8, 7); }

/* the gap from F16 value a >= 0 to the next larger one, and from a > 0 to the next smaller one */
static double dm_f16_gap_above(double a) {
  int e;
  if (a < ldexp(1.0, -14)) return ldexp(1.0, -24);
  (void)frexp(a, &e);
  return ldexp(1.0, e - 11);
}
static double dm_f16_gap_below(double a) {
  int e;
  double m;
  if (a <= ldexp(1.0, -14)) return ldexp(1.0, -24);
  m = frexp(a, &e);
  return m == 0.5 ? ldexp(1.0, e - 12) : ldexp(1.0, e - 11);
}
/* the largest F16 at or below x, and the smallest at or above (x saturated to +-65504 first) */
static double dm_f16_down(double x) {
  double r;
  if (x > 65504.0) x = 65504.0;
  if (x < -65504.0) x = -65504.0;
  r = dm_round_fmt(x, 5, 10);
  if (r <= x) return r;
  if (r > 0.0) return r - dm_f16_gap_below(r);
  return -(-r + dm_f16_gap_above(-r));
}
static double dm_f16_up(double x) { return -dm_f16_down(-x); }

static int dm_near_half(double t) {
  double a = fabs(t);
  return fabs(a - floor(a) - 0.5) < 1e-6;
}

/* The read-back of row x[n] stored as t.  alt: the read-back with the other code where the rule's rounding is
   within 1e-6 of a half (either is accepted), else the same as out.  Returns the number of such values. */
static int dm_model_row(kva_dtype t, const float *x, int n, float *out, float *alt) {
  int i, g0, amb = 0;
  switch (t) {
  case KVA_F32:
    for (i = 0; i < n; i++) out[i] = alt[i] = x[i];
    break;
  case KVA_F16:
    for (i = 0; i < n; i++) out[i] = alt[i] = dm_f16(x[i]);
    break;
  case KVA_BF16:
    for (i = 0; i < n; i++) out[i] = alt[i] = dm_bf16(x[i]);
    break;
  case KVA_INT8: {
    double amax = 0.0;
    float scale;
    for (i = 0; i < n; i++)
      if (isfinite((double)x[i]) && fabs((double)x[i]) > amax) amax = fabs((double)x[i]);
    scale = (float)(amax / 127.0);
    for (i = 0; i < n; i++) {
      double v = (double)x[i], c = 0.0, c2, tt;
      if (v != v || amax == 0.0) c = 0.0;
      else if (isinf(v)) c = v > 0.0 ? 127.0 : -127.0;
      else {
        tt = v * 127.0 / amax;
        c = tt < 0.0 ? -floor(-tt + 0.5) : floor(tt + 0.5);
      }
      c2 = c;
      if (v == v && !isinf(v) && amax > 0.0 && dm_near_half(v * 127.0 / amax)) {
        double lo = floor(fabs(v * 127.0 / amax));
        c2 = (v < 0.0 ? -1.0 : 1.0) * (fabs(c) == lo ? lo + 1.0 : lo);
        amb++;
      }
      if (c > 127.0) c = 127.0;
      if (c < -127.0) c = -127.0;
      if (c2 > 127.0) c2 = 127.0;
      if (c2 < -127.0) c2 = -127.0;
      out[i] = (float)(c * (double)scale); /* exact in double: one rounding, as a float multiply */
      alt[i] = (float)(c2 * (double)scale);
    }
    break;
  }
  case KVA_INT4:
    for (g0 = 0; g0 < n; g0 += 32) {
      int m = n - g0 < 32 ? n - g0 : 32, any = 0;
      double mn = 0.0, mx = 0.0, fmn, sc;
      for (i = 0; i < m; i++) {
        double v = (double)x[g0 + i];
        if (!isfinite(v)) continue;
        if (!any || v < mn) mn = v;
        if (!any || v > mx) mx = v;
        any = 1;
      }
      fmn = any ? dm_f16_down(mn) : 0.0;
      sc = any ? dm_f16_up((mx - fmn) / 15.0) : 0.0;
      for (i = 0; i < m; i++) {
        double v = (double)x[g0 + i], c = 0.0, c2, tt = 0.0;
        int near = 0;
        if (v != v) c = 0.0;
        else if (isinf(v)) c = v > 0.0 ? 15.0 : 0.0;
        else if (sc > 0.0) {
          tt = (v - fmn) / sc;
          c = floor(tt + 0.5);
          near = dm_near_half(tt);
        }
        c2 = near ? floor(tt) : c;
        amb += near;
        if (c > 15.0) c = 15.0;
        if (c < 0.0) c = 0.0;
        if (c2 > 15.0) c2 = 15.0;
        if (c2 < 0.0) c2 = 0.0;
        /* code * scale' is exact in a float and the sum with min' is exact in double: one rounding */
        out[g0 + i] = (float)((double)(float)(c * sc) + (double)(float)fmn);
        alt[g0 + i] = (float)((double)(float)(c2 * sc) + (double)(float)fmn);
      }
    }
    break;
  default:
    for (i = 0; i < n; i++) out[i] = alt[i] = x[i];
    break;
  }
  return amb;
}

/* Half a quantization step of each value of y[n] stored as t (with the float roundings of the read-back). */
static void dm_halfsteps(kva_dtype t, const double *y, int n, double *h) {
  int i, g0;
  switch (t) {
  case KVA_F32:
    for (i = 0; i < n; i++) h[i] = fabs(y[i]) * ldexp(1.0, -24);
    break;
  case KVA_F16:
    for (i = 0; i < n; i++) h[i] = fabs(y[i]) * ldexp(1.0, -11) + ldexp(1.0, -25);
    break;
  case KVA_BF16:
    for (i = 0; i < n; i++) h[i] = fabs(y[i]) * ldexp(1.0, -8) + 1e-38;
    break;
  case KVA_INT8: {
    double amax = 0.0;
    for (i = 0; i < n; i++)
      if (fabs(y[i]) > amax) amax = fabs(y[i]);
    for (i = 0; i < n; i++) h[i] = amax / 254.0 * (1.0 + 1e-6) + fabs(y[i]) * ldexp(1.0, -22);
    break;
  }
  case KVA_INT4:
    for (g0 = 0; g0 < n; g0 += 32) {
      int m = n - g0 < 32 ? n - g0 : 32;
      double mn = y[g0], mx = y[g0], fmn, sc;
      for (i = 1; i < m; i++) mn = y[g0 + i] < mn ? y[g0 + i] : mn, mx = y[g0 + i] > mx ? y[g0 + i] : mx;
      fmn = dm_f16_down(mn);
      sc = dm_f16_up((mx - fmn) / 15.0);
      for (i = 0; i < m; i++) h[g0 + i] = 0.5 * sc * (1.0 + 1e-6) + (fabs(y[g0 + i]) + fabs(fmn)) * ldexp(1.0, -22);
    }
    break;
  default:
    for (i = 0; i < n; i++) h[i] = INFINITY;
  }
}

/* The stored basis of a rotated row (docs/API.md, "Rotated rows"): the Sylvester Hadamard matrix scaled by
   1/sqrt(n) over the whole row when n is a power of two up to 1,024, else over each group of 32 values (a last,
   shorter group as is). */
static void dm_wht(const float *x, int n, double *y) {
  int i, g0, len, w, whole = n <= 1024 && (n & (n - 1)) == 0;
  for (i = 0; i < n; i++) y[i] = (double)x[i];
  for (g0 = 0; g0 < n; g0 += len) {
    len = whole ? n : (n - g0 >= 32 ? 32 : n - g0);
    if (!whole && len < 32) break; /* as is */
    for (w = 1; w < len; w *= 2)
      for (i = 0; i < len; i++)
        if (!(i & w)) {
          double a = y[g0 + i], b = y[g0 + i + w];
          y[g0 + i] = a + b, y[g0 + i + w] = a - b;
        }
    for (i = 0; i < len; i++) y[g0 + i] /= sqrt((double)len);
  }
}

/* ------------------------------------------------------------------------ */
/* The test scorer: a hash of the layer, KV head and position (7 values: ties) */

static float dm_hash_score(int l, int g, int32_t p) {
  uint32_t h = (uint32_t)p * 2654435761u ^ ((uint32_t)(l * 97 + g * 13 + 7) * 40503u);
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  return (float)(h % 7u) - 3.0f;
}

static kva_status dm_scorer(void *user, const kva_score_view *vw, float *scores) {
  int j;
  if (user) ++*(long *)user;
  for (j = 0; j < vw->n; j++) scores[j] = dm_hash_score(vw->layer, vw->kv_head, vw->pos[j]);
  return KVA_OK;
}

/* ------------------------------------------------------------------------ */
/* Snapshots: the held slots (kva_seq_read) and the demoted ones (kva_seq_read_demoted) */

typedef struct {
  int L, G, D, Dv, len, pos, nd;
  float *k, *v, *dk, *dv; /* [L][len][G][D], [L][len][G][Dv]; demoted [L][nd][G][...] */
  int32_t *p, *dp;        /* [L][len][G], [L][nd][G] */
} dm_snap;

static const float *dm_hk(const dm_snap *s, int l, int j, int g) {
  return s->k + (((size_t)l * s->len + j) * s->G + g) * s->D;
}
static const float *dm_hv(const dm_snap *s, int l, int j, int g) {
  return s->v + (((size_t)l * s->len + j) * s->G + g) * s->Dv;
}
static int32_t dm_hp(const dm_snap *s, int l, int j, int g) { return s->p[((size_t)l * s->len + j) * s->G + g]; }
static const float *dm_dk(const dm_snap *s, int l, int j, int g) {
  return s->dk + (((size_t)l * s->nd + j) * s->G + g) * s->D;
}
static const float *dm_dv(const dm_snap *s, int l, int j, int g) {
  return s->dv + (((size_t)l * s->nd + j) * s->G + g) * s->Dv;
}
static int32_t dm_dp(const dm_snap *s, int l, int j, int g) { return s->dp[((size_t)l * s->nd + j) * s->G + g]; }

static void dm_snap_take(dm_snap *s, const kva_cache *c, int seq, int L, int G, int D, int Dv) {
  int l, j, len = kva_seq_len(c, seq), nd = kva_seq_demoted(c, seq);
  s->L = L, s->G = G, s->D = D, s->Dv = Dv;
  s->len = len < 0 ? 0 : len, s->nd = nd < 0 ? 0 : nd, s->pos = kva_seq_pos(c, seq);
  s->k = KT_ALLOC(float, (size_t)L * s->len * G * D + 1);
  s->v = KT_ALLOC(float, (size_t)L * s->len * G * Dv + 1);
  s->p = KT_ALLOC(int32_t, (size_t)L * s->len * G + 1);
  s->dk = KT_ALLOC(float, (size_t)L * s->nd * G * D + 1);
  s->dv = KT_ALLOC(float, (size_t)L * s->nd * G * Dv + 1);
  s->dp = KT_ALLOC(int32_t, (size_t)L * s->nd * G + 1);
  for (l = 0; l < L; l++) {
    for (j = 0; j < s->len; j++) {
      size_t o = (size_t)l * s->len + j;
      kva_status st = kva_seq_read(c, seq, l, j, s->k + o * G * D, s->v + o * G * Dv, s->p + o * G);
      if (st != KVA_OK) {
        KT_CHECK(0, "kva_seq_read(seq %d, layer %d, slot %d) returned %d", seq, l, j, (int)st);
        memset(s->k + o * G * D, 0, sizeof(float) * G * D), memset(s->v + o * G * Dv, 0, sizeof(float) * G * Dv);
        memset(s->p + o * G, 0xff, sizeof(int32_t) * G);
      }
    }
    for (j = 0; j < s->nd; j++) {
      size_t o = (size_t)l * s->nd + j;
      kva_status st = kva_seq_read_demoted(c, seq, l, j, s->dk + o * G * D, s->dv + o * G * Dv, s->dp + o * G);
      if (st != KVA_OK) {
        KT_CHECK(0, "kva_seq_read_demoted(seq %d, layer %d, slot %d of %d) returned %d", seq, l, j, s->nd, (int)st);
        memset(s->dk + o * G * D, 0, sizeof(float) * G * D), memset(s->dv + o * G * Dv, 0, sizeof(float) * G * Dv);
        memset(s->dp + o * G, 0xff, sizeof(int32_t) * G);
      }
    }
  }
}

static void dm_snap_free(dm_snap *s) {
  free(s->k), free(s->v), free(s->p), free(s->dk), free(s->dv), free(s->dp);
  s->k = s->v = s->dk = s->dv = NULL, s->p = s->dp = NULL;
}

/* len, pos, the region's size and every slot bit for bit (held and demoted) */
static int dm_snap_same(const dm_snap *a, const dm_snap *b) {
  size_t nh, nd;
  if (a->len != b->len || a->pos != b->pos || a->nd != b->nd) return 0;
  nh = (size_t)a->L * a->len * a->G, nd = (size_t)a->L * a->nd * a->G;
  return memcmp(a->p, b->p, nh * sizeof(int32_t)) == 0 && kt_same_bits(a->k, b->k, nh * a->D) &&
         kt_same_bits(a->v, b->v, nh * a->Dv) && memcmp(a->dp, b->dp, nd * sizeof(int32_t)) == 0 &&
         kt_same_bits(a->dk, b->dk, nd * a->D) && kt_same_bits(a->dv, b->dv, nd * a->Dv);
}

/* Position -> slot of head (l, g) in the held (demoted 0) or demoted (1) slots; -1: not there. Returns 0 on a
   duplicate or a position out of [0, P). */
static int dm_index(const dm_snap *s, int demoted, int l, int g, int *idx, int P) {
  int j, ok = 1, n = demoted ? s->nd : s->len;
  for (j = 0; j < P; j++) idx[j] = -1;
  for (j = 0; j < n; j++) {
    int32_t p = demoted ? dm_dp(s, l, j, g) : dm_hp(s, l, j, g);
    if (p < 0 || p >= P || idx[p] >= 0) {
      ok = 0;
      continue;
    }
    idx[p] = j;
  }
  return ok;
}

/* The same positions with the same rows, held and demoted, in every layer and KV head (slot order aside). */
static int dm_same_tokens(const dm_snap *a, const dm_snap *b, int P) {
  int l, g, p, same = 1, dm;
  int *ia = KT_ALLOC(int, P + 1), *ib = KT_ALLOC(int, P + 1);
  if (a->len != b->len || a->pos != b->pos || a->nd != b->nd) same = 0;
  for (dm = 0; dm < 2 && same; dm++)
    for (l = 0; l < a->L && same; l++)
      for (g = 0; g < a->G && same; g++) {
        same = dm_index(a, dm, l, g, ia, P) && dm_index(b, dm, l, g, ib, P);
        for (p = 0; p < P && same; p++) {
          if ((ia[p] < 0) != (ib[p] < 0)) same = 0;
          else if (ia[p] >= 0)
            same = dm ? kt_same_bits(dm_dk(a, l, ia[p], g), dm_dk(b, l, ib[p], g), (size_t)a->D) &&
                            kt_same_bits(dm_dv(a, l, ia[p], g), dm_dv(b, l, ib[p], g), (size_t)a->Dv)
                      : kt_same_bits(dm_hk(a, l, ia[p], g), dm_hk(b, l, ib[p], g), (size_t)a->D) &&
                            kt_same_bits(dm_hv(a, l, ia[p], g), dm_hv(b, l, ib[p], g), (size_t)a->Dv);
        }
      }
  free(ia), free(ib);
  return same;
}

/* ------------------------------------------------------------------------ */
/* A sequence under test and its model                                       */

typedef struct {
  kva_cache *c, *tw; /* the cache, and NULL or a twin whose policy deletes (the held tokens must match) */
  int seq, tseq;
  int L, G, D, Dv, bs, P;
  kva_dtype kt, vt, dt;
  int rotate;
  kva_evict pol;  /* the policy set last */
  kva_evict tpol; /* the twin's */
  int cap;        /* the ring's size */
  float *orig_k, *orig_v; /* [L][G][P][D]: what kva_store was given */
  float *held_k, *held_v; /* the held read-back, last seen */
  float *dem_k, *dem_v;   /* the demoted read-back, first seen */
  unsigned char *st, *hseen, *dseen; /* [L][G][P] */
  int32_t *fifo;          /* [L][G][P]: the region in the order demoted, oldest first */
  int *fgrp;              /* the eviction each entry came from when its order within it is unknown (H2O), else unique */
  int *flen;              /* [L][G] */
  int next_grp;
  const char *what;
} dm_run;

static size_t dm_ix(const dm_run *x, int l, int g, int p) { return ((size_t)l * x->G + g) * x->P + p; }

static kva_cache *dm_cache(int L, int G, int D, int Dv, int bs, int n_blocks, kva_dtype kt, kva_dtype vt,
                           kva_dtype dt, int demote_blocks, int max_seq_len, int rotate) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  kt_desc_init(&d, L, G, D, bs, n_blocks, 8, kt);
  d.v_dim = Dv, d.v_dtype = vt, d.demote_dtype = dt, d.demote_blocks = demote_blocks;
  d.max_seq_len = max_seq_len, d.rotate = rotate;
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  return c;
}

/* cap: the ring's size */
static void dm_run_init(dm_run *x, kva_cache *c, kva_cache *tw, int L, int G, int D, int Dv, int bs, int P,
                        kva_dtype kt, kva_dtype vt, kva_dtype dt, int rotate, const kva_evict *pol, int cap,
                        const char *what) {
  size_t n = (size_t)L * G * P;
  memset(x, 0, sizeof *x);
  x->c = c, x->tw = tw, x->L = L, x->G = G, x->D = D, x->Dv = Dv, x->bs = bs, x->P = P;
  x->kt = kt, x->vt = vt, x->dt = dt, x->rotate = rotate, x->pol = *pol, x->cap = cap, x->what = what;
  x->seq = x->tseq = -1;
  x->orig_k = KT_ALLOC(float, n * D), x->orig_v = KT_ALLOC(float, n * Dv);
  x->held_k = KT_ALLOC(float, n * D), x->held_v = KT_ALLOC(float, n * Dv);
  x->dem_k = KT_ALLOC(float, n * D), x->dem_v = KT_ALLOC(float, n * Dv);
  x->st = KT_ALLOC(unsigned char, n), x->hseen = KT_ALLOC(unsigned char, n), x->dseen = KT_ALLOC(unsigned char, n);
  memset(x->st, 0, n), memset(x->hseen, 0, n), memset(x->dseen, 0, n);
  x->fifo = KT_ALLOC(int32_t, n), x->fgrp = KT_ALLOC(int, n), x->flen = KT_ALLOC(int, (size_t)L * G);
  memset(x->flen, 0, sizeof(int) * (size_t)L * G);
  KT_STATUS(kva_seq_new(c, &x->seq), KVA_OK);
  KT_STATUS(kva_seq_set_evict(c, x->seq, pol), KVA_OK);
  if (tw) {
    x->tpol = *pol;
    x->tpol.demote_dtype = KVA_DTYPE_DEFAULT, x->tpol.demote_budget = 0;
    KT_STATUS(kva_seq_new(tw, &x->tseq), KVA_OK);
    KT_STATUS(kva_seq_set_evict(tw, x->tseq, &x->tpol), KVA_OK);
  }
}

static void dm_run_free(dm_run *x) {
  free(x->orig_k), free(x->orig_v), free(x->held_k), free(x->held_v), free(x->dem_k), free(x->dem_v);
  free(x->st), free(x->hseen), free(x->dseen), free(x->fifo), free(x->fgrp), free(x->flen);
}

static int dm_demoting(const kva_evict *e) { return e->kind != KVA_EVICT_NONE && e->demote_dtype != KVA_DTYPE_DEFAULT; }

/* Sets the policy (and the twin's, deleting, the same otherwise); returns the status. */
static kva_status dm_set_policy(dm_run *x, const kva_evict *e) {
  kva_status st = kva_seq_set_evict(x->c, x->seq, e);
  if (st == KVA_OK) x->pol = *e;
  if (st == KVA_OK && x->tw) {
    x->tpol = *e;
    x->tpol.demote_dtype = KVA_DTYPE_DEFAULT, x->tpol.demote_budget = 0;
    KT_STATUS(kva_seq_set_evict(x->tw, x->tseq, &x->tpol), KVA_OK);
  }
  return st;
}

/* Random K and V for the newest n tokens of every layer, stored (and in the twin); the model keeps them. */
static void dm_store(dm_run *x, int n, kt_rng *r) {
  int l, t, g, pos = kva_seq_pos(x->c, x->seq), G = x->G, D = x->D, Dv = x->Dv;
  float *k = KT_ALLOC(float, (size_t)n * G * D + 1), *v = KT_ALLOC(float, (size_t)n * G * Dv + 1);
  for (l = 0; l < x->L; l++) {
    kt_fill(r, k, (size_t)n * G * D, -1.0f, 1.0f);
    kt_fill(r, v, (size_t)n * G * Dv, -1.0f, 1.0f);
    if (kt_int(r, 0, 3) == 0) /* an outlier channel now and then */
      for (t = 0; t < n * G; t++) k[(size_t)t * D + (size_t)(l % D)] *= 8.0f;
    KT_STATUS(kva_store(x->c, x->seq, l, k, v, n), KVA_OK);
    if (x->tw) KT_STATUS(kva_store(x->tw, x->tseq, l, k, v, n), KVA_OK);
    for (t = 0; t < n; t++)
      for (g = 0; g < G; g++) {
        int32_t p = pos - n + t;
        if (p < 0 || p >= x->P) continue;
        memcpy(x->orig_k + dm_ix(x, l, g, p) * D, k + ((size_t)t * G + g) * D, sizeof(float) * D);
        memcpy(x->orig_v + dm_ix(x, l, g, p) * Dv, v + ((size_t)t * G + g) * Dv, sizeof(float) * Dv);
      }
  }
  free(k), free(v);
}

/* Records every held row (and checks a held token's read-back never changes). */
static void dm_note_held(dm_run *x, const dm_snap *b) {
  int l, g, j, bad = 0;
  for (l = 0; l < x->L; l++)
    for (j = 0; j < b->len; j++)
      for (g = 0; g < x->G; g++) {
        int32_t p = dm_hp(b, l, j, g);
        size_t i;
        if (p < 0 || p >= x->P) continue;
        i = dm_ix(x, l, g, p);
        if (x->hseen[i]) {
          bad += !kt_same_bits(x->held_k + i * x->D, dm_hk(b, l, j, g), (size_t)x->D) ||
                 !kt_same_bits(x->held_v + i * x->Dv, dm_hv(b, l, j, g), (size_t)x->Dv);
        } else {
          memcpy(x->held_k + i * x->D, dm_hk(b, l, j, g), sizeof(float) * x->D);
          memcpy(x->held_v + i * x->Dv, dm_hv(b, l, j, g), sizeof(float) * x->Dv);
          x->hseen[i] = 1;
        }
      }
  KT_CHECK(bad == 0, "%s: %d held rows changed their read-back while held", x->what, bad);
}

typedef struct {
  double s;
  int32_t p;
} dm_cand;

static int dm_cmp_cand(const void *a, const void *b) {
  const dm_cand *u = (const dm_cand *)a, *w = (const dm_cand *)b;
  if (u->s < w->s) return -1;
  if (u->s > w->s) return 1;
  return (u->p > w->p) - (u->p < w->p);
}

static int dm_cmp_i32(const void *a, const void *b) {
  int32_t u = *(const int32_t *)a, w = *(const int32_t *)b;
  return (u > w) - (u < w);
}

static int dm_protected(const kva_evict *e, int32_t p, int pos) {
  return p < e->n_sink || (e->kind != KVA_EVICT_WINDOW && p >= pos - e->n_recent);
}

/* e of an append of n (compress 0) or kva_seq_compress(n), and per head the victims in the policy's order
   (*ordered 0: H2O, the order is not modelled; victims untouched) */
static int dm_expect(const dm_run *x, const dm_snap *b, int compress, int n, int32_t *victims, int *ordered) {
  const kva_evict *e = &x->pol;
  int l, g, j, wanted, fewest = INT32_MAX, ev;
  dm_cand *cd = KT_ALLOC(dm_cand, b->len + 1);
  *ordered = e->kind != KVA_EVICT_H2O;
  if (e->kind == KVA_EVICT_NONE) {
    free(cd);
    return 0;
  }
  wanted = compress ? b->len - n : (e->rollback ? b->len : b->len + n) - e->budget;
  for (l = 0; l < x->L; l++)
    for (g = 0; g < x->G; g++) {
      int nf = 0;
      for (j = 0; j < b->len; j++) nf += !dm_protected(e, dm_hp(b, l, j, g), b->pos);
      if (nf < fewest) fewest = nf;
    }
  ev = wanted < fewest ? wanted : fewest;
  if (ev < 0) ev = 0;
  if (*ordered && ev > 0)
    for (l = 0; l < x->L; l++)
      for (g = 0; g < x->G; g++) {
        int nc = 0;
        for (j = 0; j < b->len; j++) {
          int32_t p = dm_hp(b, l, j, g);
          if (dm_protected(e, p, b->pos)) continue;
          cd[nc].p = p;
          cd[nc].s = e->kind == KVA_EVICT_WINDOW ? (double)p : (double)dm_hash_score(l, g, p);
          nc++;
        }
        qsort(cd, (size_t)nc, sizeof(dm_cand), dm_cmp_cand);
        for (j = 0; j < ev; j++) victims[((size_t)l * x->G + g) * (b->len + 1) + j] = cd[j].p;
      }
  free(cd);
  return ev;
}

/* The region of head (l, g) after its model's FIFO took this op's victims: the last cap entries.  A cut through
   one eviction of unknown order accepts any subset of the right size (learnt from obs).  The model then keeps
   the entries observed (in its order); the others are deleted. */
static void dm_settle(dm_run *x, int l, int g, const int32_t *obs, int nobs, unsigned char *inobs) {
  int h = l * x->G + g, len = x->flen[h], drop = len > x->cap ? len - x->cap : 0, a0 = drop, b0 = drop, i, m = 0;
  int ok = 1, present = 0, foreign = 0, missing = 0, stale = 0;
  int32_t *f = x->fifo + (size_t)h * x->P;
  int *fg = x->fgrp + (size_t)h * x->P;
  memset(inobs, 0, (size_t)x->P);
  for (i = 0; i < nobs; i++) {
    if (obs[i] < 0 || obs[i] >= x->P || inobs[obs[i]]) {
      ok = 0; /* out of range or twice */
      continue;
    }
    inobs[obs[i]] = 1;
  }
  if (drop > 0 && drop < len && fg[drop - 1] == fg[drop]) {
    while (a0 > 0 && fg[a0 - 1] == fg[drop]) a0--;
    while (b0 < len && fg[b0] == fg[drop]) b0++;
    dm_cut_groups++;
  }
  for (i = 0; i < len; i++) {
    int in = inobs[f[i]];
    if (i < a0) stale += in;
    else if (i >= b0) missing += !in;
    else present += in;
    if (in) inobs[f[i]] = 2;
  }
  for (i = 0; i < nobs; i++) foreign += obs[i] >= 0 && obs[i] < x->P && inobs[obs[i]] == 1;
  ok &= nobs == len - drop && stale == 0 && missing == 0 && foreign == 0 && present == b0 - drop;
  KT_CHECK(ok, "%s: layer %d KV head %d: the demoted region is not the last %d of the %d demoted in eviction order "
           "(%d held there: %d that should be deleted, %d missing, %d never demoted, %d of a cut eviction of %d; "
           "ring %d)", x->what, l, g, len - drop, len, nobs, stale, missing, foreign, present, b0 - a0, x->cap);
  if (!ok && kt_fail_prints <= 4) {
    printf("    model (oldest first):");
    for (i = 0; i < len && i < 40; i++) printf(" %d%s", f[i], i + 1 < len && fg[i + 1] == fg[i] ? "~" : "");
    printf("\n    library:");
    for (i = 0; i < nobs && i < 40; i++) printf(" %d", obs[i]);
    printf("\n");
  }
  for (i = 0; i < len; i++) {
    if (inobs[f[i]] == 2) {
      f[m] = f[i], fg[m] = fg[i], m++;
    } else {
      x->st[dm_ix(x, l, g, f[i])] = DM_DELETED;
    }
  }
  x->flen[h] = m;
}

/* A demoted row against the rule: got, the demoted read-back; held, kva_seq_read's row before the eviction;
   orig, what kva_store was given.  Returns 1 when it passes; *amb counts values accepted either way. */
static int dm_row_ok(kva_dtype main_t, kva_dtype dt, int rotated, const float *got, const float *held,
                     const float *orig, int n, int *amb, double *worst) {
  float *out = KT_ALLOC(float, n), *alt = KT_ALLOC(float, n);
  double *y = KT_ALLOC(double, n + 1), *y0 = KT_ALLOC(double, n + 1), *hd = KT_ALLOC(double, n + 1);
  double *hm = KT_ALLOC(double, n + 1);
  int i, ok = 1;
  *worst = 0.0;
  for (i = 0; i <= n; i++) y[i] = y0[i] = hd[i] = hm[i] = 0.0;
  if (!rotated) {
    *amb += dm_model_row(dt, held, n, out, alt);
    for (i = 0; i < n; i++) ok &= got[i] == out[i] || got[i] == alt[i];
    for (i = 0; i < n; i++) y[i] = (double)held[i], y0[i] = (double)orig[i];
    dm_halfsteps(dt, y, n, hd);
    dm_halfsteps(main_t, y0, n, hm);
    for (i = 0; i < n; i++) {
      double e = fabs((double)got[i] - (double)orig[i]), tol = hm[i] + hd[i] + 1e-7 * fabs((double)orig[i]) + 1e-30;
      if (!(e <= tol)) ok = 0;
      if (e / tol > *worst) *worst = e / tol;
    }
  } else { /* the conversion happens in the stored basis: bound the error's L2 norm */
    double e_h = 0.0, e_o = 0.0, s_d = 0.0, s_m = 0.0, nx = 0.0;
    dm_wht(held, n, y);
    dm_wht(orig, n, y0);
    dm_halfsteps(dt, y, n, hd);
    dm_halfsteps(main_t, y0, n, hm);
    for (i = 0; i < n; i++) {
      double dh = (double)got[i] - (double)held[i], dor = (double)got[i] - (double)orig[i];
      e_h += dh * dh, e_o += dor * dor, s_d += hd[i] * hd[i], s_m += hm[i] * hm[i];
      nx += (double)orig[i] * (double)orig[i];
    }
    e_h = sqrt(e_h), e_o = sqrt(e_o), s_d = sqrt(s_d), s_m = sqrt(s_m), nx = sqrt(nx);
    ok = e_h <= s_d + 3e-6 * nx + 1e-30 && e_o <= s_m + s_d + 3e-6 * nx + 1e-30;
    *worst = e_o / (s_m + s_d + 3e-6 * nx + 1e-30);
  }
  free(out), free(alt), free(y), free(y0), free(hd), free(hm);
  return ok;
}

/* Every demoted slot of a: new ones against the rule, earlier ones unchanged bit for bit. */
static void dm_check_region_rows(dm_run *x, const dm_snap *a) {
  int l, j, g, bad_new = 0, bad_old = 0, amb = 0, first_l = -1, first_g = -1, first_p = -1, first_kv = 0;
  double w, first_w = 0.0;
  for (l = 0; l < x->L; l++)
    for (j = 0; j < a->nd; j++)
      for (g = 0; g < x->G; g++) {
        int32_t p = dm_dp(a, l, j, g);
        size_t i;
        if (p < 0 || p >= x->P) continue;
        i = dm_ix(x, l, g, p);
        if (x->st[i] != DM_DEMOTED) continue; /* the set check has reported it */
        if (!x->dseen[i]) {
          int okk = dm_row_ok(x->kt, x->dt, (x->rotate & KVA_ROTATE_K) != 0, dm_dk(a, l, j, g),
                              x->held_k + i * x->D, x->orig_k + i * x->D, x->D, &amb, &w);
          int okv;
          if (!okk && !bad_new) first_l = l, first_g = g, first_p = p, first_kv = 0, first_w = w;
          okv = dm_row_ok(x->vt, x->dt, (x->rotate & KVA_ROTATE_V) != 0, dm_dv(a, l, j, g),
                          x->held_v + i * x->Dv, x->orig_v + i * x->Dv, x->Dv, &amb, &w);
          if (okk && !okv && !bad_new) first_l = l, first_g = g, first_p = p, first_kv = 1, first_w = w;
          bad_new += !okk || !okv;
          memcpy(x->dem_k + i * x->D, dm_dk(a, l, j, g), sizeof(float) * x->D);
          memcpy(x->dem_v + i * x->Dv, dm_dv(a, l, j, g), sizeof(float) * x->Dv);
          x->dseen[i] = 1;
          dm_rows_checked += 2;
          if (x->rotate) dm_rows_rotated++;
        } else {
          bad_old += !kt_same_bits(x->dem_k + i * x->D, dm_dk(a, l, j, g), (size_t)x->D) ||
                     !kt_same_bits(x->dem_v + i * x->Dv, dm_dv(a, l, j, g), (size_t)x->Dv);
        }
      }
  dm_rows_ambiguous += amb;
  KT_CHECK(bad_new == 0, "%s: %d demoted tokens do not read back as their held rows converted to %s (first: layer "
           "%d KV head %d position %d, %s, err/tol %.3g; K %s, V %s, rotate %d)", x->what, bad_new,
           kva_dtype_name(x->dt), first_l, first_g, first_p, first_kv ? "V" : "K", first_w, kva_dtype_name(x->kt),
           kva_dtype_name(x->vt), x->rotate);
  if (bad_new && kt_fail_prints <= 3 && first_p >= 0) { /* the first bad row in full */
    int d, n = first_kv ? x->Dv : x->D;
    size_t i = dm_ix(x, first_l, first_g, first_p);
    const float *hr = first_kv ? x->held_v + i * x->Dv : x->held_k + i * x->D;
    const float *gr = first_kv ? x->dem_v + i * x->Dv : x->dem_k + i * x->D;
    float *o = KT_ALLOC(float, n), *al = KT_ALLOC(float, n);
    dm_model_row(x->dt, hr, n, o, al);
    printf("    held / demoted / rule:");
    for (d = 0; d < n && d < 8; d++) printf(" (%.7g %.7g %.7g)", (double)hr[d], (double)gr[d], (double)o[d]);
    printf("\n");
    free(o), free(al);
  }
  KT_CHECK(bad_old == 0, "%s: %d demoted tokens changed their read-back while demoted", x->what, bad_old);
}

/* Sequence and cache statistics against the region (one sequence per cache). */
static void dm_check_stats(const dm_run *x, const kva_cache *c, int seq, int twin) {
  kva_seq_stats ss;
  kva_cache_stats cs;
  int len = kva_seq_len(c, seq), pos = kva_seq_pos(c, seq), nd = kva_seq_demoted(c, seq);
  kva_status st = kva_seq_get_stats(c, seq, &ss);
  KT_CHECK(st == KVA_OK, "%s: kva_seq_get_stats returned %d", x->what, (int)st);
  if (st != KVA_OK) return;
  kva_cache_get_stats(c, &cs);
  KT_CHECK(ss.tokens == len && ss.tokens_demoted == nd && ss.tokens_evicted == (long)pos - len - nd &&
               ss.demote_blocks == dm_cdiv(nd, x->bs),
           "%s%s: seq stats tokens %ld demoted %ld evicted %ld demote_blocks %d; want %d, %d, pos - len - demoted = "
           "%d, ceil(%d / %d) = %d", x->what, twin ? " (twin)" : "", ss.tokens, ss.tokens_demoted, ss.tokens_evicted,
           ss.demote_blocks, len, nd, pos - len - nd, nd, x->bs, dm_cdiv(nd, x->bs));
  KT_CHECK(cs.demote_blocks_used == ss.demote_blocks &&
               cs.bytes_used == cs.block_bytes * (size_t)cs.blocks_used +
                                    cs.demote_block_bytes * (size_t)cs.demote_blocks_used &&
               cs.bytes_total ==
                   cs.block_bytes * (size_t)cs.n_blocks + cs.demote_block_bytes * (size_t)cs.demote_blocks,
           "%s%s: cache stats demote_blocks_used %d (seq %d), bytes_used %lu (blocks %d x %lu + %d x %lu), "
           "bytes_total %lu (%d x %lu + %d x %lu)", x->what, twin ? " (twin)" : "", cs.demote_blocks_used,
           ss.demote_blocks, (unsigned long)cs.bytes_used, cs.blocks_used, (unsigned long)cs.block_bytes,
           cs.demote_blocks_used, (unsigned long)cs.demote_block_bytes, (unsigned long)cs.bytes_total, cs.n_blocks,
           (unsigned long)cs.block_bytes, cs.demote_blocks, (unsigned long)cs.demote_block_bytes);
  KT_CHECK(ss.bytes == cs.block_bytes * (size_t)ss.blocks + cs.demote_block_bytes * (size_t)ss.demote_blocks &&
               ss.bytes_own == ss.bytes && ss.bytes_prorated == (double)ss.bytes && ss.bytes == cs.bytes_used,
           "%s%s: seq stats bytes %lu own %lu prorated %.0f; want %lu (blocks %d, demote_blocks %d), bytes_used %lu",
           x->what, twin ? " (twin)" : "", (unsigned long)ss.bytes, (unsigned long)ss.bytes_own, ss.bytes_prorated,
           (unsigned long)(cs.block_bytes * (size_t)ss.blocks + cs.demote_block_bytes * (size_t)ss.demote_blocks),
           ss.blocks, ss.demote_blocks, (unsigned long)cs.bytes_used);
}

/* The positions of head (l, g) in the model's states: every appended position held, demoted or deleted, and
   exactly the snapshot's held and demoted ones in those states. */
static void dm_check_partition(dm_run *x, const dm_snap *a, int *hi, int *di) {
  int l, g, p, bad = 0, fl = -1, fg = -1, fp = -1;
  for (l = 0; l < x->L; l++)
    for (g = 0; g < x->G; g++) {
      int okh = dm_index(a, 0, l, g, hi, x->P), okd = dm_index(a, 1, l, g, di, x->P);
      for (p = 0; p < x->P; p++) {
        int s = x->st[dm_ix(x, l, g, p)], want, got;
        want = p >= a->pos ? DM_NONE : s;
        got = hi[p] >= 0 && di[p] >= 0 ? -1 : hi[p] >= 0 ? DM_HELD : di[p] >= 0 ? DM_DEMOTED : p < a->pos ? DM_DELETED
                                                                                                       : DM_NONE;
        if (want != got || (p < a->pos && s == DM_NONE) || !okh || !okd) {
          if (!bad) fl = l, fg = g, fp = p;
          bad++;
        }
      }
    }
  KT_CHECK(bad == 0, "%s: held + demoted + deleted is not every position appended, disjoint, as the model has it "
           "(%d differences; first layer %d KV head %d position %d: model state %d; pos %d)", x->what, bad, fl, fg,
           fp, fp >= 0 ? (int)x->st[dm_ix(x, fl, fg, fp)] : -1, a->pos);
}

/* kva_seq_append(n) (compress 0) or kva_seq_compress(n) with everything checked; returns the status. */
static kva_status dm_op(dm_run *x, int compress, int n) {
  dm_snap b, a;
  int L = x->L, G = x->G, l, g, j, e, ordered, nn = compress ? 0 : n, demoting = dm_demoting(&x->pol);
  int32_t *vict, *left, *obs;
  int *hi = KT_ALLOC(int, x->P + 1), *di = KT_ALLOC(int, x->P + 1);
  unsigned char *mark = KT_ALLOC(unsigned char, x->P + 1);
  kva_status st, st2 = KVA_OK;
  dm_snap_take(&b, x->c, x->seq, L, G, x->D, x->Dv);
  dm_note_held(x, &b);
  vict = KT_ALLOC(int32_t, (size_t)L * G * (b.len + 1) + 1);
  left = KT_ALLOC(int32_t, b.len + 1);
  e = dm_expect(x, &b, compress, n, vict, &ordered);
  st = compress ? kva_seq_compress(x->c, x->seq, n) : kva_seq_append(x->c, x->seq, n);
  KT_CHECK(st == KVA_OK, "%s: %s(%d) returned %d (%s); %d held, pos %d, %d demoted", x->what,
           compress ? "kva_seq_compress" : "kva_seq_append", n, (int)st, kva_status_str(st), b.len, b.pos, b.nd);
  if (x->tw) {
    st2 = compress ? kva_seq_compress(x->tw, x->tseq, n) : kva_seq_append(x->tw, x->tseq, n);
    KT_CHECK(st2 == st, "%s: the twin's %s returned %d", x->what, compress ? "compress" : "append", (int)st2);
  }
  if (st != KVA_OK) goto done;
  dm_ops_total++;
  dm_big_evictions += demoting && e > x->cap;
  dm_snap_take(&a, x->c, x->seq, L, G, x->D, x->Dv);
  KT_CHECK(a.len == b.len - e + nn && a.pos == b.pos + nn,
           "%s: %s(%d): len %d pos %d; want %d and %d (%d held, %d evicted per layer and KV head)", x->what,
           compress ? "compress" : "append", n, a.len, a.pos, b.len - e + nn, b.pos + nn, b.len, e);
  for (l = 0; l < L; l++)
    for (g = 0; g < G; g++) {
      int nl = 0, ok_new = 1, same = 1, h = l * G + g, grp;
      int32_t *vh = vict + (size_t)h * (b.len + 1);
      memset(mark, 0, (size_t)x->P + 1);
      for (j = 0; j < b.len; j++) {
        int32_t p = dm_hp(&b, l, j, g);
        if (p >= 0 && p < x->P) mark[p] |= 1;
      }
      for (j = 0; j < a.len; j++) {
        int32_t p = dm_hp(&a, l, j, g);
        if (p >= 0 && p < x->P) mark[p] |= 2;
      }
      for (j = b.pos; j < b.pos + nn && j < x->P; j++) ok_new &= mark[j] == 2;
      for (j = 0; j < x->P; j++)
        if (mark[j] == 1) left[nl < b.len ? nl : b.len] = j, nl++;
      KT_CHECK(ok_new && nl == e, "%s: layer %d KV head %d: %d tokens left the held set, want %d (new positions "
               "held: %d)", x->what, l, g, nl, e, ok_new);
      if (nl > b.len) nl = b.len;
      same = nl == e;
      if (ordered && nl == e && e > 0) {
        int32_t *sv = KT_ALLOC(int32_t, e);
        memcpy(sv, vh, sizeof(int32_t) * e);
        qsort(sv, (size_t)e, sizeof(int32_t), dm_cmp_i32);
        same = memcmp(sv, left, sizeof(int32_t) * e) == 0;
        free(sv);
        KT_CHECK(same, "%s: layer %d KV head %d: the tokens that left are not the ones %s evicts (%s)", x->what, l,
                 g, x->pol.kind == KVA_EVICT_WINDOW ? "WINDOW" : "SCORE", compress ? "compress" : "append");
        if (!same && kt_fail_prints <= 4) {
          printf("    left:");
          for (j = 0; j < nl && j < 32; j++) printf(" %d", left[j]);
          printf("\n    rule:");
          for (j = 0; j < e && j < 32; j++) printf(" %d", vh[j]);
          printf("\n");
        }
      }
      /* into the region (or deleted) in the policy's order; an unknown order is one group */
      grp = x->next_grp++;
      for (j = 0; j < nl; j++) {
        int32_t p = ordered && same ? vh[j] : left[j];
        size_t i = dm_ix(x, l, g, p);
        if (demoting) {
          int f = x->flen[h]++;
          x->fifo[(size_t)h * x->P + f] = p;
          x->fgrp[(size_t)h * x->P + f] = ordered && same ? x->next_grp++ : grp;
          x->st[i] = DM_DEMOTED, x->dseen[i] = 0;
        } else {
          x->st[i] = DM_DELETED;
        }
      }
      for (j = b.pos; j < b.pos + nn && j < x->P; j++) {
        size_t i = dm_ix(x, l, g, j);
        x->st[i] = DM_HELD, x->hseen[i] = 0, x->dseen[i] = 0;
      }
      obs = KT_ALLOC(int32_t, a.nd + 1);
      for (j = 0; j < a.nd; j++) obs[j] = dm_dp(&a, l, j, g);
      dm_settle(x, l, g, obs, a.nd, mark);
      free(obs);
    }
  KT_CHECK(a.nd == x->flen[0] && a.nd == (x->flen[0] < x->cap ? x->flen[0] : x->cap),
           "%s: kva_seq_demoted %d, want %d (ring %d)", x->what, a.nd, x->flen[0], x->cap);
  dm_check_partition(x, &a, hi, di);
  dm_check_region_rows(x, &a);
  dm_check_stats(x, x->c, x->seq, 0);
  if (x->tw) {
    dm_snap t;
    dm_snap_take(&t, x->tw, x->tseq, L, G, x->D, x->Dv);
    /* the twin deletes what this one demotes: the held tokens must be the same (H2O's scores are the held
       tokens' own, the same numbers as without demotion) */
    KT_CHECK(t.nd == 0, "%s: the twin (deleting) holds %d demoted tokens", x->what, t.nd);
    { /* the held part only */
      dm_snap ah = a, th = t;
      ah.nd = 0, th.nd = 0;
      KT_CHECK(dm_same_tokens(&ah, &th, x->P), "%s: the held tokens differ from the twin's, whose policy deletes "
               "(%d held, pos %d)", x->what, a.len, a.pos);
    }
    dm_check_stats(x, x->tw, x->tseq, 1);
    dm_snap_free(&t);
  }
  dm_snap_free(&a);
done:
  dm_snap_free(&b);
  free(vict), free(left), free(hi), free(di), free(mark);
  return st;
}

/* Truncation within the newest step (k tokens): the region is untouched. */
static void dm_truncate(dm_run *x, int k) {
  dm_snap b, a;
  int l, g, j, len = kva_seq_len(x->c, x->seq), pos = kva_seq_pos(x->c, x->seq);
  dm_snap_take(&b, x->c, x->seq, x->L, x->G, x->D, x->Dv);
  KT_STATUS(kva_seq_truncate(x->c, x->seq, len - k), KVA_OK);
  if (x->tw) KT_STATUS(kva_seq_truncate(x->tw, x->tseq, len - k), KVA_OK);
  dm_snap_take(&a, x->c, x->seq, x->L, x->G, x->D, x->Dv);
  KT_CHECK(a.len == len - k && a.pos == pos - k && a.nd == b.nd && b.nd == kva_seq_demoted(x->c, x->seq),
           "%s: truncate by %d: len %d pos %d demoted %d; want %d, %d, %d", x->what, k, a.len, a.pos, a.nd, len - k,
           pos - k, b.nd);
  if (a.nd == b.nd) {
    b.len = 0, a.len = 0, a.pos = b.pos; /* the regions only: positions and rows slot for slot */
    KT_CHECK(dm_snap_same(&a, &b), "%s: a truncate within the newest step changed the demoted region", x->what);
  }
  for (l = 0; l < x->L; l++)
    for (g = 0; g < x->G; g++)
      for (j = pos - k; j < pos; j++) {
        size_t i = dm_ix(x, l, g, j);
        x->st[i] = DM_NONE, x->hseen[i] = 0, x->dseen[i] = 0;
      }
  dm_snap_free(&a), dm_snap_free(&b);
}

/* ------------------------------------------------------------------------ */
/* Attention against fp64                                                    */

/* ALiBi slopes (docs/API.md, kva_attn.alibi_max_bias) */
static double dm_slope(int H, double bias, int h) {
  int n = 1;
  if (bias == 0.0) return 0.0;
  while (2 * n <= H) n *= 2;
  if (h < n) return pow(2.0, -bias * (double)(h + 1) / (double)n);
  return pow(2.0, -bias * (double)(2 * (h - n) + 1) / (double)(2 * n));
}

/* One query row of head h at position qp over nk keys (positions kp, rows kr[j][D], vr[j][Dv]; use NULL or
   use[j] 0 leaves key j out; qi non-NULL: keys with isint[j] score with qi, the query as integer scores see it):
   o[Dv] and lse, the softmax by docs/API.md's position rules with a sink logit once. */
static void dm_ref_row(const kva_attn *a, const double *q, const double *qi, const char *isint, int32_t qp, int h,
                       int nk, const int32_t *kp, const char *use, const float *const *kr, const float *const *vr,
                       double *o, double *lse) {
  int D = a->head_dim, Dv = a->v_dim ? a->v_dim : a->head_dim, j, d, any = 0;
  double scale = a->scale != 0.0f ? (double)a->scale : 1.0 / sqrt((double)D), m = -INFINITY, sum = 0.0;
  double slope = dm_slope(a->n_heads, (double)a->alibi_max_bias, h);
  double *s = KT_ALLOC(double, nk + 1);
  char *vis = KT_ALLOC(char, nk + 1);
  for (d = 0; d < Dv; d++) o[d] = 0.0;
  for (j = 0; j < nk; j++) {
    double dot = 0.0;
    int32_t p = kp[j];
    const double *qq = qi && isint[j] ? qi : q;
    vis[j] = (char)((!use || use[j]) && p <= qp && (a->chunk_size == 0 || p / a->chunk_size == qp / a->chunk_size) &&
                    (a->window == 0 || qp - p < a->window || p < a->n_sink));
    if (!vis[j]) continue;
    for (d = 0; d < D; d++) dot += qq[d] * (double)kr[j][d];
    dot *= scale;
    if (a->softcap > 0.0f) dot = (double)a->softcap * tanh(dot / (double)a->softcap);
    dot -= slope * fabs((double)qp - (double)p);
    s[j] = dot;
    if (dot > m) m = dot;
    any = 1;
  }
  if (a->sink_logits && (double)a->sink_logits[h] > m) m = (double)a->sink_logits[h];
  if (!any && !a->sink_logits) {
    *lse = -INFINITY;
    free(s), free(vis);
    return;
  }
  if (a->sink_logits) sum += exp((double)a->sink_logits[h] - m);
  for (j = 0; j < nk; j++)
    if (vis[j]) sum += s[j] = exp(s[j] - m);
  for (j = 0; j < nk; j++)
    if (vis[j])
      for (d = 0; d < Dv; d++) o[d] += s[j] / sum * (double)vr[j][d];
  *lse = m + log(sum);
  free(s), free(vis);
}

/* The query row as integer scores see it (docs/API.md, "Integer scores"): code * qscale */
static void dm_int_query(const double *q, int D, double *qi) {
  double amax = 0.0;
  float qscale;
  int d;
  for (d = 0; d < D; d++) amax = fabs(q[d]) > amax ? fabs(q[d]) : amax;
  qscale = (float)(amax / 127.0);
  for (d = 0; d < D; d++) {
    double x = amax > 0.0 ? q[d] * (127.0 / amax) : 0.0, c = x < 0.0 ? -floor(-x + 0.5) : floor(x + 0.5);
    c = c > 127.0 ? 127.0 : c < -127.0 ? -127.0 : c;
    qi[d] = c * (double)qscale;
  }
}

static int dm_int_type(kva_dtype t) { return t == KVA_INT8 || t == KVA_INT4; }

typedef struct {
  int grp;   /* query heads per KV head (0: random 1..3) */
  int n_q;   /* 0: random 1..the step */
  int plain; /* 1: no window, chunk, softcap, ALiBi, sink logits, strides, integer scores */
  int exact; /* 1: the keys are every position held or demoted with the rows kva_store was given */
  int tree;  /* 1: the step's tokens as a random draft tree (n_q = the step) */
  int no_pos_masks; /* 1: no window, chunk or ALiBi (the rules that read positions beyond causality) */
  int no_batch;     /* 1: no batch plan of the sequence */
} dm_attn_opt;

/* Every layer: kva_attend_cache_lse (and kva_attend_cache, the same bits) against fp64 over the held and demoted
   rows read back (or, exact, the rows stored).  Returns the status of the first call that failed. */
static kva_status dm_attend_check(dm_run *x, int n_step, kt_rng *r, const dm_attn_opt *opt) {
  dm_snap s;
  int l, G = x->G, D = x->D, Dv = x->Dv, t, h, j, d;
  kva_status ret = KVA_OK;
  dm_snap_take(&s, x->c, x->seq, x->L, G, D, Dv);
  for (l = 0; l < x->L; l++) {
    kva_attn a;
    int grp = opt->grp ? opt->grp : kt_int(r, 1, 3), H = G * grp, n_q = opt->n_q ? opt->n_q : kt_int(r, 1, n_step);
    int qs, os, bad = 0, fb_t = -1, fb_h = -1, g, tree = 0, base, bad_b = 0, fbb_t = -1, fbb_h = -1;
    float *sink = KT_ALLOC(float, H), *q, *out, *out2, *lse, *ob = NULL, *lb = NULL;
    double worst_b = 0.0;
    double *qd = KT_ALLOC(double, D), *qi = KT_ALLOC(double, D), *o = KT_ALLOC(double, Dv), rl, vmax = 0.0, tol;
    double worst = 0.0;
    int32_t **kp = KT_ALLOC(int32_t *, G), *tp = KT_ALLOC(int32_t, n_step + 1), *depth = KT_ALLOC(int32_t, n_step + 1);
    int32_t *ep;
    const float ***kr = KT_ALLOC(const float **, G), ***vr = KT_ALLOC(const float **, G);
    char **isint = KT_ALLOC(char *, G), *use;
    int **newj = KT_ALLOC(int *, G), *nk = KT_ALLOC(int, G);
    kva_status st;
    kt_attn_init(&a, H, G, D, Dv);
    if (!opt->plain) {
      if (kt_int(r, 0, 1) && !opt->no_pos_masks) a.window = kt_int(r, 1, s.pos + 1), a.n_sink = kt_int(r, 0, 3);
      if (kt_int(r, 0, 2) == 0 && !opt->no_pos_masks) a.chunk_size = kt_int(r, 2, 10);
      if (kt_int(r, 0, 2) == 0) a.softcap = kt_uniform(r, 2.0f, 30.0f);
      if (kt_int(r, 0, 2) == 0 && !opt->no_pos_masks) a.alibi_max_bias = kt_uniform(r, 0.5f, 8.0f);
      if (kt_int(r, 0, 2) == 0) {
        kt_fill(r, sink, (size_t)H, -2.0f, 2.0f);
        a.sink_logits = sink;
      }
      if (kt_int(r, 0, 3) == 0) a.scale = kt_uniform(r, -0.6f, 0.6f);
      if (kt_int(r, 0, 2) == 0) a.q_stride = H * D + kt_int(r, 1, 7);
      if (kt_int(r, 0, 2) == 0) a.out_stride = H * Dv + kt_int(r, 1, 7);
      if (!(x->rotate & KVA_ROTATE_K) && kt_int(r, 0, 3) == 0) a.int_scores = 1;
      if (opt->tree) { /* a draft tree over the whole step */
        tree = 1, n_q = n_step;
        for (t = 0; t < n_q; t++) tp[t] = kt_int(r, -1, t - 1);
        a.tree_parent = tp;
      }
    }
    for (t = 0; t < n_q; t++) depth[t] = tree && tp[t] >= 0 ? depth[tp[t]] + 1 : 0;
    base = s.pos - n_q;
    qs = a.q_stride ? a.q_stride : H * D, os = a.out_stride ? a.out_stride : H * Dv;
    q = KT_ALLOC(float, (size_t)n_q * qs), out = KT_ALLOC(float, (size_t)n_q * os + 1);
    out2 = KT_ALLOC(float, (size_t)n_q * os + 1), lse = KT_ALLOC(float, (size_t)n_q * H + 1);
    kt_fill(r, q, (size_t)n_q * qs, -1.5f, 1.5f);
    kt_fill_sentinel(out, (size_t)n_q * os + 1), kt_fill_sentinel(out2, (size_t)n_q * os + 1);
    kt_fill_sentinel(lse, (size_t)n_q * H + 1);
    st = kva_attend_cache_lse(x->c, x->seq, l, &a, q, n_q, out, lse);
    KT_CHECK(st == KVA_OK, "%s: kva_attend_cache_lse(layer %d, n_q %d) returned %d (%s)", x->what, l, n_q, (int)st,
             kva_status_str(st));
    if (st == KVA_OK) {
      st = kva_attend_cache(x->c, x->seq, l, &a, q, n_q, out2);
      KT_CHECK(st == KVA_OK && kt_same_bits(out, out2, (size_t)n_q * os + 1),
               "%s: layer %d: kva_attend_cache (%d) is not kva_attend_cache_lse's output bit for bit", x->what, l,
               (int)st);
    }
    if (x->tw) { /* the same calls (H2O's scores) */
      KT_STATUS(kva_attend_cache_lse(x->tw, x->tseq, l, &a, q, n_q, out2, NULL), KVA_OK);
      KT_STATUS(kva_attend_cache(x->tw, x->tseq, l, &a, q, n_q, out2), KVA_OK);
    }
    /* a batch plan of this sequence (one that neither selects nor accumulates) attends the demoted region too */
    if (st == KVA_OK && !opt->no_batch && x->pol.kind != KVA_EVICT_H2O && !x->pol.accumulate && !x->tw &&
        kt_int(r, 0, 1)) {
      kva_batch *plan = NULL;
      kva_status sb = kva_batch_plan(x->c, &a, &x->seq, &n_q, 1, &plan);
      ob = KT_ALLOC(float, (size_t)n_q * os + 1), lb = KT_ALLOC(float, (size_t)n_q * H + 1);
      kt_fill_sentinel(ob, (size_t)n_q * os + 1), kt_fill_sentinel(lb, (size_t)n_q * H + 1);
      if (sb == KVA_OK) sb = kva_attend_batch_lse(x->c, plan, l, q, ob, lb);
      KT_CHECK(sb == KVA_OK, "%s: layer %d: a batch plan of a sequence holding %d demoted tokens: %d (%s)", x->what,
               l, s.nd, (int)sb, kva_status_str(sb));
      kva_batch_free(plan);
      if (sb != KVA_OK) free(ob), free(lb), ob = lb = NULL;
    }
    if (st != KVA_OK) {
      if (ret == KVA_OK) ret = st;
      goto next;
    }
    /* the keys of each KV head */
    for (g = 0; g < G; g++) {
      int cap = opt->exact ? x->P : s.len + s.nd;
      kp[g] = KT_ALLOC(int32_t, cap + 1), kr[g] = KT_ALLOC(const float *, cap + 1);
      vr[g] = KT_ALLOC(const float *, cap + 1), isint[g] = KT_ALLOC(char, cap + 1), newj[g] = KT_ALLOC(int, cap + 1);
      nk[g] = 0;
      if (opt->exact) {
        int p;
        for (p = 0; p < s.pos && p < x->P; p++) {
          size_t i = dm_ix(x, l, g, p);
          if (x->st[i] != DM_HELD && x->st[i] != DM_DEMOTED) continue;
          kp[g][nk[g]] = p, kr[g][nk[g]] = x->orig_k + i * D, vr[g][nk[g]] = x->orig_v + i * Dv;
          isint[g][nk[g]] = 0, newj[g][nk[g]] = x->st[i] == DM_HELD && p >= base ? p - base : -1, nk[g]++;
        }
      } else {
        for (j = 0; j < s.len; j++) {
          int32_t p = dm_hp(&s, l, j, g);
          kp[g][nk[g]] = p, kr[g][nk[g]] = dm_hk(&s, l, j, g), vr[g][nk[g]] = dm_hv(&s, l, j, g);
          isint[g][nk[g]] = (char)dm_int_type(x->kt), newj[g][nk[g]] = p >= base ? p - base : -1, nk[g]++;
        }
        for (j = 0; j < s.nd; j++) {
          kp[g][nk[g]] = dm_dp(&s, l, j, g), kr[g][nk[g]] = dm_dk(&s, l, j, g), vr[g][nk[g]] = dm_dv(&s, l, j, g);
          isint[g][nk[g]] = (char)dm_int_type(x->dt), newj[g][nk[g]] = -1, nk[g]++;
        }
      }
      for (j = 0; j < nk[g]; j++)
        for (d = 0; d < Dv; d++)
          if (fabs((double)vr[g][j][d]) > vmax) vmax = fabs((double)vr[g][j][d]);
    }
    tol = (2e-5 > 4e-6 * (1.0 + sqrt((double)D)) ? 2e-5 : 4e-6 * (1.0 + sqrt((double)D))) * (1.0 + vmax);
    ep = KT_ALLOC(int32_t, s.len + s.nd + x->P + 1), use = KT_ALLOC(char, s.len + s.nd + x->P + 1);
    for (t = 0; t < n_q; t++) {
      int32_t qp = tree ? base + depth[t] : s.pos - n_q + t;
      for (h = 0; h < H; h++) {
        double w = 0.0, gl = (double)lse[(size_t)t * H + h];
        g = h / grp;
        for (d = 0; d < D; d++) qd[d] = (double)q[(size_t)t * qs + (size_t)h * D + d];
        dm_int_query(qd, D, qi);
        for (j = 0; j < nk[g]; j++) { /* a tree: the new tokens at base + depth, each query sees its ancestors */
          int nj = newj[g][j], an = tree ? t : nj;
          if (!tree || nj < 0) {
            ep[j] = kp[g][j], use[j] = 1;
            continue;
          }
          while (an > nj) an = tp[an];
          ep[j] = base + depth[nj], use[j] = (char)(an == nj);
        }
        dm_ref_row(&a, qd, a.int_scores ? qi : NULL, isint[g], qp, h, nk[g], ep, use, kr[g], vr[g], o, &rl);
        for (d = 0; d < Dv; d++) {
          double e = fabs((double)out[(size_t)t * os + (size_t)h * Dv + d] - o[d]);
          if (!(e <= 1e300)) e = INFINITY;
          if (e / tol > w) w = e / tol;
        }
        if (rl == -INFINITY) {
          if (gl != -INFINITY) w = INFINITY;
        } else {
          double e = fabs(gl - rl), tl = 1e-5 * (1.0 + fabs(rl));
          if (!(e <= 1e300)) e = INFINITY;
          if (e / tl > w) w = e / tl;
        }
        if (w > worst) worst = w;
        dm_attn_rows++;
        if (!(w <= 1.0)) {
          if (!bad) fb_t = t, fb_h = h;
          bad++;
        }
        if (ob) { /* the batch's row against the same reference */
          double wb = 0.0, gb = (double)lb[(size_t)t * H + h];
          for (d = 0; d < Dv; d++) {
            double e = fabs((double)ob[(size_t)t * os + (size_t)h * Dv + d] - o[d]);
            if (!(e <= 1e300)) e = INFINITY;
            if (e / tol > wb) wb = e / tol;
          }
          if (rl == -INFINITY) {
            if (gb != -INFINITY) wb = INFINITY;
          } else {
            double e = fabs(gb - rl), tl = 1e-5 * (1.0 + fabs(rl));
            if (!(e <= 1e300)) e = INFINITY;
            if (e / tl > wb) wb = e / tl;
          }
          if (wb > worst_b) worst_b = wb;
          dm_batch_rows++;
          if (!(wb <= 1.0)) {
            if (!bad_b) fbb_t = t, fbb_h = h;
            bad_b++;
          }
        }
      }
      for (d = H * Dv; d < os; d++) bad += kt_f2u(out[(size_t)t * os + d]) != kt_f2u(KT_SENTINEL);
      for (d = H * Dv; d < os && ob; d++) bad_b += kt_f2u(ob[(size_t)t * os + d]) != kt_f2u(KT_SENTINEL);
    }
    bad += !kt_all_sentinel(out + (size_t)n_q * os, 1) || !kt_all_sentinel(lse + (size_t)n_q * H, 1);
    if (ob) bad_b += !kt_all_sentinel(ob + (size_t)n_q * os, 1) || !kt_all_sentinel(lb + (size_t)n_q * H, 1);
    if (worst_b <= 1.0 && worst_b > dm_worst_attn) dm_worst_attn = worst_b;
    KT_CHECK(bad_b == 0, "%s: layer %d: kva_attend_batch_lse: %d (token, head) rows differ from fp64 over the held "
             "and demoted rows (first: token %d of %d, head %d, err/tol %.3g; %d held, %d demoted, pos %d; H %d G %d "
             "D %d Dv %d, window %d sink %d chunk %d softcap %g alibi %g sinks %s scale %g strides %d %d, int scores "
             "%d, tree %d)", x->what, l, bad_b, fbb_t, n_q, fbb_h, worst_b, s.len, s.nd, s.pos, H, G, D, Dv, a.window,
             a.n_sink, a.chunk_size, (double)a.softcap, (double)a.alibi_max_bias, a.sink_logits ? "yes" : "no",
             (double)a.scale, a.q_stride, a.out_stride, a.int_scores, tree);
    if (worst <= 1.0 && worst > dm_worst_attn) dm_worst_attn = worst;
    KT_CHECK(bad == 0, "%s: layer %d: %d (token, head) rows differ from fp64 over the held and demoted rows%s (first: "
             "token %d of %d, head %d, err/tol %.3g; %d held, %d demoted, pos %d; H %d G %d D %d Dv %d, window %d "
             "sink %d chunk %d softcap %g alibi %g sinks %s scale %g strides %d %d, int scores %d, tree %d)", x->what,
             l, bad, opt->exact ? " (exact: every token stored)" : "", fb_t, n_q, fb_h, worst, s.len, s.nd, s.pos, H,
             G, D, Dv, a.window, a.n_sink, a.chunk_size, (double)a.softcap, (double)a.alibi_max_bias,
             a.sink_logits ? "yes" : "no", (double)a.scale, a.q_stride, a.out_stride, a.int_scores, tree);
    for (g = 0; g < G; g++) free(kp[g]), free((void *)kr[g]), free((void *)vr[g]), free(isint[g]), free(newj[g]);
    free(ep), free(use);
  next:
    free(sink), free(qd), free(qi), free(o), free(kp), free(tp), free(depth), free((void *)kr), free((void *)vr);
    free(isint), free(newj), free(nk), free(q), free(out), free(out2), free(lse), free(ob), free(lb);
  }
  dm_snap_free(&s);
  return ret;
}

/* kva_seq_accept of the newest n tokens keeping keep[n_keep]: the region is untouched, the kept tokens move down. */
static void dm_accept(dm_run *x, int n, const int32_t *keep, int n_keep) {
  dm_snap b, a;
  int l, g, j, len = kva_seq_len(x->c, x->seq), pos = kva_seq_pos(x->c, x->seq), base = pos - n;
  dm_snap_take(&b, x->c, x->seq, x->L, x->G, x->D, x->Dv);
  KT_STATUS(kva_seq_accept(x->c, x->seq, n, keep, n_keep), KVA_OK);
  if (x->tw) KT_STATUS(kva_seq_accept(x->tw, x->tseq, n, keep, n_keep), KVA_OK);
  dm_snap_take(&a, x->c, x->seq, x->L, x->G, x->D, x->Dv);
  KT_CHECK(a.len == len - n + n_keep && a.pos == pos - n + n_keep && a.nd == b.nd,
           "%s: accept %d of %d: len %d pos %d demoted %d; want %d, %d, %d", x->what, n_keep, n, a.len, a.pos, a.nd,
           len - n + n_keep, pos - n + n_keep, b.nd);
  if (a.nd == b.nd) {
    b.len = 0, a.len = 0, a.pos = b.pos;
    KT_CHECK(dm_snap_same(&a, &b), "%s: kva_seq_accept within the newest step changed the demoted region", x->what);
  }
  for (l = 0; l < x->L; l++)
    for (g = 0; g < x->G; g++) {
      for (j = 0; j < n_keep; j++) {
        size_t to = dm_ix(x, l, g, base + j), from = dm_ix(x, l, g, base + keep[j]);
        memmove(x->orig_k + to * x->D, x->orig_k + from * x->D, sizeof(float) * x->D);
        memmove(x->orig_v + to * x->Dv, x->orig_v + from * x->Dv, sizeof(float) * x->Dv);
        memmove(x->held_k + to * x->D, x->held_k + from * x->D, sizeof(float) * x->D);
        memmove(x->held_v + to * x->Dv, x->held_v + from * x->Dv, sizeof(float) * x->Dv);
        x->hseen[to] = x->hseen[from], x->st[to] = DM_HELD, x->dseen[to] = 0;
      }
      for (j = base + n_keep; j < pos; j++) {
        size_t i = dm_ix(x, l, g, j);
        x->st[i] = DM_NONE, x->hseen[i] = 0, x->dseen[i] = 0;
      }
    }
  dm_snap_free(&a), dm_snap_free(&b);
}

/* ------------------------------------------------------------------------ */
/* Random cases                                                              */

static kva_evict dm_policy(int kind, int budget, int n_sink, int n_recent, int rollback, kva_dtype dt, int dbud,
                           long *calls) {
  kva_evict e;
  memset(&e, 0, sizeof e);
  e.kind = kind, e.budget = budget, e.n_sink = n_sink, e.n_recent = n_recent, e.rollback = rollback;
  e.demote_dtype = dt, e.demote_budget = dbud;
  if (kind == KVA_EVICT_SCORE) e.score = dm_scorer, e.score_user = calls;
  return e;
}

static void dm_random_case(kt_rng *r, int it) {
  static const int Ds[6] = {5, 8, 12, 20, 33, 64};
  static const kva_dtype mains[4] = {KVA_F32, KVA_F16, KVA_INT8, KVA_INT4};
  static const kva_dtype dems[5] = {KVA_F32, KVA_F16, KVA_BF16, KVA_INT8, KVA_INT4};
  static const int kinds[3] = {KVA_EVICT_WINDOW, KVA_EVICT_H2O, KVA_EVICT_SCORE};
  int L = kt_int(r, 1, 3), G = kt_int(r, 1, 3), D = Ds[kt_int(r, 0, 5)], Dv = kt_int(r, 0, 2) ? D : Ds[kt_int(r, 0, 5)];
  int bs = kt_int(r, 1, 8), kind = kinds[(it / 5) % 3], budget = kt_int(r, 2, 10), n_sink, n_recent, rollback;
  int steps = kt_int(r, 12, 26), maxapp = budget + 4, dbud, dmb, msl = 0, table, n_blocks, cap, rotate = 0, P, step;
  int hold_max;
  kva_dtype kt = mains[kt_int(r, 0, 3)], vt = mains[kt_int(r, 0, 3)], dt = dems[it % 5];
  kva_evict pol;
  kva_cache *c, *tw = NULL;
  long calls = 0;
  dm_run x;
  char what[200];
  dm_attn_opt ao;
  n_sink = kt_int(r, 0, budget - 1 < 2 ? budget - 1 : 2);
  n_recent = kind == KVA_EVICT_WINDOW ? kt_int(r, 0, 2)
                                      : kt_int(r, 0, budget - n_sink - 1 < 2 ? budget - n_sink - 1 : 2);
  rollback = kt_int(r, 0, 1);
  dbud = kt_int(r, 0, 2) == 0 ? 0 : kt_int(r, 1, 12);
  if (kt_int(r, 0, 3) == 0) rotate = kt_int(r, 1, 3);
  hold_max = 2 * budget + 2 * maxapp + 8;
  n_blocks = dm_cdiv(hold_max, bs) + 2;
  if (kt_int(r, 0, 3) == 0) msl = hold_max;
  table = msl ? dm_cdiv(msl, bs) : n_blocks;
  if (dbud > 0) dmb = dm_cdiv(dbud, bs) + kt_int(r, 0, 2);
  else dmb = kt_int(r, 0, 3) == 0 ? 0 : kt_int(r, 1, 6);
  { /* demote_budget, else what a block table holds of the pool */
    int eff = dmb == 0 ? n_blocks : dmb;
    cap = dbud > 0 ? dbud : (eff < table ? eff : table) * bs;
  }
  P = steps * maxapp + 2;
  pol = dm_policy(kind, budget, n_sink, n_recent, rollback, dt, dbud, &calls);
  if (kind == KVA_EVICT_SCORE && kt_int(r, 0, 1)) pol.accumulate = 1;
  sprintf(what, "demote random %d (L %d G %d D %d Dv %d bs %d %s/%s -> %s, %s budget %d sink %d recent %d rollback "
          "%d, ring %d%s, rotate %d)", it, L, G, D, Dv, bs, kva_dtype_name(kt), kva_dtype_name(vt),
          kva_dtype_name(dt), kind == KVA_EVICT_WINDOW ? "WINDOW" : kind == KVA_EVICT_H2O ? "H2O" : "SCORE", budget,
          n_sink, n_recent, rollback, cap, dbud ? "" : " (default)", rotate);
  c = dm_cache(L, G, D, Dv, bs, n_blocks, kt, vt, dt, dmb, msl, rotate);
  if (kind == KVA_EVICT_H2O || pol.accumulate) tw = dm_cache(L, G, D, Dv, bs, n_blocks, kt, vt, dt, dmb, msl, rotate);
  if (!c) {
    kva_cache_destroy(tw);
    return;
  }
  dm_run_init(&x, c, tw, L, G, D, Dv, bs, P, kt, vt, dt, rotate, &pol, cap, what);
  memset(&ao, 0, sizeof ao);
  for (step = 0; step < steps; step++) {
    int roll = kt_int(r, 0, 99), n;
    if (step > 0 && roll < 8) { /* a deleting policy, or back to demoting (the same ring) */
      kva_evict e = x.pol;
      e.demote_dtype = dm_demoting(&e) ? KVA_DTYPE_DEFAULT : dt;
      e.demote_budget = e.demote_dtype ? dbud : 0;
      KT_STATUS(dm_set_policy(&x, &e), KVA_OK);
    }
    if (step > 1 && roll >= 8 && roll < 18) { /* compress */
      int lo = n_sink + (kind == KVA_EVICT_WINDOW ? 0 : n_recent), len = kva_seq_len(c, x.seq);
      if (lo < 1) lo = 1;
      dm_op(&x, 1, kt_int(r, lo, len > lo ? len : lo));
      continue;
    }
    n = kt_int(r, 0, 4) == 0 ? kt_int(r, 1, maxapp) : kt_int(r, 1, 3);
    if (dm_op(&x, 0, n) != KVA_OK) break;
    dm_store(&x, n, r);
    dm_attend_check(&x, n, r, &ao);
    if (roll >= 18 && roll < 28) { /* a rejected draft: truncate within the step */
      dm_truncate(&x, kt_int(r, 1, n));
    } else if (roll >= 28 && roll < 38) { /* a path of a draft tree accepted */
      int32_t *keep = KT_ALLOC(int32_t, n + 1);
      int nk = 0, j;
      for (j = 0; j < n; j++)
        if (kt_int(r, 0, 2)) keep[nk++] = j;
      dm_accept(&x, n, keep, nk);
      free(keep);
    }
  }
  dm_scorer_calls += calls;
  dm_run_free(&x);
  kva_cache_destroy(c), kva_cache_destroy(tw);
}

/* Draft trees (kva_attn.tree_parent) over a sequence holding demoted tokens: query i sits at base + depth(i),
   and "the causal rule, window, n_sink and ALiBi distances use these positions" for every key the query may see,
   demoted ones "by the same position rules".  Two tests: trees with only causal masks (no window, chunk or ALiBi),
   and trees with them. */
static void dm_tree_case(int masks, int it, kt_rng *r) {
  static const int kinds[3] = {KVA_EVICT_WINDOW, KVA_EVICT_H2O, KVA_EVICT_SCORE};
  static const kva_dtype dems[5] = {KVA_F32, KVA_F16, KVA_BF16, KVA_INT8, KVA_INT4};
  int L = kt_int(r, 1, 2), G = kt_int(r, 1, 2), D = it % 2 ? 8 : 12, bs = kt_int(r, 1, 4), kind = kinds[it % 3];
  int budget = kt_int(r, 3, 6), steps = 10, step, P = steps * 5 + 2, n_blocks = dm_cdiv(P, bs) + 2;
  kva_dtype dt = dems[it % 5], kt = it % 2 ? KVA_F16 : KVA_INT8;
  long calls = 0;
  kva_evict pol = dm_policy(kind, budget, 1, kind == KVA_EVICT_WINDOW ? 0 : 1, 0, dt, 6, &calls);
  kva_cache *c = dm_cache(L, G, D, D, bs, n_blocks, kt, kt, dt, dm_cdiv(6, bs) + 1, 0, 0);
  dm_run x;
  dm_attn_opt ao;
  char what[160];
  if (!c) return;
  sprintf(what, "demote tree %d (%s, %s -> %s, budget %d, bs %d, %s)", it,
          kind == KVA_EVICT_WINDOW ? "WINDOW" : kind == KVA_EVICT_H2O ? "H2O" : "SCORE", kva_dtype_name(kt),
          kva_dtype_name(dt), budget, bs, masks ? "window / chunk / ALiBi" : "causal only");
  dm_run_init(&x, c, NULL, L, G, D, D, bs, P, kt, kt, dt, 0, &pol, 6, what);
  memset(&ao, 0, sizeof ao);
  ao.tree = 1, ao.no_pos_masks = !masks;
  for (step = 0; step < steps; step++) {
    int n = kt_int(r, 2, 5);
    if (dm_op(&x, 0, n) != KVA_OK) break;
    dm_store(&x, n, r);
    dm_attend_check(&x, n, r, &ao);
  }
  dm_run_free(&x);
  kva_cache_destroy(c);
}

static void dm_tree(void) {
  kt_rng r;
  int it, n = kt_iters(15);
  kt_begin("demote: draft trees over held and demoted tokens (causal masks only)");
  kt_seed(&r, 0x7EE);
  for (it = 0; it < n; it++) dm_tree_case(0, it, &r);
  kt_begin("demote: draft trees over held and demoted tokens, window / chunk / ALiBi at the tree positions");
  for (it = 0; it < n; it++) dm_tree_case(1, it, &r);
}

static void dm_random(void) {
  kt_rng r;
  int it, n = kt_iters(240);
  kt_begin("demote: random caches, policies and rings against the FIFO model, rows and fp64 attention");
  kt_seed(&r, 0xDE307E);
  for (it = 0; it < n; it++) dm_random_case(&r, it);
}

/* F32 demoted to F32, the ring unbounded: attention over every token ever stored. */
static void dm_exact(void) {
  static const int kinds[3] = {KVA_EVICT_WINDOW, KVA_EVICT_H2O, KVA_EVICT_SCORE};
  kt_rng r;
  int it, n = kt_iters(30);
  kt_begin("demote: F32 to F32 with an unbounded ring loses nothing (fp64 over every token stored)");
  kt_seed(&r, 0xE7AC7);
  for (it = 0; it < n; it++) {
    int L = kt_int(&r, 1, 2), G = kt_int(&r, 1, 3), D = it % 2 ? 16 : 7, bs = kt_int(&r, 1, 6), kind = kinds[it % 3];
    int budget = kt_int(&r, 2, 6), steps = 20, step, P = steps * 6 + 2, n_blocks = dm_cdiv(P, bs) + 2;
    int rotate = it % 4 == 3 ? KVA_ROTATE_K | KVA_ROTATE_V : 0;
    long calls = 0;
    kva_evict pol = dm_policy(kind, budget, kt_int(&r, 0, 1), kind == KVA_EVICT_WINDOW ? 0 : kt_int(&r, 0, 1),
                              kt_int(&r, 0, 1), KVA_F32, 0, &calls);
    kva_cache *c = dm_cache(L, G, D, D, bs, n_blocks, KVA_F32, KVA_F32, KVA_F32, dm_cdiv(P, bs) + 1, 0, rotate);
    dm_run x;
    dm_attn_opt ao;
    char what[120];
    if (!c) continue;
    sprintf(what, "demote exact %d (%s, budget %d, bs %d, rotate %d)", it,
            kind == KVA_EVICT_WINDOW ? "WINDOW" : kind == KVA_EVICT_H2O ? "H2O" : "SCORE", budget, bs, rotate);
    dm_run_init(&x, c, NULL, L, G, D, D, bs, P, KVA_F32, KVA_F32, KVA_F32, rotate, &pol, (dm_cdiv(P, bs) + 1) * bs,
                what);
    memset(&ao, 0, sizeof ao);
    ao.exact = 1;
    for (step = 0; step < steps; step++) {
      int k = kt_int(&r, 1, 4);
      if (dm_op(&x, 0, k) != KVA_OK) break;
      dm_store(&x, k, &r);
      dm_attend_check(&x, k, &r, &ao);
      KT_CHECK(kva_seq_demoted(c, x.seq) == kva_seq_pos(c, x.seq) - kva_seq_len(c, x.seq),
               "%s: %d demoted, %d evicted: a token was deleted", what, kva_seq_demoted(c, x.seq),
               kva_seq_pos(c, x.seq) - kva_seq_len(c, x.seq));
    }
    dm_run_free(&x);
    kva_cache_destroy(c);
  }
}

/* ------------------------------------------------------------------------ */
/* Directed rings                                                            */

static kva_status dm_tab_scorer(void *user, const kva_score_view *vw, float *scores) {
  const float *tab = (const float *)user;
  int j;
  for (j = 0; j < vw->n; j++) scores[j] = tab[vw->pos[j]];
  return KVA_OK;
}

/* The region of (layer l, KV head g) holds exactly positions want[n] (any slot order) and, for F32 rows, the rows
   stored (orig [P][G][D] by position); returns 1 when it does. */
static int dm_region_is(const kva_cache *c, int seq, int L, int G, int D, int l, int g, const int32_t *want, int n,
                        const float *orig, int P) {
  dm_snap s;
  int *idx = KT_ALLOC(int, P + 1), ok, i;
  dm_snap_take(&s, c, seq, L, G, D, D);
  ok = s.nd == n && dm_index(&s, 1, l, g, idx, P);
  for (i = 0; i < n && ok; i++) {
    ok = want[i] >= 0 && want[i] < P && idx[want[i]] >= 0;
    if (ok && orig)
      ok = kt_same_bits(dm_dk(&s, l, idx[want[i]], g), orig + ((size_t)want[i] * G + g) * D, (size_t)D) &&
           kt_same_bits(dm_dv(&s, l, idx[want[i]], g), orig + ((size_t)want[i] * G + g) * D, (size_t)D);
  }
  if (!ok && kt_fail_prints < 6) {
    printf("    region of layer %d head %d (%d):", l, g, s.nd);
    for (i = 0; i < s.nd && i < 24; i++) printf(" %d", dm_dp(&s, l, i, g));
    printf("; want");
    for (i = 0; i < n; i++) printf(" %d", want[i]);
    printf("\n");
  }
  dm_snap_free(&s);
  free(idx);
  return ok;
}

/* Appends n, stores orig's rows (K = V) at the new positions in every layer; F32 caches. */
static kva_status dm_append_rows(kva_cache *c, int seq, int L, int G, int D, int n, const float *orig) {
  int l, pos;
  kva_status st = kva_seq_append(c, seq, n);
  if (st != KVA_OK) return st;
  pos = kva_seq_pos(c, seq);
  for (l = 0; l < L; l++) {
    const float *rows = orig + (size_t)(pos - n) * G * D;
    st = kva_store(c, seq, l, rows, rows, n);
    if (st != KVA_OK) return st;
  }
  return KVA_OK;
}

static void dm_directed_fifo(void) {
  enum { D = 4, P = 32 };
  static const float tab[16] = {9.0f, 5.0f, 1.0f, 3.0f, 1.0f, 0.0f, 2.0f, 7.0f,
                                4.0f, 6.0f, 8.0f, 0.5f, 0.0f, 0.0f, 0.0f, 0.0f};
  static const int32_t w1[3] = {3, 4, 5}, w2[3] = {4, 5, 6};
  static const int32_t s1[3] = {4, 3, 1}, s2[3] = {5, 6, 8}, s3[3] = {6, 8, 11};
  float orig[P * D];
  kva_cache *c;
  kva_evict e;
  kt_rng r;
  kva_seq_stats ss;
  int seq = -1;
  kt_begin("demote: directed rings (eviction order, an eviction larger than the ring, wrapping)");
  kt_seed(&r, 0xF1F0);
  kt_fill(&r, orig, (size_t)P * D, -1.0f, 1.0f);
  /* WINDOW, budget 8, ring 3: an append of 6 evicts 0..5 oldest first, the ring keeps 3 4 5 */
  c = dm_cache(1, 1, D, D, 2, 32, KVA_F32, KVA_F32, KVA_F32, 4, 0, 0);
  if (!c) return;
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  e = dm_policy(KVA_EVICT_WINDOW, 8, 0, 0, 0, KVA_F32, 3, NULL);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  KT_STATUS(dm_append_rows(c, seq, 1, 1, D, 8, orig), KVA_OK);
  KT_CHECK(kva_seq_demoted(c, seq) == 0, "window: %d demoted before any eviction", kva_seq_demoted(c, seq));
  KT_STATUS(dm_append_rows(c, seq, 1, 1, D, 6, orig), KVA_OK);
  KT_CHECK(dm_region_is(c, seq, 1, 1, D, 0, 0, w1, 3, orig, P), "window: after evicting 0..5 into a ring of 3 the "
           "region is not {3, 4, 5} with their rows");
  KT_STATUS(kva_seq_get_stats(c, seq, &ss), KVA_OK);
  KT_CHECK(ss.tokens_demoted == 3 && ss.tokens_evicted == 3 && ss.demote_blocks == 2 && ss.tokens == 8,
           "window: stats demoted %ld evicted %ld demote_blocks %d tokens %ld; want 3 3 2 8", ss.tokens_demoted,
           ss.tokens_evicted, ss.demote_blocks, ss.tokens);
  KT_STATUS(dm_append_rows(c, seq, 1, 1, D, 1, orig), KVA_OK);
  KT_CHECK(dm_region_is(c, seq, 1, 1, D, 0, 0, w2, 3, orig, P), "window: after evicting 6 the region is not {4, 5, 6}");
  kva_cache_destroy(c);
  /* SCORE, budget 6, sink 1, recent 1, ring 3; scores by position from tab */
  c = dm_cache(1, 1, D, D, 2, 32, KVA_F32, KVA_F32, KVA_F32, 4, 0, 0);
  if (!c) return;
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  e = dm_policy(KVA_EVICT_SCORE, 6, 1, 1, 0, KVA_F32, 3, NULL);
  e.score = dm_tab_scorer, e.score_user = (void *)tab;
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  KT_STATUS(dm_append_rows(c, seq, 1, 1, D, 6, orig), KVA_OK);
  /* 1..4 go, lowest first, ties oldest: 2 (1), 4 (1), 3 (3), 1 (5); the ring keeps the last 3 */
  KT_STATUS(dm_append_rows(c, seq, 1, 1, D, 6, orig), KVA_OK);
  KT_CHECK(kva_seq_len(c, seq) == 8, "score: len %d, want 8", kva_seq_len(c, seq));
  KT_CHECK(dm_region_is(c, seq, 1, 1, D, 0, 0, s1, 3, orig, P), "score: evicting 2 4 3 1 into a ring of 3 leaves "
           "{4, 3, 1}");
  /* held 0 5 6..11: 5 (0), 6 (2), 8 (4) go and replace the whole ring */
  KT_STATUS(dm_append_rows(c, seq, 1, 1, D, 1, orig), KVA_OK);
  KT_CHECK(dm_region_is(c, seq, 1, 1, D, 0, 0, s2, 3, orig, P), "score: the ring is not {5, 6, 8}");
  /* held 0 7 9 10 11 12: 11 (0.5) goes, replacing 5, the earliest demoted */
  KT_STATUS(dm_append_rows(c, seq, 1, 1, D, 1, orig), KVA_OK);
  KT_CHECK(dm_region_is(c, seq, 1, 1, D, 0, 0, s3, 3, orig, P), "score: the ring is not {6, 8, 11}");
  KT_STATUS(kva_seq_get_stats(c, seq, &ss), KVA_OK);
  KT_CHECK(ss.tokens_demoted == 3 && ss.tokens_evicted == 14 - 6 - 3 && ss.demote_blocks == 2,
           "score: stats demoted %ld evicted %ld demote_blocks %d; want 3 5 2", ss.tokens_demoted, ss.tokens_evicted,
           ss.demote_blocks);
  kva_cache_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* The description's rules                                                   */

/* bytes of one row of n values in type t (docs/API.md, "Memory layout and bytes per token") */
static size_t dm_row_bytes(kva_dtype t, int n) {
  switch (t) {
  case KVA_F32: return 4u * (size_t)n;
  case KVA_F16:
  case KVA_BF16: return 2u * (size_t)n;
  case KVA_INT8: return (size_t)n + 4u;
  case KVA_INT4: return 20u * (size_t)(n / 32) + (n % 32 ? 4u + (size_t)(n % 32 + 1) / 2 : 0u);
  default: return 0;
  }
}

static void dm_desc_rules(void) {
  static const kva_dtype dems[5] = {KVA_F32, KVA_F16, KVA_BF16, KVA_INT8, KVA_INT4};
  kva_cache_desc d, d0;
  kva_cache *c = NULL;
  kva_cache_stats cs;
  kva_layer_group grp;
  size_t sz = 0, sz0 = 0, sz2 = 0;
  int i;
  kt_begin("demote: the description (types, pool size, bytes, refusals)");
  kt_desc_init(&d0, 2, 3, 40, 4, 16, 4, KVA_F16);
  d0.v_dim = 24;
  KT_STATUS(kva_cache_size(&d0, &sz0), KVA_OK);
  for (i = 0; i < 5; i++) {
    size_t want;
    d = d0;
    d.demote_dtype = dems[i], d.demote_blocks = 5;
    want = 4u * 2u * 3u * (dm_row_bytes(dems[i], 40) + dm_row_bytes(dems[i], 24) + 4u);
    KT_STATUS(kva_cache_size(&d, &sz), KVA_OK);
    KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
    if (!c) continue;
    kva_cache_get_stats(c, &cs);
    /* the rows and positions, plus at most the alignment a block of the main pool pads with (a 64-byte
       boundary per layer and row array) */
    KT_CHECK(cs.demote_blocks == 5 && cs.demote_blocks_used == 0 && cs.demote_block_bytes >= want &&
                 cs.demote_block_bytes <= want + 2u * 64u * (2u * 3u * 2u + 1u),
             "%s: demote_blocks %d used %d demote_block_bytes %lu; want 5, 0, %lu (block_size x layers x KV heads x "
             "(K row + V row + 4)) and some padding", kva_dtype_name(dems[i]), cs.demote_blocks,
             cs.demote_blocks_used, (unsigned long)cs.demote_block_bytes, (unsigned long)want);
    KT_CHECK(cs.bytes_total == cs.block_bytes * 16u + cs.demote_block_bytes * 5u && cs.bytes_footprint == sz &&
                 cs.bytes_used == 0 && sz >= sz0 + 5u * cs.demote_block_bytes,
             "%s: bytes_total %lu (pool %lu + demoted %lu), footprint %lu vs kva_cache_size %lu (without the pool "
             "%lu)", kva_dtype_name(dems[i]), (unsigned long)cs.bytes_total, (unsigned long)(cs.block_bytes * 16u),
             (unsigned long)(cs.demote_block_bytes * 5u), (unsigned long)cs.bytes_footprint, (unsigned long)sz,
             (unsigned long)sz0);
    kva_cache_destroy(c), c = NULL;
    d.demote_blocks = 11; /* the size grows with the pool */
    KT_STATUS(kva_cache_size(&d, &sz2), KVA_OK);
    KT_CHECK(sz2 >= sz + 6u * want, "%s: kva_cache_size with 11 demoted blocks %lu, with 5 %lu: grew by less than 6 "
             "blocks of %lu", kva_dtype_name(dems[i]), (unsigned long)sz2, (unsigned long)sz, (unsigned long)want);
    d.demote_blocks = 0; /* 0: as many as n_blocks */
    KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
    if (c) {
      kva_cache_get_stats(c, &cs);
      KT_CHECK(cs.demote_blocks == 16, "%s: demote_blocks 0 gave a pool of %d, want n_blocks 16",
               kva_dtype_name(dems[i]), cs.demote_blocks);
      kva_cache_destroy(c), c = NULL;
    }
  }
  { /* Llama-2-7B's head (128, blocks of 16): the fractions docs/API.md quotes of an F16 token (INT4 0.320, INT8
       0.523, F16 1.008), from the layout and from demote_block_bytes / block_size */
    static const kva_dtype t3[3] = {KVA_INT4, KVA_INT8, KVA_F16};
    static const double f3[3] = {0.320, 0.523, 1.008};
    for (i = 0; i < 3; i++) {
      double f = (double)(2 * dm_row_bytes(t3[i], 128) + 4) / (double)(2 * dm_row_bytes(KVA_F16, 128));
      kt_desc_init(&d, 2, 2, 128, 16, 2, 2, KVA_F16);
      d.demote_dtype = t3[i], d.demote_blocks = 1;
      KT_CHECK(fabs(f - f3[i]) < 0.0006, "the quoted fraction for %s: %.4f from the layout, %.3f quoted",
               kva_dtype_name(t3[i]), f, f3[i]);
      c = NULL;
      KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
      if (!c) continue;
      kva_cache_get_stats(c, &cs);
      f = (double)cs.demote_block_bytes / 16.0 / (2.0 * 2.0 * 2.0 * (double)dm_row_bytes(KVA_F16, 128));
      KT_CHECK(fabs(f - f3[i]) < 0.0006, "%s: demote_block_bytes %lu / 16 is %.4f of an F16 token, docs/API.md quotes "
               "%.3f", kva_dtype_name(t3[i]), (unsigned long)cs.demote_block_bytes, f, f3[i]);
      kva_cache_destroy(c), c = NULL;
    }
  }
  /* no pool: nothing */
  KT_STATUS(kva_cache_create(&d0, &c), KVA_OK);
  if (c) {
    kva_cache_get_stats(c, &cs);
    KT_CHECK(cs.demote_blocks == 0 && cs.demote_blocks_used == 0 && cs.bytes_total == cs.block_bytes * 16u,
             "no demoted pool: demote_blocks %d, bytes_total %lu", cs.demote_blocks, (unsigned long)cs.bytes_total);
    kva_cache_destroy(c), c = NULL;
  }
  /* refusals: kva_cache_size says what kva_cache_create says */
  for (i = 0; i < 6; i++) {
    kva_status want = KVA_ERR_UNSUPPORTED, s1, s2;
    const char *why = "";
    d = d0;
    d.demote_dtype = KVA_F16, d.demote_blocks = 4;
    switch (i) {
    case 0: d.demote_dtype = KVA_FP8_E4M3, why = "FP8 E4M3"; break;
    case 1: d.demote_dtype = KVA_FP8_E5M2, why = "FP8 E5M2"; break;
    case 2: d.kind = KVA_CACHE_LATENT, d.v_dim = 16, why = "a latent cache"; break;
    case 3:
      memset(&grp, 0, sizeof grp);
      grp.kind = KVA_SPAN_WINDOW, grp.window = 4;
      d.n_groups = 1, d.groups = &grp, why = "layer groups";
      break;
    case 4: d.evict_support = KVA_EVICT_SUPPORT_NONE, why = "evict_support NONE"; break;
    default: d.demote_blocks = -1, want = KVA_ERR_ARG, why = "demote_blocks -1"; break;
    }
    s1 = kva_cache_size(&d, &sz);
    c = NULL;
    s2 = kva_cache_create(&d, &c);
    KT_CHECK(s1 == want && s2 == want, "%s: kva_cache_size %d, kva_cache_create %d, want %d", why, (int)s1, (int)s2,
             (int)want);
    if (s2 == KVA_OK) kva_cache_destroy(c);
    c = NULL;
    if (i >= 2 && i <= 4) { /* the same description without the pool is fine */
      d.demote_dtype = KVA_DTYPE_DEFAULT, d.demote_blocks = 0;
      KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
      if (c) kva_cache_destroy(c);
      c = NULL;
    }
  }
  d = d0; /* positions only is enough */
  d.demote_dtype = KVA_INT8, d.evict_support = KVA_EVICT_SUPPORT_WINDOW;
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  if (c) kva_cache_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* Plain steps for the directed cases                                        */

/* append n, store random rows in every layer, attend the newest token (status of the first failure) */
static kva_status dm_step(kva_cache *c, int seq, int L, int G, int D, int n, kt_rng *r) {
  float *k = KT_ALLOC(float, (size_t)n * G * D + 1), *q = KT_ALLOC(float, (size_t)G * D);
  float *o = KT_ALLOC(float, (size_t)G * D);
  kva_attn a;
  int l;
  kva_status st = kva_seq_append(c, seq, n);
  kt_attn_init(&a, G, G, D, D);
  for (l = 0; l < L && st == KVA_OK; l++) {
    kt_fill(r, k, (size_t)n * G * D, -1.0f, 1.0f);
    kt_fill(r, q, (size_t)G * D, -1.0f, 1.0f);
    st = kva_store(c, seq, l, k, k, n);
    if (st == KVA_OK) st = kva_attend_cache(c, seq, l, &a, q, 1, o);
  }
  free(k), free(q), free(o);
  return st;
}

static void dm_policy_rules(void) {
  enum { L = 2, G = 2, D = 8 };
  kva_cache *c = dm_cache(L, G, D, D, 2, 16, KVA_F16, KVA_F16, KVA_F16, 4, 0, 0), *c2, *c3;
  kva_evict e, e0;
  kt_rng r;
  dm_snap b, a;
  int seq = -1, i, s2 = -1;
  kt_begin("demote: the policy's rules (types, budgets, refusals change nothing)");
  if (!c) return;
  kt_seed(&r, 0x9011C7);
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  e0 = dm_policy(KVA_EVICT_WINDOW, 3, 1, 0, 0, KVA_F16, 4, NULL);
  KT_STATUS(kva_seq_set_evict(c, seq, &e0), KVA_OK);
  for (i = 0; i < 6; i++) KT_STATUS(dm_step(c, seq, L, G, D, 1, &r), KVA_OK);
  KT_CHECK(kva_seq_demoted(c, seq) == 3, "%d demoted after 6 tokens under WINDOW 3 (1 sink), want 3",
           kva_seq_demoted(c, seq));
  dm_snap_take(&b, c, seq, L, G, D, D);
  for (i = 0; i < 10; i++) {
    kva_status want = i < 2 ? KVA_ERR_ARG : KVA_ERR_UNSUPPORTED, got;
    const char *why = "";
    e = e0;
    switch (i) {
    case 0: e.demote_dtype = KVA_DTYPE_DEFAULT, e.demote_budget = 3, why = "demote_budget without demote_dtype"; break;
    case 1: e.demote_budget = -1, why = "a negative demote_budget"; break;
    case 2: e.demote_dtype = KVA_INT8, why = "INT8, not the cache's F16"; break;
    case 3: e.demote_dtype = KVA_BF16, why = "BF16, not the cache's F16"; break;
    case 4: e.demote_dtype = KVA_FP8_E4M3, why = "FP8, not the cache's F16"; break;
    case 5: e.demote_budget = 9, why = "demote_budget 9 > min(demote_blocks 4, table 16) x 2"; break;
    case 6: e.demote_budget = 5, why = "another ring size while demoted tokens are held"; break;
    case 7: e.demote_budget = 0, why = "ring 0 (8 tokens) while a ring of 4 holds tokens"; break;
    case 8: e.kind = KVA_EVICT_H2O, e.n_recent = 1, e.demote_budget = 2, why = "H2O with another ring"; break;
    default: e.demote_budget = 8, why = "the largest ring, not this one"; break;
    }
    got = kva_seq_set_evict(c, seq, &e);
    KT_CHECK(got == want, "kva_seq_set_evict with %s returned %d, want %d", why, (int)got, (int)want);
  }
  dm_snap_take(&a, c, seq, L, G, D, D);
  KT_CHECK(dm_snap_same(&b, &a), "refused policies changed the sequence");
  dm_snap_free(&a);
  /* the old policy is still in force: one more token demotes one more (ring 4) */
  KT_STATUS(dm_step(c, seq, L, G, D, 1, &r), KVA_OK);
  KT_CHECK(kva_seq_demoted(c, seq) == 4 && kva_seq_len(c, seq) == 3,
           "after the refusals: %d demoted, %d held; want 4 and 3 (WINDOW 3, ring 4)", kva_seq_demoted(c, seq),
           kva_seq_len(c, seq));
  KT_STATUS(dm_step(c, seq, L, G, D, 1, &r), KVA_OK);
  KT_CHECK(kva_seq_demoted(c, seq) == 4, "a full ring of 4 holds %d", kva_seq_demoted(c, seq));
  /* accepted: the same ring under any kind; kind NONE checks the demotion fields but demotes nothing */
  e = e0;
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  e.kind = KVA_EVICT_H2O, e.n_recent = 1;
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  e.kind = KVA_EVICT_SCORE, e.score = dm_scorer;
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  for (i = 0; i < 4; i++) { /* "demote_budget without demote_dtype, a negative demote_budget ... are
                               KVA_ERR_ARG (for every kind; a policy of kind NONE demotes nothing)" */
    static const int budgets[4] = {-1, 3, 0, -1};
    static const kva_dtype types[4] = {KVA_DTYPE_DEFAULT, KVA_DTYPE_DEFAULT, KVA_INT8, KVA_F16};
    static const kva_status want[4] = {KVA_ERR_ARG, KVA_ERR_ARG, KVA_OK, KVA_ERR_ARG};
    kva_status got;
    memset(&e, 0, sizeof e);
    e.kind = KVA_EVICT_NONE, e.demote_budget = budgets[i], e.demote_dtype = types[i];
    got = kva_seq_set_evict(c, seq, &e);
    KT_CHECK(got == want[i], "kva_seq_set_evict(kind NONE, demote_dtype %s, demote_budget %d) returned %d, want %d",
             kva_dtype_name(types[i]), budgets[i], (int)got, (int)want[i]);
  }
  KT_STATUS(kva_seq_set_evict(c, seq, &e0), KVA_OK);
  /* a new sequence may pick any ring up to the largest before it demotes */
  KT_STATUS(kva_seq_new(c, &s2), KVA_OK);
  e = e0, e.demote_budget = 8;
  KT_STATUS(kva_seq_set_evict(c, s2, &e), KVA_OK);
  e.demote_budget = 0;
  KT_STATUS(kva_seq_set_evict(c, s2, &e), KVA_OK);
  e.demote_budget = 2;
  KT_STATUS(kva_seq_set_evict(c, s2, &e), KVA_OK);
  dm_snap_free(&b);
  kva_cache_destroy(c);
  /* a cache without a demoted pool refuses a demoting policy */
  c2 = dm_cache(1, 1, D, D, 2, 16, KVA_F16, KVA_F16, KVA_DTYPE_DEFAULT, 0, 0, 0);
  if (c2) {
    KT_STATUS(kva_seq_new(c2, &seq), KVA_OK);
    e = e0;
    KT_STATUS(kva_seq_set_evict(c2, seq, &e), KVA_ERR_UNSUPPORTED);
    e.demote_budget = 0;
    KT_STATUS(kva_seq_set_evict(c2, seq, &e), KVA_ERR_UNSUPPORTED);
    KT_CHECK(kva_seq_demoted(c2, seq) == 0, "no pool: kva_seq_demoted %d", kva_seq_demoted(c2, seq));
    kva_cache_destroy(c2);
  }
  /* max_seq_len 4 (2 blocks of 2) bounds the ring below demote_blocks 4: 4 tokens at most */
  c3 = dm_cache(1, 1, D, D, 2, 16, KVA_INT4, KVA_INT4, KVA_INT4, 4, 4, 0);
  if (c3) {
    KT_STATUS(kva_seq_new(c3, &seq), KVA_OK);
    e = dm_policy(KVA_EVICT_WINDOW, 2, 0, 0, 0, KVA_INT4, 5, NULL);
    KT_STATUS(kva_seq_set_evict(c3, seq, &e), KVA_ERR_UNSUPPORTED);
    e.demote_budget = 4;
    KT_STATUS(kva_seq_set_evict(c3, seq, &e), KVA_OK);
    e.demote_budget = 0; /* the default ring: 4 */
    KT_STATUS(kva_seq_set_evict(c3, seq, &e), KVA_OK);
    for (i = 0; i < 9; i++) KT_STATUS(dm_step(c3, seq, 1, 1, D, 1, &r), KVA_OK);
    KT_CHECK(kva_seq_demoted(c3, seq) == 4, "max_seq_len 4: the default ring holds %d, want 4",
             kva_seq_demoted(c3, seq));
    e.demote_budget = 4; /* the same ring size */
    KT_STATUS(kva_seq_set_evict(c3, seq, &e), KVA_OK);
    e.demote_budget = 3;
    KT_STATUS(kva_seq_set_evict(c3, seq, &e), KVA_ERR_UNSUPPORTED);
    kva_cache_destroy(c3);
  }
}

/* Changing the policy of a sequence holding demoted tokens, through the model. */
static void dm_ring_change(void) {
  enum { L = 2, G = 2, D = 12, bs = 2, P = 64 };
  kva_cache *c = dm_cache(L, G, D, D, bs, 32, KVA_F16, KVA_INT8, KVA_INT8, 8, 0, 0);
  kva_evict e = dm_policy(KVA_EVICT_WINDOW, 3, 1, 0, 0, KVA_INT8, 4, NULL), e2;
  dm_run x;
  dm_attn_opt ao;
  kt_rng r;
  dm_snap b, a;
  int i;
  kt_begin("demote: ring changes, a deleting policy keeps the region attended, demoting again");
  if (!c) return;
  kt_seed(&r, 0x41C6);
  dm_run_init(&x, c, NULL, L, G, D, D, bs, P, KVA_F16, KVA_INT8, KVA_INT8, 0, &e, 4, "ring change");
  memset(&ao, 0, sizeof ao);
  for (i = 0; i < 5; i++) {
    dm_op(&x, 0, 1);
    dm_store(&x, 1, &r);
    dm_attend_check(&x, 1, &r, &ao);
  }
  KT_CHECK(kva_seq_demoted(c, x.seq) == 2, "ring change: %d demoted, want 2", kva_seq_demoted(c, x.seq));
  dm_snap_take(&b, c, x.seq, L, G, D, D);
  e2 = e, e2.demote_budget = 5;
  KT_STATUS(dm_set_policy(&x, &e2), KVA_ERR_UNSUPPORTED);
  e2.demote_budget = 0;
  KT_STATUS(dm_set_policy(&x, &e2), KVA_ERR_UNSUPPORTED);
  dm_snap_take(&a, c, x.seq, L, G, D, D);
  KT_CHECK(dm_snap_same(&b, &a), "ring change: a refused policy changed the sequence");
  dm_snap_free(&a), dm_snap_free(&b);
  KT_STATUS(dm_set_policy(&x, &e), KVA_OK);
  /* a deleting policy: the region stays (attended, unchanged), evicted tokens are deleted */
  e2 = e, e2.demote_dtype = KVA_DTYPE_DEFAULT, e2.demote_budget = 0;
  KT_STATUS(dm_set_policy(&x, &e2), KVA_OK);
  for (i = 0; i < 4; i++) {
    dm_op(&x, 0, 1 + i % 2);
    dm_store(&x, 1 + i % 2, &r);
    dm_attend_check(&x, 1 + i % 2, &r, &ao);
  }
  KT_CHECK(kva_seq_demoted(c, x.seq) == 2, "ring change: a deleting policy changed the region's size to %d",
           kva_seq_demoted(c, x.seq));
  /* demoting again, the same ring: it fills and wraps */
  KT_STATUS(dm_set_policy(&x, &e), KVA_OK);
  for (i = 0; i < 6; i++) {
    dm_op(&x, 0, 1 + i % 3);
    dm_store(&x, 1 + i % 3, &r);
    dm_attend_check(&x, 1 + i % 3, &r, &ao);
  }
  KT_CHECK(kva_seq_demoted(c, x.seq) == 4, "ring change: %d demoted after demoting again, want a full ring of 4",
           kva_seq_demoted(c, x.seq));
  /* H2O with the same ring keeps demoting */
  e2 = dm_policy(KVA_EVICT_H2O, 3, 1, 1, 0, KVA_INT8, 4, NULL);
  KT_STATUS(dm_set_policy(&x, &e2), KVA_OK);
  for (i = 0; i < 4; i++) {
    dm_op(&x, 0, 1);
    dm_store(&x, 1, &r);
    dm_attend_check(&x, 1, &r, &ao);
  }
  dm_run_free(&x);
  kva_cache_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* The demoted pool runs short                                               */

static void dm_pool_full(void) {
  enum { D = 8 };
  kva_cache *c = dm_cache(1, 1, D, D, 2, 32, KVA_F16, KVA_F16, KVA_F16, 2, 0, 0);
  kva_evict ea = dm_policy(KVA_EVICT_WINDOW, 2, 0, 0, 0, KVA_F16, 4, NULL);
  kva_evict eb = dm_policy(KVA_EVICT_WINDOW, 2, 0, 0, 0, KVA_F16, 2, NULL);
  kva_cache_stats s0, s1;
  dm_snap b, a;
  kt_rng r;
  int A = -1, B = -1, i, blocks = -1;
  kva_status st;
  kt_begin("demote: the demoted pool runs short (KVA_ERR_FULL, KVA_FITS_LATER, nothing changed; append_all)");
  if (!c) return;
  kt_seed(&r, 0xF011);
  KT_STATUS(kva_seq_new(c, &A), KVA_OK);
  KT_STATUS(kva_seq_new(c, &B), KVA_OK);
  KT_STATUS(kva_seq_set_evict(c, A, &ea), KVA_OK);
  KT_STATUS(kva_seq_set_evict(c, B, &eb), KVA_OK);
  for (i = 0; i < 6; i++) KT_STATUS(dm_step(c, A, 1, 1, D, 1, &r), KVA_OK);
  kva_cache_get_stats(c, &s0);
  KT_CHECK(kva_seq_demoted(c, A) == 4 && s0.demote_blocks_used == 2, "A: %d demoted in %d blocks, want 4 in 2",
           kva_seq_demoted(c, A), s0.demote_blocks_used);
  for (i = 0; i < 2; i++) KT_STATUS(dm_step(c, B, 1, 1, D, 1, &r), KVA_OK);
  /* B's next token evicts one, which needs a demoted block: none is free */
  dm_snap_take(&b, c, B, 1, 1, D, D);
  kva_cache_get_stats(c, &s0);
  KT_CHECK(kva_seq_fits(c, B, 1, &blocks) == KVA_FITS_LATER, "B: kva_seq_fits says %d, want KVA_FITS_LATER",
           (int)kva_seq_fits(c, B, 1, NULL));
  st = kva_seq_append(c, B, 1);
  KT_STATUS(st, KVA_ERR_FULL);
  kva_cache_get_stats(c, &s1);
  dm_snap_take(&a, c, B, 1, 1, D, D);
  KT_CHECK(dm_snap_same(&b, &a) && kt_stats_equal(&s0, &s1, 1) && s1.appends_failed == s0.appends_failed + 1 &&
               s1.demote_blocks_used == s0.demote_blocks_used,
           "B: the refused append changed the sequence or the cache (appends_failed %ld -> %ld)", s0.appends_failed,
           s1.appends_failed);
  dm_snap_free(&a);
  /* the step is still B's last append: attention works */
  {
    float q[D], o[D];
    kva_attn at;
    kt_attn_init(&at, 1, 1, D, D);
    kt_fill(&r, q, D, -1.0f, 1.0f);
    KT_STATUS(kva_attend_cache(c, B, 0, &at, q, 1, o), KVA_OK);
  }
  /* A's ring is full: it reuses its slots, no new block */
  KT_CHECK(kva_seq_fits(c, A, 1, NULL) == KVA_FITS_NOW, "A: a full ring needs no new block, yet fits says %d",
           (int)kva_seq_fits(c, A, 1, NULL));
  KT_STATUS(dm_step(c, A, 1, 1, D, 1, &r), KVA_OK);
  KT_STATUS(kva_seq_free(c, A), KVA_OK);
  kva_cache_get_stats(c, &s1);
  KT_CHECK(s1.demote_blocks_used == 0, "freeing A left %d demoted blocks used", s1.demote_blocks_used);
  KT_CHECK(kva_seq_fits(c, B, 1, NULL) == KVA_FITS_NOW, "B after A's free: fits says %d",
           (int)kva_seq_fits(c, B, 1, NULL));
  KT_STATUS(dm_step(c, B, 1, 1, D, 1, &r), KVA_OK);
  KT_CHECK(kva_seq_demoted(c, B) == 1, "B: %d demoted, want 1", kva_seq_demoted(c, B));
  dm_snap_free(&b);
  kva_cache_destroy(c);
  /* kva_seq_append_all: two sequences that each need a demoted block, one free */
  c = dm_cache(1, 1, D, D, 2, 32, KVA_F16, KVA_F16, KVA_F16, 1, 0, 0);
  if (!c) return;
  {
    kva_evict e1 = dm_policy(KVA_EVICT_WINDOW, 1, 0, 0, 0, KVA_F16, 1, NULL);
    int seqs[2] = {-1, -1}, ns[2] = {1, 1};
    dm_snap ba, bb, aa, ab;
    KT_STATUS(kva_seq_new(c, &seqs[0]), KVA_OK);
    KT_STATUS(kva_seq_new(c, &seqs[1]), KVA_OK);
    for (i = 0; i < 2; i++) {
      KT_STATUS(kva_seq_set_evict(c, seqs[i], &e1), KVA_OK);
      KT_STATUS(dm_step(c, seqs[i], 1, 1, D, 1, &r), KVA_OK);
      KT_CHECK(kva_seq_fits(c, seqs[i], 1, NULL) == KVA_FITS_NOW, "append_all: sequence %d alone fits says %d", i,
               (int)kva_seq_fits(c, seqs[i], 1, NULL));
    }
    dm_snap_take(&ba, c, seqs[0], 1, 1, D, D), dm_snap_take(&bb, c, seqs[1], 1, 1, D, D);
    kva_cache_get_stats(c, &s0);
    KT_STATUS(kva_seq_append_all(c, seqs, ns, 2), KVA_ERR_FULL);
    kva_cache_get_stats(c, &s1);
    dm_snap_take(&aa, c, seqs[0], 1, 1, D, D), dm_snap_take(&ab, c, seqs[1], 1, 1, D, D);
    KT_CHECK(dm_snap_same(&ba, &aa) && dm_snap_same(&bb, &ab) && kt_stats_equal(&s0, &s1, 1) &&
                 s1.demote_blocks_used == 0,
             "append_all: the refused set changed a sequence or the cache");
    dm_snap_free(&ba), dm_snap_free(&bb), dm_snap_free(&aa), dm_snap_free(&ab);
    KT_STATUS(kva_seq_append_all(c, seqs, ns, 1), KVA_OK);
    KT_CHECK(kva_seq_demoted(c, seqs[0]) == 1, "append_all of one: %d demoted", kva_seq_demoted(c, seqs[0]));
    KT_STATUS(kva_seq_append(c, seqs[1], 1), KVA_ERR_FULL);
    KT_CHECK(kva_seq_fits(c, seqs[1], 1, NULL) == KVA_FITS_LATER, "the second now: fits says %d",
             (int)kva_seq_fits(c, seqs[1], 1, NULL));
    kva_cache_destroy(c);
  }
  /* with two free blocks the set is admitted */
  c = dm_cache(1, 1, D, D, 2, 32, KVA_F16, KVA_F16, KVA_F16, 2, 0, 0);
  if (!c) return;
  {
    kva_evict e1 = dm_policy(KVA_EVICT_WINDOW, 1, 0, 0, 0, KVA_F16, 1, NULL);
    int seqs[2] = {-1, -1}, ns[2] = {1, 1};
    for (i = 0; i < 2; i++) {
      KT_STATUS(kva_seq_new(c, &seqs[i]), KVA_OK);
      KT_STATUS(kva_seq_set_evict(c, seqs[i], &e1), KVA_OK);
      KT_STATUS(dm_step(c, seqs[i], 1, 1, D, 1, &r), KVA_OK);
    }
    KT_STATUS(kva_seq_append_all(c, seqs, ns, 2), KVA_OK);
    kva_cache_get_stats(c, &s1);
    KT_CHECK(kva_seq_demoted(c, seqs[0]) == 1 && kva_seq_demoted(c, seqs[1]) == 1 && s1.demote_blocks_used == 2,
             "append_all of two: demoted %d and %d, %d blocks used", kva_seq_demoted(c, seqs[0]),
             kva_seq_demoted(c, seqs[1]), s1.demote_blocks_used);
    kva_cache_destroy(c);
  }
}

/* ------------------------------------------------------------------------ */
/* Forks                                                                     */

/* the positions of head (l, g)'s region, ascending, into p (returns how many) */
static int dm_region_positions(const kva_cache *c, int seq, int L, int G, int D, int l, int g, int32_t *p) {
  dm_snap s;
  int j, n;
  dm_snap_take(&s, c, seq, L, G, D, D);
  for (j = 0; j < s.nd; j++) p[j] = dm_dp(&s, l, j, g);
  n = s.nd;
  qsort(p, (size_t)n, sizeof(int32_t), dm_cmp_i32);
  dm_snap_free(&s);
  return n;
}

static void dm_fork(void) {
  enum { L = 2, G = 2, D = 8, P = 64 };
  kva_cache *c = dm_cache(L, G, D, D, 2, 64, KVA_F16, KVA_F16, KVA_INT8, 8, 0, 0);
  kva_evict e = dm_policy(KVA_EVICT_WINDOW, 4, 0, 0, 0, KVA_INT8, 6, NULL);
  kva_cache_stats cs, c0;
  kva_seq_stats ss;
  dm_snap sa, sb, sb2;
  kt_rng r;
  int A = -1, B = -1, X = -1, i, l, g, n;
  int32_t p[P];
  kt_begin("demote: a fork copies the region into its own blocks; kva_seq_free returns them");
  if (!c) return;
  kt_seed(&r, 0xF0C4);
  KT_STATUS(kva_seq_new(c, &A), KVA_OK);
  KT_STATUS(kva_seq_set_evict(c, A, &e), KVA_OK);
  for (i = 0; i < 10; i++) KT_STATUS(dm_step(c, A, L, G, D, 1, &r), KVA_OK); /* held 6..9, demoted 0..5 */
  KT_STATUS(kva_seq_fork(c, A, &B), KVA_OK);
  dm_snap_take(&sa, c, A, L, G, D, D);
  dm_snap_take(&sb, c, B, L, G, D, D);
  KT_CHECK(dm_same_tokens(&sa, &sb, P) && sb.nd == 6, "fork: the child's held and demoted tokens are not the "
           "parent's (demoted %d and %d)", sa.nd, sb.nd);
  kva_cache_get_stats(c, &cs);
  KT_STATUS(kva_seq_get_stats(c, B, &ss), KVA_OK);
  KT_CHECK(cs.demote_blocks_used == 6 && ss.demote_blocks == 3 && ss.tokens_demoted == 6 && ss.tokens_evicted == 0,
           "fork: %d demoted blocks used (want 2 x 3), the child's %d, demoted %ld, evicted %ld",
           cs.demote_blocks_used, ss.demote_blocks, ss.tokens_demoted, ss.tokens_evicted);
  KT_CHECK(ss.bytes_own == ss.bytes - ss.bytes_shared && ss.bytes >= cs.demote_block_bytes * 3u &&
               ss.bytes_own >= cs.demote_block_bytes * 3u,
           "fork: the child's bytes %lu own %lu shared %lu do not count its own 3 demoted blocks of %lu",
           (unsigned long)ss.bytes, (unsigned long)ss.bytes_own, (unsigned long)ss.bytes_shared,
           (unsigned long)cs.demote_block_bytes);
  /* the parent goes on: the child's region does not move */
  for (i = 0; i < 3; i++) KT_STATUS(dm_step(c, A, L, G, D, 1, &r), KVA_OK);
  dm_snap_take(&sb2, c, B, L, G, D, D);
  KT_CHECK(dm_snap_same(&sb, &sb2), "fork: the parent's appends changed the child");
  dm_snap_free(&sb2);
  for (l = 0; l < L; l++)
    for (g = 0; g < G; g++) {
      static const int32_t wa[6] = {3, 4, 5, 6, 7, 8}, wb[6] = {2, 3, 4, 5, 6, 7};
      n = dm_region_positions(c, A, L, G, D, l, g, p);
      KT_CHECK(n == 6 && memcmp(p, wa, sizeof wa) == 0, "fork: the parent's region (layer %d head %d) is not 3..8",
               l, g);
      if (l == 0 && g == 0) {
        KT_STATUS(dm_step(c, B, L, G, D, 2, &r), KVA_OK); /* the child goes on by itself */
      }
      n = dm_region_positions(c, B, L, G, D, l, g, p);
      KT_CHECK(n == 6 && memcmp(p, wb, sizeof wb) == 0, "fork: the child's region (layer %d head %d) is not 2..7",
               l, g);
    }
  { /* the rows of the child's surviving demoted tokens are the ones it was forked with */
    dm_snap now;
    int *i0 = KT_ALLOC(int, P), *i1 = KT_ALLOC(int, P), bad = 0, q;
    dm_snap_take(&now, c, B, L, G, D, D);
    for (l = 0; l < L; l++)
      for (g = 0; g < G; g++) {
        dm_index(&sb, 1, l, g, i0, P), dm_index(&now, 1, l, g, i1, P);
        for (q = 2; q < 6; q++)
          bad += i0[q] < 0 || i1[q] < 0 || !kt_same_bits(dm_dk(&sb, l, i0[q], g), dm_dk(&now, l, i1[q], g), D) ||
                 !kt_same_bits(dm_dv(&sb, l, i0[q], g), dm_dv(&now, l, i1[q], g), D);
      }
    KT_CHECK(bad == 0, "fork: %d of the child's demoted rows changed after its own append", bad);
    dm_snap_free(&now);
    free(i0), free(i1);
  }
  /* no room for another copy: 6 of 8 blocks used, a fork needs 3 */
  kva_cache_get_stats(c, &c0);
  KT_STATUS(kva_seq_fork(c, A, &X), KVA_ERR_FULL);
  kva_cache_get_stats(c, &cs);
  KT_CHECK(kt_stats_equal(&c0, &cs, 0) && cs.demote_blocks_used == c0.demote_blocks_used && cs.n_seqs == 2,
           "fork: a refused fork changed the cache (%d seqs, %d demoted blocks used)", cs.n_seqs,
           cs.demote_blocks_used);
  KT_STATUS(kva_seq_free(c, A), KVA_OK);
  kva_cache_get_stats(c, &cs);
  KT_CHECK(cs.demote_blocks_used == 3, "fork: after freeing the parent %d demoted blocks used, want 3",
           cs.demote_blocks_used);
  KT_STATUS(kva_seq_free(c, B), KVA_OK);
  kva_cache_get_stats(c, &cs);
  KT_CHECK(cs.demote_blocks_used == 0 && cs.blocks_used == 0 && cs.bytes_used == 0,
           "fork: after freeing both, %d demoted and %d blocks used, bytes_used %lu", cs.demote_blocks_used,
           cs.blocks_used, (unsigned long)cs.bytes_used);
  dm_snap_free(&sa), dm_snap_free(&sb);
  kva_cache_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* Refusals and read-back arguments                                          */

static void dm_refusals(void) {
  enum { L = 2, G = 2, D = 8 };
  kva_cache *c = dm_cache(L, G, D, D, 2, 32, KVA_F16, KVA_F16, KVA_F16, 8, 0, 0);
  kva_cache *c0 = dm_cache(1, 1, D, D, 2, 32, KVA_F16, KVA_F16, KVA_DTYPE_DEFAULT, 0, 0, 0);
  kva_evict e = dm_policy(KVA_EVICT_WINDOW, 2, 0, 0, 0, KVA_F16, 0, NULL);
  kva_attn a;
  kva_batch *plan = NULL;
  kt_rng r;
  int seq = -1, child = -1, imp = -1, nq = 1, i, s0 = -1;
  size_t size = 0;
  float k[G * D + 1], v[G * D + 1];
  int32_t pos[G + 1];
  void *buf;
  kva_status st;
  kt_begin("demote: batch plans, export, read-back arguments, streams without the demotion fields");
  if (!c || !c0) {
    kva_cache_destroy(c), kva_cache_destroy(c0);
    return;
  }
  kt_seed(&r, 0xBADA);
  kt_attn_init(&a, G, G, D, D);
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  for (i = 0; i < 2; i++) KT_STATUS(dm_step(c, seq, L, G, D, 1, &r), KVA_OK);
  /* a demoting policy but nothing demoted yet: plans and streams work */
  KT_STATUS(kva_batch_plan(c, &a, &seq, &nq, 1, &plan), KVA_OK);
  kva_batch_free(plan), plan = NULL;
  KT_STATUS(kva_seq_export(c, seq, NULL, 0, &size), KVA_OK);
  buf = KT_ALLOC(unsigned char, size + 1);
  KT_STATUS(kva_seq_export(c, seq, buf, size, &size), KVA_OK);
  st = kva_seq_import(c, buf, size, &imp);
  KT_STATUS(st, KVA_OK);
  free(buf);
  /* the stream's policy has no demotion fields: the copy deletes where the source demotes */
  KT_STATUS(dm_step(c, seq, L, G, D, 1, &r), KVA_OK);
  if (st == KVA_OK) {
    kva_seq_stats ss;
    KT_STATUS(dm_step(c, imp, L, G, D, 1, &r), KVA_OK);
    KT_STATUS(kva_seq_get_stats(c, imp, &ss), KVA_OK);
    KT_CHECK(kva_seq_demoted(c, imp) == 0 && ss.tokens_evicted == 1 && kva_seq_len(c, imp) == 2,
             "import: the imported sequence demoted %d (evicted %ld, len %d); a stream records the policy without "
             "demotion", kva_seq_demoted(c, imp), ss.tokens_evicted, kva_seq_len(c, imp));
    KT_STATUS(kva_seq_free(c, imp), KVA_OK);
  }
  KT_CHECK(kva_seq_demoted(c, seq) == 1, "the source demoted %d, want 1", kva_seq_demoted(c, seq));
  /* now it holds a demoted token */
  plan = (kva_batch *)&plan; /* any non-NULL value: the call sets NULL first */
  st = kva_batch_plan(c, &a, &seq, &nq, 1, &plan);
  KT_CHECK(st == KVA_OK, "kva_batch_plan on a WINDOW sequence holding %d demoted token returned %d, want KVA_OK",
           kva_seq_demoted(c, seq), (int)st);
  if (st == KVA_OK && plan) { /* the demoted region is attended as kva_attend_cache does */
    float q[G * D], ob[G * D], oc[G * D], lb[G], lc[G];
    int j, far = 0;
    kt_fill(&r, q, G * D, -1.0f, 1.0f);
    KT_STATUS(kva_attend_batch_lse(c, plan, 0, q, ob, lb), KVA_OK);
    KT_STATUS(kva_attend_cache_lse(c, seq, 0, &a, q, 1, oc, lc), KVA_OK);
    for (j = 0; j < G * D; j++) far += !(fabs((double)ob[j] - (double)oc[j]) <= 1e-5);
    for (j = 0; j < G; j++) far += !(fabs((double)lb[j] - (double)lc[j]) <= 1e-5 * (1.0 + fabs((double)lc[j])));
    KT_CHECK(far == 0, "the batch plan's output differs from kva_attend_cache_lse's in %d values (the demoted "
             "tokens left out?)", far);
    kva_batch_free(plan);
  }
  plan = NULL;
  { /* a sequence holding demoted tokens that selects blocks: refused, kva_attend_cache attends it */
    kva_cache_desc bd;
    kva_cache *cb = NULL;
    int s4 = -1;
    kva_attn as = a;
    float q4[G * D], o4[G * D], o5[G * D];
    kt_desc_init(&bd, L, G, D, 2, 32, 4, KVA_F16);
    bd.block_bounds = 1, bd.demote_dtype = KVA_F16, bd.demote_blocks = 8;
    KT_STATUS(kva_cache_create(&bd, &cb), KVA_OK);
    if (cb) {
      kva_evict w6 = dm_policy(KVA_EVICT_WINDOW, 6, 0, 0, 0, KVA_F16, 0, NULL);
      KT_STATUS(kva_seq_new(cb, &s4), KVA_OK);
      KT_STATUS(kva_seq_set_evict(cb, s4, &w6), KVA_OK);
      for (i = 0; i < 8; i++) KT_STATUS(dm_step(cb, s4, L, G, D, 1, &r), KVA_OK);
      KT_CHECK(kva_seq_demoted(cb, s4) == 2, "select: %d demoted, want 2", kva_seq_demoted(cb, s4));
      as.select_budget = 2;
      KT_STATUS(kva_batch_plan(cb, &as, &s4, &nq, 1, &plan), KVA_ERR_UNSUPPORTED);
      KT_CHECK(plan == NULL, "kva_batch_plan refused but left *plan non-NULL");
      kt_fill(&r, q4, G * D, -1.0f, 1.0f);
      KT_STATUS(kva_attend_cache(cb, s4, 0, &as, q4, 1, o4), KVA_OK);
      as.select_budget = 6; /* at or above the held tokens: everything, the same bits as without selection */
      KT_STATUS(kva_attend_cache(cb, s4, 0, &as, q4, 1, o4), KVA_OK);
      KT_STATUS(kva_attend_cache(cb, s4, 0, &a, q4, 1, o5), KVA_OK);
      KT_CHECK(kt_same_bits(o4, o5, G * D), "select_budget 6 >= 6 held: not the unselected result bit for bit");
      kva_batch_free(plan), plan = NULL;
      kva_cache_destroy(cb);
    }
  }
  { /* SCORE with accumulate = 1: refused */
    int s5 = -1;
    kva_evict ac = dm_policy(KVA_EVICT_SCORE, 2, 0, 0, 0, KVA_F16, 0, NULL);
    ac.accumulate = 1;
    KT_STATUS(kva_seq_new(c, &s5), KVA_OK);
    KT_STATUS(kva_seq_set_evict(c, s5, &ac), KVA_OK);
    for (i = 0; i < 3; i++) KT_STATUS(dm_step(c, s5, L, G, D, 1, &r), KVA_OK);
    KT_CHECK(kva_seq_demoted(c, s5) == 1, "accumulate: %d demoted, want 1", kva_seq_demoted(c, s5));
    KT_STATUS(kva_batch_plan(c, &a, &s5, &nq, 1, &plan), KVA_ERR_UNSUPPORTED);
    KT_CHECK(plan == NULL, "kva_batch_plan refused but left *plan non-NULL");
    kva_batch_free(plan), plan = NULL;
    KT_STATUS(kva_seq_free(c, s5), KVA_OK);
  }
  { /* H2O: the same refusal */
    int s3 = -1;
    kva_evict h = dm_policy(KVA_EVICT_H2O, 2, 0, 0, 0, KVA_F16, 0, NULL);
    KT_STATUS(kva_seq_new(c, &s3), KVA_OK);
    KT_STATUS(kva_seq_set_evict(c, s3, &h), KVA_OK);
    for (i = 0; i < 3; i++) KT_STATUS(dm_step(c, s3, L, G, D, 1, &r), KVA_OK);
    KT_CHECK(kva_seq_demoted(c, s3) == 1, "H2O: %d demoted, want 1", kva_seq_demoted(c, s3));
    KT_STATUS(kva_batch_plan(c, &a, &s3, &nq, 1, &plan), KVA_ERR_UNSUPPORTED);
    KT_CHECK(plan == NULL, "kva_batch_plan refused but left *plan non-NULL");
    kva_batch_free(plan), plan = NULL;
    KT_STATUS(kva_seq_free(c, s3), KVA_OK);
  }
  size = 12345;
  KT_STATUS(kva_seq_export(c, seq, NULL, 0, &size), KVA_ERR_UNSUPPORTED);
  /* kva_seq_read_demoted: arguments */
  for (i = 0; i < 6; i++) {
    int layer = 0, slot = 0;
    kva_status want = KVA_ERR_ARG;
    switch (i) {
    case 0: layer = -1; break;
    case 1: layer = L; break;
    case 2: slot = -1; break;
    case 3: slot = 1; break; /* = kva_seq_demoted */
    case 4: slot = 1000; break;
    default: layer = 1; want = KVA_OK; break;
    }
    kt_fill_sentinel(k, G * D + 1), kt_fill_sentinel(v, G * D + 1);
    memset(pos, 0x5a, sizeof pos);
    st = kva_seq_read_demoted(c, seq, layer, slot, k, v, pos);
    KT_CHECK(st == want, "kva_seq_read_demoted(layer %d, slot %d) returned %d, want %d", layer, slot, (int)st,
             (int)want);
    if (want != KVA_OK)
      KT_CHECK(kt_all_sentinel(k, G * D + 1) && kt_all_sentinel(v, G * D + 1) && pos[0] == 0x5a5a5a5a,
               "kva_seq_read_demoted(layer %d, slot %d) wrote its outputs on a refusal", layer, slot);
    else
      KT_CHECK(pos[0] == 0 && pos[1] == 0 && kt_all_sentinel(k + G * D, 1) && kt_all_sentinel(v + G * D, 1) &&
                   pos[G] == 0x5a5a5a5a,
               "kva_seq_read_demoted(layer 1, slot 0): positions %d %d, want 0 0, nothing past the arrays", pos[0],
               pos[1]);
  }
  KT_STATUS(kva_seq_read_demoted(c, seq, 0, 0, NULL, NULL, NULL), KVA_OK);
  KT_STATUS(kva_seq_read_demoted(c, seq, 0, 0, k, NULL, NULL), KVA_OK);
  KT_STATUS(kva_seq_read_demoted(c, seq, 0, 0, NULL, v, pos), KVA_OK);
  KT_STATUS(kva_seq_fork(c, seq, &child), KVA_OK);
  KT_STATUS(kva_seq_free(c, child), KVA_OK);
  KT_STATUS(kva_seq_read_demoted(c, child, 0, 0, k, v, pos), KVA_ERR_SEQ);
  KT_STATUS(kva_seq_read_demoted(c, 987654, 0, 0, k, v, pos), KVA_ERR_SEQ);
  KT_CHECK(kva_seq_demoted(c, child) == -1 && kva_seq_demoted(c, -1) == -1 && kva_seq_demoted(c, 987654) == -1,
           "kva_seq_demoted of unknown sequences: %d %d %d, want -1", kva_seq_demoted(c, child),
           kva_seq_demoted(c, -1), kva_seq_demoted(c, 987654));
  /* a cache without a pool: nothing demoted, nothing to read */
  KT_STATUS(kva_seq_new(c0, &s0), KVA_OK);
  KT_STATUS(dm_step(c0, s0, 1, 1, D, 1, &r), KVA_OK);
  KT_CHECK(kva_seq_demoted(c0, s0) == 0, "no pool: kva_seq_demoted %d", kva_seq_demoted(c0, s0));
  KT_STATUS(kva_seq_read_demoted(c0, s0, 0, 0, k, v, pos), KVA_ERR_ARG);
  /* freeing the sequence returns its demoted blocks */
  {
    kva_cache_stats cs;
    KT_STATUS(kva_seq_free(c, seq), KVA_OK);
    kva_cache_get_stats(c, &cs);
    KT_CHECK(cs.demote_blocks_used == 0 && cs.blocks_used == 0, "after kva_seq_free: %d demoted blocks used",
             cs.demote_blocks_used);
  }
  kva_cache_destroy(c), kva_cache_destroy(c0);
}

/* ------------------------------------------------------------------------ */
/* Batches of several sequences, some holding demoted tokens                 */

/* append n and store random rows in every layer (no attention) */
static kva_status dm_append_store(kva_cache *c, int seq, int L, int G, int D, int n, kt_rng *r) {
  float *k = KT_ALLOC(float, (size_t)n * G * D + 1), *v = KT_ALLOC(float, (size_t)n * G * D + 1);
  int l;
  kva_status st = kva_seq_append(c, seq, n);
  for (l = 0; l < L && st == KVA_OK; l++) {
    kt_fill(r, k, (size_t)n * G * D, -1.0f, 1.0f);
    kt_fill(r, v, (size_t)n * G * D, -1.0f, 1.0f);
    st = kva_store(c, seq, l, k, v, n);
  }
  free(k), free(v);
  return st;
}

static void dm_batch(void) {
  enum { L = 2, G = 2, D = 16, NS = 3 };
  kva_cache *c = dm_cache(L, G, D, D, 4, 96, KVA_F16, KVA_F16, KVA_INT8, 24, 0, 0);
  kva_evict pol[NS];
  int seqs[NS], nq[NS], step, i, l, bad = 0, rows_total;
  long calls = 0;
  kt_rng r;
  kt_begin("demote: a batch of sequences with and without demoted regions against kva_attend_cache_lse");
  if (!c) return;
  kt_seed(&r, 0xBA7C);
  pol[0] = dm_policy(KVA_EVICT_WINDOW, 5, 1, 0, 0, KVA_INT8, 4, NULL);         /* a small ring */
  pol[1] = dm_policy(KVA_EVICT_WINDOW, 5, 0, 0, 0, KVA_DTYPE_DEFAULT, 0, NULL); /* deletes */
  pol[2] = dm_policy(KVA_EVICT_SCORE, 6, 0, 1, 0, KVA_INT8, 0, &calls);        /* the default ring */
  for (i = 0; i < NS; i++) {
    KT_STATUS(kva_seq_new(c, &seqs[i]), KVA_OK);
    KT_STATUS(kva_seq_set_evict(c, seqs[i], &pol[i]), KVA_OK);
  }
  for (step = 0; step < 12; step++) {
    kva_attn a;
    int grp = kt_int(&r, 1, 2), H = G * grp;
    float sinks[2 * G], *q, *ob, *lb;
    kva_batch *plan = NULL;
    kva_status st;
    rows_total = 0;
    for (i = 0; i < NS; i++) {
      int n = kt_int(&r, 1, 3);
      KT_STATUS(dm_append_store(c, seqs[i], L, G, D, n, &r), KVA_OK);
      nq[i] = kt_int(&r, 1, n);
      rows_total += nq[i];
    }
    kt_attn_init(&a, H, G, D, D);
    if (kt_int(&r, 0, 1)) {
      kt_fill(&r, sinks, (size_t)H, -1.0f, 1.0f);
      a.sink_logits = sinks;
    }
    if (kt_int(&r, 0, 1)) a.window = kt_int(&r, 2, 12);
    q = KT_ALLOC(float, (size_t)rows_total * H * D), ob = KT_ALLOC(float, (size_t)rows_total * H * D + 1);
    lb = KT_ALLOC(float, (size_t)rows_total * H + 1);
    st = kva_batch_plan(c, &a, seqs, nq, NS, &plan);
    KT_CHECK(st == KVA_OK, "batch step %d: kva_batch_plan returned %d (demoted %d %d %d)", step, (int)st,
             kva_seq_demoted(c, seqs[0]), kva_seq_demoted(c, seqs[1]), kva_seq_demoted(c, seqs[2]));
    for (l = 0; l < L && st == KVA_OK; l++) {
      int row = 0;
      kt_fill(&r, q, (size_t)rows_total * H * D, -1.5f, 1.5f);
      kt_fill_sentinel(ob, (size_t)rows_total * H * D + 1), kt_fill_sentinel(lb, (size_t)rows_total * H + 1);
      KT_STATUS(kva_attend_batch_lse(c, plan, l, q, ob, lb), KVA_OK);
      for (i = 0; i < NS; i++) {
        size_t no = (size_t)nq[i] * H * D, nl = (size_t)nq[i] * H, j;
        float *oc = KT_ALLOC(float, no), *lc = KT_ALLOC(float, nl);
        double vmax = 1.0, tol;
        KT_STATUS(kva_attend_cache_lse(c, seqs[i], l, &a, q + (size_t)row * H * D, nq[i], oc, lc), KVA_OK);
        tol = (2e-5 > 4e-6 * (1.0 + sqrt((double)D)) ? 2e-5 : 4e-6 * (1.0 + sqrt((double)D))) * (1.0 + vmax);
        for (j = 0; j < no; j++) bad += !(fabs((double)ob[(size_t)row * H * D + j] - (double)oc[j]) <= tol);
        for (j = 0; j < nl; j++)
          bad += !(fabs((double)lb[(size_t)row * H + j] - (double)lc[j]) <= 1e-5 * (1.0 + fabs((double)lc[j])));
        row += nq[i];
        free(oc), free(lc);
      }
      bad += !kt_all_sentinel(ob + (size_t)rows_total * H * D, 1) || !kt_all_sentinel(lb + (size_t)rows_total * H, 1);
    }
    kva_batch_free(plan);
    free(q), free(ob), free(lb);
  }
  KT_CHECK(bad == 0, "batch: %d values of kva_attend_batch_lse differ from kva_attend_cache_lse per sequence", bad);
  KT_CHECK(kva_seq_demoted(c, seqs[0]) == 4 && kva_seq_demoted(c, seqs[1]) == 0 && kva_seq_demoted(c, seqs[2]) > 4,
           "batch: demoted %d %d %d, want 4, 0 and more than 4", kva_seq_demoted(c, seqs[0]),
           kva_seq_demoted(c, seqs[1]), kva_seq_demoted(c, seqs[2]));
  kva_cache_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* kva_seq_compress demotes as an append does                                */

static void dm_compress(void) {
  static const int kinds[3] = {KVA_EVICT_WINDOW, KVA_EVICT_H2O, KVA_EVICT_SCORE};
  enum { L = 2, G = 2, D = 8, Dv = 6, bs = 3, P = 64 };
  static const kva_dtype dts[3] = {KVA_INT4, KVA_BF16, KVA_INT8};
  int k;
  kt_begin("demote: kva_seq_compress demotes as an append does");
  for (k = 0; k < 3; k++) {
    kt_rng r;
    long calls = 0;
    kva_evict e = dm_policy(kinds[k], 20, 1, kinds[k] == KVA_EVICT_WINDOW ? 0 : 2, 0, dts[k], 5, &calls);
    kva_cache *c = dm_cache(L, G, D, Dv, bs, 32, KVA_F16, KVA_F32, dts[k], 4, 0, 0);
    dm_run x;
    dm_attn_opt ao;
    int i;
    if (!c) continue;
    kt_seed(&r, 0xC0 + (uint64_t)k);
    dm_run_init(&x, c, NULL, L, G, D, Dv, bs, P, KVA_F16, KVA_F32, dts[k], 0, &e, 5,
                k == 0 ? "compress WINDOW" : k == 1 ? "compress H2O" : "compress SCORE");
    memset(&ao, 0, sizeof ao);
    dm_op(&x, 0, 12);
    dm_store(&x, 12, &r);
    dm_attend_check(&x, 12, &r, &ao);
    dm_op(&x, 1, 4); /* 8 evicted, 3 of them deleted by the ring of 5 */
    KT_CHECK(kva_seq_len(c, x.seq) == 4 && kva_seq_demoted(c, x.seq) == 5, "%s: compress(4) of 12: len %d, %d "
             "demoted; want 4 and 5", x.what, kva_seq_len(c, x.seq), kva_seq_demoted(c, x.seq));
    for (i = 0; i < 3; i++) {
      dm_op(&x, 0, 1);
      dm_store(&x, 1, &r);
      dm_attend_check(&x, 1, &r, &ao);
    }
    dm_op(&x, 1, 3);
    dm_run_free(&x);
    kva_cache_destroy(c);
  }
}

/* ------------------------------------------------------------------------ */
/* Working memory of a call on a sequence holding demoted tokens             */


static void dm_nomem(void) {
  enum { L = 1, G = 2, D = 64, grp = 4, P = 128 };
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_evict e = dm_policy(KVA_EVICT_WINDOW, 20, 0, 0, 0, KVA_F16, 0, NULL);
  kt_heap h;
  dm_run x;
  dm_attn_opt ao;
  kt_rng r;
  kva_attn a;
  float *q, *out;
  long takes;
  kt_begin("demote: a large call's working memory comes from alloc_fn (KVA_ERR_NOMEM writes nothing)");
  memset(&h, 0, sizeof h);
  kt_desc_init(&d, L, G, D, 4, 32, 4, KVA_F16);
  d.demote_dtype = KVA_F16, d.demote_blocks = 8;
  d.alloc_fn = kt_heap_alloc, d.free_fn = kt_heap_free, d.user = &h;
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  if (!c) return;
  kt_seed(&r, 0x703E);
  dm_run_init(&x, c, NULL, L, G, D, D, 4, P, KVA_F16, KVA_F16, KVA_F16, 0, &e, 32, "nomem");
  memset(&ao, 0, sizeof ao);
  ao.grp = grp, ao.plain = 1, ao.no_batch = 1; /* a plan takes its block from alloc_fn */
  dm_op(&x, 0, 16);
  dm_store(&x, 16, &r);
  dm_op(&x, 0, 16); /* 12 demoted */
  dm_store(&x, 16, &r);
  KT_CHECK(kva_seq_demoted(c, x.seq) == 12, "nomem: %d demoted, want 12", kva_seq_demoted(c, x.seq));
  /* 16 queries x 8 heads x (64 + 2) floats > 4,608: from alloc_fn */
  kt_attn_init(&a, G * grp, G, D, D);
  q = KT_ALLOC(float, 16 * G * grp * D), out = KT_ALLOC(float, 16 * G * grp * D + 1);
  kt_fill(&r, q, (size_t)16 * G * grp * D, -1.0f, 1.0f);
  kt_fill_sentinel(out, (size_t)16 * G * grp * D + 1);
  h.fail = 1;
  KT_STATUS(kva_attend_cache(c, x.seq, 0, &a, q, 16, out), KVA_ERR_NOMEM);
  h.fail = 0;
  KT_CHECK(h.refused > 0 && kt_all_sentinel(out, (size_t)16 * G * grp * D + 1),
           "nomem: alloc_fn asked %ld times; the output %s", h.refused,
           kt_all_sentinel(out, (size_t)16 * G * grp * D + 1) ? "untouched" : "written");
  takes = h.takes;
  ao.n_q = 16;
  dm_attend_check(&x, 16, &r, &ao); /* with memory: right, and given back */
  KT_CHECK(h.takes > takes && h.gives == h.takes - 1, "nomem: %ld blocks taken by 16 queries, %ld given back (the "
           "cache's own stays)", h.takes - takes, h.gives);
  /* one query: 8 x 66 floats, on the stack */
  dm_op(&x, 0, 1);
  dm_store(&x, 1, &r);
  takes = h.takes;
  h.fail = 1;
  ao.n_q = 1;
  dm_attend_check(&x, 1, &r, &ao);
  h.fail = 0;
  KT_CHECK(h.takes == takes && h.refused == 1, "nomem: a decode step asked alloc_fn (%ld refused)", h.refused);
  free(q), free(out);
  dm_run_free(&x);
  kva_cache_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* Integer values (and scores) over a demoted region; split-K with one        */

/* docs/API.md, "Integer values": each key's weight moves by at most W / 510 of its tile's largest weight W, so
   an output channel moves by at most sum_tiles (W_T / 510) sum_{j in T} |code_jc| / sum p_j.  The demoted
   region's slots are in no documented order, so its tiles are not known: W over every visible key of a region
   bounds each of its tiles' W (a tile never mixes the held and the demoted rows: they are separate passes
   merged by log-sum-exp), and the bound is taken per region.  The codes and scales come from the rows read
   back: an INT8 row's scale is its largest |value| / 127 (that value is code +-127) and |code| = |value| /
   scale; an INT4 group's codes are at most 15, and its scale at most range / 14 of the group read back (the
   group's largest value is code 15 and its smallest code 0 or 1: docs/API.md's rule with groups of random
   values spread over [-1, 1], so range / 14 has room; groups here are 32 wide).  The float path is fp64 over
   the read-back rows with the integer scores' query (dm_int_query) where int_scores applies. */
typedef struct {
  kva_dtype kt, vt, dt;
  int G, grp, D, Dv, bs;
  int budget, ring; /* WINDOW's budget, demote_budget */
  int more, n_q;    /* appended after the first budget tokens (in steps), the last step's size */
  int int_scores, int_values, sinks;
  int split; /* 1: the held keys are >= 2,048 and the (KV head, 64-row) items fewer than 8: split-K */
} dm_iv_case;

static long dm_iv_rows, dm_iv_bounded;
static double dm_iv_worst, dm_iv_worst_bnd_share;

/* the bound's sum for one region (keys j0..j1 of the row), added to bnd[Dv] (before / l) */
static void dm_iv_region_bound(kva_dtype vt, const double *p, const char *vis, const float *const *vr, int j0,
                               int j1, int Dv, double *bnd) {
  int j, c, g0;
  if (vt == KVA_INT8) {
    double W = 0.0;
    for (j = j0; j < j1; j++) {
      double am = 0.0;
      if (!vis[j]) continue;
      for (c = 0; c < Dv; c++) am = fabs((double)vr[j][c]) > am ? fabs((double)vr[j][c]) : am;
      if (p[j] * am / 127.0 > W) W = p[j] * am / 127.0;
    }
    for (j = j0; j < j1; j++) {
      double am = 0.0;
      if (!vis[j]) continue;
      for (c = 0; c < Dv; c++) am = fabs((double)vr[j][c]) > am ? fabs((double)vr[j][c]) : am;
      if (am > 0.0)
        for (c = 0; c < Dv; c++) bnd[c] += W / 510.0 * fabs((double)vr[j][c]) / (am / 127.0);
    }
  } else if (vt == KVA_INT4) {
    for (g0 = 0; g0 < Dv; g0 += 32) {
      int g1 = g0 + 32 < Dv ? g0 + 32 : Dv, nv = 0;
      double W = 0.0;
      for (j = j0; j < j1; j++) {
        double mn = INFINITY, mx = -INFINITY;
        if (!vis[j]) continue;
        for (c = g0; c < g1; c++) {
          if ((double)vr[j][c] < mn) mn = (double)vr[j][c];
          if ((double)vr[j][c] > mx) mx = (double)vr[j][c];
        }
        if (p[j] * (mx - mn) / 14.0 > W) W = p[j] * (mx - mn) / 14.0;
        nv++;
      }
      for (c = g0; c < g1; c++) bnd[c] += W / 510.0 * 15.0 * (double)nv;
    }
  }
}

static void dm_iv_case_run(kt_rng *r, const dm_iv_case *k, int it) {
  int G = k->G, H = G * k->grp, D = k->D, Dv = k->Dv, seq = -1, done, len, nd, pos, nk, t, h, j, c, g;
  int bad = 0, bad_b = 0, fb_t = -1, fb_h = -1, n_q = k->n_q, thr_same, i;
  int n_blocks = dm_cdiv(k->budget + k->n_q, k->bs) + 4, dblocks = dm_cdiv(k->ring, k->bs) + 1;
  kva_cache *c_ = dm_cache(1, G, D, Dv, k->bs, n_blocks, k->kt, k->vt, k->dt, dblocks, 0, 0);
  kva_evict pol = dm_policy(KVA_EVICT_WINDOW, k->budget, 0, 0, 0, k->dt, k->ring, NULL);
  kva_attn a, a2;
  kva_batch *plan = NULL;
  kva_status st;
  float *hk, *hv, *dk, *dv, *q, *o1, *o1b, *o2, *ob, *l1, *l2, *lb, sinks[16];
  int32_t *hp, *dp, *kp;
  const float **kr, **vr;
  char *vis;
  double *qd, *qi, *s, *o, *bnd, worst = 0.0, worst_b = 0.0;
  char shape[240];
  if (!c_) return;
  KT_STATUS(kva_seq_new(c_, &seq), KVA_OK);
  KT_STATUS(kva_seq_set_evict(c_, seq, &pol), KVA_OK);
  /* the first budget tokens, then `more` in steps, the last of n_q */
  {
    float *kk = KT_ALLOC(float, (size_t)(k->budget + k->more) * G * D + 1);
    float *vv = KT_ALLOC(float, (size_t)(k->budget + k->more) * G * Dv + 1);
    int n;
    for (done = 0; done < k->budget + k->more; done += n) {
      int left = k->budget + k->more - done;
      n = done == 0 ? k->budget : left == n_q ? n_q : kt_int(r, 1, left - n_q < 40 ? left - n_q : 40);
      if (done > 0 && left > n_q && n > left - n_q) n = left - n_q;
      kt_fill(r, kk, (size_t)n * G * D, -1.0f, 1.0f);
      kt_fill(r, vv, (size_t)n * G * Dv, -1.0f, 1.0f);
      st = kva_seq_append(c_, seq, n);
      if (st == KVA_OK) st = kva_store(c_, seq, 0, kk, vv, n);
      KT_CHECK(st == KVA_OK, "ivalues-demote case %d: append / store of %d at %d: %d (%s)", it, n, done, (int)st,
               kva_status_str(st));
      if (st != KVA_OK) break;
    }
    free(kk), free(vv);
    if (st != KVA_OK) {
      kva_cache_destroy(c_);
      return;
    }
  }
  len = kva_seq_len(c_, seq), nd = kva_seq_demoted(c_, seq), pos = kva_seq_pos(c_, seq);
  KT_CHECK(len == k->budget && nd == (k->more < k->ring ? k->more : k->ring) && pos == k->budget + k->more,
           "ivalues-demote case %d: held %d demoted %d pos %d, want %d, %d and %d", it, len, nd, pos, k->budget,
           k->more < k->ring ? k->more : k->ring, k->budget + k->more);
  nk = len + nd;
  hk = KT_ALLOC(float, (size_t)len * G * D), hv = KT_ALLOC(float, (size_t)len * G * Dv);
  hp = KT_ALLOC(int32_t, (size_t)len * G);
  dk = KT_ALLOC(float, (size_t)nd * G * D + 1), dv = KT_ALLOC(float, (size_t)nd * G * Dv + 1);
  dp = KT_ALLOC(int32_t, (size_t)nd * G + 1);
  for (j = 0; j < len; j++)
    KT_STATUS(kva_seq_read(c_, seq, 0, j, hk + (size_t)j * G * D, hv + (size_t)j * G * Dv, hp + (size_t)j * G),
              KVA_OK);
  for (j = 0; j < nd; j++)
    KT_STATUS(kva_seq_read_demoted(c_, seq, 0, j, dk + (size_t)j * G * D, dv + (size_t)j * G * Dv,
                                   dp + (size_t)j * G), KVA_OK);
  kt_attn_init(&a, H, G, D, Dv);
  a.int_scores = k->int_scores, a.int_values = k->int_values;
  if (k->sinks) {
    kt_fill(r, sinks, (size_t)H, -1.0f, 2.0f);
    a.sink_logits = sinks;
  }
  a2 = a, a2.n_threads = 2;
  q = KT_ALLOC(float, (size_t)n_q * H * D);
  o1 = KT_ALLOC(float, (size_t)n_q * H * Dv + 1), o1b = KT_ALLOC(float, (size_t)n_q * H * Dv + 1);
  o2 = KT_ALLOC(float, (size_t)n_q * H * Dv + 1), ob = KT_ALLOC(float, (size_t)n_q * H * Dv + 1);
  l1 = KT_ALLOC(float, (size_t)n_q * H + 1), l2 = KT_ALLOC(float, (size_t)n_q * H + 1);
  lb = KT_ALLOC(float, (size_t)n_q * H + 1);
  kt_fill(r, q, (size_t)n_q * H * D, -3.0f, 3.0f); /* sharp enough for a spread of codes */
  kt_fill_sentinel(o1, (size_t)n_q * H * Dv + 1), kt_fill_sentinel(o1b, (size_t)n_q * H * Dv + 1);
  kt_fill_sentinel(o2, (size_t)n_q * H * Dv + 1), kt_fill_sentinel(ob, (size_t)n_q * H * Dv + 1);
  kt_fill_sentinel(l1, (size_t)n_q * H + 1), kt_fill_sentinel(l2, (size_t)n_q * H + 1);
  kt_fill_sentinel(lb, (size_t)n_q * H + 1);
  snprintf(shape, sizeof shape, "K %s V %s demoted %s, H %d G %d D %d Dv %d bs %d, held %d demoted %d, n_q %d, "
           "int scores %d values %d, sinks %d%s", kva_dtype_name(k->kt), kva_dtype_name(k->vt),
           kva_dtype_name(k->dt), H, G, D, Dv, k->bs, len, nd, n_q, k->int_scores, k->int_values, k->sinks,
           k->split ? ", split-K" : "");
  KT_STATUS(kva_attend_cache_lse(c_, seq, 0, &a, q, n_q, o1, l1), KVA_OK);
  KT_STATUS(kva_attend_cache(c_, seq, 0, &a, q, n_q, o1b), KVA_OK);
  KT_STATUS(kva_attend_cache_lse(c_, seq, 0, &a2, q, n_q, o2, l2), KVA_OK);
  KT_CHECK(kt_same_bits(o1, o1b, (size_t)n_q * H * Dv + 1),
           "ivalues-demote case %d (%s): kva_attend_cache is not kva_attend_cache_lse's output bit for bit", it,
           shape);
  /* docs/API.md, "Conventions" and "Order of the sums": bit-identical for any thread count */
  thr_same = kt_same_bits(o1, o2, (size_t)n_q * H * Dv + 1) && kt_same_bits(l1, l2, (size_t)n_q * H + 1);
  KT_CHECK(thr_same, "ivalues-demote case %d (%s): n_threads 1 and 2 differ", it, shape);
  st = kva_batch_plan(c_, &a2, &seq, &n_q, 1, &plan);
  KT_CHECK(st == KVA_OK, "ivalues-demote case %d (%s): kva_batch_plan: %d (%s)", it, shape, (int)st,
           kva_status_str(st));
  if (st == KVA_OK) KT_STATUS(kva_attend_batch_lse(c_, plan, 0, q, ob, lb), KVA_OK);
  kva_batch_free(plan);
  /* the reference */
  kp = KT_ALLOC(int32_t, nk + 1), kr = KT_ALLOC(const float *, nk + 1), vr = KT_ALLOC(const float *, nk + 1);
  vis = KT_ALLOC(char, nk + 1), s = KT_ALLOC(double, nk + 1);
  qd = KT_ALLOC(double, D), qi = KT_ALLOC(double, D), o = KT_ALLOC(double, Dv), bnd = KT_ALLOC(double, Dv);
  for (t = 0; t < n_q; t++) {
    int32_t qp = pos - n_q + t;
    for (h = 0; h < H; h++) {
      double scale = 1.0 / sqrt((double)D), m = -INFINITY, l = 0.0, lse, vmax = 0.0, tol, w = 0.0, wb = 0.0;
      g = h / k->grp;
      for (j = 0; j < len; j++)
        kp[j] = hp[(size_t)j * G + g], kr[j] = hk + ((size_t)j * G + g) * D, vr[j] = hv + ((size_t)j * G + g) * Dv;
      for (j = 0; j < nd; j++)
        kp[len + j] = dp[(size_t)j * G + g], kr[len + j] = dk + ((size_t)j * G + g) * D,
        vr[len + j] = dv + ((size_t)j * G + g) * Dv;
      for (c = 0; c < D; c++) qd[c] = (double)q[((size_t)t * H + h) * D + c];
      dm_int_query(qd, D, qi);
      for (j = 0; j < nk; j++) {
        const double *qq = k->int_scores && dm_int_type(j < len ? k->kt : k->dt) ? qi : qd;
        double dot = 0.0;
        vis[j] = (char)(kp[j] <= qp);
        if (!vis[j]) continue;
        for (c = 0; c < D; c++) dot += qq[c] * (double)kr[j][c];
        s[j] = dot * scale;
        if (s[j] > m) m = s[j];
        for (c = 0; c < Dv; c++) vmax = fabs((double)vr[j][c]) > vmax ? fabs((double)vr[j][c]) : vmax;
      }
      if (k->sinks && (double)sinks[h] > m) m = (double)sinks[h];
      if (k->sinks) l += exp((double)sinks[h] - m);
      for (j = 0; j < nk; j++) s[j] = vis[j] ? exp(s[j] - m) : 0.0, l += s[j];
      for (c = 0; c < Dv; c++) o[c] = bnd[c] = 0.0;
      for (j = 0; j < nk; j++)
        if (vis[j])
          for (c = 0; c < Dv; c++) o[c] += s[j] * (double)vr[j][c];
      if (k->int_values) {
        dm_iv_region_bound(k->vt, s, vis, vr, 0, len, Dv, bnd);
        dm_iv_region_bound(k->dt, s, vis, vr, len, nk, Dv, bnd);
      }
      lse = m + log(l);
      tol = (2e-5 > 4e-6 * (1.0 + sqrt((double)D)) ? 2e-5 : 4e-6 * (1.0 + sqrt((double)D))) * (1.0 + vmax);
      for (c = 0; c < Dv; c++) {
        double want = o[c] / l, tc = bnd[c] / l * (1.0 + 1e-3) + tol;
        double e = fabs((double)o1[((size_t)t * H + h) * Dv + c] - want);
        double eb = fabs((double)ob[((size_t)t * H + h) * Dv + c] - want);
        if (!(e <= 1e300)) e = INFINITY;
        if (!(eb <= 1e300)) eb = INFINITY;
        if (e / tc > w) w = e / tc;
        if (eb / tc > wb) wb = eb / tc;
        if (bnd[c] > 0.0 && tc > 0.0 && bnd[c] / l / tc > dm_iv_worst_bnd_share) dm_iv_worst_bnd_share = bnd[c] / l / tc;
        dm_iv_bounded += bnd[c] > 0.0;
      }
      {
        double tl = 1e-5 * (1.0 + fabs(lse)), e = fabs((double)l1[(size_t)t * H + h] - lse);
        double eb = fabs((double)lb[(size_t)t * H + h] - lse);
        if (!(e <= 1e300)) e = INFINITY;
        if (!(eb <= 1e300)) eb = INFINITY;
        if (e / tl > w) w = e / tl;
        if (eb / tl > wb) wb = eb / tl;
      }
      if (!(w <= 1.0)) {
        if (!bad) fb_t = t, fb_h = h;
        bad++;
      }
      bad_b += !(wb <= 1.0);
      if (w > worst) worst = w;
      if (wb > worst_b) worst_b = wb;
      dm_iv_rows++;
    }
  }
  bad += !kt_all_sentinel(o1 + (size_t)n_q * H * Dv, 1) || !kt_all_sentinel(l1 + (size_t)n_q * H, 1);
  bad_b += !kt_all_sentinel(ob + (size_t)n_q * H * Dv, 1) || !kt_all_sentinel(lb + (size_t)n_q * H, 1);
  for (i = 0; i < 2; i++) {
    double wv = i ? worst_b : worst;
    if (wv <= 1.0 && wv > dm_iv_worst) dm_iv_worst = wv;
  }
  KT_CHECK(bad == 0, "ivalues-demote case %d (%s): kva_attend_cache_lse: %d (token, head) rows beyond fp64 over the "
           "held and demoted rows read back (+ the integer values' bound) (first: token %d head %d; worst err/tol "
           "%.3g)", it, shape, bad, fb_t, fb_h, worst);
  KT_CHECK(bad_b == 0, "ivalues-demote case %d (%s): kva_attend_batch_lse: %d (token, head) rows beyond fp64 over "
           "the held and demoted rows read back (+ the integer values' bound) (worst err/tol %.3g)", it, shape, bad_b,
           worst_b);
  free(hk), free(hv), free(hp), free(dk), free(dv), free(dp), free(q), free(o1), free(o1b), free(o2), free(ob);
  free(l1), free(l2), free(lb), free(kp), free((void *)kr), free((void *)vr), free(vis), free(s), free(qd), free(qi);
  free(o), free(bnd);
  kva_cache_destroy(c_);
}

/* int_values (with and without int_scores) over INT8 / INT4 held rows and INT8 / INT4 / F16 demoted rows */
static void dm_ivalues(void) {
  static const kva_dtype it8[2] = {KVA_INT8, KVA_INT4};
  static const kva_dtype dts[3] = {KVA_INT8, KVA_INT4, KVA_F16};
  static const int dvs[3] = {32, 64, 48};
  int it, iters = kt_iters(12);
  kt_rng r;
  kt_begin("demote: integer values and scores over held and demoted INT8 / INT4 rows (fp64 and the documented "
           "bound), kva_attend_cache and kva_attend_batch");
  kt_seed(&r, 0x1A7E);
  for (it = 0; it < iters; it++) {
    dm_iv_case k;
    memset(&k, 0, sizeof k);
    k.kt = it8[it % 2], k.vt = it8[(it / 2) % 2], k.dt = dts[it % 3];
    if (it == iters - 1) k.vt = KVA_F16, k.dt = KVA_INT8; /* float held values, integer demoted values */
    k.G = kt_int(&r, 1, 2), k.grp = kt_int(&r, 1, 3), k.D = it % 2 ? 64 : 32, k.Dv = dvs[it % 3];
    k.bs = kt_int(&r, 1, 16), k.budget = kt_int(&r, 60, 200), k.ring = kt_int(&r, 10, 100);
    k.n_q = kt_int(&r, 1, 4), k.more = kt_int(&r, k.n_q + 5, 150);
    k.int_scores = it % 4 != 3, k.int_values = 1, k.sinks = it % 3 == 1;
    dm_iv_case_run(&r, &k, it);
  }
}

/* split-K (docs/API.md, kva_attend: fewer than 8 (KV head, 64-row) items and at least 2,048 keys): 2,100 held
   keys and a demoted region, through kva_attend_cache (n_threads 1 and 2, the same bits) and kva_attend_batch */
static void dm_splitk(void) {
  static const kva_dtype kts[4] = {KVA_F16, KVA_INT8, KVA_INT4, KVA_F32};
  static const kva_dtype vts[4] = {KVA_F16, KVA_INT8, KVA_INT8, KVA_F32};
  static const kva_dtype dts[4] = {KVA_INT8, KVA_INT4, KVA_INT8, KVA_F16};
  int it;
  kt_rng r;
  kt_begin("demote: split-K over 2,100 held keys with a demoted region (kva_attend_cache, kva_attend_batch)");
  kt_seed(&r, 0x5B1C);
  for (it = 0; it < (kt_quick ? 2 : 4); it++) {
    dm_iv_case k;
    memset(&k, 0, sizeof k);
    k.kt = kts[it], k.vt = vts[it], k.dt = dts[it];
    k.G = it % 2 ? 2 : 1, k.grp = it % 2 ? 2 : 4, k.D = 64, k.Dv = it == 2 ? 32 : 64, k.bs = it == 3 ? 16 : 32;
    k.budget = 2100, k.ring = it == 1 ? 200 : 64, k.n_q = it % 2 ? 3 : 1, k.more = it == 1 ? 150 : 100;
    k.int_scores = k.int_values = it == 1 || it == 2, k.sinks = it >= 2, k.split = 1;
    dm_iv_case_run(&r, &k, 100 + it);
  }
}

void test_demote(void) {
  dm_desc_rules();
  dm_policy_rules();
  dm_directed_fifo();
  dm_ring_change();
  dm_pool_full();
  dm_fork();
  dm_refusals();
  dm_batch();
  dm_compress();
  dm_nomem();
  dm_exact();
  dm_tree();
  dm_random();
  dm_ivalues();
  dm_splitk();
  if (dm_verbose())
    fprintf(stderr, "  demote: %ld ops, %ld demoted rows checked (%ld rotated, %ld values either way), %ld attention "
            "rows and %ld batch rows (worst err/tol %.3f), %ld cuts through an H2O eviction, %ld evictions larger than "
            "the ring, %ld scorer calls\n", dm_ops_total, dm_rows_checked, dm_rows_rotated, dm_rows_ambiguous,
            dm_attn_rows, dm_batch_rows, dm_worst_attn, dm_cut_groups, dm_big_evictions, dm_scorer_calls);
  if (dm_verbose())
    fprintf(stderr, "  demote: integer values / split-K: %ld rows, %ld channels with a bound, worst err/tol %.3f, "
            "largest share of a tolerance the bound gave %.3f\n", dm_iv_rows, dm_iv_bounded, dm_iv_worst,
            dm_iv_worst_bnd_share);
}
