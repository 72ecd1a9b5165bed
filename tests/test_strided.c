/* test_strided.c - rows with strides (a fused QKV buffer used in place) and
 * RoPE tables.
 *
 * The strided calls are the packed ones with another address for each row,
 * so each is checked against the packed call on the same values, bit for
 * bit (the packed calls are checked against the fp64 reference in their own
 * sections), and the gaps between rows must stay untouched:
 *  - kva_rope_apply_strided == kva_rope_apply on a packed copy;
 *  - a RoPE table (kva_rope_table_init) rotates exactly as without one, for
 *    positions inside the table and beyond it (computed), any dim,
 *    interleaved or not, theta or inv_freq;
 *  - kva_attend with q/k/v/out strides == packed;
 *  - kva_store_strided == kva_store_at (read back through kva_seq_read);
 *  - kva_attend_cache / kva_attend_batch_lse with q/out strides == packed;
 *  - one step of a layer from a fused [T][(H + 2G) * D] projection buffer:
 *    RoPE on its Q and K columns, K/V stored, Q attended, all in place;
 *  - argument errors: a stride below the row width, negative strides, a
 *    table length without a table.
 */
#include "kvattn.h"
#include "harness.h"

/* a packed copy of n rows of width w taken every stride floats */
static void ts_pack(float *dst, const float *src, int n, int w, int stride) {
  int t;
  for (t = 0; t < n; t++) memcpy(dst + (size_t)t * w, src + (size_t)t * stride, sizeof(float) * (size_t)w);
}

/* the gaps (stride - w floats after each of n rows) still hold the sentinel */
static int ts_gaps_untouched(const float *x, int n, int w, int stride) {
  int t;
  for (t = 0; t < n; t++)
    if (!kt_all_sentinel(x + (size_t)t * stride + w, (size_t)(stride - w))) return 0;
  return 1;
}

/* rows of width w at stride in a sentinel-filled buffer, values from src (packed) */
static float *ts_spread(const float *src, int n, int w, int stride) {
  float *x = KT_ALLOC(float, (size_t)n * stride + 1);
  int t;
  kt_fill_sentinel(x, (size_t)n * stride + 1);
  for (t = 0; t < n; t++) memcpy(x + (size_t)t * stride, src + (size_t)t * w, sizeof(float) * (size_t)w);
  return x;
}

