#!/bin/sh
# bench/hosts.sh - the model steps across two pretend hosts (tests/hosts/cfxhosts: network
# namespaces joined by a shaped link), Conflux with the hierarchical allreduce on and off, against
# the MPI baselines over the same link, in one table; and compression off and on, with the bytes
# each step put on the link, in a second.
#
#   bench/hosts.sh [--build-dir DIR] [--hosts a:2,b:2] [--rate 10gbit] [--delay 50us]
#                  [--only resnet50,bert_base,vgg16] [--rounds N] [--full] [--no-compression]
#                  [--out DIR]
#
# Runs build/bench/cfx_bench (bench/conflux_bench.c; built here if missing) three times through
# tests/hosts/hostrun, which checks where every rank ran and which allreduce path the engine took:
#   1. CFX_HIERARCHICAL_ALLREDUCE unset (auto: shared memory in each host, MPI between them),
#      with the MPI baselines (mpi_flat, mpi_per_tensor, mpi_chunk_1M/4M/16M);
#   2. CFX_HIERARCHICAL_ALLREDUCE=0 (MPI carries every allreduce), Conflux rows only;
#   3. --compression on the hierarchical path: the conflux step with wire compression off, fp16 and
#      bf16 in the same rounds (cfx_allreduce_async_opts; the results checked: within the 16-bit
#      rounding of the exact sum, 16-bit values, the same bits on every rank), unless
#      --no-compression.
# Every run counts the bytes each host sends on its link (cfx0's tx_bytes, cfx_bench --wire-iface),
# summed over the hosts, per step; a compressed step that sends more than 0.7 x the uncompressed
# step's bytes fails the run.
# --rounds N repeats the runs N times, alternating, so that a machine whose load changes hits them
# alike. Each run uses --quick (4 timed repeats) unless --full (10). The tables (markdown, on stdout
# and in OUT/hosts.md) give, per workload, the median over rounds of each run's median step time
# (with the range over rounds when N > 1): first each Conflux method both ways and the best MPI
# baseline, then compression off/fp16/bf16 with their ratios and their bytes on the link, with the
# link as the harness shaped it. Raw rows: OUT/hierR.csv, OUT/flatR.csv, OUT/compR.csv for round R;
# logs beside them.
# Needs root (namespaces); without it, says so and exits 77.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
hosts=a:2,b:2
rate=10gbit
delay=50us
only=resnet50,bert_base,vgg16
mode=--quick
rounds=1
compression=1
out=

while [ $# -gt 0 ]; do
    case $1 in
        --build-dir) build=$2; shift 2 ;;
        --hosts) hosts=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --delay) delay=$2; shift 2 ;;
        --only) only=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --full) mode=; shift ;;
        --no-compression) compression=0; shift ;;
        --out) out=$2; shift 2 ;;
        -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
        *) echo "bench/hosts.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
out=${out:-$build/bench/hosts-$rate}

if [ "$(id -u)" -ne 0 ]; then
    echo "bench/hosts.sh: SKIP: needs root (the pretend hosts are network namespaces)" >&2
    exit 77
fi
bench=$build/bench/cfx_bench
if [ ! -x "$bench" ]; then
    [ -f "$build/CMakeCache.txt" ] ||
        cmake -G Ninja -S "$root" -B "$build" -DPython3_EXECUTABLE=/usr/bin/python3 >/dev/null
    cmake --build "$build" --target cfx_bench >/dev/null
fi
mkdir -p "$out"
export CFXHOSTS_RATE=$rate CFXHOSTS_DELAY=$delay

# run NAME PATH [VAR=VALUE...] -- BENCH-ARGS...: one cfx_bench run on the hosts, log in OUT/NAME.log.
run() {
    name=$1 path=$2
    shift 2
    vars=
    while [ "$1" != -- ]; do vars="$vars $1"; shift; done
    shift
    echo "bench/hosts.sh: $name ($hosts, $rate, $delay) ..." >&2
    # shellcheck disable=SC2086
    if ! env $vars "$root/tests/hosts/hostrun" --hosts "$hosts" --path "$path" --timeout 3000 -- \
            "$bench" $mode --only "$only" --workloads "$root/bench/workloads" \
            --raw "$out/$name.csv" --wire-iface cfx0 "$@" >"$out/$name.log" 2>&1; then
        tail -n 40 "$out/$name.log" >&2
        echo "bench/hosts.sh: the $name run failed (log: $out/$name.log)" >&2
        exit 1
    fi
}

case $rounds in ''|*[!0-9]*|0) echo "bench/hosts.sh: --rounds needs a positive integer" >&2; exit 2 ;; esac
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M UTC')
r=1
while [ $r -le "$rounds" ]; do
    run hier$r hierarchical --
    run flat$r mpi CFX_HIERARCHICAL_ALLREDUCE=0 -- --no-mpi
    [ "$compression" -eq 0 ] || run comp$r hierarchical -- --compression --no-mpi
    r=$((r + 1))
done

load_end=$(cut -d' ' -f1-3 /proc/loadavg)
link=$(sed -n 's/^cfxhosts: hosts .* up on [^,]*, link //p' "$out/hier1.log" | head -n 1)
/usr/bin/python3 - "$out" "$hosts" "$link" "$rounds" "$started" "$load_start" "$load_end" \
    "$compression" <<'EOF' | tee "$out/hosts.md"
