/* paged_model.h - a shadow model of kvattn's paged KV cache, for the
 * randomized differential tests (test_paged.c, test_paged_weak.c) and the
 * libFuzzer harness (fuzz_paged.c).  Written from the documented behaviour
 * (docs/API.md), not from kvattn.h's code.
 *
 * Include it after kvattn.h (a translation unit may define
 * KVATTN_TEST_WEAK_HASH before kvattn.h: everything here is static inline, so
 * each TU tests its own build of the library).  PM_CHECK(cond, fmt, ...)
 * reports a violated expectation: KT_CHECK unless the includer defines it
 * (the fuzzer traps).
 *
 * The shadow is an "honest engine": every sequence has a salt and token ids,
 * and the K/V stored for a slot are a pseudo-random function of (salt, the
 * token ids up to and including that slot, layer, head, dim), except for
 * occasional garbage stores.  Only prefixes whose every slot holds that honest
 * content in every layer are published, with the sequence's own salt and
 * tokens.  So the K/V a prefix hit reads back are fully determined by the
 * query's own (salt, tokens): a hit that serves another prefix's blocks, a
 * stale block, or a block written after publication reads back wrong.
 *
 * The shadow does not model which block the library picks (so not the LRU
 * state); n_reused is checked against exact bounds instead:
 *  - upper: a multiple of block_size, <= n_tokens - 1, and no longer than the
 *    run of block keys (salt + token prefix) published since the last
 *    kva_cache_reset_prefix;
 *  - lower: right after kva_seq_publish(s, n), a kva_seq_new_prefix with s's
 *    salt and tokens reuses at least the n/bs published blocks (nothing can be
 *    recycled or aged in between: only kva_seq_append takes blocks or ages).
 * Exact LRU behaviour has directed tests in test_paged.c.
 *
 * After every operation: stats invariants (used + cached + free == n_blocks,
 * n_seqs, tokens_held, prefix counters, cow_copies == blocks fits() announced
 * beyond the new ones, appends_failed, block bounds), and the exact read-back
 * (K, V, positions) of every slot of every live sequence.  On any failure,
 * the stats must be unchanged (appends_failed aside). */
#ifndef KVATTN_TEST_PAGED_MODEL_H
#define KVATTN_TEST_PAGED_MODEL_H

#include <limits.h>

#include "kvattn.h"
#include "harness.h"
#include "ref.h"

#ifndef PM_CHECK
#define PM_CHECK KT_CHECK
#endif

/* ---------------------------------------------------------------- entropy */
/* Random choices come from an RNG, or (fuzzer) from the input bytes. */
typedef struct {
  kt_rng rng;
  const uint8_t *data;
  size_t n, at;
  int bytes, done;
} pm_src;

static inline int pm_int(pm_src *s, int lo, int hi) {
  uint32_t x;
  if (hi <= lo) return lo;
  if (s->bytes) {
    if (s->at >= s->n) {
      s->done = 1;
      return lo;
    }
    x = s->data[s->at++];
    if ((uint32_t)(hi - lo) > 255u && s->at < s->n) x = x << 8 | s->data[s->at++];
    return lo + (int)(x % (uint32_t)(hi - lo + 1));
  }
  return kt_int(&s->rng, lo, hi);
}
static inline int pm_chance(pm_src *s, int percent) { return pm_int(s, 0, 99) < percent; }

/* ---------------------------------------------------------------- content */
static inline uint64_t pm_mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
  h *= 0xBF58476D1CE4E5B9ULL;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBULL;
  return h ^ (h >> 29);
}
static inline uint64_t pm_ph0(uint64_t salt) { return pm_mix(salt ^ 0x5A175A175A175A17ULL, 0x1234567ULL); }
static inline uint64_t pm_ph_next(uint64_t ph, int32_t tok) { return pm_mix(ph, (uint64_t)(uint32_t)tok); }

/* The honest value of (prefix hash, layer, K or V, head, dim): 20 bits in
   [-2, 2), exact in F32. */
static inline float pm_val(uint64_t ph, int l, int which, int g, int d) {
  uint64_t h = pm_mix(pm_mix(ph, ((uint64_t)(unsigned)(l * 2 + which) << 32) | (unsigned)g), (uint64_t)(unsigned)d);
  int x = (int)((h >> 40) & 0xFFFFFu) - 0x80000;
  return (float)x * (1.0f / 262144.0f);
}

/* ---------------------------------------------------------------- model */
#define PM_EXCL 0    /* a partly filled tail block is this sequence's own, unpublished */
#define PM_SHARED 1  /* ... may be shared with a fork (never published: it was partial) */
#define PM_HONEST 1  /* ok[]: the slot holds the honest content in that layer */
#define PM_GARBAGE 2 /* ok[]: stored, but not the honest content */
#define PM_MAYBEPUB 2 /* ... was a full block before a truncate: may be published */

typedef struct {
  int live, id;
  uint64_t salt;
  int len, last_append, tail;
  int32_t *tok;      /* [cap] */
  uint64_t *ph;      /* [cap] prefix hash through slot i */
  float *k, *v;      /* [cap][L][G][D], [cap][L][G][DV]: expected read-back */
  unsigned char *ok; /* [cap][L]: 0 not stored, PM_HONEST the honest content, PM_GARBAGE stored garbage */
  int32_t *plan;     /* [cap + 2 bs] tokens a new_prefix caller still has to append */
  int n_plan, plan_at;
} pm_seq;

typedef struct {
  int n_layers, n_kv_heads, head_dim, v_dim, n_heads;
  int block_size, n_blocks, max_seqs, prefix_max_age;
  kva_dtype dtype;
  int vocab, n_salts;
  int evict_support; /* the cache's (this model never evicts: NONE means positions are the slots) */
} pm_config;

#define PM_HIST 12
typedef struct {
  uint64_t salt;
  int n;
  int32_t *tok;
} pm_hist;

typedef struct {
  pm_config cfg;
  kva_cache_desc desc;
  kva_cache *c;
  int L, G, D, DV, H, bs, nb, max_seqs, f16, cap; /* f16: read-back rounding, 1 F16, 2 BF16 */
  pm_src *src;
  pm_seq *s; /* [max_seqs] model slots */
  int n_live;
  uint64_t *pub; /* open-addressing set of published block keys (0 = empty) */
  int pub_cap, pub_n;
  long pub_events; /* blocks handed to kva_seq_publish since the last reset */
  long queries, hits, cow, failed;
  int ever_shared;
  int *ids; /* every id handed out */
  int n_ids, ids_cap;
  int dead[16]; /* recently freed ids */
  int n_dead;
  pm_hist hist[PM_HIST];
  int hist_at;
  int32_t *tbuf;            /* token scratch [cap + 2 bs] */
  float *kbuf, *vbuf, *rk, *rv; /* [cap][G][D]-sized scratch */
  int32_t *rpos;
  const char *op; /* the operation running (for failure reports) */
  /* coverage counters */
  long n_ops, n_full, n_hit_tokens, n_cow, n_lower, n_attend, n_never, n_later;
} pm_model;

static inline size_t pm_kidx(const pm_model *m, int slot, int l) {
  return ((size_t)slot * (size_t)m->L + (size_t)l) * (size_t)m->G * (size_t)m->D;
}
static inline size_t pm_vidx(const pm_model *m, int slot, int l) {
  return ((size_t)slot * (size_t)m->L + (size_t)l) * (size_t)m->G * (size_t)m->DV;
}
static inline float pm_round(const pm_model *m, float x) {
  return m->f16 == 1 ? ref_round_f16(x) : m->f16 == 2 ? ref_round_bf16(x) : x;
}
static inline int pm_blocks(const pm_model *m, long tokens) { return (int)((tokens + m->bs - 1) / m->bs); }

static inline void pm_stats(const pm_model *m, kva_cache_stats *st) { kva_cache_get_stats(m->c, st); }

/* every field equal (appends_failed too unless skip_failed) */

/* --- published-key set --- */
static inline void pm_pub_clear(pm_model *m) {
  memset(m->pub, 0, sizeof(uint64_t) * (size_t)m->pub_cap);
  m->pub_n = 0;
  m->pub_events = 0;
}
static inline int pm_pub_has(const pm_model *m, uint64_t key) {
  size_t i, mask = (size_t)m->pub_cap - 1;
  if (!key) key = 1;
  for (i = (size_t)(key & mask);; i = (i + 1) & mask) {
    if (m->pub[i] == key) return 1;
    if (m->pub[i] == 0) return 0;
  }
}
static inline void pm_pub_add(pm_model *m, uint64_t key) {
  size_t i, mask;
  if (!key) key = 1;
  if (pm_pub_has(m, key)) return;
  if (2 * (m->pub_n + 1) > m->pub_cap) { /* grow */
    uint64_t *old = m->pub;
    int j, oc = m->pub_cap;
    m->pub_cap *= 2;
    m->pub = (uint64_t *)calloc((size_t)m->pub_cap, sizeof(uint64_t));
    if (!m->pub) abort();
    m->pub_n = 0;
    for (j = 0; j < oc; j++)
      if (old[j]) {
        mask = (size_t)m->pub_cap - 1;
        for (i = (size_t)(old[j] & mask); m->pub[i]; i = (i + 1) & mask) {
        }
        m->pub[i] = old[j];
        m->pub_n++;
      }
    free(old);
  }
  mask = (size_t)m->pub_cap - 1;
  for (i = (size_t)(key & mask); m->pub[i]; i = (i + 1) & mask) {
  }
  m->pub[i] = key;
  m->pub_n++;
}

