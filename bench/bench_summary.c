/* bench/bench_summary.c - kvattn_bench summary, the default (what `make bench` runs). It answers
   the bench's question first: how do the attention variants compare by memory per token, speed and
   accuracy? In order: memory per token of every model preset for its own attention and the
   variants in f16 / int8 / int4 / fp8 (memory_summary, bench_memory.c); this machine in one line; one
   decode line per variant; GQA decode per storage dtype against f16 with each dtype's output
   error. The tables are compact; --csv and --json carry every row. */
#include "harness.h"

int g_goals, g_goals_met;

/* time(dtype) / time(f16) targets for GQA decode at long context: a 1-byte type reads about
   half of f16's bytes, so a bandwidth-bound decode should approach 0.5; the targets leave room
   for the conversion to f32 (int8: one scale per token and KV head; fp8: one tensor scale).
   int4 reads 80 of f16's 256 bytes per row of 128 (0.3125: codes, an F16 scale and minimum per 32
   values); its target, 0.35, leaves a little room above that (f16's own conversion cost
   included). A missed target is reported ("missed"), not a failed check. */
static double dtype_target(kva_dtype dt) {
  return dt == KVA_INT8 ? 0.50 : dt == KVA_INT4 ? 0.35 : (dt == KVA_FP8_E4M3 || dt == KVA_FP8_E5M2) ? 0.75 : 0;
}

/* GQA decode (o->H, o->G, o->D), 1 thread, timed in turns (time_interleaved) so that their
   ratios share the machine's conditions: f16; int8 and int4 with float scores, integer scores
   (kva_attn.int_scores) and integer scores and values (kva_attn.int_values); fp8_e4m3, fp8_e5m2;
   int8 and int4 rotated. Twice: cold at the largest --ctx (the bytes count: the byte ratio is the
   floor), and warm over WARM_CTX keys, which stay in the caches (the arithmetic counts: the
   kernels' own cost per key). Rows: section decode_dtype. */
enum { ND = 11 };
#define IQ INT_SCORES
#define IV INT_VALUES
#define WARM_CTX 2048
static const kva_dtype dts[ND] = {KVA_F16,  KVA_INT8,     KVA_INT8,     KVA_INT8, KVA_INT4, KVA_INT4,
                                  KVA_INT4, KVA_FP8_E4M3, KVA_FP8_E5M2, KVA_INT8, KVA_INT4};
