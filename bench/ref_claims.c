/* bench/ref_claims.c - the reference systems for `make bench`, fed the same
 * 36-byte key stream as `idem bench`:
 *
 *   ref_claims redis PORT N         SET key 1 NX PX 86400000, pipelined 64
 *                                   deep on one connection to 127.0.0.1
 *   ref_claims lmdb DIR N BATCH     mdb_put(MDB_NOOVERWRITE), BATCH puts per
 *                                   durable transaction
 *
 * Prints one line: ref=NAME n=N seconds=S ops_per_sec=R. */
#include <hiredis/hiredis.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "keys36.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void report(const char *name, size_t n, double secs)
{
    printf("ref=%s n=%zu seconds=%.3f ops_per_sec=%.0f\n", name, n, secs,
           (double)n / secs);
}

static int bench_redis(int port, size_t n)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    if (!c || c->err) {
        fprintf(stderr, "ref_claims: redis: %s\n", c ? c->errstr : "oom");
        return 1;
    }
    char k[BENCH_KEYLEN + 1];
    double t0 = now_s();
    size_t ok = 0;
    /* Like redis-benchmark -P 64: send 64 commands, then read 64 replies. */
    for (size_t i = 0; i < n; i += 64) {
        size_t m = n - i < 64 ? n - i : 64;
        for (size_t j = 0; j < m; j++) {
            bench_key(1, i + j, k);
            const char *argv[] = {"SET", k, "1", "NX", "PX", "86400000"};
            size_t lens[] = {3, BENCH_KEYLEN, 1, 2, 2, 8};
            redisAppendCommandArgv(c, 6, argv, lens);
        }
        for (size_t j = 0; j < m; j++) {
            redisReply *r;
            if (redisGetReply(c, (void **)&r) != REDIS_OK) {
                fprintf(stderr, "ref_claims: redis: %s\n", c->errstr);
                return 1;
            }
            ok += r->type == REDIS_REPLY_STATUS;
            freeReplyObject(r);
        }
    }
    report("redis-set-nx-px-pipelined64", n, now_s() - t0);
    redisFree(c);
    return ok == n ? 0 : 1;
}

static int bench_lmdb(const char *dir, size_t n, size_t batch)
{
    MDB_env *env;
    MDB_dbi dbi;
    mkdir(dir, 0755);
    if (mdb_env_create(&env) || mdb_env_set_mapsize(env, 8ull << 30) ||
        mdb_env_open(env, dir, 0, 0644)) {
        fprintf(stderr, "ref_claims: lmdb: cannot open %s\n", dir);
        return 1;
    }
    char k[BENCH_KEYLEN + 1], v[16] = "pending";
    double t0 = now_s();
    for (size_t i = 0; i < n;) {
        MDB_txn *txn;
        if (mdb_txn_begin(env, NULL, 0, &txn) ||
            mdb_dbi_open(txn, NULL, 0, &dbi))
            return 1;
        for (size_t j = 0; j < batch && i < n; j++, i++) {
            bench_key(1, i, k);
            MDB_val key = {BENCH_KEYLEN, k}, val = {sizeof v, v};
            int rc = mdb_put(txn, dbi, &key, &val, MDB_NOOVERWRITE);
            if (rc && rc != MDB_KEYEXIST)
                return 1;
        }
        if (mdb_txn_commit(txn))  /* durable: fsync per transaction */
            return 1;
    }
    report("lmdb-put-nooverwrite", n, now_s() - t0);
    mdb_env_close(env);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "redis"))
        return bench_redis((int)strtol(argv[2], NULL, 10),
                           strtoul(argv[3], NULL, 10));
    if (argc == 5 && !strcmp(argv[1], "lmdb"))
        return bench_lmdb(argv[2], strtoul(argv[3], NULL, 10),
                          strtoul(argv[4], NULL, 10));
    fprintf(stderr, "usage: ref_claims redis PORT N | lmdb DIR N BATCH\n");
    return 2;
}
