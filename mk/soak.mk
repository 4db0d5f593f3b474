# Soak test: mixed load against the real binary for SOAK_SECONDS (see docs/testing.md and the
# top of tests/tools/soak.c). Not part of make test.
#
#   make soak [SOAK_SECONDS=600] [SOAK_WORKERS=2] [SOAK_CONCURRENCY=64] [SOAK_RATE=0]
#
# Builds the proxy and the load generator (tests/tools/soak.c, through the tools rule) into
# build-soak/, then runs the generator: its own upstream on 127.0.0.1 (10 % answered 503 and
# retried, 1 % reset, 2 % answered too late for the client, 2 % of clients gone during a backoff
# wait), a config rewrite (rename) every SOAK_RELOAD seconds, a sample of the proxy's RSS and
# descriptors every SOAK_INTERVAL seconds. Fails if RSS grows more than 10 % after the warm-up
# (min(60 s, SOAK_SECONDS / 5)), if the descriptors do not come back to their idle count after
# the load (the proxy's cached upstream connections apart, up to the caches' bound), if more
# than 0.1 % of requests end unexpectedly, or if the proxy does not exit 0.
# SOAK_BIN runs another build of the proxy (e.g. build-tsan/retryproxy after make tsan-build,
# with SOAK_FLAGS=--no-rss-check).

SOAK_DIR := build-soak
SOAK_SECONDS ?= 600
SOAK_WORKERS ?= 2
SOAK_CONCURRENCY ?= 64
SOAK_INTERVAL ?= 10
SOAK_RELOAD ?= 10
# Requests per second at most (0: as fast as the proxy answers).
SOAK_RATE ?= 0
SOAK_BIN ?= $(SOAK_DIR)/retryproxy
SOAK_FLAGS ?=

.PHONY: soak soak-build soak-bins

soak-build:
	@$(MAKE) --no-print-directory BUILD=$(SOAK_DIR) SAN= soak-bins
# Run by the sub-make above, with BUILD set.
soak-bins: $(BIN) $(BUILD)/tests/soak
	@:

soak: soak-build
	$(SOAK_DIR)/tests/soak --bin $(SOAK_BIN) --seconds $(SOAK_SECONDS) --workers $(SOAK_WORKERS) \
	  --concurrency $(SOAK_CONCURRENCY) --interval $(SOAK_INTERVAL) --reload $(SOAK_RELOAD) \
	  --rate $(SOAK_RATE) $(SOAK_FLAGS)
