/* bench/bench_speed.c - kvattn_bench speed: decode for the variants, dtypes, contexts, thread
   counts, cold and warm; prefill; paged against contiguous arrays; decode against context
   (--sweep). Thread scaling and batching are in bench_speed_threads.c. */
#include "harness.h"

static const vcol decode_view[] = {
    {C_VARIANT, "variant", FM_STR}, {C_DTYPE, "dtype", FM_STR},   {C_CTX, "ctx", FM_SEP},
    {C_THREADS, "thr", FM_INT},     {C_MODE, "mode", FM_STR},     {C_TMED, "ms med", FM_MS},
    {C_TMIN, "ms min-max", FM_RANGE}, {C_NSTOK, "ns/tok", FM_F1}, {C_KVBYTES, "KV MiB", FM_MIB}, {C_GBPS, "GB/s", FM_F1},
    {C_BWRATIO, "/BW", FM_X},       {C_GFLOPS, "GFLOP/s", FM_F1}, {C_FMARATIO, "/FMA", FM_X},
    {C_BOUND, "bound", FM_STR},     {C_ROOFRATIO, "/roof", FM_X}, {C_NOTE, "note", FM_STR}};

static const char *decode_title =
    "Decode: one query token (n_q=1) over ctx cached tokens, kva_attend_cache, one layer, block 16\n"
    "  KV MiB = tokens x bytes/token/layer read per call; /BW = GB/s over the read bandwidth measured\n"
    "  above (same thread count); GFLOP/s counts 2 per FMA (scores H*n*D + values H*n*DV); /FMA = over\n"
    "  the FMA peak of the library's ISA; bound = the roof with the longer floor; /roof = that floor / time";

/* decode rows for variants x dtypes x ctx x threads x modes */
void run_decode(const opts *o, const machine *m, rows *t) {
  int vi, di, ci, ti, mode;
  uint64_t rng = o->seed;
  for (vi = 0; vi < o->n_variants; vi++) {
    shape s = variant_shape(o->variants[vi], o->H, o->G, o->D);
    for (di = 0; di < o->n_dtypes; di++) {
      kva_dtype dt = o->dtypes[di];
      for (ci = 0; ci < o->n_ctx; ci++) {
        long ctx = o->ctx[ci];
        kva_cache *c = NULL;
        int seq;
        kva_status st;
        float *q = rand_floats((size_t)s.H * (size_t)s.D, &rng), *out = (float *)xalloc((size_t)s.H * s.DV * 4);
        progress("decode %s %s ctx=%ld: filling the cache", variant_name[s.var], kva_dtype_name(dt), ctx);
        st = build_cache(&s, dt, ctx, 1, 16, 0, 1.0f, 1.0f, NULL, NULL, &rng, &c, &seq);
        for (ti = 0; ti < o->n_threads; ti++)
          for (mode = 0; mode < 2; mode++) {
            row *w;
            call_ctx x;
            timing tm;
            if ((mode == 0 && !o->cold) || (mode == 1 && !o->warm)) continue;
            w = rows_add(t, "decode");
            set_shape_cols(w, &s, dt);
            rn(w, C_CTX, (double)ctx);
            rn(w, C_THREADS, (double)o->threads[ti]);
            rs(w, C_MODE, mode == 0 ? "cold" : "warm");
            rn(w, C_NQ, 1);
            rn(w, C_BLOCK, 16);
            if (st != KVA_OK) {
              rs(w, C_NOTE, st == KVA_ERR_UNSUPPORTED ? "unsupported" : "cache: %s", kva_status_str(st));
              if (st != KVA_ERR_UNSUPPORTED) g_failed = 1;
              continue;
            }
            progress("decode %s %s ctx=%ld threads=%ld %s", variant_name[s.var], kva_dtype_name(dt), ctx, o->threads[ti],
                     mode == 0 ? "cold" : "warm");
            memset(&x, 0, sizeof x);
            x.c = c;
            x.seq = seq;
            x.a = shape_attn(&s, (int)o->threads[ti]);
            x.q = q;
            x.n_q = 1;
            x.out = out;
            tm = time_calls(call_cache, &x, mode == 0, o->reps);
            if (tm.st != KVA_OK) {
              rs(w, C_NOTE, "attend: %s", kva_status_str(tm.st));
              g_failed = 1;
              continue;
            }
            set_timing(w, &tm);
            set_roof(w, m, (int)o->threads[ti], (double)ctx * (double)shape_bpt(&s, dt),
                     2.0 * s.H * (double)ctx * (s.D + s.DV), tm.med);
            rn(w, C_NSTOK, tm.med / (double)ctx * 1e9);
          }
        if (c) kva_cache_destroy(c);
        free(q);
        free(out);
      }
    }
  }
  progress_end();
}

