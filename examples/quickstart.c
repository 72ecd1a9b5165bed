/* quickstart: a GQA layer (Llama-3 proportions, scaled down) over a paged
   F16 cache: prefill a prompt, decode a few tokens, print the memory. */
#include <stdio.h>
#include <stdlib.h>
#include "kvattn.h"

static float *randn(size_t n, float scale) {
  float *p = (float *)malloc(n * sizeof(float));
  size_t i;
  for (i = 0; i < n; i++) p[i] = scale * ((float)rand() / (float)RAND_MAX - 0.5f);
  return p;
}

int main(void) {
  enum { D_MODEL = 256, H = 8, G = 2, D = 32, PROMPT = 100, STEPS = 8 };
  kva_cache_desc cd = {0};
  kva_gqa_layer L = {0};
  kva_cache_stats st;
  kva_cache *cache;
  float *x = randn((size_t)PROMPT * D_MODEL, 1.0f), *y = randn((size_t)PROMPT * D_MODEL, 0.0f);
  int seq, step;

  cd.n_layers = 1; cd.n_kv_heads = G; cd.head_dim = D; cd.n_blocks = 64;  /* 64 blocks x 16 tokens */
  if (kva_cache_create(&cd, &cache) != KVA_OK || kva_seq_new(cache, &seq) != KVA_OK) return 1;

  L.d_model = D_MODEL;
  L.attn.n_heads = H; L.attn.n_kv_heads = G; L.attn.head_dim = D;
  L.wq = randn((size_t)H * D * D_MODEL, 0.1f); L.wk = randn((size_t)G * D * D_MODEL, 0.1f);
  L.wv = randn((size_t)G * D * D_MODEL, 0.1f); L.wo = randn((size_t)D_MODEL * H * D, 0.1f);
  L.rope.theta = 500000.0f;                                            /* Llama-3 */

  /* prefill: one call for the whole prompt */
  if (kva_seq_append(cache, seq, PROMPT) != KVA_OK) return 1;
  if (kva_gqa_forward(&L, cache, seq, 0, x, PROMPT, y) != KVA_OK) return 1;
  /* decode: feed the last output back in, one token per step */
  for (step = 0; step < STEPS; step++) {
    const float *last = y + (size_t)(step == 0 ? PROMPT - 1 : 0) * D_MODEL;
    float xt[D_MODEL];
    memcpy(xt, last, sizeof xt);
    if (kva_seq_append(cache, seq, 1) != KVA_OK) return 1;          /* KVA_ERR_FULL: preempt */
    if (kva_gqa_forward(&L, cache, seq, 0, xt, 1, y) != KVA_OK) return 1;
    printf("step %d: pos %d  y[0..3] = %+.4f %+.4f %+.4f %+.4f\n", step, kva_seq_pos(cache, seq) - 1,
           y[0], y[1], y[2], y[3]);
  }
  kva_cache_get_stats(cache, &st);
  printf("%s kernels; %ld tokens in %d of %d blocks; %zu bytes/token (K+V, F16); pool %zu bytes\n",
         kva_simd_name(), st.tokens_held, st.blocks_used, st.n_blocks, kva_cache_bytes_per_token(&cd),
         st.bytes_total);
  kva_cache_destroy(cache);
  free(x); free(y);
  free((void *)L.wq); free((void *)L.wk); free((void *)L.wv); free((void *)L.wo);
  return 0;
}
