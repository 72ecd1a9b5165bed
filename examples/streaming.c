/* streaming: StreamingLLM-style decoding over a bounded cache. 100,000 decode
   steps keep 4 attention sinks plus a rolling window (KVA_EVICT_WINDOW): the
   tokens held and the bytes used stay flat while the position grows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvattn.h"

enum { H = 4, G = 1, D = 16, SINKS = 4, BUDGET = 260, STEPS = 100000 };

static float frand(unsigned *s) {
  *s = *s * 1664525u + 1013904223u;
  return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

int main(void) {
  kva_cache_desc cd;
  kva_attn a;
  kva_evict ev = {0};
  kva_cache_stats st;
  kva_cache *cache;
  float k[G * D], v[G * D], q[H * D], out[H * D];
  unsigned seed = 1;
  int seq, step, i;

  memset(&cd, 0, sizeof cd);
  cd.n_layers = 1; cd.n_kv_heads = G; cd.head_dim = D;  /* F16, 16-token blocks */
  cd.n_blocks = BUDGET / 16 + 2;                        /* all the memory it will ever need */
  memset(&a, 0, sizeof a);
  a.n_heads = H; a.n_kv_heads = G; a.head_dim = D; a.n_threads = 1;
  ev.kind = KVA_EVICT_WINDOW; ev.budget = BUDGET; ev.n_sink = SINKS; ev.n_recent = 0;
  if (kva_cache_create(&cd, &cache) != KVA_OK || kva_seq_new(cache, &seq) != KVA_OK ||
      kva_seq_set_evict(cache, seq, &ev) != KVA_OK)
    return 1;

  printf("%8s %8s %8s %10s\n", "step", "position", "held", "bytes");
  for (step = 1; step <= STEPS; step++) {
    for (i = 0; i < G * D; i++) { k[i] = frand(&seed); v[i] = frand(&seed); }
    for (i = 0; i < H * D; i++) q[i] = frand(&seed);
    if (kva_seq_append(cache, seq, 1) != KVA_OK ||     /* evicts the oldest non-sink */
        kva_store(cache, seq, 0, k, v, 1) != KVA_OK ||
        kva_attend_cache(cache, seq, 0, &a, q, 1, out) != KVA_OK) {
      fprintf(stderr, "step %d failed\n", step);
      return 1;
    }
    if (step % 10000 == 0) {
      kva_cache_get_stats(cache, &st);
      printf("%8d %8d %8d %10lu\n", step, kva_seq_pos(cache, seq), kva_seq_len(cache, seq),
             (unsigned long)((size_t)st.blocks_used * st.block_bytes));
    }
  }
  kva_cache_destroy(cache);
  return 0;
}