/* prefill: n_q causal queries over n_kv cached tokens (the last n_q of them are the queries) */
static void run_prefill(const opts *o, const machine *m, rows *t) {
  int vi, ti, src;
  uint64_t rng = o->seed + 1;
  long nq = o->prefill_nq, nkv = o->prefill_ctx;
  double pairs = (double)nq * (double)(nkv - nq) + (double)nq * (double)(nq + 1) / 2; /* unmasked pairs */
  for (vi = 0; vi < o->n_variants; vi++) {
    shape s = variant_shape(o->variants[vi], o->H, o->G, o->D);
    float *q, *out;
    if (s.kind == KVA_CACHE_LATENT) continue; /* MLA prefill runs un-absorbed (kva_mla_forward), not this kernel */
    q = rand_floats((size_t)nq * s.H * s.D, &rng);
    out = (float *)xalloc((size_t)nq * s.H * s.DV * 4);
    for (src = 0; src <= o->n_dtypes; src++) { /* src == n_dtypes: plain float arrays via kva_attend */
      kva_dtype dt = src < o->n_dtypes ? o->dtypes[src] : KVA_F32;
      kva_cache *c = NULL;
      int seq = 0;
      kva_status st = KVA_OK;
      float *k = NULL, *v = NULL;
      if (src < o->n_dtypes) {
        progress("prefill %s %s: filling the cache", variant_name[s.var], kva_dtype_name(dt));
        st = build_cache(&s, dt, nkv, (int)nq, 16, 0, 1.0f, 1.0f, NULL, NULL, &rng, &c, &seq);
      } else {
        k = rand_floats((size_t)nkv * s.G * s.D, &rng);
        v = rand_floats((size_t)nkv * s.G * s.DV, &rng);
      }
      for (ti = 0; ti < o->n_threads; ti++) {
        row *w = rows_add(t, "prefill");
        call_ctx x;
        timing tm;
        set_shape_cols(w, &s, dt);
        rs(w, C_LAYOUT, src < o->n_dtypes ? "cache" : "arrays");
        rn(w, C_CTX, (double)nkv);
        rn(w, C_NQ, (double)nq);
        rn(w, C_THREADS, (double)o->threads[ti]);
        rs(w, C_MODE, "warm");
        if (st != KVA_OK) {
          rs(w, C_NOTE, st == KVA_ERR_UNSUPPORTED ? "unsupported" : "cache: %s", kva_status_str(st));
          if (st != KVA_ERR_UNSUPPORTED) g_failed = 1;
          continue;
        }
        progress("prefill %s %s %s threads=%ld", variant_name[s.var], kva_dtype_name(dt), src < o->n_dtypes ? "cache" : "arrays",
                 o->threads[ti]);
        memset(&x, 0, sizeof x);
        x.c = c;
        x.seq = seq;
        x.a = shape_attn(&s, (int)o->threads[ti]);
        x.q = q;
        x.n_q = (int)nq;
        x.k = k;
        x.v = v;
        x.n_kv = (int)nkv;
        x.out = out;
        tm = time_calls(src < o->n_dtypes ? call_cache : call_array, &x, 0, o->reps < 3 ? o->reps : 3);
        if (tm.st != KVA_OK) {
          rs(w, C_NOTE, "attend: %s", kva_status_str(tm.st));
          g_failed = 1;
          continue;
        }
        set_timing(w, &tm);
        set_roof(w, m, (int)o->threads[ti], (double)nkv * (double)shape_bpt(&s, dt), 2.0 * pairs * s.H * (s.D + s.DV),
                 tm.med);
      }
      if (c) kva_cache_destroy(c);
      free(k);
      free(v);
    }
    free(q);
    free(out);
  }
  progress_end();
}

