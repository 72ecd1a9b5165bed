/* tier_load.h - a store's prefix records into a cache now (kva_prefix_load),
   for the stores in examples/ (tier_dir.h, redis/tier_redis.h): a restarted
   server's first requests then find their prefixes in memory.

   A store lists its records in any order, and a record waits for its parent
   to be in memory (KVA_PREFIX_NO_PARENT), so the loader makes passes over
   the list until one takes nothing in. It stops early when the pool has no
   free block (the rest stay in the store for fetch) or the store fails. */
#ifndef KVATTN_TIER_LOAD_H
#define KVATTN_TIER_LOAD_H

#include <stdlib.h>

#include "kvattn.h"

/* Reads record i of the store's list into buf (at most cap bytes; *size the
   bytes read, cap for anything longer): 1 read, 0 gone since it was listed,
   -1 the store failed (loading stops). */
typedef int (*tier_read_fn)(void *user, size_t i, unsigned char *buf, size_t cap, size_t *size);

/* Loads what it can of n listed records; *refused counts those that are not
   records of this cache. Returns the records taken in, -1 without memory. */
static inline int tier_load_passes(kva_cache *c, size_t n, tier_read_fn read, void *user, int *refused) {
  const size_t size = kva_prefix_record_size(c);
  unsigned char *done = (unsigned char *)calloc(n ? n : 1, 1), *rec = (unsigned char *)malloc(size + 1);
  int loaded = 0, progress = 1, stop = 0;
  size_t i;
  *refused = 0;
  if (!done || !rec || size == 0) {
    free(done), free(rec);
    return -1;
  }
  while (progress && !stop) {
    progress = 0;
    for (i = 0; i < n && !stop; i++) {
      size_t got = 0;
      int outcome = KVA_PREFIX_NO_PARENT, r;
      kva_status st = KVA_OK;
      if (done[i]) continue;
      r = read(user, i, rec, size + 1, &got); /* one byte more than a record: a longer one is refused */
      if (r < 0) {
        stop = 1;
        break;
      }
      if (r > 0) st = kva_prefix_load(c, rec, got, &outcome);
      if (st == KVA_ERR_FULL) stop = 1;
      if (st == KVA_ERR_FULL || (r > 0 && st == KVA_OK && outcome == KVA_PREFIX_NO_PARENT)) continue;
      if (st != KVA_OK) ++*refused;
      else loaded += r > 0 && outcome == KVA_PREFIX_LOADED;
      done[i] = 1;
      progress = 1;
    }
  }
  free(done), free(rec);
  return loaded;
}

#endif /* KVATTN_TIER_LOAD_H */
