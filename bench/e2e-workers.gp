# Messages/s against workers for the native and Lua designs of wxguard and the naive design, from
# `wxguard-bench e2e --designs native,lua --naive --plot bench/e2e-workers.dat` (bench/native.md
# §5 has the command and the table). Run from the repository root: gnuplot bench/e2e-workers.gp
set terminal pngcairo size 800,500 font "DejaVu Sans,11"
set output "bench/e2e-workers.png"
set title "End to end through the consumer (noop plugin, 30% duplicates, 130,000 records)"
set xlabel "workers"
set ylabel "messages/s"
set logscale x 2
set xtics (1, 2, 4, 8, 16)
set yrange [0:*]
set xrange [0.8:20]
set grid
set key bottom right
plot "bench/e2e-workers.dat" using 1:2 with linespoints lw 2 pt 7 title "native (pipelined native commands)", \
     "bench/e2e-workers.dat" using 1:3 with linespoints lw 2 pt 9 title "lua (batched scripts)", \
     "bench/e2e-workers.dat" using 1:4 with linespoints lw 2 pt 5 title "naive (SET NX + SET EX per message)"
