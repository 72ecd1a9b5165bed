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
    snprintf(r.msg, sizeof r.msg, "n/a (not yet)");
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

static size_t bpt_of(const model *mo, int var, kva_dtype dt, int n_layers) {
  kva_cache_desc d = variant_desc(mo, var, dt, n_layers);
  return kva_cache_bytes_per_token(&d);
}

static void fmt_bytes_h(double b, char *buf, size_t n) {
  if (b >= 1e9) snprintf(buf, n, "%.2f GB (%.2f GiB)", b / 1e9, b / GiB);
  else if (b >= 1e6) snprintf(buf, n, "%.2f MB (%.2f MiB)", b / 1e6, b / MiB);
  else fmt_sep(b, buf, n);
}

static void check_row(rows *t, const char *name, double expected, double got, const char *note) {
  row *w = rows_add(t, "check");
  int pass = fabs(expected - got) <= 1e-9 * fabs(expected) + 1e-12;
  rs(w, C_NAME, "%s", name);
  rn(w, C_EXPECTED, expected);
  rn(w, C_VALUE, got);
  rs(w, C_PASS, pass ? "PASS" : "FAIL");
  if (note) rs(w, C_NOTE, "%s", note);
  if (!pass) g_failed = 1;
}

/* FACTS.md figures, recomputed with the library. */
static void memory_checks(void) {
  rows t = {0};
  char note[160];
  const model *l70 = preset("Llama-3-70B"), *v2 = preset("DeepSeek-V2"), *v3 = preset("DeepSeek-V3");
  double b70 = (double)bpt_of(l70, V_GQA, KVA_F16, l70->L), mla = (double)bpt_of(v2, V_MLA, KVA_F16, 1),
         mha = (double)bpt_of(v2, V_MHA, KVA_F16, 1);
  check_row(&t, "Llama-2-7B MHA f16 bytes/token", 524288, (double)bpt_of(preset("Llama-2-7B"), V_MHA, KVA_F16, 32), NULL);
  check_row(&t, "Llama-2-70B GQA f16 bytes/token", 327680, (double)bpt_of(preset("Llama-2-70B"), V_GQA, KVA_F16, 80), NULL);
  check_row(&t, "Llama-3-8B GQA f16 bytes/token", 131072, (double)bpt_of(preset("Llama-3-8B"), V_GQA, KVA_F16, 32), NULL);
  check_row(&t, "Llama-3-70B GQA f16 bytes/token", 327680, b70, NULL);
  fmt_bytes_h(b70 * 131072, note, sizeof note);
  check_row(&t, "Llama-3-70B GQA f16 bytes at 131,072 tokens", 42949672960.0, b70 * 131072, note);
  check_row(&t, "Mistral-7B GQA f16 bytes/token", 131072, (double)bpt_of(preset("Mistral-7B"), V_GQA, KVA_F16, 32),
            "capped at 4096 tokens by the window");
  check_row(&t, "DeepSeek-V2 MLA f16 bytes/token", 69120, (double)bpt_of(v2, V_MLA, KVA_F16, v2->L), NULL);
  check_row(&t, "DeepSeek-V3 MLA f16 bytes/token", 70272, (double)bpt_of(v3, V_MLA, KVA_F16, v3->L), NULL);
  check_row(&t, "Llama-3-70B MHA values/token/layer", 16384, (double)bpt_of(l70, V_MHA, KVA_F32, 1) / 4, "32 KiB in f16");
  check_row(&t, "Llama-3-70B GQA values/token/layer", 2048, (double)bpt_of(l70, V_GQA, KVA_F32, 1) / 4, NULL);
  check_row(&t, "MLA values/token/layer (512 + 64)", 576, mla / 2, NULL);
  snprintf(note, sizeof note, "MLA/MHA = %.2f%%, %.1fx smaller (same 128 heads of 128)", 100 * mla / mha, mha / mla);
  check_row(&t, "MLA vs MHA, same heads: 1.76% (x1e4, rounded)", 176, floor(1e4 * mla / mha + 0.5), note);
  {
    static const vcol v[] = {{C_NAME, "FACTS.md check", FM_STR}, {C_EXPECTED, "expected", FM_SEP},
                             {C_VALUE, "kvattn", FM_SEP}, {C_PASS, "", FM_STR}, {C_NOTE, "note", FM_STR}};
    print_table("Checks against FACTS.md (computed with kva_cache_bytes_per_token)", v, NV(v), &t, -1);
  }
  emit_rows(&t);
  rows_free(&t);
}

