/* test_tree.c - tree attention (kva_attn.tree_parent) and kva_seq_accept.
 *
 * Written from the documented behaviour, not from kvattn.h's code.  A tree
 * step's n new tokens carry parent[i] in -1 .. i-1 (-1: the cached prefix);
 * node i sits at base + depth(i) (base = the first new position) and sees
 * the prefix (causal / window / sink rules against that position) and the
 * nodes on its own path to the prefix.  The test builds, from the parent
 * array alone and by walking each node's ancestors, the effective positions
 * and an explicit mask, and compares with ref_attend_masked (ref.h, fp64):
 *
 *  - kva_attend (arrays; q_pos and kv_pos NULL) and kva_attend_cache(_lse),
 *    random shapes (H % G == 0, head sizes off multiples of 8, prefixes of 0,
 *    block boundaries and beyond, 1..40 nodes and a few larger trees, chains,
 *    stars, forests, binary and random trees), window with sinks, ALiBi,
 *    soft-cap, scale, every cache storage type (F32, F16, BF16, INT8, FP8
 *    E4M3 / E5M2, K and V apart), WINDOW / H2O eviction before the step:
 *    the reference attends over the values the cache holds (kva_seq_read, per
 *    KV head positions), so storage adds no error and the tolerances are the
 *    ones of test_attend / test_batch:
 *        out: |out - ref| <= 2e-5 * (1 + max|v|),  lse: <= 1e-5 * (1 + |lse|)
 *    (any wrong mask, position or ALiBi distance moves outputs by 1e-3 or more).
 *  - a chain tree is the linear causal call bit for bit (arrays, cache,
 *    batch, kva_gqa_forward);
 *  - kva_batch_plan / replan with every sequence's tree concatenated in plan
 *    order == kva_attend_cache_lse per sequence, bit for bit (no split-K:
 *    every sequence holds < 2048 keys), after the caller's tree array was
 *    overwritten (the plan keeps its own copy);
 *  - kva_gqa_forward with a tree: node i is rotated at base + depth(i): for
 *    every leaf, a twin sequence that forwards prefix + the leaf's path
 *    linearly holds bit-identical K/V for the path's nodes and gives the
 *    same outputs (to 2e-5 * (1 + max|y|): the tree's masked keys change the
 *    tiles' summation order); after kva_seq_accept of a path the sequence
 *    equals its twin bit for bit and decodes identically;
 *  - argument errors (parents >= i or < -1, non_causal with a tree, q_pos /
 *    kv_pos with a tree) are KVA_ERR_ARG with outputs and cache unchanged.
 *
 * kva_seq_accept: the kept tokens move to consecutive slots and positions in
 * every layer and KV head, the rest of the sequence is untouched, len and pos
 * shrink, blocks are released; the sequence is then bit-identical (read-back
 * and later attention) to a twin that only ever appended the kept tokens'
 * K/V; H2O scores move with their tokens (a later eviction keeps exactly the
 * heavy kept tokens, per layer and KV head); forks and published blocks keep
 * their data; a full pool gives KVA_ERR_FULL with nothing changed; argument
 * errors change nothing (not even the step); keep = {0..k-1} is
 * kva_seq_truncate; an evicted sequence may only reach into its newest step. */
#include "kvattn.h"
#include "harness.h"
#include "ref.h"

#define TT_TOL_OUT 2e-5
#define TT_TOL_LSE 1e-5
#define TT_GUARD 8

static double tt_worst_out, tt_worst_lse;
static long tt_rows_checked, tt_bitwise_checked;

static const kva_dtype tt_dtypes[6] = {KVA_F32, KVA_F16, KVA_BF16, KVA_INT8, KVA_FP8_E4M3, KVA_FP8_E5M2};
static const int tt_dims[] = {1, 2, 3, 5, 8, 13, 16, 24, 32, 64, 100, 128};
#define TT_NDIMS ((int)(sizeof tt_dims / sizeof tt_dims[0]))

static int tt_cdiv(int a, int b) { return (a + b - 1) / b; }

/* ======================================================================== */
/* Trees                                                                    */

enum { TT_CHAIN, TT_STAR, TT_ROOTED_STAR, TT_RANDOM, TT_DEEP, TT_BINARY, TT_FOREST, TT_KINDS };
static const char *const tt_kind_names[TT_KINDS] = {"chain", "star", "rooted star", "random",
                                                    "deep",  "binary", "forest"};

static void tt_tree(kt_rng *r, int32_t *par, int n, int kind) {
  int i;
  for (i = 0; i < n; i++) {
    switch (kind) {
      case TT_CHAIN: par[i] = i - 1; break;
      case TT_STAR: par[i] = -1; break;
      case TT_ROOTED_STAR: par[i] = i == 0 ? -1 : 0; break;
      case TT_RANDOM: par[i] = kt_int(r, -1, i - 1); break;
      case TT_DEEP: par[i] = kt_int(r, 0, 3) ? i - 1 : kt_int(r, -1, i - 1); break;
      case TT_BINARY: par[i] = i == 0 ? -1 : (i - 1) / 2; break;
      default: par[i] = (i == 0 || kt_int(r, 0, 3) == 0) ? -1 : kt_int(r, i - 4 < 0 ? 0 : i - 4, i - 1); break;
    }
  }
}

/* depth: the number of ancestors among the new tokens */
static int tt_depth(const int32_t *par, int i) {
  int d = 0;
  while (par[i] != -1) {
    i = par[i];
    d++;
  }
  return d;
}

/* 1 iff node j is node i or one of its ancestors (walk i's parents) */
static int tt_sees(const int32_t *par, int i, int j) {
  int x;
  for (x = i; x != -1; x = par[x])
    if (x == j) return 1;
  return 0;
}

/* path[] = the nodes from the prefix down to `node`, ascending; returns its length */
static int tt_path_to(const int32_t *par, int node, int32_t *path) {
  int k = 0, x, i;
  for (x = node; x != -1; x = par[x]) path[k++] = x;
  for (i = 0; i < k / 2; i++) {
    int32_t t = path[i];
    path[i] = path[k - 1 - i];
    path[k - 1 - i] = t;
  }
  return k;
}

static int tt_is_leaf(const int32_t *par, int n, int i) {
  int j;
  for (j = i + 1; j < n; j++)
    if (par[j] == i) return 0;
  return 1;
}

/* a random leaf's path; returns its length */
static int tt_random_path(kt_rng *r, const int32_t *par, int n, int32_t *path) {
  int leaf = kt_int(r, 0, n - 1);
  while (!tt_is_leaf(par, n, leaf)) leaf++; /* the last node is always a leaf */
  return tt_path_to(par, leaf, path);
}

/* Effective positions and the mask of a tree step over n_kv keys whose last
   n_q are the nodes (node j = key n_kv - n_q + j) and whose first ones are the
   cached prefix (visible as far as the mask goes).  par NULL: the linear
   case (node j at base + j, every key allowed, the causal rule does the rest).
   kpos is [G][n_kv]; its prefix entries are the caller's. */
static void tt_layout(const int32_t *par, int n_q, int n_kv, int32_t base, int G, int32_t *qpos, int32_t *kpos,
                      unsigned char *mask) {
  int pre = n_kv - n_q, i, j, g;
  for (i = 0; i < n_q; i++) qpos[i] = base + (par ? tt_depth(par, i) : i);
  for (g = 0; g < G; g++)
    for (j = 0; j < n_q; j++) kpos[(size_t)g * n_kv + pre + j] = base + (par ? tt_depth(par, j) : j);
  for (i = 0; i < n_q; i++)
    for (j = 0; j < n_kv; j++)
      mask[(size_t)i * n_kv + j] = (unsigned char)(j < pre || !par ? 1 : tt_sees(par, i, j - pre));
}

/* ======================================================================== */
/* Comparisons                                                              */

/* window / sinks, soft-cap, ALiBi, scale, threads at random */
static void tt_random_opts(kt_rng *r, kva_attn *a, int n_kv) {
  static const float caps[] = {2.5f, 20.0f, 50.0f};
  if (kt_int(r, 0, 2) == 0) {
    a->window = kt_int(r, 0, 2) ? kt_int(r, 1, n_kv + 2) : kt_int(r, 1, 4);
    if (kt_int(r, 0, 1)) a->n_sink = kt_int(r, 1, 6);
  }
  if (kt_int(r, 0, 3) == 0) a->softcap = caps[kt_int(r, 0, 2)];
  if (kt_int(r, 0, 3) == 0) a->alibi_max_bias = kt_int(r, 0, 1) ? 8.0f : kt_uniform(r, 0.5f, 16.0f);
  if (kt_int(r, 0, 2) == 0) a->scale = kt_uniform(r, 0.05f, 1.0f);
  a->n_threads = kt_int(r, 0, 2);
}

static void tt_shape(char *buf, size_t cap, const kva_attn *a, int n_q, int n_kv, const char *tree) {
  snprintf(buf, cap, "H=%d G=%d D=%d Dv=%d n_q=%d n_kv=%d tree=%s win=%d sink=%d cap=%g alibi=%g scale=%g",
           a->n_heads, a->n_kv_heads, a->head_dim, a->v_dim, n_q, n_kv, tree, a->window, a->n_sink,
           (double)a->softcap, (double)a->alibi_max_bias, (double)a->scale);
}

/* the library's out / lse (lse may be NULL) against the reference */
static void tt_compare(const char *label, const char *shape, const float *out, const float *lse, const double *ro,
                       const double *rl, int n_q, int H, int Dv, double vmax) {
  size_t no = (size_t)n_q * H * Dv, nl = (size_t)n_q * H, i, where = 0;
  double tol = TT_TOL_OUT * (1.0 + vmax), err = ref_max_err(out, ro, no, &where);
  if (err / tol > tt_worst_out) tt_worst_out = err / tol;
  tt_rows_checked += (long)nl;
  KT_CHECK(err <= tol, "%s: out err %.3g > tol %.3g at [q %d][h %d][d %d]: got %.9g want %.9g (%s)", label, err,
           tol, (int)(where / ((size_t)H * Dv)), (int)(where / Dv % H), (int)(where % Dv),
           no ? (double)out[where] : 0.0, no ? ro[where] : 0.0, shape);
  for (i = 0; i < nl; i++) {
    if (rl[i] == -INFINITY) {
      int d, zero = 1;
      for (d = 0; d < Dv; d++) zero &= out[i * Dv + d] == 0.0f;
      KT_CHECK(zero, "%s: row %d head %d sees nothing but out is not zero (%s)", label, (int)(i / H),
               (int)(i % H), shape);
      if (lse) KT_CHECK(lse[i] == -INFINITY, "%s: row %d sees nothing, lse %g (%s)", label, (int)(i / H),
                        (double)lse[i], shape);
    } else if (lse) {
      double tl = TT_TOL_LSE * (1.0 + fabs(rl[i])), e = fabs((double)lse[i] - rl[i]);
      if (!(e <= 1e300)) e = INFINITY;
      if (e / tl > tt_worst_lse) tt_worst_lse = e / tl;
      KT_CHECK(e <= tl, "%s: lse[%d][%d] = %.9g, want %.9g (tol %.3g; %s)", label, (int)(i / H), (int)(i % H),
               (double)lse[i], rl[i], tl, shape);
    }
  }
}

/* What a layer of a sequence holds, read back: k [n][G][D], v [n][G][Dv]
   (double), positions [G][n]. */
typedef struct {
  int n;
  double *k, *v, vmax;
  int32_t *pos;
} tt_held;

static int tt_read(kva_cache *c, int seq, int layer, int G, int D, int Dv, tt_held *h) {
  int s, g, i, ok = 1;
  float *kf = KT_ALLOC(float, (size_t)G * D), *vf = KT_ALLOC(float, (size_t)G * Dv);
  int32_t *pf = KT_ALLOC(int32_t, G);
  h->n = kva_seq_len(c, seq);
  h->k = KT_ALLOC(double, (size_t)(h->n > 0 ? h->n : 1) * G * D);
  h->v = KT_ALLOC(double, (size_t)(h->n > 0 ? h->n : 1) * G * Dv);
  h->pos = KT_ALLOC(int32_t, (size_t)(h->n > 0 ? h->n : 1) * G);
  h->vmax = 0.0;
  for (s = 0; s < h->n; s++) {
    kva_status st = kva_seq_read(c, seq, layer, s, kf, vf, pf);
    if (st != KVA_OK) {
      KT_CHECK(0, "kva_seq_read(seq %d, layer %d, slot %d) = %d", seq, layer, s, (int)st);
      ok = 0;
      break;
    }
    for (i = 0; i < G * D; i++) h->k[(size_t)s * G * D + i] = (double)kf[i];
    for (i = 0; i < G * Dv; i++) {
      h->v[(size_t)s * G * Dv + i] = (double)vf[i];
      if (fabs((double)vf[i]) > h->vmax) h->vmax = fabs((double)vf[i]);
    }
    for (g = 0; g < G; g++) h->pos[(size_t)g * h->n + s] = pf[g];
  }
  free(kf);
  free(vf);
  free(pf);
  return ok;
}

static void tt_held_free(tt_held *h) {
  free(h->k);
  free(h->v);
  free(h->pos);
}

/* The reference for the newest n_q tokens of seq (tree par, NULL: linear)
   over what `layer` holds: ro [n_q][H][Dv], rl [n_q][H]; returns max|v|.
   Also checks that the new tokens' slots hold positions base .. base+n_q-1. */
static double tt_ref_cache(kva_cache *c, int seq, int layer, const kva_attn *a, const int32_t *par, const float *q,
                           int n_q, double *ro, double *rl, const char *label) {
  ref_attn_cfg cfg = ref_cfg(a);
  tt_held h;
  int32_t base = (int32_t)(kva_seq_pos(c, seq) - n_q), *qpos;
  unsigned char *mask;
  double *rq;
  int g, j, bad = 0;
  if (!tt_read(c, seq, layer, cfg.G, cfg.D, cfg.Dv, &h)) {
    tt_held_free(&h);
    return 0.0;
  }
  for (g = 0; g < cfg.G; g++)
    for (j = 0; j < n_q; j++) bad += h.pos[(size_t)g * h.n + h.n - n_q + j] != base + j;
  KT_CHECK(bad == 0, "%s: the newest %d slots do not hold positions %d.. (%d wrong)", label, n_q, (int)base, bad);
  qpos = KT_ALLOC(int32_t, n_q);
  mask = KT_ALLOC(unsigned char, (size_t)n_q * (h.n > 0 ? h.n : 1));
  tt_layout(par, n_q, h.n, base, cfg.G, qpos, h.pos, mask);
  rq = ref_dup_f(q, (size_t)n_q * cfg.H * cfg.D);
  ref_attend_masked_heads(&cfg, rq, n_q, h.k, h.v, h.n, qpos, h.pos, (size_t)h.n, mask, ro, rl);
  free(rq);
  free(qpos);
  free(mask);
  tt_held_free(&h);
  return h.vmax;
}

/* kva_attend_cache_lse of the newest n_q tokens with tree par against the
   reference over the cache's values; kva_attend_cache gives the same bits. */
static void tt_check_cache_tree(kva_cache *c, int seq, int layer, const kva_attn *a0, const int32_t *par,
                                const float *q, int n_q, const char *label, const char *kind) {
  kva_attn a = *a0;
  int H = a.n_heads, Dv = a.v_dim ? a.v_dim : a.head_dim;
  size_t no = (size_t)n_q * H * Dv, nl = (size_t)n_q * H;
  float *out = KT_ALLOC(float, no + TT_GUARD), *out2 = KT_ALLOC(float, no + TT_GUARD),
        *lse = KT_ALLOC(float, nl + TT_GUARD);
  double *ro = KT_ALLOC(double, no + 1), *rl = KT_ALLOC(double, nl + 1), vmax;
  char shape[320];
  kva_status st;
  a.tree_parent = par;
  tt_shape(shape, sizeof shape, &a, n_q, kva_seq_len(c, seq), kind);
  kt_fill_sentinel(out, no + TT_GUARD);
  kt_fill_sentinel(out2, no + TT_GUARD);
  kt_fill_sentinel(lse, nl + TT_GUARD);
  st = kva_attend_cache_lse(c, seq, layer, &a, q, n_q, out, lse);
  KT_CHECK(st == KVA_OK, "%s: kva_attend_cache_lse = %d (%s)", label, (int)st, shape);
  st = kva_attend_cache(c, seq, layer, &a, q, n_q, out2);
  KT_CHECK(st == KVA_OK, "%s: kva_attend_cache = %d (%s)", label, (int)st, shape);
  KT_CHECK(kt_all_sentinel(out + no, TT_GUARD) && kt_all_sentinel(lse + nl, TT_GUARD) &&
               kt_all_sentinel(out2 + no, TT_GUARD),
           "%s: wrote past out / lse (%s)", label, shape);
  KT_CHECK(kt_same_bits(out, out2, no), "%s: out with and without lse differ (%s)", label, shape);
  vmax = tt_ref_cache(c, seq, layer, &a, par, q, n_q, ro, rl, label);
  tt_compare(label, shape, out, lse, ro, rl, n_q, H, Dv, vmax);
  free(out);
  free(out2);
  free(lse);
  free(ro);
  free(rl);
}

