/* test_budgets.c - per-layer and per-head eviction budgets: kva_evict.layer_weight
 * (PyramidKV), kva_evict.share_heads (Ada-KV), KVA_POS_EMPTY, kva_pyramid_weights
 * and kva_seq_stats.head_slots_empty.
 *
 * Written from docs/API.md ("Eviction", "Eviction scorers", "Per-layer and
 * per-head budgets", "Block selection", "Batched attention", "Speculative
 * decoding", "Sequence streams", "Statistics") and the public declarations,
 * not from kvattn.h's code.  The rule the shadow (bt_expect) implements, for a
 * SCORE policy with layer_weight or share_heads, at an append of n (ne = n,
 * or 0 with rollback or for kva_seq_compress, whose budget replaces the
 * policy's):
 *   B_l       = floor(budget * layer_weight[l]) (exact product; NULL: budget);
 *   protected = positions < n_sink and >= kva_seq_pos - n_recent;
 *   one head  : a head holding h evicts min(h + ne - B_l, its unprotected)
 *               tokens when that is above 0, the lowest scores first, ties
 *               to the older position;
 *   shared    : a layer whose heads hold H in all evicts
 *               min(H + G ne - G B_l, the layer's unprotected) over all its
 *               heads, lowest score, then older position, then lower head;
 *   if any head evicts, the scorer ran once per layer and KV head (layer 0
 *   first, heads in order) over the head's held tokens only (ascending
 *   positions, rows as kva_seq_read returns them), keep = min(n, B_l - ne)
 *   (not below 0); every head is compacted: slots [0, h') hold its tokens,
 *   [h', max h') are empty (KVA_POS_EMPTY, zero rows), the appended tokens
 *   take the slots after max h' in every head, kva_seq_len = max h' + n;
 *   if none evicts, nothing moves (len + n) and the scorer is not called.
 * Uniform policies (WINDOW, SCORE without either field) follow "Eviction":
 * every head evicts min(len + ne - budget, the fewest unprotected tokens any
 * head holds).  head_slots_empty = L G len - the tokens held.
 *
 *   - bt_pyramid: kva_pyramid_weights against its documented formula (fp64),
 *     mean 1, non-increasing, one layer, the docs' example, argument errors;
 *   - bt_random: random caches (1..4 layers, 1..4 KV heads, 1..3 query heads
 *     per KV head, head_dim 1..40 and v_dim apart, block size 1..16, F32 /
 *     F16 / BF16 / INT8 / INT4 / FP8 keys and values, rotated rows, block
 *     bounds), up to three sequences (forks) under random policies (per-layer
 *     weights above and below 1, share_heads with and without weights,
 *     uniform SCORE and WINDOW before any slot is empty, NONE, n_sink /
 *     n_recent, rollback), random appends (stored whole or in chunks, or by
 *     kva_gqa_forward), kva_seq_compress at random budgets, weights changed
 *     in place, truncation within the step, token trees and kva_seq_accept,
 *     scorer failures (a status, a NaN), tight pools (KVA_ERR_FULL,
 *     kva_seq_fits): after every step every slot is read back and compared
 *     with the shadow (positions, rows bit for bit, empty slots, structure,
 *     len, pos, head_slots_empty, tokens_evicted), every scorer view is
 *     checked; attention (causal, non_causal, window, sinks, softcap, ALiBi,
 *     sink logits, chunks, integer scores and values, block selection,
 *     trees) through kva_attend_cache_lse and kva_attend_batch_lse against
 *     fp64 over the rows read back, empty slots left out
 *     (selection: the documented choice computed here; rows whose k-th and
 *     (k+1)-th bounds are within float rounding are skipped; where a block
 *     holds only empty slots of a head the docs leave its rank open, and
 *     either "never" or "first" is accepted; after a truncate bounds may be
 *     looser, so only the covering-budget check runs);
 *   - bt_args, bt_after_empty: the documented refusals (kind other than
 *     SCORE, share_heads not 0 / 1, weights <= 0 / NaN / Inf, demotion;
 *     after empty slots WINDOW / H2O / uniform SCORE; kva_seq_export), each
 *     leaving the sequence as it was; NONE and other budgets accepted;
 *     weights of 1e-40 and FLT_MAX;
 *   - bt_append_all, bt_fork, bt_full: kva_seq_append_all refusing a
 *     sequence that would evict; a fork reads back as its source (empty
 *     slots too) and both evolve on their own; KVA_ERR_FULL changes nothing,
 *     kva_seq_fits NOW implies the append succeeds;
 *   - bt_len_eq_pos: the fullest head evicted nothing (kva_seq_len ==
 *     kva_seq_pos) while another evicted: attention under window / ALiBi /
 *     chunks, and truncate below the step, accept beyond it and publish are
 *     KVA_ERR_UNSUPPORTED (the sequence has evicted tokens);
 *   - bt_memory: slots = the fullest head's count (PyramidKV's layer 0 at
 *     floor(2B - B/20), Ada-KV's one head taking n_kv_heads B), stats;
 *   - bt_demoted_mix: a demoted region beside empty slots, attention against
 *     fp64 over both. */
#include "kvattn.h"
#include "harness.h"
#include "ref.h"

#include <float.h>
#include <limits.h>

#define BT_MAXL 4
#define BT_MAXG 4
#define BT_MAXH 12
#define BT_MAXD 40
#define BT_MAXCALLS 64

static int bt_verbose(void) {
  const char *s = getenv("KVA_TEST_VERBOSE");
  return s && *s && strcmp(s, "0") != 0;
}

static float bt_nan(void) { return kt_u2f(0x7FC00000u); }

/* the random case running (for failure messages) */
static char bt_case_desc[160];

/* counters for the verbose summary */
static struct {
  long cases, appends, evicting, compresses, fulls, forks, trees, truncs, attn, batch, sel_partial, sel_skipped,
      sel_variant_inf, gqa, fails, pol_refused, zero_heads, iv;
  double worst;
} bt_n;

/* ------------------------------------------------------------------------ */
/* The test scorer: a hash of (position, layer, KV head), with ties, -0,     */
/* -Inf and +Inf on purpose.  cross: the KV head left out, so the heads of a */
/* layer tie with each other (share_heads then breaks ties by head).         */

static uint64_t bt_mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

static float bt_score_of(uint32_t salt, int cross, int32_t p, int l, int g) {
  uint64_t h = bt_mix(((uint64_t)salt << 32) ^ (uint64_t)(uint32_t)p ^ ((uint64_t)(l + 1) << 24) ^
                      (cross ? 0 : ((uint64_t)(g + 1) << 28)));
  unsigned u = (unsigned)(h % 100u);
  if (u < 8) return -INFINITY;
  if (u < 16) return INFINITY;
  if (u < 26) return ((h >> 9) & 1u) ? -0.0f : 0.0f;
  if (u < 56) return (float)((h >> 12) % 4u); /* 0..3: ties */
  return (float)((double)((h >> 20) % 200000u) / 1000.0 - 100.0);
}

/* ------------------------------------------------------------------------ */
/* The shadow: per layer and KV head, the held positions (ascending) and     */
/* each position's rows as read back after its store.                        */

typedef struct {
  int L, G, D, Dv, cap;
  int len, pos, step; /* step: tokens of the open step, 0 when none */
  int loose;          /* bounds may be looser than the held keys (a truncate happened) */
  int *n;             /* [L*G] */
  int32_t *held;      /* [L*G][cap] */
  float *rk, *rv;     /* [L*G][cap][D], [L*G][cap][Dv] */
} bt_shadow;

static void bt_sh_alloc(bt_shadow *s, int L, int G, int D, int Dv, int cap) {
  memset(s, 0, sizeof *s);
  s->L = L, s->G = G, s->D = D, s->Dv = Dv, s->cap = cap;
  s->n = (int *)calloc((size_t)(L * G), sizeof(int));
  s->held = (int32_t *)calloc((size_t)(L * G) * (size_t)cap, sizeof(int32_t));
  s->rk = (float *)calloc((size_t)(L * G) * (size_t)cap * (size_t)D, sizeof(float));
  s->rv = (float *)calloc((size_t)(L * G) * (size_t)cap * (size_t)Dv, sizeof(float));
  if (!s->n || !s->held || !s->rk || !s->rv) abort();
}
static void bt_sh_free(bt_shadow *s) {
  free(s->n), free(s->held), free(s->rk), free(s->rv);
  memset(s, 0, sizeof *s);
}
/* dst (allocated with the same shape) = src */
static void bt_sh_assign(bt_shadow *dst, const bt_shadow *src) {
  size_t lg = (size_t)(src->L * src->G), cap = (size_t)src->cap;
  dst->len = src->len, dst->pos = src->pos, dst->step = src->step, dst->loose = src->loose;
  memcpy(dst->n, src->n, lg * sizeof(int));
  memcpy(dst->held, src->held, lg * cap * sizeof(int32_t));
  memcpy(dst->rk, src->rk, lg * cap * (size_t)src->D * sizeof(float));
  memcpy(dst->rv, src->rv, lg * cap * (size_t)src->Dv * sizeof(float));
}
static int32_t *bt_sh_held(const bt_shadow *s, int l, int g) { return s->held + (size_t)(l * s->G + g) * s->cap; }
static float *bt_sh_k(const bt_shadow *s, int l, int g, int32_t p) {
  return s->rk + ((size_t)(l * s->G + g) * s->cap + (size_t)p) * s->D;
}
static float *bt_sh_v(const bt_shadow *s, int l, int g, int32_t p) {
  return s->rv + ((size_t)(l * s->G + g) * s->cap + (size_t)p) * s->Dv;
}
static long bt_sh_empty(const bt_shadow *s) {
  long e = (long)s->L * s->G * s->len;
  int i;
  for (i = 0; i < s->L * s->G; i++) e -= s->n[i];
  return e;
}
/* n new tokens at the next positions in every head, rows zero */
static void bt_sh_add(bt_shadow *s, int n) {
  int l, g, t;
  for (l = 0; l < s->L; l++)
    for (g = 0; g < s->G; g++) {
      int *cnt = &s->n[l * s->G + g];
      for (t = 0; t < n; t++) {
        int32_t p = s->pos + t;
        bt_sh_held(s, l, g)[(*cnt)++] = p;
        memset(bt_sh_k(s, l, g, p), 0, sizeof(float) * (size_t)s->D);
        memset(bt_sh_v(s, l, g, p), 0, sizeof(float) * (size_t)s->Dv);
      }
    }
  s->pos += n;
}
/* drop the positions >= from from every head (they are the newest) */
static void bt_sh_drop_from(bt_shadow *s, int32_t from) {
  int i;
  for (i = 0; i < s->L * s->G; i++) {
    int32_t *h = s->held + (size_t)i * s->cap;
    while (s->n[i] > 0 && h[s->n[i] - 1] >= from) s->n[i]--;
  }
}

/* ------------------------------------------------------------------------ */
/* Policies                                                                  */

typedef struct {
  int kind, budget, n_sink, n_recent, rollback;
  const float *w; /* layer_weight (the case's array, read at every eviction) */
  int share;
} bt_pol;

static int bt_uneven(const bt_pol *p) { return p->kind == KVA_EVICT_SCORE && (p->w || p->share); }

typedef struct bt_user bt_user;
static kva_status bt_scorer(void *user, const kva_score_view *vw, float *scores);

static kva_evict bt_evict_of(const bt_pol *p, bt_user *u) {
  kva_evict e;
  memset(&e, 0, sizeof e);
  e.kind = p->kind;
  if (p->kind == KVA_EVICT_NONE) return e;
  e.budget = p->budget, e.n_sink = p->n_sink, e.rollback = p->rollback;
  if (p->kind != KVA_EVICT_WINDOW) e.n_recent = p->n_recent;
  if (p->kind == KVA_EVICT_SCORE) {
    e.score = bt_scorer, e.score_user = u;
    e.layer_weight = p->w, e.share_heads = p->share;
  }
  return e;
}

/* ------------------------------------------------------------------------ */
/* The scorer, checking every view against the shadow of the state before    */
/* the call.                                                                 */

typedef struct {
  int l, g, n, keep;
} bt_call;

struct bt_user {
  const bt_shadow *pre; /* NULL: views not checked */
  int seq;
  uint32_t salt;
  int cross;
  int fail_call, fail_nan, fail_slot; /* fail_call -1: none */
  kva_status fail_status;
  int ncalls;
  bt_call calls[BT_MAXCALLS];
  int bad;
  char why[240];
};

static void bt_user_reset(bt_user *u, const bt_shadow *pre, int seq) {
  u->pre = pre, u->seq = seq, u->ncalls = 0, u->bad = 0, u->why[0] = 0, u->fail_call = -1;
}

static kva_status bt_scorer(void *user, const kva_score_view *vw, float *scores) {
  bt_user *u = (bt_user *)user;
  int k = u->ncalls++, i;
  bt_n.zero_heads += vw->n == 0;
  if (k < BT_MAXCALLS) {
    u->calls[k].l = vw->layer, u->calls[k].g = vw->kv_head, u->calls[k].n = vw->n, u->calls[k].keep = vw->keep;
  }
  if (u->pre && !u->bad) {
    const bt_shadow *s = u->pre;
    if (vw->seq != u->seq || vw->n_layers != s->L || vw->n_kv_heads != s->G || vw->head_dim != s->D ||
        vw->v_dim != s->Dv || vw->layer < 0 || vw->layer >= s->L || vw->kv_head < 0 || vw->kv_head >= s->G ||
        vw->attn_sum != NULL) {
      u->bad = 1;
      snprintf(u->why, sizeof u->why, "call %d: view fields seq %d/%d L %d G %d D %d Dv %d layer %d head %d attn_sum %p",
               k, vw->seq, u->seq, vw->n_layers, vw->n_kv_heads, vw->head_dim, vw->v_dim, vw->layer, vw->kv_head,
               (const void *)vw->attn_sum);
    } else {
      int n = s->n[vw->layer * s->G + vw->kv_head];
      const int32_t *h = bt_sh_held(s, vw->layer, vw->kv_head);
      if (vw->n != n) {
        u->bad = 1;
        snprintf(u->why, sizeof u->why, "call %d (layer %d head %d): view n %d, the head holds %d", k, vw->layer,
                 vw->kv_head, vw->n, n);
      }
      for (i = 0; !u->bad && i < n; i++) {
        if (vw->pos[i] != h[i]) {
          u->bad = 1;
          snprintf(u->why, sizeof u->why, "call %d (layer %d head %d): view pos[%d] = %ld, held %ld", k, vw->layer,
                   vw->kv_head, i, (long)vw->pos[i], (long)h[i]);
        } else if (memcmp(vw->k + (size_t)i * s->D, bt_sh_k(s, vw->layer, vw->kv_head, h[i]),
                          sizeof(float) * (size_t)s->D) != 0 ||
                   memcmp(vw->v + (size_t)i * s->Dv, bt_sh_v(s, vw->layer, vw->kv_head, h[i]),
                          sizeof(float) * (size_t)s->Dv) != 0) {
          u->bad = 1;
          snprintf(u->why, sizeof u->why, "call %d (layer %d head %d): view rows of position %ld are not read back's",
                   k, vw->layer, vw->kv_head, (long)h[i]);
        }
      }
    }
  }
  for (i = 0; i < vw->n; i++) scores[i] = bt_score_of(u->salt, u->cross, vw->pos[i], vw->layer, vw->kv_head);
  if (k == u->fail_call) {
    if (!u->fail_nan) return u->fail_status;
    if (vw->n > 0) scores[u->fail_slot % vw->n] = bt_nan();
  }
  return KVA_OK;
}

/* ------------------------------------------------------------------------ */
/* The rule (the docs' "Eviction" and "Per-layer and per-head budgets").     */

typedef struct {
  float sc;
  int32_t p;
  int g;
} bt_cand;

