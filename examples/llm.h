/* llm.h - a Llama-architecture decoder whose RoPE, KV cache and attention
   are kvattn's.  Header-only, C99, the C standard library (+ optional
   OpenMP for the matrix products).  Used by examples/kvattn_run.c (the
   llama2.c-compatible command line) and by the bench's quality runs.

   Reads llama2.c checkpoints:
     legacy   7 little-endian int32 (dim, hidden_dim, n_layers, n_heads,
              n_kv_heads, vocab_size, seq_len; vocab_size < 0 = a separate
              classifier at the end), then float32 tensors: token embedding,
              rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3 (each for all
              layers), rms_final, two unused RoPE tables of seq_len *
              head_size / 2 floats, the classifier if separate.
     "ak42"   magic, int32 version, the 7 int32, a byte "classifier shared",
              (version 2: int32 group size), zero padding to 256 bytes.
              Version 1: float32 rms_att, rms_ffn, rms_final, embedding, wq,
              wk, wv, wo, w1, w2, w3, classifier if not shared.  Version 2:
              the norms in float32, then every matrix (same order) as int8
              values followed by one float32 scale per group (Q8_0:
              value = int8 * scale); dequantized to float32 at load.
   Tokenizer (tokenizer.bin): int32 max_token_length, then per token a
   float32 merge score, an int32 length and the bytes.

   The model, per token x (a row of the embedding), for each layer:
     h = rmsnorm(x) * rms_att;  q = Wq h, k = Wk h, v = Wv h
     RoPE on q and k: adjacent pairs (2i, 2i+1) of each head, angle
       pos * 10000^(-2i/head_size)  (kvattn: kva_rope_apply, interleaved)
     k, v -> the kvattn cache (kva_store);  o = attention (kva_attend_cache,
       or kva_attend_batch for many sequences);  x += Wo o
     h = rmsnorm(x) * rms_ffn;  x += W2 (silu(W1 h) * W3 h)
   then logits = Wcls (rmsnorm(x) * rms_final).  RMSNorm eps is 1e-5.

   Numerics: every matrix product of a row is computed by the same kernel
   whatever the number of rows (a prefill and a token-by-token decode give
   bit-identical projections); float32 with 8 or 16 partial sums.  Only the
   attention (kvattn) differs between prefill and decode, by rounding. */
#ifndef LLM_H
#define LLM_H

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvattn.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define LLM_BOS 1
#define LLM_EOS 2
#define LLM_MAX_FIELD (1 << 20) /* no header field of a sane checkpoint is larger */

/* ======================================================================
   small helpers
   ====================================================================== */

static inline void llm__err(char *err, size_t n, const char *fmt, ...) {
  va_list ap;
  if (!err || n == 0) return;
  va_start(ap, fmt);
  vsnprintf(err, n, fmt, ap);
  va_end(ap);
}

/* Wall-clock seconds when OpenMP is there (its clock), else processor time
   (the same thing for a one-thread program). */
static inline double llm_now(void) {
#ifdef _OPENMP
  return omp_get_wtime();
#else
  return (double)clock() / (double)CLOCKS_PER_SEC;
#endif
}

/* Size of an open file; -1 if it cannot be told (a pipe, a directory). */
static inline long long llm__file_size(FILE *f) {
  long end;
  if (fseek(f, 0, SEEK_END) != 0) return -1;
  end = ftell(f);
  if (end < 0 || fseek(f, 0, SEEK_SET) != 0) return -1;
  return (long long)end;
}