static void test_rope_strided_and_table(void) {
  kt_rng r;
  int it;
  kt_begin("strided: kva_rope_apply_strided and RoPE tables");
  kt_seed(&r, 0x57D1);
  for (it = 0; it < kt_iters(200); it++) {
    int Hh = kt_int(&r, 1, 6), D = 2 * kt_int(&r, 1, 40), T = kt_int(&r, 1, 30), w = Hh * D;
    int stride = w + kt_int(&r, 0, 2) * kt_int(&r, 1, 17), tl = kt_int(&r, 0, 3) ? kt_int(&r, 1, 80) : 0, t;
    kva_rope ro;
    float inv[64], *packed = KT_ALLOC(float, (size_t)T * w), *ref = KT_ALLOC(float, (size_t)T * w), *x, *table;
    int32_t pos[30];
    memset(&ro, 0, sizeof ro);
    ro.dim = kt_int(&r, 0, 1) ? 0 : 2 * kt_int(&r, 1, D / 2);
    ro.interleaved = kt_int(&r, 0, 1);
    if (kt_int(&r, 0, 2) == 0) {
      int i, dim = ro.dim ? ro.dim : D;
      for (i = 0; i < dim / 2; i++) inv[i] = kt_uniform(&r, 1e-4f, 1.0f);
      ro.inv_freq = inv;
    } else {
      ro.theta = kt_int(&r, 0, 1) ? 10000.0f : 500000.0f;
    }
    for (t = 0; t < T; t++) pos[t] = kt_int(&r, 0, 3) ? kt_int(&r, 0, 120) : kt_int(&r, 0, 1 << 20);
    kt_fill(&r, packed, (size_t)T * w, -2.0f, 2.0f);
    memcpy(ref, packed, sizeof(float) * (size_t)T * w);
    KT_STATUS(kva_rope_apply(&ro, ref, T, Hh, D, pos), KVA_OK);
    /* strided, no table */
    x = ts_spread(packed, T, w, stride);
    KT_STATUS(kva_rope_apply_strided(&ro, x, stride, T, Hh, D, pos), KVA_OK);
    {
      float *back = KT_ALLOC(float, (size_t)T * w);
      ts_pack(back, x, T, w, stride);
      KT_CHECK(kt_same_bits(back, ref, (size_t)T * w), "strided RoPE != packed (H%d D%d stride %d)", Hh, D, stride);
      KT_CHECK(ts_gaps_untouched(x, T, w, stride), "strided RoPE wrote between rows (stride %d)", stride);
      /* with a table of tl positions: the same bits, inside and beyond it */
      table = KT_ALLOC(float, kva_rope_table_floats(&ro, D, tl) + 1);
      KT_CHECK(kva_rope_table_floats(&ro, D, tl) == (size_t)tl * (size_t)(ro.dim ? ro.dim : D),
               "kva_rope_table_floats %lu", (unsigned long)kva_rope_table_floats(&ro, D, tl));
      KT_STATUS(kva_rope_table_init(&ro, D, tl, table), KVA_OK);
      ro.table = table;
      ro.table_len = tl;
      kt_fill_sentinel(x, (size_t)T * stride + 1);
      for (t = 0; t < T; t++) memcpy(x + (size_t)t * stride, packed + (size_t)t * w, sizeof(float) * (size_t)w);
      KT_STATUS(kva_rope_apply_strided(&ro, x, stride, T, Hh, D, pos), KVA_OK);
      ts_pack(back, x, T, w, stride);
      KT_CHECK(kt_same_bits(back, ref, (size_t)T * w), "RoPE with a %d-position table != without (D%d dim %d)", tl,
               D, ro.dim);
      free(table);
      free(back);
    }
    free(x);
    free(packed);
    free(ref);
  }
  {
    kva_rope ro;
    float x[64] = {0}, table[8];
    memset(&ro, 0, sizeof ro);
    ro.theta = 10000.0f;
    KT_STATUS(kva_rope_apply_strided(&ro, x, 7, 2, 2, 4, NULL), KVA_ERR_ARG); /* stride < 2 x 4 */
    KT_STATUS(kva_rope_apply_strided(&ro, x, -1, 2, 2, 4, NULL), KVA_ERR_ARG);
    KT_STATUS(kva_rope_apply_strided(&ro, x, 8, 2, 2, 4, NULL), KVA_OK);
    ro.table_len = 2; /* a length without a table */
    KT_STATUS(kva_rope_apply(&ro, x, 2, 2, 4, NULL), KVA_ERR_ARG);
    ro.table_len = -1;
    KT_STATUS(kva_rope_apply(&ro, x, 2, 2, 4, NULL), KVA_ERR_ARG);
    ro.table_len = 0;
    KT_STATUS(kva_rope_table_init(&ro, 4, 2, NULL), KVA_ERR_ARG);
    KT_STATUS(kva_rope_table_init(&ro, 4, -1, table), KVA_ERR_ARG);
    KT_STATUS(kva_rope_table_init(NULL, 4, 2, table), KVA_ERR_ARG);
    KT_STATUS(kva_rope_table_init(&ro, 4, 2, table), KVA_OK);
    KT_CHECK(kva_rope_table_floats(&ro, 4, 2) == 8 && kva_rope_table_floats(&ro, 3, 2) == 0 &&
                 kva_rope_table_floats(NULL, 4, 2) == 0,
             "kva_rope_table_floats on good and bad arguments");
  }
}

