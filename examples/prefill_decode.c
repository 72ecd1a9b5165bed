/* prefill_decode: a sequence's KV cache moved between processes, and out to
   host memory and back, with kva_seq_export / kva_seq_import, on the small
   trained model of bench/model/ (examples/llm.h runs it over kvattn).

   1. Disaggregated prefill and decode.  A prefill process runs the prompt
      (by default the first ~330 tokens of bench/model/heldout.txt) into its
      cache, exports the sequence and sends it, length-prefixed, through a
      pipe to a decode process (fork).  The decode process has its own
      weights and its own cache, laid out in other blocks (the stream is per
      token, so block sizes need not match); it imports the stream and
      generates greedily.  The prefill process then continues the very
      sequence it exported (export only reads) in one process: both texts
      must be identical.
   2. Swapping under memory pressure.  The prompt's four quarters become four
      requests decoding together in a pool that cannot hold them all at the
      end.  When an append finds the pool full, the youngest running request
      is exported to host memory (malloc) and freed; it is imported back when
      there is room and resumes where it stopped, nothing recomputed.  Every
      request's text must equal its text without pressure.

   build/examples/prefill_decode [--model PATH] [--tokenizer PATH] [--steps N] [--prompt TEXT]
   Exit status: 0 both checks pass, 1 a check fails or a call fails, 2 bad input. */
#define _POSIX_C_SOURCE 200809L /* fork, pipe, waitpid, clock_gettime */
#include "llm.h"

#include <errno.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROMPT_BYTES 1200 /* of heldout.txt when there is no --prompt: about 330 tokens */
#define PREFILL_BLOCK 16  /* tokens per block in the prefill process's cache */
#define DECODE_BLOCK 32   /* and in the decode process's: a stream is per token, layouts may differ */
#define NREQ 4            /* requests of the swap demonstration */
#define BS 16             /* block size of the swap demonstration's pool */
#define MAX_STREAM ((uint64_t)1 << 30) /* a longer length prefix is a broken message, not a sequence */

static const char *prog = "prefill_decode";

static void fail(int code, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "%s: ", prog);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  exit(code);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: %s [--model PATH] [--tokenizer PATH] [--steps N] [--prompt TEXT]\n"
          "Moves a prefilled KV cache from a prefill process to a decode process (kva_seq_export,\n"
          "a pipe, kva_seq_import) and checks the generated text against one process; then swaps\n"
          "sequences out to host memory and back under memory pressure and checks their texts.\n"
          "  --model PATH      llama2.c checkpoint (default bench/model/model.bin)\n"
          "  --tokenizer PATH  its tokenizer (default bench/model/tokenizer.bin)\n"
          "  --steps N         tokens to generate per sequence (default 64)\n"
          "  --prompt TEXT     the prompt (default: the first %d bytes of heldout.txt next to the model)\n"
          "Run from the repository root for the defaults.  Exit status 0: every text identical.\n",
          prog, PROMPT_BYTES);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static kva_status new_cache(const llm_model *m, int block_size, int n_blocks, int max_seqs, kva_cache **c) {
  llm_cache_opts o;
  memset(&o, 0, sizeof o); /* F16 K and V, kvattn's defaults */
  o.block_size = block_size;
  o.n_blocks = n_blocks;
  o.max_seqs = max_seqs;
  return llm_cache_create(m, &o, c);
}

static int blocks_for(int block_size, long n_tokens) { /* as llm_blocks_for: + 1 for a partial tail */
  llm_cache_opts o;
  memset(&o, 0, sizeof o);
  o.block_size = block_size;
  return llm_blocks_for(&o, n_tokens);
}

/* Run n tokens as the sequence's next ones (one chunk: st holds n rows, so
   a full pool changes nothing); *next = the greedy token after them. */
static kva_status feed(const llm_model *m, llm_state *st, kva_cache *c, int seq, const int32_t *tok, int n,
                       int32_t *next) {
  kva_status s = llm_forward(m, st, c, seq, tok, n, st->logits, 0);
  if (s == KVA_OK) *next = llm_argmax(st->logits, m->c.vocab_size);
  return s;
}

