/* test_iscores.c - integer scores (kva_attn.int_scores) over INT8 and INT4 keys.
 *
 * The semantics come from docs/API.md ("Integer scores"), rebuilt in ref.h
 * (ref_query_codes): each query row (token, head) becomes int8 codes with one
 * symmetric absmax scale; a score is then the dot product of those codes,
 * times that scale, with the key rows as stored (read back).
 *   - the quantizer (white box: kva__quantize_query) gives ref_query_codes'
 *     codes and scale bit for bit, in both code orders, with the group sums;
 *     ties, zero rows, NaN / Inf rows, subnormal and huge rows;
 *   - the tile kernel of the build (AVX2 / AVX-512 VNNI / NEON / scalar)
 *     against the scalar twin (INT8: bit for bit; INT4: float tolerance) and
 *     both against fp64 of the stated function, over widths 1..576 (whole
 *     groups and rests), 1..4 rows, 1..64 keys in exact-size allocations;
 *   - attention through the cache (prefill and decode, split-K at long
 *     lengths, windows, latent caches) and batch plans equals the fp64
 *     reference fed the read-back rows and the quantized queries;
 *   - the difference from float scores stays within the documented bound
 *     (seen through the log-sum-exp), F16 keys ignore the option bit for
 *     bit, and a bad value is KVA_ERR_ARG. */
#include "kvattn.h"
#include "harness.h"
#include "ref.h"

static void is_quantizer(kt_rng *r) {
  static const int widths[] = {1, 5, 31, 32, 33, 64, 100, 128, 576};
  int wi, kind, order;
  kt_begin("iscores: the query quantizer gives the reference codes, scale and group sums");
  for (wi = 0; wi < (int)(sizeof widths / sizeof widths[0]); wi++)
    for (kind = 0; kind < 8; kind++)
      for (order = 0; order < 2; order++) {
        int d = widths[wi], i, groups = (d + 31) / 32, ok, bad = 0;
        float *q = KT_ALLOC(float, d), scale = 0.0f;
        int *codes = KT_ALLOC(int, d);
        int32_t *mem = KT_ALLOC(int32_t, kva__qrow_bytes(d) / 4 + 1), full = 0;
        kva__qrow qr;
        kva_dtype kt = order ? KVA_INT4 : KVA_INT8;
        for (i = 0; i < d; i++) {
          switch (kind) {
            case 0: q[i] = kt_uniform(r, -2.0f, 2.0f); break;
            case 1: q[i] = (float)(kt_int(r, -127, 126)) + 0.5f; break; /* ties once amax is 127 */
            case 2: q[i] = 0.0f; break;
            case 3: q[i] = kt_uniform(r, -1.0f, 1.0f) * 1e-40f; break; /* subnormal */
            case 4: q[i] = kt_uniform(r, -1.0f, 1.0f) * 3e38f; break;
            case 5: q[i] = i == d / 2 ? NAN : kt_uniform(r, -1.0f, 1.0f); break;
            case 6: q[i] = i == d - 1 ? -INFINITY : kt_uniform(r, -1.0f, 1.0f); break;
            default: q[i] = kt_int(r, 0, 3) ? 0.0f : kt_uniform(r, -5.0f, 5.0f); break;
          }
        }
        if (kind == 1) q[0] = 127.0f;
        ok = ref_query_codes(q, d, codes, &scale);
        kva__quantize_query(q, d, kt, mem, &qr);
        if (!ok) {
          KT_CHECK(isnan(qr.scale), "d=%d kind %d: a row with NaN / Inf has scale %g, not NaN", d, kind, qr.scale);
        } else {
          KT_CHECK(kt_same_bits(&qr.scale, &scale, 1), "d=%d kind %d: scale %.9g, want %.9g", d, kind, qr.scale, scale);
          char *written = KT_ALLOC(char, groups * 32);
          memset(written, 0, (size_t)groups * 32);
          for (i = 0; i < d; i++) {
            int e = i % 32, at = i - e + (order ? (e & 1) * 16 + e / 2 : e);
            bad += qr.codes[at] != codes[i];
            written[at] = 1;
          }
          for (i = 0; i < groups * 32; i++) bad += !written[i] && qr.codes[i] != 0; /* zero past the row */
          free(written);
          for (i = 0; i < groups; i++) {
            int32_t s = 0;
            int e;
            for (e = i * 32; e < d && e < i * 32 + 32; e++) s += codes[e];
            bad += qr.gsum[i] != s;
            if (i < d / 32) full += s;
          }
          bad += qr.full_sum != full;
          KT_CHECK(bad == 0, "d=%d kind %d order %d: %d codes / sums differ from the reference", d, kind, order, bad);
        }
        free(q), free(codes), free(mem);
      }
}

