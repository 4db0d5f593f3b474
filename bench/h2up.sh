#!/bin/bash
# bench/h2up.sh -- CPU per request through retryproxy for an HTTP/1.1 client to an h2c upstream
# (nghttpd --no-tls) against the same to an http upstream (nginx), and over TLS: h2 chosen by
# ALPN (nghttpd with a certificate) against HTTP/1.1 through libcurl (nginx ssl, tls.http2
# "off"), all serving the same 3-byte file; docs/http2.md quotes the result.
#
#   BUILD=build bench/h2up.sh          # or make bench-h2up; REPS=5 SECS=5 CONNS=16 by default
#
# Each repetition runs both targets, alternating, each on a proxy of its own (one worker) driven
# by wrk -t1; the proxy's CPU (user + system, /proc/PID/stat) over the run divided by the
# requests wrk completed. Prints a row per run and the medians.
set -euo pipefail
BUILD=${BUILD:-build}
REPS=${REPS:-5}
SECS=${SECS:-5}
CONNS=${CONNS:-16}
BIN=$BUILD/retryproxy
DIR=$(mktemp -d /tmp/retryproxy-h2up-bench-XXXXXX)
. "$(dirname "$0")/h2lib.sh"
need nghttpd:nghttp2-server nginx:nginx-light wrk:wrk

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

mkdir -p "$DIR/www" "$DIR/nginx/logs"
chmod 755 "$DIR" "$DIR/www" # nginx workers run as nobody
printf 'ok\n' >"$DIR/www/ok"
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=bench \
    -addext subjectAltName=IP:127.0.0.1 -keyout "$DIR/key.pem" -out "$DIR/cert.pem" >/dev/null 2>&1
chmod 644 "$DIR/key.pem"
P_H2=$(free_port); P_H1=$(free_port); P_H2S=$(free_port); P_H1S=$(free_port)
nghttpd --no-tls -d "$DIR/www" "$P_H2" >"$DIR/nghttpd.log" 2>&1 &
PIDS+=($!)
nghttpd -d "$DIR/www" "$P_H2S" "$DIR/key.pem" "$DIR/cert.pem" >"$DIR/nghttpd-tls.log" 2>&1 &
PIDS+=($!)
cat >"$DIR/nginx/nginx.conf" <<EOF
daemon off; worker_processes 1; error_log $DIR/nginx/logs/error.log; pid $DIR/nginx/nginx.pid;
events { worker_connections 1024; }
http { access_log off; keepalive_requests 1000000;
  server { listen 127.0.0.1:$P_H1; root $DIR/www; }
  server { listen 127.0.0.1:$P_H1S ssl; root $DIR/www;
    ssl_certificate $DIR/cert.pem; ssl_certificate_key $DIR/key.pem; } }
EOF
nginx -p "$DIR/nginx/" -c "$DIR/nginx/nginx.conf" &
PIDS+=($!)
wait_port "$P_H2"; wait_port "$P_H1"; wait_port "$P_H2S"; wait_port "$P_H1S"
TARGETS="h2c http h2tls https1"

# one proxy per target, started once
declare -A PX URLS
for t in $TARGETS; do
    p=$(free_port); a=$(free_port)
    case $t in
    h2c) up="h2c://127.0.0.1:$P_H2" tls='' ;;
    http) up="http://127.0.0.1:$P_H1" tls='' ;;
    h2tls) up="https://127.0.0.1:$P_H2S" tls=", \"tls\": {\"ca_file\": \"$DIR/cert.pem\", \"http2\": \"required\"}" ;;
    https1) up="https://127.0.0.1:$P_H1S" tls=", \"tls\": {\"ca_file\": \"$DIR/cert.pem\", \"http2\": \"off\"}" ;;
    esac
    cat >"$DIR/$t.json" <<EOF
{"listen": "127.0.0.1:$p", "admin": "127.0.0.1:$a", "log": {"level": "warn"},
 "routes": [{"name": "r", "upstreams": ["$up"]$tls}]}
EOF
    "$BIN" -c "$DIR/$t.json" --workers 1 >"$DIR/$t.log" 2>&1 &
    PX[$t]=$!; PIDS+=($!); URLS[$t]="http://127.0.0.1:$p/ok"
    wait_port "$p"
    curl -sf "${URLS[$t]}" >/dev/null || { echo "$t: no 200 through the proxy" >&2; exit 1; }
done

HZ=$(getconf CLK_TCK)
echo "target  rep  requests  req/s  cpu_us_per_req"
for rep in $(seq "$REPS"); do
    for t in $TARGETS; do
        c0=$(cpu_ticks "${PX[$t]}")
        out=$(wrk -t1 -c"$CONNS" -d"${SECS}s" "${URLS[$t]}")
        c1=$(cpu_ticks "${PX[$t]}")
        n=$(echo "$out" | awk '/requests in/ {print $1}')
        non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
        [ -z "$non2xx" ] || { echo "$t: $non2xx non-2xx answers" >&2; exit 1; }
        us=$(awk -v c=$((c1 - c0)) -v hz="$HZ" -v n="$n" 'BEGIN {printf "%.1f", c / hz * 1e6 / n}')
        echo "$t $rep $n $((n / SECS)) $us" | tee -a "$DIR/rows"
    done
done
echo "medians (cpu µs per request, req/s):"
for t in $TARGETS; do
    awk -v t=$t '$1 == t {print $5, $4}' "$DIR/rows" | sort -n |
        awk -v t=$t '{us[NR]=$1; rs[NR]=$2} END {m=int((NR+1)/2); printf "%-6s %s µs  %s req/s\n", t, us[m], rs[m]}'
done