static int bt_cand_cmp(const void *a, const void *b) {
  const bt_cand *x = (const bt_cand *)a, *y = (const bt_cand *)b;
  if (x->sc < y->sc) return -1;
  if (x->sc > y->sc) return 1;
  if (x->p != y->p) return x->p < y->p ? -1 : 1;
  return x->g - y->g;
}

/* remove position p from head (l, g) */
static void bt_sh_remove(bt_shadow *s, int l, int g, int32_t p) {
  int32_t *h = bt_sh_held(s, l, g);
  int *n = &s->n[l * s->G + g], i, j;
  for (i = 0; i < *n && h[i] != p; i++) {
  }
  if (i == *n) abort();
  for (j = i; j + 1 < *n; j++) h[j] = h[j + 1];
  (*n)--;
}

/* B_l: floor(budget * w[l]) with the exact product (as a double) */
static double bt_layer_budget(const bt_pol *p, int budget, int l) {
  if (!p->w) return (double)budget;
  return floor((double)budget * (double)p->w[l]);
}

/* Evicts in s (held sets only; len, pos untouched) what policy p evicts at an
   append of n_app (cbudget 0), or at kva_seq_compress(cbudget).  Writes the
   scorer calls expected, *maxh the fullest head's count afterwards; returns
   1 when some head evicts. */
static int bt_expect(bt_shadow *s, const bt_pol *p, int n_app, int cbudget, uint32_t salt, int cross, bt_call *calls,
                     int *ncalls, int *maxh) {
  int L = s->L, G = s->G, l, g, i, any = 0;
  int budget = cbudget > 0 ? cbudget : p->budget;
  int ne = (cbudget > 0 || p->rollback) ? 0 : n_app;
  int32_t pos0 = s->pos;
  bt_cand *cand = KT_ALLOC(bt_cand, (size_t)(G * s->cap + 1));
  *ncalls = 0;
  *maxh = 0;
  if (p->kind == KVA_EVICT_NONE) {
    free(cand);
    return 0;
  }
#define BT_PROT(pp) ((pp) < p->n_sink || (p->kind != KVA_EVICT_WINDOW && (pp) >= pos0 - p->n_recent))
  if (!bt_uneven(p)) {
    int e = s->len + ne - budget, minev = INT_MAX;
    for (l = 0; l < L; l++)
      for (g = 0; g < G; g++) {
        int ev = 0;
        const int32_t *h = bt_sh_held(s, l, g);
        for (i = 0; i < s->n[l * G + g]; i++) ev += !BT_PROT(h[i]);
        if (ev < minev) minev = ev;
      }
    if (e > minev) e = minev;
    if (e <= 0) {
      free(cand);
      return 0;
    }
    for (l = 0; l < L; l++)
      for (g = 0; g < G; g++) {
        const int32_t *h = bt_sh_held(s, l, g);
        int nc = 0, hn = s->n[l * G + g];
        for (i = 0; i < hn; i++)
          if (!BT_PROT(h[i])) {
            cand[nc].sc = p->kind == KVA_EVICT_SCORE ? bt_score_of(salt, cross, h[i], l, g) : 0.0f;
            cand[nc].p = h[i], cand[nc].g = g, nc++;
          }
        qsort(cand, (size_t)nc, sizeof *cand, bt_cand_cmp);
        if (p->kind == KVA_EVICT_SCORE && *ncalls < BT_MAXCALLS) {
          calls[*ncalls].l = l, calls[*ncalls].g = g, calls[*ncalls].n = hn, calls[*ncalls].keep = hn - e;
          (*ncalls)++;
        }
        for (i = 0; i < e; i++) bt_sh_remove(s, l, g, cand[i].p);
      }
    *maxh = s->len - e;
    free(cand);
    return 1;
  }
  {
    int pre_n[BT_MAXL * BT_MAXG];
    double keepd[BT_MAXL * BT_MAXG];
    memcpy(pre_n, s->n, sizeof(int) * (size_t)(L * G));
    for (l = 0; l < L; l++) {
      double B = bt_layer_budget(p, budget, l);
      int nc = 0;
      double Hs = 0.0, evs = 0.0;
      for (g = 0; g < G; g++) {
        const int32_t *h = bt_sh_held(s, l, g);
        int hn = s->n[l * G + g], ev = 0, base = nc;
        double e;
        keepd[l * G + g] = fmin((double)hn, fmax(0.0, B - ne));
        for (i = 0; i < hn; i++)
          if (!BT_PROT(h[i])) {
            cand[nc].sc = bt_score_of(salt, cross, h[i], l, g);
            cand[nc].p = h[i], cand[nc].g = g, nc++, ev++;
          }
        Hs += hn, evs += ev;
        if (p->share) continue;
        e = (double)hn + ne - B;
        if (e > ev) e = ev;
        if (e <= 0) continue;
        qsort(cand + base, (size_t)ev, sizeof *cand, bt_cand_cmp);
        for (i = 0; i < (int)e; i++) bt_sh_remove(s, l, g, cand[base + i].p);
        any = 1;
      }
      if (p->share) {
        double E = Hs + (double)G * ne - (double)G * B;
        if (E > evs) E = evs;
        if (E > 0) {
          qsort(cand, (size_t)nc, sizeof *cand, bt_cand_cmp);
          for (i = 0; i < (int)E; i++) bt_sh_remove(s, l, cand[i].g, cand[i].p);
          any = 1;
        }
      }
    }
    if (any)
      for (l = 0; l < L; l++)
        for (g = 0; g < G; g++) {
          if (*ncalls < BT_MAXCALLS) {
            calls[*ncalls].l = l, calls[*ncalls].g = g, calls[*ncalls].n = pre_n[l * G + g];
            calls[*ncalls].keep = (int)keepd[l * G + g];
            (*ncalls)++;
          }
          if (s->n[l * G + g] > *maxh) *maxh = s->n[l * G + g];
        }
  }
#undef BT_PROT
  free(cand);
  return any;
}

/* The calls the scorer saw against the expected ones; "" when they agree. */
static void bt_calls_diff(const bt_user *u, const bt_call *want, int nwant, char *msg, size_t cap) {
  int i;
  msg[0] = 0;
  if (u->bad) {
    snprintf(msg, cap, "%s", u->why);
    return;
  }
  if (u->ncalls != nwant) {
    snprintf(msg, cap, "the scorer ran %d times, expected %d", u->ncalls, nwant);
    return;
  }
  for (i = 0; i < nwant && i < BT_MAXCALLS; i++)
    if (u->calls[i].l != want[i].l || u->calls[i].g != want[i].g || u->calls[i].n != want[i].n ||
        u->calls[i].keep != want[i].keep) {
      snprintf(msg, cap, "call %d: layer %d head %d n %d keep %d, expected layer %d head %d n %d keep %d", i,
               u->calls[i].l, u->calls[i].g, u->calls[i].n, u->calls[i].keep, want[i].l, want[i].g, want[i].n,
               want[i].keep);
      return;
    }
}

/* ------------------------------------------------------------------------ */
/* Reading the cache back                                                    */

/* Every slot of seq against s.  n_app: the op appended that many tokens (they
   take the last slots, at the next positions in order); evicted: some head
   evicted in it (each head's tokens first, then its empty slots).  One check;
   returns 1 when everything agrees. */
static int bt_verify(kva_cache *c, int seq, const bt_shadow *s, int evicted, int n_app, long demoted,
                     const char *what) {
  int L = s->L, G = s->G, D = s->D, Dv = s->Dv, l, slot, g, i;
  int len = kva_seq_len(c, seq), pos = kva_seq_pos(c, seq);
  char msg[320];
  msg[0] = 0;
  if (len != s->len || pos != s->pos) {
    snprintf(msg, sizeof msg, "len %d pos %d, expected len %d pos %d", len, pos, s->len, s->pos);
  } else {
    float *k = KT_ALLOC(float, G * D), *v = KT_ALLOC(float, G * Dv);
    int32_t pp[BT_MAXG];
    unsigned char *mark = (unsigned char *)calloc((size_t)(L * G) * (size_t)s->cap, 1); /* 1 held, 2 seen */
    kva_seq_stats st;
    if (!mark) abort();
    for (l = 0; l < L; l++)
      for (g = 0; g < G; g++)
        for (i = 0; i < s->n[l * G + g]; i++) mark[(size_t)(l * G + g) * s->cap + bt_sh_held(s, l, g)[i]] = 1;
    for (l = 0; l < L && !msg[0]; l++)
      for (slot = 0; slot < len && !msg[0]; slot++) {
        kva_status rs = kva_seq_read(c, seq, l, slot, k, v, pp);
        if (rs != KVA_OK) {
          snprintf(msg, sizeof msg, "kva_seq_read(layer %d, slot %d) = %d", l, slot, (int)rs);
          break;
        }
        for (g = 0; g < G && !msg[0]; g++) {
          int32_t p = pp[g];
          const float *kg = k + (size_t)g * D, *vg = v + (size_t)g * Dv;
          int tokens = s->n[l * G + g] - n_app; /* the head's count before the appended ones */
          unsigned char *m;
          if (p == KVA_POS_EMPTY) {
            for (i = 0; i < D && !msg[0]; i++)
              if (kg[i] != 0.0f) snprintf(msg, sizeof msg, "layer %d slot %d head %d: empty, K[%d] = %g", l, slot, g, i, (double)kg[i]);
            for (i = 0; i < Dv && !msg[0]; i++)
              if (vg[i] != 0.0f) snprintf(msg, sizeof msg, "layer %d slot %d head %d: empty, V[%d] = %g", l, slot, g, i, (double)vg[i]);
            if (!msg[0] && ((evicted && slot < tokens) || slot >= len - n_app))
              snprintf(msg, sizeof msg, "layer %d head %d: slot %d empty (the head holds %d tokens, %d appended, len %d)",
                       l, g, slot, tokens, n_app, len);
            continue;
          }
          if (p < 0 || p >= s->pos) {
            snprintf(msg, sizeof msg, "layer %d slot %d head %d: position %ld out of range", l, slot, g, (long)p);
            break;
          }
          m = &mark[(size_t)(l * G + g) * s->cap + p];
          if (*m == 0) {
            snprintf(msg, sizeof msg, "layer %d slot %d head %d: position %ld is not held (shadow holds %d)", l, slot, g,
                     (long)p, s->n[l * G + g]);
            break;
          }
          if (*m == 2) {
            snprintf(msg, sizeof msg, "layer %d slot %d head %d: position %ld twice", l, slot, g, (long)p);
            break;
          }
          *m = 2;
          if (memcmp(kg, bt_sh_k(s, l, g, p), sizeof(float) * (size_t)D) != 0 ||
              memcmp(vg, bt_sh_v(s, l, g, p), sizeof(float) * (size_t)Dv) != 0)
            snprintf(msg, sizeof msg, "layer %d slot %d head %d: rows of position %ld changed", l, slot, g, (long)p);
          else if (evicted && slot >= tokens && slot < len - n_app)
            snprintf(msg, sizeof msg, "layer %d head %d: slot %d holds %ld above the head's %d tokens (len %d, %d appended)",
                     l, g, slot, (long)p, tokens, len, n_app);
          else if (slot >= len - n_app && p != s->pos - n_app + (slot - (len - n_app)))
            snprintf(msg, sizeof msg, "layer %d head %d: appended slot %d holds position %ld, expected %ld", l, g, slot,
                     (long)p, (long)(s->pos - n_app + (slot - (len - n_app))));
        }
      }
    for (l = 0; l < L && !msg[0]; l++)
      for (g = 0; g < G && !msg[0]; g++)
        for (i = 0; i < s->n[l * G + g]; i++)
          if (mark[(size_t)(l * G + g) * s->cap + bt_sh_held(s, l, g)[i]] != 2) {
            snprintf(msg, sizeof msg, "layer %d head %d: position %ld missing (the shadow holds %d)", l, g,
                     (long)bt_sh_held(s, l, g)[i], s->n[l * G + g]);
            break;
          }
    if (!msg[0]) {
      if (kva_seq_get_stats(c, seq, &st) != KVA_OK)
        snprintf(msg, sizeof msg, "kva_seq_get_stats failed");
      else if (st.head_slots_empty != bt_sh_empty(s) || st.tokens != len || st.tokens_demoted != demoted ||
               st.tokens_evicted != (long)pos - len - demoted)
        snprintf(msg, sizeof msg, "stats: head_slots_empty %ld (expected %ld), tokens %ld (len %d), evicted %ld (expected %ld)",
                 st.head_slots_empty, bt_sh_empty(s), st.tokens, len, st.tokens_evicted, (long)pos - len - demoted);
    }
    free(k), free(v), free(mark);
  }
  KT_CHECK(!msg[0], "%s: %s", what, msg);
  return !msg[0];
}

/* After a store of the step in layer l: its slots' rows into the shadow. */
static int bt_record_step(kva_cache *c, int seq, bt_shadow *s, int l) {
  int n = s->step, t, g, ok = 1;
  float *k = KT_ALLOC(float, s->G * s->D), *v = KT_ALLOC(float, s->G * s->Dv);
  int32_t pp[BT_MAXG];
  for (t = 0; t < n; t++) {
    int slot = s->len - n + t;
    if (kva_seq_read(c, seq, l, slot, k, v, pp) != KVA_OK) ok = 0;
    for (g = 0; g < s->G; g++) {
      int32_t p = s->pos - n + t;
      if (pp[g] != p) {
        ok = 0;
        continue;
      }
      memcpy(bt_sh_k(s, l, g, p), k + (size_t)g * s->D, sizeof(float) * (size_t)s->D);
      memcpy(bt_sh_v(s, l, g, p), v + (size_t)g * s->Dv, sizeof(float) * (size_t)s->Dv);
    }
  }
  free(k), free(v);
  KT_CHECK(ok, "layer %d: the step's slots %d..%d do not read back positions %d.. in every head", l, s->len - n,
           s->len - 1, s->pos - n);
  return ok;
}

/* random rows: uniform in [-amp, amp], sometimes one outlier channel */
static void bt_rows(kt_rng *r, float *x, int rows, int width, float amp) {
  int i;
  kt_fill(r, x, (size_t)rows * (size_t)width, -amp, amp);
  if (width > 2 && kt_int(r, 0, 3) == 0) {
    int ch = kt_int(r, 0, width - 1);
    for (i = 0; i < rows; i++) x[(size_t)i * width + ch] *= 6.0f;
  }
}

/* Stores the step's tokens of layer l (whole, or in two chunks in either
   order), then records what reads back. */
static void bt_store_layer(kva_cache *c, int seq, bt_shadow *s, int l, kt_rng *r, float amp) {
  int n = s->step, G = s->G, D = s->D, Dv = s->Dv;
  float *k = KT_ALLOC(float, n * G * D), *v = KT_ALLOC(float, n * G * Dv);
  kva_status st;
  bt_rows(r, k, n * G, D, amp);
  bt_rows(r, v, n * G, Dv, amp);
  if (n >= 2 && kt_int(r, 0, 2) == 0) {
    int m = kt_int(r, 1, n - 1);
    st = kva_store_at(c, seq, l, m, k + (size_t)m * G * D, v + (size_t)m * G * Dv, n - m);
    if (st == KVA_OK) st = kva_store_at(c, seq, l, 0, k, v, m);
  } else {
    st = kva_store(c, seq, l, k, v, n);
  }
  KT_STATUS(st, KVA_OK);
  bt_record_step(c, seq, s, l);
  free(k), free(v);
}

/* One layer of a sequence as read back: p [len][G], k [len][G][D], v [len][G][Dv]. */
typedef struct {
  int G, D, Dv, len;
  int32_t *p;
  float *k, *v;
} bt_snap;

