#!/bin/sh
# Start and stop the Redis servers the tests and benchmarks use, on free
# loopback ports, each in its own directory under DIR:
#
#   redis-test.sh single DIR [ARGS...]  one server (ARGS: redis-server
#                                       options, e.g. --requirepass PW);
#                                       prints its port
#   redis-test.sh cluster DIR M R       a cluster of M masters with R
#                                       replicas each; prints the ports,
#                                       comma-separated, masters first
#   redis-test.sh sentinel DIR NAME [PW SPW]
#                                       a master, its replica and three
#                                       sentinels watching it as NAME
#                                       (quorum 2, a failover in a few
#                                       seconds); with PW and SPW the
#                                       servers require PW, the sentinels
#                                       SPW. Prints the ports,
#                                       comma-separated: master, replica,
#                                       then the sentinels
#   redis-test.sh restart DIR PORT      start the server of PORT again,
#                                       as it was (a cluster node rejoins
#                                       with its nodes.conf)
#   redis-test.sh stop DIR              kill -9 every server under DIR
#
# Ports are picked at random in 21000-29999 (cluster bus: +10000) and
# retried when taken, so concurrent runs (make test beside make asan,
# Criterion's parallel jobs) do not collide. Nothing is written outside
# DIR; nothing persists (no RDB, no AOF).
set -eu
cmd=$1
dir=$2

rand_port() {
    n=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
    echo $((21000 + n % 9000))
}

# launch PORT EXTRA...: start the server of PORT, daemonized, its files
# in DIR/PORT; a sentinel if DIR/PORT/sentinel.conf exists.
launch() {
    lp=$1
    shift
    set -- --port "$lp" --bind 127.0.0.1 --save '' --appendonly no \
        --daemonize yes --pidfile "$dir/$lp/pid" --dir "$dir/$lp" \
        --logfile "$dir/$lp/log" "$@"
    if [ -f "$dir/$lp/sentinel.conf" ]; then
        redis-sentinel "$dir/$lp/sentinel.conf" "$@"
    else
        redis-server "$@"
    fi
}

# start_one EXTRA...: start a server on a free port, wait for it; with
# $sentinel_conf set, a sentinel of that configuration.
start_one() {
    extra="$*"
    for _try in 1 2 3 4 5 6 7 8 9 10; do
        p=$(rand_port)
        [ -e "$dir/$p" ] && continue
        if redis-cli -p "$p" ping >/dev/null 2>&1 ||
            redis-cli -p $((p + 10000)) ping >/dev/null 2>&1; then
            continue
        fi
        mkdir -p "$dir/$p"
        echo "$extra" >"$dir/$p/args"
        if [ -n "${sentinel_conf:-}" ]; then
            printf '%s\n' "$sentinel_conf" >"$dir/$p/sentinel.conf"
        fi
        # shellcheck disable=SC2086
        launch "$p" $extra
        i=0
        while [ $i -lt 100 ]; do
            # A server with --requirepass answers NOAUTH: it is up.
            if redis-cli -p "$p" ping 2>/dev/null | grep -q 'PONG\|NOAUTH'; then
                echo "$p"
                return 0
            fi
            if grep -q -i 'in use\|could not create\|fatal' \
                "$dir/$p/log" 2>/dev/null; then
                break
            fi
            sleep 0.05
            i=$((i + 1))
        done
        [ -f "$dir/$p/pid" ] && kill -9 "$(cat "$dir/$p/pid")" 2>/dev/null
        rm -rf "${dir:?}/$p"
    done
    echo "redis-test.sh: cannot start redis-server" >&2
    return 1
}

case $cmd in
single)
    mkdir -p "$dir"
    shift 2
    start_one "$@"
    ;;