/* --- setup --- */
static inline void *pm_zalloc(size_t n) {
  void *p = calloc(n ? n : 1, 1);
  if (!p) abort();
  return p;
}

static inline kva_status pm_init(pm_model *m, const pm_config *cfg, pm_src *src) {
  int i;
  kva_status st;
  memset(m, 0, sizeof *m);
  m->cfg = *cfg;
  m->src = src;
  memset(&m->desc, 0, sizeof m->desc);
  m->desc.n_layers = cfg->n_layers;
  m->desc.n_kv_heads = cfg->n_kv_heads;
  m->desc.head_dim = cfg->head_dim;
  m->desc.v_dim = cfg->v_dim;
  m->desc.block_size = cfg->block_size;
  m->desc.n_blocks = cfg->n_blocks;
  m->desc.max_seqs = cfg->max_seqs;
  m->desc.prefix_max_age = cfg->prefix_max_age;
  m->desc.dtype = cfg->dtype;
  m->desc.evict_support = cfg->evict_support;
  st = kva_cache_create(&m->desc, &m->c);
  if (st != KVA_OK) return st;
  m->L = cfg->n_layers;
  m->G = cfg->n_kv_heads;
  m->D = cfg->head_dim;
  m->DV = cfg->v_dim ? cfg->v_dim : cfg->head_dim;
  m->H = cfg->n_heads;
  m->bs = cfg->block_size ? cfg->block_size : 16;
  m->nb = cfg->n_blocks;
  m->max_seqs = cfg->max_seqs ? cfg->max_seqs : 256;
  m->f16 = cfg->dtype == KVA_F16 || cfg->dtype == KVA_DTYPE_DEFAULT ? 1 : cfg->dtype == KVA_BF16 ? 2 : 0;
  m->cap = m->nb * m->bs;
  m->s = (pm_seq *)pm_zalloc(sizeof(pm_seq) * (size_t)m->max_seqs);
  for (i = 0; i < m->max_seqs; i++) {
    pm_seq *q = &m->s[i];
    q->tok = (int32_t *)pm_zalloc(sizeof(int32_t) * (size_t)m->cap);
    q->ph = (uint64_t *)pm_zalloc(sizeof(uint64_t) * (size_t)m->cap);
    q->k = (float *)pm_zalloc(sizeof(float) * pm_kidx(m, m->cap, 0));
    q->v = (float *)pm_zalloc(sizeof(float) * pm_vidx(m, m->cap, 0));
    q->ok = (unsigned char *)pm_zalloc((size_t)m->cap * (size_t)m->L);
    q->plan = (int32_t *)pm_zalloc(sizeof(int32_t) * (size_t)(m->cap + 2 * m->bs));
  }
  m->pub_cap = 256;
  m->pub = (uint64_t *)pm_zalloc(sizeof(uint64_t) * (size_t)m->pub_cap);
  m->ids_cap = 256;
  m->ids = (int *)pm_zalloc(sizeof(int) * (size_t)m->ids_cap);
  for (i = 0; i < PM_HIST; i++) m->hist[i].tok = (int32_t *)pm_zalloc(sizeof(int32_t) * (size_t)m->cap);
  m->tbuf = (int32_t *)pm_zalloc(sizeof(int32_t) * (size_t)(m->cap + 2 * m->bs));
  m->kbuf = (float *)pm_zalloc(sizeof(float) * (size_t)m->cap * (size_t)m->G * (size_t)(m->D > m->DV ? m->D : m->DV));
  m->vbuf = (float *)pm_zalloc(sizeof(float) * (size_t)m->cap * (size_t)m->G * (size_t)(m->D > m->DV ? m->D : m->DV));
  m->rk = (float *)pm_zalloc(sizeof(float) * (size_t)m->G * (size_t)m->D);
  m->rv = (float *)pm_zalloc(sizeof(float) * (size_t)m->G * (size_t)m->DV);
  m->rpos = (int32_t *)pm_zalloc(sizeof(int32_t) * (size_t)m->G);
  return KVA_OK;
}

static inline void pm_destroy(pm_model *m) {
  int i;
  kva_cache_destroy(m->c);
  for (i = 0; i < m->max_seqs; i++) {
    free(m->s[i].tok);
    free(m->s[i].ph);
    free(m->s[i].k);
    free(m->s[i].v);
    free(m->s[i].ok);
    free(m->s[i].plan);
  }
  for (i = 0; i < PM_HIST; i++) free(m->hist[i].tok);
  free(m->s);
  free(m->pub);
  free(m->ids);
  free(m->tbuf);
  free(m->kbuf);
  free(m->vbuf);
  free(m->rk);
  free(m->rv);
  free(m->rpos);
  memset(m, 0, sizeof *m);
}

/* --- sequences --- */
static inline int pm_id_seen(const pm_model *m, int id) {
  int i;
  for (i = 0; i < m->n_ids; i++)
    if (m->ids[i] == id) return 1;
  return 0;
}
static inline void pm_id_add(pm_model *m, int id) {
  if (m->n_ids == m->ids_cap) {
    m->ids_cap *= 2;
    m->ids = (int *)realloc(m->ids, sizeof(int) * (size_t)m->ids_cap);
    if (!m->ids) abort();
  }
  m->ids[m->n_ids++] = id;
}

static inline pm_seq *pm_slot_free(pm_model *m) {
  int i;
  for (i = 0; i < m->max_seqs; i++)
    if (!m->s[i].live) return &m->s[i];
  return NULL;
}

/* a random live sequence, or NULL */
static inline pm_seq *pm_pick(pm_model *m) {
  int i, k;
  if (m->n_live == 0) return NULL;
  k = pm_int(m->src, 0, m->n_live - 1);
  for (i = 0; i < m->max_seqs; i++)
    if (m->s[i].live && k-- == 0) return &m->s[i];
  return NULL;
}

/* a random live sequence with a latest append (else any) */
static inline pm_seq *pm_pick_appended(pm_model *m) {
  int i, n = 0, k;
  for (i = 0; i < m->max_seqs; i++) n += m->s[i].live && m->s[i].last_append > 0;
  if (n == 0 || pm_chance(m->src, 10)) return pm_pick(m);
  k = pm_int(m->src, 0, n - 1);
  for (i = 0; i < m->max_seqs; i++)
    if (m->s[i].live && m->s[i].last_append > 0 && k-- == 0) return &m->s[i];
  return NULL;
}

static inline uint64_t pm_salt_of(pm_model *m, int which) {
  static const uint64_t salts[4] = {0ULL, 1ULL, 0xDEADBEEFCAFEF00DULL, 0x8000000000000000ULL};
  (void)m;
  return salts[which & 3];
}

/* A new model sequence for a library id (len 0). */
static inline pm_seq *pm_seq_start(pm_model *m, int id, uint64_t salt) {
  pm_seq *q = pm_slot_free(m);
  if (!q) abort(); /* cannot happen: the library holds at most max_seqs */
  q->live = 1;
  q->id = id;
  q->salt = salt;
  q->len = q->last_append = 0;
  q->tail = PM_EXCL;
  q->n_plan = q->plan_at = 0;
  m->n_live++;
  pm_id_add(m, id);
  return q;
}

/* Put token t at slot i of q: prefix hash, zeroed K/V (appended, not stored). */
static inline void pm_set_token(pm_model *m, pm_seq *q, int i, int32_t t) {
  q->tok[i] = t;
  q->ph[i] = pm_ph_next(i ? q->ph[i - 1] : pm_ph0(q->salt), t);
  memset(q->k + pm_kidx(m, i, 0), 0, sizeof(float) * (size_t)m->L * (size_t)m->G * (size_t)m->D);
  memset(q->v + pm_vidx(m, i, 0), 0, sizeof(float) * (size_t)m->L * (size_t)m->G * (size_t)m->DV);
  memset(q->ok + (size_t)i * (size_t)m->L, 0, (size_t)m->L);
}

/* The honest content of slot i, layer l. */
static inline void pm_honest(const pm_model *m, const pm_seq *q, int i, int l, float *k, float *v) {
  int g, d;
  for (g = 0; g < m->G; g++) {
    for (d = 0; d < m->D; d++) k[g * m->D + d] = pm_val(q->ph[i], l, 0, g, d);
    for (d = 0; d < m->DV; d++) v[g * m->DV + d] = pm_val(q->ph[i], l, 1, g, d);
  }
}

/* leading slots that hold the honest content in every layer */
static inline int pm_honest_prefix(const pm_model *m, const pm_seq *q) {
  int i, l;
  for (i = 0; i < q->len; i++)
    for (l = 0; l < m->L; l++)
      if (q->ok[(size_t)i * (size_t)m->L + l] != PM_HONEST) return i;
  return q->len;
}

/* leading slots stored (honest or not) in every layer */
static inline int pm_stored_prefix(const pm_model *m, const pm_seq *q) {
  int i, l;
  for (i = 0; i < q->len; i++)
    for (l = 0; l < m->L; l++)
      if (!q->ok[(size_t)i * (size_t)m->L + l]) return i;
  return q->len;
}

/* has layer l stored every token of q's step (what attending it needs)? */
static inline int pm_step_stored(const pm_model *m, const pm_seq *q, int l) {
  int i;
  for (i = q->len - q->last_append; i < q->len; i++)
    if (!q->ok[(size_t)i * (size_t)m->L + l]) return 0;
  return 1;
}

