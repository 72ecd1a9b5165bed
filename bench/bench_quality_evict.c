/* bench/bench_quality_evict.c - kvattn_bench quality, part evict: eviction (WINDOW, WINDOW +
   sinks, H2O) at several budgets against the full cache, step by step. */
#include "harness.h"

#define EV_H 8
#define EV_G 2
#define EV_D 64
#define EV_PROMPT 32
#define EV_NFREQ 16

static kva_cache_desc evict_desc(int n_blocks) {
  kva_cache_desc d;
  memset(&d, 0, sizeof d);
  d.n_layers = 1;
  d.n_kv_heads = EV_G;
  d.head_dim = EV_D;
  d.dtype = KVA_F16;
  d.block_size = 16;
  d.n_blocks = n_blocks;
  d.max_seqs = 1;
  return d;
}

static kva_attn evict_attn(void) {
  kva_attn a;
  memset(&a, 0, sizeof a);
  a.n_heads = EV_H;
  a.n_kv_heads = EV_G;
  a.head_dim = EV_D;
  a.n_threads = 1;
  return a;
}

/* k [n][G][D], v [n][G][D], q [n][H][D] (query t is the query of the token at position t).
   structured: per KV head a unit direction u that every query of the group carries (length
   sqrt(D) x 0.75..1.25 per head); the first 4 tokens (sinks, +8 in score) and ~1% of the others
   (heavy hitters, +5..+7) carry it in their keys, which other keys do not (it is projected out
   of their noise); a recency bias from rotary-like position features on the first 32 dims
   (score +4 at distance 0, fading over 1..256 tokens); N(0,1) noise elsewhere, N(0,1) values.
   Otherwise every number is N(0,1). heavy[j]: token j is a sink or a heavy hitter. */
static void evict_data(int structured, int n, float *k, float *v, float *q, unsigned char *heavy, uint64_t *rng) {
  const double sq = sqrt((double)EV_D), c = sqrt(4.0 * sq / EV_NFREQ);
  double u[EV_G][EV_D], om[EV_NFREQ], ah[EV_H];
  size_t i, nk = (size_t)n * EV_G * EV_D, nq = (size_t)n * EV_H * EV_D;
  int j, g, h, d, f;
  memset(heavy, 0, (size_t)n);
  for (i = 0; i < nk; i++) k[i] = (float)rng_gauss(rng);
  for (i = 0; i < nk; i++) v[i] = (float)rng_gauss(rng);
  for (i = 0; i < nq; i++) q[i] = (float)rng_gauss(rng);
  if (!structured) return;
  for (g = 0; g < EV_G; g++) {
    double nrm = 0;
    for (d = 0; d < EV_D; d++) {
      u[g][d] = rng_gauss(rng);
      nrm += u[g][d] * u[g][d];
    }
    for (d = 0; d < EV_D; d++) u[g][d] /= sqrt(nrm);
  }
  for (h = 0; h < EV_H; h++) ah[h] = sq * (0.75 + 0.5 * rng_unif(rng));
  for (f = 0; f < EV_NFREQ; f++) om[f] = pow(256.0, -(double)f / (EV_NFREQ - 1));
  for (j = 0; j < n; j++) {
    double strength = 0;
    heavy[j] = j < 4 || rng_unif(rng) < 0.01;
    if (heavy[j]) strength = j < 4 ? 8.0 : 5.0 + 2.0 * rng_unif(rng);
    for (g = 0; g < EV_G; g++) {
      float *kj = k + ((size_t)j * EV_G + g) * EV_D;
      double dot = 0;
      for (d = 0; d < EV_D; d++) dot += kj[d] * u[g][d];
      for (d = 0; d < EV_D; d++) kj[d] += (float)((strength - dot) * u[g][d]); /* with |q.u| ~ sqrt(D): score + strength */
      for (f = 0; f < EV_NFREQ; f++) {
        kj[2 * f] += (float)(c * cos(om[f] * j));
        kj[2 * f + 1] += (float)(c * sin(om[f] * j));
      }
    }
    for (h = 0; h < EV_H; h++) {
      float *qh = q + ((size_t)j * EV_H + h) * EV_D;
      g = h / (EV_H / EV_G);
      for (d = 0; d < EV_D; d++) qh[d] += (float)(ah[h] * u[g][d]);
      for (f = 0; f < EV_NFREQ; f++) {
        qh[2 * f] += (float)(c * cos(om[f] * j));
        qh[2 * f + 1] += (float)(c * sin(om[f] * j));
      }
    }
  }
}

