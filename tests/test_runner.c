/* tests/test_runner.c - the stream runner. The API it brought
 * (IDEM_CLAIM_DONE, idem_scan, idem_import) is in the conformance suite;
 * the kill -9 side of the runner is tested through the CLI
 * (test_cli_crash.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "redis_harness.h"

static idem_msg msg(const char *key)
{
    return (idem_msg){.key = key, .keylen = strlen(key), .msg = key,
                      .msglen = strlen(key)};
}

/* A handler scripted by key: "done:*", "fail:*", "retry:*" (retryable
 * every time), "flaky:*" (retryable on attempt 1), "stop:*" (breaks). */
typedef struct script {
    int calls, committed_calls;
    size_t last_commit;
    int commit_rc;
    idem_store *s;  /* for commit steps that put a checkpoint */
    int asked, stop_at;  /* the stop hook: asked so far; says stop when
                          * asked the stop_at-th time (0: never) */
} script;

static int scripted(void *ctx, idem_task *t, size_t n)
{
    script *sc = ctx;
    sc->calls++;
    for (size_t i = 0; i < n; i++) {
        const char *k = t[i].key;
        if (!strncmp(k, "stop:", 5))
            return IDEM_EIO;
        t[i].answer = !strncmp(k, "fail:", 5)    ? IDEM_TASK_FAIL
                      : !strncmp(k, "retry:", 6) ? IDEM_TASK_RETRY
                      : !strncmp(k, "flaky:", 6) && t[i].attempt == 1
                          ? IDEM_TASK_RETRY
                          : IDEM_TASK_DONE;
        t[i].data = t[i].answer == IDEM_TASK_DONE ? "yes" : "no";
        t[i].len = t[i].answer == IDEM_TASK_DONE ? 3 : 2;
    }
    return 0;
}

static int on_commit(void *ctx, const idem_msg *m, size_t n)
{
    script *sc = ctx;
    (void)m;
    sc->committed_calls++;
    sc->last_commit = n;
    return sc->commit_rc;
}

static int stop_hook(void *ctx)
{
    script *sc = ctx;
    return sc->stop_at && ++sc->asked >= sc->stop_at;
}

static idem_runner *runner(idem_store *s, script *sc, int with_handler)
{
    idem_runner_opts o;
    idem_runner_opts_init(&o);
    o.handler = with_handler ? scripted : NULL;
    o.commit = on_commit;
    o.ctx = sc;
    o.backoff_ms = 1;
    o.stop = stop_hook;
    idem_runner *r;
    cr_assert_eq(idem_runner_new(s, &o, &r), 0);
    return r;
}

TestSuite(runner, .timeout = 120);

Test(runner, dedup_mode_marks_new_keys_done)
{
    idem_store *s = t_open("mem:");
    script sc = {0};
    idem_runner *r = runner(s, &sc, 0);
    idem_msg m[4] = {msg("a"), msg("b"), msg("a"), msg("c")};
    size_t done;
    cr_assert_eq(idem_runner_batch(r, m, 4, &done), 0);
    cr_assert_eq(done, 4);
    cr_assert_eq(m[0].result, IDEM_MSG_DONE);
    cr_assert_eq(m[2].result, IDEM_MSG_DUPLICATE);
    cr_assert_eq(m[2].first, 0);
    cr_assert_eq(sc.last_commit, 4);
    cr_assert_eq(idem_runner_batch(r, m, 2, &done), 0);
    cr_assert_eq(m[0].result, IDEM_MSG_REPLAY);
    idem_runner_free(r);
    idem_close(s);
}

