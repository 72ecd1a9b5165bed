/* test_select.c - block key bounds (kva_cache_desc.block_bounds) and block
 * selection (kva_attn.select_budget, select_sink, select_recent) against an
 * independent fp64 reference of the stated rule, through the public API only.
 *
 * The rule (per query token t of the call and KV head g): bs = block size,
 * n = the tokens the row sees by order (kva_seq_len minus the call's rows
 * after t; kva_seq_len with non_causal), nb = ceil(n / bs). A budget of 0,
 * or a sequence holding at most the budget: everything is read, bit for bit
 * the unselected result; a row with n <= budget reads its nb blocks.
 * When nothing was evicted (slot j at position j), a block none of whose
 * positions the row may see (ref_visible: window, sinks, chunk) is unseen:
 * never read, never counted. Seen blocks holding <= budget tokens: all read.
 * Otherwise sink_end = min(nb, ceil(sink / bs)); recent_begin = nb (recent
 * 0), 0 (recent >= n), else floor((n - recent) / bs), then at least
 * sink_end; the seen blocks of [0, sink_end) and [recent_begin, nb) are
 * read; forced = the tokens they hold; k = floor((budget - forced) / bs)
 * (0 when that is not positive), at most the seen candidates in
 * [sink_end, recent_begin); the k candidates with the largest
 * bound (ties: lower block first) are read, where bound = max over the
 * group's query heads of sum_c max(q_c lo_c, q_c hi_c) and lo / hi are the
 * block's channel minimum / maximum of the stored keys (as kva_seq_read
 * returns them) rounded outward to F16. Attention is then the ordinary one
 * over exactly the tokens of those blocks. A batch plan selects as
 * kva_attend_cache does.
 *
 * The reference (sl_select, sl_ref_group) computes the bounds from the rows
 * kva_seq_read returns, with its own outward F16 rounding (ref.h's encoder
 * plus a code step), picks the blocks and attends in double. Because the
 * library sums its bound in float in another order, a (token, KV head)
 * whose k-th and (k+1)-th candidate bounds are within 1e-3 (1 + |bound|) is
 * skipped and counted (the skips must stay under 5 % of the pairs; the
 * directed tests, whose bounds are exact in float, skip nothing).
 *
 *   - sl_rounding_helpers: the test's own outward rounding on known values;
 *   - sl_errors: block_bounds 0/1 only (KVA_ERR_ARG), with layer groups as
 *     without; kva_cache_bytes_per_token adds
 *     ceil(L G 4 D / bs) (KV and latent caches); negative select fields
 *     KVA_ERR_ARG (kva_attn_check names them); kva_attend with a budget, a
 *     cache without bounds under a budget < n, batch plans with a budget,
 *     kva_gqa_forward on a cache without bounds: KVA_ERR_UNSUPPORTED, out
 *     untouched; a budget >= n on a cache without bounds: the plain result;
 *   - sl_directed: D = 1 cases where rounding to nearest, toward zero or the
 *     wrong way picks the other block (hi up, lo down, negative keys, F16
 *     subnormals), exact ties (q = 0: the lowest blocks), the max (not the
 *     sum) over a group's heads;
 *   - sl_random: random shapes (H/G 1/1 4/1 4/2 8/2, D 1..128, bs 1 3 16
 *     32, n 1, bs-1, bs, bs+1, up to 6 bs, 200..700, ~2,000; every storage
 *     type, V types mixed, v_dim != head_dim; n_q 1 and prefill chunks of 2..6;
 *     windows, sinks, softcap, scale, ALiBi, sink logits, non_causal, integer
 *     scores (selection by the float query, attention by ref_int_query's),
 *     1 or 2 threads, two layers), budgets below / at / above n, sink and
 *     recent 0, small and beyond n; every check also runs the other entry
 *     point (kva_attend_cache vs _lse: out bit for bit); budget >= n bit for
 *     bit budget 0, and a twin cache without bounds bit for bit too;
 *   - maintenance: fork + appends to both (copy-on-write, the other's large
 *     keys must not reach a shared block's bounds), truncate + append (the
 *     block cut into may keep looser bounds: the reference accepts the
 *     exact set or the set with that block promoted), WINDOW eviction
 *     (compaction rebuilds the bounds: exact rule, positions from
 *     kva_seq_read), export / import into a fresh cache of another block size
 *     (exact rule even when the source's bounds were loose);
 *   - sl_groups: a FULL layer and a WINDOW or CHUNK group's layers, grown in
 *     steps (released blocks read as unseen), the span stated in the call or
 *     implied by the group (the same bits), then a fork whose shared last
 *     block (large keys) the first appender copies with its bounds;
 *   - kva_gqa_forward with a budget against an fp64 layer (the projections
 *     in double, the stored rows, the rule's blocks); budget >= n bit for bit
 *     the unselected forward;
 *   - sl_needle (a property check, not a rule): when the attention mass sits
 *     in a few blocks whose keys follow the query, selection with a budget
 *     that covers them is within 1e-2 of full attention, and a single needle
 *     block's constant value comes out.
 *
 * Tolerances: outputs |got - want| <= max(2e-5, 4e-6 (1 + sqrt(D)))
 * (1 + max|v|) (test_attend's / test_iscores' figures), lse 1e-5 (1 + |lse|)
 * (2e-5 with integer scores, whose reference query is ref_int_query's);
 * measured worst err/tol ~0.02 (KVA_TEST_VERBOSE=1 prints it and the
 * near-tie skips, ~2 % of the pairs). */
#include "kvattn.h"
#include "harness.h"
#include "ref.h"

#define SL_MARGIN 1e-3

/* 0 (the rule this test was written to, the library's first version):
     - every row of a multi-token call selects among n = kva_seq_len, the
       tokens held;
     - kva_batch_plan with select_budget > 0 is KVA_ERR_UNSUPPORTED.
   1 (docs/API.md, "Block selection", after the library's changes "a causal
   query token chooses among the tokens up to its own" and "block selection
   in batch plans"):
     - causal row t of n_q selects among the n - (n_q - 1 - t) tokens up to
       its own slot (all n with non_causal): ceil(n_t / bs) blocks, the
       recent ones ending there, everything when n_t <= the budget; the
       bounds are the blocks' as stored (a block holding later tokens of the
       call bounds them too). Decode and the last row of a call are the same
       under both;
     - a batch plan selects as kva_attend_cache does: the same bits for a
       sequence holding more than the budget (then one unit per KV head, no
       split-K), within float tolerance otherwise; a cache without bounds
       refuses it (KVA_ERR_UNSUPPORTED) as kva_attend_cache does. */

static int sl_row_n(int n_held, int n_q, int t, const kva_attn *a) {
  if (a->non_causal) return n_held;
  return n_held - (n_q - 1 - t);
}

static double sl_worst_ratio; /* worst err / tol, for KVA_TEST_VERBOSE */
static long sl_pairs_total, sl_pairs_skipped;

/* ------------------------------------------------------------------------ */
/* F16 outward rounding: ref.h's round-to-nearest code, then one code step.  */

static uint16_t sl_f16_step_up(uint16_t h) {
  if (h == 0x8000u) return 0x0001u;           /* -0 -> the smallest positive */
  if (h & 0x8000u) return (uint16_t)(h - 1u); /* negative: toward zero */
  return (uint16_t)(h + 1u);
}
static uint16_t sl_f16_step_down(uint16_t h) {
  if (h == 0x0000u) return 0x8001u;
  if (h & 0x8000u) return (uint16_t)(h + 1u);
  return (uint16_t)(h - 1u);
}
/* the smallest F16 value >= x (x a float) */
static double sl_f16_up(float x) {
  uint16_t h = ref_f32_to_f16(x);
  double v = ref_f16_to_f64(h);
  if (v < (double)x) v = ref_f16_to_f64(sl_f16_step_up(h));
  return v;
}
/* the largest F16 value <= x */
static double sl_f16_down(float x) {
  uint16_t h = ref_f32_to_f16(x);
  double v = ref_f16_to_f64(h);
  if (v > (double)x) v = ref_f16_to_f64(sl_f16_step_down(h));
  return v;
}

static void sl_rounding_helpers(void) {
  /* the helpers themselves, on values whose answers are known */
  kt_begin("select: the test's own outward F16 rounding");
  KT_CHECK(sl_f16_up(1.0f) == 1.0 && sl_f16_down(1.0f) == 1.0, "exact 1");
  KT_CHECK(sl_f16_up(1.0000001f) == 1.0 + 1.0 / 1024 && sl_f16_down(1.0000001f) == 1.0, "just above 1");
  KT_CHECK(sl_f16_up(0.9999999f) == 1.0 && sl_f16_down(0.9999999f) == 1.0 - 1.0 / 2048, "just below 1");
  KT_CHECK(sl_f16_up(-1.0000001f) == -1.0 && sl_f16_down(-1.0000001f) == -1.0 - 1.0 / 1024, "just below -1");
  KT_CHECK(sl_f16_up(1e-9f) == ldexp(1.0, -24) && sl_f16_down(1e-9f) == 0.0, "tiny positive");
  KT_CHECK(sl_f16_up(-1e-9f) == 0.0 && sl_f16_down(-1e-9f) == -ldexp(1.0, -24), "tiny negative");
  KT_CHECK(sl_f16_up(0.0f) == 0.0 && sl_f16_down(0.0f) == 0.0, "zero");
  KT_CHECK(sl_f16_up(65505.0f) == INFINITY && sl_f16_down(65505.0f) == 65504.0, "beyond the range");
  KT_CHECK(sl_f16_up(1e6f) == INFINITY && sl_f16_down(1e6f) == 65504.0, "far beyond the range");
}

/* ------------------------------------------------------------------------ */
/* A sequence's rows as kva_seq_read returns them.                          */

typedef struct {
  int n, G, D, Dv;
  float *k, *v;  /* [n][G][D], [n][G][Dv] */
  int32_t *pos;  /* [n][G] */
} sl_rows;

/* 1: a layer group may have released slots (kva_seq_read: KVA_ERR_UNSUPPORTED); they read as zero keys
   and values at their slot's position, which no row of the rule can see */
static int sl_released_ok;

static int sl_read(const kva_cache *c, int seq, int layer, int G, int D, int Dv, sl_rows *R) {
  int j, bad = 0, n = kva_seq_len(c, seq);
  R->n = n < 0 ? 0 : n;
  R->G = G, R->D = D, R->Dv = Dv;
  R->k = KT_ALLOC(float, (size_t)R->n * G * D);
  R->v = KT_ALLOC(float, (size_t)R->n * G * Dv);
  R->pos = KT_ALLOC(int32_t, (size_t)R->n * G);
  for (j = 0; j < R->n; j++) {
    kva_status st = kva_seq_read(c, seq, layer, j, R->k + (size_t)j * G * D, R->v + (size_t)j * G * Dv,
                                 R->pos + (size_t)j * G);
    if (st == KVA_ERR_UNSUPPORTED && sl_released_ok) {
      int g;
      memset(R->k + (size_t)j * G * D, 0, (size_t)G * D * sizeof(float));
      memset(R->v + (size_t)j * G * Dv, 0, (size_t)G * Dv * sizeof(float));
      for (g = 0; g < G; g++) R->pos[(size_t)j * G + g] = j;
      st = KVA_OK;
    }
    bad += st != KVA_OK;
  }
  KT_CHECK(n >= 0 && bad == 0, "kva_seq_read: len %d, %d slots refused", n, bad);
  return bad == 0 && n >= 0;
}

static void sl_rows_free(sl_rows *R) {
  free(R->k), free(R->v), free(R->pos);
}

/* lo / hi per block, KV head and channel: [nb][G][2][D] */
static double *sl_bounds(const sl_rows *R, int bs) {
  int nb = (R->n + bs - 1) / bs, b, g, c, j, G = R->G, D = R->D;
  double *bd = KT_ALLOC(double, (size_t)(nb > 0 ? nb : 1) * G * 2 * D);
  for (b = 0; b < nb; b++)
    for (g = 0; g < G; g++) {
      double *lo = bd + (((size_t)b * G + g) * 2) * D, *hi = lo + D;
      for (c = 0; c < D; c++) {
        float mn = INFINITY, mx = -INFINITY;
        for (j = b * bs; j < R->n && j < b * bs + bs; j++) {
          float x = R->k[((size_t)j * G + g) * D + c];
          if (x < mn) mn = x;
          if (x > mx) mx = x;
        }
        lo[c] = sl_f16_down(mn);
        hi[c] = sl_f16_up(mx);
      }
    }
  return bd;
}

typedef struct {
  double b;
  int i;
} sl_cand;

