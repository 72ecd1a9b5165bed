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
 * Prefix tier (docs/API.md "Prefix tier", pm_config.tier): spill and fetch
 * go to a store inside the shadow, key -> record, that misbehaves at random
 * per operation (spills refused, some kept anyway as after a timeout;
 * fetches that miss, or answer with a flipped bit, a cut or oversized
 * record, another key's record, or a forged one), and drops records when
 * full, as a real store may.  Because content is honest, a record is fully
 * determined by its prefix: every key the shadow publishes is registered
 * with its chain (kva_prefix_key of the parent's key, itself checked against
 * kva_sha256 of the documented bytes), so each spilled record is checked
 * field by field, rows against the honest content as stored, and a second
 * spill of a key must give the same bytes.  Memory is still known only as a
 * bound, the published-key set, now grown by fetches and loads and shrunk
 * by every spill that forgets (nothing may be reused from memory after it
 * left), and a lookup is checked against the documented walk instead of
 * exact state: its fetches follow its own chain in order, none for blocks
 * memory is known to hold (just published, saved or loaded); it stops at
 * the first miss or refusal, reuses every intact record (bit for bit, at
 * positions from the block's depth: the read-back checks), and stops short
 * without asking the store only when no free or cached block is left.
 * Spills come only from calls that may forget (append, compress, a lookup
 * recycling for a fetch) and kva_prefix_save, never from a reset (which,
 * being neither age nor recycling, counts nothing in prefix_forgotten);
 * descendants before ancestors when forgetting, parents first when saving;
 * prefix_forgotten equals the forgetting spills, and every tier_* counter
 * equals what the store saw.  Setup checks the description rules (both
 * callbacks or neither; no layer groups, no LATENT) and, without a tier,
 * record size 0 and save / load refused.
 * A restart (destroy, create over the same store, kva_prefix_load of every
 * record in random order, in passes until one loads nothing) is where
 * memory is known exactly: every load outcome (LOADED, IN_MEMORY, NO_PARENT,
 * KVA_ERR_FULL, KVA_ERR_STREAM for corrupted or forged records) is exact,
 * and loaded prefixes are then reused without the store.  A twin cache of
 * the same record size and another storage type must refuse every record.
 * Forging needs a right checksum and the docs give only its shape: that is
 * the one use of an internal (kva__stream_checksum), so that a changed key,
 * parent key, salt or token id reaches the field and self-key checks.
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
  int tier;               /* 1: spill / fetch into the shadow's store (docs "Prefix tier") */
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

/* ---------------------------------------------------------------- tier types */
#define PM_F_MISS 0   /* a fetch answered with a status other than KVA_OK */
#define PM_F_INTACT 1 /* ... with the record spilled under that key, untouched: it must be reused */
#define PM_F_BAD 2    /* ... with KVA_OK and a record that must be refused */

/* one block key the shadow published (since the run began), and the record the store holds under it */
typedef struct {
  uint8_t key[32];
  uint64_t salt, ph0, ph; /* the shadow's prefix hash before the block and at its end */
  int depth, up;          /* its index in the chain; the entry of the block before it (-1: a first block) */
  int32_t *tok;           /* [bs] */
  unsigned char *rec;     /* the store's record, NULL when the store does not hold one */
  long stamp;             /* the call that last spilled it */
  int loaded;             /* a restart's load phase took it in */
} pm_tkey;

typedef struct {
  int on;
  size_t rsize, hdr; /* the record size; bytes before the token ids */
  int esz;           /* bytes per stored value */
  kva_dtype type;    /* the storage type records must name */
  pm_tkey *e;        /* every key published, in order */
  int n, cap;
  int *idx; /* open addressing over e by the key's first bytes (-1 empty) */
  int icap;
  int *held; /* entries whose record the store holds */
  int n_held, max_held;
  /* what the running call may do, and how the store misbehaves meanwhile */
  int allow_spill, allow_fetch, in_save, twin;
  int spill_fail_pct, fetch_bad_pct;
  long stamp;
  /* totals since the cache was created: its stats must say the same */
  long spills, spill_errors, fetch_hits, fetch_misses, fetch_refused, loads, forgets;
  long tw_fetches, tw_refused;
  /* the running call's traffic */
  int n_spill_op, n_spill_ok_op;
  int *spilled, spilled_cap; /* the entry of each spill (-1: an unknown key) */
  uint8_t (*fkey)[32];       /* [fcap] keys fetched by the running lookup, in order */
  unsigned char *fout;       /* [fcap] PM_F_*, then [fcap] scratch */
  int n_fetch, fcap;
  uint8_t (*qkey)[32]; /* [fcap] the running lookup's chain of keys */
  int qn;
  uint64_t *phs;        /* [bs] scratch */
  unsigned char *buf;   /* rsize + 64 */
  unsigned char *msg;   /* the documented key message */
} pm_tier;

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
  pm_tier tier;
  long n_spilled, n_fetched, n_fetch_bad, n_fetch_miss, n_loaded, n_load_refused, n_restarts, n_saves, n_twins,
      n_tier_tokens;
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

/* every field equal (appends_failed too unless skip_failed), the demoted pool's and the tier's too */
static inline int pm_stats_same(const kva_cache_stats *a, const kva_cache_stats *b, int skip_failed) {
  return kt_stats_equal(a, b, skip_failed) && a->bytes_used == b->bytes_used &&
         a->demote_blocks == b->demote_blocks && a->demote_blocks_used == b->demote_blocks_used &&
         a->demote_block_bytes == b->demote_block_bytes && a->tier_spills == b->tier_spills &&
         a->tier_spill_errors == b->tier_spill_errors && a->tier_fetch_hits == b->tier_fetch_hits &&
         a->tier_fetch_misses == b->tier_fetch_misses && a->tier_fetch_refused == b->tier_fetch_refused &&
         a->tier_loads == b->tier_loads;
}

/* --- published-key set: the shadow's prefix hashes of the blocks memory may hold --- */
#define PM_TOMB UINT64_MAX /* a key spilled by forgetting: memory lost it */
static inline uint64_t pm_pub_norm(uint64_t key) { return !key ? 1 : key == PM_TOMB ? PM_TOMB - 1 : key; }
static inline void pm_pub_clear(pm_model *m) {
  memset(m->pub, 0, sizeof(uint64_t) * (size_t)m->pub_cap);
  m->pub_n = 0;
  m->pub_events = 0;
}
static inline int pm_pub_has(const pm_model *m, uint64_t key) {
  size_t i, mask = (size_t)m->pub_cap - 1;
  key = pm_pub_norm(key);
  for (i = (size_t)(key & mask);; i = (i + 1) & mask) {
    if (m->pub[i] == key) return 1;
    if (m->pub[i] == 0) return 0;
  }
}
static inline void pm_pub_del(pm_model *m, uint64_t key) {
  size_t i, mask = (size_t)m->pub_cap - 1;
  key = pm_pub_norm(key);
  for (i = (size_t)(key & mask); m->pub[i]; i = (i + 1) & mask)
    if (m->pub[i] == key) {
      m->pub[i] = PM_TOMB;
      return;
    }
}
static inline void pm_pub_add(pm_model *m, uint64_t key) {
  size_t i, mask;
  key = pm_pub_norm(key);
  if (pm_pub_has(m, key)) return;
  if (2 * (m->pub_n + 1) > m->pub_cap) { /* rehash: tombstones go; grow if the live keys need it */
    uint64_t *old = m->pub;
    int j, oc = m->pub_cap, live = 0;
    for (j = 0; j < oc; j++) live += old[j] && old[j] != PM_TOMB;
    if (4 * (live + 1) > oc) m->pub_cap *= 2;
    m->pub = (uint64_t *)calloc((size_t)m->pub_cap, sizeof(uint64_t));
    if (!m->pub) abort();
    m->pub_n = 0;
    for (j = 0; j < oc; j++)
      if (old[j] && old[j] != PM_TOMB) {
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

/* ---------------------------------------------------------------- tier: keys and store */
static inline uint64_t pm_tk_hash(const uint8_t *key) {
  uint64_t h;
  memcpy(&h, key, 8);
  return h;
}
static inline int pm_tk_find(const pm_tier *t, const uint8_t *key) {
  size_t i, mask;
  if (!t->icap) return -1;
  mask = (size_t)t->icap - 1;
  for (i = (size_t)(pm_tk_hash(key) & mask);; i = (i + 1) & mask) {
    int x = t->idx[i];
    if (x < 0) return -1;
    if (!memcmp(t->e[x].key, key, 32)) return x;
  }
}
static inline void pm_tk_index(pm_tier *t, int x) {
  size_t i, mask = (size_t)t->icap - 1;
  for (i = (size_t)(pm_tk_hash(t->e[x].key) & mask); t->idx[i] >= 0; i = (i + 1) & mask) {
  }
  t->idx[i] = x;
}

/* SHA-256 of the bytes docs/API.md names: "kvattn-prefix-1", the parent's
   key (zeros for a first block), the salt and the token ids, little-endian */
static inline void pm_key_doc(pm_model *m, const uint8_t *parent, uint64_t salt, const int32_t *tok, uint8_t *key) {
  unsigned char *p = m->tier.msg;
  int i, b;
  memcpy(p, "kvattn-prefix-1", 15);
  if (parent) memcpy(p + 15, parent, 32);
  else memset(p + 15, 0, 32);
  for (b = 0; b < 8; b++) p[47 + b] = (unsigned char)(salt >> (8 * b));
  for (i = 0; i < m->bs; i++)
    for (b = 0; b < 4; b++) p[55 + 4 * i + b] = (unsigned char)((uint32_t)tok[i] >> (8 * b));
  kva_sha256(p, (size_t)(55 + 4 * m->bs), key);
}

/* a key the shadow publishes for the first time: kva_prefix_key must be the documented hash */
static inline int pm_tk_add(pm_model *m, const uint8_t *key, int up, uint64_t salt, uint64_t ph0, const int32_t *tok) {
  pm_tier *t = &m->tier;
  pm_tkey *e;
  uint8_t doc[32], zero[32];
  int i, x;
  if (t->n == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 64;
    t->e = (pm_tkey *)realloc(t->e, sizeof(pm_tkey) * (size_t)t->cap);
    if (!t->e) abort();
  }
  if (2 * (t->n + 1) > t->icap) {
    t->icap = t->icap ? 2 * t->icap : 128;
    free(t->idx);
    t->idx = (int *)malloc(sizeof(int) * (size_t)t->icap);
    if (!t->idx) abort();
    for (i = 0; i < t->icap; i++) t->idx[i] = -1;
    for (i = 0; i < t->n; i++) pm_tk_index(t, i);
  }
  x = t->n++;
  e = &t->e[x];
  memcpy(e->key, key, 32);
  e->salt = salt;
  e->up = up;
  e->depth = up >= 0 ? t->e[up].depth + 1 : 0;
  e->ph0 = ph0;
  e->tok = (int32_t *)malloc(sizeof(int32_t) * (size_t)m->bs);
  if (!e->tok) abort();
  memcpy(e->tok, tok, sizeof(int32_t) * (size_t)m->bs);
  for (i = 0; i < m->bs; i++) ph0 = pm_ph_next(ph0, tok[i]);
  e->ph = ph0;
  e->rec = NULL;
  e->stamp = -1;
  e->loaded = 0;
  pm_tk_index(t, x);
  pm_key_doc(m, up >= 0 ? t->e[up].key : NULL, salt, tok, doc);
  PM_CHECK(!memcmp(doc, key, 32), "kva_prefix_key (depth %d, salt %llx) is not SHA-256 of the documented bytes",
           e->depth, (unsigned long long)salt);
  if (up < 0) {
    memset(zero, 0, 32);
    kva_prefix_key(zero, salt, tok, m->bs, doc);
    PM_CHECK(!memcmp(doc, key, 32), "kva_prefix_key: a NULL parent differs from 32 zero bytes");
  }
  return x;
}

/* kva_seq_publish(q, nfull blocks): every block's key joins the registry */
static inline void pm_tier_publish(pm_model *m, const pm_seq *q, int nfull) {
  pm_tier *t = &m->tier;
  uint8_t key[2][32];
  int j, up = -1, x;
  if (!t->on) return;
  for (j = 0; j < nfull; j++) {
    kva_prefix_key(j ? key[(j - 1) & 1] : NULL, q->salt, q->tok + (size_t)j * m->bs, m->bs, key[j & 1]);
    x = pm_tk_find(t, key[j & 1]);
    if (x < 0)
      x = pm_tk_add(m, key[j & 1], up, q->salt, j ? q->ph[j * m->bs - 1] : pm_ph0(q->salt), q->tok + (size_t)j * m->bs);
    up = x;
  }
}

/* the running lookup's chain of keys, blocks [qn, upto) computed now */
static inline void pm_tier_qkeys(pm_model *m, uint64_t salt, const int32_t *tok, int upto) {
  pm_tier *t = &m->tier;
  if (upto > t->fcap) upto = t->fcap;
  for (; t->qn < upto; t->qn++)
    kva_prefix_key(t->qn ? t->qkey[t->qn - 1] : NULL, salt, tok + (size_t)t->qn * m->bs, m->bs, t->qkey[t->qn]);
}

/* the tokens of entry x's whole prefix into out[(depth + 1) bs] */
static inline void pm_tier_tokens(const pm_model *m, int x, int32_t *out) {
  const pm_tier *t = &m->tier;
  for (; x >= 0; x = t->e[x].up)
    memcpy(out + (size_t)t->e[x].depth * m->bs, t->e[x].tok, sizeof(int32_t) * (size_t)m->bs);
}

/* NULL when rec is the record docs/API.md "Records" describes for entry e
   (its rows the honest content of e's prefix, as stored), else the first
   field that is not */
static inline const char *pm_rec_why(pm_model *m, const pm_tkey *e, const unsigned char *r, size_t size) {
  pm_tier *t = &m->tier;
  uint32_t u;
  uint64_t w;
  int32_t f[7];
  float sc;
  int l, g, i, d, kv;
  size_t o;
  uint8_t zero[32];
  if (size != t->rsize) return "size (not kva_prefix_record_size)";
  if (memcmp(r, "kvattnPB", 8)) return "magic";
  memcpy(&u, r + 8, 4);
  if (u != 1) return "version";
  memcpy(&u, r + 12, 4);
  if (u != 0x01020304u) return "byte order";
  memcpy(&w, r + 16, 8);
  if (w != (uint64_t)t->rsize) return "size field";
  if (memcmp(r + 24, e->key, 32)) return "key field";
  memset(zero, 0, 32);
  if (memcmp(r + 56, e->up >= 0 ? t->e[e->up].key : zero, 32)) return "parent key field (not the chain's)";
  memcpy(&w, r + 88, 8);
  if (w != e->salt) return "salt";
  memcpy(f, r + 96, sizeof f);
  if (f[0] != KVA_CACHE_KV || f[1] != m->L || f[2] != m->G || f[3] != m->D || f[4] != m->DV || f[5] != m->bs ||
      f[6] != 0)
    return "kind / shape / rotate fields";
  memcpy(&u, r + 124, 4);
  if (u != 0) return "reserved word";
  for (o = 128, l = 0; l < m->L; l++) {
    memcpy(&u, r + o, 4);
    if (u != (uint32_t)t->type) return "K storage type";
    memcpy(&u, r + o + 4, 4);
    if (u != (uint32_t)t->type) return "V storage type";
    for (o += 8, i = 0; i < 2 * m->G; i++, o += 4) {
      memcpy(&sc, r + o, 4);
      if (kt_f2u(sc) != kt_f2u(1.0f)) return "FP8 scales (1 for other types)";
    }
  }
  if (memcmp(r + o, e->tok, sizeof(int32_t) * (size_t)m->bs)) return "token ids";
  o += sizeof(int32_t) * (size_t)m->bs;
  for (i = 0; i < m->bs; i++) t->phs[i] = pm_ph_next(i ? t->phs[i - 1] : e->ph0, e->tok[i]);
  for (l = 0; l < m->L; l++)
    for (kv = 0; kv < 2; kv++) {
      int dim = kv ? m->DV : m->D;
      for (g = 0; g < m->G; g++)
        for (i = 0; i < m->bs; i++)
          for (d = 0; d < dim; d++, o += (size_t)t->esz) {
            float x = pm_val(t->phs[i], l, kv, g, d);
            uint16_t h;
            int same;
            if (t->esz == 4) {
              memcpy(&sc, r + o, 4);
              same = kt_f2u(sc) == kt_f2u(x);
            } else {
              memcpy(&h, r + o, 2);
              same = h == (t->type == KVA_BF16 ? kva_f32_to_bf16(x) : kva_f32_to_f16(x));
            }
            if (!same) return kv ? "V rows (not the honest content)" : "K rows (not the honest content)";
          }
    }
  if (o + 8 != t->rsize) return "layout (rows and checksum not ending at the record size)";
  return NULL;
}

/* the store keeps at most max_held records, dropping a random one for room
   (a store may lose records: later fetches miss) */
static inline void pm_tier_hold(pm_model *m, int x, const void *rec) {
  pm_tier *t = &m->tier;
  pm_tkey *e = &t->e[x];
  if (e->rec) {
    PM_CHECK(!memcmp(e->rec, rec, t->rsize), "op %s: the record of a block (depth %d) changed between two spills",
             m->op, e->depth);
    memcpy(e->rec, rec, t->rsize);
    return;
  }
  if (t->n_held == t->max_held) {
    int k = pm_int(m->src, 0, t->n_held - 1), y = t->held[k], last = t->held[--t->n_held];
    free(t->e[y].rec);
    t->e[y].rec = NULL;
    if (k < t->n_held) t->held[k] = last;
  }
  e->rec = (unsigned char *)malloc(t->rsize);
  if (!e->rec) abort();
  memcpy(e->rec, rec, t->rsize);
  t->held[t->n_held++] = x;
}

/* One header or token-id field of record r changed and the checksum made
   right again: only the field checks can refuse it. docs/API.md describes
   the checksum's shape but not its constants, so this is the one place the
   shadow calls an internal (kva__stream_checksum, as test_tier.c does). */
static inline void pm_tier_forge(pm_model *m, unsigned char *r) {
  pm_tier *t = &m->tier;
  /* field f is bytes [at[f], at[f + 1]): magic, version, byte order, size, key, parent key, salt, shape, reserved,
     types and scales, token ids */
  int at[12] = {0, 8, 12, 16, 24, 56, 88, 96, 124, 128, 0, 0}, f = pm_int(m->src, 0, 10);
  uint64_t sum;
  at[10] = (int)t->hdr;
  at[11] = (int)t->hdr + 4 * m->bs;
  r[pm_int(m->src, at[f], at[f + 1] - 1)] ^= (unsigned char)(1u << pm_int(m->src, 0, 7));
  sum = kva__stream_checksum(r, t->rsize - 8);
  memcpy(r + t->rsize - 8, &sum, 8);
}

static inline kva_status pm_tier_err(pm_model *m) {
  static const kva_status errs[6] = {KVA_ERR_FULL, KVA_ERR_STREAM, KVA_ERR_NOMEM, KVA_ERR_ARG, KVA_ERR_UNSUPPORTED,
                                     (kva_status)13};
  return errs[pm_int(m->src, 0, 5)];
}

/* kva_cache_desc.spill: checks the record against the shadow, then the store
   takes it or fails */
static inline kva_status pm_tier_spill(void *user, const uint8_t key[32], const void *rec, size_t size) {
  pm_model *m = (pm_model *)user;
  pm_tier *t = &m->tier;
  const char *why = "an unknown key";
  int x = pm_tk_find(t, key), a;
  t->spills++;
  if (!t->in_save) t->forgets++;
  m->n_spilled++;
  PM_CHECK(t->allow_spill, "op %s: spill called (only a call that forgets a block, or kva_prefix_save, may spill)",
           m->op);
  if (t->n_spill_op == t->spilled_cap) {
    t->spilled_cap = t->spilled_cap ? 2 * t->spilled_cap : 64;
    t->spilled = (int *)realloc(t->spilled, sizeof(int) * (size_t)t->spilled_cap);
    if (!t->spilled) abort();
  }
  t->spilled[t->n_spill_op++] = x;
  PM_CHECK(x >= 0, "op %s: spill of a key the shadow never published (no prefix of any salt has it)", m->op);
  if (x >= 0) {
    pm_tkey *e = &t->e[x];
    PM_CHECK(pm_pub_has(m, e->ph),
             "op %s: spill of a block (depth %d) memory cannot hold: not published, fetched or loaded since the last "
             "reset, or forgotten (spilled) already",
             m->op, e->depth);
    why = pm_rec_why(m, e, (const unsigned char *)rec, size);
    PM_CHECK(!why, "op %s: spilled record (depth %d, %lu bytes): %s differs from docs/API.md \"Records\"", m->op,
             e->depth, (unsigned long)size, why);
    if (t->in_save) {
      PM_CHECK(e->stamp != t->stamp, "op %s: kva_prefix_save handed a block (depth %d) to spill twice", m->op,
               e->depth);
      PM_CHECK(e->up < 0 || t->e[e->up].stamp == t->stamp,
               "op %s: kva_prefix_save spilled a block (depth %d) before its parent (parents before their children)",
               m->op, e->depth);
    } else {
      PM_CHECK(e->stamp != t->stamp, "op %s: a block (depth %d) forgotten twice in one call", m->op, e->depth);
      for (a = e->up; a >= 0; a = t->e[a].up)
        if (t->e[a].stamp == t->stamp) {
          PM_CHECK(0, "op %s: a block (depth %d) spilled after its ancestor (depth %d): descendants are forgotten "
                   "and spilled before it",
                   m->op, e->depth, t->e[a].depth);
          break;
        }
      pm_pub_del(m, e->ph); /* forgotten: memory no longer holds it */
    }
    e->stamp = t->stamp;
  }
  if (pm_int(m->src, 0, 99) < t->spill_fail_pct) {
    t->spill_errors++;
    if (!why && pm_chance(m->src, 30)) pm_tier_hold(m, x, rec); /* it was written, the answer timed out */
    return pm_tier_err(m);
  }
  t->n_spill_ok_op++;
  if (!why) pm_tier_hold(m, x, rec);
  return KVA_OK;
}

/* kva_cache_desc.fetch: the record under key, or (fetch_bad_pct) a miss, a
   flipped bit, a cut or oversized record, another key's record, a forged one */
static inline kva_status pm_tier_fetch(void *user, const uint8_t key[32], void *rec, size_t cap, size_t *size) {
  pm_model *m = (pm_model *)user;
  pm_tier *t = &m->tier;
  int x = pm_tk_find(t, key), held, out, mode, y;
  unsigned char *r = (unsigned char *)rec;
  PM_CHECK(t->allow_fetch, "op %s: fetch called (only kva_seq_new_prefix, when the pool has a block to give, may "
           "fetch)",
           m->op);
  PM_CHECK(cap == t->rsize && rec && size, "op %s: fetch with cap %lu (record size %lu), rec %p, size %p", m->op,
           (unsigned long)cap, (unsigned long)t->rsize, rec, (void *)size);
  if (!rec || !size || cap < t->rsize) return KVA_ERR_ARG;
  held = x >= 0 && t->e[x].rec;
  if (t->twin) { /* another cache's shape: whatever comes back must be refused */
    t->tw_fetches++;
    if (!held) return KVA_ERR_UNSUPPORTED;
    t->tw_refused++;
    memcpy(r, t->e[x].rec, t->rsize);
    *size = t->rsize;
    return KVA_OK;
  }
  if (t->n_fetch >= t->fcap) {
    PM_CHECK(0, "op %s: more fetches in one lookup than it has blocks", m->op);
    return KVA_ERR_ARG;
  }
  memcpy(t->fkey[t->n_fetch], key, 32);
  mode = pm_int(m->src, 0, 99) < t->fetch_bad_pct ? pm_int(m->src, 1, 6) : 0;
  if (mode == 0 && held) {
    memcpy(r, t->e[x].rec, t->rsize);
    *size = t->rsize;
    out = PM_F_INTACT;
  } else if (mode <= 1 || t->n_held == 0) { /* not there, or the store failed */
    t->fout[t->n_fetch++] = PM_F_MISS;
    t->fetch_misses++;
    m->n_fetch_miss++;
    return pm_tier_err(m);
  } else {
    /* the record under key, else (or, mode 5, anyway) another key's: the held entries are distinct */
    int k = pm_int(m->src, 0, t->n_held - 1);
    y = held && mode != 5 ? x : t->held[k] != x ? t->held[k] : t->held[(k + 1) % t->n_held];
    if (y == x && mode == 5) { /* nothing else stored: a miss */
      t->fout[t->n_fetch++] = PM_F_MISS;
      t->fetch_misses++;
      m->n_fetch_miss++;
      return pm_tier_err(m);
    }
    memcpy(r, t->e[y].rec, t->rsize);
    *size = t->rsize;
    if (mode == 2) r[pm_int(m->src, 0, (int)t->rsize - 1)] ^= (unsigned char)(1u << pm_int(m->src, 0, 7));
    else if (mode == 3) *size = (size_t)pm_int(m->src, 0, (int)t->rsize - 1);
    else if (mode == 4) *size = t->rsize + (size_t)pm_int(m->src, 1, 64); /* more than cap: not this record */
    else if (mode == 6) pm_tier_forge(m, r);
    out = PM_F_BAD;
  }
  t->fout[t->n_fetch++] = (unsigned char)out;
  if (out == PM_F_INTACT) {
    t->fetch_hits++;
    m->n_fetched++;
  } else {
    t->fetch_refused++;
    m->n_fetch_bad++;
  }
  return KVA_OK;
}

/* the next library call may spill / fetch (else either is a violation) */
static inline void pm_tier_begin(pm_model *m, int spill, int fetch) {
  pm_tier *t = &m->tier;
  t->allow_spill = spill;
  t->allow_fetch = fetch;
  t->stamp++;
  t->n_spill_op = t->n_spill_ok_op = 0;
  t->n_fetch = 0;
}
static inline void pm_tier_end(pm_model *m) { m->tier.allow_spill = m->tier.allow_fetch = 0; }

/* ---------------------------------------------------------------- tier: lookups */
/* After kva_seq_new_prefix(tok, n, salt) on a tiered cache reused `reused`
   tokens: the fetches it made, their answers and the reuse must fit the
   documented lookup (memory first, then fetch while the pool has a block to
   give, stop at the first miss or refusal); blocks [0, lower) are known to
   be in memory. */
static inline void pm_tier_lookup(pm_model *m, const int32_t *tok, int n, uint64_t salt, int lower, int reused,
                                  const kva_cache_stats *b, const kva_cache_stats *a) {
  pm_tier *t = &m->tier;
  int maxb = n > 0 ? (n - 1) / m->bs : 0, r = reused / m->bs, f, j, last = -1, nint = 0;
  unsigned char *fetched = t->fout + t->fcap; /* [fcap] scratch beside the answers */
  uint64_t ph = pm_ph0(salt);
  t->qn = 0;
  memset(fetched, 0, (size_t)t->fcap);
  for (f = 0; f < t->n_fetch; f++) {
    int found = -1;
    for (j = last + 1; j < maxb && found < 0; j++) {
      pm_tier_qkeys(m, salt, tok, j + 1);
      if (!memcmp(t->qkey[j], t->fkey[f], 32)) found = j;
    }
    PM_CHECK(found >= 0,
             "lookup of %d tokens: fetch %d of %d asked for a key that is no later block of the lookup's chain "
             "(after block %d, below block %d = (n_tokens - 1) / block_size)",
             n, f, t->n_fetch, last, maxb);
    if (found < 0) return;
    PM_CHECK(found >= lower / m->bs, "lookup fetched block %d, but memory holds blocks 0..%d (just published, saved "
             "or loaded): memory comes first",
             found, lower / m->bs - 1);
    PM_CHECK(f == t->n_fetch - 1 || t->fout[f] == PM_F_INTACT,
             "lookup went on after fetch %d (block %d) %s: it must stop there", f, found,
             t->fout[f] == PM_F_MISS ? "missed" : "returned a record to refuse");
    if (t->fout[f] == PM_F_INTACT) {
      fetched[found] = 1;
      nint++;
    }
    last = found;
  }
  if (t->n_fetch > 0) {
    PM_CHECK(b->blocks_free + b->blocks_cached > 0, "lookup fetched with no free or cached block in the pool");
    if (t->fout[t->n_fetch - 1] == PM_F_INTACT)
      PM_CHECK(reused >= (last + 1) * m->bs,
               "lookup: block %d came back intact from the store (a record this cache spilled), n_reused %d < %d",
               last, reused, (last + 1) * m->bs);
    else
      PM_CHECK(reused == last * m->bs, "lookup: the fetch of block %d %s, n_reused %d, want %d (it stops there)",
               last, t->fout[t->n_fetch - 1] == PM_F_MISS ? "missed" : "returned a record to refuse", reused,
               last * m->bs);
  }
  /* blocks reused without a fetch came from memory: the shadow must allow it */
  for (j = 0; j < r && j < maxb; j++) {
    int i;
    for (i = 0; i < m->bs; i++) ph = pm_ph_next(ph, tok[j * m->bs + i]);
    if (!fetched[j])
      PM_CHECK(pm_pub_has(m, ph),
               "lookup reused block %d from memory, but it was not published, fetched or loaded since the last "
               "reset, or was forgotten (spilled) since",
               j);
    else
      pm_pub_add(m, ph); /* a fetched block is published as if this cache had published it */
  }
  m->pub_events += nint;
  m->n_tier_tokens += (long)nint * m->bs;
  if (r < maxb && !(t->n_fetch > 0 && last == r))
    PM_CHECK(a->blocks_free + a->blocks_cached == 0,
             "lookup stopped at block %d of %d without asking the tier, with %d free and %d cached blocks", r, maxb,
             a->blocks_free, a->blocks_cached);
  if (nint == 0)
    PM_CHECK(t->n_spill_op == 0, "a lookup that fetched no record spilled %d blocks", t->n_spill_op);
  if (b->blocks_free >= nint)
    PM_CHECK(t->n_spill_op == 0, "lookup fetched %d blocks with %d free, yet recycled (spilled %d)", nint,
             b->blocks_free, t->n_spill_op);
  if (t->n_spill_op == 0)
    PM_CHECK(a->blocks_free == b->blocks_free - nint && a->blocks_used >= b->blocks_used + nint &&
                 a->blocks_used - b->blocks_used - nint == b->blocks_cached - a->blocks_cached,
             "lookup fetching %d blocks (no recycling): used %d->%d cached %d->%d free %d->%d", nint, b->blocks_used,
             a->blocks_used, b->blocks_cached, a->blocks_cached, b->blocks_free, a->blocks_free);
  else
    PM_CHECK(a->blocks_used >= b->blocks_used + nint && a->blocks_used - b->blocks_used <= r,
             "lookup reusing %d blocks (%d fetched): used %d->%d", r, nint, b->blocks_used, a->blocks_used);
}

/* a random store behaviour for the next operation */
static inline void pm_tier_mood(pm_model *m) {
  int r = pm_int(m->src, 0, 99);
  m->tier.fetch_bad_pct = r < 65 ? 0 : r < 90 ? 20 : 70;
  r = pm_int(m->src, 0, 99);
  m->tier.spill_fail_pct = r < 80 ? 0 : r < 95 ? 25 : 100;
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

/* The record size docs/API.md gives, the refusals without a tier, and the
   description rules of a tier (both callbacks or neither; no layer groups,
   no LATENT); then the tier's buffers. */
static inline void pm_tier_init(pm_model *m) {
  pm_tier *t = &m->tier;
  kva_cache_desc d;
  kva_cache *c;
  kva_layer_group grp;
  uint8_t dig[32];
  static const uint8_t abc[32] = {0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40,
                                  0xde, 0x5d, 0xae, 0x22, 0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17,
                                  0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
  int n_saved = -5, outcome = -7;
  unsigned char junk[16];
  size_t want;
  t->on = m->cfg.tier;
  t->type = m->cfg.dtype == KVA_DTYPE_DEFAULT ? KVA_F16 : m->cfg.dtype;
  t->esz = t->type == KVA_F32 ? 4 : 2;
  t->hdr = 128 + (size_t)m->L * (8 + 8 * (size_t)m->G);
  want = t->hdr + 4 * (size_t)m->bs + (size_t)m->L * m->G * m->bs * (m->D + m->DV) * (size_t)t->esz + 8;
  if (!t->on) {
    memset(junk, 0, sizeof junk);
    PM_CHECK(kva_prefix_record_size(m->c) == 0, "kva_prefix_record_size without a tier: %lu, want 0",
             (unsigned long)kva_prefix_record_size(m->c));
    PM_CHECK(kva_prefix_save(m->c, &n_saved) == KVA_ERR_UNSUPPORTED, "kva_prefix_save without a tier");
    PM_CHECK(kva_prefix_load(m->c, junk, sizeof junk, &outcome) == KVA_ERR_UNSUPPORTED,
             "kva_prefix_load without a tier");
    return;
  }
  t->rsize = want;
  PM_CHECK(kva_prefix_record_size(m->c) == want, "kva_prefix_record_size %lu, docs/API.md \"Records\" gives %lu",
           (unsigned long)kva_prefix_record_size(m->c), (unsigned long)want);
  kva_sha256("abc", 3, dig);
  PM_CHECK(!memcmp(dig, abc, 32), "kva_sha256(\"abc\") is not FIPS 180-4's");
  t->fcap = (m->cap + 2 * m->bs) / m->bs + 2;
  t->fkey = (uint8_t(*)[32])pm_zalloc(32 * (size_t)t->fcap);
  t->qkey = (uint8_t(*)[32])pm_zalloc(32 * (size_t)t->fcap);
  t->fout = (unsigned char *)pm_zalloc(2 * (size_t)t->fcap);
  t->phs = (uint64_t *)pm_zalloc(sizeof(uint64_t) * (size_t)m->bs);
  t->buf = (unsigned char *)pm_zalloc(t->rsize + 64);
  t->msg = (unsigned char *)pm_zalloc(55 + 4 * (size_t)m->bs);
  t->max_held = 2 * m->nb + 16;
  t->held = (int *)pm_zalloc(sizeof(int) * (size_t)t->max_held);
  d = m->desc;
  d.fetch = NULL;
  c = NULL;
  PM_CHECK(kva_cache_create(&d, &c) == KVA_ERR_ARG, "a description with spill and no fetch: not KVA_ERR_ARG");
  kva_cache_destroy(c);
  d = m->desc;
  d.spill = NULL;
  c = NULL;
  PM_CHECK(kva_cache_create(&d, &c) == KVA_ERR_ARG, "a description with fetch and no spill: not KVA_ERR_ARG");
  kva_cache_destroy(c);
  /* each made without a tier first, so that the refusal is the tier's */
  memset(&grp, 0, sizeof grp);
  grp.kind = KVA_SPAN_WINDOW;
  grp.window = 2 * m->bs;
  d = m->desc;
  d.demote_dtype = KVA_DTYPE_DEFAULT;
  d.demote_blocks = 0;
  d.spill = NULL;
  d.fetch = NULL;
  d.n_groups = 1;
  d.groups = &grp;
  c = NULL;
  if (kva_cache_create(&d, &c) == KVA_OK) {
    kva_cache_destroy(c);
    d.spill = m->desc.spill;
    d.fetch = m->desc.fetch;
    c = NULL;
    PM_CHECK(kva_cache_create(&d, &c) == KVA_ERR_UNSUPPORTED, "a tier with layer groups: not KVA_ERR_UNSUPPORTED");
    kva_cache_destroy(c);
  }
  d.n_groups = 0;
  d.groups = NULL;
  d.spill = NULL;
  d.fetch = NULL;
  d.kind = KVA_CACHE_LATENT;
  d.v_dim = 0;
  c = NULL;
  if (kva_cache_create(&d, &c) == KVA_OK) {
    kva_cache_destroy(c);
    d.spill = m->desc.spill;
    d.fetch = m->desc.fetch;
    c = NULL;
    PM_CHECK(kva_cache_create(&d, &c) == KVA_ERR_UNSUPPORTED, "a tier on a LATENT cache: not KVA_ERR_UNSUPPORTED");
    kva_cache_destroy(c);
  }
}

static inline void pm_tier_free(pm_model *m) {
  pm_tier *t = &m->tier;
  int i;
  for (i = 0; i < t->n; i++) {
    free(t->e[i].tok);
    free(t->e[i].rec);
  }
  free(t->e);
  free(t->idx);
  free(t->held);
  free(t->spilled);
  free(t->fkey);
  free(t->qkey);
  free(t->fout);
  free(t->phs);
  free(t->buf);
  free(t->msg);
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
  if (cfg->tier) {
    m->desc.spill = pm_tier_spill;
    m->desc.fetch = pm_tier_fetch;
    m->desc.tier_user = m;
  }
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
  pm_tier_init(m);
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
  pm_tier_free(m);
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
  if (m->tier.on) { /* what the store saw since the cache was made */
    const pm_tier *t = &m->tier;
    PM_CHECK(st.tier_spills == t->spills && st.tier_spill_errors == t->spill_errors &&
                 st.tier_fetch_hits == t->fetch_hits && st.tier_fetch_misses == t->fetch_misses &&
                 st.tier_fetch_refused == t->fetch_refused && st.tier_loads == t->loads,
             "stats tier spills %ld errors %ld, fetch hits %ld misses %ld refused %ld, loads %ld; the store saw "
             "%ld %ld, %ld %ld %ld, %ld",
             st.tier_spills, st.tier_spill_errors, st.tier_fetch_hits, st.tier_fetch_misses, st.tier_fetch_refused,
             st.tier_loads, t->spills, t->spill_errors, t->fetch_hits, t->fetch_misses, t->fetch_refused, t->loads);
    PM_CHECK(st.prefix_forgotten == t->forgets,
             "prefix_forgotten %ld, but %ld blocks were spilled outside kva_prefix_save (every forgotten block goes "
             "to the tier)",
             st.prefix_forgotten, t->forgets);
  } else
    PM_CHECK(!st.tier_spills && !st.tier_spill_errors && !st.tier_fetch_hits && !st.tier_fetch_misses &&
                 !st.tier_fetch_refused && !st.tier_loads,
             "a cache without a tier counts tier traffic");
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
  pm_tier_begin(m, 1, 0); /* taking blocks may recycle (and age out) published ones */
  st = kva_seq_append(m->c, q->id, n);
  pm_tier_end(m);
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
  pm_tier_begin(m, 1, m->n_live < m->max_seqs);
  st = kva_seq_new_prefix(m->c, tok, n, salt, &id, &reused);
  pm_tier_end(m);
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
  if (!m->tier.on)
    PM_CHECK(reused <= ub * m->bs,
             "n_reused %d but only %d tokens of that (salt, tokens) prefix were ever published (since the last reset)",
             reused, ub * m->bs);
  PM_CHECK(reused >= lower,
           "n_reused %d, but memory holds %d tokens of it (just published, saved or loaded; n_tokens %d)", reused,
           lower, n);
  if (reused < 0 || reused > maxb * m->bs || reused % m->bs) reused = 0; /* keep the model sane */
  if (m->tier.on)
    pm_tier_lookup(m, tok, n, salt, lower, reused, &b, &a);
  else
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
  pm_tier_publish(m, q, nfull);
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
  PM_CHECK(a.prefix_forgotten == b.prefix_forgotten,
           "kva_cache_reset_prefix counted %ld blocks in prefix_forgotten (docs/API.md \"Statistics\": only "
           "prefix_max_age and recycling count)",
           a.prefix_forgotten - b.prefix_forgotten);
  m->tier.forgets += a.prefix_forgotten - b.prefix_forgotten; /* reported above: the tier's own count stays exact */
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
  pm_tier_begin(m, 1, 0); /* copies of shared blocks may recycle published ones */
  st = kva_seq_compress(m->c, q->id, budget);
  pm_tier_end(m);
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

/* ---------------------------------------------------------------- tier ops */
/* look up the prefix of entry x, plus 1 to bs tokens: with in_memory, memory
   is known to hold the whole chain (it may not fetch any of it) */
static inline pm_seq *pm_tier_probe(pm_model *m, int x, int in_memory) {
  const pm_tkey *e = &m->tier.e[x];
  int depth = e->depth, n = (depth + 1) * m->bs, i, extra = pm_int(m->src, 1, m->bs);
  pm_tier_tokens(m, x, m->tbuf);
  for (i = 0; i < extra; i++) m->tbuf[n + i] = (int32_t)pm_int(m->src, 0, m->cfg.vocab - 1);
  return pm_do_new_prefix(m, m->tbuf, n + extra, e->salt, in_memory ? n : 0);
}

/* kva_prefix_save on a tiered cache: every published block to spill, parents
   first, nothing forgotten. Returns the number of spill calls. */
static inline int pm_do_save(pm_model *m) {
  pm_tier *t = &m->tier;
  kva_cache_stats b, a;
  kva_status st;
  int n_saved = -5;
  pm_stats(m, &b);
  pm_tier_begin(m, 1, 0);
  t->in_save = 1;
  st = kva_prefix_save(m->c, &n_saved);
  t->in_save = 0;
  pm_tier_end(m);
  pm_stats(m, &a);
  m->n_saves++;
  PM_CHECK(st == KVA_OK, "kva_prefix_save = %s", kva_status_str(st));
  PM_CHECK(n_saved == t->n_spill_ok_op, "kva_prefix_save: n_saved %d, spill accepted %d of %d", n_saved,
           t->n_spill_ok_op, t->n_spill_op);
  PM_CHECK(a.blocks_used == b.blocks_used && a.blocks_cached == b.blocks_cached && a.blocks_free == b.blocks_free &&
               a.prefix_forgotten == b.prefix_forgotten,
           "kva_prefix_save moved or forgot blocks (used %d->%d cached %d->%d free %d->%d forgotten %ld->%ld)",
           b.blocks_used, a.blocks_used, b.blocks_cached, a.blocks_cached, b.blocks_free, a.blocks_free,
           b.prefix_forgotten, a.prefix_forgotten);
  PM_CHECK(t->n_spill_op >= b.blocks_cached && t->n_spill_op <= b.blocks_cached + b.blocks_used,
           "kva_prefix_save spilled %d blocks; %d cached (all published) and %d used", t->n_spill_op, b.blocks_cached,
           b.blocks_used);
  return t->n_spill_op;
}

static inline void pm_op_save(pm_model *m) {
  pm_tier *t = &m->tier;
  kva_cache_stats b, a;
  int n_saved = -5, k;
  pm_stats(m, &b);
  PM_CHECK(kva_prefix_save(NULL, &n_saved) == KVA_ERR_ARG && kva_prefix_save(m->c, NULL) == KVA_ERR_ARG,
           "kva_prefix_save with a NULL argument: not KVA_ERR_ARG");
  pm_stats(m, &a);
  PM_CHECK(pm_stats_same(&a, &b, 0), "refused kva_prefix_save changed the stats");
  if (pm_do_save(m) > 0 && m->n_live < m->max_seqs && pm_chance(m->src, 60)) {
    k = t->spilled[pm_int(m->src, 0, t->n_spill_op - 1)];
    if (k >= 0) pm_tier_probe(m, k, 1); /* it was in memory a moment ago, and still is */
  }
}

/* a record of the store as kva_prefix_load gets it: intact, or (corrupt)
   with a flipped bit, cut, longer than the record, or forged (a field
   changed, the checksum right: a changed key, parent key, salt or token id
   leaves the key no kva_prefix_key of the rest). Returns its size. */
static inline size_t pm_tier_loadbuf(pm_model *m, int x, int corrupt) {
  pm_tier *t = &m->tier;
  memcpy(t->buf, t->e[x].rec, t->rsize);
  memset(t->buf + t->rsize, 0, 64);
  if (!corrupt) return t->rsize;
  switch (pm_int(m->src, 0, 3)) {
  case 0: t->buf[pm_int(m->src, 0, (int)t->rsize - 1)] ^= (unsigned char)(1u << pm_int(m->src, 0, 7)); return t->rsize;
  case 1: return (size_t)pm_int(m->src, 0, (int)t->rsize - 1);
  case 2: return t->rsize + (size_t)pm_int(m->src, 1, 64);
  default: pm_tier_forge(m, t->buf); return t->rsize;
  }
}

/* kva_prefix_load of a random stored record into the running cache: the
   shadow knows memory only as an upper bound, so the outcome is checked
   against what that bound allows */
static inline void pm_op_load(pm_model *m) {
  pm_tier *t = &m->tier;
  kva_cache_stats b, a;
  kva_status st;
  int x, corrupt, outcome = -7, mem_key, mem_parent;
  size_t size;
  if (t->n_held == 0) return;
  x = t->held[pm_int(m->src, 0, t->n_held - 1)];
  corrupt = pm_chance(m->src, 20);
  size = pm_tier_loadbuf(m, x, corrupt);
  pm_stats(m, &b);
  if (pm_chance(m->src, 10))
    PM_CHECK(kva_prefix_load(NULL, t->buf, size, &outcome) == KVA_ERR_ARG &&
                 kva_prefix_load(m->c, NULL, size, &outcome) == KVA_ERR_ARG &&
                 kva_prefix_load(m->c, t->buf, size, NULL) == KVA_ERR_ARG,
             "kva_prefix_load with a NULL argument: not KVA_ERR_ARG");
  st = kva_prefix_load(m->c, t->buf, size, &outcome);
  pm_stats(m, &a);
  mem_key = pm_pub_has(m, t->e[x].ph);
  mem_parent = t->e[x].up < 0 || pm_pub_has(m, t->e[t->e[x].up].ph);
  if (corrupt || st != KVA_OK) {
    if (corrupt) m->n_load_refused++;
    PM_CHECK(corrupt ? st == KVA_ERR_STREAM || (st == KVA_ERR_FULL && b.blocks_free == 0)
                     : st == KVA_ERR_FULL && b.blocks_free == 0,
             "kva_prefix_load of %s record (%lu bytes, depth %d), %d free blocks = %s",
             corrupt ? "a corrupted" : "an intact", (unsigned long)size, t->e[x].depth, b.blocks_free,
             kva_status_str(st));
    PM_CHECK(pm_stats_same(&a, &b, 0), "refused kva_prefix_load changed the stats");
    return;
  }
  PM_CHECK(outcome == KVA_PREFIX_LOADED || outcome == KVA_PREFIX_IN_MEMORY || outcome == KVA_PREFIX_NO_PARENT,
           "kva_prefix_load: outcome %d", outcome);
  PM_CHECK(outcome != KVA_PREFIX_IN_MEMORY || mem_key,
           "kva_prefix_load: IN_MEMORY for a block (depth %d) memory cannot hold", t->e[x].depth);
  PM_CHECK(mem_parent ? outcome != KVA_PREFIX_NO_PARENT || t->e[x].up >= 0 : outcome == KVA_PREFIX_NO_PARENT,
           "kva_prefix_load of a block (depth %d) whose parent memory %s: outcome %d", t->e[x].depth,
           mem_parent ? "may hold" : "cannot hold", outcome);
  if (outcome == KVA_PREFIX_LOADED) {
    PM_CHECK(b.blocks_free > 0 && a.blocks_free == b.blocks_free - 1 && a.blocks_cached == b.blocks_cached + 1 &&
                 a.blocks_used == b.blocks_used && a.prefix_forgotten == b.prefix_forgotten,
             "kva_prefix_load LOADED: used %d->%d cached %d->%d free %d->%d forgotten %ld->%ld (a free block, cached)",
             b.blocks_used, a.blocks_used, b.blocks_cached, a.blocks_cached, b.blocks_free, a.blocks_free,
             b.prefix_forgotten, a.prefix_forgotten);
    t->loads++;
    m->n_loaded++;
    pm_pub_add(m, t->e[x].ph);
    m->pub_events++;
  } else
    PM_CHECK(pm_stats_same(&a, &b, 0), "kva_prefix_load with outcome %d changed the stats", outcome);
  if (outcome != KVA_PREFIX_NO_PARENT && m->n_live < m->max_seqs && pm_chance(m->src, 50))
    pm_tier_probe(m, x, 1);
}

/* a lookup of a stored prefix (deep chains, fetches) */
static inline void pm_op_tier_lookup(pm_model *m) {
  pm_tier *t = &m->tier;
  pm_seq *q;
  if (t->n_held == 0) return;
  q = pm_tier_probe(m, t->held[pm_int(m->src, 0, t->n_held - 1)], 0);
  if (q && pm_chance(m->src, 50)) pm_op_free_seq(m, q);
}

/* another cache of the same record size but another shape or storage type
   over the same store: every record must be refused, by load and by fetch */
static inline void pm_tier_twin(pm_model *m) {
  pm_tier *t = &m->tier;
  kva_cache_desc d = m->desc;
  kva_cache *c = NULL;
  kva_cache_stats st;
  int x, outcome = -7, id = -1, reused = -1, n;
  if (t->n_held == 0) return;
  if (t->type == KVA_F32) { /* F16 rows of twice the dims: the same bytes */
    d.dtype = KVA_F16;
    d.head_dim = 2 * m->D;
    d.v_dim = 2 * m->DV;
  } else
    d.dtype = t->type == KVA_F16 ? KVA_BF16 : KVA_F16;
  if (kva_cache_create(&d, &c) != KVA_OK) return;
  m->n_twins++;
  PM_CHECK(kva_prefix_record_size(c) == t->rsize, "twin cache: record size %lu, want %lu",
           (unsigned long)kva_prefix_record_size(c), (unsigned long)t->rsize);
  x = t->held[pm_int(m->src, 0, t->n_held - 1)];
  pm_tier_begin(m, 0, 0);
  PM_CHECK(kva_prefix_load(c, t->e[x].rec, t->rsize, &outcome) == KVA_ERR_STREAM,
           "kva_prefix_load of another shape's record (depth %d): not KVA_ERR_STREAM", t->e[x].depth);
  pm_tier_end(m);
  n = (t->e[x].depth + 1) * m->bs;
  pm_tier_tokens(m, x, m->tbuf);
  m->tbuf[n] = 0;
  t->twin = 1;
  t->tw_fetches = t->tw_refused = 0;
  pm_tier_begin(m, 0, 1);
  PM_CHECK(kva_seq_new_prefix(c, m->tbuf, n + 1, t->e[x].salt, &id, &reused) == KVA_OK && reused == 0,
           "twin cache: lookup of a stored prefix reused %d tokens of another shape's records", reused);
  pm_tier_end(m);
  t->twin = 0;
  kva_cache_get_stats(c, &st);
  PM_CHECK(t->tw_fetches == 1 && st.tier_fetch_refused == t->tw_refused &&
               st.tier_fetch_misses == t->tw_fetches - t->tw_refused && st.tier_fetch_hits == 0 && st.tier_loads == 0,
           "twin cache: %ld fetches (%ld answered), stats hits %ld misses %ld refused %ld loads %ld", t->tw_fetches,
           t->tw_refused, st.tier_fetch_hits, st.tier_fetch_misses, st.tier_fetch_refused, st.tier_loads);
  pm_tier_begin(m, 0, 0);
  kva_cache_destroy(c);
  pm_tier_end(m);
}

/* A process restart: (maybe kva_prefix_save, then) the cache is destroyed and
   made again over the same store, which a loader reads back in random order,
   in passes until one takes nothing in. Memory then holds exactly the loaded
   records, so every outcome is exact; lookups of loaded prefixes reuse them
   without the store. */
static inline void pm_op_restart(pm_model *m) {
  pm_tier *t = &m->tier;
  kva_cache_stats b, a;
  kva_status st;
  int i, k, progress, full = 0, nloaded = 0, n_order, *order;
  if (pm_chance(m->src, 50)) pm_do_save(m);
  pm_tier_begin(m, 0, 0);
  kva_cache_destroy(m->c);
  m->c = NULL;
  st = kva_cache_create(&m->desc, &m->c);
  pm_tier_end(m);
  PM_CHECK(st == KVA_OK, "restart: kva_cache_create = %s", kva_status_str(st));
  if (st != KVA_OK) abort(); /* nothing left to test */
  m->n_restarts++;
  for (i = 0; i < m->max_seqs; i++) m->s[i].live = 0;
  m->n_live = m->n_ids = m->n_dead = 0; /* a new cache may hand out the old ids */
  m->queries = m->hits = m->cow = m->failed = 0;
  m->ever_shared = 0;
  pm_pub_clear(m);
  t->spills = t->spill_errors = t->fetch_hits = t->fetch_misses = t->fetch_refused = t->loads = t->forgets = 0;
  PM_CHECK(kva_prefix_record_size(m->c) == t->rsize, "restart: record size changed");
  if (pm_chance(m->src, 25)) pm_tier_twin(m);
  n_order = t->n_held;
  order = (int *)pm_zalloc(sizeof(int) * (size_t)(n_order + 1));
  memcpy(order, t->held, sizeof(int) * (size_t)n_order);
  for (i = n_order - 1; i > 0; i--) {
    int j = pm_int(m->src, 0, i), tmp = order[i];
    order[i] = order[j];
    order[j] = tmp;
  }
  for (i = 0; i < t->n; i++) t->e[i].loaded = 0;
  do {
    progress = 0;
    for (k = 0; k < n_order && !full; k++) {
      pm_tkey *e = &t->e[order[k]];
      int corrupt = pm_chance(m->src, 6), outcome = -7, want;
      size_t size;
      if (e->loaded && !pm_chance(m->src, 5)) continue;
      size = pm_tier_loadbuf(m, order[k], corrupt);
      pm_stats(m, &b);
      pm_tier_begin(m, 0, 0);
      st = kva_prefix_load(m->c, t->buf, size, &outcome);
      pm_tier_end(m);
      pm_stats(m, &a);
      want = e->loaded ? KVA_PREFIX_IN_MEMORY
                       : e->up >= 0 && !t->e[e->up].loaded ? KVA_PREFIX_NO_PARENT : KVA_PREFIX_LOADED;
      if (corrupt) {
        m->n_load_refused++;
        PM_CHECK(st == KVA_ERR_STREAM || (st == KVA_ERR_FULL && b.blocks_free == 0),
                 "restart: kva_prefix_load of a corrupted record (%lu bytes) = %s", (unsigned long)size,
                 kva_status_str(st));
      } else if (b.blocks_free == 0 && (want == KVA_PREFIX_LOADED || st == KVA_ERR_FULL)) {
        PM_CHECK(st == KVA_ERR_FULL, "restart: kva_prefix_load with no free block (expected outcome %d) = %s, %d",
                 want, kva_status_str(st), outcome);
      } else {
        PM_CHECK(st == KVA_OK && outcome == want,
                 "restart: kva_prefix_load of a block (depth %d; %s) = %s, outcome %d, want %d", e->depth,
                 e->loaded ? "loaded already" : e->up >= 0 && !t->e[e->up].loaded ? "its parent not loaded"
                                                                                   : "its parent loaded",
                 kva_status_str(st), outcome, want);
      }
      if (st == KVA_OK && outcome == KVA_PREFIX_LOADED) {
        PM_CHECK(a.blocks_free == b.blocks_free - 1 && a.blocks_cached == b.blocks_cached + 1 &&
                     a.tier_loads == b.tier_loads + 1,
                 "restart: LOADED moved free %d->%d cached %d->%d, tier_loads %ld->%ld", b.blocks_free, a.blocks_free,
                 b.blocks_cached, a.blocks_cached, b.tier_loads, a.tier_loads);
        e->loaded = 1;
        nloaded++;
        progress++;
        t->loads++;
        m->n_loaded++;
        pm_pub_add(m, e->ph);
        m->pub_events++;
      } else
        PM_CHECK(pm_stats_same(&a, &b, 0), "restart: kva_prefix_load (%s, outcome %d) changed the stats",
                 kva_status_str(st), outcome);
      if (st == KVA_ERR_FULL) full = 1; /* the rest stay in the store for fetch */
    }
  } while (progress && !full);
  pm_stats(m, &a);
  PM_CHECK(a.blocks_cached == nloaded && a.blocks_free == m->nb - nloaded && a.tier_loads == nloaded,
           "restart: %d records loaded: cached %d free %d tier_loads %ld", nloaded, a.blocks_cached, a.blocks_free,
           a.tier_loads);
  /* lookups of loaded prefixes: all from memory, the store never asked */
  for (i = 0; i < 3 && nloaded > 0 && m->n_live < m->max_seqs; i++) {
    int x = -1;
    for (k = 0; k < 4 && x < 0; k++) {
      x = order[pm_int(m->src, 0, n_order - 1)];
      if (!t->e[x].loaded) x = -1;
    }
    if (x >= 0) pm_tier_probe(m, x, 1);
  }
  free(order);
}

/* one of the tier's operations */
static inline void pm_op_tier(pm_model *m, int r) {
  if (r < 3) m->op = "load", pm_op_load(m);
  else if (r < 5) m->op = "save", pm_op_save(m);
  else if (r < 7) m->op = "tier_lookup", pm_op_tier_lookup(m);
  else if (pm_chance(m->src, 35)) m->op = "restart", pm_op_restart(m);
  else m->op = "tier_lookup", pm_op_tier_lookup(m);
}

/* one random operation, then every check */
static inline void pm_step(pm_model *m) {
  int evicts = m->cfg.evict_support != KVA_EVICT_SUPPORT_NONE, hi = evicts ? 123 : 109;
  int r = pm_int(m->src, 0, hi + (m->tier.on ? 8 : 0));
  if (m->n_live == m->max_seqs && pm_chance(m->src, 30)) r = 66; /* make room now and then */
  if (m->tier.on) pm_tier_mood(m);
  if (r > hi) pm_op_tier(m, r - hi - 1);
  else if (r < 4) m->op = "new", pm_op_new(m);
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
