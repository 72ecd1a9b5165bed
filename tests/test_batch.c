/* test_batch.c - split-K inside kva_attend / kva_attend_cache, kva_merge_lse,
 * and batched attention over a paged cache (kva_batch_plan / kva_attend_batch).
 *
 * Every result is compared with ref_attend (fp64, tests/ref.h); for the cache,
 * over the cache's own read-back (kva_seq_read: values, and per-KV-head
 * positions, so H2O-evicted sequences are covered), so storage adds no error.
 *
 * Tolerances (as test_attend.c: split-K only reassociates float sums, and the
 * merge adds a handful of float operations per row):
 *   out: max |out - ref| <= 2e-5 * (1 + max|v|)
 *   lse: |lse - ref|     <= 1e-5 * (1 + |ref lse|)
 * for F32, F16, BF16 and INT8 storage alike (the reference reads the stored
 * values back).  Rows that see no key: exact zeros and lse == -INFINITY.
 * kva_merge_lse against the merge formula evaluated in double:
 *   out: <= 1e-6 * (1 + max(|out_a|, |out_b|)),  lse: <= 1e-6 * (1 + |lse|).
 * KVA_TEST_VERBOSE=1 prints the worst error / tolerance of each kind.
 *
 * A. split-K: MQA and small-G shapes (fewer than 8 (KV head, 64-row chunk)
 *    items) with n_kv 1024..9000 including 2047/2048/2049/4097 and lengths
 *    that are not multiples of 64, head dims that are not multiples of 16,
 *    lse on/off, windows and sinks, explicit positions (early queries, reversed
 *    and shuffled keys) so that whole splits see no key, soft-cap, large
 *    scores; n_threads 1 and 2 bit-identical; decode (n_q == 1) never calls
 *    KVATTN_MALLOC (docs/API.md), every allocation is freed.  Then the paged cache
 *    (F32/F16/BF16/INT8, sequences of thousands of tokens, odd block sizes).
 * B. kva_merge_lse: random key sets split in two (cut points incl. empty
 *    halves, random and interleaved masks), each half attended with
 *    kva_attend (lse), merged, == reference over the whole set; -inf parts
 *    (bit-exact no-op / take the other part / both -inf -> zeros and -inf);
 *    lse 1e3 and more apart; cascade (shared prefix once + per-request
 *    suffixes); argument checks, buffers unchanged on error.
 * D. kva_batch_plan / kva_attend_batch: random batches (1-20 sequences,
 *    prefill chunks and decode, lengths 1..6000, 1-3 layers, F16/F32/INT8,
 *    forks sharing blocks, H2O sequences, n_q 0, subsets in random order)
 *    against two things: the reference, and kva_attend_cache per sequence on
 *    a mirrored second cache (every operation applied to both, so H2O scores
 *    and evictions must stay identical: read-backs compared bit for bit);
 *    bit-identical when neither path splits by the documented rule (8 items,
 *    1024 keys per split), else the tolerance above; plans with n_threads 1
 *    and 2 bit-identical; kva_attend_batch allocates nothing; stale plans
 *    (length changed, truncated, freed sequences), same-length "stale" plans
 *    under eviction, argument errors, failed plans leave *plan NULL, every
 *    allocation of this file's library copy freed at the end. */
#include <stdlib.h>
#include <time.h>

#include "count_alloc.h"
#include "kvattn.h"
#include "harness.h"
#include "ref.h"

#define KB_TOL_OUT 2e-5
#define KB_TOL_LSE 1e-5
#define KB_TOL_MERGE 1e-6
#define KB_GUARD 8
#define KB_MAXS 32

static double kb_worst_out, kb_worst_lse, kb_worst_merge_out, kb_worst_merge_lse, kb_worst_pair;
static long kb_n_split_cases, kb_n_bitident, kb_n_tolcmp, kb_n_neg_inf_rows;

static int kb_cdiv(int a, int b) { return (a + b - 1) / b; }

/* float -> double copy, one extra zeroed element (so n == 0 is fine) */
static double *kb_dup(const float *x, size_t n) {
  double *d = (double *)calloc(n + 1, sizeof(double));
  size_t i;
  if (!d) abort();
  for (i = 0; i < n; i++) d[i] = (double)x[i];
  return d;
}

/* the documented split rule: a call with fewer than 8 (KV head, 64-row chunk)
   items splits each item's keys into parts of >= 1024 keys */
static int kb_would_split(int items, int n_kv) { return items < 8 && n_kv >= 2048; }

/* random permutation of base .. base + n - 1 */
static void kb_perm(kt_rng *r, int32_t *p, int n, int base) {
  int i;
  for (i = 0; i < n; i++) p[i] = base + i;
  for (i = n - 1; i > 0; i--) {
    int j = kt_int(r, 0, i);
    int32_t t = p[i];
    p[i] = p[j];
    p[j] = t;
  }
}

/* out [rows][Dv] (lse [rows] or NULL) against ro / rl.  Rows with rl == -inf
   must be exact zeros (and lse -inf). */
static void kb_check_rows(const char *label, const char *shape, const float *out, const float *lse,
                          const double *ro, const double *rl, size_t rows, int Dv, double vmax) {
  size_t i, where = 0;
  double tol = KB_TOL_OUT * (1.0 + vmax), err = ref_max_err(out, ro, rows * (size_t)Dv, &where);
  int bad_zero = 0, bad_lse = 0;
  if (err / tol > kb_worst_out) kb_worst_out = err / tol;
  KT_CHECK(err <= tol, "%s: out err %.3g > tol %.3g at row %lu d %d: got %.9g want %.9g (%s)", label,
           err, tol, (unsigned long)(where / (size_t)Dv), (int)(where % (size_t)Dv),
           rows ? (double)out[where] : 0.0, rows ? ro[where] : 0.0, shape);
  for (i = 0; i < rows; i++) {
    if (rl[i] == -INFINITY) {
      int d, zero = 1;
      kb_n_neg_inf_rows++;
      for (d = 0; d < Dv; d++) zero &= out[i * (size_t)Dv + (size_t)d] == 0.0f;
      if (!zero && bad_zero++ < 3)
        KT_CHECK(0, "%s: row %lu sees no key but its output is not zero (%s)", label,
                 (unsigned long)i, shape);
      if (lse && lse[i] != -INFINITY && bad_lse++ < 3)
        KT_CHECK(0, "%s: row %lu sees no key, lse %.9g != -inf (%s)", label, (unsigned long)i,
                 (double)lse[i], shape);
    } else if (lse) {
      double tl = KB_TOL_LSE * (1.0 + fabs(rl[i])), e = fabs((double)lse[i] - rl[i]);
      if (!(e <= 1e300)) e = INFINITY;
      if (e / tl > kb_worst_lse) kb_worst_lse = e / tl;
      if (!(e <= tl) && bad_lse++ < 3)
        KT_CHECK(0, "%s: lse row %lu = %.9g, want %.9g (tol %.3g) (%s)", label, (unsigned long)i,
                 (double)lse[i], rl[i], tl, shape);
    }
  }
  KT_CHECK(bad_zero == 0 && bad_lse == 0, "%s: %d rows not zero / %d lse wrong (%s)", label,
           bad_zero, bad_lse, shape);
}

/* ======================================================================== */
/* A. split-K in kva_attend                                                 */

typedef struct {
  int H, G, D, Dv, n_q, n_kv;
  int qmode;  /* 0: q_pos NULL; 1: explicit, random; 2: explicit, early (first before every key) */
  int kvmode; /* 0: NULL; 1: 100 + j; 2: reversed; 3: shuffled; 4: 3 * j (sparse) */
  int window, n_sink, want_lse, v_dim0;
  float softcap, scale, qk_amp;
  int chunk, sinks; /* chunk_size; sinks: 1 gives every head a random sink logit */
  const char *label;
} kb_split_case;

/* kva_attend_batch as an engine's pool runs it: prepare, the units in random
   ranges taken in a random order, then the merges the same way */
static kva_status kb_run_in_pieces(kt_rng *r, kva_cache *c, kva_batch *p, int layer, const float *q, float *out,
                                   float *lse) {
  int phase;
  kva_status st = kva_batch_prepare(c, p, layer, q, out, lse);
  for (phase = 0; phase < 2 && st == KVA_OK; phase++) {
    int n = phase ? kva_batch_n_merges(p) : kva_batch_n_units(p), cut[9], k, n_cuts = 1;
    int32_t order[8];
    cut[0] = 0;
    while (cut[n_cuts - 1] < n && n_cuts < 8) { /* up to 8 ranges, the last one takes the rest */
      cut[n_cuts] = cut[n_cuts - 1] + kt_int(r, 1, n - cut[n_cuts - 1]);
      n_cuts++;
    }
    cut[n_cuts - 1] = n;
    kb_perm(r, order, n_cuts - 1, 0);
    for (k = 0; k < n_cuts - 1 && st == KVA_OK; k++)
      st = phase ? kva_batch_run_merges(p, cut[order[k]], cut[order[k] + 1])
                 : kva_batch_run_units(p, cut[order[k]], cut[order[k] + 1]);
  }
  return st;
}

static void kb_split_run(kt_rng *r, const kb_split_case *tc) {
  kva_attn a, a2;
  ref_attn_cfg c;
  int H = tc->H, G = tc->G, D = tc->D, Dv = tc->Dv, n_q = tc->n_q, j;
  /* quick mode (emulators): still split (>= 2048 keys), still not a multiple of 64 most of the time */
  int n_kv = kt_quick && tc->n_kv > 2600 ? 2048 + tc->n_kv % 300 : tc->n_kv;
  size_t nq = (size_t)n_q * H * D, nk = (size_t)n_kv * G * D, nv = (size_t)n_kv * G * Dv;
  size_t no = (size_t)n_q * H * Dv, nl = (size_t)n_q * H;
  float *q = KT_ALLOC(float, nq), *k = KT_ALLOC(float, nk), *v = KT_ALLOC(float, nv);
  float *o1 = KT_ALLOC(float, no + KB_GUARD), *o2 = KT_ALLOC(float, no + KB_GUARD);
  float *l1 = KT_ALLOC(float, nl + KB_GUARD), *l2 = KT_ALLOC(float, nl + KB_GUARD);
  int32_t *kp = NULL, *qp = NULL, minkp = 0, maxkp = n_kv - 1;
  float *sinks = NULL;
  double *rq, *rk, *rv, *ro = KT_ALLOC(double, no + 1), *rl = KT_ALLOC(double, nl + 1);
  long m0, f0;
  kva_status st;
  char shape[256];

  kt_attn_init(&a, H, G, D, tc->v_dim0 && Dv == D ? 0 : Dv);
  a.window = tc->window;
  a.n_sink = tc->n_sink;
  a.softcap = tc->softcap;
  a.scale = tc->scale;
  a.chunk_size = tc->chunk;
  if (tc->sinks) { /* split-K parts leave the sink to the merge: it must join once */
    sinks = KT_ALLOC(float, (size_t)H);
    kt_fill(r, sinks, (size_t)H, -2.0f, 6.0f);
    a.sink_logits = sinks;
  }
  kt_fill(r, q, nq, -tc->qk_amp, tc->qk_amp);
  kt_fill(r, k, nk, -tc->qk_amp, tc->qk_amp);
  kt_fill(r, v, nv, -2.0f, 2.0f);
  if (tc->kvmode) {
    kp = KT_ALLOC(int32_t, n_kv);
    for (j = 0; j < n_kv; j++) {
      switch (tc->kvmode) {
        case 1: kp[j] = 100 + j; break;
        case 2: kp[j] = n_kv - 1 - j; break;
        case 4: kp[j] = 3 * j; break;
        default: kp[j] = j; break; /* 3: shuffled below */
      }
    }
    if (tc->kvmode == 3) kb_perm(r, kp, n_kv, 0);
    minkp = maxkp = n_kv > 0 ? kp[0] : 0;
    for (j = 0; j < n_kv; j++) {
      if (kp[j] < minkp) minkp = kp[j];
      if (kp[j] > maxkp) maxkp = kp[j];
    }
  }
  if (tc->qmode) {
    qp = KT_ALLOC(int32_t, n_q);
    for (j = 0; j < n_q; j++) {
      if (tc->qmode == 1)
        qp[j] = kt_int(r, 0, 4) ? kt_int(r, minkp, maxkp) : kt_int(r, minkp - 20, maxkp + 5);
      else /* spread over the first half; query 0 precedes every key */
        qp[j] = j == 0 ? minkp - 1 : minkp + (int32_t)((int64_t)(maxkp - minkp) * j / (2 * n_q));
    }
  }
  sprintf(shape, "%s: H=%d G=%d D=%d Dv=%d n_q=%d n_kv=%d qmode=%d kvmode=%d win=%d sink=%d cap=%g scale=%g lse=%d",
          tc->label, H, G, D, Dv, n_q, n_kv, tc->qmode, tc->kvmode, tc->window, tc->n_sink,
          (double)tc->softcap, (double)tc->scale, tc->want_lse);
  kt_fill_sentinel(o1, no + KB_GUARD);
  kt_fill_sentinel(l1, nl + KB_GUARD);
  m0 = kt_mallocs;
  f0 = kt_frees;
  st = kva_attend(&a, q, n_q, qp, k, v, n_kv, kp, o1, tc->want_lse ? l1 : NULL);
  KT_CHECK(st == KVA_OK, "kva_attend returned %d (%s)", (int)st, shape);
  if (n_q == 1)
    KT_CHECK(kt_mallocs == m0, "decode (n_q == 1) called KVATTN_MALLOC %ld times; docs/API.md: decode never "
             "allocates (%s)", kt_mallocs - m0, shape);
  KT_CHECK(kt_mallocs - m0 == kt_frees - f0, "kva_attend took %ld blocks, freed %ld (%s)", kt_mallocs - m0,
           kt_frees - f0, shape);
  KT_CHECK(kt_all_sentinel(o1 + no, KB_GUARD) && kt_all_sentinel(l1 + nl, KB_GUARD),
           "wrote past out / lse (%s)", shape);
  if (!tc->want_lse) KT_CHECK(kt_all_sentinel(l1, nl), "lse NULL but written (%s)", shape);
  /* the split depends on the shape only: n_threads 2 must give the same bits */
  a2 = a;
  a2.n_threads = 2;
  kt_fill_sentinel(o2, no + KB_GUARD);
  kt_fill_sentinel(l2, nl + KB_GUARD);
  st = kva_attend(&a2, q, n_q, qp, k, v, n_kv, kp, o2, tc->want_lse ? l2 : NULL);
  KT_CHECK(st == KVA_OK && kt_same_bits(o1, o2, no) && kt_same_bits(l1, l2, nl),
           "n_threads 1 and 2 differ (status %d) (%s)", (int)st, shape);
  c = ref_cfg(&a);
  rq = kb_dup(q, nq);
  rk = kb_dup(k, nk);
  rv = kb_dup(v, nv);
  ref_attend(&c, rq, n_q, qp, rk, rv, n_kv, kp, ro, rl);
  kb_check_rows("split-K kva_attend", shape, o1, tc->want_lse ? l1 : NULL, ro, rl, nl, Dv,
                ref_max_abs_f(v, nv));
  kb_n_split_cases++;
  free(q);
  free(k);
  free(v);
  free(o1);
  free(o2);
  free(l1);
  free(l2);
  free(kp);
  free(qp);
  free(rq);
  free(rk);
  free(rv);
  free(ro);
  free(rl);
  free(sinks);
}

