/* tests/test_redis.c - what only the Redis backends promise, on real
 * servers: URIs and their errors, the documented schema, slots that agree
 * with the server's, keys with braces or any bytes, errors in the middle
 * of a pipeline, sweeps, and many processes racing for the same keys. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "redis/crc16.h"
#include "redis/redis.h"
#include "redis_harness.h"

static char uri_buf[2048];

static void fini(void)
{
    th_shared_stop();
}

TestSuite(redis, .fini = fini, .timeout = 120);

/* A fresh store URI on the shared server or cluster. */
static const char *single_uri(void)
{
    snprintf(uri_buf, sizeof uri_buf, "redis://%s?prefix=%s&timeout_ms=20000",
             th_redis_addr(), th_prefix());
    return uri_buf;
}

static const char *cluster_uri(void)
{
    snprintf(uri_buf, sizeof uri_buf,
             "redis-cluster://%s?prefix=%s&timeout_ms=20000",
             th_cluster_addr(), th_prefix());
    return uri_buf;
}

/* The prefix= of uri, for raw access to the keys. */
static const char *prefix_of(const char *uri, char *buf, size_t cap)
{
    const char *p = strstr(uri, "prefix=");
    cr_assert(p);
    p += 7;
    size_t n = strcspn(p, "&");
    cr_assert(n < cap);
    memcpy(buf, p, n);
    buf[n] = '\0';
    return buf;
}

static int open_rc(const char *uri, idem_store **s)
{
    idem_opts o;
    idem_opts_init(&o);
    return idem_open(uri, &o, s);
}

/* docs/uri.md's table of Redis parameters and the URI parser's table
 * name the same parameters, each once. */
Test(redis, uri_params_documented)
{
    const char *scripts = getenv("IDEM_SCRIPTS");
    char path[4200];
    snprintf(path, sizeof path, "%s/../docs/uri.md",
             scripts ? scripts : "scripts");
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    char line[1024], doc[32][64];
    int n = 0, in = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "### Parameters", 14) == 0)
            in = 1;
        else if (in && strncmp(line, "#", 1) == 0)
            break;
        else if (in && strncmp(line, "| `", 3) == 0) {
            size_t len = strcspn(line + 3, "`");
            cr_assert(n < 32 && len < sizeof doc[0]);
            memcpy(doc[n], line + 3, len);
            doc[n++][len] = '\0';
        }
    }
    fclose(f);
    int known = 0;
    for (const char *p; (p = idem__rparam_name((size_t)known)) != NULL;
         known++) {
        int found = 0;
        for (int i = 0; i < n; i++)
            found += strcmp(doc[i], p) == 0;
        cr_assert_eq(found, 1, "%s is in docs/uri.md %d times", p, found);
    }
    cr_assert_eq(n, known, "docs/uri.md documents %d parameters, the "
                 "parser knows %d", n, known);
}

