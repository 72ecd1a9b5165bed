/* tests/model_check.c - black-box checks of the inference program
 * examples/kvattn_run.c (built as build/examples/kvattn_run).
 *
 *   model_check [--quick] [--self-test] KVATTN_RUN SCRATCH_DIR [MODEL_DIR]
 *
 * It writes small random checkpoints and tokenizers in the formats of
 * Karpathy's llama2.c (github.com/karpathy/llama2.c: the legacy "version 0"
 * checkpoint its export script writes, and its tokenizer.bin) into
 * SCRATCH_DIR, runs KVATTN_RUN on them, and compares what it prints with its
 * own plain double-precision forward pass of the Llama architecture
 * (Touvron et al. 2023), written from the formats and the model's definition
 * alone, not from the program's code:
 *
 *   legacy checkpoint: 7 little-endian int32 (dim, hidden_dim, n_layers,
 *   n_heads, n_kv_heads, vocab_size, seq_len; vocab_size < 0: the classifier
 *   is a separate tensor at the end, else it is the token embedding), then
 *   float32 tensors: embedding [vocab][dim], rms_att [L][dim],
 *   wq [L][dim][dim], wk [L][kv_dim][dim], wv [L][kv_dim][dim],
 *   wo [L][dim][dim], rms_ffn [L][dim], w1 [L][hidden][dim],
 *   w2 [L][dim][hidden], w3 [L][hidden][dim], rms_final [dim], two unused
 *   blocks of seq_len*head_size/2 floats, then the classifier if separate.
 *   RMSNorm with eps 1e-5 and a weight; RoPE rotating the adjacent pairs
 *   (2i, 2i+1) of each query and key head by position * 10000^(-2i/head_size);
 *   causal softmax attention scaled by 1/sqrt(head_size), query head h reading
 *   kv head h / (n_heads / n_kv_heads); SwiGLU w2(silu(w1 x) * w3 x);
 *   residual connections; final RMSNorm; classifier.
 *
 *   tokenizer.bin: int32 max_token_length, then per token: float32 score,
 *   int32 length, the bytes.  Ids 0/1/2 are <unk>/<s>/</s>, 3..258 the byte
 *   tokens <0xXX>.  Encoding: BOS, a " " token when the text is not empty,
 *   one token per UTF-8 character (else its bytes' tokens), then merging the
 *   adjacent pair whose concatenation is a token with the highest score,
 *   leftmost first, until none is.
 *
 * Checks, one output line each:
 *   - logits (--logits-tokens) of GQA, MHA and MQA models, tied and separate
 *     classifiers, head sizes 2, 6, 8, 12, 16, against the reference: in one
 *     prefill, token by token (--chunk 1), in chunks, with a small block
 *     size, with 2 threads;
 *   - quantized KV caches (f16, bf16, int8, fp8 E4M3/E5M2 with and without
 *     tensor scales, K and V types apart, per-layer types) against the
 *     reference rounding every stored K and V as the format does; each must
 *     also differ from the exact result (the type must change something); a
 *     cache holding a key at the wrong position, or missing the newest key,
 *     would exceed every tolerance many times over (checked on the
 *     reference);
 *   - window eviction (token by token and in chunks) against the reference's
 *     window, kvattn's definition: before each append the oldest non-sink
 *     positions go until what is held plus the new chunk fits the budget;
 *     H2O: a budget covering everything changes nothing, RECENT = BUDGET -
 *     SINKS - 1 leaves no heavy-hitter slot (= the window), a small budget
 *     acts;
 *   - greedy generation (-t 0 -i; -n below the prompt, 0, > seq_len)
 *     against the reference's encoder, argmax and decoder; seeded sampling
 *     repeats; --serve (shared prefixes, --max-batch, a pool small enough to
 *     preempt) against separate -i runs;
 *   - --ppl-tokens (windows of seq_len tokens, each from an empty cache, every
 *     token after the first predicted; with eviction, token by token) and
 *     --ppl of a text against the reference's encoder and mean loss;
 *   - bad input (checkpoints, tokenizers, flags, token ids, missing files):
 *     exit status 1, a message on stderr naming the file or flag, no signal,
 *     no sanitizer report;
 *   - the trained model in MODEL_DIR (default bench/model), if present:
 *     logits (prefill, token by token, f16/int8/fp8 caches) and the loss of
 *     a part of the held-out ids against this file's reference computed from
 *     model.bin; the trainer's ref_logits.txt against that reference and
 *     against the program (max |diff| <= 1e-4); --ppl of the held-out text
 *     equal to --ppl-tokens of the trainer's own token ids (the encoders
 *     agree).
 *
 * Output: one line per check ("[PASS] name: detail" / "[FAIL] ..."), then
 * "model_check: N passed, M failed".  Exit status 0 only if all passed.
 * --quick (for sanitizer builds): the last three random models get only the
 * basic logits checks (f32 prefill, chunks, f16 and int8 caches); on the
 * trained model only the logits in one prefill, with an F32 and an int8
 * cache.  --self-test runs only the reference's own checks.
 * C99 + POSIX (system(), <sys/wait.h>, mkdir); assumes IEEE floats and a
 * little-endian host for the float32 tensors it writes. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>

/* ------------------------------------------------------------ tolerances */
/* Logits tolerances are on max |program - reference| relative to the
   logits' scale (max |reference logit| over the check).  The program
   computes in float32, the reference in double.
   TOL_F32: exact configurations (F32 cache, any chunking, block size,
   threads, window eviction); measured <= 1.7e-6.
   TOL_Q_*: quantized caches against the reference that rounds K and V as
   the format does; measured <= 1e-6 mostly, up to 1.3e-3 where a value
   computed in float lands on the other side of a rounding boundary (peaky
   random attention amplifies it).  Against the exact reference the same
   caches differ by 1e-3 (f16) to 0.7 (fp8_e5m2) x scale.  A broken cache (a
   key rotated one position off, or the newest key missing) moves the logits
   by >= 0.65 x scale on every model (the sensitivity checks require > 10 x
   the largest of these tolerances). */
#define TOL_F32 2e-5
#define TOL_Q_F16 5e-3
#define TOL_Q_BF16 5e-3
#define TOL_Q_INT8 1e-2
#define TOL_Q_E4M3 1e-2
#define TOL_Q_E5M2 1e-2
/* version 2 (Q8_0 weight) checkpoints against the reference computed with
   the dequantized weights: relative to the logits' scale */
#define TOL_Q8_WEIGHTS 2e-5
/* trained model: absolute, against ref_logits.txt */
#define TOL_TRAINED 1e-4

/* the most layers the reference handles (per-layer cache types) */
#define MAX_LAYERS 64
#define MAX_LAYERS_LOAD MAX_LAYERS

/* ------------------------------------------------------------ reporting */
static int n_pass, n_fail, quick;
static const char *RUN_BIN, *SCRATCH;

static void report(int ok, const char *name, const char *fmt, ...) {
  va_list ap;
  printf("[%s] %s", ok ? "PASS" : "FAIL", name);
  if (fmt && fmt[0]) {
    printf(": ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
  }
  printf("\n");
  fflush(stdout);
  if (ok)
    n_pass++;
  else
    n_fail++;
}

static void note(const char *fmt, ...) {
  va_list ap;
  printf("[NOTE] ");
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  fflush(stdout);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "model_check: out of memory (%lu bytes)\n", (unsigned long)n);
    exit(2);
  }
  return p;
}

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) {
    fprintf(stderr, "model_check: out of memory\n");
    exit(2);
  }
  return p;
}

/* a path inside the scratch directory (kept until exit) */
static char *sp_list[4096];
static int sp_n;
static const char *sp(const char *name) {
  size_t n = strlen(SCRATCH) + strlen(name) + 2;
  char *b = (char *)xmalloc(n);
  snprintf(b, n, "%s/%s", SCRATCH, name);
  if (sp_n < (int)(sizeof sp_list / sizeof sp_list[0])) sp_list[sp_n++] = b;
  return b;
}
static void sp_free_all(void) {
  while (sp_n > 0) free(sp_list[--sp_n]);
}

/* ------------------------------------------------------------ files */
static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
    fprintf(stderr, "model_check: cannot write %s\n", path);
    exit(2);
  }
}

static void write_text(const char *path, const char *text) { write_file(path, text, strlen(text)); }

/* the whole file, NUL-terminated; NULL if it cannot be read */
static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  char *buf;
  size_t cap = 4096, n = 0, r;
  if (!f) return NULL;
  buf = (char *)xmalloc(cap);
  while ((r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += r;
    if (cap - n - 1 == 0) {
      char *nb;
      cap *= 2;
      nb = (char *)realloc(buf, cap);
      if (!nb) {
        free(buf);
        fclose(f);
        return NULL;
      }
      buf = nb;
    }
  }
  fclose(f);
  buf[n] = '\0';
  if (len) *len = n;
  return buf;
}

static int file_exists(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  fclose(f);
  return 1;
}

/* ------------------------------------------------------------ running */
typedef struct {
  int code;    /* exit status, or -1 when it did not exit normally */
  int signal;  /* the signal that ended it, else 0 */
  char *out;   /* stdout, NUL-terminated */
  char *err;   /* stderr */
  char cmd[4096];
} Run;

static void run_free(Run *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}

/* Runs "KVATTN_RUN ARGS" (ARGS as printf would make it; the caller quotes
   paths) with stdout and stderr to files in the scratch directory. */
static Run run_prog(const char *fmt, ...) {
  Run r;
  char args[3000], full[4200];
  va_list ap;
  int st;
  memset(&r, 0, sizeof r);
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(r.cmd, sizeof r.cmd, "%s %s", RUN_BIN, args);
  snprintf(full, sizeof full, "exec '%s' %s >'%s' 2>'%s' </dev/null", RUN_BIN, args, sp("run.out"),
           sp("run.err"));
  fflush(stdout);
  st = system(full);
  r.code = -1;
  if (st != -1 && WIFEXITED(st)) {
    r.code = WEXITSTATUS(st);
    if (r.code > 128) { /* a shell reports a signalled child as 128+N */
      r.signal = r.code - 128;
      r.code = -1;
    }
  } else if (st != -1 && WIFSIGNALED(st)) {
    r.signal = WTERMSIG(st);
  }
  r.out = read_file(sp("run.out"), NULL);
  r.err = read_file(sp("run.err"), NULL);
  if (!r.out) r.out = (char *)xcalloc(1, 1);
  if (!r.err) r.err = (char *)xcalloc(1, 1);
  return r;
}

/* the first line of s, shortened, for messages */
static const char *first_line(const char *s) {
  static char buf[4][200];
  static int k;
  char *b = buf[k++ & 3];
  size_t i = 0;
  while (s[i] && s[i] != '\n' && i < sizeof buf[0] - 1) {
    b[i] = s[i];
    i++;
  }
  b[i] = '\0';
  return b;
}

static int has_sanitizer_report(const char *err) {
  return strstr(err, "Sanitizer") != NULL || strstr(err, "runtime error:") != NULL;
}

/* a run that should have worked: exit 0, no sanitizer report */
static int run_ok(const Run *r, char *why, size_t n) {
  if (r->signal) {
    snprintf(why, n, "killed by signal %d: %s", r->signal, r->cmd);
    return 0;
  }
  if (r->code != 0) {
    snprintf(why, n, "exit status %d (stderr: %s): %s", r->code, first_line(r->err), r->cmd);
    return 0;
  }
  if (has_sanitizer_report(r->err)) {
    snprintf(why, n, "sanitizer report on stderr: %s", r->cmd);
    return 0;
  }
  return 1;
}

