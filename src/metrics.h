/* metrics.h - the counters a store handle keeps of itself.
 *
 * One writer (the thread using the handle) and any number of readers
 * (idem_metrics_get(), from a monitoring thread): so each figure is an
 * atomic read and written with relaxed loads and stores, never a
 * read-modify-write. A plain mov on the machines that matter, which is
 * what keeps the counting on by default. */
#ifndef IDEM_METRICS_H
#define IDEM_METRICS_H

#include <stdatomic.h>

#include "common.h"

typedef _Atomic uint64_t idem__ctr;

typedef struct idem__hist {
    idem__ctr bucket[IDEM_METRICS_BUCKETS + 1];  /* not cumulative; the
                                                  * last is +Inf */
    idem__ctr sum_ns;
} idem__hist;

typedef struct idem__metrics {
    idem__ctr claims[5];
    idem__ctr completions, fail_perm, fail_retry, takeovers, lost;
    idem__ctr errors[IDEM_METRICS_CODES];
    idem__hist sync, claim_batch, handler;
    _Atomic int64_t live_keys, store_bytes, segments;
    idem__ctr expired;
    idem__ctr messages[IDEM_MR_COUNT];
} idem__metrics;

/* c += n, by the handle's one writer. */
static inline void idem__ctr_add(idem__ctr *c, uint64_t n)
{
    atomic_store_explicit(
        c, atomic_load_explicit(c, memory_order_relaxed) + n,
        memory_order_relaxed);
}

static inline void idem__gauge_set(_Atomic int64_t *g, int64_t v)
{
    atomic_store_explicit(g, v, memory_order_relaxed);
}

/* Unknown gauges (-1) until a backend says. */
void idem__metrics_reset(idem__metrics *m);

/* One observation of ns nanoseconds. */
void idem__hist_observe(idem__hist *h, uint64_t ns);

/* A call's or a key's error, counted by code (ELOST also as lost);
 * IDEM_OK and codes out of range count nothing. Returns rc. */
int idem__metrics_error(idem__metrics *m, int rc);

/* The outcomes of a claim batch: each key's kind, or its error. */
void idem__metrics_claims(idem__metrics *m, const idem_outcome *outs,
                          size_t n);

/* Committed runner messages, by result. */
void idem__metrics_messages(idem__metrics *m, const idem_msg *msgs,
                            size_t n);

#endif