static const int int_ops[ND] = {0, 0, IQ, IQ | IV, 0, IQ, IQ | IV, 0, 0, IQ, IQ};
static const int rotate[ND] = {0, 0, 0, 0, 0, 0, 0, 0, 0, KVA_ROTATE_K | KVA_ROTATE_V, KVA_ROTATE_K | KVA_ROTATE_V};
/* the time goal of a row against f16's: its bytes and the arithmetic left beside them */
static double row_target(int i) {
  if (rotate[i]) return 0;
  if (int_ops[i] & IV) return dts[i] == KVA_INT8 ? 0.55 : 0.40;
  return dtype_target(dts[i]);
}
static void run_dtype_block(const opts *o, const machine *m, rows *t, long ctx, int cold, int threads) {
  shape s = variant_shape(V_GQA, o->H, o->G, o->D);
  kva_cache *c[ND];
  kva_status st[ND];
  call_ctx x[ND];
  call_fn f[ND];
  timing tm[ND];
  int seq[ND], i, j, n = 0, idx[ND];
  uint64_t rng = o->seed + 5;
  float *q = rand_floats((size_t)s.H * s.D, &rng), *out = (float *)xalloc((size_t)s.H * s.DV * 4);
  for (i = 0; i < ND; i++) {
    c[i] = NULL;
    if (int_ops[i] && i > 0 && dts[i - 1] == dts[i] && rotate[i - 1] == rotate[i]) { /* the same cache */
      st[i] = st[i - 1], seq[i] = seq[i - 1];
    } else {
      progress("decode per dtype: %s%s ctx=%ld, filling the cache", kva_dtype_name(dts[i]), rotate[i] ? " rotated" : "",
               ctx);
      g_build_rotate = rotate[i];
      st[i] = build_cache(&s, dts[i], ctx, 1, 16, 0, 1.0f, 1.0f, NULL, NULL, &rng, &c[i], &seq[i]);
      g_build_rotate = 0;
    }
    if (st[i] != KVA_OK) continue;
    memset(&x[n], 0, sizeof x[n]);
    for (j = i; !c[j]; j--) {} /* the row that built this cache */
    x[n].c = c[j];
    x[n].seq = seq[i];
    x[n].a = shape_attn(&s, threads);
    x[n].a.int_scores = int_ops[i] & IQ ? 1 : 0;
    x[n].a.int_values = int_ops[i] & IV ? 1 : 0;
    x[n].q = q;
    x[n].n_q = 1;
    x[n].out = out;
    f[n] = call_cache;
    idx[n++] = i;
  }
  progress("decode per dtype: ctx=%ld, %d dtypes timed in turns, %s, %d thread(s)", ctx, n, cold ? "cold" : "warm",
           threads);
  if (n) time_interleaved(f, x, n, cold, o->reps_set ? o->reps : (o->reps > 9 ? o->reps : 9), tm);
  progress_end();
  for (i = 0; i < ND; i++) {
    row *w = rows_add(t, "decode_dtype");
    timing *ti = NULL, *base = NULL;
    double tgt = cold ? row_target(i) : 0;
    for (j = 0; j < n; j++) {
      if (idx[j] == i) ti = &tm[j];
      if (dts[idx[j]] == KVA_F16 && tm[j].st == KVA_OK) base = &tm[j];
    }
    set_shape_cols(w, &s, dts[i]);
    if (int_ops[i])
      rs(w, C_DTYPE, "%s%s%s%s", kva_dtype_name(dts[i]), int_ops[i] & IQ ? "+iq" : "", int_ops[i] & IV ? "+iv" : "",
         rotate[i] ? " rot" : "");
    rn(w, C_CTX, (double)ctx);
    rn(w, C_THREADS, threads);
    if (threads > 1) rs(w, C_MODE, "%s %d thr", cold ? "cold" : "warm", threads);
    else rs(w, C_MODE, "%s", cold ? "cold" : "warm");
    rn(w, C_NQ, 1);
    rn(w, C_BLOCK, 16);
    if (st[i] != KVA_OK || !ti || ti->st != KVA_OK) {
      kva_status e = st[i] != KVA_OK ? st[i] : ti ? ti->st : KVA_ERR_ARG;
      rs(w, C_NOTE, e == KVA_ERR_UNSUPPORTED ? "unsupported" : "%s: %s", st[i] != KVA_OK ? "cache" : "attend",
         kva_status_str(e));
      if (e != KVA_ERR_UNSUPPORTED) g_failed = 1;
      continue;
    }
    set_timing(w, ti);
    set_roof(w, m, threads, (double)ctx * (double)shape_bpt(&s, dts[i]), 2.0 * s.H * (double)ctx * (s.D + s.DV), ti->med);
    rn(w, C_NSTOK, ti->med / (double)ctx * 1e9);
    if (!base) continue;
    set_base_timing(w, base);
    rn(w, C_RATIO, ti->med / base->med);
    rn(w, C_RATIOMIN, ti->mn / base->mn);
    rn(w, C_BRATIO, (double)shape_bpt(&s, dts[i]) / (double)shape_bpt(&s, KVA_F16));
    rn(w, C_TBRATIO, ti->med / base->med / ((double)shape_bpt(&s, dts[i]) / (double)shape_bpt(&s, KVA_F16)));
    if (tgt > 0) {
      int met = ti->med / base->med <= tgt;
      rn(w, C_EXPECTED, tgt);
      rs(w, C_PASS, met ? "met" : "missed");
      g_goals++, g_goals_met += met;
    }
    rs(w, C_NOTE, "%s", dts[i] == KVA_F16 ? "the base"
                        : rotate[i] ? "K and V rotated (kva_cache_desc.rotate), integer scores"
                        : int_ops[i] & IV ? "integer scores and values: 8-bit probability codes (int_values = 1)"
                        : int_ops[i] ? "integer scores: int8 query codes (kva_attn.int_scores = 1)"
                        : dts[i] == KVA_INT8 ? "1 B/value + an fp32 scale per token and KV head"
                        : dts[i] == KVA_INT4 ? "4 bits/value + an f16 scale and minimum per 32 values"
                                             : "1 B/value, tensor scale 1.0 (timing does not depend on it)");
  }
  for (i = 0; i < ND; i++)
    if (c[i]) kva_cache_destroy(c[i]);
  free(q);
  free(out);
}

static long max_ctx(const opts *o);

/* The three limits side by side: decode (GQA f16 at the largest --ctx,
   cold, timed in turns) in one contiguous block against 16-token blocks
   (paging's cost), 16-token blocks on 1 and 2 threads against that thread
   count's read bandwidth; and a causal prefill (--prefill, 16-token blocks,
   1 thread, warm) against the FMA peak. */
