/* test_snowflake.c - snowflake IDs: fields, the per-ms cap, clock steps
 * back, the high-water state file. Time is injected: nothing sleeps. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "idem/idem.h"

#define T0 INT64_C(1750000000000) /* 2025-06-15 */

struct fake {
    int64_t now;
    unsigned sleeps;
    int64_t last_until;
};

static int64_t fake_now(void *ctx)
{
    return ((struct fake *)ctx)->now;
}

/* Sleeping moves the fake clock to where the generator wanted it. */
static void fake_sleep(void *ctx, int64_t until_ms)
{
    struct fake *f = ctx;
    f->sleeps++;
    f->last_until = until_ms;
    if (f->now < until_ms)
        f->now = until_ms;
}

static void fake_opts(idem_snowflake_opts *o, struct fake *f)
{
    idem_snowflake_opts_init(o);
    o->clock = fake_now;
    o->clock_ctx = f;
    o->sleep = fake_sleep;
    o->sleep_ctx = f;
}

static idem_snowflake *open_ok(const idem_snowflake_opts *o)
{
    idem_snowflake *g = NULL;
    int rc = idem_snowflake_new(o, &g);
    cr_assert_eq(rc, 0, "new: %s: %s", idem_strerror(rc),
                 idem_snowflake_errdetail(g));
    return g;
}

static uint64_t next_ok(idem_snowflake *g)
{
    uint64_t id = 0;
    int rc = idem_snowflake_next(g, &id);
    cr_assert_eq(rc, 0, "next: %s: %s", idem_strerror(rc),
                 idem_snowflake_errdetail(g));
    return id;
}

static idem_snowflake_parts parts(uint64_t id)
{
    idem_snowflake_parts p;
    cr_assert_eq(idem_snowflake_decode(id, IDEM_SNOWFLAKE_EPOCH_MS, &p), 0);
    return p;
}

Test(snowflake, decode_round_trip, .timeout = 10)
{
    struct fake f = {T0, 0, 0};
    idem_snowflake_opts o;
    fake_opts(&o, &f);
    o.node = 513;
    idem_snowflake *g = open_ok(&o);
    for (unsigned i = 0; i < 3; i++) {
        uint64_t id = next_ok(g);
        idem_snowflake_parts p = parts(id);
        cr_assert_eq(p.unix_ms, T0);
        cr_assert_eq(p.since_epoch_ms, T0 - IDEM_SNOWFLAKE_EPOCH_MS);
        cr_assert_eq(p.node, 513u);
        cr_assert_eq(p.seq, i);
        cr_assert_eq(id >> 63, 0u);
        char s[IDEM_SNOWFLAKE_STRLEN + 1];
        size_t n = idem_snowflake_format(id, s);
        cr_assert_eq(n, strlen(s));
        char ref[32];
        snprintf(ref, sizeof ref, "%llu", (unsigned long long)id);
        cr_assert_str_eq(s, ref);
        uint64_t back;
        cr_assert_eq(idem_snowflake_parse(s, n, &back), 0);
        cr_assert_eq(back, id);
    }
    idem_snowflake_free(g);

    /* Fields built by hand decode to themselves, at the edges too. */
    const uint64_t ms[] = {0, 1, (UINT64_C(1) << 41) - 1};
    const unsigned nodes[] = {0, 1, 1023}, seqs[] = {0, 4095, 77};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            uint64_t id = ms[i] << 22 | (uint64_t)nodes[j] << 12 | seqs[j];
            idem_snowflake_parts p;
            cr_assert_eq(idem_snowflake_decode(id, 0, &p), 0);
            cr_assert_eq(p.since_epoch_ms, (int64_t)ms[i]);
            cr_assert_eq(p.unix_ms, (int64_t)ms[i]);
            cr_assert_eq(p.node, nodes[j]);
            cr_assert_eq(p.seq, seqs[j]);
        }
    idem_snowflake_parts p;
    cr_assert_eq(idem_snowflake_decode(UINT64_C(1) << 63, 0, &p), IDEM_EINVAL);
    cr_assert_eq(idem_snowflake_decode(1, -1, &p), IDEM_EINVAL);
}

