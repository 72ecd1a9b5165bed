/* bench/bench_quality_model.c - kvattn_bench quality, part model: KV-cache configurations on a
   real trained model (bench/model/: a small Llama-architecture model, see its README.md), each
   against the F32 cache: bytes per token, held-out loss and perplexity, the KL divergence of
   every next-token distribution from the F32 cache's, passkey retrieval and decode speed.
   The decoder is examples/llm.h (kvattn's RoPE, cache and attention), included from examples/ on
   purpose: it is the decoder `kvattn_run` is, so these figures are those of the program a user
   runs, and it stays an example of using kvattn (a file to copy), not a part of the library.
   The part runs in phases (qm_load, qm_fp8_scales, qm_configurations, qm_loss_kl, qm_passkeys,
   qm_rows) over one qm_run.

   Loss: the held-out ids (bench/model/heldout.ids) in windows of seq_len tokens, each from an
   empty sequence, the logits at position t scored against token t + 1 (the last one against the
   first token of the next window), as `kvattn_run MODEL --ppl-tokens IDS` computes it: a window
   runs as one prefill, or token by token when an eviction policy is set (so it acts at every
   step). The F32 reference runs window by window beside every configuration; each position's
   KL(p_f32 || p_config) is taken at once from the reference's log-probabilities, so no more than
   one window of logits is ever held. */
#include "harness.h"
#include "examples/llm.h"
#include "examples/needle.h"

#define QM_MAXCFG 128
#define QM_QUICK_WINDOWS 2
#define QM_QUICK_PASSKEY 1 /* cases per distance */
#define QM_F16_KL_MAX 1e-3 /* a sanity bound: an F16 cache's KL is orders of magnitude below */
#define QM_NCTX 4          /* needle: context-length buckets */
#define QM_NDEPTH 8        /* needle: depths */

enum { QK_STORE, QK_FP8, QK_MIXED, QK_KV, QK_EVICT };
static const char *const qk_name[] = {"storage", "fp8", "mixed", "k/v", "eviction"};
static const double pk_frac[3] = {0.25, 0.5, 0.9};
/* eviction scorers (KVA_EVICT_SCORE): TOVA judges by the current query, SnapKV compresses a prompt once
   by its last QM_SNAP_WINDOW queries pooled over QM_SNAP_POOL slots, Knorm keeps the smallest keys;
   PyramidKV and Ada-KV compress as SnapKV does, with budgets per layer (kva_pyramid_weights, beta
   QM_PYRAMID_BETA) or a layer's budget shared by its KV heads (kva_evict.share_heads) */
enum { QS_NONE = 0, QS_TOVA, QS_SNAPKV, QS_KNORM, QS_PYRAMID, QS_ADAKV };
#define QM_PYRAMID_BETA 20.0f
/* Does the row compress a prompt once after prefill (SnapKV's way)? */
#define QM_COMPRESSES(q) ((q)->scorer == QS_SNAPKV || (q)->scorer == QS_PYRAMID || (q)->scorer == QS_ADAKV)
#define QM_SNAP_WINDOW 32
#define QM_SNAP_POOL 7

typedef struct {
  int kind, pct;     /* pct: eviction budget in percent of seq_len */
  int tokens;        /* > 0: the budget in tokens instead (at most the context) */
  int scorer;        /* KVA_EVICT_SCORE rows: a QS_ value (0: none) */
  double slots_ratio; /* compressing rows: the most slots a compression left, over its budget (the fullest
                         KV head's count: per-layer / per-head budgets hold more slots than the budget) */
  char name[64];
  llm_cache_opts co;
  int int_scores;    /* kva_attn.int_scores of its attention calls */
  int int_values;    /* kva_attn.int_values of its attention calls */
  kva_dtype ldt[64]; /* mixed: per-layer types (co.layer_dtype points here) */
  kva_evict ev;
  int sel;           /* 1: no eviction; block selection (kva_attn.select_budget) at pct of the context */
  kva_cache *c;
  size_t bpt;
  size_t dm_bpt;     /* demotion rows: bytes of one demoted token (kva_cache_stats.demote_block_bytes / block) */
  double nll, kl[3]; /* sums: loss; KL over all positions, the first and the last quarter */
  long n_nll, n_kl[3];
  int pk_ok[3], pk_n[3];
  int nd_ok[2][QM_NCTX][QM_NDEPTH], nd_n[2][QM_NCTX][QM_NDEPTH]; /* needle: [single, multi][context][depth] */
  double t_dec, t_kva; /* decode steps of the passkey runs: time, time inside kvattn calls */
  long n_dec;
  int bad, held_bad, checked;
  char msg[240];
} qm_cfg;

/* The row's policy; block selection reads pct of the context per step and holds everything */
static const char *qm_policy(const qm_cfg *q) {
  static const char *const scorer[] = {"", "TOVA", "SnapKV", "Knorm", "PyramidKV", "Ada-KV"};
  return q->sel ? "SELECT" : q->scorer ? scorer[q->scorer] : q->ev.kind == KVA_EVICT_H2O ? "H2O" : "WINDOW";
}
/* q's budget over a context of n tokens: pct of n, or its tokens (at most n); at least 1 */
static int qm_budget(const qm_cfg *q, int n) {
  int b = q->tokens > 0 ? (q->tokens < n ? q->tokens : n) : (int)floor((double)q->pct * n / 100.0 + 0.5);
  return b < 1 ? 1 : b;
}
/* The state's block selection for q over a context of n tokens: its budget read, the first block's
   4 sinks and the newest 16 tokens always (0: q does not select) */
static void qm_select(const qm_cfg *q, llm_state *s, int n) {
  int b = q->sel ? qm_budget(q, n) : 0;
  s->select_budget = q->sel ? (b < 1 ? 1 : b) : 0;
  s->select_sink = q->sel ? 4 : 0;
  s->select_recent = q->sel ? 16 : 0;
}

/* The state's kept queries and prompt compression for q's scorer over a context of n tokens (every
   sequence starts with none kept) */
static int qm_scorer_state(const qm_cfg *q, llm_state *s, const llm_model *m, int n) {
  int rows = q->scorer == QS_TOVA ? 1 : QM_COMPRESSES(q) ? QM_SNAP_WINDOW : 0;
  s->compress_budget = QM_COMPRESSES(q) ? qm_budget(q, n) : 0;
  /* PyramidKV's schedule for this budget (the row's kva_evict.layer_weight points at it) */
  if (q->scorer == QS_PYRAMID &&
      kva_pyramid_weights(m->c.n_layers, s->compress_budget,
                          QM_SNAP_WINDOW < s->compress_budget ? QM_SNAP_WINDOW : s->compress_budget - 1,
                          QM_PYRAMID_BETA, s->layer_weight) != KVA_OK)
    return 0;
  if (rows != s->q_keep_max && !llm_keep_queries(s, m, rows, QM_COMPRESSES(q) ? QM_SNAP_POOL : 1)) return 0;
  s->q_kept = 0;
  return 1;
}

typedef struct {
  double frac;
  char answer[32];
  int32_t *tok;
  int n;
} qm_case;

/* Bytes of one stored row of dim values in type t, from the storage formats as documented (not
   from the library): f32 4, f16 / bf16 2, fp8 1 byte per value; int8 1 byte per value + a 4-byte
   scale; int4 groups of 32 values of a 4-byte scale, a 4-byte minimum and 16 bytes of codes (a
   last shorter group: 8 bytes + its codes, two per byte). */
static size_t qm_row_bytes(kva_dtype t, int dim) {
  switch (t) {
    case KVA_F32: return 4 * (size_t)dim;
    case KVA_INT8: return (size_t)dim + 4;
    case KVA_FP8_E4M3: case KVA_FP8_E5M2: return (size_t)dim;
    case KVA_INT4:
      return (size_t)(dim / 32) * (2 + 2 + 16) + (dim % 32 ? 4 + (size_t)(dim % 32 + 1) / 2 : 0); /* F16 scale, min */
    default: return 2 * (size_t)dim; /* f16, bf16, DEFAULT (f16) */
  }
}

/* the bytes per token configuration co should take: every layer's K and V rows of every KV head,
   and with block bounds each block's F16 minimum and maximum per key channel, over its tokens */
static size_t qm_expect_bpt(const llm_cache_opts *co, int L, int G, int D) {
  size_t b = 0, bs = (size_t)(co->block_size > 0 ? co->block_size : 16);
  int l;
  for (l = 0; l < L; l++) {
    kva_dtype k = co->layer_dtype ? co->layer_dtype[l] : co->k_dtype;
    kva_dtype v = co->layer_dtype ? co->layer_dtype[l] : co->v_dtype != KVA_DTYPE_DEFAULT ? co->v_dtype : k;
    b += (size_t)G * (qm_row_bytes(k, D) + qm_row_bytes(v, D));
  }
  if (co->block_bounds) b += ((size_t)L * (size_t)G * 4 * (size_t)D + bs - 1) / bs;
  return b;
}

/* "lo-hi (x ratio)" of n scales, in one of two static buffers */
static const char *qm_range(const float *x, size_t n, int which) {
  static char buf[2][64];
  float lo = x[0], hi = x[0];
  size_t i;
  for (i = 1; i < n; i++) {
    if (x[i] < lo) lo = x[i];
    if (x[i] > hi) hi = x[i];
  }
  snprintf(buf[which], sizeof buf[which], "%.3g-%.3g (x%.2f)", lo, hi, (double)(hi / lo));
  return buf[which];
}

static char *qm_read(const char *path, long *len) {
  FILE *f = fopen(path, "rb");
  char *b;
  long n;
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return NULL;
  }
  b = (char *)xalloc((size_t)n + 1);
  if (n > 0 && fread(b, 1, (size_t)n, f) != (size_t)n) {
    fclose(f);
    free(b);
    return NULL;
  }
  fclose(f);
  b[n] = 0;
  if (len) *len = n;
  return b;
}

/* the log-softmax of one row of logits (double), as llm_nll computes its normalizer */
static double qm_lse(const float *l, int n) {
  double mx = l[0], sum = 0.0;
  int i;
  for (i = 1; i < n; i++)
    if (l[i] > mx) mx = l[i];
  for (i = 0; i < n; i++) sum += exp((double)l[i] - mx);
  return mx + log(sum);
}

/* One window of configuration q: tokens[0..n), `after` the token that follows (-1: none).
   ref: lp / p NULL: this is the reference, whose log-probabilities and probabilities go to
   lp_out / p_out; else each position's KL against them is added up. */
