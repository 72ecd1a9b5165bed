/* threads_check.c - attention from an engine's own threads.
 *
 * An engine runs attention from its own thread pool: one sequence per
 * thread, or one layer per thread.  The rule (docs/API.md, "Threads"):
 * calls that do not change a cache's structure (kva_attend_cache,
 * kva_attend_batch, each plan used by one call at a time, a plan's units and
 * merges shared by the threads (kva_batch_run_units/merges), kva_seq_read, H2O
 * score updates of a sequence's own blocks) may run at the same time on
 * different sequences, and on one sequence for different layers; their
 * results are bit-identical to running them one after another.
 *
 * This program fills caches (F16, INT8, FP8 E4M3; GQA, MQA with split-K
 * decode over 4,096 keys, MHA; with and without H2O), computes every
 * (sequence, layer) output serially, then runs the same calls from
 * THREADS threads for ROUNDS rounds, each round dealing the (sequence,
 * layer) pairs out to the threads in a new order, and compares every output
 * byte for byte.  Built with -pthread; the matrix also runs it under
 * ThreadSanitizer, which reports any data race between the calls.
 *
 *   threads_check [--quick]      exit 0 when every comparison holds */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvattn.h"

enum { THREADS = 4, N_SEQS = 4, N_LAYERS = 3, MAX_Q = 3 };

typedef struct {
  const char *name;
  int H, G, D, n_layers;
  kva_dtype dtype;
  int len[N_SEQS];   /* tokens per sequence (the last append is n_q of them) */
  int n_q;           /* newest tokens attended (1: decode) */
  int h2o;           /* sequences 1 and 3 evict with H2O */
} config;

typedef struct {
  const config *cfg;
  kva_cache *c;
  int seq[N_SEQS];
  float *q;                    /* [N_SEQS][N_LAYERS][n_q][H][D] */
  float *serial, *parallel;    /* outputs, the same layout */
  float *read_serial, *read_parallel; /* kva_seq_read of slot 0 and the last slot: [N_SEQS][N_LAYERS][2][2][G*D] */
  kva_batch *plan[2][N_LAYERS]; /* sequences {0,1} and {2,3}; a plan serves one call at a time, so one per layer */
  float *batch_serial, *batch_parallel; /* [2 plans][N_LAYERS][2 * n_q][H][D] */
} world;

static int g_fail, g_pass;

static uint64_t g_rng = 0x243f6a8885a308d3ULL;
static float frand(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  if (!p) {
    fprintf(stderr, "threads_check: out of memory\n");
    exit(2);
  }
  return p;
}

static void check(int ok, const char *what, const char *cfg, int seq, int layer) {
  if (ok) {
    g_pass++;
    return;
  }
  if (g_fail++ < 20) printf("FAIL [%s] %s: sequence %d layer %d\n", cfg, what, seq, layer);
}

static kva_attn shape(const config *f) {
  kva_attn a;
  memset(&a, 0, sizeof a);
  a.n_heads = f->H;
  a.n_kv_heads = f->G;
  a.head_dim = f->D;
  a.n_threads = 1; /* the engine's threads are the only threads */
  return a;
}

static size_t out_floats(const config *f) { return (size_t)f->n_q * (size_t)f->H * (size_t)f->D; }