static void bt_snap_take(bt_snap *sn, kva_cache *c, int seq, int l, int G, int D, int Dv) {
  int j;
  sn->G = G, sn->D = D, sn->Dv = Dv, sn->len = kva_seq_len(c, seq);
  sn->p = KT_ALLOC(int32_t, (size_t)(sn->len > 0 ? sn->len : 1) * G);
  sn->k = KT_ALLOC(float, (size_t)(sn->len > 0 ? sn->len : 1) * G * D);
  sn->v = KT_ALLOC(float, (size_t)(sn->len > 0 ? sn->len : 1) * G * Dv);
  for (j = 0; j < sn->len; j++)
    if (kva_seq_read(c, seq, l, j, sn->k + (size_t)j * G * D, sn->v + (size_t)j * G * Dv, sn->p + (size_t)j * G) !=
        KVA_OK)
      abort();
}
static void bt_snap_free(bt_snap *sn) { free(sn->p), free(sn->k), free(sn->v); }

/* ------------------------------------------------------------------------ */
/* The fp64 reference over the held rows (empty slots left out).             */

typedef struct {
  const bt_snap *s;
  const kva_attn *a;
  const double *q;  /* [n_q][H][D]: the queries the scores use (int_scores: code * scale) */
  int n_q, pos_next;
  const int32_t *tree; /* NULL, or the step's draft tree (n_q = the step) */
  kva_dtype vdt;       /* int_values over INT8 / INT4 values: their bound in vb; else DEFAULT */
  const unsigned char *sel; /* NULL, or [n_q][G][len]: the slots each row may read */
} bt_ref_in;

static int bt_is_anc(const int32_t *tree, int j, int i) {
  while (i >= 0) {
    if (i == j) return 1;
    i = tree[i];
  }
  return 0;
}

static void bt_ref(const bt_ref_in *in, double *out, double *lse, double *vb) {
  const bt_snap *s = in->s;
  ref_attn_cfg cfg = ref_cfg(in->a);
  int H = cfg.H, G = cfg.G, D = cfg.D, Dv = cfg.Dv, grp = H / G, len = s->len, n_q = in->n_q, i, h, j, d, e;
  int32_t base = in->pos_next - n_q, depth[64];
  double *sc = KT_ALLOC(double, len + 1);
  int *idx = KT_ALLOC(int, len + 1);
  if (in->tree)
    for (i = 0; i < n_q; i++) depth[i] = in->tree[i] < 0 ? 0 : depth[in->tree[i]] + 1;
  for (i = 0; i < n_q; i++) {
    int32_t qp = in->tree ? base + depth[i] : in->pos_next - n_q + i;
    for (h = 0; h < H; h++) {
      int g = h / grp, nv = 0;
      double slope = ref_alibi_slope(&cfg, h), m = -INFINITY, sum = 0.0;
      const double *qh = in->q + ((size_t)i * H + h) * D;
      double *o = out + ((size_t)i * H + h) * Dv;
      for (d = 0; d < Dv; d++) o[d] = 0.0;
      if (vb)
        for (d = 0; d < Dv; d++) vb[((size_t)i * H + h) * Dv + d] = 0.0;
      for (j = 0; j < len; j++) {
        int32_t kp = s->p[(size_t)j * G + g], ekp = kp;
        const float *kj = s->k + ((size_t)j * G + g) * D;
        double x = 0.0;
        if (kp == KVA_POS_EMPTY) continue;
        if (in->sel && !in->sel[((size_t)i * G + g) * len + j]) continue;
        if (in->tree && kp >= base) {
          int tj = kp - base;
          if (!bt_is_anc(in->tree, tj, i)) continue;
          ekp = base + depth[tj];
        }
        if (!ref_visible(&cfg, qp, ekp)) continue;
        for (d = 0; d < D; d++) x += qh[d] * (double)kj[d];
        x *= cfg.scale;
        if (cfg.softcap > 0.0) x = cfg.softcap * tanh(x / cfg.softcap);
        x -= slope * fabs((double)qp - (double)ekp);
        sc[nv] = x, idx[nv++] = j;
        if (x > m) m = x;
      }
      if (!nv && !cfg.sink_logits) {
        lse[(size_t)i * H + h] = -INFINITY;
        continue;
      }
      if (cfg.sink_logits) {
        if ((double)cfg.sink_logits[h] > m) m = (double)cfg.sink_logits[h];
        sum += exp((double)cfg.sink_logits[h] - m);
      }
      for (e = 0; e < nv; e++) sum += sc[e] = exp(sc[e] - m);
      for (e = 0; e < nv; e++) {
        const float *vj = s->v + ((size_t)idx[e] * G + g) * Dv;
        for (d = 0; d < Dv; d++) o[d] += sc[e] / sum * (double)vj[d];
      }
      lse[(size_t)i * H + h] = m + log(sum);
      if (vb && nv && (in->vdt == KVA_INT8 || in->vdt == KVA_INT4)) {
        /* docs "Integer values": each key's weight moves by at most W / 510 of its tile's
           largest, times its code; W over all the row's keys bounds every tile's */
        double *b = vb + ((size_t)i * H + h) * Dv;
        int g0, g1;
        for (g0 = 0; g0 < Dv; g0 = g1) {
          double W = 0.0;
          g1 = in->vdt == KVA_INT8 ? Dv : (g0 + 32 < Dv ? g0 + 32 : Dv);
          for (e = 0; e < nv; e++) {
            const float *vj = s->v + ((size_t)idx[e] * G + g) * Dv;
            double lo = INFINITY, hi = -INFINITY, t;
            for (d = g0; d < g1; d++) {
              lo = fmin(lo, (double)vj[d]), hi = fmax(hi, (double)vj[d]);
            }
            t = in->vdt == KVA_INT8 ? fmax(fabs(lo), fabs(hi)) / 127.0 : (hi - lo) / 15.0;
            W = fmax(W, sc[e] / sum * t);
          }
          for (e = 0; e < nv; e++) {
            const float *vj = s->v + ((size_t)idx[e] * G + g) * Dv;
            double lo = INFINITY, hi = -INFINITY, t;
            for (d = g0; d < g1; d++) lo = fmin(lo, (double)vj[d]), hi = fmax(hi, (double)vj[d]);
            t = in->vdt == KVA_INT8 ? fmax(fabs(lo), fabs(hi)) / 127.0 : (hi - lo) / 15.0;
            if (t <= 0.0) continue;
            for (d = g0; d < g1; d++)
              b[d] += W / 510.0 * (in->vdt == KVA_INT8 ? fabs((double)vj[d]) / t : ((double)vj[d] - lo) / t);
          }
        }
      }
    }
  }
  free(sc), free(idx);
}

/* worst error / tolerance of (out, lse) against the reference; msg gets the
   first failure.  skip [n_q][G] (NULL: none): rows not compared. */
static double bt_cmp(const float *out, const float *lse, const double *wo, const double *wl, const double *vb, int n_q,
                     int H, int G, int Dv, int D, double vmax, const unsigned char *skip, char *msg, size_t cap) {
  int i, h, d, grp = H / G;
  double worst = 0.0, tolo = fmax(2e-5, 4e-6 * (1.0 + sqrt((double)D))) * (1.0 + vmax);
  if (msg) msg[0] = 0;
  for (i = 0; i < n_q; i++)
    for (h = 0; h < H; h++) {
      size_t r = (size_t)i * H + h;
      double gl = (double)lse[r], w = wl[r], q;
      if (skip && skip[(size_t)i * G + h / grp]) continue;
      if (w == -INFINITY || gl == -INFINITY)
        q = (gl == w) ? 0.0 : INFINITY;
      else
        q = fabs(gl - w) / (5e-5 * (1.0 + fabs(w)));
      if (!(q <= 1.0) && msg && !msg[0])
        snprintf(msg, cap, "row %d head %d: lse %.9g, fp64 %.9g", i, h, gl, w);
      if (!(q <= worst)) worst = q != q ? INFINITY : q;
      for (d = 0; d < Dv; d++) {
        double t = tolo + (vb ? 1.001 * vb[r * Dv + d] : 0.0), e = fabs((double)out[r * Dv + d] - wo[r * Dv + d]) / t;
        if (!(e <= 1.0) && msg && !msg[0])
          snprintf(msg, cap, "row %d head %d ch %d: out %.9g, fp64 %.9g (tol %.3g)", i, h, d, (double)out[r * Dv + d],
                   wo[r * Dv + d], t);
        if (!(e <= worst)) worst = e != e ? INFINITY : e;
      }
    }
  return worst;
}

/* F16 at or below / at or above x */
static double bt_f16_down(float x) {
  uint16_t h = ref_f32_to_f16(x);
  double v = ref_f16_to_f64(h);
  if (v <= (double)x) return v;
  h = (h & 0x8000u) ? (uint16_t)(h + 1u) : (h == 0 ? (uint16_t)0x8001u : (uint16_t)(h - 1u));
  return ref_f16_to_f64(h);
}
static double bt_f16_up(float x) { return -bt_f16_down(-x); }

/* The documented block choice (docs "Block selection", every block seen: the
   callers use no window or chunks) for each query row i and KV head g, as a
   slot mask sel [n_q][G][len].  variant: how a block holding no token of head
   g ranks (0: last, 1: first; the docs leave it open).  amb [n_q][G]: the
   k-th and (k+1)-th bounds too close to call.  Returns 1 when the choice of
   some row met a block without tokens that the variant decides. */
static int bt_sel_mask(const bt_snap *s, const kva_attn *a, const float *q, int n_q, int bs, int variant,
                       unsigned char *sel, unsigned char *amb) {
  int G = s->G, D = s->D, H = a->n_heads, grp = H / G, len = s->len, nblk = (len + bs - 1) / bs, B = a->select_budget;
  int i, g, b, c, j, met = 0;
  double *lo = KT_ALLOC(double, (size_t)nblk * G * D), *hi = KT_ALLOC(double, (size_t)nblk * G * D);
  unsigned char *has = (unsigned char *)calloc((size_t)nblk * G, 1);
  double *bound = KT_ALLOC(double, nblk), *mag = KT_ALLOC(double, nblk);
  int *order = KT_ALLOC(int, nblk);
  if (!has) abort();
  for (b = 0; b < nblk; b++)
    for (g = 0; g < G; g++) {
      double *l0 = lo + ((size_t)b * G + g) * D, *h0 = hi + ((size_t)b * G + g) * D;
      for (c = 0; c < D; c++) l0[c] = INFINITY, h0[c] = -INFINITY;
      for (j = b * bs; j < (b + 1) * bs && j < len; j++) {
        const float *kj = s->k + ((size_t)j * G + g) * D;
        if (s->p[(size_t)j * G + g] == KVA_POS_EMPTY) continue;
        has[b * G + g] = 1;
        for (c = 0; c < D; c++) {
          l0[c] = fmin(l0[c], bt_f16_down(kj[c]));
          h0[c] = fmax(h0[c], bt_f16_up(kj[c]));
        }
      }
    }
  for (i = 0; i < n_q; i++) {
    int slot = len - n_q + i, n = a->non_causal ? len : slot + 1;
    for (g = 0; g < G; g++) {
      unsigned char *m = sel + ((size_t)i * G + g) * len;
      int nb, s0, r, T = 0, k, mid, t;
      amb[i * G + g] = 0;
      if (n <= B) {
        memset(m, 1, (size_t)len);
        continue;
      }
      memset(m, 0, (size_t)len);
      nb = (n + bs - 1) / bs;
      s0 = (a->select_sink + bs - 1) / bs;
      if (s0 > nb) s0 = nb;
      r = a->select_recent == 0 ? nb : (a->select_recent >= n ? 0 : (n - a->select_recent) / bs);
      if (r < s0) r = s0;
      for (b = 0; b < nb; b++)
        if (b < s0 || b >= r) {
          T += b == nb - 1 ? n - (nb - 1) * bs : bs;
          for (j = b * bs; j < (b + 1) * bs && j < len; j++) m[j] = 1;
        }
      k = B - T > 0 ? (B - T) / bs : 0;
      mid = r - s0;
      for (b = s0; b < r; b++) {
        int h;
        const double *l0 = lo + ((size_t)b * G + g) * D, *h0 = hi + ((size_t)b * G + g) * D;
        bound[b - s0] = -INFINITY, mag[b - s0] = 0.0;
        if (!has[b * G + g]) {
          bound[b - s0] = variant ? INFINITY : -INFINITY;
          continue;
        }
        for (h = g * grp; h < (g + 1) * grp; h++) {
          const float *qh = q + ((size_t)i * H + h) * D;
          double x = 0.0, mg = 0.0;
          for (c = 0; c < D; c++) {
            x += fmax((double)qh[c] * l0[c], (double)qh[c] * h0[c]);
            mg += fabs((double)qh[c]) * fmax(fabs(l0[c]), fabs(h0[c]));
          }
          if (x > bound[b - s0]) bound[b - s0] = x;
          if (mg > mag[b - s0]) mag[b - s0] = mg;
        }
      }
      for (t = 0; t < mid; t++) order[t] = t;
      /* by bound, larger first, the earlier block between equal ones (insertion sort: stable) */
      for (t = 1; t < mid; t++) {
        int o = order[t], u = t;
        while (u > 0 && bound[order[u - 1]] < bound[o]) order[u] = order[u - 1], u--;
        order[u] = o;
      }
      if (k > 0 && k < mid) {
        double x = bound[order[k - 1]], y = bound[order[k]], mg = fmax(mag[order[k - 1]], mag[order[k]]);
        int ex = !has[(s0 + order[k - 1]) * G + g], ey = !has[(s0 + order[k]) * G + g];
        if (ex || ey) met = 1;
        if (!ex && !ey && fabs(x - y) <= 2e-5 * mg + 1e-6) amb[i * G + g] = 1;
        for (t = 0; t < mid; t++)
          if (!has[(s0 + t) * G + g]) met = 1;
      }
      for (t = 0; t < k && t < mid; t++) {
        b = s0 + order[t];
        for (j = b * bs; j < (b + 1) * bs && j < len; j++) m[j] = 1;
      }
    }
  }
  free(lo), free(hi), free(has), free(bound), free(mag), free(order);
  return met;
}

/* ------------------------------------------------------------------------ */
/* Attention checks                                                          */

typedef struct {
  kva_cache *c;
  int L, G, H, D, Dv, bs;
  kva_dtype kt, vt;
  int rotate, bounds;
  kt_rng *r;
  float sinks[BT_MAXH];
} bt_env;

static int bt_is_int(kva_dtype t) { return t == KVA_INT8 || t == KVA_INT4; }

/* A random kva_attn for a query of a sequence of len slots. tree: no
   non_causal, no selection; sel: block selection allowed. */
static void bt_rand_attn(bt_env *e, kva_attn *a, int len, int tree, int sel) {
  kt_rng *r = e->r;
  int i;
  kt_attn_init(a, e->H, e->G, e->D, e->Dv == e->D && kt_int(r, 0, 1) ? 0 : e->Dv);
  a->n_threads = kt_int(r, 0, 2);
  if (kt_int(r, 0, 3) == 0) a->scale = kt_uniform(r, 0.1f, 0.6f);
  if (kt_int(r, 0, 3) == 0) a->softcap = kt_uniform(r, 1.0f, 6.0f);
  if (kt_int(r, 0, 5) == 0) a->alibi_max_bias = kt_uniform(r, 0.5f, 8.0f);
  if (kt_int(r, 0, 5) == 0) {
    for (i = 0; i < e->H; i++) e->sinks[i] = kt_uniform(r, -2.0f, 2.0f);
    a->sink_logits = e->sinks;
  }
  if (!tree && kt_int(r, 0, 6) == 0) a->non_causal = 1;
  if (bt_is_int(e->kt) && !(e->rotate & KVA_ROTATE_K) && kt_int(r, 0, 3) == 0) a->int_scores = 1;
  if (bt_is_int(e->vt) && !(e->rotate & KVA_ROTATE_V) && kt_int(r, 0, 2) == 0) a->int_values = 1;
  if (sel && e->bounds && !tree && kt_int(r, 0, 1) == 0) {
    a->select_budget = kt_int(r, 1, len + 4);
    a->select_sink = kt_int(r, 0, 1) ? 0 : kt_int(r, 0, 2 * e->bs);
    a->select_recent = kt_int(r, 0, 1) ? 0 : kt_int(r, 0, 2 * e->bs);
    return; /* no window or chunks with selection (every block is then seen) */
  }
  if (kt_int(r, 0, 3) == 0) {
    a->window = kt_int(r, 1, len + 2);
    a->n_sink = kt_int(r, 0, 3);
  }
  if (kt_int(r, 0, 7) == 0) a->chunk_size = kt_int(r, 2, 16);
}

