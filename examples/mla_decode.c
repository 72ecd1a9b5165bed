/* mla_decode.c - one DeepSeek-style MLA layer (DeepSeek-V2-Lite proportions, 1/8 size) with
   random weights: prefill a prompt, greedy-decode with the absorbed path (a toy LM head tied to
   the embeddings), check the naive path on the last step, and compare cache memory per token
   with an MHA layer that has the same heads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvattn.h"

enum { D = 256, H = 16, DL = 64, DN = 16, DR = 8, DV = 16, VOCAB = 100, PROMPT = 24, GEN = 12 };

static unsigned rng = 12345u;
static float *randn(int n, float scale) { /* uniform, variance scale^2 / 3 */
  float *w = (float *)malloc(sizeof(float) * (size_t)n);
  for (int i = 0; i < n; i++) { rng = rng * 1664525u + 1013904223u; w[i] = scale * ((rng >> 8) / 8388608.0f - 1.0f); }
  return w;
}

static size_t bpt(kva_cache_kind kind, int layers, int heads, int hd, int vd) {
  kva_cache_desc d; memset(&d, 0, sizeof d);
  d.kind = kind; d.n_layers = layers; d.n_kv_heads = heads; d.head_dim = hd; d.v_dim = vd;
  d.dtype = KVA_F16; d.n_blocks = 1;
  return kva_cache_bytes_per_token(&d);
}

int main(void) {
  kva_mla_layer L; memset(&L, 0, sizeof L);
  L.d_model = D; L.n_heads = H; L.d_latent = DL; L.d_nope = DN; L.d_rope = DR; L.d_v = DV;
  L.wq = randn(H * (DN + DR) * D, 1.7f / sqrtf(D));  L.w_dkv = randn(DL * D, 1.7f / sqrtf(D));
  static float gain[DL]; for (int i = 0; i < DL; i++) gain[i] = 1.0f;
  L.kv_norm = gain;                                 /* RMSNorm on c_kv (eps 1e-6), as DeepSeek */
  L.w_kr = randn(DR * D, 1.7f / sqrtf(D));           L.w_uk = randn(H * DN * DL, 1.7f / sqrtf(DL));
  L.w_uv = randn(H * DV * DL, 1.7f / sqrtf(DL));     L.wo = randn(D * H * DV, 1.7f / sqrtf(H * DV));
  L.rope.theta = 10000.0f; L.rope.interleaved = 1;  /* DeepSeek rotates pairs (x[2i], x[2i+1]) */
  float *emb = randn(VOCAB * D, 1.7f);

  kva_cache_desc d; memset(&d, 0, sizeof d);       /* latent cache: [c_kv | k_pe], F16 */
  d.kind = KVA_CACHE_LATENT; d.n_layers = 1; d.n_kv_heads = 1; d.head_dim = DL + DR; d.v_dim = DL;
  d.n_blocks = 8;
  kva_cache *c; int seq;
  if (kva_cache_create(&d, &c) != KVA_OK || kva_seq_new(c, &seq) != KVA_OK) return 1;

  static float x[PROMPT * D], y[PROMPT * D], yn[D];
  int tok = 0, n = PROMPT;
  for (int t = 0; t < PROMPT; t++) memcpy(x + t * D, emb + ((7 * t + 3) % VOCAB) * D, sizeof(float) * D);
  printf("generated:");
  for (int step = 0; step <= GEN; step++) {
    if (kva_seq_append(c, seq, n) != KVA_OK || kva_mla_forward(&L, c, seq, 0, x, n, y) != KVA_OK) return 1;
    const float *last = y + (n - 1) * D;             /* greedy: tied embedding head */
    float best = -INFINITY;
    for (int v = 0; v < VOCAB; v++) {
      float s = 0.0f;
      for (int i = 0; i < D; i++) s += last[i] * emb[v * D + i];
      if (s > best) { best = s; tok = v; }
    }
    if (step == GEN) break;
    printf(" %d", tok);
    memcpy(x, emb + tok * D, sizeof(float) * D);
    n = 1;
  }
  L.naive = 1;                                      /* the same last step, K and V rebuilt */
  if (kva_mla_forward(&L, c, seq, 0, x, 1, yn) != KVA_OK) return 1;
  double err = 0.0, mag = 0.0;
  for (int i = 0; i < D; i++) { err = fmax(err, fabs(yn[i] - y[i])); mag = fmax(mag, fabs(y[i])); }
  printf("\nlast step, naive vs absorbed: max |diff| %.2e (max |y| %.2f) %s\n", err, mag,
         err <= 1e-3 * mag ? "ok" : "MISMATCH");

  size_t mla = bpt(KVA_CACHE_LATENT, 1, 1, DL + DR, DL), mha = bpt(KVA_CACHE_KV, 1, H, DN + DR, DV);
  printf("this layer, F16: MLA %zu B/token (%d values) vs MHA, same %d heads (K %d, V %d): %zu B/token"
         " -> %.2f%%, %.1fx smaller\n", mla, DL + DR, H, DN + DR, DV, mha, 100.0 * mla / mha, (double)mha / mla);
  size_t v2 = bpt(KVA_CACHE_LATENT, 60, 1, 576, 512), f = bpt(KVA_CACHE_KV, 60, 128, 128, 128),
         full = bpt(KVA_CACHE_KV, 60, 128, 192, 128);
  printf("DeepSeek-V2 (60 layers, F16): MLA %zu B/token (576 values/layer) vs MHA 128 heads x 128 "
         "(2x128x128 values/layer) %zu: %.2f%%, %.1fx;\n  vs MHA with K 192 (nope+rope), V 128: %zu, %.1fx\n",
         v2, f, 100.0 * v2 / f, (double)f / v2, full, (double)full / v2);
  kva_cache_destroy(c);
  return err <= 1e-3 * mag ? 0 : 1;
}
