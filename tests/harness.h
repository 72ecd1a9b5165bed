/* harness.h - a tiny test harness for the kvattn test suite.
 *
 * C99 and C++11 clean (-Wall -Wextra -Werror -pedantic): no VLAs, casts on
 * every allocation, everything `static inline` so unused helpers do not warn.
 *
 * Counters live in test_main.c.  A "test" is whatever a kt_begin() call names;
 * failures print at most KT_MAX_FAIL_PRINTS lines per test, passes print
 * nothing.  kt_quick (env KVA_TEST_QUICK=1, for qemu) asks every section to
 * scale its iteration counts down about 10x: use kt_iters(). */
#ifndef KVATTN_TEST_HARNESS_H
#define KVATTN_TEST_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvattn.h" /* after the test file's own configuration of it */

extern int kt_pass, kt_fail, kt_quick;
extern int kt_fail_prints;        /* failures printed in the current test */
extern const char *kt_test_name;  /* the current test, for failure lines */

#define KT_MAX_FAIL_PRINTS 20

static inline void kt_begin(const char *name) {
  kt_test_name = name;
  kt_fail_prints = 0;
}

/* Counts a failure; returns 1 when its message should be printed (the
   "FAIL file:line [test]: " prefix is already out). */
static inline int kt_fail_here(const char *file, int line) {
  kt_fail++;
  if (kt_fail_prints < KT_MAX_FAIL_PRINTS) {
    kt_fail_prints++;
    printf("FAIL %s:%d [%s]: ", file, line, kt_test_name ? kt_test_name : "?");
    return 1;
  }
  if (kt_fail_prints == KT_MAX_FAIL_PRINTS) {
    kt_fail_prints++;
    printf("FAIL %s:%d [%s]: (further failures of this test not printed)\n", file,
           line, kt_test_name ? kt_test_name : "?");
  }
  return 0;
}

/* KT_CHECK(cond, "printf format", args...) */
#define KT_CHECK(cond, ...)                              \
  do {                                                   \
    if (cond) {                                          \
      kt_pass++;                                         \
    } else if (kt_fail_here(__FILE__, __LINE__)) {       \
      printf(__VA_ARGS__);                               \
      printf("\n");                                      \
      fflush(stdout);                                    \
    }                                                    \
  } while (0)

/* |a - b| <= tol; NaN never passes. */
#define KT_NEAR(a, b, tol)                                                     \
  KT_CHECK(fabs((double)(a) - (double)(b)) <= (double)(tol),                   \
           "%s = %.9g vs %s = %.9g (|diff| %.3g > tol %.3g)", #a, (double)(a), \
           #b, (double)(b), fabs((double)(a) - (double)(b)), (double)(tol))

/* Status equality with readable names. */
#define KT_STATUS(got, want)                                              \
  do {                                                                    \
    int kt_g_ = (int)(got), kt_w_ = (int)(want);                          \
    KT_CHECK(kt_g_ == kt_w_, "%s returned %d, expected %d", #got, kt_g_, \
             kt_w_);                                                      \
  } while (0)

/* ---- iteration scaling for emulated runs ---- */
static inline int kt_iters(int n) {
  if (!kt_quick) return n;
  n = (n + 9) / 10;
  return n < 1 ? 1 : n;
}

/* ---- memory ---- */
static inline void *kt_xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "kvattn tests: out of memory (%lu bytes)\n", (unsigned long)n);
    exit(2);
  }
  return p;
}
#define KT_ALLOC(type, count) ((type *)kt_xmalloc(sizeof(type) * (size_t)(count)))

/* ---- deterministic RNG: splitmix64 ---- */
typedef struct {
  uint64_t s;
} kt_rng;

static inline void kt_seed(kt_rng *r, uint64_t seed) { r->s = seed ^ 0x5DEECE66DULL; }

