/* bench/bench_paged_alloc.c - kvattn_bench paged, parts trace, prefix and ops: a request trace
   through a real cache (memory waste, batch size), a shared system prompt across two tenants
   (prefix caching), block operations per second. */
#include "harness.h"

/* The trace caches are one layer of Llama-3-8B (G=8, D=128, F16: 4 KiB per token). Waste,
   hit rates and batch sizes do not depend on the layer count (every layer's block holds the
   same tokens); the byte columns scale with it (x32 for the whole model). No K/V is stored:
   what the allocator does does not depend on the data. */
static kva_cache_desc trace_desc(int bs, int n_blocks, int max_seqs) {
  kva_cache_desc d;
  memset(&d, 0, sizeof d);
  d.n_layers = 1;
  d.n_kv_heads = 8;
  d.head_dim = 128;
  d.dtype = KVA_F16;
  d.block_size = bs;
  d.n_blocks = n_blocks;
  d.max_seqs = max_seqs;
  return d;
}

typedef struct {
  int prompt, output;
} trace_req;


enum { SCH_PAGED, SCH_MAXLEN, SCH_ORACLE };

typedef struct {
  double used, need, reserved, occ, running; /* sums over steps */
  double peak_used;
  int peak_running, n_blocks, bad;
  long steps, preemptions;
  size_t block_bytes, bpt;
  char msg[200];
} trace_res;

/* Continuous batching of the whole trace (every request queued at step 0, first come first
   served) through one real cache:
     SCH_PAGED   admit while the prompt fits (kva_seq_fits, keeping 1% of the blocks free as
                 vLLM's watermark), append one token per step, preempt the newest request when
                 an append is KVA_ERR_FULL (it recomputes prompt + generated tokens later)
     SCH_MAXLEN  reserve max_len tokens at admission (one kva_seq_append), nothing per step
     SCH_ORACLE  reserve the request's true final length at admission
   Every step, after the appends: blocks_used x block_bytes against the tokens held. */