/* ======================================================================== */
/* Caches, K/V, snapshots                                                   */

static kva_cache *tt_cache(kt_rng *r, int L, int G, int D, int Dv, int bs, int n_blocks, kva_dtype kt, kva_dtype vt) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_status st;
  memset(&d, 0, sizeof d);
  d.kind = KVA_CACHE_KV;
  d.n_layers = L;
  d.n_kv_heads = G;
  d.head_dim = D;
  d.v_dim = Dv;
  d.block_size = bs;
  d.n_blocks = n_blocks;
  d.dtype = kt;
  d.v_dtype = vt;
  d.k_scale = kt_uniform(r, 0.004f, 0.03f); /* FP8: |K| <= 4 stays below saturation either way */
  d.v_scale = kt_uniform(r, 0.01f, 0.05f);
  d.max_seqs = 64;
  st = kva_cache_create(&d, &c);
  KT_CHECK(st == KVA_OK, "kva_cache_create(L=%d G=%d D=%d Dv=%d bs=%d n_blocks=%d %s/%s) = %d", L, G, D, Dv, bs,
           n_blocks, kva_dtype_name(kt), kva_dtype_name(vt), (int)st);
  return st == KVA_OK ? c : NULL;
}

/* store rows k [L][n][G][D], v [L][n][G][Dv] of a step of n tokens */
static int tt_store_all(kva_cache *c, int seq, int L, int G, int D, int Dv, const float *k, const float *v, int n) {
  int l, ok = 1;
  for (l = 0; l < L && n > 0; l++) {
    kva_status st = kva_store(c, seq, l, k + (size_t)l * n * G * D, v + (size_t)l * n * G * Dv, n);
    KT_CHECK(st == KVA_OK, "kva_store(seq %d, layer %d, %d tokens) = %d", seq, l, n, (int)st);
    ok &= st == KVA_OK;
  }
  return ok;
}

/* append n tokens and store random K in [-1, 1], V in [-2, 2] in every layer */
static int tt_append_random(kt_rng *r, kva_cache *c, int seq, int L, int G, int D, int Dv, int n) {
  float *k, *v;
  int ok;
  kva_status st;
  if (n == 0) return 1;
  st = kva_seq_append(c, seq, n);
  KT_CHECK(st == KVA_OK, "kva_seq_append(seq %d, %d) = %d", seq, n, (int)st);
  if (st != KVA_OK) return 0;
  k = KT_ALLOC(float, (size_t)L * n * G * D);
  v = KT_ALLOC(float, (size_t)L * n * G * Dv);
  kt_fill(r, k, (size_t)L * n * G * D, -1.0f, 1.0f);
  kt_fill(r, v, (size_t)L * n * G * Dv, -2.0f, 2.0f);
  ok = tt_store_all(c, seq, L, G, D, Dv, k, v, n);
  free(k);
  free(v);
  return ok;
}

/* Everything a sequence reads back: k [L][len][G][D], v [L][len][G][Dv], p [L][len][G]. */
typedef struct {
  int len, pos, L, G, D, Dv;
  float *k, *v;
  int32_t *p;
} tt_snap;

static void tt_snap_take(kva_cache *c, int seq, int L, int G, int D, int Dv, tt_snap *s) {
  int l, t, bad = 0;
  size_t n;
  s->len = kva_seq_len(c, seq);
  s->pos = kva_seq_pos(c, seq);
  s->L = L, s->G = G, s->D = D, s->Dv = Dv;
  n = (size_t)L * (s->len > 0 ? s->len : 1);
  s->k = KT_ALLOC(float, n * G * D);
  s->v = KT_ALLOC(float, n * G * Dv);
  s->p = KT_ALLOC(int32_t, n * G);
  memset(s->k, 0, n * G * D * sizeof(float));
  memset(s->v, 0, n * G * Dv * sizeof(float));
  memset(s->p, 0, n * G * sizeof(int32_t));
  for (l = 0; l < L; l++)
    for (t = 0; t < s->len; t++) {
      size_t o = (size_t)l * s->len + t;
      bad += kva_seq_read(c, seq, l, t, s->k + o * G * D, s->v + o * G * Dv, s->p + o * G) != KVA_OK;
    }
  KT_CHECK(bad == 0, "kva_seq_read failed on %d slots of seq %d", bad, seq);
}

static void tt_snap_free(tt_snap *s) {
  free(s->k);
  free(s->v);
  free(s->p);
}

static const float *tt_sk(const tt_snap *s, int l, int t) { return s->k + ((size_t)l * s->len + t) * s->G * s->D; }
static const float *tt_sv(const tt_snap *s, int l, int t) { return s->v + ((size_t)l * s->len + t) * s->G * s->Dv; }
static const int32_t *tt_sp(const tt_snap *s, int l, int t) { return s->p + ((size_t)l * s->len + t) * s->G; }

/* slot ta of a and slot tb of b hold the same K and V bits in every layer */
static int tt_slot_same_kv(const tt_snap *a, int ta, const tt_snap *b, int tb) {
  int l;
  for (l = 0; l < a->L; l++)
    if (!kt_same_bits(tt_sk(a, l, ta), tt_sk(b, l, tb), (size_t)a->G * a->D) ||
        !kt_same_bits(tt_sv(a, l, ta), tt_sv(b, l, tb), (size_t)a->G * a->Dv))
      return 0;
  return 1;
}

/* slot t holds position p in every layer and KV head */
static int tt_slot_at(const tt_snap *s, int t, int32_t p) {
  int l, g;
  for (l = 0; l < s->L; l++)
    for (g = 0; g < s->G; g++)
      if (tt_sp(s, l, t)[g] != p) return 0;
  return 1;
}

static int tt_snap_same(const tt_snap *a, const tt_snap *b) {
  size_t n;
  if (a->len != b->len || a->pos != b->pos) return 0;
  n = (size_t)a->L * a->len;
  return memcmp(a->k, b->k, n * a->G * a->D * sizeof(float)) == 0 &&
         memcmp(a->v, b->v, n * a->G * a->Dv * sizeof(float)) == 0 &&
         memcmp(a->p, b->p, n * a->G * sizeof(int32_t)) == 0;
}

static int tt_stats_consistent(kva_cache *c) {
  kva_cache_stats st;
  kva_cache_get_stats(c, &st);
  return st.blocks_used + st.blocks_cached + st.blocks_free == st.n_blocks && st.blocks_free >= 0;
}

/* ======================================================================== */
/* Tree attention on arrays                                                 */

static void tt_arrays_case(kt_rng *r, int it) {
  int G = kt_int(r, 1, 4), H = G * kt_int(r, 1, 4), D = tt_dims[kt_int(r, 0, TT_NDIMS - 1)];
  int Dv = kt_int(r, 0, 2) ? D : tt_dims[kt_int(r, 0, TT_NDIMS - 1)];
  int P, n_q, n_kv, kind = kt_int(r, 0, TT_KINDS - 1), j, want_lse = kt_int(r, 0, 3) != 0;
  kva_attn a;
  ref_attn_cfg cfg;
  int32_t *par, *qpos, *kpos;
  unsigned char *mask;
  float *q, *k, *v, *out, *lse;
  double *rq, *rk, *rv, *ro, *rl;
  size_t nq, nk, nv, no, nl;
  char shape[320];
  kva_status st;
  switch (kt_int(r, 0, 4)) {
    case 0: P = 0; break;
    case 1: P = kt_int(r, 62, 66); break; /* around a 64-key tile */
    case 2: P = kt_int(r, 1, 10); break;
    default: P = kt_int(r, 0, 200); break;
  }
  n_q = kt_int(r, 0, 3) == 0 ? kt_int(r, 1, 3) : kt_int(r, 1, 40);
  if (it % 13 == 5) n_q = kt_int(r, 60, 140); /* several 64-row chunks and tiles of nodes */
  while ((double)H * (D + Dv) * (P + n_q) * n_q > 3e6 && n_q > 1) n_q = (n_q + 1) / 2;
  while ((double)H * (D + Dv) * (P + n_q) * n_q > 3e6 && P > 0) P /= 2;
  n_kv = P + n_q;
  kt_attn_init(&a, H, G, D, (Dv == D && kt_int(r, 0, 1)) ? 0 : Dv);
  tt_random_opts(r, &a, n_kv);
  cfg = ref_cfg(&a);
  nq = (size_t)n_q * H * D, nk = (size_t)n_kv * G * D, nv = (size_t)n_kv * G * Dv;
  no = (size_t)n_q * H * Dv, nl = (size_t)n_q * H;
  par = KT_ALLOC(int32_t, n_q);
  qpos = KT_ALLOC(int32_t, n_q);
  kpos = KT_ALLOC(int32_t, n_kv);
  mask = KT_ALLOC(unsigned char, (size_t)n_q * n_kv);
  q = KT_ALLOC(float, nq);
  k = KT_ALLOC(float, nk);
  v = KT_ALLOC(float, nv);
  out = KT_ALLOC(float, no + TT_GUARD);
  lse = KT_ALLOC(float, nl + TT_GUARD);
  ro = KT_ALLOC(double, no);
  rl = KT_ALLOC(double, nl);
  tt_tree(r, par, n_q, kind);
  kt_fill(r, q, nq, -1.0f, 1.0f);
  kt_fill(r, k, nk, -1.0f, 1.0f);
  kt_fill(r, v, nv, -2.0f, 2.0f);
  kt_fill_sentinel(out, no + TT_GUARD);
  kt_fill_sentinel(lse, nl + TT_GUARD);
  a.tree_parent = par;
  tt_shape(shape, sizeof shape, &a, n_q, n_kv, tt_kind_names[kind]);
  st = kva_attend(&a, q, n_q, NULL, k, v, n_kv, NULL, out, want_lse ? lse : NULL);
  KT_CHECK(st == KVA_OK, "arrays: kva_attend with a tree = %d (%s)", (int)st, shape);
  KT_CHECK(kt_all_sentinel(out + no, TT_GUARD) && kt_all_sentinel(lse + (want_lse ? nl : 0), want_lse ? TT_GUARD : nl + TT_GUARD),
           "arrays: wrote past out / lse, or lse when NULL (%s)", shape);
  for (j = 0; j < P; j++) kpos[j] = j;
  tt_layout(par, n_q, n_kv, P, 1, qpos, kpos, mask);
  rq = ref_dup_f(q, nq);
  rk = ref_dup_f(k, nk);
  rv = ref_dup_f(v, nv);
  ref_attend_masked(&cfg, rq, n_q, rk, rv, n_kv, qpos, kpos, mask, ro, rl);
  tt_compare("arrays", shape, out, want_lse ? lse : NULL, ro, rl, n_q, H, Dv, ref_max_abs_f(v, nv));
  free(par), free(qpos), free(kpos), free(mask), free(q), free(k), free(v), free(out), free(lse);
  free(ro), free(rl), free(rq), free(rk), free(rv);
}

static void test_tree_arrays(void) {
  kt_rng r;
  int it;
  kt_begin("tree: kva_attend (arrays) with tree_parent vs the fp64 masked reference");
  kt_seed(&r, 0x7EE0A1);
  for (it = 0; it < kt_iters(300); it++) tt_arrays_case(&r, it);
}

/* A hand-made tree where every answer is known: one head, D = 1, q = 0 (all
   scores equal), V = the key's index: each output is the mean index of the
   keys the node sees. Prefix of 3 keys (0, 1, 2), nodes 3..8:
       node 0 (key 3): parent -1          sees 0 1 2 3
       node 1 (key 4): parent 0           sees 0 1 2 3 4
       node 2 (key 5): parent 0           sees 0 1 2 3 5
       node 3 (key 6): parent -1          sees 0 1 2 6
       node 4 (key 7): parent 2           sees 0 1 2 3 5 7
       node 5 (key 8): parent 4           sees 0 1 2 3 5 7 8
   With window 2 (positions: prefix 0..2, node depth 0/1/1/0/2/3 -> 3 4 4 3 5 6)
   node 5 (at 6) sees only key 7 (at 5) and itself; with sink 1 also key 0. */
static void test_tree_hand(void) {
  kva_attn a;
  int32_t par[6] = {-1, 0, 0, -1, 2, 4};
  float q[6] = {0, 0, 0, 0, 0, 0}, k[9], v[9], out[6], lse[6];
  static const double want[6] = {6.0 / 4, 10.0 / 5, 11.0 / 5, 9.0 / 4, 18.0 / 6, 26.0 / 7};
  int i;
  kt_begin("tree: hand-computed tree");
  for (i = 0; i < 9; i++) k[i] = 0.25f * (float)i, v[i] = (float)i;
  kt_attn_init(&a, 1, 1, 1, 0);
  a.tree_parent = par;
  KT_STATUS(kva_attend(&a, q, 6, NULL, k, v, 9, NULL, out, lse), KVA_OK);
  for (i = 0; i < 6; i++) {
    KT_NEAR(out[i], want[i], 1e-6);
    KT_NEAR(lse[i], log((double)(i == 3 ? 4 : i == 0 ? 4 : i == 4 ? 6 : i == 5 ? 7 : 5)), 1e-6);
  }
  a.window = 2;
  KT_STATUS(kva_attend(&a, q, 6, NULL, k, v, 9, NULL, out, lse), KVA_OK);
  /* node 0 at 3: keys at 2, 3 -> (2 + 3)/2; node 1 at 4: node 0 (3) and itself (4) -> (3+4)/2;
     node 2 at 4: node 0 and itself -> (3+5)/2; node 3 at 3: key 2 and itself (6) -> 4;
     node 4 at 5: node 2 (at 4) and itself -> (5+7)/2; node 5 at 6: node 4 (at 5), itself -> 7.5 */
  KT_NEAR(out[0], 2.5, 1e-6);
  KT_NEAR(out[1], 3.5, 1e-6);
  KT_NEAR(out[2], 4.0, 1e-6);
  KT_NEAR(out[3], 4.0, 1e-6);
  KT_NEAR(out[4], 6.0, 1e-6);
  KT_NEAR(out[5], 7.5, 1e-6);
  a.n_sink = 1; /* key 0 joins every node */
  KT_STATUS(kva_attend(&a, q, 6, NULL, k, v, 9, NULL, out, lse), KVA_OK);
  KT_NEAR(out[0], 5.0 / 3, 1e-6);
  KT_NEAR(out[5], 15.0 / 3, 1e-6);
  /* ALiBi over effective distances: one head, slope 2^-8 * ... with max bias 8: slope 2^-8 */
  a.window = 0, a.n_sink = 0, a.alibi_max_bias = 8.0f;
  KT_STATUS(kva_attend(&a, q, 6, NULL, k, v, 9, NULL, out, lse), KVA_OK);
  {
    /* node 5 at 6 sees keys 0,1,2 (at 0,1,2), 3 (at 3), 5 (at 4), 7 (at 5), 8 (at 6) */
    static const int keys[7] = {0, 1, 2, 3, 5, 7, 8}, kp[7] = {0, 1, 2, 3, 4, 5, 6};
    double s = 0.0, num = 0.0, slope = pow(2.0, -8.0);
    for (i = 0; i < 7; i++) {
      double w = exp(-slope * (6 - kp[i]));
      s += w;
      num += w * keys[i];
    }
    KT_NEAR(out[5], num / s, 1e-6);
    KT_NEAR(lse[5], log(s), 1e-6);
  }
}

/* Sinks are positions: with base < n_sink, a node whose depth is below
   n_sink stays visible to its descendants under any window, however far its
   index (its key's slot) lies behind theirs. A tree of 300 nodes: node 64
   hangs below node 0 (depth 1), a chain of 172 nodes below node 64 from
   index 128 on; the deep nodes' rows see node 0 and node 64 as sinks. */
