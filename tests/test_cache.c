/* test_cache.c - the paged KV cache (KVA_CACHE_KV, F32 and F16 storage).
 *
 * A shadow model holds what every slot must read back: the stored floats
 * (F32) or the same floats rounded to binary16 by ref.h's own encoder (F16),
 * zeros for slots appended but never stored.  Read-back is compared exactly;
 * kva_attend_cache is compared with ref_attend over the shadow at the
 * kva_attend tolerance (2e-5 * (1 + max|v|) on outputs): the shadow K/V are
 * exactly the values the library holds, so storage adds no error.
 *
 * Out of scope here (not tested): fork, publish/prefix, eviction, truncate,
 * kva_seq_fits, LATENT, INT8/FP8/BF16 storage, layer_dtype. */
#include "kvattn.h"
#include "harness.h"
#include "ref.h"

#define TOL_OUT_REL 2e-5

/* ------------------------------------------------------------------------ */
/* A counting allocator for alloc_fn/free_fn.                               */

typedef struct {
  long n_alloc, n_free;
  long fail_after; /* < 0: never fail; else the (fail_after+1)-th call fails */
  long calls;
  size_t live, total;
  int bad_align, bad_size, bad_ptr;
} kt_counting;

static void *cnt_alloc(size_t size, size_t align, void *user) {
  kt_counting *s = (kt_counting *)user;
  size_t hdr = sizeof(void *) + sizeof(size_t), al = align;
  char *raw;
  uintptr_t p;
  s->calls++;
  if (s->fail_after >= 0 && s->calls > s->fail_after) return NULL;
  if (al & (al - 1)) s->bad_align++; /* not a power of two */
  if (al < 16) al = 16;
  raw = (char *)malloc(size + al + hdr);
  if (!raw) return NULL;
  p = ((uintptr_t)(raw + hdr) + (al - 1)) & ~(uintptr_t)(al - 1);
  memcpy((char *)p - hdr, &raw, sizeof raw);
  memcpy((char *)p - sizeof(size_t), &size, sizeof size);
  s->n_alloc++;
  s->live += size;
  s->total += size;
  return (void *)p;
}

static void cnt_free(void *ptr, size_t size, void *user) {
  kt_counting *s = (kt_counting *)user;
  size_t hdr = sizeof(void *) + sizeof(size_t), was;
  char *raw;
  if (!ptr) return;
  memcpy(&raw, (char *)ptr - hdr, sizeof raw);
  memcpy(&was, (char *)ptr - sizeof(size_t), sizeof was);
  if (was != size) s->bad_size++;
  if (was > s->live) s->bad_ptr++;
  else s->live -= was;
  s->n_free++;
  free(raw);
}

static void counting_init(kt_counting *s) {
  memset(s, 0, sizeof *s);
  s->fail_after = -1;
}

/* ------------------------------------------------------------------------ */

static kva_dtype eff_k(kva_dtype k) { return k == KVA_DTYPE_DEFAULT ? KVA_F16 : k; }
static kva_dtype eff_v(kva_dtype k, kva_dtype v) { return v == KVA_DTYPE_DEFAULT ? eff_k(k) : v; }
static float round_to(kva_dtype t, float x) { return t == KVA_F16 ? ref_round_f16(x) : x; }
static size_t dt_bytes(kva_dtype t) { return t == KVA_F32 ? 4u : 2u; }
static const char *dt_name(kva_dtype t) {
  switch (t) {
    case KVA_DTYPE_DEFAULT: return "DEFAULT";
    case KVA_F32: return "F32";
    case KVA_F16: return "F16";
    default: return "other";
  }
}

static void desc_init(kva_cache_desc *d, int L, int G, int D, int Dv, int bs, int n_blocks,
                      kva_dtype kd, kva_dtype vd) {
  memset(d, 0, sizeof *d);
  d->kind = KVA_CACHE_KV;
  d->n_layers = L;
  d->n_kv_heads = G;
  d->head_dim = D;
  d->v_dim = Dv;
  d->block_size = bs;
  d->n_blocks = n_blocks;
  d->dtype = kd;
  d->v_dtype = vd;
  d->layer_dtype = NULL;
}

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

/* ------------------------------------------------------------------------ */
/* Shadow sequences                                                         */

typedef struct {
  int id, len, last, alive;
  int stored[4]; /* per layer: the newest tokens of the step stored (attending needs all `last`) */
  float *k, *v;  /* [L][cap][G][D], [L][cap][G][Dv] */
} sseq;

/* a new step of n tokens (0: the step ended): nothing of it stored yet */
static void sseq_step(sseq *q, int n) {
  q->last = n;
  memset(q->stored, 0, sizeof q->stored);
}

typedef struct {
  kva_cache *c;
  int L, G, D, Dv, bs, cap, n_blocks;
  kva_dtype kt, vt;
  const char *label;
} cshape;

static float *sk(const cshape *s, sseq *q, int l, int t) {
  return q->k + (((size_t)l * s->cap + t) * s->G) * s->D;
}
static float *sv(const cshape *s, sseq *q, int l, int t) {
  return q->v + (((size_t)l * s->cap + t) * s->G) * s->Dv;
}

static void sseq_reset(const cshape *s, sseq *q, int id) {
  q->id = id;
  q->len = 0;
  sseq_step(q, 0);
  q->alive = 1;
  memset(q->k, 0, sizeof(float) * (size_t)s->L * s->cap * s->G * s->D);
  memset(q->v, 0, sizeof(float) * (size_t)s->L * s->cap * s->G * s->Dv);
}

/* stats invariants for caches without sharing: every live token's block is
   "used", nothing is "cached" */
static void check_stats(const cshape *s, const sseq *seqs, int n) {
  kva_cache_stats st;
  long held = 0;
  int used = 0, live = 0, i;
  memset(&st, 0, sizeof st);
  kva_cache_get_stats(s->c, &st);
  for (i = 0; i < n; i++)
    if (seqs[i].alive) {
      live++;
      held += seqs[i].len;
      used += ceil_div(seqs[i].len, s->bs);
    }
  KT_CHECK(st.n_blocks == s->n_blocks, "%s: stats n_blocks %d, want %d", s->label, st.n_blocks,
           s->n_blocks);
  KT_CHECK(st.blocks_used + st.blocks_cached + st.blocks_free == st.n_blocks,
           "%s: used %d + cached %d + free %d != n_blocks %d", s->label, st.blocks_used,
           st.blocks_cached, st.blocks_free, st.n_blocks);
  KT_CHECK(st.blocks_used == used, "%s: blocks_used %d, want %d", s->label, st.blocks_used, used);
  KT_CHECK(st.blocks_cached == 0, "%s: blocks_cached %d without publishing", s->label,
           st.blocks_cached);
  KT_CHECK(st.n_seqs == live, "%s: n_seqs %d, want %d", s->label, st.n_seqs, live);
  KT_CHECK(st.tokens_held == held, "%s: tokens_held %ld, want %ld", s->label, st.tokens_held, held);
  for (i = 0; i < n; i++)
    if (seqs[i].alive) {
      KT_CHECK(kva_seq_len(s->c, seqs[i].id) == seqs[i].len, "%s: kva_seq_len %d, want %d",
               s->label, kva_seq_len(s->c, seqs[i].id), seqs[i].len);
      KT_CHECK(kva_seq_pos(s->c, seqs[i].id) == seqs[i].len, "%s: kva_seq_pos %d, want %d",
               s->label, kva_seq_pos(s->c, seqs[i].id), seqs[i].len);
    }
}

/* every slot of every layer of q reads back exactly as the shadow says */
static void check_readback(const cshape *s, sseq *q) {
  float *k = KT_ALLOC(float, (size_t)s->G * s->D), *v = KT_ALLOC(float, (size_t)s->G * s->Dv);
  int32_t *pos = KT_ALLOC(int32_t, s->G);
  int l, t, i, bad_k = 0, bad_v = 0, bad_p = 0, first_t = -1, first_l = -1;
  for (l = 0; l < s->L; l++)
    for (t = 0; t < q->len; t++) {
      kva_status st = kva_seq_read(s->c, q->id, l, t, k, v, pos);
      const float *wk = sk(s, q, l, t), *wv = sv(s, q, l, t);
      int ok_k = 1, ok_v = 1, ok_p = 1;
      KT_CHECK(st == KVA_OK, "%s: kva_seq_read(seq %d, layer %d, slot %d) = %d", s->label, q->id,
               l, t, (int)st);
      for (i = 0; i < s->G * s->D; i++) ok_k &= k[i] == wk[i];
      for (i = 0; i < s->G * s->Dv; i++) ok_v &= v[i] == wv[i];
      for (i = 0; i < s->G; i++) ok_p &= pos[i] == t;
      if ((!ok_k || !ok_v || !ok_p) && first_t < 0) {
        first_t = t;
        first_l = l;
        for (i = 0; i < s->G * s->D; i++)
          if (k[i] != wk[i]) {
            KT_CHECK(0, "%s: seq %d layer %d slot %d: k[%d] = %.9g, want %.9g (%s)", s->label,
                     q->id, l, t, i, (double)k[i], (double)wk[i], dt_name(s->kt));
            break;
          }
        for (i = 0; i < s->G * s->Dv; i++)
          if (v[i] != wv[i]) {
            KT_CHECK(0, "%s: seq %d layer %d slot %d: v[%d] = %.9g, want %.9g (%s)", s->label,
                     q->id, l, t, i, (double)v[i], (double)wv[i], dt_name(s->vt));
            break;
          }
        for (i = 0; i < s->G; i++)
          if (pos[i] != t) {
            KT_CHECK(0, "%s: seq %d layer %d slot %d: pos[%d] = %ld", s->label, q->id, l, t, i,
                     (long)pos[i]);
            break;
          }
      }
      bad_k += !ok_k;
      bad_v += !ok_v;
      bad_p += !ok_p;
    }
  KT_CHECK(bad_k == 0 && bad_v == 0 && bad_p == 0,
           "%s: seq %d read-back: %d slots with wrong K, %d wrong V, %d wrong pos (first layer %d "
           "slot %d; len %d bs %d)",
           s->label, q->id, bad_k, bad_v, bad_p, first_l, first_t, q->len, s->bs);
  free(k);
  free(v);
  free(pos);
}

