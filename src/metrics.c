/* metrics.c - counting what a handle does, and saying it to Prometheus.
 *
 * An operator running idem for days watches it the way they watch
 * everything else: through a Prometheus scrape. The counting happens at
 * the store's front door (store.c) and in the runner, where every call
 * and every committed message pass once; this file holds the counters'
 * arithmetic and the one renderer of the text format, so that the CLI's
 * endpoint, `idem stats --format prometheus` and a C program with an
 * endpoint of its own all print the same families the same way.
 *
 * The renderer writes snprintf-style into the caller's buffer and
 * allocates nothing: a scrape that fails for memory would be the one
 * that mattered. Label values are escaped as the format asks (\\, \",
 * \n), and the store label goes through idem_uri_display() here, so a
 * caller cannot leak a password by passing its URI as it is. */
#include "store.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define IDEM__METRICS_VERSION 1u

static const double idem__bounds[IDEM_METRICS_BUCKETS] = IDEM_METRICS_BOUNDS;

void idem__metrics_reset(idem__metrics *m)
{
    memset(m, 0, sizeof *m);
    idem__gauge_set(&m->live_keys, -1);
    idem__gauge_set(&m->store_bytes, -1);
    idem__gauge_set(&m->segments, -1);
}

void idem__hist_observe(idem__hist *h, uint64_t ns)
{
    double s = (double)ns / 1e9;
    size_t i = 0;
    while (i < IDEM_METRICS_BUCKETS && s > idem__bounds[i])
        i++;
    idem__ctr_add(&h->bucket[i], 1);
    idem__ctr_add(&h->sum_ns, ns);
}

int idem__metrics_error(idem__metrics *m, int rc)
{
    if (rc < 0 && -rc < IDEM_METRICS_CODES)
        idem__ctr_add(&m->errors[-rc], 1);
    if (rc == IDEM_ELOST)
        idem__ctr_add(&m->lost, 1);
    return rc;
}

void idem__metrics_claims(idem__metrics *m, const idem_outcome *outs,
                          size_t n)
{
    uint64_t by[5] = {0};
    for (size_t i = 0; i < n; i++) {
        if (outs[i].status)
            idem__metrics_error(m, outs[i].status);
        else if (outs[i].kind >= IDEM_NEW && outs[i].kind <= IDEM_MISMATCH)
            by[outs[i].kind - 1]++;
    }
    for (size_t k = 0; k < 5; k++)
        if (by[k])
            idem__ctr_add(&m->claims[k], by[k]);
}

static int idem__result_index(idem_msg_result r)
{
    switch (r) {
    case IDEM_MSG_DONE: return IDEM_MR_DONE;
    case IDEM_MSG_FAILED: return IDEM_MR_FAILED;
    case IDEM_MSG_GAVE_UP: return IDEM_MR_GAVE_UP;
    case IDEM_MSG_REPLAY:
    case IDEM_MSG_REPLAY_FAILED: return IDEM_MR_REPLAY;
    case IDEM_MSG_DUPLICATE: return IDEM_MR_DUPLICATE;
    case IDEM_MSG_INVALID: return IDEM_MR_INVALID;
    default: return -1;
    }
}

void idem__metrics_messages(idem__metrics *m, const idem_msg *msgs,
                            size_t n)
{
    uint64_t by[IDEM_MR_COUNT] = {0};
    for (size_t i = 0; i < n; i++) {
        int k = idem__result_index(msgs[i].result);
        if (k >= 0)
            by[k]++;
    }
    for (size_t k = 0; k < IDEM_MR_COUNT; k++)
        if (by[k])
            idem__ctr_add(&m->messages[k], by[k]);
}

/* ------------------------------------------------------------------------
 * Reading */

void idem_metrics_init(idem_metrics *m)
{
    if (!m)
        return;
    memset(m, 0, sizeof *m);
    m->version = IDEM__METRICS_VERSION;
    m->source_lag = -1;
    m->live_keys = m->store_bytes = m->segments = -1;
}

