/* bench/bench_seq.c - kvattn_bench paged, part export: a long sequence through kva_seq_export /
   kva_seq_import against a memcpy of the same bytes, and the imported copy checked to continue
   bit-identically; speed, part tree: verifying 16 draft tokens with one tree-attention call
   (kva_attn.tree_parent) against 16 single-token decode steps, and kva_seq_accept of the
   accepted path. */
#include "harness.h"

#define SEQ_MAXREPS 256

/* ---- a multi-layer sequence of random K/V ---- */

/* n_tokens more tokens of random K/V in every layer, in appends of at most 256 tokens */
static kva_status seq_fill(kva_cache *c, int seq, const shape *s, int n_layers, long n_tokens, uint64_t *rng) {
  const long chunk = 256;
  long done = 0;
  kva_status st;
  int l;
  while (done < n_tokens) {
    long n = n_tokens - done < chunk ? n_tokens - done : chunk;
    size_t nk = (size_t)n * (size_t)s->G * (size_t)s->D, nv = (size_t)n * (size_t)s->G * (size_t)s->DV;
    if ((st = kva_seq_append(c, seq, (int)n)) != KVA_OK) return st;
    for (l = 0; l < n_layers; l++)
      if ((st = kva_store(c, seq, l, pool_at(rng, nk), pool_at(rng, nv), (int)n)) != KVA_OK) return st;
    done += n;
  }
  return KVA_OK;
}

static kva_cache_desc seq_desc(const shape *s, int n_layers, kva_dtype dt, int evict_support, long tokens) {
  kva_cache_desc d;
  memset(&d, 0, sizeof d);
  d.kind = s->kind;
  d.n_layers = n_layers;
  d.n_kv_heads = s->G;
  d.head_dim = s->D;
  d.dtype = dt;
  d.k_scale = d.v_scale = 1.0f;
  d.block_size = 16;
  d.n_blocks = (int)((tokens + 15) / 16) + 1; /* + 1: the continuation check appends one token */
  d.max_seqs = 4;
  d.evict_support = evict_support;
  return d;
}

/* ======================================================================
   paged export: kva_seq_export / kva_seq_import against memcpy
   ====================================================================== */

enum { XO_MEMCPY, XO_EXPORT, XO_IMPORT, NXO };
static const char *const xo_name[NXO] = {"memcpy", "kva_seq_export", "kva_seq_import"};

typedef struct {
  kva_cache *src, *dst;
  int seq, imp;
  unsigned char *buf, *copy; /* the stream; memcpy's destination */
  size_t size;
} xjob;

static volatile unsigned char g_xsink;

static kva_status xrun(xjob *j, int op) {
  size_t got = 0;
  kva_status st;
  switch (op) {
    case XO_MEMCPY:
      memcpy(j->copy, j->buf, j->size);
      g_xsink = j->copy[j->size / 2];
      return KVA_OK;
    case XO_EXPORT:
      st = kva_seq_export(j->src, j->seq, j->buf, j->size, &got);
      return st == KVA_OK && got != j->size ? KVA_ERR_ARG : st;
    default: return kva_seq_import(j->dst, j->buf, j->size, &j->imp);
  }
}

/* The three operations timed in turns (the first one rotating), the caches flushed before
   every call (1 thread); the imported sequence is freed after each import, untimed. One
   warm-up call each first (it faults the buffers and the target's pool in). Repetitions as
   time_calls: --reps, or more for fast calls (up to ~0.15 s of the slowest, at most 15). */