/* ------------------------------------------------------------ random */
static uint64_t rng_state;
static uint64_t rng_next(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double rng_unif(void) { return (double)(rng_next() >> 11) * (1.0 / 9007199254740992.0); }
static float rng_sym(double a) { return (float)((2.0 * rng_unif() - 1.0) * a); }
static int rng_int(int n) { return (int)(rng_next() % (uint64_t)n); }

/* ------------------------------------------------------------ model */
typedef struct {
  int dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len, shared;
} Cfg;

typedef struct {
  Cfg c;
  int hs, kv_dim;
  float *w; /* every float of the file after the header, in file order */
  size_t nw;
  const float *emb, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final, *cls;
} Model;

static size_t cfg_floats(const Cfg *c) {
  size_t d = (size_t)c->dim, h = (size_t)c->hidden, L = (size_t)c->n_layers, V = (size_t)c->vocab;
  size_t hs = d / (size_t)c->n_heads, kvd = d * (size_t)c->n_kv_heads / (size_t)c->n_heads;
  size_t n = V * d + L * d + L * d * d + 2 * L * kvd * d + L * d * d + L * d + 3 * L * h * d + d +
             (size_t)c->seq_len * hs; /* the two unused blocks of seq_len*hs/2 */
  if (!c->shared) n += V * d;
  return n;
}

/* Random weights, scaled so activations stay around 1 and attention is far
   from uniform.  quiet_special: classifier rows of ids 0..258 (specials and
   byte tokens) near zero, so greedy text stays printable letters. */
static void model_gen(Model *m, const Cfg *c, uint64_t seed, int quiet_special) {
  size_t d = (size_t)c->dim, h = (size_t)c->hidden, L = (size_t)c->n_layers, V = (size_t)c->vocab;
  size_t i, kvd, hs;
  float *p;
  memset(m, 0, sizeof *m);
  m->c = *c;
  m->hs = c->dim / c->n_heads;
  m->kv_dim = c->dim * c->n_kv_heads / c->n_heads;
  kvd = (size_t)m->kv_dim;
  hs = (size_t)m->hs;
  m->nw = cfg_floats(c);
  m->w = (float *)xmalloc(m->nw * sizeof(float));
  rng_state = seed;
  p = m->w;
#define TENSOR(ptr, count, expr)                    \
  do {                                              \
    m->ptr = p;                                     \
    for (i = 0; i < (size_t)(count); i++) p[i] = (expr); \
    p += (count);                                   \
  } while (0)
  TENSOR(emb, V * d, rng_sym(1.0));
  TENSOR(rms_att, L * d, (float)(0.6 + 0.8 * rng_unif()));
  TENSOR(wq, L * d * d, rng_sym(2.0 * sqrt(3.0 / (double)d)));
  TENSOR(wk, L * kvd * d, rng_sym(2.0 * sqrt(3.0 / (double)d)));
  TENSOR(wv, L * kvd * d, rng_sym(sqrt(3.0 / (double)d)));
  TENSOR(wo, L * d * d, rng_sym(sqrt(3.0 / (double)d)));
  TENSOR(rms_ffn, L * d, (float)(0.6 + 0.8 * rng_unif()));
  TENSOR(w1, L * h * d, rng_sym(sqrt(3.0 / (double)d)));
  TENSOR(w2, L * d * h, rng_sym(sqrt(3.0 / (double)h)));
  TENSOR(w3, L * h * d, rng_sym(sqrt(3.0 / (double)d)));
  TENSOR(rms_final, d, (float)(0.6 + 0.8 * rng_unif()));
  /* the unused RoPE blocks hold noise: a program reading them would differ */
  for (i = 0; i < (size_t)c->seq_len * hs; i++) p[i] = rng_sym(3.0);
  p += (size_t)c->seq_len * hs;
  if (c->shared) {
    m->cls = m->emb;
  } else {
    TENSOR(cls, V * d, rng_sym(1.0));
  }
#undef TENSOR
  if (quiet_special) {
    float *cls = (float *)m->cls;
    size_t r;
    for (r = 0; r < 259 && r < V; r++)
      for (i = 0; i < d; i++) cls[r * d + i] *= 0.01f;
  }
  if ((size_t)(p - m->w) != m->nw) {
    fprintf(stderr, "model_check: internal error: tensor layout\n");
    exit(2);
  }
}

static void model_free(Model *m) {
  free(m->w);
  m->w = NULL;
}

static void put_i32(unsigned char *b, int32_t v) {
  uint32_t u = (uint32_t)v;
  b[0] = (unsigned char)(u & 255);
  b[1] = (unsigned char)((u >> 8) & 255);
  b[2] = (unsigned char)((u >> 16) & 255);
  b[3] = (unsigned char)((u >> 24) & 255);
}

/* the checkpoint file's bytes */
static unsigned char *ckpt_image(const Model *m, size_t *len) {
  size_t n = 28 + m->nw * 4;
  unsigned char *b = (unsigned char *)xmalloc(n);
  const Cfg *c = &m->c;
  put_i32(b, c->dim);
  put_i32(b + 4, c->hidden);
  put_i32(b + 8, c->n_layers);
  put_i32(b + 12, c->n_heads);
  put_i32(b + 16, c->n_kv_heads);
  put_i32(b + 20, c->shared ? c->vocab : -c->vocab);
  put_i32(b + 24, c->seq_len);
  memcpy(b + 28, m->w, m->nw * 4);
  *len = n;
  return b;
}

static int32_t get_i32(const unsigned char *b) {
  uint32_t u = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
  return (int32_t)u;
}

/* Reads a legacy checkpoint; returns NULL or a message. */
static const char *model_load(Model *m, const char *path) {
  static char msg[300];
  size_t len, d, h, L, V, kvd;
  char *buf = read_file(path, &len);
  const float *p;
  Cfg c;
  int32_t f[7];
  int i;
  memset(m, 0, sizeof *m);
  if (!buf) return "cannot read it";
  if (len < 28) {
    free(buf);
    return "shorter than the header";
  }
  for (i = 0; i < 7; i++) f[i] = get_i32((const unsigned char *)buf + 4 * i);
  c.dim = f[0];
  c.hidden = f[1];
  c.n_layers = f[2];
  c.n_heads = f[3];
  c.n_kv_heads = f[4];
  c.shared = f[5] > 0;
  c.vocab = f[5] > 0 ? f[5] : -f[5];
  c.seq_len = f[6];
  for (i = 0; i < 7; i++)
    if (f[i] == 0 || (i != 5 && f[i] < 0) || f[i] > (1 << 20) || f[i] < -(1 << 20)) break;
  if (i < 7 || c.dim % c.n_heads || c.n_heads % c.n_kv_heads || (c.dim / c.n_heads) % 2 ||
      c.n_layers > MAX_LAYERS_LOAD || len != 28 + 4 * cfg_floats(&c)) {
    snprintf(msg, sizeof msg, "header %d %d %d %d %d %d %d does not describe a model of %lu bytes (at most %d layers here)",
             f[0], f[1], f[2], f[3], f[4], f[5], f[6], (unsigned long)len, MAX_LAYERS_LOAD);
    free(buf);
    return msg;
  }
  m->c = c;
  m->hs = c.dim / c.n_heads;
  m->kv_dim = c.dim * c.n_kv_heads / c.n_heads;
  m->nw = cfg_floats(&c);
  m->w = (float *)xmalloc(m->nw * sizeof(float));
  memcpy(m->w, buf + 28, m->nw * sizeof(float));
  free(buf);
  d = (size_t)c.dim;
  h = (size_t)c.hidden;
  L = (size_t)c.n_layers;
  V = (size_t)c.vocab;
  kvd = (size_t)m->kv_dim;
  p = m->w;
  m->emb = p;
  p += V * d;
  m->rms_att = p;
  p += L * d;
  m->wq = p;
  p += L * d * d;
  m->wk = p;
  p += L * kvd * d;
  m->wv = p;
  p += L * kvd * d;
  m->wo = p;
  p += L * d * d;
  m->rms_ffn = p;
  p += L * d;
  m->w1 = p;
  p += L * h * d;
  m->w2 = p;
  p += L * d * h;
  m->w3 = p;
  p += L * h * d;
  m->rms_final = p;
  p += d + (size_t)c.seq_len * (size_t)m->hs;
  m->cls = c.shared ? m->emb : p;
  return NULL;
}

/* llama2.c's newer formats (its export script, versions 1 and 2): a 256-byte
   header: uint32 magic 0x616b3432 ("ak42"), int32 version, the 7 int32
   fields (vocab_size positive), uint8 shared_classifier, version 2: int32
   group size; zero padding.  Version 1: float32 rms_att [L][dim],
   rms_ffn [L][dim], rms_final, embedding, wq, wk, wv, wo, w1, w2, w3 (each
   [L]...), the classifier if not shared; no RoPE blocks.  Version 2: the
   norms as float32, then embedding, wq, wk, wv, wo, w1, w2, w3 (and the
   classifier) in Q8_0, each layer's matrix a tensor of its own: its int8
   values, then one float32 scale per group of gs values (scale = max |w| /
   127 over the group, q = round-half-even(w / scale)).  qm (version 2): the model with those
   dequantized weights, for the reference. */
static unsigned char *ckpt_image_v(const Model *m, int version, int gs, size_t *len, Model *qm) {
  const Cfg *c = &m->c;
  size_t d = (size_t)c->dim, h = (size_t)c->hidden, L = (size_t)c->n_layers, V = (size_t)c->vocab;
  size_t kvd = (size_t)m->kv_dim, n = 256, k, t;
  unsigned char *b;
  const float *q8[8 * MAX_LAYERS + 2];
  size_t q8n[8 * MAX_LAYERS + 2], l;
  int nq = 0;
  q8[nq] = m->emb, q8n[nq++] = V * d;
#define PER_LAYER(ptr, each) \
  for (l = 0; l < L; l++) q8[nq] = m->ptr + l * (each), q8n[nq++] = (each)
  PER_LAYER(wq, d * d);
  PER_LAYER(wk, kvd * d);
  PER_LAYER(wv, kvd * d);
  PER_LAYER(wo, d * d);
  PER_LAYER(w1, h * d);
  PER_LAYER(w2, d * h);
  PER_LAYER(w3, h * d);
#undef PER_LAYER
  if (!c->shared) q8[nq] = m->cls, q8n[nq++] = V * d;
  n += 4 * (2 * L * d + d);
  for (t = 0; t < (size_t)nq; t++) n += version == 1 ? 4 * q8n[t] : q8n[t] + 4 * (q8n[t] / (size_t)gs);
  b = (unsigned char *)xcalloc(n, 1);
  put_i32(b, 0x616b3432);
  put_i32(b + 4, version);
  put_i32(b + 8, c->dim);
  put_i32(b + 12, c->hidden);
  put_i32(b + 16, c->n_layers);
  put_i32(b + 20, c->n_heads);
  put_i32(b + 24, c->n_kv_heads);
  put_i32(b + 28, c->vocab);
  put_i32(b + 32, c->seq_len);
  b[36] = (unsigned char)(c->shared ? 1 : 0);
  if (version == 2) put_i32(b + 37, gs);
  k = 256;
  memcpy(b + k, m->rms_att, 4 * L * d);
  k += 4 * L * d;
  memcpy(b + k, m->rms_ffn, 4 * L * d);
  k += 4 * L * d;
  memcpy(b + k, m->rms_final, 4 * d);
  k += 4 * d;
  if (qm) {
    *qm = *m;
    qm->w = (float *)xmalloc(m->nw * sizeof(float));
    memcpy(qm->w, m->w, m->nw * sizeof(float));
#define REBASE(f) qm->f = qm->w + (m->f - m->w)
    REBASE(emb);
    REBASE(rms_att);
    REBASE(wq);
    REBASE(wk);
    REBASE(wv);
    REBASE(wo);
    REBASE(rms_ffn);
    REBASE(w1);
    REBASE(w2);
    REBASE(w3);
    REBASE(rms_final);
    REBASE(cls);
#undef REBASE
  }
  for (t = 0; t < (size_t)nq; t++) {
    if (version == 1) {
      memcpy(b + k, q8[t], 4 * q8n[t]);
      k += 4 * q8n[t];
    } else {
      size_t g, i, ng = q8n[t] / (size_t)gs;
      signed char *qv = (signed char *)(b + k);
      unsigned char *sc = b + k + q8n[t];
      float *dq = qm ? qm->w + (q8[t] - m->w) : NULL;
      for (g = 0; g < ng; g++) {
        const float *w = q8[t] + g * (size_t)gs;
        float amax = 0, scale;
        for (i = 0; i < (size_t)gs; i++)
          if (fabsf(w[i]) > amax) amax = fabsf(w[i]);
        scale = amax / 127.0f;
        for (i = 0; i < (size_t)gs; i++) {
          float qf = scale > 0 ? nearbyintf(w[i] / scale) : 0.0f;
          qv[g * (size_t)gs + i] = (signed char)qf;
          if (dq) dq[g * (size_t)gs + i] = qf * scale;
        }
        memcpy(sc + 4 * g, &scale, 4);
      }
      k += q8n[t] + 4 * ng;
    }
  }
  if (k != n) {
    fprintf(stderr, "model_check: internal error: version %d layout\n", version);
    exit(2);
  }
  *len = n;
  return b;
}

static void write_ckpt(const Model *m, const char *path) {
  size_t n;
  unsigned char *b = ckpt_image(m, &n);
  write_file(path, b, n);
  free(b);
}

/* ------------------------------------------------------------ reference */
static void matvec(double *out, const float *w, const double *x, int rows, int cols) {
  int i, j;
  for (i = 0; i < rows; i++) {
    const float *r = w + (size_t)i * (size_t)cols;
    double s = 0;
    for (j = 0; j < cols; j++) s += (double)r[j] * x[j];
    out[i] = s;
  }
}

static void rmsnorm(double *out, const double *x, const float *w, int n) {
  double ss = 0;
  int i;
  for (i = 0; i < n; i++) ss += x[i] * x[i];
  ss = 1.0 / sqrt(ss / n + 1e-5);
  for (i = 0; i < n; i++) out[i] = (double)w[i] * (x[i] * ss);
}

/* rotate the pairs (2i, 2i+1) of each head of v by pos * 10000^(-2i/hs) */
static void rope(double *v, int n_heads, int hs, int pos) {
  int h, i;
  for (h = 0; h < n_heads; h++) {
    double *x = v + (size_t)h * (size_t)hs;
    for (i = 0; i < hs / 2; i++) {
      double ang = pos * pow(10000.0, -2.0 * i / hs);
      double c = cos(ang), s = sin(ang), a = x[2 * i], b = x[2 * i + 1];
      x[2 * i] = a * c - b * s;
      x[2 * i + 1] = a * s + b * c;
    }
  }
}

/* Cache storage types the reference can emulate: a stored K or V value
   (K after RoPE) is rounded as the format would hold it.  IEEE 754 binary16
   (f16), bfloat16 (bf16), and the OCP 8-bit floating point formats E4M3 and
   E5M2 (OCP OFP8 specification 2023; stored value = fp8(x / S) for a tensor
   scale S): round to nearest even, subnormals, saturating at the largest
   finite value (448, 57344).  int8: one scale per token and KV head,
   max |x| / 127, values rounded to nearest (the program's --help: "a scale
   per token and head"). */
enum { Q_F32, Q_F16, Q_BF16, Q_INT8, Q_E4M3, Q_E5M2 };

static double round_float_format(double x, int mant_bits, int emin, double maxval) {
  int e;
  double step, a = fabs(x), q;
  if (a == 0) return x;
  e = (int)floor(log2(a));
  if (e < emin) e = emin;
  step = ldexp(1.0, e - mant_bits);
  q = nearbyint(a / step) * step;
  if (q > maxval) q = maxval;
  return x < 0 ? -q : q;
}

/* quantizes one token's kv_dim values in place, head by head; fp8_scale:
   the FP8 tensor scale S (stored value = fp8(x / S)) */
static void quantize_row(double *x, int kv_dim, int hs, int type, double fp8_scale) {
  int i, h;
  switch (type) {
    case Q_F16:
      for (i = 0; i < kv_dim; i++) x[i] = round_float_format(x[i], 10, -14, 65504.0);
      break;
    case Q_BF16:
      for (i = 0; i < kv_dim; i++) x[i] = round_float_format(x[i], 7, -126, 3.38953139e38);
      break;
    case Q_E4M3:
      for (i = 0; i < kv_dim; i++) x[i] = round_float_format(x[i] / fp8_scale, 3, -6, 448.0) * fp8_scale;
      break;
    case Q_E5M2:
      for (i = 0; i < kv_dim; i++) x[i] = round_float_format(x[i] / fp8_scale, 2, -14, 57344.0) * fp8_scale;
      break;
    case Q_INT8:
      for (h = 0; h < kv_dim / hs; h++) {
        double *r = x + (size_t)h * (size_t)hs, amax = 0, sc;
        for (i = 0; i < hs; i++)
          if (fabs(r[i]) > amax) amax = fabs(r[i]);
        sc = amax / 127.0;
        for (i = 0; i < hs; i++) r[i] = sc > 0 ? nearbyint(r[i] / sc) * sc : 0;
      }
      break;
    default:
      break;
  }
}

/* Incremental reference (one token per call, a double KV cache).
   variant 1: keys rotated one position too far; variant 2: the attention
   misses the newest key (except at position 0) - the two "broken cache"
   models the quantized tolerances must stay well below.
   kq[l], vq[l]: the emulated storage type of layer l's K and V. */
typedef struct {
  const Model *m;
  int variant, pos;
  int kq[MAX_LAYERS], vq[MAX_LAYERS];
  /* Window eviction (win_budget > 0), as kvattn defines it: before each
     append of a chunk of c tokens, the oldest positions other than the first
     win_sinks are evicted until the tokens held plus c fit the budget (or
     only sinks are left); the chunk then attends causally to what is held
     and to itself.  The tokens come in chunks of win_chunk (0: 1) out of
     win_total.  What is held is the sinks and the positions win_lo..chunk
     start - 1. */
  int win_budget, win_sinks, win_chunk, win_total, win_lo, win_cs;
  double kscale, vscale; /* FP8 tensor scales of K and V */
  double *kc, *vc; /* [L][seq_len][kv_dim] */
  double *x, *xb, *q, *k, *v, *att, *ao, *h1, *h3, *t;
} Ref;

static void ref_init(Ref *r, const Model *m, int variant) {
  const Cfg *c = &m->c;
  size_t cache = (size_t)c->n_layers * (size_t)c->seq_len * (size_t)m->kv_dim;
  int big = c->dim > c->hidden ? c->dim : c->hidden;
  if (c->vocab > big) big = c->vocab;
  memset(r, 0, sizeof *r);
  r->m = m;
  r->variant = variant;
  r->kscale = r->vscale = 1;
  r->kc = (double *)xcalloc(cache, sizeof(double));
  r->vc = (double *)xcalloc(cache, sizeof(double));
  r->x = (double *)xcalloc((size_t)c->dim, sizeof(double));
  r->xb = (double *)xcalloc((size_t)c->dim, sizeof(double));
  r->q = (double *)xcalloc((size_t)c->dim, sizeof(double));
  r->k = (double *)xcalloc((size_t)m->kv_dim, sizeof(double));
  r->v = (double *)xcalloc((size_t)m->kv_dim, sizeof(double));
  r->att = (double *)xcalloc((size_t)c->seq_len, sizeof(double));
  r->ao = (double *)xcalloc((size_t)c->dim, sizeof(double));
  r->h1 = (double *)xcalloc((size_t)c->hidden, sizeof(double));
  r->h3 = (double *)xcalloc((size_t)c->hidden, sizeof(double));
  r->t = (double *)xcalloc((size_t)big, sizeof(double));
}

static void ref_free(Ref *r) {
  free(r->kc);
  free(r->vc);
  free(r->x);
  free(r->xb);
  free(r->q);
  free(r->k);
  free(r->v);
  free(r->att);
  free(r->ao);
  free(r->h1);
  free(r->h3);
  free(r->t);
}

/* position j is not attended to from position pos (window eviction) */
static int ref_evicted(const Ref *r, int j, int pos) {
  (void)pos;
  return r->win_budget > 0 && j >= r->win_sinks && j < r->win_cs && j < r->win_lo;
}

/* window eviction at the start of a chunk (position pos starts one) */
static void ref_window_append(Ref *r, int pos) {
  int c = r->win_chunk > 0 ? r->win_chunk : 1, held;
  if (pos + c > r->win_total) c = r->win_total - pos;
  if (r->win_lo < r->win_sinks) r->win_lo = r->win_sinks;
  held = (pos < r->win_sinks ? pos : r->win_sinks) + (pos > r->win_lo ? pos - r->win_lo : 0);
  while (held + c > r->win_budget && r->win_lo < pos) {
    r->win_lo++;
    held--;
  }
  r->win_cs = pos;
}

/* feeds token at position r->pos, writes vocab logits (may be NULL) */
static void ref_step(Ref *r, int token, double *logits) {
  const Model *m = r->m;
  const Cfg *c = &m->c;
  int d = c->dim, hd = c->hidden, hs = m->hs, kvd = m->kv_dim, pos = r->pos;
  int grp = c->n_heads / c->n_kv_heads, l, i, h, j;
  for (i = 0; i < d; i++) r->x[i] = m->emb[(size_t)token * (size_t)d + (size_t)i];
  if (r->win_budget > 0 && pos % (r->win_chunk > 0 ? r->win_chunk : 1) == 0) ref_window_append(r, pos);
  for (l = 0; l < c->n_layers; l++) {
    double *kl = r->kc + (size_t)l * (size_t)c->seq_len * (size_t)kvd;
    double *vl = r->vc + (size_t)l * (size_t)c->seq_len * (size_t)kvd;
    rmsnorm(r->xb, r->x, m->rms_att + (size_t)l * (size_t)d, d);
    matvec(r->q, m->wq + (size_t)l * (size_t)d * (size_t)d, r->xb, d, d);
    matvec(r->k, m->wk + (size_t)l * (size_t)kvd * (size_t)d, r->xb, kvd, d);
    matvec(r->v, m->wv + (size_t)l * (size_t)kvd * (size_t)d, r->xb, kvd, d);
    rope(r->q, c->n_heads, hs, pos);
    rope(r->k, c->n_kv_heads, hs, pos + (r->variant == 1));
    if (l < MAX_LAYERS) {
      quantize_row(r->k, kvd, hs, r->kq[l], r->kscale);
      quantize_row(r->v, kvd, hs, r->vq[l], r->vscale);
    }
    memcpy(kl + (size_t)pos * (size_t)kvd, r->k, (size_t)kvd * sizeof(double));
    memcpy(vl + (size_t)pos * (size_t)kvd, r->v, (size_t)kvd * sizeof(double));
    for (h = 0; h < c->n_heads; h++) {
      const double *qh = r->q + (size_t)h * (size_t)hs;
      int kh = h / grp, last = pos, first = 0;
      double mx = -1e300, sum = 0;
      if (r->variant == 2 && pos > 0) last = pos - 1;
      for (j = first; j <= last; j++) {
        const double *kj;
        double s = 0;
        if (ref_evicted(r, j, pos)) continue;
        kj = kl + (size_t)j * (size_t)kvd + (size_t)kh * (size_t)hs;
        for (i = 0; i < hs; i++) s += qh[i] * kj[i];
        s /= sqrt((double)hs);
        r->att[j] = s;
        if (s > mx) mx = s;
      }
      for (j = first; j <= last; j++) {
        if (ref_evicted(r, j, pos)) continue;
        r->att[j] = exp(r->att[j] - mx);
        sum += r->att[j];
      }
      for (i = 0; i < hs; i++) r->ao[h * hs + i] = 0;
      for (j = first; j <= last; j++) {
        const double *vj;
        double p;
        if (ref_evicted(r, j, pos)) continue;
        vj = vl + (size_t)j * (size_t)kvd + (size_t)kh * (size_t)hs;
        p = r->att[j] / sum;
        for (i = 0; i < hs; i++) r->ao[h * hs + i] += p * vj[i];
      }
    }
    matvec(r->t, m->wo + (size_t)l * (size_t)d * (size_t)d, r->ao, d, d);
    for (i = 0; i < d; i++) r->x[i] += r->t[i];
    rmsnorm(r->xb, r->x, m->rms_ffn + (size_t)l * (size_t)d, d);
    matvec(r->h1, m->w1 + (size_t)l * (size_t)hd * (size_t)d, r->xb, hd, d);
    matvec(r->h3, m->w3 + (size_t)l * (size_t)hd * (size_t)d, r->xb, hd, d);
    for (i = 0; i < hd; i++) r->h1[i] = r->h1[i] / (1.0 + exp(-r->h1[i])) * r->h3[i];
    matvec(r->t, m->w2 + (size_t)l * (size_t)d * (size_t)hd, r->h1, d, hd);
    for (i = 0; i < d; i++) r->x[i] += r->t[i];
  }
  r->pos++;
  if (logits) {
    rmsnorm(r->xb, r->x, m->rms_final, d);
    matvec(logits, m->cls, r->xb, c->vocab, d);
  }
}

/* logits [n][vocab] of a token sequence from an empty cache; kq, vq: the
   storage type of each layer's K and V (NULL: exact) */
static double *ref_logits_kv(const Model *m, const int *tok, int n, int variant, const int *kq,
                             const int *vq) {
  double *lg = (double *)xmalloc((size_t)n * (size_t)m->c.vocab * sizeof(double));
  Ref r;
  int t, l;
  ref_init(&r, m, variant);
  for (l = 0; l < MAX_LAYERS && l < m->c.n_layers; l++) {
    r.kq[l] = kq ? kq[l] : Q_F32;
    r.vq[l] = vq ? vq[l] : Q_F32;
  }
  for (t = 0; t < n; t++) ref_step(&r, tok[t], lg + (size_t)t * (size_t)m->c.vocab);
  ref_free(&r);
  return lg;
}

/* logits with window eviction, the tokens fed in chunks of `chunk` (token
   by token, each position attends to the first `sinks` positions and the
   newest budget - sinks, itself included) */
static double *ref_logits_window_chunked(const Model *m, const int *tok, int n, int budget, int sinks,
                                         int chunk) {
  double *lg = (double *)xmalloc((size_t)n * (size_t)m->c.vocab * sizeof(double));
  Ref r;
  int t;
  ref_init(&r, m, 0);
  r.win_budget = budget;
  r.win_sinks = sinks;
  r.win_chunk = chunk;
  r.win_total = n;
  for (t = 0; t < n; t++) ref_step(&r, tok[t], lg + (size_t)t * (size_t)m->c.vocab);
  ref_free(&r);
  return lg;
}

static double *ref_logits_window(const Model *m, const int *tok, int n, int budget, int sinks) {
  return ref_logits_window_chunked(m, tok, n, budget, sinks, 1);
}

static double *ref_logits(const Model *m, const int *tok, int n, int variant) {
  return ref_logits_kv(m, tok, n, variant, NULL, NULL);
}

/* FP8 E4M3 K and V with tensor scales ks, vs */
static double *ref_logits_fp8(const Model *m, const int *tok, int n, double ks, double vs) {
  double *lg = (double *)xmalloc((size_t)n * (size_t)m->c.vocab * sizeof(double));
  Ref r;
  int t, l;
  ref_init(&r, m, 0);
  for (l = 0; l < MAX_LAYERS; l++) r.kq[l] = r.vq[l] = Q_E4M3;
  r.kscale = ks;
  r.vscale = vs;
  for (t = 0; t < n; t++) ref_step(&r, tok[t], lg + (size_t)t * (size_t)m->c.vocab);
  ref_free(&r);
  return lg;
}

/* the same type for K and V of every layer */
static double *ref_logits_type(const Model *m, const int *tok, int n, int ktype, int vtype) {
  int kq[MAX_LAYERS], vq[MAX_LAYERS], l;
  for (l = 0; l < MAX_LAYERS; l++) {
    kq[l] = ktype;
    vq[l] = vtype;
  }
  return ref_logits_kv(m, tok, n, 0, kq, vq);
}

/* A second, independent formulation: the whole sequence layer by layer
   (prefill form, no cache), for the reference's own self-test. */
static double *ref_logits_prefill(const Model *m, const int *tok, int n) {
  const Cfg *c = &m->c;
  int d = c->dim, hd = c->hidden, hs = m->hs, kvd = m->kv_dim, V = c->vocab, l, t, h, j, i;
  double *X = (double *)xcalloc((size_t)n * (size_t)d, sizeof(double));
  double *XB = (double *)xcalloc((size_t)n * (size_t)d, sizeof(double));
  double *Q = (double *)xcalloc((size_t)n * (size_t)d, sizeof(double));
  double *K = (double *)xcalloc((size_t)n * (size_t)kvd, sizeof(double));
  double *Vv = (double *)xcalloc((size_t)n * (size_t)kvd, sizeof(double));
  double *O = (double *)xcalloc((size_t)n * (size_t)d, sizeof(double));
  double *T = (double *)xcalloc((size_t)(d > hd ? d : hd), sizeof(double));
  double *H1 = (double *)xcalloc((size_t)hd, sizeof(double));
  double *H3 = (double *)xcalloc((size_t)hd, sizeof(double));
  double *P = (double *)xcalloc((size_t)n, sizeof(double));
  double *lg = (double *)xcalloc((size_t)n * (size_t)V, sizeof(double));
  for (t = 0; t < n; t++)
    for (i = 0; i < d; i++) X[t * d + i] = m->emb[(size_t)tok[t] * (size_t)d + (size_t)i];
  for (l = 0; l < c->n_layers; l++) {
    for (t = 0; t < n; t++) {
      rmsnorm(XB + t * d, X + t * d, m->rms_att + l * d, d);
      matvec(Q + t * d, m->wq + (size_t)l * d * d, XB + t * d, d, d);
      matvec(K + t * kvd, m->wk + (size_t)l * kvd * d, XB + t * d, kvd, d);
      matvec(Vv + t * kvd, m->wv + (size_t)l * kvd * d, XB + t * d, kvd, d);
      /* RoPE written out per element, as angle = pos * base^(-(2i)/hs) */
      for (i = 0; i < d; i += 2) {
        int pi = (i % hs) / 2;
        double th = t / pow(10000.0, (2.0 * pi) / hs), a = Q[t * d + i], b = Q[t * d + i + 1];
        Q[t * d + i] = cos(th) * a - sin(th) * b;
        Q[t * d + i + 1] = sin(th) * a + cos(th) * b;
        if (i < kvd) {
          a = K[t * kvd + i];
          b = K[t * kvd + i + 1];
          K[t * kvd + i] = cos(th) * a - sin(th) * b;
          K[t * kvd + i + 1] = sin(th) * a + cos(th) * b;
        }
      }
    }
    for (t = 0; t < n; t++)
      for (h = 0; h < c->n_heads; h++) {
        int kh = h * c->n_kv_heads / c->n_heads;
        double mx = -1e300, z = 0;
        for (j = 0; j <= t; j++) {
          double s = 0;
          for (i = 0; i < hs; i++) s += Q[t * d + h * hs + i] * K[j * kvd + kh * hs + i];
          P[j] = s / sqrt((double)hs);
          if (P[j] > mx) mx = P[j];
        }
        for (j = 0; j <= t; j++) z += (P[j] = exp(P[j] - mx));
        for (i = 0; i < hs; i++) {
          double s = 0;
          for (j = 0; j <= t; j++) s += P[j] * Vv[j * kvd + kh * hs + i];
          O[t * d + h * hs + i] = s / z;
        }
      }
    for (t = 0; t < n; t++) {
      matvec(T, m->wo + (size_t)l * d * d, O + t * d, d, d);
      for (i = 0; i < d; i++) X[t * d + i] += T[i];
      rmsnorm(XB + t * d, X + t * d, m->rms_ffn + l * d, d);
      matvec(H1, m->w1 + (size_t)l * hd * d, XB + t * d, hd, d);
      matvec(H3, m->w3 + (size_t)l * hd * d, XB + t * d, hd, d);
      for (i = 0; i < hd; i++) H1[i] = H1[i] * H3[i] / (1.0 + exp(-H1[i]));
      matvec(T, m->w2 + (size_t)l * d * hd, H1, d, hd);
      for (i = 0; i < d; i++) X[t * d + i] += T[i];
    }
  }
  for (t = 0; t < n; t++) {
    rmsnorm(XB + t * d, X + t * d, m->rms_final, d);
    matvec(lg + (size_t)t * V, m->cls, XB + t * d, V, d);
  }
  free(X);
  free(XB);
  free(Q);
  free(K);
  free(Vv);
  free(O);
  free(T);
  free(H1);
  free(H3);
  free(P);
  return lg;
}

/* mean next-token loss over consecutive windows of seq_len tokens
   [0,L) [L,2L) ..., each from an empty cache; every token after the first
   is predicted once: each position's logits predict the next token, also
   across a window's end (the last position of a window predicts the first
   token of the next one) */
/* ... with window eviction (budget > 0 tokens; budget < 0: -budget percent
   of each window's length, which the caller makes a whole number) and a
   cache type for K and V */
static double ref_window_loss_cfg(const Model *m, const int *tok, int n, int *count, int budget, int sinks,
                                  int qtype) {
  int L = m->c.seq_len, V = m->c.vocab, s, t, cnt = 0, l;
  double sum = 0;
  double *lg = (double *)xmalloc((size_t)V * sizeof(double));
  for (s = 0; s + 1 < n; s += L) {
    int w = n - s < L ? n - s : L;
    Ref r;
    ref_init(&r, m, 0);
    r.win_budget = budget >= 0 ? budget : -budget * w / 100;
    r.win_sinks = sinks;
    r.win_chunk = 1;
    r.win_total = w;
    for (l = 0; l < MAX_LAYERS; l++) r.kq[l] = r.vq[l] = qtype;
    for (t = 0; t < w && s + t + 1 < n; t++) {
      double mx = -1e300, z = 0;
      int v;
      ref_step(&r, tok[s + t], lg);
      for (v = 0; v < V; v++)
        if (lg[v] > mx) mx = lg[v];
      for (v = 0; v < V; v++) z += exp(lg[v] - mx);
      sum += -(lg[tok[s + t + 1]] - mx - log(z));
      cnt++;
    }
    ref_free(&r);
  }
  free(lg);
  *count = cnt;
  return cnt ? sum / cnt : 0;
}

static double ref_window_loss(const Model *m, const int *tok, int n, int *count) {
  return ref_window_loss_cfg(m, tok, n, count, 0, 0, Q_F32);
}

/* ------------------------------------------------------------ tokenizer */
typedef struct {
  int n, maxlen;
  char **s;
  int *len;
  float *score;
} Vocab;

static int vocab_find(const Vocab *v, const char *str, int len) {
  int i;
  for (i = 0; i < v->n; i++)
    if (v->len[i] == len && memcmp(v->s[i], str, (size_t)len) == 0) return i;
  return -1;
}

static void vocab_add(Vocab *v, const char *str, int len, float score) {
  v->s[v->n] = (char *)xmalloc((size_t)len + 1);
  memcpy(v->s[v->n], str, (size_t)len);
  v->s[v->n][len] = '\0';
  v->len[v->n] = len;
  v->score[v->n] = score;
  if (len > v->maxlen) v->maxlen = len;
  v->n++;
}

/* n tokens: specials, 256 byte tokens, " ", a-z, "é", a few chosen merges,
   then random merges of existing pieces with distinct scores */
static void vocab_gen(Vocab *v, int n, uint64_t seed) {
  static const char *chosen[] = {" t", "he", "the", " the", "at", "an", " a", " c", "ca", "cat",
                                 " cat", "og", "do", "dog", " s", "sa", "sat", "in", "on", " on"};
  char buf[64];
  int i, guard = 0;
  memset(v, 0, sizeof *v);
  v->s = (char **)xcalloc((size_t)n, sizeof(char *));
  v->len = (int *)xcalloc((size_t)n, sizeof(int));
  v->score = (float *)xcalloc((size_t)n, sizeof(float));
  rng_state = seed;
  vocab_add(v, "<unk>", 5, 0);
  vocab_add(v, "<s>", 3, 0);
  vocab_add(v, "</s>", 4, 0);
  for (i = 0; i < 256 && v->n < n; i++) {
    snprintf(buf, sizeof buf, "<0x%02X>", i);
    vocab_add(v, buf, 6, 0);
  }
  if (v->n < n) vocab_add(v, " ", 1, -1000);
  for (i = 0; i < 26 && v->n < n; i++) {
    buf[0] = (char)('a' + i);
    vocab_add(v, buf, 1, (float)(-1000 - i));
  }
  if (v->n < n) vocab_add(v, "\xc3\xa9", 2, -1100);
  for (i = 0; i < (int)(sizeof chosen / sizeof chosen[0]) && v->n < n; i++)
    vocab_add(v, chosen[i], (int)strlen(chosen[i]), (float)(-10.0 * rng_unif() - 0.01 * v->n));
  while (v->n < n) {
    int a = 259 + rng_int(v->n - 259), b = 259 + rng_int(v->n - 259);
    int la = v->len[a], lb = v->len[b];
    if (++guard > 100000) {
      fprintf(stderr, "model_check: internal error: vocabulary\n");
      exit(2);
    }
    if (la + lb > 10 || v->s[a][0] == '\xc3' || v->s[b][0] == '\xc3') continue;
    memcpy(buf, v->s[a], (size_t)la);
    memcpy(buf + la, v->s[b], (size_t)lb);
    if (vocab_find(v, buf, la + lb) >= 0) continue;
    vocab_add(v, buf, la + lb, (float)(-10.0 * rng_unif() - 0.01 * v->n));
  }
}

static void vocab_free(Vocab *v) {
  int i;
  for (i = 0; i < v->n; i++) free(v->s[i]);
  free(v->s);
  free(v->len);
  free(v->score);
}

/* reads n tokens of a tokenizer.bin; returns NULL or a message */
static const char *vocab_load(Vocab *v, const char *path, int n) {
  size_t len, k = 4;
  char *buf = read_file(path, &len);
  int i;
  memset(v, 0, sizeof *v);
  if (!buf) return "cannot read it";
  v->s = (char **)xcalloc((size_t)n, sizeof(char *));
  v->len = (int *)xcalloc((size_t)n, sizeof(int));
  v->score = (float *)xcalloc((size_t)n, sizeof(float));
  for (i = 0; i < n; i++) {
    int32_t l;
    float sc;
    if (k + 8 > len) break;
    memcpy(&sc, buf + k, 4);
    l = get_i32((const unsigned char *)buf + k + 4);
    if (l <= 0 || (size_t)l > len - k - 8) break;
    vocab_add(v, buf + k + 8, (int)l, sc);
    k += 8 + (size_t)l;
  }
  free(buf);
  return v->n == n ? NULL : "truncated or malformed";
}

static unsigned char *vocab_image(const Vocab *v, size_t *len) {
  size_t n = 4, k = 0;
  int i;
  unsigned char *b;
  for (i = 0; i < v->n; i++) n += 8 + (size_t)v->len[i];
  b = (unsigned char *)xmalloc(n);
  put_i32(b, v->maxlen);
  k = 4;
  for (i = 0; i < v->n; i++) {
    memcpy(b + k, &v->score[i], 4);
    put_i32(b + k + 4, v->len[i]);
    memcpy(b + k + 8, v->s[i], (size_t)v->len[i]);
    k += 8 + (size_t)v->len[i];
  }
  *len = n;
  return b;
}

static void write_vocab(const Vocab *v, const char *path) {
  size_t n;
  unsigned char *b = vocab_image(v, &n);
  write_file(path, b, n);
  free(b);
}

/* encode text with BOS; returns the count, ids in out (capacity cap) */
static int ref_encode(const Vocab *v, const char *text, int *out, int cap) {
  int n = 0, i;
  const unsigned char *c = (const unsigned char *)text;
  char buf[64];
  out[n++] = 1;
  if (text[0]) out[n++] = vocab_find(v, " ", 1);
  while (*c && n < cap) {
    int len = 1, id;
    while (c[len] && (c[len] & 0xC0) == 0x80 && len < 4) len++;
    id = vocab_find(v, (const char *)c, len);
    if (id >= 0) {
      out[n++] = id;
    } else {
      for (i = 0; i < len && n < cap; i++) out[n++] = c[i] + 3;
    }
    c += len;
  }
  for (;;) {
    int best = -1, best_id = -1;
    float best_score = -1e30f;
    for (i = 1; i + 1 < n; i++) { /* never merges BOS */
      int la = v->len[out[i]], lb = v->len[out[i + 1]], id;
      if (la + lb >= (int)sizeof buf) continue;
      memcpy(buf, v->s[out[i]], (size_t)la);
      memcpy(buf + la, v->s[out[i + 1]], (size_t)lb);
      id = vocab_find(v, buf, la + lb);
      if (id >= 0 && v->score[id] > best_score) {
        best_score = v->score[id];
        best = i;
        best_id = id;
      }
    }
    if (best < 0) break;
    out[best] = best_id;
    memmove(out + best + 1, out + best + 2, (size_t)(n - best - 2) * sizeof(int));
    n--;
  }
  return n;
}

/* appends the printed form of token tok (after prev) to s */
static void ref_decode_piece(const Vocab *v, int prev, int tok, char *s, size_t cap) {
  const char *p = v->s[tok];
  size_t k = strlen(s);
  unsigned int byte;
  char one[2];
  if (prev == 1 && p[0] == ' ') p++;
  if (v->len[tok] == 6 && sscanf(p, "<0x%2X>", &byte) == 1 && p[5] == '>') {
    one[0] = (char)byte;
    one[1] = '\0';
    p = one;
  }
  if (p[0] && !p[1] && !(isprint((unsigned char)p[0]) || isspace((unsigned char)p[0]))) return;
  if (k + strlen(p) + 1 < cap) memcpy(s + k, p, strlen(p) + 1);
}

/* ------------------------------------------------------------ comparisons */
typedef struct {
  double maxdiff, scale; /* max |a - ref|, max |ref| */
  double rms;            /* sqrt(sum (a - ref)^2 / sum ref^2) */
} Cmp;

/* Parses n rows of V numbers; returns NULL or a message. */
static const char *parse_logits(const char *text, int n, int V, double *out) {
  static char msg[200];
  const char *p = text;
  int row, col;
  for (row = 0; row < n; row++) {
    for (col = 0; col < V; col++) {
      char *end;
      double x;
      while (*p == ' ' || *p == '\t') p++;
      if (*p == '\n' || *p == '\0') {
        snprintf(msg, sizeof msg, "row %d has %d numbers, expected %d", row, col, V);
        return msg;
      }
      x = strtod(p, &end);
      if (end == p) {
        snprintf(msg, sizeof msg, "row %d column %d: not a number (\"%s\")", row, col, first_line(p));
        return msg;
      }
      if (!isfinite(x)) {
        snprintf(msg, sizeof msg, "row %d column %d: %g", row, col, x);
        return msg;
      }
      out[(size_t)row * (size_t)V + (size_t)col] = x;
      p = end;
    }
    while (*p == ' ' || *p == '\t' || *p == '\r') p++;
    if (*p != '\n' && !(*p == '\0' && row == n - 1)) {
      snprintf(msg, sizeof msg, "row %d has more than %d numbers", row, V);
      return msg;
    }
    if (*p) p++;
  }
  while (isspace((unsigned char)*p)) p++;
  if (*p) {
    snprintf(msg, sizeof msg, "more than %d rows of logits on stdout", n);
    return msg;
  }
  return NULL;
}

static Cmp compare(const double *a, const double *ref, size_t n) {
  Cmp c;
  size_t i;
  double sd = 0, sr = 1e-300;
  c.maxdiff = 0;
  c.scale = 1e-30;
  for (i = 0; i < n; i++) {
    double d = fabs(a[i] - ref[i]);
    if (d > c.maxdiff || d != d) c.maxdiff = d;
    if (fabs(ref[i]) > c.scale) c.scale = fabs(ref[i]);
    sd += d * d;
    sr += ref[i] * ref[i];
  }
  c.rms = sqrt(sd / sr);
  return c;
}

static void write_ids(const char *path, const int *ids, int n) {
  FILE *f = fopen(path, "w");
  int i;
  if (!f) {
    fprintf(stderr, "model_check: cannot write %s\n", path);
    exit(2);
  }
  for (i = 0; i < n; i++) fprintf(f, "%d%c", ids[i], (i % 16 == 15 || i == n - 1) ? '\n' : ' ');
  fclose(f);
}

/* Runs --logits-tokens with extra flags; returns the logits or NULL (and
   reports the failure under name). */
static double *prog_logits(const char *name, const char *ck, const char *tk, const char *ids, int n,
                           int V, const char *flags) {
  char why[8192];
  Run r = run_prog("'%s' -z '%s' --logits-tokens '%s' %s", ck, tk, ids, flags);
  double *lg;
  const char *msg;
  if (!run_ok(&r, why, sizeof why)) {
    report(0, name, "%s", why);
    run_free(&r);
    return NULL;
  }
  lg = (double *)xmalloc((size_t)n * (size_t)V * sizeof(double));
  msg = parse_logits(r.out, n, V, lg);
  if (msg) {
    report(0, name, "%s: %s", msg, r.cmd);
    free(lg);
    lg = NULL;
  }
  run_free(&r);
  return lg;
}

/* One logits check of the program (with flags) against ref.  Exact
   configurations (quantized == 0): max |diff| <= tol * scale.  Quantized
   caches: the relative RMS error within [1e-9, tol] (the lower bound: the
   dtype must change something).  Returns the measure (-1: did not run). */
static double check_logits(const char *name, const char *ck, const char *tk, const char *ids, int n,
                           int V, const char *flags, const double *ref, double tol, int quantized) {
  double *lg = prog_logits(name, ck, tk, ids, n, V, flags);
  Cmp c;
  double rel;
  if (!lg) return -1;
  c = compare(lg, ref, (size_t)n * (size_t)V);
  if (quantized) {
    rel = c.rms;
    report(rel <= tol && rel >= 1e-9, name,
           "relative RMS error %.3g (tolerance %.3g, and > 0: the dtype must change something); "
           "max |diff| %.3g, scale %.3g",
           rel, tol, c.maxdiff, c.scale);
  } else {
    rel = c.maxdiff / c.scale;
    report(rel <= tol, name, "max |diff| %.3g = %.3g x scale %.3g (tolerance %.3g)", c.maxdiff, rel,
           c.scale, tol);
  }
  free(lg);
  return rel;
}

/* A quantized-cache check: the program's logits against the reference that
   rounds every stored K and V as the format does (max |diff| <= tol *
   scale), and different from the exact reference (the dtype must change
   something).  Also shows the relative RMS error against the exact one. */
static void check_quant(const char *name, const char *ck, const char *tk, const char *ids, int n,
                        int V, const char *flags, const double *exact, const double *emul, double tol) {
  double *lg = prog_logits(name, ck, tk, ids, n, V, flags);
  Cmp ce, cx, cq;
  if (!lg) return;
  ce = compare(lg, emul, (size_t)n * (size_t)V);
  cx = compare(lg, exact, (size_t)n * (size_t)V);
  cq = compare(emul, exact, (size_t)n * (size_t)V);
  report(ce.maxdiff <= tol * ce.scale && cx.maxdiff > 1e-6 * cx.scale, name,
         "max |diff| from the reference with this cache format %.3g x scale %.3g (tolerance %.3g); "
         "from the exact reference %.3g x scale (must be > 1e-6), relative RMS %.3g (the "
         "emulation's own: %.3g)",
         ce.maxdiff / ce.scale, ce.scale, tol, cx.maxdiff / cx.scale, cx.rms, cq.rms);
  free(lg);
}

/* ------------------------------------------------------------ self-test */
static int self_test(void) {
  /* hand-computed: dim 2, one head of size 2, one layer, wq=wk=wv=wo=I,
     FFN zero, RMS weights 1, embedding rows e0=(1,0), e1=(0,1), tied */
  Cfg c = {2, 2, 1, 1, 1, 2, 4, 1};
  Model m;
  int tok[2] = {0, 1}, ok = 1, i;
  double *lg, *lg2, s = 1.0 / sqrt(0.5 + 1e-5), x0[2], x1[2], p0, p1, z, r;
  model_gen(&m, &c, 1, 0);
  memset(m.w, 0, m.nw * sizeof(float));
  ((float *)m.emb)[0] = 1;
  ((float *)m.emb)[3] = 1;
  ((float *)m.rms_att)[0] = ((float *)m.rms_att)[1] = 1;
  ((float *)m.rms_ffn)[0] = ((float *)m.rms_ffn)[1] = 1;
  ((float *)m.rms_final)[0] = ((float *)m.rms_final)[1] = 1;
  ((float *)m.wq)[0] = ((float *)m.wq)[3] = 1;
  ((float *)m.wk)[0] = ((float *)m.wk)[3] = 1;
  ((float *)m.wv)[0] = ((float *)m.wv)[3] = 1;
  ((float *)m.wo)[0] = ((float *)m.wo)[3] = 1;
  lg = ref_logits(&m, tok, 2, 0);
  /* position 0: x = e0 + attention output (= v0 = (s,0)) */
  x0[0] = 1 + s;
  x0[1] = 0;
  /* position 1: q = k1 = rot(1)(0,s) = (-s sin1, s cos1); k0 = (s,0) */
  p0 = (-s * sin(1.0) * s) / sqrt(2.0);
  p1 = (s * s) / sqrt(2.0);
  z = exp(p0) + exp(p1);
  x1[0] = exp(p0) / z * s;
  x1[1] = 1 + exp(p1) / z * s;
  r = 1.0 / sqrt((x0[0] * x0[0] + x0[1] * x0[1]) / 2 + 1e-5);
  ok &= fabs(lg[0] - x0[0] * r) < 1e-12 && fabs(lg[1] - x0[1] * r) < 1e-12;
  r = 1.0 / sqrt((x1[0] * x1[0] + x1[1] * x1[1]) / 2 + 1e-5);
  ok &= fabs(lg[2] - x1[0] * r) < 1e-12 && fabs(lg[3] - x1[1] * r) < 1e-12;
  report(ok, "self-test: hand-computed 2-token case", "logits %.9f %.9f / %.9f %.9f", lg[0], lg[1],
         lg[2], lg[3]);
  free(lg);
  model_free(&m);
  {
    double v[4] = {1, 0, 1, 0};
    rope(v, 1, 4, 3);
    ok = fabs(v[0] - cos(3.0)) < 1e-15 && fabs(v[1] - sin(3.0)) < 1e-15 &&
         fabs(v[2] - cos(0.03)) < 1e-15 && fabs(v[3] - sin(0.03)) < 1e-15;
    report(ok, "self-test: RoPE pair frequencies", "(1,0,1,0) at position 3 -> %.6f %.6f %.6f %.6f", v[0],
           v[1], v[2], v[3]);
  }
  {
    /* storage rounding, hand-computed */
    double x[4] = {0.3, -0.1, 0.05, 0.0};
    ok = round_float_format(1.0 / 3, 10, -14, 65504) == 0.333251953125 &&
         round_float_format(1.0 / 3, 7, -126, 3.4e38) == 0.333984375 &&
         round_float_format(0.3, 3, -6, 448) == 0.3125 && round_float_format(500, 3, -6, 448) == 448 &&
         round_float_format(-0.001, 3, -6, 448) == -0.001953125 &&
         round_float_format(0.3, 2, -14, 57344) == 0.3125 &&
         round_float_format(0.0009765625 * 1.5, 3, -6, 448) == 0.0009765625 * 2; /* subnormal */
    quantize_row(x, 4, 4, Q_INT8, 1); /* scale 0.3/127: 0.05 -> 21.17 -> 21 */
    ok = ok && x[0] == 0.3 && fabs(x[2] - 21 * 0.3 / 127) < 1e-15 && fabs(x[1] + 42 * 0.3 / 127) < 1e-15;
    report(ok, "self-test: f16, bf16, fp8, int8 storage rounding", "%s", ok ? "as computed by hand" : "wrong");
  }
  {
    /* incremental vs prefill formulations, GQA and separate classifier */
    Cfg c2 = {24, 40, 2, 4, 2, 300, 16, 0};
    int t[16];
    Cmp cm;
    model_gen(&m, &c2, 7, 0);
    rng_state = 3;
    for (i = 0; i < 16; i++) t[i] = rng_int(300);
    lg = ref_logits(&m, t, 16, 0);
    lg2 = ref_logits_prefill(&m, t, 16);
    cm = compare(lg, lg2, (size_t)16 * 300);
    report(cm.maxdiff / cm.scale < 1e-12, "self-test: reference incremental = prefill form",
           "max |diff| %.3g, scale %.3g", cm.maxdiff, cm.scale);
    free(lg);
    free(lg2);
    model_free(&m);
  }
  {
    Vocab v;
    int ids[64], n, k;
    char s[256] = "";
    vocab_gen(&v, 320, 5);
    n = ref_encode(&v, "the cat sat \xc3\xa9\xc3\xbc", ids, 64);
    for (k = 1; k < n; k++) ref_decode_piece(&v, ids[k - 1], ids[k], s, sizeof s);
    /* "ü" is not in the vocabulary: two byte tokens, not printable alone */
    report(strcmp(s, "the cat sat \xc3\xa9") == 0 && ids[0] == 1 && ids[1] == vocab_find(&v, " the", 4),
           "self-test: reference encoder/decoder", "%d tokens, decoded \"%s\"", n, s);
    vocab_free(&v);
  }
  return n_fail == 0;
}

/* ------------------------------------------------------------ model checks */
typedef struct {
  const char *name;
  Cfg c;
  int n_ids; /* tokens fed to --logits-tokens */
} Case;

/* The "broken cache" effect for these ids: min over the two variants of
   max |variant - ref| / scale. */
static double broken_effect(const Model *m, const int *ids, int n, const double *ref) {
  double e = 1e30;
  int v;
  for (v = 1; v <= 2; v++) {
    double *lg = ref_logits(m, ids, n, v);
    Cmp c = compare(lg, ref, (size_t)n * (size_t)m->c.vocab);
    if (c.maxdiff / c.scale < e) e = c.maxdiff / c.scale;
    free(lg);
  }
  return e;
}

static void check_case(const Case *cs, uint64_t seed, int full) {
  Model m;
  Vocab v;
  char ck[64], tk[64], ids_name[64], name[200];
  const char *ckp, *tkp, *idp;
  int *ids, i, V = cs->c.vocab, n = cs->n_ids;
  double *ref, effect;
  static const struct {
    const char *dtype;
    int type;
    double tol;
  } q[] = {{"f16", Q_F16, TOL_Q_F16},
           {"bf16", Q_BF16, TOL_Q_BF16},
           {"int8", Q_INT8, TOL_Q_INT8},
           {"fp8_e4m3", Q_E4M3, TOL_Q_E4M3},
           {"fp8_e5m2", Q_E5M2, TOL_Q_E5M2}};
  model_gen(&m, &cs->c, seed, 0);
  vocab_gen(&v, V, seed + 1);
  snprintf(ck, sizeof ck, "%s.bin", cs->name);
  snprintf(tk, sizeof tk, "%s.tok", cs->name);
  snprintf(ids_name, sizeof ids_name, "%s.ids", cs->name);
  ckp = sp(ck);
  tkp = sp(tk);
  idp = sp(ids_name);
  write_ckpt(&m, ckp);
  write_vocab(&v, tkp);
  ids = (int *)xmalloc((size_t)n * sizeof(int));
  rng_state = seed + 2;
  ids[0] = 1;
  for (i = 1; i < n; i++) ids[i] = rng_int(V);
  ids[n - 1] = V - 1; /* the largest id */
  if (n > 3) ids[2] = 0;
  write_ids(idp, ids, n);
  ref = ref_logits(&m, ids, n, 0);
  effect = broken_effect(&m, ids, n, ref);

  snprintf(name, sizeof name, "%s prefill f32", cs->name);
  check_logits(name, ckp, tkp, idp, n, V, "", ref, TOL_F32, 0);
  snprintf(name, sizeof name, "%s token-by-token f32 (--chunk 1)", cs->name);
  check_logits(name, ckp, tkp, idp, n, V, "--chunk 1", ref, TOL_F32, 0);
  snprintf(name, sizeof name, "%s chunks of 5 f32", cs->name);
  check_logits(name, ckp, tkp, idp, n, V, "--chunk 5", ref, TOL_F32, 0);
  if (full) {
    snprintf(name, sizeof name, "%s block size 4, chunks of 3, f32", cs->name);
    check_logits(name, ckp, tkp, idp, n, V, "--block-size 4 --chunk 3", ref, TOL_F32, 0);
    snprintf(name, sizeof name, "%s 2 threads f32", cs->name);
    check_logits(name, ckp, tkp, idp, n, V, "--threads 2", ref, TOL_F32, 0);
    snprintf(name, sizeof name, "%s --kv-dtype f32 explicit, --chunk 7", cs->name);
    check_logits(name, ckp, tkp, idp, n, V, "--kv-dtype f32 --chunk 7", ref, TOL_F32, 0);
    snprintf(name, sizeof name, "%s window eviction with budget >= tokens changes nothing", cs->name);
    {
      char fl[64];
      snprintf(fl, sizeof fl, "--evict window:%d:2 --chunk 1", cs->c.seq_len);
      check_logits(name, ckp, tkp, idp, n, V, fl, ref, TOL_F32, 0);
    }
  }
  if (full) {
    /* window eviction, token by token: budgets below the token count */
    static const int wb[][2] = {{8, 0}, {10, 2}, {5, 4}};
    int k;
    for (k = 0; k < 3; k++) {
      char fl[100];
      double *wref = ref_logits_window(&m, ids, n, wb[k][0], wb[k][1]), *lg;
      double *alt = ref_logits_window(&m, ids, n, wb[k][0] + 1, wb[k][1]);
      snprintf(name, sizeof name, "%s --evict window:%d:%d token by token = reference window", cs->name,
               wb[k][0], wb[k][1]);
      snprintf(fl, sizeof fl, "--evict window:%d:%d --chunk 1", wb[k][0], wb[k][1]);
      lg = prog_logits(name, ckp, tkp, idp, n, V, fl);
      if (lg) {
        Cmp cw = compare(lg, wref, (size_t)n * V), ca = compare(lg, alt, (size_t)n * V),
            cf = compare(lg, ref, (size_t)n * V);
        report(cw.maxdiff <= TOL_F32 * cw.scale, name,
               "max |diff| %.3g x scale (tolerance %.3g); from a window one larger %.3g, from no "
               "eviction %.3g x scale",
               cw.maxdiff / cw.scale, TOL_F32, ca.maxdiff / ca.scale, cf.maxdiff / cf.scale);
        free(lg);
      }
      free(wref);
      free(alt);
    }
    {
      /* chunked: eviction before each chunk's append makes room for the
         whole chunk; a chunk larger than the budget is held whole */
      static const int cw[][3] = {{8, 0, 5}, {8, 0, 3}, {10, 2, 4}, {6, 1, 7}};
      for (k = 0; k < 4; k++) {
        char fl[100];
        double *wref = ref_logits_window_chunked(&m, ids, n, cw[k][0], cw[k][1], cw[k][2]);
        snprintf(name, sizeof name, "%s --evict window:%d:%d in chunks of %d = reference", cs->name, cw[k][0],
                 cw[k][1], cw[k][2]);
        snprintf(fl, sizeof fl, "--evict window:%d:%d --chunk %d", cw[k][0], cw[k][1], cw[k][2]);
        check_logits(name, ckp, tkp, idp, n, V, fl, wref, TOL_F32, 0);
        free(wref);
      }
    }
    {
      /* H2O: a budget covering every token changes nothing; a small one
         acts (differs from no eviction) and is not the plain window */
      char fl[100];
      double *lg, *wref = ref_logits_window(&m, ids, n, 8, 2);
      snprintf(name, sizeof name, "%s --evict h2o:%d:2 (budget >= tokens) changes nothing", cs->name,
               cs->c.seq_len);
      snprintf(fl, sizeof fl, "--evict h2o:%d:2 --chunk 1", cs->c.seq_len);
      check_logits(name, ckp, tkp, idp, n, V, fl, ref, TOL_F32, 0);
      snprintf(name, sizeof name, "%s --evict h2o:8:2:4 token by token acts, unlike the window", cs->name);
      lg = prog_logits(name, ckp, tkp, idp, n, V, "--evict h2o:8:2:4 --chunk 1");
      if (lg) {
        Cmp cf = compare(lg, ref, (size_t)n * V), cw = compare(lg, wref, (size_t)n * V);
        report(cf.maxdiff > 100 * TOL_F32 * cf.scale && cw.maxdiff > 100 * TOL_F32 * cw.scale, name,
               "differs from no eviction by %.3g and from window:8:2 by %.3g x scale (both must be > %.3g)",
               cf.maxdiff / cf.scale, cw.maxdiff / cw.scale, 100 * TOL_F32);
        free(lg);
      }
      /* Eviction runs before each append, until the tokens held plus the
         new one fit the budget; H2O protects the sinks and the RECENT newest
         tokens already held.  With RECENT = BUDGET - SINKS - 1 the one slot
         left is the new token's: no heavy hitter, the window policy. */
      snprintf(name, sizeof name, "%s --evict h2o:8:2:5 (no heavy-hitter slot) = reference window:8:2",
               cs->name);
      check_logits(name, ckp, tkp, idp, n, V, "--evict h2o:8:2:5 --chunk 1", wref, TOL_F32, 0);
      free(wref);
    }
  }
  for (i = 0; i < (int)(sizeof q / sizeof q[0]); i++) {
    char fl[100];
    double *emul;
    if (!full && q[i].type != Q_F16 && q[i].type != Q_INT8) continue;
    emul = ref_logits_type(&m, ids, n, q[i].type, q[i].type);
    snprintf(name, sizeof name, "%s prefill kv %s", cs->name, q[i].dtype);
    snprintf(fl, sizeof fl, "--kv-dtype %s", q[i].dtype);
    check_quant(name, ckp, tkp, idp, n, V, fl, ref, emul, q[i].tol);
    snprintf(name, sizeof name, "%s token-by-token kv %s", cs->name, q[i].dtype);
    snprintf(fl, sizeof fl, "--kv-dtype %s --chunk 1", q[i].dtype);
    check_quant(name, ckp, tkp, idp, n, V, fl, ref, emul, q[i].tol);
    free(emul);
  }
  if (full) {
    double *emul = ref_logits_type(&m, ids, n, Q_F16, Q_INT8);
    snprintf(name, sizeof name, "%s --k-dtype f16 --v-dtype int8, chunks of 4", cs->name);
    check_quant(name, ckp, tkp, idp, n, V, "--k-dtype f16 --v-dtype int8 --chunk 4", ref, emul, TOL_Q_INT8);
    free(emul);
  }
  if (full) {
    /* FP8 tensor scales that are not powers of 2 change the rounding */
    double *e1 = ref_logits_fp8(&m, ids, n, 0.3, 0.7), *e0 = ref_logits_fp8(&m, ids, n, 1, 1);
    Cmp c10 = compare(e1, e0, (size_t)n * V);
    snprintf(name, sizeof name, "%s fp8_e4m3 --fp8-scale 0.3,0.7 (reference differs from scale 1 by %.3g)",
             cs->name, c10.maxdiff / c10.scale);
    check_quant(name, ckp, tkp, idp, n, V, "--kv-dtype fp8_e4m3 --fp8-scale 0.3,0.7 --chunk 3", ref, e1,
                c10.maxdiff / c10.scale / 10 < TOL_Q_E4M3 ? c10.maxdiff / c10.scale / 10 : TOL_Q_E4M3);
    free(e1);
    free(e0);
  }
  {
    double tmax = 0;
    for (i = 0; i < (int)(sizeof q / sizeof q[0]); i++)
      if (q[i].tol > tmax) tmax = q[i].tol;
    snprintf(name, sizeof name, "%s sensitivity: a broken cache exceeds every tolerance 10x", cs->name);
    report(effect > 10 * tmax, name,
           "a key one position off / the newest key missing moves the logits by >= %.3g x scale "
           "(largest tolerance %.3g)",
           effect, tmax);
  }
  free(ref);
  free(ids);
  vocab_free(&v);
  model_free(&m);
}

/* --layer-dtypes f16:1,int8,f16:1 on 3 layers = layer 0 f16, layer 1 int8,
   layer 2 f16: against the reference emulating exactly that, which must be
   far from the all-f16 and all-int8 ones (so the check tells them apart) */
static void check_layer_dtypes(uint64_t seed) {
  Cfg c = {32, 64, 3, 4, 2, 300, 40, 1};
  Model m;
  Vocab v;
  int ids[30], i, n = 30, V = 300;
  int kq[MAX_LAYERS] = {Q_F16, Q_INT8, Q_F16};
  double *mix, *emul, *ef16, *eint8;
  const char *ck = sp("layers.bin"), *tk = sp("layers.tok"), *idp = sp("layers.ids");
  model_gen(&m, &c, seed, 0);
  vocab_gen(&v, V, seed + 1);
  write_ckpt(&m, ck);
  write_vocab(&v, tk);
  rng_state = seed + 2;
  for (i = 0; i < n; i++) ids[i] = rng_int(V);
  write_ids(idp, ids, n);
  emul = ref_logits_kv(&m, ids, n, 0, kq, kq);
  ef16 = ref_logits_type(&m, ids, n, Q_F16, Q_F16);
  eint8 = ref_logits_type(&m, ids, n, Q_INT8, Q_INT8);
  mix = prog_logits("--layer-dtypes f16:1,int8,f16:1", ck, tk, idp, n, V,
                    "--layer-dtypes f16:1,int8,f16:1 --chunk 1");
  if (mix) {
    Cmp ce = compare(mix, emul, (size_t)n * V), ca = compare(emul, ef16, (size_t)n * V),
        cb = compare(emul, eint8, (size_t)n * V);
    /* a tighter tolerance than the other cache checks, to tell the three
       apart: measured ~1e-6 (no rounding flips on this model) */
    const double tol = 1e-3;
    report(ce.maxdiff <= tol * ce.scale && ca.maxdiff > 3 * tol * ca.scale && cb.maxdiff > 3 * tol * cb.scale,
           "--layer-dtypes f16:1,int8,f16:1 (3 layers) = reference with f16, int8, f16 layers",
           "max |diff| %.3g x scale (tolerance %.3g); that reference differs from all-f16 by %.3g "
           "and from all-int8 by %.3g x scale (must be > 3 x tolerance)",
           ce.maxdiff / ce.scale, tol, ca.maxdiff / ca.scale, cb.maxdiff / cb.scale);
  }
  free(mix);
  free(emul);
  free(ef16);
  free(eint8);
  vocab_free(&v);
  model_free(&m);
}

static void expect_error(const char *name, const char *mention, const char *fmt, ...);

/* llama2.c's version 1 (float32) and version 2 (Q8_0 weights) checkpoints */
static void check_versions(uint64_t seed) {
  /* the third: hidden 72, so groups of 16 run across w2's rows (the export
     script only needs every tensor's size to be a multiple of the group) */
  static const Cfg cfgs[3] = {{32, 64, 2, 4, 2, 300, 32, 0}, {48, 80, 2, 6, 3, 320, 40, 1},
                              {32, 72, 1, 4, 4, 300, 32, 0}};
  int ci, i, n = 24;
  for (ci = 0; ci < 3; ci++) {
    const Cfg *c = &cfgs[ci];
    Model m, qm;
    Vocab v;
    int ids[24], gs;
    size_t len;
    unsigned char *img;
    double *ref;
    char name[200], base[64];
    const char *ck = sp("v.bin"), *tk = sp("v.tok"), *idp = sp("v.ids");
    snprintf(base, sizeof base, "%s classifier, %d/%d heads, hidden %d", c->shared ? "tied" : "separate",
             c->n_heads, c->n_kv_heads, c->hidden);
    model_gen(&m, c, seed + 10u * (unsigned)ci, 0);
    vocab_gen(&v, c->vocab, seed + 1);
    write_vocab(&v, tk);
    rng_state = seed + 2;
    ids[0] = 1;
    for (i = 1; i < n; i++) ids[i] = rng_int(c->vocab);
    write_ids(idp, ids, n);
    ref = ref_logits(&m, ids, n, 0);
    img = ckpt_image_v(&m, 1, 0, &len, NULL);
    write_file(ck, img, len);
    snprintf(name, sizeof name, "version 1 checkpoint (%s)", base);
    check_logits(name, ck, tk, idp, n, c->vocab, "", ref, TOL_F32, 0);
    /* bad version 1 files */
    write_file(ck, img, len - 4);
    snprintf(name, sizeof name, "bad version 1 checkpoint: 4 bytes short (%s)", base);
    expect_error(name, ck, "'%s' -z '%s' --logits-tokens '%s'", ck, tk, idp);
    write_file(ck, img, 100);
    snprintf(name, sizeof name, "bad version 1 checkpoint: cut inside the 256-byte header (%s)", base);
    expect_error(name, ck, "'%s' -z '%s' --logits-tokens '%s'", ck, tk, idp);
    put_i32(img + 4, 3);
    write_file(ck, img, len);
    expect_error("checkpoint version 3 (unknown)", ck, "'%s' -z '%s' --logits-tokens '%s'", ck, tk, idp);
    free(img);
    free(ref);
    for (gs = 8; gs <= 16; gs += 8) {
      Cmp cq, cx;
      double *qref, *lg;
      img = ckpt_image_v(&m, 2, gs, &len, &qm);
      write_file(ck, img, len);
      qref = ref_logits(&qm, ids, n, 0);
      ref = ref_logits(&m, ids, n, 0);
      snprintf(name, sizeof name, "version 2 checkpoint, Q8_0 groups of %d (%s)", gs, base);
      lg = prog_logits(name, ck, tk, idp, n, c->vocab, "");
      if (lg) {
        cq = compare(lg, qref, (size_t)n * (size_t)c->vocab);
        cx = compare(lg, ref, (size_t)n * (size_t)c->vocab);
        report(cq.maxdiff <= TOL_Q8_WEIGHTS * cq.scale, name,
               "max |diff| from the reference with the dequantized weights %.3g x scale %.3g (tolerance %.3g); "
               "from the float32 weights' %.3g",
               cq.maxdiff / cq.scale, cq.scale, TOL_Q8_WEIGHTS, cx.maxdiff / cx.scale);
        free(lg);
      }
      if (gs == 8) {
        unsigned char *b2 = (unsigned char *)xmalloc(len);
        static const int bad_gs[] = {0, -8, 7, 1 << 30};
        int k;
        for (k = 0; k < 4; k++) {
          memcpy(b2, img, len);
          put_i32(b2 + 37, bad_gs[k]);
          write_file(ck, b2, len);
          snprintf(name, sizeof name, "bad version 2 checkpoint: group size %d (%s)", bad_gs[k], base);
          expect_error(name, ck, "'%s' -z '%s' --logits-tokens '%s'", ck, tk, idp);
        }
        write_file(ck, img, len - 1);
        snprintf(name, sizeof name, "bad version 2 checkpoint: 1 byte short (%s)", base);
        expect_error(name, ck, "'%s' -z '%s' --logits-tokens '%s'", ck, tk, idp);
        free(b2);
      }
      free(img);
      free(qref);
      free(ref);
      model_free(&qm);
    }
    vocab_free(&v);
    model_free(&m);
  }
}

/* ------------------------------------------------------------ --ppl */
typedef struct {
  double ppl, loss, kv;
  int tokens;
  char config[128];
} PplLine;

/* parses every "ppl P loss L tokens N kv B CONFIG" line; returns count */
static int parse_ppl(const char *out, PplLine *pl, int max, int *loss_decimals) {
  const char *p = out;
  int k = 0;
  while (*p && k < max) {
    const char *e = strchr(p, '\n');
    char line[512];
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len >= sizeof line) len = sizeof line - 1;
    memcpy(line, p, len);
    line[len] = '\0';
    if (strncmp(line, "ppl ", 4) == 0) {
      PplLine x;
      memset(&x, 0, sizeof x);
      if (sscanf(line, "ppl %lf loss %lf tokens %d kv %lf %127s", &x.ppl, &x.loss, &x.tokens, &x.kv,
                 x.config) >= 4) {
        if (k == 0 && loss_decimals) {
          const char *l = strstr(line, " loss ");
          const char *dot;
          int dec = 0;
          l += 6;
          dot = strchr(l, '.');
          if (dot && dot < strchr(l, ' '))
            for (dot++; isdigit((unsigned char)*dot); dot++) dec++;
          *loss_decimals = dec;
        }
        pl[k++] = x;
      }
    }
    p = e ? e + 1 : p + len;
  }
  return k;
}

