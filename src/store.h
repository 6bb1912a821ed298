/* store.h - the store handle and the interface every backend implements.
 *
 * store.c owns everything that is the same for all backends: parsing the
 * URI scheme, checking arguments, resolving defaults, syncing after
 * batches, the error detail. A backend sees only valid keys and resolved
 * numbers, which keeps the semantics in one place and each backend about
 * its storage alone. */
#ifndef IDEM_STORE_H
#define IDEM_STORE_H

#include "common.h"
#include "metrics.h"

struct idem__backend;

struct idem_store {
    const struct idem__backend *be;
    void *impl;               /* the backend's state */
    idem_opts opts;
    char *uri;                /* as shown: idem_uri_display() */
    idem__arena out;          /* memory behind data returned to callers */
    long pid;                 /* the process that opened it */
    unsigned long forks;      /* idem__forks when it was opened */
    char detail[512];
    char warning[512];        /* idem_warning(): set by open, or "" */
    idem__metrics m;          /* idem_metrics_get(): see metrics.h */
    uint64_t sync_t0;         /* when the sync in flight started
                               * (idem_sync_start), 0 if none */
};

/* Resolved per-claim numbers. */
typedef struct idem__claim_args {
    int64_t lease_ms, ttl_ms;
    int done;                 /* IDEM_CLAIM_DONE: only if the backend has
                               * IDEM__CAP_CLAIM_DONE; store.c emulates it
                               * for the others */
} idem__claim_args;

#define IDEM__CAP_CLAIM_DONE 1u  /* claim_many honours a->done */
#define IDEM__CAP_EXCLUSIVE 2u   /* one handle holds the data at a time, so
                                  * a PENDING claim it did not make belongs
                                  * to a process that is gone */
#define IDEM__CAP_GROUP_COMMIT 4u /* changes become durable together, at
                                  * sync; without it each write is durable
                                  * (or lost) on its own as it is sent */
#define IDEM__CAP_SEGMENTS 8u    /* records live in log segments on this
                                  * machine: IDEM_CAP_SEGMENTS */

/* Every function returns 0 or an IDEM_E* code and may set the detail.
 * Batch functions process the entries whose status is 0 on entry (the
 * others were rejected by argument checks). */
struct idem__backend {
    const char *scheme;       /* "local", "mem", ... (before the ':') */
    unsigned caps;            /* IDEM__CAP_* */
    int (*open)(idem_store *s, const char *rest);
    int (*close)(idem_store *s);
    int (*claim_many)(idem_store *s, const idem_key *keys, size_t n,
                      const idem__claim_args *a, idem_outcome *outs);
    int (*complete_many)(idem_store *s, const idem_completion *items,
                         size_t n, int *statuses);
    /* Optional (NULL: complete_many): completions of claims the caller
     * holds and keeps renewed (the runner), which may be checked at the
     * commit that applies them instead of at once: see
     * idem__complete_held(). */
    int (*complete_held)(idem_store *s, const idem_completion *items,
                         size_t n, int *statuses);
    int (*fail)(idem_store *s, const void *key, size_t keylen,
                uint64_t token, const void *err, size_t len, int retryable);
    int (*extend)(idem_store *s, const void *key, size_t keylen,
                  uint64_t token, int64_t lease_ms);
    /* Optional (NULL: extend per item): renew the lease of items[i]
     * (key, keylen, token; the rest unused), statuses as complete_many. */
    int (*extend_many)(idem_store *s, const idem_completion *items,
                       size_t n, int64_t lease_ms, int *statuses);
    int (*get)(idem_store *s, const void *key, size_t keylen,
               idem_record *out);
    int (*forget)(idem_store *s, const void *key, size_t keylen);
    int (*sync)(idem_store *s);
    /* Optional (NULL: sync, and nothing to wait for): idem_sync_start()
     * and idem_sync_wait(). sync() waits for a started one too. */
    int (*sync_start)(idem_store *s);
    int (*sync_wait)(idem_store *s);
    int (*checkpoint_put)(idem_store *s, const char *name, const void *blob,
                          size_t len);
    int (*checkpoint_get)(idem_store *s, const char *name,
                          const void **blob, size_t *len);
    /* Optional (NULL: IDEM_ENOTSUP): idem_checkpoint_write(),
     * idem_checkpoint_reply(), idem_store_server(). */
    int (*checkpoint_write)(idem_store *s, int argc, const char *const *argv,
                            const size_t *argvlen, int keyidx, size_t *index);
    int (*checkpoint_reply)(idem_store *s, size_t index, const char **text,
                            size_t *len);
    int (*server)(idem_store *s, char *host, size_t hostlen, int *port,
                  int *db);
    int (*sweep)(idem_store *s, size_t max_work, uint64_t *expired);
    int (*stats)(idem_store *s, idem_stats *out);
    /* idem_check()/idem_repair() of the store that rest (the URI after
     * the scheme) names, into *r (zeroed). s is a handle that is not
     * open: its uri, options (IDEM_O_READONLY for a check) and detail
     * serve the backend, which opens what it needs and closes it before
     * it returns. NULL: not supported (IDEM_ENOTSUP). */
    int (*check)(idem_store *s, const char *rest, int repair,
                 idem_check_report *r);
    /* Optional (NULL: IDEM_ENOTSUP). */
    int (*scan)(idem_store *s, idem_scan_fn fn, void *ctx);
    int (*import)(idem_store *s, const void *key, size_t keylen,
                  const idem_record *rec);
    /* Refuse every later write and sync with `code`: what was done since
     * the last sync must never become durable. */
    void (*poison)(idem_store *s, int code);
    /* Optional: set s->m's gauges (live keys, bytes, segments, expired),
     * in O(1): called after open and every sync. */
    void (*gauges)(idem_store *s);
    /* Optional (NULL: no server figures, *n = 0): as
     * idem_server_metrics_get(). */
    int (*server_metrics)(idem_store *s, idem_server_metrics *out,
                          size_t max, size_t *n);
};

