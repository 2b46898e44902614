#!/bin/sh
# bench/lang/run.sh [BUILD_DIR] [ROUNDS] [ITERS] [STEPS]: per-call overhead of a 1-element float32 allreduce
# (enqueue + wait) from C, Java, Lua and Python (when BUILD_DIR/python is built), in one run at 2 ranks. Each Java and Lua process also times
# the same call made from C in that process, interleaved in blocks with its own calls, so that the
# comparison holds under whatever load the machine has; the standalone C program is the process-level
# reference. ROUNDS rounds of C, Java, Lua, Python in turn; ITERS timed calls per path and round.
# Then, per round, a gradient-set step of ResNet-50 (bench/workloads/resnet50.tsv) from Java and
# Lua (GradientStep.java, gradient_step.lua), each beside the same step on the same set issued from
# C in that process; STEPS timed steps per path and round (default 40).
# Prints each round's rank-0 medians (us) and, at the end, the median over rounds per path and the
# gradient-set ratios binding / C.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
rounds=${2:-3}
iters=${3:-5000}
steps=${4:-40}
warm=$((iters / 5))
workload=$src/bench/workloads/resnet50.tsv
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
       OMPI_MCA_hwloc_base_binding_policy=none
export LUA_PATH_5_4="$build/lua/?.lua;;" LUA_CPATH_5_4="$build/lua/?.so;$build/bench/lang/?.so;;"
jni="-Dconflux.bench.jni=$build/bench/lang/libcfx_bench_loops_jni.so"  # the C loops (loops_jni.c)
cc -std=c11 -O2 -I"$src/capi/include" "$here/overhead.c" -L"$build/capi" -lconflux \
   -Wl,-rpath,"$build/capi" -o "$tmp/overhead_c"
mpi="mpirun -np 2 --timeout 300"
: > "$tmp/all"
r=1
while [ "$r" -le "$rounds" ]; do
  $mpi "$tmp/overhead_c" "$iters" "$warm" | tee -a "$tmp/all"
  $mpi java -XX:+UseSerialGC "$jni" -cp "$build/java/conflux.jar" "$here/Overhead.java" "$iters" 10 | tee -a "$tmp/all"
  $mpi lua5.4 "$here/overhead.lua" "$iters" 10 | tee -a "$tmp/all"
  if [ -d "$build/python/conflux" ]; then
    PYTHONPATH="$build/python:$here${PYTHONPATH:+:$PYTHONPATH}" $mpi "$here/../../.venv/bin/python" "$here/overhead.py" "$iters" 10 |
      tee -a "$tmp/all"
  elif [ "$r" -eq 1 ]; then
    echo "run.sh: no Python rows ($build/python/conflux is not built)"
  fi
  $mpi java -XX:+UseSerialGC "$jni" -cp "$build/java/conflux.jar" "$here/GradientStep.java" "$workload" "$steps" 4 |
    tee -a "$tmp/all"
  $mpi lua5.4 "$here/gradient_step.lua" "$workload" "$steps" 4 | tee -a "$tmp/all"
  r=$((r + 1))
done
echo "--- 1-element allreduce, np 2: median over $rounds rounds of each round's median and p10 (us);"
echo "    each binding next to the C call made in the same process (c-in-java, c-in-lua)"
awk 'function med(list,   a, m, x, y, t) {
       m = split(list, a, " ")
       for (x = 1; x <= m; x++) for (y = x + 1; y <= m; y++) if (a[y] < a[x]) { t = a[x]; a[x] = a[y]; a[y] = t }
       return a[int((m + 1) / 2)]
     }
     { v[$1] = v[$1] " " $2; p[$1] = p[$1] " " $3 }
     # gradient sets: each round'"'"'s ratio binding / C of medians and of minima ($5), same process
     $1 ~ /^c-(gradset|ready)-in-/ { cm[$1] = $2; cmin[$1] = $5 }
     $1 ~ /^(java|lua)-(gradset|ready)$/ {
       c = $1; sub(/^(java|lua)-/, "", c); c = "c-" c "-in-" substr($1, 1, index($1, "-") - 1)
       if (cm[c] > 0 && cmin[c] > 0) { rm[$1] = rm[$1] " " $2 / cm[c]; rn[$1] = rn[$1] " " $5 / cmin[c]; rb[$1] = c }
     }
     END {
       n = split("c c-in-java java-array java-buffer c-in-lua lua-array lua-table", k, " ")
       base["c"] = "c"; base["c-in-java"] = "c"; base["c-in-lua"] = "c"
       base["java-array"] = "c-in-java"; base["java-buffer"] = "c-in-java"
       base["lua-array"] = "c-in-lua"; base["lua-table"] = "c-in-lua"
       if ("c-in-python" in v) {
         split("c-in-python py-numpy py-torch py-torch-new py-torch-async py-horovod", pk, " ")
         base["c-in-python"] = "c"
         for (i = 1; i <= 6; i++) if (pk[i] in v) { k[++n] = pk[i]; if (i > 1) base[pk[i]] = "c-in-python" }
       }
       split("c-gradset-in-java java-gradset c-ready-in-java java-ready c-gradset-in-lua lua-gradset " \
             "c-ready-in-lua lua-ready", gk, " ")
       for (i = 1; i <= 8; i++) if (gk[i] in v) { k[++n] = gk[i]; base[gk[i]] = gk[i - (i + 1) % 2] }
       for (i = 1; i <= n; i++) { m[k[i]] = med(v[k[i]]); q[k[i]] = med(p[k[i]]) }
       printf "%-14s %10s %10s %12s %12s\n", "path", "median", "p10", "median-base", "p10-base"
       for (i = 1; i <= n; i++)
         printf "%-14s %10.2f %10.2f %+12.2f %+12.2f  (base %s)\n", k[i], m[k[i]], q[k[i]],
                m[k[i]] - m[base[k[i]]], q[k[i]] - q[base[k[i]]], base[k[i]]
       if (!("java-gradset" in rm) && !("lua-gradset" in rm)) exit
       printf "--- gradient-set step, ResNet-50 (%s float32 gradients, owned storage, ready in reverse\n", tensors
       printf "    registration order, wait), np 2: each binding / the same step on the same set issued from C\n"
       printf "    in the same process; median over %s rounds of each round'"'"'s ratio of medians and of minima\n", rounds
       printf "    (the -ready rows: the %s ready calls of a step alone, what the binding adds)\n", tensors
       printf "%-34s %8s %8s\n", "ratio", "median", "min"
       split("java-gradset java-ready lua-gradset lua-ready", rk, " ")
       for (i = 1; i <= 4; i++) if (rk[i] in rm)
         printf "%-34s %8.3f %8.3f\n", rk[i] " / " rb[rk[i]], med(rm[rk[i]]), med(rn[rk[i]])
     }' rounds="$rounds" tensors="$(grep -vc '^#' "$workload")" "$tmp/all"
