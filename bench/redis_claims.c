/* bench/redis_claims.c - claims per second on Redis, idem beside the
 * references, in one run against the same servers:
 *
 *   redis_claims single PORT N      one redis-server on 127.0.0.1:PORT
 *   redis_claims cluster PORTS N    a cluster; PORTS = p1,p2,... (any
 *                                   nodes; the masters are found)
 *
 * Each prints one line per system:
 *
 *   idem           idem_claim_many() in batches of 1000 on one handle
 *                  (pool=1: one connection per node), the Lua claim
 *                  script per key, all pipelined
 *   watch-multi    the classic optimistic pattern, per key: WATCH k; HEXISTS k
 *                  status; MULTI; HSET k status 0 response processing
 *                  created_ts T; PEXPIRE k TTL; EXEC (single server: it
 *                  cannot be pipelined, each step waits for the last)
 *   set-nx-px      SET k 1 NX PX TTL pipelined 64 deep per node, the
 *                  cheapest atomic "first writer wins" Redis has
 *
 * as: system=NAME mode=single|cluster n=N seconds=S ops_per_sec=R
 * server_cpu_us_per_op=C (CPU time the servers spent per claim, from
 * INFO cpu: steadier than wall time on a busy machine), then the
 * ratios. Keys are the 36-byte stream of bench/keys36.h, fresh for every
 * system and run (prefixes with the system and the pid). */
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crc16.h"
#include "idem/idem.h"
#include "keys36.h"

#define MAXNODES 32

/* Ports whose servers' CPU time a figure includes (the masters). */
static int cpu_ports[MAXNODES], ncpu;
static double cpu_start;

/* used_cpu_sys + used_cpu_user of the servers, in seconds: a figure
 * that, unlike wall time, other load on the machine barely moves. */
