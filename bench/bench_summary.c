/* bench/bench_summary.c - kvattn_bench summary (the default, what `make bench` runs). */
#include "harness.h"

/* one decode line per variant, then GQA decode per storage dtype */
void summary_speed(const opts *o, const machine *m) {
  rows t = {0};
  run_decode(o, m, &t);
  print_decode(&t, "Decode summary: one query token over an F16 cache (H=32 G=8 D=128 and its MHA/MQA/MLA\n"
                   "  variants), 1 thread, cold caches; /BW = KV bytes per second over the read bandwidth above\n"
                   "  (`kvattn_bench speed` for dtypes, threads, warm caches, prefill; --help for all)");
  emit_rows(&t);
  rows_free(&t);
  run_dtype_block(o, m, &t);
  print_dtype_block(&t, o);
  emit_rows(&t);
  rows_free(&t);
}