static void xtime(xjob *j, int reps, timing *out) {
  static const int warm_order[NXO] = {XO_EXPORT, XO_MEMCPY, XO_IMPORT};
  double ts[NXO][SEQ_MAXREPS], slow = 0;
  int i, k, op;
  memset(out, 0, NXO * sizeof *out);
  for (k = 0; k < NXO; k++) {
    double t0 = now_s(), t1;
    op = warm_order[k];
    out[op].st = xrun(j, op);
    t1 = now_s() - t0;
    if (out[op].st != KVA_OK) return;
    if (op == XO_IMPORT) kva_seq_free(j->dst, j->imp);
    if (t1 > slow) slow = t1;
  }
  if (!g_reps_exact) {
    int want = slow > 0 ? (int)(0.15 / slow) : SEQ_MAXREPS;
    if (want > 15) want = 15;
    if (want > reps) reps = want;
  }
  if (reps > SEQ_MAXREPS) reps = SEQ_MAXREPS;
  if (reps < 1) reps = 1;
  for (i = 0; i < reps; i++)
    for (k = 0; k < NXO; k++) {
      double t0;
      kva_status st;
      op = (i + k) % NXO;
      flush_caches(1);
      t0 = now_s();
      st = xrun(j, op);
      ts[op][i] = now_s() - t0;
      if (st != KVA_OK) {
        out[op].st = st;
        return;
      }
      if (op == XO_IMPORT) kva_seq_free(j->dst, j->imp);
    }
  for (op = 0; op < NXO; op++) {
    qsort(ts[op], (size_t)reps, sizeof ts[op][0], cmp_double);
    out[op].mn = ts[op][0];
    out[op].mx = ts[op][reps - 1];
    out[op].med = reps % 2 ? ts[op][reps / 2] : 0.5 * (ts[op][reps / 2 - 1] + ts[op][reps / 2]);
  }
}

/* The import against its source: the same len and pos, a re-export byte-identical to the
   stream, every layer's attention output the same bits, and after one more token (the same K/V
   stored in both) again. Returns 1 when all hold; why in msg otherwise. */
static int xcheck(xjob *j, const shape *s, int n_layers, uint64_t *rng, char *msg, size_t n) {
  kva_attn a = shape_attn(s, 1);
  size_t qn = (size_t)s->H * (size_t)s->D, on = (size_t)s->H * (size_t)s->DV, kn = (size_t)s->G * (size_t)s->D,
         got = 0;
  float *q = rand_floats(qn, rng), *o1 = (float *)xalloc(on * 4), *o2 = (float *)xalloc(on * 4);
  kva_status st;
  int l, step, ok = 0;
  if ((st = kva_seq_import(j->dst, j->buf, j->size, &j->imp)) != KVA_OK) {
    snprintf(msg, n, "import: %s", kva_status_str(st));
    goto out;
  }
  if (kva_seq_len(j->dst, j->imp) != kva_seq_len(j->src, j->seq) ||
      kva_seq_pos(j->dst, j->imp) != kva_seq_pos(j->src, j->seq)) {
    snprintf(msg, n, "MISMATCH: imported len/pos %d/%d, source %d/%d", kva_seq_len(j->dst, j->imp),
             kva_seq_pos(j->dst, j->imp), kva_seq_len(j->src, j->seq), kva_seq_pos(j->src, j->seq));
    goto out;
  }
  if ((st = kva_seq_export(j->dst, j->imp, j->copy, j->size, &got)) != KVA_OK || got != j->size ||
      memcmp(j->copy, j->buf, j->size) != 0) {
    snprintf(msg, n, "MISMATCH: re-export of the import (%s, %zu bytes) differs from the stream", kva_status_str(st),
             got);
    goto out;
  }
  for (step = 0; step < 2; step++) {
    if (step == 1) { /* continue both: one more token, the same K/V in every layer */
      if ((st = kva_seq_append(j->src, j->seq, 1)) != KVA_OK || (st = kva_seq_append(j->dst, j->imp, 1)) != KVA_OK) {
        snprintf(msg, n, "append: %s", kva_status_str(st));
        goto out;
      }
      for (l = 0; l < n_layers; l++) {
        const float *k = pool_at(rng, kn), *v = pool_at(rng, kn);
        if ((st = kva_store(j->src, j->seq, l, k, v, 1)) != KVA_OK || (st = kva_store(j->dst, j->imp, l, k, v, 1)) != KVA_OK) {
          snprintf(msg, n, "store: %s", kva_status_str(st));
          goto out;
        }
      }
    }
    for (l = 0; l < n_layers; l++) {
      if ((st = kva_attend_cache(j->src, j->seq, l, &a, q, 1, o1)) != KVA_OK ||
          (st = kva_attend_cache(j->dst, j->imp, l, &a, q, 1, o2)) != KVA_OK) {
        snprintf(msg, n, "attend: %s", kva_status_str(st));
        goto out;
      }
      if (memcmp(o1, o2, on * 4) != 0) {
        snprintf(msg, n, "MISMATCH: layer %d attention %s differs", l, step ? "after one more token" : "");
        goto out;
      }
    }
  }
  ok = 1;
out:
  free(q);
  free(o1);
  free(o2);
  return ok;
}

