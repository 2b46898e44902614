#!/usr/bin/env bash
# tests/gpu/run.sh - the one prepared run for a GPU machine (written for one H200, sm_90; any
# CUDA GPU works). From the repository root:   tests/gpu/run.sh
#
# 1. records the machine (GPU, driver, toolkit);
# 2. configures a fresh build with CONFLUX_WITH_CUDA=ON (NCCL=AUTO) for this GPU's architecture;
#    when the top-level build does not include cmake/ConfluxCuda.cmake yet, builds the GPU tests
#    on their own (tests/gpu/standalone);
# 3. builds the engine (when present), the GPU tests and the benchmark;
# 4. runs the kernel tests and the one-rank NCCL test, then the device-tensor ABI test on one
#    process (the engine's one-rank NCCL path) and under mpirun with 2 and 3 ranks sharing the
#    GPU (the engine's host-staged path), with CFX_LOG_LEVEL=info so the log names the path taken;
# 5. benchmarks pack/unpack against cudaMemcpy device-to-device bandwidth.
# Everything goes to $OUT/gpu-results.txt (./gpu-results.txt when OUT is unset). Sized for about
# 3 minutes; each step has its own time limit. Exit status: 0 when every test passed or skipped
# for a stated reason, 1 otherwise.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RESULTS=${OUT:-$PWD}/gpu-results.txt
BUILD=${CFX_GPU_BUILD:-$(mktemp -d /tmp/conflux-gpu-build.XXXXXX)}
JOBS=$(nproc 2>/dev/null || echo 8)
mkdir -p "$(dirname "$RESULTS")" "$BUILD"

step() { printf '\n==== [%s] %s ====\n' "$(date -u +%H:%M:%S)" "$*"; }
failures=0
STEPLOG=$BUILD/steps.log
run_step() { # run_step SECONDS DESCRIPTION COMMAND...: runs, records, and keeps going on failure
    local limit=$1 what=$2 rc=0
    shift 2
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$STEPLOG" || rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 77 ]; then
        echo "---- $what: skipped (exit 77)"
    elif [ "$rc" -ne 0 ]; then
        echo "!!!! $what: exit status $rc$([ "$rc" -eq 124 ] && echo ' (timed out)')"
        failures=$((failures + 1))
    fi
    return 0
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
nvcc --version | tail -2 || { echo "nvcc not found"; exit 1; }
cmake --version | head -1
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .' || true)
ARCH=${ARCH:-90}
echo "CUDA architecture for this run: $ARCH"
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

step "configure (CONFLUX_WITH_CUDA=ON, CMAKE_CUDA_ARCHITECTURES=$ARCH)"
COMMON=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCONFLUX_WITH_CUDA=ON -DCONFLUX_WITH_NCCL=AUTO
        -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
MODE=engine
if grep -qs 'include(ConfluxCuda)' "$ROOT"/cmake/*.cmake "$ROOT"/CMakeLists.txt &&
   grep -qs 'foreach(part .*gpu' "$ROOT/tests/CMakeLists.txt"; then
    timeout 240 cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" "${COMMON[@]}" -DBUILD_TESTING=ON \
        -DCONFLUX_WITH_PYTHON=OFF -DCONFLUX_WITH_JAVA=OFF -DCONFLUX_WITH_LUA=OFF | tail -25
else
    MODE=standalone
    echo "the top-level build does not include ConfluxCuda and tests/gpu yet: building tests/gpu/standalone"
    timeout 240 cmake -S "$ROOT/tests/gpu/standalone" -B "$BUILD" "${GEN[@]}" "${COMMON[@]}" | tail -25
fi

step "build ($MODE)"
TARGETS=(test_cuda_kernels bench_pack)
have_target() { cmake --build "$BUILD" --target help 2>/dev/null | grep -w -- "$1" >/dev/null; }
for t in test_nccl_one_rank conflux test_device_collectives; do
    if have_target "$t"; then TARGETS+=("$t"); fi
done
echo "targets: ${TARGETS[*]}"
timeout 420 cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" 2>&1 | tail -15

export CFX_LOG_LEVEL=info # the engine logs which device data path it set up (device_exec.c)
step "kernel tests and the one-rank NCCL test"
run_step 240 "ctest -L gpu (one process)" \
    ctest --test-dir "$BUILD" -L gpu -E 'np[0-9]' --output-on-failure -V --timeout 200

step "multi-rank: device tensors through the engine, 2 and 3 ranks sharing the GPU"
if have_target test_device_collectives && ctest --test-dir "$BUILD" -N -R 'np[0-9]' | grep 'np2' >/dev/null; then
    run_step 240 "ctest (mpirun 2, 3 ranks)" \
        ctest --test-dir "$BUILD" -R 'gpu\..*np[0-9]' --output-on-failure -V --timeout 200
else
    echo "skipped: the engine/MPI part is not built in this configuration ($MODE)"
fi

step "benchmark: batched pack/unpack vs cudaMemcpy device to device"
BENCH=$(find "$BUILD" -name bench_pack -type f -perm -u+x | head -1)
run_step 60 "bench_pack synthetic" "$BENCH" - 50
for w in resnet50 bert_base; do
    f="$ROOT/bench/workloads/$w.tsv"
    if [ -f "$f" ]; then run_step 60 "bench_pack $w" "$BENCH" "$f" 50; fi
done

step "summary"
if [ "$GPU_PRESENT" = 1 ] && grep -q 'skipped: no CUDA device' "$STEPLOG" 2>/dev/null; then
    echo "!!!! a GPU is present but tests skipped for want of one (see above)"
    failures=$((failures + 1))
fi
grep -h 'skipped:\|passed\|FAILED\|GB/s\|device tensors take' "$STEPLOG" 2>/dev/null | sed 's/^/  /' || true
echo "mode: $MODE; failed steps: $failures; results: $RESULTS"
[ "$failures" -eq 0 ]
}

main "$@" 2>&1 | tee "$RESULTS"
exit "${PIPESTATUS[0]}"