static void test_tree_sinks_deep(void) {
  kt_rng r;
  int n = 300, i, pre;
  kt_begin("tree: sinks at effective positions under a window, deep tree");
  kt_seed(&r, 0x51A7);
  for (pre = 0; pre <= 1; pre++) {
    int n_kv = n + pre, H = 2, G = 1, D = 4;
    int32_t *par = KT_ALLOC(int32_t, n), *qpos = KT_ALLOC(int32_t, n), *kpos = KT_ALLOC(int32_t, n_kv);
    unsigned char *mask = KT_ALLOC(unsigned char, (size_t)n * n_kv);
    float *q = KT_ALLOC(float, (size_t)n * H * D), *k = KT_ALLOC(float, (size_t)n_kv * G * D),
          *v = KT_ALLOC(float, (size_t)n_kv * G * D), *out = KT_ALLOC(float, (size_t)n * H * D),
          *lse = KT_ALLOC(float, (size_t)n * H);
    double *ro = KT_ALLOC(double, (size_t)n * H * D), *rl = KT_ALLOC(double, (size_t)n * H), *rq, *rk, *rv;
    kva_attn a;
    ref_attn_cfg cfg;
    char shape[320];
    kt_begin(pre ? "tree: sinks at effective positions, deep tree, arrays (prefix 1)"
                 : "tree: sinks at effective positions, deep tree, arrays (no prefix)");
    for (i = 0; i < n; i++) par[i] = i < 64 ? -1 : i == 64 ? 0 : i < 128 ? -1 : i == 128 ? 64 : i - 1;
    kt_fill(&r, q, (size_t)n * H * D, -1, 1);
    kt_fill(&r, k, (size_t)n_kv * G * D, -1, 1);
    kt_fill(&r, v, (size_t)n_kv * G * D, -2, 2);
    kt_attn_init(&a, H, G, D, 0);
    a.window = 2;
    a.n_sink = 2 + pre;
    a.tree_parent = par;
    cfg = ref_cfg(&a);
    tt_shape(shape, sizeof shape, &a, n, n_kv, "deep, sinks");
    KT_STATUS(kva_attend(&a, q, n, NULL, k, v, n_kv, NULL, out, lse), KVA_OK);
    for (i = 0; i < pre; i++) kpos[i] = i;
    tt_layout(par, n, n_kv, pre, 1, qpos, kpos, mask);
    rq = ref_dup_f(q, (size_t)n * H * D);
    rk = ref_dup_f(k, (size_t)n_kv * G * D);
    rv = ref_dup_f(v, (size_t)n_kv * G * D);
    ref_attend_masked(&cfg, rq, n, rk, rv, n_kv, qpos, kpos, mask, ro, rl);
    tt_compare("deep tree, sinks (arrays)", shape, out, lse, ro, rl, n, H, D, 2.0);
    kt_begin(pre ? "tree: sinks at effective positions, deep tree, cache (prefix 1)"
                 : "tree: sinks at effective positions, deep tree, cache (no prefix)");
    { /* the same through a cache */
      kva_cache *c = tt_cache(&r, 1, G, D, D, 16, tt_cdiv(n_kv, 16) + 1, KVA_F32, KVA_F32);
      int seq = -1;
      if (c && kva_seq_new(c, &seq) == KVA_OK && kva_seq_append(c, seq, n_kv) == KVA_OK &&
          kva_store(c, seq, 0, k, v, n_kv) == KVA_OK) {
        tt_check_cache_tree(c, seq, 0, &a, par, q, n, "deep tree, sinks (cache)", "deep, sinks");
      } else {
        KT_CHECK(0, "deep tree: cache setup failed");
      }
      kva_cache_destroy(c);
    }
    free(par), free(qpos), free(kpos), free(mask), free(q), free(k), free(v), free(out), free(lse);
    free(ro), free(rl), free(rq), free(rk), free(rv);
  }
}

/* ======================================================================== */
/* Tree attention over the cache                                            */

static void tt_cache_case(kt_rng *r, int it) {
  static const int bss[] = {1, 2, 3, 4, 5, 8, 16, 32};
  int G = kt_int(r, 1, 4), R = kt_int(r, 1, 4), H, D = tt_dims[kt_int(r, 0, TT_NDIMS - 1)];
  int Dv = kt_int(r, 0, 2) ? D : tt_dims[kt_int(r, 0, TT_NDIMS - 1)];
  int bs = bss[kt_int(r, 0, 7)], L = kt_int(r, 1, 2), P, n, kind = kt_int(r, 0, TT_KINDS - 1), l, joint, n_chunks;
  int evict = 0, seq = -1, done = 0, c0, ci;
  kva_dtype kt = tt_dtypes[kt_int(r, 0, 5)], vt = kt_int(r, 0, 1) ? kt : tt_dtypes[kt_int(r, 0, 5)];
  kva_cache *c;
  kva_attn a;
  int32_t *par;
  float *q;
  char label[200];
  if (it % 29 == 11) { /* a long prefix with few work items: split-K under a tree */
    G = 1, R = kt_int(r, 1, 2), D = kt_int(r, 1, 3) * 8 + kt_int(r, 0, 1), Dv = D;
    P = 2048 + kt_int(r, 0, 300);
    n = kt_int(r, 1, 3);
  } else {
    switch (kt_int(r, 0, 5)) {
      case 0: P = 0; break;
      case 1: P = bs * kt_int(r, 1, 6); break;
      case 2: P = bs * kt_int(r, 1, 6) + (kt_int(r, 0, 1) ? 1 : -1); break;
      case 3: P = kt_int(r, 1, 12); break;
      default: P = kt_int(r, 1, 300); break;
    }
    n = kt_int(r, 0, 3) == 0 ? kt_int(r, 1, 3) : kt_int(r, 1, 40);
  }
  H = G * R;
  while ((double)H * (D + Dv) * (P + n) * n > 2e6 && n > 1) n = (n + 1) / 2;
  while ((double)H * (D + Dv) * (P + n) * n > 2e6 && P > 0 && P < 2048) P /= 2;
  if (P > 0 && kt_int(r, 0, 3) == 0) evict = kt_int(r, 1, 2); /* WINDOW or H2O before the tree step */
  joint = P > 0 && kt_int(r, 0, 3) == 0;                       /* the last prefix chunk and the tree in one step */
  n_chunks = P > 0 ? kt_int(r, 1, 3) : 0;
  c = tt_cache(r, L, G, D, Dv, bs, tt_cdiv(P + n, bs) + 4, kt, vt);
  if (!c) return;
  kt_attn_init(&a, H, G, D, (Dv == D && kt_int(r, 0, 1)) ? 0 : Dv);
  tt_random_opts(r, &a, P + n);
  snprintf(label, sizeof label, "cache %s/%s bs=%d L=%d prefix=%d%s%s", kva_dtype_name(kt), kva_dtype_name(vt), bs,
           L, P, evict == 1 ? " WINDOW-evicted" : evict == 2 ? " H2O-evicted" : "", joint ? " joint step" : "");
  par = KT_ALLOC(int32_t, n);
  q = KT_ALLOC(float, (size_t)n * H * D);
  tt_tree(r, par, n, kind);
  if (kva_seq_new(c, &seq) != KVA_OK) goto out;
  if (evict) {
    kva_evict e;
    memset(&e, 0, sizeof e);
    e.kind = evict == 1 ? KVA_EVICT_WINDOW : KVA_EVICT_H2O;
    e.budget = kt_int(r, 1 + (P > 4 ? P / 4 : 0), P);
    e.n_sink = kt_int(r, 0, e.budget < 3 ? e.budget / 2 : 2);
    e.n_recent = evict == 2 ? kt_int(r, 0, e.budget - e.n_sink) : 0;
    e.rollback = kt_int(r, 0, 1);
    KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  }
  /* the prefix, in chunks; under H2O each chunk is attended (scores differ per head) */
  for (c0 = 0, ci = 0; ci < n_chunks; ci++) {
    int cn = ci == n_chunks - 1 ? P - c0 : kt_int(r, 0, P - c0);
    if (joint && ci == n_chunks - 1) break;
    if (cn == 0) continue;
    if (!tt_append_random(r, c, seq, L, G, D, Dv, cn)) goto out;
    if (evict == 2) {
      float *qq = KT_ALLOC(float, (size_t)cn * H * D), *oo = KT_ALLOC(float, (size_t)cn * H * (a.v_dim ? a.v_dim : D));
      kva_attn lin = a;
      kt_fill(r, qq, (size_t)cn * H * D, -2, 2);
      for (l = 0; l < L; l++) KT_STATUS(kva_attend_cache(c, seq, l, &lin, qq, cn, oo), KVA_OK);
      free(qq);
      free(oo);
    }
    c0 += cn;
  }
  /* the tree step (with the rest of the prefix when joint) */
  if (!tt_append_random(r, c, seq, L, G, D, Dv, P - c0 + n)) goto out;
  if (evict) KT_CHECK(kva_seq_pos(c, seq) - kva_seq_len(c, seq) >= 0, "%s: pos < len", label);
  for (l = 0; l < L; l++) {
    kt_fill(r, q, (size_t)n * H * D, -1.0f, 1.0f);
    tt_check_cache_tree(c, seq, l, &a, par, q, n, label, tt_kind_names[kind]);
  }
  done = 1;
out:
  KT_CHECK(done, "%s: setup failed", label);
  free(par);
  free(q);
  kva_cache_destroy(c);
}

static void test_tree_cache(void) {
  kt_rng r;
  int it;
  kt_begin("tree: kva_attend_cache(_lse) with tree_parent vs the fp64 masked reference, every dtype");
  kt_seed(&r, 0x7EEC4C);
  for (it = 0; it < kt_iters(240); it++) tt_cache_case(&r, it);
}

/* ======================================================================== */
/* A chain is the linear case, bit for bit                                  */

static void test_tree_chain(void) {
  kt_rng r;
  int it;
  kt_begin("tree: a chain tree == the linear call, bit for bit (arrays, cache, batch)");
  kt_seed(&r, 0xC4A1);
  for (it = 0; it < kt_iters(60); it++) {
    int G = kt_int(&r, 1, 3), H = G * kt_int(&r, 1, 3), D = tt_dims[kt_int(&r, 0, TT_NDIMS - 1)], Dv = D;
    int P = kt_int(&r, 0, 3) == 0 ? 0 : kt_int(&r, 1, 150), n = kt_int(&r, 1, 40), n_kv, j, bs = kt_int(&r, 1, 16);
    int32_t *chain = KT_ALLOC(int32_t, n);
    kva_attn a, t;
    float *q, *k, *v, *o1, *o2, *l1, *l2;
    size_t no;
    kva_cache *c;
    int seqs[2] = {-1, -1}, nqs[2];
    if (it % 10 == 3) P = 2100, G = 1, H = 2, D = Dv = 8, n = 2; /* split-K on both sides */
    n_kv = P + n;
    no = (size_t)n * H * Dv;
    kt_attn_init(&a, H, G, D, 0);
    tt_random_opts(&r, &a, n_kv);
    for (j = 0; j < n; j++) chain[j] = j - 1;
    t = a;
    t.tree_parent = chain;
    q = KT_ALLOC(float, (size_t)n * H * D);
    k = KT_ALLOC(float, (size_t)n_kv * G * D);
    v = KT_ALLOC(float, (size_t)n_kv * G * Dv);
    o1 = KT_ALLOC(float, 2 * no + 1);
    o2 = KT_ALLOC(float, 2 * no + 1);
    l1 = KT_ALLOC(float, (size_t)2 * n * H + 1);
    l2 = KT_ALLOC(float, (size_t)2 * n * H + 1);
    kt_fill(&r, q, (size_t)n * H * D, -1, 1);
    kt_fill(&r, k, (size_t)n_kv * G * D, -1, 1);
    kt_fill(&r, v, (size_t)n_kv * G * Dv, -2, 2);
    KT_STATUS(kva_attend(&a, q, n, NULL, k, v, n_kv, NULL, o1, l1), KVA_OK);
    KT_STATUS(kva_attend(&t, q, n, NULL, k, v, n_kv, NULL, o2, l2), KVA_OK);
    KT_CHECK(kt_same_bits(o1, o2, no) && kt_same_bits(l1, l2, (size_t)n * H),
             "arrays: chain != linear (H=%d G=%d D=%d P=%d n=%d win=%d sink=%d alibi=%g cap=%g)", H, G, D, P, n,
             a.window, a.n_sink, (double)a.alibi_max_bias, (double)a.softcap);
    tt_bitwise_checked++;
    /* the cache: two sequences with the same keys, one attended linearly and one as a chain;
       the batch: both at once, linear plan vs a chain plan */
    c = tt_cache(&r, 1, G, D, Dv, bs, 2 * tt_cdiv(n_kv, bs) + 2, tt_dtypes[kt_int(&r, 0, 5)], KVA_DTYPE_DEFAULT);
    if (c) {
      int s, ok = 1;
      for (s = 0; s < 2; s++) {
        ok &= kva_seq_new(c, &seqs[s]) == KVA_OK;
        if (P > 0 && ok) {
          ok &= kva_seq_append(c, seqs[s], P) == KVA_OK;
          ok &= ok && kva_store(c, seqs[s], 0, k, v, P) == KVA_OK;
        }
        ok &= ok && kva_seq_append(c, seqs[s], n) == KVA_OK;
        ok &= ok && kva_store(c, seqs[s], 0, k + (size_t)P * G * D, v + (size_t)P * G * Dv, n) == KVA_OK;
      }
      KT_CHECK(ok, "chain: cache setup");
      if (ok) {
        kva_batch *p1 = NULL, *p2 = NULL;
        int32_t *chains = KT_ALLOC(int32_t, 2 * n);
        float *qq = KT_ALLOC(float, (size_t)2 * n * H * D);
        KT_STATUS(kva_attend_cache_lse(c, seqs[0], 0, &a, q, n, o1, l1), KVA_OK);
        KT_STATUS(kva_attend_cache_lse(c, seqs[1], 0, &t, q, n, o2, l2), KVA_OK);
        KT_CHECK(kt_same_bits(o1, o2, no) && kt_same_bits(l1, l2, (size_t)n * H),
                 "cache: chain != linear (H=%d G=%d D=%d P=%d n=%d bs=%d win=%d sink=%d alibi=%g cap=%g)", H, G, D,
                 P, n, bs, a.window, a.n_sink, (double)a.alibi_max_bias, (double)a.softcap);
        for (j = 0; j < 2 * n; j++) chains[j] = j < n ? j - 1 : j - n - 1;
        memcpy(qq, q, (size_t)n * H * D * sizeof(float));
        memcpy(qq + (size_t)n * H * D, q, (size_t)n * H * D * sizeof(float));
        nqs[0] = nqs[1] = n;
        t.tree_parent = chains;
        KT_STATUS(kva_batch_plan(c, &a, seqs, nqs, 2, &p1), KVA_OK);
        KT_STATUS(kva_batch_plan(c, &t, seqs, nqs, 2, &p2), KVA_OK);
        if (p1 && p2) {
          KT_STATUS(kva_attend_batch_lse(c, p1, 0, qq, o1, l1), KVA_OK);
          KT_STATUS(kva_attend_batch_lse(c, p2, 0, qq, o2, l2), KVA_OK);
          KT_CHECK(kt_same_bits(o1, o2, 2 * no) && kt_same_bits(l1, l2, (size_t)2 * n * H),
                   "batch: chain plan != linear plan (H=%d G=%d D=%d P=%d n=%d)", H, G, D, P, n);
        }
        kva_batch_free(p1);
        kva_batch_free(p2);
        free(chains);
        free(qq);
        tt_bitwise_checked += 2;
      }
    }
    kva_cache_destroy(c);
    free(chain), free(q), free(k), free(v), free(o1), free(o2), free(l1), free(l2);
  }
}

/* ======================================================================== */
/* Batch plans with trees                                                   */

#define TT_BMAX 5