/* ---------------------------------------------------------------- checks */
static inline void pm_check_seq(pm_model *m, const pm_seq *q) {
  int i, l, g, len = kva_seq_len(m->c, q->id), pos = kva_seq_pos(m->c, q->id);
  size_t nk = (size_t)m->G * (size_t)m->D, nv = (size_t)m->G * (size_t)m->DV;
  PM_CHECK(len == q->len, "seq %d: kva_seq_len %d, model %d", q->id, len, q->len);
  PM_CHECK(pos == q->len, "seq %d: kva_seq_pos %d, model %d", q->id, pos, q->len);
  if (len != q->len) return;
  for (i = 0; i < q->len; i++)
    for (l = 0; l < m->L; l++) {
      kva_status st = kva_seq_read(m->c, q->id, l, i, m->rk, m->rv, m->rpos);
      int kok, vok, pok = 1;
      PM_CHECK(st == KVA_OK, "seq %d slot %d layer %d: kva_seq_read %s", q->id, i, l, kva_status_str(st));
      if (st != KVA_OK) return;
      kok = memcmp(m->rk, q->k + pm_kidx(m, i, l), nk * sizeof(float)) == 0;
      vok = memcmp(m->rv, q->v + pm_vidx(m, i, l), nv * sizeof(float)) == 0;
      for (g = 0; g < m->G; g++) pok &= m->rpos[g] == i;
      PM_CHECK(kok && vok && pok,
               "seq %d slot %d layer %d: read-back differs (K %s, V %s, pos %s; K[0] %.9g want %.9g, pos[0] %d)",
               q->id, i, l, kok ? "ok" : "WRONG", vok ? "ok" : "WRONG", pok ? "ok" : "WRONG", (double)m->rk[0],
               (double)q->k[pm_kidx(m, i, l)], (int)m->rpos[0]);
      if (!(kok && vok && pok)) return;
    }
}

static inline void pm_check_stats(pm_model *m) {
  kva_cache_stats st;
  int i, mx = 0;
  long sum_len = 0, sum_blocks = 0;
  pm_stats(m, &st);
  for (i = 0; i < m->max_seqs; i++)
    if (m->s[i].live) {
      int b = pm_blocks(m, m->s[i].len);
      sum_len += m->s[i].len;
      sum_blocks += b;
      if (b > mx) mx = b;
    }
  PM_CHECK(st.n_blocks == m->nb, "stats n_blocks %d, want %d", st.n_blocks, m->nb);
  PM_CHECK(st.blocks_used >= 0 && st.blocks_cached >= 0 && st.blocks_free >= 0 &&
               st.blocks_used + st.blocks_cached + st.blocks_free == m->nb,
           "stats used %d + cached %d + free %d != n_blocks %d", st.blocks_used, st.blocks_cached, st.blocks_free,
           m->nb);
  PM_CHECK(st.n_seqs == m->n_live, "stats n_seqs %d, model %d", st.n_seqs, m->n_live);
  PM_CHECK(st.tokens_held == sum_len, "stats tokens_held %ld, sum of lengths %ld", st.tokens_held, sum_len);
  PM_CHECK(st.blocks_used >= mx && st.blocks_used <= sum_blocks,
           "stats blocks_used %d outside [%d, %ld] (largest sequence's blocks, all sequences' blocks)",
           st.blocks_used, mx, sum_blocks);
  if (!m->ever_shared)
    PM_CHECK(st.blocks_used == sum_blocks, "nothing shared: blocks_used %d, want %ld", st.blocks_used, sum_blocks);
  PM_CHECK(st.blocks_cached <= m->pub_events, "blocks_cached %d > blocks published since the last reset %ld",
           st.blocks_cached, m->pub_events);
  PM_CHECK(st.prefix_queries == m->queries && st.prefix_hits == m->hits,
           "stats prefix_queries %ld / hits %ld, model %ld / %ld", st.prefix_queries, st.prefix_hits, m->queries,
           m->hits);
  PM_CHECK(st.cow_copies == m->cow, "stats cow_copies %ld, model %ld", st.cow_copies, m->cow);
  PM_CHECK(st.appends_failed == m->failed, "stats appends_failed %ld, model %ld", st.appends_failed, m->failed);
  PM_CHECK(st.token_slots == (long)st.blocks_used * m->bs, "token_slots %ld != blocks_used %d * %d",
           st.token_slots, st.blocks_used, m->bs);
  PM_CHECK(st.bytes_total == st.block_bytes * (size_t)m->nb, "bytes_total %lu != block_bytes %lu * n_blocks",
           (unsigned long)st.bytes_total, (unsigned long)st.block_bytes);
  PM_CHECK(st.block_bytes >= kva_cache_bytes_per_token(&m->desc) * (size_t)m->bs,
           "block_bytes %lu < bytes_per_token * block_size", (unsigned long)st.block_bytes);
}

static inline void pm_check_all(pm_model *m) {
  int i;
  pm_check_stats(m);
  for (i = 0; i < m->max_seqs; i++)
    if (m->s[i].live) pm_check_seq(m, &m->s[i]);
}

/* ---------------------------------------------------------------- ops */
static inline void pm_op_new(pm_model *m) {
  kva_cache_stats b, a;
  int id = -7;
  kva_status st;
  pm_stats(m, &b);
  st = kva_seq_new(m->c, &id);
  if (m->n_live == m->max_seqs) {
    pm_stats(m, &a);
    PM_CHECK(st == KVA_ERR_SEQ_LIMIT, "kva_seq_new with max_seqs %d live: %s, want KVA_ERR_SEQ_LIMIT", m->max_seqs,
             kva_status_str(st));
    PM_CHECK(kt_stats_equal(&a, &b, 0), "failed kva_seq_new changed the stats");
    return;
  }
  PM_CHECK(st == KVA_OK, "kva_seq_new: %s with %d of %d live", kva_status_str(st), m->n_live, m->max_seqs);
  if (st != KVA_OK) return;
  PM_CHECK(id >= 0 && !pm_id_seen(m, id), "kva_seq_new handed out id %d again", id);
  pm_seq_start(m, id, pm_salt_of(m, pm_int(m->src, 0, m->cfg.n_salts - 1)));
}

/* store the newest n slots of q, layer l; honest or garbage */
static inline void pm_do_store(pm_model *m, pm_seq *q, int l, int n, int honest) {
  kva_cache_stats b, a;
  kva_status st;
  int t, i;
  size_t nk = (size_t)m->G * (size_t)m->D, nv = (size_t)m->G * (size_t)m->DV;
  int valid = n <= q->last_append && n <= q->len;
  for (t = 0; t < n && t < m->cap; t++) {
    int slot = q->len - n + t;
    if (honest && slot >= 0) {
      pm_honest(m, q, slot, l, m->kbuf + t * nk, m->vbuf + t * nv);
    } else {
      for (i = 0; i < (int)nk; i++) m->kbuf[t * nk + i] = kt_uniform(&m->src->rng, -3.0f, 3.0f);
      for (i = 0; i < (int)nv; i++) m->vbuf[t * nv + i] = kt_uniform(&m->src->rng, -3.0f, 3.0f);
    }
  }
  pm_stats(m, &b);
  st = kva_store(m->c, q->id, l, m->kbuf, m->vbuf, n);
  pm_stats(m, &a);
  PM_CHECK(kt_stats_equal(&a, &b, 0), "kva_store changed the stats");
  if (n == 0) {
    PM_CHECK(st == KVA_OK, "kva_store(n 0) = %s", kva_status_str(st));
    return;
  }
  if (!valid) {
    PM_CHECK(st == KVA_ERR_STEP, "kva_store of %d tokens, latest append %d: %s, want KVA_ERR_STEP", n,
             q->last_append, kva_status_str(st));
    return;
  }
  PM_CHECK(st == KVA_OK, "kva_store of %d tokens (latest append %d, len %d): %s", n, q->last_append, q->len,
           kva_status_str(st));
  if (st != KVA_OK) return;
  for (t = 0; t < n; t++) {
    int slot = q->len - n + t, g, d;
    for (g = 0; g < m->G; g++) {
      for (d = 0; d < m->D; d++)
        q->k[pm_kidx(m, slot, l) + (size_t)g * m->D + d] = pm_round(m, m->kbuf[t * nk + (size_t)g * m->D + d]);
      for (d = 0; d < m->DV; d++)
        q->v[pm_vidx(m, slot, l) + (size_t)g * m->DV + d] = pm_round(m, m->vbuf[t * nv + (size_t)g * m->DV + d]);
    }
    q->ok[(size_t)slot * m->L + l] = (unsigned char)(honest ? PM_HONEST : PM_GARBAGE);
  }
}

static inline void pm_op_store(pm_model *m) {
  pm_seq *q = pm_pick_appended(m);
  int n, r, l;
  if (!q) return;
  r = pm_int(m->src, 0, 9);
  n = r < 6 ? q->last_append : r < 8 ? pm_int(m->src, 0, q->last_append) : q->last_append + 1;
  l = pm_int(m->src, 0, m->L - 1); /* one choice per statement: the same stream with every compiler */
  pm_do_store(m, q, l, n, pm_chance(m->src, 95));
}

