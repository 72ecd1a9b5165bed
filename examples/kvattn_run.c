/* kvattn_run: llama2.c's `run` with kvattn underneath.  The same command
   line and the same text on stdout (swap the binaries), plus KV-cache
   storage types, eviction, perplexity, continuous batching and timings.

     kvattn_run model.bin -z tokenizer.bin -i "Once upon a time" -t 0
     kvattn_run model.bin --kv-dtype f32,f16,int8,fp8_e4m3 --ppl heldout.txt
     kvattn_run model.bin --serve prompts.txt -t 0 --max-batch 4

   The decoder is examples/llm.h; this file is the command line, the
   generation and chat loops (`run`'s semantics), --ppl and --serve.
   `kvattn_run --help` lists every option. */
#include "llm.h"
#include "needle.h"
#include "tier_dir.h"
#ifdef KVATTN_RUN_REDIS /* make kvattn_run_redis: --prefix-redis (hiredis) */
#include "redis/tier_redis.h"
#endif

#define MAX_CONFIGS 64

/* ======================================================================
   options
   ====================================================================== */

/* PYRAMID and ADAKV: SnapKV's scores and prompt compression, with PyramidKV's layer budgets or Ada-KV's
   heads sharing a layer's budget (kva_evict.layer_weight, share_heads) */
enum { SCORER_NONE = 0, SCORER_TOVA, SCORER_SNAPKV, SCORER_KNORM, SCORER_PYRAMID, SCORER_ADAKV };
#define PYRAMID_BETA 20.0f /* PyramidKV's code's default: the last layer keeps 1/20 of the average */
typedef struct {
  kva_evict_kind kind;
  double budget;   /* tokens, or a percentage when pct */
  int pct, sinks, recent; /* recent < 0: budget / 2 (H2O) */
  int scorer, window, pool; /* KVA_EVICT_SCORE: which; SnapKV's observation window and pooling */
  kva_dtype demote;        /* --demote: the evicted tokens kept in this type (DEFAULT: deleted) */
  int demote_budget;       /* and at most this many of them (0: no bound but the pool) */
  char text[64];
} evict_spec;

typedef struct {
  const char *checkpoint, *tokenizer, *prompt, *system, *mode;
  float temperature, topp;
  unsigned long long seed;
  int steps;
  int steps_given; /* -n was on the command line */
  kva_dtype dtypes[MAX_CONFIGS];
  int n_dtypes;
  kva_dtype k_dtype, v_dtype; /* DEFAULT: not given */
  const char *layer_spec;
  evict_spec evict[MAX_CONFIGS];
  int n_evict;
  float fp8_k, fp8_v; /* 0: not given */
  const char *fp8_calib;
  int threads, block_size, chunk, max_batch, kv_blocks;
  int int_scores, int_values, rotate; /* kva_attn.int_scores, int_values; kva_cache_desc.rotate */
  kva_dtype demote;                   /* --demote TYPE (DEFAULT: none) */
  const char *prefix_dir;             /* --prefix-dir: --serve's prefix tier in a directory */
  const char *prefix_redis;           /* --prefix-redis HOST:PORT: --serve's prefix tier in Redis */
  int demote_budget;                  /* --demote TYPE:MAX */
  int select_budget, select_sink, select_recent; /* kva_attn.select_*; the cache keeps block bounds */
  const char *ppl, *ppl_tokens, *serve, *logits_tokens, *needle;
} options;

static const char *prog = "kvattn_run";

static void die(const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "%s: ", prog);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  exit(1);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: %s CHECKPOINT [options]\n"
          "A Llama-architecture model (llama2.c checkpoint: legacy, or \"ak42\" version 1 float32 /\n"
          "version 2 int8) with kvattn's RoPE, paged KV cache and attention.  llama2.c `run` options:\n"
          "  -t T          temperature, 0 = greedy (default 1.0)\n"
          "  -p P          top-p (nucleus) sampling in (0,1); other values sample the whole\n"
          "                distribution (default 0.9)\n"
          "  -s N          random seed (default: the time)\n"
          "  -n N          steps: positions including the prompt, 0.. (default 256; 0 = seq_len; more than\n"
          "                seq_len runs seq_len, with a note)\n"
          "  -i TEXT       prompt\n"
          "  -z FILE       tokenizer (default tokenizer.bin)\n"
          "  -m MODE       generate (default) or chat (Llama-2 [INST] template, reads turns on stdin)\n"
          "  -y TEXT       system prompt (chat; with --serve, text put in front of every prompt line, then a space)\n"
          "KV cache:\n"
          "  --kv-dtype T[,T...]  storage of K and V: f32 (default), f16, bf16, int8 (a scale per token\n"
          "                and head), int4 (a scale and minimum per 32 values), fp8_e4m3, fp8_e5m2.\n"
          "                A comma list runs each (for --ppl)\n"
          "  --int-scores 0|1   1: over int8 / int4 keys, queries as int8 codes and integer dot products\n"
          "  --int-values 0|1   1: over int8 / int4 values, probabilities as 8-bit codes and integer products\n"
          "  --rotate none|k|v|kv   store those rows Walsh-Hadamard rotated (spreads outlier channels)\n"
          "  --select BUDGET[:SINK[:RECENT]]   block selection (Quest): each step reads, per KV head, the\n"
          "                blocks whose key bounds promise the largest scores, BUDGET tokens in all, always\n"
          "                with those of the first SINK and last RECENT tokens (defaults 0); not with --serve\n"
          "  --k-dtype T / --v-dtype T   K or V alone (overrides --kv-dtype for that half)\n"
          "  --layer-dtypes SPEC  per layer, K and V alike: comma-separated T or T:N; T:N takes N layers\n"
          "                in order, one item without :N takes the layers left over, in its place;\n"
          "                e.g. f16:3,int8,f16:3 = first 3 and last 3 layers f16, the rest int8;\n"
          "                with no :N anywhere, one item per layer\n"
          "  --evict window:BUDGET[:SINKS]   keep the first SINKS positions (default 0) and the newest\n"
          "                tokens, BUDGET in all\n"
          "  --evict h2o:BUDGET[:SINKS[:RECENT]]   H2O: SINKS first (default 0), RECENT newest (default\n"
          "                BUDGET/2), the rest by accumulated attention\n"
          "  --evict tova:BUDGET   TOVA: keep the tokens the current query attends to most\n"
          "  --evict knorm:BUDGET[:SINKS]   Knorm: keep the keys with the smallest L2 norm\n"
          "  --evict snapkv:BUDGET[:WINDOW[:POOL]]   SnapKV: compress the prompt once, after prefill, to\n"
          "                BUDGET tokens by the attention of its last WINDOW queries (default 32) pooled\n"
          "                over POOL slots (odd, default 7); generation and --needle only\n"
          "  --evict pyramid:BUDGET[:WINDOW[:POOL]]   PyramidKV: SnapKV's scores, the budget spread over\n"
          "                layers falling with depth (an average of BUDGET per layer, the last 1/20 of it)\n"
          "  --evict adakv:BUDGET[:WINDOW[:POOL]]   Ada-KV: SnapKV's scores, a layer's KV heads sharing\n"
          "                n_kv_heads x BUDGET by their scores\n"
          "                BUDGET is a token count or a percentage (20%%) of the window (--ppl), of the\n"
          "                steps (generation).  Repeat --evict to compare policies; --evict none = no eviction\n",
          prog);
  fprintf(f,
          "  --prefix-dir DIR   (--serve) a prefix tier in DIR: published blocks the pool forgets are written\n"
          "                there, lookups read them back, and the run ends by saving every published block,\n"
          "                so a second run of the same prompts starts warm (records found there are\n"
          "                loaded at the start)\n"
          "  --prefix-redis HOST:PORT   (--serve) the same, in a Redis (or Valkey) server: every run pointed\n"
          "                at it shares its prefix blocks (built by `make kvattn_run_redis`, with hiredis)\n"
          "  --demote TYPE[:MAX]   every --evict policy keeps the tokens it evicts, converted to TYPE (f32,\n"
          "                f16, bf16, int8, int4), and still attends them; at most MAX of them (default: no\n"
          "                bound), the earliest demoted deleted first (--serve: not with h2o)\n"
          "  --fp8-scale S[,SV]   FP8 tensor scale of K (and V); stored value = fp8(x / S) (default 1)\n"
          "  --fp8-calib FILE     FP8 scales calibrated (least squared round-trip error) on the K/V of\n"
          "                the first seq_len tokens of this text\n"
          "  --block-size N       tokens per cache block (default 16)\n"
          "  --threads N          threads for matrix products and attention (default 1; needs OpenMP)\n");
  /* two strings: C99 promises string literals of 4095 bytes, no more */
  fprintf(f,
          "Other modes:\n"
          "  --ppl FILE           perplexity of a text (BOS + its tokens), in windows of seq_len tokens,\n"
          "                each from an empty cache; every token after the first is predicted.  One line\n"
          "                per configuration: ppl P loss L tokens N kv BYTES_PER_TOKEN CONFIG\n"
          "                (with eviction the window goes token by token so the policy acts)\n"
          "  --ppl-tokens FILE    the same over whitespace-separated token ids (used as given)\n"
          "  --needle FILE        retrieval: one case per line, depth<TAB>answer<TAB>prompt (the answer's\n"
          "                digits stated in the prompt, asked for at its end); greedy decoding, a case\n"
          "                is right when the answer's digits come out.  Per configuration: the share\n"
          "                right, then a table of depth x context length (prompt + answer rounded up to\n"
          "                a power of two)\n"
          "  --serve FILE         one prompt per line (empty lines skipped), served together: continuous\n"
          "                batching, the common token prefix reused through the prefix cache,\n"
          "                admission and preemption.  stdout: \"[request I] \" + what -i LINE would print\n"
          "  --max-batch N        requests running at once in --serve (default 8)\n"
          "  --kv-blocks N        cache pool size in blocks (default: enough; small values force\n"
          "                preemption in --serve)\n"
          "  --logits-tokens FILE token ids (no BOS added) through the model; stdout: one line per\n"
          "                position, the vocab_size logits as %%.9g (F32 cache unless a dtype is given)\n"
          "  --chunk N            rows per prefill call for --logits-tokens and --ppl (default: all;\n"
          "                1 = token by token)\n"
          "  --help               this text\n"
          "stderr gets the timings: prefill and decode tokens/s, the share of decode time inside kvattn\n"
          "calls, and the KV bytes held and per token.\n");
}

