/* bench/options.c - kvattn_bench's command line: --help, argument parsing and the defaults of
   each subcommand. */
#include "harness.h"

static void usage(void) {
  printf(
      "kvattn_bench %s (kvattn %s, kernels %s) - memory, speed, quality and paging of kvattn.h\n"
      "\n"
      "usage: kvattn_bench [SUBCOMMAND] [OPTIONS]   (the subcommand may stand anywhere)\n"
      "\n"
      "subcommands\n"
      "  summary     (default; what `make bench` runs) attention variants compared by memory per\n"
      "              token, speed and accuracy, on one screen of 100 columns (--full: every table):\n"
      "              bytes per token and GB at 131,072 tokens of four model presets (--full: every one)\n"
      "              for its own attention and MHA / GQA / MQA / MLA in f16, int8, int4 and fp8\n"
      "              (from the library, checked on a real cache), the presets against their published\n"
      "              configurations (one line); this machine's read bandwidth and FMA peak (one line);\n"
      "              one decode line per variant (f16, 1 thread, cold, 4096 and 32768 tokens); GQA\n"
      "              decode at the largest --ctx per dtype (f16, int8, int4, fp8_e4m3, fp8_e5m2; timed in\n"
      "              turns, at least 9 reps unless --reps) against the speed goals int8 <= 0.50, int4 <=\n"
      "              0.35, fp8 <= 0.75 of f16's time (goals, not checks: a missed goal fails nothing), with\n"
      "              each row's output error against f32 storage (integer scores and rotation included);\n"
      "              --full: rotation's store cost per token; the decode limits\n"
      "              (GQA f16 at the largest --ctx: 16-token blocks against one contiguous block, and the\n"
      "              read bandwidth reached on 1 and 2 threads) and the prefill limit (--prefill causal\n"
      "              queries, 1 thread, against the FMA peak, speed goal 0.75). --csv / --json:\n"
      "              every row (all seven dtypes of the memory table)\n"
      "  memory      bytes per token for MHA, MQA, GQA and MLA of each model, per dtype; at --ctx and\n"
      "              --batch; what fits --mem; checked against a real cache; the presets against their\n"
      "              published configurations; KV memory against context (the plot's data)\n"
      , BENCH_VERSION, KVATTN_VERSION_STRING, kva_simd_name());
  fputs(
      "  speed       read bandwidth (1 and all threads), FMA peak and the cost of an OpenMP parallel\n"
      "              region (fork/join); decode for the variants, dtypes, contexts, thread counts, cold\n"
      "              and warm (part decode); prefill (GFLOP/s against the FMA peak; part prefill); paged\n"
      "              cache against contiguous arrays (part contig); decode\n"
      "              thread scaling, 1 against 2 threads (or the largest --threads) for MQA, MLA (16 and\n"
      "              128 heads), GQA at 4096 and 32768 tokens (--quick: 4096; or --ctx), with a memcmp\n"
      "              of the outputs (part threads); continuous-batching decode: kva_attend_batch against\n"
      "              a loop of kva_attend_cache, GQA over --batch-seqs sequences and MQA over 2 long ones,\n"
      "              1 and 2 threads, plan time, outputs compared (part batch); verifying 16 draft\n"
      "              tokens: one tree-attention call (kva_attn.tree_parent: a chain, a binary tree, 2\n"
      "              chains of 8) against 16 single-token decode steps over the same prefix (--ctx), GQA\n"
      "              f16, 1 thread, and kva_seq_accept of a path of 8 (part tree)\n"
      , stdout);
  fputs(
      "  quality     decode output error of F16, BF16, INT8, INT4 and FP8 (E4M3, E5M2) storage against F32\n"
      "              storage and an fp64 reference, on random, heavy-hitter and outlier-key data (part\n"
      "              dtypes); eviction (part evict): WINDOW, WINDOW + 4 sinks and H2O at --budgets of a\n"
      "              --evict-ctx generation, each step's output against the full cache, bytes held,\n"
      "              kva_seq_len against the budget, decode time per step (H=8 G=2 D=64 f16); FP8 scale\n"
      "              calibration (part calib): for E4M3 and E5M2, on outlier-channel K and on V, the scale\n"
      "              of each kva_fp8_calibrate rule (ABSMAX, VLLM_K / VLLM_V, MSE; and 1.0), its\n"
      "              saturation and round-trip error, and the decode output error against f32 storage\n"
      "              with that scale in the cache (at the first --ctx, --trials queries); FP8 scales one\n"
      "              per cache, per layer and per layer and KV head (part scales: 6 layers whose K/V\n"
      "              ranges span 1/512 .. 64, decode error against f32 storage); KV-cache\n"
      "              configurations on the trained model of bench/model/ (part model: f32, f16, bf16,\n"
      "              int8, int4, fp8 with scale 1, calibrated, calibrated per layer and per head, f16 edge\n"
      "              layers + int8 / fp8 / int4, K int8 + V int4 and K int4 + V int8, WINDOW with and\n"
      "              without sinks and H2O at --budgets of seq_len): bytes per token, held-out loss and\n"
      "              perplexity, KL divergence from the f32 cache's next-token distributions, passkey\n"
      "              accuracy, decode tokens/s (--threads: its first value; --quick: 2 windows, 1\n"
      "              passkey case per distance); needle retrieval of the same configurations (part\n"
      "              needle, with the model part or alone: accuracy per depth and context length on\n"
      "              the model directory's needle_single.tsv / needle_multi.tsv; --quick: one case per\n"
      "              depth and length)\n"
      "  paged       decode time against block size (--block-sizes) with blocks in order or scattered;\n"
      "              ratios to one contiguous block and (f32) to plain arrays, the block-16 ratio against\n"
      "              a 1.05 target (part attn); memory waste of a request trace under continuous\n"
      "              batching, paged vs reserving max_len vs reserving the true length (part trace);\n"
      "              a shared system prompt across two salted tenants with and without prefix caching\n"
      "              (part prefix); block operations per second (part ops); kva_seq_export and\n"
      "              kva_seq_import of one sequence of the largest --ctx tokens (GQA, 2 layers; f16 and\n"
      "              int8, or --dtypes) in GB/s against a memcpy of the stream, the import checked to\n"
      "              continue bit-identically (part export); layer groups for hybrid local/global models\n"
      "              (Gemma 2, Gemma 3, GPT-OSS, Llama 4 patterns): a sequence's bytes at 4K/32K/128K\n"
      "              (or --ctx) against a full cache, and a decode step of one Gemma 3 pattern period\n"
      "              against a full cache with and without the same masks (part hybrid)\n"
      , stdout);
  fputs(
      "  plot-data   CSV for bench/plot.gp: memory against context and decode time against context\n"
      "              (1K..32K tokens; --sweep: 1K..128K, f16, cold and warm); with --out DIR writes\n"
      "              DIR/bench.csv and draws DIR/*.png if gnuplot is installed. `make plot\n"
      "              BENCH_ARGS=plot-data` does the same through the Makefile.\n"
      "  mla         MLA decode step, DeepSeek-V2 attention dims, 16 and 128 heads, 1K/4K/16K tokens:\n"
      "              absorbed against naive (--quick: 16 heads, 1K and 4K)\n"
      "  all         memory, speed, quality and paged\n"
      "\n"
      , stdout);
  fputs(
      "shapes and sizes\n"
      "  --model M           a preset (Llama-2-7B Llama-2-70B Llama-3-8B Llama-3-70B Mistral-7B DeepSeek-V2\n"
      "                      DeepSeek-V3) or a custom L,H,G,D[,LATENT,ROPE] (layers, query heads, KV heads,\n"
      "                      head dim; MLA dims default to latent 4*D, rope D/2). Repeatable; memory and\n"
      "                      summary; default: every preset\n"
      "  --shape H,G,D       the attention shape of speed, quality and paged (default 32,8,128); the\n"
      "                      variants are MHA (G=H), GQA (G), MQA (G=1), MLA (one latent head of\n"
      "                      4D + D/2 values, V = the first 4D, H query heads: absorbed decode)\n"
      "  --variants LIST     mha,gqa,mqa,mla (default: all; quality: gqa,mla; paged: gqa)\n"
      "  --dtypes LIST       f16,bf16,f32,int8,int4,fp8_e4m3,fp8_e5m2 (memory default: all seven; speed:\n"
      "                      f16,bf16,f32; summary: f16; quality: f16,bf16,int8,int4,fp8_e4m3,fp8_e5m2;\n"
      "                      paged: f16,f32)\n"
      "  --ctx LIST          context lengths; memory: default 131072; speed/summary: 4096,32768;\n"
      "                      quality: 4096; paged: 4096,32768; plot-data: 1024..32768 (1k = 1024)\n"
      "  --batch N           sequences for memory (default 1)\n"
      "  --batch-seqs N      speed batch: GQA sequences in the batch (default 32, --quick 8)\n"
      "  --batch-lens LO,HI  speed batch: their lengths, log-uniform in LO..HI (default 256,8192;\n"
      "                      --quick 256,2048); the MQA pair is 32768+16384 (--quick 8192+4096)\n"
      "  --mem SIZE          memory budget for memory (default 80GiB; suffixes B, KB, MB, GB, TB decimal;\n"
      "                      KiB, MiB, GiB, TiB or K, M, G, T binary)\n"
      "\n"
      , stdout);
  fputs(
      "timing\n"
      "  --threads LIST      thread counts (kva_attn.n_threads; default 1 for summary and paged, else\n"
      "                      1,<all>); bandwidth and FMA peak are measured for each, plus 1 and all.\n"
      "                      speed threads/batch compare 1 with the largest of LIST (default 2)\n"
      "  --modes LIST        cold,warm (cold reads a large buffer between calls to empty the caches;\n"
      "                      default both for speed and paged, cold for summary and plot-data)\n"
      "  --reps N            timed calls per row after one warm-up call (default 5, --quick 2; prefill\n"
      "                      at most 3); rows give the median and min-max. Without --reps, calls\n"
      "                      under 30 ms get more (up to ~0.15 s of calls; at most 15 cold, 51 warm)\n"
      "  --block-sizes LIST  paged: tokens per block (default 1,4,16,64,256)\n"
      "  --no-prefill        speed: skip prefill\n"
      "  --sweep             speed: only the context sweep (part sweep; with --parts, added to them):\n"
      "                      decode against context 1K..128K (--quick 1K..16K; or --ctx) for the variants,\n"
      "                      f16, 1 thread, cold and warm (or --dtypes, --threads, --modes), ns per cached\n"
      "                      token, to show the linear cost and the step where the KV outgrows the caches\n"
      "                      (MHA at 128K holds 2 GiB); plot-data: the same contexts, f16, cold and warm,\n"
      "                      for plot.gp's decode_per_token.png (`make plot BENCH_ARGS='plot-data --sweep'`)\n"
      "  --prefill N,CTX     speed: prefill queries and cached tokens (default 512,4096; --quick 128,1024)\n"
      "  --trials N          quality: random queries per row (default 8)\n"
      "  --bw-mib N          bandwidth buffer (default 1024 MiB: far larger than the LLC)\n"
      "  --flush-mib N       cold-cache flush buffer (default 256 MiB)\n"
      "  --seed N            random seed (default 1)\n"
      "\n"
      , stdout);
  fputs(
      "parts, traces and eviction\n"
      "  --parts LIST        which parts speed, quality and paged run (listed below); default all but\n"
      "                      sweep. paged without attn skips the machine measurements (e.g. `paged\n"
      "                      --parts trace,prefix,ops` takes seconds)\n"
      "  --trace-requests N  paged trace: requests (default 400, --quick 200); prompts log-uniform\n"
      "                      16..1024 tokens, outputs 16..512 (both capped by --max-len), seeded by --seed\n"
      "  --trace-pool N      paged trace: pool size in tokens (default 32768 = 128 MiB per layer)\n"
      "  --max-len N         paged trace: the reservation of the max_len scheme (default 2048)\n"
      "  --trace-blocks LIST paged trace: block sizes of the paged runs (default 8,16,32)\n"
      "  --prefix-requests N paged prefix: requests over the two tenants (default 128, --quick 64)\n"
      "  --evict-ctx N       quality evict: tokens generated (default 2048, --quick 1024)\n"
      "  --budgets LIST      quality evict: budgets in percent of --evict-ctx (default 10,20,50); the\n"
      "                      random-data rows use 20 (or the first); quality model: percent of seq_len\n"
      "  --budget-tokens LIST quality model: WINDOW, H2O and SELECT also at these token budgets (default\n"
      "                      256,512,1024; 0: none)\n"
      "  --configs WORDS     quality model, needle: only the configurations whose names contain one of\n"
      "                      these comma-separated words (e.g. SELECT,H2O; the f32 reference always runs)\n"
      "  --model-dir DIR     quality model, needle: the directory with model.bin, tokenizer.bin,\n"
      "                      heldout.ids and optionally calib.txt, passkey.tsv, needle_single.tsv and\n"
      "                      needle_multi.tsv (default bench/model, from the repository root; the\n"
      "                      retrieval model: --model-dir bench/retrieval --tokenizer bench/model/tokenizer.bin)\n"
      "  --model FILE        quality model, needle: a llama2.c checkpoint other than DIR/model.bin\n"
      "  --tokenizer FILE    quality model, needle: its tokenizer.bin, if not DIR/tokenizer.bin\n"
      "  --text FILE         quality needle: cases made from this text with the model's tokenizer (pass\n"
      "                      keys in its sentences at 5 depths, 1K and 2K tokens), not DIR's files;\n"
      "                      with --model, quality model's held-out text and FP8 calibration too\n"
      "\n"
      , stdout);
  fputs(
      "output\n"
      "  --csv               CSV: one header line, then one row per result; every section has the same\n"
      "                      columns (section, model, variant, dtype, ..., note); empty where n/a\n"
      "  --json              {\"tool\":..., \"rows\": [ {\"section\": ..., only the columns that apply} ]}\n"
      "  --out DIR           plot-data: write DIR/bench.csv (and plots) instead of stdout\n"
      "  --quick             smoke run: small contexts (1024,4096), 2 reps, 256 MiB bandwidth buffer,\n"
      "                      128 MiB flush buffer, prefill 128 over 1024, 2 quality trials, 200 trace\n"
      "                      and 64 prefix requests, 3 rounds of block operations, eviction over 1024;\n"
      "                      speed: thread scaling at 4096, a batch of 8 sequences of 256..2048 and an\n"
      "                      MQA pair of 8192+4096, --sweep to 16K; quality calib over 1024 tokens;\n"
      "                      quality model over 2 windows and 1 passkey case per distance\n"
      "  --full              summary: every model preset and column of the memory table, the\n"
      "                      min-max columns and rotation's store cost (default: one screen, 100 columns)\n"
      "  --quiet             no progress on stderr\n"
      "  --help              this text\n"
      "\n"
      "Every figure comes from the library (kva_cache_bytes_per_token, kva_cache_get_stats,\n"
      "kva_attend_cache, kva_attend). Exit status: 0, or 1 if a check failed (a preset against its\n"
      "published configuration, the allocator, outputs compared bitwise) or a call failed\n"
      "unexpectedly, 2 on bad options.\n",
      stdout);
  printf("\nparts (--parts): %s\n", part_list());
}