/* stores random K/V into the newest n slots of layer l, updating the shadow */
static void store_random(kt_rng *r, const cshape *s, sseq *q, int l, int n, float amp) {
  float *k = KT_ALLOC(float, (size_t)n * s->G * s->D), *v = KT_ALLOC(float, (size_t)n * s->G * s->Dv);
  int t, i;
  kva_status st;
  kt_fill(r, k, (size_t)n * s->G * s->D, -amp, amp);
  kt_fill(r, v, (size_t)n * s->G * s->Dv, -2.0f * amp, 2.0f * amp);
  st = kva_store(s->c, q->id, l, k, v, n);
  KT_CHECK(st == KVA_OK, "%s: kva_store(seq %d, layer %d, n %d) = %d (len %d, last append %d)",
           s->label, q->id, l, n, (int)st, q->len, q->last);
  if (st == KVA_OK && n > q->stored[l]) q->stored[l] = n;
  if (st == KVA_OK)
    for (t = 0; t < n; t++) {
      float *wk = sk(s, q, l, q->len - n + t), *wv = sv(s, q, l, q->len - n + t);
      for (i = 0; i < s->G * s->D; i++) wk[i] = round_to(s->kt, k[(size_t)t * s->G * s->D + i]);
      for (i = 0; i < s->G * s->Dv; i++) wv[i] = round_to(s->vt, v[(size_t)t * s->G * s->Dv + i]);
    }
  free(k);
  free(v);
}

/* kva_attend_cache for the newest n_q tokens vs the reference over the shadow */
static void check_attend(kt_rng *r, const cshape *s, sseq *q, int l, int n_q) {
  kva_attn a;
  ref_attn_cfg c;
  int H = s->G * kt_int(r, 1, 3);
  size_t nq, no, nk = (size_t)q->len * s->G * s->D, nv = (size_t)q->len * s->G * s->Dv, where = 0;
  float *qv, *out, sinks[3 * 64];
  double *rq, *rk, *rv, *ro, err, tol;
  kva_status st;
  kt_attn_init(&a, H, s->G, s->D, (s->Dv == s->D && kt_int(r, 0, 1)) ? 0 : s->Dv);
  switch (kt_int(r, 0, 5)) {
    case 0: a.window = kt_int(r, 1, q->len); break;
    case 1:
      a.window = kt_int(r, 1, q->len);
      a.n_sink = kt_int(r, 1, 5);
      break;
    case 2: a.softcap = 5.0f; break;
    case 3: a.scale = kt_uniform(r, 0.1f, 1.0f); break;
    default: break;
  }
  if (kt_int(r, 0, 4) == 0) a.non_causal = 1; /* the newest queries see every held key */
  if (kt_int(r, 0, 4) == 0) a.alibi_max_bias = 8.0f;
  if (kt_int(r, 0, 4) == 0) a.chunk_size = kt_int(r, 1, q->len + 2);
  if (kt_int(r, 0, 4) == 0) {
    int h;
    for (h = 0; h < H; h++) sinks[h] = kt_uniform(r, -3.0f, 3.0f);
    a.sink_logits = sinks;
  }
  a.n_threads = kt_int(r, 0, 2);
  c = ref_cfg(&a);
  nq = (size_t)n_q * H * s->D;
  no = (size_t)n_q * H * s->Dv;
  qv = KT_ALLOC(float, nq);
  out = KT_ALLOC(float, no + 4);
  kt_fill(r, qv, nq, -1.0f, 1.0f);
  kt_fill_sentinel(out, no + 4);
  st = kva_attend_cache(s->c, q->id, l, &a, qv, n_q, out);
  if (n_q > 0 && q->stored[l] < q->last) { /* the step is not stored in this layer: refused, out untouched */
    KT_CHECK(st == KVA_ERR_NOT_STORED && kt_all_sentinel(out, no + 4),
             "%s: kva_attend_cache(seq %d, layer %d, n_q %d) with %d of the step's %d tokens stored = %d",
             s->label, q->id, l, n_q, q->stored[l], q->last, (int)st);
    free(qv);
    free(out);
    return;
  }
  KT_CHECK(st == KVA_OK, "%s: kva_attend_cache(seq %d, layer %d, n_q %d) = %d", s->label, q->id, l,
           n_q, (int)st);
  KT_CHECK(kt_all_sentinel(out + no, 4), "%s: kva_attend_cache wrote past out", s->label);
  rq = ref_dup_f(qv, nq);
  rk = KT_ALLOC(double, nk + 1);
  rv = KT_ALLOC(double, nv + 1);
  ro = KT_ALLOC(double, no + 1);
  {
    size_t i;
    const float *k0 = sk(s, q, l, 0), *v0 = sv(s, q, l, 0);
    for (i = 0; i < nk; i++) rk[i] = (double)k0[i];
    for (i = 0; i < nv; i++) rv[i] = (double)v0[i];
  }
  ref_attend(&c, rq, n_q, NULL, rk, rv, q->len, NULL, ro, NULL);
  tol = TOL_OUT_REL * (1.0 + ref_max_abs_d(rv, nv));
  err = ref_max_err(out, ro, no, &where);
  KT_CHECK(err <= tol,
           "%s: attend_cache err %.3g > tol %.3g at %lu: got %.9g want %.9g (seq %d layer %d len %d "
           "n_q %d H %d G %d D %d Dv %d win %d sink %d cap %g bs %d K %s V %s)",
           s->label, err, tol, (unsigned long)where, no ? (double)out[where] : 0.0,
           no ? ro[where] : 0.0, q->id, l, q->len, n_q, H, s->G, s->D, s->Dv, a.window, a.n_sink,
           (double)a.softcap, s->bs, dt_name(s->kt), dt_name(s->vt));
  free(qv);
  free(out);
  free(rq);
  free(rk);
  free(rv);
  free(ro);
}

/* One randomized configuration: 3 interleaved sequences, chunks of random
   sizes across block boundaries, partial and repeated stores, frees and new
   sequences (whose recycled blocks must read as zeros until stored). */