static inline int32_t llm__i32(const unsigned char *p) { /* little-endian, whatever the host */
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

/* ======================================================================
   [1] model: configuration, weights, loading
   ====================================================================== */

typedef struct {
  int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
  int head_dim, kv_dim;  /* dim / n_heads, dim * n_kv_heads / n_heads */
  int shared_classifier; /* the classifier is the token embedding */
  int version;           /* 0 legacy, 1 ak42 float32, 2 ak42 Q8_0 */
  int group_size;        /* version 2 */
} llm_config;

typedef struct {
  float *tok_emb;            /* [vocab][dim] */
  float *rms_att, *rms_ffn;  /* [L][dim] */
  float *wq, *wo;            /* [L][dim][dim] (rows = outputs) */
  float *wk, *wv;            /* [L][kv_dim][dim] */
  float *w1, *w3;            /* [L][hidden][dim] */
  float *w2;                 /* [L][dim][hidden] */
  float *rms_final;          /* [dim] */
  float *wcls;               /* [vocab][dim]: tok_emb when shared */
} llm_weights;

typedef struct {
  llm_config c;
  llm_weights w;
  float *data; /* the one allocation all weights live in */
} llm_model;

/* Check the seven shape fields; fill the derived ones. */
static inline int llm__check_shape(llm_config *c, const char *path, char *err, size_t errn) {
  const char *bad = NULL;
  if (c->dim <= 0) bad = "dim";
  else if (c->hidden_dim <= 0) bad = "hidden_dim";
  else if (c->n_layers <= 0) bad = "n_layers";
  else if (c->n_heads <= 0) bad = "n_heads";
  else if (c->n_kv_heads <= 0) bad = "n_kv_heads";
  else if (c->vocab_size <= 0) bad = "vocab_size";
  else if (c->seq_len <= 0) bad = "seq_len";
  if (bad) {
    llm__err(err, errn, "%s: header field %s is not positive", path, bad);
    return 0;
  }
  if (c->dim > LLM_MAX_FIELD || c->hidden_dim > LLM_MAX_FIELD || c->n_layers > LLM_MAX_FIELD ||
      c->n_heads > LLM_MAX_FIELD || c->n_kv_heads > LLM_MAX_FIELD || c->vocab_size > LLM_MAX_FIELD ||
      c->seq_len > LLM_MAX_FIELD) {
    llm__err(err, errn, "%s: a header field exceeds %d (dim %d hidden %d layers %d heads %d kv_heads %d vocab %d seq %d)",
             path, LLM_MAX_FIELD, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
             c->seq_len);
    return 0;
  }
  if (c->dim % c->n_heads != 0) {
    llm__err(err, errn, "%s: dim %d is not a multiple of n_heads %d", path, c->dim, c->n_heads);
    return 0;
  }
  if (c->n_heads % c->n_kv_heads != 0) {
    llm__err(err, errn, "%s: n_heads %d is not a multiple of n_kv_heads %d", path, c->n_heads, c->n_kv_heads);
    return 0;
  }
  c->head_dim = c->dim / c->n_heads;
  if (c->head_dim % 2 != 0) {
    llm__err(err, errn, "%s: head size %d is odd (RoPE rotates pairs)", path, c->head_dim);
    return 0;
  }
  c->kv_dim = c->dim / c->n_heads * c->n_kv_heads;
  return 1;
}

/* Floats of the matrices, in the order they are laid out in `data`
   (embedding, norms, wq, wk, wv, wo, w1, w2, w3, classifier). */
static inline uint64_t llm__matrix_floats(const llm_config *c, int with_cls) {
  uint64_t D = (uint64_t)c->dim, H = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers;
  uint64_t V = (uint64_t)c->vocab_size, KV = (uint64_t)c->kv_dim;
  return V * D + L * (D * D * 2 + KV * D * 2 + H * D * 3) + (with_cls ? V * D : 0);
}
static inline uint64_t llm__norm_floats(const llm_config *c) { return (uint64_t)c->n_layers * c->dim * 2 + c->dim; }

/* Point the weights into data: embedding, rms_att, rms_ffn, rms_final, wq,
   wk, wv, wo, w1, w2, w3, classifier. */
static inline void llm__map(llm_model *m) {
  llm_config *c = &m->c;
  size_t D = (size_t)c->dim, H = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
  size_t V = (size_t)c->vocab_size, KV = (size_t)c->kv_dim;
  float *p = m->data;
  m->w.tok_emb = p, p += V * D;
  m->w.rms_att = p, p += L * D;
  m->w.rms_ffn = p, p += L * D;
  m->w.rms_final = p, p += D;
  m->w.wq = p, p += L * D * D;
  m->w.wk = p, p += L * KV * D;
  m->w.wv = p, p += L * KV * D;
  m->w.wo = p, p += L * D * D;
  m->w.w1 = p, p += L * H * D;
  m->w.w2 = p, p += L * D * H;
  m->w.w3 = p, p += L * H * D;
  m->w.wcls = c->shared_classifier ? m->w.tok_emb : p;
}

static inline int llm__read(FILE *f, void *dst, size_t bytes) { return bytes == 0 || fread(dst, 1, bytes, f) == bytes; }

/* Read n float32 (little-endian file, little-endian host assumed, as
   llama2.c does) to dst. */
static inline int llm__read_f32(FILE *f, float *dst, uint64_t n) { return llm__read(f, dst, (size_t)n * sizeof(float)); }

/* Version 2: n int8 values and n / gs float32 scales -> n floats. */
static inline int llm__read_q8(FILE *f, float *dst, uint64_t n, int gs, signed char *qbuf, float *sbuf) {
  uint64_t i;
  if (!llm__read(f, qbuf, (size_t)n) || !llm__read_f32(f, sbuf, n / (uint64_t)gs)) return 0;
  for (i = 0; i < n; i++) dst[i] = (float)qbuf[i] * sbuf[i / (uint64_t)gs];
  return 1;
}

static inline void llm_model_free(llm_model *m) {
  if (!m) return;
  free(m->data);
  memset(m, 0, sizeof *m);
}

/* Load a checkpoint.  Every size is checked against the file before
   anything is allocated; returns 0 with a message in err on failure. */
static inline int llm_model_load(llm_model *m, const char *path, char *err, size_t errn) {
  unsigned char hdr[256];
  llm_config *c = &m->c;
  FILE *f;
  long long fsize;
  uint64_t expect, total, L;
  int ok = 0;
  memset(m, 0, sizeof *m);
  f = fopen(path, "rb");
  if (!f) {
    llm__err(err, errn, "%s: cannot open checkpoint", path);
    return 0;
  }
  fsize = llm__file_size(f);
  if (fsize < 0) {
    llm__err(err, errn, "%s: cannot tell the checkpoint's size (not a regular file?)", path);
    goto done;
  }
  if (fsize < 28) {
    llm__err(err, errn, "%s: %lld bytes, shorter than the 28-byte header", path, fsize);
    goto done;
  }
  if (!llm__read(f, hdr, 28)) {
    llm__err(err, errn, "%s: cannot read the header", path);
    goto done;
  }
  if ((uint32_t)llm__i32(hdr) == 0x616b3432u) { /* "ak42": versioned format, 256-byte header */
    if (fsize < 256 || !llm__read(f, hdr + 28, 256 - 28)) {
      llm__err(err, errn, "%s: versioned checkpoint shorter than its 256-byte header", path);
      goto done;
    }
    c->version = llm__i32(hdr + 4);
    if (c->version != 1 && c->version != 2) {
      llm__err(err, errn, "%s: checkpoint version %d (this program reads 1 and 2)", path, c->version);
      goto done;
    }
    c->dim = llm__i32(hdr + 8), c->hidden_dim = llm__i32(hdr + 12), c->n_layers = llm__i32(hdr + 16);
    c->n_heads = llm__i32(hdr + 20), c->n_kv_heads = llm__i32(hdr + 24), c->vocab_size = llm__i32(hdr + 28);
    c->seq_len = llm__i32(hdr + 32);
    c->shared_classifier = hdr[36] != 0;
    if (hdr[36] > 1) {
      llm__err(err, errn, "%s: shared-classifier flag is %d (0 or 1)", path, hdr[36]);
      goto done;
    }
    if (!llm__check_shape(c, path, err, errn)) goto done;
    if (c->version == 2) {
      c->group_size = llm__i32(hdr + 37);
      /* groups run over each flattened matrix; every matrix has a multiple of dim values */
      if (c->group_size <= 0 || c->group_size > LLM_MAX_FIELD || c->dim % c->group_size != 0) {
        llm__err(err, errn, "%s: group size %d must be positive and divide dim %d", path, c->group_size, c->dim);
        goto done;
      }
    }
  } else { /* legacy */
    c->dim = llm__i32(hdr), c->hidden_dim = llm__i32(hdr + 4), c->n_layers = llm__i32(hdr + 8);
    c->n_heads = llm__i32(hdr + 12), c->n_kv_heads = llm__i32(hdr + 16), c->vocab_size = llm__i32(hdr + 20);
    c->seq_len = llm__i32(hdr + 24);
    c->shared_classifier = c->vocab_size > 0;
    if (c->vocab_size < 0 && c->vocab_size != INT32_MIN) c->vocab_size = -c->vocab_size;
    if (!llm__check_shape(c, path, err, errn)) goto done;
  }
  L = (uint64_t)c->n_layers;
  total = llm__matrix_floats(c, !c->shared_classifier) + llm__norm_floats(c);
  if (total > (uint64_t)fsize) { /* (also keeps the byte counts below from overflowing) */
    llm__err(err, errn,
             "%s: %lld bytes, but the header (dim %d hidden %d layers %d heads %d kv_heads %d vocab %d seq %d) implies "
             "%llu weights, more than a file of that many bytes can hold",
             path, fsize, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len,
             (unsigned long long)total);
    goto done;
  }
  if (c->version == 0)
    expect = 28 + 4 * (total + (uint64_t)c->seq_len * (uint64_t)c->head_dim); /* + two RoPE tables */
  else if (c->version == 1)
    expect = 256 + 4 * total;
  else /* int8 values + a float scale per group for the matrices, float norms */
    expect = 256 + 4 * llm__norm_floats(c) + llm__matrix_floats(c, !c->shared_classifier) +
             4 * (llm__matrix_floats(c, !c->shared_classifier) / (uint64_t)c->group_size);
  if ((uint64_t)fsize != expect) {
    llm__err(err, errn,
             "%s: %lld bytes, but the header (dim %d hidden %d layers %d heads %d kv_heads %d vocab %d%s seq %d) "
             "implies %llu bytes",
             path, fsize, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
             c->shared_classifier ? "" : " separate classifier", c->seq_len, (unsigned long long)expect);
    goto done;
  }
  if (total > (uint64_t)(SIZE_MAX / sizeof(float)) || !(m->data = (float *)malloc((size_t)total * sizeof(float)))) {
    llm__err(err, errn, "%s: out of memory for %llu weights", path, (unsigned long long)total);
    goto done;
  }
  llm__map(m);
  {
    llm_weights *w = &m->w;
    uint64_t D = (uint64_t)c->dim, H = (uint64_t)c->hidden_dim, V = (uint64_t)c->vocab_size;
    uint64_t KV = (uint64_t)c->kv_dim;
    int r = 1;
    if (c->version == 0) { /* file order: emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, RoPE, cls */
      r = llm__read_f32(f, w->tok_emb, V * D) && llm__read_f32(f, w->rms_att, L * D) &&
          llm__read_f32(f, w->wq, L * D * D) && llm__read_f32(f, w->wk, L * KV * D) &&
          llm__read_f32(f, w->wv, L * KV * D) && llm__read_f32(f, w->wo, L * D * D) &&
          llm__read_f32(f, w->rms_ffn, L * D) && llm__read_f32(f, w->w1, L * H * D) &&
          llm__read_f32(f, w->w2, L * D * H) && llm__read_f32(f, w->w3, L * H * D) &&
          llm__read_f32(f, w->rms_final, D) &&
          fseek(f, (long)(4 * (uint64_t)c->seq_len * (uint64_t)c->head_dim), SEEK_CUR) == 0 &&
          (c->shared_classifier || llm__read_f32(f, w->wcls, V * D));
    } else if (c->version == 1) { /* rms_att, rms_ffn, rms_final, embedding, wq, wk, wv, wo, w1, w2, w3, cls */
      r = llm__read_f32(f, w->rms_att, L * D) && llm__read_f32(f, w->rms_ffn, L * D) &&
          llm__read_f32(f, w->rms_final, D) && llm__read_f32(f, w->tok_emb, V * D) &&
          llm__read_f32(f, w->wq, L * D * D) && llm__read_f32(f, w->wk, L * KV * D) &&
          llm__read_f32(f, w->wv, L * KV * D) && llm__read_f32(f, w->wo, L * D * D) &&
          llm__read_f32(f, w->w1, L * H * D) && llm__read_f32(f, w->w2, L * D * H) &&
          llm__read_f32(f, w->w3, L * H * D) && (c->shared_classifier || llm__read_f32(f, w->wcls, V * D));
    } else {
      uint64_t big = V * D > H * D ? V * D : H * D;
      signed char *q = (signed char *)malloc((size_t)big);
      float *s = (float *)malloc((size_t)(big / (uint64_t)c->group_size) * sizeof(float));
      uint64_t l;
      int gs = c->group_size;
      r = q && s && llm__read_f32(f, w->rms_att, L * D) && llm__read_f32(f, w->rms_ffn, L * D) &&
          llm__read_f32(f, w->rms_final, D) && llm__read_q8(f, w->tok_emb, V * D, gs, q, s);
      for (l = 0; r && l < L; l++) r = llm__read_q8(f, w->wq + l * D * D, D * D, gs, q, s);
      for (l = 0; r && l < L; l++) r = llm__read_q8(f, w->wk + l * KV * D, KV * D, gs, q, s);
      for (l = 0; r && l < L; l++) r = llm__read_q8(f, w->wv + l * KV * D, KV * D, gs, q, s);
      for (l = 0; r && l < L; l++) r = llm__read_q8(f, w->wo + l * D * D, D * D, gs, q, s);
      for (l = 0; r && l < L; l++) r = llm__read_q8(f, w->w1 + l * H * D, H * D, gs, q, s);
      for (l = 0; r && l < L; l++) r = llm__read_q8(f, w->w2 + l * D * H, D * H, gs, q, s);
      for (l = 0; r && l < L; l++) r = llm__read_q8(f, w->w3 + l * H * D, H * D, gs, q, s);
      if (r && !c->shared_classifier) r = llm__read_q8(f, w->wcls, V * D, gs, q, s);
      if (!q || !s) {
        free(q), free(s);
        llm__err(err, errn, "%s: out of memory", path);
        goto done;
      }
      free(q), free(s);
    }
    if (!r) {
      llm__err(err, errn, "%s: read error in the weights", path);
      goto done;
    }
  }
  ok = 1;
done:
  fclose(f);
  if (!ok) llm_model_free(m);
  return ok;
}

/* ======================================================================
   [2] tokenizer: byte-fallback BPE as llama2.c encodes and decodes
   ====================================================================== */

typedef struct {
  const char *str;
  int id;
} llm__tok_index;

typedef struct {
  char **vocab;          /* [vocab_size] NUL-terminated pieces */
  float *scores;         /* merge priority: higher merges first */
  int vocab_size, max_token_length;
  llm__tok_index *sorted; /* pieces by strcmp, for lookups */
  char byte_pieces[512];  /* "<0xXX>" decodes to byte_pieces + 2 * XX */
} llm_tokenizer;

static inline void llm_tokenizer_free(llm_tokenizer *t) {
  int i;
  if (!t) return;
  if (t->vocab)
    for (i = 0; i < t->vocab_size; i++) free(t->vocab[i]);
  free(t->vocab);
  free(t->scores);
  free(t->sorted);
  memset(t, 0, sizeof *t);
}

static inline int llm__tok_cmp(const void *a, const void *b) {
  return strcmp(((const llm__tok_index *)a)->str, ((const llm__tok_index *)b)->str);
}

/* Read vocab_size tokens (the model's vocabulary) from path. */
static inline int llm_tokenizer_load(llm_tokenizer *t, const char *path, int vocab_size, char *err, size_t errn) {
  unsigned char b4[8];
  FILE *f;
  int i, ok = 0;
  memset(t, 0, sizeof *t);
  f = fopen(path, "rb");
  if (!f) {
    llm__err(err, errn, "%s: cannot open tokenizer (-z FILE chooses another)", path);
    return 0;
  }
  if (!llm__read(f, b4, 4)) {
    llm__err(err, errn, "%s: truncated tokenizer (no max_token_length)", path);
    goto done;
  }
  t->max_token_length = llm__i32(b4);
  if (t->max_token_length <= 0 || t->max_token_length > LLM_MAX_FIELD) {
    llm__err(err, errn, "%s: max_token_length %d is not in 1..%d", path, t->max_token_length, LLM_MAX_FIELD);
    goto done;
  }
  t->vocab = (char **)calloc((size_t)vocab_size, sizeof(char *));
  t->scores = (float *)malloc((size_t)vocab_size * sizeof(float));
  t->sorted = (llm__tok_index *)malloc((size_t)vocab_size * sizeof(llm__tok_index));
  if (!t->vocab || !t->scores || !t->sorted) {
    llm__err(err, errn, "%s: out of memory", path);
    goto done;
  }
  t->vocab_size = vocab_size;
  for (i = 0; i < vocab_size; i++) {
    int len;
    if (!llm__read(f, b4, 8)) {
      llm__err(err, errn, "%s: truncated tokenizer: %d of the model's %d tokens", path, i, vocab_size);
      goto done;
    }
    memcpy(&t->scores[i], b4, 4);
    len = llm__i32(b4 + 4);
    if (len <= 0 || len > t->max_token_length) {
      llm__err(err, errn, "%s: token %d has length %d (max_token_length %d)", path, i, len, t->max_token_length);
      goto done;
    }
    if (!(t->vocab[i] = (char *)malloc((size_t)len + 1))) {
      llm__err(err, errn, "%s: out of memory", path);
      goto done;
    }
    if (!llm__read(f, t->vocab[i], (size_t)len)) {
      llm__err(err, errn, "%s: truncated tokenizer inside token %d", path, i);
      goto done;
    }
    t->vocab[i][len] = '\0';
  }
  for (i = 0; i < 256; i++) t->byte_pieces[2 * i] = (char)i, t->byte_pieces[2 * i + 1] = '\0';
  for (i = 0; i < vocab_size; i++) t->sorted[i].str = t->vocab[i], t->sorted[i].id = i;
  qsort(t->sorted, (size_t)vocab_size, sizeof *t->sorted, llm__tok_cmp);
  ok = 1;
done:
  fclose(f);
  if (!ok) llm_tokenizer_free(t);
  return ok;
}

static inline int llm_token_lookup(const llm_tokenizer *t, const char *s) {
  llm__tok_index key, *r;
  key.str = s;
  key.id = 0;
  r = (llm__tok_index *)bsearch(&key, t->sorted, (size_t)t->vocab_size, sizeof *t->sorted, llm__tok_cmp);
  return r ? r->id : -1;
}

/* Merge candidates: the pair (node, its right neighbour) merges into id. */
typedef struct {
  float score;
  int left, right, id;
  unsigned ver_l, ver_r;
} llm__merge;

/* Heap order: highest score first, then leftmost (the llama2.c merge loop
   takes the best-scoring adjacent pair, the first one on ties). */
static inline int llm__merge_before(const llm__merge *a, const llm__merge *b) {
  return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static inline void llm__heap_push(llm__merge *h, int *n, llm__merge e) {
  int i = (*n)++;
  while (i > 0 && llm__merge_before(&e, &h[(i - 1) / 2])) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
  h[i] = e;
}

static inline llm__merge llm__heap_pop(llm__merge *h, int *n) {
  llm__merge top = h[0], last = h[--*n];
  int i = 0;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && llm__merge_before(&h[c + 1], &h[c])) c++;
    if (!llm__merge_before(&h[c], &last)) break;
    h[i] = h[c], i = c;
  }
  if (*n > 0) h[i] = last;
  return top;
}

