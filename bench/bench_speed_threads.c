/* bench/bench_speed_threads.c - kvattn_bench speed, parts threads and batch: decode thread
   scaling (1 against T threads, outputs compared bitwise) and continuous batching
   (kva_attend_batch against a loop of kva_attend_cache). */
#include "harness.h"

/* a title line when a parallel region is slow to start here (see the machine table) */
static const char *fork_note(const machine *m, int T) {
  static char b[300];
  const roof *r = roof_for(m, T);
  b[0] = 0;
  if (BENCH_OMP && r->nt == T && r->fork_us > 200)
    snprintf(b, sizeof b,
             "\n  NOTE: an empty %d-thread parallel region takes %.0f us on average here (machine table: a core is\n"
             "  busy with other work); the %d-thread times include that wait, once or twice per call%s.",
             T, r->fork_us, T, getenv("OMP_WAIT_POLICY") ? "" : "\n  (OMP_WAIT_POLICY=passive may help)");
  return b;
}

/* ---- thread scaling of decode; split-K's promise: the same bits for any thread count ---- */

/* The library's split-K rule as docs/API.md states it: a decode call has (KV head, 64-row
   chunk) work items; with fewer than 8, each item's keys are cut into splits of at least 1,024
   keys (as many as make 8 units). A single call (not a batch plan) keeps the partial results,
   rows x (v_dim + 1) floats per unit, in 16,512 floats on its stack, which caps the splits.
   Shown to explain the tables; the bench does not depend on it. */
static int doc_items(int H, int G, int n_q) { return G * ((n_q * (H / G) + 63) / 64); }
static int doc_splits(int items, long n_kv) {
  long sp;
  if (items >= 8) return 1;
  sp = (8 + items - 1) / items;
  if (sp > n_kv / 1024) sp = n_kv / 1024;
  return sp < 1 ? 1 : (int)sp;
}
static int doc_splits_call(const shape *s, long n_kv) {
  int items = doc_items(s->H, s->G, 1), rows = s->H / s->G < 64 ? s->H / s->G : 64;
  int sp = doc_splits(items, n_kv);
  long cap = 16512L / ((long)items * rows * (s->DV + 1));
  if (sp > 1 && sp > cap) sp = cap < 1 ? 1 : (int)cap;
  return sp;
}

/* the thread count compared with 1: the largest of --threads, else 2 */
static int scaling_threads(const opts *o) {
  int k, t = 2;
  if (o->threads_set) {
    t = 1;
    for (k = 0; k < o->n_threads; k++)
      if (o->threads[k] > t) t = (int)o->threads[k];
    if (t < 2) t = 2;
  }
  return t;
}

