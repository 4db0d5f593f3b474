#!/bin/bash
# bench/share.sh -- the failing endpoint's share of first attempts (issue 38): requests to a
# route whose upstreams are healthy but one, which answers 503 to everything (the bench's
# /flaky route: one healthy, one failing; and the issue's three pods, one failing), through
# retryproxy and through HAProxy 2.6 in the same run.
#
#   BUILD=build bench/share.sh          # or make bench-share (also run by make bench)
#
# Environment [default]: UPS ["2 3"] upstreams per case, the last one failing; N [1000]
# requests one after another (h2load -c 1 over one kept-alive connection); M [4000] requests
# from CONC [32] connections at once (h2load -c CONC); REPS [3] runs of each, the median kept.
#
# Targets, each started afresh for each run (whatever it learnt in one run is not carried to
# the next), one worker or thread each:
#   retryproxy            the default balance (least_request, weigh_endpoints), max_attempts 3,
#                         retry_on gateway-error, no backoff, a wide retry budget
#   retryproxy rr         the same with balance round_robin
#   HAProxy observe       balance leastconn; servers "check observe layer7 error-limit 10
#                         on-error mark-down" (TCP checks every 2 s, rise 2)
#   HAProxy observe+http  the same with "option httpchk GET /" (the failing server fails its
#                         checks too, so stays down once marked)
#   HAProxy observe, no L7 retry   "HAProxy observe" retrying connection failures only: a 503
#                         goes back to the client (HAProxy 2.6 observes the L7 errors of the
#                         last server a request tried only, haproxy/haproxy#2679, so with L7
#                         retries the failing server's 503s are never counted)
#   HAProxy leastconn, HAProxy roundrobin   nothing else
# Every HAProxy backend has "retries 3", "retry-on all-retryable-errors" (but the one above),
# "option redispatch".
#
# What is counted: of the client requests, those whose FIRST attempt went to the failing
# upstream. retryproxy sends X-Retry-Attempt: 1 on a first attempt, and the failing upstream
# (tests/upstream) logs the header of each request it got. HAProxy sends no such header: its
# log line per request gives the retries it made (%rc) and the server that answered (%s); a
# healthy upstream never fails, so a request's first attempt reached the failing one exactly
# when it was retried or the failing one answered it. The failing
# upstream's own count (first attempts and retries) is printed beside it as a check. Also the
# client's non-2xx answers and how long the run took.
set -euo pipefail
BUILD=${BUILD:-build}
UPS=${UPS:-"2 3"}
N=${N:-1000}
M=${M:-4000}
CONC=${CONC:-32}
REPS=${REPS:-3}
DIR=$(mktemp -d /tmp/retryproxy-share-bench-XXXXXX)
. "$(dirname "$0")/h2lib.sh"
export PATH=$PATH:/usr/sbin:/sbin
need haproxy:haproxy h2load:nghttp2-client
[ -x "$BUILD/retryproxy" ] && [ -x "$BUILD/tests/upstream" ] ||
    { echo "share.sh: build $BUILD/retryproxy and $BUILD/tests/upstream first (make bench-build)" >&2; exit 1; }

# Three healthy upstreams at most and the failing one, each logging a line per request.
P_OK=() P_BAD=$(free_port)
for i in 1 2; do P_OK+=("$(free_port)"); done
for p in "${P_OK[@]}"; do
    "$BUILD/tests/upstream" --port "$p" >/dev/null 2>"$DIR/up-$p.log" &
    PIDS+=($!)
done
"$BUILD/tests/upstream" --port "$P_BAD" --plan 'ok=503' >/dev/null 2>"$DIR/up-bad.log" &
PIDS+=($!)
for p in "${P_OK[@]}" "$P_BAD"; do wait_port "$p"; done

# The upstream addresses of a case with 'n' upstreams: n - 1 healthy, then the failing one.
servers() { local n=$1 i; for ((i = 0; i < n - 1; i++)); do echo "${P_OK[$i]}"; done; echo "$P_BAD"; }

PROXY_PID='' P_PROXY=''
stop_proxy() {
    [ -n "$PROXY_PID" ] && { kill "$PROXY_PID" 2>/dev/null || true; wait "$PROXY_PID" 2>/dev/null || true; }
    PROXY_PID=''
}

# start_retryproxy N BALANCE
start_retryproxy() {
    local ups='' p
    for p in $(servers "$1"); do ups="$ups${ups:+, }\"http://127.0.0.1:$p\""; done
    P_PROXY=$(free_port)
    cat >"$DIR/rp.json" <<EOF
{"listen": "127.0.0.1:$P_PROXY", "admin": "127.0.0.1:$(free_port)", "log": {"level": "warn"},
 "budget": {"max_concurrent_retries": null, "retry_ratio": 100, "min_retries_per_second": 100000},
 "routes": [{"name": "flaky", "upstreams": [$ups]$2,
   "budget": {"retry_ratio": 100, "min_retries_per_second": 100000},
   "retry": {"max_attempts": 3, "retry_on": ["connect-failure", "reset", "gateway-error"],
             "backoff": {"policy": "random", "base_ms": 0, "cap_ms": 0, "jitter": "none"}}}]}
EOF
    "$BUILD/retryproxy" -c "$DIR/rp.json" --workers 1 >>"$DIR/retryproxy.log" 2>&1 &
    PROXY_PID=$!
    PIDS+=($!)
    wait_port "$P_PROXY"
}

