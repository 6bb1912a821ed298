/* tests/test_conformance.c - the claim protocol, as the README states it,
 * checked on every backend. Time is driven by the injectable clock. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "conformance.h"
#include "redis_harness.h"
#include "store.h"

const char *conf_uri;
static char *conf_dir;

void conf_setup_mem(void)
{
    conf_uri = "mem:";
}

void conf_setup_local(void)
{
    conf_dir = t_tmpdir();
    conf_uri = t_local_uri(conf_dir);
}

static char conf_uri_buf[1024];

/* Every commit seals its segment and every sealed segment goes cold: a
 * key is in RAM only until the next commit, then in a key index file. */
void conf_setup_cold(void)
{
    conf_dir = t_tmpdir();
    snprintf(conf_uri_buf, sizeof conf_uri_buf, "%s?hot=0&segment=1",
             t_local_uri(conf_dir));
    conf_uri = conf_uri_buf;
}

void conf_setup_redis(void)
{
    snprintf(conf_uri_buf, sizeof conf_uri_buf,
             "redis://%s?prefix=%s&timeout_ms=20000", th_redis_addr(),
             th_prefix());
    conf_uri = conf_uri_buf;
}

void conf_setup_cluster(void)
{
    snprintf(conf_uri_buf, sizeof conf_uri_buf,
             "redis-cluster://%s?prefix=%s&timeout_ms=20000",
             th_cluster_addr(), th_prefix());
    conf_uri = conf_uri_buf;
}

/* The day layout with few days and shards, so that the tests' keys
 * share buckets and their clock jumps cross days. */
void conf_setup_redis_day(void)
{
    snprintf(conf_uri_buf, sizeof conf_uri_buf,
             "redis://%s?prefix=%s&timeout_ms=20000&layout=day&days=2&"
             "shards=3", th_redis_addr(), th_prefix());
    conf_uri = conf_uri_buf;
}

void conf_setup_cluster_day(void)
{
    snprintf(conf_uri_buf, sizeof conf_uri_buf,
             "redis-cluster://%s?prefix=%s&timeout_ms=20000&layout=day&"
             "days=2&shards=3", th_cluster_addr(), th_prefix());
    conf_uri = conf_uri_buf;
}

void conf_setup_sentinel(void)
{
    snprintf(conf_uri_buf, sizeof conf_uri_buf,
             "redis-sentinel://%s?prefix=%s&timeout_ms=20000",
             th_sentinel_addr(), th_prefix());
    conf_uri = conf_uri_buf;
}

void conf_teardown(void)
{
    if (conf_dir)
        t_rmdir(conf_dir);
    th_shared_stop();
}

static idem_key K(const char *s)
{
    idem_key k = {s, strlen(s), NULL};
    return k;
}

static idem_key KF(const char *s, const uint8_t *fp)
{
    idem_key k = {s, strlen(s), fp};
    return k;
}

static idem_outcome claim(idem_store *s, idem_key k)
{
    idem_outcome o;
    int rc = idem_claim(s, &k, NULL, &o);
    cr_assert_eq(rc, 0, "claim: %s: %s", idem_strerror(rc),
                 idem_errdetail(s));
    return o;
}

static idem_outcome claim_opts(idem_store *s, idem_key k, int64_t lease,
                               int64_t ttl)
{
    idem_claim_opts co = {lease, ttl};
    idem_outcome o;
    int rc = idem_claim(s, &k, &co, &o);
    cr_assert_eq(rc, 0, "claim: %s", idem_errdetail(s));
    return o;
}

static void complete(idem_store *s, const char *key, uint64_t tok,
                     const char *resp)
{
    int rc = idem_complete(s, key, strlen(key), tok, resp, strlen(resp), 0);
    cr_assert_eq(rc, 0, "complete: %s: %s", idem_strerror(rc),
                 idem_errdetail(s));
}

static void assert_data(const idem_outcome *o, const char *want)
{
    cr_assert_eq(o->len, strlen(want));
    cr_assert(memcmp(o->data, want, o->len) == 0);
}

CONF_TEST(new_then_replay)
{
    idem_store *s = t_open(conf_uri);
    idem_outcome o = claim(s, K("order:1"));
    cr_assert_eq(o.kind, IDEM_NEW);
    cr_assert_geq(o.token, (uint64_t)t_clock_ms * 1000, "the clock in µs");
    cr_assert_eq(o.attempts, 1);
    cr_assert_eq(o.lease_until, t_clock_ms + 30000);
    uint64_t tok = o.token;
    complete(s, "order:1", o.token, "{\"charged\":true}");
    o = claim(s, K("order:1"));
    cr_assert_eq(o.kind, IDEM_REPLAY);
    cr_assert_eq(o.token, tok);
    cr_assert_eq(o.attempts, 1);
    assert_data(&o, "{\"charged\":true}");
    cr_assert_eq(idem_close(s), 0);
}

CONF_TEST(busy_while_leased)
{
    idem_store *s = t_open(conf_uri);
    idem_outcome o = claim_opts(s, K("k"), 5000, 0);
    cr_assert_eq(o.kind, IDEM_NEW);
    t_clock_ms += 4999;
    o = claim(s, K("k"));
    cr_assert_eq(o.kind, IDEM_BUSY);
    cr_assert_eq(o.lease_until, t_clock_ms + 1);
    cr_assert_null(o.data);
    idem_close(s);
}