static int parse_int(const char *flag, const char *s, long lo, long hi) {
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) die("%s: '%s' is not an integer in %ld..%ld", flag, s, lo, hi);
  return (int)v;
}

static float parse_float(const char *flag, const char *s) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || !(v == v) || v > 1e30 || v < -1e30) die("%s: '%s' is not a number", flag, s);
  return (float)v;
}

static int parse_dtype(const char *s, kva_dtype *t) {
  static const struct {
    const char *name;
    kva_dtype t;
  } names[] = {{"f32", KVA_F32},          {"f16", KVA_F16},          {"bf16", KVA_BF16},
               {"int8", KVA_INT8},        {"fp8_e4m3", KVA_FP8_E4M3}, {"fp8_e5m2", KVA_FP8_E5M2},
               {"fp8", KVA_FP8_E4M3},     {"e4m3", KVA_FP8_E4M3},    {"e5m2", KVA_FP8_E5M2},
               {"fp32", KVA_F32},         {"fp16", KVA_F16},         {"int4", KVA_INT4}};
  size_t i;
  for (i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(s, names[i].name) == 0) {
      *t = names[i].t;
      return 1;
    }
  return 0;
}

static int is_fp8(kva_dtype t) { return t == KVA_FP8_E4M3 || t == KVA_FP8_E5M2; }

static void parse_evict(const char *s, evict_spec *e) {
  char buf[64], *f[5], *p;
  int n = 0;
  memset(e, 0, sizeof *e);
  e->recent = -1;
  if (strlen(s) >= sizeof buf) die("--evict: '%s' is too long", s);
  strcpy(buf, s);
  strcpy(e->text, s);
  if (strcmp(s, "none") == 0) return;
  for (p = buf; n < 5;) {
    f[n++] = p;
    p = strchr(p, ':');
    if (!p) break;
    *p++ = '\0';
  }
  if (strcmp(f[0], "window") == 0) e->kind = KVA_EVICT_WINDOW;
  else if (strcmp(f[0], "h2o") == 0) e->kind = KVA_EVICT_H2O;
  else if (strcmp(f[0], "tova") == 0) e->kind = KVA_EVICT_SCORE, e->scorer = SCORER_TOVA;
  else if (strcmp(f[0], "knorm") == 0) e->kind = KVA_EVICT_SCORE, e->scorer = SCORER_KNORM;
  else if (strcmp(f[0], "snapkv") == 0) e->kind = KVA_EVICT_SCORE, e->scorer = SCORER_SNAPKV;
  else if (strcmp(f[0], "pyramid") == 0) e->kind = KVA_EVICT_SCORE, e->scorer = SCORER_PYRAMID;
  else if (strcmp(f[0], "adakv") == 0) e->kind = KVA_EVICT_SCORE, e->scorer = SCORER_ADAKV;
  else
    die("--evict: '%s': expected window:BUDGET[:SINKS], h2o:BUDGET[:SINKS[:RECENT]], tova:BUDGET, "
        "knorm:BUDGET[:SINKS], snapkv|pyramid|adakv:BUDGET[:WINDOW[:POOL]] or none", s);
  if (n < 2 || n > (e->kind == KVA_EVICT_WINDOW || e->scorer == SCORER_KNORM ? 3 : e->scorer == SCORER_TOVA ? 2 : 4) ||
      (p && n == 5))
    die("--evict: '%s': expected window:BUDGET[:SINKS], h2o:BUDGET[:SINKS[:RECENT]], tova:BUDGET, "
        "knorm:BUDGET[:SINKS] or snapkv|pyramid|adakv:BUDGET[:WINDOW[:POOL]]", s);
  {
    size_t L = strlen(f[1]);
    char *end;
    if (L > 0 && f[1][L - 1] == '%') {
      f[1][L - 1] = '\0';
      e->pct = 1;
      e->budget = strtod(f[1], &end);
      if (end == f[1] || *end || !(e->budget > 0.0 && e->budget <= 100.0))
        die("--evict: '%s': the percentage must be in (0, 100]", s);
    } else {
      e->budget = strtol(f[1], &end, 10);
      if (end == f[1] || *end || e->budget < 1 || e->budget > 1e9)
        die("--evict: '%s': BUDGET must be a positive token count or a percentage", s);
    }
  }
  if (e->scorer >= SCORER_PYRAMID || e->scorer == SCORER_SNAPKV) {
    e->window = n >= 3 ? parse_int("--evict WINDOW", f[2], 1, 4096) : 32;
    e->pool = n >= 4 ? parse_int("--evict POOL", f[3], 1, 255) : 7;
    if (e->pool % 2 == 0) die("--evict: '%s': POOL must be odd (a window centred on each token)", s);
    return;
  }
  if (n >= 3) e->sinks = parse_int("--evict SINKS", f[2], 0, 1000000000);
  if (n >= 4) e->recent = parse_int("--evict RECENT", f[3], 0, 1000000000);
}

static llm_model model; /* the one model a run loads */
static tier_dir tier;    /* --prefix-dir */
#ifdef KVATTN_RUN_REDIS
static tier_redis rtier; /* --prefix-redis */
#endif

/* The policy for a window of n tokens (percentages resolve against n). A scorer's state lives in
   st (the kept queries; SnapKV's compression budget): NULL where no scorer applies (--serve);
   compress: the mode prefills a prompt and then compresses it (SnapKV's place). */
static kva_evict resolve_evict(const evict_spec *e, long n, llm_state *st, int compress) {
  kva_evict k;
  long b;
  memset(&k, 0, sizeof k);
  if (st) st->compress_budget = 0;
  if (e->kind == KVA_EVICT_NONE) return k;
  b = e->pct ? (long)floor(e->budget * (double)n / 100.0 + 0.5) : (long)e->budget;
  if (b < 1) b = 1;
  if (b > 1000000000L) b = 1000000000L;
  k.kind = e->kind;
  k.budget = (int)b;
  k.demote_dtype = e->demote;
  k.demote_budget = e->demote ? e->demote_budget : 0;
  if (e->scorer) {
    const int snap = e->scorer == SCORER_SNAPKV || e->scorer >= SCORER_PYRAMID; /* compresses a prompt once */
    int rows = e->scorer == SCORER_TOVA ? 1 : snap ? e->window : 0;
    if (!st || (snap && !compress))
      die("--evict %s: not in this mode (TOVA and Knorm: generation, chat, --ppl, --needle; SnapKV, PyramidKV "
          "and Ada-KV, a prompt compression: generation and --needle)", e->text);
    if (!llm_keep_queries(st, &model, rows, snap ? e->pool : 1)) die("out of memory");
    k.score = e->scorer == SCORER_KNORM ? kva_score_key_norm : llm_score_queries;
    k.score_user = e->scorer == SCORER_KNORM ? NULL : st;
    if (snap) { /* nothing evicted as the prompt fills; one compression keeps its window */
      st->compress_budget = (int)b;
      k.budget = 1000000000;
      k.n_recent = e->window < (int)b ? e->window : (int)b;
      if (e->scorer == SCORER_PYRAMID) { /* a window as large as the budget leaves nothing to spread */
        if (kva_pyramid_weights(model.c.n_layers, (int)b, k.n_recent < (int)b ? k.n_recent : (int)b - 1, PYRAMID_BETA,
                                st->layer_weight) != KVA_OK)
          die("--evict %s: no PyramidKV schedule for a budget of %ld", e->text, b);
        k.layer_weight = st->layer_weight;
      }
      k.share_heads = e->scorer == SCORER_ADAKV;
      return k;
    }
  }
  k.n_sink = e->sinks < k.budget ? e->sinks : k.budget;
  if (e->kind == KVA_EVICT_H2O) {
    int r = e->recent < 0 ? k.budget / 2 : e->recent;
    if (r > k.budget - k.n_sink) r = k.budget - k.n_sink;
    k.n_recent = r;
  }
  return k;
}

/* --layer-dtypes: see --help for the grammar */
static void parse_layers(const char *spec, int n_layers, kva_dtype *out) {
  char buf[1024], *items[1024], *p;
  int n = 0, i, fixed = 0, rest = -1, any_count = 0, at = 0;
  int counts[1024];
  kva_dtype types[1024];
  if (strlen(spec) >= sizeof buf) die("--layer-dtypes: spec too long");
  strcpy(buf, spec);
  for (p = buf; n < 1024;) {
    items[n++] = p;
    p = strchr(p, ',');
    if (!p) break;
    *p++ = '\0';
  }
  for (i = 0; i < n; i++) {
    char *colon = strchr(items[i], ':');
    counts[i] = -1;
    if (colon) {
      *colon = '\0';
      counts[i] = parse_int("--layer-dtypes count", colon + 1, 0, 1 << 20);
      any_count = 1;
      fixed += counts[i];
    }
    if (!parse_dtype(items[i], &types[i]))
      die("--layer-dtypes: '%s' is not a type (f32, f16, bf16, int8, fp8_e4m3, fp8_e5m2)", items[i]);
  }
  if (!any_count) {
    if (n != n_layers)
      die("--layer-dtypes: %d types for %d layers (give one per layer, or counts like f16:2,int8)", n, n_layers);
    for (i = 0; i < n; i++) out[i] = types[i];
    return;
  }
  for (i = 0; i < n; i++)
    if (counts[i] < 0) {
      if (rest >= 0) die("--layer-dtypes: only one item may leave out its :N count");
      rest = i;
    }
  if (rest >= 0) {
    if (fixed > n_layers) die("--layer-dtypes: counts add up to %d, the model has %d layers", fixed, n_layers);
    counts[rest] = n_layers - fixed;
  } else if (fixed != n_layers) {
    die("--layer-dtypes: counts add up to %d, the model has %d layers", fixed, n_layers);
  }
  for (i = 0; i < n; i++) {
    int k;
    for (k = 0; k < counts[i]; k++) out[at++] = types[i];
  }
}

