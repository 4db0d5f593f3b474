#!/usr/bin/env bash
# bench.sh -- retryproxy's benchmark (make bench; bench/README.md says what each row is).
#
#   bench/bench.sh [all|peers|memory|outage|reload]      (default: all)
#
#   peers    wrk -t1 against nginx, HAProxy, Caddy, retryproxy, the floor programs and the
#            upstream itself, targets alternated inside each repetition; medians of req/s,
#            p99, CPU µs per request of the serving process, upstream attempts and new upstream
#            connections per request (the upstream nginx's stub_status)
#   outage   every upstream answers 503: attempts per client request and the statuses clients
#            see, for each proxy (retryproxy with its default retry budget)
#   memory   N clients wait in a 5 s backoff in retryproxy (--workers 1, then 2): RSS, threads
#   reload   bench/reload_latency.sh for a rename, a ConfigMap swap and an in-place write
#   all      the three, then the tables into bench/README.md between the bench:begin/end marks
#
# Every server is started here by hand on 127.0.0.1, one worker or thread each, and stopped on
# exit (also on failure or Ctrl-C). A port already in use stops the run before anything starts.
# As root, missing packages are installed with apt-get (their system services are disabled).
#
# Environment [default]:
#   BUILD [build]          where make put retryproxy, tests/upstream and bench/ (floor programs)
#   DURATION [6]  REPS [5]  CONNS ["64 256"]  PATHS ["ok flaky 10k"]  WARMUP [1] seconds
#   ONLY ['']              extended regex: only peer targets whose name matches are measured
#   BASE_BIN ['']          another retryproxy binary (an older build) measured beside this one,
#                          alternated with it in every repetition, as "retryproxy (base)"
#   OUTAGE_DURATION [4]    OUTAGE_CONNS [64]
#   N [10000]              memory test: clients    MEM_WORKERS ["1 2"]   MEM_AFTER [10] s
#   RELOAD_N [50]          reload test: changes per way of changing the file
#   QUIET_PCT [10]         before each run, wait until the machine uses <= this % CPU
#   QUIET_MAX_WAIT [60]    ... for at most this many seconds, then measure anyway (and wait at
#                          most 5 s before the next runs until the machine is quiet again)
#   NOISY_PCT [5]          a run where other processes used more than this % of all CPUs is
#                          discarded and re-run, at most RERUN_NOISY [2] times (then kept, flagged)
#   PORT_BASE [24000]      every port is PORT_BASE + a fixed offset (see ports below)
#   README [1 for all]     1: write the tables into bench/README.md
#   BENCH_DIR [mktemp -d]  configs, logs, raw CSV, wrk outputs, results.md
set -euo pipefail

MODE=${1:-all}
case "$MODE" in
all | peers | memory | outage | reload) ;;
-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
*) echo "bench.sh: unknown mode '$MODE' (all, peers, memory, outage, reload)" >&2; exit 2 ;;
esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
DURATION=${DURATION:-6}
REPS=${REPS:-5}
CONNS=${CONNS:-"64 256"}
PATHS=${PATHS:-"ok flaky 10k"}
WARMUP=${WARMUP:-1}
ONLY=${ONLY:-}
BASE_BIN=${BASE_BIN:-}
OUTAGE_DURATION=${OUTAGE_DURATION:-4}
OUTAGE_CONNS=${OUTAGE_CONNS:-64}
N=${N:-10000}
MEM_WORKERS=${MEM_WORKERS:-"1 2"}
MEM_AFTER=${MEM_AFTER:-10}
RELOAD_N=${RELOAD_N:-50}
QUIET_PCT=${QUIET_PCT:-10}
QUIET_MAX_WAIT=${QUIET_MAX_WAIT:-60}
NOISY_PCT=${NOISY_PCT:-5}
RERUN_NOISY=${RERUN_NOISY:-2}
PORT_BASE=${PORT_BASE:-24000}
README=${README:-$([ "$MODE" = all ] && echo 1 || echo 0)}
COMMAND="${BENCH_COMMAND:-bench/bench.sh $MODE}"

# Ports.
P_UP=$((PORT_BASE + 1)) P_BAD=$((PORT_BASE + 2)) P_BAD2=$((PORT_BASE + 3)) P_BAD3=$((PORT_BASE + 4))
P_STATUS=$((PORT_BASE + 9))
P_NGINX=$((PORT_BASE + 81)) P_HAPROXY=$((PORT_BASE + 82)) P_CADDY=$((PORT_BASE + 83))
P_MHD=$((PORT_BASE + 91)) P_SUSPEND=$((PORT_BASE + 92))
P_FLOOR_OK=$((PORT_BASE + 93)) P_FLOOR_10K=$((PORT_BASE + 94))
P_TUNED_OK=$((PORT_BASE + 95)) P_TUNED_10K=$((PORT_BASE + 96))
P_RP_ADMIN=$((PORT_BASE + 100)) P_RP=$((PORT_BASE + 101))
P_RPO_ADMIN=$((PORT_BASE + 110)) P_RPO=$((PORT_BASE + 111))
P_RPL_ADMIN=$((PORT_BASE + 120)) P_RPL=$((PORT_BASE + 121))
P_RPB_ADMIN=$((PORT_BASE + 130)) P_RPB=$((PORT_BASE + 131))
P_MEM_UP=$((PORT_BASE + 201)) P_MEM_ADMIN=$((PORT_BASE + 210)) P_MEM=$((PORT_BASE + 211))

BENCH_DIR=${BENCH_DIR:-$(mktemp -d -t retryproxy-bench.XXXXXX)}
mkdir -p "$BENCH_DIR"/{up,nginx,haproxy,caddy,wrk,logs}
chmod 755 "$BENCH_DIR" # nginx workers run as nobody when started as root
LOG=$BENCH_DIR/bench.log
CSV=$BENCH_DIR/raw.csv
RESULTS=$BENCH_DIR/results.md
: >"$LOG"
: >"$RESULTS"
log() { echo "[$(date +%T)] $*" | tee -a "$LOG" >&2; }
fail() { log "bench.sh: $*"; exit 1; }
export PATH=$PATH:/usr/sbin:/sbin
# Descriptors: HAProxy asks for 2 x maxconn + some, the memory test 2 or 3 per client in the proxy.
if [ "$(id -u)" = 0 ] && [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt 65536 ]; then
    ulimit -Hn 65536 2>/dev/null || true
