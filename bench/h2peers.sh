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
#
# Modes (the defaults are the table above):
#   CLIENT=h1      h2load --h1 (HTTP/1.1, STREAMS 1 by default: no pipelining) to the same
#                  targets, each still proxying to the h2c upstream (nginx and HAProxy listen
#                  for HTTP/1.1; nghttpx's frontend speaks both). Each kind of call is tried
#                  with h2load --h1 and curl first: a target that cannot carry it whole gets
#                  a row of "-"; a gRPC answer without grpc-status is said, and measured.
#   UPSTREAM=h2hold  bench/h2hold ($BUILD/bench/h2hold, make bench-build) instead of nghttpd.
#   HOLD=N         (implies UPSTREAM=h2hold) before each run, a second h2load opens N requests
#                  to /hold per client connection of the run through the target (h2: N streams
#                  on each of CONNS connections; h1: CONNS*N connections), which the upstream
#                  never answers; they stay open until the run ends, then the holder is
#                  stopped. Each run prints the held streams h2hold counted (the fewest it
#                  reported during the run). Timeouts are set past the run for this, and
#                  HAProxy gets option abortonclose so that a held request ends with its client.
set -euo pipefail
BUILD=${BUILD:-build}
REPS=${REPS:-5}
SECS=${SECS:-5}
CONNS=${CONNS:-16}
CLIENT=${CLIENT:-h2}
HOLD=${HOLD:-0}
UPSTREAM=${UPSTREAM:-nghttpd}
[ "$HOLD" -gt 0 ] && UPSTREAM=h2hold
case $CLIENT in
h2) STREAMS=${STREAMS:-10} H1=() ;;
h1) STREAMS=${STREAMS:-1} H1=(--h1) ;;
*) echo "h2peers: CLIENT is h2 or h1" >&2; exit 2 ;;
esac
case $UPSTREAM in
nghttpd | h2hold) ;;
*) echo "h2peers: UPSTREAM is nghttpd or h2hold" >&2; exit 2 ;;
esac
HOLDBIN=$BUILD/bench/h2hold
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
if [ "$UPSTREAM" = h2hold ]; then
    [ -x "$HOLDBIN" ] || { echo "h2peers: no $HOLDBIN (make bench-build)" >&2; exit 1; }
    "$HOLDBIN" "$UP" --stats "$DIR/h2hold.stats" >"$DIR/h2hold.log" 2>&1 &
else
    nghttpd --no-tls -d "$DIR/www" --trailer 'grpc-status: 0' "$UP" >"$DIR/nghttpd.log" 2>&1 &
fi
PIDS+=($!)
wait_port "$UP"

# Held requests last as long as the run: every timeout on their way well past it.
LONG=
TO=30s
HAPROXY_ABORT=
HAPROXY_H1=
# HAProxy's HTTP/1.1 status line carries an h2 upstream's empty reason phrase, which h2load
# --h1 counts as no status at all: one rule gives it one.
[ "$CLIENT" = h1 ] && HAPROXY_H1="
  http-response set-status 200 reason OK if { status 200 }"
NGINX_TO=
NGHTTPX_TO=()
if [ "$HOLD" -gt 0 ]; then
    LONG=", \"timeout_ms\": 600000"
    LONG_LIMITS=", \"limits\": {\"connection_timeout_ms\": 600000, \"max_upstream_requests\": \
$((CONNS * (HOLD + STREAMS) + 1024))}"
    TO=600s
    HAPROXY_ABORT="
  option abortonclose" # else a request whose client left stays at the server
    NGINX_TO="grpc_read_timeout 600s; grpc_send_timeout 600s; client_body_timeout 600s;
  client_header_timeout 600s; send_timeout 600s; keepalive_timeout 600s;"
    NGHTTPX_TO=(--frontend-read-timeout=600s --frontend-http2-read-timeout=600s
        --frontend-write-timeout=600s --backend-read-timeout=600s --backend-write-timeout=600s
        --stream-read-timeout=0 --stream-write-timeout=0)
fi
# h2hold's count of the streams it holds open now
held_now() { sed -n 's/^held=\([0-9]*\).*/\1/p' "$DIR/h2hold.stats" 2>/dev/null; }
# ... and of the connections that hold at least one
holding_now() { sed -n 's/.*conns_holding=\([0-9]*\).*/\1/p' "$DIR/h2hold.stats" 2>/dev/null; }

