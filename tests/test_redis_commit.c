/* tests/test_redis_commit.c - the one-script commit's batch path against
 * the per-key path.
 *
 * On one server with layout hash, the runner's completions are not
 * checked one by one before the commit: the script that writes the
 * checkpoint and the writes queued with it checks each token and
 * completes each key (src/redis/ckpt.c). Layout day keeps the per-key
 * path (a check with a lease renewal per key, then the script, then the
 * completions in batches after it). Here the same batches go through
 * both, and must give the same answers: a batch with duplicates inside
 * it, a key another worker holds, a lease that ran out before the
 * commit, and a process killed at any moment while it commits batch
 * after batch. The first test shows that the batch path is the one
 * taken, by the script calls the server counts. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "redis_harness.h"
#include "store.h"

static void fini(void)
{
    th_shared_stop();
}

TestSuite(redis_commit, .fini = fini, .timeout = 180);

enum { BATCH_PATH, PER_KEY };

/* The two paths: layout hash (the batch path) and layout day, on one
 * server, each under a prefix of its own (pfx gets it). */
static const char *path_uri(const char *addr, int path, char *pfx,
                            size_t pfxcap)
{
    static char uri[1024];
    snprintf(pfx, pfxcap, "%s", th_prefix());
    snprintf(uri, sizeof uri, "redis://%s?prefix=%s&timeout_ms=20000%s",
             addr, pfx, path == PER_KEY ? "&layout=day&days=2&shards=3" : "");
    return uri;
}

/* The commit step of every runner here: the committed count as the
 * checkpoint, and an XADD of each message first done in the new prefix
 * to PREFIX out, queued with it (the one script writes them). */
typedef struct run {
    idem_store *s;
    char stream[160];
    size_t upto;          /* messages committed before */
    size_t base;          /* the batch's first message, in the run */
    int asked;            /* the stop hook's count (stop_after) */
} run;

static int commit_step(void *ctx, const idem_msg *m, size_t n)
{
    run *k = ctx;
    for (size_t i = k->upto; i < n; i++) {
        if (m[i].result != IDEM_MSG_DONE)
            continue;
        const char *argv[5] = {"XADD", k->stream, "*", "k", m[i].key};
        size_t argl[5] = {4, strlen(k->stream), 1, 1, m[i].keylen};
        size_t at;
        int rc = idem_checkpoint_write(k->s, 5, argv, argl, 1, &at);
        if (rc)
            return rc;
    }
    k->upto = n;
    char text[32];
    int len = snprintf(text, sizeof text, "%zu", k->base + n);
    return idem_checkpoint_put(k->s, "ck", text, (size_t)len);
}

/* Every task is done, answering yes. */
static int answer_yes(void *ctx, idem_task *t, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++) {
        t[i].answer = IDEM_TASK_DONE;
        t[i].data = "yes";
        t[i].len = 3;
    }
    return 0;
}

/* Stop when asked the third time (the runner waits for a busy key). */
static int stop_after(void *ctx)
{
    run *rn = ctx;
    return ++rn->asked >= 3;
}

static idem_runner *new_runner(idem_store *s, run *rn, const char *pfx,
                               int handler, int stop)
{
    memset(rn, 0, sizeof *rn);
    rn->s = s;
    snprintf(rn->stream, sizeof rn->stream, "%sout", pfx);
    idem_runner_opts o;
    idem_runner_opts_init(&o);
    o.handler = handler ? answer_yes : NULL;
    o.commit = commit_step;
    o.ctx = rn;
    o.backoff_ms = 1;
    o.stop = stop ? stop_after : NULL;
    idem_runner *r;
    cr_assert_eq(idem_runner_new(s, &o, &r), 0);
    return r;
}

static idem_msg msg(const char *key)
{
    return (idem_msg){.key = key, .keylen = strlen(key), .msg = key,
                      .msglen = strlen(key)};
}

/* The output stream's keys, space-separated, into out. */
static void stream_keys(const char *stream, char *out, size_t cap)
{
    redisContext *c = th_connect(th_first_port(th_redis_addr()));
    redisReply *r = th_cmd(c, "XRANGE %s - +", stream);
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *f = r->element[i]->element[1];
        int n = snprintf(out + used, cap - used, "%s%s", used ? " " : "",
                         f->element[1]->str);
        used += n > 0 && (size_t)n < cap - used ? (size_t)n : 0;
    }
    freeReplyObject(r);
    redisFree(c);
}

/* What a batch left: each message's result and status, each key's
 * state and response, the checkpoint and the output, as one string. */