static uint64_t idem__ld(idem__ctr *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

/* The count is the buckets' sum, so that the +Inf bucket and _count
 * agree even when a writer is between two stores. */
static void idem__hist_get(idem__hist *h, idem_histogram *out)
{
    uint64_t run = 0;
    for (size_t i = 0; i < IDEM_METRICS_BUCKETS; i++) {
        run += idem__ld(&h->bucket[i]);
        out->le[i] = run;
    }
    out->count = run + idem__ld(&h->bucket[IDEM_METRICS_BUCKETS]);
    out->sum = (double)idem__ld(&h->sum_ns) / 1e9;
}

int idem_metrics_get(const idem_store *cs, idem_metrics *m)
{
    if (!cs || !m || m->version != IDEM__METRICS_VERSION)
        return IDEM_EINVAL;
    /* Relaxed loads only: the counters are atomic objects, and reading
     * them changes nothing, whatever const says. */
    idem__metrics *x = (idem__metrics *)&cs->m;
    for (size_t k = 0; k < 5; k++)
        m->claims[k] = idem__ld(&x->claims[k]);
    m->completions = idem__ld(&x->completions);
    m->failures_permanent = idem__ld(&x->fail_perm);
    m->failures_retryable = idem__ld(&x->fail_retry);
    m->takeovers = idem__ld(&x->takeovers);
    m->lost = idem__ld(&x->lost);
    for (size_t k = 0; k < IDEM_METRICS_CODES; k++)
        m->errors[k] = idem__ld(&x->errors[k]);
    idem__hist_get(&x->sync, &m->sync_duration);
    idem__hist_get(&x->claim_batch, &m->claim_batch_duration);
    idem__hist_get(&x->handler, &m->handler_duration);
    m->live_keys = atomic_load_explicit(&x->live_keys, memory_order_relaxed);
    m->store_bytes =
        atomic_load_explicit(&x->store_bytes, memory_order_relaxed);
    m->segments = atomic_load_explicit(&x->segments, memory_order_relaxed);
    m->expired_total = idem__ld(&x->expired);
    for (size_t k = 0; k < IDEM_MR_COUNT; k++)
        m->messages[k] = idem__ld(&x->messages[k]);
    return 0;
}

int idem_server_metrics_get(idem_store *s, idem_server_metrics *out,
                            size_t max, size_t *n)
{
    if (!s || !n || (max && !out))
        return IDEM_EINVAL;
    *n = 0;
    if (!s->be)
        return idem__fail(s, IDEM_EINVAL, "store is not open");
    if (idem__forked(s))
        return idem__fail(s, IDEM_EINVAL, "handle opened by another "
                          "process: fork children must open their own "
                          "store");
    s->detail[0] = '\0';
    return s->be->server_metrics ? s->be->server_metrics(s, out, max, n)
                                 : 0;
}

/* ------------------------------------------------------------------------
 * The text format */

typedef struct idem__w {
    char *buf;
    size_t size, len;
    const char *job, *store;
} idem__w;

static void idem__put(idem__w *w, const char *fmt, ...) IDEM__PRINTF(2, 3);

static void idem__put(idem__w *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = w->len < w->size ? w->size - w->len : 0;
    int n = vsnprintf(room ? w->buf + w->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        w->len += (size_t)n;
}

/* The length of the UTF-8 character at p (1 to 4), or 0 if p holds
 * none: a stray byte, an overlong form, a surrogate, past U+10FFFF. */
static size_t idem__utf8_len(const unsigned char *p)
{
    if (p[0] < 0x80)
        return 1;
    size_t n = p[0] >= 0xC2 && p[0] <= 0xDF   ? 2
               : p[0] >= 0xE0 && p[0] <= 0xEF ? 3
               : p[0] >= 0xF0 && p[0] <= 0xF4 ? 4
                                              : 0;
    unsigned lo = p[0] == 0xE0 ? 0xA0 : p[0] == 0xF0 ? 0x90 : 0x80;
    unsigned hi = p[0] == 0xED ? 0x9F : p[0] == 0xF4 ? 0x8F : 0xBF;
    if (n && (p[1] < lo || p[1] > hi))
        return 0;
    for (size_t i = 2; i < n; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    return n;
}

/* A label value, escaped. The format is UTF-8, and one byte that is not
 * (a store's path may hold any) made Prometheus refuse the whole scrape:
 * such a byte is shown as U+FFFD. */
static void idem__put_value(idem__w *w, const char *v)
{
    while (*v) {
        size_t n = idem__utf8_len((const unsigned char *)v);
        const char *esc = *v == '\\' ? "\\\\" : *v == '"' ? "\\\""
                          : *v == '\n' ? "\\n" : n ? NULL : "\xEF\xBF\xBD";
        if (esc)
            idem__put(w, "%s", esc);
        else
            idem__put(w, "%.*s", (int)n, v);
        v += n ? n : 1;
    }
}

/* NAME{job="..",store=".."[,EXTRA="VALUE"]} */
static void idem__put_name(idem__w *w, const char *name, const char *extra,
                           const char *value)
{
    idem__put(w, "%s{", name);
    if (w->job) {
        idem__put(w, "job=\"");
        idem__put_value(w, w->job);
        idem__put(w, "\",");
    }
    idem__put(w, "store=\"");
    idem__put_value(w, w->store);
    idem__put(w, "\"");
    if (extra) {
        idem__put(w, ",%s=\"", extra);
        idem__put_value(w, value);
        idem__put(w, "\"");
    }
    idem__put(w, "} ");
}

static void idem__head(idem__w *w, const char *name, const char *type,
                       const char *help)
{
    idem__put(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void idem__sample(idem__w *w, const char *name, const char *label,
                         const char *value, uint64_t v)
{
    idem__put_name(w, name, label, value);
    idem__put(w, "%llu\n", (unsigned long long)v);
}

static void idem__one(idem__w *w, const char *name, const char *type,
                      const char *help, uint64_t v)
{
    idem__head(w, name, type, help);
    idem__sample(w, name, NULL, NULL, v);
}

/* A gauge the store may not know (-1): left out then. */
static void idem__gauge(idem__w *w, const char *name, const char *help,
                        int64_t v)
{
    if (v >= 0)
        idem__one(w, name, "gauge", help, (uint64_t)v);
}

static void idem__put_hist(idem__w *w, const char *name, const char *help,
                       const idem_histogram *h)
{
    char n[96], le[32];
    idem__head(w, name, "histogram", help);
    snprintf(n, sizeof n, "%s_bucket", name);
    for (size_t i = 0; i < IDEM_METRICS_BUCKETS; i++) {
        snprintf(le, sizeof le, "%g", idem__bounds[i]);
        idem__sample(w, n, "le", le, h->le[i]);
    }
    idem__sample(w, n, "le", "+Inf", h->count);
    snprintf(n, sizeof n, "%s_sum", name);
    idem__put_name(w, n, NULL, NULL);
    idem__put(w, "%.9g\n", h->sum);
    snprintf(n, sizeof n, "%s_count", name);
    idem__sample(w, n, NULL, NULL, h->count);
}

static void idem__labelled(idem__w *w, const char *name, const char *help,
                           const char *label, const char *const *values,
                           const uint64_t *v, size_t n)
{
    idem__head(w, name, "counter", help);
    for (size_t i = 0; i < n; i++)
        idem__sample(w, name, label, values[i], v[i]);
}

static void idem__errors(idem__w *w, const uint64_t *errors)
{
    static const struct {
        int code;
        const char *name;
    } names[] = {
#define IDEM__NAME(name, value, text) {value, #name},
        IDEM_ERRNO_MAP(IDEM__NAME)
#undef IDEM__NAME
    };
    idem__head(w, "idem_errors_total", "counter",
               "Calls and keys that failed, by error code.");
    for (size_t i = 1; i < sizeof names / sizeof *names; i++)
        if (errors[-names[i].code])
            idem__sample(w, "idem_errors_total", "code", names[i].name,
                         errors[-names[i].code]);
}

static void idem__server(idem__w *w, const idem_metrics *m, const char *name,
                         const char *type, const char *help, size_t field)
{
    idem__head(w, name, type, help);
    for (size_t i = 0; i < m->nservers; i++) {
        const idem_server_metrics *sv = &m->servers[i];
        int64_t v = field == 0   ? sv->evicted_keys
                    : field == 1 ? sv->used_memory_bytes
                    : field == 2 ? sv->keyspace_hits
                                 : sv->keyspace_misses;
        if (v >= 0)
            idem__sample(w, name, "node", sv->node, (uint64_t)v);
    }
}

static void idem__store_families(idem__w *w, const idem_metrics *m)
{
    static const char *const outcomes[] = {"new", "replay", "failed", "busy",
                                           "mismatch"};
    static const char *const kinds[] = {"permanent", "retryable"};
    uint64_t failures[2] = {m->failures_permanent, m->failures_retryable};
    idem__labelled(w, "idem_claims_total", "Claims by outcome.", "outcome",
                   outcomes, m->claims, 5);
    idem__one(w, "idem_completions_total", "counter",
              "Claims completed (recorded DONE).", m->completions);
    idem__labelled(w, "idem_failures_total", "Claims failed, by kind.",
                   "kind", kinds, failures, 2);
    idem__one(w, "idem_takeovers_total", "counter",
              "Keys taken over after their holder's lease ran out.",
              m->takeovers);
    idem__one(w, "idem_lost_total", "counter",
              "Leases lost (IDEM_ELOST): work whose effect may be doubled.",
              m->lost);
    idem__errors(w, m->errors);
    idem__put_hist(w, "idem_sync_duration_seconds",
               "Time to make changes durable (one sync).", &m->sync_duration);
    idem__put_hist(w, "idem_claim_batch_duration_seconds",
               "Time of one batch of claims.", &m->claim_batch_duration);
    idem__gauge(w, "idem_live_keys", "Records in the index.", m->live_keys);
    idem__gauge(w, "idem_store_bytes", "Bytes in the store's segments.",
                m->store_bytes);
    idem__gauge(w, "idem_segments", "Log segments.", m->segments);
    idem__one(w, "idem_expired_total", "counter",
              "Records removed by sweeps.", m->expired_total);
}

size_t idem_metrics_format(const idem_metrics *m, const char *job,
                           const char *store, char *buf, size_t size)
{
    static const char *const results[IDEM_MR_COUNT] = {
        "done", "failed", "gave_up", "replay", "duplicate", "invalid",
        "dead_letter"};
    char shown[2048];
    idem_uri_display(store, shown, sizeof shown);
    idem__w w = {buf, size, 0, job, shown};
    if (size)
        buf[0] = '\0';
    if (!m)
        return 0;
    idem__head(&w, "idem_build_info", "gauge", "The idem library's version.");
    idem__sample(&w, "idem_build_info", "version", idem_version(), 1);
    idem__store_families(&w, m);
    idem__labelled(&w, "idem_messages_total", "Runner messages by result.",
                   "result", results, m->messages, IDEM_MR_COUNT);
    idem__put_hist(&w, "idem_handler_duration_seconds",
               "Time of one call of the handler.", &m->handler_duration);
    idem__gauge(&w, "idem_source_lag_messages",
                "Messages the source holds that the runner has not read.",
                m->source_lag);
    if (!m->nservers || !m->servers)
        return w.len;
    idem__server(&w, m, "idem_redis_evicted_keys", "gauge",
                 "Keys the Redis server evicted for maxmemory.", 0);
    idem__server(&w, m, "idem_redis_used_memory_bytes", "gauge",
                 "Memory the Redis server uses.", 1);
    idem__server(&w, m, "idem_redis_keyspace_hits_total", "counter",
                 "Lookups that found their key on the Redis server.", 2);
    idem__server(&w, m, "idem_redis_keyspace_misses_total", "counter",
                 "Lookups that did not find their key.", 3);
    return w.len;
}