static void trace_run(const trace_req *rq, int n, int scheme, int bs, long pool_tokens, int max_len, trace_res *r) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_cache_stats cs;
  kva_status st;
  int *seq = (int *)xalloc((size_t)n * sizeof(int)), *gen = (int *)xalloc((size_t)n * sizeof(int));
  int *run = (int *)xalloc((size_t)n * sizeof(int)), *wq = (int *)xalloc((size_t)n * sizeof(int));
  int wh = 0, wn = n, nrun = 0, done = 0, i, j, wm;
  memset(r, 0, sizeof *r);
  d = trace_desc(bs, (int)(pool_tokens / bs), n < 1024 ? n : 1024);
  r->bpt = kva_cache_bytes_per_token(&d);
  if ((st = kva_cache_create(&d, &c)) != KVA_OK) {
    snprintf(r->msg, sizeof r->msg, "cache: %s", kva_status_str(st));
    r->bad = 1;
    goto out;
  }
  kva_cache_get_stats(c, &cs);
  r->block_bytes = cs.block_bytes;
  r->n_blocks = cs.n_blocks;
  wm = scheme == SCH_PAGED ? cs.n_blocks / 100 : 0;
  for (i = 0; i < n; i++) {
    wq[i] = i;
    gen[i] = 0;
    seq[i] = -1;
  }
  while (done < n) {
    long need = 0, resv = 0, want_blocks = 0;
    if (r->steps > 100L * n + 100000L) {
      snprintf(r->msg, sizeof r->msg, "no progress after %ld steps", r->steps);
      r->bad = 1;
      goto out;
    }
    /* admission: first come first served, while the next request fits */
    while (wn > 0) {
      int ri = wq[wh], s, nb = 0;
      long toks = scheme == SCH_PAGED    ? (long)rq[ri].prompt + gen[ri]
                  : scheme == SCH_MAXLEN ? (long)max_len
                                         : (long)rq[ri].prompt + rq[ri].output;
      kva_fit f;
      if (kva_seq_new(c, &s) != KVA_OK) break; /* max_seqs sequences live */
      f = kva_seq_fits(c, s, (int)toks, &nb);
      kva_cache_get_stats(c, &cs);
      if (f != KVA_FITS_NOW || (long)cs.blocks_free + cs.blocks_cached - nb < wm) {
        kva_seq_free(c, s);
        if (f == KVA_FITS_NEVER || nrun == 0) {
          snprintf(r->msg, sizeof r->msg, "request %d (%ld tokens) cannot be admitted (fits %d, pool %d blocks)", ri,
                   toks, (int)f, cs.n_blocks);
          r->bad = 1;
          goto out;
        }
        break;
      }
      if ((st = kva_seq_append(c, s, (int)toks)) != KVA_OK) {
        snprintf(r->msg, sizeof r->msg, "append of %ld after KVA_FITS_NOW: %s", toks, kva_status_str(st));
        r->bad = 1;
        kva_seq_free(c, s);
        goto out;
      }
      seq[ri] = s;
      run[nrun++] = ri;
      wh = (wh + 1) % n;
      wn--;
    }
    /* one decode step: every running request appends its next token */
    for (i = 0; i < nrun; i++) {
      int ri = run[i], self = 0;
      if (scheme == SCH_PAGED) {
        while ((st = kva_seq_append(c, seq[ri], 1)) == KVA_ERR_FULL) {
          int victim = run[--nrun]; /* the newest request; it recomputes later */
          kva_seq_free(c, seq[victim]);
          seq[victim] = -1;
          wh = (wh + n - 1) % n;
          wq[wh] = victim;
          wn++;
          r->preemptions++;
          if (victim == ri) {
            self = 1;
            break;
          }
        }
        if (self) break; /* it was the last running request */
        if (st != KVA_OK) {
          snprintf(r->msg, sizeof r->msg, "append(1): %s", kva_status_str(st));
          r->bad = 1;
          goto out;
        }
      }
      gen[ri]++;
    }
    /* sample: the allocator against the tokens the running requests hold */
    kva_cache_get_stats(c, &cs);
    for (i = 0; i < nrun; i++) {
      int ri = run[i];
      long held = (long)rq[ri].prompt + gen[ri], final_len = (long)rq[ri].prompt + rq[ri].output;
      long booked = scheme == SCH_PAGED ? held : scheme == SCH_MAXLEN ? max_len : final_len;
      need += held;
      if (scheme != SCH_PAGED) resv += final_len - held;
      want_blocks += (booked + bs - 1) / bs;
    }
    if (!r->bad && (cs.blocks_used != want_blocks || (scheme == SCH_PAGED && cs.tokens_held != need))) {
      snprintf(r->msg, sizeof r->msg, "MISMATCH at step %ld: blocks_used %d (want %ld), tokens_held %ld (want %ld)",
               r->steps, cs.blocks_used, want_blocks, cs.tokens_held, need);
      r->bad = 2; /* reported, the run goes on */
    }
    r->used += (double)cs.blocks_used * (double)cs.block_bytes;
    r->need += (double)need * (double)r->bpt;
    r->reserved += (double)resv * (double)r->bpt;
    if (cs.token_slots > 0) r->occ += (double)cs.tokens_held / (double)cs.token_slots;
    r->running += nrun;
    if ((double)cs.blocks_used * (double)cs.block_bytes > r->peak_used)
      r->peak_used = (double)cs.blocks_used * (double)cs.block_bytes;
    if (nrun > r->peak_running) r->peak_running = nrun;
    r->steps++;
    /* finished requests leave */
    for (i = j = 0; i < nrun; i++) {
      int ri = run[i];
      if (gen[ri] >= rq[ri].output) {
        kva_seq_free(c, seq[ri]);
        seq[ri] = -1;
        done++;
      } else run[j++] = ri;
    }
    nrun = j;
  }
out:
  if (c) kva_cache_destroy(c);
  free(seq);
  free(gen);
  free(run);
  free(wq);
}

