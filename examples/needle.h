/* needle.h - needle-in-a-haystack retrieval cases for a llama2.c model run
   through kvattn (examples/llm.h): read them from a file, build them from a
   text with the model's own tokenizer, run one and score it.

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

/* ---- building cases from a text with the model's tokenizer */

/* splitmix64: a fixed seed gives the same cases on every machine */
static inline uint64_t needle__rand(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline int needle__below(uint64_t *state, int n) { return (int)(needle__rand(state) % (uint64_t)n); }

/* the names of the multi-key needles (keys a small vocabulary can spell) */
static const char *const needle_names[] = {"Abraham", "Isaac",   "Jacob",  "Joseph", "Moses",   "Aaron",  "Joshua",
                                           "Samuel",  "David",   "Solomon", "Elijah", "Daniel",  "Ruth",   "Esther",
                                           "Sarah",   "Rachel",  "Miriam", "Gideon", "Jonathan", "Nathan", "Noah",
                                           "Caleb",   "Hannah",  "Peter"};

/* The sentences of a text: each a run ending in . ; : ? or ! (at most 600
   bytes), with white space folded to single spaces and a leading space, as
   filler.  Returns the count; *out holds them (free each, then the array). */
static inline int needle__sentences(const char *text, char ***out) {
  int n = 0, cap = 0;
  char **v = NULL;
  const char *p = text;
  while (*p) {
    char buf[640];
    size_t k = 1;
    int done = 0;
    buf[0] = ' ';
    while (*p && isspace((unsigned char)*p)) p++;
    while (*p && k < 600) {
      char c = *p++;
      if (isspace((unsigned char)c)) {
        if (buf[k - 1] != ' ') buf[k++] = ' ';
        continue;
      }
      buf[k++] = c;
      if (c == '.' || c == ';' || c == ':' || c == '?' || c == '!') {
        done = 1;
        break;
      }
    }
    while (k > 1 && buf[k - 1] == ' ') k--;
    buf[k] = 0;
    /* a sentence of a few words; a cut-off run (no end mark within 600
       bytes) or a fragment is dropped */
    if (done && k >= 12 && !strchr(buf, '\t')) {
      if (n == cap) {
        int nc = cap ? 2 * cap : 256;
        char **nv = (char **)realloc(v, (size_t)nc * sizeof *nv);
        if (!nv) break;
        v = nv, cap = nc;
      }
      if (!(v[n] = (char *)malloc(k + 1))) break;
      memcpy(v[n], buf, k + 1);
      n++;
    }
  }
  *out = v;
  return n;
}

/* the bytes of sentences [from, to) of the filler starting at sentence start */
static inline size_t needle__fill_bytes(char **sent, int n_sent, int start, int from, int to) {
  size_t b = 0;
  int i;
  for (i = from; i < to; i++) b += strlen(sent[(start + i) % n_sent]);
  return b;
}

static inline void needle__put(char *text, size_t *len, const char *s) {
  size_t l = strlen(s);
  memcpy(text + *len, s, l + 1);
  *len += l;
}

/* One prompt of at most max_tokens tokens (BOS included): consecutive
   sentences from a random start, each needle before the first sentence that
   would put it past its depth (a fraction of the filler's bytes), then the
   question; the filler shrinks a sentence at a time until the whole prompt
   fits.  Returns a malloc'd string (without the leading space the encoder
   adds back), or NULL: out of memory, or no filler fits. */
static inline char *needle__prompt(const llm_tokenizer *t, char **sent, int n_sent, uint64_t *rng, int max_tokens,
                                   const char *const *needle, const double *depth, int n_needle, const char *question) {
  int start = needle__below(rng, n_sent), n_fill = 0, order[8], i, j, ntok = 0;
  size_t fixed = strlen(question) + 1;
  char *text = NULL;
  int32_t *tok = NULL;
  if (n_needle > 8) return NULL;
  /* needles by depth (ties keep their order) */
  for (i = 0; i < n_needle; i++) {
    for (j = i; j > 0 && depth[order[j - 1]] > depth[i]; j--) order[j] = order[j - 1];
    order[j] = i;
    fixed += strlen(needle[i]);
  }
  /* the filler grows while an estimate (4 bytes a token) fits, then is checked exactly */
  while (n_fill < n_sent && fixed + needle__fill_bytes(sent, n_sent, start, 0, n_fill + 1) < (size_t)max_tokens * 4)
    n_fill++;
  for (;;) {
    size_t fill = needle__fill_bytes(sent, n_sent, start, 0, n_fill), len = 0;
    int at = 0;
    free(text);
    free(tok);
    text = (char *)malloc(fill + fixed + 1);
    tok = (int32_t *)malloc((fill + fixed + 3) * sizeof(int32_t));
    if (!text || !tok) break;
    text[0] = 0;
    for (j = 0; j < n_needle; j++) {
      const double goal = depth[order[j]] * (double)fill;
      while (at < n_fill && (double)needle__fill_bytes(sent, n_sent, start, 0, at + 1) <= goal)
        needle__put(text, &len, sent[(start + at++) % n_sent]);
      needle__put(text, &len, needle[order[j]]);
    }
    while (at < n_fill) needle__put(text, &len, sent[(start + at++) % n_sent]);
    needle__put(text, &len, question);
    if (llm_encode(t, text + 1, 1, 0, tok, &ntok) != 0) break;
    if (ntok <= max_tokens) {
      free(tok);
      memmove(text, text + 1, len);
      return text;
    }
    if (n_fill == 0) break;
    n_fill--;
  }
  free(text);
  free(tok);
  return NULL;
}

/* Build cases from the prose of `text` with the model's tokenizer: for each
   context length and depth, per_cell prompts of about length - 8 tokens.
   NEEDLE_SINGLE: one pass key ("The pass key is N. Remember it. N is the
   pass key."), asked as "What is the pass key? The pass key is";
   NEEDLE_MULTI: four named keys ("The pass key of NAME is N."), the first
   at the depth and the others anywhere, one asked for.  Answers are five
   random digits.  Returns 1, or 0 with a message and s unchanged. */
static inline int needle_generate(needle_set *s, const llm_tokenizer *t, int seq_len, const char *text,
                                  needle_kind kind, const int *lengths, int n_lengths, const double *depths,
                                  int n_depths, int per_cell, uint64_t seed, char *err, size_t errn) {
  char **sent = NULL;
  int n_sent = needle__sentences(text, &sent), li, di, r, i, ok = 1;
  uint64_t rng = seed;
  needle_set got;
  memset(&got, 0, sizeof got);
  if (n_sent < 8) {
    needle__err(err, errn, "the filler text has %d sentences; give a text of at least a few pages of prose", n_sent);
    ok = 0;
  }
  for (li = 0; ok && li < n_lengths; li++)
    for (di = 0; ok && di < n_depths; di++)
      for (r = 0; ok && r < per_cell; r++) {
        char keys[4][8], nd[4][96], question[160], *prompt;
        const char *nd_p[4];
        double dep[4];
        int n_needle = kind == NEEDLE_SINGLE ? 1 : 4, name[4], k, m;
        for (k = 0; k < 4; k++) {
          for (m = 0; m < 5; m++) keys[k][m] = (char)('0' + needle__below(&rng, 10));
          keys[k][5] = 0;
          do { /* four different names */
            name[k] = needle__below(&rng, (int)(sizeof needle_names / sizeof *needle_names));
            for (m = 0; m < k && name[m] != name[k]; m++) {}
          } while (m < k);
          dep[k] = k == 0 ? depths[di] : (double)needle__below(&rng, 1001) / 1000.0;
        }
        if (kind == NEEDLE_SINGLE) {
          snprintf(nd[0], sizeof nd[0], " The pass key is %s. Remember it. %s is the pass key.", keys[0], keys[0]);
          snprintf(question, sizeof question, " What is the pass key? The pass key is");
        } else {
          for (k = 0; k < 4; k++)
            snprintf(nd[k], sizeof nd[k], " The pass key of %s is %s.", needle_names[name[k]], keys[k]);
          snprintf(question, sizeof question, " What is the pass key of %s? The pass key of %s is",
                   needle_names[name[0]], needle_names[name[0]]);
        }
        for (k = 0; k < 4; k++) nd_p[k] = nd[k];
        if (lengths[li] > seq_len) {
          needle__err(err, errn, "context length %d is longer than the model's %d", lengths[li], seq_len);
          ok = 0;
          break;
        }
        prompt = needle__prompt(t, sent, n_sent, &rng, lengths[li] - 8, nd_p, dep, n_needle, question);
        if (!prompt) {
          needle__err(err, errn, "out of memory, or a needle and question alone exceed %d tokens", lengths[li] - 8);
          ok = 0;
          break;
        }
        ok = needle__add(&got, t, seq_len, depths[di], keys[0], 5, prompt, err, errn);
        if (ok) got.cases[got.n - 1].context = lengths[li];
        free(prompt);
      }
  for (i = 0; i < n_sent; i++) free(sent[i]);
  free(sent);
  if (!ok) {
    needle_set_free(&got);
    return 0;
  }
  needle_set_free(s);
  *s = got;
  return 1;
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
    if (evict)
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
