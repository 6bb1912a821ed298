/* tests/test_redis_ckpt.c - checkpoints on Redis and Redis Cluster, in
 * both layouts, and claim-done batches cut by a server that stops.
 *
 * The conformance suite shows that a checkpoint commits with its writes
 * and dies with them when the process is killed before the sync. What is
 * Redis's own: the intent a process leaves in the checkpoint key when it
 * dies between writing the key and applying the writes (written here as
 * the library writes it, with its own encoder), which the next reader
 * applies; a write refused at apply time; keys that are not checkpoints;
 * and a batch whose server stops answering half way, where the outcomes
 * returned must be what the store holds. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "redis/redis.h"
#include "redis_harness.h"

static char uri_buf[2048], pfx[128];

static void fini(void)
{
    th_shared_stop();
}

TestSuite(redis_ckpt, .fini = fini, .timeout = 120);

static const char *store_uri(int cluster, const char *layout)
{
    snprintf(pfx, sizeof pfx, "%s", th_prefix());
    snprintf(uri_buf, sizeof uri_buf,
             "%s://%s?prefix=%s&timeout_ms=20000&layout=%s",
             cluster ? "redis-cluster" : "redis",
             cluster ? th_cluster_addr() : th_redis_addr(), pfx, layout);
    return uri_buf;
}

/* A connection to the node that serves the checkpoint named name. */
static redisContext *ckpt_node(int cluster, const char *name, char *key,
                               size_t cap)
{
    int n = snprintf(key, cap, "%scheckpoint:{%s}", pfx, name);
    int port = th_first_port(cluster ? th_cluster_addr() : th_redis_addr());
    if (cluster)
        port = th_slot_owner(port, idem__key_slot(key, (size_t)n));
    return th_connect(port);
}

static void assert_ckpt(idem_store *s, const char *want)
{
    const void *b;
    size_t n;
    int rc = idem_checkpoint_get(s, "job", &b, &n);
    cr_assert_eq(rc, 0, "%s: %s", idem_strerror(rc), idem_errdetail(s));
    cr_assert(n == strlen(want) && memcmp(b, want, n) == 0, "'%.*s'",
              (int)n, (const char *)b);
}

/* A process wrote the checkpoint with its intent (step 1) and died: the
 * next idem_checkpoint_get applies the writes, then drops the intent. */