static void parse_args(int argc, char **argv, options *o) {
  int i;
  memset(o, 0, sizeof *o);
  o->tokenizer = "tokenizer.bin";
  o->mode = "generate";
  o->temperature = 1.0f;
  o->topp = 0.9f;
  o->steps = 256;
  o->threads = 1;
  o->max_batch = 8;
  for (i = 1; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      exit(0);
    }
  if (argc < 2) die("no checkpoint given (usage: %s CHECKPOINT [options]; --help lists the options)", prog);
  o->checkpoint = argv[1];
  if (o->checkpoint[0] == '-' && o->checkpoint[1] != '\0')
    die("the first argument must be the checkpoint, not the option '%s' (--help lists the options)", argv[1]);
  for (i = 2; i < argc; i += 2) {
    const char *f = argv[i], *v;
    if (i + 1 >= argc) die("option '%s' needs a value (--help lists the options)", f);
    v = argv[i + 1];
    if (strcmp(f, "-t") == 0) o->temperature = parse_float(f, v);
    else if (strcmp(f, "-p") == 0) o->topp = parse_float(f, v);
    else if (strcmp(f, "-s") == 0) o->seed = (unsigned long long)(long long)parse_int(f, v, INT_MIN, INT_MAX);
    else if (strcmp(f, "-n") == 0) o->steps = parse_int(f, v, 0, INT_MAX), o->steps_given = 1;
    else if (strcmp(f, "-i") == 0) o->prompt = v;
    else if (strcmp(f, "-z") == 0) o->tokenizer = v;
    else if (strcmp(f, "-m") == 0) o->mode = v;
    else if (strcmp(f, "-y") == 0) o->system = v;
    else if (strcmp(f, "--kv-dtype") == 0) {
      char buf[512], *p = buf, *c;
      if (strlen(v) >= sizeof buf) die("--kv-dtype: list too long");
      strcpy(buf, v);
      o->n_dtypes = 0;
      for (;;) {
        c = strchr(p, ',');
        if (c) *c = '\0';
        if (o->n_dtypes == MAX_CONFIGS) die("--kv-dtype: more than %d types", MAX_CONFIGS);
        if (!parse_dtype(p, &o->dtypes[o->n_dtypes++]))
          die("--kv-dtype: '%s' is not a type (f32, f16, bf16, int8, int4, fp8_e4m3, fp8_e5m2)", p);
        if (!c) break;
        p = c + 1;
      }
    } else if (strcmp(f, "--k-dtype") == 0 || strcmp(f, "--v-dtype") == 0) {
      kva_dtype t;
      if (!parse_dtype(v, &t)) die("%s: '%s' is not a type (f32, f16, bf16, int8, int4, fp8_e4m3, fp8_e5m2)", f, v);
      if (f[2] == 'k') o->k_dtype = t;
      else o->v_dtype = t;
    } else if (strcmp(f, "--layer-dtypes") == 0) o->layer_spec = v;
    else if (strcmp(f, "--int-scores") == 0) o->int_scores = parse_int(f, v, 0, 1);
    else if (strcmp(f, "--int-values") == 0) o->int_values = parse_int(f, v, 0, 1);
    else if (strcmp(f, "--select") == 0) {
      char *end;
      long b = strtol(v, &end, 10), sk = 0, rc = 0;
      if (*end == ':') sk = strtol(end + 1, &end, 10);
      if (*end == ':') rc = strtol(end + 1, &end, 10);
      if (*end || b < 1 || b > 1L << 24 || sk < 0 || sk > 1L << 24 || rc < 0 || rc > 1L << 24)
        die("--select: '%s' is not BUDGET[:SINK[:RECENT]] (token counts, BUDGET >= 1)", v);
      o->select_budget = (int)b, o->select_sink = (int)sk, o->select_recent = (int)rc;
    }
    else if (strcmp(f, "--rotate") == 0) {
      if (strcmp(v, "none") == 0) o->rotate = 0;
      else if (strcmp(v, "k") == 0) o->rotate = KVA_ROTATE_K;
      else if (strcmp(v, "v") == 0) o->rotate = KVA_ROTATE_V;
      else if (strcmp(v, "kv") == 0) o->rotate = KVA_ROTATE_K | KVA_ROTATE_V;
      else die("--rotate: '%s' is not none, k, v or kv", v);
    }
    else if (strcmp(f, "--prefix-dir") == 0) o->prefix_dir = v;
    else if (strcmp(f, "--prefix-redis") == 0) o->prefix_redis = v;
    else if (strcmp(f, "--demote") == 0) {
      char buf[64], *c;
      if (strlen(v) >= sizeof buf) die("--demote: '%s' is too long", v);
      strcpy(buf, v);
      c = strchr(buf, ':');
      if (c) *c = '\0';
      if (!parse_dtype(buf, &o->demote) || o->demote == KVA_FP8_E4M3 || o->demote == KVA_FP8_E5M2)
        die("--demote: '%s' is not TYPE[:MAX] with TYPE f32, f16, bf16, int8 or int4", v);
      o->demote_budget = c ? parse_int("--demote MAX", c + 1, 1, 1000000000) : 0;
    } else if (strcmp(f, "--evict") == 0) {
      if (o->n_evict == MAX_CONFIGS) die("--evict: more than %d policies", MAX_CONFIGS);
      parse_evict(v, &o->evict[o->n_evict++]);
    } else if (strcmp(f, "--fp8-scale") == 0) {
      char buf[128], *c;
      if (strlen(v) >= sizeof buf) die("--fp8-scale: '%s' is too long", v);
      strcpy(buf, v);
      c = strchr(buf, ',');
      if (c) *c = '\0';
      o->fp8_k = parse_float(f, buf);
      o->fp8_v = c ? parse_float(f, c + 1) : o->fp8_k;
      if (!(o->fp8_k > 0.0f) || !(o->fp8_v > 0.0f)) die("--fp8-scale: scales must be positive");
    } else if (strcmp(f, "--fp8-calib") == 0) o->fp8_calib = v;
    else if (strcmp(f, "--threads") == 0) o->threads = parse_int(f, v, 1, 1024);
    else if (strcmp(f, "--block-size") == 0) o->block_size = parse_int(f, v, 1, 1 << 16);
    else if (strcmp(f, "--ppl") == 0) o->ppl = v;
    else if (strcmp(f, "--ppl-tokens") == 0) o->ppl_tokens = v;
    else if (strcmp(f, "--serve") == 0) o->serve = v;
    else if (strcmp(f, "--needle") == 0) o->needle = v;
    else if (strcmp(f, "--logits-tokens") == 0) o->logits_tokens = v;
    else if (strcmp(f, "--chunk") == 0) o->chunk = parse_int(f, v, 1, 1 << 24);
    else if (strcmp(f, "--max-batch") == 0) o->max_batch = parse_int(f, v, 1, 4096);
    else if (strcmp(f, "--kv-blocks") == 0) o->kv_blocks = parse_int(f, v, 1, 1 << 28);
    else die("unknown option '%s' (--help lists the options)", f);
  }
  /* run's normalisation of the sampling parameters */
  if (o->temperature < 0.0f) o->temperature = 0.0f;
  if (o->topp < 0.0f || o->topp > 1.0f) o->topp = 0.9f;
  if (o->seed == 0) o->seed = (unsigned long long)time(NULL);
  if (strcmp(o->mode, "generate") != 0 && strcmp(o->mode, "chat") != 0)
    die("-m: '%s' is not a mode (generate or chat)", o->mode);
  if ((o->ppl != NULL) + (o->ppl_tokens != NULL) + (o->serve != NULL) + (o->logits_tokens != NULL) +
          (o->needle != NULL) > 1)
    die("--ppl, --ppl-tokens, --serve, --logits-tokens and --needle are separate modes: give one");
  if (o->serve && strcmp(o->mode, "chat") == 0) die("--serve runs generate mode only (not -m chat)");
  if (o->prefix_dir && !o->serve) die("--prefix-dir: the prefix tier is --serve's (give --serve FILE too)");
  if (o->prefix_redis && !o->serve) die("--prefix-redis: the prefix tier is --serve's (give --serve FILE too)");
  if (o->prefix_redis && o->prefix_dir) die("--prefix-dir and --prefix-redis: one prefix tier per run, give one");
#ifndef KVATTN_RUN_REDIS
  if (o->prefix_redis)
    die("--prefix-redis: this kvattn_run was built without hiredis; build kvattn_run_redis (make kvattn_run_redis, "
        "needs libhiredis-dev) and run that");
#endif
  if (o->serve && o->select_budget) die("--select: --serve attends through batch plans, which do not select blocks yet");
  if (o->n_dtypes == 0) o->dtypes[o->n_dtypes++] = KVA_F32;
  if (o->n_evict == 0) parse_evict("none", &o->evict[o->n_evict++]);
  if (o->demote) {
    int e, any = 0;
    for (e = 0; e < o->n_evict; e++) {
      if (o->evict[e].kind == KVA_EVICT_NONE) continue;
      if (o->serve && o->evict[e].kind == KVA_EVICT_H2O)
        die("--demote with --serve: batch plans do not attend an H2O sequence's demoted tokens (use window)");
      o->evict[e].demote = o->demote;
      o->evict[e].demote_budget = o->demote_budget;
      any = 1;
    }
    if (!any) die("--demote: give an --evict policy whose evicted tokens it keeps");
  }
  if (o->layer_spec && o->n_dtypes > 1) die("--layer-dtypes and a --kv-dtype list do not combine");
#ifndef _OPENMP
  if (o->threads > 1) fprintf(stderr, "%s: built without OpenMP: --threads %d runs on one thread\n", prog, o->threads);
#endif
}

