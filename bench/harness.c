/* bench/harness.c - the shared part of kvattn_bench (see harness.h): utilities, result rows
   and their output, the parts table, machine probes, cold-cache flushing, caches filled with
   random data and timed calls. */
#include "harness.h"
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

/* =====================================================================
   utilities
   ===================================================================== */

double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void *xalloc(size_t n) {
  void *p = NULL;
  if (posix_memalign(&p, 64, n ? n : 64) != 0 || !p) {
    fprintf(stderr, "kvattn_bench: out of memory (%.1f MiB)\n", (double)n / MiB);
    exit(2);
  }
  return p;
}

char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = (char *)malloc(n);
  if (!p) exit(2);
  memcpy(p, s, n);
  return p;
}

int max_threads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/* splitmix64 */
uint64_t rng_u64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
double rng_unif(uint64_t *s) { return (double)(rng_u64(s) >> 11) * (1.0 / 9007199254740992.0); }
double rng_gauss(uint64_t *s) {
  double u = rng_unif(s), v = rng_unif(s);
  if (u < 1e-300) u = 1e-300;
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

int parse_dtype(const char *s, kva_dtype *t) {
  static const struct { const char *n; kva_dtype t; } tab[] = {
      {"f32", KVA_F32}, {"fp32", KVA_F32}, {"f16", KVA_F16}, {"fp16", KVA_F16}, {"bf16", KVA_BF16},
      {"int8", KVA_INT8}, {"i8", KVA_INT8}, {"fp8_e4m3", KVA_FP8_E4M3}, {"e4m3", KVA_FP8_E4M3},
      {"fp8", KVA_FP8_E4M3}, {"fp8_e5m2", KVA_FP8_E5M2}, {"e5m2", KVA_FP8_E5M2},
      {"int4", KVA_INT4}, {"i4", KVA_INT4}};
  size_t i;
  for (i = 0; i < sizeof tab / sizeof tab[0]; i++)
    if (strcmp(s, tab[i].n) == 0) { *t = tab[i].t; return 1; }
  return 0;
}

/* 12345678 -> "12,345,678" */
void fmt_sep(double v, char *buf, size_t n) {
  char tmp[64], out[96];
  int len, i, j = 0, neg = v < 0;
  snprintf(tmp, sizeof tmp, "%.0f", fabs(v));
  len = (int)strlen(tmp);
  if (neg) out[j++] = '-';
  for (i = 0; i < len; i++) {
    out[j++] = tmp[i];
    if ((len - i - 1) % 3 == 0 && i != len - 1) out[j++] = ',';
  }
  out[j] = 0;
  snprintf(buf, n, "%s", out);
}

/* "80GiB", "80GB", "512MiB", "512MB", "80G" (= GiB), "1T", plain bytes */
int parse_size(const char *s, double *out) {
  char *end;
  double v = strtod(s, &end), mul = 1;
  char u[16];
  size_t i;
  if (end == s || v < 0) return 0;
  for (i = 0; end[i] && i < sizeof u - 1; i++) u[i] = (char)tolower((unsigned char)end[i]);
  u[i] = 0;
  if (!*u || !strcmp(u, "b")) mul = 1;
  else if (!strcmp(u, "kb")) mul = 1e3;
  else if (!strcmp(u, "mb")) mul = 1e6;
  else if (!strcmp(u, "gb")) mul = 1e9;
  else if (!strcmp(u, "tb")) mul = 1e12;
  else if (!strcmp(u, "k") || !strcmp(u, "kib")) mul = 1024.0;
  else if (!strcmp(u, "m") || !strcmp(u, "mib")) mul = MiB;
  else if (!strcmp(u, "g") || !strcmp(u, "gib")) mul = GiB;
  else if (!strcmp(u, "t") || !strcmp(u, "tib")) mul = GiB * 1024.0;
  else return 0;
  *out = v * mul;
  return 1;
}

/* "1,2,4" -> ints; returns the count, -1 on a bad list */
int parse_ints(const char *s, long *out, int max) {
  int n = 0;
  while (*s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || n >= max) return -1;
    if (*end == 'k' || *end == 'K') { v *= 1024; end++; }
    out[n++] = v;
    if (*end == ',') end++;
    else if (*end) return -1;
    s = end;
  }
  return n;
}

int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double median_d(const double *x, int n) {
  double *y = (double *)xalloc((size_t)n * sizeof(double)), m;
  memcpy(y, x, (size_t)n * sizeof(double));
  qsort(y, (size_t)n, sizeof(double), cmp_double);
  m = n % 2 ? y[n / 2] : 0.5 * (y[n / 2 - 1] + y[n / 2]);
  free(y);
  return m;
}

/* log-uniform integer in [lo, hi]: short requests frequent, long ones rare, as in chat traces */
int rand_log_int(uint64_t *rng, int lo, int hi) {
  double x = exp(log((double)lo) + rng_unif(rng) * (log((double)hi + 1.0) - log((double)lo)));
  int v = (int)x;
  return v < lo ? lo : v > hi ? hi : v;
}

/* =====================================================================
   results: rows with a fixed superset of columns; tables, CSV, JSON
   ===================================================================== */


#define X_NAME(id, name) name,
const char *const col_name[NCOL] = {COLUMNS(X_NAME)};


int g_fmt = OUT_TABLE, g_quiet = 0, g_failed = 0;
static int g_json_rows = 0;
FILE *g_out;

row *rows_add(rows *t, const char *section) {
  row *r;
  if (t->n == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 64;
    t->r = (row *)realloc(t->r, (size_t)t->cap * sizeof(row));
    if (!t->r) exit(2);
  }
  r = &t->r[t->n++];
  memset(r, 0, sizeof *r);
  r->kind[C_SECTION] = 2;
  r->str[C_SECTION] = xstrdup(section);
  return r;
}