/* Encode text: optional BOS, a dummy-prefix " " when the text is not empty,
   one token per UTF-8 character (unknown characters as their byte tokens,
   id = byte + 3), then repeatedly merge the adjacent pair whose
   concatenation is a token with the highest score (leftmost on ties).  The
   llama2.c loop rescans all pairs per merge (quadratic); a heap with
   version-checked entries makes the same choices in O(n log n), which a
   whole held-out text needs.  tokens must hold strlen(text) + 3.
   Returns 0 on success, -1 out of memory. */
static inline int llm_encode(const llm_tokenizer *t, const char *text, int bos, int eos, int32_t *tokens, int *n_tokens) {
  size_t len = strlen(text), cap = len + 3, i;
  int n = 0, n_heap = 0, str_len = 0, k;
  char *buf = (char *)malloc((size_t)t->max_token_length * 2 + 3);
  int *next = (int *)malloc(cap * sizeof(int)), *prev = (int *)malloc(cap * sizeof(int));
  unsigned *ver = (unsigned *)malloc(cap * sizeof(unsigned));
  llm__merge *heap = (llm__merge *)malloc(cap * 2 * sizeof(llm__merge));
  const char *c;
  if (!buf || !next || !prev || !ver || !heap) {
    free(buf), free(next), free(prev), free(ver), free(heap);
    return -1;
  }
  if (bos) tokens[n++] = LLM_BOS;
  if (text[0] != '\0') {
    int sp = llm_token_lookup(t, " ");
    tokens[n++] = sp >= 0 ? sp : ' ' + 3; /* no " " token: its byte token */
  }
  /* characters: a UTF-8 lead byte starts a new one; at most 4 bytes each */
  for (c = text; *c; c++) {
    int id;
    if (((unsigned char)*c & 0xC0) != 0x80) str_len = 0;
    buf[str_len++] = *c;
    buf[str_len] = '\0';
    if (((unsigned char)c[1] & 0xC0) == 0x80 && str_len < 4) continue;
    id = llm_token_lookup(t, buf);
    if (id >= 0) tokens[n++] = id;
    else
      for (k = 0; k < str_len; k++) tokens[n++] = (unsigned char)buf[k] + 3;
    str_len = 0;
  }
  /* merges, over a linked list of the tokens (BOS included, as in the
     llama2.c loop: it scans every adjacent pair) */
  for (i = 0; i < (size_t)n; i++) next[i] = i + 1 < (size_t)n ? (int)i + 1 : -1, prev[i] = (int)i - 1, ver[i] = 0;
  for (i = 0; i + 1 < (size_t)n; i++) {
    llm__merge e;
    int id;
    if (tokens[i] < 0 || tokens[i] >= t->vocab_size || tokens[i + 1] < 0 || tokens[i + 1] >= t->vocab_size) continue;
    sprintf(buf, "%s%s", t->vocab[tokens[i]], t->vocab[tokens[i + 1]]);
    id = llm_token_lookup(t, buf);
    if (id < 0 || !(t->scores[id] > -1e10f)) continue;
    e.score = t->scores[id], e.left = (int)i, e.right = (int)i + 1, e.id = id, e.ver_l = 0, e.ver_r = 0;
    llm__heap_push(heap, &n_heap, e);
  }
  while (n_heap > 0) {
    llm__merge e = llm__heap_pop(heap, &n_heap);
    int l = e.left, r = e.right, side;
    if (next[l] != r || ver[l] != e.ver_l || ver[r] != e.ver_r || ver[l] == ~0u) continue; /* stale */
    tokens[l] = e.id;
    ver[l]++;
    ver[r] = ~0u; /* r is gone */
    next[l] = next[r];
    if (next[r] >= 0) prev[next[r]] = l;
    for (side = 0; side < 2; side++) { /* the new pairs (prev, l) and (l, next) */
      int a = side ? l : prev[l], b = side ? next[l] : l, id;
      if (a < 0 || b < 0) continue;
      if (tokens[a] < 0 || tokens[a] >= t->vocab_size || tokens[b] < 0 || tokens[b] >= t->vocab_size) continue;
      sprintf(buf, "%s%s", t->vocab[tokens[a]], t->vocab[tokens[b]]);
      id = llm_token_lookup(t, buf);
      if (id < 0 || !(t->scores[id] > -1e10f)) continue;
      e.score = t->scores[id], e.left = a, e.right = b, e.id = id, e.ver_l = ver[a], e.ver_r = ver[b];
      if (n_heap < (int)(cap * 2)) llm__heap_push(heap, &n_heap, e);
    }
  }
  { /* compact the list (node 0, the head, is never removed) */
    int at = n > 0 ? 0 : -1;
    k = 0;
    while (at >= 0) tokens[k++] = tokens[at], at = next[at];
  }
  n = k;
  if (eos) tokens[n++] = LLM_EOS;
  *n_tokens = n;
  free(buf), free(next), free(prev), free(ver), free(heap);
  return 0;
}

