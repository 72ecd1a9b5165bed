/* test_evict.c - eviction (KVA_EVICT_WINDOW with sinks, KVA_EVICT_H2O).
 *
 * Written from the documented behaviour (docs/API.md, "Eviction"), not from
 * kvattn.h's code.  An independent model keeps,
 * per (layer, KV head), the held positions and (for H2O) the accumulated
 * attention of every token, computed in double from the K/V the test stored
 * and the queries it passed; after every step the held set read back through
 * kva_seq_read (per-head positions; slot order unspecified) must equal the
 * model's, every slot's K/V must be the one stored at that position, and
 * kva_attend_cache must equal an fp64 attention over exactly the held keys.
 * F32 caches throughout, so read-backs compare bit for bit. */
#include "kvattn.h"
#include "harness.h"
#include "ref.h"

/* ------------------------------------------------------------------------ */
/* The model                                                                */

typedef struct {
  int L, H, G, D, Dv, P; /* P: positions capacity */
  float *K, *V;          /* [L][P][G][D], [L][P][G][Dv] as stored */
  int32_t *held;         /* [L][G][P] held positions, unordered */
  int *nheld;            /* [L][G] */
  double *score;         /* [L][G][P] accumulated attention, by position */
  kva_evict pol, pol_next;
  int pos;               /* next position */
  int last_n;            /* the latest append */
  int ambiguous;         /* near-tie victim choices adopted from the library */
  int hh;                /* heavy-hitter structure in K/Q */
  char *heavy;           /* [P] */
} ev_model;

static ev_model *ev_new(int L, int H, int G, int D, int Dv, int P) {
  ev_model *m = (ev_model *)kt_xmalloc(sizeof(ev_model));
  memset(m, 0, sizeof *m);
  m->L = L; m->H = H; m->G = G; m->D = D; m->Dv = Dv; m->P = P;
  m->K = KT_ALLOC(float, (size_t)L * P * G * D);
  m->V = KT_ALLOC(float, (size_t)L * P * G * Dv);
  m->held = KT_ALLOC(int32_t, (size_t)L * G * P);
  m->nheld = KT_ALLOC(int, (size_t)L * G);
  m->score = KT_ALLOC(double, (size_t)L * G * P);
  m->heavy = KT_ALLOC(char, (size_t)P);
  memset(m->nheld, 0, sizeof(int) * (size_t)L * G);
  memset(m->score, 0, sizeof(double) * (size_t)L * G * P);
  memset(m->heavy, 0, (size_t)P);
  return m;
}

static ev_model *ev_clone(const ev_model *s) {
  ev_model *m = ev_new(s->L, s->H, s->G, s->D, s->Dv, s->P);
  size_t L = (size_t)s->L, P = (size_t)s->P, G = (size_t)s->G;
  memcpy(m->K, s->K, sizeof(float) * L * P * G * (size_t)s->D);
  memcpy(m->V, s->V, sizeof(float) * L * P * G * (size_t)s->Dv);
  memcpy(m->held, s->held, sizeof(int32_t) * L * G * P);
  memcpy(m->nheld, s->nheld, sizeof(int) * L * G);
  memcpy(m->score, s->score, sizeof(double) * L * G * P);
  memcpy(m->heavy, s->heavy, P);
  m->pol = s->pol; m->pol_next = s->pol_next; m->pos = s->pos;
  m->last_n = 0; m->hh = s->hh;
  return m;
}

static void ev_free(ev_model *m) {
  free(m->K); free(m->V); free(m->held); free(m->nheld); free(m->score); free(m->heavy);
  free(m);
}

static float *ev_k(ev_model *m, int l, int p, int g) { return m->K + (((size_t)l * m->P + p) * m->G + g) * m->D; }
static float *ev_v(ev_model *m, int l, int p, int g) { return m->V + (((size_t)l * m->P + p) * m->G + g) * m->Dv; }
static double *ev_sc(ev_model *m, int l, int g, int p) { return m->score + ((size_t)l * m->G + g) * m->P + p; }

static int ev_evictable(const ev_model *m, int32_t p) {
  if (p < m->pol.n_sink) return 0;
  return m->pol.kind != KVA_EVICT_H2O || p < m->pos - m->pol.n_recent;
}

/* victim a before b: H2O lowest score first, ties to the oldest; WINDOW oldest */
static int ev_before(ev_model *m, int l, int g, int32_t a, int32_t b) {
  if (m->pol.kind == KVA_EVICT_H2O) {
    double sa = *ev_sc(m, l, g, a), sb = *ev_sc(m, l, g, b);
    if (sa != sb) return sa < sb;
  }
  return a < b;
}

/* Apply the policy for an append of n (model side). Records, per (l,g), the
   score of the last victim (the boundary) for near-tie resolution. */
static void ev_append(ev_model *m, int n, double *boundary /* [L*G] */) {
  int l, g, i;
  if (m->pol_next.kind == KVA_EVICT_H2O && m->pol.kind != KVA_EVICT_H2O)
    memset(m->score, 0, sizeof(double) * (size_t)m->L * m->G * m->P);
  m->pol = m->pol_next;
  for (l = 0; l < m->L; l++)
    for (g = 0; g < m->G; g++) {
      int32_t *h = m->held + ((size_t)l * m->G + g) * m->P;
      int *nh = &m->nheld[l * m->G + g];
      boundary[l * m->G + g] = -1.0;
      if (m->pol.kind != KVA_EVICT_NONE)
        while (*nh + n > m->pol.budget) {
          int best = -1;
          for (i = 0; i < *nh; i++)
            if (ev_evictable(m, h[i]) && (best < 0 || ev_before(m, l, g, h[i], h[best]))) best = i;
          if (best < 0) break;
          boundary[l * m->G + g] = *ev_sc(m, l, g, h[best]);
          h[best] = h[--*nh];
        }
      for (i = 0; i < n; i++) {
        h[(*nh)++] = m->pos + i;
        *ev_sc(m, l, g, m->pos + i) = 0.0;
      }
    }
  m->pos += n;
  m->last_n = n;
}

static int ev_cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* Compare the model's held sets with the library's.  boundary NULL: no
   near-tie tolerance.  Checks K/V read-back of every slot against what was
   stored at its position (only when `stored`: the newest tokens are written
   after this check). */
