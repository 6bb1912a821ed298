/* store.c - the public store API: one front door for every backend.
 *
 * Each public call resets the handle's output memory and detail, checks
 * its arguments, resolves defaults, and hands the backend clean input. The
 * rules that are the same for every backend live here once: key and value
 * limits, "batch forms sync unless IDEM_NOSYNC", singles as batches of
 * one. A backend that fails writes its own detail.
 *
 * A handle belongs to the process that opened it. fork() copies it into
 * the child with the parent's buffered, unsynced changes, and shares its
 * files, file offsets and connections: a child that wrote or committed
 * through it (an atexit handler or a destructor that closes it is
 * enough) would append a stale copy of the parent's changes after the
 * parent's own and undo what the parent synced. So in a child every call
 * fails, and idem_close() only frees memory. */
#include "store.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define IDEM__OPTIONS_VERSION 1u

static const struct idem__backend *const idem__backends[] = {
    &idem__backend_local,
    &idem__backend_mem,
    &idem__backend_redis,
    &idem__backend_cluster,
    &idem__backend_sentinel,
};

/* How many fork()s this process is from the one that loaded the library:
 * an atfork handler adds one in every child, before it runs anything
 * else. A handle remembers the count it was opened under; comparing costs
 * a load per call, where getpid() would be a system call. */
static unsigned long idem__forks;
static pthread_once_t idem__forks_once = PTHREAD_ONCE_INIT;
static int idem__forks_watched;  /* pthread_atfork()'s result */

static void idem__count_fork(void)
{
    idem__forks++;
}

static void idem__watch_forks(void)
{
    idem__forks_watched = pthread_atfork(NULL, NULL, idem__count_fork);
}

int idem__forked(const idem_store *s)
{
    return s->forks != idem__forks;
}

static int idem__fail_forked(idem_store *s)
{
    return idem__fail(s, IDEM_EINVAL,
                      "handle opened by pid %ld, used in pid %ld: fork "
                      "children must open their own store",
                      s->pid, (long)getpid());
}

void idem_opts_init(idem_opts *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->version = IDEM__OPTIONS_VERSION;
    o->ttl_ms = 24 * 3600 * 1000LL;
    o->lease_ms = 30 * 1000LL;
    o->failure_ttl_ms = 3600 * 1000LL;
    o->segment_bytes = 64u << 20;
    o->segment_span_ms = 3600 * 1000LL;
    o->retention_ms = 7 * 24 * 3600 * 1000LL;
}

int idem__fail(idem_store *s, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->detail, sizeof s->detail, fmt, ap);
    va_end(ap);
    return code;
}

int64_t idem__now(const idem_store *s)
{
    if (s->opts.clock)
        return s->opts.clock(s->opts.clock_ctx);
    return idem__wall_ms();
}

int64_t idem__now_us(const idem_store *s)
{
    if (!s->opts.clock)
        return idem__wall_us();
    int64_t ms = s->opts.clock(s->opts.clock_ctx);
    return ms > INT64_MAX / 1000   ? INT64_MAX
           : ms < INT64_MIN / 1000 ? INT64_MIN
                                   : ms * 1000;
}

void idem__poison(idem_store *s, int code)
{
    if (s->be && s->be->poison)
        s->be->poison(s, code);
}

const void *idem__out_keep(idem_store *s, const void *p, size_t n)
{
    void *q = idem__arena_alloc(&s->out, n ? n : 1);
    if (q && n)
        memcpy(q, p, n);
    return q;
}

const char *idem_errdetail(const idem_store *s)
{
    return s ? s->detail : "out of memory";
}

const char *idem_warning(const idem_store *s)
{
    return s ? s->warning : "";
}

/* Start of every call: forget the previous call's outputs and detail. */
static void idem__begin(idem_store *s)
{
    idem__arena_reset(&s->out);
    s->detail[0] = '\0';
}