static void check_ppl(uint64_t seed) {
  Cfg c = {32, 64, 2, 4, 2, 320, 32, 0};
  Model m;
  Vocab v;
  int ids[100], n = 88, i, cnt, dec = 6, k;
  double loss, tol;
  PplLine pl[8];
  char why[8192];
  const char *ck = sp("ppl.bin"), *tk = sp("ppl.tok"), *idp = sp("ppl.ids");
  Run r;
  model_gen(&m, &c, seed, 0);
  vocab_gen(&v, c.vocab, seed + 1);
  write_ckpt(&m, ck);
  write_vocab(&v, tk);
  rng_state = seed + 2;
  ids[0] = 1;
  for (i = 1; i < n; i++) ids[i] = 3 + rng_int(c.vocab - 3);
  write_ids(idp, ids, n);
  /* 88 tokens = windows [0,32) [32,64) [64,88): 87 predictions */
  loss = ref_window_loss(&m, ids, n, &cnt);
  r = run_prog("'%s' -z '%s' --ppl-tokens '%s' --kv-dtype f32,f16,int8", ck, tk, idp);
  if (!run_ok(&r, why, sizeof why)) {
    report(0, "--ppl-tokens (3 windows, f32,f16,int8)", "%s", why);
  } else {
    k = parse_ppl(r.out, pl, 8, &dec);
    tol = 2e-5 * loss + 0.5 * pow(10.0, -dec) + 1e-9;
    if (k != 3) {
      report(0, "--ppl-tokens (3 windows, f32,f16,int8)",
             "expected 3 lines \"ppl P loss L tokens N kv B CONFIG\", got %d; stdout: %s", k,
             first_line(r.out));
    } else {
      report(pl[0].tokens == cnt && fabs(pl[0].loss - loss) <= tol &&
                 fabs(log(pl[0].ppl) - pl[0].loss) <= 1e-3 * pl[0].loss + tol,
             "--ppl-tokens f32 (3 windows of seq_len 32 over 88 tokens)",
             "loss %.6f tokens %d ppl %.4f; reference loss %.6f over %d predicted tokens (tolerance %.2g)",
             pl[0].loss, pl[0].tokens, pl[0].ppl, loss, cnt, tol);
      report(pl[1].tokens == cnt && fabs(pl[1].loss - loss) <= 1e-2 * loss &&
                 pl[2].tokens == cnt && fabs(pl[2].loss - loss) <= 5e-2 * loss,
             "--ppl-tokens f16 and int8 near f32",
             "f16 loss %.6f, int8 loss %.6f, reference %.6f (tolerances 1%% and 5%%)", pl[1].loss,
             pl[2].loss, loss);
      report(pl[1].kv > pl[2].kv && pl[2].kv > 0 && fabs(pl[0].kv / pl[1].kv - 2) < 0.2 &&
                 strcmp(pl[0].config, pl[1].config) != 0,
             "--ppl kv bytes per token and config names: f32 = 2 x f16 > int8 > 0",
             "%.0f %.0f %.0f (%s, %s, %s)", pl[0].kv, pl[1].kv, pl[2].kv, pl[0].config, pl[1].config,
             pl[2].config);
    }
  }
  run_free(&r);
  /* with window eviction (token by token): f32 and int8, two policies; 25%
     of the windows of 32, 32 and 24 tokens = 8, 8, 6 */
  r = run_prog("'%s' -z '%s' --ppl-tokens '%s' --kv-dtype f32,int8 --evict window:8:2 --evict window:25%%", ck,
               tk, idp);
  if (!run_ok(&r, why, sizeof why)) {
    report(0, "--ppl-tokens with window eviction", "%s", why);
  } else if ((k = parse_ppl(r.out, pl, 8, &dec)) != 4) {
    report(0, "--ppl-tokens with window eviction", "expected 4 \"ppl ...\" lines, got %d: %s", k,
           first_line(r.out));
  } else {
    static const struct {
      int budget, sinks, q;
      const char *what;
    } e[4] = {{8, 2, Q_F32, "f32 window:8:2"},
              {-25, 0, Q_F32, "f32 window:25%"},
              {8, 2, Q_INT8, "int8 window:8:2"},
              {-25, 0, Q_INT8, "int8 window:25%"}};
    for (i = 0; i < 4; i++) {
      char nm[200];
      double el = ref_window_loss_cfg(&m, ids, n, &cnt, e[i].budget, e[i].sinks, e[i].q);
      /* int8: the reference rounds as the cache does; a flipped rounding
         moves the loss by far less than 1e-3 */
      tol = (e[i].q == Q_F32 ? 2e-5 : 1e-4) * el + 0.5 * pow(10.0, -dec) + 1e-9;
      snprintf(nm, sizeof nm, "--ppl-tokens %s = reference (token by token, %s)", e[i].what, pl[i].config);
      report(pl[i].tokens == cnt && fabs(pl[i].loss - el) <= tol, nm,
             "loss %.6f tokens %d; reference %.6f tokens %d (tolerance %.2g; without eviction %.6f)",
             pl[i].loss, pl[i].tokens, el, cnt, tol, loss);
    }
  }
  run_free(&r);
  /* --ppl on a text: the program's encoder against the reference's */
  {
    static const char *text = "the cat sat on the dog and the cat ate a hat \xc3\xa9t\xc3\xa9 \xc3\xbc";
    int tid[200], tn = ref_encode(&v, text, tid, 200);
    double tl;
    int tc;
    PplLine p2[2];
    write_text(sp("ppl.txt"), text);
    tl = ref_window_loss(&m, tid, tn, &tc);
    r = run_prog("'%s' -z '%s' --ppl '%s'", ck, tk, sp("ppl.txt"));
    if (!run_ok(&r, why, sizeof why)) {
      report(0, "--ppl text (encoder)", "%s", why);
    } else if (parse_ppl(r.out, p2, 2, &dec) < 1) {
      report(0, "--ppl text (encoder)", "no \"ppl ...\" line; stdout: %s", first_line(r.out));
    } else {
      tol = 2e-5 * tl + 0.5 * pow(10.0, -dec) + 1e-9;
      report(p2[0].tokens == tc && fabs(p2[0].loss - tl) <= tol, "--ppl text = reference encoding + loss",
             "loss %.6f tokens %d; reference (BOS, dummy prefix, merges; %d ids) loss %.6f tokens %d",
             p2[0].loss, p2[0].tokens, tn, tl, tc);
    }
    run_free(&r);
  }
  vocab_free(&v);
  model_free(&m);
}

