/* tests/test_redis_day.c - the day-bucketed layout on real servers: where
 * records live (a bucket per day and shard, the record moving to today's
 * bucket with each write), lookups across days, whole buckets dropped at
 * once by Redis's TTL and by sweep, settings that would lose records
 * refused, and the CLI on such a store. The claim protocol itself is the
 * conformance suite's (conf_redis_day, conf_cluster_day). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "redis/crc16.h"
#include "redis_harness.h"

static char uri_buf[2048];
static char pfx[128];

static void fini(void)
{
    th_shared_stop();
}

TestSuite(redis_day, .fini = fini, .timeout = 120);

#define DAY_MS 86400000LL

/* A fresh day-layout store URI on the shared server or cluster; its
 * prefix goes to pfx. */
static const char *day_uri(int cluster, const char *params)
{
    snprintf(pfx, sizeof pfx, "%s", th_prefix());
    snprintf(uri_buf, sizeof uri_buf,
             "%s://%s?prefix=%s&timeout_ms=20000&layout=day&%s",
             cluster ? "redis-cluster" : "redis",
             cluster ? th_cluster_addr() : th_redis_addr(), pfx, params);
    return uri_buf;
}

static int single_port(void)
{
    return th_first_port(th_redis_addr());
}

/* YYYY-MM-DD of a time in ms. */
static void date_of(int64_t ms, char out[16])
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 16, "%Y-%m-%d", &tm);
}

/* The names of the buckets under pfx on the server at port. */
static redisReply *buckets(redisContext *c)
{
    redisReply *r = th_cmd(c, "KEYS %s%s", pfx,
                           "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]:{*}");
    cr_assert_eq(r->type, REDIS_REPLY_ARRAY);
    return r;
}

/* In how many buckets of day `date` the key is a field. */
static int held_on(redisContext *c, const char *date, const char *key)
{
    redisReply *all = buckets(c);
    int n = 0;
    for (size_t i = 0; i < all->elements; i++) {
        const char *name = all->element[i]->str;
        if (strncmp(name + strlen(pfx), date, 10) != 0)
            continue;
        redisReply *r = th_cmd(c, "HEXISTS %s %s", name, key);
        n += (int)r->integer;
        freeReplyObject(r);
    }
    freeReplyObject(all);
    return n;
}

static idem_outcome claim(idem_store *s, const char *key)
{
    idem_key k = {key, strlen(key), NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0, "%s", idem_errdetail(s));
    return o;
}

/* A record lives in the bucket of the day of its last write; reads find
 * it in the days before; a bucket expires whole when its days are over
 * and sweep drops the ones Redis has not. */
