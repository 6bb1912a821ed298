/* tests/test_redis_sentinel.c - redis-sentinel:// on real sentinels: a
 * master, its replica and three sentinels (scripts/redis-test.sh
 * sentinel): the shared ones of the test run (tests/redis_harness.h), on
 * which the conformance suite runs too, or a test's own where it breaks
 * them on purpose. Claims and `idem stats` through the sentinels; a
 * sentinel that is down, hangs, or never was, skipped; a wrong master
 * name refused with the sentinels and the name in the error; the
 * servers' and the sentinels' passwords, each used where it belongs and
 * never shown; kill -9 of the master under a steady claim load, the
 * handle following the promoted replica without a reopen, every call
 * answering within its budget, and with wait=1 every acknowledged claim
 * found on the new master; and the window between acknowledgement and
 * replication held open, to show what wait=1 is for. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "redis_harness.h"

#define MASTER "idem-m"

static th_servers sv;

static void fini(void)
{
    th_stop(&sv);
    th_shared_stop();  /* what a run without run-tests.sh started */
}

TestSuite(sentinel, .fini = fini, .timeout = 60);

/* redis-sentinel://[before]S1,S2,S3/name?prefix=PREFIX&extra: before is
 * a userinfo ("USER:PW@") or more sentinels ("HOST:PORT,"). */
static void sentinel_uri(char *buf, size_t cap, const char *before,
                         const char *name, const char *prefix,
                         const char *extra)
{
    snprintf(buf, cap, "redis-sentinel://%s127.0.0.1:%d,127.0.0.1:%d,"
             "127.0.0.1:%d/%s?prefix=%s%s", before ? before : "",
             sv.ports[2], sv.ports[3], sv.ports[4], name, prefix, extra);
}

/* Stores here run on the servers' clock (t_open's is the tests' own,
 * which `idem stats` would not share). */
static int open_rc(const char *uri, idem_store **s)
{
    idem_opts o;
    idem_opts_init(&o);
    return idem_open(uri, &o, s);
}

static idem_store *open_ok(const char *uri)
{
    idem_store *s;
    int rc = open_rc(uri, &s);
    cr_assert_eq(rc, 0, "%s: %s", uri, idem_errdetail(s));
    return s;
}

/* Claim key, which must be NEW, and complete it with "ok". */
static uint64_t claim_new(idem_store *s, const char *key)
{
    idem_outcome o;
    idem_key k = {key, strlen(key), NULL};
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0, "%s", idem_errdetail(s));
    cr_assert_eq(o.kind, IDEM_NEW, "%s: kind %d", key, o.kind);
    cr_assert_eq(idem_complete(s, key, strlen(key), o.token, "ok", 2, 0), 0,
                 "%s", idem_errdetail(s));
    return o.token;
}

/* The token field of PREFIX{key} on the server at port; 0 if none. */
static uint64_t raw_token(redisContext *c, const char *prefix,
                          const char *key)
{
    redisReply *r = th_cmd(c, "HGET %s{%s} token", prefix, key);
    uint64_t t = r->type == REDIS_REPLY_STRING
                     ? strtoull(r->str, NULL, 10) : 0;
    freeReplyObject(r);
    return t;
}

static int is_master(int port)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    redisReply *r = c && !c->err ? redisCommand(c, "ROLE") : NULL;
    int m = r && r->type == REDIS_REPLY_ARRAY && r->elements &&
            strcmp(r->element[0]->str, "master") == 0;
    freeReplyObject(r);
    redisFree(c);
    return m;
}

/* The shared sentinels (th_sentinel_addr(): "S1,S2,S3/NAME"): their
 * list into list, the master's name returned. */
static const char *shared(char *list, size_t cap)
{
    const char *a = th_sentinel_addr();
    const char *slash = strchr(a, '/');
    cr_assert(slash && (size_t)(slash - a) < cap);
    snprintf(list, cap, "%.*s", (int)(slash - a), a);
    return slash + 1;
}