/* fits + append of n tokens to q, with every consistency check */
static inline void pm_do_append(pm_model *m, pm_seq *q, int n) {
  kva_cache_stats b, a;
  kva_status st;
  kva_fit f;
  int need = -1, nmin, maybe_cow, own, avail, i;
  pm_stats(m, &b);
  avail = b.blocks_free + b.blocks_cached;
  own = pm_blocks(m, q->len);
  f = kva_seq_fits(m->c, q->id, n, &need);
  if (n < 0) {
    PM_CHECK(f == KVA_FITS_NEVER, "kva_seq_fits(n %d) = %d, want NEVER", n, (int)f);
    st = kva_seq_append(m->c, q->id, n);
    PM_CHECK(st == KVA_ERR_ARG, "kva_seq_append(n %d) = %s, want KVA_ERR_ARG", n, kva_status_str(st));
    pm_stats(m, &a);
    PM_CHECK(kt_stats_equal(&a, &b, 0), "kva_seq_append(negative) changed the stats");
    return;
  }
  nmin = n ? pm_blocks(m, (long)q->len + n) - own : 0;
  maybe_cow = n > 0 && q->len % m->bs != 0 && q->tail != PM_EXCL;
  PM_CHECK(need >= nmin && need <= nmin + maybe_cow,
           "kva_seq_fits(len %d, n %d): blocks_needed %d, want %d%s (tail state %d)", q->len, n, need, nmin,
           maybe_cow ? " or one more (copy-on-write)" : "", q->tail);
  if (pm_blocks(m, (long)q->len + n) > m->nb) {
    PM_CHECK(f == KVA_FITS_NEVER, "kva_seq_fits: %d blocks for the sequence in a pool of %d: %d, want NEVER",
             pm_blocks(m, (long)q->len + n), m->nb, (int)f);
  } else if (need <= avail) {
    PM_CHECK(f == KVA_FITS_NOW, "kva_seq_fits: needs %d, %d free + cached: %d, want NOW", need, avail, (int)f);
  } else {
    /* NEVER only if even a lone sequence could not do it: a copy-on-write
       block needed only because a fork shares the tail goes once the fork
       does; a published tail (after a truncate) needs its copy forever */
    PM_CHECK(f == KVA_FITS_LATER || (f == KVA_FITS_NEVER && q->tail == PM_MAYBEPUB && own + need > m->nb),
             "kva_seq_fits: needs %d of %d available, holds %d of %d: %d, want LATER", need, avail, own, m->nb,
             (int)f);
  }
  if (f == KVA_FITS_NEVER) m->n_never++;
  if (f == KVA_FITS_LATER) m->n_later++;
  st = kva_seq_append(m->c, q->id, n);
  pm_stats(m, &a);
  if (n == 0) {
    PM_CHECK(st == KVA_OK, "kva_seq_append(0) = %s", kva_status_str(st));
    PM_CHECK(kt_stats_equal(&a, &b, 0), "kva_seq_append(0) changed the stats");
    return;
  }
  PM_CHECK((st == KVA_OK) == (f == KVA_FITS_NOW), "kva_seq_append(len %d, n %d) = %s but kva_seq_fits said %d",
           q->len, n, kva_status_str(st), (int)f);
  if (st != KVA_OK) {
    PM_CHECK(st == KVA_ERR_FULL, "kva_seq_append = %s, want KVA_ERR_FULL", kva_status_str(st));
    m->failed++;
    m->n_full++;
    PM_CHECK(kt_stats_equal(&a, &b, 1) && a.appends_failed == b.appends_failed + 1,
             "KVA_ERR_FULL changed the stats (used %d->%d cached %d->%d free %d->%d forgotten %ld->%ld, failed "
             "%ld->%ld)",
             b.blocks_used, a.blocks_used, b.blocks_cached, a.blocks_cached, b.blocks_free, a.blocks_free,
             b.prefix_forgotten, a.prefix_forgotten, b.appends_failed, a.appends_failed);
    return;
  }
  {
    /* the copy announced for a published tail is skipped when the append's
       own prefix housekeeping (max age, recycling) unpublished that block */
    long dc = a.cow_copies - b.cow_copies;
    if (a.prefix_forgotten > b.prefix_forgotten)
      PM_CHECK(dc >= 0 && dc <= need - nmin, "append copied %ld blocks, fits announced %d (prefix blocks forgotten)",
               dc, need - nmin);
    else
      PM_CHECK(dc == need - nmin, "append copied %ld blocks (cow_copies), fits announced %d", dc, need - nmin);
    m->cow += dc;
    m->n_cow += dc;
  }
  PM_CHECK(a.blocks_free + a.blocks_cached == avail - need ||
               (need > nmin && a.blocks_free + a.blocks_cached == avail - need + 1),
           "append took %d blocks (free+cached %d -> %d), fits announced %d", avail - a.blocks_free - a.blocks_cached,
           avail, a.blocks_free + a.blocks_cached, need);
  PM_CHECK(a.prefix_forgotten >= b.prefix_forgotten, "prefix_forgotten went down");
  for (i = 0; i < n; i++) {
    int32_t t = q->plan_at < q->n_plan ? q->plan[q->plan_at++] : (int32_t)pm_int(m->src, 0, m->cfg.vocab - 1);
    pm_set_token(m, q, q->len + i, t);
  }
  q->len += n;
  q->last_append = n;
  q->tail = PM_EXCL;
}

static inline void pm_op_append(pm_model *m) {
  pm_seq *q = pm_pick(m);
  kva_cache_stats st;
  int r, n, l;
  if (!q) return;
  pm_stats(m, &st);
  r = pm_int(m->src, 0, 99);
  if (r < 5) n = 0;
  else if (r < 55) n = pm_int(m->src, 1, m->bs + 1);
  else if (r < 75) n = pm_int(m->src, 1, 3 * m->bs);
  else if (r < 93) { /* right at the edge of the pool */
    int room = (st.blocks_free + st.blocks_cached) * m->bs + (m->bs - q->len % m->bs) % m->bs;
    n = room + pm_int(m->src, -1, 1);
    if (n < 1) n = 1;
  } else if (r < 98)
    n = m->cap - q->len + pm_int(m->src, 0, 2); /* the whole pool, or just beyond */
  else
    n = -pm_int(m->src, 1, 3);
  if (n > 0 && n > m->cap + m->bs) n = m->cap + m->bs;
  pm_do_append(m, q, n);
  /* usually the engine stores every layer right away */
  if (q->last_append > 0 && q->len > 0 && pm_chance(m->src, 95))
    for (l = 0; l < m->L; l++)
      if (pm_chance(m->src, 98)) pm_do_store(m, q, l, q->last_append, pm_chance(m->src, 99));
}

static inline void pm_op_fork(pm_model *m) {
  pm_seq *q = pm_pick(m), *d;
  kva_cache_stats b, a;
  kva_status st;
  int id = -7;
  if (!q) return;
  pm_stats(m, &b);
  st = kva_seq_fork(m->c, q->id, &id);
  pm_stats(m, &a);
  if (m->n_live == m->max_seqs) {
    PM_CHECK(st == KVA_ERR_SEQ_LIMIT, "kva_seq_fork with max_seqs live: %s, want KVA_ERR_SEQ_LIMIT", kva_status_str(st));
    PM_CHECK(kt_stats_equal(&a, &b, 0), "failed kva_seq_fork changed the stats");
    return;
  }
  PM_CHECK(st == KVA_OK, "kva_seq_fork: %s", kva_status_str(st));
  if (st != KVA_OK) return;
  PM_CHECK(id >= 0 && !pm_id_seen(m, id), "kva_seq_fork handed out id %d again", id);
  PM_CHECK(a.blocks_used == b.blocks_used && a.blocks_free == b.blocks_free && a.blocks_cached == b.blocks_cached,
           "kva_seq_fork took or moved blocks (used %d->%d free %d->%d cached %d->%d)", b.blocks_used,
           a.blocks_used, b.blocks_free, a.blocks_free, b.blocks_cached, a.blocks_cached);
  d = pm_seq_start(m, id, q->salt);
  d->len = q->len;
  memcpy(d->tok, q->tok, sizeof(int32_t) * (size_t)q->len);
  memcpy(d->ph, q->ph, sizeof(uint64_t) * (size_t)q->len);
  memcpy(d->k, q->k, sizeof(float) * pm_kidx(m, q->len, 0));
  memcpy(d->v, q->v, sizeof(float) * pm_vidx(m, q->len, 0));
  memcpy(d->ok, q->ok, (size_t)q->len * (size_t)m->L);
  memcpy(d->plan, q->plan, sizeof(int32_t) * (size_t)q->n_plan);
  d->n_plan = q->n_plan;
  d->plan_at = q->plan_at;
  q->last_append = d->last_append = 0;
  if (q->tail != PM_MAYBEPUB) q->tail = PM_SHARED;
  d->tail = q->tail;
  if (q->len > 0) m->ever_shared = 1;
}

static inline void pm_kill(pm_model *m, pm_seq *q) {
  q->live = 0;
  m->n_live--;
  m->dead[m->n_dead++ % 16] = q->id;
}

static inline void pm_op_free(pm_model *m) {
  pm_seq *q = pm_pick(m);
  kva_cache_stats b, a;
  kva_status st;
  if (!q) return;
  pm_stats(m, &b);
  st = kva_seq_free(m->c, q->id);
  pm_stats(m, &a);
  PM_CHECK(st == KVA_OK, "kva_seq_free: %s", kva_status_str(st));
  PM_CHECK(a.blocks_free >= b.blocks_free && a.blocks_used <= b.blocks_used &&
               b.blocks_used - a.blocks_used <= pm_blocks(m, q->len),
           "kva_seq_free: used %d->%d free %d->%d (held %d blocks)", b.blocks_used, a.blocks_used, b.blocks_free,
           a.blocks_free, pm_blocks(m, q->len));
  PM_CHECK(a.prefix_forgotten == b.prefix_forgotten, "kva_seq_free forgot published blocks");
  pm_kill(m, q);
  PM_CHECK(kva_seq_len(m->c, q->id) == -1 && kva_seq_pos(m->c, q->id) == -1, "freed seq %d still answers", q->id);
}