Test(redis, uri_errors)
{
    static const struct {
        const char *uri;
        const char *detail;
    } bad[] = {
        {"redis:127.0.0.1:1", "expected redis://"},
        {"redis://127.0.0.1:0", "bad port"},
        {"redis://127.0.0.1:99999", "bad port"},
        {"redis://127.0.0.1:1?timout_ms=5", "unknown parameter 'timout_ms'"},
        {"redis://127.0.0.1:1?timeout_ms=x", "timeout_ms must be"},
        {"redis://127.0.0.1:1?pool=0", "pool must be"},
        {"redis://a:1,b:2", "use redis-cluster://"},
        {"redis://127.0.0.1:1/x", "bad database"},
        {"redis-cluster://127.0.0.1:1/3", "only database 0"},
        {"redis://%zz@127.0.0.1:1", "bad % escape"},
        {"redis://", "no host"},
        {"rediss://x", "expected local:PATH, mem:, redis://"},
        {"redis-sentinel:127.0.0.1:1/m", "expected redis-sentinel://"},
        {"redis-sentinel://127.0.0.1:1", "HOST:PORT[,...]/MASTER"},
        {"redis-sentinel://127.0.0.1:1/", "HOST:PORT[,...]/MASTER"},
        {"redis-sentinel://127.0.0.1:1/m/2", "a database is db=N"},
        {"redis-sentinel://127.0.0.1:1/%zz", "bad % escape in the master"},
        {"redis-sentinel://a:1,b:99999/m", "bad port"},
        {"redis-sentinel://a:1/m?sentinel_pasword=x", "unknown parameter"},
        {"redis://127.0.0.1:1?sentinel_password=x", "belong to "
                                                    "redis-sentinel://"},
        {"redis-sentinel://a:1/m?sentinel_password=x&sentinel_password_file="
         "/nonexistent", "a sentinel_password and a sentinel_password_file"},
        {"redis-sentinel://a:1/m?sentinel_password_file=/nonexistent",
         "sentinel_password_file /nonexistent: No such file"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        idem_store *s;
        int rc = open_rc(bad[i].uri, &s);
        cr_assert_eq(rc, IDEM_EINVAL, "%s: %s", bad[i].uri,
                     idem_strerror(rc));
        cr_assert(strstr(idem_errdetail(s), bad[i].detail), "%s: '%s'",
                  bad[i].uri, idem_errdetail(s));
        idem_close(s);
    }
}

Test(redis, unreachable_server)
{
    /* Port 1 on loopback: nothing listens there. */
    idem_store *s;
    int rc = open_rc("redis://127.0.0.1:1?timeout_ms=2000", &s);
    cr_assert_eq(rc, IDEM_ECONN, "%s", idem_strerror(rc));
    cr_assert(strstr(idem_errdetail(s), "cannot connect to 127.0.0.1:1"),
              "%s", idem_errdetail(s));
    idem_close(s);
    rc = open_rc("redis-cluster://127.0.0.1:1,127.0.0.1:2?timeout_ms=2000",
                 &s);
    cr_assert_eq(rc, IDEM_ECONN, "%s", idem_strerror(rc));
    cr_assert(strstr(idem_errdetail(s), "cannot connect"), "%s",
              idem_errdetail(s));
    idem_close(s);
}

Test(redis, wrong_password)
{
    const char *addr = th_redis_addr();
    int port = th_first_port(addr);
    redisContext *c = th_connect(port);
    char user[64];
    snprintf(user, sizeof user, "u%d", getpid());
    freeReplyObject(th_cmd(c, "ACL SETUSER %s on >s3cr:t@x ~* +@all", user));
    idem_store *s;
    char uri[512];
    snprintf(uri, sizeof uri, "redis://%s:nope@%s", user, addr);
    int rc = open_rc(uri, &s);
    cr_assert_eq(rc, IDEM_EAUTH, "%s: %s", idem_strerror(rc),
                 idem_errdetail(s));
    cr_assert(strstr(idem_errdetail(s), "WRONGPASS"), "%s",
              idem_errdetail(s));
    idem_close(s);
    /* A password for a server that has none is refused too. */
    snprintf(uri, sizeof uri, "redis://:nope@%s", addr);
    rc = open_rc(uri, &s);
    cr_assert_eq(rc, IDEM_EAUTH, "%s: %s", idem_strerror(rc),
                 idem_errdetail(s));
    idem_close(s);
    /* The right one, %-encoded ':' and '@' in it, and a database. */
    snprintf(uri, sizeof uri, "redis://%s:s3cr%%3At%%40x@%s/3?prefix=%s",
             user, addr, th_prefix());
    rc = open_rc(uri, &s);
    cr_assert_eq(rc, 0, "%s: %s", idem_strerror(rc), idem_errdetail(s));
    idem_key k = {"k", 1, NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0, "%s", idem_errdetail(s));
    cr_assert_eq(o.kind, IDEM_NEW);
    idem_close(s);
    freeReplyObject(th_cmd(c, "SELECT 3"));
    redisReply *r = th_cmd(c, "DBSIZE");
    cr_assert(r->integer >= 1, "the record went to database 3");
    freeReplyObject(r);
    freeReplyObject(th_cmd(c, "ACL DELUSER %s", user));
    redisFree(c);
}

Test(redis, scheme_mismatch)
{
    char uri[512];
    idem_store *s;
    snprintf(uri, sizeof uri, "redis-cluster://%s", th_redis_addr());
    int rc = open_rc(uri, &s);
    cr_assert_eq(rc, IDEM_EINVAL, "%s", idem_strerror(rc));
    cr_assert(strstr(idem_errdetail(s), "not a cluster node"), "%s",
              idem_errdetail(s));
    idem_close(s);
    snprintf(uri, sizeof uri, "redis://127.0.0.1:%d",
             th_first_port(th_cluster_addr()));
    rc = open_rc(uri, &s);
    cr_assert_eq(rc, IDEM_EINVAL, "%s", idem_strerror(rc));
    cr_assert(strstr(idem_errdetail(s), "is a cluster node"), "%s",
              idem_errdetail(s));
    idem_close(s);
}

Test(redis, slots_agree_with_server)
{
    redisContext *c = th_connect(th_first_port(th_cluster_addr()));
    static const char *const names[] = {
        "",        "{}",         "{{x}}",     "a{b}c{d}",  "{}x{y}",
        "foo{}{bar}", "{user1000}.following", "foo{{bar}}zap", "}{",
        "{a",      "a}",         "{",         "}",         "idempotency:{k}",
        "idempotency:{a}b}", "idempotency:{}x}", "idempotency:{{x}}",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        redisReply *r = th_cmd(c, "CLUSTER KEYSLOT %b", names[i],
                               strlen(names[i]));
        cr_assert_eq(r->type, REDIS_REPLY_INTEGER);
        cr_assert_eq((long long)idem__key_slot(names[i], strlen(names[i])),
                     r->integer, "'%s'", names[i]);
        freeReplyObject(r);
    }
    /* Random bytes, braces among them. */
    unsigned seed = 12345;
    for (int i = 0; i < 2000; i++) {
        unsigned char k[24];
        size_t n = 1 + (size_t)(i % 23);
        for (size_t j = 0; j < n; j++) {
            seed = seed * 1103515245u + 12345u;
            unsigned v = seed >> 16;
            k[j] = (unsigned char)(v % 5 == 0 ? '{' : v % 5 == 1 ? '}' : v);
        }
        redisReply *r = th_cmd(c, "CLUSTER KEYSLOT %b", k, n);
        cr_assert_eq((long long)idem__key_slot(k, n), r->integer);
        freeReplyObject(r);
    }
    redisFree(c);
}

/* Keys with braces and any bytes are kept apart exactly, and stored
 * under PREFIX{KEY} as docs/redis.md says. */
static void odd_keys(const char *uri, int port)
{
    static const char *const keys[] = {"}",    "{",    "a}b", "a}c", "{x}",
                                       "}{",   "{}",   "{{x}}", "x{y}z",
                                       "a b"};
    const char bin[] = {'\0', '{', '\xff', '}', '\n', '\0'};
    idem_store *s = t_open(uri);
    size_t nk = sizeof keys / sizeof keys[0];
    idem_key k[16];
    for (size_t i = 0; i < nk; i++)
        k[i] = (idem_key){keys[i], strlen(keys[i]), NULL};
    k[nk] = (idem_key){bin, sizeof bin, NULL};
    k[nk + 1] = (idem_key){bin, 1, NULL};
    size_t n = nk + 2;
    idem_outcome o[16];
    cr_assert_eq(idem_claim_many(s, k, n, NULL, o, 0), 0, "%s",
                 idem_errdetail(s));
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(o[i].status, 0);
        cr_assert_eq(o[i].kind, IDEM_NEW, "key %zu", i);
        char resp[32];
        int len = snprintf(resp, sizeof resp, "r%zu", i);
        cr_assert_eq(idem_complete(s, k[i].key, k[i].keylen, o[i].token, resp,
                                   (size_t)len, 0),
                     0, "%s", idem_errdetail(s));
    }
    cr_assert_eq(idem_claim_many(s, k, n, NULL, o, 0), 0);
    for (size_t i = 0; i < n; i++) {
        char resp[32];
        int len = snprintf(resp, sizeof resp, "r%zu", i);
        cr_assert_eq(o[i].kind, IDEM_REPLAY, "key %zu", i);
        cr_assert_eq(o[i].len, (size_t)len);
        cr_assert(memcmp(o[i].data, resp, (size_t)len) == 0, "key %zu", i);
    }
    /* The Redis key is exactly PREFIX{KEY}. */
    char pfx[128], name[256];
    prefix_of(uri, pfx, sizeof pfx);
    int np = snprintf(name, sizeof name, "%s{", pfx);
    memcpy(name + np, bin, sizeof bin);
    name[np + (int)sizeof bin] = '}';
    size_t namelen = (size_t)np + sizeof bin + 1;
    int owner = port;
    if (strncmp(uri, "redis-cluster", 13) == 0)
        owner = th_slot_owner(port, idem__key_slot(name, namelen));
    redisContext *c = th_connect(owner);
    redisReply *r = th_cmd(c, "HGET %b status", name, namelen);
    cr_assert(r->type == REDIS_REPLY_STRING && strcmp(r->str, "1") == 0);
    freeReplyObject(r);
    redisFree(c);
    idem_close(s);
}