Test(runner, handler_outcomes_and_retries)
{
    idem_store *s = t_open("mem:");
    script sc = {0};
    idem_runner *r = runner(s, &sc, 1);
    idem_msg m[4] = {msg("done:1"), msg("fail:1"), msg("retry:1"),
                     msg("flaky:1")};
    size_t done;
    cr_assert_eq(idem_runner_batch(r, m, 4, &done), 0);
    cr_assert_eq(done, 4);
    cr_assert_eq(m[0].result, IDEM_MSG_DONE);
    cr_assert(m[0].len == 3 && !memcmp(m[0].data, "yes", 3));
    cr_assert_eq(m[1].result, IDEM_MSG_FAILED);
    cr_assert_eq(m[2].result, IDEM_MSG_GAVE_UP);
    cr_assert_eq(m[2].attempt, 3, "three runs, three claims");
    cr_assert_eq(m[3].result, IDEM_MSG_DONE);
    cr_assert_eq(m[3].attempt, 2);
    cr_assert_eq(sc.calls, 3);
    idem_record rec;
    cr_assert_eq(idem_get(s, "retry:1", 7, &rec), 0);
    cr_assert(rec.state == IDEM_STATE_PENDING && rec.released);
    cr_assert_eq(idem_runner_batch(r, m, 2, &done), 0);
    cr_assert_eq(m[0].result, IDEM_MSG_REPLAY);
    cr_assert_eq(m[1].result, IDEM_MSG_REPLAY_FAILED);
    cr_assert(m[1].len == 2 && !memcmp(m[1].data, "no", 2));
    idem_runner_free(r);
    idem_close(s);
}

Test(runner, handler_error_commits_the_prefix_only)
{
    idem_store *s = t_open("mem:");
    script sc = {0};
    idem_runner *r = runner(s, &sc, 1);
    idem_msg m[3] = {msg("done:1"), msg("stop:1"), msg("done:2")};
    size_t done;
    cr_assert_eq(idem_runner_batch(r, m, 3, &done), IDEM_EIO);
    cr_assert_eq(done, 1);
    cr_assert_eq(sc.last_commit, 1);
    idem_record rec;
    cr_assert_eq(idem_get(s, "done:1", 6, &rec), 0);
    cr_assert_eq(rec.state, IDEM_STATE_DONE);
    /* done:2 was answered but lies after the break: released, not done */
    cr_assert_eq(idem_get(s, "done:2", 6, &rec), 0);
    cr_assert(rec.state == IDEM_STATE_PENDING && rec.released);
    idem_msg again = msg("done:2");
    cr_assert_eq(idem_runner_batch(r, &again, 1, &done), 0);
    cr_assert_eq(again.result, IDEM_MSG_DONE);
    cr_assert_eq(again.attempt, 2, "a new token for the second run");
    idem_runner_free(r);
    idem_close(s);
}

/* A stop asked for during the backoff before a retry (ten minutes here)
 * ends the batch at once: what was settled before the retry is
 * committed, the claims held behind it are given back, and the store
 * goes on. */
Test(runner, a_stop_ends_the_wait_before_a_retry, .timeout = 120)
{
    idem_store *s = t_open("mem:");
    script sc = {.stop_at = 3};
    idem_runner_opts o;
    idem_runner_opts_init(&o);
    o.handler = scripted;
    o.commit = on_commit;
    o.stop = stop_hook;
    o.ctx = &sc;
    o.backoff_ms = 600000;
    idem_runner *r;
    cr_assert_eq(idem_runner_new(s, &o, &r), 0);
    idem_msg m[3] = {msg("done:1"), msg("retry:1"), msg("done:2")};
    size_t done;
    cr_assert_eq(idem_runner_batch(r, m, 3, &done), IDEM_ESTOPPED);
    cr_assert_eq(sc.asked, 3, "the hook is asked while the runner waits");
    cr_assert_eq(done, 1);
    cr_assert_eq(sc.last_commit, 1);
    idem_record rec;
    cr_assert_eq(idem_get(s, "done:1", 6, &rec), 0);
    cr_assert_eq(rec.state, IDEM_STATE_DONE);
    for (int i = 1; i < 3; i++) {
        cr_assert_eq(idem_get(s, m[i].key, m[i].keylen, &rec), 0);
        cr_assert(rec.state == IDEM_STATE_PENDING && rec.released,
                  "%s is not given back", (const char *)m[i].key);
    }
    sc.stop_at = 0;
    idem_msg again = msg("done:2");
    cr_assert_eq(idem_runner_batch(r, &again, 1, &done), 0);
    cr_assert_eq(again.result, IDEM_MSG_DONE);
    idem_runner_free(r);
    idem_close(s);
}

/* Options of version 2, from a program built before the stop hook: taken,
 * and the bytes past them (where the hook is now) are not read. */