static void outcome(idem_store *s, const char *stream, const idem_msg *m,
                    size_t n, char *out, size_t cap)
{
    size_t used = 0;
    for (size_t i = 0; i < n && used < cap; i++) {
        idem_record rec;
        int rc = idem_get(s, m[i].key, m[i].keylen, &rec);
        int k = snprintf(out + used, cap - used, "%s:%d/%d/%d/%d/%.*s ",
                         (const char *)m[i].key, (int)m[i].result,
                         m[i].status, rc, rc ? -1 : (int)rec.state,
                         rc ? 0 : (int)rec.len,
                         rc ? "" : (const char *)rec.data);
        used += k > 0 ? (size_t)k : 0;
    }
    const void *b;
    size_t len;
    int rc = idem_checkpoint_get(s, "ck", &b, &len);
    int k = snprintf(out + used, cap - used, "ck=%d:%.*s out=", rc,
                     rc ? 0 : (int)len, rc ? "" : (const char *)b);
    used += k > 0 ? (size_t)k : 0;
    stream_keys(stream, out + used, cap - used);
}

/* The server's count of script calls (EVALSHA) so far. */
static long evalsha_calls(redisContext *c)
{
    redisReply *r = th_cmd(c, "INFO commandstats");
    const char *p = strstr(r->str, "cmdstat_evalsha:calls=");
    long n = p ? strtol(p + 22, NULL, 10) : 0;
    freeReplyObject(r);
    return n;
}

/* A batch of 50 new keys costs the batch path two script calls (the
 * claims, the commit), the per-key path more (checks, completions and
 * the intent's removal besides). A server of its own: no other test's
 * calls count. */
Test(redis_commit, the_batch_path_is_taken)
{
    th_servers sv;
    th_start_single(&sv);
    char addr[64], pfx[128], keys[50][16];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", sv.ports[0]);
    redisContext *c = th_connect(sv.ports[0]);
    long calls[2];
    for (int path = BATCH_PATH; path <= PER_KEY; path++) {
        idem_store *s = t_open(path_uri(addr, path, pfx, sizeof pfx));
        run rn;
        idem_runner *r = new_runner(s, &rn, pfx, 0, 0);
        idem_msg m[50];
        for (int i = 0; i < 50; i++) {
            snprintf(keys[i], sizeof keys[i], "k%d", i);
            m[i] = msg(keys[i]);
        }
        long before = evalsha_calls(c);
        size_t done;
        cr_assert_eq(idem_runner_batch(r, m, 50, &done), 0, "%s",
                     idem_errdetail(s));
        cr_assert_eq(done, 50);
        calls[path] = evalsha_calls(c) - before;
        idem_record rec;
        cr_assert_eq(idem_get(s, "k49", 3, &rec), 0);
        cr_assert_eq(rec.state, IDEM_STATE_DONE);
        idem_runner_free(r);
        cr_assert_eq(idem_close(s), 0);
    }
    cr_assert_eq(calls[BATCH_PATH], 2, "script calls: %ld",
                 calls[BATCH_PATH]);
    cr_assert_gt(calls[PER_KEY], 4, "script calls: %ld", calls[PER_KEY]);
    redisFree(c);
    th_stop(&sv);
}

/* One batch through both paths: the same outcome, output aside from its
 * stream's name. */
static void same_both_ways(idem_msg *m, size_t n, int handler)
{
    char got[2][4096], pfx[128];
    for (int path = BATCH_PATH; path <= PER_KEY; path++) {
        idem_store *s = t_open(path_uri(th_redis_addr(), path, pfx,
                                        sizeof pfx));
        run rn;
        idem_runner *r = new_runner(s, &rn, pfx, handler, 0);
        size_t done;
        cr_assert_eq(idem_runner_batch(r, m, n, &done), 0, "%s",
                     idem_errdetail(s));
        cr_assert_eq(done, n);
        outcome(s, rn.stream, m, n, got[path], sizeof got[path]);
        idem_runner_free(r);
        cr_assert_eq(idem_close(s), 0);
    }
    cr_assert_str_eq(got[BATCH_PATH], got[PER_KEY]);
}

Test(redis_commit, duplicates_inside_a_batch)
{
    idem_msg m[7] = {msg("a"), msg("b"), msg("a"), msg("c"),
                     msg("b"), msg("a"), msg("d")};
    same_both_ways(m, 7, 0);
    cr_assert_eq(m[2].result, IDEM_MSG_DUPLICATE);
    same_both_ways(m, 7, 1);
    cr_assert_eq(m[0].result, IDEM_MSG_DONE);
    cr_assert_eq(m[5].result, IDEM_MSG_DUPLICATE);
}

/* Another worker holds k: the batch stops while it waits (the stop
 * hook), with a committed before k, b given back, k untouched; then k
 * is done by its holder, and the next run replays it and does b. */
