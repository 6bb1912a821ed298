/* tests/test_redis_cluster.c - a Redis Cluster changing shape under load:
 * a slot migrated by hand while two processes claim its keys, and a
 * master killed with kill -9 while claims keep coming. Each test starts
 * its own cluster, since it breaks it on purpose. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "crc16.h"
#include "redis_harness.h"

static th_servers sv;

/* What these tests measure goes to the log and, so that a plain
 * `make test` shows it, to stderr. */
#define REPORT(...)                                                        \
    do {                                                                   \
        cr_log_info(__VA_ARGS__);                                          \
        fprintf(stderr, "[info] " __VA_ARGS__);                            \
        fputc('\n', stderr);                                              \
    } while (0)

static void fini(void)
{
    th_stop(&sv);
}

TestSuite(cluster_ops, .fini = fini, .timeout = 180);

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void cluster_uri(char *buf, size_t cap, const char *prefix,
                        const char *extra)
{
    size_t n = (size_t)snprintf(buf, cap, "redis-cluster://");
    for (int i = 0; i < sv.n && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s127.0.0.1:%d",
                              i ? "," : "", sv.ports[i]);
    snprintf(buf + n, cap - n, "?prefix=%s%s", prefix, extra);
}

/* ------------------------------------------------------------------------
 * Slot migration: MIGRATING/IMPORTING by hand, keys moved with MIGRATE in
 * small steps, then SETSLOT NODE. Meanwhile two processes claim the same
 * keys (most of them in the migrating slot): each key must be NEW exactly
 * once between them (no doubled claim), and every claim must be there
 * afterwards (no lost claim). ASK covers keys already moved or new, MOVED
 * the end of the migration. */

enum { MKEYS = 3000, MBATCH = 5 };

static void mkey(char *buf, size_t cap, int i)
{
    /* "m}..." : the hash tag of PREFIX{m}...} is "m", so these keys all
     * live in one slot; every fourth key is elsewhere. */
    if (i % 4 == 3)
        snprintf(buf, cap, "other%d", i);
    else
        snprintf(buf, cap, "m}%d", i);
}

static void migration_child(const char *uri, const char *out, int reverse)
{
    idem_options o;
    idem_options_init(&o);
    idem_store *s;
    if (idem_open(uri, &o, &s))
        _exit(2);
    FILE *f = fopen(out, "w");
    if (!f)
        _exit(3);
    for (int i = 0; i < MKEYS; i += MBATCH) {
        char names[MBATCH][32];
        idem_key k[MBATCH];
        idem_outcome r[MBATCH];
        for (int j = 0; j < MBATCH; j++) {
            int idx = reverse ? MKEYS - 1 - (i + j) : i + j;
            mkey(names[j], sizeof names[j], idx);
            k[j] = (idem_key){names[j], strlen(names[j]), NULL};
        }
        int rc = idem_claim_many(s, k, MBATCH, NULL, r, 0);
        for (int j = 0; j < MBATCH; j++)
            fprintf(f, "%s %d %d %d\n", names[j], rc, r[j].status, r[j].kind);
        sleep_ms(1);
    }
    fclose(f);
    idem_close(s);
    _exit(0);
}

