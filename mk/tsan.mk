# ThreadSanitizer over the integration suites (see docs/testing.md).
#
#   make tsan [TSAN_SUITES='retry reload'] [TSAN_WORKERS=2]
#   make tsan-soak [TSAN_SOAK_SECONDS=60]   the soak load (mk/soak.mk) against the TSan binary
#
# Only the retryproxy binary is built with -fsanitize=thread (build-tsan/retryproxy): Criterion
# does not run under TSan, but the integration suites spawn the real binary (RETRYPROXY_BIN), so
# they are built without a sanitizer (build-tsan/plain/) and run against the TSan binary, every
# proxy with TSAN_WORKERS worker threads (RETRYPROXY_TEST_WORKERS, read by the harness).
#
# TSan writes each report to build-tsan/reports/tsan.PID rather than stderr (log_path), keeps
# running (halt_on_error=0) and exits 66 at the end: the harness fails the test whose proxy wrote
# a report, and this target fails after the suites listing every report file and its SUMMARY
# lines, even when a test did not notice (a proxy started outside the harness). Suppressions:
# tests/tsan.supp, each entry with the reason it is not ours.

TSAN_DIR := build-tsan
TSAN_WORKERS ?= 2
# One suite at a time, one test at a time: TSan makes the proxy several times slower.
TSAN_JOBS ?= 1
TSAN_SUITES ?= $(patsubst tests/integration/test_%.c,%,$(sort $(wildcard tests/integration/test_*.c)))
TSAN_SAN := -fsanitize=thread -fno-omit-frame-pointer
TSAN_REPORTS := $(TSAN_DIR)/reports
TSAN_SUPP := tests/tsan.supp
# atexit_sleep_ms: TSan's default sleeps 1 s in _exit(), longer than "a second signal exits at
# once" (integration/shutdown) allows; 100 ms still lets late threads run into the exit path.
TSAN_RUN_OPTIONS = halt_on_error=0 exitcode=66 second_deadlock_stack=1 atexit_sleep_ms=100 \
	log_path=$(abspath $(TSAN_REPORTS))/tsan suppressions=$(abspath $(TSAN_SUPP))
# Tests left out (Criterion names, suite/test): thousand_requests... bounds the proxy's RSS with
# 1000 requests waiting, which TSan's shadow memory alone exceeds (228 MiB against 200 MiB); the
# h2_flow ones bound the RSS of 100 unread streams a connection, which TSan's shadow memory
# makes four times larger (52 MiB a connection against 14; the zero-window attack's 21 MiB
# against 4).
TSAN_SKIP ?= scale/thousand_requests_waiting_in_backoff_cost_no_threads \
	h2_flow/a_zero_window_attack_holds_a_bounded_memory_and_gives_back_its_descriptors \
	h2_flow/unread_streams_hold_a_bounded_memory_with_closed_windows \
	h2_flow/unread_streams_hold_a_bounded_memory_with_an_unread_socket \
	h2_flow/unread_streams_from_an_h2c_upstream_hold_a_bounded_memory
TSAN_FILTER = $(if $(strip $(TSAN_SKIP)),--filter '!($(subst $(tsan_space),|,$(strip $(TSAN_SKIP))))')
tsan_space := $(subst ,, )

.PHONY: tsan tsan-build tsan-soak tsan-bin tsan-plain

tsan-build:
	@$(MAKE) --no-print-directory BUILD=$(TSAN_DIR) OPT=-O1 SAN="$(TSAN_SAN)" tsan-bin
	@$(MAKE) --no-print-directory BUILD=$(TSAN_DIR)/plain SAN= tsan-plain
# Run by the two sub-makes above, with BUILD set.
tsan-bin: $(BIN)
	@:
tsan-plain: $(TSAN_SUITES:%=$(BUILD)/tests/integration/test_%) $(TOOL_BIN)
	@:

# The TSan runtime refuses some kernels' address-space layouts at start ("unexpected memory
# mapping", vm.mmap_rnd_bits above 28): say so once instead of failing every test.
TSAN_PROBE = $(TSAN_DIR)/retryproxy --help >/dev/null 2>$(TSAN_DIR)/probe.err || { \
	  cat $(TSAN_DIR)/probe.err >&2; \
	  echo "tsan: the ThreadSanitizer build does not start here; if the message above is about" \
	    "memory mappings: sysctl vm.mmap_rnd_bits=28, or run make under setarch -R" >&2; \
	  exit 1; }

# Every suite runs even when an earlier one fails; then every report file is listed.
tsan: tsan-build
	@$(TSAN_PROBE)
	@rm -rf $(TSAN_REPORTS) && mkdir -p $(TSAN_REPORTS); \
	failed=""; \
	for s in $(TSAN_SUITES); do \
	  echo "== tsan: integration/$$s ($(TSAN_WORKERS) workers)"; \
	  TSAN_OPTIONS="$(TSAN_RUN_OPTIONS)" RETRYPROXY_TEST_WORKERS=$(TSAN_WORKERS) \
	    RETRYPROXY_BIN=$(abspath $(TSAN_DIR)/retryproxy) \
	    RETRYPROXY_TOOLS=$(abspath $(TSAN_DIR)/plain/tests) \
	    $(TSAN_DIR)/plain/tests/integration/test_$$s --jobs $(TSAN_JOBS) --short-filename \
	    $(TSAN_FILTER) || \
	    failed="$$failed $$s"; \
	done; \
	reports=$$(find $(TSAN_REPORTS) -type f -name 'tsan.*' | sort); \
	if [ -n "$$reports" ]; then \
	  echo "tsan: ThreadSanitizer reports:"; \
	  for f in $$reports; do \
	    echo "  $$f"; grep -h '^SUMMARY: ThreadSanitizer' $$f | sort -u | sed 's/^/    /'; \
	  done; \
	fi; \
	if [ -n "$$failed" ]; then echo "tsan FAILED suites:$$failed"; fi; \
	if [ -n "$$reports" ] || [ -n "$$failed" ]; then exit 1; fi; \
	echo "tsan: $(words $(TSAN_SUITES)) integration suites, $(TSAN_WORKERS) workers, no report"

# The integration suites send few requests at once; the soak load generator (tests/tools/soak.c)
# sends 64 at a time with reloads and scrapes alongside. RSS is not judged (TSan's own memory).
TSAN_SOAK_SECONDS ?= 60
tsan-soak: tsan-build
	@$(TSAN_PROBE)
	@rm -rf $(TSAN_REPORTS) && mkdir -p $(TSAN_REPORTS); \
	TSAN_OPTIONS="$(TSAN_RUN_OPTIONS)" $(TSAN_DIR)/plain/tests/soak \
	  --bin $(TSAN_DIR)/retryproxy --seconds $(TSAN_SOAK_SECONDS) --workers $(TSAN_WORKERS) \
	  --no-rss-check; rc=$$?; \
	reports=$$(find $(TSAN_REPORTS) -type f -name 'tsan.*' | sort); \
	for f in $$reports; do \
	  echo "tsan-soak: report $$f"; grep -h '^SUMMARY: ThreadSanitizer' $$f | sort -u | sed 's/^/    /'; \
	done; \
	if [ -n "$$reports" ] || [ $$rc -ne 0 ]; then echo "tsan-soak FAILED"; exit 1; fi; \
	echo "tsan-soak: $(TSAN_SOAK_SECONDS) s of soak load, no report"