static void run_threads(const opts *o, const machine *m, rows *t) {
  static const long def_ctx[] = {4096, 32768}, quick_ctx[] = {4096};
  struct {
    int var, H, G;
  } cs[4];
  const long *ctxs = o->ctx_set ? o->ctx : o->quick ? quick_ctx : def_ctx;
  int n_ctx = o->ctx_set ? o->n_ctx : o->quick ? 1 : 2, T = scaling_threads(o), ci, k, mode;
  uint64_t rng = o->seed + 6;
  cs[0].var = V_MQA; cs[0].H = o->H; cs[0].G = 1;
  cs[1].var = V_MLA; cs[1].H = 16;   cs[1].G = 1;
  cs[2].var = V_MLA; cs[2].H = 128;  cs[2].G = 1;
  cs[3].var = V_GQA; cs[3].H = o->H; cs[3].G = o->G;
  for (k = 0; k < 4; k++)
    for (ci = 0; ci < n_ctx; ci++) {
      shape s = variant_shape(cs[k].var, cs[k].H, cs[k].G, o->D);
      long ctx = ctxs[ci];
      size_t no = (size_t)s.H * s.DV;
      float *q = rand_floats((size_t)s.H * s.D, &rng), *out[2], *first[2];
      kva_cache *c = NULL;
      int seq, items = doc_items(s.H, s.G, 1), sp = doc_splits_call(&s, ctx), j;
      kva_status st;
      for (j = 0; j < 2; j++) {
        out[j] = (float *)xalloc(no * sizeof(float));
        first[j] = (float *)xalloc(no * sizeof(float));
      }
      progress("threads %s H=%d ctx=%ld: filling the cache", variant_name[s.var], s.H, ctx);
      st = build_cache(&s, KVA_F16, ctx, 1, 16, 0, 1.0f, 1.0f, NULL, NULL, &rng, &c, &seq);
      for (mode = 0; mode < 2; mode++) {
        call_ctx x[2];
        call_fn f[2];
        timing tm[2];
        row *w;
        int same_first, same_after, stable;
        if ((mode == 0 && !o->cold) || (mode == 1 && !o->warm)) continue;
        w = rows_add(t, "threads");
        set_shape_cols(w, &s, KVA_F16);
        rn(w, C_CTX, (double)ctx);
        rn(w, C_THREADS, T);
        rs(w, C_MODE, mode == 0 ? "cold" : "warm");
        rn(w, C_NQ, 1);
        rn(w, C_BLOCK, 16);
        rn(w, C_SPLITS, sp);
        rn(w, C_UNITS, (double)items * sp);
        if (st != KVA_OK) {
          rs(w, C_NOTE, "cache: %s", kva_status_str(st));
          g_failed = 1;
          continue;
        }
        progress("threads %s H=%d ctx=%ld: 1 and %d threads, %s", variant_name[s.var], s.H, ctx, T,
                 mode == 0 ? "cold" : "warm");
        for (j = 0; j < 2; j++) {
          memset(&x[j], 0, sizeof x[j]);
          x[j].c = c;
          x[j].seq = seq;
          x[j].a = shape_attn(&s, j ? T : 1);
          x[j].q = q;
          x[j].n_q = 1;
          x[j].out = out[j];
          f[j] = call_cache;
          if ((st = call_cache(&x[j])) != KVA_OK) break;
          memcpy(first[j], out[j], no * sizeof(float));
        }
        if (st == KVA_OK) time_interleaved(f, x, 2, mode == 0, o->reps, tm);
        if (st != KVA_OK || tm[0].st != KVA_OK || tm[1].st != KVA_OK) {
          rs(w, C_NOTE, "attend: %s", kva_status_str(st != KVA_OK ? st : tm[0].st != KVA_OK ? tm[0].st : tm[1].st));
          g_failed = 1;
          continue;
        }
        /* the first outputs of 1 and T threads, and every call's (the last one left in out) */
        same_first = memcmp(first[0], first[1], no * sizeof(float)) == 0;
        same_after = memcmp(out[0], out[1], no * sizeof(float)) == 0;
        stable = memcmp(out[0], first[0], no * sizeof(float)) == 0 && memcmp(out[1], first[1], no * sizeof(float)) == 0;
        set_base_timing(w, &tm[0]);
        set_timing(w, &tm[1]);
        rn(w, C_RATIO, tm[0].med / tm[1].med);
        set_roof(w, m, T, (double)ctx * (double)shape_bpt(&s, KVA_F16), 2.0 * s.H * (double)ctx * (s.D + s.DV),
                 tm[1].med);
        rn(w, C_NSTOK, tm[1].med / (double)ctx * 1e9);
        if (same_first && same_after && stable) rs(w, C_IDENT, "bit-identical");
        else {
          double mx = 0;
          size_t z;
          for (z = 0; z < no; z++)
            if (fabs((double)first[0][z] - first[1][z]) > mx) mx = fabs((double)first[0][z] - first[1][z]);
          rs(w, C_IDENT, "DIFFER%s (max %.2g)", stable ? "" : ", run to run", mx);
          g_failed = 1;
        }
        if (!BENCH_OMP) rs(w, C_NOTE, "built without OpenMP: 1 thread");
        else if (s.var == V_MLA) rs(w, C_NOTE, "absorbed: one latent KV head of %d, v_dim %d", s.D, s.DV);
      }
      if (c) kva_cache_destroy(c);
      free(q);
      for (j = 0; j < 2; j++) {
        free(out[j]);
        free(first[j]);
      }
    }
  progress_end();
}