static void cache_random_case(kt_rng *r, int bs_field, kva_dtype kd, kva_dtype vd, const char *label) {
  static const int dims[] = {1, 3, 8, 16, 64, 100};
  enum { NSEQ = 3 };
  cshape s;
  sseq seqs[NSEQ];
  kva_cache_desc d;
  kt_counting cnt;
  kva_status st;
  int i, step, n_steps = kt_iters(60), v_field;
  memset(&s, 0, sizeof s);
  s.L = kt_int(r, 1, 3);
  s.G = kt_int(r, 1, 4);
  s.D = kt_pick(r, dims, 6);
  s.Dv = kt_int(r, 0, 1) ? s.D : kt_pick(r, dims, 6);
  s.bs = bs_field ? bs_field : 16;
  s.cap = kt_quick ? 48 : 120;
  s.n_blocks = NSEQ * ceil_div(s.cap, s.bs) + 2;
  s.kt = eff_k(kd);
  s.vt = eff_v(kd, vd);
  s.label = label;
  v_field = s.Dv == s.D ? (kt_int(r, 0, 1) ? 0 : s.D) : s.Dv;
  desc_init(&d, s.L, s.G, s.D, v_field, bs_field, s.n_blocks, kd, vd);
  counting_init(&cnt);
  d.alloc_fn = cnt_alloc;
  d.free_fn = cnt_free;
  d.user = &cnt;
  st = kva_cache_create(&d, &s.c);
  KT_CHECK(st == KVA_OK, "%s: kva_cache_create = %d (L %d G %d D %d Dv %d bs %d blocks %d)", label,
           (int)st, s.L, s.G, s.D, s.Dv, bs_field, s.n_blocks);
  if (st != KVA_OK) return;
  {
    kva_cache_stats cs;
    size_t bpt = kva_cache_bytes_per_token(&d);
    memset(&cs, 0, sizeof cs);
    kva_cache_get_stats(s.c, &cs);
    KT_CHECK(bpt == (size_t)s.L * s.G * (s.D * dt_bytes(s.kt) + s.Dv * dt_bytes(s.vt)),
             "%s: bytes_per_token %lu", label, (unsigned long)bpt);
    KT_CHECK(cs.block_bytes >= (size_t)s.bs * bpt, "%s: block_bytes %lu < %d tokens x %lu", label,
             (unsigned long)cs.block_bytes, s.bs, (unsigned long)bpt);
    KT_CHECK(cs.bytes_total >= (size_t)s.n_blocks * cs.block_bytes, "%s: bytes_total %lu", label,
             (unsigned long)cs.bytes_total);
    KT_CHECK(cnt.total >= cs.bytes_total, "%s: alloc_fn gave %lu bytes < pool %lu", label,
             (unsigned long)cnt.total, (unsigned long)cs.bytes_total);
  }
  for (i = 0; i < NSEQ; i++) {
    int id = -1;
    seqs[i].k = KT_ALLOC(float, (size_t)s.L * s.cap * s.G * s.D);
    seqs[i].v = KT_ALLOC(float, (size_t)s.L * s.cap * s.G * s.Dv);
    KT_STATUS(kva_seq_new(s.c, &id), KVA_OK);
    sseq_reset(&s, &seqs[i], id);
  }
  for (i = 0; i < NSEQ; i++)
    KT_CHECK(seqs[i].id != seqs[(i + 1) % NSEQ].id, "%s: duplicate sequence ids", label);
  check_stats(&s, seqs, NSEQ);
  for (step = 0; step < n_steps; step++) {
    sseq *q = &seqs[kt_int(r, 0, NSEQ - 1)];
    int n, l;
    if (kt_int(r, 0, 7) == 0 && q->len > 0) {
      /* free it and start a new sequence in its place */
      int old = q->id, id = -1;
      KT_STATUS(kva_seq_free(s.c, old), KVA_OK);
      KT_CHECK(kva_seq_len(s.c, old) == -1, "%s: freed seq len %d", label, kva_seq_len(s.c, old));
      KT_STATUS(kva_seq_append(s.c, old, 1), KVA_ERR_SEQ);
      KT_STATUS(kva_seq_new(s.c, &id), KVA_OK);
      KT_CHECK(id != old, "%s: freed id %d handed out again", label, old);
      sseq_reset(&s, q, id);
      check_stats(&s, seqs, NSEQ);
    }
    if (q->len >= s.cap) continue;
    n = kt_int(r, 0, 2) ? kt_int(r, 1, s.bs + 2) : kt_int(r, 1, 2 * s.bs + 7);
    if (q->len + n > s.cap) n = s.cap - q->len;
    st = kva_seq_append(s.c, q->id, n);
    KT_CHECK(st == KVA_OK, "%s: kva_seq_append(%d) = %d (len %d)", label, n, (int)st, q->len);
    if (st != KVA_OK) continue;
    q->len += n;
    sseq_step(q, n);
    for (l = 0; l < s.L; l++) {
      int ns = kt_int(r, 0, 3) ? n : kt_int(r, 0, n); /* sometimes only the newest few */
      if (ns > 0) store_random(r, &s, q, l, ns, 1.0f);
      if (kt_int(r, 0, 5) == 0) store_random(r, &s, q, l, kt_int(r, 1, n), 1.0f); /* overwrite */
    }
    check_stats(&s, seqs, NSEQ);
    l = kt_int(r, 0, s.L - 1);
    check_attend(r, &s, q, l, kt_int(r, 0, 1) ? 1 : kt_int(r, 1, n < 8 ? n : 8));
    check_readback(&s, q);
  }
  for (i = 0; i < NSEQ; i++) check_readback(&s, &seqs[i]);
  for (i = 0; i < NSEQ; i++) {
    free(seqs[i].k);
    free(seqs[i].v);
  }
  kva_cache_destroy(s.c);
  KT_CHECK(cnt.live == 0 && cnt.n_alloc == cnt.n_free,
           "%s: after destroy %lu bytes in %ld blocks not freed", label, (unsigned long)cnt.live,
           cnt.n_alloc - cnt.n_free);
  KT_CHECK(cnt.bad_size == 0 && cnt.bad_ptr == 0 && cnt.bad_align == 0,
           "%s: free_fn got %d wrong sizes, %d unknown pointers; %d bad alignments", label,
           cnt.bad_size, cnt.bad_ptr, cnt.bad_align);
}

static void test_cache_random(void) {
  static const int bss[] = {1, 3, 16, 0};
  static const kva_dtype pairs[][2] = {
      {KVA_F32, KVA_F32},          {KVA_F16, KVA_F16}, {KVA_DTYPE_DEFAULT, KVA_DTYPE_DEFAULT},
      {KVA_F32, KVA_F16},          {KVA_F16, KVA_F32}, {KVA_F32, KVA_DTYPE_DEFAULT},
      {KVA_DTYPE_DEFAULT, KVA_F32}};
  kt_rng r;
  int b, p;
  char label[96];
  kt_begin("cache: random sequences, read-back and attend");
  kt_seed(&r, 0xCAC4E);
  for (b = 0; b < 4; b++)
    for (p = 0; p < (int)(sizeof pairs / sizeof pairs[0]); p++) {
      sprintf(label, "bs %d K %s V %s", bss[b], dt_name(pairs[p][0]), dt_name(pairs[p][1]));
      cache_random_case(&r, bss[b], pairs[p][0], pairs[p][1], label);
    }
}

/* F16 storage of awkward values: subnormals, ties, large magnitudes. */
static void test_cache_f16_values(void) {
  cshape s;
  sseq q;
  kva_cache_desc d;
  kt_rng r;
  int n = 40, G = 2, D = 5, i;
  float *k, *v;
  kt_begin("cache: F16 storage rounds like IEEE binary16");
  kt_seed(&r, 0xF16);
  memset(&s, 0, sizeof s);
  s.L = 1;
  s.G = G;
  s.D = D;
  s.Dv = D;
  s.bs = 16;
  s.cap = n;
  s.n_blocks = 4;
  s.kt = s.vt = KVA_F16;
  s.label = "f16 values";
  desc_init(&d, 1, G, D, 0, 0, 4, KVA_F16, KVA_DTYPE_DEFAULT);
  if (kva_cache_create(&d, &s.c) != KVA_OK) {
    KT_CHECK(0, "create failed");
    return;
  }
  q.k = KT_ALLOC(float, (size_t)n * G * D);
  q.v = KT_ALLOC(float, (size_t)n * G * D);
  k = KT_ALLOC(float, (size_t)n * G * D);
  v = KT_ALLOC(float, (size_t)n * G * D);
  {
    int id = -1;
    KT_STATUS(kva_seq_new(s.c, &id), KVA_OK);
    sseq_reset(&s, &q, id);
  }
  for (i = 0; i < n * G * D; i++) {
    double mag;
    switch (i % 5) {
      case 0: mag = ldexp(kt_unit(&r), -kt_int(&r, 14, 26)); break; /* subnormal range */
      case 1: mag = kt_unit(&r) * 60000.0; break;                   /* large */
      case 2: {                                                     /* exact midpoints */
        uint16_t h = (uint16_t)kt_int(&r, 0, 0x7BFE);
        mag = (ref_f16_to_f64(h) + ref_f16_to_f64((uint16_t)(h + 1))) / 2.0;
        break;
      }
      default: mag = kt_unit(&r) * 4.0; break;
    }
    k[i] = (float)((i & 8) ? -mag : mag);
    v[i] = (float)(((i * 7) & 8) ? -mag : mag) * 0.5f;
  }
  KT_STATUS(kva_seq_append(s.c, q.id, n), KVA_OK);
  q.len = n;
  sseq_step(&q, n);
  KT_STATUS(kva_store(s.c, q.id, 0, k, v, n), KVA_OK);
  for (i = 0; i < n * G * D; i++) {
    q.k[i] = ref_round_f16(k[i]);
    q.v[i] = ref_round_f16(v[i]);
  }
  check_readback(&s, &q);
  free(q.k);
  free(q.v);
  free(k);
  free(v);
  kva_cache_destroy(s.c);
}

/* ------------------------------------------------------------------------ */

