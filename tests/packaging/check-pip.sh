#!/usr/bin/env bash
# pip: `pip install .` into a venv (--system-site-packages so pip is Debian's: the venv is made
# --without-pip; NumPy is the project environment's, $CFX_PYTHON's, seen through a .pth file;
# --no-build-isolation, no index), then `pip wheel .` (build isolation
# on) and the wheel alone, with the build folder gone, into a second venv. Each venv: import from /,
# and a 2-rank allreduce against the ranks' sum.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
py=${CFX_PYTHON:-/usr/bin/python3}
"$py" -c 'import venv' 2>/dev/null || skip "$py has no venv (Debian: python3-venv)"
"$py" -m pip --version >/dev/null 2>&1 || skip "$py has no pip (Debian: python3-pip)"
pip_opts=(--no-index --no-cache-dir --disable-pip-version-check
          --config-settings "build-dir=$work/cmake" --config-settings "cmake-args=${CFX_SUBBUILD_ARGS:-}")

# new_venv DIR: a venv of $py's base interpreter that also sees $py's own packages (NumPy).
py_packages=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
new_venv() {
    "$py" -m venv --system-site-packages --without-pip "$1"
    local site
    site=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$py_packages" >"$site/project-environment.pth"
}

step "pip install $CFX_SRC into a venv"
new_venv "$work/venv1"
logged "$work/pip-install.log" "$work/venv1/bin/python" -m pip install --no-build-isolation "${pip_opts[@]}" \
    "$CFX_SRC"
v=$("$work/venv1/bin/python" -m pip show conflux | sed -n 's/^Version: //p')
[[ $v == "$CFX_VERSION" ]] || fail "pip installed conflux '$v', CMake's project version is $CFX_VERSION"
ranks 2 "$work/venv1/bin/python" "$here/allreduce_check.py" "$work/venv1" 2

step "pip wheel $CFX_SRC (with pip's build isolation; the same build folder: incremental)"
logged "$work/pip-wheel.log" "$work/venv1/bin/python" -m pip wheel --no-deps -w "$work/wheels" \
    "${pip_opts[@]}" "$CFX_SRC"
whl=$(find "$work/wheels" -name "conflux-$CFX_VERSION-*.whl")
[[ -f $whl ]] || fail "no conflux-$CFX_VERSION-*.whl in $work/wheels: $(ls "$work/wheels")"
echo "wheel: $(basename "$whl")"
mkdir "$work/unzipped"
"$py" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$whl" "$work/unzipped"
(cd "$work/unzipped" && find . -type f | sort | sed 's|^\./|  |')
lib=$(find "$work/unzipped/conflux" -maxdepth 1 -name 'libconflux.so.*')
module=$(find "$work/unzipped/conflux" -maxdepth 1 -name '_capi_native*.so')
[[ -n $lib && -n $module ]] || fail "the wheel lacks conflux/libconflux.so.<ABI> or conflux/_capi_native*.so"
runpath=$(readelf -d "$module" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
[[ $runpath == '$ORIGIN' || $runpath == '$ORIGIN/' ]] || fail "the module's RUNPATH is '$runpath', not \$ORIGIN"
grep -q "^Version: $CFX_VERSION\$" "$work/unzipped/conflux-$CFX_VERSION.dist-info/METADATA" \
    || fail "the wheel's METADATA does not carry version $CFX_VERSION"

step "the wheel alone (no build folder) into a second venv"
rm -rf "$work/cmake"
new_venv "$work/venv2"
logged "$work/pip-install-wheel.log" "$work/venv2/bin/python" -m pip install --no-index --no-deps \
    --no-cache-dir --disable-pip-version-check "$whl"
ranks 2 "$work/venv2/bin/python" "$here/allreduce_check.py" "$work/venv2" 2
echo "ok"
