#!/bin/bash
# bench/durable.sh -- durable accepts per second through the real binary (make bench-durable),
# against the floor of one transaction per accept measured in the same run (issue 39).
#
# retryproxy (--workers WORKERS) runs one durable route whose store file is under STORE_DIR
# (WAL, synchronous=FULL: an fsync per commit). wrk -t1 keeps CONNS HTTP/1.1 keep-alive
# connections POSTing BODY-byte bodies for SECS seconds (bench/durable_post.lua); an answer
# counts only if it is a 202, and the file must then hold a row for every 202. Latency is wrk's,
# client-side: from writing a request to its whole answer. CPU us per accept is the proxy's
# utime+stime (/proc/PID/stat, its store thread included) over the run, divided by the 202s.
# The floor is $BUILD/bench/store_bench's "floor" mode (the same store with max_batch = 1: one
# transaction and one fsync per accept, CONNS producer threads, no HTTP), printed with its
# "group" mode (the store alone, group commit). Each repetition runs the proxy, then
# store_bench (floor, group), on fresh files: REPS of them, medians.
#
# UPSTREAM=down (the default): the route's upstream is a port where nothing listens and the
# backoff a minute: the courier makes each delivery's first attempt (connection refused) at
# delivery.max_per_second (100 a second, the default) and reschedules it, so a backlog of due
# deliveries grows by the accept rate: an upstream outage. The courier's claims still run
# (after every commit) and their cost grows with that backlog (bench/README.md). UPSTREAM=up:
# a test upstream answering 200, delivery.max_per_second and max_in_flight raised, so the
# courier delivers as fast as it can on the same two cores (the delivered count is printed).
#
# Settings (environment): SECS [10] REPS [3] CONNS [64] BODY [1024] WORKERS [1]
# UPSTREAM [down] BIN [$BUILD/retryproxy] (another build, for an A/B: run the script itself,
# make sets BIN to its own) STORE_DIR
# [$BUILD/bench-durable]: a directory on the disk to measure (refused on a tmpfs). BUILD [build].
set -euo pipefail
BUILD=${BUILD:-build}
SECS=${SECS:-10}
REPS=${REPS:-3}
CONNS=${CONNS:-64}
BODY=${BODY:-1024}
WORKERS=${WORKERS:-1}
UPSTREAM=${UPSTREAM:-down}
STORE_DIR=${STORE_DIR:-$BUILD/bench-durable}
BIN=${BIN:-$BUILD/retryproxy}
SB=$BUILD/bench/store_bench
UPB=$BUILD/tests/upstream
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$STORE_DIR"
STORE_DIR=$(cd "$STORE_DIR" && pwd)
DIR=$(mktemp -d "$STORE_DIR/run-XXXXXX") # h2lib.sh removes it at exit
. "$HERE/h2lib.sh"
need wrk:wrk sqlite3:sqlite3
for f in "$BIN" "$SB" "$UPB"; do [ -x "$f" ] || { echo "$f missing: make bench-build" >&2; exit 1; }; done
case $UPSTREAM in down | up) ;; *) echo "UPSTREAM is down or up, not $UPSTREAM" >&2; exit 2 ;; esac
fs=$(stat -f -c %T "$STORE_DIR")
if [ "$fs" = tmpfs ] || [ "$fs" = ramfs ]; then
    echo "$STORE_DIR is on $fs: fsync costs nothing there; DIR=a directory on a disk" >&2
    exit 2
