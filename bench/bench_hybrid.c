/* bench/bench_hybrid.c - kvattn_bench paged, part hybrid: caches with layer groups
   (kva_cache_desc.groups) for hybrid local/global models against a full cache. Memory: the bytes
   a sequence holds at each context, from the allocator (kva_cache_stats.bytes_used), for one
   period of each model's layer pattern, scaled to the whole model by its count of local and
   global layers. Speed: one decode step over one period of Gemma 3 27B's pattern with a hybrid
   cache, a full cache given the same masks per layer (the outputs must be equal, bit for bit),
   and a full cache without masks. */
#include "harness.h"

/* Layer patterns from the models' published configurations (config.json of the released
   weights: num_hidden_layers, num_key_value_heads, head_dim, sliding_window / layer_types /
   attention_chunk_size):
     Gemma-2-9B     42 layers, 8 KV heads, head dim 256: sliding (window 4096) and global layers
                    alternate, sliding first (google/gemma-2-9b)
     Gemma-3-27B    62 layers, 16 KV heads, head dim 128: five sliding layers (window 1024), then a
                    global one (sliding_window_pattern 6; google/gemma-3-27b-it)
     GPT-OSS-120B   36 layers, 8 KV heads, head dim 64: sliding (window 128) and full layers
                    alternate, sliding first (layer_types; openai/gpt-oss-120b)
     Llama-4-Scout  48 layers, 8 KV heads, head dim 128: chunked attention (chunks of 8192) in
                    three of every four layers, the fourth global
                    (attention_chunk_size; meta-llama/Llama-4-Scout-17B-16E) */
typedef struct {
  const char *name;
  int n_layers, G, D;
  int period;        /* layers of one pattern period; its last one is global */
  int kind, span;    /* the other layers' group: KVA_SPAN_WINDOW (window) or KVA_SPAN_CHUNK (chunk) */
} hybrid_model;

static const hybrid_model hybrid_models[] = {
    {"Gemma-2-9B", 42, 8, 256, 2, KVA_SPAN_WINDOW, 4096},
    {"Gemma-3-27B", 62, 16, 128, 6, KVA_SPAN_WINDOW, 1024},
    {"GPT-OSS-120B", 36, 8, 64, 2, KVA_SPAN_WINDOW, 128},
    {"Llama-4-Scout", 48, 8, 128, 4, KVA_SPAN_CHUNK, 8192},
};

/* layers of the whole model that are global (every period-th, counting from 1) */
static int global_layers(const hybrid_model *hm) { return hm->n_layers / hm->period; }

/* One period of hm's pattern: group 0 the local span, group 1 FULL (the period's last layer). */
static kva_cache_desc hybrid_desc(const hybrid_model *hm, long tokens, kva_layer_group *groups, int *layer_group,
                                  int hybrid) {
  kva_cache_desc d;
  int l;
  memset(&d, 0, sizeof d);
  memset(groups, 0, 2 * sizeof *groups);
  d.n_layers = hm->period;
  d.n_kv_heads = hm->G;
  d.head_dim = hm->D;
  d.dtype = KVA_F16;
  d.block_size = 16;
  d.n_blocks = (int)((tokens + 15) / 16) + 2;
  d.max_seqs = 1;
  d.evict_support = KVA_EVICT_SUPPORT_NONE;
  if (!hybrid) return d;
  groups[0].kind = hm->kind;
  /* the group's pool: the span, and a prefill chunk of 512 tokens (the default holds one block more) */
  groups[0].n_blocks = (hm->span + 15) / 16 + 512 / 16 + 2;
  if (hm->kind == KVA_SPAN_WINDOW) groups[0].window = hm->span;
  else groups[0].chunk_size = hm->span;
  groups[1].kind = KVA_SPAN_FULL;
  for (l = 0; l < hm->period; l++) layer_group[l] = l == hm->period - 1;
  d.n_groups = 2;
  d.groups = groups;
  d.layer_group = layer_group;
  return d;
}

/* ---- memory ---- */

