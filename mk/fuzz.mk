# Fuzzing with libFuzzer (see docs/fuzzing.md).
#
#   make fuzz [FUZZ_SECONDS=60]    build every tests/fuzz/fuzz_NAME.c and run each for N seconds
#   make fuzz-NAME                 build and run one target (make fuzz-config, fuzz-headers, ...)
#   make fuzz-build                build every target, run none
#
# Every tests/fuzz/fuzz_*.c is a target: adding a file is all it takes. Objects are compiled with
# clang under -fsanitize=fuzzer-no-link,address,undefined into build-fuzz/ (never build/ or
# build-asan/). A target links policy/, config/ and proxy/http/headers.c; one that needs more names
# the sources in its own file, on a line of its own such as
#     /* fuzz-link: proxy/http1/wire.c proxy/telemetry/log.c */
# Each run works on a temporary copy of tests/fuzz/corpus/NAME/ (the tree is never written) and
# uses tests/fuzz/NAME.dict when it exists. A crash, leak, timeout or failed invariant fails
# the run; the input that caused it is kept under build-fuzz/crashes/ and its path printed.

FUZZ_DIR := build-fuzz
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
# Per-input time limit (seconds): a slower input is reported as a timeout.
FUZZ_TIMEOUT ?= 10
# Extra libFuzzer flags for every run (FUZZ_FLAGS='-only_ascii=1', ...).
FUZZ_FLAGS ?=
# Largest input per target (libFuzzer's -max_len); FUZZ_MAX_LEN_NAME=N overrides one target.
FUZZ_MAX_LEN ?= 4096
FUZZ_MAX_LEN_config ?= 8192
FUZZ_MAX_LEN_retry_after ?= 256
FUZZ_MAX_LEN_retry_on ?= 512
FUZZ_MAX_LEN_headers ?= 1024

FUZZ_APT_PKGS := clang libclang-rt-14-dev
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_CFLAGS_ALL = -std=c11 -D_GNU_SOURCE -g -O1 $(WARN) $(FUZZ_SAN) -I. -MMD -MP $(FUZZ_CFLAGS)
FUZZ_LIBS = $(shell pkg-config --libs $(PKGS)) -lm -lpthread

FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_NAMES := $(FUZZ_SRC:tests/fuzz/fuzz_%.c=%)
FUZZ_BIN := $(FUZZ_NAMES:%=$(FUZZ_DIR)/fuzz_%)
FUZZ_BASE_SRC := $(wildcard policy/*.c config/*.c) proxy/http/headers.c
FUZZ_BASE_OBJ := $(FUZZ_BASE_SRC:%.c=$(FUZZ_DIR)/obj/%.o)
# The sources a target's "fuzz-link:" lines name.
fuzz_link_src = $(filter %.c,$(shell sed -n 's|.*fuzz-link:\(.*\)\*/.*|\1|p' $(1) 2>/dev/null))

.PHONY: fuzz fuzz-build fuzz-deps $(FUZZ_NAMES:%=fuzz-%)

# clang and its fuzzer runtime (libclang-rt-14-dev on Debian 12), installed as the Makefile's
# deps-core installs libraries: with apt-get when running as root, else the command is printed.
FUZZ_PROBE = printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n);\nint LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return d && n; }\n' | \
	$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -x c - -o /dev/null >/dev/null 2>&1
fuzz-deps: deps-core
	@if ! command -v $(FUZZ_CC) >/dev/null || ! { $(FUZZ_PROBE); }; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing the fuzzing toolchain: $(FUZZ_APT_PKGS)"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q $(FUZZ_APT_PKGS) >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null && apt-get install -y -q $(FUZZ_APT_PKGS) >/dev/null; } || \
	      { echo "apt-get could not install: $(FUZZ_APT_PKGS)" >&2; exit 1; }; \
	    $(FUZZ_PROBE) || { echo "$(FUZZ_CC) cannot build a libFuzzer target" >&2; exit 1; }; \
	  else \
	    echo "missing the fuzzing toolchain; install it with:" >&2; \
	    echo "  sudo apt-get install -y $(FUZZ_APT_PKGS)" >&2; \
	    exit 1; \
	  fi; \
	fi

