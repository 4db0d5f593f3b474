#!/bin/sh
# reload_latency.sh -- how long a config change takes to show in GET /schedule.
#
#   bench/reload_latency.sh [BINARY]        (default build/retryproxy)
#
# Starts BINARY on a config in a temporary directory (one worker, free ports, an upstream that
# is never contacted), then N times changes route r's fixed, jitter-free base_ms and measures
# the wall time from the change to the first GET /schedule?route=r&retries=1 (polled back to
# back over one kept-alive connection) that shows the new value. Prints the median, p90 and
# maximum in milliseconds.
#
#   N=50          changes to measure
#   MODE=rename   how the change arrives:
#                   rename   an editor's save: the whole file under a temporary name, then
#                            rename(2) over the config
#                   kube     kubelet's ConfigMap update: a new ..TIMESTAMP directory, and a
#                            ..data_tmp symlink to it renamed over ..data
#                   inplace  open(O_TRUNC) + write + close on the config itself
#   GAP_MS=30     pause between changes (the next change starts from a quiet proxy)
#
# Standalone: not part of make test (wall-clock figures are noisy on a 2-core machine). Needs
# python3 (standard library only).
set -eu

BIN=${1:-build/retryproxy}
[ -x "$BIN" ] || { echo "reload_latency.sh: $BIN is not an executable (run make)" >&2; exit 2; }
N=${N:-50} MODE=${MODE:-rename} GAP_MS=${GAP_MS:-30}
export N MODE GAP_MS

dir=$(mktemp -d /tmp/rp-reload-latency-XXXXXX)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT INT TERM

config() { # config BASE_MS: route r, fixed backoff of BASE_MS, no jitter
    printf '{"routes": [{"name": "r", "upstreams": ["http://127.0.0.1:9"],\n'
    printf '  "retry": {"backoff": {"policy": "fixed", "base_ms": %s, "jitter": "none"}}}],\n' "$1"
    printf ' "log": {"level": "warn"}}\n'
}

if [ "$MODE" = kube ]; then
    mkdir "$dir/..v0"
    config 1000 >"$dir/..v0/config.json"
    ln -s ..v0 "$dir/..data"
    ln -s ..data/config.json "$dir/config.json"
else
    config 1000 >"$dir/config.json"
fi

"$BIN" -c "$dir/config.json" --listen 127.0.0.1:0 --admin 127.0.0.1:0 --workers 1 \
    >"$dir/stdout" 2>"$dir/stderr" &
pid=$!
i=0
until grep -q 'admin on 127.0.0.1:' "$dir/stderr" 2>/dev/null; do
    i=$((i + 1))
    if [ $i -gt 100 ] || ! kill -0 "$pid" 2>/dev/null; then
        echo "reload_latency.sh: $BIN did not start:" >&2
        cat "$dir/stderr" >&2
        exit 1
    fi
    sleep 0.1
done
ADMIN_PORT=$(sed -n 's/.*admin on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$dir/stderr" | head -n 1)
export ADMIN_PORT DIR="$dir"

python3 - <<'EOF'
import http.client, json, os, shutil, statistics, sys, time

n, mode, gap = int(os.environ["N"]), os.environ["MODE"], int(os.environ["GAP_MS"]) / 1000
d, port = os.environ["DIR"], int(os.environ["ADMIN_PORT"])
cfg = os.path.join(d, "config.json")
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)

def text(base):
    return ('{"routes": [{"name": "r", "upstreams": ["http://127.0.0.1:9"],\n'
            '  "retry": {"backoff": {"policy": "fixed", "base_ms": %d, "jitter": "none"}}}],\n'
            ' "log": {"level": "warn"}}\n' % base)

def delay():
    conn.request("GET", "/schedule?route=r&retries=1&seed=1")
    r = conn.getresponse()
    body = r.read()
    if r.status != 200:
        sys.exit("GET /schedule: %d %r" % (r.status, body))
    return json.loads(body)["delays_ms"][0]

def write(path, data):
    with open(path, "w") as f:
        f.write(data)

cur = "..v0"
def change(i, base):
    """Prepares the change, then makes it visible; returns perf_counter() at that moment."""
    global cur
    if mode == "rename":
        write(cfg + ".tmp", text(base))
        t0 = time.perf_counter()
        os.rename(cfg + ".tmp", cfg)
    elif mode == "kube":
        nxt = "..v%d" % i
        os.mkdir(os.path.join(d, nxt))
        write(os.path.join(d, nxt, "config.json"), text(base))
        os.symlink(nxt, os.path.join(d, "..data_tmp"))
        t0 = time.perf_counter()
        os.rename(os.path.join(d, "..data_tmp"), os.path.join(d, "..data"))
        shutil.rmtree(os.path.join(d, cur))
        cur = nxt
    elif mode == "inplace":
        data = text(base)
        t0 = time.perf_counter()
        with open(cfg, "w") as f:
            f.write(data)
    else:
        sys.exit("MODE must be rename, kube or inplace")
    return t0

if delay() != 1000:
    sys.exit("the initial config is not being served")
lat = []
for i in range(1, n + 1):
    base = 1000 + i
    t0 = change(i, base)
    while delay() != base:
        if time.perf_counter() - t0 > 10:
            sys.exit("change %d not visible after 10 s" % i)
    lat.append((time.perf_counter() - t0) * 1000)
    time.sleep(gap)

lat.sort()
print("%s x%d: change -> new value in GET /schedule: median %.2f ms, p90 %.2f ms, max %.2f ms"
      % (mode, n, statistics.median(lat), lat[int(0.9 * (n - 1))], lat[-1]))
EOF
