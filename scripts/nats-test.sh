#!/bin/sh
# Start, restart and stop the nats-server the NATS tests and benchmark
# use: JetStream on, on a free loopback port, its store and files in DIR.
#
#   nats-test.sh start DIR     start one; prints its port
#   nats-test.sh restart DIR   start it again on the same port and store
#                              (after a kill -9)
#   nats-test.sh stop DIR      kill -9 it
#
# With NATS_TEST_CONF set at start, the server also reads that
# configuration file (the tests' nkey and operator users); DIR/conf keeps
# its name for restart. Its pid file is DIR/pid, so
# scripts/redis-test.sh stop on a directory above DIR kills it too
# (run-tests.sh does so at exit). Ports are picked at random in
# 30000-39999 and retried when taken.
set -eu
cmd=$1
dir=$2

launch() {
    conf=$(cat "$dir/conf" 2>/dev/null || true)
    nats-server ${conf:+-c "$conf"} -a 127.0.0.1 -p "$1" -js \
        -sd "$dir/store" -P "$dir/pid" -l "$dir/log" </dev/null \
        >/dev/null 2>&1 &
    # Generous: the machine may be loaded. Ready once it answers.
    for _i in $(seq 1 300); do
        if grep -q "Server is ready" "$dir/log" 2>/dev/null; then
            return 0
        fi
        if ! kill -0 $! 2>/dev/null; then
            return 1
        fi
        sleep 0.1
    done
    return 1
}

case "$cmd" in
start)
    mkdir -p "$dir"
    printf '%s' "${NATS_TEST_CONF:-}" >"$dir/conf"
    for _try in 1 2 3 4 5 6 7 8 9 10; do
        n=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
        p=$((30000 + n % 10000))
        : >"$dir/log"
        if launch "$p"; then
            echo "$p" >"$dir/port"
            echo "$p"
            exit 0
        fi
    done
    echo "nats-test: cannot start nats-server (see $dir/log)" >&2
    exit 1
    ;;
restart)
    : >"$dir/log"
    launch "$(cat "$dir/port")"
    ;;
stop)
    if [ -f "$dir/pid" ]; then
        kill -9 "$(cat "$dir/pid")" 2>/dev/null || true
    fi
    ;;
*)
    echo "usage: nats-test.sh start|restart|stop DIR" >&2
    exit 2
    ;;
esac