$(FUZZ_DIR)/obj/%.o: %.c | fuzz-deps
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS_ALL) -fsanitize=fuzzer-no-link $(PKG_CFLAGS) -c $< -o $@

define FUZZ_TARGET_RULES
$(FUZZ_DIR)/fuzz_$(1): $(FUZZ_DIR)/obj/tests/fuzz/fuzz_$(1).o $(FUZZ_BASE_OBJ) \
		$(patsubst %.c,$(FUZZ_DIR)/obj/%.o,$(filter-out $(FUZZ_BASE_SRC),$(call fuzz_link_src,tests/fuzz/fuzz_$(1).c)))
	$$(FUZZ_CC) -fsanitize=fuzzer $(FUZZ_SAN) -o $$@ $$^ $$(FUZZ_LIBS)

fuzz-$(1): $(FUZZ_DIR)/fuzz_$(1)
	@$$(call fuzz_run,$(1))
endef
$(foreach n,$(FUZZ_NAMES),$(eval $(call FUZZ_TARGET_RULES,$(n))))

fuzz-build: $(FUZZ_BIN)

# One target's run: a temporary copy of its corpus, FUZZ_SECONDS of fuzzing, its output in
# build-fuzz/NAME.log; on failure the path of the input that caused it.
fuzz_run = \
	name=$(1); bin=$(FUZZ_DIR)/fuzz_$$name; log=$(FUZZ_DIR)/$$name.log; \
	mkdir -p $(FUZZ_DIR)/crashes; \
	tmp=$$(mktemp -d "$${TMPDIR:-/tmp}/retryproxy-fuzz-$$name.XXXXXX") || exit 1; \
	if [ -d tests/fuzz/corpus/$$name ]; then cp -R tests/fuzz/corpus/$$name/. $$tmp/; fi; \
	dict=; if [ -f tests/fuzz/$$name.dict ]; then dict=-dict=tests/fuzz/$$name.dict; fi; \
	echo "== fuzz $$name: $(FUZZ_SECONDS) s, max_len $(or $(FUZZ_MAX_LEN_$(1)),$(FUZZ_MAX_LEN)) ($$log)"; \
	$$bin -max_total_time=$(FUZZ_SECONDS) -max_len=$(or $(FUZZ_MAX_LEN_$(1)),$(FUZZ_MAX_LEN)) \
	  -timeout=$(FUZZ_TIMEOUT) -print_final_stats=1 -artifact_prefix=$(FUZZ_DIR)/crashes/$$name- \
	  $$dict $(FUZZ_FLAGS) $$tmp >$$log 2>&1; \
	rc=$$?; rm -rf $$tmp; \
	grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|Done [0-9]+ runs)' $$log | \
	  sed 's/^/   /'; \
	if [ $$rc -ne 0 ]; then \
	  grep -E '^(==[0-9]+==ERROR|SUMMARY|fuzz_[a-z_]*: invariant)' $$log | head -5 | sed 's/^/   /'; \
	  art=$$(sed -n 's/.*Test unit written to \(.*\)/\1/p' $$log | tail -1); \
	  echo "FUZZ FAILED: $$name (exit $$rc), see $$log"; \
	  if [ -n "$$art" ]; then echo "   crashing input: $$art"; \
	    echo "   reproduce: $$bin $$art"; fi; \
	  exit 1; \
	fi

# Every target in turn (one at a time: each uses one core); all run even if one fails.
fuzz: fuzz-build
	@failed=""; \
	for n in $(FUZZ_NAMES); do \
	  $(MAKE) --no-print-directory -s fuzz-$$n || failed="$$failed $$n"; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz FAILED:$$failed"; exit 1; fi; \
	echo "fuzz: $(words $(FUZZ_NAMES)) targets, $(FUZZ_SECONDS) s each, no finding"

-include $(shell find $(FUZZ_DIR)/obj -name '*.d' 2>/dev/null)
