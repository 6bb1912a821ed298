#!/bin/sh
# bench/nats.sh BUILD: idem on NATS JetStream beside a plain
# at-least-once consumer, on one nats-server and the same input.
#
# Starts a private nats-server (scripts/nats-test.sh), loads N events
# with 10 % redelivered duplicates (bench/gen_events) into the stream IN
# (bench/nats_alo load), then copies it twice, each through a durable
# consumer of its own and into an output stream of its own:
#
#   nats-alo    bench/nats_alo copy: fetch, publish each, wait for the
#               PubAcks, ack; no idempotency (the reference)
#   idem-local  idem dedup --from/--to nats://, --store local:DIR
#
# with the same batch and the same end (500 ms with nothing new). Each
# process is timed from outside; the 500 ms are taken off its time:
# messages_per_sec = N / (wall seconds - 0.5). The output streams'
# message counts are checked: N for the reference, the first occurrences
# for idem.
#
# IDEM_BENCH_NATS_N sets N (default 1000000; 100000 is a quick run),
# IDEM_BENCH_NATS_BATCH the batch (default 1000).
set -eu
BUILD=${1:-build}
N=${IDEM_BENCH_NATS_N:-1000000}
BATCH=${IDEM_BENCH_NATS_BATCH:-1000}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-nats-XXXXXX")
cleanup() {
    sh scripts/nats-test.sh stop "$tmp/nats" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

if ! port=$(sh scripts/nats-test.sh start "$tmp/nats"); then
    echo "# nats: no nats-server could be started"
    exit 0
fi
alo="$BUILD/bench/nats_alo"
now() { date +%s.%N; }
"$alo" stream "$port" IN in
"$alo" stream "$port" ALO alo.out
"$alo" stream "$port" IDEM idem.out
t0=$(now)
"$BUILD/bench/gen_events" "$N" 10 | "$alo" load "$port" in
echo "# nats: $N events (10% duplicates) loaded in" \
    "$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }') s;" \
    "batches of $BATCH, one server, each run to an idle 500 ms"

# timed NAME CMD...: run it, print its rate.
timed() {
    name=$1
    shift
    t0=$(now)
    "$@" 2>"$tmp/$name.err" || { cat "$tmp/$name.err"; echo "$name failed"; }
    awk -v n="$N" -v t0="$t0" -v t1="$(now)" -v sys="$name" 'BEGIN {
        s = t1 - t0 - 0.5
        printf "system=%s messages=%d seconds=%.3f messages_per_sec=%.0f\n",
            sys, n, s, n / s }' | tee -a "$tmp/runs.txt"
}
timed nats-alo "$alo" copy "$port" IN alo alo.out "$BATCH"
timed idem-local "$BUILD/idem" dedup --key event_id \
    --from "nats://127.0.0.1:$port/IN?durable=idem" \
    --to "nats://127.0.0.1:$port/idem.out" --store "local:$tmp/store" \
    --batch "$BATCH" --idle-exit 500ms --quiet
rate() { sed -n "s/^system=$1 .*messages_per_sec=\([0-9]*\).*/\1/p" \
    "$tmp/runs.txt"; }
a=$(rate nats-alo)
i=$(rate idem-local)
echo "nats_outputs: reference $("$alo" count "$port" ALO) of $N," \
    "idem $("$alo" count "$port" IDEM) (first occurrences)"
echo "nats_local_vs_alo=$(awk -v a="$i" -v b="$a" \
    'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }') (>= 0.9)"