#define PREFILL_TARGET 0.75 /* of the FMA peak */
static void run_limits(const opts *o, const machine *m) {
  enum { NL = 3 };
  static const char *const name[NL] = {"one contiguous block", "16-token blocks", "16-token blocks"};
  static const int bsz[NL] = {0, 16, 16}, nthr[NL] = {1, 1, 2};
  shape s = variant_shape(V_GQA, o->H, o->G, o->D);
  long ctx = max_ctx(o);
  rows t = {0};
  kva_cache *c[NL];
  kva_status st = KVA_OK;
  call_ctx x[NL];
  call_fn f[NL];
  timing tm[NL], ptm;
  kva_status pst = KVA_OK;
  int seq[NL], i;
  uint64_t rng = o->seed + 7;
  float *q = rand_floats((size_t)s.H * s.D, &rng), *out = (float *)xalloc((size_t)s.H * s.DV * 4);
  for (i = 0; i < NL; i++) c[i] = NULL;
  for (i = 0; i < NL && st == KVA_OK; i++) {
    progress("decode limits: %s, %d thread(s), filling the cache", name[i], nthr[i]);
    st = build_cache(&s, KVA_F16, ctx, 1, bsz[i] ? bsz[i] : (int)ctx, 0, 1.0f, 1.0f, NULL, NULL, &rng, &c[i], &seq[i]);
    memset(&x[i], 0, sizeof x[i]);
    x[i].c = c[i], x[i].seq = seq[i], x[i].a = shape_attn(&s, nthr[i]), x[i].q = q, x[i].n_q = 1, x[i].out = out;
    f[i] = call_cache;
  }
  if (st == KVA_OK) {
    progress("decode limits: ctx=%ld, timed in turns, cold", ctx);
    time_interleaved(f, x, NL, 1, o->reps_set ? o->reps : (o->reps > 9 ? o->reps : 9), tm);
  }
  progress_end();
  for (i = 0; i < NL; i++) {
    row *w = rows_add(&t, "decode_limits");
    set_shape_cols(w, &s, KVA_F16);
    rs(w, C_NAME, "%s", name[i]);
    rn(w, C_CTX, (double)ctx);
    rn(w, C_THREADS, nthr[i]);
    rn(w, C_BLOCK, bsz[i] ? bsz[i] : (double)ctx);
    if (st != KVA_OK || tm[i].st != KVA_OK) {
      rs(w, C_NOTE, "ERROR %s", kva_status_str(st != KVA_OK ? st : tm[i].st));
      g_failed = 1;
      continue;
    }
    set_timing(w, &tm[i]);
    set_roof(w, m, nthr[i], (double)ctx * (double)shape_bpt(&s, KVA_F16), 2.0 * s.H * (double)ctx * (s.D + s.DV),
             tm[i].med);
    if (i == 1 && tm[0].st == KVA_OK) {
      rn(w, C_RATIO, tm[1].med / tm[0].med);
      rs(w, C_NOTE, "paged / contiguous");
    }
    if (i == 2) rs(w, C_NOTE, "/BW against the 2-thread read bandwidth");
  }
  if (st == KVA_OK) { /* the prefill row */
    long nq = o->prefill_nq, nkv = o->prefill_ctx;
    double pairs = (double)nq * (double)(nkv - nq) + (double)nq * (double)(nq + 1) / 2; /* unmasked pairs */
    double peak = roof_for(m, 1)->fma[m->isa], flop = 2.0 * pairs * s.H * (s.D + s.DV);
    float *pq = rand_floats((size_t)nq * s.H * s.D, &rng), *pout = (float *)xalloc((size_t)nq * s.H * s.DV * 4);
    kva_cache *pc = NULL;
    int pseq = 0;
    row *w = rows_add(&t, "prefill_limit");
    progress("prefill limit: %ld causal queries over %ld tokens, filling the cache", nq, nkv);
    set_shape_cols(w, &s, KVA_F16);
    rs(w, C_NAME, "prefill %ld x %ld", nq, nkv);
    rn(w, C_CTX, (double)nkv);
    rn(w, C_NQ, (double)nq);
    rn(w, C_THREADS, 1);
    pst = build_cache(&s, KVA_F16, nkv, (int)nq, 16, 0, 1.0f, 1.0f, NULL, NULL, &rng, &pc, &pseq);
    if (pst == KVA_OK) {
      call_ctx px;
      memset(&px, 0, sizeof px);
      px.c = pc, px.seq = pseq, px.a = shape_attn(&s, 1), px.q = pq, px.n_q = (int)nq, px.out = pout;
      progress("prefill limit: timing");
      ptm = time_calls(call_cache, &px, 0, o->reps < 3 ? o->reps : 3);
      pst = ptm.st;
    }
    if (pst != KVA_OK) {
      rs(w, C_NOTE, "ERROR %s", kva_status_str(pst));
      g_failed = 1;
    } else {
      set_timing(w, &ptm);
      int met = flop / ptm.med / 1e9 / peak >= PREFILL_TARGET;
      rn(w, C_GFLOPS, flop / ptm.med / 1e9);
      rn(w, C_FMARATIO, flop / ptm.med / 1e9 / peak);
      rn(w, C_EXPECTED, PREFILL_TARGET);
      rs(w, C_PASS, "/FMA >= %.2f %s", PREFILL_TARGET, met ? "met" : "missed");
      rs(w, C_NOTE, "/FMA against the FMA peak");
      g_goals++, g_goals_met += met;
    }
    if (pc) kva_cache_destroy(pc);
    free(pq);
    free(pout);
  }
  progress_end();
  if (g_fmt == OUT_TABLE) {
    static const vcol v[] = {{C_NAME, "layout", FM_STR},   {C_THREADS, "threads", FM_INT}, {C_TMED, "ms", FM_MS},
                             {C_GBPS, "GB/s", FM_F1},      {C_BWRATIO, "/BW", FM_F2},      {C_RATIO, "vs contig.", FM_F2},
                             {C_GFLOPS, "GFLOP/s", FM_F1}, {C_FMARATIO, "/FMA", FM_F2},    {C_PASS, "speed goal", FM_STR},
                             {C_BW, "BW GB/s", FM_F1},     {C_NOTE, "note", FM_STR}};
    char title[600];
    snprintf(title, sizeof title,
             "Limits: GQA (H=%d G=%d D=%d) f16. Decode at %ld tokens, cold, timed in turns: paging's cost\n"
             "  (16-token blocks against one contiguous block), /BW = over the read bandwidth of 1 or 2 threads.\n"
             "  Prefill of %d causal queries over %d tokens, 1 thread, warm: /FMA = over the FMA peak",
             s.H, s.G, s.D, ctx, o->prefill_nq, o->prefill_ctx);
    print_table(title, v, o->full ? NV(v) : NV(v) - 2, &t, C_NAME);
  }
  emit_rows(&t);
  rows_free(&t);
  for (i = 0; i < NL; i++)
    if (c[i]) kva_cache_destroy(c[i]);
  free(q);
  free(out);
}

