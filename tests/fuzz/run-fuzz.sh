#!/bin/sh
# run-fuzz.sh FUZZER CORPUS SECONDS: a bounded libFuzzer run of FUZZER on the committed CORPUS.
# The corpus is only read: new inputs go to a scratch folder beside the build's test files. A
# crash, leak or failed property fails the test, names the saved input and says how to keep it.
bin=$1 corpus=$2 secs=$3
name=$(basename "$bin")
work=$PWD/$name.run
rm -rf "$work"
mkdir -p "$work/new" "$work/artifacts"
"$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" "$work/new" "$corpus" >"$work/log" 2>&1
rc=$?
tail -n 30 "$work/log"
if [ $rc -ne 0 ]; then
    echo "run-fuzz: $name failed (exit $rc); saved input(s):"
    ls "$work/artifacts"/* 2>/dev/null
    echo "reproduce: $bin <input>; once fixed, keep the input as $corpus/regress-<what-it-broke>"
    exit 1
fi
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
echo "run-fuzz: $name: ${runs:-?} inputs in ${secs}s, no failure"
