#!/bin/sh
# junit-on-mpi.sh LIMIT_S COMMAND...: runs the JUnit suites under mpirun (COMMAND) and passes its
# status on. If the run is still going after LIMIT_S seconds (the suites take ~10 s), it has hit the
# open re-initialisation hang (docs/java.md, "Known problem"): the script prints the main-thread
# stack of every rank's JVM (jstack), stops the run and starts it once more, saying so. A run that
# fails is never repeated, and a second hang fails the test.
limit=$1
shift
attempt=1
while :; do
    "$@" &
    pid=$!
    waited=0
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "$limit" ]; do
        sleep 1
        waited=$((waited + 1))
    done
    if ! kill -0 "$pid" 2>/dev/null; then
        wait "$pid"
        exit $?
    fi
    echo "junit-on-mpi: the suites hung (no end after ${limit} s, attempt $attempt); where each rank is:" >&2
    for jvm in $(pgrep -P "$pid" 2>/dev/null); do
        if command -v jstack >/dev/null 2>&1; then
            jstack "$jvm" 2>&1 | sed -n '/^"main"/,/^$/p' | grep -E '^"main"|org\.conflux' >&2
        fi
    done
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    if [ "$attempt" -ge 2 ]; then
        echo "junit-on-mpi: hung again: failing" >&2
        exit 1
    fi
    attempt=2
    echo "junit-on-mpi: starting the suites once more" >&2
done