static void tt_batch_case(kt_rng *r, int it) {
  int G = kt_int(r, 1, 3), R = kt_int(r, 1, 3), H = G * R, D = tt_dims[kt_int(r, 0, 8)];
  int Dv = kt_int(r, 0, 2) ? D : tt_dims[kt_int(r, 0, 8)], bs = kt_int(r, 1, 16), L = kt_int(r, 1, 2);
  int n_seqs = kt_int(r, 2, TT_BMAX), seqs[TT_BMAX], nq[TT_BMAX], off[TT_BMAX], P[TT_BMAX], extra[TT_BMAX];
  int kinds[TT_BMAX], i, l, total = 0, blocks = 4, round;
  kva_dtype dt = tt_dtypes[kt_int(r, 0, 5)];
  kva_cache *c;
  kva_attn a;
  kva_batch *plan = NULL;
  int32_t *tp, *saved;
  float *q, *out, *lse, *o1, *l1;
  size_t rowq = (size_t)H * D, rowo = (size_t)H * Dv;
  for (i = 0; i < n_seqs; i++) {
    P[i] = kt_int(r, 0, 3) == 0 ? 0 : kt_int(r, 0, 1) ? bs * kt_int(r, 1, 5) : kt_int(r, 1, 150);
    nq[i] = kt_int(r, 0, 5) == 0 ? 0 : kt_int(r, 1, 20);
    extra[i] = kt_int(r, 0, 2) == 0 ? kt_int(r, 1, 3) : 0; /* the tree is the newest nq of a larger step */
    kinds[i] = kt_int(r, 0, TT_KINDS - 1);
    off[i] = total;
    total += nq[i];
    blocks += tt_cdiv(P[i] + nq[i] + extra[i], bs) + 1;
  }
  c = tt_cache(r, L, G, D, Dv, bs, blocks, dt, kt_int(r, 0, 1) ? dt : tt_dtypes[kt_int(r, 0, 5)]);
  if (!c) return;
  for (i = 0; i < n_seqs; i++) {
    int ok = kva_seq_new(c, &seqs[i]) == KVA_OK;
    ok = ok && tt_append_random(r, c, seqs[i], L, G, D, Dv, P[i]);
    ok = ok && tt_append_random(r, c, seqs[i], L, G, D, Dv, nq[i] + extra[i]);
    KT_CHECK(ok, "batch: setup of sequence %d", i);
    if (!ok) {
      kva_cache_destroy(c);
      return;
    }
  }
  tp = KT_ALLOC(int32_t, total + 1);
  saved = KT_ALLOC(int32_t, total + 1);
  q = KT_ALLOC(float, (size_t)(total + 1) * rowq);
  out = KT_ALLOC(float, (size_t)total * rowo + TT_GUARD);
  lse = KT_ALLOC(float, (size_t)total * H + TT_GUARD);
  o1 = KT_ALLOC(float, (size_t)(total + 1) * rowo);
  l1 = KT_ALLOC(float, (size_t)(total + 1) * H);
  kt_attn_init(&a, H, G, D, Dv == D ? 0 : Dv);
  tt_random_opts(r, &a, 150);
  for (round = 0; round < 2; round++) { /* a plan, then a replan (in place) with other trees */
    kva_status st;
    for (i = 0; i < n_seqs; i++) tt_tree(r, tp + off[i], nq[i], round ? kt_int(r, 0, TT_KINDS - 1) : kinds[i]);
    memcpy(saved, tp, (size_t)(total + 1) * sizeof(int32_t));
    a.tree_parent = tp;
    st = round == 0 ? kva_batch_plan(c, &a, seqs, nq, n_seqs, &plan) : kva_batch_replan(c, &a, seqs, nq, n_seqs, &plan);
    KT_CHECK(st == KVA_OK && plan, "batch: %s with trees = %d", round ? "replan" : "plan", (int)st);
    if (st != KVA_OK || !plan) break;
    for (i = 0; i < n_seqs; i++) { /* the plan keeps its own copy: the caller's becomes another valid tree */
      int j, is_chain = 1;
      for (j = 0; j < nq[i]; j++) is_chain &= saved[off[i] + j] == j - 1;
      for (j = 0; j < nq[i]; j++) tp[off[i] + j] = is_chain ? (j == 0 ? -1 : j - 1 - (j > 1)) : j - 1;
    }
    for (l = 0; l < L; l++) {
      kt_fill(r, q, (size_t)total * rowq, -1, 1);
      kt_fill_sentinel(out, (size_t)total * rowo + TT_GUARD);
      kt_fill_sentinel(lse, (size_t)total * H + TT_GUARD);
      st = kva_attend_batch_lse(c, plan, l, q, out, lse);
      KT_CHECK(st == KVA_OK, "batch: kva_attend_batch_lse(layer %d) = %d", l, (int)st);
      KT_CHECK(kt_all_sentinel(out + (size_t)total * rowo, TT_GUARD) &&
                   kt_all_sentinel(lse + (size_t)total * H, TT_GUARD),
               "batch: wrote past out / lse");
      for (i = 0; i < n_seqs; i++) {
        kva_attn ai = a;
        if (nq[i] == 0) continue;
        ai.tree_parent = saved + off[i];
        st = kva_attend_cache_lse(c, seqs[i], l, &ai, q + (size_t)off[i] * rowq, nq[i], o1, l1);
        KT_CHECK(st == KVA_OK, "batch: per-sequence attend = %d", (int)st);
        KT_CHECK(kt_same_bits(o1, out + (size_t)off[i] * rowo, (size_t)nq[i] * rowo) &&
                     kt_same_bits(l1, lse + (size_t)off[i] * H, (size_t)nq[i] * H),
                 "batch: sequence %d (%d of %d, prefix %d, %d nodes, %s) differs from kva_attend_cache_lse, layer %d, %s, "
                 "H=%d G=%d D=%d Dv=%d bs=%d",
                 i, i + 1, n_seqs, P[i], nq[i], tt_kind_names[kinds[i]], l, round ? "replan" : "plan", H, G, D, Dv,
                 bs);
        tt_bitwise_checked++;
        if (l == 0 && round == 0) { /* and the batch's rows against the reference */
          double *ro = KT_ALLOC(double, (size_t)nq[i] * rowo), *rl = KT_ALLOC(double, (size_t)nq[i] * H), vmax;
          char shape[320];
          tt_shape(shape, sizeof shape, &ai, nq[i], kva_seq_len(c, seqs[i]), tt_kind_names[kinds[i]]);
          vmax = tt_ref_cache(c, seqs[i], l, &ai, saved + off[i], q + (size_t)off[i] * rowq, nq[i], ro, rl, "batch");
          tt_compare("batch vs reference", shape, out + (size_t)off[i] * rowo, lse + (size_t)off[i] * H, ro, rl, nq[i],
                     H, Dv, vmax);
          free(ro);
          free(rl);
        }
      }
    }
  }
  (void)it;
  kva_batch_free(plan);
  free(tp), free(saved), free(q), free(out), free(lse), free(o1), free(l1);
  kva_cache_destroy(c);
}

static void test_tree_batch(void) {
  kt_rng r;
  int it;
  kt_begin("tree: batch plans over sequences with their own trees == kva_attend_cache_lse, bit for bit");
  kt_seed(&r, 0xBA7C4);
  for (it = 0; it < kt_iters(60); it++) tt_batch_case(&r, it);
}

/* ======================================================================== */
/* GQA layers                                                               */

typedef struct {
  float *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo;
  kva_gqa_layer L;
} tt_glayer;

static float *tt_rand_buf(kt_rng *r, size_t n, float amp) {
  float *p = KT_ALLOC(float, n);
  kt_fill(r, p, n, -amp, amp);
  return p;
}

static void tt_glayer_init(kt_rng *r, tt_glayer *g, int d, int H, int G, int D) {
  float wa = 3.0f / (float)sqrt((double)d), oa = 1.0f / (float)sqrt((double)(H * D));
  memset(g, 0, sizeof *g);
  g->wq = tt_rand_buf(r, (size_t)H * D * d, wa);
  g->wk = tt_rand_buf(r, (size_t)G * D * d, wa);
  g->wv = tt_rand_buf(r, (size_t)G * D * d, 1.0f);
  g->wo = tt_rand_buf(r, (size_t)d * H * D, oa);
  if (kt_int(r, 0, 1)) g->bq = tt_rand_buf(r, (size_t)H * D, 0.5f);
  if (kt_int(r, 0, 1)) g->bk = tt_rand_buf(r, (size_t)G * D, 0.5f);
  if (kt_int(r, 0, 1)) g->bv = tt_rand_buf(r, (size_t)G * D, 0.5f);
  if (kt_int(r, 0, 1)) g->bo = tt_rand_buf(r, (size_t)d, 0.5f);
  g->L.d_model = d;
  kt_attn_init(&g->L.attn, H, G, D, 0);
  tt_random_opts(r, &g->L.attn, 40);
  g->L.wq = g->wq, g->L.bq = g->bq, g->L.wk = g->wk, g->L.bk = g->bk;
  g->L.wv = g->wv, g->L.bv = g->bv, g->L.wo = g->wo, g->L.bo = g->bo;
  switch (kt_int(r, 0, 5)) {
    case 0: g->L.rope.theta = 500000.0f, g->L.rope.interleaved = 1; break;
    case 1: g->L.rope.theta = 10000.0f, g->L.rope.dim = (D / 2) % 2 == 0 ? D / 2 : 0; break;
    case 2: break; /* no rotation: positions still count for the window, sinks and ALiBi */
    default: g->L.rope.theta = 10000.0f; break;
  }
}

static void tt_glayer_free(tt_glayer *g) {
  free(g->wq), free(g->bq), free(g->wk), free(g->bk), free(g->wv), free(g->bv), free(g->wo), free(g->bo);
}

/* fork `src` and append n to the fork; -1 on failure */
static int tt_fork_append(kva_cache *c, int src, int n) {
  int s = -1;
  kva_status st = kva_seq_fork(c, src, &s);
  KT_CHECK(st == KVA_OK, "kva_seq_fork = %d", (int)st);
  if (st != KVA_OK) return -1;
  st = kva_seq_append(c, s, n);
  KT_CHECK(st == KVA_OK, "kva_seq_append(fork, %d) = %d", n, (int)st);
  return st == KVA_OK ? s : -1;
}

static void tt_gqa_case(kt_rng *r, int it) {
  static const int ds[] = {8, 12, 16, 33}, Ds[] = {4, 8, 12, 16, 24}, bss[] = {1, 2, 4, 8, 16};
  int d = ds[kt_int(r, 0, 3)], G = kt_int(r, 1, 2), H = G * kt_int(r, 1, 3), D = Ds[kt_int(r, 0, 4)];
  int L = kt_int(r, 1, 2), bs = bss[kt_int(r, 0, 4)], n = kt_int(r, 1, 12), kind = kt_int(r, 0, TT_KINDS - 1);
  int P = kt_int(r, 0, 3) == 0 ? 0 : kt_int(r, 0, 1) ? bs * kt_int(r, 1, 3) : kt_int(r, 1, 30);
  int l, i, t, A = -1, T = -1, twin = -1, chosen_leaf, k_chosen, ok = 1;
  kva_dtype dt = tt_dtypes[kt_int(r, 0, 5)];
  kva_cache *c;
  tt_glayer *gl = KT_ALLOC(tt_glayer, L);
  int32_t *par = KT_ALLOC(int32_t, n), *chain = KT_ALLOC(int32_t, n), *path = KT_ALLOC(int32_t, n),
          *chosen = KT_ALLOC(int32_t, n);
  float *x_pre = tt_rand_buf(r, (size_t)(P + 1) * d, 1.0f), *x_tree = tt_rand_buf(r, (size_t)n * d, 1.0f);
  float *x_next = tt_rand_buf(r, (size_t)d, 1.0f), *y_tree = KT_ALLOC(float, (size_t)L * n * d);
  float *y = KT_ALLOC(float, (size_t)(P + n + 1) * d), *y2 = KT_ALLOC(float, (size_t)(n + 1) * d);
  float *xp = KT_ALLOC(float, (size_t)n * d);
  tt_snap sT;
  char label[160];
  (void)it;
  for (l = 0; l < L; l++) tt_glayer_init(r, &gl[l], d, H, G, D);
  tt_tree(r, par, n, kind);
  for (i = 0; i < n; i++) chain[i] = i - 1;
  snprintf(label, sizeof label, "gqa %s d=%d H=%d G=%d D=%d L=%d bs=%d prefix=%d %d nodes (%s)", kva_dtype_name(dt), d,
           H, G, D, L, bs, P, n, tt_kind_names[kind]);
  c = tt_cache(r, L, G, D, D, bs, 12 * (tt_cdiv(P + n + 2, bs) + 2), dt, dt);
  if (!c) goto done;
  /* the prefix, linearly */
  ok = kva_seq_new(c, &A) == KVA_OK;
  if (ok && P > 0) {
    ok = kva_seq_append(c, A, P) == KVA_OK;
    for (l = 0; ok && l < L; l++) ok = kva_gqa_forward(&gl[l].L, c, A, l, x_pre, P, y) == KVA_OK;
  }
  /* the tree step */
  T = ok ? tt_fork_append(c, A, n) : -1;
  ok = T >= 0;
  for (l = 0; ok && l < L; l++) {
    kva_status st;
    gl[l].L.attn.tree_parent = par;
    st = kva_gqa_forward(&gl[l].L, c, T, l, x_tree, n, y_tree + (size_t)l * n * d);
    gl[l].L.attn.tree_parent = NULL;
    KT_CHECK(st == KVA_OK, "%s: tree forward, layer %d = %d", label, l, (int)st);
    ok = st == KVA_OK;
  }
  KT_CHECK(ok, "%s: setup", label);
  if (!ok) goto done;
  /* a chain tree is the linear forward, bit for bit */
  {
    int c1 = tt_fork_append(c, A, n), c2 = tt_fork_append(c, A, n);
    if (c1 >= 0 && c2 >= 0) {
      tt_snap s1, s2;
      for (l = 0; l < L; l++) {
        gl[l].L.attn.tree_parent = chain;
        KT_STATUS(kva_gqa_forward(&gl[l].L, c, c1, l, x_tree, n, y), KVA_OK);
        gl[l].L.attn.tree_parent = NULL;
        KT_STATUS(kva_gqa_forward(&gl[l].L, c, c2, l, x_tree, n, y2), KVA_OK);
        KT_CHECK(kt_same_bits(y, y2, (size_t)n * d), "%s: chain forward != linear forward, layer %d", label, l);
        tt_bitwise_checked++;
      }
      tt_snap_take(c, c1, L, G, D, D, &s1);
      tt_snap_take(c, c2, L, G, D, D, &s2);
      KT_CHECK(tt_snap_same(&s1, &s2), "%s: chain and linear forwards stored different K/V", label);
      tt_snap_free(&s1);
      tt_snap_free(&s2);
    }
    if (c1 >= 0) kva_seq_free(c, c1);
    if (c2 >= 0) kva_seq_free(c, c2);
  }
  /* every leaf's path against a twin that forwards prefix + path linearly */
  tt_snap_take(c, T, L, G, D, D, &sT);
  for (t = 0; t < n; t++)
    KT_CHECK(tt_slot_at(&sT, P + t, P + t), "%s: tree slot %d is not at its append position", label, P + t);
  k_chosen = tt_random_path(r, par, n, chosen);
  chosen_leaf = chosen[k_chosen - 1];
  for (i = 0; i < n; i++) {
    int k, w;
    tt_snap sW;
    if (!tt_is_leaf(par, n, i)) continue;
    k = tt_path_to(par, i, path);
    for (t = 0; t < k; t++) memcpy(xp + (size_t)t * d, x_tree + (size_t)path[t] * d, (size_t)d * sizeof(float));
    w = tt_fork_append(c, A, k);
    if (w < 0) break;
    for (l = 0; l < L; l++) {
      double ymax = ref_max_abs_f(y_tree + (size_t)l * n * d, (size_t)n * d), worst = 0.0, tol;
      int wt = 0;
      KT_STATUS(kva_gqa_forward(&gl[l].L, c, w, l, xp, k, y), KVA_OK);
      for (t = 0; t < k; t++) {
        int j;
        for (j = 0; j < d; j++) {
          double e = fabs((double)y[(size_t)t * d + j] - (double)y_tree[((size_t)l * n + path[t]) * d + j]);
          if (!(e <= 1e300)) e = INFINITY;
          if (e > worst) worst = e, wt = t;
        }
      }
      tol = TT_TOL_OUT * (1.0 + ymax);
      if (worst / tol > tt_worst_out) tt_worst_out = worst / tol;
      KT_CHECK(worst <= tol, "%s: layer %d, node %d (depth %d): tree output differs from the linear twin's by %.3g (tol %.3g)",
               label, l, path[wt], wt, worst, tol);
    }
    tt_snap_take(c, w, L, G, D, D, &sW);
    for (t = 0; t < k; t++) {
      KT_CHECK(tt_slot_same_kv(&sT, P + path[t], &sW, P + t),
               "%s: node %d's K/V (rotated at %d) differ from the linear twin's token at %d", label, path[t], P + t,
               P + t);
      KT_CHECK(tt_slot_at(&sW, P + t, P + t), "%s: twin slot %d position", label, P + t);
    }
    tt_snap_free(&sW);
    if (i == chosen_leaf) twin = w;
    else kva_seq_free(c, w);
  }
  tt_snap_free(&sT);
  /* accept the chosen path: the tree sequence is its twin, and decodes like it */
  if (twin >= 0) {
    tt_snap s1, s2;
    KT_STATUS(kva_seq_accept(c, T, n, chosen, k_chosen), KVA_OK);
    tt_snap_take(c, T, L, G, D, D, &s1);
    tt_snap_take(c, twin, L, G, D, D, &s2);
    KT_CHECK(tt_snap_same(&s1, &s2), "%s: after kva_seq_accept of a %d-node path the sequence differs from its twin",
             label, k_chosen);
    tt_snap_free(&s1);
    tt_snap_free(&s2);
    KT_STATUS(kva_seq_append(c, T, 1), KVA_OK);
    KT_STATUS(kva_seq_append(c, twin, 1), KVA_OK);
    for (l = 0; l < L; l++) {
      KT_STATUS(kva_gqa_forward(&gl[l].L, c, T, l, x_next, 1, y), KVA_OK);
      KT_STATUS(kva_gqa_forward(&gl[l].L, c, twin, l, x_next, 1, y2), KVA_OK);
      KT_CHECK(kt_same_bits(y, y2, (size_t)d), "%s: the decode after accept differs from the twin's, layer %d", label, l);
      tt_bitwise_checked++;
    }
  }
  KT_CHECK(tt_stats_consistent(c), "%s: stats inconsistent", label);
done:
  for (l = 0; l < L; l++) tt_glayer_free(&gl[l]);
  free(gl), free(par), free(chain), free(path), free(chosen), free(x_pre), free(x_tree), free(x_next);
  free(y_tree), free(y), free(y2), free(xp);
  kva_cache_destroy(c);
}

