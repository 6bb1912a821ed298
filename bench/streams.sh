#!/bin/sh
# bench/streams.sh BUILD: idem on Redis Streams beside a plain
# at-least-once consumer, on one server and the same input.
#
# Starts a private redis-server on a free loopback port
# (scripts/redis-test.sh), loads N entries with 10 % redelivered
# duplicates into the stream "in" (bench/gen_events --xadd, pipelined by
# redis-cli --pipe), then copies that stream to an output stream three
# ways, each through a consumer group of its own created at ID 0, so
# that each reads the same entries in the same order:
#
#   stream-alo  bench/stream_alo: XREADGROUP, XADD each entry, XACK; no
#               idempotency (the reference)
#   idem-local  idem dedup --from/--to redis-stream://, --store local:DIR
#   idem-redis  the same with the store on the same server
#               (--store redis://...?prefix=b:): the entries, the acks
#               and the completions commit in one script
#   idem-redis-rb  the same, told to write before the commit and read
#               back after a crash instead (one_script=0): the A/B of
#               the one-script commit
#   floor-set, floor-day, floor-multi, floor-day-multi, floor-rb,
#   floor-day-rb
#               bench/stream_alo with a dedup argument: the least any
#               dedup with its store on the same server can do (a key
#               done with a TTL, nothing more; its comment says how
#               each does it), the floor idem-redis is measured against.
#               Not run unless named in IDEM_BENCH_STREAM_SYSTEMS.
#
# all with the same batch (XREADGROUP COUNT and idem's --batch) and the
# same end: 500 ms with nothing new (stream_alo's BLOCK 500, idem's
# --idle-exit 500ms). Each process is timed from outside, and the 500 ms
# are taken off its time: entries_per_sec = N / (wall seconds - 0.5).
# Beside it, the CPU the server and the client spent per entry (INFO
# cpu; /usr/bin/time), steadier than the wall clock on a shared machine.
# Every contender starts on an empty output stream and an empty store;
# at the end the output lengths are checked (N for the reference, the
# same number of first occurrences for both idem runs) and nothing may
# be left pending.
#
# IDEM_BENCH_STREAM_N sets N (default 1000000), IDEM_BENCH_STREAM_BATCH
# the batch (default 1000), IDEM_BENCH_STREAM_ROUNDS how many times the
# three run in turn (default 1; each round's figures are printed, and the
# ratios of the best run of each). IDEM_BENCH_STREAM_SYSTEMS runs only
# the systems named (e.g. "stream-alo idem-local"; the checks then judge
# those alone). IDEM_BENCH_STREAM_STORE_OPTS is appended to the Redis
# store's URI (e.g. "&layout=day"). IDEM_BENCH_STREAM_COMMANDS=1 prints after each run what
# the server ran for it per input entry (INFO commandstats, reset before
# the run): each command's calls and microseconds, commands run inside
# scripts counted apart from the EVALSHA that ran them; and at the end,
# on the same server, bench/stream_scripts: the one-script commit's
# parts apart (claims, completions, XADDs through the script, the same
# XADDs sent by a client), server CPU per key.
set -eu
BUILD=${1:-build}
N=${IDEM_BENCH_STREAM_N:-1000000}
BATCH=${IDEM_BENCH_STREAM_BATCH:-1000}
ROUNDS=${IDEM_BENCH_STREAM_ROUNDS:-1}
COMMANDS=${IDEM_BENCH_STREAM_COMMANDS:-0}
STORE_OPTS=${IDEM_BENCH_STREAM_STORE_OPTS:-}
SYSTEMS=${IDEM_BENCH_STREAM_SYSTEMS:-stream-alo idem-local idem-redis \
idem-redis-rb}
IDLE=0.5
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-streams-XXXXXX")
cleanup() {
    sh scripts/redis-test.sh stop "$tmp/redis" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

if ! port=$(sh scripts/redis-test.sh single "$tmp/redis"); then
    echo "# redis streams: no redis-server could be started"
    exit 0
fi
rcli() { redis-cli -p "$port" "$@"; }
now() { date +%s.%N; }
r() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
# The server's work per entry since the last reset, one line per
# command: "  command calls_per_entry us_per_entry".
commands_per_entry() {
    rcli info commandstats | tr -d '\r' | awk -F'[:,=]' -v n="$N" '
        /^cmdstat_/ {
            sub(/^cmdstat_/, "", $1)
            printf "  %s calls_per_entry=%.3f us_per_entry=%.2f\n", \
                $1, $3 / n, $5 / n
        }' | sort -t= -k3 -rn
}
server_cpu() {
    rcli info cpu | tr -d '\r' |
        awk -F: '/^used_cpu_(user|sys):/ { s += $2 } END { print s }'
}

t0=$(now)
"$BUILD/bench/gen_events" --xadd in "$N" 10 | rcli --pipe >"$tmp/load.txt"
grep -q 'errors: 0' "$tmp/load.txt" || { cat "$tmp/load.txt"; exit 1; }
echo "# redis streams: $N entries (10% duplicates) loaded in" \
    "$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }') s;" \
    "batches of $BATCH, one server, each run to an idle 500 ms"

# $OPT: one_script=0 for idem-redis-rb, else one_script=1 (the default)
src() { echo "redis-stream://127.0.0.1:$port/in?group=$1&$OPT"; }
dst() { echo "redis-stream://127.0.0.1:$port/$1?$OPT"; }
# contender SYSTEM ROUND: one run on a fresh group, output and store.
contender() {
    group=$1-$2
    OPT=one_script=1
    rm -rf "$tmp/store"
    rcli --scan --pattern 'b:*' | xargs -r -n 1000 redis-cli -p "$port" \
        unlink >/dev/null
    case $1 in
    stream-alo) set -- "$BUILD/bench/stream_alo" "$port" in "$group" \
        "$group" "$BATCH" ;;
    floor-*) set -- "$BUILD/bench/stream_alo" "$port" in "$group" \
        "$group" "$BATCH" "${1#floor-}" ;;
    idem-local) set -- "local:$tmp/store" ;;
    idem-redis) set -- "redis://127.0.0.1:$port?prefix=b:$STORE_OPTS" ;;
    idem-redis-rb) OPT=one_script=0 &&
        set -- "redis://127.0.0.1:$port?prefix=b:$STORE_OPTS" ;;
    esac
    case $1 in
    local:* | redis:*) set -- "$BUILD/idem" dedup --key event_id \
        --from "$(src "$group")" --to "$(dst "$group")" --store "$1" \
        --batch "$BATCH" --idle-exit 500ms --quiet ;;
    esac
    [ "$COMMANDS" = 1 ] && rcli config resetstat >/dev/null
    c0=$(server_cpu)
    t0=$(now)
    rc=0
    if [ -x /usr/bin/time ]; then
        /usr/bin/time -f '%U %S' -o "$tmp/time.txt" "$@" >/dev/null || rc=$?
    else
        echo "0 0" >"$tmp/time.txt"
        "$@" >/dev/null || rc=$?
    fi
    t1=$(now)
    c1=$(server_cpu)
    [ "$COMMANDS" = 1 ] && commands_per_entry
    out=$(rcli xlen "$group")
    pending=$(rcli xpending in "$group" | head -n 1)
    rcli unlink "$group" >/dev/null
    if [ "$rc" -ne 0 ]; then
        echo "system=$group failed=$rc (exit status)" | tee -a "$tmp/runs.txt"
        return 0
    fi
    awk -v n="$N" -v t0="$t0" -v t1="$t1" -v idle="$IDLE" -v c0="$c0" \
        -v c1="$c1" -v sys="$group" -v out="$out" -v pend="$pending" '
        { client = $1 + $2 }
        END {
            s = t1 - t0 - idle
            printf "system=%s entries=%d seconds=%.3f entries_per_sec=%.0f", \
                sys, n, s, n / s
            printf " server_cpu_us_per_entry=%.2f", (c1 - c0) * 1e6 / n
            printf " client_cpu_us_per_entry=%.2f", client * 1e6 / n
            printf " output_entries=%d pending=%d\n", out, pend
        }' "$tmp/time.txt" | tee -a "$tmp/runs.txt"
}

