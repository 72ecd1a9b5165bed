/* test_errors.c - refusals say which rule was broken.
 *
 * A cache's on_error hears every refusal of a call on that cache exactly
 * once, with the status the call returns, and never a success; the rules
 * an engine author meets most (attend after a fork before the step is
 * appended, before it is stored, head counts that differ from the cache's)
 * have their own status or sentence; kva_attn_check names the broken
 * field of a kva_attn; a refused description reports through its own
 * on_error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvattn.h"
#include "harness.h"

typedef struct {
  int n;
  kva_status status;
  const char *function, *why;
  int empty; /* a report with an empty or NULL function or reason */
} te_log;

static void te_record(void *user, kva_status status, const char *function, const char *why) {
  te_log *log = (te_log *)user;
  log->n++;
  log->status = status;
  log->function = function;
  log->why = why;
  if (!function || !*function || !why || !*why) log->empty++;
}

static int te_has(const char *s, const char *part) { return s && strstr(s, part) != NULL; }

/* One call's status against what on_error heard for it. */
#define TE_CALL(log, call, want, part)                                                                   \
  do {                                                                                                   \
    int te_n0_ = (log).n;                                                                                \
    kva_status te_st_ = (call);                                                                          \
    KT_CHECK(te_st_ == (want), "%s returned %s, expected %s", #call, kva_status_str(te_st_),           \
             kva_status_str(want));                                                                      \
    KT_CHECK((log).n == te_n0_ + 1 && (log).status == te_st_, "%s: %d reports (status %d) for one refusal", \
             #call, (log).n - te_n0_, (int)(log).status);                                               \
    KT_CHECK(te_has((log).why, (part)), "%s: reason \"%s\" does not mention \"%s\"", #call,            \
             (log).why ? (log).why : "(none)", (part));                                                 \
  } while (0)

static kva_cache *te_cache(te_log *log, int n_blocks, kva_dtype t) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  kt_desc_init(&d, 2, 2, 8, 4, n_blocks, 6, t);
  d.user = log;
  d.on_error = te_record;
  KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
  return c;
}

static void te_named_rules(void) {
  te_log log;
  kva_cache *c;
  kva_attn a;
  float k[2 * 8 * 8], v[2 * 8 * 8], q[4 * 8 * 8], o[4 * 8 * 8];
  int s = -1, f = -1, i;
  kt_begin("errors: the rules an engine author meets name themselves");
  memset(&log, 0, sizeof log);
  for (i = 0; i < (int)(sizeof k / sizeof k[0]); i++) k[i] = v[i] = 0.01f * (float)(i % 13);
  for (i = 0; i < (int)(sizeof q / sizeof q[0]); i++) q[i] = 0.02f * (float)(i % 7);
  c = te_cache(&log, 16, KVA_F16);
  if (!c) return;
  kt_attn_init(&a, 4, 2, 8, 0);
  KT_STATUS(kva_seq_new(c, &s), KVA_OK);
  KT_STATUS(kva_seq_append(c, s, 3), KVA_OK);
  /* attend before the step is stored */
  TE_CALL(log, kva_attend_cache(c, s, 0, &a, q, 3, o), KVA_ERR_NOT_STORED, "kva_store");
  KT_STATUS(kva_store(c, s, 0, k, v, 3), KVA_OK);
  KT_STATUS(kva_store(c, s, 1, k, v, 3), KVA_OK);
  KT_STATUS(kva_attend_cache(c, s, 0, &a, q, 3, o), KVA_OK);
  /* right after a fork the child has no step: append first */
  KT_STATUS(kva_seq_fork(c, s, &f), KVA_OK);
  TE_CALL(log, kva_attend_cache(c, f, 0, &a, q, 1, o), KVA_ERR_STEP, "last_append");
  TE_CALL(log, kva_store(c, f, 0, k, v, 1), KVA_ERR_STEP, "last_append");
  KT_CHECK(strstr(kva_status_str(KVA_ERR_STEP), "append") != NULL, "KVA_ERR_STEP's name: %s",
           kva_status_str(KVA_ERR_STEP));
  /* head counts and sizes that are not the cache's */
  kt_attn_init(&a, 4, 1, 8, 0);
  TE_CALL(log, kva_attend_cache(c, s, 0, &a, q, 1, o), KVA_ERR_ARG, "n_kv_heads");
  kt_attn_init(&a, 4, 2, 6, 0);
  TE_CALL(log, kva_attend_cache(c, s, 0, &a, q, 1, o), KVA_ERR_ARG, "head_dim");
  kt_attn_init(&a, 3, 2, 8, 0);
  TE_CALL(log, kva_attend_cache(c, s, 0, &a, q, 1, o), KVA_ERR_ARG, "a->n_heads % a->n_kv_heads");
  kt_attn_init(&a, 4, 2, 8, 0);
  TE_CALL(log, kva_attend_cache(c, s, 0, &a, NULL, 1, o), KVA_ERR_ARG, "!q");
  TE_CALL(log, kva_attend_cache(c, s, 5, &a, q, 1, o), KVA_ERR_ARG, "layer");
  TE_CALL(log, kva_attend_cache(c, 99, 0, &a, q, 1, o), KVA_ERR_SEQ, "sequence");
  TE_CALL(log, kva_seq_append(c, s, -1), KVA_ERR_ARG, "n_tokens");
  TE_CALL(log, kva_seq_append(c, s, 1000), KVA_ERR_FULL, "blocks");
  KT_CHECK(log.empty == 0, "%d reports without a function or reason", log.empty);
  kva_cache_destroy(c);
}