fi
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# ---------------------------------------------------------------- processes
PIDS=() # everything started here, stopped in reverse order
WRK_PID=''
stop_pid() {
    local pid=$1 i
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
stop_all() {
    local i
    [ -n "$WRK_PID" ] && stop_pid "$WRK_PID"
    WRK_PID=''
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do stop_pid "${PIDS[$i]}"; done
    PIDS=()
}
on_exit() {
    local rc=$?
    trap - EXIT INT TERM
    stop_all
    [ "$rc" = 0 ] || log "failed (exit $rc); logs in $BENCH_DIR"
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME LOGFILE CMD... : runs CMD in the background; its PID in STARTED_PID
start() {
    local name=$1 out=$2
    shift 2
    "$@" >>"$out" 2>&1 &
    STARTED_PID=$!
    PIDS+=("$STARTED_PID")
    log "started $name: PID $STARTED_PID"
}
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
need_ports() {
    local p
    for p in "$@"; do port_free "$p" || fail "port $p on 127.0.0.1 is in use (set PORT_BASE)"; done
}
wait_listen() { # wait_listen PORT PID NAME
    local i
    for ((i = 0; i < 100; i++)); do
        port_free "$1" || return 0
        kill -0 "$2" 2>/dev/null || fail "$3 exited at start (see $BENCH_DIR/logs)"
        sleep 0.1
    done
    fail "$3 does not listen on $1"
}
children() { ps -o pid= --ppid "$1" | tr -s ' \n' ' ' || true; }
workers_of() { # nginx: the master's children, once there are some
    local i k
    for ((i = 0; i < 50; i++)); do
        k=$(children "$1")
        [ -n "${k// /}" ] && { echo "$k"; return 0; }
        sleep 0.1
    done
    fail "nginx $1 has no worker"
}
# User+system CPU ticks of processes (all their threads).
cpu_ticks_of() {
    local p t=0 v
    for p in "$@"; do
        # utime and stime: fields 14 and 15, the 12th and 13th after the ")" ending the name
        v=$(awk '{ sub(/^.*\) /, ""); split($0, a, " "); print a[12] + a[13] }' "/proc/$p/stat" 2>/dev/null) || v=0
        t=$((t + ${v:-0}))
    done
    echo "$t"
}
HZ=$(getconf CLK_TCK)
NCPU=$(nproc)
machine_ticks() { # -> "busy total" from /proc/stat (busy includes steal)
    awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat
}
# CPU ticks used by processes that are not ours: every user-space process but this script (whose
# children's time, wrk's included, lands in its own), the servers started here and their
# children; a process's reaped children count with it. Kernel threads are left out: under load
# they mostly carry our own loopback traffic.
foreign_ticks() {
    local ours
    ours=" $$ ${PIDS[*]} ${SERVE_PID[*]} "
    { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v ours="$ours" '{
        pid = $1; sub(/^.*\) /, ""); split($0, a, " ")
        if (pid == 2 || a[2] == 2 || index(ours, " " pid " ")) next
        t += a[12] + a[13] + a[14] + a[15] } END { print t + 0 }'
}
FLAGGED_WAITS=0
BUSY_STREAK=0 # set after a quiet wait timed out: later waits give up after 5 s until one succeeds
wait_quiet() {
    local w=0 b0 t0 b1 t1 pct limit=$QUIET_MAX_WAIT
    [ "$BUSY_STREAK" = 1 ] && [ "$limit" -gt 5 ] && limit=5
    while :; do
        read -r b0 t0 < <(machine_ticks)
        sleep 1
        read -r b1 t1 < <(machine_ticks)
        pct=$(((b1 - b0) * 100 / (t1 > t0 ? t1 - t0 : 1)))
        if [ "$pct" -le "$QUIET_PCT" ]; then
            BUSY_STREAK=0
            return 0
        fi
        [ "$w" = 0 ] && [ "$BUSY_STREAK" = 0 ] &&
            log "machine busy (${pct}% CPU) with our servers idle: waiting up to ${limit}s"
        w=$((w + 1))
        if [ "$w" -ge "$limit" ]; then
            [ "$BUSY_STREAK" = 0 ] && log "still ${pct}% busy after ${w}s: measuring anyway"
            BUSY_STREAK=1
            FLAGGED_WAITS=$((FLAGGED_WAITS + 1))
            return 0
        fi
    done
}

# ---------------------------------------------------------------- packages
ensure_packages() {
    local want=() p cmd
    command -v nginx >/dev/null || want+=(nginx-light)
    command -v haproxy >/dev/null || want+=(haproxy)
    command -v caddy >/dev/null || want+=(caddy)
    command -v wrk >/dev/null || want+=(wrk)
    command -v curl >/dev/null || want+=(curl)
    [ "${#want[@]}" = 0 ] && return 0
    [ "$(id -u)" = 0 ] || fail "missing: ${want[*]} (as root: apt-get install -y ${want[*]})"
    log "installing ${want[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${want[@]}" >>"$LOG" 2>&1 ||
        { apt-get update -q >>"$LOG" 2>&1 && apt-get install -y -q "${want[@]}" >>"$LOG" 2>&1; } ||
        fail "apt-get install ${want[*]} failed (see $LOG)"
    for p in nginx haproxy caddy; do # only private instances are used
        systemctl disable --now "$p" >>"$LOG" 2>&1 || service "$p" stop >>"$LOG" 2>&1 || true
    done
    for cmd in nginx haproxy caddy wrk curl; do command -v "$cmd" >/dev/null || fail "no $cmd"; done
}

# ---------------------------------------------------------------- configs
# Rewrite a retryproxy config's well-known ports to this run's.
remap_ports() {
    sed -e "s/127\.0\.0\.1:15001\b/127.0.0.1:$P_RP/; s/127\.0\.0\.1:15000\b/127.0.0.1:$P_RP_ADMIN/" \
        -e "s/127\.0\.0\.1:15011\b/127.0.0.1:$P_RPO/; s/127\.0\.0\.1:15010\b/127.0.0.1:$P_RPO_ADMIN/" \
        -e "s/127\.0\.0\.1:15021\b/127.0.0.1:$P_MEM/; s/127\.0\.0\.1:15020\b/127.0.0.1:$P_MEM_ADMIN/" \
        -e "s/127\.0\.0\.1:9001\b/127.0.0.1:$P_UP/g; s/127\.0\.0\.1:9002\b/127.0.0.1:$P_BAD/g" \
        -e "s/127\.0\.0\.1:9003\b/127.0.0.1:$P_BAD2/g; s/127\.0\.0\.1:9004\b/127.0.0.1:$P_BAD3/g" \
        -e "s/127\.0\.0\.1:9021\b/127.0.0.1:$P_MEM_UP/g" "$1"
}
nginx_main_common() { # $1 = instance dir: one worker in the foreground
    cat <<EOF
worker_processes 1;
daemon off;
pid $1/nginx.pid;
error_log $1/error.log warn;
worker_rlimit_nofile 16384;
events { worker_connections 8192; }
EOF
}
nginx_http_common() { # $1 = instance dir
    cat <<EOF
    access_log off;
    default_type text/plain;
    keepalive_timeout 75s;
    keepalive_requests 1000000;
    client_body_temp_path $1/tmp; proxy_temp_path $1/tmp; fastcgi_temp_path $1/tmp;
    uwsgi_temp_path $1/tmp; scgi_temp_path $1/tmp;
EOF
}
write_configs() {
    local d=$BENCH_DIR
    mkdir -p "$d/up/tmp" "$d/nginx/tmp" "$d/caddy/data" "$d/www"
    head -c 10240 /dev/zero | tr '\0' 'x' >"$d/www/10k"
    chmod -R a+rX "$d/www"
    cat >"$d/up/nginx.conf" <<EOF
# The upstream: healthy $P_UP, three servers answering 503 ($P_BAD $P_BAD2 $P_BAD3), counters.
$(nginx_main_common "$d/up")
http {
$(nginx_http_common "$d/up")
    server {
        listen 127.0.0.1:$P_UP backlog=4096;
        root $d/www;
        location = /      { return 200 "up\n"; }
        location = /ok    { return 200 "ok\n"; }
        location = /flaky { return 200 "ok\n"; }
        location = /10k   { }
    }
    server {
        listen 127.0.0.1:$P_BAD backlog=4096;
        listen 127.0.0.1:$P_BAD2 backlog=4096;
        listen 127.0.0.1:$P_BAD3 backlog=4096;
        location / { return 503 "unavailable\n"; }
    }
    server {
        listen 127.0.0.1:$P_STATUS;
        location / { stub_status; }
    }
}
EOF
    # Peer nginx: 3 tries on error, timeout, 502/503/504; kept-alive upstream connections;
    # max_fails=0 so that a 503 server is never ejected (the retries are what is measured).
    cat >"$d/nginx/nginx.conf" <<EOF
$(nginx_main_common "$d/nginx")
http {
$(nginx_http_common "$d/nginx")
    upstream single { server 127.0.0.1:$P_UP; keepalive 64; keepalive_requests 1000000; }
    upstream pair {
        server 127.0.0.1:$P_UP max_fails=0;
        server 127.0.0.1:$P_BAD max_fails=0;
        keepalive 64; keepalive_requests 1000000;
    }
    upstream down {
        server 127.0.0.1:$P_BAD max_fails=0;
        server 127.0.0.1:$P_BAD2 max_fails=0;
        server 127.0.0.1:$P_BAD3 max_fails=0;
        keepalive 64; keepalive_requests 1000000;
    }
    server {
        listen 127.0.0.1:$P_NGINX backlog=4096;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_next_upstream error timeout http_502 http_503 http_504;
        proxy_next_upstream_tries 3;
        location /flaky  { proxy_pass http://pair; }
        location /outage { proxy_pass http://down; }
        location /       { proxy_pass http://single; }
    }
}
EOF
    # Peer HAProxy: 3 retries on every retryable error (502/503/504 included), another server
    # on each retry, connections reused.
    cat >"$d/haproxy/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn 8192
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 75s
    http-reuse always
    retries 3
    retry-on all-retryable-errors
    option redispatch
frontend fe
    bind 127.0.0.1:$P_HAPROXY
    use_backend pair if { path_beg /flaky }
    use_backend down if { path_beg /outage }
    default_backend single
backend single
    server up 127.0.0.1:$P_UP
backend pair
    balance roundrobin
    server up 127.0.0.1:$P_UP
    server bad 127.0.0.1:$P_BAD
backend down
    balance roundrobin
    server bad1 127.0.0.1:$P_BAD
    server bad2 127.0.0.1:$P_BAD2
    server bad3 127.0.0.1:$P_BAD3
EOF
    # Caddy: up to 3 tries (lb_retries 2) within 1 s. Caddy retries only when it could not
    # reach an upstream (and its transport errors), never on a status: a 503 goes back as is.
    local caddy_lb="lb_policy round_robin
        lb_retries 2
        lb_try_duration 1s
        transport http {
            keepalive 75s
            keepalive_idle_conns_per_host 64
        }"
    cat >"$d/caddy/Caddyfile" <<EOF
{
    admin off
    auto_https off
    servers {
        protocols h1
    }
}
http://127.0.0.1:$P_CADDY {
    bind 127.0.0.1
    @flaky path /flaky*
    @outage path /outage*
    reverse_proxy @flaky 127.0.0.1:$P_UP 127.0.0.1:$P_BAD {
        $caddy_lb
    }
    reverse_proxy @outage 127.0.0.1:$P_BAD 127.0.0.1:$P_BAD2 127.0.0.1:$P_BAD3 {
        $caddy_lb
    }
    reverse_proxy 127.0.0.1:$P_UP {
        $caddy_lb
    }
}
EOF
    remap_ports "$ROOT/bench/peers-config.json" >"$d/retryproxy-peers.json"
    # the same with the JSON request log on (level info), for the log's own cost
    sed -e "s/127\.0\.0\.1:$P_RP\b/127.0.0.1:$P_RPL/; s/127\.0\.0\.1:$P_RP_ADMIN\b/127.0.0.1:$P_RPL_ADMIN/" \
        -e 's/"level": "warn"/"level": "info"/' "$d/retryproxy-peers.json" >"$d/retryproxy-log.json"
    # the same for BASE_BIN, on its own ports; a build before issue 38 has no
    # routes[].weigh_endpoints (and never weighs), one before endpoints (issue 29) no
    # routes[].balance either, and rotates as round_robin does
    sed -e "s/127\.0\.0\.1:$P_RP\b/127.0.0.1:$P_RPB/; s/127\.0\.0\.1:$P_RP_ADMIN\b/127.0.0.1:$P_RPB_ADMIN/" \
        -e '/^ *"weigh_endpoints": false,$/d' "$d/retryproxy-peers.json" >"$d/retryproxy-base.json"
    if [ -n "$BASE_BIN" ] && ! "$BASE_BIN" check -c "$d/retryproxy-base.json" >/dev/null 2>&1; then
        sed -i 's/ "balance": "round_robin",//' "$d/retryproxy-base.json"
    fi
    remap_ports "$ROOT/bench/outage-config.json" >"$d/retryproxy-outage.json"
    remap_ports "$ROOT/bench/memory-config.json" >"$d/retryproxy-memory.json"
    # wrk script for the outage test: count statuses (and retryproxy's X-Retry-Stop).
    cat >"$d/statuses.lua" <<'EOF'
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) counts = {} end
function response(status, headers, body)
    local key = tostring(status)
    local stop = headers["X-Retry-Stop"] or headers["x-retry-stop"]
    if stop then key = key .. " (" .. stop .. ")" end
    counts[key] = (counts[key] or 0) + 1
end
function done(summary, latency, requests)
    local all = {}
    for _, t in ipairs(threads) do
        for k, v in pairs(t:get("counts")) do all[k] = (all[k] or 0) + v end
    end
    for k, v in pairs(all) do io.write(string.format("status %s = %d\n", k, v)) end
end
EOF
}

# ---------------------------------------------------------------- servers
UP_PID='' NGINX_PID='' HAPROXY_PID='' CADDY_PID='' RP_PID='' RPO_PID=''
declare -A SERVE_PID # target kind -> PID whose CPU is the serving cost
start_upstream() {
    need_ports "$P_UP" "$P_BAD" "$P_BAD2" "$P_BAD3" "$P_STATUS"
    nginx -t -q -p "$BENCH_DIR/up/" -c "$BENCH_DIR/up/nginx.conf" >>"$LOG" 2>&1 ||
        fail "upstream nginx config (see $LOG)"
    start upstream "$BENCH_DIR/logs/up.log" nginx -p "$BENCH_DIR/up/" -c "$BENCH_DIR/up/nginx.conf"
    UP_PID=$STARTED_PID
    wait_listen "$P_UP" "$UP_PID" upstream
    wait_listen "$P_STATUS" "$UP_PID" upstream
    SERVE_PID[direct]=$(workers_of "$UP_PID")
}
start_peers() {
    need_ports "$P_NGINX" "$P_HAPROXY" "$P_CADDY" "$P_RP" "$P_RP_ADMIN" "$P_RPO" "$P_RPO_ADMIN" \
        "$P_RPL" "$P_RPL_ADMIN"
    nginx -t -q -p "$BENCH_DIR/nginx/" -c "$BENCH_DIR/nginx/nginx.conf" >>"$LOG" 2>&1 ||
        fail "peer nginx config (see $LOG)"
    start nginx "$BENCH_DIR/logs/nginx.log" nginx -p "$BENCH_DIR/nginx/" -c "$BENCH_DIR/nginx/nginx.conf"
    NGINX_PID=$STARTED_PID
    wait_listen "$P_NGINX" "$NGINX_PID" nginx
    SERVE_PID[nginx]=$(workers_of "$NGINX_PID")
    haproxy -q -c -f "$BENCH_DIR/haproxy/haproxy.cfg" >>"$LOG" 2>&1 || fail "haproxy config (see $LOG)"
    start haproxy "$BENCH_DIR/logs/haproxy.log" haproxy -db -f "$BENCH_DIR/haproxy/haproxy.cfg"
    HAPROXY_PID=$STARTED_PID
    wait_listen "$P_HAPROXY" "$HAPROXY_PID" haproxy
    SERVE_PID[haproxy]=$HAPROXY_PID
    HOME="$BENCH_DIR/caddy" caddy adapt --adapter caddyfile --config "$BENCH_DIR/caddy/Caddyfile" \
        >"$BENCH_DIR/caddy/config.json" 2>>"$LOG" || fail "Caddy config (see $LOG)"
    start caddy "$BENCH_DIR/logs/caddy.log" env GOMAXPROCS=1 HOME="$BENCH_DIR/caddy" \
        XDG_DATA_HOME="$BENCH_DIR/caddy/data" XDG_CONFIG_HOME="$BENCH_DIR/caddy/data" \
        caddy run --adapter caddyfile --config "$BENCH_DIR/caddy/Caddyfile"
    CADDY_PID=$STARTED_PID
    wait_listen "$P_CADDY" "$CADDY_PID" caddy
    SERVE_PID[caddy]=$CADDY_PID
    start retryproxy "$BENCH_DIR/logs/retryproxy.log" \
        "$BUILD/retryproxy" -c "$BENCH_DIR/retryproxy-peers.json" --workers 1
    RP_PID=$STARTED_PID
    wait_listen "$P_RP" "$RP_PID" retryproxy
    SERVE_PID[retryproxy]=$RP_PID
    # its request log goes to /dev/null: formatting and writing it is the cost measured
    start retryproxy-log /dev/null "$BUILD/retryproxy" -c "$BENCH_DIR/retryproxy-log.json" --workers 1
    RPL_PID=$STARTED_PID
    wait_listen "$P_RPL" "$RPL_PID" retryproxy-log
    SERVE_PID[retryproxy_log]=$RPL_PID
    if [ -n "$BASE_BIN" ]; then
        need_ports "$P_RPB" "$P_RPB_ADMIN"
        start retryproxy-base "$BENCH_DIR/logs/retryproxy-base.log" \
            "$BASE_BIN" -c "$BENCH_DIR/retryproxy-base.json" --workers 1
        wait_listen "$P_RPB" "$STARTED_PID" retryproxy-base
        SERVE_PID[retryproxy_base]=$STARTED_PID
    fi
    start retryproxy-outage "$BENCH_DIR/logs/retryproxy-outage.log" \
        "$BUILD/retryproxy" -c "$BENCH_DIR/retryproxy-outage.json" --workers 1
    RPO_PID=$STARTED_PID
    wait_listen "$P_RPO" "$RPO_PID" retryproxy-outage
    SERVE_PID[retryproxy_default]=$RPO_PID
}
start_floors() {
    local kind port args
    for spec in "floor_mhd $P_MHD" "floor_suspend $P_SUSPEND" \
        "floor_proxy_ok $P_FLOOR_OK --upstream http://127.0.0.1:$P_UP/ok" \
        "floor_proxy_10k $P_FLOOR_10K --upstream http://127.0.0.1:$P_UP/10k" \
        "floor_tuned_ok $P_TUNED_OK --tuned --upstream http://127.0.0.1:$P_UP/ok" \
        "floor_tuned_10k $P_TUNED_10K --tuned --upstream http://127.0.0.1:$P_UP/10k"; do
        read -r kind port args <<<"$spec"
        need_ports "$port"
        local bin=${kind%_ok}
        bin=${bin%_10k}
        [ "$bin" = floor_tuned ] && bin=floor_proxy
        # shellcheck disable=SC2086
        start "$kind" "$BENCH_DIR/logs/$kind.log" "$BUILD/bench/$bin" --port "$port" $args
        wait_listen "$port" "$STARTED_PID" "$kind"
        SERVE_PID[$kind]=$STARTED_PID
    done
}

# ---------------------------------------------------------------- peers
T_NAME=() T_URL=() T_KIND=()
add_target() { # NAME URL KIND
    if [ -n "$ONLY" ] && ! [[ $1 =~ $ONLY ]]; then return 0; fi
    T_NAME+=("$1") T_URL+=("$2") T_KIND+=("$3")
}
build_targets() {
    local p
    for p in $PATHS; do
        case "$p" in ok | flaky | 10k) ;; *) fail "unknown path '$p' (ok, flaky, 10k)" ;; esac
        [ "$p" != flaky ] && add_target "direct /$p" "http://127.0.0.1:$P_UP/$p" direct
        add_target "nginx /$p" "http://127.0.0.1:$P_NGINX/$p" nginx
        add_target "HAProxy /$p" "http://127.0.0.1:$P_HAPROXY/$p" haproxy
        add_target "Caddy /$p" "http://127.0.0.1:$P_CADDY/$p" caddy
        add_target "retryproxy /$p" "http://127.0.0.1:$P_RP/$p" retryproxy
        [ -n "$BASE_BIN" ] && add_target "retryproxy (base) /$p" "http://127.0.0.1:$P_RPB/$p" \
            retryproxy_base
        case "$p" in
        ok)
            add_target "retryproxy /ok (request log on)" "http://127.0.0.1:$P_RPL/ok" retryproxy_log
            add_target "floor_mhd" "http://127.0.0.1:$P_MHD/ok" floor_mhd
            add_target "floor_suspend" "http://127.0.0.1:$P_SUSPEND/ok" floor_suspend
            add_target "floor_proxy /ok" "http://127.0.0.1:$P_FLOOR_OK/ok" floor_proxy_ok
            add_target "floor_proxy --tuned /ok" "http://127.0.0.1:$P_TUNED_OK/ok" floor_tuned_ok
            ;;
        10k)
            add_target "floor_proxy /10k" "http://127.0.0.1:$P_FLOOR_10K/10k" floor_proxy_10k
            add_target "floor_proxy --tuned /10k" "http://127.0.0.1:$P_TUNED_10K/10k" floor_tuned_10k
            ;;
        esac
    done
    [ "${#T_NAME[@]}" -gt 0 ] || fail "no target selected (ONLY='$ONLY', PATHS='$PATHS')"
}
up_counters() { # -> "accepts requests" of the upstream (this probe included)
    curl -s --max-time 2 "http://127.0.0.1:$P_STATUS/" | awk 'NR == 3 { print $1, $3 }'
}
# wrk_parse FILE -> "rps p99_ms requests non2xx socket_errors"
wrk_parse() {
    awk 'function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0;
                          if (v ~ /s$/) return v * 1000; return v + 0 }
         /Latency Distribution/ { d = 1 }
         d && $1 == "99%" { p99 = ms($2) }
         / requests in / { n = $1 }
         /Non-2xx or 3xx/ { bad = $NF }
         /Socket errors/ { gsub(/[^0-9 ]/, " "); for (i = 1; i <= NF; i++) se += $i }
         /^Requests\/sec/ { rps = $2 }
         END { printf "%.0f %.3f %d %d %d\n", rps, p99, n, bad, se }' "$1"
}
# measure NAME URL KIND CONNS SECONDS OUT [wrk args...] -> sets M (a CSV tail) and M_FOREIGN
measure() {
    local name=$1 url=$2 kind=$3 c=$4 secs=$5 out=$6
    shift 6
    local procs=${SERVE_PID[$kind]}
    local a0 r0 a1 r1 p0 p1 b0 t0 b1 t1 f0 f1
    read -r a0 r0 < <(up_counters)
    p0=$(cpu_ticks_of $procs)
    read -r b0 t0 < <(machine_ticks)
    f0=$(foreign_ticks)
    wrk -t1 -c"$c" -d"${secs}s" --latency "$@" "$url" >"$out" 2>&1 &
    WRK_PID=$!
    wait "$WRK_PID" || log "wrk failed on $name (see $out)"
    WRK_PID=''
    read -r b1 t1 < <(machine_ticks)
    f1=$(foreign_ticks)
    p1=$(cpu_ticks_of $procs)
    read -r a1 r1 < <(up_counters)
    # foreign: CPU of processes not ours, in % of all CPUs over the run
    M_FOREIGN=$(awk -v f=$((f1 - f0)) -v t=$((t1 - t0)) 'BEGIN { printf "%.1f", (t > 0 ? f * 100 / t : 0) }')
    local rps p99 n bad se
    read -r rps p99 n bad se < <(wrk_parse "$out")
    M=$(awk -v rps="$rps" -v p99="$p99" -v n="$n" -v bad="$bad" -v se="$se" -v pt=$((p1 - p0)) \
        -v hz="$HZ" -v ur=$((r1 - r0 - 1)) -v ua=$((a1 - a0 - 1)) -v kind="$kind" 'BEGIN {
          cpu = (n > 0 && kind != "direct") ? pt * 1e6 / hz / n : -1
          printf "%s,%s,%s,%s,%s,%.2f,%.4f,%.4f", rps, p99, n, bad, se, cpu,
            (n > 0 ? ur / n : 0), (n > 0 ? ua / n : 0) }')
}
run_peers() {
    build_targets
    local i c rep tries out
    for i in "${!T_NAME[@]}"; do
        local code
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "${T_URL[$i]}" || true)
        [ "$code" = 200 ] || log "note: ${T_NAME[$i]} answered $code to a probe"
    done
    local maxc
    maxc=$(tr ' ' '\n' <<<"$CONNS" | sort -n | tail -n 1)
    if [ "$WARMUP" != 0 ]; then
        log "warm-up: ${WARMUP}s per target at c=$maxc"
        for i in "${!T_NAME[@]}"; do wrk -t1 -c"$maxc" -d"${WARMUP}s" "${T_URL[$i]}" >>"$LOG" 2>&1 || true; done
    fi
    echo "conc,rep,target,rps,p99_ms,requests,non2xx,sock_err,cpu_us_req,attempts_req,new_conns_req,foreign_pct,flagged" >"$CSV"
    for c in $CONNS; do
        for ((rep = 1; rep <= REPS; rep++)); do
            for i in "${!T_NAME[@]}"; do
                tries=0
                out="$BENCH_DIR/wrk/$(tr -c 'A-Za-z0-9_\n' _ <<<"${T_NAME[$i]}")_c${c}_r${rep}.txt"
                while :; do
                    wait_quiet
                    measure "${T_NAME[$i]}" "${T_URL[$i]}" "${T_KIND[$i]}" "$c" "$DURATION" "$out"
                    if awk -v f="$M_FOREIGN" -v t="$NOISY_PCT" 'BEGIN { exit !(f > t) }'; then
                        if [ "$tries" -lt "$RERUN_NOISY" ]; then
                            tries=$((tries + 1))
                            log "  c=$c ${T_NAME[$i]}: discarded (${M_FOREIGN}% foreign CPU), again"
                            continue
                        fi
                        echo "$c,$rep,${T_NAME[$i]},$M,$M_FOREIGN,1" >>"$CSV"
                    else
                        echo "$c,$rep,${T_NAME[$i]},$M,$M_FOREIGN,0" >>"$CSV"
                    fi
                    log "$(printf 'c=%-3s rep %s %-26s %s  foreign %s%%' "$c" "$rep" "${T_NAME[$i]}" "$M" "$M_FOREIGN")"
                    break
                done
            done
        done
    done
    {
        echo "### Throughput (wrk -t1, medians of $REPS x ${DURATION} s, targets alternated)"
        echo
        awk -F, '
          function med(key, col,   n, i, j, a, t) { n = cnt[key]
            for (i = 1; i <= n; i++) a[i] = v[key, i, col]
            for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
            return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
          function num(x, fmt) { return x < 0 ? "-" : sprintf(fmt, x) }
          NR == 1 { next }
          { k = $1 SUBSEP $3; if (!(k in cnt)) { order[++nk] = k; conc[k] = $1; name[k] = $3 }
            n = ++cnt[k]; for (c = 4; c <= 13; c++) v[k, n, c] = $c
            bad[k] += $7; se[k] += $8; fl[k] += $13 }
          END {
            print "| conc | target | req/s | p99 ms | CPU µs/req | upstream attempts/req | new upstream conns/req | non-2xx | socket errors | flagged runs |"
            print "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
            for (i = 1; i <= nk; i++) { k = order[i]
              b = name[k] ~ /^retryproxy/ ? "**" : ""
              printf "| %s | %s%s%s | %s | %.2f | %s | %.3f | %.4f | %d | %d | %d/%d |\n", conc[k], b, name[k], b,
                sprintf("%\047.0f", med(k, 4)), med(k, 5), num(med(k, 9), "%.1f"), med(k, 10), med(k, 11),
                bad[k], se[k], fl[k], cnt[k] } }' "$CSV"
        echo
        echo "CPU µs/req: user+system CPU of the serving process (nginx: its worker; retryproxy: the"
        echo "whole process) over the wrk run, divided by the requests wrk completed. Attempts and new"
        echo "connections are counted at the upstream nginx (stub_status). Caddy retries only when it"
        echo "cannot reach an upstream, never on a 503: its /flaky row answers about half the requests"
        echo "503 after one attempt (the non-2xx column). Flagged: runs kept although other processes"
        echo "used more than ${NOISY_PCT}% of the CPUs (re-run $RERUN_NOISY times first); quiet-wait timeouts: $FLAGGED_WAITS."
        echo
    } >>"$RESULTS"
}

