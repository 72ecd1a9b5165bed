/* bench/main.c - kvattn_bench: memory per token, speed, accuracy and paging of kvattn.h.

   Build:  make bench     (gcc -std=c99 -O3 -march=native -fopenmp -I. on every .c file in bench/, -lm)
   Run:    build/kvattn_bench --help

   Subcommands (the first argument; default "summary"):
     summary    memory per token of every model preset for its own attention and the variants
                (MHA, GQA, MQA, MLA) in F16 / INT8 / INT4 / FP8; the machine; one decode line per variant;
                GQA decode per storage dtype against F16
     memory     bytes per token for MHA / MQA / GQA / MLA of each model per dtype, checked against a
                real cache; the presets against their published configurations; memory vs context
     speed      this machine's read bandwidth, FMA peak and OpenMP fork/join cost, then decode /
                prefill timings, paged vs contiguous, decode thread scaling (1 vs 2 threads, outputs
                compared bitwise), continuous batching (kva_attend_batch vs a loop of
                kva_attend_cache); --sweep: decode against context 1K..128K (ns per cached token)
     quality    output error of each storage dtype against F32 storage and an fp64 reference;
                eviction policies (WINDOW, WINDOW + sinks, H2O) against the full cache; FP8 scale
                calibration rules (kva_fp8_calibrate) and the output error each gives
     paged      decode time against block size and block layout; paged/contiguous ratios;
                memory waste of a request trace (paged vs reservations); a shared system prompt
                across two salted tenants (prefix caching); block operations per second
     plot-data  the CSV that bench/plot.gp draws (memory vs context, decode vs context; --sweep:
                decode to 128K, cold and warm)
     mla        MLA decode: absorbed against naive
     all        memory, speed, quality and paged

   Output: an aligned table (default), --csv (one header, one row per result, the same
   columns for every section, empty where a column does not apply) or --json
   ({"rows": [...]}: per row only the columns that apply). Progress goes to stderr.

   Every figure comes from the library through its public API: kva_cache_bytes_per_token,
   kva_cache_get_stats on a real (small) cache, kva_attend_cache / kva_attend timings.
   The source files are listed in harness.h, with how to add a part. */
#include "harness.h"

/* The CPU's name (Linux: /proc/cpuinfo's "model name"), so that every run's figures say where they
   were measured */
static void cpu_name(char *buf, size_t n) {
  char line[512];
  FILE *f = fopen("/proc/cpuinfo", "r");
  snprintf(buf, n, "CPU unknown");
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) != 0 || !colon) continue;
    colon += 1 + (colon[1] == ' ');
    colon[strcspn(colon, "\n")] = '\0';
    snprintf(buf, n, "%s", colon);
    break;
  }
  fclose(f);
}

