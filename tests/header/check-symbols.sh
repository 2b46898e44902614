#!/usr/bin/env bash
# check-symbols.sh LIB EXPECTED_SONAME HEADER: checks the exported surface of libconflux.so.
#  - every defined dynamic symbol (nm -D --defined-only) is a cfx_* symbol, apart from the absolute
#    (type A) symbols naming the version-script nodes (e.g. CONFLUX_1.0);
#  - the core entry points are there and carry a symbol version;
#  - the SONAME (readelf -d) is EXPECTED_SONAME and matches CFX_ABI_VERSION in HEADER.
set -euo pipefail
lib=$1 expected=$2 header=$3
fail=0

syms=$(nm -D --defined-only "$lib")
# nm prints "ADDR TYPE NAME[@[@]VERSION]".
bad=$(awk '{ name = $3; sub(/@.*/, "", name);
             if ($2 == "A") next;                 # version node
             if (name !~ /^cfx_/) print "  " $0 }' <<<"$syms")
if [[ -n $bad ]]; then
    echo "FAIL: $lib exports symbols outside the cfx_ namespace:"
    echo "$bad"
    fail=1
fi
count=$(awk '$2 != "A" && $3 ~ /^cfx_/' <<<"$syms" | wc -l)
echo "exported cfx_ symbols: $count"
nodes=$(awk '$2 == "A" { print $3 }' <<<"$syms" | tr '\n' ' ')
echo "version nodes: ${nodes:-none}"
for f in cfx_version cfx_init cfx_shutdown cfx_context_free cfx_allreduce_async cfx_wait; do
    line=$(awk -v f="$f" '{ n = $3; sub(/@.*/, "", n); if (n == f) print }' <<<"$syms")
    if [[ -z $line ]]; then
        echo "FAIL: $f is not exported"
        fail=1
    elif [[ $line != *@* ]]; then
        echo "FAIL: $f has no symbol version (is the version script applied?): $line"
        fail=1
    fi
done
[[ -n $nodes ]] || { echo "FAIL: no version nodes (the version script is not applied)"; fail=1; }

soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
abi=$(sed -n 's/^#define CFX_ABI_VERSION \([0-9]\+\).*/\1/p' "$header")
echo "SONAME: ${soname:-none} (expected $expected; header CFX_ABI_VERSION ${abi:-?})"
if [[ $soname != "$expected" ]]; then
    echo "FAIL: SONAME is '${soname:-none}', expected '$expected'"
    fail=1
fi
if [[ $soname != "libconflux.so.$abi" ]]; then
    echo "FAIL: SONAME '${soname:-none}' does not match CFX_ABI_VERSION $abi in $header"
    fail=1
fi
((fail == 0)) && echo "ok"
exit $fail