static void test_tree_gqa(void) {
  kt_rng r;
  int it;
  kt_begin("tree: kva_gqa_forward rotates node i at base + depth(i) (twins per leaf), accept == twin");
  kt_seed(&r, 0x6A7EE);
  for (it = 0; it < kt_iters(40); it++) tt_gqa_case(&r, it);
}

/* ======================================================================== */
/* Argument errors of tree attention                                        */

static void test_tree_args(void) {
  enum { H = 4, G = 2, D = 8, P = 3, N = 5, NKV = P + N };
  static const int32_t bad[][N] = {
      {0, -1, -1, -1, -1},  /* parent[0] = 0: not < 0 */
      {-1, 1, -1, -1, -1},  /* its own parent */
      {-1, 0, 3, -1, -1},   /* a later node */
      {-2, -1, -1, -1, -1}, /* below -1 */
      {-1, 0, 1, 2, -7},
      {-1, 0, 1, 2, 4},
      {-1, 0, 1, 2, 5},
  };
  int32_t good[N] = {-1, 0, 0, 1, -1}, qp[N] = {3, 4, 5, 6, 7}, kp[NKV] = {0, 1, 2, 3, 4, 5, 6, 7};
  float q[N * H * D], k[NKV * G * D], v[NKV * G * D], out[N * H * D], lse[N * H];
  float x[N * 16], y[N * 16], kr[G * D], vr[G * D];
  kt_rng r;
  kva_attn a;
  kva_cache *c;
  int seq = -1, seqs[2] = {-1, -1}, nq2[2] = {3, 2}, b, l, t, zero;
  tt_glayer gl;
  kva_batch *plan = NULL;
  kva_status st;
  kt_begin("tree: argument errors (parents, non_causal, q_pos / kv_pos) are KVA_ERR_ARG and change nothing");
  kt_seed(&r, 0xA465);
  kt_fill(&r, q, sizeof q / sizeof q[0], -1, 1);
  kt_fill(&r, k, sizeof k / sizeof k[0], -1, 1);
  kt_fill(&r, v, sizeof v / sizeof v[0], -1, 1);
  kt_fill(&r, x, sizeof x / sizeof x[0], -1, 1);
  kt_attn_init(&a, H, G, D, 0);
#define TT_BAD(call, what)                                                                              \
  do {                                                                                                  \
    kt_fill_sentinel(out, sizeof out / sizeof out[0]);                                                  \
    kt_fill_sentinel(lse, sizeof lse / sizeof lse[0]);                                                  \
    st = (call);                                                                                        \
    KT_CHECK(st == KVA_ERR_ARG, "%s: status %d, expected KVA_ERR_ARG", what, (int)st);                  \
    KT_CHECK(kt_all_sentinel(out, sizeof out / sizeof out[0]) && kt_all_sentinel(lse, sizeof lse / sizeof lse[0]), \
             "%s: outputs written on error", what);                                                     \
  } while (0)
  /* arrays */
  a.tree_parent = good;
  KT_STATUS(kva_attend(&a, q, N, NULL, k, v, NKV, NULL, out, lse), KVA_OK);
  for (b = 0; b < (int)(sizeof bad / sizeof bad[0]); b++) {
    a.tree_parent = bad[b];
    TT_BAD(kva_attend(&a, q, N, NULL, k, v, NKV, NULL, out, lse), "arrays: invalid parent");
  }
  a.tree_parent = good;
  TT_BAD(kva_attend(&a, q, N, qp, k, v, NKV, NULL, out, lse), "arrays: q_pos with a tree");
  TT_BAD(kva_attend(&a, q, N, NULL, k, v, NKV, kp, out, lse), "arrays: kv_pos with a tree");
  TT_BAD(kva_attend(&a, q, N, qp, k, v, NKV, kp, out, lse), "arrays: q_pos and kv_pos with a tree");
  TT_BAD(kva_attend(&a, q, N, NULL, k, v, N - 1, NULL, out, lse), "arrays: n_q > n_kv with a tree");
  a.non_causal = 1;
  TT_BAD(kva_attend(&a, q, N, NULL, k, v, NKV, NULL, out, lse), "arrays: non_causal with a tree");
  a.non_causal = 0;
  /* a tree over only the last 3 queries: parents index those */
  KT_STATUS(kva_attend(&a, q, 3, NULL, k, v, NKV, NULL, out, lse), KVA_OK);
  a.tree_parent = bad[5]; /* its first 4 entries are valid: only n_q entries are read */
  KT_STATUS(kva_attend(&a, q, 4, NULL, k, v, NKV, NULL, out, lse), KVA_OK);
  kt_fill_sentinel(out, sizeof out / sizeof out[0]);
  a.tree_parent = bad[0];
  KT_STATUS(kva_attend(&a, q, 0, NULL, k, v, NKV, NULL, out, lse), KVA_OK); /* empty call */
  KT_CHECK(kt_all_sentinel(out, sizeof out / sizeof out[0]), "arrays: n_q == 0 wrote");

  /* the cache, batch plans and the GQA forward */
  c = tt_cache(&r, 2, G, D, D, 4, 16, KVA_F32, KVA_F32);
  if (!c) return;
  tt_glayer_init(&r, &gl, 16, H, G, D);
  gl.L.attn.window = 0, gl.L.attn.n_sink = 0;
  if (kva_seq_new(c, &seq) != KVA_OK || kva_seq_append(c, seq, NKV) != KVA_OK) KT_CHECK(0, "setup");
  KT_STATUS(kva_store(c, seq, 0, k, v, NKV), KVA_OK);
  KT_STATUS(kva_store_at(c, seq, 1, 0, k, v, P), KVA_OK); /* the forwards below store the other N */
  a.tree_parent = good;
  KT_STATUS(kva_attend_cache_lse(c, seq, 0, &a, q, N, out, lse), KVA_OK);
  for (b = 0; b < (int)(sizeof bad / sizeof bad[0]); b++) {
    a.tree_parent = bad[b];
    TT_BAD(kva_attend_cache_lse(c, seq, 0, &a, q, N, out, lse), "cache: invalid parent");
    TT_BAD(kva_attend_cache(c, seq, 0, &a, q, N, out), "cache (no lse): invalid parent");
    nq2[0] = N;
    st = kva_batch_plan(c, &a, &seq, nq2, 1, &plan);
    KT_CHECK(st == KVA_ERR_ARG && plan == NULL, "batch: invalid parent: %d, plan %p", (int)st, (void *)plan);
    kva_batch_free(plan), plan = NULL;
    nq2[0] = 3;
    gl.L.attn.tree_parent = bad[b];
    KT_STATUS(kva_gqa_forward(&gl.L, c, seq, 1, x, N, y), KVA_ERR_ARG);
  }
  a.tree_parent = good;
  a.non_causal = 1;
  TT_BAD(kva_attend_cache_lse(c, seq, 0, &a, q, N, out, lse), "cache: non_causal with a tree");
  nq2[0] = N;
  st = kva_batch_plan(c, &a, &seq, nq2, 1, &plan);
  KT_CHECK(st == KVA_ERR_ARG && plan == NULL, "batch: non_causal with a tree: %d", (int)st);
  a.non_causal = 0;
  gl.L.attn.tree_parent = good;
  gl.L.attn.non_causal = 1;
  KT_STATUS(kva_gqa_forward(&gl.L, c, seq, 1, x, N, y), KVA_ERR_ARG);
  gl.L.attn.non_causal = 0;
  /* nothing was stored in layer 1 by the refused forwards */
  zero = 1;
  for (t = P; t < NKV; t++) {
    KT_STATUS(kva_seq_read(c, seq, 1, t, kr, vr, NULL), KVA_OK);
    for (l = 0; l < G * D; l++) zero &= kr[l] == 0.0f && vr[l] == 0.0f;
  }
  KT_CHECK(zero, "gqa: a refused tree forward stored K/V");
  KT_STATUS(kva_gqa_forward(&gl.L, c, seq, 1, x, N, y), KVA_OK);
  /* batch: each sequence's indices are local to its own tree */
  {
    int32_t seg_bad[5] = {-1, 0, 1, 0, -1};  /* the second tree's node 0 names "0": itself */
    int32_t seg_bad2[5] = {-1, 0, 1, -1, 2}; /* node 1 of the second tree names node 2: later */
    int32_t seg_ok[5] = {-1, 0, 1, -1, 0};
    float qb[5 * H * D], ob[5 * H * D], lb[5 * H], ob2[5 * H * D], lb2[5 * H];
    kva_batch *keep = NULL;
    kt_fill(&r, qb, sizeof qb / sizeof qb[0], -1, 1);
    if (kva_seq_new(c, &seqs[0]) != KVA_OK || kva_seq_append(c, seqs[0], 4) != KVA_OK) KT_CHECK(0, "setup");
    if (kva_seq_new(c, &seqs[1]) != KVA_OK || kva_seq_append(c, seqs[1], 2) != KVA_OK) KT_CHECK(0, "setup");
    KT_STATUS(kva_store(c, seqs[0], 0, k, v, 4), KVA_OK);
    KT_STATUS(kva_store(c, seqs[1], 0, k, v, 2), KVA_OK);
    nq2[0] = 3, nq2[1] = 2;
    a.tree_parent = seg_bad;
    st = kva_batch_plan(c, &a, seqs, nq2, 2, &plan);
    KT_CHECK(st == KVA_ERR_ARG && plan == NULL, "batch: a tree index not local to its sequence: %d", (int)st);
    a.tree_parent = seg_bad2;
    st = kva_batch_plan(c, &a, seqs, nq2, 2, &plan);
    KT_CHECK(st == KVA_ERR_ARG && plan == NULL, "batch: a later node in the second tree: %d", (int)st);
    a.tree_parent = seg_ok;
    KT_STATUS(kva_batch_plan(c, &a, seqs, nq2, 2, &keep), KVA_OK);
    if (keep) {
      kva_batch *was = keep;
      KT_STATUS(kva_attend_batch_lse(c, keep, 0, qb, ob, lb), KVA_OK);
      a.tree_parent = seg_bad;
      KT_STATUS(kva_batch_replan(c, &a, seqs, nq2, 2, &keep), KVA_ERR_ARG);
      KT_CHECK(keep == was, "batch: a refused replan replaced the plan");
      KT_STATUS(kva_attend_batch_lse(c, keep, 0, qb, ob2, lb2), KVA_OK);
      KT_CHECK(kt_same_bits(ob, ob2, sizeof ob / sizeof ob[0]) && kt_same_bits(lb, lb2, sizeof lb / sizeof lb[0]),
               "batch: the plan kept after a refused replan answers differently");
      a.non_causal = 1;
      a.tree_parent = seg_ok;
      KT_STATUS(kva_batch_replan(c, &a, seqs, nq2, 2, &keep), KVA_ERR_ARG);
      a.non_causal = 0;
      KT_CHECK(keep == was, "batch: a refused replan replaced the plan");
      kva_batch_free(keep);
    }
  }
#undef TT_BAD
  tt_glayer_free(&gl);
  kva_cache_destroy(c);
}

/* ======================================================================== */
/* kva_seq_accept                                                           */

/* What a sequence without eviction must hold: the K/V floats stored at each
   slot, k [L][cap][G][D], v [L][cap][G][Dv]. */
typedef struct {
  int L, G, D, Dv, cap, len;
  float *k, *v;
} tt_model;

static void tt_model_init(tt_model *m, int L, int G, int D, int Dv, int cap) {
  m->L = L, m->G = G, m->D = D, m->Dv = Dv, m->cap = cap, m->len = 0;
  m->k = KT_ALLOC(float, (size_t)L * cap * G * D);
  m->v = KT_ALLOC(float, (size_t)L * cap * G * Dv);
}
static float *tt_mk(const tt_model *m, int l, int t) { return m->k + ((size_t)l * m->cap + t) * m->G * m->D; }
static float *tt_mv(const tt_model *m, int l, int t) { return m->v + ((size_t)l * m->cap + t) * m->G * m->Dv; }

/* append n random tokens to seq and the model, stored in every layer */
static int tt_model_step(kt_rng *r, tt_model *m, kva_cache *c, int seq, int n) {
  int l, ok = 1;
  kva_status st;
  if (n == 0) return 1;
  st = kva_seq_append(c, seq, n);
  KT_CHECK(st == KVA_OK, "append %d = %d", n, (int)st);
  if (st != KVA_OK) return 0;
  for (l = 0; l < m->L; l++) {
    kt_fill(r, tt_mk(m, l, m->len), (size_t)n * m->G * m->D, -1.0f, 1.0f);
    kt_fill(r, tt_mv(m, l, m->len), (size_t)n * m->G * m->Dv, -2.0f, 2.0f);
    st = kva_store(c, seq, l, tt_mk(m, l, m->len), tt_mv(m, l, m->len), n);
    KT_CHECK(st == KVA_OK, "store = %d", (int)st);
    ok &= st == KVA_OK;
  }
  m->len += n;
  return ok;
}

static void tt_model_accept(tt_model *m, int n_new, const int32_t *keep, int n_keep) {
  int start = m->len - n_new, j, l;
  for (l = 0; l < m->L; l++)
    for (j = 0; j < n_keep; j++) { /* keep[j] >= j: rows move down */
      memmove(tt_mk(m, l, start + j), tt_mk(m, l, start + keep[j]), (size_t)m->G * m->D * sizeof(float));
      memmove(tt_mv(m, l, start + j), tt_mv(m, l, start + keep[j]), (size_t)m->G * m->Dv * sizeof(float));
    }
  m->len = start + n_keep;
}

/* a new sequence holding the model's tokens, appended in one step */
static int tt_model_twin(const tt_model *m, kva_cache *c) {
  int s = -1, l;
  if (kva_seq_new(c, &s) != KVA_OK) return -1;
  if (m->len > 0) {
    if (kva_seq_append(c, s, m->len) != KVA_OK) return -1;
    for (l = 0; l < m->L; l++)
      if (kva_store(c, s, l, tt_mk(m, l, 0), tt_mv(m, l, 0), m->len) != KVA_OK) return -1;
  }
  return s;
}

/* the expected effect of an accept on a snapshot taken before it (no eviction
   needed: positions are checked relative to pos) */