static int bad(const char *what, const char *arg) {
  fprintf(stderr, "kvattn_bench: bad %s: '%s' (try --help)\n", what, arg ? arg : "(missing)");
  return 2;
}

int parse_args(int argc, char **argv, opts *o, set_flags *sf) {
  int i, cmd_seen = 0;
  memset(o, 0, sizeof *o);
  memset(sf, 0, sizeof *sf);
  o->cmd = "summary";
  o->batch = 1;
  o->mem = 80.0 * GiB;
  o->H = 32; o->G = 8; o->D = 128;
  o->reps = 5;
  o->bw_bytes = 1024 * MiB;
  o->flush_bytes = 256 * MiB;
  o->prefill = 1;
  o->prefill_nq = 512;
  o->prefill_ctx = 4096;
  o->trials = 8;
  o->seed = 1;
  o->parts = PART_ALL;
  o->trace_reqs = 400;
  o->trace_pool = 32768;
  o->max_len = 2048;
  o->trace_bs[0] = 8; o->trace_bs[1] = 16; o->trace_bs[2] = 32; o->n_trace_bs = 3;
  o->prefix_reqs = 128;
  o->evict_ctx = 2048;
  o->batch_seqs = 32;
  o->batch_lo = 256;
  o->batch_hi = 8192;
  o->budgets[0] = 10; o->budgets[1] = 20; o->budgets[2] = 50; o->n_budgets = 3;
  o->budget_tokens[0] = 256; o->budget_tokens[1] = 512; o->budget_tokens[2] = 1024; o->n_budget_tokens = 3;
  for (i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    long tmp[MAXL];
    int n, k;
#define NEEDV() do { if (!v) return bad("option value", a); i++; } while (0)
    if (a[0] != '-') { /* the subcommand, anywhere (make plot puts --csv first) */
      static const char *cmds[] = {"summary", "memory", "speed", "quality", "paged", "plot-data", "mla", "all"};
      int ok = 0;
      for (k = 0; k < NV(cmds); k++)
        if (!strcmp(a, cmds[k])) { o->cmd = cmds[k]; ok = 1; }
      if (!ok || cmd_seen++) return bad(ok ? "command line (two subcommands)" : "subcommand", a);
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); exit(0); }
    else if (!strcmp(a, "--csv")) g_fmt = OUT_CSV;
    else if (!strcmp(a, "--json")) g_fmt = OUT_JSON;
    else if (!strcmp(a, "--quick")) o->quick = 1;
    else if (!strcmp(a, "--full")) o->full = 1;
    else if (!strcmp(a, "--quiet")) g_quiet = 1;
    else if (!strcmp(a, "--no-prefill")) o->prefill = 0;
    else if (!strcmp(a, "--sweep")) o->sweep = 1;
    else if (!strcmp(a, "--ctx")) {
      NEEDV();
      if ((n = parse_ints(v, o->ctx, MAXL)) <= 0) return bad("--ctx", v);
      for (k = 0; k < n; k++) if (o->ctx[k] < 1 || o->ctx[k] > (1L << 30)) return bad("--ctx", v);
      o->n_ctx = n; sf->ctx = 1; o->ctx_set = 1;
    } else if (!strcmp(a, "--batch")) {
      NEEDV();
      if (parse_ints(v, tmp, 1) != 1 || tmp[0] < 1) return bad("--batch", v);
      o->batch = tmp[0];
    } else if (!strcmp(a, "--batch-seqs")) {
      NEEDV();
      if (parse_ints(v, tmp, 1) != 1 || tmp[0] < 1 || tmp[0] > 4096) return bad("--batch-seqs (1..4096)", v);
      o->batch_seqs = (int)tmp[0]; o->batch_seqs_set = 1;
    } else if (!strcmp(a, "--batch-lens")) {
      NEEDV();
      if (parse_ints(v, tmp, 2) != 2 || tmp[0] < 1 || tmp[1] < tmp[0] || tmp[1] > (1L << 24))
        return bad("--batch-lens (LO,HI with 1 <= LO <= HI)", v);
      o->batch_lo = (int)tmp[0]; o->batch_hi = (int)tmp[1]; o->batch_lens_set = 1;
    } else if (!strcmp(a, "--mem")) {
      NEEDV();
      if (!parse_size(v, &o->mem) || o->mem < 1) return bad("--mem", v);
    } else if (!strcmp(a, "--reps")) {
      NEEDV();
      if (parse_ints(v, tmp, 1) != 1 || tmp[0] < 1 || tmp[0] > 256) return bad("--reps", v);
      o->reps = (int)tmp[0]; o->reps_set = 1;
    } else if (!strcmp(a, "--trials")) {
      NEEDV();
      if (parse_ints(v, tmp, 1) != 1 || tmp[0] < 1 || tmp[0] > 1024) return bad("--trials", v);
      o->trials = (int)tmp[0]; sf->trials = 1;
    } else if (!strcmp(a, "--seed")) {
      NEEDV();
      o->seed = strtoull(v, NULL, 10);
    } else if (!strcmp(a, "--threads")) {
      NEEDV();
      if ((n = parse_ints(v, o->threads, MAXL)) <= 0) return bad("--threads", v);
      for (k = 0; k < n; k++) if (o->threads[k] < 1 || o->threads[k] > 1024) return bad("--threads", v);
      o->n_threads = n; sf->threads = 1; o->threads_set = 1;
    } else if (!strcmp(a, "--block-sizes")) {
      NEEDV();
      if ((n = parse_ints(v, o->bs, MAXL)) <= 0) return bad("--block-sizes", v);
      for (k = 0; k < n; k++) if (o->bs[k] < 1 || o->bs[k] > (1L << 20)) return bad("--block-sizes", v);
      o->n_bs = n; sf->bs = 1;
    } else if (!strcmp(a, "--shape")) {
      NEEDV();
      if (parse_ints(v, tmp, 3) != 3 || tmp[0] < 1 || tmp[1] < 1 || tmp[2] < 2 || tmp[0] % tmp[1] || tmp[2] > 1024 ||
          tmp[0] > 1024)
        return bad("--shape (H,G,D with H %% G == 0)", v);
      o->H = (int)tmp[0]; o->G = (int)tmp[1]; o->D = (int)tmp[2];
    } else if (!strcmp(a, "--prefill")) {
      NEEDV();
      if (parse_ints(v, tmp, 2) != 2 || tmp[0] < 1 || tmp[1] < tmp[0]) return bad("--prefill (N,CTX, N <= CTX)", v);
      o->prefill_nq = (int)tmp[0]; o->prefill_ctx = (int)tmp[1]; o->prefill_set = 1;
    } else if (!strcmp(a, "--bw-mib") || !strcmp(a, "--flush-mib")) {
      NEEDV();
      if (parse_ints(v, tmp, 1) != 1 || tmp[0] < 1 || tmp[0] > 65536) return bad(a, v);
      if (a[2] == 'b') o->bw_bytes = (double)tmp[0] * MiB;
      else o->flush_bytes = (double)tmp[0] * MiB;
    } else if (!strcmp(a, "--parts")) {
      char buf[128], *tok, *save = NULL;
      NEEDV();
      o->parts = 0;
      snprintf(buf, sizeof buf, "%s", v);
      for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int found = -1;
        for (k = 0; k < NPART; k++)
          if (!strcmp(tok, bench_parts[k].name)) found = k;
        if (found < 0) {
          char what[600];
          snprintf(what, sizeof what, "--parts (%s)", part_list());
          return bad(what, v);
        }
        o->parts |= bench_parts[found].bit;
      }
      o->parts_set = 1;
    } else if (!strcmp(a, "--trace-requests") || !strcmp(a, "--prefix-requests")) {
      NEEDV();
      if (parse_ints(v, tmp, 1) != 1 || tmp[0] < 2 || tmp[0] > 100000) return bad(a, v);
      if (a[2] == 't') { o->trace_reqs = (int)tmp[0]; o->trace_reqs_set = 1; }
      else { o->prefix_reqs = (int)tmp[0]; o->prefix_reqs_set = 1; }
    } else if (!strcmp(a, "--trace-pool")) {
      NEEDV();
      if (parse_ints(v, tmp, 1) != 1 || tmp[0] < 1024 || tmp[0] > (1L << 24)) return bad("--trace-pool (tokens, >= 1024)", v);
      o->trace_pool = (int)tmp[0];
    } else if (!strcmp(a, "--max-len")) {
      NEEDV();
      if (parse_ints(v, tmp, 1) != 1 || tmp[0] < 64 || tmp[0] > (1L << 20)) return bad("--max-len (>= 64)", v);
      o->max_len = (int)tmp[0];
    } else if (!strcmp(a, "--trace-blocks")) {
      NEEDV();
      if ((n = parse_ints(v, o->trace_bs, MAXL)) <= 0) return bad("--trace-blocks", v);
      for (k = 0; k < n; k++) if (o->trace_bs[k] < 1 || o->trace_bs[k] > 4096) return bad("--trace-blocks", v);
      o->n_trace_bs = n;
    } else if (!strcmp(a, "--evict-ctx")) {
      NEEDV();
      if (parse_ints(v, tmp, 1) != 1 || tmp[0] < 256 || tmp[0] > (1L << 20)) return bad("--evict-ctx (>= 256)", v);
      o->evict_ctx = (int)tmp[0]; o->evict_ctx_set = 1;
    } else if (!strcmp(a, "--budgets")) {
      NEEDV();
      if ((n = parse_ints(v, o->budgets, MAXL)) <= 0) return bad("--budgets", v);
      for (k = 0; k < n; k++) if (o->budgets[k] < 2 || o->budgets[k] > 100) return bad("--budgets (percent, 2..100)", v);
      o->n_budgets = n;
    } else if (!strcmp(a, "--budget-tokens")) {
      NEEDV();
      if ((n = parse_ints(v, o->budget_tokens, MAXL)) <= 0) return bad("--budget-tokens", v);
      for (k = 0; k < n; k++)
        if (o->budget_tokens[k] < 0 || o->budget_tokens[k] > 1000000) return bad("--budget-tokens (0..1,000,000)", v);
      o->n_budget_tokens = n == 1 && o->budget_tokens[0] == 0 ? 0 : n;
    } else if (!strcmp(a, "--configs")) {
      NEEDV();
      if (!*v) return bad("--configs", v);
      o->configs = v;
    } else if (!strcmp(a, "--model-dir")) {
      NEEDV();
      o->model_dir = v;
    } else if (!strcmp(a, "--model")) {
      NEEDV();
      o->model_file = v;
    } else if (!strcmp(a, "--tokenizer")) {
      NEEDV();
      o->tokenizer_file = v;
    } else if (!strcmp(a, "--text")) {
      NEEDV();
      o->text_file = v;
    } else if (!strcmp(a, "--out")) {
      NEEDV();
      o->out_dir = v;
    } else if (!strcmp(a, "--modes")) {
      char buf[64], *tok, *save = NULL;
      NEEDV();
      o->cold = o->warm = 0;
      snprintf(buf, sizeof buf, "%s", v);
      for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (!strcmp(tok, "cold")) o->cold = 1;
        else if (!strcmp(tok, "warm")) o->warm = 1;
        else return bad("--modes", v);
      }
      o->modes_set = 1;
    } else if (!strcmp(a, "--dtypes")) {
      char buf[128], *tok, *save = NULL;
      NEEDV();
      o->n_dtypes = 0;
      snprintf(buf, sizeof buf, "%s", v);
      for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        if (o->n_dtypes >= 8 || !parse_dtype(tok, &o->dtypes[o->n_dtypes++])) return bad("--dtypes", v);
      sf->dtypes = 1; o->dtypes_set = 1;
    } else if (!strcmp(a, "--variants")) {
      char buf[64], *tok, *save = NULL;
      NEEDV();
      o->n_variants = 0;
      snprintf(buf, sizeof buf, "%s", v);
      for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int found = -1;
        for (k = 0; k < NVARIANT; k++) {
          char lo[8];
          int z;
          for (z = 0; variant_name[k][z]; z++) lo[z] = (char)tolower((unsigned char)variant_name[k][z]);
          lo[z] = 0;
          if (!strcmp(tok, lo) || !strcmp(tok, variant_name[k])) found = k;
        }
        if (found < 0 || o->n_variants >= NVARIANT) return bad("--variants", v);
        o->variants[o->n_variants++] = found;
      }
      sf->variants = 1; o->variants_set = 1;
    } else if (!strcmp(a, "--model")) {
      model *mo;
      const model *p;
      NEEDV();
      if (o->n_models >= 32) return bad("--model (too many)", v);
      mo = &o->models[o->n_models];
      if ((p = preset(v)) != NULL) *mo = *p;
      else {
        n = parse_ints(v, tmp, 6);
        if ((n != 4 && n != 6) || tmp[0] < 1 || tmp[1] < 1 || tmp[2] < 1 || tmp[3] < 2 || tmp[1] % tmp[2] ||
            tmp[0] > 4096 || tmp[1] > 65536 || tmp[3] > 65536)
          return bad("--model (a preset name or L,H,G,D[,LATENT,ROPE] with H % G == 0)", v);
        memset(mo, 0, sizeof *mo);
        snprintf(mo->name, sizeof mo->name, "custom %ld,%ld,%ld,%ld", tmp[0], tmp[1], tmp[2], tmp[3]);
        mo->L = (int)tmp[0]; mo->H = (int)tmp[1]; mo->G = (int)tmp[2]; mo->D = (int)tmp[3];
        mo->native = tmp[2] == tmp[1] ? V_MHA : tmp[2] == 1 ? V_MQA : V_GQA;
        if (n == 6) {
          if (tmp[4] < 1 || tmp[5] < 0) return bad("--model MLA dims", v);
          mo->latent = (int)tmp[4]; mo->rope = (int)tmp[5];
        }
      }
      o->n_models++; sf->models = 1;
    } else return bad("option", a);