/* fp64 of the stated score: qscale * sum(code_i * k_i), k read back by the library's scalar loader */
static double is_want(const kva__qrow *q, const int *codes, const void *krow, kva_dtype t, int d, double *mag) {
  double s = 0.0, m = 0.0, ks = t == KVA_INT8 ? (double)kva__row_scale(KVA_INT8, krow, 1.0f) : 1.0;
  int i;
  for (i = 0; i < d; i++) {
    double k = (double)kva__load1(t, krow, i) * ks;
    s += (double)codes[i] * k;
    m += fabs((double)codes[i] * k);
  }
  *mag = m * fabs((double)q->scale);
  return s * (double)q->scale;
}

static void is_kernels(kt_rng *r) {
  static const int widths[] = {1, 7, 16, 31, 32, 33, 44, 64, 65, 100, 128, 576};
  int it, iters = kt_iters(400);
  kt_begin("iscores: the build's tile kernel against the scalar twin and fp64 (INT8 bit for bit)");
  for (it = 0; it < iters; it++) {
    kva_dtype t = it % 2 ? KVA_INT4 : KVA_INT8;
    int d = widths[kt_int(r, 0, (int)(sizeof widths / sizeof widths[0]) - 1)], nr = kt_int(r, 1, 4);
    int nk = kt_int(r, 0, 3) ? kt_int(r, 1, 64) : kt_int(r, 1, 3), lds = kt_int(r, 0, 1) ? nk : 64, j, i, rr;
    size_t rb = kva__row_bytes(t, d), qb = kva__qrow_bytes(d);
    unsigned char *rows[64];
    const void *krows[64];
    float *qf = KT_ALLOC(float, 4 * d), got[4 * 64], twin[4 * 64], scale;
    int32_t *mem = KT_ALLOC(int32_t, 4 * qb / 4 + 4);
    int *codes = KT_ALLOC(int, 4 * d), bad_twin = 0, bad_ref = 0;
    kva__qrow q[4];
    double worst = 0.0;
    for (j = 0; j < nk; j++) { /* a stored row of its exact size: INT8's scale, then the codes */
      float *x = KT_ALLOC(float, d);
      kt_fill(r, x, d, -3.0f, 3.0f);
      if (kt_int(r, 0, 7) == 0) x[kt_int(r, 0, d - 1)] = 40.0f; /* an outlier */
      rows[j] = KT_ALLOC(unsigned char, rb);
      kva__store_row(t, rows[j], x, d, 1.0f);
      krows[j] = rows[j] + kva__code_offset(t);
      free(x);
    }
    for (rr = 0; rr < 4; rr++) {
      kt_fill(r, qf + rr * d, d, -1.5f, 1.5f);
      kva__quantize_query(qf + rr * d, d, t, (char *)mem + rr * qb, &q[rr]);
      ref_query_codes(qf + rr * d, d, codes + rr * d, &scale);
    }
    for (i = 0; i < 4 * 64; i++) got[i] = twin[i] = KT_SENTINEL;
    kva__idot_tile(t, q, nr, krows, nk, d, got, lds, NULL);
    kva__idot_tile_scalar(t, q, nr, krows, nk, d, twin, lds, NULL);
    for (i = 0; i < 4 * 64; i++) /* what no score is written to keeps its sentinel */
      if (!(i < nr * lds && i % lds < nk)) bad_twin += got[i] != KT_SENTINEL;
    for (rr = 0; rr < nr; rr++)
      for (j = 0; j < nk; j++) {
        float g = got[rr * lds + j];
        {
          double mag, want = is_want(&q[rr], codes + rr * d, krows[j], t, d, &mag), e = fabs((double)g - want);
          double tol = (t == KVA_INT8 ? 1e-6 : 1e-5) * mag + 1e-30;
          if (t == KVA_INT8) bad_twin += !kt_same_bits(&g, &twin[rr * lds + j], 1);
          else bad_twin += fabs((double)g - (double)twin[rr * lds + j]) > 2 * tol;
          bad_ref += !(e <= tol);
          if (mag > 0 && e / mag > worst) worst = e / mag;
        }
      }
    KT_CHECK(bad_twin == 0, "it %d %s d=%d nr=%d nk=%d lds=%d: %d scores differ from the scalar twin", it,
             t == KVA_INT8 ? "int8" : "int4", d, nr, nk, lds, bad_twin);
    KT_CHECK(bad_ref == 0, "it %d %s d=%d nr=%d nk=%d: %d scores off the fp64 value (worst %.3g of the magnitude)", it,
             t == KVA_INT8 ? "int8" : "int4", d, nr, nk, bad_ref, worst);
    for (j = 0; j < nk; j++) free(rows[j]);
    free(qf), free(mem), free(codes);
  }
}