/* softmax mass on the heavy tokens and on the newest 64 other tokens, fp64, averaged over heads
   and over 32 queries spread over the last quarter of the generation: how much structure the
   data has */
static void evict_mass(int n, const float *k, const float *q, const unsigned char *heavy, double *mh, double *mr) {
  double *s = (double *)xalloc((size_t)n * sizeof(double));
  const int nqs = 32;
  int h, j, d, qi;
  *mh = *mr = 0;
  for (qi = 0; qi < nqs; qi++) {
    int t = n - 1 - qi * (n / 4 / nqs); /* the query of position t sees keys 0..t */
    for (h = 0; h < EV_H; h++) {
      const float *qh = q + ((size_t)t * EV_H + h) * EV_D;
      int g = h / (EV_H / EV_G);
      double mx = -INFINITY, sum = 0, hv = 0, rc = 0;
      for (j = 0; j <= t; j++) {
        const float *kj = k + ((size_t)j * EV_G + g) * EV_D;
        double dot = 0;
        for (d = 0; d < EV_D; d++) dot += (double)qh[d] * kj[d];
        s[j] = dot / sqrt((double)EV_D);
        if (s[j] > mx) mx = s[j];
      }
      for (j = 0; j <= t; j++) {
        double p = exp(s[j] - mx);
        sum += p;
        if (heavy[j]) hv += p;
        else if (j > t - 64) rc += p;
      }
      *mh += hv / sum / (EV_H * nqs);
      *mr += rc / sum / (EV_H * nqs);
    }
  }
  free(s);
}

typedef struct {
  double err_mean, err_max, t_mid, t_end, heavy_kept, bytes_held, bytes_strict;
  int held_end, held_bad, bad;
  char msg[200];
} ev_res;


/* Prefill EV_PROMPT tokens (store, attend all of them: H2O scores start there), then decode
   one token per step up to n: append(1), store its K/V, attend its query. e NULL: the full
   cache, whose outputs go to ref [n - EV_PROMPT][H][D]; else each step's output is compared
   with ref. A step's time covers the three calls (eviction happens inside the append). */