static kva_status qm_window(const llm_model *m, llm_state *s, qm_cfg *q, const int32_t *tok, int n, int32_t after,
                            const double *lp, const double *p, double *lp_out, double *p_out) {
  const int V = m->c.vocab_size, W = m->c.seq_len, evict = q->ev.kind != KVA_EVICT_NONE;
  int seq, done = 0;
  kva_status st;
  s->int_scores = q->int_scores;
  s->int_values = q->int_values;
  qm_select(q, s, W);
  /* SnapKV compresses a prompt once: it has no streaming loss (its rows are needle and passkey only) */
  if (QM_COMPRESSES(q)) return KVA_OK;
  if (!qm_scorer_state(q, s, m, W)) return KVA_ERR_NOMEM;
  if ((st = kva_seq_new(q->c, &seq)) != KVA_OK) return st;
  if (evict && (st = kva_seq_set_evict(q->c, seq, &q->ev)) != KVA_OK) {
    kva_seq_free(q->c, seq);
    return st;
  }
  while (done < n) {
    int k = evict ? 1 : n - done, r;
    st = llm_forward(m, s, q->c, seq, tok + done, k, s->logits, 1);
    if (st != KVA_OK) break;
    if (evict) {
      int held = kva_seq_len(q->c, seq), want = done + 1 < q->ev.budget ? done + 1 : q->ev.budget;
      if (held != want && !q->held_bad) {
        q->held_bad = 1;
        snprintf(q->msg, sizeof q->msg, "MISMATCH at position %d: kva_seq_len %d, want min(tokens, budget) = %d",
                 done, held, want);
      }
    }
    for (r = 0; r < k; r++) {
      const int t = done + r;
      const float *l = s->logits + (size_t)r * V;
      const int32_t target = t + 1 < n ? tok[t + 1] : after;
      const double lse = qm_lse(l, V);
      int j;
      if (target >= 0) {
        q->nll += lse - (double)l[target];
        q->n_nll++;
      }
      if (!lp) {
        double *o = lp_out + (size_t)t * V, *po = p_out + (size_t)t * V;
        for (j = 0; j < V; j++) {
          o[j] = (double)l[j] - lse;
          po[j] = exp(o[j]);
        }
      } else {
        const double *a = lp + (size_t)t * V, *pa = p + (size_t)t * V;
        double kl = 0.0;
        for (j = 0; j < V; j++) kl += pa[j] * (a[j] - ((double)l[j] - lse));
        q->kl[0] += kl;
        q->n_kl[0]++;
        if (t < W / 4) q->kl[1] += kl, q->n_kl[1]++;
        if (t >= W - W / 4) q->kl[2] += kl, q->n_kl[2]++;
      }
    }
    done += k;
  }
  kva_seq_free(q->c, seq);
  return st;
}

/* One passkey case: BOS + the prompt (a prefill, or token by token under eviction), then
   answer length + 2 greedy tokens, each step timed. Exact match: the generated text, past its
   leading white space, starts with a run of digits equal to the answer. */
static kva_status qm_passkey(const llm_model *m, llm_state *s, const llm_tokenizer *tz, qm_cfg *q, const qm_case *pc,
                             int *ok) {
  const int V = m->c.vocab_size, evict = q->ev.kind != KVA_EVICT_NONE, n_gen = (int)strlen(pc->answer) + 2;
  char text[256];
  size_t tl = 0;
  int seq, i, prev = pc->tok[pc->n - 1];
  kva_status st;
  const char *c;
  *ok = 0;
  text[0] = 0;
  s->int_scores = q->int_scores;
  s->int_values = q->int_values;
  qm_select(q, s, m->c.seq_len);
  if (!qm_scorer_state(q, s, m, pc->n)) return KVA_ERR_NOMEM;
  if ((st = kva_seq_new(q->c, &seq)) != KVA_OK) return st;
  if (evict) st = kva_seq_set_evict(q->c, seq, &q->ev);
  if (st == KVA_OK) {
    if (evict && s->compress_budget > 0) { /* prefill, then compress the prompt (SnapKV) */
      st = llm_forward(m, s, q->c, seq, pc->tok, pc->n, s->logits, 0);
      if (st == KVA_OK) st = kva_seq_compress(q->c, seq, s->compress_budget);
      if (st == KVA_OK && kva_seq_len(q->c, seq) > q->slots_ratio * s->compress_budget)
        q->slots_ratio = (double)kva_seq_len(q->c, seq) / s->compress_budget;
    } else if (evict)
      for (i = 0; i < pc->n && st == KVA_OK; i++)
        st = llm_forward(m, s, q->c, seq, pc->tok + i, 1, i == pc->n - 1 ? s->logits : NULL, 0);
    else
      st = llm_forward(m, s, q->c, seq, pc->tok, pc->n, s->logits, 0);
  }
  for (i = 0; i < n_gen && st == KVA_OK; i++) {
    int32_t t = llm_argmax(s->logits, V);
    const char *piece = llm_decode(tz, prev, t);
    double t0 = now_s(), k0 = s->t_kva;
    size_t pl = strlen(piece);
    if (tl + pl < sizeof text) {
      memcpy(text + tl, piece, pl + 1);
      tl += pl;
    }
    prev = t;
    st = llm_forward(m, s, q->c, seq, &t, 1, s->logits, 0);
    q->t_dec += now_s() - t0;
    q->t_kva += s->t_kva - k0;
    q->n_dec++;
  }
  kva_seq_free(q->c, seq);
  if (st != KVA_OK) return st;
  for (c = text; *c && isspace((unsigned char)*c); c++) {}
  {
    size_t nd = 0, na = strlen(pc->answer);
    while (isdigit((unsigned char)c[nd])) nd++;
    *ok = nd == na && nd > 0 && !strncmp(c, pc->answer, na);
  }
  return KVA_OK;
}

/* a failure before any configuration ran: one row with the message (printed in table mode) */
static void qm_fail_row(rows *t, const char *fmt, const char *a, const char *b) {
  row *w = rows_add(t, "model");
  rs(w, C_NOTE, fmt, a, b);
  text("\nquality model: %s\n", w->str[C_NOTE]);
  g_failed = 1;
}

/* What the phases of the model part share: the model and its state, the cases, the configurations,
   the reference's log-probabilities of one window, the FP8 scales and the rows. */
typedef struct {
  const opts *o;
  const char *dir;
  int threads;
  rows t;
  llm_model md;
  llm_tokenizer tz;
  int have_tz;
  llm_state st;
  qm_cfg *cf, ref;
  int n_cfg;
  qm_case *cases;
  int n_cases;
  int32_t *ids;
  int n_ids, n_win, n_edge;
  int L, W, V;                       /* layers, seq_len, vocabulary */
  double *lp, *pp, t_start, t_loss;  /* lp / pp: [seq_len][vocab] of the reference's window */
  float cal[2][2];                   /* [e4m3, e5m2][K, V] */
  float *lcal, *hcal;                /* [e4m3, e5m2][K, V][n_layers] and [..][n_layers][n_kv_heads] */
  int ok_all;
  int do_loss, do_needle;            /* the model part (loss, KL, passkeys) and the needle part */
  char model_path[1200], tok_path[1200];
  needle_set nd[2];                  /* needle_single.tsv, needle_multi.tsv */
  int n_nctx, nctx[QM_NCTX], n_ndep; /* the needle cases' context buckets and depths, ascending */
  double ndep[QM_NDEPTH];
} qm_run;

static int qm_cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* a user's checkpoint (--model) with --text: the loss is over that text, not DIR/heldout.ids */
static int qm_text_heldout(const qm_run *R) { return R->o->model_file && R->o->text_file; }

static int qm_exists(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f) fclose(f);
  return f != NULL;
}

/* --text FILE: cases generated from a text with the model's tokenizer (examples/needle.h's
   needle_generate): 10 per depth (1 with --quick), kind and context length (1K and 2K, those that
   fit seq_len; else seq_len rounded down to a power of two). */
static int qm_needle_generate(qm_run *R) {
  static const double depths[5] = {0.10, 0.25, 0.50, 0.75, 0.90};
  char err[1200], *txt = qm_read(R->o->text_file, NULL);
  int k, ctx, n_ctx = 0, contexts[2];
  if (!txt) {
    fprintf(stderr, "kvattn_bench quality, part needle: cannot read --text %s\n", R->o->text_file);
    qm_fail_row(&R->t, "ERROR cannot read --text %s%s", R->o->text_file, "");
    return 0;
  }
  for (ctx = 1024; ctx <= 2048 && ctx <= R->W; ctx *= 2) contexts[n_ctx++] = ctx;
  if (n_ctx == 0) {
    for (ctx = NEEDLE_MIN_CONTEXT; ctx * 2 <= R->W; ctx *= 2) {}
    contexts[n_ctx++] = ctx;
  }
  for (k = 0; k < 2; k++)
    for (ctx = 0; ctx < n_ctx; ctx++)
      if (!needle_generate(&R->nd[k], &R->tz, R->W, txt, (needle_kind)k, contexts[ctx], depths, 5,
                           R->o->quick ? 1 : 10, 77u + 1000u * (unsigned)k + (unsigned)contexts[ctx], err,
                           sizeof err)) {
        fprintf(stderr, "kvattn_bench quality, part needle: --text %s: %s\n", R->o->text_file, err);
        qm_fail_row(&R->t, "ERROR --text %s: %s", R->o->text_file, err);
        free(txt);
        return 0;
      }
  free(txt);
  return 1;
}

/* Needle cases: generated from --text, or DIR/needle_single.tsv and DIR/needle_multi.tsv
   (examples/needle.h's format), at least one of them; their context buckets and depths; --quick
   keeps one case per cell. */
