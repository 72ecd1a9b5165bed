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
 * and the K/V stored for a position are a pseudo-random function of (salt,
 * the token ids up to and including that position, layer, head, dim), except
 * for occasional garbage stores.  Only prefixes whose every slot holds that
 * honest content in every layer are published, with the sequence's own salt
 * and tokens.  So the K/V a prefix hit reads back are fully determined by the
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
 * Eviction (docs/API.md "Eviction", "Eviction scorers", "Demotion"): with
 * evict_support ALL or WINDOW a random operation sets a policy on a sequence
 * (WINDOW with sinks, SCORE with n_sink / n_recent and the deterministic
 * scorer pm_scorer below, NONE; with rollback or not; with demotion into the
 * cache's demoted pool when it has one, often with a small demote_budget so
 * the ring wraps), valid or broken in one field.  The shadow then tracks, per
 * position, layer and KV head, whether the token is held, demoted or gone,
 * and the FIFO ring of demoted positions per layer and KV head, by the
 * documented rules: eviction at the start of a successful append (or of
 * kva_seq_compress) until held + n <= budget (rollback: held <= budget), the
 * same count in every layer and head (the fewest any could evict); WINDOW
 * oldest first, sinks kept; SCORE keeps the sinks and the n_recent newest
 * positions, then the highest scores, lowest first, ties oldest; demoted
 * victims enter the ring in eviction order and the earliest demoted is
 * deleted once it holds its budget.  The scorer checks its view (sequence,
 * order of calls, held positions ascending, keys and values as read back,
 * keep) and now and then returns an error status or writes a NaN: the append
 * or compression must then be refused with nothing changed.  Demoted rows
 * are F32, F16 or BF16, so their read-back (the held value rounded once) is
 * exact in the shadow.  Around it: kva_seq_compress (down to a budget, often
 * as far as the protected tokens allow), the demoted pool running short
 * (KVA_ERR_FULL, nothing changed; fits says LATER), fork copying the region
 * (or KVA_ERR_FULL), free returning it, attention over held and demoted keys
 * against the double reference, and the refusals after eviction (publish,
 * truncate below the newest step, export while tokens are demoted).  A
 * sequence that never shared a block has exact pool rules under eviction
 * (blocks_needed, NOW / LATER, blocks released); shared ones get bounds.  A
 * "switch" operation changes policy on a sequence whose heads evicted apart,
 * so that heads can evict different counts and the fewest decides.
 *
 * After every operation: stats invariants (used + cached + free == n_blocks,
 * n_seqs, tokens_held, prefix counters, cow_copies == blocks fits() announced
 * beyond the new ones, appends_failed, block bounds, the demoted pool's
 * blocks and bytes), each sequence's kva_seq_get_stats, and the exact
 * read-back of every live sequence: without eviction slot i holds position i;
 * after it, per layer and KV head the held slots as a set of (position, K, V)
 * and the demoted slots likewise.  On any failure, the stats must be
 * unchanged (appends_failed aside). */
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
static inline int pm_min(int a, int b) { return a < b ? a : b; }
static inline int pm_max(int a, int b) { return a > b ? a : b; }

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

#define PM_GONE 0    /* st[]: evicted and deleted (or not appended) */
#define PM_HELD 1    /* ... held in the main pool */
#define PM_DEMOTED 2 /* ... in the sequence's demoted region */

/* an eviction policy as the shadow sees it */
typedef struct {
  int kind, budget, n_sink, n_recent, rollback;
  int prof;   /* SCORE: the scorer profile (score_user = &m->prof[prof]) */
  int demote; /* evicted tokens are demoted */
  int dcap;   /* the ring size it asks for (demote_budget, 0 resolved) */
} pm_pol;

typedef struct {
  int live, id;
  uint64_t salt;
  int len, pos, last_append, tail;
  int excl;          /* no block of it was ever shared or published (nothing to copy: exact pool rules) */
  int32_t *tok;      /* [pcap] by position */
  uint64_t *ph;      /* [pcap] prefix hash through position i */
  float *k, *v;      /* [pcap][L][G][D], [pcap][L][G][DV]: expected read-back of position i */
  unsigned char *ok; /* [pcap][L]: 0 not stored, PM_HONEST the honest content, PM_GARBAGE stored garbage */
  unsigned char *st; /* [pcap][L][G]: PM_HELD, PM_DEMOTED, PM_GONE */
  int32_t *ring;     /* [L][G][rcap]: demoted positions, the earliest demoted at dm_head */
  int dm_head, dm_len, dm_cap;
  pm_pol act, pend;  /* the active policy and the one set for the next append */
  int has_pend;
  int32_t *plan;     /* [cap + 2 bs] tokens a new_prefix caller still has to append */
  int n_plan, plan_at;
} pm_seq;

typedef struct {
  int n_layers, n_kv_heads, head_dim, v_dim, n_heads;
  int block_size, n_blocks, max_seqs, prefix_max_age;
  kva_dtype dtype;
  int vocab, n_salts;
  int evict_support;      /* the cache's: ALL or WINDOW let the run set policies */
  kva_dtype demote_dtype; /* the demoted pool's type (DEFAULT: none; F32, F16 or BF16); needs evict_support != NONE */
  int demote_blocks;      /* its blocks (0: n_blocks) */
} pm_config;

#define PM_HIST 12
typedef struct {
  uint64_t salt;
  int n;
  int32_t *tok;
} pm_hist;

struct pm_model_s;
/* a deterministic scorer's parameters (kva_evict.score_user) */
typedef struct {
  struct pm_model_s *m;
  uint64_t salt;
  int levels;  /* scores take this many values: few => many ties */
  int inf_pct; /* percent of +Inf, and as many -Inf */
} pm_prof;

typedef struct {
  float s;
  int32_t p;
} pm_cand;

typedef struct pm_model_s {
  pm_config cfg;
  kva_cache_desc desc;
  kva_cache *c;
  int L, G, D, DV, H, bs, nb, max_seqs, f16, cap; /* f16: read-back rounding, 1 F16, 2 BF16 */
  int pcap, pos_max;       /* positions a sequence may reach (arrays), and where appends stop */
  int has_dm, dmb, rcap;   /* demoted pool: its blocks, the largest ring (one block table's tokens) */
  int dm_round;            /* demoted read-back rounding: 0 exact, 1 F16, 2 BF16 */
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
  int *mark;                /* [pcap][G] stamps: positions seen in one read-back pass */
  int stamp;
  pm_cand *cand;            /* [pcap] eviction candidates */
  pm_prof prof[3];
  /* what the scorer expects while an append, compress or fits may call it */
  pm_seq *sc_q;
  int sc_keep, sc_calls, sc_fail, sc_fail_at, sc_nan_at;
  kva_status sc_status;
  const char *op; /* the operation running (for failure reports) */
  /* coverage counters */
  long n_ops, n_full, n_hit_tokens, n_cow, n_lower, n_attend, n_never, n_later;
  long n_policies, n_evictions, n_evicted, n_demoted, n_dropped, n_score_fail, n_dm_full, n_refused, n_compress,
      n_dm_attend, n_uneven;
} pm_model;

static inline size_t pm_kidx(const pm_model *m, int pos, int l) {
  return ((size_t)pos * (size_t)m->L + (size_t)l) * (size_t)m->G * (size_t)m->D;
}
static inline size_t pm_vidx(const pm_model *m, int pos, int l) {
  return ((size_t)pos * (size_t)m->L + (size_t)l) * (size_t)m->G * (size_t)m->DV;
}
static inline size_t pm_sidx(const pm_model *m, int pos, int l, int g) {
  return ((size_t)pos * (size_t)m->L + (size_t)l) * (size_t)m->G + (size_t)g;
}
static inline size_t pm_ridx(const pm_model *m, int l, int g, int i) {
  return ((size_t)l * (size_t)m->G + (size_t)g) * (size_t)m->rcap + (size_t)i;
}
static inline float pm_round(const pm_model *m, float x) {
  return m->f16 == 1 ? ref_round_f16(x) : m->f16 == 2 ? ref_round_bf16(x) : x;
}
/* a held value as its demoted copy reads back (converted once: docs "Demotion") */
static inline float pm_dround(const pm_model *m, float x) {
  return m->dm_round == 1 ? ref_round_f16(x) : m->dm_round == 2 ? ref_round_bf16(x) : x;
}
static inline int pm_blocks(const pm_model *m, long tokens) { return (int)((tokens + m->bs - 1) / m->bs); }

static inline void pm_stats(const pm_model *m, kva_cache_stats *st) { kva_cache_get_stats(m->c, st); }

/* every field equal (appends_failed too unless skip_failed), the demoted pool's too */
static inline int pm_stats_same(const kva_cache_stats *a, const kva_cache_stats *b, int skip_failed) {
  return kt_stats_equal(a, b, skip_failed) && a->bytes_used == b->bytes_used &&
         a->demote_blocks == b->demote_blocks && a->demote_blocks_used == b->demote_blocks_used &&
         a->demote_block_bytes == b->demote_block_bytes;
}

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

/* ---------------------------------------------------------------- scorer */
/* The score of (position, layer, KV head) under a profile: a hash, cut to
   `levels` values (ties are frequent), with some +Inf and -Inf (and then the
   first positions +Inf in half the heads, -Inf in the others). */
static inline float pm_score_of(const pm_prof *p, int pos, int l, int g) {
  uint64_t h = pm_mix(pm_mix(p->salt, (uint64_t)(uint32_t)pos), ((uint64_t)(unsigned)l << 32) | (unsigned)g);
  int r = (int)(h % 100u);
  if (p->inf_pct && pos < 3) /* the first positions split between heads: sinks set later protect them unevenly */
    return (pos + l + g) & 1 ? -INFINITY : INFINITY;
  if (r < p->inf_pct) return INFINITY;
  if (r < 2 * p->inf_pct) return -INFINITY;
  return (float)((h >> 20) % (uint64_t)p->levels) - 1.5f;
}

static inline int pm_protected(const pm_seq *q, const pm_pol *p, int pos) {
  if (pos < p->n_sink) return 1;
  return p->kind == KVA_EVICT_SCORE && pos >= q->pos - p->n_recent;
}

/* kva_score_fn: checks the view against the shadow, then scores; armed by
   the model (sc_fail), one call fails with a status (1) or writes a NaN (2) */