/* The seed write-up's MHA/MQA/GQA/MLA comparison table and memory figures, corrected. */
static void memory_seed(void) {
  rows t = {0};
  char a[128], b[128];
  const model *l70 = preset("Llama-3-70B"), *v2 = preset("DeepSeek-V2");
  model l2mha = *preset("Llama-2-70B");
  double mha = (double)bpt_of(l70, V_MHA, KVA_F16, 1), mqa = (double)bpt_of(l70, V_MQA, KVA_F16, 1),
         gqa = (double)bpt_of(l70, V_GQA, KVA_F16, 1), mla = (double)bpt_of(l70, V_MLA, KVA_F16, 1),
         dmha = (double)bpt_of(v2, V_MHA, KVA_F16, 1), dmla = (double)bpt_of(v2, V_MLA, KVA_F16, 1),
         l2 = (double)bpt_of(&l2mha, V_MHA, KVA_F16, l2mha.L) * 4096,
         r70 = (double)bpt_of(l70, V_GQA, KVA_F16, l70->L) * 131072,
         i8 = (double)bpt_of(l70, V_GQA, KVA_INT8, 1);
  row *w;
#define SEED(where_, item, seed, verdict)                                                              \
  w = rows_add(&t, "seed");                                                                            \
  rs(w, C_WHERE, "%s", where_);                                                                        \
  rs(w, C_NAME, "%s", item);                                                                           \
  rs(w, C_EXPECTED, "%s", seed);                                                                       \
  rs(w, C_PASS, "%s", verdict)

  fmt_bytes_h(l2, a, sizeof a);
  SEED("l.97", "Llama-2-70B if MHA (64 KV heads), 4,096 tokens, f16", "10.7 GB", "right");
  rs(w, C_VALUE, "%s", a);
  fmt_bytes_h(l2 * 32, a, sizeof a);
  SEED("l.99", "the same, batch 32", "342.4 GB", "rounding");
  rs(w, C_VALUE, "%s", a);
  rs(w, C_NOTE, "10.7 x 32; exactly 320 GiB");
  SEED("l.326", "Llama-3-70B MHA (H=64), per token per layer", "16,384B", "WRONG");
  fmt_sep(mha, b, sizeof b);
  rs(w, C_VALUE, "16,384 values = %s B f16", b);
  rs(w, C_NOTE, "the seed counts values, not bytes");
  SEED("l.326", "Llama-3-70B MQA, per token per layer", "256B", "WRONG");
  rs(w, C_VALUE, "256 values = %.0f B f16", mqa);
  rs(w, C_NOTE, "values, not bytes");
  SEED("l.326", "Llama-3-70B GQA G=8, per token per layer", "2,048B", "WRONG");
  fmt_sep(gqa, b, sizeof b);
  rs(w, C_VALUE, "2,048 values = %s B f16", b);
  rs(w, C_NOTE, "values, not bytes");
  SEED("l.326", "Llama-3-70B MLA (latent 4D=512 + rope D/2=64)", "-", "missing");
  fmt_sep(mla, b, sizeof b);
  rs(w, C_VALUE, "576 values = %s B f16", b);
  SEED("l.327", "DeepSeek-V2 MHA (128 heads x 128), per token per layer", "163,840B", "WRONG");
  fmt_sep(dmha, b, sizeof b);
  rs(w, C_VALUE, "32,768 values = %s B f16", b);
  SEED("l.327", "DeepSeek-V2 MLA, per token per layer", "~4,608B", "WRONG");
  fmt_sep(dmla, b, sizeof b);
  rs(w, C_VALUE, "576 values = %s B f16", b);
  rs(w, C_NOTE, "4x too large");
  SEED("l.324", "per token per layer, in values: 2Hd_k, 2d_k, 2Gd_k, d_latent+d_rope", "(as stated)", "right");
  rs(w, C_VALUE, "the same; x2 for bytes in f16");
  rs(w, C_NOTE, "its example rows below forgot the x2");
  SEED("l.325", "MLA cache relative to MHA", "d_latent/(2*H*d_k)", "WRONG");
  rs(w, C_VALUE, "(d_latent+d_rope)/(2*H*d_k) = 576/32,768 = %.2f%%", 100 * dmla / dmha);
  rs(w, C_NOTE, "%.1fx smaller; the seed drops the shared rope key", dmha / dmla);
  SEED("l.318", "DeepSeek-V2 MLA saving vs MHA", "~93.7%", "WRONG");
  rs(w, C_VALUE, "%.2f%% smaller than MHA with the same heads", 100 * (1 - dmla / dmha));
  rs(w, C_NOTE, "DeepSeek's 93.3%% is against DeepSeek 67B and includes KV quantization: not MLA's ratio");
  fmt_bytes_h(r70, a, sizeof a);
  SEED("l.568", "Llama-3-70B GQA, one 128K (131,072) request, f16", "~33.5 GB", "WRONG");
  rs(w, C_VALUE, "%s", a);
  rs(w, C_NOTE, "2 x 80 x 8 x 131,072 x 128 x 2 B");
  fmt_bytes_h(r70 * 4, a, sizeof a);
  SEED("l.569", "the same, batch 4", "~134 GB", "WRONG");
  rs(w, C_VALUE, "%s", a);
  snprintf(b, sizeof b, "~%.0f GB", 140 + r70 * 4 / 1e9);
  SEED("l.570", "with ~140 GB of f16 weights", "~274 GB", "WRONG");
  rs(w, C_VALUE, "%s", b);
  rs(w, C_NOTE, "140 GB + 4 x 42.95 GB, before activations");
  SEED("l.342", "INT8 instead of f16 saves", "50%", "about");
  rs(w, C_VALUE, "%.1f%% (%.0f vs %.0f B per token per layer)", 100 * (1 - i8 / gqa), i8, gqa);
  rs(w, C_NOTE, "kvattn keeps one fp32 scale per token per KV head, separately for K and V");
  SEED("l.145", "MQA cache relative to MHA", "1/H", "right");
  rs(w, C_VALUE, "1/%d = %.2f%% for H=64", l70->H, 100 * mqa / mha);
#undef SEED
  {
    static const vcol v[] = {{C_WHERE, "seed", FM_STR}, {C_NAME, "figure", FM_STR},
                             {C_EXPECTED, "seed says", FM_STR}, {C_VALUE, "correct (kvattn)", FM_STR},
                             {C_PASS, "verdict", FM_STR}, {C_NOTE, "note", FM_STR}};
    print_table("The seed write-up's comparison table and memory figures, corrected "
                "(seed/kv-cache-optimization.txt, its line numbers)",
                v, NV(v), &t, -1);
  }
  emit_rows(&t);
  rows_free(&t);
}