static int sl_cand_cmp(const void *x, const void *y) {
  const sl_cand *a = (const sl_cand *)x, *b = (const sl_cand *)y;
  if (a->b > b->b) return -1;
  if (a->b < b->b) return 1;
  return a->i < b->i ? -1 : a->i > b->i;
}

/* The rule's blocks for one query token (q: its [H][D] row, unscaled) and KV
   head g: sel[nb] = 1 for the blocks read. Returns the gap between the k-th
   and (k+1)-th candidate bounds over 1 + |k-th| (INFINITY when there is no
   such boundary). alt (may be NULL): the set when block `loose` had a larger
   bound than the reference's (it then displaces the k-th candidate). */
static double sl_select(int n, int bs, int budget, int sink, int recent, const ref_attn_cfg *vis, int32_t qpos,
                        const double *bd, int H, int G, int D, int g, const float *q, unsigned char *sel, int loose,
                        unsigned char *alt, int *k_out) {
  int nb = (n + bs - 1) / bs, R = H / G, i, j, h, c, sink_end, rb, k, nc = 0, in_alt = 0;
  long forced = 0, seen_tokens = 0, left;
  double gap = INFINITY;
  sl_cand *cand;
  unsigned char *seen = KT_ALLOC(unsigned char, (size_t)nb + 1);
  if (k_out) *k_out = -1;
  /* a block is seen when the row may attend to at least one of its keys (slot j at position j) */
  for (i = 0; i < nb; i++) {
    int held = (i + 1) * bs <= n ? bs : n - i * bs;
    seen[i] = !vis;
    for (j = i * bs; j < i * bs + held && !seen[i]; j++) seen[i] = (unsigned char)ref_visible(vis, qpos, j);
    if (seen[i]) seen_tokens += held;
  }
  if (budget == 0 || seen_tokens <= budget) {
    for (i = 0; i < nb; i++) sel[i] = (unsigned char)(budget == 0 || seen[i]);
    if (alt) memcpy(alt, sel, (size_t)nb);
    free(seen);
    return gap;
  }
  sink_end = (int)(((long)sink + bs - 1) / bs);
  if (sink_end > nb) sink_end = nb;
  if (recent == 0) rb = nb;
  else if (recent >= n) rb = 0;
  else rb = (n - recent) / bs;
  if (rb < sink_end) rb = sink_end;
  for (i = 0; i < nb; i++)
    if (seen[i] && (i < sink_end || i >= rb)) forced += (i + 1) * bs <= n ? bs : n - i * bs;
  left = (long)budget - forced;
  k = left > 0 ? (int)(left / bs) : 0;
  cand = KT_ALLOC(sl_cand, (size_t)(nb > 0 ? nb : 1));
  for (i = 0; i < nb; i++) sel[i] = (unsigned char)(seen[i] && (i < sink_end || i >= rb));
  for (i = sink_end; i < rb; i++)
    if (seen[i]) {
      const double *lo = bd + (((size_t)i * G + g) * 2) * D, *hi = lo + D;
      double best = -INFINITY;
      for (h = g * R; h < g * R + R; h++) {
        const float *qh = q + (size_t)h * D;
        double s = 0.0;
        for (c = 0; c < D; c++) {
          double a = (double)qh[c] * lo[c], b = (double)qh[c] * hi[c];
          s += a > b ? a : b;
        }
        if (s > best) best = s;
      }
      cand[nc].b = best;
      cand[nc].i = i;
      nc++;
    }
  if (k > nc) k = nc;
  qsort(cand, (size_t)nc, sizeof *cand, sl_cand_cmp);
  for (i = 0; i < k; i++) sel[cand[i].i] = 1;
  if (k > 0 && k < nc) gap = (cand[k - 1].b - cand[k].b) / (1.0 + fabs(cand[k - 1].b));
  if (alt) {
    memcpy(alt, sel, (size_t)nb);
    for (i = k; i < nc; i++) in_alt |= cand[i].i == loose;
    if (in_alt && k > 0) {
      alt[cand[k - 1].i] = 0;
      alt[loose] = 1;
    }
  }
  if (k_out) *k_out = k;
  free(cand), free(seen);
  return gap;
}

/* fp64 attention of token row q ([H][D], doubles) at position qpos for the
   heads of KV head g over the tokens of the blocks sel marks: out [H][Dv] and
   lse [H] (only the group's heads written). */
static void sl_ref_group(const ref_attn_cfg *cf, const double *q, int32_t qpos, const sl_rows *R, int bs,
                         const unsigned char *sel, int g, double *out, double *lse) {
  int Rh = cf->H / cf->G, h, j, d, G = R->G, D = R->D, Dv = R->Dv;
  double *s = KT_ALLOC(double, (size_t)(R->n > 0 ? R->n : 1));
  char *vis = KT_ALLOC(char, (size_t)(R->n > 0 ? R->n : 1));
  for (h = g * Rh; h < g * Rh + Rh; h++) {
    const double *qh = q + (size_t)h * D;
    double *o = out + (size_t)h * Dv, m = -INFINITY, sum = 0.0, slope = ref_alibi_slope(cf, h);
    int any = 0;
    for (d = 0; d < Dv; d++) o[d] = 0.0;
    for (j = 0; j < R->n; j++) {
      int32_t kp = R->pos[(size_t)j * G + g];
      const float *kj = R->k + ((size_t)j * G + g) * D;
      double dot = 0.0;
      vis[j] = (char)(sel[j / bs] && ref_visible(cf, qpos, kp));
      if (!vis[j]) continue;
      for (d = 0; d < D; d++) dot += qh[d] * (double)kj[d];
      dot *= cf->scale;
      if (cf->softcap > 0.0) dot = cf->softcap * tanh(dot / cf->softcap);
      dot -= slope * fabs((double)qpos - (double)kp);
      s[j] = dot;
      if (dot > m) m = dot;
      any = 1;
    }
    if (!any && !cf->sink_logits) {
      lse[h] = -INFINITY;
      continue;
    }
    if (cf->sink_logits && (double)cf->sink_logits[h] > m) m = (double)cf->sink_logits[h];
    if (cf->sink_logits) sum += exp((double)cf->sink_logits[h] - m);
    for (j = 0; j < R->n; j++)
      if (vis[j]) sum += s[j] = exp(s[j] - m);
    for (j = 0; j < R->n; j++) {
      const float *vj = R->v + ((size_t)j * G + g) * Dv;
      if (!vis[j]) continue;
      for (d = 0; d < Dv; d++) o[d] += s[j] / sum * (double)vj[d];
    }
    lse[h] = m + log(sum);
  }
  free(s), free(vis);
}

/* Worst err / tol of the group's heads of one token row (lse NULL: not compared). */
static double sl_cmp_group(const float *out, const float *lse, const double *ro, const double *rl, int h0, int Rh,
                           int Dv, double tol_out, double lse_rel) {
  int h, d;
  double worst = 0.0;
  for (h = h0; h < h0 + Rh; h++) {
    for (d = 0; d < Dv; d++) {
      double e = fabs((double)out[(size_t)h * Dv + d] - ro[(size_t)h * Dv + d]);
      if (!(e <= 1e300)) e = INFINITY;
      if (e / tol_out > worst) worst = e / tol_out;
    }
    if (lse) {
      if (rl[h] == -INFINITY) {
        if (lse[h] != -INFINITY) worst = INFINITY;
      } else {
        double e = fabs((double)lse[h] - rl[h]), tl = lse_rel * (1.0 + fabs(rl[h]));
        if (!(e <= 1e300)) e = INFINITY;
        if (e / tl > worst) worst = e / tl;
      }
    }
  }
  return worst;
}

static int sl_int_keys(kva_dtype t) { return t == KVA_INT8 || t == KVA_INT4; }

/* Attend with a's selection (both entry points), read the rows and check
   every (token, KV head) against the rule's reference. loose >= 0: that
   block's bounds may be looser than the rule's (after a truncate). exact: no
   near-tie skipping (directed cases whose bounds are exact in float). When
   the budget reads everything, the output must be the unselected one bit for
   bit. Returns the selected outputs in out_keep (NULL: not kept). */
static void sl_check(kva_cache *c, int seq, int layer, const kva_attn *a, const float *q, int n_q, int bs,
                     kva_dtype kt, int loose, int exact, const char *what, float *out_keep) {
  int H = a->n_heads, G = a->n_kv_heads, D = a->head_dim, Dv = a->v_dim ? a->v_dim : a->head_dim, Rh = H / G;
  int t, g, nb, pos_next = kva_seq_pos(c, seq), bad = 0, skipped = 0, first_t = -1, first_g = -1, first_k = -1;
  size_t no = (size_t)n_q * H * Dv, nl = (size_t)n_q * H;
  float *out = KT_ALLOC(float, no + 1), *out2 = KT_ALLOC(float, no + 1), *lse = KT_ALLOC(float, nl + 1);
  double *qd = KT_ALLOC(double, (size_t)n_q * H * D + 1), *ro = KT_ALLOC(double, (size_t)H * Dv + 1);
  double *ro2 = KT_ALLOC(double, (size_t)H * Dv + 1), *rl = KT_ALLOC(double, (size_t)H + 1);
  double *rl2 = KT_ALLOC(double, (size_t)H + 1);
  double *bd = NULL, tol_out, lse_rel, first_w = 0.0, vmax;
  unsigned char *sel = NULL, *alt = NULL;
  int iscore = a->int_scores && sl_int_keys(kt);
  ref_attn_cfg cf = ref_cfg(a);
  sl_rows R;
  kva_status st;
  memset(&R, 0, sizeof R);
  kt_fill_sentinel(out, no + 1);
  kt_fill_sentinel(lse, nl + 1);
  kt_fill_sentinel(out2, no + 1);
  st = kva_attend_cache_lse(c, seq, layer, a, q, n_q, out, lse);
  KT_CHECK(st == KVA_OK, "%s: kva_attend_cache_lse returned %s", what, kva_status_str(st));
  if (st != KVA_OK) goto done;
  KT_CHECK(kt_all_sentinel(out + no, 1) && kt_all_sentinel(lse + nl, 1), "%s: wrote past out / lse", what);
  st = kva_attend_cache(c, seq, layer, a, q, n_q, out2);
  KT_CHECK(st == KVA_OK && kt_same_bits(out, out2, no), "%s: kva_attend_cache (%s) differs from the _lse call", what,
           kva_status_str(st));
  if (!sl_read(c, seq, layer, G, D, Dv, &R)) goto done;
  vmax = ref_max_abs_f(R.v, (size_t)R.n * G * Dv);
  tol_out = (2e-5 > 4e-6 * (1.0 + sqrt((double)D)) ? 2e-5 : 4e-6 * (1.0 + sqrt((double)D))) * (1.0 + vmax);
  { /* a batch plan of this sequence: as this call (the same bits when selecting) */
    kva_batch *plan = NULL;
    float *ob = KT_ALLOC(float, no + 1), *lb = KT_ALLOC(float, nl + 1);
    int selecting = a->select_budget > 0 && a->select_budget < R.n, far = 0;
    size_t i;
    kt_fill_sentinel(ob, no + 1);
    st = kva_batch_plan(c, a, &seq, &n_q, 1, &plan);
    if (st == KVA_OK) st = kva_attend_batch_lse(c, plan, layer, q, ob, lb);
    for (i = 0; i < no && !selecting; i++) far += !(fabs((double)ob[i] - (double)out[i]) <= tol_out);
    for (i = 0; i < nl && !selecting; i++)
      far += !(lb[i] == lse[i] || fabs((double)lb[i] - (double)lse[i]) <= 1e-5 * (1.0 + fabs((double)lse[i])));
    KT_CHECK(st == KVA_OK && (selecting ? kt_same_bits(ob, out, no) && kt_same_bits(lb, lse, nl) : far == 0),
             "%s: a batch plan: %s, %s kva_attend_cache_lse's result (%d values off)", what, kva_status_str(st),
             selecting ? "not bit for bit" : "not within float tolerance of", far);
    kva_batch_free(plan);
    free(ob), free(lb);
  }
  if (a->select_budget == 0 || a->select_budget >= R.n) { /* reads everything: the unselected result bit for bit */
    kva_attn a0 = *a;
    float *o0 = KT_ALLOC(float, no + 1), *l0 = KT_ALLOC(float, nl + 1);
    a0.select_budget = a0.select_sink = a0.select_recent = 0;
    st = kva_attend_cache_lse(c, seq, layer, &a0, q, n_q, o0, l0);
    KT_CHECK(st == KVA_OK && kt_same_bits(out, o0, no) && kt_same_bits(lse, l0, nl),
             "%s: budget %d >= n %d (or 0; sink %d recent %d): not the unselected result bit for bit", what,
             a->select_budget, R.n, a->select_sink, a->select_recent);
    free(o0), free(l0);
  }
  nb = (R.n + bs - 1) / bs;
  bd = sl_bounds(&R, bs);
  sel = KT_ALLOC(unsigned char, (size_t)nb + 1);
  alt = KT_ALLOC(unsigned char, (size_t)nb + 1);
  if (iscore) ref_int_query(qd, q, (size_t)n_q * H, D);
  else
    for (t = 0; t < n_q * H * D; t++) qd[t] = (double)q[t];
  lse_rel = iscore ? 2e-5 : 1e-5;
  for (t = 0; t < n_q; t++)
    for (g = 0; g < G; g++) {
      int32_t qpos = (int32_t)(pos_next - n_q + t);
      const float *qt = q + (size_t)t * H * D;
      int kk;
      double gap, w;
      memset(sel, 0, (size_t)nb + 1);
      memset(alt, 0, (size_t)nb + 1);
      /* nothing evicted (position == length): slot j holds position j, and blocks past the window are not seen */
      gap = sl_select(sl_row_n(R.n, n_q, t, a), bs, a->select_budget, a->select_sink, a->select_recent,
                      pos_next == R.n ? &cf : NULL, qpos, bd, H, G, D, g, qt, sel, loose, alt, &kk);
      sl_pairs_total++;
      if (!exact && gap < SL_MARGIN) {
        skipped++;
        sl_pairs_skipped++;
        continue;
      }
      sl_ref_group(&cf, qd + (size_t)t * H * D, qpos, &R, bs, sel, g, ro, rl);
      w = sl_cmp_group(out + (size_t)t * H * Dv, lse + (size_t)t * H, ro, rl, g * Rh, Rh, Dv, tol_out, lse_rel);
      if (w > 1.0 && loose >= 0 && memcmp(sel, alt, (size_t)nb) != 0) {
        double w2;
        sl_ref_group(&cf, qd + (size_t)t * H * D, qpos, &R, bs, alt, g, ro2, rl2);
        w2 = sl_cmp_group(out + (size_t)t * H * Dv, lse + (size_t)t * H, ro2, rl2, g * Rh, Rh, Dv, tol_out, lse_rel);
        if (w2 < w) w = w2;
      }
      if (w <= 1.0 && w > sl_worst_ratio) sl_worst_ratio = w;
      if (!(w <= 1.0)) {
        if (!bad) first_t = t, first_g = g, first_w = w, first_k = kk;
        bad++;
      }
    }
  KT_CHECK(bad == 0,
           "%s: %d of %d (token, KV head) pairs differ from the rule's reference (first: token %d of %d, KV head %d, "
           "err/tol %.3g; n %d bs %d budget %d sink %d recent %d k %d; H %d G %d D %d Dv %d %s, window %d, int "
           "scores %d)",
           what, bad, n_q * G - skipped, first_t, n_q, first_g, first_w, R.n, bs, a->select_budget, a->select_sink,
           a->select_recent, first_k, H, G, D, Dv, kva_dtype_name(kt), a->window, iscore);
  if (out_keep) memcpy(out_keep, out, no * sizeof(float));
done:
  if (R.k) sl_rows_free(&R);
  free(out), free(out2), free(lse), free(qd), free(ro), free(ro2), free(rl), free(rl2), free(bd), free(sel), free(alt);
}