/* ------------------------------------------------------------ generation */
/* greedy text of the reference as the program prints it; *sure = number of
   generated tokens whose argmax margin was comfortable */
static void ref_generate(const Model *m, const Vocab *v, const char *prompt, int steps, char *out,
                         size_t cap, int *ambiguous_at) {
  int toks[512], np = ref_encode(v, prompt, toks, 512), pos = 0, token = toks[0], next, i;
  double *lg = (double *)xmalloc((size_t)m->c.vocab * sizeof(double));
  Ref r;
  out[0] = '\0';
  *ambiguous_at = -1;
  if (steps <= 0 || steps > m->c.seq_len) steps = m->c.seq_len;
  ref_init(&r, m, 0);
  while (pos < steps) {
    ref_step(&r, token, lg);
    if (pos < np - 1) {
      next = toks[pos + 1];
    } else {
      double b1 = -1e300, b2 = -1e300, scale = 0;
      next = 0;
      for (i = 0; i < m->c.vocab; i++) {
        if (fabs(lg[i]) > scale) scale = fabs(lg[i]);
        if (lg[i] > b1) {
          b2 = b1;
          b1 = lg[i];
          next = i;
        } else if (lg[i] > b2) {
          b2 = lg[i];
        }
      }
      if (b1 - b2 < 1e-4 * scale && *ambiguous_at < 0) *ambiguous_at = (int)strlen(out);
    }
    pos++;
    if (next == 1) break;
    ref_decode_piece(v, token, next, out, cap);
    token = next;
  }
  ref_free(&r);
  free(lg);
}

