/* log.c - appending, committing, reading and dropping segments.
 *
 * Why a log: idempotency records are written once or twice, read rarely,
 * and die together after a retention window. Appending them in time order
 * makes a write a memcpy and a commit one sequential write plus one
 * fdatasync, and makes expiry of a whole time bucket one unlink.
 *
 * Reads go through mmap: a replay is a pointer dereference into the page
 * cache, not a system call. The active segment is mapped beyond its end
 * (allowed; we never touch pages past what was written) and remapped only
 * when it outgrows the mapping. */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include "record.h"

/* Write out the buffer once it holds this much, commit or not, so that a
 * huge batch does not hold its whole size in RAM twice. */
#define IDEM__FLUSH_BYTES (4u << 20)

static const unsigned char idem__seg_magic[8] = "IDEMLOG";

void idem__seg_name(char *buf, size_t n, uint32_t id)
{
    snprintf(buf, n, "seg-%08u.log", id);
}

void idem__seg_header(unsigned char *dst, uint32_t id, int64_t created)
{
    uint32_t version = IDEM__SEG_VERSION;
    memcpy(dst, idem__seg_magic, 8);
    memcpy(dst + 8, &version, 4);
    memcpy(dst + 12, &id, 4);
    memcpy(dst + 16, &created, 8);
    uint64_t check = XXH3_64bits(dst, 24);
    memcpy(dst + 24, &check, 8);
}

int idem__seg_header_ok(const unsigned char *p, size_t avail, uint32_t id,
                        int64_t *created)
{
    uint32_t version, got;
    uint64_t check;
    if (avail < IDEM__SEG_HDR || memcmp(p, idem__seg_magic, 8) != 0)
        return IDEM_ECORRUPT;
    memcpy(&check, p + 24, 8);
    if (check != XXH3_64bits(p, 24))
        return IDEM_ECORRUPT;
    memcpy(&version, p + 8, 4);
    memcpy(&got, p + 12, 4);
    memcpy(created, p + 16, 8);
    if (version < 1 || version > IDEM__SEG_VERSION)
        return IDEM_EVERSION;
    return got == id ? 0 : IDEM_ECORRUPT;
}

int idem__seg_keeps_tail(const unsigned char *p, size_t avail)
{
    uint32_t version = 0;
    if (avail >= IDEM__SEG_HDR)
        memcpy(&version, p + 8, 4);
    return version >= 2;
}

int idem__log_ioerr(idem__log *lg, const char *op, uint32_t seg, int err)
{
    char name[32];
    idem__seg_name(name, sizeof name, seg);
    int code = err == ENOSPC || err == EDQUOT ? IDEM_ENOSPC : IDEM_EIO;
    return idem__fail(lg->s, code, "%s/%s: %s: %s", lg->dir ? lg->dir : "",
                      name, op, strerror(err));
}

idem__seg *idem__log_seg(idem__log *lg, uint32_t id)
{
    if (!lg->nsegs || id < lg->segs[0].id ||
        id - lg->segs[0].id >= lg->nsegs)
        return NULL;
    return &lg->segs[id - lg->segs[0].id];
}

static idem__seg *idem__active(idem__log *lg)
{
    return &lg->segs[lg->nsegs - 1];
}

int idem__log_map(idem__log *lg, idem__seg *g, size_t need)
{
    if (lg->memory || need <= g->maplen)
        return 0;
    /* The window covers the whole file, whatever need asks for: a
     * segment can pass segment_bytes by a group's worth of frames (a
     * value up to 64 MiB), and a sealed segment's fd is closed once it is
     * mapped (a cold one's at open, after only its header was asked for),
     * so a later read past a smaller window would map from fd -1. */
    size_t len = (size_t)lg->segment_bytes + (1u << 20);
    while (len < need || len < g->size)
        len *= 2;
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, g->fd, 0);
    if (p == MAP_FAILED)
        return errno == ENOMEM ? IDEM_ENOMEM
                               : idem__log_ioerr(lg, "mmap", g->id, errno);
    if (need <= IDEM__SEG_HDR)
        /* A cold segment: open reads its header by itself, not the
         * window around it (up to the whole segment, with a large
         * read-ahead); idem__log_map_read() ends that. */
        madvise(p, len, MADV_RANDOM);