static void te_descriptions(void) {
  te_log log;
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_attn a;
  size_t bytes = 0;
  kt_begin("errors: refused descriptions and kva_attn_check name the rule");
  memset(&log, 0, sizeof log);
  kt_desc_init(&d, 1, 1, 8, 0, 4, 0, KVA_DTYPE_DEFAULT);
  d.user = &log;
  d.on_error = te_record;
  d.rotate = 7;
  TE_CALL(log, kva_cache_create(&d, &c), KVA_ERR_ARG, "rotate");
  KT_CHECK(c == NULL, "a refused create wrote *out");
  d.rotate = 0;
  d.block_size = -2;
  TE_CALL(log, kva_cache_size(&d, &bytes), KVA_ERR_ARG, "block_size");
  d.block_size = 0;
  d.head_dim = 0;
  TE_CALL(log, kva_cache_create(&d, &c), KVA_ERR_ARG, "head_dim");
  d.head_dim = 8;
  d.dtype = (kva_dtype)99;
  TE_CALL(log, kva_cache_create(&d, &c), KVA_ERR_ARG, "storage type");
  d.dtype = KVA_DTYPE_DEFAULT;
  d.n_blocks = 0;
  d.max_bytes = 16;
  TE_CALL(log, kva_cache_create(&d, &c), KVA_ERR_ARG, "max_bytes");
  /* kva_attn_check: NULL when valid, else the rule */
  kt_attn_init(&a, 4, 2, 8, 0);
  KT_CHECK(kva_attn_check(&a) == NULL, "a valid kva_attn refused: %s", kva_attn_check(&a));
  a.n_kv_heads = 3;
  KT_CHECK(te_has(kva_attn_check(&a), "a->n_heads % a->n_kv_heads"), "heads: %s", kva_attn_check(&a));
  a.n_kv_heads = 2;
  a.window = -1;
  KT_CHECK(te_has(kva_attn_check(&a), "a->window < 0"), "window: %s", kva_attn_check(&a));
  a.window = 0;
  a.q_stride = 5;
  KT_CHECK(te_has(kva_attn_check(&a), "a->q_stride"), "q_stride: %s", kva_attn_check(&a));
  a.q_stride = 0;
  a.int_scores = 2;
  KT_CHECK(te_has(kva_attn_check(&a), "int_scores"), "int_scores: %s", kva_attn_check(&a));
  KT_CHECK(te_has(kva_attn_check(NULL), "!a"), "NULL: %s", kva_attn_check(NULL));
  KT_CHECK(log.empty == 0, "%d reports without a function or reason", log.empty);
}

/* Random calls, most of them wrong in some way: every refusal reports once
   with the status returned, no success reports. */
