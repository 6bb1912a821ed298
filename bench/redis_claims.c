/* bench/redis_claims.c - claims per second on Redis, idem beside the
 * references, in one run against the same servers:
 *
 *   redis_claims single PORT N      one redis-server on 127.0.0.1:PORT
 *   redis_claims cluster PORTS N    a cluster; PORTS = p1,p2,... (any
 *                                   nodes; the masters are found)
 *   redis_claims scale PORTS N      scaling with masters (below); PORTS
 *                                   are 6 cluster-enabled nodes (3 give
 *                                   1..2 masters) whose data and cluster
 *                                   state it DESTROYS
 *
 * single and cluster print one line per system:
 *
 *   idem           idem_claim_many() in batches of 1000 on one handle
 *                  (pool=1: one connection per node), the Lua claim
 *                  script per key, all pipelined
 *   idem-day       the same with layout=day (days=7, 16 shards): a
 *                  batch's keys go to 16 buckets, so a call takes up to
 *                  64 keys on a cluster too
 *   watch-multi    the classic optimistic pattern, per key: WATCH k; HEXISTS k
 *                  status; MULTI; HSET k status 0 response processing
 *                  created_ts T; PEXPIRE k TTL; EXEC (single server: it
 *                  cannot be pipelined, each step waits for the last)
 *   set-nx-px      SET k 1 NX PX TTL pipelined 64 deep per node, the
 *                  cheapest atomic "first writer wins" Redis has
 *
 * as: system=NAME mode=single|cluster n=N seconds=S ops_per_sec=R
 * server_cpu_us_per_op=C (CPU time the servers spent per claim, from
 * INFO cpu: steadier than wall time on a busy machine)
 * server_mem_bytes_per_op=B (growth of used_memory per key), then the
 * ratios. Keys are the 36-byte stream of bench/keys36.h, fresh for every
 * system and run (prefixes with the system and the pid). Each system
 * starts on empty servers: single and cluster FLUSHALL the masters they
 * are given, so point them only at servers of their own.
 *
 * Scaling with masters (scale). A cluster's claim capacity should grow
 * with its masters, each master serving its share of the slots on its own
 * core. On a machine with fewer cores than masters + 1 (the project's
 * has 2) the wall clock cannot show that: the client and every master
 * share the same cores, so claims/s stays nearly flat from 2 masters on.
 * What can be measured there is the work each master does. The nodes are
 * emptied (FLUSHALL, CLUSTER RESET HARD) and regrouped into clusters of
 * 1, 2, ..., K masters side by side (K(K+1)/2 nodes: 6 for K = 3), no
 * replicas, the slots split evenly in ranges (CLUSTER SET-CONFIG-EPOCH,
 * ADDSLOTS, MEET); each cluster gets its own idem handle (pool=1, as in
 * cluster mode). The same N keys of the same stream go to every cluster,
 * one batch of 1000 (idem_claim_many) at a time to each in turn, the
 * first cluster of each turn rotating: a slow moment of the shared
 * machine then falls on every cluster alike, instead of on whichever ran
 * then. Each master's CPU time is read from INFO cpu (used_cpu_sys +
 * used_cpu_user) before and after; each cluster's wall time and this
 * process's CPU time (getrusage) are summed over its own calls. Were each
 * master on its own core, a cluster could do no more claims per second
 * than its busiest master allows:
 *
 *   projected_ops_per_sec = N / max over its masters (CPU seconds)
 *
 * One line per cluster: masters=M n=N seconds=S ops_per_sec=R (measured,
 * wall clock, on the shared cores) master_cpu_s=c1,c2,...
 * max_master_cpu_s projected_ops_per_sec balance (min/max of the masters'
 * CPU seconds: 1.00 is an even split) server_cpu_us_per_op (all masters
 * together: growth with M is work that adding masters costs)
 * client_cpu_us_per_op and client_ops_per_cpu_sec (the claims/s one
 * client process could drive with a core of its own: past it, more
 * client processes are needed to load the masters), then the projected
 * ratios to M = 1 with the ideal in parentheses, and the measured wall
 * ratios. The projection is an upper bound from measured CPU, not a
 * measured throughput: it leaves out the network, the client (hence
 * client_ops_per_cpu_sec) and a lone synchronous client's wait for its
 * slowest master each round trip, and its CPU per claim is measured on
 * shared cores (cache sharing, context switches). A master's own
 * housekeeping (serverCron, cluster bus: about 4 ms of CPU a second here)
 * while the other clusters run is counted too; it weighs most on the
 * larger clusters, whose masters do less work each (a few % at M = 3),
 * so it biases their projections down, not up. */
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "redis/crc16.h"
#include "idem/idem.h"
#include "keys36.h"

