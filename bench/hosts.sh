#!/bin/sh
# bench/hosts.sh - the model steps across two pretend hosts (tests/hosts/cfxhosts: network
# namespaces joined by a shaped link), Conflux with the hierarchical allreduce on and off, against
# the MPI baselines over the same link, in one table, beside the same Conflux
# steps over the Gloo transport; and compression off and on, with the bytes each step put on the
# link, in a second; and, on the Gloo path, the time from a silent host to the error on every
# survivor, in a third.
#
#   bench/hosts.sh [--build-dir DIR] [--hosts a:2,b:2] [--rate 10gbit] [--delay 50us]
#                  [--only resnet50,bert_base,vgg16] [--rounds N] [--full] [--no-compression]
#                  [--no-gloo] [--no-lone] [--no-elastic] [--out DIR]
#
# Runs build/bench/cfx_bench (bench/conflux_bench.c; built here if missing) three times through
# tests/hosts/hostrun, which checks where every rank ran and which allreduce path the engine took:
#   1. CFX_HIERARCHICAL_ALLREDUCE unset (auto: shared memory in each host, MPI between them),
#      with the MPI baselines (mpi_flat, mpi_per_tensor, mpi_chunk_1M/4M/16M);
#   2. CFX_HIERARCHICAL_ALLREDUCE=0 (MPI carries every allreduce), Conflux rows only;
#   2g. CFX_TRANSPORT=gloo, hierarchical auto (shared memory in each host, Gloo between them),
#      Conflux rows only, unless --no-gloo. mpirun still starts the ranks (the bench's barriers and
#      its max over ranks of each repeat are MPI calls, the same in both runs), but every byte
#      Conflux moves goes through the Gloo transport: hostrun checks each rank's context says
#      "shared memory + GLOO across hosts". The table puts its step beside the MPI path's (run 1)
#      with their ratio;
#   3. --compression on the hierarchical path: the conflux step with wire compression off, fp16 and
#      bf16 in the same rounds (cfx_allreduce_async_opts; the results checked: within the 16-bit
#      rounding of the exact sum, 16-bit values, the same bits on every rank), unless
#      --no-compression.
# Runs 1 and 2g also time a lone 4 B allreduce (lat_4B: one enqueue -> completion across the
# hosts), unless --no-lone. Once, after the rounds, unless --no-gloo: the silent host on the Gloo
# path (tests/rendezvous/test_dead_peer.py, mode link: 4 ranks of tests/rendezvous/gloo_job as
# 2x2 started by `cfxrun --transport gloo` through the hosts' agent; at step 5 host b's link is
# pulled with `agent --link b down`; CFX_TRANSPORT_TIMEOUT_S=5): the seconds from the pull to the
# CFX_ERR_PEER_LOST on each survivor, OUT/silent.log. Last, unless --no-elastic: the elastic rows
# (bench/elastic_hosts.py, --rounds repeats of each): the time from losing host b's workers to the
# survivors training again, and from a host the discovery script adds to its worker training, each
# from a run whose final parameters were checked; OUT/elastic/.
# Every run counts the bytes each host sends on its link (cfx0's tx_bytes, cfx_bench --wire-iface),
# summed over the hosts, per step; a compressed step that sends more than 0.7 x the uncompressed
# step's bytes fails the run.
# --rounds N repeats the runs N times, alternating, so that a machine whose load changes hits them
# alike. Each run uses --quick (4 timed repeats) unless --full (10). The tables (markdown, on stdout
# and in OUT/hosts.md) give, per workload, the median over rounds of each run's median step time
# (with the range over rounds when N > 1): first each Conflux method both ways and the best MPI
# baseline, then compression off/fp16/bf16 with their ratios and their bytes on the link, with the
# link as the harness shaped it. Raw rows: OUT/hierR.csv, OUT/flatR.csv, OUT/glooR.csv,
# OUT/compR.csv for round R; logs beside them.
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
gloo=1
lone=1
elastic=1
out=
silent_deadline=5

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
        --no-gloo) gloo=0; shift ;;
        --no-lone) lone=0; shift ;;
        --no-elastic) elastic=0; shift ;;
        --out) out=$2; shift 2 ;;
        -h|--help) sed -n '2,47p' "$0"; exit 0 ;;
        *) echo "bench/hosts.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