#ifdef MADV_POPULATE_READ
    else
        /* Fill the page tables for what exists in one call rather than
         * one fault per page on first read (recovery reads all of it).
         * A hint: older kernels refuse it, harmlessly. */
        madvise(p, need, MADV_POPULATE_READ);
#endif
    if (g->base)
        munmap(g->base, g->maplen);
    g->base = p;
    g->maplen = len;
    return 0;
}

void idem__log_map_read(idem__seg *g)
{
    if (g->base && g->fd >= 0)
        madvise(g->base, g->maplen, MADV_NORMAL);
}

int idem__log_at(idem__log *lg, uint32_t seg, uint32_t off,
                 const unsigned char **p, size_t *avail)
{
    idem__seg *g = idem__log_seg(lg, seg);
    if (!g)
        return IDEM_ENOTFOUND;
    if (g == idem__active(lg) && off >= g->size) {
        size_t at = (size_t)(off - g->size);
        if (at >= lg->wbuf.len)
            return IDEM_ECORRUPT;
        *avail = lg->wbuf.len - at;
        *p = lg->wbuf.data + at;
        return 0;
    }
    if (off >= g->size)
        return IDEM_ECORRUPT;
    int rc = idem__log_map(lg, g, (size_t)g->size);
    if (rc)
        return rc;
    *avail = (size_t)(g->size - off);
    *p = g->base + off;
    return 0;
}

static void *idem__syncer(void *arg)
{
    idem__log *lg = arg;
    lg->sync_err = fdatasync(lg->sync_fd) != 0 ? errno : 0;
    return NULL;
}

int idem__log_sync_wait(idem__log *lg)
{
    if (!lg->syncing)
        return 0;
    pthread_join(lg->syncer, NULL);
    lg->syncing = 0;
    if (lg->sync_err) {
        lg->broken = idem__log_ioerr(lg, "fdatasync", lg->sync_seg,
                                     lg->sync_err);
        return lg->broken;
    }
    idem__seg *g = idem__log_seg(lg, lg->sync_seg);
    if (g)
        g->committed = lg->sync_end;
    return 0;
}

/* Hand the fdatasync of the group just written to g to a thread. 0, or
 * -1 when no thread could be had. */
static int idem__sync_start(idem__log *lg, const idem__seg *g)
{
    lg->sync_fd = g->fd;
    lg->sync_seg = g->id;
    lg->sync_end = g->size;
    lg->sync_err = 0;
    if (idem__thread_start(&lg->syncer, idem__syncer, lg) != 0)
        return -1;
    lg->syncing = 1;
    return 0;
}

/* Move the buffer into the active segment: write(2) for files, memcpy for
 * memory. On a write error the log is broken (see log.h). A group whose
 * fdatasync runs is waited for first: a write must never land beside a
 * group not known durable. */