/* queries as the scores use them */
static double *bt_q_used(const bt_env *e, const kva_attn *a, const float *q, int n_q) {
  size_t n = (size_t)n_q * e->H * e->D;
  double *d = ref_dup_f(q, n);
  if (a->int_scores && bt_is_int(e->kt)) ref_int_query(d, q, (size_t)n_q * e->H, e->D);
  return d;
}

/* The result (out, lse) of n_q queries q of layer l of seq against fp64 over
   the rows read back now.  Returns the worst err/tol (checked by the caller). */
static double bt_ref_check(bt_env *e, int seq, int loose, int l, const kva_attn *a, const float *q, int n_q,
                           const int32_t *tree, const float *out, const float *lse, char *msg, size_t cap) {
  bt_snap sn;
  int Dv = e->Dv, H = e->H, G = e->G, j;
  size_t no = (size_t)n_q * H * Dv, nl = (size_t)n_q * H;
  double *wo = KT_ALLOC(double, no + 1), *wl = KT_ALLOC(double, nl + 1), *vb = NULL, vmax = 0.0, worst;
  double *qd = bt_q_used(e, a, q, n_q);
  bt_ref_in in;
  bt_snap_take(&sn, e->c, seq, l, G, e->D, Dv);
  for (j = 0; j < sn.len * G; j++)
    if (sn.p[j] != KVA_POS_EMPTY) vmax = fmax(vmax, ref_max_abs_f(sn.v + (size_t)j * Dv, (size_t)Dv));
  memset(&in, 0, sizeof in);
  in.s = &sn, in.a = a, in.q = qd, in.n_q = n_q, in.pos_next = kva_seq_pos(e->c, seq), in.tree = tree;
  in.vdt = a->int_values && bt_is_int(e->vt) ? e->vt : KVA_DTYPE_DEFAULT;
  if (in.vdt != KVA_DTYPE_DEFAULT) vb = KT_ALLOC(double, no + 1), bt_n.iv++;
  if (a->select_budget > 0 && sn.len > a->select_budget) {
    unsigned char *s0 = KT_ALLOC(unsigned char, (size_t)n_q * G * sn.len + 1);
    unsigned char *s1 = KT_ALLOC(unsigned char, (size_t)n_q * G * sn.len + 1);
    unsigned char *amb = KT_ALLOC(unsigned char, (size_t)n_q * G + 1), *amb1 = KT_ALLOC(unsigned char, (size_t)n_q * G + 1);
    int met;
    if (loose) { /* bounds may be looser than the held keys: the choice is not the rule's */
      bt_n.sel_skipped++;
      worst = 0.0;
      if (msg) msg[0] = 0;
    } else {
      bt_sel_mask(&sn, a, q, n_q, e->bs, 0, s0, amb);
      met = bt_sel_mask(&sn, a, q, n_q, e->bs, 1, s1, amb1);
      for (j = 0; j < n_q * G; j++) amb[j] |= amb1[j], bt_n.sel_skipped += amb[j];
      bt_n.sel_partial++;
      in.sel = s0;
      bt_ref(&in, wo, wl, vb);
      worst = bt_cmp(out, lse, wo, wl, vb, n_q, H, G, Dv, e->D, vmax, amb, msg, cap);
      if (worst > 1.0 && met) { /* a block without tokens might rank first */
        char m1[256];
        double w1;
        in.sel = s1;
        bt_ref(&in, wo, wl, vb);
        w1 = bt_cmp(out, lse, wo, wl, vb, n_q, H, G, Dv, e->D, vmax, amb, m1, sizeof m1);
        if (w1 <= 1.0) bt_n.sel_variant_inf++, worst = w1;
      }
    }
    free(s0), free(s1), free(amb), free(amb1);
  } else {
    bt_ref(&in, wo, wl, vb);
    worst = bt_cmp(out, lse, wo, wl, vb, n_q, H, G, Dv, e->D, vmax, NULL, msg, cap);
  }
  if (worst > bt_n.worst && worst < 1e30) bt_n.worst = worst;
  bt_snap_free(&sn);
  free(wo), free(wl), free(vb), free(qd);
  return worst;
}

/* kva_attend_cache_lse of n_q queries of layer l, checked; with selection
   over a sequence holding at most select_budget slots, also the same bits as
   without selection. */
static void bt_attn_check(bt_env *e, int seq, const bt_shadow *s, int l, const kva_attn *a, int n_q,
                          const int32_t *tree, const char *what) {
  int H = e->H, Dv = e->Dv;
  float *q = KT_ALLOC(float, n_q * H * e->D), *out = KT_ALLOC(float, n_q * H * Dv), *lse = KT_ALLOC(float, n_q * H);
  float amp = kt_int(e->r, 0, 2) == 0 ? 3.0f : 1.0f;
  kva_status st;
  char msg[256];
  kt_fill(e->r, q, (size_t)n_q * H * e->D, -amp, amp);
  st = kva_attend_cache_lse(e->c, seq, l, a, q, n_q, out, lse);
  KT_CHECK(st == KVA_OK, "%s: kva_attend_cache_lse = %d (%s)", what, (int)st, kva_attn_check(a) ? kva_attn_check(a) : "");
  if (st == KVA_OK) {
    double w = bt_ref_check(e, seq, s->loose, l, a, q, n_q, tree, out, lse, msg, sizeof msg);
    KT_CHECK(w <= 1.0,
             "%s [%s]: layer %d n_q %d len %d pos %d empty %ld: %s (window %d sink %d softcap %g alibi %g sinks %d nc %d chunk %d "
             "is %d iv %d sel %d/%d/%d tree %d, err/tol %.3g)",
             what, bt_case_desc, l, n_q, s->len, s->pos, bt_sh_empty(s), msg, a->window, a->n_sink, (double)a->softcap,
             (double)a->alibi_max_bias, a->sink_logits != NULL, a->non_causal, a->chunk_size, a->int_scores,
             a->int_values, a->select_budget, a->select_sink, a->select_recent, tree != NULL, w);
    if (a->select_budget > 0 && s->len <= a->select_budget) {
      kva_attn b = *a;
      float *o2 = KT_ALLOC(float, n_q * H * Dv), *l2 = KT_ALLOC(float, n_q * H);
      b.select_budget = b.select_sink = b.select_recent = 0;
      KT_STATUS(kva_attend_cache_lse(e->c, seq, l, &b, q, n_q, o2, l2), KVA_OK);
      KT_CHECK(kt_same_bits(out, o2, (size_t)n_q * H * Dv) && kt_same_bits(lse, l2, (size_t)n_q * H),
               "%s: selection with a budget (%d) covering all %d slots is not the unselected result bit for bit", what,
               a->select_budget, s->len);
      free(o2), free(l2);
    }
  }
  bt_n.attn++;
  free(q), free(out), free(lse);
}

/* kva_gqa_forward for layer l of the open step (it stores the step and
   attends), against fp64: projections, RoPE at the step's positions,
   attention over the rows read back, the output projection. */
static void bt_gqa_check(bt_env *e, int seq, bt_shadow *s, int l) {
  kt_rng *r = e->r;
  int H = e->H, G = e->G, D = e->D, n = s->step, dm = kt_int(r, 2, 12), t, i, o;
  kva_gqa_layer gl;
  float *wq = KT_ALLOC(float, H * D * dm), *wk = KT_ALLOC(float, G * D * dm), *wv = KT_ALLOC(float, G * D * dm);
  float *wo = KT_ALLOC(float, dm * H * D), *bq = KT_ALLOC(float, H * D), *bo = KT_ALLOC(float, dm);
  float *x = KT_ALLOC(float, n * dm), *y = KT_ALLOC(float, n * dm);
  double *qd = KT_ALLOC(double, n * H * D), *att = KT_ALLOC(double, n * H * D), *lse = KT_ALLOC(double, n * H);
  double worst = 0.0, ymax = 0.0;
  kva_status st;
  memset(&gl, 0, sizeof gl);
  gl.d_model = dm;
  bt_rand_attn(e, &gl.attn, s->len, 0, 0);
  gl.attn.v_dim = 0, gl.attn.int_scores = 0, gl.attn.int_values = 0, gl.attn.non_causal = 0;
  kt_fill(r, wq, (size_t)H * D * dm, -0.6f, 0.6f);
  kt_fill(r, wk, (size_t)G * D * dm, -0.6f, 0.6f);
  kt_fill(r, wv, (size_t)G * D * dm, -0.6f, 0.6f);
  kt_fill(r, wo, (size_t)dm * H * D, -0.6f, 0.6f);
  kt_fill(r, bq, (size_t)H * D, -0.2f, 0.2f);
  kt_fill(r, bo, (size_t)dm, -0.2f, 0.2f);
  kt_fill(r, x, (size_t)n * dm, -1.0f, 1.0f);
  gl.wq = wq, gl.wk = wk, gl.wv = wv, gl.wo = wo, gl.bq = bq, gl.bo = kt_int(r, 0, 1) ? bo : NULL;
  if (D >= 2) gl.rope.theta = 10000.0f, gl.rope.dim = D & 1 ? D - 1 : 0;
  st = kva_gqa_forward(&gl, e->c, seq, l, x, n, y);
  KT_STATUS(st, KVA_OK);
  if (st == KVA_OK) {
    bt_record_step(e->c, seq, s, l);
    for (t = 0; t < n; t++) {
      double xd[16];
      for (i = 0; i < dm; i++) xd[i] = (double)x[t * dm + i];
      ref_linear(wq, bq, xd, dm, H * D, qd + (size_t)t * H * D);
      ref_rope(qd + (size_t)t * H * D, H, D, gl.rope.dim, 0, (double)gl.rope.theta, NULL, s->pos - n + t);
    }
    {
      bt_snap sn;
      bt_ref_in in;
      bt_snap_take(&sn, e->c, seq, l, G, D, D);
      memset(&in, 0, sizeof in);
      in.s = &sn, in.a = &gl.attn, in.q = qd, in.n_q = n, in.pos_next = s->pos;
      bt_ref(&in, att, lse, NULL);
      bt_snap_free(&sn);
    }
    for (t = 0; t < n; t++)
      for (o = 0; o < dm; o++) {
        double want = gl.bo ? (double)bo[o] : 0.0;
        for (i = 0; i < H * D; i++) want += (double)wo[(size_t)o * H * D + i] * att[(size_t)t * H * D + i];
        ymax = fmax(ymax, fabs(want));
        worst = fmax(worst, fabs((double)y[t * dm + o] - want));
      }
    KT_CHECK(worst <= 2e-4 * (1.0 + ymax) * (1.0 + sqrt((double)(H * D)) / 4.0),
             "kva_gqa_forward [%s] layer %d (n %d len %d pos %d empty %ld): |y - fp64| %.3g (max %.3g)", bt_case_desc, l,
             n, s->len, s->pos, bt_sh_empty(s), worst, ymax);
    bt_n.gqa++;
  }
  free(wq), free(wk), free(wv), free(wo), free(bq), free(bo), free(x), free(y), free(qd), free(att), free(lse);
}

/* ------------------------------------------------------------------------ */
/* The random driver                                                         */

#define BT_MAXS 3
#define BT_CAP 256

typedef struct {
  int id, alive;
  bt_shadow s;
  bt_pol pol;
} bt_seq;

typedef struct {
  bt_env e;
  bt_user u;
  float w[BT_MAXL];
  bt_seq sq[BT_MAXS];
  int shared; /* a fork happened: blocks may be shared */
  bt_shadow pre, exp;
  int it;
} bt_ctx;

static void bt_rand_pol(kt_rng *r, bt_pol *p, const float *w) {
  int u = kt_int(r, 0, 19);
  memset(p, 0, sizeof *p);
  p->budget = kt_int(r, 0, 3) == 0 ? kt_int(r, 1, 6) : kt_int(r, 4, 40);
  p->rollback = kt_int(r, 0, 3) == 0;
  if (u < 12) {
    p->kind = KVA_EVICT_SCORE;
    p->w = kt_int(r, 0, 3) ? w : NULL;
    p->share = p->w ? kt_int(r, 0, 1) : 1;
  } else if (u < 15) {
    p->kind = KVA_EVICT_SCORE;
  } else if (u < 17) {
    p->kind = KVA_EVICT_WINDOW;
  } else {
    p->kind = KVA_EVICT_NONE;
    return;
  }
  p->n_sink = kt_int(r, 0, 1) ? 0 : kt_int(r, 0, p->budget < 3 ? p->budget : 3);
  if (p->kind == KVA_EVICT_SCORE && kt_int(r, 0, 1))
    p->n_recent = kt_int(r, 0, p->budget - p->n_sink < 5 ? p->budget - p->n_sink : 5);
}

static void bt_rand_weights(kt_rng *r, float *w, int L) {
  int l;
  for (l = 0; l < L; l++) {
    int u = kt_int(r, 0, 9);
    w[l] = u == 0 ? kt_uniform(r, 0.01f, 0.1f) : u < 5 ? kt_uniform(r, 0.2f, 1.0f) : kt_uniform(r, 1.0f, 2.5f);
  }
}

static const char *bt_pol_name(const bt_pol *p) {
  if (p->kind == KVA_EVICT_NONE) return "NONE";
  if (p->kind == KVA_EVICT_WINDOW) return "WINDOW";
  if (!bt_uneven(p)) return "SCORE";
  if (p->w && p->share) return "SCORE+weights+share";
  return p->w ? "SCORE+weights" : "SCORE+share";
}

/* everything as before a refused or failed call; failed_delta: appends_failed's
   growth (-1: 0 or 1, for a scorer refusing an append that is also KVA_ERR_FULL) */
static void bt_unchanged(bt_ctx *x, int si, const kva_cache_stats *cs0, int failed_delta, const char *what) {
  kva_cache_stats cs1;
  kva_cache_get_stats(x->e.c, &cs1);
  bt_verify(x->e.c, x->sq[si].id, &x->pre, 0, 0, 0, what);
  KT_CHECK(kt_stats_equal(cs0, &cs1, 1) &&
               (failed_delta < 0 ? cs1.appends_failed - cs0->appends_failed <= 1 && cs1.appends_failed >= cs0->appends_failed
                                 : cs1.appends_failed == cs0->appends_failed + failed_delta),
           "%s: cache stats changed (blocks used %d -> %d, tokens %ld -> %ld, appends_failed %ld -> %ld)", what,
           cs0->blocks_used, cs1.blocks_used, cs0->tokens_held, cs1.tokens_held, cs0->appends_failed,
           cs1.appends_failed);
}

/* Sets the scorer to fail at one of the expected calls; returns the status expected, KVA_OK if none. */
static kva_status bt_arm_failure(bt_ctx *x, const bt_call *want, int ncalls) {
  kt_rng *r = x->e.r;
  int k = kt_int(r, 0, ncalls - 1), tries;
  if (kt_int(r, 0, 1)) {
    static const kva_status sts[] = {KVA_ERR_NOMEM, KVA_ERR_UNSUPPORTED, KVA_ERR_STEP, KVA_ERR_FULL};
    x->u.fail_call = k, x->u.fail_nan = 0, x->u.fail_status = sts[kt_int(r, 0, 3)];
    return x->u.fail_status;
  }
  for (tries = 0; tries < ncalls && want[k].n == 0; tries++) k = (k + 1) % ncalls;
  if (want[k].n == 0) return KVA_OK;
  x->u.fail_call = k, x->u.fail_nan = 1, x->u.fail_slot = kt_int(r, 0, want[k].n - 1);
  return KVA_ERR_ARG;
}

