/* tests/test_metrics.c - the counters a handle keeps, and their text.
 *
 * Each counter is checked against what the test did to the store, on the
 * embedded engine and on a real Redis server (and cluster, whose INFO is
 * read per master); the text goes through promtool, the checker a
 * Prometheus operator uses, when it is installed. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "redis_harness.h"

TestSuite(metrics, .timeout = 120);

static idem_key key(const char *k)
{
    return (idem_key){k, strlen(k), NULL};
}

static idem_metrics snap(idem_store *s)
{
    idem_metrics m;
    idem_metrics_init(&m);
    cr_assert_eq(idem_metrics_get(s, &m), 0);
    return m;
}

/* n keys "kI" for I in 0..n-1 modulo `distinct`, claimed DONE at once
 * in one batch. */
static void claim_done(idem_store *s, size_t n, size_t distinct)
{
    idem_key *k = calloc(n, sizeof *k);
    idem_outcome *o = calloc(n, sizeof *o);
    char (*names)[24] = calloc(n, sizeof *names);
    cr_assert(k && o && names);
    for (size_t i = 0; i < n; i++) {
        snprintf(names[i], sizeof names[i], "k%zu", i % distinct);
        k[i] = key(names[i]);
    }
    cr_assert_eq(idem_claim_many(s, k, n, NULL, o, IDEM_CLAIM_DONE), 0,
                 "%s", idem_errdetail(s));
    free(k);
    free(o);
    free(names);
}

/* The protocol's counters, on any store. */
static void protocol_counters(idem_store *s)
{
    claim_done(s, 100, 70);  /* 70 new, 30 replays */
    idem_metrics m = snap(s);
    cr_assert_eq(m.claims[IDEM_NEW - 1], 70);
    cr_assert_eq(m.claims[IDEM_REPLAY - 1], 30);
    cr_assert_eq(m.completions, 70);
    cr_assert_eq(m.claim_batch_duration.count, 1);
    cr_assert_geq(m.sync_duration.count, 1);

    idem_outcome o;
    idem_key a = key("a"), b = key("b"), empty = {"", 0, NULL};
    cr_assert_eq(idem_claim(s, &a, NULL, &o), 0);
    uint64_t ta = o.token;
    cr_assert_eq(idem_claim(s, &a, NULL, &o), 0);  /* busy */
    cr_assert_eq(idem_fail(s, "a", 1, ta, "x", 1, IDEM_RETRYABLE), 0);
    cr_assert_eq(idem_claim(s, &a, NULL, &o), 0);
    cr_assert_eq(idem_complete(s, "a", 1, ta, "r", 1, 0), IDEM_ELOST);
    cr_assert_eq(idem_fail(s, "a", 1, o.token, "x", 1, 0), 0);
    cr_assert_eq(idem_claim(s, &b, NULL, &o), 0);
    cr_assert_eq(idem_complete(s, "b", 1, o.token, "r", 1, 0), 0);
    idem_outcome two[2];
    idem_key ks[2] = {empty, b};
    cr_assert_eq(idem_claim_many(s, ks, 2, NULL, two, IDEM_NOSYNC), 0);
    cr_assert_eq(idem_sync(s), 0);

    m = snap(s);
    cr_assert_eq(m.claims[IDEM_NEW - 1], 73);
    cr_assert_eq(m.claims[IDEM_REPLAY - 1], 31);
    cr_assert_eq(m.claims[IDEM_BUSY - 1], 1);
    cr_assert_eq(m.completions, 71);
    cr_assert_eq(m.failures_retryable, 1);
    cr_assert_eq(m.failures_permanent, 1);
    cr_assert_eq(m.lost, 1);
    cr_assert_eq(m.errors[-IDEM_ELOST], 1);
    cr_assert_eq(m.errors[-IDEM_EKEYSIZE], 1);
    cr_assert_eq(m.claim_batch_duration.count, 2, "single claims untimed");
    cr_assert_eq(m.claim_batch_duration.le[IDEM_METRICS_BUCKETS - 1] <=
                     m.claim_batch_duration.count, 1);
}

Test(metrics, protocol_counters_mem)
{
    idem_store *s = t_open("mem:");
    protocol_counters(s);
    idem_close(s);
}