Test(snowflake, parse_rejects_malformed, .timeout = 10)
{
    uint64_t id;
    const char *bad[] = {"",
                         "-1",
                         "+1",
                         "01",
                         "1a",
                         " 1",
                         "1 ",
                         "9223372036854775808", /* 2^63 */
                         "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(idem_snowflake_parse(bad[i], strlen(bad[i]), &id),
                     IDEM_EINVAL, "accepted '%s'", bad[i]);
    cr_assert_eq(idem_snowflake_parse("0", 1, &id), 0);
    cr_assert_eq(id, 0u);
    cr_assert_eq(idem_snowflake_parse("9223372036854775807", 19, &id), 0);
    cr_assert_eq(id, (UINT64_C(1) << 63) - 1);
    char s[IDEM_SNOWFLAKE_STRLEN + 1];
    cr_assert_eq(idem_snowflake_format(UINT64_C(1) << 63, s), 0u);
    cr_assert_str_eq(s, "");
}

/* 4,096 IDs fit in one millisecond; the 4,097th waits for the next. */
Test(snowflake, cap_4096_per_ms, .timeout = 10)
{
    struct fake f = {T0, 0, 0};
    idem_snowflake_opts o;
    fake_opts(&o, &f);
    idem_snowflake *g = open_ok(&o);
    uint64_t prev = 0;
    for (unsigned i = 0; i < 4096; i++) {
        uint64_t id = next_ok(g);
        idem_snowflake_parts p = parts(id);
        cr_assert_eq(p.unix_ms, T0);
        cr_assert_eq(p.seq, i);
        if (i)
            cr_assert_gt(id, prev);
        prev = id;
    }
    cr_assert_eq(f.sleeps, 0u);
    uint64_t id = next_ok(g);
    cr_assert_eq(f.sleeps, 1u, "the 4,097th waited");
    cr_assert_eq(f.last_until, T0 + 1);
    cr_assert_eq(parts(id).unix_ms, T0 + 1);
    cr_assert_eq(parts(id).seq, 0u);
    cr_assert_gt(id, prev);
    idem_snowflake_free(g);
}

/* A step back within max_wait_ms is waited out, and the IDs go on
 * growing from where they were. */
Test(snowflake, clock_back_is_waited_out, .timeout = 10)
{
    struct fake f = {T0, 0, 0};
    idem_snowflake_opts o;
    fake_opts(&o, &f);
    o.max_wait_ms = 1000;
    idem_snowflake *g = open_ok(&o);
    uint64_t a = next_ok(g);
    uint64_t b = next_ok(g);
    f.now = T0 - 1000;
    uint64_t c = next_ok(g);
    cr_assert_eq(f.sleeps, 1u);
    cr_assert_eq(f.last_until, T0, "waited until the last issued ms");
    cr_assert(a < b && b < c);
    cr_assert_eq(parts(c).unix_ms, T0);
    cr_assert_eq(parts(c).seq, 2u);
    idem_snowflake_free(g);
}

/* A step back beyond max_wait_ms is an error, not a repeat; the
 * generator works again once the clock is back. */
Test(snowflake, clock_back_too_far_is_an_error, .timeout = 10)
{
    struct fake f = {T0, 0, 0};
    idem_snowflake_opts o;
    fake_opts(&o, &f);
    o.max_wait_ms = 1000;
    idem_snowflake *g = open_ok(&o);
    uint64_t a = next_ok(g);
    f.now = T0 - 1001;
    uint64_t id = 12345;
    cr_assert_eq(idem_snowflake_next(g, &id), IDEM_ECLOCK);
    cr_assert_eq(id, 12345u, "no ID on error");
    cr_assert_eq(f.sleeps, 0u, "it did not wait: the wait was too long");
    cr_assert(strstr(idem_snowflake_errdetail(g), "1001 ms behind"), "%s",
              idem_snowflake_errdetail(g));
    f.now = T0 + 5;
    uint64_t b = next_ok(g);
    cr_assert_gt(b, a);
    cr_assert_str_eq(idem_snowflake_errdetail(g), "");
    idem_snowflake_free(g);

    /* max_wait_ms = 0: any step back is refused at once. */
    struct fake f2 = {T0, 0, 0};
    fake_opts(&o, &f2);
    o.max_wait_ms = 0;
    g = open_ok(&o);
    next_ok(g);
    f2.now = T0 - 1;
    cr_assert_eq(idem_snowflake_next(g, &id), IDEM_ECLOCK);
    idem_snowflake_free(g);
}

