#!/usr/bin/env bash
# tests/gpu/run.sh - the one prepared run for a machine with one GPU (written for an H200, sm_90;
# any CUDA GPU works). From the repository root:   tests/gpu/run.sh
#
# 1. records the machine (GPU, driver, toolkit, NCCL, MPI);
# 2. configures a fresh build for this GPU's architecture, the first of these that configures:
#      full        the top-level build with its tests (needs cmocka; MPI when present)
#      standalone  tests/gpu/standalone: the engine and the GPU tests, nothing else (no cmocka/MPI)
#      kernels     tests/gpu/standalone with CFX_GPU_ENGINE=OFF: the kernels and NCCL alone
#    NCCL comes from the toolkit, $NCCL_HOME, or the nvidia-nccl Python package;
# 3. builds the GPU tests (and the engine) and the benchmark;
# 4. runs every test labelled gpu with CFX_TEST_GPU_REQUIRED=1, so a test that finds no device
#    fails instead of skipping. The engine asserts each run's path itself (CFX_TEST_DEVICE_PATH:
#    a device batch fails unless set-up chose that path): the one-rank NCCL path; the host-staged
#    path at 2 and 3 thread ranks sharing the GPU (and under mpirun when MPI is there);
#    deterministic mode; injected failures before and after the collective (CFX_TEST_FAIL) and a
#    failed NCCL set-up falling back to host-staged. CFX_STALL_TIMEOUT_S=60 bounds every device
#    wait, so a hang fails with the engine's message well inside ctest's limit;
# 5. benchmarks pack/unpack against cudaMemcpy device-to-device bandwidth (prints, asserts nothing).
# CFX_GPU_MODES="standalone kernels" tries only those modes (to check the fallbacks on a machine
# where the full build configures).
# Results: $OUT/gpu-results.txt (./gpu-results.txt when OUT is unset) and ctest's log beside it.
# Sized for about 5 minutes and at most 10 (each step has its own limit). Exit status: 0 when every
# step passed, 1 otherwise (the summary lists the failed steps).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTDIR=${OUT:-$PWD}
RESULTS=$OUTDIR/gpu-results.txt
BUILD=${CFX_GPU_BUILD:-$(mktemp -d /tmp/conflux-gpu-build.XXXXXX)}
JOBS=$(nproc 2>/dev/null || echo 8)
mkdir -p "$OUTDIR" "$BUILD"

step() { printf '\n==== [%s] %s ====\n' "$(date -u +%H:%M:%S)" "$*"; }
failed_steps=()
run_step() { # run_step SECONDS DESCRIPTION COMMAND...: runs, records, keeps going on failure
    local limit=$1 what=$2 rc=0
    shift 2
    timeout --kill-after=10 "$limit" "$@" || rc=$?
    if [ "$rc" -eq 77 ] && [ "${GPU_PRESENT:-0}" = 0 ]; then
        echo "---- $what: skipped (no GPU here)"
        return 0
    fi
    if [ "$rc" -ne 0 ]; then
        echo "!!!! $what: exit status $rc$([ "$rc" -eq 124 ] && echo " (timed out after $limit s)")"
        failed_steps+=("$what")
    fi
    return "$rc"
}

# NCCL for the build: the toolkit's, $NCCL_HOME, else the nvidia-nccl wheel's (headers and
# libnccl.so.2, given a libnccl.so name in a folder of links).
find_nccl() {
    local cuda_inc=$1 py d
    if [ -f "$cuda_inc/nccl.h" ] || { [ -n "${NCCL_HOME:-}" ] && [ -f "$NCCL_HOME/include/nccl.h" ]; }; then
        return 0
    fi
    for py in python3 /usr/bin/python3; do
        d=$("$py" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null) || continue
        if [ -f "$d/include/nccl.h" ] && ls "$d"/lib/libnccl.so* >/dev/null 2>&1; then
            mkdir -p "$BUILD/nccl/lib"
            ln -sfn "$d/include" "$BUILD/nccl/include"
            ln -sf "$(ls "$d"/lib/libnccl.so* | head -1)" "$BUILD/nccl/lib/libnccl.so"
            export NCCL_HOME=$BUILD/nccl LD_LIBRARY_PATH=$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            echo "NCCL from the Python package: $d"
            return 0
        fi
    done
    echo "no NCCL found: the build will have the host-staged path only"
}