/* ======================================================================
   configurations: storage types x eviction policies
   ====================================================================== */

typedef struct {
  llm_cache_opts cache;
  kva_dtype layer[1024];
  int has_layers;
  const evict_spec *evict;
  char name[256];
} config;

/* the FP8 types of a configuration's K and V (KVA_DTYPE_DEFAULT if none) */
static void config_fp8(const config *c, int n_layers, kva_dtype *kf, kva_dtype *vf) {
  int l;
  *kf = *vf = KVA_DTYPE_DEFAULT;
  if (c->has_layers) {
    for (l = 0; l < n_layers; l++)
      if (is_fp8(c->layer[l])) {
        *kf = *vf = c->layer[l];
        return;
      }
    return;
  }
  if (is_fp8(c->cache.k_dtype)) *kf = c->cache.k_dtype;
  if (is_fp8(c->cache.v_dtype)) *vf = c->cache.v_dtype;
}

static int build_configs(const options *o, const llm_model *m, config *cfg) {
  int n = 0, d, e, nd = o->layer_spec ? 1 : o->n_dtypes;
  if (m->c.n_layers > 1024 && o->layer_spec) die("--layer-dtypes: models of more than 1024 layers are not supported");
  for (d = 0; d < nd; d++)
    for (e = 0; e < o->n_evict; e++) {
      config *c = &cfg[n];
      char tn[160];
      if (n == MAX_CONFIGS) die("more than %d configurations (dtypes x eviction policies)", MAX_CONFIGS);
      memset(c, 0, sizeof *c);
      c->evict = &o->evict[e];
      c->cache.block_size = o->block_size;
      c->cache.rotate = o->rotate;
      c->cache.block_bounds = o->select_budget > 0;
      if (o->layer_spec) {
        parse_layers(o->layer_spec, m->c.n_layers, c->layer);
        c->has_layers = 1;
        c->cache.layer_dtype = c->layer;
        snprintf(tn, sizeof tn, "layers:%s", o->layer_spec);
      } else {
        c->cache.k_dtype = o->k_dtype ? o->k_dtype : o->dtypes[d];
        c->cache.v_dtype = o->v_dtype ? o->v_dtype : o->dtypes[d];
        if (c->cache.k_dtype == c->cache.v_dtype)
          snprintf(tn, sizeof tn, "%s", kva_dtype_name(c->cache.k_dtype));
        else
          snprintf(tn, sizeof tn, "k:%s/v:%s", kva_dtype_name(c->cache.k_dtype), kva_dtype_name(c->cache.v_dtype));
      }
      c->cache.demote_dtype = c->evict->demote;
      if (c->evict->kind != KVA_EVICT_NONE && c->evict->demote)
        snprintf(c->name, sizeof c->name, "%s+%s+%s demoted", tn, c->evict->text, kva_dtype_name(c->evict->demote));
      else if (c->evict->kind != KVA_EVICT_NONE)
        snprintf(c->name, sizeof c->name, "%s+%s", tn, c->evict->text);
      else
        snprintf(c->name, sizeof c->name, "%s", tn);
      n++;
    }
  return n;
}

/* ======================================================================
   input files
   ====================================================================== */

static char *read_text(const char *path, const char *what) {
  FILE *f = fopen(path, "rb");
  char *buf;
  long long n;
  if (!f) die("%s %s: cannot open", what, path);
  if (fgetc(f) == EOF && ferror(f)) die("%s %s: cannot read (a directory?)", what, path);
  n = llm__file_size(f);
  if (n < 0) die("%s %s: cannot tell its size (not a regular file?)", what, path);
  if (n > (1LL << 30)) die("%s %s: larger than 1 GiB", what, path);
  buf = (char *)malloc((size_t)n + 1);
  if (!buf) die("%s %s: out of memory", what, path);
  if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) die("%s %s: read error", what, path);
  buf[n] = '\0';
  fclose(f);
  if (strlen(buf) != (size_t)n) die("%s %s: contains a NUL byte (not text)", what, path);
  return buf;
}

/* whitespace-separated token ids, each checked against the vocabulary */
static int32_t *read_ids(const char *path, const char *what, int vocab, int *n_out) {
  char *text = read_text(path, what), *p = text;
  size_t cap = 1024;
  int n = 0;
  int32_t *ids = (int32_t *)malloc(cap * sizeof(int32_t));
  if (!ids) die("%s %s: out of memory", what, path);
  for (;;) {
    char *end;
    long v;
    while (*p && isspace((unsigned char)*p)) p++;
    if (!*p) break;
    v = strtol(p, &end, 10);
    if (end == p || (*end && !isspace((unsigned char)*end))) {
      char item[32];
      size_t k = 0;
      while (p[k] && !isspace((unsigned char)p[k]) && k < sizeof item - 1) item[k] = p[k], k++;
      item[k] = '\0';
      die("%s %s: item %d, '%s', is not a token id", what, path, n + 1, item);
    }
    if (v < 0 || v >= vocab) die("%s %s: token id %ld (item %d) is outside the vocabulary 0..%d", what, path, v, n + 1, vocab - 1);
    if ((size_t)n == cap) {
      int32_t *g = (int32_t *)realloc(ids, cap * 2 * sizeof(int32_t));
      if (!g) die("%s %s: out of memory", what, path);
      ids = g, cap *= 2;
    }
    ids[n++] = (int32_t)v;
    p = end;
  }
  free(text);
  if (n == 0) die("%s %s: no token ids", what, path);
  *n_out = n;
  return ids;
}

static int32_t *encode_or_die(const llm_tokenizer *t, const char *text, int bos, int *n) {
  int32_t *tok = (int32_t *)malloc((strlen(text) + 3) * sizeof(int32_t));
  int i;
  if (!tok || llm_encode(t, text, bos, 0, tok, n) != 0) die("out of memory encoding %lu bytes of text", (unsigned long)strlen(text));
  for (i = 0; i < *n; i++)
    if (tok[i] < 0 || tok[i] >= t->vocab_size)
      die("the text encodes to token id %d, outside the vocabulary (a tokenizer without byte tokens?)", tok[i]);
  return tok;
}

/* ======================================================================
   shared pieces: model, cache, FP8 scales, timing report
   ====================================================================== */

static llm_tokenizer tokenizer;
static int have_tokenizer;

static void load_tokenizer(const options *o) {
  char err[512];
  if (have_tokenizer) return;
  if (!llm_tokenizer_load(&tokenizer, o->tokenizer, model.c.vocab_size, err, sizeof err)) die("%s", err);
  have_tokenizer = 1;
}

static kva_cache *make_cache(const config *c, int n_blocks, int max_seqs) {
  llm_cache_opts co = c->cache;
  kva_cache *cache;
  kva_status st;
  co.n_blocks = n_blocks;
  co.max_seqs = max_seqs;
  st = llm_cache_create(&model, &co, &cache);
  if (st != KVA_OK)
    die("cannot create the KV cache (%s, %d blocks of %d tokens): %s", c->name, n_blocks,
        c->cache.block_size ? c->cache.block_size : 16, kva_status_str(st));
  return cache;
}

/* FP8 scales of a configuration: given (--fp8-scale), calibrated on a text
   (--fp8-calib: its first seq_len tokens through the model with an F32
   cache; every layer's K and V read back and kva_fp8_calibrate picks the
   scale with the least squared round-trip error), or 1. */
static void fp8_scales(const options *o, config *c, int n_threads) {
  kva_dtype kf, vf;
  config_fp8(c, model.c.n_layers, &kf, &vf);
  if (kf == KVA_DTYPE_DEFAULT && vf == KVA_DTYPE_DEFAULT) return;
  c->cache.k_scale = o->fp8_k > 0.0f ? o->fp8_k : 1.0f;
  c->cache.v_scale = o->fp8_v > 0.0f ? o->fp8_v : 1.0f;
  if (o->fp8_calib) {
    static float *kbuf, *vbuf;
    static size_t nk;
    static int calibrated;
    if (!calibrated) { /* the K/V sample does not depend on the FP8 type: run the model once */
      char *text = read_text(o->fp8_calib, "--fp8-calib");
      int n;
      int32_t *tok;
      llm_state st;
      kva_status s;
      load_tokenizer(o);
      tok = encode_or_die(&tokenizer, text, 1, &n);
      if (n < 2) die("--fp8-calib %s: empty text", o->fp8_calib);
      if (n > model.c.seq_len) n = model.c.seq_len;
      if (!llm_state_init(&st, &model, n < 256 ? n : 256, n_threads)) die("out of memory");
      if ((s = llm_kv_sample(&model, &st, tok, n, &kbuf, &vbuf, &nk)) != KVA_OK)
        die("--fp8-calib: the calibration run failed: %s", kva_status_str(s));
      llm_state_free(&st);
      free(tok);
      free(text);
      fprintf(stderr, "fp8 calibration: K and V of %d tokens x %d layers from %s\n", n, model.c.n_layers,
              o->fp8_calib);
      calibrated = 1;
    }
    if (kf != KVA_DTYPE_DEFAULT && kva_fp8_calibrate(kf, kbuf, nk, KVA_CALIB_MSE, &c->cache.k_scale) != KVA_OK)
      die("--fp8-calib: calibration failed");
    if (vf != KVA_DTYPE_DEFAULT && kva_fp8_calibrate(vf, vbuf, nk, KVA_CALIB_MSE, &c->cache.v_scale) != KVA_OK)
      die("--fp8-calib: calibration failed");
    fprintf(stderr, "fp8 scales (%s): k %g v %g\n", c->name, c->cache.k_scale, c->cache.v_scale);
  }
}

