#!/bin/sh
# The timeline's overhead on the ResNet-50 gradient set, 2 ranks (docs/timeline.md):
#   A = a build with CONFLUX_TIMELINE=OFF (hooks compiled out), timeline off
#   B = the normal build, timeline off (the hooks' NULL checks)
#   C = the normal build, CFX_TIMELINE on
# Runs A, B, C in turn REPEATS times (interleaved, so machine noise hits all three alike); each run
# gives rank 0's median step time (wall) and its CPU time per step (all its threads, the timeline
# writer included; far less sensitive to other load on the machine); prints the median and the
# minimum over runs of each. Then AB: one
# job of the normal build alternating blocks of 5 steps off / on (cfx_timeline_start/stop), the
# least noise-sensitive on-vs-off figure, REPEATS/2+1 times.
#   tests/observe/bench_timeline.sh BUILD_NOTL BUILD [REPEATS] [STEPS] [NP]
set -eu
notl=$1 build=$2 repeats=${3:-7} steps=${4:-200} np=${5:-2}
here=$(cd "$(dirname "$0")" && pwd)
tsv=$here/../../bench/workloads/resnet50.tsv
out=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
       OMPI_MCA_hwloc_base_binding_policy=none
run() { # build extra-env...
    b=$1; shift
    env "$@" mpirun -n "$np" "$b/tests/observe/observe_timeline" bench "$steps" "$tsv" |
        awk '/median_step_ms/ {print $2 > "/dev/stderr"; print $4}' 2>> "$out/wall.$tag"
}
for i in $(seq "$repeats"); do
    tag=A; run "$notl" >> "$out/cpu.A"
    tag=B; run "$build" >> "$out/cpu.B"
    tag=C; run "$build" CFX_TIMELINE="$out/tl.json" >> "$out/cpu.C"
done
ls -l "$out"/tl.rank*.json | awk '{s+=$5} END {print "timeline bytes of one C run (all ranks):", s}'
for i in $(seq $((repeats / 2 + 1))); do
    mpirun -n "$np" "$build/tests/observe/observe_timeline" abtest $((steps * 2)) "$tsv" "$out" |
        awk '/median_off_ms/ {print $2, $4}' >> "$out/AB"
done
med() { sort -g "$1" | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
min() { sort -g "$1" | head -1; }
for m in wall cpu; do
    for k in A B C; do
        echo "$m $k runs (ms per step): $(tr '\n' ' ' < "$out/$m.$k")"
    done
    a=$(med "$out/$m.A") b=$(med "$out/$m.B") c=$(med "$out/$m.C")
    am=$(min "$out/$m.A") bm=$(min "$out/$m.B") cm=$(min "$out/$m.C")
    echo "$m: median over runs: A no-hooks build $a ms, B off $b ms, C on $c ms"
    echo "$m: minimum over runs: A $am ms, B $bm ms, C $cm ms"
    awk -v a="$a" -v b="$b" -v c="$c" -v m="$m" 'BEGIN {printf "%s medians: off vs no hooks %+.2f%%, on vs off %+.2f%%\n", m, 100*(b/a-1), 100*(c/b-1)}'
    awk -v a="$am" -v b="$bm" -v c="$cm" -v m="$m" 'BEGIN {printf "%s minimums: off vs no hooks %+.2f%%, on vs off %+.2f%%\n", m, 100*(b/a-1), 100*(c/b-1)}'
done
echo "AB runs (off ms, on ms): $(tr '\n' ';' < "$out/AB")"
awk '{print $2/$1}' "$out/AB" > "$out/ABr"
awk -v r="$(med "$out/ABr")" 'BEGIN {printf "AB: on vs off, median over runs of the in-job ratio: %+.2f%%\n", 100*(r-1)}'
rm -rf "$out"