CONF_TEST(takeover_after_lease_and_lost_lease)
{
    idem_store *s = t_open(conf_uri);
    idem_outcome a = claim_opts(s, K("k"), 1000, 0);
    t_clock_ms += 1000;
    idem_outcome b = claim(s, K("k"));
    cr_assert_eq(b.kind, IDEM_NEW);
    cr_assert_gt(b.token, a.token);
    cr_assert_eq(b.attempts, 2);
    /* The presumed-dead worker wakes up: its token no longer holds. */
    cr_assert_eq(idem_complete(s, "k", 1, a.token, "late", 4, 0), IDEM_ELOST);
    cr_assert_eq(idem_extend(s, "k", 1, a.token, 0), IDEM_ELOST);
    cr_assert_eq(idem_fail(s, "k", 1, a.token, "x", 1, 0), IDEM_ELOST);
    complete(s, "k", b.token, "ok");
    idem_outcome c = claim(s, K("k"));
    cr_assert_eq(c.kind, IDEM_REPLAY);
    cr_assert_eq(c.token, b.token);
    assert_data(&c, "ok");
    /* Finishing twice is a lost lease too. */
    cr_assert_eq(idem_complete(s, "k", 1, b.token, "again", 5, 0),
                 IDEM_ELOST);
    idem_close(s);
}

CONF_TEST(extend_keeps_lease)
{
    idem_store *s = t_open(conf_uri);
    idem_outcome a = claim_opts(s, K("k"), 1000, 0);
    t_clock_ms += 900;
    cr_assert_eq(idem_extend(s, "k", 1, a.token, 1000), 0);
    t_clock_ms += 900;
    idem_outcome b = claim(s, K("k"));
    cr_assert_eq(b.kind, IDEM_BUSY);
    cr_assert_eq(b.lease_until, t_clock_ms + 100);
    cr_assert_eq(idem_extend(s, "k", 1, a.token + 1, 1000), IDEM_ELOST);
    cr_assert_eq(idem_extend(s, "nokey", 5, 1, 1000), IDEM_ELOST);
    idem_close(s);
}

CONF_TEST(mismatch)
{
    uint8_t fa[IDEM_FP_LEN], fb[IDEM_FP_LEN];
    memset(fa, 0xaa, sizeof fa);
    memset(fb, 0xbb, sizeof fb);
    idem_store *s = t_open(conf_uri);
    idem_outcome a = claim(s, KF("pay:9", fa));
    cr_assert_eq(a.kind, IDEM_NEW);
    cr_assert_eq(claim(s, KF("pay:9", fb)).kind, IDEM_MISMATCH);
    cr_assert_eq(claim(s, KF("pay:9", fa)).kind, IDEM_BUSY);
    complete(s, "pay:9", a.token, "paid");
    cr_assert_eq(claim(s, KF("pay:9", fb)).kind, IDEM_MISMATCH);
    cr_assert_eq(claim(s, KF("pay:9", fa)).kind, IDEM_REPLAY);
    cr_assert_eq(claim(s, K("pay:9")).kind, IDEM_REPLAY);
    /* A record without a fingerprint matches any payload. */
    idem_outcome n = claim(s, K("pay:10"));
    complete(s, "pay:10", n.token, "x");
    cr_assert_eq(claim(s, KF("pay:10", fb)).kind, IDEM_REPLAY);
    idem_record r;
    cr_assert_eq(idem_get(s, "pay:9", 5, &r), 0);
    cr_assert(r.has_fp && memcmp(r.fp, fa, IDEM_FP_LEN) == 0);
    idem_close(s);
}