Test(snowflake, clock_outside_the_format, .timeout = 10)
{
    struct fake f = {IDEM_SNOWFLAKE_EPOCH_MS - 1, 0, 0};
    idem_snowflake_opts o;
    fake_opts(&o, &f);
    idem_snowflake *g = open_ok(&o);
    uint64_t id;
    cr_assert_eq(idem_snowflake_next(g, &id), IDEM_ECLOCK);
    cr_assert(strstr(idem_snowflake_errdetail(g), "before the epoch"));
    f.now = IDEM_SNOWFLAKE_EPOCH_MS + (INT64_C(1) << 41);
    cr_assert_eq(idem_snowflake_next(g, &id), IDEM_ECLOCK);
    f.now = IDEM_SNOWFLAKE_EPOCH_MS + (INT64_C(1) << 41) - 1;
    id = next_ok(g);
    cr_assert_eq(parts(id).since_epoch_ms, (INT64_C(1) << 41) - 1);
    cr_assert_eq(id >> 63, 0u);
    idem_snowflake_free(g);
}

Test(snowflake, options_are_checked, .timeout = 10)
{
    idem_snowflake_opts o;
    idem_snowflake *g;
    idem_snowflake_opts_init(&o);
    cr_assert_eq(o.epoch_ms, IDEM_SNOWFLAKE_EPOCH_MS);
    cr_assert_eq(o.epoch_ms, INT64_C(1704067200000));
    o.node = 1024;
    cr_assert_eq(idem_snowflake_new(&o, &g), IDEM_EINVAL);
    cr_assert(strstr(idem_snowflake_errdetail(g), "node 1024"));
    uint64_t id;
    cr_assert_eq(idem_snowflake_next(g, &id), IDEM_EINVAL, "closed state");
    idem_snowflake_free(g);
    idem_snowflake_opts_init(&o);
    o.max_wait_ms = -1;
    cr_assert_eq(idem_snowflake_new(&o, &g), IDEM_EINVAL);
    idem_snowflake_free(g);
    idem_snowflake_opts_init(&o);
    o.state_file = "/tmp/never-created";
    o.reserve_ms = 2000;
    cr_assert_eq(idem_snowflake_new(&o, &g), IDEM_EINVAL);
    idem_snowflake_free(g);
    memset(&o, 0, sizeof o);
    cr_assert_eq(idem_snowflake_new(&o, &g), IDEM_EINVAL);
    idem_snowflake_free(g);
    cr_assert_eq(idem_snowflake_new(NULL, &g), 0);
    idem_snowflake_free(g);
}

struct sf_run {
    idem_snowflake *g;
    uint64_t *ids;
    unsigned n;
    int rc;
};