# ---------------------------------------------------------------- outage
run_outage() {
    local specs=("nginx $P_NGINX" "HAProxy $P_HAPROXY" "Caddy $P_CADDY" "retryproxy_default $P_RPO")
    local s name port out kind statuses
    {
        echo "### Outage: every upstream answers 503 (wrk -t1 -c$OUTAGE_CONNS, ${OUTAGE_DURATION} s)"
        echo
        echo "| proxy | req/s | upstream attempts per client request | new upstream conns/req | statuses seen by clients |"
        echo "|---|---:|---:|---:|---|"
    } >>"$RESULTS"
    for s in "${specs[@]}"; do
        read -r name port <<<"$s"
        kind=$(tr 'A-Z' 'a-z' <<<"$name")
        out="$BENCH_DIR/wrk/outage_$kind.txt"
        wait_quiet
        measure "outage $name" "http://127.0.0.1:$port/outage" "$kind" "$OUTAGE_CONNS" \
            "$OUTAGE_DURATION" "$out" -s "$BENCH_DIR/statuses.lua"
        statuses=$(awk '/^status / { sub(/^status /, ""); print }' "$out" | sort | paste -sd ';' | sed 's/;/; /g')
        log "outage $name: $M  statuses: $statuses"
        [ "$name" = retryproxy_default ] && name="**retryproxy** (default budget)"
        awk -F, -v name="$name" -v st="$statuses" \
            '{ printf "| %s | %\047.0f | %.3f | %.4f | %s |\n", name, $1, $7, $8, st }' <<<"$M" >>"$RESULTS"
    done
    {
        echo
        echo "Each proxy sends /outage round-robin to three upstream servers that all answer 503, with"
        echo "its throughput-test retry settings (nginx: 3 tries, max_fails=0; HAProxy: retries 3 with"
        echo "redispatch; Caddy: lb_retries 2, which does not retry a status), except retryproxy, which"
        echo "runs bench/outage-config.json: 3 attempts and its default retry budget (20 % of first"
        echo "attempts + 10/s; exponential backoff, 100 ms base, full jitter)."
        echo
    } >>"$RESULTS"
}