Test(redis, odd_keys_single)
{
    odd_keys(single_uri(), th_first_port(th_redis_addr()));
}

Test(redis, odd_keys_cluster)
{
    odd_keys(cluster_uri(), th_first_port(th_cluster_addr()));
}

/* The documented fields, and a TTL on every record in every state. */
Test(redis, schema_and_ttl)
{
    const char *uri = single_uri();
    char pfx[128], name[256];
    prefix_of(uri, pfx, sizeof pfx);
    redisContext *c = th_connect(th_first_port(th_redis_addr()));
    idem_store *s = t_open(uri);
    uint8_t fp[IDEM_FP_LEN];
    memset(fp, 7, sizeof fp);
    static const char *const fields[] = {"status", "created_ts", "token",
                                         "lease", "fp", "attempts",
                                         "expires"};
    for (int step = 0; step < 3; step++) {
        char key[16];
        snprintf(key, sizeof key, "s%d", step);
        idem_key k = {key, strlen(key), fp};
        idem_outcome o;
        cr_assert_eq(idem_claim(s, &k, NULL, &o), 0);
        if (step == 1)
            cr_assert_eq(idem_complete(s, key, strlen(key), o.token, "R", 1,
                                       0), 0);
        if (step == 2)
            cr_assert_eq(idem_fail(s, key, strlen(key), o.token, "E", 1, 0),
                         0);
        snprintf(name, sizeof name, "%s{%s}", pfx, key);
        for (size_t f = 0; f < sizeof fields / sizeof *fields; f++) {
            redisReply *r = th_cmd(c, "HEXISTS %s %s", name, fields[f]);
            cr_assert_eq(r->integer, 1, "%s has no %s", name, fields[f]);
            freeReplyObject(r);
        }
        redisReply *r = th_cmd(c, "HGET %s status", name);
        cr_assert_eq(strtol(r->str, NULL, 10), step);
        freeReplyObject(r);
        r = th_cmd(c, "PTTL %s", name);
        cr_assert(r->integer > 0, "%s has no TTL", name);
        freeReplyObject(r);
        if (step) {
            r = th_cmd(c, "HGET %s response", name);
            cr_assert(r->type == REDIS_REPLY_STRING &&
                      strcmp(r->str, step == 1 ? "R" : "E") == 0);
            freeReplyObject(r);
        }
    }
    idem_close(s);
    redisFree(c);
}

/* Without a clock in the options, time is the server's. */
Test(redis, server_time)
{
    redisContext *c = th_connect(th_first_port(th_redis_addr()));
    idem_opts o;
    idem_opts_init(&o);
    idem_store *s;
    cr_assert_eq(idem_open(single_uri(), &o, &s), 0, "%s", idem_errdetail(s));
    redisReply *r = th_cmd(c, "TIME");
    long long before = strtoll(r->element[0]->str, NULL, 10) * 1000;
    freeReplyObject(r);
    idem_key k = {"t", 1, NULL};
    idem_claim_opts co = {100000000, 0};  /* a lease of ~28 hours */
    idem_outcome out;
    cr_assert_eq(idem_claim(s, &k, &co, &out), 0);
    /* Not a timing assertion: the lease is counted from the server's
     * clock, within the 28 hours of slack either way. */
    cr_assert(out.lease_until > before &&
              out.lease_until < before + 2 * 100000000LL);
    /* The token is the server's clock in microseconds, the lease's start
     * in ms. */
    cr_assert_geq(out.token, (uint64_t)before * 1000);
    cr_assert_eq(out.lease_until, (int64_t)(out.token / 1000) + co.lease_ms);
    idem_close(s);
    redisFree(c);
}

/* Records written when tokens counted the claims (1, 2, ..., with
 * attempts equal) keep working: the next claim's token is just larger. */
