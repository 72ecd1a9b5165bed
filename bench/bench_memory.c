/* bench/bench_memory.c - kvattn_bench memory: bytes per token of MHA / GQA / MQA / MLA for every
   model preset and storage dtype, checked against a real cache; the presets against their
   published configurations; KV memory against context. */
#include "harness.h"

/* the cache description of one variant of a model */
static kva_cache_desc variant_desc(const model *mo, int var, kva_dtype dt, int n_layers) {
  kva_cache_desc d;
  memset(&d, 0, sizeof d);
  d.n_layers = n_layers;
  d.dtype = dt;
  d.k_scale = d.v_scale = 1.0f; /* FP8 needs a stated scale; 1.0 here (bytes do not depend on it) */
  switch (var) {
    case V_MHA: d.n_kv_heads = mo->H; d.head_dim = mo->D; break;
    case V_GQA: d.n_kv_heads = mo->G ? mo->G : 8; d.head_dim = mo->D; break;
    case V_MQA: d.n_kv_heads = 1; d.head_dim = mo->D; break;
    default: {
      int lat = mo->latent ? mo->latent : 4 * mo->D, rope = mo->latent ? mo->rope : mo->D / 2;
      d.kind = KVA_CACHE_LATENT;
      d.n_kv_heads = 1;
      d.head_dim = lat + rope;
      d.v_dim = lat;
    }
  }
  return d;
}

typedef struct {
  size_t block_bytes_full; /* one block of the whole model, as the allocator lays it out */
  size_t pad;              /* per layer block */
  int supported;
  char msg[96];
} alloc_check;

/* Allocate a small real cache (2 layers, 4 blocks of 16) and compare. */
static alloc_check check_alloc(const model *mo, int var, kva_dtype dt, size_t bpt_layer) {
  alloc_check r;
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_cache_stats s;
  kva_status st;
  int nl = mo->L < 2 ? mo->L : 2, bs = 16, seq = 0;
  memset(&r, 0, sizeof r);
  d = variant_desc(mo, var, dt, nl);
  d.block_size = bs;
  d.n_blocks = 4;
  d.max_seqs = 1;
  st = kva_cache_create(&d, &c);
  if (st == KVA_ERR_UNSUPPORTED) {
    snprintf(r.msg, sizeof r.msg, "unsupported");
    r.block_bytes_full = (size_t)mo->L * ((bpt_layer * (size_t)bs + 63) / 64 * 64);
    return r;
  }
  if (st != KVA_OK) {
    snprintf(r.msg, sizeof r.msg, "ERROR create: %s", kva_status_str(st));
    g_failed = 1;
    return r;
  }
  r.supported = 1;
  kva_cache_get_stats(c, &s);
  {
    size_t want = bpt_layer * (size_t)nl * (size_t)bs;
    size_t per_layer = s.block_bytes / (size_t)nl;
    int ok = s.block_bytes >= want && s.block_bytes - want < (size_t)64 * (size_t)nl &&
             s.block_bytes % (size_t)nl == 0 && s.bytes_total == 4 * s.block_bytes;
    kva_status a1 = kva_seq_new(c, &seq), a2 = kva_seq_append(c, seq, 4 * bs), a3 = kva_seq_append(c, seq, 1);
    if (a1 != KVA_OK || a2 != KVA_OK || a3 != KVA_ERR_FULL) ok = 0;
    r.pad = per_layer - bpt_layer * (size_t)bs;
    r.block_bytes_full = per_layer * (size_t)mo->L;
    if (!ok) {
      snprintf(r.msg, sizeof r.msg, "MISMATCH block %zu B, want %zu B", s.block_bytes, want);
      g_failed = 1;
    } else if (r.pad) snprintf(r.msg, sizeof r.msg, "ok, pad %zu B/block/layer", r.pad);
    else snprintf(r.msg, sizeof r.msg, "ok");
  }
  kva_cache_destroy(c);
  return r;
}

/* Bookkeeping bytes per token slot of a whole-model cache whose pool is
   floor(mem / block bytes) 16-token blocks: kva_cache_size (the allocator's
   own figure, through a counting alloc_fn so no 64 alignment bytes) less the
   pool. lean: no eviction support (no positions or scores) and tables sized
   to ctx tokens per sequence; else the defaults (256 sequences, every table
   n_blocks long, positions and H2O scores). -1 if it cannot be sized. */