/* Greedy decoding: out[0] is the token after the prompt, each next one the
   argmax after feeding the previous. */
static kva_status generate(const llm_model *m, llm_state *st, kva_cache *c, int seq, int32_t *out, int n) {
  int i;
  kva_status s = KVA_OK;
  for (i = 1; i < n && s == KVA_OK; i++) s = feed(m, st, c, seq, &out[i - 1], 1, &out[i]);
  return s;
}

/* The text of tokens following `prev`, on one line (newlines as \n). */
static void print_text(const llm_tokenizer *tk, int32_t prev, const int32_t *tok, int n) {
  int i;
  const char *p;
  putchar('"');
  for (i = 0; i < n; prev = tok[i], i++) {
    if (!llm_piece_visible(p = llm_decode(tk, prev, tok[i]))) continue;
    for (; *p; p++) {
      if (*p == '\n' || *p == '"') putchar('\\');
      putchar(*p == '\n' ? 'n' : *p);
    }
  }
  printf("\"\n");
}

/* ======================================================================
   1. disaggregated prefill / decode
   ====================================================================== */

/* What goes through the pipes.  To the decode process: u64 stream bytes,
   the stream, then a msg_tail.  Back: a msg_reply, then the n tokens.
   Both ends are this program on this machine, so structs go as they are
   (the stream itself states its byte order; kva_seq_import checks it). */
typedef struct {
  int32_t first; /* the token after the prompt: the prefill's logits chose it */
  int32_t n;     /* tokens to generate, first included */
} msg_tail;
typedef struct {
  int32_t status; /* of kva_seq_import, then of the decoding */
  int32_t n;
  double t_import, t_decode;
} msg_reply;

static int write_all(int fd, const void *buf, size_t n) {
  const char *p = (const char *)buf;
  while (n > 0) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return 0;
    p += k, n -= (size_t)k;
  }
  return 1;
}

static int read_all(int fd, void *buf, size_t n) { /* 0: end of file or error first */
  char *p = (char *)buf;
  while (n > 0) {
    ssize_t k = read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return 0;
    p += k, n -= (size_t)k;
  }
  return 1;
}

static void child_fail(const char *what) {
  fprintf(stderr, "%s (decode process): %s\n", prog, what);
  _exit(1); /* not exit: the parent's stdio and atexit state are not this process's */
}

/* The decode process: reads the weights itself, as a decode server would,
   takes a sequence from `in` into its own cache and answers on `out`. */
static void decode_process(const char *model_path, int in, int out) {
  llm_model m;
  llm_state st;
  kva_cache *c;
  char err[512];
  uint64_t size;
  void *stream = NULL;
  msg_tail tail;
  msg_reply r;
  int32_t *tok = NULL;
  int seq;
  double t0;
  if (!llm_model_load(&m, model_path, err, sizeof err)) child_fail(err);
  if (!llm_state_init(&st, &m, 1, 1)) child_fail("out of memory");
  /* room for one sequence of the model's whole context, in 32-token blocks */
  if (new_cache(&m, DECODE_BLOCK, blocks_for(DECODE_BLOCK, m.c.seq_len), 1, &c) != KVA_OK)
    child_fail("cannot create the KV cache");
  if (!read_all(in, &size, sizeof size)) child_fail("no stream from the prefill process");
  if (size > MAX_STREAM || !(stream = malloc((size_t)size))) child_fail("stream too large");
  if (!read_all(in, stream, (size_t)size) || !read_all(in, &tail, sizeof tail)) child_fail("stream cut short");
  if (tail.n < 1 || tail.n > m.c.seq_len || !(tok = (int32_t *)malloc((size_t)tail.n * sizeof *tok)))
    child_fail("bad token count");
  memset(&r, 0, sizeof r);
  t0 = now();
  r.status = kva_seq_import(c, stream, (size_t)size, &seq);
  r.t_import = now() - t0;
  free(stream); /* the cache has its own copy now */
  if (r.status == KVA_OK) {
    tok[0] = tail.first;
    t0 = now();
    r.status = generate(&m, &st, c, seq, tok, tail.n);
    r.t_decode = now() - t0;
    r.n = r.status == KVA_OK ? tail.n : 0;
  }
  if (!write_all(out, &r, sizeof r) || !write_all(out, tok, (size_t)r.n * sizeof *tok))
    child_fail("cannot answer the prefill process");
  free(tok);
  kva_cache_destroy(c);
  llm_state_free(&st);
  llm_model_free(&m);
  _exit(0);
}