#define MAXNODES 32

/* Ports whose servers' CPU time and memory a figure includes (the
 * masters). */
static int cpu_ports[MAXNODES], ncpu;
static double cpu_start, mem_start;

/* The sum of the named fields ("used_cpu_sys:", ...) of INFO section on
 * the server on PORT. */
static double port_info(int port, const char *section,
                        const char *const *fields, int nfields)
{
    double total = 0;
    redisContext *c = redisConnect("127.0.0.1", port);
    redisReply *r =
        c && !c->err ? redisCommand(c, "INFO %s", section) : NULL;
    for (int i = 0; r && r->type == REDIS_REPLY_STRING && i < nfields; i++) {
        const char *p = strstr(r->str, fields[i]);
        if (p)
            total += strtod(p + strlen(fields[i]), NULL);
    }
    freeReplyObject(r);
    redisFree(c);
    return total;
}

/* used_cpu_sys + used_cpu_user of the server on PORT, in seconds: a
 * figure that, unlike wall time, other load on the machine barely
 * moves. */
static double port_cpu(int port)
{
    static const char *const f[] = {"used_cpu_sys:", "used_cpu_user:"};
    return port_info(port, "cpu", f, 2);
}

/* Bytes of data the server on PORT holds (used_memory). */
static double port_mem(int port)
{
    static const char *const f[] = {"\r\nused_memory:"};
    return port_info(port, "memory", f, 1);
}

/* One of those, summed over the servers a figure includes. */
static double servers(double (*of)(int))
{
    double total = 0;
    for (int i = 0; i < ncpu; i++)
        total += of(cpu_ports[i]);
    return total;
}

static double server_cpu(void)
{
    return servers(port_cpu);
}

/* User + system CPU seconds of this process. */
static double self_cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
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
    double mem = servers(port_mem) - mem_start;
    printf("system=%s mode=%s n=%zu seconds=%.3f ops_per_sec=%.0f "
           "server_cpu_us_per_op=%.2f server_mem_bytes_per_op=%.0f\n", name,
           mode, n, secs, (double)n / secs, cpu * 1e6 / (double)n,
           mem / (double)n);
    fflush(stdout);
    return (double)n / secs;
}

typedef struct claim_run {
    double secs;       /* wall clock */
    double client_cpu; /* this process, seconds */
} claim_run;

/* Claim keys 0..n-1 of the stream with idem_claim_many() in batches of
 * 1000 on one handle; every claim must be NEW. The clock and the CPU
 * figures start once the store is open: before (called after the open)
 * records the servers' start. */
static claim_run claim_stream(const char *uri, size_t n, void (*before)(void))
{
    enum { BATCH = 1000 };
    idem_store *s;
    idem_opts o;
    idem_opts_init(&o);
    int rc = idem_open(uri, &o, &s);
    if (rc) {
        fprintf(stderr, "redis_claims: %s: %s\n", uri, idem_errdetail(s));
        exit(1);
    }
    static char keys[BATCH][BENCH_KEYLEN + 1];
    static idem_key k[BATCH];
    static idem_outcome out[BATCH];
    size_t news = 0;
    before();
    claim_run run;
    double c0 = self_cpu(), t0 = now_s();
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
    run.secs = now_s() - t0;
    run.client_cpu = self_cpu() - c0;
    idem_close(s);
    if (news != n) {
        fprintf(stderr, "redis_claims: %zu of %zu claims were NEW\n", news, n);
        exit(1);
    }
    return run;
}

static void start_server_cpu(void)
{
    cpu_start = server_cpu();
    mem_start = servers(port_mem);
}