static void *meta_alloc(size_t size, size_t align, void *user) { (void)size, (void)align, (void)user; return NULL; }
static void meta_free(void *p, size_t size, void *user) { (void)p, (void)size, (void)user; }
static double meta_per_token(const model *mo, int var, kva_dtype dt, double mem, size_t block_bytes_full, long ctx,
                             int lean) {
  kva_cache_desc d = variant_desc(mo, var, dt, mo->L);
  size_t bytes = 0;
  double nb = floor(mem / (double)block_bytes_full);
  if (nb < 1 || nb > (double)(INT32_MAX / 4)) return -1;
  d.block_size = 16;
  d.n_blocks = (int)nb;
  d.alloc_fn = meta_alloc, d.free_fn = meta_free; /* sized, never created */
  if (lean) {
    d.evict_support = KVA_EVICT_SUPPORT_NONE;
    d.max_seq_len = ctx > INT32_MAX ? INT32_MAX : (int)ctx;
  }
  if (kva_cache_size(&d, &bytes) != KVA_OK) return -1;
  return ((double)bytes - nb * (double)block_bytes_full) / (nb * 16.0);
}

static size_t bpt_of(const model *mo, int var, kva_dtype dt, int n_layers) {
  kva_cache_desc d = variant_desc(mo, var, dt, n_layers);
  return kva_cache_bytes_per_token(&d);
}

/* The presets against their published configurations: the bytes per token (K and V of every
   layer, f16 = 2 bytes) each model's published config.json implies, against what the library
   computes from the presets (kva_cache_bytes_per_token). Expected figures are written out from
   the configurations, not taken from presets[]:
     K+V caches: 2 x num_hidden_layers x num_key_value_heads x head dim x 2 B
     MLA caches one latent (kv_lora_rank) and one shared rope key (qk_rope_head_dim) per layer:
       num_hidden_layers x (kv_lora_rank + qk_rope_head_dim) x 2 B
   and the ratio the DeepSeek-V2 paper (arXiv:2405.04434, Table 1) gives for MLA's cache against
   MHA with the same heads: (d_c + d_h^R) / (2 n_h d_h) = (512 + 64) / (2 x 128 x 128) = 1.76%. */
typedef struct {
  const char *name, *model, *source;
  int var, layers; /* layers 1: per layer */
  kva_dtype dt;
  double expected, div; /* the library's bytes / div against expected */
  const char *note;
} preset_check;

static const preset_check preset_checks[] = {
    {"Llama-2-7B MHA f16 bytes/token", "Llama-2-7B", "meta-llama/Llama-2-7b-hf config.json: 32 layers, 32 KV heads x 128",
     V_MHA, 0, KVA_F16, 2.0 * 32 * 32 * 128 * 2, 1, NULL},
    {"Llama-2-70B GQA f16 bytes/token", "Llama-2-70B", "meta-llama/Llama-2-70b-hf config.json: 80 layers, 8 KV heads x 128",
     V_GQA, 0, KVA_F16, 2.0 * 80 * 8 * 128 * 2, 1, NULL},
    {"Llama-3-8B GQA f16 bytes/token", "Llama-3-8B", "meta-llama/Meta-Llama-3-8B config.json: 32 layers, 8 KV heads x 128",
     V_GQA, 0, KVA_F16, 2.0 * 32 * 8 * 128 * 2, 1, NULL},
    {"Llama-3-70B GQA f16 bytes/token", "Llama-3-70B", "meta-llama/Meta-Llama-3-70B config.json: 80 layers, 8 KV heads x 128",
     V_GQA, 0, KVA_F16, 2.0 * 80 * 8 * 128 * 2, 1, NULL},
    {"Llama-3-70B GQA f16 bytes at 131,072 tokens", "Llama-3-70B", "the same x 131,072 tokens",
     V_GQA, 0, KVA_F16, 2.0 * 80 * 8 * 128 * 2 * 131072, 1.0 / 131072, "42.95 GB (40.00 GiB) per sequence"},
    {"Mistral-7B GQA f16 bytes/token", "Mistral-7B", "mistralai/Mistral-7B-v0.1 config.json: 32 layers, 8 KV heads x 128",
     V_GQA, 0, KVA_F16, 2.0 * 32 * 8 * 128 * 2, 1, "held for at most 4,096 tokens (sliding_window)"},
    {"DeepSeek-V2 MLA f16 bytes/token", "DeepSeek-V2", "deepseek-ai/DeepSeek-V2 config.json: 60 layers, latent 512 + rope 64",
     V_MLA, 0, KVA_F16, 60.0 * (512 + 64) * 2, 1, NULL},
    {"DeepSeek-V3 MLA f16 bytes/token", "DeepSeek-V3", "deepseek-ai/DeepSeek-V3 config.json: 61 layers, latent 512 + rope 64",
     V_MLA, 0, KVA_F16, 61.0 * (512 + 64) * 2, 1, NULL},
    {"Llama-3-70B MHA values/token/layer", "Llama-3-70B", "64 heads x 128, K and V: 2 x 64 x 128",
     V_MHA, 1, KVA_F32, 2.0 * 64 * 128, 4, "32 KiB in f16"},
    {"Llama-3-70B GQA values/token/layer", "Llama-3-70B", "8 KV heads x 128, K and V: 2 x 8 x 128",
     V_GQA, 1, KVA_F32, 2.0 * 8 * 128, 4, NULL},
    {"DeepSeek-V2 MLA values/token/layer", "DeepSeek-V2", "kv_lora_rank + qk_rope_head_dim = 512 + 64",
     V_MLA, 1, KVA_F16, 512 + 64, 2, NULL},
};