const kva_dtype all_dtypes[6] = {KVA_F16, KVA_BF16, KVA_F32, KVA_INT8, KVA_FP8_E4M3, KVA_FP8_E5M2};

/* KV memory per sequence against context (for plot.gp; a small pivot in the table). */
void memory_curve(const opts *o) {
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
          rs(w, C_DTYPE, "%s", dtype_str(all_dtypes[di]));
          rn(w, C_CTX, (double)ctx);
          rn(w, C_BPT, (double)bpt);
          rn(w, C_BYTESCTX, (double)bpt * (double)held);
          rn(w, C_MEM, o->mem);
          if (ms[mi]->window) rn(w, C_WINDOW, ms[mi]->window);
        }
      }
    }
  if (g_fmt == OUT_TABLE && strcmp(o->cmd, "memory") == 0) {
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

void cmd_memory(const opts *o) {
  int mi, vi, di, ci;
  rows t = {0};
  char note[160];
  for (ci = 0; ci < o->n_ctx; ci++) {
    long ctx = o->ctx[ci];
    for (mi = 0; mi < o->n_models; mi++) {
      const model *mo = &o->models[mi];
      size_t mha_bpt[8];
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
          row *w = rows_add(&t, "memory");
          rs(w, C_MODEL, "%s", mo->name);
          rs(w, C_VARIANT, "%s%s", variant_name[var], var == mo->native ? "*" : "");
          rs(w, C_DTYPE, "%s", dtype_str(dt));
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
          if (ac.supported) rn(w, C_PAD, (double)ac.pad);
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
  if (g_fmt == OUT_TABLE) {
    char title[800], mem[64], ctxs[32];
    static const vcol v[] = {{C_MODEL, "model", FM_STR},      {C_VARIANT, "variant", FM_STR},
                             {C_KVHEADS, "G", FM_INT},        {C_HEADDIM, "K dim", FM_INT},
                             {C_DTYPE, "dtype", FM_STR},      {C_BPTL, "B/tok/layer", FM_SEP},
                             {C_BPT, "B/token", FM_SEP},      {C_VSMHA, "vs MHA", FM_PCT},
                             {C_CTX, "ctx", FM_SEP},          {C_BYTESCTX, "GB @ctx*batch", FM_GB},
                             {C_MAXCTX, "max ctx", FM_TOK},   {C_MAXBATCH, "max batch", FM_SEP},
                             {C_ALLOC, "allocator", FM_STR},  {C_NOTE, "note", FM_STR}};
    fmt_sep((double)o->ctx[0], ctxs, sizeof ctxs);
    snprintf(mem, sizeof mem, "%.2f GiB = %.2f GB", o->mem / GiB, o->mem / 1e9);
    snprintf(title, sizeof title,
             "KV cache memory (all layers, K+V incl. scales; * = the model's own attention), batch %ld, budget %s\n"
             "  max ctx = longest context per sequence for the batch, max batch = sequences at ctx, both in a pool\n"
             "  of --mem made of 16-token blocks (bookkeeping comes on top); allocator = a real 2-layer cache of\n"
             "  4 blocks: block bytes == B/tok/layer x 16 per layer (+ 64-byte alignment padding), exactly 4\n"
             "  blocks' tokens fit. MLA for non-MLA models: latent 4D + rope D/2, one latent head.",
             o->batch, mem);
    print_table(title, v, NV(v), &t, C_MODEL);
  }
  emit_rows(&t);
  rows_free(&t);
  memory_checks();
  memory_seed();
  memory_curve(o);
}
