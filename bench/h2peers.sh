#!/bin/bash
# bench/h2peers.sh -- the HTTP/2 table of make bench (bench/README.md): gRPC unary calls and h2c
# GETs driven by h2load through retryproxy, nginx (an http2 listener, grpc_pass), HAProxy
# (proto h2 on both sides) and nghttpx, alternating in one run, to one h2c upstream (nghttpd
# --no-tls, answering the call with a 5-byte message and grpc-status 0 in its trailers).
#
#   make bench-h2 [REPS=5 SECS=5 CONNS=16 STREAMS=10 ONLY=regex BASE_BIN=...]
#
# Per run and target: the serving process's CPU (user + system of it and its children, from
# /proc) over the run divided by the calls h2load completed (µs per call), p99 latency from
# h2load's per-request log, and calls per upstream connection (the calls over the most
# connections to the upstream seen open at once). Medians over REPS runs at the end. Each
# proxy runs one worker (nginx worker_processes 1, HAProxy nbthread 1, nghttpx --workers=1,
# retryproxy --workers 1).
set -euo pipefail
BUILD=${BUILD:-build}
REPS=${REPS:-5}
SECS=${SECS:-5}
CONNS=${CONNS:-16}
STREAMS=${STREAMS:-10}
ONLY=${ONLY:-.}
BIN=${BIN:-$BUILD/retryproxy}
BASE_BIN=${BASE_BIN:-}
DIR=$(mktemp -d /tmp/retryproxy-h2peers-XXXXXX)
. "$(dirname "$0")/h2lib.sh"

need h2load:nghttp2-client nghttpd:nghttp2-server nghttpx:nghttp2-proxy nginx:nginx-light \
    haproxy:haproxy

# user + system ticks of a process and its children
ticks() {
    local t=0 p
    for p in $1 $(ps -o pid= --ppid "$1" 2>/dev/null); do
        [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
    done
    echo "$t"
}
conns_to() { ss -Htn state established "( dport = :$1 )" 2>/dev/null | wc -l; }

mkdir -p "$DIR/www/test.Echo" "$DIR/nginx/logs"
chmod 755 "$DIR" "$DIR/www" "$DIR/www/test.Echo"
printf 'ok\n' >"$DIR/www/ok"
printf '\x00\x00\x00\x00\x05hello' >"$DIR/www/test.Echo/Unary"
printf '\x00\x00\x00\x00\x05hello' >"$DIR/call.bin"
UP=$(free_port)
nghttpd --no-tls -d "$DIR/www" --trailer 'grpc-status: 0' "$UP" >"$DIR/nghttpd.log" 2>&1 &
PIDS+=($!)
wait_port "$UP"

declare -A PORT PID
start_target() { # NAME: starts it, sets PORT[NAME] PID[NAME]
    local name=$1 p a
    p=$(free_port)
    case $name in
    retryproxy | retryproxy-base)
        a=$(free_port)
        cat >"$DIR/$name.json" <<EOF
{"listen": "127.0.0.1:$p", "admin": "127.0.0.1:$a", "log": {"level": "warn"},
 "routes": [{"name": "r", "upstreams": ["h2c://127.0.0.1:$UP"]}]}
EOF
        local bin=$BIN
        [ "$name" = retryproxy-base ] && bin=$BASE_BIN
        "$bin" -c "$DIR/$name.json" --workers 1 >"$DIR/$name.log" 2>&1 &
        ;;
    nginx)
        cat >"$DIR/nginx/nginx.conf" <<EOF