/* strips trailing whitespace in place */
static void rstrip(char *s) {
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
}

/* Runs -t 0 -i PROMPT -n STEPS (plus flags), compares with the reference's
   greedy text; returns the program's text (malloc'd) or NULL.  Where the
   reference's top two logits nearly tie, a float program may pick either:
   then only the text before is compared, and the returned text is cut there
   and ends with a '\1' (for serve_check: compare that prefix only). */
static char *greedy_single(const Model *m, const Vocab *v, const char *ck, const char *tk,
                           const char *prompt, int steps, const char *flags) {
  char text[4096], why[8192], name[300];
  int amb;
  Run r;
  char *out = NULL;
  ref_generate(m, v, prompt, steps, text, sizeof text, &amb);
  rstrip(text);
  r = run_prog("'%s' -z '%s' -t 0 -n %d %s -i '%s'", ck, tk, steps, flags, prompt);
  snprintf(name, sizeof name, "greedy -i \"%s\" -n %d %s= reference", prompt, steps, flags);
  if (!run_ok(&r, why, sizeof why)) {
    report(0, name, "%s", why);
  } else {
    rstrip(r.out);
    if (amb >= 0) {
      text[amb] = '\0';
      note("reference argmax nearly tied after \"%s\": comparing that prefix only", text);
      report(strncmp(r.out, text, strlen(text)) == 0, name, "program \"%s\", reference prefix \"%s\"", r.out,
             text);
      if (strlen(r.out) > strlen(text)) {
        r.out[strlen(text)] = '\1';
        r.out[strlen(text) + 1] = '\0';
      }
    } else {
      report(strcmp(r.out, text) == 0, name, "program \"%s\", reference \"%s\"", r.out, text);
    }
    out = r.out;
    r.out = NULL;
  }
  run_free(&r);
  return out;
}

