/* bench/harness.h - what every kvattn_bench source file shares: result rows and their output
   (aligned tables, CSV, JSON), options, the machine probes (read bandwidth, FMA peak, OpenMP
   fork/join), cold-cache flushing and timing, and caches filled with random data.

   The program: main.c (dispatch), options.c (--help, argument parsing, per-subcommand defaults),
   harness.c (this header's functions), and one file per subcommand or part of one:
     bench_summary.c          summary (the default): decode per variant, decode and error per dtype
     bench_memory.c           memory: bytes per token of every preset, checks, memory against
                              context; the summary's memory table
     bench_speed.c            speed: decode, prefill, paged vs contiguous, context sweep
     bench_speed_threads.c    speed: thread scaling and continuous batching
     bench_quality.c          quality: storage dtype error, FP8 scale calibration; the summary's
                              error column
     bench_quality_evict.c    quality: eviction against the full cache
     bench_quality_model.c    quality: KV-cache configurations on the trained model in bench/model/
     bench_paged.c            paged: decode against block size and layout
     bench_paged_alloc.c      paged: request trace, prefix caching, block operations
     bench_mla.c              mla: absorbed against naive MLA decode
     bench_hybrid.c           paged: layer groups (hybrid local/global models): memory against
                              a full cache per model pattern, a Gemma 3 decode step
     bench_seq.c              paged: sequence export / import against memcpy; speed: tree
                              attention (16 drafts) against 16 decode steps, kva_seq_accept
   The Makefile compiles every .c file in bench/ into build/kvattn_bench (kvattn.h's functions are
   static inline: each file includes it through this header).

   Adding a part to a subcommand (e.g. a "model" part of quality in bench/bench_quality_model.c):
     1. write bench/bench_quality_model.c: #include "harness.h", then
          void quality_model(const opts *o, const machine *m) { ... }
        which adds rows (rows_add, rs, rn), prints them (print_table / text; both print only in
        table mode), writes them (emit_rows: CSV / JSON) and sets g_failed on a failed check;
        m is the measured machine for speed and paged attn, NULL where nothing was measured
        (quality; paged without attn): (void)m if the part has no use for it;
     2. add one line to BENCH_PARTS below: X(MODEL, "model", "quality", quality_model)
        (the list's order is the order a subcommand runs its parts; --parts accepts the name, the
        part runs by default unless it is listed in PART_OPT_IN);
     3. new options: a field in opts, its parsing in parse_args and a line in usage (options.c);
        new CSV/JSON columns: an X(...) entry in COLUMNS.
   The Makefile and the test matrix pick the new file up by themselves (every .c file in bench/). */
#ifndef KVATTN_BENCH_HARNESS_H
#define KVATTN_BENCH_HARNESS_H

#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <ctype.h>
#include <unistd.h>

#include "kvattn.h"

#ifdef _OPENMP
#include <omp.h>
#endif
/* whether the library threads (it ignores OpenMP under KVATTN_NO_OPENMP) */
#if defined(_OPENMP) && !defined(KVATTN_NO_OPENMP)
#define BENCH_OMP 1
#else
#define BENCH_OMP 0
#endif

#define BENCH_VERSION "1.0"
#define GiB (1024.0 * 1024.0 * 1024.0)
#define MiB (1024.0 * 1024.0)
#define NV(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define MAXL 16

/* ---- utilities (harness.c) ---- */
double now_s(void);
void *xalloc(size_t n); /* 64-byte aligned; exits with a message when memory runs out */
char *xstrdup(const char *s);
int max_threads(void);
uint64_t rng_u64(uint64_t *s); /* splitmix64 */
double rng_unif(uint64_t *s);
double rng_gauss(uint64_t *s);
int parse_dtype(const char *s, kva_dtype *t);
void fmt_sep(double v, char *buf, size_t n);        /* 12345678 -> "12,345,678" */
int parse_size(const char *s, double *out);         /* "80GiB", "512MB", ... */
int parse_ints(const char *s, long *out, int max);  /* "1,2,4k" -> count, -1 on a bad list */
int cmp_double(const void *a, const void *b);
double median_d(const double *x, int n);
int rand_log_int(uint64_t *rng, int lo, int hi);    /* log-uniform in [lo, hi] */

/* ---- results: rows with a fixed superset of columns; tables, CSV, JSON ---- */