/* Every system starts on empty servers: a dictionary already holding an
 * earlier system's keys makes each insert dearer (rehashing, cache
 * misses), which would favour whichever system runs first. */
static void empty_servers(void)
{
    for (int i = 0; i < ncpu; i++) {
        redisContext *c = redisConnect("127.0.0.1", cpu_ports[i]);
        redisReply *r = c && !c->err ? redisCommand(c, "FLUSHALL") : NULL;
        freeReplyObject(r);
        redisFree(c);
    }
}

static double bench_idem(const char *name, const char *uri,
                         const char *mode, size_t n)
{
    empty_servers();
    claim_run run = claim_stream(uri, n, start_server_cpu);
    return report(name, mode, n, run.secs);
}

/* idem in both layouts on the store URI base (a query follows it). */
static double bench_layouts(char *uri, size_t cap, const char *mode,
                            size_t n)
{
    size_t len = strlen(uri);
    double idem = bench_idem("idem", uri, mode, n);
    snprintf(uri + len, cap - len, "&layout=day&prefix=bench-day-%d:",
             getpid());
    bench_idem("idem-day", uri, mode, n);
    uri[len] = '\0';
    return idem;
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
    empty_servers();
    start_server_cpu();
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
    empty_servers();
    start_server_cpu();
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

/* ------------------------------------------------------------------------
 * Scaling with masters (see the top of the file). */

static void admin(redisContext *c, int port, int argc, const char **argv)
{
    redisReply *r = cmd(c, argc, argv, NULL);
    if (r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "redis_claims: %d: %s: %s\n", port, argv[0], r->str);
        exit(1);
    }
    freeReplyObject(r);
}

static redisContext *connect_port(int port)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    if (!c || c->err) {
        fprintf(stderr, "redis_claims: connect %d\n", port);
        exit(1);
    }
    return c;
}

/* Empty a node and make it a cluster of its own with no slots, knowing
 * no other node. */
static void reset_node(int port)
{
    redisContext *c = connect_port(port);
    const char *fl[] = {"FLUSHALL"};
    const char *rs[] = {"CLUSTER", "RESET", "HARD"};
    admin(c, port, 1, fl);
    admin(c, port, 3, rs);
    redisFree(c);
}

/* Make m freshly reset nodes a cluster of m masters, the slots split
 * evenly in ranges (config epochs 1..m, as redis-cli --cluster create
 * sets them, so that no epoch collision has to be resolved). */
static void form_cluster(const int *ports, int m)
{
    static char slotname[IDEM__SLOTS][8];
    static const char *argv[2 + IDEM__SLOTS];
    for (int i = 0; i < m; i++) {
        redisContext *c = connect_port(ports[i]);
        char epoch[16];
        snprintf(epoch, sizeof epoch, "%d", i + 1);
        const char *ep[] = {"CLUSTER", "SET-CONFIG-EPOCH", epoch};
        admin(c, ports[i], 3, ep);
        int lo = IDEM__SLOTS * i / m, hi = IDEM__SLOTS * (i + 1) / m;
        argv[0] = "CLUSTER";
        argv[1] = "ADDSLOTS";
        for (int sl = lo; sl < hi; sl++) {
            snprintf(slotname[sl], sizeof slotname[sl], "%d", sl);
            argv[2 + sl - lo] = slotname[sl];
        }
        admin(c, ports[i], 2 + hi - lo, argv);
        redisFree(c);
    }
    redisContext *c0 = connect_port(ports[0]);
    for (int i = 1; i < m; i++) {
        char port[16];
        snprintf(port, sizeof port, "%d", ports[i]);
        const char *mt[] = {"CLUSTER", "MEET", "127.0.0.1", port};
        admin(c0, ports[0], 4, mt);
    }
    redisFree(c0);
}

/* Wait until each of the m nodes sees its cluster whole: cluster_state:ok
 * (every slot served) and exactly m known nodes (no stray node joined). */
