#!/usr/bin/env bash
# slowread.sh -- slow readers against retryproxy (make bench-slowread; bench/README.md).
#
#   bench/slowread.sh
#
# For each count in CLIENTS: a fresh retryproxy (--workers 2, default limits) with two routes,
# /big to a test upstream answering 1 MiB and /small to one answering "ok". slowhttptest opens
# that many slow-read connections to /big (-X: a tiny receive window, 32 bytes read every 5 s),
# while a probe sends GET /small every PROBE_MS with curl -m 4 and records how long each took.
# RSS and descriptors of the proxy are sampled every second, during the attack and for AFTER
# seconds after it ended. One line per count: probes answered / sent, probe latency (median,
# p99, max, in ms), the proxy's idle RSS, its peak RSS, RSS AFTER seconds after the attack.
#
# Environment [default]:
#   BUILD [build]          where make put retryproxy and tests/upstream
#   BIN [BUILD/retryproxy] the proxy to measure (BASE_BIN: another build, measured after it)
#   CLIENTS ["1500 5000"]  slow-read connections per run
#   DURATION [40]          seconds of the attack (slowhttptest -l)
#   RATE [200]             new slow connections per second (slowhttptest -r)
#   PROBE_MS [500]         one probe request every PROBE_MS
#   AFTER [15]             seconds sampled after the attack (RSS back to idle?)
#   BENCH_DIR [mktemp -d]  configs, logs, samples
#
# Loopback only; every port is one the kernel picked. Installs slowhttptest with apt-get as root.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
BIN=${BIN:-$BUILD/retryproxy}
BASE_BIN=${BASE_BIN:-}
CLIENTS=${CLIENTS:-"1500 5000"}
DURATION=${DURATION:-40}
RATE=${RATE:-200}
PROBE_MS=${PROBE_MS:-500}
AFTER=${AFTER:-15}
BENCH_DIR=${BENCH_DIR:-$(mktemp -d /tmp/retryproxy-slowread-XXXXXX)}
UPSTREAM=$BUILD/tests/upstream

if ! command -v slowhttptest >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q slowhttptest >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
                apt-get install -y -q slowhttptest >/dev/null; }
    fi
    command -v slowhttptest >/dev/null || { echo "slowread.sh: needs slowhttptest" >&2; exit 1; }
fi
for f in "$BIN" "$UPSTREAM" ${BASE_BIN:+"$BASE_BIN"}; do
    [ -x "$f" ] || { echo "slowread.sh: $f is missing (make bench-build)" >&2; exit 1; }
done
ulimit -n "$(ulimit -Hn)"

PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# port_of LOGFILE PATTERN: the port in the first line of LOGFILE matching "PATTERN...:PORT"
port_of() {
    local i
    for i in $(seq 100); do
        local p
        p=$(sed -n "s/.*$2 *[^ ]*:\([0-9][0-9]*\).*/\1/p" "$1" | head -1)
        [ -n "$p" ] && { echo "$p"; return; }
        sleep 0.05
    done
    echo "slowread.sh: no port in $1" >&2
    exit 1
}

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

# run_one LABEL BIN N: one attack of N slow readers on a fresh proxy; prints the result line.
run_one() {
    local label=$1 bin=$2 n=$3 dir=$BENCH_DIR/$1-$3
    mkdir -p "$dir"
    "$UPSTREAM" --port 0 --plan 'body=1048576' >"$dir/big.log" 2>&1 &
    PIDS+=($!)
    "$UPSTREAM" --port 0 >"$dir/small.log" 2>&1 &
    PIDS+=($!)
    local big small
    big=$(port_of "$dir/big.log" "listening on")
    small=$(port_of "$dir/small.log" "listening on")
    cat >"$dir/config.json" <<EOF
{"listen": "127.0.0.1:0", "admin": "127.0.0.1:0", "log": {"level": "warn"},
 "routes": [
   {"name": "big", "match": {"path_prefix": "/big"}, "upstreams": ["http://127.0.0.1:$big"]},
   {"name": "small", "upstreams": ["http://127.0.0.1:$small"]}]}
EOF
    "$bin" -c "$dir/config.json" --workers 2 >"$dir/proxy.out" 2>"$dir/proxy.log" &
    local px=$!
    PIDS+=($px)
    local port
    port=$(port_of "$dir/proxy.log" "listening on ")
    curl -s -o /dev/null "http://127.0.0.1:$port/small"
    sleep 1
    local idle
    idle=$(rss_kb $px)
    : >"$dir/probes" && : >"$dir/rss"
    slowhttptest -X -c "$n" -r "$RATE" -w 10 -y 20 -n 5 -z 32 -k 3 -l "$DURATION" \
        -u "http://127.0.0.1:$port/big" >"$dir/slowhttptest.log" 2>&1 &
    local attack=$!
    PIDS+=($attack)
    (
        while kill -0 "$attack" 2>/dev/null; do
            curl -s -o /dev/null -m 4 -w '%{http_code} %{time_total}\n' \
                "http://127.0.0.1:$port/small" >>"$dir/probes" || true
            sleep "$(awk -v m="$PROBE_MS" 'BEGIN {print m / 1000}')"
        done
    ) &
    local prober=$!
    PIDS+=($prober)
    while kill -0 "$attack" 2>/dev/null; do
        echo "attack $(rss_kb $px) $(ls /proc/$px/fd | wc -l)" >>"$dir/rss"
        sleep 1
    done
    wait "$prober" 2>/dev/null || true
    local s
    for s in $(seq "$AFTER"); do
        echo "after $(rss_kb $px) $(ls /proc/$px/fd | wc -l)" >>"$dir/rss"
        sleep 1
    done
    kill "$px" 2>/dev/null || true
    wait "$px" 2>/dev/null || true
    local opened
    # the most slow connections open at once, from slowhttptest's status lines (colour codes cut)
    opened=$(sed 's/\x1b\[[0-9;]*[a-zA-Z]//g' "$dir/slowhttptest.log" |
        awk '$1 == "connected:" && $2 > m { m = $2 } END { print m + 0 }')
    awk '$1 == "200" {print $2 * 1000}' "$dir/probes" | sort -n >"$dir/latencies"
    awk -v label="$label" -v n="$n" -v idle="$idle" -v opened="$opened" \
        -v sent="$(wc -l <"$dir/probes")" '
        FILENAME ~ /latencies$/ { t[++ok] = $1; next }
        $1 == "attack" { if ($2 > peak) peak = $2 }
        $1 == "after" { last = $2 }
        END {
            med = ok ? t[int((ok + 1) / 2)] : 0
            p99 = ok ? t[int(ok * 0.99 + 0.999)] : 0
            printf "| %s | %d | %s | %d / %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
                label, n, opened, ok, sent, med, p99, ok ? t[ok] : 0,
                idle / 1024, peak / 1024, last / 1024
        }' "$dir/latencies" "$dir/rss"
}

echo "| build | slow readers | most connected | probes answered | median ms | p99 ms | max ms | idle RSS MB | peak RSS MB | RSS ${AFTER} s after MB |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for n in $CLIENTS; do
    run_one retryproxy "$BIN" "$n"
    [ -n "$BASE_BIN" ] && run_one base "$BASE_BIN" "$n"
done
echo "(samples and logs in $BENCH_DIR)" >&2