/* Runs the checks; table: the full table (memory), else one line (summary). Rows: section check. */
static void memory_checks(int table) {
  rows t = {0};
  int i, n_pass = 0;
  char note[200];
  for (i = 0; i < NV(preset_checks); i++) {
    const preset_check *c = &preset_checks[i];
    const model *mo = preset(c->model);
    row *w = rows_add(&t, "check");
    double got = mo ? (double)bpt_of(mo, c->var, c->dt, c->layers ? c->layers : mo->L) / c->div : -1;
    int pass = fabs(c->expected - got) <= 1e-9 * fabs(c->expected);
    rs(w, C_NAME, "%s", c->name);
    rs(w, C_SOURCE, "%s", c->source);
    rn(w, C_EXPECTED, c->expected);
    rn(w, C_VALUE, got);
    rs(w, C_PASS, pass ? "PASS" : "FAIL");
    if (c->note) rs(w, C_NOTE, "%s", c->note);
    n_pass += pass;
    if (!pass) g_failed = 1;
  }
  {
    /* MLA against MHA with the same heads (DeepSeek-V2: 128 heads of 128), per layer */
    const model *v2 = preset("DeepSeek-V2");
    double mla = (double)bpt_of(v2, V_MLA, KVA_F16, 1), mha = (double)bpt_of(v2, V_MHA, KVA_F16, 1),
           got = floor(1e4 * mla / mha + 0.5);
    row *w = rows_add(&t, "check");
    int pass = got == 176;
    rs(w, C_NAME, "MLA vs MHA, same heads: 1.76%% (x1e4, rounded)");
    rs(w, C_SOURCE, "DeepSeek-V2 paper (arXiv:2405.04434) Table 1: (d_c + d_h^R) / (2 n_h d_h)");
    rn(w, C_EXPECTED, 176);
    rn(w, C_VALUE, got);
    rs(w, C_PASS, pass ? "PASS" : "FAIL");
    snprintf(note, sizeof note, "MLA/MHA = %.2f%%, %.1fx smaller", 100 * mla / mha, mha / mla);
    rs(w, C_NOTE, "%s", note);
    n_pass += pass;
    if (!pass) g_failed = 1;
  }
  if (table) {
    static const vcol v[] = {{C_NAME, "figure", FM_STR}, {C_EXPECTED, "published", FM_SEP},
                             {C_VALUE, "kvattn", FM_SEP}, {C_PASS, "", FM_STR}, {C_SOURCE, "source", FM_STR},
                             {C_NOTE, "note", FM_STR}};
    print_table("Model presets vs published configurations (bytes from kva_cache_bytes_per_token)", v, NV(v), &t, -1);
  } else
    text("Model presets vs published configurations (config.json; DeepSeek-V2 paper): %d of %d figures match%s\n",
         n_pass, t.n, n_pass == t.n ? "" : " -- FAIL (kvattn_bench memory lists them)");
  emit_rows(&t);
  rows_free(&t);
}

const kva_dtype all_dtypes[N_ALL_DTYPES] = {KVA_F16, KVA_BF16, KVA_F32, KVA_INT8, KVA_INT4, KVA_FP8_E4M3, KVA_FP8_E5M2};

