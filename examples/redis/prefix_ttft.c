/* prefix_ttft: time to first token when a request's long shared prefix is
   (a) in the pool's prefix cache, (b) in a directory tier, (c) in a Redis
   tier, (d) nowhere (recomputed), on a trained llama2.c-format model.

     prefix_ttft MODEL HOST:PORT [PREFIX [REPEATS]]

   A request is PREFIX tokens (default 2,048 minus the question, within the
   model's seq_len) and a 16-token question; its first token's logits come
   from the question's prefill once the prefix is in place. Each figure is
   the median of REPEATS runs (default 5), printed as a ratio to (d); the
   outputs of (a)-(c) must equal (d)'s bit for bit. Also: a record's bytes
   against a block's bytes in the pool. Needs a Redis server at HOST:PORT
   (its kvattn keys are overwritten) and a writable TMPDIR (or current
   directory) for the directory tier.

   Build: cc -std=c99 -O2 -march=native -Iexamples -I. examples/redis/prefix_ttft.c -lhiredis -lm */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llm.h"
#include "tier_dir.h"
#include "tier_redis.h"

enum { QUESTION = 16, MAX_REPEATS = 31 };

static llm_model model;
static llm_state st;
static int32_t *tok;
static int n_prefix;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* One request over cache c: the prefix looked up (memory, tier), the rest
   computed, then the question; its seconds, the question's last logits to y */
static double request(kva_cache *c, float *y, int *reused) {
  double t0 = llm_now();
  int seq;
  kva_status s = kva_seq_new_prefix(c, tok, n_prefix + QUESTION, 0, &seq, reused);
  if (s == KVA_OK && *reused < n_prefix) s = llm_forward(&model, &st, c, seq, tok + *reused, n_prefix - *reused, NULL, 0);
  if (s == KVA_OK) s = llm_forward(&model, &st, c, seq, tok + n_prefix, QUESTION, st.logits, 0);
  t0 = llm_now() - t0;
  if (s != KVA_OK) {
    fprintf(stderr, "prefix_ttft: a request failed: %s\n", kva_status_str(s));
    exit(1);
  }
  memcpy(y, st.logits, (size_t)model.c.vocab_size * sizeof(float));
  kva_seq_free(c, seq);
  return t0;
}