static int idem__check_options(idem_store *s, const idem_opts *o)
{
    if (o->version != IDEM__OPTIONS_VERSION)
        return idem__fail(s, IDEM_EINVAL,
                          "options not initialised with idem_opts_init()");
    if (o->ttl_ms <= 0 || o->lease_ms <= 0 || o->failure_ttl_ms <= 0 ||
        o->ttl_ms > IDEM_MS_MAX || o->lease_ms > IDEM_MS_MAX ||
        o->failure_ttl_ms > IDEM_MS_MAX)
        return idem__fail(s, IDEM_EINVAL,
                          "ttl_ms, lease_ms and failure_ttl_ms must be "
                          "1 ms..100 years");
    if (o->retention_ms <= 0)
        return idem__fail(s, IDEM_EINVAL, "retention_ms must be > 0");
    if (o->flags & ~(IDEM_O_READONLY | IDEM_O_NOCREATE))
        return idem__fail(s, IDEM_EINVAL, "unknown option flags 0x%x",
                          o->flags & ~(IDEM_O_READONLY | IDEM_O_NOCREATE));
    if (o->segment_bytes < 4096 || o->segment_bytes > (1ull << 31) ||
        o->segment_span_ms <= 0)
        return idem__fail(s, IDEM_EINVAL,
                          "segment_bytes must be 4 KiB..2 GiB and "
                          "segment_span_ms > 0");
    return 0;
}

/* The backend that uri's scheme names, and *rest the URI after the ':';
 * NULL if none does. */
static const struct idem__backend *idem__backend_of(const char *uri,
                                                    const char **rest)
{
    const char *colon = strchr(uri, ':');
    if (!colon)
        return NULL;
    size_t n = (size_t)(colon - uri);
    for (size_t i = 0; i < sizeof idem__backends / sizeof *idem__backends;
         i++) {
        const char *name = idem__backends[i]->scheme;
        if (strlen(name) == n && memcmp(name, uri, n) == 0) {
            *rest = colon + 1;
            return idem__backends[i];
        }
    }
    return NULL;
}

static int idem__pick_backend(idem_store *s, const char *uri,
                              const char **rest)
{
    s->be = idem__backend_of(uri, rest);
    if (s->be)
        return 0;
    return idem__fail(s, IDEM_EINVAL,
                      "unknown store URI '%s': expected local:PATH, mem:, "
                      "redis://host:port, redis-cluster://host:port or "
                      "redis-sentinel://host:port/master",
                      s->uri);
}

unsigned idem_uri_caps(const char *uri)
{
    const char *rest;
    const struct idem__backend *be =
        idem__backend_of(uri && *uri ? uri : IDEM_DEFAULT_URI, &rest);
    if (!be)
        return 0;
    return (be->caps & IDEM__CAP_SEGMENTS ? IDEM_CAP_SEGMENTS : 0) |
           (be->check ? IDEM_CAP_CHECK : 0);
}

/* A handle for uri, its backend picked, not yet open; *rest is the URI
 * after the scheme. On failure *out is NULL (out of memory) or a handle
 * with no backend whose detail says why. */
static int idem__handle_new(const char *uri, const idem_opts *opts,
                            idem_store **out, const char **rest)
{
    idem_store *s = calloc(1, sizeof *s);
    *out = s;
    if (!s)
        return IDEM_ENOMEM;
    pthread_once(&idem__forks_once, idem__watch_forks);
    s->pid = (long)getpid();
    s->forks = idem__forks;
    idem__metrics_reset(&s->m);
    if (idem__forks_watched)
        return idem__fail(s, IDEM_ENOMEM, "cannot register a fork handler");
    if (opts)
        s->opts = *opts;
    else
        idem_opts_init(&s->opts);
    if (!uri || !*uri)
        uri = IDEM_DEFAULT_URI;
    /* Messages name the store as it may be shown: without a password. */
    size_t shown = idem_uri_display(uri, NULL, 0) + 1;
    s->uri = malloc(shown);
    if (s->uri)
        idem_uri_display(uri, s->uri, shown);
    if (!s->uri)
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    int rc = idem__check_options(s, &s->opts);
    return rc ? rc : idem__pick_backend(s, uri, rest);
}

int idem_open(const char *uri, const idem_opts *opts, idem_store **out)
{
    if (!out)  /* nowhere to put a handle, or the detail of an error */
        return IDEM_EINVAL;
    const char *rest = NULL;
    int rc = idem__handle_new(uri, opts, out, &rest);
    if (!rc)
        rc = (*out)->be->open(*out, rest);
    if (!rc && (*out)->be->gauges)
        (*out)->be->gauges(*out);
    if (rc && *out)
        (*out)->be = NULL;  /* closed state: only errdetail and close work */
    return rc;
}