Test(redis, records_with_counted_tokens_keep_working)
{
    const char *uri = single_uri();
    char pfx[128];
    prefix_of(uri, pfx, sizeof pfx);
    redisContext *c = th_connect(th_first_port(th_redis_addr()));
    long long now = t_clock_ms;
    freeReplyObject(th_cmd(c, "HSET %s{p} status 0 token 3 attempts 3 "
                           "lease %lld expires %lld created_ts %lld", pfx,
                           now - 1, now + 60000, now - 5000));
    freeReplyObject(th_cmd(c, "HSET %s{d} status 1 token 2 attempts 2 "
                           "expires %lld created_ts %lld response R", pfx,
                           now + 60000, now - 5000));
    redisFree(c);
    idem_store *s = t_open(uri);
    idem_key p = {"p", 1, NULL}, d = {"d", 1, NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &p, NULL, &o), 0, "%s", idem_errdetail(s));
    cr_assert_eq(o.kind, IDEM_NEW, "its lease ran out: a takeover");
    cr_assert_gt(o.token, 3);
    cr_assert_eq(o.attempts, 4);
    cr_assert_eq(idem_complete(s, "p", 1, 3, "late", 4, 0), IDEM_ELOST);
    cr_assert_eq(idem_complete(s, "p", 1, o.token, "ok", 2, 0), 0);
    cr_assert_eq(idem_claim(s, &d, NULL, &o), 0);
    cr_assert_eq(o.kind, IDEM_REPLAY);
    cr_assert_eq(o.token, 2);
    cr_assert_eq(o.attempts, 2);
    cr_assert(o.len == 1 && !memcmp(o.data, "R", 1));
    idem_close(s);
}

/* A key that holds something else makes its own script fail: that key
 * alone gets an error, the rest of the pipeline goes through. */
static void errors_mid_pipeline(const char *uri, int port)
{
    char pfx[128], name[256];
    prefix_of(uri, pfx, sizeof pfx);
    int np = snprintf(name, sizeof name, "%s{k2}", pfx);
    int owner = port;
    if (strncmp(uri, "redis-cluster", 13) == 0)
        owner = th_slot_owner(port, idem__key_slot(name, (size_t)np));
    redisContext *c = th_connect(owner);
    freeReplyObject(th_cmd(c, "SET %s not-a-hash", name));
    idem_store *s = t_open(uri);
    idem_key k[4] = {{"k1", 2, NULL}, {"k2", 2, NULL}, {"k3", 2, NULL},
                     {"k4", 2, NULL}};
    idem_outcome o[4];
    cr_assert_eq(idem_claim_many(s, k, 4, NULL, o, 0), 0);
    cr_assert_eq(o[0].status, 0);
    cr_assert_eq(o[0].kind, IDEM_NEW);
    cr_assert_eq(o[1].status, IDEM_EPROTO);
    cr_assert(strstr(idem_errdetail(s), "WRONGTYPE"), "%s",
              idem_errdetail(s));
    cr_assert_eq(o[2].kind, IDEM_NEW);
    cr_assert_eq(o[3].kind, IDEM_NEW);
    idem_outcome one;
    cr_assert_eq(idem_claim(s, &k[1], NULL, &one), IDEM_EPROTO);
    cr_assert_eq(idem_forget(s, "k2", 2), IDEM_EPROTO);
    idem_record rec;
    cr_assert_eq(idem_get(s, "k2", 2, &rec), IDEM_EPROTO);
    /* The handle is fine afterwards. */
    cr_assert_eq(idem_complete(s, "k1", 2, o[0].token, "ok", 2, 0), 0);
    freeReplyObject(th_cmd(c, "DEL %s", name));
    cr_assert_eq(idem_claim(s, &k[1], NULL, &one), 0);
    cr_assert_eq(one.kind, IDEM_NEW);
    idem_close(s);
    redisFree(c);
}

Test(redis, errors_mid_pipeline_single)
{
    errors_mid_pipeline(single_uri(), th_first_port(th_redis_addr()));
}

Test(redis, errors_mid_pipeline_cluster)
{
    errors_mid_pipeline(cluster_uri(), th_first_port(th_cluster_addr()));
}

/* Scripts flushed on the server (a restart, SCRIPT FLUSH, a failover to
 * a replica that never loaded them): NOSCRIPT, load, retry. */
Test(redis, noscript_reloads)
{
    idem_store *s = t_open(single_uri());
    idem_key k = {"a", 1, NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0);
    redisContext *c = th_connect(th_first_port(th_redis_addr()));
    freeReplyObject(th_cmd(c, "SCRIPT FLUSH"));
    redisFree(c);
    cr_assert_eq(idem_complete(s, "a", 1, o.token, "x", 1, 0), 0, "%s",
                 idem_errdetail(s));
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0);
    cr_assert_eq(o.kind, IDEM_REPLAY);
    idem_close(s);
}

/* Records written without a TTL (by hand here) are swept once older than
 * the retention; live records and foreign keys stay. */