static void intent_applied_by_get(int cluster, const char *layout)
{
    idem_store *s = t_open(store_uri(cluster, layout));
    idem_key k[3] = {{"k1", 2, NULL}, {"k2", 2, NULL}, {"k3", 2, NULL}};
    idem_outcome o[3];
    cr_assert_eq(idem_claim_many(s, k, 3, NULL, o, 0), 0);
    idem__buf in = {0};
    cr_assert_eq(idem__intent_add(&in, 'c', o[0].token, 60000, "rid-1",
                                  "k1", 2, "R1", 2), 0);
    cr_assert_eq(idem__intent_add(&in, 'f', o[1].token, 60000, "rid-2",
                                  "k2", 2, "E2", 2), 0);
    cr_assert_eq(idem__intent_add(&in, 'r', o[2].token, 60000, "rid-3",
                                  "k3", 2, "E3", 2), 0);
    char key[256];
    redisContext *c = ckpt_node(cluster, "job", key, sizeof key);
    freeReplyObject(th_cmd(c, "HSET %s idem 1 blob pos=7 intent %b iid i1",
                           key, in.data, in.len));
    idem_close(s);
    s = t_open(uri_buf);
    assert_ckpt(s, "pos=7");
    idem_record r;
    cr_assert_eq(idem_get(s, "k1", 2, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    cr_assert(r.len == 2 && memcmp(r.data, "R1", 2) == 0);
    cr_assert_eq(idem_get(s, "k2", 2, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_FAILED);
    cr_assert_eq(idem_get(s, "k3", 2, &r), 0);
    cr_assert(r.state == IDEM_STATE_PENDING && r.released);
    redisReply *e = th_cmd(c, "HEXISTS %s intent", key);
    cr_assert_eq(e->integer, 0, "the intent is dropped once applied");
    freeReplyObject(e);
    /* Applying it again (a reader that died before dropping it) answers
     * the same, by the writes' request ids. */
    freeReplyObject(th_cmd(c, "HSET %s intent %b iid i1", key, in.data,
                           in.len));
    assert_ckpt(s, "pos=7");
    cr_assert_eq(idem_get(s, "k1", 2, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    /* A sync over a key holding a dead process's intent applies it
     * first: put and sync a new checkpoint with no writes. */
    freeReplyObject(th_cmd(c, "DEL %s", key));
    idem_outcome n;
    idem_key k4 = {"k4", 2, NULL};
    cr_assert_eq(idem_claim(s, &k4, NULL, &n), 0);
    in.len = 0;
    cr_assert_eq(idem__intent_add(&in, 'c', n.token, 60000, "rid-4", "k4",
                                  2, "R4", 2), 0);
    freeReplyObject(th_cmd(c, "HSET %s idem 1 blob pos=8 intent %b iid i2",
                           key, in.data, in.len));
    cr_assert_eq(idem_checkpoint_put(s, "job", "pos=9", 5), 0);
    cr_assert_eq(idem_sync(s), 0, "%s", idem_errdetail(s));
    cr_assert_eq(idem_get(s, "k4", 2, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    idem_close(s);
    s = t_open(uri_buf);
    assert_ckpt(s, "pos=9");
    idem_close(s);
    idem__buf_free(&in);
    redisFree(c);
}

Test(redis_ckpt, intent_applied_by_get_single)
{
    intent_applied_by_get(0, "hash");
}

Test(redis_ckpt, intent_applied_by_get_single_day)
{
    intent_applied_by_get(0, "day&days=2&shards=3");
}

Test(redis_ckpt, intent_applied_by_get_cluster)
{
    intent_applied_by_get(1, "hash");
}

Test(redis_ckpt, intent_applied_by_get_cluster_day)
{
    intent_applied_by_get(1, "day&days=2&shards=3");
}

/* A queued completion whose lease runs out and is taken over between its
 * check and the sync: sync says IDEM_ELOST and names the key; the
 * checkpoint and the other writes are committed. */
static void lost_at_apply(int cluster)
{
    idem_store *s = t_open(store_uri(cluster, "hash"));
    idem_key k[2] = {{"late", 4, NULL}, {"fine", 4, NULL}};
    idem_outcome o[2];
    cr_assert_eq(idem_claim_many(s, k, 2, NULL, o, 0), 0);
    cr_assert_eq(idem_checkpoint_put(s, "job", "pos=1", 5), 0);
    idem_completion c[2] = {{"late", 4, o[0].token, "L", 1, 0},
                            {"fine", 4, o[1].token, "F", 1, 0}};
    int st[2];
    cr_assert_eq(idem_complete_many(s, c, 2, st, IDEM_NOSYNC), 0);
    cr_assert(st[0] == 0 && st[1] == 0);
    t_clock_ms += 31000;  /* past the lease the check renewed */
    idem_store *other = t_open(uri_buf);
    idem_outcome t;
    cr_assert_eq(idem_claim(other, &k[0], NULL, &t), 0);
    cr_assert_eq(t.kind, IDEM_NEW);
    idem_close(other);
    cr_assert_eq(idem_sync(s), IDEM_ELOST);
    cr_assert(strstr(idem_errdetail(s), "'late'"), "%s", idem_errdetail(s));
    assert_ckpt(s, "pos=1");
    idem_record r;
    cr_assert_eq(idem_get(s, "fine", 4, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    cr_assert_eq(idem_get(s, "late", 4, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_PENDING);
    cr_assert_eq(r.token, t.token);
    /* Nothing is queued any more: writes apply at once again. */
    cr_assert_eq(idem_complete(s, "late", 4, t.token, "T", 1, 0), 0);
    cr_assert_eq(idem_get(s, "late", 4, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    idem_close(s);
}

Test(redis_ckpt, lost_at_apply_single)
{
    lost_at_apply(0);
}

Test(redis_ckpt, lost_at_apply_cluster)
{
    lost_at_apply(1);
}

/* Keys under a checkpoint's name that idem did not write are refused
 * with what they are; records' tools leave checkpoints alone. */
Test(redis_ckpt, foreign_keys_and_other_tools)
{
    idem_store *s = t_open(store_uri(0, "hash"));
    char key[256];
    redisContext *c = ckpt_node(0, "job", key, sizeof key);
    freeReplyObject(th_cmd(c, "SET %s junk", key));
    const void *b;
    size_t n;
    cr_assert_eq(idem_checkpoint_get(s, "job", &b, &n), IDEM_EPROTO);
    cr_assert(strstr(idem_errdetail(s), "a string, not a hash"), "%s",
              idem_errdetail(s));
    freeReplyObject(th_cmd(c, "DEL %s", key));
    freeReplyObject(th_cmd(c, "HSET %s blob x", key));
    cr_assert_eq(idem_checkpoint_get(s, "job", &b, &n), IDEM_EPROTO);
    cr_assert(strstr(idem_errdetail(s), "did not write"), "%s",
              idem_errdetail(s));
    freeReplyObject(th_cmd(c, "DEL %s", key));
    /* One name per sync; a second is refused, the first stays queued. */
    cr_assert_eq(idem_checkpoint_put(s, "job", "1", 1), 0);
    cr_assert_eq(idem_checkpoint_put(s, "other", "2", 1), IDEM_EINVAL);
    cr_assert_eq(idem_sync(s), 0);
    redisReply *t = th_cmd(c, "PTTL %s", key);
    cr_assert_eq(t->integer, -1, "a checkpoint has no TTL");
    freeReplyObject(t);
    uint64_t swept = 0;
    cr_assert_eq(idem_sweep(s, 0, &swept), 0);
    idem_stats st;
    cr_assert_eq(idem_stats_get(s, &st), 0);
    cr_assert_eq(st.live_keys, 0);
    idem_check_report rep;
    cr_assert_eq(idem_check(uri_buf, &rep), 0, "check counts no damage");
    t_clock_ms += 400LL * 86400000;
    cr_assert_eq(idem_sweep(s, 0, &swept), 0);
    assert_ckpt(s, "1");
    idem_close(s);
    redisFree(c);
}

/* A claim-done batch whose server stops answering half way: every key
 * the call answered (status 0) is NEW and stored DONE; the others carry
 * the error. Before claim-done was one script, a cut between its claim
 * and its complete left keys PENDING that were answered NEW. */
Test(redis_ckpt, claim_done_cut_by_a_stopped_server, .timeout = 240)
{
    enum { N = 300000, B = 3000 };
    th_servers sv;
    th_start_single(&sv);
    char uri[256];
    snprintf(uri, sizeof uri, "redis://127.0.0.1:%d?timeout_ms=1000",
             sv.ports[0]);
    idem_store *s = t_open(uri);
    static idem_key keys[N];
    static char names[N][16];
    static idem_outcome o[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "c%d", i);
        keys[i] = (idem_key){names[i], strlen(names[i]), NULL};
    }
    long pid = th_pid(&sv, sv.ports[0]);
    pid_t stopper = fork();
    cr_assert_geq(stopper, 0);
    if (stopper == 0) {
        usleep(150000);
        kill((pid_t)pid, SIGSTOP);
        _exit(0);
    }
    /* Batches of B keys until one fails: the stop lands in one of
     * them, anywhere between its first command and its last reply. */
    int rc = 0;
    size_t done = 0;
    for (; done < N && !rc; done += B)
        rc = idem_claim_many(s, keys + done, B, NULL, o + done,
                             IDEM_CLAIM_DONE);
    waitpid(stopper, NULL, 0);
    th_signal(&sv, sv.ports[0], SIGCONT);
    size_t answered = 0;
    for (size_t i = 0; i < done; i++) {
        if (o[i].status)
            continue;
        cr_assert_eq(o[i].kind, IDEM_NEW);
        keys[answered++] = keys[i];
    }
    cr_log_info("rc %d, %zu of %zu answered", rc, answered, done);
    cr_assert(rc != 0 || answered == done);
    cr_assert_eq(idem_claim_many(s, keys, answered, NULL, o, 0), 0, "%s",
                 idem_errdetail(s));
    for (size_t i = 0; i < answered; i++)
        cr_assert_eq(o[i].kind, IDEM_REPLAY, "%.*s was answered NEW but "
                     "is not DONE", (int)keys[i].keylen,
                     (const char *)keys[i].key);
    idem_close(s);
    th_stop(&sv);
}

/* Writes queued with the checkpoint (idem_checkpoint_write): run by the
 * script that writes it, in order, their answers kept for
 * idem_checkpoint_reply; a write the server refuses fails the sync and
 * leaves the old checkpoint; nothing runs without a checkpoint. */
static void queue_xadd(idem_store *s, const char *stream, const char *v,
                       size_t *at)
{
    const char *argv[] = {"XADD", stream, "*", "f", v};
    size_t lens[] = {4, strlen(stream), 1, 1, strlen(v)};
    int rc = idem_checkpoint_write(s, 5, argv, lens, 1, at);
    cr_assert_eq(rc, 0, "%s: %s", idem_strerror(rc), idem_errdetail(s));
}

Test(redis_ckpt, writes_queued_with_the_checkpoint)
{
    idem_store *s = t_open(store_uri(0, "hash"));
    char stream[160], key[256];
    snprintf(stream, sizeof stream, "%sst", pfx);
    redisContext *c = ckpt_node(0, "job", key, sizeof key);
    idem_key k = {"w1", 2, NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0);
    size_t a, b;
    cr_assert_eq(idem_checkpoint_put(s, "job", "p1", 2), 0);
    cr_assert_eq(idem_complete(s, "w1", 2, o.token, "R", 1, 0), 0);
    queue_xadd(s, stream, "one", &a);
    queue_xadd(s, stream, "two", &b);
    cr_assert(a == 0 && b == 1);
    redisReply *r = th_cmd(c, "XLEN %s", stream);
    cr_assert_eq(r->integer, 0, "nothing is sent before the sync");
    freeReplyObject(r);
    cr_assert_eq(idem_sync(s), 0, "%s", idem_errdetail(s));
    const char *id;
    size_t n;
    cr_assert_eq(idem_checkpoint_reply(s, 1, &id, &n), 0);
    r = th_cmd(c, "XREVRANGE %s + - COUNT 1", stream);
    cr_assert_eq(r->elements, 1);
    cr_assert(n == r->element[0]->element[0]->len &&
              memcmp(id, r->element[0]->element[0]->str, n) == 0,
              "the answer is the XADD's ID");
    freeReplyObject(r);
    cr_assert_eq(idem_checkpoint_reply(s, 2, &id, &n), IDEM_ENOTFOUND);
    idem_record rec;
    cr_assert_eq(idem_get(s, "w1", 2, &rec), 0);
    cr_assert_eq(rec.state, IDEM_STATE_DONE);
    /* A write the server refuses (a hash is no stream): the sync fails,
     * the checkpoint stays the old one. */
    char hash[160];
    snprintf(hash, sizeof hash, "%sh", pfx);
    freeReplyObject(th_cmd(c, "HSET %s a b", hash));
    cr_assert_eq(idem_checkpoint_put(s, "job", "p2", 2), 0);
    queue_xadd(s, hash, "x", &a);
    cr_assert_eq(idem_sync(s), IDEM_EPROTO);
    cr_assert_eq(idem_checkpoint_reply(s, 0, &id, &n), IDEM_ENOTFOUND);
    idem_close(s);
    s = t_open(uri_buf);
    assert_ckpt(s, "p1");
    /* No checkpoint to carry them: refused at the sync, dropped. */
    queue_xadd(s, stream, "three", &a);
    cr_assert_eq(idem_sync(s), IDEM_EINVAL);
    cr_assert_eq(idem_sync(s), 0);
    r = th_cmd(c, "XLEN %s", stream);
    cr_assert_eq(r->integer, 2);
    freeReplyObject(r);
    char host[256];
    int port, db;
    cr_assert_eq(idem_store_server(s, host, sizeof host, &port, &db), 0);
    cr_assert_eq(port, th_first_port(th_redis_addr()));
    cr_assert_eq(db, 0);
    freeReplyObject(th_cmd(c, "DEL %s %s %s", stream, hash, key));
    idem_close(s);
    redisFree(c);
}

/* Every answer of a queued write is text, as idem_checkpoint_reply
 * gives it: a status its text (SET's OK, not a Lua table's address), an
 * integer all its digits (not 1.2345678901235e+15), a nil empty. */
Test(redis_ckpt, queued_write_answers_are_text)
{
    idem_store *s = t_open(store_uri(0, "hash"));
    char key[256], str[160], num[160], none[160];
    redisContext *c = ckpt_node(0, "job", key, sizeof key);
    snprintf(str, sizeof str, "%sstr", pfx);
    snprintf(num, sizeof num, "%snum", pfx);
    snprintf(none, sizeof none, "%snone", pfx);
    const char *set[] = {"SET", str, "v"};
    const char *incr[] = {"INCRBY", num, "1234567890123456"};
    const char *get[] = {"GET", none};
    size_t setl[] = {3, strlen(str), 1};
    size_t incrl[] = {6, strlen(num), 16};
    size_t getl[] = {3, strlen(none)};
    size_t at[3];
    cr_assert_eq(idem_checkpoint_put(s, "job", "p", 1), 0);
    cr_assert_eq(idem_checkpoint_write(s, 3, set, setl, 1, &at[0]), 0);
    cr_assert_eq(idem_checkpoint_write(s, 3, incr, incrl, 1, &at[1]), 0);
    cr_assert_eq(idem_checkpoint_write(s, 2, get, getl, 1, &at[2]), 0);
    cr_assert_eq(idem_sync(s), 0, "%s", idem_errdetail(s));
    const char *want[] = {"OK", "1234567890123456", ""};
    for (int i = 0; i < 3; i++) {
        const char *text;
        size_t n;
        cr_assert_eq(idem_checkpoint_reply(s, at[i], &text, &n), 0);
        cr_assert(n == strlen(want[i]) && memcmp(text, want[i], n) == 0,
                  "write %d answered '%.*s', not '%s'", i, (int)n, text,
                  want[i]);
    }
    freeReplyObject(th_cmd(c, "DEL %s %s %s", str, num, key));
    idem_close(s);
    redisFree(c);
}

/* Stores that cannot: local: (its commit is not Redis's), and on a
 * cluster a key outside the checkpoint's slot. */
Test(redis_ckpt, queued_writes_refused_where_they_cannot_commit)
{
    size_t at;
    const char *argv[] = {"XADD", "s", "*", "f", "v"};
    size_t lens[] = {4, 1, 1, 1, 1};
    t_dir_init();
    char luri[1100];
    snprintf(luri, sizeof luri, "local:%s", t_at("lst"));
    idem_store *l = t_open(luri);
    cr_assert_eq(idem_checkpoint_write(l, 5, argv, lens, 1, &at),
                 IDEM_ENOTSUP);
    char host[64];
    int port, db;
    cr_assert_eq(idem_store_server(l, host, sizeof host, &port, &db),
                 IDEM_ENOTSUP);
    idem_close(l);
    t_dir_fini();
    idem_store *s = t_open(store_uri(1, "hash"));
    cr_assert_eq(idem_store_server(s, host, sizeof host, &port, &db),
                 IDEM_ENOTSUP);
    cr_assert_eq(idem_checkpoint_put(s, "job", "p", 1), 0);
    char same[64];
    snprintf(same, sizeof same, "{job}st");  /* the checkpoint's tag */
    argv[1] = same;
    lens[1] = strlen(same);
    cr_assert_eq(idem_checkpoint_write(s, 5, argv, lens, 1, &at), 0);
    argv[1] = "{other}st";
    lens[1] = 9;
    cr_assert_eq(idem_checkpoint_write(s, 5, argv, lens, 1, &at),
                 IDEM_EINVAL);
    cr_assert_eq(idem_sync(s), 0, "%s", idem_errdetail(s));
    redisContext *c = th_connect(th_slot_owner(
        th_first_port(th_cluster_addr()), idem__key_slot(same, strlen(same))));
    redisReply *r = th_cmd(c, "XLEN %s", same);
    cr_assert_eq(r->integer, 1, "the write in the slot ran on its node");
    freeReplyObject(r);
    freeReplyObject(th_cmd(c, "DEL %s", same));
    redisFree(c);
    idem_close(s);
}

/* Step 1 sent again after a lost reply (the pipeline resends a command
 * whose connection broke): the queued writes ran the first time, so the
 * second answers their answers and writes nothing again. The script is
 * run here as the library sends it, twice with one sync id. */
Test(redis_ckpt, a_resent_step_one_runs_its_writes_once)
{
    (void)store_uri(0, "hash");
    char stream[160], key[256];
    snprintf(stream, sizeof stream, "%sst2", pfx);
    redisContext *c = ckpt_node(0, "job2", key, sizeof key);
    /* msgpack: [["XADD", stream, "*", "f", "v"]] */
    idem__buf w = {0};
    const char *args[] = {"XADD", stream, "*", "f", "v"};
    unsigned char a1[5] = {0xdd, 0, 0, 0, 1}, a5[5] = {0xdd, 0, 0, 0, 5};
    idem__buf_append(&w, a1, 5);
    idem__buf_append(&w, a5, 5);
    for (int i = 0; i < 5; i++) {
        size_t n = strlen(args[i]);
        unsigned char h[5] = {0xdb, 0, 0, 0, (unsigned char)n};
        idem__buf_append(&w, h, 5);
        idem__buf_append(&w, args[i], n);
    }
    const char *text = idem__script_text(IDEM__LAYOUT_HASH, IDEM__S_CKPT_PUT);
    redisReply *r[2];
    for (int i = 0; i < 2; i++) {
        r[i] = th_cmd(c, "EVAL %s 1 %s 0 pos %s sync-1 %b", text, key, "",
                      w.data, w.len);
        cr_assert_eq(r[i]->type, REDIS_REPLY_ARRAY, "%s",
                     r[i]->type == REDIS_REPLY_ERROR ? r[i]->str : "?");
        cr_assert_eq(r[i]->elements, 2);
    }
    cr_assert_str_eq(r[0]->element[1]->str, r[1]->element[1]->str,
                     "the same answer, the same entry");
    redisReply *x = th_cmd(c, "XLEN %s", stream);
    cr_assert_eq(x->integer, 1, "the XADD ran once");
    freeReplyObject(x);
    freeReplyObject(r[0]);
    freeReplyObject(r[1]);
    /* Another sync (another id) runs its writes. */
    x = th_cmd(c, "EVAL %s 1 %s 0 pos %s sync-2 %b", text, key, "", w.data,
               w.len);
    freeReplyObject(x);
    x = th_cmd(c, "XLEN %s", stream);
    cr_assert_eq(x->integer, 2);
    freeReplyObject(x);
    freeReplyObject(th_cmd(c, "DEL %s %s", stream, key));
    idem__buf_free(&w);
    redisFree(c);
}