static inline uint64_t kt_next(kt_rng *r) {
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

static inline uint32_t kt_u32(kt_rng *r) { return (uint32_t)(kt_next(r) >> 32); }

/* uniform in [0, 1) */
static inline double kt_unit(kt_rng *r) {
  return (double)(kt_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* uniform float in [lo, hi) (up to rounding) */
static inline float kt_uniform(kt_rng *r, float lo, float hi) {
  return (float)((double)lo + ((double)hi - (double)lo) * kt_unit(r));
}

/* uniform int in [lo, hi], inclusive */
static inline int kt_int(kt_rng *r, int lo, int hi) {
  if (hi <= lo) return lo;
  return lo + (int)(kt_next(r) % (uint64_t)((int64_t)hi - lo + 1));
}

/* one of n ints */
static inline int kt_pick(kt_rng *r, const int *vals, int n) { return vals[kt_int(r, 0, n - 1)]; }

static inline void kt_fill(kt_rng *r, float *x, size_t n, float lo, float hi) {
  size_t i;
  for (i = 0; i < n; i++) x[i] = kt_uniform(r, lo, hi);
}

/* ---- float bits ---- */
static inline uint32_t kt_f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static inline float kt_u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* bitwise equality of float arrays (so NaN payloads and -0 count) */
static inline int kt_same_bits(const float *a, const float *b, size_t n) {
  return memcmp(a, b, n * sizeof(float)) == 0;
}

/* A recognisable sentinel for "unchanged on error" checks. */
#define KT_SENTINEL (-12345.678f)
static inline void kt_fill_sentinel(float *x, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) x[i] = KT_SENTINEL;
}
static inline int kt_all_sentinel(const float *x, size_t n) {
  size_t i;
  for (i = 0; i < n; i++)
    if (kt_f2u(x[i]) != kt_f2u(KT_SENTINEL)) return 0;
  return 1;
}

/* ---- library helpers ---- */
/* H query heads over G KV heads of D (V: Dv, 0 = D), one thread, the rest default */
static inline void kt_attn_init(kva_attn *a, int H, int G, int D, int Dv) {
  memset(a, 0, sizeof *a);
  a->n_heads = H;
  a->n_kv_heads = G;
  a->head_dim = D;
  a->v_dim = Dv;
  a->n_threads = 1;
}

/* A cache of L layers, G KV heads of D, blocks of bs tokens, n_blocks of them, max_seqs
   sequences, storage t; the rest default */
static inline void kt_desc_init(kva_cache_desc *d, int L, int G, int D, int bs, int n_blocks, int max_seqs,
                                kva_dtype t) {
  memset(d, 0, sizeof *d);
  d->n_layers = L;
  d->n_kv_heads = G;
  d->head_dim = D;
  d->block_size = bs;
  d->n_blocks = n_blocks;
  d->max_seqs = max_seqs;
  d->dtype = d->v_dtype = t;
}

/* Every counter of two caches' stats equal (appends_failed too unless
   skip_failed), for "a failed call changed nothing" and twin comparisons. */
static inline int kt_stats_equal(const kva_cache_stats *a, const kva_cache_stats *b, int skip_failed) {
  return a->n_blocks == b->n_blocks && a->blocks_used == b->blocks_used && a->blocks_cached == b->blocks_cached &&
         a->blocks_free == b->blocks_free && a->n_seqs == b->n_seqs && a->block_bytes == b->block_bytes &&
         a->bytes_total == b->bytes_total && a->bytes_meta == b->bytes_meta &&
         a->bytes_footprint == b->bytes_footprint && a->tokens_held == b->tokens_held &&
         a->prefix_queries == b->prefix_queries && a->prefix_hits == b->prefix_hits &&
         a->token_slots == b->token_slots && a->cow_copies == b->cow_copies &&
         (skip_failed || a->appends_failed == b->appends_failed) && a->prefix_forgotten == b->prefix_forgotten;
}

/* An allocator for kva_cache_desc.alloc_fn / free_fn that counts what it
   hands out and can refuse (fail = 1), 64-byte or any alignment. */
typedef struct {
  int fail;
  long takes, gives, refused;
} kt_heap;
static inline void *kt_heap_alloc(size_t size, size_t align, void *user) {
  kt_heap *h = (kt_heap *)user;
  unsigned char *raw, *al;
  if (h->fail) {
    h->refused++;
    return NULL;
  }
  raw = KT_ALLOC(unsigned char, size + align + sizeof(void *));
  al = raw + sizeof(void *);
  al += (align - (uintptr_t)al % align) % align;
  ((void **)al)[-1] = raw;
  h->takes++;
  return al;
}
static inline void kt_heap_free(void *p, size_t size, void *user) {
  kt_heap *h = (kt_heap *)user;
  (void)size;
  if (p) free(((void **)p)[-1]), h->gives++;
}

#endif /* KVATTN_TEST_HARNESS_H */
