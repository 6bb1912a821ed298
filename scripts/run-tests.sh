#!/bin/sh
# Run the test suite in BUILD (default build) and close with one line
# "N passed, M failed". Each test runs in its own process with a timeout
# (Criterion's isolation); a hang or crash counts as a failure.
# IDEM_TEST_FILTER='suite/*' narrows the run.
BUILD=${1:-build}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export IDEM_PROGS="$PWD/$BUILD/progs" IDEM_CLI="$PWD/$BUILD/idem"
"$BUILD/idem-tests" --jobs "${IDEM_TEST_JOBS:-2}" \
    ${IDEM_TEST_FILTER:+--filter "$IDEM_TEST_FILTER"} 2>&1 | tee "$out"
syn=$(grep 'Synthesis:' "$out" | tail -n 1)
if [ -z "$syn" ]; then
    echo "0 passed, 1 failed"
    exit 1
fi
tested=$(echo "$syn" | sed -n 's/.*Tested: \([0-9]*\).*/\1/p')
passing=$(echo "$syn" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p')
failed=$((tested - passing))
echo "$passing passed, $failed failed"
[ "$failed" -eq 0 ]