Test(cluster_ops, slot_migration_while_claiming)
{
    th_start_cluster(&sv, 3, 0);
    char prefix[64], uri[1024];
    snprintf(prefix, sizeof prefix, "%s", th_prefix());
    cluster_uri(uri, sizeof uri, prefix, "&timeout_ms=20000");
    char tagged[128];
    int n = snprintf(tagged, sizeof tagged, "%s{m}0}", prefix);
    unsigned slot = idem__key_slot(tagged, (size_t)n);
    int src = th_slot_owner(sv.ports[0], slot);
    int dst = -1;
    for (int i = 0; i < sv.n && dst < 0; i++)
        if (sv.ports[i] != src)
            dst = sv.ports[i];
    char src_id[64], dst_id[64];
    th_node_id(src, src_id);
    th_node_id(dst, dst_id);
    char *dir = t_tmpdir();
    pid_t kids[2];
    for (int p = 0; p < 2; p++) {
        char out[4200];
        snprintf(out, sizeof out, "%s/%d", dir, p);
        kids[p] = fork();
        cr_assert(kids[p] >= 0);
        if (kids[p] == 0)
            migration_child(uri, out, p);
    }
    /* Let a good part of the keys be created on the source first: they
     * move with MIGRATE, the later ones are created on the target (ASK). */
    sleep_ms(300);
    redisContext *cs = th_connect(src), *cd = th_connect(dst);
    freeReplyObject(th_cmd(cd, "CLUSTER SETSLOT %u IMPORTING %s", slot,
                           src_id));
    freeReplyObject(th_cmd(cs, "CLUSTER SETSLOT %u MIGRATING %s", slot,
                           dst_id));
    int moved = 0;
    for (;;) {
        redisReply *r = th_cmd(cs, "CLUSTER GETKEYSINSLOT %u 10", slot);
        cr_assert_eq(r->type, REDIS_REPLY_ARRAY);
        if (r->elements == 0) {
            freeReplyObject(r);
            break;
        }
        const char *argv[32];
        size_t lens[32];
        char port[16];
        snprintf(port, sizeof port, "%d", dst);
        int argc = 0;
        argv[argc] = "MIGRATE", lens[argc++] = 7;
        argv[argc] = "127.0.0.1", lens[argc++] = 9;
        argv[argc] = port, lens[argc++] = strlen(port);
        argv[argc] = "", lens[argc++] = 0;
        argv[argc] = "0", lens[argc++] = 1;
        argv[argc] = "5000", lens[argc++] = 4;
        argv[argc] = "KEYS", lens[argc++] = 4;
        for (size_t i = 0; i < r->elements; i++) {
            argv[argc] = r->element[i]->str;
            lens[argc++] = r->element[i]->len;
        }
        redisReply *m = redisCommandArgv(cs, argc, argv, lens);
        cr_assert(m && m->type == REDIS_REPLY_STATUS, "MIGRATE: %s",
                  m && m->str ? m->str : cs->errstr);
        moved += (int)r->elements;
        freeReplyObject(m);
        freeReplyObject(r);
        sleep_ms(5);
    }
    for (int i = 0; i < sv.n; i++) {
        redisContext *c = th_connect(sv.ports[i]);
        freeReplyObject(th_cmd(c, "CLUSTER SETSLOT %u NODE %s", slot,
                               dst_id));
        redisFree(c);
    }
    redisFree(cs);
    redisFree(cd);
    for (int p = 0; p < 2; p++) {
        int st;
        cr_assert_eq(waitpid(kids[p], &st, 0), kids[p]);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d", p);
    }
    /* Exactly one NEW per key between the two processes. */
    static unsigned char news[MKEYS];
    for (int p = 0; p < 2; p++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%d", dir, p);
        FILE *f = fopen(path, "r");
        cr_assert(f);
        char name[64];
        int rc, status, kind, lines = 0;
        while (fscanf(f, "%63s %d %d %d\n", name, &rc, &status, &kind) == 4) {
            cr_assert_eq(rc, 0, "%s: %s", name, idem_strerror(rc));
            cr_assert_eq(status, 0, "%s: %s", name, idem_strerror(status));
            int idx = (int)strtol(name[0] == 'm' ? name + 2 : name + 5, NULL,
                                  10);
            news[idx] += kind == IDEM_NEW;
            cr_assert(kind == IDEM_NEW || kind == IDEM_BUSY);
            lines++;
        }
        fclose(f);
        cr_assert_eq(lines, MKEYS);
    }
    for (int i = 0; i < MKEYS; i++)
        cr_assert_eq(news[i], 1, "key %d NEW %d times", i, news[i]);
    /* And every claim is where the map now says: none lost. */
    idem_store *s = t_open(uri);
    for (int i = 0; i < MKEYS; i++) {
        char name[32];
        mkey(name, sizeof name, i);
        idem_record rec;
        cr_assert_eq(idem_get(s, name, strlen(name), &rec), 0, "%s: %s",
                     name, idem_errdetail(s));
        cr_assert_eq(rec.token, 1);
    }
    idem_close(s);
    cr_assert_eq(th_slot_owner(sv.ports[0], slot), dst);
    REPORT("slot %u migrated from %d to %d: %d keys moved by MIGRATE "
                "while two processes claimed %d keys", slot, src, dst, moved,
                MKEYS);
    t_rmdir(dir);
    free(dir);
}

