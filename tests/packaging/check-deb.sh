#!/usr/bin/env bash
# Debian packages: a build configured for /usr, `cpack -G DEB`, then each package's metadata and
# contents (dpkg-deb -I/-c): names, version (CMake's), Depends on the right Debian packages (each one
# known to apt), files under /usr only and in one package only; `apt-get -s install ./*.deb`
# resolves. Nothing is installed: the packages are unpacked into a scratch root where cfxrun runs a
# 2-rank Python job, lua5.4 and java run 2-rank jobs, and a C program builds with pkg-config.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need dpkg-deb "Debian: dpkg"
need cpack "Debian: cmake"
py=${CFX_PYTHON:-/usr/bin/python3}
v=$CFX_VERSION
rel=$v-1
arch=$(dpkg --print-architecture)

step "configure for /usr, build, cpack -G DEB"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
logged "$work/configure.log" cmake -S "$CFX_SRC" -B "$work/build" ${gen[@]+"${gen[@]}"} \
    -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
    "-DPython3_EXECUTABLE=$py" ${subbuild_args[@]+"${subbuild_args[@]}"}
logged "$work/build.log" cmake --build "$work/build"
(cd "$work/build" && logged "$work/cpack.log" cpack -G DEB)
mkdir "$work/debs"
mv "$work/build"/*.deb "$work/debs/"
ls "$work/debs"

deb() { echo "$work/debs/${1}_${rel}_$arch.deb"; }
# expect PACKAGE "DEPENDS-REGEX..." -- FILE...: the package exists with this version, its Depends
# matches each regex, and it holds each file (paths below /usr, `*` globs allowed)
expect() {
    local pkg=$1 f d
    shift
    [[ -f $(deb "$pkg") ]] || fail "cpack made no $(basename "$(deb "$pkg")")"
    [[ $(deb_field "$(deb "$pkg")" Version) == "$rel" ]] || fail "$pkg: version is not $rel"
    local depends
    depends=$(deb_field "$(deb "$pkg")" Depends)
    while [[ $1 != -- ]]; do
        grep -qE "$1" <<<"$depends" || fail "$pkg: Depends '$depends' lacks /$1/"
        shift
    done
    shift
    local listing
    listing=$(dpkg-deb -c "$(deb "$pkg")" | awk '{ print $6 }' | sed 's|^\./|/|')
    for f in "$@"; do
        # shellcheck disable=SC2053  # glob match intended
        grep -q . <(while read -r l; do [[ $l == $f ]] && echo "$l"; done <<<"$listing") \
            || fail "$pkg lacks $f"
    done
    printf '%-16s Depends: %s\n' "$pkg" "$depends"
}

step "metadata and contents (dpkg-deb -I / -c)"
lib=$(dpkg-deb -c "$(deb libconflux1)" | awk '{ print $6 }' | sed -n 's|^\./\(usr/lib.*\)/libconflux\.so\.[0-9]*$|/\1|p')
[[ -n $lib ]] || fail "libconflux1 holds no /usr/lib*/libconflux.so.<ABI>"
abi=$(dpkg-deb -c "$(deb libconflux1)" | awk '{ print $6 }' | sed -n 's|.*/libconflux\.so\.\([0-9]*\)$|\1|p')
mpi=''
if readelf -d "$(find "$work/build" -name "libconflux.so.$abi" -print -quit)" | grep -q 'NEEDED.*libmpi'; then
    mpi='(^|, )libopenmpi3 '                             # the MPI transport: Open MPI's library
fi
expect libconflux1 '(^|, )libc6 ' ${mpi:+"$mpi"} -- "$lib/libconflux.so.$abi" "$lib/libconflux.so.$abi.*"
shlibs=$(dpkg-deb -I "$(deb libconflux1)" shlibs)
[[ $shlibs == "libconflux $abi libconflux$abi (>= $rel)" ]] || fail "libconflux1's shlibs: '$shlibs'"
same="libconflux1 \\(= $rel\\)"
expect libconflux-dev "$same" -- /usr/include/conflux/conflux.h "$lib/libconflux.so" \
    "$lib/cmake/Conflux/ConfluxConfig.cmake" "$lib/pkgconfig/conflux.pc" "/usr/share/doc/*/c-api.md"