/* ------------------------------------------------------------------------ */
/* Caches and sequences.                                                    */

typedef struct {
  int H, G, D, Dv, bs, L;
  kva_dtype kt, vt;
} sl_shape;

/* 1: the next caches keep no positions (evict_support NONE): a selected block's keys then sit at
   positions the library derives from the block's index */
static int sl_lean;

/* the next caches' layer groups (sl_n_groups 0: none) */
static int sl_n_groups;
static const kva_layer_group *sl_group_list;
static const int *sl_layer_groups;

static void sl_desc(kva_cache_desc *d, const sl_shape *s, int bounds, int n_blocks, int max_seqs) {
  memset(d, 0, sizeof *d);
  d->evict_support = sl_lean ? KVA_EVICT_SUPPORT_NONE : KVA_EVICT_SUPPORT_ALL;
  d->n_layers = s->L;
  d->n_kv_heads = s->G;
  d->head_dim = s->D;
  d->v_dim = s->Dv;
  d->block_size = s->bs;
  d->n_blocks = n_blocks;
  d->max_seqs = max_seqs;
  d->dtype = s->kt;
  d->v_dtype = s->vt;
  if (s->kt == KVA_FP8_E4M3 || s->kt == KVA_FP8_E5M2) d->k_scale = 1.0f / 32;
  if (s->vt == KVA_FP8_E4M3 || s->vt == KVA_FP8_E5M2) d->v_scale = 1.0f / 64;
  d->block_bounds = bounds;
  d->n_groups = sl_n_groups;
  d->groups = sl_n_groups ? sl_group_list : NULL;
  d->layer_group = sl_n_groups ? sl_layer_groups : NULL;
}

static kva_cache *sl_cache(const sl_shape *s, int bounds, int n_blocks, int max_seqs) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_status st;
  sl_desc(&d, s, bounds, n_blocks, max_seqs);
  st = kva_cache_create(&d, &c);
  KT_CHECK(st == KVA_OK && c, "kva_cache_create (block_bounds %d, %d blocks of %d, %s/%s): %s", bounds, n_blocks,
           s->bs, kva_dtype_name(s->kt), kva_dtype_name(s->vt), kva_status_str(st));
  return st == KVA_OK ? c : NULL;
}

static void sl_attn(kva_attn *a, const sl_shape *s) {
  kt_attn_init(a, s->H, s->G, s->D, s->Dv);
}

/* Keys with block structure (so that bounds differ): per block (of bs
   positions) and KV head an offset pattern and an amplitude; values with a
   per-block offset (so that a block more or less moves the output). k
   [L][n][G][D], v [L][n][G][Dv]. */
static void sl_gen(kt_rng *r, const sl_shape *s, int n, float *k, float *v) {
  int l, b, g, c, j, G = s->G, D = s->D, Dv = s->Dv;
  float *off = KT_ALLOC(float, D);
  for (l = 0; l < s->L; l++)
    for (b = 0; b * s->bs < n; b++)
      for (g = 0; g < G; g++) {
        int mode = kt_int(r, 0, 3);
        float amp = mode == 2 ? 0.2f : 1.0f, voff = kt_uniform(r, -1.0f, 1.0f);
        for (c = 0; c < D; c++)
          off[c] = mode == 1 ? kt_uniform(r, -1.5f, 1.5f) : mode == 3 ? (kt_int(r, 0, 1) ? 2.0f : -2.0f) : 0.0f;
        for (j = b * s->bs; j < n && j < b * s->bs + s->bs; j++) {
          float *kj = k + (((size_t)l * n + j) * G + g) * D, *vj = v + (((size_t)l * n + j) * G + g) * Dv;
          for (c = 0; c < D; c++) kj[c] = off[c] + amp * kt_uniform(r, -1.0f, 1.0f);
          for (c = 0; c < Dv; c++) vj[c] = voff + kt_uniform(r, -1.0f, 1.0f);
        }
      }
  free(off);
}

/* One step: append positions [from, to) of the generated rows (k, v of total
   positions per layer) and store them in every layer. */
static int sl_step(kva_cache *c, int seq, const sl_shape *s, const float *k, const float *v, int total, int from,
                   int to) {
  int l, bad = 0;
  kva_status st = kva_seq_append(c, seq, to - from);
  KT_CHECK(st == KVA_OK, "append %d tokens: %s", to - from, kva_status_str(st));
  if (st != KVA_OK) return 0;
  for (l = 0; l < s->L; l++)
    bad += kva_store(c, seq, l, k + ((size_t)l * total + from) * s->G * s->D,
                     v + ((size_t)l * total + from) * s->G * s->Dv, to - from) != KVA_OK;
  KT_CHECK(bad == 0, "store %d tokens: %d layers refused", to - from, bad);
  return bad == 0;
}

/* a sequence of positions [0, n) in 1..3 prefix steps, the last step `step` tokens */
static int sl_build(kt_rng *r, kva_cache *c, int *seq, const sl_shape *s, const float *k, const float *v, int total,
                    int n, int step) {
  int at = 0, prefix = n - step, parts = kt_int(r, 1, 3), p;
  KT_STATUS(kva_seq_new(c, seq), KVA_OK);
  for (p = 0; p < parts && at < prefix; p++) {
    int to = p == parts - 1 ? prefix : kt_int(r, at + 1, prefix);
    if (!sl_step(c, *seq, s, k, v, total, at, to)) return 0;
    at = to;
  }
  return sl_step(c, *seq, s, k, v, total, prefix, n);
}

static const kva_dtype sl_types[7] = {KVA_F16, KVA_F32, KVA_INT8, KVA_INT4, KVA_FP8_E4M3, KVA_BF16, KVA_FP8_E5M2};
static const int sl_hg[4][2] = {{1, 1}, {4, 1}, {4, 2}, {8, 2}};
static const int sl_dims[7] = {1, 7, 8, 16, 33, 64, 128};
static const int sl_bss[4] = {1, 3, 16, 32};

static void sl_rand_shape(kt_rng *r, sl_shape *s, int max_d) {
  int i = kt_int(r, 0, 3), nd = 7;
  while (nd > 1 && sl_dims[nd - 1] > max_d) nd--;
  s->H = sl_hg[i][0], s->G = sl_hg[i][1];
  s->D = sl_dims[kt_int(r, 0, nd - 1)];
  s->Dv = kt_int(r, 0, 4) == 0 ? sl_dims[kt_int(r, 0, nd - 1)] : s->D;
  s->bs = sl_bss[kt_int(r, 0, 3)];
  s->L = kt_int(r, 1, 2);
  s->kt = sl_types[kt_int(r, 0, 6)];
  s->vt = kt_int(r, 0, 1) ? s->kt : sl_types[kt_int(r, 0, 6)];
}

/* budget, sink and recent for n held tokens: below, at and above n; 0, small, beyond n */
static void sl_rand_select(kt_rng *r, kva_attn *a, int n, int bs) {
  int cb = kt_int(r, 0, 9), cs = kt_int(r, 0, 5), cr = kt_int(r, 0, 5);
  a->select_budget = cb == 0 ? 0 : cb == 1 ? n : cb == 2 ? n + kt_int(r, 1, 40) : cb == 3 ? kt_int(r, 1, bs)
                                                                               : kt_int(r, 1, n > 1 ? n - 1 : 1);
  a->select_sink = cs <= 1 ? 0 : cs == 2 ? kt_int(r, 1, 2 * bs) : cs == 3 ? kt_int(r, 1, n) : n + kt_int(r, 0, 20);
  if (cs == 5) a->select_sink = 0;
  a->select_recent = cr <= 1 ? 0 : cr == 2 ? kt_int(r, 1, 2 * bs) : cr == 3 ? kt_int(r, 1, n) : n + kt_int(r, 0, 20);
  if (cr == 5) a->select_recent = kt_int(r, 1, 3);
}

/* ------------------------------------------------------------------------ */
/* Refusals and sizes.                                                      */