static int qm_needle_cases(qm_run *R) {
  static const char *const file[2] = {"needle_single.tsv", "needle_multi.tsv"};
  char path[1200], err[1200];
  int k, i, j, found = 0;
  if (R->o->text_file && !qm_needle_generate(R)) return 0;
  for (k = 0; k < 2; k++) {
    snprintf(path, sizeof path, "%s/%s", R->dir, file[k]);
    if (!R->o->text_file && !qm_exists(path)) continue;
    if (!R->o->text_file && !needle_read(&R->nd[k], path, &R->tz, R->W, err, sizeof err)) {
      fprintf(stderr, "kvattn_bench quality, part needle: %s\n", err);
      qm_fail_row(&R->t, "ERROR %s%s", err, "");
      return 0;
    }
    found++;
    for (i = 0; i < R->nd[k].n; i++) {
      const needle_case *c = &R->nd[k].cases[i];
      int ci = -1, di = -1;
      for (j = 0; j < R->n_nctx; j++) if (R->nctx[j] == c->context) ci = j;
      for (j = 0; j < R->n_ndep; j++) if (fabs(R->ndep[j] - c->depth) < 1e-9) di = j;
      if (ci < 0 && R->n_nctx < QM_NCTX) R->nctx[ci = R->n_nctx++] = c->context;
      if (di < 0 && R->n_ndep < QM_NDEPTH) R->ndep[di = R->n_ndep++] = c->depth;
      if (ci < 0 || di < 0) {
        snprintf(err, sizeof err, "%.1000s: more than %d context lengths or %d depths", path, QM_NCTX, QM_NDEPTH);
        qm_fail_row(&R->t, "ERROR %s%s", err, "");
        return 0;
      }
    }
  }
  if (!found) {
    fprintf(stderr, "kvattn_bench quality, part needle: %s has neither needle_single.tsv nor needle_multi.tsv "
                    "(bench/retrieval has both; or give --text FILE)\n", R->dir);
    qm_fail_row(&R->t, "ERROR %s: no needle_single.tsv or needle_multi.tsv (try --model-dir bench/retrieval)%s",
                R->dir, "");
    return 0;
  }
  qsort(R->nctx, (size_t)R->n_nctx, sizeof(int), qm_cmp_int);
  qsort(R->ndep, (size_t)R->n_ndep, sizeof(double), cmp_double);
  return 1;
}

/* The files: the model, its tokenizer, the held-out ids and the passkey and needle cases, and the
   decoder's state. */
static int qm_load(qm_run *R) {
  int i;
  char path[1200], err[1200], *txt = NULL;
  /* ---- the files: the model and its tokenizer always; held-out ids for the loss */
  const char *need[3];
  need[0] = R->model_path, need[1] = R->tok_path, need[2] = NULL;
  if (R->do_loss && !qm_text_heldout(R)) {
    snprintf(path, sizeof path, "%s/heldout.ids", R->dir);
    need[2] = path;
  }
  for (i = 0; i < 3; i++) {
    FILE *f;
    if (!need[i]) continue;
    if (!(f = fopen(need[i], "rb"))) {
      fprintf(stderr,
              "kvattn_bench quality: cannot open %s: run from the repository root or pass --model-dir DIR (a "
              "directory with model.bin, tokenizer.bin, heldout.ids and optionally calib.txt, passkey.tsv, "
              "needle_single.tsv, needle_multi.tsv), or --model FILE and --tokenizer FILE\n",
              need[i]);
      qm_fail_row(&R->t, "ERROR cannot open %s%s: run from the repository root or pass --model-dir", need[i], "");
      goto fail;
    }
    fclose(f);
  }
  snprintf(path, sizeof path, "%s", R->model_path);
  if (!llm_model_load(&R->md, path, err, sizeof err)) {
    fprintf(stderr, "kvattn_bench quality, part model: %s\n", err);
    qm_fail_row(&R->t, "ERROR %s%s", err, "");
    goto fail;
  }
  R->L = R->md.c.n_layers, R->W = R->md.c.seq_len, R->V = R->md.c.vocab_size;
  if (!llm_tokenizer_load(&R->tz, R->tok_path, R->V, err, sizeof err)) {
    fprintf(stderr, "kvattn_bench quality, part model: %s\n", err);
    qm_fail_row(&R->t, "ERROR %s%s", err, "");
    goto fail;
  }
  R->have_tz = 1;
  /* held-out ids: DIR/heldout.ids, or --text encoded with the model's tokenizer (a user's --model) */
  snprintf(path, sizeof path, "%s/heldout.ids", R->dir);
  if (R->do_loss && qm_text_heldout(R)) {
    long len;
    int n;
    if (!(txt = qm_read(R->o->text_file, &len))) {
      qm_fail_row(&R->t, "ERROR cannot read --text %s%s", R->o->text_file, "");
      goto fail;
    }
    R->ids = (int32_t *)xalloc(((size_t)len + 3) * sizeof(int32_t));
    if (llm_encode(&R->tz, txt, 1, 0, R->ids, &n) != 0 || n < 2) {
      qm_fail_row(&R->t, "ERROR --text %s: %s", R->o->text_file, "empty, or out of memory encoding it");
      goto fail;
    }
    R->n_ids = n;
    free(txt);
    txt = NULL;
  } else if (R->do_loss) {
    long len;
    char *p, *e;
    if (!(txt = qm_read(path, &len))) {
      qm_fail_row(&R->t, "ERROR cannot read %s%s", path, "");
      goto fail;
    }
    R->ids = (int32_t *)xalloc(((size_t)len / 2 + 2) * sizeof(int32_t));
    for (p = txt;;) {
      long v = strtol(p, &e, 10);
      if (e == p) break;
      if (v < 0 || v >= R->V) {
        snprintf(err, sizeof err, "%ld is not a token id (vocabulary %d)", v, R->V);
        qm_fail_row(&R->t, "ERROR %s: %s", path, err);
        goto fail;
      }
      R->ids[R->n_ids++] = (int32_t)v;
      p = e;
    }
    while (*e && isspace((unsigned char)*e)) e++;
    if (*e || R->n_ids < 2) {
      qm_fail_row(&R->t, "ERROR %s: %s", path, *e ? "not whitespace-separated token ids" : "fewer than 2 ids");
      goto fail;
    }
    free(txt);
    txt = NULL;
  }
  R->n_win = (R->n_ids + R->W - 1) / R->W;
  if (R->o->quick && R->n_win > QM_QUICK_WINDOWS) R->n_win = QM_QUICK_WINDOWS;
  /* passkey cases (optional): distance_fraction TAB answer TAB prompt */
  snprintf(path, sizeof path, "%s/passkey.tsv", R->dir);
  if (R->do_loss && qm_exists(path) && !qm_text_heldout(R)) {
    char *line, *save = NULL;
    int per[3] = {0, 0, 0};
    if (!(txt = qm_read(path, NULL))) {
      qm_fail_row(&R->t, "ERROR cannot read %s%s", path, "");
      goto fail;
    }
    R->cases = (qm_case *)xalloc(sizeof(qm_case) * 4096);
    for (line = strtok_r(txt, "\n", &save); line && R->n_cases < 4096; line = strtok_r(NULL, "\n", &save)) {
      char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL, *e;
      double fr;
      int d = -1, k, n;
      qm_case *pc = &R->cases[R->n_cases];
      if (!t2 || t2 - t1 - 1 <= 0 || t2 - t1 - 1 >= (long)sizeof pc->answer) {
        qm_fail_row(&R->t, "ERROR %s: a line is not distance_fraction<TAB>answer<TAB>prompt%s", path, "");
        goto fail;
      }
      fr = strtod(line, &e);
      for (k = 0; k < 3; k++)
        if (fabs(fr - pk_frac[k]) < 1e-6) d = k;
      if (e != t1 || d < 0) {
        qm_fail_row(&R->t, "ERROR %s: a distance fraction is not 0.25, 0.5 or 0.9%s", path, "");
        goto fail;
      }
      if (R->o->quick && per[d] >= QM_QUICK_PASSKEY) continue;
      per[d]++;
      pc->frac = fr;
      memcpy(pc->answer, t1 + 1, (size_t)(t2 - t1 - 1));
      pc->answer[t2 - t1 - 1] = 0;
      pc->tok = (int32_t *)xalloc((strlen(t2 + 1) + 3) * sizeof(int32_t));
      if (llm_encode(&R->tz, t2 + 1, 1, 0, pc->tok, &n) != 0) {
        qm_fail_row(&R->t, "ERROR %s: out of memory encoding a prompt%s", path, "");
        goto fail;
      }
      pc->n = n;
      if (n + (int)strlen(pc->answer) + 2 > R->W) {
        snprintf(err, sizeof err, "a prompt of %d tokens leaves no room for its answer in seq_len %d", n, R->W);
        qm_fail_row(&R->t, "ERROR %s: %s", path, err);
        goto fail;
      }
      R->n_cases++;
    }
    if (R->n_cases == 0) {
      qm_fail_row(&R->t, "ERROR %s: no passkey cases%s", path, "");
      goto fail;
    }
    free(txt);
    txt = NULL;
  }
  if (R->do_needle && !qm_needle_cases(R)) goto fail;
  if (!llm_state_init(&R->st, &R->md, R->W, R->threads)) {
    qm_fail_row(&R->t, "ERROR out of memory (model state)%s%s", "", "");
    goto fail;
  }
  return 1;
fail:
  free(txt);
  return 0;
}

/* FP8 scales: kva_fp8_calibrate's MSE rule on calib.txt's K and V, for all layers at once, per layer and
   per layer and KV head. */
