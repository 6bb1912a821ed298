/* rlock.c - one run of a job with a stream output at a time.
 *
 * A job's checkpoint holds one position in its output stream (job.c).
 * Two runs of the same job at once (the same command started twice, so
 * the same consumer name) would each write entries past that position
 * and each commit its own last entry to it: one run's commit moves the
 * position past entries of the other that are not committed yet, and a
 * crash of that other run then leaves them where no read-back looks, so
 * they are written again. An --output file is kept to one writer by
 * flock() (job.c), and a local: store by its own lock; a stream output
 * with a store that many processes share (Redis) needs a lock of its own.
 *
 * It lives on the output stream's server, beside the stream: the one
 * thing every run of the job reaches by construction (the job is named
 * after it). The store would be the other candidate, but the program
 * reaches the store only through libidem, which offers no such lock and
 * whose handle is used by one thread at a time, while the lock must be
 * renewed when no batch runs (a source waiting for entries). The key is
 * STREAM.idem-lock.HASH (HASH: of the job's name), so that a hash tag in
 * the stream's name puts it in the stream's slot of a cluster.
 *
 * SET NX PX --lease (1 s at least) takes it, and a thread of its own
 * renews it every third of the lease on a connection of its own (only
 * while the value is still ours, by a script). The value names the
 * holder: host, pid,
 * the process's start time and a random nonce. Another run is refused at
 * start with who holds it, unless the holder is a process of this host
 * that is gone (a kill -9: then it is taken at once, not after the
 * lease); one of another host that died is waited out, which the
 * message says. A run whose renewals failed for a whole lease (it
 * stalled, or lost its server) may have lost the lock to another run:
 * it writes nothing more and stops (rs_lock_lost). */
#include "rlock.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "cli.h"

#define TAKE_TRIES 3
#define MIN_LEASE_MS 1000

struct rs_lock {
    rs_conn c;
    char key[600];
    char val[400];
    char lease[24];
    int64_t lease_ms;
    pthread_t thread;
    int taken, running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int quit;
    atomic_int lost;
};