static void sweep_test(const char *uri, int port, int cluster)
{
    char pfx[128], name[256];
    prefix_of(uri, pfx, sizeof pfx);
    idem_opts o = t_options();
    o.retention_ms = 3600 * 1000;
    idem_store *s;
    cr_assert_eq(idem_open(uri, &o, &s), 0, "%s", idem_errdetail(s));
    enum { OLD = 60 };
    for (int i = 0; i < OLD + 2; i++) {
        int n = snprintf(name, sizeof name, "%s{h%d}", pfx, i);
        int owner = cluster ? th_slot_owner(port, idem__key_slot(name,
                                                                 (size_t)n))
                            : port;
        redisContext *c = th_connect(owner);
        long long created = t_clock_ms - (i < OLD ? 2 : 0) * 3600 * 1000LL;
        if (i == OLD + 1) {
            freeReplyObject(th_cmd(c, "SET %s foreign", name));
        } else {
            freeReplyObject(th_cmd(c, "HSET %s status 1 token 1 created_ts "
                                   "%lld expires %lld response x", name,
                                   created, t_clock_ms + 86400000LL));
        }
        redisFree(c);
    }
    idem_key k = {"live", 4, NULL};
    idem_outcome out;
    cr_assert_eq(idem_claim(s, &k, NULL, &out), 0);
    idem_stats st;
    cr_assert_eq(idem_stats_get(s, &st), 0, "%s", idem_errdetail(s));
    cr_assert_eq(st.live_keys, OLD + 3);
    cr_assert_eq(st.done, OLD + 1);
    cr_assert_eq(st.pending, 1);
    uint64_t expired = 0;
    cr_assert_eq(idem_sweep(s, 0, &expired), 0, "%s", idem_errdetail(s));
    cr_assert_eq(expired, OLD);
    cr_assert_eq(idem_get(s, "h0", 2, &(idem_record){0}), IDEM_ENOTFOUND);
    idem_record rec;
    char young[16];
    snprintf(young, sizeof young, "h%d", OLD);
    cr_assert_eq(idem_get(s, young, strlen(young), &rec), 0);
    cr_assert_eq(idem_get(s, "live", 4, &rec), 0);
    /* Records past their expiry (here: by the caller's clock) go too,
     * a page at a time with a work limit. */
    t_clock_ms += 2 * 86400000LL;
    uint64_t total = 0;
    for (int i = 0; i < 100 && total < 2; i++) {
        cr_assert_eq(idem_sweep(s, 1, &expired), 0, "%s", idem_errdetail(s));
        total += expired;
    }
    cr_assert_eq(total, 2);
    cr_assert_eq(idem_stats_get(s, &st), 0);
    cr_assert_eq(st.live_keys, 1, "the foreign key stays");
    idem_close(s);
}

Test(redis, sweep_single)
{
    sweep_test(single_uri(), th_first_port(th_redis_addr()), 0);
}

Test(redis, sweep_cluster)
{
    sweep_test(cluster_uri(), th_first_port(th_cluster_addr()), 1);
}

static int count_record(void *ctx, const void *key, size_t keylen,
                        const idem_record *rec)
{
    ++*(int *)ctx;
    return 0;
}

/* Every connection of the handle killed (CLIENT KILL) before a sweep,
 * stats and a dump: each reconnects and answers as if nothing had
 * happened, as claims do. pool=2 puts the scripts on a connection other
 * than the one that runs SCAN, so both paths find theirs dead. */
Test(redis, sweep_after_client_kill)
{
    enum { OLD = 300 };
    th_servers sv;
    th_start_single(&sv);
    char uri[1024];
    snprintf(uri, sizeof uri, "redis://127.0.0.1:%d?pool=2&timeout_ms=20000",
             sv.ports[0]);
    redisContext *c = th_connect(sv.ports[0]);
    for (int i = 0; i < OLD; i++)
        freeReplyObject(th_cmd(c, "HSET idempotency:{h%d} status 1 token 1 "
                               "created_ts %lld response x", i,
                               (long long)(t_clock_ms - 7200 * 1000LL)));
    idem_opts o = t_options();
    o.retention_ms = 3600 * 1000;
    idem_store *s;
    cr_assert_eq(idem_open(uri, &o, &s), 0, "%s", idem_errdetail(s));
    idem_key k[2] = {{"a", 1, NULL}, {"b", 1, NULL}};
    idem_outcome out[2];
    cr_assert_eq(idem_claim_many(s, k, 2, NULL, out, 0), 0);
    idem_stats st;
    cr_assert_eq(idem_stats_get(s, &st), 0, "%s", idem_errdetail(s));
    cr_assert_eq(st.live_keys, OLD + 2);
    redisReply *r = th_cmd(c, "CLIENT KILL TYPE normal");
    cr_assert(r->type == REDIS_REPLY_INTEGER && r->integer >= 2,
              "the handle's connections were killed");
    freeReplyObject(r);
    uint64_t swept = 0;
    cr_assert_eq(idem_sweep(s, 0, &swept), 0, "%s", idem_errdetail(s));
    cr_assert_eq(swept, OLD);
    freeReplyObject(th_cmd(c, "CLIENT KILL TYPE normal"));
    cr_assert_eq(idem_stats_get(s, &st), 0, "%s", idem_errdetail(s));
    cr_assert_eq(st.live_keys, 2);
    cr_assert_eq(st.pending, 2);
    freeReplyObject(th_cmd(c, "CLIENT KILL TYPE normal"));
    int seen = 0;
    cr_assert_eq(idem_scan(s, count_record, &seen), 0, "%s",
                 idem_errdetail(s));
    cr_assert_eq(seen, 2);
    idem_close(s);
    redisFree(c);
    th_stop(&sv);
}

/* Two processes claim the same 10,000 keys at once through the cluster:
 * every key is NEW for exactly one of them. */
