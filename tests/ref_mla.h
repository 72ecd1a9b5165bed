/* ref_mla.h - an independent double-precision reference of DeepSeek's MLA
 * (multi-head latent attention, DeepSeek-V2/V3) for the kvattn tests.
 *
 * Written from the MLA equations of the DeepSeek-V2 paper (DeepSeek-AI 2024,
 * section 2.1) and docs/API.md (kva_mla_layer), not from kvattn.h: the textbook "naive" form, plain loops
 * in double.  The reference keeps the full history of a sequence's inputs x
 * and, on every call, recomputes every cached token's latent, key and value
 * from scratch.  Nothing of kvattn.h is used except the kva_mla_layer struct
 * (sizes and weight pointers), ref_rope/ref_linear from ref.h (themselves
 * written from the contract) and, optionally, ref.h's f16/bf16 rounding to
 * model the storage of the latent cache.
 *
 * For a token t at absolute position p (= its index in the history):
 *   query   q = wq·x + bq, or, with q_lora_rank r > 0,
 *               q = wq_b · RMSNorm(wq_a·x; gain q_norm, eps)          (V2/V3)
 *           per head [q_nope(d_nope) | q_pe(d_rope)], q_pe RoPE'd at p
 *   latent  c = w_dkv·x + b_dkv, then c <- c / sqrt(mean(c²) + eps) · kv_norm
 *               when kv_norm is given (eps = norm_eps, 0 => 1e-6)
 *   rope key k_pe = w_kr·x + b_kr RoPE'd at p (NOT normalised), one vector
 *               shared by all heads
 *   per head  k_nope[h] = W_UK[h]·c + b_uk[h],  v[h] = W_UV[h]·c + b_uv[h]
 *   scores  s = (q_nope[h]·k_nope[h] + q_pe[h]·k_pe) · scale,
 *               scale = 1/sqrt(d_nope + d_rope) unless given
 *   causal softmax over positions <= p, o[h] = Σ p·v[h]
 *   out     y = wo · concat_h(o[h]) + bo
 * RoPE: frequencies theta^(-2i/dim) (or the inv_freq table), angle in double,
 * rope.dim 0 => all of d_rope; interleaved pairs (x[2i], x[2i+1]) as
 * DeepSeek, or rotate-half (x[i], x[i+dim/2]).  theta 0 without a table: none.
 *
 * The "store" mode models the cache's storage type: the cached vectors
 * (normalised c and rotated k_pe) are rounded through f16 or bf16 (ref.h's
 * own encoder), or stored as fp8(v / scale) · scale (E4M3 / E5M2, OCP rules,
 * saturating), before anything uses them, as a cache that keeps them in that
 * type must.
 *
 * Also here: ref_sketch_* - a literal transcription of a common simplified
 * MultiHeadLatentAttention sketch (nn.Linear everywhere, c_kv cached raw,
 * W_uk/W_uv up-projections, scale 1/sqrt(d_k), a k_rope that is computed and
 * cached but never used) with an optional causal mask (the sketch has none).
 */
#ifndef KVATTN_TEST_REF_MLA_H
#define KVATTN_TEST_REF_MLA_H

#include "ref.h"

enum { REF_MLA_STORE_EXACT = 0, REF_MLA_STORE_F16, REF_MLA_STORE_BF16, REF_MLA_STORE_E4M3,
       REF_MLA_STORE_E5M2 };

/* Round to an OCP FP8 grid (mbits stored mantissa bits, emin the smallest
   normal exponent), nearest-even, saturating at maxv: E4M3 (3, -6, 448),
   E5M2 (2, -14, 57344).  Subnormals share the spacing 2^(emin - mbits). */
static inline double ref_mla_round_fp8(double y, int mbits, int emin, double maxv) {
  double a = fabs(y), q, n, fl, fr, r;
  int e2;
  if (a == 0.0 || y != y) return y;
  (void)frexp(a, &e2);
  e2 -= 1; /* floor(log2(a)) */
  if (e2 < emin) e2 = emin;
  q = ldexp(1.0, e2 - mbits);
  n = a / q;
  fl = floor(n);
  fr = n - fl;
  if (fr > 0.5 || (fr == 0.5 && fmod(fl, 2.0) != 0.0)) fl += 1.0;
  r = fl * q;
  if (r > maxv) r = maxv;
  return y < 0 ? -r : r;
}

