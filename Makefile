# idem - build, test, bench, demo, install.
#
# `make` builds build/libidem.a, build/libidem.so and build/idem.
# `make test` and `make demo` first install missing Debian packages
# (scripts/deps.sh, apt-get when run as root), so a fresh machine needs
# nothing else. `make asan` runs the whole suite under ASan+UBSan.

PREFIX ?= /usr/local
CC ?= cc
BUILD ?= build
OPT ?= -O2
SAN ?=
WARN = -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
       -Wmissing-prototypes -Wformat=2 -Wundef -Wvla -Wpointer-arith \
       -Wcast-align -Wwrite-strings -Wimplicit-fallthrough \
       -Wno-unused-parameter
# Hidden by default: libidem.so exports what the headers mark IDEM_EXPORT
# and nothing else (scripts/check-exports.sh). Tests and bench programs,
# which call idem__ internals, link the static library, and so does the
# CLI, which is compiled without -Isrc: it sees the public headers only
# (the layering rule of docs/architecture.md).
INC = -Iinclude -Isrc
CFLAGS_ALL = -std=c17 -D_GNU_SOURCE -g $(OPT) $(SAN) $(WARN) -fPIC \
             -fvisibility=hidden $(INC) $(CFLAGS)
LIBS = -lhiredis -lxxhash -lcrypto -lpthread
# The CLI's NATS connector (tools/idem/connect/n*.c) and its tests and
# bench link libnats; libidem does not.
NATS_LIBS = $(shell pkg-config --libs libnats 2>/dev/null || echo -lnats)

# One folder per layer (docs/architecture.md): the core at the top of
# src/, then each subsystem in its own folder.
CORE_SRC := $(sort $(wildcard src/*.c))
LOCAL_SRC := $(sort $(wildcard src/local/*.c))
REDIS_SRC := $(sort $(wildcard src/redis/*.c))
KEYS_SRC := $(sort $(wildcard src/keys/*.c))
LIB_SRC := $(CORE_SRC) $(LOCAL_SRC) $(REDIS_SRC) $(KEYS_SRC)
CLI_SRC := $(sort $(wildcard tools/idem/*.c tools/idem/connect/*.c))
TEST_SRC := $(sort $(wildcard tests/*.c))
PROG_SRC := $(sort $(wildcard tests/progs/*.c))
BENCH_SRC := $(sort $(wildcard bench/*.c))
EXAMPLE_SRC := $(sort $(wildcard examples/*.c))

LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)
PROGS := $(PROG_SRC:tests/progs/%.c=$(BUILD)/progs/%)
# Preloaded into idem by the power-cut tests (tests/shim/synclog.c).
PROGS += $(BUILD)/progs/synclog.so
BENCHES := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
EXAMPLES := $(EXAMPLE_SRC:examples/%.c=$(BUILD)/examples/%)

# Tests see every write, fdatasync, mmap, unlink and allocation the
# library makes, to fail the Nth one on purpose (tests/fault.c).
WRAP = -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=write \
       -Wl,--wrap=aligned_alloc,--wrap=mmap,--wrap=unlinkat \
       -Wl,--wrap=pwrite,--wrap=fdatasync,--wrap=ftruncate

.PHONY: all test asan bench demo install clean deps check-style

all: $(BUILD)/libidem.a $(BUILD)/libidem.so $(BUILD)/idem $(EXAMPLES)

$(CLI_OBJ): INC = -Iinclude -Itools/idem -Itools/idem/connect

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	@$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(BUILD)/libidem.a: $(LIB_OBJ)
	@rm -f $@
	@ar rcs $@ $^

$(BUILD)/libidem.so: $(LIB_OBJ)
	$(CC) $(SAN) -shared -Wl,-soname,libidem.so.0 -o $@ $^ $(LIBS)

$(BUILD)/idem: $(CLI_OBJ) $(BUILD)/libidem.a
	$(CC) $(SAN) -o $@ $(CLI_OBJ) $(BUILD)/libidem.a $(LIBS) -lyajl \
	    -lmicrohttpd $(NATS_LIBS) -lrdkafka

$(BUILD)/idem-tests: $(TEST_OBJ) $(BUILD)/libidem.a
	$(CC) $(SAN) $(WRAP) -o $@ $(TEST_OBJ) $(BUILD)/libidem.a $(LIBS) \
	    -lcriterion -lyajl $(NATS_LIBS) -lrdkafka

# The mock Kafka cluster the Kafka tests and bench run on (librdkafka's).
$(BUILD)/progs/kafka_mock: LIBS += -lrdkafka
$(BUILD)/bench/kafka_alo: LIBS += -lrdkafka

$(BUILD)/progs/synclog.so: tests/shim/synclog.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -shared -o $@ $< -ldl

$(BUILD)/progs/%: tests/progs/%.c $(BUILD)/libidem.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(BUILD)/libidem.a $(LIBS)

# The examples see only the public headers, as a program outside would.
$(BUILD)/examples/%: examples/%.c $(BUILD)/libidem.a
	@mkdir -p $(dir $@)
	$(CC) -std=c17 -g $(OPT) $(SAN) $(WARN) -Iinclude $(CFLAGS) -o $@ $< \
	    $(BUILD)/libidem.a $(LIBS)

$(BUILD)/bench/%: bench/%.c $(BUILD)/libidem.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(BUILD)/libidem.a $(LIBS) -llmdb \
	    -luuid $(NATS_LIBS)

deps:
	@sh scripts/deps.sh

test: deps check-style
	@$(MAKE) --no-print-directory all $(BUILD)/idem-tests $(PROGS)
	@sh scripts/check-exports.sh $(BUILD)/libidem.so
	@sh scripts/run-tests.sh $(BUILD)

# The sanitizers look for memory errors, which do not depend on where the
# stores live: `make asan` keeps its test stores in RAM (/dev/shm, where
# an fsync costs nothing) when it can, and `make test` on the disk.
ASAN_TMPDIR ?= $(shell test -d /dev/shm -a -w /dev/shm && echo /dev/shm || echo $${TMPDIR:-/tmp})

asan: deps
	@TMPDIR=$(ASAN_TMPDIR) IDEM_RESTART_KEYS=2000000 IDEM_CLI_KILLS=6 \
	    IDEM_CRASH_KILLS=50 IDEM_MODEL_SEEDS=3 \
	    $(MAKE) --no-print-directory \
	    BUILD=build/asan OPT=-O1 \
	    SAN="-fsanitize=address,undefined -fno-omit-frame-pointer \
	    -fno-sanitize-recover=all" test

bench: deps all $(BENCHES) $(BUILD)/progs/kafka_mock
	@sh bench/run.sh $(BUILD)

demo: deps all
	@sh scripts/demo.sh $(BUILD)

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/idem \
	    $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig \
	    $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man3
	install -m 644 $(BUILD)/libidem.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/libidem.so $(DESTDIR)$(PREFIX)/lib/libidem.so.0
	ln -sf libidem.so.0 $(DESTDIR)$(PREFIX)/lib/libidem.so
	install -m 644 include/idem/*.h $(DESTDIR)$(PREFIX)/include/idem/
	install -m 755 $(BUILD)/idem $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(shell sed -n \
	    's/#define IDEM_VERSION_STRING "\(.*\)"/\1/p' include/idem/version.h)|' \
	    idem.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/idem.pc
	install -m 644 docs/man/*.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 644 docs/man/*.3 $(DESTDIR)$(PREFIX)/share/man/man3/

check-style:
	@sh scripts/check-style.sh

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
