#!/usr/bin/env bash
# check-abi.sh: compares libconflux.so with the committed ABI baseline (tests/abi/conflux.abi).
#
#   tests/abi/check-abi.sh LIB            check LIB against the baseline (the ctest abi.check)
#   tests/abi/check-abi.sh --update LIB   (re)write the baseline from LIB (abidw --out-file)
#
# LIB must be built with -g (RelWithDebInfo or Debug): abidw reads the types from DWARF.
# abidiff's exit status is a bit mask: 1 error, 2 usage error, 4 ABI change, 8 incompatible change.
# Bit 8 (a removed function) fails with the report. Bit 4 alone (e.g. an added function, a member
# appended to an options struct) passes with a note: commit a new baseline (--update) with the
# release that adds it; but bit 4 with a report showing a moved or deleted member, a changed
# enumerator value or a changed parameter type fails too (abidiff files those under bit 4). Only the exported interfaces and the types they reach are recorded
# (--exported-interfaces-only, --headers-dir, --drop-private-types).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
baseline=${CFX_ABI_BASELINE:-$here/conflux.abi}
headers=${CFX_ABI_HEADERS:-$root/capi/include/conflux}

usage() { echo "usage: $0 [--update] path/to/libconflux.so" >&2; exit 2; }

update=0
if [[ ${1:-} == --update ]]; then update=1; shift; fi
[[ $# -eq 1 ]] || usage
lib=$1
[[ -f $lib ]] || { echo "check-abi: no such library: $lib" >&2; exit 2; }
for tool in abidw abidiff; do
    command -v "$tool" >/dev/null || { echo "check-abi: $tool not found: install abigail-tools (tools/install-deps)" >&2; exit 2; }
done
if ! readelf -S "$lib" | grep -q '\.debug_info'; then
    echo "check-abi: $lib has no debug info; build with -g (CMAKE_BUILD_TYPE=RelWithDebInfo)" >&2
    exit 2
fi

if ((update)); then
    # Paths are left out so the baseline does not depend on where it was built.
    abidw --no-corpus-path --no-comp-dir-path --short-locs --exported-interfaces-only \
          --headers-dir "$headers" --drop-private-types --out-file "$baseline" "$lib" || exit 1
    echo "check-abi: wrote $baseline from $lib ($(grep -c '<elf-symbol ' "$baseline") ELF symbols)"
    exit 0
fi

if [[ ! -f $baseline ]]; then
    echo "check-abi: no baseline $baseline yet; create it with:"
    echo "  $0 --update $lib"
    exit 77   # ctest: SKIP_RETURN_CODE
fi

report=$(abidiff --no-corpus-path --exported-interfaces-only --hd2 "$headers" --drop-private-types \
                "$baseline" "$lib" 2>&1)
rc=$?
if ((rc & 1 || rc & 2)); then
    echo "check-abi: abidiff failed (exit status $rc):"
    echo "$report"
    exit 1
fi
if ((rc & 8)); then
    echo "check-abi: INCOMPATIBLE ABI change against $baseline (abidiff exit status $rc):"
    echo "$report"
    echo "check-abi: this breaks programs built against the current soname; restore the ABI, or bump"
    echo "CFX_ABI_VERSION (the soname) and regenerate the baseline: $0 --update $lib"
    exit 1
fi
# abidiff sets bit 8 only for removed symbols: a reordered struct, a deleted member, a renumbered
# enumerator or a changed parameter type is "bit 4" to it, yet breaks every caller. Those changes
# fail too; what stays a note is additions (functions, appended members, new enumerators).
breaking='offset changed|data members? deletion|enumerators? (change|deletion)|type name changed'
breaking+='|parameter [0-9]+ of type .* was (added|removed)|return type changed'
if ((rc & 4)) && grep -Eq "$breaking" <<<"$report"; then
    echo "check-abi: INCOMPATIBLE ABI change against $baseline (abidiff exit status $rc, and the"
    echo "report shows layout/enum/signature changes: $(grep -Eo "$breaking" <<<"$report" | sort -u | paste -sd, -)):"
    echo "$report"
    echo "check-abi: this breaks programs built against the current soname; restore the ABI, or bump"
    echo "CFX_ABI_VERSION (the soname) and regenerate the baseline: $0 --update $lib"
    exit 1
fi
if ((rc & 4)); then
    echo "check-abi: NOTE: compatible ABI change against $baseline (e.g. additions):"
    echo "$report"
    echo "check-abi: compatible; regenerate the baseline with the release: $0 --update $lib"
    exit 0
fi
echo "check-abi: ABI identical to $baseline"
exit 0