/* The prefill process's side; returns 1 when the texts are identical. */
static int disaggregated(const llm_model *m, const llm_tokenizer *tk, const char *model_path, const int32_t *prompt,
                         int n_prompt, int steps) {
  int to_dec[2], from_dec[2], seq, status, same;
  pid_t pid;
  kva_cache *c;
  kva_status s;
  llm_state st;
  size_t size;
  uint64_t size64;
  void *stream = NULL;
  msg_tail tail;
  msg_reply r;
  int32_t *split = (int32_t *)malloc((size_t)steps * sizeof(int32_t)); /* the decode process's tokens */
  int32_t *one = (int32_t *)malloc((size_t)steps * sizeof(int32_t));   /* the one-process tokens */
  double t0, t_prefill, t_export, t_send, t_one;
  llm_cache_opts opts; /* new_cache's storage: kvattn's default, F16 */

  memset(&opts, 0, sizeof opts);
  if (!split || !one) fail(1, "out of memory");
  printf("1. disaggregated prefill/decode: a %d-token prompt, %d tokens generated\n", n_prompt, steps);
  fflush(stdout); /* the child inherits unwritten buffers: none */
  if (pipe(to_dec) != 0 || pipe(from_dec) != 0) fail(1, "pipe: %s", strerror(errno));
  if ((pid = fork()) < 0) fail(1, "fork: %s", strerror(errno));
  if (pid == 0) {
    close(to_dec[1]), close(from_dec[0]);
    decode_process(model_path, to_dec[0], from_dec[1]);
  }
  close(to_dec[0]), close(from_dec[1]);

  /* prefill */
  if ((s = new_cache(m, PREFILL_BLOCK, blocks_for(PREFILL_BLOCK, (long)n_prompt + steps), 1, &c)) != KVA_OK)
    fail(1, "cannot create the KV cache: %s", kva_status_str(s));
  if (!llm_state_init(&st, m, n_prompt, 1)) fail(1, "out of memory");
  if ((s = kva_seq_new(c, &seq)) != KVA_OK) fail(1, "kva_seq_new: %s", kva_status_str(s));
  t0 = now();
  if ((s = feed(m, &st, c, seq, prompt, n_prompt, &split[0])) != KVA_OK) fail(1, "prefill: %s", kva_status_str(s));
  t_prefill = now() - t0;

  /* export: ask the size, then write the stream */
  if ((s = kva_seq_export(c, seq, NULL, 0, &size)) != KVA_OK) fail(1, "kva_seq_export: %s", kva_status_str(s));
  if (!(stream = malloc(size))) fail(1, "out of memory for a %lu-byte stream", (unsigned long)size);
  t0 = now();
  if ((s = kva_seq_export(c, seq, stream, size, &size)) != KVA_OK) fail(1, "kva_seq_export: %s", kva_status_str(s));
  t_export = now() - t0;

  /* send: length, stream, the first token and how many to make */
  size64 = size;
  tail.first = split[0];
  tail.n = steps;
  t0 = now();
  if (!write_all(to_dec[1], &size64, sizeof size64) || !write_all(to_dec[1], stream, size) ||
      !write_all(to_dec[1], &tail, sizeof tail))
    fail(1, "cannot send the stream to the decode process: %s", strerror(errno));
  t_send = now() - t0; /* until the pipe took the last byte: the decode process reads as it comes */
  close(to_dec[1]);
  if (!read_all(from_dec[0], &r, sizeof r) || r.n < 0 || r.n > steps ||
      !read_all(from_dec[0], split, (size_t)r.n * sizeof *split))
    fail(1, "the decode process ended without an answer");
  close(from_dec[0]);
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail(1, "the decode process failed");
  if (r.status != KVA_OK) fail(1, "decode process: %s", kva_status_str((kva_status)r.status));

  /* the same in one process: the prefill process continues the sequence it exported */
  one[0] = split[0];
  t0 = now();
  if ((s = generate(m, &st, c, seq, one, steps)) != KVA_OK) fail(1, "decode: %s", kva_status_str(s));
  t_one = now() - t0;

  printf("   prefill process: prefill %.1f ms; kva_seq_export %.3f ms; pipe %.3f ms\n", 1e3 * t_prefill,
         1e3 * t_export, 1e3 * t_send);
  /* per token: K and V, and the position and H2O score (4 + 4 bytes per
     layer and KV head) that a cache which may evict keeps; then a header */
  printf("   stream: %lu bytes for %d tokens = %.1f bytes/token (K and V %lu, positions and H2O scores %d)\n",
         (unsigned long)size, n_prompt, (double)size / n_prompt, (unsigned long)llm_cache_bytes_per_token(m, &opts),
         8 * m->c.n_layers * m->c.n_kv_heads);
  printf("   decode process (%d-token blocks): kva_seq_import %.3f ms; %d decode steps %.1f ms\n", DECODE_BLOCK,
         1e3 * r.t_import, steps - 1, 1e3 * r.t_decode);
  printf("   one process: %d decode steps %.1f ms\n", steps - 1, 1e3 * t_one);
  printf("   prefill -> decode process: ");
  print_text(tk, prompt[n_prompt - 1], split, steps);
  printf("   one process:               ");
  print_text(tk, prompt[n_prompt - 1], one, steps);
  same = memcmp(split, one, (size_t)steps * sizeof *one) == 0;
  printf("   identical: %s\n", same ? "yes" : "NO");
  free(stream);
  free(split);
  free(one);
  llm_state_free(&st);
  kva_cache_destroy(c);
  return same;
}