# ---------------------------------------------------------------- memory
# ---------------------------------------------------------------- reload latency
run_reload() {
    log "reload latency: bench/reload_latency.sh, N=$RELOAD_N per mode"
    {
        echo "### Reload latency: a config change to the new policy in GET /schedule"
        echo
        echo "| how the change arrives | changes | median ms | p90 ms | max ms |"
        echo "|---|---:|---:|---:|---:|"
        local m line
        for m in rename kube inplace; do
            line=$(N=$RELOAD_N MODE=$m sh "$ROOT/bench/reload_latency.sh" "$BUILD/retryproxy" 2>>"$LOG" | tail -n 1)
            log "reload $m: $line"
            echo "$line" | awk -v m="$m" '{
                for (i = 1; i <= NF; i++) { if ($i == "median") md = $(i + 1); if ($i == "p90") p = $(i + 1); if ($i == "max") mx = $(i + 1) }
                gsub(/[^0-9.]/, "", md); gsub(/[^0-9.]/, "", p); gsub(/[^0-9.]/, "", mx)
                n = $2; sub(/^x/, "", n); sub(/:$/, "", n)
                d = m == "rename" ? "rename over the config (an editor, a config agent)" : m == "kube" ? "Kubernetes ConfigMap swap (`..data`)" : "in-place write (debounced 100 ms)"
                printf "| %s | %s | %s | %s | %s |\n", d, n, md, p, mx }'
        done
        echo
        echo "bench/reload_latency.sh: one retryproxy, one worker; each change rewrites route r's base_ms"
        echo "and the time runs until GET /schedule (polled back to back) shows it. A file that arrives"
        echo "whole is read in the loop turn that reads its event; an in-place write waits for the"
        echo "100 ms debounce."
        echo
    } >>"$RESULTS"
}