static void test_bytes_per_token(void) {
  kva_cache_desc d;
  kt_begin("cache: kva_cache_bytes_per_token");
  desc_init(&d, 80, 8, 128, 0, 0, 0, KVA_DTYPE_DEFAULT, KVA_DTYPE_DEFAULT);
  KT_CHECK(kva_cache_bytes_per_token(&d) == 327680u, "Llama-3-70B F16: %lu, want 327680",
           (unsigned long)kva_cache_bytes_per_token(&d));
  d.dtype = KVA_F16;
  KT_CHECK(kva_cache_bytes_per_token(&d) == 327680u, "Llama-3-70B explicit F16: %lu",
           (unsigned long)kva_cache_bytes_per_token(&d));
  d.dtype = KVA_F32;
  KT_CHECK(kva_cache_bytes_per_token(&d) == 655360u, "Llama-3-70B F32: %lu, want 655360",
           (unsigned long)kva_cache_bytes_per_token(&d));
  d.v_dtype = KVA_F16;
  KT_CHECK(kva_cache_bytes_per_token(&d) == 491520u, "K F32 V F16: %lu, want 491520",
           (unsigned long)kva_cache_bytes_per_token(&d));
  d.dtype = KVA_F16;
  d.v_dtype = KVA_F32;
  KT_CHECK(kva_cache_bytes_per_token(&d) == 491520u, "K F16 V F32: %lu, want 491520",
           (unsigned long)kva_cache_bytes_per_token(&d));
  d.dtype = KVA_DTYPE_DEFAULT;
  d.v_dtype = KVA_DTYPE_DEFAULT;
  d.n_blocks = 100;
  d.max_bytes = 12345;
  d.block_size = -3; /* pool fields do not matter */
  KT_CHECK(kva_cache_bytes_per_token(&d) == 327680u, "pool fields changed bytes_per_token: %lu",
           (unsigned long)kva_cache_bytes_per_token(&d));
  desc_init(&d, 32, 32, 128, 0, 0, 0, KVA_F16, KVA_DTYPE_DEFAULT);
  KT_CHECK(kva_cache_bytes_per_token(&d) == 524288u, "Llama-2-7B: %lu, want 524288",
           (unsigned long)kva_cache_bytes_per_token(&d));
  desc_init(&d, 32, 8, 128, 0, 0, 0, KVA_F16, KVA_F16);
  KT_CHECK(kva_cache_bytes_per_token(&d) == 131072u, "Llama-3-8B: %lu, want 131072",
           (unsigned long)kva_cache_bytes_per_token(&d));
  desc_init(&d, 2, 3, 10, 6, 0, 0, KVA_F32, KVA_F16);
  KT_CHECK(kva_cache_bytes_per_token(&d) == 312u, "L2 G3 D10 Dv6 K F32 V F16: %lu, want 312",
           (unsigned long)kva_cache_bytes_per_token(&d));
  /* invalid per-token fields -> 0 */
  desc_init(&d, 0, 8, 128, 0, 0, 64, KVA_F16, KVA_F16);
  KT_CHECK(kva_cache_bytes_per_token(&d) == 0, "n_layers 0: %lu", (unsigned long)kva_cache_bytes_per_token(&d));
  d.n_layers = -1;
  KT_CHECK(kva_cache_bytes_per_token(&d) == 0, "n_layers -1: %lu", (unsigned long)kva_cache_bytes_per_token(&d));
  desc_init(&d, 4, 0, 128, 0, 0, 64, KVA_F16, KVA_F16);
  KT_CHECK(kva_cache_bytes_per_token(&d) == 0, "n_kv_heads 0: %lu", (unsigned long)kva_cache_bytes_per_token(&d));
  desc_init(&d, 4, 8, 0, 0, 0, 64, KVA_F16, KVA_F16);
  KT_CHECK(kva_cache_bytes_per_token(&d) == 0, "head_dim 0: %lu", (unsigned long)kva_cache_bytes_per_token(&d));
  d.head_dim = -128;
  KT_CHECK(kva_cache_bytes_per_token(&d) == 0, "head_dim < 0: %lu", (unsigned long)kva_cache_bytes_per_token(&d));
  desc_init(&d, 4, 8, 128, -1, 0, 64, KVA_F16, KVA_F16);
  KT_CHECK(kva_cache_bytes_per_token(&d) == 0, "v_dim < 0: %lu", (unsigned long)kva_cache_bytes_per_token(&d));
  desc_init(&d, 4, 8, 128, 0, 0, 64, (kva_dtype)99, KVA_F16);
  KT_CHECK(kva_cache_bytes_per_token(&d) == 0, "dtype 99: %lu", (unsigned long)kva_cache_bytes_per_token(&d));
  desc_init(&d, 4, 8, 128, 0, 0, 64, KVA_F16, (kva_dtype)99);
  KT_CHECK(kva_cache_bytes_per_token(&d) == 0, "v_dtype 99: %lu", (unsigned long)kva_cache_bytes_per_token(&d));
  desc_init(&d, 4, 8, 128, 0, 0, 64, KVA_F16, KVA_F16);
  d.kind = (kva_cache_kind)7;
  KT_CHECK(kva_cache_bytes_per_token(&d) == 0, "kind 7: %lu", (unsigned long)kva_cache_bytes_per_token(&d));
}

/* ------------------------------------------------------------------------ */

static void test_create(void) {
  kva_cache_desc d;
  kva_cache *c, *marker = (kva_cache *)&d; /* any recognisable non-NULL value */
  kva_cache_stats st;
  kt_counting cnt;
  size_t bpt;
  int bs, k;
  kt_begin("cache: create, sizes and custom allocator");
  /* bad descriptions: KVA_ERR_ARG and *out untouched */
#define BADC(what)                                                                   \
  do {                                                                               \
    kva_status s_;                                                                   \
    c = marker;                                                                      \
    s_ = kva_cache_create(&d, &c);                                                   \
    KT_CHECK(s_ == KVA_ERR_ARG, "create with %s: status %d, want KVA_ERR_ARG", what, \
             (int)s_);                                                               \
    KT_CHECK(c == marker, "create with %s changed *out on failure", what);           \
    if (s_ == KVA_OK && c != marker) kva_cache_destroy(c);                           \
  } while (0)
  desc_init(&d, 2, 2, 8, 0, 4, 0, KVA_F16, KVA_F16);
  BADC("n_blocks 0 and max_bytes 0");
  desc_init(&d, 0, 2, 8, 0, 4, 8, KVA_F16, KVA_F16);
  BADC("n_layers 0");
  desc_init(&d, -1, 2, 8, 0, 4, 8, KVA_F16, KVA_F16);
  BADC("n_layers -1");
  desc_init(&d, 2, 0, 8, 0, 4, 8, KVA_F16, KVA_F16);
  BADC("n_kv_heads 0");
  desc_init(&d, 2, 2, 0, 0, 4, 8, KVA_F16, KVA_F16);
  BADC("head_dim 0");
  desc_init(&d, 2, 2, -8, 0, 4, 8, KVA_F16, KVA_F16);
  BADC("head_dim -8");
  desc_init(&d, 2, 2, 8, -1, 4, 8, KVA_F16, KVA_F16);
  BADC("v_dim -1");
  desc_init(&d, 2, 2, 8, 0, -4, 8, KVA_F16, KVA_F16);
  BADC("block_size -4");
  desc_init(&d, 2, 2, 8, 0, 4, -8, KVA_F16, KVA_F16);
  BADC("n_blocks -8");
  desc_init(&d, 2, 2, 8, 0, 4, 8, (kva_dtype)99, KVA_F16);
  BADC("dtype 99");
  desc_init(&d, 2, 2, 8, 0, 4, 8, KVA_F16, (kva_dtype)99);
  BADC("v_dtype 99");
#undef BADC
  desc_init(&d, 2, 2, 8, 0, 4, 8, KVA_F16, KVA_F16);
  KT_STATUS(kva_cache_create(NULL, &c), KVA_ERR_ARG);
  KT_STATUS(kva_cache_create(&d, NULL), KVA_ERR_ARG);

  /* block sizes; 0 means 16 */
  for (bs = 0; bs <= 16; bs += (bs == 0 ? 1 : (bs == 1 ? 2 : 13))) {
    desc_init(&d, 3, 2, 8, 6, bs, 5, KVA_F32, KVA_F16);
    c = NULL;
    KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
    if (!c) continue;
    memset(&st, 0, sizeof st);
    kva_cache_get_stats(c, &st);
    bpt = kva_cache_bytes_per_token(&d);
    KT_CHECK(bpt == 3u * 2u * (8u * 4u + 6u * 2u), "bpt %lu", (unsigned long)bpt);
    KT_CHECK(st.n_blocks == 5 && st.blocks_free == 5 && st.blocks_used == 0 && st.blocks_cached == 0 &&
                 st.n_seqs == 0 && st.tokens_held == 0,
             "fresh cache stats: n_blocks %d free %d used %d cached %d seqs %d held %ld", st.n_blocks,
             st.blocks_free, st.blocks_used, st.blocks_cached, st.n_seqs, st.tokens_held);
    KT_CHECK(st.block_bytes >= (size_t)(bs ? bs : 16) * bpt, "bs %d: block_bytes %lu < %lu", bs,
             (unsigned long)st.block_bytes, (unsigned long)((size_t)(bs ? bs : 16) * bpt));
    if (bs == 0) {
      /* the default block is 16 tokens: 5 blocks hold 80 tokens, not 81 */
      int s = -1;
      KT_STATUS(kva_seq_new(c, &s), KVA_OK);
      KT_STATUS(kva_seq_append(c, s, 81), KVA_ERR_FULL);
      KT_STATUS(kva_seq_append(c, s, 80), KVA_OK);
      memset(&st, 0, sizeof st);
      kva_cache_get_stats(c, &st);
      KT_CHECK(st.blocks_used == 5, "default block size: 80 tokens use %d blocks, want 5",
               st.blocks_used);
    }
    kva_cache_destroy(c);
  }

  /* pool from max_bytes: the whole footprint of 10 blocks and half a block more gives 10 blocks */
  desc_init(&d, 2, 2, 8, 0, 4, 10, KVA_F16, KVA_F16);
  bpt = kva_cache_bytes_per_token(&d);
  {
    size_t ten = 0;
    KT_STATUS(kva_cache_size(&d, &ten), KVA_OK);
    d.n_blocks = 0;
    d.max_bytes = ten + bpt * 2;
  }
  c = NULL;
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  if (c) {
    memset(&st, 0, sizeof st);
    kva_cache_get_stats(c, &st);
    KT_CHECK(st.n_blocks == 10 && st.bytes_footprint <= d.max_bytes,
             "max_bytes %lu gave %d blocks, footprint %lu", (unsigned long)d.max_bytes, st.n_blocks,
             (unsigned long)st.bytes_footprint);
    kva_cache_destroy(c);
  }
  /* n_blocks wins over max_bytes */
  d.n_blocks = 3;
  d.max_bytes = bpt * 4 * 100;
  c = NULL;
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  if (c) {
    memset(&st, 0, sizeof st);
    kva_cache_get_stats(c, &st);
    KT_CHECK(st.n_blocks == 3, "n_blocks 3 with max_bytes set gave %d blocks", st.n_blocks);
    kva_cache_destroy(c);
  }

  /* a failing allocator: KVA_ERR_NOMEM, *out untouched, nothing leaked */
  for (k = 0; k < 64; k++) {
    kva_status s_;
    desc_init(&d, 2, 2, 8, 0, 4, 8, KVA_F16, KVA_F32);
    counting_init(&cnt);
    cnt.fail_after = k;
    d.alloc_fn = cnt_alloc;
    d.free_fn = cnt_free;
    d.user = &cnt;
    c = marker;
    s_ = kva_cache_create(&d, &c);
    if (s_ == KVA_OK) {
      KT_CHECK(c != marker && c != NULL, "create OK but no cache");
      KT_CHECK(k > 0, "create succeeded without calling alloc_fn");
      kva_cache_destroy(c);
      KT_CHECK(cnt.live == 0 && cnt.n_alloc == cnt.n_free, "destroy left %lu bytes",
               (unsigned long)cnt.live);
      break;
    }
    KT_CHECK(s_ == KVA_ERR_NOMEM, "allocation %d failing: status %d, want KVA_ERR_NOMEM", k, (int)s_);
    KT_CHECK(c == marker, "failed create changed *out");
    KT_CHECK(cnt.live == 0 && cnt.n_alloc == cnt.n_free,
             "failed create (allocation %d failing) leaked %lu bytes", k, (unsigned long)cnt.live);
  }
  KT_CHECK(k < 64, "create never succeeded with a counting allocator");
}