static const char RENEW[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";
static const char SWAP[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end "
    "return 0";
static const char DROP[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('DEL', KEYS[1]) end return 0";

/* When process pid started (clock ticks since boot, /proc), or 0. */
static uint64_t started(long pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "re");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

static void host_name(char *buf, size_t n)
{
    if (gethostname(buf, n) != 0)
        snprintf(buf, n, "localhost");
    buf[n - 1] = 0;
    buf[strcspn(buf, " ")] = 0;
}

/* The holder `val` names ("HOST PID START NONCE") is a process of this
 * host that is gone. */
static int holder_gone(const char *val)
{
    char host[256], mine[256];
    long pid;
    unsigned long long start;
    if (sscanf(val, "%255s %ld %llu", host, &pid, &start) != 3 || pid <= 0)
        return 0;
    host_name(mine, sizeof mine);
    if (strcmp(host, mine))
        return 0;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        return 1;
    return start && started(pid) != start;  /* the pid was reused */
}

/* One script on the lock's key; its integer reply, or -1. */
static long long script(rs_lock *l, const char *text, const char *a1,
                        const char *a2, const char *a3)
{
    const char *argv[] = {"EVAL", text, "1", l->key, a1, a2, a3};
    size_t lens[] = {4, strlen(text), 1, strlen(l->key), strlen(a1),
                     a2 ? strlen(a2) : 0, a3 ? strlen(a3) : 0};
    int argc = a3 ? 7 : a2 ? 6 : 5;
    redisReply *r = rs_call(&l->c, argc, argv, lens, 0, 1);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r && r->type == REDIS_REPLY_ERROR)
        snprintf(l->c.err, sizeof l->c.err, "%s", r->str);
    if (r)
        freeReplyObject(r);
    return v;
}

/* SET NX PX. 1 taken, 0 held by another, -1 an error. */
static int set_nx(rs_lock *l)
{
    const char *argv[] = {"SET", l->key, l->val, "NX", "PX", l->lease};
    size_t lens[] = {3, strlen(l->key), strlen(l->val), 2, 2,
                     strlen(l->lease)};
    redisReply *r = rs_call(&l->c, 6, argv, lens, 0, 0);
    int rc = !r ? -1
             : r->type == REDIS_REPLY_STATUS ? 1
             : r->type == REDIS_REPLY_NIL    ? 0
                                             : -1;
    if (r && r->type == REDIS_REPLY_ERROR)
        snprintf(l->c.err, sizeof l->c.err, "%s", r->str);
    if (r)
        freeReplyObject(r);
    return rc;
}

/* Who holds it (into val, n bytes) and for how long (*ttl, ms). 1, 0
 * when nobody does any more, -1 an error. */
static int holder(rs_lock *l, char *val, size_t n, long long *ttl)
{
    const char *get[] = {"GET", l->key}, *pttl[] = {"PTTL", l->key};
    size_t lens[] = {0, strlen(l->key)};
    lens[0] = 3;
    redisReply *r = rs_call(&l->c, 2, get, lens, 0, 1);
    int rc = !r ? -1 : r->type == REDIS_REPLY_STRING ? 1
             : r->type == REDIS_REPLY_NIL ? 0 : -1;
    if (rc == 1)
        snprintf(val, n, "%.*s", (int)r->len, r->str);
    if (r)
        freeReplyObject(r);
    lens[0] = 4;
    r = rc == 1 ? rs_call(&l->c, 2, pttl, lens, 0, 1) : NULL;
    *ttl = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r)
        freeReplyObject(r);
    return rc;
}

static int refuse(const char *cmd, const rs_lock *l, const char *job,
                  const char *val, long long ttl)
{
    char host[256] = "?";
    long pid = 0;
    sscanf(val, "%255s %ld", host, &pid);
    return cli_fail(cmd, "job '%s' is being run by another idem process "
                    "(pid %ld on %s; its lock %s lasts %lld ms more unless "
                    "that process renews it): run one at a time, since each "
                    "would move the job's position in the stream past the "
                    "other's uncommitted entries", job, pid, host, l->key,
                    ttl);
}

/* Take it: free, or held by a process of this host that is gone. 0, or
 * an exit status after saying why. */
static int take(const char *cmd, rs_lock *l, const char *job)
{
    for (int tries = 0; tries < TAKE_TRIES; tries++) {
        int rc = set_nx(l);
        if (rc == 1)
            return 0;
        char val[400];
        long long ttl = -1;
        int held = rc < 0 ? -1 : holder(l, val, sizeof val, &ttl);
        if (held < 0)
            return cli_fail(cmd, "%s: taking job '%s''s lock %s: %s",
                            l->c.u->display, job, l->key,
                            rs_conn_why(&l->c));
        if (held && !strcmp(val, l->val))
            return 0;  /* our SET's reply was lost */
        if (held && !holder_gone(val))
            return refuse(cmd, l, job, val, ttl);
        if (held && script(l, SWAP, val, l->val, l->lease) == 1)
            return 0;
    }
    return cli_fail(cmd, "%s: job '%s''s lock %s keeps changing hands: "
                    "other runs of the job are starting", l->c.u->display,
                    job, l->key);
}

static void *renew(void *arg)
{
    rs_lock *l = arg;
    int64_t ok_at = cli_mono_ms();
    pthread_mutex_lock(&l->mu);
    while (!l->quit && !atomic_load(&l->lost)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t ns = ts.tv_nsec + l->lease_ms / 3 % 1000 * 1000000;
        ts.tv_sec += (time_t)(l->lease_ms / 3 / 1000 + ns / 1000000000);
        ts.tv_nsec = (long)(ns % 1000000000);
        pthread_cond_timedwait(&l->cv, &l->mu, &ts);
        if (l->quit)
            break;
        pthread_mutex_unlock(&l->mu);
        long long v = script(l, RENEW, l->val, l->lease, NULL);
        if (v == 1)
            ok_at = cli_mono_ms();
        /* Another value: taken by another run. No answer for a whole
         * lease: it may have been. */
        if (v == 0 || cli_mono_ms() - ok_at >= l->lease_ms)
            atomic_store(&l->lost, 1);
        pthread_mutex_lock(&l->mu);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* The renewing thread, which takes no stop signals (the reader does). */
static int start_renewing(rs_lock *l)
{
    pthread_condattr_t ca;
    sigset_t all, old;
    if (pthread_condattr_init(&ca) ||
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) ||
        pthread_cond_init(&l->cv, &ca) || pthread_mutex_init(&l->mu, NULL))
        return -1;
    pthread_condattr_destroy(&ca);
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    l->running = pthread_create(&l->thread, NULL, renew, l) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return l->running ? 0 : -1;
}

int rs_lock_take(const char *cmd, const rs_uri *u, const char *job,
                 int64_t lease_ms, rs_lock **out)
{
    rs_lock *l = calloc(1, sizeof *l);
    if (!l)
        return cli_fail(cmd, "out of memory");
    l->c.u = u;
    /* Renewed every third of it: a lease of a few ms would spin. */
    l->lease_ms = lease_ms > MIN_LEASE_MS ? lease_ms : MIN_LEASE_MS;
    snprintf(l->lease, sizeof l->lease, "%" PRId64, l->lease_ms);
    snprintf(l->key, sizeof l->key, "%.*s.idem-lock.%016" PRIx64,
             (int)(u->streamlen < 500 ? u->streamlen : 500), u->stream,
             (uint64_t)XXH3_64bits(job, strlen(job)));
    char host[256];
    host_name(host, sizeof host);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(l->val, sizeof l->val, "%s %ld %" PRIu64 " %016" PRIx64, host,
             (long)getpid(), started(getpid()),
             (uint64_t)XXH3_64bits(&now, sizeof now) ^ (uint64_t)getpid());
    int rc = take(cmd, l, job);
    l->taken = rc == 0;
    if (!rc && start_renewing(l))
        rc = cli_fail(cmd, "cannot start the thread that renews job '%s''s "
                      "lock", job);
    if (rc) {
        rs_lock_drop(l);
        return rc;
    }
    *out = l;
    return 0;
}

int rs_lock_lost(const rs_lock *l)
{
    return l && atomic_load(&l->lost);
}

void rs_lock_drop(rs_lock *l)
{
    if (!l)
        return;
    if (l->running) {
        pthread_mutex_lock(&l->mu);
        l->quit = 1;
        pthread_cond_signal(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
    }
    if (l->taken)
        (void)script(l, DROP, l->val, NULL, NULL);
    rs_conn_close(&l->c);
    free(l);
}