void rows_free(rows *t) {
  int i, c;
  for (i = 0; i < t->n; i++)
    for (c = 0; c < NCOL; c++) free(t->r[i].str[c]);
  free(t->r);
  memset(t, 0, sizeof *t);
}

void rs(row *r, int c, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  free(r->str[c]);
  r->str[c] = xstrdup(buf);
  r->kind[c] = 2;
}
void rn(row *r, int c, double v) {
  r->num[c] = v;
  r->kind[c] = 1;
}

static void print_num(FILE *f, double v) {
  if (v == floor(v) && fabs(v) < 9e15) fprintf(f, "%.0f", v);
  else fprintf(f, "%.6g", v);
}

void csv_header(void) {
  int c;
  for (c = 0; c < NCOL; c++) fprintf(g_out, "%s%s", c ? "," : "", col_name[c]);
  fputc('\n', g_out);
}

static void csv_row(const row *r) {
  int c;
  for (c = 0; c < NCOL; c++) {
    if (c) fputc(',', g_out);
    if (r->kind[c] == 1) {
      if (isfinite(r->num[c])) print_num(g_out, r->num[c]);
    } else if (r->kind[c] == 2) {
      const char *s = r->str[c];
      if (strpbrk(s, ",\"\n")) {
        fputc('"', g_out);
        for (; *s; s++) {
          if (*s == '"') fputc('"', g_out);
          fputc(*s == '\n' ? ' ' : *s, g_out);
        }
        fputc('"', g_out);
      } else fputs(s, g_out);
    }
  }
  fputc('\n', g_out);
}

static void json_str(const char *s) {
  fputc('"', g_out);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(g_out, "\\%c", ch);
    else if (ch < 0x20) fprintf(g_out, "\\u%04x", ch);
    else fputc(ch, g_out);
  }
  fputc('"', g_out);
}

static void json_row(const row *r) {
  int c, first = 1;
  fprintf(g_out, "%s\n  {", g_json_rows++ ? "," : "");
  for (c = 0; c < NCOL; c++) {
    if (!r->kind[c]) continue;
    fprintf(g_out, "%s\"%s\": ", first ? "" : ", ", col_name[c]);
    first = 0;
    if (r->kind[c] == 2) json_str(r->str[c]);
    else if (isfinite(r->num[c])) print_num(g_out, r->num[c]);
    else fputs("null", g_out);
  }
  fputc('}', g_out);
}

/* Machine-readable output: every row. (Tables are printed by print_table.) */
void emit_rows(const rows *t) {
  int i;
  if (g_fmt == OUT_TABLE) return;
  for (i = 0; i < t->n; i++) {
    if (g_fmt == OUT_CSV) csv_row(&t->r[i]);
    else json_row(&t->r[i]);
  }
  fflush(g_out);
}

/* Free text for the human table only. */
void text(const char *fmt, ...) {
  va_list ap;
  if (g_fmt != OUT_TABLE) return;
  va_start(ap, fmt);
  vfprintf(g_out, fmt, ap);
  va_end(ap);
}

/* progress on stderr: one overwritten line on a terminal, plain lines otherwise */
void progress(const char *fmt, ...) {
  va_list ap;
  static int tty = -1;
  if (g_quiet) return;
  if (tty < 0) tty = isatty(2);
  va_start(ap, fmt);
  if (tty) fputs("\r\033[K", stderr);
  fputs("[kvattn_bench] ", stderr);
  vfprintf(stderr, fmt, ap);
  if (!tty) fputc('\n', stderr);
  va_end(ap);
  fflush(stderr);
}
void progress_end(void) {
  if (!g_quiet && isatty(2)) fputs("\r\033[K", stderr);
}


void fmt_ms(double s, char *b, size_t n) {
  double ms = s * 1e3;
  if (ms < 1) snprintf(b, n, "%.3f", ms);
  else if (ms < 10) snprintf(b, n, "%.2f", ms);
  else if (ms < 100) snprintf(b, n, "%.1f", ms);
  else snprintf(b, n, "%.0f", ms);
}

void fmt_cell(const row *r, const vcol *v, char *b, size_t n) {
  double x = r->num[v->col];
  b[0] = 0;
  if (v->fm == FM_RANGE || v->fm == FM_RANGEB) { /* min-max of the time (RANGEB: of the base time) */
    char a[32], c[32];
    int lo = v->fm == FM_RANGE ? C_TMIN : C_BASEMIN, hi = v->fm == FM_RANGE ? C_TMAX : C_BASEMAX;
    if (r->kind[lo] != 1 || r->kind[hi] != 1) return;
    fmt_ms(r->num[lo], a, sizeof a);
    fmt_ms(r->num[hi], c, sizeof c);
    snprintf(b, n, "%s-%s", a, c);
    return;
  }
  if (r->kind[v->col] == 0) return;
  if (r->kind[v->col] == 2) {
    snprintf(b, n, "%s", r->str[v->col]);
    return;
  }
  if (!isfinite(x)) {
    snprintf(b, n, "-");
    return;
  }
  switch (v->fm) {
    case FM_INT: snprintf(b, n, "%.0f", x); break;
    case FM_SEP: fmt_sep(x, b, n); break;
    case FM_GB: snprintf(b, n, x >= 100e9 ? "%.1f" : "%.2f", x / 1e9); break;
    case FM_GIB: snprintf(b, n, x >= 100.0 * GiB ? "%.1f" : "%.2f", x / GiB); break;
    case FM_MIB: snprintf(b, n, "%.1f", x / MiB); break;
    case FM_MS: fmt_ms(x, b, n); break;
    case FM_F1: snprintf(b, n, "%.1f", x); break;
    case FM_F2: snprintf(b, n, "%.2f", x); break;
    case FM_F3: snprintf(b, n, "%.3f", x); break;
    case FM_PCT: snprintf(b, n, x < 0.1 ? "%.2f%%" : "%.1f%%", 100 * x); break;
    case FM_X: snprintf(b, n, "%.2f", x); break;
    case FM_E: snprintf(b, n, "%.1e", x); break;
    case FM_US: snprintf(b, n, x * 1e6 < 100 ? "%.1f" : "%.0f", x * 1e6); break;
    case FM_G3: snprintf(b, n, "%.3g", x); break;
    case FM_TOK:
      if (x < 0) snprintf(b, n, "unbounded");
      else fmt_sep(x, b, n);
      break;
    default: snprintf(b, n, "%g", x); break;
  }
}