#define COLUMNS(X)                                                                                       \
  X(SECTION, "section") X(MODEL, "model") X(VARIANT, "variant") X(DTYPE, "dtype") X(LAYERS, "n_layers")  \
  X(HEADS, "n_heads") X(KVHEADS, "n_kv_heads") X(HEADDIM, "head_dim") X(VDIM, "v_dim")                   \
  X(WINDOW, "window") X(CTX, "ctx") X(BATCH, "batch") X(THREADS, "threads") X(BLOCK, "block_size")       \
  X(LAYOUT, "layout") X(MODE, "mode") X(NQ, "n_q") X(PATTERN, "pattern")                                 \
  X(BPTL, "bytes_per_token_layer") X(BPT, "bytes_per_token") X(VSMHA, "vs_mha")                         \
  X(BYTESCTX, "bytes_at_ctx") X(MEM, "mem_budget") X(MAXCTX, "max_ctx") X(MAXBATCH, "max_batch")          \
  X(ALLOC, "alloc_check") X(PAD, "pad_bytes_per_block")                                                  \
  X(TMED, "time_med_s") X(TMIN, "time_min_s") X(TMAX, "time_max_s") X(KVBYTES, "kv_bytes")               \
  X(GBPS, "gbps") X(BW, "bw_gbps") X(BWRATIO, "bw_ratio") X(GFLOP, "gflop") X(GFLOPS, "gflops")          \
  X(PEAK, "peak_gflops") X(FMARATIO, "fma_ratio") X(BOUND, "bound") X(ROOFRATIO, "roof_ratio")           \
  X(BASET, "base_time_s") X(RATIO, "ratio") X(MAXABS, "max_abs_err") X(RELRMS, "rel_rms_err")            \
  X(MAXABS64, "max_abs_err_fp64") X(RELRMS64, "rel_rms_err_fp64") X(MASS, "heavy_mass")                  \
  X(NAME, "name") X(VALUE, "value") X(UNIT, "unit") X(EXPECTED, "expected") X(PASS, "pass")              \
  X(SCHEME, "scheme") X(TENANT, "tenant") X(NREQ, "n_requests") X(POOLTOK, "pool_tokens")                 \
  X(BUSED, "bytes_used_avg") X(BPEAK, "bytes_used_peak") X(BNEED, "bytes_needed_avg") X(WASTE, "waste")    \
  X(WRES, "waste_reserved") X(WSLACK, "waste_never_used") X(OCC, "occupancy") X(RUNAVG, "running_avg")     \
  X(RUNPEAK, "running_peak") X(GAIN, "batch_gain") X(STEPS, "steps") X(PREEMPT, "preemptions")             \
  X(PQ, "prefix_queries") X(PH, "prefix_hits") X(HITRATE, "hit_rate") X(REUSE1, "first_reused")            \
  X(PREFILLTOK, "prefill_tokens") X(SAVED, "mem_saved") X(BCACHED, "bytes_cached_avg")                     \
  X(OPS, "ops_per_s") X(NSOP, "ns_per_op") X(BPO, "blocks_per_op") X(NSBLK, "ns_per_block")                \
  X(POLICY, "policy") X(BUDGET, "budget") X(BUDGETFRAC, "budget_frac") X(NSINK, "n_sink")                 \
  X(NRECENT, "n_recent") X(HELD, "held") X(ERRMEAN, "rel_err_mean") X(ERRMAX, "rel_err_max")               \
  X(HEAVYKEPT, "heavy_kept") X(RECENTMASS, "recent_mass") X(BHELD, "bytes_held") X(BFRAC, "bytes_vs_full") \
  X(STEPMID, "step_s_mid") X(STEPEND, "step_s_end") X(STEPRATIO, "step_end_over_mid")                      \
  X(NSTOK, "ns_per_token") X(BASEMIN, "base_time_min_s") X(BASEMAX, "base_time_max_s")                     \
  X(RATIOMIN, "ratio_min") X(PLAN, "plan_s") X(PLANFRAC, "plan_over_run") X(TOKENS, "tokens_total") X(LENS, "lengths")                   \
  X(SPLITS, "kv_splits") X(UNITS, "work_units") X(IDENT, "identical") X(TENSOR, "tensor") X(RULE, "rule")    \
  X(SCALE, "scale") X(RTRMS, "roundtrip_rel_rms") X(SAT, "saturated")                                       \
  X(LOSS, "loss_nats") X(PPL, "perplexity") X(DLOSS, "loss_delta") X(KL, "kl_mean")                        \
  X(KLQ1, "kl_first_quarter") X(KLQ4, "kl_last_quarter") X(PK25, "passkey_0_25") X(PK50, "passkey_0_5")       \
  X(PK90, "passkey_0_9") X(PKN, "passkey_cases") X(TOKS, "decode_tok_per_s") X(KVASHARE, "decode_kvattn_share") \
  X(KSCALE, "k_scale") X(VSCALE, "v_scale") X(METAPT, "bookkeeping_per_token")                              \
  X(METALEAN, "bookkeeping_per_token_lean") X(BOUNDSPT, "block_bounds_per_token") X(DEMOTEPT, "demoted_int4_bytes_per_token")                           \
  X(STREAMBPT, "stream_bytes_per_token") X(STREAMOVER, "stream_over_cache_bytes")                           \
  X(BRATIO, "bytes_vs_base") X(TBRATIO, "time_over_bytes_vs_base") X(NDEPTH, "needle_depth") X(NDL1, "needle_single") X(NDL2, "needle_multi")                             \
  X(SOURCE, "source") X(NOTE, "note")