out=${out:-$build/bench/hosts-$rate}

if [ "$(id -u)" -ne 0 ]; then
    echo "bench/hosts.sh: SKIP: needs root (the pretend hosts are network namespaces)" >&2
    exit 77
fi
bench=$build/bench/cfx_bench
gloo_job=$build/tests/rendezvous/gloo_job
if [ ! -x "$bench" ]; then
    [ -f "$build/CMakeCache.txt" ] ||
        cmake -G Ninja -S "$root" -B "$build" >/dev/null
    cmake --build "$build" --target cfx_bench >/dev/null
fi
# gloo_job (the silent host's program) is a target only of a build with the Gloo transport.
if [ "$gloo" -eq 1 ] && [ ! -x "$gloo_job" ] &&
        ! cmake --build "$build" --target gloo_job >/dev/null 2>&1; then
    echo "bench/hosts.sh: the build in $build has no Gloo transport (no gloo_job target:" \
         "libgloo-dev missing or CONFLUX_WITH_GLOO=OFF): build with it, or pass --no-gloo" >&2
    exit 2
fi
mkdir -p "$out"
export CFXHOSTS_RATE=$rate CFXHOSTS_DELAY=$delay

# run NAME PATH ONLY [VAR=VALUE...] -- BENCH-ARGS...: one cfx_bench run of the workloads ONLY on
# the hosts, log in OUT/NAME.log.
run() {
    name=$1 path=$2 workloads=$3
    shift 3
    vars=
    while [ "$1" != -- ]; do vars="$vars $1"; shift; done
    shift
    echo "bench/hosts.sh: $name ($hosts, $rate, $delay) ..." >&2
    # shellcheck disable=SC2086
    if ! env $vars "$root/tests/hosts/hostrun" --hosts "$hosts" --path "$path" --timeout 3000 -- \
            "$bench" $mode --only "$workloads" --workloads "$root/bench/workloads" \
            --raw "$out/$name.csv" --wire-iface cfx0 "$@" >"$out/$name.log" 2>&1; then
        tail -n 40 "$out/$name.log" >&2
        echo "bench/hosts.sh: the $name run failed (log: $out/$name.log)" >&2
        exit 1
    fi
}

case $rounds in ''|*[!0-9]*|0) echo "bench/hosts.sh: --rounds needs a positive integer" >&2; exit 2 ;; esac
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M UTC')
with_lone=$only
[ "$lone" -eq 0 ] || with_lone=lat_4B,$only
# The Gloo ranks meet at a store rank 0 serves on host a (a port of the hosts' own network).
gloo_vars="CFX_TRANSPORT=gloo CFX_RENDEZVOUS_ADDR=a:29870"
r=1
while [ $r -le "$rounds" ]; do
    run hier$r hierarchical "$with_lone" --
    run flat$r mpi "$only" CFX_HIERARCHICAL_ALLREDUCE=0 -- --no-mpi
    # shellcheck disable=SC2086
    [ "$gloo" -eq 0 ] || run gloo$r hierarchical "$with_lone" $gloo_vars -- --no-mpi
    [ "$compression" -eq 0 ] || run comp$r hierarchical "$only" -- --compression --no-mpi
    r=$((r + 1))
done