/* the same decode on contiguous float arrays (kva_attend) and through the paged F32 cache */
static void run_paged_vs_contig(const opts *o, rows *t) {
  int vi, ci, ti, mode;
  uint64_t rng = o->seed + 2;
  for (vi = 0; vi < o->n_variants; vi++) {
    shape s = variant_shape(o->variants[vi], o->H, o->G, o->D);
    if (s.kind == KVA_CACHE_LATENT) continue; /* a latent cache reads V inside K: not the same bytes as arrays */
    for (ci = 0; ci < o->n_ctx; ci++) {
      long ctx = o->ctx[ci];
      size_t nk = (size_t)ctx * s.G * s.D, nv = (size_t)ctx * s.G * s.DV;
      float *k, *v, *q = rand_floats((size_t)s.H * s.D, &rng), *out = (float *)xalloc((size_t)s.H * s.DV * 4);
      kva_cache *c = NULL;
      int seq;
      kva_status st;
      progress("paged vs contiguous %s ctx=%ld: filling", variant_name[s.var], ctx);
      k = rand_floats(nk, &rng);
      v = rand_floats(nv, &rng);
      st = build_cache(&s, KVA_F32, ctx, 1, 16, 0, 1.0f, 1.0f, k, v, &rng, &c, &seq);
      for (ti = 0; ti < o->n_threads; ti++)
        for (mode = 0; mode < 2; mode++) {
          call_ctx x;
          timing ta, tc;
          row *w;
          if ((mode == 0 && !o->cold) || (mode == 1 && !o->warm)) continue;
          w = rows_add(t, "paged_vs_contig");
          set_shape_cols(w, &s, KVA_F32);
          rn(w, C_CTX, (double)ctx);
          rn(w, C_THREADS, (double)o->threads[ti]);
          rs(w, C_MODE, mode == 0 ? "cold" : "warm");
          rn(w, C_BLOCK, 16);
          if (st != KVA_OK) {
            rs(w, C_NOTE, "cache: %s", kva_status_str(st));
            g_failed = 1;
            continue;
          }
          progress("paged vs contiguous %s ctx=%ld threads=%ld %s", variant_name[s.var], ctx, o->threads[ti],
                   mode == 0 ? "cold" : "warm");
          memset(&x, 0, sizeof x);
          x.c = c;
          x.seq = seq;
          x.a = shape_attn(&s, (int)o->threads[ti]);
          x.q = q;
          x.n_q = 1;
          x.k = k;
          x.v = v;
          x.n_kv = (int)ctx;
          x.out = out;
          ta = time_calls(call_array, &x, mode == 0, o->reps);
          tc = time_calls(call_cache, &x, mode == 0, o->reps);
          if (ta.st != KVA_OK || tc.st != KVA_OK) {
            rs(w, C_NOTE, "attend failed");
            g_failed = 1;
            continue;
          }
          rn(w, C_BASET, ta.med);
          set_timing(w, &tc);
          rn(w, C_RATIO, tc.med / ta.med);
        }
      if (c) kva_cache_destroy(c);
      free(k);
      free(v);
      free(q);
      free(out);
    }
  }
  progress_end();
}

void print_decode(const rows *t, const char *title) { print_table(title, decode_view, NV(decode_view), t, C_VARIANT); }

/* ---- decode against context: the linear cost and the cache-to-DRAM step ---- */

static const long sweep_ctx[] = {1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072};
#define N_SWEEP 8
#define N_SWEEP_QUICK 5 /* --quick: 1K..16K */

/* the sweep's defaults where the command line left them: contexts 1K..128K, f16, 1 thread, cold
   and warm (warm: what fits in the caches is read from them; cold: everything from DRAM) */
void sweep_opts(opts *so) {
  int k;
  if (!so->ctx_set) {
    so->n_ctx = so->quick ? N_SWEEP_QUICK : N_SWEEP;
    for (k = 0; k < so->n_ctx; k++) so->ctx[k] = sweep_ctx[k];
  }
  if (!so->dtypes_set) {
    so->dtypes[0] = KVA_F16;
    so->n_dtypes = 1;
  }
  if (!so->threads_set) {
    so->threads[0] = 1;
    so->n_threads = 1;
  }
  if (!so->modes_set) so->cold = so->warm = 1;
}