static int idem__flush(idem__log *lg)
{
    int rc = lg->memory ? 0 : idem__log_sync_wait(lg);
    if (rc)
        return rc;
    idem__seg *g = idem__active(lg);
    const unsigned char *p = lg->wbuf.data;
    size_t n = lg->wbuf.len;
    if (lg->memory) {
        if (g->size + n > g->maplen) {
            size_t cap = g->maplen ? g->maplen : 4096;
            while (cap < g->size + n)
                cap *= 2;
            unsigned char *b = realloc(g->base, cap);
            if (!b)
                return idem__fail(lg->s, IDEM_ENOMEM, "out of memory");
            g->base = b;
            g->maplen = cap;
        }
        if (n)
            memcpy(g->base + g->size, p, n);
        g->size += n;
        lg->wbuf.len = 0;
        return 0;
    }
    while (n) {
        ssize_t w = write(g->fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int err = w < 0 ? errno : ENOSPC;
            lg->broken = idem__log_ioerr(lg, "write", g->id, err);
            /* Keep the invariant: what was written is counted in size,
             * the rest stays in the buffer, so reads still find every
             * frame. (Cutting the file back to the last commit would
             * leave frames of earlier flushes of this group nowhere.)
             * Recovery cuts the uncommitted tail. */
            memmove(lg->wbuf.data, p, n);
            lg->wbuf.len = n;
            return lg->broken;
        }
        p += w;
        n -= (size_t)w;
        g->size += (uint64_t)w;
    }
    lg->wbuf.len = 0;
    return 0;
}

/* A segment of an older header version (a store an older idem wrote)
 * takes no frame of this version: a build that reads only the older
 * frames would refuse the frame as of a newer format all the same, but
 * its repair would drop it as damage. A new segment's header makes both
 * its open and its repair refuse it. */
static int idem__old_header(const idem__seg *g)
{
    uint32_t version = IDEM__SEG_VERSION;
    if (g->base && g->maplen >= IDEM__SEG_HDR)
        memcpy(&version, g->base + 8, 4);
    return version < IDEM__SEG_VERSION;
}

static int idem__must_rotate(idem__log *lg, int64_t now)
{
    idem__seg *g = idem__active(lg);
    return idem__old_header(g) ||
           g->size + lg->wbuf.len >= lg->segment_bytes ||
           now - g->created >= lg->segment_span_ms;
}

int idem__log_append(idem__log *lg, int64_t now, size_t n,
                     unsigned char **dst, uint32_t *seg, uint32_t *off)
{
    if (lg->readonly)
        return idem__fail(lg->s, IDEM_EINVAL,
                          "the store was opened read-only");
    if (lg->broken)
        return idem__fail(lg->s, lg->broken,
                          "an earlier write failed; reopen the store");
    int rc = 0;
    if (!lg->in_group && idem__must_rotate(lg, now))
        rc = idem__log_new_segment(lg, now);
    if (!rc && lg->wbuf.len >= IDEM__FLUSH_BYTES)
        rc = idem__flush(lg);
    if (!rc && idem__buf_reserve(&lg->wbuf, n))
        rc = idem__fail(lg->s, IDEM_ENOMEM, "out of memory");
    if (rc)
        return rc;
    idem__seg *g = idem__active(lg);
    uint64_t at = g->size + lg->wbuf.len;
    if (at + n > UINT32_MAX)
        return idem__fail(lg->s, IDEM_EINVAL, "segment would pass 4 GiB");
    *dst = lg->wbuf.data + lg->wbuf.len;
    *seg = g->id;
    *off = (uint32_t)at;
    lg->wbuf.len += n;
    lg->in_group = 1;
    return 0;
}

/* Record in PATH/TAIL that segments first..last exist and that bytes
 * [0, end) of last are durable. Memory stores have no files. */
static int idem__write_tail(idem__log *lg, uint32_t first, uint32_t last,
                            uint64_t end)
{
    idem__tail t = {.first = first, .last = last, .end = end};
    return lg->memory ? 0
                      : idem__dir_tail_write(lg->s, lg->dirfd, lg->dir, &t);
}

