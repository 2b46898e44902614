#!/bin/sh
# junit-on-mpi.sh LIMIT_S COMMAND...: runs the JUnit suites under mpirun (COMMAND) and passes its
# status on. If the run is still going after LIMIT_S seconds (the suites take ~10-20 s), it prints
# the main-thread stack of every rank's JVM (jstack) and fails: JUnit's own output is buffered and
# lost when mpirun is killed, so without the stacks a hang would say nothing about where each rank
# stood. Ranks that fall out of step (one leaves a test early on a failure) wait on each other's
# collectives; the stacks show the tests they are in.
limit=$1
shift
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
echo "junit-on-mpi: the suites hung (no end after ${limit} s); where each rank is:" >&2
for jvm in $(pgrep -P "$pid" 2>/dev/null); do
    if command -v jstack >/dev/null 2>&1; then
        jstack "$jvm" 2>&1 | sed -n '/^"main"/,/^$/p' | grep -E '^"main"|org\.conflux' >&2
    fi
done
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
exit 1
