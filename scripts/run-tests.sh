#!/bin/sh
# Run the test suite in BUILD (default build) and close with one line
# "N passed, M failed". Each test runs in its own process with a timeout
# (Criterion's isolation); a hang or crash counts as a failure.
# IDEM_TEST_FILTER='suite/*' narrows the run.
#
# The Redis tests share one redis-server, one 6-node Redis Cluster
# (3 masters, 3 replicas) and one master watched by three sentinels (with
# its replica), started here on free loopback ports and killed
# on exit together with every server a test started for itself (they all
# live under one directory, IDEM_REDIS_ROOT), even when a test was killed
# by its timeout. Without these variables a test starts its own servers.
BUILD=${1:-build}
out=$(mktemp)
tap=$(mktemp)
root=$(mktemp -d "${TMPDIR:-/tmp}/idem-redis-XXXXXX")
tests=
cleanup() {
    [ -z "$tests" ] || kill "$tests" 2>/dev/null
    sh scripts/redis-test.sh stop "$root"
    rm -rf "$out" "$tap" "$root"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export IDEM_PROGS="$PWD/$BUILD/progs" IDEM_CLI="$PWD/$BUILD/idem"
export IDEM_SCRIPTS="$PWD/scripts" IDEM_REDIS_ROOT="$root"
case "${IDEM_TEST_FILTER:-*}" in
*redis*|*cluster*|*sentinel*|*conf*|\**)
    if ! single=$(sh scripts/redis-test.sh single "$root/shared") ||
        ! cluster=$(sh scripts/redis-test.sh cluster "$root/shared-cluster" 3 1) ||
        ! sentinel=$(sh scripts/redis-test.sh sentinel "$root/shared-sentinel" \
            idem-shared)
    then
        echo "run-tests: cannot start the shared Redis servers" >&2
        echo "0 passed, 1 failed"
        exit 1
    fi
    export IDEM_TEST_REDIS="127.0.0.1:$single"
    IDEM_TEST_CLUSTER=$(echo "$cluster" | sed 's/\([0-9][0-9]*\)/127.0.0.1:\1/g')
    export IDEM_TEST_CLUSTER
    # The sentinels (the 3rd to 5th ports) and the name of their master.
    IDEM_TEST_SENTINEL="$(echo "$sentinel" | cut -d, -f3- |
        sed 's/\([0-9][0-9]*\)/127.0.0.1:\1/g')/idem-shared"
    export IDEM_TEST_SENTINEL
    ;;
esac
# The output goes to a file, not a pipe: a process a test left behind
# (a handler that outlived a killed test) would hold a pipe open and hang
# the run; tail follows the file only while the tests run. Every test has
# a timeout: its own, its suite's, or the default given here.
"$BUILD/idem-tests" --jobs "${IDEM_TEST_JOBS:-3}" \
    --timeout "${IDEM_TEST_TIMEOUT:-600}" --tap="$tap" \
    ${IDEM_TEST_FILTER:+--filter "$IDEM_TEST_FILTER"} >"$out" 2>&1 &
tests=$!
tail -n +1 -f --pid="$tests" "$out"
wait "$tests" || true
syn=$(grep 'Synthesis:' "$out" | tail -n 1)
if [ -z "$syn" ]; then
    echo "0 passed, 1 failed"
    exit 1
fi
# Where the time went: the slowest tests and suites, so that a suite
# that grows past its share of CI's budget shows before the budget does.
sed -n 's/^ok - \([^ ]*\)  (\([0-9.]*\)s).*/\2 \1/p; s/^not ok - \([^ ]*\)  (\([0-9.]*\)s).*/\2 \1/p' \
    "$tap" | sort -rn | awk '
    { t[NR] = $0; split($2, p, "::"); suite[p[1]] += $1; all += $1 }
    END {
        printf "slowest tests (%.0f s of test time in all):\n", all
        for (i = 1; i <= 8 && i <= NR; i++) {
            split(t[i], f, " ")
            printf "  %7.1f s  %s\n", f[1], f[2]
        }
        printf "slowest suites:"
        n = 0
        for (s in suite) order[++n] = sprintf("%09.2f %s", suite[s], s)
        for (i = 1; i <= n; i++)
            for (j = i + 1; j <= n; j++)
                if (order[j] > order[i]) { x = order[i]; order[i] = order[j]; order[j] = x }
        for (i = 1; i <= 8 && i <= n; i++) {
            split(order[i], f, " ")
            printf " %s %.0f s%s", f[2], f[1], i < 8 && i < n ? "," : "\n"
        }
    }'
# The failures last, beside the count, where a log's tail shows them.
sed -n 's/^not ok - \([^ ]*\) .*/failed: \1/p' "$tap"
tested=$(echo "$syn" | sed -n 's/.*Tested: \([0-9]*\).*/\1/p')
passing=$(echo "$syn" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p')
failed=$((tested - passing))
if [ "$tested" -eq 0 ]; then
    echo "run-tests: no test ran${IDEM_TEST_FILTER:+ (filter: $IDEM_TEST_FILTER)}" >&2
    failed=1
fi
echo "$passing passed, $failed failed"
[ "$failed" -eq 0 ]
