/* tests/consumer/check.h - what the consumer programs (main.c, main.cpp)
   check through an installed or added kvattn: the header is the one the
   build system promised (version), OpenMP is on or off as asked, and a small
   paged cache stores, reads back and attends correctly (against a
   softmax written out here).  C99 and C++ alike. */
#include <kvattn.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#define CK_STR2(x) #x
#define CK_STR(x) CK_STR2(x)

static int ck_failures = 0;
#define CK(cond, what)                                           \
  do {                                                           \
    if (!(cond)) {                                               \
      fprintf(stderr, "consumer: FAILED: %s (%s)\n", what, #cond); \
      ck_failures++;                                             \
    }                                                            \
  } while (0)

static int consumer_check(const char *lang) {
  enum { G = 2, H = 4, D = 8, N = 6 };
  float k[N][G][D], v[N][G][D], q[H][D], out[H][D], out2[H][D], ref[H][D], rk[G][D], rv[G][D];
  int32_t pos[G] = {-1, -1};
  kva_cache_desc cd;
  kva_attn a;
  kva_cache *c = NULL;
  int seq = -1, t, g, h, d;

#ifdef KVATTN_PKG_VERSION
  CK(strcmp(KVATTN_PKG_VERSION, KVATTN_VERSION_STRING) == 0,
     "the build system's kvattn version is the header's KVATTN_VERSION_STRING");
#endif
  CK(strcmp(CK_STR(KVATTN_VERSION_MAJOR) "." CK_STR(KVATTN_VERSION_MINOR) "." CK_STR(KVATTN_VERSION_PATCH),
            KVATTN_VERSION_STRING) == 0,
     "KVATTN_VERSION_STRING is MAJOR.MINOR.PATCH");
#if defined(KVATTN_EXPECT_OPENMP) && KVATTN_EXPECT_OPENMP && !defined(_OPENMP)
  CK(0, "kvattn::kvattn was to bring OpenMP, but _OPENMP is not defined");
#elif defined(KVATTN_EXPECT_OPENMP) && !KVATTN_EXPECT_OPENMP && defined(_OPENMP)
  CK(0, "OpenMP was not asked for, but _OPENMP is defined");
#endif

  for (t = 0; t < N; t++)
    for (g = 0; g < G; g++)
      for (d = 0; d < D; d++) {
        k[t][g][d] = 0.25f * (float)((t * 7 + g * 3 + d * 5) % 11) - 1.25f;
        v[t][g][d] = 0.5f * (float)((t * 5 + g + d * 3) % 13) - 3.0f;
      }
  for (h = 0; h < H; h++)
    for (d = 0; d < D; d++) q[h][d] = 0.2f * (float)((h * 5 + d * 7) % 9) - 0.8f;

  memset(&cd, 0, sizeof cd);
  cd.n_layers = 1; cd.n_kv_heads = G; cd.head_dim = D;
  cd.block_size = 4; cd.n_blocks = 8; cd.dtype = KVA_F32;   /* F32: reads back exactly */
  memset(&a, 0, sizeof a);
  a.n_heads = H; a.n_kv_heads = G; a.head_dim = D; a.n_threads = 2;

  CK(kva_cache_create(&cd, &c) == KVA_OK && c != NULL, "kva_cache_create");
  if (!c) return 1;
  CK(kva_seq_new(c, &seq) == KVA_OK, "kva_seq_new");
  CK(kva_seq_append(c, seq, N) == KVA_OK, "kva_seq_append");
  CK(kva_seq_len(c, seq) == N, "kva_seq_len after appending N tokens");
  CK(kva_store(c, seq, 0, &k[0][0][0], &v[0][0][0], N) == KVA_OK, "kva_store");
  CK(kva_seq_read(c, seq, 0, 5, &rk[0][0], &rv[0][0], pos) == KVA_OK, "kva_seq_read");
  CK(pos[0] == 5 && pos[1] == 5 && memcmp(rk, k[5], sizeof rk) == 0 && memcmp(rv, v[5], sizeof rv) == 0,
     "slot 5 reads back what was stored (F32 cache)");

  /* the newest token's query over all N keys, from the cache and from plain arrays */
  CK(kva_attend_cache(c, seq, 0, &a, &q[0][0], 1, &out[0][0]) == KVA_OK, "kva_attend_cache");
  CK(kva_attend(&a, &q[0][0], 1, NULL, &k[0][0][0], &v[0][0][0], N, NULL, &out2[0][0], NULL) == KVA_OK,
     "kva_attend");
  for (h = 0; h < H; h++) {   /* softmax(q.k / sqrt(D)) v over kv head h / (H / G) */
    double s[N], m = -1e30, l = 0.0;
    g = h / (H / G);
    for (t = 0; t < N; t++) {
      s[t] = 0.0;
      for (d = 0; d < D; d++) s[t] += (double)q[h][d] * (double)k[t][g][d];
      s[t] /= sqrt((double)D);
      if (s[t] > m) m = s[t];
    }
    for (t = 0; t < N; t++) l += (s[t] = exp(s[t] - m));
    for (d = 0; d < D; d++) {
      double o = 0.0;
      for (t = 0; t < N; t++) o += s[t] / l * (double)v[t][g][d];
      ref[h][d] = (float)o;
    }
  }
  {
    float e1 = 0.0f, e2 = 0.0f;
    for (h = 0; h < H; h++)
      for (d = 0; d < D; d++) {
        e1 = fmaxf(e1, fabsf(out[h][d] - ref[h][d]));
        e2 = fmaxf(e2, fabsf(out2[h][d] - ref[h][d]));
      }
    CK(e1 < 1e-4f, "kva_attend_cache matches the written-out softmax");
    CK(e2 < 1e-4f, "kva_attend matches the written-out softmax");
    kva_cache_destroy(c);
    if (ck_failures) return 1;
    printf("consumer (%s): kvattn %s, %s kernels, OpenMP %s; max |error| %.2g (cache), %.2g (arrays): ok\n",
           lang, KVATTN_VERSION_STRING, kva_simd_name(),
#ifdef _OPENMP
           "on",
#else
           "off",
#endif
           (double)e1, (double)e2);
  }
  return 0;
}