/* The text of token `token` following `prev`: a leading space is dropped
   after BOS; "<0xXX>" is that byte. */
static inline const char *llm_decode(const llm_tokenizer *t, int prev, int token) {
  const char *p;
  int v = 0, nd = 0;
  if (token < 0 || token >= t->vocab_size) return "";
  p = t->vocab[token];
  if (prev == LLM_BOS && p[0] == ' ') p++;
  if (p[0] == '<' && p[1] == '0' && p[2] == 'x') {
    const char *h = p + 3;
    while (nd < 2 && isxdigit((unsigned char)h[nd])) {
      int d = h[nd];
      v = v * 16 + (d <= '9' ? d - '0' : (d | 0x20) - 'a' + 10);
      nd++;
    }
    if (nd > 0) return t->byte_pieces + 2 * v;
  }
  return p;
}

/* Printed at all?  Empty pieces and single bytes that are neither
   printable nor white space (raw control bytes, lone UTF-8 bytes) are not. */
static inline int llm_piece_visible(const char *p) {
  if (!p || p[0] == '\0') return 0;
  if (p[1] == '\0') {
    unsigned char b = (unsigned char)p[0];
    if (!(isprint(b) || isspace(b))) return 0;
  }
  return 1;
}

/* ======================================================================
   [3] sampling: llama2.c's RNG and algorithms, so one seed gives one text
   ====================================================================== */

typedef struct {
  float prob;
  int index;
} llm__prob_index;

typedef struct {
  int vocab_size;
  float temperature, topp;
  uint64_t rng;
  llm__prob_index *work; /* [vocab_size] for top-p */
} llm_sampler;

static inline int llm_sampler_init(llm_sampler *s, int vocab_size, float temperature, float topp, uint64_t seed) {
  s->vocab_size = vocab_size;
  s->temperature = temperature;
  s->topp = topp;
  s->rng = seed;
  s->work = (llm__prob_index *)malloc((size_t)vocab_size * sizeof *s->work);
  return s->work != NULL;
}

static inline void llm_sampler_free(llm_sampler *s) {
  free(s->work);
  s->work = NULL;
}

/* xorshift64 (shifts 12, 25, 27) with a multiplicative output (the
   "xorshift*" of Vigna); the top 32 bits. */
static inline uint32_t llm_random_u32(uint64_t *state) {
  *state ^= *state >> 12;
  *state ^= *state << 25;
  *state ^= *state >> 27;
  return (uint32_t)((*state * 0x2545F4914F6CDD1DULL) >> 32);
}

static inline float llm_random_f32(uint64_t *state) { return (float)(llm_random_u32(state) >> 8) / 16777216.0f; }

/* The first index of the largest value. */
static inline int llm_argmax(const float *x, int n) {
  int i, best = 0;
  for (i = 1; i < n; i++)
    if (x[i] > x[best]) best = i;
  return best;
}

static inline void llm_softmax(float *x, int n) {
  float mx = x[0], sum = 0.0f;
  int i;
  for (i = 1; i < n; i++)
    if (x[i] > mx) mx = x[i];
  for (i = 0; i < n; i++) x[i] = expf(x[i] - mx), sum += x[i];
  for (i = 0; i < n; i++) x[i] /= sum;
}

static inline int llm__prob_desc(const void *a, const void *b) {
  float pa = ((const llm__prob_index *)a)->prob, pb = ((const llm__prob_index *)b)->prob;
  return pa > pb ? -1 : pa < pb ? 1 : 0;
}

/* Nucleus sampling: the smallest set of most likely tokens whose
   probability exceeds topp, sampled in proportion.  Tokens below
   (1 - topp) / (n - 1) cannot be in that set and are dropped before the sort. */