static void kb_case(kb_split_case *tc, int H, int G, int D, int Dv, int n_q, int n_kv, const char *label) {
  memset(tc, 0, sizeof *tc);
  tc->H = H;
  tc->G = G;
  tc->D = D;
  tc->Dv = Dv;
  tc->n_q = n_q;
  tc->n_kv = n_kv;
  tc->want_lse = 1;
  tc->qk_amp = 1.0f;
  tc->label = label;
}

static void test_split_directed(void) {
  kt_rng r;
  kb_split_case tc;
  int quick = kt_quick;
  kt_begin("batch: split-K kva_attend, directed shapes");
  kt_seed(&r, 0x5B117);
  /* boundaries of the split count */
  kb_case(&tc, 8, 1, 128, 128, 1, 2048, "MQA decode, exactly 2 x 1024");
  kb_split_run(&r, &tc);
  kb_case(&tc, 1, 1, 100, 100, 1, 2047, "one head, 2047 keys (no split)");
  kb_split_run(&r, &tc);
  kb_case(&tc, 1, 1, 72, 72, 1, 2049, "one head, 2049 keys");
  tc.v_dim0 = 1;
  kb_split_run(&r, &tc);
  kb_case(&tc, 4, 1, 24, 24, 1, 4097, "4097 keys, window 300: early splits see nothing");
  tc.window = 300;
  kb_split_run(&r, &tc);
  kb_case(&tc, 4, 1, 24, 24, 1, 4097, "4097 keys, window 300 sink 4");
  tc.window = 300;
  tc.n_sink = 4;
  kb_split_run(&r, &tc);
  kb_case(&tc, 4, 2, 40, 24, 3, quick ? 3000 : 9000, "GQA 4/2 Dv 24, window 1500 sink 4, chunk of 3");
  tc.window = 1500;
  tc.n_sink = 4;
  kb_split_run(&r, &tc);
  kb_case(&tc, 2, 1, 3, 3, 1, 5000, "D 3, softcap 20, scale 0.7");
  tc.softcap = 20.0f;
  tc.scale = 0.7f;
  kb_split_run(&r, &tc);
  kb_case(&tc, 3, 1, 50, 50, 4, 4096, "early queries (query 0 before every key): late splits see nothing");
  tc.qmode = 2;
  tc.kvmode = 1;
  kb_split_run(&r, &tc);
  kb_case(&tc, 2, 1, 33, 33, 1, 4160, "reversed keys, window 100 sink 3 (sinks at the array's end)");
  tc.kvmode = 2;
  tc.window = 100;
  tc.n_sink = 3;
  kb_split_run(&r, &tc);
  kb_case(&tc, 2, 2, 20, 20, 2, 3333, "shuffled keys, window 500 sink 2, explicit queries");
  tc.kvmode = 3;
  tc.qmode = 1;
  tc.window = 500;
  tc.n_sink = 2;
  kb_split_run(&r, &tc);
  kb_case(&tc, 2, 1, 17, 17, 1, 6001, "sparse positions 3j, window 900");
  tc.kvmode = 4;
  tc.window = 900;
  kb_split_run(&r, &tc);
  kb_case(&tc, 4, 1, 16, 16, 1, 4100, "large scores (scale 1, |q|,|k| <= 4: scores to +-256)");
  tc.scale = 1.0f;
  tc.qk_amp = 4.0f;
  kb_split_run(&r, &tc);
  kb_case(&tc, 16, 1, 64, 64, 3, quick ? 2100 : 8200, "MQA 16/1 chunk of 3 (48 rows): 8 splits");
  kb_split_run(&r, &tc);
  kb_case(&tc, 64, 1, 8, 8, 2, 4200, "MQA 64/1 chunk of 2 (128 rows, 2 chunks)");
  kb_split_run(&r, &tc);
  kb_case(&tc, 8, 4, 20, 12, 1, 4100, "GQA 8/4 decode (4 items)");
  kb_split_run(&r, &tc);
  kb_case(&tc, 7, 7, 9, 9, 1, 2100, "MHA 7 heads (7 items)");
  kb_split_run(&r, &tc);
  kb_case(&tc, 8, 8, 9, 9, 1, 2100, "MHA 8 heads (8 items: no split)");
  kb_split_run(&r, &tc);
  kb_case(&tc, 4, 1, 40, 40, 1, 3000, "no lse output");
  tc.want_lse = 0;
  tc.window = 700;
  kb_split_run(&r, &tc);
  kb_case(&tc, 2, 1, 40, 40, 2, 3000, "no lse, early queries");
  tc.want_lse = 0;
  tc.qmode = 2;
  kb_split_run(&r, &tc);
}

static void test_split_random(void) {
  static const int dims[] = {1, 5, 17, 24, 40, 50, 63, 64, 72, 100, 120, 128, 130};
  static const int lens[] = {1024, 1025, 2047, 2048, 2049, 2111, 3071, 3072, 3073, 4095, 4096, 4097,
                             5000, 6143, 8191, 8192, 8193, 9000};
  kt_rng r;
  int it, n = kt_iters(30);
  kt_begin("batch: split-K kva_attend, random shapes");
  kt_seed(&r, 0x5B1172);
  for (it = 0; it < n; it++) {
    kb_split_case tc;
    int G = kt_int(&r, 0, 2) ? 1 : kt_int(&r, 2, 4), R = kt_int(&r, 1, 8), n_q, n_kv;
    int D = kt_pick(&r, dims, 13), Dv = kt_int(&r, 0, 2) ? D : kt_pick(&r, dims, 13);
    double work;
    n_kv = kt_int(&r, 0, 1) ? kt_pick(&r, lens, 18) : kt_int(&r, 1024, 9000);
    if (kt_quick && n_kv > 4200) n_kv = kt_int(&r, 2048, 4200);
    n_q = kt_int(&r, 0, 1) ? 1 : kt_int(&r, 1, 12);
    /* bound the fp64 reference: n_q * H * n_kv * (D + Dv) */
    work = (double)n_q * G * R * n_kv * (D + Dv);
    while (n_q > 1 && work > 2.5e7) {
      n_q /= 2;
      work = (double)n_q * G * R * n_kv * (D + Dv);
    }
    kb_case(&tc, G * R, G, D, Dv, n_q, n_kv, "random");
    tc.v_dim0 = kt_int(&r, 0, 1);
    tc.want_lse = kt_int(&r, 0, 3) != 0;
    tc.qmode = kt_int(&r, 0, 3);
    if (tc.qmode == 3) tc.qmode = 0;
    tc.kvmode = kt_int(&r, 0, 6);
    if (tc.kvmode > 4) tc.kvmode = 0;
    switch (kt_int(&r, 0, 4)) {
      case 0: tc.window = kt_int(&r, 1, 2000); break;
      case 1:
        tc.window = kt_int(&r, 1, 1200);
        tc.n_sink = kt_int(&r, 1, 80);
        break;
      default: break;
    }
    if (kt_int(&r, 0, 3) == 0) tc.softcap = kt_int(&r, 0, 1) ? 5.0f : 30.0f;
    if (kt_int(&r, 0, 3) == 0) tc.scale = kt_uniform(&r, 0.05f, 1.0f);
    if (kt_int(&r, 0, 4) == 0) tc.chunk = kt_int(&r, 1, 3000);
    tc.sinks = kt_int(&r, 0, 3) == 0;
    kb_split_run(&r, &tc);
  }
}

/* ======================================================================== */
/* Cache snapshots and the per-KV-head reference                            */

typedef struct {
  int len, G, D, Dv;
  double *k, *v;  /* [G][len][D], [G][len][Dv] */
  int32_t *pos;   /* [G][len] */
  double vmax;
} kb_snap;

static void kb_snap_take(kva_cache *c, int seq, int layer, int G, int D, int Dv, kb_snap *s) {
  float *k = KT_ALLOC(float, (size_t)G * D), *v = KT_ALLOC(float, (size_t)G * Dv);
  int32_t *p = KT_ALLOC(int32_t, G);
  int t, g, i, bad = 0;
  s->len = kva_seq_len(c, seq);
  if (s->len < 0) s->len = 0;
  s->G = G;
  s->D = D;
  s->Dv = Dv;
  s->k = KT_ALLOC(double, (size_t)G * s->len * D + 1);
  s->v = KT_ALLOC(double, (size_t)G * s->len * Dv + 1);
  s->pos = KT_ALLOC(int32_t, (size_t)G * s->len + 1);
  s->vmax = 0.0;
  for (t = 0; t < s->len; t++) {
    if (kva_seq_read(c, seq, layer, t, k, v, p) != KVA_OK) bad++;
    for (g = 0; g < G; g++) {
      for (i = 0; i < D; i++) s->k[((size_t)g * s->len + t) * D + i] = (double)k[(size_t)g * D + i];
      for (i = 0; i < Dv; i++) {
        s->v[((size_t)g * s->len + t) * Dv + i] = (double)v[(size_t)g * Dv + i];
        if (fabs((double)v[(size_t)g * Dv + i]) > s->vmax) s->vmax = fabs((double)v[(size_t)g * Dv + i]);
      }
      s->pos[(size_t)g * s->len + t] = p[g];
    }
  }
  KT_CHECK(bad == 0, "kva_seq_read failed for %d slots (seq %d layer %d len %d)", bad, seq, layer, s->len);
  free(k);
  free(v);
  free(p);
}

/* max |v| over a sequence's held values of one layer */
static double kb_vmax_seq(kva_cache *c, int seq, int layer, int G, int D, int Dv) {
  float *v = KT_ALLOC(float, (size_t)G * Dv);
  int t, n = kva_seq_len(c, seq);
  double m = 0.0;
  (void)D;
  for (t = 0; t < n; t++) {
    double x;
    kva_seq_read(c, seq, layer, t, NULL, v, NULL);
    x = ref_max_abs_f(v, (size_t)G * Dv);
    if (x > m) m = x;
  }
  free(v);
  return m;
}

static void kb_snap_free(kb_snap *s) {
  free(s->k);
  free(s->v);
  free(s->pos);
}

/* Reference for query tokens sel[0..nsel) of the newest n_q tokens (q is
   [n_q][H][D]; token i sits at pos_next - n_q + i): per KV head, over that
   head's held keys.  ro [nsel][H][Dv], rl [nsel][H]. */
static void kb_ref_cache(const kb_snap *s, const kva_attn *a, const float *q, int n_q, int32_t pos_next,
                         const int *sel, int nsel, double *ro, double *rl) {
  ref_attn_cfg c = ref_cfg(a), sub;
  int R = c.H / c.G, g, i, h, d;
  double *qd = KT_ALLOC(double, (size_t)nsel * R * c.D + 1), *o = KT_ALLOC(double, (size_t)nsel * R * c.Dv + 1);
  double *l = KT_ALLOC(double, (size_t)nsel * R + 1);
  int32_t *qp = KT_ALLOC(int32_t, nsel + 1);
  sub = c;
  sub.H = R;
  sub.G = 1;
  for (i = 0; i < nsel; i++) qp[i] = pos_next - n_q + sel[i];
  for (g = 0; g < c.G; g++) {
    for (i = 0; i < nsel; i++)
      for (h = 0; h < R; h++)
        for (d = 0; d < c.D; d++)
          qd[((size_t)i * R + h) * c.D + d] = (double)q[((size_t)sel[i] * c.H + (size_t)g * R + h) * c.D + d];
    ref_attend(&sub, qd, nsel, qp, s->k + (size_t)g * s->len * c.D, s->v + (size_t)g * s->len * c.Dv, s->len,
               s->pos + (size_t)g * s->len, o, l);
    for (i = 0; i < nsel; i++)
      for (h = 0; h < R; h++) {
        size_t dst = (size_t)i * c.H + (size_t)g * R + h;
        memcpy(ro + dst * c.Dv, o + ((size_t)i * R + h) * c.Dv, sizeof(double) * (size_t)c.Dv);
        if (rl) rl[dst] = l[(size_t)i * R + h];
      }
  }
  free(qd);
  free(o);
  free(l);
  free(qp);
}

/* compare out rows of the selected tokens (out is [n_q][H][Dv]) and, when
   lse is not NULL, their log-sum-exp ([n_q][H]) with kb_ref_cache */
static void kb_check_cache_rows(const char *label, const char *shape, const kb_snap *s, const kva_attn *a,
                                const float *q, int n_q, int32_t pos_next, const int *sel, int nsel,
                                const float *out, const float *lse) {
  ref_attn_cfg c = ref_cfg(a);
  size_t rows = (size_t)nsel * c.H;
  double *ro = KT_ALLOC(double, rows * c.Dv + 1), *rl = KT_ALLOC(double, rows + 1);
  float *got = KT_ALLOC(float, rows * c.Dv + 1), *got_lse = KT_ALLOC(float, rows + 1);
  int i;
  kb_ref_cache(s, a, q, n_q, pos_next, sel, nsel, ro, rl);
  for (i = 0; i < nsel; i++) {
    memcpy(got + (size_t)i * c.H * c.Dv, out + (size_t)sel[i] * c.H * c.Dv, sizeof(float) * (size_t)c.H * c.Dv);
    if (lse) memcpy(got_lse + (size_t)i * c.H, lse + (size_t)sel[i] * c.H, sizeof(float) * (size_t)c.H);
  }
  kb_check_rows(label, shape, got, lse ? got_lse : NULL, ro, rl, rows, c.Dv, s->vmax);
  free(ro);
  free(rl);
  free(got);
  free(got_lse);
}