static void *sf_many(void *arg)
{
    struct sf_run *r = arg;
    for (unsigned i = 0; i < r->n && !r->rc; i++)
        r->rc = idem_snowflake_next(r->g, &r->ids[i]);
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Four threads share one generator on the real clock. */
Test(snowflake, threads_share_a_generator, .timeout = 60)
{
    enum { T = 4, N = 50000 };
    idem_snowflake_opts o;
    idem_snowflake_opts_init(&o);
    o.node = 3;
    idem_snowflake *g = open_ok(&o);
    uint64_t *all = malloc(sizeof *all * T * N);
    cr_assert(all);
    struct sf_run runs[T];
    pthread_t th[T];
    for (int t = 0; t < T; t++) {
        runs[t] = (struct sf_run){g, all + (size_t)t * N, N, 0};
        cr_assert_eq(pthread_create(&th[t], NULL, sf_many, &runs[t]), 0);
    }
    for (int t = 0; t < T; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < T; t++) {
        cr_assert_eq(runs[t].rc, 0, "%s", idem_snowflake_errdetail(g));
        for (unsigned i = 1; i < N; i++)
            cr_assert_gt(runs[t].ids[i], runs[t].ids[i - 1]);
    }
    qsort(all, T * N, sizeof *all, cmp_u64);
    for (size_t i = 1; i < (size_t)T * N; i++)
        cr_assert_neq(all[i], all[i - 1], "duplicate snowflake");
    cr_assert_eq(parts(all[0]).node, 3u);
    free(all);
    idem_snowflake_free(g);
}

/* ---- the state file ----------------------------------------------------- */

static char *temp_path(void)
{
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/idem-sf-XXXXXX");
    cr_assert(mkdtemp(dir));
    char *p = malloc(128);
    snprintf(p, 128, "%s/sf.state", dir);
    return p;
}

static void remove_temp(char *path)
{
    unlink(path);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    rmdir(path);
    free(path);
}

/* Restart with the clock set back: refused beyond max_wait_ms, waited
 * out within it, and never an ID at or below the last one issued. */
Test(snowflake, state_file_survives_restart_with_clock_back, .timeout = 30)
{
    char *path = temp_path();
    struct fake f = {T0, 0, 0};
    idem_snowflake_opts o;
    fake_opts(&o, &f);
    o.state_file = path;
    idem_snowflake *g = open_ok(&o);
    uint64_t last = 0;
    for (int i = 0; i < 10; i++)
        last = next_ok(g);
    f.now = T0 + 50;
    last = next_ok(g);
    cr_assert_eq(idem_snowflake_free(g), 0);

    /* A clock 10 s behind: an error, not IDs from 10 s ago. */
    f.now = T0 - 10000;
    g = open_ok(&o);
    uint64_t id = 0;
    cr_assert_eq(idem_snowflake_next(g, &id), IDEM_ECLOCK);
    cr_assert(strstr(idem_snowflake_errdetail(g), "state file"), "%s",
              idem_snowflake_errdetail(g));
    cr_assert_eq(idem_snowflake_free(g), 0);

    /* A clock 300 ms behind: waited out, then past the last ID. */
    f.now = T0 + 50 - 300;
    f.sleeps = 0;
    g = open_ok(&o);
    id = next_ok(g);
    cr_assert_gt(f.sleeps, 0u);
    cr_assert_gt(id, last);
    cr_assert_eq(parts(id).unix_ms, T0 + 51, "the last ms is used up");
    cr_assert_eq(idem_snowflake_free(g), 0);

    /* Without the file the same clock repeats old times: the file is
     * what prevents it. */
    f.now = T0 - 10000;
    o.state_file = NULL;
    g = open_ok(&o);
    cr_assert_lt(next_ok(g), last);
    idem_snowflake_free(g);
    remove_temp(path);
}

/* A process that dies without close() leaves the reserved mark, which
 * is at or past everything it issued. */
Test(snowflake, state_file_after_a_crash, .timeout = 30)
{
    char *path = temp_path();
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        struct fake f = {T0, 0, 0};
        idem_snowflake_opts o;
        fake_opts(&o, &f);
        o.state_file = path;
        idem_snowflake *g;
        uint64_t id = 0;
        if (idem_snowflake_new(&o, &g))
            _exit(3);
        for (int i = 0; i < 150; i++) {
            f.now = T0 + i; /* 150 ms: within one reserve of 200 */
            if (idem_snowflake_next(g, &id))
                _exit(4);
        }
        if (write(fds[1], &id, sizeof id) != sizeof id)
            _exit(5);
        _exit(0); /* no close(): a crash */
    }
    close(fds[1]);
    uint64_t child_last = 0;
    cr_assert_eq(read(fds[0], &child_last, sizeof child_last),
                 sizeof child_last);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed");
    /* Restart at the crash's start time. */
    struct fake f = {T0, 0, 0};
    idem_snowflake_opts o;
    fake_opts(&o, &f);
    o.state_file = path;
    idem_snowflake *g = open_ok(&o);
    uint64_t id = next_ok(g);
    cr_assert_gt(id, child_last);
    cr_assert_gt(f.sleeps, 0u, "it waited for the reserve to pass");
    cr_assert_leq(parts(id).unix_ms, T0 + 200 + 1);
    idem_snowflake_free(g);
    remove_temp(path);
}

