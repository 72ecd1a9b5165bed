/* needle.h - needle-in-a-haystack retrieval cases for a llama2.c model run
   through kvattn (examples/llm.h): read them from a file, run one and score
   it.

   A case is a prompt that states a pass key somewhere in filler prose and
   asks for it at the end; the model answers by greedy decoding, and the case
   counts as retrieved when the decoded text, past its leading white space,
   starts with a run of digits equal to the answer (the passkey test of
   Mohtashami & Jaggi 2023, "Landmark Attention", arXiv:2305.16300; several
   named keys with one asked for is RULER's multi-key needle, Hsieh et al.
   2024, arXiv:2404.06654).

   File format (one case per line, UTF-8, tab-separated):
       depth <TAB> answer <TAB> prompt
   depth: where the needle sits, a fraction 0..1 of the filler before it;
   answer: the digits to retrieve (1..31 of them); prompt: the text the
   model reads after BOS.  A case reports under the context length of its
   prompt and answer rounded up to a power of two (NEEDLE_MIN_CONTEXT at
   least), so 1,000- and 2,000-token prompts are the 1K and 2K columns.

   Include after examples/llm.h.  C99, the C standard library only. */
#ifndef NEEDLE_H
#define NEEDLE_H

#include <ctype.h>
#include <stdarg.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NEEDLE_ANSWER_MAX 32   /* bytes of an answer with its NUL */
#define NEEDLE_MIN_CONTEXT 256 /* the smallest context-length bucket */
#define NEEDLE_GEN_EXTRA 2     /* tokens decoded past the answer's length: a longer number fails */

typedef enum { NEEDLE_SINGLE = 0, NEEDLE_MULTI = 1 } needle_kind;

typedef struct {
  double depth;                   /* fraction of the filler before the needle */
  char answer[NEEDLE_ANSWER_MAX]; /* the digits to retrieve */
  int32_t *tok;                   /* BOS + the prompt's tokens */
  int n;                          /* tokens in tok */
  int context;                    /* the context-length bucket it reports under */
} needle_case;

typedef struct {
  needle_case *cases;
  int n, cap;
} needle_set;

static inline void needle_set_free(needle_set *s) {
  int i;
  if (!s) return;
  for (i = 0; i < s->n; i++) free(s->cases[i].tok);
  free(s->cases);
  memset(s, 0, sizeof *s);
}

static inline void needle__err(char *err, size_t errn, const char *fmt, ...) {
  va_list ap;
  if (!err || errn == 0) return;
  va_start(ap, fmt);
  vsnprintf(err, errn, fmt, ap);
  va_end(ap);
}

/* the bucket of a case of n prompt tokens and an answer of answer_len characters */
static inline int needle_context_of(int n_tokens, int answer_len) {
  long need = (long)n_tokens + answer_len + NEEDLE_GEN_EXTRA, c = NEEDLE_MIN_CONTEXT;
  while (c < need && c < (1L << 30)) c *= 2;
  return (int)c;
}

/* Append a case: encode prompt (BOS first), check that its answer is digits
   and that prompt + answer fit in seq_len.  Returns 1, or 0 with a message. */
static inline int needle__add(needle_set *s, const llm_tokenizer *t, int seq_len, double depth, const char *answer,
                              size_t answer_len, const char *prompt, char *err, size_t errn) {
  needle_case *c;
  size_t i;
  if (!(depth >= 0.0 && depth <= 1.0)) {
    needle__err(err, errn, "depth %g is not a fraction in 0..1", depth);
    return 0;
  }
  if (answer_len == 0 || answer_len >= NEEDLE_ANSWER_MAX) {
    needle__err(err, errn, "the answer has %lu characters; give 1..%d digits", (unsigned long)answer_len,
                NEEDLE_ANSWER_MAX - 1);
    return 0;
  }
  for (i = 0; i < answer_len; i++)
    if (!isdigit((unsigned char)answer[i])) {
      needle__err(err, errn, "the answer \"%.*s\" is not all digits", (int)answer_len, answer);
      return 0;
    }
  /* every digit must be a piece of the vocabulary: a model that can only
     spell it in byte tokens was never asked for numbers */
  for (i = 0; i < answer_len; i++) {
    char d[2];
    d[0] = answer[i], d[1] = 0;
    if (llm_token_lookup(t, d) < 0) {
      needle__err(err, errn, "the answer's digit '%c' is not in the tokenizer's vocabulary", answer[i]);
      return 0;
    }
  }
  if (!prompt[0]) {
    needle__err(err, errn, "the prompt is empty");
    return 0;
  }
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 64;
    needle_case *nc = (needle_case *)realloc(s->cases, (size_t)cap * sizeof *nc);
    if (!nc) {
      needle__err(err, errn, "out of memory");
      return 0;
    }
    s->cases = nc, s->cap = cap;
  }
  c = &s->cases[s->n];
  memset(c, 0, sizeof *c);
  c->depth = depth;
  memcpy(c->answer, answer, answer_len);
  c->answer[answer_len] = 0;
  if (!(c->tok = (int32_t *)malloc((strlen(prompt) + 3) * sizeof(int32_t))) ||
      llm_encode(t, prompt, 1, 0, c->tok, &c->n) != 0) {
    free(c->tok);
    needle__err(err, errn, "out of memory");
    return 0;
  }
  if (c->n + (int)answer_len + NEEDLE_GEN_EXTRA > seq_len) {
    needle__err(err, errn, "the prompt is %d tokens: with its answer it does not fit in the model's %d", c->n,
                seq_len);
    free(c->tok);
    return 0;
  }
  c->context = needle_context_of(c->n, (int)answer_len);
  s->n++;
  return 1;
}