static void sl_errors(kt_rng *r) {
  sl_shape s;
  kva_cache_desc d;
  kva_cache *c = NULL, *cn = NULL;
  kva_attn a;
  int seq = -1, seqn = -1, it, n = 40, i;
  float *k, *v, *q, *out, *o0, *kp, *vp;
  kva_layer_group grp;
  kva_status st;
  kva_batch *plan = NULL;
  kt_begin("select: refusals, sizes and untouched outputs");
  s.H = 4, s.G = 2, s.D = 16, s.Dv = 16, s.bs = 4, s.L = 1, s.kt = s.vt = KVA_F16;
  /* block_bounds values */
  for (i = -1; i <= 3; i++) {
    sl_desc(&d, &s, i, 16, 2);
    c = NULL;
    st = kva_cache_create(&d, &c);
    KT_CHECK(st == (i == 0 || i == 1 ? KVA_OK : KVA_ERR_ARG) && (st == KVA_OK) == (c != NULL),
             "block_bounds %d: kva_cache_create returned %s", i, kva_status_str(st));
    if (c) kva_cache_destroy(c);
  }
  /* with layer groups (a FULL or a WINDOW group) as without */
  for (i = 0; i < 2; i++) {
    memset(&grp, 0, sizeof grp);
    grp.kind = i ? KVA_SPAN_WINDOW : KVA_SPAN_FULL;
    grp.window = i ? 8 : 0;
    sl_desc(&d, &s, 0, 16, 2);
    d.n_groups = 1;
    d.groups = &grp;
    c = NULL;
    st = kva_cache_create(&d, &c);
    KT_CHECK(st == KVA_OK, "a %s layer group without bounds: %s (the control)", i ? "WINDOW" : "FULL",
             kva_status_str(st));
    kva_cache_destroy(c);
    d.block_bounds = 1;
    c = NULL;
    st = kva_cache_create(&d, &c);
    KT_CHECK(st == KVA_OK && c, "block_bounds with a %s layer group: %s", i ? "WINDOW" : "FULL",
             kva_status_str(st));
    kva_cache_destroy(c);
  }
  /* bytes per token: + ceil(L G 4 D / bs) */
  for (it = 0; it < 200; it++) {
    size_t b0, b1, want;
    sl_rand_shape(r, &s, 128);
    s.L = kt_int(r, 1, 5);
    s.bs = kt_int(r, 0, 2) ? sl_bss[kt_int(r, 0, 3)] : kt_int(r, 1, 100);
    sl_desc(&d, &s, 0, 8, 2);
    if (it % 5 == 0) { /* a latent cache: one KV head, V the first v_dim values */
      s.G = 1;
      sl_desc(&d, &s, 0, 8, 2);
      d.kind = KVA_CACHE_LATENT, d.v_dtype = KVA_DTYPE_DEFAULT, d.v_dim = kt_int(r, 1, s.D), d.v_scale = 0.0f;
    }
    b0 = kva_cache_bytes_per_token(&d);
    d.block_bounds = 1;
    b1 = kva_cache_bytes_per_token(&d);
    want = ((size_t)s.L * s.G * 4 * s.D + (size_t)s.bs - 1) / (size_t)s.bs;
    KT_CHECK(b0 > 0 && b1 == b0 + want,
             "bytes_per_token L %d G %d D %d bs %d %s%s: %lu with bounds, %lu without, want + %lu", s.L, s.G, s.D, s.bs,
             kva_dtype_name(s.kt), d.kind == KVA_CACHE_LATENT ? " latent" : "", (unsigned long)b1, (unsigned long)b0,
             (unsigned long)want);
  }
  /* attention refusals */
  s.H = 4, s.G = 2, s.D = 16, s.Dv = 16, s.bs = 4, s.L = 1, s.kt = s.vt = KVA_F16;
  c = sl_cache(&s, 1, 32, 2);
  cn = sl_cache(&s, 0, 32, 2);
  if (!c || !cn) {
    kva_cache_destroy(c), kva_cache_destroy(cn);
    return;
  }
  k = KT_ALLOC(float, (size_t)n * 2 * 16), v = KT_ALLOC(float, (size_t)n * 2 * 16);
  q = KT_ALLOC(float, 4 * 16), out = KT_ALLOC(float, 4 * 16), o0 = KT_ALLOC(float, 4 * 16);
  kp = KT_ALLOC(float, (size_t)n * 2 * 16), vp = KT_ALLOC(float, (size_t)n * 2 * 16);
  sl_gen(r, &s, n, k, v);
  kt_fill(r, q, 64, -1.0f, 1.0f);
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  KT_STATUS(kva_seq_new(cn, &seqn), KVA_OK);
  sl_step(c, seq, &s, k, v, n, 0, n);
  sl_step(cn, seqn, &s, k, v, n, 0, n);
  sl_attn(&a, &s);
  for (i = 0; i < 3; i++) { /* negative fields: KVA_ERR_ARG everywhere, whatever the cache */
    kva_attn b = a;
    if (i == 0) b.select_budget = -1;
    if (i == 1) b.select_sink = -1;
    if (i == 2) b.select_budget = 8, b.select_recent = -3;
    kt_fill_sentinel(out, 64);
    KT_STATUS(kva_attend_cache(c, seq, 0, &b, q, 1, out), KVA_ERR_ARG);
    KT_CHECK(kt_all_sentinel(out, 64), "negative field %d: out written (bounds cache)", i);
    KT_STATUS(kva_attend_cache(cn, seqn, 0, &b, q, 1, out), KVA_ERR_ARG);
    KT_CHECK(kt_all_sentinel(out, 64), "negative field %d: out written (cache without bounds)", i);
    KT_STATUS(kva_attend(&b, q, 1, NULL, kp, vp, 0, NULL, out, NULL), KVA_ERR_ARG);
    KT_CHECK(kt_all_sentinel(out, 64), "negative field %d: kva_attend wrote out", i);
    KT_CHECK(kva_attn_check(&b) != NULL, "kva_attn_check accepts negative select field %d", i);
  }
  {
    kva_attn b = a;
    b.select_budget = 8, b.select_sink = 4, b.select_recent = 4;
    KT_CHECK(kva_attn_check(&b) == NULL, "kva_attn_check refuses valid select fields: %s",
             kva_attn_check(&b) ? kva_attn_check(&b) : "");
  }
  /* kva_attend (plain arrays) with a budget: unsupported, even a budget beyond n_kv */
  for (i = 0; i < n; i++) {
    KT_STATUS(kva_seq_read(c, seq, 0, i, kp + (size_t)i * 32, vp + (size_t)i * 32, NULL), KVA_OK);
  }
  {
    kva_attn b = a;
    int budgets[3] = {1, 20, 1000};
    for (i = 0; i < 3; i++) {
      b.select_budget = budgets[i];
      kt_fill_sentinel(out, 64);
      KT_STATUS(kva_attend(&b, q, 1, NULL, kp, vp, n, NULL, out, NULL), KVA_ERR_UNSUPPORTED);
      KT_CHECK(kt_all_sentinel(out, 64), "kva_attend with select_budget %d wrote out", budgets[i]);
    }
    b.select_budget = 0, b.select_sink = 5, b.select_recent = 7; /* sink / recent alone: nothing to select */
    KT_STATUS(kva_attend(&b, q, 1, NULL, kp, vp, n, NULL, out, NULL), KVA_OK);
  }
  /* a cache without bounds: budget in (0, n) unsupported; 0 or >= n the plain result */
  KT_STATUS(kva_attend_cache(cn, seqn, 0, &a, q, 1, o0), KVA_OK);
  {
    kva_attn b = a;
    int budgets[5] = {1, 4, n - 1, n, n + 100}, want[5] = {0, 0, 0, 1, 1};
    for (i = 0; i < 5; i++) {
      b.select_budget = budgets[i], b.select_sink = i, b.select_recent = 2 * i;
      kt_fill_sentinel(out, 64);
      st = kva_attend_cache(cn, seqn, 0, &b, q, 1, out);
      if (want[i]) {
        KT_CHECK(st == KVA_OK && kt_same_bits(out, o0, 64),
                 "no bounds, budget %d >= n %d: %s, or not the unselected result", budgets[i], n, kva_status_str(st));
      } else {
        KT_CHECK(st == KVA_ERR_UNSUPPORTED && kt_all_sentinel(out, 64),
                 "no bounds, budget %d < n %d: %s (expected unsupported), out %s", budgets[i], n, kva_status_str(st),
                 kt_all_sentinel(out, 64) ? "untouched" : "written");
      }
    }
    /* lse too */
    {
      float l[4] = {KT_SENTINEL, KT_SENTINEL, KT_SENTINEL, KT_SENTINEL};
      b.select_budget = 3;
      kt_fill_sentinel(out, 64);
      KT_STATUS(kva_attend_cache_lse(cn, seqn, 0, &b, q, 1, out, l), KVA_ERR_UNSUPPORTED);
      KT_CHECK(kt_all_sentinel(out, 64) && kt_all_sentinel(l, 4), "no bounds, _lse refused but wrote");
    }
  }
  /* batch plans: a cache without bounds refuses a budget < n (when the plan runs, out untouched), the
     bounds cache selects */
  {
    kva_attn b = a;
    int one = 1, budgets[3] = {1, n, n + 5};
    for (i = 0; i < 3; i++) {
      b.select_budget = budgets[i];
      plan = NULL;
      kt_fill_sentinel(out, 64);
      st = kva_batch_plan(cn, &b, &seqn, &one, 1, &plan);
      if (st == KVA_OK) st = kva_attend_batch(cn, plan, 0, q, out);
      KT_CHECK(i == 0 ? st == KVA_ERR_UNSUPPORTED && kt_all_sentinel(out, 64) : st == KVA_OK,
               "batch plan, no bounds, budget %d of %d: %s", budgets[i], n, kva_status_str(st));
      kva_batch_free(plan);
      plan = NULL;
      kt_fill_sentinel(out, 64);
      KT_STATUS(kva_attend_cache(c, seq, 0, &b, q, 1, o0), KVA_OK);
      st = kva_batch_plan(c, &b, &seq, &one, 1, &plan);
      if (st == KVA_OK) st = kva_attend_batch(c, plan, 0, q, out);
      KT_CHECK(st == KVA_OK && (i > 0 || kt_same_bits(out, o0, 64)),
               "batch plan, bounds, budget %d of %d: %s, or not kva_attend_cache's bits", budgets[i], n,
               kva_status_str(st));
      kva_batch_free(plan);
    }
    b.select_budget = 0, b.select_sink = 3; /* the control */
    plan = NULL;
    KT_STATUS(kva_batch_plan(c, &b, &seq, &one, 1, &plan), KVA_OK);
    kva_batch_free(plan);
  }
  /* the bounds cache accepts it (the control of the refusals above) */
  {
    kva_attn b = a;
    b.select_budget = 8;
    KT_STATUS(kva_attend_cache(c, seq, 0, &b, q, 1, out), KVA_OK);
  }
  kva_cache_destroy(c), kva_cache_destroy(cn);
  free(k), free(v), free(q), free(out), free(o0), free(kp), free(vp);
}

/* ------------------------------------------------------------------------ */
/* Directed cases: outward rounding, ties, the max over a group's heads.    */

/* H = G = 1, D = 1, bs = 2, F32: blocks 0 and 1 hold keys a0 a1 / b0 b1
   (values +1 / -1), block 2 the query's own token (key 0, value 0), read as
   the recent block; the budget reads one candidate. The rule's block (tie:
   block 0) decides the output's sign. */
static void sl_two_blocks(float qv, float a0, float a1, float b0, float b1, int want_block, const char *what) {
  sl_shape s;
  kva_cache *c;
  kva_attn a;
  int seq = -1;
  float k[5], v[5], out[1] = {0.0f};
  s.H = s.G = 1, s.D = s.Dv = 1, s.bs = 2, s.L = 1, s.kt = s.vt = KVA_F32;
  c = sl_cache(&s, 1, 8, 1);
  if (!c) return;
  k[0] = a0, k[1] = a1, k[2] = b0, k[3] = b1, k[4] = 0.0f;
  v[0] = v[1] = 1.0f, v[2] = v[3] = -1.0f, v[4] = 0.0f;
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  sl_step(c, seq, &s, k, v, 5, 0, 5);
  sl_attn(&a, &s);
  a.select_budget = 3, a.select_recent = 1;
  sl_check(c, seq, 0, &a, &qv, 1, 2, KVA_F32, -1, 1, what, out);
  KT_CHECK(want_block == 0 ? out[0] > 0.0f : out[0] < 0.0f, "%s: output %g: block %d should have been read", what,
           (double)out[0], want_block);
  kva_cache_destroy(c);
}