static void evict_run(const kva_evict *e, int n, const float *k, const float *v, const float *q,
                      const unsigned char *heavy, float *ref, ev_res *r) {
  const size_t qs = (size_t)EV_H * EV_D, ks = (size_t)EV_G * EV_D;
  const int P = EV_PROMPT, budget = e ? e->budget : n, n_eval = n / 4, win = n / 16 < 128 ? n / 16 : 128;
  kva_cache_desc d = evict_desc((e ? budget : n) / 16 + 3);
  kva_cache *c = NULL;
  kva_cache_stats cs;
  kva_attn a = evict_attn();
  kva_status st;
  float *out = (float *)xalloc((size_t)P * qs * sizeof(float));
  double *dt = (double *)xalloc((size_t)n * sizeof(double)), *err = (double *)xalloc((size_t)n * sizeof(double));
  int seq = -1, t, slot, g, n_heavy = 0;
  long kept = 0;
  memset(r, 0, sizeof *r);
  if ((st = kva_cache_create(&d, &c)) != KVA_OK || (st = kva_seq_new(c, &seq)) != KVA_OK ||
      (e && (st = kva_seq_set_evict(c, seq, e)) != KVA_OK)) {
    snprintf(r->msg, sizeof r->msg, "setup: %s", kva_status_str(st));
    r->bad = 1;
    goto out;
  }
  if ((st = kva_seq_append(c, seq, P)) != KVA_OK || (st = kva_store(c, seq, 0, k, v, P)) != KVA_OK ||
      (st = kva_attend_cache(c, seq, 0, &a, q, P, out)) != KVA_OK) {
    snprintf(r->msg, sizeof r->msg, "prefill: %s", kva_status_str(st));
    r->bad = 1;
    goto out;
  }
  for (t = P; t < n; t++) {
    double t0 = now_s();
    int held, want = t + 1 < budget ? t + 1 : budget;
    st = kva_seq_append(c, seq, 1);
    if (st == KVA_OK) st = kva_store(c, seq, 0, k + (size_t)t * ks, v + (size_t)t * ks, 1);
    if (st == KVA_OK) st = kva_attend_cache(c, seq, 0, &a, q + (size_t)t * qs, 1, out);
    dt[t] = now_s() - t0;
    if (st != KVA_OK) {
      snprintf(r->msg, sizeof r->msg, "step %d: %s", t, kva_status_str(st));
      r->bad = 1;
      goto out;
    }
    held = kva_seq_len(c, seq);
    if (held != want && !r->held_bad) {
      r->held_bad = 1;
      snprintf(r->msg, sizeof r->msg, "MISMATCH at position %d: kva_seq_len %d, want min(tokens, budget) = %d", t, held,
               want);
    }
    if (!e) memcpy(ref + (size_t)(t - P) * qs, out, qs * sizeof(float));
    else {
      const float *rf = ref + (size_t)(t - P) * qs;
      double se = 0, sr = 0;
      size_t i;
      for (i = 0; i < qs; i++) {
        double df = (double)out[i] - rf[i];
        se += df * df;
        sr += (double)rf[i] * rf[i];
      }
      err[t] = sr > 0 ? sqrt(se / sr) : 0;
    }
  }
  for (t = n - n_eval; t < n; t++) {
    r->err_mean += err[t] / n_eval;
    if (err[t] > r->err_max) r->err_max = err[t];
  }
  r->t_mid = median_d(dt + n / 2, win);
  r->t_end = median_d(dt + n - win, win);
  r->held_end = kva_seq_len(c, seq);
  kva_cache_get_stats(c, &cs);
  r->bytes_held = (double)cs.blocks_used * (double)cs.block_bytes;
  r->bytes_strict = (double)r->held_end * (double)kva_cache_bytes_per_token(&d);
  for (t = 0; t < n; t++) n_heavy += heavy[t];
  for (slot = 0; slot < r->held_end; slot++) {
    int32_t pos[EV_G];
    if (kva_seq_read(c, seq, 0, slot, NULL, NULL, pos) != KVA_OK) continue;
    for (g = 0; g < EV_G; g++) kept += pos[g] >= 0 && pos[g] < n && heavy[pos[g]];
  }
  r->heavy_kept = n_heavy ? (double)kept / ((double)n_heavy * EV_G) : 0;
out:
  if (c) kva_cache_destroy(c);
  free(out);
  free(dt);
  free(err);
}