Test(redis, two_processes_same_keys)
{
    enum { N = 10000, BATCH = 250 };
    char uri[2048];
    snprintf(uri, sizeof uri, "%s", cluster_uri());
    char *dir = t_tmpdir();
    pid_t kids[2];
    for (int p = 0; p < 2; p++) {
        kids[p] = fork();
        cr_assert(kids[p] >= 0);
        if (kids[p] == 0) {
            idem_opts o;
            idem_opts_init(&o);
            idem_store *s;
            if (idem_open(uri, &o, &s))
                _exit(2);
            char path[4200];
            snprintf(path, sizeof path, "%s/%d", dir, p);
            FILE *f = fopen(path, "w");
            static char names[N][16];
            static idem_key keys[N];
            static idem_outcome outs[N];
            for (int i = 0; i < N; i++) {
                /* The two walk the keys in opposite orders, so they meet
                 * in the middle rather than one trailing the other. */
                int k = p ? N - 1 - i : i;
                snprintf(names[i], sizeof names[i], "key%d", k);
                keys[i] = (idem_key){names[i], strlen(names[i]), NULL};
            }
            for (int i = 0; i < N; i += BATCH)
                if (idem_claim_many(s, keys + i, BATCH, NULL, outs + i, 0))
                    _exit(3);
            for (int i = 0; i < N; i++)
                fprintf(f, "%s %d %d\n", names[i], outs[i].status,
                        outs[i].kind);
            fclose(f);
            idem_close(s);
            _exit(0);
        }
    }
    for (int p = 0; p < 2; p++) {
        int st;
        cr_assert_eq(waitpid(kids[p], &st, 0), kids[p]);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d: %d", p,
                  WEXITSTATUS(st));
    }
    static unsigned char news[N], busy[N];
    for (int p = 0; p < 2; p++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%d", dir, p);
        FILE *f = fopen(path, "r");
        cr_assert(f);
        int k, status, kind, lines = 0;
        while (fscanf(f, "key%d %d %d\n", &k, &status, &kind) == 3) {
            cr_assert_eq(status, 0);
            cr_assert(kind == IDEM_NEW || kind == IDEM_BUSY);
            news[k] += kind == IDEM_NEW;
            busy[k] += kind == IDEM_BUSY;
            lines++;
        }
        fclose(f);
        cr_assert_eq(lines, N);
    }
    for (int k = 0; k < N; k++) {
        cr_assert_eq(news[k], 1, "key%d was NEW %d times", k, news[k]);
        cr_assert_eq(busy[k], 1);
    }
    t_rmdir(dir);
    free(dir);
}

/* wait=1 on a server without replicas: the write is applied but cannot
 * be confirmed, and the call says so instead of acknowledging it. */
Test(redis, wait_without_replicas)
{
    char uri[1024];
    snprintf(uri, sizeof uri, "redis://%s?prefix=%s&wait=1&timeout_ms=300",
             th_redis_addr(), th_prefix());
    idem_store *s = t_open(uri);
    idem_key k[2] = {{"a", 1, NULL}, {"b", 1, NULL}};
    idem_outcome o[2];
    cr_assert_eq(idem_claim_many(s, k, 2, NULL, o, 0), IDEM_ETIMEOUT);
    cr_assert_eq(o[0].status, IDEM_ETIMEOUT);
    cr_assert_eq(o[1].status, IDEM_ETIMEOUT);
    cr_assert(strstr(idem_errdetail(s), "WAIT 1"), "%s", idem_errdetail(s));
    /* Reads need no replica. */
    idem_record rec;
    cr_assert_eq(idem_get(s, "a", 1, &rec), 0, "%s", idem_errdetail(s));
    idem_close(s);
}

/* A server that stops answering: every call comes back with an error
 * within its budget, and the handle works again once the server does. */
Test(redis, unresponsive_server)
{
    th_servers sv;
    th_start_single(&sv);
    char uri[1024];
    snprintf(uri, sizeof uri, "redis://127.0.0.1:%d?timeout_ms=300",
             sv.ports[0]);
    idem_store *s = t_open(uri);
    redisContext *c = th_connect(sv.ports[0]);
    freeReplyObject(th_cmd(c, "CLIENT PAUSE 1500 ALL"));
    idem_key k = {"k", 1, NULL};
    idem_outcome o;
    int rc = idem_claim(s, &k, NULL, &o);
    cr_assert_eq(rc, IDEM_ETIMEOUT, "%s: %s", idem_strerror(rc),
                 idem_errdetail(s));
    cr_assert(strstr(idem_errdetail(s), "no answer within"), "%s",
              idem_errdetail(s));
    /* Once the pause is over the same handle answers again: the claim
     * that timed out may have run, and its retry by the same handle
     * would say so; a fresh key is simply NEW. */
    freeReplyObject(th_cmd(c, "CLIENT UNPAUSE"));
    idem_key k2 = {"k2", 2, NULL};
    for (int i = 0; i < 50; i++) {
        rc = idem_claim(s, &k2, NULL, &o);
        if (rc == 0)
            break;
    }
    cr_assert_eq(rc, 0, "%s", idem_errdetail(s));
    cr_assert_eq(o.kind, IDEM_NEW);
    idem_close(s);
    redisFree(c);
    th_stop(&sv);
}

/* A pool spreads a batch over several connections per node; answers are
 * the same, a key given twice included. */
static void pool_test(const char *scheme, const char *addr)
{
    enum { N = 3000 };
    char uri[1024];
    snprintf(uri, sizeof uri, "%s://%s?prefix=%s&pool=4", scheme, addr,
             th_prefix());
    idem_store *s = t_open(uri);
    static char names[N][16];
    static idem_key keys[N];
    static idem_outcome outs[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "p%d", i % (N / 2));
        keys[i] = (idem_key){names[i], strlen(names[i]), NULL};
    }
    /* Each key twice in one batch: NEW, then BUSY. */
    cr_assert_eq(idem_claim_many(s, keys, N, NULL, outs, 0), 0, "%s",
                 idem_errdetail(s));
    for (int i = 0; i < N; i++)
        cr_assert_eq(outs[i].kind, i < N / 2 ? IDEM_NEW : IDEM_BUSY,
                     "%d: %d", i, outs[i].kind);
    idem_close(s);
}

Test(redis, pool_of_connections_single)
{
    pool_test("redis", th_redis_addr());
}

Test(redis, pool_of_connections_cluster)
{
    pool_test("redis-cluster", th_cluster_addr());
}