/* Read a case file (depth TAB answer TAB prompt per line; empty lines are
   skipped).  Returns 1, or 0 with "FILE:LINE: what is wrong" in err and s
   unchanged. */
static inline int needle_read(needle_set *s, const char *path, const llm_tokenizer *t, int seq_len, char *err,
                              size_t errn) {
  FILE *f = fopen(path, "rb");
  needle_set got;
  char *line = NULL, msg[256];
  size_t cap = 0;
  long lineno = 0;
  int ok = 1;
  memset(&got, 0, sizeof got);
  if (!f) {
    needle__err(err, errn, "%s: cannot open the needle file", path);
    return 0;
  }
  for (;;) {
    size_t len = 0;
    int ch;
    char *t1, *t2, *end;
    double depth;
    /* one line of any length */
    while ((ch = fgetc(f)) != EOF && ch != '\n') {
      if (len + 2 > cap) {
        size_t nc = cap ? 2 * cap : 4096;
        char *nl = (char *)realloc(line, nc);
        if (!nl) {
          needle__err(err, errn, "%s: out of memory", path);
          ok = 0;
          break;
        }
        line = nl, cap = nc;
      }
      line[len++] = (char)ch;
    }
    if (!ok || (ch == EOF && len == 0)) break;
    lineno++;
    line[len] = 0;
    if (len && line[len - 1] == '\r') line[--len] = 0;
    if (len == 0) continue;
    if (strlen(line) != len) {
      needle__err(err, errn, "%s:%ld: the line holds a NUL byte", path, lineno);
      ok = 0;
      break;
    }
    t1 = strchr(line, '\t');
    t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
    if (!t2) {
      needle__err(err, errn, "%s:%ld: want three tab-separated columns: depth, answer, prompt", path, lineno);
      ok = 0;
      break;
    }
    *t1 = 0;
    depth = strtod(line, &end);
    if (end == line || *end) {
      needle__err(err, errn, "%s:%ld: the depth \"%s\" is not a number", path, lineno, line);
      ok = 0;
      break;
    }
    if (!needle__add(&got, t, seq_len, depth, t1 + 1, (size_t)(t2 - t1 - 1), t2 + 1, msg, sizeof msg)) {
      needle__err(err, errn, "%s:%ld: %s", path, lineno, msg);
      ok = 0;
      break;
    }
  }
  fclose(f);
  free(line);
  if (ok && got.n == 0) {
    needle__err(err, errn, "%s: no cases (want lines of depth TAB answer TAB prompt)", path);
    ok = 0;
  }
  if (!ok) {
    needle_set_free(&got);
    return 0;
  }
  needle_set_free(s);
  *s = got;
  return 1;
}

/* ---- generating cases from a text, for any tokenizer */

/* The sentences are the retrieval model's (bench/retrieval/train.py), so a
   model trained on them is asked what it learned; names for multi-key. */
static const char *const needle__names[8] = {"Abraham", "Rachel", "Samuel", "Esther",
                                             "Gideon", "Miriam", "Jonathan", "Deborah"};