/* kva_seq_new_prefix with tokens tok[0..n) and salt; lower = reuse it must reach */
static inline pm_seq *pm_do_new_prefix(pm_model *m, const int32_t *tok, int n, uint64_t salt, int lower) {
  kva_cache_stats b, a;
  kva_status st;
  int id = -7, reused = -7, ub = 0, j, i, l, maxb;
  uint64_t ph = pm_ph0(salt);
  pm_seq *q;
  maxb = n > 0 ? (n - 1) / m->bs : 0;
  for (j = 0; j < maxb; j++) { /* longest run of published keys */
    for (i = 0; i < m->bs; i++) ph = pm_ph_next(ph, tok[j * m->bs + i]);
    if (!pm_pub_has(m, ph)) break;
    ub++;
  }
  pm_stats(m, &b);
  st = kva_seq_new_prefix(m->c, tok, n, salt, &id, &reused);
  pm_stats(m, &a);
  if (m->n_live == m->max_seqs) {
    PM_CHECK(st == KVA_ERR_SEQ_LIMIT, "kva_seq_new_prefix with max_seqs live: %s, want KVA_ERR_SEQ_LIMIT",
             kva_status_str(st));
    PM_CHECK(kt_stats_equal(&a, &b, 0), "failed kva_seq_new_prefix changed the stats");
    return NULL;
  }
  PM_CHECK(st == KVA_OK, "kva_seq_new_prefix: %s", kva_status_str(st));
  if (st != KVA_OK) return NULL;
  PM_CHECK(id >= 0 && !pm_id_seen(m, id), "kva_seq_new_prefix handed out id %d again", id);
  PM_CHECK(reused >= 0 && reused % m->bs == 0 && reused <= maxb * m->bs,
           "n_reused %d for %d tokens (block %d): not a multiple of the block, or > n_tokens - 1", reused, n, m->bs);
  PM_CHECK(reused <= ub * m->bs,
           "n_reused %d but only %d tokens of that (salt, tokens) prefix were ever published (since the last reset)",
           reused, ub * m->bs);
  PM_CHECK(reused >= lower, "n_reused %d right after publishing %d tokens of it (n_tokens %d)", reused, lower, n);
  if (reused < 0 || reused > maxb * m->bs || reused % m->bs) reused = 0; /* keep the model sane */
  PM_CHECK(a.blocks_free == b.blocks_free && a.blocks_used - b.blocks_used == b.blocks_cached - a.blocks_cached &&
               a.blocks_used >= b.blocks_used,
           "kva_seq_new_prefix took blocks (used %d->%d cached %d->%d free %d->%d)", b.blocks_used, a.blocks_used,
           b.blocks_cached, a.blocks_cached, b.blocks_free, a.blocks_free);
  m->queries += n;
  m->hits += reused;
  m->n_hit_tokens += reused;
  q = pm_seq_start(m, id, salt);
  for (i = 0; i < reused; i++) {
    pm_set_token(m, q, i, tok[i]);
    for (l = 0; l < m->L; l++) {
      int g, d;
      pm_honest(m, q, i, l, q->k + pm_kidx(m, i, l), q->v + pm_vidx(m, i, l));
      for (g = 0; g < m->G; g++) {
        for (d = 0; d < m->D; d++) {
          float *x = q->k + pm_kidx(m, i, l) + (size_t)g * m->D + d;
          *x = pm_round(m, *x);
        }
        for (d = 0; d < m->DV; d++) {
          float *x = q->v + pm_vidx(m, i, l) + (size_t)g * m->DV + d;
          *x = pm_round(m, *x);
        }
      }
      q->ok[(size_t)i * m->L + l] = PM_HONEST;
    }
  }
  q->len = reused;
  q->n_plan = n - reused < m->cap + 2 * m->bs ? n - reused : m->cap + 2 * m->bs;
  if (q->n_plan > 0) memcpy(q->plan, tok + reused, sizeof(int32_t) * (size_t)q->n_plan);
  q->plan_at = 0;
  if (reused > 0) m->ever_shared = 1;
  return q;
}

static inline void pm_op_new_prefix(pm_model *m) {
  int r = pm_int(m->src, 0, 99), n = 0, i;
  uint64_t salt = pm_salt_of(m, pm_int(m->src, 0, m->cfg.n_salts - 1));
  int32_t *t = m->tbuf;
  int maxn = m->cap + 2 * m->bs;
  pm_seq *q;
  if (r < 40 && (q = pm_pick(m)) != NULL) { /* a live sequence's prompt */
    n = pm_int(m->src, 0, q->len);
    memcpy(t, q->tok, sizeof(int32_t) * (size_t)n);
    if (pm_chance(m->src, 85)) salt = q->salt;
  } else if (r < 80 && m->hist[0].n > 0) { /* a prompt published earlier */
    const pm_hist *h = &m->hist[pm_int(m->src, 0, PM_HIST - 1)];
    n = pm_int(m->src, 0, h->n);
    memcpy(t, h->tok, sizeof(int32_t) * (size_t)n);
    if (pm_chance(m->src, 85)) salt = h->salt;
  }
  i = pm_int(m->src, 0, 2 * m->bs); /* then a few more */
  while (i-- > 0 && n < maxn) t[n++] = (int32_t)pm_int(m->src, 0, m->cfg.vocab - 1);
  if (n > 0 && pm_chance(m->src, 15)) {
    int at = pm_int(m->src, 0, n - 1);
    t[at] ^= 1 + pm_int(m->src, 0, 2);
  }
  pm_do_new_prefix(m, t, n, salt, 0);
}

static inline void pm_op_publish(pm_model *m) {
  pm_seq *q = pm_pick(m), *p;
  int tries;
  for (tries = 0; tries < 4 && q && pm_honest_prefix(m, q) < m->bs; tries++) q = pm_pick(m);
  kva_cache_stats b, a;
  kva_status st;
  int hp, n, r, j, nfull;
  if (!q) return;
  hp = pm_honest_prefix(m, q);
  r = pm_int(m->src, 0, 99);
  {
    int sp = pm_stored_prefix(m, q), reach = (sp / m->bs + 1) * m->bs; /* full blocks over an unstored slot */
    if (r >= 95 && sp < q->len && reach <= q->len) {
      n = reach + pm_int(m->src, 0, q->len - reach);
      pm_stats(m, &b);
      st = kva_seq_publish(m->c, q->id, q->tok, n, q->salt);
      pm_stats(m, &a);
      PM_CHECK(st == KVA_ERR_NOT_STORED, "kva_seq_publish(%d of %d) over slot %d, unstored in a layer = %s", n,
               q->len, sp, kva_status_str(st));
      PM_CHECK(kt_stats_equal(&a, &b, 0), "refused kva_seq_publish changed the stats");
      return;
    }
  }
  if (r < 60) n = (pm_int(m->src, 0, hp / m->bs)) * m->bs;
  else if (r < 90) n = pm_int(m->src, 0, hp);
  else if (r < 95) n = 0;
  else n = q->len + 1; /* more than held */
  pm_stats(m, &b);
  st = kva_seq_publish(m->c, q->id, q->tok, n, q->salt);
  pm_stats(m, &a);
  PM_CHECK(a.blocks_used == b.blocks_used && a.blocks_free == b.blocks_free && a.blocks_cached == b.blocks_cached,
           "kva_seq_publish moved blocks");
  if (n > q->len) {
    PM_CHECK(st == KVA_ERR_ARG, "kva_seq_publish(%d tokens of %d) = %s, want KVA_ERR_ARG", n, q->len,
             kva_status_str(st));
    PM_CHECK(kt_stats_equal(&a, &b, 0), "failed kva_seq_publish changed the stats");
    return;
  }
  PM_CHECK(st == KVA_OK, "kva_seq_publish(%d of %d) = %s", n, q->len, kva_status_str(st));
  if (st != KVA_OK || n == 0) return;
  q->last_append = 0;
  nfull = n / m->bs;
  for (j = 0; j < nfull; j++) pm_pub_add(m, q->ph[(j + 1) * m->bs - 1]);
  m->pub_events += nfull;
  if (nfull > 0) { /* remember the prompt for later queries */
    pm_hist *h = &m->hist[m->hist_at++ % PM_HIST];
    h->salt = q->salt;
    h->n = q->len;
    memcpy(h->tok, q->tok, sizeof(int32_t) * (size_t)q->len);
    if (m->hist_at < PM_HIST) /* fill the ring so picks always find something */
      for (j = m->hist_at; j < PM_HIST; j++) {
        m->hist[j].salt = h->salt;
        m->hist[j].n = h->n;
        memcpy(m->hist[j].tok, h->tok, sizeof(int32_t) * (size_t)h->n);
      }
  }
  /* right away, the same prompt must find what was just published */
  if (nfull > 0 && m->n_live < m->max_seqs && pm_chance(m->src, 70)) {
    int len = pm_int(m->src, 1, q->len + m->bs), i, lower;
    memcpy(m->tbuf, q->tok, sizeof(int32_t) * (size_t)(len < q->len ? len : q->len));
    for (i = q->len; i < len; i++) m->tbuf[i] = (int32_t)pm_int(m->src, 0, m->cfg.vocab - 1);
    lower = (len - 1) / m->bs < nfull ? (len - 1) / m->bs : nfull;
    m->n_lower++;
    p = pm_do_new_prefix(m, m->tbuf, len, q->salt, lower * m->bs);
    if (p && pm_chance(m->src, 50)) {
      kva_status fs = kva_seq_free(m->c, p->id);
      PM_CHECK(fs == KVA_OK, "kva_seq_free(probe) = %s", kva_status_str(fs));
      pm_kill(m, p);
    }
  }
}