static void bt_store_all(bt_ctx *x, int si) {
  bt_seq *q = &x->sq[si];
  int l;
  for (l = 0; l < x->e.L; l++) {
    if (x->e.Dv == x->e.D && x->e.D >= 2 && q->s.step <= 16 && kt_int(x->e.r, 0, 11) == 0)
      bt_gqa_check(&x->e, q->id, &q->s, l);
    else
      bt_store_layer(x->e.c, q->id, &q->s, l, x->e.r, kt_int(x->e.r, 0, 3) == 0 ? 2.0f : 1.0f);
  }
}

static void bt_tree_step(bt_ctx *x, int si) {
  bt_seq *q = &x->sq[si];
  bt_shadow *s = &q->s;
  int n = s->step, i, j, nk = 0, l, g, leaf;
  int32_t parent[16], keep[16];
  kva_attn a;
  int32_t base = s->pos - n;
  for (i = 0; i < n; i++) parent[i] = i == 0 ? -1 : kt_int(x->e.r, -1, i - 1);
  bt_rand_attn(&x->e, &a, s->len, 1, 0);
  a.tree_parent = parent;
  bt_attn_check(&x->e, q->id, s, kt_int(x->e.r, 0, x->e.L - 1), &a, n, parent, "tree attention");
  /* accept the path to a random node */
  leaf = kt_int(x->e.r, 0, n - 1);
  for (i = leaf; i >= 0; i = parent[i]) keep[nk++] = i;
  for (i = 0; i < nk / 2; i++) j = keep[i], keep[i] = keep[nk - 1 - i], keep[nk - 1 - i] = j;
  KT_STATUS(kva_seq_accept(x->e.c, q->id, n, keep, nk), KVA_OK);
  for (l = 0; l < s->L; l++)
    for (g = 0; g < s->G; g++)
      for (j = 0; j < nk; j++) { /* keep[j] >= j: copying upwards in j never overwrites a source still needed */
        memmove(bt_sh_k(s, l, g, base + j), bt_sh_k(s, l, g, base + keep[j]), sizeof(float) * (size_t)s->D);
        memmove(bt_sh_v(s, l, g, base + j), bt_sh_v(s, l, g, base + keep[j]), sizeof(float) * (size_t)s->Dv);
      }
  bt_sh_drop_from(s, base + nk);
  s->pos = base + nk, s->len -= n - nk, s->step = 0;
  bt_verify(x->e.c, q->id, s, 0, nk, 0, "after kva_seq_accept");
  bt_n.trees++;
}

static void bt_op_append(bt_ctx *x, int si, int n, int fail) {
  bt_seq *q = &x->sq[si];
  kva_cache *c = x->e.c;
  int blocks = -1, any, maxh, ncalls;
  bt_call want[BT_MAXCALLS];
  kva_fit fit = kva_seq_fits(c, q->id, n, &blocks);
  kva_cache_stats cs0;
  kva_status st, expect = KVA_OK;
  char msg[300], what[160];
  snprintf(what, sizeof what, "case %d: append %d to seq %d under %s (budget %d sink %d recent %d rollback %d)", x->it,
           n, si, bt_pol_name(&q->pol), q->pol.budget, q->pol.n_sink, q->pol.n_recent, q->pol.rollback);
  bt_sh_assign(&x->pre, &q->s);
  bt_sh_assign(&x->exp, &q->s);
  any = bt_expect(&x->exp, &q->pol, n, 0, x->u.salt, x->u.cross, want, &ncalls, &maxh);
  bt_user_reset(&x->u, &x->pre, q->id);
  if (fail && any && ncalls > 0) expect = bt_arm_failure(x, want, ncalls);
  kva_cache_get_stats(c, &cs0);
  st = kva_seq_append(c, q->id, n);
  if (expect != KVA_OK) {
    /* a pool too small refuses it too: either refusal may come first */
    KT_CHECK(st == expect || (st == KVA_ERR_FULL && fit != KVA_FITS_NOW),
             "%s: a failing scorer (call %d, %s): status %d, expected %d", what, x->u.fail_call,
             x->u.fail_nan ? "NaN" : "status", (int)st, (int)expect);
    bt_unchanged(x, si, &cs0, st == KVA_ERR_FULL ? -1 : 0, "after a refused append");
    x->u.fail_call = -1;
    bt_n.fails++;
    return;
  }
  if (st == KVA_ERR_FULL) {
    KT_CHECK(fit != KVA_FITS_NOW, "%s: kva_seq_fits said NOW, the append is KVA_ERR_FULL", what);
    bt_unchanged(x, si, &cs0, 1, "after KVA_ERR_FULL");
    bt_n.fulls++;
    return;
  }
  KT_CHECK(st == KVA_OK, "%s: status %d", what, (int)st);
  if (st != KVA_OK) return;
  if (!x->shared && !(bt_uneven(&q->pol) && q->pol.share))
    KT_CHECK(fit == KVA_FITS_NOW, "%s: the append succeeded, kva_seq_fits said %d (%d blocks)", what, (int)fit, blocks);
  bt_calls_diff(&x->u, want, q->pol.kind == KVA_EVICT_SCORE && any ? ncalls : 0, msg, sizeof msg);
  KT_CHECK(!msg[0], "%s: %s", what, msg);
  x->exp.len = any ? maxh + n : x->pre.len + n;
  bt_sh_add(&x->exp, n);
  x->exp.step = n;
  bt_verify(c, q->id, &x->exp, any, n, 0, what);
  bt_sh_assign(&q->s, &x->exp);
  bt_n.appends++, bt_n.evicting += any;
  bt_store_all(x, si);
  if (kt_int(x->e.r, 0, 9) < 6) {
    kva_attn a;
    int nq = kt_int(x->e.r, 1, n < 8 ? n : 8);
    bt_rand_attn(&x->e, &a, q->s.len, 0, 1);
    bt_attn_check(&x->e, q->id, &q->s, kt_int(x->e.r, 0, x->e.L - 1), &a, nq, NULL, "kva_attend_cache_lse");
  }
  if (n <= 12 && kt_int(x->e.r, 0, 7) == 0) {
    bt_tree_step(x, si);
  } else if (kt_int(x->e.r, 0, 9) == 0) {
    int d = kt_int(x->e.r, 1, n);
    KT_STATUS(kva_seq_truncate(c, q->id, q->s.len - d), KVA_OK);
    bt_sh_drop_from(&q->s, q->s.pos - d);
    q->s.len -= d, q->s.pos -= d, q->s.step = 0, q->s.loose = 1;
    bt_verify(c, q->id, &q->s, 0, 0, 0, "after a truncate within the step");
    bt_n.truncs++;
  }
}

static void bt_op_compress(bt_ctx *x, int si, int cb, int fail) {
  bt_seq *q = &x->sq[si];
  kva_cache *c = x->e.c;
  int any, maxh, ncalls;
  bt_call want[BT_MAXCALLS];
  kva_cache_stats cs0;
  kva_status st, expect = KVA_OK;
  char msg[300], what[160];
  snprintf(what, sizeof what, "case %d: compress seq %d to %d under %s (budget %d sink %d recent %d)", x->it, si, cb,
           bt_pol_name(&q->pol), q->pol.budget, q->pol.n_sink, q->pol.n_recent);
  bt_sh_assign(&x->pre, &q->s);
  bt_sh_assign(&x->exp, &q->s);
  bt_user_reset(&x->u, &x->pre, q->id);
  kva_cache_get_stats(c, &cs0);
  if (q->pol.kind == KVA_EVICT_NONE) {
    st = kva_seq_compress(c, q->id, cb);
    KT_CHECK(st != KVA_OK, "%s: kva_seq_compress under NONE returned KVA_OK", what);
    bt_unchanged(x, si, &cs0, 0, "after compress under NONE");
    return;
  }
  any = bt_expect(&x->exp, &q->pol, 0, cb, x->u.salt, x->u.cross, want, &ncalls, &maxh);
  if (fail && any && ncalls > 0) expect = bt_arm_failure(x, want, ncalls);
  st = kva_seq_compress(c, q->id, cb);
  if (expect != KVA_OK) {
    KT_CHECK(st == expect || (st == KVA_ERR_FULL && x->shared),
             "%s: a failing scorer (call %d, %s): status %d, expected %d", what, x->u.fail_call,
             x->u.fail_nan ? "NaN" : "status", (int)st, (int)expect);
    bt_unchanged(x, si, &cs0, 0, "after a refused compress");
    x->u.fail_call = -1;
    bt_n.fails++;
    return;
  }
  if (st == KVA_ERR_FULL && x->shared) { /* the shared blocks could not be copied */
    bt_unchanged(x, si, &cs0, 0, "after a compress refused with KVA_ERR_FULL");
    bt_n.fulls++;
    return;
  }
  KT_CHECK(st == KVA_OK, "%s: status %d", what, (int)st);
  if (st != KVA_OK) return;
  bt_calls_diff(&x->u, want, q->pol.kind == KVA_EVICT_SCORE && any ? ncalls : 0, msg, sizeof msg);
  KT_CHECK(!msg[0], "%s: %s", what, msg);
  x->exp.len = any ? maxh : x->pre.len;
  x->exp.step = 0;
  bt_verify(c, q->id, &x->exp, any, 0, 0, what);
  if (x->pre.step > 0) { /* the call ended the step */
    float qq[BT_MAXH * BT_MAXD], out[BT_MAXH * BT_MAXD];
    kva_attn a;
    kt_attn_init(&a, x->e.H, x->e.G, x->e.D, x->e.Dv);
    memset(qq, 0, sizeof qq);
    KT_STATUS(kva_attend_cache(c, q->id, 0, &a, qq, 1, out), KVA_ERR_STEP);
  }
  bt_sh_assign(&q->s, &x->exp);
  bt_n.compresses++, bt_n.evicting += any;
}

static void bt_op_setpol(bt_ctx *x, int si) {
  bt_seq *q = &x->sq[si];
  bt_pol p;
  kva_evict ev;
  kva_status st, want;
  kva_cache_stats cs0;
  bt_rand_pol(x->e.r, &p, x->w);
  ev = bt_evict_of(&p, &x->u);
  want = bt_sh_empty(&q->s) > 0 && p.kind != KVA_EVICT_NONE && !bt_uneven(&p) ? KVA_ERR_UNSUPPORTED : KVA_OK;
  bt_sh_assign(&x->pre, &q->s);
  kva_cache_get_stats(x->e.c, &cs0);
  st = kva_seq_set_evict(x->e.c, q->id, &ev);
  KT_CHECK(st == want, "case %d: set %s on a sequence with %ld empty slots: %d, expected %d", x->it, bt_pol_name(&p),
           bt_sh_empty(&q->s), (int)st, (int)want);
  if (st == KVA_OK)
    q->pol = p;
  else
    bt_n.pol_refused++, bt_unchanged(x, si, &cs0, 0, "after a refused policy");
}

static void bt_op_batch(bt_ctx *x) {
  int ids[BT_MAXS], nq[BT_MAXS], map[BT_MAXS], ns = 0, i, rows = 0, maxlen = 1, l, off;
  kva_attn a;
  kva_batch *plan = NULL;
  float *q, *out, *lse;
  kva_status st;
  for (i = 0; i < BT_MAXS; i++)
    if (x->sq[i].alive) {
      ids[ns] = x->sq[i].id, map[ns] = i;
      nq[ns] = x->sq[i].s.step > 0 ? kt_int(x->e.r, 0, x->sq[i].s.step < 6 ? x->sq[i].s.step : 6) : 0;
      rows += nq[ns];
      if (x->sq[i].s.len > maxlen) maxlen = x->sq[i].s.len;
      ns++;
    }
  if (rows == 0) return;
  bt_rand_attn(&x->e, &a, maxlen, 0, 1);
  st = kva_batch_plan(x->e.c, &a, ids, nq, ns, &plan);
  KT_STATUS(st, KVA_OK);
  if (st != KVA_OK) return;
  l = kt_int(x->e.r, 0, x->e.L - 1);
  q = KT_ALLOC(float, rows * x->e.H * x->e.D);
  out = KT_ALLOC(float, rows * x->e.H * x->e.Dv);
  lse = KT_ALLOC(float, rows * x->e.H);
  kt_fill(x->e.r, q, (size_t)rows * x->e.H * x->e.D, -2.0f, 2.0f);
  st = kva_attend_batch_lse(x->e.c, plan, l, q, out, lse);
  KT_STATUS(st, KVA_OK);
  for (i = 0, off = 0; st == KVA_OK && i < ns; off += nq[i], i++) {
    bt_seq *s = &x->sq[map[i]];
    const float *qi = q + (size_t)off * x->e.H * x->e.D;
    const float *oi = out + (size_t)off * x->e.H * x->e.Dv, *li = lse + (size_t)off * x->e.H;
    float *o2, *l2;
    char msg[256];
    double w;
    if (nq[i] == 0) continue;
    w = bt_ref_check(&x->e, s->id, s->s.loose, l, &a, qi, nq[i], NULL, oi, li, msg, sizeof msg);
    KT_CHECK(w <= 1.0,
             "case %d: kva_attend_batch_lse, seq %d of %d (n_q %d len %d pos %d empty %ld sel %d): %s (err/tol %.3g)",
             x->it, i, ns, nq[i], s->s.len, s->s.pos, bt_sh_empty(&s->s), a.select_budget, msg, w);
    o2 = KT_ALLOC(float, nq[i] * x->e.H * x->e.Dv), l2 = KT_ALLOC(float, nq[i] * x->e.H);
    KT_STATUS(kva_attend_cache_lse(x->e.c, s->id, l, &a, qi, nq[i], o2, l2), KVA_OK);
    KT_CHECK(kt_same_bits(oi, o2, (size_t)nq[i] * x->e.H * x->e.Dv) && kt_same_bits(li, l2, (size_t)nq[i] * x->e.H),
             "case %d: kva_attend_batch_lse and kva_attend_cache_lse differ for seq %d (len %d, pos %d, empty %ld)", x->it,
             i, s->s.len, s->s.pos, bt_sh_empty(&s->s));
    free(o2), free(l2);
  }
  kva_batch_free(plan);
  free(q), free(out), free(lse);
  bt_n.batch++;
}