static void report_cache(const kva_cache *cache, const config *c) {
  kva_cache_stats st;
  size_t bpt = llm_cache_bytes_per_token(&model, &c->cache);
  kva_cache_get_stats(cache, &st);
  fprintf(stderr,
          "kv cache %s: %lu bytes per token (all %d layers, K+V+scales); %ld tokens held in %d blocks = %lu bytes "
          "(pool %d blocks = %lu bytes, bookkeeping %lu bytes)\n",
          c->name, (unsigned long)bpt, model.c.n_layers, st.tokens_held, st.blocks_used,
          (unsigned long)(st.block_bytes * (size_t)st.blocks_used), st.n_blocks, (unsigned long)st.bytes_total,
          (unsigned long)st.bytes_meta);
}

/* ======================================================================
   generate: run's loop.  The prompt's tokens are forced (and printed), the
   prompt runs as one prefill; then one token per step is sampled from the
   logits of the newest position, printed, and fed back, until `steps`
   positions or a BOS.
   ====================================================================== */

static void put_piece(const char *piece) {
  if (llm_piece_visible(piece)) fputs(piece, stdout);
}

static void generate(const options *o, config *c, int steps) {
  int n_prompt, pos, token, next, i, forced, seq;
  int32_t *prompt;
  kva_cache *cache;
  llm_state st;
  llm_sampler smp;
  kva_evict ev;
  double t0, t_prefill = 0, t_decode = 0, kva_before;
  long n_decode = 0;
  load_tokenizer(o);
  prompt = encode_or_die(&tokenizer, o->prompt ? o->prompt : "", 1, &n_prompt);
  if (!llm_sampler_init(&smp, model.c.vocab_size, o->temperature, o->topp, o->seed)) die("out of memory");
  /* the forced positions: pos p feeds prompt[p] and "samples" prompt[p+1] */
  forced = n_prompt - 1 < steps ? n_prompt - 1 : steps;
  for (i = 0; i < forced; i++) {
    if (prompt[i + 1] == LLM_BOS) break;
    put_piece(llm_decode(&tokenizer, prompt[i], prompt[i + 1]));
  }
  fflush(stdout);
  if (i < forced || forced == steps) { /* a BOS in the prompt, or no room to sample: run stops here */
    printf("\n");
    free(prompt);
    llm_sampler_free(&smp);
    return;
  }
  cache = make_cache(c, llm_blocks_for(&c->cache, (long)steps + 1), 2);
  if (!llm_state_init(&st, &model, n_prompt < 512 ? n_prompt : 512, o->threads)) die("out of memory");
  st.int_scores = o->int_scores;
  st.int_values = o->int_values;
  st.select_budget = o->select_budget, st.select_sink = o->select_sink, st.select_recent = o->select_recent;
  ev = resolve_evict(c->evict, steps, &st, 1);
  if (kva_seq_new(cache, &seq) != KVA_OK) die("cannot start a sequence");
  if (ev.kind != KVA_EVICT_NONE && kva_seq_set_evict(cache, seq, &ev) != KVA_OK)
    die("--evict %s: not accepted (budget %d, sinks %d, recent %d)", c->evict->text, ev.budget, ev.n_sink, ev.n_recent);
  t0 = llm_now();
  if (st.compress_budget > 0) { /* SnapKV: prefill, then compress the prompt once */
    kva_status cs;
    if (llm_forward(&model, &st, cache, seq, prompt, n_prompt, st.logits, 0) != KVA_OK) die("forward failed (prefill)");
    if ((cs = kva_seq_compress(cache, seq, st.compress_budget)) != KVA_OK)
      die("--evict %s: compressing the prompt failed: %s", c->evict->text, kva_status_str(cs));
  } else if (ev.kind != KVA_EVICT_NONE) { /* token by token so the policy acts at every step */
    for (i = 0; i < n_prompt; i++)
      if (llm_forward(&model, &st, cache, seq, prompt + i, 1, st.logits, 0) != KVA_OK) die("forward failed");
  } else if (llm_forward(&model, &st, cache, seq, prompt, n_prompt, st.logits, 0) != KVA_OK) {
    die("forward failed (prefill)");
  }
  t_prefill = llm_now() - t0;
  kva_before = st.t_kva;
  pos = n_prompt - 1;
  token = prompt[n_prompt - 1];
  t0 = llm_now();
  for (;;) {
    kva_status s;
    next = llm_sample(&smp, st.logits);
    pos++;
    if (next == LLM_BOS) break;
    put_piece(llm_decode(&tokenizer, token, next));
    fflush(stdout);
    token = next;
    if (pos >= steps) break;
    s = llm_forward(&model, &st, cache, seq, &token, 1, st.logits, 0);
    if (s != KVA_OK) die("forward failed at position %d: %s", pos, kva_status_str(s));
    n_decode++;
  }
  t_decode = llm_now() - t0;
  printf("\n");
  fflush(stdout);
  if (pos > 1) /* run's line: positions per second after the first forward */
    fprintf(stderr, "achieved tok/s: %f\n", (pos - 1) / (t_prefill * (n_prompt - 1) / n_prompt + t_decode));
  fprintf(stderr, "prefill: %d tokens in %.1f ms = %.1f tok/s; decode: %ld tokens in %.1f ms = %.1f tok/s, %.1f%% of it "
          "inside kvattn calls (rope, append, store, attend); %d thread%s, %s kernels\n",
          n_prompt, t_prefill * 1e3, t_prefill > 0 ? n_prompt / t_prefill : 0.0, n_decode, t_decode * 1e3,
          t_decode > 0 ? n_decode / t_decode : 0.0, t_decode > 0 ? 100.0 * (st.t_kva - kva_before) / t_decode : 0.0,
          o->threads, o->threads == 1 ? "" : "s", kva_simd_name());
  report_cache(cache, c);
  llm_state_free(&st);
  kva_cache_destroy(cache);
  llm_sampler_free(&smp);
  free(prompt);
}

/* ======================================================================
   chat: run's chat loop.  Each user turn is rendered with the Llama-2 chat
   template ([INST] ... [/INST], the system prompt in <<SYS>> on the first
   turn), encoded with a BOS and fed at the next positions; the assistant's
   tokens follow until EOS.  As in run, a token is sampled after every
   position (forced ones too), and the EOS is itself fed before the next
   turn.  Prompt tokens go through as one prefill.
   ====================================================================== */

static int read_line(const char *guide, char *buf, size_t n) {
  size_t len;
  printf("%s", guide);
  fflush(stdout);
  if (!fgets(buf, (int)n, stdin)) return 0;
  len = strlen(buf);
  if (len > 0 && buf[len - 1] == '\n') buf[len - 1] = '\0';
  return 1;
}

static void chat(const options *o, config *c, int steps) {
  char sys[4096], user[4096], *rendered;
  int32_t *prompt = NULL, token = 0;
  int n_prompt = 0, user_idx = 0, user_turn = 1, pos = 0, next = 0, seq;
  kva_cache *cache;
  llm_state st;
  llm_sampler smp;
  kva_evict ev;
  double t0 = llm_now();
  load_tokenizer(o);
  cache = make_cache(c, llm_blocks_for(&c->cache, (long)steps + 1), 2);
  if (!llm_state_init(&st, &model, 512, o->threads)) die("out of memory");
  st.int_scores = o->int_scores;
  st.int_values = o->int_values;
  st.select_budget = o->select_budget, st.select_sink = o->select_sink, st.select_recent = o->select_recent;
  ev = resolve_evict(c->evict, steps, &st, 0);
  if (!llm_sampler_init(&smp, model.c.vocab_size, o->temperature, o->topp, o->seed)) die("out of memory");
  if (kva_seq_new(cache, &seq) != KVA_OK) die("cannot start a sequence");
  if (ev.kind != KVA_EVICT_NONE && kva_seq_set_evict(cache, seq, &ev) != KVA_OK)
    die("--evict %s: not accepted", c->evict->text);
  rendered = (char *)malloc(sizeof sys + sizeof user + 64);
  if (!rendered) die("out of memory");
  while (pos < steps) {
    int k, j;
    if (user_turn) {
      if (pos == 0) {
        if (o->system) {
          snprintf(sys, sizeof sys, "%s", o->system);
        } else if (!read_line("Enter system prompt (optional): ", sys, sizeof sys)) {
          break;
        }
      }
      if (pos == 0 && o->prompt) {
        snprintf(user, sizeof user, "%s", o->prompt);
      } else if (!read_line("User: ", user, sizeof user)) {
        break;
      }
      if (pos == 0 && sys[0] != '\0')
        sprintf(rendered, "[INST] <<SYS>>\n%s\n<</SYS>>\n\n%s [/INST]", sys, user);
      else
        sprintf(rendered, "[INST] %s [/INST]", user);
      free(prompt);
      prompt = encode_or_die(&tokenizer, rendered, 1, &n_prompt);
      user_idx = 0;
      user_turn = 0;
      printf("Assistant: ");
      fflush(stdout);
    }
    /* the tokens fed now: the rest of the prompt up to an EOS in it (which
       ends the turn), within steps; or the sampled token */
    if (user_idx < n_prompt) {
      k = 0;
      while (user_idx + k < n_prompt && pos + k < steps) {
        k++;
        if (prompt[user_idx + k - 1] == LLM_EOS) break;
      }
      if (k > st.max_rows) k = st.max_rows;
      if (ev.kind != KVA_EVICT_NONE) k = 1;
      if (llm_forward(&model, &st, cache, seq, prompt + user_idx, k, st.logits, 1) != KVA_OK)
        die("forward failed at position %d (the cache holds %d positions: -n)", pos, steps);
    } else {
      k = 1;
      token = next;
      if (llm_forward(&model, &st, cache, seq, &token, 1, st.logits, 1) != KVA_OK)
        die("forward failed at position %d", pos);
    }
    for (j = 0; j < k; j++) { /* run's per-position body */
      int fed = user_idx < n_prompt ? prompt[user_idx++] : token;
      if (fed == LLM_EOS) user_turn = 1;
      next = llm_sample(&smp, st.logits + (size_t)j * model.c.vocab_size);
      pos++;
      if (user_idx >= n_prompt && next != LLM_EOS) {
        put_piece(llm_decode(&tokenizer, fed, next));
        fflush(stdout);
      }
      if (next == LLM_EOS) printf("\n");
      token = fed;
    }
  }
  printf("\n");
  fprintf(stderr, "chat: %d positions in %.1f ms, %.1f%% inside kvattn calls\n", pos, (llm_now() - t0) * 1e3,
          100.0 * st.t_kva / (llm_now() - t0 + 1e-12));
  report_cache(cache, c);
  free(rendered);
  free(prompt);
  llm_sampler_free(&smp);
  llm_state_free(&st);
  kva_cache_destroy(cache);
}