int idem_close(idem_store *s)
{
    if (!s)
        return 0;
    int rc = s->be ? s->be->close(s) : 0;
    idem__arena_free(&s->out);
    free(s->uri);
    free(s);
    return rc;
}

/* Every call on a handle that failed to open says so instead of crashing;
 * so does every call in a fork child (see the top of this file). */
#define IDEM__ENTER(s)                                                     \
    do {                                                                   \
        if (!(s))                                                          \
            return IDEM_EINVAL;                                            \
        idem__begin(s);                                                    \
        if (!(s)->be)                                                      \
            return idem__fail(s, IDEM_EINVAL, "store is not open");        \
        if (idem__forked(s))                                               \
            return idem__fail_forked(s);                                   \
    } while (0)

static int idem__check_key(idem_store *s, const void *key, size_t len)
{
    if (!key || len == 0)
        return idem__fail(s, IDEM_EKEYSIZE, "key is empty");
    if (len > IDEM_KEY_MAX)
        return idem__fail(s, IDEM_EKEYSIZE,
                          "key is %zu bytes; the limit is %u", len,
                          IDEM_KEY_MAX);
    return 0;
}

static int idem__check_value(idem_store *s, const void *p, size_t len)
{
    if (len && !p)
        return idem__fail(s, IDEM_EINVAL, "value is NULL with length %zu",
                          len);
    if (len > IDEM_VALUE_MAX)
        return idem__fail(s, IDEM_EVALSIZE,
                          "value is %zu bytes; the limit is %u", len,
                          IDEM_VALUE_MAX);
    return 0;
}

static int idem__check_ms(idem_store *s, int64_t ms, const char *what)
{
    if (ms < 0 || ms > IDEM_MS_MAX)
        return idem__fail(s, IDEM_EINVAL, "%s %lld ms is out of range",
                          what, (long long)ms);
    return 0;
}

static int idem__resolve_claim(idem_store *s, const idem_claim_opts *o,
                               idem__claim_args *a)
{
    a->lease_ms = o && o->lease_ms ? o->lease_ms : s->opts.lease_ms;
    a->ttl_ms = o && o->ttl_ms ? o->ttl_ms : s->opts.ttl_ms;
    int rc = idem__check_ms(s, a->lease_ms, "lease");
    return rc ? rc : idem__check_ms(s, a->ttl_ms, "ttl");
}

/* A call's error, counted (metrics.h); IDEM_ENOTFOUND is an answer. */
static int idem__counted(idem_store *s, int rc)
{
    return rc == IDEM_ENOTFOUND ? rc : idem__metrics_error(&s->m, rc);
}

/* The backend's sync, timed, and the gauges it may have moved. */
static int idem__sync_timed(idem_store *s)
{
    uint64_t t0 = idem__mono_ns();
    int rc = s->be->sync(s);
    idem__hist_observe(&s->m.sync, idem__mono_ns() - t0);
    s->sync_t0 = 0;  /* a started sync is covered by this one */
    if (s->be->gauges)
        s->be->gauges(s);
    return idem__counted(s, rc);
}

static int idem__finish_batch(idem_store *s, int rc, unsigned flags)
{
    if (rc == 0 && !(flags & IDEM_NOSYNC))
        return idem__sync_timed(s);
    return idem__counted(s, rc);
}

/* IDEM_CLAIM_DONE on a backend that cannot write DONE in one step:
 * complete the NEW claims with an empty response, in one batch (one
 * round trip on a server). */
static int idem__complete_new(idem_store *s, const idem_key *keys, size_t n,
                              idem_outcome *outs, int64_t ttl_ms)
{
    idem_completion *c = malloc(n * sizeof *c);
    int *st = malloc(n * sizeof *st);
    size_t m = 0;
    int rc = c && st ? 0 : idem__fail(s, IDEM_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < n; i++)
        if (!outs[i].status && outs[i].kind == IDEM_NEW) {
            c[m] = (idem_completion){keys[i].key, keys[i].keylen,
                                     outs[i].token, NULL, 0, ttl_ms};
            st[m++] = 0;
        }
    if (!rc && m)
        rc = s->be->complete_many(s, c, m, st);
    for (size_t i = 0; !rc && i < m; i++)
        rc = st[i];
    free(c);
    free(st);
    return rc;
}