fi
TCK=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# one proxy run: prints "accepts/s p50_ms p99_ms cpu_us_per_accept delivered"
proxy_run() {
    local rep=$1 lp up_url up=0 px c0 c1 line db="$DIR/durable-$1.db"
    lp=$(free_port)
    local deliv='"mode": "durable"' retry='"max_attempts": 12, "backoff": {"policy": "fixed", "base_ms": 60000, "cap_ms": 60000}'
    if [ "$UPSTREAM" = up ]; then
        test_upstream "$DIR/up-$rep.out"
        up=$UP_PID
        up_url="http://127.0.0.1:$UP_PORT"
        deliv="$deliv, \"max_in_flight\": 1024, \"max_in_flight_per_upstream\": 1024, \"max_per_second\": 1000000"
    else
        up_url="http://127.0.0.1:$(free_port)" # nothing listens there
    fi
    cat > "$DIR/c-$rep.json" <<JSON
{"listen": "127.0.0.1:$lp", "log": {"level": "error"},
 "store": {"path": "$db"},
 "routes": [{"name": "hooks", "upstreams": ["$up_url"],
             "delivery": {$deliv}, "retry": {$retry}}]}
JSON
    "$BIN" -c "$DIR/c-$rep.json" --workers "$WORKERS" > "$DIR/px-$rep.log" 2>&1 & px=$!
    PIDS+=("$px")
    for _ in $(seq 100); do (echo > "/dev/tcp/127.0.0.1/$lp") 2>/dev/null && break; sleep 0.05; done
    (echo > "/dev/tcp/127.0.0.1/$lp") 2>/dev/null || { cat "$DIR/px-$rep.log" >&2; exit 1; }
    c0=$(cpu_ticks "$px")
    line=$(wrk -t1 -c "$CONNS" -d "${SECS}s" -s "$HERE/durable_post.lua" "http://127.0.0.1:$lp/hook" -- "$BODY" |
        tee "$DIR/wrk-$rep.out" | grep '^RESULT') || { cat "$DIR/wrk-$rep.out" >&2; exit 1; }
    c1=$(cpu_ticks "$px")
    kill -TERM "$px"
    wait "$px" || true
    local delivered=-
    [ "$UPSTREAM" = down ] || delivered=$(sqlite3 "$db" 'select count(*) from deliveries where state = 2')
    [ "$up" = 0 ] || kill "$up" 2>/dev/null || true
    # every 202 is a row: nothing acknowledged is missing from the file
    local rows
    rows=$(sqlite3 "$db" 'select count(*) from deliveries')
    rm -f "$db" "$db-wal" "$db-shm"
    echo "$line" | awk -v c="$(( (c1 - c0) * 1000000 / TCK ))" -v rows="$rows" -v d="$delivered" '{
        for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        if (v["other"] + v["errors"] > 0 || rows < v["accepted"])
            printf "warning: %d not 202, %d socket errors, %d rows for %d accepts\n",
                v["other"], v["errors"], rows, v["accepted"] > "/dev/stderr"
        printf "%.0f %.2f %.2f %.1f %s\n", v["accepted"] / v["secs"], v["p50_us"] / 1000,
            v["p99_us"] / 1000, v["accepted"] ? c / v["accepted"] : 0, d }'
}

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

echo "durable accepts: $CONNS callers, $BODY B bodies, ${SECS} s x $REPS, --workers $WORKERS," \
    "upstream $UPSTREAM, store on $STORE_DIR ($fs), load average $(cut -d' ' -f1-3 /proc/loadavg)"
: > "$DIR/proxy.txt"
: > "$DIR/floor.txt"
: > "$DIR/group.txt"
for r in $(seq "$REPS"); do
    p=$(proxy_run "$r")
    echo "$p" >> "$DIR/proxy.txt"
    read -r a p50 p99 cpu d <<< "$p"
    printf 'rep %d  retryproxy     %7s accepts/s  p50 %6s ms  p99 %6s ms  %6s CPU us/accept%s\n' \
        "$r" "$a" "$p50" "$p99" "$cpu" "$([ "$d" = - ] || echo "  $d delivered")"
    "$SB" --dir "$DIR" --producers "$CONNS" --seconds "$SECS" --body "$BODY" > "$DIR/sb-$r.out"
    for m in floor group; do
        awk -v m="$m" '$1 == m {print $6, $9, $12}' "$DIR/sb-$r.out" >> "$DIR/$m.txt"
        awk -v m="$m" -v r="$r" '$1 == m {printf "rep %d  store_bench %s %7s accepts/s  p50 %6s ms  p99 %6s ms  (%s per commit)\n", r, m, $6, $9, $12, $19}' "$DIR/sb-$r.out"
    done
done
echo
echo "| $CONNS callers, $BODY B, upstream $UPSTREAM (medians of $REPS) | accepts/s | p50 ms | p99 ms | CPU µs/accept |"
echo "|---|---:|---:|---:|---:|"
col() { awk -v k="$2" '{print $k}' "$DIR/$1.txt" | median; }
echo "| retryproxy, durable route (HTTP/1.1, wrk) | $(col proxy 1) | $(col proxy 2) | $(col proxy 3) | $(col proxy 4) |"
echo "| store alone, group commit (store_bench) | $(col group 1) | $(col group 2) | $(col group 3) | - |"
echo "| floor: one transaction per accept (store_bench) | $(col floor 1) | $(col floor 2) | $(col floor 3) | - |"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