/* The port of the master the shared sentinels name. */
static int shared_master(void)
{
    char list[256];
    const char *name = shared(list, sizeof list);
    redisContext *c = th_connect(th_first_port(list));
    redisReply *r = th_cmd(c, "SENTINEL get-master-addr-by-name %s", name);
    cr_assert(r->type == REDIS_REPLY_ARRAY && r->elements == 2);
    int port = (int)strtol(r->element[1]->str, NULL, 10);
    freeReplyObject(r);
    redisFree(c);
    return port;
}

Test(sentinel, claims_and_stats_through_the_sentinels)
{
    char prefix[64], uri[1024];
    snprintf(prefix, sizeof prefix, "%s", th_prefix());
    snprintf(uri, sizeof uri, "redis-sentinel://%s?prefix=%s",
             th_sentinel_addr(), prefix);
    idem_store *s = open_ok(uri);
    uint64_t token = claim_new(s, "k1");
    claim_new(s, "k2");
    idem_outcome o;
    idem_key k = {"k1", 2, NULL};
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0, "%s", idem_errdetail(s));
    cr_assert_eq(o.kind, IDEM_REPLAY);
    idem_close(s);
    /* The records are on the master the sentinels watch. */
    redisContext *c = th_connect(shared_master());
    cr_assert_eq(raw_token(c, prefix, "k1"), token);
    redisFree(c);
    char *dir = t_tmpdir();
    cr_assert_eq(t_cli(dir, "stats --store '%s' > out 2> err", uri), 0,
                 "%s", t_read(t_path(dir, "err"), NULL));
    cr_assert(t_grep(t_path(dir, "out"), "0 pending, 2 done, 0 failed"),
              "%s", t_read(t_path(dir, "out"), NULL));
    t_rmdir(dir);
    free(dir);
}

Test(sentinel, a_wrong_master_name_is_a_clear_error)
{
    char list[256], uri[1024];
    shared(list, sizeof list);
    snprintf(uri, sizeof uri, "redis-sentinel://%s/no-such-master", list);
    idem_store *s;
    cr_assert_eq(open_rc(uri, &s), IDEM_EINVAL);
    const char *d = idem_errdetail(s);
    /* The three failed alike: one entry, "S1, S2, S3: ...". */
    char alike[300], want[500];
    size_t n = 0;
    for (const char *p = list; *p && n + 2 < sizeof alike; p++) {
        alike[n++] = *p;
        if (*p == ',')
            alike[n++] = ' ';
    }
    alike[n] = '\0';
    snprintf(want, sizeof want, "no master 'no-such-master' found through "
             "the sentinels: %s: knows no master named 'no-such-master'",
             alike);
    cr_assert(strstr(d, want), "%s\nwant: %s", d, want);
    idem_close(s);
    /* A data server in a sentinel's place says so. */
    snprintf(uri, sizeof uri, "redis-sentinel://%s/" MASTER,
             th_redis_addr());
    cr_assert_eq(open_rc(uri, &s), IDEM_EINVAL);
    cr_assert(strstr(idem_errdetail(s), "is not a sentinel"), "%s",
              idem_errdetail(s));
    idem_close(s);
}

/* A sentinel that is down (killed), one that hangs (stopped: it accepts
 * connections and never answers) and one that never was (port 1) cost
 * their turn, no more; with no live one the error names each. */