void quality_evict(const opts *o, const machine *m) {
  rows t = {0};
  const int n = o->evict_ctx;
  const size_t qs = (size_t)EV_H * EV_D, ks = (size_t)EV_G * EV_D;
  float *k = (float *)xalloc((size_t)n * ks * sizeof(float)), *v = (float *)xalloc((size_t)n * ks * sizeof(float));
  float *q = (float *)xalloc((size_t)n * qs * sizeof(float));
  float *ref = (float *)xalloc((size_t)n * qs * sizeof(float));
  unsigned char *heavy = (unsigned char *)xalloc((size_t)n);
  uint64_t rng = o->seed + 31;
  int pat, bi, pol, rand_budget = -1;
  char title[1600];
  (void)m;
  for (bi = 0; bi < o->n_budgets; bi++)
    if (o->budgets[bi] == 20) rand_budget = bi;
  if (rand_budget < 0) rand_budget = 0;
  for (pat = 0; pat < 2; pat++) {
    ev_res full;
    double mh, mr;
    row *w;
    progress("quality eviction: %s data, full cache", pat ? "random" : "structured");
    evict_data(!pat, n, k, v, q, heavy, &rng);
    evict_mass(n, k, q, heavy, &mh, &mr);
    evict_run(NULL, n, k, v, q, heavy, ref, &full);
    w = rows_add(&t, "evict");
    rs(w, C_PATTERN, "%s", pat ? "random" : "structured");
    rs(w, C_POLICY, "none (full cache)");
    rn(w, C_CTX, n);
    rn(w, C_BUDGET, n);
    rn(w, C_BUDGETFRAC, 1);
    rs(w, C_DTYPE, "f16");
    rn(w, C_HEADS, EV_H);
    rn(w, C_KVHEADS, EV_G);
    rn(w, C_HEADDIM, EV_D);
    rn(w, C_MASS, mh);
    rn(w, C_RECENTMASS, mr);
    if (full.bad) {
      rs(w, C_NOTE, "ERROR %s", full.msg);
      g_failed = 1;
      continue;
    }
    rn(w, C_HELD, full.held_end);
    rs(w, C_PASS, full.held_bad ? "MISMATCH" : "ok");
    rn(w, C_ERRMEAN, 0);
    rn(w, C_ERRMAX, 0);
    rn(w, C_HEAVYKEPT, 1);
    rn(w, C_BHELD, full.bytes_held);
    rn(w, C_BFRAC, 1);
    rn(w, C_STEPMID, full.t_mid);
    rn(w, C_STEPEND, full.t_end);
    rn(w, C_STEPRATIO, full.t_end / full.t_mid);
    if (full.held_bad) {
      rs(w, C_NOTE, "%s", full.msg);
      g_failed = 1;
    } else
      rs(w, C_NOTE, "the reference; attention mass on heavy tokens %.0f%%, on the other newest 64 %.0f%%", 100 * mh,
         100 * mr);
    for (bi = 0; bi < o->n_budgets; bi++) {
      int budget = (int)((double)n * (double)o->budgets[bi] / 100.0 + 0.5);
      if (budget < 10) budget = 10; /* 4 sinks + H2O's recent half + room to evict */
      if (pat && bi != rand_budget) continue;
      for (pol = 0; pol < 3; pol++) {
        kva_evict e;
        ev_res r;
        memset(&e, 0, sizeof e);
        e.kind = pol < 2 ? KVA_EVICT_WINDOW : KVA_EVICT_H2O;
        e.budget = budget;
        e.n_sink = pol ? 4 : 0;
        e.n_recent = pol == 2 ? budget / 2 : 0;
        progress("quality eviction: %s data, %s budget %d", pat ? "random" : "structured",
                 pol == 0 ? "window" : pol == 1 ? "window+sinks" : "H2O", budget);
        evict_run(&e, n, k, v, q, heavy, ref, &r);
        w = rows_add(&t, "evict");
        rs(w, C_PATTERN, "%s", pat ? "random" : "structured");
        rs(w, C_POLICY, "%s", pol == 0 ? "WINDOW" : pol == 1 ? "WINDOW + sinks" : "H2O");
        rn(w, C_CTX, n);
        rn(w, C_BUDGET, budget);
        rn(w, C_BUDGETFRAC, (double)budget / n);
        rn(w, C_NSINK, e.n_sink);
        if (pol == 2) rn(w, C_NRECENT, e.n_recent);
        rs(w, C_DTYPE, "f16");
        rn(w, C_HEADS, EV_H);
        rn(w, C_KVHEADS, EV_G);
        rn(w, C_HEADDIM, EV_D);
        if (r.bad) {
          rs(w, C_NOTE, "ERROR %s", r.msg);
          g_failed = 1;
          continue;
        }
        rn(w, C_HELD, r.held_end);
        rs(w, C_PASS, r.held_bad ? "MISMATCH" : "ok");
        rn(w, C_ERRMEAN, r.err_mean);
        rn(w, C_ERRMAX, r.err_max);
        rn(w, C_HEAVYKEPT, r.heavy_kept);
        rn(w, C_BHELD, r.bytes_held);
        rn(w, C_BFRAC, r.bytes_held / full.bytes_held);
        rn(w, C_STEPMID, r.t_mid);
        rn(w, C_STEPEND, r.t_end);
        rn(w, C_STEPRATIO, r.t_end / r.t_mid);
        if (r.held_bad) {
          rs(w, C_NOTE, "%s", r.msg);
          g_failed = 1;
        } else
          rs(w, C_NOTE, "held x bytes/token = %.0f B", r.bytes_strict);
      }
    }
  }
  progress_end();
  if (g_fmt == OUT_TABLE) {
    static const vcol vv[] = {{C_PATTERN, "data", FM_STR},        {C_POLICY, "policy", FM_STR},
                              {C_BUDGET, "budget", FM_SEP},       {C_BUDGETFRAC, "of ctx", FM_PCT},
                              {C_NSINK, "sink", FM_INT},          {C_NRECENT, "recent", FM_INT},
                              {C_HELD, "held", FM_SEP},           {C_PASS, "=budget", FM_STR},
                              {C_ERRMEAN, "err mean", FM_E},      {C_ERRMAX, "err max", FM_E},
                              {C_HEAVYKEPT, "heavy kept", FM_PCT}, {C_BHELD, "bytes held", FM_SEP},
                              {C_BFRAC, "vs full", FM_PCT},       {C_STEPMID, "us/step mid", FM_US},
                              {C_STEPEND, "us/step end", FM_US},  {C_STEPRATIO, "end/mid", FM_X},
                              {C_NOTE, "note", FM_STR}};
    snprintf(title, sizeof title,
             "Eviction: a %d-token generation (prefill %d, then one token per step: kva_seq_append(1), kva_store,\n"
             "  kva_attend_cache, so H2O scores accumulate), H=%d G=%d D=%d f16 cache, block 16, 1 thread. Each\n"
             "  step's output against the same query over the full (unevicted) cache: relative L2 error over all\n"
             "  heads, mean and max over the last %d steps. Policies by kva_seq_set_evict: WINDOW (n_sink 0),\n"
             "  WINDOW + 4 sinks, H2O (4 sinks, n_recent = budget/2 as in the H2O paper's half heavy, half recent).\n"
             "  held = kva_seq_len at the end; =budget: held == min(tokens, budget) after every append; heavy kept =\n"
             "  share of the sinks and heavy hitters still held (kva_seq_read positions, per KV head); bytes held =\n"
             "  blocks_used x block_bytes; us/step mid/end = median step time at context %d.. and the last %d steps\n"
             "  (flat once the budget is reached: end/mid near 1; the full cache grows with context).\n"
             "  structured data: a shared query direction that the 4 first tokens (+8 score) and ~1%% heavy hitters\n"
             "  (+5..+7) carry, rotary-like recency (+4 at distance 0), N(0,1) noise; random: all N(0,1), no structure\n"
             "  (attention is spread thinly, so any eviction drops most of the mass).",
             n, EV_PROMPT, EV_H, EV_G, EV_D, n / 4, n / 2, n / 16 < 128 ? n / 16 : 128);
    print_table(title, vv, NV(vv), &t, C_PATTERN);
  }
  emit_rows(&t);
  rows_free(&t);
  free(k);
  free(v);
  free(q);
  free(ref);
  free(heavy);
}

