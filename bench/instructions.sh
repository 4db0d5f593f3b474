#!/bin/bash
# bench/instructions.sh -- instructions per request of the proxy (valgrind's callgrind counts
# instructions, not time: the same on a quiet or a busy machine), for an A/B of the request path.
#
#   bench/instructions.sh BIN h1|h2|grpc [N1 N2]
#
# Starts BIN with one worker under callgrind, sends N1 requests (h2load -c4; "h1": HTTP/1.1 to
# the test upstream over http://, "h2": h2c with 4 streams a connection to nghttpd over h2c://,
# "grpc": gRPC unary calls the same way, answered as bench/h2peers.sh's are), then again with
# N2, and prints the difference over N2 - N1 requests, so that start-up and shutdown cancel out.
# CONNS and STREAMS (4 and 4) set h2load's -c and -m for h2 and grpc; bench/README.md's issue 30
# figures use CONNS=16 STREAMS=10 (make bench-h2's load) with N1=5000 N2=15000. HTTP/2's framing batches differently from run to run: take the median of
# several runs, alternating the builds. UPSTREAMS=3 gives the route three upstreams (three
# endpoints, balanced per request: docs/endpoints.md) instead of one. DEAD_LETTER=true or false
# gives the route "delivery": {"dead_letter": ...} and the config a store (a SQLite file in the
# run's directory): a synchronous route's cost per request with dead letters on against off,
# requests that succeed (issue 39; bench/README.md "Durable accepts").
set -euo pipefail
BIN=$1
MODE=$2
N1=${3:-1000}
N2=${4:-3000}
UPB=${UPB:-build/tests/upstream}
UPSTREAMS=${UPSTREAMS:-1}
DEAD_LETTER=${DEAD_LETTER:-}
CONNS=${CONNS:-4}
STREAMS=${STREAMS:-4}
DIR=$(mktemp -d /tmp/retryproxy-instr-XXXXXX)
. "$(dirname "$0")/h2lib.sh"
need valgrind:valgrind h2load:nghttp2-client nghttpd:nghttp2-server
count() {
    local n=$1 d up px url lp urls="" ups=()
    d=$(mktemp -d "$DIR/run-XXXXXX")
    for i in $(seq "$UPSTREAMS"); do
        if [ "$MODE" = h1 ]; then
            test_upstream "$d/up$i.out"
            ups+=("$UP_PID")
            url="http://127.0.0.1:$UP_PORT"
        else
            local p
            p=$(free_port)
            echo ok > "$d/ok"
            mkdir -p "$d/test.Echo"
            printf '\x00\x00\x00\x00\x05hello' > "$d/test.Echo/Unary"
            printf '\x00\x00\x00\x00\x05hello' > "$d/call.bin"
            # grpc: every answer ends with grpc-status 0 in trailers, as nghttpd does for bench-h2
            local t=()
            [ "$MODE" = grpc ] && t=(--trailer 'grpc-status: 0')
            nghttpd --no-tls -d "$d" "${t[@]}" "$p" > /dev/null 2>&1 & up=$!
            PIDS+=("$up")
            ups+=("$up")
            sleep 0.5
            url="h2c://127.0.0.1:$p"
        fi
        urls="$urls${urls:+, }\"$url\""
    done
    lp=$(free_port)
    local store="" delivery=""
    if [ -n "$DEAD_LETTER" ]; then
        store=", \"store\": {\"path\": \"$d/store.db\"}"
        delivery=", \"delivery\": {\"dead_letter\": $DEAD_LETTER}"
    fi
    printf '{"listen": "127.0.0.1:%s", "log": {"level": "warn"}%s,\n "routes": [{"name": "ok", "upstreams": [%s]%s}]}\n' \
        "$lp" "$store" "$urls" "$delivery" > "$d/c.json"
    valgrind --tool=callgrind --callgrind-out-file="$d/cg.out" "$BIN" -c "$d/c.json" --workers 1 --admin 127.0.0.1:0 \
        > "$d/px.log" 2>&1 & px=$!
    PIDS+=("$px")
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$lp") 2>/dev/null && break; sleep 0.2; done
    if [ "$MODE" = h1 ]; then
        h2load --h1 -c 4 -n "$n" "http://127.0.0.1:$lp/ok" > "$d/h2load.out"
    elif [ "$MODE" = grpc ]; then
        h2load -c "$CONNS" -m "$STREAMS" -n "$n" -d "$d/call.bin" -H 'content-type: application/grpc' \
            -H 'te: trailers' "http://127.0.0.1:$lp/test.Echo/Unary" > "$d/h2load.out"
    else
        h2load -c "$CONNS" -m "$STREAMS" -n "$n" "http://127.0.0.1:$lp/ok" > "$d/h2load.out"
    fi
    grep -q "$n succeeded" "$d/h2load.out" || { cat "$d/h2load.out" >&2; exit 1; }
    kill -TERM "$px"; wait "$px" || true
    kill "${ups[@]}" 2>/dev/null || true
    grep -m1 '^summary\|^totals' "$d/cg.out" | awk '{print $2}'
}
a=$(count "$N1")
b=$(count "$N2")
echo "$MODE: $(( (b - a) / (N2 - N1) )) instructions per request ($a for $N1, $b for $N2)"