void paged_trace(const opts *o, const machine *m) {
  rows t = {0};
  int n = o->trace_reqs, i, k, max_len = o->max_len, pmax = 1024, omax = 512;
  long pool = o->trace_pool;
  trace_req *rq = (trace_req *)xalloc((size_t)n * sizeof(trace_req));
  uint64_t rng = o->seed + 11;
  double sp = 0, so = 0, base_running = 0;
  char title[1400];
  (void)m;
  if (pmax > max_len / 2) pmax = max_len / 2;
  if (omax > max_len - pmax) omax = max_len - pmax;
  for (i = 0; i < n; i++) {
    rq[i].prompt = rand_log_int(&rng, pmax < 16 ? pmax : 16, pmax);
    rq[i].output = rand_log_int(&rng, omax < 16 ? omax : 16, omax);
    sp += rq[i].prompt;
    so += rq[i].output;
  }
  for (k = 0; k < o->n_trace_bs + 2; k++) {
    int scheme = k < o->n_trace_bs ? SCH_PAGED : k == o->n_trace_bs ? SCH_MAXLEN : SCH_ORACLE;
    int bs = scheme == SCH_PAGED ? (int)o->trace_bs[k] : 16;
    trace_res r;
    row *w;
    progress("paged trace: %d requests, %s, block %d", n,
             scheme == SCH_PAGED ? "paged" : scheme == SCH_MAXLEN ? "reserve max_len" : "reserve final length", bs);
    trace_run(rq, n, scheme, bs, pool, max_len, &r);
    w = rows_add(&t, "paged_trace");
    rs(w, C_SCHEME, "%s", scheme == SCH_PAGED ? "paged (kvattn)" : scheme == SCH_MAXLEN ? "reserve max_len" : "reserve final length");
    rn(w, C_BLOCK, bs);
    rn(w, C_NREQ, n);
    rn(w, C_POOLTOK, (double)r.n_blocks * bs);
    rn(w, C_CTX, max_len);
    rs(w, C_DTYPE, "f16");
    rn(w, C_KVHEADS, 8);
    rn(w, C_HEADDIM, 128);
    rn(w, C_LAYERS, 1);
    if (r.bad == 1 || r.steps == 0) {
      rs(w, C_NOTE, "ERROR %s", r.msg);
      g_failed = 1;
      continue;
    }
    rn(w, C_BUSED, r.used / r.steps);
    rn(w, C_BPEAK, r.peak_used);
    rn(w, C_BNEED, r.need / r.steps);
    rn(w, C_WASTE, 1.0 - r.need / r.used);
    rn(w, C_WRES, r.reserved / r.used);
    rn(w, C_WSLACK, (r.used - r.need - r.reserved) / r.used);
    if (scheme == SCH_PAGED) rn(w, C_OCC, r.occ / r.steps);
    rn(w, C_RUNAVG, r.running / r.steps);
    rn(w, C_RUNPEAK, r.peak_running);
    rn(w, C_STEPS, (double)r.steps);
    rn(w, C_PREEMPT, (double)r.preemptions);
    if (scheme == SCH_MAXLEN) base_running = r.running / r.steps;
    if (r.bad == 2) {
      rs(w, C_NOTE, "%s", r.msg);
      g_failed = 1;
    } else if (scheme == SCH_PAGED)
      rs(w, C_NOTE, "1%% watermark at admission; checked: blocks_used and tokens_held every step");
    else if (scheme == SCH_MAXLEN)
      rs(w, C_NOTE, "%d tokens per request at admission (static batching systems)", max_len);
    else rs(w, C_NOTE, "prompt + output known in advance, rounded to 16-token blocks");
  }
  progress_end();
  for (i = 0; i < t.n; i++)
    if (base_running > 0 && t.r[i].kind[C_RUNAVG] == 1) rn(&t.r[i], C_GAIN, t.r[i].num[C_RUNAVG] / base_running);
  if (g_fmt == OUT_TABLE) {
    static const vcol v[] = {{C_SCHEME, "scheme", FM_STR},     {C_BLOCK, "block", FM_INT},
                             {C_BUSED, "used MiB", FM_MIB},    {C_BNEED, "needed MiB", FM_MIB},
                             {C_WASTE, "waste", FM_PCT},       {C_WRES, "for later", FM_PCT},
                             {C_WSLACK, "never used", FM_PCT}, {C_OCC, "occupancy", FM_PCT},
                             {C_RUNAVG, "batch avg", FM_F1},   {C_RUNPEAK, "peak", FM_INT},
                             {C_GAIN, "vs max_len", FM_X},     {C_STEPS, "steps", FM_SEP},
                             {C_PREEMPT, "preempt", FM_INT},   {C_NOTE, "note", FM_STR}};
    char ps[32];
    fmt_sep((double)pool, ps, sizeof ps);
    snprintf(title, sizeof title,
             "Memory waste on a request trace (continuous batching through a real cache; one Llama-3-8B layer,\n"
             "  G=8 D=128 f16, 4 KiB/token; x32 for the model): %d requests queued at step 0, seed %llu; prompts\n"
             "  log-uniform %d-%d tokens (mean %.0f), outputs %d-%d (mean %.0f); pool %s tokens; max_len %d.\n"
             "  Every step: used = blocks_used x block_bytes (kva_cache_get_stats), needed = tokens the running\n"
             "  requests hold x bytes/token; averages over steps. waste = 1 - needed/used = for later (reserved\n"
             "  for tokens not yet generated) + never used (beyond the final length: max_len over-reservation,\n"
             "  or the partly filled last block); occupancy = tokens_held / token_slots. batch = running\n"
             "  requests; vs max_len = its average over reserve max_len's, in the same pool; steps = decode steps\n"
             "  to drain the trace. Reservation rows are ideal contiguous allocators (no external fragmentation,\n"
             "  so their waste is a lower bound); the vLLM paper measures 20-38%% of the KV memory holding real\n"
             "  tokens in such systems, 96%% with paging.",
             n, (unsigned long long)o->seed, pmax < 16 ? pmax : 16, pmax, sp / n, omax < 16 ? omax : 16, omax, so / n, ps,
             max_len);
    print_table(title, v, NV(v), &t, -1);
  }
  emit_rows(&t);
  rows_free(&t);
  free(rq);
}