#define X_ENUM(id, name) C_##id,
enum { COLUMNS(X_ENUM) NCOL };
extern const char *const col_name[NCOL];

typedef struct {
  unsigned char kind[NCOL]; /* 0 unset, 1 number, 2 string */
  double num[NCOL];
  char *str[NCOL];
} row;

typedef struct {
  row *r;
  int n, cap;
} rows;

enum { OUT_TABLE, OUT_CSV, OUT_JSON };
extern int g_fmt, g_quiet, g_failed; /* output format, --quiet, a check failed (exit status 1) */
extern int g_goals, g_goals_met;     /* the summary's speed goals: reported, never failed */
extern FILE *g_out;

row *rows_add(rows *t, const char *section);
void rows_free(rows *t);
void rs(row *r, int c, const char *fmt, ...); /* a string cell */
void rn(row *r, int c, double v);             /* a number cell */
void csv_header(void);
void emit_rows(const rows *t);          /* CSV / JSON: every row (nothing in table mode) */
void text(const char *fmt, ...);        /* free text, table mode only */
void progress(const char *fmt, ...);    /* stderr, unless --quiet */
void progress_end(void);

/* table columns: which column, its heading, its format */
enum { FM_STR, FM_INT, FM_SEP, FM_GB, FM_GIB, FM_MIB, FM_MS, FM_RANGE, FM_RANGEB, FM_F1, FM_F2, FM_F3, FM_PCT, FM_X, FM_E,
       FM_TOK, FM_US, FM_G3 };

typedef struct {
  int col;
  const char *head;
  int fm;
} vcol;

void fmt_ms(double s, char *b, size_t n);
void fmt_cell(const row *r, const vcol *v, char *b, size_t n);
/* An aligned table (table mode only); group_col >= 0: blank repeated values of that column and
   put an empty line between groups. */
void print_table(const char *title, const vcol *v, int nv, const rows *t, int group_col);

/* ---- models and options ---- */

enum { V_MHA, V_GQA, V_MQA, V_MLA, NVARIANT };
extern const char *const variant_name[NVARIANT];

typedef struct {
  char name[48];
  int L, H, G, D; /* G 0: the model has no GQA (MLA models) */
  int window;     /* sliding window: the cache holds at most this many tokens */
  int latent, rope; /* MLA dims; 0 => DeepSeek's ratios 4*D, D/2 */
  int native;     /* the model's own variant */
} model;

extern const model presets[];
extern const int n_presets;
#define NPRESET n_presets
const model *preset(const char *name); /* NULL if there is no such preset */

typedef struct {
  const char *cmd;
  int quick, full, reps, reps_set; /* full: the summary's every table and column (default: one screen) */
  long ctx[MAXL];
  int n_ctx, ctx_set, threads_set, dtypes_set, variants_set, parts_set, sweep;
  int batch_seqs, batch_lo, batch_hi, batch_seqs_set, batch_lens_set;
  long batch;
  double mem;
  kva_dtype dtypes[MAXL];
  int n_dtypes;
  int variants[NVARIANT], n_variants;
  int H, G, D;
  long threads[MAXL];
  int n_threads;
  int cold, warm, modes_set;
  long bs[MAXL];
  int n_bs;
  model models[32];
  int n_models;
  double bw_bytes, flush_bytes;
  int prefill, prefill_nq, prefill_ctx, prefill_set;
  int trials;
  const char *out_dir;
  uint64_t seed;
  unsigned parts;              /* PART_* bits: which parts speed, quality and paged run */
  int trace_reqs, trace_reqs_set, trace_pool, max_len, prefix_reqs, prefix_reqs_set;
  long trace_bs[MAXL];
  int n_trace_bs;
  int evict_ctx, evict_ctx_set;
  long budgets[MAXL];
  int n_budgets;
  long budget_tokens[MAXL];    /* quality model: WINDOW, H2O and SELECT also at these many tokens */
  int n_budget_tokens;
  const char *configs;         /* quality model / needle: only the configurations whose names contain one
                                  of these comma-separated words (NULL: all) */
  const char *model_dir;       /* quality model: the trained model's directory (NULL: bench/model) */
  const char *model_file;      /* quality model / needle: its model.bin (NULL: in model_dir) */
  const char *tokenizer_file;  /* quality model / needle: its tokenizer.bin (NULL: in model_dir) */
  const char *text_file;     /* quality needle: generate the cases from this text (NULL: DIR's files) */
} opts;