configure() { # configure MODE: a fresh configure of BUILD/MODE
    local mode=$1 src=$ROOT extra=()
    case $mode in
    full) extra=(-DBUILD_TESTING=ON -DCONFLUX_WITH_PYTHON=OFF -DCONFLUX_WITH_JAVA=OFF
                 -DCONFLUX_WITH_LUA=OFF) ;;
    standalone) src=$ROOT/tests/gpu/standalone ;;
    kernels) src=$ROOT/tests/gpu/standalone; extra=(-DCFX_GPU_ENGINE=OFF) ;;
    esac
    rm -rf "$BUILD/$mode"
    timeout 300 cmake -S "$src" -B "$BUILD/$mode" "${GEN[@]}" "${COMMON[@]}" "${extra[@]}" \
        >"$BUILD/configure-$mode.log" 2>&1
    local rc=$?
    tail -4 "$BUILD/configure-$mode.log"
    [ $rc -eq 0 ] || { echo "configure ($mode) failed, exit $rc:"; grep -m5 -i 'error' "$BUILD/configure-$mode.log"; }
    return $rc
}

main() {
step "machine"
echo "repository: $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'no git'))"
echo "build dir:  $BUILD"
uname -a
GPU_PRESENT=0
if nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv 2>&1; then
    GPU_PRESENT=1
else
    echo "nvidia-smi: not available (no GPU here: the tests will skip)"
fi
export PATH=/usr/local/cuda/bin:$PATH
if ! command -v nvcc >/dev/null; then
    echo "nvcc not found: nothing to build"
    return 1
fi
nvcc --version | tail -2
cmake --version | head -1
command -v mpirun >/dev/null && mpirun --version 2>&1 | head -1 || echo "no mpirun: the MPI runs are left out"
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .' || true)
ARCH=${ARCH:-90}
echo "CUDA architecture for this run: $ARCH"
find_nccl "$(dirname "$(command -v nvcc)")/../include"
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
COMMON=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCONFLUX_WITH_CUDA=ON -DCONFLUX_WITH_NCCL=AUTO
        -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DCMAKE_CUDA_COMPILER="$(command -v nvcc)"
        -DPython3_EXECUTABLE="$(command -v python3)")

step "configure"
MODE=
for m in ${CFX_GPU_MODES:-full standalone kernels}; do
    echo "-- trying $m"
    if configure "$m"; then MODE=$m; break; fi
done
if [ -z "$MODE" ]; then
    failed_steps+=("configure")
    return 1
fi
B=$BUILD/$MODE
echo "mode: $MODE"

step "build ($MODE)"
TARGETS=(test_cuda_kernels bench_pack)
cmake --build "$B" --target help >"$BUILD/targets.txt" 2>/dev/null
for t in test_nccl_one_rank test_device_collectives test_device_ranks; do
    if grep -qw -- "$t" "$BUILD/targets.txt"; then TARGETS+=("$t"); fi
done
echo "targets: ${TARGETS[*]}"
run_step 420 "build" cmake --build "$B" -j "$JOBS" --target "${TARGETS[@]}" >"$BUILD/build.log" 2>&1
tail -5 "$BUILD/build.log"

step "tests (label gpu)"
ctest --test-dir "$B" -L gpu -N | grep 'Test *#' | sed 's/^ */  /'
CFX_TEST_GPU_REQUIRED=$GPU_PRESENT CFX_STALL_TIMEOUT_S=60 CFX_LOG_LEVEL=info \
    run_step 300 "ctest -L gpu" ctest --test-dir "$B" -L gpu -j 4 --output-on-failure --timeout 240
cp "$B/Testing/Temporary/LastTest.log" "$OUTDIR/gpu-ctest.log" 2>/dev/null || true

step "benchmark: batched pack/unpack vs cudaMemcpy device to device"
BENCH=$(find "$B" -name bench_pack -type f -perm -u+x | head -1)
if [ -n "$BENCH" ]; then
    run_step 60 "bench_pack synthetic" "$BENCH" - 50
    for w in resnet50 bert_base; do
        f="$ROOT/bench/workloads/$w.tsv"
        if [ -f "$f" ]; then run_step 60 "bench_pack $w" "$BENCH" "$f" 50; fi
    done
else
    failed_steps+=("bench_pack not built")
fi
}

{
    main "$@"
    step "summary"
    echo "mode: ${MODE:-none}; failed steps: ${#failed_steps[@]}${failed_steps[*]:+ (${failed_steps[*]})}"
    echo "results: $RESULTS"
    [ ${#failed_steps[@]} -eq 0 ] && [ -n "${MODE:-}" ]
} 2>&1 | tee "$RESULTS"
exit "${PIPESTATUS[0]}"
