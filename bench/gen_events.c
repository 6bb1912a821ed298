/* bench/gen_events.c - the event corpus of the dedup benchmarks.
 *
 * usage: gen_events [--xadd STREAM] N [DUP_PERCENT] [SEED]
 *
 * Prints N events shaped like what a broker redelivers: an "event_id"
 * UUID, a type, a timestamp, a user and an amount. DUP_PERCENT (default
 * 10) of them repeat, byte for byte, an event sent up to 10,000 earlier:
 * redeliveries arrive close to the original, which is what makes a dedup
 * window work. Deterministic for a given SEED (default 1).
 *
 * Without --xadd each event is an NDJSON line of about 150 bytes; the
 * field order and the ", " / ": " spacing match what mawk's
 * field-splitting reference command expects (bench/run.sh), so both
 * tools see the same keys. With --xadd each event is an XADD of its
 * fields to STREAM in the Redis protocol, for `redis-cli --pipe`: the
 * Streams benchmark (bench/streams.sh) loads its input that way, a
 * million entries in a few seconds, with the same keys and duplicates
 * as the NDJSON corpus. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keys36.h"

#define WINDOW 10000
#define NFIELDS 6
#define RECORD_MAX 512

static const char *const types[] = {"order.created", "order.paid",
                                    "order.shipped", "cart.updated",
                                    "payment.refunded"};
static const char *const countries[] = {"DE", "FR", "US", "JP", "BR", "IN"};

/* One event's values, in field order. */
typedef struct event {
    char id[BENCH_KEYLEN + 1];
    const char *type, *country;
    char ts[24], user[16], amount[16];
} event;

static const char *const names[NFIELDS] = {"event_id", "type", "ts",
                                           "user", "country", "amount"};

static void make_event(event *e, uint64_t *rng, size_t id)
{
    bench_key(1, id, e->id);
    uint64_t r = bench_splitmix(rng);
    e->type = types[r % 5];
    e->country = countries[(r >> 32) % 6];
    snprintf(e->ts, sizeof e->ts, "%ld",
             1714564800000L + (long)(id * 37 % 86400000));
    snprintf(e->user, sizeof e->user, "%u", (unsigned)(r >> 8) % 1000000);
    snprintf(e->amount, sizeof e->amount, "%u.%02u",
             (unsigned)(r >> 40) % 10000, (unsigned)(r >> 20) % 100);
}

static int ndjson(char *buf, size_t n, const event *e)
{
    return snprintf(buf, n,
                    "{\"event_id\": \"%s\", \"type\": \"%s\", \"ts\": %s, "
                    "\"user\": {\"id\": %s, \"country\": \"%s\"}, "
                    "\"amount\": %s}\n",
                    e->id, e->type, e->ts, e->user, e->country, e->amount);
}

/* Append one RESP bulk string; the new length (n when it did not fit). */
static size_t bulk(char *buf, size_t at, size_t n, const char *s)
{
    int w = snprintf(buf + at, n - at, "$%zu\r\n%s\r\n", strlen(s), s);
    return w < 0 || (size_t)w >= n - at ? n : at + (size_t)w;
}

/* XADD stream * name value ... as one RESP command. */
static int resp(char *buf, size_t n, const event *e, const char *stream)
{
    const char *values[NFIELDS] = {e->id, e->type, e->ts, e->user,
                                   e->country, e->amount};
    int w = snprintf(buf, n, "*%d\r\n", 3 + 2 * NFIELDS);
    size_t at = bulk(buf, (size_t)w, n, "XADD");
    at = bulk(buf, at, n, stream);
    at = bulk(buf, at, n, "*");
    for (int i = 0; i < NFIELDS; i++)
        at = bulk(buf, bulk(buf, at, n, names[i]), n, values[i]);
    return at < n ? (int)at : -1;
}

int main(int argc, char **argv)
{
    const char *stream = NULL;
    if (argc > 2 && !strcmp(argv[1], "--xadd")) {
        stream = argv[2];
        argc -= 2;
        argv += 2;
    }
    if (argc < 2 || argc > 4 || (stream && strlen(stream) > 100)) {
        fputs("usage: gen_events [--xadd STREAM] N [DUP_PERCENT] [SEED]\n",
              stderr);
        return 2;
    }
    size_t n = strtoul(argv[1], NULL, 10);
    unsigned dup = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 10;
    uint64_t rng = argc > 3 ? strtoull(argv[3], NULL, 10) : 1;
    static char ring[WINDOW][RECORD_MAX];
    size_t fresh = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = bench_splitmix(&rng);
        if (fresh > 0 && r % 100 < dup) {
            size_t back = (r >> 8) % (fresh < WINDOW ? fresh : WINDOW);
            fputs(ring[(fresh - 1 - back) % WINDOW], stdout);
            continue;
        }
        char *rec = ring[fresh % WINDOW];
        event e;
        make_event(&e, &rng, fresh++);
        if ((stream ? resp(rec, RECORD_MAX, &e, stream)
                    : ndjson(rec, RECORD_MAX, &e)) < 0)
            return 1;
        fputs(rec, stdout);
    }
    return fflush(stdout) != 0;
}