/* the largest of o->ctx */
static long max_ctx(const opts *o) {
  long c = 0;
  int i;
  for (i = 0; i < o->n_ctx; i++)
    if (o->ctx[i] > c) c = o->ctx[i];
  return c;
}

/* one line per decode series (variant, dtype): the time at each context, and at the largest the
   cost per token, GB/s, the bandwidth ratio and the bound. The display rows use columns as slots. */
static void print_decode_lines(const rows *t, const opts *o) {
  static const int slot[4] = {C_TMED, C_BASET, C_STEPMID, C_STEPEND};
  vcol v[16];
  char heads[4][32], title[900], ctxs[32];
  rows d = {0};
  long cmax = max_ctx(o);
  int i, k, nv = 0, nc = o->n_ctx < 4 ? o->n_ctx : 4;
  if (g_fmt != OUT_TABLE) return;
  for (i = 0; i < t->n; i++) {
    const row *r = &t->r[i];
    row *w = NULL;
    if (d.n && !strcmp(d.r[d.n - 1].str[C_VARIANT], r->str[C_VARIANT]) && r->kind[C_DTYPE] == 2 &&
        d.r[d.n - 1].kind[C_DTYPE] == 2 && !strcmp(d.r[d.n - 1].str[C_DTYPE], r->str[C_DTYPE]))
      w = &d.r[d.n - 1];
    else {
      w = rows_add(&d, "decode");
      rs(w, C_VARIANT, "%s", r->str[C_VARIANT]);
      if (r->kind[C_DTYPE] == 2) rs(w, C_DTYPE, "%s", r->str[C_DTYPE]);
      rn(w, C_KVHEADS, r->num[C_KVHEADS]);
    }
    if (r->kind[C_NOTE] == 2) rs(w, C_NOTE, "%s", r->str[C_NOTE]);
    if (r->kind[C_TMED] != 1) continue;
    rn(w, C_BPTL, r->num[C_KVBYTES] / r->num[C_CTX]);
    for (k = 0; k < nc; k++)
      if (r->num[C_CTX] == (double)o->ctx[k]) rn(w, slot[k], r->num[C_TMED]);
    if (r->num[C_CTX] == (double)cmax) {
      rn(w, C_NSTOK, r->num[C_NSTOK]);
      rn(w, C_GBPS, r->num[C_GBPS]);
      rn(w, C_BWRATIO, r->num[C_BWRATIO]);
      rs(w, C_BOUND, "%s", r->str[C_BOUND]);
    }
  }
  v[nv].col = C_VARIANT; v[nv].head = "variant"; v[nv++].fm = FM_STR;
  if (o->n_dtypes > 1) { v[nv].col = C_DTYPE; v[nv].head = "dtype"; v[nv++].fm = FM_STR; }
  v[nv].col = C_KVHEADS; v[nv].head = "KV heads"; v[nv++].fm = FM_INT;
  v[nv].col = C_BPTL; v[nv].head = "B/token/layer"; v[nv++].fm = FM_SEP;
  for (k = 0; k < nc; k++) {
    if (o->ctx[k] % 1024 == 0) snprintf(heads[k], sizeof heads[k], "ms @%ldK", o->ctx[k] / 1024);
    else snprintf(heads[k], sizeof heads[k], "ms @%ld", o->ctx[k]);
    v[nv].col = slot[k]; v[nv].head = heads[k]; v[nv++].fm = FM_MS;
  }
  v[nv].col = C_NSTOK; v[nv].head = "ns/token"; v[nv++].fm = FM_F1;
  v[nv].col = C_GBPS; v[nv].head = "GB/s"; v[nv++].fm = FM_F1;
  v[nv].col = C_BWRATIO; v[nv].head = "/BW"; v[nv++].fm = FM_X;
  v[nv].col = C_BOUND; v[nv].head = "bound"; v[nv++].fm = FM_STR;
  for (i = 0; i < d.n; i++) /* a note column only for a failure to show */
    if (d.r[i].kind[C_NOTE] == 2) {
      v[nv].col = C_NOTE; v[nv].head = "note"; v[nv++].fm = FM_STR;
      break;
    }
  fmt_sep((double)cmax, ctxs, sizeof ctxs);
  snprintf(title, sizeof title,
           "Decode per variant: one query token over the cached tokens (kva_attend_cache, one layer, %s),\n"
           "  %d query heads of %d (GQA: %d KV heads; MLA: one latent head of %d+%d, absorbed), %ld thread%s,\n"
           "  %s caches, medians. At %s tokens: GB/s of KV read, /BW = over the read bandwidth,\n"
           "  bound = mem or fma (the longer floor)",
           o->n_dtypes == 1 ? kva_dtype_name(o->dtypes[0]) : "per dtype", o->H, o->D, o->G, 4 * o->D, o->D / 2,
           o->threads[0], o->threads[0] > 1 ? "s" : "", o->cold ? "cold" : "warm", ctxs);
  print_table(title, v, nv, &d, -1);
  rows_free(&d);
}