static int qm_fp8_scales(qm_run *R) {
  int i, j;
  char path[1200], *txt = NULL;
  llm_state st_cal;
  /* ---- FP8 scales: kva_fp8_calibrate (MSE rule) on every layer's K and V of calib.txt's first
     seq_len tokens, as `kvattn_run --fp8-calib` picks them */
  snprintf(path, sizeof path, "%s/calib.txt", R->dir);
  {
    float *kb = NULL, *vb = NULL;
    size_t nv = 0;
    int n;
    int32_t *ct;
    kva_status cs;
    const needle_case *first = R->nd[0].n ? &R->nd[0].cases[0] : R->nd[1].n ? &R->nd[1].cases[0] : NULL;
    if (qm_exists(path) && !qm_text_heldout(R)) {
      progress("quality model: FP8 calibration on %s", path);
      if (!(txt = qm_read(path, NULL))) {
        qm_fail_row(&R->t, "ERROR cannot read %s%s", path, "");
        goto fail;
      }
      ct = (int32_t *)xalloc((strlen(txt) + 3) * sizeof(int32_t));
      if (llm_encode(&R->tz, txt, 1, 0, ct, &n) != 0 || n < 2) {
        free(ct);
        qm_fail_row(&R->t, "ERROR %s: %s", path, "empty text or out of memory");
        goto fail;
      }
    } else { /* no calib.txt: the held-out ids, or the first needle prompt */
      n = R->n_ids >= 2 ? R->n_ids : first ? first->n : 0;
      if (n < 2) {
        qm_fail_row(&R->t, "ERROR %s: no calib.txt and no text to calibrate FP8 scales on%s", R->dir, "");
        goto fail;
      }
      ct = (int32_t *)xalloc((size_t)n * sizeof(int32_t));
      memcpy(ct, R->n_ids >= 2 ? R->ids : first->tok, (size_t)n * sizeof(int32_t));
    }
    if (n > R->W) n = R->W;
    if (!llm_state_init(&st_cal, &R->md, n < 256 ? n : 256, R->threads)) {
      free(ct);
      qm_fail_row(&R->t, "ERROR out of memory (model state)%s%s", "", "");
      goto fail;
    }
    cs = llm_kv_sample(&R->md, &st_cal, ct, n, &kb, &vb, &nv);
    llm_state_free(&st_cal);
    free(ct);
    for (i = 0; i < 2 && cs == KVA_OK; i++) {
      kva_dtype f = i ? KVA_FP8_E5M2 : KVA_FP8_E4M3;
      if ((cs = kva_fp8_calibrate(f, kb, nv, KVA_CALIB_MSE, &R->cal[i][0])) == KVA_OK)
        cs = kva_fp8_calibrate(f, vb, nv, KVA_CALIB_MSE, &R->cal[i][1]);
    }
    /* the same rule per layer, and per layer and KV head (the sample is [layer][token][kv_dim]) */
    {
      int G = R->md.c.n_kv_heads, D = R->md.c.head_dim, kv;
      size_t per_layer = nv / (size_t)R->md.c.n_layers;
      R->lcal = (float *)xalloc(sizeof(float) * 4 * (size_t)R->md.c.n_layers);
      R->hcal = (float *)xalloc(sizeof(float) * 4 * (size_t)R->md.c.n_layers * (size_t)G);
      for (i = 0; i < 2 && cs == KVA_OK; i++)
        for (kv = 0; kv < 2 && cs == KVA_OK; kv++)
          for (j = 0; j < R->md.c.n_layers && cs == KVA_OK; j++) {
            kva_dtype f = i ? KVA_FP8_E5M2 : KVA_FP8_E4M3;
            const float *x = (kv ? vb : kb) + (size_t)j * per_layer;
            cs = kva_fp8_calibrate(f, x, per_layer, KVA_CALIB_MSE, &R->lcal[(i * 2 + kv) * R->md.c.n_layers + j]);
            if (cs == KVA_OK)
              cs = kva_fp8_calibrate_heads(f, x, (int)(per_layer / (size_t)(G * D)), G, D, KVA_CALIB_MSE,
                                           R->hcal + ((size_t)(i * 2 + kv) * (size_t)R->md.c.n_layers + (size_t)j) *
                                                      (size_t)G);
          }
    }
    free(kb);
    free(vb);
    if (cs != KVA_OK) {
      qm_fail_row(&R->t, "ERROR FP8 calibration: %s%s", kva_status_str(cs), "");
      goto fail;
    }
    free(txt);
    txt = NULL;
  }
  return 1;
fail:
  free(txt);
  return 0;
}

/* The configurations and their caches (the f32 reference's too). */
static int qm_configurations(qm_run *R) {
  int i, j;
  /* ---- the configurations */
  R->cf = (qm_cfg *)xalloc(sizeof(qm_cfg) * QM_MAXCFG);
  memset(R->cf, 0, sizeof(qm_cfg) * QM_MAXCFG);
  R->n_edge = R->L / 8 > 1 ? R->L / 8 : 1; /* f16 edge layers of the mixed configurations */
  if (2 * R->n_edge >= R->L) R->n_edge = 0;
  {
    static const kva_dtype plain[] = {KVA_F32, KVA_F16, KVA_BF16, KVA_INT8, KVA_INT4};
    for (i = 0; i < NV(plain); i++) {
      qm_cfg *q = &R->cf[R->n_cfg++];
      q->kind = QK_STORE;
      q->co.k_dtype = q->co.v_dtype = plain[i];
      snprintf(q->name, sizeof q->name, "%s", kva_dtype_name(plain[i]));
    }
    for (i = 0; i < 8; i++) { /* per format: scale 1, one calibrated scale, per layer, per layer and head */
      qm_cfg *q = &R->cf[R->n_cfg++];
      int fi = i / 4, how = i % 4;
      kva_dtype f = fi ? KVA_FP8_E5M2 : KVA_FP8_E4M3;
      static const char *const how_name[4] = {"scale 1", "calibrated", "cal. per layer", "cal. per head"};
      q->kind = QK_FP8;
      q->co.k_dtype = q->co.v_dtype = f;
      q->co.k_scale = how ? R->cal[fi][0] : 1.0f;
      q->co.v_scale = how ? R->cal[fi][1] : 1.0f;
      if (how == 2) {
        q->co.layer_k_scale = R->lcal + (size_t)(fi * 2) * (size_t)R->L;
        q->co.layer_v_scale = R->lcal + (size_t)(fi * 2 + 1) * (size_t)R->L;
      }
      if (how == 3) {
        q->co.head_k_scale = R->hcal + (size_t)(fi * 2) * (size_t)R->L * (size_t)R->md.c.n_kv_heads;
        q->co.head_v_scale = R->hcal + (size_t)(fi * 2 + 1) * (size_t)R->L * (size_t)R->md.c.n_kv_heads;
      }
      snprintf(q->name, sizeof q->name, "%s %s", kva_dtype_name(f), how_name[how]);
    }
    for (i = 0; i < 3 && R->n_edge > 0; i++) { /* f16 edge layers + int8, fp8 (calibrated), int4 */
      qm_cfg *q = &R->cf[R->n_cfg++];
      kva_dtype mid = i == 1 ? KVA_FP8_E4M3 : i == 2 ? KVA_INT4 : KVA_INT8;
      char edges[40];
      q->kind = QK_MIXED;
      for (j = 0; j < R->L; j++) q->ldt[j] = j < R->n_edge || j >= R->L - R->n_edge ? KVA_F16 : mid;
      q->co.k_dtype = q->co.v_dtype = mid;
      q->co.layer_dtype = q->ldt;
      if (i == 1) q->co.k_scale = R->cal[0][0], q->co.v_scale = R->cal[0][1];
      if (R->n_edge == 1) snprintf(edges, sizeof edges, "L0,L%d", R->L - 1);
      else snprintf(edges, sizeof edges, "L0-%d,L%d-%d", R->n_edge - 1, R->L - R->n_edge, R->L - 1);
      snprintf(q->name, sizeof q->name, "f16 %s + %s%s", edges, kva_dtype_name(mid), i == 1 ? " cal." : "");
    }
    for (i = 0; i < 2; i++) { /* int8 and int4 with rotated keys (kva_cache_desc.rotate) */
      qm_cfg *q = &R->cf[R->n_cfg++];
      q->kind = QK_STORE;
      q->co.k_dtype = q->co.v_dtype = i ? KVA_INT4 : KVA_INT8;
      q->co.rotate = KVA_ROTATE_K;
      snprintf(q->name, sizeof q->name, "%s rotated K", kva_dtype_name(q->co.k_dtype));
    }
    for (i = 0; i < 2; i++) { /* int8 and int4 with integer scores (kva_attn.int_scores) */
      qm_cfg *q = &R->cf[R->n_cfg++];
      q->kind = QK_STORE;
      q->co.k_dtype = q->co.v_dtype = i ? KVA_INT4 : KVA_INT8;
      q->int_scores = 1;
      snprintf(q->name, sizeof q->name, "%s int. scores", kva_dtype_name(q->co.k_dtype));
    }
    for (i = 0; i < 4; i++) { /* int8 and int4 with integer scores and values (kva_attn.int_values), V rotated or not */
      qm_cfg *q = &R->cf[R->n_cfg++];
      q->kind = QK_STORE;
      q->co.k_dtype = q->co.v_dtype = i % 2 ? KVA_INT4 : KVA_INT8;
      q->co.rotate = i / 2 ? KVA_ROTATE_K | KVA_ROTATE_V : 0;
      q->int_scores = q->int_values = 1;
      snprintf(q->name, sizeof q->name, "%s int. sc.+val.%s", kva_dtype_name(q->co.k_dtype), i / 2 ? " rot. K+V" : "");
    }
    for (i = 0; i < 2; i++) { /* K against V: which one int4 hurts more (the other int8) */
      qm_cfg *q = &R->cf[R->n_cfg++];
      q->kind = QK_KV;
      q->co.k_dtype = i ? KVA_INT4 : KVA_INT8;
      q->co.v_dtype = i ? KVA_INT8 : KVA_INT4;
      snprintf(q->name, sizeof q->name, "K %s, V %s", kva_dtype_name(q->co.k_dtype), kva_dtype_name(q->co.v_dtype));
    }
    /* WINDOW, WINDOW + 4 sinks, H2O, block selection at each share of the context; then WINDOW,
       H2O and block selection at each token budget (the same tokens held or read) */
    for (i = 0; i < 7; i++)
      for (j = 0; j < (i < 4 ? R->o->n_budgets : R->o->n_budget_tokens) && R->n_cfg < QM_MAXCFG; j++) {
        qm_cfg *q = &R->cf[R->n_cfg++];
        int pol = i < 4 ? i : i == 4 ? 0 : i == 5 ? 2 : 3;
        char amount[32];
        q->kind = QK_EVICT;
        if (i < 4) {
          q->pct = (int)R->o->budgets[j];
          snprintf(amount, sizeof amount, "%ld%%", R->o->budgets[j]);
        } else {
          q->tokens = (int)R->o->budget_tokens[j];
          snprintf(amount, sizeof amount, "%ld tokens", R->o->budget_tokens[j]);
        }
        q->co.k_dtype = q->co.v_dtype = KVA_F32;
        if (pol == 3) {
          q->sel = 1;
          q->co.block_bounds = 1;
          snprintf(q->name, sizeof q->name, "SELECT %s (4 sinks, 16 recent)", amount);
          continue;
        }
        q->ev.kind = pol < 2 ? KVA_EVICT_WINDOW : KVA_EVICT_H2O;
        q->ev.budget = qm_budget(q, R->W);
        q->ev.n_sink = pol ? (q->ev.budget >= 8 ? 4 : 0) : 0;
        q->ev.n_recent = pol == 2 ? q->ev.budget / 2 : 0;
        if (q->ev.n_sink + q->ev.n_recent > q->ev.budget) q->ev.n_recent = q->ev.budget - q->ev.n_sink;
        snprintf(q->name, sizeof q->name, "%s %s%s", pol < 2 ? "WINDOW" : "H2O", amount,
                 pol == 1 ? " + 4 sinks" : pol == 2 ? " (4 sinks)" : "");
      }
  }
  { /* eviction scorers (KVA_EVICT_SCORE) at each share of the context */
    static const char *const what[] = {"",
                                       "TOVA %ld%%",
                                       "SnapKV %ld%% (window 32, pool 7)",
                                       "Knorm %ld%%",
                                       "PyramidKV %ld%% (SnapKV scores, beta 20)",
                                       "Ada-KV %ld%% (SnapKV scores)"};
    for (i = QS_TOVA; i <= QS_ADAKV; i++) /* (--quick: the first budget; each step copies every held row) */
      for (j = 0; j < (R->o->quick ? 1 : R->o->n_budgets) && R->n_cfg < QM_MAXCFG; j++) {
        qm_cfg *q = &R->cf[R->n_cfg++];
        q->kind = QK_EVICT;
        q->scorer = i;
        q->pct = (int)R->o->budgets[j];
        q->co.k_dtype = q->co.v_dtype = KVA_F32;
        q->ev.kind = KVA_EVICT_SCORE;
        q->ev.score = i == QS_KNORM ? kva_score_key_norm : llm_score_queries;
        q->ev.score_user = i == QS_KNORM ? NULL : &R->st;
        /* SnapKV: nothing evicted while the prompt fills; then one compression keeps its window */
        q->ev.budget = QM_COMPRESSES(q) ? 1 << 24 : qm_budget(q, R->W);
        q->ev.n_recent = QM_COMPRESSES(q) ? QM_SNAP_WINDOW : 0;
        q->ev.layer_weight = i == QS_PYRAMID ? R->st.layer_weight : NULL;
        q->ev.share_heads = i == QS_ADAKV;
        snprintf(q->name, sizeof q->name, what[i], R->o->budgets[j]);
      }
  }
  { /* demotion (kva_evict.demote_dtype): each eviction row by share again, its evicted tokens kept at INT4 */
    const int n0 = R->n_cfg;
    for (i = 0; i < n0 && R->n_cfg < QM_MAXCFG; i++) {
      const qm_cfg *src = &R->cf[i];
      qm_cfg *q;
      /* (per-layer and per-head budgets do not demote) */
      if (src->kind != QK_EVICT || src->sel || src->tokens > 0 || src->scorer == QS_KNORM ||
          src->scorer == QS_PYRAMID || src->scorer == QS_ADAKV ||
          (src->ev.kind == KVA_EVICT_WINDOW && src->ev.n_sink > 0))
        continue;
      /* --quick: WINDOW and H2O at the first budget (a scorer's rows cost a copy of every row per step) */
      if (R->o->quick && (src->scorer || src->pct != (int)R->o->budgets[0])) continue;
      q = &R->cf[R->n_cfg++];
      *q = *src;
      q->co.demote_dtype = q->ev.demote_dtype = KVA_INT4;
      {
        char base[sizeof q->name];
        memcpy(base, q->name, sizeof base);
        snprintf(q->name, sizeof q->name, "%.40s, rest INT4", base);
      }
    }
  }
  if (R->o->configs) { /* only the configurations asked for */
    int kept = 0;
    for (i = 0; i < R->n_cfg; i++) {
      const char *w = R->o->configs;
      int keep = 0;
      while (*w && !keep) {
        size_t len = strcspn(w, ",");
        char word[64];
        snprintf(word, sizeof word, "%.*s", (int)(len < sizeof word - 1 ? len : sizeof word - 1), w);
        keep = len > 0 && strstr(R->cf[i].name, word) != NULL;
        w += len + (w[len] == ',');
      }
      if (keep) R->cf[kept++] = R->cf[i];
    }
    R->n_cfg = kept;
  }
  R->ref.co.k_dtype = R->ref.co.v_dtype = KVA_F32;
  snprintf(R->ref.name, sizeof R->ref.name, "f32 reference");
  for (i = -1; i < R->n_cfg; i++) {
    qm_cfg *q = i < 0 ? &R->ref : &R->cf[i];
    kva_status cs;
    q->co.n_blocks = llm_blocks_for(&q->co, R->W);
    q->co.max_seqs = 1;
    q->bpt = llm_cache_bytes_per_token(&R->md, &q->co);
    if ((cs = llm_cache_create(&R->md, &q->co, &q->c)) == KVA_OK && q->co.demote_dtype != KVA_DTYPE_DEFAULT) {
      kva_cache_stats cst;
      kva_cache_get_stats(q->c, &cst);
      q->dm_bpt = cst.demote_block_bytes / (size_t)(q->co.block_size > 0 ? q->co.block_size : 16);
    }
    if (cs != KVA_OK) {
      q->bad = 1;
      snprintf(q->msg, sizeof q->msg, "ERROR cache: %s", kva_status_str(cs));
      if (i < 0) {
        qm_fail_row(&R->t, "ERROR f32 reference cache: %s%s", kva_status_str(cs), "");
        goto fail;
      }
    }
  }
  return 1;
fail:
  return 0;
}

