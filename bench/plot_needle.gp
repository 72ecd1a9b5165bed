# bench/plot_needle.gp - needle-in-a-haystack charts of `kvattn_bench quality --parts needle --csv`
# (gnuplot >= 5.2; Debian/Ubuntu: apt-get install gnuplot-nox)
#
#   make plot                     # also runs the needle part on bench/retrieval (--quick) and this script
#   gnuplot -e "datafile='build/needle.csv'; outdir='build'" bench/plot_needle.gp
#
# Reads the rows of section "needle" (one per configuration, kind, context length and depth: the
# share of cases answered right) and "needle_all" (one per configuration and kind: over every depth
# and length; a policy's budgets on consecutive rows) and writes
#   outdir/needle_single.png, outdir/needle_multi.png  the standard needle picture: accuracy by the
#       needle's depth (y) and the context length (x), one panel per configuration (full cache,
#       quantized storage, eviction at 20 % of the context), green right, red wrong
#   outdir/needle_budget.png  accuracy (over every depth and length) against the eviction budget
#       (share of the context kept) per policy, single key (left) and multi-key (right), with the
#       f32 cache's accuracy as the line to reach

if (!exists("datafile")) datafile = "build/needle.csv"
if (!exists("outdir")) outdir = "build"

set datafile separator ","
set datafile columnheaders
set terminal pngcairo size 1600,760 font "sans,10" noenhanced

cell(kind, name) = strcol("section") eq "needle" && strcol("mode") eq kind && strcol("name") eq name
evicted(kind, pol, sinks) = strcol("section") eq "needle_all" && strcol("mode") eq kind && \
                            strcol("policy") eq pol && column("n_sink") == sinks
full(kind) = strcol("section") eq "needle_all" && strcol("mode") eq kind && strcol("name") eq "f32"

array panel[8] = ["f32", "int8", "int4", "int4 rotated K", "fp8_e4m3 calibrated", \
                  "WINDOW 20%", "WINDOW 20% + 4 sinks", "H2O 20% (4 sinks)"]

set palette defined (0 "#d73027", 0.5 "#fee08b", 1 "#1a9850")
set cbrange [0:1]
set logscale x 2
set xrange [700:3000]
set xtics ("1K" 1024, "2K" 2048)
set yrange [1:0]
set ytics ("0.1" 0.1, "0.25" 0.25, "0.5" 0.5, "0.75" 0.75, "0.9" 0.9)
set xlabel "context (tokens)"
set ylabel "needle depth"
unset key
unset colorbox

do for [kind in "single multi"] {
  set output outdir . "/needle_" . kind . ".png"
  set multiplot layout 2,4 title sprintf("Needle retrieval, %s: share of cases answered right (greedy exact match) by depth and context length", \
      kind eq "single" ? "one pass key" : "4 named keys, one asked")
  do for [i = 1:8] {
    set title panel[i]
    plot datafile using (cell(kind, panel[i]) ? column("ctx") : NaN):(column("needle_depth")):(column("value")) \
         with points pt 5 ps 5 palette, \
         "" using (cell(kind, panel[i]) ? column("ctx") : NaN):(column("needle_depth")):(sprintf("%.0f", 100 * column("value")) . "%") \
         with labels font "sans,9"
  }
  unset multiplot
}

# ---- accuracy against the eviction budget
set output outdir . "/needle_budget.png"
set terminal pngcairo size 1500,560 font "sans,10" noenhanced
unset logscale x
set xrange [0:0.55]
set xtics ("10%%" 0.1, "20%%" 0.2, "50%%" 0.5)
set yrange [-0.02:1.02]
set ytics autofreq
set xlabel "eviction budget (share of the context kept)"
set ylabel "accuracy (every depth and length)"
set key bottom right box opaque
stats datafile using (full("single") ? column("value") : NaN) nooutput
f32_single = STATS_mean
stats datafile using (full("multi") ? column("value") : NaN) nooutput
f32_multi = STATS_mean
set multiplot layout 1,2 title "Needle retrieval under eviction (F32 storage): accuracy against the budget, per policy"
do for [kind in "single multi"] {
  set title kind eq "single" ? "single key" : "multi-key"
  f32 = kind eq "single" ? f32_single : f32_multi
  plot datafile using (evicted(kind, "WINDOW", 0) ? column("budget_frac") : NaN):(column("value")) \
         with linespoints lw 2 pt 7 title "WINDOW", \
       "" using (evicted(kind, "WINDOW", 4) ? column("budget_frac") : NaN):(column("value")) \
         with linespoints lw 2 pt 5 title "WINDOW + 4 sinks", \
       "" using (evicted(kind, "H2O", 4) ? column("budget_frac") : NaN):(column("value")) \
         with linespoints lw 2 pt 9 title "H2O (4 sinks, half recent)", \
       f32 with lines dt 2 lw 2 lc rgb "black" title sprintf("full f32 cache (%.0f", 100 * f32) . "%)"
}
unset multiplot
