# bench/plot.gp - charts of kvattn_bench's CSV (gnuplot >= 5.2; Debian/Ubuntu: apt-get install gnuplot-nox)
#
#   make plot                             # plot-data: memory curves + decode at 1K..32K tokens (about a minute)
#   make plot BENCH_ARGS=--sweep          # decode at 1K..128K, f16, cold and warm (a few minutes)
#   make plot BENCH_ARGS='--mem 24'       # the memory chart's budget line at 24 GiB (default: the bench's 80)
#   build/kvattn_bench plot-data --out build   # the same without make (writes build/bench.csv, runs this)
#   gnuplot -e "datafile='build/bench.csv'; outdir='build'" bench/plot.gp
#
# Reads the single-header CSV of `kvattn_bench --csv` (rows of every section share one set of
# columns; series are picked by the section/variant/dtype/threads/mode columns: gnuplot breaks a
# line at every row a filter drops, so the bench writes each series' rows together) and writes
#   outdir/kv_memory.png   KV cache per sequence against context: Llama-3-70B's MHA/GQA/MQA/MLA
#                          variants in f16 with Mistral-7B's window cap (left), GQA per dtype (right);
#                          the dashed line is the run's --mem budget, its size in the legend
#   outdir/decode.png      decode time per call against context for each variant (f16, 1 thread,
#                          cold caches) with the DRAM floor (KV bytes / measured bandwidth, dashed)
#                          (left); GQA's KV GB/s per dtype the CSV has (f16, bf16, f32) against the
#                          measured bandwidth (right)
#   outdir/decode_per_token.png  decode ns per cached token against context per variant, cold (solid)
#                          and, when the CSV has them (plot-data --sweep), warm (dashed): the linear
#                          cost and the cache-to-DRAM step
# A series the CSV does not have is left out of the chart and its legend.

if (!exists("datafile")) datafile = "build/bench.csv"
if (!exists("outdir")) outdir = "build"

set datafile separator ","
set datafile columnheaders
set terminal pngcairo size 1500,560 font "sans,10" noenhanced
set grid xtics ytics mxtics mytics lc rgb "#dddddd"
# left-aligned legend text after its sample, with room to spare inside the box
set key top left box opaque Left reverse width 2
set logscale x 2
set xtics ("1K" 1024, "4K" 4096, "16K" 16384, "64K" 65536, "256K" 262144, "1M" 1048576)
set xlabel "context (tokens)"

# series filters: a row's value, or NaN (dropped) when the row is not in the series
sec(s) = strcol("section") eq s
is(col, v) = strcol(col) eq v
mem(m, v, d) = (sec("memcurve") && is("model", m) && is("variant", v) && is("dtype", d)) ? column("bytes_at_ctx") / 2**30 : NaN
dec(v, d) = sec("decode") && is("variant", v) && is("dtype", d) && column("threads") == 1 && is("mode", "cold")
budget(dummy) = sec("memcurve") ? column("mem_budget") / 2**30 : NaN

# what the CSV holds (a series with no rows would still have a legend entry)
stats datafile using (sec("memcurve") && column("mem_budget") > 0 ? column("mem_budget") / 2**30 : 0) nooutput
budget_gib = STATS_max
stats datafile using (dec("GQA", "bf16") ? 1 : 0) nooutput
has_bf16 = STATS_sum > 0
stats datafile using (dec("GQA", "f32") ? 1 : 0) nooutput
has_f32 = STATS_sum > 0
stats datafile using (sec("decode") && is("mode", "warm") && column("threads") == 1 ? 1 : 0) nooutput
has_warm = STATS_sum > 0

# ---- memory
set output outdir . "/kv_memory.png"
set multiplot layout 1,2 title "KV cache per sequence (all layers, K+V), from kva_cache_bytes_per_token"
set logscale y 2
set ylabel "GiB per sequence"
set format y "%g"
set title "Llama-3-70B variants (f16); Mistral-7B window cap"
plot datafile using "ctx":(mem("Llama-3-70B", "MHA", "f16")) smooth unique with linespoints lw 2 pt 7 title "MHA (64 KV heads)", \
     "" using "ctx":(mem("Llama-3-70B", "GQA", "f16")) smooth unique with linespoints lw 2 pt 5 title "GQA (8 KV heads)", \
     "" using "ctx":(mem("Llama-3-70B", "MLA", "f16")) smooth unique with linespoints lw 2 pt 9 title "MLA (512+64 latent)", \
     "" using "ctx":(mem("Llama-3-70B", "MQA", "f16")) smooth unique with linespoints lw 2 pt 11 title "MQA (1 KV head)", \
     "" using "ctx":(mem("Mistral-7B", "GQA", "f16")) smooth unique with linespoints lw 2 pt 13 title "Mistral-7B GQA (window 4096)", \
     "" using "ctx":(budget(0)) smooth unique with lines dt 2 lw 2 lc rgb "black" title sprintf("%.0f GiB budget (bench --mem)", budget_gib)