/* x <- x / sqrt(mean(x²) + eps) · gain (gain NULL => 1) */
static inline void ref_mla_rmsnorm(double *x, int n, const float *gain, double eps) {
  int i;
  double ss = 0.0, inv;
  for (i = 0; i < n; i++) ss += x[i] * x[i];
  inv = 1.0 / sqrt(ss / n + eps);
  for (i = 0; i < n; i++) x[i] = x[i] * inv * (gain ? (double)gain[i] : 1.0);
}

static inline double ref_mla_eps(const kva_mla_layer *L) {
  return L->norm_eps != 0.0f ? (double)L->norm_eps : 1e-6;
}

static inline double ref_mla_scale(const kva_mla_layer *L) {
  return L->scale != 0.0f ? (double)L->scale : 1.0 / sqrt((double)(L->d_nope + L->d_rope));
}

static inline void ref_mla_rope_vec(const kva_mla_layer *L, double *v, int32_t pos) {
  if (L->d_rope <= 0) return;
  ref_rope(v, 1, L->d_rope, L->rope.dim, L->rope.interleaved, (double)L->rope.theta,
           L->rope.inv_freq, pos);
}

/* A cached value as the cache stores it.  FP8 stores fp8(v / scale) and reads
   it times scale (scale: the cache's k_scale). */
static inline double ref_mla_store_round(double v, int store, double scale) {
  if (store == REF_MLA_STORE_F16) return (double)ref_round_f16((float)v);
  if (store == REF_MLA_STORE_BF16) return (double)ref_round_bf16((float)v);
  if (store == REF_MLA_STORE_E4M3) return ref_mla_round_fp8(v / scale, 3, -6, 448.0) * scale;
  if (store == REF_MLA_STORE_E5M2) return ref_mla_round_fp8(v / scale, 2, -14, 57344.0) * scale;
  return v;
}

/* The cached vector of one token: ckv [d_latent] (normalised), kpe [d_rope]
   (rotated at pos), both rounded as `store` says. */
static inline void ref_mla_latent(const kva_mla_layer *L, int store, double store_scale,
                                  const float *x, int32_t pos, double *ckv, double *kpe) {
  int i, d = L->d_model;
  double *xd = ref_dup_f(x, (size_t)d);
  ref_linear(L->w_dkv, L->b_dkv, xd, d, L->d_latent, ckv);
  if (L->kv_norm) ref_mla_rmsnorm(ckv, L->d_latent, L->kv_norm, ref_mla_eps(L));
  if (L->d_rope > 0) {
    ref_linear(L->w_kr, L->b_kr, xd, d, L->d_rope, kpe);
    ref_mla_rope_vec(L, kpe, pos);
  }
  for (i = 0; i < L->d_latent; i++) ckv[i] = ref_mla_store_round(ckv[i], store, store_scale);
  for (i = 0; i < L->d_rope; i++) kpe[i] = ref_mla_store_round(kpe[i], store, store_scale);
  free(xd);
}

/* q [H][d_nope + d_rope] of one token, q_pe rotated at pos.  q_norm may be
   NULL (gain 1). */
static inline void ref_mla_query(const kva_mla_layer *L, const float *x, int32_t pos, double *q) {
  int h, d = L->d_model, dq = L->d_nope + L->d_rope, H = L->n_heads;
  double *xd = ref_dup_f(x, (size_t)d);
  if (L->q_lora_rank > 0) {
    int r = L->q_lora_rank;
    double *cq = (double *)malloc(sizeof(double) * (size_t)r);
    if (!cq) abort();
    ref_linear(L->wq_a, NULL, xd, d, r, cq);
    ref_mla_rmsnorm(cq, r, L->q_norm, ref_mla_eps(L));
    ref_linear(L->wq_b, NULL, cq, r, H * dq, q);
    free(cq);
  } else {
    ref_linear(L->wq, L->bq, xd, d, H * dq, q);
  }
  for (h = 0; h < H; h++) ref_mla_rope_vec(L, q + (size_t)h * dq + L->d_nope, pos);
  free(xd);
}