void paged_export(const opts *o, const machine *m) {
  static const kva_dtype def_dt[] = {KVA_F16, KVA_INT8};
  const int n_layers = 2;
  shape s = variant_shape(V_GQA, o->H, o->G, o->D);
  kva_dtype dts[MAXL + 1];
  int evs[MAXL + 1], n_cfg = 0, ci, k;
  long tokens = 0;
  uint64_t rng = o->seed + 41;
  rows t = {0};
  char title[1600], ts[32];
  if (!m) flush_init(o->flush_bytes); /* paged without attn measured nothing: no flush buffer yet */
  pool_init(o->seed);
  for (k = 0; k < o->n_ctx; k++)
    if (o->ctx[k] > tokens) tokens = o->ctx[k];
  /* each dtype (--dtypes, default f16 and int8) with evict_support ALL, then the first with NONE */
  for (k = 0; k < (o->dtypes_set ? o->n_dtypes : NV(def_dt)) && k < MAXL; k++) {
    dts[n_cfg] = o->dtypes_set ? o->dtypes[k] : def_dt[k];
    evs[n_cfg++] = KVA_EVICT_SUPPORT_ALL;
  }
  dts[n_cfg] = dts[0];
  evs[n_cfg++] = KVA_EVICT_SUPPORT_NONE;
  for (ci = 0; ci < n_cfg; ci++) {
    kva_cache_desc d = seq_desc(&s, n_layers, dts[ci], evs[ci], tokens + 1);
    size_t bpt = kva_cache_bytes_per_token(&d);
    xjob j;
    timing tm[NXO];
    kva_status st;
    row *w[NXO];
    char msg[200] = "";
    int op, ok = 0;
    memset(&j, 0, sizeof j);
    for (op = 0; op < NXO; op++) {
      w[op] = rows_add(&t, "paged_export");
      set_shape_cols(w[op], &s, dts[ci]);
      rs(w[op], C_MODE, "evict %s", evs[ci] == KVA_EVICT_SUPPORT_ALL ? "ALL" : "NONE");
      rs(w[op], C_NAME, "%s", xo_name[op]);
      rn(w[op], C_LAYERS, n_layers);
      rn(w[op], C_CTX, (double)tokens);
      rn(w[op], C_BLOCK, 16);
      rn(w[op], C_THREADS, 1);
      rn(w[op], C_BPT, (double)bpt);
    }
    progress("paged export %s evict %s: filling %ld tokens x %d layers", kva_dtype_name(dts[ci]),
             evs[ci] == KVA_EVICT_SUPPORT_ALL ? "ALL" : "NONE", tokens, n_layers);
    if ((st = kva_cache_create(&d, &j.src)) != KVA_OK || (st = kva_cache_create(&d, &j.dst)) != KVA_OK ||
        (st = kva_seq_new(j.src, &j.seq)) != KVA_OK || (st = seq_fill(j.src, j.seq, &s, n_layers, tokens, &rng)) != KVA_OK ||
        (st = kva_seq_export(j.src, j.seq, NULL, 0, &j.size)) != KVA_OK) {
      snprintf(msg, sizeof msg, "ERROR setup: %s", kva_status_str(st));
      goto done;
    }
    j.buf = (unsigned char *)xalloc(j.size);
    j.copy = (unsigned char *)xalloc(j.size);
    progress("paged export %s evict %s: timing (%.0f MiB stream)", kva_dtype_name(dts[ci]),
             evs[ci] == KVA_EVICT_SUPPORT_ALL ? "ALL" : "NONE", (double)j.size / MiB);
    xtime(&j, o->reps, tm);
    for (op = 0; op < NXO; op++)
      if (tm[op].st != KVA_OK) {
        snprintf(msg, sizeof msg, "ERROR %s: %s", xo_name[op], kva_status_str(tm[op].st));
        goto done;
      }
    progress("paged export %s evict %s: checking the import", kva_dtype_name(dts[ci]),
             evs[ci] == KVA_EVICT_SUPPORT_ALL ? "ALL" : "NONE");
    ok = xcheck(&j, &s, n_layers, &rng, msg, sizeof msg);
    for (op = 0; op < NXO; op++) {
      set_timing(w[op], &tm[op]);
      rn(w[op], C_KVBYTES, (double)j.size);
      rn(w[op], C_GBPS, (double)j.size / tm[op].med / 1e9);
      rn(w[op], C_STREAMBPT, (double)j.size / (double)tokens);
      rn(w[op], C_STREAMOVER, (double)j.size / (double)tokens / (double)bpt);
      if (op != XO_MEMCPY) rn(w[op], C_RATIO, tm[XO_MEMCPY].med / tm[op].med);
    }
    rs(w[XO_IMPORT], C_IDENT, ok ? "yes" : "NO");
    rs(w[XO_IMPORT], C_PASS, ok ? "PASS" : "FAIL");
    rs(w[XO_MEMCPY], C_NOTE, "the stream's bytes, buffer to buffer");
    rs(w[XO_EXPORT], C_NOTE, "into a buffer of the size it asked for (buf NULL)");
    if (ok)
      rs(w[XO_IMPORT], C_NOTE, "into a 2nd cache; re-export byte-identical, attention bit-identical before and after "
                               "1 more token");
  done:
    if (msg[0] && !ok) {
      rs(w[XO_IMPORT], C_NOTE, "%s", msg);
      if (!w[XO_IMPORT]->kind[C_PASS]) rs(w[XO_IMPORT], C_PASS, "FAIL");
      g_failed = 1;
    }
    if (j.src) kva_cache_destroy(j.src);
    if (j.dst) kva_cache_destroy(j.dst);
    free(j.buf);
    free(j.copy);
  }
  progress_end();
  if (g_fmt == OUT_TABLE) {
    static const vcol v[] = {{C_DTYPE, "dtype", FM_STR},          {C_MODE, "cache", FM_STR},
                             {C_NAME, "operation", FM_STR},       {C_TMED, "ms med", FM_MS},
                             {C_TMIN, "ms min-max", FM_RANGE},    {C_KVBYTES, "MiB", FM_MIB},
                             {C_GBPS, "GB/s", FM_F2},             {C_RATIO, "vs memcpy", FM_X},
                             {C_STREAMBPT, "stream B/tok", FM_F1}, {C_BPT, "cache B/tok", FM_SEP},
                             {C_STREAMOVER, "stream/cache", FM_F3}, {C_PASS, "check", FM_STR},
                             {C_NOTE, "note", FM_STR}};
    fmt_sep((double)tokens, ts, sizeof ts);
    snprintf(title, sizeof title,
             "Sequence export / import: one sequence of %s tokens (GQA G=%d D=%d, %d layers, block 16) written by\n"
             "  kva_seq_export into a buffer and read back by kva_seq_import into a second cache of the same shape\n"
             "  (the imported sequence freed between calls, untimed), against a memcpy of the stream's bytes; timed\n"
             "  in turns, %.0f MiB read before every call (cold), 1 thread. GB/s = stream bytes / median time; vs\n"
             "  memcpy = memcpy's median time / the operation's (1 = as fast as memcpy: the operation's GB/s over\n"
             "  memcpy's). stream B/tok = stream bytes / tokens; cache B/tok = kva_cache_bytes_per_token (K/V rows\n"
             "  of all layers); evict ALL caches also stream a position and an H2O score per token, KV head and\n"
             "  layer (8 B), NONE ones neither. check: the import's len/pos, its re-export byte for byte, and\n"
             "  kva_attend_cache of every layer against the source (memcmp), then again after one more token.",
             ts, s.G, s.D, n_layers, o->flush_bytes / MiB);
    print_table(title, v, NV(v), &t, C_DTYPE);
  }
  emit_rows(&t);
  rows_free(&t);
}

