/* Two translation units that both include kvattn.h, linked into one program
   (`make test-all`, step two-tu).  The header must not define anything with
   external linkage (the default KVA_API is static inline), and both copies
   must compute the same thing.  main() is here; two_tu_b.c has the other half. */
#include "kvattn.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* H = 2 query heads sharing G = 1 KV head, D = 4, three keys, one query
   (the last key's position).  out is [1][2][4], lse is [1][2]. */
int two_tu_a(float out[8], float lse[2], const char **bad_status);
int two_tu_b(float out[8], float lse[2], const char **bad_status); /* two_tu_b.c */

static float q_at(int i) { return (float)((i * 7) % 11 - 5) / 8.0f; }
static float k_at(int i) { return (float)((i * 5) % 13 - 6) / 8.0f; }
static float v_at(int i) { return (float)((i * 3) % 7 - 3) / 4.0f; }

int two_tu_a(float out[8], float lse[2], const char **bad_status) {
    kva_attn a;
    float q[8], k[12], v[12];
    int i;
    kva_status st;

    for (i = 0; i < 8; ++i) q[i] = q_at(i);
    for (i = 0; i < 12; ++i) {
        k[i] = k_at(i);
        v[i] = v_at(i);
    }
    memset(&a, 0, sizeof a);
    a.n_heads = 2;
    a.n_kv_heads = 3; /* H % G != 0: KVA_ERR_ARG */
    a.head_dim = 4;
    a.n_threads = 1;
    *bad_status = kva_status_str(kva_attend(&a, q, 1, NULL, k, v, 3, NULL, out, lse));
    a.n_kv_heads = 1;
    st = kva_attend(&a, q, 1, NULL, k, v, 3, NULL, out, lse);
    return (int)st;
}

/* the same attention, written out: scale 1/sqrt(4), the query sees all keys */
static void reference(float out[8], float lse[2]) {
    int h, j, d;
    for (h = 0; h < 2; ++h) {
        double s[3], m = -1e300, sum = 0.0;
        for (j = 0; j < 3; ++j) {
            double dot = 0.0;
            for (d = 0; d < 4; ++d) dot += (double)q_at(h * 4 + d) * k_at(j * 4 + d);
            s[j] = dot * 0.5;
            if (s[j] > m) m = s[j];
        }
        for (j = 0; j < 3; ++j) sum += exp(s[j] - m);
        for (d = 0; d < 4; ++d) {
            double o = 0.0;
            for (j = 0; j < 3; ++j) o += exp(s[j] - m) / sum * v_at(j * 4 + d);
            out[h * 4 + d] = (float)o;
        }
        lse[h] = (float)(m + log(sum));
    }
}

int main(void) {
    float oa[8], ob[8], oref[8], la[2], lb[2], lref[2];
    const char *ma = NULL, *mb = NULL;
    int sa, sb, i, ok = 1;

    memset(oa, 0, sizeof oa);
    memset(ob, 0, sizeof ob);
    memset(la, 0, sizeof la);
    memset(lb, 0, sizeof lb);
    sa = two_tu_a(oa, la, &ma);
    sb = two_tu_b(ob, lb, &mb);
    if (sa != KVA_OK || sb != KVA_OK) {
        printf("kva_attend failed: a -> %d (%s), b -> %d (%s)\n", sa,
               kva_status_str((kva_status)sa), sb, kva_status_str((kva_status)sb));
        ok = 0;
    }
    if (!ma || !mb || !ma[0] || strcmp(ma, mb) != 0 ||
        strcmp(ma, kva_status_str(KVA_ERR_ARG)) != 0 ||
        strcmp(ma, kva_status_str(KVA_OK)) == 0) {
        printf("kva_status_str of a bad call differs: a \"%s\", b \"%s\"\n",
               ma ? ma : "(null)", mb ? mb : "(null)");
        ok = 0;
    }
    if (memcmp(oa, ob, sizeof oa) != 0 || memcmp(la, lb, sizeof la) != 0) {
        printf("the two translation units disagree:\n");
        for (i = 0; i < 8; ++i) printf("  out[%d]: %.9g vs %.9g\n", i, oa[i], ob[i]);
        for (i = 0; i < 2; ++i) printf("  lse[%d]: %.9g vs %.9g\n", i, la[i], lb[i]);
        ok = 0;
    }
    reference(oref, lref);
    for (i = 0; i < 8; ++i)
        if (!(fabsf(oa[i] - oref[i]) <= 1e-4f)) {
            printf("out[%d] = %.9g, reference %.9g\n", i, oa[i], oref[i]);
            ok = 0;
        }
    for (i = 0; i < 2; ++i)
        if (!(fabsf(la[i] - lref[i]) <= 1e-4f)) {
            printf("lse[%d] = %.9g, reference %.9g\n", i, la[i], lref[i]);
            ok = 0;
        }
    printf("%s (simd %s)\n", ok ? "OK" : "FAIL", kva_simd_name());
    return ok ? 0 : 1;
}