static inline int llm__sample_topp(llm_sampler *s, const float *p, float coin) {
  int n = s->vocab_size, n0 = 0, i, last;
  float cutoff = (1.0f - s->topp) / (float)(n - 1), cum = 0.0f, r, cdf = 0.0f;
  for (i = 0; i < n; i++)
    if (p[i] >= cutoff) s->work[n0].index = i, s->work[n0].prob = p[i], n0++;
  qsort(s->work, (size_t)n0, sizeof *s->work, llm__prob_desc);
  last = n0 - 1;
  for (i = 0; i < n0; i++) {
    cum += s->work[i].prob;
    if (cum > s->topp) {
      last = i;
      break;
    }
  }
  r = coin * cum;
  for (i = 0; i <= last; i++) {
    cdf += s->work[i].prob;
    if (r < cdf) return s->work[i].index;
  }
  return s->work[last].index;
}

/* The next token from logits (which it overwrites): argmax at temperature
   0, else softmax(logits / T), then top-p (0 < topp < 1) or plain sampling.
   One random number per call at T > 0. */
static inline int llm_sample(llm_sampler *s, float *logits) {
  int i, n = s->vocab_size;
  float coin, cdf = 0.0f;
  if (s->temperature == 0.0f) return llm_argmax(logits, n);
  for (i = 0; i < n; i++) logits[i] /= s->temperature;
  llm_softmax(logits, n);
  coin = llm_random_f32(&s->rng);
  if (s->topp > 0.0f && s->topp < 1.0f) return llm__sample_topp(s, logits, coin);
  for (i = 0; i < n; i++) {
    cdf += logits[i];
    if (coin < cdf) return i;
  }
  return n - 1;
}

/* ======================================================================
   [4] matrix products: y[t][r] = W[r] . x[t] for a chunk of rows x
   Weights are read once per chunk; every output is summed the same way
   whatever the chunk size (lanes of LLM__LW partial sums in index order,
   one reduction, then the tail), so prefill and decode agree bit for bit.
   ====================================================================== */

