/* metricsrv.h - GET /metrics for the long-running commands. */
#ifndef IDEM_METRICSRV_H
#define IDEM_METRICSRV_H

#include "cli.h"

typedef struct metrics_srv metrics_srv;

/* Listen on addr ("HOST:PORT", "[V6]:PORT") and serve GET /metrics from
 * a thread of its own. Binds before it returns, so a busy port or a bad
 * address is said at once ("idem CMD: --metrics-listen ADDR: ..."): then
 * NULL and *status 2 (bad usage: nothing was done). uri is the store,
 * whose Redis servers the endpoint asks for INFO when scraped. */
metrics_srv *msrv_start(const char *cmd, const char *addr, const char *uri,
                        int *status);

/* From now on the figures of s (NULL: none), labelled job. s must stay
 * open until msrv_attach(m, NULL, ...) or msrv_stop(); taking and
 * dropping it waits at most for one scrape's copy of the counters. */
void msrv_attach(metrics_srv *m, idem_store *s, const char *job);

/* What the runner's loop knows and the store does not: the source's lag
 * (-1 unknown; lock-free), and after a commit the messages it counted
 * failed and, among them, set aside as dead letters (one pair, so that
 * a scrape never sees a dead letter as failed first). m may be NULL. */
void msrv_note_lag(metrics_srv *m, long long lag);
void msrv_note_failures(metrics_srv *m, uint64_t failed, uint64_t dead);

/* Stop serving and free m (NULL: nothing). */
void msrv_stop(metrics_srv *m);

/* The Prometheus text of m for store uri, labelled job (NULL: none),
 * into out (reset first). 0, or -1 when out of memory. */
int msrv_render(const idem_metrics *m, const char *job, const char *uri,
                cli_buf *out);

#endif
