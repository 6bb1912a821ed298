/* log_check.c - the log's invariants (log.h), checked from outside.
 *
 * For tests and debugging only: no path of the library calls it, since it
 * reads the last frame of every segment, stats the files and reads
 * PATH/TAIL. The model test runs it after every step, so that an
 * operation that breaks an invariant is caught at the step that broke it,
 * not many steps later when a reopen trips over what it left.
 *
 * What it checks, in log.h's order:
 *  - segment ids run without gaps, and a segment's bytes are where log.h
 *    says: [0, size) in the file (or heap buffer), nothing committed
 *    beyond what was appended, an empty append buffer outside a group;
 *  - every segment but the active one ends with a COMMIT frame or is
 *    empty;
 *  - PATH/TAIL names only segments that exist and, in its last segment,
 *    only committed bytes.
 * A broken log (a failed write) is past promising anything about its
 * buffers and TAIL, so only the first two are checked there. */
#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>

#include "log.h"
#include "record.h"

static int idem__bad(char *why, size_t n, const char *fmt, ...)
    IDEM__PRINTF(3, 4);

static int idem__bad(char *why, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, n, fmt, ap);
    va_end(ap);
    return IDEM_ECORRUPT;
}

/* Does segment g end with a COMMIT frame? Every version's size counts: a
 * store written before version 3 frames ends its old segments with an
 * 80- or 72-byte COMMIT. */
static int idem__ends_with_commit(idem__log *lg, const idem__seg *g)
{
    const size_t *sizes = idem__commit_sizes;
    for (size_t i = 0; sizes[i]; i++) {
        const unsigned char *p;
        size_t avail;
        idem__frame f;
        if (g->size >= IDEM__SEG_HDR + sizes[i] &&
            !idem__log_at(lg, g->id, (uint32_t)(g->size - sizes[i]), &p,
                          &avail) &&
            !idem__frame_decode(p, avail, &f, 1) &&
            f.type == IDEM__R_COMMIT && f.len == sizes[i])
            return 1;
    }
    return 0;
}

/* Are bytes [0, g->size) of a segment where they should be? */
static int idem__seg_bytes(const idem__log *lg, const idem__seg *g,
                           char *why, size_t n)
{
    struct stat st;
    if (lg->memory && g->maplen < g->size)
        return idem__bad(why, n, "segment %u: %zu bytes held, size %llu",
                         (unsigned)g->id, g->maplen,
                         (unsigned long long)g->size);
    if (!lg->memory && g->fd >= 0 &&
        (fstat(g->fd, &st) || (uint64_t)st.st_size < g->size))
        return idem__bad(why, n, "segment %u: file shorter than size %llu",
                         (unsigned)g->id, (unsigned long long)g->size);
    return 0;
}

static int idem__check_segs(idem__log *lg, char *why, size_t n)
{
    if (lg->nsegs == 0)
        return idem__bad(why, n, "no active segment");
    for (size_t i = 0; i < lg->nsegs; i++) {
        const idem__seg *g = &lg->segs[i];
        int active = i + 1 == lg->nsegs;
        uint64_t appended = g->size + (active ? lg->wbuf.len : 0);
        if (g->id != lg->segs[0].id + i)
            return idem__bad(why, n, "segment %u follows %u",
                             (unsigned)g->id, (unsigned)lg->segs[0].id);
        if (g->size < IDEM__SEG_HDR || g->committed > appended)
            return idem__bad(why, n,
                             "segment %u: size %llu, committed %llu",
                             (unsigned)g->id, (unsigned long long)g->size,
                             (unsigned long long)g->committed);
        int rc = idem__seg_bytes(lg, g, why, n);
        if (rc)
            return rc;
        if (!active && g->size > IDEM__SEG_HDR &&
            !idem__ends_with_commit(lg, g))
            return idem__bad(why, n,
                             "segment %u (%llu bytes) is not the active one "
                             "but does not end with a COMMIT",
                             (unsigned)g->id, (unsigned long long)g->size);
    }
    return 0;
}

/* PATH/TAIL never names more than is durable. */
static int idem__check_tail(idem__log *lg, char *why, size_t n)
{
    idem__tail t;
    int rc = idem__dir_tail_read(lg->s, lg->dirfd, lg->dir, &t);
    if (rc == IDEM_ENOTFOUND)
        return 0;
    if (rc)
        return idem__bad(why, n, "%s: %s", IDEM__TAIL, idem_strerror(rc));
    const idem__seg *oldest = &lg->segs[0];
    const idem__seg *last = idem__log_seg(lg, t.last);
    if (t.first > t.last || t.first < oldest->id || !last)
        return idem__bad(why, n, "%s names segments %u..%u; %u..%u exist",
                         IDEM__TAIL, (unsigned)t.first, (unsigned)t.last,
                         (unsigned)oldest->id,
                         (unsigned)lg->segs[lg->nsegs - 1].id);
    if (t.end > last->committed)
        return idem__bad(why, n,
                         "%s ends segment %u at %llu, past its commit "
                         "at %llu",
                         IDEM__TAIL, (unsigned)t.last,
                         (unsigned long long)t.end,
                         (unsigned long long)last->committed);
    return 0;
}

/* A running job indexes the oldest hot segment, sealed, as it was when
 * the job started (coldjob.h). */
static int idem__check_job(const idem__log *lg, char *why, size_t n)
{
    const idem__coldjob *j = &lg->job;
    if (!j->running)
        return 0;
    const idem__seg *g = lg->ncold + 1 < lg->nsegs ? &lg->segs[lg->ncold]
                                                   : NULL;
    if (!g || g->id != j->sg.id || g->size != j->sg.size ||
        g->base != j->sg.base)
        return idem__bad(why, n, "a key index job runs for segment %u, "
                                 "not the oldest hot sealed one",
                         (unsigned)j->sg.id);
    return 0;
}

int idem__log_check(idem__log *lg, char *why, size_t n)
{
    int rc = idem__check_segs(lg, why, n);
    rc = rc ? rc : idem__check_job(lg, why, n);
    if (rc || lg->broken)
        return rc;
    if (!lg->in_group && lg->wbuf.len)
        return idem__bad(why, n, "%zu bytes buffered outside a group",
                         lg->wbuf.len);
    return lg->memory ? 0 : idem__check_tail(lg, why, n);
}