Test(redis_commit, a_key_another_worker_holds)
{
    char got[2][4096], pfx[128];
    for (int path = BATCH_PATH; path <= PER_KEY; path++) {
        const char *uri = path_uri(th_redis_addr(), path, pfx, sizeof pfx);
        idem_store *other = t_open(uri), *s = t_open(uri);
        idem_outcome held;
        idem_claim_opts co = {600000, 0};
        cr_assert_eq(idem_claim(other, &(idem_key){"k", 1, NULL}, &co,
                                &held), 0);
        run rn;
        idem_runner *r = new_runner(s, &rn, pfx, 1, 1);
        idem_msg m[3] = {msg("a"), msg("k"), msg("b")};
        size_t done;
        cr_assert_eq(idem_runner_batch(r, m, 3, &done), IDEM_ESTOPPED);
        cr_assert_eq(done, 1);
        idem_record rec;
        cr_assert_eq(idem_get(s, "b", 1, &rec), 0);
        cr_assert(rec.state == IDEM_STATE_PENDING && rec.released);
        cr_assert_eq(idem_complete(other, "k", 1, held.token, "theirs", 6,
                                   0), 0);
        idem_runner_free(r);
        r = new_runner(s, &rn, pfx, 1, 0);
        rn.base = 1;
        cr_assert_eq(idem_runner_batch(r, m + 1, 2, &done), 0, "%s",
                     idem_errdetail(s));
        cr_assert_eq(m[1].result, IDEM_MSG_REPLAY);
        cr_assert_eq(m[2].result, IDEM_MSG_DONE);
        outcome(s, rn.stream, m, 3, got[path], sizeof got[path]);
        idem_runner_free(r);
        cr_assert_eq(idem_close(s), 0);
        cr_assert_eq(idem_close(other), 0);
    }
    cr_assert_str_eq(got[BATCH_PATH], got[PER_KEY]);
}

/* A held claim whose lease runs out after the runner's last renewal and
 * is taken over before the commit: the sync says IDEM_ELOST naming the
 * key; the checkpoint, its write and the other key commit; the key
 * stays the new holder's. The batch path finds it in the script, the
 * per-key path when it applies the completions after it. */
Test(redis_commit, a_lease_that_ran_out_before_the_commit)
{
    char got[2][4096], pfx[128];
    for (int path = BATCH_PATH; path <= PER_KEY; path++) {
        const char *uri = path_uri(th_redis_addr(), path, pfx, sizeof pfx);
        idem_store *s = t_open(uri);
        idem_key k[2] = {{"late", 4, NULL}, {"fine", 4, NULL}};
        idem_outcome o[2];
        cr_assert_eq(idem_claim_many(s, k, 2, NULL, o, 0), 0);
        char stream[160];
        snprintf(stream, sizeof stream, "%sout", pfx);
        const char *argv[5] = {"XADD", stream, "*", "k", "fine"};
        size_t argl[5] = {4, strlen(stream), 1, 1, 4}, at;
        cr_assert_eq(idem_checkpoint_put(s, "ck", "2", 1), 0);
        cr_assert_eq(idem_checkpoint_write(s, 5, argv, argl, 1, &at), 0);
        idem_completion c[2] = {{"late", 4, o[0].token, "L", 1, 0},
                                {"fine", 4, o[1].token, "F", 1, 0}};
        int st[2];
        cr_assert_eq(idem__complete_held(s, c, 2, st), 0);
        cr_assert(st[0] == 0 && st[1] == 0);
        t_clock_ms += 31000;  /* past every lease granted so far */
        idem_store *other = t_open(uri);
        idem_outcome t;
        cr_assert_eq(idem_claim(other, &k[0], NULL, &t), 0);
        cr_assert_eq(t.kind, IDEM_NEW);
        idem_close(other);
        cr_assert_eq(idem_sync(s), IDEM_ELOST);
        cr_assert(strstr(idem_errdetail(s), "'late'"), "%s",
                  idem_errdetail(s));
        idem_record rec;
        cr_assert_eq(idem_get(s, "late", 4, &rec), 0);
        cr_assert_eq(rec.token, t.token);
        cr_assert_eq(idem_get(s, "fine", 4, &rec), 0);
        cr_assert_eq(rec.state, IDEM_STATE_DONE);
        idem_msg m[2] = {msg("late"), msg("fine")};
        outcome(s, stream, m, 2, got[path], sizeof got[path]);
        cr_assert(strstr(got[path], "ck=0:2 out=fine"), "%s", got[path]);
        cr_assert_eq(idem_close(s), 0);
    }
    cr_assert_str_eq(got[BATCH_PATH], got[PER_KEY]);
}