int main(int argc, char **argv) {
  char err[512], host[256], dir[1100];
  const char *colon, *tmp = getenv("TMPDIR");
  llm_cache_opts co;
  tier_dir td;
  tier_redis tr;
  kva_cache *c;
  kva_cache_stats cs;
  float *y_ref, *y;
  double t[4][MAX_REPEATS], med[4];
  static const char *const what[4] = {"in memory (prefix cache)", "in a directory tier", "in a Redis tier",
                                      "recomputed"};
  int repeats = argc > 4 ? atoi(argv[4]) : 5, port, mode, r, reused = 0, i, saved = 0;
  if (argc < 3 || argc > 5 || !(colon = strrchr(argv[2], ':')) || (size_t)(colon - argv[2]) >= sizeof host ||
      (port = atoi(colon + 1)) <= 0 || repeats < 1 || repeats > MAX_REPEATS) {
    fprintf(stderr, "usage: %s MODEL HOST:PORT [PREFIX [REPEATS (1..%d)]]\n", argv[0], MAX_REPEATS);
    return 2;
  }
  memcpy(host, argv[2], (size_t)(colon - argv[2]));
  host[colon - argv[2]] = 0;
  if (!llm_model_load(&model, argv[1], err, sizeof err)) {
    fprintf(stderr, "prefix_ttft: %s\n", err);
    return 1;
  }
  n_prefix = argc > 3 ? atoi(argv[3]) : model.c.seq_len - QUESTION;
  if (n_prefix < 16 || n_prefix + QUESTION > model.c.seq_len) {
    fprintf(stderr, "prefix_ttft: PREFIX must be 16..%d for this model (seq_len %d)\n", model.c.seq_len - QUESTION,
            model.c.seq_len);
    return 2;
  }
  if (!tier_redis_open(&tr, host, port, 2000)) {
    fprintf(stderr, "prefix_ttft: no Redis server answers at %s:%d (start one: redis-server --port %d)\n", host, port,
            port);
    return 1;
  }
  snprintf(dir, sizeof dir, "%s/kvattn_ttft_XXXXXX", tmp && *tmp ? tmp : ".");
  if (!mkdtemp(dir) || !tier_dir_open(&td, dir)) {
    fprintf(stderr, "prefix_ttft: cannot make a directory in %s (set TMPDIR)\n", tmp && *tmp ? tmp : ".");
    return 1;
  }
  if (!llm_state_init(&st, &model, n_prefix + QUESTION, 1)) return 1;
  tok = (int32_t *)malloc((size_t)(n_prefix + QUESTION) * sizeof(int32_t));
  y_ref = (float *)malloc((size_t)model.c.vocab_size * sizeof(float));
  y = (float *)malloc((size_t)model.c.vocab_size * sizeof(float));
  for (i = 0; i < n_prefix + QUESTION; i++) tok[i] = (int32_t)(1 + ((long)i * 7919) % (model.c.vocab_size - 1));
  fprintf(stderr, "prefix_ttft: %d-token prefix + %d-token question, %d repeats per case\n", n_prefix, QUESTION,
          repeats);
  for (mode = 3; mode >= 0; mode--) {
    memset(&co, 0, sizeof co);
    co.k_dtype = co.v_dtype = KVA_F16;
    co.n_blocks = 2 * llm_blocks_for(&co, n_prefix + QUESTION);
    co.max_seqs = 4;
    if (mode == 1) co.spill = tier_dir_spill, co.fetch = tier_dir_fetch, co.tier_user = &td;
    if (mode == 2) co.spill = tier_redis_spill, co.fetch = tier_redis_fetch, co.tier_user = &tr;
    if (llm_cache_create(&model, &co, &c) != KVA_OK) return 1;
    if (mode < 3) { /* the prefix computed and published once; the tiers get it saved, memory forgets it */
      int seq;
      if (kva_seq_new(c, &seq) != KVA_OK || llm_forward(&model, &st, c, seq, tok, n_prefix, NULL, 0) != KVA_OK ||
          kva_seq_publish(c, seq, tok, n_prefix, 0) != KVA_OK)
        return 1;
      kva_seq_free(c, seq);
      if (mode > 0 && (kva_prefix_save(c, &saved) != KVA_OK || saved != n_prefix / 16)) {
        fprintf(stderr, "prefix_ttft: the %s saved %d of %d blocks\n", what[mode], saved, n_prefix / 16);
        return 1;
      }
    }
    for (r = 0; r < repeats; r++) {
      if (mode == 1 || mode == 2) kva_cache_reset_prefix(c); /* nothing in memory: every block from the tier */
      t[mode][r] = request(c, mode == 3 ? y_ref : y, &reused);
      if (mode < 3 && (reused != n_prefix / 16 * 16 || memcmp(y, y_ref, (size_t)model.c.vocab_size * sizeof(float)))) {
        fprintf(stderr, "prefix_ttft: %s: reused %d tokens, logits %s recomputation's\n", what[mode], reused,
                memcmp(y, y_ref, (size_t)model.c.vocab_size * sizeof(float)) ? "differ from" : "equal");
        return 1;
      }
    }
    qsort(t[mode], (size_t)repeats, sizeof(double), cmp_double);
    med[mode] = t[mode][repeats / 2];
    if (mode == 2) kva_cache_get_stats(c, &cs);
    if (mode == 1) {
      kva_cache_stats s1;
      kva_cache_get_stats(c, &s1);
      printf("a record: %zu bytes for a block of %zu bytes in the pool (x%.3f)\n", kva_prefix_record_size(c),
             s1.block_bytes, (double)kva_prefix_record_size(c) / (double)s1.block_bytes);
    }
    kva_cache_destroy(c);
  }
  printf("time to first token, %d-token prefix + %d-token question (median of %d), against recomputing it:\n",
         n_prefix, QUESTION, repeats);
  for (mode = 0; mode < 4; mode++) printf("  %-26s %.4f\n", what[mode], med[mode] / med[3]);
  printf("(Redis: %ld blocks fetched over the runs; every reuse bit for bit the recomputed logits)\n",
         cs.tier_fetch_hits);
  tier_dir_remove(dir);
  tier_redis_close(&tr);
  llm_state_free(&st);
  llm_model_free(&model);
  free(tok), free(y_ref), free(y);
  return 0;
}