static double server_cpu(void)
{
    double total = 0;
    for (int i = 0; i < ncpu; i++) {
        redisContext *c = redisConnect("127.0.0.1", cpu_ports[i]);
        redisReply *r = c && !c->err ? redisCommand(c, "INFO cpu") : NULL;
        if (r && r->type == REDIS_REPLY_STRING) {
            const char *p = strstr(r->str, "used_cpu_sys:");
            const char *q = strstr(r->str, "used_cpu_user:");
            if (p && q)
                total += strtod(p + 13, NULL) + strtod(q + 14, NULL);
        }
        freeReplyObject(r);
        redisFree(c);
    }
    return total;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double report(const char *name, const char *mode, size_t n,
                     double secs)
{
    double cpu = server_cpu() - cpu_start;
    printf("system=%s mode=%s n=%zu seconds=%.3f ops_per_sec=%.0f "
           "server_cpu_us_per_op=%.2f\n", name, mode, n, secs,
           (double)n / secs, cpu * 1e6 / (double)n);
    fflush(stdout);
    return (double)n / secs;
}

static double bench_idem(const char *uri, const char *mode, size_t n)
{
    enum { BATCH = 1000 };
    idem_store *s;
    idem_options o;
    idem_options_init(&o);
    int rc = idem_open(uri, &o, &s);
    if (rc) {
        fprintf(stderr, "redis_claims: %s: %s\n", uri, idem_errdetail(s));
        exit(1);
    }
    static char keys[BATCH][BENCH_KEYLEN + 1];
    static idem_key k[BATCH];
    static idem_outcome out[BATCH];
    size_t news = 0;
    cpu_start = server_cpu();
    double t0 = now_s();
    for (size_t i = 0; i < n; i += BATCH) {
        size_t m = n - i < BATCH ? n - i : BATCH;
        for (size_t j = 0; j < m; j++) {
            bench_key(1, i + j, keys[j]);
            k[j] = (idem_key){keys[j], BENCH_KEYLEN, NULL};
        }
        rc = idem_claim_many(s, k, m, NULL, out, 0);
        if (rc) {
            fprintf(stderr, "redis_claims: claim: %s\n", idem_errdetail(s));
            exit(1);
        }
        for (size_t j = 0; j < m; j++)
            news += out[j].kind == IDEM_NEW;
    }
    double r = report("idem", mode, n, now_s() - t0);
    idem_close(s);
    if (news != n) {
        fprintf(stderr, "redis_claims: %zu of %zu claims were NEW\n", news, n);
        exit(1);
    }
    return r;
}

static redisReply *cmd(redisContext *c, int argc, const char **argv,
                       const size_t *lens)
{
    redisReply *r = redisCommandArgv(c, argc, argv, lens);
    if (!r) {
        fprintf(stderr, "redis_claims: %s\n", c->errstr);
        exit(1);
    }
    return r;
}

/* The classic claim: WATCH, HEXISTS, then MULTI/HSET/PEXPIRE/EXEC if the
 * key is free. One round trip per step. */
static double bench_watch(int port, size_t n)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    if (!c || c->err) {
        fprintf(stderr, "redis_claims: connect %d\n", port);
        exit(1);
    }
    char k[64], ts[24];
    size_t won = 0;
    cpu_start = server_cpu();
    double t0 = now_s();
    for (size_t i = 0; i < n; i++) {
        char raw[BENCH_KEYLEN + 1];
        bench_key(1, i, raw);
        int kl = snprintf(k, sizeof k, "bench-watch-%d:{%s}", (int)getpid(),
                          raw);
        int tl = snprintf(ts, sizeof ts, "%lld", (long long)time(NULL) * 1000);
        const char *w[] = {"WATCH", k};
        size_t wl[] = {5, (size_t)kl};
        freeReplyObject(cmd(c, 2, w, wl));
        const char *h[] = {"HEXISTS", k, "status"};
        size_t hl[] = {7, (size_t)kl, 6};
        redisReply *r = cmd(c, 3, h, hl);
        int exists = r->integer == 1;
        freeReplyObject(r);
        if (exists) {
            const char *u[] = {"UNWATCH"};
            size_t ul[] = {7};
            freeReplyObject(cmd(c, 1, u, ul));
            continue;
        }
        const char *m[] = {"MULTI"};
        size_t ml[] = {5};
        freeReplyObject(cmd(c, 1, m, ml));
        const char *hs[] = {"HSET", k, "status", "0", "response",
                            "processing", "created_ts", ts};
        size_t hsl[] = {4, (size_t)kl, 6, 1, 8, 10, 10, (size_t)tl};
        freeReplyObject(cmd(c, 8, hs, hsl));
        const char *px[] = {"PEXPIRE", k, "86400000"};
        size_t pxl[] = {7, (size_t)kl, 8};
        freeReplyObject(cmd(c, 3, px, pxl));
        const char *e[] = {"EXEC"};
        size_t el[] = {4};
        r = cmd(c, 1, e, el);
        won += r->type == REDIS_REPLY_ARRAY;
        freeReplyObject(r);
    }
    double rate = report("watch-multi", "single", n, now_s() - t0);
    redisFree(c);
    if (won != n) {
        fprintf(stderr, "redis_claims: watch-multi won %zu of %zu\n", won, n);
        exit(1);
    }
    return rate;
}

/* The masters of the cluster a node belongs to, and the slot map. */
typedef struct topo {
    int nmasters;
    int ports[MAXNODES];
    unsigned char owner[IDEM__SLOTS];
} topo;

static void load_topology(int port, topo *t)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    if (!c || c->err) {
        fprintf(stderr, "redis_claims: connect %d\n", port);
        exit(1);
    }
    const char *a[] = {"CLUSTER", "SLOTS"};
    size_t al[] = {7, 5};
    redisReply *r = cmd(c, 2, a, al);
    t->nmasters = 0;
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *e = r->element[i];
        int p = (int)e->element[2]->element[1]->integer, idx = -1;
        for (int j = 0; j < t->nmasters; j++)
            if (t->ports[j] == p)
                idx = j;
        if (idx < 0 && t->nmasters < MAXNODES) {
            idx = t->nmasters;
            t->ports[t->nmasters++] = p;
        }
        for (long long s = e->element[0]->integer;
             s <= e->element[1]->integer; s++)
            t->owner[s] = (unsigned char)idx;
    }
    freeReplyObject(r);
    redisFree(c);
}

