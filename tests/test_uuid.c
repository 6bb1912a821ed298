/* test_uuid.c - uuid4 and uuid7: layout, order, uniqueness, fork. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "idem/idem.h"

#define MILLION 1000000u

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int cmp16(const void *a, const void *b)
{
    return memcmp(a, b, 16);
}

/* The 16-bit counter of an idem uuid7. */
static unsigned ctr7(const uint8_t *u)
{
    return (unsigned)(u[6] & 0x0f) << 12 | (unsigned)u[7] << 4 |
           (unsigned)(u[8] >> 2 & 0x0f);
}

/* Text form: 36 chars, hyphens at 8 13 18 23, lowercase hex elsewhere,
 * and it parses back to the same bytes. */
static void check_text(const uint8_t u[16])
{
    char s[IDEM_UUID_STRLEN + 1];
    memset(s, 'X', sizeof s);
    idem_uuid_format(u, s);
    cr_assert_eq(strlen(s), 36);
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23)
            cr_assert_eq(s[i], '-', "%s", s);
        else
            cr_assert((s[i] >= '0' && s[i] <= '9') ||
                          (s[i] >= 'a' && s[i] <= 'f'),
                      "not lowercase hex: %s", s);
    }
    uint8_t back[16];
    cr_assert_eq(idem_uuid_parse(s, 36, back), 0);
    cr_assert_eq(memcmp(back, u, 16), 0);
}

Test(uuid4, layout_and_uniqueness_1m, .timeout = 60)
{
    uint8_t *all = malloc(16u * MILLION);
    cr_assert(all);
    uint64_t ones = 0;
    for (unsigned i = 0; i < MILLION; i++) {
        uint8_t *u = all + 16u * i;
        cr_assert_eq(idem_uuid4(u), 0);
        cr_assert_eq(u[6] >> 4, 4, "version nibble");
        cr_assert_eq(u[8] >> 6, 2, "variant bits 10");
        cr_assert_eq(idem_uuid_version(u), 4);
        cr_assert_eq(idem_uuid7_unix_ms(u), -1);
        if (i % 16 == 0)
            check_text(u);
        uint64_t hi, lo;
        memcpy(&hi, u, 8);
        memcpy(&lo, u + 8, 8);
        ones += (uint64_t)__builtin_popcountll(hi) +
                (uint64_t)__builtin_popcountll(lo);
        ones -= 1 + 1; /* the version's 0100 and the variant's 10 */
    }
    /* 122 random bits each: ones ~ N(61e6, sd 5523); 20 sd of slack. */
    double expect = 61.0 * MILLION;
    cr_assert(ones > expect - 110000 && ones < expect + 110000,
              "bias: %llu ones of %u bits", (unsigned long long)ones,
              122 * MILLION);
    qsort(all, MILLION, 16, cmp16);
    for (unsigned i = 1; i < MILLION; i++)
        cr_assert_neq(memcmp(all + 16u * (i - 1), all + 16u * i, 16), 0,
                      "duplicate uuid4");
    free(all);
}

Test(uuid7, layout_1m, .timeout = 60)
{
    uint8_t u[16];
    for (unsigned i = 0; i < MILLION; i++) {
        cr_assert_eq(idem_uuid7(u), 0);
        cr_assert_eq(u[6] >> 4, 7, "version nibble");
        cr_assert_eq(u[8] >> 6, 2, "variant bits 10");
        cr_assert_eq(idem_uuid_version(u), 7);
        if (i % 16 == 0)
            check_text(u);
    }
}

/* 10 M in a tight loop: each greater than the last; the embedded time
 * is the clock's (sampled: reading the clock per key would be the test's
 * whole cost). */
Test(uuid7, strictly_increasing_10m_with_true_time, .timeout = 120)
{
    uint8_t prev[16], cur[16];
    cr_assert_eq(idem_uuid7(prev), 0);
    for (unsigned i = 0; i < 10 * MILLION; i++) {
        int sample = i % 4096 == 0;
        int64_t t0 = sample ? wall_ms() : 0;
        cr_assert_eq(idem_uuid7(cur), 0);
        if (memcmp(prev, cur, 16) >= 0)
            cr_assert_fail("not increasing at %u", i);
        if (sample) {
            int64_t t1 = wall_ms(), ts = idem_uuid7_unix_ms(cur);
            cr_assert(ts >= t0 - 2 && ts <= t1 + 2,
                      "uuid7 time %lld, clock %lld..%lld", (long long)ts,
                      (long long)t0, (long long)t1);
        }
        memcpy(prev, cur, 16);
    }
}

struct thread_run {
    uint8_t *out;
    unsigned n;
    int rc;
};