/* An aligned table; group_col >= 0: blank repeated values of that column and
   put an empty line between groups. */
void print_table(const char *title, const vcol *v, int nv, const rows *t, int group_col) {
  int w[64], i, j, k;
  char cell[512];
  if (g_fmt != OUT_TABLE || t->n == 0) return;
  for (j = 0; j < nv; j++) w[j] = (int)strlen(v[j].head);
  for (i = 0; i < t->n; i++)
    for (j = 0; j < nv; j++) {
      fmt_cell(&t->r[i], &v[j], cell, sizeof cell);
      if ((int)strlen(cell) > w[j]) w[j] = (int)strlen(cell);
    }
  fprintf(g_out, "\n%s\n", title);
  for (j = 0; j < nv; j++) {
    int left = v[j].fm == FM_STR;
    fprintf(g_out, "%s%*s", j ? "  " : "", left ? -w[j] : w[j], v[j].head);
  }
  fputc('\n', g_out);
  for (j = 0; j < nv; j++) {
    fputs(j ? "  " : "", g_out);
    for (k = 0; k < w[j]; k++) fputc('-', g_out);
  }
  fputc('\n', g_out);
  for (i = 0; i < t->n; i++) {
    const row *r = &t->r[i];
    int same = 0;
    if (group_col >= 0 && i > 0 && r->kind[group_col] == 2 && t->r[i - 1].kind[group_col] == 2)
      same = strcmp(r->str[group_col], t->r[i - 1].str[group_col]) == 0;
    if (group_col >= 0 && i > 0 && !same) fputc('\n', g_out);
    for (j = 0; j < nv; j++) {
      int left = v[j].fm == FM_STR;
      if (same && v[j].col == group_col) cell[0] = 0;
      else fmt_cell(r, &v[j], cell, sizeof cell);
      if (j == nv - 1 && left) fprintf(g_out, "%s%s", j ? "  " : "", cell);
      else fprintf(g_out, "%s%*s", j ? "  " : "", left ? -w[j] : w[j], cell);
    }
    fputc('\n', g_out);
  }
  fflush(g_out);
}

/* =====================================================================
   models, the parts table
   ===================================================================== */

const char *const variant_name[NVARIANT] = {"MHA", "GQA", "MQA", "MLA"};

/* The presets' attention shapes, from each model's published configuration (config.json of the
   released weights: num_hidden_layers = L, num_attention_heads = H, num_key_value_heads = G,
   hidden_size / num_attention_heads = D, sliding_window):
     Llama-2-7B   32 layers, 32 heads, 32 KV heads, head dim 128 (meta-llama/Llama-2-7b-hf)
     Llama-2-70B  80 layers, 64 heads, 8 KV heads, head dim 128 (meta-llama/Llama-2-70b-hf)
     Llama-3-8B   32 layers, 32 heads, 8 KV heads, head dim 128 (meta-llama/Meta-Llama-3-8B)
     Llama-3-70B  80 layers, 64 heads, 8 KV heads, head dim 128 (meta-llama/Meta-Llama-3-70B)
     Mistral-7B   32 layers, 32 heads, 8 KV heads, head dim 128, sliding window 4096
                  (mistralai/Mistral-7B-v0.1; the Mistral 7B paper, arXiv:2310.06825)
     DeepSeek-V2  60 layers, 128 heads, MLA: kv_lora_rank 512 (the cached latent),
                  qk_rope_head_dim 64 (the cached shared rope key), qk_nope_head_dim 128,
                  v_head_dim 128 (deepseek-ai/DeepSeek-V2; the DeepSeek-V2 paper, arXiv:2405.04434)
     DeepSeek-V3  61 layers, otherwise as DeepSeek-V2 (deepseek-ai/DeepSeek-V3; arXiv:2412.19437) */
const model presets[] = {
    {"Llama-2-7B", 32, 32, 32, 128, 0, 0, 0, V_MHA},
    {"Llama-2-70B", 80, 64, 8, 128, 0, 0, 0, V_GQA},
    {"Llama-3-8B", 32, 32, 8, 128, 0, 0, 0, V_GQA},
    {"Llama-3-70B", 80, 64, 8, 128, 0, 0, 0, V_GQA},
    {"Mistral-7B", 32, 32, 8, 128, 4096, 0, 0, V_GQA},
    {"DeepSeek-V2", 60, 128, 0, 128, 0, 512, 64, V_MLA},
    {"DeepSeek-V3", 61, 128, 0, 128, 0, 512, 64, V_MLA},
};
const int n_presets = NV(presets);

const model *preset(const char *name) {
  int i;
  for (i = 0; i < NPRESET; i++)
    if (!strcmp(presets[i].name, name)) return &presets[i];
  return NULL;
}

/* ---- the parts of speed, quality and paged ---- */

#define X_PART_ENTRY(id, name, cmd, fn) {name, cmd, PART_##id, fn},
const bench_part bench_parts[NPART] = {BENCH_PARTS(X_PART_ENTRY)};