/* ======================================================================
   --ppl / --ppl-tokens: windows of seq_len tokens from an empty cache
   ====================================================================== */

static void perplexity(const options *o, config *cfg, int n_cfg, const int32_t *tok, int n) {
  int ci, W = model.c.seq_len, n_win = (n + W - 1) / W;
  int rows = o->chunk ? o->chunk : W;
  llm_state st;
  /* the logits of a chunk are held at once: keep them under ~256 MiB */
  long cap = (long)((256L << 20) / ((long)model.c.vocab_size * (long)sizeof(float)));
  if (rows > W) rows = W;
  if (rows > cap) rows = cap < 1 ? 1 : (int)cap;
  if (n < 2) die("--ppl: fewer than 2 tokens, nothing to predict");
  if (!llm_state_init(&st, &model, rows, o->threads)) die("out of memory");
  st.int_scores = o->int_scores;
  st.int_values = o->int_values;
  st.select_budget = o->select_budget, st.select_sink = o->select_sink, st.select_recent = o->select_recent;
  for (ci = 0; ci < n_cfg; ci++) {
    config *c = &cfg[ci];
    kva_cache *cache;
    double sum = 0.0, t0 = llm_now(), last = t0;
    long count = 0;
    int w;
    fp8_scales(o, c, o->threads);
    cache = make_cache(c, llm_blocks_for(&c->cache, W), 2);
    st.t_kva = 0;
    for (w = 0; w < n_win; w++) {
      int start = w * W, len = n - start < W ? n - start : W;
      kva_evict ev = resolve_evict(c->evict, len, &st, 0);
      kva_status s = llm_window_nll(&model, &st, cache, &ev, tok + start, len, start + len < n ? tok[start + len] : -1,
                                    rows, &sum, &count);
      if (s != KVA_OK) die("--ppl (%s): window %d failed: %s", c->name, w, kva_status_str(s));
      if (llm_now() - last > 2.0 || (w == n_win - 1 && llm_now() - t0 > 2.0)) {
        last = llm_now();
        fprintf(stderr, "ppl %s: window %d/%d, %ld tokens, loss so far %.4f, %.0f tok/s\n", c->name, w + 1, n_win,
                count, sum / (double)(count ? count : 1), (double)(start + len) / (last - t0));
      }
    }
    printf("ppl %.6f loss %.6f tokens %ld kv %lu %s\n", exp(sum / (double)count), sum / (double)count, count,
           (unsigned long)llm_cache_bytes_per_token(&model, &c->cache), c->name);
    fflush(stdout);
    fprintf(stderr, "ppl %s: %d tokens in %.2f s (%.0f tok/s), %.1f%% inside kvattn calls\n", c->name, n,
            llm_now() - t0, n / (llm_now() - t0 + 1e-12), 100.0 * st.t_kva / (llm_now() - t0 + 1e-12));
    kva_cache_destroy(cache);
  }
  llm_state_free(&st);
}

/* ======================================================================
   --logits-tokens: a test hook.  The ids as given, in chunks of --chunk
   rows (default: all = one prefill), every position's logits on stdout.
   ====================================================================== */

static void dump_logits(const options *o, config *c, const int32_t *tok, int n) {
  int rows = o->chunk && o->chunk < n ? o->chunk : n, seq, done = 0, t, v, V = model.c.vocab_size;
  kva_cache *cache;
  llm_state st;
  kva_evict ev;
  fp8_scales(o, c, o->threads);
  cache = make_cache(c, llm_blocks_for(&c->cache, n), 2);
  if (!llm_state_init(&st, &model, rows, o->threads)) die("out of memory (%d rows of logits)", rows);
  ev = resolve_evict(c->evict, n, &st, 0);
  st.int_scores = o->int_scores;
  st.int_values = o->int_values;
  st.select_budget = o->select_budget, st.select_sink = o->select_sink, st.select_recent = o->select_recent;
  if (kva_seq_new(cache, &seq) != KVA_OK) die("cannot start a sequence");
  if (ev.kind != KVA_EVICT_NONE && kva_seq_set_evict(cache, seq, &ev) != KVA_OK)
    die("--evict %s: not accepted", c->evict->text);
  while (done < n) {
    int k = n - done < rows ? n - done : rows;
    kva_status s = llm_forward(&model, &st, cache, seq, tok + done, k, st.logits, 1);
    if (s != KVA_OK) die("--logits-tokens: forward failed at position %d: %s", done, kva_status_str(s));
    for (t = 0; t < k; t++) {
      const float *lg = st.logits + (size_t)t * V;
      for (v = 0; v < V; v++) printf(v ? " %.9g" : "%.9g", lg[v]);
      putchar('\n');
    }
    done += k;
  }
  fflush(stdout);
  kva_cache_destroy(cache);
  llm_state_free(&st);
}

/* ======================================================================
   --serve: continuous batching.  Every step runs one forward over the rows
   of all running requests together (one token each when decoding, a chunk
   of the prompt when prefilling): the matrix products take all rows at
   once, the attention is kva_batch_plan + kva_attend_batch.  The common
   token prefix of the prompts is prefilled once, published and held, so
   every request starts from it (kva_seq_new_prefix).  A request is
   admitted when kva_seq_fits says its prompt fits now; when an append
   finds the pool full, the newest running request is preempted: its
   blocks are freed and it is recomputed later (prompt and the tokens it
   generated so far; its own prompt is published, so mostly a prefix hit).
   Each request samples with its own generator seeded with -s, exactly as
   it would alone, so its text equals `-i LINE` run alone.
   ====================================================================== */

typedef struct {
  int32_t *tok;   /* prompt, then generated */
  int n_tok, n_prompt, cap;
  int seq, n_cached, running, done, published, failed;
  char *text;     /* what stdout gets for it */
  size_t text_len, text_cap;
  llm_sampler smp;
} request;

static void text_add(request *r, const char *piece) {
  size_t n;
  if (!llm_piece_visible(piece)) return;
  n = strlen(piece);
  if (r->text_len + n + 1 > r->text_cap) {
    size_t cap = (r->text_cap + n + 1) * 2;
    char *g = (char *)realloc(r->text, cap);
    if (!g) die("out of memory");
    r->text = g, r->text_cap = cap;
  }
  memcpy(r->text + r->text_len, piece, n + 1);
  r->text_len += n;
}