Test(sentinel, a_sentinel_that_is_down_is_skipped)
{
    th_start_sentinel(&sv, MASTER);
    th_kill9(&sv, sv.ports[2]);
    th_signal(&sv, sv.ports[3], SIGSTOP);
    char prefix[64], uri[1024];
    snprintf(prefix, sizeof prefix, "%s", th_prefix());
    sentinel_uri(uri, sizeof uri, "127.0.0.1:1,", MASTER, prefix,
                 "&timeout_ms=5000");
    idem_store *s = open_ok(uri);
    cr_assert_str_eq(idem_errdetail(s), "");
    claim_new(s, "a");
    idem_close(s);
    char dead[256];
    snprintf(dead, sizeof dead, "redis-sentinel://127.0.0.1:1,127.0.0.1:%d,"
             "127.0.0.1:%d/" MASTER "?timeout_ms=1000", sv.ports[2],
             sv.ports[3]);
    int rc = open_rc(dead, &s);
    cr_assert(rc == IDEM_ECONN || rc == IDEM_ETIMEOUT, "%s",
              idem_strerror(rc));
    char refused[128], hung[128];
    snprintf(refused, sizeof refused, "sentinels: 127.0.0.1:1, "
             "127.0.0.1:%d: cannot connect: Connection refused",
             sv.ports[2]);
    snprintf(hung, sizeof hung, "127.0.0.1:%d: SENTINEL: no answer within",
             sv.ports[3]);
    cr_assert(strstr(idem_errdetail(s), "no master '" MASTER "' found") &&
              strstr(idem_errdetail(s), refused) &&
              strstr(idem_errdetail(s), hung), "%s", idem_errdetail(s));
    idem_close(s);
    th_signal(&sv, sv.ports[3], SIGCONT);
}

/* The servers' password and the sentinels' own, each where it belongs,
 * and neither ever shown: in an error of the library or of the CLI, or
 * in what `idem stats` prints. */
#define PW "Sv-9kq2-Pw"
#define SPW "Sn-4mx8-Pw"

static void expect_refused(const char *uri)
{
    idem_store *s;
    int rc = open_rc(uri, &s);
    cr_assert_eq(rc, IDEM_EAUTH, "%s: %s", idem_strerror(rc),
                 idem_errdetail(s));
    cr_assert(strstr(idem_errdetail(s), "refused the credentials"), "%s",
              idem_errdetail(s));
    cr_assert(!strstr(idem_errdetail(s), "Pw"), "%s", idem_errdetail(s));
    idem_close(s);
}

Test(sentinel, passwords_go_where_they_belong_and_never_show)
{
    th_start_sentinel_auth(&sv, MASTER, PW, SPW);
    char uri[1024], prefix[64];
    snprintf(prefix, sizeof prefix, "%s", th_prefix());
    sentinel_uri(uri, sizeof uri, ":" PW "@", MASTER, prefix,
                 "&sentinel_password=" SPW);
    idem_store *s = open_ok(uri);
    claim_new(s, "p1");
    idem_close(s);
    char *dir = t_tmpdir();
    t_write(t_path(dir, "spw"), SPW "\n", strlen(SPW) + 1);
    cr_assert_eq(chmod(t_path(dir, "spw"), 0600), 0);
    char viafile[1400];
    snprintf(viafile, sizeof viafile, "redis-sentinel://:%s@127.0.0.1:%d/"
             MASTER "?prefix=%s&sentinel_password_file=%s", PW, sv.ports[3],
             prefix, t_path(dir, "spw"));
    s = open_ok(viafile);
    idem_close(s);
    char bad[1400];
    snprintf(bad, sizeof bad, "redis-sentinel://:%s@127.0.0.1:%d/" MASTER
             "?sentinel_password=wrongPw", PW, sv.ports[2]);
    expect_refused(bad);
    snprintf(bad, sizeof bad, "redis-sentinel://:%s@127.0.0.1:%d/" MASTER,
             PW, sv.ports[2]);
    expect_refused(bad);
    snprintf(bad, sizeof bad, "redis-sentinel://:wrongPw@127.0.0.1:%d/"
             MASTER "?sentinel_password=" SPW, sv.ports[2]);
    expect_refused(bad);
    cr_assert_eq(t_cli(dir, "stats --store '%s' > out 2>&1", uri), 0);
    cr_assert_neq(t_cli(dir, "stats --store '%s' >> out 2>&1", bad), 0);
    cr_assert(t_grep(t_path(dir, "out"), "sentinel_password=***"));
    cr_assert(!t_grep(t_path(dir, "out"), "Pw"), "%s",
              t_read(t_path(dir, "out"), NULL));
    t_rmdir(dir);
    free(dir);
}