static void hybrid_memory(const opts *o) {
  static const long def_ctx[] = {4096, 32768, 131072};
  const long *ctx = o->ctx_set ? o->ctx : def_ctx;
  int n_ctx = o->ctx_set ? o->n_ctx : (o->quick ? 1 : 3), mi, k;
  rows t = {0};
  static const vcol v[] = {{0, "model", FM_STR},       {1, "ctx", FM_INT},        {2, "hybrid MiB", FM_F1},
                           {3, "full MiB", FM_F1},     {4, "hybrid/full", FM_F3}, {5, "pattern bound", FM_F3},
                           {6, "local blocks", FM_INT}};
  for (mi = 0; mi < NV(hybrid_models); mi++) {
    const hybrid_model *hm = &hybrid_models[mi];
    for (k = 0; k < n_ctx; k++) {
      kva_layer_group groups[2], unused[2];
      int layer_group[8], seq = -1, n_global = global_layers(hm), n_local = hm->n_layers - n_global;
      kva_cache_desc d = hybrid_desc(hm, ctx[k], groups, layer_group, 1), full = hybrid_desc(hm, 16, unused, NULL, 0);
      kva_cache *c = NULL, *cf = NULL;
      kva_cache_stats st, sf;
      long done = 0;
      double main_b, local_b, full_layer_b, hyb, all, bound;
      kva_status s;
      row *r;
      progress("paged hybrid %s: %ld tokens", hm->name, ctx[k]);
      if ((s = kva_cache_create(&d, &c)) != KVA_OK || (s = kva_cache_create(&full, &cf)) != KVA_OK ||
          (s = kva_seq_new(c, &seq)) != KVA_OK) {
        fprintf(stderr, "paged hybrid %s: cache: %s\n", hm->name, kva_status_str(s));
        g_failed = 1;
        kva_cache_destroy(c);
        kva_cache_destroy(cf);
        continue;
      }
      while (done < ctx[k] && s == KVA_OK) { /* prefill in chunks, as engines do, then a decode step */
        int n = ctx[k] - 1 - done < 512 ? (int)(ctx[k] - 1 - done) : 512;
        if (n == 0) n = 1;
        s = kva_seq_append(c, seq, n);
        done += n;
      }
      kva_cache_get_stats(c, &st);
      kva_cache_get_stats(cf, &sf); /* a full cache's block of the period: every layer, every token */
      if (s != KVA_OK) {
        fprintf(stderr, "paged hybrid %s at %ld tokens: %s\n", hm->name, ctx[k], kva_status_str(s));
        g_failed = 1;
      }
      /* the period's main pool holds its global layer, its groups the local ones */
      main_b = (double)st.blocks_used * (double)st.block_bytes;
      local_b = (double)st.bytes_used - main_b;
      full_layer_b = (double)((ctx[k] + 15) / 16) * (double)sf.block_bytes / hm->period;
      hyb = main_b * n_global + local_b / (hm->period - 1) * n_local;
      all = full_layer_b * hm->n_layers;
      bound = (n_global * (double)ctx[k] + n_local * (double)(ctx[k] < hm->span ? ctx[k] : hm->span)) /
              ((double)hm->n_layers * (double)ctx[k]);
      r = rows_add(&t, "paged_hybrid_memory");
      rs(r, 0, "%s", hm->name);
      rn(r, 1, (double)ctx[k]);
      rn(r, 2, hyb / 1048576.0);
      rn(r, 3, all / 1048576.0);
      rn(r, 4, hyb / all);
      rn(r, 5, bound);
      rn(r, 6, (double)st.group_blocks_used);
      kva_cache_destroy(c);
      kva_cache_destroy(cf);
    }
  }
  progress_end();
  print_table("Hybrid local/global caches: KV bytes of one sequence, whole model, F16, blocks of 16 (from the\n"
              "allocator over one pattern period, scaled by the model's local and global layer counts);\n"
              "after a prefill in chunks of 512 and one decode step; pattern bound: what the layer pattern implies\n"
              "without block rounding; local blocks: the local group's blocks held (each holds its layers)",
              v, NV(v), &t, 0);
  emit_rows(&t);
  rows_free(&t);
}

/* ---- decode over one period of Gemma 3 27B ---- */

/* ctx tokens of the same random K/V in every layer of c (the same rng sequence for every cache) */
static kva_status hybrid_fill(kva_cache *c, int seq, int n_layers, int G, int D, long ctx, uint64_t seed) {
  uint64_t rng = seed;
  long done = 0;
  kva_status st = KVA_OK;
  int l;
  while (done < ctx && st == KVA_OK) {
    int n = ctx - done < 256 ? (int)(ctx - done) : 256;
    size_t nk = (size_t)n * (size_t)G * (size_t)D;
    st = kva_seq_append(c, seq, n);
    for (l = 0; l < n_layers && st == KVA_OK; l++) st = kva_store(c, seq, l, pool_at(&rng, nk), pool_at(&rng, nk), n);
    done += n;
  }
  return st;
}

enum { HY_HYBRID, HY_MASKED, HY_NOMASK, NHY };
static const char *const hy_name[NHY] = {"hybrid cache", "full cache, same masks", "full cache, no masks"};