# The silent host on the Gloo path: test_dead_peer.py's run (its own checks: every survivor fails
# with CFX_ERR_PEER_LOST naming a rank of host b, cfx_shutdown returns, cfxrun's last line names
# it).
if [ "$gloo" -eq 1 ]; then
    echo "bench/hosts.sh: silent host (a:2,b:2, gloo, $rate, $delay) ..." >&2
    if ! /usr/bin/python3 "$root/tests/hosts/cfxhosts" --hosts a,b --timeout 300 -- \
            "$root/.venv/bin/python" "$root/tests/rendezvous/test_dead_peer.py" "$root/tools/cfxrun" \
            "$gloo_job" 4 link --hosts a:2,b:2 CFX_TRANSPORT_TIMEOUT_S=$silent_deadline \
            >"$out/silent.log" 2>&1; then
        tail -n 40 "$out/silent.log" >&2
        echo "bench/hosts.sh: the silent-host run failed (log: $out/silent.log)" >&2
        exit 1
    fi
fi

load_end=$(cut -d' ' -f1-3 /proc/loadavg)
link=$(sed -n 's/^cfxhosts: hosts .* up on [^,]*, link //p' "$out/hier1.log" | head -n 1)
/usr/bin/python3 - "$out" "$hosts" "$link" "$rounds" "$started" "$load_start" "$load_end" \
    "$compression" "$gloo" "$silent_deadline" <<'EOF' | tee "$out/hosts.md"
import csv, os, re, statistics, sys

out, hosts, link, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
started, load_start, load_end, compression, gloo, silent_deadline = sys.argv[5:11]
rows = {}  # (run, workload, method) -> [median_s of each round]; METHOD.wire_bytes: bytes
checks = {}  # (run, workload, method) -> the checks of the rounds
nbytes = {}
for run in ("hier", "flat") + (("gloo",) if gloo == "1" else ()) + (
        ("comp",) if compression == "1" else ()):
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
    """Milliseconds: whole ones for a step, three figures for a lone small allreduce."""
    return "—" if t is None else f"{t * 1e3:.0f}" if t >= 0.01 else f"{t * 1e3:.3g}"


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
    if gloo == "1":
        head += [f"{m} gloo", "gloo/hier"]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for w in workloads:
    mpi = [(med("hier", w, m), m) for (run, ww, m) in rows
           if run == "hier" and ww == w and m.startswith("mpi_") and not m.endswith(".wire_bytes")]
    best, which = min(mpi) if mpi else (None, "")
    mib = nbytes[w] / 2**20
    cells = [w, f"{mib:.0f}" if mib >= 1 else f"{nbytes[w]} B",
             f"{spread('hier', w, which)} ({which})"]
    for m in methods:
        h, f_ = med("hier", w, m), med("flat", w, m)
        cells += [spread("hier", w, m), spread("flat", w, m), f"{h / f_:.2f}" if h and f_ else "—",
                  f"{h / best:.2f}" if h and best else "—"]
        if gloo == "1":
            g = med("gloo", w, m)
            cells += [spread("gloo", w, m), f"{g / h:.2f}" if g and h else "—"]
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

if gloo == "1":
    survivors = []
    with open(os.path.join(out, "silent.log")) as f:
        for line in f:
            m = re.match(r"rank (\d+): error ([\d.]+) s after host b's link went down: (.*)", line)
            if m:
                lost = re.search(r"suspect (rank \d+ on host .*?)(?: \(|;)", m.group(3))
                survivors.append((int(m.group(1)), float(m.group(2)),
                                  lost.group(1) if lost else "—"))
    print(f"\nA silent host on the Gloo path: 4 ranks as a:2,b:2 (cfxrun --transport gloo), "
          f"host b's link pulled at step 5; seconds from the pull to CFX_ERR_PEER_LOST on each survivor "
          f"(CFX_TRANSPORT_TIMEOUT_S={silent_deadline}; every survivor's cfx_shutdown returned).\n")
    print("| survivor | error after (s) | the error names |")
    print("|---|---|---|")
    for r, t, who in sorted(survivors):
        print(f"| rank {r} | {t:.2f} | {who} |")
EOF

if [ "$elastic" = 1 ]; then
    echo
    /usr/bin/python3 "$root/bench/elastic_hosts.py" --build-dir "$build" --repeats "$rounds" \
        --out "$out/elastic" | tee -a "$out/hosts.md"
fi