/* Loss and KL, window by window: the reference, then every configuration against it. */
static int qm_loss_kl(qm_run *R) {
  int i, w;
  /* ---- loss and KL, window by window: the reference, then every configuration */
  R->lp = (double *)xalloc((size_t)R->W * R->V * sizeof(double));
  R->pp = (double *)xalloc((size_t)R->W * R->V * sizeof(double));
  for (w = 0; w < R->n_win; w++) {
    int start = w * R->W, len = R->n_ids - start < R->W ? R->n_ids - start : R->W;
    int32_t after = start + len < R->n_ids ? R->ids[start + len] : -1;
    kva_status cs;
    double el = now_s() - R->t_start;
    if (w > 0)
      progress("quality model: loss, window %d/%d (%d configurations + the f32 reference), %.0f s, about %.0f s left",
               w + 1, R->n_win, R->n_cfg, el, el / w * (R->n_win - w));
    else
      progress("quality model: loss, window 1/%d (%d configurations + the f32 reference)", R->n_win, R->n_cfg);
    if ((cs = qm_window(&R->md, &R->st, &R->ref, R->ids + start, len, after, NULL, NULL, R->lp, R->pp)) != KVA_OK) {
      qm_fail_row(&R->t, "ERROR f32 reference: %s%s", kva_status_str(cs), "");
      goto fail;
    }
    for (i = 0; i < R->n_cfg; i++) {
      qm_cfg *q = &R->cf[i];
      if (q->bad) continue;
      if ((cs = qm_window(&R->md, &R->st, q, R->ids + start, len, after, R->lp, R->pp, NULL, NULL)) != KVA_OK) {
        q->bad = 1;
        snprintf(q->msg, sizeof q->msg, "ERROR window %d: %s", w, kva_status_str(cs));
      }
    }
  }
  return 1;
fail:
  return 0;
}

/* Passkey retrieval and decode speed of every configuration. */
static int qm_passkeys(qm_run *R) {
  int i, j;
  /* ---- passkey retrieval and decode speed */
  R->t_loss = now_s() - R->t_start;
  for (j = 0; j < R->n_cases; j++) {
    int d;
    double el = now_s() - R->t_start;
    if (j > 0)
      progress("quality model: passkey case %d/%d (distance %.2f of seq_len), %.0f s, about %.0f s left", j + 1,
               R->n_cases, R->cases[j].frac, el, (el - R->t_loss) / j * (R->n_cases - j));
    else
      progress("quality model: passkey case 1/%d (distance %.2f of seq_len), %.0f s", R->n_cases, R->cases[j].frac, el);
    for (d = 0; d < 3; d++)
      if (fabs(R->cases[j].frac - pk_frac[d]) < 1e-6) break;
    for (i = 0; i < R->n_cfg; i++) {
      qm_cfg *q = &R->cf[i];
      int ok;
      kva_status cs;
      if (q->bad) continue;
      if ((cs = qm_passkey(&R->md, &R->st, &R->tz, q, &R->cases[j], &ok)) != KVA_OK) {
        q->bad = 1;
        snprintf(q->msg, sizeof q->msg, "ERROR passkey case %d: %s", j, kva_status_str(cs));
        continue;
      }
      q->pk_ok[d] += ok;
      q->pk_n[d]++;
    }
  }
  progress_end();
  return 1;
}

/* Needle retrieval of every configuration: each case of needle_single.tsv and needle_multi.tsv
   (one per depth and context length with --quick), greedy, scored by examples/needle.h's rule.
   Eviction budgets are a percentage of the case's context bucket. */
static int qm_needles(qm_run *R) {
  int k, j, i, done = 0, total = 0, seen[2][QM_NCTX][QM_NDEPTH];
  double t0 = now_s();
  memset(seen, 0, sizeof seen);
  for (k = 0; k < 2; k++) total += R->nd[k].n;
  for (k = 0; k < 2; k++)
    for (j = 0; j < R->nd[k].n; j++) {
      const needle_case *c = &R->nd[k].cases[j];
      int ci = 0, di = 0;
      while (R->nctx[ci] != c->context) ci++;
      while (fabs(R->ndep[di] - c->depth) > 1e-9) di++;
      done++;
      if (R->o->quick && seen[k][ci][di]++) continue;
      if (done > 1)
        progress("quality needle: case %d/%d (%s, %d tokens, depth %.2f), %.0f s", done, total,
                 k ? "multi" : "single", c->n, c->depth, now_s() - t0);
      for (i = 0; i < R->n_cfg; i++) {
        qm_cfg *q = &R->cf[i];
        kva_evict ev = q->ev;
        int ok;
        kva_status cs;
        if (q->bad) continue;
        qm_select(q, &R->st, c->context);
        if (!qm_scorer_state(q, &R->st, &R->md, c->context)) {
          q->bad = 1;
          snprintf(q->msg, sizeof q->msg, "ERROR needle: out of memory");
          continue;
        }
        if (q->kind == QK_EVICT && !q->sel && !QM_COMPRESSES(q)) {
          ev.budget = qm_budget(q, c->context);
          if (ev.n_sink > ev.budget) ev.n_sink = 0;
          if (ev.kind == KVA_EVICT_H2O) ev.n_recent = ev.budget / 2;
          if (ev.n_sink + ev.n_recent > ev.budget) ev.n_recent = ev.budget - ev.n_sink;
        }
        R->st.int_scores = q->int_scores;
        R->st.int_values = q->int_values;
        R->st.compressed_len = 0;
        if ((cs = needle_run(&R->md, &R->st, &R->tz, q->c, q->kind == QK_EVICT && !q->sel ? &ev : NULL, c, &ok, NULL, 0)) !=
            KVA_OK) {
          q->bad = 1;
          snprintf(q->msg, sizeof q->msg, "ERROR needle case %d: %s", j + 1, kva_status_str(cs));
          continue;
        }
        q->nd_ok[k][ci][di] += ok;
        q->nd_n[k][ci][di]++;
        if (QM_COMPRESSES(q) && R->st.compress_budget > 0 && R->st.compressed_len > q->slots_ratio * R->st.compress_budget)
          q->slots_ratio = (double)R->st.compressed_len / R->st.compress_budget;
      }
    }
  R->st.int_scores = 0;
  R->st.int_values = 0;
  progress_end();
  return 1;
}

