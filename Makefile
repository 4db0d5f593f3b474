# retryproxy -- GNU make build.
#
#   make              build/retryproxy
#   make test         build everything and run every test
#   make asan         the same under AddressSanitizer + UndefinedBehaviorSanitizer (in build-asan/)
#   make run          build and start the proxy on the bundled example config
#   make format       rewrite sources in .clang-format style; make format-check only checks
#   make check-history every commit since BASE (main) builds and has no conflict marker
#
# Dependencies come from Debian's packages. When pkg-config cannot find them, the build installs
# them with apt-get if it runs as root, and otherwise prints the one command to run. Building and
# running the proxy (make, make run, make demo-upstream) needs the build libraries only
# (deps-core); the tests' libraries and tools (deps-test) come with make test and check-tests.

CC ?= cc
BUILD ?= build
WERROR ?= 0
SAN ?=
TEST_JOBS ?= 2

PKGS := libmicrohttpd libcurl jansson libnghttp2 libssl libcrypto libcares sqlite3 libpq
APT_PKGS := libmicrohttpd-dev libcurl4-openssl-dev libjansson-dev libnghttp2-dev libssl-dev libc-ares-dev \
            libsqlite3-dev libpq-dev
# The compiler and pkg-config themselves: a minimal Debian 12 (a container image, a netinst
# without build tools) has neither. make it cannot install: README.md's first line does.
TOOL_APT_PKGS := gcc libc6-dev pkg-config
# The suites' own: Criterion, libyaml (tests/support/deploytest.c), the openssl command (test
# certificates), PostgreSQL 15's server (the shared store's suites start one of their own:
# tests/support/pgserver.h).
TEST_PKGS := criterion yaml-0.1
TEST_APT_PKGS := libcriterion-dev libyaml-dev openssl postgresql

WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 -Wvla \
        -Wimplicit-fallthrough
ifeq ($(WERROR),1)
WARN += -Werror
endif

OPT ?= -O2
CFLAGS_ALL = -std=c11 -D_GNU_SOURCE -g $(OPT) $(WARN) $(SAN) -I. -MMD -MP $(CFLAGS)
LDFLAGS_ALL = $(SAN) $(LDFLAGS)
# Recursive (=) so pkg-config runs only after the deps check has installed what was missing.
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS))
PKG_LIBS = $(shell pkg-config --libs $(PKGS)) -lm -lpthread
TEST_LIBS = $(shell pkg-config --libs $(TEST_PKGS))

POLICY_SRC := $(wildcard policy/*.c)
CONFIG_SRC := $(wildcard config/*.c)
# main.c and recv_hook.c (recv() for the binary only, see proxy/http1/wiretab.h) are not linked
# into test programs.
PROXY_SRC := $(filter-out proxy/main.c proxy/http1/recv_hook.c,$(wildcard proxy/*.c proxy/*/*.c))
LIB_SRC := $(POLICY_SRC) $(CONFIG_SRC) $(PROXY_SRC)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)

