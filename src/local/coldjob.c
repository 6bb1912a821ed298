/* coldjob.c - a sealed segment's key index, built on a thread of its own.
 *
 * See coldjob.h for why and for the invariants. A thread per job, not a
 * pool: a job indexes a whole segment (a million keys at the default
 * size), so starting a thread costs a ten-thousandth of it, and a
 * thread that lives only while it works leaves nothing to stop at close
 * or to mishandle in a fork child. */
#include "coldjob.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

static void idem__coldjob_work(idem__coldjob *j)
{
    j->werr = 0;
    j->built = calloc(1, sizeof *j->built);
    j->rc = !j->built ? IDEM_ENOMEM
                      : idem__cold_produce(j->dirfd, &j->sg, j->secret, 1,
                                           j->built, &j->werr);
    if (j->rc) {
        free(j->built);
        j->built = NULL;
    }
    for (size_t i = 0; i < j->nbuilds; i++)
        idem__cfbuild_run(&j->builds[i]);
    /* Release: a writer that sees finished sees the result with it. */
    atomic_store_explicit(&j->finished, 1, memory_order_release);
}

static void *idem__coldjob_run(void *arg)
{
    idem__coldjob_work(arg);
    return NULL;
}

void idem__coldjob_start(idem__coldjob *j, int dirfd, const idem__segid *sg,
                         const unsigned char *secret, idem__cfbuild *b,
                         size_t n)
{
    j->sg = *sg;
    j->builds = b;
    j->nbuilds = n;
    j->secret = secret;
    j->dirfd = dirfd;
    atomic_store_explicit(&j->finished, 0, memory_order_relaxed);
    j->running = 1;
    j->threaded = idem__thread_start(&j->thread, idem__coldjob_run, j) == 0;
    if (!j->threaded)
        idem__coldjob_work(j);
}

int idem__coldjob_finished(idem__coldjob *j)
{
    return atomic_load_explicit(&j->finished, memory_order_acquire);
}

void idem__coldjob_wait(idem__coldjob *j)
{
    if (j->threaded)
        pthread_join(j->thread, NULL);
    j->threaded = 0;
}

int idem__coldjob_join(idem__coldjob *j, idem__cold **c, int *werr,
                       idem__cfbuild **b, size_t *n)
{
    idem__coldjob_wait(j);
    j->running = 0;
    *c = j->built;
    *werr = j->werr;
    *b = j->builds;
    *n = j->nbuilds;
    j->built = NULL;
    j->builds = NULL;
    j->nbuilds = 0;
    return j->rc;
}

/* Free what a job that is over had made. */
static void idem__coldjob_free(idem__cold *c, idem__cfbuild *b, size_t n)
{
    if (c)
        idem__cold_free(c);
    free(c);
    idem__cfbuild_free(b, n);
}

void idem__coldjob_cancel(idem__coldjob *j, uint64_t *due)
{
    if (!j->running)
        return;
    idem__cold *c;
    idem__cfbuild *b;
    size_t n;
    int werr;
    (void)idem__coldjob_join(j, &c, &werr, &b, &n);
    for (size_t i = 0; due && i < n; i++)
        *due |= 1ull << b[i].part;
    idem__coldjob_free(c, b, n);
}

void idem__coldjob_abandon(idem__coldjob *j)
{
    if (j->running && idem__coldjob_finished(j))
        idem__coldjob_free(j->built, j->builds, j->nbuilds);
    memset(j, 0, sizeof *j);
}