static void tt_check_accepted(const char *label, const tt_snap *before, const tt_snap *after, int n_new,
                              const int32_t *keep, int n_keep) {
  int start = before->len - n_new, p0 = before->pos - n_new, t, j, bad_pre = 0, bad_kept = 0, bad_pos = 0;
  KT_CHECK(after->len == start + n_keep && after->pos == p0 + n_keep,
           "%s: after accept len %d pos %d, want %d %d (before %d %d, n_new %d, n_keep %d)", label, after->len,
           after->pos, start + n_keep, p0 + n_keep, before->len, before->pos, n_new, n_keep);
  if (after->len != start + n_keep) return;
  for (t = 0; t < start; t++) { /* untouched, positions included */
    int l;
    bad_pre += !tt_slot_same_kv(before, t, after, t);
    for (l = 0; l < after->L; l++)
      bad_pre += memcmp(tt_sp(before, l, t), tt_sp(after, l, t), (size_t)after->G * sizeof(int32_t)) != 0;
  }
  for (j = 0; j < n_keep; j++) {
    bad_kept += !tt_slot_same_kv(before, start + keep[j], after, start + j);
    bad_pos += !tt_slot_at(after, start + j, p0 + j);
  }
  KT_CHECK(bad_pre == 0, "%s: %d older slots changed", label, bad_pre);
  KT_CHECK(bad_kept == 0, "%s: %d of %d kept tokens' K/V did not move to their slots", label, bad_kept, n_keep);
  KT_CHECK(bad_pos == 0, "%s: %d of %d kept tokens are not at consecutive positions from %d", label, bad_pos, n_keep,
           p0);
}

/* keep: a random choice of indices into n_new; returns n_keep */
static int tt_random_keep(kt_rng *r, const int32_t *par, int n, int n_new, int32_t *keep, int *mode_out) {
  int mode = kt_int(r, 0, 9), j, k = 0;
  if (n_new != n && mode < 5) mode = 5; /* paths only over the tree itself */
  *mode_out = mode;
  if (mode < 5) return tt_random_path(r, par, n, keep);
  switch (mode) {
    case 5: case 6:
      for (j = 0; j < n_new; j++)
        if (kt_int(r, 0, 1)) keep[k++] = j;
      return k;
    case 7: return 0;
    case 8:
      for (j = 0; j < n_new; j++) keep[j] = j;
      return n_new;
    default:
      keep[0] = kt_int(r, 0, n_new - 1);
      return 1;
  }
}

static void tt_accept_case(kt_rng *r, int it) {
  static const int Ds[] = {1, 3, 8, 13, 16, 32}, bss[] = {1, 2, 3, 4, 8, 16};
  int L = kt_int(r, 1, 3), G = kt_int(r, 1, 3), H = G * kt_int(r, 1, 2), D = Ds[kt_int(r, 0, 5)];
  int Dv = kt_int(r, 0, 2) ? D : Ds[kt_int(r, 0, 5)], bs = bss[kt_int(r, 0, 5)], rounds = kt_int(r, 1, 3);
  int P, cap, S = -1, T = -1, round, l, ok;
  kva_dtype kt = tt_dtypes[kt_int(r, 0, 5)], vt = kt_int(r, 0, 1) ? kt : tt_dtypes[kt_int(r, 0, 5)];
  kva_cache *c;
  kva_attn a;
  tt_model m;
  char label[200];
  int32_t par[40], keep[80];
  (void)it;
  switch (kt_int(r, 0, 4)) {
    case 0: P = 0; break;
    case 1: P = bs * kt_int(r, 1, 4); break;
    case 2: P = bs * kt_int(r, 1, 4) + (kt_int(r, 0, 1) ? 1 : -1); break;
    default: P = kt_int(r, 1, 60); break;
  }
  cap = P + rounds * (40 + 4) + 1;
  c = tt_cache(r, L, G, D, Dv, bs, 2 * tt_cdiv(cap, bs) + 4, kt, vt);
  if (!c) return;
  tt_model_init(&m, L, G, D, Dv, cap);
  kt_attn_init(&a, H, G, D, Dv == D ? 0 : Dv);
  tt_random_opts(r, &a, 60);
  ok = kva_seq_new(c, &S) == KVA_OK;
  if (ok && P > 0) {
    int c1 = kt_int(r, 0, P);
    ok = tt_model_step(r, &m, c, S, c1) && tt_model_step(r, &m, c, S, P - c1);
  }
  for (round = 0; ok && round < rounds; round++) {
    int n = kt_int(r, 0, 2) ? kt_int(r, 1, 40) : kt_int(r, 1, 4), kind = kt_int(r, 0, TT_KINDS - 1), n_new, n_keep;
    int mode, j, dm;
    tt_snap before, after, twin;
    kva_cache_stats st0;
    kva_status st;
    float *q, *o1, *o2, *l1, *l2;
    tt_tree(r, par, n, kind);
    if (!tt_model_step(r, &m, c, S, n)) break;
    if (kt_int(r, 0, 1)) { /* attend the tree (the usual step: it changes nothing that is checked) */
      float *qq = KT_ALLOC(float, (size_t)n * H * D), *oo = KT_ALLOC(float, (size_t)n * H * (a.v_dim ? a.v_dim : D));
      kva_attn at = a;
      at.tree_parent = par;
      kt_fill(r, qq, (size_t)n * H * D, -1, 1);
      for (l = 0; l < L; l++) KT_STATUS(kva_attend_cache(c, S, l, &at, qq, n, oo), KVA_OK);
      free(qq);
      free(oo);
    }
    switch (kt_int(r, 0, 5)) {
      case 0: n_new = kt_int(r, 1, n); break;                                            /* only the newest of the step */
      case 1: n_new = n + kt_int(r, 0, m.len - n < 12 ? m.len - n : 12); break;          /* into older tokens */
      default: n_new = n; break;
    }
    n_keep = tt_random_keep(r, par, n, n_new, keep, &mode);
    snprintf(label, sizeof label,
             "accept %s/%s L=%d G=%d D=%d Dv=%d bs=%d len %d, n_new %d of a %d-node %s step, keep %d (mode %d)",
             kva_dtype_name(kt), kva_dtype_name(vt), L, G, D, Dv, bs, m.len, n_new, n, tt_kind_names[kind], n_keep,
             mode);
    tt_snap_take(c, S, L, G, D, Dv, &before);
    st = kva_seq_accept(c, S, n_new, keep, n_keep);
    KT_CHECK(st == KVA_OK, "%s: kva_seq_accept = %d", label, (int)st);
    if (st != KVA_OK) {
      tt_snap_free(&before);
      break;
    }
    tt_snap_take(c, S, L, G, D, Dv, &after);
    tt_check_accepted(label, &before, &after, n_new, keep, n_keep);
    for (j = 0; j < after.len; j++) KT_CHECK(tt_slot_at(&after, j, j), "%s: slot %d not at position %d", label, j, j);
    kva_cache_get_stats(c, &st0);
    KT_CHECK(st0.blocks_used == tt_cdiv(after.len, bs) + (T >= 0 ? tt_cdiv(kva_seq_len(c, T), bs) : 0) &&
                 st0.tokens_held == (long)after.len + (T >= 0 ? kva_seq_len(c, T) : 0) &&
                 st0.blocks_used + st0.blocks_free == st0.n_blocks,
             "%s: blocks not released: %d used for %d + %d tokens in blocks of %d", label, st0.blocks_used, after.len,
             T >= 0 ? kva_seq_len(c, T) : 0, bs);
    { /* the step has ended */
      float kk[64 * 3], vv[64 * 3], oo[64 * 6];
      memset(kk, 0, sizeof kk), memset(vv, 0, sizeof vv);
      KT_STATUS(kva_store(c, S, 0, kk, vv, 1), KVA_ERR_STEP);
      KT_STATUS(kva_attend_cache(c, S, 0, &a, kk, 1, oo), KVA_ERR_STEP);
    }
    tt_model_accept(&m, n_new, keep, n_keep);
    if (T >= 0) kva_seq_free(c, T);
    T = tt_model_twin(&m, c);
    KT_CHECK(T >= 0, "%s: twin", label);
    if (T < 0) {
      tt_snap_free(&before), tt_snap_free(&after);
      break;
    }
    tt_snap_take(c, T, L, G, D, Dv, &twin);
    KT_CHECK(tt_snap_same(&after, &twin), "%s: the sequence differs from a twin that appended only the kept tokens",
             label);
    tt_snap_free(&before), tt_snap_free(&after), tt_snap_free(&twin);
    /* both decode the same steps: bit-identical answers */
    dm = kt_int(r, 1, 4);
    {
      int lm = m.len;
      if (!tt_model_step(r, &m, c, S, dm)) break;
      st = kva_seq_append(c, T, dm);
      KT_CHECK(st == KVA_OK, "%s: twin append", label);
      for (l = 0; l < L && st == KVA_OK; l++) st = kva_store(c, T, l, tt_mk(&m, l, lm), tt_mv(&m, l, lm), dm);
      if (st != KVA_OK) break;
    }
    q = KT_ALLOC(float, (size_t)dm * H * D);
    o1 = KT_ALLOC(float, (size_t)dm * H * Dv);
    o2 = KT_ALLOC(float, (size_t)dm * H * Dv);
    l1 = KT_ALLOC(float, (size_t)dm * H);
    l2 = KT_ALLOC(float, (size_t)dm * H);
    for (l = 0; l < L; l++) {
      kva_attn at = a;
      int32_t dpar[4];
      if (kt_int(r, 0, 1)) {
        tt_tree(r, dpar, dm, kt_int(r, 0, TT_KINDS - 1));
        at.tree_parent = dpar;
      }
      kt_fill(r, q, (size_t)dm * H * D, -1, 1);
      KT_STATUS(kva_attend_cache_lse(c, S, l, &at, q, dm, o1, l1), KVA_OK);
      KT_STATUS(kva_attend_cache_lse(c, T, l, &at, q, dm, o2, l2), KVA_OK);
      KT_CHECK(kt_same_bits(o1, o2, (size_t)dm * H * Dv) && kt_same_bits(l1, l2, (size_t)dm * H),
               "%s: the next step's attention differs from the twin's (layer %d)", label, l);
      tt_bitwise_checked++;
    }
    free(q), free(o1), free(o2), free(l1), free(l2);
  }
  KT_CHECK(tt_stats_consistent(c), "accept: stats inconsistent");
  free(m.k), free(m.v);
  kva_cache_destroy(c);
}

static void test_accept_random(void) {
  kt_rng r;
  int it;
  kt_begin("accept: random trees, paths and subsets == a twin that appended only the kept tokens");
  kt_seed(&r, 0xACC3);
  for (it = 0; it < kt_iters(120); it++) tt_accept_case(&r, it);
}

/* H2O: the kept tokens' scores move with them. Keys are 0 ("light") or
   a * u_g ("heavy", u_g a +-1 vector per KV head) and every query is a * u_g:
   the heavy keys a query sees share almost all of its probability, a light
   one gets about e^-25 of it. One prefix token is heavy, so every query sees
   a heavy key. Per layer and KV head exactly h of the accepted path's tokens
   are heavy; the next append evicts exactly the light tokens (prefix and
   kept), so the survivors per (layer, KV head) must be the heavy prefix
   token, the heavy kept tokens (at their new positions) and the new ones. */
static void tt_accept_h2o_case(kt_rng *r, int it) {
  int L = kt_int(r, 1, 2), G = kt_int(r, 1, 3), R = kt_int(r, 1, 2), H = G * R, D = kt_int(r, 2, 12);
  int bs = kt_int(r, 1, 8), P = kt_int(r, 1, 20), n = kt_int(r, 2, 16), k, h, m, l, g, j, t, S = -1, ok = 1;
  int hp = kt_int(r, 0, P - 1); /* the heavy prefix token */
  int kind = kt_int(r, 0, TT_KINDS - 1);
  kva_dtype dt = tt_dtypes[kt_int(r, 0, 5)];
  double amp = sqrt(25.0 / sqrt((double)D)); /* a^2 D / sqrt(D) = 25 */
  kva_cache *c;
  kva_evict e;
  kva_attn a;
  int32_t par[16], path[16];
  char *heavy = KT_ALLOC(char, (size_t)L * G * n); /* [l][g][node] */
  float *u = KT_ALLOC(float, (size_t)G * D), *k_rows = KT_ALLOC(float, (size_t)L * (P + n) * G * D);
  float *v_rows = KT_ALLOC(float, (size_t)L * (P + n) * G * D), *q = KT_ALLOC(float, (size_t)n * H * D);
  float *o = KT_ALLOC(float, (size_t)n * H * D);
  tt_snap before, after;
  char label[160];
  (void)it;
  tt_tree(r, par, n, kind);
  k = tt_random_path(r, par, n, path);
  h = k >= 2 ? kt_int(r, 1, k - 1) : kt_int(r, 0, 1);
  m = P + n - 1 - h; /* >= 1; the next append evicts the P - 1 + k - h light tokens */
  snprintf(label, sizeof label,
           "accept H2O %s L=%d G=%d R=%d D=%d bs=%d prefix %d (heavy %d), %d nodes (%s), path %d, heavy %d",
           kva_dtype_name(dt), L, G, R, D, bs, P, hp, n, tt_kind_names[kind], k, h);
  for (g = 0; g < G; g++)
    for (j = 0; j < D; j++) u[g * D + j] = kt_int(r, 0, 1) ? (float)amp : (float)-amp;
  for (l = 0; l < L; l++)
    for (g = 0; g < G; g++) {
      char *hv = heavy + ((size_t)l * G + g) * n;
      int placed = 0;
      for (j = 0; j < n; j++) hv[j] = (char)kt_int(r, 0, 1);
      for (j = 0; j < k; j++) hv[path[j]] = 0;
      while (placed < h) { /* exactly h heavy nodes on the path */
        int x = path[kt_int(r, 0, k - 1)];
        if (!hv[x]) hv[x] = 1, placed++;
      }
    }
  /* rows: prefix light, node j heavy or light per (layer, head) */
  memset(k_rows, 0, sizeof(float) * (size_t)L * (P + n) * G * D);
  kt_fill(r, v_rows, (size_t)L * (P + n) * G * D, -2, 2);
  for (l = 0; l < L; l++)
    for (g = 0; g < G; g++)
      memcpy(k_rows + (((size_t)l * (P + n) + hp) * G + g) * D, u + g * D, (size_t)D * sizeof(float));
  for (l = 0; l < L; l++)
    for (j = 0; j < n; j++)
      for (g = 0; g < G; g++)
        if (heavy[((size_t)l * G + g) * n + j])
          memcpy(k_rows + (((size_t)l * (P + n) + P + j) * G + g) * D, u + g * D, (size_t)D * sizeof(float));
  for (t = 0; t < n; t++)
    for (j = 0; j < H; j++) memcpy(q + ((size_t)t * H + j) * D, u + (j / R) * D, (size_t)D * sizeof(float));
  c = tt_cache(r, L, G, D, D, bs, 2 * tt_cdiv(2 * (P + n) + 2, bs) + 4, dt, dt);
  if (!c) goto done;
  memset(&e, 0, sizeof e);
  e.kind = KVA_EVICT_H2O;
  e.budget = P + n;
  kt_attn_init(&a, H, G, D, 0);
  a.n_threads = kt_int(r, 0, 2);
  ok = kva_seq_new(c, &S) == KVA_OK && kva_seq_set_evict(c, S, &e) == KVA_OK;
  if (ok) { /* the prefix: light but for token hp, never attended */
    ok = kva_seq_append(c, S, P) == KVA_OK;
    for (l = 0; ok && l < L; l++)
      ok = kva_store(c, S, l, k_rows + (size_t)l * (P + n) * G * D, v_rows + (size_t)l * (P + n) * G * D, P) == KVA_OK;
  }
  ok = ok && kva_seq_append(c, S, n) == KVA_OK;
  for (l = 0; ok && l < L; l++) {
    kva_attn at = a;
    at.tree_parent = par;
    ok = kva_store(c, S, l, k_rows + ((size_t)l * (P + n) + P) * G * D, v_rows + ((size_t)l * (P + n) + P) * G * D,
                   n) == KVA_OK &&
         kva_attend_cache(c, S, l, &at, q, n, o) == KVA_OK;
  }
  KT_CHECK(ok && kva_seq_len(c, S) == P + n, "%s: setup", label);
  if (!ok) goto done;
  tt_snap_take(c, S, L, G, D, D, &before);
  KT_STATUS(kva_seq_accept(c, S, n, path, k), KVA_OK);
  tt_snap_take(c, S, L, G, D, D, &after);
  tt_check_accepted(label, &before, &after, n, path, k);
  tt_snap_free(&after);
  KT_STATUS(kva_seq_append(c, S, m), KVA_OK);
  KT_CHECK(kva_seq_len(c, S) == P + n && kva_seq_pos(c, S) == P + k + m, "%s: after eviction len %d pos %d, want %d %d",
           label, kva_seq_len(c, S), kva_seq_pos(c, S), P + n, P + k + m);
  tt_snap_take(c, S, L, G, D, D, &after);
  for (l = 0; l < L; l++)
    for (g = 0; g < G; g++) {
      const char *hv = heavy + ((size_t)l * G + g) * n;
      int want = 0, found = 0, wrong = 0, kv_bad = 0, found_hp = 0;
      for (j = 0; j < k; j++) want += hv[path[j]];
      for (t = 0; t < after.len; t++) {
        int32_t p = tt_sp(&after, l, t)[g];
        if (p >= P + k && p < P + k + m) continue; /* a new token */
        if (p == hp) { /* the heavy prefix token, with its K/V */
          found_hp++;
          kv_bad += !kt_same_bits(tt_sk(&after, l, t) + (size_t)g * D, tt_sk(&before, l, hp) + (size_t)g * D, (size_t)D);
          continue;
        }
        if (p >= P && p < P + k && hv[path[p - P]]) {
          found++;
          /* and it still holds its own K/V */
          kv_bad += !kt_same_bits(tt_sk(&after, l, t) + (size_t)g * D, tt_sk(&before, l, P + path[p - P]) + (size_t)g * D,
                                  (size_t)D) ||
                    !kt_same_bits(tt_sv(&after, l, t) + (size_t)g * D, tt_sv(&before, l, P + path[p - P]) + (size_t)g * D,
                                  (size_t)D);
        } else {
          wrong++;
        }
      }
      KT_CHECK(found == want && wrong == 0 && kv_bad == 0 && found_hp == 1,
               "%s: layer %d head %d: H2O kept %d of the %d heavy accepted tokens, %d of the heavy prefix token and %d "
               "others (%d with wrong K/V): scores did not move with their tokens",
               label, l, g, found, want, found_hp, wrong, kv_bad);
    }
  tt_snap_free(&before);
  tt_snap_free(&after);
done:
  free(heavy), free(u), free(k_rows), free(v_rows), free(q), free(o);
  kva_cache_destroy(c);
}