static void hybrid_decode(const opts *o) {
  const hybrid_model *hm = &hybrid_models[1]; /* Gemma-3-27B */
  const int H = 32, reps = o->reps > 0 ? o->reps : 5;
  long ctx = o->quick ? 4096 : 32768;
  kva_layer_group groups[2];
  int layer_group[8], seq[NHY], cfg, l, rep;
  kva_cache *c[NHY] = {NULL, NULL, NULL};
  size_t nq = (size_t)H * (size_t)hm->D;
  float *q = (float *)xalloc(nq * sizeof(float) * (size_t)hm->period);
  float *out[NHY] = {NULL, NULL, NULL};
  double best[NHY];
  uint64_t rng = o->seed + 77;
  rows t = {0};
  static const vcol v[] = {{0, "cache", FM_STR}, {1, "ctx", FM_INT}, {2, "ms/step", FM_F3}, {3, "vs hybrid", FM_F2},
                           {4, "MiB held", FM_F1}};
  for (l = 0; l < (int)(nq * (size_t)hm->period); l++) q[l] = (float)rng_gauss(&rng);
  pool_init(o->seed);
  for (cfg = 0; cfg < NHY; cfg++) {
    kva_cache_desc d = hybrid_desc(hm, ctx + 1, groups, layer_group, cfg == HY_HYBRID);
    kva_status st;
    out[cfg] = (float *)xalloc(nq * sizeof(float) * (size_t)hm->period);
    best[cfg] = 1e30;
    progress("paged hybrid decode: %s, filling %ld tokens x %d layers", hy_name[cfg], ctx, hm->period);
    if ((st = kva_cache_create(&d, &c[cfg])) != KVA_OK || (st = kva_seq_new(c[cfg], &seq[cfg])) != KVA_OK ||
        (st = hybrid_fill(c[cfg], seq[cfg], hm->period, hm->G, hm->D, ctx, o->seed + 5)) != KVA_OK) {
      fprintf(stderr, "paged hybrid decode: %s: %s\n", hy_name[cfg], kva_status_str(st));
      g_failed = 1;
      goto done;
    }
  }
  progress("paged hybrid decode: timing");
  for (rep = 0; rep < reps; rep++)
    for (cfg = 0; cfg < NHY; cfg++) { /* the three in turns */
      double t0 = now_s();
      for (l = 0; l < hm->period; l++) {
        kva_attn a;
        memset(&a, 0, sizeof a);
        a.n_heads = H; a.n_kv_heads = hm->G; a.head_dim = hm->D; a.n_threads = 1;
        if (cfg == HY_MASKED && l < hm->period - 1) a.window = hm->span;
        if (kva_attend_cache(c[cfg], seq[cfg], l, &a, q + (size_t)l * nq, 1, out[cfg] + (size_t)l * nq) != KVA_OK)
          g_failed = 1;
      }
      t0 = now_s() - t0;
      if (t0 < best[cfg]) best[cfg] = t0;
    }
  if (memcmp(out[HY_HYBRID], out[HY_MASKED], nq * sizeof(float) * (size_t)hm->period) != 0) {
    fprintf(stderr, "paged hybrid decode: the hybrid cache's output differs from the masked full cache's\n");
    g_failed = 1;
  }
  for (cfg = 0; cfg < NHY; cfg++) {
    kva_cache_stats st;
    row *r = rows_add(&t, "paged_hybrid_decode");
    kva_cache_get_stats(c[cfg], &st);
    rs(r, 0, "%s", hy_name[cfg]);
    rn(r, 1, (double)ctx);
    rn(r, 2, best[cfg] * 1e3);
    rn(r, 3, best[cfg] / best[HY_HYBRID]);
    rn(r, 4, (double)st.bytes_used / 1048576.0);
  }
  progress_end();
  print_table("Hybrid decode: one step over one period of Gemma 3 27B (5 sliding layers of window 1024, 1 global;\n"
              "32 query heads, 16 KV heads, head dim 128), F16, 1 thread, warm, best of the reps; the hybrid\n"
              "and the masked full cache must agree bit for bit",
              v, NV(v), &t, -1);
  text("hybrid cache output equal to the masked full cache's: %s\n",
       memcmp(out[HY_HYBRID], out[HY_MASKED], nq * sizeof(float) * (size_t)hm->period) == 0 ? "yes" : "NO");
  emit_rows(&t);
done:
  for (cfg = 0; cfg < NHY; cfg++) kva_cache_destroy(c[cfg]);
  for (cfg = 0; cfg < NHY; cfg++)
    if (out[cfg]) free(out[cfg]);
  free(q);
  rows_free(&t);
  pool_free();
}

void paged_hybrid(const opts *o, const machine *m) {
  (void)m;
  hybrid_memory(o);
  hybrid_decode(o);
}
