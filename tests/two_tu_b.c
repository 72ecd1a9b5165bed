/* Second translation unit of the two-tu check: see two_tu_a.c. */
#include "kvattn.h"

#include <string.h>

int two_tu_b(float out[8], float lse[2], const char **bad_status);

int two_tu_b(float out[8], float lse[2], const char **bad_status) {
    kva_attn a;
    float q[8], k[12], v[12];
    int i;

    for (i = 0; i < 8; ++i) q[i] = (float)((i * 7) % 11 - 5) / 8.0f;
    for (i = 0; i < 12; ++i) {
        k[i] = (float)((i * 5) % 13 - 6) / 8.0f;
        v[i] = (float)((i * 3) % 7 - 3) / 4.0f;
    }
    memset(&a, 0, sizeof a);
    a.n_heads = 2;
    a.n_kv_heads = 3; /* H % G != 0: KVA_ERR_ARG */
    a.head_dim = 4;
    a.n_threads = 1;
    *bad_status = kva_status_str(kva_attend(&a, q, 1, NULL, k, v, 3, NULL, out, lse));
    a.n_kv_heads = 1;
    return (int)kva_attend(&a, q, 1, NULL, k, v, 3, NULL, out, lse);
}