static const char *kb_dt_name(kva_dtype t) {
  switch (t) {
    case KVA_F32: return "F32";
    case KVA_F16: return "F16";
    case KVA_BF16: return "BF16";
    case KVA_INT8: return "INT8";
    case KVA_FP8_E4M3: return "E4M3";
    case KVA_FP8_E5M2: return "E5M2";
    default: return "default";
  }
}

static void kb_desc(kva_cache_desc *d, int L, int G, int D, int Dv, int bs, int n_blocks, kva_dtype dt) {
  memset(d, 0, sizeof *d);
  d->kind = KVA_CACHE_KV;
  d->n_layers = L;
  d->n_kv_heads = G;
  d->head_dim = D;
  d->v_dim = Dv;
  d->block_size = bs;
  d->n_blocks = n_blocks;
  d->dtype = dt;
  d->max_seqs = KB_MAXS + 8;
}

/* append n to seq in each cache given (1 or 2) and store the same random K/V
   in every layer; returns 1 when all went well */
static int kb_append_store(kt_rng *r, kva_cache **cs, const int *ids, int ncache, int L, int G, int D, int Dv,
                           int n) {
  float *k = KT_ALLOC(float, (size_t)n * G * D), *v = KT_ALLOC(float, (size_t)n * G * Dv);
  int ci, l, ok = 1;
  for (ci = 0; ci < ncache; ci++) {
    kva_status st = kva_seq_append(cs[ci], ids[ci], n);
    KT_CHECK(st == KVA_OK, "kva_seq_append(cache %d, seq %d, %d) = %d", ci, ids[ci], n, (int)st);
    ok &= st == KVA_OK;
  }
  for (l = 0; ok && l < L; l++) {
    kt_fill(r, k, (size_t)n * G * D, -1.0f, 1.0f);
    kt_fill(r, v, (size_t)n * G * Dv, -2.0f, 2.0f);
    for (ci = 0; ci < ncache; ci++) {
      kva_status st = kva_store(cs[ci], ids[ci], l, k, v, n);
      KT_CHECK(st == KVA_OK, "kva_store(cache %d, seq %d, layer %d, %d) = %d", ci, ids[ci], l, n, (int)st);
      ok &= st == KVA_OK;
    }
  }
  free(k);
  free(v);
  return ok;
}

/* ======================================================================== */
/* A (cache). split-K inside kva_attend_cache                               */

static void kb_split_cache_case(kt_rng *r, kva_dtype dt, int G, int R, int D, int Dv, int bs, int len,
                                const char *label) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  kb_snap snap;
  int seq = -1, done = 0, n_last = kt_int(r, 0, 1) ? 1 : kt_int(r, 2, 6), variant, H = G * R;
  char shape[256];
  kva_status st;
  kb_desc(&d, 1, G, D, Dv == D && kt_int(r, 0, 1) ? 0 : Dv, bs, kb_cdiv(len + 8, bs) + 2, dt);
  st = kva_cache_create(&d, &c);
  KT_CHECK(st == KVA_OK, "%s: kva_cache_create = %d", label, (int)st);
  if (st != KVA_OK) return;
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  while (done < len - n_last) { /* prefill in chunks of odd sizes, then the query chunk (n_last) */
    int n = kt_int(r, 1, 700);
    if (n > len - n_last - done) n = len - n_last - done;
    if (!kb_append_store(r, &c, &seq, 1, 1, G, D, Dv, n)) break;
    done += n;
  }
  kb_append_store(r, &c, &seq, 1, 1, G, D, Dv, n_last);
  kb_snap_take(c, seq, 0, G, D, Dv, &snap);
  KT_CHECK(snap.len == len, "%s: len %d, want %d", label, snap.len, len);
  for (variant = 0; variant < 4; variant++) {
    kva_attn a, a2;
    int n_q = variant == 3 ? 1 : n_last, i, sel[8];
    size_t nq = (size_t)n_q * H * D, no = (size_t)n_q * H * Dv;
    float *q = KT_ALLOC(float, nq), *o1 = KT_ALLOC(float, no + KB_GUARD), *o2 = KT_ALLOC(float, no + KB_GUARD);
    float *l2 = KT_ALLOC(float, (size_t)n_q * H + KB_GUARD);
    long m0;
    kt_attn_init(&a, H, G, D, d.v_dim);
    switch (variant) {
      case 1:
        a.window = kt_int(r, 50, len / 2);
        a.n_sink = kt_int(r, 0, 1) ? 0 : kt_int(r, 1, 8);
        break;
      case 2: a.softcap = 8.0f; break;
      case 3:
        a.window = kt_int(r, 1, 40);
        a.scale = 0.3f;
        break;
      default: break;
    }
    sprintf(shape, "%s: %s G=%d H=%d D=%d Dv=%d bs=%d len=%d n_q=%d win=%d sink=%d cap=%g", label,
            kb_dt_name(dt), G, H, D, Dv, bs, len, n_q, a.window, a.n_sink, (double)a.softcap);
    kt_fill(r, q, nq, -1.0f, 1.0f);
    kt_fill_sentinel(o1, no + KB_GUARD);
    m0 = kt_mallocs;
    st = kva_attend_cache(c, seq, 0, &a, q, n_q, o1);
    KT_CHECK(st == KVA_OK, "kva_attend_cache = %d (%s)", (int)st, shape);
    if (n_q == 1)
      KT_CHECK(kt_mallocs == m0, "cache decode called KVATTN_MALLOC %ld times; README: decode never "
               "allocates (%s)", kt_mallocs - m0, shape);
    KT_CHECK(kt_all_sentinel(o1 + no, KB_GUARD), "wrote past out (%s)", shape);
    a2 = a;
    a2.n_threads = 2;
    /* 2 threads, and the log-sum-exp asked for: the same output bits */
    kt_fill_sentinel(l2, (size_t)n_q * H + KB_GUARD);
    st = kva_attend_cache_lse(c, seq, 0, &a2, q, n_q, o2, l2);
    KT_CHECK(st == KVA_OK && kt_same_bits(o1, o2, no), "n_threads 1 and 2 (with lse) differ (status %d) (%s)",
             (int)st, shape);
    KT_CHECK(kt_all_sentinel(l2 + (size_t)n_q * H, KB_GUARD), "wrote past lse (%s)", shape);
    for (i = 0; i < n_q; i++) sel[i] = i;
    kb_check_cache_rows("split-K kva_attend_cache_lse", shape, &snap, &a, q, n_q, kva_seq_pos(c, seq), sel, n_q,
                        o1, l2);
    kb_n_split_cases++;
    free(q);
    free(o1);
    free(o2);
    free(l2);
  }
  kb_snap_free(&snap);
  kva_cache_destroy(c);
}

static void test_split_cache(void) {
  kt_rng r;
  int big = kt_quick ? 2600 : 6000;
  kt_begin("batch: split-K kva_attend_cache over the paged cache");
  kt_seed(&r, 0xCAC4E5);
  kb_split_cache_case(&r, KVA_F16, 1, 8, 100, 100, 16, big, "MQA F16");
  kb_split_cache_case(&r, KVA_F32, 1, 4, 72, 40, 13, kt_quick ? 2049 : 4097, "MQA F32 odd blocks");
  kb_split_cache_case(&r, KVA_F16, 2, 2, 24, 24, 16, 2049, "GQA 4/2 F16");
  kb_split_cache_case(&r, KVA_F32, 2, 3, 40, 40, 7, kt_quick ? 2100 : 5001, "GQA 6/2 F32 block 7");
  kb_split_cache_case(&r, KVA_BF16, 1, 2, 17, 17, 32, kt_quick ? 2100 : 3000, "MQA BF16 D 17");
  kb_split_cache_case(&r, KVA_INT8, 1, 4, 64, 64, 16, kt_quick ? 2300 : 4500, "MQA INT8");
}

/* ======================================================================== */
/* B. kva_merge_lse                                                         */

/* the merge formula in double */
static void kb_merge_ref(const float *a, float la, const float *b, float lb, int dv, double *o, double *l) {
  double m = (double)la > (double)lb ? (double)la : (double)lb, wa, wb;
  int i;
  if (m == -INFINITY) {
    for (i = 0; i < dv; i++) o[i] = 0.0;
    *l = -INFINITY;
    return;
  }
  wa = la == -INFINITY ? 0.0 : exp((double)la - m);
  wb = lb == -INFINITY ? 0.0 : exp((double)lb - m);
  for (i = 0; i < dv; i++) o[i] = (wa * (double)a[i] + wb * (double)b[i]) / (wa + wb);
  *l = m + log(wa + wb);
}

/* One random partition test: keys at positions (kv_pos) split into sets A
   and B; each attended with kva_attend (explicit q_pos, lse), merged, and
   compared with the reference over all keys. */
static void kb_merge_partition_case(kt_rng *r, int it) {
  static const int dims[] = {1, 3, 8, 17, 24, 57, 64, 100, 127};
  int H, G = kt_int(r, 1, 3), D = kt_pick(r, dims, 9), Dv = kt_int(r, 0, 1) ? D : kt_pick(r, dims, 9);
  int n_kv, n_q = kt_int(r, 1, 6), mode = kt_int(r, 0, 3), j, nA = 0, nB = 0, cut = 0;
  kva_attn a;
  ref_attn_cfg c;
  float *q, *k, *v, *kA, *vA, *kB, *vB, *oA, *oB, *lA, *lB;
  int32_t *kp, *qp, *pA, *pB;
  double *rq, *rk, *rv, *ro, *rl;
  char *inA;
  size_t no, nl;
  double p = 0.5;
  char shape[256];
  kva_status st;
  H = G * kt_int(r, 1, 4);
  n_kv = kt_int(r, 0, 9) == 0 ? kt_int(r, 2048, kt_quick ? 2300 : 3200) : kt_int(r, 0, 300);
  if (kt_int(r, 0, 12) == 0) n_kv = kt_int(r, 0, 2);
  kt_attn_init(&a, H, G, D, Dv);
  if (kt_int(r, 0, 2) == 0) {
    a.window = kt_int(r, 1, n_kv + 2);
    if (kt_int(r, 0, 1)) a.n_sink = kt_int(r, 1, 5);
  }
  if (kt_int(r, 0, 4) == 0) a.softcap = 10.0f;
  c = ref_cfg(&a);
  q = KT_ALLOC(float, (size_t)n_q * H * D);
  k = KT_ALLOC(float, (size_t)n_kv * G * D + 1);
  v = KT_ALLOC(float, (size_t)n_kv * G * Dv + 1);
  kA = KT_ALLOC(float, (size_t)n_kv * G * D + 1);
  vA = KT_ALLOC(float, (size_t)n_kv * G * Dv + 1);
  kB = KT_ALLOC(float, (size_t)n_kv * G * D + 1);
  vB = KT_ALLOC(float, (size_t)n_kv * G * Dv + 1);
  kp = KT_ALLOC(int32_t, n_kv + 1);
  pA = KT_ALLOC(int32_t, n_kv + 1);
  pB = KT_ALLOC(int32_t, n_kv + 1);
  qp = KT_ALLOC(int32_t, n_q);
  inA = KT_ALLOC(char, n_kv + 1);
  kt_fill(r, q, (size_t)n_q * H * D, -1.0f, 1.0f);
  kt_fill(r, k, (size_t)n_kv * G * D, -1.0f, 1.0f);
  kt_fill(r, v, (size_t)n_kv * G * Dv, -2.0f, 2.0f);
  if (kt_int(r, 0, 1)) kb_perm(r, kp, n_kv, 0);
  else
    for (j = 0; j < n_kv; j++) kp[j] = j;
  for (j = 0; j < n_q; j++) qp[j] = kt_int(r, 0, 5) ? kt_int(r, -2, n_kv + 2) : n_kv - 1;
  /* the partition */
  switch (mode) {
    case 0: /* contiguous: a random cut, often at an end */
      cut = kt_int(r, 0, 3) == 0 ? (kt_int(r, 0, 1) ? 0 : n_kv) : kt_int(r, 0, n_kv);
      for (j = 0; j < n_kv; j++) inA[j] = (char)(j < cut);
      break;
    case 1: /* random mask with a random density (0 and 1 included) */
      p = kt_int(r, 0, 5) == 0 ? (double)kt_int(r, 0, 1) : kt_unit(r);
      for (j = 0; j < n_kv; j++) inA[j] = (char)(kt_unit(r) < p);
      break;
    case 2: /* interleaved */
      for (j = 0; j < n_kv; j++) inA[j] = (char)(j & 1);
      break;
    default: /* by position parity of the (maybe shuffled) positions: A holds the even positions */
      for (j = 0; j < n_kv; j++) inA[j] = (char)((kp[j] & 1) == 0);
      break;
  }
  for (j = 0; j < n_kv; j++) {
    float *kd = inA[j] ? kA + (size_t)nA * G * D : kB + (size_t)nB * G * D;
    float *vd = inA[j] ? vA + (size_t)nA * G * Dv : vB + (size_t)nB * G * Dv;
    memcpy(kd, k + (size_t)j * G * D, sizeof(float) * (size_t)G * D);
    memcpy(vd, v + (size_t)j * G * Dv, sizeof(float) * (size_t)G * Dv);
    if (inA[j]) pA[nA++] = kp[j];
    else pB[nB++] = kp[j];
  }
  no = (size_t)n_q * H * Dv;
  nl = (size_t)n_q * H;
  oA = KT_ALLOC(float, no);
  oB = KT_ALLOC(float, no);
  lA = KT_ALLOC(float, nl);
  lB = KT_ALLOC(float, nl);
  sprintf(shape, "merge partition #%d: mode %d H=%d G=%d D=%d Dv=%d n_q=%d n_kv=%d |A|=%d |B|=%d win=%d sink=%d cap=%g",
          it, mode, H, G, D, Dv, n_q, n_kv, nA, nB, a.window, a.n_sink, (double)a.softcap);
  st = kva_attend(&a, q, n_q, qp, kA, vA, nA, pA, oA, lA);
  KT_CHECK(st == KVA_OK, "attend A = %d (%s)", (int)st, shape);
  st = kva_attend(&a, q, n_q, qp, kB, vB, nB, pB, oB, lB);
  KT_CHECK(st == KVA_OK, "attend B = %d (%s)", (int)st, shape);
  st = kva_merge_lse(oA, lA, oB, lB, (int)nl, Dv);
  KT_CHECK(st == KVA_OK, "kva_merge_lse = %d (%s)", (int)st, shape);
  rq = kb_dup(q, (size_t)n_q * H * D);
  rk = kb_dup(k, (size_t)n_kv * G * D);
  rv = kb_dup(v, (size_t)n_kv * G * Dv);
  ro = KT_ALLOC(double, no + 1);
  rl = KT_ALLOC(double, nl + 1);
  ref_attend(&c, rq, n_q, qp, rk, rv, n_kv, kp, ro, rl);
  kb_check_rows("merge of two partial attentions", shape, oA, lA, ro, rl, nl, Dv, ref_max_abs_f(v, (size_t)n_kv * G * Dv));
  free(q); free(k); free(v); free(kA); free(vA); free(kB); free(vB); free(kp); free(pA); free(pB); free(qp);
  free(inA); free(oA); free(oB); free(lA); free(lB); free(rq); free(rk); free(rv); free(ro); free(rl);
}