/* NEW outcomes that IDEM_CLAIM_DONE recorded DONE are completions. */
static void idem__count_claims(idem_store *s, const idem_outcome *outs,
                               size_t n, unsigned flags)
{
    idem__metrics_claims(&s->m, outs, n);
    if (!(flags & IDEM_CLAIM_DONE))
        return;
    uint64_t done = 0;
    for (size_t i = 0; i < n; i++)
        done += !outs[i].status && outs[i].kind == IDEM_NEW;
    idem__ctr_add(&s->m.completions, done);
}

/* idem_claim_many(); `timed`: a batch, whose time the histogram of
 * claim batches takes (a single claim is too short to be worth the
 * clock). */
static int idem__claim_many(idem_store *s, const idem_key *keys, size_t n,
                            const idem_claim_opts *opts, idem_outcome *outs,
                            unsigned flags, int timed)
{
    IDEM__ENTER(s);
    uint64_t t0 = timed ? idem__mono_ns() : 0;
    idem__claim_args a;
    int rc = idem__resolve_claim(s, opts, &a);
    if (rc)
        return rc;
    if (n && (!keys || !outs))
        return idem__fail(s, IDEM_EINVAL, "keys or outs is NULL");
    for (size_t i = 0; i < n; i++) {
        memset(&outs[i], 0, sizeof outs[i]);
        outs[i].status = idem__check_key(s, keys[i].key, keys[i].keylen);
    }
    a.done = (flags & IDEM_CLAIM_DONE) &&
             (s->be->caps & IDEM__CAP_CLAIM_DONE);
    rc = n ? s->be->claim_many(s, keys, n, &a, outs) : 0;
    if (!rc && (flags & IDEM_CLAIM_DONE) && !a.done)
        rc = idem__complete_new(s, keys, n, outs, a.ttl_ms);
    idem__count_claims(s, outs, n, rc ? 0 : flags);
    if (timed)
        idem__hist_observe(&s->m.claim_batch, idem__mono_ns() - t0);
    return idem__finish_batch(s, rc, flags);
}

int idem_claim_many(idem_store *s, const idem_key *keys, size_t n,
                    const idem_claim_opts *opts, idem_outcome *outs,
                    unsigned flags)
{
    return idem__claim_many(s, keys, n, opts, outs, flags, 1);
}

int idem_claim(idem_store *s, const idem_key *key,
               const idem_claim_opts *opts, idem_outcome *out)
{
    if (!key || !out)
        return IDEM_EINVAL;
    int rc = idem__claim_many(s, key, 1, opts, out, IDEM_NOSYNC, 0);
    return rc ? rc : out->status;
}

static int idem__check_completion(idem_store *s, const idem_completion *c)
{
    int rc = idem__check_key(s, c->key, c->keylen);
    if (!rc)
        rc = idem__check_value(s, c->response, c->len);
    if (!rc)
        rc = idem__check_ms(s, c->ttl_ms, "ttl");
    if (!rc && c->token == 0)
        rc = idem__fail(s, IDEM_EINVAL, "token 0 is never issued");
    return rc;
}

/* idem_complete_many(); `held`: idem__complete_held(). */
static int idem__complete_many(idem_store *s, const idem_completion *items,
                               size_t n, int *statuses, unsigned flags,
                               int held)
{
    IDEM__ENTER(s);
    if (n && (!items || !statuses))
        return idem__fail(s, IDEM_EINVAL, "items or statuses is NULL");
    for (size_t i = 0; i < n; i++)
        statuses[i] = idem__check_completion(s, &items[i]);
    int (*op)(idem_store *, const idem_completion *, size_t, int *) =
        held && s->be->complete_held ? s->be->complete_held
                                     : s->be->complete_many;
    int rc = n ? op(s, items, n, statuses) : 0;
    uint64_t done = 0;  /* a batch cut short left the rest unanswered */
    for (size_t i = 0; i < n; i++)
        done += !idem__metrics_error(&s->m, statuses[i]) && !rc;
    idem__ctr_add(&s->m.completions, done);
    return idem__finish_batch(s, rc, flags);
}

int idem_complete_many(idem_store *s, const idem_completion *items, size_t n,
                       int *statuses, unsigned flags)
{
    return idem__complete_many(s, items, n, statuses, flags, 0);
}