static inline uint64_t needle__mix(uint64_t *state) { /* splitmix64 */
  uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/* Sentences of text: runs ending in . ! ? (or the end), white space folded
   to single spaces, at least 20 characters.  *starts gets offsets into a
   copy; returns the count (0 on failure). */
static inline int needle__sentences(const char *text, char **copy, int **starts) {
  size_t n = strlen(text), i, o = 0;
  int count = 0, cap = 256, begin = 0;
  char *c = (char *)malloc(n + 1);
  int *st = (int *)malloc((size_t)cap * sizeof(int));
  if (!c || !st) {
    free(c), free(st);
    return 0;
  }
  for (i = 0; i <= n; i++) {
    char ch = i < n ? text[i] : '.';
    if (isspace((unsigned char)ch)) {
      if (o > (size_t)begin && c[o - 1] != ' ') c[o++] = ' ';
      continue;
    }
    if (i < n) c[o++] = ch;
    if (ch == '.' || ch == '!' || ch == '?' || i == n) {
      while (o > (size_t)begin && c[o - 1] == ' ') o--;
      if (o - (size_t)begin >= 20) {
        if (count == cap) {
          int *ns = (int *)realloc(st, (size_t)(cap *= 2) * sizeof(int));
          if (!ns) {
            free(c), free(st);
            return 0;
          }
          st = ns;
        }
        c[o++] = 0;
        st[count++] = begin;
        begin = (int)o;
      } else {
        o = (size_t)begin;
      }
    }
  }
  *copy = c;
  *starts = st;
  return count;
}

/* Add n_per cases per depth of one kind, each a prompt of about `context`
   tokens (BOS, prose from text at a random sentence, the needle sentences
   at their depths, the question), with random 5-digit keys from seed.
   Single: one pass key (the passkey test's sentences); multi: 4 named keys,
   the first at the depth, the others at random depths, the first asked.
   Returns 1, or 0 with a message and s unchanged beyond the cases added. */
static inline int needle_generate(needle_set *s, const llm_tokenizer *t, int seq_len, const char *text,
                                  needle_kind kind, int context, const double *depths, int n_depths, int n_per,
                                  uint64_t seed, char *err, size_t errn) {
  char *copy = NULL, *prompt = NULL;
  int *starts = NULL, n_sent, d, r, ok = 1;
  size_t cap;
  int32_t *tok = NULL;
  uint64_t state = seed;
  if (err && errn) err[0] = 0;
  if (context < NEEDLE_MIN_CONTEXT || context > seq_len || n_depths < 1 || n_per < 1) {
    needle__err(err, errn, "a context of %d tokens: want %d..%d (the model's seq_len), and cases to make", context,
                NEEDLE_MIN_CONTEXT, seq_len);
    return 0;
  }
  n_sent = needle__sentences(text, &copy, &starts);
  if (n_sent < 8) {
    needle__err(err, errn, "the text has %d sentences of 20 characters or more: give a longer text", n_sent);
    free(copy), free(starts);
    return 0;
  }
  cap = strlen(text) + 4096;
  prompt = (char *)malloc(cap);
  tok = (int32_t *)malloc((cap + 3) * sizeof(int32_t));
  for (d = 0; ok && prompt && tok && d < n_depths; d++)
    for (r = 0; ok && r < n_per; r++) {
      char keys[4][8], needle[4][160], question[160];
      double where[4];
      int n_needles = kind == NEEDLE_MULTI ? 4 : 1, first = (int)(needle__mix(&state) % (uint64_t)n_sent);
      int n_fill = 0, k, j, n_tok = 0, lo, hi;
      for (k = 0; k < n_needles; k++) { /* multi: four different names, the first asked */
        snprintf(keys[k], sizeof keys[k], "%05u", (unsigned)(needle__mix(&state) % 100000u));
        where[k] = k == 0 ? depths[d] : (double)(needle__mix(&state) % 1000u) / 1000.0;
        if (kind == NEEDLE_MULTI)
          snprintf(needle[k], sizeof needle[k], "The pass key of %s is %s.", needle__names[(r + 2 * k + d) % 8],
                   keys[k]);
        else
          snprintf(needle[k], sizeof needle[k], "The pass key is %s. Remember it. %s is the pass key.", keys[k],
                   keys[k]);
      }
      if (kind == NEEDLE_MULTI)
        snprintf(question, sizeof question, "What is the pass key of %s? The pass key of %s is",
                 needle__names[(r + d) % 8], needle__names[(r + d) % 8]);
      else
        snprintf(question, sizeof question, "What is the pass key? The pass key is");
      /* the most filler sentences that fit: bisection on the encoded length, from at most the
         sentences of 10 characters a token */
      {
        size_t chars = 0;
        for (hi = 0; hi < n_sent - 1 && chars < (size_t)context * 10; hi++)
          chars += strlen(copy + starts[(first + hi) % n_sent]) + 1;
      }
      lo = 0;
      while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        size_t o = 0;
        for (j = 0; j < mid; j++) {
          const char *sent = copy + starts[(first + j) % n_sent];
          size_t l = strlen(sent);
          memcpy(prompt + o, sent, l), o += l, prompt[o++] = ' ';
        }
        prompt[o] = 0;
        if (llm_encode(t, prompt, 1, 0, tok, &n_tok) != 0) {
          ok = 0;
          break;
        }
        /* room for the needles, the question, the answer and slack: about 30 tokens each */
        if (n_tok + 30 * (n_needles + 1) + 8 <= context) lo = mid;
        else hi = mid - 1;
      }
      n_fill = lo;
      { /* assemble: filler, needles at their depths (between sentences), the question; then trim */
        for (;;) {
          size_t o = 0;
          for (j = 0; j <= n_fill; j++) {
            for (k = 0; k < n_needles; k++)
              if ((int)floor(where[k] * n_fill + 0.5) == j) {
                size_t l = strlen(needle[k]);
                if (o) prompt[o++] = ' ';
                memcpy(prompt + o, needle[k], l), o += l;
              }
            if (j < n_fill) {
              const char *sent = copy + starts[(first + j) % n_sent];
              size_t l = strlen(sent);
              if (o) prompt[o++] = ' ';
              memcpy(prompt + o, sent, l), o += l;
            }
          }
          prompt[o++] = ' ';
          memcpy(prompt + o, question, strlen(question) + 1);
          if (llm_encode(t, prompt, 1, 0, tok, &n_tok) != 0) {
            ok = 0;
            break;
          }
          if (n_tok + 5 + NEEDLE_GEN_EXTRA <= context || n_fill == 0) break;
          n_fill--; /* too long: one filler sentence fewer */
        }
      }
      if (ok && !needle__add(s, t, seq_len, depths[d], keys[0], 5, prompt, err, errn)) ok = 0;
    }
  if (!prompt || !tok) {
    needle__err(err, errn, "out of memory");
    ok = 0;
  } else if (!ok && err && !err[0]) {
    needle__err(err, errn, "out of memory encoding a prompt");
  }
  free(copy), free(starts), free(prompt), free(tok);
  return ok;
}