extern const struct idem__backend idem__backend_local;
extern const struct idem__backend idem__backend_mem;
extern const struct idem__backend idem__backend_redis;
extern const struct idem__backend idem__backend_cluster;
extern const struct idem__backend idem__backend_sentinel;

/* Set the handle's detail (printf-style) and return code, so that
 * `return idem__fail(s, IDEM_EINVAL, "...")` reads as one step. */
int idem__fail(idem_store *s, int code, const char *fmt, ...)
    IDEM__PRINTF(3, 4);

/* Renew the leases of n claims (key, keylen and token of each item; the
 * rest is unused) to run out lease_ms (0: the store default) from now:
 * statuses[i] is 0 or IDEM_ELOST (or another error of that key), as
 * idem_extend() answers. One round trip on a server. Does not sync.
 * Returns 0, or the error that stopped the batch (statuses say which
 * keys it reached). */
int idem__extend_many(idem_store *s, const idem_completion *items, size_t n,
                      int64_t lease_ms, int *statuses);

/* idem_complete_many() with IDEM_NOSYNC for claims the caller holds
 * and keeps renewed, so that none can have run out since its last
 * renewal (the runner's commit). A backend that commits them with a
 * queued checkpoint in one step may check each token there, atomically
 * with the completion, instead of at once: a token refused then is
 * reported by the sync (IDEM_ELOST, the key in the detail) rather than
 * in statuses. */
int idem__complete_held(idem_store *s, const idem_completion *items,
                        size_t n, int *statuses);

/* Make the handle refuse further writes and syncs (see the runner). */
void idem__poison(idem_store *s, int code);

/* Is s being used in a fork child of the process that opened it? Then
 * its memory is a stale copy and its files belong to that process. */
int idem__forked(const idem_store *s);

/* The store's clock, in Unix ms. */
int64_t idem__now(const idem_store *s);

/* The same clock in Unix microseconds, where fencing tokens start: the
 * injected clock's ms times 1000, else the wall clock's own. */
int64_t idem__now_us(const idem_store *s);

/* Copy n bytes into the handle's output memory and return a pointer that
 * stays valid until the next call on s; NULL on ENOMEM. Successive calls
 * within one API call all stay valid (outputs of a batch). */
const void *idem__out_keep(idem_store *s, const void *p, size_t n);

#endif