/* ------------------------------------------------------------------------ */

static void test_seq_ids(void) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  int ids[600], n = kt_quick ? 100 : 600, i, j, a = -1, b = -1, x;
  float k[2 * 4], v[2 * 4], out[4 * 4];
  int32_t pos[2];
  kva_attn at;
  kt_begin("cache: sequence ids (generations, never reused)");
  desc_init(&d, 1, 2, 4, 0, 4, 8, KVA_F32, KVA_F32);
  d.max_seqs = 2;
  if (kva_cache_create(&d, &c) != KVA_OK) {
    KT_CHECK(0, "create failed");
    return;
  }
  memset(k, 0, sizeof k);
  memset(v, 0, sizeof v);
  kt_attn_init(&at, 2, 2, 4, 0);
  KT_STATUS(kva_seq_new(c, &a), KVA_OK);
  for (i = 0; i < n; i++) {
    KT_STATUS(kva_seq_new(c, &ids[i]), KVA_OK);
    KT_STATUS(kva_seq_append(c, ids[i], 1 + i % 5), KVA_OK);
    KT_CHECK(ids[i] != a, "id %d equals a live sequence's", ids[i]);
    for (j = 0; j < i; j++)
      if (ids[j] == ids[i]) {
        KT_CHECK(0, "id %d handed out twice (iterations %d and %d)", ids[i], j, i);
        break;
      }
    KT_STATUS(kva_seq_free(c, ids[i]), KVA_OK);
  }
  for (i = 0; i < n; i += (n / 10)) {
    x = ids[i];
    KT_CHECK(kva_seq_len(c, x) == -1 && kva_seq_pos(c, x) == -1, "freed id %d: len %d pos %d", x,
             kva_seq_len(c, x), kva_seq_pos(c, x));
    KT_STATUS(kva_seq_free(c, x), KVA_ERR_SEQ);
    KT_STATUS(kva_seq_append(c, x, 1), KVA_ERR_SEQ);
    KT_STATUS(kva_store(c, x, 0, k, v, 1), KVA_ERR_SEQ);
    KT_STATUS(kva_attend_cache(c, x, 0, &at, k, 1, out), KVA_ERR_SEQ);
    KT_STATUS(kva_seq_read(c, x, 0, 0, k, v, pos), KVA_ERR_SEQ);
  }
  /* negative and absurd ids */
  for (i = 0; i < 3; i++) {
    x = i == 0 ? -1 : (i == 1 ? -1000000 : 1 << 30);
    KT_CHECK(kva_seq_len(c, x) == -1 && kva_seq_pos(c, x) == -1, "id %d: len %d pos %d", x,
             kva_seq_len(c, x), kva_seq_pos(c, x));
    KT_STATUS(kva_seq_free(c, x), KVA_ERR_SEQ);
    KT_STATUS(kva_seq_append(c, x, 1), KVA_ERR_SEQ);
    KT_STATUS(kva_store(c, x, 0, k, v, 1), KVA_ERR_SEQ);
    KT_STATUS(kva_attend_cache(c, x, 0, &at, k, 1, out), KVA_ERR_SEQ);
    KT_STATUS(kva_seq_read(c, x, 0, 0, k, v, pos), KVA_ERR_SEQ);
  }
  /* max_seqs 2: a third live sequence is refused and *seq left alone */
  KT_STATUS(kva_seq_new(c, &b), KVA_OK);
  x = -77;
  {
    kva_status s_ = kva_seq_new(c, &x);
    KT_CHECK(s_ == KVA_ERR_SEQ_LIMIT, "a third sequence with max_seqs 2: %s, want KVA_ERR_SEQ_LIMIT", kva_status_str(s_));
    {
      /* every status has its own string; anything else is "unknown status" */
      int a_, b_;
      for (a_ = KVA_OK; a_ <= KVA_ERR_STEP; a_++) {
        KT_CHECK(strcmp(kva_status_str((kva_status)a_), "unknown status") != 0, "status %d has no string", a_);
        for (b_ = KVA_OK; b_ < a_; b_++)
          KT_CHECK(strcmp(kva_status_str((kva_status)a_), kva_status_str((kva_status)b_)) != 0,
                   "statuses %d and %d share the string \"%s\"", a_, b_, kva_status_str((kva_status)a_));
      }
      KT_CHECK(strcmp(kva_status_str((kva_status)(KVA_ERR_STEP + 1)), "unknown status") == 0,
               "status %d past the last: \"%s\"", KVA_ERR_STEP + 1,
               kva_status_str((kva_status)(KVA_ERR_STEP + 1)));
    }
    KT_CHECK(x == -77, "failed kva_seq_new changed *seq to %d", x);
    if (s_ == KVA_OK) kva_seq_free(c, x);
  }
  KT_STATUS(kva_seq_new(NULL, &x), KVA_ERR_ARG);
  KT_STATUS(kva_seq_new(c, NULL), KVA_ERR_ARG);
  KT_STATUS(kva_seq_free(c, a), KVA_OK);
  KT_STATUS(kva_seq_free(c, b), KVA_OK);
  kva_cache_destroy(c);
}

/* ------------------------------------------------------------------------ */
/* Bad arguments to append/store/attend_cache/read on a small cache.         */