int idem__complete_held(idem_store *s, const idem_completion *items,
                        size_t n, int *statuses)
{
    return idem__complete_many(s, items, n, statuses, IDEM_NOSYNC, 1);
}

int idem_complete(idem_store *s, const void *key, size_t keylen,
                  uint64_t token, const void *response, size_t len,
                  int64_t ttl_ms)
{
    idem_completion c = {key, keylen, token, response, len, ttl_ms};
    int st = 0;
    int rc = idem_complete_many(s, &c, 1, &st, IDEM_NOSYNC);
    return rc ? rc : st;
}

int idem_fail(idem_store *s, const void *key, size_t keylen, uint64_t token,
              const void *error, size_t len, unsigned flags)
{
    IDEM__ENTER(s);
    int rc = idem__check_key(s, key, keylen);
    if (!rc)
        rc = idem__check_value(s, error, len);
    if (!rc && token == 0)
        rc = idem__fail(s, IDEM_EINVAL, "token 0 is never issued");
    if (!rc && (flags & ~IDEM_RETRYABLE))
        rc = idem__fail(s, IDEM_EINVAL, "unknown flags 0x%x", flags);
    if (!rc)
        rc = s->be->fail(s, key, keylen, token, error, len,
                         (flags & IDEM_RETRYABLE) != 0);
    if (!rc)
        idem__ctr_add(flags & IDEM_RETRYABLE ? &s->m.fail_retry
                                             : &s->m.fail_perm, 1);
    return idem__counted(s, rc);
}

int idem_extend(idem_store *s, const void *key, size_t keylen,
                uint64_t token, int64_t lease_ms)
{
    IDEM__ENTER(s);
    if (!lease_ms)
        lease_ms = s->opts.lease_ms;
    int rc = idem__check_key(s, key, keylen);
    if (!rc)
        rc = idem__check_ms(s, lease_ms, "lease");
    return idem__counted(s, rc ? rc
                               : s->be->extend(s, key, keylen, token,
                                               lease_ms));
}

/* Backends without a batch form renew one lease at a time; the first
 * error that is not the key's own stops the batch, as in complete_many. */
static int idem__extend_each(idem_store *s, const idem_completion *items,
                             size_t n, int64_t lease_ms, int *statuses)
{
    for (size_t i = 0; i < n; i++) {
        if (statuses[i])
            continue;
        statuses[i] = s->be->extend(s, items[i].key, items[i].keylen,
                                    items[i].token, lease_ms);
        if (statuses[i] && statuses[i] != IDEM_ELOST &&
            statuses[i] != IDEM_ECOLLISION && statuses[i] != IDEM_ECORRUPT &&
            statuses[i] != IDEM_EPROTO) {
            for (size_t j = i + 1; j < n; j++)
                statuses[j] = statuses[j] ? statuses[j] : statuses[i];
            return statuses[i];
        }
    }
    return 0;
}

int idem__extend_many(idem_store *s, const idem_completion *items, size_t n,
                      int64_t lease_ms, int *statuses)
{
    IDEM__ENTER(s);
    if (n && (!items || !statuses))
        return idem__fail(s, IDEM_EINVAL, "items or statuses is NULL");
    if (!lease_ms)
        lease_ms = s->opts.lease_ms;
    int rc = idem__check_ms(s, lease_ms, "lease");
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++)
        statuses[i] = idem__check_key(s, items[i].key, items[i].keylen);
    if (!n)
        return 0;
    rc = s->be->extend_many
             ? s->be->extend_many(s, items, n, lease_ms, statuses)
             : idem__extend_each(s, items, n, lease_ms, statuses);
    for (size_t i = 0; !rc && i < n; i++)
        idem__metrics_error(&s->m, statuses[i]);
    return idem__counted(s, rc);
}

int idem_get(idem_store *s, const void *key, size_t keylen, idem_record *out)
{
    IDEM__ENTER(s);
    int rc = idem__check_key(s, key, keylen);
    if (!rc && !out)
        rc = idem__fail(s, IDEM_EINVAL, "out is NULL");
    if (rc)
        return rc;
    memset(out, 0, sizeof *out);
    return s->be->get(s, key, keylen, out);
}