round=1
while [ "$round" -le "$ROUNDS" ]; do
    for sys in $SYSTEMS; do
        contender "$sys" "$round"
    done
    round=$((round + 1))
done

# The best of the rounds for each system, and its checks.
field() {
    grep "^system=$1-[0-9]" "$tmp/runs.txt" | tr ' ' '\n' | sed -n "s/^$2=//p"
}
best() { field "$1" entries_per_sec | sort -n | tail -n 1; }
ratio() {
    if [ -n "$1" ] && [ -n "$2" ]; then r "$1" "$2"; else echo "n/a"; fi
}
alo=$(best stream-alo); local_=$(best idem-local); redis=$(best idem-redis)
redis_rb=$(best idem-redis-rb)
outs() { field "$1" output_entries | sort -u | tr '\n' ' ' | sed 's/ $//'; }
fresh=$(outs idem-local)
pending=$(field '[a-z-]*' pending | sort -u | tr '\n' ' ' | sed 's/ $//')
FLOORS="floor-set floor-day floor-multi floor-day-multi floor-rb floor-day-rb"
# Each floor that ran wrote what idem-local wrote.
floors_same() {
    for f in $FLOORS; do
        o=$(outs "$f")
        [ -z "$o" ] || [ "$o" = "$fresh" ] || return 1
    done
}
# Every run done; the reference copied everything; both idem runs, in
# every round, the same one number of entries, fewer than the input.
same=NO
case $fresh in
'' | *' '* | "$N") ;;
*)
    if [ "$(outs stream-alo)" = "$N" ] && [ "$pending" = 0 ] &&
        { [ -z "$redis" ] || [ "$fresh" = "$(outs idem-redis)" ]; } &&
        { [ -z "$redis_rb" ] || [ "$fresh" = "$(outs idem-redis-rb)" ]; } &&
        floors_same &&
        ! grep -q failed= "$tmp/runs.txt"; then
        same=yes
    fi
    ;;
esac
echo "# redis streams: ratios to the at-least-once reference" \
    "(targets in parentheses)"
echo "stream_outputs_ok=$same (entries out: reference $(outs stream-alo)" \
    "of $N, idem ${fresh:-none}, $(outs idem-redis) and" \
    "$(outs idem-redis-rb); pending:" \
    "${pending:-none})"
echo "stream_local_vs_alo=$(ratio "$local_" "$alo") (>= 0.9)"
echo "stream_redis_vs_alo=$(ratio "$redis" "$alo") (>= 0.6)"
echo "stream_redis_readback_vs_alo=$(ratio "$redis_rb" "$alo")" \
    "(one script vs read-back: $(ratio "$redis" "$redis_rb"))"
for f in $FLOORS; do
    b=$(best "$f")
    [ -n "$b" ] && echo "stream_${f#floor-}_floor_vs_alo=$(ratio "$b" "$alo")" \
        "(idem-redis / this floor: $(ratio "$redis" "$b"))"
done
if [ "$COMMANDS" = 1 ]; then
    echo "# the one-script commit's parts (bench/stream_scripts)"
    "$BUILD/bench/stream_scripts" "$port" "$N"
fi
