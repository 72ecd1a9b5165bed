/* tier_demo.h - what examples/prefix_tier.c and examples/redis/prefix_redis.c
   share: one GQA layer over a small F16 cache, a 128-token system prompt and
   a question, all from a fixed generator, so every process computes the same
   keys and values; a request looks its prompt up (memory, then the cache's
   prefix tier), prefills the rest and publishes the prompt. */
#ifndef KVATTN_TIER_DEMO_H
#define KVATTN_TIER_DEMO_H

#include <stdlib.h>
#include <string.h>

#include "kvattn.h"

enum { D_MODEL = 128, H = 8, G = 2, D = 32, BS = 16, POOL = 12, PROMPT = 128, QUESTION = 9, OTHER = POOL * BS };

/* weights and embeddings from a fixed generator: the same in every process */
static inline uint32_t lcg(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return *s >> 8;
}
static inline float *weights(size_t n, uint32_t seed, float scale) {
  float *w = (float *)malloc(n * sizeof(float));
  size_t i;
  for (i = 0; i < n; i++) w[i] = scale * ((float)(lcg(&seed) % 2001) / 1000.0f - 1.0f);
  return w;
}
static inline void embed(const int32_t *tok, int n, float *x) {
  int t, i;
  for (t = 0; t < n; t++) {
    uint32_t s = 7919u * (uint32_t)tok[t] + 1u;
    for (i = 0; i < D_MODEL; i++) x[(size_t)t * D_MODEL + i] = (float)(lcg(&s) % 2001) / 1000.0f - 1.0f;
  }
}

static kva_gqa_layer layer;
static int32_t tokens[PROMPT + QUESTION];

/* Prefill tokens[from..n) of a sequence already holding `from`; y: the last token's output [D_MODEL] */
static inline int prefill(kva_cache *c, int seq, int from, int n, float *y) {
  float *x = (float *)malloc((size_t)(n - from) * D_MODEL * sizeof(float));
  float *out = (float *)malloc((size_t)(n - from) * D_MODEL * sizeof(float));
  int ok;
  embed(tokens + from, n - from, x);
  ok = kva_seq_append(c, seq, n - from) == KVA_OK && kva_gqa_forward(&layer, c, seq, 0, x, n - from, out) == KVA_OK;
  if (ok) memcpy(y, out + (size_t)(n - from - 1) * D_MODEL, D_MODEL * sizeof(float));
  free(x);
  free(out);
  return ok;
}

/* A request: its prompt's blocks from memory or the tier, the rest prefilled, the prompt published */
static inline int request(kva_cache *c, float *y, int *reused) {
  int seq;
  if (kva_seq_new_prefix(c, tokens, PROMPT + QUESTION, 1, &seq, reused) != KVA_OK) return 0;
  if (*reused < PROMPT && !prefill(c, seq, *reused, PROMPT, y)) return 0;
  if (!prefill(c, seq, PROMPT, PROMPT + QUESTION, y)) return 0;
  if (kva_seq_publish(c, seq, tokens, PROMPT, 1) != KVA_OK) return 0;
  return kva_seq_free(c, seq) == KVA_OK;
}

/* The layer's weights and the request's token ids */
static inline void demo_init(void) {
  int i;
  layer.d_model = D_MODEL;
  layer.attn.n_heads = H, layer.attn.n_kv_heads = G, layer.attn.head_dim = D;
  layer.wq = weights((size_t)H * D * D_MODEL, 1u, 0.1f), layer.wk = weights((size_t)G * D * D_MODEL, 2u, 0.1f);
  layer.wv = weights((size_t)G * D * D_MODEL, 3u, 0.1f), layer.wo = weights((size_t)D_MODEL * H * D, 4u, 0.1f);
  layer.rope.theta = 10000.0f;
  for (i = 0; i < PROMPT + QUESTION; i++) tokens[i] = 1000 + (i * 37) % 500;
}
static inline void demo_free(void) {
  free((void *)layer.wq), free((void *)layer.wk), free((void *)layer.wv), free((void *)layer.wo);
}
/* The cache every demo process makes (spill / fetch: its tier, or NULL) */
static inline kva_cache *demo_cache(kva_status (*spill)(void *, const uint8_t *, const void *, size_t),
                                    kva_status (*fetch)(void *, const uint8_t *, void *, size_t, size_t *),
                                    void *user) {
  kva_cache_desc cd;
  kva_cache *c = NULL;
  memset(&cd, 0, sizeof cd);
  cd.n_layers = 1, cd.n_kv_heads = G, cd.head_dim = D, cd.block_size = BS, cd.n_blocks = POOL;
  cd.spill = spill, cd.fetch = fetch, cd.tier_user = user;
  return kva_cache_create(&cd, &c) == KVA_OK ? c : NULL;
}
/* The request computed from scratch (no tier), in the same chunks: what a reused prompt must give */
static inline int demo_reference(float *y) {
  kva_cache *c = demo_cache(NULL, NULL, NULL);
  int seq, ok;
  if (!c) return 0;
  ok = kva_seq_new(c, &seq) == KVA_OK && prefill(c, seq, 0, PROMPT, y) && prefill(c, seq, PROMPT, PROMPT + QUESTION, y);
  kva_cache_destroy(c);
  return ok;
}

#endif /* KVATTN_TIER_DEMO_H */