static void *gen_many(void *arg)
{
    struct thread_run *r = arg;
    for (unsigned i = 0; i < r->n && !r->rc; i++)
        r->rc = idem_uuid7(r->out + 16u * i);
    return NULL;
}

Test(uuid7, four_threads_ordered_and_distinct, .timeout = 120)
{
    enum { T = 4 };
    struct thread_run runs[T];
    pthread_t th[T];
    for (int t = 0; t < T; t++) {
        runs[t] = (struct thread_run){malloc(16u * MILLION), MILLION, 0};
        cr_assert(runs[t].out);
    }
    for (int t = 0; t < T; t++)
        cr_assert_eq(pthread_create(&th[t], NULL, gen_many, &runs[t]), 0);
    for (int t = 0; t < T; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < T; t++) {
        cr_assert_eq(runs[t].rc, 0);
        for (unsigned i = 1; i < MILLION; i++)
            if (memcmp(runs[t].out + 16u * (i - 1), runs[t].out + 16u * i,
                       16) >= 0)
                cr_assert_fail("thread %d not increasing at %u", t, i);
    }
    /* Each thread's run is sorted: a 4-way merge that finds every next
     * key strictly greater proves there are no duplicates. */
    unsigned pos[T] = {0};
    uint8_t last[16] = {0};
    int have_last = 0;
    for (unsigned k = 0; k < T * MILLION; k++) {
        int best = -1;
        for (int t = 0; t < T; t++)
            if (pos[t] < MILLION &&
                (best < 0 || memcmp(runs[t].out + 16u * pos[t],
                                    runs[best].out + 16u * pos[best], 16) < 0))
                best = t;
        const uint8_t *u = runs[best].out + 16u * pos[best]++;
        if (have_last && memcmp(last, u, 16) >= 0)
            cr_assert_fail("duplicate across threads");
        memcpy(last, u, 16);
        have_last = 1;
    }
    for (int t = 0; t < T; t++)
        free(runs[t].out);
}

struct fake_clock {
    int64_t now;
};

static int64_t fake_now(void *ctx)
{
    return ((struct fake_clock *)ctx)->now;
}

static idem_uuid7_gen *fake_gen(struct fake_clock *c)
{
    idem_uuid7_opts o;
    idem_uuid7_opts_init(&o);
    o.clock = fake_now;
    o.clock_ctx = c;
    idem_uuid7_gen *g = NULL;
    cr_assert_eq(idem_uuid7_gen_new(&o, &g), 0);
    cr_assert(g);
    return g;
}

/* The clock jumps back 5 s: UUIDs keep growing, their time stays at the
 * last one issued (carrying forward only as counters fill), and follows
 * the clock again once it has caught up. */
Test(uuid7, clock_jumps_back_5s, .timeout = 30)
{
    const int64_t T = 1700000000000;
    struct fake_clock c = {T};
    idem_uuid7_gen *g = fake_gen(&c);
    uint8_t prev[16], cur[16];
    cr_assert_eq(idem_uuid7_gen_next(g, prev), 0);
    cr_assert_eq(idem_uuid7_unix_ms(prev), T);
    cr_assert_lt(ctr7(prev), 1024u, "a new ms starts below 1024");
    c.now = T - 5000;
    const unsigned n = 200000;
    for (unsigned i = 0; i < n; i++) {
        cr_assert_eq(idem_uuid7_gen_next(g, cur), 0);
        cr_assert_lt(memcmp(prev, cur, 16), 0, "not increasing at %u", i);
        int64_t ts = idem_uuid7_unix_ms(cur);
        /* 200,000 keys fill at most 4 ms of counters past T. */
        cr_assert(ts >= T && ts <= T + 4, "time %lld", (long long)ts);
        memcpy(prev, cur, 16);
    }
    int64_t ahead = idem_uuid7_unix_ms(prev);
    cr_assert_gt(ahead, T, "200,000 keys overflowed the counter");
    c.now = T + 100; /* caught up */
    cr_assert_eq(idem_uuid7_gen_next(g, cur), 0);
    cr_assert_lt(memcmp(prev, cur, 16), 0);
    cr_assert_eq(idem_uuid7_unix_ms(cur), T + 100);
    cr_assert_lt(ctr7(cur), 1024u);
    idem_uuid7_gen_free(g);
}

/* Within a millisecond the counter counts by one; at 0xffff it carries
 * into the next millisecond instead of wrapping. */