static void test_merge_partitions(void) {
  kt_rng r;
  int it, n = kt_iters(120);
  kt_begin("batch: kva_merge_lse of random key partitions vs fp64 reference");
  kt_seed(&r, 0x3E76E);
  for (it = 0; it < n; it++) kb_merge_partition_case(&r, it);
}

/* -inf parts, magnitudes, against the formula in double */
static void test_merge_special(void) {
  enum { ROWS = 64, DV = 13 };
  kt_rng r;
  float a[ROWS * DV], la[ROWS], b[ROWS * DV], lb[ROWS], a0[ROWS * DV], la0[ROWS];
  double ro[DV], rl;
  int i, d, it;
  kt_begin("batch: kva_merge_lse with empty parts and distant lse");
  kt_seed(&r, 0x3E76F);
  /* an empty B (lse -inf, any finite out_b) leaves (out, lse) bit-identical, -0.0 included */
  kt_fill(&r, a, ROWS * DV, -3.0f, 3.0f);
  kt_fill(&r, b, ROWS * DV, -100.0f, 100.0f);
  for (i = 0; i < ROWS; i++) {
    static const float bases[] = {0.0f, -5.0f, 7.5f, 1000.0f, -1000.0f, 88.5f, -87.0f, 1e6f, -3e4f};
    la[i] = bases[i % 9] + kt_uniform(&r, -1.0f, 1.0f);
    lb[i] = -INFINITY;
    if (i % 4 == 0) a[i * DV] = 0.0f;
    if (i % 5 == 0) b[i * DV + 1] = 0.0f;
  }
  memcpy(a0, a, sizeof a);
  memcpy(la0, la, sizeof la);
  KT_STATUS(kva_merge_lse(a, la, b, lb, ROWS, DV), KVA_OK);
  KT_CHECK(kt_same_bits(a, a0, ROWS * DV) && kt_same_bits(la, la0, ROWS),
           "merging parts with lse -inf changed (out, lse)");
  /* ... negative zeros included (a kva_attend output can hold -0.0) */
  for (i = 0; i < ROWS; i += 4) a[i * DV + 2] = -0.0f;
  memcpy(a0, a, sizeof a);
  KT_STATUS(kva_merge_lse(a, la, b, lb, ROWS, DV), KVA_OK);
  KT_CHECK(kt_same_bits(a, a0, ROWS * DV) && kt_same_bits(la, la0, ROWS),
           "merging parts with lse -inf changed (out, lse): -0.0 in out became %g (bits %08lx)", (double)a[2],
           (unsigned long)kt_f2u(a[2]));
  /* an empty A (as kva_attend returns it: zeros, -inf) takes B */
  for (i = 0; i < ROWS * DV; i++) a[i] = 0.0f;
  for (i = 0; i < ROWS; i++) {
    la[i] = -INFINITY;
    lb[i] = (float)(i - 32) * 40.0f + kt_uniform(&r, -1.0f, 1.0f);
  }
  kt_fill(&r, b, ROWS * DV, -3.0f, 3.0f);
  KT_STATUS(kva_merge_lse(a, la, b, lb, ROWS, DV), KVA_OK);
  {
    int bad = 0;
    for (i = 0; i < ROWS * DV; i++) bad += a[i] != b[i];
    for (i = 0; i < ROWS; i++) bad += kt_f2u(la[i]) != kt_f2u(lb[i]);
    KT_CHECK(bad == 0, "merging into an empty part (lse -inf): %d values differ from the other part", bad);
  }
  /* both empty: zeros and -inf, whatever out held */
  kt_fill(&r, a, ROWS * DV, -3.0f, 3.0f);
  kt_fill(&r, b, ROWS * DV, -3.0f, 3.0f);
  for (i = 0; i < ROWS; i++) la[i] = lb[i] = -INFINITY;
  KT_STATUS(kva_merge_lse(a, la, b, lb, ROWS, DV), KVA_OK);
  {
    int bad = 0;
    for (i = 0; i < ROWS * DV; i++) bad += a[i] != 0.0f;
    for (i = 0; i < ROWS; i++) bad += la[i] != -INFINITY;
    KT_CHECK(bad == 0, "both parts empty: %d values not zero / lse not -inf", bad);
  }
  /* finite parts at all distances, 1e3 apart and more: finite, == formula */
  for (it = 0; it < kt_iters(40); it++) {
    static const double dist[] = {0.0, 1e-3, 0.5, 1.0, 10.0, 30.0, 60.0, 87.0, 88.0, 89.0, 103.0, 104.0,
                                  150.0, 1e3, 1.5e3, 1e4, 1e5};
    static const double base[] = {0.0, 3.0, -20.0, 1e3, -1e3, 5e4, -2e5};
    double worst_o = 0.0, worst_l = 0.0;
    kt_fill(&r, a, ROWS * DV, -3.0f, 3.0f);
    kt_fill(&r, b, ROWS * DV, -3.0f, 3.0f);
    for (i = 0; i < ROWS; i++) {
      double bs = base[kt_int(&r, 0, 6)], ds = dist[kt_int(&r, 0, 16)] * (kt_int(&r, 0, 1) ? 1 : -1);
      la[i] = (float)(bs + kt_uniform(&r, -0.5f, 0.5f));
      lb[i] = (float)((double)la[i] + ds);
      if (i % 11 == 3) la[i] = -INFINITY; /* mixed rows: empty A, empty B, both */
      if (i % 13 == 5) lb[i] = -INFINITY;
    }
    memcpy(a0, a, sizeof a);
    memcpy(la0, la, sizeof la);
    KT_STATUS(kva_merge_lse(a, la, b, lb, ROWS, DV), KVA_OK);
    for (i = 0; i < ROWS; i++) {
      double mag = 0.0, tl, el;
      kb_merge_ref(a0 + i * DV, la0[i], b + i * DV, lb[i], DV, ro, &rl);
      for (d = 0; d < DV; d++) {
        double e = fabs((double)a[i * DV + d] - ro[d]);
        if (fabs((double)a0[i * DV + d]) > mag) mag = fabs((double)a0[i * DV + d]);
        if (fabs((double)b[i * DV + d]) > mag) mag = fabs((double)b[i * DV + d]);
        if (!(e <= 1e300)) e = INFINITY;
        if (e > worst_o) worst_o = e;
      }
      if (worst_o / (KB_TOL_MERGE * (1.0 + mag)) > kb_worst_merge_out)
        kb_worst_merge_out = worst_o / (KB_TOL_MERGE * (1.0 + mag));
      KT_CHECK(worst_o <= KB_TOL_MERGE * (1.0 + mag), "merge row %d (lse %.9g, %.9g): out err %.3g > %.3g", i,
               (double)la0[i], (double)lb[i], worst_o, KB_TOL_MERGE * (1.0 + mag));
      worst_o = 0.0;
      if (rl == -INFINITY) {
        KT_CHECK(la[i] == -INFINITY, "merge row %d: both empty, lse %.9g", i, (double)la[i]);
        continue;
      }
      KT_CHECK(isfinite(la[i]), "merge row %d: lse %.9g and %.9g merge to non-finite %g", i, (double)la0[i],
               (double)lb[i], (double)la[i]);
      tl = KB_TOL_MERGE * (1.0 + fabs(rl));
      el = fabs((double)la[i] - rl);
      if (!(el <= 1e300)) el = INFINITY;
      if (el > worst_l) worst_l = el;
      if (el / tl > kb_worst_merge_lse) kb_worst_merge_lse = el / tl;
      KT_CHECK(el <= tl, "merge row %d: lse %.9g, want %.9g (parts %.9g, %.9g)", i, (double)la[i], rl,
               (double)la0[i], (double)lb[i]);
    }
    (void)worst_l;
  }
}

/* cascade: a shared prefix attended once for every request's queries, each
   request's own suffix separately, merged == attention over the concatenation */
static void kb_cascade_case(kt_rng *r, int it) {
  enum { MAXREQ = 5 };
  int G = kt_int(r, 1, 2), H = G * kt_int(r, 1, 4), D = kt_int(r, 0, 1) ? 40 : 13, Dv = kt_int(r, 0, 1) ? D : 20;
  int n_p = kt_int(r, 0, 3) == 0 ? kt_int(r, 2048, kt_quick ? 2200 : 3000) : kt_int(r, 1, 400);
  int n_req = kt_int(r, 1, MAXREQ), sl[MAXREQ], nq[MAXREQ], qrow[MAXREQ], tot_q = 0, i, j;
  kva_attn a;
  ref_attn_cfg c;
  float *kP, *vP, *Q, *oP, *lP;
  int32_t *qpos;
  char shape[256];
  kt_attn_init(&a, H, G, D, Dv);
  if (kt_int(r, 0, 2) == 0) {
    a.window = kt_int(r, 1, n_p + 100);
    a.n_sink = kt_int(r, 0, 1) ? 0 : kt_int(r, 1, 4);
  }
  c = ref_cfg(&a);
  for (i = 0; i < n_req; i++) {
    sl[i] = kt_int(r, 1, 150);
    nq[i] = kt_int(r, 0, 1) ? 1 : kt_int(r, 1, sl[i] < 8 ? sl[i] : 8);
    qrow[i] = tot_q;
    tot_q += nq[i];
  }
  kP = KT_ALLOC(float, (size_t)n_p * G * D);
  vP = KT_ALLOC(float, (size_t)n_p * G * Dv);
  Q = KT_ALLOC(float, (size_t)tot_q * H * D);
  oP = KT_ALLOC(float, (size_t)tot_q * H * Dv);
  lP = KT_ALLOC(float, (size_t)tot_q * H);
  qpos = KT_ALLOC(int32_t, tot_q);
  kt_fill(r, kP, (size_t)n_p * G * D, -1.0f, 1.0f);
  kt_fill(r, vP, (size_t)n_p * G * Dv, -2.0f, 2.0f);
  kt_fill(r, Q, (size_t)tot_q * H * D, -1.0f, 1.0f);
  for (i = 0; i < n_req; i++)
    for (j = 0; j < nq[i]; j++) qpos[qrow[i] + j] = n_p + sl[i] - nq[i] + j;
  sprintf(shape, "cascade #%d: H=%d G=%d D=%d Dv=%d prefix %d, %d requests, win %d sink %d", it, H, G, D, Dv, n_p,
          n_req, a.window, a.n_sink);
  /* the prefix, once, for all requests' queries */
  KT_STATUS(kva_attend(&a, Q, tot_q, qpos, kP, vP, n_p, NULL, oP, lP), KVA_OK);
  for (i = 0; i < n_req; i++) {
    int n_all = n_p + sl[i];
    size_t rows = (size_t)nq[i] * H;
    float *kS = KT_ALLOC(float, (size_t)sl[i] * G * D), *vS = KT_ALLOC(float, (size_t)sl[i] * G * Dv);
    float *oS = KT_ALLOC(float, rows * Dv), *lS = KT_ALLOC(float, rows), *oC = KT_ALLOC(float, rows * Dv);
    float *kC = KT_ALLOC(float, (size_t)n_all * G * D), *vC = KT_ALLOC(float, (size_t)n_all * G * Dv);
    float *lC = KT_ALLOC(float, rows);
    float *om = oP + (size_t)qrow[i] * H * Dv, *lm = lP + (size_t)qrow[i] * H;
    int32_t *sp = KT_ALLOC(int32_t, sl[i]);
    double *rq, *rk, *rv, *ro = KT_ALLOC(double, rows * Dv), *rl = KT_ALLOC(double, rows), err, tol;
    size_t w = 0;
    kt_fill(r, kS, (size_t)sl[i] * G * D, -1.0f, 1.0f);
    kt_fill(r, vS, (size_t)sl[i] * G * Dv, -2.0f, 2.0f);
    for (j = 0; j < sl[i]; j++) sp[j] = n_p + j;
    KT_STATUS(kva_attend(&a, Q + (size_t)qrow[i] * H * D, nq[i], qpos + qrow[i], kS, vS, sl[i], sp, oS, lS),
              KVA_OK);
    KT_STATUS(kva_merge_lse(om, lm, oS, lS, (int)rows, Dv), KVA_OK);
    memcpy(kC, kP, sizeof(float) * (size_t)n_p * G * D);
    memcpy(kC + (size_t)n_p * G * D, kS, sizeof(float) * (size_t)sl[i] * G * D);
    memcpy(vC, vP, sizeof(float) * (size_t)n_p * G * Dv);
    memcpy(vC + (size_t)n_p * G * Dv, vS, sizeof(float) * (size_t)sl[i] * G * Dv);
    rq = kb_dup(Q + (size_t)qrow[i] * H * D, (size_t)nq[i] * H * D);
    rk = kb_dup(kC, (size_t)n_all * G * D);
    rv = kb_dup(vC, (size_t)n_all * G * Dv);
    ref_attend(&c, rq, nq[i], NULL, rk, rv, n_all, NULL, ro, rl); /* queries = the last nq keys */
    kb_check_rows("cascade merge", shape, om, lm, ro, rl, rows, Dv, ref_max_abs_d(rv, (size_t)n_all * G * Dv));
    /* and the library on the concatenation (two library paths, same tolerance) */
    KT_STATUS(kva_attend(&a, Q + (size_t)qrow[i] * H * D, nq[i], NULL, kC, vC, n_all, NULL, oC, lC), KVA_OK);
    tol = KB_TOL_OUT * (1.0 + ref_max_abs_d(rv, (size_t)n_all * G * Dv));
    err = 0.0;
    for (j = 0; j < (int)(rows * Dv); j++) {
      double e = fabs((double)oC[j] - (double)om[j]);
      if (!(e <= 1e300)) e = INFINITY;
      if (e > err) {
        err = e;
        w = (size_t)j;
      }
    }
    if (err / tol > kb_worst_pair) kb_worst_pair = err / tol;
    KT_CHECK(err <= tol, "cascade vs kva_attend on the concatenation: err %.3g > %.3g at %lu (%s)", err, tol,
             (unsigned long)w, shape);
    free(kS); free(vS); free(oS); free(lS); free(oC); free(kC); free(vC); free(lC); free(sp);
    free(rq); free(rk); free(rv); free(ro); free(rl);
  }
  free(kP); free(vP); free(Q); free(oP); free(lP); free(qpos);
}