static void ev_check_held(ev_model *m, kva_cache *c, int seq, const double *boundary, int stored,
                          const char *what) {
  int l, g, slot, i, len = kva_seq_len(c, seq), P = m->P;
  int32_t *lib = KT_ALLOC(int32_t, (size_t)m->G * (len > 0 ? len : 1));
  int32_t *a = KT_ALLOC(int32_t, (size_t)P), *b = KT_ALLOC(int32_t, (size_t)P);
  int32_t *pos = KT_ALLOC(int32_t, (size_t)m->G);
  float *k = KT_ALLOC(float, (size_t)m->G * m->D), *v = KT_ALLOC(float, (size_t)m->G * m->Dv);
  KT_CHECK(kva_seq_pos(c, seq) == m->pos, "%s: kva_seq_pos %d, model %d", what, kva_seq_pos(c, seq), m->pos);
  KT_CHECK(len == m->nheld[0], "%s: kva_seq_len %d, model holds %d", what, len, m->nheld[0]);
  if (len != m->nheld[0]) goto done;
  for (l = 0; l < m->L; l++) {
    for (slot = 0; slot < len; slot++) {
      kva_status st = kva_seq_read(c, seq, l, slot, k, v, pos);
      KT_STATUS(st, KVA_OK);
      for (g = 0; g < m->G; g++) {
        lib[(size_t)g * len + slot] = pos[g];
        if (pos[g] < 0 || pos[g] >= m->pos) {
          KT_CHECK(0, "%s: layer %d slot %d head %d reads position %d (next %d)", what, l, slot, g, pos[g], m->pos);
          continue;
        }
        if (stored || pos[g] < m->pos - m->last_n) {
          KT_CHECK(memcmp(k + (size_t)g * m->D, ev_k(m, l, pos[g], g), sizeof(float) * m->D) == 0 &&
                       memcmp(v + (size_t)g * m->Dv, ev_v(m, l, pos[g], g), sizeof(float) * m->Dv) == 0,
                   "%s: layer %d slot %d head %d (position %d): K/V read back differ from those stored", what, l,
                   slot, g, pos[g]);
        }
      }
    }
    for (g = 0; g < m->G; g++) {
      int32_t *h = m->held + ((size_t)l * m->G + g) * P;
      int same = 1;
      memcpy(a, h, sizeof(int32_t) * len);
      memcpy(b, lib + (size_t)g * len, sizeof(int32_t) * len);
      qsort(a, (size_t)len, sizeof(int32_t), ev_cmp_i32);
      qsort(b, (size_t)len, sizeof(int32_t), ev_cmp_i32);
      for (i = 0; i < len; i++) same &= a[i] == b[i];
      for (i = 1; i < len; i++)
        KT_CHECK(b[i] != b[i - 1], "%s: layer %d head %d holds position %d twice", what, l, g, b[i]);
      if (same) continue;
      /* near ties at the victim boundary: every position in the symmetric
         difference must score within a relative 1e-4 of the boundary */
      if (boundary && boundary[l * m->G + g] >= 0.0 && m->pol.kind == KVA_EVICT_H2O) {
        double bd = boundary[l * m->G + g], tol = 1e-4 * (bd > 1e-3 ? bd : 1e-3);
        int ia = 0, ib = 0, ok = 1;
        while (ia < len || ib < len) {
          int32_t p;
          if (ib >= len || (ia < len && a[ia] < b[ib])) p = a[ia++];
          else if (ia >= len || b[ib] < a[ia]) p = b[ib++];
          else { ia++; ib++; continue; }
          if (fabs(*ev_sc(m, l, g, p) - bd) > tol) ok = 0;
        }
        if (ok) {
          m->ambiguous++;
          memcpy(h, b, sizeof(int32_t) * len); /* adopt the library's choice */
          continue;
        }
      }
      KT_CHECK(0, "%s: layer %d head %d held set differs from the model (pos %d, %d held)", what, l, g, m->pos,
               len);
      if (kt_fail_prints <= 3) {
        printf("    model:");
        for (i = 0; i < len; i++) printf(" %d(%.4g)", a[i], *ev_sc(m, l, g, a[i]));
        printf("\n    lib:  ");
        for (i = 0; i < len; i++) printf(" %d(%.4g)", b[i], *ev_sc(m, l, g, b[i]));
        printf("\n");
      }
      memcpy(h, b, sizeof(int32_t) * len); /* resync so one bug reports once */
    }
  }
done:
  free(lib); free(a); free(b); free(pos); free(k); free(v);
}

/* Fill K/V of the newest n positions of layer l and store them. */
static void ev_store(ev_model *m, kva_cache *c, int seq, int l, int n, kt_rng *r) {
  int i, g;
  float *k = KT_ALLOC(float, (size_t)n * m->G * m->D), *v = KT_ALLOC(float, (size_t)n * m->G * m->Dv);
  for (i = 0; i < n; i++) {
    int p = m->pos - n + i;
    if (m->hh && l == 0) m->heavy[p] = (char)(kt_unit(r) < 0.15);
    for (g = 0; g < m->G; g++) {
      float *kk = k + ((size_t)i * m->G + g) * m->D, *vv = v + ((size_t)i * m->G + g) * m->Dv;
      kt_fill(r, kk, (size_t)m->D, -1.0f, 1.0f);
      kt_fill(r, vv, (size_t)m->Dv, -1.0f, 1.0f);
      if (m->hh && m->heavy[p]) kk[0] = 5.0f + (float)g; /* heavy hitters: large along dim 0 */
      memcpy(ev_k(m, l, p, g), kk, sizeof(float) * m->D);
      memcpy(ev_v(m, l, p, g), vv, sizeof(float) * m->Dv);
    }
  }
  KT_STATUS(kva_store(c, seq, l, k, v, n), KVA_OK);
  free(k); free(v);
}

/* Attend the newest nq queries of layer l; compare with fp64 attention over
   the model's held keys (== the library's after ev_check_held); accumulate
   H2O scores when H2O is the policy.  out2: if non-NULL, a copy of the output. */