Test(uuid7, counter_overflow_moves_to_next_ms, .timeout = 30)
{
    const int64_t T = 1700000000000;
    struct fake_clock c = {T};
    idem_uuid7_gen *g = fake_gen(&c);
    uint8_t prev[16], cur[16];
    cr_assert_eq(idem_uuid7_gen_next(g, prev), 0);
    unsigned carries = 0;
    for (unsigned i = 0; i < 70000; i++) {
        cr_assert_eq(idem_uuid7_gen_next(g, cur), 0);
        int64_t pts = idem_uuid7_unix_ms(prev), ts = idem_uuid7_unix_ms(cur);
        if (ts == pts) {
            cr_assert_eq(ctr7(cur), ctr7(prev) + 1);
        } else {
            cr_assert_eq(ts, pts + 1);
            cr_assert_eq(ctr7(prev), 0xffffu);
            cr_assert_eq(ctr7(cur), 0u);
            carries++;
        }
        cr_assert_lt(memcmp(prev, cur, 16), 0);
        memcpy(prev, cur, 16);
    }
    cr_assert_eq(carries, 1u);
    idem_uuid7_gen_free(g);
}

Test(uuid7, clock_out_of_range, .timeout = 10)
{
    struct fake_clock c = {-1};
    idem_uuid7_gen *g = fake_gen(&c);
    uint8_t u[16] = {0}, zero[16] = {0};
    cr_assert_eq(idem_uuid7_gen_next(g, u), IDEM_ECLOCK);
    cr_assert_eq(memcmp(u, zero, 16), 0, "out untouched on error");
    c.now = INT64_C(1) << 48;
    cr_assert_eq(idem_uuid7_gen_next(g, u), IDEM_ECLOCK);
    c.now = (INT64_C(1) << 48) - 1;
    cr_assert_eq(idem_uuid7_gen_next(g, u), 0);
    cr_assert_eq(idem_uuid7_unix_ms(u), (INT64_C(1) << 48) - 1);
    idem_uuid7_gen_free(g);
    idem_uuid7_opts o;
    memset(&o, 0, sizeof o);
    cr_assert_eq(idem_uuid7_gen_new(&o, &g), IDEM_EINVAL);
    cr_assert_null(g);
    cr_assert_str_eq(idem_strerror(IDEM_ECLOCK),
                     "IDEM_ECLOCK: the clock is outside what the generator "
                     "can use");
}

Test(uuid, parse_rejects_malformed, .timeout = 10)
{
    uint8_t u[16];
    const char *bad[] = {
        "",
        "0123456789abcdef0123456789abcdef",      /* no hyphens */
        "01234567-89ab-cdef-0123-456789abcde",   /* 35 */
        "01234567-89ab-cdef-0123-456789abcdef0", /* 37 */
        "01234567+89ab-cdef-0123-456789abcdef",  /* bad hyphen */
        "0123456g-89ab-cdef-0123-456789abcdef",  /* not hex */
        "01234567-89ab-cdef-0123-456789abcde ",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(idem_uuid_parse(bad[i], strlen(bad[i]), u), IDEM_EINVAL,
                     "accepted '%s'", bad[i]);
    const char *good = "01234567-89AB-cdef-8123-456789abcdef";
    cr_assert_eq(idem_uuid_parse(good, strlen(good), u), 0);
    cr_assert_eq(u[5], 0xab);
    cr_assert_eq(idem_uuid_version(u), 0xc);
    u[8] = 0x40; /* NCS variant */
    cr_assert_eq(idem_uuid_version(u), -1);
}

/* The child's first keys would be the parent's next ones if the
 * inherited entropy buffer were reused. */
Test(uuid4, fork_child_shares_no_value, .timeout = 30)
{
    enum { N = 20000 };
    uint8_t first[16];
    cr_assert_eq(idem_uuid4(first), 0); /* the buffer is now full */
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(fds[0]);
        static uint8_t mine[N][16];
        for (int i = 0; i < N; i++)
            if (idem_uuid4(mine[i]))
                _exit(3);
        const uint8_t *p = (const uint8_t *)mine;
        size_t left = sizeof mine;
        while (left) {
            ssize_t w = write(fds[1], p, left);
            if (w <= 0)
                _exit(4);
            p += w;
            left -= (size_t)w;
        }
        _exit(0);
    }
    close(fds[1]);
    static uint8_t parent[N][16], child[N][16];
    for (int i = 0; i < N; i++)
        cr_assert_eq(idem_uuid4(parent[i]), 0);
    uint8_t *p = (uint8_t *)child;
    size_t got = 0;
    while (got < sizeof child) {
        ssize_t r = read(fds[0], p + got, sizeof child - got);
        cr_assert_gt(r, 0, "child sent %zu bytes", got);
        got += (size_t)r;
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    qsort(parent, N, 16, cmp16);
    for (int i = 0; i < N; i++) {
        cr_assert_null(bsearch(child[i], parent, N, 16, cmp16),
                       "child repeated a parent uuid4 (key %d)", i);
        cr_assert_neq(memcmp(child[i], first, 16), 0);
    }
}