static inline void pm_op_truncate(pm_model *m) {
  pm_seq *q = pm_pick(m);
  kva_cache_stats b, a;
  kva_status st;
  int n, r;
  if (!q) return;
  r = pm_int(m->src, 0, 99);
  n = r < 90 ? pm_int(m->src, 0, q->len) : r < 95 ? q->len + 1 : -1;
  pm_stats(m, &b);
  st = kva_seq_truncate(m->c, q->id, n);
  pm_stats(m, &a);
  if (n < 0 || n > q->len) {
    PM_CHECK(st == KVA_ERR_ARG, "kva_seq_truncate(%d of %d) = %s, want KVA_ERR_ARG", n, q->len,
             kva_status_str(st));
    PM_CHECK(kt_stats_equal(&a, &b, 0), "failed kva_seq_truncate changed the stats");
    return;
  }
  PM_CHECK(st == KVA_OK, "kva_seq_truncate(%d of %d) = %s", n, q->len, kva_status_str(st));
  if (st != KVA_OK) return;
  PM_CHECK(a.blocks_free >= b.blocks_free && a.blocks_used <= b.blocks_used &&
               a.blocks_used + a.blocks_cached <= b.blocks_used + b.blocks_cached,
           "kva_seq_truncate took blocks");
  if (n % m->bs != 0) {
    int same_block = n / m->bs == (q->len - 1) / m->bs && q->len % m->bs != 0;
    if (!same_block) q->tail = PM_MAYBEPUB;
  }
  q->len = n;
  q->last_append = 0;
  q->plan_at = q->n_plan; /* the rest of a planned prompt no longer applies */
}

static inline void pm_op_attend(pm_model *m) {
  pm_seq *q = pm_pick_appended(m);
  kva_attn at;
  kva_status st;
  int nq, l, i, j, r;
  size_t nout;
  float *qf, *out;
  double *qd, *kd, *vd, *od;
  ref_attn_cfg rc;
  if (!q || q->len == 0) return;
  r = pm_int(m->src, 0, 99);
  nq = r < 90 ? pm_int(m->src, 1, q->last_append > 0 ? q->last_append : 1) : q->last_append + 1;
  l = pm_int(m->src, 0, m->L - 1);
  memset(&at, 0, sizeof at);
  at.n_heads = m->H;
  at.n_kv_heads = m->G;
  at.head_dim = m->D;
  at.v_dim = m->DV == m->D && pm_chance(m->src, 50) ? 0 : m->DV;
  at.scale = pm_chance(m->src, 50) ? 0.0f : 0.7f;
  at.window = pm_chance(m->src, 60) ? 0 : pm_int(m->src, 1, q->len);
  at.n_sink = pm_chance(m->src, 70) ? 0 : pm_int(m->src, 1, 2);
  at.softcap = pm_chance(m->src, 70) ? 0.0f : 3.0f;
  at.n_threads = 1;
  nout = (size_t)nq * (size_t)m->H * (size_t)m->DV;
  qf = (float *)pm_zalloc(sizeof(float) * (size_t)nq * (size_t)m->H * (size_t)m->D);
  out = (float *)pm_zalloc(sizeof(float) * nout);
  for (i = 0; i < nq * m->H * m->D; i++) qf[i] = kt_uniform(&m->src->rng, -1.5f, 1.5f);
  kt_fill_sentinel(out, nout);
  st = kva_attend_cache(m->c, q->id, l, &at, qf, nq, out);
  if (nq > q->last_append) {
    PM_CHECK(st == KVA_ERR_STEP, "kva_attend_cache(n_q %d, latest append %d) = %s, want KVA_ERR_STEP", nq,
             q->last_append, kva_status_str(st));
    PM_CHECK(kt_all_sentinel(out, nout), "failed kva_attend_cache wrote its output");
  } else if (!pm_step_stored(m, q, l)) {
    PM_CHECK(st == KVA_ERR_NOT_STORED, "kva_attend_cache(n_q %d) of layer %d, the step not stored in it = %s", nq, l,
             kva_status_str(st));
    PM_CHECK(kt_all_sentinel(out, nout), "failed kva_attend_cache wrote its output");
  } else {
    PM_CHECK(st == KVA_OK, "kva_attend_cache(n_q %d) = %s", nq, kva_status_str(st));
    if (st == KVA_OK) {
      double err;
      size_t where;
      m->n_attend++;
      qd = ref_dup_f(qf, (size_t)nq * (size_t)m->H * (size_t)m->D);
      kd = (double *)pm_zalloc(sizeof(double) * (size_t)q->len * (size_t)m->G * (size_t)m->D);
      vd = (double *)pm_zalloc(sizeof(double) * (size_t)q->len * (size_t)m->G * (size_t)m->DV);
      od = (double *)pm_zalloc(sizeof(double) * nout);
      for (j = 0; j < q->len; j++) {
        for (i = 0; i < m->G * m->D; i++) kd[(size_t)j * m->G * m->D + i] = q->k[pm_kidx(m, j, l) + i];
        for (i = 0; i < m->G * m->DV; i++) vd[(size_t)j * m->G * m->DV + i] = q->v[pm_vidx(m, j, l) + i];
      }
      rc = ref_cfg(&at);
      ref_attend(&rc, qd, nq, NULL, kd, vd, q->len, NULL, od, NULL);
      err = ref_max_err(out, od, nout, &where);
      PM_CHECK(err <= 3e-5, "kva_attend_cache (len %d, n_q %d, H %d G %d, window %d sink %d softcap %g): max err %.3g at %lu",
               q->len, nq, m->H, m->G, at.window, at.n_sink, (double)at.softcap, err, (unsigned long)where);
      free(qd);
      free(kd);
      free(vd);
      free(od);
    }
  }
  free(qf);
  free(out);
}

static inline void pm_op_reset(pm_model *m) {
  kva_cache_stats b, a;
  kva_status st;
  pm_stats(m, &b);
  st = kva_cache_reset_prefix(m->c);
  pm_stats(m, &a);
  PM_CHECK(st == KVA_OK, "kva_cache_reset_prefix = %s", kva_status_str(st));
  PM_CHECK(a.blocks_cached == 0 && a.blocks_used == b.blocks_used &&
               a.blocks_free == b.blocks_free + b.blocks_cached,
           "after kva_cache_reset_prefix: used %d->%d cached %d->%d free %d->%d", b.blocks_used, a.blocks_used,
           b.blocks_cached, a.blocks_cached, b.blocks_free, a.blocks_free);
  pm_pub_clear(m);
}

/* a freed (or never issued) id must answer KVA_ERR_SEQ everywhere */
static inline void pm_op_stale(pm_model *m) {
  int id, need = -5, out = -5, reused = -5;
  float k[64], v[64], o[64];
  int32_t tok[1] = {0}, pos[8];
  kva_attn at;
  kva_cache_stats b, a;
  if (m->n_dead > 0 && pm_chance(m->src, 80)) id = m->dead[pm_int(m->src, 0, (m->n_dead < 16 ? m->n_dead : 16) - 1)];
  else {
    int r = pm_int(m->src, 0, 2);
    id = r == 0 ? -1 : r == 1 ? INT_MAX : -1000000;
  }
  (void)reused;
  memset(k, 0, sizeof k);
  memset(v, 0, sizeof v);
  memset(&at, 0, sizeof at);
  at.n_heads = m->H;
  at.n_kv_heads = m->G;
  at.head_dim = m->D;
  at.v_dim = m->DV;
  at.n_threads = 1;
  pm_stats(m, &b);
  PM_CHECK(kva_seq_len(m->c, id) == -1 && kva_seq_pos(m->c, id) == -1, "stale id %d: len/pos not -1", id);
  PM_CHECK(kva_seq_fits(m->c, id, 1, &need) == KVA_FITS_NEVER, "stale id %d: fits not NEVER", id);
  PM_CHECK(kva_seq_append(m->c, id, 1) == KVA_ERR_SEQ, "stale id %d: append", id);
  if (m->G * m->D <= 64 && m->G * m->DV <= 64 && m->H * m->DV <= 64 && m->H * m->D <= 64) {
    PM_CHECK(kva_store(m->c, id, 0, k, v, 1) == KVA_ERR_SEQ, "stale id %d: store", id);
    PM_CHECK(kva_attend_cache(m->c, id, 0, &at, k, 1, o) == KVA_ERR_SEQ, "stale id %d: attend_cache", id);
    PM_CHECK(kva_seq_read(m->c, id, 0, 0, k, v, pos) == KVA_ERR_SEQ, "stale id %d: read", id);
  }
  PM_CHECK(kva_seq_publish(m->c, id, tok, 1, 0) == KVA_ERR_SEQ, "stale id %d: publish", id);
  PM_CHECK(kva_seq_truncate(m->c, id, 0) == KVA_ERR_SEQ, "stale id %d: truncate", id);
  PM_CHECK(kva_seq_fork(m->c, id, &out) == KVA_ERR_SEQ && out == -5, "stale id %d: fork", id);
  PM_CHECK(kva_seq_free(m->c, id) == KVA_ERR_SEQ, "stale id %d: free", id);
  pm_stats(m, &a);
  PM_CHECK(kt_stats_equal(&a, &b, 0), "calls with stale id %d changed the stats", id);
}

