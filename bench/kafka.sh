#!/bin/sh
# bench/kafka.sh BUILD: idem on Kafka beside a plain at-least-once loop,
# on one mock cluster and the same input.
#
# Starts librdkafka's mock cluster (tests/progs/kafka_mock: 3 brokers on
# loopback, in one process), loads N events with 10 % redelivered
# duplicates into the topic "in" (bench/gen_events through
# kafka_alo --load), then copies that topic two ways, each through a consumer group
# of its own into an empty output topic:
#
#   kafka-alo   bench/kafka_alo: consume a batch, produce each message
#               (idempotent producer, acks=all), await the deliveries,
#               commit the offsets; no idempotency (the reference)
#   idem-local  idem dedup --from/--to kafka://, --store local:DIR
#
# with the same batch and the same end: 2 s with nothing new once every
# partition was read to its end (the mock's fetches pause now and then
# for librdkafka's backoff of 500 ms: a shorter idle ends runs early).
# Each process is timed from outside and the 2 s are taken off:
# messages_per_sec = messages read / (wall seconds - 2); the mock may
# have dropped some of the oldest, and both read the same ones. Joining the group is in both times. The mock is not a
# real broker (no disk, no replication, one process on this machine): the
# ratio says what idem adds to a consumer, not what a cluster does.
#
# IDEM_BENCH_KAFKA_N sets N (default 1000000), IDEM_BENCH_KAFKA_BATCH the
# batch (default 1000), IDEM_BENCH_KAFKA_ROUNDS how many times the two
# run in turn (default 1; the best run of each gives the ratio).
set -eu
BUILD=${1:-build}
N=${IDEM_BENCH_KAFKA_N:-1000000}
BATCH=${IDEM_BENCH_KAFKA_BATCH:-1000}
ROUNDS=${IDEM_BENCH_KAFKA_ROUNDS:-1}
IDLE=2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-kafka-XXXXXX")
mock=
cleanup() {
    exec 3>&- 2>/dev/null || true
    [ -z "$mock" ] || kill "$mock" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

if ! command -v kcat >/dev/null || [ ! -x "$BUILD/progs/kafka_mock" ]; then
    echo "# kafka: needs kcat and $BUILD/progs/kafka_mock"
    exit 0
fi
# kcat counts the outputs (kcat -P lost messages on the mock here, so
# the input is loaded by kafka_alo --load, which awaits each delivery).
# The mock keeps at most 5 MB a partition (older messages are dropped),
# so the topics get a partition for every 10 000 messages, which the
# load spreads evenly (kafka_alo --load).
parts=$(((N + 9999) / 10000))
[ "$parts" -ge 4 ] || parts=4
topics="in:$parts"
round=1
while [ "$round" -le "$ROUNDS" ]; do
    topics="$topics kafka-alo-$round:$parts idem-local-$round:$parts"
    round=$((round + 1))
done
mkfifo "$tmp/ctl"
# shellcheck disable=SC2086 # a list of topics, split on purpose
"$BUILD/progs/kafka_mock" $topics <"$tmp/ctl" >"$tmp/boot" &
mock=$!
exec 3>"$tmp/ctl"
until [ -s "$tmp/boot" ]; do sleep 0.1; done
brokers=$(head -n 1 "$tmp/boot")
now() { date +%s.%N; }
r() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

t0=$(now)
"$BUILD/bench/gen_events" "$N" 10 |
    "$BUILD/bench/kafka_alo" --load "$brokers" in
echo "# kafka: $N messages (10% duplicates) loaded in" \
    "$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }') s;" \
    "batches of $BATCH, librdkafka's mock cluster (3 brokers, $parts" \
    "partitions)"

# Messages in a topic: the sum of its partitions' ends (kcat -C -e stops
# early on the mock's long partitions, so it cannot count them).
count() {
    p=0
    while [ "$p" -lt "$parts" ]; do
        kcat -C -b "$brokers" -t "$1" -p "$p" -o -1 -e -q -f '%o\n' \
            2>/dev/null || true
        p=$((p + 1))
    done | awk '{ n += $1 + 1 } END { print n + 0 }'
}
# contender SYSTEM ROUND: one run on a fresh group, output and store.
contender() {
    out=$1-$2
    rm -rf "$tmp/store"
    case $1 in
    kafka-alo) set -- "$BUILD/bench/kafka_alo" "$brokers" in "$out" "$out" \
        "$BATCH" 2000 ;;
    idem-local) set -- "$BUILD/idem" dedup --key event_id \
        --from "kafka://$brokers/in?group=$out" --to "kafka://$brokers/$out" \
        --store "local:$tmp/store" --batch "$BATCH" --idle-exit 2s \
        --stats-json ;;
    esac
    t0=$(now)
    rc=0
    "$@" >"$tmp/out.txt" 2>"$tmp/err.txt" || rc=$?
    t1=$(now)
    if [ "$rc" -ne 0 ]; then
        echo "system=$out failed=$rc (exit status)" | tee -a "$tmp/runs.txt"
        return 0
    fi
    # Messages read: the reference prints them, idem's --stats-json too.
    read=$(sed -n 's/.*"read":\([0-9]*\).*/\1/p' "$tmp/err.txt")
    read=${read:-$(cat "$tmp/out.txt")}
    awk -v n="$N" -v t0="$t0" -v t1="$t1" -v idle="$IDLE" -v sys="$out" \
        -v out="$(count "$out")" -v rd="$read" 'BEGIN {
            s = t1 - t0 - idle
            m = rd > 0 ? rd : n
            printf "system=%s messages=%d seconds=%.3f messages_per_sec=%.0f", \
                sys, m, s, m / s
            printf " read=%d output_messages=%d\n", rd, out
        }' | tee -a "$tmp/runs.txt"
}

round=1
while [ "$round" -le "$ROUNDS" ]; do
    for sys in kafka-alo idem-local; do
        contender "$sys" "$round"
    done
    round=$((round + 1))
done

field() {
    grep "^system=$1-" "$tmp/runs.txt" | tr ' ' '\n' | sed -n "s/^$2=//p"
}
best() { field "$1" messages_per_sec | sort -n | tail -n 1; }
alo=$(best kafka-alo)
idem=$(best idem-local)
outs() { field "$1" output_messages | sort -u | tr '\n' ' ' | sed 's/ $//'; }
reads() { field "$1" read | sort -u | tr '\n' ' ' | sed 's/ $//'; }
echo "# kafka: ratio to the at-least-once reference (target in parentheses)"
echo "kafka_outputs (messages read: reference $(reads kafka-alo), idem" \
    "$(reads idem-local) of $N; out: reference $(outs kafka-alo), idem" \
    "$(outs idem-local))"
if [ -n "$alo" ] && [ -n "$idem" ]; then
    echo "kafka_local_vs_alo=$(r "$idem" "$alo") (>= 0.9)"
else
    echo "kafka_local_vs_alo=n/a (a run failed)"
fi
