/* evict_scorer: a new eviction policy as one function, and prompt
   compression with a built-in one.

   A 512-token prompt hides 8 "needle" tokens whose keys point where the
   final queries look. The prompt is prefilled, then compressed to 64 tokens
   (kva_seq_compress) three ways:
     - value norm, written here: keep the tokens whose values are largest
       (a policy of our own, a dozen lines, kvattn.h untouched);
     - key norm (kva_score_key_norm: Knorm keeps the smallest keys);
     - SnapKV (kva_score_attention over the last 16 prompt queries, pooled
       over 5 neighbouring slots; the 16 newest tokens protected);
     - Ada-KV: SnapKV's scores, the two KV heads sharing 2 x 64 slots
       (kva_evict.share_heads), so a head whose attention is spread takes
       slots from one whose attention is concentrated.
   Each prints how many needles survive and how far the compressed cache's
   attention output is from the full one's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvattn.h"

enum { H = 4, G = 2, D = 32, PROMPT = 512, KEEP = 64, WINDOW = 16, NEEDLES = 8 };

static float frand(unsigned *s) {
  *s = *s * 1664525u + 1013904223u;
  return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

/* The policy of our own: a token's score is the L2 norm of its value row
   (the larger, the more it can move the output). */
static kva_status score_value_norm(void *user, const kva_score_view *view, float *scores) {
  int j, i;
  (void)user;
  if (!view->v) return KVA_ERR_UNSUPPORTED; /* a latent cache has no values of its own */
  for (j = 0; j < view->n; j++) {
    const float *v = view->v + (size_t)j * (size_t)view->v_dim;
    double ss = 0.0;
    for (i = 0; i < view->v_dim; i++) ss += (double)v[i] * v[i];
    scores[j] = (float)sqrt(ss);
  }
  return KVA_OK;
}

static float k_all[PROMPT][G * D], v_all[PROMPT][G * D], q_all[PROMPT][H * D];

/* Prefill the prompt into a new sequence, set the policy, compress to KEEP,
   then attend with the last query: needles kept and the output's distance
   from `full` (NULL: this is the full run, its output goes to out). */
static int run(kva_cache *c, const char *name, const kva_evict *ev, const float *full, float *out) {
  kva_attn a;
  int seq, i, needles = 0;
  int32_t pos[G];
  double diff = 0.0, norm = 0.0;
  memset(&a, 0, sizeof a);
  a.n_heads = H; a.n_kv_heads = G; a.head_dim = D; a.n_threads = 1;
  if (kva_seq_new(c, &seq) != KVA_OK || kva_seq_append(c, seq, PROMPT) != KVA_OK ||
      kva_store(c, seq, 0, &k_all[0][0], &v_all[0][0], PROMPT) != KVA_OK)
    return 0;
  if (ev) {
    kva_status st = kva_seq_set_evict(c, seq, ev);
    if (st == KVA_OK) st = kva_seq_compress(c, seq, KEEP);
    if (st != KVA_OK) {
      fprintf(stderr, "%s: %s\n", name, kva_status_str(st));
      return 0;
    }
    /* one decode step (its key and value: the prompt's last, for simplicity) */
    if (kva_seq_append(c, seq, 1) != KVA_OK || kva_store(c, seq, 0, k_all[PROMPT - 1], v_all[PROMPT - 1], 1) != KVA_OK)
      return 0;
  } else if (kva_seq_append(c, seq, 1) != KVA_OK ||
             kva_store(c, seq, 0, k_all[PROMPT - 1], v_all[PROMPT - 1], 1) != KVA_OK) {
    return 0;
  }
  if (kva_attend_cache(c, seq, 0, &a, q_all[PROMPT - 1], 1, out) != KVA_OK) return 0;
  for (i = 0; i < kva_seq_len(c, seq); i++) /* needles sit at positions 40, 100, ... (KV head 0) */
    if (kva_seq_read(c, seq, 0, i, NULL, NULL, pos) == KVA_OK && pos[0] < PROMPT - WINDOW && pos[0] % 60 == 40)
      needles++;
  if (full) {
    for (i = 0; i < H * D; i++) {
      diff += ((double)out[i] - full[i]) * ((double)out[i] - full[i]);
      norm += (double)full[i] * full[i];
    }
    printf("%-36s %4d slots  needles kept %d of %d  output rel. error %.3f\n", name, kva_seq_len(c, seq), needles,
           NEEDLES, sqrt(diff / norm));
  }
  kva_seq_free(c, seq);
  return 1;
}

int main(void) {
  kva_cache_desc cd;
  kva_cache *c;
  kva_evict ev;
  kva_score_queries snap;
  static float q_window[WINDOW][H * D];
  float full[H * D], out[H * D];
  unsigned seed = 7;
  int t, i, n;

  /* random keys and values; the needles' keys follow the direction the queries look in, their values are large */
  for (t = 0; t < PROMPT; t++) {
    int needle = t < PROMPT - WINDOW && t % 60 == 40;
    for (i = 0; i < G * D; i++) {
      k_all[t][i] = needle ? 1.5f + frand(&seed) * 0.2f : frand(&seed);
      v_all[t][i] = needle ? 3.0f * frand(&seed) : frand(&seed);
    }
    for (i = 0; i < H * D; i++) q_all[t][i] = t >= PROMPT - WINDOW ? 1.0f + frand(&seed) * 0.2f : frand(&seed);
  }
  for (t = 0; t < WINDOW; t++) memcpy(q_window[t], q_all[PROMPT - WINDOW + t], sizeof q_window[t]);

  memset(&cd, 0, sizeof cd);
  cd.n_layers = 1; cd.n_kv_heads = G; cd.head_dim = D; cd.n_blocks = 2 * (PROMPT / 16 + 2); cd.max_seqs = 2;
  if (kva_cache_create(&cd, &c) != KVA_OK) return 1;
  if (!run(c, "full cache", NULL, NULL, full)) return 1;
  n = 0;

  memset(&ev, 0, sizeof ev);
  ev.kind = KVA_EVICT_SCORE; ev.budget = PROMPT + 64; ev.n_recent = WINDOW;
  ev.score = score_value_norm;
  n += run(c, "value norm (our own scorer)", &ev, full, out);

  ev.score = kva_score_key_norm;
  n += run(c, "key norm (Knorm)", &ev, full, out);

  memset(&snap, 0, sizeof snap);
  snap.q = &q_window[0][0]; snap.n_q = WINDOW; snap.n_heads = H; snap.pool = 5;
  ev.score = kva_score_attention; ev.score_user = &snap;
  n += run(c, "SnapKV (16 queries, pool 5)", &ev, full, out);

  ev.share_heads = 1; /* the slots of a head that keeps fewer are empty, never attended */
  n += run(c, "Ada-KV (SnapKV scores, heads share)", &ev, full, out);
  ev.share_heads = 0;

  ev.score = NULL; ev.score_user = NULL; ev.kind = KVA_EVICT_WINDOW; ev.n_recent = 0;
  n += run(c, "WINDOW (the newest 64)", &ev, full, out);
  kva_cache_destroy(c);
  return n == 5 ? 0 : 1;
}
