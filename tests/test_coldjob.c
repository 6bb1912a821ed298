/* test_coldjob.c - key indexes built on a thread while the writer goes on.
 *
 * The stores here have a small hot budget (hot=64k, 1,365 keys) and small
 * segments (segment=16k, a few hundred keys), so that a segment's keys
 * leave RAM every few commits, and the writer is not behind when they do:
 * the job building the index runs while the test claims, syncs, sweeps,
 * closes or forks. Each test waits for a commit after which a job is
 * still running (it runs until the writer takes its result), then does
 * what it checks; the tests with hot=0 elsewhere (cold, conf_cold, model)
 * always find the writer behind, and wait for every job at once. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "local/log.h"

#define PER_BATCH 50
#define MAX_BATCHES 400

static char uri[4400];
static char *dir;

static void coldjob_init(void)
{
    dir = t_tmpdir();
    snprintf(uri, sizeof uri, "%s?hot=64k&segment=16k", t_local_uri(dir));
}

static void coldjob_fini(void)
{
    t_rmdir(dir);
    free(dir);
}

TestSuite(coldjob, .init = coldjob_init, .fini = coldjob_fini,
          .timeout = 120);

static void key_of(char *buf, size_t n, int b, int i)
{
    snprintf(buf, n, "job-%d-%d", b, i);
}

static int claim(idem_store *s, const char *k, idem_outcome *o)
{
    idem_key key = {k, strlen(k), NULL};
    return idem_claim(s, &key, NULL, o);
}

/* Batch b: PER_BATCH keys claimed and completed with their own names as
 * responses, then synced. */
static void fill_batch(idem_store *s, int b)
{
    for (int i = 0; i < PER_BATCH; i++) {
        char k[32];
        key_of(k, sizeof k, b, i);
        idem_outcome o;
        cr_assert_eq(claim(s, k, &o), 0);
        cr_assert_eq(o.kind, IDEM_NEW, "%s: kind %d", k, o.kind);
        cr_assert_eq(idem_complete(s, k, strlen(k), o.token, k, strlen(k),
                                   0),
                     0);
    }
    cr_assert_eq(idem_sync(s), 0);
}

/* Every key of batches [0, n) replays its own response. */
static void expect_batches(idem_store *s, int n)
{
    for (int b = 0; b < n; b++)
        for (int i = 0; i < PER_BATCH; i++) {
            char k[32];
            key_of(k, sizeof k, b, i);
            idem_outcome o;
            cr_assert_eq(claim(s, k, &o), 0, "%s", k);
            cr_assert_eq(o.kind, IDEM_REPLAY, "%s: kind %d", k, o.kind);
            cr_assert_eq(o.len, strlen(k));
            cr_assert_eq(memcmp(o.data, k, o.len), 0, "%s", k);
        }
}

static void expect_log_ok(idem_store *s)
{
    char why[256] = "";
    cr_assert_eq(idem__log_check(idem__engine_log(s), why, sizeof why), 0,
                 "%s", why);
}

/* Fill batches from *b on until a commit leaves a job running; *b is
 * then one past the last batch filled. */
static void fill_until_a_job_runs(idem_store *s, int *b)
{
    idem__log *lg = idem__engine_log(s);
    while (*b < MAX_BATCHES) {
        fill_batch(s, (*b)++);
        if (lg->job.running)
            return;
    }
    cr_assert_fail("no job ran past a commit in %d batches", MAX_BATCHES);
}

static int kix_exists(uint32_t id)
{
    char p[4400];
    struct stat st;
    snprintf(p, sizeof p, "%s/seg-%08u.kix", dir, (unsigned)id);
    return stat(p, &st) == 0;
}

Test(coldjob, keys_claimed_while_an_index_is_built_answer_exactly)
{
    idem_store *s = t_open(uri);
    int b = 0, seen = 0;
    while (b < 120) {
        fill_until_a_job_runs(s, &b);
        seen++;
        expect_log_ok(s);
        expect_batches(s, b);
    }
    cr_assert_geq(seen, 3);
    idem_stats st;
    cr_assert_eq(idem_stats_read(s, &st, sizeof st), 0);
    cr_assert_gt(st.cold_segments, 0);
    cr_assert_eq(idem_close(s), 0);
    s = t_open(uri);
    expect_batches(s, b);
    cr_assert_eq(idem_close(s), 0);
}