CONF_TEST(retryable_failure_releases)
{
    idem_store *s = t_open(conf_uri);
    idem_outcome a = claim(s, K("k"));
    cr_assert_eq(idem_fail(s, "k", 1, a.token, "timeout", 7, IDEM_RETRYABLE),
                 0);
    idem_record r;
    cr_assert_eq(idem_get(s, "k", 1, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_PENDING);
    cr_assert(r.released);
    /* Released: the old holder cannot complete any more. */
    cr_assert_eq(idem_complete(s, "k", 1, a.token, "x", 1, 0), IDEM_ELOST);
    idem_outcome b = claim(s, K("k"));
    cr_assert_eq(b.kind, IDEM_NEW);
    cr_assert_gt(b.token, a.token);
    cr_assert_eq(b.attempts, 2);
    complete(s, "k", b.token, "done");
    cr_assert_eq(claim(s, K("k")).kind, IDEM_REPLAY);
    idem_close(s);
}

CONF_TEST(permanent_failure_cached_for_failure_ttl)
{
    idem_opts o = t_options();
    o.failure_ttl_ms = 60000;
    idem_store *s;
    cr_assert_eq(idem_open(conf_uri, &o, &s), 0, "%s", idem_errdetail(s));
    idem_outcome a = claim(s, K("k"));
    cr_assert_eq(idem_fail(s, "k", 1, a.token, "card declined", 13, 0), 0);
    idem_outcome b = claim(s, K("k"));
    cr_assert_eq(b.kind, IDEM_FAILED);
    assert_data(&b, "card declined");
    t_clock_ms += 59999;
    cr_assert_eq(claim(s, K("k")).kind, IDEM_FAILED);
    t_clock_ms += 1;
    idem_outcome c = claim(s, K("k"));
    cr_assert_eq(c.kind, IDEM_NEW);
    cr_assert_gt(c.token, a.token);
    cr_assert_eq(c.attempts, 1, "a new record");
    idem_close(s);
}

CONF_TEST(ttl_expiry)
{
    idem_store *s = t_open(conf_uri);
    idem_outcome a = claim_opts(s, K("k"), 500, 1000);
    cr_assert_eq(idem_complete(s, "k", 1, a.token, "r", 1, 5000), 0);
    t_clock_ms += 4999;
    cr_assert_eq(claim(s, K("k")).kind, IDEM_REPLAY);
    t_clock_ms += 1;
    idem_record r;
    cr_assert_eq(idem_get(s, "k", 1, &r), IDEM_ENOTFOUND);
    idem_outcome b = claim(s, K("k"));
    cr_assert_eq(b.kind, IDEM_NEW);
    cr_assert_gt(b.token, a.token);
    cr_assert_eq(b.attempts, 1, "a new record");
    /* A PENDING record expires too: its TTL, not only its lease. */
    idem_outcome c = claim_opts(s, K("p"), 100, 1000);
    t_clock_ms += 1000;
    idem_outcome d = claim(s, K("p"));
    cr_assert_eq(d.kind, IDEM_NEW);
    cr_assert_gt(d.token, c.token);
    cr_assert_eq(d.attempts, 1);
    idem_close(s);
}

CONF_TEST(lease_outlives_a_shorter_ttl)
{
    /* A claim whose TTL is shorter than its lease: while the lease runs
     * the key has a holder, so nobody else may get NEW (as extend keeps
     * a record alive for the lease it grants). */
    idem_store *s = t_open(conf_uri);
    idem_outcome a = claim_opts(s, K("k"), 5000, 1000);
    cr_assert_eq(a.kind, IDEM_NEW);
    t_clock_ms += 2000;
    idem_outcome b = claim(s, K("k"));
    cr_assert_eq(b.kind, IDEM_BUSY, "a second holder in a live lease");
    cr_assert_eq(b.lease_until, a.lease_until);
    complete(s, "k", a.token, "once");
    cr_assert_eq(claim(s, K("k")).kind, IDEM_REPLAY);
    idem_close(s);
}

CONF_TEST(get_and_forget)
{
    idem_store *s = t_open(conf_uri);
    idem_record r;
    cr_assert_eq(idem_get(s, "k", 1, &r), IDEM_ENOTFOUND);
    cr_assert_eq(idem_forget(s, "k", 1), IDEM_ENOTFOUND);
    int64_t t0 = t_clock_ms;
    idem_outcome a = claim_opts(s, K("k"), 2000, 9000);
    cr_assert_eq(idem_get(s, "k", 1, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_PENDING);
    cr_assert_eq(r.token, a.token);
    cr_assert_eq(r.created_ms, t0);
    cr_assert_eq(r.expires_ms, t0 + 9000);
    cr_assert_eq(r.lease_until, t0 + 2000);
    cr_assert_eq(r.has_fp, 0);
    complete(s, "k", a.token, "resp");
    cr_assert_eq(idem_get(s, "k", 1, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    cr_assert_eq(r.len, 4);
    cr_assert(memcmp(r.data, "resp", 4) == 0);
    cr_assert_eq(idem_forget(s, "k", 1), 0);
    cr_assert_eq(idem_get(s, "k", 1, &r), IDEM_ENOTFOUND);
    t_clock_ms += 1;  /* see tokens_grow_across_forget_and_expiry */
    idem_outcome b = claim(s, K("k"));
    cr_assert_eq(b.kind, IDEM_NEW);
    cr_assert_gt(b.token, a.token);
    cr_assert_eq(b.attempts, 1);
    idem_close(s);
}

/* The batch forms answer exactly what the single calls answer. */
CONF_TEST(batch_equals_singles)
{
    enum { N = 64 };
    idem_store *s = t_open(conf_uri);
    char names[2][N][16];
    idem_key keys[2][N];
    /* Two key families in the same state; one is claimed one by one, the
     * other in one batch. */
    for (int f = 0; f < 2; f++) {
        for (int i = 0; i < N; i++) {
            snprintf(names[f][i], 16, "%c%d", 'a' + f, i);
            keys[f][i] = K(names[f][i]);
            if (i % 4 == 0)
                continue;  /* absent */
            idem_outcome o = claim(s, keys[f][i]);
            if (i % 4 == 1)
                complete(s, names[f][i], o.token, names[f][i]);
            if (i % 4 == 2)
                idem_fail(s, names[f][i], strlen(names[f][i]), o.token,
                          "e", 1, 0);
            /* i % 4 == 3: left PENDING -> BUSY */
        }
    }
    idem_outcome single[N], batch[N];
    for (int i = 0; i < N; i++)
        single[i] = claim(s, keys[0][i]);
    cr_assert_eq(idem_claim_many(s, keys[1], N, NULL, batch, 0), 0);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(batch[i].status, 0);
        cr_assert_eq(batch[i].kind, single[i].kind, "key %d", i);
        cr_assert_eq(batch[i].attempts, single[i].attempts);
        cr_assert_eq(batch[i].lease_until, single[i].lease_until);
        cr_assert_eq(batch[i].len, single[i].len);
        /* Tokens differ between the families where they are counted
         * store-wide (local:, mem:); each is the record's own. */
        idem_record r;
        cr_assert_eq(idem_get(s, names[1][i], strlen(names[1][i]), &r), 0);
        cr_assert_eq(batch[i].token, r.token, "key %d", i);
    }
    /* complete_many == complete, including a wrong token. */
    idem_completion items[N];
    int st[N];
    for (int i = 0; i < N; i += 4) {
        items[i / 4] = (idem_completion){names[1][i], strlen(names[1][i]),
                                         batch[i].token + (i == 8), "v", 1,
                                         0};
    }
    cr_assert_eq(idem_complete_many(s, items, N / 4, st, 0), 0);
    for (int i = 0; i < N / 4; i++) {
        int want = idem_complete(s, names[0][i * 4], strlen(names[0][i * 4]),
                                 single[i * 4].token + (i == 2), "v", 1, 0);
        cr_assert_eq(st[i], want, "item %d: %d vs %d", i, st[i], want);
    }
    cr_assert_eq(st[2], IDEM_ELOST);
    idem_close(s);
}

CONF_TEST(large_response)
{
    size_t n = 1u << 20;
    char *big = malloc(n);
    cr_assert(big);
    for (size_t i = 0; i < n; i++)
        big[i] = (char)(i * 7919 + (i >> 9));
    idem_store *s = t_open(conf_uri);
    idem_outcome a = claim(s, K("big"));
    cr_assert_eq(idem_complete(s, "big", 3, a.token, big, n, 0), 0);
    cr_assert_eq(idem_sync(s), 0);
    idem_outcome b = claim(s, K("big"));
    cr_assert_eq(b.kind, IDEM_REPLAY);
    cr_assert_eq(b.len, n);
    cr_assert(memcmp(b.data, big, n) == 0);
    cr_assert_eq(idem_complete(s, "x", 1, 1, big, IDEM_VALUE_MAX + 1u, 0),
                 IDEM_EVALSIZE);
    cr_assert(strstr(idem_errdetail(s), "limit"));
    idem_close(s);
    free(big);
}

CONF_TEST(key_sizes)
{
    static char maxkey[IDEM_KEY_MAX + 1];
    memset(maxkey, 'k', sizeof maxkey);
    const char bin[] = {'a', 0, '\n', (char)0xff, 0, 'z'};
    idem_store *s = t_open(conf_uri);
    idem_key k = {maxkey, IDEM_KEY_MAX, NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0);
    cr_assert_eq(o.kind, IDEM_NEW);
    k.keylen = IDEM_KEY_MAX + 1;
    cr_assert_eq(idem_claim(s, &k, NULL, &o), IDEM_EKEYSIZE);
    cr_assert(strstr(idem_errdetail(s), "1025 bytes"), "%s",
              idem_errdetail(s));
    k.keylen = 0;
    cr_assert_eq(idem_claim(s, &k, NULL, &o), IDEM_EKEYSIZE);
    cr_assert(strstr(idem_errdetail(s), "empty"));
    /* Binary keys: every byte counts, NULs included. */
    idem_key b1 = {bin, sizeof bin, NULL}, b2 = {bin, 1, NULL};
    idem_outcome x = claim(s, b1);
    cr_assert_eq(x.kind, IDEM_NEW);
    cr_assert_eq(claim(s, b2).kind, IDEM_NEW);
    cr_assert_eq(idem_complete(s, bin, sizeof bin, x.token, "B", 1, 0), 0);
    cr_assert_eq(claim(s, b1).kind, IDEM_REPLAY);
    /* In a batch, a bad key fails alone. */
    idem_key batch[3] = {K("ok1"), {maxkey, IDEM_KEY_MAX + 1, NULL},
                         K("ok2")};
    idem_outcome outs[3];
    cr_assert_eq(idem_claim_many(s, batch, 3, NULL, outs, 0), 0);
    cr_assert_eq(outs[0].status, 0);
    cr_assert_eq(outs[0].kind, IDEM_NEW);
    cr_assert_eq(outs[1].status, IDEM_EKEYSIZE);
    cr_assert_eq(outs[2].kind, IDEM_NEW);
    idem_close(s);
}

CONF_TEST(bad_arguments)
{
    idem_store *s = t_open(conf_uri);
    idem_claim_opts co = {-1, 0};
    idem_key k = K("k");
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, &co, &o), IDEM_EINVAL);
    cr_assert(strstr(idem_errdetail(s), "lease"));
    cr_assert_eq(idem_complete(s, "k", 1, 0, "", 0, 0), IDEM_EINVAL);
    cr_assert_eq(idem_fail(s, "k", 1, 1, "", 0, 0x80), IDEM_EINVAL);
    cr_assert_eq(idem_claim(NULL, &k, NULL, &o), IDEM_EINVAL);
    idem_close(s);
}

CONF_TEST(many_keys)
{
    enum { N = 20000 };
    idem_store *s = t_open(conf_uri);
    static idem_key keys[N];
    static char names[N][16];
    static idem_outcome outs[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "m%d", i);
        keys[i] = K(names[i]);
    }
    cr_assert_eq(idem_claim_many(s, keys, N, NULL, outs, 0), 0);
    for (int i = 0; i < N; i++)
        cr_assert_eq(outs[i].kind, IDEM_NEW);
    cr_assert_eq(idem_claim_many(s, keys, N, NULL, outs, 0), 0);
    for (int i = 0; i < N; i++)
        cr_assert_eq(outs[i].kind, IDEM_BUSY);
    idem_close(s);
}