/* attention over INT8 / INT4 keys with integer scores against fp64 fed the read-back rows and query codes */
static void is_attention(kt_rng *r) {
  static const int dims[] = {1, 8, 31, 32, 40, 64, 96, 128};
  static const kva_dtype vtypes[3] = {KVA_F16, KVA_INT8, KVA_INT4};
  int it, iters = kt_iters(60);
  kt_begin("iscores: attention (cache, batch, split-K, windows, latent) against fp64 with the query codes");
  for (it = 0; it < iters; it++) {
    int latent = it % 6 == 5, G = latent ? 1 : kt_int(r, 1, 3), H = G * kt_int(r, 1, 4);
    int D = dims[kt_int(r, 0, 7)], DV = latent ? kt_int(r, 1, D) : dims[kt_int(r, 0, 7)];
    int n = it % 10 == 3 ? kt_int(r, 2100, 2600) : kt_int(r, 1, 90), n_q = kt_int(r, 1, n < 4 ? n : 4);
    int bs = kt_int(r, 1, 17), seq = -1, t, two = n_q == 1 && !latent && it % 3 == 0;
    kva_cache_desc d;
    kva_cache *c = NULL;
    kva_attn a;
    kva_batch *plan = NULL;
    float *k, *v, *q, *out, *outb, *kr, *vr;
    double *kd, *vd, *qd, *od, tol, e, eb;
    ref_attn_cfg cfg;
    memset(&d, 0, sizeof d);
    d.kind = latent ? KVA_CACHE_LATENT : KVA_CACHE_KV;
    d.n_layers = 1, d.n_kv_heads = G, d.head_dim = D, d.v_dim = DV, d.block_size = bs;
    d.n_blocks = (n + bs) / bs * 2 + 4, d.max_seqs = 4;
    d.dtype = it % 2 ? KVA_INT4 : KVA_INT8;
    if (!latent) d.v_dtype = vtypes[kt_int(r, 0, 2)];
    if (kva_cache_create(&d, &c) != KVA_OK) {
      KT_CHECK(0, "create (it %d)", it);
      continue;
    }
    k = KT_ALLOC(float, (size_t)n * G * D), v = KT_ALLOC(float, (size_t)n * G * DV);
    kr = KT_ALLOC(float, (size_t)n * G * D), vr = KT_ALLOC(float, (size_t)n * G * DV);
    q = KT_ALLOC(float, (size_t)n_q * H * D);
    out = KT_ALLOC(float, (size_t)n_q * H * DV), outb = KT_ALLOC(float, (size_t)n_q * H * DV);
    od = KT_ALLOC(double, (size_t)n_q * H * DV), qd = KT_ALLOC(double, (size_t)n_q * H * D);
    kt_fill(r, k, (size_t)n * G * D, -2.0f, 2.0f);
    kt_fill(r, v, (size_t)n * G * DV, -1.0f, 1.0f);
    kt_fill(r, q, (size_t)n_q * H * D, -1.0f, 1.0f);
    kva_seq_new(c, &seq);
    KT_STATUS(kva_seq_append(c, seq, n), KVA_OK);
    KT_STATUS(kva_store(c, seq, 0, k, latent ? NULL : v, n), KVA_OK);
    for (t = 0; t < n; t++) {
      float *kt = kr + (size_t)t * G * D;
      KT_STATUS(kva_seq_read(c, seq, 0, t, kt, latent ? NULL : vr + (size_t)t * G * DV, NULL), KVA_OK);
      if (latent) memcpy(vr + (size_t)t * DV, kt, (size_t)DV * sizeof(float));
    }
    memset(&a, 0, sizeof a);
    a.n_heads = H, a.n_kv_heads = G, a.head_dim = D, a.v_dim = DV, a.int_scores = 1;
    a.n_threads = kt_int(r, 1, 2);
    if (it % 4 == 1) a.window = kt_int(r, 1, 40), a.n_sink = kt_int(r, 0, 2);
    KT_STATUS(kva_attend_cache(c, seq, 0, &a, q, n_q, out), KVA_OK);
    KT_STATUS(kva_batch_plan(c, &a, &seq, &n_q, 1, &plan), KVA_OK);
    if (plan) KT_STATUS(kva_attend_batch(c, plan, 0, q, outb), KVA_OK);
    kva_batch_free(plan);
    cfg = ref_cfg(&a);
    kd = ref_dup_f(kr, (size_t)n * G * D);
    vd = ref_dup_f(vr, (size_t)n * G * DV);
    ref_int_query(qd, q, (size_t)n_q * H, D);
    ref_attend(&cfg, qd, n_q, NULL, kd, vd, n, NULL, od, NULL);
    tol = 4e-6 * (1.0 + sqrt((double)D)) * (1.0 + ref_max_abs_d(vd, (size_t)n * G * DV));
    e = ref_max_err(out, od, (size_t)n_q * H * DV, NULL);
    eb = ref_max_err(outb, od, (size_t)n_q * H * DV, NULL);
    KT_CHECK(e <= tol && eb <= tol, "it %d %s %s H=%d G=%d D=%d DV=%d n=%d n_q=%d bs=%d win=%d: |err| cache %.3g batch %.3g > %.3g",
             it, latent ? "latent" : "kv", d.dtype == KVA_INT4 ? "int4" : "int8", H, G, D, DV, n, n_q, bs, a.window, e,
             eb, tol);
    if (two) { /* two sequences in one plan: the second holds the same rows */
      int child = -1, seqs[2], nq2[2] = {1, 1};
      float *out2 = KT_ALLOC(float, (size_t)2 * H * DV), *q2 = KT_ALLOC(float, (size_t)2 * H * D);
      KT_STATUS(kva_seq_new(c, &child), KVA_OK);
      KT_STATUS(kva_seq_append(c, child, n), KVA_OK);
      KT_STATUS(kva_store(c, child, 0, k, v, n), KVA_OK);
      seqs[0] = seq, seqs[1] = child;
      memcpy(q2, q, (size_t)H * D * sizeof(float));
      memcpy(q2 + (size_t)H * D, q, (size_t)H * D * sizeof(float));
      plan = NULL;
      KT_STATUS(kva_batch_plan(c, &a, seqs, nq2, 2, &plan), KVA_OK);
      if (plan) KT_STATUS(kva_attend_batch(c, plan, 0, q2, out2), KVA_OK);
      kva_batch_free(plan);
      KT_CHECK(ref_max_err(out2, od, (size_t)H * DV, NULL) <= tol &&
                   ref_max_err(out2 + (size_t)H * DV, od, (size_t)H * DV, NULL) <= tol,
               "it %d: a two-sequence plan differs from the reference", it);
      kva_seq_free(c, child);
      free(out2), free(q2);
    }
    kva_cache_destroy(c);
    free(k), free(v), free(kr), free(vr), free(q), free(out), free(outb), free(od), free(qd), free(kd), free(vd);
  }
}