static void ev_attend(ev_model *m, kva_cache *c, int seq, int l, const kva_attn *at, int nq, kt_rng *r,
                      float *out2, const char *what) {
  int H = m->H, G = m->G, D = m->D, Dv = m->Dv, grp = H / G, i, h, j, d, g;
  ref_attn_cfg cfg = ref_cfg(at);
  float *q = KT_ALLOC(float, (size_t)nq * H * D), *out = KT_ALLOC(float, (size_t)nq * H * Dv);
  double *want = KT_ALLOC(double, (size_t)nq * H * Dv);
  double *s = KT_ALLOC(double, (size_t)m->P);
  char *vis = KT_ALLOC(char, (size_t)m->P);
  size_t where;
  double err;
  kt_fill(r, q, (size_t)nq * H * D, -1.0f, 1.0f);
  if (m->hh)
    for (i = 0; i < nq * H; i++) q[(size_t)i * D] = 1.5f; /* every query likes the heavy hitters */
  KT_STATUS(kva_attend_cache(c, seq, l, at, q, nq, out), KVA_OK);
  for (i = 0; i < nq; i++) {
    int32_t qp = m->pos - nq + i;
    for (h = 0; h < H; h++) {
      const float *qh = q + ((size_t)i * H + h) * D;
      double *o = want + ((size_t)i * H + h) * Dv, mx = -INFINITY, sum = 0.0;
      int32_t *hp;
      int nh;
      g = h / grp;
      hp = m->held + ((size_t)l * G + g) * m->P;
      nh = m->nheld[l * G + g];
      for (d = 0; d < Dv; d++) o[d] = 0.0;
      for (j = 0; j < nh; j++) {
        const float *kj = ev_k(m, l, hp[j], g);
        double dot = 0.0;
        vis[j] = (char)ref_visible(&cfg, qp, hp[j]);
        if (!vis[j]) continue;
        for (d = 0; d < D; d++) dot += (double)qh[d] * (double)kj[d];
        s[j] = dot * cfg.scale;
        if (s[j] > mx) mx = s[j];
      }
      for (j = 0; j < nh; j++)
        if (vis[j]) { s[j] = exp(s[j] - mx); sum += s[j]; }
      for (j = 0; j < nh; j++) {
        const float *vj;
        double p;
        if (!vis[j]) continue;
        p = s[j] / sum;
        vj = ev_v(m, l, hp[j], g);
        for (d = 0; d < Dv; d++) o[d] += p * (double)vj[d];
        if (m->pol.kind == KVA_EVICT_H2O) *ev_sc(m, l, g, hp[j]) += p;
      }
    }
  }
  err = ref_max_err(out, want, (size_t)nq * H * Dv, &where);
  KT_CHECK(err <= 1e-5, "%s: layer %d attention at pos %d differs from fp64 over the held keys by %.3g (elem %lu)",
           what, l, m->pos, err, (unsigned long)where);
  if (out2) memcpy(out2, out, sizeof(float) * (size_t)nq * H * Dv);
  free(q); free(out); free(want); free(s); free(vis);
}

/* One step: append n, check the held set, store and attend every layer. */
static void ev_step(ev_model *m, kva_cache *c, int seq, const kva_attn *at, int n, kt_rng *r, const char *what) {
  double *bd = KT_ALLOC(double, (size_t)m->L * m->G);
  int l;
  kva_status st = kva_seq_append(c, seq, n);
  KT_STATUS(st, KVA_OK);
  if (st != KVA_OK) { free(bd); return; }
  ev_append(m, n, bd);
  ev_check_held(m, c, seq, bd, 0, what);
  for (l = 0; l < m->L; l++) {
    ev_store(m, c, seq, l, n, r);
    ev_attend(m, c, seq, l, at, n, r, NULL, what);
  }
  free(bd);
}

static kva_cache *ev_cache(int L, int G, int D, int Dv, int bs, int n_blocks) {
  kva_cache_desc cd;
  kva_cache *c = NULL;
  memset(&cd, 0, sizeof cd);
  cd.n_layers = L; cd.n_kv_heads = G; cd.head_dim = D; cd.v_dim = Dv;
  cd.block_size = bs; cd.n_blocks = n_blocks; cd.dtype = KVA_F32;
  KT_STATUS(kva_cache_create(&cd, &c), KVA_OK);
  return c;
}

static kva_attn ev_attn(int H, int G, int D, int Dv, int window, int n_sink) {
  kva_attn a;
  memset(&a, 0, sizeof a);
  a.n_heads = H; a.n_kv_heads = G; a.head_dim = D; a.v_dim = Dv;
  a.window = window; a.n_sink = n_sink; a.n_threads = 1;
  return a;
}

static kva_evict ev_pol(kva_evict_kind k, int budget, int n_sink, int n_recent) {
  kva_evict e;
  memset(&e, 0, sizeof e);
  e.kind = k; e.budget = budget; e.n_sink = n_sink; e.n_recent = n_recent;
  return e;
}

static void ev_set(ev_model *m, kva_cache *c, int seq, kva_evict e) {
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  m->pol_next = e;
}

static void ev_stats_consistent(kva_cache *c, const char *what) {
  kva_cache_stats st;
  kva_cache_get_stats(c, &st);
  KT_CHECK(st.blocks_used + st.blocks_cached + st.blocks_free == st.n_blocks,
           "%s: used %d + cached %d + free %d != %d", what, st.blocks_used, st.blocks_cached, st.blocks_free,
           st.n_blocks);
  KT_CHECK(st.blocks_used >= 0 && st.blocks_free >= 0, "%s: negative block counts", what);
}

/* ------------------------------------------------------------------------ */
/* WINDOW, n_sink 0: lossless against an unevicted cache under the mask     */

static void test_window_lossless(int T, int prefill) {
  enum { L = 2, H = 4, G = 2, D = 16, Dv = 8, W = 7 };
  int steps = kt_quick ? 12 : 40, s, l, P, budget = W + T - 1;
  kt_rng r1, r2;
  kva_cache *ca = ev_cache(L, G, D, Dv, 4, 64), *cb = ev_cache(L, G, D, Dv, 4, 256);
  kva_attn at = ev_attn(H, G, D, Dv, W, 0);
  ev_model *ma, *mb;
  int sa = -1, sb = -1;
  float *oa = KT_ALLOC(float, (size_t)(prefill > T ? prefill : T) * H * Dv);
  float *ob = KT_ALLOC(float, (size_t)(prefill > T ? prefill : T) * H * Dv);
  char what[64];
  sprintf(what, "window lossless T=%d", T);
  kt_begin(what);
  P = prefill + steps * T + 1;
  ma = ev_new(L, H, G, D, Dv, P);
  mb = ev_new(L, H, G, D, Dv, P);
  KT_STATUS(kva_seq_new(ca, &sa), KVA_OK);
  KT_STATUS(kva_seq_new(cb, &sb), KVA_OK);
  ev_set(ma, ca, sa, ev_pol(KVA_EVICT_WINDOW, budget, 0, 0));
  for (s = -1; s < steps; s++) {
    int n = s < 0 ? prefill : T;
    double bd[L * G];
    size_t where;
    if (n == 0) continue;
    KT_STATUS(kva_seq_append(ca, sa, n), KVA_OK);
    KT_STATUS(kva_seq_append(cb, sb, n), KVA_OK);
    ev_append(ma, n, bd);
    ev_append(mb, n, bd);
    ev_check_held(ma, ca, sa, NULL, 0, what);
    KT_CHECK(kva_seq_len(ca, sa) <= (n > budget ? n : budget), "%s: len %d > budget %d", what,
             kva_seq_len(ca, sa), budget);
    for (l = 0; l < L; l++) {
      double err;
      kt_seed(&r1, (uint64_t)(1000 + s * 10 + l));
      r2 = r1;
      ev_store(ma, ca, sa, l, n, &r1);
      ev_store(mb, cb, sb, l, n, &r2);
      ev_attend(ma, ca, sa, l, &at, n, &r1, oa, what);
      ev_attend(mb, cb, sb, l, &at, n, &r2, ob, what);
      {
        double *obd = ref_dup_f(ob, (size_t)n * H * Dv);
        err = ref_max_err(oa, obd, (size_t)n * H * Dv, &where);
        free(obd);
      }
      KT_CHECK(err <= 1e-5, "%s: step %d layer %d evicted vs unevicted cache differ by %.3g", what, s, l, err);
    }
  }
  ev_free(ma); ev_free(mb);
  free(oa); free(ob);
  kva_cache_destroy(ca);
  kva_cache_destroy(cb);
}