/* one configuration's needle accuracy over a kind (every context and depth), or -1 without cases */
static double qm_needle_acc(const qm_cfg *q, int kind, int ci) {
  int c, d, ok = 0, n = 0;
  for (c = 0; c < QM_NCTX; c++)
    for (d = 0; d < QM_NDEPTH; d++)
      if (ci < 0 || ci == c) ok += q->nd_ok[kind][c][d], n += q->nd_n[kind][c][d];
  return n ? (double)ok / n : -1.0;
}

/* The needle rows (one per configuration, kind, context and depth: what `make plot` draws) and, in
   table mode, one line per configuration: accuracy per depth at each context length. */
static void qm_needle_rows(qm_run *R) {
  int i, k, c, d;
  char line[512];
  for (i = 0; i < R->n_cfg; i++) {
    const qm_cfg *q = &R->cf[i];
    if (q->bad) continue;
    for (k = 0; k < 2; k++)
      for (c = 0; c < R->n_nctx; c++)
        for (d = 0; d < R->n_ndep; d++) {
          row *r;
          if (!q->nd_n[k][c][d]) continue;
          r = rows_add(&R->t, "needle");
          rs(r, C_SCHEME, "%s", qk_name[q->kind]);
          rs(r, C_NAME, "%s", q->name);
          rs(r, C_MODEL, "%s", R->model_path);
          rs(r, C_MODE, "%s", k ? "multi" : "single");
          rn(r, C_CTX, R->nctx[c]);
          rn(r, C_VALUE, (double)q->nd_ok[k][c][d] / q->nd_n[k][c][d]);
          rn(r, C_PKN, q->nd_n[k][c][d]);
          rn(r, C_NDEPTH, R->ndep[d]);
          rn(r, C_BPT, (double)q->bpt);
          if (q->kind == QK_EVICT) {
            rs(r, C_POLICY, "%s", qm_policy(q));
            rn(r, C_NSINK, q->ev.n_sink);
            if (q->tokens) rn(r, C_BUDGET, q->tokens);
            else rn(r, C_BUDGETFRAC, q->pct / 100.0);
          }
        }
  }
  /* each configuration's accuracy over every depth and length, kind by kind (so that one policy's
     budgets are consecutive rows: a chart's line) */
  for (k = 0; k < 2; k++)
    for (i = 0; i < R->n_cfg; i++) {
      const qm_cfg *q = &R->cf[i];
      double a = qm_needle_acc(q, k, -1);
      row *r;
      if (q->bad || a < 0) continue;
      r = rows_add(&R->t, "needle_all");
      rs(r, C_SCHEME, "%s", qk_name[q->kind]);
      rs(r, C_NAME, "%s", q->name);
      rs(r, C_MODEL, "%s", R->model_path);
      rs(r, C_MODE, "%s", k ? "multi" : "single");
      rn(r, C_VALUE, a);
      rn(r, C_BPT, (double)q->bpt);
      if (q->kind == QK_EVICT) {
        rs(r, C_POLICY, "%s", qm_policy(q));
        rn(r, C_NSINK, q->ev.n_sink);
        if (q->tokens) rn(r, C_BUDGET, q->tokens);
        else rn(r, C_BUDGETFRAC, q->pct / 100.0);
      }
    }
  if (g_fmt != OUT_TABLE) return;
  text("\nNeedle retrieval on %s: greedy exact match of the pass key's digits (examples/needle.h), per depth of\n"
       "the needle in the filler (", R->model_path);
  for (d = 0; d < R->n_ndep; d++) text("%s%.2f", d ? " " : "", R->ndep[d]);
  text(") at each context length; in percent. single: one pass key; multi: 4 named keys, one asked.\n"
       "Eviction budgets here are a share of each case's context length.\n");
  for (k = 0; k < 2; k++) {
    int n_cases = 0;
    for (c = 0; c < QM_NCTX; c++)
      for (d = 0; d < QM_NDEPTH; d++) n_cases += R->cf[0].nd_n[k][c][d];
    if (!n_cases) continue;
    snprintf(line, sizeof line, "  %-28s %5s", k ? "multi-key" : "single key", "all");
    for (c = 0; c < R->n_nctx; c++) {
      size_t l = strlen(line);
      snprintf(line + l, sizeof line - l, " | %4d:", R->nctx[c]);
      for (d = 0; d < R->n_ndep; d++) {
        l = strlen(line);
        snprintf(line + l, sizeof line - l, " %3.0f", 100.0 * R->ndep[d]);
      }
    }
    text("%s  (%d cases per configuration)\n", line, n_cases);
    for (i = 0; i < R->n_cfg; i++) {
      const qm_cfg *q = &R->cf[i];
      double a = qm_needle_acc(q, k, -1);
      if (q->bad || a < 0) continue;
      snprintf(line, sizeof line, "  %-28.28s %5.1f", q->name, 100.0 * a);
      for (c = 0; c < R->n_nctx; c++) {
        size_t l = strlen(line);
        snprintf(line + l, sizeof line - l, " | %5s", "");
        for (d = 0; d < R->n_ndep; d++) {
          l = strlen(line);
          if (q->nd_n[k][c][d])
            snprintf(line + l, sizeof line - l, " %3.0f", 100.0 * q->nd_ok[k][c][d] / q->nd_n[k][c][d]);
          else
            snprintf(line + l, sizeof line - l, "   -");
        }
      }
      text("%s\n", line);
    }
  }
}

/* The table of every configuration (table mode), the published anchors and what this model shows
   beside them. */