int idem_forget(idem_store *s, const void *key, size_t keylen)
{
    IDEM__ENTER(s);
    int rc = idem__check_key(s, key, keylen);
    return idem__counted(s, rc ? rc : s->be->forget(s, key, keylen));
}

int idem_sync(idem_store *s)
{
    IDEM__ENTER(s);
    return idem__sync_timed(s);
}

int idem_sync_start(idem_store *s)
{
    IDEM__ENTER(s);
    if (!s->be->sync_start)
        return idem__sync_timed(s);
    uint64_t t0 = idem__mono_ns();
    int rc = s->be->sync_start(s);
    if (!s->sync_t0)  /* a second start joins the sync in flight */
        s->sync_t0 = t0;
    if (s->be->gauges)
        s->be->gauges(s);
    return idem__counted(s, rc);
}

int idem_sync_wait(idem_store *s)
{
    IDEM__ENTER(s);
    int rc = s->be->sync_wait ? s->be->sync_wait(s) : 0;
    /* The sync's whole time, from its start to durable; a wait with no
     * sync started is no sample. */
    if (s->sync_t0)
        idem__hist_observe(&s->m.sync, idem__mono_ns() - s->sync_t0);
    s->sync_t0 = 0;
    return idem__counted(s, rc);
}

static int idem__check_name(idem_store *s, const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > IDEM_CHECKPOINT_NAME_MAX)
        return idem__fail(s, IDEM_EINVAL,
                          "checkpoint name must be 1..%u bytes",
                          IDEM_CHECKPOINT_NAME_MAX);
    return 0;
}

int idem_checkpoint_put(idem_store *s, const char *name, const void *blob,
                        size_t len)
{
    IDEM__ENTER(s);
    int rc = idem__check_name(s, name);
    if (!rc)
        rc = idem__check_value(s, blob, len);
    if (!rc && !s->be->checkpoint_put)
        rc = idem__fail(s, IDEM_ENOTSUP, "%s: stores no checkpoints",
                        s->uri);
    return rc ? rc : s->be->checkpoint_put(s, name, blob, len);
}

int idem_checkpoint_get(idem_store *s, const char *name, const void **blob,
                        size_t *len)
{
    IDEM__ENTER(s);
    int rc = idem__check_name(s, name);
    if (!rc && (!blob || !len))
        rc = idem__fail(s, IDEM_EINVAL, "blob or len is NULL");
    if (!rc && !s->be->checkpoint_get)
        rc = idem__fail(s, IDEM_ENOTSUP, "%s: stores no checkpoints",
                        s->uri);
    return rc ? rc : s->be->checkpoint_get(s, name, blob, len);
}

/* The backend's optional op, or IDEM_ENOTSUP naming the store. */
static int idem__unsupported(idem_store *s, int op, const char *what)
{
    return op ? 0 : idem__fail(s, IDEM_ENOTSUP, "%s: %s", s->uri, what);
}

int idem_checkpoint_write(idem_store *s, int argc, const char *const *argv,
                          const size_t *argvlen, int keyidx, size_t *index)
{
    IDEM__ENTER(s);
    int rc = !argv || !argvlen || !index || argc < 2 || keyidx < 1 ||
                     keyidx >= argc
                 ? idem__fail(s, IDEM_EINVAL, "a queued write needs a "
                              "command and the index of its key")
                 : idem__unsupported(s, s->be->checkpoint_write != NULL,
                                     "writes cannot be queued with its "
                                     "checkpoints");
    return rc ? rc : s->be->checkpoint_write(s, argc, argv, argvlen, keyidx,
                                             index);
}

int idem_checkpoint_reply(idem_store *s, size_t index, const char **text,
                          size_t *len)
{
    IDEM__ENTER(s);
    int rc = !text || !len ? idem__fail(s, IDEM_EINVAL, "text or len is NULL")
                           : idem__unsupported(
                                 s, s->be->checkpoint_reply != NULL,
                                 "writes cannot be queued with its "
                                 "checkpoints");
    return rc ? rc : s->be->checkpoint_reply(s, index, text, len);
}

int idem_store_server(idem_store *s, char *host, size_t hostlen, int *port,
                      int *db)
{
    IDEM__ENTER(s);
    int rc = !host || !hostlen || !port || !db
                 ? idem__fail(s, IDEM_EINVAL, "an argument is NULL")
                 : idem__unsupported(s, s->be->server != NULL,
                                     "not one server");
    return rc ? rc : s->be->server(s, host, hostlen, port, db);
}