/* which options the command line set (the rest take per-subcommand defaults) */
typedef struct {
  int ctx, dtypes, variants, threads, models, bs, trials;
} set_flags;

/* options.c */
int parse_args(int argc, char **argv, opts *o, set_flags *sf); /* 0, or the exit status */
void defaults_for(opts *o, const set_flags *sf, const char *cmd);
#define N_ALL_DTYPES 7
extern const kva_dtype all_dtypes[N_ALL_DTYPES]; /* every storage type (memory's default) */

/* ---- the machine: streaming read bandwidth, FP32 FMA peak, OpenMP fork/join ---- */

enum { ISA_SCALAR, ISA_AVX2, ISA_AVX512, NISA };

typedef struct {
  int nt;
  double bw_best, bw_med;      /* GB/s */
  double fma[NISA];            /* GFLOP/s, 0 if the ISA is not compiled in */
  double fork_us, fork_med_us, fork_max_us; /* an empty OpenMP parallel region of nt threads: mean, median, max */
} roof;

typedef struct {
  roof r[MAXL + 2];
  int n;
  int isa;                     /* the library's */
  double bw_bytes;
} machine;

extern const char *const isa_name[NISA];
/* measures 1 thread, all threads and every count in thr; prints its table, emits its rows */
void machine_measure(machine *m, const opts *o, const long *thr, int n_thr);
const roof *roof_for(const machine *m, int nt);

/* the cold-cache flush buffer (flush_init allocates it; flush_caches reads it) */
void flush_init(double bytes);
void flush_caches(int threads);

/* ---- the parts of speed, quality and paged ----
   X(ID, "name", "subcommand", function): a subcommand runs its parts in this order, each when
   --parts names it (default: all but the PART_OPT_IN ones). */
typedef void (*part_fn)(const opts *o, const machine *m);

#define BENCH_PARTS(X)                                  \
  X(DECODE, "decode", "speed", speed_decode)            \
  X(PREFILL, "prefill", "speed", speed_prefill)         \
  X(CONTIG, "contig", "speed", speed_contig)            \
  X(THREADS, "threads", "speed", speed_threads)         \
  X(BATCH, "batch", "speed", speed_batch)               \
  X(TREE, "tree", "speed", speed_tree)                  \
  X(SWEEP, "sweep", "speed", speed_sweep)               \
  X(DTYPES, "dtypes", "quality", quality_dtypes)        \
  X(EVICT, "evict", "quality", quality_evict)           \
  X(CALIB, "calib", "quality", quality_calib)           \
  X(SCALES, "scales", "quality", quality_scales)        \
  X(MODEL, "model", "quality", quality_model)           \
  X(NEEDLE, "needle", "quality", quality_needle)        \
  X(ATTN, "attn", "paged", paged_attn)                  \
  X(TRACE, "trace", "paged", paged_trace)               \
  X(PREFIX, "prefix", "paged", paged_prefix)            \
  X(OPS, "ops", "paged", paged_ops)                     \
  X(EXPORT, "export", "paged", paged_export)            \
  X(HYBRID, "hybrid", "paged", paged_hybrid)

#define X_PART_BIT(id, name, cmd, fn) PART_BIT_##id,
#define X_PART_MASK(id, name, cmd, fn) PART_##id = 1u << PART_BIT_##id,
#define X_PART_DECL(id, name, cmd, fn) void fn(const opts *o, const machine *m);
enum { BENCH_PARTS(X_PART_BIT) NPART };
enum { BENCH_PARTS(X_PART_MASK) };
BENCH_PARTS(X_PART_DECL)
#define PART_OPT_IN ((unsigned)PART_SWEEP)
#define PART_ALL (((1u << NPART) - 1u) & ~PART_OPT_IN)

