/* serve_sim: continuous batching over one paged KV cache.  64 requests from
   two tenants all start with the same 64-token system prompt; each tenant
   has its own salt, so its cached blocks are never served to the other.  A
   request: kva_seq_new_prefix (reuses the published system prompt of its
   tenant), admission check, prefill the rest through a tiny 2-layer GQA
   model, publish the prompt, then decode one token per step.  When a decode
   append finds the pool full, the newest running request is preempted
   (freed, requeued, recomputed later; its prompt is a prefix hit by then). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvattn.h"

enum { DM = 64, H = 4, G = 2, D = 16, LAYERS = 2, VOCAB = 97, SYS = 64, NREQ = 64, BATCH = 12, MAXTOK = 160 };

typedef struct {
  int tenant, n_prompt, n_gen, max_gen, seq, running, done;
  int32_t tok[MAXTOK], next;
} request;

static const uint64_t salt[2] = {0x7e4a47a11ceULL, 0x7e4a47b0bULL};
static kva_gqa_layer L[LAYERS];
static float *emb;
static kva_cache *cache;
static request r[NREQ];
static int order[NREQ], n_run; /* running requests, oldest first */
static long computed, preemptions, reused_by[2], first_reused[2] = {-1, -1};

static float *randn(size_t n, float s) {
  float *p = (float *)malloc(n * sizeof(float));
  size_t i;
  for (i = 0; i < n; i++) p[i] = s * ((float)rand() / (float)RAND_MAX - 0.5f);
  return p;
}

/* run tok[0..n) at the sequence's newest n positions; greedy next token */
static int32_t forward(int seq, const int32_t *tok, int n) {
  static float x[MAXTOK * DM], y[MAXTOK * DM];
  int i, l, v, best = 0;
  float best_dot = -1e30f;
  for (i = 0; i < n; i++) memcpy(x + i * DM, emb + tok[i] * DM, DM * sizeof(float));
  for (l = 0; l < LAYERS; l++) {
    if (kva_gqa_forward(&L[l], cache, seq, l, x, n, y) != KVA_OK) exit(1);
    for (i = 0; i < n * DM; i++) x[i] += y[i]; /* residual */
  }
  for (v = 0; v < VOCAB; v++) {
    float dot = 0.0f;
    for (i = 0; i < DM; i++) dot += x[(n - 1) * DM + i] * emb[v * DM + i];
    if (dot > best_dot) best_dot = dot, best = v;
  }
  computed += n;
  return best;
}

static void finish(int k, int requeue) { /* take order[k] off the running list */
  request *q = &r[order[k]];
  kva_seq_free(cache, q->seq);
  q->running = 0;
  q->n_gen = 0;
  q->done = !requeue;
  memmove(order + k, order + k + 1, (size_t)(n_run - k - 1) * sizeof(int));
  n_run--;
}

int main(void) {
  kva_cache_desc cd;
  kva_cache_stats st;
  int i, l, k, step, finished = 0, peak_used = 0;
  memset(&cd, 0, sizeof cd);
  cd.n_layers = LAYERS;
  cd.n_kv_heads = G;
  cd.head_dim = D;
  cd.n_blocks = 40; /* x 16 tokens: far less than BATCH full-length requests */
  cd.max_seqs = BATCH + 1;
  if (kva_cache_create(&cd, &cache) != KVA_OK) return 1;
  srand(7);
  emb = randn((size_t)VOCAB * DM, 2.0f);
  for (l = 0; l < LAYERS; l++) {
    memset(&L[l], 0, sizeof L[l]);
    L[l].d_model = DM;
    L[l].attn.n_heads = H;
    L[l].attn.n_kv_heads = G;
    L[l].attn.head_dim = D;
    L[l].attn.n_threads = 1;
    L[l].wq = randn((size_t)H * D * DM, 0.3f);
    L[l].wk = randn((size_t)G * D * DM, 0.3f);
    L[l].wv = randn((size_t)G * D * DM, 0.3f);
    L[l].wo = randn((size_t)DM * H * D, 0.3f);
    L[l].rope.theta = 10000.0f;
  }
  for (i = 0; i < NREQ; i++) { /* system prompt + 8..32 user tokens; 8..40 to generate */
    r[i].tenant = i % 2;
    r[i].n_prompt = SYS + 8 + rand() % 25;
    r[i].max_gen = 8 + rand() % 33;
    for (k = 0; k < r[i].n_prompt; k++) r[i].tok[k] = k < SYS ? (int32_t)(k * 7 % VOCAB) : (int32_t)(rand() % VOCAB);
  }
  for (step = 0; finished < NREQ; step++) {
    /* admit arrived requests (two per step), lowest index (= requeued) first */
    for (i = 0; i < NREQ && n_run < BATCH && i / 2 <= step; i++) {
      request *q = &r[i];
      int reused, rest;
      if (q->running || q->done) continue;
      if (kva_seq_new_prefix(cache, q->tok, q->n_prompt, salt[q->tenant], &q->seq, &reused) != KVA_OK) break;
      rest = q->n_prompt - reused;
      if (kva_seq_fits(cache, q->seq, rest + 1, NULL) != KVA_FITS_NOW) { /* admission: not now */
        kva_seq_free(cache, q->seq);
        break;
      }
      if (kva_seq_append(cache, q->seq, rest) != KVA_OK) return 1;
      q->running = 1;
      order[n_run++] = i;
      reused_by[q->tenant] += reused;
      if (first_reused[q->tenant] < 0) first_reused[q->tenant] = reused;
      q->next = forward(q->seq, q->tok + reused, rest);
      kva_seq_publish(cache, q->seq, q->tok, q->n_prompt, salt[q->tenant]);
    }
    /* one decode step for every running request, oldest first */
    for (k = 0; k < n_run; k++) {
      request *q = &r[order[k]];
      kva_status s;
      while ((s = kva_seq_append(cache, q->seq, 1)) == KVA_ERR_FULL) { /* preempt the newest */
        preemptions++;
        finish(n_run - 1, 1);
        if (k == n_run) break; /* that was this request */
      }
      if (s != KVA_OK) break;
      q->tok[q->n_prompt + q->n_gen] = q->next;
      q->next = forward(q->seq, q->tok + q->n_prompt + q->n_gen, 1);
      if (++q->n_gen == q->max_gen) {
        finish(k--, 0);
        finished++;
      }
    }
    kva_cache_get_stats(cache, &st);
    if (st.blocks_used > peak_used) peak_used = st.blocks_used;
  }
  kva_cache_get_stats(cache, &st);
  printf("served %d requests in %d steps: %ld tokens computed, %ld preemptions\n", NREQ, step, computed,
         preemptions);
  printf("prefix cache: %ld of %ld prompt tokens reused (%.1f%%); tenant 0 reused %ld, tenant 1 %ld; each "
         "tenant's first request reused %ld and %ld (salts keep tenants apart)\n",
         st.prefix_hits, st.prefix_queries, 100.0 * (double)st.prefix_hits / (double)st.prefix_queries,
         reused_by[0], reused_by[1], first_reused[0], first_reused[1]);
  printf("memory: %d blocks x %lu bytes = %.1f KiB KV (+ %.1f KiB bookkeeping), peak %d blocks in use, "
         "%d cached at the end, %ld cow copies, %ld appends failed\n",
         st.n_blocks, (unsigned long)st.block_bytes, (double)st.bytes_total / 1024.0,
         (double)st.bytes_meta / 1024.0, peak_used, st.blocks_cached, st.cow_copies, st.appends_failed);
  kva_cache_destroy(cache);
  return st.blocks_used == 0 && st.n_seqs == 0 ? 0 : 1;
}