/* the number before `word` in s (e.g. "3 preemptions"), or -1 */
static long number_before(const char *s, const char *word) {
  const char *p = strstr(s, word);
  if (!p || p == s) return -1;
  while (p > s && p[-1] == ' ') p--;
  while (p > s && isdigit((unsigned char)p[-1])) p--;
  if (!isdigit((unsigned char)*p)) return -1;
  return strtol(p, NULL, 10);
}

/* --serve of the prompts (one per line) with flags: each "[request i] "
   line must equal the -i run alone.  want_preempt / want_prefix: the run
   must report preemptions ("N preemptions" on stderr) / prompt tokens
   reused from the prefix cache ("(N of M prompt tokens reused)"), else the
   check would not test what it says; want_prefix 2: a restart over a prefix
   tier, which must also report records loaded from it ("N records loaded
   at the start", N > 0) and the shared prefix found there. */
static void serve_check(const char *label, const char *ck, const char *tk, const char **prompts, int np,
                        char **single, int steps, const char *flags, int want_preempt, int want_prefix) {
  char buf[4096] = "", why[8192], name[300];
  const char *reused;
  int i, same = 0;
  long pre, hit = -1, of = -1, loaded;
  Run r;
  for (i = 0; i < np; i++) {
    strcat(buf, prompts[i]);
    strcat(buf, "\n");
  }
  write_text(sp("serve.txt"), buf);
  r = run_prog("'%s' -z '%s' -t 0 -n %d %s --serve '%s'", ck, tk, steps, flags, sp("serve.txt"));
  snprintf(name, sizeof name, "--serve %s (%d prompts, -n %d %s)", label, np, steps, flags);
  if (!run_ok(&r, why, sizeof why)) {
    report(0, name, "%s", why);
    run_free(&r);
    return;
  }
  for (i = 0; i < np; i++) {
    char tag[32], *p, *e, got[4096];
    size_t len;
    snprintf(tag, sizeof tag, "[request %d] ", i);
    p = strstr(r.out, tag);
    if (!p) {
      report(0, name, "no line starting \"%s\" on stdout: %s", tag, first_line(r.out));
      run_free(&r);
      return;
    }
    p += strlen(tag);
    /* the text runs to the next request's line (it may hold newlines) */
    e = strstr(p, "\n[request ");
    len = e ? (size_t)(e - p) : strlen(p);
    if (len >= sizeof got) len = sizeof got - 1;
    memcpy(got, p, len);
    got[len] = '\0';
    rstrip(got);
    if (single[i] && single[i][0] && single[i][strlen(single[i]) - 1] == '\1' &&
        strncmp(got, single[i], strlen(single[i]) - 1) == 0) {
      same++;
    } else if (single[i] && strcmp(got, single[i]) == 0) {
      same++;
    } else {
      report(0, name, "request %d: serve \"%s\", alone \"%s\"", i, got, single[i] ? single[i] : "(failed)");
      run_free(&r);
      return;
    }
  }
  pre = number_before(r.err, " preemptions");
  loaded = number_before(r.err, " records loaded at the start");
  reused = strstr(r.err, " prompt tokens reused");
  if (reused) {
    while (reused > r.err && *reused != '(') reused--;
    if (sscanf(reused, "(%ld of %ld", &hit, &of) != 2) hit = of = -1;
  }
  if (want_preempt && pre <= 0)
    report(0, name, "all %d requests equal their -i runs, but stderr reports %ld preemptions", np, pre);
  else if (want_prefix && hit <= 0)
    report(0, name, "all %d requests equal their -i runs, but stderr reports %ld prompt tokens reused", np,
           hit);
  else if (want_prefix == 2 && (loaded <= 0 || !strstr(r.err, "found in the prefix tier")))
    report(0, name, "all %d requests equal their -i runs, but stderr reports %ld records loaded from the tier%s",
           np, loaded, strstr(r.err, "found in the prefix tier") ? "" : " and no prefix found there");
  else
    report(1, name, "all %d requests equal their -i runs (%ld preemptions, %ld of %ld prompt tokens reused)",
           same, pre, hit, of);
  run_free(&r);
}

static void check_generation(uint64_t seed) {
  Cfg c = {32, 64, 2, 4, 2, 330, 48, 0};
  static const char *prompts[] = {"the cat", "the cat sat", "the dog", "a cat on the", "hat",
                                  "the cat sat on"};
  /* a shared prefix of several 4-token blocks, for the prefix cache */
  static const char *longp[] = {"the cat sat on the dog and the hat and a cat a",
                                "the cat sat on the dog and the hat and a cat on the dog",
                                "the cat sat on the dog and the hat and a cat sat",
                                "the cat sat on the dog and the hat and a dog",
                                "the cat sat on the dog and the hat and a cat a"};
  enum { NP = 6, NL = 5, STEPS = 20, LSTEPS = 44 };
  Model m;
  Vocab v;
  const char *ck = sp("gen.bin"), *tk = sp("gen.tok");
  char *single[NP], *lsingle[NL], why[8192], name[200];
  int i;
  Run r;
  model_gen(&m, &c, seed, 1);
  vocab_gen(&v, c.vocab, seed + 1);
  write_ckpt(&m, ck);
  write_vocab(&v, tk);
  for (i = 0; i < NP; i++) single[i] = greedy_single(&m, &v, ck, tk, prompts[i], STEPS, "");
  for (i = 0; i < NL; i++) lsingle[i] = greedy_single(&m, &v, ck, tk, longp[i], LSTEPS, "--block-size 4");
  /* fewer steps than prompt tokens; characters outside the vocabulary */
  free(greedy_single(&m, &v, ck, tk, "the cat sat on", 3, ""));
  free(greedy_single(&m, &v, ck, tk, "caf\xc3\xa9 \xc3\xbc\xc3\xa9t\xc3\xa9 ~", 24, ""));
  /* -n 0 and -n > seq_len both mean seq_len steps */
  {
    static const char *nflags[] = {"-n 0", "-n 1000"};
    char text[4096];
    int amb, k;
    ref_generate(&m, &v, prompts[0], c.seq_len, text, sizeof text, &amb);
    if (amb >= 0) text[amb] = '\0';
    rstrip(text);
    for (k = 0; k < 2; k++) {
      snprintf(name, sizeof name, "greedy %s = seq_len (%d) steps", nflags[k], c.seq_len);
      r = run_prog("'%s' -z '%s' -t 0 %s -i '%s'", ck, tk, nflags[k], prompts[0]);
      if (!run_ok(&r, why, sizeof why)) {
        report(0, name, "%s", why);
      } else {
        rstrip(r.out);
        report(amb >= 0 ? strncmp(r.out, text, strlen(text)) == 0 : strcmp(r.out, text) == 0, name,
               "program \"%s\", reference%s \"%s\"", r.out, amb >= 0 ? " prefix" : "", text);
        /* more than seq_len is said, not silently cut */
        if (k == 1)
          report(strstr(r.err, "-n 1000") && strstr(r.err, "seq_len"), "-n 1000 > seq_len: a note on stderr",
                 "stderr \"%s\"", first_line(r.err));
      }
      run_free(&r);
    }
  }
  /* sampling: the same seed gives the same text */
  {
    char *first = NULL;
    int k;
    for (k = 0; k < 2; k++) {
      r = run_prog("'%s' -z '%s' -t 1.0 -p 0.9 -s 42 -n %d -i '%s'", ck, tk, STEPS, prompts[1]);
      if (!run_ok(&r, why, sizeof why)) {
        report(0, "sampling -t 1 -s 42 twice", "%s", why);
        run_free(&r);
        break;
      }
      if (k == 0) {
        first = r.out;
        r.out = NULL;
      } else {
        report(strcmp(first, r.out) == 0, "sampling -t 1 -s 42 twice: the same text", "\"%s\" / \"%s\"",
               first_line(first), first_line(r.out));
      }
      run_free(&r);
    }
    free(first);
  }
  /* --serve: the same prompts in one run, in several configurations */
  serve_check("short prompts", ck, tk, prompts, NP, single, STEPS, "", 0, 0);
  serve_check("short prompts, 2 at once, 2 threads", ck, tk, prompts, NP, single, STEPS,
              "--max-batch 2 --threads 2", 0, 0);
  serve_check("shared prefix, block size 4", ck, tk, longp, NL, lsingle, LSTEPS, "--block-size 4", 0, 1);
  /* --prefix-dir: the first run saves its published blocks, a restart loads them and starts warm */
  {
    char flags[1200];
    const char *dir = sp("prefix-tier");
    Run rm = run_prog("rm -rf '%s'", dir); /* an earlier check's records would make the first run warm */
    run_free(&rm);
    snprintf(flags, sizeof flags, "--block-size 4 --prefix-dir '%s'", dir);
    serve_check("shared prefix, --prefix-dir, first run", ck, tk, longp, NL, lsingle, LSTEPS, flags, 0, 1);
    serve_check("shared prefix, --prefix-dir, restarted", ck, tk, longp, NL, lsingle, LSTEPS, flags, 0, 2);
  }
  /* -y: the system text, a space, then each line (as -i of the two joined) */
  {
    enum { NY = 3 };
    char *ysingle[NY], joined[200];
    for (i = 0; i < NY; i++) {
      snprintf(joined, sizeof joined, "the dog and %s", prompts[i]);
      ysingle[i] = greedy_single(&m, &v, ck, tk, joined, STEPS, "");
    }
    serve_check("system text -y", ck, tk, prompts, NY, ysingle, STEPS, "-y 'the dog and'", 0, 0);
    for (i = 0; i < NY; i++) free(ysingle[i]);
  }
  /* 5 requests of up to 44 positions = 11 blocks of 4 each; a pool of 16
     blocks holds one request and part of another: preemption */
  serve_check("shared prefix, 16-block pool (preemption)", ck, tk, longp, NL, lsingle, LSTEPS,
              "--block-size 4 --kv-blocks 16", 1, 0);
  for (i = 0; i < NP; i++) free(single[i]);
  for (i = 0; i < NL; i++) free(lsingle[i]);
  vocab_free(&v);
  model_free(&m);
}

/* ------------------------------------------------------------ bad input */
/* expects exit status 1, a one-line message on stderr (naming `mention` if
   given), no signal, no sanitizer report */
static void expect_error(const char *name, const char *mention, const char *fmt, ...) {
  char args[3000];
  va_list ap;
  Run r;
  int ok, lines = 0;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  r = run_prog("%s", args);
  ok = r.code == 1 && !r.signal && r.err[0] && !has_sanitizer_report(r.err);
  if (ok) {
    const char *q;
    for (q = r.err; *q; q++)
      if (*q == '\n') lines++;
    if (q[-1] != '\n') lines++;
  }
  if (ok && mention && !strstr(r.err, mention)) {
    report(0, name, "stderr does not name \"%s\": %s", mention, first_line(r.err));
  } else if (ok && lines != 1) {
    report(0, name, "stderr has %d lines, a one-line message expected: %s", lines, first_line(r.err));
  } else if (ok) {
    report(1, name, "exit 1: %s", first_line(r.err));
  } else if (r.signal) {
    report(0, name, "killed by signal %d: %s", r.signal, r.cmd);
  } else if (has_sanitizer_report(r.err)) {
    const char *s = strstr(r.err, "ERROR: ");
    if (!s) s = strstr(r.err, "runtime error:");
    report(0, name, "sanitizer report (%s): %s", first_line(s ? s : r.err), r.cmd);
  } else {
    report(0, name, "exit status %d, stderr \"%s\" (want 1 and a message): %s", r.code,
           first_line(r.err), r.cmd);
  }
  run_free(&r);
}

static void put_hdr(unsigned char *b, int d, int h, int l, int nh, int kv, int V, int s) {
  put_i32(b, d);
  put_i32(b + 4, h);
  put_i32(b + 8, l);
  put_i32(b + 12, nh);
  put_i32(b + 16, kv);
  put_i32(b + 20, V);
  put_i32(b + 24, s);
}