/* KV memory per sequence against context (for plot.gp); show: also a small pivot in the table */
void memory_curve(const opts *o, int show) {
  rows t = {0};
  const model *ms[2];
  int vars_for[2] = {NVARIANT, 1};
  int mi, vi, di, k;
  ms[0] = preset("Llama-3-70B");
  ms[1] = preset("Mistral-7B");
  for (mi = 0; mi < 2; mi++)
    for (vi = 0; vi < vars_for[mi]; vi++) {
      int var = mi == 0 ? vi : V_GQA;
      for (di = 0; di < NV(all_dtypes); di++) {
        size_t bpt = bpt_of(ms[mi], var, all_dtypes[di], ms[mi]->L);
        for (k = 10; k <= 20; k++) {
          long ctx = 1L << k, held = ms[mi]->window && ctx > ms[mi]->window ? ms[mi]->window : ctx;
          row *w = rows_add(&t, "memcurve");
          rs(w, C_MODEL, "%s", ms[mi]->name);
          rs(w, C_VARIANT, "%s", variant_name[var]);
          rs(w, C_DTYPE, "%s", kva_dtype_name(all_dtypes[di]));
          rn(w, C_CTX, (double)ctx);
          rn(w, C_BPT, (double)bpt);
          rn(w, C_BYTESCTX, (double)bpt * (double)held);
          rn(w, C_MEM, o->mem);
          if (ms[mi]->window) rn(w, C_WINDOW, ms[mi]->window);
        }
      }
    }
  if (g_fmt == OUT_TABLE && show) {
    /* pivot: rows = series, columns = context; f16 variants and the GQA dtypes */
    int i;
    text("\nKV cache per sequence (GiB) against context: Llama-3-70B variants (f16 and the GQA dtypes),\n"
         "Mistral-7B GQA f16 (capped by its 4096-token window)\n");
    text("%-26s", "series");
    for (k = 10; k <= 20; k++) text(" %7ldK", (1L << k) / 1024);
    text("\n");
    for (i = 0; i < t.n; i += 11) {
      const row *r = &t.r[i];
      char name[64];
      int show = (!strcmp(r->str[C_DTYPE], "f16")) ||
                 (!strcmp(r->str[C_MODEL], "Llama-3-70B") && !strcmp(r->str[C_VARIANT], "GQA"));
      if (!show) continue;
      snprintf(name, sizeof name, "%s %s %s", r->str[C_MODEL], r->str[C_VARIANT], r->str[C_DTYPE]);
      text("%-26s", name);
      for (k = 0; k < 11; k++) {
        double g = t.r[i + k].num[C_BYTESCTX] / GiB;
        text(g < 10 ? " %8.3f" : g < 100 ? " %8.2f" : " %8.1f", g);
      }
      text("\n");
    }
  }
  emit_rows(&t);
  rows_free(&t);
}