static void test_accept_h2o(void) {
  kt_rng r;
  int it;
  kt_begin("accept: H2O scores move with the kept tokens (a later eviction keeps the heavy ones)");
  kt_seed(&r, 0x420);
  for (it = 0; it < kt_iters(60); it++) tt_accept_h2o_case(&r, it);
}

/* a path or subset of 0..n-1 that moves at least one token (keep[j] != j for some j) */
static int tt_moving_keep(kt_rng *r, const int32_t *par, int n, int32_t *keep) {
  int tries, k = 0, j;
  for (tries = 0; tries < 20; tries++) {
    k = tt_random_path(r, par, n, keep);
    for (j = 0; j < k; j++)
      if (keep[j] != j) return k;
  }
  keep[0] = n - 1; /* n >= 2 */
  return 1;
}

static void test_accept_shared(void) {
  kt_rng r;
  int it;
  kt_begin("accept: forks and published blocks keep their data; a full pool is KVA_ERR_FULL with nothing changed");
  kt_seed(&r, 0x5A4ED);
  for (it = 0; it < kt_iters(40); it++) {
    int L = kt_int(&r, 1, 2), G = kt_int(&r, 1, 2), D = kt_int(&r, 1, 13), Dv = kt_int(&r, 0, 1) ? D : kt_int(&r, 1, 9);
    int bs = kt_int(&r, 1, 8), P = kt_int(&r, 0, 20), n = kt_int(&r, 2, 20), k, k2, S = -1, F = -1, X = -1, reused = 0;
    int part, t;
    kva_status st;
    kva_dtype dt = tt_dtypes[kt_int(&r, 0, 5)];
    int32_t par[20], keep[20], keep2[20], *tokens = KT_ALLOC(int32_t, P + n + 1);
    char label[160];
    tt_tree(&r, par, n, kt_int(&r, 0, TT_KINDS - 1));
    k = tt_moving_keep(&r, par, n, keep);
    k2 = tt_random_keep(&r, par, n, n, keep2, &t);
    for (t = 0; t <= P + n; t++) tokens[t] = 1000 + t;
    snprintf(label, sizeof label, "accept shared %s L=%d G=%d D=%d Dv=%d bs=%d prefix %d, %d nodes, keep %d",
             kva_dtype_name(dt), L, G, D, Dv, bs, P, n, k);
    for (part = 0; part < 3; part++) {
      int extra = kt_int(&r, 0, 2);
      int n_blocks = part == 2 ? tt_cdiv(P + n, bs) + extra : 4 * tt_cdiv(P + n, bs) + 8;
      kva_cache *c = tt_cache(&r, L, G, D, Dv, bs, n_blocks, dt, dt);
      tt_snap s0, f0, s1, f1;
      kva_cache_stats st0, st1;
      int ok;
      if (!c) break;
      ok = kva_seq_new(c, &S) == KVA_OK && tt_append_random(&r, c, S, L, G, D, Dv, P) &&
           tt_append_random(&r, c, S, L, G, D, Dv, n);
      KT_CHECK(ok, "%s: setup", label);
      if (!ok) {
        kva_cache_destroy(c);
        break;
      }
      tt_snap_take(c, S, L, G, D, Dv, &s0);
      if (part == 0) { /* a fork shares every block */
        KT_STATUS(kva_seq_fork(c, S, &F), KVA_OK);
        tt_snap_take(c, F, L, G, D, Dv, &f0);
        KT_STATUS(kva_seq_accept(c, S, n, keep, k), KVA_OK);
        tt_snap_take(c, S, L, G, D, Dv, &s1);
        tt_snap_take(c, F, L, G, D, Dv, &f1);
        tt_check_accepted(label, &s0, &s1, n, keep, k);
        KT_CHECK(tt_snap_same(&f0, &f1), "%s: accepting in a sequence changed its fork", label);
        tt_snap_free(&f1);
        KT_STATUS(kva_seq_accept(c, F, n, keep2, k2), KVA_OK); /* and the fork its own way */
        tt_snap_take(c, F, L, G, D, Dv, &f1);
        tt_check_accepted(label, &f0, &f1, n, keep2, k2);
        tt_snap_free(&f1);
        tt_snap_take(c, S, L, G, D, Dv, &f1);
        KT_CHECK(tt_snap_same(&s1, &f1), "%s: accepting in the fork changed the source", label);
        tt_snap_free(&f1);
        tt_snap_free(&f0);
        tt_snap_free(&s1);
      } else if (part == 1) { /* published blocks: a prefix hit after the accept finds the old data */
        KT_STATUS(kva_seq_publish(c, S, tokens, P + n, 7), KVA_OK);
        KT_STATUS(kva_seq_accept(c, S, n, keep, k), KVA_OK);
        tt_snap_take(c, S, L, G, D, Dv, &s1);
        tt_check_accepted(label, &s0, &s1, n, keep, k);
        tt_snap_free(&s1);
        KT_STATUS(kva_seq_new_prefix(c, tokens, P + n + 1, 7, &X, &reused), KVA_OK);
        KT_CHECK(reused == (P + n) / bs * bs, "%s: prefix hit of %d tokens, want %d", label, reused, (P + n) / bs * bs);
        if (X >= 0) {
          tt_snap_take(c, X, L, G, D, Dv, &f1);
          for (t = 0; t < f1.len; t++)
            KT_CHECK(tt_slot_same_kv(&f1, t, &s0, t), "%s: published slot %d changed by the accept", label, t);
          tt_snap_free(&f1);
        }
      } else { /* a full pool */
        int filler = -1, free_blocks;
        KT_STATUS(kva_seq_fork(c, S, &F), KVA_OK);
        kva_cache_get_stats(c, &st0);
        free_blocks = st0.blocks_free;
        if (free_blocks > 0) {
          KT_STATUS(kva_seq_new(c, &filler), KVA_OK);
          KT_STATUS(kva_seq_append(c, filler, free_blocks * bs), KVA_OK);
        }
        tt_snap_take(c, F, L, G, D, Dv, &f0);
        kva_cache_get_stats(c, &st0);
        KT_CHECK(st0.blocks_free == 0 && st0.blocks_cached == 0, "%s: pool not full", label);
        KT_STATUS(kva_seq_accept(c, S, n, keep, k), KVA_ERR_FULL);
        kva_cache_get_stats(c, &st1);
        KT_CHECK(kt_stats_equal(&st0, &st1, 0), "%s: a refused accept changed the cache statistics", label);
        tt_snap_take(c, S, L, G, D, Dv, &s1);
        KT_CHECK(tt_snap_same(&s0, &s1), "%s: a refused accept changed the sequence (len %d -> %d, pos %d -> %d)",
                 label, s0.len, s1.len, s0.pos, s1.pos);
        tt_snap_free(&s1);
        tt_snap_take(c, F, L, G, D, Dv, &f1);
        KT_CHECK(tt_snap_same(&f0, &f1), "%s: a refused accept changed the fork", label);
        tt_snap_free(&f1);
        { /* keeping a leading run rewrites nothing: no block needed, even now */
          int32_t lead[20];
          int kl = kt_int(&r, 0, n);
          for (t = 0; t < kl; t++) lead[t] = t;
          KT_STATUS(kva_seq_accept(c, F, n, lead, kl), KVA_OK);
          tt_snap_take(c, F, L, G, D, Dv, &f1);
          tt_check_accepted(label, &f0, &f1, n, lead, kl);
          tt_snap_free(&f1);
        }
        if (filler >= 0) KT_STATUS(kva_seq_free(c, filler), KVA_OK);
        st = kva_seq_accept(c, S, n, keep, k);
        if (st != KVA_OK) { /* still short (the fork holds the blocks S would copy): nothing changed */
          tt_snap_take(c, S, L, G, D, Dv, &s1);
          KT_CHECK(st == KVA_ERR_FULL && tt_snap_same(&s0, &s1), "%s: accept after freeing = %d", label, (int)st);
          tt_snap_free(&s1);
          KT_STATUS(kva_seq_free(c, F), KVA_OK);
          KT_STATUS(kva_seq_accept(c, S, n, keep, k), KVA_OK);
        }
        tt_snap_take(c, S, L, G, D, Dv, &s1);
        tt_check_accepted(label, &s0, &s1, n, keep, k);
        tt_snap_free(&s1);
        tt_snap_free(&f0);
      }
      KT_CHECK(tt_stats_consistent(c), "%s: stats inconsistent", label);
      tt_snap_free(&s0);
      kva_cache_destroy(c);
    }
    free(tokens);
  }
}

static void test_accept_args(void) {
  typedef struct {
    int n_new, keep[4], n_keep, null_keep;
    const char *what;
  } bad_case;
  static const bad_case bad[] = {
      {6, {0, 2, 1, 0}, 3, 0, "keep not ascending"},
      {6, {1, 1, 0, 0}, 2, 0, "keep repeats an index"},
      {6, {0, 6, 0, 0}, 2, 0, "keep index == n_new"},
      {6, {-1, 2, 0, 0}, 2, 0, "negative keep index"},
      {2, {0, 1, 1, 0}, 3, 0, "n_keep > n_new"},
      {3, {0, 1, 2, 3}, 4, 0, "n_keep > n_new (index out of range too)"},
      {12, {0, 0, 0, 0}, 1, 0, "n_new > len"},
      {-1, {0, 0, 0, 0}, 0, 0, "n_new < 0"},
      {6, {0, 0, 0, 0}, -1, 0, "n_keep < 0"},
      {6, {0, 0, 0, 0}, 1, 1, "keep NULL with n_keep 1"},
  };
  kt_rng r;
  kva_cache *c;
  int S = -1, X = -1, F = -1, i, L = 2, G = 2, D = 5, Dv = 3;
  tt_snap s0, s1;
  kva_cache_stats st0, st1;
  kva_attn a;
  float q[6 * 4 * 5], out[6 * 4 * 3], kk[6 * 2 * 5], vv[6 * 2 * 3];
  kt_begin("accept: argument errors are KVA_ERR_ARG / KVA_ERR_SEQ and change nothing, not even the step");
  kt_seed(&r, 0xA5C);
  c = tt_cache(&r, L, G, D, Dv, 3, 32, KVA_F16, KVA_INT8);
  if (!c) return;
  if (kva_seq_new(c, &S) != KVA_OK || !tt_append_random(&r, c, S, L, G, D, Dv, 5) ||
      !tt_append_random(&r, c, S, L, G, D, Dv, 6) || kva_seq_new(c, &X) != KVA_OK || kva_seq_free(c, X) != KVA_OK) {
    KT_CHECK(0, "setup");
    kva_cache_destroy(c);
    return;
  }
  tt_snap_take(c, S, L, G, D, Dv, &s0);
  kva_cache_get_stats(c, &st0);
  for (i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
    int32_t keep[4];
    int j;
    for (j = 0; j < 4; j++) keep[j] = bad[i].keep[j];
    KT_CHECK(kva_seq_accept(c, S, bad[i].n_new, bad[i].null_keep ? NULL : keep, bad[i].n_keep) == KVA_ERR_ARG,
             "accept: %s: not KVA_ERR_ARG", bad[i].what);
    tt_snap_take(c, S, L, G, D, Dv, &s1);
    kva_cache_get_stats(c, &st1);
    KT_CHECK(tt_snap_same(&s0, &s1) && kt_stats_equal(&st0, &st1, 0), "accept: %s changed the sequence or the cache",
             bad[i].what);
    tt_snap_free(&s1);
  }
  KT_STATUS(kva_seq_accept(NULL, S, 1, NULL, 0), KVA_ERR_ARG);
  KT_STATUS(kva_seq_accept(c, X, 1, NULL, 0), KVA_ERR_SEQ);
  KT_STATUS(kva_seq_accept(c, -1, 1, NULL, 0), KVA_ERR_SEQ);
  KT_STATUS(kva_seq_accept(c, 1 << 28, 1, NULL, 0), KVA_ERR_SEQ);
  KT_STATUS(kva_seq_accept(c, X, -1, NULL, 0), KVA_ERR_ARG); /* argument errors before sequence errors */
  KT_STATUS(kva_seq_accept(c, X, 1, NULL, 1), KVA_ERR_ARG);
  KT_STATUS(kva_seq_accept(c, X, 1, NULL, 2), KVA_ERR_ARG);
  tt_snap_take(c, S, L, G, D, Dv, &s1);
  kva_cache_get_stats(c, &st1);
  KT_CHECK(tt_snap_same(&s0, &s1) && kt_stats_equal(&st0, &st1, 0), "accept: refused calls changed something");
  tt_snap_free(&s1);
  /* the step is still there: the 6 newest tokens can be stored and attended */
  kt_attn_init(&a, 4, G, D, Dv);
  kt_fill(&r, q, sizeof q / sizeof q[0], -1, 1);
  kt_fill(&r, kk, sizeof kk / sizeof kk[0], -1, 1);
  kt_fill(&r, vv, sizeof vv / sizeof vv[0], -1, 1);
  KT_STATUS(kva_store(c, S, 1, kk, vv, 6), KVA_OK);
  KT_STATUS(kva_attend_cache(c, S, 1, &a, q, 6, out), KVA_OK);
  tt_snap_free(&s0);
  tt_snap_take(c, S, L, G, D, Dv, &s0);
  /* edges that are valid: nothing accepted from nothing; the whole sequence */
  KT_STATUS(kva_seq_accept(c, S, 0, NULL, 0), KVA_OK);
  tt_snap_take(c, S, L, G, D, Dv, &s1);
  KT_CHECK(tt_snap_same(&s0, &s1), "accept(n_new 0) changed the sequence");
  tt_snap_free(&s1);
  KT_STATUS(kva_seq_fork(c, S, &F), KVA_OK);
  KT_STATUS(kva_seq_accept(c, F, 11, NULL, 0), KVA_OK);
  KT_CHECK(kva_seq_len(c, F) == 0 && kva_seq_pos(c, F) == 0, "accept of nothing out of everything: len %d pos %d",
           kva_seq_len(c, F), kva_seq_pos(c, F));
  KT_STATUS(kva_seq_free(c, F), KVA_OK);
  KT_STATUS(kva_seq_fork(c, S, &F), KVA_OK);
  {
    int32_t last = 10, mid[3] = {1, 4, 9};
    KT_STATUS(kva_seq_accept(c, F, 11, &last, 1), KVA_OK);
    tt_snap_take(c, F, L, G, D, Dv, &s1);
    tt_check_accepted("accept of the last token of all", &s0, &s1, 11, &last, 1);
    tt_snap_free(&s1);
    KT_STATUS(kva_seq_free(c, F), KVA_OK);
    KT_STATUS(kva_seq_fork(c, S, &F), KVA_OK);
    KT_STATUS(kva_seq_accept(c, F, 11, mid, 3), KVA_OK);
    tt_snap_take(c, F, L, G, D, Dv, &s1);
    tt_check_accepted("accept across the older tokens", &s0, &s1, 11, mid, 3);
    tt_snap_free(&s1);
  }
  KT_CHECK(tt_stats_consistent(c), "accept args: stats inconsistent");
  tt_snap_free(&s0);
  kva_cache_destroy(c);
}