static void check_bad_input(uint64_t seed) {
  Cfg c = {24, 48, 2, 4, 2, 300, 32, 0};
  Model m;
  Vocab v;
  unsigned char *img, *timg;
  size_t len, tlen;
  const char *ck = sp("ok.bin"), *tk = sp("ok.tok"), *idp = sp("ok.ids"), *bad = sp("bad.bin"),
             *badt = sp("bad.tok"), *badi = sp("bad.ids");
  char name[200];
  int i;
  static const double cuts[] = {0, 0.1, 0.5, 0.9, 0.999};
  model_gen(&m, &c, seed, 0);
  vocab_gen(&v, c.vocab, seed + 1);
  write_ckpt(&m, ck);
  write_vocab(&v, tk);
  write_text(idp, "1 5 9 299\n");
  img = ckpt_image(&m, &len);
  timg = vocab_image(&v, &tlen);
  {
    /* the good files work (else every error below would prove nothing) */
    char why[8192];
    Run r = run_prog("'%s' -z '%s' --logits-tokens '%s'", ck, tk, idp);
    report(run_ok(&r, why, sizeof why), "bad input: the unmodified files work", "%s",
           run_ok(&r, why, sizeof why) ? "exit 0" : why);
    run_free(&r);
  }
  /* truncated checkpoints */
  write_file(bad, img, 0);
  expect_error("bad checkpoint: empty file", bad, "'%s' -z '%s' --logits-tokens '%s'", bad, tk, idp);
  for (i = 0; i < 4; i++) {
    size_t cut = (size_t)i * 9;
    write_file(bad, img, cut);
    snprintf(name, sizeof name, "bad checkpoint: header cut at %lu bytes", (unsigned long)cut);
    expect_error(name, bad, "'%s' -z '%s' --logits-tokens '%s'", bad, tk, idp);
  }
  for (i = 0; i < (int)(sizeof cuts / sizeof cuts[0]); i++) {
    size_t cut = 28 + (size_t)(cuts[i] * (double)(len - 28));
    if (i == 4) cut = len - 1;
    write_file(bad, img, cut);
    snprintf(name, sizeof name, "bad checkpoint: truncated to %lu of %lu bytes", (unsigned long)cut,
             (unsigned long)len);
    expect_error(name, bad, "'%s' -z '%s' --logits-tokens '%s'", bad, tk, idp);
  }
  {
    /* longer than the header implies */
    unsigned char *big = (unsigned char *)xcalloc(len + 64, 1);
    memcpy(big, img, len);
    write_file(bad, big, len + 4);
    expect_error("bad checkpoint: 4 bytes longer than the header implies", bad,
                 "'%s' -z '%s' --logits-tokens '%s'", bad, tk, idp);
    free(big);
  }
  {
    /* header fields: zero, negative, inconsistent, huge (the file body is
       the good one's, so only the header is wrong) */
    static const struct {
      const char *what;
      int f[7];
    } h[] = {
        {"dim 0", {0, 48, 2, 4, 2, -300, 32}},
        {"hidden_dim 0", {24, 0, 2, 4, 2, -300, 32}},
        {"n_layers 0", {24, 48, 0, 4, 2, -300, 32}},
        {"n_layers -1", {24, 48, -1, 4, 2, -300, 32}},
        {"n_heads 0", {24, 48, 2, 0, 2, -300, 32}},
        {"n_kv_heads 0", {24, 48, 2, 4, 0, -300, 32}},
        {"n_kv_heads -2", {24, 48, 2, 4, -2, -300, 32}},
        {"vocab_size 0", {24, 48, 2, 4, 2, 0, 32}},
        {"seq_len 0", {24, 48, 2, 4, 2, -300, 0}},
        {"seq_len -32", {24, 48, 2, 4, 2, -300, -32}},
        {"dim -24", {-24, 48, 2, 4, 2, -300, 32}},
        {"dim not divisible by n_heads (24/5)", {24, 48, 2, 5, 5, -300, 32}},
        {"n_heads not divisible by n_kv_heads (4/3)", {24, 48, 2, 4, 3, -300, 32}},
        {"n_kv_heads > n_heads (4/8)", {24, 48, 2, 4, 8, -300, 32}},
        {"odd head size (dim 24, 8 heads: 3)", {24, 48, 2, 8, 8, -300, 32}},
        {"dim 1<<30", {1 << 30, 48, 2, 4, 2, -300, 32}},
        {"hidden_dim 1<<30", {24, 1 << 30, 2, 4, 2, -300, 32}},
        {"n_layers 1<<30", {24, 48, 1 << 30, 4, 2, -300, 32}},
        {"vocab_size -(1<<30)", {24, 48, 2, 4, 2, -(1 << 30), 32}},
        {"vocab_size INT_MIN", {24, 48, 2, 4, 2, (-2147483647 - 1), 32}},
        {"seq_len 1<<30", {24, 48, 2, 4, 2, -300, 1 << 30}},
        {"seq_len INT_MAX", {24, 48, 2, 4, 2, -300, 2147483647}},
        {"dim and hidden 65536 (size overflow bait)", {65536, 65536, 2, 4, 2, -300, 32}},
        {"all fields INT_MAX", {2147483647, 2147483647, 2147483647, 2147483647, 2147483647, 2147483647,
                                2147483647}},
        {"tied classifier declared, file has a separate one", {24, 48, 2, 4, 2, 300, 32}},
    };
    unsigned char *b = (unsigned char *)xmalloc(len);
    memcpy(b, img, len);
    for (i = 0; i < (int)(sizeof h / sizeof h[0]); i++) {
      put_hdr(b, h[i].f[0], h[i].f[1], h[i].f[2], h[i].f[3], h[i].f[4], h[i].f[5], h[i].f[6]);
      write_file(bad, b, len);
      snprintf(name, sizeof name, "bad checkpoint header: %s", h[i].what);
      expect_error(name, bad, "'%s' -z '%s' --logits-tokens '%s'", bad, tk, idp);
    }
    free(b);
  }
  expect_error("missing checkpoint file", sp("no-such.bin"), "'%s' -z '%s' --logits-tokens '%s'",
               sp("no-such.bin"), tk, idp);
  expect_error("checkpoint is a directory", NULL, "'%s' -z '%s' --logits-tokens '%s'", SCRATCH, tk,
               idp);

  /* tokenizers (with generation, which needs one) */
  expect_error("missing tokenizer", sp("no-such.tok"), "'%s' -z '%s' -t 0 -n 4 -i 'the cat'", ck,
               sp("no-such.tok"));
  {
    static const double tcuts[] = {0, 2, 4, 10, 0.5, 0.999};
    for (i = 0; i < (int)(sizeof tcuts / sizeof tcuts[0]); i++) {
      size_t cut = tcuts[i] < 1 ? (size_t)(tcuts[i] * (double)tlen) : (size_t)tcuts[i];
      if (i == 5) cut = tlen - 1;
      if (i == 0) cut = 0;
      write_file(badt, timg, cut);
      snprintf(name, sizeof name, "bad tokenizer: truncated to %lu of %lu bytes", (unsigned long)cut,
               (unsigned long)tlen);
      expect_error(name, badt, "'%s' -z '%s' -t 0 -n 4 -i 'the cat'", ck, badt);
    }
  }
  {
    /* fewer tokens than vocab_size: a complete file of 299 tokens */
    Vocab v2;
    vocab_gen(&v2, c.vocab - 1, seed + 1);
    write_vocab(&v2, badt);
    expect_error("bad tokenizer: 299 tokens for vocab_size 300", badt, "'%s' -z '%s' -t 0 -n 4 -i 'the cat'",
                 ck, badt);
    vocab_free(&v2);
  }
  {
    /* token lengths: the first byte token's length field is at 4 + 3 tokens */
    unsigned char *b = (unsigned char *)xmalloc(tlen);
    size_t off = 4 + (8 + 5) + (8 + 3) + (8 + 4) + 4; /* length field of id 3 */
    static const struct {
      const char *what;
      int32_t val;
    } L[] = {{"token length 0", 0},
             {"token length -1", -1},
             {"token length INT_MIN", (-2147483647 - 1)},
             {"token length > max_token_length", 0},
             {"token length 1<<30", 1 << 30}};
    for (i = 0; i < (int)(sizeof L / sizeof L[0]); i++) {
      memcpy(b, timg, tlen);
      put_i32(b + off, i == 3 ? v.maxlen + 1 : L[i].val);
      write_file(badt, b, tlen);
      snprintf(name, sizeof name, "bad tokenizer: %s", L[i].what);
      expect_error(name, badt, "'%s' -z '%s' -t 0 -n 4 -i 'the cat'", ck, badt);
    }
    memcpy(b, timg, tlen);
    put_i32(b, 0);
    write_file(badt, b, tlen);
    expect_error("bad tokenizer: max_token_length 0", badt, "'%s' -z '%s' -t 0 -n 4 -i 'the cat'", ck,
                 badt);
    put_i32(b, -5);
    write_file(badt, b, tlen);
    expect_error("bad tokenizer: max_token_length -5", badt, "'%s' -z '%s' -t 0 -n 4 -i 'the cat'", ck,
                 badt);
    free(b);
  }

  /* flags */
  expect_error("unknown flag --bogus", "--bogus", "'%s' -z '%s' --bogus 1", ck, tk);
  expect_error("-t abc", "-t", "'%s' -z '%s' -t abc -i 'the cat'", ck, tk);
  expect_error("-t without a value", "-t", "'%s' -z '%s' -t", ck, tk);
  expect_error("-n abc", "-n", "'%s' -z '%s' -n abc -i 'the cat'", ck, tk);
  expect_error("-n -5", "-n", "'%s' -z '%s' -n -5 -i 'the cat'", ck, tk);
  expect_error("-p 0.9x", "-p", "'%s' -z '%s' -p 0.9x -i 'the cat'", ck, tk);
  expect_error("-m foo", "-m", "'%s' -z '%s' -m foo -i 'the cat'", ck, tk);
  expect_error("--kv-dtype int3", "int3", "'%s' -z '%s' --kv-dtype int3 --logits-tokens '%s'", ck, tk,
               idp);
  expect_error("--kv-dtype f16,int3 (list)", "int3",
               "'%s' -z '%s' --kv-dtype f16,int3 --ppl-tokens '%s'", ck, tk, idp);
  expect_error("--k-dtype nope", "nope", "'%s' -z '%s' --k-dtype nope --logits-tokens '%s'", ck, tk, idp);
  expect_error("--block-size 0", "--block-size", "'%s' -z '%s' --block-size 0 --logits-tokens '%s'", ck,
               tk, idp);
  expect_error("--block-size -4", "--block-size", "'%s' -z '%s' --block-size -4 --logits-tokens '%s'",
               ck, tk, idp);
  expect_error("--threads x", "--threads", "'%s' -z '%s' --threads x --logits-tokens '%s'", ck, tk, idp);
  expect_error("--chunk 0", "--chunk", "'%s' -z '%s' --chunk 0 --logits-tokens '%s'", ck, tk, idp);
  expect_error("--evict sideways:4", "sideways", "'%s' -z '%s' --evict sideways:4 --logits-tokens '%s'",
               ck, tk, idp);
  expect_error("--evict window:abc", "--evict", "'%s' -z '%s' --evict window:abc --logits-tokens '%s'", ck,
               tk, idp);
  expect_error("--layer-dtypes f16:x", "--layer-dtypes",
               "'%s' -z '%s' --layer-dtypes f16:x --logits-tokens '%s'", ck, tk, idp);
  expect_error("--layer-dtypes int3", "int3", "'%s' -z '%s' --layer-dtypes int3 --logits-tokens '%s'",
               ck, tk, idp);
  expect_error("--int-scores 2", "--int-scores", "'%s' -z '%s' --int-scores 2 --logits-tokens '%s'", ck, tk, idp);
  expect_error("--rotate sideways", "--rotate", "'%s' -z '%s' --rotate sideways --logits-tokens '%s'", ck, tk, idp);
  expect_error("no checkpoint argument", NULL, "");

  /* token ids and input files */
  write_text(badi, "1 5 300\n");
  expect_error("token id = vocab_size in --logits-tokens", badi, "'%s' -z '%s' --logits-tokens '%s'", ck,
               tk, badi);
  write_text(badi, "1 -1 5\n");
  expect_error("token id -1 in --logits-tokens", badi, "'%s' -z '%s' --logits-tokens '%s'", ck, tk, badi);
  write_text(badi, "1 5 seven\n");
  expect_error("non-numeric token id in --logits-tokens", badi, "'%s' -z '%s' --logits-tokens '%s'", ck,
               tk, badi);
  write_text(badi, "1 5 99999999999999999999\n");
  expect_error("token id overflowing int in --logits-tokens", badi, "'%s' -z '%s' --logits-tokens '%s'",
               ck, tk, badi);
  write_text(badi, "1 5 300 7\n");
  expect_error("token id = vocab_size in --ppl-tokens", badi, "'%s' -z '%s' --ppl-tokens '%s'", ck, tk,
               badi);
  expect_error("missing --logits-tokens file", sp("no-such.ids"), "'%s' -z '%s' --logits-tokens '%s'", ck,
               tk, sp("no-such.ids"));
  expect_error("missing --ppl file", sp("no-such.txt"), "'%s' -z '%s' --ppl '%s'", ck, tk,
               sp("no-such.txt"));
  expect_error("missing --serve file", sp("no-such.txt"), "'%s' -z '%s' --serve '%s'", ck, tk,
               sp("no-such.txt"));
  {
    /* more ids than seq_len (32): not specified as an error, but no crash */
    char why[8192], buf[1200] = "";
    Run r;
    for (i = 0; i < 40; i++) {
      char t[8];
      snprintf(t, sizeof t, "%d ", 3 + i);
      strcat(buf, t);
    }
    write_text(badi, buf);
    r = run_prog("'%s' -z '%s' --logits-tokens '%s'", ck, tk, badi);
    report((r.code == 0 || r.code == 1) && !r.signal && !has_sanitizer_report(r.err) &&
               (r.code == 0 || r.err[0]),
           "40 ids for seq_len 32: exit 0 or a clean error",
           r.code == 0 ? "exit 0" : (r.code == 1 ? first_line(r.err) : (run_ok(&r, why, sizeof why), why)));
    run_free(&r);
  }
  free(img);
  free(timg);
  vocab_free(&v);
  model_free(&m);
}

/* ------------------------------------------------------------ trained model */
/* ref_logits.txt: '#' comment lines; the first other line holds the token
   ids, then one line of vocab logits per position.  Returns NULL or a
   message; *ids, *ref malloc'd. */
static const char *parse_ref_logits(const char *path, int **ids_out, int *n_out, double **ref_out, int *V_out) {
  static char msg[200];
  char *text = read_file(path, NULL), *p;
  int *ids = NULL, n = 0, cap = 0, rows = -1, V = 0;
  double *ref = NULL;
  size_t nref = 0, capref = 0;
  if (!text) return "cannot read it";
  msg[0] = '\0';
  for (p = text; *p && !msg[0];) {
    char *e = strchr(p, '\n'), *q;
    if (e) *e = '\0';
    if (p[0] != '#' && p[strspn(p, " \t\r")] != '\0') {
      if (rows < 0) {
        for (q = p;;) {
          char *end;
          long x = strtol(q, &end, 10);
          if (end == q) break;
          if (n == cap) {
            cap = cap ? 2 * cap : 256;
            ids = (int *)realloc(ids, (size_t)cap * sizeof(int));
            if (!ids) exit(2);
          }
          ids[n++] = (int)x;
          q = end;
        }
        rows = 0;
      } else {
        int cols = 0;
        for (q = p;;) {
          char *end;
          double x = strtod(q, &end);
          if (end == q) break;
          if (nref == capref) {
            capref = capref ? 2 * capref : 65536;
            ref = (double *)realloc(ref, capref * sizeof(double));
            if (!ref) exit(2);
          }
          ref[nref++] = x;
          cols++;
          q = end;
        }
        if (rows == 0) V = cols;
        if (cols != V) snprintf(msg, sizeof msg, "row %d has %d numbers, row 0 has %d", rows, cols, V);
        rows++;
      }
    }
    if (!e) break;
    p = e + 1;
  }
  free(text);
  if (!msg[0] && (n == 0 || rows != n)) snprintf(msg, sizeof msg, "%d ids but %d rows of logits", n, rows);
  if (msg[0]) {
    free(ids);
    free(ref);
    return msg;
  }
  *ids_out = ids;
  *n_out = n;
  *ref_out = ref;
  *V_out = V;
  return NULL;
}

/* The trained model in dir: the program against this file's own reference
   computed from model.bin (prefill, token by token, quantized caches), the
   trainer's ref_logits.txt against both, and the held-out perplexity of the
   text against that of the trainer's token ids. */
