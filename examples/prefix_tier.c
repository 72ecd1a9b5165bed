/* prefix_tier: a system prompt that outlives the pool and the process.

   A GQA layer over a small F16 cache whose prefix tier is a directory of
   files (examples/tier_dir.h). Request A prefills a 128-token system prompt
   and a question and publishes the prompt; request B, unrelated, needs the
   whole pool, so the cache forgets A's blocks and spills them to the
   directory; request C asks A's question again: its lookup fetches the
   prompt's blocks back and prefills only the question. C's output is
   checked bit for bit against the same request computed from scratch.
   Run it twice with the same directory: the second process never computed
   the prompt, and its very first lookup finds it in the files.

   usage: prefix_tier [DIR]   (without DIR: a new directory in $TMPDIR, else in the current directory,
                               removed at the end) */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvattn.h"
#include "tier_demo.h"
#include "tier_dir.h"

int main(int argc, char **argv) {
  char own[1100];
  const char *dir = argc > 1 ? argv[1] : NULL, *tmp = getenv("TMPDIR");
  kva_cache *c;
  kva_cache_stats st;
  tier_dir store;
  float y_a[D_MODEL], y_c[D_MODEL], y_ref[D_MODEL];
  int seq, reused_a, reused_c;

  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    fprintf(stderr, "usage: %s [DIR]   (a directory for the prefix tier's records; created if missing)\n", argv[0]);
    return 2;
  }
  if (!dir) {
    snprintf(own, sizeof own, "%s/kvattn_tier_XXXXXX", tmp && *tmp ? tmp : ".");
    if (!mkdtemp(own)) {
      fprintf(stderr, "prefix_tier: cannot make a directory in %s (set TMPDIR, or give DIR)\n", tmp && *tmp ? tmp : ".");
      return 1;
    }
    dir = own;
  }
  if (!tier_dir_open(&store, dir)) {
    fprintf(stderr, "prefix_tier: cannot use '%s' as the tier's directory (create it, or give a writable one)\n",
            dir);
    return 1;
  }
  demo_init();
  if (!(c = demo_cache(tier_dir_spill, tier_dir_fetch, &store))) return 1;

  /* A: the prompt (from the files, if an earlier run left it there) and the question */
  if (!request(c, y_a, &reused_a)) return 1;
  printf("request A: %d of %d prompt tokens reused%s\n", reused_a, PROMPT,
         reused_a ? " (from the tier: an earlier process computed them)" : "");
  /* B: another request needs every block: A's published blocks are spilled */
  if (kva_seq_new(c, &seq) != KVA_OK || kva_seq_append(c, seq, OTHER) != KVA_OK) return 1;
  kva_seq_free(c, seq);
  /* C: A's request again */
  if (!request(c, y_c, &reused_c)) return 1;
  kva_cache_get_stats(c, &st);
  printf("request C: %d of %d prompt tokens reused; tier: %ld blocks spilled (%ld refused by the store), "
         "%ld fetched, %ld misses, %ld records refused\n",
         reused_c, PROMPT, st.tier_spills, st.tier_spill_errors, st.tier_fetch_hits, st.tier_fetch_misses,
         st.tier_fetch_refused);
  printf("a record: %zu bytes for a block of %zu bytes in the pool\n", kva_prefix_record_size(c), st.block_bytes);

  if (!demo_reference(y_ref)) return 1;
  if (reused_c != PROMPT || memcmp(y_c, y_ref, sizeof y_c) != 0) {
    fprintf(stderr, "prefix_tier: request C %s\n",
            reused_c != PROMPT ? "did not reuse the prompt" : "differs from the request computed from scratch");
    return 1;
  }
  printf("request C's output is bit for bit the one computed from scratch\n");
  kva_cache_destroy(c);
  demo_free();
  if (dir == own) tier_dir_remove(own);
  else printf("the records stay in %s: run again with it to start warm\n", dir);
  return 0;
}