static inline void pm_op_read_bad(pm_model *m) {
  pm_seq *q = pm_pick(m);
  float k[64];
  if (!q) return;
  kt_fill_sentinel(k, 64);
  PM_CHECK(kva_seq_read(m->c, q->id, 0, q->len, NULL, NULL, NULL) == KVA_ERR_ARG, "read slot == len");
  PM_CHECK(kva_seq_read(m->c, q->id, 0, -1, NULL, NULL, NULL) == KVA_ERR_ARG, "read slot -1");
  PM_CHECK(kva_seq_read(m->c, q->id, m->L, 0, NULL, NULL, NULL) == KVA_ERR_ARG, "read layer n_layers");
  if (m->G * m->D <= 64) {
    PM_CHECK(kva_seq_read(m->c, q->id, 0, q->len, k, NULL, NULL) == KVA_ERR_ARG && kt_all_sentinel(k, 64),
             "failed read wrote its output");
  }
}

static inline void pm_op_fits(pm_model *m) {
  pm_seq *q = pm_pick(m);
  kva_cache_stats b, a;
  int n, need = -1, nmin, own;
  kva_fit f;
  if (!q) return;
  n = pm_int(m->src, 0, m->cap + m->bs);
  pm_stats(m, &b);
  f = kva_seq_fits(m->c, q->id, n, &need);
  pm_stats(m, &a);
  PM_CHECK(kt_stats_equal(&a, &b, 0), "kva_seq_fits changed the stats");
  own = pm_blocks(m, q->len);
  nmin = n ? pm_blocks(m, (long)q->len + n) - own : 0;
  PM_CHECK(need >= nmin && need <= nmin + 1, "fits: blocks_needed %d, want %d (+1)", need, nmin);
  if (own + nmin > m->nb) PM_CHECK(f == KVA_FITS_NEVER, "fits: %d blocks > pool %d but %d", own + nmin, m->nb, (int)f);
  if (f == KVA_FITS_NOW) PM_CHECK(need <= b.blocks_free + b.blocks_cached, "fits NOW but needs %d of %d", need,
                                  b.blocks_free + b.blocks_cached);
}

/* a prefill: kva_seq_new_prefix with a (published, live or random) prompt,
   then append the rest of the prompt and store every layer */
static inline void pm_op_prefill(pm_model *m) {
  int before = m->n_ids, l;
  pm_seq *q = NULL;
  pm_op_new_prefix(m);
  if (m->n_ids > before) {
    int i;
    for (i = 0; i < m->max_seqs; i++)
      if (m->s[i].live && m->s[i].id == m->ids[m->n_ids - 1]) q = &m->s[i];
  }
  if (!q || q->n_plan == 0) return;
  pm_do_append(m, q, q->n_plan);
  if (q->last_append > 0)
    for (l = 0; l < m->L; l++) pm_do_store(m, q, l, q->last_append, 1);
}

/* one random operation, then every check */
static inline void pm_step(pm_model *m) {
  int r = pm_int(m->src, 0, 107);
  if (m->n_live == m->max_seqs && pm_chance(m->src, 30)) r = 66; /* make room now and then */
  if (r < 4) m->op = "new", pm_op_new(m);
  else if (r < 14) m->op = "new_prefix", pm_op_new_prefix(m);
  else if (r < 24) m->op = "prefill", pm_op_prefill(m);
  else if (r < 46) m->op = "append", pm_op_append(m);
  else if (r < 54) m->op = "store", pm_op_store(m);
  else if (r < 62) m->op = "fork", pm_op_fork(m);
  else if (r < 72) m->op = "free", pm_op_free(m);
  else if (r < 84) m->op = "publish", pm_op_publish(m);
  else if (r < 91) m->op = "truncate", pm_op_truncate(m);
  else if (r < 99) m->op = "attend", pm_op_attend(m);
  else if (r < 100) m->op = "reset_prefix", pm_op_reset(m);
  else if (r < 102) m->op = "stale", pm_op_stale(m);
  else if (r < 104) m->op = "read_bad", pm_op_read_bad(m);
  else m->op = "fits", pm_op_fits(m);
  m->n_ops++;
  pm_check_all(m);
}

/* Up to n_ops operations on a fresh cache, choices from src (stops early when
   a byte source runs dry), then everything freed: the pool must come back
   whole.  0 if the cache could not be made.  stats_out: the counters. */
static inline int pm_run_src(const pm_config *cfg, pm_src *src, int n_ops, pm_model *stats_out) {
  pm_model m;
  int i;
  kva_cache_stats st;
  if (pm_init(&m, cfg, src) != KVA_OK) return 0;
  for (i = 0; i < n_ops && !src->done; i++) pm_step(&m);
  for (i = 0; i < m.max_seqs; i++)
    if (m.s[i].live) {
      PM_CHECK(kva_seq_free(m.c, m.s[i].id) == KVA_OK, "final free");
      pm_kill(&m, &m.s[i]);
    }
  pm_stats(&m, &st);
  PM_CHECK(st.blocks_used == 0 && st.blocks_free + st.blocks_cached == m.nb && st.tokens_held == 0 && st.n_seqs == 0,
           "after freeing everything: used %d cached %d free %d tokens %ld seqs %d", st.blocks_used, st.blocks_cached,
           st.blocks_free, st.tokens_held, st.n_seqs);
  PM_CHECK(kva_cache_reset_prefix(m.c) == KVA_OK, "reset_prefix");
  pm_stats(&m, &st);
  PM_CHECK(st.blocks_free == m.nb, "after freeing everything and reset_prefix: %d free of %d", st.blocks_free, m.nb);
  if (stats_out) {
    *stats_out = m;
    stats_out->c = NULL;
    stats_out->s = NULL;
  }
  pm_destroy(&m);
  return 1;
}

static inline int pm_run(const pm_config *cfg, uint64_t seed, int n_ops, pm_model *stats_out) {
  pm_src src;
  memset(&src, 0, sizeof src);
  kt_seed(&src.rng, seed);
  return pm_run_src(cfg, &src, n_ops, stats_out);
}

/* ------------------------------------------------------------------------ */
/* Directed prefix-cache tests, shared by the normal and the weak-hash build. */

/* a sequence holding tok[0..n) with the honest content of (salt, tok), published */
static inline int pm_make_published(kva_cache *c, const kva_cache_desc *d, const int32_t *tok, int n,
                                    uint64_t salt, int publish) {
  int id = -1, i, l, g, e, G = d->n_kv_heads, D = d->head_dim, DV = d->v_dim ? d->v_dim : d->head_dim;
  uint64_t ph = pm_ph0(salt);
  float *k = (float *)pm_zalloc(sizeof(float) * (size_t)(n ? n : 1) * (size_t)G * (size_t)D);
  float *v = (float *)pm_zalloc(sizeof(float) * (size_t)(n ? n : 1) * (size_t)G * (size_t)DV);
  if (kva_seq_new(c, &id) != KVA_OK || kva_seq_append(c, id, n) != KVA_OK) {
    free(k);
    free(v);
    return -1;
  }
  for (l = 0; l < d->n_layers; l++) {
    ph = pm_ph0(salt);
    for (i = 0; i < n; i++) {
      ph = pm_ph_next(ph, tok[i]);
      for (g = 0; g < G; g++) {
        for (e = 0; e < D; e++) k[((size_t)i * G + g) * D + e] = pm_val(ph, l, 0, g, e);
        for (e = 0; e < DV; e++) v[((size_t)i * G + g) * DV + e] = pm_val(ph, l, 1, g, e);
      }
    }
    if (n > 0 && kva_store(c, id, l, k, v, n) != KVA_OK) id = -2;
  }
  free(k);
  free(v);
  if (id >= 0 && publish && kva_seq_publish(c, id, tok, n, salt) != KVA_OK) return -3;
  return id;
}

/* every slot of seq id equals the honest content of (salt, tok) (F32 cache) */
static inline int pm_holds(kva_cache *c, const kva_cache_desc *d, int id, const int32_t *tok, int n, uint64_t salt) {
  int i, l, g, e, G = d->n_kv_heads, D = d->head_dim, DV = d->v_dim ? d->v_dim : d->head_dim, good = 1;
  float k[256], v[256];
  int32_t pos[16];
  uint64_t ph;
  if (G * D > 256 || G * DV > 256 || G > 16) return 0;
  for (l = 0; l < d->n_layers; l++) {
    ph = pm_ph0(salt);
    for (i = 0; i < n; i++) {
      ph = pm_ph_next(ph, tok[i]);
      if (kva_seq_read(c, id, l, i, k, v, pos) != KVA_OK) return 0;
      for (g = 0; g < G; g++) {
        for (e = 0; e < D; e++) good &= k[g * D + e] == pm_val(ph, l, 0, g, e);
        for (e = 0; e < DV; e++) good &= v[g * DV + e] == pm_val(ph, l, 1, g, e);
        good &= pos[g] == i;
      }
    }
  }
  return good;
}