Test(snowflake, state_file_is_locked, .timeout = 10)
{
    char *path = temp_path();
    idem_snowflake_opts o;
    idem_snowflake_opts_init(&o);
    o.state_file = path;
    idem_snowflake *a = open_ok(&o), *b;
    cr_assert_eq(idem_snowflake_new(&o, &b), IDEM_ELOCKED);
    cr_assert(strstr(idem_snowflake_errdetail(b), "locked"));
    idem_snowflake_free(b);
    next_ok(a);
    cr_assert_eq(idem_snowflake_free(a), 0);
    b = open_ok(&o); /* released */
    idem_snowflake_free(b);
    remove_temp(path);
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

static size_t read_file(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

/* Damage: a file with no valid slot is refused; one torn slot is
 * survived through the other. */
Test(snowflake, state_file_damage, .timeout = 10)
{
    char *path = temp_path();
    write_file(path, "hello\n", 6);
    idem_snowflake_opts o;
    struct fake f = {T0, 0, 0};
    fake_opts(&o, &f);
    o.state_file = path;
    idem_snowflake *g;
    cr_assert_eq(idem_snowflake_new(&o, &g), IDEM_ECORRUPT);
    cr_assert(strstr(idem_snowflake_errdetail(g), "no valid slot"));
    idem_snowflake_free(g);

    /* A good file: two slots of 64 bytes after a close. */
    unlink(path);
    g = open_ok(&o);
    next_ok(g);
    f.now = T0 + 500; /* past the reserve: a second write, second slot */
    uint64_t last = next_ok(g);
    cr_assert_eq(idem_snowflake_free(g), 0);
    char buf[256];
    cr_assert_eq(read_file(path, buf, sizeof buf), 128u);
    cr_assert_eq(memcmp(buf, "idem-snowflake-hw 1 ", 20), 0);
    cr_assert_eq(memcmp(buf, buf + 64, 64), 0, "close wrote both slots");

    /* Tear slot 0: slot 1 still holds the mark. */
    buf[30] ^= 1;
    write_file(path, buf, 128);
    f.now = T0 + 500;
    g = open_ok(&o);
    cr_assert_gt(next_ok(g), last);
    idem_snowflake_free(g);

    /* Tear both: refused. */
    cr_assert_eq(read_file(path, buf, sizeof buf), 128u);
    buf[30] ^= 1;
    buf[64 + 30] ^= 1;
    write_file(path, buf, 128);
    cr_assert_eq(idem_snowflake_new(&o, &g), IDEM_ECORRUPT);
    idem_snowflake_free(g);
    remove_temp(path);
}

/* The mark is written before the IDs it covers: if it cannot be, no ID. */
Test(snowflake, state_file_write_failure_issues_nothing, .timeout = 10)
{
    idem_snowflake_opts o;
    struct fake f = {T0, 0, 0};
    fake_opts(&o, &f);
    o.state_file = "/dev/full"; /* reads zeros, writes fail with ENOSPC */
    idem_snowflake *g = open_ok(&o);
    uint64_t id = 99;
    cr_assert_eq(idem_snowflake_next(g, &id), IDEM_EIO);
    cr_assert_eq(id, 99u);
    cr_assert(strstr(idem_snowflake_errdetail(g), "/dev/full"));
    idem_snowflake_free(g);
}

/* A clock that never moves, behind by less than max_wait_ms: the wait
 * ends in an error instead of holding the generator forever. */
static void stuck_sleep(void *ctx, int64_t until_ms)
{
    (void)until_ms;
    ((struct fake *)ctx)->sleeps++;
}

Test(snowflake, stuck_clock_is_an_error, .timeout = 10)
{
    struct fake f = {T0, 0, 0};
    idem_snowflake_opts o;
    fake_opts(&o, &f);
    o.sleep = stuck_sleep;
    o.max_wait_ms = 50;
    idem_snowflake *g = open_ok(&o);
    next_ok(g);
    f.now = T0 - 10;
    uint64_t id;
    cr_assert_eq(idem_snowflake_next(g, &id), IDEM_ECLOCK);
    cr_assert(strstr(idem_snowflake_errdetail(g), "did not advance"), "%s",
              idem_snowflake_errdetail(g));
    cr_assert_gt(f.sleeps, 50u);
    f.now = T0 + 1;  /* the clock moves again: so does the generator */
    cr_assert_eq(idem_snowflake_next(g, &id), 0);
    idem_snowflake_free(g);
}
