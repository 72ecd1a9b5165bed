/* bench/bench_mla.c - kvattn_bench mla: MLA decode with DeepSeek-V2 attention dims (latent 512, rope 64, nope 128,
   v 128), one layer, d_model 1024: absorbed (MQA over the latent cache) against
   naive (every cached latent rebuilt into per-head K and V), one thread. */
#include "harness.h"

static void mla_fill(float *p, size_t n, float s) {
  size_t i;
  for (i = 0; i < n; i++) p[i] = s * ((float)((i * 2654435761u) % 1000u) / 500.0f - 1.0f);
}
void cmd_mla(int quick) {
  static const int heads[] = {16, 128}, ctxs[] = {1024, 4096, 16384};
  const int d = 1024, dl = 512, dr = 64, dn = 128, dv = 128;
  int hi, ci;
  text("\nMLA decode, DeepSeek-V2 attention dims (latent 512 + rope 64, nope 128, v 128), 1 layer, F16 latent\n"
       "cache, 1 thread, warm: time of one kva_mla_forward decode step, absorbed vs naive\n");
  text("%5s  %7s  %12s  %12s  %14s  %9s\n", "heads", "ctx", "absorbed ms", "naive ms", "naive/absorbed", "abs GF/s");
  for (hi = 0; hi < 2; hi++)
    for (ci = 0; ci < 3; ci++) {
      int H = heads[hi], n = ctxs[ci], pass, reps = 3, r;
      kva_mla_layer L;
      kva_cache_desc cd;
      kva_cache *c = NULL;
      float *w, *x, *y;
      size_t nw[7], tot = 0, off = 0;
      double best[2] = {1e30, 1e30};
      if (quick && (ci > 1 || hi > 0)) continue;
      if (H == 128 && n > 4096) continue; /* the naive rebuild alone would take minutes */
      nw[0] = (size_t)H * (dn + dr) * d; nw[1] = (size_t)(dl) * d; nw[2] = (size_t)dr * d;
      nw[3] = (size_t)H * dn * dl; nw[4] = (size_t)H * dv * dl; nw[5] = (size_t)d * H * dv; nw[6] = dl;
      for (r = 0; r < 7; r++) tot += nw[r];
      w = (float *)xalloc(tot * sizeof(float));
      mla_fill(w, tot, 0.02f);
      memset(&L, 0, sizeof L);
      L.d_model = d; L.n_heads = H; L.d_latent = dl; L.d_nope = dn; L.d_rope = dr; L.d_v = dv; L.n_threads = 1;
      L.wq = w + off; off += nw[0]; L.w_dkv = w + off; off += nw[1]; L.w_kr = w + off; off += nw[2];
      L.w_uk = w + off; off += nw[3]; L.w_uv = w + off; off += nw[4]; L.wo = w + off; off += nw[5];
      L.kv_norm = w + off;
      L.rope.theta = 10000.0f; L.rope.interleaved = 1;
      memset(&cd, 0, sizeof cd);
      cd.kind = KVA_CACHE_LATENT; cd.n_layers = 1; cd.n_kv_heads = 1; cd.head_dim = dl + dr; cd.v_dim = dl;
      cd.n_blocks = n / 16 + 8;
      x = (float *)xalloc((size_t)512 * d * sizeof(float));
      y = (float *)xalloc((size_t)512 * d * sizeof(float));
      mla_fill(x, (size_t)512 * d, 1.0f);
      if (kva_cache_create(&cd, &c) == KVA_OK) {
        int s = -1, t;
        kva_seq_new(c, &s);
        for (t = 0; t < n; t += 512) { /* prefill with the absorbed path */
          int m = n - t < 512 ? n - t : 512;
          kva_seq_append(c, s, m);
          kva_mla_forward(&L, c, s, 0, x, m, y);
        }
        for (pass = 0; pass < 2; pass++)
          for (r = 0; r < (pass ? 1 : reps); r++) {
            int f = -1;
            double t0;
            kva_seq_fork(c, s, &f); /* same context each time: fork, decode one token, free */
            kva_seq_append(c, f, 1);
            L.naive = pass;
            t0 = now_s();
            kva_mla_forward(&L, c, f, 0, x, 1, y);
            t0 = now_s() - t0;
            if (t0 < best[pass]) best[pass] = t0;
            kva_seq_free(c, f);
          }
        kva_cache_destroy(c);
        text("%5d  %7d  %12.3f  %12.2f  %13.1fx  %9.1f\n", H, n, best[0] * 1e3, best[1] * 1e3, best[1] / best[0],
             2.0 * H * (double)n * (dl + dr + dl) / best[0] / 1e9);
      }
      free(w); free(x); free(y);
    }
}
