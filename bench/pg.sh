#!/bin/bash
# bench/pg.sh -- the shared PostgreSQL store with two proxies on one database (make bench-pg,
# issue 40; not in make test).
#
# A private PostgreSQL 15 server (Debian's postgresql: initdb into a directory on $BUILD's disk,
# fsync and synchronous_commit ON, as the postgres user when run as root) on a free port of
# 127.0.0.1, trust authentication for loopback, and two proxies (--workers WORKERS each) on one
# namespace of it.
#
# 1. Accepts: wrk -t1 with CONNS HTTP/1.1 keep-alive connections on EACH proxy POSTs BODY-byte
#    bodies to a durable route for SECS seconds (bench/durable_post.lua: only 202s count); the
#    route's upstream is a port where nothing listens (the courier's attempts are refused and
#    rescheduled a minute later, as in bench/durable.sh). Printed: 202s per second of both
#    together, each proxy's p50 and p99 (wrk's, client side), and every 202 found as a row.
# 2. Backlog (after 3 below): BACKLOG rows due now are inserted in the namespace with one INSERT ... SELECT
#    generate_series, then both proxies start against a test upstream answering 200 (route
#    bounds raised: max_in_flight 1024, max_per_second 1e6) and the time until every row is
#    delivered is measured (polled every 0.2 s): deliveries per second.
# 3. The claim's plan: EXPLAIN (ANALYZE, BUFFERS) of the claim's due-rows select on the
#    backlog, before it is drained, to show it reads the index on (namespace, route, state,
#    next_at) and stops at the LIMIT.
#
# Settings (environment): SECS [10] CONNS [32] BODY [1024] WORKERS [1] BACKLOG [100000]
# BIN [$BUILD/retryproxy] BUILD [build] PG_BIN [/usr/lib/postgresql/15/bin].
set -euo pipefail
BUILD=${BUILD:-build}
SECS=${SECS:-10}
CONNS=${CONNS:-32}
BODY=${BODY:-1024}
WORKERS=${WORKERS:-1}
BACKLOG=${BACKLOG:-100000}
BIN=${BIN:-$BUILD/retryproxy}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
UPB=$BUILD/tests/upstream
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$BUILD/bench-pg"
DIR=$(mktemp -d "$(cd "$BUILD/bench-pg" && pwd)/run-XXXXXX") # h2lib.sh removes it at exit
. "$HERE/h2lib.sh"
need wrk:wrk psql:postgresql-client
for f in "$BIN" "$UPB" "$PG_BIN/initdb"; do [ -x "$f" ] || { echo "$f missing" >&2; exit 1; }; done

# the server refuses to run as root: its programs run as postgres, in a directory it owns
AS=()
if [ "$(id -u)" = 0 ]; then
    AS=(setpriv --reuid=postgres --regid=postgres --init-groups)
    chmod 755 "$DIR"
    mkdir -p "$DIR/pg"
    chown postgres:postgres "$DIR/pg"
fi
PGPORT=$(free_port)
"${AS[@]}" "$PG_BIN/initdb" -D "$DIR/pg/data" -A trust -U postgres > "$DIR/initdb.log" 2>&1 ||
    { cat "$DIR/initdb.log" >&2; exit 1; }
stop_pg() { "${AS[@]}" "$PG_BIN/pg_ctl" -D "$DIR/pg/data" -m fast stop > /dev/null 2>&1 || true; }
trap 'stop_pg; cleanup' EXIT
"${AS[@]}" "$PG_BIN/pg_ctl" -D "$DIR/pg/data" -l "$DIR/pg/log" -w -o \
    "-p $PGPORT -k $DIR/pg -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on -c max_connections=40" \
    start > /dev/null
URL="postgresql://postgres@127.0.0.1:$PGPORT/postgres"
sql() { psql -X -q -t -A "$URL" -c "$1"; }
NS=bench

# config FILE UPSTREAM_URL DELIVERY_MEMBERS: one proxy's config
config() {
    cat > "$1" <<JSON
{"listen": "127.0.0.1:$(free_port)", "admin": "127.0.0.1:$(free_port)", "log": {"level": "error"},
 "store": {"postgres": {"url": "$URL", "namespace": "$NS"}},
 "routes": [{"name": "hooks", "upstreams": ["$2"], "delivery": {$3},
             "retry": {"max_attempts": 12, "backoff": {"policy": "fixed", "base_ms": 60000, "cap_ms": 60000}}}]}
JSON
}
# start_proxy CONFIG: sets PX (its pid, in PIDS) and LP (its port)
start_proxy() {
    LP=$(awk -F'"' '/"listen"/ {split($4, a, ":"); print a[2]}' "$1")
    "$BIN" -c "$1" --workers "$WORKERS" > "$1.log" 2>&1 &
    PX=$!
    PIDS+=("$PX")
    wait_port "$LP"
}