/* ---- shared system prompt, two tenants ---- */

typedef struct {
  double used, peak, cached; /* sums over steps (used, cached), peak of used */
  long steps, prefill, q[2], h[2], st_q, st_h;
  int first[2], n_req[2], probe_same, probe_other, bad;
  char msg[200];
} prefix_res;

static const uint64_t prefix_salt[3] = {0xA11CE5A17ull, 0xB0B5A17ull, 0xC4A21E5A17ull};

/* n requests alternating tenants A and B (salts differ), each the same sys_len-token system
   prompt + a unique suffix of 32-256 tokens, then 16-128 output tokens; at most conc running
   at once (the pool never limits them, so both runs follow the same schedule). use_cache:
   kva_seq_new_prefix, append the rest, kva_seq_publish the prompt; else kva_seq_new + append. */
static void prefix_run(int use_cache, int n, int sys_len, int conc, uint64_t seed, prefix_res *r) {
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_cache_stats cs;
  kva_status st;
  const int bs = 16, smax = 256, omax = 128;
  int32_t *sys = (int32_t *)xalloc((size_t)sys_len * sizeof(int32_t));
  int32_t *tok = (int32_t *)xalloc((size_t)(sys_len + smax + 8) * sizeof(int32_t));
  int *plen = (int *)xalloc((size_t)n * sizeof(int)), *olen = (int *)xalloc((size_t)n * sizeof(int));
  int *seq = (int *)xalloc((size_t)n * sizeof(int)), *gen = (int *)xalloc((size_t)n * sizeof(int));
  int *run = (int *)xalloc((size_t)conc * sizeof(int));
  int i, j, next = 0, nrun = 0, done = 0;
  uint64_t rng = seed;
  memset(r, 0, sizeof *r);
  r->first[0] = r->first[1] = -1;
  for (i = 0; i < sys_len; i++) sys[i] = (int32_t)(1000 + rng_u64(&rng) % 30000);
  for (i = 0; i < n; i++) {
    plen[i] = sys_len + 32 + (int)(rng_u64(&rng) % (uint64_t)(smax - 32 + 1));
    olen[i] = 16 + (int)(rng_u64(&rng) % (uint64_t)(omax - 16 + 1));
  }
  d = trace_desc(bs, conc * ((sys_len + smax + omax) / bs + 2) + 64, conc + 4);
  if ((st = kva_cache_create(&d, &c)) != KVA_OK) {
    snprintf(r->msg, sizeof r->msg, "cache: %s", kva_status_str(st));
    r->bad = 1;
    goto out;
  }
  while (done < n) {
    /* admit up to conc running requests; a request's prompt is computed in the step it enters */
    while (nrun < conc && next < n) {
      int ri = next, ten = ri & 1, reused = 0, s = -1;
      uint64_t trng = seed * 1000003ull + (uint64_t)ri; /* the suffix of request ri, the same in both runs */
      memcpy(tok, sys, (size_t)sys_len * sizeof(int32_t));
      for (j = sys_len; j < plen[ri]; j++) tok[j] = (int32_t)(40000 + rng_u64(&trng) % 2000000000u);
      st = use_cache ? kva_seq_new_prefix(c, tok, plen[ri], prefix_salt[ten], &s, &reused) : kva_seq_new(c, &s);
      if (st == KVA_OK) st = kva_seq_append(c, s, plen[ri] - reused);
      if (st == KVA_OK && use_cache) st = kva_seq_publish(c, s, tok, plen[ri], prefix_salt[ten]);
      if (st != KVA_OK) {
        snprintf(r->msg, sizeof r->msg, "admitting request %d: %s", ri, kva_status_str(st));
        r->bad = 1;
        goto out;
      }
      r->prefill += plen[ri] - reused;
      r->q[ten] += plen[ri];
      r->h[ten] += reused;
      r->n_req[ten]++;
      if (r->first[ten] < 0) r->first[ten] = reused;
      seq[ri] = s;
      gen[ri] = 0;
      run[nrun++] = ri;
      next++;
    }
    for (i = 0; i < nrun; i++) {
      if ((st = kva_seq_append(c, seq[run[i]], 1)) != KVA_OK) {
        snprintf(r->msg, sizeof r->msg, "decode append: %s", kva_status_str(st));
        r->bad = 1;
        goto out;
      }
      gen[run[i]]++;
    }
    kva_cache_get_stats(c, &cs);
    r->used += (double)cs.blocks_used * (double)cs.block_bytes;
    r->cached += (double)cs.blocks_cached * (double)cs.block_bytes;
    if ((double)cs.blocks_used * (double)cs.block_bytes > r->peak) r->peak = (double)cs.blocks_used * (double)cs.block_bytes;
    r->steps++;
    for (i = j = 0; i < nrun; i++) {
      if (gen[run[i]] >= olen[run[i]]) {
        kva_seq_free(c, seq[run[i]]);
        done++;
      } else run[j++] = run[i];
    }
    nrun = j;
  }
  kva_cache_get_stats(c, &cs);
  r->st_q = cs.prefix_queries;
  r->st_h = cs.prefix_hits;
  if (use_cache) { /* after the trace: the system prompt under tenant A's salt, and under a new salt */
    int s, k;
    memcpy(tok, sys, (size_t)sys_len * sizeof(int32_t));
    for (j = sys_len; j < sys_len + 8; j++) tok[j] = 7 + j;
    for (k = 0; k < 2; k++) {
      int reused = -1;
      if ((st = kva_seq_new_prefix(c, tok, sys_len + 8, prefix_salt[k ? 2 : 0], &s, &reused)) != KVA_OK) {
        snprintf(r->msg, sizeof r->msg, "probe: %s", kva_status_str(st));
        r->bad = 1;
        goto out;
      }
      kva_seq_free(c, s);
      if (k) r->probe_other = reused;
      else r->probe_same = reused;
    }
  }
out:
  if (c) kva_cache_destroy(c);
  free(sys); free(tok); free(plen); free(olen); free(seq); free(gen); free(run);
}