/* A commit; `start`: its fdatasync on a thread (idem__log_commit_start). */
static int idem__commit(idem__log *lg, int start)
{
    if (lg->broken)
        return idem__fail(lg->s, lg->broken,
                          "an earlier write failed; reopen the store");
    if (!lg->in_group)
        return 0;
    /* The group began where the last commit ended; saying so lets
     * recovery tell damage inside this group from damage before it. A
     * commit still syncing ends first (idem__flush would wait for it
     * too, but after this frame named where it began). */
    int rc0 = lg->memory ? 0 : idem__log_sync_wait(lg);
    if (rc0)
        return rc0;
    idem__rec none = {.created = (int64_t)idem__active(lg)->committed};
    idem__fplan fp;
    size_t n = idem__frame_plan(&fp, IDEM__R_COMMIT, &none, NULL, 0, NULL, 0);
    if (idem__buf_reserve(&lg->wbuf, n))
        return idem__fail(lg->s, IDEM_ENOMEM, "out of memory");
    idem__frame_write(lg->wbuf.data + lg->wbuf.len, &fp);
    lg->wbuf.len += n;
    int rc = idem__flush(lg);
    if (rc) {
        /* memory (ENOMEM): nothing moved, take the commit frame back and
         * let a later commit try again; files: the log is broken. */
        if (lg->memory)
            lg->wbuf.len -= n;
        return rc;
    }
    idem__seg *g = idem__active(lg);
    if (!lg->memory && start && idem__sync_start(lg, g) == 0) {
        lg->in_group = 0;
        return 0;
    }
    if (!lg->memory && fdatasync(g->fd) != 0) {
        lg->broken = idem__log_ioerr(lg, "fdatasync", g->id, errno);
        return lg->broken;
    }
    g->committed = g->size;
    lg->in_group = 0;
    return 0;
}

int idem__log_commit(idem__log *lg)
{
    return idem__commit(lg, 0);
}

int idem__log_commit_start(idem__log *lg)
{
    return idem__commit(lg, 1);
}

int idem__log_seal(idem__log *lg)
{
    int rc = idem__log_sync_wait(lg);
    rc = rc ? rc : idem__log_commit(lg);
    if (rc || lg->readonly)
        return rc;
    idem__seg *g = idem__active(lg);
    return idem__write_tail(lg, lg->segs[0].id, g->id, g->committed);
}

static int idem__grow_segs(idem__log *lg)
{
    idem__seg *p = idem__grow(lg->segs, lg->nsegs, &lg->capsegs, sizeof *p,
                              8);
    if (!p)
        return idem__fail(lg->s, IDEM_ENOMEM, "out of memory");
    lg->segs = p;
    return 0;
}

/* Create the file for segment id with its header, durably. */
static int idem__create_file(idem__log *lg, uint32_t id, int64_t now,
                             int *fdp)
{
    char name[32];
    unsigned char hdr[IDEM__SEG_HDR];
    idem__seg_name(name, sizeof name, id);
    idem__seg_header(hdr, id, now);
    int fd = idem__dir_create(lg->dirfd, name, O_RDWR | O_TRUNC);
    if (fd < 0)
        return idem__log_ioerr(lg, "create", id, errno);
    ssize_t w = write(fd, hdr, sizeof hdr);
    if (w != (ssize_t)sizeof hdr || fdatasync(fd) != 0 || fsync(lg->dirfd)) {
        /* A short write is a full disk; a failed sync sets errno. */
        int err = w >= 0 && w < (ssize_t)sizeof hdr ? ENOSPC : errno;
        int rc = idem__log_ioerr(lg, "create", id, err);
        close(fd);
        unlinkat(lg->dirfd, name, 0);
        return rc;
    }
    *fdp = fd;
    return 0;
}