static void bt_case(kt_rng *r, int it) {
  static const int dims[] = {1, 2, 3, 5, 7, 8, 12, 16, 24, 33, 40};
  static const kva_dtype types[] = {KVA_F32, KVA_F16, KVA_BF16, KVA_INT8, KVA_INT4, KVA_FP8_E4M3, KVA_FP8_E5M2};
  bt_ctx x;
  kva_cache_desc d;
  int i, op, n_ops, nblk_full;
  kva_status st;
  memset(&x, 0, sizeof x);
  x.it = it;
  x.e.r = r;
  x.e.L = kt_int(r, 1, BT_MAXL);
  x.e.G = kt_int(r, 1, BT_MAXG);
  x.e.H = x.e.G * kt_int(r, 1, 3);
  x.e.D = kt_pick(r, dims, (int)(sizeof dims / sizeof dims[0]));
  x.e.Dv = kt_int(r, 0, 1) ? x.e.D : kt_pick(r, dims, (int)(sizeof dims / sizeof dims[0]));
  x.e.bs = kt_int(r, 0, 3) == 0 ? kt_int(r, 1, 3) : kt_int(r, 1, 16);
  x.e.kt = types[kt_int(r, 0, 6)];
  x.e.vt = kt_int(r, 0, 2) ? x.e.kt : types[kt_int(r, 0, 6)];
  x.e.rotate = kt_int(r, 0, 7) == 0 ? kt_int(r, 1, 3) : 0;
  x.e.bounds = !(x.e.rotate & KVA_ROTATE_K) && kt_int(r, 0, 1) == 0;
  x.u.salt = kt_u32(r);
  x.u.cross = kt_int(r, 0, 2) == 0;
  x.u.fail_call = -1;
  bt_rand_weights(r, x.w, x.e.L);
  nblk_full = BT_MAXS * (BT_CAP / x.e.bs + 4);
  kt_desc_init(&d, x.e.L, x.e.G, x.e.D, x.e.bs, kt_int(r, 0, 4) == 0 ? kt_int(r, 3, 80 / x.e.bs + 4) : nblk_full, 4,
               x.e.kt);
  d.v_dim = x.e.Dv;
  d.v_dtype = x.e.vt;
  d.k_scale = d.v_scale = 1.0f / 32.0f;
  d.rotate = x.e.rotate;
  d.block_bounds = x.e.bounds;
  snprintf(bt_case_desc, sizeof bt_case_desc, "case %d: L %d G %d H %d D %d Dv %d bs %d %s/%s rotate %d bounds %d", it,
           x.e.L, x.e.G, x.e.H, x.e.D, x.e.Dv, x.e.bs, kva_dtype_name(x.e.kt), kva_dtype_name(x.e.vt), x.e.rotate,
           x.e.bounds);
  st = kva_cache_create(&d, &x.e.c);
  KT_STATUS(st, KVA_OK);
  if (st != KVA_OK) return;
  bt_sh_alloc(&x.pre, x.e.L, x.e.G, x.e.D, x.e.Dv, BT_CAP);
  bt_sh_alloc(&x.exp, x.e.L, x.e.G, x.e.D, x.e.Dv, BT_CAP);
  for (i = 0; i < BT_MAXS; i++) bt_sh_alloc(&x.sq[i].s, x.e.L, x.e.G, x.e.D, x.e.Dv, BT_CAP);
  KT_STATUS(kva_seq_new(x.e.c, &x.sq[0].id), KVA_OK);
  x.sq[0].alive = 1;
  do bt_rand_pol(r, &x.sq[0].pol, x.w);
  while (x.sq[0].pol.kind == KVA_EVICT_NONE || !bt_uneven(&x.sq[0].pol));
  {
    kva_evict ev = bt_evict_of(&x.sq[0].pol, &x.u);
    KT_STATUS(kva_seq_set_evict(x.e.c, x.sq[0].id, &ev), KVA_OK);
  }
  bt_op_append(&x, 0, kt_int(r, 1, 48), 0);
  n_ops = kt_int(r, 6, 18);
  for (op = 0; op < n_ops; op++) {
    int si, u = kt_int(r, 0, 99), nalive = 0, n;
    for (i = 0; i < BT_MAXS; i++) nalive += x.sq[i].alive;
    do si = kt_int(r, 0, BT_MAXS - 1);
    while (!x.sq[si].alive);
    n = kt_int(r, 0, 9) < 6 ? kt_int(r, 1, 4) : kt_int(r, 0, 2) ? kt_int(r, 1, 2 * x.e.bs + 2) : kt_int(r, 8, 48);
    if (u < 45 || (u >= 90 && kt_int(r, 0, 1))) {
      if (x.sq[si].s.pos + n > BT_CAP)
        bt_op_compress(&x, si, kt_int(r, 1, 40), u >= 90);
      else
        bt_op_append(&x, si, n, u >= 90);
    } else if (u < 60 || u >= 90) {
      bt_op_compress(&x, si, kt_int(r, 0, 3) == 0 ? kt_int(r, 1, 4) : kt_int(r, 1, 40), u >= 90);
    } else if (u < 70) {
      bt_op_setpol(&x, si);
    } else if (u < 75) {
      int ni;
      for (ni = 0; ni < BT_MAXS && x.sq[ni].alive; ni++) {
      }
      if (ni < BT_MAXS) {
        st = kva_seq_fork(x.e.c, x.sq[si].id, &x.sq[ni].id);
        KT_STATUS(st, KVA_OK);
        if (st == KVA_OK) {
          x.sq[si].s.step = 0;
          bt_sh_assign(&x.sq[ni].s, &x.sq[si].s);
          x.sq[ni].pol = x.sq[si].pol;
          x.sq[ni].alive = 1;
          x.shared = 1;
          bt_verify(x.e.c, x.sq[ni].id, &x.sq[ni].s, 0, 0, 0, "a fork");
          bt_n.forks++;
        }
      }
    } else if (u < 78) {
      if (nalive > 1) {
        KT_STATUS(kva_seq_free(x.e.c, x.sq[si].id), KVA_OK);
        x.sq[si].alive = 0;
      }
    } else if (u < 82) {
      bt_rand_weights(r, x.w, x.e.L); /* read through the pointer at the next eviction */
    } else {
      bt_op_batch(&x);
    }
  }
  if (bt_verbose() && it < 3)
    fprintf(stderr, "  budgets case %d: L %d G %d H %d D %d Dv %d bs %d %s/%s rot %d bounds %d\n", it, x.e.L, x.e.G,
            x.e.H, x.e.D, x.e.Dv, x.e.bs, kva_dtype_name(x.e.kt), kva_dtype_name(x.e.vt), x.e.rotate, x.e.bounds);
  for (i = 0; i < BT_MAXS; i++) bt_sh_free(&x.sq[i].s);
  bt_sh_free(&x.pre), bt_sh_free(&x.exp);
  kva_cache_destroy(x.e.c);
  bt_n.cases++;
}

static void bt_random(void) {
  kt_rng r;
  int it, iters = kt_iters(250);
  kt_seed(&r, 0xB0D6E75ULL);
  for (it = 0; it < iters; it++) bt_case(&r, it);
}

/* ------------------------------------------------------------------------ */
/* Directed tests                                                            */

/* a whole sequence as read back, with its stats */
typedef struct {
  int L, len, pos;
  bt_snap s[BT_MAXL];
  kva_seq_stats st;
} bt_whole;

static void bt_whole_take(bt_whole *w, kva_cache *c, int seq, int L, int G, int D, int Dv) {
  int l;
  w->L = L, w->len = kva_seq_len(c, seq), w->pos = kva_seq_pos(c, seq);
  for (l = 0; l < L; l++) bt_snap_take(&w->s[l], c, seq, l, G, D, Dv);
  memset(&w->st, 0, sizeof w->st);
  kva_seq_get_stats(c, seq, &w->st);
}
static void bt_whole_free(bt_whole *w) {
  int l;
  for (l = 0; l < w->L; l++) bt_snap_free(&w->s[l]);
}
static int bt_whole_same(const bt_whole *a, const bt_whole *b) {
  int l;
  size_t n;
  if (a->len != b->len || a->pos != b->pos || a->st.tokens != b->st.tokens ||
      a->st.head_slots_empty != b->st.head_slots_empty || a->st.blocks != b->st.blocks ||
      a->st.tokens_evicted != b->st.tokens_evicted || a->st.bytes != b->st.bytes)
    return 0;
  for (l = 0; l < a->L; l++) {
    n = (size_t)a->len * a->s[l].G;
    if (memcmp(a->s[l].p, b->s[l].p, n * sizeof(int32_t)) || memcmp(a->s[l].k, b->s[l].k, n * a->s[l].D * sizeof(float)) ||
        memcmp(a->s[l].v, b->s[l].v, n * a->s[l].Dv * sizeof(float)))
      return 0;
  }
  return 1;
}

enum { BT_FD = 8 };

typedef struct {
  kva_cache *c;
  int seq, L, G, bs;
  bt_user u;
  kt_rng r;
} bt_fix;

static void bt_fix_init(bt_fix *f, int L, int G, int bs, int n_blocks, kva_dtype t, int demote, uint64_t seed) {
  kva_cache_desc d;
  memset(f, 0, sizeof *f);
  f->L = L, f->G = G, f->bs = bs;
  kt_seed(&f->r, seed);
  f->u.salt = (uint32_t)seed, f->u.fail_call = -1;
  kt_desc_init(&d, L, G, BT_FD, bs, n_blocks, 8, t);
  if (demote) d.demote_dtype = KVA_INT8;
  if (kva_cache_create(&d, &f->c) != KVA_OK || kva_seq_new(f->c, &f->seq) != KVA_OK) abort();
}

static kva_evict bt_fix_pol(bt_fix *f, int budget, const float *w, int share) {
  kva_evict e;
  memset(&e, 0, sizeof e);
  e.kind = KVA_EVICT_SCORE, e.budget = budget, e.score = bt_scorer, e.score_user = &f->u;
  e.layer_weight = w, e.share_heads = share;
  return e;
}

/* append n to seq and store every layer */
static kva_status bt_fix_step(bt_fix *f, int seq, int n) {
  float *k = KT_ALLOC(float, n * f->G * BT_FD), *v = KT_ALLOC(float, n * f->G * BT_FD);
  int l;
  kva_status st = kva_seq_append(f->c, seq, n);
  for (l = 0; st == KVA_OK && l < f->L; l++) {
    kt_fill(&f->r, k, (size_t)n * f->G * BT_FD, -1.0f, 1.0f);
    kt_fill(&f->r, v, (size_t)n * f->G * BT_FD, -1.0f, 1.0f);
    st = kva_store(f->c, seq, l, k, v, n);
  }
  free(k), free(v);
  return st;
}

static void bt_fix_take(bt_fix *f, int seq, bt_whole *w) { bt_whole_take(w, f->c, seq, f->L, f->G, BT_FD, BT_FD); }

/* A sequence with empty slots (2 layers: weights 1 and 0.5 of 8, 16 tokens
   compressed): len 8 < pos 16, layer 1's heads hold 4 each. */
static void bt_fix_empty(bt_fix *f, float *w) {
  kva_evict e;
  w[0] = 1.0f, w[1] = 0.5f;
  e = bt_fix_pol(f, 8, w, 0);
  KT_STATUS(kva_seq_set_evict(f->c, f->seq, &e), KVA_OK);
  KT_STATUS(bt_fix_step(f, f->seq, 16), KVA_OK);
  KT_STATUS(kva_seq_compress(f->c, f->seq, 8), KVA_OK);
  KT_CHECK(kva_seq_len(f->c, f->seq) == 8 && kva_seq_pos(f->c, f->seq) == 16, "fixture: len %d pos %d, expected 8, 16",
           kva_seq_len(f->c, f->seq), kva_seq_pos(f->c, f->seq));
}

/* kva_seq_set_evict(e) gives `want` and changes nothing */
static void bt_refuse_pol(bt_fix *f, const kva_evict *e, kva_status want, const char *what) {
  bt_whole a, b;
  kva_status st;
  bt_fix_take(f, f->seq, &a);
  st = kva_seq_set_evict(f->c, f->seq, e);
  bt_fix_take(f, f->seq, &b);
  KT_CHECK(st == want, "%s: kva_seq_set_evict = %d, expected %d", what, (int)st, (int)want);
  KT_CHECK(bt_whole_same(&a, &b), "%s: the sequence changed", what);
  bt_whole_free(&a), bt_whole_free(&b);
}

static void bt_args(void) {
  bt_fix f;
  float w[2] = {1.0f, 0.5f}, bad[2];
  const float bads[] = {0.0f, -0.0f, -1.0f, -INFINITY, INFINITY, bt_nan()};
  kva_evict e;
  int kinds[2] = {KVA_EVICT_WINDOW, KVA_EVICT_H2O}, i, k;
  kva_status st;
  bt_fix_init(&f, 2, 2, 4, 64, KVA_F32, 1, 11);
  KT_STATUS(bt_fix_step(&f, f.seq, 6), KVA_OK);
  /* only SCORE takes layer_weight or share_heads */
  for (k = 0; k < 2; k++) {
    memset(&e, 0, sizeof e);
    e.kind = kinds[k], e.budget = 8;
    e.layer_weight = w;
    bt_refuse_pol(&f, &e, KVA_ERR_ARG, "WINDOW / H2O with layer_weight");
    e.layer_weight = NULL, e.share_heads = 1;
    bt_refuse_pol(&f, &e, KVA_ERR_ARG, "WINDOW / H2O with share_heads");
  }
  /* share_heads 0 or 1 */
  e = bt_fix_pol(&f, 8, NULL, 2);
  bt_refuse_pol(&f, &e, KVA_ERR_ARG, "share_heads 2");
  e.share_heads = -1;
  bt_refuse_pol(&f, &e, KVA_ERR_ARG, "share_heads -1");
  /* every weight finite and above 0 */
  for (i = 0; i < (int)(sizeof bads / sizeof bads[0]); i++)
    for (k = 0; k < 2; k++) {
      char what[80];
      bad[k] = bads[i], bad[!k] = 1.0f;
      e = bt_fix_pol(&f, 8, bad, kt_int(&f.r, 0, 1));
      snprintf(what, sizeof what, "layer_weight[%d] = %g", k, (double)bads[i]);
      bt_refuse_pol(&f, &e, KVA_ERR_ARG, what);
    }
  /* the usual rules hold with per-layer budgets */
  e = bt_fix_pol(&f, 8, w, 0);
  e.n_sink = 5, e.n_recent = 4;
  bt_refuse_pol(&f, &e, KVA_ERR_ARG, "per-layer budgets with n_sink + n_recent > budget");
  e = bt_fix_pol(&f, 0, w, 0);
  bt_refuse_pol(&f, &e, KVA_ERR_ARG, "per-layer budgets with budget 0");
  e = bt_fix_pol(&f, 8, w, 1);
  e.score = NULL;
  bt_refuse_pol(&f, &e, KVA_ERR_ARG, "per-layer budgets without a scorer");
  /* not with demotion (the cache has a demoted pool: a uniform SCORE may demote) */
  e = bt_fix_pol(&f, 8, w, 0);
  e.demote_dtype = KVA_INT8;
  bt_refuse_pol(&f, &e, KVA_ERR_UNSUPPORTED, "layer_weight with demotion");
  e = bt_fix_pol(&f, 8, NULL, 1);
  e.demote_dtype = KVA_INT8;
  bt_refuse_pol(&f, &e, KVA_ERR_UNSUPPORTED, "share_heads with demotion");
  e = bt_fix_pol(&f, 8, NULL, 0);
  e.demote_dtype = KVA_INT8;
  KT_STATUS(kva_seq_set_evict(f.c, f.seq, &e), KVA_OK); /* uniform SCORE demotes */
  /* tiny and huge finite weights are weights */
  bad[0] = 1e-40f, bad[1] = FLT_MAX;
  e = bt_fix_pol(&f, 8, bad, 0);
  KT_STATUS(kva_seq_set_evict(f.c, f.seq, &e), KVA_OK);
  {
    /* layer 0 keeps floor(8e-40) = 0 (its 6 go: slots 0..5 empty, the 4 new at 6..9), layer 1 everything */
    int32_t p[2], p6[2];
    KT_STATUS(bt_fix_step(&f, f.seq, 4), KVA_OK);
    KT_CHECK(kva_seq_len(f.c, f.seq) == 10, "weights 1e-40 and FLT_MAX: len %d, expected 10 (layer 1 evicts nothing)",
             kva_seq_len(f.c, f.seq));
    KT_STATUS(kva_seq_read(f.c, f.seq, 0, 0, NULL, NULL, p), KVA_OK);
    KT_STATUS(kva_seq_read(f.c, f.seq, 0, 6, NULL, NULL, p6), KVA_OK);
    KT_CHECK(p[0] == KVA_POS_EMPTY && p[1] == KVA_POS_EMPTY && p6[0] == 6 && p6[1] == 6,
             "weight 1e-40: layer 0 slot 0 holds %ld %ld (expected empty), slot 6 %ld %ld (expected 6)", (long)p[0],
             (long)p[1], (long)p6[0], (long)p6[1]);
    KT_STATUS(kva_seq_compress(f.c, f.seq, 3), KVA_OK);
    KT_CHECK(kva_seq_len(f.c, f.seq) == 10, "weight FLT_MAX: compress evicted from layer 1 (len %d)", kva_seq_len(f.c, f.seq));
  }
  /* kva_seq_compress's own budget */
  KT_STATUS(kva_seq_compress(f.c, f.seq, 0), KVA_ERR_ARG);
  kva_cache_destroy(f.c);

  /* B_l is the floor of the exact product: 10 x 0.7f = 6.99999988 keeps 6 (a float product rounds to 7) */
  bt_fix_init(&f, 1, 1, 4, 16, KVA_F32, 0, 13);
  w[0] = 0.7f;
  e = bt_fix_pol(&f, 10, w, 0);
  KT_STATUS(kva_seq_set_evict(f.c, f.seq, &e), KVA_OK);
  KT_STATUS(bt_fix_step(&f, f.seq, 12), KVA_OK);
  KT_STATUS(kva_seq_compress(f.c, f.seq, 10), KVA_OK);
  KT_CHECK(kva_seq_len(f.c, f.seq) == 6, "budget 10, weight 0.7f: len %d, expected floor(6.99999988) = 6",
           kva_seq_len(f.c, f.seq));
  kva_cache_destroy(f.c);

  /* NONE with the new fields: the docs say both "the other fields are ignored" (NONE)
     and "KVA_ERR_ARG otherwise" (only SCORE takes them): reported, not checked */
  bt_fix_init(&f, 2, 1, 4, 16, KVA_F32, 0, 12);
  memset(&e, 0, sizeof e);
  e.layer_weight = w;
  st = kva_seq_set_evict(f.c, f.seq, &e);
  if (bt_verbose()) fprintf(stderr, "  budgets: NONE with layer_weight: %s\n", kva_status_str(st));
  kva_cache_destroy(f.c);
}