#if KVATTN_SIMD == KVA_SIMD_AVX512
#define LLM__LW 16
#define LLM__TT 4 /* tokens per tile: 4 rows x 4 tokens = 16 accumulators */
typedef __m512 llm__vec;
#define LLM__VZERO() _mm512_setzero_ps()
#define LLM__VLOAD(p) _mm512_loadu_ps(p)
#define LLM__VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
static inline float llm__vsum(llm__vec v) { return _mm512_reduce_add_ps(v); }
#elif KVATTN_SIMD == KVA_SIMD_AVX2
#define LLM__LW 8
#define LLM__TT 2 /* 8 accumulators + loads fit the 16 registers */
typedef __m256 llm__vec;
#define LLM__VZERO() _mm256_setzero_ps()
#define LLM__VLOAD(p) _mm256_loadu_ps(p)
#define LLM__VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
static inline float llm__vsum(llm__vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#elif KVATTN_SIMD == KVA_SIMD_NEON
#define LLM__LW 4
#define LLM__TT 2
typedef float32x4_t llm__vec;
#define LLM__VZERO() vdupq_n_f32(0.0f)
#define LLM__VLOAD(p) vld1q_f32(p)
#define LLM__VFMA(a, b, c) vfmaq_f32(c, a, b)
static inline float llm__vsum(llm__vec v) { return vaddvq_f32(v); }
#else /* portable: 8 partial sums in a struct (the compiler may vectorise it) */
#define LLM__LW 8
#define LLM__TT 1
typedef struct {
  float v[8];
} llm__vec;
static inline llm__vec llm__vzero(void) {
  llm__vec r;
  memset(&r, 0, sizeof r);
  return r;
}
static inline llm__vec llm__vload(const float *p) {
  llm__vec r;
  memcpy(r.v, p, sizeof r.v);
  return r;
}
static inline llm__vec llm__vfma(llm__vec a, llm__vec b, llm__vec c) {
  int i;
  for (i = 0; i < 8; i++) c.v[i] += a.v[i] * b.v[i];
  return c;
}
#define LLM__VZERO() llm__vzero()
#define LLM__VLOAD(p) llm__vload(p)
#define LLM__VFMA(a, b, c) llm__vfma(a, b, c)
static inline float llm__vsum(llm__vec v) {
  return ((v.v[0] + v.v[4]) + (v.v[2] + v.v[6])) + ((v.v[1] + v.v[5]) + (v.v[3] + v.v[7]));
}
#endif

/* The partial sums' total, plus the tail n_vec..n in order. */
static inline float llm__finish(llm__vec acc, const float *w, const float *x, int n_vec, int n) {
  float s = llm__vsum(acc), tail = 0.0f;
  int j;
  for (j = n_vec; j < n; j++) tail += w[j] * x[j];
  return s + tail;
}

/* 4 weight rows x LLM__TT tokens, every accumulator a named register
   variable (arrays of vectors stay in memory at -O2). */
#define LLM__FMA4(t, xv)                                 \
  a0##t = LLM__VFMA(w0v, xv, a0##t), a1##t = LLM__VFMA(w1v, xv, a1##t), \
  a2##t = LLM__VFMA(w2v, xv, a2##t), a3##t = LLM__VFMA(w3v, xv, a3##t)
#define LLM__STORE4(t)                                                              \
  y[(size_t)(t) * ldy + 0] = llm__finish(a0##t, w, x + (size_t)(t) * n, nv, n),              \
  y[(size_t)(t) * ldy + 1] = llm__finish(a1##t, w + (size_t)n, x + (size_t)(t) * n, nv, n),  \
  y[(size_t)(t) * ldy + 2] = llm__finish(a2##t, w + 2 * (size_t)n, x + (size_t)(t) * n, nv, n), \
  y[(size_t)(t) * ldy + 3] = llm__finish(a3##t, w + 3 * (size_t)n, x + (size_t)(t) * n, nv, n)
#if LLM__TT == 4
static inline void llm__tile_4xT(const float *w, const float *x, int n, float *y, int ldy) {
  llm__vec a00 = LLM__VZERO(), a10 = a00, a20 = a00, a30 = a00, a01 = a00, a11 = a00, a21 = a00, a31 = a00;
  llm__vec a02 = a00, a12 = a00, a22 = a00, a32 = a00, a03 = a00, a13 = a00, a23 = a00, a33 = a00;
  int j, nv = n / LLM__LW * LLM__LW;
  for (j = 0; j < nv; j += LLM__LW) {
    llm__vec w0v = LLM__VLOAD(w + j), w1v = LLM__VLOAD(w + (size_t)n + j);
    llm__vec w2v = LLM__VLOAD(w + 2 * (size_t)n + j), w3v = LLM__VLOAD(w + 3 * (size_t)n + j);
    llm__vec x0 = LLM__VLOAD(x + j), x1 = LLM__VLOAD(x + (size_t)n + j);
    llm__vec x2 = LLM__VLOAD(x + 2 * (size_t)n + j), x3 = LLM__VLOAD(x + 3 * (size_t)n + j);
    LLM__FMA4(0, x0);
    LLM__FMA4(1, x1);
    LLM__FMA4(2, x2);
    LLM__FMA4(3, x3);
  }
  LLM__STORE4(0);
  LLM__STORE4(1);
  LLM__STORE4(2);
  LLM__STORE4(3);
}
#elif LLM__TT == 2
static inline void llm__tile_4xT(const float *w, const float *x, int n, float *y, int ldy) {
  llm__vec a00 = LLM__VZERO(), a10 = a00, a20 = a00, a30 = a00, a01 = a00, a11 = a00, a21 = a00, a31 = a00;
  int j, nv = n / LLM__LW * LLM__LW;
  for (j = 0; j < nv; j += LLM__LW) {
    llm__vec w0v = LLM__VLOAD(w + j), w1v = LLM__VLOAD(w + (size_t)n + j);
    llm__vec w2v = LLM__VLOAD(w + 2 * (size_t)n + j), w3v = LLM__VLOAD(w + 3 * (size_t)n + j);
    llm__vec x0 = LLM__VLOAD(x + j), x1 = LLM__VLOAD(x + (size_t)n + j);
    LLM__FMA4(0, x0);
    LLM__FMA4(1, x1);
  }
  LLM__STORE4(0);
  LLM__STORE4(1);
}
#endif

/* 4 weight rows x 1 token (decode) */
static inline void llm__tile_4x1(const float *w, const float *x, int n, float *y) {
  llm__vec a0 = LLM__VZERO(), a1 = LLM__VZERO(), a2 = LLM__VZERO(), a3 = LLM__VZERO();
  int j, nv = n / LLM__LW * LLM__LW;
  for (j = 0; j < nv; j += LLM__LW) {
    llm__vec xv = LLM__VLOAD(x + j);
    a0 = LLM__VFMA(LLM__VLOAD(w + j), xv, a0);
    a1 = LLM__VFMA(LLM__VLOAD(w + (size_t)n + j), xv, a1);
    a2 = LLM__VFMA(LLM__VLOAD(w + 2 * (size_t)n + j), xv, a2);
    a3 = LLM__VFMA(LLM__VLOAD(w + 3 * (size_t)n + j), xv, a3);
  }
  y[0] = llm__finish(a0, w, x, nv, n);
  y[1] = llm__finish(a1, w + (size_t)n, x, nv, n);
  y[2] = llm__finish(a2, w + 2 * (size_t)n, x, nv, n);
  y[3] = llm__finish(a3, w + 3 * (size_t)n, x, nv, n);
}

static inline float llm__dot(const float *w, const float *x, int n) {
  llm__vec a = LLM__VZERO();
  int j, nv = n / LLM__LW * LLM__LW;
  for (j = 0; j < nv; j += LLM__LW) a = LLM__VFMA(LLM__VLOAD(w + j), LLM__VLOAD(x + j), a);
  return llm__finish(a, w, x, nv, n);
}

/* y [n_tok][d_out] = x [n_tok][d_in] times W^T, W [d_out][d_in].  Threads
   split the output rows; each takes its rows' weights once for all tokens.
   Products under a million multiply-adds stay on one thread (a parallel
   region costs more than it saves there). */
static inline void llm_matmul(float *y, const float *x, const float *w, int n_tok, int d_in, int d_out, int n_threads) {
  int n_blk = (d_out + 3) / 4, b;
  (void)n_threads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n_threads) \
    if (n_threads > 1 && (double)n_tok * d_in * d_out > 1048576.0)
#endif
  for (b = 0; b < n_blk; b++) {
    int r0 = 4 * b, t, r;
    const float *wb = w + (size_t)r0 * d_in;
    if (r0 + 4 <= d_out) {
      t = 0;
#if LLM__TT > 1
      for (; t + LLM__TT <= n_tok; t += LLM__TT)
        llm__tile_4xT(wb, x + (size_t)t * d_in, d_in, y + (size_t)t * d_out + r0, d_out);
#endif
      for (; t < n_tok; t++) llm__tile_4x1(wb, x + (size_t)t * d_in, d_in, y + (size_t)t * d_out + r0);
    } else {
      for (t = 0; t < n_tok; t++)
        for (r = r0; r < d_out; r++) y[(size_t)t * d_out + r] = llm__dot(w + (size_t)r * d_in, x + (size_t)t * d_in, d_in);
    }
  }
}

/* o = x / rms(x) * weight, the mean square summed in double */
static inline void llm_rmsnorm(float *o, const float *x, const float *weight, int n) {
  double ss = 0.0;
  float s;
  int j;
  for (j = 0; j < n; j++) ss += (double)x[j] * x[j];
  s = (float)(1.0 / sqrt(ss / n + 1e-5));
  for (j = 0; j < n; j++) o[j] = weight[j] * (s * x[j]);
}

/* ======================================================================
   [5] the KV cache for a model (kvattn)
   ====================================================================== */

typedef struct {
  kva_dtype k_dtype, v_dtype;    /* storage of K and V (DEFAULT = kvattn's default, F16) */
  const kva_dtype *layer_dtype;  /* NULL or [n_layers]: per-layer type of K and V */
  float k_scale, v_scale;        /* FP8 tensor scales; 0 = 1 */
  const float *layer_k_scale, *layer_v_scale; /* NULL or [n_layers]: per-layer FP8 scales */
  const float *head_k_scale, *head_v_scale;   /* NULL or [n_layers][n_kv_heads]: per layer and KV head */
  int block_size;                /* tokens per block; 0 = kvattn's default (16) */
  int n_blocks;                  /* pool size in blocks */
  int max_seqs;                  /* live sequences at once; 0 = kvattn's default */
  int rotate;                    /* kva_cache_desc.rotate: KVA_ROTATE_K / KVA_ROTATE_V rows stored rotated */
  int block_bounds;              /* kva_cache_desc.block_bounds: key bounds per block, for block selection */
  kva_dtype demote_dtype;        /* kva_cache_desc.demote_dtype: a pool for tokens eviction demotes (DEFAULT: none) */
  int demote_blocks;             /* its blocks; 0 = n_blocks */
  /* kva_cache_desc's prefix tier (NULL: none) */
  kva_status (*spill)(void *user, const uint8_t key[32], const void *rec, size_t size);
  kva_status (*fetch)(void *user, const uint8_t key[32], void *rec, size_t cap, size_t *size);
  void *tier_user;
} llm_cache_opts;

static inline void llm__cache_desc(const llm_model *m, const llm_cache_opts *o, kva_cache_desc *d) {
  memset(d, 0, sizeof *d);
  d->n_layers = m->c.n_layers;
  d->n_kv_heads = m->c.n_kv_heads;
  d->head_dim = m->c.head_dim;
  d->dtype = o->k_dtype;
  d->v_dtype = o->v_dtype;
  d->layer_dtype = o->layer_dtype;
  d->k_scale = o->k_scale > 0.0f ? o->k_scale : 1.0f;
  d->v_scale = o->v_scale > 0.0f ? o->v_scale : 1.0f;
  d->layer_k_scale = o->layer_k_scale;
  d->layer_v_scale = o->layer_v_scale;
  d->head_k_scale = o->head_k_scale;
  d->head_v_scale = o->head_v_scale;
  d->block_size = o->block_size;
  d->n_blocks = o->n_blocks;
  d->max_seqs = o->max_seqs;
  d->rotate = o->rotate;
  d->block_bounds = o->block_bounds;
  d->demote_dtype = o->demote_dtype;
  d->demote_blocks = o->demote_blocks;
  d->spill = o->spill;
  d->fetch = o->fetch;
  d->tier_user = o->tier_user;
}

/* Blocks that hold n tokens of one sequence (+1 for a partly filled tail). */
static inline int llm_blocks_for(const llm_cache_opts *o, long n_tokens) {
  long bs = o->block_size > 0 ? o->block_size : 16;
  long b = (n_tokens + bs - 1) / bs + 1;
  return b > INT_MAX / 2 ? INT_MAX / 2 : (int)b;
}

static inline kva_status llm_cache_create(const llm_model *m, const llm_cache_opts *o, kva_cache **c) {
  kva_cache_desc d;
  llm__cache_desc(m, o, &d);
  return kva_cache_create(&d, c);
}

/* Stored bytes of one token (all layers, K + V + scales). */
static inline size_t llm_cache_bytes_per_token(const llm_model *m, const llm_cache_opts *o) {
  kva_cache_desc d;
  llm__cache_desc(m, o, &d);
  return kva_cache_bytes_per_token(&d);
}

/* ======================================================================
   [6] forward pass
   ====================================================================== */

typedef struct {
  int max_rows;        /* token rows one call of llm_forward_rows takes */
  int n_threads;       /* matrix products and kvattn calls */
  int int_scores;      /* kva_attn.int_scores of the attention calls (integer scores over INT8 / INT4 keys) */
  int int_values;      /* kva_attn.int_values of the attention calls (integer value products over INT8 / INT4 values) */
  int select_budget, select_sink, select_recent; /* kva_attn's block selection (one sequence at a time) */
  /* the newest queries of one sequence, per layer (after RoPE), for an eviction scorer that judges by
     them (llm_score_queries: TOVA with 1, SnapKV's observation window with more) */
  float *q_keep;       /* [n_layers][q_keep_max][dim], NULL: none kept */
  int q_keep_max, q_kept, q_pool; /* rows kept at most, kept now; q_pool: kva_score_queries.pool */
  int q_heads, q_dim;  /* the model's query heads and n_heads x head_dim */
  int compress_budget; /* > 0: llm_prefill_compress compresses a prompt to this many tokens (kva_seq_compress) */
  float *layer_weight; /* [n_layers] per-layer budgets for kva_evict.layer_weight (PyramidKV's schedule) */
  int compressed_len;  /* kva_seq_len right after the last compression: slots, the fullest KV head's count */
  float *x, *xb, *xb2; /* [max_rows][dim] residual stream and scratch */
  float *q, *att;      /* [max_rows][dim] */
  float *k, *v;        /* [max_rows][kv_dim] */
  float *hb, *hb2;     /* [max_rows][hidden_dim] */
  float *logits;       /* [max_rows][vocab] for llm_forward's callers */
  int32_t *pos;        /* [max_rows] */
  double t_kva;        /* seconds spent inside kva_* calls (rope, append, store, attend) */
  long rows_done;
} llm_state;

static inline void llm_state_free(llm_state *s) {
  if (!s) return;
  free(s->x), free(s->xb), free(s->xb2), free(s->q), free(s->att), free(s->k), free(s->v);
  free(s->hb), free(s->hb2), free(s->logits), free(s->pos), free(s->q_keep), free(s->layer_weight);
  memset(s, 0, sizeof *s);
}

static inline int llm_state_init(llm_state *s, const llm_model *m, int max_rows, int n_threads) {
  size_t R = (size_t)(max_rows > 0 ? max_rows : 1), D = (size_t)m->c.dim, KV = (size_t)m->c.kv_dim;
  size_t H = (size_t)m->c.hidden_dim, V = (size_t)m->c.vocab_size;
  memset(s, 0, sizeof *s);
  s->max_rows = (int)R;
  s->n_threads = n_threads > 0 ? n_threads : 1;
  s->x = (float *)malloc(R * D * sizeof(float));
  s->xb = (float *)malloc(R * D * sizeof(float));
  s->xb2 = (float *)malloc(R * D * sizeof(float));
  s->q = (float *)malloc(R * D * sizeof(float));
  s->att = (float *)malloc(R * D * sizeof(float));
  s->k = (float *)malloc(R * KV * sizeof(float));
  s->v = (float *)malloc(R * KV * sizeof(float));
  s->hb = (float *)malloc(R * H * sizeof(float));
  s->hb2 = (float *)malloc(R * H * sizeof(float));
  s->logits = (float *)malloc(R * V * sizeof(float));
  s->layer_weight = (float *)malloc((size_t)m->c.n_layers * sizeof(float));
  s->pos = (int32_t *)malloc(R * sizeof(int32_t));
  if (!s->x || !s->xb || !s->xb2 || !s->q || !s->att || !s->k || !s->v || !s->hb || !s->hb2 || !s->logits ||
      !s->pos || !s->layer_weight) {
    llm_state_free(s);
    return 0;
  }
  return 1;
}

/* Keep the newest `rows` queries of each layer (0: none) for llm_score_queries. */
static inline int llm_keep_queries(llm_state *s, const llm_model *m, int rows, int pool) {
  free(s->q_keep);
  s->q_keep = NULL;
  s->q_keep_max = s->q_kept = 0;
  s->q_pool = pool;
  if (rows <= 0) return 1;
  s->q_keep = (float *)malloc((size_t)m->c.n_layers * (size_t)rows * (size_t)m->c.dim * sizeof(float));
  if (!s->q_keep) return 0;
  s->q_keep_max = rows;
  s->q_heads = m->c.n_heads;
  s->q_dim = m->c.dim;
  return 1;
}

/* A kva_score_fn (user: the llm_state): the attention the kept queries pay each held token
   (kva_score_attention over them; the queries sit at the newest held positions). */
static inline kva_status llm_score_queries(void *user, const kva_score_view *view, float *scores) {
  const llm_state *s = (const llm_state *)user;
  kva_score_queries sq;
  if (!s || !s->q_keep || s->q_kept < 1) return KVA_ERR_ARG;
  memset(&sq, 0, sizeof sq);
  sq.q = s->q_keep;
  sq.n_q = s->q_kept;
  sq.n_heads = s->q_heads;
  sq.pool = s->q_pool;
  sq.layer_stride = (size_t)s->q_keep_max * (size_t)s->q_dim;
  return kva_score_attention(&sq, view, scores);
}

static inline void llm__attn_shape(const llm_model *m, const llm_state *s, kva_attn *a) {
  memset(a, 0, sizeof *a);
  a->n_heads = m->c.n_heads;
  a->n_kv_heads = m->c.n_kv_heads;
  a->head_dim = m->c.head_dim;
  a->n_threads = s->n_threads;
  a->int_scores = s->int_scores;
  a->int_values = s->int_values;
  a->select_budget = s->select_budget;
  a->select_sink = s->select_sink;
  a->select_recent = s->select_recent;
}

/* The rows of n_seqs sequences, one after another: sequence i has n_q[i]
   rows (tokens), already appended to the cache (kva_seq_append) by the
   caller, so they are its newest tokens.  Logits (vocab floats per row) go
   to logits for the rows listed in logit_rows (n_logit of them, indices
   into the concatenated rows), or for every row when logit_rows is NULL.
   One sequence attends with kva_attend_cache, several with one
   kva_batch_plan and kva_attend_batch per layer. */
static inline kva_status llm_forward_rows(const llm_model *m, llm_state *s, kva_cache *c, const int *seqs, const int *n_q,
                                   int n_seqs, const int32_t *tokens, const int *logit_rows, int n_logit,
                                   float *logits) {
  const llm_config *p = &m->c;
  const llm_weights *w = &m->w;
  int D = p->dim, KV = p->kv_dim, HD = p->hidden_dim, V = p->vocab_size, nt = s->n_threads;
  int n = 0, i, r, l;
  kva_attn a;
  kva_rope rope;
  kva_batch *plan = NULL;
  kva_status st = KVA_OK;
  double t0, work = 0.0;
  for (i = 0; i < n_seqs; i++) n += n_q[i];
  if (n <= 0) return KVA_OK;
  if (n > s->max_rows) return KVA_ERR_ARG;
  llm__attn_shape(m, s, &a);
  memset(&rope, 0, sizeof rope);
  rope.theta = 10000.0f;
  rope.interleaved = 1; /* llama2.c rotates adjacent pairs (2i, 2i+1) */
  /* positions of every row: its sequence's newest positions */
  for (i = 0, r = 0; i < n_seqs; i++) {
    int base = kva_seq_pos(c, seqs[i]) - n_q[i], t;
    if (base < 0) return KVA_ERR_SEQ;
    for (t = 0; t < n_q[i]; t++) s->pos[r++] = base + t;
    work += (double)n_q[i] * kva_seq_len(c, seqs[i]);
  }
  /* a parallel region costs microseconds (milliseconds when a thread's
     core is busy elsewhere): small attention calls run on one thread (the
     results are the same for any thread count) */
  if (work * p->n_kv_heads * p->head_dim < 262144.0) a.n_threads = 1;
  for (r = 0; r < n; r++) {
    if (tokens[r] < 0 || tokens[r] >= V) return KVA_ERR_ARG;
    memcpy(s->x + (size_t)r * D, w->tok_emb + (size_t)tokens[r] * D, (size_t)D * sizeof(float));
  }
  if (n_seqs > 1) {
    t0 = llm_now();
    st = kva_batch_plan(c, &a, seqs, n_q, n_seqs, &plan);
    s->t_kva += llm_now() - t0;
    if (st != KVA_OK) return st;
  }
  for (l = 0; l < p->n_layers; l++) {
    size_t lD = (size_t)l * D;
    for (r = 0; r < n; r++) llm_rmsnorm(s->xb + (size_t)r * D, s->x + (size_t)r * D, w->rms_att + lD, D);
    llm_matmul(s->q, s->xb, w->wq + lD * D, n, D, D, nt);
    llm_matmul(s->k, s->xb, w->wk + (size_t)l * KV * D, n, D, KV, nt);
    llm_matmul(s->v, s->xb, w->wv + (size_t)l * KV * D, n, D, KV, nt);
    t0 = llm_now();
    kva_rope_apply(&rope, s->q, n, p->n_heads, p->head_dim, s->pos);
    kva_rope_apply(&rope, s->k, n, p->n_kv_heads, p->head_dim, s->pos);
    if (s->q_keep && n_seqs == 1) { /* the newest q_keep_max queries of this layer, oldest first */
      float *kept = s->q_keep + (size_t)l * (size_t)s->q_keep_max * (size_t)D;
      int take = n < s->q_keep_max ? n : s->q_keep_max, stay = s->q_kept + take > s->q_keep_max ? s->q_keep_max - take : s->q_kept;
      memmove(kept, kept + (size_t)(s->q_kept - stay) * D, (size_t)stay * D * sizeof(float));
      memcpy(kept + (size_t)stay * D, s->q + (size_t)(n - take) * D, (size_t)take * D * sizeof(float));
      if (l == p->n_layers - 1) s->q_kept = stay + take;
    }
    for (i = 0, r = 0; i < n_seqs && st == KVA_OK; r += n_q[i], i++)
      st = kva_store(c, seqs[i], l, s->k + (size_t)r * KV, s->v + (size_t)r * KV, n_q[i]);
    if (st == KVA_OK) {
      if (plan)
        st = kva_attend_batch(c, plan, l, s->q, s->att);
      else
        st = kva_attend_cache(c, seqs[0], l, &a, s->q, n, s->att);
    }
    s->t_kva += llm_now() - t0;
    if (st != KVA_OK) break;
    llm_matmul(s->xb2, s->att, w->wo + lD * D, n, D, D, nt);
    for (i = 0; i < n * D; i++) s->x[i] += s->xb2[i];
    for (r = 0; r < n; r++) llm_rmsnorm(s->xb + (size_t)r * D, s->x + (size_t)r * D, w->rms_ffn + lD, D);
    llm_matmul(s->hb, s->xb, w->w1 + (size_t)l * HD * D, n, D, HD, nt);
    llm_matmul(s->hb2, s->xb, w->w3 + (size_t)l * HD * D, n, D, HD, nt);
    for (i = 0; i < n * HD; i++) { /* SwiGLU: silu(w1 x) * (w3 x) */
      float h = s->hb[i];
      s->hb[i] = h * (1.0f / (1.0f + expf(-h))) * s->hb2[i];
    }
    llm_matmul(s->xb2, s->hb, w->w2 + (size_t)l * D * HD, n, HD, D, nt);
    for (i = 0; i < n * D; i++) s->x[i] += s->xb2[i];
  }
  if (plan) kva_batch_free(plan);
  if (st != KVA_OK) return st;
  if (logits) { /* final norm and classifier, only for the rows asked for */
    int nl = logit_rows ? n_logit : n;
    for (i = 0; i < nl; i++) {
      int row = logit_rows ? logit_rows[i] : i;
      if (row < 0 || row >= n) return KVA_ERR_ARG;
      llm_rmsnorm(s->xb + (size_t)i * D, s->x + (size_t)row * D, w->rms_final, D);
    }
    llm_matmul(logits, s->xb, w->wcls, nl, D, V, nt);
  }
  s->rows_done += n;
  return KVA_OK;
}

/* Feed n tokens to one sequence in chunks of at most s->max_rows rows
   (each chunk: kva_seq_append, then llm_forward_rows).  logits: NULL, or
   [n][vocab] (all rows) when all_logits, else [vocab] for the last token.
   A KVA_ERR_FULL append leaves the earlier chunks in the cache. */
static inline kva_status llm_forward(const llm_model *m, llm_state *s, kva_cache *c, int seq, const int32_t *tokens, int n,
                              float *logits, int all_logits) {
  int done = 0;
  while (done < n) {
    int k = n - done < s->max_rows ? n - done : s->max_rows, last = k - 1, is_last = done + k == n;
    kva_status st;
    double t0 = llm_now();
    st = kva_seq_append(c, seq, k);
    s->t_kva += llm_now() - t0;
    if (st != KVA_OK) return st;
    if (all_logits && logits)
      st = llm_forward_rows(m, s, c, &seq, &k, 1, tokens + done, NULL, 0, logits + (size_t)done * m->c.vocab_size);
    else
      st = llm_forward_rows(m, s, c, &seq, &k, 1, tokens + done, &last, 1, is_last ? logits : NULL);
    if (st != KVA_OK) return st;
    done += k;
  }
  return KVA_OK;
}

/* -log softmax(logits)[target], in double */
static inline double llm_nll(const float *logits, int n, int target) {
  double mx = logits[0], sum = 0.0;
  int i;
  for (i = 1; i < n; i++)
    if (logits[i] > mx) mx = logits[i];
  for (i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
  return mx + log(sum) - (double)logits[target];
}

/* Loss of one window: tokens[0..n) from an empty sequence of cache c (a
   fresh sequence, freed at the end), the logits at position t scored
   against tokens[t + 1], and the last one against `after` (the token that
   follows the window in the stream; -1: none).  With an eviction policy
   (ev not NULL, kind not NONE) the window goes token by token so the
   policy acts at every step; otherwise in chunks of `chunk` rows (0 = as
   many as the state takes).  Adds to *sum and *count. */
static inline kva_status llm_window_nll(const llm_model *m, llm_state *s, kva_cache *c, const kva_evict *ev,
                                 const int32_t *tokens, int n, int32_t after, int chunk, double *sum, long *count) {
  int seq, done = 0;
  kva_status st;
  if (chunk <= 0 || chunk > s->max_rows) chunk = s->max_rows;
  if (ev && ev->kind != KVA_EVICT_NONE) chunk = 1;
  if ((st = kva_seq_new(c, &seq)) != KVA_OK) return st;
  if (ev && ev->kind != KVA_EVICT_NONE && (st = kva_seq_set_evict(c, seq, ev)) != KVA_OK) {
    kva_seq_free(c, seq);
    return st;
  }
  while (done < n) {
    int k = n - done < chunk ? n - done : chunk, t;
    st = llm_forward(m, s, c, seq, tokens + done, k, s->logits, 1);
    if (st != KVA_OK) break;
    for (t = 0; t < k; t++) {
      int at = done + t;
      int32_t target = at + 1 < n ? tokens[at + 1] : after;
      if (target < 0) continue;
      *sum += llm_nll(s->logits + (size_t)t * m->c.vocab_size, m->c.vocab_size, target);
      ++*count;
    }
    done += k;
  }
  kva_seq_free(c, seq);
  return st;
}

/* K and V of every layer for tokens[0..n) (one sequence of a fresh F32
   cache), as stored: K after RoPE.  *k and *v get malloc'd arrays of
   n_layers * n * kv_dim floats each (*n_values): the sample that
   kva_fp8_calibrate picks FP8 scales from. */
static inline kva_status llm_kv_sample(const llm_model *m, llm_state *s, const int32_t *tokens, int n, float **k,
                                       float **v, size_t *n_values) {
  llm_cache_opts o;
  kva_cache *c;
  kva_status st;
  size_t per = (size_t)m->c.kv_dim, i = 0;
  int seq, l, slot;
  *k = *v = NULL;
  *n_values = 0;
  memset(&o, 0, sizeof o);
  o.k_dtype = o.v_dtype = KVA_F32;
  o.n_blocks = llm_blocks_for(&o, n);
  o.max_seqs = 1;
  if ((st = llm_cache_create(m, &o, &c)) != KVA_OK) return st;
  if ((st = kva_seq_new(c, &seq)) == KVA_OK) st = llm_forward(m, s, c, seq, tokens, n, NULL, 0);
  if (st == KVA_OK) {
    *k = (float *)malloc((size_t)m->c.n_layers * (size_t)n * per * sizeof(float));
    *v = (float *)malloc((size_t)m->c.n_layers * (size_t)n * per * sizeof(float));
    if (!*k || !*v) st = KVA_ERR_NOMEM;
  }
  for (l = 0; st == KVA_OK && l < m->c.n_layers; l++)
    for (slot = 0; st == KVA_OK && slot < n; slot++, i++)
      st = kva_seq_read(c, seq, l, slot, *k + i * per, *v + i * per, NULL);
  kva_cache_destroy(c);
  if (st != KVA_OK) {
    free(*k), free(*v);
    *k = *v = NULL;
    return st;
  }
  *n_values = i * per;
  return KVA_OK;
}

#endif /* LLM_H */