static void serve(const options *o, config *c, int steps) {
  char *all = read_text(o->serve, "--serve"), *line;
  request *rq = NULL;
  int n_req = 0, cap_req = 0, i, lcp = 0, holder = -1, bs = c->cache.block_size ? c->cache.block_size : 16;
  int *run = NULL, n_run = 0, max_rows, step = 0, peak = 0, *seqs, *nq, *lrow, *who, n_blocks;
  int32_t *rows_tok;
  long generated = 0, preemptions = 0, computed = 0;
  kva_cache *cache;
  llm_state st;
  kva_cache_stats cs;
  kva_evict ev = resolve_evict(c->evict, steps, NULL, 0);
  double t0;
  load_tokenizer(o);
  /* requests: one per non-empty line; the forced prompt pieces are the start of each text */
  for (line = all; *line;) {
    char *eol = strchr(line, '\n'), *text;
    size_t len;
    request *r;
    int k, forced;
    if (eol) *eol = '\0';
    len = strlen(line);
    if (len > 0 && line[len - 1] == '\r') line[--len] = '\0';
    if (len > 0) {
      if (n_req == cap_req) {
        request *g = (request *)realloc(rq, (size_t)(cap_req = cap_req * 2 + 8) * sizeof *rq);
        if (!g) die("out of memory");
        rq = g;
      }
      r = &rq[n_req++];
      memset(r, 0, sizeof *r);
      text = (char *)malloc(len + (o->system ? strlen(o->system) : 0) + 2);
      if (!text) die("out of memory");
      /* a space between the system text and the line, unless one of them has it already */
      sprintf(text, "%s%s%s", o->system ? o->system : "",
              o->system && o->system[0] && !isspace((unsigned char)o->system[strlen(o->system) - 1]) &&
                      !isspace((unsigned char)line[0])
                  ? " "
                  : "",
              line);
      r->tok = encode_or_die(&tokenizer, text, 1, &r->n_prompt);
      free(text);
      r->cap = (r->n_prompt > steps ? r->n_prompt : steps) + 2;
      {
        int32_t *g = (int32_t *)realloc(r->tok, (size_t)r->cap * sizeof(int32_t));
        if (!g) die("out of memory");
        r->tok = g;
      }
      r->n_tok = r->n_prompt;
      r->seq = -1;
      if (!llm_sampler_init(&r->smp, model.c.vocab_size, o->temperature, o->topp, o->seed)) die("out of memory");
      forced = r->n_prompt - 1 < steps ? r->n_prompt - 1 : steps;
      for (k = 0; k < forced; k++) {
        if (r->tok[k + 1] == LLM_BOS) break;
        text_add(r, llm_decode(&tokenizer, r->tok[k], r->tok[k + 1]));
      }
      if (k < forced || forced == steps) r->done = 1; /* as alone: nothing to sample */
    }
    if (!eol) break;
    line = eol + 1;
  }
  free(all);
  if (n_req == 0) die("--serve %s: no prompts (one per line)", o->serve);
  /* the common token prefix of all prompts (at least the BOS) */
  lcp = rq[0].n_prompt;
  for (i = 1; i < n_req; i++) {
    int k = 0;
    while (k < lcp && k < rq[i].n_prompt && rq[i].tok[k] == rq[0].tok[k]) k++;
    lcp = k;
  }
  max_rows = 256 > o->max_batch ? 256 : o->max_batch;
  n_blocks = o->kv_blocks ? o->kv_blocks
                          : o->max_batch * llm_blocks_for(&c->cache, (long)steps + 1) + llm_blocks_for(&c->cache, lcp);
  if (o->prefix_dir) { /* published blocks the pool forgets go to files; lookups fetch them back */
    if (!tier_dir_open(&tier, o->prefix_dir))
      die("--prefix-dir: cannot use '%s' as a directory (create it, or give a writable one)", o->prefix_dir);
    c->cache.spill = tier_dir_spill, c->cache.fetch = tier_dir_fetch, c->cache.tier_user = &tier;
  }
#ifdef KVATTN_RUN_REDIS
  if (o->prefix_redis) { /* the same through a Redis server; 500 ms per command at most */
    char host[256];
    const char *colon = strrchr(o->prefix_redis, ':');
    int port = colon ? parse_int("--prefix-redis PORT", colon + 1, 1, 65535) : 0;
    if (!colon || colon == o->prefix_redis || (size_t)(colon - o->prefix_redis) >= sizeof host)
      die("--prefix-redis: '%s' is not HOST:PORT (for example 127.0.0.1:6379)", o->prefix_redis);
    memcpy(host, o->prefix_redis, (size_t)(colon - o->prefix_redis));
    host[colon - o->prefix_redis] = '\0';
    if (!tier_redis_open(&rtier, host, port, 500))
      die("--prefix-redis: no Redis server answers at %s (start one: redis-server --port %d)", o->prefix_redis, port);
    c->cache.spill = tier_redis_spill, c->cache.fetch = tier_redis_fetch, c->cache.tier_user = &rtier;
  }
#endif
  cache = make_cache(c, n_blocks, o->max_batch + 2);
  if (o->prefix_dir || o->prefix_redis) { /* an earlier run's blocks, into memory before the first request */
    int refused = 0, loaded;
    const char *where = o->prefix_dir ? "--prefix-dir" : "--prefix-redis";
#ifdef KVATTN_RUN_REDIS
    loaded = o->prefix_dir ? tier_dir_load(&tier, cache, &refused) : tier_redis_load(&rtier, cache, &refused);
#else
    loaded = tier_dir_load(&tier, cache, &refused);
#endif
    if (loaded < 0) die("%s %s: cannot list its records", where, o->prefix_dir ? o->prefix_dir : o->prefix_redis);
    fprintf(stderr, "serve: %s %s: %d records loaded at the start, %d refused (not this model's or cache's)\n",
            where, o->prefix_dir ? o->prefix_dir : o->prefix_redis, loaded, refused);
  }
  if (!llm_state_init(&st, &model, max_rows, o->threads)) die("out of memory");
  st.int_scores = o->int_scores;
  st.int_values = o->int_values;
  st.select_budget = o->select_budget, st.select_sink = o->select_sink, st.select_recent = o->select_recent;
  seqs = (int *)malloc((size_t)max_rows * sizeof(int));
  nq = (int *)malloc((size_t)max_rows * sizeof(int));
  lrow = (int *)malloc((size_t)max_rows * sizeof(int));
  who = (int *)malloc((size_t)max_rows * sizeof(int));
  rows_tok = (int32_t *)malloc((size_t)max_rows * sizeof(int32_t));
  run = (int *)malloc((size_t)n_req * sizeof(int));
  if (!seqs || !nq || !lrow || !who || !rows_tok || !run) die("out of memory");
  t0 = llm_now();
  /* the shared prefix: computed once, published, held by its own sequence
     until the end (its blocks are never recycled) */
  if (n_req > 1 && lcp / bs > 0 && ev.kind == KVA_EVICT_NONE) {
    int n_pub = lcp / bs * bs, have = 0;
    /* (with a prefix tier an earlier run may have left its blocks: all but what must be computed) */
    if (kva_seq_new_prefix(cache, rq[0].tok, n_pub < rq[0].n_tok ? n_pub + 1 : n_pub, 0, &holder, &have) != KVA_OK)
      die("cannot start a sequence");
    if ((have < n_pub && llm_forward(&model, &st, cache, holder, rq[0].tok + have, n_pub - have, NULL, 0) != KVA_OK) ||
        kva_seq_publish(cache, holder, rq[0].tok, n_pub, 0) != KVA_OK) {
      kva_seq_free(cache, holder); /* the pool is too small for it: go without */
      holder = -1;
    } else {
      computed += n_pub - have;
      fprintf(stderr, "serve: %d requests share a %d-token prefix (%d tokens in full blocks cached%s)\n", n_req, lcp,
              n_pub, have ? ", found in the prefix tier" : "");
    }
  }
  for (;;) {
    int n_seq = 0, n_rows = 0, n_logit = 0, k, all_done = 1;
    kva_status s;
    for (i = 0; i < n_req; i++) all_done &= rq[i].done;
    if (all_done) break;
    /* admission, lowest index first (a preempted request keeps its place) */
    for (i = 0; i < n_req && n_run < o->max_batch; i++) {
      request *r = &rq[i];
      int reused, seq;
      kva_fit fit;
      if (r->done || r->running) continue;
      if (kva_seq_new_prefix(cache, r->tok, r->n_tok, 0, &seq, &reused) != KVA_OK) break;
      if (ev.kind != KVA_EVICT_NONE) kva_seq_set_evict(cache, seq, &ev);
      fit = kva_seq_fits(cache, seq, r->n_tok - reused + 1, NULL);
      if (fit != KVA_FITS_NOW) {
        kva_seq_free(cache, seq);
        if (fit == KVA_FITS_NEVER || n_run == 0) { /* nothing running to wait for */
          fprintf(stderr, "serve: request %d (%d tokens) does not fit in the pool of %d blocks: stopped\n", i,
                  r->n_tok, n_blocks);
          r->done = r->failed = 1;
          continue;
        }
        break;
      }
      r->seq = seq;
      r->n_cached = reused;
      r->running = 1;
      run[n_run++] = i;
    }
    if (n_run == 0) continue; /* everything left failed to fit */
    if (n_run > peak) peak = n_run;
    /* this step's rows: decodes (1 row) for every running request, then
       prompt chunks with the rows left; append each (preempting the newest
       on a full pool) */
    for (k = 0; k < n_run && n_rows < max_rows; k++) {
      request *r = &rq[run[k]];
      int want = r->n_tok - r->n_cached, take;
      if (want <= 0) continue;
      take = want < max_rows - n_rows ? want : max_rows - n_rows;
      if (ev.kind != KVA_EVICT_NONE) take = 1; /* the policy acts token by token */
      while ((s = kva_seq_append(cache, r->seq, take)) == KVA_ERR_FULL) {
        int victim = run[n_run - 1], j;
        request *v = &rq[victim];
        preemptions++;
        kva_seq_free(cache, v->seq);
        v->seq = -1, v->running = 0, v->n_cached = 0, v->published = 0;
        n_run--;
        for (j = 0; j < n_seq; j++) /* it may have appended rows already this step */
          if (who[j] == victim) {
            int m, r0 = 0;
            for (m = 0; m < j; m++) r0 += nq[m];
            memmove(rows_tok + r0, rows_tok + r0 + nq[j], (size_t)(n_rows - r0 - nq[j]) * sizeof(int32_t));
            n_rows -= nq[j];
            memmove(seqs + j, seqs + j + 1, (size_t)(n_seq - j - 1) * sizeof(int));
            memmove(nq + j, nq + j + 1, (size_t)(n_seq - j - 1) * sizeof(int));
            memmove(who + j, who + j + 1, (size_t)(n_seq - j - 1) * sizeof(int));
            n_seq--;
            break;
          }
        if (victim == run[k] || k >= n_run) break; /* this request itself was the newest */
      }
      if (k >= n_run || rq[run[k]].seq < 0 || s != KVA_OK) {
        if (s != KVA_OK && s != KVA_ERR_FULL) die("serve: append failed: %s", kva_status_str(s));
        break;
      }
      memcpy(rows_tok + n_rows, r->tok + r->n_cached, (size_t)take * sizeof(int32_t));
      seqs[n_seq] = r->seq, nq[n_seq] = take, who[n_seq] = run[k];
      n_seq++;
      n_rows += take;
    }
    if (n_seq == 0) continue;
    for (k = 0, i = 0; k < n_seq; i += nq[k], k++)
      if (rq[who[k]].n_cached + nq[k] == rq[who[k]].n_tok) lrow[n_logit++] = i + nq[k] - 1;
    s = llm_forward_rows(&model, &st, cache, seqs, nq, n_seq, rows_tok, lrow, n_logit, st.logits);
    if (s != KVA_OK) die("serve: forward failed: %s", kva_status_str(s));
    computed += n_rows;
    step++;
    for (k = 0, n_logit = 0; k < n_seq; k++) {
      request *r = &rq[who[k]];
      int next, j;
      r->n_cached += nq[k];
      if (!r->published && r->n_cached >= r->n_prompt && ev.kind == KVA_EVICT_NONE) {
        kva_seq_publish(cache, r->seq, r->tok, r->n_prompt, 0); /* for its own recompute after a preemption */
        r->published = 1;
      }
      if (r->n_cached != r->n_tok) continue;
      next = llm_sample(&r->smp, st.logits + (size_t)n_logit++ * model.c.vocab_size);
      if (next != LLM_BOS) {
        text_add(r, llm_decode(&tokenizer, r->tok[r->n_tok - 1], next));
        r->tok[r->n_tok++] = next;
        generated++;
      }
      if (next == LLM_BOS || r->n_tok > steps) { /* finished: leave the batch */
        kva_seq_stats mem;
        r->done = 1;
        r->running = 0;
        if (kva_seq_get_stats(cache, r->seq, &mem) == KVA_OK) /* what it held at the end: report and bill */
          fprintf(stderr,
                  "serve: request %d done: %ld tokens held (%ld evicted, %ld demoted in %d blocks) in %d blocks, "
                  "%d shared; %.1f KiB, %.1f KiB its own; its share %.1f KiB\n",
                  who[k], mem.tokens, mem.tokens_evicted, mem.tokens_demoted, mem.demote_blocks, mem.blocks,
                  mem.blocks_shared, mem.bytes / 1024.0,
                  mem.bytes_own / 1024.0, mem.bytes_prorated / 1024.0);
        kva_seq_free(cache, r->seq);
        r->seq = -1;
        for (j = 0; j < n_run; j++)
          if (run[j] == who[k]) {
            memmove(run + j, run + j + 1, (size_t)(n_run - j - 1) * sizeof(int));
            n_run--;
            break;
          }
      }
    }
    if (step % 64 == 0) {
      int d = 0;
      for (i = 0; i < n_req; i++) d += rq[i].done;
      fprintf(stderr, "serve: step %d, %d running, %d/%d done\n", step, n_run, d, n_req);
    }
  }
  {
    double dt = llm_now() - t0;
    kva_cache_get_stats(cache, &cs);
    for (i = 0; i < n_req; i++) printf("[request %d] %s\n", i, rq[i].text ? rq[i].text : "");
    fflush(stdout);
    fprintf(stderr,
            "serve: %d requests, %ld tokens generated in %d steps, %.2f s: %.1f tok/s generated, %.1f tok/s "
            "computed (prefill + decode); peak batch %d, %ld preemptions; prefix cache hit rate %.1f%% (%ld of %ld "
            "prompt tokens reused, re-admissions included); %.1f%% of the time inside kvattn calls\n",
            n_req, generated, step, dt, generated / (dt + 1e-12), computed / (dt + 1e-12), peak, preemptions,
            cs.prefix_queries ? 100.0 * (double)cs.prefix_hits / (double)cs.prefix_queries : 0.0, cs.prefix_hits,
            cs.prefix_queries, 100.0 * st.t_kva / (dt + 1e-12));
  }
  report_cache(cache, c);
  if (o->prefix_dir || o->prefix_redis) { /* what this run published, for the next one */
    int saved = 0;
    kva_prefix_save(cache, &saved);
    kva_cache_get_stats(cache, &cs);
    fprintf(stderr,
            "serve: %s %s: %ld blocks loaded from it, %ld fetched, %ld refused, %d saved to it (%zu-byte records)\n",
            o->prefix_dir ? "--prefix-dir" : "--prefix-redis", o->prefix_dir ? o->prefix_dir : o->prefix_redis,
            cs.tier_loads, cs.tier_fetch_hits, cs.tier_fetch_refused, saved, kva_prefix_record_size(cache));
  }
  if (holder >= 0) kva_seq_free(cache, holder);
  for (i = 0; i < n_req; i++) {
    free(rq[i].tok);
    free(rq[i].text);
    llm_sampler_free(&rq[i].smp);
  }
  free(rq), free(run), free(seqs), free(nq), free(lrow), free(who), free(rows_tok);
  llm_state_free(&st);
  kva_cache_destroy(cache);
#ifdef KVATTN_RUN_REDIS
  tier_redis_close(&rtier);
#endif
}