static void print_threads(const rows *t, const opts *o, const machine *m) {
  static const vcol v[] = {{C_VARIANT, "variant", FM_STR},  {C_HEADS, "H", FM_INT},          {C_KVHEADS, "G", FM_INT},
                           {C_HEADDIM, "D", FM_INT},        {C_VDIM, "DV", FM_INT},          {C_CTX, "ctx", FM_SEP},
                           {C_MODE, "mode", FM_STR},        {C_SPLITS, "splits", FM_INT},    {C_UNITS, "units", FM_INT},
                           {C_BASET, "1 thr ms", FM_MS},    {C_BASEMIN, "min-max", FM_RANGEB}, {C_THREADS, "thr", FM_INT},
                           {C_TMED, "ms", FM_MS},           {C_TMIN, "min-max", FM_RANGE},   {C_RATIO, "speedup", FM_X},
                           {C_BWRATIO, "/BW", FM_X},        {C_FMARATIO, "/FMA", FM_X},      {C_IDENT, "1 vs thr", FM_STR},
                           {C_NOTE, "note", FM_STR}};
  char title[1000];
  snprintf(title, sizeof title,
           "Decode thread scaling: kva_attn.n_threads 1 against %d, F16 cache, block 16, n_q=1; the two timed in\n"
           "  turns%s.\n"
           "  splits / units: split-K by docs/API.md's rule (fewer than 8 (KV head, 64-row) items: the keys are\n"
           "  cut into >= 1,024-key splits, as many as the call's 16,512-float stack scratch holds, merged by\n"
           "  log-sum-exp); speedup = 1-thread median / %d-thread median;\n"
           "  /BW and /FMA: the %d-thread run against the %d-thread roofs above; 1 vs thr: the outputs of 1 and\n"
           "  %d threads compared with memcmp (the library promises the same bits for any thread count), and\n"
           "  every timed call's output against the first.%s",
           scaling_threads(o), BENCH_OMP ? "" : " -- BUILT WITHOUT OpenMP: both run on 1 thread, no scaling",
           scaling_threads(o), scaling_threads(o), scaling_threads(o), scaling_threads(o),
           fork_note(m, scaling_threads(o)));
  print_table(title, v, NV(v), t, C_VARIANT);
}

/* ---- continuous batching: kva_attend_batch against a loop of kva_attend_cache ---- */

/* n sequences of lens[i] tokens in one one-layer cache, filled in turns (256 tokens each) so that
   their blocks interleave in the pool as a server's do; each sequence's last append is its one
   decode token. */
static kva_status build_multi(const shape *s, kva_dtype dt, const int *lens, int n, uint64_t *rng, kva_cache **out,
                              int *seqs) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_status st;
  long nb = n;
  int i, left, *done = (int *)xalloc((size_t)n * sizeof(int));
  for (i = 0; i < n; i++) nb += (lens[i] + 15) / 16;
  d = shape_desc(s, 1, dt);
  d.k_scale = d.v_scale = 1.0f;
  d.n_blocks = (int)nb;
  d.max_seqs = n;
  if ((st = kva_cache_create(&d, &c)) != KVA_OK) goto out;
  for (i = 0; i < n; i++) {
    done[i] = 0;
    if ((st = kva_seq_new(c, &seqs[i])) != KVA_OK) goto fail;
  }
  do { /* the bodies in turns */
    left = 0;
    for (i = 0; i < n; i++) {
      int m = lens[i] - 1 - done[i];
      if (m > 256) m = 256;
      if (m <= 0) continue;
      if ((st = kva_seq_append(c, seqs[i], m)) != KVA_OK) goto fail;
      if ((st = kva_store(c, seqs[i], 0, pool_at(rng, (size_t)m * s->G * s->D),
                          s->kind == KVA_CACHE_LATENT ? NULL : pool_at(rng, (size_t)m * s->G * s->DV), m)) != KVA_OK)
        goto fail;
      done[i] += m;
      if (done[i] < lens[i] - 1) left = 1;
    }
  } while (left);
  for (i = 0; i < n; i++) { /* every sequence's decode token: its latest append */
    if ((st = kva_seq_append(c, seqs[i], 1)) != KVA_OK) goto fail;
    if ((st = kva_store(c, seqs[i], 0, pool_at(rng, (size_t)s->G * s->D),
                        s->kind == KVA_CACHE_LATENT ? NULL : pool_at(rng, (size_t)s->G * s->DV), 1)) != KVA_OK)
      goto fail;
  }
  *out = c;
  free(done);
  return KVA_OK;
