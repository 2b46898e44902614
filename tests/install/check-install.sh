#!/usr/bin/env bash
# check-install.sh BUILD_DIR WORK_DIR CMAKE GENERATOR C_COMPILER
# Installs BUILD_DIR into WORK_DIR/prefix (cmake --install --prefix, i.e. a relocated install), then
# builds and runs the consumer program against it twice: with find_package(Conflux) +
# Conflux::conflux, and with `pkg-config conflux`. Nothing outside WORK_DIR is touched.
set -euo pipefail
build=$1 work=$2 cmake=$3 generator=$4 cc=$5
src=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/consumer

rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
step() { echo "== $*"; }

# An install rule with an absolute DESTINATION ignores --prefix and would write into the system.
if abs=$(grep -rhoE 'file\(INSTALL DESTINATION "/[^"]*"' --include=cmake_install.cmake "$build"); then
    echo "FAIL: install rules with absolute destinations (not relocatable; use paths relative to"
    echo "CMAKE_INSTALL_PREFIX, e.g. \${CMAKE_INSTALL_LIBDIR}):"
    echo "$abs" | sort -u
    exit 1
fi

step "cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
libdir=$(dirname "$(find "$prefix" -name 'libconflux.so' -print -quit)")
[[ -n $libdir && -e $libdir/libconflux.so ]] || { echo "FAIL: no libconflux.so under $prefix"; cat "$work/install.log"; exit 1; }
[[ -f $prefix/include/conflux/conflux.h ]] || { echo "FAIL: $prefix/include/conflux/conflux.h not installed"; exit 1; }
echo "installed: $(cd "$prefix" && find . -type f -o -type l | sort | tr '\n' ' ')"

step "find_package(Conflux) + Conflux::conflux"
"$cmake" -S "$src" -B "$work/cmake-build" -G "$generator" -DCMAKE_C_COMPILER="$cc" \
         -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$work/configure.log" 2>&1 \
    || { cat "$work/configure.log"; echo "FAIL: configuring the find_package consumer"; exit 1; }
"$cmake" --build "$work/cmake-build" || { echo "FAIL: building the find_package consumer"; exit 1; }
"$work/cmake-build/consumer"
# The consumer must load the installed library, not the build tree's.
check_loads_install() {
    local resolved
    resolved=$(ldd "$1" | awk '/libconflux\.so/ { print $3 }')
    if [[ $resolved != "$prefix"/* ]]; then
        echo "FAIL: $1 loads libconflux from '${resolved:-nowhere}', not from $prefix"; exit 1
    fi
}
check_loads_install "$work/cmake-build/consumer"

step "pkg-config conflux"
export PKG_CONFIG_PATH=$libdir/pkgconfig PKG_CONFIG_LIBDIR=$libdir/pkgconfig
cflags=$(pkg-config --cflags conflux) && libs=$(pkg-config --libs conflux) \
    || { echo "FAIL: pkg-config conflux"; exit 1; }
echo "pkg-config: cflags '$cflags' libs '$libs'"
# shellcheck disable=SC2086  # word splitting of the flags is intended
"$cc" $cflags "$src/main.c" -o "$work/pkgconfig-consumer" $libs -Wl,-rpath,"$libdir" \
    || { echo "FAIL: building with pkg-config's flags (does conflux.pc point into $prefix?)"; \
         cat "$libdir/pkgconfig/conflux.pc"; exit 1; }
"$work/pkgconfig-consumer"
check_loads_install "$work/pkgconfig-consumer"
echo "ok"