static void test_merge_cascade(void) {
  kt_rng r;
  int it, n = kt_iters(25);
  kt_begin("batch: cascade (shared prefix + suffixes) with kva_merge_lse");
  kt_seed(&r, 0xCA5CADE);
  for (it = 0; it < n; it++) kb_cascade_case(&r, it);
}

static void test_merge_args(void) {
  float o[8], l[2], ob[8], lb[2];
  int i;
  kt_begin("batch: kva_merge_lse arguments");
  for (i = 0; i < 8; i++) ob[i] = 1.0f;
  lb[0] = lb[1] = 0.0f;
#define KB_BAD_MERGE(call, what)                                                         \
  do {                                                                                   \
    kva_status st_;                                                                      \
    kt_fill_sentinel(o, 8);                                                              \
    kt_fill_sentinel(l, 2);                                                              \
    st_ = (call);                                                                        \
    KT_CHECK(st_ == KVA_ERR_ARG, "%s: status %d, expected KVA_ERR_ARG", what, (int)st_); \
    KT_CHECK(kt_all_sentinel(o, 8) && kt_all_sentinel(l, 2), "%s: out/lse changed on error", what); \
  } while (0)
  KB_BAD_MERGE(kva_merge_lse(o, l, ob, lb, -1, 4), "n_rows < 0");
  KB_BAD_MERGE(kva_merge_lse(o, l, ob, lb, 2, 0), "dv == 0");
  KB_BAD_MERGE(kva_merge_lse(o, l, ob, lb, 2, -4), "dv < 0");
  KB_BAD_MERGE(kva_merge_lse(NULL, l, ob, lb, 2, 4), "out NULL");
  KB_BAD_MERGE(kva_merge_lse(o, NULL, ob, lb, 2, 4), "lse NULL");
  KB_BAD_MERGE(kva_merge_lse(o, l, NULL, lb, 2, 4), "out_b NULL");
  KB_BAD_MERGE(kva_merge_lse(o, l, ob, NULL, 2, 4), "lse_b NULL");
#undef KB_BAD_MERGE
  KT_STATUS(kva_merge_lse(NULL, NULL, NULL, NULL, 0, 4), KVA_OK);
  kt_fill_sentinel(o, 8);
  kt_fill_sentinel(l, 2);
  KT_STATUS(kva_merge_lse(o, l, ob, lb, 0, 4), KVA_OK);
  KT_CHECK(kt_all_sentinel(o, 8) && kt_all_sentinel(l, 2), "n_rows == 0 wrote to out/lse");
}

/* ======================================================================== */
/* D. batched attention                                                      */

typedef struct {
  kva_cache *c[2]; /* 0: driven by kva_attend_batch, 1: the mirror, by kva_attend_cache */
  int L, H, G, D, Dv, v_field, bs, R;
  kva_dtype dt;
  int n;                    /* slots used */
  int id[KB_MAXS][2];       /* per slot, its id in each cache */
  int alive[KB_MAXS], h2o[KB_MAXS], fork_of[KB_MAXS];
  char shape[200];
} kb_world;

static int kb_w_new(kb_world *w, kt_rng *r, int want_h2o) {
  int i = w->n++, ci;
  for (ci = 0; ci < 2; ci++) KT_STATUS(kva_seq_new(w->c[ci], &w->id[i][ci]), KVA_OK);
  w->alive[i] = 1;
  w->h2o[i] = 0;
  w->fork_of[i] = -1;
  if (want_h2o) {
    kva_evict e;
    memset(&e, 0, sizeof e);
    e.kind = KVA_EVICT_H2O;
    e.budget = kt_int(r, 24, 400);
    e.n_sink = kt_int(r, 0, 4);
    e.n_recent = kt_int(r, 1, 16);
    for (ci = 0; ci < 2; ci++) KT_STATUS(kva_seq_set_evict(w->c[ci], w->id[i][ci], &e), KVA_OK);
    w->h2o[i] = 1;
  }
  return i;
}

static int kb_w_fork(kb_world *w, kt_rng *r, int src) {
  int i = w->n++, ci;
  for (ci = 0; ci < 2; ci++) KT_STATUS(kva_seq_fork(w->c[ci], w->id[src][ci], &w->id[i][ci]), KVA_OK);
  w->alive[i] = 1;
  w->h2o[i] = w->h2o[src];
  w->fork_of[i] = src;
  if (w->h2o[i] && kt_int(r, 0, 2) == 0) { /* a fork that stops evicting (shares the H2O parent's blocks) */
    kva_evict e;
    memset(&e, 0, sizeof e);
    for (ci = 0; ci < 2; ci++) KT_STATUS(kva_seq_set_evict(w->c[ci], w->id[i][ci], &e), KVA_OK);
    w->h2o[i] = 0;
  }
  return i;
}

static int kb_w_append(kb_world *w, kt_rng *r, int i, int n) {
  int ids[2];
  ids[0] = w->id[i][0];
  ids[1] = w->id[i][1];
  return kb_append_store(r, w->c, ids, 2, w->L, w->G, w->D, w->Dv, n);
}

/* both caches hold the same tokens (values and positions) for slot i */
static void kb_w_same(kb_world *w, int i) {
  int len0 = kva_seq_len(w->c[0], w->id[i][0]), len1 = kva_seq_len(w->c[1], w->id[i][1]), l, t, bad = 0;
  float *k0 = KT_ALLOC(float, (size_t)w->G * w->D), *k1 = KT_ALLOC(float, (size_t)w->G * w->D);
  float *v0 = KT_ALLOC(float, (size_t)w->G * w->Dv), *v1 = KT_ALLOC(float, (size_t)w->G * w->Dv);
  int32_t *p0 = KT_ALLOC(int32_t, w->G), *p1 = KT_ALLOC(int32_t, w->G);
  KT_CHECK(len0 == len1, "batch vs per-sequence caches: seq slot %d holds %d vs %d tokens (h2o %d) (%s)", i, len0,
           len1, w->h2o[i], w->shape);
  for (l = 0; l < w->L && len0 == len1; l++)
    for (t = 0; t < len0; t++) {
      kva_seq_read(w->c[0], w->id[i][0], l, t, k0, v0, p0);
      kva_seq_read(w->c[1], w->id[i][1], l, t, k1, v1, p1);
      if (!kt_same_bits(k0, k1, (size_t)w->G * w->D) || !kt_same_bits(v0, v1, (size_t)w->G * w->Dv) ||
          memcmp(p0, p1, sizeof(int32_t) * (size_t)w->G) != 0)
        bad++;
    }
  KT_CHECK(bad == 0,
           "batch vs per-sequence caches: seq slot %d (h2o %d) differs in %d slots: H2O scores from "
           "kva_attend_batch differ from kva_attend_cache's (%s)",
           i, w->h2o[i], bad, w->shape);
  free(k0); free(k1); free(v0); free(v1); free(p0); free(p1);
}