/* Decode rows ordered as series (variant, dtype, threads, mode; context order kept): gnuplot
   breaks a line at every row its filter drops, so plot.gp needs each series' rows together. */
static int variant_rank(const row *r) {
  int k;
  for (k = 0; k < NVARIANT && r->kind[C_VARIANT] == 2; k++)
    if (!strcmp(r->str[C_VARIANT], variant_name[k])) return k;
  return NVARIANT;
}
static int series_cmp(const row *a, const row *b) {
  static const int key[] = {C_VARIANT, C_DTYPE, C_THREADS, C_MODE};
  int k;
  if (variant_rank(a) != variant_rank(b)) return variant_rank(a) - variant_rank(b);
  for (k = 1; k < 4; k++) {
    int c = key[k];
    if (a->kind[c] == 2 && b->kind[c] == 2) {
      int d = strcmp(a->str[c], b->str[c]);
      if (d) return d;
    } else if (a->kind[c] == 1 && b->kind[c] == 1 && a->num[c] != b->num[c])
      return a->num[c] < b->num[c] ? -1 : 1;
  }
  return 0;
}
void rows_sort_series(rows *t) {
  int i, j;
  for (i = 1; i < t->n; i++) { /* insertion sort: stable, and these tables are small */
    row tmp = t->r[i];
    for (j = i; j > 0 && series_cmp(&t->r[j - 1], &tmp) > 0; j--) t->r[j] = t->r[j - 1];
    t->r[j] = tmp;
  }
}

static const row *find_decode_row(const rows *t, const char *var, const char *dt, long ctx, long thr, const char *mode) {
  int i;
  for (i = 0; i < t->n; i++) {
    const row *r = &t->r[i];
    if (r->kind[C_VARIANT] == 2 && !strcmp(r->str[C_VARIANT], var) && r->kind[C_DTYPE] == 2 &&
        !strcmp(r->str[C_DTYPE], dt) && r->num[C_CTX] == (double)ctx && r->num[C_THREADS] == (double)thr &&
        r->kind[C_MODE] == 2 && !strcmp(r->str[C_MODE], mode))
      return r;
  }
  return NULL;
}

static void run_sweep(const opts *o, const machine *m) {
  opts so = *o;
  rows t = {0};
  int vi, di, ti, mode, ci;
  char title[900], caches[160];
  long l2 = 0, l3 = 0;
  sweep_opts(&so);
  run_decode(&so, m, &t);
  rows_sort_series(&t);
#ifdef _SC_LEVEL3_CACHE_SIZE
  l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  if (l2 > 0 && l3 > 0)
    snprintf(caches, sizeof caches, "L2 %.1f MiB per core, L3 %.0f MiB as the OS reports it (a VM may report the\n"
                                    "  whole socket's)", (double)l2 / MiB, (double)l3 / MiB);
  else snprintf(caches, sizeof caches, "cache sizes unknown");
  snprintf(title, sizeof title,
           "Decode against context (kva_attend_cache, n_q=1, block 16): the cost per cached token (ns/tok =\n"
           "  median / ctx) is flat where decode is linear; warm calls read what fits in the caches from them, so\n"
           "  warm ns/tok steps up to cold's where the KV (KV MiB) outgrows the last-level cache. %s.",
           caches);
  print_decode(&t, title);
  if (g_fmt == OUT_TABLE) {
    text("\nns per cached token (median / ctx) against context, with KV MiB per call\n");
    text("%-8s %-8s %3s %-6s", "variant", "dtype", "thr", "mode");
    for (ci = 0; ci < so.n_ctx; ci++) {
      char h[32];
      if (so.ctx[ci] % 1024 == 0) snprintf(h, sizeof h, "%ldK", so.ctx[ci] / 1024);
      else snprintf(h, sizeof h, "%ld", so.ctx[ci]);
      text(" %8s", h);
    }
    text("\n");
    for (vi = 0; vi < so.n_variants; vi++) {
      const char *vn = variant_name[so.variants[vi]];
      for (di = 0; di < so.n_dtypes; di++) {
        const char *dn = kva_dtype_name(so.dtypes[di]);
        for (ti = 0; ti < so.n_threads; ti++)
          for (mode = 0; mode < 3; mode++) {
            const char *mn = mode == 0 ? "cold" : mode == 1 ? "warm" : "KV MiB";
            if ((mode == 0 && !so.cold) || (mode == 1 && !so.warm) || (mode == 2 && ti > 0)) continue;
            text("%-8s %-8s %3ld %-6s", di == 0 && ti == 0 && mode == (so.cold ? 0 : 1) ? vn : "", dn, so.threads[ti], mn);
            for (ci = 0; ci < so.n_ctx; ci++) {
              const row *r = find_decode_row(&t, vn, dn, so.ctx[ci], so.threads[ti], mode == 1 ? "warm" : mode == 0 ? "cold" : so.cold ? "cold" : "warm");
              if (!r || r->kind[mode == 2 ? C_KVBYTES : C_NSTOK] != 1) text(" %8s", "-");
              else if (mode == 2) text(" %8.1f", r->num[C_KVBYTES] / MiB);
              else text(" %8.1f", r->num[C_NSTOK]);
            }
            text("\n");
          }
      }
    }
  }
  emit_rows(&t);
  rows_free(&t);
}