expect conflux-tools '(^|, )python3(,|$)' 'openmpi-bin' -- /usr/bin/cfxrun /usr/bin/cfx-timeline
expect python3-conflux "$same" 'python3-numpy' 'python3 \(>= 3\.[0-9]+~\), python3 \(<< 3\.[0-9]+\)' -- \
    /usr/lib/python3/dist-packages/conflux/__init__.py "/usr/lib/python3/dist-packages/conflux/_capi_native.*.so"
expect libconflux-java "$same" 'default-jre-headless|java[0-9]+-runtime-headless' -- \
    /usr/share/java/conflux.jar "$lib/jni/libconflux_jni.so"
expect lua-conflux "$same" '(^|, )lua5\.4' -- "$lib/lua/5.4/conflux_core.so" /usr/share/lua/5.4/conflux.lua
all=$(for d in "$work"/debs/*.deb; do dpkg-deb -c "$d" | awk '$1 !~ /^d/ { print $6 }'; done | sort)
outside=$(grep -v '^\./usr/' <<<"$all" || true)
[[ -z $outside ]] || fail "files outside /usr: $outside"
twice=$(uniq -d <<<"$all")
[[ -z $twice ]] || fail "files in two packages: $twice"

step "every dependency is a package apt knows; apt-get -s install resolves them"
for d in "$work"/debs/*.deb; do
    deb_field "$d" Depends | tr ',' '\n' | sed 's/([^)]*)//g; s/[[:space:]]//g' | while read -r alts; do
        [[ -z $alts ]] && continue
        ok=0
        for p in ${alts//|/ }; do
            [[ -f $(deb "$p") ]] && ok=1 && break
            apt-cache show "$p" >/dev/null 2>&1 && ok=1 && break
        done
        ((ok)) || fail "$(basename "$d"): no Debian package provides '$alts'"
    done
done
logged "$work/apt-simulate.log" apt-get -s -q -o Debug::NoLocking=1 install "$work"/debs/*.deb
grep -c '^Conf ' "$work/apt-simulate.log" | sed 's/^/apt-get -s: packages configured: /'

step "unpacked into a scratch root: cfxrun + Python, Lua, Java, C"
root=$work/root
for d in "$work"/debs/*.deb; do dpkg-deb -x "$d" "$root"; done
PYTHONPATH=$root/usr/lib/python3/dist-packages RANKS_LAUNCHER="$root/usr/bin/cfxrun -np 2 --timeout 100 --" \
    ranks 2 "$py" "$here/allreduce_check.py" "$root" 2
LUA_PATH_5_4="$root/usr/share/lua/5.4/?.lua;;" LUA_CPATH_5_4="$root$lib/lua/5.4/?.so;;" \
    ranks 2 "${CFX_LUA:-lua5.4}" "$here/allreduce_check.lua" "$root" 2
# The job's whole output is kept (ranks exits the subshell with it on a failure), and shown when
# the check fails, so that a failed rank says why.
java_out=$(ranks 2 "${CFX_JAVA:-java}" -Djava.library.path="$root$lib/jni" -cp "$root/usr/share/java/conflux.jar" \
    "$here/maven-consumer/src/main/java/org/example/Consumer.java" 2 2>&1) || true
grep -F "JNI library $root$lib/jni/" <<<"$java_out" \
    || { echo "$java_out"; fail "the Java ranks did not load $root$lib/jni/libconflux_jni.so"; }
"$root/usr/bin/cfx-timeline" --help >/dev/null || fail "$root/usr/bin/cfx-timeline --help"
pc=$root$lib/pkgconfig
cc $(PKG_CONFIG_PATH=$pc PKG_CONFIG_LIBDIR=$pc pkg-config --cflags conflux) "$CFX_SRC/tests/install/consumer/main.c" \
    -o "$work/c-consumer" $(PKG_CONFIG_PATH=$pc PKG_CONFIG_LIBDIR=$pc pkg-config --libs conflux) -Wl,-rpath,"$root$lib"
"$work/c-consumer"
echo "ok"
