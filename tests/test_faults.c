/* tests/test_faults.c - out of memory, full disks and failing disks.
 *
 * Every allocation, write and fdatasync libidem makes goes through
 * tests/fault.c, which can fail the Nth one. For every N across a whole
 * cycle the library must return an error (never crash, never leak: the
 * ASan run checks), keep the handle usable after ENOMEM, and lose nothing
 * that an earlier sync reported durable. The _cold variants run with no
 * hot budget and a segment per commit, so that every key goes through a
 * cold segment's key index and the filters in front of them. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum { KEYS = 16 };

static char names[KEYS][16];
static idem_key keys[KEYS];

/* "" or the _cold variants' "?hot=0&segment=1". */
static const char *query = "";

static const char *store_uri(const char *dir)
{
    static char uri[4400];
    snprintf(uri, sizeof uri, "%s%s", t_local_uri(dir), query);
    return uri;
}

static void make_keys(int batch)
{
    for (int i = 0; i < KEYS; i++) {
        snprintf(names[i], sizeof names[i], "b%d-k%d", batch, i);
        keys[i] = (idem_key){names[i], strlen(names[i]), NULL};
    }
}

/* Claim, complete, checkpoint and sync one batch; the first error. */
static int cycle(idem_store *s, int batch)
{
    idem_outcome outs[KEYS];
    idem_completion items[KEYS];
    int st[KEYS];
    make_keys(batch);
    int rc = idem_claim_many(s, keys, KEYS, NULL, outs, IDEM_NOSYNC);
    size_t m = 0;
    for (int i = 0; !rc && i < KEYS; i++)
        if (outs[i].kind == IDEM_NEW)
            items[m++] = (idem_completion){names[i], strlen(names[i]),
                                           outs[i].token, names[i],
                                           strlen(names[i]), 0};
    if (!rc)
        rc = idem_checkpoint_put(s, "pos", &batch, sizeof batch);
    if (!rc)
        rc = idem_complete_many(s, items, m, st, 0);
    return rc;
}

/* Finish batch `batch` after a failure: claim what is free, complete what
 * this process holds (the token is in the record), sync. */
static void finish(idem_store *s, int batch)
{
    idem_outcome outs[KEYS];
    make_keys(batch);
    cr_assert_eq(idem_claim_many(s, keys, KEYS, NULL, outs, IDEM_NOSYNC), 0,
                 "%s", idem_errdetail(s));
    for (int i = 0; i < KEYS; i++) {
        idem_record r;
        cr_assert_eq(idem_get(s, names[i], strlen(names[i]), &r), 0);
        if (r.state == IDEM_STATE_PENDING)
            cr_assert_eq(idem_complete(s, names[i], strlen(names[i]),
                                       r.token, names[i], strlen(names[i]),
                                       0),
                         0, "%s", idem_errdetail(s));
    }
    cr_assert_eq(idem_sync(s), 0);
}

static void expect_done(idem_store *s, int batch)
{
    make_keys(batch);
    for (int i = 0; i < KEYS; i++) {
        idem_record r;
        cr_assert_eq(idem_get(s, names[i], strlen(names[i]), &r), 0,
                     "%s missing", names[i]);
        cr_assert_eq(r.state, IDEM_STATE_DONE, "%s", names[i]);
        cr_assert(r.len == strlen(names[i]) &&
                  !memcmp(r.data, names[i], r.len));
    }
}