Test(runner, options_of_version_2_are_still_taken)
{
    idem_store *s = t_open("mem:");
    idem_runner_opts o;
    idem_runner_opts_init(&o);
    o.version = 2;
    memset(&o.stop, 0xa5, sizeof o.stop);  /* not a function */
    o.handler = scripted;
    o.ctx = &(script){0};
    o.backoff_ms = 1;
    idem_runner *r;
    cr_assert_eq(idem_runner_new(s, &o, &r), 0);
    idem_msg m = msg("flaky:1");  /* a retry: the runner waits */
    cr_assert_eq(idem_runner_batch(r, &m, 1, NULL), 0);
    cr_assert_eq(m.result, IDEM_MSG_DONE);
    idem_runner_free(r);
    o.version = 1;
    cr_assert_eq(idem_runner_new(s, &o, &r), IDEM_EINVAL);
    idem_close(s);
}

/* A store on the real clock, as a second worker would have it. */
static idem_store *open_real(const char *uri)
{
    idem_opts o;
    idem_opts_init(&o);
    idem_store *s;
    int rc = idem_open(uri, &o, &s);
    cr_assert_eq(rc, 0, "%s: %s", uri, idem_errdetail(s));
    return s;
}

/* Another worker (a second handle) holds k for ten minutes; the runner
 * waiting for it stops when the hook says so: a, before k, is committed,
 * b, behind it, was given back, and the other worker's claim is untouched
 * (it completes k with its token). */
Test(runner, a_stop_ends_the_wait_for_a_key_another_worker_holds,
     .timeout = 120)
{
    char uri[512];
    snprintf(uri, sizeof uri, "redis://%s?prefix=%s", th_redis_addr(),
             th_prefix());
    idem_store *other = open_real(uri), *s = open_real(uri);
    idem_outcome held;
    idem_claim_opts co = {600000, 0};
    cr_assert_eq(idem_claim(other, &(idem_key){"done:k", 6, NULL}, &co,
                            &held), 0);
    cr_assert_eq(held.kind, IDEM_NEW);
    script sc = {.stop_at = 5};
    idem_runner *r = runner(s, &sc, 1);
    idem_msg m[3] = {msg("done:a"), msg("done:k"), msg("done:b")};
    size_t done;
    cr_assert_eq(idem_runner_batch(r, m, 3, &done), IDEM_ESTOPPED);
    cr_assert_eq(sc.asked, 5, "the hook is asked while the runner waits");
    cr_assert_eq(done, 1);
    cr_assert_eq(m[0].result, IDEM_MSG_DONE);
    idem_record rec;
    cr_assert_eq(idem_get(s, "done:b", 6, &rec), 0);
    cr_assert(rec.state == IDEM_STATE_PENDING && rec.released);
    cr_assert_eq(idem_complete(other, "done:k", 6, held.token, "theirs", 6,
                               0), 0, "%s", idem_errdetail(other));
    cr_assert_eq(idem_sync(other), 0);
    sc.stop_at = 0;
    cr_assert_eq(idem_runner_batch(r, m, 3, &done), 0);
    cr_assert_eq(m[1].result, IDEM_MSG_REPLAY);
    cr_assert_eq(m[2].result, IDEM_MSG_DONE);
    idem_runner_free(r);
    idem_close(s);
    idem_close(other);
    th_shared_stop();
}

Test(runner, takes_over_a_dead_processes_claim_on_an_exclusive_store)
{
    idem_store *s = t_open("mem:");
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &(idem_key){"done:x", 6, NULL}, NULL, &o), 0);
    script sc = {0};
    idem_runner *r = runner(s, &sc, 1);
    idem_msg m = msg("done:x");
    size_t done;
    cr_assert_eq(idem_runner_batch(r, &m, 1, &done), 0);
    cr_assert_eq(m.result, IDEM_MSG_DONE);
    cr_assert_gt(m.token, o.token);
    cr_assert_eq(m.attempt, 2);
    idem_runner_free(r);
    idem_close(s);
}