/* ------------------------------------------------------------------------
 * Failover: kill -9 the master while one handle claims batch after
 * batch. Every call comes back, with outcomes or an error, within its
 * budget (plus slack: a hang check, not a speed check); the handle finds
 * the promoted replica without being reopened; afterwards every claim
 * that was acknowledged is looked for on the new master. With wait=1
 * none may be missing. Once the replica is master the killed server is
 * started again and made its replica (as an operator would; sentinel
 * would do it too, but only after 8 s), so that wait=1 can be met
 * again. */

enum { FBATCH = 20, FMAX = 4000, FTIMEOUT = 3000 };

typedef struct ack {
    char key[32];
    uint64_t token;
} ack;

typedef struct frun {
    ack *acks;
    size_t nacks, failed_keys, failed_calls, after;
    int64_t longest;
} frun;

static pid_t kill_soon(long pid)
{
    pid_t k = fork();
    cr_assert_geq(k, 0);
    if (k == 0) {
        t_sleep_ms(3);  /* lands while a batch is on the wire */
        kill((pid_t)pid, SIGKILL);
        _exit(0);
    }
    return k;
}

/* One batch; the acknowledged claims go to run. 1 if every key was. */
static int claim_batch(idem_store *s, int b, int killed, frun *run)
{
    char names[FBATCH][32];
    idem_key k[FBATCH];
    idem_outcome o[FBATCH];
    for (int i = 0; i < FBATCH; i++) {
        snprintf(names[i], sizeof names[i], "f-%d-%d", b, i);
        k[i] = (idem_key){names[i], strlen(names[i]), NULL};
    }
    int64_t t0 = t_mono_ms();
    int rc = idem_claim_many(s, k, FBATCH, NULL, o, 0);
    int64_t dt = t_mono_ms() - t0;
    run->longest = dt > run->longest ? dt : run->longest;
    cr_assert(dt < FTIMEOUT + 5000, "a call took %lld ms", (long long)dt);
    run->failed_calls += rc != 0;
    int all = 1;
    for (int i = 0; i < FBATCH; i++) {
        if (o[i].status) {
            run->failed_keys++;
            all = 0;
            continue;
        }
        cr_assert_eq(o[i].kind, IDEM_NEW, "%s", names[i]);
        memcpy(run->acks[run->nacks].key, names[i], sizeof names[i]);
        run->acks[run->nacks++].token = o[i].token;
        run->after += killed;
    }
    return all;
}

/* The killed master back, as the promoted replica's replica. */
static void rejoin(int victim, int promoted)
{
    th_restart(&sv, victim);
    redisContext *c = th_connect(victim);
    freeReplyObject(th_cmd(c, "REPLICAOF 127.0.0.1 %d", promoted));
    redisFree(c);
}

/* Own sentinels over a master and its replica, and a store opened
 * through them with timeout_ms and wait=wait_n; prefix (64 bytes) gets
 * the store's key prefix. */
static idem_store *open_own_sentinels(char *prefix, int timeout_ms,
                                      int wait_n)
{
    char uri[1024], extra[64];
    th_start_sentinel(&sv, MASTER);
    snprintf(prefix, 64, "%s", th_prefix());
    snprintf(extra, sizeof extra, "&timeout_ms=%d&wait=%d", timeout_ms,
             wait_n);
    sentinel_uri(uri, sizeof uri, NULL, MASTER, prefix, extra);
    return open_ok(uri);
}