/* ------------------------------------------------------------------------
 * Failover: kill -9 the master of slot 0 while one client claims batch
 * after batch. Every call must come back (with outcomes or an error)
 * within its timeout; the client must find the promoted replica without
 * being reopened; afterwards every claim that was acknowledged (NEW with
 * status 0) must still be there. Without wait= a claim acknowledged by the
 * master but not yet sent to its replica can be lost; with wait=1 none may
 * be. The killed node is restarted once its replica has taken over and
 * rejoins as the new master's replica. */

enum { FBATCH = 40, FMAX_BATCHES = 3000 };

typedef struct ack {
    char key[32];
    uint64_t token;
} ack;

static int role_is_master(int port)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    if (!c || c->err) {
        redisFree(c);
        return 0;
    }
    redisReply *r = redisCommand(c, "ROLE");
    int m = r && r->type == REDIS_REPLY_ARRAY &&
            strcmp(r->element[0]->str, "master") == 0;
    freeReplyObject(r);
    redisFree(c);
    return m;
}

static void wait_link_up(int port)
{
    for (int i = 0; i < 400; i++) {
        redisContext *c = redisConnect("127.0.0.1", port);
        redisReply *r = c && !c->err ? redisCommand(c, "INFO replication")
                                     : NULL;
        int up = r && r->type == REDIS_REPLY_STRING &&
                 strstr(r->str, "master_link_status:up");
        freeReplyObject(r);
        redisFree(c);
        if (up)
            return;
        sleep_ms(50);
    }
    cr_assert_fail("node %d never synced with its master", port);
}

static size_t failover_phase(int wait, const char *tag)
{
    enum { TIMEOUT = 8000 };
    char prefix[64], uri[1024], extra[64];
    snprintf(prefix, sizeof prefix, "%s", th_prefix());
    snprintf(extra, sizeof extra, "&timeout_ms=%d&wait=%d", TIMEOUT, wait);
    cluster_uri(uri, sizeof uri, prefix, extra);
    int live = -1;
    for (int i = 0; i < sv.n && live < 0; i++)
        if (role_is_master(sv.ports[i]))
            live = sv.ports[i];
    int victim = th_slot_owner(live, 0);
    int replica = th_replica_of(&sv, victim);
    cr_assert(replica > 0, "master %d has no replica", victim);
    idem_store *s = t_open(uri);
    static ack acks[FBATCH * FMAX_BATCHES];
    size_t nacks = 0, failed_keys = 0, failed_calls = 0;
    int64_t longest = 0;
    int killed_at = -1, restarted = 0, ok_run = 0;
    pid_t killer = -1;
    for (int b = 0; b < FMAX_BATCHES; b++) {
        if (b == 20) {
            /* The kill lands while a batch is on the wire. */
            char pidfile[1200];
            snprintf(pidfile, sizeof pidfile, "%s/%d/pid", sv.dir, victim);
            FILE *f = fopen(pidfile, "r");
            cr_assert(f);
            long pid = 0;
            cr_assert_eq(fscanf(f, "%ld", &pid), 1);
            fclose(f);
            killer = fork();
            if (killer == 0) {
                sleep_ms(3);
                kill((pid_t)pid, SIGKILL);
                _exit(0);
            }
            killed_at = b;
        }
        char names[FBATCH][32];
        idem_key k[FBATCH];
        idem_outcome o[FBATCH];
        for (int i = 0; i < FBATCH; i++) {
            snprintf(names[i], sizeof names[i], "%s-%d-%d", tag, b, i);
            k[i] = (idem_key){names[i], strlen(names[i]), NULL};
        }
        int64_t t0 = mono_ms();
        int rc = idem_claim_many(s, k, FBATCH, NULL, o, 0);
        int64_t dt = mono_ms() - t0;
        if (dt > longest)
            longest = dt;
        /* Not a speed check: a call that took longer than its whole
         * budget plus generous slack would be a hang. */
        cr_assert(dt < TIMEOUT + 5000, "a call took %lld ms", (long long)dt);
        failed_calls += rc != 0;
        int all_ok = 1;
        for (int i = 0; i < FBATCH; i++) {
            if (o[i].status == 0) {
                cr_assert_eq(o[i].kind, IDEM_NEW, "%s", names[i]);
                memcpy(acks[nacks].key, names[i], sizeof names[i]);
                acks[nacks++].token = o[i].token;
            } else {
                failed_keys++;
                all_ok = 0;
            }
        }
        if (killed_at >= 0 && !restarted && role_is_master(replica)) {
            th_restart(&sv, victim);
            restarted = 1;
        }
        ok_run = all_ok ? ok_run + 1 : 0;
        if (restarted && ok_run >= 20)
            break;
    }
    cr_assert(restarted && ok_run >= 20, "the cluster never recovered");
    int st;
    waitpid(killer, &st, 0);
    wait_link_up(victim);
    /* Every acknowledged claim must still be there, as it was. */
    size_t lost = 0;
    for (size_t i = 0; i < nacks; i++) {
        idem_record rec;
        int rc = idem_get(s, acks[i].key, strlen(acks[i].key), &rec);
        cr_assert(rc == 0 || rc == IDEM_ENOTFOUND, "%s: %s", acks[i].key,
                  idem_errdetail(s));
        if (rc == IDEM_ENOTFOUND || rec.token != acks[i].token)
            lost++;
    }
    idem_close(s);
    REPORT("failover, wait=%d: master %d killed, replica %d promoted; "
                "%zu claims acknowledged, %zu of them lost; %zu keys and "
                "%zu calls failed with an error during the failover; "
                "longest call %lld ms (timeout %d ms)", wait, victim,
                replica, nacks, lost, failed_keys, failed_calls,
                (long long)longest, TIMEOUT);
    return lost;
}

