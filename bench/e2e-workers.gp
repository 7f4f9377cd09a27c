# Messages/s against workers for wxguard and the naive design, from `wxguard-bench e2e --naive
# --plot bench/e2e-workers.dat`. Run from the repository root: gnuplot bench/e2e-workers.gp
set terminal pngcairo size 800,500 font "DejaVu Sans,11"
set output "bench/e2e-workers.png"
set title "End to end through wxguard-consumer (noop plugin, 30% duplicates, 200,000 records, run N)"
set xlabel "workers"
set ylabel "messages/s"
set logscale x 2
set xtics (1, 2, 4, 8, 16)
set yrange [0:*]
set xrange [0.8:20]
set grid
set key bottom right
plot "bench/e2e-workers.dat" using 1:2 with linespoints lw 2 pt 7 title "wxguard (batched claims, compact markers)", \
     "bench/e2e-workers.dat" using 1:3 with linespoints lw 2 pt 5 title "naive (SET NX + SET EX per message)"