#undef NEEDV
  }
  if (o->sweep) /* speed --sweep: the sweep alone, unless --parts names more */
    o->parts = o->parts_set ? o->parts | PART_SWEEP
                            : (o->parts & ~(unsigned)(PART_DECODE | PART_PREFILL | PART_CONTIG | PART_THREADS | PART_BATCH |
                                                      PART_TREE)) |
                                  PART_SWEEP;
  return 0;
}

/* defaults that depend on the subcommand */
void defaults_for(opts *o, const set_flags *sf, const char *cmd) {
  int k;
  o->cmd = cmd;
  if (!sf->ctx) {
    static const long mem_ctx[] = {131072}, speed_ctx[] = {4096, 32768}, quick_ctx[] = {1024, 4096},
                      q_ctx[] = {4096}, qq_ctx[] = {1024},
                      plot_ctx[] = {1024, 2048, 4096, 8192, 16384, 32768}, plotq_ctx[] = {1024, 2048, 4096};
    const long *src = speed_ctx;
    int n = 2;
    if (!strcmp(cmd, "memory")) { src = mem_ctx; n = 1; }
    else if (!strcmp(cmd, "quality")) { src = o->quick ? qq_ctx : q_ctx; n = 1; }
    else if (!strcmp(cmd, "plot-data")) { src = o->quick ? plotq_ctx : plot_ctx; n = o->quick ? 3 : 6; }
    else if (o->quick) src = quick_ctx;
    for (k = 0; k < n; k++) o->ctx[k] = src[k];
    o->n_ctx = n;
  }
  if (!sf->dtypes) {
    static const kva_dtype speed_dt[] = {KVA_F16, KVA_BF16, KVA_F32},
                           q_dt[] = {KVA_F16, KVA_BF16, KVA_INT8, KVA_INT4, KVA_FP8_E4M3, KVA_FP8_E5M2},
                           paged_dt[] = {KVA_F16, KVA_F32};
    const kva_dtype *src = speed_dt;
    int n = 3;
    if (!strcmp(cmd, "memory")) { src = all_dtypes; n = N_ALL_DTYPES; }
    else if (!strcmp(cmd, "summary")) n = 1;
    else if (!strcmp(cmd, "quality")) { src = q_dt; n = NV(q_dt); }
    else if (!strcmp(cmd, "paged")) { src = paged_dt; n = 2; }
    for (k = 0; k < n; k++) o->dtypes[k] = src[k];
    o->n_dtypes = n;
  }
  if (!sf->variants) {
    if (!strcmp(cmd, "quality")) { o->variants[0] = V_GQA; o->variants[1] = V_MLA; o->n_variants = 2; }
    else if (!strcmp(cmd, "paged")) { o->variants[0] = V_GQA; o->n_variants = 1; }
    else {
      for (k = 0; k < NVARIANT; k++) o->variants[k] = k;
      o->n_variants = NVARIANT;
    }
  }
  if (!sf->threads) {
    o->threads[0] = 1;
    o->n_threads = 1;
    if (!strcmp(cmd, "speed") && max_threads() > 1) { o->threads[1] = max_threads(); o->n_threads = 2; }
  }
  if (!o->modes_set) {
    o->cold = 1;
    o->warm = !strcmp(cmd, "speed") || !strcmp(cmd, "paged");
  }
  if (!sf->bs) {
    static const long b[] = {1, 4, 16, 64, 256};
    for (k = 0; k < 5; k++) o->bs[k] = b[k];
    o->n_bs = 5;
  }
  if (!sf->models) {
    for (k = 0; k < NPRESET; k++) o->models[k] = presets[k];
    o->n_models = NPRESET;
  }
  if (o->quick) {
    if (!o->prefill_set) { o->prefill_nq = 128; o->prefill_ctx = 1024; }
    if (!o->reps_set) o->reps = 2;
    if (!sf->trials) o->trials = 2;
    if (!o->trace_reqs_set) o->trace_reqs = 200;
    if (!o->prefix_reqs_set) o->prefix_reqs = 64;
    if (!o->evict_ctx_set) o->evict_ctx = 1024;
    if (!o->batch_seqs_set) o->batch_seqs = 8;
    if (!o->batch_lens_set) { o->batch_lo = 256; o->batch_hi = 2048; }
  }
}
