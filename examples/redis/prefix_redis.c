/* prefix_redis: processes sharing prefix blocks through Redis.

   The same GQA layer and request as examples/prefix_tier.c (tier_demo.h),
   with the prefix tier in a Redis server (tier_redis.h):

     prefix_redis HOST:PORT publish   compute the system prompt and the
                                      question, publish the prompt and save
                                      it to the server (kva_prefix_save)
     prefix_redis HOST:PORT reuse     a process that never computed the
                                      prompt: look it up (fetched from the
                                      server), prefill only the question

   Each prints how many prompt tokens it reused and its output's 512 bytes
   in hex; `reuse` also computes the request from scratch and exits 1
   unless the two are bit for bit equal and the whole prompt came from the
   server. tests/redis_tier.sh starts a server, runs both, and stops it.

   Build: cc -std=c99 -O2 -Iexamples -I. examples/redis/prefix_redis.c -lhiredis -lm */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tier_demo.h"
#include "tier_redis.h"

static void print_output(const char *what, int reused, const float *y) {
  const unsigned char *b = (const unsigned char *)y;
  size_t i;
  printf("%s: %d of %d prompt tokens reused; output ", what, reused, PROMPT);
  for (i = 0; i < D_MODEL * sizeof(float); i++) printf("%02x", b[i]);
  printf("\n");
}

int main(int argc, char **argv) {
  char host[256];
  const char *colon;
  int port, reused = 0, saved = 0;
  tier_redis r;
  kva_cache *c;
  kva_cache_stats st;
  float y[D_MODEL], y_ref[D_MODEL];
  if (argc != 3 || !(colon = strrchr(argv[1], ':')) || (size_t)(colon - argv[1]) >= sizeof host ||
      (port = atoi(colon + 1)) <= 0 || port > 65535 || (strcmp(argv[2], "publish") && strcmp(argv[2], "reuse"))) {
    fprintf(stderr, "usage: %s HOST:PORT publish|reuse   (a Redis or Valkey server)\n", argv[0]);
    return 2;
  }
  memcpy(host, argv[1], (size_t)(colon - argv[1]));
  host[colon - argv[1]] = 0;
  if (!tier_redis_open(&r, host, port, 1000)) {
    fprintf(stderr, "prefix_redis: no Redis server answers at %s:%d (start one: redis-server --port %d)\n", host, port,
            port);
    return 1;
  }
  demo_init();
  if (!(c = demo_cache(tier_redis_spill, tier_redis_fetch, &r))) return 1;
  if (!request(c, y, &reused)) return 1;
  if (strcmp(argv[2], "publish") == 0) {
    if (kva_prefix_save(c, &saved) != KVA_OK || saved != PROMPT / BS) {
      fprintf(stderr, "prefix_redis: saved %d of %d blocks to the server\n", saved, PROMPT / BS);
      return 1;
    }
    print_output("publish", reused, y);
  } else {
    kva_cache_get_stats(c, &st);
    print_output("reuse", reused, y);
    printf("reuse: %ld blocks fetched from the server, %ld misses, %ld records refused\n", st.tier_fetch_hits,
           st.tier_fetch_misses, st.tier_fetch_refused);
    if (!demo_reference(y_ref)) return 1;
    if (reused != PROMPT || memcmp(y, y_ref, sizeof y) != 0) {
      fprintf(stderr, "prefix_redis: %s\n",
              reused != PROMPT ? "the prompt did not come from the server" : "the output differs from recomputation");
      return 1;
    }
    printf("reuse: bit for bit the request computed from scratch\n");
  }
  kva_cache_destroy(c);
  demo_free();
  tier_redis_close(&r);
  return 0;
}