/* ------------------------------------------------------------------------ */
/* WINDOW with sinks: held == sinks + newest, attention over exactly them   */

static void test_window_sinks(void) {
  enum { L = 2, H = 6, G = 3, D = 8, Dv = 12 };
  int steps = kt_quick ? 25 : 120, s;
  kt_rng r;
  kva_cache *c = ev_cache(L, G, D, Dv, 4, 64);
  kva_attn at = ev_attn(H, G, D, Dv, 0, 0);
  ev_model *m = ev_new(L, H, G, D, Dv, 4 * steps + 64);
  int seq = -1;
  kt_begin("window sinks");
  kt_seed(&r, 77);
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  ev_set(m, c, seq, ev_pol(KVA_EVICT_WINDOW, 11, 3, 5 /* ignored */));
  for (s = 0; s < steps; s++) {
    int n = s == 0 ? 6 : (s % 7 == 3 ? 14 /* > budget: held whole */ : kt_int(&r, 1, 3));
    ev_step(m, c, seq, &at, n, &r, "window sinks");
    /* explicit: held = first n_sink positions + the newest (budget - n_sink), or everything of a big chunk */
    {
      int len = kva_seq_len(c, seq), pos = kva_seq_pos(c, seq), want;
      want = pos <= 11 ? pos : (n > 11 - 3 ? 3 + n : 11);
      KT_CHECK(len == want, "window sinks: step %d holds %d, want %d", s, len, want);
    }
    if (s == steps / 2) { /* change the budget mid-stream: applies from the next append */
      ev_set(m, c, seq, ev_pol(KVA_EVICT_WINDOW, 9, 4, 0));
      ev_check_held(m, c, seq, NULL, 1, "window sinks (after set)");
      break;
    }
  }
  for (s = 0; s < steps / 2; s++) ev_step(m, c, seq, &at, kt_int(&r, 1, 2), &r, "window sinks 2");
  ev_check_held(m, c, seq, NULL, 1, "window sinks final");
  ev_free(m);
  kva_cache_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* H2O against the model's own score tracking                                */

/* H2O over several kernel tiles of keys, with a long prefill */
static void test_h2o_big(void) {
  enum { L = 1, H = 4, G = 2, D = 8, Dv = 8 };
  int steps = kt_quick ? 10 : 60, s, seq = -1;
  kt_rng r;
  kva_cache *c = ev_cache(L, G, D, Dv, 16, 64);
  kva_attn at = ev_attn(H, G, D, Dv, 0, 0);
  ev_model *m = ev_new(L, H, G, D, Dv, 300 + 8 * steps);
  kt_begin("h2o big");
  kt_seed(&r, 31337);
  m->hh = 1;
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  ev_set(m, c, seq, ev_pol(KVA_EVICT_H2O, 170, 4, 16));
  ev_step(m, c, seq, &at, 200, &r, "h2o big"); /* prefill larger than the budget: held whole */
  for (s = 0; s < steps; s++) ev_step(m, c, seq, &at, s % 10 == 9 ? 7 : 1, &r, "h2o big");
  KT_CHECK(m->ambiguous <= 2, "h2o big: %d near-tie adoptions", m->ambiguous);
  ev_free(m);
  kva_cache_destroy(c);
}

static void test_h2o(int hh, int G, int bs) {
  enum { L = 2, H = 4, D = 8, Dv = 8 };
  int steps = kt_quick ? 40 : 200, s;
  kt_rng r;
  kva_cache *c = ev_cache(L, G, D, Dv, bs, 128);
  kva_attn at = ev_attn(H, G, D, Dv, 0, 0);
  ev_model *m = ev_new(L, H, G, D, Dv, 4 * steps + 64);
  int seq = -1;
  char what[64];
  sprintf(what, "h2o hh=%d G=%d bs=%d", hh, G, bs);
  kt_begin(what);
  kt_seed(&r, (uint64_t)(500 + hh * 7 + G * 3 + bs));
  m->hh = hh;
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  /* phase 1: WINDOW (attention made now must not count for H2O) */
  ev_set(m, c, seq, ev_pol(KVA_EVICT_WINDOW, 30, 2, 0));
  ev_step(m, c, seq, &at, 12, &r, what); /* prefill */
  for (s = 0; s < 25; s++) ev_step(m, c, seq, &at, 1, &r, what);
  /* phase 2: H2O; an attend between set and append does not count */
  ev_set(m, c, seq, ev_pol(KVA_EVICT_H2O, 20, 2, 4));
  ev_attend(m, c, seq, 0, &at, 1, &r, NULL, what); /* model: policy still WINDOW */
  for (s = 0; s < steps; s++) {
    int n = s % 11 == 5 ? kt_int(&r, 2, 6) : 1;
    ev_step(m, c, seq, &at, n, &r, what);
    if (s == steps / 2) ev_set(m, c, seq, ev_pol(KVA_EVICT_H2O, 14, 3, 3)); /* shrink: scores carry on */
  }
  /* H2O -> NONE -> H2O: the old scores are forgotten, NONE's attention does not count */
  ev_set(m, c, seq, ev_pol(KVA_EVICT_NONE, 0, 0, 0));
  for (s = 0; s < 6; s++) ev_step(m, c, seq, &at, 1, &r, what);
  ev_set(m, c, seq, ev_pol(KVA_EVICT_H2O, 12, 2, 2));
  for (s = 0; s < steps / 4; s++) ev_step(m, c, seq, &at, 1, &r, what);
  /* a window mask on top of H2O (masked keys add 0) */
  at.window = 6;
  at.n_sink = 1;
  for (s = 0; s < steps / 4; s++) ev_step(m, c, seq, &at, s % 5 == 0 ? 3 : 1, &r, what);
  ev_check_held(m, c, seq, NULL, 1, what);
  if (getenv("KVA_EVICT_DEBUG")) printf("%s: %d near-tie adoptions\n", what, m->ambiguous);
  if (m->ambiguous > (hh ? 2 : 10))
    KT_CHECK(0, "%s: %d near-tie adoptions (too many to be float noise)", what, m->ambiguous);
  ev_free(m);
  kva_cache_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* Memory stays bounded                                                      */

static void test_bounded(kva_evict_kind kind) {
  enum { G = 1, D = 8, H = 2, BS = 16, B = 50 };
  int steps = kt_quick ? 1000 : 10000, s, seq = -1, maxb = (B + BS - 1) / BS + 1, worst_b = 0, worst_len = 0;
  kva_cache *c = ev_cache(1, G, D, D, BS, 12);
  kva_attn at = ev_attn(H, G, D, D, 0, 0);
  kva_evict e = ev_pol(kind, B, 4, kind == KVA_EVICT_H2O ? 8 : 0);
  float k[G * D], v[G * D], q[H * D], o[H * D];
  kva_cache_stats st;
  kt_rng r;
  int32_t pos[G];
  kt_begin(kind == KVA_EVICT_H2O ? "bounded h2o" : "bounded window");
  kt_seed(&r, 99);
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  if (kind == KVA_EVICT_H2O) steps /= 4;
  for (s = 0; s < steps; s++) {
    kva_status rc = kva_seq_append(c, seq, 1);
    KT_STATUS(rc, KVA_OK);
    if (rc != KVA_OK) break;
    kt_fill(&r, k, G * D, -1.0f, 1.0f);
    kt_fill(&r, v, G * D, -1.0f, 1.0f);
    kt_fill(&r, q, H * D, -1.0f, 1.0f);
    KT_STATUS(kva_store(c, seq, 0, k, v, 1), KVA_OK);
    KT_STATUS(kva_attend_cache(c, seq, 0, &at, q, 1, o), KVA_OK);
    kva_cache_get_stats(c, &st);
    if (st.blocks_used > worst_b) worst_b = st.blocks_used;
    if (kva_seq_len(c, seq) > worst_len) worst_len = kva_seq_len(c, seq);
  }
  KT_CHECK(worst_b <= maxb, "max blocks_used %d > ceil(B/bs)+1 = %d", worst_b, maxb);
  KT_CHECK(worst_len <= B, "max kva_seq_len %d > budget %d", worst_len, B);
  KT_CHECK(kva_seq_pos(c, seq) == steps, "pos %d after %d steps", kva_seq_pos(c, seq), steps);
  kva_cache_get_stats(c, &st);
  KT_CHECK(st.tokens_held == kva_seq_len(c, seq), "tokens_held %ld vs len %d", st.tokens_held, kva_seq_len(c, seq));
  ev_stats_consistent(c, "bounded");
  if (kind == KVA_EVICT_WINDOW) { /* held = 0..3 and the newest 46 */
    int i, n = kva_seq_len(c, seq) > 0 ? kva_seq_len(c, seq) : 0, bad = 0;
    char *seen = KT_ALLOC(char, (size_t)n + 1);
    memset(seen, 0, (size_t)n + 1);
    for (i = 0; i < n; i++) {
      int idx;
      KT_STATUS(kva_seq_read(c, seq, 0, i, NULL, NULL, pos), KVA_OK);
      idx = pos[0] < 4 ? pos[0] : pos[0] - (steps - (B - 4)) + 4;
      if (idx < 0 || idx >= n || seen[idx]) bad++;
      else seen[idx] = 1;
    }
    KT_CHECK(bad == 0, "bounded window: held set is not sinks + newest (%d bad)", bad);
    free(seen);
  }
  kva_cache_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* Fork: the child's eviction leaves the parent intact                       */

typedef struct {
  int len;
  float *k, *v;
  int32_t *pos;
} ev_snap;

static void ev_snapshot(kva_cache *c, int seq, int L, int G, int D, int Dv, ev_snap *sn) {
  int l, i;
  sn->len = kva_seq_len(c, seq);
  sn->k = KT_ALLOC(float, (size_t)L * (sn->len + 1) * G * D);
  sn->v = KT_ALLOC(float, (size_t)L * (sn->len + 1) * G * Dv);
  sn->pos = KT_ALLOC(int32_t, (size_t)L * (sn->len + 1) * G);
  for (l = 0; l < L; l++)
    for (i = 0; i < sn->len; i++) {
      size_t at = (size_t)l * sn->len + i;
      KT_STATUS(kva_seq_read(c, seq, l, i, sn->k + at * G * D, sn->v + at * G * Dv, sn->pos + at * G), KVA_OK);
    }
}

static int ev_snap_same(kva_cache *c, int seq, int L, int G, int D, int Dv, const ev_snap *a) {
  ev_snap b;
  int same;
  ev_snapshot(c, seq, L, G, D, Dv, &b);
  same = a->len == b.len && kt_same_bits(a->k, b.k, (size_t)L * a->len * G * D) &&
         kt_same_bits(a->v, b.v, (size_t)L * a->len * G * Dv) &&
         memcmp(a->pos, b.pos, sizeof(int32_t) * (size_t)L * a->len * G) == 0;
  free(b.k); free(b.v); free(b.pos);
  return same;
}

static void test_fork(kva_evict_kind kind) {
  enum { L = 2, H = 4, G = 2, D = 8, Dv = 8 };
  kt_rng r;
  kva_cache *c = ev_cache(L, G, D, Dv, 4, 96);
  kva_attn at = ev_attn(H, G, D, Dv, 0, 0);
  ev_model *mp = ev_new(L, H, G, D, Dv, 400), *mc;
  int par = -1, ch = -1, s;
  ev_snap snap;
  kva_cache_stats st;
  const char *what = kind == KVA_EVICT_H2O ? "fork h2o" : "fork window";
  kt_begin(what);
  kt_seed(&r, 4242 + (uint64_t)kind);
  mp->hh = 1;
  KT_STATUS(kva_seq_new(c, &par), KVA_OK);
  if (kind == KVA_EVICT_H2O) ev_set(mp, c, par, ev_pol(KVA_EVICT_H2O, 24, 2, 3));
  ev_step(mp, c, par, &at, 10, &r, what);
  for (s = 0; s < 21; s++) ev_step(mp, c, par, &at, 1, &r, what); /* 31 tokens (H2O: 24), partial tail */
  KT_STATUS(kva_seq_fork(c, par, &ch), KVA_OK);
  mc = ev_clone(mp);
  if (kind == KVA_EVICT_WINDOW) ev_set(mc, c, ch, ev_pol(KVA_EVICT_WINDOW, 13, 2, 0));
  else ev_set(mc, c, ch, ev_pol(KVA_EVICT_H2O, 15, 1, 3));
  ev_snapshot(c, par, L, G, D, Dv, &snap);
  for (s = 0; s < 30; s++) {
    ev_step(mc, c, ch, &at, s % 6 == 0 ? 3 : 1, &r, what);
    KT_CHECK(ev_snap_same(c, par, L, G, D, Dv, &snap), "%s: parent changed after child step %d", what, s);
    kva_cache_get_stats(c, &st);
    KT_CHECK(st.tokens_held == (long)kva_seq_len(c, par) + kva_seq_len(c, ch), "%s: tokens_held %ld != %d + %d",
             what, st.tokens_held, kva_seq_len(c, par), kva_seq_len(c, ch));
    KT_CHECK(st.n_seqs == 2, "%s: n_seqs %d", what, st.n_seqs);
    ev_stats_consistent(c, what);
  }
  ev_check_held(mp, c, par, NULL, 1, what);
  /* the parent goes on with its own policy and (H2O) its own scores */
  for (s = 0; s < 15; s++) ev_step(mp, c, par, &at, 1, &r, what);
  ev_check_held(mc, c, ch, NULL, 1, what);
  KT_STATUS(kva_seq_free(c, ch), KVA_OK);
  ev_check_held(mp, c, par, NULL, 1, what);
  for (s = 0; s < 5; s++) ev_step(mp, c, par, &at, 1, &r, what);
  kva_cache_get_stats(c, &st);
  KT_CHECK(st.tokens_held == kva_seq_len(c, par) && st.n_seqs == 1, "%s: after free: tokens_held %ld, n_seqs %d",
           what, st.tokens_held, st.n_seqs);
  ev_stats_consistent(c, what);
  free(snap.k); free(snap.v); free(snap.pos);
  ev_free(mp); ev_free(mc);
  kva_cache_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* A failed append applies no eviction                                       */

static void test_failed_append(void) {
  enum { L = 1, H = 2, G = 1, D = 4, Dv = 4 };
  kt_rng r;
  kva_cache *c = ev_cache(L, G, D, Dv, 4, 4); /* 16 token slots */
  kva_attn at = ev_attn(H, G, D, Dv, 0, 0);
  ev_model *m = ev_new(L, H, G, D, Dv, 64), *m2 = ev_new(L, H, G, D, Dv, 64);
  int a = -1, b = -1, s, len0, pos0;
  ev_snap snap;
  kva_cache_stats st0, st1;
  kt_begin("failed append");
  kt_seed(&r, 5);
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  KT_STATUS(kva_seq_new(c, &b), KVA_OK);
  ev_step(m2, c, b, &at, 8, &r, "failed append (hog)"); /* 2 blocks */
  ev_set(m, c, a, ev_pol(KVA_EVICT_WINDOW, 8, 2, 0));
  for (s = 0; s < 10; s++) ev_step(m, c, a, &at, 1, &r, "failed append"); /* 8 held in 2 blocks */
  len0 = kva_seq_len(c, a);
  pos0 = kva_seq_pos(c, a);
  ev_snapshot(c, a, L, G, D, Dv, &snap);
  kva_cache_get_stats(c, &st0);
  /* 2 sinks + 9 new = 11 tokens = 3 blocks; only 2 are A's and none is free */
  KT_STATUS(kva_seq_append(c, a, 9), KVA_ERR_FULL);
  kva_cache_get_stats(c, &st1);
  KT_CHECK(kva_seq_len(c, a) == len0 && kva_seq_pos(c, a) == pos0, "len %d pos %d after a failed append (was %d %d)",
           kva_seq_len(c, a), kva_seq_pos(c, a), len0, pos0);
  KT_CHECK(ev_snap_same(c, a, L, G, D, Dv, &snap), "read-back changed after a failed append");
  KT_CHECK(st0.blocks_used == st1.blocks_used && st0.blocks_free == st1.blocks_free &&
               st0.tokens_held == st1.tokens_held,
           "stats changed after a failed append");
  ev_check_held(m, c, a, NULL, 1, "failed append");
  /* a fitting append still works afterwards */
  ev_step(m, c, a, &at, 3, &r, "failed append (then ok)");
  free(snap.k); free(snap.v); free(snap.pos);
  ev_free(m); ev_free(m2);
  kva_cache_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* Argument errors and unsupported combinations                              */

static void test_args(void) {
  kva_cache *c = ev_cache(1, 1, 4, 4, 4, 16);
  kva_evict e;
  int seq = -1, s2 = -1, freed = -1, i;
  int32_t toks[16];
  kt_begin("evict args");
  for (i = 0; i < 16; i++) toks[i] = i;
  KT_STATUS(kva_seq_new(c, &seq), KVA_OK);
  KT_STATUS(kva_seq_new(c, &freed), KVA_OK);
  KT_STATUS(kva_seq_free(c, freed), KVA_OK);
  e = ev_pol(KVA_EVICT_WINDOW, 0, 0, 0);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_ARG);
  e = ev_pol(KVA_EVICT_WINDOW, -3, 0, 0);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_ARG);
  e = ev_pol(KVA_EVICT_WINDOW, 4, 5, 0);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_ARG);
  e = ev_pol(KVA_EVICT_WINDOW, 4, 4, 100); /* n_recent ignored by WINDOW */
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  e = ev_pol(KVA_EVICT_H2O, 0, 0, 0);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_ARG);
  e = ev_pol(KVA_EVICT_H2O, 6, 3, 4);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_ARG);
  e = ev_pol(KVA_EVICT_H2O, 7, 3, 4);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  e = ev_pol(KVA_EVICT_NONE, -1, 99, 99); /* NONE ignores the other fields */
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  KT_STATUS(kva_seq_set_evict(c, seq, NULL), KVA_ERR_ARG);
  KT_STATUS(kva_seq_set_evict(NULL, seq, &e), KVA_ERR_ARG);
  e = ev_pol(KVA_EVICT_WINDOW, 4, 0, 0);
  KT_STATUS(kva_seq_set_evict(c, 12345, &e), KVA_ERR_SEQ);
  KT_STATUS(kva_seq_set_evict(c, -1, &e), KVA_ERR_SEQ);
  KT_STATUS(kva_seq_set_evict(c, freed, &e), KVA_ERR_SEQ);
  e = ev_pol(KVA_EVICT_WINDOW, 0, 0, 0); /* argument errors before sequence errors */
  KT_STATUS(kva_seq_set_evict(c, 12345, &e), KVA_ERR_ARG);
  KT_STATUS(kva_seq_set_evict(c, 12345, NULL), KVA_ERR_ARG);
  /* a policy that has not evicted yet does not block truncate */
  e = ev_pol(KVA_EVICT_WINDOW, 6, 1, 0);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  KT_STATUS(kva_seq_append(c, seq, 5), KVA_OK);
  {
    float kk[20];
    memset(kk, 0, sizeof kk);
    KT_STATUS(kva_store(c, seq, 0, kk, kk, 5), KVA_OK);
  }
  KT_STATUS(kva_seq_truncate(c, seq, 4), KVA_OK);
  KT_CHECK(kva_seq_len(c, seq) == 4 && kva_seq_pos(c, seq) == 4, "truncate before any eviction: len %d pos %d",
           kva_seq_len(c, seq), kva_seq_pos(c, seq));
  /* now evict */
  KT_STATUS(kva_seq_append(c, seq, 4), KVA_OK);
  KT_CHECK(kva_seq_len(c, seq) == 6 && kva_seq_pos(c, seq) == 8, "after evicting: len %d pos %d",
           kva_seq_len(c, seq), kva_seq_pos(c, seq));
  /* below the newest step (slots 2..5): refused; within it: allowed, positions follow */
  KT_STATUS(kva_seq_truncate(c, seq, 1), KVA_ERR_UNSUPPORTED);
  KT_STATUS(kva_seq_publish(c, seq, toks, 4, 0), KVA_ERR_UNSUPPORTED);
  KT_CHECK(kva_seq_len(c, seq) == 6 && kva_seq_pos(c, seq) == 8, "after refused truncate: len %d pos %d",
           kva_seq_len(c, seq), kva_seq_pos(c, seq));
  KT_STATUS(kva_seq_truncate(c, seq, 3), KVA_OK);
  KT_CHECK(kva_seq_len(c, seq) == 3 && kva_seq_pos(c, seq) == 5, "truncate within the newest step after eviction: "
           "len %d pos %d, want 3 and 5", kva_seq_len(c, seq), kva_seq_pos(c, seq));
  KT_STATUS(kva_seq_truncate(c, seq, 2), KVA_ERR_UNSUPPORTED); /* that truncate ended the step */
  KT_STATUS(kva_seq_append(c, seq, 3), KVA_OK);
  e.rollback = 2;
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_ERR_ARG);
  e.rollback = 0;
  /* policy off again: still a sequence that has evicted */
  e = ev_pol(KVA_EVICT_NONE, 0, 0, 0);
  KT_STATUS(kva_seq_set_evict(c, seq, &e), KVA_OK);
  KT_STATUS(kva_seq_append(c, seq, 1), KVA_OK);
  KT_STATUS(kva_seq_truncate(c, seq, 2), KVA_ERR_UNSUPPORTED);
  /* a fork of an evicted sequence has evicted too */
  KT_STATUS(kva_seq_fork(c, seq, &s2), KVA_OK);
  KT_STATUS(kva_seq_truncate(c, s2, 2), KVA_ERR_UNSUPPORTED);
  KT_STATUS(kva_seq_publish(c, s2, toks, 4, 0), KVA_ERR_UNSUPPORTED);
  kva_cache_destroy(c);
}