/* append n tokens to seq a of cache ca and seq b of cache cb, storing the same random rows */
static int tt_append_both(kt_rng *r, kva_cache *ca, int a, kva_cache *cb, int b, int L, int G, int D, int Dv, int n) {
  float *k = KT_ALLOC(float, (size_t)n * G * D + 1), *v = KT_ALLOC(float, (size_t)n * G * Dv + 1);
  int l, ok = 1;
  if (n > 0) {
    ok = kva_seq_append(ca, a, n) == KVA_OK && kva_seq_append(cb, b, n) == KVA_OK;
    for (l = 0; ok && l < L; l++) {
      kt_fill(r, k, (size_t)n * G * D, -1, 1);
      kt_fill(r, v, (size_t)n * G * Dv, -2, 2);
      ok = kva_store(ca, a, l, k, v, n) == KVA_OK && kva_store(cb, b, l, k, v, n) == KVA_OK;
    }
  }
  KT_CHECK(ok, "append and store %d tokens in both", n);
  free(k);
  free(v);
  return ok;
}

/* one more step of m tokens in both, attended with the same queries: bit-identical */
static void tt_decode_both(kt_rng *r, kva_cache *ca, int a, kva_cache *cb, int b, const kva_attn *at, int L, int m,
                           const char *label) {
  int H = at->n_heads, D = at->head_dim, Dv = at->v_dim ? at->v_dim : D, l;
  float *q = KT_ALLOC(float, (size_t)m * H * D), *o1 = KT_ALLOC(float, (size_t)m * H * Dv),
        *o2 = KT_ALLOC(float, (size_t)m * H * Dv), *l1 = KT_ALLOC(float, (size_t)m * H),
        *l2 = KT_ALLOC(float, (size_t)m * H);
  if (tt_append_both(r, ca, a, cb, b, L, at->n_kv_heads, D, Dv, m)) {
    for (l = 0; l < L; l++) {
      kt_fill(r, q, (size_t)m * H * D, -1, 1);
      KT_STATUS(kva_attend_cache_lse(ca, a, l, at, q, m, o1, l1), KVA_OK);
      KT_STATUS(kva_attend_cache_lse(cb, b, l, at, q, m, o2, l2), KVA_OK);
      KT_CHECK(kt_same_bits(o1, o2, (size_t)m * H * Dv) && kt_same_bits(l1, l2, (size_t)m * H),
               "%s: the next step's attention differs (layer %d)", label, l);
      tt_bitwise_checked++;
    }
  }
  free(q), free(o1), free(o2), free(l1), free(l2);
}

static void test_accept_truncate(void) {
  kt_rng r;
  int it;
  kt_begin("accept: keep = {0..k-1} == kva_seq_truncate (forks, eviction, the step, statistics)");
  kt_seed(&r, 0x7B0C);
  for (it = 0; it < kt_iters(40); it++) {
    int L = kt_int(&r, 1, 2), G = kt_int(&r, 1, 2), D = kt_int(&r, 1, 9), Dv = D, bs = kt_int(&r, 1, 6);
    int P = kt_int(&r, 0, 25), n = kt_int(&r, 1, 12), k = kt_int(&r, 0, n), evict = kt_int(&r, 0, 2), fork = kt_int(&r, 0, 1);
    int s[2] = {-1, -1}, f[2] = {-1, -1}, n_new, ci, ok = 1, st[2], st2[2], j;
    kva_dtype dt = tt_dtypes[kt_int(&r, 0, 5)];
    kva_cache *c[2];
    kva_attn a;
    int32_t keep[12];
    tt_snap sn[2];
    kva_cache_stats ss[2];
    kva_evict e;
    char label[160];
    kt_rng r2 = r; /* both caches get the same FP8 scales */
    c[0] = tt_cache(&r2, L, G, D, Dv, bs, 4 * tt_cdiv(P + n + 8, bs) + 8, dt, dt);
    c[1] = tt_cache(&r, L, G, D, Dv, bs, 4 * tt_cdiv(P + n + 8, bs) + 8, dt, dt);
    memset(&e, 0, sizeof e);
    e.kind = evict == 2 ? KVA_EVICT_H2O : KVA_EVICT_WINDOW;
    e.budget = kt_int(&r, 3, 12);
    e.n_sink = kt_int(&r, 0, 1);
    e.rollback = kt_int(&r, 0, 1);
    for (ci = 0; ci < 2; ci++) {
      ok = ok && c[ci] && kva_seq_new(c[ci], &s[ci]) == KVA_OK;
      if (ok && evict) ok = kva_seq_set_evict(c[ci], s[ci], &e) == KVA_OK;
    }
    KT_CHECK(ok, "truncate: setup");
    if (ok) ok = tt_append_both(&r, c[0], s[0], c[1], s[1], L, G, D, Dv, P);
    if (ok) ok = tt_append_both(&r, c[0], s[0], c[1], s[1], L, G, D, Dv, n);
    if (ok && fork)
      for (ci = 0; ci < 2; ci++) ok = ok && kva_seq_fork(c[ci], s[ci], &f[ci]) == KVA_OK;
    n_new = n;
    if (!evict && kt_int(&r, 0, 1)) n_new = n + kt_int(&r, 0, P);
    k = kt_int(&r, 0, n_new < 12 ? n_new : 12);
    for (j = 0; j < k; j++) keep[j] = j;
    snprintf(label, sizeof label, "truncate %s L=%d G=%d D=%d bs=%d prefix %d step %d n_new %d keep %d%s%s",
             kva_dtype_name(dt), L, G, D, bs, P, n, n_new, k, evict == 1 ? " WINDOW" : evict == 2 ? " H2O" : "",
             fork ? " forked" : "");
    if (ok) {
      /* a fork ends the step: an evicted sequence then has no newest step to reach into */
      int want = fork && kva_seq_pos(c[0], s[0]) != kva_seq_len(c[0], s[0]) ? KVA_ERR_UNSUPPORTED : KVA_OK;
      if (want != KVA_OK && k == n_new) k--; /* keeping everything is no truncation at all: left out */
      st[0] = (int)kva_seq_accept(c[0], s[0], n_new, keep, k);
      st[1] = (int)kva_seq_truncate(c[1], s[1], kva_seq_len(c[1], s[1]) - n_new + k);
      KT_CHECK(st[0] == want && st[1] == want, "%s: accept %d, truncate %d, want %d", label, st[0], st[1], want);
      for (ci = 0; ci < 2; ci++) {
        tt_snap_take(c[ci], s[ci], L, G, D, Dv, &sn[ci]);
        kva_cache_get_stats(c[ci], &ss[ci]);
      }
      KT_CHECK(tt_snap_same(&sn[0], &sn[1]), "%s: the sequences differ (len %d/%d pos %d/%d)", label, sn[0].len,
               sn[1].len, sn[0].pos, sn[1].pos);
      KT_CHECK(kt_stats_equal(&ss[0], &ss[1], 0), "%s: the caches' statistics differ (used %d/%d, cow %ld/%ld)", label,
               ss[0].blocks_used, ss[1].blocks_used, ss[0].cow_copies, ss[1].cow_copies);
      tt_snap_free(&sn[0]);
      tt_snap_free(&sn[1]);
      if (fork) {
        for (ci = 0; ci < 2; ci++) tt_snap_take(c[ci], f[ci], L, G, D, Dv, &sn[ci]);
        KT_CHECK(tt_snap_same(&sn[0], &sn[1]), "%s: the forks differ", label);
        tt_snap_free(&sn[0]);
        tt_snap_free(&sn[1]);
      }
      { /* both ended the step the same way */
        float kk[16], vv[16], oo[32];
        memset(kk, 0, sizeof kk), memset(vv, 0, sizeof vv);
        kt_attn_init(&a, G, G, D, 0);
        for (ci = 0; ci < 2; ci++) {
          st[ci] = (int)kva_store(c[ci], s[ci], 0, kk, vv, 1);
          st2[ci] = (int)kva_attend_cache(c[ci], s[ci], 0, &a, kk, 1, oo);
        }
        KT_CHECK(st[0] == st[1] && st2[0] == st2[1] && st[0] == KVA_ERR_STEP,
                 "%s: after accept store %d attend %d, after truncate %d %d", label, st[0], st2[0], st[1], st2[1]);
      }
      kt_attn_init(&a, G * kt_int(&r, 1, 2), G, D, 0);
      tt_random_opts(&r, &a, 30);
      tt_decode_both(&r, c[0], s[0], c[1], s[1], &a, L, kt_int(&r, 1, 3), label);
    }
    kva_cache_destroy(c[0]);
    kva_cache_destroy(c[1]);
  }
}

static void test_accept_evicted(void) {
  kt_rng r;
  int it;
  kt_begin("accept: an evicted sequence accepts within its newest step only; with rollback it equals its twin");
  kt_seed(&r, 0xE71C);
  for (it = 0; it < kt_iters(40); it++) {
    int L = kt_int(&r, 1, 2), G = kt_int(&r, 1, 2), D = kt_int(&r, 1, 9), bs = kt_int(&r, 1, 6), round, ok, S = -1, T = -1;
    kva_dtype dt = tt_dtypes[kt_int(&r, 0, 5)];
    kva_cache *c;
    kva_evict e;
    kva_attn a;
    char label[160];
    memset(&e, 0, sizeof e);
    e.kind = kt_int(&r, 0, 1) ? KVA_EVICT_H2O : KVA_EVICT_WINDOW;
    e.budget = kt_int(&r, 4, 20);
    e.n_sink = kt_int(&r, 0, 2);
    e.n_recent = e.kind == KVA_EVICT_H2O ? kt_int(&r, 0, 2) : 0;
    e.rollback = kt_int(&r, 0, 2) != 0;
    snprintf(label, sizeof label, "evicted %s %s budget %d sink %d recent %d rollback %d L=%d G=%d D=%d bs=%d",
             kva_dtype_name(dt), e.kind == KVA_EVICT_H2O ? "H2O" : "WINDOW", e.budget, e.n_sink, e.n_recent, e.rollback,
             L, G, D, bs);
    c = tt_cache(&r, L, G, D, D, bs, 2 * tt_cdiv(2 * e.budget + 30, bs) + 8, dt, dt);
    if (!c) continue;
    kt_attn_init(&a, G * kt_int(&r, 1, 2), G, D, 0);
    tt_random_opts(&r, &a, e.budget);
    ok = kva_seq_new(c, &S) == KVA_OK && kva_seq_new(c, &T) == KVA_OK && kva_seq_set_evict(c, S, &e) == KVA_OK &&
         kva_seq_set_evict(c, T, &e) == KVA_OK;
    while (ok && kva_seq_pos(c, S) == kva_seq_len(c, S)) ok = tt_append_both(&r, c, S, c, T, L, G, D, D, kt_int(&r, 1, 6));
    KT_CHECK(ok && kva_seq_pos(c, S) > kva_seq_len(c, S), "%s: setup (pos %d len %d)", label, kva_seq_pos(c, S),
             kva_seq_len(c, S));
    for (round = 0; ok && round < 3; round++) {
      int n = kt_int(&r, 1, 8), k, l, len0, pos0;
      int32_t par[8], keep[8];
      float *kr = KT_ALLOC(float, (size_t)L * n * G * D), *vr = KT_ALLOC(float, (size_t)L * n * G * D);
      float *kk = KT_ALLOC(float, (size_t)n * G * D), *vv = KT_ALLOC(float, (size_t)n * G * D);
      tt_snap s0, s1, t1;
      kva_cache_stats st0, st1;
      tt_tree(&r, par, n, kt_int(&r, 0, TT_KINDS - 1));
      k = tt_random_keep(&r, par, n, n, keep, &l);
      if (k == 0) keep[k++] = kt_int(&r, 0, n - 1); /* the twin's append of nothing would not evict */
      kt_fill(&r, kr, (size_t)L * n * G * D, -1, 1);
      kt_fill(&r, vr, (size_t)L * n * G * D, -2, 2);
      ok = kva_seq_append(c, S, n) == KVA_OK;
      for (l = 0; ok && l < L; l++)
        ok = kva_store(c, S, l, kr + (size_t)l * n * G * D, vr + (size_t)l * n * G * D, n) == KVA_OK;
      KT_CHECK(ok, "%s: tree step", label);
      if (!ok) {
        free(kr), free(vr), free(kk), free(vv);
        break;
      }
      len0 = kva_seq_len(c, S);
      pos0 = kva_seq_pos(c, S);
      tt_snap_take(c, S, L, G, D, D, &s0);
      kva_cache_get_stats(c, &st0);
      if (len0 > n) {
        KT_STATUS(kva_seq_accept(c, S, n + 1, keep, k), KVA_ERR_UNSUPPORTED);
        KT_STATUS(kva_seq_accept(c, S, len0, NULL, 0), KVA_ERR_UNSUPPORTED);
        tt_snap_take(c, S, L, G, D, D, &s1);
        kva_cache_get_stats(c, &st1);
        KT_CHECK(tt_snap_same(&s0, &s1) && kt_stats_equal(&st0, &st1, 0), "%s: a refused accept changed something", label);
        tt_snap_free(&s1);
      }
      KT_STATUS(kva_seq_accept(c, S, n, keep, k), KVA_OK);
      tt_snap_take(c, S, L, G, D, D, &s1);
      KT_CHECK(s1.len == len0 - n + k && s1.pos == pos0 - n + k, "%s: len %d pos %d after accept, want %d %d", label,
               s1.len, s1.pos, len0 - n + k, pos0 - n + k);
      tt_check_accepted(label, &s0, &s1, n, keep, k);
      /* the twin appends only the kept tokens */
      ok = kva_seq_append(c, T, k) == KVA_OK;
      for (l = 0; ok && l < L && k > 0; l++) {
        int j;
        for (j = 0; j < k; j++) {
          memcpy(kk + (size_t)j * G * D, kr + ((size_t)l * n + keep[j]) * G * D, (size_t)G * D * sizeof(float));
          memcpy(vv + (size_t)j * G * D, vr + ((size_t)l * n + keep[j]) * G * D, (size_t)G * D * sizeof(float));
        }
        ok = kva_store(c, T, l, kk, vv, k) == KVA_OK;
      }
      KT_CHECK(ok, "%s: twin step", label);
      if (e.rollback && ok) {
        tt_snap_take(c, T, L, G, D, D, &t1);
        KT_CHECK(tt_snap_same(&s1, &t1),
                 "%s: with rollback the accepted sequence differs from its twin (len %d/%d pos %d/%d)", label, s1.len,
                 t1.len, s1.pos, t1.pos);
        tt_snap_free(&t1);
        tt_decode_both(&r, c, S, c, T, &a, L, kt_int(&r, 1, 3), label);
      } else if (ok) {
        ok = tt_append_both(&r, c, S, c, T, L, G, D, D, kt_int(&r, 1, 3));
      }
      tt_snap_free(&s0);
      tt_snap_free(&s1);
      free(kr), free(vr), free(kk), free(vv);
    }
    KT_CHECK(tt_stats_consistent(c), "%s: stats inconsistent", label);
    kva_cache_destroy(c);
  }
}

void test_tree(void);
void test_tree(void) {
  test_tree_hand();
  test_tree_arrays();
  test_tree_sinks_deep();
  test_tree_cache();
  test_tree_chain();
  test_tree_batch();
  test_tree_args();
  test_tree_gqa();
  test_accept_random();
  test_accept_h2o();
  test_accept_shared();
  test_accept_args();
  test_accept_truncate();
  test_accept_evicted();
  if (getenv("KVA_TEST_VERBOSE"))
    fprintf(stderr, "  tree: worst err/tol: out %.3f, lse %.3f; %ld rows vs reference, %ld bitwise comparisons\n",
            tt_worst_out, tt_worst_lse, tt_rows_checked, tt_bitwise_checked);
}
