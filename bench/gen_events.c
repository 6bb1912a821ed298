/* bench/gen_events.c - the NDJSON corpus of the dedup benchmark.
 *
 * usage: gen_events N [DUP_PERCENT] [SEED] > events.ndjson
 *
 * Prints N event lines of about 150 bytes, shaped like what a broker
 * redelivers: an "event_id" UUID, a type, a timestamp, a nested user and
 * an amount. DUP_PERCENT (default 10) of the lines repeat, byte for byte,
 * an event sent up to 10,000 lines earlier: redeliveries arrive close to
 * the original, which is what makes a dedup window work. The field order
 * and the ", " / ": " spacing match what mawk's field-splitting reference
 * command expects (bench/run.sh), so both tools see the same keys.
 * Deterministic for a given SEED (default 1). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keys36.h"

#define WINDOW 10000

static const char *const types[] = {"order.created", "order.paid",
                                    "order.shipped", "cart.updated",
                                    "payment.refunded"};
static const char *const countries[] = {"DE", "FR", "US", "JP", "BR", "IN"};

static int event_line(char *buf, size_t n, uint64_t *rng, size_t id)
{
    char key[BENCH_KEYLEN + 1];
    bench_key(1, id, key);
    uint64_t r = bench_splitmix(rng);
    long ms = 1714564800000L + (long)(id * 37 % 86400000);
    return snprintf(buf, n,
                    "{\"event_id\": \"%s\", \"type\": \"%s\", \"ts\": %ld, "
                    "\"user\": {\"id\": %u, \"country\": \"%s\"}, "
                    "\"amount\": %u.%02u}\n",
                    key, types[r % 5], ms, (unsigned)(r >> 8) % 1000000,
                    countries[(r >> 32) % 6], (unsigned)(r >> 40) % 10000,
                    (unsigned)(r >> 20) % 100);
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 4) {
        fputs("usage: gen_events N [DUP_PERCENT] [SEED]\n", stderr);
        return 2;
    }
    size_t n = strtoul(argv[1], NULL, 10);
    unsigned dup = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 10;
    uint64_t rng = argc > 3 ? strtoull(argv[3], NULL, 10) : 1;
    static char ring[WINDOW][256];
    size_t fresh = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = bench_splitmix(&rng);
        if (fresh > 0 && r % 100 < dup) {
            size_t back = (r >> 8) % (fresh < WINDOW ? fresh : WINDOW);
            fputs(ring[(fresh - 1 - back) % WINDOW], stdout);
            continue;
        }
        char *line = ring[fresh % WINDOW];
        event_line(line, sizeof ring[0], &rng, fresh++);
        fputs(line, stdout);
    }
    return fflush(stdout) != 0;
}