/* ======================================================================
   2. swapping to host memory under memory pressure
   ====================================================================== */

typedef struct {
  int32_t *prompt;
  int n_prompt;
  int32_t *out;         /* [steps]: out[0..n_out) generated; out[n_out - 1] is fed next */
  int n_out, seq;       /* seq -1: not in the cache (waiting, swapped out or done) */
  void *swapped;        /* the exported sequence while swapped out */
  size_t swapped_bytes;
} request;

typedef struct {
  int n_out, n_in;
  size_t bytes;
  double t_export, t_import;
} swap_stats;

/* Request i's sequence to host memory; its blocks go back to the pool. */
static void swap_out(kva_cache *c, request *rq, int i, int round, const char *why, swap_stats *ss) {
  request *r = &rq[i];
  kva_status s;
  double t0 = now();
  if ((s = kva_seq_export(c, r->seq, NULL, 0, &r->swapped_bytes)) != KVA_OK)
    fail(1, "kva_seq_export: %s", kva_status_str(s));
  if (!(r->swapped = malloc(r->swapped_bytes))) fail(1, "out of memory for a swapped-out sequence");
  if ((s = kva_seq_export(c, r->seq, r->swapped, r->swapped_bytes, &r->swapped_bytes)) != KVA_OK)
    fail(1, "kva_seq_export: %s", kva_status_str(s));
  ss->t_export += now() - t0;
  kva_seq_free(c, r->seq);
  r->seq = -1;
  ss->n_out++;
  ss->bytes += r->swapped_bytes;
  printf("   round %3d: request %d swapped out (%3d tokens, %6lu bytes): %s\n", round, i, r->n_prompt + r->n_out - 1,
         (unsigned long)r->swapped_bytes, why);
}

/* Let request i (waiting or swapped out) in if the pool has room for what
   it holds, this round's new tokens, and a block of growth for each running
   request (without that margin it would push one of them out at once). */