static void te_every_refusal_reports(void) {
  int iters = kt_iters(4000), it, i, bad = 0, silent = 0, spoke = 0;
  kt_rng rng;
  te_log log;
  kva_cache *c;
  float k[8 * 2 * 8], v[8 * 2 * 8], q[8 * 4 * 8], o[8 * 4 * 8];
  unsigned char stream[4096];
  int32_t tok[64], pos[2]; /* one per KV head */
  int seqs[6];
  kt_begin("errors: every refusal on a cache reports once, with its status; no success does");
  kt_seed(&rng, 4242);
  memset(&log, 0, sizeof log);
  for (i = 0; i < (int)(sizeof k / sizeof k[0]); i++) k[i] = v[i] = kt_uniform(&rng, -1.0f, 1.0f);
  for (i = 0; i < (int)(sizeof q / sizeof q[0]); i++) q[i] = kt_uniform(&rng, -1.0f, 1.0f);
  for (i = 0; i < 64; i++) tok[i] = i * 7 + 1;
  c = te_cache(&log, 12, KVA_INT8);
  if (!c) return;
  for (i = 0; i < 6; i++) seqs[i] = -1;
  for (it = 0; it < iters; it++) {
    int op = (int)(kt_u32(&rng) % 13), si = (int)(kt_u32(&rng) % 6), n = (int)(kt_u32(&rng) % 7) - 1;
    int layer = (int)(kt_u32(&rng) % 3), seq = seqs[si] >= 0 && kt_u32(&rng) % 8 ? seqs[si] : si + 100;
    int n0 = log.n;
    kva_status st = KVA_OK;
    kva_attn a;
    size_t size = 0;
    kt_attn_init(&a, kt_u32(&rng) % 6 ? 4 : 3, kt_u32(&rng) % 6 ? 2 : 1, kt_u32(&rng) % 6 ? 8 : 7, 0);
    switch (op) {
      case 0: st = kva_seq_new(c, &seqs[si]); break;
      case 1: st = kva_seq_free(c, seq); if (st == KVA_OK) seqs[si] = -1; break;
      case 2: case 3: st = kva_seq_append(c, seq, n * 3); break;
      case 4: case 5: st = kva_store(c, seq, layer, k, v, n); break;
      case 6: st = kva_attend_cache(c, seq, layer, &a, q, n, o); break;
      case 7: st = kva_seq_fork(c, seq, &seqs[(si + 1) % 6]); break;
      case 8: st = kva_seq_truncate(c, seq, n * 2); break;
      case 9: st = kva_seq_publish(c, seq, tok, n * 4, 5); break;
      case 10: st = kva_seq_read(c, seq, layer, n, k, v, pos); break;
      case 11:
        st = kva_seq_export(c, seq, stream, sizeof stream, &size);
        if (st == KVA_OK && size > 0) {
          int id;
          stream[kt_u32(&rng) % size] ^= (unsigned char)(kt_u32(&rng) % 2 ? 0 : 1 << (kt_u32(&rng) % 8));
          n0 = log.n;
          st = kva_seq_import(c, stream, size, &id);
          if (st == KVA_OK) kva_seq_free(c, id);
        }
        break;
      default: {
        kva_batch *plan = NULL;
        int nq = n;
        st = kva_batch_plan(c, &a, &seq, &nq, 1, &plan);
        if (st == KVA_OK) {
          n0 = log.n;
          st = kva_attend_batch(c, plan, layer, q, o);
          kva_batch_free(plan);
        }
      }
    }
    if (st != KVA_OK) {
      bad++;
      if (log.n != n0 + 1 || log.status != st) silent++;
    } else if (log.n != n0) {
      spoke++;
    }
  }
  KT_CHECK(bad > iters / 4, "only %d of %d random calls were refused: the walk tests little", bad, iters);
  KT_CHECK(silent == 0, "%d of %d refusals did not report exactly once with their status", silent, bad);
  KT_CHECK(spoke == 0, "%d successful calls reported an error", spoke);
  KT_CHECK(log.empty == 0, "%d reports without a function or reason", log.empty);
  kva_cache_destroy(c);
}

void test_errors(void) {
  te_named_rules();
  te_descriptions();
  te_every_refusal_reports();
}