/* ---- the parts of speed (run in this order: decode, prefill, contig, threads, batch, tree, sweep;
   threads and batch are in bench_speed_threads.c, tree in bench_seq.c) ---- */

void speed_decode(const opts *o, const machine *m) {
  rows t = {0};
  run_decode(o, m, &t);
  print_decode(&t, decode_title);
  emit_rows(&t);
  rows_free(&t);
}

void speed_prefill(const opts *o, const machine *m) {
  static const vcol v[] = {
      {C_VARIANT, "variant", FM_STR}, {C_DTYPE, "dtype", FM_STR},  {C_LAYOUT, "K/V in", FM_STR},
      {C_NQ, "n_q", FM_INT},          {C_CTX, "n_kv", FM_SEP},     {C_THREADS, "thr", FM_INT},
      {C_TMED, "ms med", FM_MS},      {C_TMIN, "ms min-max", FM_RANGE}, {C_GFLOP, "GFLOP", FM_F2},
      {C_GFLOPS, "GFLOP/s", FM_F1},   {C_FMARATIO, "/FMA", FM_X},  {C_NOTE, "note", FM_STR}};
  rows t = {0};
  char title[600];
  if (!o->prefill) return; /* --no-prefill */
  run_prefill(o, m, &t);
  snprintf(title, sizeof title,
           "Prefill: %d causal queries over %d cached tokens (warm; K/V in a cache, or plain f32 arrays via "
           "kva_attend)\n  GFLOP counts unmasked (query, key) pairs only: 2 x pairs x H x (D + DV); /FMA = over "
           "the FMA peak of the library's ISA\n  (no MLA row: MLA prefill runs un-absorbed, through kva_mla_forward)",
           o->prefill_nq, o->prefill_ctx);
  print_table(title, v, NV(v), &t, C_VARIANT);
  emit_rows(&t);
  rows_free(&t);
}

void speed_contig(const opts *o, const machine *m) {
  static const vcol v[] = {{C_VARIANT, "variant", FM_STR}, {C_CTX, "ctx", FM_SEP},
                           {C_THREADS, "thr", FM_INT},     {C_MODE, "mode", FM_STR},
                           {C_BASET, "contiguous ms", FM_MS}, {C_TMED, "paged ms", FM_MS},
                           {C_RATIO, "paged/contig", FM_X}, {C_NOTE, "note", FM_STR}};
  rows t = {0};
  (void)m;
  run_paged_vs_contig(o, &t);
  print_table("Decode, paged vs contiguous: the same f32 K/V as plain [token][head][dim] arrays (kva_attend)\n"
              "  and in the paged cache (block 16, kva_attend_cache); medians (no MLA row: a latent cache reads\n"
              "  V inside K, arrays could not)",
              v, NV(v), &t, C_VARIANT);
  emit_rows(&t);
  rows_free(&t);
}

void speed_sweep(const opts *o, const machine *m) { run_sweep(o, m); }