static void test_cache_errors(void) {
  cshape s;
  sseq q, fresh;
  kva_cache_desc d;
  kva_attn at;
  kt_rng r;
  kva_cache_stats st0, st1;
  float k[8 * 2 * 4], v[8 * 2 * 6], qv[8 * 4 * 4], out[8 * 4 * 6 + 4], rk[2 * 4], rv[2 * 6];
  int32_t rp[2];
  int id = -1, unknown;
  kva_status sst;
  kt_begin("cache: bad arguments change nothing");
  kt_seed(&r, 0xE44);
  memset(&s, 0, sizeof s);
  s.L = 2;
  s.G = 2;
  s.D = 4;
  s.Dv = 6;
  s.bs = 4;
  s.cap = 16;
  s.n_blocks = 8;
  s.kt = KVA_F32;
  s.vt = KVA_F16;
  s.label = "errors";
  desc_init(&d, 2, 2, 4, 6, 4, 8, KVA_F32, KVA_F16);
  if (kva_cache_create(&d, &s.c) != KVA_OK) {
    KT_CHECK(0, "create failed");
    return;
  }
  q.k = KT_ALLOC(float, (size_t)s.L * s.cap * s.G * s.D);
  q.v = KT_ALLOC(float, (size_t)s.L * s.cap * s.G * s.Dv);
  fresh.k = KT_ALLOC(float, (size_t)s.L * s.cap * s.G * s.D);
  fresh.v = KT_ALLOC(float, (size_t)s.L * s.cap * s.G * s.Dv);
  KT_STATUS(kva_seq_new(s.c, &id), KVA_OK);
  sseq_reset(&s, &q, id);
  KT_STATUS(kva_seq_new(s.c, &id), KVA_OK);
  sseq_reset(&s, &fresh, id);
  kt_fill(&r, k, sizeof k / sizeof k[0], -1, 1);
  kt_fill(&r, v, sizeof v / sizeof v[0], -1, 1);
  kt_fill(&r, qv, sizeof qv / sizeof qv[0], -1, 1);
  kt_attn_init(&at, 4, 2, 4, 6);

  /* a fresh sequence has no latest append: store/attend of 1 token fail */
  KT_STATUS(kva_store(s.c, fresh.id, 0, k, v, 1), KVA_ERR_STEP);
  kt_fill_sentinel(out, sizeof out / sizeof out[0]);
  KT_STATUS(kva_attend_cache(s.c, fresh.id, 0, &at, qv, 1, out), KVA_ERR_STEP);
  KT_CHECK(kt_all_sentinel(out, sizeof out / sizeof out[0]), "failed attend_cache wrote out");
  KT_STATUS(kva_seq_append(s.c, fresh.id, 0), KVA_OK); /* no-op */
  KT_CHECK(kva_seq_len(s.c, fresh.id) == 0, "append(0) changed len");
  KT_STATUS(kva_seq_append(s.c, fresh.id, -1), KVA_ERR_ARG);
  KT_STATUS(kva_seq_append(NULL, fresh.id, 1), KVA_ERR_ARG);
  KT_CHECK(kva_seq_len(s.c, fresh.id) == 0, "failed append changed len");

  /* q: 5 tokens appended, layer 0 and 1 stored */
  KT_STATUS(kva_seq_append(s.c, q.id, 5), KVA_OK);
  q.len = 5;
  sseq_step(&q, 5);
  store_random(&r, &s, &q, 0, 5, 1.0f);
  store_random(&r, &s, &q, 1, 5, 1.0f);
  memset(&st0, 0, sizeof st0);
  kva_cache_get_stats(s.c, &st0);

  /* store */
  KT_STATUS(kva_store(s.c, q.id, 0, k, v, 6), KVA_ERR_STEP); /* more than the latest append */
  KT_STATUS(kva_store(s.c, q.id, -1, k, v, 1), KVA_ERR_ARG);
  KT_STATUS(kva_store(s.c, q.id, 2, k, v, 1), KVA_ERR_ARG);
  KT_STATUS(kva_store(s.c, q.id, 0, NULL, v, 1), KVA_ERR_ARG);
  KT_STATUS(kva_store(s.c, q.id, 0, k, NULL, 1), KVA_ERR_ARG);
  KT_STATUS(kva_store(s.c, q.id, 0, k, v, -1), KVA_ERR_ARG);
  KT_STATUS(kva_store(NULL, q.id, 0, k, v, 1), KVA_ERR_ARG);
  KT_STATUS(kva_store(s.c, q.id, 0, k, v, 0), KVA_OK); /* no-op */
  check_readback(&s, &q);

  /* attend_cache */
#define BADA(call, want, what)                                                            \
  do {                                                                                    \
    kt_fill_sentinel(out, sizeof out / sizeof out[0]);                                    \
    sst = (call);                                                                         \
    KT_CHECK(sst == (want), "%s: status %d, want %d", what, (int)sst, (int)(want));       \
    KT_CHECK(kt_all_sentinel(out, sizeof out / sizeof out[0]), "%s: out changed", what);  \
  } while (0)
  BADA(kva_attend_cache(s.c, q.id, 0, &at, qv, 6, out), KVA_ERR_STEP, "n_q > latest append");
  BADA(kva_attend_cache(s.c, q.id, 0, &at, qv, -1, out), KVA_ERR_ARG, "n_q < 0");
  BADA(kva_attend_cache(s.c, q.id, -1, &at, qv, 1, out), KVA_ERR_ARG, "layer -1");
  BADA(kva_attend_cache(s.c, q.id, 2, &at, qv, 1, out), KVA_ERR_ARG, "layer == n_layers");
  BADA(kva_attend_cache(s.c, q.id, 0, NULL, qv, 1, out), KVA_ERR_ARG, "attn NULL");
  BADA(kva_attend_cache(s.c, q.id, 0, &at, NULL, 1, out), KVA_ERR_ARG, "q NULL");
  BADA(kva_attend_cache(NULL, q.id, 0, &at, qv, 1, out), KVA_ERR_ARG, "cache NULL");
  sst = kva_attend_cache(s.c, q.id, 0, &at, qv, 1, NULL);
  KT_CHECK(sst == KVA_ERR_ARG, "out NULL: status %d", (int)sst);
  at.n_kv_heads = 1;
  BADA(kva_attend_cache(s.c, q.id, 0, &at, qv, 1, out), KVA_ERR_ARG, "attn G 1 vs cache G 2");
  at.n_kv_heads = 4;
  BADA(kva_attend_cache(s.c, q.id, 0, &at, qv, 1, out), KVA_ERR_ARG, "attn G 4 vs cache G 2");
  kt_attn_init(&at, 4, 2, 8, 6);
  BADA(kva_attend_cache(s.c, q.id, 0, &at, qv, 1, out), KVA_ERR_ARG, "attn head_dim 8 vs 4");
  kt_attn_init(&at, 4, 2, 4, 0); /* v_dim 0 => 4, cache has 6 */
  BADA(kva_attend_cache(s.c, q.id, 0, &at, qv, 1, out), KVA_ERR_ARG, "attn v_dim 0 (=4) vs 6");
  kt_attn_init(&at, 4, 2, 4, 5);
  BADA(kva_attend_cache(s.c, q.id, 0, &at, qv, 1, out), KVA_ERR_ARG, "attn v_dim 5 vs 6");
  kt_attn_init(&at, 3, 2, 4, 6);
  BADA(kva_attend_cache(s.c, q.id, 0, &at, qv, 1, out), KVA_ERR_ARG, "H 3 % G 2");
  kt_attn_init(&at, 4, 2, 4, 6);
  BADA(kva_attend_cache(s.c, q.id, 0, &at, qv, 0, out), KVA_OK, "n_q 0 no-op");
  /* argument errors before sequence errors */
  unknown = -5;
  BADA(kva_attend_cache(s.c, unknown, 0, NULL, qv, 1, out), KVA_ERR_ARG, "unknown seq, attn NULL");
  BADA(kva_attend_cache(s.c, unknown, 9, &at, qv, 1, out), KVA_ERR_ARG, "unknown seq, bad layer");
  BADA(kva_attend_cache(s.c, unknown, 0, &at, qv, 1, out), KVA_ERR_SEQ, "unknown seq");
#undef BADA
  KT_STATUS(kva_store(s.c, unknown, -1, k, v, 1), KVA_ERR_ARG);
  KT_STATUS(kva_store(s.c, unknown, 0, NULL, v, 1), KVA_ERR_ARG);
  KT_STATUS(kva_seq_append(s.c, unknown, -1), KVA_ERR_ARG);
  KT_STATUS(kva_seq_read(s.c, unknown, -1, 0, rk, rv, rp), KVA_ERR_ARG);

  /* the valid call works, and with n_q == latest append */
  KT_STATUS(kva_attend_cache(s.c, q.id, 1, &at, qv, 5, out), KVA_OK);

  /* read */
#define BADR(call, what)                                                                   \
  do {                                                                                     \
    kt_fill_sentinel(rk, 8);                                                               \
    kt_fill_sentinel(rv, 12);                                                              \
    rp[0] = rp[1] = 12345;                                                                 \
    sst = (call);                                                                          \
    KT_CHECK(sst == KVA_ERR_ARG, "%s: status %d, want KVA_ERR_ARG", what, (int)sst);       \
    KT_CHECK(kt_all_sentinel(rk, 8) && kt_all_sentinel(rv, 12) && rp[0] == 12345 &&        \
                 rp[1] == 12345,                                                           \
             "%s: outputs changed", what);                                                 \
  } while (0)
  BADR(kva_seq_read(s.c, q.id, 0, 5, rk, rv, rp), "slot == len");
  BADR(kva_seq_read(s.c, q.id, 0, -1, rk, rv, rp), "slot -1");
  BADR(kva_seq_read(s.c, q.id, -1, 0, rk, rv, rp), "layer -1");
  BADR(kva_seq_read(s.c, q.id, 2, 0, rk, rv, rp), "layer == n_layers");
  BADR(kva_seq_read(NULL, q.id, 0, 0, rk, rv, rp), "cache NULL");
  BADR(kva_seq_read(s.c, fresh.id, 0, 0, rk, rv, rp), "slot 0 of an empty sequence");
#undef BADR
  KT_STATUS(kva_seq_read(s.c, q.id, 0, 4, NULL, NULL, NULL), KVA_OK);
  KT_STATUS(kva_seq_read(s.c, q.id, 1, 0, rk, NULL, NULL), KVA_OK);
  KT_STATUS(kva_seq_read(s.c, q.id, 1, 0, NULL, rv, rp), KVA_OK);
  KT_CHECK(rk[0] == sk(&s, &q, 1, 0)[0] && rv[5] == sv(&s, &q, 1, 0)[5] && rp[1] == 0,
           "partial-NULL reads return the right values");

  /* nothing above changed the cache */
  memset(&st1, 0, sizeof st1);
  kva_cache_get_stats(s.c, &st1);
  KT_CHECK(st0.blocks_used == st1.blocks_used && st0.blocks_free == st1.blocks_free &&
               st0.n_seqs == st1.n_seqs && st0.tokens_held == st1.tokens_held,
           "stats changed by failing calls");
  KT_CHECK(kva_seq_len(s.c, q.id) == 5 && kva_seq_pos(s.c, q.id) == 5, "len/pos changed");
  check_readback(&s, &q);

  /* the latest append bounds store/attend: append 2 more, store only those */
  KT_STATUS(kva_seq_append(s.c, q.id, 2), KVA_OK);
  q.len = 7;
  sseq_step(&q, 2);
  KT_STATUS(kva_store(s.c, q.id, 0, k, v, 3), KVA_ERR_STEP);
  KT_STATUS(kva_attend_cache(s.c, q.id, 0, &at, qv, 3, out), KVA_ERR_STEP);
  store_random(&r, &s, &q, 0, 2, 1.0f);
  store_random(&r, &s, &q, 1, 1, 1.0f); /* slot 5 of layer 1 stays zero */
  check_readback(&s, &q);
  check_attend(&r, &s, &q, 1, 2);
  check_attend(&r, &s, &q, 0, 1);
  free(q.k);
  free(q.v);
  free(fresh.k);
  free(fresh.v);
  kva_cache_destroy(s.c);
}

/* ------------------------------------------------------------------------ */
/* Pool exhaustion: KVA_ERR_FULL changes nothing; freeing makes room.        */