typedef struct {
  const char *name, *cmd;
  unsigned bit;
  part_fn run;
} bench_part;
extern const bench_part bench_parts[NPART];
/* "decode,prefill,... (speed); dtypes,... (quality); ..." */
const char *part_list(void);
/* run the parts of cmd that o->parts selects, in BENCH_PARTS order */
void run_parts(const char *cmd, const opts *o, const machine *m);

/* ---- caches filled with random data, timed calls ---- */

/* one attention shape: variant, query heads, KV heads, K dim, V dim; MLA: one latent KV head */
typedef struct {
  int var, H, G, D, DV;
  kva_cache_kind kind;
} shape;

shape variant_shape(int var, int H, int G, int D);
kva_attn shape_attn(const shape *s, int threads);
kva_cache_desc shape_desc(const shape *s, int n_layers, kva_dtype dt); /* the shape's heads, the rest 0 */
size_t shape_bpt(const shape *s, kva_dtype dt); /* bytes of one token of one layer */

void pool_init(uint64_t seed); /* random numbers to fill caches from */
void pool_free(void);
const float *pool_at(uint64_t *rng, size_t need);
/* A one-layer cache holding ctx tokens of K/V (k_all/v_all, or random from the pool). The last
   kva_seq_append is `tail` tokens. scatter: the sequence's blocks shuffled over the pool.
   vdt: V's storage type (KVA_DTYPE_DEFAULT: K's). */
kva_status build_cache_kv(const shape *s, kva_dtype dt, kva_dtype vdt, long ctx, int tail, int bs, int scatter,
                          float k_scale, float v_scale, const float *k_all, const float *v_all, uint64_t *rng,
                          kva_cache **out, int *seq_out);
extern int g_build_rotate; /* kva_cache_desc.rotate of the KV caches the two below build (0: none) */
extern int g_build_bounds; /* kva_cache_desc.block_bounds of the caches the two below build */
kva_status build_cache(const shape *s, kva_dtype dt, long ctx, int tail, int bs, int scatter, float k_scale,
                       float v_scale, const float *k_all, const float *v_all, uint64_t *rng,
                       kva_cache **out, int *seq_out);
float *rand_floats(size_t n, uint64_t *rng);

typedef struct {
  kva_cache *c;
  int seq;
  kva_attn a;
  const float *q, *k, *v;
  int n_q, n_kv;
  float *out;
  kva_batch *plan;   /* call_batch: a kva_batch_plan of seqs */
  const int *seqs;   /* call_batch, call_loop: n_seqs sequences, one query token each */
  int n_seqs;
} call_ctx;

kva_status call_cache(const call_ctx *x); /* kva_attend_cache */
kva_status call_array(const call_ctx *x); /* kva_attend on plain arrays */
kva_status call_batch(const call_ctx *x); /* kva_attend_batch on x->plan */
kva_status call_loop(const call_ctx *x);  /* kva_attend_cache per sequence */
typedef kva_status (*call_fn)(const call_ctx *);

typedef struct {
  double med, mn, mx;
  kva_status st;
} timing;

extern int g_reps_exact; /* --reps given: exactly that many */
timing time_calls(kva_status (*f)(const call_ctx *), const call_ctx *x, int cold, int reps);
void time_interleaved(const call_fn *f, const call_ctx *x, int n, int cold, int reps, timing *out);
void set_timing(row *w, const timing *t);
void set_base_timing(row *w, const timing *t);
void set_roof(row *w, const machine *m, int nt, double kvbytes, double flop, double t);
void set_shape_cols(row *w, const shape *s, kva_dtype dt);

/* ---- entry points of the subcommands (and what they share) ---- */

/* bench_memory.c */
void cmd_memory(const opts *o);
void memory_summary(const opts *o);
void memory_curve(const opts *o, int show); /* show: a pivot table too (table mode) */
/* bench_speed.c */
void run_decode(const opts *o, const machine *m, rows *t);
void print_decode(const rows *t, const char *title);
void sweep_opts(opts *so);
void rows_sort_series(rows *t);
/* bench_mla.c */
void cmd_mla(int quick);
/* bench_quality.c */
/* int_ops flags of a configuration: kva_attn.int_scores, kva_attn.int_values */
enum { INT_SCORES = 1, INT_VALUES = 2 };
void quality_dtype_errors(const opts *o, const kva_dtype *dts, const int *int_ops, const int *rotate, int n_dt,
                          long n, int T, double *rel);
/* bench_summary.c */
void summary_speed(const opts *o, const machine *m);

#endif