echo "shared store: PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') (fsync on)," \
    "2 proxies --workers $WORKERS, load average $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- 1. accepts ----
down="http://127.0.0.1:$(free_port)" # nothing listens there
ports=()
pids=()
for i in 1 2; do
    config "$DIR/a$i.json" "$down" '"mode": "durable"'
    start_proxy "$DIR/a$i.json"
    ports+=("$LP")
    pids+=("$PX")
done
wrks=()
for i in 0 1; do
    wrk -t1 -c "$CONNS" -d "${SECS}s" -s "$HERE/durable_post.lua" "http://127.0.0.1:${ports[$i]}/hook" -- "$BODY" \
        > "$DIR/wrk-$i.out" &
    wrks+=("$!")
done
wait "${wrks[@]}"
for p in "${pids[@]}"; do kill -TERM "$p"; wait "$p" || true; done
rows=$(sql "SELECT count(*) FROM retryproxy_deliveries WHERE namespace = '$NS'")
cat "$DIR"/wrk-*.out | grep '^RESULT' | awk -v rows="$rows" -v c="$CONNS" -v b="$BODY" '{
    for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    a += v["accepted"]; o += v["other"]; e += v["errors"]; s = v["secs"]
    p = p sprintf("  proxy %d: %.0f/s p50 %.2f ms p99 %.2f ms", NR, v["accepted"] / v["secs"],
                  v["p50_us"] / 1000, v["p99_us"] / 1000) }
    END { printf "accepts: %.0f 202s/s with two proxies (%d callers each, %d B bodies)%s;" \
                 " %d not 202, %d socket errors, %d rows for %d 202s\n", a / s, c, b, p, o, e, rows, a }'

# ---- 2. a backlog drained ----
sql "DELETE FROM retryproxy_deliveries WHERE namespace = '$NS'" > /dev/null
sql "INSERT INTO retryproxy_deliveries(namespace, id, route, method, target, fields, body, body_hash,
       created_at, next_at, state, size)
     SELECT '$NS', md5(g::text || clock_timestamp()::text), 'hooks', 'POST', '/hook', ''::bytea,
       convert_to(repeat('x', 256), 'UTF8'), 0, (extract(epoch from now()) * 1000)::bigint,
       (extract(epoch from now()) * 1000)::bigint - $BACKLOG + g, 0, 256
     FROM generate_series(1, $BACKLOG) g" > /dev/null
sql "ANALYZE retryproxy_deliveries" > /dev/null
# ---- 3. the claim's plan ----
echo "the claim's due rows (EXPLAIN ANALYZE, the backlog due):"
sql "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT id, next_at FROM retryproxy_deliveries
     WHERE namespace = '$NS' AND state = 0 AND next_at <= (extract(epoch from now()) * 1000)::bigint
       AND route = 'hooks' ORDER BY next_at LIMIT 64 FOR UPDATE SKIP LOCKED" | sed 's/^/    /'
test_upstream "$DIR/up.out"
fast='"mode": "durable", "max_in_flight": 1024, "max_in_flight_per_upstream": 1024, "max_per_second": 1000000'
t0=$(date +%s.%N)
for i in 1 2; do
    config "$DIR/b$i.json" "http://127.0.0.1:$UP_PORT" "$fast"
    start_proxy "$DIR/b$i.json"
done
left=$BACKLOG
for _ in $(seq 3000); do
    left=$(sql "SELECT count(*) FROM retryproxy_deliveries WHERE namespace = '$NS' AND state <> 2")
    [ "$left" = 0 ] && break
    sleep 0.2
done
t1=$(date +%s.%N)
awk -v n="$BACKLOG" -v l="$left" -v t0="$t0" -v t1="$t1" 'BEGIN {
    printf "backlog: %d due rows drained by two proxies in %.1f s: %.0f deliveries/s%s\n",
           n - l, t1 - t0, (n - l) / (t1 - t0), l ? sprintf(" (%d left at the bound)", l) : "" }'

echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