static void test_pool_full(void) {
  enum { NS = 3 };
  cshape s;
  sseq seqs[NS];
  kva_cache_desc d;
  kva_cache_stats st0, st1;
  kt_rng r;
  int i, id;
  kva_status st;
  kt_begin("cache: pool exhaustion is all-or-nothing");
  kt_seed(&r, 0xF011);
  memset(&s, 0, sizeof s);
  s.L = 2;
  s.G = 2;
  s.D = 3;
  s.Dv = 3;
  s.bs = 4;
  s.cap = 32;
  s.n_blocks = 6;
  s.kt = s.vt = KVA_F16;
  s.label = "pool full";
  desc_init(&d, 2, 2, 3, 0, 4, 6, KVA_DTYPE_DEFAULT, KVA_DTYPE_DEFAULT);
  if (kva_cache_create(&d, &s.c) != KVA_OK) {
    KT_CHECK(0, "create failed");
    return;
  }
  for (i = 0; i < NS; i++) {
    seqs[i].k = KT_ALLOC(float, (size_t)s.L * s.cap * s.G * s.D);
    seqs[i].v = KT_ALLOC(float, (size_t)s.L * s.cap * s.G * s.Dv);
    id = -1;
    KT_STATUS(kva_seq_new(s.c, &id), KVA_OK);
    sseq_reset(&s, &seqs[i], id);
  }
#define APPEND_OK(q, n)                                                        \
  do {                                                                         \
    int l_;                                                                    \
    KT_STATUS(kva_seq_append(s.c, (q).id, (n)), KVA_OK);                       \
    (q).len += (n);                                                            \
    sseq_step(&(q), (n));                                                      \
    for (l_ = 0; l_ < s.L; l_++) store_random(&r, &s, &(q), l_, (n), 1.0f);    \
    check_stats(&s, seqs, NS);                                                 \
  } while (0)
#define APPEND_FULL(q, n, what)                                                                \
  do {                                                                                         \
    memset(&st0, 0, sizeof st0);                                                               \
    kva_cache_get_stats(s.c, &st0);                                                            \
    st = kva_seq_append(s.c, (q).id, (n));                                                     \
    KT_CHECK(st == KVA_ERR_FULL, "%s: append %d = %d, want KVA_ERR_FULL", what, (n), (int)st); \
    memset(&st1, 0, sizeof st1);                                                               \
    kva_cache_get_stats(s.c, &st1);                                                            \
    KT_CHECK(st0.blocks_used == st1.blocks_used && st0.blocks_free == st1.blocks_free &&       \
                 st0.blocks_cached == st1.blocks_cached && st0.tokens_held == st1.tokens_held && \
                 st0.n_seqs == st1.n_seqs,                                                     \
             "%s: failed append changed the stats", what);                                     \
    check_stats(&s, seqs, NS);                                                                 \
  } while (0)
  APPEND_OK(seqs[0], 10); /* 3 blocks */
  APPEND_OK(seqs[1], 8);  /* 2 blocks, 1 left */
  APPEND_FULL(seqs[1], 5, "B 8 -> 13 needs 2 more blocks");
  /* the failed append kept B's latest append (8): storing 8 still works */
  st = kva_store(s.c, seqs[1].id, 0, seqs[1].k, seqs[1].v, 8);
  KT_CHECK(st == KVA_OK, "store of the previous append's 8 tokens after a failed append: %d",
           (int)st);
  check_readback(&s, &seqs[1]);
  APPEND_FULL(seqs[2], 25, "C: more than the whole pool");
  APPEND_FULL(seqs[2], 8, "C: 2 blocks, 1 free");
  APPEND_OK(seqs[1], 4); /* 12 tokens: the last free block */
  APPEND_FULL(seqs[1], 1, "B: pool empty");
  APPEND_FULL(seqs[2], 1, "C: pool empty");
  APPEND_OK(seqs[0], 2); /* 10 -> 12 fits in A's partial block */
  APPEND_FULL(seqs[0], 1, "A: block full, pool empty");
  for (i = 0; i < NS; i++) check_readback(&s, &seqs[i]);
  /* free A: its 3 blocks come back */
  KT_STATUS(kva_seq_free(s.c, seqs[0].id), KVA_OK);
  seqs[0].alive = 0;
  check_stats(&s, seqs, NS);
  APPEND_OK(seqs[1], 1); /* B 13: 4 blocks */
  APPEND_OK(seqs[2], 8); /* C 8: 2 blocks; pool empty again */
  APPEND_FULL(seqs[2], 1, "C after A freed: pool empty again");
  APPEND_OK(seqs[1], 3); /* B 16: still 4 blocks */
  for (i = 1; i < NS; i++) check_readback(&s, &seqs[i]);
  check_attend(&r, &s, &seqs[1], 0, 3);
  check_attend(&r, &s, &seqs[2], 1, 8);
#undef APPEND_OK
#undef APPEND_FULL
  for (i = 0; i < NS; i++) {
    free(seqs[i].k);
    free(seqs[i].v);
  }
  kva_cache_destroy(s.c);
}


/* Steps: a layer is attended only once it stored the whole step; chunks of
   the step stored with kva_store_at (touching what is stored) equal one
   store; publishing unstored tokens is refused. */
static void test_steps(void) {
  enum { G = 2, D = 8, BS = 4, N = 7 };
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_attn a;
  kt_rng r;
  float k[N * G * D], v[N * G * D], q[N * 4 * D], out1[N * 4 * D], out2[N * 4 * D + 4], rk[G * D], rv[G * D];
  int32_t tok[16] = {0};
  int s1 = -1, s2 = -1, l, i, t, ok;
  kt_begin("cache: steps (store before attend, chunked stores, publish stored tokens only)");
  kt_seed(&r, 0x57E9);
  memset(&d, 0, sizeof d);
  d.n_layers = 2;
  d.n_kv_heads = G;
  d.head_dim = D;
  d.block_size = BS;
  d.n_blocks = 16;
  d.dtype = KVA_F32;
  if (kva_cache_create(&d, &c) != KVA_OK) {
    KT_CHECK(0, "create");
    return;
  }
  kt_attn_init(&a, 4, G, D, 0);
  kt_fill(&r, k, sizeof k / sizeof k[0], -1, 1);
  kt_fill(&r, v, sizeof v / sizeof v[0], -1, 1);
  kt_fill(&r, q, sizeof q / sizeof q[0], -1, 1);
  KT_STATUS(kva_seq_new(c, &s1), KVA_OK);
  KT_STATUS(kva_seq_new(c, &s2), KVA_OK);
  KT_STATUS(kva_seq_append(c, s1, N), KVA_OK);
  KT_STATUS(kva_seq_append(c, s2, N), KVA_OK);
  /* s1: one store per layer; s2: chunks [3, 5), [5, 7), [0, 3) in layer 0 */
  for (l = 0; l < 2; l++) KT_STATUS(kva_store(c, s1, l, k, v, N), KVA_OK);
  KT_STATUS(kva_store_at(c, s2, 0, 3, k + 3 * G * D, v + 3 * G * D, 2), KVA_OK);
  kt_fill_sentinel(out2, sizeof out2 / sizeof out2[0]);
  KT_STATUS(kva_attend_cache(c, s2, 0, &a, q, 1, out2), KVA_ERR_NOT_STORED);
  KT_CHECK(kt_all_sentinel(out2, sizeof out2 / sizeof out2[0]), "refused attend wrote out");
  KT_STATUS(kva_store_at(c, s2, 0, 0, k, v, 2), KVA_ERR_ARG); /* [0, 2) does not touch [3, 5) */
  KT_STATUS(kva_store_at(c, s2, 0, 6, k, v, 2), KVA_ERR_STEP); /* past the step */
  KT_STATUS(kva_store_at(c, s2, 0, -1, k, v, 1), KVA_ERR_ARG);
  KT_STATUS(kva_store_at(c, s2, 0, 5, k + 5 * G * D, v + 5 * G * D, 2), KVA_OK);
  KT_STATUS(kva_attend_cache(c, s2, 0, &a, q, 1, out2), KVA_ERR_NOT_STORED); /* [3, 7) of 7 */
  KT_STATUS(kva_store_at(c, s2, 0, 0, k, v, 3), KVA_OK);
  KT_STATUS(kva_attend_cache(c, s2, 1, &a, q, N, out2), KVA_ERR_NOT_STORED); /* layer 1 untouched */
  KT_STATUS(kva_attend_cache(c, s1, 0, &a, q, N, out1), KVA_OK);
  KT_STATUS(kva_attend_cache(c, s2, 0, &a, q, N, out2), KVA_OK);
  KT_CHECK(memcmp(out1, out2, sizeof out1) == 0, "chunked stores attend differently from one store");
  for (t = 0, ok = 1; t < N; t++) {
    KT_STATUS(kva_seq_read(c, s2, 0, t, rk, rv, NULL), KVA_OK);
    for (i = 0; i < G * D; i++) ok &= rk[i] == k[t * G * D + i] && rv[i] == v[t * G * D + i];
  }
  KT_CHECK(ok, "chunked stores read back wrong");
  /* publish: s2's layer 1 never stored the step, so no block of it may be published */
  KT_STATUS(kva_seq_publish(c, s2, tok, 4, 9), KVA_ERR_NOT_STORED);
  KT_STATUS(kva_attend_cache(c, s2, 0, &a, q, 1, out2), KVA_OK); /* the step goes on */
  KT_STATUS(kva_store(c, s2, 1, k, v, N), KVA_OK);
  KT_STATUS(kva_seq_publish(c, s2, tok, 4, 9), KVA_OK); /* ends the step */
  KT_STATUS(kva_attend_cache(c, s2, 0, &a, q, 1, out2), KVA_ERR_STEP);
  /* a step left unstored stays unpublishable: s1 appends 5 (tokens 7..11), stores only layer 0 */
  KT_STATUS(kva_seq_append(c, s1, 5), KVA_OK);
  KT_STATUS(kva_store(c, s1, 0, k, v, 5), KVA_OK);
  KT_STATUS(kva_seq_append(c, s1, 1), KVA_OK); /* the step of 5 ends with layer 1 unstored */
  for (l = 0; l < 2; l++) KT_STATUS(kva_store(c, s1, l, k, v, 1), KVA_OK);
  KT_STATUS(kva_seq_publish(c, s1, tok, 12, 1), KVA_ERR_NOT_STORED); /* block 1 holds token 7 */
  KT_STATUS(kva_seq_publish(c, s1, tok, 7, 1), KVA_OK);              /* block 0: tokens 0..3 */
  KT_STATUS(kva_seq_truncate(c, s1, 7), KVA_OK);                    /* drops tokens 7.. */
  KT_STATUS(kva_seq_append(c, s1, 5), KVA_OK);
  for (l = 0; l < 2; l++) KT_STATUS(kva_store(c, s1, l, k, v, 5), KVA_OK);
  KT_STATUS(kva_seq_publish(c, s1, tok, 12, 1), KVA_OK);
  kva_cache_destroy(c);
}