/* Once a sequence has empty slots: the policies that may follow, export. */
static void bt_after_empty(void) {
  bt_fix f;
  float w[2], w2[2] = {0.25f, 1.0f};
  kva_evict e;
  size_t size = 0;
  unsigned char *buf;
  kva_seq_stats st;
  bt_fix_init(&f, 2, 2, 4, 64, KVA_F16, 0, 21);
  bt_fix_empty(&f, w);
  KT_STATUS(kva_seq_get_stats(f.c, f.seq, &st), KVA_OK);
  KT_CHECK(st.head_slots_empty == 8, "head_slots_empty %ld, expected 2 heads x 4", st.head_slots_empty);
  memset(&e, 0, sizeof e);
  e.kind = KVA_EVICT_WINDOW, e.budget = 8;
  bt_refuse_pol(&f, &e, KVA_ERR_UNSUPPORTED, "WINDOW after empty slots");
  e.kind = KVA_EVICT_H2O;
  bt_refuse_pol(&f, &e, KVA_ERR_UNSUPPORTED, "H2O after empty slots");
  e = bt_fix_pol(&f, 8, NULL, 0);
  bt_refuse_pol(&f, &e, KVA_ERR_UNSUPPORTED, "uniform SCORE after empty slots");
  /* the stream refuses it, size query included */
  KT_STATUS(kva_seq_export(f.c, f.seq, NULL, 0, &size), KVA_ERR_UNSUPPORTED);
  buf = KT_ALLOC(unsigned char, 1 << 16);
  KT_STATUS(kva_seq_export(f.c, f.seq, buf, 1 << 16, &size), KVA_ERR_UNSUPPORTED);
  /* NONE and other budgets are accepted; the new weights apply at the next eviction */
  memset(&e, 0, sizeof e);
  KT_STATUS(kva_seq_set_evict(f.c, f.seq, &e), KVA_OK);
  KT_STATUS(kva_seq_compress(f.c, f.seq, 4), KVA_ERR_ARG);
  e = bt_fix_pol(&f, 8, w2, 0);
  KT_STATUS(kva_seq_set_evict(f.c, f.seq, &e), KVA_OK);
  KT_STATUS(kva_seq_compress(f.c, f.seq, 8), KVA_OK); /* layer 0 keeps 2, layer 1 its 4 */
  KT_CHECK(kva_seq_len(f.c, f.seq) == 4, "new weights 0.25 / 1: len %d, expected 4", kva_seq_len(f.c, f.seq));
  e = bt_fix_pol(&f, 8, NULL, 1);
  KT_STATUS(kva_seq_set_evict(f.c, f.seq, &e), KVA_OK);
  /* a sequence with a per-layer policy but no empty slot exports */
  KT_STATUS(kva_seq_new(f.c, &f.seq), KVA_OK);
  e = bt_fix_pol(&f, 64, w, 0);
  KT_STATUS(kva_seq_set_evict(f.c, f.seq, &e), KVA_OK);
  KT_STATUS(bt_fix_step(&f, f.seq, 5), KVA_OK);
  KT_STATUS(kva_seq_export(f.c, f.seq, buf, 1 << 16, &size), KVA_OK);
  free(buf);
  kva_cache_destroy(f.c);
}

/* kva_seq_append_all and a SCORE sequence with budgets that would evict */
static void bt_append_all(void) {
  bt_fix f;
  float w[2];
  int seqs[2], n[2] = {1, 1}, other = -1;
  bt_whole a0, b0, a1, b1;
  kva_cache_stats s0, s1;
  bt_fix_init(&f, 2, 2, 4, 64, KVA_INT8, 0, 31);
  bt_fix_empty(&f, w); /* layer 0: 8 per head of budget 8 */
  KT_STATUS(kva_seq_new(f.c, &other), KVA_OK);
  KT_STATUS(bt_fix_step(&f, other, 3), KVA_OK);
  seqs[0] = other, seqs[1] = f.seq;
  bt_fix_take(&f, f.seq, &a0), bt_fix_take(&f, other, &b0);
  kva_cache_get_stats(f.c, &s0);
  KT_STATUS(kva_seq_append_all(f.c, seqs, n, 2), KVA_ERR_UNSUPPORTED); /* +1 would evict in layer 0 */
  bt_fix_take(&f, f.seq, &a1), bt_fix_take(&f, other, &b1);
  kva_cache_get_stats(f.c, &s1);
  KT_CHECK(bt_whole_same(&a0, &a1) && bt_whole_same(&b0, &b1) && kt_stats_equal(&s0, &s1, 0),
           "kva_seq_append_all refusing a SCORE sequence changed something");
  bt_whole_free(&a1), bt_whole_free(&b1);
  /* with room in every head, it appends */
  w[0] = 2.0f, w[1] = 2.0f; /* read through the pointer: 16 per head now */
  KT_STATUS(kva_seq_append_all(f.c, seqs, n, 2), KVA_OK);
  KT_CHECK(kva_seq_len(f.c, f.seq) == 9 && kva_seq_len(f.c, other) == 4, "append_all: lens %d %d, expected 9 4",
           kva_seq_len(f.c, f.seq), kva_seq_len(f.c, other));
  bt_whole_free(&a0), bt_whole_free(&b0);
  kva_cache_destroy(f.c);
}

/* A fork copies the empty slots; both then evolve on their own. */
static void bt_fork(void) {
  bt_fix f;
  float w[2], w2[2] = {0.5f, 1.0f};
  int child, l, g, j;
  bt_whole a, b, a2;
  kva_evict e;
  bt_fix_init(&f, 2, 3, 3, 64, KVA_INT4, 0, 41);
  bt_fix_empty(&f, w);
  KT_STATUS(kva_seq_fork(f.c, f.seq, &child), KVA_OK);
  bt_fix_take(&f, f.seq, &a), bt_fix_take(&f, child, &b);
  KT_CHECK(bt_whole_same(&a, &b), "a fork does not read back as its source (empty slots, rows, stats)");
  /* the child: other weights, a compress, an append; the parent stays */
  e = bt_fix_pol(&f, 8, w2, 0);
  KT_STATUS(kva_seq_set_evict(f.c, child, &e), KVA_OK);
  KT_STATUS(kva_seq_compress(f.c, child, 8), KVA_OK);
  KT_STATUS(bt_fix_step(&f, child, 2), KVA_OK);
  bt_fix_take(&f, f.seq, &a2);
  KT_CHECK(bt_whole_same(&a, &a2), "the source changed when its fork evicted and appended");
  KT_CHECK(kva_seq_len(f.c, child) == 6, "fork: len %d, expected 4 + 2", kva_seq_len(f.c, child));
  bt_whole_free(&b);
  bt_fix_take(&f, child, &b);
  for (l = 0; l < 2; l++)
    for (g = 0; g < 3; g++) {
      int held = 0;
      for (j = 0; j < b.len; j++) held += b.s[l].p[j * 3 + g] != KVA_POS_EMPTY;
      /* layer 0: 4 after the compress, the append evicts 2 for its own 2; layer 1: 4 + 2 */
      KT_CHECK(held == (l == 0 ? 4 : 6), "fork: layer %d head %d holds %d", l, g, held);
    }
  /* the parent appends too, still under its own weights (1, 0.5 of 8) */
  KT_STATUS(bt_fix_step(&f, f.seq, 1), KVA_OK);
  KT_CHECK(kva_seq_len(f.c, f.seq) == 8, "parent after the fork: len %d, expected 7 + 1", kva_seq_len(f.c, f.seq));
  bt_whole_free(&a), bt_whole_free(&b), bt_whole_free(&a2);
  kva_cache_destroy(f.c);
}

/* The rule's limits when the fullest head evicted nothing: kva_seq_len ==
   kva_seq_pos, yet other heads evicted (the sequence "has evicted tokens").
   Layer 0 (weight 4 of 4) keeps all 7 tokens, layer 1 (weight 0.5) keeps 2. */
static kva_status bt_newest_scorer(void *user, const kva_score_view *vw, float *scores) {
  int i;
  (void)user;
  for (i = 0; i < vw->n; i++) scores[i] = (float)vw->pos[i];
  return KVA_OK;
}

static void bt_len_eq_pos_fix(bt_fix *f, float *w) {
  kva_evict e;
  kva_seq_stats st;
  bt_fix_init(f, 2, 1, 4, 32, KVA_F32, 0, 51);
  w[0] = 4.0f, w[1] = 0.5f;
  e = bt_fix_pol(f, 4, w, 0);
  e.score = bt_newest_scorer; /* layer 1 keeps position 5, at slot 0 */
  KT_STATUS(kva_seq_set_evict(f->c, f->seq, &e), KVA_OK);
  KT_STATUS(bt_fix_step(f, f->seq, 6), KVA_OK); /* a prefill: nothing evictable */
  KT_STATUS(bt_fix_step(f, f->seq, 1), KVA_OK); /* layer 1 evicts 5 of 6 */
  KT_STATUS(kva_seq_get_stats(f->c, f->seq, &st), KVA_OK);
  KT_CHECK(kva_seq_len(f->c, f->seq) == 7 && kva_seq_pos(f->c, f->seq) == 7 && st.head_slots_empty == 5,
           "fixture: len %d pos %d empty %ld, expected 7 7 5", kva_seq_len(f->c, f->seq), kva_seq_pos(f->c, f->seq),
           st.head_slots_empty);
}

static void bt_len_eq_pos(void) {
  bt_fix f;
  float w[2];
  int32_t keep[1] = {0}, toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int l, win, op;
  bt_whole a, b;
  bt_len_eq_pos_fix(&f, w);
  /* attention with masks by position: the survivor of layer 1 sits at slot 0 */
  for (win = 0; win < 4; win++) {
    kva_attn a;
    float q[BT_FD], out[BT_FD], lse;
    char msg[200];
    double r;
    kt_attn_init(&a, 1, 1, BT_FD, 0);
    if (win == 1) a.window = 3;
    if (win == 2) a.alibi_max_bias = 2.0f;
    if (win == 3) a.chunk_size = 4;
    kt_fill(&f.r, q, BT_FD, -1.0f, 1.0f);
    for (l = 0; l < 2; l++) {
      bt_env e2;
      memset(&e2, 0, sizeof e2);
      e2.c = f.c, e2.L = 2, e2.G = 1, e2.H = 1, e2.D = BT_FD, e2.Dv = BT_FD, e2.bs = 4, e2.kt = e2.vt = KVA_F32;
      KT_STATUS(kva_attend_cache_lse(f.c, f.seq, l, &a, q, 1, out, &lse), KVA_OK);
      r = bt_ref_check(&e2, f.seq, 0, l, &a, q, 1, NULL, out, &lse, msg, sizeof msg);
      KT_CHECK(r <= 1.0,
               "len == pos with empty slots, layer %d, window %d alibi %g chunk %d: attention differs from fp64 over "
               "the held rows: %s",
               l, a.window, (double)a.alibi_max_bias, a.chunk_size, msg);
    }
  }
  kva_cache_destroy(f.c);
  /* truncate below the newest step, accept beyond it, publish: the sequence has evicted tokens */
  for (op = 0; op < 4; op++) {
    kva_status st, want = op == 3 ? KVA_OK : KVA_ERR_UNSUPPORTED;
    bt_len_eq_pos_fix(&f, w);
    bt_fix_take(&f, f.seq, &a);
    st = op == 0   ? kva_seq_truncate(f.c, f.seq, 2)
         : op == 1 ? kva_seq_accept(f.c, f.seq, 3, keep, 1)
         : op == 2 ? kva_seq_publish(f.c, f.seq, toks, 4, 0)
                   : kva_seq_truncate(f.c, f.seq, 6); /* within the step: works */
    bt_fix_take(&f, f.seq, &b);
    KT_CHECK(st == want, "len == pos with empty slots: %s returned %d, expected %d",
             op == 0 ? "truncate below the step" : op == 1 ? "accept beyond the step" : op == 2 ? "publish" : "truncate within the step",
             (int)st, (int)want);
    if (op < 3)
      KT_CHECK(bt_whole_same(&a, &b), "len == pos with empty slots: a refused %s changed the sequence",
               op == 0 ? "truncate" : op == 1 ? "accept" : "publish");
    else
      KT_CHECK(kva_seq_pos(f.c, f.seq) == 6 && kva_seq_len(f.c, f.seq) == 6, "truncate within the step: len %d pos %d, expected 6 6",
               kva_seq_len(f.c, f.seq), kva_seq_pos(f.c, f.seq));
    bt_whole_free(&a), bt_whole_free(&b);
    kva_cache_destroy(f.c);
  }
}

/* A pool too small: KVA_ERR_FULL changes nothing, kva_seq_fits agrees. */
static void bt_full(void) {
  int share;
  for (share = 0; share < 2; share++) {
    bt_fix f;
    float w[2] = {1.0f, 0.5f};
    kva_evict e;
    int hog = -1, blocks, i;
    bt_whole a, b;
    kva_cache_stats s0, s1;
    kva_fit fit;
    kva_status st;
    bt_fix_init(&f, 2, 2, 2, 12, KVA_F16, 0, 61 + (uint64_t)share);
    e = bt_fix_pol(&f, 8, w, share);
    e.rollback = 1;
    KT_STATUS(kva_seq_set_evict(f.c, f.seq, &e), KVA_OK);
    KT_STATUS(bt_fix_step(&f, f.seq, 8), KVA_OK); /* 4 blocks */
    KT_STATUS(kva_seq_new(f.c, &hog), KVA_OK);
    KT_STATUS(bt_fix_step(&f, hog, 16), KVA_OK); /* 8 blocks: the pool is full */
    /* rollback: +2 evicts nothing in layer 0 (4 per head in layer 1): 10 slots, one block more */
    fit = kva_seq_fits(f.c, f.seq, 2, &blocks);
    bt_fix_take(&f, f.seq, &a);
    kva_cache_get_stats(f.c, &s0);
    st = kva_seq_append(f.c, f.seq, 2);
    KT_STATUS(st, KVA_ERR_FULL);
    KT_CHECK(fit != KVA_FITS_NOW, "share %d: kva_seq_fits said NOW before KVA_ERR_FULL", share);
    bt_fix_take(&f, f.seq, &b);
    kva_cache_get_stats(f.c, &s1);
    KT_CHECK(bt_whole_same(&a, &b) && kt_stats_equal(&s0, &s1, 1) && s1.appends_failed == s0.appends_failed + 1,
             "share %d: KVA_ERR_FULL changed the sequence or the pool", share);
    bt_whole_free(&a), bt_whole_free(&b);
    fit = kva_seq_fits(f.c, f.seq, 0, &blocks);
    KT_CHECK(fit == KVA_FITS_NOW && blocks == 0, "fits(0): %d, %d blocks", (int)fit, blocks);
    KT_STATUS(kva_seq_free(f.c, hog), KVA_OK);
    for (i = 0; i < 6; i++) {
      fit = kva_seq_fits(f.c, f.seq, 3, &blocks);
      st = bt_fix_step(&f, f.seq, 3);
      KT_CHECK(fit != KVA_FITS_NOW || st == KVA_OK, "share %d step %d: fits NOW, append %d", share, i, (int)st);
      KT_CHECK(st == KVA_OK, "share %d step %d: append %d", share, i, (int)st);
    }
    kva_cache_destroy(f.c);
  }
}