static size_t failover_run(int wait_n)
{
    char prefix[64];
    idem_store *s = open_own_sentinels(prefix, FTIMEOUT, wait_n);
    int victim = sv.ports[0], replica = sv.ports[1];
    frun run = {calloc(FBATCH * FMAX, sizeof(ack)), 0, 0, 0, 0, 0};
    cr_assert(run.acks);
    int killed = 0, rejoined = 0, ok_run = 0;
    pid_t killer = -1;
    int64_t give_up = t_mono_ms() + 40000;
    for (int b = 0; b < FMAX && !(rejoined && ok_run >= 20) &&
                    t_mono_ms() < give_up;
         b++) {
        if (b == 20) {
            killer = kill_soon(th_pid(&sv, victim));
            killed = 1;
        }
        int all = claim_batch(s, b, killed, &run);
        ok_run = all ? ok_run + 1 : 0;
        if (killed && !rejoined && is_master(replica)) {
            rejoin(victim, replica);
            rejoined = 1;
            ok_run = 0;  /* the calls that count come after */
        }
    }
    cr_assert(rejoined && ok_run >= 20, "claims never came back");
    cr_assert_gt(run.after, 0);
    cr_assert_eq(waitpid(killer, NULL, 0), killer);
    /* Every acknowledged claim, looked for on the new master. */
    redisContext *c = th_connect(replica);
    size_t lost = 0;
    for (size_t i = 0; i < run.nacks; i++)
        lost += raw_token(c, prefix, run.acks[i].key) != run.acks[i].token;
    redisFree(c);
    /* Scans go to the new master too. */
    idem_stats st;
    cr_assert_eq(idem_stats_get(s, &st), 0, "%s", idem_errdetail(s));
    cr_assert_geq(st.live_keys, run.nacks - lost);
    idem_close(s);
    T_REPORT("sentinel failover, wait=%d: master %d killed, replica %d "
             "promoted; %zu claims acknowledged (%zu after the kill), %zu of "
             "them lost; %zu keys and %zu calls failed with an error during "
             "the failover; longest call %lld ms (timeout %d ms)", wait_n,
             victim, replica, run.nacks, run.after, lost, run.failed_keys,
             run.failed_calls, (long long)run.longest, FTIMEOUT);
    free(run.acks);
    return lost;
}

Test(sentinel, failover_under_load)
{
    failover_run(0);
}

Test(sentinel, failover_with_wait_loses_no_acknowledged_claim)
{
    size_t lost = failover_run(1);
    cr_assert_eq(lost, 0, "wait=1 lost %zu acknowledged claims", lost);
}

/* ------------------------------------------------------------------------
 * Acknowledged but not replicated, staged. On loopback a replica trails
 * its master by microseconds, so the kill above all but never lands
 * between a claim's acknowledgement and its replication, and wait=0
 * loses nothing either: that test cannot show what wait is for. This one
 * holds the window open, as the cluster's staged test does: SIGSTOP the
 * replica R and close the master M's replication link (CLIENT KILL TYPE
 * replica: what M sent would otherwise wait in R's socket and be applied
 * on SIGCONT); claim SKEYS keys; kill -9 M, SIGCONT R, wait until the
 * sentinels have promoted R; claim the same keys through a new handle. A
 * key that comes back NEW had lost its record. Without wait every claim
 * is acknowledged and every one is lost; with wait=1 every claim fails
 * with IDEM_ETIMEOUT ("WAIT 1: only 0 replica(s)") and none that was
 * acknowledged is lost. */

enum { SKEYS = 32, STIMEOUT = 2000 };

typedef struct staged {
    size_t acked, failed, lost;
    int64_t longest;
    char detail[256];
} staged;

static int stopped(int port)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", th_pid(&sv, port));
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');  /* "pid (comm) S ..." */
    return p && p[1] == ' ' && p[2] == 'T';
}

static int refuses(int port)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    int down = !c || c->err;
    redisFree(c);
    return down;
}

static int unlinked(int port)
{
    redisContext *c = th_connect(port);
    redisReply *r = th_cmd(c, "INFO replication");
    int none = r->type == REDIS_REPLY_STRING &&
               strstr(r->str, "connected_slaves:0");
    freeReplyObject(r);
    redisFree(c);
    return none;
}

/* Poll (never a fixed sleep: the machine may be slow) until cond(port)
 * holds or ms have passed; whether it held. */