static void sl_directed(kt_rng *r) {
  kt_begin("select: outward F16 rounding of the bounds (directed)");
  /* q > 0: bound = hi. Outward both 1 + 2^-10 (tie: block 0); to nearest block 0 has 1 */
  sl_two_blocks(1.0f, 0.5f, 1.0000001f, 0.5f, 1.0009f, 0, "hi up (nearest would pick block 1)");
  /* toward zero block 0 would have 1, block 1 its exact 1 + 2^-10 */
  sl_two_blocks(1.0f, 1.0009f, 0.25f, 0.25f, 1.0009765625f, 0, "hi up (truncation would pick block 1)");
  /* q < 0: bound = -lo. Block 0's min 0.9999999 down to 1 - 2^-11 ties block 1's */
  sl_two_blocks(-1.0f, 0.9999999f, 2.0f, 0.9995118f, 2.0f, 0, "lo down (nearest would pick block 1)");
  sl_two_blocks(-1.0f, 1.5f, 0.9995118f, 1.5f, 0.99951171875f, 0, "lo down (rounding up would pick block 1)");
  /* negative keys: lo away from zero */
  sl_two_blocks(-1.0f, -1.0000001f, -0.5f, -1.0009765625f, -0.5f, 0, "negative lo down (toward zero would pick 1)");
  /* negative keys, q > 0: hi toward zero (-1.0009 up to -1 ties block 1's -1; to nearest it is -1.0009765625) */
  sl_two_blocks(1.0f, -1.0009f, -3.0f, -1.0f, -3.0f, 0, "negative hi up (nearest would pick block 1)");
  /* -0.9999999 up to -(1 - 2^-11) ties block 1's; rounding down (to -1) would pick block 1 */
  sl_two_blocks(1.0f, -0.9999999f, -3.0f, -0.99951171875f, -3.0f, 0, "negative hi up (rounding down would pick 1)");
  /* F16 subnormals: 1e-9 rounds up to 2^-24 (ties block 1's exact 2^-24); to nearest it is 0 */
  sl_two_blocks(1.0f, 1e-9f, 1e-9f, 5.9604645e-8f, 5.9604645e-8f, 0, "subnormal hi up");
  sl_two_blocks(-1.0f, -1e-9f, -1e-9f, -5.9604645e-8f, -5.9604645e-8f, 0, "subnormal lo down");
  /* a clear order both ways (the controls: not decided by the tie rule) */
  sl_two_blocks(1.0f, 0.0f, 0.5f, 0.0f, 2.0f, 1, "block 1 larger");
  sl_two_blocks(-1.0f, -2.0f, 0.0f, 0.0f, 0.5f, 0, "q < 0: block 0 lower");

  kt_begin("select: ties go to the lower block; a group's bound is the max over its heads (directed)");
  { /* q = 0: every bound 0, the lowest candidates are read (no skipping) */
    sl_shape s;
    kva_cache *c;
    kva_attn a;
    int seq = -1, n = 77, budgets[4] = {8, 20, 33, 60}, i;
    float *k, *v, q[4 * 8];
    s.H = 4, s.G = 2, s.D = s.Dv = 8, s.bs = 4, s.L = 1, s.kt = s.vt = KVA_F32;
    c = sl_cache(&s, 1, 32, 1);
    if (c) {
      k = KT_ALLOC(float, (size_t)n * 2 * 8), v = KT_ALLOC(float, (size_t)n * 2 * 8);
      sl_gen(r, &s, n, k, v);
      memset(q, 0, sizeof q);
      KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
      sl_step(c, seq, &s, k, v, n, 0, n);
      sl_attn(&a, &s);
      for (i = 0; i < 4; i++) {
        a.select_budget = budgets[i], a.select_sink = i, a.select_recent = 3 * i;
        sl_check(c, seq, 0, &a, q, 1, 4, KVA_F32, -1, 1, "q = 0: all bounds tie", NULL);
      }
      free(k), free(v);
      kva_cache_destroy(c);
    }
  }
  { /* H 2 / G 1, D 2: head 0 = (1, 0), head 1 = (0, 1); blocks A (10, -10), B (-10, 10), C (5, 5), D (-1, -1):
       max over heads picks A and B (10 each) before C (5); a sum would pick C (10) first */
    sl_shape s;
    kva_cache *c;
    kva_attn a;
    int seq = -1, j;
    float k[9 * 2], v[9 * 2], q[4] = {1.0f, 0.0f, 0.0f, 1.0f}, out[4];
    static const float pat[4][2] = {{-1.0f, -1.0f}, {10.0f, -10.0f}, {5.0f, 5.0f}, {-10.0f, 10.0f}};
    s.H = 2, s.G = 1, s.D = s.Dv = 2, s.bs = 2, s.L = 1, s.kt = s.vt = KVA_F32;
    c = sl_cache(&s, 1, 8, 1);
    if (c) {
      for (j = 0; j < 8; j++) {
        k[2 * j] = pat[j / 2][0], k[2 * j + 1] = pat[j / 2][1];
        v[2 * j] = (float)(j / 2), v[2 * j + 1] = -(float)(j / 2);
      }
      k[16] = k[17] = 0.0f, v[16] = v[17] = 0.0f; /* the query's own token: block 4, recent */
      KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
      sl_step(c, seq, &s, k, v, 9, 0, 9);
      sl_attn(&a, &s);
      a.select_budget = 5, a.select_recent = 1; /* 1 forced + 2 blocks of 2 */
      sl_check(c, seq, 0, &a, q, 1, 2, KVA_F32, -1, 1, "max over the group's heads", out);
      /* head 0 reads block 1 (10 . 1 scaled) and block 3 (-10): its output leans to block 1's value 1 */
      KT_CHECK(out[0] > 0.9f && out[2] > 2.9f, "max over heads: outputs %g %g (blocks 1 and 3 expected)",
               (double)out[0], (double)out[2]);
      kva_cache_destroy(c);
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Random shapes against the rule.                                          */

static void sl_random(kt_rng *r) {
  int it, iters = kt_iters(500);
  long skip0 = sl_pairs_skipped, tot0 = sl_pairs_total;
  kt_begin("select: random shapes, types, budgets and options against the fp64 rule");
  for (it = 0; it < iters; it++) {
    sl_shape s;
    kva_cache *c, *cn;
    kva_attn a;
    int n, n_q, step, seq = -1, seqn = -1, l, cn_case, nb, i;
    float *k, *v, *q, *sinks = NULL;
    char what[96];
    sl_rand_shape(r, &s, 128);
    cn_case = kt_int(r, 0, 9);
    n = cn_case == 0 ? 1 : cn_case == 1 ? (s.bs > 1 ? s.bs - 1 : 1) : cn_case == 2 ? s.bs : cn_case == 3 ? s.bs + 1
        : cn_case <= 5 ? kt_int(r, 2, 6 * s.bs + 2) : cn_case <= 7 ? kt_int(r, 200, 700)
        : cn_case == 8 && s.bs >= 3 && !kt_quick ? kt_int(r, 1800, 2200) : kt_int(r, 20, 400);
    n_q = n >= 2 && kt_int(r, 0, 2) == 0 ? kt_int(r, 2, n < 6 ? n : 6) : 1;
    step = n_q + kt_int(r, 0, n - n_q < 3 ? n - n_q : 3);
    nb = (n + s.bs - 1) / s.bs;
    sl_lean = kt_int(r, 0, 1);
    c = sl_cache(&s, 1, nb + 4, 2);
    cn = sl_cache(&s, 0, nb + 4, 2);
    sl_lean = 0;
    if (!c || !cn) {
      kva_cache_destroy(c), kva_cache_destroy(cn);
      continue;
    }
    k = KT_ALLOC(float, (size_t)s.L * n * s.G * s.D);
    v = KT_ALLOC(float, (size_t)s.L * n * s.G * s.Dv);
    q = KT_ALLOC(float, (size_t)n_q * s.H * s.D);
    sl_gen(r, &s, n, k, v);
    kt_fill(r, q, (size_t)n_q * s.H * s.D, -1.0f, 1.0f);
    {
      kt_rng r2 = *r; /* the same steps in both caches */
      if (!sl_build(r, c, &seq, &s, k, v, n, n, step) || !sl_build(&r2, cn, &seqn, &s, k, v, n, n, step)) goto next;
    }
    sl_attn(&a, &s);
    a.n_threads = kt_int(r, 1, 2);
    sl_rand_select(r, &a, n, s.bs);
    if (kt_int(r, 0, 5) == 0) a.window = kt_int(r, 1, n + 2), a.n_sink = kt_int(r, 0, 3);
    if (kt_int(r, 0, 7) == 0) a.chunk_size = kt_int(r, 1, n + 2);
    if (kt_int(r, 0, 5) == 0) a.softcap = 15.0f;
    if (kt_int(r, 0, 5) == 0) a.scale = 0.3f;
    if (kt_int(r, 0, 7) == 0) a.alibi_max_bias = 8.0f;
    if (kt_int(r, 0, 9) == 0) a.non_causal = 1;
    if (kt_int(r, 0, 7) == 0) {
      sinks = KT_ALLOC(float, s.H);
      kt_fill(r, sinks, (size_t)s.H, -1.0f, 2.0f);
      a.sink_logits = sinks;
    }
    if (sl_int_keys(s.kt) && kt_int(r, 0, 2) == 0) a.int_scores = 1;
    for (l = 0; l < s.L; l++) {
      float *o1 = KT_ALLOC(float, (size_t)n_q * s.H * s.Dv), *o2 = KT_ALLOC(float, (size_t)n_q * s.H * s.Dv);
      kva_attn a0 = a;
      kva_status st;
      snprintf(what, sizeof what, "random it %d layer %d", it, l);
      sl_check(c, seq, l, &a, q, n_q, s.bs, s.kt, -1, 0, what, NULL);
      /* the twin without bounds: unselected results equal bit for bit; a budget < n refused */
      a0.select_budget = 0;
      KT_STATUS(kva_attend_cache(c, seq, l, &a0, q, n_q, o1), KVA_OK);
      KT_STATUS(kva_attend_cache(cn, seqn, l, &a0, q, n_q, o2), KVA_OK);
      KT_CHECK(kt_same_bits(o1, o2, (size_t)n_q * s.H * s.Dv), "%s: bounds changed the unselected result", what);
      if (a.select_budget > 0 && a.select_budget < n) {
        kt_fill_sentinel(o2, (size_t)n_q * s.H * s.Dv);
        st = kva_attend_cache(cn, seqn, l, &a, q, n_q, o2);
        KT_CHECK(st == KVA_ERR_UNSUPPORTED && kt_all_sentinel(o2, (size_t)n_q * s.H * s.Dv),
                 "%s: a cache without bounds, budget %d < n %d: %s", what, a.select_budget, n, kva_status_str(st));
      }
      free(o1), free(o2);
    }
    { /* nothing evicted: slot j holds position j */
      int32_t *p = KT_ALLOC(int32_t, s.G);
      int badpos = 0, g;
      for (i = 0; i < n; i++) {
        kva_seq_read(c, seq, 0, i, NULL, NULL, p);
        for (g = 0; g < s.G; g++) badpos += p[g] != i;
      }
      KT_CHECK(badpos == 0, "random it %d: %d slots not at their positions", it, badpos);
      free(p);
    }
  next:
    kva_cache_destroy(c), kva_cache_destroy(cn);
    free(k), free(v), free(q), free(sinks);
  }
  KT_CHECK((sl_pairs_skipped - skip0) * 20 <= sl_pairs_total - tot0 + 20,
           "random: %ld of %ld (token, KV head) pairs skipped as near ties (more than 5 %%)", sl_pairs_skipped - skip0,
           sl_pairs_total - tot0);
}

/* ------------------------------------------------------------------------ */
/* Maintenance: fork, truncate, eviction, export / import.                  */

/* large keys (+-4 in every channel): if they reached a block's bounds the
   block would promise the largest score of all */
static void sl_big_keys(kt_rng *r, float *k, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) k[i] = kt_int(r, 0, 1) ? 4.0f : -4.0f;
}

static void sl_fork(kt_rng *r) {
  int it, iters = kt_iters(100);
  kt_begin("select: fork + appends to both (copy-on-write keeps each sequence's bounds its own)");
  for (it = 0; it < iters; it++) {
    sl_shape s;
    kva_cache *c;
    kva_attn a;
    int n0, sa, sb, total, seqa = -1, seqb = -1, l, nb;
    float *k, *v, *kb, *vb, *q;
    kva_cache_stats st0, st1;
    char what[96];
    sl_rand_shape(r, &s, 64);
    if (s.bs == 1) s.bs = 3;
    n0 = kt_int(r, 1, 5) * s.bs + kt_int(r, 1, s.bs - 1); /* a partly filled tail, shared after the fork */
    sa = kt_int(r, 1, s.bs + 2), sb = kt_int(r, 1, s.bs + 2);
    total = n0 + (sa > sb ? sa : sb);
    nb = (total + s.bs - 1) / s.bs;
    c = sl_cache(&s, 1, 2 * nb + 4, 4);
    if (!c) continue;
    k = KT_ALLOC(float, (size_t)s.L * total * s.G * s.D), v = KT_ALLOC(float, (size_t)s.L * total * s.G * s.Dv);
    kb = KT_ALLOC(float, (size_t)s.L * total * s.G * s.D), vb = KT_ALLOC(float, (size_t)s.L * total * s.G * s.Dv);
    q = KT_ALLOC(float, (size_t)s.H * s.D);
    sl_gen(r, &s, total, k, v);
    memcpy(kb, k, (size_t)s.L * total * s.G * s.D * sizeof(float));
    memcpy(vb, v, (size_t)s.L * total * s.G * s.Dv * sizeof(float));
    for (l = 0; l < s.L; l++) /* A appends large keys, B ordinary ones (the order of the appends alternates) */
      sl_big_keys(r, k + ((size_t)l * total + n0) * s.G * s.D, (size_t)sa * s.G * s.D);
    kt_fill(r, q, (size_t)s.H * s.D, -1.0f, 1.0f);
    if (!sl_build(r, c, &seqa, &s, k, v, total, n0, kt_int(r, 1, n0))) goto next;
    KT_STATUS(kva_seq_fork(c, seqa, &seqb), KVA_OK);
    kva_cache_get_stats(c, &st0);
    if (it % 2) {
      sl_step(c, seqb, &s, kb, vb, total, n0, n0 + sb);
      sl_step(c, seqa, &s, k, v, total, n0, n0 + sa);
    } else {
      sl_step(c, seqa, &s, k, v, total, n0, n0 + sa);
      sl_step(c, seqb, &s, kb, vb, total, n0, n0 + sb);
    }
    kva_cache_get_stats(c, &st1);
    KT_CHECK(st1.cow_copies > st0.cow_copies, "fork it %d: the shared tail was not copied (the case is not tested)",
             it);
    sl_attn(&a, &s);
    a.n_threads = kt_int(r, 1, 2);
    for (l = 0; l < s.L; l++) {
      a.select_budget = kt_int(r, 1, n0 + sb - 1);
      a.select_sink = kt_int(r, 0, 1) ? 0 : kt_int(r, 1, s.bs);
      a.select_recent = kt_int(r, 0, 1) ? 0 : kt_int(r, 1, 2);
      snprintf(what, sizeof what, "fork it %d layer %d: B (ordinary keys)", it, l);
      sl_check(c, seqb, l, &a, q, 1, s.bs, s.kt, -1, 0, what, NULL);
      a.select_budget = kt_int(r, 1, n0 + sa - 1);
      snprintf(what, sizeof what, "fork it %d layer %d: A (large keys)", it, l);
      sl_check(c, seqa, l, &a, q, 1, s.bs, s.kt, -1, 0, what, NULL);
    }
    { /* one plan over both: each sequence's kva_attend_cache bits */
      int seqs[2], nq2[2] = {1, 1}, m = n0 + (sa < sb ? sa : sb);
      size_t hd = (size_t)s.H * s.D, hv = (size_t)s.H * s.Dv;
      float *q2 = KT_ALLOC(float, 2 * hd), *o2 = KT_ALLOC(float, 2 * hv), *oa = KT_ALLOC(float, hv);
      float *ob = KT_ALLOC(float, hv);
      kva_batch *plan = NULL;
      kva_status st;
      seqs[0] = seqa, seqs[1] = seqb;
      memcpy(q2, q, hd * sizeof(float));
      kt_fill(r, q2 + hd, hd, -1.0f, 1.0f);
      a.select_budget = kt_int(r, 1, m - 1), a.select_sink = 0, a.select_recent = kt_int(r, 0, 2);
      KT_STATUS(kva_attend_cache(c, seqa, 0, &a, q2, 1, oa), KVA_OK);
      KT_STATUS(kva_attend_cache(c, seqb, 0, &a, q2 + hd, 1, ob), KVA_OK);
      st = kva_batch_plan(c, &a, seqs, nq2, 2, &plan);
      if (st == KVA_OK) st = kva_attend_batch(c, plan, 0, q2, o2);
      KT_CHECK(st == KVA_OK && kt_same_bits(o2, oa, hv) && kt_same_bits(o2 + hv, ob, hv),
               "fork it %d: a plan over both sequences (budget %d): %s, or not kva_attend_cache's bits", it,
               a.select_budget, kva_status_str(st));
      kva_batch_free(plan);
      free(q2), free(o2), free(oa), free(ob);
    }
  next:
    kva_cache_destroy(c);
    free(k), free(v), free(kb), free(vb), free(q);
  }
}

static void sl_truncate(kt_rng *r) {
  int it, iters = kt_iters(100);
  kt_begin("select: truncate then append (bit for bit at full budget; at most the cut block looser)");
  for (it = 0; it < iters; it++) {
    sl_shape s;
    kva_cache *c;
    kva_attn a;
    int n0, keep, s2, total, seq = -1, l, nb, n, fork_first = it % 3 == 0, other = -1;
    float *k, *v, *k2, *q;
    char what[96];
    sl_rand_shape(r, &s, 64);
    n0 = kt_int(r, 2, 8 * s.bs + 3);
    keep = kt_int(r, 1, n0 - 1);
    s2 = kt_int(r, 1, 2 * s.bs + 1);
    total = n0 > keep + s2 ? n0 : keep + s2;
    nb = (total + s.bs - 1) / s.bs;
    c = sl_cache(&s, 1, 2 * nb + 4, 4);
    if (!c) continue;
    k = KT_ALLOC(float, (size_t)s.L * total * s.G * s.D), v = KT_ALLOC(float, (size_t)s.L * total * s.G * s.Dv);
    k2 = KT_ALLOC(float, (size_t)s.L * total * s.G * s.D);
    q = KT_ALLOC(float, (size_t)s.H * s.D);
    sl_gen(r, &s, total, k, v);
    memcpy(k2, k, (size_t)s.L * total * s.G * s.D * sizeof(float));
    for (l = 0; l < s.L; l++) /* the tokens cut off have large keys */
      sl_big_keys(r, k + ((size_t)l * total + keep) * s.G * s.D, (size_t)(n0 - keep) * s.G * s.D);
    kt_fill(r, q, (size_t)s.H * s.D, -1.0f, 1.0f);
    if (!sl_build(r, c, &seq, &s, k, v, total, n0, kt_int(r, 1, n0))) goto next;
    if (fork_first) KT_STATUS(kva_seq_fork(c, seq, &other), KVA_OK); /* the cut block shared: copied later */
    KT_STATUS(kva_seq_truncate(c, seq, keep), KVA_OK);
    if (!sl_step(c, seq, &s, k2, v, total, keep, keep + s2)) goto next;
    n = keep + s2;
    sl_attn(&a, &s);
    a.n_threads = kt_int(r, 1, 2);
    for (l = 0; l < s.L; l++) {
      a.select_budget = kt_int(r, 0, 1) ? n : n + kt_int(r, 1, 9);
      a.select_sink = kt_int(r, 0, 3), a.select_recent = kt_int(r, 0, 3);
      snprintf(what, sizeof what, "truncate it %d layer %d: full budget", it, l);
      sl_check(c, seq, l, &a, q, 1, s.bs, s.kt, keep / s.bs, 0, what, NULL);
      sl_rand_select(r, &a, n, s.bs);
      snprintf(what, sizeof what, "truncate it %d layer %d: keep %d of %d, +%d", it, l, keep, n0, s2);
      sl_check(c, seq, l, &a, q, 1, s.bs, s.kt, keep / s.bs, 0, what, NULL);
    }
    if (other >= 0) { /* the fork still holds the cut tokens: its bounds are exact */
      KT_STATUS(kva_seq_append(c, other, 1), KVA_OK);
      for (l = 0; l < s.L; l++)
        KT_STATUS(kva_store(c, other, l, k2 + ((size_t)l * total) * s.G * s.D, v + ((size_t)l * total) * s.G * s.Dv, 1),
                  KVA_OK);
      sl_rand_select(r, &a, n0 + 1, s.bs);
      snprintf(what, sizeof what, "truncate it %d: the fork taken before", it);
      sl_check(c, other, 0, &a, q, 1, s.bs, s.kt, -1, 0, what, NULL);
    }
  next:
    kva_cache_destroy(c);
    free(k), free(v), free(k2), free(q);
  }
}

static void sl_evict(kt_rng *r) {
  int it, iters = kt_iters(80);
  kt_begin("select: WINDOW eviction (compaction rebuilds the bounds: the exact rule, kva_seq_read's positions)");
  for (it = 0; it < iters; it++) {
    sl_shape s;
    kva_cache *c;
    kva_attn a;
    kva_evict e;
    int budget, total = 0, steps, st_i, seq = -1, l, at = 0, last = 1, n_q, len, pos;
    int sizes[16];
    float *k, *v, *q;
    char what[96];
    sl_rand_shape(r, &s, 64);
    budget = kt_int(r, s.bs + 1, 6 * s.bs + 10);
    steps = kt_int(r, 6, 14);
    for (st_i = 0; st_i < steps; st_i++) {
      sizes[st_i] = kt_int(r, 0, 2) ? kt_int(r, 1, 3) : kt_int(r, 1, s.bs + 5);
      total += sizes[st_i];
    }
    while (total <= budget + s.bs) { /* enough to evict */
      sizes[steps - 1] += s.bs;
      total += s.bs;
    }
    c = sl_cache(&s, 1, (budget + 2 * total) / s.bs + 8, 2);
    if (!c) continue;
    k = KT_ALLOC(float, (size_t)s.L * total * s.G * s.D), v = KT_ALLOC(float, (size_t)s.L * total * s.G * s.Dv);
    q = KT_ALLOC(float, (size_t)6 * s.H * s.D);
    sl_gen(r, &s, total, k, v);
    for (l = 0; l < s.L; l++) /* early large keys, evicted later (unless sinks) */
      sl_big_keys(r, k + (size_t)l * total * s.G * s.D, (size_t)(total / 3) * s.G * s.D);
    KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
    memset(&e, 0, sizeof e);
    e.kind = KVA_EVICT_WINDOW, e.budget = budget, e.n_sink = kt_int(r, 0, 1) ? 0 : kt_int(r, 1, 3);
    KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
    sl_attn(&a, &s);
    a.n_threads = kt_int(r, 1, 2);
    for (st_i = 0; st_i < steps; st_i++) {
      if (!sl_step(c, seq, &s, k, v, total, at, at + sizes[st_i])) break;
      at += sizes[st_i];
      last = sizes[st_i];
      if (st_i >= steps / 2 && kt_int(r, 0, 2) == 0) { /* attend along the way too */
        len = kva_seq_len(c, seq);
        sl_rand_select(r, &a, len, s.bs);
        kt_fill(r, q, (size_t)s.H * s.D, -1.0f, 1.0f);
        snprintf(what, sizeof what, "evict it %d step %d", it, st_i);
        sl_check(c, seq, 0, &a, q, 1, s.bs, s.kt, -1, 0, what, NULL);
      }
    }
    if (at != total) goto next;
    len = kva_seq_len(c, seq), pos = kva_seq_pos(c, seq);
    KT_CHECK(len < pos, "evict it %d: nothing evicted (len %d pos %d): the case is not tested", it, len, pos);
    n_q = kt_int(r, 1, last < 6 ? last : 6);
    kt_fill(r, q, (size_t)n_q * s.H * s.D, -1.0f, 1.0f);
    for (l = 0; l < s.L; l++) {
      sl_rand_select(r, &a, len, s.bs);
      if (kt_int(r, 0, 1)) a.select_budget = kt_int(r, 1, len > 1 ? len - 1 : 1);
      snprintf(what, sizeof what, "evict it %d layer %d (budget %d held %d pos %d)", it, l, budget, len, pos);
      sl_check(c, seq, l, &a, q, n_q, s.bs, s.kt, -1, 0, what, NULL);
    }
  next:
    kva_cache_destroy(c);
    free(k), free(v), free(q);
  }
}

static void sl_import(kt_rng *r) {
  int it, iters = kt_iters(80);
  kt_begin("select: export / import into a fresh cache (bounds rebuilt: the exact rule, any block size)");
  for (it = 0; it < iters; it++) {
    sl_shape s, s2;
    kva_cache *c, *c2 = NULL, *c3 = NULL;
    kva_attn a;
    int n0, keep, s_last, total, seq = -1, seq2 = -1, seq3 = -1, l, n, n_q;
    float *k, *v, *q, *out;
    size_t need = 0, wrote = 0;
    unsigned char *buf = NULL;
    char what[96];
    kva_status st;
    sl_rand_shape(r, &s, 64);
    n0 = kt_int(r, 2, 10 * s.bs + 5);
    keep = kt_int(r, 1, n0);
    s_last = kt_int(r, 1, 5);
    total = n0 + s_last;
    c = sl_cache(&s, 1, 2 * (total / s.bs) + 6, 2);
    if (!c) continue;
    k = KT_ALLOC(float, (size_t)s.L * total * s.G * s.D), v = KT_ALLOC(float, (size_t)s.L * total * s.G * s.Dv);
    q = KT_ALLOC(float, (size_t)s_last * s.H * s.D);
    out = KT_ALLOC(float, (size_t)s_last * s.H * s.Dv);
    sl_gen(r, &s, total, k, v);
    for (l = 0; l < s.L; l++) /* cut off below (when keep < n0): the source's cut block may be loose */
      sl_big_keys(r, k + ((size_t)l * total + keep) * s.G * s.D, (size_t)(n0 - keep) * s.G * s.D);
    if (!sl_build(r, c, &seq, &s, k, v, total, n0, kt_int(r, 1, n0))) goto next;
    if (keep < n0) KT_STATUS(kva_seq_truncate(c, seq, keep), KVA_OK);
    {
      /* the next step: ordinary keys from position keep on (regenerated into a fresh buffer) */
      float *k2 = KT_ALLOC(float, (size_t)s.L * total * s.G * s.D);
      float *v2 = KT_ALLOC(float, (size_t)s.L * total * s.G * s.Dv);
      sl_gen(r, &s, total, k2, v2);
      if (!sl_step(c, seq, &s, k2, v2, total, keep, keep + s_last)) {
        free(k2), free(v2);
        goto next;
      }
      free(k2), free(v2);
    }
    n = keep + s_last;
    st = kva_seq_export(c, seq, NULL, 0, &need);
    KT_CHECK(st == KVA_OK && need > 0, "import it %d: export size %s", it, kva_status_str(st));
    if (st != KVA_OK) goto next;
    buf = KT_ALLOC(unsigned char, need);
    KT_STATUS(kva_seq_export(c, seq, buf, need, &wrote), KVA_OK);
    s2 = s;
    s2.bs = sl_bss[kt_int(r, 0, 3)];
    c2 = sl_cache(&s2, 1, n / s2.bs + 6, 2);
    c3 = sl_cache(&s2, 0, n / s2.bs + 6, 2);
    if (!c2 || !c3) goto next;
    KT_STATUS(kva_seq_import(c2, buf, wrote, &seq2), KVA_OK);
    KT_STATUS(kva_seq_import(c3, buf, wrote, &seq3), KVA_OK);
    sl_attn(&a, &s);
    a.n_threads = kt_int(r, 1, 2);
    n_q = kt_int(r, 1, s_last);
    kt_fill(r, q, (size_t)n_q * s.H * s.D, -1.0f, 1.0f);
    for (l = 0; l < s.L; l++) {
      sl_rand_select(r, &a, n, s2.bs);
      if (kt_int(r, 0, 2)) a.select_budget = kt_int(r, 1, n > 1 ? n - 1 : 1);
      snprintf(what, sizeof what, "import it %d layer %d (bs %d -> %d, keep %d of %d)", it, l, s.bs, s2.bs, keep, n0);
      sl_check(c2, seq2, l, &a, q, n_q, s2.bs, s.kt, -1, 0, what, NULL);
      kt_fill_sentinel(out, (size_t)n_q * s.H * s.Dv);
      st = kva_attend_cache(c3, seq3, l, &a, q, n_q, out);
      if (a.select_budget > 0 && a.select_budget < n)
        KT_CHECK(st == KVA_ERR_UNSUPPORTED && kt_all_sentinel(out, (size_t)n_q * s.H * s.Dv),
                 "%s: imported into a cache without bounds, budget %d < %d: %s", what, a.select_budget, n,
                 kva_status_str(st));
      else
        KT_CHECK(st == KVA_OK, "%s: imported into a cache without bounds, budget %d of %d: %s", what, a.select_budget,
                 n, kva_status_str(st));
    }
  next:
    kva_cache_destroy(c), kva_cache_destroy(c2), kva_cache_destroy(c3);
    free(k), free(v), free(q), free(out), free(buf);
  }
}

/* ------------------------------------------------------------------------ */
/* kva_gqa_forward with a budget, against an fp64 layer over the cache rows.  */

static void sl_gqa(kt_rng *r) {
  enum { DM = 24, H = 4, G = 2, D = 16, BS = 4 };
  int it, iters = kt_iters(12);
  kt_begin("select: kva_gqa_forward with a budget (fp64 layer over the stored rows)");
  for (it = 0; it < iters; it++) {
    sl_shape s;
    kva_cache *c, *cn;
    kva_gqa_layer L;
    int seq = -1, seqn = -1, fork = -1, n0 = kt_int(r, 40, 120), steps = 4, st_i, h, t, g, n_q, bad = 0, skipped = 0;
    float *wq, *wk, *wv, *wo, *bq, *x, *y, *y2;
    double worst = 0.0;
    s.H = H, s.G = G, s.D = s.Dv = D, s.bs = BS, s.L = 1, s.kt = s.vt = it % 2 ? KVA_F32 : KVA_F16;
    c = sl_cache(&s, 1, 128, 4);
    cn = sl_cache(&s, 0, 128, 2);
    if (!c || !cn) {
      kva_cache_destroy(c), kva_cache_destroy(cn);
      continue;
    }
    wq = KT_ALLOC(float, H * D * DM), wk = KT_ALLOC(float, G * D * DM), wv = KT_ALLOC(float, G * D * DM);
    wo = KT_ALLOC(float, DM * H * D), bq = KT_ALLOC(float, H * D);
    x = KT_ALLOC(float, (size_t)n0 * DM), y = KT_ALLOC(float, (size_t)n0 * DM), y2 = KT_ALLOC(float, (size_t)n0 * DM);
    kt_fill(r, wq, H * D * DM, -0.6f, 0.6f), kt_fill(r, wk, G * D * DM, -0.6f, 0.6f);
    kt_fill(r, wv, G * D * DM, -0.5f, 0.5f), kt_fill(r, wo, DM * H * D, -0.25f, 0.25f);
    kt_fill(r, bq, H * D, -0.3f, 0.3f);
    memset(&L, 0, sizeof L);
    L.d_model = DM;
    kt_attn_init(&L.attn, H, G, D, 0);
    L.wq = wq, L.bq = bq, L.wk = wk, L.wv = wv, L.wo = wo;
    KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
    KT_STATUS(kva_seq_new(cn, &seqn), KVA_OK);
    kt_fill(r, x, (size_t)n0 * DM, -1.0f, 1.0f);
    KT_STATUS(kva_seq_append(c, seq, n0), KVA_OK);
    KT_STATUS(kva_gqa_forward(&L, c, seq, 0, x, n0, y), KVA_OK); /* prefill, unselected */
    KT_STATUS(kva_seq_append(cn, seqn, n0), KVA_OK);
    KT_STATUS(kva_gqa_forward(&L, cn, seqn, 0, x, n0, y), KVA_OK);
    for (st_i = 0; st_i < steps; st_i++) {
      sl_rows R;
      double *bd, qd[H * D], att[H * D], lse[H], yr[DM];
      unsigned char *sel;
      float qf[H * D];
      int n, i, j;
      n_q = st_i == 1 ? 3 : 1;
      kt_fill(r, x, (size_t)n_q * DM, -1.0f, 1.0f);
      L.attn.select_budget = kt_int(r, 2 * BS, 6 * BS);
      L.attn.select_sink = kt_int(r, 0, 5);
      L.attn.select_recent = kt_int(r, 0, 5);
      KT_STATUS(kva_seq_append(c, seq, n_q), KVA_OK);
      kt_fill_sentinel(y, (size_t)n_q * DM);
      KT_STATUS(kva_gqa_forward(&L, c, seq, 0, x, n_q, y), KVA_OK);
      /* the reference: q in fp64 from x, the rows as stored, the rule's blocks, the output projection */
      if (!sl_read(c, seq, 0, G, D, D, &R)) break;
      n = R.n;
      bd = sl_bounds(&R, BS);
      sel = KT_ALLOC(unsigned char, (size_t)(n + BS) / BS + 1);
      for (t = 0; t < n_q; t++) {
        ref_attn_cfg cf = ref_cfg(&L.attn);
        int32_t qpos = (int32_t)(n - n_q + t);
        double ymax = 0.0, e = 0.0;
        for (i = 0; i < H * D; i++) {
          double acc = (double)bq[i];
          for (j = 0; j < DM; j++) acc += (double)wq[(size_t)i * DM + j] * (double)x[(size_t)t * DM + j];
          qd[i] = acc;
          qf[i] = (float)acc;
        }
        for (g = 0; g < G; g++) {
          double gap;
          memset(sel, 0, (size_t)(n + BS) / BS + 1);
          gap = sl_select(sl_row_n(n, n_q, t, &L.attn), BS, L.attn.select_budget, L.attn.select_sink,
                          L.attn.select_recent, &cf, qpos, bd, H, G, D, g, qf, sel, -1, NULL, NULL);
          if (gap < SL_MARGIN) break;
          sl_ref_group(&cf, qd, qpos, &R, BS, sel, g, att, lse);
        }
        if (g < G) {
          skipped++;
          continue;
        }
        for (i = 0; i < DM; i++) {
          double acc = 0.0;
          for (h = 0; h < H * D; h++) acc += (double)wo[(size_t)i * H * D + h] * att[h];
          yr[i] = acc;
          if (fabs(acc) > ymax) ymax = fabs(acc);
        }
        for (i = 0; i < DM; i++) {
          double d = fabs((double)y[(size_t)t * DM + i] - yr[i]);
          if (!(d <= 1e300)) d = INFINITY;
          if (d > e) e = d;
        }
        e /= 1e-4 * (1.0 + ymax);
        if (e > worst) worst = e;
        bad += !(e <= 1.0);
      }
      sl_pairs_total += n_q, sl_pairs_skipped += skipped;
      free(bd), free(sel);
      sl_rows_free(&R);
      /* a cache without bounds refuses the budget (y untouched) */
      KT_STATUS(kva_seq_append(cn, seqn, n_q), KVA_OK);
      kt_fill_sentinel(y2, (size_t)n_q * DM);
      KT_STATUS(kva_gqa_forward(&L, cn, seqn, 0, x, n_q, y2), KVA_ERR_UNSUPPORTED);
      KT_CHECK(kt_all_sentinel(y2, (size_t)n_q * DM), "gqa it %d: a refused forward wrote y", it);
      {
        int b = L.attn.select_budget; /* and attends in full with a budget >= n (stores what it skipped) */
        L.attn.select_budget = n + 1;
        KT_STATUS(kva_gqa_forward(&L, cn, seqn, 0, x, n_q, y2), KVA_OK);
        L.attn.select_budget = b;
      }
    }
    KT_CHECK(bad == 0, "gqa it %d: %d steps' y differ from the fp64 layer (worst err/tol %.3g)", it, bad, worst);
    KT_CHECK(skipped <= 2, "gqa it %d: %d query tokens skipped as near ties", it, skipped);
    /* a budget >= n through the layer: bit for bit the unselected forward (on a fork, the same state) */
    KT_STATUS(kva_seq_fork(c, seq, &fork), KVA_OK);
    KT_STATUS(kva_seq_append(c, seq, 1), KVA_OK);
    KT_STATUS(kva_seq_append(c, fork, 1), KVA_OK);
    kt_fill(r, x, DM, -1.0f, 1.0f);
    L.attn.select_budget = 0;
    KT_STATUS(kva_gqa_forward(&L, c, seq, 0, x, 1, y), KVA_OK);
    L.attn.select_budget = kva_seq_len(c, fork) + kt_int(r, 0, 3);
    KT_STATUS(kva_gqa_forward(&L, c, fork, 0, x, 1, y2), KVA_OK);
    KT_CHECK(kt_same_bits(y, y2, DM), "gqa it %d: budget %d >= n differs from the unselected forward", it,
             L.attn.select_budget);
    kva_cache_destroy(c), kva_cache_destroy(cn);
    free(wq), free(wk), free(wv), free(wo), free(bq), free(x), free(y), free(y2);
  }
}

/* ------------------------------------------------------------------------ */
/* A property check (not a rule): concentrated attention survives selection. */

static void sl_needle(kt_rng *r) {
  int it, iters = kt_iters(24);
  kt_begin("select: needle blocks (property): within 1e-2 of full attention; a needle's value comes out");
  for (it = 0; it < iters; it++) {
    sl_shape s;
    kva_cache *c;
    kva_attn a;
    int n = kt_int(r, 300, 1500), n_q = it % 3 == 0 ? 4 : 1, seq = -1, nb, nn = it % 2 ? 1 : 2, i, b, g, h, t, j, cc;
    int needles[2], bad = 0, badv = 0, badm = 0;
    float *k, *v, *q, *full, *sel, *w;
    double worst = 0.0;
    s.H = it % 4 == 0 ? 8 : 4, s.G = 2, s.D = it % 3 == 2 ? 128 : 64, s.Dv = 32, s.bs = it % 2 ? 16 : 32, s.L = 1;
    s.kt = sl_types[it % 6], s.vt = KVA_F16;
    nb = (n + s.bs - 1) / s.bs;
    c = sl_cache(&s, 1, nb + 2, 1);
    if (!c) continue;
    k = KT_ALLOC(float, (size_t)n * s.G * s.D), v = KT_ALLOC(float, (size_t)n * s.G * s.Dv);
    q = KT_ALLOC(float, (size_t)n_q * s.H * s.D), w = KT_ALLOC(float, (size_t)s.G * s.Dv);
    full = KT_ALLOC(float, (size_t)n_q * s.H * s.Dv), sel = KT_ALLOC(float, (size_t)n_q * s.H * s.Dv);
    /* one query direction per KV head (its heads and tokens near it); keys small, needle keys along it */
    {
      float *dir = KT_ALLOC(float, (size_t)s.G * s.D);
      kt_fill(r, dir, (size_t)s.G * s.D, -1.0f, 1.0f);
      for (t = 0; t < n_q; t++)
        for (h = 0; h < s.H; h++)
          for (cc = 0; cc < s.D; cc++)
            q[((size_t)t * s.H + h) * s.D + cc] = dir[(h / (s.H / s.G)) * s.D + cc] + kt_uniform(r, -0.1f, 0.1f);
      kt_fill(r, k, (size_t)n * s.G * s.D, -0.1f, 0.1f);
      kt_fill(r, v, (size_t)n * s.G * s.Dv, -1.0f, 1.0f);
      kt_fill(r, w, (size_t)s.G * s.Dv, -1.0f, 1.0f);
      needles[0] = kt_int(r, 1, nb / 2 - 1);
      needles[1] = kt_int(r, nb / 2, nb - 3);
      for (i = 0; i < nn; i++)
        for (j = needles[i] * s.bs; j < needles[i] * s.bs + s.bs; j++)
          for (g = 0; g < s.G; g++) {
            for (cc = 0; cc < s.D; cc++)
              k[((size_t)j * s.G + g) * s.D + cc] = dir[g * s.D + cc] + kt_uniform(r, -0.02f, 0.02f);
            for (cc = 0; cc < s.Dv; cc++) /* one needle: a constant value per KV head */
              v[((size_t)j * s.G + g) * s.Dv + cc] = nn == 1 ? w[g * s.Dv + cc] : kt_uniform(r, -1.0f, 1.0f);
          }
      free(dir);
    }
    KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
    if (!sl_step(c, seq, &s, k, v, n, 0, n - n_q) || !sl_step(c, seq, &s, k, v, n, n - n_q, n)) goto next;
    sl_attn(&a, &s);
    /* q . needle key ~ D / 3 (dir uniform in +-1): scores ~ 12 against ~ 1.2 / sqrt(D) for the others; the
       needles' bounds (~ D / 3) are far above the others' (~ 0.1 D / 2) */
    a.scale = 36.0f / (float)s.D;
    KT_STATUS(kva_attend_cache(c, seq, 0, &a, q, n_q, full), KVA_OK);
    /* the recent blocks (the last one or two), the needles and maybe a spare block, for every row */
    a.select_recent = kt_int(r, 1, s.bs);
    a.select_budget = a.select_recent + s.bs + (nn + kt_int(r, 0, 1)) * s.bs; /* the recent ones take < recent + bs */
    sl_check(c, seq, 0, &a, q, n_q, s.bs, s.kt, -1, 0, "needle", sel);
    /* the premise: the needles hold >= 99 % of the full attention (fp64 over the read-back rows) */
    {
      sl_rows R;
      unsigned char *all = KT_ALLOC(unsigned char, (size_t)nb), *nd = KT_ALLOC(unsigned char, (size_t)nb);
      double *qd = KT_ALLOC(double, (size_t)s.H * s.D), ro[8 * 32], rl[8], rn[8 * 32], rln[8];
      ref_attn_cfg cf = ref_cfg(&a);
      if (sl_read(c, seq, 0, s.G, s.D, s.Dv, &R)) {
        memset(all, 1, (size_t)nb);
        memset(nd, 0, (size_t)nb);
        for (i = 0; i < nn; i++) nd[needles[i]] = 1;
        for (t = 0; t < n_q; t++) {
          for (i = 0; i < s.H * s.D; i++) qd[i] = (double)q[(size_t)t * s.H * s.D + i];
          for (g = 0; g < s.G; g++) {
            sl_ref_group(&cf, qd, (int32_t)(n - n_q + t), &R, s.bs, all, g, ro, rl);
            sl_ref_group(&cf, qd, (int32_t)(n - n_q + t), &R, s.bs, nd, g, rn, rln);
            for (h = g * (s.H / s.G); h < (g + 1) * (s.H / s.G); h++) badm += exp(rln[h] - rl[h]) < 0.99;
          }
        }
        sl_rows_free(&R);
      }
      free(all), free(nd), free(qd);
    }
    KT_CHECK(badm == 0, "needle it %d: the needles hold < 99 %% of the mass in %d rows (the premise)", it, badm);
    for (i = 0; i < n_q * s.H * s.Dv; i++) {
      double e = fabs((double)sel[i] - (double)full[i]);
      if (!(e <= 1e300)) e = INFINITY;
      if (e > worst) worst = e;
      bad += !(e <= 1e-2);
    }
    KT_CHECK(bad == 0, "needle it %d (%d needles, n %d bs %d %s): selected vs full attention max |diff| %.3g > 1e-2",
             it, nn, n, s.bs, kva_dtype_name(s.kt), worst);
    if (nn == 1)
      for (t = 0; t < n_q; t++)
        for (h = 0; h < s.H; h++)
          for (b = 0; b < s.Dv; b++) {
            double want = (double)kva_f16_to_f32(kva_f32_to_f16(w[(h / (s.H / s.G)) * s.Dv + b]));
            badv += !(fabs((double)sel[((size_t)t * s.H + h) * s.Dv + b] - want) <= 2e-2);
          }
    KT_CHECK(badv == 0, "needle it %d: %d outputs not the needle's value", it, badv);
  next:
    kva_cache_destroy(c);
    free(k), free(v), free(q), free(w), free(full), free(sel);
  }
}

/* ------------------------------------------------------------------------ */
/* Layer groups: selection inside a WINDOW or CHUNK group's span.           */

/* Layer 0 FULL, the others in one WINDOW or CHUNK group; a sequence grown in
   steps (the group releases what no query can see), then forked with the
   fork's tail appended (copy-on-write in both pools). Each layer selects
   under the rule with the span's window / sinks / chunk stated in the call,
   and without them (the group's own apply: the same bits). */
static void sl_groups(kt_rng *r) {
  int it, iters = kt_iters(150);
  kt_begin("select: inside WINDOW and CHUNK layer groups (released blocks, copy-on-write, the group's span)");
  for (it = 0; it < iters; it++) {
    sl_shape s;
    kva_cache *c;
    kva_attn a;
    kva_layer_group grp[2];
    int lg[3] = {0, 1, 1}, n, n_q, nb, seq = -1, fork = -1, l, extra, total;
    float *k, *v, *q;
    char what[128];
    sl_rand_shape(r, &s, 64);
    s.L = kt_int(r, 2, 3);
    memset(grp, 0, sizeof grp);
    grp[1].kind = kt_int(r, 0, 1) ? KVA_SPAN_WINDOW : KVA_SPAN_CHUNK;
    if (grp[1].kind == KVA_SPAN_WINDOW) {
      grp[1].window = kt_int(r, 1, 6 * s.bs + 3);
      grp[1].n_sink = kt_int(r, 0, 2) ? 0 : kt_int(r, 1, 2 * s.bs + 1);
    } else {
      grp[1].chunk_size = kt_int(r, 1, 8 * s.bs + 3);
    }
    n = kt_int(r, 1, 2) == 1 ? kt_int(r, 1, 4 * s.bs) : kt_int(r, 4 * s.bs, kt_quick ? 300 : 900);
    n_q = n >= 2 && kt_int(r, 0, 2) == 0 ? kt_int(r, 2, n < 5 ? n : 5) : 1;
    extra = kt_int(r, 1, s.bs + 1);
    total = n + extra;
    nb = (total + s.bs - 1) / s.bs;
    grp[1].n_blocks = 2 * nb + 4; /* a prefill step holds all its blocks until the next append */
    sl_n_groups = 2, sl_group_list = grp, sl_layer_groups = lg;
    c = sl_cache(&s, 1, 2 * nb + 4, 3);
    sl_n_groups = 0;
    if (!c) continue;
    k = KT_ALLOC(float, (size_t)s.L * total * s.G * s.D);
    v = KT_ALLOC(float, (size_t)s.L * total * s.G * s.Dv);
    q = KT_ALLOC(float, (size_t)n_q * s.H * s.D);
    sl_gen(r, &s, total, k, v);
    /* large keys in the partly filled last block: the fork shares it, the first appender copies it, and its
       bounds must come along (else they would lose these keys and rank the block low) */
    for (l = 0; l < s.L; l++)
      sl_big_keys(r, k + ((size_t)l * total + n / s.bs * s.bs) * s.G * s.D, (size_t)(n % s.bs) * s.G * s.D);
    kt_fill(r, q, (size_t)n_q * s.H * s.D, -1.0f, 1.0f);
    if (!sl_build(r, c, &seq, &s, k, v, total, n, n_q)) goto next;
    sl_attn(&a, &s);
    sl_released_ok = 1;
    for (l = 0; l < s.L; l++) {
      kva_attn aspan;
      int ab;
      sl_attn(&a, &s);
      a.n_threads = kt_int(r, 1, 2);
      sl_rand_select(r, &a, n, s.bs);
      if (lg[l]) { /* the group's span, stated */
        a.window = grp[1].window, a.n_sink = grp[1].n_sink, a.chunk_size = grp[1].chunk_size;
      } else if (kt_int(r, 0, 3) == 0) { /* a FULL layer under a call's own window */
        a.window = kt_int(r, 1, n + 2), a.n_sink = kt_int(r, 0, 3);
      }
      snprintf(what, sizeof what, "groups it %d layer %d (%s %d sinks %d, n %d bs %d)", it, l,
               lg[l] ? (grp[1].kind == KVA_SPAN_WINDOW ? "window" : "chunk") : "full",
               lg[l] ? grp[1].window + grp[1].chunk_size : a.window, a.n_sink, n, s.bs);
      sl_check(c, seq, l, &a, q, n_q, s.bs, s.kt, -1, 0, what, NULL);
      if (!lg[l]) continue;
      { /* the group's own span when the call states none: the same bits */
        size_t no = (size_t)n_q * s.H * s.Dv;
        float *o1 = KT_ALLOC(float, no), *o2 = KT_ALLOC(float, no);
        aspan = a;
        aspan.window = aspan.n_sink = aspan.chunk_size = 0;
        ab = kva_attend_cache(c, seq, l, &a, q, n_q, o1) == KVA_OK &&
             kva_attend_cache(c, seq, l, &aspan, q, n_q, o2) == KVA_OK;
        KT_CHECK(ab && kt_same_bits(o1, o2, no), "%s: the group's span implied: not the stated span's bits", what);
        free(o1), free(o2);
      }
    }
    /* fork, then both append: the shared partly filled blocks are copied, bounds with them */
    KT_STATUS(kva_seq_fork(c, seq, &fork), KVA_OK);
    if (fork >= 0) {
      float *kb = KT_ALLOC(float, (size_t)s.L * total * s.G * s.D);
      memcpy(kb, k, (size_t)s.L * total * s.G * s.D * sizeof(float));
      for (l = 0; l < s.L; l++) sl_big_keys(r, kb + ((size_t)l * total + n) * s.G * s.D, (size_t)extra * s.G * s.D);
      if (sl_step(c, seq, &s, k, v, total, n, total) && sl_step(c, fork, &s, kb, v, total, n, total))
        for (l = 0; l < s.L; l++) {
          sl_attn(&a, &s);
          sl_rand_select(r, &a, total, s.bs);
          if (lg[l]) a.window = grp[1].window, a.n_sink = grp[1].n_sink, a.chunk_size = grp[1].chunk_size;
          snprintf(what, sizeof what, "groups it %d layer %d after a fork: the ordinary sequence", it, l);
          sl_check(c, seq, l, &a, q, 1, s.bs, s.kt, -1, 0, what, NULL);
          snprintf(what, sizeof what, "groups it %d layer %d after a fork: the large keys' sequence", it, l);
          sl_check(c, fork, l, &a, q, 1, s.bs, s.kt, -1, 0, what, NULL);
        }
      free(kb);
    }
    sl_released_ok = 0;
  next:
    kva_cache_destroy(c);
    free(k), free(v), free(q);
  }
}

void test_select(void) {
  kt_rng r;
  kt_seed(&r, 0x5e1ec7);
  sl_worst_ratio = 0.0;
  sl_pairs_total = sl_pairs_skipped = 0;
  sl_rounding_helpers();
  sl_errors(&r);
  sl_directed(&r);
  sl_random(&r);
  sl_fork(&r);
  sl_truncate(&r);
  sl_evict(&r);
  sl_import(&r);
  sl_groups(&r);
  sl_gqa(&r);
  sl_needle(&r);
  kt_begin("select: near ties skipped, over the whole section");
  KT_CHECK(sl_pairs_skipped * 20 <= sl_pairs_total + 20, "%ld of %ld (token, KV head) pairs skipped as near ties",
           sl_pairs_skipped, sl_pairs_total);
  if (getenv("KVA_TEST_VERBOSE"))
    fprintf(stderr, "  select: worst err/tol %.3f; %ld of %ld (token, KV head) pairs skipped as near ties\n",
            sl_worst_ratio, sl_pairs_skipped, sl_pairs_total);
}