CONF_TEST(claim_done_writes_done_at_once)
{
    idem_store *s = t_open(conf_uri);
    idem_key k[2] = {{"a", 1, NULL}, {"b", 1, NULL}};
    idem_outcome o[2];
    cr_assert_eq(idem_claim_many(s, k, 2, NULL, o, IDEM_CLAIM_DONE), 0);
    cr_assert_eq(o[0].kind, IDEM_NEW);
    idem_record r;
    cr_assert_eq(idem_get(s, "a", 1, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    cr_assert_eq(r.len, 0);
    cr_assert_eq(idem_claim_many(s, k, 2, NULL, o, IDEM_CLAIM_DONE), 0);
    cr_assert_eq(o[1].kind, IDEM_REPLAY);
    idem_close(s);
}

/* A key given twice in one batch: the second sees what the first did,
 * on every backend: BUSY after a plain claim, REPLAY after a claim that
 * writes DONE at once. */
CONF_TEST(same_key_twice_in_one_batch)
{
    idem_store *s = t_open(conf_uri);
    idem_key k[3] = {K("p"), K("q"), K("p")};
    idem_outcome o[3];
    cr_assert_eq(idem_claim_many(s, k, 3, NULL, o, 0), 0);
    cr_assert_eq(o[0].kind, IDEM_NEW);
    cr_assert_eq(o[1].kind, IDEM_NEW);
    cr_assert_eq(o[2].kind, IDEM_BUSY);
    cr_assert_eq(o[2].token, o[0].token);
    idem_key d[3] = {K("d"), K("e"), K("d")};
    cr_assert_eq(idem_claim_many(s, d, 3, NULL, o, IDEM_CLAIM_DONE), 0);
    cr_assert_eq(o[0].kind, IDEM_NEW);
    cr_assert_eq(o[0].attempts, 1);
    cr_assert_eq(o[1].kind, IDEM_NEW);
    cr_assert_eq(o[2].kind, IDEM_REPLAY, "the second sees the first's DONE");
    cr_assert_eq(o[2].token, o[0].token);
    cr_assert_eq(o[2].len, 0);
    idem_record r;
    cr_assert_eq(idem_get(s, "d", 1, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    cr_assert_eq(r.expires_ms, t_clock_ms + 24 * 3600 * 1000LL);
    idem_close(s);
}

/* Claim-done over a record whose lease ran out: a takeover written DONE
 * at once, with a greater token. */
CONF_TEST(claim_done_takes_over_an_expired_lease)
{
    idem_store *s = t_open(conf_uri);
    idem_outcome a = claim_opts(s, K("k"), 1000, 0);
    t_clock_ms += 1000;
    idem_key k = K("k");
    idem_claim_opts co = {0, 5000};
    idem_outcome o;
    cr_assert_eq(idem_claim_many(s, &k, 1, &co, &o, IDEM_CLAIM_DONE), 0);
    cr_assert_eq(o.kind, IDEM_NEW);
    cr_assert_gt(o.token, a.token);
    cr_assert_eq(o.attempts, 2);
    idem_record r;
    cr_assert_eq(idem_get(s, "k", 1, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    cr_assert_eq(r.token, o.token);
    cr_assert_eq(r.expires_ms, t_clock_ms + 5000);
    cr_assert_eq(idem_complete(s, "k", 1, a.token, "late", 4, 0), IDEM_ELOST);
    idem_close(s);
}

static void assert_ckpt(idem_store *s, const char *name, const char *want)
{
    const void *b;
    size_t n;
    int rc = idem_checkpoint_get(s, name, &b, &n);
    cr_assert_eq(rc, 0, "checkpoint_get: %s: %s", idem_strerror(rc),
                 idem_errdetail(s));
    cr_assert(n == strlen(want) && memcmp(b, want, n) == 0,
              "checkpoint '%.*s', not '%s'", (int)n, (const char *)b, want);
}

/* A checkpoint and the writes made before the next sync are one commit:
 * the handle reads back what it queued, the sync makes both visible. */
CONF_TEST(checkpoint_commits_with_its_writes)
{
    idem_store *s = t_open(conf_uri);
    const void *b;
    size_t n;
    cr_assert_eq(idem_checkpoint_get(s, "src", &b, &n), IDEM_ENOTFOUND);
    idem_key k[4] = {K("a"), K("b"), K("c"), K("f")};
    idem_outcome o[4];
    cr_assert_eq(idem_claim_many(s, k, 4, NULL, o, 0), 0);
    cr_assert_eq(idem_checkpoint_put(s, "src", "pos=1", 5), 0);
    assert_ckpt(s, "src", "pos=1");
    cr_assert_eq(idem_checkpoint_put(s, "src", "pos=2", 5), 0);
    assert_ckpt(s, "src", "pos=2");
    idem_completion c[3] = {{"a", 1, o[0].token, "A", 1, 0},
                            {"b", 1, o[1].token + 1, "B", 1, 0},
                            {"c", 1, o[2].token, "", 0, 0}};
    int st[3];
    cr_assert_eq(idem_complete_many(s, c, 3, st, IDEM_NOSYNC), 0);
    cr_assert_eq(st[0], 0);
    cr_assert_eq(st[1], IDEM_ELOST, "a wrong token is refused at once");
    cr_assert_eq(st[2], 0);
    cr_assert_eq(idem_fail(s, "f", 1, o[3].token, "E", 1, 0), 0);
    cr_assert_eq(idem_fail(s, "b", 1, o[1].token + 1, "E", 1, 0),
                 IDEM_ELOST);
    cr_assert_eq(idem_sync(s), 0, "%s", idem_errdetail(s));
    assert_ckpt(s, "src", "pos=2");
    cr_assert_eq(claim(s, K("a")).kind, IDEM_REPLAY);
    cr_assert_eq(claim(s, K("c")).kind, IDEM_REPLAY);
    cr_assert_eq(claim(s, K("f")).kind, IDEM_FAILED);
    cr_assert_eq(claim(s, K("b")).kind, IDEM_BUSY);
    if (strcmp(conf_uri, "mem:") != 0) {
        cr_assert_eq(idem_close(s), 0);
        s = t_open(conf_uri);
        assert_ckpt(s, "src", "pos=2");
        idem_outcome r = claim(s, K("a"));
        cr_assert_eq(r.kind, IDEM_REPLAY);
        assert_data(&r, "A");
    }
    idem_close(s);
}

/* Child of checkpoint_dies_with_an_unsynced_batch: commits "old" with
 * k1 done, then puts "new" and completes k2, says so, and waits to be
 * killed before any sync. Exit codes say which step failed. */
static void ckpt_child(int ready)
{
    idem_store *s;
    idem_opts o = t_options();
    if (idem_open(conf_uri, &o, &s))
        _exit(10);
    idem_key k[2] = {K("k1"), K("k2")};
    idem_outcome out[2];
    if (idem_claim_many(s, k, 2, NULL, out, 0) || out[0].kind != IDEM_NEW)
        _exit(11);
    if (idem_checkpoint_put(s, "src", "old", 3) ||
        idem_complete(s, "k1", 2, out[0].token, "1", 1, 0) || idem_sync(s))
        _exit(12);
    if (idem_checkpoint_put(s, "src", "new", 3) ||
        idem_complete(s, "k2", 2, out[1].token, "2", 1, 0))
        _exit(13);
    if (write(ready, "x", 1) != 1)
        _exit(14);
    for (;;)
        pause();
}

/* kill -9 between a checkpoint's put and its sync: neither it nor the
 * writes made with it are there, the one before is. */
CONF_TEST(checkpoint_dies_with_an_unsynced_batch)
{
    if (strcmp(conf_uri, "mem:") == 0)
        return;  /* nothing outlives the process */
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(p[0]);
        ckpt_child(p[1]);
    }
    close(p[1]);
    char c;
    ssize_t got = read(p[0], &c, 1);
    kill(pid, SIGKILL);
    int wst;
    waitpid(pid, &wst, 0);
    cr_assert_eq(got, 1, "the child failed (status %d)",
                 WIFEXITED(wst) ? WEXITSTATUS(wst) : -1);
    close(p[0]);
    idem_store *s = t_open(conf_uri);
    assert_ckpt(s, "src", "old");
    idem_record r;
    cr_assert_eq(idem_get(s, "k1", 2, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    cr_assert_eq(idem_get(s, "k2", 2, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_PENDING,
                 "k2 was completed with 'new' only");
    idem_close(s);
}

/* The internal batch lease renewal: per key 0 or IDEM_ELOST, and the
 * renewed leases hold. */
CONF_TEST(extend_many_renews_each_lease)
{
    idem_store *s = t_open(conf_uri);
    idem_key k[3] = {K("a"), K("b"), K("c")};
    idem_outcome o[3];
    idem_claim_opts co = {1000, 0};
    cr_assert_eq(idem_claim_many(s, k, 3, &co, o, 0), 0);
    t_clock_ms += 900;
    idem_completion it[4] = {{"a", 1, o[0].token, NULL, 0, 0},
                             {"b", 1, o[1].token + 1, NULL, 0, 0},
                             {"none", 4, 1, NULL, 0, 0},
                             {"", 0, 1, NULL, 0, 0}};
    int st[4];
    cr_assert_eq(idem__extend_many(s, it, 4, 1000, st), 0, "%s",
                 idem_errdetail(s));
    cr_assert_eq(st[0], 0);
    cr_assert_eq(st[1], IDEM_ELOST);
    cr_assert_eq(st[2], IDEM_ELOST);
    cr_assert_eq(st[3], IDEM_EKEYSIZE);
    t_clock_ms += 900;
    idem_outcome a = claim(s, K("a"));
    cr_assert_eq(a.kind, IDEM_BUSY);
    cr_assert_eq(a.lease_until, t_clock_ms + 100);
    cr_assert_eq(claim(s, K("b")).kind, IDEM_NEW, "b's lease ran out");
    cr_assert_eq(idem__extend_many(s, it, 0, 0, st), 0);
    idem_close(s);
}

typedef struct seen {
    int n, a_done;
} seen;

static int count_rec(void *ctx, const void *key, size_t len,
                     const idem_record *r)
{
    seen *sn = ctx;
    sn->n++;
    if (len == 1 && !memcmp(key, "a", 1))
        sn->a_done = r->state == IDEM_STATE_DONE && r->len == 2 &&
                     !memcmp(r->data, "ok", 2);
    return 0;
}

static int stop_at_first(void *ctx, const void *key, size_t len,
                         const idem_record *r)
{
    (void)ctx, (void)key, (void)len, (void)r;
    return 7;
}

CONF_TEST(scan_visits_every_live_record_once)
{
    idem_store *s = t_open(conf_uri);
    idem_outcome o;
    for (int i = 0; i < 100; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i % 1000);
        cr_assert_eq(idem_claim(s, &(idem_key){k, strlen(k), NULL}, NULL,
                                &o), 0);
    }
    cr_assert_eq(idem_claim(s, &(idem_key){"a", 1, NULL}, NULL, &o), 0);
    cr_assert_eq(idem_complete(s, "a", 1, o.token, "ok", 2, 0), 0);
    cr_assert_eq(idem_forget(s, "k5", 2), 0);
    cr_assert_eq(idem_claim(s, &(idem_key){"short", 5, NULL},
                            &(idem_claim_opts){5, 10}, &o), 0);
    t_clock_ms += 20;
    seen sn = {0};
    cr_assert_eq(idem_scan(s, count_rec, &sn), 0, "%s", idem_errdetail(s));
    cr_assert_eq(sn.n, 100, "99 k's and a; k5 forgotten, short expired");
    cr_assert(sn.a_done);
    cr_assert_eq(idem_scan(s, stop_at_first, NULL), 7);
    idem_close(s);
}

/* What a restore from `idem dump` needs: the record exactly, tokens and
 * clocks included, and the protocol going on from it. */
CONF_TEST(import_restores_a_record_exactly)
{
    idem_store *s = t_open(conf_uri);
    idem_record in = {.state = IDEM_STATE_FAILED, .token = 4,
                      .created_ms = t_clock_ms - 1000,
                      .expires_ms = t_clock_ms + 5000, .has_fp = 1,
                      .data = "boom", .len = 4};
    memset(in.fp, 0xab, IDEM_FP_LEN);
    cr_assert_eq(idem_import(s, "k", 1, &in), 0, "%s", idem_errdetail(s));
    idem_record r;
    cr_assert_eq(idem_get(s, "k", 1, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_FAILED);
    cr_assert_eq(r.token, 4);
    cr_assert_eq(r.created_ms, in.created_ms);
    cr_assert_eq(r.expires_ms, in.expires_ms);
    cr_assert(r.has_fp && r.fp[3] == 0xab);
    cr_assert(r.len == 4 && !memcmp(r.data, "boom", 4));
    /* Replacing a live record: a PENDING one, its lease running. */
    cr_assert_eq(r.attempts, 1, "attempts 0 is taken as 1");
    in = (idem_record){.state = IDEM_STATE_PENDING, .token = 6, .attempts = 2,
                       .created_ms = t_clock_ms,
                       .expires_ms = t_clock_ms + 60000,
                       .lease_until = t_clock_ms + 1000};
    cr_assert_eq(idem_import(s, "k", 1, &in), 0, "%s", idem_errdetail(s));
    idem_outcome o = claim(s, K("k"));
    cr_assert_eq(o.kind, IDEM_BUSY);
    cr_assert_eq(o.token, 6);
    cr_assert_eq(o.attempts, 2);
    t_clock_ms += 1000;
    o = claim(s, K("k"));
    cr_assert_eq(o.kind, IDEM_NEW);
    cr_assert_gt(o.token, 6);
    cr_assert_eq(o.attempts, 3);
    in.expires_ms = t_clock_ms - 1;
    cr_assert_eq(idem_import(s, "old", 3, &in), 0);
    cr_assert_eq(idem_get(s, "old", 3, &r), IDEM_ENOTFOUND);
    in.token = 0;
    cr_assert_eq(idem_import(s, "bad", 3, &in), IDEM_EINVAL);
    in.token = IDEM_TOKEN_MAX + 1;
    cr_assert_eq(idem_import(s, "bad", 3, &in), IDEM_EINVAL);
    idem_close(s);
}

/* A lease as long as the TTL: when the lease runs out the record has
 * expired with it. The takeover must still get a greater token, or the
 * worker presumed dead would complete the new holder's claim with its
 * old one, and the new holder would get IDEM_ELOST. */
CONF_TEST(takeover_of_an_expired_claim_gets_a_greater_token)
{
    idem_store *s = t_open(conf_uri);
    idem_outcome a = claim_opts(s, K("k"), 1000, 1000);
    cr_assert_eq(a.kind, IDEM_NEW);
    t_clock_ms += 1000;
    idem_outcome b = claim_opts(s, K("k"), 1000, 1000);
    cr_assert_eq(b.kind, IDEM_NEW);
    cr_assert_gt(b.token, a.token, "%llu after %llu",
                 (unsigned long long)b.token, (unsigned long long)a.token);
    cr_assert_eq(idem_complete(s, "k", 1, a.token, "late", 4, 0),
                 IDEM_ELOST, "the stale worker's complete");
    complete(s, "k", b.token, "ok");
    idem_outcome c = claim(s, K("k"));
    cr_assert_eq(c.kind, IDEM_REPLAY);
    cr_assert_eq(c.token, b.token);
    assert_data(&c, "ok");
    idem_close(s);
}

/* Claim k, whose record is gone: its token must be above `before`, the
 * greatest earlier one, which no longer holds the key. */
static uint64_t reclaim_above(idem_store *s, uint64_t before)
{
    idem_outcome o = claim_opts(s, K("k"), 1000, 5000);
    cr_assert_eq(o.kind, IDEM_NEW);
    cr_assert_gt(o.token, before, "%llu after %llu",
                 (unsigned long long)o.token, (unsigned long long)before);
    cr_assert_eq(o.attempts, 1, "a new record");
    cr_assert_eq(idem_complete(s, "k", 1, before, "x", 1, 0), IDEM_ELOST);
    return o.token;
}

/* A key's tokens only grow, whatever became of its record in between:
 * forgotten, expired DONE, expired FAILED, expired PENDING. */
CONF_TEST(tokens_grow_across_forget_and_expiry)
{
    idem_store *s = t_open(conf_uri);
    idem_outcome o = claim_opts(s, K("k"), 1000, 5000);
    uint64_t before = o.token;
    complete(s, "k", before, "one");
    cr_assert_eq(idem_forget(s, "k", 1), 0);
    /* A store that keeps nothing of a forgotten record (Redis) takes the
     * next token from its clock, which has moved on since. */
    t_clock_ms += 1;
    before = reclaim_above(s, before);
    cr_assert_eq(idem_complete(s, "k", 1, before, "two", 3, 2000), 0);
    t_clock_ms += 2000;
    before = reclaim_above(s, before);
    cr_assert_eq(idem_fail(s, "k", 1, before, "no", 2, 0), 0);
    t_clock_ms += 3600 * 1000;  /* the default failure TTL */
    before = reclaim_above(s, before);
    t_clock_ms += 5000;         /* the PENDING record's TTL */
    before = reclaim_above(s, before);
    complete(s, "k", before, "last");
    idem_close(s);
}

/* A claimed record lives at least as long as its lease: idem_extend()
 * keeps a record with a short TTL alive past that TTL, and so do a claim
 * and a takeover with a lease longer than their TTL. */
CONF_TEST(a_claimed_record_lives_as_long_as_its_lease)
{
    idem_store *s = t_open(conf_uri);
    idem_record r;
    idem_outcome a = claim_opts(s, K("k"), 500, 1000);
    t_clock_ms += 400;
    cr_assert_eq(idem_extend(s, "k", 1, a.token, 5000), 0);
    cr_assert_eq(idem_get(s, "k", 1, &r), 0);
    cr_assert_eq(r.lease_until, t_clock_ms + 5000);
    cr_assert_geq(r.expires_ms, r.lease_until);
    t_clock_ms += 4000;  /* past the TTL and the first lease */
    idem_outcome b = claim(s, K("k"));
    cr_assert_eq(b.kind, IDEM_BUSY, "the extended record is alive");
    cr_assert_eq(b.lease_until, r.lease_until);
    complete(s, "k", a.token, "once");
    cr_assert_eq(claim(s, K("k")).kind, IDEM_REPLAY);
    idem_outcome p = claim_opts(s, K("p"), 500, 1000);
    cr_assert_eq(idem_get(s, "p", 1, &r), 0);
    cr_assert_geq(r.expires_ms, r.lease_until);
    t_clock_ms += 500;
    idem_outcome q = claim_opts(s, K("p"), 5000, 1000);
    cr_assert_eq(q.kind, IDEM_NEW);
    cr_assert_gt(q.token, p.token);
    cr_assert_eq(idem_get(s, "p", 1, &r), 0);
    cr_assert_eq(r.lease_until, t_clock_ms + 5000);
    cr_assert_geq(r.expires_ms, r.lease_until, "the takeover's record");
    t_clock_ms += 4000;
    cr_assert_eq(claim(s, K("p")).kind, IDEM_BUSY);
    idem_close(s);
}

/* Tokens are 64 bits wide on every backend: one above 2^32 is kept
 * exactly, through a reopen where the store keeps its data. */
CONF_TEST(a_token_above_32_bits_survives_a_reopen)
{
    const uint64_t big = ((uint64_t)1 << 32) + 5;
    int keeps = strcmp(conf_uri, "mem:") != 0;
    idem_store *s = t_open(conf_uri);
    idem_record in = {.state = IDEM_STATE_PENDING, .token = big, .attempts = 3,
                      .created_ms = t_clock_ms,
                      .expires_ms = t_clock_ms + 60000,
                      .lease_until = t_clock_ms + 10000};
    cr_assert_eq(idem_import(s, "k", 1, &in), 0, "%s", idem_errdetail(s));
    idem_outcome n = claim(s, K("n"));
    cr_assert_gt(n.token, (uint64_t)UINT32_MAX);
    cr_assert_eq(idem_sync(s), 0);
    if (keeps) {
        cr_assert_eq(idem_close(s), 0);
        s = t_open(conf_uri);
    }
    idem_record r;
    cr_assert_eq(idem_get(s, "k", 1, &r), 0, "%s", idem_errdetail(s));
    cr_assert_eq(r.token, big);
    cr_assert_eq(r.attempts, 3);
    cr_assert_eq(idem_extend(s, "k", 1, (uint32_t)big, 1000), IDEM_ELOST,
                 "the token cut to 32 bits does not hold the key");
    complete(s, "k", big, "ok");
    complete(s, "n", n.token, "ok");
    if (keeps) {
        cr_assert_eq(idem_close(s), 0);
        s = t_open(conf_uri);
    }
    idem_outcome o = claim(s, K("k"));
    cr_assert_eq(o.kind, IDEM_REPLAY);
    cr_assert_eq(o.token, big);
    cr_assert_eq(claim(s, K("n")).token, n.token);
    idem_close(s);
}
