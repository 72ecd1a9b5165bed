/* prefix_tier: a system prompt that outlives the pool and the process.

   A GQA layer over a small F16 cache whose prefix tier is a directory of
   files (examples/tier_dir.h). Request A prefills a 128-token system prompt
   and a question and publishes the prompt; request B, unrelated, needs the
   whole pool, so the cache forgets A's blocks and spills them to the
   directory; request C asks A's question again: its lookup fetches the
   prompt's blocks back and prefills only the question. C's output is
   checked bit for bit against the same request computed from scratch.
   Run it twice with the same directory: the second process never computed
   the prompt, and its very first lookup finds it in the files.

   usage: prefix_tier [DIR]   (without DIR: a new directory in $TMPDIR, else in the current directory,
                               removed at the end) */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvattn.h"
#include "tier_dir.h"

enum { D_MODEL = 128, H = 8, G = 2, D = 32, BS = 16, POOL = 12, PROMPT = 128, QUESTION = 9, OTHER = POOL * BS };

/* weights and embeddings from a fixed generator: the same in every process */
static uint32_t lcg(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return *s >> 8;
}
static float *weights(size_t n, uint32_t seed, float scale) {
  float *w = (float *)malloc(n * sizeof(float));
  size_t i;
  for (i = 0; i < n; i++) w[i] = scale * ((float)(lcg(&seed) % 2001) / 1000.0f - 1.0f);
  return w;
}
static void embed(const int32_t *tok, int n, float *x) {
  int t, i;
  for (t = 0; t < n; t++) {
    uint32_t s = 7919u * (uint32_t)tok[t] + 1u;
    for (i = 0; i < D_MODEL; i++) x[(size_t)t * D_MODEL + i] = (float)(lcg(&s) % 2001) / 1000.0f - 1.0f;
  }
}

static kva_gqa_layer layer;
static int32_t tokens[PROMPT + QUESTION];

/* Prefill tokens[from..n) of a sequence already holding `from`; y: the last token's output [D_MODEL] */
static int prefill(kva_cache *c, int seq, int from, int n, float *y) {
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
static int request(kva_cache *c, float *y, int *reused) {
  int seq;
  if (kva_seq_new_prefix(c, tokens, PROMPT + QUESTION, 1, &seq, reused) != KVA_OK) return 0;
  if (*reused < PROMPT && !prefill(c, seq, *reused, PROMPT, y)) return 0;
  if (!prefill(c, seq, PROMPT, PROMPT + QUESTION, y)) return 0;
  if (kva_seq_publish(c, seq, tokens, PROMPT, 1) != KVA_OK) return 0;
  return kva_seq_free(c, seq) == KVA_OK;
}

/* A directory of this run's own: its records, then itself, go at the end */
static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char path[1400];
  while (d && (e = readdir(d)) != NULL)
    if (strstr(e->d_name, ".kvpb")) {
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      remove(path);
    }
  if (d) closedir(d);
  rmdir(dir);
}

int main(int argc, char **argv) {
  char own[1100];
  const char *dir = argc > 1 ? argv[1] : NULL, *tmp = getenv("TMPDIR");
  kva_cache_desc cd;
  kva_cache *c, *fresh;
  kva_cache_stats st;
  tier_dir store;
  float y_a[D_MODEL], y_c[D_MODEL], y_ref[D_MODEL];
  int i, seq, reused_a, reused_c;

  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    fprintf(stderr, "usage: %s [DIR]   (a directory for the prefix tier's records; created if missing)\n", argv[0]);
    return 2;
  }
  if (!dir) {
    snprintf(own, sizeof own, "%s/kvattn_tier_XXXXXX", tmp && *tmp ? tmp : ".");
    if (!mkdtemp(own)) {
      fprintf(stderr, "prefix_tier: cannot make a directory in %s (set TMPDIR, or give DIR)\n", tmp && *tmp ? tmp : ".");
      return 1;
    }
    dir = own;
  }
  if (!tier_dir_open(&store, dir)) {
    fprintf(stderr, "prefix_tier: cannot use '%s' as the tier's directory (create it, or give a writable one)\n",
            dir);
    return 1;
  }
  layer.d_model = D_MODEL;
  layer.attn.n_heads = H, layer.attn.n_kv_heads = G, layer.attn.head_dim = D;
  layer.wq = weights((size_t)H * D * D_MODEL, 1u, 0.1f), layer.wk = weights((size_t)G * D * D_MODEL, 2u, 0.1f);
  layer.wv = weights((size_t)G * D * D_MODEL, 3u, 0.1f), layer.wo = weights((size_t)D_MODEL * H * D, 4u, 0.1f);
  layer.rope.theta = 10000.0f;
  for (i = 0; i < PROMPT + QUESTION; i++) tokens[i] = 1000 + (i * 37) % 500;

  memset(&cd, 0, sizeof cd);
  cd.n_layers = 1, cd.n_kv_heads = G, cd.head_dim = D, cd.block_size = BS, cd.n_blocks = POOL;
  cd.spill = tier_dir_spill, cd.fetch = tier_dir_fetch, cd.tier_user = &store;
  if (kva_cache_create(&cd, &c) != KVA_OK) return 1;

  /* A: the prompt (from the files, if an earlier run left it there) and the question */
  if (!request(c, y_a, &reused_a)) return 1;
  printf("request A: %d of %d prompt tokens reused%s\n", reused_a, PROMPT,
         reused_a ? " (from the tier: an earlier process computed them)" : "");
  /* B: another request needs every block: A's published blocks are spilled */
  if (kva_seq_new(c, &seq) != KVA_OK || kva_seq_append(c, seq, OTHER) != KVA_OK) return 1;
  kva_seq_free(c, seq);
  /* C: A's request again */
  if (!request(c, y_c, &reused_c)) return 1;
  kva_cache_get_stats(c, &st);
  printf("request C: %d of %d prompt tokens reused; tier: %ld blocks spilled (%ld refused by the store), "
         "%ld fetched, %ld misses, %ld records refused\n",
         reused_c, PROMPT, st.tier_spills, st.tier_spill_errors, st.tier_fetch_hits, st.tier_fetch_misses,
         st.tier_fetch_refused);
  printf("a record: %zu bytes for a block of %zu bytes in the pool\n", kva_prefix_record_size(c), st.block_bytes);

  /* the same request computed from scratch (no tier), in the same chunks */
  cd.spill = NULL, cd.fetch = NULL, cd.tier_user = NULL;
  if (kva_cache_create(&cd, &fresh) != KVA_OK || kva_seq_new(fresh, &seq) != KVA_OK) return 1;
  if (!prefill(fresh, seq, 0, PROMPT, y_ref) || !prefill(fresh, seq, PROMPT, PROMPT + QUESTION, y_ref)) return 1;
  if (reused_c != PROMPT || memcmp(y_c, y_ref, sizeof y_c) != 0) {
    fprintf(stderr, "prefix_tier: request C %s\n",
            reused_c != PROMPT ? "did not reuse the prompt" : "differs from the request computed from scratch");
    return 1;
  }
  printf("request C's output is bit for bit the one computed from scratch\n");
  kva_cache_destroy(fresh);
  kva_cache_destroy(c);
  free((void *)layer.wq), free((void *)layer.wk), free((void *)layer.wv), free((void *)layer.wo);
  if (dir == own) remove_dir(own);
  else printf("the records stay in %s: run again with it to start warm\n", dir);
  return 0;
}