set title "Llama-3-70B GQA per storage dtype"
plot datafile using "ctx":(mem("Llama-3-70B", "GQA", "f32")) smooth unique with linespoints lw 2 pt 7 title "f32", \
     "" using "ctx":(mem("Llama-3-70B", "GQA", "f16")) smooth unique with linespoints lw 2 pt 5 title "f16", \
     "" using "ctx":(mem("Llama-3-70B", "GQA", "bf16")) smooth unique with lines lw 2 dt 3 title "bf16 (= f16)", \
     "" using "ctx":(mem("Llama-3-70B", "GQA", "int8")) smooth unique with linespoints lw 2 pt 9 title "int8 (+ fp32 scale per token, head)", \
     "" using "ctx":(mem("Llama-3-70B", "GQA", "int4")) smooth unique with linespoints lw 2 pt 3 title "int4 (+ fp32 scale, min per 32 values)", \
     "" using "ctx":(mem("Llama-3-70B", "GQA", "fp8_e4m3")) smooth unique with linespoints lw 2 pt 11 title "fp8 e4m3", \
     "" using "ctx":(mem("Llama-3-70B", "GQA", "fp8_e5m2")) smooth unique with lines lw 2 dt 3 title "fp8 e5m2 (= e4m3)", \
     "" using "ctx":(budget(0)) smooth unique with lines dt 2 lw 2 lc rgb "black" title sprintf("%.0f GiB budget (bench --mem)", budget_gib)
unset multiplot

# ---- decode
set output outdir . "/decode.png"
set xtics ("1K" 1024, "2K" 2048, "4K" 4096, "8K" 8192, "16K" 16384, "32K" 32768, "64K" 65536, "128K" 131072)
set autoscale x
set offsets graph 0.03, graph 0.03, 0, 0
set multiplot layout 1,2 title "Decode (n_q=1, kva_attend_cache), H=32 G=8 D=128 and its variants, 1 thread, cold caches"
set ylabel "ms per call (median)"
set title "time per call (f16) and the DRAM floor (dashed)"
set key top left
plot datafile using (dec("MHA", "f16") ? column("ctx") : NaN):(dec("MHA", "f16") ? 1e3 * column("time_med_s") : NaN) smooth unique with linespoints lw 2 pt 7 lc 1 title "MHA", \
     "" using (dec("MHA", "f16") ? column("ctx") : NaN):(dec("MHA", "f16") ? 1e3 * column("kv_bytes") / column("bw_gbps") / 1e9 : NaN) smooth unique with lines dt 2 lc 1 notitle, \
     "" using (dec("GQA", "f16") ? column("ctx") : NaN):(dec("GQA", "f16") ? 1e3 * column("time_med_s") : NaN) smooth unique with linespoints lw 2 pt 5 lc 2 title "GQA", \
     "" using (dec("GQA", "f16") ? column("ctx") : NaN):(dec("GQA", "f16") ? 1e3 * column("kv_bytes") / column("bw_gbps") / 1e9 : NaN) smooth unique with lines dt 2 lc 2 notitle, \
     "" using (dec("MQA", "f16") ? column("ctx") : NaN):(dec("MQA", "f16") ? 1e3 * column("time_med_s") : NaN) smooth unique with linespoints lw 2 pt 11 lc 3 title "MQA", \
     "" using (dec("MQA", "f16") ? column("ctx") : NaN):(dec("MQA", "f16") ? 1e3 * column("kv_bytes") / column("bw_gbps") / 1e9 : NaN) smooth unique with lines dt 2 lc 3 notitle, \
     "" using (dec("MLA", "f16") ? column("ctx") : NaN):(dec("MLA", "f16") ? 1e3 * column("time_med_s") : NaN) smooth unique with linespoints lw 2 pt 9 lc 4 title "MLA", \
     "" using (dec("MLA", "f16") ? column("ctx") : NaN):(dec("MLA", "f16") ? 1e3 * column("kv_bytes") / column("bw_gbps") / 1e9 : NaN) smooth unique with lines dt 2 lc 4 notitle