static int build(const config *f, world *w) {
  kva_cache_desc d;
  int s, l, t, max_len = 0;
  size_t row = (size_t)f->G * (size_t)f->D;
  float *k, *v;
  memset(w, 0, sizeof *w);
  w->cfg = f;
  for (s = 0; s < N_SEQS; s++) max_len = f->len[s] > max_len ? f->len[s] : max_len;
  memset(&d, 0, sizeof d);
  d.n_layers = f->n_layers;
  d.n_kv_heads = f->G;
  d.head_dim = f->D;
  d.dtype = f->dtype;
  d.k_scale = d.v_scale = 1.0f;
  d.block_size = 16;
  d.n_blocks = N_SEQS * (max_len / 16 + 2);
  if (kva_cache_create(&d, &w->c) != KVA_OK) return 0;
  k = (float *)xcalloc((size_t)max_len * row, sizeof(float));
  v = (float *)xcalloc((size_t)max_len * row, sizeof(float));
  for (s = 0; s < N_SEQS; s++) {
    int n = f->len[s], first = n - f->n_q;
    if (kva_seq_new(w->c, &w->seq[s]) != KVA_OK) return 0;
    if (f->h2o && (s & 1)) {
      kva_evict e;
      memset(&e, 0, sizeof e);
      e.kind = KVA_EVICT_H2O;
      e.budget = n + 64; /* scores accumulate; nothing is evicted during this test */
      e.n_sink = 4;
      e.n_recent = 16;
      if (kva_seq_set_evict(w->c, w->seq[s], &e) != KVA_OK) return 0;
    }
    /* two appends: the history, then the n_q newest tokens that are attended */
    for (t = 0; t < 2; t++) {
      int from = t == 0 ? 0 : first, cnt = t == 0 ? first : f->n_q;
      if (cnt == 0) continue;
      if (kva_seq_append(w->c, w->seq[s], cnt) != KVA_OK) return 0;
      for (l = 0; l < f->n_layers; l++) {
        size_t i;
        for (i = 0; i < (size_t)cnt * row; i++) {
          k[(size_t)from * row + i] = frand();
          v[(size_t)from * row + i] = frand();
        }
        if (kva_store(w->c, w->seq[s], l, k + (size_t)from * row, v + (size_t)from * row, cnt) != KVA_OK) return 0;
      }
    }
  }
  free(k);
  free(v);
  {
    size_t n = (size_t)N_SEQS * (size_t)N_LAYERS * out_floats(f), i;
    w->q = (float *)xcalloc(n, sizeof(float));
    w->serial = (float *)xcalloc(n, sizeof(float));
    w->parallel = (float *)xcalloc(n, sizeof(float));
    for (i = 0; i < n; i++) w->q[i] = frand();
    n = (size_t)N_SEQS * N_LAYERS * 4 * row;
    w->read_serial = (float *)xcalloc(n, sizeof(float));
    w->read_parallel = (float *)xcalloc(n, sizeof(float));
    n = (size_t)2 * N_LAYERS * 2 * out_floats(f);
    w->batch_serial = (float *)xcalloc(n, sizeof(float));
    w->batch_parallel = (float *)xcalloc(n, sizeof(float));
  }
  {
    kva_attn a = shape(f);
    int p, l2;
    for (p = 0; p < 2; p++)
      for (l2 = 0; l2 < f->n_layers; l2++) {
        int seqs[2], nq[2];
        seqs[0] = w->seq[2 * p];
        seqs[1] = w->seq[2 * p + 1];
        nq[0] = nq[1] = f->n_q;
        if (kva_batch_plan(w->c, &a, seqs, nq, 2, &w->plan[p][l2]) != KVA_OK) return 0;
      }
  }
  return 1;
}

static void unbuild(world *w) {
  int p, l;
  for (p = 0; p < 2; p++)
    for (l = 0; l < N_LAYERS; l++) kva_batch_free(w->plan[p][l]);
  kva_cache_destroy(w->c);
  free(w->q);
  free(w->serial);
  free(w->parallel);
  free(w->read_serial);
  free(w->read_parallel);
  free(w->batch_serial);
  free(w->batch_parallel);
}

/* one unit of work: attention (and two row reads) of one (sequence, layer),
   or one batch plan over one layer; unit ids: [0, N_SEQS*n_layers) pairs,
   then 2*n_layers batch units */
static kva_status run_unit(world *w, int unit, float *out, float *reads, float *batch_out) {
  const config *f = w->cfg;
  kva_attn a = shape(f);
  kva_status st;
  size_t of = out_floats(f), row = (size_t)f->G * (size_t)f->D;
  int pairs = N_SEQS * f->n_layers;
  if (unit < pairs) {
    int s = unit / f->n_layers, l = unit % f->n_layers, len;
    size_t at = ((size_t)s * N_LAYERS + (size_t)l);
    int32_t pos;
    st = kva_attend_cache(w->c, w->seq[s], l, &a, w->q + at * of, f->n_q, out + at * of);
    if (st != KVA_OK) return st;
    len = kva_seq_len(w->c, w->seq[s]);
    st = kva_seq_read(w->c, w->seq[s], l, 0, reads + at * 4 * row, reads + (at * 4 + 1) * row, &pos);
    if (st != KVA_OK) return st;
    return kva_seq_read(w->c, w->seq[s], l, len - 1, reads + (at * 4 + 2) * row, reads + (at * 4 + 3) * row, &pos);
  } else {
    int b = unit - pairs, p = b / f->n_layers, l = b % f->n_layers;
    size_t at = (size_t)p * N_LAYERS + (size_t)l;
    const float *q0 = w->q + ((size_t)(2 * p) * N_LAYERS + (size_t)l) * of;
    const float *q1 = w->q + ((size_t)(2 * p + 1) * N_LAYERS + (size_t)l) * of;
    float qb[2 * MAX_Q * 64 * 64];
    if (2 * of > sizeof qb / sizeof qb[0]) return KVA_ERR_ARG;
    memcpy(qb, q0, of * sizeof(float));
    memcpy(qb + of, q1, of * sizeof(float));
    return kva_attend_batch(w->c, w->plan[p][l], l, qb, batch_out + at * 2 * of);
  }
}