Test(cluster_ops, failover_under_load)
{
    th_start_cluster(&sv, 3, 1);
    failover_phase(0, "nowait");
    size_t lost = failover_phase(1, "wait1");
    cr_assert_eq(lost, 0, "wait=1 lost %zu acknowledged claims", lost);
}

/* A master dies and has no replica to take over: the cluster cannot serve
 * its slots. Every call fails within its budget (after retrying through
 * refused connections and CLUSTERDOWN), however many of the batch's keys
 * the dead node owns; once the node is back the same handle works. */
Test(cluster_ops, dead_master_without_replica)
{
    enum { N = 600, TIMEOUT = 1000 };
    th_start_cluster(&sv, 3, 0);
    char uri[1024];
    cluster_uri(uri, sizeof uri, th_prefix(), "&timeout_ms=1000");
    idem_store *s = t_open(uri);
    static char names[N][16];
    static idem_key keys[N];
    static idem_outcome outs[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "d%d", i);
        keys[i] = (idem_key){names[i], strlen(names[i]), NULL};
    }
    int victim = sv.ports[0];
    th_kill9(&sv, victim);
    int64_t longest = 0;
    for (int round = 0; round < 3; round++) {
        int64_t t0 = mono_ms();
        int rc = idem_claim_many(s, keys, N, NULL, outs, 0);
        int64_t dt = mono_ms() - t0;
        longest = dt > longest ? dt : longest;
        cr_assert(rc == IDEM_ECONN || rc == IDEM_ETIMEOUT, "%s: %s",
                  idem_strerror(rc), idem_errdetail(s));
        /* Not a speed check: a call far past its budget would hang. */
        cr_assert(dt < TIMEOUT + 5000, "a call took %lld ms", (long long)dt);
    }
    REPORT("dead master, no replica: calls failed with an error after at "
           "most %lld ms (timeout %d ms)", (long long)longest, TIMEOUT);
    th_restart(&sv, victim);
    int rc = -1;
    for (int i = 0; i < 100 && rc != 0; i++)
        rc = idem_claim_many(s, keys, N, NULL, outs, 0);
    cr_assert_eq(rc, 0, "%s", idem_errdetail(s));
    for (int i = 0; i < N; i++)
        cr_assert(outs[i].kind == IDEM_NEW || outs[i].kind == IDEM_BUSY);
    idem_close(s);
}