/* A sequence: the history of its inputs. */
typedef struct {
  const kva_mla_layer *L;
  int store;      /* REF_MLA_STORE_* */
  double store_scale; /* FP8: the cache's k_scale (set after init; default 1) */
  /* Optional: the cached vectors of tokens 0..n_ext-1 as some cache really
     stored them (ext_ckv [n_ext][d_latent], ext_kpe [n_ext][d_rope]); the
     forward then attends over those instead of its own.  This separates "was
     the right vector stored" (checked on its own) from "is the attention over
     the stored vectors right", which rounding-midpoint luck cannot blur. */
  const double *ext_ckv, *ext_kpe;
  int n_ext;
  int n, cap;     /* tokens in the history; token i is at position i */
  float *x;       /* [cap][d_model] */
} ref_mla_seq;

static inline void ref_mla_seq_init(ref_mla_seq *s, const kva_mla_layer *L, int store, int cap) {
  s->L = L;
  s->store = store;
  s->store_scale = 1.0;
  s->ext_ckv = s->ext_kpe = NULL;
  s->n_ext = 0;
  s->n = 0;
  s->cap = cap;
  s->x = (float *)malloc(sizeof(float) * (size_t)(cap > 0 ? cap : 1) * (size_t)L->d_model);
  if (!s->x) abort();
}

static inline void ref_mla_seq_copy(ref_mla_seq *dst, const ref_mla_seq *src) {
  ref_mla_seq_init(dst, src->L, src->store, src->cap);
  dst->n = src->n;
  dst->store_scale = src->store_scale;
  memcpy(dst->x, src->x, sizeof(float) * (size_t)src->n * (size_t)src->L->d_model);
}

static inline void ref_mla_seq_free(ref_mla_seq *s) {
  free(s->x);
  s->x = NULL;
  s->n = s->cap = 0;
}

/* The cached vectors of every token in the history: ckv [n][d_latent],
   kpe [n][d_rope] (caller allocates). */
static inline void ref_mla_seq_latents(const ref_mla_seq *s, double *ckv, double *kpe) {
  const kva_mla_layer *L = s->L;
  int t;
  for (t = 0; t < s->n; t++)
    ref_mla_latent(L, s->store, s->store_scale, s->x + (size_t)t * L->d_model, (int32_t)t,
                   ckv + (size_t)t * L->d_latent, kpe + (size_t)t * (L->d_rope > 0 ? L->d_rope : 0));
}

/* Append x [n_new][d_model] to the history and compute y [n_new][d_model]
   for those tokens, each attending causally to the whole history up to and
   including itself.  Everything (every token's latent, every head's K and V)
   is recomputed from the inputs. */
static inline void ref_mla_forward_masked(ref_mla_seq *s, const float *x, int n_new,
                                          const unsigned char *held, double *y);
static inline void ref_mla_forward(ref_mla_seq *s, const float *x, int n_new, double *y) {
  ref_mla_forward_masked(s, x, n_new, NULL, y);
}

/* The same, but only the tokens whose position p has held[p] != 0 are keys
   (a cache that evicted the others); held NULL = every token. */