const char *part_list(void) {
  static char buf[512];
  size_t n = 0;
  int i, j;
  buf[0] = 0;
  for (i = 0; i < NPART; i++) {
    int first = 1;
    for (j = 0; j < i; j++)
      if (!strcmp(bench_parts[j].cmd, bench_parts[i].cmd)) first = 0;
    if (!first) continue; /* this subcommand's parts were listed with its first one */
    for (j = i; j < NPART; j++)
      if (!strcmp(bench_parts[j].cmd, bench_parts[i].cmd))
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", j == i ? (i ? "; " : "") : ",", bench_parts[j].name);
    n += (size_t)snprintf(buf + n, sizeof buf - n, " (%s)", bench_parts[i].cmd);
    if (n >= sizeof buf) break;
  }
  return buf;
}

void run_parts(const char *cmd, const opts *o, const machine *m) {
  int i;
  for (i = 0; i < NPART; i++)
    if (!strcmp(bench_parts[i].cmd, cmd) && (o->parts & bench_parts[i].bit)) bench_parts[i].run(o, m);
}


/* =====================================================================
   the machine: streaming read bandwidth and FP32 FMA peak
   ===================================================================== */

/* sum of n floats (n a multiple of 64, p 64-byte aligned) */
static float sum_stream(const float *p, size_t n) {
  size_t i;
#if defined(__AVX512F__)
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (i = 0; i < n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  float t[8];
  int k;
  for (i = 0; i < n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (k = 1; k < 8; k++) t[0] += t[k];
  return t[0];
#else
  float s[8] = {0};
  int k;
  for (i = 0; i < n; i += 8)
    for (k = 0; k < 8; k++) s[k] += p[i + k];
  for (k = 1; k < 8; k++) s[0] += s[k];
  return s[0];
#endif
}

static volatile float g_sink;

/* Sum the buffer with nt threads; returns seconds. */
static double timed_sum(const float *buf, size_t n, int nt) {
  double t0 = now_s(), s = 0;
  if (nt <= 1) s = sum_stream(buf, n);
  else {
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) reduction(+ : s)
    {
      int id = omp_get_thread_num(), m = omp_get_num_threads();
      size_t chunk = (n / 64 / (size_t)m) * 64, lo = chunk * (size_t)id, hi = id == m - 1 ? n : lo + chunk;
      s += sum_stream(buf + lo, hi - lo);
    }
#else
    s = sum_stream(buf, n);
#endif
  }
  g_sink = (float)s;
  return now_s() - t0;
}

static float *g_flush;
static size_t g_flush_n;

/* Evict the caches: read a buffer far larger than the LLC with the timed call's
   threads (a 2-thread call's two private L2s are emptied too). KV data is only read
   by attention, so its lines are clean and reading is enough to evict them. A
   1-thread call gets a 1-thread flush: after a parallel flush, OpenMP's idle worker
   spins on the other core for a while, and on this VM that slows the timed thread
   by up to half (its vCPUs can share a physical core). */
void flush_caches(int threads) {
  if (g_flush) timed_sum(g_flush, g_flush_n, threads);
}

void flush_init(double bytes) {
  size_t i;
  g_flush_n = (size_t)(bytes / sizeof(float)) / 64 * 64;
  g_flush = (float *)xalloc(g_flush_n * sizeof(float));
  for (i = 0; i < g_flush_n; i++) g_flush[i] = 1.0f;
}

/* FP32 FMA peak: independent accumulators in registers, 2 flop per FMA lane. */
#define FMA_ACC 12
/* FMA_LOOP(name, vector type, lanes, set1, fmadd, add): FMA_ACC independent
   accumulators; the sum of lane 0 of the result goes to g_sink */
#define FMA_LOOP(name, V, LANES, SET1, FMADD, ADD)                                      \
  static double name(long iters) {                                                   \
    V a[FMA_ACC];                                                                     \
    const V m = SET1(0.99999994f), c = SET1(1e-7f);                                  \
    float t[LANES];                                                                   \
    long i;                                                                           \
    int k;                                                                            \
    for (k = 0; k < FMA_ACC; k++) a[k] = SET1(1.0f + (float)k * 1e-3f);              \
    for (i = 0; i < iters; i++) {                                                     \
      a[0] = FMADD(a[0], m, c); a[1] = FMADD(a[1], m, c); a[2] = FMADD(a[2], m, c);   \
      a[3] = FMADD(a[3], m, c); a[4] = FMADD(a[4], m, c); a[5] = FMADD(a[5], m, c);   \
      a[6] = FMADD(a[6], m, c); a[7] = FMADD(a[7], m, c); a[8] = FMADD(a[8], m, c);   \
      a[9] = FMADD(a[9], m, c); a[10] = FMADD(a[10], m, c); a[11] = FMADD(a[11], m, c); \
    }                                                                                 \
    for (k = 1; k < FMA_ACC; k++) a[0] = ADD(a[0], a[k]);                             \
    memcpy(t, &a[0], sizeof t);                                                       \
    g_sink = t[0] + t[LANES - 1];                                                     \
    return (double)iters * FMA_ACC * LANES * 2;                                       \
  }
#if defined(__AVX512F__)
FMA_LOOP(fma_loop_avx512, __m512, 16, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps)
#endif
#if defined(__AVX2__) && defined(__FMA__)
FMA_LOOP(fma_loop_avx2, __m256, 8, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps)
#endif
/* scalar: multiply and add (2 flop); with -std=c99 GCC does not contract them */
static double fma_loop_scalar(long iters) {
  float a[8];
  const float m = 0.99999994f, c = 1e-7f;
  long i;
  int k;
  for (k = 0; k < 8; k++) a[k] = 1.0f + (float)k * 1e-3f;
  for (i = 0; i < iters; i++)
    for (k = 0; k < 8; k++) a[k] = a[k] * m + c;
  g_sink = a[0] + a[7];
  return (double)iters * 8 * 2;
}

const char *const isa_name[NISA] = {"scalar", "avx2", "avx512"};

static int isa_available(int isa) {
  switch (isa) {
#if defined(__AVX512F__)
    case ISA_AVX512: return 1;
#endif
#if defined(__AVX2__) && defined(__FMA__)
    case ISA_AVX2: return 1;
#endif
    case ISA_SCALAR: return 1;
    default: return 0;
  }
}

static double fma_run(int isa, long iters) {
  switch (isa) {
#if defined(__AVX512F__)
    case ISA_AVX512: return fma_loop_avx512(iters);
#endif
#if defined(__AVX2__) && defined(__FMA__)
    case ISA_AVX2: return fma_loop_avx2(iters);
#endif
    default: return fma_loop_scalar(iters);
  }
}

/* GFLOP/s of nt threads each running the loop; best of 3. */
static double fma_peak(int isa, int nt, long iters) {
  double best = 0;
  int rep;
  for (rep = 0; rep < 4; rep++) { /* rep 0 warms up (threads, clocks) */
    double t0 = now_s(), fl = 0, t;
    if (nt <= 1) fl = fma_run(isa, iters);
    else {
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) reduction(+ : fl)
      fl += fma_run(isa, iters);
#else
      fl = fma_run(isa, iters);
#endif
    }
    t = now_s() - t0;
    if (rep > 0 && fl / t / 1e9 > best) best = fl / t / 1e9;
  }
  return best;
}