Test(runner, a_failed_commit_commits_nothing)
{
    char *dir = t_tmpdir();
    idem_store *s = t_open(t_local_uri(dir));
    script sc = {.commit_rc = IDEM_EIO};
    idem_runner *r = runner(s, &sc, 0);
    idem_msg m = msg("a");
    cr_assert_eq(idem_runner_batch(r, &m, 1, NULL), IDEM_EIO);
    cr_assert_neq(idem_sync(s), 0, "the handle refuses to commit it");
    idem_runner_free(r);
    idem_close(s);
    s = t_open(t_local_uri(dir));
    idem_record rec;
    cr_assert_eq(idem_get(s, "a", 1, &rec), IDEM_ENOTFOUND);
    idem_close(s);
    t_rmdir(dir);
    free(dir);
}

/* ------------------------------------------------------------------------
 * Outcomes never commit without their checkpoint */

/* A handler that spends handler_ms of the injected clock per call: k0
 * asks for a retry the first time, everything else fails for good. */
static int64_t handler_ms;

static int slow_handler(void *ctx, idem_task *t, size_t n)
{
    script *sc = ctx;
    sc->calls++;
    t_clock_ms += handler_ms;
    for (size_t i = 0; i < n; i++) {
        int retry = sc->calls == 1 && !strcmp(t[i].key, "k0");
        t[i].answer = retry ? IDEM_TASK_RETRY : IDEM_TASK_FAIL;
        t[i].data = "no";
        t[i].len = 2;
    }
    return 0;
}

/* A commit step that puts the committed count as the checkpoint. */
static int checkpoint_count(void *ctx, const idem_msg *m, size_t n)
{
    script *sc = ctx;
    (void)m;
    char text[32];
    int k = snprintf(text, sizeof text, "%zu", n);
    return idem_checkpoint_put(sc->s, "ck", text, (size_t)k);
}

static idem_runner *checkpointing_runner(idem_store *s, script *sc,
                                         idem_handler_fn handler)
{
    sc->s = s;
    idem_runner_opts ro;
    idem_runner_opts_init(&ro);
    ro.handler = handler;
    ro.commit = checkpoint_count;
    ro.ctx = sc;
    ro.backoff_ms = 1;
    idem_runner *r;
    cr_assert_eq(idem_runner_new(s, &ro, &r), 0);
    return r;
}

/* After a reopen: every key recorded done or failed lies within the
 * checkpoint's count, and every key within it is recorded. */
static void expect_agree(const char *uri, idem_msg *m, size_t n)
{
    idem_store *s = t_open(uri);
    const void *blob;
    size_t len, upto = 0;
    if (idem_checkpoint_get(s, "ck", &blob, &len) == 0) {
        char text[32];
        snprintf(text, sizeof text, "%.*s", (int)len, (const char *)blob);
        upto = strtoul(text, NULL, 10);
    }
    for (size_t i = 0; i < n; i++) {
        idem_record rec;
        int rc = idem_get(s, m[i].key, m[i].keylen, &rec);
        int settled = rc == 0 && rec.state != IDEM_STATE_PENDING;
        int lost = m[i].result == IDEM_MSG_INVALID;
        cr_assert(settled == (i < upto && !lost),
                  "%s: settled=%d but the checkpoint covers %zu messages",
                  (const char *)m[i].key, settled, upto);
    }
    idem_close(s);
}

/* ttl = lease = 1 s; handler rounds of `ms` of the injected clock, k0
 * retried once. Returns the batch's result; the store and the
 * checkpoint must agree after a reopen. */
static int clocked_batch(int64_t ms, idem_msg *m)
{
    char *dir = t_tmpdir();
    idem_opts o = t_options();
    o.ttl_ms = o.lease_ms = 1000;
    idem_store *s;
    cr_assert_eq(idem_open(t_local_uri(dir), &o, &s), 0);
    script sc = {0};
    idem_runner *r = checkpointing_runner(s, &sc, slow_handler);
    m[0] = msg("k0");
    m[1] = msg("k1");
    handler_ms = ms;
    size_t done;
    int rc = idem_runner_batch(r, m, 2, &done);
    cr_assert_eq(done, rc ? done : 2);
    idem_runner_free(r);
    cr_assert_eq(idem_close(s), 0);
    expect_agree(t_local_uri(dir), m, 2);
    t_rmdir(dir);
    free(dir);
    return rc;
}