/* Rotation's cost per stored token: kva_store of 4,096 tokens (chunks of 256, one layer, K and V,
   1 thread) into INT8 and INT4 caches with and without kva_cache_desc.rotate, best of 5. */
static void run_rotation_store(const opts *o) {
  static const kva_dtype dts[2] = {KVA_INT8, KVA_INT4};
  const int n = 4096, chunk = 256, G = o->G, D = o->D;
  uint64_t rng = o->seed + 11;
  float *k = rand_floats((size_t)chunk * G * D, &rng), *v = rand_floats((size_t)chunk * G * D, &rng);
  int di, rot;
  if (g_fmt != OUT_TABLE || !o->full) goto done;
  printf("Rotation's cost per stored token: kva_store of %d tokens (chunks of %d, G=%d D=%d, K and V, 1 thread),\n"
         "  best of 5 (the decode step's cost is the \"rot\" rows above)\n", n, chunk, G, D);
  printf("dtype  ns/token plain  ns/token rotated  rotated / plain\n");
  printf("-----  --------------  ----------------  ---------------\n");
  for (di = 0; di < 2; di++) {
    double best[2];
    for (rot = 0; rot < 2; rot++) {
      kva_cache_desc d;
      kva_cache *c = NULL;
      int seq, rep, t;
      memset(&d, 0, sizeof d);
      d.n_layers = 1, d.n_kv_heads = G, d.head_dim = D, d.block_size = 16, d.n_blocks = n / 16;
      d.dtype = dts[di], d.rotate = rot ? KVA_ROTATE_K | KVA_ROTATE_V : 0;
      best[rot] = -1;
      if (kva_cache_create(&d, &c) != KVA_OK) continue;
      for (rep = 0; rep < 5; rep++) {
        double t0;
        if (kva_seq_new(c, &seq) != KVA_OK) break;
        t0 = now_s();
        for (t = 0; t < n; t += chunk)
          if (kva_seq_append(c, seq, chunk) != KVA_OK || kva_store(c, seq, 0, k, v, chunk) != KVA_OK) break;
        t0 = now_s() - t0;
        if (t == n && (best[rot] < 0 || t0 < best[rot])) best[rot] = t0;
        kva_seq_free(c, seq);
      }
      kva_cache_destroy(c);
    }
    if (best[0] > 0 && best[1] > 0)
      printf("%-5s  %14.0f  %16.0f  %15.2f\n", kva_dtype_name(dts[di]), best[0] / n * 1e9, best[1] / n * 1e9,
             best[1] / best[0]);
    else {
      printf("%-5s  (failed)\n", kva_dtype_name(dts[di]));
      g_failed = 1;
    }
  }
  printf("\n");
done:
  free(k);
  free(v);
}