int main(int argc, char **argv) {
  opts o;
  set_flags sf;
  machine m;
  const machine *mp;
  int rc, need_machine;
  const char *cmd;
  FILE *outf = NULL;
  char path[1024], cpu[256];
  g_out = stdout;
  if ((rc = parse_args(argc, argv, &o, &sf)) != 0) return rc;
  cmd = o.cmd;
  if (!strcmp(cmd, "plot-data")) {
    if (g_fmt == OUT_TABLE) g_fmt = OUT_CSV;
    if (o.out_dir) {
      snprintf(path, sizeof path, "%s/bench.csv", o.out_dir);
      if (!(outf = fopen(path, "w"))) {
        fprintf(stderr, "kvattn_bench: cannot write %s\n", path);
        return 2;
      }
      g_out = outf;
    }
  }
  if (o.quick) {
    if (o.bw_bytes > 256 * MiB) o.bw_bytes = 256 * MiB;
    if (o.flush_bytes > 128 * MiB) o.flush_bytes = 128 * MiB;
  }
  g_reps_exact = o.reps_set;
  if (g_fmt == OUT_CSV) csv_header();
  else if (g_fmt == OUT_JSON) {
    fprintf(g_out, "{\"tool\": \"kvattn_bench\", \"bench_version\": \"%s\", \"kvattn_version\": \"%s\", "
                   "\"simd\": \"%s\", \"subcommand\": \"%s\", \"rows\": [",
            BENCH_VERSION, KVATTN_VERSION_STRING, kva_simd_name(), cmd);
  }
  cpu_name(cpu, sizeof cpu);
  if (!strcmp(cmd, "summary"))
    text("kvattn_bench: attention variants compared by memory per token, speed and accuracy\n"
         "(kvattn %s, kernels %s, %d OpenMP thread(s), %s; --full: every table; --help)\n",
         KVATTN_VERSION_STRING, kva_simd_name(), max_threads(), cpu);
  else
    text("kvattn_bench %s: kvattn %s, kernels %s, %d OpenMP thread(s), %s\n", cmd, KVATTN_VERSION_STRING,
         kva_simd_name(), max_threads(), cpu);

  need_machine = strcmp(cmd, "memory") != 0 && strcmp(cmd, "quality") != 0 && strcmp(cmd, "mla") != 0 &&
                 (strcmp(cmd, "paged") != 0 || (o.parts & PART_ATTN));
  mp = need_machine ? &m : NULL;
  if (!strcmp(cmd, "mla")) cmd_mla(o.quick);

  if (!strcmp(cmd, "summary")) {
    defaults_for(&o, &sf, "memory");
    memory_summary(&o);
  } else if (!strcmp(cmd, "memory") || !strcmp(cmd, "all")) {
    defaults_for(&o, &sf, "memory");
    cmd_memory(&o);
  } else if (!strcmp(cmd, "plot-data")) {
    defaults_for(&o, &sf, "memory");
    memory_curve(&o, 0);
  }
  if (need_machine) {
    defaults_for(&o, &sf, !strcmp(cmd, "all") ? "speed" : cmd);
    flush_init(o.flush_bytes);
    pool_init(o.seed);
    machine_measure(&m, &o, o.threads, o.n_threads);
  }
  if (!strcmp(cmd, "summary")) {
    defaults_for(&o, &sf, "summary");
    summary_speed(&o, &m);
  } else if (!strcmp(cmd, "speed") || !strcmp(cmd, "all")) {
    defaults_for(&o, &sf, "speed");
    run_parts("speed", &o, &m);
  } else if (!strcmp(cmd, "plot-data")) {
    rows t = {0};
    defaults_for(&o, &sf, "plot-data");
    if (o.sweep) sweep_opts(&o); /* 1K..128K, f16, cold and warm */
    else if (!sf.dtypes) { o.dtypes[0] = KVA_F16; o.dtypes[1] = KVA_BF16; o.dtypes[2] = KVA_F32; o.n_dtypes = 3; }
    if (!o.reps_set) o.reps = o.quick ? 2 : 3;
    run_decode(&o, &m, &t);
    rows_sort_series(&t);
    emit_rows(&t);
    rows_free(&t);
  }
  if (!strcmp(cmd, "quality") || !strcmp(cmd, "all")) {
    defaults_for(&o, &sf, "quality");
    run_parts("quality", &o, mp);
  }
  if (!strcmp(cmd, "paged") || !strcmp(cmd, "all")) {
    defaults_for(&o, &sf, "paged");
    run_parts("paged", &o, mp);
  }

  if (g_fmt == OUT_JSON) fprintf(g_out, "\n]}\n");
  if (g_goals)
    text("\nspeed goals: %d of %d met on this machine (goals to aim at, not checks: a missed one fails nothing)",
         g_goals_met, g_goals);
  text("\n%s\n", g_failed ? "SOME CHECKS FAILED (see FAIL / ERROR / MISMATCH above)"
                          : "all checks passed (correctness: sizes, results against references)");
  if (outf) {
    fclose(outf);
    fprintf(stderr, "wrote %s\n", path);
    if (system("command -v gnuplot >/dev/null 2>&1") == 0) {
      char cmdline[3000];
      snprintf(cmdline, sizeof cmdline, "gnuplot -e \"datafile='%s'; outdir='%s'\" bench/plot.gp", path, o.out_dir);
      fprintf(stderr, "%s\n", cmdline);
      if (system(cmdline) != 0) fprintf(stderr, "gnuplot failed (run it from the project root)\n");
    } else fprintf(stderr, "gnuplot not found: apt-get install gnuplot-nox, then run bench/plot.gp\n");
  }
  pool_free();
  return g_failed ? 1 : 0;
}