static inline kva_status pm_scorer(void *user, const kva_score_view *v, float *scores) {
  pm_prof *pf = (pm_prof *)user;
  pm_model *m = pf->m;
  pm_seq *q = m->sc_q;
  int call = m->sc_calls++, i, j, bad = -1;
  PM_CHECK(q != NULL, "op %s: the scorer was called outside an append, compression or fits", m->op);
  if (q && v) {
    int l = call / m->G, g = call % m->G;
    PM_CHECK(v->seq == q->id && v->n_layers == m->L && v->n_kv_heads == m->G && v->head_dim == m->D &&
                 v->v_dim == m->DV && v->attn_sum == NULL,
             "op %s: scorer view of seq %d (want %d), n_layers %d, n_kv_heads %d, head_dim %d, v_dim %d, attn_sum %p",
             m->op, v->seq, q->id, v->n_layers, v->n_kv_heads, v->head_dim, v->v_dim, (const void *)v->attn_sum);
    PM_CHECK(v->layer == l && v->kv_head == g,
             "op %s: scorer call %d is layer %d KV head %d; once per layer and KV head, layer 0 first, then KV heads "
             "in order, wants layer %d head %d",
             m->op, call, v->layer, v->kv_head, l, g);
    PM_CHECK(v->n == q->len && v->keep == m->sc_keep, "op %s: scorer view n %d keep %d, want n %d keep %d", m->op,
             v->n, v->keep, q->len, m->sc_keep);
    if (v->layer == l && v->kv_head == g && v->n == q->len) {
      for (i = 0, j = 0; i < q->pos && bad < 0; i++) {
        if (q->st[pm_sidx(m, i, l, g)] != PM_HELD) continue;
        if (v->pos[j] != i ||
            memcmp(v->k + (size_t)j * m->D, q->k + pm_kidx(m, i, l) + (size_t)g * m->D, sizeof(float) * (size_t)m->D) ||
            memcmp(v->v + (size_t)j * m->DV, q->v + pm_vidx(m, i, l) + (size_t)g * m->DV,
                   sizeof(float) * (size_t)m->DV))
          bad = j;
        j++;
      }
      PM_CHECK(bad < 0, "op %s: scorer view (layer %d head %d) token %d: pos %d or its K/V is not the held token "
               "the shadow has there (positions ascending, rows as kva_seq_read gives them)",
               m->op, l, g, bad, bad >= 0 ? (int)v->pos[bad] : -1);
    }
  }
  for (i = 0; i < v->n; i++) scores[i] = pm_score_of(pf, v->pos[i], v->layer, v->kv_head);
  if (m->sc_fail && call == m->sc_fail_at) {
    if (m->sc_fail == 1) return m->sc_status;
    if (v->n > 0) scores[m->sc_nan_at % v->n] = NAN;
  }
  return KVA_OK;
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
  m->desc.demote_dtype = cfg->demote_dtype;
  m->desc.demote_blocks = cfg->demote_blocks;
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
  m->has_dm = cfg->demote_dtype != KVA_DTYPE_DEFAULT;
  m->dmb = m->has_dm ? (cfg->demote_blocks ? cfg->demote_blocks : m->nb) : 0;
  m->rcap = pm_min(m->dmb, m->nb) * m->bs; /* demote_budget 0: min(demote_blocks, table blocks) x block_size */
  m->dm_round = cfg->demote_dtype == KVA_F16 ? 1 : cfg->demote_dtype == KVA_BF16 ? 2 : 0;
  /* without eviction a sequence holds its positions (at most the pool); with
     it positions run on: appends stop at pos_max, one append adds at most
     cap + 2 bs */
  m->pos_max = cfg->evict_support == KVA_EVICT_SUPPORT_NONE ? m->cap : 4 * m->cap + 4 * m->bs;
  m->pcap = m->pos_max + m->cap + 2 * m->bs + 2;
  m->s = (pm_seq *)pm_zalloc(sizeof(pm_seq) * (size_t)m->max_seqs);
  for (i = 0; i < m->max_seqs; i++) {
    pm_seq *q = &m->s[i];
    q->tok = (int32_t *)pm_zalloc(sizeof(int32_t) * (size_t)m->pcap);
    q->ph = (uint64_t *)pm_zalloc(sizeof(uint64_t) * (size_t)m->pcap);
    q->k = (float *)pm_zalloc(sizeof(float) * pm_kidx(m, m->pcap, 0));
    q->v = (float *)pm_zalloc(sizeof(float) * pm_vidx(m, m->pcap, 0));
    q->ok = (unsigned char *)pm_zalloc((size_t)m->pcap * (size_t)m->L);
    q->st = (unsigned char *)pm_zalloc(pm_sidx(m, m->pcap, 0, 0));
    q->ring = (int32_t *)pm_zalloc(sizeof(int32_t) * pm_ridx(m, m->L, 0, 0));
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
  m->mark = (int *)pm_zalloc(sizeof(int) * (size_t)m->pcap * (size_t)m->G);
  m->cand = (pm_cand *)pm_zalloc(sizeof(pm_cand) * (size_t)m->pcap);
  for (i = 0; i < 3; i++) {
    m->prof[i].m = m;
    m->prof[i].salt = 0x5C0E5C0E00000000ULL + (uint64_t)i * 0x9E3779B97F4A7C15ULL;
  }
  m->prof[0].levels = 3; /* ties everywhere: oldest first decides */
  m->prof[1].levels = 1 << 20;
  m->prof[2].levels = 2;
  m->prof[2].inf_pct = 12;
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
    free(m->s[i].st);
    free(m->s[i].ring);
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
  free(m->mark);
  free(m->cand);
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

/* a random live sequence with an eviction policy (set or active), now and
   then (or when there is none) any */
static inline pm_seq *pm_pick_evicting(pm_model *m) {
  int i, n = 0, k;
  for (i = 0; i < m->max_seqs; i++) n += m->s[i].live && (m->s[i].act.kind || (m->s[i].has_pend && m->s[i].pend.kind));
  if (n == 0 || pm_chance(m->src, 40)) return pm_pick(m);
  k = pm_int(m->src, 0, n - 1);
  for (i = 0; i < m->max_seqs; i++)
    if (m->s[i].live && (m->s[i].act.kind || (m->s[i].has_pend && m->s[i].pend.kind)) && k-- == 0) return &m->s[i];
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
  q->len = q->pos = q->last_append = 0;
  q->tail = PM_EXCL;
  q->excl = 1;
  q->dm_head = q->dm_len = q->dm_cap = 0;
  memset(&q->act, 0, sizeof q->act);
  memset(&q->pend, 0, sizeof q->pend);
  q->has_pend = 0;
  q->n_plan = q->plan_at = 0;
  m->n_live++;
  pm_id_add(m, id);
  return q;
}

/* Put token t at position i of q (held in every layer and head): prefix
   hash, zeroed K/V (appended, not stored). */
static inline void pm_set_token(pm_model *m, pm_seq *q, int i, int32_t t) {
  if (i >= m->pcap) abort(); /* the run keeps positions below pcap */
  q->tok[i] = t;
  q->ph[i] = pm_ph_next(i ? q->ph[i - 1] : pm_ph0(q->salt), t);
  memset(q->k + pm_kidx(m, i, 0), 0, sizeof(float) * (size_t)m->L * (size_t)m->G * (size_t)m->D);
  memset(q->v + pm_vidx(m, i, 0), 0, sizeof(float) * (size_t)m->L * (size_t)m->G * (size_t)m->DV);
  memset(q->ok + (size_t)i * (size_t)m->L, 0, (size_t)m->L);
  memset(q->st + pm_sidx(m, i, 0, 0), PM_HELD, (size_t)m->L * (size_t)m->G);
}

/* The honest content of position i, layer l. */
static inline void pm_honest(const pm_model *m, const pm_seq *q, int i, int l, float *k, float *v) {
  int g, d;
  for (g = 0; g < m->G; g++) {
    for (d = 0; d < m->D; d++) k[g * m->D + d] = pm_val(q->ph[i], l, 0, g, d);
    for (d = 0; d < m->DV; d++) v[g * m->DV + d] = pm_val(q->ph[i], l, 1, g, d);
  }
}

/* leading slots that hold the honest content in every layer (slot i is
   position i while nothing was evicted: only then is this asked) */
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

/* has layer l stored every token of q's step (what attending it needs)? The
   step is the newest last_append positions. */
static inline int pm_step_stored(const pm_model *m, const pm_seq *q, int l) {
  int i;
  for (i = q->pos - q->last_append; i < q->pos; i++)
    if (!q->ok[(size_t)i * (size_t)m->L + l]) return 0;
  return 1;
}

/* ---------------------------------------------------------------- eviction */
/* The policy the next append (or compression) applies: the one set since, else the active one. */
static inline const pm_pol *pm_pol_next(const pm_seq *q) { return q->has_pend ? &q->pend : &q->act; }

typedef struct {
  int want;   /* tokens the policy asks to evict */
  int ne;     /* tokens every layer and head evicts: want, or the fewest any could evict */
  int dcap;   /* the ring's size (demoting) */
  int dafter; /* demoted tokens after */
  int dneed;  /* demoted blocks it takes */
} pm_plan;

static inline void pm_plan_evict(pm_model *m, const pm_seq *q, const pm_pol *p, int want, pm_plan *pl) {
  int l, g, i, fewest = INT_MAX, most = 0;
  memset(pl, 0, sizeof *pl);
  pl->want = want;
  pl->dafter = q->dm_len;
  if (p->kind == KVA_EVICT_NONE || want <= 0) return;
  for (l = 0; l < m->L; l++)
    for (g = 0; g < m->G; g++) {
      int n = 0;
      for (i = 0; i < q->pos; i++) n += q->st[pm_sidx(m, i, l, g)] == PM_HELD && !pm_protected(q, p, i);
      if (n < fewest) fewest = n;
      if (n > most) most = n;
    }
  pl->ne = want < fewest ? want : fewest;
  if (want > fewest && most > fewest) m->n_uneven++; /* the heads could evict different counts */
  if (p->demote && pl->ne > 0) {
    pl->dcap = q->dm_len > 0 ? q->dm_cap : p->dcap;
    pl->dafter = pm_min(q->dm_len + pl->ne, pl->dcap);
    pl->dneed = pm_blocks(m, pl->dafter) - pm_blocks(m, q->dm_len);
  }
}

static inline int pm_cand_cmp(const void *a, const void *b) {
  const pm_cand *x = (const pm_cand *)a, *y = (const pm_cand *)b;
  if (x->s < y->s) return -1;
  if (x->s > y->s) return 1;
  return x->p < y->p ? -1 : x->p > y->p;
}

/* Evict pl->ne tokens from every layer and KV head of q under p (before the
   append's own tokens): WINDOW the oldest unprotected, SCORE the lowest
   scores (ties oldest); demoted ones enter the ring in that order. */
static inline void pm_apply_evict(pm_model *m, pm_seq *q, const pm_pol *p, const pm_plan *pl) {
  int l, g, i, n, head = 0, dlen = 0;
  if (pl->ne <= 0) return;
  if (p->demote && q->dm_len == 0) {
    q->dm_cap = pl->dcap;
    q->dm_head = 0;
  }
  for (l = 0; l < m->L; l++)
    for (g = 0; g < m->G; g++) {
      n = 0;
      for (i = 0; i < q->pos; i++)
        if (q->st[pm_sidx(m, i, l, g)] == PM_HELD && !pm_protected(q, p, i)) {
          m->cand[n].p = i;
          m->cand[n].s = p->kind == KVA_EVICT_SCORE ? pm_score_of(&m->prof[p->prof], i, l, g) : 0.0f;
          n++;
        }
      if (p->kind == KVA_EVICT_SCORE) qsort(m->cand, (size_t)n, sizeof(pm_cand), pm_cand_cmp);
      head = q->dm_head;
      dlen = q->dm_len;
      for (i = 0; i < pl->ne && i < n; i++) {
        int v = m->cand[i].p;
        if (!p->demote) {
          q->st[pm_sidx(m, v, l, g)] = PM_GONE;
          continue;
        }
        if (dlen == q->dm_cap) { /* the earliest demoted goes */
          int32_t *slot = &q->ring[pm_ridx(m, l, g, head)];
          q->st[pm_sidx(m, *slot, l, g)] = PM_GONE;
          *slot = v;
          head = (head + 1) % q->dm_cap;
          if (l == 0 && g == 0) m->n_dropped++;
        } else {
          q->ring[pm_ridx(m, l, g, (head + dlen) % q->dm_cap)] = v;
          dlen++;
        }
        q->st[pm_sidx(m, v, l, g)] = PM_DEMOTED;
      }
    }
  if (p->demote) {
    q->dm_head = head;
    q->dm_len = dlen;
    m->n_demoted += pl->ne;
  }
  q->len -= pl->ne;
  m->n_evictions++;
  m->n_evicted += pl->ne;
}

/* ---------------------------------------------------------------- checks */
/* stamp every (position, head) seen once per pass */
static inline int pm_next_stamp(pm_model *m) {
  if (++m->stamp == INT_MAX) {
    memset(m->mark, 0, sizeof(int) * (size_t)m->pcap * (size_t)m->G);
    m->stamp = 1;
  }
  return m->stamp;
}

static inline void pm_check_seq(pm_model *m, const pm_seq *q, double *prorated) {
  int i, l, g, len = kva_seq_len(m->c, q->id), pos = kva_seq_pos(m->c, q->id), dm = kva_seq_demoted(m->c, q->id);
  size_t nk = (size_t)m->G * (size_t)m->D, nv = (size_t)m->G * (size_t)m->DV;
  kva_seq_stats ss;
  kva_cache_stats cs;
  kva_status st;
  PM_CHECK(len == q->len, "seq %d: kva_seq_len %d, model %d", q->id, len, q->len);
  PM_CHECK(pos == q->pos, "seq %d: kva_seq_pos %d, model %d", q->id, pos, q->pos);
  PM_CHECK(dm == q->dm_len, "seq %d: kva_seq_demoted %d, model %d", q->id, dm, q->dm_len);
  memset(&ss, 0, sizeof ss);
  st = kva_seq_get_stats(m->c, q->id, &ss);
  PM_CHECK(st == KVA_OK, "seq %d: kva_seq_get_stats %s", q->id, kva_status_str(st));
  if (st == KVA_OK) {
    pm_stats(m, &cs);
    PM_CHECK(ss.tokens == q->len && ss.tokens_evicted == (long)q->pos - q->len - q->dm_len &&
                 ss.tokens_demoted == q->dm_len && ss.demote_blocks == pm_blocks(m, q->dm_len),
             "seq %d: kva_seq_get_stats tokens %ld evicted %ld demoted %ld demote_blocks %d, want %d %d %d %d", q->id,
             ss.tokens, ss.tokens_evicted, ss.tokens_demoted, ss.demote_blocks, q->len, q->pos - q->len - q->dm_len,
             q->dm_len, pm_blocks(m, q->dm_len));
    PM_CHECK(ss.blocks == pm_blocks(m, q->len) && (!q->excl || ss.blocks_shared == 0),
             "seq %d: kva_seq_get_stats blocks %d shared %d, holds %d tokens (%s)", q->id, ss.blocks,
             ss.blocks_shared, q->len, q->excl ? "never shared" : "maybe shared");
    PM_CHECK(ss.bytes == (size_t)ss.blocks * cs.block_bytes + (size_t)ss.demote_blocks * cs.demote_block_bytes &&
                 ss.bytes_own == ss.bytes - ss.bytes_shared,
             "seq %d: kva_seq_get_stats bytes %lu own %lu shared %lu for %d blocks + %d demoted blocks", q->id,
             (unsigned long)ss.bytes, (unsigned long)ss.bytes_own, (unsigned long)ss.bytes_shared, ss.blocks,
             ss.demote_blocks);
    *prorated += ss.bytes_prorated;
  }
  if (len != q->len || pos != q->pos) return;
  if (q->pos == q->len) { /* nothing evicted: slot i holds position i */
    for (i = 0; i < q->len; i++)
      for (l = 0; l < m->L; l++) {
        int kok, vok, pok = 1;
        st = kva_seq_read(m->c, q->id, l, i, m->rk, m->rv, m->rpos);
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
  } else { /* after eviction: per layer and head the slots hold exactly the held positions, in any order */
    for (l = 0; l < m->L; l++) {
      int stamp = pm_next_stamp(m);
      for (i = 0; i < q->len; i++) {
        st = kva_seq_read(m->c, q->id, l, i, m->rk, m->rv, m->rpos);
        PM_CHECK(st == KVA_OK, "seq %d slot %d layer %d: kva_seq_read %s", q->id, i, l, kva_status_str(st));
        if (st != KVA_OK) return;
        for (g = 0; g < m->G; g++) {
          int p = m->rpos[g], ok = p >= 0 && p < q->pos && q->st[pm_sidx(m, p, l, g)] == PM_HELD &&
                                   m->mark[(size_t)p * m->G + g] != stamp;
          PM_CHECK(ok, "seq %d (len %d pos %d demoted %d) layer %d head %d slot %d: position %d is not held there%s",
                   q->id, q->len, q->pos, q->dm_len, l, g, i, p,
                   p >= 0 && p < q->pos && m->mark[(size_t)p * m->G + g] == stamp ? " (read twice)" : "");
          if (!ok) return;
          m->mark[(size_t)p * m->G + g] = stamp;
          ok = memcmp(m->rk + (size_t)g * m->D, q->k + pm_kidx(m, p, l) + (size_t)g * m->D,
                      sizeof(float) * (size_t)m->D) == 0 &&
               memcmp(m->rv + (size_t)g * m->DV, q->v + pm_vidx(m, p, l) + (size_t)g * m->DV,
                      sizeof(float) * (size_t)m->DV) == 0;
          PM_CHECK(ok, "seq %d layer %d head %d slot %d (position %d): K/V read back differ (K[0] %.9g want %.9g)",
                   q->id, l, g, i, p, (double)m->rk[(size_t)g * m->D],
                   (double)q->k[pm_kidx(m, p, l) + (size_t)g * m->D]);
          if (!ok) return;
          /* the step's tokens were appended after its eviction, at the end */
          if (i >= q->len - q->last_append)
            PM_CHECK(p == q->pos - (q->len - i),
                     "seq %d layer %d head %d: slot %d of the step holds position %d, want %d",
                     q->id, l, g, i, p, q->pos - (q->len - i));
        }
      }
    }
  }
  if (dm != q->dm_len) return;
  for (l = 0; l < m->L; l++) { /* the demoted region: the ring's positions, rows converted once */
    int stamp = pm_next_stamp(m);
    for (i = 0; i < q->dm_len; i++) {
      st = kva_seq_read_demoted(m->c, q->id, l, i, m->rk, m->rv, m->rpos);
      PM_CHECK(st == KVA_OK, "seq %d demoted slot %d layer %d: kva_seq_read_demoted %s", q->id, i, l,
               kva_status_str(st));
      if (st != KVA_OK) return;
      for (g = 0; g < m->G; g++) {
        int d, p = m->rpos[g], ok = p >= 0 && p < q->pos && q->st[pm_sidx(m, p, l, g)] == PM_DEMOTED &&
                                    m->mark[(size_t)p * m->G + g] != stamp;
        PM_CHECK(ok, "seq %d (len %d pos %d demoted %d, ring of %d) layer %d head %d demoted slot %d: position %d is "
                 "not in the ring (the last demote_budget demoted)%s",
                 q->id, q->len, q->pos, q->dm_len, q->dm_cap, l, g, i, p,
                 p >= 0 && p < q->pos && q->st[pm_sidx(m, p, l, g)] == PM_HELD ? " (it is held)" : "");
        if (!ok) return;
        m->mark[(size_t)p * m->G + g] = stamp;
        for (d = 0; d < m->D && ok; d++)
          ok = kt_f2u(m->rk[(size_t)g * m->D + d]) ==
               kt_f2u(pm_dround(m, q->k[pm_kidx(m, p, l) + (size_t)g * m->D + d]));
        for (d = 0; d < m->DV && ok; d++)
          ok = kt_f2u(m->rv[(size_t)g * m->DV + d]) ==
               kt_f2u(pm_dround(m, q->v[pm_vidx(m, p, l) + (size_t)g * m->DV + d]));
        PM_CHECK(ok, "seq %d layer %d head %d demoted slot %d (position %d): K/V differ from the held rows converted "
                 "to the demoted type (K[0] %.9g want %.9g)",
                 q->id, l, g, i, p, (double)m->rk[(size_t)g * m->D],
                 (double)pm_dround(m, q->k[pm_kidx(m, p, l) + (size_t)g * m->D]));
        if (!ok) return;
      }
    }
  }
}

static inline void pm_check_stats(pm_model *m, double prorated) {
  kva_cache_stats st;
  int i, mx = 0, dm_used = 0;
  long sum_len = 0, sum_blocks = 0;
  pm_stats(m, &st);
  for (i = 0; i < m->max_seqs; i++)
    if (m->s[i].live) {
      int b = pm_blocks(m, m->s[i].len);
      sum_len += m->s[i].len;
      sum_blocks += b;
      if (b > mx) mx = b;
      dm_used += pm_blocks(m, m->s[i].dm_len);
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
  /* the demoted pool: its own blocks, never shared; in bytes_total and (in use) bytes_used */
  PM_CHECK(st.demote_blocks == m->dmb && (m->dmb == 0 || st.demote_block_bytes > 0),
           "stats demote_blocks %d (block bytes %lu), want %d", st.demote_blocks,
           (unsigned long)st.demote_block_bytes, m->dmb);
  PM_CHECK(st.demote_blocks_used == dm_used, "stats demote_blocks_used %d, sum of the sequences' demoted blocks %d",
           st.demote_blocks_used, dm_used);
  PM_CHECK(st.bytes_total == st.block_bytes * (size_t)m->nb + st.demote_block_bytes * (size_t)st.demote_blocks,
           "bytes_total %lu != block_bytes %lu * n_blocks + demote_block_bytes %lu * demote_blocks",
           (unsigned long)st.bytes_total, (unsigned long)st.block_bytes, (unsigned long)st.demote_block_bytes);
  PM_CHECK(st.bytes_used == st.block_bytes * (size_t)st.blocks_used +
                                st.demote_block_bytes * (size_t)st.demote_blocks_used,
           "bytes_used %lu != block_bytes * blocks_used %d + demote_block_bytes * demote_blocks_used %d",
           (unsigned long)st.bytes_used, st.blocks_used, st.demote_blocks_used);
  PM_CHECK(fabs(prorated - (double)st.bytes_used) <= 1e-6 * (double)(st.bytes_used + 1),
           "the sequences' bytes_prorated add up to %.3f, bytes_used %lu", prorated, (unsigned long)st.bytes_used);
  PM_CHECK(st.block_bytes >= kva_cache_bytes_per_token(&m->desc) * (size_t)m->bs,
           "block_bytes %lu < bytes_per_token * block_size", (unsigned long)st.block_bytes);
}

static inline void pm_check_all(pm_model *m) {
  int i;
  double prorated = 0.0;
  for (i = 0; i < m->max_seqs; i++)
    if (m->s[i].live) pm_check_seq(m, &m->s[i], &prorated);
  pm_check_stats(m, prorated);
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
    PM_CHECK(pm_stats_same(&a, &b, 0), "failed kva_seq_new changed the stats");
    return;
  }
  PM_CHECK(st == KVA_OK, "kva_seq_new: %s with %d of %d live", kva_status_str(st), m->n_live, m->max_seqs);
  if (st != KVA_OK) return;
  PM_CHECK(id >= 0 && !pm_id_seen(m, id), "kva_seq_new handed out id %d again", id);
  pm_seq_start(m, id, pm_salt_of(m, pm_int(m->src, 0, m->cfg.n_salts - 1)));
}

/* store the newest n slots (positions) of q, layer l; honest or garbage */
static inline void pm_do_store(pm_model *m, pm_seq *q, int l, int n, int honest) {
  kva_cache_stats b, a;
  kva_status st;
  int t, i;
  size_t nk = (size_t)m->G * (size_t)m->D, nv = (size_t)m->G * (size_t)m->DV;
  int valid = n <= q->last_append && n <= q->len;
  for (t = 0; t < n && t < m->cap; t++) {
    int p = q->pos - n + t;
    if (honest && p >= 0) {
      pm_honest(m, q, p, l, m->kbuf + t * nk, m->vbuf + t * nv);
    } else {
      for (i = 0; i < (int)nk; i++) m->kbuf[t * nk + i] = kt_uniform(&m->src->rng, -3.0f, 3.0f);
      for (i = 0; i < (int)nv; i++) m->vbuf[t * nv + i] = kt_uniform(&m->src->rng, -3.0f, 3.0f);
    }
  }
  pm_stats(m, &b);
  st = kva_store(m->c, q->id, l, m->kbuf, m->vbuf, n);
  pm_stats(m, &a);
  PM_CHECK(pm_stats_same(&a, &b, 0), "kva_store changed the stats");
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
    int p = q->pos - n + t, g, d;
    for (g = 0; g < m->G; g++) {
      for (d = 0; d < m->D; d++)
        q->k[pm_kidx(m, p, l) + (size_t)g * m->D + d] = pm_round(m, m->kbuf[t * nk + (size_t)g * m->D + d]);
      for (d = 0; d < m->DV; d++)
        q->v[pm_vidx(m, p, l) + (size_t)g * m->DV + d] = pm_round(m, m->vbuf[t * nv + (size_t)g * m->DV + d]);
    }
    q->ok[(size_t)p * m->L + l] = (unsigned char)(honest ? PM_HONEST : PM_GARBAGE);
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

/* Arm the scorer to refuse one of the next eviction's calls: an error status
   (an unknown value: KVA_ERR_ARG) or a NaN (KVA_ERR_ARG). The status the
   refused call must return. */
static inline kva_status pm_arm_scorer(pm_model *m) {
  static const kva_status fails[4] = {KVA_ERR_NOMEM, KVA_ERR_UNSUPPORTED, KVA_ERR_STREAM, (kva_status)12};
  m->sc_fail = pm_chance(m->src, 50) ? 1 : 2;
  m->sc_fail_at = pm_int(m->src, 0, m->L * m->G - 1);
  m->sc_nan_at = pm_int(m->src, 0, 1 << 16);
  m->sc_status = fails[pm_int(m->src, 0, 3)];
  if (m->sc_fail == 2 || (int)m->sc_status == 12) return KVA_ERR_ARG;
  return m->sc_status;
}

/* what the scorer sees during a call on q that evicts ne tokens */
static inline void pm_scorer_expect(pm_model *m, pm_seq *q, int ne) {
  m->sc_q = q;
  m->sc_keep = q->len - ne;
  m->sc_calls = 0;
  m->sc_fail = 0;
}

/* fits + append of n tokens to q, with every consistency check */
static inline void pm_do_append(pm_model *m, pm_seq *q, int n) {
  kva_cache_stats b, a;
  kva_status st, want_fail = KVA_OK;
  kva_fit f;
  int need = -1, nmin, maybe_cow, own, avail, dfree, i, fail_mode = 0;
  const pm_pol *pol = pm_pol_next(q);
  pm_plan pl;
  pm_stats(m, &b);
  avail = b.blocks_free + b.blocks_cached;
  dfree = b.demote_blocks - b.demote_blocks_used;
  own = pm_blocks(m, q->len);
  memset(&pl, 0, sizeof pl);
  if (n > 0) pm_plan_evict(m, q, pol, (pol->rollback ? q->len : q->len + n) - pol->budget, &pl);
  pm_scorer_expect(m, q, pl.ne);
  f = kva_seq_fits(m->c, q->id, n, &need);
  if (n < 0) {
    PM_CHECK(f == KVA_FITS_NEVER, "kva_seq_fits(n %d) = %d, want NEVER", n, (int)f);
    st = kva_seq_append(m->c, q->id, n);
    PM_CHECK(st == KVA_ERR_ARG, "kva_seq_append(n %d) = %s, want KVA_ERR_ARG", n, kva_status_str(st));
    pm_stats(m, &a);
    PM_CHECK(pm_stats_same(&a, &b, 0), "kva_seq_append(negative) changed the stats");
    return;
  }
  nmin = n ? pm_blocks(m, (long)q->len + n) - own : 0;
  if (pl.ne == 0) {
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
  } else {
    /* the append first evicts pl.ne tokens: blocks_needed counts its copies
       and new blocks (before the blocks eviction releases, which the pool
       gets back before the new ones are taken); the demoted pool must have
       the ring's new blocks */
    int kept = pm_blocks(m, q->len - pl.ne), fin = pm_blocks(m, (long)q->len - pl.ne + n), newb = fin - kept;
    int rel = own - kept, dshort = pl.dneed > dfree;
    if (q->excl)
      PM_CHECK(need == newb, "kva_seq_fits(len %d, n %d, evicting %d, nothing shared): blocks_needed %d, want %d",
               q->len, n, pl.ne, need, newb);
    else
      PM_CHECK(need >= newb && need <= newb + kept,
               "kva_seq_fits(len %d, n %d, evicting %d): blocks_needed %d outside [%d, %d] (new, + copies)", q->len,
               n, pl.ne, need, newb, newb + kept);
    if (fin > m->nb)
      PM_CHECK(f == KVA_FITS_NEVER, "kva_seq_fits: %d blocks after evicting %d in a pool of %d: %d, want NEVER", fin,
               pl.ne, m->nb, (int)f);
    else if (q->excl) /* nothing to copy: the pool after the release decides */
      PM_CHECK(f == ((need <= avail + rel && !dshort) ? KVA_FITS_NOW : KVA_FITS_LATER),
               "kva_seq_fits(len %d, n %d, evicting %d): needs %d, %d available + %d released, demoted blocks %d of "
               "%d free: %d, want %s",
               q->len, n, pl.ne, need, avail, rel, pl.dneed, dfree, (int)f,
               need <= avail + rel && !dshort ? "NOW" : "LATER");
    else if (dshort)
      PM_CHECK(f != KVA_FITS_NOW, "kva_seq_fits: the demoted pool has %d of the %d blocks needed: %d, want LATER",
               dfree, pl.dneed, (int)f);
  }
  if (f == KVA_FITS_NEVER) m->n_never++;
  if (f == KVA_FITS_LATER) m->n_later++;
  if (pl.ne > 0 && pl.dneed > dfree) m->n_dm_full++;
  pm_scorer_expect(m, q, pl.ne);
  if (pol->kind == KVA_EVICT_SCORE && pl.ne > 0 && f == KVA_FITS_NOW && pm_chance(m->src, 12))
    want_fail = pm_arm_scorer(m);
  fail_mode = m->sc_fail;
  st = kva_seq_append(m->c, q->id, n);
  pm_stats(m, &a);
  m->sc_fail = 0;
  if (want_fail != KVA_OK) {
    m->n_score_fail++;
    PM_CHECK(st == want_fail, "kva_seq_append(%d) evicting %d under SCORE, the scorer refusing (%s): %s, want %s", n,
             pl.ne, fail_mode == 1 ? "status" : "NaN", kva_status_str(st), kva_status_str(want_fail));
    PM_CHECK(pm_stats_same(&a, &b, 0),
             "kva_seq_append refused by the scorer changed the stats (appends_failed %ld->%ld)",
             b.appends_failed, a.appends_failed);
    m->sc_q = NULL;
    return;
  }
  if (pol->kind == KVA_EVICT_SCORE && st == KVA_OK && n > 0) {
    if (pl.ne > 0)
      PM_CHECK(m->sc_calls == m->L * m->G, "kva_seq_append evicting %d under SCORE called the scorer %d times, want %d",
               pl.ne, m->sc_calls, m->L * m->G);
    else if (pl.want <= 0)
      PM_CHECK(m->sc_calls == 0, "kva_seq_append within the budget called the scorer %d times", m->sc_calls);
  }
  m->sc_q = NULL;
  if (n == 0) {
    PM_CHECK(st == KVA_OK, "kva_seq_append(0) = %s", kva_status_str(st));
    PM_CHECK(pm_stats_same(&a, &b, 0), "kva_seq_append(0) changed the stats");
    return;
  }
  PM_CHECK((st == KVA_OK) == (f == KVA_FITS_NOW), "kva_seq_append(len %d, n %d) = %s but kva_seq_fits said %d",
           q->len, n, kva_status_str(st), (int)f);
  if (st != KVA_OK) {
    PM_CHECK(st == KVA_ERR_FULL, "kva_seq_append = %s, want KVA_ERR_FULL", kva_status_str(st));
    m->failed++;
    m->n_full++;
    PM_CHECK(pm_stats_same(&a, &b, 1) && a.appends_failed == b.appends_failed + 1,
             "KVA_ERR_FULL changed the stats (used %d->%d cached %d->%d free %d->%d forgotten %ld->%ld, failed "
             "%ld->%ld, demoted blocks %d->%d)",
             b.blocks_used, a.blocks_used, b.blocks_cached, a.blocks_cached, b.blocks_free, a.blocks_free,
             b.prefix_forgotten, a.prefix_forgotten, b.appends_failed, a.appends_failed, b.demote_blocks_used,
             a.demote_blocks_used);
    return;
  }
  if (pl.ne == 0) {
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
    PM_CHECK(a.blocks_free + a.blocks_cached == avail - need ||
                 (need > nmin && a.blocks_free + a.blocks_cached == avail - need + 1),
             "append took %d blocks (free+cached %d -> %d), fits announced %d",
             avail - a.blocks_free - a.blocks_cached, avail, a.blocks_free + a.blocks_cached, need);
    PM_CHECK(a.demote_blocks_used == b.demote_blocks_used, "an append that evicted nothing took demoted blocks");
  } else {
    long dc = a.cow_copies - b.cow_copies;
    int kept = pm_blocks(m, q->len - pl.ne), newb = pm_blocks(m, (long)q->len - pl.ne + n) - kept;
    if (q->excl) {
      PM_CHECK(dc == 0, "an append evicting from blocks nobody shares copied %ld", dc);
      PM_CHECK(a.blocks_free + a.blocks_cached == avail + (own - kept) - need,
               "append evicting %d (held %d, %d blocks, %d kept) took %d blocks net (free+cached %d -> %d), want %d "
               "new",
               pl.ne, q->len, own, kept, avail - a.blocks_free - a.blocks_cached, avail,
               a.blocks_free + a.blocks_cached, need);
    } else if (a.prefix_forgotten > b.prefix_forgotten)
      PM_CHECK(dc >= 0 && dc <= need - newb, "append evicting copied %ld blocks, fits announced %d", dc, need - newb);
    else
      PM_CHECK(dc == need - newb, "append evicting %d copied %ld blocks (cow_copies), fits announced %d", pl.ne, dc,
               need - newb);
    m->cow += dc;
    m->n_cow += dc;
    PM_CHECK(a.demote_blocks_used == b.demote_blocks_used + pl.dneed,
             "append demoting %d (ring %d of %d) took %d demoted blocks, want %d", pl.ne, q->dm_len, pl.dcap,
             a.demote_blocks_used - b.demote_blocks_used, pl.dneed);
  }
  PM_CHECK(a.prefix_forgotten >= b.prefix_forgotten, "prefix_forgotten went down");
  if (pl.ne > 0) pm_apply_evict(m, q, pol, &pl);
  if (q->has_pend) {
    q->act = q->pend;
    q->has_pend = 0;
  }
  for (i = 0; i < n; i++) {
    int32_t t = q->plan_at < q->n_plan ? q->plan[q->plan_at++] : (int32_t)pm_int(m->src, 0, m->cfg.vocab - 1);
    pm_set_token(m, q, q->pos + i, t);
  }
  q->len += n;
  q->pos += n;
  q->last_append = n;
  q->tail = PM_EXCL;
}

static inline void pm_kill(pm_model *m, pm_seq *q) {
  q->live = 0;
  m->n_live--;
  m->dead[m->n_dead++ % 16] = q->id;
}

static inline void pm_op_free_seq(pm_model *m, pm_seq *q) {
  kva_cache_stats b, a;
  kva_status st;
  pm_stats(m, &b);
  st = kva_seq_free(m->c, q->id);
  pm_stats(m, &a);
  PM_CHECK(st == KVA_OK, "kva_seq_free: %s", kva_status_str(st));
  PM_CHECK(a.blocks_free >= b.blocks_free && a.blocks_used <= b.blocks_used &&
               b.blocks_used - a.blocks_used <= pm_blocks(m, q->len),
           "kva_seq_free: used %d->%d free %d->%d (held %d blocks)", b.blocks_used, a.blocks_used, b.blocks_free,
           a.blocks_free, pm_blocks(m, q->len));
  PM_CHECK(a.prefix_forgotten == b.prefix_forgotten, "kva_seq_free forgot published blocks");
  PM_CHECK(b.demote_blocks_used - a.demote_blocks_used == pm_blocks(m, q->dm_len),
           "kva_seq_free of a sequence with %d demoted tokens returned %d demoted blocks, want %d", q->dm_len,
           b.demote_blocks_used - a.demote_blocks_used, pm_blocks(m, q->dm_len));
  pm_kill(m, q);
  PM_CHECK(kva_seq_len(m->c, q->id) == -1 && kva_seq_pos(m->c, q->id) == -1 && kva_seq_demoted(m->c, q->id) == -1,
           "freed seq %d still answers", q->id);
}

static inline void pm_op_append(pm_model *m) {
  pm_seq *q = pm_pick_evicting(m);
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
  if (n > 0 && q->pos + n > m->pos_max) { /* an evicting sequence ran long: it ends */
    n = m->pos_max - q->pos;
    if (n <= 0) {
      pm_op_free_seq(m, q);
      return;
    }
  }
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
  int id = -7, dneed, dfree;
  if (!q) return;
  pm_stats(m, &b);
  st = kva_seq_fork(m->c, q->id, &id);
  pm_stats(m, &a);
  dneed = pm_blocks(m, q->dm_len);
  dfree = b.demote_blocks - b.demote_blocks_used;
  if (m->n_live == m->max_seqs) {
    PM_CHECK(st == KVA_ERR_SEQ_LIMIT || (dneed > dfree && st == KVA_ERR_FULL),
             "kva_seq_fork with max_seqs live: %s, want KVA_ERR_SEQ_LIMIT", kva_status_str(st));
    PM_CHECK(pm_stats_same(&a, &b, 0), "failed kva_seq_fork changed the stats");
    return;
  }
  if (dneed > dfree) { /* the child's copy of the demoted region does not fit */
    m->n_dm_full++;
    PM_CHECK(st == KVA_ERR_FULL, "kva_seq_fork of %d demoted tokens (%d blocks, %d free): %s, want KVA_ERR_FULL",
             q->dm_len, dneed, dfree, kva_status_str(st));
    PM_CHECK(pm_stats_same(&a, &b, 0), "kva_seq_fork refused for the demoted pool changed the stats");
    return;
  }
  PM_CHECK(st == KVA_OK, "kva_seq_fork: %s", kva_status_str(st));
  if (st != KVA_OK) return;
  PM_CHECK(id >= 0 && !pm_id_seen(m, id), "kva_seq_fork handed out id %d again", id);
  PM_CHECK(a.blocks_used == b.blocks_used && a.blocks_free == b.blocks_free && a.blocks_cached == b.blocks_cached,
           "kva_seq_fork took or moved blocks (used %d->%d free %d->%d cached %d->%d)", b.blocks_used,
           a.blocks_used, b.blocks_free, a.blocks_free, b.blocks_cached, a.blocks_cached);
  PM_CHECK(a.demote_blocks_used == b.demote_blocks_used + dneed,
           "kva_seq_fork of %d demoted tokens took %d demoted blocks, want %d (a copy)", q->dm_len,
           a.demote_blocks_used - b.demote_blocks_used, dneed);
  d = pm_seq_start(m, id, q->salt);
  d->len = q->len;
  d->pos = q->pos;
  memcpy(d->tok, q->tok, sizeof(int32_t) * (size_t)q->pos);
  memcpy(d->ph, q->ph, sizeof(uint64_t) * (size_t)q->pos);
  memcpy(d->k, q->k, sizeof(float) * pm_kidx(m, q->pos, 0));
  memcpy(d->v, q->v, sizeof(float) * pm_vidx(m, q->pos, 0));
  memcpy(d->ok, q->ok, (size_t)q->pos * (size_t)m->L);
  memcpy(d->st, q->st, pm_sidx(m, q->pos, 0, 0));
  memcpy(d->ring, q->ring, sizeof(int32_t) * pm_ridx(m, m->L, 0, 0));
  d->dm_head = q->dm_head;
  d->dm_len = q->dm_len;
  d->dm_cap = q->dm_cap;
  d->act = q->act;
  d->pend = q->pend;
  d->has_pend = q->has_pend;
  memcpy(d->plan, q->plan, sizeof(int32_t) * (size_t)q->n_plan);
  d->n_plan = q->n_plan;
  d->plan_at = q->plan_at;
  q->last_append = d->last_append = 0;
  if (q->tail != PM_MAYBEPUB) q->tail = PM_SHARED;
  d->tail = q->tail;
  if (q->len > 0) {
    m->ever_shared = 1;
    q->excl = d->excl = 0;
  }
}

static inline void pm_op_free(pm_model *m) {
  pm_seq *q = pm_pick(m);
  if (q) pm_op_free_seq(m, q);
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
    PM_CHECK(pm_stats_same(&a, &b, 0), "failed kva_seq_new_prefix changed the stats");
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
  q->len = q->pos = reused;
  q->n_plan = n - reused < m->cap + 2 * m->bs ? n - reused : m->cap + 2 * m->bs;
  if (q->n_plan > 0) memcpy(q->plan, tok + reused, sizeof(int32_t) * (size_t)q->n_plan);
  q->plan_at = 0;
  if (reused > 0) {
    m->ever_shared = 1;
    q->excl = 0;
  }
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
  if (q->pos != q->len) { /* it has evicted tokens (deleted or demoted): never published again */
    if (q->len == 0) return;
    n = pm_int(m->src, 1, q->len);
    pm_stats(m, &b);
    st = kva_seq_publish(m->c, q->id, q->tok, n, q->salt);
    pm_stats(m, &a);
    m->n_refused++;
    PM_CHECK(st == KVA_ERR_UNSUPPORTED,
             "kva_seq_publish(%d of %d) of a sequence that evicted (pos %d, demoted %d) = %s, want "
             "KVA_ERR_UNSUPPORTED",
             n, q->len, q->pos, q->dm_len, kva_status_str(st));
    PM_CHECK(pm_stats_same(&a, &b, 0), "refused kva_seq_publish changed the stats");
    return;
  }
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
      PM_CHECK(pm_stats_same(&a, &b, 0), "refused kva_seq_publish changed the stats");
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
    PM_CHECK(pm_stats_same(&a, &b, 0), "failed kva_seq_publish changed the stats");
    return;
  }
  PM_CHECK(st == KVA_OK, "kva_seq_publish(%d of %d) = %s", n, q->len, kva_status_str(st));
  if (st != KVA_OK || n == 0) return;
  q->last_append = 0;
  nfull = n / m->bs;
  for (j = 0; j < nfull; j++) pm_pub_add(m, q->ph[(j + 1) * m->bs - 1]);
  m->pub_events += nfull;
  if (nfull > 0) q->excl = 0; /* its published blocks are shared: eviction must copy them */
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
  int n, r, evicted;
  if (!q) return;
  evicted = q->pos != q->len;
  r = pm_int(m->src, 0, 99);
  if (evicted && r < 40) n = q->len - pm_int(m->src, 0, q->last_append); /* within the newest step */
  else n = r < 90 ? pm_int(m->src, 0, q->len) : r < 95 ? q->len + 1 : -1;
  pm_stats(m, &b);
  st = kva_seq_truncate(m->c, q->id, n);
  pm_stats(m, &a);
  if (n < 0 || n > q->len) {
    PM_CHECK(st == KVA_ERR_ARG, "kva_seq_truncate(%d of %d) = %s, want KVA_ERR_ARG", n, q->len,
             kva_status_str(st));
    PM_CHECK(pm_stats_same(&a, &b, 0), "failed kva_seq_truncate changed the stats");
    return;
  }
  if (evicted && n < q->len - q->last_append) { /* below the newest step of a sequence that evicted */
    m->n_refused++;
    PM_CHECK(st == KVA_ERR_UNSUPPORTED,
             "kva_seq_truncate(%d) of a sequence that evicted (len %d pos %d demoted %d, step %d) = %s, want "
             "KVA_ERR_UNSUPPORTED",
             n, q->len, q->pos, q->dm_len, q->last_append, kva_status_str(st));
    PM_CHECK(pm_stats_same(&a, &b, 0), "refused kva_seq_truncate changed the stats");
    return;
  }
  PM_CHECK(st == KVA_OK, "kva_seq_truncate(%d of %d, pos %d, step %d) = %s", n, q->len, q->pos, q->last_append,
           kva_status_str(st));
  if (st != KVA_OK) return;
  PM_CHECK(a.blocks_free >= b.blocks_free && a.blocks_used <= b.blocks_used &&
               a.blocks_used + a.blocks_cached <= b.blocks_used + b.blocks_cached,
           "kva_seq_truncate took blocks");
  PM_CHECK(a.demote_blocks_used == b.demote_blocks_used, "kva_seq_truncate changed the demoted blocks");
  if (n % m->bs != 0) {
    int same_block = n / m->bs == (q->len - 1) / m->bs && q->len % m->bs != 0;
    if (!same_block) q->tail = PM_MAYBEPUB;
  }
  q->pos -= q->len - n; /* the position rewinds by the tokens dropped (the newest) */
  q->len = n;
  q->last_append = 0;
  q->plan_at = q->n_plan; /* the rest of a planned prompt no longer applies */
}

static inline void pm_op_attend(pm_model *m) {
  pm_seq *q = pm_pick_appended(m);
  kva_attn at;
  kva_status st;
  int nq, l, i, j, g, r, nkv;
  size_t nout;
  float *qf, *out;
  double *qd, *kd, *vd, *od;
  int32_t *qpos, *kpos;
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
      if (q->dm_len > 0) m->n_dm_attend++;
      /* one softmax over the held and the demoted keys of each KV head, at their positions */
      nkv = q->len + q->dm_len;
      qd = ref_dup_f(qf, (size_t)nq * (size_t)m->H * (size_t)m->D);
      kd = (double *)pm_zalloc(sizeof(double) * (size_t)nkv * (size_t)m->G * (size_t)m->D);
      vd = (double *)pm_zalloc(sizeof(double) * (size_t)nkv * (size_t)m->G * (size_t)m->DV);
      kpos = (int32_t *)pm_zalloc(sizeof(int32_t) * (size_t)nkv * (size_t)m->G);
      qpos = (int32_t *)pm_zalloc(sizeof(int32_t) * (size_t)nq);
      od = (double *)pm_zalloc(sizeof(double) * nout);
      for (g = 0; g < m->G; g++) {
        int p, d;
        for (p = 0, j = 0; p < q->pos && j < nkv; p++) {
          int s = q->st[pm_sidx(m, p, l, g)];
          const float *kx = q->k + pm_kidx(m, p, l) + (size_t)g * m->D;
          const float *vx = q->v + pm_vidx(m, p, l) + (size_t)g * m->DV;
          if (s == PM_GONE) continue;
          for (d = 0; d < m->D; d++)
            kd[((size_t)j * m->G + g) * m->D + d] = s == PM_HELD ? kx[d] : pm_dround(m, kx[d]);
          for (d = 0; d < m->DV; d++)
            vd[((size_t)j * m->G + g) * m->DV + d] = s == PM_HELD ? vx[d] : pm_dround(m, vx[d]);
          kpos[(size_t)g * nkv + j] = p;
          j++;
        }
      }
      for (i = 0; i < nq; i++) qpos[i] = q->pos - nq + i;
      rc = ref_cfg(&at);
      ref_attend_masked_heads(&rc, qd, nq, kd, vd, nkv, qpos, kpos, (size_t)nkv, NULL, od, NULL);
      err = ref_max_err(out, od, nout, &where);
      PM_CHECK(err <= 3e-5,
               "kva_attend_cache (len %d pos %d demoted %d, n_q %d, H %d G %d, window %d sink %d softcap %g): max err "
               "%.3g at %lu",
               q->len, q->pos, q->dm_len, nq, m->H, m->G, at.window, at.n_sink, (double)at.softcap, err,
               (unsigned long)where);
      free(qd);
      free(kd);
      free(vd);
      free(kpos);
      free(qpos);
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
  size_t size = 0;
  kva_attn at;
  kva_evict e;
  kva_seq_stats ss;
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
  PM_CHECK(kva_seq_len(m->c, id) == -1 && kva_seq_pos(m->c, id) == -1 && kva_seq_demoted(m->c, id) == -1,
           "stale id %d: len/pos/demoted not -1", id);
  PM_CHECK(kva_seq_fits(m->c, id, 1, &need) == KVA_FITS_NEVER, "stale id %d: fits not NEVER", id);
  PM_CHECK(kva_seq_append(m->c, id, 1) == KVA_ERR_SEQ, "stale id %d: append", id);
  if (m->G * m->D <= 64 && m->G * m->DV <= 64 && m->H * m->DV <= 64 && m->H * m->D <= 64) {
    PM_CHECK(kva_store(m->c, id, 0, k, v, 1) == KVA_ERR_SEQ, "stale id %d: store", id);
    PM_CHECK(kva_attend_cache(m->c, id, 0, &at, k, 1, o) == KVA_ERR_SEQ, "stale id %d: attend_cache", id);
    PM_CHECK(kva_seq_read(m->c, id, 0, 0, k, v, pos) == KVA_ERR_SEQ, "stale id %d: read", id);
    PM_CHECK(kva_seq_read_demoted(m->c, id, 0, 0, k, v, pos) == KVA_ERR_SEQ, "stale id %d: read_demoted", id);
  }
  PM_CHECK(kva_seq_publish(m->c, id, tok, 1, 0) == KVA_ERR_SEQ, "stale id %d: publish", id);
  PM_CHECK(kva_seq_truncate(m->c, id, 0) == KVA_ERR_SEQ, "stale id %d: truncate", id);
  PM_CHECK(kva_seq_fork(m->c, id, &out) == KVA_ERR_SEQ && out == -5, "stale id %d: fork", id);
  PM_CHECK(kva_seq_get_stats(m->c, id, &ss) == KVA_ERR_SEQ, "stale id %d: get_stats", id);
  PM_CHECK(kva_seq_export(m->c, id, NULL, 0, &size) == KVA_ERR_SEQ, "stale id %d: export", id);
  if (m->cfg.evict_support != KVA_EVICT_SUPPORT_NONE) {
    memset(&e, 0, sizeof e);
    e.kind = KVA_EVICT_WINDOW;
    e.budget = 4;
    PM_CHECK(kva_seq_set_evict(m->c, id, &e) == KVA_ERR_SEQ, "stale id %d: set_evict", id);
    PM_CHECK(kva_seq_compress(m->c, id, 1) == KVA_ERR_SEQ, "stale id %d: compress", id);
  }
  PM_CHECK(kva_seq_free(m->c, id) == KVA_ERR_SEQ, "stale id %d: free", id);
  pm_stats(m, &a);
  PM_CHECK(pm_stats_same(&a, &b, 0), "calls with stale id %d changed the stats", id);
}

static inline void pm_op_read_bad(pm_model *m) {
  pm_seq *q = pm_pick(m);
  float k[64];
  if (!q) return;
  kt_fill_sentinel(k, 64);
  PM_CHECK(kva_seq_read(m->c, q->id, 0, q->len, NULL, NULL, NULL) == KVA_ERR_ARG, "read slot == len");
  PM_CHECK(kva_seq_read(m->c, q->id, 0, -1, NULL, NULL, NULL) == KVA_ERR_ARG, "read slot -1");
  PM_CHECK(kva_seq_read(m->c, q->id, m->L, 0, NULL, NULL, NULL) == KVA_ERR_ARG, "read layer n_layers");
  PM_CHECK(kva_seq_read_demoted(m->c, q->id, 0, q->dm_len, NULL, NULL, NULL) == KVA_ERR_ARG,
           "read_demoted slot == kva_seq_demoted (%d)", q->dm_len);
  PM_CHECK(kva_seq_read_demoted(m->c, q->id, 0, -1, NULL, NULL, NULL) == KVA_ERR_ARG, "read_demoted slot -1");
  PM_CHECK(kva_seq_read_demoted(m->c, q->id, m->L, 0, NULL, NULL, NULL) == KVA_ERR_ARG, "read_demoted layer n_layers");
  if (m->G * m->D <= 64) {
    PM_CHECK(kva_seq_read(m->c, q->id, 0, q->len, k, NULL, NULL) == KVA_ERR_ARG && kt_all_sentinel(k, 64),
             "failed read wrote its output");
    PM_CHECK(kva_seq_read_demoted(m->c, q->id, 0, q->dm_len, k, NULL, NULL) == KVA_ERR_ARG && kt_all_sentinel(k, 64),
             "failed read_demoted wrote its output");
  }
}

static inline void pm_op_fits(pm_model *m) {
  pm_seq *q = pm_pick(m);
  kva_cache_stats b, a;
  int n, need = -1, nmin, own;
  kva_fit f;
  const pm_pol *pol;
  pm_plan pl;
  if (!q) return;
  n = pm_int(m->src, 0, m->cap + m->bs);
  pol = pm_pol_next(q);
  memset(&pl, 0, sizeof pl);
  if (n > 0) pm_plan_evict(m, q, pol, (pol->rollback ? q->len : q->len + n) - pol->budget, &pl);
  pm_stats(m, &b);
  pm_scorer_expect(m, q, pl.ne);
  f = kva_seq_fits(m->c, q->id, n, &need);
  m->sc_q = NULL;
  pm_stats(m, &a);
  PM_CHECK(pm_stats_same(&a, &b, 0), "kva_seq_fits changed the stats");
  own = pm_blocks(m, q->len);
  if (pl.ne == 0) {
    nmin = n ? pm_blocks(m, (long)q->len + n) - own : 0;
    PM_CHECK(need >= nmin && need <= nmin + 1, "fits: blocks_needed %d, want %d (+1)", need, nmin);
    if (own + nmin > m->nb)
      PM_CHECK(f == KVA_FITS_NEVER, "fits: %d blocks > pool %d but %d", own + nmin, m->nb, (int)f);
    if (f == KVA_FITS_NOW)
      PM_CHECK(need <= b.blocks_free + b.blocks_cached, "fits NOW but needs %d of %d", need,
               b.blocks_free + b.blocks_cached);
  } else {
    int kept = pm_blocks(m, q->len - pl.ne), fin = pm_blocks(m, (long)q->len - pl.ne + n), newb = fin - kept;
    PM_CHECK(need >= newb && need <= newb + kept && (!q->excl || need == newb),
             "fits (evicting %d of %d, n %d): blocks_needed %d, want %d%s", pl.ne, q->len, n, need, newb,
             q->excl ? "" : " (+ copies)");
    if (fin > m->nb || q->excl)
      PM_CHECK((f == KVA_FITS_NEVER) == (fin > m->nb),
               "fits (evicting %d of %d, n %d): %d blocks after in a pool of %d: %d", pl.ne, q->len, n, fin, m->nb,
               (int)f);
  }
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

/* the kva_evict of a shadow policy */
static inline void pm_evict_of(pm_model *m, const pm_pol *p, kva_evict *e) {
  memset(e, 0, sizeof *e);
  e->kind = p->kind;
  if (p->kind == KVA_EVICT_NONE) return;
  e->budget = p->budget;
  e->n_sink = p->n_sink;
  e->n_recent = p->n_recent;
  e->rollback = p->rollback;
  if (p->kind == KVA_EVICT_SCORE) {
    e->score = pm_scorer;
    e->score_user = &m->prof[p->prof];
  }
  if (p->demote) {
    e->demote_dtype = m->cfg.demote_dtype;
    e->demote_budget = p->dcap == m->rcap && pm_chance(m->src, 50) ? 0 : p->dcap;
  }
}

/* kva_seq_set_evict(q, e), e being p (want KVA_OK) or broken (bad >= 0) */
static inline void pm_do_set_evict(pm_model *m, pm_seq *q, const pm_pol *p, const kva_evict *e, kva_status want,
                                   int bad) {
  kva_cache_stats b, a;
  kva_status st;
  pm_stats(m, &b);
  st = kva_seq_set_evict(m->c, q->id, e);
  pm_stats(m, &a);
  PM_CHECK(pm_stats_same(&a, &b, 0), "kva_seq_set_evict changed the stats");
  if (m->cfg.evict_support == KVA_EVICT_SUPPORT_NONE && p->kind == KVA_EVICT_WINDOW && bad < 0) {
    PM_CHECK(st != KVA_OK, "kva_seq_set_evict(WINDOW) on an evict_support NONE cache succeeded");
    return;
  }
  PM_CHECK(st == want,
           "kva_seq_set_evict(kind %d budget %d sink %d recent %d rollback %d score %s demote %d/%d; broken field %d; "
           "ring %d of %d) = %s, want %s",
           e->kind, e->budget, e->n_sink, e->n_recent, e->rollback, e->score ? "set" : "none", (int)e->demote_dtype,
           e->demote_budget, bad, q->dm_len, q->dm_cap, kva_status_str(st), kva_status_str(want));
  if (st != KVA_OK || want != KVA_OK) return;
  q->pend = *p;
  q->has_pend = 1;
  m->n_policies++;
}

/* kva_seq_set_evict with a random policy (now and then broken in one field);
   on success it is the policy of the sequence's next append */
static inline void pm_op_set_evict(pm_model *m) {
  pm_seq *q = pm_pick_evicting(m); /* often a change of policy: heads that evicted apart meet new sinks */
  kva_evict e;
  pm_pol p;
  kva_status want = KVA_OK;
  int r, bad = -1, none_support = m->cfg.evict_support == KVA_EVICT_SUPPORT_NONE;
  if (!q) return;
  memset(&e, 0, sizeof e);
  memset(&p, 0, sizeof p);
  r = pm_int(m->src, 0, 99);
  p.kind = r < 42 ? KVA_EVICT_WINDOW : r < 84 ? KVA_EVICT_SCORE : KVA_EVICT_NONE;
  if (none_support && p.kind == KVA_EVICT_NONE) p.kind = KVA_EVICT_SCORE;
  if (p.kind != KVA_EVICT_NONE) {
    p.budget = pm_int(m->src, 1, pm_chance(m->src, 20) ? m->cap : 2 * m->bs + 2);
    p.n_sink = pm_chance(m->src, 50) ? 0 : pm_int(m->src, 0, pm_min(2, p.budget));
    p.n_recent = pm_chance(m->src, 40) ? 0 : pm_int(m->src, 0, pm_min(3, p.budget - p.n_sink));
    if (p.kind == KVA_EVICT_WINDOW) p.n_recent = pm_int(m->src, 0, 2); /* ignored, may even exceed the budget */
    p.rollback = pm_chance(m->src, 25);
    p.prof = pm_int(m->src, 0, 2);
    if (m->has_dm && pm_chance(m->src, 60)) {
      p.demote = 1;
      if (q->dm_len > 0 && pm_chance(m->src, 75)) p.dcap = q->dm_cap;
      else p.dcap = pm_chance(m->src, 25) ? m->rcap : pm_int(m->src, 1, pm_min(m->rcap, 2 * m->bs + 1));
    }
    pm_evict_of(m, &p, &e);
  } else if (pm_chance(m->src, 30)) { /* kind NONE ignores the demotion fields */
    e.demote_dtype = m->has_dm ? m->cfg.demote_dtype : KVA_F32;
    e.demote_budget = pm_int(m->src, 0, 3);
  }
  if (p.kind != KVA_EVICT_NONE && !none_support && pm_chance(m->src, 12)) { /* one broken field */
    bad = pm_int(m->src, 0, 12);
    want = KVA_ERR_ARG;
    switch (bad) {
    case 0: e.budget = 0; e.n_sink = e.n_recent = 0; break;
    case 1: e.budget = -pm_int(m->src, 1, 3); e.n_sink = e.n_recent = 0; break;
    case 2:
      if (p.kind == KVA_EVICT_WINDOW) e.n_sink = e.budget + 1;
      else e.n_recent = e.budget - e.n_sink + 1;
      break;
    case 3: e.n_sink = -1; break;
    case 4:
      if (p.kind == KVA_EVICT_SCORE) e.n_recent = -1;
      else e.rollback = 2;
      break;
    case 5: e.rollback = 2; break;
    case 6:
      if (p.kind == KVA_EVICT_SCORE) e.score = NULL;
      else e.score = pm_scorer; /* score set for another kind */
      break;
    case 7: e.accumulate = 2; break;
    case 8: e.demote_dtype = KVA_DTYPE_DEFAULT; e.demote_budget = pm_int(m->src, 1, 3); break;
    case 9:
      if (m->has_dm) {
        e.demote_dtype = m->cfg.demote_dtype;
        e.demote_budget = -1;
      } else
        e.kind = 7; /* an unknown kind */
      break;
    case 10: /* not the cache's demoted type */
      e.demote_dtype = m->cfg.demote_dtype == KVA_F32 ? KVA_BF16 : KVA_F32;
      e.demote_budget = 0;
      want = KVA_ERR_UNSUPPORTED;
      break;
    case 11: /* a ring larger than a block table */
      if (m->has_dm) {
        e.demote_dtype = m->cfg.demote_dtype;
        e.demote_budget = m->rcap + pm_int(m->src, 1, 2);
        want = KVA_ERR_UNSUPPORTED;
      } else
        e.kind = -1;
      break;
    default: /* H2O without the scores: only an ALL cache keeps them */
      if (m->cfg.evict_support == KVA_EVICT_SUPPORT_WINDOW) {
        e.kind = KVA_EVICT_H2O;
        e.score = NULL;
        e.score_user = NULL;
        e.n_recent = 0;
        want = KVA_ERR_UNSUPPORTED;
      } else
        e.budget = 0;
      break;
    }
  } else if (none_support && p.kind != KVA_EVICT_NONE)
    want = KVA_ERR_UNSUPPORTED; /* a cache that keeps no positions evicts nothing (WINDOW: any refusal) */
  else if (p.demote && q->dm_len > 0 && p.dcap != q->dm_cap)
    want = KVA_ERR_UNSUPPORTED; /* a ring keeps its size while it holds tokens */
  pm_do_set_evict(m, q, &p, &e, want, bad);
}

/* kva_seq_compress: evict now under the sequence's policy, down to a budget */
static inline void pm_do_compress(pm_model *m, pm_seq *q, int budget) {
  const pm_pol *pol = pm_pol_next(q);
  pm_plan pl;
  kva_cache_stats b, a;
  kva_status st, want_fail = KVA_OK;
  int l, stored = 1, dfree, own;
  for (l = 0; l < m->L; l++) stored &= pm_step_stored(m, q, l);
  pm_stats(m, &b);
  dfree = b.demote_blocks - b.demote_blocks_used;
  own = pm_blocks(m, q->len);
  memset(&pl, 0, sizeof pl);
  if (pol->kind != KVA_EVICT_NONE) pm_plan_evict(m, q, pol, q->len - budget, &pl);
  pm_scorer_expect(m, q, pl.ne);
  if (pol->kind == KVA_EVICT_SCORE && stored && pl.ne > 0 && q->excl && pl.dneed <= dfree && pm_chance(m->src, 15))
    want_fail = pm_arm_scorer(m);
  st = kva_seq_compress(m->c, q->id, budget);
  pm_stats(m, &a);
  m->sc_fail = 0;
  m->sc_q = NULL;
  if (pol->kind == KVA_EVICT_NONE || !stored || want_fail != KVA_OK) {
    if (pol->kind == KVA_EVICT_NONE)
      PM_CHECK(st != KVA_OK, "kva_seq_compress of a sequence without a policy succeeded");
    else if (!stored)
      PM_CHECK(st == KVA_ERR_NOT_STORED, "kva_seq_compress with the step (%d) not stored in every layer = %s",
               q->last_append, kva_status_str(st));
    else {
      m->n_score_fail++;
      PM_CHECK(st == want_fail, "kva_seq_compress(%d of %d) evicting %d, the scorer refusing: %s, want %s", budget,
               q->len, pl.ne, kva_status_str(st), kva_status_str(want_fail));
    }
    PM_CHECK(pm_stats_same(&a, &b, 0), "refused kva_seq_compress changed the stats");
    return;
  }
  m->n_compress++;
  if (pl.dneed > dfree) { /* the ring's new blocks are not there */
    m->n_dm_full++;
    PM_CHECK(st == KVA_ERR_FULL, "kva_seq_compress(%d of %d) demoting %d, %d of %d demoted blocks free: %s, want "
             "KVA_ERR_FULL", budget, q->len, pl.ne, dfree, pl.dneed, kva_status_str(st));
  } else if (q->excl)
    PM_CHECK(st == KVA_OK, "kva_seq_compress(%d of %d) evicting %d: %s", budget, q->len, pl.ne, kva_status_str(st));
  else /* copies of the shared blocks it compacts may not fit */
    PM_CHECK(st == KVA_OK || st == KVA_ERR_FULL, "kva_seq_compress(%d of %d) evicting %d: %s", budget, q->len, pl.ne,
             kva_status_str(st));
  if (st != KVA_OK) {
    PM_CHECK(pm_stats_same(&a, &b, 0), "kva_seq_compress refused (%s) changed the stats (appends_failed %ld->%ld)",
             kva_status_str(st), b.appends_failed, a.appends_failed);
    return;
  }
  if (pol->kind == KVA_EVICT_SCORE) {
    if (pl.ne > 0)
      PM_CHECK(m->sc_calls == m->L * m->G, "kva_seq_compress evicting %d called the scorer %d times, want %d", pl.ne,
               m->sc_calls, m->L * m->G);
    else if (pl.want <= 0)
      PM_CHECK(m->sc_calls == 0, "kva_seq_compress within the budget called the scorer %d times", m->sc_calls);
  }
  {
    long dc = a.cow_copies - b.cow_copies;
    int kept = pm_blocks(m, q->len - pl.ne);
    if (q->excl) {
      PM_CHECK(dc == 0, "kva_seq_compress of blocks nobody shares copied %ld", dc);
      PM_CHECK(a.blocks_free + a.blocks_cached == b.blocks_free + b.blocks_cached + own - kept,
               "kva_seq_compress evicting %d of %d released %d blocks, want %d", pl.ne, q->len,
               a.blocks_free + a.blocks_cached - b.blocks_free - b.blocks_cached, own - kept);
    }
    PM_CHECK(dc >= 0, "cow_copies went down");
    m->cow += dc;
    m->n_cow += dc;
    PM_CHECK(a.appends_failed == b.appends_failed, "kva_seq_compress counted in appends_failed");
    PM_CHECK(a.demote_blocks_used == b.demote_blocks_used + pl.dneed,
             "kva_seq_compress demoting %d took %d demoted blocks, want %d", pl.ne,
             a.demote_blocks_used - b.demote_blocks_used, pl.dneed);
  }
  pm_apply_evict(m, q, pol, &pl);
  if (q->has_pend) {
    q->act = q->pend;
    q->has_pend = 0;
  }
  q->last_append = 0; /* it ends the step */
  if (!q->excl && pl.ne > 0) q->tail = PM_MAYBEPUB; /* which block is the tail now is the library's business */
}

static inline void pm_op_compress(pm_model *m) {
  pm_seq *q = pm_pick_evicting(m);
  const pm_pol *pol;
  int r, budget;
  if (!q) return;
  pol = pm_pol_next(q);
  r = pm_int(m->src, 0, 9); /* often down to what the protected tokens allow */
  budget = r < 4 ? pm_int(m->src, 1, pol->n_sink + pol->n_recent + 2)
                 : r < 8 ? pm_int(m->src, 1, pm_max(1, q->len)) : pm_int(m->src, 1, q->len + 4);
  pm_do_compress(m, q, budget);
}

/* a change of policy on a sequence whose heads evicted apart: SCORE without
   sinks keeps the first positions in some heads only (profile 2), then a
   policy with sinks protects different counts per head, and a large append
   or a compression to 1 evicts as far as the fewest allow */
static inline void pm_op_switch(pm_model *m) {
  pm_seq *q = pm_pick_evicting(m);
  pm_pol p;
  kva_evict e;
  int it, l, n;
  if (!q || m->cfg.evict_support == KVA_EVICT_SUPPORT_NONE) return;
  memset(&p, 0, sizeof p);
  p.kind = KVA_EVICT_SCORE;
  p.prof = 2;
  p.budget = pm_int(m->src, 3, 2 * m->bs + 3);
  p.n_recent = pm_int(m->src, 0, 1);
  if (m->has_dm && pm_chance(m->src, 50)) {
    p.demote = 1;
    p.dcap = q->dm_len > 0 ? q->dm_cap : pm_int(m->src, 1, pm_min(m->rcap, 2 * m->bs + 1));
  }
  pm_evict_of(m, &p, &e);
  pm_do_set_evict(m, q, &p, &e, KVA_OK, -1);
  for (it = 0; it < 2; it++) {
    n = pm_min(pm_int(m->src, 1, p.budget + m->bs), m->pos_max - q->pos);
    if (n <= 0) return;
    pm_do_append(m, q, n);
    if (q->last_append > 0)
      for (l = 0; l < m->L; l++) pm_do_store(m, q, l, q->last_append, 1);
    pm_check_all(m);
    if (!q->live) return;
    p.kind = pm_chance(m->src, 50) ? KVA_EVICT_WINDOW : KVA_EVICT_SCORE;
    p.prof = pm_int(m->src, 0, 2);
    p.n_sink = pm_int(m->src, 1, 3);
    p.n_recent = p.kind == KVA_EVICT_SCORE ? pm_int(m->src, 0, 2) : 0;
    p.budget = pm_int(m->src, p.n_sink + p.n_recent, p.n_sink + p.n_recent + 2);
    p.rollback = 0;
    pm_evict_of(m, &p, &e);
    pm_do_set_evict(m, q, &p, &e, KVA_OK, -1);
    if (pm_chance(m->src, 50)) {
      pm_do_compress(m, q, 1);
      return;
    }
  }
}

/* kva_seq_export refuses a sequence holding demoted tokens (sizes only) */
static inline void pm_op_export(pm_model *m) {
  pm_seq *q = pm_pick(m);
  kva_cache_stats b, a;
  kva_status st;
  size_t size = 0;
  if (!q) return;
  pm_stats(m, &b);
  st = kva_seq_export(m->c, q->id, NULL, 0, &size);
  pm_stats(m, &a);
  PM_CHECK(pm_stats_same(&a, &b, 0), "kva_seq_export changed the stats");
  if (q->dm_len > 0) {
    m->n_refused++;
    PM_CHECK(st == KVA_ERR_UNSUPPORTED, "kva_seq_export of a sequence holding %d demoted tokens = %s, want "
             "KVA_ERR_UNSUPPORTED", q->dm_len, kva_status_str(st));
  } else
    PM_CHECK(st == KVA_OK && size > 0, "kva_seq_export(size) = %s, size %lu", kva_status_str(st), (unsigned long)size);
}

/* one random operation, then every check */
static inline void pm_step(pm_model *m) {
  int evicts = m->cfg.evict_support != KVA_EVICT_SUPPORT_NONE;
  int r = pm_int(m->src, 0, evicts ? 123 : 109);
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
  else if (r < 108) m->op = "fits", pm_op_fits(m);
  else if (r < 109) m->op = "export", pm_op_export(m);
  else if (r < 116) m->op = "set_evict", pm_op_set_evict(m);
  else if (r < 118) m->op = "export", pm_op_export(m);
  else if (r < 121) m->op = "compress", pm_op_compress(m);
  else m->op = "switch", pm_op_switch(m);
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
  PM_CHECK(st.blocks_used == 0 && st.blocks_free + st.blocks_cached == m.nb && st.tokens_held == 0 && st.n_seqs == 0 &&
               st.demote_blocks_used == 0 && st.bytes_used == 0,
           "after freeing everything: used %d cached %d free %d tokens %ld seqs %d demoted blocks %d", st.blocks_used,
           st.blocks_cached, st.blocks_free, st.tokens_held, st.n_seqs, st.demote_blocks_used);
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
