#!/bin/bash
# bench/endpoints.sh -- the endpoint choice's cost per request with a few and with many endpoints
# (issue 38: no cap of 64; docs/endpoints.md "No cap on endpoints"), counted in instructions by
# valgrind's callgrind, as bench/instructions.sh does: the same on a quiet or a busy machine.
#
#   bench/endpoints.sh [BIN]        (make bench-endpoints)
#
# For each count in COUNTS ("3 1000"): a private dnsmasq on loopback gives the name
# many.bench that many addresses (127.0.0.2 and on), one test upstream listens on 0.0.0.0 (so on
# every one of them), and BIN runs under callgrind with one worker and a route to
# http://many.bench:PORT balanced by BALANCE (round_robin: every request on the next address).
# h2load --h1 -c4 sends N1 requests, then, in a second run, N2; the difference over N2 - N1
# requests cancels start-up and shutdown (but for the check of the listening port at start,
# whose cost follows the machine's sockets, left out). Printed per request: the whole process's instructions,
# and balance_pick()'s inclusive ones (the choice: the views, the candidates, their weights and
# the pick, proxy/core/balance.c). The whole includes what a request costs besides the choice,
# and with many endpoints a connection per endpoint: more connects while idle ones are fewer
# than endpoints (libcurl keeps at most CURLMOPT_MAXCONNECTS idle, 128 a shard).
set -euo pipefail
BIN=${1:-build/retryproxy}
UPB=${UPB:-build/tests/upstream}
COUNTS=${COUNTS:-"3 1000"}
BALANCE=${BALANCE:-round_robin}
N1=${N1:-2000}
N2=${N2:-6000}
DIR=$(mktemp -d /tmp/retryproxy-endpoints-XXXXXX)
. "$(dirname "$0")/h2lib.sh"
need valgrind:valgrind h2load:nghttp2-client callgrind_annotate:valgrind /usr/sbin/dnsmasq:dnsmasq-base

# The i-th address (1-based) of the name: 127.0.0.2 and on, leaving out x.0 and x.255.
addr_list() {
    local n=$1 i=0 v=2
    while [ "$i" -lt "$n" ]; do
        if [ $((v % 256)) != 0 ] && [ $((v % 256)) != 255 ]; then
            echo "127.0.$((v / 256)).$((v % 256))"
            i=$((i + 1))
        fi
        v=$((v + 1))
    done
}

# count ADDRESSES REQUESTS: "TOTAL PICK" instructions of a run of REQUESTS requests.
count() {
    local na=$1 n=$2 d up dns px dp up_port lp
    d=$(mktemp -d "$DIR/run-XXXXXX")
    addr_list "$na" | sed 's/$/ many.bench/' > "$d/hosts"
    dp=$(free_port)
    /usr/sbin/dnsmasq --keep-in-foreground --no-resolv --no-hosts --addn-hosts="$d/hosts" \
        --local-ttl=3600 --local=/bench/ --listen-address=127.0.0.1 --bind-interfaces \
        --port="$dp" --conf-file=/dev/null --pid-file --user="$(id -un)" --group="$(id -gn)" \
        > "$d/dns.log" 2>&1 & dns=$!
    PIDS+=("$dns")
    "$UPB" --bind 0.0.0.0 --port 0 > "$d/up.out" 2> "$d/up.err" & up=$!
    PIDS+=("$up")
    for _ in $(seq 50); do
        up_port=$(grep -o ':[0-9]\+' "$d/up.out" | head -1 | tr -d :) && [ -n "$up_port" ] && break
        sleep 0.1
    done
    lp=$(free_port)
    # the name asked again once an hour at most: its lookups stay out of the count
    printf '{"listen": "127.0.0.1:%s", "log": {"level": "warn"},
 "resolver": {"servers": ["127.0.0.1:%s"], "min_refresh_ms": 3600000, "max_refresh_ms": 3600000},
 "routes": [{"name": "many", "balance": "%s", "upstreams": ["http://many.bench:%s"]}]}\n' \
        "$lp" "$dp" "$BALANCE" "$up_port" > "$d/c.json"
    valgrind --tool=callgrind --callgrind-out-file="$d/cg.out" "$BIN" -c "$d/c.json" --workers 1 \
        --admin 127.0.0.1:0 > "$d/px.log" 2>&1 & px=$!
    PIDS+=("$px")
    for _ in $(seq 150); do (exec 3<>"/dev/tcp/127.0.0.1/$lp") 2>/dev/null && break; sleep 0.2; done
    h2load --h1 -c 4 -n "$n" "http://127.0.0.1:$lp/ok" > "$d/h2load.out"
    grep -q "$n succeeded" "$d/h2load.out" || { cat "$d/h2load.out" "$d/px.log" >&2; exit 1; }
    kill -TERM "$px"; wait "$px" || true
    kill "$up" "$dns" 2> /dev/null || true
    wait "$up" 2> /dev/null || true
    [ -n "${KEEP:-}" ] && cp "$d/cg.out" "$KEEP.$na.$n"
    local total pick conns weights start
    conns=$(grep -o 'on [0-9]* connections' "$d/up.err" | awk '{print $2}')
    # balance_pick()'s inclusive cost: the "=> ...:balance_pick (Nx)" lines under its callers;
    # and how many weights were computed (score_weight() calls)
    callgrind_annotate --inclusive=yes --threshold=100 "$d/cg.out" > "$d/cg.txt" 2> /dev/null
    pick=$(awk '/=> .*:balance_pick \(/ {gsub(",", "", $1); s += $1} END {print s + 0}' "$d/cg.txt")
    # the check at start for another listener on the port reads /proc/net/tcp (proxy/listen.c):
    # its cost follows every socket on the machine, not the requests, and is left out
    start=$(awk '/=> .*:find_listener \(/ {gsub(",", "", $1); s += $1} END {print s + 0}' "$d/cg.txt")
    weights=$(awk '/=> .*:score_weight \(/ {c = $NF; gsub("[(),x]", "", c); s += c} END {print s + 0}' \
        "$d/cg.txt")
    total=$(($(grep -m1 '^summary\|^totals' "$d/cg.out" | awk '{print $2}') - start))
    echo "$total ${pick:-0} ${conns:-0} ${weights:-0}"
}

printf '%-10s %14s %14s %8s %16s %18s\n' endpoints "instr/request" "choice/request" "choice%" \
    "weights/request" "connects/request"
for na in $COUNTS; do
    read -r a pa ca wa <<< "$(count "$na" "$N1")"
    read -r b pb cb wb <<< "$(count "$na" "$N2")"
    per=$(((b - a) / (N2 - N1)))
    pick=$(((pb - pa) / (N2 - N1)))
    printf '%-10s %14s %14s %7s%% %16s %18s\n' "$na" "$per" "$pick" \
        "$(awk -v p="$pick" -v t="$per" 'BEGIN {printf "%.1f", 100 * p / t}')" \
        "$(awk -v a="$wa" -v b="$wb" -v n=$((N2 - N1)) 'BEGIN {printf "%.1f", (b - a) / n}')" \
        "$(awk -v a="$ca" -v b="$cb" -v n=$((N2 - N1)) 'BEGIN {printf "%.2f", (b - a) / n}')"
done