/* kva_seq_new_prefix, check n_reused == want and the reused content; frees the probe */
static inline void pm_probe(kva_cache *c, const kva_cache_desc *d, const int32_t *tok, int n, uint64_t salt, int want,
                            const char *what) {
  int id = -1, reused = -1;
  kva_status st = kva_seq_new_prefix(c, tok, n, salt, &id, &reused);
  PM_CHECK(st == KVA_OK, "%s: kva_seq_new_prefix = %s", what, kva_status_str(st));
  if (st != KVA_OK) return;
  PM_CHECK(reused == want, "%s: n_reused %d, want %d", what, reused, want);
  PM_CHECK(kva_seq_len(c, id) == reused && kva_seq_pos(c, id) == reused, "%s: len %d pos %d, n_reused %d", what,
           kva_seq_len(c, id), kva_seq_pos(c, id), reused);
  if (reused > 0 && reused <= n)
    PM_CHECK(pm_holds(c, d, id, tok, reused, salt), "%s: the %d reused tokens do not hold this prefix's K/V", what,
             reused);
  kva_seq_free(c, id);
}

/* kva_seq_publish must make the sequence's full blocks reusable even when
   the chain they were first published under lost its head: z's first block
   duplicates y's (so y's is the published one) and z's second block is
   published as the child of y's; y ends and its block is recycled; z
   publishes again: its 2 blocks must be found. */
static inline void pm_prefix_republish(void) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  int32_t t[5] = {1, 2, 3, 4, 5};
  int y, z, x = -1;
  memset(&d, 0, sizeof d);
  d.n_layers = 1;
  d.n_kv_heads = 1;
  d.head_dim = 2;
  d.block_size = 2;
  d.n_blocks = 6;
  d.dtype = KVA_F32;
  if (kva_cache_create(&d, &c) != KVA_OK) return;
  y = pm_make_published(c, &d, t, 2, 0, 1);
  z = pm_make_published(c, &d, t, 4, 0, 1);
  PM_CHECK(y >= 0 && z >= 0, "make y, z");
  pm_probe(c, &d, t, 5, 0, 4, "z published 4 tokens (its first block deduplicated to y's)");
  PM_CHECK(kva_seq_free(c, y) == KVA_OK, "free y");
  PM_CHECK(kva_seq_new(c, &x) == KVA_OK && kva_seq_append(c, x, 8) == KVA_OK, "fill the pool");
  PM_CHECK(kva_seq_publish(c, z, t, 4, 0) == KVA_OK, "republish z");
  pm_probe(c, &d, t, 5, 0, 4, "right after z published its 4 tokens again (y's block recycled)");
  kva_cache_destroy(c);
}

static inline void pm_prefix_directed(int weak) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  int32_t t[64], u[64];
  int i, j, o, a, b, x, id, reused, bs = 4;
  const uint64_t S1 = 11, S2 = 12;
  char what[96];
  kva_cache_stats st;
  memset(&d, 0, sizeof d);
  d.n_layers = 2;
  d.n_kv_heads = 2;
  d.head_dim = 3;
  d.v_dim = 2;
  d.block_size = bs;
  d.n_blocks = 64;
  d.max_seqs = 16;
  d.dtype = KVA_F32;
  if (kva_cache_create(&d, &c) != KVA_OK) {
    PM_CHECK(0, "kva_cache_create");
    return;
  }
  for (i = 0; i < 64; i++) t[i] = 100 + i;
  /* A: 3 full blocks + 2 tokens, published under S1 */
  a = pm_make_published(c, &d, t, 14, S1, 1);
  PM_CHECK(a >= 0, "make A");
  /* the cap: at most n_tokens - 1, whole blocks */
  pm_probe(c, &d, t, 0, S1, 0, "n_tokens 0");
  pm_probe(c, &d, t, 1, S1, 0, "n_tokens 1");
  pm_probe(c, &d, t, 4, S1, 0, "n_tokens == one block (the last token is computed)");
  pm_probe(c, &d, t, 5, S1, 4, "one block + 1");
  pm_probe(c, &d, t, 12, S1, 8, "three blocks exactly");
  pm_probe(c, &d, t, 13, S1, 12, "three blocks + 1");
  pm_probe(c, &d, t, 40, S1, 12, "longer prompt, 3 published blocks");
  /* salts isolate tenants */
  pm_probe(c, &d, t, 13, S2, 0, "another salt");
  pm_probe(c, &d, t, 13, 0, 0, "salt 0");
  pm_probe(c, &d, t, 13, S1 ^ (1ULL << 63), 0, "salt differing in the top bit");
  /* changed tokens never match: one changed token anywhere in block j stops reuse at j */
  for (j = 0; j < 3; j++)
    for (o = 0; o < bs; o++) {
      memcpy(u, t, sizeof t);
      u[j * bs + o] += 1000;
      sprintf(what, "token %d changed", j * bs + o);
      pm_probe(c, &d, u, 13, S1, j * bs, what);
    }
  /* a block's key chains its parent: block 1's tokens after another block 0 */
  memcpy(u, t, sizeof t);
  for (o = 0; o < bs; o++) u[o] = 900 + o;
  pm_probe(c, &d, u, 13, S1, 0, "same block 1 after another block 0");
  /* same tokens shifted by a block: no match */
  pm_probe(c, &d, t + bs, 9, S1, 0, "prompt shifted by one block");
  /* B: another tenant publishes the same tokens: each tenant gets its own KV */
  b = pm_make_published(c, &d, t, 9, S2, 1);
  PM_CHECK(b >= 0, "make B");
  pm_probe(c, &d, t, 13, S2, 8, "tenant 2 after publishing 2 blocks");
  pm_probe(c, &d, t, 13, S1, 12, "tenant 1 unaffected");
  /* X: another prompt sharing block 0 with A, under S1: the chain forks */
  memcpy(u, t, sizeof t);
  for (o = 0; o < bs; o++) u[bs + o] = 700 + o;
  x = pm_make_published(c, &d, u, 13, S1, 1);
  PM_CHECK(x >= 0, "make X");
  pm_probe(c, &d, u, 13, S1, 12, "X: shares block 0 with A, then its own");
  pm_probe(c, &d, t, 13, S1, 12, "A still whole");
  /* many prompts in one bucket (the weak hash makes them all collide): each
     query gets exactly its own blocks */
  for (i = 0; i < 8; i++) {
    int32_t w[12];
    for (o = 0; o < 12; o++) w[o] = (o * 7 + i) % 5; /* small vocabulary: near-identical prompts */
    id = pm_make_published(c, &d, w, 12, (uint64_t)(i % 3), 1);
    PM_CHECK(id >= 0, "make w%d", i);
    if (id >= 0) kva_seq_free(c, id);
  }
  for (i = 0; i < 8; i++) {
    int32_t w[12];
    for (o = 0; o < 12; o++) w[o] = (o * 7 + i) % 5;
    sprintf(what, "small-vocabulary prompt %d", i);
    pm_probe(c, &d, w, 12, (uint64_t)(i % 3), 8, what);
    sprintf(what, "small-vocabulary prompt %d, other salt", i);
    pm_probe(c, &d, w, 12, (uint64_t)(i % 3) + 3, 0, what);
  }
  /* publish is idempotent and "more than held" is an argument error */
  PM_CHECK(kva_seq_publish(c, a, t, 14, S1) == KVA_OK, "republish");
  PM_CHECK(kva_seq_publish(c, a, t, 15, S1) == KVA_ERR_ARG, "publish more than held");
  PM_CHECK(kva_seq_publish(c, a, NULL, 0, S1) == KVA_OK, "publish 0 tokens");
  pm_probe(c, &d, t, 13, S1, 12, "after republishing");
  /* reset_prefix forgets everything, live sequences keep their data */
  PM_CHECK(kva_cache_reset_prefix(c) == KVA_OK, "reset_prefix");
  kva_cache_get_stats(c, &st);
  PM_CHECK(st.blocks_cached == 0, "cached %d after reset", st.blocks_cached);
  pm_probe(c, &d, t, 13, S1, 0, "after reset_prefix");
  pm_probe(c, &d, t, 13, S2, 0, "after reset_prefix, tenant 2");
  pm_probe(c, &d, u, 13, S1, 0, "after reset_prefix, X");
  PM_CHECK(pm_holds(c, &d, a, t, 14, S1) && pm_holds(c, &d, b, t, 9, S2) && pm_holds(c, &d, x, u, 13, S1),
           "reset_prefix changed live sequences");
  PM_CHECK(kva_seq_publish(c, a, t, 14, S1) == KVA_OK, "publish after reset");
  pm_probe(c, &d, t, 13, S1, 12, "published again after reset");
  pm_probe(c, &d, u, 13, S1, 4, "X's block 0 is A's again");
  /* a hit's reused tokens are the published blocks as published: a later
     truncate + append of the publisher copies, it never writes them */
  PM_CHECK(kva_seq_truncate(c, a, 6) == KVA_OK && kva_seq_append(c, a, 3) == KVA_OK, "truncate + append A");
  {
    float k[32], v[32]; /* 3 tokens x 2 heads x 3 */
    int l;
    for (i = 0; i < 32; i++) k[i] = v[i] = 99.0f;
    for (l = 0; l < 2; l++) PM_CHECK(kva_store(c, a, l, k, v, 3) == KVA_OK, "store A");
  }
  pm_probe(c, &d, t, 13, S1, 12, "after the publisher rewrote its copy of block 1");
  (void)reused;
  (void)weak;
  kva_cache_destroy(c);
  pm_prefix_republish();
}

#endif /* KVATTN_TEST_PAGED_MODEL_H */