static void qm_table(qm_run *R) {
  const double ref_loss = R->ref.nll / (double)R->ref.n_nll;
  int i, j;
  char title[3000];
    if (g_fmt == OUT_TABLE) {
      static const vcol vv[] = {{C_SCHEME, "kind", FM_STR},        {C_NAME, "config", FM_STR},
                                {C_BPT, "B/token", FM_SEP},        {C_BHELD, "KV B @seq_len", FM_SEP},
                                {C_LOSS, "loss", FM_F3},           {C_PPL, "ppl", FM_F2},
                                {C_DLOSS, "d loss", FM_E},         {C_KL, "KL mean", FM_E},
                                {C_KLQ1, "KL 1st 1/4", FM_E},      {C_KLQ4, "KL last 1/4", FM_E},
                                {C_PK25, "pk .25", FM_F2},         {C_PK50, "pk .5", FM_F2},
                                {C_PK90, "pk .9", FM_F2},          {C_TOKS, "tok/s", FM_SEP},
                                {C_KVASHARE, "in kvattn", FM_PCT}, {C_PASS, "check", FM_STR},
                                {C_NOTE, "note", FM_STR}};
      long n_tok = R->ref.n_nll;
      int pk_per = R->n_cases / 3;
      snprintf(title, sizeof title,
               "KV-cache configurations on the trained model in %s: %d layers, dim %d, %d heads, %d KV heads, head "
               "dim %d,\n"
               "  vocab %d, seq_len %d, %d thread(s). Loss over %ld held-out tokens (heldout.ids) in %d window(s) of %d, "
               "each from\n"
               "  an empty cache, as `kvattn_run MODEL --ppl-tokens IDS` (eviction rows token by token, so the policy "
               "acts).\n"
               "  f32 reference: loss %.6f nats, perplexity %.4f. d loss = loss - the reference's; KL = KL(p_f32 || "
               "p_config)\n"
               "  in nats per position, mean over all positions and over the first / last quarter of each window "
               "(positions\n"
               "  0..%d / %d..%d). B/token = llm_cache_bytes_per_token (kva_cache_bytes_per_token: all layers, K+V+"
               "scales);\n"
               "  KV B @seq_len = bytes of the tokens held at the end of a full window. pk = passkey exact-match "
               "accuracy\n"
               "  (%d case(s) per distance 0.25 / 0.5 / 0.9 of seq_len; greedy after BOS + the prompt). tok/s = its "
               "greedy decode\n"
               "  steps (context ~%d), in kvattn = their share inside kvattn calls (RoPE, append, store, attend).\n"
               "  fp8: scale 1, or kva_fp8_calibrate's MSE rule on K and V of calib.txt's first %d tokens (as "
               "kvattn_run --fp8-calib).\n"
               "  mixed: K and V in f16 on the first and last %d layer(s), the rest int8 / fp8_e4m3 (calibrated "
               "scales) / int4.\n"
               "  int4: a scale and a minimum per 32 values, two codes per byte; k/v: K and V in different types "
               "(K int8 + V int4,\n"
               "  K int4 + V int8: which of the two int4 costs more). check: bytes per token = every layer's K and V "
               "rows in their\n"
               "  types (f32 4, f16 2, fp8 1 B/value; int8 1 B/value + a 4-byte scale; int4 24 B per 32 values).\n"
               "  eviction rows: F32 storage; budgets in %% of seq_len (tokens: kvattn_run --evict window:B[:4] / "
               "h2o:B:4:B/2);\n"
               "  H2O keeps 4 sinks and n_recent = budget/2 (the H2O paper's half heavy, half recent) beside its heavy "
               "hitters.",
               R->dir, R->L, R->md.c.dim, R->md.c.n_heads, R->md.c.n_kv_heads, R->md.c.head_dim, R->V, R->W, R->threads, n_tok, R->n_win, R->W, ref_loss,
               exp(ref_loss), R->W / 4 - 1, R->W - R->W / 4, R->W - 1, pk_per, R->n_cases ? R->cases[0].n : 0, R->W, R->n_edge);
      print_table(title, vv, NV(vv), &R->t, C_SCHEME);
      /* published anchors and a comparison */
      text("\nPublished anchors (other models, other setups; for orientation):\n"
           "  llama.cpp pull request #7412 (github.com/ggerganov/llama.cpp/pull/7412): a q8_0 K+V cache on Llama models "
           "costs\n"
           "    about +0.002 perplexity; mean KL divergence 0.00098, against 0.00019 for an f16 cache.\n"
           "  StreamingLLM (Xiao et al. 2023, arXiv:2309.17453): a window cache without the first tokens collapses "
           "once they\n"
           "    are evicted; keeping 4 attention sinks stays close to the full cache.\n"
           "  H2O (Zhang et al. 2023, arXiv:2306.14048): a 20%% heavy-hitter budget (10%% heavy + 10%% recent) is "
           "close to the\n"
           "    full cache on their tasks.\n");
      {
        const qm_cfg *f16 = NULL, *i8 = NULL, *i4 = NULL, *i4e = NULL, *k8v4 = NULL, *k4v8 = NULL, *win[MAXL] = {0}, *sink[MAXL] = {0}, *h2o[MAXL] = {0};
        const qm_cfg *i8r = NULL, *i4r = NULL; /* with rotated keys */
        const qm_cfg *i8q = NULL, *i4q = NULL; /* with integer scores */
        int b20 = -1;
        for (i = 0; i < R->n_cfg; i++) {
          const qm_cfg *q = &R->cf[i];
          if (q->bad) continue;
          if (q->int_values) continue; /* (their own lines in the table) */
          if (q->kind == QK_STORE && q->co.rotate) *(q->co.k_dtype == KVA_INT4 ? &i4r : &i8r) = q;
          if (q->kind == QK_STORE && q->co.rotate) continue;
          if (q->kind == QK_STORE && q->int_scores) *(q->co.k_dtype == KVA_INT4 ? &i4q : &i8q) = q;
          if (q->kind == QK_STORE && q->int_scores) continue;
          if (q->kind == QK_STORE && q->co.k_dtype == KVA_F16) f16 = q;
          if (q->kind == QK_STORE && q->co.k_dtype == KVA_INT8) i8 = q;
          if (q->kind == QK_STORE && q->co.k_dtype == KVA_INT4) i4 = q;
          if (q->kind == QK_MIXED && q->co.k_dtype == KVA_INT4) i4e = q;
          if (q->kind == QK_KV) *(q->co.k_dtype == KVA_INT4 ? &k4v8 : &k8v4) = q;
          if (q->kind == QK_EVICT && !q->sel && !q->tokens)
            for (j = 0; j < R->o->n_budgets; j++)
              if (q->pct == R->o->budgets[j]) {
                if (q->ev.kind == KVA_EVICT_H2O) h2o[j] = q;
                else if (q->ev.n_sink) sink[j] = q;
                else win[j] = q;
                if (R->o->budgets[j] == 20) b20 = j;
              }
        }
        text("Here (the f32 cache as the reference):\n");
        if (f16 && i8)
          text("  int8 (one float scale per token and KV head: groups of %d values, as q8_0's 32) KL %.2e vs llama.cpp "
               "q8_0 9.8e-04;\n    f16 KL %.2e vs 1.9e-04 there; int8 perplexity %+.4f (%+.3f%%) vs about +0.002\n",
               R->md.c.head_dim, i8->kl[0] / (double)i8->n_kl[0], f16->kl[0] / (double)f16->n_kl[0],
               exp(i8->nll / (double)i8->n_nll) - exp(ref_loss),
               100.0 * (exp(i8->nll / (double)i8->n_nll - ref_loss) - 1.0));
        if (i8 && i4) {
          double kl8 = i8->kl[0] / (double)i8->n_kl[0], kl4 = i4->kl[0] / (double)i4->n_kl[0];
          text("  int4 KL %.2e (%.1fx int8's), d loss %+.4f (perplexity %+.3f%%) in %.0f%% of int8's bytes",
               kl4, kl4 / kl8, i4->nll / (double)i4->n_nll - ref_loss,
               100.0 * (exp(i4->nll / (double)i4->n_nll - ref_loss) - 1.0), 100.0 * (double)i4->bpt / (double)i8->bpt);
          if (i4e)
            text(";\n    with f16 first and last layers KL %.2e, d loss %+.4f in %.0f%% of int8's bytes",
                 i4e->kl[0] / (double)i4e->n_kl[0], i4e->nll / (double)i4e->n_nll - ref_loss,
                 100.0 * (double)i4e->bpt / (double)i8->bpt);
          text("\n");
        }
        if (k8v4 && k4v8) {
          /* a difference: one KL more than 1.25x the other */
          double a = k8v4->kl[0] / (double)k8v4->n_kl[0], b = k4v8->kl[0] / (double)k4v8->n_kl[0];
          text("  K against V: K int8 + V int4 KL %.2e (d loss %+.4f), K int4 + V int8 KL %.2e (d loss %+.4f): %s\n", a,
               k8v4->nll / (double)k8v4->n_nll - ref_loss, b, k4v8->nll / (double)k4v8->n_nll - ref_loss,
               b > 1.25 * a ? "int4 costs more on K" : a > 1.25 * b ? "int4 costs more on V" : "about the same either way");
        }
        if (i8 && i4 && i8r && i4r)
          text("  rotated keys (kva_cache_desc.rotate): int8 KL %.2e -> %.2e, int4 KL %.2e -> %.2e (head dim %d)\n",
               i8->kl[0] / (double)i8->n_kl[0], i8r->kl[0] / (double)i8r->n_kl[0], i4->kl[0] / (double)i4->n_kl[0],
               i4r->kl[0] / (double)i4r->n_kl[0], R->md.c.head_dim);
        if (i8 && i4 && i8q && i4q)
          text("  integer scores (kva_attn.int_scores, int8 query codes): int8 KL %.2e -> %.2e, int4 KL %.2e -> %.2e\n",
               i8->kl[0] / (double)i8->n_kl[0], i8q->kl[0] / (double)i8q->n_kl[0], i4->kl[0] / (double)i4->n_kl[0],
               i4q->kl[0] / (double)i4q->n_kl[0]);
        if (b20 < 0 && R->o->n_budgets > 0) b20 = 0;
        if (b20 >= 0 && win[b20] && sink[b20] && h2o[b20]) {
          /* collapse: perplexity x1.5 or more; close: within 2 %; a difference: more than 10 % of the larger
             added loss + 0.001 nats */
          double lw = win[b20]->nll / (double)win[b20]->n_nll - ref_loss,
                 ls = sink[b20]->nll / (double)sink[b20]->n_nll - ref_loss,
                 lh = h2o[b20]->nll / (double)h2o[b20]->n_nll - ref_loss;
          double tws = 0.1 * (fabs(lw) > fabs(ls) ? fabs(lw) : fabs(ls)) + 1e-3,
                 tsh = 0.1 * (fabs(lh) > fabs(ls) ? fabs(lh) : fabs(ls)) + 1e-3;
          text("  at %ld%% of seq_len (%d tokens), d loss (perplexity change, KL mean):\n"
               "    WINDOW without sinks %+.4f (%+.2f%%, %.1e): %s;\n"
               "    WINDOW + 4 sinks %+.4f (%+.2f%%, %.1e): %s;\n"
               "    H2O %+.4f (%+.2f%%, %.1e): %s; %s the window with sinks\n"
               "    (collapse = perplexity x1.5 or more; close = within 2%%; a difference = more than 10%% of the larger "
               "d loss + 0.001)\n",
               R->o->budgets[b20], win[b20]->ev.budget, lw, 100.0 * (exp(lw) - 1.0), win[b20]->kl[0] / win[b20]->n_kl[0],
               lw > log(1.5) ? "collapses, as StreamingLLM reports" : "no collapse, unlike StreamingLLM's models", ls,
               100.0 * (exp(ls) - 1.0), sink[b20]->kl[0] / sink[b20]->n_kl[0],
               ls < lw - tws ? "the sinks help" : ls > lw + tws ? "the sinks hurt" : "the sinks make no difference",
               lh, 100.0 * (exp(lh) - 1.0), h2o[b20]->kl[0] / h2o[b20]->n_kl[0],
               lh < log(1.02) ? "close to the full cache, as H2O reports" : "not close to the full cache, unlike H2O",
               lh < ls - tsh ? "better than" : lh > ls + tsh ? "worse than" : "about equal to");
        }
      }
    }
}