typedef struct {
  world *w;
  const int *units;
  int n_units;
  kva_status st;
} job;

static void *worker(void *arg) {
  job *j = (job *)arg;
  int i;
  j->st = KVA_OK;
  for (i = 0; i < j->n_units && j->st == KVA_OK; i++)
    j->st = run_unit(j->w, j->units[i], j->w->parallel, j->w->read_parallel, j->w->batch_parallel);
  return NULL;
}

static int rand_below(int n) {
  frand();
  return (int)((g_rng >> 33) % (uint64_t)n);
}

/* runs units [0, n) of one phase from THREADS threads, dealt in a new order */
static void run_phase(world *w, const int *units, int n, int round) {
  pthread_t th[THREADS];
  job jobs[THREADS];
  int order[N_SEQS * N_LAYERS], per = (n + THREADS - 1) / THREADS, u, t;
  for (u = 0; u < n; u++) order[u] = units[u];
  for (u = n - 1; u > 0; u--) {
    int k = rand_below(u + 1), tmp = order[u];
    order[u] = order[k];
    order[k] = tmp;
  }
  for (t = 0; t < THREADS; t++) {
    int from = t * per < n ? t * per : n, to = from + per < n ? from + per : n;
    jobs[t].w = w;
    jobs[t].units = order + from;
    jobs[t].n_units = to - from;
    if (pthread_create(&th[t], NULL, worker, &jobs[t]) != 0) {
      check(0, "pthread_create", w->cfg->name, -1, round);
      jobs[t].n_units = -1;
    }
  }
  for (t = 0; t < THREADS; t++)
    if (jobs[t].n_units >= 0) {
      pthread_join(th[t], NULL);
      check(jobs[t].st == KVA_OK, "a concurrent call returned a status", w->cfg->name, t, round);
    }
}

/* kva_attend_batch as an engine's thread pool runs it: prepare on this
   thread, then THREADS threads run the units cut at random points, then
   the merges the same way */
typedef struct {
  kva_batch *b;
  int merges, begin, end;
  kva_status st;
} unit_range;

static void *range_worker(void *arg) {
  unit_range *r = (unit_range *)arg;
  r->st = r->merges ? kva_batch_run_merges(r->b, r->begin, r->end) : kva_batch_run_units(r->b, r->begin, r->end);
  return NULL;
}

static void run_plan_on_pool(world *w, int p, int l, int round) {
  const config *f = w->cfg;
  size_t of = out_floats(f), at = (size_t)p * N_LAYERS + (size_t)l;
  const float *q0 = w->q + ((size_t)(2 * p) * N_LAYERS + (size_t)l) * of;
  const float *q1 = w->q + ((size_t)(2 * p + 1) * N_LAYERS + (size_t)l) * of;
  static float qb[2 * MAX_Q * 64 * 64];
  kva_batch *b = w->plan[p][l];
  int phase;
  memcpy(qb, q0, of * sizeof(float));
  memcpy(qb + of, q1, of * sizeof(float));
  if (kva_batch_prepare(w->c, b, l, qb, w->batch_parallel + at * 2 * of, NULL) != KVA_OK) {
    check(0, "kva_batch_prepare", f->name, p, l);
    return;
  }
  for (phase = 0; phase < 2; phase++) {
    pthread_t th[THREADS];
    unit_range r[THREADS];
    int n = phase ? kva_batch_n_merges(b) : kva_batch_n_units(b), cut[THREADS + 1], t, k;
    cut[0] = 0;
    cut[THREADS] = n;
    for (t = 1; t < THREADS; t++) cut[t] = rand_below(n + 1);
    for (t = 1; t < THREADS; t++) /* sort the inner cuts (insertion) */
      for (k = t; k > 1 && cut[k - 1] > cut[k]; k--) {
        int tmp = cut[k];
        cut[k] = cut[k - 1];
        cut[k - 1] = tmp;
      }
    for (t = 0; t < THREADS; t++) {
      r[t].b = b, r[t].merges = phase, r[t].begin = cut[t], r[t].end = cut[t + 1], r[t].st = KVA_OK;
      if (pthread_create(&th[t], NULL, range_worker, &r[t]) != 0) {
        check(0, "pthread_create", f->name, -1, round);
        r[t].begin = -1;
      }
    }
    for (t = 0; t < THREADS; t++)
      if (r[t].begin >= 0) {
        pthread_join(th[t], NULL);
        check(r[t].st == KVA_OK, "kva_batch_run_units/merges returned a status", f->name, t, round);
      }
  }
}