void paged_prefix(const opts *o, const machine *m) {
  rows t = {0};
  prefix_res without, with;
  const int sys_len = 512, conc = o->quick ? 16 : 32, n = o->prefix_reqs;
  row *w;
  int ten, ok_iso, want_same = sys_len / 16 * 16;
  char title[1200];
  (void)m;
  progress("paged prefix: %d requests without prefix caching", n);
  prefix_run(0, n, sys_len, conc, o->seed + 21, &without);
  progress("paged prefix: %d requests with prefix caching", n);
  prefix_run(1, n, sys_len, conc, o->seed + 21, &with);
  progress_end();
  w = rows_add(&t, "paged_prefix");
  rs(w, C_SCHEME, "no prefix caching");
  rs(w, C_TENANT, "A+B");
  rn(w, C_NREQ, n);
  if (without.bad) {
    rs(w, C_NOTE, "ERROR %s", without.msg);
    g_failed = 1;
  } else {
    rn(w, C_PREFILLTOK, (double)without.prefill);
    rn(w, C_BUSED, without.used / without.steps);
    rn(w, C_BPEAK, without.peak);
    rn(w, C_STEPS, (double)without.steps);
    rs(w, C_NOTE, "kva_seq_new + kva_seq_append of the whole prompt");
  }
  for (ten = 0; ten < 2 && !with.bad; ten++) {
    w = rows_add(&t, "paged_prefix");
    rs(w, C_SCHEME, "prefix caching");
    rs(w, C_TENANT, "%s (salt %llx)", ten ? "B" : "A", (unsigned long long)prefix_salt[ten]);
    rn(w, C_NREQ, with.n_req[ten]);
    rn(w, C_PQ, (double)with.q[ten]);
    rn(w, C_PH, (double)with.h[ten]);
    rn(w, C_HITRATE, with.q[ten] ? (double)with.h[ten] / (double)with.q[ten] : 0);
    rn(w, C_REUSE1, with.first[ten]);
    rs(w, C_NOTE, ten ? "its first request came after A had published the same system prompt"
                      : "its first request computes the system prompt");
  }
  w = rows_add(&t, "paged_prefix");
  rs(w, C_SCHEME, "prefix caching");
  rs(w, C_TENANT, "A+B");
  rn(w, C_NREQ, n);
  if (with.bad) {
    rs(w, C_NOTE, "ERROR %s", with.msg);
    g_failed = 1;
  } else {
    int agree = with.st_q == with.q[0] + with.q[1] && with.st_h == with.h[0] + with.h[1];
    rn(w, C_PQ, (double)with.st_q);
    rn(w, C_PH, (double)with.st_h);
    rn(w, C_HITRATE, with.st_q ? (double)with.st_h / (double)with.st_q : 0);
    rn(w, C_PREFILLTOK, (double)with.prefill);
    rn(w, C_BUSED, with.used / with.steps);
    rn(w, C_BPEAK, with.peak);
    rn(w, C_BCACHED, with.cached / with.steps);
    rn(w, C_STEPS, (double)with.steps);
    if (!without.bad && without.used > 0) rn(w, C_SAVED, 1.0 - (with.used / with.steps) / (without.used / without.steps));
    if (!agree) g_failed = 1;
    rs(w, C_NOTE, "%s%s", agree ? "counters: kva_cache_get_stats (= the per-tenant sums)" : "MISMATCH: stats counters != per-tenant sums",
       !without.bad && with.steps != without.steps ? "; WARNING: schedules differ" : "");
  }
  if (!with.bad) {
    for (ten = 0; ten < 2; ten++) {
      int got = ten ? with.probe_other : with.probe_same, want = ten ? 0 : want_same;
      w = rows_add(&t, "paged_prefix");
      rs(w, C_SCHEME, "probe after the trace");
      rs(w, C_TENANT, "%s (salt %llx)", ten ? "C, new" : "A", (unsigned long long)prefix_salt[ten ? 2 : 0]);
      rn(w, C_NREQ, 1);
      rn(w, C_REUSE1, got);
      rn(w, C_EXPECTED, want);
      rs(w, C_PASS, got == want ? "PASS" : "FAIL");
      if (got != want) g_failed = 1;
      rs(w, C_NOTE, ten ? "the same system prompt under another salt: must reuse nothing"
                        : "the system prompt + 8 new tokens: its full blocks are reused");
    }
    ok_iso = with.first[1] == 0;
    w = rows_add(&t, "paged_prefix");
    rs(w, C_SCHEME, "tenant isolation");
    rs(w, C_TENANT, "B's first request");
    rn(w, C_REUSE1, with.first[1]);
    rn(w, C_EXPECTED, 0);
    rs(w, C_PASS, ok_iso ? "PASS" : "FAIL");
    if (!ok_iso) g_failed = 1;
    rs(w, C_NOTE, "A's blocks hold the same token ids; B's salt must not match them");
  }
  if (g_fmt == OUT_TABLE) {
    static const vcol v[] = {{C_SCHEME, "run", FM_STR},          {C_TENANT, "tenant", FM_STR},
                             {C_NREQ, "requests", FM_INT},       {C_PQ, "query tok", FM_SEP},
                             {C_PH, "hit tok", FM_SEP},          {C_HITRATE, "hit rate", FM_PCT},
                             {C_REUSE1, "1st reused", FM_INT},   {C_PREFILLTOK, "computed tok", FM_SEP},
                             {C_BUSED, "held MiB", FM_MIB},      {C_BPEAK, "peak MiB", FM_MIB},
                             {C_BCACHED, "cached MiB", FM_MIB},  {C_SAVED, "saved", FM_PCT},
                             {C_PASS, "check", FM_STR},          {C_NOTE, "note", FM_STR}};
    snprintf(title, sizeof title,
             "Shared system prompt, two tenants (one Llama-3-8B layer, f16, block 16): %d requests alternating\n"
             "  tenants A and B, each a %d-token system prompt (the same token ids for both) + a unique suffix of\n"
             "  32-256 tokens, then 16-128 output tokens; at most %d running. Run twice: without prefix caching,\n"
             "  and with kva_seq_new_prefix / kva_seq_publish (salted by tenant). query/hit tok = tokens asked\n"
             "  for / reused (prefix_queries, prefix_hits); computed tok = prompt tokens that needed a prefill;\n"
             "  held = blocks_used x block_bytes averaged over steps (cached = published blocks no live request\n"
             "  holds: reusable, recycled first when the pool runs short); saved = 1 - held with / held without.",
             n, sys_len, conc);
    print_table(title, v, NV(v), &t, C_SCHEME);
  }
  emit_rows(&t);
  rows_free(&t);
}