static void kb_batch_scenario(kt_rng *r, int it) {
  static const int dims[] = {8, 24, 40, 52, 64, 72, 100, 118, 128};
  static const kva_dtype dts[] = {KVA_F16, KVA_F32, KVA_INT8};
  kb_world w;
  kva_cache_desc d;
  /* scenario 0: one or two sequences, the first long: split-K inside kva_attend_batch */
  int n_seqs = it == 0 ? kt_int(r, 1, 2) : kt_quick ? kt_int(r, 1, 6) : kt_int(r, 1, 20), i, ci, step;
  int n_steps = kt_quick ? 2 : 3;
  int hist[KB_MAXS], tot_hist = 0, max_tok = kt_quick ? 2600 : 6000, n_blocks = 0;
  long elems_budget = kt_quick ? 600000L : 3000000L;
  kva_status st;
  memset(&w, 0, sizeof w);
  w.L = kt_int(r, 1, 3);
  w.G = kt_int(r, 0, 2) ? kt_int(r, 1, 2) : 4;
  w.R = kt_int(r, 1, w.G == 4 ? 2 : 8);
  if (it == 0) { /* the long-sequence scenario: one layer, at most 2 KV heads */
    w.L = 1;
    if (w.G == 4) w.G = 2;
  }
  w.H = w.G * w.R;
  w.D = kt_pick(r, dims, 9);
  w.Dv = kt_int(r, 0, 2) ? w.D : kt_pick(r, dims, 9);
  w.v_field = w.Dv == w.D && kt_int(r, 0, 1) ? 0 : w.Dv;
  w.bs = kt_int(r, 0, 2) ? 16 : kt_int(r, 5, 40);
  w.dt = dts[it % 3];
  /* histories: mostly short, some long; the total bounded by elements stored */
  for (i = 0; i < n_seqs; i++) {
    int kind = kt_int(r, 0, 9);
    /* long sequences up to max_tok where split-K can happen (few items: few sequences) */
    hist[i] = kind < 6 ? kt_int(r, 1, 300)
              : kind < 8 ? kt_int(r, 300, 1500)
                         : kt_int(r, 2000, n_seqs <= 4 ? max_tok : 2600);
    if (it == 0 && i == 0) hist[i] = kt_int(r, 2048, max_tok);
    else if ((long)(tot_hist + hist[i]) * w.L * w.G * (w.D + w.Dv) > elems_budget) hist[i] = kt_int(r, 1, 40);
    tot_hist += hist[i];
  }
  /* every token may be held twice (a fork copies on write) plus the steps' appends */
  n_blocks = 2 * kb_cdiv(tot_hist, w.bs) + (n_seqs + 4) * (n_steps * kb_cdiv(70, w.bs) + 3) + 16;
  kb_desc(&d, w.L, w.G, w.D, w.v_field, w.bs, n_blocks, w.dt);
  for (ci = 0; ci < 2; ci++) {
    st = kva_cache_create(&d, &w.c[ci]);
    KT_CHECK(st == KVA_OK, "batch scenario %d: kva_cache_create = %d", it, (int)st);
    if (st != KVA_OK) {
      if (ci) kva_cache_destroy(w.c[0]);
      return;
    }
  }
  sprintf(w.shape, "scenario %d: %s L=%d H=%d G=%d D=%d Dv=%d bs=%d seqs=%d", it, kb_dt_name(w.dt), w.L, w.H, w.G,
          w.D, w.Dv, w.bs, n_seqs);
  /* build the histories: new sequences (some H2O) and forks of earlier ones */
  for (i = 0; i < n_seqs; i++) {
    int s, left, src = -1;
    if (i > 0 && kt_int(r, 0, 3) == 0) {
      src = kt_int(r, 0, w.n - 1);
      s = kb_w_fork(&w, r, src);
      left = hist[i] / 4; /* its own tokens on top of the shared ones */
    } else {
      s = kb_w_new(&w, r, kt_int(r, 0, 4) == 0 && !(it == 0 && i == 0));
      left = hist[i];
    }
    while (left > 0) {
      int n = kt_int(r, 1, 600);
      if (n > left) n = left;
      if (!kb_w_append(&w, r, s, n)) break;
      left -= n;
    }
  }
  for (step = 0; step < n_steps; step++) {
    int order[KB_MAXS], nq[KB_MAXS], newn[KB_MAXS], ids0[KB_MAXS], qrow[KB_MAXS], nb = 0, rows = 0, items = 0;
    int l, ref_layer = kt_int(r, 0, w.L - 1), nlive = 0;
    kva_batch *p1 = NULL, *p2 = NULL;
    kva_attn a, a2;
    for (i = 0; i < w.n; i++) nlive += w.alive[i];
    /* sometimes free a sequence, sometimes fork one (the fork appends below like the rest) */
    if (nlive > 1 && kt_int(r, 0, 4) == 0) {
      int v = kt_int(r, 0, w.n - 1);
      if (w.alive[v]) {
        for (ci = 0; ci < 2; ci++) KT_STATUS(kva_seq_free(w.c[ci], w.id[v][ci]), KVA_OK);
        w.alive[v] = 0;
      }
    }
    if (w.n < KB_MAXS && kt_int(r, 0, 3) == 0) {
      int src = kt_int(r, 0, w.n - 1);
      if (w.alive[src]) kb_w_fork(&w, r, src);
    }
    for (i = 0; i < w.n; i++) {
      newn[i] = 0;
      if (!w.alive[i]) continue;
      /* decode or a prefill chunk (short on long sequences: the fp64 reference and four library
         runs per layer stay cheap) */
      {
        int len = kva_seq_len(w.c[0], w.id[i][0]), cap = 20000 / (len + 1);
        cap = cap < 4 ? 4 : cap > 40 ? 40 : cap;
        newn[i] = kt_int(r, 0, 9) < 7 ? 1 : kt_int(r, 2, cap);
      }
      if (!kb_w_append(&w, r, i, newn[i])) newn[i] = 0;
    }
    /* the batch: a random subset in random order, some with n_q 0 */
    for (i = 0; i < w.n; i++)
      if (w.alive[i] && newn[i] > 0 && kt_int(r, 0, 9) > 0) order[nb++] = i;
    for (i = nb - 1; i > 0; i--) {
      int j = kt_int(r, 0, i), t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    for (i = 0; i < nb; i++)
      nq[i] = kt_int(r, 0, 9) == 0 ? 0 : kt_int(r, 0, 2) ? newn[order[i]] : kt_int(r, 1, newn[order[i]]);
    /* at least one row (a batch of only n_q 0 has its own test, test_batch_zero_rows) */
    for (i = 0; i < nb && nq[i] == 0; i++) {
    }
    if (nb > 0 && i == nb) nq[0] = newn[order[0]];
    for (i = 0; i < nb; i++) {
      int s = order[i];
      ids0[i] = w.id[s][0];
      qrow[i] = rows;
      rows += nq[i];
      /* (KV head, 64-row chunk) items; an H2O sequence counted as one per KV head too
         (whole rows per head), so the bit-identity claim below holds either way */
      items += w.h2o[s] ? (nq[i] > 0 ? w.G : 0) : w.G * kb_cdiv(nq[i] * w.R, 64);
    }
    kt_attn_init(&a, w.H, w.G, w.D, w.v_field);
    if (kt_int(r, 0, 3) == 0) {
      a.window = kt_int(r, 1, 3000);
      a.n_sink = kt_int(r, 0, 1) ? 0 : kt_int(r, 1, 6);
    }
    if (kt_int(r, 0, 4) == 0) a.softcap = 15.0f;
    a2 = a;
    a2.n_threads = 2;
    st = kva_batch_plan(w.c[0], &a, ids0, nq, nb, &p1);
    KT_CHECK(st == KVA_OK && p1, "kva_batch_plan = %d (step %d, %d seqs) (%s)", (int)st, step, nb, w.shape);
    st = kva_batch_plan(w.c[0], &a2, ids0, nq, nb, &p2);
    KT_CHECK(st == KVA_OK && p2, "kva_batch_plan (2 threads) = %d (%s)", (int)st, w.shape);
    if (!p1 || !p2) {
      kva_batch_free(p1);
      kva_batch_free(p2);
      break;
    }
    for (l = 0; l < w.L; l++) {
      size_t nqv = (size_t)rows * w.H * w.D, no = (size_t)rows * w.H * w.Dv;
      float *q = KT_ALLOC(float, nqv + 1), *q0 = KT_ALLOC(float, nqv + 1);
      float *o1 = KT_ALLOC(float, no + KB_GUARD), *o2 = KT_ALLOC(float, no + KB_GUARD);
      float *l1 = KT_ALLOC(float, (size_t)rows * w.H + KB_GUARD);
      long m0 = kt_mallocs;
      kt_fill(r, q, nqv, -1.0f, 1.0f);
      memcpy(q0, q, sizeof(float) * nqv);
      kt_fill_sentinel(o1, no + KB_GUARD);
      kt_fill_sentinel(o2, no + KB_GUARD);
      kt_fill_sentinel(l1, (size_t)rows * w.H + KB_GUARD);
      st = kva_attend_batch_lse(w.c[0], p1, l, q, o1, l1); /* layer 0 also runs without lse below: same bits */
      KT_CHECK(st == KVA_OK, "kva_attend_batch_lse(layer %d) = %d (step %d) (%s)", l, (int)st, step, w.shape);
      KT_CHECK(kt_all_sentinel(l1 + (size_t)rows * w.H, KB_GUARD), "kva_attend_batch_lse wrote past lse (%s)",
               w.shape);
      KT_CHECK(kt_mallocs == m0, "kva_attend_batch called KVATTN_MALLOC %ld times (%s)", kt_mallocs - m0,
               w.shape);
      KT_CHECK(kt_all_sentinel(o1 + no, KB_GUARD), "kva_attend_batch wrote past out (%s)", w.shape);
      KT_CHECK(kt_same_bits(q, q0, nqv), "kva_attend_batch modified q (%s)", w.shape);
      if (l == 0) { /* the 2-thread plan, on the first layer (the mirror attends twice there too) */
        int way;
        for (way = 0; way < 2; way++) { /* kva_attend_batch, then prepare + units + merges in pieces */
          kt_fill_sentinel(o2, no);
          st = way ? kb_run_in_pieces(r, w.c[0], p2, l, q, o2, NULL) : kva_attend_batch(w.c[0], p2, l, q, o2);
          KT_CHECK(st == KVA_OK && kt_same_bits(o1, o2, no),
                   "plans with n_threads 1 and 2 differ (%s; status %d, layer %d step %d) (%s)",
                   way ? "run in pieces" : "kva_attend_batch", (int)st, l, step, w.shape);
        }
      }
      for (i = 0; i < nb; i++) {
        int s = order[i], n_q = nq[i], len = kva_seq_len(w.c[0], w.id[s][0]);
        size_t on = (size_t)n_q * w.H * w.Dv;
        float *oc, *oc2, *ob = o1 + (size_t)qrow[i] * w.H * w.Dv;
        const float *qs = q + (size_t)qrow[i] * w.H * w.D;
        int split_b, split_c;
        char shape[512];
        if (n_q == 0) continue;
        oc = KT_ALLOC(float, on);
        oc2 = KT_ALLOC(float, on);
        /* the mirror attends as often as cache 0 did (three times on layer 0: threads 1 and 2,
           and in pieces), so H2O scores stay equal */
        KT_STATUS(kva_attend_cache(w.c[1], w.id[s][1], l, &a, qs, n_q, oc), KVA_OK);
        if (l == 0) {
          KT_STATUS(kva_attend_cache(w.c[1], w.id[s][1], l, &a2, qs, n_q, oc2), KVA_OK);
          KT_STATUS(kva_attend_cache(w.c[1], w.id[s][1], l, &a2, qs, n_q, oc2), KVA_OK);
          KT_CHECK(kt_same_bits(oc, oc2, on), "kva_attend_cache n_threads 1 vs 2 differ (%s)", w.shape);
        }
        split_b = !w.h2o[s] && kb_would_split(items, len);
        split_c = !w.h2o[s] && kb_would_split(w.G * kb_cdiv(n_q * w.R, 64), len);
        sprintf(shape, "%s; step %d layer %d, batch entry %d of %d (slot %d%s%s), n_q %d, len %d, items %d, win %d sink %d cap %g",
                w.shape, step, l, i, nb, s, w.h2o[s] ? ", H2O" : "", w.fork_of[s] >= 0 ? ", fork" : "", n_q, len,
                items, a.window, a.n_sink, (double)a.softcap);
        if (!split_b && !split_c) {
          kb_n_bitident++;
          KT_CHECK(kt_same_bits(ob, oc, on), "kva_attend_batch != kva_attend_cache bit for bit (no split-K in "
                   "either) (%s)", shape);
        } else {
          double err = 0.0, tol;
          size_t j;
          kb_n_tolcmp++;
          tol = KB_TOL_OUT * (1.0 + kb_vmax_seq(w.c[0], w.id[s][0], l, w.G, w.D, w.Dv));
          for (j = 0; j < on; j++) {
            double e = fabs((double)ob[j] - (double)oc[j]);
            if (!(e <= 1e300)) e = INFINITY;
            if (e > err) err = e;
          }
          if (err / tol > kb_worst_pair) kb_worst_pair = err / tol;
          KT_CHECK(err <= tol, "kva_attend_batch vs kva_attend_cache: err %.3g > tol %.3g (%s)", err, tol, shape);
        }
        if (l == ref_layer) {
          kb_snap sn;
          int sel[4], nsel = 0;
          if (n_q <= 3) {
            for (nsel = 0; nsel < n_q; nsel++) sel[nsel] = nsel;
          } else {
            sel[nsel++] = 0;
            sel[nsel++] = kt_int(r, 1, n_q - 2);
            sel[nsel++] = n_q - 1;
          }
          kb_snap_take(w.c[0], w.id[s][0], l, w.G, w.D, w.Dv, &sn);
          kb_check_cache_rows("kva_attend_batch_lse vs reference", shape, &sn, &a, qs, n_q,
                              kva_seq_pos(w.c[0], w.id[s][0]), sel, nsel, ob, l1 + (size_t)qrow[i] * w.H);
          kb_snap_free(&sn);
        }
        free(oc);
        free(oc2);
      }
      free(q);
      free(q0);
      free(o1);
      free(o2);
      free(l1);
    }
    kva_batch_free(p1);
    kva_batch_free(p2);
    for (i = 0; i < w.n; i++)
      if (w.alive[i] && w.h2o[i]) kb_w_same(&w, i);
  }
  for (i = 0; i < w.n; i++)
    if (w.alive[i]) kb_w_same(&w, i);
  for (ci = 0; ci < 2; ci++) kva_cache_destroy(w.c[ci]);
}

static void test_batch_random(void) {
  kt_rng r;
  int it, n = kt_quick ? 3 : 12;
  kt_begin("batch: kva_attend_batch on random batches vs reference and kva_attend_cache");
  kt_seed(&r, 0xBA7C4);
  for (it = 0; it < n; it++) kb_batch_scenario(&r, it);
}

/* a small cache with sequences s[0..n) holding lens[i] tokens (last append = last[i]) */
static kva_cache *kb_small_cache(kt_rng *r, int L, int G, int D, int Dv, kva_dtype dt, int n, const int *lens,
                                 const int *last, int *ids, kva_evict *ev) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  int i, tot = 0;
  for (i = 0; i < n; i++) tot += lens[i] + 64;
  kb_desc(&d, L, G, D, Dv, 16, kb_cdiv(tot, 16) + 4 * n + 8, dt);
  if (kva_cache_create(&d, &c) != KVA_OK) {
    KT_CHECK(0, "kva_cache_create failed");
    return NULL;
  }
  for (i = 0; i < n; i++) {
    KT_STATUS(kva_seq_new(c, &ids[i]), KVA_OK);
    if (ev) KT_STATUS(kva_seq_set_evict(c, ids[i], ev), KVA_OK);
    if (lens[i] > last[i]) kb_append_store(r, &c, &ids[i], 1, L, G, D, Dv, lens[i] - last[i]);
    kb_append_store(r, &c, &ids[i], 1, L, G, D, Dv, last[i]);
  }
  return c;
}

/* split-K with many merges (one sequence, 40 new rows x 4 query heads per KV
   head: 3 chunks x 2 KV heads = 6 items, each split in 2): prepare, units and
   merges cut into random pieces equal kva_attend_batch_lse bit for bit */
static void test_batch_pieces(void) {
  kt_rng r;
  kva_cache *c;
  int ids[1], lens[1] = {2100}, last[1] = {40}, nq[1] = {40}, round;
  kva_attn a;
  kva_batch *p = NULL;
  size_t no = (size_t)40 * 8 * 24, nl = (size_t)40 * 8;
  float *q = KT_ALLOC(float, no), *o1 = KT_ALLOC(float, no + KB_GUARD), *o2 = KT_ALLOC(float, no + KB_GUARD);
  float *l1 = KT_ALLOC(float, nl + KB_GUARD), *l2 = KT_ALLOC(float, nl + KB_GUARD);
  kt_begin("batch: a plan run in pieces (kva_batch_prepare / run_units / run_merges)");
  kt_seed(&r, 0x91EC);
  c = kb_small_cache(&r, 1, 2, 24, 24, KVA_F16, 1, lens, last, ids, NULL);
  kt_attn_init(&a, 8, 2, 24, 0);
  kt_fill(&r, q, no, -1.0f, 1.0f);
  if (c && kva_batch_plan(c, &a, ids, nq, 1, &p) == KVA_OK) {
    KT_CHECK(kva_batch_n_merges(p) == 6 && kva_batch_n_units(p) == 12, "expected 12 units and 6 merges, got %d and %d",
             kva_batch_n_units(p), kva_batch_n_merges(p));
    KT_STATUS(kva_attend_batch_lse(c, p, 0, q, o1, l1), KVA_OK);
    for (round = 0; round < 20; round++) {
      kt_fill_sentinel(o2, no + KB_GUARD);
      kt_fill_sentinel(l2, nl + KB_GUARD);
      KT_STATUS(kb_run_in_pieces(&r, c, p, 0, q, o2, round % 2 ? l2 : NULL), KVA_OK);
      KT_CHECK(kt_same_bits(o1, o2, no), "a plan run in pieces differs from kva_attend_batch_lse (round %d)", round);
      KT_CHECK(round % 2 ? kt_same_bits(l1, l2, nl) : kt_all_sentinel(l2, nl), "lse of a run in pieces (round %d)",
               round);
      KT_CHECK(kt_all_sentinel(o2 + no, KB_GUARD) && kt_all_sentinel(l2 + nl, KB_GUARD),
               "a run in pieces wrote past out or lse (round %d)", round);
    }
  } else {
    KT_CHECK(0, "setup of the pieces test failed");
  }
  kva_batch_free(p);
  kva_cache_destroy(c);
  free(q), free(o1), free(o2), free(l1), free(l2);
}