int idem__log_new_segment(idem__log *lg, int64_t now)
{
    int rc = idem__log_sync_wait(lg);  /* the old one ends durable */
    rc = rc ? rc : idem__grow_segs(lg);
    if (rc)
        return rc;
    uint32_t id = lg->nsegs ? idem__active(lg)->id + 1 : 1;
    idem__seg g = {.id = id, .fd = -1, .created = now,
                   .size = IDEM__SEG_HDR, .committed = IDEM__SEG_HDR};
    if (lg->memory) {
        g.base = malloc(IDEM__SEG_HDR);
        if (!g.base)
            return idem__fail(lg->s, IDEM_ENOMEM, "out of memory");
        g.maplen = IDEM__SEG_HDR;
        idem__seg_header(g.base, id, now);
    } else if ((rc = idem__create_file(lg, id, now, &g.fd)) ||
               (rc = idem__write_tail(lg, lg->nsegs ? lg->segs[0].id : id,
                                      id, IDEM__SEG_HDR))) {
        /* Without the tail naming it, the new file is no segment yet. */
        if (g.fd >= 0) {
            char name[32];
            idem__seg_name(name, sizeof name, id);
            close(g.fd);
            unlinkat(lg->dirfd, name, 0);
        }
        return rc;
    }
    if (lg->nsegs) {  /* the old active segment is sealed: keep its map */
        idem__seg *old = idem__active(lg);
        if (old->fd >= 0 && idem__log_map(lg, old, (size_t)old->size) == 0) {
            close(old->fd);
            old->fd = -1;
        }
    }
    lg->segs[lg->nsegs++] = g;
    return 0;
}

static void idem__seg_release(idem__log *lg, idem__seg *g)
{
    if (lg->memory)
        free(g->base);
    else if (g->base)
        munmap(g->base, g->maplen);
    if (g->fd >= 0)
        close(g->fd);
    if (g->cold) {
        idem__cold_free(g->cold);
        free(g->cold);
    }
    g->base = NULL;
    g->fd = -1;
    g->cold = NULL;
}

int idem__log_drop_oldest(idem__log *lg)
{
    int rc0 = idem__log_sync_wait(lg);  /* the tail names what is durable */
    if (rc0 || lg->nsegs < 2)
        return rc0;
    idem__seg *g = &lg->segs[0];
    /* A job of g would write an index beside a file that is gone; a
     * job building partitions of the filter in front may read g's
     * index, which goes with it. */
    if (lg->job.running && lg->job.sg.id == g->id)
        idem__coldjob_cancel(&lg->job, &lg->cf.due);
    if (lg->job.nbuilds)
        idem__coldjob_wait(&lg->job);
    /* The tail stops naming it first: a crash before the unlink leaves a
     * file older than the tail's first, which open deletes. */
    int rc = idem__write_tail(lg, lg->segs[1].id, idem__active(lg)->id,
                              idem__active(lg)->committed);
    if (rc)
        return rc;
    if (!lg->memory) {
        char name[32], kix[32];
        idem__seg_name(name, sizeof name, g->id);
        idem__kix_name(kix, sizeof kix, g->id);
        if ((unlinkat(lg->dirfd, kix, 0) != 0 && errno != ENOENT) ||
            unlinkat(lg->dirfd, name, 0) != 0 || fsync(lg->dirfd) != 0)
            return idem__log_ioerr(lg, "unlink", g->id, errno);
    }
    if (g->cold)
        idem__cfilter_gone(&lg->cf, g->cold, g->id);
    idem__cgroup_gone(lg, g->id);
    lg->ncold -= g->cold != NULL;
    idem__seg_release(lg, g);
    memmove(lg->segs, lg->segs + 1, (lg->nsegs - 1) * sizeof *lg->segs);
    lg->nsegs--;
    return 0;
}

void idem__log_forget(idem__log *lg)
{
    idem__coldjob_cancel(&lg->job, NULL);
    for (size_t i = 0; i < lg->nsegs; i++)
        idem__seg_release(lg, &lg->segs[i]);
    idem__cgroup_free(lg->cg);
    lg->nsegs = 0;
    lg->ncold = 0;
}

void idem__log_close(idem__log *lg)
{
    idem__log_forget(lg);
    free(lg->segs);
    idem__cfilter_free(&lg->cf);
    idem__buf_free(&lg->wbuf);
    if (lg->dirfd >= 0)
        close(lg->dirfd);
    free(lg->dir);
    lg->segs = NULL;
    lg->nsegs = lg->capsegs = 0;
    lg->dirfd = -1;
    lg->dir = NULL;
}