static void wait_cluster(const int *ports, int m)
{
    char known[32];
    snprintf(known, sizeof known, "cluster_known_nodes:%d\r", m);
    for (int tries = 0; tries < 400; tries++) {
        int ready = 1;
        for (int i = 0; i < m && ready; i++) {
            redisContext *c = connect_port(ports[i]);
            const char *ci[] = {"CLUSTER", "INFO"};
            redisReply *r = cmd(c, 2, ci, NULL);
            ready = r->type == REDIS_REPLY_STRING &&
                    strstr(r->str, "cluster_state:ok") &&
                    strstr(r->str, known);
            freeReplyObject(r);
            redisFree(c);
        }
        if (ready)
            return;
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    fprintf(stderr, "redis_claims: a cluster of %d masters did not form\n",
            m);
    exit(1);
}

static void bench_scale(const int *ports, int nports, size_t n)
{
    enum { BATCH = 1000 };
    /* Clusters of 1..K masters side by side: K(K+1)/2 nodes. */
    int K = 0;
    while ((K + 1) * (K + 2) / 2 <= nports && K + 1 <= MAXNODES / 2)
        K++;
    if (K < 2) {
        fprintf(stderr, "redis_claims: scale needs at least 3 nodes\n");
        exit(1);
    }
    int used = K * (K + 1) / 2;
    for (int i = 0; i < used; i++)
        reset_node(ports[i]);
    for (int m = 1; m <= K; m++)
        form_cluster(ports + m * (m - 1) / 2, m);
    for (int m = 1; m <= K; m++)
        wait_cluster(ports + m * (m - 1) / 2, m);

    idem_store *s[MAXNODES / 2 + 1];
    for (int m = 1; m <= K; m++) {
        char uri[256];
        snprintf(uri, sizeof uri,
                 "redis-cluster://127.0.0.1:%d?prefix=bench-scale-%d:"
                 "&timeout_ms=30000", ports[m * (m - 1) / 2], (int)getpid());
        idem_opts o;
        idem_opts_init(&o);
        if (idem_open(uri, &o, &s[m])) {
            fprintf(stderr, "redis_claims: %s: %s\n", uri,
                    idem_errdetail(s[m]));
            exit(1);
        }
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("# scaling with masters: clusters of 1..%d masters side by side, "
           "no replicas, each claiming the same %zu keys in turns of one "
           "batch of %d; %ld cores here, shared by the client and every "
           "master\n", K, n, BATCH, cores);
    printf("# ops_per_sec: measured, wall clock on those cores; "
           "projected_ops_per_sec: n / busiest master's CPU seconds, the "
           "capacity with a core per master (a projection, not a "
           "measurement)\n");
    fflush(stdout);

    static char keys[BATCH][BENCH_KEYLEN + 1];
    static idem_key k[BATCH];
    static idem_outcome out[BATCH];
    double secs[MAXNODES / 2 + 1] = {0}, ccpu[MAXNODES / 2 + 1] = {0};
    double cpu0[MAXNODES];
    size_t news[MAXNODES / 2 + 1] = {0};
    for (int i = 0; i < used; i++)
        cpu0[i] = port_cpu(ports[i]);
    for (size_t i = 0, b = 0; i < n; i += BATCH, b++) {
        size_t cnt = n - i < BATCH ? n - i : BATCH;
        for (size_t j = 0; j < cnt; j++) {
            bench_key(1, i + j, keys[j]);
            k[j] = (idem_key){keys[j], BENCH_KEYLEN, NULL};
        }
        /* Each batch to every cluster, starting with a different one
         * each time: a slow moment of the machine hits them all. */
        for (int r = 0; r < K; r++) {
            int m = 1 + (int)((b + (size_t)r) % (size_t)K);
            double c0 = self_cpu(), t0 = now_s();
            if (idem_claim_many(s[m], k, cnt, NULL, out, 0)) {
                fprintf(stderr, "redis_claims: claim: %s\n",
                        idem_errdetail(s[m]));
                exit(1);
            }
            secs[m] += now_s() - t0;
            ccpu[m] += self_cpu() - c0;
            for (size_t j = 0; j < cnt; j++)
                news[m] += out[j].kind == IDEM_NEW;
        }
    }
    double cpu[MAXNODES];
    for (int i = 0; i < used; i++)
        cpu[i] = port_cpu(ports[i]) - cpu0[i];

    double projected[MAXNODES / 2 + 1] = {0}, wall[MAXNODES / 2 + 1] = {0};
    double client_max = 0;
    for (int m = 1; m <= K; m++) {
        idem_close(s[m]);
        if (news[m] != n) {
            fprintf(stderr, "redis_claims: %d masters: %zu of %zu claims "
                            "were NEW\n", m, news[m], n);
            exit(1);
        }
        const double *c = cpu + m * (m - 1) / 2;
        double max = c[0], min = c[0], sum = 0;
        char list[MAXNODES * 12] = "";
        size_t off = 0;
        for (int i = 0; i < m; i++) {
            max = c[i] > max ? c[i] : max;
            min = c[i] < min ? c[i] : min;
            sum += c[i];
            int w = snprintf(list + off, sizeof list - off, "%s%.3f",
                             i ? "," : "", c[i]);
            if (w > 0 && (size_t)w < sizeof list - off)
                off += (size_t)w;
        }
        wall[m] = (double)n / secs[m];
        projected[m] = max > 0 ? (double)n / max : 0;
        double client = ccpu[m] > 0 ? (double)n / ccpu[m] : 0;
        client_max = m == K ? client : client_max;
        printf("masters=%d n=%zu seconds=%.3f ops_per_sec=%.0f "
               "master_cpu_s=%s max_master_cpu_s=%.3f "
               "projected_ops_per_sec=%.0f balance=%.2f "
               "server_cpu_us_per_op=%.2f client_cpu_us_per_op=%.2f "
               "client_ops_per_cpu_sec=%.0f\n",
               m, n, secs[m], wall[m], list, max, projected[m],
               max > 0 ? min / max : 0, sum * 1e6 / (double)n,
               ccpu[m] * 1e6 / (double)n, client);
    }
    for (int m = 2; m <= K; m++)
        printf("cluster_projected_%d_vs_1=%.2f (%d)\n", m,
               projected[1] > 0 ? projected[m] / projected[1] : 0, m);
    for (int m = 2; m <= K; m++)
        printf("cluster_wall_%d_vs_1=%.2f (measured on %ld shared cores)\n",
               m, wall[m] / wall[1], cores);
    printf("# one client process, a core of its own: at most %.0f claims/s "
           "against %d masters (client_ops_per_cpu_sec), %s the projected "
           "%.0f\n", client_max, K,
           client_max >= projected[K] ? "above" : "BELOW", projected[K]);
}

int main(int argc, char **argv)
{
    if (argc != 4 || (strcmp(argv[1], "single") &&
                      strcmp(argv[1], "cluster") && strcmp(argv[1], "scale"))) {
        fprintf(stderr, "usage: redis_claims single PORT N | "
                        "cluster PORT,PORT,... N | scale PORT,PORT,... N\n");
        return 2;
    }
    size_t n = strtoul(argv[3], NULL, 10);
    if (!strcmp(argv[1], "scale")) {
        int ports[MAXNODES], total = 0;
        for (char *p = argv[2]; *p && total < MAXNODES;) {
            char *end;
            long port = strtol(p, &end, 10);
            if (end == p || port <= 0 || port > 65535) {
                fprintf(stderr, "redis_claims: bad port list %s\n", argv[2]);
                return 2;
            }
            ports[total++] = (int)port;
            for (p = end; *p == ',';)
                p++;
        }
        bench_scale(ports, total, n);
        return 0;
    }
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
        double idem = bench_layouts(uri, sizeof uri, "cluster", n);
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
    double idem = bench_layouts(uri, sizeof uri, "single", n);
    /* The pattern is slow by nature (six round trips a key): a tenth of
     * the keys gives a stable figure in reasonable time. */
    size_t nw = n / 10 ? n / 10 : 1;
    double watch = bench_watch(port, nw);
    double setnx = bench_setnx(&t, "single", n);
    printf("idem_vs_watch_multi=%.1f (>= 20)\n", idem / watch);
    printf("idem_vs_set_nx_px=%.2f (>= 0.5)\n", idem / setnx);
    return 0;
}