/* Rounds of 0.6 s: k1's claim (lease = ttl = 1 s) would run out while
 * k0 is retried; it is renewed, and both failures commit with the
 * checkpoint. */
Test(runner, claims_are_renewed_across_rounds)
{
    idem_msg m[2];
    cr_assert_eq(clocked_batch(600, m), 0);
    cr_assert_eq(m[0].result, IDEM_MSG_FAILED);
    cr_assert_eq(m[1].result, IDEM_MSG_FAILED);
}

/* One round of 1.2 s, longer than the lease and the TTL, as a stalled
 * worker sees it: both claims are gone. Neither is committed as failed,
 * both say IDEM_ELOST, and the batch goes on to its end. */
Test(runner, claims_lost_in_a_stall_are_dropped_not_committed)
{
    idem_msg m[2];
    cr_assert_eq(clocked_batch(1200, m), 0);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(m[i].result, IDEM_MSG_INVALID);
        cr_assert_eq(m[i].status, IDEM_ELOST);
    }
}

/* An allocation or a write that fails at any point of a batch: whatever
 * the batch returns, after close and reopen the store's records and its
 * checkpoint agree. */
static void fail_each_point(long *knob)
{
    for (long at = 0; at < 400; at++) {
        char *dir = t_tmpdir();
        idem_store *s = t_open(t_local_uri(dir));
        script sc = {0};
        idem_runner *r = runner(s, &sc, 1);
        idem_msg warm = msg("done:w");
        cr_assert_eq(idem_runner_batch(r, &warm, 1, NULL), 0);
        script sc2 = {0};
        idem_runner *r2 = checkpointing_runner(s, &sc2, scripted);
        idem_msg m[5] = {msg("done:1"), msg("flaky:2"), msg("fail:3"),
                         msg("done:4"), msg("done:1")};
        *knob = at;
        int rc = idem_runner_batch(r2, m, 5, NULL);
        *knob = -1;
        idem_runner_free(r);
        idem_runner_free(r2);
        idem_close(s);
        expect_agree(t_local_uri(dir), m, 4);
        t_rmdir(dir);
        free(dir);
        if (rc == 0)
            return;  /* past the last failure point */
    }
    cr_assert_fail("the batch never succeeded");
}

Test(runner, a_failed_allocation_anywhere_commits_nothing_unchecked)
{
    fail_each_point(&t_fail_alloc_after);
}

Test(runner, a_failed_write_anywhere_commits_nothing_unchecked)
{
    fail_each_point(&t_fail_write_after);
}

/* A commit step that ticks the runner (as a handler would) is not run
 * again from inside itself: the tick does nothing there. */
static idem_runner *ticking;

static int tick_from_commit(void *ctx, const idem_msg *m, size_t n)
{
    script *sc = ctx;
    (void)m;
    sc->committed_calls++;
    sc->last_commit = n;
    return idem_runner_tick(ticking);
}

static int ticking_handler(void *ctx, idem_task *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        t[i].answer = IDEM_TASK_DONE;
        t[i].data = "yes";
        t[i].len = 3;
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
        int rc = idem_runner_tick(ticking);
        if (rc)
            return rc;
    }
    (void)ctx;
    return 0;
}

Test(runner, a_tick_from_the_commit_step_does_nothing)
{
    idem_store *s = t_open("mem:");
    script sc = {0};
    idem_runner_opts ro;
    idem_runner_opts_init(&ro);
    ro.handler = ticking_handler;
    ro.commit = tick_from_commit;
    ro.ctx = &sc;
    ro.commit_interval_ms = 1;  /* commits at every tick */
    cr_assert_eq(idem_runner_new(s, &ro, &ticking), 0);
    idem_msg m[3] = {msg("a"), msg("b"), msg("c")};
    size_t done;
    cr_assert_eq(idem_runner_batch(ticking, m, 3, &done), 0);
    cr_assert_eq(done, 3);
    cr_assert_eq(sc.last_commit, 3);
    cr_assert_geq(sc.committed_calls, 3, "ticks committed");
    idem_runner_free(ticking);
    idem_close(s);
}
