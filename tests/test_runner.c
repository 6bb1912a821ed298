/* tests/test_runner.c - the stream runner. The API it brought
 * (IDEM_CLAIM_DONE, idem_scan, idem_import) is in the conformance suite;
 * the kill -9 side of the runner is tested through the CLI
 * (test_cli_crash.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

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

static idem_runner *runner(idem_store *s, script *sc, int with_handler)
{
    idem_runner_opts o;
    idem_runner_opts_init(&o);
    o.handler = with_handler ? scripted : NULL;
    o.commit = on_commit;
    o.ctx = sc;
    o.backoff_ms = 1;
    idem_runner *r;
    cr_assert_eq(idem_runner_new(s, &o, &r), 0);
    return r;
}

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
    cr_assert(rec.state == IDEM_PENDING && rec.released);
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
    cr_assert_eq(rec.state, IDEM_DONE);
    /* done:2 was answered but lies after the break: released, not done */
    cr_assert_eq(idem_get(s, "done:2", 6, &rec), 0);
    cr_assert(rec.state == IDEM_PENDING && rec.released);
    idem_msg again = msg("done:2");
    cr_assert_eq(idem_runner_batch(r, &again, 1, &done), 0);
    cr_assert_eq(again.result, IDEM_MSG_DONE);
    cr_assert_eq(again.attempt, 2, "a new token for the second run");
    idem_runner_free(r);
    idem_close(s);
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