Test(metrics, gauges_and_takeover_local)
{
    char *dir = t_tmpdir();
    idem_store *s = t_open(t_local_uri(dir));
    idem_metrics m = snap(s);
    cr_assert_eq(m.live_keys, 0);
    cr_assert_eq(m.segments, 1);
    claim_done(s, 50, 50);
    m = snap(s);
    cr_assert_eq(m.live_keys, 50);
    cr_assert_gt(m.store_bytes, 0);
    idem_close(s);
    t_rmdir(dir);
}

static void claim_as(idem_store *s, const char *k, int flags,
                     idem_outcome_kind kind)
{
    idem_claim_opts co = {.lease_ms = 1000, .ttl_ms = 60000};
    idem_key kk = key(k);
    idem_outcome o;
    cr_assert_eq(idem_claim_many(s, &kk, 1, &co, &o, flags), 0, "%s",
                 idem_errdetail(s));
    cr_assert_eq(o.status, 0, "%s: %s", k, idem_errdetail(s));
    cr_assert_eq(o.kind, kind, "%s: kind %d", k, o.kind);
}

/* A takeover is a NEW over a PENDING record, not given up, whose lease
 * ran out (a claim-done's included); a claim of a fresh, released or
 * expired key is none. */
static void takeovers(const char *uri)
{
    idem_store *s = t_open(uri);
    claim_as(s, "held", 0, IDEM_NEW);
    claim_as(s, "held", 0, IDEM_BUSY);
    claim_as(s, "held-done", 0, IDEM_NEW);
    cr_assert_eq(snap(s).takeovers, 0);
    t_clock_ms += 5000;  /* the leases ran out */
    claim_as(s, "held", 0, IDEM_NEW);
    cr_assert_eq(snap(s).takeovers, 1, "%s", uri);
    claim_as(s, "held-done", IDEM_CLAIM_DONE, IDEM_NEW);
    cr_assert_eq(snap(s).takeovers, 2, "%s: claim-done", uri);
    t_clock_ms += 5000;
    idem_key k = key("held");
    idem_claim_opts co = {.lease_ms = 1000, .ttl_ms = 60000};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, &co, &o), 0);
    cr_assert_eq(o.kind, IDEM_NEW);
    cr_assert_eq(snap(s).takeovers, 3, "%s", uri);
    cr_assert_eq(idem_fail(s, "held", 4, o.token, "x", 1, IDEM_RETRYABLE), 0,
                 "%s", idem_errdetail(s));
    claim_as(s, "held", 0, IDEM_NEW);  /* released: given up, not taken */
    cr_assert_eq(snap(s).takeovers, 3, "%s: a released key", uri);
    t_clock_ms += 120000;  /* "held" expired whole, still PENDING */
    claim_as(s, "held", 0, IDEM_NEW);
    claim_as(s, "fresh", 0, IDEM_NEW);
    cr_assert_eq(snap(s).takeovers, 3, "%s: an expired record", uri);
    idem_close(s);
}

Test(metrics, takeovers_local)
{
    char *dir = t_tmpdir();
    takeovers(t_local_uri(dir));
    t_rmdir(dir);
    takeovers("mem:");
}

static void redis_takeovers(const char *scheme, const char *addr)
{
    static const char *const layouts[] = {"", "&layout=day&days=2"};
    for (size_t i = 0; i < 2; i++) {
        char uri[512];
        snprintf(uri, sizeof uri, "%s://%s?prefix=%st%zu%s", scheme, addr,
                 th_prefix(), i, layouts[i]);
        takeovers(uri);
    }
}

Test(metrics, takeovers_redis)
{
    redis_takeovers("redis", th_redis_addr());
}

Test(metrics, takeovers_redis_cluster)
{
    redis_takeovers("redis-cluster", th_cluster_addr());
}

static int answer_all(void *ctx, idem_task *t, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        t[i].answer = i % 2 ? IDEM_TASK_FAIL : IDEM_TASK_DONE;
    return 0;
}