static int poll_until(int (*cond)(int), int port, int64_t ms)
{
    for (int64_t end = t_mono_ms() + ms; !cond(port); t_sleep_ms(50))
        if (t_mono_ms() > end)
            return 0;
    return 1;
}

/* The SKEYS keys "s-N", claimed through s; outcomes in o. */
static int claim_staged(idem_store *s, idem_outcome *o, int64_t *dt)
{
    char names[SKEYS][16];
    idem_key k[SKEYS];
    for (int i = 0; i < SKEYS; i++) {
        snprintf(names[i], sizeof names[i], "s-%d", i);
        k[i] = (idem_key){names[i], strlen(names[i]), NULL};
    }
    int64_t t0 = t_mono_ms();
    int rc = idem_claim_many(s, k, SKEYS, NULL, o, 0);
    *dt = t_mono_ms() - t0;
    return rc;
}

static staged staged_run(int wait_n)
{
    char prefix[64], uri[1024];
    idem_store *s = open_own_sentinels(prefix, STIMEOUT, wait_n);
    int m = sv.ports[0], r = sv.ports[1];
    th_signal(&sv, r, SIGSTOP);
    cr_assert(poll_until(stopped, r, 5000), "replica %d never stopped", r);
    redisContext *c = th_connect(m);
    freeReplyObject(th_cmd(c, "CLIENT KILL TYPE replica"));
    redisFree(c);
    cr_assert(poll_until(unlinked, m, 5000), "the link never closed");
    staged st = {0, 0, 0, 0, ""};
    idem_outcome o[SKEYS];
    claim_staged(s, o, &st.longest);
    cr_assert(st.longest < STIMEOUT + 5000, "a call took %lld ms",
              (long long)st.longest);
    for (int i = 0; i < SKEYS; i++) {
        st.acked += o[i].status == 0;
        st.failed += o[i].status == IDEM_ETIMEOUT;
    }
    snprintf(st.detail, sizeof st.detail, "%s", idem_errdetail(s));
    idem_close(s);
    th_kill9(&sv, m);
    cr_assert(poll_until(refuses, m, 5000), "master %d never died", m);
    th_signal(&sv, r, SIGCONT);
    cr_assert(poll_until(is_master, r, 30000), "replica %d never promoted",
              r);
    /* Through the sentinels again, with room for the switch to end. */
    sentinel_uri(uri, sizeof uri, NULL, MASTER, prefix, "&timeout_ms=10000");
    s = open_ok(uri);
    int64_t dt;
    idem_outcome again[SKEYS];
    cr_assert_eq(claim_staged(s, again, &dt), 0, "%s", idem_errdetail(s));
    for (int i = 0; i < SKEYS; i++)
        st.lost += o[i].status == 0 && again[i].kind == IDEM_NEW;
    idem_close(s);
    T_REPORT("sentinel, staged, wait=%d: %zu claims acknowledged, %zu lost, "
             "%zu failed with IDEM_ETIMEOUT; longest call %lld ms (timeout "
             "%d ms)%s%s", wait_n, st.acked, st.lost, st.failed,
             (long long)st.longest, STIMEOUT, st.failed ? "; " : "",
             st.failed ? st.detail : "");
    return st;
}

Test(sentinel, without_wait_acknowledged_claims_die_with_the_master)
{
    staged st = staged_run(0);
    cr_assert_eq(st.acked, SKEYS);
    cr_assert_eq(st.lost, SKEYS, "only %zu of %d lost: the window was not "
                 "held open", st.lost, SKEYS);
}

Test(sentinel, wait_fails_the_claims_it_cannot_keep)
{
    staged st = staged_run(1);
    cr_assert_eq(st.lost, 0, "wait=1 lost %zu acknowledged claims", st.lost);
    cr_assert_eq(st.acked, 0);
    cr_assert_eq(st.failed, SKEYS);
    cr_assert(strstr(st.detail, "WAIT 1: only 0 replica(s) acknowledged"),
              "%s", st.detail);
}