/* bytes of one stored K row of dim values in type dt (from the library: one layer, one KV head) */
static size_t row_bytes(kva_dtype dt, int dim) {
  kva_cache_desc d;
  memset(&d, 0, sizeof d);
  d.n_layers = 1, d.n_kv_heads = 1, d.head_dim = dim, d.dtype = dt, d.k_scale = d.v_scale = 1.0f;
  return kva_cache_bytes_per_token(&d) / 2;
}

static void print_dtype_block(const rows *t, const opts *o, long err_ctx) {
  static const vcol v_full[] = {{C_DTYPE, "dtype", FM_STR},       {C_MODE, "mode", FM_STR},
                                {C_BPTL, "B/token/layer", FM_SEP}, {C_TMED, "ms", FM_MS},
                                {C_TMIN, "ms min-max", FM_RANGE}, {C_GBPS, "GB/s", FM_F1},
                                {C_BWRATIO, "/BW", FM_X},         {C_RATIO, "vs f16", FM_X},
                                {C_RATIOMIN, "(min)", FM_X},      {C_BRATIO, "bytes", FM_X},
                                {C_TBRATIO, "/bytes", FM_X},      {C_PASS, "speed goal", FM_STR},
                                {C_RELRMS, "out err vs f32", FM_E}, {C_NOTE, "note", FM_STR}};
  static const vcol v_screen[] = {{C_DTYPE, "dtype", FM_STR},     {C_MODE, "mode", FM_STR},
                                  {C_TMED, "ms", FM_MS},          {C_BWRATIO, "/BW", FM_X},
                                  {C_RATIO, "vs f16", FM_X},      {C_BRATIO, "bytes", FM_X},
                                  {C_TBRATIO, "/bytes", FM_X},    {C_PASS, "speed goal", FM_STR},
                                  {C_RELRMS, "out err vs f32", FM_E}, {C_NOTE, "note", FM_STR}};
  const vcol *v = o->full ? v_full : v_screen;
  int n_all = o->full ? NV(v_full) : NV(v_screen), nv = n_all - 1; /* the note column only for a failure to show */
  char title[1200], ctxs[32], ectx[32], wctx[32];
  rows d = {0};
  int i;
  size_t i8b, i4b;
  if (g_fmt != OUT_TABLE) return;
  i8b = row_bytes(KVA_INT8, o->D);
  i4b = row_bytes(KVA_INT4, o->D);
  for (i = 0; i < t->n; i++) { /* a copy with B/token/layer: the rows carry the KV bytes per call */
    const row *r = &t->r[i];
    row *w;
    int c, k = i % ND;
    /* on one screen: cold, every dtype with float and with integer scores and values; warm, f16,
       int8 with integer scores and values, int4 both ways; the 2-thread rows with --full (and in
       --csv / --json) */
    if (!o->full && (i >= 2 * ND || rotate[k] || (int_ops[k] && !(int_ops[k] & IV)) ||
                     (i >= ND && (dts[k] == KVA_FP8_E4M3 || dts[k] == KVA_FP8_E5M2 ||
                                  (dts[k] == KVA_INT8 && !int_ops[k])))))
      continue;
    w = rows_add(&d, "decode_dtype");
    for (c = 0; c < NCOL; c++) {
      if (r->kind[c] == 1) rn(w, c, r->num[c]);
      else if (r->kind[c] == 2 && c != C_SECTION) rs(w, c, "%s", r->str[c]);
    }
    if (r->kind[C_KVBYTES] == 1) rn(w, C_BPTL, r->num[C_KVBYTES] / r->num[C_CTX]);
    if (r->kind[C_NOTE] == 2 && r->kind[C_TMED] == 1) w->kind[C_NOTE] = 0; /* only failures */
    if (w->kind[C_NOTE] == 2) nv = n_all;
    if (r->kind[C_EXPECTED] == 1 && r->kind[C_PASS] == 2) /* the goal beside its verdict */
      rs(w, C_PASS, "<= %.2f %s", r->num[C_EXPECTED], r->str[C_PASS]);
  }
  fmt_sep(t->n ? t->r[0].num[C_CTX] : 0, ctxs, sizeof ctxs);
  fmt_sep((double)err_ctx, ectx, sizeof ectx);
  fmt_sep((double)WARM_CTX, wctx, sizeof wctx);
  snprintf(title, sizeof title,
           "Decode per storage dtype: GQA H=%d G=%d D=%d, 1 thread, in turns, cold %s tokens, warm %s\n"
           "  (--full: every row warm; cold at 2 threads). vs f16 = time / f16's; bytes = KV bytes / f16's\n"
           "  (row of %d: int8 %zu, int4 %zu, fp8 %d, f16 %d); /bytes = vs f16 / bytes; goal: to aim at\n"
           "  +iq/+iv = integer scores/values; out err = rel. RMS vs f32 (%s tokens, outlier keys)",
           o->H, o->G, o->D, ctxs, wctx, o->D, i8b, i4b, o->D, 2 * o->D, ectx);
  print_table(title, v, nv, &d, -1);
  rows_free(&d);
}