static void every_allocation_fails_once(void)
{
    int clean = 0;
    long tried = 0;
    for (long n = 0; !clean && n < 100000; n++) {
        char *dir = t_tmpdir();
        idem_store *s = t_open(store_uri(dir));
        /* A fresh store: the first batch allocates every structure. */
        t_fail_alloc_after = n;
        int rc = cycle(s, 0);
        if (!rc)
            rc = cycle(s, 1);
        clean = t_fail_alloc_after >= 0;  /* never tripped: all covered */
        t_fail_alloc_after = -1;
        cr_assert(rc == 0 || rc == IDEM_ENOMEM, "n=%ld: rc %d", n, rc);
        if (rc) {
            cr_assert(strstr(idem_errdetail(s), "memory"), "n=%ld: %s", n,
                      idem_errdetail(s));
            finish(s, 0);  /* the handle is still good */
            finish(s, 1);
        }
        tried = n + 1;
        cr_assert_eq(idem_close(s), 0);
        s = t_open(store_uri(dir));
        expect_done(s, 0);
        expect_done(s, 1);
        idem_close(s);
        t_rmdir(dir);
        free(dir);
    }
    cr_assert(clean, "allocation count did not converge");
    cr_assert_gt(tried, 5, "too few allocations seen: %ld", tried);
    cr_log_info("failed each of %ld allocations once", tried - 1);
}

Test(faults, every_allocation_fails_once, .timeout = 300)
{
    every_allocation_fails_once();
}

Test(faults, every_allocation_fails_once_cold, .timeout = 600)
{
    query = "?hot=0&segment=1";
    every_allocation_fails_once();
}

static void every_allocation_fails_once_in_open(void)
{
    char *dir = t_tmpdir();
    idem_store *s = t_open(store_uri(dir));
    cr_assert_eq(cycle(s, 0), 0);
    cr_assert_eq(cycle(s, 1), 0);
    idem_close(s);
    int clean = 0;
    for (long n = 0; !clean && n < 10000; n++) {
        idem_opts o = t_options();
        t_fail_alloc_after = n;
        int rc = idem_open(store_uri(dir), &o, &s);
        clean = t_fail_alloc_after >= 0;
        t_fail_alloc_after = -1;
        cr_assert(rc == 0 || rc == IDEM_ENOMEM, "n=%ld: rc %d", n, rc);
        idem_close(s);
    }
    s = t_open(store_uri(dir));
    expect_done(s, 0);
    expect_done(s, 1);
    idem_close(s);
    t_rmdir(dir);
    free(dir);
}

Test(faults, every_allocation_fails_once_in_open, .timeout = 300)
{
    every_allocation_fails_once_in_open();
}

Test(faults, every_allocation_fails_once_in_open_cold, .timeout = 300)
{
    query = "?hot=0&segment=1";
    every_allocation_fails_once_in_open();
}

/* Fail the nth write (or fdatasync) with err during five batches; every
 * batch synced before the failure must survive a reopen. */
static void io_fault(long *counter, long n, int err, int code)
{
    char *dir = t_tmpdir();
    idem_store *s = t_open(store_uri(dir));
    t_fail_errno = err;
    *counter = n;
    int rc = 0, synced = 0;
    for (int b = 0; b < 5 && !rc; b++) {
        rc = cycle(s, b);
        synced += rc == 0;
    }
    int tripped = *counter < 0;
    *counter = -1;
    /* With a segment per commit and cold segments the failed write may
     * be of a key index, derived data (the segment stays hot, nothing
     * fails), or a new segment's (as in segment_creation_fails below:
     * that commit fails, the log is not broken). */
    cr_assert(!tripped || rc || *query, "n=%ld: nothing failed", n);
    if (tripped && rc) {
        cr_assert_eq(rc, code, "n=%ld: rc %d: %s", n, rc, idem_errdetail(s));
        cr_assert(strstr(idem_errdetail(s), strerror(err)), "%s",
                  idem_errdetail(s));
        /* Broken: further writes are refused with the same error. */
        int again = cycle(s, 9);
        cr_assert(again == code || (*query && again == 0), "rc %d", again);
    }
    idem_close(s);
    s = t_open(store_uri(dir));
    for (int b = 0; b < synced; b++)
        expect_done(s, b);
    /* The store still works after the reopen. */
    cr_assert_eq(cycle(s, 7), 0, "%s", idem_errdetail(s));
    idem_close(s);
    t_rmdir(dir);
    free(dir);
}