unset logscale y
set key below horizontal
set bmargin 6
set ylabel "KV GB/s"
set yrange [0:*]
set title "GQA: KV bytes read per second against the measured read bandwidth"
# the dtypes the CSV has (the default summary run: f16 only)
plot datafile using (dec("GQA", "f16") ? column("ctx") : NaN):(dec("GQA", "f16") ? column("gbps") : NaN) smooth unique with linespoints lw 2 pt 5 lc 2 title "f16", \
     for [k = 1:has_bf16] "" using (dec("GQA", "bf16") ? column("ctx") : NaN):(dec("GQA", "bf16") ? column("gbps") : NaN) smooth unique with linespoints lw 2 pt 9 lc 6 title "bf16", \
     for [k = 1:has_f32] "" using (dec("GQA", "f32") ? column("ctx") : NaN):(dec("GQA", "f32") ? column("gbps") : NaN) smooth unique with linespoints lw 2 pt 7 lc 7 title "f32", \
     "" using (dec("GQA", "f16") ? column("ctx") : NaN):(dec("GQA", "f16") ? column("bw_gbps") : NaN) smooth unique with lines dt 2 lw 2 lc rgb "black" title "read bandwidth (1 thread)"
unset multiplot

# ---- decode cost per cached token (plot-data --sweep: 1K..128K, cold and warm; else cold only)
pt(v, md) = sec("decode") && is("variant", v) && is("dtype", "f16") && column("threads") == 1 && is("mode", md)
nspt(v, md) = pt(v, md) ? 1e9 * column("time_med_s") / column("ctx") : NaN
ctxof(v, md) = pt(v, md) ? column("ctx") : NaN
set terminal pngcairo size 1100,640 font "sans,10" noenhanced
set output outdir . "/decode_per_token.png"
unset multiplot
if (has_warm) {
  set title "Decode cost per cached token (kva_attend_cache, f16, 1 thread; solid: cold caches, dashed: warm)\nflat = linear cost; warm climbs to cold where the KV of one call outgrows the caches"
} else {
  set title "Decode cost per cached token (kva_attend_cache, f16, 1 thread, cold caches)\nflat = linear cost (make plot BENCH_ARGS=--sweep adds warm caches to 128K tokens)"
}
set key inside top left box opaque vertical Left reverse width 2
set bmargin
set yrange [*:*]
set logscale y 2
set ylabel "ns per cached token (median time / ctx)"
plot datafile using (ctxof("MHA", "cold")):(nspt("MHA", "cold")) smooth unique with linespoints lw 2 pt 7 lc 1 title "MHA", \
     for [k = 1:has_warm] "" using (ctxof("MHA", "warm")):(nspt("MHA", "warm")) smooth unique with linespoints lw 2 dt 2 pt 6 lc 1 notitle, \
     "" using (ctxof("GQA", "cold")):(nspt("GQA", "cold")) smooth unique with linespoints lw 2 pt 5 lc 2 title "GQA", \
     for [k = 1:has_warm] "" using (ctxof("GQA", "warm")):(nspt("GQA", "warm")) smooth unique with linespoints lw 2 dt 2 pt 4 lc 2 notitle, \
     "" using (ctxof("MQA", "cold")):(nspt("MQA", "cold")) smooth unique with linespoints lw 2 pt 11 lc 3 title "MQA", \
     for [k = 1:has_warm] "" using (ctxof("MQA", "warm")):(nspt("MQA", "warm")) smooth unique with linespoints lw 2 dt 2 pt 10 lc 3 notitle, \
     "" using (ctxof("MLA", "cold")):(nspt("MLA", "cold")) smooth unique with linespoints lw 2 pt 9 lc 4 title "MLA", \
     for [k = 1:has_warm] "" using (ctxof("MLA", "warm")):(nspt("MLA", "warm")) smooth unique with linespoints lw 2 dt 2 pt 8 lc 4 notitle
print "wrote " . outdir . "/kv_memory.png, " . outdir . "/decode.png and " . outdir . "/decode_per_token.png"