SUPPORT_SRC := $(wildcard tests/support/*.c)
SUPPORT_OBJ := $(SUPPORT_SRC:%.c=$(BUILD)/obj/%.o)
# Test programs that are not Criterion suites (test upstream and the like): tests/tools/NAME.c.
TOOL_SRC := $(wildcard tests/tools/*.c)
TOOL_BIN := $(TOOL_SRC:tests/tools/%.c=$(BUILD)/tests/%)
# Criterion suites: one binary per tests/{unit,cli,integration}/test_*.c.
TEST_SRC := $(wildcard tests/unit/test_*.c tests/cli/test_*.c tests/integration/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

BIN := $(BUILD)/retryproxy

# Objects built through pattern rules are not intermediate files: keep them between runs.
.SECONDARY:

.PHONY: all deps test check-tests asan run demo-upstream docs format format-check check-markers \
        check-history clean
all: $(BIN)

# Installs what is missing of 'pkgs' (apt names) when 'cond' (a shell test) says so.
# $(call apt_deps,COND,PKGS,WHAT)
apt_deps = if $(1); then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing $(3): $(2)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q $(2) >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null && apt-get install -y -q $(2) >/dev/null; } || \
	      { echo "apt-get could not install: $(2)" >&2; exit 1; }; \
	  else \
	    echo "missing $(3); install them with:" >&2; \
	    echo "  sudo apt-get install -y $(2)" >&2; \
	    exit 1; \
	  fi; \
	fi

deps: deps-core deps-test

CORE_MISSING = ! command -v $(CC) >/dev/null 2>&1 || ! command -v pkg-config >/dev/null 2>&1 || \
	! pkg-config --exists $(PKGS) 2>/dev/null
deps-core:
	@$(call apt_deps,$(CORE_MISSING),$(TOOL_APT_PKGS) $(APT_PKGS),build dependencies)

# After deps-core: two apt-get installs at once (make -j) fail on dpkg's lock.
deps-test: deps-core promtool h2tools dnstools
TEST_MISSING = ! pkg-config --exists $(TEST_PKGS) 2>/dev/null || ! command -v openssl >/dev/null || \
	! test -x /usr/lib/postgresql/15/bin/initdb
deps-test-libs: deps-core
	@$(call apt_deps,$(TEST_MISSING),$(TEST_APT_PKGS),test dependencies)

# promtool (Debian's prometheus package) checks the /metrics output and the shipped alerting
# rules in the tests. Installed as root; where it cannot be (not root, no apt-get), those checks
# say they were skipped (tests/cli/test_monitoring fails instead when it could have been).
PROM_INSTALL = DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	prometheus >/dev/null 2>&1
.PHONY: deps-core deps-test deps-test-libs promtool h2tools dnstools
# The HTTP/2 and gRPC tests drive the proxy with curl, nghttp and h2load (nghttp2-client), raw
# frames from python3-h2 (tests/tools/h2peer.py, the scripted upstream tests/tools/h2_upstream.py)
# a real gRPC client and server from python3-grpcio (tests/tools/grpc_peer.py), and a real
# WebSocket client and server from python3-websockets (tests/tools/ws_peer.py, the upgrade
# tests), all run by Debian's /usr/bin/python3. Installed as root; elsewhere the command to run
# is printed and those suites fail saying what is missing.
H2_APT_PKGS := curl nghttp2-client python3-h2 python3-grpcio python3-websockets
H2_INSTALL = DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	$(H2_APT_PKGS) >/dev/null 2>&1
h2tools: deps-test-libs
	@{ command -v h2load >/dev/null && command -v curl >/dev/null && \
	   /usr/bin/python3 -c 'import h2, grpc, websockets' 2>/dev/null; } || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  echo "installing the HTTP/2, gRPC and WebSocket test tools: $(H2_APT_PKGS)" && \
	  { $(H2_INSTALL) || { apt-get update -q >/dev/null 2>&1 && $(H2_INSTALL); }; }; } || \
	  echo "HTTP/2 test tools missing; install them with: sudo apt-get install -y $(H2_APT_PKGS)"

# The resolver's tests (tests/unit/test_dns.c) ask a real DNS server: Debian's dnsmasq
# (dnsmasq-base: the program without the system service), started by the tests themselves.
# After promtool, for dpkg's lock.
DNS_APT_PKGS := dnsmasq-base
DNS_INSTALL = DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	$(DNS_APT_PKGS) >/dev/null 2>&1
dnstools: promtool
	@test -x /usr/sbin/dnsmasq || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  echo "installing the DNS server of the resolver tests: $(DNS_APT_PKGS)" && \
	  { $(DNS_INSTALL) || { apt-get update -q >/dev/null 2>&1 && $(DNS_INSTALL); }; }; } || \
	  echo "dnsmasq missing; install it with: sudo apt-get install -y $(DNS_APT_PKGS)"

# After h2tools, for dpkg's lock.
promtool: h2tools
	@command -v promtool >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  echo "installing promtool (prometheus) for the metrics and alerting rules tests" && \
	  { $(PROM_INSTALL) || { apt-get update -q >/dev/null 2>&1 && $(PROM_INSTALL); }; }; } || \
	  echo "promtool unavailable: the metrics and rules checks will be skipped (as root they fail)"

$(BUILD)/obj/%.o: %.c | deps-core
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(PKG_CFLAGS) -c $< -o $@

# The suites' support code but what the tools link (the test upstream, tup.c and its parts
# tup_*.c, and proc.c) needs Criterion and libyaml: built after the test dependencies.
TOOL_SUPPORT_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tests/support/tup.c tests/support/tup_*.c)) \
                    $(BUILD)/obj/tests/support/proc.o
$(filter-out $(TOOL_SUPPORT_OBJ),$(SUPPORT_OBJ)): $(BUILD)/obj/%.o: %.c | deps-test
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(PKG_CFLAGS) -c $< -o $@

$(BIN): $(BUILD)/obj/proxy/main.o $(BUILD)/obj/proxy/http1/recv_hook.o $(LIB_OBJ)
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(PKG_LIBS)

# The suites link the library and the support code as one archive: the linker takes only the
# objects a suite uses, which halves each link (0.3 s to 0.13 s, binaries of 0.6 MB, not 3 MB)
# and keeps make check-tests as fast with a hundred suites and more.
TEST_ARCHIVE := $(BUILD)/obj/libtests.a
$(TEST_ARCHIVE): $(LIB_OBJ) $(SUPPORT_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

$(BUILD)/tests/%: tests/%.c $(TEST_ARCHIVE) | deps-test
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(PKG_CFLAGS) -o $@ $< $(TEST_ARCHIVE) $(LDFLAGS_ALL) $(PKG_LIBS) $(TEST_LIBS)

# Two unit suites link less than the whole library, on purpose:
# - test_retry_decide: the decision (proxy/core/decide.c) with neither libmicrohttpd nor libcurl
#   linked, which shows that it needs neither;
# - test_retry_timers*: the request state machine with the upstream attempt replaced by the
#   fakes of proxy/upstream/attempt.h in tests/support/faked/ (the dispatcher and its three
#   transports left out) and a front end of their own as the client side. Every
#   tests/unit/test_retry_timers*.c is such a suite; the fakes are kept out of SUPPORT_OBJ, which
#   every other suite links beside the real attempt.o.
DECIDE_OBJ := $(filter $(BUILD)/obj/policy/% $(BUILD)/obj/config/%,$(LIB_OBJ)) \
              $(addprefix $(BUILD)/obj/proxy/,core/decide.o http/hlist.o http/headers.o core/live.o base/strmap.o)
$(BUILD)/tests/unit/test_retry_decide: tests/unit/test_retry_decide.c $(DECIDE_OBJ) | deps-test
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(shell pkg-config --cflags jansson) -o $@ $< $(DECIDE_OBJ) \
	  $(LDFLAGS_ALL) $(shell pkg-config --libs jansson) -lm -lpthread $(TEST_LIBS)

FAKED_OBJ := $(filter-out $(addprefix $(BUILD)/obj/proxy/,upstream/attempt.o upstream/h1up.o upstream/h2up_attempt.o upstream/tunnel_up_attempt.o),$(LIB_OBJ))
FAKES_OBJ := $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tests/support/faked/*.c)) \
             $(BUILD)/obj/tests/support/promtext.o
$(filter $(BUILD)/obj/tests/support/faked/%,$(FAKES_OBJ)): $(BUILD)/obj/%.o: %.c | deps-test
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(PKG_CFLAGS) -c $< -o $@
$(filter $(BUILD)/tests/unit/test_retry_timers%,$(TEST_BIN)): $(BUILD)/tests/%: tests/%.c \
                                              $(FAKED_OBJ) $(FAKES_OBJ) | deps-test
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(PKG_CFLAGS) -o $@ $< $(FAKED_OBJ) $(FAKES_OBJ) \
	  $(LDFLAGS_ALL) $(PKG_LIBS) $(TEST_LIBS)

# Tools are standalone programs: the test upstream and process helpers only, no Criterion (whose
# sandbox would take over a tool started from inside a test). A tool's parts beside its main
# file, tests/tools/NAME/*.c, are linked into build/tests/NAME only.
tool_parts = $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tests/tools/$(1)/*.c))
$(foreach t,$(TOOL_SRC:tests/tools/%.c=%),$(eval $(BUILD)/tests/$(t): $(call tool_parts,$(t))))
$(TOOL_BIN): $(BUILD)/tests/%: tests/tools/%.c $(LIB_OBJ) $(TOOL_SUPPORT_OBJ) | deps-core
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(PKG_CFLAGS) -o $@ $< $(call tool_parts,$*) $(LIB_OBJ) $(TOOL_SUPPORT_OBJ) \
	  $(LDFLAGS_ALL) $(PKG_LIBS)

check-tests: $(BIN) $(TEST_BIN) $(TOOL_BIN)

# Every suite runs even when an earlier one fails; the target fails if any did. Each suite's
# output is kept in $(BUILD)/test-logs/, and the failures of every failed suite (Criterion's
# assertion and [FAIL] lines, a sanitizer's report) are printed again at the end, where a CI
# log that keeps only its tail still shows them.
# RETRYPROXY_BIN and RETRYPROXY_TOOLS tell the CLI and integration tests what to run.
TEST_LOGS = $(BUILD)/test-logs
test: check-tests
	@failed=""; mkdir -p $(TEST_LOGS); \
	for t in $(TEST_BIN); do \
	  echo "== $$t"; log=$(TEST_LOGS)/$$(echo $$t | tr / _).log; \
	  RETRYPROXY_BIN=$(abspath $(BIN)) RETRYPROXY_TOOLS=$(abspath $(BUILD)/tests) \
	    $$t --jobs $(TEST_JOBS) --short-filename >$$log 2>&1; rc=$$?; cat $$log; \
	  [ $$rc = 0 ] || failed="$$failed $$t"; \
	done; \
	for t in $$failed; do \
	  log=$(TEST_LOGS)/$$(echo $$t | tr / _).log; echo "== what failed in $$t (all of it: $$log)"; \
	  grep -E '^\[(FAIL|----\] +[^ ])|Sanitizer|runtime error|SUMMARY|Timed out|CRASH|signal' \
	    $$log | head -n 60; \
	done; \
	if [ -n "$$failed" ]; then echo "FAILED:$$failed"; exit 1; fi; \
	echo "all test suites passed"

asan:
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  $(MAKE) --no-print-directory BUILD=build-asan OPT=-O1 \
	  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" test

EXAMPLE_CONFIG := deploy/config.json
run: $(BIN)
	$(BIN) -c $(EXAMPLE_CONFIG)

# Test upstreams for trying `make run` by hand, one for each upstream of $(EXAMPLE_CONFIG): on
# 127.0.0.1:9001 one that fails the first two attempts of every request (per X-Request-Id) with
# 503, then answers 200; on 127.0.0.1:9002 one that answers 200 at once (its "listening" line
# is not shown). The first runs in the background and stops with the second (Ctrl-C). Both log
# one line per request to the terminal, starting with their address (README.md).
DEMO_PLAN ?= fail=2;status=503
demo-upstream: $(BUILD)/tests/upstream
	@$(BUILD)/tests/upstream --port 9001 --plan '$(DEMO_PLAN)' & pid=$$!; \
	  trap 'kill $$pid 2>/dev/null' EXIT INT TERM; \
	  $(BUILD)/tests/upstream --port 9002 >/dev/null

# docs/config.md and docs/metrics.md: each page's text up to its marker line, then the reference
# generated from the table it documents, the schema table or the metrics table (CLI tests fail
# when a page and the binary drift apart). $(call gen_doc,PAGE,ARGS) runs `reference ARGS`.
DOC_MARKER := ^<!-- generated by retryproxy reference
gen_doc = grep -q '$(DOC_MARKER)' $(1) || { echo "$(1): no marker line" >&2; exit 1; }; \
	sed -n '1,/$(DOC_MARKER)/p' $(1) > $(1).tmp && \
	$(BIN) reference $(2) >> $(1).tmp && mv $(1).tmp $(1) && echo "$(1) regenerated"
docs: $(BIN)
	@$(call gen_doc,docs/config.md,)
	@$(call gen_doc,docs/metrics.md,--metrics)

FORMAT_SRC = $(shell git ls-files '*.c' '*.h' 2>/dev/null || find policy config proxy tests -name '*.[ch]')
format:
	clang-format -i $(FORMAT_SRC)

format-check: check-markers
	@if ! command -v clang-format >/dev/null; then \
	  echo "format-check: clang-format is not installed (apt-get install -y clang-format)" >&2; \
	  exit 1; fi
	@clang-format --dry-run --Werror $(FORMAT_SRC) && echo "format-check: ok"

# A tracked file holding a merge conflict's markers fails (.ci/conflict-markers; CI runs it).
check-markers:
	@.ci/conflict-markers && echo "check-markers: ok"

# Every commit on HEAD's first-parent line since BASE holds no conflict marker and builds
# (.ci/check-history; README.md, "Development"): before a branch or a merge goes to main.
BASE ?= main
check-history:
	@.ci/check-history $(BASE)

clean:
	rm -rf build build-asan build-*

# Hardening targets, one file each: make fuzz, make tsan, make soak (see the files).
-include $(sort $(wildcard mk/*.mk))

-include $(shell find $(BUILD)/obj $(BUILD)/tests -name '*.d' 2>/dev/null)
