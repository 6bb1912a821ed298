/* uuid.c - RFC 9562 UUIDs, versions 4 and 7, and their text form.
 *
 * uuid4 is 16 bytes of entropy with six bits overwritten: the cost is all
 * in getting the bytes, which entropy.c makes cheap.
 *
 * uuid7 is where the work is. The RFC asks for a timestamp first so that
 * keys sort by time, and leaves it to the implementation to keep them
 * unique and ordered within a millisecond. Here the 48-bit timestamp and a
 * 16-bit counter are packed into one 64-bit integer, the generator's whole
 * state, advanced by compare-and-swap to max(state + 1, now:start). That
 * one rule gives every property the keys need, lock-free:
 *
 *   - two calls never get the same state, from any thread;
 *   - states only grow, so UUIDs sort in issue order;
 *   - a counter that overflows carries into the timestamp: the UUID moves
 *     to the next millisecond instead of wrapping or failing;
 *   - a clock stepped back loses the max(): the state keeps counting up
 *     from where it was (running ahead of the clock, carrying into later
 *     milliseconds as needed) until the clock catches up.
 *
 * The counter starts each millisecond at a random value below 1024, as
 * RFC 9562 section 6.2 suggests (random start, guard bits against overflow),
 * which leaves more than 64,000 values per millisecond before a carry. The
 * other 58 bits are random and make UUIDs from different processes unique. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "entropy.h"

#define IDEM__UUID7_OPTS_VERSION 1u
#define IDEM__TS_LIMIT (INT64_C(1) << 48)

struct idem_uuid7_gen {
    _Atomic uint64_t state; /* timestamp << 16 | counter; 0: fresh */
    idem_clock_fn clock;
    void *clock_ctx;
};

static idem_uuid7_gen idem__uuid7_default;

int idem_uuid4(uint8_t out[IDEM_UUID_LEN])
{
    uint8_t u[IDEM_UUID_LEN];
    if (!out)
        return IDEM_EINVAL;
    int rc = idem__entropy(u, sizeof u);
    if (rc)
        return rc;
    u[6] = (uint8_t)((u[6] & 0x0f) | 0x40);
    u[8] = (uint8_t)((u[8] & 0x3f) | 0x80);
    memcpy(out, u, sizeof u);
    return 0;
}

void idem_uuid7_opts_init(idem_uuid7_opts *o)
{
    memset(o, 0, sizeof *o);
    o->version = IDEM__UUID7_OPTS_VERSION;
}

int idem_uuid7_gen_new(const idem_uuid7_opts *opts, idem_uuid7_gen **out)
{
    if (!out)
        return IDEM_EINVAL;
    *out = NULL;
    idem_uuid7_opts def;
    if (!opts) {
        idem_uuid7_opts_init(&def);
        opts = &def;
    }
    if (opts->version != IDEM__UUID7_OPTS_VERSION)
        return IDEM_EINVAL;
    idem_uuid7_gen *g = malloc(sizeof *g);
    if (!g)
        return IDEM_ENOMEM;
    atomic_init(&g->state, 0);
    g->clock = opts->clock;
    g->clock_ctx = opts->clock_ctx;
    *out = g;
    return 0;
}

void idem_uuid7_gen_free(idem_uuid7_gen *g)
{
    free(g);
}

int idem_uuid7_gen_next(idem_uuid7_gen *g, uint8_t out[IDEM_UUID_LEN])
{
    if (!out)
        return IDEM_EINVAL;
    if (!g)
        g = &idem__uuid7_default;
    /* r[0..1]: ten bits of counter start; r[2]: two bits; r[3..9]: the
     * last seven bytes. 58 random bits in the UUID. */
    uint8_t r[10];
    int rc = idem__entropy(r, sizeof r);
    if (rc)
        return rc;
    int64_t now = g->clock ? g->clock(g->clock_ctx) : idem__wall_ms();
    if (now < 0 || now >= IDEM__TS_LIMIT)
        return IDEM_ECLOCK;
    uint64_t fresh = (uint64_t)now << 16 | ((unsigned)r[0] << 8 & 0x300) | r[1];
    uint64_t old = atomic_load_explicit(&g->state, memory_order_relaxed);
    uint64_t next;
    do {
        if (old == UINT64_MAX) /* the year 10889 */
            return IDEM_ECLOCK;
        /* A new millisecond starts the counter afresh; within one (or
         * behind: the clock went back) it counts on. */
        next = fresh >> 16 > old >> 16 ? fresh : old + 1;
    } while (!atomic_compare_exchange_weak_explicit(
        &g->state, &old, next, memory_order_relaxed, memory_order_relaxed));
    uint64_t ts = next >> 16;
    unsigned ctr = (unsigned)(next & 0xffff);
    out[0] = (uint8_t)(ts >> 40);
    out[1] = (uint8_t)(ts >> 32);
    out[2] = (uint8_t)(ts >> 24);
    out[3] = (uint8_t)(ts >> 16);
    out[4] = (uint8_t)(ts >> 8);
    out[5] = (uint8_t)ts;
    out[6] = (uint8_t)(0x70 | ctr >> 12);
    out[7] = (uint8_t)(ctr >> 4);
    out[8] = (uint8_t)(0x80 | (ctr & 0x0f) << 2 | (r[2] & 0x03));
    memcpy(out + 9, r + 3, 7);
    return 0;
}

int idem_uuid7(uint8_t out[IDEM_UUID_LEN])
{
    return idem_uuid7_gen_next(NULL, out);
}

static const char idem__hex[] = "0123456789abcdef";

void idem_uuid_format(const uint8_t u[IDEM_UUID_LEN],
                      char out[IDEM_UUID_STRLEN + 1])
{
    char *p = out;
    for (int i = 0; i < IDEM_UUID_LEN; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            *p++ = '-';
        *p++ = idem__hex[u[i] >> 4];
        *p++ = idem__hex[u[i] & 0x0f];
    }
    *p = '\0';
}


int idem_uuid_parse(const char *text, size_t len, uint8_t out[IDEM_UUID_LEN])
{
    if (!text || !out || len != IDEM_UUID_STRLEN)
        return IDEM_EINVAL;
    uint8_t u[IDEM_UUID_LEN];
    size_t j = 0;
    for (int i = 0; i < IDEM_UUID_LEN; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) {
            if (text[j++] != '-')
                return IDEM_EINVAL;
        }
        int hi = idem__hexval(text[j]), lo = idem__hexval(text[j + 1]);
        if (hi < 0 || lo < 0)
            return IDEM_EINVAL;
        u[i] = (uint8_t)(hi << 4 | lo);
        j += 2;
    }
    memcpy(out, u, sizeof u);
    return 0;
}

int idem_uuid_version(const uint8_t u[IDEM_UUID_LEN])
{
    if ((u[8] & 0xc0) != 0x80)
        return -1;
    return u[6] >> 4;
}

int64_t idem_uuid7_unix_ms(const uint8_t u[IDEM_UUID_LEN])
{
    if (idem_uuid_version(u) != 7)
        return -1;
    int64_t ms = 0;
    for (int i = 0; i < 6; i++)
        ms = ms << 8 | u[i];
    return ms;
}