/* Speculative decoding under eviction with rollback = 1: each step appends
   n_draft tokens, stores and attends them, then keeps the first k (a
   truncate). A twin cache appends only the accepted tokens. A rejected draft
   must cost no held token: after every step both hold the same number of
   tokens, and under WINDOW the same positions and values, and attend alike
   (bit for bit). Without rollback the drafts do cost tokens (checked too, so
   the test shows what the flag changes). */
static void test_rollback(void) {
  kt_rng r;
  int it;
  kt_begin("evict: speculative steps rolled back under WINDOW / H2O (rollback = 1)");
  kt_seed(&r, 0x20BB);
  for (it = 0; it < kt_iters(40); it++) {
    int G = kt_int(&r, 1, 2), Hh = G * kt_int(&r, 1, 2), D = kt_int(&r, 1, 24), bs = kt_int(&r, 1, 8);
    int budget = kt_int(&r, 4, 40), h2o = it % 3 == 2, lossy = it % 5 == 4, step, ci, seq[2] = {-1, -1};
    kva_cache_desc d;
    kva_cache *c[2] = {NULL, NULL};
    kva_evict e;
    kva_attn a;
    memset(&d, 0, sizeof d);
    d.n_layers = 1, d.n_kv_heads = G, d.head_dim = D, d.block_size = bs, d.n_blocks = 2 * (budget + 16) / bs + 8;
    d.dtype = KVA_F32;
    memset(&e, 0, sizeof e);
    e.kind = h2o ? KVA_EVICT_H2O : KVA_EVICT_WINDOW;
    e.budget = budget;
    e.n_sink = kt_int(&r, 0, 2);
    e.n_recent = h2o ? 2 : 0;
    e.rollback = !lossy;
    memset(&a, 0, sizeof a);
    a.n_heads = Hh, a.n_kv_heads = G, a.head_dim = D, a.n_threads = 1;
    for (ci = 0; ci < 2; ci++)
      if (kva_cache_create(&d, &c[ci]) != KVA_OK || kva_seq_new(c[ci], &seq[ci]) != KVA_OK ||
          kva_seq_set_evict(c[ci], seq[ci], &e) != KVA_OK)
        KT_CHECK(0, "setup");
    for (step = 0; step < 30 && c[0] && c[1]; step++) {
      int n_draft = step == 0 ? kt_int(&r, 1, budget) : kt_int(&r, 1, 6), keep = kt_int(&r, 1, n_draft), t;
      int len0 = kva_seq_len(c[0], seq[0]), len1;
      float *kv = KT_ALLOC(float, (size_t)n_draft * G * D), *q = KT_ALLOC(float, (size_t)n_draft * Hh * D);
      float *o0 = KT_ALLOC(float, (size_t)Hh * D), *o1 = KT_ALLOC(float, (size_t)Hh * D);
      kt_fill(&r, kv, (size_t)n_draft * G * D, -1, 1);
      kt_fill(&r, q, (size_t)n_draft * Hh * D, -1, 1);
      /* the speculative cache: draft, attend the whole draft, keep `keep` */
      KT_STATUS(kva_seq_append(c[0], seq[0], n_draft), KVA_OK);
      KT_STATUS(kva_store(c[0], seq[0], 0, kv, kv, n_draft), KVA_OK);
      {
        float *ob = KT_ALLOC(float, (size_t)n_draft * Hh * D);
        KT_STATUS(kva_attend_cache(c[0], seq[0], 0, &a, q, n_draft, ob), KVA_OK);
        free(ob);
      }
      KT_STATUS(kva_seq_truncate(c[0], seq[0], kva_seq_len(c[0], seq[0]) - (n_draft - keep)), KVA_OK);
      /* the twin: only the accepted tokens */
      KT_STATUS(kva_seq_append(c[1], seq[1], keep), KVA_OK);
      KT_STATUS(kva_store(c[1], seq[1], 0, kv, kv, keep), KVA_OK);
      len1 = kva_seq_len(c[1], seq[1]);
      KT_CHECK(kva_seq_pos(c[0], seq[0]) == kva_seq_pos(c[1], seq[1]), "positions differ after rollback: %d vs %d",
               kva_seq_pos(c[0], seq[0]), kva_seq_pos(c[1], seq[1]));
      if (!lossy) {
        KT_CHECK(kva_seq_len(c[0], seq[0]) == len1,
                 "a rolled-back draft cost held tokens: %d held, %d without drafts (budget %d, %s, step %d)",
                 kva_seq_len(c[0], seq[0]), len1, budget, h2o ? "H2O" : "WINDOW", step);
        KT_CHECK(len1 <= budget + keep, "held %d > budget %d + step %d", len1, budget, keep);
      } else if (len0 + n_draft > budget) {
        KT_CHECK(kva_seq_len(c[0], seq[0]) < len1 || len0 + keep <= budget || kva_seq_len(c[0], seq[0]) == budget,
                 "without rollback a draft should cost tokens once over budget (held %d vs %d)",
                 kva_seq_len(c[0], seq[0]), len1);
      }
      if (!lossy && !h2o && kva_seq_len(c[0], seq[0]) == len1) { /* WINDOW: the same tokens, the same answers */
        float k0[64], k1[64], v0[64], v1[64];
        int32_t p0[2], p1[2];
        int sl, same = 1;
        for (sl = 0; sl < len1; sl++) {
          KT_STATUS(kva_seq_read(c[0], seq[0], 0, sl, k0, v0, p0), KVA_OK);
          KT_STATUS(kva_seq_read(c[1], seq[1], 0, sl, k1, v1, p1), KVA_OK);
          same &= kt_same_bits(k0, k1, (size_t)G * D) && kt_same_bits(v0, v1, (size_t)G * D) && p0[0] == p1[0];
        }
        KT_CHECK(same, "WINDOW with rollback: held tokens differ from the twin's (step %d)", step);
        /* one more decode token in both: same output */
        for (t = 0; t < 2; t++) {
          KT_STATUS(kva_seq_append(c[t], seq[t], 1), KVA_OK);
          KT_STATUS(kva_store(c[t], seq[t], 0, kv, kv, 1), KVA_OK);
          KT_STATUS(kva_attend_cache(c[t], seq[t], 0, &a, q, 1, t ? o1 : o0), KVA_OK);
        }
        KT_CHECK(kt_same_bits(o0, o1, (size_t)Hh * D), "WINDOW with rollback: attention differs from the twin's");
      }
      free(kv), free(q), free(o0), free(o1);
    }
    kva_cache_destroy(c[0]);
    kva_cache_destroy(c[1]);
  }
}

