#!/bin/sh
# expect_output.sh PATTERN COMMAND...: runs COMMAND, passing its output through; fails when the
# command fails or when no output line matches PATTERN (grep -E). Used to check that a test ran
# on the data path it is meant to cover, as the engine logs it at CFX_LOG_LEVEL=info.
pattern=$1
shift
log=$(mktemp)
"$@" >"$log" 2>&1
status=$?
cat "$log"
if [ $status -ne 0 ]; then
    rm -f "$log"
    exit $status
fi
if ! grep -Eq "$pattern" "$log"; then
    echo "expect_output: no line matched: $pattern" >&2
    rm -f "$log"
    exit 1
fi
rm -f "$log"