static void test_batch_args(void) {
  kt_rng r;
  kva_cache *c, *c2;
  int ids[3], ids2[1], lens[3] = {40, 7, 100}, last[3] = {5, 3, 1}, nq[3] = {2, 3, 1}, seqs[3], bad_nq[3];
  int len2[1] = {10}, last2[1] = {10}, fork = -1;
  kva_attn a, b;
  kva_batch *p, *dummy = (kva_batch *)&r; /* any non-NULL pointer: a failed plan must overwrite it */
  float q[8 * 4 * 24], out[8 * 4 * 24 + KB_GUARD];
  kt_begin("batch: kva_batch_plan / kva_attend_batch arguments");
  kt_seed(&r, 0xA965);
  c = kb_small_cache(&r, 2, 2, 24, 24, KVA_F32, 3, lens, last, ids, NULL);
  c2 = kb_small_cache(&r, 1, 1, 24, 24, KVA_F32, 1, len2, last2, ids2, NULL);
  if (!c || !c2) return;
  kt_fill(&r, q, sizeof q / sizeof q[0], -1.0f, 1.0f);
  kt_attn_init(&a, 4, 2, 24, 0);
  memcpy(seqs, ids, sizeof seqs);
#define KB_BAD_PLAN(call, want, what)                                                          \
  do {                                                                                         \
    kva_status st_;                                                                            \
    p = dummy;                                                                                 \
    st_ = (call);                                                                              \
    KT_CHECK(st_ == (want), "%s: status %d, expected %d", what, (int)st_, (int)(want));        \
    KT_CHECK(p == NULL, "%s: a failed kva_batch_plan left *plan non-NULL", what);              \
    if (p && p != dummy) kva_batch_free(p);                                                    \
  } while (0)
  KT_STATUS(kva_batch_plan(c, &a, seqs, nq, 3, NULL), KVA_ERR_ARG);
  KB_BAD_PLAN(kva_batch_plan(NULL, &a, seqs, nq, 3, &p), KVA_ERR_ARG, "cache NULL");
  KB_BAD_PLAN(kva_batch_plan(c, NULL, seqs, nq, 3, &p), KVA_ERR_ARG, "attn NULL");
  KB_BAD_PLAN(kva_batch_plan(c, &a, seqs, nq, -1, &p), KVA_ERR_ARG, "n_seqs < 0");
  KB_BAD_PLAN(kva_batch_plan(c, &a, NULL, nq, 3, &p), KVA_ERR_ARG, "seqs NULL");
  KB_BAD_PLAN(kva_batch_plan(c, &a, seqs, NULL, 3, &p), KVA_ERR_ARG, "n_q NULL");
  b = a;
  b.n_kv_heads = 1;
  KB_BAD_PLAN(kva_batch_plan(c, &b, seqs, nq, 3, &p), KVA_ERR_ARG, "G mismatch with the cache");
  b = a;
  b.n_heads = 2;
  b.n_kv_heads = 2;
  b.head_dim = 16;
  KB_BAD_PLAN(kva_batch_plan(c, &b, seqs, nq, 3, &p), KVA_ERR_ARG, "D mismatch with the cache");
  b = a;
  b.v_dim = 16;
  KB_BAD_PLAN(kva_batch_plan(c, &b, seqs, nq, 3, &p), KVA_ERR_ARG, "v_dim mismatch with the cache");
  b = a;
  b.n_heads = 3;
  KB_BAD_PLAN(kva_batch_plan(c, &b, seqs, nq, 3, &p), KVA_ERR_ARG, "H % G != 0");
  b = a;
  b.n_threads = -1;
  KB_BAD_PLAN(kva_batch_plan(c, &b, seqs, nq, 3, &p), KVA_ERR_ARG, "n_threads < 0");
  memcpy(bad_nq, nq, sizeof bad_nq);
  bad_nq[1] = -1;
  KB_BAD_PLAN(kva_batch_plan(c, &a, seqs, bad_nq, 3, &p), KVA_ERR_ARG, "n_q[1] < 0");
  bad_nq[1] = 4; /* its last append was 3 */
  KB_BAD_PLAN(kva_batch_plan(c, &a, seqs, bad_nq, 3, &p), KVA_ERR_STEP, "n_q[1] > the last append");
  seqs[2] = 12345;
  KB_BAD_PLAN(kva_batch_plan(c, &a, seqs, nq, 3, &p), KVA_ERR_SEQ, "unknown sequence");
  seqs[2] = -1;
  KB_BAD_PLAN(kva_batch_plan(c, &a, seqs, nq, 3, &p), KVA_ERR_SEQ, "negative sequence id");
  memcpy(seqs, ids, sizeof seqs);
  /* an argument error comes before a sequence error */
  seqs[2] = 12345;
  b = a;
  b.n_kv_heads = 1;
  KB_BAD_PLAN(kva_batch_plan(c, &b, seqs, nq, 3, &p), KVA_ERR_ARG, "G mismatch and an unknown sequence");
  KB_BAD_PLAN(kva_batch_plan(c, &a, seqs, nq, -2, &p), KVA_ERR_ARG, "n_seqs < 0 and an unknown sequence");
  memcpy(seqs, ids, sizeof seqs);
  /* good plans, then the run's arguments */
  p = dummy;
  KT_STATUS(kva_batch_plan(c, &a, seqs, nq, 3, &p), KVA_OK);
  KT_CHECK(p != NULL && p != dummy, "kva_batch_plan OK without a plan");
  if (p && p != dummy) {
    size_t no = (size_t)(2 + 3 + 1) * 4 * 24;
#define KB_BAD_RUN(call, want, what)                                                            \
  do {                                                                                          \
    kva_status st_;                                                                             \
    kt_fill_sentinel(out, sizeof out / sizeof out[0]);                                          \
    st_ = (call);                                                                               \
    KT_CHECK(st_ == (want), "%s: status %d, expected %d", what, (int)st_, (int)(want));         \
    KT_CHECK(kt_all_sentinel(out, sizeof out / sizeof out[0]), "%s: out changed on error", what); \
  } while (0)
    KT_STATUS(kva_batch_run_units(p, 0, 0), KVA_ERR_ARG); /* never prepared */
    KT_STATUS(kva_batch_run_merges(p, 0, 0), KVA_ERR_ARG);
    KB_BAD_RUN(kva_attend_batch(NULL, p, 0, q, out), KVA_ERR_ARG, "run: cache NULL");
    KB_BAD_RUN(kva_attend_batch(c, NULL, 0, q, out), KVA_ERR_ARG, "run: plan NULL");
    KB_BAD_RUN(kva_attend_batch(c, p, -1, q, out), KVA_ERR_ARG, "run: layer -1");
    KB_BAD_RUN(kva_attend_batch(c, p, 2, q, out), KVA_ERR_ARG, "run: layer == n_layers");
    KB_BAD_RUN(kva_attend_batch(c, p, 0, NULL, out), KVA_ERR_ARG, "run: q NULL");
    KB_BAD_RUN(kva_attend_batch(c, p, 0, q, NULL), KVA_ERR_ARG, "run: out NULL");
    KB_BAD_RUN(kva_attend_batch(c2, p, 0, q, out), KVA_ERR_ARG, "run: a plan of another cache (other G)");
    kt_fill_sentinel(out, sizeof out / sizeof out[0]);
    KT_STATUS(kva_attend_batch(c, p, 1, q, out), KVA_OK);
    KT_CHECK(kt_all_sentinel(out + no, KB_GUARD), "run wrote past its rows");
    { /* the same run in three steps, units and merges one at a time from the last */
      float out2[sizeof out / sizeof out[0]];
      int n_units = kva_batch_n_units(p), n_merges = kva_batch_n_merges(p), u;
      kt_fill_sentinel(out2, sizeof out2 / sizeof out2[0]);
      KT_STATUS(kva_batch_prepare(c, p, 1, q, out2, NULL), KVA_OK);
      KT_CHECK(n_units > 0, "a plan with rows has no units");
      KT_STATUS(kva_batch_run_units(p, -1, 0), KVA_ERR_ARG);
      KT_STATUS(kva_batch_run_units(p, 1, 0), KVA_ERR_ARG);
      KT_STATUS(kva_batch_run_units(p, 0, n_units + 1), KVA_ERR_ARG);
      KT_STATUS(kva_batch_run_merges(p, 0, n_merges + 1), KVA_ERR_ARG);
      for (u = n_units - 1; u >= 0; u--) KT_STATUS(kva_batch_run_units(p, u, u + 1), KVA_OK);
      for (u = n_merges - 1; u >= 0; u--) KT_STATUS(kva_batch_run_merges(p, u, u + 1), KVA_OK);
      KT_CHECK(kt_same_bits(out, out2, no), "kva_batch_prepare/run_units/run_merges != kva_attend_batch");
      KT_CHECK(kt_all_sentinel(out2 + no, KB_GUARD), "run_units wrote past its rows");
      KT_STATUS(kva_batch_prepare(c, p, 2, q, out2, NULL), KVA_ERR_ARG); /* a failed prepare unprepares */
      KT_STATUS(kva_batch_run_units(p, 0, n_units), KVA_ERR_ARG);
      KT_CHECK(kva_batch_n_units(NULL) == 0 && kva_batch_n_merges(NULL) == 0, "counts of a NULL plan");
      KT_STATUS(kva_batch_run_units(NULL, 0, 0), KVA_ERR_ARG);
      KT_STATUS(kva_batch_run_merges(NULL, 0, 0), KVA_ERR_ARG);
    }
    kva_batch_free(p);
  }
  /* zero sequences, and sequences all with n_q 0: no rows, NULL q / out allowed */
  p = dummy;
  KT_STATUS(kva_batch_plan(c, &a, NULL, NULL, 0, &p), KVA_OK);
  if (p && p != dummy) {
    KT_STATUS(kva_attend_batch(c, p, 0, NULL, NULL), KVA_OK);
    kva_batch_free(p);
  }
  kva_batch_free(NULL);
  /* a fork ends its source's latest append: n_q > 0 for the source is an argument error */
  KT_STATUS(kva_seq_fork(c, ids[0], &fork), KVA_OK);
  KB_BAD_PLAN(kva_batch_plan(c, &a, seqs, nq, 1, &p), KVA_ERR_STEP, "n_q > 0 right after a fork of the sequence");
  /* a freed sequence */
  KT_STATUS(kva_seq_free(c, ids[1]), KVA_OK);
  nq[0] = 0;
  KB_BAD_PLAN(kva_batch_plan(c, &a, seqs, nq, 3, &p), KVA_ERR_SEQ, "a freed sequence");
#undef KB_BAD_PLAN
#undef KB_BAD_RUN
  kva_cache_destroy(c);
  kva_cache_destroy(c2);
}

/* plans that no longer hold: a sequence grew, was truncated, was freed */
static void test_batch_stale(void) {
  kt_rng r;
  kva_cache *c;
  int ids[2], lens[2] = {300, 50}, last[2] = {4, 2}, nq[2] = {4, 2};
  kva_attn a;
  kva_batch *p = NULL, *p2 = NULL;
  float q[6 * 2 * 20], out[6 * 2 * 20 + KB_GUARD];
  kt_begin("batch: stale plans and freed sequences");
  kt_seed(&r, 0x57A1E);
  c = kb_small_cache(&r, 2, 1, 20, 20, KVA_F16, 2, lens, last, ids, NULL);
  if (!c) return;
  kt_fill(&r, q, sizeof q / sizeof q[0], -1.0f, 1.0f);
  kt_attn_init(&a, 2, 1, 20, 0);
  KT_STATUS(kva_batch_plan(c, &a, ids, nq, 2, &p), KVA_OK);
  KT_STATUS(kva_attend_batch(c, p, 0, q, out), KVA_OK);
  KT_STATUS(kva_attend_batch(c, p, 1, q, out), KVA_OK);
  /* sequence 1 grows: the plan no longer holds */
  kb_append_store(&r, &c, &ids[1], 1, 2, 1, 20, 20, 2);
  kt_fill_sentinel(out, sizeof out / sizeof out[0]);
  KT_STATUS(kva_attend_batch(c, p, 0, q, out), KVA_ERR_ARG);
  KT_CHECK(kt_all_sentinel(out, sizeof out / sizeof out[0]), "stale plan: out changed");
  kva_batch_free(p);
  p = NULL;
  KT_STATUS(kva_batch_plan(c, &a, ids, nq, 2, &p2), KVA_OK);
  KT_STATUS(kva_attend_batch(c, p2, 1, q, out), KVA_OK);
  /* truncation of a planned sequence */
  KT_STATUS(kva_seq_truncate(c, ids[0], lens[0] - 1), KVA_OK);
  kt_fill_sentinel(out, sizeof out / sizeof out[0]);
  KT_STATUS(kva_attend_batch(c, p2, 0, q, out), KVA_ERR_ARG);
  KT_CHECK(kt_all_sentinel(out, sizeof out / sizeof out[0]), "plan after truncate: out changed");
  kva_batch_free(p2);
  p2 = NULL;
  /* freed */
  kb_append_store(&r, &c, &ids[0], 1, 2, 1, 20, 20, 4);
  KT_STATUS(kva_batch_plan(c, &a, ids, nq, 2, &p), KVA_OK);
  KT_STATUS(kva_seq_free(c, ids[1]), KVA_OK);
  kt_fill_sentinel(out, sizeof out / sizeof out[0]);
  KT_STATUS(kva_attend_batch(c, p, 0, q, out), KVA_ERR_SEQ);
  KT_CHECK(kt_all_sentinel(out, sizeof out / sizeof out[0]), "plan with a freed sequence: out changed");
  kva_batch_free(p);
  kva_cache_destroy(c);
}

/* Under eviction a sequence's length stays the same from step to step, so a
   plan of an earlier step still "holds" by length.  If the library runs it,
   the results must be those of a fresh plan (a mirrored cache runs fresh
   plans): first with the policy unchanged, then after the sequence switched
   from WINDOW to H2O (its H2O scores then come from this run, and the
   evictions that follow must match the mirror's). */