/* The library's kernel ISA, as far as its FMA peak goes. */
static int lib_isa(void) {
  const char *s = kva_simd_name();
  if (strstr(s, "512")) return ISA_AVX512;
  if (strstr(s, "avx2")) return ISA_AVX2;
  return ISA_SCALAR; /* scalar, neon (no neon here: x86 bench measures what it can) */
}


const roof *roof_for(const machine *m, int nt) {
  int i;
  for (i = 0; i < m->n; i++)
    if (m->r[i].nt == nt) return &m->r[i];
  return &m->r[0];
}

/* The cost of starting and ending a parallel region of nt threads (what every threaded library
   call pays at least once), each region after 0.5 ms of single-threaded work as between calls:
   40 regions after a warm-up; mean (returned), median and max in microseconds. */
static double fork_join_us(int nt, double *med, double *mx) {
#ifdef _OPENMP
  double ts[41], sum = 0;
  int i;
  for (i = 0; i < 41; i++) {
    double t0 = now_s(), acc = 0;
    while (now_s() - t0 < 0.5e-3) acc += 1.0;
    t0 = now_s();
#pragma omp parallel num_threads(nt) reduction(+ : acc)
    acc += 1.0;
    g_sink = (float)acc;
    ts[i] = now_s() - t0;
    if (i) sum += ts[i];
  }
  qsort(ts + 1, 40, sizeof ts[0], cmp_double);
  *mx = ts[40] * 1e6;
  *med = 0.5 * (ts[20] + ts[21]) * 1e6;
  return sum / 40 * 1e6;
#else
  (void)nt;
  *med = *mx = 0;
  return 0;
#endif
}