/* ======================================================================
   main
   ====================================================================== */

/* ======================================================================
   --needle: retrieval accuracy per configuration, depth and context
   length (examples/needle.h).  Greedy whatever -t says: a case counts when
   the decoded answer's digits equal its answer.
   ====================================================================== */

#define NEEDLE_MAX_CTX 16 /* context-length buckets: 256 .. 8M */
#define NEEDLE_MAX_DEPTH 64

static void needle_mode(const options *o, config *cfg, int n_cfg, const needle_set *set) {
  double depth[NEEDLE_MAX_DEPTH];
  int ctx[NEEDLE_MAX_CTX], n_depth = 0, n_ctx = 0, ci, i, j, rows = 0;
  llm_state st;
  for (i = 0; i < set->n; i++) {
    const needle_case *k = &set->cases[i];
    for (j = 0; j < n_depth && depth[j] != k->depth; j++) {}
    if (j == n_depth) {
      if (n_depth == NEEDLE_MAX_DEPTH) die("--needle: more than %d different depths", NEEDLE_MAX_DEPTH);
      depth[n_depth++] = k->depth;
    }
    for (j = 0; j < n_ctx && ctx[j] != k->context; j++) {}
    if (j == n_ctx) {
      if (n_ctx == NEEDLE_MAX_CTX) die("--needle: more than %d context lengths", NEEDLE_MAX_CTX);
      ctx[n_ctx++] = k->context;
    }
    if (k->n > rows) rows = k->n;
  }
  /* depths and lengths in increasing order for the table */
  for (i = 1; i < n_depth; i++)
    for (j = i; j > 0 && depth[j - 1] > depth[j]; j--) {
      double t = depth[j];
      depth[j] = depth[j - 1], depth[j - 1] = t;
    }
  for (i = 1; i < n_ctx; i++)
    for (j = i; j > 0 && ctx[j - 1] > ctx[j]; j--) {
      int t = ctx[j];
      ctx[j] = ctx[j - 1], ctx[j - 1] = t;
    }
  if (!llm_state_init(&st, &model, rows, o->threads)) die("out of memory");
  st.int_scores = o->int_scores;
  st.int_values = o->int_values;
  st.select_budget = o->select_budget, st.select_sink = o->select_sink, st.select_recent = o->select_recent;
  for (ci = 0; ci < n_cfg; ci++) {
    config *c = &cfg[ci];
    int ok_at[NEEDLE_MAX_DEPTH][NEEDLE_MAX_CTX], n_at[NEEDLE_MAX_DEPTH][NEEDLE_MAX_CTX], ok_all = 0;
    double t0 = llm_now(), last = t0;
    kva_cache *cache;
    memset(ok_at, 0, sizeof ok_at);
    memset(n_at, 0, sizeof n_at);
    fp8_scales(o, c, o->threads);
    cache = make_cache(c, llm_blocks_for(&c->cache, model.c.seq_len), 2);
    for (i = 0; i < set->n; i++) {
      const needle_case *k = &set->cases[i];
      kva_evict ev = resolve_evict(c->evict, k->n, &st, 1);
      int ok, d, x;
      char got[128];
      kva_status s = needle_run(&model, &st, &tokenizer, cache, &ev, k, &ok, got, sizeof got);
      if (s != KVA_OK) die("--needle (%s): case %d failed: %s", c->name, i + 1, kva_status_str(s));
      for (d = 0; depth[d] != k->depth; d++) {}
      for (x = 0; ctx[x] != k->context; x++) {}
      ok_at[d][x] += ok;
      n_at[d][x]++;
      ok_all += ok;
      if (llm_now() - last > 2.0) {
        last = llm_now();
        fprintf(stderr, "needle %s: case %d/%d, %d right so far, %.0f s, about %.0f s left\n", c->name, i + 1, set->n,
                ok_all, last - t0, (last - t0) / (i + 1) * (set->n - i - 1));
      }
    }
    printf("needle %.4f right %d cases %d kv %lu %s\n", (double)ok_all / set->n, ok_all, set->n,
           (unsigned long)llm_cache_bytes_per_token(&model, &c->cache), c->name);
    printf("  depth");
    for (j = 0; j < n_ctx; j++) printf(" %9d", ctx[j]);
    printf("\n");
    for (i = 0; i < n_depth; i++) {
      printf("  %5.2f", depth[i]);
      for (j = 0; j < n_ctx; j++)
        if (n_at[i][j]) printf(" %4d/%-4d", ok_at[i][j], n_at[i][j]);
        else printf(" %9s", "-");
      printf("\n");
    }
    fflush(stdout);
    kva_cache_destroy(cache);
  }
  llm_state_free(&st);
}

int main(int argc, char **argv) {
  options o;
  config cfg[MAX_CONFIGS];
  int n_cfg, steps;
  char err[1024];
  parse_args(argc, argv, &o);
  if (!llm_model_load(&model, o.checkpoint, err, sizeof err)) die("%s", err);
  n_cfg = build_configs(&o, &model, cfg);
  steps = o.steps == 0 || o.steps > model.c.seq_len ? model.c.seq_len : o.steps;
  if (o.steps_given && o.steps > model.c.seq_len && !o.ppl && !o.ppl_tokens && !o.logits_tokens)
    fprintf(stderr, "%s: -n %d is more than the model's %d positions (seq_len): running %d\n", prog, o.steps,
            model.c.seq_len, steps);
  if (o.needle) {
    needle_set set;
    memset(&set, 0, sizeof set);
    load_tokenizer(&o);
    if (!needle_read(&set, o.needle, &tokenizer, model.c.seq_len, err, sizeof err)) die("--needle: %s", err);
    needle_mode(&o, cfg, n_cfg, &set);
    needle_set_free(&set);
  } else if (o.ppl || o.ppl_tokens) {
    int n;
    int32_t *tok;
    if (o.ppl) {
      char *text = read_text(o.ppl, "--ppl");
      load_tokenizer(&o);
      tok = encode_or_die(&tokenizer, text, 1, &n);
      free(text);
    } else {
      tok = read_ids(o.ppl_tokens, "--ppl-tokens", model.c.vocab_size, &n);
    }
    perplexity(&o, cfg, n_cfg, tok, n);
    free(tok);
  } else {
    if (n_cfg > 1)
      die("several configurations (a --kv-dtype list or several --evict) are for --ppl and --needle only");
    if (o.logits_tokens) {
      int n;
      int32_t *tok = read_ids(o.logits_tokens, "--logits-tokens", model.c.vocab_size, &n);
      dump_logits(&o, &cfg[0], tok, n);
      free(tok);
    } else {
      fp8_scales(&o, &cfg[0], o.threads);
      if (o.serve) serve(&o, &cfg[0], steps);
      else if (strcmp(o.mode, "chat") == 0) chat(&o, &cfg[0], steps);
      else generate(&o, &cfg[0], steps);
    }
  }
  if (have_tokenizer) llm_tokenizer_free(&tokenizer);
  llm_model_free(&model);
  return 0;
}
