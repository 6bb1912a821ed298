/* coldjob.h - a sealed segment's key index, built on a thread of its own.
 *
 * When the RAM index passes its budget, the oldest hot segment's keys
 * leave RAM for a key index beside it (cold.h). Building that index
 * (walk the segment's frames, hash each key, sort, fill the filter) and
 * writing it durably cost the writer's thread a quarter of what a claim
 * costs in a store past its budget. None of it needs the writer: the
 * segment is sealed, so its bytes never change, and the index is built
 * from them and the store's secret alone. A job does it on the other
 * core while claims go on; the writer takes the result between groups,
 * where keys have always left RAM (idem__evict in engine.c).
 *
 * Until then the segment's keys stay in RAM, which is always correct:
 * the budget is passed for as long as the job runs, by what arrives
 * meanwhile. A writer that would still be over budget once the job is
 * done waits for it, so the overshoot stays about a segment's keys at most.
 *
 * Invariants:
 *  - at most one job runs in a log, and it is of segs[ncold], the oldest
 *    hot segment, sealed and mapped whole; the job also reads the key
 *    indexes of the cold segments, for the partitions of the filter in
 *    front of them it builds again (coldfilter.h). Those mappings stay
 *    while the job runs, because everything that unmaps a segment or an
 *    index (dropping a segment, closing the log) waits for the job first
 *    (idem__coldjob_wait, idem__coldjob_cancel);
 *  - the job touches nothing but its own fields and the files it
 *    writes, PATH/seg-N.kix and its temporary: no store, no log, no
 *    error detail; the writer words its failure;
 *  - an index written by a job whose result was never taken (the store
 *    closed, the process died) is sound: the next open finds a key index
 *    beside a sealed segment and loads it, as it would after a crash
 *    between writing an index and dropping the keys from RAM. */
#ifndef IDEM_COLDJOB_H
#define IDEM_COLDJOB_H

#include <pthread.h>
#include <stdatomic.h>

#include "cold.h"
#include "coldfilter.h"

typedef struct idem__coldjob {
    int running;              /* started, not yet joined */
    int threaded;             /* on a thread (else it ran in start) */
    pthread_t thread;
    atomic_int finished;      /* its work is done: joining won't wait */
    idem__segid sg;           /* the segment it indexes */
    const unsigned char *secret;
    int dirfd;
    int rc, werr;             /* idem__cold_produce()'s */
    idem__cold *built;        /* the index, written and on the heap */
    idem__cfbuild *builds;    /* partitions of the filter in front of */
    size_t nbuilds;           /* the cold segments, built again */
} idem__coldjob;

/* Start building and writing the key index of segment sg (sealed,
 * mapped whole at sg->base), then the n partition builds b (the job
 * owns them now), on a thread of its own. Without a thread (none could
 * be had) it is done here and now. j must not be running. Never fails:
 * failures come back from idem__coldjob_join(). */
void idem__coldjob_start(idem__coldjob *j, int dirfd, const idem__segid *sg,
                         const unsigned char *secret, idem__cfbuild *b,
                         size_t n);

/* Is the running job's work done, so that joining it will not wait? */
int idem__coldjob_finished(idem__coldjob *j);

/* Wait for the running job's thread to end, and leave its result for
 * idem__coldjob_join(): the job reads no index or segment any more. */
void idem__coldjob_wait(idem__coldjob *j);

/* Wait for the running job and take its result: *c the index (heap,
 * written; the caller owns it) and 0, or NULL and idem__cold_produce()'s
 * failure (*werr with it); *b and *n the partition builds, whatever
 * became of the index (the caller owns them). j is idle after. */
int idem__coldjob_join(idem__coldjob *j, idem__cold **c, int *werr,
                       idem__cfbuild **b, size_t *n);

/* Wait for the job if it runs, and throw its result away; the
 * partitions it was building again are marked in *due (bit j: partition
 * j) for a later job, unless due is NULL. */
void idem__coldjob_cancel(idem__coldjob *j, uint64_t *due);

/* In a fork child: the thread was the parent's and is not here to be
 * joined; forget it. What it had allocated is freed when its work was
 * done before the fork, else left (its pointers were on its stack). */
void idem__coldjob_abandon(idem__coldjob *j);

#endif