run_memory() {
    local w out up_pid rp_pid r
    local cfg="$BENCH_DIR/retryproxy-memory.json"
    [ "$(ulimit -n)" -ge $((2 * N + 100)) ] ||
        log "note: RLIMIT_NOFILE $(ulimit -n) may be too low for $N clients (2 per client in the proxy)"
    {
        echo "### $N requests waiting in a 5 s backoff (retryproxy, bench/memory-config.json)"
        echo
        echo "| workers | RSS idle | waiting: steady / peak | threads waiting (target <= workers + 4) | answering all at once: peak | ${MEM_AFTER} s after the last answer | answered 200 | time to last answer | targets |"
        echo "|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    } >>"$RESULTS"
    for w in $MEM_WORKERS; do
        need_ports "$P_MEM_UP" "$P_MEM" "$P_MEM_ADMIN"
        start mem-upstream "$BENCH_DIR/logs/mem-upstream-w$w.log" \
            "$BUILD/tests/upstream" --port "$P_MEM_UP" --plan 'fail=1;status=503'
        up_pid=$STARTED_PID
        wait_listen "$P_MEM_UP" "$up_pid" "test upstream"
        start "retryproxy-memory (--workers $w)" "$BENCH_DIR/logs/retryproxy-memory-w$w.log" \
            "$BUILD/retryproxy" -c "$cfg" --workers "$w"
        rp_pid=$STARTED_PID
        wait_listen "$P_MEM" "$rp_pid" retryproxy
        sleep 1
        wait_quiet
        out="$BENCH_DIR/memory-w$w.txt"
        "$BUILD/bench/waiters" --port "$P_MEM" --pid "$rp_pid" --n "$N" --after "$MEM_AFTER" \
            >"$out" 2>>"$LOG" || log "waiters did not finish cleanly (workers $w)"
        r=$(tail -n 1 "$out")
        log "memory, $w worker(s): $r"
        kill -0 "$rp_pid" 2>/dev/null || log "retryproxy (--workers $w) is gone (see $BENCH_DIR/logs)"
        awk -v w="$w" -v line="$r" 'BEGIN {
            n = split(line, kv, " "); for (i = 1; i <= n; i++) { split(kv[i], p, "="); v[p[1]] = p[2] }
            mib = 1024
            wait_ok = v["wait_peak_rss_kb"] >= 0 && v["wait_peak_rss_kb"] <= 64 * mib
            thr_ok = v["wait_threads_max"] >= 0 && v["wait_threads_max"] <= w + 4
            ans_ok = v["answer_peak_rss_kb"] >= 0 && v["answer_peak_rss_kb"] <= 128 * mib
            aft_ok = v["after_rss_kb"] >= 0 && v["after_rss_kb"] <= 64 * mib
            printf "| %d | %.1f MiB | %.1f / %.1f MiB | %d (idle %d) | %.1f MiB | %.1f MiB | %d of %d | %.1f s | waiting <= 64 MiB: %s; threads: %s; burst <= 128 MiB: %s; < 64 MiB within %d s: %s |\n",
              w, v["idle_rss_kb"] / mib, v["wait_steady_rss_kb"] / mib, v["wait_peak_rss_kb"] / mib,
              v["wait_threads_max"], v["idle_threads"], v["answer_peak_rss_kb"] / mib, v["after_rss_kb"] / mib,
              v["ok"], v["n"], v["last_answer_ms"] / 1000, wait_ok ? "pass" : "**FAIL**",
              thr_ok ? "pass" : "**FAIL**", ans_ok ? "pass" : "**FAIL**", v["after_s"], aft_ok ? "pass" : "**FAIL**" }' >>"$RESULTS"
        stop_pid "$rp_pid"
        stop_pid "$up_pid"
    done
    {
        echo
        echo "bench/waiters.c opens the $N connections (512 connecting at a time) and sends one GET on"
        echo "each; the test upstream (tests/tools/upstream.c) answers every first attempt 503 and the"
        echo "retry 200, so all requests wait 5 s in backoff and their retries fire within about as"
        echo "long as the first attempts took to arrive. RSS and threads of retryproxy are sampled every"
        echo "50 ms: steady is the last sample before the first answer. Targets from issue 10: waiting"
        echo "<= 64 MiB and <= workers + 4 threads, the burst <= 128 MiB, under 64 MiB again within 10 s."
        echo
    } >>"$RESULTS"
}