/* ======================================================================
   speed tree: verifying 16 draft tokens
   ====================================================================== */

#define TREE_N 16
enum { TR_CHAIN, TR_BINARY, TR_TWO8, TR_LINEAR, NTREE };
static const char *const tree_name[NTREE] = {"tree: chain of 16", "tree: binary, depth 0-4", "tree: 2 chains of 8",
                                             "linear causal (no tree)"};

static void tree_parents(int kind, int32_t *p) {
  int i;
  for (i = 0; i < TREE_N; i++)
    p[i] = kind == TR_CHAIN ? i - 1 : kind == TR_BINARY ? (i ? (i - 1) / 2 : -1) : (i >= 2 ? i - 2 : -1);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
  double mx = 0;
  size_t i;
  for (i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= mx)) mx = d; /* NaN propagates */
  }
  return mx;
}

/* kva_seq_accept of a path of 8 of the 16 drafts (keep[]), in a loop: the drafts re-appended and
   re-stored before every call (untimed). Fills w; returns 1 when the last accept left the kept
   tokens' K/V at slots P..P+7 with positions P..P+7. */
static int time_accept(kva_cache *c, int seq, const shape *s, long P, const int32_t *keep, const float *k16,
                       const float *v16, int reps, row *w, char *msg, size_t n) {
  size_t kn = (size_t)s->G * (size_t)s->D;
  float *kb = (float *)xalloc(TREE_N * kn * 4), *vb = (float *)xalloc(TREE_N * kn * 4), *ka = (float *)xalloc(kn * 4),
        *va = (float *)xalloc(kn * 4);
  int32_t *pos = (int32_t *)xalloc((size_t)s->G * sizeof(int32_t));
  double ts[SEQ_MAXREPS], med;
  int i, jj, g, ok = 0, moved = 0;
  kva_status st = KVA_OK;
  if (reps > SEQ_MAXREPS) reps = SEQ_MAXREPS;
  for (jj = 0; jj < 8; jj++) moved += keep[jj] != jj;
  for (i = 0; i <= reps; i++) { /* i == 0: warm-up */
    double t0;
    if ((st = kva_seq_truncate(c, seq, (int)P)) != KVA_OK || (st = kva_seq_append(c, seq, TREE_N)) != KVA_OK ||
        (st = kva_store(c, seq, 0, k16, v16, TREE_N)) != KVA_OK) {
      snprintf(msg, n, "ERROR re-appending the drafts: %s", kva_status_str(st));
      goto out;
    }
    if (i == reps) /* the drafts' K/V as stored, before the last accept */
      for (jj = 0; jj < TREE_N; jj++)
        if ((st = kva_seq_read(c, seq, 0, (int)P + jj, kb + jj * kn, vb + jj * kn, NULL)) != KVA_OK) {
          snprintf(msg, n, "ERROR kva_seq_read: %s", kva_status_str(st));
          goto out;
        }
    t0 = now_s();
    st = kva_seq_accept(c, seq, TREE_N, keep, 8);
    if (i > 0) ts[i - 1] = now_s() - t0;
    if (st != KVA_OK) {
      snprintf(msg, n, "ERROR kva_seq_accept: %s", kva_status_str(st));
      goto out;
    }
  }
  qsort(ts, (size_t)reps, sizeof ts[0], cmp_double);
  med = reps % 2 ? ts[reps / 2] : 0.5 * (ts[reps / 2 - 1] + ts[reps / 2]);
  rn(w, C_TMED, med);
  rn(w, C_TMIN, ts[0]);
  rn(w, C_TMAX, ts[reps - 1]);
  rn(w, C_NSOP, med * 1e9);
  if (moved) rn(w, C_NSTOK, med * 1e9 / moved);
  if (kva_seq_len(c, seq) != P + 8 || kva_seq_pos(c, seq) != P + 8) {
    snprintf(msg, n, "MISMATCH: len/pos %d/%d after accepting 8, want %ld", kva_seq_len(c, seq), kva_seq_pos(c, seq),
             P + 8);
    goto out;
  }
  for (jj = 0; jj < 8; jj++) {
    if ((st = kva_seq_read(c, seq, 0, (int)P + jj, ka, va, pos)) != KVA_OK) {
      snprintf(msg, n, "ERROR kva_seq_read: %s", kva_status_str(st));
      goto out;
    }
    for (g = 0; g < s->G; g++)
      if (pos[g] != (int32_t)(P + jj)) {
        snprintf(msg, n, "MISMATCH: slot %ld head %d after accept at position %d", P + jj, g, (int)pos[g]);
        goto out;
      }
    if (memcmp(ka, kb + (size_t)keep[jj] * kn, kn * 4) || memcmp(va, vb + (size_t)keep[jj] * kn, kn * 4)) {
      snprintf(msg, n, "MISMATCH: slot %ld after accept does not hold draft %d's K/V", P + jj, keep[jj]);
      goto out;
    }
  }
  ok = 1;
out:
  free(kb);
  free(vb);
  free(ka);
  free(va);
  free(pos);
  return ok;
}