static int admit(kva_cache *c, request *rq, int i, int round, swap_stats *ss) {
  request *r = &rq[i];
  kva_cache_stats cs;
  int k, running = 0, held = r->n_out ? r->n_prompt + r->n_out - 1 : 0, adding = r->n_out ? 1 : r->n_prompt;
  kva_status s;
  double t0;
  for (k = 0; k < NREQ; k++) running += rq[k].seq >= 0;
  kva_cache_get_stats(c, &cs);
  if (cs.blocks_free < (held + adding + BS - 1) / BS + running) return 0;
  if (!r->swapped) return kva_seq_new(c, &r->seq) == KVA_OK;
  t0 = now();
  s = kva_seq_import(c, r->swapped, r->swapped_bytes, &r->seq);
  if (s == KVA_ERR_FULL) return 0; /* nothing changed: it stays out */
  if (s != KVA_OK) fail(1, "swap in: %s", kva_status_str(s));
  ss->t_import += now() - t0;
  ss->n_in++;
  printf("   round %3d: request %d swapped in  (%3d tokens, %6lu bytes)\n", round, i, held,
         (unsigned long)r->swapped_bytes);
  free(r->swapped);
  r->swapped = NULL;
  return 1;
}

static int swapping(const llm_model *m, const llm_tokenizer *tk, const int32_t *prompt, int n_prompt, int steps) {
  request rq[NREQ];
  int32_t *ref[NREQ];
  int i, k, round, n_done = 0, pool = 0, need = 0, peak = 0, longest = 0, seq, all_same = 1;
  int q = (n_prompt - 1) / NREQ; /* text tokens per request (prompt[0] is BOS) */
  char why[80];
  kva_cache *c;
  kva_cache_stats cs;
  kva_status s;
  llm_state st;
  swap_stats ss;

  memset(&ss, 0, sizeof ss);
  for (i = 0; i < NREQ; i++) { /* request i: BOS + the prompt's i-th quarter (the whole prompt if too short) */
    request *r = &rq[i];
    memset(r, 0, sizeof *r);
    r->n_prompt = q > 0 ? q + 1 : n_prompt;
    r->prompt = (int32_t *)malloc((size_t)r->n_prompt * sizeof(int32_t));
    r->out = (int32_t *)malloc((size_t)steps * sizeof(int32_t));
    ref[i] = (int32_t *)malloc((size_t)steps * sizeof(int32_t));
    if (!r->prompt || !r->out || !ref[i]) fail(1, "out of memory");
    r->prompt[0] = LLM_BOS;
    memcpy(r->prompt + 1, prompt + (q > 0 ? 1 + i * q : 1), (size_t)(r->n_prompt - 1) * sizeof(int32_t));
    r->seq = -1;
    need += (r->n_prompt + steps - 1 + BS - 1) / BS; /* the last token is not fed */
    if (r->n_prompt > longest) longest = r->n_prompt;
  }
  if (!llm_state_init(&st, m, longest, 1)) fail(1, "out of memory");

  /* without pressure: each request alone in a pool with room for all */
  if ((s = new_cache(m, BS, need + NREQ, NREQ, &c)) != KVA_OK)
    fail(1, "cannot create the KV cache: %s", kva_status_str(s));
  for (i = 0; i < NREQ; i++) {
    if ((s = kva_seq_new(c, &seq)) != KVA_OK ||
        (s = feed(m, &st, c, seq, rq[i].prompt, rq[i].n_prompt, &ref[i][0])) != KVA_OK ||
        (s = generate(m, &st, c, seq, ref[i], steps)) != KVA_OK)
      fail(1, "reference run: %s", kva_status_str(s));
    kva_seq_free(c, seq);
  }
  kva_cache_destroy(c);

  /* under pressure: room for every prompt and one block of growth each (all
     start; the pool runs out soon after), and at least for the longest
     request alone (someone can always finish) */
  for (i = 0; i < NREQ; i++) pool += (rq[i].n_prompt + BS - 1) / BS + 1;
  for (i = 0; i < NREQ; i++)
    if (pool < blocks_for(BS, (long)rq[i].n_prompt + steps)) pool = blocks_for(BS, (long)rq[i].n_prompt + steps);
  printf("2. swapping: %d requests (the prompt's quarters, %d tokens each), %d tokens each, in a pool of %d blocks of "
         "%d tokens (they need %d at the end)\n",
         NREQ, rq[0].n_prompt, steps, pool, BS, need);
  if ((s = new_cache(m, BS, pool, NREQ, &c)) != KVA_OK) fail(1, "cannot create the KV cache: %s", kva_status_str(s));

  /* rounds: every running request takes a step (its prompt, or one token),
     oldest first; a request that is out comes in only in arrival order */
  for (round = 0; n_done < NREQ; round++) {
    int blocked = 0, progressed = 0;
    for (i = 0; i < NREQ; i++) {
      request *r = &rq[i];
      const int32_t *in = r->n_out ? &r->out[r->n_out - 1] : r->prompt;
      if (r->n_out == steps) continue;
      if (r->seq < 0 && (blocked || !admit(c, rq, i, round, &ss))) {
        blocked = 1;
        continue;
      }
      while ((s = feed(m, &st, c, r->seq, in, r->n_out ? 1 : r->n_prompt, &r->out[r->n_out])) == KVA_ERR_FULL) {
        int victim = -1; /* the youngest running request younger than this one */
        for (k = NREQ - 1; k > i && victim < 0; k--)
          if (rq[k].seq >= 0) victim = k;
        if (victim < 0) break;
        snprintf(why, sizeof why, "the pool was full as request %d appended", i);
        swap_out(c, rq, victim, round, why, &ss);
      }
      if (s == KVA_ERR_FULL) { /* it is the youngest running request itself: it waits, out of the pool */
        if (r->n_out > 0) {
          swap_out(c, rq, i, round, "the pool was full as it appended, and it is the youngest", &ss);
        } else {
          kva_seq_free(c, r->seq);
          r->seq = -1;
        }
        blocked = 1;
        continue;
      }
      if (s != KVA_OK) fail(1, "decode: %s", kva_status_str(s));
      progressed = 1;
      kva_cache_get_stats(c, &cs);
      if (cs.blocks_used > peak) peak = cs.blocks_used;
      if (++r->n_out == steps) {
        kva_seq_free(c, r->seq);
        r->seq = -1;
        n_done++;
      }
    }
    if (!progressed) fail(1, "no request could make progress in a pool of %d blocks", pool);
  }
  kva_cache_get_stats(c, &cs);

  for (i = 0; i < NREQ; i++) {
    int same = memcmp(rq[i].out, ref[i], (size_t)steps * sizeof(int32_t)) == 0;
    all_same &= same;
    printf("   request %d %s ", i, same ? "(= without pressure)" : "(DIFFERS)");
    print_text(tk, rq[i].prompt[rq[i].n_prompt - 1], rq[i].out, steps);
    if (!same) {
      printf("   without pressure:           ");
      print_text(tk, rq[i].prompt[rq[i].n_prompt - 1], ref[i], steps);
    }
  }
  printf("   %d rounds, peak %d of %d blocks; %d swaps out, %d in; %lu bytes exported; kva_seq_export %.3f ms, "
         "kva_seq_import %.3f ms in all\n",
         round, peak, pool, ss.n_out, ss.n_in, (unsigned long)ss.bytes, 1e3 * ss.t_export, 1e3 * ss.t_import);
  printf("   every text equals its text without pressure: %s\n", all_same ? "yes" : "NO");
  if (cs.blocks_used != 0 || cs.n_seqs != 0) {
    printf("   the pool is not empty at the end: %d blocks, %d sequences\n", cs.blocks_used, cs.n_seqs);
    all_same = 0;
  }
  for (i = 0; i < NREQ; i++) free(rq[i].prompt), free(rq[i].out), free(rq[i].swapped), free(ref[i]);
  llm_state_free(&st);
  kva_cache_destroy(c);
  return all_same;
}