# start_haproxy N BALANCE SERVER_OPTIONS [BACKEND_LINE]
start_haproxy() {
    local p i=0 srv=''
    for p in $(servers "$1"); do
        srv="$srv    server s$i 127.0.0.1:$p $3"$'\n'
        i=$((i + 1))
    done
    P_PROXY=$(free_port)
    cat >"$DIR/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn 4096
    log stdout format raw local0
defaults
    mode http
    log global
    log-format "%s %rc %ST"
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    http-reuse always
    retries 3
    retry-on all-retryable-errors
    option redispatch
frontend fe
    bind 127.0.0.1:$P_PROXY
    default_backend flaky
backend flaky
    balance $2
${4:-}
$srv
EOF
    : >"$DIR/haproxy-requests.log"
    haproxy -db -f "$DIR/haproxy.cfg" >>"$DIR/haproxy-requests.log" 2>>"$DIR/haproxy.log" &
    PROXY_PID=$!
    PIDS+=($!)
    wait_port "$P_PROXY"
}

# the requests (not health checks) the failing upstream got, and of them, since line $1, the
# first attempts (retryproxy's X-Retry-Attempt=1)
lines() { wc -l <"$DIR/up-bad.log"; }
bad_since() { tail -n +"$(($1 + 1))" "$DIR/up-bad.log" | grep -c " GET /flaky .*${2:-}" || true; }
# HAProxy's requests whose first attempt went to the failing server s$1: those it retried (a
# "+" marks a redispatch), and those the failing server answered without a retry
ha_first() {
    awk -v bad="s$1" '{ sub(/^\+/, "", $2); if ($2 + 0 > 0 || $1 == bad) n++ } END { print n + 0 }' \
        "$DIR/haproxy-requests.log"
}

# run KIND REQUESTS CONNS -> "first_at_bad bad_total non2xx seconds"
run() {
    local kind=$1 n=$2 c=$3 before out non2xx secs first
    before=$(lines)
    out=$(h2load --h1 -n "$n" -c "$c" -m 1 "http://127.0.0.1:$P_PROXY/flaky" 2>&1)
    non2xx=$(echo "$out" | awk -v n="$n" '/^status codes:/ { print n - $3 }')
    secs=$(echo "$out" | awk '/^finished in/ { v = $3; sub(/,$/, "", v); if (v ~ /ms$/) { sub(/ms$/, "", v); v /= 1000 } else sub(/s$/, "", v); print v }')
    sleep 0.2 # the last log lines
    if [ "$kind" = haproxy ]; then first=$(ha_first $((UPN - 1))); else first=$(bad_since "$before" ' X-Retry-Attempt=1 '); fi
    echo "$first $(bad_since "$before") ${non2xx:-?} ${secs:-?}"
}

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# measure NAME KIND START_COMMAND...: REPS runs one after another, then REPS at once
measure() {
    local name=$1 kind=$2 mode n c r res all
    shift 2
    for mode in seq conc; do
        if [ "$mode" = seq ]; then n=$N c=1; else n=$M c=$CONC; fi
        all=''
        for ((r = 0; r < REPS; r++)); do
            "$@"
            res=$(run "$kind" "$n" "$c")
            stop_proxy
            all="$all$res"$'\n'
        done
        printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$UPN" "$name" \
            "$([ "$mode" = seq ] && echo "$n one after another" || echo "$n, $c at once")" \
            "$(echo -n "$all" | awk -v n="$n" '{ print 100 * $1 / n }' | median | xargs printf '%.1f %%')" \
            "$(echo -n "$all" | awk '{ printf "%s%s", sep, $1; sep = ", " }')" \
            "$(echo -n "$all" | awk '{ printf "%s%s", sep, $2; sep = ", " }')" \
            "$(echo -n "$all" | awk '{ printf "%s%s/%s s", sep, $3, $4; sep = ", " }')"
    done
}

echo "retryproxy $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo '?'), $(haproxy -v | head -n 1 | cut -d' ' -f1-3); N=$N M=$M CONC=$CONC REPS=$REPS"
echo
echo "| upstreams (1 failing) | proxy | requests | failing one's share of first attempts (median) | first attempts there, each run | requests it got, each run | non-2xx / run time, each run |"
echo "|---|---|---|---|---|---|---|"
for UPN in $UPS; do
    [ "$UPN" -ge 2 ] && [ "$UPN" -le 3 ] || { echo "share.sh: UPS: 2 or 3, not $UPN" >&2; exit 1; }
    measure "retryproxy" rp start_retryproxy "$UPN" ''
    measure "retryproxy rr" rp start_retryproxy "$UPN" ', "balance": "round_robin"'
    measure "HAProxy observe" haproxy start_haproxy "$UPN" leastconn \
        "check observe layer7 error-limit 10 on-error mark-down"
    measure "HAProxy observe+http" haproxy start_haproxy "$UPN" leastconn \
        "check observe layer7 error-limit 10 on-error mark-down" "    option httpchk GET /"
    measure "HAProxy observe, no L7 retry" haproxy start_haproxy "$UPN" leastconn \
        "check observe layer7 error-limit 10 on-error mark-down" "    retry-on conn-failure"
    measure "HAProxy leastconn" haproxy start_haproxy "$UPN" leastconn ''
    measure "HAProxy roundrobin" haproxy start_haproxy "$UPN" roundrobin ''
done