Test(metrics, runner_messages)
{
    idem_store *s = t_open("mem:");
    idem_runner_opts ro;
    idem_runner_opts_init(&ro);
    ro.handler = answer_all;
    idem_runner *r;
    cr_assert_eq(idem_runner_new(s, &ro, &r), 0);
    const char *keys[] = {"a", "b", "a", "c", "d"};
    idem_msg msgs[5];
    for (size_t i = 0; i < 5; i++)
        msgs[i] = (idem_msg){.key = keys[i], .keylen = 1, .msg = "m",
                             .msglen = 1};
    cr_assert_eq(idem_runner_batch(r, msgs, 5, NULL), 0);
    cr_assert_eq(idem_runner_batch(r, msgs, 2, NULL), 0);  /* replays */
    idem_metrics m = snap(s);
    cr_assert_eq(m.messages[IDEM_MR_DONE], 2);
    cr_assert_eq(m.messages[IDEM_MR_FAILED], 2);
    cr_assert_eq(m.messages[IDEM_MR_DUPLICATE], 1);
    cr_assert_eq(m.messages[IDEM_MR_REPLAY], 2);
    cr_assert_eq(m.messages[IDEM_MR_DEAD_LETTER], 0);
    cr_assert_eq(m.handler_duration.count, 1);
    idem_runner_free(r);
    idem_close(s);
}

/* A monitoring thread reads while the owner writes: every read is whole
 * and no counter goes back. The writes wait for the first read (on a
 * loaded machine the thread could start after they ended). */
typedef struct reader {
    idem_store *s;
    atomic_int stop, reads;
    int went_back;
} reader;

static void *read_loop(void *arg)
{
    reader *rd = arg;
    uint64_t last = 0;
    while (!atomic_load(&rd->stop)) {
        idem_metrics m;
        idem_metrics_init(&m);
        idem_metrics_get(rd->s, &m);
        rd->went_back += m.claims[0] < last;
        last = m.claims[0];
        atomic_fetch_add(&rd->reads, 1);
    }
    return NULL;
}

Test(metrics, read_from_another_thread)
{
    reader rd = {.s = t_open("mem:")};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, read_loop, &rd), 0);
    while (!atomic_load(&rd.reads))
        t_sleep_ms(1);
    for (int i = 0; i < 200; i++)
        claim_done(rd.s, 100, 100 + (size_t)i * 100);
    atomic_store(&rd.stop, 1);
    pthread_join(t, NULL);
    cr_assert_eq(rd.went_back, 0);
    cr_assert_gt(atomic_load(&rd.reads), 0);
    idem_metrics m = snap(rd.s);
    cr_assert_eq(m.claims[IDEM_NEW - 1], 100);
    cr_assert_eq(m.claims[IDEM_REPLAY - 1], 199 * 100);
    idem_close(rd.s);
}

Test(metrics, format_is_snprintf_and_hides_passwords)
{
    idem_metrics m;
    idem_metrics_init(&m);
    m.claims[0] = 7;
    const char *uri = "redis://u:s3cret@127.0.0.1:1/0?prefix=x";
    size_t n = idem_metrics_format(&m, "j\"o\\b\n", uri, NULL, 0);
    cr_assert_gt(n, 100);
    char *full = malloc(n + 1);
    cr_assert(full);
    cr_assert_eq(idem_metrics_format(&m, "j\"o\\b\n", uri, full, n + 1), n);
    cr_assert_eq(strlen(full), n);
    cr_assert_null(strstr(full, "s3cret"));
    cr_assert(strstr(full, "job=\"j\\\"o\\\\b\\n\",store=\"redis://u:***@"),
              "%.300s", full);
    cr_assert(strstr(full, "outcome=\"new\"} 7\n"));
    cr_assert(strstr(full, "idem_build_info{"));
    char cut[40];
    cr_assert_eq(idem_metrics_format(&m, "j\"o\\b\n", uri, cut, sizeof cut),
                 n);
    cr_assert_eq(strlen(cut), sizeof cut - 1);
    cr_assert(!strncmp(cut, full, sizeof cut - 1));
    cr_assert_null(strstr(full, "idem_source_lag_messages"), "unknown lag");
    cr_assert_null(strstr(full, "idem_redis_"), "no servers given");
    free(full);
    idem_metrics bad = {0};
    idem_store *s = t_open("mem:");
    cr_assert_eq(idem_metrics_get(s, &bad), IDEM_EINVAL, "not initialised");
    cr_assert_eq(idem_metrics_get(NULL, &m), IDEM_EINVAL);
    size_t nodes = 9;
    cr_assert_eq(idem_server_metrics_get(s, NULL, 0, &nodes), 0);
    cr_assert_eq(nodes, 0, "mem: has no servers");
    idem_close(s);
}