/* ======================================================================
   main: options, model, prompt
   ====================================================================== */

/* The first PROMPT_BYTES bytes of heldout.txt in the model's folder, cut
   after the last space; NULL if it cannot be read. */
static char *default_prompt(const char *model_path, char *path, size_t n) {
  const char *slash = strrchr(model_path, '/');
  char *text;
  size_t got;
  FILE *f;
  if (slash)
    snprintf(path, n, "%.*s/heldout.txt", (int)(slash - model_path), model_path);
  else
    snprintf(path, n, "heldout.txt");
  if (!(f = fopen(path, "rb"))) return NULL;
  if (!(text = (char *)malloc(PROMPT_BYTES + 1))) fail(1, "out of memory");
  got = fread(text, 1, PROMPT_BYTES, f);
  fclose(f);
  while (got == PROMPT_BYTES && got > 0 && text[got - 1] != ' ') got--;
  text[got] = '\0';
  return text;
}

static void can_open(const char *path, const char *flag) {
  FILE *f = fopen(path, "rb");
  if (!f) fail(2, "cannot open %s: %s (run from the repository root, or give %s PATH)", path, strerror(errno), flag);
  fclose(f);
}

int main(int argc, char **argv) {
  const char *model_path = "bench/model/model.bin", *tok_path = "bench/model/tokenizer.bin", *prompt_text = NULL;
  char err[600], heldout[600];
  char *owned = NULL;
  long steps = 64;
  int i, n_prompt = 0, ok1, ok2;
  int32_t *prompt;
  llm_model m;
  llm_tokenizer tk;

  for (i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    if (strcmp(a, "--model") && strcmp(a, "--tokenizer") && strcmp(a, "--steps") && strcmp(a, "--prompt")) {
      fprintf(stderr, "%s: unknown option '%s'\n", prog, a);
      usage(stderr);
      return 2;
    }
    if (i + 1 >= argc) fail(2, "%s needs a value (--help lists the options)", a);
    if (!strcmp(a, "--model")) model_path = argv[++i];
    else if (!strcmp(a, "--tokenizer")) tok_path = argv[++i];
    else if (!strcmp(a, "--prompt")) prompt_text = argv[++i];
    else {
      char *end;
      errno = 0;
      steps = strtol(argv[++i], &end, 10);
      if (end == argv[i] || *end || errno || steps < 1 || steps > 1000000)
        fail(2, "--steps '%s': give a whole number of tokens, 1 or more", argv[i]);
    }
  }

  can_open(model_path, "--model");
  can_open(tok_path, "--tokenizer");
  if (!llm_model_load(&m, model_path, err, sizeof err)) fail(2, "%s", err);
  if (!llm_tokenizer_load(&tk, tok_path, m.c.vocab_size, err, sizeof err)) fail(2, "%s", err);
  if (!prompt_text && !(prompt_text = owned = default_prompt(model_path, heldout, sizeof heldout)))
    fail(2, "no --prompt, and %s (the default prompt) cannot be read: give --prompt TEXT", heldout);
  if (!(prompt = (int32_t *)malloc((strlen(prompt_text) + 3) * sizeof(int32_t))) ||
      llm_encode(&tk, prompt_text, 1, 0, prompt, &n_prompt) != 0)
    fail(1, "out of memory");
  if (n_prompt >= m.c.seq_len)
    fail(2, "the prompt is %d tokens; the model takes %d in all: give a shorter --prompt", n_prompt, m.c.seq_len);
  if (n_prompt + steps > m.c.seq_len)
    fail(2, "the prompt is %d tokens; with --steps %ld that is %ld positions, more than the model's %d: use "
            "--steps %d or less, or a shorter --prompt",
         n_prompt, steps, n_prompt + steps, m.c.seq_len, m.c.seq_len - n_prompt);
  signal(SIGPIPE, SIG_IGN); /* a decode process that dies shows as a failed write, not a dead parent */

  printf("model %s: %d layers, %d KV heads of %d; cache F16\n", model_path, m.c.n_layers, m.c.n_kv_heads,
         m.c.head_dim);
  ok1 = disaggregated(&m, &tk, model_path, prompt, n_prompt, (int)steps);
  ok2 = swapping(&m, &tk, prompt, n_prompt, (int)steps);

  free(prompt);
  free(owned);
  llm_tokenizer_free(&tk);
  llm_model_free(&m);
  return ok1 && ok2 ? 0 : 1;
}