void speed_tree(const opts *o, const machine *m) {
  const shape s = variant_shape(V_GQA, o->H, o->G, o->D);
  const size_t qn = (size_t)s.H * (size_t)s.D, on = (size_t)s.H * (size_t)s.DV, kn = (size_t)s.G * (size_t)s.D;
  const size_t bpt = shape_bpt(&s, KVA_F16);
  int32_t par[NTREE][TREE_N], keep_b[8], keep_a[8];
  rows t = {0}, ta = {0};
  uint64_t rng = o->seed + 51;
  int ci, k, mode;
  char title[1400];
  (void)m;
  for (k = 0; k < TR_LINEAR; k++) tree_parents(k, par[k]);
  for (k = 0; k < 8; k++) {
    keep_b[k] = 2 * k + 1; /* the second chain of 2 x 8: every kept token moves down */
    keep_a[k] = k;         /* the chain's first 8: in place (kva_seq_truncate's work) */
  }
  for (ci = 0; ci < o->n_ctx; ci++) {
    long P = o->ctx[ci];
    kva_cache *c = NULL;
    int seq = 0;
    kva_status st;
    float *q = rand_floats(TREE_N * qn, &rng), *k16 = rand_floats(TREE_N * kn, &rng), *v16 = rand_floats(TREE_N * kn, &rng);
    float *out[NTREE + 1];
    call_ctx x[NTREE + 1];
    double diff_lin = 0, diff_step = 0;
    int checks_ok = 1, bitwise = 0;
    char cmsg[200] = "";
    for (k = 0; k <= NTREE; k++) out[k] = (float *)xalloc(TREE_N * on * 4);
    progress("speed tree ctx=%ld: filling the cache", P);
    /* the prefix, then the 16 drafts as the newest step (kva_store of their K/V) */
    {
      kva_cache_desc d = seq_desc(&s, 1, KVA_F16, KVA_EVICT_SUPPORT_ALL, P + TREE_N);
      if ((st = kva_cache_create(&d, &c)) == KVA_OK && (st = kva_seq_new(c, &seq)) == KVA_OK &&
          (st = seq_fill(c, seq, &s, 1, P, &rng)) == KVA_OK && (st = kva_seq_append(c, seq, TREE_N)) == KVA_OK)
        st = kva_store(c, seq, 0, k16, v16, TREE_N);
    }
    memset(x, 0, sizeof x);
    for (k = 0; k <= NTREE; k++) {
      x[k].c = c;
      x[k].seq = seq;
      x[k].a = shape_attn(&s, 1);
      x[k].n_q = k < NTREE ? TREE_N : 1;
      x[k].q = k < NTREE ? q : q + (TREE_N - 1) * qn; /* the step: the newest draft's query over all P + 16 keys */
      x[k].out = out[k];
      if (k < TR_LINEAR) x[k].a.tree_parent = par[k];
    }
    /* checks: the chain against linear causal attention; its last row against the n_q=1 step */
    if (st == KVA_OK) {
      if ((st = call_cache(&x[TR_CHAIN])) == KVA_OK && (st = call_cache(&x[NTREE])) == KVA_OK)
        st = call_cache(&x[TR_LINEAR]);
      if (st == KVA_OK) {
        diff_lin = max_abs_diff(out[TR_CHAIN], out[TR_LINEAR], TREE_N * on);
        diff_step = max_abs_diff(out[TR_CHAIN] + (TREE_N - 1) * on, out[NTREE], on);
        bitwise = !memcmp(out[TR_CHAIN], out[TR_LINEAR], TREE_N * on * 4) &&
                  !memcmp(out[TR_CHAIN] + (TREE_N - 1) * on, out[NTREE], on * 4);
        if (!(diff_lin <= 1e-5) || !(diff_step <= 1e-5)) {
          checks_ok = 0;
          snprintf(cmsg, sizeof cmsg, "MISMATCH: chain tree vs linear causal %.2e, its last row vs the n_q=1 step %.2e",
                   diff_lin, diff_step);
        }
      }
    }
    for (mode = 0; mode < 2; mode++) {
      call_fn f[NTREE + 1];
      timing tm[NTREE + 1];
      row *w;
      double base;
      int ki;
      if ((mode == 0 && !o->cold) || (mode == 1 && !o->warm)) continue;
      if (st == KVA_OK) {
        progress("speed tree ctx=%ld %s: %d trees, linear and the decode step, in turns", P, mode ? "warm" : "cold",
                 TR_LINEAR);
        for (k = 0; k <= NTREE; k++) f[k] = call_cache;
        time_interleaved(f, x, NTREE + 1, mode == 0, o->reps, tm);
        for (k = 0; k <= NTREE; k++)
          if (tm[k].st != KVA_OK) st = tm[k].st;
      }
      for (ki = 0; ki <= NTREE; ki++) { /* the 16 steps first, then the trees */
        k = ki == 0 ? NTREE : ki - 1;
        w = rows_add(&t, "tree");
        set_shape_cols(w, &s, KVA_F16);
        rn(w, C_CTX, (double)P);
        rn(w, C_THREADS, 1);
        rs(w, C_MODE, mode ? "warm" : "cold");
        rn(w, C_BLOCK, 16);
        rn(w, C_NQ, k < NTREE ? TREE_N : 1);
        rs(w, C_PATTERN, "%s", k < NTREE ? tree_name[k] : "16 x decode step (n_q=1)");
        if (st != KVA_OK) {
          rs(w, C_NOTE, "ERROR %s", kva_status_str(st));
          g_failed = 1;
          continue;
        }
        base = TREE_N * tm[NTREE].med;
        if (k == NTREE) {
          rn(w, C_TMED, base);
          rn(w, C_TMIN, TREE_N * tm[NTREE].mn);
          rn(w, C_TMAX, TREE_N * tm[NTREE].mx);
          rn(w, C_KVBYTES, (double)TREE_N * (double)(P + TREE_N) * (double)bpt);
          rn(w, C_GBPS, (double)TREE_N * (double)(P + TREE_N) * (double)bpt / base / 1e9);
          rs(w, C_NOTE, "16 x the median step (each over all P + 16 keys)");
        } else {
          set_timing(w, &tm[k]);
          rn(w, C_KVBYTES, (double)(P + TREE_N) * (double)bpt);
          rn(w, C_GBPS, (double)(P + TREE_N) * (double)bpt / tm[k].med / 1e9);
          rn(w, C_BASET, base);
          rn(w, C_BASEMIN, TREE_N * tm[NTREE].mn);
          rn(w, C_BASEMAX, TREE_N * tm[NTREE].mx);
          rn(w, C_RATIO, tm[k].med / base);
          if (k == TR_CHAIN) {
            rn(w, C_MAXABS, diff_lin > diff_step ? diff_lin : diff_step);
            rs(w, C_IDENT, bitwise ? "yes" : "no");
            rs(w, C_PASS, checks_ok ? "PASS" : "FAIL");
            rs(w, C_NOTE, "%s", checks_ok ? "= linear causal n_q=16, and its last row = the n_q=1 step (max abs diff)" : cmsg);
            if (!checks_ok) g_failed = 1;
          }
        }
      }
    }
    /* kva_seq_accept of a path of 8 (1 layer; the work scales with the layers) */
    for (k = 0; k < 2; k++) {
      row *w = rows_add(&ta, "tree_accept");
      char msg[200] = "";
      int reps = g_reps_exact ? o->reps : 101;
      set_shape_cols(w, &s, KVA_F16);
      rn(w, C_CTX, (double)P);
      rn(w, C_LAYERS, 1);
      rn(w, C_BLOCK, 16);
      rn(w, C_NQ, TREE_N);
      rs(w, C_PATTERN, "%s", k == 0 ? "path 1,3,..,15 of 2 chains of 8" : "path 0..7 of the chain");
      if (st != KVA_OK) {
        rs(w, C_NOTE, "ERROR %s", kva_status_str(st));
        g_failed = 1;
        continue;
      }
      progress("speed tree ctx=%ld: kva_seq_accept (%s)", P, k == 0 ? "moving 8" : "in place");
      if (time_accept(c, seq, &s, P, k == 0 ? keep_b : keep_a, k16, v16, reps, w, msg, sizeof msg)) {
        rs(w, C_PASS, "PASS");
        rs(w, C_NOTE, "%s", k == 0 ? "8 tokens move down (K, V, position, score)" : "nothing moves (as kva_seq_truncate)");
      } else {
        rs(w, C_PASS, "FAIL");
        rs(w, C_NOTE, "%s", msg);
        g_failed = 1;
      }
      rn(w, C_STEPS, reps);
    }
    if (c) kva_cache_destroy(c);
    for (k = 0; k <= NTREE; k++) free(out[k]);
    free(q);
    free(k16);
    free(v16);
  }
  progress_end();
  if (g_fmt == OUT_TABLE) {
    static const vcol v[] = {{C_CTX, "prefix", FM_SEP},           {C_MODE, "mode", FM_STR},
                             {C_PATTERN, "verification", FM_STR}, {C_NQ, "n_q", FM_INT},
                             {C_TMED, "ms med", FM_MS},           {C_TMIN, "ms min-max", FM_RANGE},
                             {C_KVBYTES, "KV MiB", FM_MIB},       {C_GBPS, "GB/s", FM_F1},
                             {C_BASET, "16 steps ms", FM_MS},     {C_RATIO, "tree/steps", FM_X},
                             {C_MAXABS, "max diff", FM_E},        {C_IDENT, "bitwise", FM_STR},
                             {C_PASS, "check", FM_STR},
                             {C_NOTE, "note", FM_STR}};
    static const vcol va[] = {{C_CTX, "prefix", FM_SEP},         {C_PATTERN, "accepted", FM_STR},
                              {C_NSOP, "ns/call", FM_SEP},
                              {C_NSTOK, "ns/moved token", FM_F1}, {C_STEPS, "calls", FM_INT},
                              {C_PASS, "check", FM_STR},          {C_NOTE, "note", FM_STR}};
    snprintf(title, sizeof title,
             "Verifying 16 draft tokens (speculative decoding): one kva_attend_cache with kva_attn.tree_parent over\n"
             "  the prefix + the 16 drafts (n_q=16) against 16 single-token decode steps (n_q=1, kva_attend_cache;\n"
             "  16 x the median step, each over the same P + 16 keys); GQA H=%d G=%d D=%d f16, one layer, block 16,\n"
             "  1 thread; calls timed in turns (cold: caches flushed before each). Trees: a chain (parent i-1), a\n"
             "  binary tree (parent (i-1)/2: 1+2+4+8+1 nodes at depths 0..4), 2 chains of 8 (parent i-2); and\n"
             "  the same n_q=16 call without a tree (linear causal). KV MiB = bytes read per verification;\n"
             "  tree/steps = the call's median over the 16 steps'. Check: the chain\n"
             "  against the linear causal call (tree_parent NULL), and its last row against the n_q=1 step.",
             s.H, s.G, s.D);
    print_table(title, v, NV(v), &t, C_MODE);
    print_table("kva_seq_accept of a path of 8 of the 16 drafts (one layer: its copies scale with n_layers x n_kv_heads);\n"
                "  the drafts re-appended and re-stored before every call (untimed); median of the calls. Check: len\n"
                "  and pos = prefix + 8, and slots prefix..prefix+7 hold the kept drafts' K/V (kva_seq_read, memcmp)\n"
                "  at positions prefix..prefix+7",
                va, NV(va), &ta, -1);
  }
  emit_rows(&t);
  emit_rows(&ta);
  rows_free(&t);
  rows_free(&ta);
}