import csv, os, statistics, sys

out, hosts, link, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
started, load_start, load_end, compression = sys.argv[5:9]
rows = {}  # (run, workload, method) -> [median_s of each round]; METHOD.wire_bytes: bytes
checks = {}  # (run, workload, method) -> the checks of the rounds
nbytes = {}
for run in ("hier", "flat") + (("comp",) if compression == "1" else ()):
    for k in range(1, rounds + 1):
        with open(os.path.join(out, f"{run}{k}.csv")) as f:
            for r in csv.DictReader(f):
                if r["group"] == "idle":  # the idle context's CPU, not a step
                    continue
                rows.setdefault((run, r["workload"], r["method"]), []).append(float(r["median_s"]))
                checks.setdefault((run, r["workload"], r["method"]), set()).add(r["check"])
                nbytes[r["workload"]] = int(r["bytes"])
workloads = list(dict.fromkeys(w for (_, w, _) in rows))
methods = [m for m in dict.fromkeys(m for (run, _, m) in rows if run == "flat")
           if m.startswith("conflux") and not m.endswith(".wire_bytes")]


def med(run, w, m):
    v = rows.get((run, w, m))
    return statistics.median(v) if v else None


def ms(t):
    return "—" if t is None else f"{t * 1e3:.0f}"


def spread(run, w, m):
    v = rows.get((run, w, m))
    if not v:
        return "—"
    return ms(statistics.median(v)) + (f" ({ms(min(v))}–{ms(max(v))})" if len(v) > 1 else "")


ranks = sum(int(e.partition(":")[2] or 1) for e in hosts.split(","))
print(f"Two hosts ({hosts}), link {link}; step time in ms, median over {rounds} round(s) of each "
      f"run's median{' (range over rounds)' if rounds > 1 else ''}; {ranks} ranks on "
      f"{os.cpu_count()} cores; started {started}, load average (1/5/15 min) {load_start} at the "
      f"start, {load_end} at the end.\n")
head = ["workload", "MiB", "best MPI (which)"]
for m in methods:
    head += [f"{m} hier", f"{m} flat", "hier/flat", "hier/MPI"]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for w in workloads:
    mpi = [(med("hier", w, m), m) for (run, ww, m) in rows
           if run == "hier" and ww == w and m.startswith("mpi_") and not m.endswith(".wire_bytes")]
    best, which = min(mpi) if mpi else (None, "")
    cells = [w, f"{nbytes[w] / 2**20:.0f}", f"{spread('hier', w, which)} ({which})"]
    for m in methods:
        h, f_ = med("hier", w, m), med("flat", w, m)
        cells += [spread("hier", w, m), spread("flat", w, m), f"{h / f_:.2f}" if h and f_ else "—",
                  f"{h / best:.2f}" if h and best else "—"]
    print("| " + " | ".join(cells) + " |")

if compression == "1":
    def mb(run, w, m):
        v = med(run, w, m + ".wire_bytes")
        return "—" if v is None else f"{v / 1e6:.1f}"

    def ratio(a, b):
        return f"{a / b:.2f}" if a and b else "—"
    print(f"\nCompression on the link between the hosts (the hierarchical path; the conflux step with "
          f"compression off, fp16 and bf16 in the same rounds): step time in ms as above; wire MB: the "
          f"bytes the hosts sent on their link per step (all hosts together, headers and the "
          f"barriers' bytes included); MPI flat's bytes from the first table's run.\n")
    head = ["workload", "MiB", "off", "fp16", "bf16", "fp16/off", "bf16/off", "wire MB off",
            "wire MB fp16", "wire MB bf16", "wire fp16/off", "wire MPI flat", "check"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for w in workloads:
        if med("comp", w, "conflux") is None:
            continue
        off, f16, b16 = (med("comp", w, m) for m in ("conflux", "conflux_fp16", "conflux_bf16"))
        state = ", ".join(f"{m.replace('conflux_', '').replace('conflux', 'off')} "
                          f"{'/'.join(sorted(checks.get(('comp', w, m), {'—'})))}"
                          for m in ("conflux", "conflux_fp16", "conflux_bf16"))
        wire = [c for m in ("conflux_fp16", "conflux_bf16")
                for c in checks.get(("comp", w, m + ".wire_bytes"), set()) if c != "-"]
        state += "; wire " + ("/".join(sorted(set(wire))) if wire else "—")
        print("| " + " | ".join([w, f"{nbytes[w] / 2**20:.0f}", spread("comp", w, "conflux"),
                                 spread("comp", w, "conflux_fp16"), spread("comp", w, "conflux_bf16"),
                                 ratio(f16, off), ratio(b16, off), mb("comp", w, "conflux"),
                                 mb("comp", w, "conflux_fp16"), mb("comp", w, "conflux_bf16"),
                                 ratio(med("comp", w, "conflux_fp16.wire_bytes"),
                                       med("comp", w, "conflux.wire_bytes")),
                                 mb("hier", w, "mpi_flat"), state]) + " |")
EOF