static kva_status bt_head0_scorer(void *user, const kva_score_view *vw, float *scores) {
  int i;
  (void)user;
  for (i = 0; i < vw->n; i++) scores[i] = vw->kv_head == 0 ? 1.0f : -1.0f;
  return KVA_OK;
}

/* docs: memory is the fullest head's count */
static void bt_memory(void) {
  enum { L = 4, G = 2, B = 16, N = 64, BS = 8 };
  bt_fix f;
  float w[L];
  kva_evict e;
  kva_seq_stats st;
  kva_cache_stats cs;
  int l, want_len, empty = 0;
  double R = B, lo = R / 20.0, hi = 2.0 * R - lo;
  bt_fix_init(&f, L, G, BS, 64, KVA_F16, 0, 71);
  KT_STATUS(kva_pyramid_weights(L, B, 0, 20.0f, w), KVA_OK);
  e = bt_fix_pol(&f, 1 << 24, w, 0);
  KT_STATUS(kva_seq_set_evict(f.c, f.seq, &e), KVA_OK);
  KT_STATUS(bt_fix_step(&f, f.seq, N), KVA_OK);
  KT_STATUS(kva_seq_compress(f.c, f.seq, B), KVA_OK);
  want_len = (int)floor(hi); /* layer 0: 2B - B/20 */
  for (l = 0; l < L; l++) empty += G * (want_len - (int)floor(hi - l * (hi - lo) / (L - 1)));
  KT_STATUS(kva_seq_get_stats(f.c, f.seq, &st), KVA_OK);
  kva_cache_get_stats(f.c, &cs);
  KT_CHECK(kva_seq_len(f.c, f.seq) == want_len && st.tokens == want_len,
           "PyramidKV B %d: len %d (tokens %ld), expected floor(2B - B/20) = %d", B, kva_seq_len(f.c, f.seq), st.tokens,
           want_len);
  KT_CHECK(st.head_slots_empty == empty, "PyramidKV: head_slots_empty %ld, expected %d", st.head_slots_empty, empty);
  KT_CHECK(st.blocks == (want_len + BS - 1) / BS && st.bytes == (size_t)st.blocks * cs.block_bytes,
           "PyramidKV: %d blocks (%lu bytes), expected %d of %lu", st.blocks, (unsigned long)st.bytes,
           (want_len + BS - 1) / BS, (unsigned long)cs.block_bytes);
  KT_CHECK(cs.tokens_held == want_len, "cache tokens_held %ld, expected the slots %d", cs.tokens_held, want_len);
  kva_cache_destroy(f.c);

  /* Ada-KV: one head takes its layer's whole budget: n_kv_heads B slots */
  bt_fix_init(&f, 1, 4, 4, 64, KVA_F32, 0, 72);
  {
    int j, g, held[4] = {0, 0, 0, 0}, ok = 1;
    bt_snap sn;
    memset(&e, 0, sizeof e);
    e.kind = KVA_EVICT_SCORE, e.budget = 1 << 20, e.score = bt_head0_scorer, e.share_heads = 1;
    KT_STATUS(kva_seq_set_evict(f.c, f.seq, &e), KVA_OK);
    KT_STATUS(bt_fix_step(&f, f.seq, 40), KVA_OK);
    KT_STATUS(kva_seq_compress(f.c, f.seq, 8), KVA_OK);
    KT_STATUS(kva_seq_get_stats(f.c, f.seq, &st), KVA_OK);
    KT_CHECK(kva_seq_len(f.c, f.seq) == 32 && st.head_slots_empty == 96 && st.blocks == 8,
             "Ada-KV: len %d, head_slots_empty %ld, blocks %d; expected 4 x 8 = 32 slots, 96 empty, 8 blocks",
             kva_seq_len(f.c, f.seq), st.head_slots_empty, st.blocks);
    bt_snap_take(&sn, f.c, f.seq, 0, 4, BT_FD, BT_FD);
    for (j = 0; j < sn.len; j++)
      for (g = 0; g < 4; g++)
        if (sn.p[j * 4 + g] != KVA_POS_EMPTY) {
          held[g]++;
          if (g == 0 && sn.p[j * 4] < 8) ok = 0; /* the oldest 8 of head 0 go (ties to the older) */
        }
    KT_CHECK(ok && held[0] == 32 && held[1] == 0 && held[2] == 0 && held[3] == 0,
             "Ada-KV: heads hold %d %d %d %d, expected 32 0 0 0 (positions 8..39)", held[0], held[1], held[2], held[3]);
    bt_snap_free(&sn);
  }
  kva_cache_destroy(f.c);
}

/* kva_pyramid_weights against the docs' formula (fp64) */
static void bt_pyramid(void) {
  static const float betas[] = {1.0f, 1.5f, 2.0f, 20.0f, 100.0f, 1e6f};
  kt_rng r;
  float w[64], sent[4];
  int it, l, bad = 0;
  double worst = 0.0;
  kt_seed(&r, 81);
  for (it = 0; it < kt_iters(400); it++) {
    int L = it < 4 ? it + 1 : kt_int(&r, 1, 64);
    int budget = kt_int(&r, 0, 1) ? kt_int(&r, 1, 64) : kt_int(&r, 1, 100000);
    int nw = kt_int(&r, 0, 3) == 0 ? (kt_int(&r, 0, 1) ? 0 : budget - 1) : kt_int(&r, 0, budget - 1);
    float beta = kt_int(&r, 0, 2) ? betas[kt_int(&r, 0, 5)] : kt_uniform(&r, 1.0f, 50.0f);
    double R = budget - nw, lo = R / (double)beta, hi = 2.0 * R - lo, mean = 0.0;
    kva_status st = kva_pyramid_weights(L, budget, nw, beta, w);
    int ok = st == KVA_OK;
    for (l = 0; ok && l < L; l++) {
      double that = L == 1 ? R : hi - (double)l * (hi - lo) / (double)(L - 1), want = ((double)nw + that) / budget;
      double err = fabs((double)w[l] - want) / want;
      if (err > worst) worst = err;
      if (!(err <= 1e-6) || !(w[l] > 0.0f) || !(w[l] <= FLT_MAX) || (l > 0 && w[l] > w[l - 1])) ok = 0;
      mean += (double)w[l];
    }
    if (ok && !(fabs(mean / L - 1.0) <= 1e-6)) ok = 0;
    if (!ok && bad++ < 5)
      KT_CHECK(0, "kva_pyramid_weights(%d, %d, %d, %g): status %d, w[0] %.9g w[L-1] %.9g, mean %.9g", L, budget, nw,
               (double)beta, (int)st, (double)w[0], (double)w[L - 1], mean / L);
  }
  KT_CHECK(bad == 0, "kva_pyramid_weights: %d of the random argument sets off the docs' formula", bad);
  /* the docs' example and beta 1 */
  KT_STATUS(kva_pyramid_weights(4, 16, 4, 20.0f, w), KVA_OK);
  KT_CHECK((int)floor(16.0 * (double)w[0]) == 27 && (int)floor(16.0 * (double)w[3]) == 4,
           "docs example: floor(16 w[0]) %d (27), floor(16 w[3]) %d (4)", (int)floor(16.0 * (double)w[0]),
           (int)floor(16.0 * (double)w[3]));
  KT_STATUS(kva_pyramid_weights(5, 100, 10, 1.0f, w), KVA_OK);
  for (l = 0; l < 5; l++) KT_NEAR(w[l], 1.0, 1e-6);
  KT_STATUS(kva_pyramid_weights(1, 7, 3, 20.0f, w), KVA_OK);
  KT_NEAR(w[0], 1.0, 1e-6);
  /* argument errors: nothing written */
  {
    struct {
      int L, budget, nw;
      float beta;
      int null_w;
    } bads[] = {{0, 16, 4, 20.0f, 0},  {-1, 16, 4, 20.0f, 0}, {4, 0, 0, 20.0f, 0},   {4, -3, 0, 20.0f, 0},
                {4, 16, -1, 20.0f, 0}, {4, 16, 16, 20.0f, 0}, {4, 16, 4, 0.999f, 0}, {4, 16, 4, 0.0f, 0},
                {4, 16, 4, -2.0f, 0},  {4, 16, 4, 0.0f, 0},   {4, 16, 4, 20.0f, 1}};
    int i, n = (int)(sizeof bads / sizeof bads[0]);
    for (i = 0; i < n + 3; i++) {
      float beta = i < n ? bads[i].beta : i == n ? bt_nan() : i == n + 1 ? INFINITY : -INFINITY;
      int b = i < n ? i : 0;
      kt_fill_sentinel(sent, 4);
      KT_CHECK(kva_pyramid_weights(i < n ? bads[b].L : 4, i < n ? bads[b].budget : 16, i < n ? bads[b].nw : 4, beta,
                                   i < n && bads[b].null_w ? NULL : sent) == KVA_ERR_ARG &&
                   kt_all_sentinel(sent, 4),
               "kva_pyramid_weights bad argument set %d (beta %g) not refused, or weights written", i, (double)beta);
    }
  }
  if (bt_verbose()) fprintf(stderr, "  budgets: pyramid weights worst relative error %.3g\n", worst);
}

/* A demoted region (an earlier uniform policy) beside empty slots (a later
   per-layer one): attention is one softmax over the held and the demoted
   tokens, empty slots left out. */
static void bt_demoted_mix(void) {
  bt_fix f;
  float w[2] = {1.0f, 0.5f};
  kva_evict e;
  int nd, l, j, it;
  kva_seq_stats st;
  bt_fix_init(&f, 2, 2, 4, 64, KVA_F32, 1, 91);
  e = bt_fix_pol(&f, 8, NULL, 0);
  e.demote_dtype = KVA_INT8;
  KT_STATUS(kva_seq_set_evict(f.c, f.seq, &e), KVA_OK);
  KT_STATUS(bt_fix_step(&f, f.seq, 16), KVA_OK);
  KT_STATUS(kva_seq_compress(f.c, f.seq, 8), KVA_OK);
  nd = kva_seq_demoted(f.c, f.seq);
  KT_CHECK(nd == 8, "demoted %d, expected 8", nd);
  e = bt_fix_pol(&f, 8, w, 0); /* does not demote: the region stays as it is */
  KT_STATUS(kva_seq_set_evict(f.c, f.seq, &e), KVA_OK);
  KT_STATUS(kva_seq_compress(f.c, f.seq, 8), KVA_OK);
  KT_STATUS(bt_fix_step(&f, f.seq, 3), KVA_OK);
  KT_STATUS(kva_seq_get_stats(f.c, f.seq, &st), KVA_OK);
  /* layer 0: 8 + 3 - 8 go, layer 1: 4 + 3 - 4: len 5 + 3, layer 1's 4 empty slots in both heads */
  KT_CHECK(kva_seq_len(f.c, f.seq) == 8 && st.head_slots_empty == 8 && st.tokens_demoted == 8 &&
               st.tokens_evicted == 19 - 8 - 8,
           "demoted + empty: len %d empty %ld demoted %ld evicted %ld", kva_seq_len(f.c, f.seq), st.head_slots_empty,
           st.tokens_demoted, st.tokens_evicted);
  for (it = 0; it < 6; it++)
    for (l = 0; l < 2; l++) {
      kva_attn a;
      float q[3 * 2 * BT_FD], out[3 * 2 * BT_FD], lse[3 * 2];
      double wo[3 * 2 * BT_FD], wl[3 * 2], vmax = 0.0, r;
      bt_snap sn, all;
      bt_ref_in in;
      char msg[200];
      int n_q = kt_int(&f.r, 1, 3);
      kt_attn_init(&a, 2, 2, BT_FD, 0);
      if (it & 1) a.window = kt_int(&f.r, 1, 12), a.n_sink = kt_int(&f.r, 0, 2);
      if (it & 2) a.non_causal = 1;
      if (it >= 4) a.sink_logits = w, a.softcap = 3.0f;
      kt_fill(&f.r, q, (size_t)n_q * 2 * BT_FD, -2.0f, 2.0f);
      KT_STATUS(kva_attend_cache_lse(f.c, f.seq, l, &a, q, n_q, out, lse), KVA_OK);
      bt_snap_take(&sn, f.c, f.seq, l, 2, BT_FD, BT_FD);
      all = sn;
      all.len = sn.len + nd;
      all.p = KT_ALLOC(int32_t, all.len * 2);
      all.k = KT_ALLOC(float, all.len * 2 * BT_FD);
      all.v = KT_ALLOC(float, all.len * 2 * BT_FD);
      memcpy(all.p, sn.p, sizeof(int32_t) * (size_t)sn.len * 2);
      memcpy(all.k, sn.k, sizeof(float) * (size_t)sn.len * 2 * BT_FD);
      memcpy(all.v, sn.v, sizeof(float) * (size_t)sn.len * 2 * BT_FD);
      for (j = 0; j < nd; j++)
        KT_STATUS(kva_seq_read_demoted(f.c, f.seq, l, j, all.k + (size_t)(sn.len + j) * 2 * BT_FD,
                                       all.v + (size_t)(sn.len + j) * 2 * BT_FD, all.p + (size_t)(sn.len + j) * 2),
                  KVA_OK);
      for (j = 0; j < all.len * 2; j++)
        if (all.p[j] != KVA_POS_EMPTY) vmax = fmax(vmax, ref_max_abs_f(all.v + (size_t)j * BT_FD, BT_FD));
      memset(&in, 0, sizeof in);
      {
        double *qd = ref_dup_f(q, (size_t)n_q * 2 * BT_FD);
        in.s = &all, in.a = &a, in.q = qd, in.n_q = n_q, in.pos_next = kva_seq_pos(f.c, f.seq);
        bt_ref(&in, wo, wl, NULL);
        free(qd);
      }
      r = bt_cmp(out, lse, wo, wl, NULL, n_q, 2, 2, BT_FD, BT_FD, vmax, NULL, msg, sizeof msg);
      KT_CHECK(r <= 1.0, "demoted + empty slots, layer %d, window %d nc %d sinks %d: %s", l, a.window, a.non_causal,
               a.sink_logits != NULL, msg);
      bt_snap_free(&sn), bt_snap_free(&all);
    }
  kva_cache_destroy(f.c);
}

void test_budgets(void) {
  memset(&bt_n, 0, sizeof bt_n);
  bt_pyramid();
  bt_args();
  bt_after_empty();
  bt_append_all();
  bt_fork();
  bt_len_eq_pos();
  bt_full();
  bt_memory();
  bt_demoted_mix();
  bt_random();
  if (bt_verbose())
    fprintf(stderr,
            "  budgets: %ld cases, %ld appends (%ld evicting incl. compresses), %ld compresses, %ld full, %ld forks, "
            "%ld trees, %ld truncates, %ld attention, %ld batches, %ld partial selections (%ld rows skipped, %ld "
            "matched with empty blocks first), %ld gqa, %ld scorer failures, %ld policies refused, %ld int-values "
            "bounds, %ld views of empty heads; worst err/tol %.3g\n",
            bt_n.cases, bt_n.appends, bt_n.evicting, bt_n.compresses, bt_n.fulls, bt_n.forks, bt_n.trees, bt_n.truncs,
            bt_n.attn, bt_n.batch, bt_n.sel_partial, bt_n.sel_skipped, bt_n.sel_variant_inf, bt_n.gqa, bt_n.fails,
            bt_n.pol_refused, bt_n.iv, bt_n.zero_heads, bt_n.worst);
}