/* the memory rows: every context, model, variant and dtype of o */
static void memory_rows(const opts *o, rows *t) {
  int mi, vi, di, ci;
  char note[160];
  for (ci = 0; ci < o->n_ctx; ci++) {
    long ctx = o->ctx[ci];
    for (mi = 0; mi < o->n_models; mi++) {
      const model *mo = &o->models[mi];
      size_t mha_bpt[MAXL];
      for (di = 0; di < o->n_dtypes; di++) mha_bpt[di] = bpt_of(mo, V_MHA, o->dtypes[di], mo->L);
      for (vi = 0; vi < o->n_variants; vi++) {
        int var = o->variants[vi];
        if (var == V_GQA && mo->G && (mo->G == mo->H || mo->G == 1)) continue; /* same as MHA / MQA */
        for (di = 0; di < o->n_dtypes; di++) {
          kva_dtype dt = o->dtypes[di];
          size_t bptl = bpt_of(mo, var, dt, 1), bpt = bpt_of(mo, var, dt, mo->L);
          kva_cache_desc d = variant_desc(mo, var, dt, 1);
          alloc_check ac = check_alloc(mo, var, dt, bptl);
          long held = mo->window && ctx > mo->window ? mo->window : ctx;
          double nblocks = floor(o->mem / (double)ac.block_bytes_full), per_seq_blocks;
          row *w = rows_add(t, "memory");
          rs(w, C_MODEL, "%s", mo->name);
          rs(w, C_VARIANT, "%s%s", variant_name[var], var == mo->native ? "*" : "");
          rs(w, C_DTYPE, "%s", kva_dtype_name(dt));
          rn(w, C_LAYERS, mo->L);
          rn(w, C_HEADS, mo->H);
          rn(w, C_KVHEADS, d.n_kv_heads);
          rn(w, C_HEADDIM, d.head_dim);
          rn(w, C_VDIM, d.v_dim ? d.v_dim : d.head_dim);
          if (mo->window) rn(w, C_WINDOW, mo->window);
          rn(w, C_CTX, (double)ctx);
          rn(w, C_BATCH, (double)o->batch);
          rn(w, C_BPTL, (double)bptl);
          rn(w, C_BPT, (double)bpt);
          rn(w, C_VSMHA, (double)bpt / (double)mha_bpt[di]);
          rn(w, C_BYTESCTX, (double)bpt * (double)held * (double)o->batch);
          rn(w, C_MEM, o->mem);
          /* what fits: the pool the allocator would make of --mem (n_blocks = mem / block bytes) */
          if (mo->window && (double)o->batch * ceil((double)mo->window / 16) <= nblocks)
            rn(w, C_MAXCTX, -1); /* the window caps what a sequence holds */
          else rn(w, C_MAXCTX, floor(nblocks / (double)o->batch) * 16);
          per_seq_blocks = ceil((double)held / 16);
          rn(w, C_MAXBATCH, floor(nblocks / per_seq_blocks));
          rs(w, C_ALLOC, "%s", ac.msg);
          if (ac.supported) {
            double meta = meta_per_token(mo, var, dt, o->mem, ac.block_bytes_full, held, 0);
            double lean = meta_per_token(mo, var, dt, o->mem, ac.block_bytes_full, held, 1);
            kva_cache_desc db = variant_desc(mo, var, dt, mo->L);
            db.block_size = 16, db.block_bounds = 1;
            rn(w, C_PAD, (double)ac.pad);
            /* kva_cache_desc.block_bounds (block selection): the keys' F16 minimum and maximum per block */
            rn(w, C_BOUNDSPT, (double)kva_cache_bytes_per_token(&db) - (double)bpt);
            if (var != V_MLA) { /* kva_cache_desc.demote_dtype: a token eviction keeps at INT4, from a real cache */
              kva_cache_desc dd = variant_desc(mo, var, dt, mo->L);
              kva_cache *dc;
              dd.block_size = 16, dd.n_blocks = 1, dd.max_seqs = 1, dd.demote_dtype = KVA_INT4;
              if (kva_cache_create(&dd, &dc) == KVA_OK) {
                kva_cache_stats cst;
                kva_cache_get_stats(dc, &cst);
                rn(w, C_DEMOTEPT, (double)cst.demote_block_bytes / 16.0);
                kva_cache_destroy(dc);
              }
            }
            if (meta >= 0) rn(w, C_METAPT, meta);
            if (lean >= 0) rn(w, C_METALEAN, lean);
          }
          note[0] = 0;
          if (mo->window && ctx > mo->window)
            snprintf(note, sizeof note, "window %d: holds %d tokens (needs KVA_EVICT_WINDOW; else %.2f GB)", mo->window,
                     mo->window, (double)bpt * (double)ctx * (double)o->batch / 1e9);
          else if (var == V_GQA && !mo->G) snprintf(note, sizeof note, "not in the model: G=8 for comparison");
          else if (var == V_MLA && !mo->latent)
            snprintf(note, sizeof note, "DeepSeek's ratios: latent %d + rope %d", 4 * mo->D, mo->D / 2);
          if (note[0]) rs(w, C_NOTE, "%s", note);
        }
      }
    }
  }
}