static void test_attend_strided(void) {
  kt_rng r;
  int it;
  kt_begin("strided: kva_attend with q/k/v/out strides == packed");
  kt_seed(&r, 0x57D2);
  for (it = 0; it < kt_iters(150); it++) {
    int G = kt_int(&r, 1, 3), Hh = G * kt_int(&r, 1, 3), D = kt_int(&r, 1, 40), Dv = kt_int(&r, 0, 1) ? D : kt_int(&r, 1, 33);
    int n_kv = kt_int(&r, 1, 300), n_q = kt_int(&r, 1, n_kv < 9 ? n_kv : 9);
    int qs = Hh * D + kt_int(&r, 0, 9), ks = G * D + kt_int(&r, 0, 9), vs = G * Dv + kt_int(&r, 0, 9);
    int os = Hh * Dv + kt_int(&r, 0, 9);
    kva_attn a;
    float *q = KT_ALLOC(float, (size_t)n_q * Hh * D), *k = KT_ALLOC(float, (size_t)n_kv * G * D);
    float *v = KT_ALLOC(float, (size_t)n_kv * G * Dv), *o1 = KT_ALLOC(float, (size_t)n_q * Hh * Dv);
    float *l1 = KT_ALLOC(float, (size_t)n_q * Hh), *l2 = KT_ALLOC(float, (size_t)n_q * Hh);
    float *qx, *kx, *vx, *ox = KT_ALLOC(float, (size_t)n_q * os + 1), *o2 = KT_ALLOC(float, (size_t)n_q * Hh * Dv);
    memset(&a, 0, sizeof a);
    a.n_heads = Hh, a.n_kv_heads = G, a.head_dim = D, a.v_dim = Dv, a.n_threads = kt_int(&r, 0, 2);
    a.window = kt_int(&r, 0, 3) ? 0 : kt_int(&r, 1, n_kv);
    kt_fill(&r, q, (size_t)n_q * Hh * D, -1, 1);
    kt_fill(&r, k, (size_t)n_kv * G * D, -1, 1);
    kt_fill(&r, v, (size_t)n_kv * G * Dv, -1, 1);
    KT_STATUS(kva_attend(&a, q, n_q, NULL, k, v, n_kv, NULL, o1, l1), KVA_OK);
    qx = ts_spread(q, n_q, Hh * D, qs);
    kx = ts_spread(k, n_kv, G * D, ks);
    vx = ts_spread(v, n_kv, G * Dv, vs);
    kt_fill_sentinel(ox, (size_t)n_q * os + 1);
    a.q_stride = qs, a.k_stride = ks, a.v_stride = vs, a.out_stride = os;
    KT_STATUS(kva_attend(&a, qx, n_q, NULL, kx, vx, n_kv, NULL, ox, l2), KVA_OK);
    ts_pack(o2, ox, n_q, Hh * Dv, os);
    KT_CHECK(kt_same_bits(o1, o2, (size_t)n_q * Hh * Dv) && kt_same_bits(l1, l2, (size_t)n_q * Hh),
             "strided kva_attend != packed (H%d G%d D%d Dv%d n_q %d n_kv %d)", Hh, G, D, Dv, n_q, n_kv);
    KT_CHECK(ts_gaps_untouched(ox, n_q, Hh * Dv, os), "strided kva_attend wrote between out rows");
    /* a stride below the row width (rows would overlap; 0 itself means packed) */
    a.q_stride = Hh * D > 1 ? Hh * D - 1 : -1;
    KT_STATUS(kva_attend(&a, qx, n_q, NULL, kx, vx, n_kv, NULL, ox, NULL), KVA_ERR_ARG);
    a.q_stride = qs, a.out_stride = Hh * Dv > 1 ? Hh * Dv - 1 : -1;
    KT_STATUS(kva_attend(&a, qx, n_q, NULL, kx, vx, n_kv, NULL, ox, NULL), KVA_ERR_ARG);
    a.out_stride = os, a.k_stride = -1;
    KT_STATUS(kva_attend(&a, qx, n_q, NULL, kx, vx, n_kv, NULL, ox, NULL), KVA_ERR_ARG);
    a.k_stride = ks, a.v_stride = G * Dv > 1 ? G * Dv - 1 : -1;
    KT_STATUS(kva_attend(&a, qx, n_q, NULL, kx, vx, n_kv, NULL, ox, NULL), KVA_ERR_ARG);
    free(q), free(k), free(v), free(o1), free(o2), free(l1), free(l2), free(qx), free(kx), free(vx), free(ox);
  }
}