/* Block selection (kva_attn.select_budget = SEL_BUDGET, SEL_SINK sink and SEL_RECENT recent tokens) on
   GQA decode, cold, in turns, 1 thread, blocks of 16 scattered over the pool (a server's pool after a
   while): per dtype the selected step against the full step over the same cache (which keeps block
   bounds), at the largest --ctx and 4x it, and a full step over a cache of as many tokens as a
   selected step reads ("attention alone"): the rest of the selected step is the ranking. Rows:
   section decode_select. */
enum { SEL_BUDGET = 2048, SEL_SINK = 16, SEL_RECENT = 64, SEL_ND = 3 };
static void run_select_block(const opts *o, const machine *m) {
  static const kva_dtype sdt[SEL_ND] = {KVA_F16, KVA_INT8, KVA_INT4};
  const double goal[2] = {0.15, 0.08};
  shape s = variant_shape(V_GQA, o->H, o->G, o->D);
  long ctxs[2];
  int nc = o->quick ? 1 : 2, ci, i, n;
  uint64_t rng = o->seed + 11;
  float *q = rand_floats((size_t)s.H * s.D, &rng), *out = (float *)xalloc((size_t)s.H * s.DV * 4);
  rows t = {0};
  char title[600];
  static const vcol v[] = {{C_DTYPE, "dtype", FM_STR},     {C_CTX, "tokens", FM_SEP},      {C_BASET, "full ms", FM_MS},
                           {C_TMED, "selected ms", FM_MS}, {C_RATIO, "vs full", FM_X},     {C_PASS, "speed goal", FM_STR},
                           {C_VALUE, "ranking", FM_PCT}, {C_BFRAC, "+bytes", FM_PCT}, {C_NOTE, "note", FM_STR}};
  ctxs[0] = max_ctx(o);
  ctxs[1] = 4 * max_ctx(o);
  for (ci = 0; ci < nc; ci++) {
    kva_cache *c[SEL_ND][2];
    int seq[SEL_ND][2];
    kva_status st[SEL_ND][2];
    call_ctx x[3 * SEL_ND];
    call_fn f[3 * SEL_ND];
    timing tm[3 * SEL_ND];
    for (i = 0; i < SEL_ND; i++) {
      progress("block selection: %s ctx=%ld, filling the caches", kva_dtype_name(sdt[i]), ctxs[ci]);
      g_build_bounds = 1;
      st[i][0] = build_cache(&s, sdt[i], ctxs[ci], 1, 16, 1, 1.0f, 1.0f, NULL, NULL, &rng, &c[i][0], &seq[i][0]);
      g_build_bounds = 0;
      st[i][1] = build_cache(&s, sdt[i], SEL_BUDGET, 1, 16, 1, 1.0f, 1.0f, NULL, NULL, &rng, &c[i][1], &seq[i][1]);
    }
    for (n = 0; n < 3 * SEL_ND; n++) { /* full, selected, attention alone, per dtype */
      int d = n / 3, k = n % 3;
      memset(&x[n], 0, sizeof x[n]);
      x[n].c = k == 2 ? c[d][1] : c[d][0];
      x[n].seq = k == 2 ? seq[d][1] : seq[d][0];
      x[n].a = shape_attn(&s, 1);
      if (k == 1) x[n].a.select_budget = SEL_BUDGET, x[n].a.select_sink = SEL_SINK, x[n].a.select_recent = SEL_RECENT;
      x[n].q = q;
      x[n].n_q = 1;
      x[n].out = out;
      f[n] = call_cache;
      if (st[d][k == 2] != KVA_OK) x[n].c = NULL;
    }
    progress("block selection: ctx=%ld, timed in turns, cold", ctxs[ci]);
    for (n = 0; n < 3 * SEL_ND; n++)
      if (!x[n].c) break;
    if (n == 3 * SEL_ND) time_interleaved(f, x, n, 1, o->reps_set ? o->reps : (o->reps > 9 ? o->reps : 9), tm);
    progress_end();
    for (i = 0; i < SEL_ND; i++) {
      row *w = rows_add(&t, "decode_select");
      set_shape_cols(w, &s, sdt[i]);
      rn(w, C_CTX, (double)ctxs[ci]);
      rn(w, C_THREADS, 1);
      rs(w, C_MODE, "cold");
      rn(w, C_BLOCK, 16);
      rn(w, C_BUDGET, SEL_BUDGET);
      rn(w, C_NSINK, SEL_SINK);
      rn(w, C_NRECENT, SEL_RECENT);
      if (n < 3 * SEL_ND || tm[3 * i].st != KVA_OK || tm[3 * i + 1].st != KVA_OK || tm[3 * i + 2].st != KVA_OK) {
        rs(w, C_NOTE, "ERROR: %s", kva_status_str(n < 3 * SEL_ND ? KVA_ERR_NOMEM : tm[3 * i + 1].st));
        g_failed = 1;
        continue;
      }
      set_timing(w, &tm[3 * i + 1]);
      set_base_timing(w, &tm[3 * i]);
      rn(w, C_RATIO, tm[3 * i + 1].med / tm[3 * i].med);
      rn(w, C_VALUE, 1.0 - tm[3 * i + 2].med / tm[3 * i + 1].med);
      { /* the bounds' bytes over the rows' */
        kva_cache_desc d = shape_desc(&s, 1, sdt[i]);
        size_t plain = kva_cache_bytes_per_token(&d);
        d.block_bounds = 1;
        rn(w, C_BFRAC, (double)(kva_cache_bytes_per_token(&d) - plain) / (double)plain);
      }
      if (sdt[i] == KVA_F16 && !o->quick && ctxs[ci] >= 32768) { /* the goals hold at 32K and 128K tokens */
        int met = tm[3 * i + 1].med / tm[3 * i].med <= goal[ci];
        rn(w, C_EXPECTED, goal[ci]);
        rs(w, C_PASS, "<= %.2f %s", goal[ci], met ? "met" : "missed");
        g_goals++, g_goals_met += met;
      }
      (void)m;
    }
    for (i = 0; i < SEL_ND; i++) {
      if (c[i][0]) kva_cache_destroy(c[i][0]);
      if (c[i][1]) kva_cache_destroy(c[i][1]);
    }
  }
  if (g_fmt == OUT_TABLE) {
    rows shown = {0};
    int r, c;
    for (r = 0; r < t.n; r++) { /* on one screen f16 (--full: int8, int4 too) */
      row *w;
      if (!o->full && strcmp(t.r[r].str[C_DTYPE], "f16") != 0) continue;
      w = rows_add(&shown, "decode_select");
      for (c = 0; c < NCOL; c++) {
        if (t.r[r].kind[c] == 1) rn(w, c, t.r[r].num[c]);
        else if (t.r[r].kind[c] == 2 && c != C_SECTION) rs(w, c, "%s", t.r[r].str[c]);
      }
    }
    snprintf(title, sizeof title,
             "Block selection (GQA, 1 thread, cold; --full: int8, int4): %d tokens read (%d sink, %d recent)",
             SEL_BUDGET, SEL_SINK, SEL_RECENT);
    print_table(title, v, NV(v), &shown, -1);
    rows_free(&shown);
  }
  emit_rows(&t);
  rows_free(&t);
  free(q);
  free(out);
}

/* the summary after the memory table and the machine: decode per variant, then per dtype */
void summary_speed(const opts *o, const machine *m) {
  rows t = {0};
  double err[ND];
  long err_ctx = 4096;
  int i;
  run_decode(o, m, &t);
  print_decode_lines(&t, o);
  emit_rows(&t);
  rows_free(&t);
  run_dtype_block(o, m, &t, max_ctx(o), 1, 1);
  /* every row's own configuration (integer scores and values, rotation), so that their effect shows */
  quality_dtype_errors(o, dts, int_ops, rotate, ND, err_ctx, o->quick ? 2 : 4, err);
  for (i = 0; i < t.n && i < ND; i++)
    if (err[i] >= 0) rn(&t.r[i], C_RELRMS, err[i]);
  run_dtype_block(o, m, &t, WARM_CTX, 0, 1);
  run_dtype_block(o, m, &t, max_ctx(o), 1, 2); /* the same cold, 2 threads each (f16's too) */
  print_dtype_block(&t, o, err_ctx);
  emit_rows(&t);
  run_rotation_store(o);
  rows_free(&t);
  run_select_block(o, m);
  run_limits(o, m);
}