fail:
  kva_cache_destroy(c);
out:
  free(done);
  return st;
}

typedef struct {
  const char *name;
  shape s;
  int n, *lens;
} batch_case;

/* per sequence, the split-K parts by docs/API.md's rule: alone (kva_attend_cache) and in the batch */
static void batch_splits(const batch_case *bc, int *alone, int *in_batch) {
  int i, items = doc_items(bc->s.H, bc->s.G, 1), total = items * bc->n;
  for (i = 0; i < bc->n; i++) {
    alone[i] = doc_splits_call(&bc->s, bc->lens[i]);
    in_batch[i] = doc_splits(total, bc->lens[i]);
  }
}

static void run_batch_case(const opts *o, const machine *m, const batch_case *bc, rows *t, uint64_t *rng) {
  const shape *s = &bc->s;
  const int T = scaling_threads(o), n = bc->n;
  size_t qs = (size_t)s->H * s->D, os = (size_t)s->H * s->DV, no = os * (size_t)n;
  float *q = rand_floats(qs * (size_t)n, rng);
  float *ob = (float *)xalloc(no * 4), *ol = (float *)xalloc(no * 4), *fb[2], *fl[2];
  int *seqs = (int *)xalloc((size_t)n * sizeof(int)), *nq = (int *)xalloc((size_t)n * sizeof(int));
  int *sa = (int *)xalloc((size_t)n * sizeof(int)), *sb = (int *)xalloc((size_t)n * sizeof(int));
  kva_cache *c = NULL;
  kva_status st;
  double tokens = 0;
  int i, ti, mode, lmin = bc->lens[0], lmax = bc->lens[0], smax_a = 1, smax_b = 1;
  char lens_s[64];
  for (i = 0; i < n; i++) {
    nq[i] = 1;
    tokens += bc->lens[i];
    if (bc->lens[i] < lmin) lmin = bc->lens[i];
    if (bc->lens[i] > lmax) lmax = bc->lens[i];
  }
  batch_splits(bc, sa, sb);
  for (i = 0; i < n; i++) {
    if (sa[i] > smax_a) smax_a = sa[i];
    if (sb[i] > smax_b) smax_b = sb[i];
  }
  if (lmin == lmax) snprintf(lens_s, sizeof lens_s, "%d", lmin);
  else if (n == 2) snprintf(lens_s, sizeof lens_s, "%d+%d", bc->lens[0], bc->lens[1]);
  else snprintf(lens_s, sizeof lens_s, "%d-%d", lmin, lmax);
  for (i = 0; i < 2; i++) {
    fb[i] = (float *)xalloc(no * 4);
    fl[i] = (float *)xalloc(no * 4);
  }
  progress("batch %s: filling %d sequences (%.0f tokens)", bc->name, n, tokens);
  st = build_multi(s, KVA_F16, bc->lens, n, rng, &c, seqs);
  for (ti = 0; ti < 2; ti++) {
    int thr = ti ? T : 1;
    kva_batch *plan = NULL;
    double plan_s = 0, pt[15];
    kva_attn a = shape_attn(s, thr);
    int k, ident = 0, n_unsplit = 0, same_thr = 1;
    double mx = 0;
    kva_status pst = KVA_OK;
    if (st == KVA_OK) {
      /* the plan: once per step for every layer; median of 15 (plan + free), then one to run */
      progress("batch %s: plan, %d thread(s)", bc->name, thr);
      for (k = 0; k < 15 && pst == KVA_OK; k++) {
        double t0 = now_s();
        pst = kva_batch_plan(c, &a, seqs, nq, n, &plan);
        pt[k] = now_s() - t0;
        if (pst == KVA_OK) kva_batch_free(plan);
        plan = NULL;
      }
      if (pst == KVA_OK) {
        plan_s = median_d(pt, 15);
        pst = kva_batch_plan(c, &a, seqs, nq, n, &plan);
      }
    }
    for (mode = 0; mode < 2; mode++) {
      call_ctx x[2];
      call_fn f[2];
      timing tm[2];
      row *w;
      kva_status e = st != KVA_OK ? st : pst;
      if ((mode == 0 && !o->cold) || (mode == 1 && !o->warm)) continue;
      w = rows_add(t, "batch");
      rs(w, C_SCHEME, "%s", bc->name);
      set_shape_cols(w, s, KVA_F16);
      rn(w, C_BATCH, n);
      rs(w, C_LENS, "%s", lens_s);
      rn(w, C_TOKENS, tokens);
      rn(w, C_THREADS, thr);
      rs(w, C_MODE, mode == 0 ? "cold" : "warm");
      rn(w, C_NQ, 1);
      rs(w, C_SPLITS, "%d / %d", smax_b, smax_a);
      if (e != KVA_OK) {
        rs(w, C_NOTE, "%s: %s", st != KVA_OK ? "cache" : "kva_batch_plan", kva_status_str(e));
        g_failed = 1;
        continue;
      }
      rn(w, C_PLAN, plan_s);
      progress("batch %s: %d thread(s), %s", bc->name, thr, mode == 0 ? "cold" : "warm");
      memset(x, 0, sizeof x);
      for (k = 0; k < 2; k++) {
        x[k].c = c;
        x[k].a = a;
        x[k].q = q;
        x[k].seqs = seqs;
        x[k].n_seqs = n;
        x[k].plan = plan;
        x[k].out = k ? ol : ob;
        f[k] = k ? call_loop : call_batch;
      }
      if ((e = call_batch(&x[0])) == KVA_OK && (e = call_loop(&x[1])) == KVA_OK) {
        memcpy(fb[ti], ob, no * 4);
        memcpy(fl[ti], ol, no * 4);
        time_interleaved(f, x, 2, mode == 0, o->reps, tm);
        e = tm[0].st != KVA_OK ? tm[0].st : tm[1].st;
      }
      if (e != KVA_OK) {
        rs(w, C_NOTE, "attend: %s", kva_status_str(e));
        g_failed = 1;
        continue;
      }
      set_timing(w, &tm[0]);
      set_base_timing(w, &tm[1]);
      rn(w, C_RATIO, tm[1].med / tm[0].med);
      set_roof(w, m, thr, tokens * (double)shape_bpt(s, KVA_F16), 2.0 * s->H * tokens * (s->D + s->DV), tm[0].med);
      /* batch against loop, per sequence; bit-identical expected where neither splits */
      ident = n_unsplit = 0;
      mx = 0;
      for (i = 0; i < n; i++) {
        size_t z, off = (size_t)i * os;
        int same = memcmp(fb[ti] + off, fl[ti] + off, os * 4) == 0;
        for (z = 0; z < os; z++) {
          double d = fabs((double)fb[ti][off + z] - fl[ti][off + z]);
          if (d > mx) mx = d;
        }
        if (sa[i] == 1 && sb[i] == 1) {
          n_unsplit++;
          ident += same;
        }
      }
      rn(w, C_MAXABS, mx);
      if (n_unsplit) rs(w, C_IDENT, "%d/%d unsplit bit-identical", ident, n_unsplit);
      else rs(w, C_IDENT, "all split: not bitwise");
      if (ident != n_unsplit) g_failed = 1;
      /* every timed call left the same bits, and T threads give 1 thread's */
      same_thr = memcmp(ob, fb[ti], no * 4) == 0 && memcmp(ol, fl[ti], no * 4) == 0;
      if (ti) same_thr = same_thr && memcmp(fb[1], fb[0], no * 4) == 0 && memcmp(fl[1], fl[0], no * 4) == 0;
      rs(w, C_PASS, same_thr ? (ti ? "= 1 thread" : "stable") : "DIFFER");
      if (!same_thr) g_failed = 1;
      rn(w, C_PLANFRAC, plan_s / tm[0].med);
      if (!BENCH_OMP && thr > 1) rs(w, C_NOTE, "built without OpenMP: 1 thread");
      else if (smax_b != smax_a) rs(w, C_NOTE, "split-K differs (batch / alone): sums round differently");
    }
    if (plan) kva_batch_free(plan);
  }
  if (c) kva_cache_destroy(c);
  for (i = 0; i < 2; i++) {
    free(fb[i]);
    free(fl[i]);
  }
  free(q); free(ob); free(ol); free(seqs); free(nq); free(sa); free(sb);
}