/* A sequence record is reused after kva_seq_free: the new id starts with no
   policy, whatever the freed one had (active or set for its next append). */
static void test_policy_not_inherited(void) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_evict e;
  int a = -1, b = -1, k;
  kt_begin("evict: a new sequence does not inherit a freed one's policy");
  memset(&d, 0, sizeof d);
  d.n_layers = 1, d.n_kv_heads = 1, d.head_dim = 4, d.block_size = 4, d.n_blocks = 32, d.max_seqs = 1;
  if (kva_cache_create(&d, &c) != KVA_OK) {
    KT_CHECK(0, "cache");
    return;
  }
  for (k = 0; k < 2; k++) { /* k 0: the policy was active; k 1: only set for the next append */
    memset(&e, 0, sizeof e);
    e.kind = KVA_EVICT_WINDOW, e.budget = 4;
    KT_CHECK(kva_seq_new(c, &a) == KVA_OK, "seq");
    KT_CHECK(kva_seq_set_evict(c, a, &e) == KVA_OK, "set_evict");
    if (k == 0) KT_CHECK(kva_seq_append(c, a, 2) == KVA_OK, "append");
    KT_CHECK(kva_seq_free(c, a) == KVA_OK, "free");
    KT_CHECK(kva_seq_new(c, &b) == KVA_OK, "seq again");
    KT_CHECK(kva_seq_append(c, b, 8) == KVA_OK && kva_seq_append(c, b, 8) == KVA_OK, "append");
    KT_CHECK(kva_seq_len(c, b) == 16, "case %d: %d tokens held, want 16 (no eviction)", k, kva_seq_len(c, b));
    KT_CHECK(kva_seq_free(c, b) == KVA_OK, "free");
  }
  kva_cache_destroy(c);
}

void test_evict(void) {
  test_policy_not_inherited();
  test_rollback();
  test_window_lossless(1, 0);
  test_window_lossless(1, 20);
  test_window_lossless(3, 12);
  test_window_lossless(4, 25);
  test_window_sinks();
  test_h2o(1, 2, 4);
  test_h2o(1, 1, 16);
  test_h2o(0, 4, 3);
  test_h2o_big();
  test_bounded(KVA_EVICT_WINDOW);
  test_bounded(KVA_EVICT_H2O);
  test_fork(KVA_EVICT_WINDOW);
  test_fork(KVA_EVICT_H2O);
  test_failed_append();
  test_args();
}