Test(redis_day, records_move_with_their_writes)
{
    redisContext *c = th_connect(single_port());
    t_clock_ms = 1700000000000LL;  /* 2023-11-14 22:13:20 UTC */
    idem_store *s = t_open(day_uri(0, "days=2&shards=4"));
    char d0[16], d1[16];
    date_of(t_clock_ms, d0);
    date_of(t_clock_ms + DAY_MS, d1);
    idem_outcome a = claim(s, "a");
    cr_assert_eq(idem_complete(s, "a", 1, a.token, "R", 1, 0), 0);
    idem_outcome b = claim(s, "b");
    cr_assert_eq(held_on(c, d0, "a"), 1);
    cr_assert_eq(held_on(c, d0, "b"), 1);
    /* The bucket lives to the end of its day + 2 days, by the clock the
     * store was given (not a timing assertion: a minute of slack). */
    int64_t end = (t_clock_ms / DAY_MS + 3) * DAY_MS;
    redisReply *all = buckets(c);
    cr_assert_eq(all->elements, 2, "a and b in 2 of the 4 shards, or 1");
    for (size_t i = 0; i < all->elements; i++) {
        redisReply *r = th_cmd(c, "PTTL %s", all->element[i]->str);
        cr_assert(r->integer <= end - t_clock_ms &&
                  r->integer > end - t_clock_ms - 60000,
                  "%s: PTTL %lld", all->element[i]->str, r->integer);
        freeReplyObject(r);
    }
    freeReplyObject(all);

    /* 12 hours later it is the next day: a is found in yesterday's
     * bucket and stays there; completing b moves it to today's. */
    t_clock_ms += DAY_MS / 2;
    idem_outcome o = claim(s, "a");
    cr_assert_eq(o.kind, IDEM_REPLAY);
    cr_assert_eq(o.len, 1);
    cr_assert_eq(held_on(c, d0, "a"), 1);
    cr_assert_eq(idem_complete(s, "b", 1, b.token, "S", 1, 2 * DAY_MS), 0);
    cr_assert_eq(held_on(c, d0, "b"), 0);
    cr_assert_eq(held_on(c, d1, "b"), 1);
    idem_stats st;
    cr_assert_eq(idem_stats_get(s, &st), 0, "%s", idem_errdetail(s));
    cr_assert_eq(st.live_keys, 2);
    cr_assert_eq(st.done, 2);

    /* Past the end of d0's days its bucket is dropped whole, with a in
     * it; d1's bucket stays, and so does b, and so does a hash that only
     * looks like a bucket (its tag is not one of the store's). */
    redisReply *fake = th_cmd(c, "HSET %s2001-01-01:{x} f v", pfx);
    freeReplyObject(fake);
    t_clock_ms = end;
    uint64_t dropped = 0;
    cr_assert_eq(idem_sweep(s, 0, &dropped), 0, "%s", idem_errdetail(s));
    cr_assert_eq(dropped, 1);
    cr_assert_eq(held_on(c, d0, "a"), 0);
    cr_assert_eq(idem_get(s, "a", 1, &(idem_record){0}), IDEM_ENOTFOUND);
    idem_record rec;
    cr_assert_eq(idem_get(s, "b", 1, &rec), 0);
    cr_assert_eq(rec.state, IDEM_STATE_DONE);
    fake = th_cmd(c, "EXISTS %s2001-01-01:{x}", pfx);
    cr_assert_eq(fake->integer, 1);
    freeReplyObject(fake);
    idem_close(s);
    redisFree(c);
}

/* Thousands of records of one day go with their buckets, one key per
 * shard, on every master of a cluster. */
Test(redis_day, whole_days_dropped_on_every_master)
{
    enum { N = 5000, SHARDS = 16 };
    t_clock_ms = 1700000000000LL;
    const char *uri = day_uri(1, "days=1&shards=16");
    idem_store *s = t_open(uri);
    idem_key *keys = calloc(N, sizeof *keys);
    idem_outcome *outs = calloc(N, sizeof *outs);
    char (*names)[16] = calloc(N, sizeof *names);
    cr_assert(keys && outs && names);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "k%d", i);
        keys[i] = (idem_key){names[i], strlen(names[i]), NULL};
    }
    cr_assert_eq(idem_claim_many(s, keys, N, NULL, outs, 0), 0, "%s",
                 idem_errdetail(s));
    for (int i = 0; i < N; i++)
        cr_assert_eq(outs[i].kind, IDEM_NEW);
    /* The shards' buckets spread over the three masters. */
    int port = th_first_port(th_cluster_addr());
    int total = 0, masters = 0, seen[3] = {0, 0, 0};
    for (unsigned slot = 0; slot < IDEM__SLOTS; slot += IDEM__SLOTS / 3) {
        int owner = th_slot_owner(port, slot);
        int dup = 0;
        for (int m = 0; m < masters; m++)
            dup |= seen[m] == owner;
        if (dup)
            continue;
        seen[masters++] = owner;
        redisContext *c = th_connect(owner);
        redisReply *all = buckets(c);
        cr_assert(all->elements > 0, "no bucket on master %d", owner);
        total += (int)all->elements;
        freeReplyObject(all);
        redisFree(c);
    }
    cr_assert_eq(masters, 3);
    cr_assert_eq(total, SHARDS);
    t_clock_ms += 2 * DAY_MS + DAY_MS / 2;
    uint64_t dropped = 0;
    cr_assert_eq(idem_sweep(s, 0, &dropped), 0, "%s", idem_errdetail(s));
    cr_assert_eq(dropped, N);
    for (int m = 0; m < masters; m++) {
        redisContext *c = th_connect(seen[m]);
        redisReply *all = buckets(c);
        cr_assert_eq(all->elements, 0);
        freeReplyObject(all);
        redisFree(c);
    }
    cr_assert_eq(idem_claim_many(s, keys, N, NULL, outs, 0), 0);
    cr_assert_eq(outs[N - 1].kind, IDEM_NEW);
    idem_close(s);
    free(keys);
    free(outs);
    free(names);
}