static inline void ref_mla_forward_masked(ref_mla_seq *s, const float *x, int n_new,
                                          const unsigned char *held, double *y) {
  const kva_mla_layer *L = s->L;
  int H = L->n_heads, dl = L->d_latent, dn = L->d_nope, dr = L->d_rope, dv = L->d_v;
  int dq = dn + dr, d = L->d_model, n, t, h, j, i;
  double scale = ref_mla_scale(L);
  double *ckv, *kpe, *kn, *v, *q, *sc, *o;
  if (n_new <= 0) return;
  if (s->n + n_new > s->cap) abort();
  memcpy(s->x + (size_t)s->n * d, x, sizeof(float) * (size_t)n_new * d);
  s->n += n_new;
  n = s->n;
  ckv = (double *)malloc(sizeof(double) * (size_t)n * dl);
  kpe = (double *)malloc(sizeof(double) * ((size_t)n * (dr > 0 ? dr : 0) + 1));
  kn = (double *)malloc(sizeof(double) * ((size_t)n * H * dn + 1));   /* [n][H][d_nope] */
  v = (double *)malloc(sizeof(double) * (size_t)n * H * dv);          /* [n][H][d_v] */
  q = (double *)malloc(sizeof(double) * (size_t)H * dq);
  sc = (double *)malloc(sizeof(double) * (size_t)n);
  o = (double *)malloc(sizeof(double) * (size_t)H * dv);
  if (!ckv || !kpe || !kn || !v || !q || !sc || !o) abort();
  ref_mla_seq_latents(s, ckv, kpe);
  if (s->n_ext > 0) {
    int ne = s->n_ext < n ? s->n_ext : n;
    memcpy(ckv, s->ext_ckv, sizeof(double) * (size_t)ne * dl);
    if (dr > 0) memcpy(kpe, s->ext_kpe, sizeof(double) * (size_t)ne * dr);
  }
  /* rebuild K (nope part) and V of every head for every token */
  for (j = 0; j < n; j++)
    for (h = 0; h < H; h++) {
      if (dn > 0)
        ref_linear(L->w_uk + (size_t)h * dn * dl, L->b_uk ? L->b_uk + (size_t)h * dn : NULL,
                   ckv + (size_t)j * dl, dl, dn, kn + ((size_t)j * H + h) * dn);
      ref_linear(L->w_uv + (size_t)h * dv * dl, L->b_uv ? L->b_uv + (size_t)h * dv : NULL,
                 ckv + (size_t)j * dl, dl, dv, v + ((size_t)j * H + h) * dv);
    }
  for (t = 0; t < n_new; t++) {
    int32_t p = (int32_t)(n - n_new + t);
    ref_mla_query(L, x + (size_t)t * d, p, q);
    for (h = 0; h < H; h++) {
      const double *qh = q + (size_t)h * dq;
      double m = -INFINITY, sum = 0.0;
      for (j = 0; j <= p; j++) {
        double dot = 0.0;
        if (held && !held[j]) continue;
        for (i = 0; i < dn; i++) dot += qh[i] * kn[((size_t)j * H + h) * dn + i];
        for (i = 0; i < dr; i++) dot += qh[dn + i] * kpe[(size_t)j * dr + i];
        sc[j] = dot * scale;
        if (sc[j] > m) m = sc[j];
      }
      for (j = 0; j <= p; j++) {
        if (held && !held[j]) continue;
        sc[j] = exp(sc[j] - m);
        sum += sc[j];
      }
      for (i = 0; i < dv; i++) o[(size_t)h * dv + i] = 0.0;
      for (j = 0; j <= p; j++) {
        double pr;
        if (held && !held[j]) continue;
        pr = sc[j] / sum;
        for (i = 0; i < dv; i++) o[(size_t)h * dv + i] += pr * v[((size_t)j * H + h) * dv + i];
      }
    }
    ref_linear(L->wo, L->bo, o, H * dv, d, y + (size_t)t * d);
  }
  free(ckv);
  free(kpe);
  free(kn);
  free(v);
  free(q);
  free(sc);
  free(o);
}

/* ------------------------------------------------------------------------ */
/* The simplified MultiHeadLatentAttention sketch, transcribed (batch 1):
 *   q = W_q(x).view(T, H, d_k); c_kv = W_dkv(x); k_rope = W_kr(x)
 *   cache = cat(cache, (c_kv, k_rope))
 *   k = W_uk(c_kv_all).view(S, H, d_k); v = W_uv(c_kv_all).view(S, H, d_k)
 *   attn = softmax(q·kᵀ / sqrt(d_k)) (no mask in the sketch); out = W_o(attn·v)
 * Every nn.Linear has a bias; d_model = H·d_k; W_o is [d_model][d_model].
 * k_rope is computed and cached and never used, exactly as in the sketch.  */