static void run_config(const config *f, int rounds) {
  world w;
  int pairs = N_SEQS * f->n_layers, n_units = pairs + 2 * f->n_layers, u, r, s, l;
  int pair_units[N_SEQS * N_LAYERS], batch_units[2 * N_LAYERS];
  size_t of = out_floats(f), row = (size_t)f->G * (size_t)f->D;
  if (!build(f, &w)) {
    check(0, "cache setup", f->name, -1, -1);
    unbuild(&w);
    return;
  }
  for (u = 0; u < n_units; u++) {
    kva_status st = run_unit(&w, u, w.serial, w.read_serial, w.batch_serial);
    check(st == KVA_OK, "a serial call returned a status", f->name, u, -1);
  }
  for (u = 0; u < pairs; u++) pair_units[u] = u;
  for (u = 0; u < 2 * f->n_layers; u++) batch_units[u] = pairs + u;
  for (r = 0; r < rounds; r++) {
    memset(w.parallel, 0xff, (size_t)N_SEQS * N_LAYERS * of * sizeof(float));
    memset(w.read_parallel, 0xff, (size_t)N_SEQS * N_LAYERS * 4 * row * sizeof(float));
    memset(w.batch_parallel, 0xff, (size_t)2 * N_LAYERS * 2 * of * sizeof(float));
    /* every (sequence, layer) at once; then both batch plans over every layer
       at once (a plan and a single call on the same sequence and layer would
       both add to its H2O scores: the caller serialises those) */
    run_phase(&w, pair_units, pairs, r);
    run_phase(&w, batch_units, 2 * f->n_layers, r);
    for (s = 0; s < N_SEQS; s++)
      for (l = 0; l < f->n_layers; l++) {
        size_t at = (size_t)s * N_LAYERS + (size_t)l;
        check(memcmp(w.serial + at * of, w.parallel + at * of, of * sizeof(float)) == 0,
              "kva_attend_cache output differs from the serial one", f->name, s, l);
        check(memcmp(w.read_serial + at * 4 * row, w.read_parallel + at * 4 * row, 4 * row * sizeof(float)) == 0,
              "kva_seq_read rows differ from the serial ones", f->name, s, l);
      }
    for (s = 0; s < 2; s++)
      for (l = 0; l < f->n_layers; l++) {
        size_t at = (size_t)s * N_LAYERS + (size_t)l;
        check(memcmp(w.batch_serial + at * 2 * of, w.batch_parallel + at * 2 * of, 2 * of * sizeof(float)) == 0,
              "kva_attend_batch output differs from the serial one", f->name, s, l);
      }
    /* each plan and layer in turn, its units and merges shared by THREADS threads */
    memset(w.batch_parallel, 0xff, (size_t)2 * N_LAYERS * 2 * of * sizeof(float));
    for (s = 0; s < 2; s++)
      for (l = 0; l < f->n_layers; l++) run_plan_on_pool(&w, s, l, r);
    for (s = 0; s < 2; s++)
      for (l = 0; l < f->n_layers; l++) {
        size_t at = (size_t)s * N_LAYERS + (size_t)l;
        check(memcmp(w.batch_serial + at * 2 * of, w.batch_parallel + at * 2 * of, 2 * of * sizeof(float)) == 0,
              "a plan run by kva_batch_run_units/merges on a pool differs from kva_attend_batch", f->name, s, l);
      }
  }
  unbuild(&w);
}

int main(int argc, char **argv) {
  static const config cfgs[] = {
      /* MQA decode over 4,096 keys: split-K inside the call */
      {"mqa f16 decode 4096", 8, 1, 64, 2, KVA_F16, {4096, 4000, 4096, 1}, 1, 0},
      {"gqa int8 decode, h2o", 8, 2, 40, 3, KVA_INT8, {700, 33, 257, 1024}, 1, 1},
      {"gqa f16 3 rows, h2o", 8, 2, 64, 3, KVA_F16, {300, 513, 17, 64}, 3, 1},
      {"mha fp8_e4m3 decode", 4, 4, 24, 2, KVA_FP8_E4M3, {2048, 129, 1000, 5}, 1, 0},
  };
  int quick = argc > 1 && strcmp(argv[1], "--quick") == 0, i;
  if (argc > 1 && !quick) {
    fprintf(stderr, "usage: threads_check [--quick]\n");
    return 2;
  }
  for (i = 0; i < (int)(sizeof cfgs / sizeof cfgs[0]); i++) run_config(&cfgs[i], quick ? 3 : 12);
  printf("threads_check: %d threads, %d passed, %d failed\n", THREADS, g_pass, g_fail);
  return g_fail ? 1 : 0;
}