void machine_measure(machine *m, const opts *o, const long *thr, int n_thr) {
  int counts[MAXL + 2], nc = 0, i, j, isa, passes = o->quick ? 3 : 5;
  size_t n = (size_t)(o->bw_bytes / sizeof(float)) / 64 * 64;
  long iters = o->quick ? 4000000L : 20000000L;
  float *buf;
  rows t = {0};
  memset(m, 0, sizeof *m);
  m->isa = lib_isa();
  m->bw_bytes = (double)n * sizeof(float);
  counts[nc++] = 1;
  if (max_threads() > 1) counts[nc++] = max_threads();
  for (i = 0; i < n_thr; i++) {
    int seen = 0;
    for (j = 0; j < nc; j++) seen |= counts[j] == (int)thr[i];
    if (!seen && nc < MAXL + 2) counts[nc++] = (int)thr[i];
  }
  progress("machine: touching a %.0f MiB buffer", (double)n * 4 / MiB);
  buf = (float *)xalloc(n * sizeof(float));
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
  for (i = 0; i < (int)(n / 4096); i++) {
    size_t k;
    for (k = 0; k < 4096; k++) buf[(size_t)i * 4096 + k] = (float)(k & 7) * 0.125f;
  }
  for (i = 0; i < nc; i++) {
    roof *r = &m->r[m->n++];
    double ts[16];
    int p;
    r->nt = counts[i];
    progress("machine: read bandwidth, %d thread(s)", r->nt);
    timed_sum(buf, n, r->nt); /* warm-up */
    for (p = 0; p < passes; p++) ts[p] = timed_sum(buf, n, r->nt);
    qsort(ts, (size_t)passes, sizeof ts[0], cmp_double);
    r->bw_best = (double)n * 4 / ts[0] / 1e9;
    r->bw_med = (double)n * 4 / ts[passes / 2] / 1e9;
    for (isa = 0; isa < NISA; isa++) {
      if (!isa_available(isa)) continue;
      if (isa == ISA_SCALAR && m->isa != ISA_SCALAR) continue; /* only when the library is scalar */
      progress("machine: FMA peak %s, %d thread(s)", isa_name[isa], r->nt);
      r->fma[isa] = fma_peak(isa, r->nt, isa == ISA_SCALAR ? iters / 4 : iters);
    }
    if (r->nt > 1 && BENCH_OMP) {
      progress("machine: OpenMP fork/join, %d threads", r->nt);
      r->fork_us = fork_join_us(r->nt, &r->fork_med_us, &r->fork_max_us);
    }
  }
  free(buf);
  progress_end();

  for (i = 0; i < m->n; i++) {
    const roof *r = &m->r[i];
    row *w = rows_add(&t, "machine");
    rs(w, C_NAME, "read bandwidth");
    rn(w, C_THREADS, r->nt);
    rn(w, C_VALUE, r->bw_best);
    rs(w, C_UNIT, "GB/s");
    rs(w, C_NOTE, "streaming sum over %.0f MiB, best of %d (median %.1f GB/s)", m->bw_bytes / MiB, passes,
       r->bw_med);
    for (isa = NISA - 1; isa >= 0; isa--) {
      if (r->fma[isa] <= 0) continue;
      w = rows_add(&t, "machine");
      rs(w, C_NAME, "fp32 FMA peak %s", isa_name[isa]);
      rn(w, C_THREADS, r->nt);
      rn(w, C_VALUE, r->fma[isa]);
      rs(w, C_UNIT, "GFLOP/s");
      if (isa == ISA_SCALAR)
        rs(w, C_NOTE, "plain C mul+add on 8 accumulators (the compiler may vectorize it, as it may the library's "
                      "scalar kernels)%s", isa == m->isa ? "; ratios use this one" : "");
      else
        rs(w, C_NOTE, "%d independent register accumulators%s", FMA_ACC,
           isa == m->isa ? "; the library's ISA: ratios use this one" : "");
    }
    if (r->nt > 1 && BENCH_OMP) {
      w = rows_add(&t, "machine");
      rs(w, C_NAME, "OpenMP fork/join");
      rn(w, C_THREADS, r->nt);
      rn(w, C_VALUE, r->fork_us);
      rs(w, C_UNIT, "us");
      rs(w, C_NOTE, "empty region after 0.5 ms of serial work, mean of 40 (median %.0f, max %.0f)%s", r->fork_med_us,
         r->fork_max_us, r->fork_us > 200 ? "; SLOW: a core is busy elsewhere" : "");
    }
  }
  {
    /* other work on the machine skews every timing: say so */
    FILE *f = fopen("/proc/loadavg", "r");
    double l1 = -1;
    if (f) {
      if (fscanf(f, "%lf", &l1) != 1) l1 = -1;
      fclose(f);
    }
    if (l1 >= 0) {
      row *w = rows_add(&t, "machine");
      rs(w, C_NAME, "load average (1 min)");
      rn(w, C_VALUE, l1);
      rs(w, C_NOTE, l1 > 0.5 ? "WARNING: other processes are running; timings are unreliable" : "quiet");
      if (l1 > 0.5 && (g_fmt != OUT_TABLE || strcmp(o->cmd, "summary") != 0)) /* (the summary says it in its table) */
        fprintf(stderr, "kvattn_bench: load average %.2f: other processes skew the timings\n", l1);
    }
  }
  {
    row *w = rows_add(&t, "machine");
    rs(w, C_NAME, "kvattn");
    rs(w, C_VALUE, "%s", KVATTN_VERSION_STRING);
    rs(w, C_NOTE, "kernels: %s; OpenMP threads available: %d", kva_simd_name(), max_threads());
  }
  if (strcmp(o->cmd, "summary") != 0) {
    static const vcol v[] = {{C_NAME, "machine", FM_STR}, {C_THREADS, "threads", FM_INT},
                             {C_VALUE, "value", FM_F1}, {C_UNIT, "unit", FM_STR}, {C_NOTE, "how", FM_STR}};
    print_table("This machine, measured in this run", v, NV(v), &t, -1);
  } else {
    /* the summary: one line (the table: kvattn_bench speed) */
    char bw[160];
    size_t n = 0;
    double load = -1;
    for (i = 0; i < m->n && n < sizeof bw; i++)
      n += (size_t)snprintf(bw + n, sizeof bw - n, "%s%.1f GB/s (%d thread%s)", i ? ", " : "", m->r[i].bw_best,
                            m->r[i].nt, m->r[i].nt > 1 ? "s" : "");
    for (i = 0; i < t.n; i++)
      if (!strcmp(t.r[i].str[C_NAME], "load average (1 min)")) load = t.r[i].num[C_VALUE];
    text("\nThis machine: read %s;\n  FP32 FMA peak %.0f GFLOP/s (%s, 1 thread)\n", bw, m->r[0].fma[m->isa],
         isa_name[m->isa]);
    if (load > 0.5) text("  WARNING: other processes are running (load average %.2f): timings are unreliable\n", load);
  }
  emit_rows(&t);
  rows_free(&t);
}

/* =====================================================================
   caches filled with random data, timing
   ===================================================================== */


shape variant_shape(int var, int H, int G, int D) {
  shape s;
  s.var = var;
  s.H = H;
  s.D = D;
  s.DV = D;
  s.kind = KVA_CACHE_KV;
  switch (var) {
    case V_MHA: s.G = H; break;
    case V_GQA: s.G = G; break;
    case V_MQA: s.G = 1; break;
    default: s.G = 1; s.kind = KVA_CACHE_LATENT; s.D = 4 * D + D / 2; s.DV = 4 * D; break;
  }
  return s;
}

kva_attn shape_attn(const shape *s, int threads) {
  kva_attn a;
  memset(&a, 0, sizeof a);
  a.n_heads = s->H;
  a.n_kv_heads = s->G;
  a.head_dim = s->D;
  a.v_dim = s->DV == s->D ? 0 : s->DV;
  a.n_threads = threads;
  if (s->kind == KVA_CACHE_LATENT) a.scale = (float)(1.0 / sqrt(192.0)); /* MLA: 1/sqrt(d_nope + d_rope) */
  return a;
}

/* a cache of the shape's KV heads (LATENT: its latent vectors) in n_layers
   layers of type dt; the rest zero (the library's defaults) */
kva_cache_desc shape_desc(const shape *s, int n_layers, kva_dtype dt) {
  kva_cache_desc d;
  memset(&d, 0, sizeof d);
  d.kind = s->kind;
  d.n_layers = n_layers;
  d.n_kv_heads = s->G;
  d.head_dim = s->D;
  d.v_dim = s->kind == KVA_CACHE_LATENT ? s->DV : 0;
  d.dtype = dt;
  return d;
}

