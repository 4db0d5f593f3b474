# bench/h2lib.sh -- what bench/h2up.sh and bench/h2peers.sh share (sourced, not run): the
# programs they run, installed when missing; a scratch directory DIR removed at exit with every
# process in PIDS stopped; ports the kernel picks, and waiting for a port to open. The caller
# sets DIR first.
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }

# need COMMAND:PACKAGE ...: installs (as root, with apt-get, as bench/bench.sh does) the Debian
# packages of the commands missing, and keeps the system services some of them start stopped:
# only private instances are used. Not root: says what to install, and stops.
need() {
    local want=() cp
    for cp in "$@"; do command -v "${cp%%:*}" >/dev/null || want+=("${cp#*:}"); done
    [ "${#want[@]}" = 0 ] && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "missing: ${want[*]} (as root: apt-get install -y ${want[*]})" >&2
        exit 1
    fi
    echo "installing ${want[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${want[@]}" >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${want[@]}" >/dev/null 2>&1; } ||
        { echo "apt-get install ${want[*]} failed" >&2; exit 1; }
    for cp in nginx haproxy nghttpx; do
        systemctl disable --now "$cp" >/dev/null 2>&1 || service "$cp" stop >/dev/null 2>&1 || true
    done
}

# test_upstream FILE: starts $UPB (the project's test upstream, $(BUILD)/tests/upstream) on a
# port the kernel picks, its output in FILE, where it says the port; sets UP_PID (in PIDS too)
# and UP_PORT. Not in a $(...): those two would stay in the subshell.
test_upstream() {
    "$UPB" --port 0 > "$1" 2>&1 & UP_PID=$!
    PIDS+=("$UP_PID")
    for _ in $(seq 50); do
        UP_PORT=$(grep -o ':[0-9]\+' "$1" | head -1 | tr -d :) && [ -n "$UP_PORT" ] && return 0
        sleep 0.1
    done
    echo "the test upstream never said its port ($1)" >&2
    exit 1
}