# ---------------------------------------------------------------- main
# The sources the binaries were built from, as far as git tells (read before the long run).
REV="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet HEAD -- proxy config policy 2>/dev/null || echo ' with uncommitted changes in proxy/, config/ or policy/')"
ensure_packages
for f in retryproxy tests/upstream bench/floor_mhd bench/floor_suspend bench/floor_proxy bench/waiters; do
    [ -x "$BUILD/$f" ] || fail "$BUILD/$f is missing: run make bench-build (BUILD=${BUILD#$ROOT/})"
done
write_configs
log "bench.sh $MODE: BENCH_DIR=$BENCH_DIR"
case "$MODE" in all | peers | outage)
    start_upstream
    start_peers
    ;;
esac
case "$MODE" in all | peers) start_floors ;; esac
case "$MODE" in all | peers) run_peers ;; esac
case "$MODE" in all | outage) run_outage ;; esac
stop_all
case "$MODE" in all | memory) run_memory ;; esac
case "$MODE" in all | reload) run_reload ;; esac

{
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $NCPU CPUs, Linux $(uname -r)"
    echo "- versions: $(nginx -v 2>&1 | sed 's/^nginx version: //'), $(haproxy -v | head -n 1 | awk '{ print "HAProxy " $3 }'), Caddy $(caddy version | awk '{ print $1 }'), wrk $(wrk -v 2>&1 | head -n 1 | awk '{ print $2 }'), retryproxy $REV"
    settings=()
    case "$MODE" in all | peers) settings+=("DURATION=$DURATION REPS=$REPS CONNS='$CONNS' PATHS='$PATHS' ONLY='$ONLY' BASE_BIN='$BASE_BIN'") ;; esac
    case "$MODE" in all | outage) settings+=("OUTAGE_DURATION=$OUTAGE_DURATION OUTAGE_CONNS=$OUTAGE_CONNS") ;; esac
    case "$MODE" in all | memory) settings+=("N=$N MEM_WORKERS='$MEM_WORKERS' MEM_AFTER=$MEM_AFTER") ;; esac
    case "$MODE" in all | reload) settings+=("RELOAD_N=$RELOAD_N") ;; esac
    echo "- command: \`$COMMAND\` (${settings[*]})"
    echo
} >"$BENCH_DIR/header.md"
cat "$BENCH_DIR/header.md" "$RESULTS" >"$BENCH_DIR/report.md"
echo
cat "$BENCH_DIR/report.md"

if [ "$README" = 1 ]; then
    md=$ROOT/bench/README.md
    grep -q '^<!-- bench:begin -->$' "$md" && grep -q '^<!-- bench:end -->$' "$md" ||
        fail "$md has no <!-- bench:begin --> / <!-- bench:end --> lines"
    awk -v gen="$BENCH_DIR/report.md" '
        $0 == "<!-- bench:begin -->" { print; print "<!-- generated by bench/bench.sh: do not edit by hand -->"; print ""
                                       while ((getline l < gen) > 0) print l; skip = 1; next }
        $0 == "<!-- bench:end -->" { skip = 0 }
        !skip' "$md" >"$md.tmp" && mv "$md.tmp" "$md"
    log "results written into bench/README.md"
fi
log "raw data, configs and logs: $BENCH_DIR"