/* ---- running a case */

/* BOS + the prompt into a new sequence of c (one prefill, or token by token
   when ev sets an eviction policy, so that it acts at every step), then
   answer length + NEEDLE_GEN_EXTRA greedy tokens.  *ok: the decoded text,
   past its leading white space, starts with a run of digits equal to the
   answer.  got (optional) receives the decoded text. */
static inline kva_status needle_run(const llm_model *m, llm_state *s, const llm_tokenizer *t, kva_cache *c,
                                    const kva_evict *ev, const needle_case *k, int *ok, char *got, size_t gotn) {
  const int V = m->c.vocab_size, evict = ev && ev->kind != KVA_EVICT_NONE;
  const int n_gen = (int)strlen(k->answer) + NEEDLE_GEN_EXTRA;
  char text[256];
  size_t tl = 0, nd = 0, na = strlen(k->answer);
  int seq, i, prev = k->tok[k->n - 1];
  kva_status st;
  const char *p;
  *ok = 0;
  text[0] = 0;
  if ((st = kva_seq_new(c, &seq)) != KVA_OK) return st;
  if (evict) st = kva_seq_set_evict(c, seq, ev);
  if (st == KVA_OK) {
    if (evict && s->compress_budget > 0) { /* prefill, then compress the prompt once (SnapKV) */
      st = llm_forward(m, s, c, seq, k->tok, k->n, s->logits, 0);
      if (st == KVA_OK) st = kva_seq_compress(c, seq, s->compress_budget);
      if (st == KVA_OK) s->compressed_len = kva_seq_len(c, seq);
    } else if (evict)
      for (i = 0; i < k->n && st == KVA_OK; i++)
        st = llm_forward(m, s, c, seq, k->tok + i, 1, i == k->n - 1 ? s->logits : NULL, 0);
    else
      st = llm_forward(m, s, c, seq, k->tok, k->n, s->logits, 0);
  }
  for (i = 0; i < n_gen && st == KVA_OK; i++) {
    int32_t tk = llm_argmax(s->logits, V);
    const char *piece = llm_decode(t, prev, tk);
    size_t pl = strlen(piece);
    if (tl + pl < sizeof text) {
      memcpy(text + tl, piece, pl + 1);
      tl += pl;
    }
    prev = tk;
    if (i + 1 < n_gen) st = llm_forward(m, s, c, seq, &tk, 1, s->logits, 0);
  }
  kva_seq_free(c, seq);
  if (st != KVA_OK) return st;
  for (p = text; *p && isspace((unsigned char)*p); p++) {}
  while (isdigit((unsigned char)p[nd])) nd++;
  *ok = nd == na && !strncmp(p, k->answer, na);
  if (got && gotn) snprintf(got, gotn, "%s", text);
  return KVA_OK;
}

#endif /* NEEDLE_H */
