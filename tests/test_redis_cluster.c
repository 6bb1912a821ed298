/* tests/test_redis_cluster.c - a Redis Cluster changing shape under load:
 * a slot migrated by hand while two processes claim its keys, a master
 * killed with kill -9 while claims keep coming, and a master killed
 * while its replica is cut off, to show which acknowledged claims die
 * with it with and without wait=1. Each test starts its own cluster,
 * since it breaks it on purpose. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "redis/crc16.h"
#include "redis_harness.h"

static th_servers sv;

static void fini(void)
{
    th_stop(&sv);
}

TestSuite(cluster_ops, .fini = fini, .timeout = 180);

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
    idem_opts o;
    idem_opts_init(&o);
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
        t_sleep_ms(1);
    }
    fclose(f);
    idem_close(s);
    _exit(0);
}

/* MIGRATE up to count keys of slot from the node of cs to port dst;
 * how many moved (0: the slot is empty there). */
static int migrate_some(redisContext *cs, int dst, unsigned slot,
                        unsigned count)
{
    redisReply *r = th_cmd(cs, "CLUSTER GETKEYSINSLOT %u %u", slot, count);
    cr_assert_eq(r->type, REDIS_REPLY_ARRAY);
    int n = (int)r->elements;
    if (n == 0) {
        freeReplyObject(r);
        return 0;
    }
    const char **argv = calloc(r->elements + 7, sizeof *argv);
    size_t *lens = calloc(r->elements + 7, sizeof *lens);
    cr_assert(argv && lens);
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
    freeReplyObject(m);
    freeReplyObject(r);
    free(argv);
    free(lens);
    return n;
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
    t_sleep_ms(300);
    redisContext *cs = th_connect(src), *cd = th_connect(dst);
    freeReplyObject(th_cmd(cd, "CLUSTER SETSLOT %u IMPORTING %s", slot,
                           src_id));
    freeReplyObject(th_cmd(cs, "CLUSTER SETSLOT %u MIGRATING %s", slot,
                           dst_id));
    int moved = 0;
    for (int m; (m = migrate_some(cs, dst, slot, 10)) > 0; t_sleep_ms(5))
        moved += m;
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
        cr_assert_eq(rec.attempts, 1, "%s: claimed once", name);
    }
    idem_close(s);
    cr_assert_eq(th_slot_owner(sv.ports[0], slot), dst);
    T_REPORT("slot %u migrated from %d to %d: %d keys moved by MIGRATE "
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
 * be. On loopback the replica is so close behind that the kill all but
 * never lands in that window, so both runs usually lose nothing: the
 * staged test below (wait_keeps_claims_async_loses_them) holds the window
 * open to show the difference. The killed node is restarted once its
 * replica has taken over and rejoins as the new master's replica. */

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
        t_sleep_ms(50);
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
                t_sleep_ms(3);
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
        int64_t t0 = t_mono_ms();
        int rc = idem_claim_many(s, k, FBATCH, NULL, o, 0);
        int64_t dt = t_mono_ms() - t0;
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
    T_REPORT("failover, wait=%d: master %d killed, replica %d promoted; "
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

/* ------------------------------------------------------------------------
 * Acknowledged but not replicated, staged. On loopback a replica trails
 * its master by microseconds, so a kill -9 under load (above) almost
 * never lands between a claim's acknowledgement and its replication, and
 * loses nothing with or without wait=1: that test cannot show what wait
 * is for. This one holds the window open on purpose:
 *
 *   1. pick a master M with a synced replica R; SIGSTOP R, then close M's
 *      replication link (CLIENT KILL TYPE replica). R, stopped, cannot
 *      reconnect, so from here on M's writes reach no replica. (Stopping
 *      R alone is not enough: what M sends lands in R's socket buffer,
 *      and R would apply it on SIGCONT.)
 *   2. claim keys through idem, most of them in M's slots, the others on
 *      masters whose replicas are fine;
 *   3. kill -9 M (and wait until it is gone, so R cannot resync from it),
 *      SIGCONT R, and wait until R has been promoted;
 *   4. claim the same keys again through a new handle: a key that comes
 *      back NEW had no record any more. If its first claim was
 *      acknowledged, that claim was lost: a second worker would run the
 *      effect again.
 *
 * Without wait every claim is acknowledged and every one in M's slots is
 * lost, deterministically. With wait=1 the claims in M's slots fail with
 * IDEM_ETIMEOUT (WAIT 1 answered 0 replicas) and none that was
 * acknowledged is lost. Either way every call answers within its
 * timeout, and the keys on the healthy masters are acknowledged and kept.
 * Both phases run on one cluster: the second picks a master that still
 * has a replica. */

enum { SKEYS = 96, SCALLS = 3, STIMEOUT = 3000, SRETRY_TIMEOUT = 10000 };

typedef struct staged {
    int master, replica;      /* M and R */
    int takeover;             /* R needed CLUSTER FAILOVER TAKEOVER */
    size_t on_m;              /* keys in M's slots (the rest elsewhere) */
    size_t acked_m, acked_other;   /* first claims answered NEW */
    size_t failed_m, failed_other; /* ... or with an error */
    size_t failed_timeout;    /* ... that error being IDEM_ETIMEOUT */
    size_t lost_m, lost_other;     /* acknowledged, then NEW again */
    size_t unacked_gone;      /* failed, and NEW again: never replicated */
    int64_t longest;          /* longest call, ms */
    int64_t promote_ms;       /* from M's death to R serving its slots */
    char detail[256];         /* idem_errdetail() of a failed claim */
} staged;

/* A field of INFO section on port, as a number; -1 if absent. */
static long info_num(int port, const char *section, const char *field)
{
    redisContext *c = th_connect(port);
    redisReply *r = th_cmd(c, "INFO %s", section);
    long v = -1;
    size_t fl = strlen(field);
    for (const char *p = r->type == REDIS_REPLY_STRING ? r->str : NULL; p;
         p = strchr(p, '\n')) {
        p += *p == '\n';
        if (strncmp(p, field, fl) == 0 && p[fl] == ':') {
            v = strtol(p + fl + 1, NULL, 10);
            break;
        }
    }
    freeReplyObject(r);
    redisFree(c);
    return v;
}

/* The state letter of /proc/PID/stat ('T' once SIGSTOP took effect). */
static char proc_state(long pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* "pid (comm) S ...": comm may hold spaces, so look after the ')'. */
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : 0;
}

/* Poll (never a fixed sleep: the machine may be slow) until cond(port)
 * holds or ms have passed; whether it held. */
static int poll_until(int (*cond)(int), int port, int64_t ms)
{
    int64_t end = t_mono_ms() + ms;
    for (;;) {
        if (cond(port))
            return 1;
        if (t_mono_ms() > end)
            return 0;
        t_sleep_ms(50);
    }
}

static int is_stopped(int port)
{
    return proc_state(th_pid(&sv, port)) == 'T';
}

static int refuses(int port)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    int down = !c || c->err;
    redisFree(c);
    return down;
}

static int no_replica_linked(int port)
{
    return info_num(port, "replication", "connected_slaves") == 0;
}

/* R is a master and, in its own view, the cluster serves every slot. */
static int promoted(int port)
{
    if (!role_is_master(port))
        return 0;
    redisContext *c = redisConnect("127.0.0.1", port);
    redisReply *r = c && !c->err ? redisCommand(c, "CLUSTER INFO") : NULL;
    int ok = r && r->type == REDIS_REPLY_STRING &&
             strstr(r->str, "cluster_state:ok");
    freeReplyObject(r);
    redisFree(c);
    return ok;
}

/* A live master that has a replica (-1 if none), and that replica. */
static int master_with_replica(int *replica)
{
    for (int i = 0; i < sv.n; i++) {
        int p = sv.ports[i];
        if (refuses(p) || !role_is_master(p))
            continue;
        int r = th_replica_of(&sv, p);
        if (r > 0) {
            *replica = r;
            return p;
        }
    }
    return -1;
}

/* owner[slot]: port of the master that serves it, as port sees it. */
static void slot_owners(int port, int *owner)
{
    for (unsigned k = 0; k < IDEM__SLOTS; k++)
        owner[k] = -1;
    redisContext *c = th_connect(port);
    redisReply *r = th_cmd(c, "CLUSTER SLOTS");
    cr_assert_eq(r->type, REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *e = r->element[i];
        for (long long k = e->element[0]->integer;
             k <= e->element[1]->integer; k++)
            owner[k] = (int)e->element[2]->element[1]->integer;
    }
    freeReplyObject(r);
    redisFree(c);
}

/* One claim call, its time bounded; the outcomes in o. */
static int timed_claim(idem_store *s, char (*names)[32], const size_t *idx,
                       size_t n, idem_outcome *o, int64_t timeout,
                       int64_t *longest)
{
    idem_key k[SKEYS];
    for (size_t i = 0; i < n; i++)
        k[i] = (idem_key){names[idx[i]], strlen(names[idx[i]]), NULL};
    int64_t t0 = t_mono_ms();
    int rc = idem_claim_many(s, k, n, NULL, o, 0);
    int64_t dt = t_mono_ms() - t0;
    *longest = dt > *longest ? dt : *longest;
    /* Not a speed check: a call far past its budget would be a hang. */
    cr_assert(dt < timeout + 5000, "a call took %lld ms (timeout %lld)",
              (long long)dt, (long long)timeout);
    return rc;
}

static void staged_phase(int wait, staged *st)
{
    memset(st, 0, sizeof *st);
    st->master = master_with_replica(&st->replica);
    cr_assert(st->master > 0, "no master with a replica left");
    int m = st->master, rep = st->replica;
    wait_link_up(rep);
    char prefix[64], uri[1024], extra[64];
    snprintf(prefix, sizeof prefix, "%s", th_prefix());

    /* Keys: two in three in M's slots, the rest on other masters that
     * have a replica (so that with wait=1 they can be acknowledged). */
    static int owner[IDEM__SLOTS];
    slot_owners(m, owner);
    static char names[SKEYS][32];
    int on_m[SKEYS];
    size_t want_m = SKEYS - SKEYS / 3, got_m = 0, got_o = 0;
    int healthy[TH_MAX_NODES], nh = 0;
    for (int i = 0; i < sv.n; i++)
        if (sv.ports[i] != m && !refuses(sv.ports[i]) &&
            role_is_master(sv.ports[i]) && th_replica_of(&sv, sv.ports[i]) > 0)
            healthy[nh++] = sv.ports[i];
    cr_assert(nh > 0, "no other master with a replica");
    for (int h = 0; h < nh; h++)
        wait_link_up(th_replica_of(&sv, healthy[h]));
    for (int c = 0; got_m + got_o < SKEYS; c++) {
        char name[32], tagged[128];
        snprintf(name, sizeof name, "w%d-%d", wait, c);
        int len = snprintf(tagged, sizeof tagged, "%s{%s}", prefix, name);
        int o = owner[idem__key_slot(tagged, (size_t)len)];
        int is_m = o == m, is_h = 0;
        for (int h = 0; h < nh; h++)
            is_h |= o == healthy[h];
        size_t at = got_m + got_o;
        if ((is_m && got_m < want_m) || (is_h && got_o < SKEYS - want_m)) {
            memcpy(names[at], name, sizeof name);
            on_m[at] = is_m;
            got_m += (size_t)is_m;
            got_o += (size_t)!is_m;
        }
    }
    st->on_m = got_m;

    /* Open before R stops: opening asks a node for the slot map, and a
     * stopped node accepts the connection but never answers. */
    snprintf(extra, sizeof extra, "&timeout_ms=%d&wait=%d", STIMEOUT, wait);
    cluster_uri(uri, sizeof uri, prefix, extra);
    idem_store *s = t_open(uri);

    /* 1. cut M off from its replica */
    th_signal(&sv, rep, SIGSTOP);
    cr_assert(poll_until(is_stopped, rep, 10000), "%d did not stop", rep);
    redisContext *cm = th_connect(m);
    redisReply *k = th_cmd(cm, "CLIENT KILL TYPE replica");
    cr_assert(k->type == REDIS_REPLY_INTEGER && k->integer >= 1,
              "CLIENT KILL TYPE replica on %d: %s", m,
              k->type == REDIS_REPLY_ERROR ? k->str : "killed none");
    freeReplyObject(k);
    redisFree(cm);
    cr_assert(poll_until(no_replica_linked, m, 10000),
              "%d still has a replica", m);

    /* 2. claim, SCALLS calls of SKEYS / SCALLS keys */
    static idem_outcome first[SKEYS];
    for (int call = 0; call < SCALLS; call++) {
        size_t idx[SKEYS], n = 0;
        for (size_t i = (size_t)call; i < SKEYS; i += SCALLS)
            idx[n++] = i;
        idem_outcome o[SKEYS];
        timed_claim(s, names, idx, n, o, STIMEOUT, &st->longest);
        for (size_t j = 0; j < n; j++) {
            size_t i = idx[j];
            first[i] = o[j];
            if (o[j].status == 0) {
                cr_assert_eq(o[j].kind, IDEM_NEW, "%s", names[i]);
                *(on_m[i] ? &st->acked_m : &st->acked_other) += 1;
            } else {
                *(on_m[i] ? &st->failed_m : &st->failed_other) += 1;
                st->failed_timeout += o[j].status == IDEM_ETIMEOUT;
                /* The detail starts with the URI: keep what follows. */
                const char *d = idem_errdetail(s);
                size_t ul = strlen(uri);
                if (strncmp(d, uri, ul) == 0 && d[ul] == ':')
                    d += ul + 1 + (d[ul + 1] == ' ');
                if (!st->detail[0])
                    snprintf(st->detail, sizeof st->detail, "%s", d);
            }
        }
    }
    idem_close(s);

    /* 3. M dies with the claims only it had; R takes over */
    th_signal(&sv, m, SIGKILL);
    cr_assert(poll_until(refuses, m, 10000), "%d did not die", m);
    int64_t dead_at = t_mono_ms();
    th_signal(&sv, rep, SIGCONT);
    /* The other masters mark M failed after the node timeout (1 s) and
     * vote R in (cluster-replica-validity-factor 0: however long R was
     * stopped). Should the election not come on a loaded machine, a
     * TAKEOVER needs no votes. */
    if (!poll_until(promoted, rep, 20000)) {
        redisContext *cr = th_connect(rep);
        redisReply *t = th_cmd(cr, "CLUSTER FAILOVER TAKEOVER");
        cr_assert(t->type == REDIS_REPLY_STATUS, "TAKEOVER: %s",
                  t->type == REDIS_REPLY_ERROR ? t->str : "?");
        freeReplyObject(t);
        redisFree(cr);
        st->takeover = 1;
        cr_assert(poll_until(promoted, rep, 20000), "%d not promoted", rep);
    }
    st->promote_ms = t_mono_ms() - dead_at;

    /* 4. claim again through a new handle. Without wait: a promoted R
     * has no replica of its own (M is dead), so wait=1 would fail here.
     * A key keeps its first answer: claiming it again would turn a NEW
     * (lost) into BUSY (our own second claim). */
    snprintf(extra, sizeof extra, "&timeout_ms=%d", SRETRY_TIMEOUT);
    cluster_uri(uri, sizeof uri, prefix, extra);
    idem_store *s2 = t_open(uri);
    static idem_outcome again[SKEYS];
    int answered[SKEYS] = {0};
    for (int round = 0; round < 5; round++) {
        size_t idx[SKEYS], n = 0;
        for (size_t i = 0; i < SKEYS; i++)
            if (!answered[i])
                idx[n++] = i;
        if (!n)
            break;
        idem_outcome o[SKEYS];
        timed_claim(s2, names, idx, n, o, SRETRY_TIMEOUT, &st->longest);
        for (size_t j = 0; j < n; j++)
            if (o[j].status == 0) {
                again[idx[j]] = o[j];
                answered[idx[j]] = 1;
            }
    }
    for (size_t i = 0; i < SKEYS; i++) {
        cr_assert(answered[i], "%s: no answer after the failover: %s",
                  names[i], idem_errdetail(s2));
        cr_assert(again[i].kind == IDEM_NEW || again[i].kind == IDEM_BUSY,
                  "%s: kind %d", names[i], again[i].kind);
        int gone = again[i].kind == IDEM_NEW;
        if (first[i].status == 0 && gone)
            *(on_m[i] ? &st->lost_m : &st->lost_other) += 1;
        else if (first[i].status != 0 && gone)
            st->unacked_gone++;
    }
    idem_close(s2);
}

static void staged_report(int wait, const staged *st)
{
    T_REPORT("staged failover, wait=%d: master %d killed with its replica %d "
             "cut off; %d promoted %s after %lld ms; %zu keys in its slots, "
             "%zu elsewhere; acknowledged=%zu (%zu in its slots), lost=%zu "
             "(%zu in its slots); failed=%zu (%zu in its slots; %zu of them "
             "NEW again after the failover)%s%s; longest call %lld ms "
             "(timeouts %d ms, %d ms after the failover)", wait, st->master,
             st->replica, st->replica,
             st->takeover ? "by TAKEOVER" : "by election",
             (long long)st->promote_ms, st->on_m, (size_t)SKEYS - st->on_m,
             st->acked_m + st->acked_other, st->acked_m,
             st->lost_m + st->lost_other, st->lost_m,
             st->failed_m + st->failed_other, st->failed_m, st->unacked_gone,
             st->detail[0] ? ", with " : "", st->detail,
             (long long)st->longest, STIMEOUT, SRETRY_TIMEOUT);
}

Test(cluster_ops, wait_keeps_claims_async_loses_them)
{
    th_start_cluster(&sv, 3, 1);
    staged a, b;
    staged_phase(0, &a);
    staged_report(0, &a);
    staged_phase(1, &b);
    staged_report(1, &b);
    T_REPORT("failover: wait=0 acknowledged=%zu lost=%zu; wait=1 "
             "acknowledged=%zu lost=%zu", a.acked_m + a.acked_other,
             a.lost_m + a.lost_other, b.acked_m + b.acked_other,
             b.lost_m + b.lost_other);
    /* Without wait: every claim acknowledged, and each one M had alone
     * is gone. */
    cr_assert_eq(a.failed_m + a.failed_other, 0, "%s", a.detail);
    cr_assert_gt(a.lost_m, 0);
    cr_assert_eq(a.lost_m, a.acked_m, "%zu of %zu claims in M's slots lost",
                 a.lost_m, a.acked_m);
    cr_assert_eq(a.lost_other, 0);
    /* With wait=1: the claims M could not replicate failed instead of
     * being acknowledged, and no acknowledged claim is lost. */
    cr_assert_eq(b.acked_m, 0);
    cr_assert_eq(b.failed_m, b.on_m);
    cr_assert_eq(b.failed_timeout, b.failed_m, "%s", b.detail);
    cr_assert_eq(b.failed_other, 0, "%s", b.detail);
    cr_assert_gt(b.acked_other, 0);
    cr_assert_eq(b.lost_m + b.lost_other, 0);
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
        int64_t t0 = t_mono_ms();
        int rc = idem_claim_many(s, keys, N, NULL, outs, 0);
        int64_t dt = t_mono_ms() - t0;
        longest = dt > longest ? dt : longest;
        cr_assert(rc == IDEM_ECONN || rc == IDEM_ETIMEOUT, "%s: %s",
                  idem_strerror(rc), idem_errdetail(s));
        /* Not a speed check: a call far past its budget would hang. */
        cr_assert(dt < TIMEOUT + 5000, "a call took %lld ms", (long long)dt);
    }
    T_REPORT("dead master, no replica: calls failed with an error after at "
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

/* ------------------------------------------------------------------------
 * A hung master: one that accepts connections and never answers (here
 * SIGSTOP; in life a long fork, a swapped-out process, a black hole). Its
 * keys fail within the timeout, but keys on the other masters must keep
 * working, and once its replica is promoted its keys too: the slot map
 * must be refreshable past a node that never answers. */

/* The nth key (k<i>) whose slot the master on port serves, under
 * prefix. */
static void key_on(const int *owner, int port, const char *prefix, int nth,
                   char out[32])
{
    for (int i = 0;; i++) {
        char name[128];
        snprintf(out, 32, "k%d", i);
        int n = snprintf(name, sizeof name, "%s{%s}", prefix, out);
        if (owner[idem__key_slot(name, (size_t)n)] == port && nth-- == 0)
            return;
    }
}

static int claim_rc(idem_store *s, const char *key, int64_t *took)
{
    idem_key k = {key, strlen(key), NULL};
    idem_outcome o;
    int64_t t0 = t_mono_ms();
    int rc = idem_claim(s, &k, NULL, &o);
    *took = t_mono_ms() - t0;
    return rc;
}

Test(cluster_ops, hung_master_does_not_stall_the_others)
{
    enum { TIMEOUT = 2000 };
    th_start_cluster(&sv, 3, 1);
    char prefix[64], uri[1024];
    snprintf(prefix, sizeof prefix, "%s", th_prefix());
    cluster_uri(uri, sizeof uri, prefix, "&timeout_ms=2000");
    idem_store *s = t_open(uri);
    static int owner[IDEM__SLOTS];
    int replica, hung = master_with_replica(&replica);
    cr_assert(hung > 0);
    slot_owners(hung, owner);
    char on_hung[32], elsewhere[32];
    key_on(owner, hung, prefix, 0, on_hung);
    int other = owner[0] == hung ? owner[IDEM__SLOTS - 1] : owner[0];
    key_on(owner, other, prefix, 0, elsewhere);
    int64_t took;
    cr_assert_eq(claim_rc(s, elsewhere, &took), 0, "%s", idem_errdetail(s));
    th_signal(&sv, hung, SIGSTOP);
    cr_assert(poll_until(is_stopped, hung, 10000));
    int rc = claim_rc(s, on_hung, &took);
    cr_assert(rc == IDEM_ETIMEOUT || rc == IDEM_ECONN, "%s",
              idem_strerror(rc));
    cr_assert(took < TIMEOUT + 5000, "a call took %lld ms", (long long)took);
    /* The other masters answer, call after call, while it hangs. */
    for (int i = 1; i <= 3; i++) {
        char k[32];
        key_on(owner, other, prefix, i, k);
        rc = claim_rc(s, k, &took);
        cr_assert_eq(rc, 0, "call %d on a healthy master: %s", i,
                     idem_errdetail(s));
    }
    /* Its replica takes over; the handle follows without a restart. */
    int64_t t0 = t_mono_ms();
    do {
        rc = claim_rc(s, on_hung, &took);
        cr_assert(took < TIMEOUT + 5000, "a call took %lld ms",
                  (long long)took);
    } while (rc && t_mono_ms() - t0 < 60000);
    cr_assert_eq(rc, 0, "after the failover: %s", idem_errdetail(s));
    T_REPORT("hung master %d: its keys failed within %d ms, the others "
             "answered; its replica %d served them %lld ms later", hung,
             TIMEOUT, replica, (long long)(t_mono_ms() - t0));
    idem_close(s);
}

/* ------------------------------------------------------------------------
 * A sweep while a slot migrates: records without a TTL, created long ago,
 * half of them moved to the target by MIGRATE. The target's SCAN finds
 * the moved ones, which the source (the owner by the map) redirects with
 * ASK; then the migration ends, more stale records are written, and the
 * handle's map is out of date (MOVED). Every stale record is swept, and
 * only those. */

/* n records of slot "m" without a TTL, created two hours ago, from
 * index first on, written on the node of c. */
static void stale_records(redisContext *c, const char *prefix, int first,
                          int n)
{
    for (int i = first; i < first + n; i++)
        freeReplyObject(th_cmd(c, "HSET %s{m}%d} status 1 token 1 "
                               "created_ts %lld response x", prefix, i,
                               (long long)(t_clock_ms - 7200 * 1000LL)));
}

Test(cluster_ops, sweep_while_slot_migrates)
{
    enum { N = 200 };
    th_start_cluster(&sv, 3, 0);
    char prefix[64], uri[1024];
    snprintf(prefix, sizeof prefix, "%s", th_prefix());
    cluster_uri(uri, sizeof uri, prefix, "&timeout_ms=20000");
    char tagged[128];
    int n = snprintf(tagged, sizeof tagged, "%s{m}0}", prefix);
    unsigned slot = idem__key_slot(tagged, (size_t)n);
    int src = th_slot_owner(sv.ports[0], slot);
    int dst = src == sv.ports[0] ? sv.ports[1] : sv.ports[0];
    char src_id[64], dst_id[64];
    th_node_id(src, src_id);
    th_node_id(dst, dst_id);
    redisContext *cs = th_connect(src), *cd = th_connect(dst);
    stale_records(cs, prefix, 0, N);
    idem_opts o = t_options();
    o.retention_ms = 3600 * 1000;
    idem_store *s;
    cr_assert_eq(idem_open(uri, &o, &s), 0, "%s", idem_errdetail(s));
    idem_key live = {"m}live", 6, NULL};
    idem_outcome out;
    cr_assert_eq(idem_claim(s, &live, NULL, &out), 0, "%s",
                 idem_errdetail(s));
    freeReplyObject(th_cmd(cd, "CLUSTER SETSLOT %u IMPORTING %s", slot,
                           src_id));
    freeReplyObject(th_cmd(cs, "CLUSTER SETSLOT %u MIGRATING %s", slot,
                           dst_id));
    int moved = 0;
    while (moved < N / 2)
        moved += migrate_some(cs, dst, slot, 10);
    uint64_t swept = 0;
    cr_assert_eq(idem_sweep(s, 0, &swept), 0, "%s", idem_errdetail(s));
    cr_assert_eq(swept, N, "every stale record, moved or not");
    for (int m; (m = migrate_some(cs, dst, slot, 10)) > 0;)
        moved += m;
    for (int i = 0; i < sv.n; i++) {
        redisContext *c = th_connect(sv.ports[i]);
        freeReplyObject(th_cmd(c, "CLUSTER SETSLOT %u NODE %s", slot,
                               dst_id));
        redisFree(c);
    }
    stale_records(cd, prefix, N, N);
    cr_assert_eq(idem_sweep(s, 0, &swept), 0, "%s", idem_errdetail(s));
    cr_assert_eq(swept, N, "the stale records written after the move");
    idem_record rec;
    cr_assert_eq(idem_get(s, "m}live", 6, &rec), 0, "%s", idem_errdetail(s));
    idem_stats st;
    cr_assert_eq(idem_stats_get(s, &st), 0, "%s", idem_errdetail(s));
    cr_assert_eq(st.live_keys, 1, "only the live claim is left");
    idem_close(s);
    redisFree(cs);
    redisFree(cd);
    T_REPORT("slot %u moving from %d to %d: %d stale records swept on both "
             "sides, then %d after the move", slot, src, dst, N, N);
}