/* One decode/prefill step of a layer straight from a fused projection
   buffer qkv [T][(H + 2G) * D] (Q, then K, then V of each token), against
   the same step on packed copies in a twin cache. */
static void test_fused_qkv(void) {
  kt_rng r;
  int it;
  kt_begin("strided: a fused QKV buffer in place (RoPE, kva_store_strided, kva_attend_cache, batch)");
  kt_seed(&r, 0x57D3);
  for (it = 0; it < kt_iters(60); it++) {
    int G = kt_int(&r, 1, 3), Hh = G * kt_int(&r, 1, 3), D = 2 * kt_int(&r, 1, 20), L = kt_int(&r, 1, 2);
    int row = (Hh + 2 * G) * D, os = Hh * D + kt_int(&r, 0, 5), step, l, c_i, seq[2] = {-1, -1};
    static const kva_dtype dts[3] = {KVA_F32, KVA_F16, KVA_INT8};
    kva_cache_desc d;
    kva_cache *c[2] = {NULL, NULL};
    kva_attn a;
    kva_rope ro;
    memset(&d, 0, sizeof d);
    d.n_layers = L, d.n_kv_heads = G, d.head_dim = D, d.block_size = kt_int(&r, 1, 8), d.n_blocks = 200;
    d.dtype = dts[kt_int(&r, 0, 2)];
    memset(&a, 0, sizeof a);
    a.n_heads = Hh, a.n_kv_heads = G, a.head_dim = D, a.n_threads = 1;
    memset(&ro, 0, sizeof ro);
    ro.theta = 10000.0f;
    if (kva_cache_create(&d, &c[0]) != KVA_OK || kva_cache_create(&d, &c[1]) != KVA_OK) {
      KT_CHECK(0, "cache setup");
      kva_cache_destroy(c[0]);
      kva_cache_destroy(c[1]);
      return;
    }
    KT_STATUS(kva_seq_new(c[0], &seq[0]), KVA_OK);
    KT_STATUS(kva_seq_new(c[1], &seq[1]), KVA_OK);
    for (step = 0; step < 4; step++) {
      int T = step == 0 ? kt_int(&r, 1, 40) : kt_int(&r, 1, 3), t, p0 = kva_seq_pos(c[0], seq[0]);
      float *qkv = KT_ALLOC(float, (size_t)T * row), *qp = KT_ALLOC(float, (size_t)T * Hh * D);
      float *kp = KT_ALLOC(float, (size_t)T * G * D), *vp = KT_ALLOC(float, (size_t)T * G * D);
      float *o_f = KT_ALLOC(float, (size_t)T * os + 1), *o_p = KT_ALLOC(float, (size_t)T * Hh * D);
      float *o_b = KT_ALLOC(float, (size_t)T * os + 1), *o_f2 = KT_ALLOC(float, (size_t)T * Hh * D);
      int32_t pos[40];
      for (t = 0; t < T; t++) pos[t] = p0 + t;
      for (c_i = 0; c_i < 2; c_i++) KT_STATUS(kva_seq_append(c[c_i], seq[c_i], T), KVA_OK);
      for (l = 0; l < L; l++) {
        kva_batch *plan = NULL;
        int nq1 = T;
        kt_fill(&r, qkv, (size_t)T * row, -1, 1);
        ts_pack(qp, qkv, T, Hh * D, row);
        ts_pack(kp, qkv + Hh * D, T, G * D, row);
        ts_pack(vp, qkv + (Hh + G) * D, T, G * D, row);
        /* packed twin */
        KT_STATUS(kva_rope_apply(&ro, qp, T, Hh, D, pos), KVA_OK);
        KT_STATUS(kva_rope_apply(&ro, kp, T, G, D, pos), KVA_OK);
        KT_STATUS(kva_store(c[1], seq[1], l, kp, vp, T), KVA_OK);
        KT_STATUS(kva_attend_cache(c[1], seq[1], l, &a, qp, T, o_p), KVA_OK);
        /* in place */
        KT_STATUS(kva_rope_apply_strided(&ro, qkv, row, T, Hh, D, pos), KVA_OK);
        KT_STATUS(kva_rope_apply_strided(&ro, qkv + Hh * D, row, T, G, D, pos), KVA_OK);
        KT_STATUS(kva_store_strided(c[0], seq[0], l, 0, qkv + Hh * D, row, qkv + (Hh + G) * D, row, T), KVA_OK);
        {
          kva_attn as = a;
          as.q_stride = row, as.out_stride = os;
          kt_fill_sentinel(o_f, (size_t)T * os + 1);
          KT_STATUS(kva_attend_cache(c[0], seq[0], l, &as, qkv, T, o_f), KVA_OK);
          ts_pack(o_f2, o_f, T, Hh * D, os);
          KT_CHECK(kt_same_bits(o_f2, o_p, (size_t)T * Hh * D) && ts_gaps_untouched(o_f, T, Hh * D, os),
                   "fused QKV step != packed (H%d G%d D%d T%d %s, step %d layer %d)", Hh, G, D, T,
                   kva_dtype_name(d.dtype), step, l);
          /* the same through a batch plan (one sequence: no split-K difference at these lengths) */
          kt_fill_sentinel(o_b, (size_t)T * os + 1);
          KT_STATUS(kva_batch_plan(c[0], &as, &seq[0], &nq1, 1, &plan), KVA_OK);
          if (plan) {
            KT_STATUS(kva_attend_batch(c[0], plan, l, qkv, o_b), KVA_OK);
            KT_CHECK(kt_same_bits(o_b, o_f, (size_t)T * os), "kva_attend_batch with strides != kva_attend_cache");
            kva_batch_free(plan);
          }
        }
      }
      {
        float k1[64 * 3], v1[64 * 3], k2[64 * 3], v2[64 * 3];
        int n = kva_seq_len(c[0], seq[0]), sl;
        for (sl = 0; sl < n; sl += 1 + n / 7)
          for (l = 0; l < L; l++) {
            KT_STATUS(kva_seq_read(c[0], seq[0], l, sl, k1, v1, NULL), KVA_OK);
            KT_STATUS(kva_seq_read(c[1], seq[1], l, sl, k2, v2, NULL), KVA_OK);
            KT_CHECK(kt_same_bits(k1, k2, (size_t)G * D) && kt_same_bits(v1, v2, (size_t)G * D),
                     "kva_store_strided stored other values than kva_store (slot %d layer %d)", sl, l);
          }
      }
      free(qkv), free(qp), free(kp), free(vp), free(o_f), free(o_p), free(o_b), free(o_f2);
    }
    {
      float k[16 * 8] = {0};
      KT_STATUS(kva_seq_append(c[0], seq[0], 1), KVA_OK);
      KT_STATUS(kva_store_strided(c[0], seq[0], 0, 0, k, G * D - 1, k, 0, 1), KVA_ERR_ARG);
      KT_STATUS(kva_store_strided(c[0], seq[0], 0, 0, k, 0, k, -1, 1), KVA_ERR_ARG);
    }
    kva_cache_destroy(c[0]);
    kva_cache_destroy(c[1]);
  }
}

void test_strided(void) {
  test_rope_strided_and_table();
  test_attend_strided();
  test_fused_qkv();
}