Test(faults, write_fails_enospc, .timeout = 120)
{
    for (long n = 0; n < 8; n++)
        io_fault(&t_fail_write_after, n, ENOSPC, IDEM_ENOSPC);
}

Test(faults, write_fails_eio, .timeout = 120)
{
    for (long n = 0; n < 8; n++)
        io_fault(&t_fail_write_after, n, EIO, IDEM_EIO);
}

Test(faults, fdatasync_fails_eio, .timeout = 120)
{
    for (long n = 0; n < 8; n++)
        io_fault(&t_fail_sync_after, n, EIO, IDEM_EIO);
}

Test(faults, write_and_sync_fail_cold, .timeout = 300)
{
    query = "?hot=0&segment=1";
    for (long n = 0; n < 24; n++) {
        io_fault(&t_fail_write_after, n, ENOSPC, IDEM_ENOSPC);
        io_fault(&t_fail_sync_after, n, EIO, IDEM_EIO);
    }
}

Test(faults, segment_creation_fails, .timeout = 120)
{
    /* Small segments: the failing write may be a new segment's header. */
    for (long n = 0; n < 12; n++) {
        char *dir = t_tmpdir();
        idem_opts o = t_options();
        o.segment_bytes = 4096;
        idem_store *s;
        cr_assert_eq(idem_open(store_uri(dir), &o, &s), 0);
        t_fail_errno = ENOSPC;
        t_fail_write_after = n;
        int rc = 0, synced = 0;
        for (int b = 0; b < 8 && !rc; b++) {
            rc = cycle(s, b);
            synced += rc == 0;
        }
        t_fail_write_after = -1;
        cr_assert(rc == 0 || rc == IDEM_ENOSPC, "rc %d", rc);
        idem_close(s);
        cr_assert_eq(idem_open(store_uri(dir), &o, &s), 0, "%s",
                     idem_errdetail(s));
        for (int b = 0; b < synced; b++)
            expect_done(s, b);
        idem_close(s);
        t_rmdir(dir);
        free(dir);
    }
}

Test(faults, close_reports_a_broken_store, .timeout = 60)
{
    char *dir = t_tmpdir();
    idem_store *s = t_open(store_uri(dir));
    cr_assert_eq(cycle(s, 0), 0);
    t_fail_errno = EIO;
    t_fail_sync_after = 0;
    cr_assert_eq(cycle(s, 1), IDEM_EIO);
    t_fail_sync_after = -1;
    /* Its changes never reached the disk: close must not return 0. */
    cr_assert_eq(idem_close(s), IDEM_EIO);
    s = t_open(store_uri(dir));
    expect_done(s, 0);
    idem_close(s);
    t_rmdir(dir);
    free(dir);
}

/* cycle(), its sync started rather than whole; each started one waited
 * for before the next cycle's first write would (the stream loop's
 * order). The first error, with the batches known durable in *synced. */
static int started_cycles(idem_store *s, int n, int *synced)
{
    int rc = 0;
    for (int b = 0; b < n && !rc; b++) {
        make_keys(b);
        idem_outcome outs[KEYS];
        rc = idem_claim_many(s, keys, KEYS, NULL, outs, IDEM_NOSYNC);
        idem_completion items[KEYS];
        int st[KEYS];
        for (int i = 0; i < KEYS; i++)
            items[i] = (idem_completion){names[i], strlen(names[i]),
                                         outs[i].token, names[i],
                                         strlen(names[i]), 0};
        rc = rc ? rc : idem_complete_many(s, items, KEYS, st, IDEM_NOSYNC);
        rc = rc ? rc : idem_sync_start(s);
        rc = rc ? rc : idem_sync_wait(s);
        *synced += rc == 0;
    }
    return rc;
}

/* The fdatasync of a started sync (on the handle's thread) fails: its
 * wait, or the call that waits for it, reports it; every wait after it
 * reports it too, so that nothing more is acknowledged; close says so;
 * what was waited for before survives a reopen. */