declare -A PORT PID
start_target() { # NAME: starts it, sets PORT[NAME] PID[NAME]
    local name=$1 p a
    p=$(free_port)
    case $name in
    retryproxy | retryproxy-base)
        a=$(free_port)
        cat >"$DIR/$name.json" <<EOF
{"listen": "127.0.0.1:$p", "admin": "127.0.0.1:$a", "log": {"level": "warn"}${LONG_LIMITS:-},
 "routes": [{"name": "r", "upstreams": ["h2c://127.0.0.1:$UP"]$LONG}]}
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
  server { listen 127.0.0.1:$p$([ "$CLIENT" = h2 ] && echo ' http2'); $NGINX_TO
    location / { grpc_pass grpc://up; } } }
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
  timeout client $TO
  timeout server $TO
frontend f
  bind 127.0.0.1:$p$([ "$CLIENT" = h2 ] && echo ' proto h2')
  default_backend b
backend b
  http-reuse always$HAPROXY_ABORT$HAPROXY_H1
  server s 127.0.0.1:$UP proto h2
EOF
        haproxy -f "$DIR/haproxy.cfg" >"$DIR/haproxy.log" 2>&1 &
        ;;
    nghttpx)
        nghttpx --conf=/dev/null --frontend="127.0.0.1,$p;no-tls" --backend="127.0.0.1,$UP;;proto=h2" \
            --workers=1 --no-ocsp --errorlog-file="$DIR/nghttpx.log" --accesslog-file=/dev/null \
            --frontend-http2-max-concurrent-streams=1000 ${NGHTTPX_TO[@]+"${NGHTTPX_TO[@]}"} \
            >/dev/null 2>&1 &
        ;;
    esac
    PID[$name]=$!
    PIDS+=($!)
    PORT[$name]=$p
    wait_port "$p"
    if [ "$CLIENT" = h1 ]; then
        check_h1 "$name"
        return 0
    fi
    h2load -n 2 -c 1 "http://127.0.0.1:$p/ok" 2>&1 | grep -q "2 succeeded" ||
        { echo "h2peers: $name does not answer GET /ok over h2c" >&2; exit 1; }
}

# CLIENT=h1: two calls of each kind by h2load --h1 and one by curl through TARGET; a kind of
# call that h2load does not count as succeeded or that does not come back whole (200 and the
# body the upstream sent) is not measured (CAN).
declare -A CAN
check_h1() {
    local t=$1 url="http://127.0.0.1:${PORT[$1]}" grpc
    grpc=(-H 'content-type: application/grpc' -H 'te: trailers')
    CAN[get.$t]=1 CAN[grpc.$t]=1
    if ! h2load --h1 -n 2 -c 1 "$url/ok" 2>&1 | grep -q "2 succeeded" ||
        ! curl -sS --http1.1 -o "$DIR/body" "$url/ok" || ! cmp -s "$DIR/body" "$DIR/www/ok"; then
        echo "# $t: an HTTP/1.1 GET does not come back whole: not measured"
        CAN[get.$t]=0
    fi
    if ! h2load --h1 -n 2 -c 1 -d "$DIR/call.bin" "${grpc[@]}" "$url/test.Echo/Unary" 2>&1 |
        grep -q "2 succeeded" ||
        ! curl -sS --http1.1 -D "$DIR/head" -o "$DIR/body" "${grpc[@]}" \
            --data-binary @"$DIR/call.bin" "$url/test.Echo/Unary" ||
        ! grep -q '^HTTP/1.1 200' "$DIR/head" || ! cmp -s "$DIR/body" "$DIR/call.bin"; then
        echo "# $t: a gRPC call over HTTP/1.1 does not come back whole: not measured"
        CAN[grpc.$t]=0
    elif ! grep -qi '^grpc-status: *0' "$DIR/head"; then
        echo "# $t: a gRPC call over HTTP/1.1 comes back 200 with its message but no grpc-status"
    fi
}

# HOLD: starts the holder through TARGET and waits until the upstream holds its streams.
HOLDER=
hold_start() {
    local t=$1 n=$((CONNS * HOLD)) base
    [ "$HOLD" -gt 0 ] || return 0
    base=$(held_now)
    if [ "$CLIENT" = h1 ]; then
        set -- --h1 -c "$n" -m 1
    else
        set -- -c "$CONNS" -m "$HOLD"
    fi
    h2load "$@" -n "$n" "http://127.0.0.1:${PORT[$t]}/hold/x" >"$DIR/holder.out" 2>&1 &
    HOLDER=$!
    PIDS+=($!)
    for _ in $(seq 100); do
        [ "$(held_now)" -ge $((base + n)) ] && return 0
        sleep 0.2
    done
    echo "h2peers: $t: the upstream holds $(held_now) streams, not $((base + n)), after 20 s" >&2
}
# ... and stops it, waiting until the upstream has let them go.
hold_stop() {
    [ -n "$HOLDER" ] || return 0
    kill "$HOLDER" 2>/dev/null || true
    wait "$HOLDER" 2>/dev/null || true
    HOLDER=
    for _ in $(seq 50); do
        [ "$(held_now)" = 0 ] && return 0
        sleep 0.2
    done
    echo "h2peers: $1: $(held_now) streams still held at the upstream 10 s after the holder left" >&2
}

