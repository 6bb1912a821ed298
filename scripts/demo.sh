#!/bin/sh
# make demo: the main job, end to end, in a minute.
#
# Generates an order stream in which about one message in ten is a
# redelivery of an earlier one (as a broker does after a consumer
# timeout), charges each order once through `idem run` with a small shell
# handler on the default embedded store (./idem-data), kills idem with
# kill -9 in the middle, runs the same command again, and shows that the
# result file is byte for byte what an uninterrupted run writes.
set -eu
BUILD=${1:-build}
IDEM="$PWD/$BUILD/idem"
ORDERS=${IDEM_DEMO_ORDERS:-6000}
demo="$PWD/$BUILD/demo"
rm -rf "$demo"
mkdir -p "$demo"
cd "$demo"
unset IDEM_STORE

# The order stream: JSON lines, ~10% redelivered.
awk -v n="$ORDERS" 'BEGIN {
    srand(42); m = 0
    split("alice bob carol dave erin frank", who, " ")
    split("book lamp kettle chair desk mug", sku, " ")
    for (i = 0; i < n; i++) {
        if (m > 10 && rand() < 0.1) { print line[int(rand() * m)]; continue }
        line[m] = sprintf("{\"order_id\": \"ord-%06d\", \"customer\": \"%s\", " \
            "\"sku\": \"%s\", \"amount\": %d.%02d}", i, who[int(rand() * 6) + 1],
            sku[int(rand() * 6) + 1], int(rand() * 200) + 1, int(rand() * 100))
        print line[m++]
    }
}' > orders.ndjson

# The handler: "charges" an order by appending to a ledger, and answers.
# It reads a line, answers it at once: idem pipelines many at a time.
cat > charge.sh <<'HANDLER'
#!/bin/sh
while read -r env; do
    key=${env#*\"key\":\"}; key=${key%%\"*}
    token=${env#*\"token\":}; token=${token%%,*}
    amount=${env#*\"amount\": }; amount=${amount%%\}*}
    echo "$key $amount token=$token" >> ledger.txt
    echo "{\"ok\":true,\"charged\":$amount}"
done
HANDLER
chmod +x charge.sh

set -- run --job orders --key order_id --exec ./charge.sh --batch 200 \
    --commit-interval 20ms

echo "== $(wc -l < orders.ndjson) orders, some redelivered:"
head -n 2 orders.ndjson
echo
echo "== idem run, killed with kill -9 halfway:"
"$IDEM" "$@" --quiet --output results.ndjson orders.ndjson &
pid=$!
while [ "$( (wc -l <results.ndjson) 2>/dev/null || echo 0)" -lt \
    $((ORDERS / 3)) ]; do
    sleep 0.05
done
kill -9 $pid
wait $pid 2>/dev/null || true
echo "killed at $(wc -l < results.ndjson) results"
echo
echo "== the same command again:"
"$IDEM" "$@" --output results.ndjson orders.ndjson
echo
echo "== an uninterrupted run on a fresh store, for comparison:"
mkdir ref && (cd ref && cp ../charge.sh . &&
    "$IDEM" "$@" --quiet --output results.ndjson ../orders.ndjson)
if cmp -s results.ndjson ref/results.ndjson; then
    echo "results.ndjson is byte-identical to the uninterrupted run's"
else
    echo "results.ndjson DIFFERS from the uninterrupted run's" >&2
    exit 1
fi
echo
unique=$(sort -u orders.ndjson | wc -l)
charged=$(wc -l < ledger.txt)
again=$(awk '{ print $1 }' ledger.txt | sort | uniq -d | wc -l)
echo "== summary"
echo "orders in the stream:        $(wc -l < orders.ndjson) ($unique distinct)"
echo "results (one per order):     $(wc -l < results.ndjson)"
echo "handler calls:               $charged: $again orders reached the handler"
echo "                             a second time after kill -9: those in"
echo "                             flight or answered within the last"
echo "                             --commit-interval (20ms here), now with a"
echo "                             higher fencing token (idem run --help)"
echo
"$IDEM" stats
echo
first=$(head -n 1 orders.ndjson | sed 's/.*"order_id": "\([^"]*\)".*/\1/')
echo "try: cd $BUILD/demo && ../idem get --job orders $first"