Test(faults, a_started_sync_that_fails_is_reported_by_every_wait,
     .timeout = 60)
{
    for (long n = 0; n < 5; n++) {  /* five cycles: five fdatasyncs */
        char *dir = t_tmpdir();
        idem_store *s = t_open(store_uri(dir));
        int synced = 0;
        t_fail_errno = EIO;
        t_fail_sync_after = n;
        int rc = started_cycles(s, 5, &synced);
        int tripped = t_fail_sync_after < 0;
        t_fail_sync_after = -1;
        cr_assert(tripped && rc == IDEM_EIO, "n=%ld: rc %d", n, rc);
        cr_assert_eq(idem_sync_wait(s), IDEM_EIO, "n=%ld", n);
        cr_assert_eq(idem_sync_start(s), IDEM_EIO, "n=%ld", n);
        cr_assert_eq(idem_sync_wait(s), IDEM_EIO, "n=%ld", n);
        cr_assert_eq(idem_sync(s), IDEM_EIO, "n=%ld", n);
        cr_assert_eq(idem_close(s), IDEM_EIO, "n=%ld", n);
        s = t_open(store_uri(dir));
        for (int b = 0; b < synced; b++)
            expect_done(s, b);
        idem_close(s);
        t_rmdir(dir);
        free(dir);
    }
}

/* A record that cannot be read (here: its segment cannot be mapped) is an
 * error, never "no record": a claim answering NEW for a key that is DONE
 * would run its effects twice. */