void cmd_memory(const opts *o) {
  rows t = {0};
  memory_rows(o, &t);
  if (g_fmt == OUT_TABLE) {
    char title[2048], mem[64], ctxs[32];
    static const vcol v[] = {{C_MODEL, "model", FM_STR},      {C_VARIANT, "variant", FM_STR},
                             {C_KVHEADS, "G", FM_INT},        {C_HEADDIM, "K dim", FM_INT},
                             {C_DTYPE, "dtype", FM_STR},      {C_BPTL, "B/tok/layer", FM_SEP},
                             {C_BPT, "B/token", FM_SEP},      {C_VSMHA, "vs MHA", FM_PCT},
                             {C_CTX, "ctx", FM_SEP},          {C_BYTESCTX, "GB @ctx*batch", FM_GB},
                             {C_MAXCTX, "max ctx", FM_TOK},   {C_MAXBATCH, "max batch", FM_SEP},
                             {C_METAPT, "meta B/tok", FM_F1}, {C_METALEAN, "lean", FM_F1},
                             {C_BOUNDSPT, "bounds B/tok", FM_F1}, {C_DEMOTEPT, "demoted int4 B/tok", FM_F1},
                             {C_ALLOC, "allocator", FM_STR},  {C_NOTE, "note", FM_STR}};
    fmt_sep((double)o->ctx[0], ctxs, sizeof ctxs);
    snprintf(mem, sizeof mem, "%.2f GiB = %.2f GB", o->mem / GiB, o->mem / 1e9);
    snprintf(title, sizeof title,
             "KV cache memory (all layers, K+V incl. scales; * = the model's own attention), batch %ld, budget %s\n"
             "  max ctx = longest context per sequence for the batch, max batch = sequences at ctx, both in a pool\n"
             "  of --mem made of 16-token blocks (bookkeeping comes on top); meta B/tok = the cache's bookkeeping\n"
             "  per token slot of that pool, from kva_cache_size (defaults: 256 sequences, tables of n_blocks, positions\n"
             "  and H2O scores); lean = evict_support NONE and max_seq_len = ctx; bounds B/tok = what block_bounds\n"
             "  adds for block selection (an F16 minimum and maximum per channel, per block of 16 and KV head);\n"
             "  demoted int4 B/tok = a token eviction keeps at INT4 (demote_dtype: its rows and a position per\n"
             "  layer and KV head, from a real cache's kva_cache_stats.demote_block_bytes);\n"
             "  allocator = a real 2-layer cache of 4 blocks: block bytes == B/tok/layer x 16 per layer (+ 64-byte\n"
             "  alignment padding), exactly 4 blocks' tokens fit. MLA for non-MLA models: latent 4D + rope D/2, one\n"
             "  latent head.",
             o->batch, mem);
    print_table(title, v, NV(v), &t, C_MODEL);
  }
  emit_rows(&t);
  rows_free(&t);
  memory_checks(1);
  memory_curve(o, 1);
}

/* The summary's memory table: per preset and variant, bytes per token and GB at the first --ctx
   in f16, int8, int4 and fp8 (E4M3; E5M2 takes the same bytes), from the memory rows (every dtype
   of o goes to CSV / JSON); then the preset checks in one line. */