/* |lse(int) - lse(float)| <= scale * max over keys of (amax / 254) * sum |k_i|: every score moves by at
   most that much, and so does their log-sum-exp. F16 keys ignore the option; 2 is refused. */
static void is_bound(kt_rng *r) {
  static const int bound_dims[4] = {16, 33, 64, 128};
  int it, iters = kt_iters(40);
  kt_begin("iscores: within the documented bound of float scores; F16 keys unchanged; bad values refused");
  for (it = 0; it < iters; it++) {
    int G = kt_int(r, 1, 2), H = G * kt_int(r, 1, 4), D = kt_pick(r, bound_dims, 4);
    int n = kt_int(r, 1, 300), seq = -1, h, t, i, g;
    kva_dtype dt = it % 3 == 0 ? KVA_INT4 : it % 3 == 1 ? KVA_INT8 : KVA_F16;
    kva_cache_desc d;
    kva_cache *c = NULL;
    kva_attn a;
    float *k = KT_ALLOC(float, (size_t)n * G * D), *kr = KT_ALLOC(float, (size_t)n * G * D);
    float *q = KT_ALLOC(float, (size_t)H * D), *o0 = KT_ALLOC(float, (size_t)H * D), *o1 = KT_ALLOC(float, (size_t)H * D);
    float *l0 = KT_ALLOC(float, H), *l1 = KT_ALLOC(float, H);
    memset(&d, 0, sizeof d);
    d.n_layers = 1, d.n_kv_heads = G, d.head_dim = D, d.n_blocks = n / 16 + 2, d.dtype = dt;
    KT_STATUS(kva_cache_create(&d, &c), KVA_OK);
    if (!c) continue;
    kt_fill(r, k, (size_t)n * G * D, -3.0f, 3.0f);
    kt_fill(r, q, (size_t)H * D, -2.0f, 2.0f);
    kva_seq_new(c, &seq);
    kva_seq_append(c, seq, n);
    kva_store(c, seq, 0, k, k, n);
    for (t = 0; t < n; t++) kva_seq_read(c, seq, 0, t, kr + (size_t)t * G * D, NULL, NULL);
    memset(&a, 0, sizeof a);
    a.n_heads = H, a.n_kv_heads = G, a.head_dim = D, a.n_threads = 1;
    KT_STATUS(kva_attend_cache_lse(c, seq, 0, &a, q, 1, o0, l0), KVA_OK);
    a.int_scores = 1;
    KT_STATUS(kva_attend_cache_lse(c, seq, 0, &a, q, 1, o1, l1), KVA_OK);
    if (dt == KVA_F16) {
      KT_CHECK(kt_same_bits(o0, o1, (size_t)H * D) && kt_same_bits(l0, l1, H), "it %d: F16 keys changed with int_scores", it);
    } else
      for (h = 0; h < H; h++) {
        double amax = 0.0, worst = 0.0, bound;
        g = h / (H / G);
        for (i = 0; i < D; i++)
          if (fabs((double)q[h * D + i]) > amax) amax = fabs((double)q[h * D + i]);
        for (t = 0; t < n; t++) {
          double l1n = 0.0;
          for (i = 0; i < D; i++) l1n += fabs((double)kr[((size_t)t * G + g) * D + i]);
          if (l1n > worst) worst = l1n;
        }
        bound = (amax / 254.0) * worst / sqrt((double)D);
        KT_CHECK(fabs((double)l1[h] - (double)l0[h]) <= bound * (1 + 1e-3) + 1e-5 * (1 + fabs((double)l0[h])),
                 "it %d %s head %d D=%d n=%d: lse moved %.3g, bound %.3g", it, dt == KVA_INT4 ? "int4" : "int8", h, D, n,
                 fabs((double)l1[h] - (double)l0[h]), bound);
      }
    a.int_scores = 2;
    KT_STATUS(kva_attend_cache(c, seq, 0, &a, q, 1, o1), KVA_ERR_ARG);
    kva_cache_destroy(c);
    free(k), free(kr), free(q), free(o0), free(o1), free(l0), free(l1);
  }
}

void test_iscores(void) {
  kt_rng r;
  kt_seed(&r, 0x15c0);
  is_quantizer(&r);
  is_kernels(&r);
  is_attention(&r);
  is_bound(&r);
}