/* The CLI reaches Redis through the same URIs. */
Test(redis, cli_takes_redis_uris)
{
    const char *cli = getenv("IDEM_CLI");
    if (!cli)
        cr_skip_test("IDEM_CLI not set");
    char uri[1024];
    snprintf(uri, sizeof uri, "redis://%s?prefix=%s", th_redis_addr(),
             th_prefix());
    int st = t_sh("'%s' bench --store '%s' -n 2000 --batch 100 >/dev/null",
                  cli, uri);
    cr_assert_eq(st, 0);
}

Test(redis, read_only_handle)
{
    const char *uri = single_uri();
    idem_store *s = t_open(uri);
    idem_key k = {"k", 1, NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0);
    idem_close(s);
    idem_opts opts = t_options();
    opts.flags = IDEM_O_READONLY;
    cr_assert_eq(idem_open(uri, &opts, &s), 0, "%s", idem_errdetail(s));
    idem_record rec;
    cr_assert_eq(idem_get(s, "k", 1, &rec), 0);
    cr_assert_eq(idem_claim(s, &k, NULL, &o), IDEM_EINVAL);
    cr_assert(strstr(idem_errdetail(s), "read-only"), "%s",
              idem_errdetail(s));
    cr_assert_eq(idem_forget(s, "k", 1), IDEM_EINVAL);
    uint64_t n;
    cr_assert_eq(idem_sweep(s, 0, &n), IDEM_EINVAL);
    idem_close(s);
}

/* A store outgrows one machine: `idem dump` of a local store piped into
 * `idem load` on Redis (both layouts) keeps every record, so the keys
 * stay duplicates there, and a dump of Redis gives the same records. */
Test(redis, cli_migrates_a_local_store)
{
    const char *cli = getenv("IDEM_CLI");
    if (!cli)
        cr_skip_test("IDEM_CLI not set");
    char *dir = t_dir_with("in.ndjson", "{\"id\":\"a\"}\n{\"id\":\"b\"}\n"
                                        "{\"id\":\"c\"}\n");
    cr_assert_eq(t_sh("cd '%s' && '%s' dedup --store local:st --key id "
                      "in.ndjson >/dev/null 2>&1 && '%s' dump --store local:st"
                      " | sort > local.dump", dir, cli, cli), 0);
    static const char *const layouts[] = {"", "&layout=day&days=2"};
    for (int i = 0; i < 2; i++) {
        char uri[1024];
        snprintf(uri, sizeof uri, "redis://%s?prefix=%s%s", th_redis_addr(),
                 th_prefix(), layouts[i]);
        cr_assert_eq(t_sh("cd '%s' && '%s' load --store '%s' local.dump "
                          "2>/dev/null && '%s' dump --store '%s' 2>/dev/null"
                          " | sort | cmp -s - local.dump", dir, cli, uri, cli,
                          uri), 0, "%s", uri);
        cr_assert_eq(t_sh("cd '%s' && '%s' dedup --store '%s' --key id "
                          "in.ndjson 2>/dev/null > out && test ! -s out", dir,
                          cli, uri), 0, "%s", uri);
    }
    t_rmdir(dir);
}

/* idem check reads every record and reports those idem cannot read (a
 * key under the prefix that is not a record, a field written by hand):
 * every claim of their key fails until repair deletes them. Both
 * layouts; the readable records stay. */
static void check_repair(const char *layout)
{
    char pfx[64], uri[1024];
    snprintf(pfx, sizeof pfx, "%s", th_prefix());
    snprintf(uri, sizeof uri, "redis://%s?prefix=%s%s", th_redis_addr(), pfx,
             layout);
    idem_store *s = t_open(uri);
    for (int i = 0; i < 50; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        idem_outcome o;
        cr_assert_eq(idem_claim(s, &(idem_key){k, strlen(k), NULL}, NULL,
                                &o), 0);
    }
    idem_check_report r;
    cr_assert_eq(idem_check(uri, &r), 0, "%s", r.first_damage);
    cr_assert_eq(r.records, 50);
    cr_assert_eq(r.damaged, 0);
    redisContext *c = th_connect(th_first_port(th_redis_addr()));
    if (*layout) {
        redisReply *b = th_cmd(c, "KEYS %s2*", pfx);
        cr_assert(b->elements > 0);
        freeReplyObject(th_cmd(c, "HSET %s junk notarecord",
                               b->element[0]->str));
        freeReplyObject(b);
    } else {
        freeReplyObject(th_cmd(c, "SET %s{bad} x", pfx));
        freeReplyObject(th_cmd(c, "HSET %s{k7} token x", pfx));
    }
    cr_assert_eq(idem_check(uri, &r), IDEM_ECORRUPT);
    cr_assert_eq(r.damaged, *layout ? 1 : 2);
    cr_assert(strstr(r.first_damage, *layout ? "not a packed record"
                                             : "not a hash") ||
                  strstr(r.first_damage, "token is x"),
              "%s", r.first_damage);
    cr_assert_eq(idem_repair(uri, &r), 0, "%s", r.first_damage);
    cr_assert_eq(idem_check(uri, &r), 0, "%s", r.first_damage);
    cr_assert_eq(r.records, *layout ? 50 : 49);
    idem_record rec;
    cr_assert_eq(idem_get(s, "k1", 2, &rec), 0);
    idem_close(s);
    redisFree(c);
}

Test(redis, check_and_repair_hash)
{
    check_repair("");
}

Test(redis, check_and_repair_day)
{
    check_repair("&layout=day&shards=2");
}

/* The runner without a handler on Redis (no group commit): keys are
 * completed only after commit(); a commit() that fails releases them at
 * once, so the retry of the batch gets them NEW without waiting out the
 * (here ten-minute) lease. */
