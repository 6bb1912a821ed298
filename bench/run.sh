#!/bin/sh
# make bench: idem beside its references, in one run on one machine.
#
# Starts a private redis-server on a loopback port, runs `idem bench` for
# each workload on a fresh local store, the reference programs on the same
# key stream, and prints every figure and the ratios the README quotes.
# Then the Redis backends: idem's claims against the classic WATCH/MULTI
# pattern and raw SET NX PX on the same server, and on a private 3-master
# Redis Cluster (scripts/redis-test.sh starts it on free loopback ports).
# Then scaling with masters: 6 more nodes, which redis_claims regroups
# into clusters of 1, 2 and 3 masters claiming the same keys in turns;
# with fewer cores than masters the wall clock cannot grow, so beside it
# it prints the claims/s projected from each master's measured CPU time
# (see bench/redis_claims.c).
# Last, Redis Streams (bench/streams.sh, on a server of its own): a plain
# at-least-once consumer against `idem dedup --from/--to redis-stream://`.
# IDEM_BENCH_N sets the message count (default 1000000); the Redis part
# uses IDEM_BENCH_REDIS_N (default 200000), the Streams part
# IDEM_BENCH_STREAM_N (default 1000000). Then NATS JetStream
# (bench/nats.sh): IDEM_BENCH_NATS_N (default 1000000). Then Kafka
# (bench/kafka.sh, on librdkafka's mock cluster): a plain at-least-once
# loop against `idem dedup --from/--to kafka://`, IDEM_BENCH_KAFKA_N
# messages.
set -eu
BUILD=${1:-build}
N=${IDEM_BENCH_N:-1000000}
BATCH=1000
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-bench-XXXXXX")
port=$((20000 + $$ % 20000))
cleanup() {
    [ -f "$tmp/redis.pid" ] && kill "$(cat "$tmp/redis.pid")" 2>/dev/null
    sh scripts/redis-test.sh stop "$tmp/cluster" 2>/dev/null
    sh scripts/redis-test.sh stop "$tmp/scale" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize yes --pidfile "$tmp/redis.pid" --dir "$tmp" >/dev/null
for _ in 1 2 3 4 5 6 7 8 9 10; do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.2
done

val() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
idem_run() {
    rm -rf "$tmp/store"
    "$BUILD/idem" bench --store "local:$tmp/store" -n "$N" --batch "$BATCH" \
        --keys random "$@"
}

echo "# idem bench: $N random 36-byte keys, batches of $BATCH, durable"
claim=$(idem_run --workload claim --reopen); echo "$claim"
cc=$(idem_run --workload claim-complete); echo "$cc"
replay=$(idem_run --workload replay); echo "$replay"
redis=$("$BUILD/bench/ref_claims" redis "$port" "$N"); echo "$redis"
lmdb=$("$BUILD/bench/ref_claims" lmdb "$tmp/lmdb" "$N" "$BATCH"); echo "$lmdb"

r() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
c_ops=$(val ops_per_sec "$claim"); cc_ops=$(val ops_per_sec "$cc")
redis_ops=$(val ops_per_sec "$redis"); lmdb_ops=$(val ops_per_sec "$lmdb")
echo "# ratios (targets in parentheses)"
echo "claim_vs_redis_setnx=$(r "$c_ops" "$redis_ops") (>= 3)"
echo "claim_vs_lmdb=$(r "$c_ops" "$lmdb_ops") (>= 10)"
echo "claim_complete_vs_redis_setnx=$(r "$cc_ops" "$redis_ops") (>= 1.5)"
echo "replay_ops_per_sec=$(val ops_per_sec "$replay") (>= 3000000)"
echo "index_bytes_per_key=$(val index_bytes_per_key "$claim") (<= 64)"
echo "reopen_seconds=$(val reopen_seconds "$claim") for $N keys"

if [ -x "$BUILD/bench/keys" ]; then
    echo "# key generation"
    "$BUILD/bench/keys"
fi

# redis_claims MODE on a private cluster of N masters, stopped after it
# and its pid files gone, so that cleanup cannot signal a reused pid.
on_cluster() {
    if ports=$(sh scripts/redis-test.sh cluster "$tmp/$1" "$2" 0); then
        "$BUILD/bench/redis_claims" "$1" "$ports" "$3"
    else
        echo "# redis $1: $2 nodes could not be started"
    fi
    sh scripts/redis-test.sh stop "$tmp/$1"
    rm -rf "$tmp/${1:?}"
}

if [ -x "$BUILD/bench/redis_claims" ]; then
    RN=${IDEM_BENCH_REDIS_N:-200000}
    echo "# redis: $RN random 36-byte keys, claim_many batches of 1000"
    "$BUILD/bench/redis_claims" single "$port" "$RN"
    on_cluster cluster 3 "$RN"
    on_cluster scale 6 "$RN"
fi

# dedup against mawk, and run with a trivial handler, on one corpus:
# N NDJSON events (~150 bytes each), 10% redelivered duplicates.
echo "# idem dedup vs mawk: $N events, 10% duplicates, --output (durable)"
"$BUILD/bench/gen_events" "$N" 10 > "$tmp/events.ndjson"
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
now() { date +%s.%N; }
peak_kb() { sed -n 's/.*Maximum resident set size (kbytes): //p' "$1"; }
t0=$(now)
mawk -F'"event_id": "' '{split($2,a,"\""); if(!seen[a[1]]++) print}' \
    "$tmp/events.ndjson" > "$tmp/mawk.out"
t1=$(now)
rm -rf "$tmp/dstore"
if command -v /usr/bin/time >/dev/null; then
    timer="/usr/bin/time -v -o $tmp/time.txt"
else
    timer=""
fi
t2=$(now)
$timer "$BUILD/idem" dedup --key event_id --store "local:$tmp/dstore" \
    --output "$tmp/idem.out" --quiet "$tmp/events.ndjson"
t3=$(now)
mawk_s=$(secs "$t0" "$t1"); idem_s=$(secs "$t2" "$t3")
cmp -s "$tmp/mawk.out" "$tmp/idem.out" && same=yes || same=NO
echo "mawk_seconds=$mawk_s idem_dedup_seconds=$idem_s same_output=$same"
echo "mawk_lines_per_sec=$(r "$N" "$mawk_s")" \
    "idem_dedup_lines_per_sec=$(r "$N" "$idem_s")"
echo "dedup_vs_mawk=$(r "$mawk_s" "$idem_s") (>= 2)"
[ -n "$timer" ] && echo "dedup_peak_rss_kb=$(peak_kb "$tmp/time.txt") (<= 204800)"

echo "# idem run: $N events, trivial handler (bench/handler_ok.c)"
rm -rf "$tmp/rstore"
t0=$(now)
"$BUILD/idem" run --key event_id --store "local:$tmp/rstore" \
    --exec "$BUILD/bench/handler_ok" --output "$tmp/run.out" --quiet \
    "$tmp/events.ndjson"
t1=$(now)
run_s=$(secs "$t0" "$t1")
echo "run_seconds=$run_s run_messages_per_sec=$(r "$N" "$run_s") (>= 200000)"
# The cost of committing by time (default --commit-interval 200ms, and
# 20ms as make demo uses) against committing only when a batch is done.
for ci in 0 20ms; do
    rm -rf "$tmp/rstore" "$tmp/run.out"
    t0=$(now)
    "$BUILD/idem" run --key event_id --store "local:$tmp/rstore" \
        --exec "$BUILD/bench/handler_ok" --output "$tmp/run.out" --quiet \
        --commit-interval "$ci" "$tmp/events.ndjson"
    t1=$(now)
    ci_s=$(secs "$t0" "$t1")
    echo "run_commit_interval_${ci}_messages_per_sec=$(r "$N" "$ci_s")" \
        "default_vs_this=$(r "$ci_s" "$run_s")"
done

if [ -x "$BUILD/bench/stream_alo" ]; then
    sh bench/streams.sh "$BUILD"
fi
if [ -x "$BUILD/bench/nats_alo" ]; then
    sh bench/nats.sh "$BUILD"
fi

if [ -x "$BUILD/bench/kafka_alo" ]; then
    sh bench/kafka.sh "$BUILD"
fi