Test(faults, unreadable_record_is_not_absent, .timeout = 60)
{
    char *dir = t_tmpdir();
    idem_store *s = t_open(store_uri(dir));
    idem_key k = {"done", 4, NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0);
    cr_assert_eq(idem_complete(s, "done", 4, o.token, "resp", 4, 0), 0);
    cr_assert_eq(idem_sync(s), 0);
    t_fail_mmap_after = 0;
    int rc = idem_claim(s, &k, NULL, &o);
    int tripped = t_fail_mmap_after < 0;
    t_fail_mmap_after = -1;
    cr_assert(tripped, "the claim read nothing through a mapping");
    cr_assert_eq(rc, IDEM_ENOMEM, "rc %d, kind %d: %s", rc, o.kind,
                 idem_errdetail(s));
    idem_record r;
    t_fail_mmap_after = 0;
    cr_assert_eq(idem_get(s, "done", 4, &r), IDEM_ENOMEM);
    t_fail_mmap_after = -1;
    /* The handle is still good. */
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0, "%s", idem_errdetail(s));
    cr_assert_eq(o.kind, IDEM_REPLAY);
    cr_assert(o.len == 4 && memcmp(o.data, "resp", 4) == 0);
    idem_close(s);
    t_rmdir(dir);
    free(dir);
}

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    cr_assert(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

Test(faults, mapping_fails_in_open_and_check, .timeout = 60)
{
    char *dir = t_tmpdir();
    idem_opts o = t_options();
    o.segment_bytes = 4096;  /* eight batches fill more than one */
    idem_store *s;
    cr_assert_eq(idem_open(store_uri(dir), &o, &s), 0);
    for (int b = 0; b < 8; b++)
        cr_assert_eq(cycle(s, b), 0);
    idem_stats st;
    cr_assert_eq(idem_stats_get(s, &st), 0);
    cr_assert_gt(st.segments, 1);
    idem_close(s);
    int fds = open_fds();
    /* One mapping per segment: fail each. */
    for (long n = 0; n < (long)st.segments; n++) {
        t_fail_mmap_after = n;
        int rc = idem_open(store_uri(dir), &o, &s);
        t_fail_mmap_after = -1;
        cr_assert_eq(rc, IDEM_ENOMEM, "n=%ld: %s", n, idem_errdetail(s));
        idem_close(s);
        cr_assert_eq(open_fds(), fds, "n=%ld: a file was left open", n);
        t_fail_mmap_after = n;
        rc = idem_check(store_uri(dir), NULL);
        t_fail_mmap_after = -1;
        cr_assert_eq(rc, IDEM_ENOMEM, "n=%ld", n);
        cr_assert_eq(open_fds(), fds, "n=%ld: check left a file open", n);
    }
    s = t_open(store_uri(dir));
    for (int b = 0; b < 8; b++)
        expect_done(s, b);
    idem_close(s);
    t_rmdir(dir);
    free(dir);
}

Test(faults, segment_creation_sync_fails, .timeout = 120)
{
    /* Small segments: the failing fdatasync may be a new segment's. The
     * error must say what happened (EIO), not that the disk is full. */
    int seen_rotation_failure = 0;
    for (long n = 0; n < 12; n++) {
        char *dir = t_tmpdir();
        idem_opts o = t_options();
        o.segment_bytes = 4096;
        idem_store *s;
        cr_assert_eq(idem_open(store_uri(dir), &o, &s), 0);
        t_fail_errno = EIO;
        t_fail_sync_after = n;
        int rc = 0, synced = 0;
        for (int b = 0; b < 8 && !rc; b++) {
            rc = cycle(s, b);
            synced += rc == 0;
        }
        t_fail_sync_after = -1;
        cr_assert(rc == 0 || rc == IDEM_EIO, "n=%ld: rc %d: %s", n, rc,
                  idem_errdetail(s));
        if (rc) {
            cr_assert(strstr(idem_errdetail(s), strerror(EIO)), "n=%ld: %s",
                      n, idem_errdetail(s));
            seen_rotation_failure |= strstr(idem_errdetail(s), "create") != 0;
        }
        idem_close(s);
        cr_assert_eq(idem_open(store_uri(dir), &o, &s), 0, "%s",
                     idem_errdetail(s));
        for (int b = 0; b < synced; b++)
            expect_done(s, b);
        idem_close(s);
        t_rmdir(dir);
        free(dir);
    }
    cr_assert(seen_rotation_failure);
}

Test(faults, reads_after_a_failed_write_of_a_large_group, .timeout = 120)
{
    /* A group over the 4 MiB flush size reaches the file in several
     * writes. When a later one fails the store is broken for writes, but
     * what it answers for the keys of the group must still be right. */
    enum { N = 6, BIG = 1u << 20 };
    char *dir = t_tmpdir();
    idem_store *s = t_open(store_uri(dir));
    char *resp = malloc(BIG);
    cr_assert(resp);
    char key[N][16];
    t_fail_errno = EIO;
    t_fail_write_after = 1;  /* the first flush goes through */
    int rc = 0;
    for (int i = 0; i < N && !rc; i++) {
        snprintf(key[i], sizeof key[i], "big-%d", i);
        memset(resp, 'a' + i, BIG);
        idem_key k = {key[i], strlen(key[i]), NULL};
        idem_outcome o;
        rc = idem_claim(s, &k, NULL, &o);
        if (!rc)
            rc = idem_complete(s, key[i], strlen(key[i]), o.token, resp, BIG,
                               0);
    }
    if (!rc)
        rc = idem_sync(s);
    t_fail_write_after = -1;
    cr_assert_eq(rc, IDEM_EIO, "%s", idem_errdetail(s));
    for (int i = 0; i < N; i++) {
        idem_record r;
        rc = idem_get(s, key[i], strlen(key[i]), &r);
        cr_assert_eq(rc, 0, "%s: %s", key[i], idem_errdetail(s));
        cr_assert_eq(r.state, IDEM_STATE_DONE, "%s", key[i]);
        cr_assert_eq(r.len, BIG);
        const char *d = r.data;
        cr_assert(d[0] == 'a' + i && d[BIG - 1] == 'a' + i, "%s", key[i]);
    }
    idem_close(s);
    /* Nothing of the group was durable. */
    s = t_open(store_uri(dir));
    idem_record r;
    for (int i = 0; i < N; i++)
        cr_assert_eq(idem_get(s, key[i], strlen(key[i]), &r),
                     IDEM_ENOTFOUND);
    idem_close(s);
    free(resp);
    t_rmdir(dir);
    free(dir);
}