/* The whole footprint: kva_cache_size before creation == what the allocator
   is asked for == stats.bytes_footprint; max_bytes picks the most blocks
   whose footprint fits; evict_support and max_seq_len shrink the
   bookkeeping by exactly the arrays they drop; their rules. */
static void test_cache_size(void) {
  kt_rng r;
  int it, n_it = kt_quick ? 40 : 120;
  kt_begin("cache: kva_cache_size, max_bytes as the whole footprint, evict_support, max_seq_len");
  kt_seed(&r, 0x5123);
  for (it = 0; it < n_it; it++) {
    kva_cache_desc d;
    kva_cache *c = NULL;
    kva_cache_stats st;
    kt_counting cnt;
    size_t size = 0, size1 = 0, meta[3] = {0, 0, 0};
    int sup, L = kt_int(&r, 1, 4), G = kt_int(&r, 1, 4), bs = kt_int(&r, 0, 1) ? 16 : kt_int(&r, 1, 9);
    desc_init(&d, L, G, kt_int(&r, 1, 70), 0, bs, kt_int(&r, 1, 300), it % 3 ? KVA_F16 : KVA_INT8, KVA_DTYPE_DEFAULT);
    d.max_seqs = kt_int(&r, 0, 3) ? kt_int(&r, 1, 40) : 0;
    d.max_seq_len = kt_int(&r, 0, 1) ? kt_int(&r, 1, d.n_blocks * (bs ? bs : 16) + 5) : 0;
    for (sup = 0; sup < 3; sup++) { /* the same cache with less eviction support: bookkeeping shrinks exactly */
      d.evict_support = sup;
      counting_init(&cnt);
      d.alloc_fn = cnt_alloc, d.free_fn = cnt_free, d.user = &cnt;
      KT_STATUS(kva_cache_size(&d, &size), KVA_OK);
      KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
      if (!c) break;
      kva_cache_get_stats(c, &st);
      KT_CHECK(cnt.total == size && st.bytes_footprint == size,
               "kva_cache_size %lu, allocator asked for %lu, stats footprint %lu (it %d support %d)",
               (unsigned long)size, (unsigned long)cnt.total, (unsigned long)st.bytes_footprint, it, sup);
      KT_CHECK(st.bytes_footprint == st.bytes_meta + st.bytes_total, "footprint %lu != meta %lu + pool %lu",
               (unsigned long)st.bytes_footprint, (unsigned long)st.bytes_meta, (unsigned long)st.bytes_total);
      meta[sup] = st.bytes_meta;
      kva_cache_destroy(c);
      c = NULL;
      d.alloc_fn = NULL, d.free_fn = NULL, d.user = NULL;
      KT_STATUS(kva_cache_size(&d, &size1), KVA_OK);
      KT_CHECK(size1 == size + 64, "KVATTN_MALLOC path: kva_cache_size %lu, want %lu + 64 (hand alignment)",
               (unsigned long)size1, (unsigned long)size);
    }
    if (sup == 3) {
      size_t arr = ((size_t)L * (size_t)d.n_blocks * (size_t)(bs ? bs : 16) * (size_t)G * 4 + 63) / 64 * 64;
      KT_CHECK(meta[0] - meta[1] == arr && meta[1] - meta[2] == arr,
               "evict_support ALL/WINDOW/NONE bookkeeping %lu/%lu/%lu, want steps of %lu (one int32/float per slot)",
               (unsigned long)meta[0], (unsigned long)meta[1], (unsigned long)meta[2], (unsigned long)arr);
    }
    /* max_bytes: the largest pool whose whole footprint fits */
    d.evict_support = kt_int(&r, 0, 2);
    {
      size_t target = 0;
      int nb = d.n_blocks;
      KT_STATUS(kva_cache_size(&d, &target), KVA_OK);
      target += (size_t)kt_int(&r, 0, 3000);
      d.n_blocks = 0;
      d.max_bytes = target;
      KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
      if (c) {
        size_t at = 0, above = 0;
        kva_cache_get_stats(c, &st);
        kva_cache_destroy(c);
        c = NULL;
        d.max_bytes = 0;
        d.n_blocks = st.n_blocks;
        KT_STATUS(kva_cache_size(&d, &at), KVA_OK);
        d.n_blocks = st.n_blocks + 1;
        KT_STATUS(kva_cache_size(&d, &above), KVA_OK);
        KT_CHECK(st.n_blocks >= nb && at <= target && above > target && st.bytes_footprint == at,
                 "max_bytes %lu: %d blocks (from %d), footprint %lu, one more block %lu", (unsigned long)target,
                 st.n_blocks, nb, (unsigned long)at, (unsigned long)above);
      }
      d.n_blocks = 0;
      d.max_bytes = 16; /* not even one block and its bookkeeping */
      KT_STATUS(kva_cache_size(&d, &size), KVA_ERR_ARG);
      KT_STATUS(kva_cache_create(&d, &c), KVA_ERR_ARG);
    }
  }
  {
    kva_cache_desc d;
    kva_cache *c = NULL;
    kva_evict e = {KVA_EVICT_WINDOW, 8, 0, 0, 0, NULL, NULL, 0, KVA_DTYPE_DEFAULT, 0, NULL, 0};
    int s = -1, bad;
    size_t sz = 7;
    desc_init(&d, 2, 2, 8, 0, 4, 64, KVA_F16, KVA_F16);
    KT_STATUS(kva_cache_size(NULL, &sz), KVA_ERR_ARG);
    KT_STATUS(kva_cache_size(&d, NULL), KVA_ERR_ARG);
    for (bad = 0; bad < 3; bad++) {
      kva_cache_desc b = d;
      if (bad == 0) b.evict_support = 3;
      if (bad == 1) b.evict_support = -1;
      if (bad == 2) b.max_seq_len = -1;
      KT_STATUS(kva_cache_size(&b, &sz), KVA_ERR_ARG);
      KT_STATUS(kva_cache_create(&b, &c), KVA_ERR_ARG);
    }
    KT_CHECK(sz == 7, "a failed kva_cache_size wrote *bytes");
    /* NONE: no eviction kind; WINDOW: window only */
    d.evict_support = KVA_EVICT_SUPPORT_NONE;
    if (kva_cache_create(&d, &c) == KVA_OK) {
      KT_STATUS(kva_seq_new(c, &s), KVA_OK);
      KT_STATUS(kva_seq_set_evict(c, s, &e), KVA_ERR_UNSUPPORTED);
      e.kind = KVA_EVICT_H2O;
      KT_STATUS(kva_seq_set_evict(c, s, &e), KVA_ERR_UNSUPPORTED);
      e.kind = KVA_EVICT_NONE;
      KT_STATUS(kva_seq_set_evict(c, s, &e), KVA_OK);
      kva_cache_destroy(c);
    }
    d.evict_support = KVA_EVICT_SUPPORT_WINDOW;
    if (kva_cache_create(&d, &c) == KVA_OK) {
      KT_STATUS(kva_seq_new(c, &s), KVA_OK);
      e.kind = KVA_EVICT_H2O;
      e.n_recent = 2;
      KT_STATUS(kva_seq_set_evict(c, s, &e), KVA_ERR_UNSUPPORTED);
      e.kind = KVA_EVICT_WINDOW;
      e.n_recent = 0;
      KT_STATUS(kva_seq_set_evict(c, s, &e), KVA_OK);
      KT_STATUS(kva_seq_append(c, s, 20), KVA_OK); /* a step's own tokens are not evicted */
      KT_STATUS(kva_seq_append(c, s, 1), KVA_OK);
      KT_CHECK(kva_seq_len(c, s) == 8 && kva_seq_pos(c, s) == 21, "a window of 8 on a WINDOW-support cache: len %d pos %d",
               kva_seq_len(c, s), kva_seq_pos(c, s));
      kva_cache_destroy(c);
    }
    /* max_seq_len: 10 tokens in blocks of 4 -> 3 blocks per table; 12 tokens fit the table,
       13 never do, whatever the pool holds */
    d.evict_support = 0;
    d.max_seq_len = 10;
    if (kva_cache_create(&d, &c) == KVA_OK) {
      int f = -1;
      KT_STATUS(kva_seq_new(c, &s), KVA_OK);
      KT_CHECK(kva_seq_fits(c, s, 13, NULL) == KVA_FITS_NEVER, "13 tokens with max_seq_len 10 (3 blocks of 4) fit");
      KT_STATUS(kva_seq_append(c, s, 13), KVA_ERR_FULL);
      KT_STATUS(kva_seq_append(c, s, 12), KVA_OK);
      KT_STATUS(kva_seq_append(c, s, 1), KVA_ERR_FULL);
      KT_STATUS(kva_seq_fork(c, s, &f), KVA_OK);
      KT_CHECK(kva_seq_len(c, f) == 12, "fork of a full-table sequence: len %d", kva_seq_len(c, f));
      kva_cache_destroy(c);
    }
  }
}

void test_cache(void) {
  test_bytes_per_token();
  test_cache_size();
  test_steps();
  test_create();
  test_seq_ids();
  test_cache_errors();
  test_pool_full();
  test_cache_f16_values();
  test_cache_random();
}
