# Benchmarks (see bench/README.md). Not part of make test.
#
#   make bench           everything below, then the tables into bench/README.md ("Latest run")
#   make bench-peers     throughput: nginx, HAProxy, Caddy, retryproxy and the floor programs
#   make bench-memory    10,000 requests waiting in backoff: retryproxy's RSS and threads
#   make bench-outage    an upstream that answers 503 to everything: attempts per request
#   make bench-reload    a config change to the new policy in GET /schedule (ms)
#   make bench-slowread  1,500 and 5,000 slow readers (slowhttptest): a normal request's latency
#                        meanwhile, RSS during and after (bench/slowread.sh; not in make bench)
#   make bench-h2        HTTP/2: gRPC unary calls and h2c GETs (h2load) through retryproxy, nginx,
#                        HAProxy and nghttpx to one h2c upstream (bench/h2peers.sh; in make bench).
#                        CLIENT=h1: an HTTP/1.1 client instead (h2load --h1); UPSTREAM=h2hold:
#                        bench/h2hold as the upstream instead of nghttpd; HOLD=N (h2hold): N
#                        requests per client connection held open at the upstream during each run
#   make bench-share     the failing endpoint's share of first attempts, retryproxy against
#                        HAProxy (leastconn with observe layer7 and error-limit, and plain
#                        leastconn and roundrobin) in the same run (bench/share.sh; in make bench)
#   make bench-h2up      an HTTP/1.1 client through retryproxy to h2c, http, https by h2 (ALPN)
#                        and https by HTTP/1.1 upstreams: CPU per request (bench/h2up.sh)
#   make bench-store     durable accepts per second of the SQLite store (proxy/store/), 64
#                        producers of 1 KiB bodies, group commit against one transaction per
#                        accept in the same run (bench/store_bench.c; not in make bench).
#                        STORE_ARGS="--seconds 10 --reps 3 --dir DIR" (DIR on the disk to measure)
#   make bench-durable   durable accepts per second through retryproxy (wrk, 64 HTTP/1.1 callers
#                        POSTing 1 KiB bodies to a durable route, store on $(BUILD)/'s disk):
#                        202s/s, p50/p99, CPU µs per accept, against store_bench's floor (one
#                        transaction per accept) in the same run, alternated (bench/durable.sh;
#                        in make bench, about 2 minutes). SECS=10 REPS=3 UPSTREAM=down|up
#                        STORE_DIR=DIR WORKERS=1
#   make bench-endpoints the endpoint choice's cost per request with 3 and with 1,000 endpoints
#                        (callgrind instructions, balance_pick's inclusive share: bench/endpoints.sh;
#                        in make bench). COUNTS="3 1000" N1=2000 N2=6000 BALANCE=round_robin
#   make bench-pg        the shared PostgreSQL store (issue 40): durable accepts per second and p99
#                        with two proxies on one private PostgreSQL 15 (fsync on), a backlog of
#                        100,000 due rows drained by the two, and the claim's EXPLAIN
#                        (bench/pg.sh; not in make bench). SECS=10 CONNS=32 BACKLOG=100000
#   make bench-build     build what the runs need, run nothing
#
# Settings come from the environment or the command line (DURATION=1 REPS=1 CONNS=64
# PATHS=ok ONLY=floor N=1000 ...): see the top of bench/bench.sh. The floor programs are
# bench/floor/floor_*.c, built into $(BUILD)/bench/ with the project's flags, as are
# bench/waiters.c and bench/h2hold.c.

FLOOR_SRC := $(wildcard bench/floor/floor_*.c)
FLOOR_BIN := $(FLOOR_SRC:bench/floor/%.c=$(BUILD)/bench/%)
BENCH_TOOLS := $(FLOOR_BIN) $(BUILD)/bench/waiters $(BUILD)/bench/h2hold $(BUILD)/bench/store_bench

.PHONY: bench bench-build bench-pg bench-durable bench-peers bench-memory bench-outage bench-reload bench-slowread bench-h2 bench-h2up bench-store bench-share bench-endpoints

$(FLOOR_BIN): $(BUILD)/bench/%: $(BUILD)/obj/bench/floor/%.o $(BUILD)/obj/bench/floor/floor.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(PKG_LIBS)

$(BUILD)/bench/waiters: $(BUILD)/obj/bench/waiters.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^

$(BUILD)/bench/h2hold: $(BUILD)/obj/bench/h2hold.o
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ -lnghttp2

bench-build: $(BIN) $(BUILD)/tests/upstream $(BENCH_TOOLS)

BENCH_RUN = BUILD=$(BUILD) BENCH_COMMAND='make $@' bench/bench.sh

bench: bench-build
	$(BENCH_RUN) all
	BUILD=$(BUILD) bench/h2peers.sh
	BUILD=$(BUILD) bench/share.sh
	UPB=$(BUILD)/tests/upstream bench/endpoints.sh $(BIN)
	BUILD=$(BUILD) bench/durable.sh
bench-peers: bench-build
	$(BENCH_RUN) peers
bench-memory: bench-build
	$(BENCH_RUN) memory
bench-outage: bench-build
	$(BENCH_RUN) outage
bench-reload: bench-build
	$(BENCH_RUN) reload
bench-slowread: $(BIN) $(BUILD)/tests/upstream
	BUILD=$(BUILD) bench/slowread.sh
bench-h2: $(BIN) $(BUILD)/bench/h2hold
	BUILD=$(BUILD) bench/h2peers.sh
bench-h2up: $(BIN)
	BUILD=$(BUILD) bench/h2up.sh
bench-share: $(BIN) $(BUILD)/tests/upstream
	BUILD=$(BUILD) bench/share.sh
bench-endpoints: $(BIN) $(BUILD)/tests/upstream
	UPB=$(BUILD)/tests/upstream bench/endpoints.sh $(BIN)

# The store and what it calls outside proxy/store/: the key file reader (store.key_file), the
# log (the shared store says when its database goes and comes back).
STORE_BENCH_OBJ := $(filter $(BUILD)/obj/proxy/store/% $(BUILD)/obj/config/keyfile.o \
	$(BUILD)/obj/config/utf8.o $(BUILD)/obj/proxy/telemetry/log.o,$(LIB_OBJ))
$(BUILD)/bench/store_bench: $(BUILD)/obj/bench/store_bench.o $(STORE_BENCH_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(shell pkg-config --libs sqlite3 libpq libcrypto) -lpthread

# The files go under $(BUILD)/ (the worktree's disk) unless STORE_ARGS names a --dir.
STORE_ARGS ?=
bench-store: $(BUILD)/bench/store_bench
	@mkdir -p $(BUILD)/bench-store
	$(BUILD)/bench/store_bench --dir $(BUILD)/bench-store $(STORE_ARGS)
bench-durable: $(BIN) $(BUILD)/tests/upstream $(BUILD)/bench/store_bench
	BUILD=$(BUILD) bench/durable.sh
bench-pg: $(BIN) $(BUILD)/tests/upstream
	BUILD=$(BUILD) bench/pg.sh