/* A record cannot outlive its bucket: longer TTLs and leases are
 * refused, at open for the defaults and per call for the rest. */
Test(redis_day, ttl_beyond_days_refused)
{
    const char *uri = day_uri(0, "days=1");
    idem_opts o = t_options();
    o.ttl_ms = 2 * DAY_MS;
    idem_store *s;
    cr_assert_eq(idem_open(uri, &o, &s), IDEM_EINVAL);
    cr_assert(strstr(idem_errdetail(s), "days=1"), "%s", idem_errdetail(s));
    idem_close(s);
    s = t_open(uri);
    idem_key k = {"k", 1, NULL};
    idem_claim_opts co = {30000, DAY_MS + 1};
    idem_outcome out;
    cr_assert_eq(idem_claim(s, &k, &co, &out), IDEM_EINVAL);
    cr_assert(strstr(idem_errdetail(s), "TTL"), "%s", idem_errdetail(s));
    co.ttl_ms = DAY_MS;
    cr_assert_eq(idem_claim(s, &k, &co, &out), 0, "%s", idem_errdetail(s));
    cr_assert_eq(idem_extend(s, "k", 1, out.token, DAY_MS + 1), IDEM_EINVAL);
    cr_assert_eq(idem_complete(s, "k", 1, out.token, "x", 1, DAY_MS + 1),
                 IDEM_EINVAL);
    cr_assert_eq(idem_complete(s, "k", 1, out.token, "x", 1, DAY_MS), 0);
    idem_close(s);
}

/* The layout, shards and days decide where keys live and how far back
 * a lookup reads: reopening a prefix with other settings would answer
 * NEW for keys already done, so it fails, whichever layout came first. */
Test(redis_day, layout_settings_are_kept)
{
    char uri[2048], other[2200];
    snprintf(uri, sizeof uri, "%s", day_uri(0, "shards=4&days=3"));
    idem_store *s = t_open(uri);
    claim(s, "k");
    idem_close(s);
    static const char *const differ[] = {"&layout=day&shards=5&days=3",
                                         "&layout=day&shards=4&days=2",
                                         "&layout=day&shards=4", ""};
    for (size_t i = 0; i < sizeof differ / sizeof *differ; i++) {
        snprintf(other, sizeof other, "redis://%s?prefix=%s%s",
                 th_redis_addr(), pfx, differ[i]);
        idem_opts o = t_options();
        cr_assert_eq(idem_open(other, &o, &s), IDEM_EINVAL, "%s", other);
        cr_assert(strstr(idem_errdetail(s), "day shards=4 days=3"), "%s",
                  idem_errdetail(s));
        idem_close(s);
    }
    s = t_open(uri);
    cr_assert_eq(claim(s, "k").kind, IDEM_BUSY);
    idem_close(s);
    /* A hash-layout prefix is marked too, and refuses the day layout. */
    char hash_pfx[64];
    snprintf(hash_pfx, sizeof hash_pfx, "%s", th_prefix());
    snprintf(other, sizeof other, "redis://%s?prefix=%s", th_redis_addr(),
             hash_pfx);
    s = t_open(other);
    claim(s, "k");
    idem_close(s);
    snprintf(other, sizeof other, "redis://%s?prefix=%s&layout=day",
             th_redis_addr(), hash_pfx);
    idem_opts o = t_options();
    cr_assert_eq(idem_open(other, &o, &s), IDEM_EINVAL);
    cr_assert(strstr(idem_errdetail(s), "'hash'"), "%s", idem_errdetail(s));
    idem_close(s);
}

/* A clock stepped back across midnight (a failover to a lagging
 * replica, an NTP step) must not hide the record written "tomorrow". */