/* Close takes what the job wrote as it is: an index beside a sealed
 * segment, which the next open loads. */
Test(coldjob, a_store_closed_while_an_index_is_built_opens_with_it)
{
    idem_store *s = t_open(uri);
    int b = 0;
    fill_until_a_job_runs(s, &b);
    uint32_t id = idem__engine_log(s)->job.sg.id;
    cr_assert_eq(idem_close(s), 0);
    cr_assert(kix_exists(id), "no index of segment %u", (unsigned)id);
    s = t_open(uri);
    idem__log *lg = idem__engine_log(s);
    cr_assert_gt(lg->ncold, 0);
    cr_assert_geq(lg->segs[lg->ncold - 1].id, id);
    expect_log_ok(s);
    expect_batches(s, b);
    cr_assert_eq(idem_close(s), 0);
}

/* A sweep that drops the segment a job indexes (every segment has
 * expired) waits for the job, then deletes what it wrote with the
 * segment: no index outlives its segment, and the mappings the job
 * reads (its segment, the older segments' indexes) stay until it is
 * done. */
Test(coldjob, a_segment_dropped_while_its_index_is_built_leaves_none)
{
    idem_store *s = t_open(uri);
    idem__log *lg = idem__engine_log(s);
    int b = 0;
    fill_until_a_job_runs(s, &b);
    uint32_t id = lg->job.sg.id;
    t_clock_ms += 30LL * 24 * 3600 * 1000;
    uint64_t expired;
    cr_assert_eq(idem_sweep(s, 0, &expired), 0);
    cr_assert_gt(lg->segs[0].id, id);
    cr_assert(!lg->job.running);
    cr_assert(!kix_exists(id), "segment %u dropped, its index left",
              (unsigned)id);
    expect_log_ok(s);
    cr_assert_eq(idem_close(s), 0);
}

/* A fork child's close must not wait for the parent's job (its thread
 * is not in the child: joining it would wait for ever), and the parent
 * goes on as if nothing happened. */
Test(coldjob, a_fork_child_closes_without_the_parents_job)
{
    idem_store *s = t_open(uri);
    int b = 0;
    fill_until_a_job_runs(s, &b);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        alarm(60);
        _exit(idem_close(s) == 0 ? 0 : 1);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "the child's close hung or failed (status %d)", st);
    fill_batch(s, b++);
    expect_batches(s, b);
    cr_assert_eq(idem_close(s), 0);
    s = t_open(uri);
    expect_batches(s, b);
    cr_assert_eq(idem_close(s), 0);
}

/* A key index that cannot be written leaves no temporary behind (it
 * would hold the room a full disk needs back), and its segment stays
 * hot until a later commit writes the index. With hot=0 and a segment a
 * commit the writer is always behind, so the job is waited for in the
 * commit that starts it, and the write that fails is the index's. */
Test(coldjob, an_index_that_cannot_be_written_leaves_no_temporary)
{
    char u[4400];
    snprintf(u, sizeof u, "%s?hot=0&segment=1", t_local_uri(dir));
    idem_store *s = t_open(u);
    fill_batch(s, 0);
    fill_batch(s, 1);
    for (int i = 0; i < PER_BATCH; i++) {
        char k[32];
        key_of(k, sizeof k, 2, i);
        idem_outcome o;
        cr_assert_eq(claim(s, k, &o), 0);
    }
    t_fail_errno = ENOSPC;
    t_fail_write_after = 1;  /* the group's write, then the index's */
    int rc = idem_sync(s);
    t_fail_write_after = -1;
    cr_assert_eq(rc, 0, "%s", idem_errdetail(s));
    cr_assert(strstr(idem_errdetail(s), ".kix: cannot write"), "%s",
              idem_errdetail(s));
    cr_assert_eq(t_sh("ls '%s' | grep -q '\\.tmp$'", dir), 1,
                 "a temporary was left behind");
    fill_batch(s, 3);
    expect_batches(s, 2);
    cr_assert_eq(idem_close(s), 0);
    s = t_open(u);
    expect_batches(s, 2);
    cr_assert_eq(idem_close(s), 0);
}