TARGETS=(retryproxy nginx haproxy nghttpx)
[ -n "$BASE_BIN" ] && TARGETS=(retryproxy-base "${TARGETS[@]}")
SEL=()
for t in "${TARGETS[@]}"; do [[ $t =~ $ONLY ]] && SEL+=("$t"); done
MODE=
if [ "$CLIENT" != h2 ] || [ "$UPSTREAM" != nghttpd ]; then
    MODE=", client $CLIENT, held streams $HOLD per client connection"
fi
UPNAME="nghttpd --no-tls"
[ "$UPSTREAM" = h2hold ] && UPNAME="bench/h2hold"
echo "# h2peers: $REPS runs of ${SECS}s, h2load ${H1[*]+${H1[*]} }-c $CONNS -m $STREAMS, upstream $UPNAME$MODE"
for t in "${SEL[@]}"; do start_target "$t"; done

# one run: KIND (grpc|get) TARGET -> "us_per_call p99_ms calls_per_conn[ held:holding]"
run() {
    local kind=$1 t=$2 url out log t0 t1 n ok p99 maxc=0 held= holding=
    log=$DIR/lat.$t.$kind
    if [ "$kind" = grpc ]; then
        url="http://127.0.0.1:${PORT[$t]}/test.Echo/Unary"
        set -- -d "$DIR/call.bin" -H 'content-type: application/grpc' -H 'te: trailers'
    else
        url="http://127.0.0.1:${PORT[$t]}/ok"
        set --
    fi
    t0=$(ticks "${PID[$t]}")
    [ "$CLIENT" = h1 ] && set -- --h1 "$@"
    h2load -D "$SECS" -c "$CONNS" -m "$STREAMS" --log-file="$log" "$@" "$url" >"$DIR/out" 2>&1 &
    local h=$!
    while kill -0 $h 2>/dev/null; do
        local c
        c=$(conns_to "$UP")
        [ "$c" -gt "$maxc" ] && maxc=$c
        if [ "$UPSTREAM" = h2hold ]; then
            c=$(held_now)
            if [ -n "$c" ] && { [ -z "$held" ] || [ "$c" -lt "$held" ]; }; then
                held=$c holding=$(holding_now)
            fi
        fi
        sleep 0.5
    done
    wait $h || true
    t1=$(ticks "${PID[$t]}")
    n=$(sed -n 's/^requests: .* \([0-9]*\) succeeded.*/\1/p' "$DIR/out")
    [ -n "$n" ] && [ "$n" -gt 0 ] || { echo "h2peers: $t $kind: no call succeeded" >&2; cat "$DIR/out" >&2; exit 1; }
    # h2load's "succeeded" also counts 3xx to 5xx answers
    ok=$(grep '^status codes:' "$DIR/out" || true)
    [[ $ok =~ \ 0\ 3xx,\ 0\ 4xx,\ 0\ 5xx ]] || echo "h2peers: $t $kind: not all 2xx: $ok" >&2
    p99=$(awk '{print $3}' "$log" | sort -n | awk '{a[NR]=$1} END {print a[int(NR*0.99)] / 1000}')
    [ "$maxc" -gt 0 ] || maxc=1
    # ticks are 1/100 s
    echo "$(awk -v d=$((t1 - t0)) -v n="$n" 'BEGIN {printf "%.1f", d * 10000 / n}')" "$p99" "$((n / maxc))" ${held:+"$held:$holding"}
}

declare -A RES
for rep in $(seq "$REPS"); do
    for kind in grpc get; do
        for t in "${SEL[@]}"; do
            [ "${CAN[$kind.$t]:-1}" = 1 ] || continue
            hold_start "$t"
            r=$(run "$kind" "$t")
            hold_stop "$t"
            RES[$kind.$t]+="$r;"
            if [ "$UPSTREAM" = h2hold ]; then
                echo "run $rep $kind $t: ${r% *}"
                h=${r##* }
                echo "  held streams at the upstream: ${h%:*} (on ${h#*:} of its connections)"
            else
                echo "run $rep $kind $t: $r"
            fi
        done
    done
done

median() { tr ';' '\n' | awk -v f="$1" 'NF {print $f}' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
[ -z "$MODE" ] || echo "# client $CLIENT, upstream $UPNAME, held streams $HOLD per client connection"
echo "| calls | target | CPU µs per call | p99 ms | calls per upstream connection |"
echo "|---|---|---|---|---|"
for kind in grpc get; do
    for t in "${SEL[@]}"; do
        v=${RES[$kind.$t]:-}
        label=$([ "$kind" = grpc ] && echo "gRPC unary" || echo "h2c GET")
        [ "$CLIENT" = h1 ] && label="${label#h2c } (HTTP/1.1)"
        if [ -z "$v" ]; then
            echo "| $label | $t | - | - | - |"
            continue
        fi
        echo "| $label | $t | $(echo "$v" | median 1) | $(echo "$v" | median 2) | $(echo "$v" | median 3) |"
    done
done