/* One row per configuration with its checks; the table, the anchors and the comparisons. */
static int qm_rows(qm_run *R) {
  int i;
  /* ---- rows and checks */
  {
    const double ref_loss = R->ref.nll / (double)R->ref.n_nll;
    const size_t per = (size_t)2 * R->L * R->md.c.n_kv_heads * R->md.c.head_dim;
    for (i = 0; i < R->n_cfg; i++) {
      qm_cfg *q = &R->cf[i];
      row *r = rows_add(&R->t, "model");
      double loss = q->n_nll ? q->nll / (double)q->n_nll : NAN;
      int d;
      char chk[256]; /* "FAIL " and a message of up to 239 bytes */
      chk[0] = 0;
      rs(r, C_SCHEME, "%s", qk_name[q->kind]);
      rs(r, C_NAME, "%s", q->name);
      rs(r, C_MODEL, "%s", R->dir);
      rn(r, C_LAYERS, R->L);
      rn(r, C_HEADS, R->md.c.n_heads);
      rn(r, C_KVHEADS, R->md.c.n_kv_heads);
      rn(r, C_HEADDIM, R->md.c.head_dim);
      rn(r, C_CTX, R->W);
      rn(r, C_THREADS, R->threads);
      if (q->kind == QK_KV) rs(r, C_DTYPE, "%s/%s", kva_dtype_name(q->co.k_dtype), kva_dtype_name(q->co.v_dtype));
      else rs(r, C_DTYPE, "%s", q->kind == QK_MIXED ? "mixed" : kva_dtype_name(q->co.k_dtype));
      rn(r, C_BPT, (double)q->bpt);
      if (q->kind == QK_FP8 || (q->kind == QK_MIXED && q->co.k_scale > 0)) {
        rn(r, C_KSCALE, q->co.k_scale);
        rn(r, C_VSCALE, q->co.v_scale);
      }
      if (q->kind == QK_EVICT) {
        /* the policy's budget is not the tokens kept / read */
        int by_share = q->sel || QM_COMPRESSES(q);
        rs(r, C_POLICY, "%s", qm_policy(q));
        rn(r, C_BUDGET, by_share ? qm_budget(q, R->W) : q->ev.budget);
        rn(r, C_BUDGETFRAC, by_share ? qm_budget(q, R->W) / (double)R->W : (double)q->ev.budget / R->W);
        rn(r, C_NSINK, q->ev.n_sink);
        if (q->ev.kind == KVA_EVICT_H2O) rn(r, C_NRECENT, q->ev.n_recent);
        if (q->ev.kind == KVA_EVICT_SCORE) rn(r, C_NRECENT, q->ev.n_recent);
        {
          /* a compression holds its slots: the budget, or the fullest head's count (measured) */
          double held = QM_COMPRESSES(q) ? qm_budget(q, R->W) * (q->slots_ratio > 1.0 ? q->slots_ratio : 1.0)
                        : !q->sel && q->ev.budget < R->W ? q->ev.budget : R->W;
          if (held > R->W) held = R->W;
          /* demotion keeps the rest of the context at the demoted type's bytes */
          rn(r, C_BHELD, (double)q->bpt * held + (double)q->dm_bpt * (R->W - held));
        }
      } else {
        rs(r, C_POLICY, "none");
        rn(r, C_BHELD, (double)q->bpt * R->W);
      }
      if (q->bad) {
        rs(r, C_NOTE, "%s", q->msg);
        rs(r, C_PASS, "ERROR");
        g_failed = 1;
        R->ok_all = 0;
        continue;
      }
      rn(r, C_TOKENS, (double)q->n_nll);
      if (q->n_nll) { /* (SnapKV's rows have none) */
        rn(r, C_LOSS, loss);
        rn(r, C_PPL, exp(loss));
        rn(r, C_DLOSS, loss - ref_loss);
        rn(r, C_KL, q->kl[0] / (double)(q->n_kl[0] ? q->n_kl[0] : 1));
      }
      if (q->n_kl[1]) rn(r, C_KLQ1, q->kl[1] / (double)q->n_kl[1]);
      if (q->n_kl[2]) rn(r, C_KLQ4, q->kl[2] / (double)q->n_kl[2]);
      for (d = 0; d < 3; d++)
        if (q->pk_n[d]) rn(r, d == 0 ? C_PK25 : d == 1 ? C_PK50 : C_PK90, (double)q->pk_ok[d] / q->pk_n[d]);
      rn(r, C_PKN, (double)(q->pk_n[0] + q->pk_n[1] + q->pk_n[2]));
      if (q->n_dec) {
        rn(r, C_TOKS, (double)q->n_dec / q->t_dec);
        rn(r, C_KVASHARE, q->t_kva / q->t_dec);
      }
      /* checks */
      if (!isfinite(loss) && !QM_COMPRESSES(q)) snprintf(chk, sizeof chk, "FAIL loss is not finite");
      else if (q->held_bad) snprintf(chk, sizeof chk, "FAIL %s", q->msg);
      else if (q->pk_n[0] + q->pk_n[1] + q->pk_n[2] != R->n_cases || q->pk_ok[0] > q->pk_n[0] ||
               q->pk_ok[1] > q->pk_n[1] || q->pk_ok[2] > q->pk_n[2])
        snprintf(chk, sizeof chk, "FAIL passkey: %d of %d cases run", q->pk_n[0] + q->pk_n[1] + q->pk_n[2], R->n_cases);
      else if (q->kind == QK_STORE && q->co.k_dtype == KVA_F32) {
        q->checked = 1;
        if (q->kl[0] != 0.0 || q->nll != R->ref.nll)
          snprintf(chk, sizeof chk, "FAIL a second f32 run differs from the reference (KL %.3g, loss %.9g vs %.9g)",
                   q->kl[0], loss, ref_loss);
        else if (q->bpt != per * 4)
          snprintf(chk, sizeof chk, "FAIL %lu bytes per token, want 2 x layers x KV heads x head dim x 4 = %lu",
                   (unsigned long)q->bpt, (unsigned long)(per * 4));
      } else if (q->kind == QK_STORE && q->co.k_dtype == KVA_F16) {
        double kl = q->kl[0] / (double)(q->n_kl[0] ? q->n_kl[0] : 1);
        q->checked = 1;
        if (!(kl < QM_F16_KL_MAX) || kl < 0)
          snprintf(chk, sizeof chk, "FAIL f16 KL %.3g not in [0, %g)", kl, QM_F16_KL_MAX);
        else if (q->bpt != per * 2)
          snprintf(chk, sizeof chk, "FAIL %lu bytes per token, want 2 x layers x KV heads x head dim x 2 = %lu",
                   (unsigned long)q->bpt, (unsigned long)(per * 2));
      } else if (q->kind == QK_EVICT)
        q->checked = 1;
      if (!chk[0]) { /* every configuration: its bytes per token from the storage formats */
        size_t want = qm_expect_bpt(&q->co, R->L, R->md.c.n_kv_heads, R->md.c.head_dim);
        q->checked = 1;
        if (q->bpt != want)
          snprintf(chk, sizeof chk, "FAIL %lu bytes per token, want %lu (every layer's K and V rows in their types)",
                   (unsigned long)q->bpt, (unsigned long)want);
      }
      if (chk[0]) {
        rs(r, C_PASS, "FAIL");
        rs(r, C_NOTE, "%s", chk);
        g_failed = 1;
        R->ok_all = 0;
      } else {
        rs(r, C_PASS, q->checked ? "ok" : "");
        if (q->kind == QK_FP8 || (q->kind == QK_MIXED && q->co.k_scale > 0))
        {
          const float *ks = q->co.head_k_scale ? q->co.head_k_scale : q->co.layer_k_scale;
          const float *vs = q->co.head_v_scale ? q->co.head_v_scale : q->co.layer_v_scale;
          size_t n = q->co.head_k_scale ? (size_t)R->L * (size_t)R->md.c.n_kv_heads : (size_t)R->L;
          if (ks)
            rs(r, C_NOTE, "scales K %s, V %s", qm_range(ks, n, 0), qm_range(vs, n, 1));
          else
            rs(r, C_NOTE, "scales K %.3g V %.3g", q->co.k_scale, q->co.v_scale);
        }
        else if (q->kind == QK_STORE && q->co.k_dtype == KVA_F32)
          rs(r, C_NOTE, "a second run: bit-identical to the reference");
        else if (q->kind == QK_EVICT && q->dm_bpt)
          rs(r, C_NOTE, "the evicted kept at %s, %lu bytes per token (held %lu)", kva_dtype_name(q->co.demote_dtype),
             (unsigned long)q->dm_bpt, (unsigned long)q->bpt);
        else if (q->kind == QK_EVICT && QM_COMPRESSES(q) && q->slots_ratio > 1.0)
          rs(r, C_NOTE, "a prompt compressed once to %d%% on average; slots %.2fx of that (the fullest head)", q->pct,
             q->slots_ratio);
        else if (q->kind == QK_EVICT && QM_COMPRESSES(q))
          rs(r, C_NOTE, "a prompt compressed once to %d%% (needle, passkey; no streaming loss)", q->pct);
        else if (q->kind == QK_EVICT && q->sel)
          rs(r, C_NOTE, "holds every token; reads %d per query token and KV head", qm_budget(q, R->W));
        else if (q->kind == QK_EVICT)
          rs(r, C_NOTE, "held = min(tokens, %d) after every step", q->ev.budget);
      }
    }
    if (g_fmt == OUT_TABLE) qm_table(R);
  }
  text("model part checks: %s\n",
       R->ok_all ? "passed (f32 twice bit-identical: KL 0, the same loss; f16 KL below 1e-3; f32 / f16 bytes per token "
                "= 2 x layers x KV heads x head dim x 4 / 2; every configuration's bytes per token from the storage formats; every loss finite; every configuration ran every passkey case; eviction holds min(tokens, budget))"
              : "FAILED (see FAIL / ERROR above)");
  return 1;
}

/* The model part (loss, KL, passkeys), the needle part, or both over one set of configurations. */
static void qm_go(const opts *o, int do_loss, int do_needle) {
  qm_run run, *R = &run;
  int i;
  memset(R, 0, sizeof *R);
  R->o = o;
  R->dir = o->model_dir ? o->model_dir : "bench/model";
  if (o->model_file) snprintf(R->model_path, sizeof R->model_path, "%s", o->model_file);
  else snprintf(R->model_path, sizeof R->model_path, "%s/model.bin", R->dir);
  if (o->tokenizer_file) snprintf(R->tok_path, sizeof R->tok_path, "%s", o->tokenizer_file);
  else snprintf(R->tok_path, sizeof R->tok_path, "%s/tokenizer.bin", R->dir);
  R->do_loss = do_loss;
  R->do_needle = do_needle;
  R->threads = o->n_threads > 0 ? (int)o->threads[0] : 1;
  R->t_start = now_s();
  R->cal[0][0] = R->cal[0][1] = R->cal[1][0] = R->cal[1][1] = 1.0f;
  R->ok_all = 1;
  if (qm_load(R) && qm_fp8_scales(R) && qm_configurations(R) && (!do_loss || (qm_loss_kl(R) && qm_passkeys(R))) &&
      (!do_needle || qm_needles(R))) {
    if (do_loss) qm_rows(R);
    if (do_needle) qm_needle_rows(R);
  }
  progress_end();
  emit_rows(&R->t);
  rows_free(&R->t);
  if (R->cf)
    for (i = 0; i < R->n_cfg; i++)
      if (R->cf[i].c) kva_cache_destroy(R->cf[i].c);
  if (R->ref.c) kva_cache_destroy(R->ref.c);
  for (i = 0; i < R->n_cases; i++) free(R->cases[i].tok);
  free(R->cases);
  needle_set_free(&R->nd[0]);
  needle_set_free(&R->nd[1]);
  free(R->cf);
  free(R->lcal);
  free(R->hcal);
  free(R->lp);
  free(R->pp);
  free(R->ids);
  llm_state_free(&R->st);
  if (R->have_tz) llm_tokenizer_free(&R->tz);
  llm_model_free(&R->md);
}

/* part model; with part needle too when the model directory has needle cases */
void quality_model(const opts *o, const machine *m) {
  char p1[1200], p2[1200];
  const char *dir = o->model_dir ? o->model_dir : "bench/model";
  (void)m;
  snprintf(p1, sizeof p1, "%s/needle_single.tsv", dir);
  snprintf(p2, sizeof p2, "%s/needle_multi.tsv", dir);
  qm_go(o, 1, (o->parts & PART_NEEDLE) && (o->text_file || qm_exists(p1) || qm_exists(p2)));
}

/* part needle alone (with part model, quality_model runs it) */
void quality_needle(const opts *o, const machine *m) {
  (void)m;
  if (o->parts & PART_MODEL) return;
  qm_go(o, 0, 1);
}