daemon off; worker_processes 1; error_log $DIR/nginx/logs/error.log; pid $DIR/nginx/nginx.pid;
events { worker_connections 4096; }
http { access_log off; http2_max_requests 1000000; keepalive_requests 1000000;
  upstream up { server 127.0.0.1:$UP; keepalive 64; keepalive_requests 1000000; }
  server { listen 127.0.0.1:$p http2; location / { grpc_pass grpc://up; } } }
EOF
        nginx -p "$DIR/nginx/" -c "$DIR/nginx/nginx.conf" &
        ;;
    haproxy)
        cat >"$DIR/haproxy.cfg" <<EOF
global
  nbthread 1
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend f
  bind 127.0.0.1:$p proto h2
  default_backend b
backend b
  http-reuse always
  server s 127.0.0.1:$UP proto h2
EOF
        haproxy -f "$DIR/haproxy.cfg" >"$DIR/haproxy.log" 2>&1 &
        ;;
    nghttpx)
        nghttpx --frontend="127.0.0.1,$p;no-tls" --backend="127.0.0.1,$UP;;proto=h2" \
            --workers=1 --no-ocsp --errorlog-file="$DIR/nghttpx.log" --accesslog-file=/dev/null \
            --frontend-http2-max-concurrent-streams=1000 >/dev/null 2>&1 &
        ;;
    esac
    PID[$name]=$!
    PIDS+=($!)
    PORT[$name]=$p
    wait_port "$p"
    h2load -n 2 -c 1 "http://127.0.0.1:$p/ok" 2>&1 | grep -q "2 succeeded" ||
        { echo "h2peers: $name does not answer GET /ok over h2c" >&2; exit 1; }
}

TARGETS=(retryproxy nginx haproxy nghttpx)
[ -n "$BASE_BIN" ] && TARGETS=(retryproxy-base "${TARGETS[@]}")
SEL=()
for t in "${TARGETS[@]}"; do [[ $t =~ $ONLY ]] && SEL+=("$t"); done
for t in "${SEL[@]}"; do start_target "$t"; done

# one run: KIND (grpc|get) TARGET -> "us_per_call p99_ms calls_per_conn"
run() {
    local kind=$1 t=$2 url out log t0 t1 n p99 maxc=0
    log=$DIR/lat.$t.$kind
    if [ "$kind" = grpc ]; then
        url="http://127.0.0.1:${PORT[$t]}/test.Echo/Unary"
        set -- -d "$DIR/call.bin" -H 'content-type: application/grpc' -H 'te: trailers'
    else
        url="http://127.0.0.1:${PORT[$t]}/ok"
        set --
    fi
    t0=$(ticks "${PID[$t]}")
    h2load -D "$SECS" -c "$CONNS" -m "$STREAMS" --log-file="$log" "$@" "$url" >"$DIR/out" 2>&1 &
    local h=$!
    while kill -0 $h 2>/dev/null; do
        local c
        c=$(conns_to "$UP")
        [ "$c" -gt "$maxc" ] && maxc=$c
        sleep 0.5
    done
    wait $h || true
    t1=$(ticks "${PID[$t]}")
    n=$(sed -n 's/^requests: .* \([0-9]*\) succeeded.*/\1/p' "$DIR/out")
    [ -n "$n" ] && [ "$n" -gt 0 ] || { echo "h2peers: $t $kind: no call succeeded" >&2; cat "$DIR/out" >&2; exit 1; }
    p99=$(awk '{print $3}' "$log" | sort -n | awk '{a[NR]=$1} END {print a[int(NR*0.99)] / 1000}')
    [ "$maxc" -gt 0 ] || maxc=1
    # ticks are 1/100 s
    echo "$(awk -v d=$((t1 - t0)) -v n="$n" 'BEGIN {printf "%.1f", d * 10000 / n}')" "$p99" "$((n / maxc))"
}

declare -A RES
echo "# h2peers: $REPS runs of ${SECS}s, h2load -c $CONNS -m $STREAMS, upstream nghttpd --no-tls"
for rep in $(seq "$REPS"); do
    for kind in grpc get; do
        for t in "${SEL[@]}"; do
            r=$(run "$kind" "$t")
            RES[$kind.$t]+="$r;"
            echo "run $rep $kind $t: $r"
        done
    done
done

median() { tr ';' '\n' | awk -v f="$1" 'NF {print $f}' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
echo "| calls | target | CPU µs per call | p99 ms | calls per upstream connection |"
echo "|---|---|---|---|---|"
for kind in grpc get; do
    for t in "${SEL[@]}"; do
        v=${RES[$kind.$t]}
        label=$([ "$kind" = grpc ] && echo "gRPC unary" || echo "h2c GET")
        echo "| $label | $t | $(echo "$v" | median 1) | $(echo "$v" | median 2) | $(echo "$v" | median 3) |"
    done
done
