# Sourced by the check-*.sh scripts. The environment (set by tests/packaging/CMakeLists.txt):
#   CFX_SRC CFX_BUILD     the source tree and the ctest build
#   CFX_VERSION           CMake's project version
#   CFX_SUBBUILD_ARGS     CMake arguments of the scripts' own builds (e.g. CUDA off, to keep them short)
#   MPIEXEC CFX_PYTHON CFX_JAVA CFX_LUA   the launcher and interpreters the build found
# Gives a temporary work folder, removed at exit (CFX_KEEP_WORK=1 keeps it), and helpers.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/cfx-packaging.XXXXXX")
cleanup() {
    if [[ ${CFX_KEEP_WORK:-0} == 1 ]]; then echo "work folder kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
read -r -a subbuild_args <<<"${CFX_SUBBUILD_ARGS:-}"

step() { echo "== $*"; }
fail() { echo "FAIL: $*"; exit 1; }
# skip REASON: the test did not run, and says why (ctest SKIP_RETURN_CODE 77)
skip() { echo "SKIP: $*"; exit 77; }
need() { command -v "$1" >/dev/null 2>&1 || skip "$1 not found ($2; tools/install-deps installs it)"; }

# logged LOG CMD...: runs CMD with its output in LOG; on failure shows the log's tail and fails.
logged() {
    local log=$1
    shift
    if ! "$@" >"$log" 2>&1; then
        tail -n 80 "$log"
        fail "$* (exit status $?, log above)"
    fi
}

# ranks NP CMD...: CMD as an NP-rank job from /, bounded in time; checks that every rank printed
# its "rank R of NP: allreduce ok" line. (RANKS_LAUNCHER="cfxrun -np NP --timeout 100 --" instead of
# mpirun.)
ranks() {
    local np=$1 out launcher
    shift
    read -r -a launcher <<<"${RANKS_LAUNCHER:-$MPIEXEC -n $np --timeout 100}"
    out=$(cd / && "${launcher[@]}" "$@" 2>&1) || { echo "$out"; fail "$np-rank job: ${launcher[*]} $*"; }
    echo "$out"
    for ((r = 0; r < np; r++)); do
        grep -q "rank $r of $np: allreduce ok" <<<"$out" || fail "rank $r did not report its allreduce"
    done
}

# deb_field DEB FIELD: one control field of a .deb
deb_field() { dpkg-deb -f "$1" "$2"; }

# zip_list ZIP / zip_cat ZIP MEMBER: a jar's or wheel's member names / one member's bytes
zip_list() { "${CFX_PYTHON:-python3}" -c 'import sys, zipfile; print("\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))' "$1"; }
zip_cat() { "${CFX_PYTHON:-python3}" -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' "$1" "$2"; }