/* bytes of one token of one layer in the cache (what one decode call reads per token) */
size_t shape_bpt(const shape *s, kva_dtype dt) {
  kva_cache_desc d = shape_desc(s, 1, dt);
  return kva_cache_bytes_per_token(&d);
}

/* random numbers to fill caches from (a window at a random offset per chunk) */
#define POOL_N ((size_t)1 << 22)
static float *g_pool;

void pool_init(uint64_t seed) {
  size_t i;
  uint64_t s = seed;
  if (g_pool) return;
  g_pool = (float *)xalloc(POOL_N * sizeof(float));
  for (i = 0; i < POOL_N; i++) g_pool[i] = (float)(2.0 * rng_unif(&s) - 1.0);
}

void pool_free(void) {
  free(g_pool);
  g_pool = NULL;
  free(g_flush);
  g_flush = NULL;
}

const float *pool_at(uint64_t *rng, size_t need) {
  size_t off = need < POOL_N ? (size_t)(rng_u64(rng) % (POOL_N - need)) : 0;
  return g_pool + off;
}

/* A one-layer cache holding ctx tokens of random K/V. The last kva_seq_append is
   `tail` tokens (1 for decode, n_q for prefill). scatter: the sequence's blocks are
   spread over the pool in a shuffled order (a server's pool after a while), else
   they are consecutive. k_scale/v_scale: FP8 scales (1.0 for timing). vdt: V's storage type
   (KVA_DTYPE_DEFAULT: the same as K's). */
int g_build_rotate, g_build_bounds;

kva_status build_cache_kv(const shape *s, kva_dtype dt, kva_dtype vdt, long ctx, int tail, int bs, int scatter,
                                 float k_scale, float v_scale, const float *k_all, const float *v_all, uint64_t *rng,
                                 kva_cache **out, int *seq_out) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_status st;
  long done = 0, nb = (ctx + bs - 1) / bs;
  int seq, helpers = 0, i;
  const long chunk = 256;
  d = shape_desc(s, 1, dt);
  d.block_size = bs;
  d.n_blocks = (int)nb;
  d.v_dtype = vdt;
  d.k_scale = k_scale;
  d.v_scale = v_scale;
  d.rotate = s->kind == KVA_CACHE_KV ? g_build_rotate : 0;
  d.block_bounds = g_build_bounds;
  if (scatter) helpers = nb < 256 ? (int)nb : 256;
  d.max_seqs = 1 + helpers;
  st = kva_cache_create(&d, &c);
  if (st != KVA_OK) return st;
  if (scatter) {
    /* hand the blocks one at a time to random helper sequences, then free the helpers
       in random order: the free list, and so the new sequence's table, is shuffled */
    int hs[256], order[256];
    long b;
    for (i = 0; i < helpers; i++) {
      if (kva_seq_new(c, &hs[i]) != KVA_OK) goto fail;
      order[i] = i;
    }
    for (b = 0; b < nb; b++)
      if (kva_seq_append(c, hs[rng_u64(rng) % (uint64_t)helpers], bs) != KVA_OK) goto fail;
    for (i = helpers - 1; i > 0; i--) {
      int j = (int)(rng_u64(rng) % (uint64_t)(i + 1)), x = order[i];
      order[i] = order[j];
      order[j] = x;
    }
    for (i = 0; i < helpers; i++) kva_seq_free(c, hs[order[i]]);
  }
  if ((st = kva_seq_new(c, &seq)) != KVA_OK) goto fail_st;
  while (done < ctx) {
    long body = ctx - tail, n = done < body ? (body - done < chunk ? body - done : chunk) : ctx - done;
    size_t nk = (size_t)n * (size_t)s->G * (size_t)s->D, nv = (size_t)n * (size_t)s->G * (size_t)s->DV;
    const float *k = k_all ? k_all + (size_t)done * (size_t)s->G * (size_t)s->D : pool_at(rng, nk);
    const float *v = s->kind == KVA_CACHE_LATENT ? NULL
                     : v_all ? v_all + (size_t)done * (size_t)s->G * (size_t)s->DV
                             : pool_at(rng, nv);
    if ((st = kva_seq_append(c, seq, (int)n)) != KVA_OK) goto fail_st;
    if ((st = kva_store(c, seq, 0, k, v, (int)n)) != KVA_OK) goto fail_st;
    done += n;
  }
  *out = c;
  *seq_out = seq;
  return KVA_OK;
fail:
  st = KVA_ERR_ARG;
fail_st:
  kva_cache_destroy(c);
  return st;
}

kva_status build_cache(const shape *s, kva_dtype dt, long ctx, int tail, int bs, int scatter, float k_scale,
                              float v_scale, const float *k_all, const float *v_all, uint64_t *rng,
                              kva_cache **out, int *seq_out) {
  return build_cache_kv(s, dt, KVA_DTYPE_DEFAULT, ctx, tail, bs, scatter, k_scale, v_scale, k_all, v_all, rng, out,
                        seq_out);
}


kva_status call_cache(const call_ctx *x) { return kva_attend_cache(x->c, x->seq, 0, &x->a, x->q, x->n_q, x->out); }
kva_status call_array(const call_ctx *x) {
  return kva_attend(&x->a, x->q, x->n_q, NULL, x->k, x->v, x->n_kv, NULL, x->out, NULL);
}
/* one decode step of n_seqs sequences: the batched call, and a loop of single-sequence calls */
kva_status call_batch(const call_ctx *x) { return kva_attend_batch(x->c, x->plan, 0, x->q, x->out); }
kva_status call_loop(const call_ctx *x) {
  size_t qs = (size_t)x->a.n_heads * (size_t)x->a.head_dim,
         os = (size_t)x->a.n_heads * (size_t)(x->a.v_dim ? x->a.v_dim : x->a.head_dim);
  int i;
  kva_status st;
  for (i = 0; i < x->n_seqs; i++)
    if ((st = kva_attend_cache(x->c, x->seqs[i], 0, &x->a, x->q + (size_t)i * qs, 1, x->out + (size_t)i * os)) != KVA_OK)
      return st;
  return KVA_OK;
}