/* SET NX PX, 64 commands in flight per node. */
static double bench_setnx(const topo *t, const char *mode, size_t n)
{
    redisContext *c[MAXNODES];
    size_t inflight[MAXNODES] = {0};
    for (int i = 0; i < t->nmasters; i++) {
        c[i] = redisConnect("127.0.0.1", t->ports[i]);
        if (!c[i] || c[i]->err) {
            fprintf(stderr, "redis_claims: connect %d\n", t->ports[i]);
            exit(1);
        }
    }
    size_t ok = 0;
    char k[64];
    cpu_start = server_cpu();
    double t0 = now_s();
    size_t chunk = 64 * (size_t)t->nmasters;
    for (size_t i = 0; i < n; i += chunk) {
        size_t m = n - i < chunk ? n - i : chunk;
        for (size_t j = 0; j < m; j++) {
            char raw[BENCH_KEYLEN + 1];
            bench_key(1, i + j, raw);
            int kl = snprintf(k, sizeof k, "bench-setnx-%d:{%s}",
                              (int)getpid(), raw);
            int node = t->nmasters > 1
                           ? t->owner[idem__key_slot(k, (size_t)kl)]
                           : 0;
            const char *argv[] = {"SET", k, "1", "NX", "PX", "86400000"};
            size_t lens[] = {3, (size_t)kl, 1, 2, 2, 8};
            redisAppendCommandArgv(c[node], 6, argv, lens);
            inflight[node]++;
        }
        for (int nd = 0; nd < t->nmasters; nd++) {
            int done = 0;
            while (!done)
                if (redisBufferWrite(c[nd], &done) != REDIS_OK)
                    exit(1);
        }
        for (int nd = 0; nd < t->nmasters; nd++) {
            for (; inflight[nd]; inflight[nd]--) {
                redisReply *r;
                if (redisGetReply(c[nd], (void **)&r) != REDIS_OK) {
                    fprintf(stderr, "redis_claims: %s\n", c[nd]->errstr);
                    exit(1);
                }
                ok += r->type == REDIS_REPLY_STATUS;
                freeReplyObject(r);
            }
        }
    }
    double rate = report("set-nx-px", mode, n, now_s() - t0);
    for (int i = 0; i < t->nmasters; i++)
        redisFree(c[i]);
    if (ok != n) {
        fprintf(stderr, "redis_claims: SET NX won %zu of %zu\n", ok, n);
        exit(1);
    }
    return rate;
}

int main(int argc, char **argv)
{
    if (argc != 4 || (strcmp(argv[1], "single") && strcmp(argv[1], "cluster"))) {
        fprintf(stderr, "usage: redis_claims single PORT N | "
                        "cluster PORT,PORT,... N\n");
        return 2;
    }
    size_t n = strtoul(argv[3], NULL, 10);
    char uri[1024];
    topo t;
    memset(&t, 0, sizeof t);
    int cluster = !strcmp(argv[1], "cluster");
    if (cluster) {
        size_t off = (size_t)snprintf(uri, sizeof uri, "redis-cluster://");
        for (char *p = argv[2]; *p && off < sizeof uri;) {
            long port = strtol(p, &p, 10);
            off += (size_t)snprintf(uri + off, sizeof uri - off,
                                    "%s127.0.0.1:%ld",
                                    off > 16 ? "," : "", port);
            while (*p == ',')
                p++;
        }
        snprintf(uri + off, sizeof uri - off,
                 "?prefix=bench-idem-%d:&timeout_ms=30000", getpid());
        load_topology((int)strtol(argv[2], NULL, 10), &t);
        ncpu = t.nmasters;
        memcpy(cpu_ports, t.ports, sizeof cpu_ports);
        printf("# cluster: %d masters\n", t.nmasters);
        double idem = bench_idem(uri, "cluster", n);
        double setnx = bench_setnx(&t, "cluster", n);
        printf("cluster_idem_vs_set_nx_px=%.2f (>= 0.5)\n", idem / setnx);
        return 0;
    }
    int port = (int)strtol(argv[2], NULL, 10);
    snprintf(uri, sizeof uri,
             "redis://127.0.0.1:%d?prefix=bench-idem-%d:&timeout_ms=30000",
             port, getpid());
    t.nmasters = 1;
    t.ports[0] = port;
    ncpu = 1;
    cpu_ports[0] = port;
    double idem = bench_idem(uri, "single", n);
    /* The pattern is slow by nature (six round trips a key): a tenth of
     * the keys gives a stable figure in reasonable time. */
    size_t nw = n / 10 ? n / 10 : 1;
    double watch = bench_watch(port, nw);
    double setnx = bench_setnx(&t, "single", n);
    printf("idem_vs_watch_multi=%.1f (>= 20)\n", idem / watch);
    printf("idem_vs_set_nx_px=%.2f (>= 0.5)\n", idem / setnx);
    return 0;
}