/* ------------------------------------------------------------------------
 * kill -9 while committing */

#define KILL_KEYS 400
#define KILL_BATCH 25

/* Message i of the run: in each 14, the last 7 repeat the first 7, in
 * the same batch or the next. Is it the key's first occurrence? */
static int kill_key(size_t i, char *buf, size_t cap)
{
    int first = i % 14 < 7;
    snprintf(buf, cap, "key%zu", first ? i : i - 7);
    return first;
}

/* The child: batches of the run from the checkpoint on, until killed. */
static void kill_child(const char *uri, const char *pfx, int ready)
{
    idem_store *s;
    idem_opts o = t_options();
    if (idem_open(uri, &o, &s))
        _exit(10);
    run rn;
    memset(&rn, 0, sizeof rn);
    rn.s = s;
    snprintf(rn.stream, sizeof rn.stream, "%sout", pfx);
    idem_runner_opts ro;
    idem_runner_opts_init(&ro);
    ro.commit = commit_step;
    ro.ctx = &rn;
    idem_runner *r;
    if (idem_runner_new(s, &ro, &r))
        _exit(11);
    static char keys[KILL_KEYS][16];
    idem_msg m[KILL_BATCH];
    if (write(ready, "x", 1) != 1)
        _exit(12);
    for (size_t at = 0; at < KILL_KEYS; at += KILL_BATCH) {
        for (size_t i = 0; i < KILL_BATCH; i++) {
            kill_key(at + i, keys[at + i], sizeof keys[at + i]);
            m[i] = msg(keys[at + i]);
        }
        rn.base = at;
        rn.upto = 0;
        if (idem_runner_batch(r, m, KILL_BATCH, NULL))
            _exit(13);
    }
    _exit(0);
}

/* After the kill: the checkpoint says how many messages committed; the
 * output holds exactly the first occurrences among them, in order, and
 * exactly their keys are done. */
static void kill_check(const char *uri, const char *pfx)
{
    idem_store *s = t_open(uri);
    const void *b;
    size_t len, upto = 0;
    if (idem_checkpoint_get(s, "ck", &b, &len) == 0) {
        char text[32];
        snprintf(text, sizeof text, "%.*s", (int)len, (const char *)b);
        upto = strtoul(text, NULL, 10);
    }
    cr_assert_eq(upto % KILL_BATCH, 0, "a whole batch commits: %zu", upto);
    char want[KILL_KEYS * 8] = "", key[16], stream[160];
    size_t used = 0;
    for (size_t i = 0; i < KILL_KEYS; i++) {
        if (!kill_key(i, key, sizeof key))
            continue;
        if (i < upto)
            used += (size_t)snprintf(want + used, sizeof want - used,
                                     "%s%s", used ? " " : "", key);
        idem_record rec;
        int rc = idem_get(s, key, strlen(key), &rec);
        int done = rc == 0 && rec.state == IDEM_STATE_DONE;
        cr_assert_eq(done, i < upto, "%s: done=%d, checkpoint %zu", key,
                     done, upto);
    }
    snprintf(stream, sizeof stream, "%sout", pfx);
    static char got[KILL_KEYS * 8];
    stream_keys(stream, got, sizeof got);
    cr_assert_str_eq(got, want, "checkpoint %zu", upto);
    cr_assert_eq(idem_close(s), 0);
}

/* Eight kills per path at moments spread over the run (a pause of a
 * random length after the child starts: whatever it reached then). */
Test(redis_commit, a_kill_at_any_moment_commits_whole_batches)
{
    char pfx[128];
    for (int path = BATCH_PATH; path <= PER_KEY; path++)
        for (int round = 0; round < 8; round++) {
            const char *uri = path_uri(th_redis_addr(), path, pfx,
                                       sizeof pfx);
            char u[1024];
            snprintf(u, sizeof u, "%s", uri);
            int p[2];
            cr_assert_eq(pipe(p), 0);
            pid_t pid = fork();
            cr_assert_geq(pid, 0);
            if (pid == 0) {
                close(p[0]);
                kill_child(u, pfx, p[1]);
            }
            close(p[1]);
            char c;
            cr_assert_eq(read(p[0], &c, 1), 1);
            close(p[0]);
            usleep((useconds_t)(rand() % 40000));
            kill(pid, SIGKILL);
            int wst;
            waitpid(pid, &wst, 0);
            cr_assert(WIFSIGNALED(wst) ||
                          (WIFEXITED(wst) && WEXITSTATUS(wst) == 0),
                      "the child failed: status %d",
                      WIFEXITED(wst) ? WEXITSTATUS(wst) : -1);
            kill_check(u, pfx);
        }
}