cluster)
    masters=$3
    replicas=$4
    mkdir -p "$dir"
    n=$((masters * (replicas + 1)))
    ports=""
    addrs=""
    i=0
    while [ $i -lt "$n" ]; do
        p=$(start_one --cluster-enabled yes --cluster-config-file nodes.conf \
            --cluster-node-timeout 1000 --cluster-replica-validity-factor 0 \
            --cluster-allow-replica-migration no --repl-diskless-sync-delay 0)
        ports="$ports${ports:+,}$p"
        addrs="$addrs 127.0.0.1:$p"
        i=$((i + 1))
    done
    # shellcheck disable=SC2086
    redis-cli --cluster create $addrs --cluster-replicas "$replicas" \
        --cluster-yes >"$dir/create.log" 2>&1 || {
        cat "$dir/create.log" >&2
        exit 1
    }
    # Ready when every node says ok and sees every other node.
    i=0
    while [ $i -lt 200 ]; do
        ready=1
        for p in $(echo "$ports" | tr ',' ' '); do
            info=$(redis-cli -p "$p" cluster info 2>/dev/null)
            echo "$info" | grep -q 'cluster_state:ok' || ready=0
            echo "$info" | grep -q "cluster_known_nodes:$n" || ready=0
        done
        [ $ready = 1 ] && break
        sleep 0.05
        i=$((i + 1))
    done
    # Replicas must have synced before a test may kill their master.
    for p in $(echo "$ports" | tr ',' ' '); do
        i=0
        while [ $i -lt 200 ]; do
            role=$(redis-cli -p "$p" info replication 2>/dev/null)
            echo "$role" | grep -q 'role:master' && break
            echo "$role" | grep -q 'master_link_status:up' && break
            sleep 0.05
            i=$((i + 1))
        done
    done
    # Masters first: the order create used (the first M are masters).
    echo "$ports"
    ;;
sentinel)
    name=$3
    pw=${4:-}
    spw=${5:-}
    mkdir -p "$dir"
    # Options and redis-cli arguments for passwords, when given.
    srv="--repl-diskless-sync-delay 0${pw:+ --requirepass $pw --masterauth $pw}"
    m=$(start_one "$srv")
    r=$(start_one --replicaof 127.0.0.1 "$m" "$srv")
    i=0
    until redis-cli -p "$r" ${pw:+--no-auth-warning -a "$pw"} \
        info replication 2>/dev/null | grep -q 'master_link_status:up'; do
        i=$((i + 1))
        [ $i -lt 200 ] || { echo "redis-test.sh: replica never synced" >&2; exit 1; }
        sleep 0.05
    done
    # A failover in a few seconds: down after 1 s, retried after 3 s.
    sentinel_conf="sentinel monitor $name 127.0.0.1 $m 2
sentinel down-after-milliseconds $name 1000
sentinel failover-timeout $name 3000
sentinel parallel-syncs $name 1${pw:+
sentinel auth-pass $name $pw}${spw:+
requirepass $spw}"
    sentinels=""
    for _s in 1 2 3; do
        sentinels="$sentinels,$(start_one)"
    done
    # Ready when every sentinel knows the replica and the other two: a
    # failover needs both (sentinels find each other every 2 s).
    for p in $(echo "$sentinels" | tr ',' ' '); do
        i=0
        until redis-cli -p "$p" ${spw:+--no-auth-warning -a "$spw"} \
            sentinel master "$name" 2>/dev/null | tr '\n' ' ' |
            grep -q 'num-slaves 1 .*num-other-sentinels 2 '; do
            i=$((i + 1))
            [ $i -lt 400 ] || { echo "redis-test.sh: sentinel $p never saw the others" >&2; exit 1; }
            sleep 0.05
        done
    done
    echo "$m,$r$sentinels"
    ;;
restart)
    p=$3
    # shellcheck disable=SC2046
    launch "$p" $(cat "$dir/$p/args")
    i=0
    while [ $i -lt 100 ]; do
        redis-cli -p "$p" ping 2>/dev/null | grep -q PONG && exit 0
        sleep 0.05
        i=$((i + 1))
    done
    echo "redis-test.sh: cannot restart $p" >&2
    exit 1
    ;;
stop)
    find "$dir" -name pid 2>/dev/null | while read -r f; do
        kill -9 "$(cat "$f")" 2>/dev/null || true
    done
    ;;
*)
    echo "usage: redis-test.sh single|cluster|sentinel|restart|stop DIR ..." >&2
    exit 2
    ;;
esac