/* ---- block operations per second ---- */

enum { OP_NEW, OP_GROW, OP_APP1, OP_FITS, OP_TRUNC4, OP_TRUNCHALF, OP_FORK, OP_FREEFORK, OP_FREE, NOP };

void paged_ops(const opts *o, const machine *m) {
  static const char *op_name[NOP] = {"kva_seq_new + kva_seq_append(16)", "kva_seq_append(16)", "kva_seq_append(1)",
                                     "kva_seq_fits(16)", "kva_seq_truncate(len - 4)", "kva_seq_truncate(len / 2)",
                                     "kva_seq_fork", "kva_seq_free (a fork)", "kva_seq_free"};
  static const char *op_what[NOP] = {"new sequence, its first block", "grow by one block (prefill chunk)",
                                     "decode step (a block every 16th)", "admission check",
                                     "speculative rollback, no block freed", "rollback releasing 32 blocks",
                                     "share 64 blocks (ref counts)", "unshare 64 blocks", "release 64 private blocks"};
  const int bs = 16, N = o->quick ? 128 : 256, grow = 64, rounds = o->quick ? 3 : 5;
  double ts[NOP][16], blocks_per[NOP], ops_per[NOP];
  int *s = (int *)xalloc((size_t)N * sizeof(int)), *f = (int *)xalloc((size_t)N * sizeof(int));
  kva_cache_desc d;
  kva_cache *c = NULL;
  kva_cache_stats cs;
  kva_status st;
  rows t = {0};
  int rd, i, k, op, bad = 0, len;
  char title[800];
  (void)m;
  memset(&d, 0, sizeof d);
  d.n_layers = 1;
  d.n_kv_heads = 2;
  d.head_dim = 64;
  d.dtype = KVA_F16;
  d.block_size = bs;
  d.n_blocks = N * (grow + 2) + 64;
  d.max_seqs = 2 * N;
  if ((st = kva_cache_create(&d, &c)) != KVA_OK) {
    row *w = rows_add(&t, "paged_ops");
    rs(w, C_NOTE, "ERROR cache: %s", kva_status_str(st));
    g_failed = 1;
    emit_rows(&t);
    rows_free(&t);
    free(s);
    free(f);
    return;
  }
  kva_cache_get_stats(c, &cs);
  blocks_per[OP_NEW] = 1; ops_per[OP_NEW] = N;
  blocks_per[OP_GROW] = 1; ops_per[OP_GROW] = (double)N * (grow - 1);
  blocks_per[OP_APP1] = 1.0 / bs; ops_per[OP_APP1] = (double)N * bs;
  blocks_per[OP_FITS] = 0; ops_per[OP_FITS] = (double)N * 8;
  blocks_per[OP_TRUNC4] = 0; ops_per[OP_TRUNC4] = N;
  blocks_per[OP_TRUNCHALF] = 32; ops_per[OP_TRUNCHALF] = N;
  blocks_per[OP_FORK] = grow; ops_per[OP_FORK] = N;
  blocks_per[OP_FREEFORK] = grow; ops_per[OP_FREEFORK] = N;
  blocks_per[OP_FREE] = grow; ops_per[OP_FREE] = N;
  /* round 0 warms up (page faults in the pool), rounds 1.. are timed */
  for (rd = 0; rd <= rounds && !bad; rd++) {
    double t0;
    int nb;
    progress("paged block operations: round %d of %d", rd, rounds);
#define OPCHECK(call) do { if ((st = (call)) != KVA_OK) bad = 1; } while (0)
    t0 = now_s();
    for (i = 0; i < N; i++) {
      OPCHECK(kva_seq_new(c, &s[i]));
      OPCHECK(kva_seq_append(c, s[i], bs));
    }
    ts[OP_NEW][rd] = now_s() - t0;
    t0 = now_s();
    for (k = 1; k < grow; k++)
      for (i = 0; i < N; i++) OPCHECK(kva_seq_append(c, s[i], bs));
    ts[OP_GROW][rd] = now_s() - t0;
    t0 = now_s();
    for (k = 0; k < bs; k++)
      for (i = 0; i < N; i++) OPCHECK(kva_seq_append(c, s[i], 1));
    ts[OP_APP1][rd] = now_s() - t0;
    t0 = now_s();
    for (k = 0; k < 8; k++)
      for (i = 0; i < N; i++)
        if (kva_seq_fits(c, s[i], bs, &nb) != KVA_FITS_NOW) bad = 1;
    ts[OP_FITS][rd] = now_s() - t0;
    len = (grow + 1) * bs;
    t0 = now_s();
    for (i = 0; i < N; i++) OPCHECK(kva_seq_truncate(c, s[i], len - 4));
    ts[OP_TRUNC4][rd] = now_s() - t0;
    len -= 4; /* 1036 tokens, 65 blocks -> 518 tokens, 33 blocks */
    t0 = now_s();
    for (i = 0; i < N; i++) OPCHECK(kva_seq_truncate(c, s[i], len / 2));
    ts[OP_TRUNCHALF][rd] = now_s() - t0;
    for (i = 0; i < N; i++) OPCHECK(kva_seq_append(c, s[i], grow * bs - len / 2)); /* back to 64 blocks, untimed */
    kva_cache_get_stats(c, &cs);
    if (cs.blocks_used != N * grow) bad = 2;
    t0 = now_s();
    for (i = 0; i < N; i++) OPCHECK(kva_seq_fork(c, s[i], &f[i]));
    ts[OP_FORK][rd] = now_s() - t0;
    t0 = now_s();
    for (i = 0; i < N; i++) OPCHECK(kva_seq_free(c, f[i]));
    ts[OP_FREEFORK][rd] = now_s() - t0;
    t0 = now_s();
    for (i = 0; i < N; i++) OPCHECK(kva_seq_free(c, s[i]));
    ts[OP_FREE][rd] = now_s() - t0;
#undef OPCHECK
    kva_cache_get_stats(c, &cs);
    if (cs.blocks_used != 0 || cs.n_seqs != 0) bad = 2;
  }
  progress_end();
  kva_cache_get_stats(c, &cs);
  for (op = 0; op < NOP; op++) {
    row *w = rows_add(&t, "paged_ops");
    double v[16], med, nsop;
    rs(w, C_NAME, "%s", op_name[op]);
    rs(w, C_MODE, "%s", op_what[op]);
    rn(w, C_BLOCK, bs);
    rn(w, C_BPO, blocks_per[op]);
    rn(w, C_NQ, ops_per[op]);
    if (bad) {
      rs(w, C_NOTE, bad == 2 ? "MISMATCH: blocks_used after the loop" : "ERROR: a call failed (%s)", kva_status_str(st));
      g_failed = 1;
      continue;
    }
    for (rd = 0; rd < rounds; rd++) v[rd] = ts[op][rd + 1];
    qsort(v, (size_t)rounds, sizeof v[0], cmp_double);
    med = rounds % 2 ? v[rounds / 2] : 0.5 * (v[rounds / 2 - 1] + v[rounds / 2]);
    nsop = med / ops_per[op] * 1e9;
    rn(w, C_TMED, med / ops_per[op]);
    rn(w, C_NSOP, nsop);
    rn(w, C_OPS, 1e9 / nsop);
    if (blocks_per[op] > 0) rn(w, C_NSBLK, nsop / blocks_per[op]);
  }
  if (g_fmt == OUT_TABLE) {
    static const vcol v[] = {{C_NAME, "operation", FM_STR}, {C_MODE, "what", FM_STR},       {C_NQ, "calls/loop", FM_SEP},
                             {C_BPO, "blocks/call", FM_F2}, {C_NSOP, "ns/call", FM_F1},     {C_OPS, "calls/s", FM_SEP},
                             {C_NSBLK, "ns/block", FM_F1},  {C_NOTE, "note", FM_STR}};
    char nbs[32], ntok[32];
    fmt_sep((double)cs.n_blocks, nbs, sizeof nbs);
    fmt_sep((double)cs.n_blocks * bs, ntok, sizeof ntok);
    snprintf(title, sizeof title,
             "Block operations per second: a pool of %s blocks of %d tokens (%s tokens), %d sequences grown to\n"
             "  %d blocks each (then %d forks), 1 thread; medians of %d rounds of loops over all sequences\n"
             "  (ns/call = loop time / calls). Cache: 1 layer, G=2, D=64, f16 (%zu-byte blocks): an append\n"
             "  also zeroes its new slots (n_layers x G x 2 rows per token), so with a whole model's rows\n"
             "  appends cost more; the other calls touch only bookkeeping.",
             nbs, bs, ntok, N, grow, N, rounds,
             cs.block_bytes);
    print_table(title, v, NV(v), &t, -1);
  }
  emit_rows(&t);
  rows_free(&t);
  kva_cache_destroy(c);
  free(s);
  free(f);
}