Test(redis_day, clock_stepped_back_over_midnight)
{
    redisContext *c = th_connect(single_port());
    int64_t midnight = (1700000000000LL / DAY_MS + 1) * DAY_MS;
    t_clock_ms = midnight + 10;
    idem_store *s = t_open(day_uri(0, "days=1&shards=2"));
    idem_outcome o = claim(s, "k");
    cr_assert_eq(idem_complete(s, "k", 1, o.token, "R", 1, 0), 0);
    t_clock_ms = midnight - 10;
    o = claim(s, "k");
    cr_assert_eq(o.kind, IDEM_REPLAY);
    /* A write under the stepped-back clock leaves it where it is. */
    o = claim(s, "j");
    t_clock_ms = midnight + 20;
    cr_assert_eq(idem_complete(s, "j", 1, o.token, "S", 1, 0), 0);
    t_clock_ms = midnight - 5;
    cr_assert_eq(claim(s, "j").kind, IDEM_REPLAY);
    char today[16];
    date_of(midnight, today);
    cr_assert_eq(held_on(c, today, "k"), 1);
    cr_assert_eq(held_on(c, today, "j"), 1);
    idem_close(s);
    redisFree(c);
}

/* Without a clock in the options, the bucket is the server's day. */
Test(redis_day, server_time_names_the_bucket)
{
    redisContext *c = th_connect(single_port());
    idem_opts o;
    idem_opts_init(&o);
    idem_store *s;
    cr_assert_eq(idem_open(day_uri(0, "shards=1"), &o, &s), 0, "%s",
                 idem_errdetail(s));
    redisReply *r = th_cmd(c, "TIME");
    int64_t before = strtoll(r->element[0]->str, NULL, 10) * 1000;
    freeReplyObject(r);
    claim(s, "k");
    r = th_cmd(c, "TIME");
    int64_t after = strtoll(r->element[0]->str, NULL, 10) * 1000;
    freeReplyObject(r);
    char d0[16], d1[16];
    date_of(before, d0);
    date_of(after, d1);
    cr_assert_eq(held_on(c, d0, "k") + (strcmp(d0, d1) ? held_on(c, d1, "k")
                                                       : 0),
                 1);
    idem_close(s);
    redisFree(c);
}

Test(redis_day, uri_errors)
{
    static const struct {
        const char *params, *says;
    } bad[] = {
        {"layout=week", "layout must be hash or day"},
        {"layout=day&days=0", "days must be a number in 1..90"},
        {"layout=day&days=91", "days must be a number in 1..90"},
        {"layout=day&shards=0", "shards must be a number in 1..1024"},
        {"layout=day&shards=1025", "shards must be a number in 1..1024"},
        {"days=3", "days and shards belong to layout=day"},
        {"layout=day&prefix=a%7Bb%7D:", "prefix without '{'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char uri[512];
        snprintf(uri, sizeof uri, "redis://%s?%s", th_redis_addr(),
                 bad[i].params);
        idem_opts o = t_options();
        idem_store *s;
        cr_assert_eq(idem_open(uri, &o, &s), IDEM_EINVAL, "%s", uri);
        cr_assert(strstr(idem_errdetail(s), bad[i].says), "%s: %s", uri,
                  idem_errdetail(s));
        idem_close(s);
    }
}

/* The tools work on such a store: a second dedup of the same input
 * prints nothing, and sweep and stats report the buckets' records. */
Test(redis_day, cli_dedup_twice)
{
    const char *cli = getenv("IDEM_CLI");
    if (!cli)
        cr_skip_test("IDEM_CLI not set");
    char *dir = t_dir_with("in.ndjson", "{\"id\":\"a\"}\n{\"id\":\"b\"}\n"
                                        "{\"id\":\"a\"}\n");
    char in[1024];
    snprintf(in, sizeof in, "%s/in.ndjson", dir);
    const char *uri = day_uri(0, "days=3");
    for (int run = 0; run < 2; run++)
        cr_assert_eq(t_sh("'%s' dedup --store '%s' --key id '%s' "
                          "> '%s/out%d' 2>/dev/null", cli, uri, in, dir, run),
                     0);
    char path[1100];
    snprintf(path, sizeof path, "%s/out0", dir);
    char *first = t_read(path, NULL);
    cr_assert_str_eq(first, "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
    snprintf(path, sizeof path, "%s/out1", dir);
    char *second = t_read(path, NULL);
    cr_assert_str_eq(second, "");
    cr_assert_eq(t_sh("'%s' stats --store '%s' > '%s/stats'", cli, uri, dir),
                 0);
    snprintf(path, sizeof path, "%s/stats", dir);
    cr_assert(t_grep(path, "0 pending, 2 done"));
    free(first);
    free(second);
    t_rmdir(dir);
}