static void check_trained(const char *dir, const char *tokenizer) {
  char mp[1024], tp[1024], rp[1024], hp[1024], hip[1024], why[8192], name[300];
  const char *msg;
  int *ids = NULL, n = 0, V = 0, i, has_ref;
  double *file_ref = NULL, *own;
  Model m;
  Run r;
  snprintf(mp, sizeof mp, "%s/model.bin", dir);
  if (tokenizer) snprintf(tp, sizeof tp, "%s", tokenizer);
  else snprintf(tp, sizeof tp, "%s/tokenizer.bin", dir);
  snprintf(rp, sizeof rp, "%s/ref_logits.txt", dir);
  snprintf(hp, sizeof hp, "%s/heldout.txt", dir);
  snprintf(hip, sizeof hip, "%s/heldout.ids", dir);
  if (!file_exists(mp) || !file_exists(tp)) {
    note("trained model: skipped (%s or %s does not exist)", mp, tp);
    return;
  }
  msg = model_load(&m, mp);
  if (msg) {
    report(0, "trained model: model.bin is a legacy checkpoint", "%s: %s", mp, msg);
    return;
  }
  has_ref = file_exists(rp);
  if (has_ref) {
    msg = parse_ref_logits(rp, &ids, &n, &file_ref, &V);
    if (!msg && V != m.c.vocab) msg = "its rows do not have vocab_size logits";
    for (i = 0; !msg && i < n; i++)
      if (ids[i] < 0 || ids[i] >= m.c.vocab || n > m.c.seq_len) msg = "a token id is outside the vocabulary, or more ids than seq_len";
    if (msg) {
      report(0, "trained model: ref_logits.txt", "%s: %s", rp, msg);
      has_ref = 0;
      free(ids);
      free(file_ref);
      ids = NULL;
      file_ref = NULL;
    }
  } else {
    note("trained model: %s does not exist: the trainer's logits are not compared", rp);
  }
  if (!ids) { /* ids of our own: BOS and a spread of the vocabulary */
    n = m.c.seq_len < 40 ? m.c.seq_len : 40;
    ids = (int *)xmalloc((size_t)n * sizeof(int));
    ids[0] = 1;
    for (i = 1; i < n; i++) ids[i] = (int)((3 + 7919L * i) % m.c.vocab);
  }
  V = m.c.vocab;
  write_ids(sp("trained.ids"), ids, n);
  own = ref_logits(&m, ids, n, 0);
  snprintf(name, sizeof name, "trained model (dim %d, %d layers, %d/%d heads, vocab %d)", m.c.dim, m.c.n_layers,
           m.c.n_heads, m.c.n_kv_heads, m.c.vocab);
  note("%s: %d positions", name, n);
  if (has_ref) {
    Cmp c = compare(file_ref, own, (size_t)n * (size_t)V);
    report(c.maxdiff <= TOL_TRAINED, "trained model: ref_logits.txt = this file's reference from model.bin",
           "max |diff| %.3g (tolerance %.3g; a larger one means ref_logits.txt is stale or model.bin changed)",
           c.maxdiff, TOL_TRAINED);
  }
  {
    double *lg = prog_logits("trained model logits", mp, tp, sp("trained.ids"), n, V, "");
    if (lg) {
      Cmp c = compare(lg, own, (size_t)n * (size_t)V);
      report(c.maxdiff <= TOL_TRAINED, "trained model logits = reference",
             "%d positions x %d logits, max |diff| %.3g (tolerance %.3g absolute; logits scale %.3g)", n, V,
             c.maxdiff, TOL_TRAINED, c.scale);
      if (has_ref) {
        c = compare(lg, file_ref, (size_t)n * (size_t)V);
        report(c.maxdiff <= TOL_TRAINED, "trained model logits = ref_logits.txt",
               "max |diff| %.3g (tolerance %.3g absolute)", c.maxdiff, TOL_TRAINED);
      }
      free(lg);
    }
    lg = quick ? NULL : prog_logits("trained model logits token by token", mp, tp, sp("trained.ids"), n, V, "--chunk 1");
    if (lg) {
      Cmp c = compare(lg, own, (size_t)n * (size_t)V);
      report(c.maxdiff <= TOL_TRAINED, "trained model logits token by token = reference",
             "max |diff| %.3g (tolerance %.3g)", c.maxdiff, TOL_TRAINED);
      free(lg);
    }
  }
  {
    /* quantized caches on real activations */
    static const struct {
      const char *dtype;
      int type;
      double tol;
    } q[] = {{"f16", Q_F16, TOL_Q_F16}, {"int8", Q_INT8, TOL_Q_INT8}, {"fp8_e4m3", Q_E4M3, TOL_Q_E4M3}};
    for (i = quick ? 1 : 0; i < (quick ? 2 : 3); i++) {
      char fl[64];
      double *emul = ref_logits_type(&m, ids, n, q[i].type, q[i].type);
      snprintf(name, sizeof name, "trained model kv %s", q[i].dtype);
      snprintf(fl, sizeof fl, "--kv-dtype %s", q[i].dtype);
      check_quant(name, mp, tp, sp("trained.ids"), n, V, fl, own, emul, q[i].tol);
      free(emul);
    }
  }
  free(own);
  free(ids);
  free(file_ref);
  if (!quick) {
    /* greedy generation against the reference (encoder, argmax, decoder),
       and --serve of the same prompts (shared prefixes over 4-token blocks;
       a pool small enough to preempt) against the -i runs */
    static const char *tprompts[] = {"And it came to pass, when the king heard the words",
                               "And it came to pass, when the king heard the words of the book",
                               "In the beginning God created the heaven and the earth",
                               "And the LORD said unto Moses",
                               "And the LORD said unto Moses, Speak unto the children of Israel"};
    enum { NT = 5 };
    char *single[NT];
    int steps = 96, k;
    Vocab tv;
    msg = vocab_load(&tv, tp, m.c.vocab);
    if (msg) {
      report(0, "trained model: tokenizer.bin", "%s: %s", tp, msg);
    } else {
      for (k = 0; k < NT; k++) single[k] = greedy_single(&m, &tv, mp, tp, tprompts[k], steps, "--block-size 4");
      serve_check("trained model, block size 4", mp, tp, tprompts, NT, single, steps, "--block-size 4", 0, 0);
      /* one at a time: a request reuses the prompt blocks of earlier ones */
      serve_check("trained model, block size 4, one at a time", mp, tp, tprompts, NT, single, steps,
                  "--block-size 4 --max-batch 1", 0, 1);
      serve_check("trained model, block size 4, a 40-block pool (preemption)", mp, tp, tprompts, NT, single, steps,
                  "--block-size 4 --kv-blocks 40", 1, 0);
      for (k = 0; k < NT; k++) free(single[k]);
    }
    vocab_free(&tv);
  }
  if (!quick && file_exists(hip)) {
    /* the first seq_len + 88 held-out ids: a full window and a partial one,
       against the reference's loss */
    char *text = read_file(hip, NULL), *q, *end;
    int want = m.c.seq_len + 88, k = 0, cnt = 0, dec = 6;
    int *hid = (int *)xmalloc((size_t)want * sizeof(int));
    PplLine pl[2];
    for (q = text; q && k < want; q = end) {
      long x = strtol(q, &end, 10);
      if (end == q) break;
      hid[k++] = (int)x;
    }
    free(text);
    if (k == want) {
      double loss = ref_window_loss(&m, hid, k, &cnt), tol;
      write_ids(sp("heldout-part.ids"), hid, k);
      r = run_prog("'%s' -z '%s' --ppl-tokens '%s'", mp, tp, sp("heldout-part.ids"));
      snprintf(name, sizeof name, "trained model --ppl-tokens of %d held-out ids = reference", k);
      if (!run_ok(&r, why, sizeof why)) {
        report(0, name, "%s", why);
      } else if (parse_ppl(r.out, pl, 2, &dec) < 1) {
        report(0, name, "no \"ppl ...\" line: %s", first_line(r.out));
      } else {
        tol = 2e-5 * loss + 0.5 * pow(10.0, -dec);
        report(pl[0].tokens == cnt && fabs(pl[0].loss - loss) <= tol, name,
               "loss %.6f tokens %d; reference %.6f tokens %d (tolerance %.2g)", pl[0].loss, pl[0].tokens, loss,
               cnt, tol);
      }
      run_free(&r);
    }
    free(hid);
  }
  model_free(&m);
  if (!file_exists(hp) || !file_exists(hip)) {
    note("trained model held-out text: skipped (%s or %s does not exist)", hp, hip);
    return;
  }
  if (quick) {
    note("trained model: generation, --serve and held-out --ppl skipped in --quick mode");
    return;
  }
  {
    PplLine a[2], b[2];
    int ka = 0, kb = 0;
    r = run_prog("'%s' -z '%s' --ppl '%s'", mp, tp, hp);
    if (!run_ok(&r, why, sizeof why))
      report(0, "trained model --ppl heldout.txt", "%s", why);
    else
      ka = parse_ppl(r.out, a, 2, NULL);
    run_free(&r);
    r = run_prog("'%s' -z '%s' --ppl-tokens '%s'", mp, tp, hip);
    if (!run_ok(&r, why, sizeof why))
      report(0, "trained model --ppl-tokens heldout.ids", "%s", why);
    else
      kb = parse_ppl(r.out, b, 2, NULL);
    run_free(&r);
    if (ka >= 1 && kb >= 1)
      report(a[0].tokens == b[0].tokens && fabs(a[0].loss - b[0].loss) <= 1e-6,
             "trained model: --ppl heldout.txt = --ppl-tokens heldout.ids (the encoder matches the trainer's)",
             "text: loss %.6f over %d tokens; ids: loss %.6f over %d tokens", a[0].loss, a[0].tokens,
             b[0].loss, b[0].tokens);
    else
      report(0, "trained model held-out --ppl", "no \"ppl ...\" line from one of the two runs");
  }
  (void)i;
}

/* ------------------------------------------------------------ main */
/* --needle on the trained model, against the generation path: the first
   case of passkey.tsv (depth TAB answer TAB prompt) generated greedily (-t 0,
   through --serve so the prompt needs no quoting) gives the model's own
   answer digits; a needle file with those digits must count 1 right, one
   with the last digit changed or the last digit dropped (the model then
   says a longer number) 0 right; bad needle files exit 1 with a one-line
   message naming the file and line. */
/* needle: the cases of `cases` (default dir/passkey.tsv) through kvattn_run --needle; with
   min_right > 0, the first ten cases must be answered right at least that many times (a model
   trained to retrieve) */
static void check_needle(const char *dir, const char *tokenizer, const char *cases, int min_right) {
  char mp[1024], tp[1024], pp[1024], got[64], buf[16384];
  char *pk, *tab1, *tab2, *nl, *gen, *prompt;
  size_t nd = 0;
  Run r;
  snprintf(mp, sizeof mp, "%s/model.bin", dir);
  if (tokenizer) snprintf(tp, sizeof tp, "%s", tokenizer);
  else snprintf(tp, sizeof tp, "%s/tokenizer.bin", dir);
  if (cases) snprintf(pp, sizeof pp, "%s", cases);
  else snprintf(pp, sizeof pp, "%s/passkey.tsv", dir);
  if (!file_exists(mp) || !file_exists(tp) || !(pk = read_file(pp, NULL))) {
    note("needle: skipped (%s, %s or %s does not exist)", mp, tp, pp);
    return;
  }
  tab1 = strchr(pk, '\t');
  tab2 = tab1 ? strchr(tab1 + 1, '\t') : NULL;
  nl = tab2 ? strchr(tab2 + 1, '\n') : NULL;
  if (!nl || (size_t)(nl - tab2) >= sizeof buf - 2) {
    report(0, "needle: passkey.tsv's first line", "%s: not depth TAB answer TAB prompt", pp);
    free(pk);
    return;
  }
  if (min_right > 0) { /* the first ten cases, as they are */
    char *end = pk;
    int lines = 0, right = -1;
    while (lines < 10 && (end = strchr(end, '\n')) != NULL) end++, lines++;
    if (end) {
      char keep = *end;
      *end = '\0';
      write_text(sp("needle_first.tsv"), pk);
      *end = keep;
    } else {
      write_text(sp("needle_first.tsv"), pk);
    }
    r = run_prog("'%s' -z '%s' --needle '%s'", mp, tp, sp("needle_first.tsv"));
    if (r.code == 0 && (gen = strstr(r.out, "right ")) != NULL) right = atoi(gen + 6);
    report(right >= min_right, "needle: the trained model answers the first ten cases of its needle file",
           "%d right, want at least %d (%s): %s", right, min_right, r.cmd, first_line(r.out));
    run_free(&r);
  }
  *nl = '\0';
  prompt = tab2 + 1;
  snprintf(buf, sizeof buf, "%s\n", prompt);
  write_text(sp("needle_prompt.txt"), buf);
  r = run_prog("'%s' -z '%s' -t 0 -n 0 --serve '%s'", mp, tp, sp("needle_prompt.txt"));
  gen = strstr(r.out, prompt);
  if (r.code != 0 || !gen) {
    report(0, "needle: the prompt generated greedily", "exit %d, the prompt not echoed: %s", r.code, r.cmd);
    run_free(&r);
    free(pk);
    return;
  }
  for (gen += strlen(prompt); *gen == ' '; gen++) {}
  while (nd + 1 < sizeof got && gen[nd] >= '0' && gen[nd] <= '9') got[nd] = gen[nd], nd++;
  got[nd] = '\0';
  run_free(&r);
  if (nd < 2) {
    note("needle: the model does not answer the first passkey prompt with digits (\"%.20s\"): the "
         "right-answer checks are skipped", gen);
  } else {
    static const struct {
      const char *what;
      int change, right;
    } variants[] = {{"its own greedy answer counts right", 0, 1},
                    {"the answer with its last digit changed counts wrong", 1, 0},
                    {"the answer without its last digit counts wrong (a longer number came out)", 2, 0}};
    int v;
    for (v = 0; v < 3; v++) {
      char ans[64], want[64], name[200];
      snprintf(ans, sizeof ans, "%s", got);
      if (variants[v].change == 1) ans[nd - 1] = (char)('0' + (ans[nd - 1] - '0' + 1) % 10);
      if (variants[v].change == 2) ans[nd - 1] = '\0';
      snprintf(buf, sizeof buf, "0.5\t%s\t%s\n", ans, prompt);
      write_text(sp("needle.tsv"), buf);
      r = run_prog("'%s' -z '%s' --needle '%s'", mp, tp, sp("needle.tsv"));
      snprintf(want, sizeof want, "right %d cases 1 ", variants[v].right);
      snprintf(name, sizeof name, "needle: %s", variants[v].what);
      report(r.code == 0 && strstr(r.out, want) != NULL, name, "answer %s, want \"%s\" in: %s (%s)", ans, want,
             first_line(r.out), r.cmd);
      run_free(&r);
    }
  }
  {
    static const struct {
      const char *what, *text, *mention;
    } bad[] = {{"two columns", "0.5\t12345\n", ":1:"},
               {"an empty file", "", "no cases"},
               {"an answer that is not digits", "0.5\t12a45\tThe pass key is 12a45.\n", "not all digits"},
               {"a depth that is not a number", "deep\t12345\tThe pass key is 12345.\n", "not a number"},
               {"a depth outside 0..1", "1.5\t12345\tThe pass key is 12345.\n", "0..1"},
               {"an empty prompt", "0.5\t12345\t\n", "empty"},
               {"a bad line after a good one", "0.5\t12345\tThe pass key is 12345.\n0.5\n", ":2:"}};
    int b;
    for (b = 0; b < (int)(sizeof bad / sizeof bad[0]); b++) {
      char name[200];
      write_text(sp("needle_bad.tsv"), bad[b].text);
      snprintf(name, sizeof name, "needle: %s is refused", bad[b].what);
      expect_error(name, bad[b].mention, "'%s' -z '%s' --needle '%s'", mp, tp, sp("needle_bad.tsv"));
    }
    expect_error("needle: a missing file is refused", "needle_missing.tsv", "'%s' -z '%s' --needle '%s'", mp, tp,
                 sp("needle_missing.tsv"));
  }
  free(pk);
}

int main(int argc, char **argv) {
  const char *model_dir = "bench/model", *tokenizer = NULL, *needle_cases = NULL;
  int ai = 1, self_only = 0, trained_only = 0;
  while (ai < argc && argv[ai][0] == '-' && argv[ai][1] == '-') {
    if (strcmp(argv[ai], "--quick") == 0)
      quick = 1;
    else if (strcmp(argv[ai], "--self-test") == 0)
      self_only = 1;
    else if (strcmp(argv[ai], "--trained-only") == 0)
      trained_only = 1;
    else {
      fprintf(stderr, "model_check: unknown option %s\n", argv[ai]);
      return 2;
    }
    ai++;
  }
  if (!self_only && argc - ai < 2) {
    fprintf(stderr,
            "usage: model_check [--quick] [--self-test] [--trained-only] KVATTN_RUN SCRATCH_DIR\n"
            "                   [MODEL_DIR [TOKENIZER [NEEDLE_CASES]]]\n"
            "  writes random checkpoints into SCRATCH_DIR and checks KVATTN_RUN against a\n"
            "  double-precision reference; MODEL_DIR (default bench/model) may hold a trained\n"
            "  model.bin, tokenizer.bin, ref_logits.txt (and heldout.txt, heldout.ids)\n"
            "  TOKENIZER: its tokenizer when not MODEL_DIR/tokenizer.bin\n"
            "  NEEDLE_CASES: a needle file the model was trained to answer (not MODEL_DIR/passkey.tsv):\n"
            "  8 of its first 10 cases must come out right (the committed retrieval model: 10)\n"
            "  --trained-only: only the trained model's checks\n"
            "  --self-test: only the reference's own checks (no program needed)\n");
    return 2;
  }
  if (!self_test()) {
    printf("model_check: the reference failed its self-test\n");
  }
  if (self_only) {
    printf("model_check: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
  }
  RUN_BIN = argv[ai];
  SCRATCH = argv[ai + 1];
  if (argc - ai > 2) model_dir = argv[ai + 2];
  if (argc - ai > 3) tokenizer = argv[ai + 3];
  if (argc - ai > 4) needle_cases = argv[ai + 4];
  if (strchr(RUN_BIN, '\'') || strchr(SCRATCH, '\'')) {
    fprintf(stderr, "model_check: paths with a ' are not supported\n");
    return 2;
  }
  mkdir(SCRATCH, 0777);
  if (!file_exists(RUN_BIN)) {
    fprintf(stderr, "model_check: %s does not exist (build it first)\n", RUN_BIN);
    return 2;
  }
  if (!trained_only) {
    static const Case cases[] = {
        {"gqa-4-2-tied-hs8", {32, 64, 2, 4, 2, 320, 48, 1}, 40},
        {"mha-4-4-sep-hs12", {48, 96, 3, 4, 4, 350, 64, 0}, 64},
        {"mqa-4-1-sep-hs6", {24, 40, 2, 4, 1, 300, 32, 0}, 29},
        {"gqa-8-2-tied-hs2", {16, 32, 1, 8, 2, 280, 32, 1}, 17},
        {"gqa-6-3-sep-hs16-l3", {96, 80, 3, 6, 3, 400, 40, 0}, 37},
    };
    int k;
    for (k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++)
      check_case(&cases[k], 1000u + 17u * (unsigned)k, !quick || k < 2);
  }
  if (!trained_only) {
    check_layer_dtypes(2000);
    check_versions(2500);
    check_ppl(3000);
    check_generation(4000);
    check_bad_input(5000);
  }
  check_trained(model_dir, tokenizer);
  check_needle(model_dir, tokenizer, needle_cases, needle_cases ? 8 : 0);
  sp_free_all();
  printf("model_check: %d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