/* promtool check metrics on a rendering, when promtool is installed. */
static void promtool_check(const char *text)
{
    if (t_sh("command -v promtool >/dev/null")) {
        cr_log_warn("promtool is not installed: the text is not checked");
        return;
    }
    char *dir = t_tmpdir();
    t_write(t_path(dir, "m.prom"), text, strlen(text));
    int rc = t_sh("promtool check metrics < '%s/m.prom' > '%s/out' 2>&1",
                  dir, dir);
    cr_assert_eq(rc, 0, "promtool: %s", t_read(t_path(dir, "out"), NULL));
    t_rmdir(dir);
}

/* Label values in UTF-8 whatever the bytes of a job or a store's path:
 * one stray byte made the scrape unreadable to Prometheus. */
Test(metrics, label_values_are_utf8)
{
    idem_metrics m;
    idem_metrics_init(&m);
    /* stray, overlong, surrogate, cut short; a euro sign stays */
    const char *job = "j\xff\xc0\xaf\xed\xa0\x80\xe2\x82";
    const char *uri = "local:/tmp/\xe2\x82\xac\"\\\x80";
    char text[16384];
    size_t n = idem_metrics_format(&m, job, uri, text, sizeof text);
    cr_assert_lt(n, sizeof text);
    cr_assert(strstr(text, "{job=\"j\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
                           "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
                           "\xEF\xBF\xBD\",store=\"local:/tmp/\xe2\x82\xac"
                           "\\\"\\\\\xEF\xBF\xBD\"}"),
              "%.200s", text);
    promtool_check(text);
}

static char *render(idem_store *s, const char *uri)
{
    idem_metrics m = snap(s);
    idem_server_metrics sv[8];
    cr_assert_eq(idem_server_metrics_get(s, sv, 8, &m.nservers), 0, "%s",
                 idem_errdetail(s));
    m.servers = sv;
    m.source_lag = 3;
    size_t n = idem_metrics_format(&m, "job", uri, NULL, 0);
    char *text = malloc(n + 1);
    cr_assert(text);
    idem_metrics_format(&m, "job", uri, text, n + 1);
    return text;
}

Test(metrics, promtool_accepts_the_text)
{
    idem_store *s = t_open("mem:");
    protocol_counters(s);
    char *text = render(s, "mem:");
    cr_assert(strstr(text, "idem_source_lag_messages{job=\"job\","
                           "store=\"mem:\"} 3\n"));
    promtool_check(text);
    free(text);
    idem_close(s);
}

static void redis_store(const char *uri, size_t masters)
{
    idem_store *s;
    cr_assert_eq(idem_open(uri, NULL, &s), 0, "%s", idem_errdetail(s));
    protocol_counters(s);
    idem_server_metrics sv[8];
    size_t n = 0;
    cr_assert_eq(idem_server_metrics_get(s, sv, 8, &n), 0, "%s",
                 idem_errdetail(s));
    cr_assert_eq(n, masters);
    for (size_t i = 0; i < n; i++) {
        cr_assert_gt(sv[i].used_memory_bytes, 0);
        cr_assert_geq(sv[i].evicted_keys, 0);
        cr_assert_geq(sv[i].keyspace_hits + sv[i].keyspace_misses, 1);
        cr_assert(strchr(sv[i].node, ':'));
    }
    char *text = render(s, uri);
    cr_assert(strstr(text, "idem_redis_used_memory_bytes{"));
    cr_assert(strstr(text, "idem_claims_total{job=\"job\""));
    promtool_check(text);
    free(text);
    idem_close(s);
}

Test(metrics, redis_counters_and_info)
{
    char uri[512];
    snprintf(uri, sizeof uri, "redis://%s?prefix=%s", th_redis_addr(),
             th_prefix());
    redis_store(uri, 1);
}

Test(metrics, redis_cluster_info_per_master)
{
    char uri[512];
    snprintf(uri, sizeof uri, "redis-cluster://%s?prefix=%s",
             th_cluster_addr(), th_prefix());
    redis_store(uri, 3);
}