void memory_summary(const opts *o) {
  enum { NCOLS = 4 };
  static const kva_dtype cols[NCOLS] = {KVA_F16, KVA_INT8, KVA_INT4, KVA_FP8_E4M3};
  /* the display rows use these columns as slots: B/token and GB at ctx of f16, int8, int4, fp8 */
  static const int c_bpt[NCOLS] = {C_BPT, C_BPTL, C_BPEAK, C_BUSED}, c_gb[NCOLS] = {C_BYTESCTX, C_KVBYTES, C_BCACHED, C_BNEED};
  static const vcol v_full[] = {{C_MODEL, "model", FM_STR},     {C_VARIANT, "variant", FM_STR},
                                {C_KVHEADS, "KV heads", FM_INT}, {C_VALUE, "values/layer", FM_SEP},
                                {C_BPT, "f16 B/token", FM_SEP}, {C_BYTESCTX, "GB", FM_GB},
                                {C_BPTL, "int8 B/token", FM_SEP}, {C_KVBYTES, "GB", FM_GB},
                                {C_BPEAK, "int4 B/token", FM_SEP}, {C_BCACHED, "GB", FM_GB},
                                {C_BUSED, "fp8 B/token", FM_SEP}, {C_BNEED, "GB", FM_GB},
                                {C_VSMHA, "vs MHA", FM_PCT},    {C_NOTE, "note", FM_STR}};
  /* one screen: the bytes per token in f16, the GB of a sequence in each dtype */
  static const vcol v_screen[] = {{C_MODEL, "model", FM_STR},      {C_VARIANT, "variant", FM_STR},
                                  {C_KVHEADS, "KV heads", FM_INT}, {C_BPT, "f16 B/token", FM_SEP},
                                  {C_BYTESCTX, "f16 GB", FM_GB},   {C_KVBYTES, "int8 GB", FM_GB},
                                  {C_BCACHED, "int4 GB", FM_GB},   {C_BNEED, "fp8 GB", FM_GB},
                                  {C_VSMHA, "vs MHA", FM_PCT},     {C_NOTE, "note", FM_STR}};
  /* one screen: a model of each kind (GQA small and large, a sliding window, MLA) */
  static const char *const screen_models[] = {"Llama-3-8B", "Llama-3-70B", "Mistral-7B", "DeepSeek-V3"};
  rows t = {0}, d = {0};
  int i, k;
  memory_rows(o, &t);
  if (g_fmt == OUT_TABLE) {
    char title[800], ctxs[32];
    for (i = 0; i < t.n; i++) {
      const row *r = &t.r[i];
      row *w;
      int same_model, shown = o->full;
      if (r->num[C_CTX] != (double)o->ctx[0]) continue;
      for (k = 0; k < (int)(sizeof screen_models / sizeof screen_models[0]); k++)
        shown |= !strcmp(r->str[C_MODEL], screen_models[k]);
      if (!shown) continue;
      /* a new display row at the first dtype row of each (model, variant) */
      if (d.n && !strcmp(d.r[d.n - 1].str[C_SECTION], r->str[C_MODEL]) && !strcmp(d.r[d.n - 1].str[C_VARIANT], r->str[C_VARIANT]))
        w = &d.r[d.n - 1];
      else {
        same_model = d.n && !strcmp(d.r[d.n - 1].str[C_SECTION], r->str[C_MODEL]);
        w = rows_add(&d, r->str[C_MODEL]); /* the section slot keeps the model name */
        if (!same_model) rs(w, C_MODEL, "%s", r->str[C_MODEL]);
        rs(w, C_VARIANT, "%s", r->str[C_VARIANT]);
        rn(w, C_KVHEADS, r->num[C_KVHEADS]);
        /* values cached per token and layer: K and V of every KV head, or MLA's one latent + rope key */
        rn(w, C_VALUE, strncmp(r->str[C_VARIANT], "MLA", 3) ? 2 * r->num[C_KVHEADS] * r->num[C_HEADDIM]
                                                            : r->num[C_HEADDIM]);
      }
      for (k = 0; k < NCOLS; k++)
        if (!strcmp(r->str[C_DTYPE], kva_dtype_name(cols[k]))) {
          rn(w, c_bpt[k], r->num[C_BPT]);
          rn(w, c_gb[k], r->num[C_BYTESCTX]);
          if (k == 0) rn(w, C_VSMHA, r->num[C_VSMHA]);
        }
      /* a short note: the window, a variant the model does not have, a failed allocator check */
      if (r->kind[C_ALLOC] == 2 && strncmp(r->str[C_ALLOC], "ok", 2) != 0)
        rs(w, C_NOTE, "%s %s", r->str[C_DTYPE], r->str[C_ALLOC]);
      else if (w->kind[C_NOTE] != 2 && r->kind[C_WINDOW] == 1 && r->num[C_CTX] > r->num[C_WINDOW]) {
        char win[32];
        fmt_sep(r->num[C_WINDOW], win, sizeof win);
        rs(w, C_NOTE, o->full ? "sliding window: holds %s tokens" : "window %s", win);
      } else if (w->kind[C_NOTE] != 2 && r->kind[C_NOTE] == 2 && strstr(r->str[C_NOTE], "not in the model"))
        rs(w, C_NOTE, o->full ? "not in the model" : "not in model");
    }
    fmt_sep((double)o->ctx[0], ctxs, sizeof ctxs);
    snprintf(title, sizeof title,
             "KV cache per token, all layers (K+V; int8 with its scale per row, int4 with a scale and a minimum\n"
             "  per 32 values), each model's own attention (*) and the variants; GB = one sequence of %s\n"
             "  tokens. From kva_cache_bytes_per_token, checked on a real cache (kva_cache_get_stats). MLA of a\n"
             "  non-MLA model: latent 4D + rope D/2. fp8 = E4M3 or E5M2%s",
             ctxs, o->full ? "" : ". --full: every preset, B/token per dtype");
    if (o->full) print_table(title, v_full, NV(v_full), &d, -1);
    else print_table(title, v_screen, NV(v_screen), &d, -1);
  }
  emit_rows(&t);
  rows_free(&t);
  rows_free(&d);
  memory_checks(0);
  memory_curve(o, 0);
}