static int fail_first_commit(void *ctx, const idem_msg *m, size_t n)
{
    (void)m, (void)n;
    int *calls = ctx;
    return (*calls)++ == 0 ? IDEM_EIO : 0;
}

Test(redis, runner_releases_claims_when_commit_fails)
{
    idem_store *s = t_open(single_uri());
    int calls = 0;
    idem_runner_opts o;
    idem_runner_opts_init(&o);
    o.commit = fail_first_commit;
    o.ctx = &calls;
    o.lease_ms = 600000;
    idem_runner *r;
    cr_assert_eq(idem_runner_new(s, &o, &r), 0);
    idem_msg m[2] = {{.key = "a", .keylen = 1, .msg = "a", .msglen = 1},
                     {.key = "b", .keylen = 1, .msg = "b", .msglen = 1}};
    size_t done;
    cr_assert_eq(idem_runner_batch(r, m, 2, &done), IDEM_EIO);
    cr_assert_eq(idem_get(s, "a", 1, &(idem_record){0}), 0);
    cr_assert_eq(idem_runner_batch(r, m, 2, &done), 0, "%s",
                 idem_errdetail(s));
    cr_assert_eq(done, 2);
    cr_assert_eq(m[0].result, IDEM_MSG_DONE);
    cr_assert_eq(m[0].attempt, 2, "a new claim of the released key");
    idem_record rec;
    cr_assert_eq(idem_get(s, "a", 1, &rec), 0);
    cr_assert_eq(rec.state, IDEM_STATE_DONE);
    idem_runner_free(r);
    idem_close(s);
}

/* A handle whose open failed gives EINVAL to a runner, not a crash. */
Test(redis, runner_on_a_failed_handle)
{
    idem_opts opts;
    idem_opts_init(&opts);
    idem_store *s;
    cr_assert_neq(idem_open("redis://127.0.0.1:1?connect_timeout_ms=200",
                            &opts, &s), 0);
    idem_runner_opts o;
    idem_runner_opts_init(&o);
    idem_runner *r = NULL;
    int rc = idem_runner_new(s, &o, &r);
    idem_msg m = {.key = "a", .keylen = 1, .msg = "a", .msglen = 1};
    if (!rc)
        rc = idem_runner_batch(r, &m, 1, NULL);
    cr_assert_neq(rc, 0);
    idem_runner_free(r);
    idem_close(s);
}

/* dedup on Redis keeps its output by checkpoint, as on a local store: an
 * output it has no checkpoint for (here one holding a torn line) is
 * refused on both, and taken over with --overwrite alike. */
Test(redis, dedup_output_as_on_a_local_store)
{
    const char *cli = getenv("IDEM_CLI");
    if (!cli)
        cr_skip_test("IDEM_CLI not set");
    char *dir = t_dir_with("in.ndjson", "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
    char out[4200];
    snprintf(out, sizeof out, "%s/out", dir);
    char uri[1024];
    snprintf(uri, sizeof uri, "redis://%s?prefix=%s", th_redis_addr(),
             th_prefix());
    const char *stores[2] = {uri, "local:store"};
    char *got[2];
    for (int i = 0; i < 2; i++) {
        /* an output no checkpoint names is refused, on both */
        t_write(out, "{\"id\":\"a\"}\n{\"id\":\"b", 17);
        cr_assert_eq(t_sh("cd '%s' && '%s' dedup --store '%s' --key id "
                          "--output out in.ndjson 2>/dev/null", dir, cli,
                          stores[i]), 1);
        cr_assert_eq(t_sh("cd '%s' && '%s' dedup --store '%s' --key id "
                          "--overwrite --output out in.ndjson 2>/dev/null",
                          dir, cli, stores[i]), 0);
        got[i] = t_read(out, NULL);
    }
    cr_assert_str_eq(got[0], got[1]);
    cr_assert_str_eq(got[0], "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
    free(got[0]);
    free(got[1]);
    t_rmdir(dir);
}

/* idem sweep --retention: a record without a TTL (written by hand here)
 * goes once older than the retention, and not before. */
Test(redis, cli_sweep_retention)
{
    const char *cli = getenv("IDEM_CLI");
    if (!cli)
        cr_skip_test("IDEM_CLI not set");
    char pfx[64], uri[1024];
    snprintf(pfx, sizeof pfx, "%s", th_prefix());
    snprintf(uri, sizeof uri, "redis://%s?prefix=%s", th_redis_addr(), pfx);
    redisContext *c = th_connect(th_first_port(th_redis_addr()));
    redisReply *r = th_cmd(c, "TIME");
    long long now = strtoll(r->element[0]->str, NULL, 10) * 1000;
    freeReplyObject(r);
    freeReplyObject(th_cmd(c, "HSET %s{old} status 1 token 1 created_ts "
                           "%lld expires %lld", pfx, now - 7200000,
                           now + 86400000));
    char *dir = t_tmpdir();
    char out[4200];
    snprintf(out, sizeof out, "%s/out", dir);
    cr_assert_eq(t_sh("'%s' sweep --store '%s' --retention 3h > '%s'", cli,
                      uri, out), 0);
    cr_assert(t_grep(out, "removed 0 records"));
    cr_assert_eq(t_sh("'%s' sweep --store '%s' --retention 1h > '%s'", cli,
                      uri, out), 0);
    cr_assert(t_grep(out, "removed 1 records"));
    r = th_cmd(c, "EXISTS %s{old}", pfx);
    cr_assert_eq(r->integer, 0);
    freeReplyObject(r);
    cr_assert_eq(t_sh("'%s' sweep --store '%s' --retention never "
                      "2>/dev/null", cli, uri), 2);
    redisFree(c);
    t_rmdir(dir);
}