typedef struct {
  int d_model, n_heads, d_k, d_latent, rope_dim;
  const float *W_q, *b_q, *W_dkv, *b_dkv, *W_uk, *b_uk, *W_uv, *b_uv, *W_kr, *b_kr, *W_o, *b_o;
  int n, cap;
  double *c_kv;    /* [cap][d_latent] */
  double *k_rope;  /* [cap][rope_dim] (never read) */
} ref_sketch_mla;

static inline void ref_sketch_alloc(ref_sketch_mla *m, int cap) {
  m->n = 0;
  m->cap = cap;
  m->c_kv = (double *)malloc(sizeof(double) * (size_t)cap * m->d_latent);
  m->k_rope = (double *)malloc(sizeof(double) * ((size_t)cap * m->rope_dim + 1));
  if (!m->c_kv || !m->k_rope) abort();
}

static inline void ref_sketch_free(ref_sketch_mla *m) {
  free(m->c_kv);
  free(m->k_rope);
  m->c_kv = m->k_rope = NULL;
}

/* x [T][d_model] -> y [T][d_model]; causal 0 is the sketch as written. */
static inline void ref_sketch_forward(ref_sketch_mla *m, const float *x, int T, int causal, double *y) {
  int d = m->d_model, H = m->n_heads, dk = m->d_k, dl = m->d_latent, S, t, h, j, i;
  double *xd, *q, *k, *v, *att, *o;
  if (m->n + T > m->cap) abort();
  xd = ref_dup_f(x, (size_t)T * d);
  q = (double *)malloc(sizeof(double) * (size_t)T * H * dk);
  for (t = 0; t < T; t++) {
    ref_linear(m->W_q, m->b_q, xd + (size_t)t * d, d, H * dk, q + (size_t)t * H * dk);
    ref_linear(m->W_dkv, m->b_dkv, xd + (size_t)t * d, d, dl, m->c_kv + (size_t)(m->n + t) * dl);
    if (m->rope_dim > 0)
      ref_linear(m->W_kr, m->b_kr, xd + (size_t)t * d, d, m->rope_dim,
                 m->k_rope + (size_t)(m->n + t) * m->rope_dim);
  }
  m->n += T;
  S = m->n;
  k = (double *)malloc(sizeof(double) * (size_t)S * H * dk);
  v = (double *)malloc(sizeof(double) * (size_t)S * H * dk);
  att = (double *)malloc(sizeof(double) * (size_t)S);
  o = (double *)malloc(sizeof(double) * (size_t)H * dk);
  if (!q || !k || !v || !att || !o) abort();
  for (j = 0; j < S; j++) {
    ref_linear(m->W_uk, m->b_uk, m->c_kv + (size_t)j * dl, dl, H * dk, k + (size_t)j * H * dk);
    ref_linear(m->W_uv, m->b_uv, m->c_kv + (size_t)j * dl, dl, H * dk, v + (size_t)j * H * dk);
  }
  for (t = 0; t < T; t++) {
    int last = causal ? S - T + t : S - 1; /* keys 0..last are used */
    for (h = 0; h < H; h++) {
      double mx = -INFINITY, sum = 0.0;
      for (j = 0; j <= last; j++) {
        double dot = 0.0;
        for (i = 0; i < dk; i++)
          dot += q[((size_t)t * H + h) * dk + i] * k[((size_t)j * H + h) * dk + i];
        att[j] = dot / sqrt((double)dk);
        if (att[j] > mx) mx = att[j];
      }
      for (j = 0; j <= last; j++) {
        att[j] = exp(att[j] - mx);
        sum += att[j];
      }
      for (i = 0; i < dk; i++) {
        double acc = 0.0;
        for (j = 0; j <= last; j++) acc += att[j] / sum * v[((size_t)j * H + h) * dk + i];
        o[(size_t)h * dk + i] = acc;
      }
    }
    ref_linear(m->W_o, m->b_o, o, H * dk, d, y + (size_t)t * d);
  }
  free(xd);
  free(q);
  free(k);
  free(v);
  free(att);
  free(o);
}

#endif /* KVATTN_TEST_REF_MLA_H */