int idem_sweep(idem_store *s, size_t max_work, uint64_t *expired)
{
    IDEM__ENTER(s);
    uint64_t dummy;
    uint64_t *e = expired ? expired : &dummy;
    *e = 0;
    int rc = s->be->sweep(s, max_work, e);
    idem__ctr_add(&s->m.expired, *e);
    if (s->be->gauges)
        s->be->gauges(s);
    return idem__counted(s, rc);
}

/* What idem_stats_get() fills: the struct as it first was. */
#define IDEM__STATS_V1 offsetof(idem_stats, hot_keys)

int idem_stats_read(idem_store *s, idem_stats *out, size_t size)
{
    IDEM__ENTER(s);
    if (!out || size < IDEM__STATS_V1)
        return idem__fail(s, IDEM_EINVAL, "out is NULL or too small");
    idem_stats all;
    memset(&all, 0, sizeof all);
    int rc = s->be->stats(s, &all);
    memcpy(out, &all, size < sizeof all ? size : sizeof all);
    return rc;
}

int idem_stats_get(idem_store *s, idem_stats *out)
{
    return idem_stats_read(s, out, IDEM__STATS_V1);
}

int idem_scan(idem_store *s, idem_scan_fn fn, void *ctx)
{
    IDEM__ENTER(s);
    if (!fn)
        return idem__fail(s, IDEM_EINVAL, "fn is NULL");
    if (!s->be->scan)
        return idem__fail(s, IDEM_ENOTSUP, "%s: cannot list its records",
                          s->uri);
    return s->be->scan(s, fn, ctx);
}

static int idem__check_record(idem_store *s, const idem_record *r)
{
    if (!r)
        return idem__fail(s, IDEM_EINVAL, "rec is NULL");
    if (r->token == 0 || r->token > IDEM_TOKEN_MAX)
        return idem__fail(s, IDEM_EINVAL, "token %llu is out of range",
                          (unsigned long long)r->token);
    if (r->state != IDEM_STATE_PENDING && r->state != IDEM_STATE_DONE &&
        r->state != IDEM_STATE_FAILED)
        return idem__fail(s, IDEM_EINVAL, "state %d is not a state",
                          (int)r->state);
    return idem__check_value(s, r->data, r->len);
}

/* idem_check() and idem_repair() hand the backend a handle that is not
 * open: a store too damaged to open must still be checked and repaired,
 * so opening is the backend's business (Redis opens one; local: reads
 * its directory). */
static int idem__check_store(const char *uri, int repair,
                             idem_check_report *report)
{
    idem_check_report dummy;
    idem_check_report *r = report ? report : &dummy;
    memset(r, 0, sizeof *r);
    idem_opts o;
    idem_opts_init(&o);
    o.flags = repair ? 0 : IDEM_O_READONLY;
    idem_store *s;
    const char *rest = NULL;
    int rc = idem__handle_new(uri, &o, &s, &rest);
    if (!rc && !s->be->check)
        rc = idem__fail(s, IDEM_ENOTSUP, "check and repair work on local: "
                        "and Redis stores");
    else if (!rc)
        rc = s->be->check(s, rest, repair, r);
    if (rc && rc != IDEM_ECORRUPT)
        snprintf(r->first_damage, sizeof r->first_damage, "%s",
                 idem_errdetail(s));
    if (s)
        s->be = NULL;  /* nothing open for idem_close() to close */
    idem_close(s);
    return rc;
}

int idem_check(const char *uri, idem_check_report *report)
{
    return idem__check_store(uri, 0, report);
}

int idem_repair(const char *uri, idem_check_report *report)
{
    return idem__check_store(uri, 1, report);
}

int idem_import(idem_store *s, const void *key, size_t keylen,
                const idem_record *rec)
{
    IDEM__ENTER(s);
    int rc = idem__check_key(s, key, keylen);
    if (!rc)
        rc = idem__check_record(s, rec);
    if (!rc && !s->be->import)
        rc = idem__fail(s, IDEM_ENOTSUP, "%s: cannot import records",
                        s->uri);
    if (rc || rec->expires_ms <= idem__now(s))
        return rc;
    return s->be->import(s, key, keylen, rec);
}