static void test_batch_same_len(void) {
  enum { BUDGET = 2100, D = 40, H = 4 };
  kt_rng r;
  kva_cache *c[2];
  int ids[2][1], lens[1] = {BUDGET}, last[1] = {1}, nq[1] = {1}, ci, stp;
  kva_evict ev;
  kva_attn a;
  kva_batch *old = NULL;
  float q[H * D], o[2][H * D];
  kt_begin("batch: a plan reused while the length stays the same (eviction)");
  kt_seed(&r, 0x5A3E);
  memset(&ev, 0, sizeof ev);
  ev.kind = KVA_EVICT_WINDOW;
  ev.budget = BUDGET;
  for (ci = 0; ci < 2; ci++) {
    kt_rng rr = r; /* the same K/V in both caches */
    c[ci] = kb_small_cache(&rr, 1, 1, D, D, KVA_F32, 1, lens, last, ids[ci], &ev);
    if (!c[ci]) return;
  }
  kt_seed(&r, 0x5A3F);
  kt_attn_init(&a, H, 1, D, 0);
  for (stp = 0; stp < 6; stp++) {
    kva_status st0;
    int idp[2];
    kva_batch *fresh = NULL;
    idp[0] = ids[0][0];
    idp[1] = ids[1][0];
    if (stp == 2) { /* switch to H2O: applies from the next append */
      memset(&ev, 0, sizeof ev);
      ev.kind = KVA_EVICT_H2O;
      ev.budget = BUDGET;
      ev.n_recent = 8;
      for (ci = 0; ci < 2; ci++) KT_STATUS(kva_seq_set_evict(c[ci], ids[ci][0], &ev), KVA_OK);
    }
    kb_append_store(&r, c, idp, 2, 1, 1, D, D, 1);
    KT_CHECK(kva_seq_len(c[0], ids[0][0]) == BUDGET, "length %d, want %d", kva_seq_len(c[0], ids[0][0]), BUDGET);
    kt_fill(&r, q, H * D, -1.0f, 1.0f);
    if (!old) KT_STATUS(kva_batch_plan(c[0], &a, ids[0], nq, 1, &old), KVA_OK);
    KT_STATUS(kva_batch_plan(c[1], &a, ids[1], nq, 1, &fresh), KVA_OK);
    if (!old || !fresh) break;
    kt_fill_sentinel(o[0], H * D);
    st0 = kva_attend_batch(c[0], old, 0, q, o[0]);
    KT_STATUS(kva_attend_batch(c[1], fresh, 0, q, o[1]), KVA_OK);
    kva_batch_free(fresh);
    if (st0 == KVA_ERR_ARG) { /* detected as stale: fine; plan afresh from here on */
      KT_CHECK(kt_all_sentinel(o[0], H * D), "step %d: stale plan refused but out changed", stp);
      kva_batch_free(old);
      old = NULL;
      KT_STATUS(kva_batch_plan(c[0], &a, ids[0], nq, 1, &old), KVA_OK);
      if (!old) break;
      st0 = kva_attend_batch(c[0], old, 0, q, o[0]);
    }
    KT_CHECK(st0 == KVA_OK, "step %d: kva_attend_batch = %d", stp, (int)st0);
    KT_CHECK(kt_same_bits(o[0], o[1], H * D),
             "step %d (%s): a plan from an earlier step with the same length gave other results than a fresh "
             "plan", stp, stp < 2 ? "WINDOW" : "after the switch to H2O");
  }
  kva_batch_free(old);
  {
    kb_world w;
    memset(&w, 0, sizeof w);
    w.c[0] = c[0];
    w.c[1] = c[1];
    w.L = 1;
    w.G = 1;
    w.D = w.Dv = D;
    w.n = 1;
    w.id[0][0] = ids[0][0];
    w.id[0][1] = ids[1][0];
    w.alive[0] = w.h2o[0] = 1;
    sprintf(w.shape, "same-length plan reuse, H2O budget %d", BUDGET);
    kb_w_same(&w, 0);
  }
  for (ci = 0; ci < 2; ci++) kva_cache_destroy(c[ci]);
}

/* every sequence with n_q 0: a plan without rows (runs last in this file:
   a crash here would hide nothing else) */
static void test_batch_zero_rows(void) {
  kt_rng r;
  kva_cache *c;
  int ids[3], lens[3] = {3000, 7, 100}, last[3] = {5, 3, 1}, zero[3] = {0, 0, 0}, i;
  kva_attn a;
  kva_batch *p = NULL;
  float q[4 * 24], out[4 * 24];
  kt_begin("batch: a plan whose sequences all have n_q 0");
  kt_seed(&r, 0x2E60);
  c = kb_small_cache(&r, 2, 2, 24, 24, KVA_F32, 3, lens, last, ids, NULL);
  if (!c) return;
  kt_attn_init(&a, 4, 2, 24, 0);
  kt_fill(&r, q, sizeof q / sizeof q[0], -1.0f, 1.0f);
  for (i = 1; i <= 3; i++) {
    p = NULL;
    KT_STATUS(kva_batch_plan(c, &a, ids, zero, i, &p), KVA_OK);
    KT_CHECK(p != NULL, "plan of %d sequences with n_q 0: no plan", i);
    if (!p) continue;
    kt_fill_sentinel(out, sizeof out / sizeof out[0]);
    KT_STATUS(kva_attend_batch(c, p, 0, NULL, NULL), KVA_OK);
    KT_STATUS(kva_attend_batch(c, p, 1, q, out), KVA_OK);
    KT_CHECK(kt_all_sentinel(out, sizeof out / sizeof out[0]), "all n_q 0: out written");
    kva_batch_free(p);
  }
  kva_cache_destroy(c);
}

typedef struct {
  const char *name;
  void (*fn)(void);
} kb_sub;

/* A cache with alloc_fn gives every temporary through it: split-K partials of
   a prefill chunk that overflow the stack scratch, and batch plans; the
   outputs equal those of the same cache without alloc_fn, and no block is
   taken from KVATTN_MALLOC meanwhile.                                       */
typedef struct {
  long takes, gives;
  size_t live;
} kb_heap_count;

static void *kb_heap_alloc(size_t size, size_t align, void *user) {
  kb_heap_count *h = (kb_heap_count *)user;
  unsigned char *raw = KT_ALLOC(unsigned char, size + align + sizeof(void *)), *al = raw + sizeof(void *);
  al += (align - (uintptr_t)al % align) % align;
  ((void **)al)[-1] = raw;
  h->takes++;
  h->live += size;
  return al;
}

static void kb_heap_free(void *p, size_t size, void *user) {
  kb_heap_count *h = (kb_heap_count *)user;
  h->gives++;
  h->live -= size;
  free(((void **)p)[-1]);
}

static void test_cache_heap(void) {
  enum { G = 1, R = 32, H = G * R, D = 64, LEN = 2600, NQ = 6 };
  kt_rng r;
  kva_cache_desc d;
  kva_cache *c[2] = {NULL, NULL};
  kb_heap_count h;
  int seq[2], i;
  float *q, *o[2], *ob;
  kva_attn a;
  kva_batch *plan = NULL;
  long m0;
  kt_begin("batch: temporaries of a cache with alloc_fn come from it");
  kt_seed(&r, 0x4EA9);
  memset(&h, 0, sizeof h);
  for (i = 0; i < 2; i++) {
    kb_desc(&d, 1, G, D, 0, 16, LEN / 16 + 4, KVA_F16);
    if (i == 1) {
      d.alloc_fn = kb_heap_alloc;
      d.free_fn = kb_heap_free;
      d.user = &h;
    }
    KT_STATUS(kva_cache_create(&d, &c[i]), KVA_OK);
    if (!c[i]) return;
    KT_STATUS(kva_seq_new(c[i], &seq[i]), KVA_OK);
  }
  kt_seed(&r, 0x4EA9);
  kb_append_store(&r, &c[0], &seq[0], 1, 1, G, D, D, LEN - NQ);
  kb_append_store(&r, &c[0], &seq[0], 1, 1, G, D, D, NQ);
  kt_seed(&r, 0x4EA9);
  kb_append_store(&r, &c[1], &seq[1], 1, 1, G, D, D, LEN - NQ);
  kb_append_store(&r, &c[1], &seq[1], 1, 1, G, D, D, NQ);
  kt_attn_init(&a, H, G, D, 0);
  q = KT_ALLOC(float, (size_t)NQ * H * D);
  o[0] = KT_ALLOC(float, (size_t)NQ * H * D);
  o[1] = KT_ALLOC(float, (size_t)NQ * H * D);
  ob = KT_ALLOC(float, (size_t)NQ * H * D);
  kt_fill(&r, q, (size_t)NQ * H * D, -1.0f, 1.0f);
  /* 6 rows x 32 heads: 3 chunks of 64 rows, < 8 items over 2,600 keys: split-K whose partials
     (3 items x 2 splits x 64 rows x 65 floats) overflow the 16,512-float stack scratch */
  KT_STATUS(kva_attend_cache(c[0], seq[0], 0, &a, q, NQ, o[0]), KVA_OK);
  m0 = kt_mallocs;
  KT_STATUS(kva_attend_cache(c[1], seq[1], 0, &a, q, NQ, o[1]), KVA_OK);
  KT_CHECK(h.takes == 1 + 1 && h.gives == 1, "prefill with split-K: alloc_fn %ld takes, %ld gives (want the cache "
           "and one temporary, given back)", h.takes, h.gives);
  KT_CHECK(kt_mallocs == m0, "prefill on a cache with alloc_fn called KVATTN_MALLOC %ld times", kt_mallocs - m0);
  KT_CHECK(kt_same_bits(o[0], o[1], (size_t)NQ * H * D), "outputs differ with and without alloc_fn");
  {
    int nq = NQ;
    KT_STATUS(kva_batch_plan(c[1], &a, &seq[1], &nq, 1, &plan), KVA_OK);
    KT_CHECK(h.takes == 3 && kt_mallocs == m0, "kva_batch_plan: alloc_fn takes %ld (want 3), KVATTN_MALLOC %ld",
             h.takes, kt_mallocs - m0);
    if (plan) {
      KT_STATUS(kva_attend_batch(c[1], plan, 0, q, ob), KVA_OK);
      kva_batch_free(plan);
    }
    KT_CHECK(h.gives == 2, "kva_batch_free gave %ld blocks back through free_fn (want 2 in all)", h.gives);
  }
  { /* kva_batch_replan: in place while the step's plan fits the block, else a new block for the old one */
    int n_small = 1, n_big = NQ;
    long takes0 = h.takes, gives0 = h.gives;
    kva_batch *fresh = NULL, *before;
    float *of = KT_ALLOC(float, (size_t)NQ * H * D);
    plan = NULL;
    KT_STATUS(kva_batch_replan(c[1], &a, &seq[1], &n_small, 1, &plan), KVA_OK); /* NULL: a new plan */
    KT_CHECK(h.takes == takes0 + 1, "replan from NULL: %ld takes", h.takes - takes0);
    before = plan;
    KT_STATUS(kva_batch_replan(c[1], &a, &seq[1], &n_big, 1, &plan), KVA_OK); /* larger: moves */
    KT_CHECK(h.takes == takes0 + 2 && h.gives == gives0 + 1, "growing replan: %ld takes, %ld gives",
             h.takes - takes0, h.gives - gives0);
    before = plan;
    KT_STATUS(kva_batch_replan(c[1], &a, &seq[1], &n_small, 1, &plan), KVA_OK); /* smaller: in place */
    KT_STATUS(kva_batch_replan(c[1], &a, &seq[1], &n_big, 1, &plan), KVA_OK);   /* fits again: in place */
    KT_CHECK(plan == before && h.takes == takes0 + 2 && h.gives == gives0 + 1,
             "replans that fit moved the plan or allocated (%ld takes, %ld gives)", h.takes - takes0,
             h.gives - gives0);
    KT_STATUS(kva_batch_plan(c[1], &a, &seq[1], &n_big, 1, &fresh), KVA_OK);
    if (plan && fresh) {
      KT_STATUS(kva_attend_batch(c[1], plan, 0, q, ob), KVA_OK);
      KT_STATUS(kva_attend_batch(c[1], fresh, 0, q, of), KVA_OK);
      KT_CHECK(kt_same_bits(ob, of, (size_t)NQ * H * D), "a replanned plan attends differently from a fresh one");
    }
    n_big = NQ + 1; /* beyond the step: refused, the plan stays as it was */
    KT_STATUS(kva_batch_replan(c[1], &a, &seq[1], &n_big, 1, &plan), KVA_ERR_STEP);
    KT_CHECK(plan == before, "a refused replan changed *plan");
    KT_STATUS(kva_batch_replan(c[1], &a, &seq[1], &n_small, 1, NULL), KVA_ERR_ARG);
    kva_batch_free(plan);
    kva_batch_free(fresh);
    free(of);
  }
  kva_cache_destroy(c[0]);
  kva_cache_destroy(c[1]);
  KT_CHECK(h.takes == h.gives && h.live == 0, "alloc_fn: %ld takes, %ld gives, %lu bytes live", h.takes, h.gives,
           (unsigned long)h.live);
  free(q);
  free(o[0]);
  free(o[1]);
  free(ob);
}

void test_batch(void) {
  static const kb_sub subs[] = {
      {"cache heap", test_cache_heap},
      {"split directed", test_split_directed}, {"split random", test_split_random},
      {"split cache", test_split_cache},       {"merge partitions", test_merge_partitions},
      {"merge special", test_merge_special},   {"merge cascade", test_merge_cascade},
      {"merge args", test_merge_args},         {"batch args", test_batch_args},
      {"batch pieces", test_batch_pieces},     {"batch stale", test_batch_stale},
      {"batch same len", test_batch_same_len},
      {"batch random", test_batch_random},     {"batch zero rows", test_batch_zero_rows}};
  long m_start = kt_mallocs, f_start = kt_frees;
  int verbose = getenv("KVA_TEST_VERBOSE") != NULL, i;
  for (i = 0; i < (int)(sizeof subs / sizeof subs[0]); i++) {
    clock_t t0 = clock();
    subs[i].fn();
    if (verbose)
      fprintf(stderr, "    batch/%-16s %.2f s cpu\n", subs[i].name, (double)(clock() - t0) / CLOCKS_PER_SEC);
  }
  kt_begin("batch: every allocation freed");
  KT_CHECK(kt_mallocs - m_start == kt_frees - f_start,
           "this file's library copy took %ld blocks and freed %ld (caches, plans, scratch)", kt_mallocs - m_start,
           kt_frees - f_start);
  if (verbose)
    fprintf(stderr,
            "  batch: %ld split-K cases, %ld batch rows bit-identical / %ld by tolerance, %ld empty rows; worst "
            "err/tol: out %.3f, lse %.3f, pair %.3f, merge out %.3f lse %.3f\n",
            kb_n_split_cases, kb_n_bitident, kb_n_tolcmp, kb_n_neg_inf_rows, kb_worst_out, kb_worst_lse,
            kb_worst_pair, kb_worst_merge_out, kb_worst_merge_lse);
}