static void run_batch(const opts *o, const machine *m, rows *t) {
  uint64_t rng = o->seed + 7;
  batch_case bc;
  int i, two[2];
  /* GQA, N sequences of log-uniform lengths */
  bc.name = "GQA, log-uniform";
  bc.s = variant_shape(V_GQA, o->H, o->G, o->D);
  bc.n = o->batch_seqs;
  bc.lens = (int *)xalloc((size_t)bc.n * sizeof(int));
  for (i = 0; i < bc.n; i++) bc.lens[i] = rand_log_int(&rng, o->batch_lo, o->batch_hi);
  run_batch_case(o, m, &bc, t, &rng);
  free(bc.lens);
  /* two long MQA sequences: few work items, split-K matters */
  bc.name = "MQA, 2 long";
  bc.s = variant_shape(V_MQA, o->H, 1, o->D);
  bc.n = 2;
  two[0] = o->quick ? 8192 : 32768;
  two[1] = two[0] / 2;
  bc.lens = two;
  run_batch_case(o, m, &bc, t, &rng);
  progress_end();
}

static void print_batch(const rows *t, const opts *o, const machine *m) {
  static const vcol v[] = {{C_SCHEME, "batch", FM_STR},     {C_BATCH, "N", FM_INT},           {C_LENS, "lengths", FM_STR},
                           {C_TOKENS, "tokens", FM_SEP},    {C_THREADS, "thr", FM_INT},       {C_MODE, "mode", FM_STR},
                           {C_SPLITS, "splits b/a", FM_STR}, {C_PLAN, "plan us", FM_US},      {C_PLANFRAC, "plan/run", FM_E},
                           {C_TMED, "batch ms", FM_MS},
                           {C_TMIN, "min-max", FM_RANGE},   {C_BASET, "loop ms", FM_MS},      {C_BASEMIN, "min-max", FM_RANGEB},
                           {C_RATIO, "loop/batch", FM_X},   {C_GBPS, "GB/s", FM_F1},          {C_BWRATIO, "/BW", FM_X},
                           {C_MAXABS, "max|b-l|", FM_E},    {C_IDENT, "batch vs loop", FM_STR}, {C_PASS, "threads", FM_STR},
                           {C_NOTE, "note", FM_STR}};
  char title[1400];
  snprintf(title, sizeof title,
           "Continuous-batching decode, one token per sequence, F16 cache (block 16, the sequences' blocks\n"
           "  interleaved in one pool): kva_attend_batch on a plan (kva_batch_plan) against a loop of\n"
           "  kva_attend_cache over the same sequences, the two timed in turns; 1 and %d threads%s.\n"
           "  GQA H=%d G=%d D=%d: %d sequences, lengths log-uniform %d..%d (seed %llu); MQA H=%d D=%d: 2 long\n"
           "  sequences. plan us = median of 15 kva_batch_plan + kva_batch_free (paid once per step for all\n"
           "  layers), plan/run = that over one layer's batch median; loop/batch = loop median / batch median; GB/s\n"
           "  and /BW of the batch. splits b/a = the most split-K parts of a sequence in the batch / alone (by\n"
           "  docs/API.md's rule). max|b-l| = largest output difference; batch vs loop: sequences split in neither\n"
           "  must give the same bits; threads: every call's bits the same, and %d threads' = 1 thread's.%s",
           scaling_threads(o), BENCH_OMP ? "" : " (BUILT WITHOUT OpenMP: no scaling)", o->H, o->G, o->D,
           o->batch_seqs, o->batch_lo, o->batch_hi, (unsigned long long)o->seed, o->H, o->D, scaling_threads(o),
           fork_note(m, scaling_threads(o)));
  print_table(title, v, NV(v), t, C_SCHEME);
}


void speed_threads(const opts *o, const machine *m) {
  rows t = {0};
  run_threads(o, m, &t);
  print_threads(&t, o, m);
  emit_rows(&t);
  rows_free(&t);
}

void speed_batch(const opts *o, const machine *m) {
  rows t = {0};
  run_batch(o, m, &t);
  print_batch(&t, o, m);
  emit_rows(&t);
  rows_free(&t);
}