int g_reps_exact; /* --reps given: exactly that many */

/* warm-up call, then reps timed calls; cold: flush the caches before each. Unless
   --reps was given, fast calls get more repetitions (up to ~0.15 s of timed calls,
   at most 15 cold / 51 warm) so that a preempted call cannot move the median. */
timing time_calls(kva_status (*f)(const call_ctx *), const call_ctx *x, int cold, int reps) {
  timing r;
  double ts[256], t0;
  int i;
  memset(&r, 0, sizeof r);
  if (reps > 256) reps = 256;
  if (reps < 1) reps = 1;
  t0 = now_s();
  r.st = f(x);
  if (r.st != KVA_OK) return r;
  if (!g_reps_exact) {
    double t1 = now_s() - t0;
    int want = t1 > 0 ? (int)(0.15 / t1) : 256, cap = cold ? 15 : 51;
    if (want > cap) want = cap;
    if (want > reps) reps = want;
  }
  for (i = 0; i < reps; i++) {
    double t0;
    if (cold) flush_caches(x->a.n_threads);
    t0 = now_s();
    f(x);
    ts[i] = now_s() - t0;
  }
  qsort(ts, (size_t)reps, sizeof ts[0], cmp_double);
  r.mn = ts[0];
  r.mx = ts[reps - 1];
  r.med = reps % 2 ? ts[reps / 2] : 0.5 * (ts[reps / 2 - 1] + ts[reps / 2]);
  return r;
}

void set_timing(row *w, const timing *t) {
  rn(w, C_TMED, t->med);
  rn(w, C_TMIN, t->mn);
  rn(w, C_TMAX, t->mx);
}

/* the base of a ratio (f16 for dtypes, 1 thread for threads, the loop for batch) */
void set_base_timing(row *w, const timing *t) {
  rn(w, C_BASET, t->med);
  rn(w, C_BASEMIN, t->mn);
  rn(w, C_BASEMAX, t->mx);
}

#define TI_MAXREPS 256
/* n calls timed in turns: each repetition runs every call once, the first one rotating, so
   drifts in clock speed and load from other processes hit them alike and their ratios stay
   fair on a busy machine. One warm-up call each first (its status is the row's); cold:
   caches flushed before every timed call. Repetitions as time_calls, from the slowest call. */
void time_interleaved(const call_fn *f, const call_ctx *x, int n, int cold, int reps, timing *out) {
  double *ts, slow = 0;
  int i, j, k, bad = 0;
  if (reps > TI_MAXREPS) reps = TI_MAXREPS;
  if (reps < 1) reps = 1;
  memset(out, 0, (size_t)n * sizeof *out);
  for (j = 0; j < n; j++) {
    double t0 = now_s(), t1;
    out[j].st = f[j](&x[j]);
    t1 = now_s() - t0;
    if (out[j].st != KVA_OK) bad = 1;
    if (t1 > slow) slow = t1;
  }
  if (bad) return;
  if (!g_reps_exact) {
    int want = slow > 0 ? (int)(0.15 / slow) : TI_MAXREPS, cap = cold ? 15 : 51;
    if (want > cap) want = cap;
    if (want > reps) reps = want;
  }
  ts = (double *)xalloc((size_t)n * TI_MAXREPS * sizeof(double));
  for (i = 0; i < reps; i++)
    for (k = 0; k < n; k++) {
      double t0;
      j = (i + k) % n;
      if (cold) flush_caches(x[j].a.n_threads);
      t0 = now_s();
      f[j](&x[j]);
      ts[(size_t)j * TI_MAXREPS + (size_t)i] = now_s() - t0;
    }
  for (j = 0; j < n; j++) {
    double *t = ts + (size_t)j * TI_MAXREPS;
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    out[j].mn = t[0];
    out[j].mx = t[reps - 1];
    out[j].med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
  }
  free(ts);
}

/* KV bytes, flop, roofline columns of a decode/prefill row */
void set_roof(row *w, const machine *m, int nt, double kvbytes, double flop, double t) {
  const roof *r = roof_for(m, nt);
  double peak = r->fma[m->isa], tm = kvbytes / (r->bw_best * 1e9), tf = flop / (peak * 1e9);
  rn(w, C_KVBYTES, kvbytes);
  rn(w, C_GBPS, kvbytes / t / 1e9);
  rn(w, C_BW, r->bw_best);
  rn(w, C_BWRATIO, kvbytes / t / 1e9 / r->bw_best);
  rn(w, C_GFLOP, flop / 1e9);
  rn(w, C_GFLOPS, flop / t / 1e9);
  rn(w, C_PEAK, peak);
  rn(w, C_FMARATIO, flop / t / 1e9 / peak);
  rs(w, C_BOUND, tm >= tf ? "mem" : "fma");
  rn(w, C_ROOFRATIO, (tm >= tf ? tm : tf) / t);
}

void set_shape_cols(row *w, const shape *s, kva_dtype dt) {
  rs(w, C_VARIANT, "%s", variant_name[s->var]);
  if (dt != KVA_DTYPE_DEFAULT) rs(w, C_DTYPE, "%s", kva_dtype_name(dt));
  rn(w, C_HEADS, s->H);
  rn(w, C_KVHEADS, s->G);
  rn(w, C_HEADDIM, s->D);
  rn(w, C_VDIM, s->DV);
}

float *rand_floats(size_t n, uint64_t *rng) {
  float *p = (float *)xalloc(n * sizeof(float));
  size_t i;
  for (i = 0; i < n; i++) p[i] = (float)(2.0 * rng_unif(rng) - 1.0);
  return p;
}
